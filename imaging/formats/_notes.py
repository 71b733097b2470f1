"""What a library logs while it reads one file, kept to report with that file.

tifffile logs what it finds wrong with a file it still reads ("<tifffile.TiffTag
270 @70> invalid value offset 3912") on its logger, where nobody can tell
which file it meant once several are read on several threads. `library_notes`
collects, for the time one file is read, the records its logger gets from the
reading thread; they still go on to the logger's handlers as before (the
entry points decide what the console shows: `conversion.console`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

__all__ = ["library_notes"]

# Guards our changes to a logger's filter list, made copy-on-write: a thread
# logging meanwhile goes through the list it started with, so no filter is
# skipped while another thread's is added or removed.
_LOCK = threading.Lock()


class _Collect(logging.Filter):
    """Collects the messages of records logged by one thread; filters nothing out."""

    def __init__(self, thread: int):
        super().__init__()
        self._thread = thread
        self.notes: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread == self._thread and record.levelno >= logging.WARNING:
            note = f"{record.name}: {record.getMessage()}"
            if note not in self.notes:  # Pages of one file repeat the same complaint.
                self.notes.append(note)
        return True


@contextlib.contextmanager
def library_notes(logger_name: str) -> Iterator[list[str]]:
    """The warnings `logger_name` logs from this thread while the block runs, as 'name: message'.

    The list fills as the block runs; it is complete when the block ends.
    """
    logger = logging.getLogger(logger_name)
    collect = _Collect(threading.get_ident())
    with _LOCK:
        logger.filters = [*logger.filters, collect]
    try:
        yield collect.notes
    finally:
        with _LOCK:
            logger.filters = [f for f in logger.filters if f is not collect]
