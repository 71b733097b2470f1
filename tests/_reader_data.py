"""Small converted datasets for the reader tests, written without the converter.

Real JPEG/PNG files are written with PIL, encoded with the shared schema,
spread round-robin over shard files named with `shard_filename`, and described
by a `manifest.json`, so the readers see exactly what the converter produces.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf
from PIL import Image

from schemas import (
    IMAGE_SCHEMA,
    MANIFEST_FILENAME,
    REJECTS_FILENAME,
    SCHEMA_VERSION,
    ImageRecord,
    ImageStats,
    Manifest,
    ShardInfo,
    SplitInfo,
    shard_filename,
)

# Kind of stored image -> (PIL mode, format, extension, channels as stored).
KINDS = {
    "rgb_jpeg": ("RGB", "JPEG", "jpg", 3),
    "gray_jpeg": ("L", "JPEG", "jpg", 1),
    "rgb_png": ("RGB", "PNG", "png", 3),
    "rgba_png": ("RGBA", "PNG", "png", 4),
    "gray_png": ("L", "PNG", "png", 1),
    "gray16_png": ("I;16", "PNG", "png", 1),
}
DEFAULT_KINDS = ("rgb_jpeg", "rgb_png", "gray_jpeg", "rgba_png", "gray16_png")
CLASS_NAMES = ("cat", "dog", "eel")


@dataclasses.dataclass(frozen=True)
class Source:
    """One written image, as the tests know it."""

    filename: str  # relative POSIX path, as stored in the record
    label: int
    path: Path  # the source file on disk
    kind: str
    shard: int  # index of the shard file holding it
    pixels: np.ndarray  # the array PIL wrote (uint8 or uint16)

    @property
    def data(self) -> bytes:
        return self.path.read_bytes()


@dataclasses.dataclass(frozen=True)
class Written:
    data_dir: Path
    class_names: tuple[str, ...]
    sources: Mapping[str, tuple[Source, ...]]  # split -> sources
    shard_paths: Mapping[str, tuple[Path, ...]]  # split -> shard files

    def by_filename(self, split: str = "train") -> dict[str, Source]:
        return {s.filename: s for s in self.sources[split]}


def exit_child(code: int = 0) -> None:
    """Ends a child script of the tests with `code`, its output flushed, without the teardown.

    The interpreter's teardown after TensorFlow frees its objects one by one, ~2 s of CPU per
    process for nothing (the kernel frees them at once), as `conversion.console.exit_program`
    avoids for the commands.
    """
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _pixels(kind: str, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    mode, _, _, channels = KINDS[kind]
    if mode == "I;16":
        return rng.integers(0, 65536, (height, width), dtype=np.uint16)
    # Smooth gradients plus noise: realistic enough for JPEG, not constant.
    yy, xx = np.mgrid[0:height, 0:width]
    base = (yy * 255 // max(1, height - 1) + xx * 127 // max(1, width - 1)) % 256
    shape = (height, width) if channels == 1 else (height, width, channels)
    noise = rng.integers(0, 64, shape)
    if channels > 1:
        base = base[..., None]
    return ((base + noise) % 256).astype(np.uint8)


def encode_image(pixels: np.ndarray, kind: str) -> bytes:
    mode, fmt, _, _ = KINDS[kind]
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def write_dataset(
    root: Path,
    *,
    splits: Mapping[str, int] = {"train": 12},
    num_shards: Mapping[str, int] | int = 3,
    kinds: Sequence[str] = DEFAULT_KINDS,
    sizes: Sequence[tuple[int, int]] = ((12, 16), (16, 12), (10, 10), (9, 14)),
    class_names: Sequence[str] = CLASS_NAMES,
    schema_version: int = SCHEMA_VERSION,
    write_manifest: bool = True,
    seed: int = 0,
    image_stats: bool = True,
) -> Written:
    """Writes images under root/images and a converted dataset under root/dataset.

    Record i of a split has kind kinds[i % len], size sizes[i % len], label
    i % len(class_names), and lands in shard i % num_shards. With
    `image_stats`, the manifest has each shard's formats and sizes, as the
    converter writes them.
    """
    rng = np.random.default_rng(seed)
    images_dir = root / "images"
    data_dir = root / "dataset"
    data_dir.mkdir(parents=True)
    sources: dict[str, tuple[Source, ...]] = {}
    shard_paths: dict[str, tuple[Path, ...]] = {}
    split_infos: dict[str, SplitInfo] = {}
    counter = itertools.count()
    for split, count in splits.items():
        n = num_shards if isinstance(num_shards, int) else num_shards[split]
        per_shard: list[list[tuple[bytes, int, tuple]]] = [[] for _ in range(n)]
        written = []
        for i in range(count):
            kind = kinds[i % len(kinds)]
            height, width = sizes[i % len(sizes)]
            label = i % len(class_names)
            pixels = _pixels(kind, height, width, rng)
            ext = KINDS[kind][2]
            filename = f"{split}/{class_names[label]}/img_{next(counter):03d}.{ext}"
            path = images_dir / filename
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(encode_image(pixels, kind))
            record = ImageRecord(
                image=path.read_bytes(),
                label=label,
                filename=filename,
                format="jpeg" if ext == "jpg" else "png",
                height=height,
                width=width,
                channels=KINDS[kind][3],
            )
            per_shard[i % n].append((IMAGE_SCHEMA.encode(record), label,
                                     (record.format, height, width)))
            written.append(Source(filename, label, path, kind, i % n, pixels))
        shards, paths = [], []
        for index, records in enumerate(per_shard):
            name = shard_filename(split, index, n)
            path = data_dir / name
            with tf.io.TFRecordWriter(str(path)) as writer:
                for serialized, _, _ in records:
                    writer.write(serialized)
            data = path.read_bytes()
            counts = [0] * len(class_names)
            for _, label, _ in records:
                counts[label] += 1
            shards.append(
                ShardInfo(
                    file=name,
                    num_records=len(records),
                    num_bytes=len(data),
                    sha256=hashlib.sha256(data).hexdigest(),
                    class_counts=tuple(counts),
                    images=ImageStats.of([r[2] for r in records]) if image_stats else None,
                )
            )
            paths.append(path)
        split_infos[split] = SplitInfo(name=split, shards=tuple(shards))
        sources[split] = tuple(written)
        shard_paths[split] = tuple(paths)
    (data_dir / REJECTS_FILENAME).write_text("")
    if write_manifest:
        total = sum(splits.values())
        manifest = Manifest(
            schema_version=schema_version,
            tool_version="0.1.0",
            features=IMAGE_SCHEMA.to_json(),
            class_names=tuple(class_names),
            splits=split_infos,
            counts={"found": total, "written": total, "rejected": 0, "skipped": 0},
            rejects={},
            normalized={},
            options={"seed": seed},
        )
        (data_dir / MANIFEST_FILENAME).write_text(manifest.to_json())
    return Written(data_dir, tuple(class_names), sources, shard_paths)


def decoded(source: Source, channels: int = 3) -> np.ndarray:
    """The reference pixels: `tf.io.decode_image` of the source file."""
    return tf.io.decode_image(source.data, channels=channels, expand_animations=False).numpy()


def strategy_label_sum(strategy, dist) -> float:
    """Sum of every label of `dist`, one `strategy.run` + cross-replica reduce per step.

    Each step is a collective, so every replica (and worker) must take part.
    """

    @tf.function
    def step(images, labels):
        def replica_fn(x, y):
            return tf.reduce_sum(tf.cast(y, tf.float32)) + 0.0 * tf.reduce_sum(x)
        per = strategy.run(replica_fn, args=(images, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)

    return float(sum(step(x, y) for x, y in dist))


def fit_one_epoch(strategy, train, num_classes: int) -> dict:
    """One epoch of a tiny 8x8x3 classifier fitted under `strategy`: {'fit_loss', 'fit_steps'}."""
    import keras

    with strategy.scope():
        model = keras.Sequential([
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(2, 3),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(num_classes, activation="softmax"),
        ])
        model.compile(optimizer="sgd", loss="categorical_crossentropy")
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: steps.append(b))
    history = model.fit(train, epochs=1, verbose=0, callbacks=[counter])
    return {"fit_loss": history.history["loss"], "fit_steps": len(steps)}


@dataclasses.dataclass(frozen=True)
class RasterItem:
    """One record of a raster test dataset: its stored array, label and name."""

    filename: str
    label: int
    pixels: np.ndarray  # [height, width, bands] as stored (raw), or a uint8 photo (PNG)
    raw: bool


def write_raster_dataset(
    data_dir: Path,
    arrays: Sequence[np.ndarray],
    *,
    photos: Sequence[np.ndarray] = (),
    split: str = "train",
    num_shards: int = 2,
    class_names: Sequence[str] = ("forest", "water"),
    band_stats: bool = False,
) -> tuple[RasterItem, ...]:
    """Writes a dataset of raw-stored arrays (and PNG `photos`), as the converter stores them.

    Raw records follow the record contract: the array's bytes little-endian,
    C order, shape (height, width, bands), format 'raw-<dtype>'. Record i has
    label i % len(class_names) and lands in shard i % num_shards. With
    `band_stats`, each shard records the per-band statistics of its rasters
    (`imaging.raster.band_stats`, combined), as the converter does.
    """
    from schemas.features import raw_format

    data_dir.mkdir(parents=True, exist_ok=True)
    items, per_shard = [], [[] for _ in range(num_shards)]
    for i, pixels in enumerate([*arrays, *photos]):
        raw = i < len(arrays)
        label = i % len(class_names)
        ext = "tif" if raw else "png"
        filename = f"{class_names[label]}/img_{i:03d}.{ext}"
        if raw:
            pixels = np.asarray(pixels)
            if pixels.ndim == 2:
                pixels = pixels[..., None]
            image = np.ascontiguousarray(pixels, pixels.dtype.newbyteorder("<")).tobytes()
            fmt = raw_format(pixels.dtype.name)
        else:
            image, fmt = encode_image(pixels, "rgb_png" if pixels.ndim == 3 else "gray_png"), "png"
        height, width = pixels.shape[:2]
        channels = pixels.shape[2] if pixels.ndim == 3 else 1
        record = ImageRecord(image=image, label=label, filename=filename, format=fmt,
                             height=height, width=width, channels=channels)
        per_shard[i % num_shards].append((IMAGE_SCHEMA.encode(record), label, (fmt, height, width)))
        items.append(RasterItem(filename, label, pixels, raw))
    shards = []
    for index, records in enumerate(per_shard):
        name = shard_filename(split, index, num_shards)
        with tf.io.TFRecordWriter(str(data_dir / name)) as writer:
            for serialized, _, _ in records:
                writer.write(serialized)
        data = (data_dir / name).read_bytes()
        counts = [0] * len(class_names)
        for _, label, _ in records:
            counts[label] += 1
        stats = None
        if band_stats:
            from imaging.raster import band_stats as array_band_stats
            from schemas import BandStatsAccumulator

            accumulator = BandStatsAccumulator()
            for item in items[index::num_shards]:
                accumulator.add(array_band_stats(item.pixels, None))
            stats = accumulator.result()
        shards.append(ShardInfo(
            file=name, num_records=len(records), num_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(), class_counts=tuple(counts),
            images=ImageStats.of([r[2] for r in records]), band_stats=stats,
        ))
    splits = {split: SplitInfo(name=split, shards=tuple(shards))}
    total = len(items)
    manifest = Manifest(
        schema_version=SCHEMA_VERSION, tool_version="0.1.0", features=IMAGE_SCHEMA.to_json(),
        class_names=tuple(class_names), splits=splits,
        counts={"found": total, "written": total, "rejected": 0, "skipped": 0},
        rejects={}, normalized={}, options={"seed": 0},
    )
    (data_dir / MANIFEST_FILENAME).write_text(manifest.to_json())
    (data_dir / REJECTS_FILENAME).write_text("")
    return tuple(items)


# --- Datasets with targets (masks, boxes, several labels, numbers; issue 24) ------------------

# The four regions of a target test image, each with its colour and mask id: top-left,
# top-right, bottom-left, bottom-right of an off-centre split (so that a flip or a
# centred crop is visible).
REGION_COLOURS = ((255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255))
REGION_IDS_8 = (1, 2, 3, 4)
REGION_IDS_16 = (300, 1000, 20000, 60000)


@dataclasses.dataclass(frozen=True)
class TargetItem:
    """One record of a target test dataset, as written.

    Attributes:
      filename: The record's file name.
      pixels: uint8 [height, width, 3], the image Pillow encoded.
      kind: 'rgb_jpeg' or 'rgb_png'.
      mask: The mask's ids [height, width] (uint8 or uint16), as Pillow wrote them.
      split: (row, column) where the regions meet.
      boxes: (xmin, ymin, xmax, ymax) fractions of the image, one per box.
      box_labels: The class of each box.
      is_crowd: 0/1 per box.
      labels: Sorted class indices (multi-label).
      target: Regression values.
    """

    filename: str
    pixels: np.ndarray
    kind: str
    mask: np.ndarray
    split: tuple[int, int]
    boxes: tuple[tuple[float, float, float, float], ...]
    box_labels: tuple[int, ...]
    is_crowd: tuple[int, ...]
    labels: tuple[int, ...]
    target: tuple[float, ...]


def region_item(index: int, height: int, width: int, *, kind: str = "rgb_png",
                mask_ids=REGION_IDS_8, num_labels: int = 3, extra_box: bool = True) -> TargetItem:
    """An image of four coloured regions, its mask (one id per region) and boxes.

    The regions meet at row 3/8 and column 5/8 of the image. The boxes are
    the top-left region (class 0) and the bottom-right one (class 1), plus,
    with `extra_box`, a thin one along the left edge (class 2: a centred crop
    of a landscape image cuts it away).
    """
    sy, sx = (3 * height) // 8, (5 * width) // 8
    region = np.zeros((height, width), np.int64)
    region[:sy, sx:] = 1
    region[sy:, :sx] = 2
    region[sy:, sx:] = 3
    pixels = np.asarray(REGION_COLOURS, np.uint8)[region]
    mask = np.asarray(mask_ids)[region].astype(np.uint16 if max(mask_ids) > 255 else np.uint8)
    boxes = [(0.0, 0.0, sx / width, sy / height), (sx / width, sy / height, 1.0, 1.0)]
    labels = [0, 1]
    if extra_box:
        boxes.append((0.0, 0.25, 2 / width, 0.75))
        labels.append(2)
    return TargetItem(
        filename=f"img_{index:03d}.{KINDS[kind][2]}", pixels=pixels, kind=kind, mask=mask,
        split=(sy, sx), boxes=tuple(boxes), box_labels=tuple(labels),
        is_crowd=tuple(i % 2 for i in range(len(labels))),
        labels=tuple(sorted({index % num_labels, (index * 2 + 1) % num_labels})),
        target=(float(index), index / 4 - 1.5),
    )


def _mask_png(mask: np.ndarray) -> bytes:
    buf = io.BytesIO()
    image = Image.fromarray(mask)  # uint8 -> mode L, uint16 -> mode I;16
    image.save(buf, format="PNG")
    return buf.getvalue()


def write_target_dataset(
    data_dir: Path,
    items: Sequence[TargetItem],
    *,
    targets: Sequence[str] = ("mask", "boxes"),
    class_names: Sequence[str] = (),
    box_class_names: Sequence[str] = ("roof", "lawn", "edge"),
    split: str = "train",
    num_shards: int = 2,
    index_files: bool = True,
) -> tuple[TargetItem, ...]:
    """Writes a dataset whose records carry targets, as the converter stores them.

    Record i holds items[i] and lands in shard i % num_shards. Its label is
    -1 when `class_names` is empty (no image-level class), else its first
    multi-label class. The manifest's `targets` section describes the
    kinds written (mask dtype from the masks' depth, box class names,
    per-split counts, target length); with `index_files`, each shard has
    its index file.
    """
    from schemas import (
        BBOX_IS_CROWD, BBOX_LABEL, BBOX_XMAX, BBOX_XMIN, BBOX_YMAX, BBOX_YMIN, LABELS, MASK,
        TARGET, TARGETS_SECTION, ImageExampleSchema, index_filename,
    )
    from schemas.tfrecord import format_index, frame_record

    schema = ImageExampleSchema(targets=tuple(targets))
    data_dir.mkdir(parents=True, exist_ok=True)
    per_shard: list[list[tuple[bytes, int, tuple]]] = [[] for _ in range(num_shards)]
    for i, item in enumerate(items):
        height, width = item.pixels.shape[:2]
        extra = {}
        if "mask" in targets:
            extra[MASK.key] = _mask_png(item.mask)
        if "boxes" in targets:
            for spec, column in zip((BBOX_XMIN, BBOX_YMIN, BBOX_XMAX, BBOX_YMAX), range(4)):
                extra[spec.key] = [box[column] for box in item.boxes]
            extra[BBOX_LABEL.key] = list(item.box_labels)
            extra[BBOX_IS_CROWD.key] = list(item.is_crowd)
        if "labels" in targets:
            extra[LABELS.key] = list(item.labels)
        if "target" in targets:
            extra[TARGET.key] = list(item.target)
        label = item.labels[0] if class_names else -1
        fmt = "jpeg" if KINDS[item.kind][1] == "JPEG" else "png"
        record = ImageRecord(
            image=encode_image(item.pixels, item.kind), label=label, filename=item.filename,
            format=fmt, height=height, width=width, channels=3, extra=extra,
        )
        per_shard[i % num_shards].append((schema.encode(record), label, (fmt, height, width)))
    shards = []
    for index, records in enumerate(per_shard):
        name = shard_filename(split, index, num_shards)
        frames = [frame_record(serialized) for serialized, _, _ in records]
        data = b"".join(frames)
        (data_dir / name).write_bytes(data)
        index_name = index_sha = None
        if index_files:
            offsets = np.concatenate([[0], np.cumsum([len(f) for f in frames])])[:-1]
            index_data = format_index((int(o), len(f)) for o, f in zip(offsets, frames))
            index_name = index_filename(name)
            (data_dir / index_name).write_bytes(index_data)
            index_sha = hashlib.sha256(index_data).hexdigest()
        counts = [0] * len(class_names)
        for _, label, _ in records:
            if label >= 0:
                counts[label] += 1
        shards.append(ShardInfo(
            file=name, num_records=len(records), num_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(), class_counts=tuple(counts),
            index_file=index_name, index_sha256=index_sha,
            images=ImageStats.of([r[2] for r in records]),
        ))
    section = {}
    if "mask" in targets:
        depth = "uint16" if any(item.mask.dtype == np.uint16 for item in items) else "uint8"
        ids, pixel_counts = np.unique(np.concatenate([item.mask.ravel() for item in items]),
                                      return_counts=True)
        section["mask"] = {
            "dtype": depth, "num_classes": int(ids.max()) + 1,
            "pixel_counts": {split: {str(int(i)): int(n) for i, n in zip(ids, pixel_counts)}},
            "masks_dir": "masks", "mask_suffix": None,
        }
    if "boxes" in targets:
        box_counts = [0] * len(box_class_names)
        for item in items:
            for label in item.box_labels:
                box_counts[label] += 1
        section["boxes"] = {
            "format": "coco", "source": "annotations.json", "class_names": list(box_class_names),
            "category_ids": list(range(1, len(box_class_names) + 1)),
            "counts": {split: box_counts},
            "images_without_boxes": {split: sum(1 for item in items if not item.boxes)},
            "issues": {},
        }
    if "labels" in targets:
        label_counts = [0] * len(class_names)
        for item in items:
            for label in item.labels:
                label_counts[label] += 1
        section["labels"] = {"counts": {split: label_counts}}
    if "target" in targets:
        section["target"] = {"length": len(items[0].target)}
    total = len(items)
    manifest = Manifest(
        schema_version=SCHEMA_VERSION, tool_version="0.1.0", features=schema.to_json(),
        class_names=tuple(class_names), splits={split: SplitInfo(name=split, shards=tuple(shards))},
        counts={"found": total, "written": total, "rejected": 0, "skipped": 0},
        rejects={}, normalized={}, options={"seed": 0}, extra={TARGETS_SECTION: section},
    )
    (data_dir / MANIFEST_FILENAME).write_text(manifest.to_json())
    (data_dir / REJECTS_FILENAME).write_text("")
    return tuple(items)
