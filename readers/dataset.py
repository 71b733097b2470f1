"""`image_dataset_from_tfrecords`: a converted dataset as a batched `tf.data.Dataset`.

The options come in three frozen, self-validating groups (`readers.options`: `ReadOptions`,
`ImageOptions`, `ShuffleOptions`), composed and cross-checked by
`ReaderConfig`. `build_dataset` runs named stages, all AUTOTUNEd:

  records (`_shards_records`, for `shuffle=True`, also spelled 'shards', or
     False): shard files from the manifest (shuffled per epoch with the
     seed) -> parallel interleave of the shards, each read in order record
     by record at the offsets of its index file (`record_index.read_records_at`,
     so a damaged record can be skipped alone; `TFRecordDataset`s for
     datasets whose manifest lists no index files) -> record shuffle buffer
     (bounded, holds encoded records only). A shuffled pass starts with the
     first records of every shard, shuffled among themselves, so that its
     first batch does not wait for the buffer to fill (`_ramped_epoch`);
     with `repeat`, every epoch starts so. Local shard files are read in
     the interleave's own thread (sequential), URLs in parallel.
     Or (`_global_records`, `shuffle="global"`): a true permutation of every
     record of the split per epoch, read record by record at the offsets of
     the converter's index files (`readers.global_shuffle`); the read can
     then be resumed exactly from a `readers.ReadPosition`.
  -> parse: vectorised, small record batches
  -> decode and preprocess, per example: decode + resize policy or standard
     augmentation; then an optional user augmentation function
  -> batch and finish: batch -> per batch: scale/normalise, cast, labels
  (photos without a callable `augment`: parse, decode, preprocess and finish
  per record in one map function, then a plain batch: `_PHOTOS_PER_IMAGE`).
  -> `_finish_dataset`: cardinality, prefetch, options.

For small images (mean record size up to 32 KiB) with batching and without a
callable `augment`, parse, decode, preprocess and finish run as one function
per output batch instead (`_BY_BATCH`; same results, same order), which
saves the per-element overhead that dominates when decoding is cheap; a split
of JPEGs of one size (the manifest's image stats) traces that path alone. The
target label modes (`readers.targets`) do the same with labels of one shape
(`_TARGETS_BY_BATCH`: every image and its target in a loop in that call);
ragged boxes go per image.

Nothing is cached unless `cache` is set. Without `seed`, the pipeline runs
non-deterministically (faster: workers need not wait for each other); with a
`seed` it is deterministic by default and gives the same batches on every
run, augmentation included.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from compat import tf_internals
from readers import corrupt, decode, global_shuffle, preprocess, record_index, stored, targets
from readers import service as _service
from readers.metadata import SplitFiles, load_split
from readers.options import (
    AUGMENTATIONS,
    LABEL_MODES,
    NORMALIZE_DATASET,
    OPTION_NAMES,
    SHUFFLE_MODES,
    ImageOptions,
    ReaderConfig,
    ReadOptions,
    ServiceReadOptions,
    ShuffleOptions,
    reader_signature,
)
from readers.positions import ReadPosition
from schemas.features import HEIGHT, IMAGE, LABEL, WIDTH, ImageRecord, raw_format
from schemas.manifest import is_url

__all__ = [
    "LABEL_MODES", "AUGMENTATIONS", "SHUFFLE_MODES", "OPTION_NAMES", "ImageOptions",
    "ShuffleOptions", "ReadOptions", "ServiceReadOptions", "ReaderConfig",
    "image_dataset_from_tfrecords",
    "without_extras",
]

logger = logging.getLogger(__name__)


# Records parsed per vectorised `tf.io.parse_example` call.
_PARSE_BATCH = 64
# Most shard files read at once by the interleave ...
_MAX_CYCLE_LENGTH = 16
# ... and records taken from one before the next (bench.read_stages: 1 and 8
# cost the same per record; 1 mixes the shards best).
_BLOCK_LENGTH = 1
# Default record shuffle buffer: at most this many records ...
_DEFAULT_SHUFFLE_RECORDS = 1024
# ... and at most about this many bytes of encoded records.
_SHUFFLE_RAM_BUDGET = 256 * 1024 * 1024
# The first records of a pass (at least this many, and two batches) come from
# the heads of the shards, fully shuffled among themselves, so that the first
# batch does not wait for the record shuffle buffer to fill (`_ramped_epoch`).
_RAMP_RECORDS = 128
# ... and this many more: a batched parse stage reads about two of its batches
# ahead of the decoding (photos, parsed per record, read ahead only as far as
# the decode map's parallelism), and a read past the heads starts filling the
# buffer of the rest (1024 photos: some 150 MB read, checksummed and copied,
# 0.2-0.3 s of CPU) while the first batch is still being decoded.
_RAMP_PARSE_AHEAD = 2 * _PARSE_BATCH
# The heads' shuffle buffer: one batch, and at least this many records (`_ramped_epoch`).
_RAMP_WINDOW = 64
_SEED_MODULUS = 2**31 - 1
# Local shard files are interleaved sequentially (see `_shards_records`); off
# for the benchmark's ablation only.
_SEQUENTIAL_LOCAL_READS = True
# Threads reading the shard heads of a ramped epoch from local files (`_ramped_epoch`): the
# heads' shuffle reads and checksums its buffer (until 2026-12-07: all of them) before its
# first record, which the first decode waits for (photos: 256 records, ~48 ms of one thread's CPU, 18 ms on the busiest of
# two; bench/RESULTS.md, ttfb11). A deterministic parallel interleave: the same order. None:
# in one thread, as the rest.
_HEAD_READERS = 2
# A shard read to its end (`_past_damage`'s stop).
_ALL = np.iinfo(np.int64).max

# The reader's own map functions are plain TensorFlow ops (their Python `if`s
# test Python values only), so AutoGraph's source transformation is skipped:
# it cost a second or more of every dataset's construction. A user's
# `augment` callable is still converted.
_no_autograph = tf.autograph.experimental.do_not_convert
# Records of at most this mean size are decoded a batch per function call
# (see `build_dataset`); larger ones one per call, in parallel.
_BATCHED_DECODE_MAX_RECORD_BYTES = 32 * 1024


def _derive_seed(seed: int | None, *salt: int) -> int | None:
    """A seed for one random stage, independent of the other stages' seeds."""
    if seed is None:
        return None
    digest = hashlib.sha256(repr((seed, *salt)).encode()).digest()
    return int.from_bytes(digest[:8], "little") % _SEED_MODULUS


def _random_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") % _SEED_MODULUS


