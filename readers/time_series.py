"""Reading satellite time series: stacks (time, height, width, bands) a temporal model can take.

    ds = readers.time_series_dataset_from_tfrecords(
        "pastis_tfr", "train", batch_size=32, max_steps=24, normalize="dataset",
        extra_features=("stack/dates", "stack/valid"))
    for stacks, labels, extras in ds:  # stacks float32 [32, 24, h, w, bands]
        ...

The records are the converter's stacks (`schemas.TimeSeriesExampleSchema`,
`shardsmith convert --time_series`). Decoding depends on the schema alone
(`_decode`); then, per stack (`_preprocess`): `max_steps` pads or
sub-samples the dates, `image_size` resizes every date alike, `normalize`
applies per-band statistics, `augment` flips and rotates every date and the
mask alike. Records come from the image reader's stage (`readers.dataset`):
the same shard interleave, shuffling and, under `tf.distribute`, the same
sharding of files between input pipelines; options are validated by the
same option classes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from readers import corrupt, global_shuffle, stored, targets
from readers.dataset import _derive_seed, _drop_skipped, _random_seed, _shards_records
from readers.metadata import SplitFiles, load_split
from readers.options import ReadOptions, ShuffleOptions
from readers.positions import ReadPosition
from schemas.features import LABEL, MASK
from schemas.time_series import (
    STACK, STACK_DATES, STACK_DTYPE, STACK_SHAPE, STACK_VALID, TIME_SERIES,
)

__all__ = ["TimeSeriesOptions", "time_series_dataset_from_tfrecords"]

logger = logging.getLogger(__name__)

_DTYPES = ("float32", "float16", "bfloat16", "float64")
_AUGMENTS = ("flip", "flip_rotate")
_LABEL_MODES = ("int", "categorical", "mask", None)
_METHODS = ("bilinear", "nearest", "area", "bicubic")


@dataclasses.dataclass(frozen=True)
class TimeSeriesOptions:
    """What `time_series_dataset_from_tfrecords` does to each stack; validated when built.

    Attributes:
      max_steps: None keeps every date. An int T gives every stack T dates:
        a stack of fewer is padded at the end with zeros (`stack/valid`
        False there); one of more keeps T dates drawn at random (seeded by
        `seed`, anew each epoch), in date order.
      image_size: (height, width) every date is resized to (`interpolation`;
        the mask with the nearest neighbour); None keeps the stored size.
      interpolation: 'bilinear', 'nearest', 'area' or 'bicubic'.
      dtype: The output's float dtype, or None: the stored dtype, values
        exactly as stored (no resizing or normalising then).
      normalize: None; 'dataset' for the train split's per-band mean and std
        the converter recorded (nodata and NaN left out); or (mean, std),
        per band or one number each.
      augment: None; 'flip' (random left-right and up-down flips) or
        'flip_rotate' (and a random quarter turn): every date and the mask
        alike.
    """

    max_steps: int | None = None
    image_size: tuple[int, int] | None = None
    interpolation: str = "bilinear"
    dtype: str | None = "float32"
    normalize: Any = None
    augment: str | None = None

    def __post_init__(self):
        if self.max_steps is not None and (isinstance(self.max_steps, bool) or not isinstance(
                self.max_steps, int) or self.max_steps < 1):
            raise ValueError(f"`max_steps` must be a positive integer or None. Received: max_steps={self.max_steps!r}")
        if self.image_size is not None:
            size = tuple(self.image_size) if isinstance(self.image_size, (tuple, list)) else ()
            if len(size) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in size):
                raise ValueError("`image_size` must be (height, width) of positive integers or None. "
                                 f"Received: image_size={self.image_size!r}")
            object.__setattr__(self, "image_size", size)
        if self.interpolation not in _METHODS:
            raise ValueError(f"`interpolation` must be one of {_METHODS}. Received: interpolation={self.interpolation!r}")
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise ValueError(f"`dtype` must be one of {_DTYPES} or None (as stored). Received: dtype={self.dtype!r}")
        if self.augment is not None and self.augment not in _AUGMENTS:
            raise ValueError(f"`augment` must be one of {_AUGMENTS} or None. Received: augment={self.augment!r}")
        if self.normalize is not None and self.normalize != "dataset":
            ok = isinstance(self.normalize, (tuple, list)) and len(self.normalize) == 2
            if not ok:
                raise ValueError("`normalize` must be None, 'dataset' or (mean, std). "
                                 f"Received: normalize={self.normalize!r}")
        if self.dtype is None and (self.image_size is not None or self.normalize is not None):
            raise ValueError("dtype=None yields each stack exactly as stored: it cannot go with "
                             f"`image_size` or `normalize`. Received: dtype=None, image_size="
                             f"{self.image_size!r}, normalize={self.normalize!r}")


def _stack_dtypes(split_files: SplitFiles) -> tuple[str, ...]:
    dtypes = tuple(split_files.time_series.get("dtypes", ()))
    if not dtypes:
        raise ValueError(f"The manifest of {split_files.data_dir!r} does not say the stacks' dtype "
                         "(its time_series section): convert the passes again.")
    return dtypes


def _decode(features, dtypes: tuple[str, ...], out_dtype):
    """A record's stack as a tensor (time, height, width, bands): stored dtype, or cast to `out_dtype`."""
    shape = features[STACK_SHAPE.key]
    if len(dtypes) == 1:
        values = tf.io.decode_raw(features[STACK.key], tf.as_dtype(dtypes[0]), little_endian=True)
        if out_dtype is not None:
            values = tf.cast(values, out_dtype)
        return tf.reshape(values, shape)
    # Stacks of several dtypes in one split: each decoded at its own, then cast.
    branches = {}
    for name in dtypes:
        branches[name] = (lambda n=name: tf.cast(tf.io.decode_raw(
            features[STACK.key], tf.as_dtype(n), little_endian=True), out_dtype))
    which = features[STACK_DTYPE.key]
    values = tf.case([(tf.equal(which, name), fn) for name, fn in branches.items()], exclusive=True)
    return tf.reshape(values, shape)


