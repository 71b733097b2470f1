"""Recovering from a file that stopped its process: finding the culprit, and the supervised run.

The orchestration over `conversion.guard`'s primitives (journal, watchdog,
quarantine) that needs the worker pool (`conversion.processes`) and the shard
writer's warm-up: `crash_culprits` names the file a dead process was working
on (`probe` validates each suspect alone in a fresh process), and `supervise`
runs the driver in a child and resumes without its culprit. Kept apart from
`guard` so that the worker processes, which import `guard`, form no import
cycle with the pool and the writer. Beam-free.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import signal
import traceback
from collections.abc import Sequence

from conversion import processes as _processes
from conversion.elements import ConversionError
from conversion.files import output_full_text
from conversion.guard import (
    DECODER_CRASHED, JOURNAL_ENV, TIMEOUT, TOO_LARGE, Quarantine, Suspect, Watchdog, busy_slots, forget,
    format_bytes, new_journal_folder, signal_name,
)
from conversion.shard_writer import warm_up

__all__ = ["probe", "crash_culprits", "supervise", "failure_message"]

_LOG = logging.getLogger("shardsmith.convert")


def _probe_one(path: str, rel_path: str, validation) -> None:
    """Validates one file as a shard writer would (run in a fresh worker process)."""
    from conversion.files import read_bytes
    from imaging import ImageRejected, ImageValidator

    try:
        ImageValidator(validation).validate_all(read_bytes(path), rel_path)
    except (ImageRejected, OSError):
        pass  # An ordinary reject: the shard writer says it again.


def _warm_up(validation) -> tuple:

    return warm_up, validation


def probe(suspects: Sequence[Suspect], validation, timeout: float,
          memory: int | None = None) -> dict[str, tuple[str, str]]:
    """Validates each suspect alone in a fresh process: rel_path -> (reason, message) of those that fail.

    A file whose process dies is `decoder_crashed`; one that does not finish
    within `timeout` seconds, `timeout`; one whose process grows past
    `memory` bytes (its own watchdog stops it), `too_large`. An exception is
    no culprit here: the shard writer turns it into `internal_error` itself.
    """

    found = {}
    pool = None
    waiter = concurrent.futures.ThreadPoolExecutor(1, "shardsmith-probe")
    try:
        for s in suspects:
            if pool is None:
                pool = _processes.WorkerProcesses(1, file_memory=memory)
                # Started and given its decoders untimed: only the file's own work is held to `timeout`.
                pool.call(*_warm_up(validation))
            call = waiter.submit(pool.call, _probe_one, s.path, s.rel_path, validation)
            try:
                call.result(timeout)
            except concurrent.futures.TimeoutError:
                pool.close(kill=True)
                pool = None
                found[s.rel_path] = (TIMEOUT, f"{s.rel_path}: not finished after --file_timeout={timeout:g}s "
                                     "(tried again alone)")
                with contextlib.suppress(Exception):
                    call.result()
            except _processes.WorkerDied as e:
                over = any(slot.over_memory for slot in busy_slots(pool.journal_folder, [e.pid]))
                pool.close(kill=True)
                pool = None
                if over:
                    found[s.rel_path] = (TOO_LARGE, f"{s.rel_path}: {_over_memory(memory)} (tried again alone)")
                else:
                    found[s.rel_path] = (DECODER_CRASHED, f"{s.rel_path}: the process validating it ended "
                                         f"({signal_name(e.returncode)}); again when tried alone")
            except Exception as e:  # noqa: BLE001 - reported by the shard writer, not a crash
                _LOG.debug("Probing %s raised %r", s.rel_path, e)
    finally:
        if pool is not None:
            pool.close(kill=True)
        waiter.shutdown(wait=True)
    return found


def _over_memory(memory: int | None) -> str:
    limit = format_bytes(memory) if memory else "its bound"
    return f"reading it took more memory than --file_memory={limit.replace(' ', '')} allows"


def crash_culprits(folder: str, pid: int, returncode: int, validation, timeout: float,
                   seen: dict, memory: int | None = None) -> dict[str, tuple[str, str]] | None:
    """The files to blame for the death of process `pid`, read from its journal.

    A slot the watchdog marked blames its file as `timeout`, or `too_large`
    when its process grew past `memory` (several files: each is tried alone,
    `probe`). A crash with one file in work blames it;
    with several, each is tried alone, and only those that crash again are
    blamed. Files that do not crash alone are given one more try together (the
    crash may have been the machine's, e.g. memory); a second crash with the
    same files in work blames them all.

    Args:
      folder: The journals' folder.
      pid: The dead process.
      returncode: Its return code (negative: the signal).
      validation: The conversion's `imaging.ValidationOptions`, for `probe`.
      timeout: --file_timeout.
      seen: State the caller keeps across crashes (the file sets given another try).
      memory: --file_memory, in bytes, for `probe`.

    Returns:
      rel_path -> (reason, message) of the files to reject; empty to try
      again as it was; None when the process was working on no file (the
      death is not a file's doing).
    """
    slots = busy_slots(folder, [pid])
    forget(folder, pid)
    if not slots:
        return None
    how = signal_name(returncode)
    found: dict[str, tuple[str, str]] = {}
    crashed: list[Suspect] = []
    grown = [s for slot in slots if slot.over_memory for s in slot.suspects]
    if len(grown) == 1:
        found[grown[0].rel_path] = (TOO_LARGE, f"{grown[0].rel_path}: {_over_memory(memory)}")
    elif grown:  # Which of the files in work grew: each is tried alone, with the same bound.
        found.update(_blame(grown, TOO_LARGE, _over_memory(memory), validation, timeout, seen, memory))
    for slot in slots:
        if slot.over_memory:
            continue
        if not slot.timed_out:
            crashed.extend(slot.suspects)
        elif len(slot.suspects) == 1:
            s = slot.suspects[0]
            found[s.rel_path] = (TIMEOUT, f"{s.rel_path}: not finished after --file_timeout={timeout:g}s")
        else:  # Which file of a batch hung: each is tried alone, with the same limit.
            found.update(_blame(slot.suspects, TIMEOUT, f"not finished after --file_timeout={timeout:g}s",
                                validation, timeout, seen, memory))
    if len(crashed) == 1:
        s = crashed[0]
        found[s.rel_path] = (DECODER_CRASHED, f"{s.rel_path}: the process validating it ended ({how})")
    elif crashed:
        found.update(_blame(crashed, DECODER_CRASHED, f"the process validating it ended ({how})",
                            validation, timeout, seen, memory))
    return found


def _blame(suspects: Sequence[Suspect], reason: str, what: str, validation, timeout: float,
           seen: dict, memory: int | None = None) -> dict[str, tuple[str, str]]:
    """Those of several files in work that fail alone (`probe`); all of them if none does, the second time."""
    found = probe(suspects, validation, timeout, memory)
    key = frozenset(s.rel_path for s in suspects)
    if not found and key in seen:
        found = {s.rel_path: (reason, f"{s.rel_path}: {what} twice, with {len(suspects) - 1} other files "
                              "in work; alone it did not") for s in suspects}
    seen[key] = True
    return found


# Deaths of the driver after which `supervise` gives up (each blames a file, or retries once).
_MAX_RESTARTS = 50
# Signals a person or a service manager sends to stop a run: never a file's doing.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def supervise(attempt, argv: list[str], *, quarantine: Quarantine, validation, timeout: float,
              resume_argv, memory: int | None = None) -> int:
    """Runs `attempt(argv)` in a child process; carries on without the file that killed it.

    The command's process forks before any work (no thread of TensorFlow or
    gRPC has started yet; the child does everything) and waits. If the child
    dies on a file (a crash in a decoder, the OOM killer, or the watchdog
    stopping a file past `timeout` or a process past `memory` bytes), the files it was working on are read
    from its journal and blamed (`crash_culprits`), quarantined in the
    output, and the run goes on in a new child with `resume_argv(argv)`
    (--resume: the finished shards are kept).

    Args:
      attempt: Runs the command in-process; returns its exit status.
      argv: The command's arguments.
      quarantine: Where the blamed files are kept for the next attempt.
      validation: The `imaging.ValidationOptions`, to try suspects alone.
      timeout: --file_timeout.
      resume_argv: The arguments of the attempt after a crash.
      memory: --file_memory, in bytes; None: no bound.

    Returns:
      The exit status of the last attempt (128 + N when it was ended by signal N
      and not by a file).
    """
    if not _processes.fork_is_safe():
        return attempt(argv)
    folder = new_journal_folder()
    previous = os.environ.get(JOURNAL_ENV)
    os.environ[JOURNAL_ENV] = folder
    watchdog = Watchdog(folder, timeout, memory=memory).start()
    seen: dict = {}
    try:
        for _ in range(_MAX_RESTARTS):
            pid, code = _run_child(attempt, argv)
            if code >= 0 or -code in _STOP_SIGNALS:
                return code if code >= 0 else 128 - code
            found = crash_culprits(folder, pid, code, validation, timeout, seen, memory)
            if found is None:
                _LOG.error("The conversion's process ended (%s) while working on no file.", signal_name(code))
                return 128 - code
            for path, (reason, message) in sorted(found.items()):
                _LOG.warning("Rejected %s (%s): %s", path, reason, message)
            if found:
                quarantine.add(found)
            if found:
                _LOG.warning("Going on without %s (the finished shards are kept).",
                             "that file" if len(found) == 1 else f"those {len(found)} files")
            else:
                _LOG.warning("No file crashes alone: trying once more as it was.")
            argv = resume_argv(argv)
        _LOG.error("The conversion's process died %d times; giving up.", _MAX_RESTARTS)
        return 1
    finally:
        watchdog.stop()
        if previous is None:
            os.environ.pop(JOURNAL_ENV, None)
        else:
            os.environ[JOURNAL_ENV] = previous
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def _run_child(attempt, argv) -> tuple[int, int]:
    """Forks; the child runs `attempt(argv)` and exits with its status. Returns (its pid, its return code)."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # The child: everything happens here.
        # This process is shardsmith's own, and what it has imported (Beam,
        # gRPC, ~300,000 objects), or imports later (TensorFlow's decode
        # ops), lives as long as it: frozen, no collection walks it again
        # (20,000 small JPEGs: ~5% less time).
        import gc

        from compat import tf_internals

        gc.freeze()
        tf_internals.freeze_imports()
        code = 1
        try:
            code = attempt(argv)
        except KeyboardInterrupt:
            code = 128 + signal.SIGINT
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - printed as Python would, then the status
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    # Ctrl-C reaches the child through the terminal's process group; a
    # SIGTERM sent to this process is passed on to it.
    handlers = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
                signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))}
    try:
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return pid, os.waitstatus_to_exitcode(status)


def failure_message(e: BaseException) -> str | None:
    """The text of a `ConversionError`, `WorkerDied` or `files.OutputFull` of an attempt, also inside a
    runner's wrapped exception (the runner wraps errors raised in its workers); None for any other error."""
    full = output_full_text(e)
    if full is not None:
        return full + _DISK_FULL_ADVICE
    for line in str(e).splitlines():
        for kind in ("ConversionError:", "WorkerDied:"):
            if kind in line:
                return line.split(kind, 1)[1].strip()
    if isinstance(e, (ConversionError, _processes.WorkerDied)):
        return str(e)
    return None


# After `files.OutputFull`'s text ("No space left on device while writing X into DIR").
_DISK_FULL_ADVICE = (": the conversion stopped there, and the shards finished so far are kept. Free some space "
                     "(or give another --output_dir), then run the same command with --resume to go on.")
