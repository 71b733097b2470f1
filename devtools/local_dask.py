"""A throw-away Dask cluster on 127.0.0.1, for tests and benchmarks.

`LocalDaskCluster` starts `dask scheduler` and N `dask worker` processes from
this interpreter's bin folder, each in a process group of its own, and kills
those groups when done, whatever happened. Groups rather than pids: a worker
is a nanny plus its worker process (plus a resource tracker), and killing the
leader alone would leave the others running.

Nothing here is used by the pipelines; `dask.distributed` is imported only
when a cluster starts, since it belongs to the optional `shardsmith[dask]`
extra (spelled `dask.distributed`: that extra declares `dask[distributed]`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Mapping

__all__ = ["LocalDaskCluster", "dask_command", "kill_groups"]

# The folder holding the shardsmith packages: workers unpickle shardsmith's
# functions, so they must import it even when it is not installed.
_CODE_ROOT = str(pathlib.Path(__file__).resolve().parent.parent)
_POLL_S = 0.2
_LOG_TAIL_CHARS = 2000
# argv[1]: the core; argv[2:]: the command it then runs, pinned to that core.
_PINNED = "import os, sys; os.sched_setaffinity(0, [int(sys.argv[1])]); os.execv(sys.argv[2], sys.argv[2:])"


def dask_command(*args: str) -> list[str]:
    """The `dask` command line of this interpreter's environment.

    Args:
      *args: Arguments of the `dask` command, e.g. "scheduler", "--port", "0".

    Returns:
      The console script next to `sys.executable` if there is one (a venv not
      on PATH), else `python -m dask`.
    """
    script = pathlib.Path(sys.executable).with_name("dask")
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "dask", *args]


def kill_groups(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each process's group (nanny, worker, resource tracker), then SIGKILL.

    Args:
      procs: Processes started with `start_new_session=True`, so that each
        pid is also the id of a group holding everything it started.
    """
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        for p in procs:
            # Gone already, or (PermissionError, macOS) a group of zombies.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)
        deadline = time.monotonic() + grace
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        if all(p.poll() is not None for p in procs):
            # The groups may still hold children of a leader that exited.
            for p in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
            return


def _scheduler_address(path: pathlib.Path) -> str | None:
    """The address in the scheduler file, or None while it is missing or half written."""
    try:
        return json.loads(path.read_text())["address"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class LocalDaskCluster:
    """A scheduler and `workers` worker processes on 127.0.0.1.

    Use as a context manager (or call `start()` and `stop()`): on exit, or on
    any error while starting, every process group started is killed.

    Args:
      workers: Worker processes (`dask worker --nworkers 1` each, so each is a
        process group of its own).
      folder: Where the scheduler file, the `<name>.log` output files and the
        workers' local directories go; created if missing.
      threads: Threads of each worker.
      cpu: If set, the workers (not the scheduler) may run on this core only.
      env: Extra environment variables of every process (a PYTHONPATH goes before
        shardsmith's root), e.g. Dask's
        `DASK_LOGGING__...` settings.
      name_prefix: Workers are named `<name_prefix>-<i>`.
      start_timeout: Seconds for the scheduler to come up and the workers to
        register (they import TensorFlow, possibly on busy cores).

    Attributes:
      address: The scheduler's tcp:// address, once started.
      scheduler_file: The scheduler's JSON file.
      worker_logs: Output files (stdout and stderr) of the workers.
      procs: Every process started, the scheduler first.
    """

    def __init__(self, workers: int, folder: str | os.PathLike, *, threads: int = 1,
                 cpu: int | None = None, env: Mapping[str, str] | None = None,
                 name_prefix: str = "shardsmith", start_timeout: float = 120.0):
        self.workers = workers
        self.folder = pathlib.Path(folder)
        self.threads = threads
        self.cpu = cpu
        self.name_prefix = name_prefix
        self.start_timeout = start_timeout
        # TensorFlow's C++ start-up chatter would bury the workers' own lines.
        extra = dict(env or {})
        # A PYTHONPATH given goes before shardsmith's own root (a plugin, in the tests).
        path = os.pathsep.join(filter(None, [extra.pop("PYTHONPATH", ""), _CODE_ROOT]))
        self._env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **extra, "PYTHONPATH": path}
        self.address: str | None = None
        self.scheduler_file = self.folder / "scheduler.json"
        self.worker_logs = [self.folder / f"worker{i}.log" for i in range(workers)]
        self.procs: list[subprocess.Popen] = []
        self._logs: list = []

    @property
    def pgids(self) -> set[int]:
        """Process groups of everything started (each process leads its own)."""
        return {p.pid for p in self.procs}

    def _start(self, name: str, *args: str, cpu: int | None = None) -> None:
        log = open(self.folder / f"{name}.log", "wb")
        self._logs.append(log)
        command = dask_command(*args)
        if cpu is not None:
            # Pinned before the command starts, so inherited by the nanny's worker process too: by a
            # small interpreter that sets its affinity and then becomes the command (exec), not in a
            # `preexec_fn`, which makes `subprocess` fork() instead of vfork(), and a fork() of a
            # process where Beam's multi-threaded runner ran (gRPC's poller) can abort the child
            # before its exec (`tests/helpers.run_without_core_dumps` says how).
            command = [sys.executable, "-c", _PINNED, str(cpu), *command]
        self.procs.append(subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self._env, cwd=str(self.folder), start_new_session=True,
        ))

    def _log_tails(self) -> str:
        return "\n".join(
            f"--- {p.name}:\n" + p.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
            for p in sorted(self.folder.glob("*.log"))
        )

    def start(self) -> LocalDaskCluster:
        """Starts the scheduler and the workers; returns when every worker has registered.

        Returns:
          self.

        Raises:
          RuntimeError: The scheduler did not start, or the workers did not
            register, within `start_timeout`; the message ends with the logs' tails.
          ImportError: `dask.distributed` is not installed (`shardsmith[dask]`).
        """
        import dask.distributed  # Optional extra: only when a cluster is wanted.

        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            self._start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0",
                        "--no-dashboard", "--scheduler-file", str(self.scheduler_file))
            deadline = time.monotonic() + self.start_timeout
            # The scheduler writes the file once it listens; until then it may
            # be missing or partly written.
            while (address := _scheduler_address(self.scheduler_file)) is None:
                if self.procs[0].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dask scheduler did not start:\n{self._log_tails()}")
                time.sleep(_POLL_S)
            self.address = address
            for i in range(self.workers):
                self._start(f"worker{i}", "worker", "--scheduler-file", str(self.scheduler_file),
                            "--host", "127.0.0.1", "--nworkers", "1", "--nthreads", str(self.threads),
                            "--no-dashboard", "--name", f"{self.name_prefix}-{i}",
                            "--local-directory", str(self.folder / f"worker{i}"), cpu=self.cpu)
            with dask.distributed.Client(scheduler_file=str(self.scheduler_file),
                                    timeout=self.start_timeout) as client:
                try:
                    client.wait_for_workers(self.workers,
                                            timeout=max(1.0, deadline - time.monotonic()))
                except TimeoutError as e:
                    raise RuntimeError(f"the {self.workers} dask workers did not register:\n"
                                       f"{self._log_tails()}") from e
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kills every process group started and closes the log files; safe to repeat."""
        kill_groups(self.procs)
        for log in self._logs:
            log.close()
        self._logs = []

    def __enter__(self) -> LocalDaskCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