def _steps(stack, dates, max_steps: int, seed, lengths=()):
    """(stack, dates, valid) with exactly `max_steps` dates: padded, or sub-sampled in date order.

    `lengths`: the split's numbers of dates (the manifest's), when known: a
    split whose stacks all fit needs no draw, one whose stacks all have
    `max_steps` dates neither padding nor a draw (no op then).
    """
    t = tf.shape(stack)[0]
    if lengths and max(lengths) <= max_steps:
        if min(lengths) == max_steps:
            return (tf.ensure_shape(stack, [max_steps, None, None, None]), tf.ensure_shape(dates, [max_steps]),
                    tf.ones([max_steps], tf.bool))
        extra = max_steps - t
        return (tf.ensure_shape(tf.pad(stack, [[0, extra], [0, 0], [0, 0], [0, 0]]), [max_steps, None, None, None]),
                tf.ensure_shape(tf.pad(dates, [[0, extra]]), [max_steps]), tf.sequence_mask(t, max_steps))

    def pad():
        extra = max_steps - t
        padded = tf.pad(stack, [[0, extra], [0, 0], [0, 0], [0, 0]])
        return padded, tf.pad(dates, [[0, extra]]), tf.sequence_mask(t, max_steps)

    def sample():
        noise = tf.random.stateless_uniform([t], seed=seed)
        keep = tf.sort(tf.math.top_k(noise, k=max_steps).indices)
        return tf.gather(stack, keep), tf.gather(dates, keep), tf.ones([max_steps], tf.bool)

    stack, dates, valid = tf.cond(t <= max_steps, pad, sample)
    stack = tf.ensure_shape(stack, [max_steps, None, None, None])
    return stack, tf.ensure_shape(dates, [max_steps]), tf.ensure_shape(valid, [max_steps])


