"""`bench.service`'s pinning: every thread of a worker process on its core, not only the first."""

import os
import subprocess
import sys

from bench import service

# A process with three threads besides its main one, as a worker server has its thread pools
# running before the benchmark pins it.
_THREADS = ("import sys, threading, time\n"
            "for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "print('up', flush=True); sys.stdin.read()\n")


def _affinities(pid):
    return {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def test_pin_process_pins_threads_started_before_it():
    core = min(os.sched_getaffinity(0))
    proc = subprocess.Popen([sys.executable, "-c", _THREADS], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        # The fact the helper exists for: the call on a process id sets one thread's affinity.
        os.sched_setaffinity(proc.pid, {core})
        before = _affinities(proc.pid)
        assert len(before) == 4 and before[proc.pid] == {core}
        if len(os.sched_getaffinity(0)) > 1:
            assert any(cores != {core} for cores in before.values())
        assert service._pin_process(proc.pid, {core}) == 4
        assert set(map(frozenset, _affinities(proc.pid).values())) == {frozenset({core})}
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait()
