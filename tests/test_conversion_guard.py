"""No single file stops a conversion: unexpected errors, crashing and hanging decoders.

The faulty decoder is a real Pillow plugin for a made-up format, registered in every process of
the conversion (the command, its forked child, its worker processes) by a `sitecustomize` module
on PYTHONPATH, as a third-party plugin would be: it raises, segfaults or loops forever depending
on the file's bytes. Everything else is the real command on Beam's local runner.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

import schemas
from beam_jobs import verify
from conversion import guard
from helpers import (add_faulty_files, add_growing_file, faulty_plugin, holding_process, make_class_tree,
                     read_records, run_without_core_dumps)

_FAULTS = {"RAISE": guard.INTERNAL_ERROR, "SEGV": guard.DECODER_CRASHED, "HANG": guard.TIMEOUT}
# Far above a small file's validation even on a loaded machine (4 s gave good files false
# timeouts at load 10, the suite niced), yet short: the hanging file waits it out twice.
_TIMEOUT = 8


def _faulty_env(tmp_path: pathlib.Path) -> dict:
    path = os.pathsep.join([str(faulty_plugin(tmp_path)), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path}


def _add_faulty_files(root: pathlib.Path, folder: str) -> dict[str, str]:
    """{relative path: expected reason} of one faulty file per fault in `root/folder`."""
    return {rel: _FAULTS[kind] for rel, kind in add_faulty_files(root, folder).items()}


def _run(args, env, cwd) -> subprocess.CompletedProcess:
    return run_without_core_dumps([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True,
                                  timeout=600)


def _check_converted(out: pathlib.Path, images: dict, faulty: dict, result) -> None:
    assert result.returncode == 3, result.stderr[-3000:]
    assert "3 files hit an error in shardsmith or a decoder" in result.stderr
    rejects = {r["path"]: r for r in map(json.loads, (out / schemas.REJECTS_FILENAME).read_text().splitlines())}
    assert {p: r["reason"] for p, r in rejects.items()} == faulty
    assert "RuntimeError: the plugin's own bug (in _open" in rejects[next(p for p in faulty if "raise" in p)]["message"]
    assert "SIGSEGV" in rejects[next(p for p in faulty if "segv" in p)]["message"]
    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    assert manifest.counts["written"] == len(images)
    assert manifest.counts["found"] == len(images) + len(faulty)
    assert manifest.rejects == {reason: 1 for reason in faulty.values()}
    # Every other file was converted, and reads back by name.
    assert sorted(r["filename"].decode() for r in read_records(out)) == sorted(images)


def test_a_photo_folder_converts_past_a_file_that_raises_one_that_crashes_and_one_that_hangs(tmp_path):
    """The runner's threads in the command's own process: its supervisor carries on without them."""
    root = tmp_path / "images"
    images = make_class_tree(root, per_class=8)
    faulty = _add_faulty_files(root, "dog")
    env = _faulty_env(tmp_path)
    out = tmp_path / "out"
    result = _run(["-m", "shardsmith", "convert", "--input_dir", str(root), "--output_dir", str(out),
                   "--file_timeout", str(_TIMEOUT), "--max_reject_fraction", "0.5"], env, tmp_path)
    _check_converted(out, images, faulty, result)
    assert "--worker_processes" not in result.stderr
    # Verified in-process: the dataset is what is checked, not the command (test_quiet runs it).
    assert verify.main([str(out)]) == 0


def test_small_jpegs_in_worker_processes_convert_past_the_same_three_files(tmp_path):
    """1,000 small JPEGs: worker processes by default; a child's death costs its culprit only."""
    root = tmp_path / "images"
    images = make_class_tree(root, classes=("a", "b"), per_class=500)
    faulty = _add_faulty_files(root, "b")
    env = _faulty_env(tmp_path)
    out = tmp_path / "out"
    result = _run(["-m", "beam_jobs.convert", "--input_dir", str(root), "--output_dir", str(out),
                   "--file_timeout", str(_TIMEOUT)], env, tmp_path)
    _check_converted(out, images, faulty, result)
    # The crash and the hang were in worker processes (the driver never restarted).
    assert result.stderr.count("Found 1,003 files") == 1, result.stderr[-3000:]
    assert verify.main([str(out)]) == 0


def test_a_file_whose_decoder_grows_past_file_memory_is_stopped_and_rejected_as_too_large(tmp_path):
    """The plugin grows ~640 MB/s towards 3 GiB: the command's watchdog stops the process at
    --file_memory (far before --file_timeout), the file is rejected as too_large, the rest converted."""
    root = tmp_path / "images"
    images = make_class_tree(root, per_class=4)
    grown = add_growing_file(root, "dog")
    out = tmp_path / "out"
    result = _run(["-m", "shardsmith", "convert", "--input_dir", str(root), "--output_dir", str(out),
                   "--file_timeout", "300", "--file_memory", "1536MiB", "--max_reject_fraction", "0.5"],
                  _faulty_env(tmp_path), tmp_path)
    # A file too large for the machine is the file's verdict, not a failure of shardsmith's: status 0.
    assert result.returncode == 0, result.stderr[-3000:]
    rejects = [json.loads(line) for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()]
    assert [(r["path"], r["reason"]) for r in rejects] == [(grown, "too_large")]
    assert "--file_memory=1.5GiB" in rejects[0]["message"], rejects[0]
    assert "past --file_memory" in result.stderr
    assert sorted(r["filename"].decode() for r in read_records(out)) == sorted(images)


