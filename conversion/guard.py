"""No single input file can stop a conversion: what each process is working on, and who failed.

Three ways one file can end a job, and what becomes of each here:

- **An error nobody expected** (a bug of shardsmith's or of a library's, on
  one file): the shard writer catches it around that file alone, and the file
  is rejected as `internal_error`, with the exception's type, message and
  innermost frame (`internal_error`).
- **A decoder that kills its process** (a segfault or abort in C code, the
  kernel's OOM killer): nothing in that process survives, so what it was
  working on must be known from outside. Each process notes the files it is
  validating in a small memory-mapped `Journal` (one file per process in a
  shared folder; a slot per busy thread). Whoever started the process reads
  the dead one's busy slots: the driver for its worker processes (`processes`),
  the command's `recovery.supervise` for the driver itself. A slot that held several
  files (a batch of JPEGs decoded together) is narrowed down by `recovery.probe`,
  which validates each file alone in a fresh process: only the file that
  crashes again is the culprit (`decoder_crashed`); the others are converted.
- **A decoder that never returns** (`--file_timeout`): a `Watchdog` thread
  outside the stuck process reads the journals, marks the overdue slot
  `timeout` and kills the process, which then ends like a crash.
- **A decoder that grows without end** (`--file_memory`): the same watchdog
  reads the resident memory of each process with a file in work; one past
  the bound has its busy slots marked and is killed, and its file is
  rejected as `too_large` (tried alone first when several were in work),
  before the kernel's OOM killer picks a process of its own.

Culprits are kept in the output's temporary folder (`Quarantine`), so the run
that goes on (the worker's shard written again, the driver's run resumed with
`--resume`, or a user's `--resume` later) rejects them without reading them.

This module holds the primitives (journal, watchdog, quarantine);
`conversion.recovery` the orchestration that uses them with the worker pool
and the shard writer. Beam-free: worker processes import it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import mmap
import os
import signal
import struct
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "INTERNAL_ERROR", "DECODER_CRASHED", "TIMEOUT", "TOO_LARGE", "FAILURE_REASONS", "JOURNAL_ENV",
    "internal_error_message", "Journal", "journal", "Suspect", "busy_slots", "Watchdog",
    "Quarantine", "quarantine_path", "failure_sentence", "signal_name", "new_journal_folder", "forget",
    "default_file_memory", "resident_bytes", "format_bytes",
]

_LOG = logging.getLogger("shardsmith.convert")

INTERNAL_ERROR = "internal_error"
DECODER_CRASHED = "decoder_crashed"
TIMEOUT = "timeout"
# A file whose process grew past --file_memory: the file's own verdict (as a header claiming too
# many pixels is), not a failure of shardsmith's.
TOO_LARGE = "too_large"
# The reject reasons that mean "shardsmith or a decoder failed on this file", not "the file is bad".
FAILURE_REASONS = (INTERNAL_ERROR, DECODER_CRASHED, TIMEOUT)

# The folder of the journals of one conversion's processes; set by `supervise`
# (or by the driver for its worker processes) in the environment of the
# processes it starts, never on import.
JOURNAL_ENV = "SHARDSMITH_JOURNAL_DIR"

# A journal is a sparse file: a table of one state byte per slot, then _SLOTS
# slots of _SLOT_BYTES (a header, then the names); only the pages in use take
# memory or disk. Enough slots for every thread of a large machine's driver
# (4 read-ahead threads per shard writer, a writer per core); a thread that
# finds none free validates unnoted. Readers look at the table alone (the
# watchdog does every second) and at the slots it marks busy.
_SLOTS = 1024
_TABLE_BYTES = 4096
_SLOT_BYTES = 64 * 1024
# Number of names, length of the names' bytes, start time (time.time()).
_HEADER = struct.Struct("<IId")
# The file in work now (its position among the names; -1: all of them, e.g. a batch decoded
# together) and since when: the watchdog times each file, not the group (`Journal.working_on`).
_NOW = struct.Struct("<id")
_FREE, _BUSY, _TIMED_OUT, _OVER_MEMORY = b"\0", b"\1", b"\2", b"\3"
_NAMES_BYTES = _SLOT_BYTES - _HEADER.size - _NOW.size
_SEP = b"\0"


def internal_error_message(rel_path: str, error: BaseException) -> str:
    """The reject message of an unexpected error: its type, message and innermost frame."""
    frames = traceback.extract_tb(error.__traceback__)
    where = ""
    if frames:
        frame = frames[-1]
        # The package and file, not the machine's site-packages path.
        short = "/".join(frame.filename.replace(os.sep, "/").split("/")[-2:])
        where = f" (in {frame.name}, {short}:{frame.lineno})"
    text = str(error).strip() or "no message"
    return f"{rel_path}: {type(error).__name__}: {text}{where}"


def signal_name(code: int) -> str:
    """'SIGSEGV' for a process's return code -11; 'exit status N' for N >= 0."""
    if code >= 0:
        return f"exit status {code}"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