def _augment(stack, mask, mode: str, seed):
    """The same random flips (and quarter turn) for every date and the mask."""
    seeds = tf.random.experimental.stateless_split(seed, 3)
    lr = tf.random.stateless_uniform([], seed=seeds[0]) < 0.5
    ud = tf.random.stateless_uniform([], seed=seeds[1]) < 0.5
    turns = (tf.random.stateless_uniform([], seed=seeds[2], maxval=4, dtype=tf.int32)
             if mode == "flip_rotate" else tf.constant(0))

    def move(x):  # x: (time, h, w, c): every date as an image of the batch.
        x = tf.cond(lr, lambda: tf.reverse(x, [2]), lambda: x)
        x = tf.cond(ud, lambda: tf.reverse(x, [1]), lambda: x)
        return tf.image.rot90(x, turns)

    stack = move(stack)
    if mask is not None:
        mask = move(mask[tf.newaxis])[0]
    return stack, mask


def _static_shape(section, options: TimeSeriesOptions) -> list | None:
    """[time, height, width, bands] of every stack the reader yields, when the manifest says it; else None.

    Known when the split's stacks have one length (or `max_steps` gives
    them one), one size (or `image_size`) and one list of bands: then every
    axis but the batch's is known before reading (as Keras' layers want).
    """
    lengths, sizes, bands = section.get("steps", ()), section.get("sizes", ()), section.get("bands")
    steps = options.max_steps if options.max_steps is not None else (lengths[0] if len(lengths) == 1 else None)
    size = options.image_size if options.image_size is not None else (tuple(sizes[0]) if len(sizes) == 1 else None)
    if steps is None or size is None or not bands:
        return None
    return [int(steps), int(size[0]), int(size[1]), len(bands)]


