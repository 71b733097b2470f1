"""The `shardsmith` command and `inspect`."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest
from helpers import convert, encode, make_class_tree, pixels, write

import schemas
from beam_jobs import _runner
from shardsmith import cli, inspection as inspect_dataset


def test_console_script_is_installed_and_lists_commands():
    exe = pathlib.Path(sys.executable).parent / "shardsmith"
    assert exe.exists(), "setup.py's console script is not installed"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("convert", "verify", "inspect", "preview"):
        assert command in out


@pytest.mark.parametrize("command, example", [
    ("convert", "shardsmith convert --input_dir"),
    ("verify", "shardsmith verify ./dataset"),
    ("inspect", "shardsmith inspect ./dataset"),
    ("preview", "shardsmith preview ./dataset"),
])
def test_every_command_has_help_with_an_example(capsys, command, example):
    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: shardsmith {command}") and example in out


def test_unknown_command_is_an_error(capsys):
    assert cli.main(["convrt"]) == 2
    assert "unknown command 'convrt'" in capsys.readouterr().err


def test_default_runner_never_tries_prism():
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    for argv in ([], ["--runner", "DirectRunner"]):
        options = PipelineOptions(argv)
        assert isinstance(_runner.make_runner(options), FnApiRunner)
        assert options.view_as(DirectOptions).direct_running_mode == "multi_threading"
    options = PipelineOptions(["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"])
    _runner.make_runner(options)
    assert options.view_as(DirectOptions).direct_running_mode == "multi_processing"


@pytest.fixture(scope="module")
def unbalanced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inspect")
    root = tmp / "images"
    make_class_tree(root / "train", classes=("big",), per_class=25)
    write(root / "train" / "tiny" / "only.jpg", encode(pixels(5), "JPEG"))
    make_class_tree(root / "val", classes=("big",), per_class=3)
    out = tmp / "out"
    convert(root, out)
    return out


def test_inspect_prints_tables_and_warnings(unbalanced, capsys):
    assert cli.main(["inspect", str(unbalanced)]) == 0
    out = capsys.readouterr().out
    manifest = schemas.Manifest.from_json((unbalanced / schemas.MANIFEST_FILENAME).read_text())
    assert f"{manifest.splits['train'].num_records}" in out and "big" in out and "tiny" in out
    facts = inspect_dataset.inspect_dataset(str(unbalanced))
    warnings = " | ".join(facts["warnings"])
    assert "1 class(es) have no validation images: tiny" in warnings
    assert "heavy imbalance in train: 'big' has 25x the images of 'tiny'" in warnings
    assert "not verified yet" in warnings


def test_inspect_of_a_folder_without_manifest(tmp_path, capsys):
    assert inspect_dataset.main([str(tmp_path)]) == 2
    assert "not a finished shardsmith dataset" in capsys.readouterr().err


def test_inspect_reports_leaks_found_by_verify(unbalanced, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(unbalanced, out)
    report = {"ok": True, "problems": [], "splits": {}, "records": 0,
              "duplicates": {"groups": 2, "across_splits": 1, "list": []}}
    (out / schemas.VERIFY_REPORT_FILENAME).write_text(json.dumps(report))
    warnings = inspect_dataset.inspect_dataset(str(out))["warnings"]
    assert any("appear in more than one split" in w and "--dedup" in w for w in warnings)


@pytest.mark.parametrize("module", ["convert", "verify"])
def test_python_m_modules_show_the_same_help(capsys, module):
    import importlib

    assert importlib.import_module(f"beam_jobs.{module}").main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: shardsmith {module}") and "example:" in out


# --- Arguments: unknown ones fail, Beam's own work, one spelling in --help ---

_HELPED = ("convert", "verify", "inspect", "preview")


def _entry_points(dataset):
    """(name, call, argv prefix) for every command line that takes options."""
    from beam_jobs import convert as convert_module, verify as verify_module

    return {
        "shardsmith convert": (cli.main, ["convert", "--input_dir", str(dataset), "--output_dir"]),
        "python -m beam_jobs.convert": (convert_module.main, ["--input_dir", str(dataset), "--output_dir"]),
        "shardsmith verify": (cli.main, ["verify", str(dataset), "--report"]),
        "python -m beam_jobs.verify": (verify_module.main, [str(dataset), "--report"]),
        "shardsmith inspect": (cli.main, ["inspect", str(dataset), "--report"]),
        "shardsmith preview": (cli.main, ["preview", str(dataset), "--output"]),
    }


@pytest.mark.parametrize("entry", [
    "shardsmith convert", "python -m beam_jobs.convert", "shardsmith verify",
    "python -m beam_jobs.verify", "shardsmith inspect", "shardsmith preview",
])
def test_a_misspelled_option_exits_2_with_a_suggestion(unbalanced, tmp_path, capsys, entry):
    call, argv = _entry_points(unbalanced)[entry]
    wrong, right = {
        "convert": ("--num_shard", "--num_shards"),
        "verify": ("--fail_on_duplicate", "--fail_on_duplicates"),
        "inspect": ("--dataset_dirr", None),
        "preview": ("--per_clas", "--per_class"),
    }[entry.split()[-1].rsplit(".", 1)[-1]]
    out = tmp_path / "out"
    code = call([*argv, str(out), wrong, "2"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"unknown option {wrong}" in err
    if right:
        assert f"(did you mean {right}?)" in err
    assert not out.exists()  # Nothing was started.


def test_misspelled_flags_through_the_real_command_write_nothing(tmp_path):
    """The issue's case: --splits and --num_shard were dropped and the job ran."""
    root = tmp_path / "images"
    make_class_tree(root, classes=("a", "b"), per_class=2)
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "beam_jobs.convert", "--input_dir", str(root), "--output_dir", str(out),
         "--splits", "train=0.8,validation=0.2", "--num_shard", "2"],
        capture_output=True, text=True, cwd=pathlib.Path(__file__).parent.parent, timeout=300,
    )
    assert run.returncode == 2, run.stderr
    assert "unknown option --splits (did you mean --split?)" in run.stderr
    assert "unknown option --num_shard (did you mean --num_shards?)" in run.stderr
    assert "Discarding unparseable args" not in run.stderr
    assert not out.exists()
    exe = pathlib.Path(sys.executable).parent / "shardsmith"
    run = subprocess.run([str(exe), "verify", str(out), "--reprot", "r.json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "(did you mean --report?)" in run.stderr, run.stderr


def test_beam_pipeline_options_keep_working(tmp_path, capsys):
    from beam_jobs import convert as convert_module

    root = tmp_path / "images"
    make_class_tree(root, classes=("a", "b"), per_class=2)
    out = tmp_path / "out"
    code = convert_module.main([
        "--input_dir", str(root), "--output_dir", str(out), "--runner", "DirectRunner",
        "--direct_num_workers", "1", "--direct_running_mode", "in_memory",
        "--project", "some-project", "--temp_location", str(tmp_path / "tmp"),
        "--experiments", "a", "--experiments=b",
    ])
    assert code == 0, capsys.readouterr().err
    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    assert manifest.counts["written"] == 4


def test_runner_options_registered_on_import_are_known(tmp_path):
    """Dask's options exist once its runner module is imported: the check imports it."""
    code = (
        "import sys\n"
        "from beam_jobs import args, convert\n"
        "assert 'apache_beam.runners.dask.dask_runner' not in sys.modules\n"
        "o = args.pipeline_options(['--input_dir', 'a', '--dask_client_address', 'tcp://h:1',"
        " '--runner', 'DaskRunner'], convert.ConvertOptions)\n"
        "print(o.get_all_options()['address'])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=pathlib.Path(__file__).parent.parent, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "tcp://h:1"


def test_help_and_option_check_of_the_reading_commands_import_neither_tensorflow_nor_beam():
    """`--help` and a bad option of inspect, preview, doctor and serve-data: answered without
    importing TensorFlow, Keras or Beam (seconds of CPU), in one fresh process."""
    code = (
        "import contextlib, io, sys\n"
        "from shardsmith import cli\n"
        "for command in ('inspect', 'preview', 'doctor', 'serve-data'):\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        assert cli.main([command, '--help']) == 0\n"
        "    assert out.getvalue().startswith(f'usage: shardsmith {command} '), command\n"
        "    with contextlib.redirect_stderr(io.StringIO()) as err:\n"
        "        assert cli.main([command, 'ds', '--no_such_option']) == 2\n"
        "    assert '--no_such_option' in err.getvalue(), command\n"
        "print(sorted(m for m in ('tensorflow', 'keras', 'apache_beam') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=pathlib.Path(__file__).parent.parent, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_one_pipelines_options_are_not_anothers(capsys):
    from beam_jobs import args, convert as convert_module, verify as verify_module

    # Both option classes are registered with Beam in this process.
    with pytest.raises(args.UsageError, match="unknown option --input_dir"):
        args.pipeline_options(["--dataset_dir", "d", "--input_dir", "x"], verify_module.VerifyOptions)
    with pytest.raises(args.UsageError, match="unknown option --report"):
        args.pipeline_options(["--input_dir", "x", "--report", "r"], convert_module.ConvertOptions)
    with pytest.raises(args.UsageError, match="unexpected argument 'stray'"):
        args.pipeline_options(["--input_dir", "x", "stray"], convert_module.ConvertOptions)


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"shardsmith {schemas.__version__}"
    exe = pathlib.Path(sys.executable).parent / "shardsmith"
    run = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == f"shardsmith {schemas.__version__}"


@pytest.mark.parametrize("command", _HELPED)
def test_help_has_one_spelling_per_option(capsys, command):
    import re

    assert cli.main([command, "--help"]) == 0
    text = capsys.readouterr().out
    body = text.split("\n\n", 1)[1]  # Past the usage line.
    section = body.split("positional arguments:\n", 1)[-1].split("\n\n", 1)[0] if (
        "positional arguments:" in body) else ""
    positionals = re.findall(r"^  (\w+)\s", section, re.M)
    flags = re.findall(r"^  (--\w+)", body, re.M)
    assert flags or command == "inspect", text  # inspect takes the folder alone.
    assert len(flags) == len(set(flags)), text
    if command != "convert":
        assert positionals == ["dataset_dir"], text
    assert not {f"--{p}" for p in positionals} & set(flags), text


def test_inspect_lists_the_versions_of_a_dataset_that_grew(unbalanced, tmp_path, capsys):
    import dataclasses

    out = tmp_path / "grown"
    shutil.copytree(unbalanced, out)
    path = out / schemas.MANIFEST_FILENAME
    manifest = schemas.Manifest.from_json(path.read_text())
    assert cli.main(["inspect", str(unbalanced)]) == 0
    assert "versions:" not in capsys.readouterr().out

    def added(split):
        info = manifest.splits[split]
        return ({split: tuple(s.file for s in info.shards)}, {split: info.num_records},
                {split: info.class_counts})

    versions = tuple(
        schemas.VersionInfo(n, *added(split), len(manifest.class_names), f"2026-12-0{n}T00:00:00Z", {})
        for n, split in ((1, "train"), (2, "validation"))
    )
    path.write_text(dataclasses.replace(manifest, versions=versions).to_json())
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "versions: 2 (read one with version=N)" in text
    row2 = next(line for line in text.splitlines() if line.startswith("2 "))
    assert "2026-12-02T00:00:00Z" in row2
    assert f"{manifest.splits['validation'].num_records:,}" in row2.split()
