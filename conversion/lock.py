"""The output folder's lock: one conversion (or append) writes a dataset at a time.

`OutputLock(output_dir)` is a context manager. It creates `_shardsmith.lock`
in the folder holding the writer's host, process id, start time and command
line; a second writer finds it and is refused with `LockError`, which names
the holder. The lock is taken atomically for a local folder: the file is
written whole to a draft and linked to its name (`link` fails if the name
exists), so of two processes starting together exactly one gets it, and one
killed at any point leaves no lock or a whole one. A lock left by a process that no longer runs on this host (a
killed conversion) is detected and explained, and never broken silently:
breaking it automatically would let two writers that both saw it stale remove
each other's fresh locks.

Limit: for a URL (gs://, ...) the file goes through Beam's FileSystems
(`conversion.files`), which offers no create-if-absent; the lock is then
checked, written atomically and read back, which refuses any writer that
starts after another's lock is visible but leaves a window of one round trip
in which two writers starting together could both proceed. (GCS's
if-generation-match=0 precondition would close it; Beam's GcsIO does not
expose it.)
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import sys
import uuid

from conversion import files

__all__ = ["LOCK_FILENAME", "LockError", "OutputLock", "read_lock"]

LOCK_FILENAME = "_shardsmith.lock"

_log = logging.getLogger(__name__)


class LockError(RuntimeError):
    """Another writer holds (or held, and died holding) the output folder's lock."""


def read_lock(output_dir: str) -> dict | None:
    """The holder described by the folder's lock file; None if there is none.

    A lock file that is not the JSON this module writes is returned as
    {"unreadable": <its first bytes>}.
    """
    path = files.join(output_dir, LOCK_FILENAME)
    # exists() first: a missing object on a bucket raises the client's own
    # error, not FileNotFoundError.
    if not files.exists(path):
        return None
    try:
        data = files.read_bytes(path)
    except FileNotFoundError:  # Released between the two calls (local).
        return None
    try:
        holder = json.loads(data.decode("utf-8"))
        if not isinstance(holder, dict):
            raise ValueError(holder)
        return holder
    except ValueError:
        return {"unreadable": data[:200].decode("utf-8", "replace")}


def _alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (a zombie counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # It exists, under another user.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return True


def _refusal(output_dir: str, holder: dict | None) -> LockError:
    path = files.join(output_dir, LOCK_FILENAME)
    if holder is None:
        holder = {}
    if "unreadable" in holder:
        return LockError(
            f"{output_dir} is locked by {path}, which is not a shardsmith lock "
            f"({holder['unreadable']!r}). If no conversion is writing this folder, remove "
            f"{path} and run again."
        )
    host, pid = holder.get("host"), holder.get("pid")
    who = (f"process {pid} on host {host!r} (started {holder.get('time', '?')}: "
           f"{holder.get('command', '?')})")
    if host == socket.gethostname() and isinstance(pid, int) and not _alive(pid):
        return LockError(
            f"{output_dir} is locked by {who}, but that process no longer runs: it was "
            f"killed or crashed while writing, and left its lock {path}. The dataset is still "
            f"readable as its last complete version. Remove {path} and run the same command "
            f"again (with --append, or --resume) to finish or redo that conversion."
        )
    where = "this host" if host == socket.gethostname() else f"host {host!r}"
    return LockError(
        f"{output_dir} is being written by {who}; two conversions must not write one "
        f"dataset at once. Wait for it to finish, or, if no conversion runs on {where} "
        f"any more, remove {path} and run again."
    )


def _draft_name() -> str:
    """This process's draft of the lock file: `_shardsmith.lock.<host>.<pid>.tmp`."""
    return f"{LOCK_FILENAME}.{socket.gethostname()}.{os.getpid()}.tmp"


def _create_whole(path: str, data: bytes) -> None:
    """Creates the local file `path` holding `data`, or raises FileExistsError; never half-written.

    The lock is written in full to a draft beside it, then linked to its name
    (`link` creates a name atomically, and fails if it exists): a process
    killed at any point leaves either no lock or a whole one, never the empty
    file an exclusive create followed by a write leaves when killed between
    the two (which the next writer could only call "not a shardsmith lock"),
    and a writer starting meanwhile never reads a half-written one. Where the
    filesystem has no hard links (FAT, some network mounts), the exclusive
    create and write.
    """
    draft = os.path.join(os.path.dirname(path), _draft_name())
    with open(draft, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(draft, path)
    except FileExistsError:
        raise
    except OSError:  # No hard links here.
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        os.remove(draft)


def _remove_dead_drafts(output_dir: str) -> None:
    """Removes the lock drafts of processes on this host that no longer run (killed in `_create_whole`).

    Called with the lock held; a live process's draft (a writer being refused
    right now) is left to it.
    """
    prefix, host = LOCK_FILENAME + ".", socket.gethostname()
    for name in sorted(os.listdir(output_dir)):
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        draft_host, _, pid = name[len(prefix):-len(".tmp")].rpartition(".")
        if draft_host == host and pid.isdigit() and not _alive(int(pid)):
            try:
                os.remove(os.path.join(output_dir, name))
            except FileNotFoundError:
                pass


class OutputLock:
    """Holds the output folder's lock for the duration of a `with` block.

    Args:
      output_dir: The dataset folder (local path or URL); created if missing.
      command: What the holder is doing, shown to a writer that is refused
        (default: this process's command line).

    Raises:
      LockError: On entry, if another writer holds the lock (or a dead one left it).
    """

    def __init__(self, output_dir: str, command: str | None = None):
        self.output_dir = output_dir
        self.path = files.join(output_dir, LOCK_FILENAME)
        self._token = uuid.uuid4().hex
        self._held = False
        self._holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command if command is not None else " ".join(sys.argv),
            "token": self._token,
        }

    def acquire(self) -> None:
        data = (json.dumps(self._holder, sort_keys=True) + "\n").encode("utf-8")
        if files.is_local(self.output_dir):
            os.makedirs(self.output_dir, exist_ok=True)
            try:
                _create_whole(self.path, data)
            except FileExistsError:
                raise _refusal(self.output_dir, read_lock(self.output_dir)) from None
            _remove_dead_drafts(self.output_dir)
        else:
            holder = read_lock(self.output_dir)
            if holder is not None:
                raise _refusal(self.output_dir, holder)
            files.write_atomically(self.output_dir, LOCK_FILENAME, data)
            holder = read_lock(self.output_dir)
            if (holder or {}).get("token") != self._token:
                raise _refusal(self.output_dir, holder)
        self._held = True
        _log.debug("Locked %s", self.path)

    def release(self) -> None:
        """Removes the lock if this writer still holds it."""
        if not self._held:
            return
        self._held = False
        holder = read_lock(self.output_dir)
        if (holder or {}).get("token") == self._token:
            files.remove(self.path)
        else:
            _log.warning("The lock %s is no longer this process's; left as it is.", self.path)

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