def _shuffle_buffer(shuffling: ShuffleOptions, num_records: int, num_bytes: int) -> int:
    if shuffling.shuffle_buffer is not None:
        return shuffling.shuffle_buffer
    mean_bytes = max(1, num_bytes // max(1, num_records))
    by_ram = max(1, _SHUFFLE_RAM_BUDGET // mean_bytes)
    return max(1, min(num_records, _DEFAULT_SHUFFLE_RECORDS, by_ram))


def _ramp_head(buffer: int, num_shards: int, batch_size: int | None) -> int:
    """Records taken from the head of each shard to start a pass; 0 for none.

    Worth it only when the heads hold fewer records than the shuffle buffer.
    """
    wanted = max(_RAMP_RECORDS, 2 * (batch_size or 1)) + _RAMP_PARSE_AHEAD
    head = -(-wanted // max(1, num_shards))
    return head if head * num_shards < buffer else 0


def _ramp_window(head: int, num_shards: int, batch_size: int | None) -> int:
    """The heads' shuffle buffer: one batch and at least `_RAMP_WINDOW` records, at most the heads."""
    return min(head * num_shards, max(_RAMP_WINDOW, batch_size or 1))


def _ramped_epoch(parts_of, head: int, buffer: int, *, num_shards: int, window: int,
                  seed: int | None, pipeline_id: int, num_records: int) -> tf.data.Dataset:
    """One epoch whose first batch need not wait for the record shuffle buffer.

    tf.data's `shuffle` fills its whole buffer (up to 1024 records, some
    150 MB of photos) before its first element. The epoch is instead the
    first `head` records of every shard (their interleave, shuffled in a
    buffer of `window` records), then the rest of every shard through the
    usual buffer of `buffer` records, which fills once the first batch is
    decoded (see `_RAMP_PARSE_AHEAD`).

    The heads' buffer is one batch (`_ramp_window`), not all the heads: a
    shuffle reads its whole buffer before its first element, so the first
    batch waits for `window + batch - 1` records rather than for every head
    (the bench's photos: ~127 records of ~150 KB read and checksummed, not
    256; until 2026-12-07 the buffer held every head, a uniform permutation
    of them: another seeded order). The first batch is drawn from about the
    first `2 x window / num_shards` records of each shard, every shard in
    it (block length 1), and the heads as a whole still come before the rest.

    Why the mix stays as good: the converter writes each shard's records in
    a seeded hash order (independent of class and file name), so a shard's
    head is a random sample of the split, as any other stretch of it is. The
    usual pipeline draws its first outputs from the first `buffer` records of
    the interleave, which are shard heads too; here the first
    `head x shards` records (two batches or `_RAMP_RECORDS`, plus the
    parse stage's read-ahead `_RAMP_PARSE_AHEAD`: about a quarter
    of a full buffer) come from a narrower head. Every record still comes
    exactly once per epoch; the file order is reshuffled per epoch as
    before, and with a seed the order is the same on every run. A repeated
    read repeats this epoch (`repeat()`): every epoch starts with its shard
    heads, reshuffled, which spares a third interleave (until 2026-12-06 the
    later epochs went through one buffer of `buffer` records alone: another
    seeded order).

    Args:
      parts_of: `fn([(start, stop), ...]) -> [records, ...]`: for each range,
        the interleave of the (shuffled) shard files, each read from record
        `start` to `stop` (None: to its end).
      head: Records of each shard in the first part.
      buffer: The shuffle buffer of the rest.
      num_shards: Shard files of this pipeline.
      window: The shuffle buffer of the heads (`_ramp_window`).
      seed: The reader's seed, or None.
      pipeline_id: This input pipeline (for its own seeds).
      num_records: Records of this pipeline per epoch.
    """
    heads, rest = parts_of([(0, head), (head, None)])
    heads = heads.shuffle(window, seed=_derive_seed(seed, 5, pipeline_id),
                          reshuffle_each_iteration=True)
    rest = rest.shuffle(buffer, seed=_derive_seed(seed, 6, pipeline_id),
                        reshuffle_each_iteration=True)
    return heads.concatenate(rest).apply(tf.data.experimental.assert_cardinality(num_records))


def _placeholder_record(schema, raster: stored.RasterPlan | None = None,
                        target: targets.TargetPlan | None = None) -> bytes:
    """A valid record of `schema` with a 1x1 image: stands in for a skipped
    damaged record until its batch drops it (keeps per-example stages simple).
    For a split of rasters, a raw one of the split's bands; with a target
    mode, a target that decodes (a 1x1 mask, `target_length` numbers)."""
    if raster is None:
        image, fmt, channels = tf.io.encode_png(tf.zeros([1, 1, 1], tf.uint8)).numpy(), "png", 1
    else:
        dtype = raster.raw_dtypes[0]
        image = np.zeros([1, 1, raster.bands], np.dtype(dtype).newbyteorder("<")).tobytes()
        fmt, channels = raw_format(dtype), raster.bands
    return schema.encode(
        ImageRecord(
            image=image, label=0, filename="", format=fmt, height=1, width=1,
            channels=channels,
            extra={spec.key: spec.empty_value for spec in schema.extra}
            | (target.placeholder_values() if target else {}),
        )
    )


def _has_index_files(split_files: SplitFiles) -> bool:
    return len(split_files.index_files) == len(split_files.paths) and all(
        split_files.index_files
    )


# --- Stage 1: records -----------------------------------------------------------
# Two implementations, one per shuffle mode; each returns (records, records of
# this pipeline per epoch, mean bytes per record). Elements are serialized
# records (b"" for a skipped damaged one), or (serialized, [2] seed) with
# standard augmentation.


def _records(
    split_files: SplitFiles, config: ReaderConfig, *, pipeline_id: int, num_pipelines: int,
    skipped: corrupt.CorruptRecords | None = None,
) -> tuple[tf.data.Dataset, int, float]:
    if config.shuffling.mode == "global":
        return _global_records(
            split_files, config, pipeline_id=pipeline_id, num_pipelines=num_pipelines,
            skipped=skipped,
        )
    records, num_records, num_bytes = _shards_records(
        split_files, config.shuffling, config.reading,
        pipeline_id=pipeline_id, num_pipelines=num_pipelines,
        standard=config.image.standard_augment, served=config.remote.service is not None,
        skipped=skipped,
    )
    return records, num_records, num_bytes / max(1, num_records)


def _global_records(
    split_files: SplitFiles, config: ReaderConfig, *, pipeline_id: int, num_pipelines: int,
    skipped: corrupt.CorruptRecords | None = None,
) -> tuple[tf.data.Dataset, int, float]:
    """shuffle='global': a permutation of every record per epoch, see `readers.global_shuffle`."""
    seed, reading = config.shuffling.seed, config.reading
    if seed is None:
        raise ValueError(
            "shuffle='global' needs a `seed` here, the same for every input "
            "pipeline. Received: seed=None"
        )
    records, num_records, _ = global_shuffle.global_records(
        split_files,
        perm_seed=_derive_seed(seed, 3),
        aug_seed=_derive_seed(seed, 4) if config.image.standard_augment else None,
        start=config.shuffling.start or ReadPosition(),
        global_batch_size=reading.batch_size or 1,
        pipeline_id=pipeline_id,
        num_pipelines=num_pipelines,
        repeat=reading.repeat,
        drop_remainder=reading.drop_remainder,
        max_bad_records=reading.bad_record_budget,
        skipped=skipped,
    )
    return records, num_records, split_files.total_bytes / split_files.total_records


def _shard_reader(split_files: SplitFiles) -> Callable[[tf.Tensor], tf.data.Dataset]:
    """`fn(shard) -> dataset` of the shard's records in file order, each as
    `((path, offset, length, -1, record), serialized)`, read by offset with
    `record_index.read_records_at` (b"" for a damaged record); `record` is the
    record's number in the split (as `shuffle='global'` numbers them)."""
    index = record_index.load_record_index(split_files)
    counts = np.asarray(split_files.num_records, np.int64)
    first = tf.constant(np.concatenate([[0], np.cumsum(counts)]), tf.int64)
    paths = tf.constant(index.paths, tf.string)
    offsets = tf.constant(index.offset, tf.int64)
    lengths = tf.constant(index.length, tf.int64)
    remote = any(is_url(p) for p in index.paths)

    @_no_autograph
    def locate(shard):
        records = tf.range(first[shard], first[shard + 1])
        n = tf.shape(records, out_type=tf.int64)[0]
        return (
            tf.fill([n], paths[shard]), tf.gather(offsets, records),
            tf.gather(lengths, records), tf.fill([n], tf.constant(-1, tf.int64)), records,
        )

    def read_shard(shard):
        # The locations go beside the reads rather than through them, as in
        # `global_shuffle`: a shard's order is fixed.
        location = locate(shard)
        data = record_index.read_records_at(
            tf.data.Dataset.from_tensor_slices(location[:3]), remote=remote
        )
        return tf.data.Dataset.zip(tf.data.Dataset.from_tensor_slices(location), data)

    return read_shard


def _shards_records(
    split_files: SplitFiles,
    shuffling: ShuffleOptions,
    reading: ReadOptions,
    *,
    pipeline_id: int,
    num_pipelines: int,
    standard: bool,
    served: bool = False,
    skipped: corrupt.CorruptRecords | None = None,
) -> tuple[tf.data.Dataset, int, int]:
    """The record stream of the 'shards' and unshuffled modes.

    `served`: run by tf.data service workers, whose sharding (TensorFlow's
    auto-shard rewrite, 'static') or split provider ('dynamic') needs the
    shard files as the source of the pipeline: no count asserted (a worker
    reads its share), no second read of the files (`_ramped_epoch`), and
    augmentation seeds drawn per file, beside it (`_seeded_files`), not by a
    second source below the reads.

    Returns:
      (records, records of this pipeline per epoch, their bytes).
    """
    paths, counts, sizes = split_files.paths, split_files.num_records, split_files.num_bytes
    record_sharding = num_pipelines > 1 and len(paths) < num_pipelines
    if num_pipelines > 1 and not record_sharding:
        paths = paths[pipeline_id::num_pipelines]
        counts = counts[pipeline_id::num_pipelines]
        sizes = sizes[pipeline_id::num_pipelines]
    num_records = sum(counts)
    num_bytes = sum(sizes)
    if record_sharding:
        num_records = len(range(pipeline_id, num_records, num_pipelines))
        num_bytes = num_bytes // num_pipelines
    seed = shuffling.seed
    shuffle = shuffling.mode == "shards"

    read_shard = None
    budget = reading.bad_record_budget
    # on_corrupt='skip' past a shard's damage (`_past_damage`), where each pipeline reads whole shards
    # (with record sharding, a pipeline counts only the damaged records it would have read) and in this
    # process (tf.data service workers count in theirs).
    skip_past = corrupt.is_unlimited(budget) and not (record_sharding or served)
    if budget and not _has_index_files(split_files):
        raise ValueError(
            f"`max_bad_records` needs the index files (as on_corrupt='skip' does) of the shards, which the manifest of "
            f"{split_files.data_dir!r} does not list (converted by an older shardsmith): "
            "convert the images again, or read with max_bad_records=0. Received: "
            f"max_bad_records={reading.max_bad_records}"
        )
    if budget and not skip_past:
        # A budget counted per epoch: every record read alone by offset (as
        # shuffle='global' reads), so that a damaged one is checked and
        # skipped alone; reading by offset keeps throughput but doubles the
        # time to the first batch.
        read_shard = _shard_reader(split_files)
    indexed = read_shard is not None
    guard = None
    if indexed:
        shard_ids = list(range(len(split_files.paths)))
        if num_pipelines > 1 and not record_sharding:
            shard_ids = shard_ids[pipeline_id::num_pipelines]
        files = tf.data.Dataset.from_tensor_slices(tf.constant(shard_ids, tf.int64))
    elif served:
        # TensorFlow's reader, which fails on a damaged record (DataLossError).
        files = tf.data.Dataset.from_tensor_slices(list(paths))
        # TensorFlow's reader of one file, without the flat_map that
        # `tf.data.TFRecordDataset` adds: one function fewer to trace per
        # interleave, which the first batch waits for (compat/tf_internals.py);
        # not converted by AutoGraph (0.5 s of CPU in building the dataset).
        read_shard = _no_autograph(tf_internals.tfrecord_file_dataset)
    else:
        # A damaged record fails the read with an error that names it, or is skipped alone
        # (`_past_damage`). Each file goes with its number in the split and its record count,
        # which the guard would otherwise look up in its function for each shard opened.
        guard = _past_damage(_no_autograph(tf_internals.tfrecord_file_dataset), split_files,
                             skipped if skip_past else None)
        number = {os.fspath(p): n for n, p in enumerate(split_files.paths)}
        files = tf.data.Dataset.from_tensor_slices((
            tf.constant([os.fspath(p) for p in paths]),
            tf.constant([number[os.fspath(p)] for p in paths], tf.int64),
            tf.constant(list(counts), tf.int64),
        ))
    if standard and served:
        files, read_shard = _seeded_files(files, read_shard, _derive_seed(seed, 2, pipeline_id))
    # Record-level sharding needs every pipeline to see the records in the same
    # order, which a per-process random file order would break.
    if shuffle and len(paths) > 1 and not (record_sharding and seed is None):
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    # Local shards are read in the thread that pulls the records: 0.03-0.06 ms of
    # CPU less per record than tf.data's parallel interleave, and none of its
    # per-shard buffers (photos: peak memory 1,226 -> 928 MiB; bench/RESULTS.md,
    # readspeed6), in the same order as a deterministic parallel one. On an object
    # store each read is a request, which the parallel interleave overlaps; the
    # tf.data service's dynamic sharding (split provider) needs the parallel one:
    # with a sequential interleave both workers read every file.
    local = not any(is_url(p) for p in paths)
    parallelism = (None if local and not served and _SEQUENTIAL_LOCAL_READS
                   else tf.data.AUTOTUNE)
    cycle_length = min(len(paths), _MAX_CYCLE_LENGTH)
    # No more threads than shards read at once (tf.data's rule), none for one shard.
    head_readers = min(_HEAD_READERS, cycle_length) if _HEAD_READERS and cycle_length > 1 else None

    def sharded(records):
        if record_sharding:
            records = records.shard(num_pipelines, pipeline_id)
        if indexed:
            # After the sharding: a damaged record is reported by its pipeline only.
            records = global_shuffle.check_damaged(
                records, split_files.schema, split_files.split, reading.bad_record_budget,
                skipped=skipped,
            )
        return records

    def interleaved(inputs, per_shard):
        if parallelism is None:
            # One function for every range read (the ramp's heads and rest): traced once as
            # the dataset is built, instantiated once as its iterator starts
            # (`tf_internals.interleave_each`).
            # The first of several ranges is the ramp's heads, which its shuffle reads whole before
            # its first record: read by `_HEAD_READERS` threads (the same order).
            return tf_internals.interleave_each(
                inputs, per_shard, cycle_length=cycle_length, block_length=_BLOCK_LENGTH,
                parallel_first=head_readers if len(inputs) > 1 else None)
        return [d.interleave(per_shard, cycle_length=cycle_length, block_length=_BLOCK_LENGTH,
                             num_parallel_calls=parallelism,
                             deterministic=True if record_sharding else None) for d in inputs]

    def parts_of(bounds):
        """The interleaved records [start, stop) of every shard, for each (start, stop) of `bounds`."""
        if guard is None:
            # No range read here: a whole read of each shard (see the ramp's conditions).
            (_, stop), = bounds
            assert stop is None
            return [sharded(r) for r in interleaved([files], read_shard)]
        # Each range's start and stop go beside each file, so that the ranges share one function.
        inputs = [tf.data.Dataset.zip(
            files, tf.data.Dataset.from_tensors(tf.constant(start, tf.int64)).repeat(),
            tf.data.Dataset.from_tensors(tf.constant(_ALL if stop is None else stop, tf.int64)).repeat(),
        ) for start, stop in bounds]
        return [sharded(r) for r in interleaved(inputs, _no_autograph(
            lambda file, start, stop: guard(*file, start, stop)))]

    def epoch(records):
        if not served:
            # Fails the iteration if the files hold other counts than the manifest.
            records = records.apply(tf.data.experimental.assert_cardinality(num_records))
        if reading.cache:
            records = records.cache("" if reading.cache is True else os.fspath(reading.cache))
        return records

    buffer = _shuffle_buffer(shuffling, num_records, num_bytes) if shuffle else 0
    head = _ramp_head(buffer, len(paths), reading.batch_size)
    ramped = None
    if head and not (record_sharding or indexed or reading.cache or served):
        ramped = _ramped_epoch(
            parts_of, head, buffer, num_shards=len(paths),
            window=_ramp_window(head, len(paths), reading.batch_size), seed=seed,
            pipeline_id=pipeline_id, num_records=num_records,
        )
    if ramped is not None:
        # Every epoch of a repeated read is ramped: one pair of interleaves
        # for all of them (a third, for the later epochs, cost the first batch
        # ~0.03 s of CPU to build and instantiate).
        records = ramped.repeat() if reading.repeat else ramped
    else:
        records = epoch(parts_of([(0, None)])[0])
        if shuffle:
            records = records.shuffle(
                buffer, seed=_derive_seed(seed, 1, pipeline_id), reshuffle_each_iteration=True
            )
        if reading.repeat:
            # Each repetition re-runs the file and record shuffles: every epoch
            # holds every record exactly once, in a new order.
            records = records.repeat()
    if standard and not served:
        # One seed per record, drawn in record order.
        seeds = tf.data.Dataset.random(
            seed=_derive_seed(seed, 2, pipeline_id), rerandomize_each_iteration=True
        ).batch(2)
        records = tf.data.Dataset.zip(records, seeds)
    return records, num_records, num_bytes


def _past_damage(read_shard, split_files: SplitFiles, skipped: corrupt.CorruptRecords | None):
    """`read(path, shard, count, start, stop)`: records [start, stop) of shard number `shard`
    (`count` records, at `path`), read by `read_shard`, past its damage.

    TensorFlow's reader fails a damaged record with `DataLossError: corrupted
    record at N`, naming no file, and reads no further in that file. Here a
    shard's reading by TensorFlow's reader ends at that error
    (`ignore_errors`), and a last part is read only if fewer records came
    than the shard holds (`take` ends an intact shard before it: nothing is
    added per record, and nothing runs in Python):

    - with `skipped` (on_corrupt='skip'), the rest of the shard by its index
      file (`corrupt.read_past_damage`): b"" for each damaged record, dropped
      downstream, counted in `skipped`, one warning per shard;
    - else (on_corrupt='raise'), an error naming the shard file, the record's
      byte offset, what was found and what to run
      (`corrupt.damaged_shard_message`).

    With on_corrupt='raise', a shard whose size is not the manifest's as the
    dataset is built (one `stat` per shard) fails when it is opened: cut
    short, with the message above; grown, with `corrupt.shard_size_problem`.

    `read` is a plain function of tensors, for the reader's interleave function: its
    arguments come with each shard file (`_shards_records`), so that it has nothing to
    look up, and it holds the size check only where a shard has a problem.
    """
    def message(path, count):
        return corrupt.damaged_shard_message(os.fsdecode(path.numpy()), int(count.numpy()))

    problems = None
    if skipped is None:
        # Each shard's size against the manifest's, once, as the dataset is built (in parallel: on
        # an object store each is a request): a Python call per shard opened costs the first batch
        # ~0.1 s on 2 cores. Only a shard cut short or grown fails, when it is opened.
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            found = list(pool.map(
                corrupt.shard_size_problem, [os.fspath(p) for p in split_files.paths], split_files.num_records,
                split_files.num_bytes))
        # The usual case, every shard of the manifest's size: no check in the function (its
        # ops are traced and instantiated before the first batch).
        problems = tf.constant(found, tf.string) if any(found) else None

    def rest(shard, start, stop):
        records = corrupt.read_past_damage(split_files, int(shard.numpy()), int(start.numpy()), int(stop.numpy()),
                                           skipped)
        return tf.constant(records, tf.string) if records else tf.zeros([0], tf.string)

    def read(path, shard, count, start, stop):
        stop = tf.minimum(stop, count)
        if skipped is None:
            if problems is not None:
                problem = tf.gather(problems, shard)
                with tf.control_dependencies([tf.debugging.Assert(
                        tf.equal(tf.strings.length(problem), 0), [problem], summarize=1)]):
                    path = tf.identity(path)

            @_no_autograph
            def fail(p, n):
                text = tf.py_function(message, [p, n], tf.string)
                with tf.control_dependencies([tf.debugging.Assert(False, [text], summarize=1)]):
                    return tf.identity(p)

            tail = tf.data.Dataset.from_tensors((path, count)).map(fail)
        else:
            tail = tf.data.Dataset.from_tensors((shard, start, stop)).flat_map(_no_autograph(
                lambda s, a, b: tf.data.Dataset.from_tensor_slices(tf.ensure_shape(
                    tf.py_function(rest, [s, a, b], tf.string), [None]))))
        return read_shard(path).ignore_errors().concatenate(tail).take(stop).skip(start)

    return read


def _seeded_files(files: tf.data.Dataset, read_shard, seed: int | None):
    """Files with a random seed each, and a reader giving (record, [2] seed) per record.

    For the tf.data service: its sharding takes whatever feeds the reading
    interleave (shard files and their seeds together), where a second random
    source zipped to the records would stop its rewrite. A record's seed is
    (its file's seed, its place in the file); the file seeds are drawn anew
    every epoch, the same on every run with a `seed`.
    """
    file_seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    files = tf.data.Dataset.zip(files, file_seeds)

    @_no_autograph
    def read(path, file_seed):
        places = tf.data.Dataset.range(np.iinfo(np.int64).max)
        seeds = places.map(lambda i: tf.stack([file_seed, i]))
        return tf.data.Dataset.zip(read_shard(path), seeds)

    return files, read


# --- Stages 2-5: parse, decode, preprocess, batch and finish ---------------------
# Two implementations: `_BY_BATCH` runs all of them in one function per output
# batch (small records), `_PER_IMAGE` parses small record batches, then
# decodes and preprocesses each image in parallel, then batches and finishes.
# Decoding and preprocessing are one step per image in both (`preprocess`
# fuses crops with JPEG decoding and resizes at the stored size).


@dataclasses.dataclass(frozen=True)
class _Stages:
    """What the stage functions of one input pipeline need, resolved once.

    Attributes:
      config: The reading options.
      schema: The dataset's record schema.
      keys: The features parsed for the output: image, label if any, extras.
      num_classes: Classes of the dataset (for one-hot labels).
      batch_size: Examples per batch of this pipeline, or None.
      masked: Elements may be skipped damaged records (b"") to drop from
        their batch.
      jpegs_of_size: The one (height, width) of a split of JPEGs only, from
        the manifest's image stats; else None.
      raster: How a split holding raw-stored rasters is decoded
        (`readers.stored.plan`); None for photos only.
      shape_keys: Features parsed only to decode rasters, dropped after.
      stored_size: The one (height, width) of every image, batched at the
        stored size (image_size=None, checked by `ReaderConfig.check_schema`);
        else None.
      depth: The depth PNG and JPEG images decode at: the stored one for a
        split of PNG-stored rasters (their values kept), else the photo
        pipeline's (`ImageOptions.depth`).
      target: How the label of a target mode ('mask', 'boxes', 'multi_hot',
        'target') is read, decoded per image with the image; None for the
        image-level modes.
      ragged: Per-example features of varying shape (boxes without
        `pad_boxes`, list features among the extras): batched as RaggedTensors.
    """

    config: ReaderConfig
    schema: Any
    keys: tuple[str, ...]
    num_classes: int
    batch_size: int | None
    masked: bool
    jpegs_of_size: tuple[int, int] | None
    raster: stored.RasterPlan | None = None
    shape_keys: tuple[str, ...] = ()
    stored_size: tuple[int, int] | None = None
    depth: tf.DType = tf.uint8
    target: targets.TargetPlan | None = None
    ragged: bool = False

    @classmethod
    def of(cls, split_files: SplitFiles, config: ReaderConfig, batch_size: int | None) -> _Stages:
        reading = config.reading
        target = targets.TargetPlan.of(split_files, reading)
        mode = targets.mode_of(reading.label_mode)
        keys = (IMAGE.key,) + (mode.keys if mode is not None else ())
        keys += tuple(k for k in reading.extra_features if k not in keys)
        stats = split_files.images
        raster = stored.plan(split_files, config.image)
        if raster is not None and target is not None:
            raise ValueError(
                f"label_mode={reading.label_mode!r} reads photo splits (JPEG/PNG); split "
                f"{split_files.split!r} of {split_files.data_dir!r} holds raw-stored rasters. "
                f"Received: label_mode={reading.label_mode!r}"
            )
        listed = {spec.key for spec in split_files.schema.features if spec.listed}
        shape_keys = tuple(k for k in stored.SHAPE_KEYS if k not in keys) if raster else ()
        return cls(
            config=config,
            schema=split_files.schema,
            keys=keys + shape_keys,
            num_classes=len(split_files.class_names),
            batch_size=batch_size,
            # Unbatched, a skipped record is filtered out before (`_drop_skipped`).
            masked=config.reading.bad_record_budget > 0 and batch_size is not None,
            jpegs_of_size=(stats.one_size if stats and [f for f, _ in stats.formats] == ["jpeg"]
                           else None),
            raster=raster,
            shape_keys=shape_keys,
            stored_size=(stats.one_size if batch_size is not None and config.image.image_size is None
                         else None),
            depth=stored.png_raster_depth(split_files, config.image) or config.image.depth,
            target=target,
            ragged=bool((target is not None and target.ragged)
                        or listed.intersection(reading.extra_features)),
        )

    @property
    def standard(self) -> bool:
        return self.config.image.standard_augment

    @property
    def channels(self) -> int:
        """Channels of every output image."""
        return self.raster.bands if self.raster else self.config.image.channels

    def decode(self, features, example_seed=None):
        """Decodes and preprocesses the image of one parsed record's features
        (and its target, with the same geometry, in a target mode)."""
        features = dict(features)
        if self.target is not None:
            image, features[_TARGET_LABEL] = self.target.load(
                features, self.config.image, channels=self.channels, depth=self.depth,
                seed=example_seed,
            )
            for k in self.target.keys:
                if k not in self.config.reading.extra_features:
                    del features[k]
            if self.stored_size is not None and self.target.mode.image_shaped:
                features[_TARGET_LABEL] = tf.ensure_shape(
                    features[_TARGET_LABEL], [*self.stored_size, 1])
        elif self.raster is None:
            image = self.load_image(features[IMAGE.key], example_seed)
            if self.converts_per_image:
                image = self.convert(image)
        else:
            image = self.raster.decode(features, self.config.image, example_seed)
            for k in self.shape_keys:
                del features[k]
        if self.stored_size is not None:
            # The batches' static shape: every image has this size (the manifest).
            image = tf.ensure_shape(image, [*self.stored_size, self.channels])
        features[IMAGE.key] = image
        return features

    def load_image(self, encoded, example_seed=None):
        """Decodes and preprocesses one image."""
        image = self.config.image
        return preprocess.load_image(
            encoded,
            image_size=image.image_size,
            resize=image.resize,
            crop_fraction=image.crop_fraction,
            interpolation=image.interpolation,
            channels=image.channels,
            depth=self.depth,
            augment=self.standard,
            seed=example_seed,
            reduced_decode=image.reduced_decode,
        )

    @property
    def converts_per_image(self) -> bool:
        """Whether the per-image stages convert each photo to its output dtype before the batch.

        `convert_images` is elementwise, so converting each image or the batch gives the same
        values; a 8- or 16-bit image is copied into its batch at a half or a quarter of the
        float32 bytes, and the conversion runs in the parallel per-image map
        (bench.read_stages: 'per element' rows). Not for a callable `augment`, which gets
        float32 pixels before the batch, nor for rasters and targets (their own paths).
        """
        image = self.config.image
        return (self.raster is None and self.target is None and not callable(image.augment)
                and image.dtype in ("uint8", "uint16", "float16", "bfloat16"))

    def convert(self, images):
        """`preprocess.convert_images` with this read's output dtype, scale and normalize."""
        image = self.config.image
        return preprocess.convert_images(
            images, self.raster.output_dtype if self.raster else image.dtype,
            scale=image.scale, normalize=image.normalize,
        )

    def finish(self, features, converted: bool = False):
        """Per batch: converts pixels (unless `converted` per image already) and labels and
        builds the output structure."""
        reading = self.config.reading
        images = features[IMAGE.key] if converted else self.convert(features[IMAGE.key])
        out = [images]
        if self.target is not None:
            # Already per example, with the image's geometry (`decode`).
            out.append(features[_TARGET_LABEL])
        elif reading.label_mode is not None:
            # A mode of the image-level class: its row converts a batch's labels at once.
            out.append(targets.mode_of(reading.label_mode).from_class(features[LABEL.key], self.num_classes))
        if reading.extra_features:
            out.append({k: features[k] for k in reading.extra_features})
        return out[0] if len(out) == 1 else tuple(out)


def label_names(split_files: SplitFiles, label_mode: str | None) -> list[str]:
    """The class names the labels of `label_mode` index, in label order: the
    manifest's targets.boxes.class_names for 'boxes' (oriented_boxes' for 'oriented_boxes'), else its class_names."""
    return targets.class_names(split_files, label_mode)


def _decodes_by_batch(config: ReaderConfig, batch_size: int | None,
                      bytes_per_record: float) -> bool:
    """Whether a batch is decoded in one function call: for small images.

    The per-element stages of the general path (unbatch, map, batch) cost
    some 40 us of CPU per image, a third of the work for 64x64 JPEGs; for
    larger images that is noise, and decoding them one per call spreads a
    batch over the cores (first batch sooner, more parallelism on many
    cores). A callable `augment` runs per example, so needs that path.
    """
    return (
        batch_size is not None
        # Batches at the stored size (image_size=None, one size): per image, no resize.
        and config.image.image_size is not None
        and not callable(config.image.augment)
        and bytes_per_record <= _BATCHED_DECODE_MAX_RECORD_BYTES
    )


def _drop_skipped(records: tf.data.Dataset) -> tf.data.Dataset:
    """Unbatched, a skipped damaged record simply does not appear."""
    return records.filter(_no_autograph(lambda s, *_: tf.strings.length(s) > 0))


def _without_skipped(serialized, batch_seeds=None):
    """A batch of records less its skipped damaged ones (b""), and their seeds if any."""
    keep = tf.strings.length(serialized) > 0
    serialized = tf.boolean_mask(serialized, keep)
    return serialized, None if batch_seeds is None else tf.boolean_mask(batch_seeds, keep)


def _by_batch(records: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """Batches records, then parses, decodes, preprocesses and finishes each
    batch in one function call (its images decoded in a loop)."""
    config, standard, masked = stages.config, stages.standard, stages.masked
    image_spec = tf.TensorSpec([*config.image.image_size, config.image.channels], tf.float32)
    # The stored sizes, parsed too: a batch of one size is resized at once.
    sizes = [k for k in (HEIGHT.key, WIDTH.key) if k not in stages.keys]
    keys = list(stages.keys)

    @_no_autograph
    def load_batch(serialized, batch_seeds=None):
        if masked:
            serialized, batch_seeds = _without_skipped(serialized, batch_seeds if standard else None)
        if standard:
            features = decode.parse_examples(serialized, keys, stages.schema)
            features[IMAGE.key] = tf.map_fn(
                lambda e: stages.load_image(e[0], e[1]),
                (features[IMAGE.key], batch_seeds),
                fn_output_signature=image_spec,
            )
        else:
            features = decode.parse_examples(serialized, keys + sizes, stages.schema)
            heights, widths = features[HEIGHT.key], features[WIDTH.key]
            for k in sizes:
                del features[k]
            image = config.image
            features[IMAGE.key] = preprocess.load_image_batch(
                features[IMAGE.key], heights, widths,
                image_size=image.image_size, resize=image.resize,
                crop_fraction=image.crop_fraction, interpolation=image.interpolation,
                channels=image.channels, depth=stages.depth, batch_size=stages.batch_size,
                jpegs_of_size=stages.jpegs_of_size, reduced_decode=image.reduced_decode,
            )
        return stages.finish(features)

    ds = records.batch(stages.batch_size, drop_remainder=config.reading.drop_remainder)
    return ds.map(load_batch, num_parallel_calls=tf.data.AUTOTUNE)


def _targets_by_batch(records: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """`_by_batch` for the target modes whose labels have one shape (`TargetPlan.label_spec`):
    each batch parsed at once, then every image decoded and transformed with its target
    in a loop (`TargetPlan.load`, as the per-image stages), in one function call."""
    config, standard, masked, target = stages.config, stages.standard, stages.masked, stages.target
    specs = (tf.TensorSpec([*config.image.image_size, stages.channels], tf.float32),
             target.label_spec(config.image.image_size))
    keys, per_example = list(stages.keys), (IMAGE.key, *target.keys)
    extras = config.reading.extra_features

    def load(features, seed=None):
        return target.load(features, config.image, channels=stages.channels, depth=stages.depth,
                           seed=seed)

    @_no_autograph
    def load_batch(serialized, batch_seeds=None):
        if masked:
            serialized, batch_seeds = _without_skipped(serialized, batch_seeds if standard else None)
        features = decode.parse_examples(serialized, keys, stages.schema)
        elems = {k: features[k] for k in per_example}
        if standard:
            loaded = tf.map_fn(lambda e: load(*e), (elems, batch_seeds), fn_output_signature=specs)
        else:
            loaded = tf.map_fn(load, elems, fn_output_signature=specs)
        features[IMAGE.key], features[_TARGET_LABEL] = loaded
        for k in target.keys:
            if k not in extras:
                del features[k]
        return stages.finish(features)

    ds = records.batch(stages.batch_size, drop_remainder=config.reading.drop_remainder)
    return ds.map(load_batch, num_parallel_calls=tf.data.AUTOTUNE)


def _rasters_by_batch(records: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """Batches records of rasters of one shape (`RasterPlan.one_shape`), then
    parses, decodes (one `decode_raw` for the batch), resizes and finishes each
    batch in one function call: the same tensors as the per-image stages."""
    config, masked, raster = stages.config, stages.masked, stages.raster
    keys = [k for k in stages.keys if k not in stages.shape_keys]

    @_no_autograph
    def load_batch(serialized):
        if masked:
            serialized = tf.boolean_mask(serialized, tf.strings.length(serialized) > 0)
        features = decode.parse_examples(serialized, keys, stages.schema)
        features[IMAGE.key] = raster.decode_batch(features[IMAGE.key], config.image)
        return stages.finish(features)

    ds = records.batch(stages.batch_size, drop_remainder=config.reading.drop_remainder)
    return ds.map(load_batch, num_parallel_calls=tf.data.AUTOTUNE)


# The features entry holding the label of a target mode between `decode` and
# `finish` (no record feature has this key: theirs are `schemas` names).
_TARGET_LABEL = "__target_label__"


# In the per-image stages, elements are: features, then the seed with standard
# augmentation, then the keep flag when masked.


def _parse(records: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """Parses records `_PARSE_BATCH` at a time (vectorised), then unbatches."""
    masked, keys = stages.masked, list(stages.keys)
    placeholder = (_placeholder_record(stages.schema, stages.raster, stages.target)
                   if masked else None)

    @_no_autograph
    def parse(serialized, *rest):
        if masked:
            keep = tf.strings.length(serialized) > 0
            serialized = tf.where(keep, serialized, placeholder)
            rest = (*rest, keep)
        features = decode.parse_examples(serialized, keys, stages.schema)
        return (features, *rest) if rest else features

    # Unbatched without `unbatch`'s identity map: one function fewer to trace and to
    # instantiate before the first batch (`tf_internals.unbatch_dense`).
    return tf_internals.unbatch_dense(
        records.batch(_PARSE_BATCH).map(parse, num_parallel_calls=tf.data.AUTOTUNE))


def _decode_and_preprocess(ds: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """Decodes and preprocesses each image, in parallel."""
    standard, masked = stages.standard, stages.masked

    @_no_autograph
    def load(features, *rest):
        features = stages.decode(features, rest[0] if standard else None)
        return (features, rest[-1]) if masked else features

    return ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)


def _user_augment(ds: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """Applies a callable `augment` per example (AutoGraph converts it)."""
    image = stages.config.image
    if not callable(image.augment):
        return ds
    user_fn = image.augment
    shape = [*image.image_size, stages.channels]

    def augment(features, *keep):
        features = dict(features)
        output = tf.convert_to_tensor(user_fn(features[IMAGE.key]))
        features[IMAGE.key] = tf.ensure_shape(tf.cast(output, tf.float32), shape)
        return (features, *keep) if keep else features

    return ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)


def _batch_and_finish(ds: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """Batches (unless unbatched), drops skipped records, finishes each batch."""
    if stages.batch_size is not None and stages.ragged:
        # Boxes (or list extras) of varying length: RaggedTensors [batch, None, ...],
        # the fixed-shape parts dense as with `batch`.
        ds = ds.ragged_batch(stages.batch_size,
                             drop_remainder=stages.config.reading.drop_remainder)
    elif stages.batch_size is not None:
        # A plain batch right after the per-image map: tf.data fuses the two
        # (map_and_batch_fusion), so each image is written into its batch
        # directly; a parallel batch keeps every image as its own tensor and
        # copies it again (0.44 -> 0.39 CPU s per first batch of 64 photos).
        ds = ds.batch(stages.batch_size, drop_remainder=stages.config.reading.drop_remainder)

    @_no_autograph
    def finish(features, *keep):
        if keep:
            # Nested too (the boxes dict of label_mode='boxes'), and ragged.
            features = tf.nest.map_structure(lambda v: _drop_rows(v, keep[0]), features)
        return stages.finish(features, converted=stages.converts_per_image)

    return ds.map(finish, num_parallel_calls=tf.data.AUTOTUNE)


def _drop_rows(values, keep):
    """The rows of a batch where `keep` is true (dense or ragged values)."""
    if isinstance(values, tf.RaggedTensor):
        return tf.ragged.boolean_mask(values, keep)
    return tf.boolean_mask(values, keep)


_BY_BATCH = (_by_batch,)
_TARGETS_BY_BATCH = (_targets_by_batch,)
_RASTERS_BY_BATCH = (_rasters_by_batch,)
def _parse_decode_and_finish(ds: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """Parses, decodes, preprocesses and finishes each photo in one function call, then batches.

    For photos (larger records, no damaged record to mask, no callable `augment`, no
    target), straight from the records: one map function instead of `_PER_IMAGE`'s parse,
    decode and per-batch finish maps; a plain batch last, which tf.data fuses with the map
    (map_and_batch_fusion): each image is written into its batch directly. The same values
    (`finish` is elementwise per image, labels included), in the same order.

    Why the parse is per record here: a batched parse (`_parse`) is a function of its own
    to trace and instantiate, parses 64 records before the first decode and reads two of
    its batches ahead, and `unbatch` copies each record's bytes out of the batch. Per
    record, the first batch waits for one function fewer and reads no further ahead than
    the decode map does (bench/RESULTS.md, ttfb13); one `parse_example` of a photo's record
    costs about what its share of a batched one does (~0.07 ms against ~2.4 ms to decode
    and resize it).
    """
    standard, keys = stages.standard, list(stages.keys)

    @_no_autograph
    def load(serialized, *rest):
        features = decode.parse_examples(serialized, keys, stages.schema)
        features = stages.decode(features, rest[0] if standard else None)
        return stages.finish(features, converted=stages.converts_per_image)

    ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)
    if stages.batch_size is not None:
        ds = ds.batch(stages.batch_size, drop_remainder=stages.config.reading.drop_remainder)
    return ds


_PER_IMAGE = (_parse, _decode_and_preprocess, _user_augment, _batch_and_finish)
_PHOTOS_PER_IMAGE = (_parse_decode_and_finish,)
# Switches `_PHOTOS_PER_IMAGE` off, for the benchmark's ablation (bench.read_stages) only.
_FUSED_PHOTO_STAGES = True


def _finish_dataset(
    ds: tf.data.Dataset,
    split_files: SplitFiles,
    config: ReaderConfig,
    *,
    batch_size: int | None,
    num_records: int,
    sharded_here: bool,
) -> tf.data.Dataset:
    """Known cardinality, prefetch, tf.data options and the dataset's attributes."""
    reading = config.reading
    served = config.remote.service is not None
    # Served, each worker reads its share: the count is that of the trainer's
    # whole read, which the service does not know.
    if not served and not reading.repeat and not (batch_size is None and reading.bad_record_budget):
        if batch_size is None:
            num_elements = num_records
        elif reading.drop_remainder:
            num_elements = num_records // batch_size
        else:
            num_elements = math.ceil(num_records / batch_size)
        ds = ds.apply(tf.data.experimental.assert_cardinality(num_elements))
    ds = ds.prefetch(tf.data.AUTOTUNE)

    options = tf.data.Options()
    options.deterministic = config.shuffling.is_deterministic
    if sharded_here:
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF
        )
    ds = ds.with_options(options)
    if served:
        remote = config.remote
        ds = _service.distribute(ds, remote.service, remote.service_sharding,
                                remote.service_job_name, remote.service_trainer_id,
                                remote.service_compression)
    ds.class_names = label_names(split_files, config.reading.label_mode)
    ds.records_per_epoch = split_files.total_records
    ds.seed = config.shuffling.seed
    return ds


def build_dataset(
    split_files: SplitFiles,
    config: ReaderConfig,
    *,
    batch_size: int | None,
    pipeline_id: int = 0,
    num_pipelines: int = 1,
    sharded_here: bool = False,
    skipped: corrupt.CorruptRecords | None = None,
) -> tf.data.Dataset:
    """Builds the input pipeline of one input pipeline's share of a split.

    The stages: records (`_global_records` or `_shards_records`), then
    parse -> decode and preprocess -> batch and finish, either all in one
    function per batch (`_BY_BATCH`, small records) or per image
    (`_PER_IMAGE`), then `_finish_dataset`.

    With `num_pipelines` > 1, pipeline `pipeline_id` reads shard files
    `pipeline_id::num_pipelines`; if there are fewer files than pipelines,
    every pipeline reads all files in the same order and keeps every
    `num_pipelines`-th record instead. With shuffle='global', it reads its
    contiguous slice of every global batch (`config.batch_size` is the
    global batch size) instead, see `readers.global_shuffle`.

    Args:
      split_files: The split, from `readers.metadata.load_split`.
      config: The reading options (already validated).
      batch_size: Examples per batch of this pipeline (overrides
        `config.batch_size`, e.g. the per-replica batch size).
      pipeline_id: Index of this input pipeline.
      num_pipelines: Number of input pipelines.
      sharded_here: The caller shards the input (as `distributed_dataset`
        does): switch tf.data auto-sharding off.
      skipped: Counts the damaged records skipped (`ds.corrupt_records`);
        one shared by every pipeline of a distributed dataset. None: a new one.

    Returns:
      The dataset, see `image_dataset_from_tfrecords`.

    Raises:
      ValueError: With shuffle='global', if `config.seed` is None or the
        global batch size does not divide by `num_pipelines`.
      schemas.ManifestError, FileNotFoundError: With shuffle='global', if an
        index file is missing or does not match the manifest.
    """
    config.check_schema(split_files)
    stored_options = stored.photo_options(split_files, config.image)
    if stored_options:  # color_mode/dtype None: what the split's photos store.
        config = config.replace(**stored_options)
    if config.image.normalize == NORMALIZE_DATASET:
        config = config.replace(normalize=stored.resolve_normalize(split_files, config.image))
    skipped = corrupt.CorruptRecords() if skipped is None else skipped
    records, num_records, bytes_per_record = _records(
        split_files, config, pipeline_id=pipeline_id, num_pipelines=num_pipelines,
        skipped=skipped,
    )
    if config.reading.bad_record_budget and batch_size is None:
        records = _drop_skipped(records)
    stages = _Stages.of(split_files, config, batch_size)
    ds = records
    if stages.raster is not None:
        # Rasters of one shape decode a batch per op; others per image (`readers.stored`).
        by_batch = (batch_size is not None and not callable(config.image.augment)
                    and stages.raster.decodes_by_batch(config.image))
        pipeline = _RASTERS_BY_BATCH if by_batch else _PER_IMAGE
    else:
        by_batch = _decodes_by_batch(config, batch_size, bytes_per_record)
        if stages.target is not None:
            # Labels of one shape only: ragged boxes are batched by tf.data.
            by_batch = by_batch and stages.target.label_spec(config.image.image_size) is not None
            pipeline = _TARGETS_BY_BATCH if by_batch else _PER_IMAGE
        else:
            pipeline = _BY_BATCH if by_batch else _PER_IMAGE
            if (pipeline is _PER_IMAGE and _FUSED_PHOTO_STAGES and not stages.masked
                    and not stages.ragged and not callable(config.image.augment)
                    and not (config.reading.bad_record_budget and batch_size is None)):
                pipeline = _PHOTOS_PER_IMAGE
    for stage in pipeline:
        ds = stage(ds, stages)
    ds = _finish_dataset(
        ds, split_files, config,
        batch_size=batch_size, num_records=num_records, sharded_here=sharded_here,
    )
    # The damaged records skipped so far (on_corrupt='skip' or max_bad_records).
    ds.corrupt_records = skipped
    return ds


def without_extras(*element):
    """Drops the `extra_features` dict from an element, for Keras.

    Keras's `fit` and `evaluate` read a third element as sample weights, so a
    dataset read with `extra_features` is mapped through this first:

        ds = image_dataset_from_tfrecords(..., extra_features=(FILENAME.key,))
        model.evaluate(ds.map(without_extras))
        for images, labels, extras in ds:   # predictions with their file names
            scores = model.predict_on_batch(images)

    Args:
      *element: An element `(images, labels, extras)` or `(images, extras)`.

    Returns:
      `(images, labels)`, or `images` alone.
    """
    rest = element[:-1]
    return rest[0] if len(rest) == 1 else rest


def image_dataset_from_tfrecords(
    data_dir: str | os.PathLike,
    split: str = "train",
    *,
    version: int | None = None,
    reading: ReadOptions | None = None,
    image: ImageOptions | None = None,
    shuffling: ShuffleOptions | None = None,
    remote: ServiceReadOptions | None = None,
    **options,
) -> tf.data.Dataset:
    """Reads one split of a shardsmith dataset as a batched `tf.data.Dataset`.

    Like `keras.utils.image_dataset_from_directory`, but from the TFRecord
    shards the converter wrote (those the manifest lists, never a glob). The
    defaults are Keras's except `image_size` ((224, 224)) and `deterministic`
    (order not kept without a `seed`), see `ReaderConfig`.

    Args:
      data_dir: The dataset folder (the converter's `--output_dir`); local
        or any URL `tf.io.gfile` reads, e.g. `gs://bucket/dataset`.
      split: The split to read, e.g. 'train' or 'validation' ('val',
        'valid', 'training', 'testing' are accepted for the split they mean).
      version: For a dataset that grew (`shardsmith convert --append`): None
        reads the latest version; N reads exactly what version N held (its
        shards and class_names), so that cardinality, the global shuffle
        and `start` positions taken on version N stay valid.
      reading, image, shuffling, remote: Whole option groups, `ReadOptions`,
        `ImageOptions`, `ShuffleOptions` and `ServiceReadOptions`, e.g.
        `image=ImageOptions(image_size=(160, 160), augment="standard")`.
      **options: Or each option by name, e.g. `batch_size=64`: every field
        of those groups (documented there), with its default. A group and
        its options by name are not given together.

    Returns:
      A `tf.data.Dataset` of `(images, labels)`; `images` alone with
      `label_mode=None`; with `extra_features`, `(images, labels, extras)` or
      `(images, extras)`, `extras` a dict from feature key to a [batch]
      tensor (map through `without_extras` for Keras's `fit`). `images` is
      `dtype` [batch, height, width, channels]; labels are as described
      under `ReadOptions.label_mode`, the target modes (mask, boxes,
      multi_hot, target) in `readers.targets`. The dataset has the
      attributes `class_names` (label order; with label_mode='boxes', those
      of the boxes), `records_per_epoch` and `seed` (the seed in use: with
      shuffle='global' and no `seed`, the one drawn). Without `repeat`, its
      cardinality is known.

    Raises:
      TypeError, ValueError: If an argument is invalid; the message names it,
        its allowed values and what was received.
      FileNotFoundError: If `data_dir` is missing, is not a finished
        shardsmith dataset, or lacks shard files its manifest lists.
      schemas.ManifestError: If the manifest is damaged, of an unknown schema
        version, or has no such split; with shuffle='global', if an index
        file does not match the manifest (or it lists none).
    """
    config = ReaderConfig(reading=reading, image=image, shuffling=shuffling, remote=remote, **options)
    config = _with_drawn_seed(config)
    split_files = load_split(data_dir, split, version=version)
    logger.info(
        "Reading split %r of %s: %d records in %d shard files.",
        split, split_files.data_dir, split_files.total_records, len(split_files.paths),
    )
    return build_dataset(split_files, config, batch_size=config.batch_size)


# Every option by name in `help()` and `inspect`, with the defaults of its group.
image_dataset_from_tfrecords.__signature__ = reader_signature(image_dataset_from_tfrecords)


def _with_drawn_seed(config: ReaderConfig) -> ReaderConfig:
    """shuffle='global' without a seed: one drawn, logged to resume the read with."""
    if config.shuffle_mode != "global" or config.seed is not None:
        return config
    config = config.replace(seed=_random_seed())
    logger.info(
        "shuffle='global' without a seed: using seed=%d (pass it, with `start`, "
        "to resume this read).", config.seed,
    )
    return config