def time_series_dataset_from_tfrecords(
    data_dir: str | os.PathLike,
    split: str = "train",
    *,
    batch_size: int | None = 32,
    max_steps: int | None = None,
    image_size: tuple[int, int] | None = None,
    interpolation: str = "bilinear",
    dtype: str | None = "float32",
    normalize: Any = None,
    augment: str | None = None,
    label_mode: str | None = "int",
    shuffle: bool | str = True,
    seed: int | None = None,
    repeat: bool = False,
    drop_remainder: bool = False,
    extra_features: Sequence[str] = (),
    deterministic: bool | None = None,
    cache: bool | str = False,
    max_bad_records: int = 0,
    on_corrupt: str = "raise",
    input_context: tf.distribute.InputContext | None = None,
    version: int | None = None,
) -> tf.data.Dataset:
    """Reads one split of a time-series dataset (`shardsmith convert --time_series`) as a `tf.data.Dataset`.

    Args:
      data_dir: The dataset folder (the converter's --output_dir), local or a URL.
      split: 'train', 'validation', 'test' (or an alias the converter accepts).
      batch_size: Stacks per batch, or None for single stacks. Batching
        needs one shape: give `max_steps` (and `image_size`) when stacks have
        different numbers of dates (or sizes).
      max_steps, image_size, interpolation, dtype, normalize, augment: See
        `TimeSeriesOptions`.
      label_mode: 'int' (int32 class index), 'categorical' (float32 one-hot),
        'mask' (int32 class ids [height, width, 1], for datasets converted
        with --masks_dir; moved with the stack) or None (stacks alone).
      shuffle, seed, deterministic: As `image_dataset_from_tfrecords`: True
        (or 'shards': shard files per epoch and records in a buffer),
        'global' (a new permutation of every stack each epoch, read by
        offset; without `seed` one is drawn and logged) or False; `seed`
        also seeds `max_steps`' sub-sampling and `augment`.
      repeat, drop_remainder: As `image_dataset_from_tfrecords`.
      cache, max_bad_records, on_corrupt: As `image_dataset_from_tfrecords`:
        `cache` keeps the encoded records of the first epoch (in memory, or
        in files with this prefix; not with shuffle='global');
        `max_bad_records` damaged records (bad CRC, truncated) are skipped
        per epoch before the read fails, every one with on_corrupt='skip'
        (read by offset through the index files). The dataset counts them
        (`ds.corrupt_records`); batches then hold the stacks left.
      extra_features: Further features to return in a dict: any of the
        record's (`stack/dates`, `stack/bands`, `filename`, `epsg`,
        `geotransform`, ...) and `stack/valid` (bool [time], False on the
        steps `max_steps` padded). `stack/dates` follow `max_steps` (padded
        with 0, sub-sampled with their stack).
      input_context: Under `strategy.distribute_datasets_from_function`,
        the `tf.distribute.InputContext`: this pipeline reads its share of
        the shard files (as `readers.distributed_dataset`'s pipelines do)
        and batches `batch_size` per replica.
      version: For a dataset that grew (`shardsmith convert --time_series
        --append`): None reads the latest version; N reads exactly the
        locations version N held (its shards, classes and stack lengths).

    Returns:
      A dataset of `(stack, label)`, `(stack, label, extras)`, `stack` or
      `(stack, extras)`; `stack` is `dtype` [batch, time, height, width,
      bands] (no batch axis with batch_size=None). It has `class_names`,
      `band_names` (None when locations differ in bands),
      `records_per_epoch` and `corrupt_records` attributes.

    Raises:
      TypeError, ValueError: For an invalid argument, naming it, what is
        allowed and what was received.
      FileNotFoundError, schemas.ManifestError: As `image_dataset_from_tfrecords`,
        and for a dataset of images (read those with `image_dataset_from_tfrecords`).
    """
    options = TimeSeriesOptions(max_steps, image_size, interpolation, dtype, normalize, augment)
    if label_mode not in _LABEL_MODES:
        raise ValueError(f"`label_mode` must be one of {_LABEL_MODES}. Received: label_mode={label_mode!r}")
    reading = ReadOptions(batch_size=batch_size, label_mode=None, repeat=repeat, drop_remainder=drop_remainder,
                          extra_features=extra_features if isinstance(extra_features, str) else tuple(extra_features),
                          cache=cache, max_bad_records=max_bad_records, on_corrupt=on_corrupt)
    shuffling = ShuffleOptions(shuffle=shuffle, seed=seed, deterministic=deterministic)
    if shuffling.mode == "global":
        if cache is not False:
            raise ValueError("`cache` does not apply to shuffle='global', which reads every record by offset. "
                             f"Received: cache={cache!r}, shuffle='global'")
        if seed is None:
            shuffling = dataclasses.replace(shuffling, seed=_random_seed())
            logger.info("shuffle='global' without a seed: using seed=%d (pass it to read the same order again).",
                        shuffling.seed)
    split_files = load_split(data_dir, split, version=version, kind=TIME_SERIES)
    dtypes = _check_split(split_files, options, reading, label_mode, batch_size, extra_features)
    lengths = tuple(int(v) for v in split_files.time_series.get("steps", ()))
    draws = options.max_steps is not None and (not lengths or max(lengths) > options.max_steps)
    skipped = corrupt.CorruptRecords()
    records, num_records, per_replica = _records(split_files, shuffling, reading, input_context,
                                                 seeded=options.augment is not None or draws, skipped=skipped)
    load = _stack_loader(split_files, options, reading, label_mode, dtypes, lengths, draws)
    # Traced as written (its branches on tensors are tf ops already): AutoGraph's conversion is
    # build time every trainer pays before its first batch (as readers.volumes measured).
    ds = records.map(tf.autograph.experimental.do_not_convert(load), num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=shuffling.is_deterministic)
    ds = _finish(ds, split_files, shuffling, per_replica, num_records, repeat=repeat,
                 drop_remainder=drop_remainder, input_context=input_context,
                 counted=not reading.bad_record_budget)
    # The damaged records skipped so far (on_corrupt='skip' or max_bad_records).
    ds.corrupt_records = skipped
    return ds