@dataclasses.dataclass(frozen=True)
class Suspect:
    """A file that a process was working on: its relative path and where to read it."""

    rel_path: str
    path: str


@dataclasses.dataclass(frozen=True)
class _Slot:
    """A busy slot of a journal, as read from outside its process."""

    pid: int
    index: int
    suspects: tuple[Suspect, ...]
    started: float
    timed_out: bool
    over_memory: bool = False
    # The file in work (-1: every file of the slot) and since when (`Journal.working_on`'s `now_on`).
    current: int = -1
    since: float = 0.0


class Journal:
    """The files a process's threads are working on, in a memory-mapped file others can read.

    Writing a slot is a few memory writes (no system call), so it costs
    nothing next to a decode; the mapping is shared with the file, so what was
    written survives the process's death.

    Args:
      folder: The journals' folder; this process's journal is `folder/<pid>`.
    """

    def __init__(self, folder: str):
        self.path = os.path.join(folder, str(os.getpid()))
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, _TABLE_BYTES + _SLOTS * _SLOT_BYTES)
            self._map = mmap.mmap(fd, _TABLE_BYTES + _SLOTS * _SLOT_BYTES)
        finally:
            os.close(fd)
        self._lock = threading.Lock()
        self._free = list(range(_SLOTS - 1, -1, -1))

    @contextlib.contextmanager
    def working_on(self, files: Sequence[tuple[str, str]]):
        """Notes (rel_path, path) of each file in a slot while the block runs.

        Files whose names do not fit in a slot are noted as far as they fit
        (a group of files is bounded well below that: `shard_writer`).
        With every slot taken, nothing is noted.

        Yields `now_on(k)`: the block calls it as it starts on its k-th file
        (-1: on all of them at once, e.g. a batch decoded together), a few
        memory writes. The watchdog then times each file from its own start
        (--file_timeout bounds one file, not a group), and a process that
        dies blames the file in work alone.
        """
        with self._lock:
            index = self._free.pop() if self._free else None
        if index is None:
            yield _not_noted
            return
        names, count = _encode_names(files)
        base = _TABLE_BYTES + index * _SLOT_BYTES
        m = self._map
        now = time.time()
        m[base + _HEADER.size + _NOW.size:base + _HEADER.size + _NOW.size + len(names)] = names
        _NOW.pack_into(m, base + _HEADER.size, -1, now)
        m[base:base + _HEADER.size] = _HEADER.pack(count, len(names), now)
        m[index:index + 1] = _BUSY  # Last: a reader sees the slot busy only once it is complete.

        def now_on(k: int, _pack=_NOW.pack_into, _at=base + _HEADER.size, _time=time.time) -> None:
            _pack(m, _at, k if k < count else -1, _time())

        try:
            yield now_on
        finally:
            m[index:index + 1] = _FREE
            with self._lock:
                self._free.append(index)


