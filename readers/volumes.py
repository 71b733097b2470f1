"""tf.data reader of volume datasets (`shardsmith convert --volumes`, issue 36).

    ds = readers.volume_dataset_from_tfrecords("out", "train", batch_size=2,
                                               spacing=(2.0, 1.0, 1.0), window=(-600, 1500),
                                               patch_size=(96, 96, 96), patches_per_volume=4, seed=0)
    model.fit(ds)  # (volume float32 [b, 96, 96, 96, 1], label)

Decode depends on the schema alone (`schemas.volumes`); preprocess then
resamples (trilinear, separable: rows and columns, then slices), windows and
crops. With `extra_features`, each element ends with a dict of them; the
affine follows every resampling and crop, so a patch's voxel (i, j, k) still
maps to its RAS position.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

from schemas import tf_runtime as _tf_runtime  # isort: skip

tf = _tf_runtime.full()

from readers.metadata import load_manifest
from schemas import LABEL, MANIFEST_FILENAME
from schemas.volumes import (VOLUME, VOLUME_AFFINE, VOLUME_DTYPE, VOLUME_DTYPES, VOLUME_MASK, VOLUME_MASK_DTYPES,
                             VOLUME_MASK_SCHEMA, VOLUME_SCHEMA, VOLUME_SHAPE, VOLUME_SPACING)

__all__ = ["volume_dataset_from_tfrecords", "VOLUME_EXTRA_FEATURES", "LABEL_MODES", "foreground_voxels"]

_LOG = logging.getLogger(__name__)
# The map functions are traced as written: their branches on tensors are tf.cond / tf.where already,
# and AutoGraph's conversion of them took most of a pipeline's build (~1 s of 1.2 for masked
# patches, measured with cProfile), paid by every trainer before its first batch.
_no_autograph = tf.autograph.experimental.do_not_convert

# What `label_mode` may be: each volume's class, or its label volume (datasets converted with --masks_dir).
LABEL_MODES = ("int", "mask")
# Keys `extra_features` may name.
VOLUME_EXTRA_FEATURES = tuple(spec.key for spec in VOLUME_SCHEMA.features
                              if spec.key not in (VOLUME.key, LABEL.key))


def _triple(value, name, kind=float):
    if value is None:
        return None
    try:
        values = tuple(kind(v) for v in value)
    except (TypeError, ValueError):
        values = ()
    if len(values) != 3 or any(v <= 0 for v in values):
        raise ValueError(f"`{name}` must be 3 positive numbers (depth/z, height/y, width/x). "
                         f"Received: {name}={value!r}")
    return values


@dataclasses.dataclass(frozen=True)
class _Options:
    batch_size: int | None
    volume_size: tuple[int, int, int] | None
    patch_size: tuple[int, int, int] | None
    patches_per_volume: int
    spacing: tuple[float, float, float] | None
    window: tuple[float, float] | None
    dtype: str | None
    extra_features: tuple[str, ...]
    seed: int | None
    sharded_here: bool = False  # An input_context chose this pipeline's share.
    label_mode: str = "int"
    mask_dtype: str | None = None  # label_mode="mask": the dataset's mask dtype (its manifest's).
    foreground_fraction: float = 0.0

    def __post_init__(self):
        if self.batch_size is not None and (isinstance(self.batch_size, bool) or
                                            not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise ValueError(f"`batch_size` must be an int >= 1 or None. Received: {self.batch_size!r}")
        if self.batch_size is not None and self.volume_size is None and self.patch_size is None:
            raise ValueError("Volumes differ in shape: `batch_size` needs `volume_size` or `patch_size`. "
                             f"Received: batch_size={self.batch_size}, volume_size=None, patch_size=None")
        if not isinstance(self.patches_per_volume, int) or self.patches_per_volume < 1:
            raise ValueError(f"`patches_per_volume` must be an int >= 1. Received: {self.patches_per_volume!r}")
        if self.window is not None and (len(self.window) != 2 or float(self.window[1]) <= 0):
            raise ValueError(f"`window` must be (center, width) with width > 0. Received: {self.window!r}")
        unknown = [k for k in self.extra_features if k not in VOLUME_EXTRA_FEATURES]
        if unknown:
            raise ValueError(f"`extra_features` are among {VOLUME_EXTRA_FEATURES}. Received: {unknown}")
        raw = self.volume_size is None and self.patch_size is None and self.spacing is None \
            and self.window is None
        if self.dtype is None and not raw:
            raise ValueError("`dtype=None` (volumes as stored) takes no resampling, patches or window.")
        if self.label_mode not in LABEL_MODES:
            raise ValueError(f"`label_mode` must be one of {LABEL_MODES}. Received: {self.label_mode!r}")
        fraction = self.foreground_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            raise ValueError(f"`foreground_fraction` must be a number in [0, 1]. Received: {fraction!r}")
        if fraction and (self.label_mode != "mask" or self.patch_size is None):
            raise ValueError("`foreground_fraction` centres patches on the mask's foreground: it needs "
                             "label_mode='mask' and `patch_size`. Received: foreground_fraction="
                             f"{fraction!r}, label_mode={self.label_mode!r}, patch_size={self.patch_size!r}")
        if self.dtype is not None and self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"`dtype` must be 'float32', 'float16', 'bfloat16' or None. Received: {self.dtype!r}")


def _shard_files(data_dir, split: str, version: int | None = None) -> list[str]:
    """The split's shard files as the manifest names them: every version's, or version `version`'s and older.

    A dataset that grew (`convert --append`) holds each version's shards under
    names of their own (`train_v00002-...`): the manifest, not a pattern, says
    which are the split's (a killed append's shards are no version's).
    """
    data_dir = os.fspath(data_dir)
    if version is None and not tf.io.gfile.exists(os.path.join(data_dir, MANIFEST_FILENAME)):
        # Shards written with the schema's encoder by another tool: the split's by their names.
        files = sorted(tf.io.gfile.glob(os.path.join(data_dir, f"{split}-*-of-*.tfrecord")))
        if not files:
            raise ValueError(f"No shards of split {split!r} in {data_dir!r} (looked for {split}-*-of-*.tfrecord).")
        return files
    manifest = load_manifest(data_dir, version)
    if split not in manifest.splits or not manifest.splits[split].shards:
        raise ValueError(f"No shards of split {split!r} in {data_dir!r}"
                         + ("" if version is None else f" at version {version}")
                         + f": its splits are {sorted(manifest.splits)}.")
    return [os.path.join(data_dir, s.file) for s in manifest.splits[split].shards]


def _decode(parsed, out_dtype):
    """The volume [d, h, w] in `out_dtype` (float32), whatever dtype each record stored."""
    raw, name = parsed[VOLUME.key], parsed[VOLUME_DTYPE.key]
    shape = tf.cast(parsed[VOLUME_SHAPE.key], tf.int32)
    index = tf.argmax(tf.cast(tf.equal(name, tf.constant(VOLUME_DTYPES)), tf.int32), output_type=tf.int32)
    tf.debugging.assert_equal(tf.reduce_any(tf.equal(name, tf.constant(VOLUME_DTYPES))), True,
                              message="volume/dtype is not one this reader knows")
    branches = [
        (lambda d=d: tf.cast(tf.io.decode_raw(raw, tf.as_dtype(d), little_endian=True), out_dtype))
        for d in VOLUME_DTYPES
    ]
    return tf.ensure_shape(tf.reshape(tf.switch_case(index, branches), shape), [None, None, None])


def _scale_affine(affine, old_shape, new_shape):
    """The affine of a volume resized from old to new (d, h, w), half-pixel centres as tf.image.resize."""
    old = tf.cast(old_shape, tf.float64)
    new = tf.cast(new_shape, tf.float64)
    s = old / new  # (z, y, x) scale; columns of the affine are (i=x, j=y, k=z)
    sx, sy, sz = s[2], s[1], s[0]
    m = tf.stack([
        tf.stack([sx, 0.0, 0.0, (sx - 1) / 2]),
        tf.stack([0.0, sy, 0.0, (sy - 1) / 2]),
        tf.stack([0.0, 0.0, sz, (sz - 1) / 2]),
        tf.constant([0.0, 0.0, 0.0, 1.0], tf.float64),
    ])
    return tf.linalg.matmul(affine, m)


def _resize(volume, size):
    """Trilinear resize of [d, h, w] to `size` (separable: in-plane bilinear, then along depth)."""
    size = tf.cast(size, tf.int32)
    v = tf.image.resize(volume[..., None], size[1:], method="bilinear")  # [d, h', w', 1]
    v = tf.transpose(v, [1, 0, 2, 3])  # [h', d, w', 1]
    v = tf.image.resize(v, tf.stack([size[0], size[2]]), method="bilinear")  # [h', d', w', 1]
    return tf.transpose(v, [1, 0, 2, 3])[..., 0]


def volume_dataset_from_tfrecords(data_dir, split: str, batch_size: int | None = None, *,
                                  volume_size=None, patch_size=None, patches_per_volume: int = 1,
                                  spacing=None, window=None, dtype: str | None = "float32",
                                  extra_features=(), shuffle: bool = False, seed: int | None = None,
                                  input_context: tf.distribute.InputContext | None = None,
                                  version: int | None = None, label_mode: str = "int",
                                  foreground_fraction: float = 0.0):
    """A dataset of (volume, label[, extras]) from a volume dataset's shards.

    Args:
      data_dir: The converter's output folder.
      split: 'train', 'validation', ...
      batch_size: Volumes (or patches) per batch; None for one at a time.
        Needs `volume_size` or `patch_size` (volumes differ in shape).
      volume_size: (depth, height, width): every volume resampled (trilinear) to it.
      patch_size: (depth, height, width): random crops of this size (a volume
        smaller than it is padded with its lowest value first).
      patches_per_volume: Crops per volume.
      spacing: (z, y, x) mm: each volume resampled to this spacing first.
      window: (center, width): values clipped to the window and scaled to [0, 1].
      dtype: The volume's output dtype; None yields each volume as stored
        (its own dtype, no preprocessing).
      extra_features: Among 'volume/affine' (float64 [4, 4], following every
        resampling and crop), 'volume/spacing', 'volume/shape', 'filename', ...
      shuffle: Shuffle the shard order and volumes (seeded).
      seed: Seeds the shuffles and the crops: the same seed, the same patches.
      input_context: From `tf.distribute`: this pipeline reads shard files
        `input_pipeline_id::num_input_pipelines`, as the image reader does (with
        fewer files than pipelines, every file and one record in every
        `num_input_pipelines`, with a warning); tf.distribute's own sharding is off.
      version: For a dataset that grew (`shardsmith convert --volumes --append`):
        None reads the latest version (every shard); N reads exactly what
        version N held (its shards, in the manifest's order).
      label_mode: 'int': each volume's class (int64, -1 without one); 'mask'
        (a dataset converted with --masks_dir): its label volume, int32
        [d, h, w, 1], which follows every geometric step of its volume with the
        same parameters (`spacing` and `volume_size` by nearest neighbour, never
        interpolated; the same patch offsets; padded with 0, background) and no
        other (`window` and `dtype` leave it as it is).
      foreground_fraction: With label_mode='mask' and `patch_size`: the share
        of patches (each patch drawn, seeded) centred on a random foreground
        voxel (id > 0) of its volume, as nnU-Net oversamples the foreground; a
        volume without foreground gets random patches. 0: every patch random.

    Returns:
      A `tf.data.Dataset` of (volume [d, h, w, 1], label int64) tuples (label_mode
      'mask': (volume, mask int32 [d, h, w, 1])), with a dict of `extra_features`
      as a third element when any are asked for.

    Raises:
      ValueError: For a bad argument, naming it; label_mode='mask' on a dataset
        without masks, naming what its records hold.
    """
    options = _Options(batch_size, _triple(volume_size, "volume_size", int), _triple(patch_size, "patch_size", int),
                       patches_per_volume, _triple(spacing, "spacing"),
                       None if window is None else tuple(float(v) for v in window), dtype,
                       tuple(extra_features), seed,
                       input_context is not None and input_context.num_input_pipelines > 1, label_mode,
                       foreground_fraction=foreground_fraction)
    if options.label_mode == "mask":
        options = dataclasses.replace(options, mask_dtype=_mask_dtype(data_dir, version))
    ds = _serialized(data_dir, split, shuffle, seed, input_context, version)
    keys = (VOLUME.key, VOLUME_DTYPE.key, VOLUME_SHAPE.key, LABEL.key, VOLUME_SPACING.key, VOLUME_AFFINE.key) + \
        tuple(k for k in options.extra_features
              if k not in (VOLUME_DTYPE.key, VOLUME_SHAPE.key, VOLUME_SPACING.key, VOLUME_AFFINE.key)) + \
        ((VOLUME_MASK.key,) if options.mask_dtype else ())
    spec = (VOLUME_MASK_SCHEMA if options.mask_dtype else VOLUME_SCHEMA).parse_spec(keys)
    stored = None
    if options.dtype is None:
        first = next(iter(ds.take(1).map(lambda s: tf.io.parse_single_example(s, spec)[VOLUME_DTYPE.key])), None)
        # A split without volumes (each rejected, its shards empty) yields nothing, in any dtype.
        stored = "uint8" if first is None else first.numpy().decode()
    resampled = options.spacing is not None or options.volume_size is not None
    if options.patch_size is not None and not resampled and _BITCAST_IS_LITTLE_ENDIAN:
        # Patches of volumes as stored: each record is parsed once and its
        # patches cut from its raw bytes, in one parallel map; only the
        # patches are converted to float and windowed (elementwise steps commute
        # with a crop), never the whole volume (`_patches_of_raw`). A mask's
        # patches are cut at the same offsets from its own stored ids.
        ds = ds.enumerate().map(_no_autograph(lambda i, s: _patches_of_raw(i, s, spec, options)),
                                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
        return _batched(ds, options)
    ds = ds.map(_no_autograph(lambda serialized: _parse(serialized, spec, options, stored)),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if options.dtype is not None:
        ds = ds.map(_no_autograph(lambda volume, parsed: _preprocess(volume, parsed, options)),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if options.patch_size is not None:
        ds = ds.enumerate().map(_no_autograph(lambda i, el: _patches(i, el[0], el[1], options)),
                                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
    ds = ds.map(_no_autograph(lambda volume, parsed: _finish(volume, parsed, options)),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return _batched(ds, options)


def _mask_dtype(data_dir, version) -> str:
    """The dtype of a dataset's label volumes, from its manifest; refused for a dataset without masks.

    Raises:
      ValueError: Naming what the dataset's records hold instead.
    """
    manifest = load_manifest(os.fspath(data_dir), version)
    section = (manifest.extra.get("targets") or {}).get("mask") or {}
    if VOLUME_MASK.key not in manifest.features:
        raise ValueError(f"label_mode='mask' reads the label volumes of a dataset converted with --volumes "
                         f"--masks_dir; the records of {os.fspath(data_dir)!r} hold no {VOLUME_MASK.key!r}: "
                         f"their features are {sorted(manifest.features)}. Use label_mode='int' (each volume's "
                         "class), or convert with --masks_dir.")
    dtype = section.get("dtype")
    if dtype not in VOLUME_MASK_DTYPES:
        raise ValueError(f"The manifest of {os.fspath(data_dir)!r} gives its masks' dtype (targets.mask.dtype) as "
                         f"{dtype!r}, not one of {VOLUME_MASK_DTYPES}: a damaged manifest.")
    return dtype


def _decode_mask(parsed, dtype: str):
    """The label volume [d, h, w] int32 of a parsed record, stored as `dtype` (its byte count checked)."""
    shape = tf.cast(parsed[VOLUME_SHAPE.key], tf.int32)
    raw = parsed[VOLUME_MASK.key]
    ids = tf.io.decode_raw(raw, tf.as_dtype(dtype), little_endian=True)
    tf.debugging.assert_equal(tf.size(ids), tf.reduce_prod(shape),
                              message=f"volume/mask does not hold volume/shape's voxels of {dtype}")
    return tf.ensure_shape(tf.reshape(tf.cast(ids, tf.int32), shape), [None, None, None])


def _stored_mask(parsed, dtype: str):
    """The label volume [d, h, w] of a parsed record in its stored dtype (`_decode_mask` without the int32 cast)."""
    shape = tf.cast(parsed[VOLUME_SHAPE.key], tf.int32)
    ids = tf.io.decode_raw(parsed[VOLUME_MASK.key], tf.as_dtype(dtype), little_endian=True)
    tf.debugging.assert_equal(tf.size(ids), tf.reduce_prod(shape),
                              message=f"volume/mask does not hold volume/shape's voxels of {dtype}")
    return tf.ensure_shape(tf.reshape(ids, shape), [None, None, None])


def _resize_nearest(mask, size):
    """Nearest-neighbour resize of ids [d, h, w] to `size`, on `_resize`'s grid (half-voxel centres), separable."""
    size = tf.cast(size, tf.int32)
    m = tf.image.resize(mask[..., None], size[1:], method="nearest")  # [d, h', w', 1]
    m = tf.transpose(m, [1, 0, 2, 3])
    m = tf.image.resize(m, tf.stack([size[0], size[2]]), method="nearest")
    return tf.cast(tf.transpose(m, [1, 0, 2, 3])[..., 0], tf.int32)


def _batched(ds: tf.data.Dataset, options: _Options) -> tf.data.Dataset:
    if options.batch_size is not None:
        ds = ds.batch(options.batch_size)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    if options.sharded_here:
        # This pipeline's share is chosen here: tf.distribute must not shard it again.
        tf_options = tf.data.Options()
        tf_options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        ds = ds.with_options(tf_options)
    return ds


def _serialized(data_dir, split: str, shuffle: bool, seed, input_context, version=None) -> tf.data.Dataset:
    """The split's serialized records: this pipeline's share, shuffled (seeded) if asked.

    The image reader's rules under `tf.distribute`: pipeline i of n reads shard files i, i+n, ...;
    with fewer files than pipelines each reads every file and keeps one record in every n (in
    file order, before any shuffle, so the shares are disjoint whatever the seed), with a warning.
    """
    files = _shard_files(data_dir, split, version)
    pipelines = 1 if input_context is None else input_context.num_input_pipelines
    by_record = 1 < pipelines and len(files) < pipelines
    ds = tf.data.Dataset.from_tensor_slices(files)
    if pipelines > 1 and not by_record:
        ds = ds.shard(pipelines, input_context.input_pipeline_id)
    if shuffle and not by_record:
        ds = ds.shuffle(len(files), seed=seed)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=2, deterministic=True,
                       num_parallel_calls=tf.data.AUTOTUNE)
    if by_record:
        _LOG.warning("Split %r of %s has %d shard file(s) for %d input pipelines: every pipeline reads all "
                     "files and keeps one record in every %d (convert with --min_shards %d to read whole files).",
                     split, data_dir, len(files), pipelines, pipelines, pipelines)
        ds = ds.shard(pipelines, input_context.input_pipeline_id)
    if shuffle:
        ds = ds.shuffle(16, seed=seed)
    return ds


