"""A progress bar for conversions on the local runner.

Workers share no memory with the driver, but every finished shard leaves a
receipt on disk (`conversion.receipts`); the bar counts them. It draws only on a
terminal, never in CI logs or pipes; on distributed runners Beam's counters
carry the progress.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from conversion.files import TMP_DIRNAME, join, match, read_bytes

__all__ = ["ProgressBar"]

_WIDTH = 28


class ProgressBar:
    """Draws `[#####.....] 1,234/9,873 images  412/s  ETA 0:21` while a run lasts.

    Args:
      output_dir: The conversion's output folder.
      total: Images the run will handle (written + rejected).
      receipts_dirname: Folder of the receipts inside the temporary folder.
      stream: Where to draw (default stderr).
      interval: Seconds between redraws.
    """

    def __init__(self, output_dir: str, total: int, receipts_dirname: str, stream=None, interval=0.5):
        self._dir = join(output_dir, TMP_DIRNAME, receipts_dirname)
        self._total = max(total, 1)
        self._stream = stream or sys.stderr
        self._interval = interval
        self._seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = None
        self._start = time.monotonic()
        self._baseline = None

    @staticmethod
    def wanted(stream=None) -> bool:
        stream = stream or sys.stderr
        return stream.isatty() and not os.environ.get("CI")

    def done(self) -> int:
        """Images in the shards finished so far (records and rejects)."""
        for path in match(join(self._dir, "*.json")):
            if path not in self._seen:
                receipt = json.loads(read_bytes(path))
                self._seen[path] = receipt["result"]["num_records"] + len(receipt["rejects"])
        return sum(self._seen.values())

    def line(self) -> str:
        done = self.done()
        if self._baseline is None:
            self._baseline = done  # Shards kept by --resume do not count towards the rate.
        elapsed = time.monotonic() - self._start
        rate = (done - self._baseline) / elapsed if elapsed > 0 else 0.0
        filled = int(_WIDTH * min(done / self._total, 1.0))
        eta = ""
        if rate > 0 and done < self._total:
            seconds = int((self._total - done) / rate)
            eta = f"  ETA {seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        return f"[{'#' * filled}{'.' * (_WIDTH - filled)}] {done:,}/{self._total:,} images  {rate:,.0f}/s{eta}"

    def _loop(self):
        while not self._stop.wait(self._interval):
            self._stream.write("\r" + self.line() + "\033[K")
            self._stream.flush()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="shardsmith-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._stream.write("\r\033[K")
        self._stream.flush()