def _encode_names(files: Sequence[tuple[str, str]]) -> tuple[bytes, int]:
    """b'rel_path\\0path\\0...' of `files`, as many as fit in a slot; and their number."""
    # One join and one encode (os.fsencode's, on POSIX) for the whole group:
    # a per-name fsencode cost ~1.5 us a file, ~5% of validating a tiny JPEG.
    names = "\0".join(itertools.chain.from_iterable(files)).encode("utf-8", "surrogateescape") + _SEP
    if len(names) <= _NAMES_BYTES:
        return names, len(files)
    parts, size = [], 0
    for rel_path, path in files:
        entry = os.fsencode(rel_path) + _SEP + os.fsencode(path) + _SEP
        if size + len(entry) > _NAMES_BYTES:
            break
        parts.append(entry)
        size += len(entry)
    return b"".join(parts), len(parts)


_JOURNAL: Journal | None = None
_JOURNAL_LOCK = threading.Lock()


def journal() -> Journal | None:
    """This process's journal, in the folder named by `JOURNAL_ENV`; None when none is kept.

    Opened on first use (a worker process writes its own file), never on import.
    """
    global _JOURNAL
    folder = os.environ.get(JOURNAL_ENV)
    if not folder:
        return None
    j = _JOURNAL
    if j is not None and j.path == os.path.join(folder, str(os.getpid())):
        return j
    with _JOURNAL_LOCK:
        if _JOURNAL is None or _JOURNAL.path != os.path.join(folder, str(os.getpid())):
            try:
                _JOURNAL = Journal(folder)
            except OSError as e:  # The folder went away: convert on, unguarded.
                _LOG.debug("No journal in %s: %s", folder, e)
                return None
        return _JOURNAL


def _not_noted(k: int) -> None:
    """`Journal.working_on`'s `now_on` where nothing is noted."""


def working_on(files: Sequence[tuple[str, str]]):
    """`Journal.working_on` of this process's journal, or a no-op without one (yielding a no-op `now_on`)."""
    j = journal()
    return j.working_on(files) if j is not None else contextlib.nullcontext(_not_noted)


