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
    assert "rejected. (default: 0.1)" in flat
    assert "for parallel reads. (default: 8)" in flat
    assert "(default: 0)" in flat  # --seed: a default of 0 is shown too.