def _records(split_files, shuffling: ShuffleOptions, reading: ReadOptions, input_context, seeded: bool,
             skipped: corrupt.CorruptRecords):
    """This pipeline's share of the split's records (with a seed pair each when `seeded`), their
    number, and the batch size of one replica. Damaged records skipped (`reading`'s budget) are
    counted in `skipped` and left out."""
    pipeline_id, num_pipelines, per_replica = 0, 1, reading.batch_size
    if input_context is not None:
        pipeline_id, num_pipelines = input_context.input_pipeline_id, input_context.num_input_pipelines
        if reading.batch_size is not None:
            per_replica = input_context.get_per_replica_batch_size(reading.batch_size)
    if shuffling.mode == "global":
        # The image reader's permutation of every record, read by offset (`readers.global_shuffle`).
        records, num_records, _ = global_shuffle.global_records(
            split_files, perm_seed=_derive_seed(shuffling.seed, 3), aug_seed=None, start=ReadPosition(),
            global_batch_size=reading.batch_size or 1, pipeline_id=pipeline_id, num_pipelines=num_pipelines,
            repeat=reading.repeat, drop_remainder=reading.drop_remainder,
            max_bad_records=reading.bad_record_budget, skipped=skipped)
    else:
        records, num_records, _ = _shards_records(split_files, shuffling, reading, pipeline_id=pipeline_id,
                                                  num_pipelines=num_pipelines, standard=False, skipped=skipped)
    if reading.bad_record_budget:
        records = _drop_skipped(records)  # A skipped damaged record is b"".
    if seeded:
        seeds = tf.data.Dataset.random(seed=_derive_seed(shuffling.seed, 5, pipeline_id),
                                       rerandomize_each_iteration=True).batch(2)
        records = tf.data.Dataset.zip(records, seeds)
    return records, num_records, per_replica


def _check_split(split_files, options: TimeSeriesOptions, reading: ReadOptions, label_mode, batch_size,
                 extra_features) -> tuple:
    """The split's stack dtypes, once the arguments are checked against what it holds.

    Raises:
      ValueError: For an argument the split cannot serve, naming it.
    """
    schema = split_files.schema
    keys = [spec.key for spec in schema.features]
    allowed = [k for k in keys if k not in (STACK.key, LABEL.key)] + [STACK_VALID]
    unknown = [k for k in reading.extra_features if k not in allowed]
    if unknown:
        raise ValueError(f"`extra_features` must be a subset of this dataset's features {allowed}. "
                         f"Received: extra_features={extra_features!r}")
    if label_mode == "mask" and not schema.mask:
        raise ValueError("label_mode='mask' needs per-pixel labels (--masks_dir), which this dataset has "
                         "not; read it with label_mode 'int', 'categorical' or None. Received: label_mode='mask'")
    if label_mode in ("int", "categorical") and not split_files.class_names:
        raise ValueError(f"label_mode={label_mode!r} needs classes; this dataset has none (class_names []). "
                         f"Use label_mode=None{' or mask' if schema.mask else ''}. Received: label_mode={label_mode!r}")
    dtypes = _stack_dtypes(split_files)
    if options.dtype is None and len(dtypes) > 1:
        raise ValueError(f"dtype=None yields stacks as stored, but split {split_files.split!r} holds stacks of "
                         f"{list(dtypes)}: pass a float `dtype`. Received: dtype=None")
    section = split_files.time_series
    if batch_size is not None:
        steps = set(section.get("steps", ()))
        sizes = {tuple(s) for s in section.get("sizes", ())}
        if options.max_steps is None and len(steps) > 1:
            raise ValueError(f"batch_size={batch_size} needs stacks of one length; split's stacks have "
                             f"{min(steps)} to {max(steps)} dates: pass `max_steps`. Received: max_steps=None")
        if options.image_size is None and len(sizes) > 1:
            raise ValueError(f"batch_size={batch_size} needs stacks of one size; the stacks have sizes "
                             f"{sorted(sizes)[:4]}: pass `image_size`. Received: image_size=None")
    return dtypes


