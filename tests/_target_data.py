"""Small datasets with targets (masks, boxes, multi-labels, numbers), written without the converter.

The tools that look at a converted dataset (verify, inspect, preview) are tested on datasets
written here straight from the record contract of issue 24 (`schemas.MASK`, `schemas.BOX_FEATURES`,
`schemas.LABELS`, `schemas.TARGET` and the manifest's `targets` section): images and masks written
by Pillow, records encoded with `schemas.ImageExampleSchema(targets=...)`, framed with
`schemas.tfrecord.frame_record`, index files and a manifest as the converter writes them. A test
that wants a broken dataset builds items that break the contract (a mask of another size, a box
outside [0, 1], a label out of range): this writer stores whatever it is given.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import schemas
from schemas.tfrecord import format_index, frame_record

__all__ = ["Box", "TargetItem", "photo", "encode_mask", "write_target_dataset", "targets_section"]


@dataclasses.dataclass(frozen=True)
class Box:
    """One box, corners normalised to [0, 1] of the image (values as given: may break the contract)."""

    xmin: float
    ymin: float
    xmax: float
    ymax: float
    label: int
    is_crowd: int = 0


@dataclasses.dataclass(frozen=True)
class TargetItem:
    """One record of a test dataset with targets.

    Attributes:
      filename: Its relative path.
      pixels: uint8 RGB [height, width, 3], stored as PNG (lossless: a test can compare pixels).
      label: The image-level label (-1: none).
      split: The split it belongs to.
      mask: Class ids [h, w] (uint8 or uint16), or None for a dataset without masks. Its
        size need not be the image's (a broken record).
      boxes: Its boxes.
      labels: Its multi-label class indices.
      target: Its regression targets.
      extra: Feature values that replace those built from the fields above (raw contract breaks).
    """

    filename: str
    pixels: np.ndarray
    label: int = -1
    split: str = "train"
    mask: np.ndarray | None = None
    boxes: tuple[Box, ...] = ()
    labels: tuple[int, ...] = ()
    target: tuple[float, ...] = ()
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def photo(seed: int, size: tuple[int, int] = (24, 32)) -> np.ndarray:
    """A smooth random RGB picture, reproducible from the seed."""
    rng = np.random.default_rng(seed)
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w]
    base = rng.integers(0, 256, size=3)
    return ((base + 3 * yy[..., None] + 2 * xx[..., None]) % 256).astype(np.uint8)


def encode_mask(mask: np.ndarray) -> bytes:
    """A single-channel PNG of `mask`, written by Pillow: 8-bit for uint8, 16-bit for uint16."""
    mask = np.asarray(mask)
    buf = io.BytesIO()
    # Pillow picks the mode from the dtype: 'I;16' for uint16, 'L' for uint8.
    Image.fromarray(mask.astype(np.uint16 if mask.dtype == np.uint16 else np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _values(item: TargetItem, kinds: Sequence[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if "mask" in kinds:
        values[schemas.MASK.key] = encode_mask(item.mask)
    if "boxes" in kinds:
        columns = (
            [b.xmin for b in item.boxes], [b.ymin for b in item.boxes],
            [b.xmax for b in item.boxes], [b.ymax for b in item.boxes],
            [b.label for b in item.boxes], [b.is_crowd for b in item.boxes],
        )
        values.update({spec.key: column for spec, column in zip(schemas.BOX_FEATURES, columns)})
    if "labels" in kinds:
        values[schemas.LABELS.key] = list(item.labels)
    if "target" in kinds:
        values[schemas.TARGET.key] = list(item.target)
    values.update(item.extra)
    return values


def targets_section(items: Sequence[TargetItem], kinds: Sequence[str], *, class_names=(),
                    box_names=(), mask_dtype="uint8", target_length=None) -> dict:
    """The manifest's `targets` section of `items`, counted here with numpy (as issue 24 defines it)."""
    splits = sorted({item.split for item in items})
    section: dict[str, Any] = {}
    if "mask" in kinds:
        pixel_counts = {}
        top = 0
        for split in splits:
            counts: dict[int, int] = {}
            for item in items:
                if item.split == split and item.mask is not None:
                    ids, n = np.unique(np.asarray(item.mask), return_counts=True)
                    for i, c in zip(ids.tolist(), n.tolist()):
                        counts[i] = counts.get(i, 0) + c
                        if i not in (255, 65535):
                            top = max(top, i)
            pixel_counts[split] = {str(i): counts[i] for i in sorted(counts)}
        section["mask"] = {"dtype": mask_dtype, "num_classes": top + 1, "pixel_counts": pixel_counts,
                           "masks_dir": "masks", "mask_suffix": None}
    if "boxes" in kinds:
        counts, without = {}, {}
        for split in splits:
            per = [0] * len(box_names)
            empty = 0
            for item in items:
                if item.split != split:
                    continue
                empty += not item.boxes
                for box in item.boxes:
                    if 0 <= box.label < len(box_names):
                        per[box.label] += 1
            counts[split], without[split] = per, empty
        section["boxes"] = {"format": "coco", "source": "annotations.json",
                            "class_names": list(box_names),
                            "category_ids": [i + 1 for i in range(len(box_names))],
                            "counts": counts, "images_without_boxes": without,
                            "issues": {"clipped": 1}}
    if "labels" in kinds:
        section["labels"] = {"counts": {
            split: [sum(1 for item in items if item.split == split and c in item.labels)
                    for c in range(len(class_names))]
            for split in splits}}
    if "target" in kinds:
        section["target"] = {"length": target_length}
    return section


