"""What a reader does with a damaged record (`on_corrupt`), and the count of those it skipped.

`on_corrupt="raise"` (the default) keeps the `max_bad_records` budget (0: the
first damaged record fails the read, with an error that names the shard file,
the record's byte offset and what is wrong, and what to run:
`damaged_shard_message`). `on_corrupt="skip"` skips a damaged record (bad
length CRC, bad data CRC, truncated: `schemas.tfrecord.check_frame`) alone and
reads the rest of its shard; the dataset counts them in `ds.corrupt_records`
(a `CorruptRecords`) and logs one warning per damaged shard.

Both read an undamaged shard with TensorFlow's own sequential reader and
nothing more per record: only once that reader stops early on a shard (it
fails at the first damaged record) is the shard looked at again, by its
index file (`read_past_damage`, `damaged_shard_message`).
"""

from __future__ import annotations

import collections
import logging
import os
import threading

__all__ = ["ON_CORRUPT", "CorruptRecords", "check_on_corrupt", "budget", "damaged_shard_message",
           "shard_size_problem", "read_past_damage"]

logger = logging.getLogger(__name__)

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
    """'' if a shard file has the manifest's size (`num_bytes`); else why its read stops.

    Looked at when the shard is opened (one `stat`): a shard cut short is named
    by the record where it ends (`damaged_shard_message`); a longer one holds
    more than the manifest's `records`.
    """
    import tensorflow as tf

    try:
        size = tf.io.gfile.stat(path).length
    except tf.errors.OpError as e:
        return f"Shard {path} could not be looked at ({e.message})"
    if size == num_bytes:
        return ""
    if size < num_bytes:
        return damaged_shard_message(path, records)
    data_dir = os.path.dirname(path)
    return (f"Shard {path} holds {size} bytes, the manifest says {num_bytes}: it changed since the "
            f"conversion, and more records than its {records} may follow. Run `shardsmith verify "
            f"{data_dir}`, then `shardsmith convert --input_dir <the images> --output_dir {data_dir} "
            "--resume` to write the damaged shards again from their sources.")


def read_past_damage(split_files, shard: int, start: int, stop: int, skipped: CorruptRecords) -> list[bytes]:
    """The rest of a shard from its first damaged record, read by its index file (on_corrupt='skip').

    TensorFlow's sequential reader of the shard stopped at its first damaged
    record (past a bad length, it cannot find the next one); each later
    record is read alone at its offset instead, and a damaged one (bad CRC,
    cut short, past the file's end) is given as b"", which the reader drops.
    Runs only for a shard that TensorFlow's reader did not read through.

    Args:
      split_files: The split (`readers.metadata.SplitFiles`).
      shard: The shard's number in the split.
      start, stop: The records of the shard this read keeps (the ramped
        first epoch reads a shard in two parts): only damaged records in
        [start, stop) are counted in `skipped` and warned about.
      skipped: The dataset's `CorruptRecords`.

    Returns:
      One element per record, from the first damaged one to the shard's last.

    Raises:
      ValueError: If the shard reads whole here: TensorFlow's reader stopped
        for another reason (an error of the file system), not for damage.
    """
    from readers import record_index

    path = split_files.paths[shard]
    offsets, lengths = record_index.load_shard_index(split_files, shard)
    frames = list(record_index.read_frames(path, offsets, lengths))
    first = next((i for i, (data, _) in enumerate(frames) if data is None), None)
    if first is None:
        raise ValueError(f"Shard {path} stopped being read before its {len(frames)} records, yet reads whole "
                         "by its index file: the file system failed (see the error logged before), not the shard.")
    before = sum(split_files.num_records[:shard])
    for number in range(max(first, start), min(stop, len(frames))):
        data, why = frames[number]
        if data is None and skipped.add(path):
            what = record_index.describe_damaged(path, int(offsets[number]), int(lengths[number]),
                                                 split_files.schema)
            logger.warning(
                "Damaged record in shard %s at byte offset %d (%d bytes; %s): record %d of split %r. Skipped "
                "(on_corrupt='skip'; further damaged records of this shard are counted in ds.corrupt_records "
                "without a warning): run `shardsmith verify %s` for the whole list, and `shardsmith convert "
                "--resume` to mend it.", os.path.basename(path), int(offsets[number]), int(lengths[number]), what,
                before + number, split_files.split, os.path.dirname(path))
    return [b"" if data is None else data for data, _ in frames[first:]]


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