def test_file_memory_is_a_size():
    from conversion.options import WritingOptions, parse_memory

    assert parse_memory("4GiB") == parse_memory("4G") == 4 << 30
    assert parse_memory("512MiB") == 512 << 20
    assert parse_memory(None) is None
    assert WritingOptions().memory_bound == guard.default_file_memory() >= 1536 << 20
    assert WritingOptions(file_memory=2 << 30).memory_bound == 2 << 30
    with pytest.raises(ValueError, match="--file_memory must be a size such as 4GiB or 512MiB. Received: '4 parsecs'"):
        parse_memory("4 parsecs")
    with pytest.raises(ValueError, match="--file_memory must be a size of at least 64MiB"):
        WritingOptions(file_memory=1000)


def test_the_files_a_killed_process_was_working_on_are_read_from_its_journal(tmp_path):
    proc = holding_process(tmp_path)
    try:
        proc.kill()
        assert proc.wait() == -signal.SIGKILL
        slots = guard.busy_slots(str(tmp_path), [proc.pid])
        assert [s.suspects for s in slots] == [(
            guard.Suspect("a/x.jpg", "/in/a/x.jpg"), guard.Suspect("b/\u00e9t\u00e9.png", "/in/b/\u00e9t\u00e9.png"),
        )]
        assert not slots[0].timed_out
        assert guard.busy_slots(str(tmp_path), [proc.pid + 1]) == []
    finally:
        proc.kill()


def test_the_file_in_work_of_a_group_is_its_slots_only_suspect_and_is_timed_from_its_own_start(tmp_path):
    import time

    journal = guard.Journal(str(tmp_path))
    files = [("a/1.png", "/in/a/1.png"), ("a/2.png", "/in/a/2.png"), ("a/3.png", "/in/a/3.png")]
    with journal.working_on(files) as now_on:
        [slot] = guard.busy_slots(str(tmp_path))
        assert (slot.current, slot.since) == (-1, slot.started)
        assert [s.rel_path for s in slot.suspects] == ["a/1.png", "a/2.png", "a/3.png"]
        time.sleep(0.01)
        now_on(1)
        [slot] = guard.busy_slots(str(tmp_path))
        assert slot.current == 1 and slot.since > slot.started
        assert slot.suspects == (guard.Suspect("a/2.png", "/in/a/2.png"),)
        now_on(-1)  # A batch of them at once: all suspects again.
        assert len(guard.busy_slots(str(tmp_path))[0].suspects) == 3
        now_on(7)  # Past the names noted: the whole group.
        assert len(guard.busy_slots(str(tmp_path))[0].suspects) == 3
    assert guard.busy_slots(str(tmp_path)) == []
    with guard.working_on(files) as now_on:  # No journal kept (no JOURNAL_ENV): a no-op.
        now_on(0)


def test_file_timeout_times_each_file_of_a_group_not_the_group(tmp_path):
    """One group of 25 files (one shard of small files): 18 images, 4 files that take 3 s each (12 s
    together, past --file_timeout=8) and one that hangs. The watchdog times each file from its own start:
    the slow files are no timeout, the hanging one is stopped at once and blamed without being tried
    again alone, and every image is written."""
    from helpers import FAULT_KINDS, add_slow_files

    assert "HANG" in FAULT_KINDS
    root = tmp_path / "images"
    images = make_class_tree(root, per_class=6)
    slow = add_slow_files(root, "dog", 4)
    hung = next(rel for rel, kind in add_faulty_files(root, "dog").items() if kind == "HANG")
    for rel in add_faulty_files(root, "dog"):
        if rel != hung:
            (root / rel).unlink()
    out = tmp_path / "out"
    result = _run(["-m", "shardsmith", "convert", "--input_dir", str(root), "--output_dir", str(out),
                   "--file_timeout", str(_TIMEOUT), "--num_shards", "1", "--max_reject_fraction", "0.5"],
                  _faulty_env(tmp_path), tmp_path)
    assert result.returncode == 3, result.stderr[-3000:]
    rejects = {r["path"]: r for r in map(json.loads, (out / schemas.REJECTS_FILENAME).read_text().splitlines())}
    assert sorted(rejects) == sorted([*slow, hung])
    assert rejects[hung]["reason"] == guard.TIMEOUT
    assert rejects[hung]["message"] == f"{hung}: not finished after --file_timeout={_TIMEOUT}s"
    assert "tried again alone" not in result.stderr
    assert {rejects[rel]["reason"] for rel in slow} & set(guard.FAILURE_REASONS) == set(), rejects
    assert sorted(r["filename"].decode() for r in read_records(out)) == sorted(images)


