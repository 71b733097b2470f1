"""The record stream of `shuffle="global"`: a true per-epoch permutation, read by offset.

Position `a` of the global order (counting from epoch 0, position 0) is
position `i = a % N` of epoch `e = a // N` (N records in the split), which holds
record `tf.random.experimental.index_shuffle(i, [perm_seed, e], N - 1)`:
stateless and elementwise, so any position can be computed alone, which is
what makes resuming and re-slicing exact. Records are read one by one at the
offsets of the converter's index files (`readers.record_index`).

With a global batch size G and P input pipelines, global batch b covers
positions start + [b*G, (b+1)*G); pipeline p takes its contiguous slice of
G/P positions of every global batch. Batching that stream at the per-replica
size hands the replicas of pipeline p (consecutive replica ids) consecutive
pieces, so concatenating the per-replica batches of a step in replica order
gives the global order, whatever P.

Damaged records (bad CRC, truncated) arrive as empty strings: each is logged
with its shard, offset and, if it parses, file name, then either fails the
read (`max_bad_records=0`) or is counted against the budget of its epoch and
skipped by the caller, leaving its batch one record short.
"""

from __future__ import annotations

import logging
import os

import tensorflow as tf

from compat import tf_internals
from readers import corrupt, record_index
from readers.metadata import SplitFiles
from readers.positions import ReadPosition
from schemas.manifest import is_url

__all__ = ["GlobalOrder", "check_damaged", "global_records"]

logger = logging.getLogger(__name__)

# A stream that does not end: more positions than any training run reads.
_ENDLESS = 2**62
# Positions located per vectorised call.
_LOCATE_BATCH = 256

_no_autograph = tf.autograph.experimental.do_not_convert


def _index_shuffle(index: tf.Tensor, seed: int, epoch: tf.Tensor, max_index: int) -> tf.Tensor:
    """`tf.random.experimental.index_shuffle(index[j], [seed, epoch[j]], max_index)`
    for every j, in one op call (int64 vectors)."""
    # The public function pads a [2] seed to its op's [3] seed with a private
    # constant, and mishandles a batch of seeds (it pads the batch axis): the
    # same padding is done here for a batch (compat/tf_internals.py).
    shape = tf.shape(index)
    seeds = tf.stack(
        [
            tf.fill(shape, tf.constant(tf_internals.index_shuffle_seed_pad(), tf.int64)),
            tf.fill(shape, tf.constant(seed, tf.int64)),
            epoch,
        ],
        axis=1,
    )
    return tf.raw_ops.RandomIndexShuffle(
        index=index, seed=seeds, max_index=tf.fill(shape, tf.constant(max_index, tf.int64)),
        rounds=4,
    )