def write_target_dataset(
    data_dir: Path,
    items: Sequence[TargetItem],
    kinds: Sequence[str],
    *,
    class_names: Sequence[str] = (),
    section: Mapping[str, Any] | None = None,
    num_shards: int = 2,
) -> schemas.Manifest:
    """Writes `items` as a shardsmith dataset with targets `kinds`; returns its manifest.

    Item i of a split lands in shard i % num_shards of that split. `section` is the manifest's
    `targets` section (default: `targets_section(items, kinds, class_names=class_names)`).
    """
    schema = schemas.ImageExampleSchema(targets=tuple(kinds))
    data_dir.mkdir(parents=True, exist_ok=True)
    if section is None:
        section = targets_section(items, kinds, class_names=class_names)
    split_infos = {}
    for split in sorted({item.split for item in items}, key=lambda s: (s not in schemas.SPLITS, s)):
        mine = [item for item in items if item.split == split]
        shards = []
        for index in range(num_shards):
            part = mine[index::num_shards]
            frames, entries, offset = [], [], 0
            counts = [0] * len(class_names)
            stored = []
            for item in part:
                h, w = item.pixels.shape[:2]
                record = schemas.ImageRecord(
                    image=_png(item.pixels), label=item.label, filename=item.filename, format="png",
                    height=h, width=w, channels=3, extra=_values(item, kinds))
                frame = frame_record(schema.encode(record))
                frames.append(frame)
                entries.append((offset, len(frame)))
                offset += len(frame)
                if 0 <= item.label < len(class_names):
                    counts[item.label] += 1
                stored.append(("png", h, w, 3, "uint8"))
            name = schemas.shard_filename(split, index, num_shards)
            data = b"".join(frames)
            (data_dir / name).write_bytes(data)
            index_name = schemas.index_filename(name)
            index_data = format_index(entries)
            (data_dir / index_name).write_bytes(index_data)
            shards.append(schemas.ShardInfo(
                file=name, num_records=len(part), num_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(), class_counts=tuple(counts),
                index_file=index_name, index_sha256=hashlib.sha256(index_data).hexdigest(),
                images=schemas.ImageStats.of(stored)))
        split_infos[split] = schemas.SplitInfo(name=split, shards=tuple(shards))
    total = len(items)
    manifest = schemas.Manifest(
        schema_version=schemas.SCHEMA_VERSION, tool_version="0.1.0", features=schema.to_json(),
        class_names=tuple(class_names), splits=split_infos,
        counts={"found": total, "written": total, "rejected": 0, "skipped": 0},
        rejects={}, normalized={}, options={"seed": 0},
        extra={schemas.TARGETS_SECTION: dict(section)} if section else {},
    )
    (data_dir / schemas.MANIFEST_FILENAME).write_text(manifest.to_json())
    (data_dir / schemas.REJECTS_FILENAME).write_text("")
    return manifest
