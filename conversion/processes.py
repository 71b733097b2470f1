"""Worker processes that write shards, so that a conversion's Python work uses every core.

On the local runner the shard writers are threads of one process: what they
do in Python (tifffile's header parsing, band statistics, encoding and
framing records) runs under one GIL, about one core whatever the machine,
and the threads handing the GIL to each other cost system time on top
(20,000 13-band rasters: 37 CPU s over 33 s of wall time on 2 cores). Here
each shard is written by one of N processes, one thread each.

The processes are plain `python -c` children fed pickled calls over two
pipes, not a `multiprocessing` pool: its spawned children re-import the
parent's `__main__` (`python -m beam_jobs.convert` would import Beam in each,
~1.3 s of CPU and ~80 MB), and forking a process that has loaded TensorFlow
or gRPC threads is unsafe. A child imports only what its calls need: for
local files, neither Beam nor TensorFlow's Python API.

    pool = WorkerProcesses(2, warm=(prepare, (options,)))
    try:
        outcome = pool.call(write_shard, job)
    finally:
        pool.close()

One owner holds a pool: the conversion's `conversion.shard_maker.ShardMaker`,
with its one `--file_timeout` (`file_timeout`, the watchdog's).

A caller that knows its first calls before its callers make them (the driver
knows the first shards before Beam's runner has started) starts them early
(`WorkerProcesses.start_early`); the first `call` with equal arguments then
gets that outcome instead of running again.
"""

from __future__ import annotations

import concurrent.futures
import gc
import json
import logging
import os
import pickle
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

from conversion import console, guard

__all__ = ["WorkerProcesses", "WorkerDied", "fork_is_safe", "main"]

_LOG = logging.getLogger("shardsmith.convert")

# Seconds a closing child may take to finish and exit before it is killed.
_EXIT_WAIT = 10
_BOOTSTRAP = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from conversion.processes import main; main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == '1')"
)


class WorkerDied(RuntimeError):
    """A worker process ended while running a call (killed, out of memory, a crash in C code).

    Attributes:
      pid: The process's id (its journal's name, `guard`).
      returncode: Its return code: negative for the signal that ended it.
    """

    def __init__(self, message: str, pid: int = 0, returncode: int = 0):
        super().__init__(message)
        self.pid = pid
        self.returncode = returncode

    def __reduce__(self):
        return type(self), (str(self), self.pid, self.returncode)