def _parse(serialized, spec, options: _Options, stored: str | None):
    """(volume, the parsed features later steps use); as stored (`stored` dtype) when `options.dtype` is None."""
    parsed = VOLUME_SCHEMA.finish_parsed(tf.io.parse_single_example(serialized, spec))
    if options.dtype is None:
        tf.debugging.assert_equal(parsed[VOLUME_DTYPE.key], stored,
                                  message="dtype=None: the volumes of this split differ in dtype")
        volume = tf.reshape(tf.io.decode_raw(parsed[VOLUME.key], tf.as_dtype(stored), little_endian=True),
                            tf.cast(parsed[VOLUME_SHAPE.key], tf.int32))
        volume = tf.ensure_shape(volume, [None, None, None])
    else:
        volume = _decode(parsed, tf.float32)
    # Only what later steps use travels on: not the encoded voxels.
    wanted = {LABEL.key, VOLUME_AFFINE.key, VOLUME_SPACING.key, *options.extra_features}
    out = {k: v for k, v in parsed.items() if k in wanted}
    if options.mask_dtype:  # The label volume travels with its volume, through every step.
        out[VOLUME_MASK.key] = _decode_mask(parsed, options.mask_dtype)
    return volume, out


def _preprocess(volume, parsed, options: _Options):
    """Resampled to `spacing`, then to `volume_size`, then windowed; the affine and spacing follow."""
    affine = parsed[VOLUME_AFFINE.key]
    vox_spacing = parsed[VOLUME_SPACING.key]
    if options.spacing is not None:
        shape = tf.cast(tf.shape(volume), tf.float64)
        new = tf.maximum(tf.cast(tf.round(shape * vox_spacing / tf.constant(options.spacing, tf.float64)),
                                 tf.int32), 1)
        affine = _scale_affine(affine, tf.shape(volume), new)
        volume = _resize(volume, new)
        vox_spacing = tf.constant(options.spacing, tf.float64)
        if options.mask_dtype:
            parsed = {**parsed, VOLUME_MASK.key: _resize_nearest(parsed[VOLUME_MASK.key], new)}
    if options.volume_size is not None:
        new = tf.constant(options.volume_size, tf.int32)
        old = tf.shape(volume)
        affine = _scale_affine(affine, old, new)
        vox_spacing = vox_spacing * tf.cast(old, tf.float64) / tf.cast(new, tf.float64)
        volume = _resize(volume, new)
        if options.mask_dtype:
            parsed = {**parsed, VOLUME_MASK.key: _resize_nearest(parsed[VOLUME_MASK.key], new)}
    if options.window is not None:
        center, width = options.window
        low = center - width / 2
        volume = tf.clip_by_value((volume - low) / width, 0.0, 1.0)
    parsed = dict(parsed)
    parsed[VOLUME_AFFINE.key] = affine
    parsed[VOLUME_SPACING.key] = vox_spacing
    return volume, parsed


