"""`image_dataset_from_tfrecords`: a converted dataset as a batched `tf.data.Dataset`.

The options come in three frozen, self-validating groups (`ReadOptions`,
`ImageOptions`, `ShuffleOptions`), composed and cross-checked by
`ReaderConfig`. `build_dataset` runs named stages, all AUTOTUNEd:

  records (`_shards_records`, for `shuffle=True`, also spelled 'shards', or
     False): shard files from the manifest (shuffled per epoch with the
     seed) -> parallel interleave of the shards, each read in order record
     by record at the offsets of its index file (`record_index.read_records_at`,
     so a damaged record can be skipped alone; `TFRecordDataset`s for
     datasets whose manifest lists no index files) -> record shuffle buffer
     (bounded, holds encoded records only).
     Or (`_global_records`, `shuffle="global"`): a true permutation of every
     record of the split per epoch, read record by record at the offsets of
     the converter's index files (`readers.global_shuffle`); the read can
     then be resumed exactly from a `readers.ReadPosition`.
  -> parse: vectorised, small record batches
  -> decode and preprocess, per example: decode + resize policy or standard
     augmentation; then an optional user augmentation function
  -> batch and finish: batch -> per batch: scale/normalise, cast, labels
  -> `_finish_dataset`: cardinality, prefetch, options.

For small images (mean record size up to 32 KiB) with batching and without a
callable `augment`, parse, decode, preprocess and finish run as one function
per output batch instead (`_BY_BATCH`; same results, same order), which
saves the per-element overhead that dominates when decoding is cheap; a split
of JPEGs of one size (the manifest's image stats) traces that path alone.

Nothing is cached unless `cache` is set. Without `seed`, the pipeline runs
non-deterministically (faster: workers need not wait for each other); with a
`seed` it is deterministic by default and gives the same batches on every
run, augmentation included.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from readers import decode, global_shuffle, preprocess, record_index
from readers.metadata import SplitFiles, load_split
from readers.positions import ReadPosition
from schemas.features import HEIGHT, IMAGE, LABEL, WIDTH, ImageRecord

__all__ = [
    "LABEL_MODES", "AUGMENTATIONS", "SHUFFLE_MODES", "OPTION_NAMES", "ImageOptions",
    "ShuffleOptions", "ReadOptions", "ReaderConfig", "image_dataset_from_tfrecords",
    "without_extras",
]

logger = logging.getLogger(__name__)

LABEL_MODES = ("int", "categorical", "binary", None)
AUGMENTATIONS = (None, "standard")
# True is 'shards'; False reads in manifest order.
SHUFFLE_MODES = (True, False, "shards", "global")

# Records parsed per vectorised `tf.io.parse_example` call.
_PARSE_BATCH = 64
# Most shard files read at once by the interleave.
_MAX_CYCLE_LENGTH = 16
# Default record shuffle buffer: at most this many records ...
_DEFAULT_SHUFFLE_RECORDS = 1024
# ... and at most about this many bytes of encoded records.
_SHUFFLE_RAM_BUDGET = 256 * 1024 * 1024
_SEED_MODULUS = 2**31 - 1

# The reader's own map functions are plain TensorFlow ops (their Python `if`s
# test Python values only), so AutoGraph's source transformation is skipped:
# it cost a second or more of every dataset's construction. A user's
# `augment` callable is still converted.
_no_autograph = tf.autograph.experimental.do_not_convert
# Records of at most this mean size are decoded a batch per function call
# (see `build_dataset`); larger ones one per call, in parallel.
_BATCHED_DECODE_MAX_RECORD_BYTES = 32 * 1024


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be True or False. Received: {name}={value!r}")


def _check_per_channel(name: str, value, allow_zero: bool = True) -> Any:
    """A float or a sequence of floats (one per channel), as a tuple or float."""
    if _is_number(value):
        values = (value,)
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0 and all(
        _is_number(v) for v in value
    ):
        values = tuple(value)
    else:
        raise TypeError(
            f"`{name}` must be a number or a sequence of numbers (one per channel). "
            f"Received: {name}={value!r}"
        )
    if not allow_zero and any(v == 0 for v in values):
        raise ValueError(f"`{name}` must not contain zero. Received: {name}={value!r}")
    return float(value) if _is_number(value) else tuple(float(v) for v in values)


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """What the output images are; validated on construction.

    Attributes:
      image_size: (height, width) of the output images. None keeps the stored
        sizes (only with `batch_size=None`, as sizes differ). Keras's
        `image_dataset_from_directory` defaults to (256, 256); the default
        here is (224, 224), the input size of the ImageNet models in
        `keras.applications` (ResNet, EfficientNetB0, MobileNet, ...) and of
        the 'standard' augmentation recipe.
      color_mode: 'rgb' (3 channels), 'grayscale' (1) or 'rgba' (4).
      resize: 'stretch' (as Keras's default), 'crop' (Keras's
        `crop_to_aspect_ratio=True`) or 'pad' (`pad_to_aspect_ratio=True`),
        see `readers.preprocess`. Ignored when `augment='standard'`.
      crop_fraction: With resize='crop', the centre fraction of the window to
        keep; 0.875 gives the ImageNet evaluation crop.
      interpolation: Resize method, one of `preprocess.INTERPOLATIONS`.
      dtype: Output pixel dtype: 'float32', 'bfloat16', 'float16' (values in
        0-255 unless scaled), 'uint8', or 'uint16' (decodes 16-bit PNGs at
        full depth; 8-bit sources are multiplied by 257).
      scale: Optional multiplier applied per batch, e.g. 1/255 (float dtypes).
      normalize: Optional (mean, std), each a float or per-channel sequence,
        applied after `scale` as (x - mean) / std (float dtypes).
      augment: None; 'standard' for the ImageNet training recipe (random
        resized crop fused with JPEG decoding, random horizontal flip); or a
        callable `fn(image) -> image` applied per example before batching to a
        float32 [height, width, channels] image of pixel values (before
        `scale`), returning the same shape. Its random ops are only
        reproducible if it uses stateless ops seeded from its input.
    """

    image_size: tuple[int, int] | None = (224, 224)
    color_mode: str = "rgb"
    resize: str = "stretch"
    crop_fraction: float = 1.0
    interpolation: str = "bilinear"
    dtype: str = "float32"
    scale: float | tuple[float, ...] | None = None
    normalize: tuple[Any, Any] | None = None
    augment: str | Callable[[tf.Tensor], tf.Tensor] | None = None

    def __post_init__(self):
        if self.image_size is not None:
            self._set("image_size", _check_image_size(self.image_size))
        if self.color_mode not in decode.CHANNELS_BY_COLOR_MODE:
            raise ValueError(
                f"`color_mode` must be one of {tuple(decode.CHANNELS_BY_COLOR_MODE)}. "
                f"Received: color_mode={self.color_mode!r}"
            )
        self._check_resize()
        self._set("dtype", _check_dtype(self.dtype))
        self._check_pixel_transform()
        if not (self.augment in AUGMENTATIONS or callable(self.augment)):
            raise ValueError(
                f"`augment` must be one of {AUGMENTATIONS} or a callable "
                f"fn(image) -> image. Received: augment={self.augment!r}"
            )
        if self.augment is not None and self.image_size is None:
            raise ValueError(
                "`augment` needs a fixed `image_size`. "
                f"Received: augment={self.augment!r}, image_size=None"
            )

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)

    def _check_resize(self) -> None:
        if self.resize not in preprocess.RESIZE_POLICIES:
            raise ValueError(
                f"`resize` must be one of {preprocess.RESIZE_POLICIES}. "
                f"Received: resize={self.resize!r}"
            )
        if not _is_number(self.crop_fraction) or not 0 < self.crop_fraction <= 1:
            raise ValueError(
                "`crop_fraction` must be a number in (0, 1]. "
                f"Received: crop_fraction={self.crop_fraction!r}"
            )
        if self.crop_fraction != 1 and self.resize != "crop":
            raise ValueError(
                "`crop_fraction` only applies to resize='crop'. Received: "
                f"crop_fraction={self.crop_fraction!r}, resize={self.resize!r}"
            )
        if self.interpolation not in preprocess.INTERPOLATIONS:
            raise ValueError(
                f"`interpolation` must be one of {preprocess.INTERPOLATIONS}. "
                f"Received: interpolation={self.interpolation!r}"
            )

    def _check_pixel_transform(self) -> None:
        """`scale` and `normalize`: float output only, one value or one per channel."""
        if self.scale is not None:
            self._set("scale", _check_per_channel("scale", self.scale))
        if self.normalize is not None:
            if not isinstance(self.normalize, Sequence) or len(self.normalize) != 2:
                raise TypeError(
                    "`normalize` must be a pair (mean, std). "
                    f"Received: normalize={self.normalize!r}"
                )
            self._set(
                "normalize",
                (
                    _check_per_channel("normalize mean", self.normalize[0]),
                    _check_per_channel("normalize std", self.normalize[1], allow_zero=False),
                ),
            )
        for name, value in (("scale", self.scale), ("normalize", self.normalize)):
            if value is None:
                continue
            if tf.as_dtype(self.dtype).is_integer:
                raise ValueError(
                    f"`{name}` needs a float `dtype` {('float32', 'bfloat16', 'float16')}. "
                    f"Received: {name}={value!r}, dtype={self.dtype!r}"
                )
            for part in value if name == "normalize" else (value,):
                if isinstance(part, tuple) and len(part) not in (1, self.channels):
                    raise ValueError(
                        f"`{name}` must have 1 or {self.channels} values for "
                        f"color_mode={self.color_mode!r}. Received: {name}={value!r}"
                    )

    @property
    def channels(self) -> int:
        return decode.CHANNELS_BY_COLOR_MODE[self.color_mode]

    @property
    def depth(self) -> tf.DType:
        """The integer dtype images are decoded to (16 bits only for uint16 output)."""
        return tf.uint16 if self.dtype == "uint16" else tf.uint8

    @property
    def standard_augment(self) -> bool:
        return self.augment == "standard"


@dataclasses.dataclass(frozen=True)
class ShuffleOptions:
    """In what order records are read; validated on construction.

    Attributes:
      shuffle: True or 'shards': shuffle the shard files per epoch and the
        records in a buffer (cheap, approximate). 'global': a new permutation
        of every record of the split each epoch, derived from (seed, epoch),
        read record by record at the offsets of the index files; resumable
        exactly with `start`, and the same whatever the number of input
        pipelines (see `readers.global_shuffle`). False: manifest order.
      seed: Seed for shuffling and augmentation; with a seed the pipeline is
        reproducible. With shuffle='global' and no seed, one is drawn and
        logged (and set as the dataset's `seed` attribute).
      deterministic: Keep element order reproducible. None: True when `seed`
        is set, else False (faster). (Keras's `image_dataset_from_directory`
        keeps tf.data's deterministic default.)
      shuffle_buffer: Records in the shuffle buffer. None: up to 1024,
        limited to about 256 MiB of encoded records. Not with 'global'.
      start: shuffle='global' only: the `readers.ReadPosition` to start at,
        e.g. `tracker.position()` after restoring a checkpoint; needs the
        `seed` of the run being resumed. Reading starts at `start.consumed`
        of epoch `start.epoch`; without `repeat` the dataset ends with that
        epoch (and iterating it again reads the same epoch: for several
        epochs use `repeat=True` with `steps_per_epoch`).
    """

    shuffle: bool | str = True
    seed: int | None = None
    deterministic: bool | None = None
    shuffle_buffer: int | None = None
    start: ReadPosition | None = None

    def __post_init__(self):
        if not any(self.shuffle is m or (isinstance(m, str) and self.shuffle == m)
                   for m in SHUFFLE_MODES):
            raise TypeError(
                f"`shuffle` must be one of {SHUFFLE_MODES}. Received: shuffle={self.shuffle!r}"
            )
        if self.deterministic is not None:
            _check_bool("deterministic", self.deterministic)
        if self.seed is not None and not _is_int(self.seed):
            raise TypeError(f"`seed` must be an integer or None. Received: seed={self.seed!r}")
        if self.shuffle_buffer is not None and (
            not _is_int(self.shuffle_buffer) or self.shuffle_buffer < 1
        ):
            raise ValueError(
                "`shuffle_buffer` must be a positive integer or None. "
                f"Received: shuffle_buffer={self.shuffle_buffer!r}"
            )
        if self.start is not None and not isinstance(self.start, ReadPosition):
            raise TypeError(
                "`start` must be a readers.ReadPosition or None. "
                f"Received: start={self.start!r}"
            )
        if self.mode == "global":
            if self.shuffle_buffer is not None:
                raise ValueError(
                    "`shuffle_buffer` does not apply to shuffle='global', which reads every "
                    f"record by offset. Received: shuffle_buffer={self.shuffle_buffer!r}, "
                    "shuffle='global'"
                )
            if self.start is not None and self.seed is None:
                raise ValueError(
                    "`start` resumes a shuffle='global' read and needs that run's `seed`. "
                    f"Received: start={self.start!r}, seed=None"
                )
        elif self.start is not None:
            raise ValueError(
                "`start` applies to shuffle='global' only. "
                f"Received: start={self.start!r}, shuffle={self.shuffle!r}"
            )

    @property
    def mode(self) -> str | None:
        """'shards', 'global', or None (no shuffling)."""
        if self.shuffle is True:
            return "shards"
        return self.shuffle or None

    @property
    def is_deterministic(self) -> bool:
        """Whether element order is reproducible, resolving None (always with
        shuffle='global', whose order is the point)."""
        if self.deterministic is None:
            return self.seed is not None or self.mode == "global"
        return self.deterministic


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How records are read and what each element holds; validated on construction.

    Attributes:
      batch_size: Examples per batch, or None for unbatched examples. In
        `distributed_dataset` it is the global batch size.
      label_mode: 'int' (int32 labels [batch]), 'categorical' (float32 one-hot
        [batch, num_classes]), 'binary' (float32 [batch, 1], two classes only)
        or None (no labels), as in Keras.
      repeat: Repeat forever (pass `steps_per_epoch` to `fit`). Every
        epoch of records (batches may straddle two epochs) holds every record
        exactly once, in a new order; when not deterministic, a few records
        near the boundary may swap epochs.
      drop_remainder: Drop the last, smaller batch.
      extra_features: Further record features to return, e.g.
        `(FILENAME.key,)`; any feature of the dataset's schema except image
        and label. Such elements are not for `model.fit`/`evaluate` as they
        are (Keras would take the extras for sample weights): map them
        through `without_extras` for that.
      cache: False; True to cache the encoded records in memory during the
        first epoch; or a file path prefix to cache them on disk. Later epochs
        keep the first epoch's file order; the record shuffle still varies.
        Not with shuffle='global'.
      max_bad_records: Damaged records (bad CRC, truncated) skipped per
        epoch and input pipeline before the read fails; each is logged with
        its shard, byte offset and (if it parses) file name, and leaves its
        batch one record short (the batch dimension is then not static); the
        rest of its shard is read. With 0 (the default), the first one fails
        the read: in 'global' mode with that description; in the 'shards'
        and unshuffled modes, which then read with TensorFlow's reader
        (quicker to the first batch), with its DataLossError. A budget needs
        the index files (every dataset the converter writes lists them).
    """

    batch_size: int | None = 32
    label_mode: str | None = "int"
    repeat: bool = False
    drop_remainder: bool = False
    extra_features: tuple[str, ...] = ()
    cache: bool | str = False
    max_bad_records: int = 0

    def __post_init__(self):
        if self.batch_size is not None and (not _is_int(self.batch_size) or self.batch_size < 1):
            raise ValueError(
                "`batch_size` must be a positive integer or None. "
                f"Received: batch_size={self.batch_size!r}"
            )
        for name in ("repeat", "drop_remainder"):
            _check_bool(name, getattr(self, name))
        if self.label_mode not in LABEL_MODES:
            raise ValueError(
                f"`label_mode` must be one of {LABEL_MODES}. "
                f"Received: label_mode={self.label_mode!r}"
            )
        object.__setattr__(self, "extra_features", _check_extra_features(self.extra_features))
        if not (
            isinstance(self.cache, bool)
            or (isinstance(self.cache, (str, os.PathLike)) and os.fspath(self.cache))
        ):
            raise TypeError(
                "`cache` must be True, False or a file path prefix. "
                f"Received: cache={self.cache!r}"
            )
        if not _is_int(self.max_bad_records) or self.max_bad_records < 0:
            raise ValueError(
                "`max_bad_records` must be a non-negative integer. "
                f"Received: max_bad_records={self.max_bad_records!r}"
            )

    def check_schema(self, split_files: SplitFiles) -> None:
        """Checks the options that depend on the dataset itself.

        Raises:
          ValueError: If an extra feature is not in the dataset's schema, or
            label_mode='binary' is asked of a dataset without two classes.
        """
        keys = [spec.key for spec in split_files.schema.features]
        allowed = [k for k in keys if k not in (IMAGE.key, LABEL.key)]
        unknown = [k for k in self.extra_features if k not in allowed]
        if unknown:
            raise ValueError(
                f"`extra_features` must be a subset of this dataset's features {allowed}. "
                f"Received: extra_features={self.extra_features!r}"
            )
        if self.label_mode == "binary" and len(split_files.class_names) != 2:
            raise ValueError(
                "label_mode='binary' needs exactly 2 classes; this dataset has "
                f"{len(split_files.class_names)}: {list(split_files.class_names)}. Use "
                "label_mode='int' or 'categorical'. Received: label_mode='binary'"
            )


def _check_image_size(size) -> tuple[int, int]:
    if (
        not isinstance(size, Sequence)
        or isinstance(size, str)
        or len(size) != 2
        or not all(_is_int(s) and s > 0 for s in size)
    ):
        raise ValueError(
            "`image_size` must be a tuple of two positive integers "
            f"(height, width). Received: image_size={size!r}"
        )
    return tuple(size)


def _check_dtype(dtype) -> str:
    """The canonical name of an output dtype given as a name or `tf.DType`."""
    try:
        name = tf.as_dtype(dtype).name
    except TypeError:
        name = None
    if name not in preprocess.OUTPUT_DTYPES:
        raise ValueError(
            f"`dtype` must be one of {preprocess.OUTPUT_DTYPES}. Received: dtype={dtype!r}"
        )
    return name


def _check_extra_features(keys) -> tuple[str, ...]:
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise TypeError(
            "`extra_features` must be a tuple of feature keys, e.g. "
            f"(FILENAME.key,). Received: extra_features={keys!r}"
        )
    if not all(isinstance(k, str) for k in keys):
        raise TypeError(
            "`extra_features` must contain feature keys (str). "
            f"Received: extra_features={keys!r}"
        )
    if len(set(keys)) != len(keys):
        raise ValueError(
            f"`extra_features` must not repeat a key. Received: extra_features={keys!r}"
        )
    return tuple(keys)


# The option groups of a `ReaderConfig`, by attribute, and the group of each option.
_GROUPS = (("reading", ReadOptions), ("image", ImageOptions), ("shuffling", ShuffleOptions))
_GROUP_OF = {f.name: attr for attr, cls in _GROUPS for f in dataclasses.fields(cls)}
# Every keyword option of `ReaderConfig` (and of `image_dataset_from_tfrecords`).
OPTION_NAMES = tuple(_GROUP_OF)


@dataclasses.dataclass(frozen=True, init=False)
class ReaderConfig:
    """How to read a converted dataset: the three option groups, validated.

    Built from the keyword options of `image_dataset_from_tfrecords`, e.g.
    `ReaderConfig(batch_size=64, image_size=(160, 160), seed=0)`, each routed
    to its group (`ReadOptions`, `ImageOptions`, `ShuffleOptions`, which
    document them), or from whole groups: `ReaderConfig(image=ImageOptions(...))`.
    Every option is also readable here by its name (`config.batch_size`).

    The defaults are those of `keras.utils.image_dataset_from_directory`
    (float32 pixel values in 0-255, int labels, rgb, bilinear stretch,
    shuffled, batches of 32) except for:
      - `image_size`: (224, 224), not (256, 256): the input size of the
        ImageNet models of `keras.applications` and of the 'standard'
        augmentation recipe.
      - `deterministic`: without a `seed`, element order is not reproducible
        (workers need not wait for each other: faster); Keras keeps order.
      - splits come from the converter's manifest (`split=`), not from
        `validation_split`/`subset`.

    Attributes:
      reading: The `ReadOptions`.
      image: The `ImageOptions`.
      shuffling: The `ShuffleOptions`.
    """

    reading: ReadOptions
    image: ImageOptions
    shuffling: ShuffleOptions

    def __init__(
        self,
        *,
        reading: ReadOptions | None = None,
        image: ImageOptions | None = None,
        shuffling: ShuffleOptions | None = None,
        **options,
    ):
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise TypeError(
                f"ReaderConfig got unknown options {unknown}; the options are "
                f"{list(OPTION_NAMES)}."
            )
        given = {"reading": reading, "image": image, "shuffling": shuffling}
        for attr, cls in _GROUPS:
            flat = {k: v for k, v in options.items() if _GROUP_OF[k] == attr}
            group = given[attr]
            if group is None:
                group = cls(**flat)
            elif not isinstance(group, cls):
                raise TypeError(
                    f"`{attr}` must be a {cls.__name__}. Received: {attr}={group!r}"
                )
            elif flat:
                raise TypeError(
                    f"Pass `{attr}` or its options {sorted(flat)}, not both. "
                    f"Received: {attr}={group!r}, " + ", ".join(f"{k}={v!r}" for k, v in flat.items())
                )
            object.__setattr__(self, attr, group)
        self._check_across_groups()

    def _check_across_groups(self) -> None:
        if self.image.image_size is None and self.reading.batch_size is not None:
            raise ValueError(
                "`image_size=None` keeps the stored image sizes, which differ, so "
                "it needs `batch_size=None`. Received: "
                f"image_size=None, batch_size={self.reading.batch_size!r}"
            )
        if self.shuffling.mode == "global" and self.reading.cache is not False:
            raise ValueError(
                "`cache` does not apply to shuffle='global', which reads every "
                f"record by offset. Received: cache={self.reading.cache!r}, shuffle='global'"
            )

    def __getattr__(self, name: str):
        # Only called for names not found otherwise: the options of the groups.
        group = _GROUP_OF.get(name)
        if group is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(object.__getattribute__(self, group), name)

    def options(self) -> dict[str, Any]:
        """Every option by name (validated values, e.g. `dtype` as a name)."""
        return {name: getattr(self, name) for name in OPTION_NAMES}

    def replace(self, **changes) -> ReaderConfig:
        """A copy with some options changed, validated again."""
        return ReaderConfig(**{**self.options(), **changes})

    @property
    def channels(self) -> int:
        return self.image.channels

    @property
    def shuffle_mode(self) -> str | None:
        """'shards', 'global', or None (no shuffling)."""
        return self.shuffling.mode

    @property
    def is_deterministic(self) -> bool:
        """Whether element order is reproducible, see `ShuffleOptions`."""
        return self.shuffling.is_deterministic

    def check_schema(self, split_files: SplitFiles) -> None:
        """Checks the options that depend on the dataset, see `ReadOptions`."""
        self.reading.check_schema(split_files)


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


def _placeholder_record(schema) -> bytes:
    """A valid record of `schema` with a 1x1 image: stands in for a skipped
    damaged record until its batch drops it (keeps per-example stages simple)."""
    png = tf.io.encode_png(tf.zeros([1, 1, 1], tf.uint8)).numpy()
    return schema.encode(
        ImageRecord(
            image=png, label=0, filename="", format="png", height=1, width=1, channels=1,
            extra={spec.key: "" for spec in schema.extra},
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
    split_files: SplitFiles, config: ReaderConfig, *, pipeline_id: int, num_pipelines: int
) -> tuple[tf.data.Dataset, int, float]:
    if config.shuffling.mode == "global":
        return _global_records(
            split_files, config, pipeline_id=pipeline_id, num_pipelines=num_pipelines
        )
    records, num_records, num_bytes = _shards_records(
        split_files, config.shuffling, config.reading,
        pipeline_id=pipeline_id, num_pipelines=num_pipelines,
        standard=config.image.standard_augment,
    )
    return records, num_records, num_bytes / max(1, num_records)


def _global_records(
    split_files: SplitFiles, config: ReaderConfig, *, pipeline_id: int, num_pipelines: int
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
        max_bad_records=reading.max_bad_records,
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
    remote = any("://" in p for p in index.paths)

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
) -> tuple[tf.data.Dataset, int, int]:
    """The record stream of the 'shards' and unshuffled modes.

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
    if reading.max_bad_records and _has_index_files(split_files):
        # Only with a budget: reading by offset keeps throughput but doubles
        # the time to the first batch, and with no budget a damaged record
        # fails the read either way (TensorFlow's DataLossError).
        read_shard = _shard_reader(split_files)
    elif reading.max_bad_records:
        raise ValueError(
            f"`max_bad_records` needs the index files of the shards, which the manifest of "
            f"{split_files.data_dir!r} does not list (converted by an older shardsmith): "
            "convert the images again, or read with max_bad_records=0. Received: "
            f"max_bad_records={reading.max_bad_records}"
        )
    indexed = read_shard is not None
    if indexed:
        # Each shard read in order by offset, every record alone (as
        # shuffle='global' reads), so that a damaged one is skipped alone.
        shard_ids = list(range(len(split_files.paths)))
        if num_pipelines > 1 and not record_sharding:
            shard_ids = shard_ids[pipeline_id::num_pipelines]
        files = tf.data.Dataset.from_tensor_slices(tf.constant(shard_ids, tf.int64))
    else:
        # Datasets converted before index files: TensorFlow's reader, which
        # fails on a damaged record (DataLossError).
        files = tf.data.Dataset.from_tensor_slices(list(paths))
        read_shard = tf.data.TFRecordDataset
    # Record-level sharding needs every pipeline to see the records in the same
    # order, which a per-process random file order would break.
    if shuffle and len(paths) > 1 and not (record_sharding and seed is None):
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    records = files.interleave(
        read_shard,
        cycle_length=min(len(paths), _MAX_CYCLE_LENGTH),
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True if record_sharding else None,
    )
    if record_sharding:
        records = records.shard(num_pipelines, pipeline_id)
    if indexed:
        # After the sharding: a damaged record is reported by its pipeline only.
        records = global_shuffle.check_damaged(
            records, split_files.schema, split_files.split, reading.max_bad_records
        )
    # Fails the iteration if the files hold other counts than the manifest.
    records = records.apply(tf.data.experimental.assert_cardinality(num_records))
    if reading.cache:
        records = records.cache("" if reading.cache is True else os.fspath(reading.cache))
    if shuffle:
        records = records.shuffle(
            _shuffle_buffer(shuffling, num_records, num_bytes),
            seed=_derive_seed(seed, 1, pipeline_id),
            reshuffle_each_iteration=True,
        )
    if reading.repeat:
        # Each repetition re-runs the file and record shuffles: every epoch
        # holds every record exactly once, in a new order.
        records = records.repeat()
    if standard:
        # One seed per record, drawn in record order.
        seeds = tf.data.Dataset.random(
            seed=_derive_seed(seed, 2, pipeline_id), rerandomize_each_iteration=True
        ).batch(2)
        records = tf.data.Dataset.zip(records, seeds)
    return records, num_records, num_bytes


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
    """

    config: ReaderConfig
    schema: Any
    keys: tuple[str, ...]
    num_classes: int
    batch_size: int | None
    masked: bool
    jpegs_of_size: tuple[int, int] | None

    @classmethod
    def of(cls, split_files: SplitFiles, config: ReaderConfig, batch_size: int | None) -> _Stages:
        keys = (IMAGE.key,) + ((LABEL.key,) if config.reading.label_mode else ())
        stats = split_files.images
        return cls(
            config=config,
            schema=split_files.schema,
            keys=keys + config.reading.extra_features,
            num_classes=len(split_files.class_names),
            batch_size=batch_size,
            # Unbatched, a skipped record is filtered out before (`_drop_skipped`).
            masked=config.reading.max_bad_records > 0 and batch_size is not None,
            jpegs_of_size=(stats.one_size if stats and [f for f, _ in stats.formats] == ["jpeg"]
                           else None),
        )

    @property
    def standard(self) -> bool:
        return self.config.image.standard_augment

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
            depth=image.depth,
            augment=self.standard,
            seed=example_seed,
        )

    def finish(self, features):
        """Per batch: converts pixels and labels and builds the output structure."""
        image, reading = self.config.image, self.config.reading
        images = preprocess.convert_images(
            features[IMAGE.key], image.dtype, scale=image.scale, normalize=image.normalize
        )
        out = [images]
        if reading.label_mode is not None:
            labels = features[LABEL.key]
            if reading.label_mode == "int":
                labels = tf.cast(labels, tf.int32)
            elif reading.label_mode == "categorical":
                labels = tf.one_hot(labels, self.num_classes, dtype=tf.float32)
            else:
                labels = tf.expand_dims(tf.cast(labels, tf.float32), -1)
            out.append(labels)
        if reading.extra_features:
            out.append({k: features[k] for k in reading.extra_features})
        return out[0] if len(out) == 1 else tuple(out)


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
        and not callable(config.image.augment)
        and bytes_per_record <= _BATCHED_DECODE_MAX_RECORD_BYTES
    )


def _drop_skipped(records: tf.data.Dataset) -> tf.data.Dataset:
    """Unbatched, a skipped damaged record simply does not appear."""
    return records.filter(_no_autograph(lambda s, *_: tf.strings.length(s) > 0))


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
            keep = tf.strings.length(serialized) > 0
            serialized = tf.boolean_mask(serialized, keep)
            if standard:
                batch_seeds = tf.boolean_mask(batch_seeds, keep)
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
                channels=image.channels, depth=image.depth, batch_size=stages.batch_size,
                jpegs_of_size=stages.jpegs_of_size,
            )
        return stages.finish(features)

    ds = records.batch(stages.batch_size, drop_remainder=config.reading.drop_remainder)
    return ds.map(load_batch, num_parallel_calls=tf.data.AUTOTUNE)


