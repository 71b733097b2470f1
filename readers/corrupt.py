"""What a reader does with a damaged record (`on_corrupt`), and the count of those it skipped.

`on_corrupt="raise"` (the default) keeps the `max_bad_records` budget (0: the
first damaged record fails the read, with an error that names the shard file,
the record's byte offset and what is wrong, and what to run:
`damaged_shard_message`). `on_corrupt="skip"` reads every shard by
the offsets of its index file, so that a damaged record (bad length CRC, bad
data CRC, truncated: `schemas.tfrecord.check_frame`) is skipped alone and the
rest of its shard is read; the dataset counts them in `ds.corrupt_records`
(a `CorruptRecords`) and logs one warning per damaged shard.
"""

from __future__ import annotations

import collections
import threading

__all__ = ["ON_CORRUPT", "CorruptRecords", "check_on_corrupt", "budget", "damaged_shard_message",
           "shard_size_problem"]

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


# What `schemas.tfrecord.iter_records` finds, in the words of the reader's messages.
_FOUND = {
    "length checksum mismatch": "bad length CRC",
    "data checksum mismatch in the record": "bad data CRC",
    "truncated record": "truncated: the shard ends inside this record",
    "truncated record header": "truncated: the shard ends inside this record's header",
}


def damaged_shard_message(path: str, records: int) -> str:
    """Why a shard's records stopped before its `records`: its first damaged record, and what to run.

    Reads the shard from its start, checking every frame (only once a read has
    failed on it: the read path itself checks nothing more than TensorFlow's
    reader does).
    """
    import os

    import tensorflow as tf

    from schemas.tfrecord import RecordError, iter_records

    data_dir, name = os.path.split(path)
    found = None
    number = 0
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            for number, _ in enumerate(iter_records(f, name), start=1):
                pass
    except RecordError as e:
        found = (f"Damaged record in shard {path} at byte offset {e.offset} "
                 f"({_FOUND.get(e.reason, e.reason)}): record #{number} of its {records} (counted from 0)")
    except (OSError, tf.errors.OpError) as e:
        found = f"Shard {path} could not be read ({getattr(e, 'message', None) or e})"
    if found is None:  # Whole now, or fewer records than the manifest says.
        found = f"Shard {path} holds {number} readable records, the manifest says {records}"
    # No quotes: TensorFlow's Assert escapes them in the error it raises.
    return (f"{found}. The read stops here (on_corrupt is raise, the default). Run `shardsmith verify {data_dir}` to list "
            f"every damaged record and the source files they held, then `shardsmith convert --input_dir "
            f"<the images> --output_dir {data_dir} --resume` to write the damaged shards again from their "
            "sources; or read with on_corrupt set to skip, which skips damaged records and goes on.")


def shard_size_problem(path: str, records: int, num_bytes: int) -> str:
    """'' if a shard whose `records` were read has the manifest's size; else why the read stops."""
    import os

    import tensorflow as tf

    try:
        size = tf.io.gfile.stat(path).length
    except tf.errors.OpError as e:
        return f"Shard {path} could not be looked at ({e.message})"
    if size == num_bytes:
        return ""
    data_dir = os.path.dirname(path)
    return (f"Shard {path} holds {size} bytes, the manifest says {num_bytes}: it changed since the "
            f"conversion, its {records} records were read and more may follow. Run `shardsmith verify "
            f"{data_dir}`, then `shardsmith convert --input_dir <the images> --output_dir {data_dir} "
            "--resume` to write the damaged shards again from their sources.")


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
