"""A plain local conversion plans and starts its shard writers before it imports Beam.

`beam_jobs._startup.early_config` reads its flags without Beam; any other run
(Beam's options, a remote folder, --append, --resume, --dedup, a mistyped flag)
reads them with Beam as before. The run as a program is the real one: a fresh
`python -m beam_jobs.convert`, whose output must be the in-process run's, byte
for byte.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from helpers import make_class_tree

_REPO = pathlib.Path(__file__).parent.parent


def test_only_a_plain_local_conversion_reads_its_flags_without_beam(tmp_path):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a", "b"), per_class=1)
    plain = ["--input_dir", str(root), "--output_dir", str(tmp_path / "out"), "--split", "train=0.5,test=0.5"]
    cases = {
        "plain": plain,
        "verbose": [*plain, "--verbose"],
        "resume": [*plain, "--resume"],
        "append": [*plain, "--append"],
        "dedup": [*plain, "--dedup"],
        "beam option": [*plain, "--direct_num_workers", "1"],
        "runner": [*plain, "--runner", "DirectRunner"],
        "remote output": ["--input_dir", str(root), "--output_dir", "gs://bucket/out"],
        "abbreviated": ["--input_dir", str(root), "--output", str(tmp_path / "out")],
        "mistyped": [*plain, "--num_shard", "2"],
        "bad value": [*plain, "--seed", "x"],
        "help": [*plain, "--help"],
    }
    code = (
        "import json, sys\n"
        "import beam_jobs.convert, shardsmith.cli\n"
        "from beam_jobs import _startup\n"
        "before = 'apache_beam' in sys.modules\n"
        "cases = json.loads(sys.argv[1])\n"
        "print(json.dumps({'beam_on_import': before,\n"
        "                  'early': {k: _startup.early_config(v) is not None for k, v in cases.items()},\n"
        "                  'beam_after': 'apache_beam' in sys.modules}))\n"
    )
    run = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True, text=True,
                         cwd=_REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["beam_on_import"] is False and found["beam_after"] is False
    assert found["early"] == {k: k in ("plain", "verbose") for k in cases}


def test_the_program_writes_the_in_process_runs_bytes(tmp_path):
    """A fresh program (flags read without Beam, worker processes forked before its import) and `run` in a test.

    1,000 small files: worker processes by default, started as the files are listed.
    """
    from beam_jobs import convert as convert_module

    root = tmp_path / "images"
    make_class_tree(root, classes=("a", "b"), per_class=500)
    common = ["--input_dir", str(root), "--split", "train=0.75,test=0.25"]
    program = subprocess.run([sys.executable, "-m", "beam_jobs.convert", *common, "--output_dir",
                              str(tmp_path / "program")], capture_output=True, text=True, cwd=_REPO, timeout=600)
    assert program.returncode == 0, program.stderr
    convert_module.run([*common, "--output_dir", str(tmp_path / "in_process")])
    written = sorted(p.name for p in (tmp_path / "program").iterdir())
    assert written == sorted(p.name for p in (tmp_path / "in_process").iterdir())
    assert sum(name.endswith(".tfrecord") for name in written) >= 4
    for name in written:
        assert (tmp_path / "program" / name).read_bytes() == (tmp_path / "in_process" / name).read_bytes(), name
    assert "Converted 1,000 images" in program.stderr


# The code of other kinds of example and target: a plain image conversion never needs it
# (each costs CPU to import, before the supervising process forks: issue 40).
_OTHER_KINDS = ("imaging.time_series", "imaging.volumes", "imaging.scenes", "imaging.masks",
                "conversion.time_series", "conversion.volumes", "conversion.targets.coco",
                "conversion.targets.voc")


def test_a_plain_image_conversion_loads_no_other_kinds_code(tmp_path):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a", "b"), per_class=3)
    argv = ["--input_dir", str(root), "--output_dir", str(tmp_path / "out"), "--split", "train=0.5,test=0.5"]
    code = (
        "import json, sys\n"
        "import beam_jobs.convert\n"
        "on_import = sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)\n"
        "beam_jobs.convert.run(json.loads(sys.argv[1]))\n"
        "print(json.dumps({'on_import': on_import,\n"
        "                  'after_run': sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)}))\n"
    )
    run = subprocess.run([sys.executable, "-c", code, json.dumps(argv), json.dumps(_OTHER_KINDS)],
                         capture_output=True, text=True, cwd=_REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found == {"on_import": [], "after_run": []}
    assert any(p.name.endswith(".tfrecord") for p in (tmp_path / "out").iterdir())


def test_the_imaging_packages_names_load_when_asked():
    code = (
        "import json, sys\n"
        "import imaging\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('imaging.'))\n"
        "ns = {}\n"
        "exec('from imaging import *', ns)\n"
        "print(json.dumps({'loaded': loaded, 'star': sorted(k for k in ns if not k.startswith('__')),\n"
        "                  'all': sorted(imaging.__all__),\n"
        "                  'homes': {n: getattr(imaging, n).__module__ for n in imaging.__all__},\n"
        "                  'in_dir': sorted(set(imaging.__all__) - set(dir(imaging)))}))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=_REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["loaded"] == []  # Importing the package loads none of its modules.
    assert found["star"] == found["all"] and found["in_dir"] == []
    assert found["homes"]["ImageValidator"] == "imaging.validator"
    assert found["homes"]["DicomOptions"] == "imaging.dicom"