class GlobalOrder:
    """The positions one input pipeline reads, as arithmetic on local counts.

    Args:
      records_per_epoch: N, the records of the split.
      start: Absolute start position (epoch * N + consumed).
      global_batch_size: G (1 for unbatched reading).
      pipeline_id: p.
      num_pipelines: P; G must divide by it.
    """

    def __init__(self, records_per_epoch, start, global_batch_size, pipeline_id, num_pipelines):
        if global_batch_size % num_pipelines:
            raise ValueError(
                "With shuffle='global', the global batch size must be divisible by the "
                f"number of input pipelines ({num_pipelines}), so that each takes an "
                "equal contiguous slice of every global batch. Received: "
                f"global_batch_size={global_batch_size}"
            )
        self.n = records_per_epoch
        self.start = start
        self.global_batch = global_batch_size
        self.slice = global_batch_size // num_pipelines
        self.pipeline_id = pipeline_id

    def local_count(self, *, repeat: bool, drop_remainder: bool) -> int | None:
        """Positions this pipeline reads: to the end of the start's epoch, or
        None (endless) with `repeat`. With `drop_remainder`, a partial last
        global batch is dropped by every pipeline."""
        if repeat:
            return None
        remaining = self.n - self.start % self.n
        full, rest = divmod(remaining, self.global_batch)
        count = full * self.slice
        if not drop_remainder:
            count += min(max(rest - self.pipeline_id * self.slice, 0), self.slice)
        return count

    def absolute(self, k: tf.Tensor) -> tf.Tensor:
        """Absolute positions of local indices `k` (int64)."""
        g, big_g = self.slice, self.global_batch
        return self.start + (k // g) * big_g + self.pipeline_id * g + k % g


def _report(schema, split: str, budget: int, skipped: corrupt.CorruptRecords | None = None):
    """A py_function body that logs a damaged record; returns the message."""

    def report(path, offset, length, epoch, record, count):
        path = os.fsdecode(path.numpy())
        offset, length = int(offset.numpy()), int(length.numpy())
        what = record_index.describe_damaged(path, offset, length, schema)
        message = (
            f"Damaged record in shard {os.path.basename(path)} at byte offset {offset} "
            f"({length} bytes; {what}): record {int(record.numpy())} of split {split!r}"
        )
        if int(epoch.numpy()) >= 0:
            message += f", epoch {int(epoch.numpy())}"
        count = int(count.numpy())
        first_of_shard = skipped.add(path) if skipped is not None and count <= budget else True
        if corrupt.is_unlimited(budget):
            # on_corrupt='skip': one warning per shard; every record is counted.
            (logger.warning if first_of_shard else logger.debug)(
                "%s. Skipped (on_corrupt='skip'; further damaged records of this shard are "
                "counted in ds.corrupt_records without a warning): run `shardsmith verify %s` "
                "for the whole list, and `shardsmith convert --resume` to mend it.",
                message, os.path.dirname(path),
            )
        elif count <= budget:
            logger.warning(
                "%s. Skipped (%d of max_bad_records=%d in this epoch).", message, count, budget
            )
        else:
            data_dir = os.path.dirname(path)
            message += (
                f". {count} damaged record(s) in this epoch, more than max_bad_records="
                f"{budget} allows: run `shardsmith verify {data_dir}` and convert the "
                "images again, or raise max_bad_records to skip damaged records."
            )
            logger.error("%s", message)
        return message

    return report


def check_damaged(ds: tf.data.Dataset, schema, split: str, max_bad_records: int,
                  output=None, skipped: corrupt.CorruptRecords | None = None) -> tf.data.Dataset:
    """Logs, counts and fails on the damaged records of a stream read by offset.

    Args:
      ds: Elements `((path, offset, length, epoch, record), serialized)`, the
        serialized record from `record_index.read_records_at` (b"" if
        damaged). `epoch` is -1 where the reader does not know it (the
        'shards' mode, whose stream is re-iterated per epoch).
      schema: The split's schema (to name the damaged record's file).
      split: The split's name, for the messages.
      max_bad_records: Damaged records skipped per epoch (a change of
        `epoch`, or a new iteration of `ds`) before the read fails; with 0 the
        first one fails it.
      output: `fn(location, serialized)` making the output elements (in the
        same map as the check); None keeps `serialized` alone.

    Returns:
      The elements `output` makes; a damaged record within the budget stays
      b"" (the caller drops it), and one over the budget fails the iteration
      with an `InvalidArgumentError` that describes it.
    """
    if output is None:
        output = lambda location, serialized: serialized  # noqa: E731
    report = _report(schema, split, max_bad_records, skipped)

    def log_damaged(path, offset, length, epoch, record, count_in_epoch):
        return tf.py_function(
            report, [path, offset, length, epoch, record, count_in_epoch], tf.string
        )

    if max_bad_records == 0:

        @_no_autograph
        def check(location, serialized):
            path, offset, length, epoch, record = location

            def fail():
                message = log_damaged(path, offset, length, epoch, record, tf.constant(1, tf.int64))
                with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
                    return tf.identity(serialized)

            serialized = tf.cond(tf.strings.length(serialized) > 0, lambda: serialized, fail)
            return output(location, serialized)

        return ds.map(check, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    budget = tf.constant(max_bad_records, tf.int64)

    @_no_autograph
    def count_damaged(state, element):
        location, serialized = element
        path, offset, length, epoch, record = location
        state_epoch, damaged = state
        damaged = tf.where(epoch == state_epoch, damaged, tf.zeros_like(damaged))
        valid = tf.strings.length(serialized) > 0
        damaged += tf.cast(tf.logical_not(valid), tf.int64)

        def bad():
            message = log_damaged(path, offset, length, epoch, record, damaged)
            with tf.control_dependencies([tf.debugging.Assert(damaged <= budget, [message])]):
                return tf.identity(serialized)

        serialized = tf.cond(valid, lambda: serialized, bad)
        return (epoch, damaged), (location, serialized)

    # Sequential, but only a few scalar ops per record.
    ds = ds.scan((tf.constant(-1, tf.int64), tf.constant(0, tf.int64)), count_damaged)
    return ds.map(_no_autograph(output), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def global_records(
    split_files: SplitFiles,
    *,
    perm_seed: int,
    aug_seed: int | None,
    start: ReadPosition,
    global_batch_size: int,
    pipeline_id: int,
    num_pipelines: int,
    repeat: bool,
    drop_remainder: bool,
    max_bad_records: int,
    skipped: corrupt.CorruptRecords | None = None,
) -> tuple[tf.data.Dataset, int | None, int]:
    """The serialized records one pipeline reads in global-shuffle mode.

    Args:
      split_files: The split.
      perm_seed: Seed of the per-epoch permutations.
      aug_seed: Seed of the per-record augmentation seeds, or None for none.
      start: The `ReadPosition` to start at.
      global_batch_size: G, or 1 for unbatched reading.
      pipeline_id: This pipeline.
      num_pipelines: P.
      repeat: Read epoch after epoch; else to the end of the start's epoch.
      drop_remainder: Drop a partial last global batch (without `repeat`).
      max_bad_records: Damaged records skipped per epoch before failing; with
        0 the first one fails the read.

    Returns:
      (dataset, local record count or None if endless, records per epoch).
      Elements are the serialized record, or `(serialized, seed)` with a [2]
      int64 stateless seed derived from (aug_seed, epoch, record index) when
      `aug_seed` is set. With `max_bad_records` > 0 a skipped record is an
      empty string, which the caller drops.
    """
    index = record_index.load_record_index(split_files)
    n = index.num_records
    start = start.normalized(n)
    order = GlobalOrder(n, start.epoch * n + start.consumed, global_batch_size, pipeline_id,
                        num_pipelines)
    count = order.local_count(repeat=repeat, drop_remainder=drop_remainder)

    located = _locations(index, order, perm_seed, count)
    # Read in order, one element per position; the location stream is computed
    # again beside it rather than carried through the reads (cheaper).
    data = record_index.read_records_at(
        located.map(lambda p, o, n_, e, r: (p, o, n_)),
        remote=any(is_url(p) for p in index.paths),
    )
    ds = tf.data.Dataset.zip(located, data)
    output = _output(aug_seed)
    ds = check_damaged(ds, split_files.schema, split_files.split, max_bad_records, output, skipped)
    logger.info(
        "Global shuffle of %d records: pipeline %d of %d starts at epoch %d position %d; %s.",
        n, pipeline_id, num_pipelines, start.epoch, start.consumed,
        "endless" if count is None else f"{count} positions",
    )
    return ds, count, n


def _locations(index, order: GlobalOrder, perm_seed: int, count: int | None) -> tf.data.Dataset:
    """(path, offset, length, epoch, record) of each position this pipeline reads, in order."""
    n = index.num_records
    paths = tf.constant(index.paths, tf.string)
    shard_of = tf.constant(index.shard, tf.int32)
    offsets = tf.constant(index.offset, tf.int64)
    lengths = tf.constant(index.length, tf.int64)

    @_no_autograph
    def locate(k):
        absolute = order.absolute(k)
        epoch = absolute // n
        record = _index_shuffle(absolute % n, perm_seed, epoch, n - 1)
        shard = tf.gather(shard_of, record)
        return (
            tf.gather(paths, shard), tf.gather(offsets, record), tf.gather(lengths, record),
            epoch, record,
        )

    # Vectorised: a per-element map would cost more than the locating.
    return (
        tf.data.Dataset.range(_ENDLESS if count is None else count)
        .batch(_LOCATE_BATCH)
        .map(locate, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .unbatch()
    )


def _output(aug_seed: int | None):
    """The element of a located record: the serialized record, with its stateless seed when `aug_seed` is set."""
    base = None if aug_seed is None else tf.constant([aug_seed, 0], tf.int64)

    def output(location, serialized):
        if base is None:
            return serialized
        _, _, _, epoch, record = location
        # The same record gets the same seed in an epoch, whatever reads it.
        seed = tf.random.experimental.stateless_fold_in(base, epoch)
        return serialized, tf.random.experimental.stateless_fold_in(seed, record)

    return output