def _stack_loader(split_files, options: TimeSeriesOptions, reading: ReadOptions, label_mode, dtypes,
                  lengths: tuple, draws: bool):
    """The function that parses, decodes and preprocesses one record (and its seeds, when random)."""
    schema = split_files.schema
    mean_std = None
    if options.normalize == "dataset":
        stats = stored.dataset_band_stats(split_files.band_stats, split_files.data_dir)
        mean_std = (stats.mean, stats.std)
    elif options.normalize is not None:
        mean_std = tuple(options.normalize)
    out_dtype = None if options.dtype is None else tf.as_dtype(options.dtype)
    wanted = [STACK.key, STACK_SHAPE.key, STACK_DATES.key, STACK_DTYPE.key, LABEL.key]
    if label_mode == "mask":
        wanted.append(MASK.key)
    wanted += [k for k in reading.extra_features if k != STACK_VALID and k not in wanted]
    spec = schema.parse_spec(wanted)
    by_key = {s.key: s for s in schema.features}
    mask_dtype = tf.uint16 if split_files.targets.get("mask", {}).get("dtype") == "uint16" else tf.uint8
    num_classes = len(split_files.class_names)

    static = _static_shape(split_files.time_series, options)
    padded = options.max_steps is not None and (not lengths or min(lengths) < options.max_steps)

    def load(serialized, seed_pair=None):
        features = tf.io.parse_single_example(serialized, spec)
        stack = _decode(features, dtypes, out_dtype)
        dates = features[STACK_DATES.key]
        valid = tf.ones(tf.shape(dates), tf.bool)
        mask = None
        if label_mode == "mask":
            mask = tf.cast(tf.io.decode_png(features[MASK.key], channels=1, dtype=mask_dtype), tf.int32)
        if seed_pair is not None:
            step_seed, aug_seed = tf.unstack(tf.random.experimental.stateless_split(seed_pair, 2))
        if options.max_steps is not None:
            stack, dates, valid = _steps(stack, dates, options.max_steps, step_seed if draws else None, lengths)
        if options.image_size is not None:
            stack = tf.cast(tf.image.resize(stack, options.image_size, method=options.interpolation), out_dtype)
            if mask is not None:
                mask = tf.image.resize(mask, options.image_size, method="nearest")
        if mean_std is not None:
            mean = tf.constant(mean_std[0], out_dtype)
            std = tf.constant(mean_std[1], out_dtype)
            stack = (stack - mean) / std
            if padded:
                # The padded steps stay zeros, as documented, not (0 - mean) / std.
                stack = tf.where(valid[:, tf.newaxis, tf.newaxis, tf.newaxis], stack, tf.zeros([], out_dtype))
        if options.augment is not None:
            stack, mask = _augment(stack, mask, options.augment, aug_seed)
        if static is not None:
            stack = tf.ensure_shape(stack, static)
        row = targets.mode_of(label_mode)
        if row is not None and row.from_class is not None:
            label = row.from_class(features[LABEL.key], num_classes)
        else:
            label = mask
        extra = {}
        for key in reading.extra_features:
            if key == STACK_VALID:
                extra[key] = valid
            elif key == STACK_DATES.key:
                extra[key] = dates
            else:
                extra[key] = by_key[key].finish_parsed(features[key])
        element = (stack,) if label is None else (stack, label)
        if extra:
            element += (extra,)
        return element[0] if len(element) == 1 else element

    return load


def _finish(ds, split_files, shuffling: ShuffleOptions, per_replica, num_records: int, *, repeat: bool,
            drop_remainder: bool, input_context, counted: bool = True) -> tf.data.Dataset:
    """The mapped records batched, counted, prefetched, with their options and the promised attributes."""
    section = split_files.time_series
    if per_replica is not None:
        ds = ds.batch(per_replica, drop_remainder=drop_remainder)
    if not repeat and counted:  # Not when damaged records may be left out.
        n = num_records if per_replica is None else (
            num_records // per_replica if drop_remainder else math.ceil(num_records / per_replica))
        ds = ds.apply(tf.data.experimental.assert_cardinality(n))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    tf_options = tf.data.Options()
    tf_options.deterministic = shuffling.is_deterministic
    if input_context is not None:
        tf_options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.with_options(tf_options)
    ds.class_names = list(split_files.class_names)
    # None when the locations' stacks have different bands (each record's stack/bands says).
    ds.band_names = list(section["bands"]) if section.get("bands") else None
    ds.records_per_epoch = split_files.total_records
    return ds
