"""Every failure a user can cause is one or two lines on stderr naming the subcommand.

The real command in new processes on small real files; the exit statuses are those docs/
documents (2: a usage error). Most cases run as `python -m shardsmith` runs, each in a child
forked from one interpreter that imported the commands' libraries once (`_forked_commands`):
~1 s of CPU each instead of ~4 s for a fresh interpreter that imports TensorFlow and Beam (a
minute of the module's run). What only a fresh interpreter shows (its closed stdout, Ctrl-C on
its process group) runs `python -m shardsmith` itself, as do test_quiet.py's runs (nothing
logged while the libraries load).
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import convert, forked_programs, make_class_tree

_REPO = pathlib.Path(__file__).resolve().parent.parent


def _shardsmith(*args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardsmith", *args], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, cwd=_REPO, timeout=300)


# What `python -m shardsmith` imports for the commands below, once, before the forks.
_PRELUDE = """
import tensorflow, apache_beam
import beam_jobs.convert, beam_jobs.verify
import shardsmith.cli, shardsmith.doctor, shardsmith.inspection, shardsmith.preview, shardsmith.serve_data
"""
# A child: `python -m shardsmith ARGV` (`shardsmith.__main__`), its exit status its own.
_COMMAND = """
import os, runpy, sys
sys.argv = ["shardsmith", *{argv!r}]
try:
    runpy.run_module("shardsmith", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as e:  # `console.exit_program` where a thread still runs; argparse.
    code = e.code if isinstance(e.code, int) else (e.code is not None)
sys.stdout.flush(), sys.stderr.flush()
os._exit(code)
"""


def _forked_commands(cases: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    """{name: the finished `shardsmith *argv`} of each case, each in its own forked child."""
    found = forked_programs(_PRELUDE, {name: (_COMMAND.format(argv=argv), {}) for name, argv in cases.items()},
                            cwd=_REPO, env=dict(os.environ), timeout=600)
    return {name: subprocess.CompletedProcess(["shardsmith", *cases[name]], code, out, err)
            for name, (code, out, err) in found.items()}


def _one_sentence(proc: subprocess.CompletedProcess, command: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, proc.stderr
    assert "Traceback" not in proc.stderr and "usage:" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"shardsmith {command}: "), proc.stderr
    return proc.stderr


_WRONG_TYPES = [
    ("convert", ["--input_dir", "in", "--output_dir", "out", "--seed", "x"],
     "--seed: invalid int value: 'x'"),
    ("convert", ["--input_dir", "in", "--output_dir", "out", "--max_reject_fraction", "lots"],
     "--max_reject_fraction: invalid float value: 'lots'"),
    ("convert", ["--input_dir", "in", "--output_dir", "out", "--num_shards", "zero"],
     "--num_shards: invalid int value: 'zero'"),
    ("doctor", ["ds", "--batch_size", "x"], "--batch_size: invalid int value: 'x'"),
    ("serve-data", ["--port", "x"], "--port: invalid int value: 'x'"),
    ("inspect", [], "the following arguments are required: dataset_dir"),
]
_FOLDER_COMMANDS = ("verify", "inspect", "preview")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> pathlib.Path:
    """A converted class tree (the command's output: `shardsmith convert` is this conversion)."""
    root = tmp_path_factory.mktemp("cli_errors")
    make_class_tree(root / "images", classes=("a", "b"), per_class=3)
    convert(root / "images", root / "ds")
    return root / "ds"


def _a_shard(dataset) -> pathlib.Path:
    shards = sorted(dataset.glob("train-*.tfrecord"))
    assert shards
    return shards[0]


def _files(folder: pathlib.Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def commands(dataset, tmp_path_factory) -> dict:
    """{case: the finished command} of every case below, run one after the other in forked children;
    "missing": the folder that does not exist; "before": the dataset's files before any ran."""
    missing = tmp_path_factory.mktemp("missing") / "no_such_folder"
    images = dataset.parent / "images"
    cases = {f"wrong_type_{i}": [command, *argv] for i, (command, argv, _) in enumerate(_WRONG_TYPES)}
    cases.update({f"missing_{command}": [command, str(missing)] for command in _FOLDER_COMMANDS})
    cases.update({f"shard_{command}": [command, str(_a_shard(dataset))] for command in _FOLDER_COMMANDS})
    cases["convert_help"] = ["convert", "--help"]
    # Neither writes a file of the dataset: a refusal, and a resume that has nothing to do.
    cases["full_output"] = ["convert", "--input_dir", str(images), "--output_dir", str(dataset)]
    cases["resume"] = ["convert", "--input_dir", str(images), "--output_dir", str(dataset), "--resume"]
    before = _files(dataset)
    return {**_forked_commands(cases), "missing": missing, "before": before}


@pytest.mark.parametrize(("case", "command", "said"), [
    (f"wrong_type_{i}", command, said) for i, (command, _, said) in enumerate(_WRONG_TYPES)])
def test_a_value_of_the_wrong_type_is_one_sentence_not_beams_usage(commands, case, command, said):
    proc = commands[case]
    assert proc.returncode == 2, proc.stderr
    assert said in _one_sentence(proc, command)


@pytest.mark.parametrize("command", _FOLDER_COMMANDS)
def test_a_missing_dataset_folder_is_said_not_to_exist(commands, command):
    proc = commands[f"missing_{command}"]
    assert proc.returncode == 2, proc.stderr
    text = _one_sentence(proc, command)
    assert "does not exist" in text and str(commands["missing"]) in text and "manifest" not in text


@pytest.mark.parametrize("command", _FOLDER_COMMANDS)
def test_a_shard_file_given_for_its_folder_says_so(commands, dataset, command):
    proc = commands[f"shard_{command}"]
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


def test_convert_help_marks_the_required_options_and_shows_defaults(commands):
    proc = commands["convert_help"]
    assert proc.returncode == 0, proc.stderr
    usage = proc.stdout.split("\n\n", 1)[0]
    assert "shardsmith convert --input_dir INPUT_DIR --output_dir OUTPUT_DIR" in usage
    assert "[--input_dir" not in usage and "[--output_dir" not in usage
    flat = " ".join(proc.stdout.split())
    assert "--input_dir INPUT_DIR Required." in flat
    assert "rejected. (default: 0.1; 1 with --volumes" in flat
    assert "for parallel reads. (default: 8)" in flat
    assert "(default: 0)" in flat  # --seed: a default of 0 is shown too.


def test_a_full_output_folder_is_refused_before_the_input_is_listed(commands):
    proc = commands["full_output"]
    assert proc.returncode == 2, proc.stderr
    text = _one_sentence(proc, "convert")
    assert "is not empty" in text and "--resume" in text
    assert "Found" not in text  # The listing's line: it did not run.


def test_resume_on_a_finished_dataset_has_nothing_to_do_and_writes_nothing(commands, dataset):
    proc = commands["resume"]
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" in _one_sentence(proc, "convert")
    assert _files(dataset) == commands["before"]


def test_ctrl_c_says_what_was_kept_and_how_to_go_on(tmp_path):
    import queue
    import re
    import shlex
    import signal
    import threading
    import time

    make_class_tree(tmp_path / "images", classes=("a", "b"), per_class=400)
    out = tmp_path / "out"
    argv = ["convert", "--input_dir", str(tmp_path / "images"), "--output_dir", str(out), "--num_shards", "40"]
    # Its own session: Ctrl-C reaches a terminal's whole process group, as here.
    proc = subprocess.Popen([sys.executable, "-m", "shardsmith", *argv], stderr=subprocess.PIPE,
                            text=True, cwd=_REPO, start_new_session=True)
    # Its stderr line by line as it comes (None at its end), read by a thread.
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [*map(lines.put, proc.stderr), lines.put(None)], daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        # Ctrl-C on the first shard's progress line. Its 40 shards are written within ~0.3 s of
        # the first (idle machine), so the whole group is stopped (SIGSTOP) the moment that line
        # comes, found still running, sent SIGINT and continued: the interrupt is pending before
        # any other shard can be written, however loaded the machine.
        deadline = time.monotonic() + 240
        while not seen or not re.search(r"\[\d+ of 40 shards done\]", seen[-1]):
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, "the conversion ended before a shard was written: " + "".join(seen)
            seen.append(line)
        os.killpg(proc.pid, signal.SIGSTOP)
        assert proc.poll() is None, "the conversion ended before a shard could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        os.killpg(proc.pid, signal.SIGCONT)
        proc.wait(timeout=120)
        reader.join(timeout=60)
        while (line := lines.get_nowait()) is not None:
            seen.append(line)
        stderr = "".join(seen)
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


@pytest.mark.parametrize("command", ["verify", "preview"])
def test_ctrl_c_in_a_reading_command_is_one_line_not_a_traceback(tmp_path, command):
    """Ctrl-C in `verify` or `preview` ended with Python's KeyboardInterrupt traceback."""
    import signal

    make_class_tree(tmp_path / "images", classes=("a", "b"), per_class=4)
    convert(tmp_path / "images", tmp_path / "out")
    args = [str(tmp_path / "out")] + (["--output", str(tmp_path / "p.png")] if command == "preview" else [])
    # `-X importtime` writes a line per module imported: Ctrl-C once TensorFlow is being imported,
    # which every reading command does before it reads (the interpreter's own handler is in place).
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "shardsmith", command, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=_REPO)
    try:
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if line.rstrip().endswith("| tensorflow") or "tensorflow.python" in line:
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = "".join(seen) + rest
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    # A pipeline's worker thread may still be importing TensorFlow as the command ends: its
    # `-X importtime` lines (the test's, not the command's) can follow, or cut into, the last line.
    said = re.sub(r"import time:[^\n]*\n?", "", rest)
    assert said.rstrip().endswith(f"shardsmith {command}: interrupted."), rest[-3000:]


_THREAD_FAILS_AS_A_PIPELINE_IS_TORN_DOWN = """
import os, signal, sys, threading, time
from shardsmith import cli

def main():
    # As Beam's local workers do when their runner stops on Ctrl-C: a thread whose
    # stream closes under it fails once the main thread unwinds.
    unwound = threading.Event()

    def reader():
        unwound.wait()
        raise ConnectionError("failed to connect to all addresses")

    thread = threading.Thread(target=reader, name="read_grpc_client_inputs")
    thread.start()
    try:
        if INTERRUPT:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(60)
    finally:
        unwound.set()
        thread.join()
    return 0

sys.argv = ["shardsmith", "verify"]
cli.main = main
cli.run()
"""


@pytest.mark.parametrize("interrupt", [True, False])
def test_threads_failing_after_ctrl_c_go_unsaid_and_other_failures_are_shown(interrupt):
    """Ctrl-C during `verify`'s pipeline printed a gRPC traceback per worker thread of Beam's."""
    script = f"INTERRUPT = {interrupt}\n" + _THREAD_FAILS_AS_A_PIPELINE_IS_TORN_DOWN
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=_REPO,
                          timeout=120)
    if interrupt:
        assert done.returncode == 130, done.stderr
        assert "Traceback" not in done.stderr and "ConnectionError" not in done.stderr, done.stderr
        assert done.stderr.rstrip().endswith("shardsmith verify: interrupted."), done.stderr
    else:
        # Not interrupted: a thread's failure is news, and is shown.
        assert done.returncode == 0, done.stderr
        assert "Exception in thread read_grpc_client_inputs" in done.stderr, done.stderr
        assert "ConnectionError: failed to connect to all addresses" in done.stderr, done.stderr


def _in_a_small_filesystem(script: str) -> subprocess.CompletedProcess | None:
    """Runs the shell `script` in a mount namespace of its own, where it may mount a tmpfs of a set
    size (nothing mounted outlives it); None where this system lets no process make one."""
    import shutil

    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    # As root, a mount namespace; otherwise one of a user namespace where this user is root.
    for flags in (["--mount"], ["--user", "--map-root-user", "--mount"]):
        probe = subprocess.run([unshare, *flags, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt || "
                                "mount -t tmpfs -o size=64k tmpfs \"$TMPDIR\""], capture_output=True)
        if probe.returncode == 0:
            return subprocess.run([unshare, *flags, "sh", "-c", script], capture_output=True, text=True,
                                  timeout=600)
    return None


# Photos written by the driver's threads; tiny files past the threshold by worker processes.
@pytest.mark.parametrize("per_class", [60, 600], ids=["driver", "worker_processes"])
def test_a_full_output_disk_is_one_sentence_and_resume_finishes(tmp_path, per_class):
    """A disk that fills up printed ~650 lines of Beam's tracebacks (OSError: [Errno 28]) and left
    the half-written shard files in the temporary folder, taking the space a re-run needs."""
    import re
    import shlex

    from helpers import read_records

    make_class_tree(tmp_path / "images", classes=("a", "b"), per_class=per_class)
    size_kib = max(64, sum(p.stat().st_size for p in (tmp_path / "images").rglob("*") if p.is_file()) // 2500)
    mnt, out = tmp_path / "small", tmp_path / "small" / "out"
    mnt.mkdir()
    argv = [sys.executable, "-m", "shardsmith", "convert", "--input_dir", str(tmp_path / "images"),
            "--output_dir", str(out), "--num_shards", "8"]
    q = shlex.quote
    result = _in_a_small_filesystem(f"""
        set -e
        mount -t tmpfs -o size={size_kib}k tmpfs {q(str(mnt))}
        cd {q(str(_REPO))}
        set +e
        {shlex.join(argv)} 2> {q(str(tmp_path / "first.err"))}; echo $? > {q(str(tmp_path / "first.rc"))}
        ls -A {q(str(out / "_shardsmith_tmp"))} > {q(str(tmp_path / "left.txt"))}
        mount -o remount,size=64m {q(str(mnt))}
        {shlex.join(argv)} --resume 2> {q(str(tmp_path / "second.err"))}; echo $? > {q(str(tmp_path / "second.rc"))}
        cp -r {q(str(out))} {q(str(tmp_path / "kept"))}
    """)
    if result is None:
        pytest.skip("this system lets no process mount a small filesystem (unshare)")
    assert result.returncode == 0, result.stderr
    first = (tmp_path / "first.err").read_text()
    assert (tmp_path / "first.rc").read_text().strip() == "1", first
    assert "Traceback" not in first, first
    # Whichever write meets the full disk first (a shard, its index, or a shard's receipt in the
    # run's temporary folder) is named, with its folder under the output.
    found = re.search(r"shardsmith convert: error: No space left on device while writing "
                      r"train-0000\d-of-00008\.(?:tfrecord|idx|tfrecord\.json) into (\S+): the conversion stopped "
                      r"there, and the shards finished so far are kept\. Free some space \(or give another "
                      r"--output_dir\), then run the same command with --resume to go on\.\n$", first)
    assert found and (found[1] == str(out) or found[1].startswith(str(out) + "/")), first
    # No half-written file is left to take the space: only the run's plans and receipts.
    assert set((tmp_path / "left.txt").read_text().split()) <= {"plans", "done"}
    second = (tmp_path / "second.err").read_text()
    assert (tmp_path / "second.rc").read_text().strip() == "0", second
    assert f"Converted {2 * per_class:,} images into 8 shards" in second
    assert len(read_records(tmp_path / "kept")) == 2 * per_class