def busy_slots(folder: str, pids: Iterable[int] | None = None) -> list[_Slot]:
    """The busy slots of the journals in `folder` (of `pids` only, if given), oldest first."""
    wanted = None if pids is None else {int(p) for p in pids}
    slots = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or (wanted is not None and int(name) not in wanted):
            continue
        try:
            # Mapped, not read: only the slots' headers are looked at (the
            # watchdog does this every second), and a free slot is a hole.
            with open(os.path.join(folder, name), "rb") as f:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # Gone, or empty (being created).
            continue
        with data:
            table = data[:_SLOTS]
            if not table.strip(_FREE):
                continue  # The usual case: nothing in work.
            for index, state in enumerate(table):
                if state == _FREE[0]:
                    continue
                base = _TABLE_BYTES + index * _SLOT_BYTES
                count, length, started = _HEADER.unpack_from(data, base)
                current, since = _NOW.unpack_from(data, base + _HEADER.size)
                at = base + _HEADER.size + _NOW.size
                raw = data[at:at + length].split(_SEP)
                suspects = tuple(Suspect(os.fsdecode(raw[2 * i]), os.fsdecode(raw[2 * i + 1]))
                                 for i in range(min(count, len(raw) // 2)))
                if 0 <= current < len(suspects):  # One file of the group in work: it alone is suspect.
                    suspects = suspects[current:current + 1]
                slots.append(_Slot(int(name), index, suspects, started, state == _TIMED_OUT[0],
                                   state == _OVER_MEMORY[0], current, since))
    slots.sort(key=lambda s: s.started)
    return slots


def forget(folder: str, pid: int) -> None:
    """Removes a dead process's journal (its slots were read)."""
    with contextlib.suppress(OSError):
        os.remove(os.path.join(folder, str(pid)))


def _mark(folder: str, slot: _Slot, state_after: bytes = _TIMED_OUT) -> bool:
    """Marks a busy slot as timed out or over memory (if it still holds the same work); True if it did."""
    try:
        fd = os.open(os.path.join(folder, str(slot.pid)), os.O_RDWR)
    except OSError:
        return False
    try:
        state = os.pread(fd, 1, slot.index)
        head = os.pread(fd, _HEADER.size + _NOW.size, _TABLE_BYTES + slot.index * _SLOT_BYTES)
        _, _, started = _HEADER.unpack_from(head)
        if state != _BUSY or started != slot.started or _NOW.unpack_from(head, _HEADER.size) != (
                slot.current, slot.since):
            return False  # Finished meanwhile, or on to its next file.
        os.pwrite(fd, state_after, slot.index)
        return True
    finally:
        os.close(fd)


def resident_bytes(pid: int) -> int | None:
    """The resident memory of process `pid` (Linux's /proc); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# --file_memory's default: a few GiB, or the machine's share (its memory over its cores) if less,
# and never so little that a process with TensorFlow's decoders loaded and one photo in work passes it.
_DEFAULT_FILE_MEMORY_CAP = 4 << 30
_DEFAULT_FILE_MEMORY_FLOOR = 1536 << 20


def default_file_memory() -> int:
    """--file_memory when not given: min(4 GiB, physical memory / cores), at least 1.5 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return _DEFAULT_FILE_MEMORY_CAP
    share = total // max(1, os.cpu_count() or 1)
    return max(_DEFAULT_FILE_MEMORY_FLOOR, min(_DEFAULT_FILE_MEMORY_CAP, share))


def format_bytes(n: float) -> str:
    """'1.5 GiB', '640 MiB': a memory size as --file_memory takes it."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


class Watchdog:
    """A thread that kills a process whose slot stays busy longer than `timeout` seconds,
    or that holds more than `memory` bytes while a slot is busy.

    It marks the slot (`timeout`, or over memory) first, so whoever handles
    the death knows the culprit without trying it again. It watches from
    outside the process (a decoder may hold the GIL while it loops).

    Args:
      folder: The journals' folder.
      timeout: --file_timeout, in seconds; None: no limit.
      spare: Pids never to kill (e.g. the watching process itself, which
        has no one above it to carry on).
      memory: --file_memory, in bytes: the resident memory a process with a
        file in work may reach; None: no limit.
    """

    def __init__(self, folder: str, timeout: float | None, spare: Sequence[int] = (), memory: int | None = None):
        self._folder = folder
        self._timeout = timeout
        self._memory = memory
        self._spare = set(spare)
        self._stop = threading.Event()
        self._warned: set[tuple[int, int, float]] = set()
        self._thread = threading.Thread(target=self._loop, name="shardsmith-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        # Memory is read every half second at most: a runaway decoder grows ~30 MB/s (issue 39).
        period = min(1.0 if self._memory is None else 0.5, max(0.05, (self._timeout or 10.0) / 10))
        while not self._stop.wait(period):
            self.check()

    def check(self) -> None:
        """Kills the processes with an overdue slot, or over memory with a busy slot (one pass)."""
        now = time.time()
        slots = busy_slots(self._folder)
        killed: set[int] = set()
        if self._memory is not None:
            killed = self._check_memory(slots)
        if self._timeout is None:
            return
        for slot in slots:
            if slot.timed_out or slot.over_memory or slot.pid in killed or now - slot.since <= self._timeout:
                continue
            if slot.pid in self._spare:
                key = (slot.pid, slot.index, slot.started)
                if key not in self._warned:
                    self._warned.add(key)
                    _LOG.warning("%s has been in work for more than --file_timeout=%gs; without a "
                                 "supervising process (the shardsmith command) it cannot be stopped",
                                 ", ".join(s.rel_path for s in slot.suspects), self._timeout)
                continue
            if _mark(self._folder, slot, _TIMED_OUT):
                _LOG.warning("Stopping process %d: %s took longer than --file_timeout=%gs", slot.pid,
                             ", ".join(s.rel_path for s in slot.suspects[:3]), self._timeout)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signal.SIGKILL)

    def _check_memory(self, slots: Sequence[_Slot]) -> set[int]:
        """Kills each process (not spared) past `memory` with a file in work; their pids."""
        by_pid: dict[int, list[_Slot]] = {}
        for slot in slots:
            if slot.pid not in self._spare and not slot.timed_out and not slot.over_memory:
                by_pid.setdefault(slot.pid, []).append(slot)
        killed = set()
        for pid, busy in by_pid.items():
            rss = resident_bytes(pid)
            if rss is None or rss <= self._memory:
                continue
            # Every file in work is a suspect (`recovery.crash_culprits` tries each alone).
            if sum(_mark(self._folder, slot, _OVER_MEMORY) for slot in busy):
                _LOG.warning("Stopping process %d: it holds %s, past --file_memory=%s, while reading %s",
                             pid, format_bytes(rss), format_bytes(self._memory),
                             ", ".join(s.rel_path for slot in busy for s in slot.suspects[:3]))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        return killed


# Inside the output's temporary folder: the files that crashed or hung a process (`Quarantine`).
_QUARANTINE_FILENAME = "quarantine.jsonl"


def quarantine_path(output_dir: str) -> str:
    """Where a conversion into `output_dir` keeps the files that crashed or hung a process."""
    from conversion.files import TMP_DIRNAME, join

    return join(output_dir, TMP_DIRNAME, _QUARANTINE_FILENAME)


class Quarantine:
    """Files that crashed or hung a process, kept in the output's temporary folder.

    One JSON line per file: {"path", "reason", "message"}. Read by the shard
    writers, which reject these files without reading them.

    Args:
      path: The file (`<output>/_shardsmith_tmp/quarantine.jsonl`).
    """

    def __init__(self, path: str):
        self._path = path
        self._lock = threading.Lock()

    def load(self) -> dict[str, tuple[str, str]]:
        """rel_path -> (reason, message) of every quarantined file; empty without a file."""
        from conversion.files import exists, read_bytes

        # Object stores answer a read of a missing object with their own errors (google.api_core's NotFound).
        if not exists(self._path):
            return {}
        text = read_bytes(self._path).decode("utf-8", "surrogateescape")
        entries = {}
        for line in text.splitlines():
            if line.strip():
                item = json.loads(line)
                entries[item["path"]] = (item["reason"], item["message"])
        return entries

    def add(self, found: Mapping[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
        """Adds entries (atomically, keeping the earlier ones); returns them all."""
        from conversion.files import write_atomically

        with self._lock:
            entries = {**self.load(), **found}
            text = "".join(
                json.dumps({"path": p, "reason": r, "message": m}, sort_keys=True, ensure_ascii=True) + "\n"
                for p, (r, m) in sorted(entries.items())
            )
            folder, name = os.path.split(self._path)
            write_atomically(folder, name, text.encode("utf-8", "surrogateescape"))
            return entries


def new_journal_folder() -> str:
    """A fresh private folder for the journals of one conversion."""
    return tempfile.mkdtemp(prefix="shardsmith-journal-")


def failure_sentence(counts: Mapping[str, int]) -> str | None:
    """One sentence naming the files shardsmith or a decoder failed on; None without any."""
    n = sum(counts.get(r, 0) for r in FAILURE_REASONS)
    if not n:
        return None
    detail = ", ".join(f"{r} {counts[r]:,}" for r in FAILURE_REASONS if counts.get(r))
    files = "1 file" if n == 1 else f"{n:,} files"
    return (f"{files} hit an error in shardsmith or a decoder ({detail}): see rejects.jsonl, "
            "and please report them.")
