"""The reader's options: three frozen, self-validating groups and their composition.

`ReadOptions` (what a dataset element holds and how the read repeats),
`ImageOptions` (what the output images are) and `ShuffleOptions` (order and
randomness) each check their own values, with errors that name the argument,
what is allowed and what was received; `ReaderConfig` composes them, accepts
either the groups or the flat keyword arguments of
`image_dataset_from_tfrecords`, and checks what spans groups.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from readers import corrupt, decode, preprocess, targets
from readers.metadata import SplitFiles
from readers.positions import ReadPosition
from schemas.features import IMAGE, LABEL

__all__ = [
    "LABEL_MODES", "NORMALIZE_DATASET", "AUGMENTATIONS", "SHUFFLE_MODES", "OPTION_NAMES", "ImageOptions",
    "ShuffleOptions", "ReadOptions", "ServiceReadOptions", "SERVICE_SHARDING", "SERVICE_COMPRESSION",
    "ReaderConfig", "GROUP_NAMES", "reader_signature",
]

LABEL_MODES = (*targets.LABEL_MODES, None)
# normalize= value: the train split's per-band statistics from the manifest.
NORMALIZE_DATASET = "dataset"
AUGMENTATIONS = (None, "standard")
# service_sharding= values (`readers.service`).
SERVICE_SHARDING = ("static", "dynamic")
# service_compression= values: none, or snappy on the workers (TensorFlow's "AUTO").
SERVICE_COMPRESSION = (None, "snappy")
# True is 'shards'; False reads in manifest order.
SHUFFLE_MODES = (True, False, "shards", "global")


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
        sizes, nothing resized: with a `batch_size`, only for a split whose
        manifest says every image has one size (checked when the dataset is
        read, `ReaderConfig.check_schema`), else `batch_size=None`. Keras's
        `image_dataset_from_directory` defaults to (256, 256); the default
        here is (224, 224), the input size of the ImageNet models in
        `keras.applications` (ResNet, EfficientNetB0, MobileNet, ...) and of
        the 'standard' augmentation recipe.
      color_mode: 'rgb' (3 channels), 'grayscale' (1) or 'rgba' (4); or None:
        every band as stored, for splits of raw-stored rasters (any band
        count; see `readers.stored`).
      resize: 'stretch' (as Keras's default), 'crop' (Keras's
        `crop_to_aspect_ratio=True`) or 'pad' (`pad_to_aspect_ratio=True`),
        see `readers.preprocess`. Ignored when `augment='standard'`.
      crop_fraction: With resize='crop', the centre fraction of the window to
        keep; 0.875 gives the ImageNet evaluation crop.
      interpolation: Resize method, one of `preprocess.INTERPOLATIONS`.
      dtype: Output pixel dtype: 'float32', 'bfloat16', 'float16' (values in
        0-255 unless scaled), 'uint8', or 'uint16' (decodes 16-bit PNGs at
        full depth; 8-bit sources are multiplied by 257); or None: the stored
        dtype, for splits of raw-stored rasters of one dtype (values exactly
        as stored unless resized). Rasters keep their values in any dtype
        (cast, rounded and saturated for integers): raw-stored ones, and a
        split of rasters only that is stored as PNG (8/16 bits, 1, 3 or 4
        bands), which decodes at its stored depth (a 16-bit band of 5237 is
        5237.0 in float32, not 20.0), see `readers.stored`. Photo splits,
        16-bit PNG photos included, keep the 0-255 scale above.
      scale: Optional multiplier applied per batch, e.g. 1/255 (float dtypes).
      normalize: Optional (mean, std), each a float or per-channel sequence,
        applied after `scale` as (x - mean) / std (float dtypes); or
        'dataset': the per-band mean and std the converter recorded for the
        *train* split (whatever split is read, so that no statistic of the
        evaluation data leaks into training), see `readers.stored`.
      augment: None; 'standard' for the ImageNet training recipe (random
        resized crop fused with JPEG decoding, random horizontal flip); or a
        callable `fn(image) -> image` applied per example before batching to a
        float32 [height, width, channels] image of pixel values (before
        `scale`), returning the same shape. Its random ops are only
        reproducible if it uses stateless ops seeded from its input.
      reduced_decode: False (the default): every image decoded whole, the
        values exact. True: a JPEG whose decoded region (the whole image
        with 'stretch' or 'pad', the crop window with 'crop' or the random
        crop of 'standard') is at least twice `image_size` on both sides is
        decoded at 1/2, 1/4 or 1/8 scale by libjpeg (the largest that keeps
        it at least `image_size`), then resized: much less work for photos
        larger than the model's input, at values that differ from decoding
        whole and resizing (a box filter of the DCT in place of part of the
        bilinear resize; docs/reading/performance.md gives the measured
        differences). PNGs and smaller JPEGs decode exactly; photo splits
        only, not the target label modes (their masks and boxes follow the
        exact geometry).
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
    reduced_decode: bool = False

    def __post_init__(self):
        _check_bool("reduced_decode", self.reduced_decode)
        if self.image_size is not None:
            self._set("image_size", _check_image_size(self.image_size))
        if self.color_mode is not None and self.color_mode not in decode.CHANNELS_BY_COLOR_MODE:
            raise ValueError(
                f"`color_mode` must be one of {tuple(decode.CHANNELS_BY_COLOR_MODE)} or None "
                "(every band, as stored). "
                f"Received: color_mode={self.color_mode!r}"
            )
        self._check_resize()
        if self.dtype is not None:
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
        if self.normalize is not None and self.normalize != NORMALIZE_DATASET:
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
            # dtype=None (the stored dtype) is checked against the dataset.
            if self.dtype is not None and tf.as_dtype(self.dtype).is_integer:
                raise ValueError(
                    f"`{name}` needs a float `dtype` {('float32', 'bfloat16', 'float16')}. "
                    f"Received: {name}={value!r}, dtype={self.dtype!r}"
                )
            if value == NORMALIZE_DATASET or self.channels is None:
                continue  # Checked against the dataset's bands.
            for part in value if name == "normalize" else (value,):
                if isinstance(part, tuple) and len(part) not in (1, self.channels):
                    raise ValueError(
                        f"`{name}` must have 1 or {self.channels} values for "
                        f"color_mode={self.color_mode!r}. Received: {name}={value!r}"
                    )

    @property
    def channels(self) -> int | None:
        """Channels of the color mode; None: every stored band."""
        if self.color_mode is None:
            return None
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
        or None (no labels), as in Keras. For datasets converted with
        targets (see `readers.targets`): 'mask' (int32 class ids [batch,
        height, width, 1]; pixels added by resize='pad' get the ignore id,
        255 for 8-bit masks and 65535 for 16-bit ones), 'boxes' (a dict:
        'boxes' float32 [batch, None, 4] (ymin, xmin, ymax, xmax) fractions
        of the output image and 'classes' int32 [batch, None], RaggedTensors
        across a batch, dense with `pad_boxes`), 'oriented_boxes' (a dict:
        'corners' float32 [batch, None, 4, 2] (x, y) fractions and
        'classes', as 'boxes'), 'multi_hot' (float32
        [batch, num_classes]) or 'target' (float32 [batch, k]). Every
        geometric step (crop, pad, resize, flip, augment='standard') moves
        the mask and the boxes with the image.
      pad_boxes: label_mode='boxes' and 'oriented_boxes' only: give every
        image exactly this many rows, padded with class -1 and box (-1, -1,
        -1, -1) (corners -1); an image with
        more boxes keeps its first `pad_boxes` (in stored order). None:
        ragged, every box.
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
      on_corrupt: 'raise' (the default): a damaged record beyond
        `max_bad_records` fails the read. 'skip': every damaged record (or
        the rest of a shard cut short) is skipped, read by the offsets of the
        index files; the dataset counts them (`ds.corrupt_records`) and logs
        one warning per damaged shard (`readers.corrupt`).
    """

    batch_size: int | None = 32
    label_mode: str | None = "int"
    pad_boxes: int | None = None
    repeat: bool = False
    drop_remainder: bool = False
    extra_features: tuple[str, ...] = ()
    cache: bool | str = False
    max_bad_records: int = 0
    on_corrupt: str = "raise"

    def __post_init__(self):
        corrupt.check_on_corrupt(self.on_corrupt)
        if self.batch_size is not None and (not _is_int(self.batch_size) or self.batch_size < 1):
            raise ValueError(
                "`batch_size` must be a positive integer or None. "
                f"Received: batch_size={self.batch_size!r}"
            )
        for name in ("repeat", "drop_remainder"):
            _check_bool(name, getattr(self, name))
        if self.label_mode is not None and targets.mode_of(self.label_mode) is None:
            raise ValueError(
                f"`label_mode` must be one of {(*(mode.name for mode in targets.MODES), None)}. "
                f"Received: label_mode={self.label_mode!r}"
            )
        if self.pad_boxes is not None:
            if not _is_int(self.pad_boxes) or self.pad_boxes < 1:
                raise ValueError(
                    "`pad_boxes` must be a positive integer or None. "
                    f"Received: pad_boxes={self.pad_boxes!r}"
                )
            if self.label_mode not in ("boxes", "oriented_boxes"):
                raise ValueError(
                    "`pad_boxes` applies to label_mode='boxes' and 'oriented_boxes' only. Received: "
                    f"pad_boxes={self.pad_boxes!r}, label_mode={self.label_mode!r}"
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

    @property
    def bad_record_budget(self) -> int:
        """Damaged records skipped per epoch and pipeline before the read fails (`on_corrupt`)."""
        return corrupt.budget(self.on_corrupt, self.max_bad_records)

    def check_schema(self, split_files: SplitFiles) -> None:
        """Checks the options that depend on the dataset itself.

        Raises:
          ValueError: If an extra feature is not in the dataset's schema,
            label_mode='binary' is asked of a dataset without two classes, an
            image-level mode of a dataset without classes (class_names []),
            or a target mode of a dataset without that kind of target; the
            message names the modes the dataset supports.
        """
        keys = [spec.key for spec in split_files.schema.features]
        allowed = [k for k in keys if k not in (IMAGE.key, LABEL.key)]
        unknown = [k for k in self.extra_features if k not in allowed]
        if unknown:
            raise ValueError(
                f"`extra_features` must be a subset of this dataset's features {allowed}. "
                f"Received: extra_features={self.extra_features!r}"
            )
        schema_targets = split_files.schema.targets
        supported = targets.supported_label_modes(split_files.class_names, schema_targets)
        if self.label_mode == "binary" and split_files.class_names and len(
                split_files.class_names) != 2:
            raise ValueError(
                "label_mode='binary' needs exactly 2 classes; this dataset has "
                f"{len(split_files.class_names)}: {list(split_files.class_names)}. Use "
                "label_mode='int' or 'categorical'. Received: label_mode='binary'"
            )
        if self.label_mode not in supported:
            kind = getattr(targets.mode_of(self.label_mode), "kind", None)
            has = ("no image-level classes (class_names is [], every label -1)"
                   if kind == targets.CLASS_KIND else f"no {kind!r} target")
            raise ValueError(
                f"label_mode={self.label_mode!r} does not apply to this dataset: it has {has}, "
                f"and its targets are {list(schema_targets)}; it can be read with label_mode "
                f"in {supported}. Received: label_mode={self.label_mode!r}"
            )


@dataclasses.dataclass(frozen=True)
class ServiceReadOptions:
    """Where the input pipeline runs: here, or on tf.data service workers; validated.

    Attributes:
      service: None (this process), or the dispatcher's address
        grpc://HOST:PORT (`shardsmith serve-data` prints it): the workers run
        the whole pipeline (read, parse, decode, augment, batch) and this
        process reads their batches. The shard files must be readable at the
        same path by every worker (a shared folder, gs://...).
      service_sharding: 'static': worker i of the dispatcher's fixed worker
        list reads shard files i, i+N, ...: every record exactly once per
        epoch (without `drop_remainder`: each worker batches its own records,
        so an epoch may end with one partial batch per worker); needs the
        worker list (`serve-data --workers N`) and every worker alive to the
        end. 'dynamic': the dispatcher hands out shard files to whichever
        worker asks; workers may join at any time; a record at most once: a
        worker lost mid-epoch loses the files it held, never duplicates.
      service_job_name: Trainers (or the input pipelines of
        `distributed_dataset` on several hosts) that read one job by name
        share its batches, each batch going to one of them. None: a job of
        this dataset alone.
      service_trainer_id: With `service_job_name` and `repeat=True`: this
        trainer (a trial of a hyper-parameter sweep) gets every batch of the
        job, each made once by the workers and kept in their cross-trainer
        cache for the other trials (`readers.service`); readers with the same
        id (the input pipelines of one trial) split its batches. A trial
        further behind than the workers' cache skips ahead to the oldest batch
        kept. None: no sharing of batches between trainers.
      service_compression: None: batches travel as they are. 'snappy': each
        worker compresses its batches and this process uncompresses them
        (TensorFlow's own default). Decoded photos hardly compress (224x224
        uint8 and float32 batches: 1.01-1.02x, measured), so compression
        only costs CPU, on every worker and on the trainer; masks of few
        classes or rasters with large nodata areas compress, for a network
        slower than the workers.
    """

    service: str | None = None
    service_sharding: str = "static"
    service_job_name: str | None = None
    service_trainer_id: str | None = None
    service_compression: str | None = None

    def __post_init__(self):
        if self.service is not None:
            text = self.service if isinstance(self.service, str) else ""
            host, _, port = text.removeprefix("grpc://").rpartition(":")
            if not (host and port.isdigit() and "://" not in text.removeprefix("grpc://")):
                raise ValueError(
                    "`service` must be the dispatcher's address grpc://HOST:PORT (as "
                    f"`shardsmith serve-data` prints it) or None. Received: service={self.service!r}"
                )
        if self.service_sharding not in SERVICE_SHARDING:
            raise ValueError(
                f"`service_sharding` must be one of {SERVICE_SHARDING}. "
                f"Received: service_sharding={self.service_sharding!r}"
            )
        if self.service_job_name is not None and not (
                isinstance(self.service_job_name, str) and self.service_job_name):
            raise ValueError(
                "`service_job_name` must be a non-empty string or None. "
                f"Received: service_job_name={self.service_job_name!r}"
            )
        if self.service_trainer_id is not None and not (
                isinstance(self.service_trainer_id, str) and self.service_trainer_id):
            raise ValueError(
                "`service_trainer_id` must be a non-empty string or None. "
                f"Received: service_trainer_id={self.service_trainer_id!r}"
            )
        if self.service_compression not in SERVICE_COMPRESSION:
            raise ValueError(
                f"`service_compression` must be one of {SERVICE_COMPRESSION}. "
                f"Received: service_compression={self.service_compression!r}"
            )
        if self.service is None and (self.service_sharding != "static"
                                     or self.service_job_name is not None
                                     or self.service_trainer_id is not None
                                     or self.service_compression is not None):
            raise ValueError(
                "`service_sharding`, `service_job_name`, `service_trainer_id` and "
                "`service_compression` apply with a `service` only. Received: service=None, "
                f"service_sharding={self.service_sharding!r}, "
                f"service_job_name={self.service_job_name!r}, "
                f"service_trainer_id={self.service_trainer_id!r}, "
                f"service_compression={self.service_compression!r}"
            )
        if self.service_trainer_id is not None and self.service_job_name is None:
            raise ValueError(
                "`service_trainer_id` shares the batches of a job between trainers, so it "
                "needs the job's `service_job_name`, the same for every trainer of the sweep. "
                f"Received: service_trainer_id={self.service_trainer_id!r}, "
                "service_job_name=None"
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
_GROUPS = (("reading", ReadOptions), ("image", ImageOptions), ("shuffling", ShuffleOptions),
           ("remote", ServiceReadOptions))
_GROUP_OF = {f.name: attr for attr, cls in _GROUPS for f in dataclasses.fields(cls)}
# The keyword arguments that pass a whole group (`ReaderConfig(image=ImageOptions(...))`).
GROUP_NAMES = tuple(attr for attr, _ in _GROUPS)
# Every keyword option of `ReaderConfig` (and of `image_dataset_from_tfrecords`).
OPTION_NAMES = tuple(_GROUP_OF)


def _check_option_names(options, where: str) -> None:
    """Refuses keyword options that are none of `OPTION_NAMES`, suggesting the nearest."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if not unknown:
        return
    near = [m for name in unknown for m in difflib.get_close_matches(name, OPTION_NAMES, n=1)]
    hint = f" (did you mean {near}?)" if near else ""
    raise TypeError(f"{where} got unknown options {unknown}{hint}; the options are {list(OPTION_NAMES)}.")


def reader_signature(fn: Callable, *, skip: Sequence[str] = ()) -> inspect.Signature:
    """`fn`'s signature with its `**options` spelled out: every option by name, with its default.

    A reader takes the option groups (`reading=`, `image=`, ...) and each
    option by name; the defaults are defined once, in the groups. This gives
    `help()`, `inspect` and the docs' table the flat keyword arguments.

    Args:
      fn: A reader whose last parameter is `**options`.
      skip: Options it does not take by that name (e.g. `batch_size`).
    """
    signature = inspect.signature(fn)
    parameters = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in parameters}
    parameters += [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        for _, cls in _GROUPS for f in dataclasses.fields(cls)
        if f.name not in taken and f.name not in skip
    ]
    return signature.replace(parameters=parameters)


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
      remote: The `ServiceReadOptions` (the tf.data service).
    """

    reading: ReadOptions
    image: ImageOptions
    shuffling: ShuffleOptions
    remote: ServiceReadOptions

    def __init__(
        self,
        *,
        reading: ReadOptions | None = None,
        image: ImageOptions | None = None,
        shuffling: ShuffleOptions | None = None,
        remote: ServiceReadOptions | None = None,
        **options,
    ):
        _check_option_names(options, type(self).__name__)
        given = {"reading": reading, "image": image, "shuffling": shuffling, "remote": remote}
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
        mode = targets.mode_of(self.reading.label_mode)
        if callable(self.image.augment) and mode is not None and mode.moves_with_image:
            raise ValueError(
                "A callable `augment` sees the image alone, so it cannot move the mask or "
                f"boxes of label_mode={self.reading.label_mode!r} with it: use "
                "augment='standard' or None. Received: "
                f"augment={self.image.augment!r}, label_mode={self.reading.label_mode!r}"
            )
        mode = targets.mode_of(self.reading.label_mode)
        if self.image.reduced_decode and mode is not None and mode.from_class is None:
            raise ValueError(
                "reduced_decode=True decodes the image at a reduced scale and a slightly "
                f"wider window, which the targets of label_mode={self.reading.label_mode!r} "
                "would not follow exactly: read them with reduced_decode=False. Received: "
                f"reduced_decode=True, label_mode={self.reading.label_mode!r}"
            )
        self._check_service()
        if self.shuffling.mode == "global" and self.reading.cache is not False:
            raise ValueError(
                "`cache` does not apply to shuffle='global', which reads every "
                f"record by offset. Received: cache={self.reading.cache!r}, shuffle='global'"
            )

    def _check_service(self) -> None:
        """The options that cannot hold when tf.data service workers run the pipeline."""
        service = self.remote.service
        if service is None:
            return
        if self.shuffling.mode == "global":
            raise ValueError(
                "shuffle='global' cannot hold with `service`: it reads records by offset with "
                "Python code of this process, which the workers cannot run, and the service "
                "hands over the workers' batches as they come, so neither the global order nor "
                "an exact resume (`start`) would hold; read with shuffle=True. Received: "
                f"shuffle='global', service={service!r}"
            )
        if self.reading.bad_record_budget:
            raise ValueError(
                "`max_bad_records` (or on_corrupt='skip') cannot hold with `service`: skipping a damaged record reads "
                "by offset with Python code of this process, which the workers cannot run; "
                "read with max_bad_records=0. Received: "
                f"max_bad_records={self.reading.max_bad_records!r}, service={service!r}"
            )
        if self.reading.cache is not False:
            raise ValueError(
                "`cache` cannot hold with `service`: each worker would cache its own share of "
                "one job only (and a dynamic job's later epochs would replay files other "
                "workers were given); read without cache. Received: "
                f"cache={self.reading.cache!r}, service={service!r}"
            )
        if self.shuffling.deterministic is True:
            raise ValueError(
                "deterministic=True cannot hold with `service`: the trainer gets the workers' "
                "batches in the order they arrive (with a `seed`, each worker's own stream is "
                "still reproducible). Received: deterministic=True, "
                f"service={service!r}"
            )
        trainer_id = self.remote.service_trainer_id
        if trainer_id is not None and not self.reading.repeat:
            raise ValueError(
                "`service_trainer_id` needs repeat=True: the workers' cross-trainer cache "
                "keeps a sliding window of one endless stream, so trainers that start, run "
                "and fall behind at their own pace have no common end of an epoch "
                "(TensorFlow refuses a finite dataset there); pass steps_per_epoch to `fit`. "
                f"Received: service_trainer_id={trainer_id!r}, repeat=False"
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
        """Checks the options that depend on the dataset, see `ReadOptions`.

        Also: `image_size=None` with batching keeps the stored size, so it
        needs a split whose manifest says every image has one size.

        Raises:
          ValueError: As `ReadOptions.check_schema`; or for `image_size=None`
            and a `batch_size` on a split of several sizes or of unknown
            sizes, naming the sizes found.
        """
        self.reading.check_schema(split_files)
        if self.image.image_size is None and self.reading.batch_size is not None:
            _check_one_size(split_files, self.reading.batch_size)


def _check_one_size(split_files: SplitFiles, batch_size: int) -> None:
    """Batches at the stored size need one stored size (the manifest's image stats)."""
    stats = split_files.images
    if stats is not None and stats.one_size is not None:
        return
    if stats is None:
        found = "sizes its manifest does not record (an older converter)"
    else:
        (h0, w0), (h1, w1) = stats.min_size, stats.max_size
        found = f"images of several sizes, from {h0}x{w0} to {h1}x{w1} (height x width)"
    raise ValueError(
        f"`image_size=None` batches images at their stored size, but split {split_files.split!r} "
        f"of {split_files.data_dir!r} holds {found}: pass image_size=(height, width), or "
        f"batch_size=None. Received: image_size=None, batch_size={batch_size!r}"
    )