# `tf.bitcast` reads the host's byte order; the records are little-endian.
_BITCAST_IS_LITTLE_ENDIAN = sys.byteorder == "little"


def _offsets(index, shape, options):
    """The seeded first voxels (k, j, i) of a volume's patches, in its padded frame; and its padding."""
    patch = tf.constant(options.patch_size, tf.int32)
    count = options.patches_per_volume
    base_seed = 0 if options.seed is None else int(options.seed)
    pad = tf.maximum(patch - shape, 0)
    room = shape + pad - patch + 1
    draws = tf.random.stateless_uniform([count, 3], seed=tf.stack([tf.cast(base_seed, tf.int64), index]),
                                        minval=0, maxval=2**31 - 1, dtype=tf.int64)
    return tf.cast(draws % tf.cast(room, tf.int64), tf.int32), pad


# Columns of a busy row counted together as uint8 by `foreground_voxels` (at most 255 fit).
_CHUNK = 128


def foreground_voxels(mask, ranks):
    """(n, flat): a mask's foreground voxels (id > 0) counted, and the flat (row-major) index of its
    (rank % n)-th foreground voxel for each of `ranks` (int64 [m]; index 0 when there is none).

    The same voxels as `tf.where(tf.reshape(mask, [-1]) > 0)` gathered at `ranks % n`, without
    listing every foreground voxel: the rows (innermost lines) holding any foreground are found
    by one `reduce_max` over the mask in its own dtype, only those rows are compared and counted,
    and only the chosen rows searched (about 3x less CPU for a 3 %-foreground CT mask).
    """
    width = tf.shape(mask, out_type=tf.int64)[-1]
    rows = tf.reshape(mask, tf.stack([-1, width]))
    # Rows holding foreground; then one row more (the first), to gather from when there is none.
    busy = tf.where(tf.reduce_max(rows, axis=1) > 0)[:, 0]
    busy = tf.concat([busy, tf.zeros([1], tf.int64)], 0)
    lines = tf.gather(rows, busy) > 0  # [r + 1, width]
    # Counted as uint8 in chunks of 128 columns (a chunk's count fits), then the chunks' counts: a
    # byte per voxel of the busy rows, not an int32 copy of them.
    chunks = (width + _CHUNK - 1) // _CHUNK
    padding = tf.stack([tf.zeros([2], tf.int64), tf.stack([0, chunks * _CHUNK - width])])
    ones = tf.pad(tf.cast(lines, tf.uint8), padding)
    per_chunk = tf.reduce_sum(tf.reshape(ones, tf.stack([-1, chunks, _CHUNK])), axis=2)
    counts = tf.reduce_sum(tf.cast(per_chunk, tf.int64), axis=1)[:-1]
    ends = tf.cumsum(counts)  # Foreground voxels up to each busy row's end.
    n = tf.reduce_sum(counts)
    ranks = ranks % tf.maximum(n, 1)
    at = tf.searchsorted(ends, ranks, side="right")  # The busy row holding each rank (r when none).
    within = ranks - (tf.gather(tf.concat([[0], ends], 0), at))
    # In each chosen row, the first column where its foreground count passes `within`.
    seen = tf.cumsum(tf.cast(tf.gather(lines, at), tf.int64), axis=1)
    column = tf.argmax(tf.cast(seen > within[:, None], tf.int32), axis=1, output_type=tf.int64)
    return n, tf.gather(busy, at) * width + column