# In the per-image stages, elements are: features, then the seed with standard
# augmentation, then the keep flag when masked.


def _parse(records: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """Parses records `_PARSE_BATCH` at a time (vectorised), then unbatches."""
    masked, keys = stages.masked, list(stages.keys)
    placeholder = _placeholder_record(stages.schema) if masked else None

    @_no_autograph
    def parse(serialized, *rest):
        if masked:
            keep = tf.strings.length(serialized) > 0
            serialized = tf.where(keep, serialized, placeholder)
            rest = (*rest, keep)
        features = decode.parse_examples(serialized, keys, stages.schema)
        return (features, *rest) if rest else features

    return records.batch(_PARSE_BATCH).map(parse, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


def _decode_and_preprocess(ds: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """Decodes and preprocesses each image, in parallel."""
    standard, masked = stages.standard, stages.masked

    @_no_autograph
    def load(features, *rest):
        features = dict(features)
        features[IMAGE.key] = stages.load_image(features[IMAGE.key], rest[0] if standard else None)
        return (features, rest[-1]) if masked else features

    return ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)


def _user_augment(ds: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """Applies a callable `augment` per example (AutoGraph converts it)."""
    image = stages.config.image
    if not callable(image.augment):
        return ds
    user_fn = image.augment
    shape = [*image.image_size, image.channels]

    def augment(features, *keep):
        features = dict(features)
        output = tf.convert_to_tensor(user_fn(features[IMAGE.key]))
        features[IMAGE.key] = tf.ensure_shape(tf.cast(output, tf.float32), shape)
        return (features, *keep) if keep else features

    return ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)


def _batch_and_finish(ds: tf.data.Dataset, stages: _Stages) -> tf.data.Dataset:
    """Batches (unless unbatched), drops skipped records, finishes each batch."""
    if stages.batch_size is not None:
        ds = ds.batch(stages.batch_size, drop_remainder=stages.config.reading.drop_remainder,
                      num_parallel_calls=tf.data.AUTOTUNE)

    @_no_autograph
    def finish(features, *keep):
        if keep:
            features = {k: tf.boolean_mask(v, keep[0]) for k, v in features.items()}
        return stages.finish(features)

    return ds.map(finish, num_parallel_calls=tf.data.AUTOTUNE)


_BY_BATCH = (_by_batch,)
_PER_IMAGE = (_parse, _decode_and_preprocess, _user_augment, _batch_and_finish)


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
    if not reading.repeat and not (batch_size is None and reading.max_bad_records):
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
    ds.class_names = list(split_files.class_names)
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

    Returns:
      The dataset, see `image_dataset_from_tfrecords`.

    Raises:
      ValueError: With shuffle='global', if `config.seed` is None or the
        global batch size does not divide by `num_pipelines`.
      schemas.ManifestError, FileNotFoundError: With shuffle='global', if an
        index file is missing or does not match the manifest.
    """
    config.check_schema(split_files)
    records, num_records, bytes_per_record = _records(
        split_files, config, pipeline_id=pipeline_id, num_pipelines=num_pipelines
    )
    if config.reading.max_bad_records and batch_size is None:
        records = _drop_skipped(records)
    stages = _Stages.of(split_files, config, batch_size)
    ds = records
    for stage in (_BY_BATCH if _decodes_by_batch(config, batch_size, bytes_per_record)
                  else _PER_IMAGE):
        ds = stage(ds, stages)
    return _finish_dataset(
        ds, split_files, config,
        batch_size=batch_size, num_records=num_records, sharded_here=sharded_here,
    )


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
    batch_size: int | None = 32,
    image_size: tuple[int, int] | None = (224, 224),
    color_mode: str = "rgb",
    shuffle: bool | str = True,
    seed: int | None = None,
    label_mode: str | None = "int",
    resize: str = "stretch",
    crop_fraction: float = 1.0,
    interpolation: str = "bilinear",
    dtype: str = "float32",
    scale: float | Sequence[float] | None = None,
    normalize: tuple[Any, Any] | None = None,
    augment: str | Callable[[tf.Tensor], tf.Tensor] | None = None,
    repeat: bool = False,
    drop_remainder: bool = False,
    extra_features: Sequence[str] = (),
    deterministic: bool | None = None,
    cache: bool | str = False,
    shuffle_buffer: int | None = None,
    start: ReadPosition | None = None,
    max_bad_records: int = 0,
) -> tf.data.Dataset:
    """Reads one split of a shardsmith dataset as a batched `tf.data.Dataset`.

    Like `keras.utils.image_dataset_from_directory`, but from the TFRecord
    shards the converter wrote. The shard files are the ones the manifest
    lists, never a glob of the folder. The defaults are Keras's except
    `image_size` ((224, 224), not (256, 256)) and `deterministic` (order not
    kept without a `seed`), see `ReaderConfig`.

    Args:
      data_dir: The dataset folder (the converter's `--output_dir`); local
        or any URL `tf.io.gfile` reads, e.g. `gs://bucket/dataset`.
      split: The split to read, e.g. 'train' or 'validation'; the
        converter's folder names 'val', 'valid', 'training', 'testing' are
        accepted for the split they mean.
      batch_size, image_size, color_mode, shuffle, seed, label_mode, resize,
      crop_fraction, interpolation, dtype, scale, normalize, augment, repeat,
      drop_remainder, extra_features, deterministic, cache, shuffle_buffer,
      start, max_bad_records:
        See `ReadOptions` (batch_size, label_mode, repeat, drop_remainder,
        extra_features, cache, max_bad_records), `ImageOptions` (image_size,
        color_mode, resize, crop_fraction, interpolation, dtype, scale,
        normalize, augment) and `ShuffleOptions` (shuffle, seed,
        deterministic, shuffle_buffer, start).

    Returns:
      A `tf.data.Dataset` whose elements are
        - `(images, labels)` by default,
        - `images` alone with `label_mode=None`,
        - `(images, labels, extras)` or, with `label_mode=None`,
          `(images, extras)` when `extra_features` are asked for; `extras`
          is a dict from feature key to a [batch] tensor (tf.string for
          bytes features, tf.int64 for int features). Keras's `fit` and
          `evaluate` would take `extras` for sample weights: give them
          `ds.map(without_extras)`, and iterate `ds` itself to pair
          predictions with file names.
      `images` is `dtype` [batch, height, width, channels]; `labels` as
      described under `ReadOptions.label_mode`. Without batching the batch
      dimension is absent. Without `repeat`, the cardinality is known (from
      the manifest's counts), so `model.fit` shows progress. The dataset has
      a `class_names` attribute, the class names in label order,
      `records_per_epoch` (records of the split, for `readers.ReadPosition`
      and `readers.PositionTracker`) and `seed` (the seed in use: with
      shuffle='global' and no `seed`, the one drawn).

    Raises:
      TypeError, ValueError: If an argument is invalid; the message names it,
        its allowed values and what was received.
      FileNotFoundError: If `data_dir` is missing, is not a finished
        shardsmith dataset, or lacks shard files its manifest lists.
      schemas.ManifestError: If the manifest is damaged, of an unknown schema
        version, or has no such split; with shuffle='global', if an index
        file does not match the manifest (or it lists none).
    """
    config = ReaderConfig(
        batch_size=batch_size,
        image_size=image_size,
        color_mode=color_mode,
        shuffle=shuffle,
        seed=seed,
        label_mode=label_mode,
        resize=resize,
        crop_fraction=crop_fraction,
        interpolation=interpolation,
        dtype=dtype,
        scale=scale,
        normalize=normalize,
        augment=augment,
        repeat=repeat,
        drop_remainder=drop_remainder,
        extra_features=extra_features,
        deterministic=deterministic,
        cache=cache,
        shuffle_buffer=shuffle_buffer,
        start=start,
        max_bad_records=max_bad_records,
    )
    if config.shuffle_mode == "global" and config.seed is None:
        config = config.replace(seed=_random_seed())
        logger.info(
            "shuffle='global' without a seed: using seed=%d (pass it, with `start`, "
            "to resume this read).", config.seed,
        )
    split_files = load_split(data_dir, split)
    logger.info(
        "Reading split %r of %s: %d records in %d shard files.",
        split, split_files.data_dir, split_files.total_records, len(split_files.paths),
    )
    return build_dataset(split_files, config, batch_size=config.batch_size)