class _RemoteTraceback(Exception):
    """The traceback of an error raised in a worker process, shown as the error's cause."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self):
        return self.text


class _Forked:
    """A forked child, as much of `subprocess.Popen` as `_Worker` uses (pid, wait, kill)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode = None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            pid, status = os.waitpid(self.pid, 0 if deadline is None else os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            else:
                time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class _Worker:
    """One child process and its two pipes; used by one thread at a time.

    `fork`: the child is a fork of this process, not a fresh interpreter:
    it has every module this process has imported (~0.5 s of CPU less to
    start). Only for a process without TensorFlow, Beam or threads of other
    libraries (`fork_is_safe`, Beam not imported); `close_in_child` are the descriptors of other
    children's pipes, closed in it (a fresh child inherits none).
    """

    def __init__(self, env=None, fork: bool = False, close_in_child=()):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            if fork:
                self._proc = _Forked(_fork_child(env, to_child_r, from_child_w,
                                                 (to_child_w, from_child_r, *close_in_child)))
            else:
                self._proc = subprocess.Popen(
                    [sys.executable, "-c", _BOOTSTRAP, json.dumps(sys.path), str(to_child_r), str(from_child_w),
                     "1" if console.is_quiet() else "0"],
                    pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, close_fds=True, env=env,
                )
        except BaseException:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            raise
        os.close(to_child_r)
        os.close(from_child_w)
        self._to = os.fdopen(to_child_w, "wb")
        self._from = os.fdopen(from_child_r, "rb")
        self._unanswered = 0  # Calls sent whose answers are not read yet (`send`).

    @property
    def parent_fds(self) -> tuple[int, int]:
        """This process's ends of the child's pipes (closed in a later forked child)."""
        return self._to.fileno(), self._from.fileno()

    def send(self, fn, args) -> None:
        """Sends a call without waiting for its answer (read by the next `call`)."""
        try:
            pickle.dump((fn, args), self._to, protocol=pickle.HIGHEST_PROTOCOL)
            self._to.flush()
        except (BrokenPipeError, ValueError):  # ValueError: closed by `close`.
            raise self._died(fn) from None
        self._unanswered += 1

    def call(self, fn, args):
        """Runs `fn(*args)` in the child: (True, value), or (False, (error, traceback text)).

        Raises:
          WorkerDied: If the child ends before answering.
        """
        self.send(fn, args)
        answers = []  # Earlier calls' (a warm-up's), then this one's: all read, in order.
        while self._unanswered:
            try:
                answers.append(pickle.load(self._from))
            except (EOFError, pickle.UnpicklingError, OSError):
                raise self._died(fn) from None
            except ValueError:
                if not self._from.closed:
                    raise  # An answer's own error, not the pipe's.
                raise self._died(fn) from None  # Closed under this read (`close(kill=True)`).
            self._unanswered -= 1
        # A warm-up's error first: it is why this call failed too.
        return next((a for a in answers if not a[0]), answers[-1])

    def _died(self, fn) -> WorkerDied:
        code = self._proc.wait()
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        name = getattr(fn, "__qualname__", repr(fn))
        return WorkerDied(
            f"A shardsmith worker process (pid {self._proc.pid}) {how} while running {name}"
            " (out of memory, or a crash in a decoder). Run again with --worker_processes 0 to"
            " convert in the runner's own threads.", self._proc.pid, code,
        )

    def close(self, kill: bool = False) -> None:
        """Asks the child to exit (end of input), waits a while, then kills it; or kills it now."""
        if kill:
            # First: a thread reading its answer holds the pipe's lock until
            # the child's end closes.
            self._proc.kill()
        for f in (self._to, self._from):
            try:
                f.close()
            except OSError:
                pass
        try:
            self._proc.wait(_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class WorkerProcesses:
    """N child processes that run picklable calls, each one call at a time.

    Args:
      processes: How many.
      warm: Optional (fn, args) sent to every child at once, without
        waiting (e.g. loading decoders while the driver still plans);
        its result is ignored, its error raised by the child's first call.
      file_timeout: Seconds a child may work on one file (--file_timeout)
        before the watchdog stops it; None: no limit.
      file_memory: Bytes a child may hold while it works on a file
        (--file_memory) before the watchdog stops it; None: no bound.
      fork: Fork the first children from this process where it is safe
        (`fork_is_safe`, Beam not imported: no TensorFlow, Beam or other libraries' threads yet):
        they start with its modules imported. A child that takes a dead
        one's place later is a fresh interpreter.

    Raises:
      OSError: If a child cannot be started.
    """

    def __init__(self, processes: int, warm=None, file_timeout: float | None = None,
                 file_memory: int | None = None, fork: bool = False):
        if processes < 1:
            raise ValueError(f"`processes` must be at least 1. Received: {processes}")
        self.processes = processes
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self._warm = warm
        self._fork = fork
        # (fn, args, future) of calls started early (`start_early`), not yet claimed by `call`.
        self._early: list[tuple] = []
        self._early_threads: concurrent.futures.ThreadPoolExecutor | None = None
        # Where the children note the files they work on (`guard.Journal`):
        # the conversion's folder when a supervising command made one, else the pool's own.
        self.journal_folder = os.environ.get(guard.JOURNAL_ENV)
        self._own_folder = self.journal_folder is None
        if self._own_folder:
            self.journal_folder = guard.new_journal_folder()
        self._env = {**os.environ, guard.JOURNAL_ENV: self.journal_folder}
        # Stops a child stuck on one file, or grown past `file_memory` bytes while reading one
        # (the driver itself is spared: no one above it carries on).
        self._watchdog = None
        if file_timeout or file_memory:
            self._watchdog = guard.Watchdog(self.journal_folder, file_timeout or None, spare=(os.getpid(),),
                                            memory=file_memory).start()
        try:
            for _ in range(processes):
                self._idle.put(self._start())
        except BaseException:
            self.close()
            raise

    def _start(self) -> _Worker:
        # Not once Beam is imported either: its pools and clients may hold locks (and the
        # supervising fork of a plain run precedes it: `beam_jobs._startup.early_config`).
        fork = self._fork and "apache_beam" not in sys.modules and fork_is_safe()
        with self._lock:
            others = tuple(fd for w in self._workers for fd in w.parent_fds) if fork else ()
        worker = _Worker(self._env, fork=fork, close_in_child=others)
        if self._warm is not None:
            worker.send(*self._warm)
        with self._lock:
            self._workers.append(worker)
        return worker

    def start_early(self, fn, *args) -> None:
        """Starts `fn(*args)` now, in a child, for a `call` with equal arguments to come.

        For the calls a caller knows before it can make them: the driver
        starts the first shards while Beam's runner starts up (~1-2 s of
        wall time on busy cores in which the children would wait). The
        first `call(fn, *args)` with `fn` itself and equal `args` returns
        that outcome (or raises its error) instead of running again; until
        then it runs as any call, on a thread of the pool's own. Start at
        most as many as the caller will claim: an unclaimed one is work done
        for nothing.
        """
        if self._closed:
            raise RuntimeError("The worker processes are closed.")
        with self._lock:
            if self._early_threads is None:
                self._early_threads = concurrent.futures.ThreadPoolExecutor(self.processes, "shardsmith-early")
            self._early.append((fn, args, self._early_threads.submit(self._call, fn, args)))

    def _claim_early(self, fn, args):
        """The future of a call started early with `fn` and equal `args`, taken off the list; or None."""
        with self._lock:
            for k, (early_fn, early_args, future) in enumerate(self._early):
                if early_fn is fn and early_args == args:
                    del self._early[k]
                    return future
        return None

    def call(self, fn, *args):
        """Runs `fn(*args)` in an idle child (waiting for one); returns its value or raises its error.

        A call started early with equal arguments (`start_early`) is not run
        again: its outcome is returned (or its error raised).

        Raises:
          WorkerDied: If the child ends during the call; a fresh child takes its place.
        """
        if self._closed:
            raise RuntimeError("The worker processes are closed.")
        early = self._claim_early(fn, args) if self._early else None
        if early is not None:
            return early.result()
        return self._call(fn, args)

    def _call(self, fn, args):
        """`call`, without looking for a call started early."""
        if self._closed:
            raise RuntimeError("The worker processes are closed.")
        worker = self._idle.get()
        try:
            ok, value = worker.call(fn, args)
        except WorkerDied:
            with self._lock:
                if worker in self._workers:  # Not when the pool was closed under it (`abort`).
                    self._workers.remove(worker)
            worker.close()
            if not self._closed:
                self._idle.put(self._start())  # A fresh child for the next call.
            raise
        except BaseException:
            # Interrupted while a child works: its answer would go to the
            # next caller. The run is being stopped: every child is.
            self.close(kill=True)
            raise
        self._idle.put(worker)
        if not ok:
            error, text = value
            raise error from _RemoteTraceback(text)
        return value

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, kill: bool = False) -> None:
        """Ends every child: after its current call, or at once with `kill`."""
        self._closed = True
        with self._lock:
            workers, self._workers = self._workers, []
            watchdog, self._watchdog = self._watchdog, None
            early_threads, self._early_threads = self._early_threads, None
            self._early = []
        if watchdog is not None:
            watchdog.stop()
        for worker in workers:
            worker.close(kill=kill)
        if early_threads is not None:
            # Not waited for: their calls are answered by now, or fail as their children close
            # (and `close` may run on one of them, interrupted).
            early_threads.shutdown(wait=False, cancel_futures=True)
        if self._own_folder:
            shutil.rmtree(self.journal_folder, ignore_errors=True)


def fork_is_safe() -> bool:
    """Whether this process can fork a child: the command's supervised attempt, or a worker process.

    Not once TensorFlow is loaded (its thread pools would be missing in the
    child, their locks possibly held), nor beside other threads than
    shardsmith's own (the console's stderr filter, which holds no lock the
    child needs): `beam_jobs.convert.main` called inside a program that has done other
    work then runs in that program's process, unsupervised.
    """
    if not hasattr(os, "fork") or "tensorflow" in sys.modules:
        return False
    if not all(t is threading.main_thread() or t.name.startswith("shardsmith-")
               for t in threading.enumerate()):
        return False
    return _native_threads_are_fork_safe()


# Native threads a fresh command process has that survive a fork: Python's
# own and OpenBLAS's (named as the process, which they inherit) and
# jemalloc's background thread (both libraries re-create their threads in a
# child). Any other, e.g. gRPC's pollers and timers, means a library is
# running that a fork could leave broken in either process.
_FORK_SAFE_THREAD_NAMES = ("jemalloc_bg_thd",)


def _native_threads_are_fork_safe() -> bool:
    try:
        tasks = os.listdir("/proc/self/task")
        with open("/proc/self/comm") as f:
            process = f.read().strip()  # "python", "shardsmith", ...
    except OSError:
        return True  # No /proc (macOS): Python's own threads were checked.
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # Ended meanwhile.
        if name != process and name not in _FORK_SAFE_THREAD_NAMES:
            _LOG.debug("Not forking: native thread %r is running", name)
            return False
    return True


def _fork_child(env, fd_in: int, fd_out: int, close: tuple) -> int:
    """Forks a worker process that runs `main` on the pipes; its pid (in this process)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:  # The child: its own end of the pipes only, the pool's environment, then the loop.
        for fd in close:
            os.close(fd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        main(fd_in, fd_out, console.is_quiet(), configure=False)
    except BaseException:  # noqa: BLE001 - printed, then the status: the parent sees a dead worker
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def main(fd_in: int, fd_out: int, quiet: bool = False, configure: bool = True) -> None:
    """A child's loop: read a call, run it, write (True, value) or (False, (error, traceback)).

    Args:
      fd_in, fd_out: The pipes of calls and answers.
      quiet: Hide image libraries' lines and Python's warnings, as the
        driver's entry point does without --verbose (`conversion.console`).
      configure: Configure logging (a forked child keeps its parent's).
    """
    # Ctrl-C reaches the whole process group: the driver stops the children
    # by closing their input, so that an interrupted shard is not half-reported.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if configure and quiet:
        console.configure_logging(verbose=False, level=logging.WARNING)
    elif configure:
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
    calls = os.fdopen(fd_in, "rb")
    answers = os.fdopen(fd_out, "wb")
    modules = len(sys.modules)
    while True:
        try:
            fn, args = pickle.load(calls)
        except EOFError:
            return
        try:
            answer = (True, fn(*args))
        except Exception as e:  # Every error goes back to the caller, which raises it.
            answer = (False, (e, f"In worker process {os.getpid()}:\n{traceback.format_exc()}"))
        if len(sys.modules) != modules:
            # This process is shardsmith's own, and what its calls imported
            # (TensorFlow's decode ops: ~300,000 objects) lives as long as it:
            # frozen, no collection walks it again. Without it, 20,000 small
            # JPEGs took ~10% more CPU (each full collection walks them all).
            gc.freeze()
            modules = len(sys.modules)
        try:
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # An error (or value) that does not pickle: its text does.
            data = pickle.dumps((False, (RuntimeError(f"{type(e).__name__}: {e}"), traceback.format_exc())))
        answers.write(data)
        answers.flush()
