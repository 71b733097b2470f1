"""What a reader does with a damaged record (`on_corrupt`), and the count of those it skipped.

`on_corrupt="raise"` (the default) keeps the `max_bad_records` budget (0: the
first damaged record fails the read). `on_corrupt="skip"` reads every shard by
the offsets of its index file, so that a damaged record (bad length CRC, bad
data CRC, truncated: `schemas.tfrecord.check_frame`) is skipped alone and the
rest of its shard is read; the dataset counts them in `ds.corrupt_records`
(a `CorruptRecords`) and logs one warning per damaged shard.
"""

from __future__ import annotations

import collections
import threading

__all__ = ["ON_CORRUPT", "CorruptRecords", "check_on_corrupt", "budget"]

ON_CORRUPT = ("raise", "skip")
# The budget of on_corrupt="skip": no epoch holds this many records.
_UNLIMITED = 2**62


def check_on_corrupt(value) -> str:
    """`value` if it is one of ON_CORRUPT.

    Raises:
      ValueError: Naming the argument, what is allowed and what was received.
    """
    if value not in ON_CORRUPT:
        raise ValueError(f"`on_corrupt` must be one of {ON_CORRUPT}. Received: on_corrupt={value!r}")
    return value


def budget(on_corrupt: str, max_bad_records: int) -> int:
    """Damaged records skipped per epoch and pipeline before the read fails."""
    return _UNLIMITED if on_corrupt == "skip" else max_bad_records


def is_unlimited(records: int) -> bool:
    return records >= _UNLIMITED


class CorruptRecords:
    """The damaged records a dataset skipped so far, all epochs together (`ds.corrupt_records`).

    Compares and converts as an int (`ds.corrupt_records == 3`, `int(...)`);
    `by_shard` says which shard files held them.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._by_shard: collections.Counter = collections.Counter()

    def add(self, shard: str) -> bool:
        """Counts one damaged record of `shard`; True if it is the shard's first."""
        with self._lock:
            self._by_shard[shard] += 1
            return self._by_shard[shard] == 1

    @property
    def by_shard(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self._by_shard.items()))

    def __int__(self) -> int:
        with self._lock:
            return sum(self._by_shard.values())

    __index__ = __int__

    def __eq__(self, other) -> bool:
        return int(self) == other if isinstance(other, int) else NotImplemented

    def __hash__(self):
        return id(self)

    def __repr__(self) -> str:
        return f"CorruptRecords({int(self)} in {len(self.by_shard)} shard(s))"