def test_an_internal_error_message_names_the_type_the_message_and_the_innermost_frame():
    def inner():
        raise ValueError("output array is read-only")

    try:
        inner()
    except ValueError as e:
        message = guard.internal_error_message("dem/a.tif", e)
    assert message.startswith("dem/a.tif: ValueError: output array is read-only (in inner, ")
    assert "test_conversion_guard.py:" in message


def test_the_quarantine_keeps_what_it_had(tmp_path):
    q = guard.Quarantine(str(tmp_path / "tmp" / "quarantine.jsonl"))
    assert q.load() == {}
    q.add({"b.png": (guard.TIMEOUT, "b: slow")})
    assert q.add({"a.png": (guard.DECODER_CRASHED, "a: SIGSEGV")}) == {
        "a.png": (guard.DECODER_CRASHED, "a: SIGSEGV"), "b.png": (guard.TIMEOUT, "b: slow")}
    assert guard.Quarantine(str(tmp_path / "tmp" / "quarantine.jsonl")).load() == q.load()


def test_the_failure_sentence_counts_only_failures():
    assert guard.failure_sentence({"corrupt": 4}) is None
    assert guard.failure_sentence({"corrupt": 4, "timeout": 1}) == (
        "1 file hit an error in shardsmith or a decoder (timeout 1): see rejects.jsonl, and please report them.")


@pytest.mark.parametrize("value", [0, -1, "soon", True])
def test_a_bad_file_timeout_is_one_sentence(tmp_path, value):
    from conversion.options import WritingOptions

    with pytest.raises(ValueError, match="--file_timeout must be a number of seconds above 0"):
        WritingOptions(file_timeout=value)


def test_a_dicom_header_that_raises_while_planning_rejects_that_file_only(tmp_path, monkeypatch):
    import numpy as np

    from helpers import convert, make_dicom
    from imaging import dicom

    root = tmp_path / "images"
    (root / "ct").mkdir(parents=True)
    for i in range(6):
        stored = np.arange(64, dtype=np.int16).reshape(8, 8) * (i + 1)
        (root / "ct" / f"{i}.dcm").write_bytes(make_dicom(stored, PatientID=f"P{i % 3}"))
    real = dicom.read_group_value

    def read_group_value(head, keyword):
        if b"P1" in head:
            raise KeyError("an unexpected pydicom error")
        return real(head, keyword)

    monkeypatch.setattr(dicom, "read_group_value", read_group_value)
    manifest = convert(root, tmp_path / "out", "--group_by", "dicom:PatientID", "--split", "train=0.5,validation=0.5",
                       "--max_reject_fraction", "0.5")
    rejects = [json.loads(line) for line in (tmp_path / "out" / schemas.REJECTS_FILENAME).read_text().splitlines()]
    assert sorted(r["path"] for r in rejects) == ["ct/1.dcm", "ct/4.dcm"]
    assert {r["reason"] for r in rejects} == {guard.INTERNAL_ERROR}
    assert "KeyError" in rejects[0]["message"]
    assert manifest.counts["written"] == 4


_CRASHING_PYDICOM = textwrap.dedent('''
    """pydicom as if its parser segfaulted on one file's header (shardsmith's tests)."""
    import ctypes

    import pydicom

    _read = pydicom.dcmread


    def dcmread(fp, *args, **kwargs):
        data = fp.getvalue() if hasattr(fp, "getvalue") else b""
        if b"CRASH-ME" in data:
            ctypes.string_at(0)
        return _read(fp, *args, **kwargs)


    pydicom.dcmread = dcmread
''')


def test_a_dicom_header_that_crashes_the_driver_while_planning_costs_that_file_only(tmp_path):
    """--group_by reads headers on the driver: the command's supervisor resumes without the culprit."""
    import numpy as np

    from helpers import make_dicom

    root = tmp_path / "images"
    (root / "ct").mkdir(parents=True)
    for i in range(6):
        stored = np.arange(64, dtype=np.int16).reshape(8, 8) * (i + 1)
        patient = "CRASH-ME" if i == 4 else f"P{i % 3}"
        (root / "ct" / f"{i}.dcm").write_bytes(make_dicom(stored, PatientID=patient))
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "sitecustomize.py").write_text(_CRASHING_PYDICOM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = tmp_path / "out"
    result = _run(["-m", "beam_jobs.convert", "--input_dir", str(root), "--output_dir", str(out),
                   "--group_by", "dicom:PatientID", "--split", "train=0.5,validation=0.5",
                   "--max_reject_fraction", "0.5"], env, tmp_path)
    assert result.returncode == 3, result.stderr[-3000:]
    rejects = [json.loads(line) for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()]
    assert [(r["path"], r["reason"]) for r in rejects] == [("ct/4.dcm", guard.DECODER_CRASHED)]
    assert "SIGSEGV" in rejects[0]["message"]
    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    assert manifest.counts["written"] == 5 and manifest.counts["found"] == 6
