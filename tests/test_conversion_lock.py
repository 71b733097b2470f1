"""conversion.lock: two real processes, one output folder."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from conversion.lock import LOCK_FILENAME, LockError, OutputLock, read_lock

_REPO = pathlib.Path(__file__).resolve().parents[1]

# Takes the lock on argv[1], says so by creating argv[2], then holds it until argv[3] exists.
_HOLDER = """
import os, pathlib, sys, time
from conversion.lock import LockError, OutputLock
out, ready, stop = sys.argv[1:4]
try:
    with OutputLock(out, command="holder"):
        pathlib.Path(ready).write_text("locked")
        while not os.path.exists(stop):
            time.sleep(0.02)
except LockError as e:
    pathlib.Path(ready).write_text("refused: " + str(e))
"""


def _start(out, ready, stop) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(_REPO))
    return subprocess.Popen([sys.executable, "-c", _HOLDER, str(out), str(ready), str(stop)], env=env)


def _wait_for(path: pathlib.Path, proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert proc.poll() is None, f"the child ended with {proc.returncode} before writing {path}"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.02)
    return path.read_text()


def test_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path):
    out, ready, stop = tmp_path / "out", tmp_path / "ready", tmp_path / "stop"
    proc = _start(out, ready, stop)
    try:
        assert _wait_for(ready, proc) == "locked"
        holder = read_lock(str(out))
        assert holder["pid"] == proc.pid and holder["host"] == socket.gethostname()
        with pytest.raises(LockError) as info:
            OutputLock(str(out)).acquire()
        message = str(info.value)
        assert f"process {proc.pid} on host {socket.gethostname()!r}" in message
        assert "must not write one dataset at once" in message
    finally:
        stop.write_text("stop")
        assert proc.wait(timeout=60) == 0
    assert not (out / LOCK_FILENAME).exists()
    with OutputLock(str(out)) as lock:
        assert read_lock(str(out))["pid"] == os.getpid()
        assert (out / LOCK_FILENAME).exists() and lock.path == str(out / LOCK_FILENAME)
    assert not (out / LOCK_FILENAME).exists()


def test_of_writers_starting_together_exactly_one_gets_the_lock(tmp_path):
    out, stop = tmp_path / "out", tmp_path / "stop"
    readies = [tmp_path / f"ready{i}" for i in range(4)]
    procs = [_start(out, ready, stop) for ready in readies]
    try:
        results = [_wait_for(ready, proc) for ready, proc in zip(readies, procs)]
    finally:
        stop.write_text("stop")
        codes = [p.wait(timeout=60) for p in procs]
    assert codes == [0] * 4
    assert results.count("locked") == 1, results
    winner = procs[results.index("locked")].pid
    refusals = [r for r in results if r != "locked"]
    assert all(r.startswith("refused: ") and f"process {winner} " in r for r in refusals), refusals


def test_lock_of_a_killed_writer_is_detected_and_explained(tmp_path):
    out, ready, stop = tmp_path / "out", tmp_path / "ready", tmp_path / "stop"
    proc = _start(out, ready, stop)
    assert _wait_for(ready, proc) == "locked"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    with pytest.raises(LockError) as info:
        OutputLock(str(out)).acquire()
    message = str(info.value)
    assert f"process {proc.pid}" in message and "no longer runs" in message
    assert f"Remove {out / LOCK_FILENAME}" in message
    # The stale lock is explained, never broken behind the user's back.
    assert read_lock(str(out))["pid"] == proc.pid
    (out / LOCK_FILENAME).unlink()
    with OutputLock(str(out)):
        pass


def test_a_file_that_is_not_a_lock_is_named(tmp_path):
    (tmp_path / LOCK_FILENAME).write_bytes(b"\x00garbage")
    with pytest.raises(LockError, match="not a shardsmith lock"):
        OutputLock(str(tmp_path)).acquire()



# Takes the lock on argv[1], SIGKILLed by itself at the argv[2]-th line that runs in
# conversion/lock.py (the stop of a `kill -9`, a power cut, the OOM killer, at that point);
# prints "done" if it got that far without being killed.
_KILLED_AT_LINE = """
import os, signal, sys
from conversion import lock

out, at = sys.argv[1], int(sys.argv[2])
count = 0

def trace(frame, event, arg):
    global count
    if frame.f_code.co_filename != lock.__file__:
        return None
    if event == "line":
        count += 1
        if count == at:
            os.kill(os.getpid(), signal.SIGKILL)
    return trace

sys.settrace(trace)
lock.OutputLock(out, command="killed").acquire()
sys.settrace(None)
print("done")
"""


def test_a_writer_killed_at_any_line_of_taking_the_lock_leaves_none_or_a_whole_one(tmp_path):
    """Killed between creating the lock file and writing it, a writer left an empty file, which the
    next writer could only call "not a shardsmith lock ('')" (an append test's kill, once, under
    load); and a draft left behind by such a kill is cleared by the next writer that gets the lock."""
    env = dict(os.environ, PYTHONPATH=str(_REPO))
    seen = set()
    for at in range(1, 200):
        out = tmp_path / f"at{at}"
        proc = subprocess.run([sys.executable, "-c", _KILLED_AT_LINE, str(out), str(at)], env=env,
                              capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            assert proc.stdout == "done\n" and read_lock(str(out))["command"] == "killed"
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        lock_file = out / LOCK_FILENAME
        if lock_file.exists():
            holder = read_lock(str(out))
            assert "unreadable" not in holder and holder["command"] == "killed", (at, holder)
            with pytest.raises(LockError, match="no longer runs"):
                OutputLock(str(out)).acquire()
            lock_file.unlink()
            seen.add("whole lock")
        else:
            seen.add("no lock")
        # The next writer gets the lock, and leaves nothing behind once it lets go of it.
        with OutputLock(str(out)):
            pass
        assert sorted(p.name for p in out.iterdir()) == [], at
    else:
        pytest.fail("the writer was killed at every one of 199 lines")
    # Both outcomes occurred: the kill came before the lock existed, and after.
    assert seen == {"no lock", "whole lock"}, seen
