"""Every failure a user can cause is one or two lines on stderr naming the subcommand.

The real command in new processes (`python -m shardsmith ...`) on small real
files; the exit statuses are those docs/ documents (2: a usage error).
"""

import os
import pathlib
import subprocess
import sys

import pytest

from helpers import make_class_tree

_REPO = pathlib.Path(__file__).resolve().parent.parent


def _shardsmith(*args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardsmith", *args], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, cwd=_REPO, timeout=300)


def _one_sentence(proc: subprocess.CompletedProcess, command: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, proc.stderr
    assert "Traceback" not in proc.stderr and "usage:" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"shardsmith {command}: "), proc.stderr
    return proc.stderr


@pytest.mark.parametrize(("command", "argv", "said"), [
    ("convert", ["--input_dir", "in", "--output_dir", "out", "--seed", "x"],
     "--seed: invalid int value: 'x'"),
    ("convert", ["--input_dir", "in", "--output_dir", "out", "--max_reject_fraction", "lots"],
     "--max_reject_fraction: invalid float value: 'lots'"),
    ("convert", ["--input_dir", "in", "--output_dir", "out", "--num_shards", "zero"],
     "--num_shards: invalid int value: 'zero'"),
    ("doctor", ["ds", "--batch_size", "x"], "--batch_size: invalid int value: 'x'"),
    ("serve-data", ["--port", "x"], "--port: invalid int value: 'x'"),
    ("inspect", [], "the following arguments are required: dataset_dir"),
])
def test_a_value_of_the_wrong_type_is_one_sentence_not_beams_usage(command, argv, said):
    proc = _shardsmith(command, *argv)
    assert proc.returncode == 2, proc.stderr
    assert said in _one_sentence(proc, command)


@pytest.mark.parametrize("command", ["verify", "inspect", "preview"])
def test_a_missing_dataset_folder_is_said_not_to_exist(tmp_path, command):
    missing = tmp_path / "no_such_folder"
    proc = _shardsmith(command, str(missing))
    assert proc.returncode == 2, proc.stderr
    text = _one_sentence(proc, command)
    assert "does not exist" in text and str(missing) in text and "manifest" not in text


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("cli_errors")
    make_class_tree(root / "images", classes=("a", "b"), per_class=3)
    proc = _shardsmith("convert", "--input_dir", str(root / "images"), "--output_dir", str(root / "ds"))
    assert proc.returncode == 0, proc.stderr
    return root / "ds"


def _a_shard(dataset) -> pathlib.Path:
    shards = sorted(dataset.glob("train-*.tfrecord"))
    assert shards
    return shards[0]


@pytest.mark.parametrize("command", ["verify", "inspect", "preview"])
def test_a_shard_file_given_for_its_folder_says_so(dataset, command):
    shard = _a_shard(dataset)
    proc = _shardsmith(command, str(shard))
    assert proc.returncode == 2, proc.stderr
    assert f"is a file of a dataset, not its folder: give the folder, {dataset}" in _one_sentence(proc, command)


def test_the_reader_given_a_shard_file_says_so(dataset):
    import readers

    with pytest.raises(FileNotFoundError, match="is a file of a dataset, not its folder"):
        readers.image_dataset_from_tfrecords(str(_a_shard(dataset)), "train")


@pytest.mark.parametrize("argv", [["convert", "--help"], ["preview", "--help"], ["inspect", "DS"]])
def test_a_closed_pipe_is_silent(dataset, argv):
    argv = [str(dataset) if a == "DS" else a for a in argv]
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head` that already stopped reading: every write fails.
    try:
        proc = _shardsmith(*argv, stdout=write_end)
    finally:
        os.close(write_end)
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == 1


def test_convert_help_marks_the_required_options_and_shows_defaults():
    proc = _shardsmith("convert", "--help")
    assert proc.returncode == 0, proc.stderr
    usage = proc.stdout.split("\n\n", 1)[0]
    assert "shardsmith convert --input_dir INPUT_DIR --output_dir OUTPUT_DIR" in usage
    assert "[--input_dir" not in usage and "[--output_dir" not in usage
    flat = " ".join(proc.stdout.split())
    assert "--input_dir INPUT_DIR Required." in flat
    assert "rejected. (default: 0.1; 1 with --volumes" in flat
    assert "for parallel reads. (default: 8)" in flat
    assert "(default: 0)" in flat  # --seed: a default of 0 is shown too.


def test_a_full_output_folder_is_refused_before_the_input_is_listed(dataset, tmp_path):
    images = dataset.parent / "images"
    proc = _shardsmith("convert", "--input_dir", str(images), "--output_dir", str(dataset))
    assert proc.returncode == 2, proc.stderr
    text = _one_sentence(proc, "convert")
    assert "is not empty" in text and "--resume" in text
    assert "Found" not in text  # The listing's line: it did not run.


def test_resume_on_a_finished_dataset_has_nothing_to_do_and_writes_nothing(dataset):
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in dataset.iterdir() if p.is_file()}
    proc = _shardsmith("convert", "--input_dir", str(dataset.parent / "images"),
                       "--output_dir", str(dataset), "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" in _one_sentence(proc, "convert")
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in dataset.iterdir() if p.is_file()}
    assert after == before


def test_ctrl_c_says_what_was_kept_and_how_to_go_on(tmp_path):
    import re
    import shlex
    import signal
    import time

    make_class_tree(tmp_path / "images", classes=("a", "b"), per_class=400)
    out = tmp_path / "out"
    argv = ["convert", "--input_dir", str(tmp_path / "images"), "--output_dir", str(out), "--num_shards", "40"]
    # Its own session: Ctrl-C reaches a terminal's whole process group, as here.
    proc = subprocess.Popen([sys.executable, "-m", "shardsmith", *argv], stderr=subprocess.PIPE,
                            text=True, cwd=_REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("*.tfrecord")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "the conversion ended before a shard could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        stderr = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    before = [int(n) for n in re.findall(r"\[(\d+) of 40 shards done\]", stderr)]
    assert before == sorted(set(before)), stderr
    last = stderr.strip().splitlines()[-1]
    found = re.fullmatch(r"shardsmith convert: interrupted: (\d+) of 40 shards finished, kept in (.*)\. "
                         r"To go on: (shardsmith convert .* --resume)", last)
    assert found, stderr
    kept = sorted(p.name for p in out.glob("*.tfrecord"))
    assert int(found[1]) == len(kept) >= 1 and found[2] == str(out)
    again = shlex.split(found[3])
    assert again[:2] == ["shardsmith", "convert"] and again[2:-1] == argv[1:]
    finished = _shardsmith(*again[1:])
    assert finished.returncode == 0, finished.stderr
    assert len(list(out.glob("*.tfrecord"))) == 40
    # The progress counts never repeat: each shard written says one more.
    counts = [int(n) for n in re.findall(r"\[(\d+) of 40 shards done\]", finished.stderr)]
    # (A shard renamed into place just before its receipt was saved is written again.)
    assert 40 - len(kept) <= len(counts) <= 40, finished.stderr
    assert counts == sorted(set(counts)) and (not counts or counts[-1] == 40), counts