def _foreground_offsets(index, offsets, pad, mask, options):
    """`offsets` with a seeded share (`foreground_fraction`) of them centred on random foreground voxels.

    Each patch draws (seeded by the volume's index, apart from `_offsets`' draws) whether it
    is a foreground patch and which foreground voxel it centres; the patch is then moved to
    hold it, kept inside the padded volume. A volume without foreground keeps `offsets`.
    """
    count = options.patches_per_volume
    patch = tf.constant(options.patch_size, tf.int32)
    base_seed = 0 if options.seed is None else int(options.seed)
    seed = tf.stack([tf.cast(base_seed, tf.int64), -1 - index])  # Never an index `_offsets` draws with.
    share = tf.random.stateless_uniform([count], seed=seed, dtype=tf.float32)
    which = tf.random.stateless_uniform([count], seed=seed[::-1], minval=0, maxval=2**31 - 1, dtype=tf.int64)
    wanted = share < options.foreground_fraction
    # Searched only where a patch of the volume wants the foreground (at 0.33, 4 patches: 4 volumes in 5).
    n, flat = tf.cond(tf.reduce_any(wanted), lambda: foreground_voxels(mask, which),
                      lambda: (tf.zeros([], tf.int64), tf.zeros([count], tf.int64)))
    centres = tf.cast(tf.transpose(tf.unravel_index(flat, tf.shape(mask, out_type=tf.int64))), tf.int32)
    room = tf.shape(mask) + pad - patch + 1
    centred = tf.clip_by_value(centres + pad // 2 - patch // 2, 0, room - 1)
    chosen = tf.logical_and(wanted, n > 0)
    return tf.where(chosen[:, None], centred, offsets)


def _patch_extras(parsed, offsets, pad, count):
    """Each patch's features: the volume's, repeated; the affine moved to the patch's first voxel."""
    # The affine of each patch: its first voxel (k, j, i) = offset - pad before.
    start = tf.cast(offsets - pad // 2, tf.float64)  # (k, j, i)
    corner = tf.stack([start[:, 2], start[:, 1], start[:, 0], tf.ones([count], tf.float64)], axis=1)
    affine = parsed[VOLUME_AFFINE.key]
    origins = tf.linalg.matvec(affine[None], corner)  # [count, 4]
    affines = tf.concat([tf.tile(affine[None, :, :3], [count, 1, 1]), origins[:, :, None]], axis=2)
    many = {k: tf.repeat(v[None], count, axis=0) for k, v in parsed.items() if k != VOLUME_AFFINE.key}
    many[VOLUME_AFFINE.key] = affines
    return many


def _patches(index, volume, parsed, options):
    """`patches_per_volume` seeded crops of a decoded (resampled) volume, padded with its lowest value."""
    count = options.patches_per_volume
    patch = tf.constant(options.patch_size, tf.int32)
    offsets, pad = _offsets(index, tf.shape(volume), options)
    if options.foreground_fraction:
        offsets = _foreground_offsets(index, offsets, pad, parsed[VOLUME_MASK.key], options)
    volume = tf.cond(tf.reduce_any(pad > 0),
                     lambda: tf.pad(volume, tf.stack([pad // 2, pad - pad // 2], axis=1),
                                    constant_values=tf.reduce_min(volume)),
                     lambda: volume)
    patches = tf.stack([tf.slice(volume, offsets[n], patch) for n in range(count)])
    patches = tf.ensure_shape(patches, [count, *options.patch_size])
    if not options.mask_dtype:
        return patches, _patch_extras(parsed, offsets, pad, count)
    # The mask cut at the same offsets, padded with 0 (background) where the volume is.
    mask = tf.pad(parsed[VOLUME_MASK.key], tf.stack([pad // 2, pad - pad // 2], axis=1))
    masks = tf.ensure_shape(tf.stack([tf.slice(mask, offsets[n], patch) for n in range(count)]),
                            [count, *options.patch_size])
    extras = _patch_extras({k: v for k, v in parsed.items() if k != VOLUME_MASK.key}, offsets, pad, count)
    return patches, {**extras, VOLUME_MASK.key: masks}


def _patches_of_raw(index, serialized, spec, options):
    """A record's patches cut from its stored bytes, then converted and windowed (no resampling).

    The voxels are viewed as uint8 [d, h, w, itemsize] and each patch's
    valid part sliced there, then bitcast to the stored dtype and cast to
    float: one copy of the volume (its bytes out of the record), none per
    patch beyond the patch itself. A patch reaching past a volume smaller
    than it is padded with the volume's lowest value, as `_patches` does.
    With masks (label_mode='mask'), each mask patch is cut at the same
    offsets from the stored ids and padded with 0, and foreground centres
    are drawn from the stored ids: `_patches`' values, bit for bit.
    """
    parsed = VOLUME_SCHEMA.finish_parsed(tf.io.parse_single_example(serialized, spec))
    name = parsed[VOLUME_DTYPE.key]
    known = tf.equal(name, tf.constant(VOLUME_DTYPES))
    tf.debugging.assert_equal(tf.reduce_any(known), True, message="volume/dtype is not one this reader knows")
    which = tf.argmax(tf.cast(known, tf.int32), output_type=tf.int32)
    sizes = tf.constant([tf.as_dtype(d).size for d in VOLUME_DTYPES], tf.int32)
    itemsize = sizes[which]
    shape = tf.cast(parsed[VOLUME_SHAPE.key], tf.int32)
    raw = tf.reshape(tf.io.decode_raw(parsed[VOLUME.key], tf.uint8), tf.concat([shape, [itemsize]], 0))
    count = options.patches_per_volume
    size = tf.constant(options.patch_size, tf.int32)
    offsets, pad = _offsets(index, shape, options)
    # The label volume in its stored dtype (uint8/uint16, little-endian as this host): its patches
    # are cut at the volume's offsets and only they are converted to int32.
    mask = _stored_mask(parsed, options.mask_dtype) if options.mask_dtype else None
    if options.foreground_fraction:
        offsets = _foreground_offsets(index, offsets, pad, mask, options)

    def as_float(part):  # uint8 [..., itemsize] -> float32 [...], by the stored dtype
        def branch(d):
            if tf.as_dtype(d).size == 1:
                return lambda: tf.cast(tf.bitcast(part[..., 0], tf.as_dtype(d)), tf.float32)
            return lambda: tf.cast(tf.bitcast(part, tf.as_dtype(d)), tf.float32)
        return tf.switch_case(which, [branch(d) for d in VOLUME_DTYPES])

    def whole():  # Every patch inside the volume: sliced as bytes, converted together.
        parts = [tf.slice(raw, tf.concat([offsets[n], [0]], 0), tf.concat([size, [itemsize]], 0))
                 for n in range(count)]
        if mask is None:
            return as_float(tf.stack(parts))
        masks = tf.cast(tf.stack([tf.slice(mask, offsets[n], size) for n in range(count)]), tf.int32)
        return as_float(tf.stack(parts)), masks

    def padded():  # A volume smaller than a patch: each patch's valid part, padded with the lowest value.
        lowest = tf.reduce_min(as_float(raw))
        patches, masks = [], []
        for n in range(count):
            start = offsets[n] - pad // 2  # In the volume's own frame: < 0 where padded.
            low = tf.maximum(start, 0)
            high = tf.minimum(start + size, shape)
            part = as_float(tf.slice(raw, tf.concat([low, [0]], 0), tf.concat([high - low, [itemsize]], 0)))
            before = low - start
            around = tf.stack([before, size - (high - low) - before], axis=1)
            patches.append(tf.pad(part, around, constant_values=lowest))
            if mask is not None:  # Padded with 0, background, as `_patches` pads it.
                masks.append(tf.pad(tf.cast(tf.slice(mask, low, high - low), tf.int32), around))
        return tf.stack(patches) if mask is None else (tf.stack(patches), tf.stack(masks))

    cut = tf.cond(tf.reduce_any(pad > 0), padded, whole)
    patches = tf.ensure_shape(cut if mask is None else cut[0], [count, *options.patch_size])
    if options.window is not None:
        center, width = options.window
        patches = tf.clip_by_value((patches - (center - width / 2)) / width, 0.0, 1.0)
    wanted = {LABEL.key, VOLUME_AFFINE.key, VOLUME_SPACING.key, *options.extra_features}
    parsed = {k: v for k, v in parsed.items() if k in wanted}
    extras = _patch_extras(parsed, offsets, pad, count)
    if mask is not None:
        extras[VOLUME_MASK.key] = tf.ensure_shape(cut[1], [count, *options.patch_size])
    # Finished here too (`_finish` is elementwise): no map per patch after the unbatch.
    return _finish(patches, extras, options)


def _finish(volume, parsed, options: _Options):
    """(volume [d, h, w, 1] in `dtype`, label[, extras])."""
    if options.dtype is not None:
        volume = tf.cast(volume, options.dtype)
    volume = volume[..., None]
    target = parsed[VOLUME_MASK.key][..., None] if options.mask_dtype else parsed[LABEL.key]
    if options.extra_features:
        return volume, target, {k: parsed[k] for k in options.extra_features}
    return volume, target
