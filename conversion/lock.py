"""The output folder's lock: one conversion (or append) writes a dataset at a time.

`OutputLock(output_dir)` is a context manager. It creates `_shardsmith.lock`
in the folder holding the writer's host, process id, start time and command
line; a second writer finds it and is refused with `LockError`, which names
the holder. The lock is taken atomically for a local folder: the file is
created with `O_CREAT | O_EXCL`, so of two processes starting together exactly
one gets it. A lock left by a process that no longer runs on this host (a
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
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raise _refusal(self.output_dir, read_lock(self.output_dir)) from None
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
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
