"""Pictures of a converted dataset: `shardsmith preview`.

  shardsmith preview ./dataset --split train --output preview.png

writes two PNG files:

- `preview.png`, a contact sheet: one row per class, in label order, with a
  few images of the class as the model sees them: read from the shards
  through the shardsmith reader (its decoding and resize, uint8 output), each
  captioned with its file name. Label mix-ups, sideways photos, broken DICOM
  windowing or a resize policy that cuts off the subject show at a glance.
- `preview_counts.png` (beside `--output`), a bar chart of the images per
  class in every split, from `manifest.json` alone.

The sheet reads as little as it can. Shard files are scanned in order
(starting at a seeded shard), looking only at labels, and the scan stops as
soon as every shown class has a pool of candidates, or after `--max_records`
records; shards holding none of the classes still wanted are skipped (the
manifest has every shard's class counts). From each class's pool the seed picks
`--per_class` records; only those are decoded and resized. The same dataset,
options and seed give the same PNG bytes.

Datasets with targets (issue 24) show them on the tiles: each mask class id
as a semi-transparent colour over the image (the ignore id, 255 or 65535,
left uncoloured), each box as a rectangle with its class name; a legend of the
colours is written under the sheet. Masks and boxes go through the same
resize as the image (`--resize`). A dataset without image-level classes
(masks, boxes or numbers only) shows one row of all its images.

Rasters (raw-stored, any band count, and patches of scenes) are read with
every band and shown through a band-to-RGB mapping, `--rgb_bands 4,3,2`
(1-based, as GDAL numbers bands; default the first three, one band as grey),
each shown band of 16-bit or float data stretched from its 2nd to its 98th
percentile in each image (8-bit data as stored); pixels whose every band
holds the file's nodata value (normalized.jsonl names it) or NaN are left
out of the percentiles and shown black; the sheet says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from conversion import console
from imaging import nodata as _nodata
from schemas.features import FILENAME, HEIGHT, LABEL, WIDTH
from schemas.manifest import NORMALIZED_FILENAME, Manifest, ManifestError
from schemas.time_series import TIME_SERIES, example_kind

# TensorFlow and the readers (which import it) are imported where they are used, not here:
# `shardsmith preview --help` and the option check `shardsmith.cli` runs before the command
# need neither, and importing them costs ~4 s of CPU (`python -X importtime`).
if TYPE_CHECKING:
    from readers.metadata import SplitFiles

__all__ = ["add_arguments", "main", "contact_sheet", "count_chart", "rows_sheet"]

# The reader's resize policies (`readers.preprocess.RESIZE_POLICIES`, which imports TensorFlow),
# for `--resize`'s choices; tests/test_shardsmith_preview.py checks that they are the same.
_RESIZE_POLICIES = ("stretch", "pad", "crop")


def __getattr__(name):
    # The overlays' colours, which tests compare the sheets with: from the readers, on first use.
    if name in ("colour_of", "MASK_ALPHA"):
        from readers.targets import overlay

        return getattr(overlay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

logger = logging.getLogger(__name__)

_PROG = "shardsmith preview"
# Each shown class's pool of candidates holds this many times `per_class`
# records; the seed picks `per_class` of them.
_POOL_FACTOR = 4
_MIN_IMAGE_SIZE, _MAX_IMAGE_SIZE = 16, 1024
_MAX_PER_CLASS = 100
_MAX_CHART_CLASSES = 1000

_MARGIN = 12
_GAP = 6
_WHITE = (255, 255, 255)
_BLANK = (236, 236, 236)
_MUTED = (115, 115, 115)
_WARN = (185, 35, 35)
_BAR = (72, 112, 170)
_STRIPE = (246, 246, 246)
# Percentiles each shown band of a raster is stretched between.
_STRETCH = (2.0, 98.0)
# The row of a split without image-level classes (label -1): all its images.
_ALL_IMAGES = "all images"
_MIN_SHEET_WIDTH = 560


# --- Text ---------------------------------------------------------------------


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has one fixed-size bitmap font.
        return ImageFont.load_default()


def _save_png(image: Image.Image, path: str) -> None:
    from schemas.tf_runtime import tf

    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=False)
    parent = os.path.dirname(path)
    if parent:
        tf.io.gfile.makedirs(parent)
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(buf.getvalue())


# --- Choosing the records -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Sample:
    """The records picked for the sheet.

    Attributes:
      records: Per shown class (label order), its picked serialized records,
        in the order they were read.
      scanned: Records looked at.
      shards_read: Shard files opened.
    """

    records: tuple[tuple[bytes, ...], ...]
    scanned: int
    shards_read: int


def _sample(
    split_files: SplitFiles,
    manifest: Manifest,
    *,
    num_shown: int,
    per_class: int,
    seed: int,
    max_records: int,
    unlabelled: bool = False,
) -> _Sample:
    """Scans shard files in order until every shown class has a pool; picks from it.

    Each class's pick is a seeded reservoir sample of `per_class` records from
    the first `per_class * _POOL_FACTOR` records of the class the scan meets,
    so only the picked records are held in memory. `unlabelled`: the split
    has no image-level classes (label -1); every record is of row 0.
    """
    from schemas.tf_runtime import tf

    shards = [s for s in manifest.split(split_files.split).shards if s.num_records > 0]
    counts = manifest.split(split_files.split).class_counts
    if unlabelled:
        counts = (manifest.split(split_files.split).num_records,)
    pool = per_class * _POOL_FACTOR
    wanted = [min(pool, counts[c]) for c in range(num_shown)]
    seen = [0] * num_shown
    picked: list[list[tuple[int, bytes]]] = [[] for _ in range(num_shown)]
    rngs = [np.random.default_rng([seed, c]) for c in range(num_shown)]
    start = int(np.random.default_rng([seed, num_shown]).integers(len(shards)))
    order = list(range(start, len(shards))) + list(range(start))
    remaining = sum(wanted)  # Candidates still to find.
    scanned = shards_read = 0
    for i in order:
        if not remaining or scanned >= max_records:
            break
        if not unlabelled and not any(shards[i].class_counts[c] for c in range(num_shown)
                                      if seen[c] < wanted[c]):
            continue
        shards_read += 1
        path = split_files.paths[i]
        start_count = scanned
        for raw in tf.data.TFRecordDataset(path).take(max_records - scanned):
            serialized = raw.numpy()
            try:
                label = int(split_files.schema.decode(serialized)[LABEL.key])
            except ValueError as e:
                raise ValueError(f"record {scanned - start_count} of {path} is damaged: {e}") from e
            if unlabelled:
                label = 0
            position = scanned
            scanned += 1
            if 0 <= label < num_shown and seen[label] < wanted[label]:
                n = seen[label]
                seen[label] += 1
                remaining -= 1
                if n < per_class:
                    picked[label].append((position, serialized))
                else:  # Reservoir sampling (Algorithm R).
                    j = int(rngs[label].integers(n + 1))
                    if j < per_class:
                        picked[label][j] = (position, serialized)
                if not remaining:
                    break
    records = tuple(tuple(r for _, r in sorted(p)) for p in picked)
    logger.info(
        "Scanned %d of %d records in %d of %d shard files; picked %d records.",
        scanned, split_files.total_records, shards_read, len(shards), sum(map(len, records)),
    )
    return _Sample(records=records, scanned=scanned, shards_read=shards_read)


def _default_rgb_bands(bands: int) -> tuple[int, ...]:
    return (1, 2, 3) if bands >= 3 else (1,)


def _check_rgb_bands(rgb_bands, bands: int) -> tuple[int, ...]:
    if rgb_bands is None:
        return _default_rgb_bands(bands)
    received = rgb_bands
    if isinstance(rgb_bands, str):
        try:
            rgb_bands = tuple(int(b) for b in rgb_bands.split(","))
        except ValueError:
            rgb_bands = None
    if (not isinstance(rgb_bands, (tuple, list)) or len(rgb_bands) not in (1, 3)
            or not all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= bands
                       for b in rgb_bands)):
        raise ValueError(
            f"`rgb_bands` must be 1 or 3 band numbers in 1..{bands} (1-based, as GDAL numbers bands; "
            f"--rgb_bands R,G,B or --rgb_bands B on the command line), e.g. '4,3,2'. "
            f"Received: rgb_bands={received!r}"
        )
    return tuple(rgb_bands)


def _stretch_to_rgb(image: np.ndarray, rgb_bands: tuple[int, ...], nodata: _nodata.Nodata = None,
                    stretch: bool = True) -> np.ndarray:
    """uint8 RGB of bands `rgb_bands` (1-based) of an (height, width, bands) image.

    Each band is stretched between its `_STRETCH` percentiles of the pixels
    that hold data (`stretch`), or shown as stored (8-bit data: `stretch`
    False). A pixel whose every band holds `nodata` (each band its own where
    it is per band, `imaging.nodata`) or NaN (as the converter counts
    nodata) is left out of the percentiles and shown black; so is a
    NaN or infinite sample.
    """
    image = np.asarray(image)
    values_all = image.astype(np.float64)
    empty = np.isnan(values_all)
    for b, value in enumerate(_nodata.per_band(nodata, values_all.shape[-1])):
        if value is not None and not np.isnan(value):
            empty[..., b] |= values_all[..., b] == value
    missing = empty.all(axis=-1)
    channels = []
    for band in rgb_bands:
        values = values_all[..., band - 1]
        shown = np.isfinite(values) & ~missing
        if stretch:
            valid = values[shown]
            low, high = np.percentile(valid, _STRETCH) if valid.size else (0.0, 0.0)
            scaled = (values - low) / (high - low) if high > low else np.zeros_like(values)
            scaled = np.round(np.clip(np.where(shown, scaled, 0.0), 0.0, 1.0) * 255)
        else:
            scaled = np.round(np.clip(np.where(shown, values, 0.0), 0.0, 255.0))
        channels.append(scaled.astype(np.uint8))
    if len(channels) == 1:
        channels *= 3
    return np.stack(channels, axis=-1)


def _nodata_values(data_dir, names) -> dict[str, _nodata.Nodata]:
    """The nodata value (GDAL_NODATA; per band where listed so) of each raster record named, from normalized.jsonl.

    The file has a line per raster record (its details name the nodata value
    when the file has one); read line by line, up to the last record named.
    A dataset without the file, or a record without a line, has none.
    """
    from schemas.tf_runtime import tf

    wanted = set(names)
    found: dict[str, _nodata.Nodata] = {}
    path = os.path.join(os.fspath(data_dir), NORMALIZED_FILENAME)
    if not wanted or not tf.io.gfile.exists(path):
        return found
    with tf.io.gfile.GFile(path, "r") as f:
        for line in f:
            if len(found) == len(wanted):
                break
            entry = json.loads(line) if line.strip() else {}
            name = entry.get("path")
            if name in wanted:
                nodata = (entry.get("details") or {}).get("nodata")
                found[name] = _nodata.from_json(nodata)
    return found


def _through_reader(
    records: list[bytes], split_files: SplitFiles, image_size: int, resize: str,
    rgb_bands=None, nodata_found: bool = True,
) -> list[tuple[str, np.ndarray]]:
    """Decodes and resizes records exactly as `image_dataset_from_tfrecords` does.

    The picked records are written to a temporary one-shard split that the
    reader's own pipeline (`readers.dataset.build_dataset`) then reads, without
    shuffling, with uint8 output. Rasters are then mapped to RGB
    (`_stretch_to_rgb`), with the nodata value of each from normalized.jsonl
    when `nodata_found` (the split's band statistics counted nodata samples).

    Returns:
      (file name, uint8 [image_size, image_size, 3] array) per record, in order.
    """
    from readers.dataset import ReaderConfig, build_dataset
    from schemas.tf_runtime import tf

    if not records:
        return []
    rasters = _is_raster_split(split_files)
    config = ReaderConfig(
        batch_size=None,
        image_size=(image_size, image_size),
        shuffle=False,
        # Rasters: every band, every bit, for the band mapping and stretch.
        color_mode=None if rasters else "rgb",
        dtype=_raster_dtype(split_files) if rasters else "uint8",
        resize=resize,
        # The images alone: labels and targets are drawn from the records themselves, and a
        # dataset without image-level classes (masks, boxes) has no labels to read.
        label_mode=None,
        extra_features=(FILENAME.key,),
        deterministic=True,
    )
    with tempfile.TemporaryDirectory(prefix="shardsmith-preview-") as tmp:
        path = os.path.join(tmp, "picked.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for r in records:
                writer.write(r)
        picked = dataclasses.replace(
            split_files,
            data_dir=tmp,
            paths=(path,),
            num_records=(len(records),),
            num_bytes=(os.path.getsize(path),),
        )
        ds = build_dataset(picked, config, batch_size=None)
        decoded = [(extras[FILENAME.key].numpy().decode("utf-8", "replace"), image.numpy())
                   for image, extras in ds]
    if not rasters:
        return decoded
    nodata = _nodata_values(split_files.data_dir, [name for name, _ in decoded]) if nodata_found else {}
    stretch = not _eight_bit(split_files)
    return [(name, _stretch_to_rgb(image, rgb_bands, nodata.get(name), stretch)) for name, image in decoded]


def _eight_bit(split_files: SplitFiles) -> bool:
    """Whether every image of the split has 8-bit samples (shown as stored, not stretched)."""
    layouts = split_files.images.layouts if split_files.images is not None else None
    return bool(layouts) and all(dtype == "uint8" for _, _, dtype, _ in layouts)


def _is_raster_split(split_files: SplitFiles) -> bool:
    """Whether the split holds rasters only (mixed splits show as photos: rgb);
    PNG-stored ones too (a 16-bit band of 0-10000 would show black)."""
    from readers import stored

    return stored.is_raster_split(split_files)


def _raster_dtype(split_files: SplitFiles) -> str:
    """float32 for raw-stored rasters; uint16 (every bit of a 16-bit PNG) for PNG-stored ones."""
    from readers import stored

    _, raws = stored.stored_formats(split_files.images)
    return "float32" if raws else "uint16"


def _raster_bands(split_files: SplitFiles) -> int:
    from readers import stored
    from readers.dataset import ReaderConfig

    stats = split_files.band_stats.get(split_files.split)
    if stats is not None:
        return stats.bands
    return stored.plan(split_files, ReaderConfig(
        batch_size=None, image_size=None, color_mode=None, dtype="float32").image).bands


# --- The contact sheet --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where everything goes on the sheet; all sizes in pixels."""

    tile: int
    columns: int
    rows: int
    label_width: int
    caption_height: int
    header_height: int
    footer_height: int
    min_width: int = 0

    @property
    def row_height(self) -> int:
        return self.tile + self.caption_height + _GAP

    @property
    def size(self) -> tuple[int, int]:
        grid = self.label_width + self.columns * (self.tile + _GAP) - _GAP
        width = max(2 * _MARGIN + grid, self.min_width)
        height = 2 * _MARGIN + self.header_height + self.rows * self.row_height + self.footer_height
        return width, height

    def tile_origin(self, row: int, column: int) -> tuple[int, int]:
        """The top-left pixel (x, y) of the tile in `row`, `column`."""
        if not (0 <= row < self.rows and 0 <= column < self.columns):
            raise IndexError(f"no tile ({row}, {column}) in a {self.rows}x{self.columns} grid")
        x = _MARGIN + self.label_width + column * (self.tile + _GAP)
        y = _MARGIN + self.header_height + row * self.row_height
        return x, y


@dataclasses.dataclass(frozen=True)
class _Sheet:
    """A rendered contact sheet and what is on it.

    Attributes:
      image: The RGB sheet.
      layout: Its layout (`layout.tile_origin(row, column)`).
      rows: Per row, the class label and the file names of its tiles.
      notes: The footer lines.
      scanned: Records scanned.
      header: The lines under the title.
    """

    image: Image.Image
    layout: _Layout
    rows: tuple[tuple[int, tuple[str, ...]], ...]
    notes: tuple[str, ...]
    scanned: int
    header: tuple[str, ...] = ()


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` must be an integer. Received: {name}={value!r}")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"`{name}` must be {allowed}. Received: {name}={value!r}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class _Content:
    """What a contact sheet shows, before it is drawn.

    Attributes:
      split_files, manifest: The split and its dataset's manifest.
      names, counts: The rows' names and the split's images in each.
      unlabelled: No image-level classes: one row of all the split's images.
      num_shown: Rows shown.
      tiles: Per row, (filename, pixels) of each tile, as the reader returns it.
      tile_targets: Per row, the targets of each tile (`_Overlay.targets_of`).
      overlay: How targets are drawn on the tiles.
      not_found: Rows not (fully) found within the records scanned.
      scanned, shards_read: Records and shard files the sample read.
      rasters, bands, rgb_bands: A split of rasters: its bands and those shown as RGB.
    """

    split_files: SplitFiles
    manifest: Manifest
    names: tuple
    counts: tuple
    unlabelled: bool
    num_shown: int
    tiles: list
    tile_targets: list
    overlay: _Overlay
    not_found: list
    scanned: int
    shards_read: int
    rasters: bool
    bands: object
    rgb_bands: object


def _build_sheet(
    data_dir,
    split: str,
    *,
    per_class: int,
    image_size: int,
    seed: int,
    max_classes: int,
    max_records: int,
    resize: str,
    rgb_bands=None,
) -> _Sheet:
    from readers.targets.overlay import INK as _INK, fit as _fit, line_height as _line_height

    per_class, image_size, seed, max_classes, max_records = _checked(per_class, image_size, seed, max_classes,
                                                                     max_records, resize)
    content = _sheet_content(data_dir, split, per_class=per_class, image_size=image_size, seed=seed,
                             max_classes=max_classes, max_records=max_records, resize=resize,
                             rgb_bands=rgb_bands)
    notes = _notes(content, max_classes, max_records)
    names, num_shown, split_files = content.names, content.num_shown, content.split_files
    title_font, name_font, small_font = _font(16), _font(14), _font(12)
    caption_height = _line_height(small_font)
    # Wrapped to the narrowest sheet (`min_width` below), so it fits whatever the grid.
    legend = _legend_rows(content.overlay.legend([t for row in content.tile_targets for t in row]),
                          small_font, _MIN_SHEET_WIDTH - 2 * _MARGIN)
    label_width = min(
        max([110] + [int(name_font.getlength(n)) + 2 * _GAP for n in names[:num_shown]]), 220
    )
    raster_lines = (_raster_caption(image_size, resize, seed, content.bands, content.rgb_bands,
                                    _raster_dtype(split_files), not _eight_bit(split_files))
                    if content.rasters else ())
    layout = _Layout(
        tile=image_size,
        columns=per_class,
        rows=num_shown,
        label_width=label_width,
        caption_height=caption_height,
        header_height=_line_height(title_font) + (2 + content.rasters) * _line_height(small_font) + _GAP,
        footer_height=_GAP + (len(notes) + len(legend)) * _line_height(small_font),
        # Wide enough to say in full how rasters are shown.
        min_width=max([_MIN_SHEET_WIDTH] + [int(small_font.getlength(line)) + 2 * _MARGIN + 1
                               for line in raster_lines]),
    )
    sheet = Image.new("RGB", layout.size, _WHITE)
    draw = ImageDraw.Draw(sheet)
    width, height = layout.size
    text_width = width - 2 * _MARGIN

    y = _MARGIN
    title = f"{os.fspath(data_dir)}: split '{split}'"
    title = _fit(title_font, title, text_width, path=True)
    draw.text((_MARGIN, y), title, font=title_font, fill=_INK)
    y += _line_height(title_font)
    header = (
        (f"{split_files.total_records:,} images in {len(names)} classes. Up to {per_class} "
         f"per class, as the reader returns them:") if not content.unlabelled else
        (f"{split_files.total_records:,} images without image-level classes. Up to {per_class}, "
         f"as the reader returns them:"),
        f"image_size=({image_size}, {image_size}), resize='{resize}', dtype='uint8'; seed {seed}.",
    )
    if content.rasters:
        header = (header[0], *raster_lines)
    for line in header:
        draw.text((_MARGIN, y), _fit(small_font, line, text_width), font=small_font, fill=_MUTED)
        y += _line_height(small_font)

    rows = [_draw_row(sheet, draw, layout, content, c, (name_font, small_font), max_records)
            for c in range(num_shown)]
    y = height - _MARGIN - (len(notes) + len(legend)) * _line_height(small_font)
    for note, color in notes:
        draw.text((_MARGIN, y), _fit(small_font, note, text_width), font=small_font, fill=color)
        y += _line_height(small_font)
    for row in legend:
        _draw_legend_row(draw, row, (_MARGIN, y), small_font)
        y += _line_height(small_font)
    return _Sheet(sheet, layout, tuple(rows), tuple(n for n, _ in notes), content.scanned,
                  tuple(header))


def _checked(per_class, image_size, seed, max_classes, max_records, resize) -> tuple[int, ...]:
    """The sheet's numbers as ints, each in its range; `resize` one of the reader's policies.

    Raises:
      TypeError, ValueError: Naming the argument, what is allowed and what was received.
    """
    per_class = _check_int("per_class", per_class, 1, _MAX_PER_CLASS)
    image_size = _check_int("image_size", image_size, _MIN_IMAGE_SIZE, _MAX_IMAGE_SIZE)
    seed = _check_int("seed", seed, 0)
    max_classes = _check_int("max_classes", max_classes, 1)
    max_records = _check_int("max_records", max_records, 1)
    if resize not in _RESIZE_POLICIES:
        raise ValueError(
            f"`resize` must be one of {_RESIZE_POLICIES}. Received: resize={resize!r}"
        )
    return per_class, image_size, seed, max_classes, max_records


def _sheet_content(data_dir, split: str, *, per_class: int, image_size: int, seed: int, max_classes: int,
                   max_records: int, resize: str, rgb_bands) -> _Content:
    """The sample of the split a sheet shows, read back through the reader, with its targets."""
    from readers.metadata import load_manifest, load_split

    split_files = load_split(data_dir, split)
    rasters = _is_raster_split(split_files)
    bands = None
    if rasters:
        bands = _raster_bands(split_files)
        rgb_bands = _check_rgb_bands(rgb_bands, bands)
    elif rgb_bands is not None:
        raise ValueError(
            f"`rgb_bands` maps the bands of rasters; split {split!r} holds photos. "
            f"Received: rgb_bands={rgb_bands!r}"
        )
    manifest = load_manifest(data_dir)
    names = manifest.class_names
    counts = manifest.split(split).class_counts
    info = manifest.split(split)
    # No image-level classes (a dataset of masks, boxes or numbers, or several labels per
    # image): one row of all the split's images.
    unlabelled = not names or (info.num_records > 0 and not any(counts))
    if unlabelled:
        names, counts = (_ALL_IMAGES,), (info.num_records,)
    num_shown = min(len(names), max_classes)
    sample = _sample(
        split_files, manifest, num_shown=num_shown, per_class=per_class, seed=seed,
        max_records=max_records, unlabelled=unlabelled,
    )
    picked = [r for rows in sample.records for r in rows]
    band_stats = info.band_stats
    # No sample at a nodata value in the split (band statistics count them): normalized.jsonl unread.
    nodata_found = band_stats is None or any(band_stats.nodata)
    decoded = iter(_through_reader(picked, split_files, image_size, resize, rgb_bands, nodata_found))
    tiles = [[next(decoded) for _ in rows] for rows in sample.records]
    overlay = _Overlay(manifest, split_files, image_size, resize)
    targets = iter([overlay.targets_of(r) for r in picked])
    tile_targets = [[next(targets) for _ in rows] for rows in sample.records]
    not_found = [
        c for c in range(num_shown) if len(tiles[c]) < min(per_class, counts[c])
    ]
    return _Content(split_files, manifest, tuple(names), tuple(counts), unlabelled, num_shown, tiles,
                    tile_targets, overlay, not_found, sample.scanned, sample.shards_read, rasters, bands,
                    rgb_bands)


def _notes(content: _Content, max_classes: int, max_records: int) -> list[tuple[str, tuple]]:
    """The footer's (text, colour) lines: rows left out or not found, what was scanned, the overlay's."""
    names, num_shown, not_found = content.names, content.num_shown, content.not_found
    notes = []
    if len(names) > num_shown:
        notes.append((
            f"{len(names) - num_shown:,} more classes not shown (--max_classes {max_classes}).",
            _WARN,
        ))
    if not_found:
        listed = ", ".join(names[c] for c in not_found[:5])
        listed += ", …" if len(not_found) > 5 else ""
        notes.append((
            f"{len(not_found)} classes not (fully) found within the first {max_records:,} "
            f"records scanned (--max_records): {listed}.",
            _WARN,
        ))
    notes.append((
        f"Scanned {content.scanned:,} of {content.split_files.total_records:,} records in "
        f"{content.shards_read} of {len(content.split_files.paths)} shard files.",
        _MUTED,
    ))
    return notes + content.overlay.notes()


def _draw_row(sheet, draw, layout: _Layout, content: _Content, c: int, fonts, max_records: int):
    """Draws row `c`: its name and count, its tiles with their targets and captions, or why it is empty.

    Returns:
      (c, the file names of its tiles).
    """
    from readers.targets.overlay import INK as _INK, fit as _fit, line_height as _line_height

    name_font, small_font = fonts
    names, counts, tiles, image_size = content.names, content.counts, content.tiles, layout.tile
    per_class = layout.columns
    x0, y0 = layout.tile_origin(c, 0)
    name_width = layout.label_width - _GAP
    draw.text((_MARGIN, y0), _fit(name_font, names[c], name_width), font=name_font, fill=_INK)
    info = (f"label {c} · " if not content.unlabelled else "") + f"{counts[c]:,} image" + (
        "" if counts[c] == 1 else "s")
    draw.text(
        (_MARGIN, y0 + _line_height(name_font)), _fit(small_font, info, name_width),
        font=small_font, fill=_MUTED,
    )
    for k in range(per_class):
        x, y = layout.tile_origin(c, k)
        if k < len(tiles[c]):
            filename, pixels = tiles[c][k]
            sheet.paste(content.overlay.draw(pixels, content.tile_targets[c][k], small_font), (x, y))
            caption = _fit(small_font, filename, image_size, path=True)
            draw.text((x, y + image_size + 1), caption, font=small_font, fill=_INK)
        else:
            draw.rectangle((x, y, x + image_size - 1, y + image_size - 1), fill=_BLANK)
    if counts[c] == 0:
        message, color = "no images in this split", _MUTED
    elif c in content.not_found and not tiles[c]:
        message, color = f"not found in the first {max_records:,} records", _WARN
    else:
        message = None
    if message:
        x, y = layout.tile_origin(c, 0)
        span = per_class * (image_size + _GAP) - _GAP - 2 * _GAP
        draw.text(
            (x + _GAP, y + image_size // 2 - _line_height(small_font) // 2),
            _fit(small_font, message, span), font=small_font, fill=color,
        )
    return c, tuple(f for f, _ in tiles[c])


# --- Targets on the tiles -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Targets:
    """The targets of one picked record, in its stored image's frame.

    Attributes:
      height, width: The stored image's size.
      values: Each overlay's target (`readers.targets.overlay.Overlay.read`), in `_Overlay`'s order.
    """

    height: int
    width: int
    values: tuple = ()


def _window(height: int, width: int, size: int, resize: str) -> tuple[float, float, float, float]:
    """(top, left, height, width), in stored pixels, of what the reader fits to a `size` square.

    As `readers.preprocess` does it: 'stretch' takes the whole image, 'crop'
    its centred square (`center_crop_window`), 'pad' a centred square around
    it (`pad_to_aspect_ratio`: offsets truncated, as there).
    """
    if resize == "crop":
        side_h, side_w = min(height, width), min(width, height)
        return (height - side_h) // 2, (width - side_w) // 2, side_h, side_w
    if resize == "pad":
        side = max(height, width)
        return -((side - height) // 2), -((side - width) // 2), side, side
    return 0, 0, height, width


class _Overlay:
    """Draws a dataset's targets over the tiles of the reader's images: each kind as its row of
    `readers.targets.MODES` draws it (`TargetMode.overlay`), masks before boxes.

    Args:
      manifest: The dataset's manifest (its `targets` section).
      split_files: The split (its schema says which targets the records hold).
      size: The tile side.
      resize: The reader's resize policy the tiles went through.
    """

    def __init__(self, manifest: Manifest, split_files: SplitFiles, size: int, resize: str):
        self._schema = split_files.schema
        self._size = size
        self._resize = resize
        from readers import targets

        self._overlays = targets.overlays(manifest, split_files)

    @property
    def active(self) -> bool:
        return bool(self._overlays)

    def targets_of(self, serialized: bytes) -> _Targets | None:
        """The targets of one record; None for a dataset without targets to draw."""
        if not self.active:
            return None
        values = self._schema.decode(serialized)
        return _Targets(int(values[HEIGHT.key]), int(values[WIDTH.key]),
                        tuple(overlay.read(values) for overlay in self._overlays))

    def draw(self, pixels: np.ndarray, targets: _Targets | None, font) -> Image.Image:
        """The tile of `pixels` with `targets` drawn over it."""
        if targets is None:
            return Image.fromarray(pixels)
        from readers.targets.overlay import Frame

        frame = Frame(targets.height, targets.width, self._size,
                      *_window(targets.height, targets.width, self._size, self._resize))
        for overlay, target in zip(self._overlays, targets.values):
            pixels = overlay.paint(pixels, target, frame)
        tile = Image.fromarray(pixels)
        draw = ImageDraw.Draw(tile)
        for overlay, target in zip(self._overlays, targets.values):
            overlay.draw(draw, target, frame, font)
        return tile

    def legend(self, shown: list[_Targets | None]) -> list[tuple[tuple[int, int, int] | None, str]]:
        """(colour or None, text) entries: what the colours on the tiles mean, kind by kind."""
        entries: list[tuple[tuple[int, int, int] | None, str]] = []
        for i, overlay in enumerate(self._overlays):
            entries += overlay.legend([None if t is None else t.values[i] for t in shown])
        return entries

    def notes(self) -> list[tuple[str, tuple[int, int, int]]]:
        return [(note, _WARN) for overlay in self._overlays for note in overlay.notes()]


_SWATCH = 10


def _legend_rows(entries, font, width: int) -> list[list[tuple]]:
    """The legend's entries wrapped into rows that fit `width` pixels: (colour, text, width) each."""
    rows, row, used = [], [], 0
    for colour, text in entries:
        w = int(font.getlength(text)) + (_SWATCH + 3 if colour else 0) + 2 * _GAP
        if row and used + w > width:
            rows.append(row)
            row, used = [], 0
        row.append((colour, text, w))
        used += w
    if row:
        rows.append(row)
    return rows


def _draw_legend_row(draw, row, origin, font) -> None:
    from readers.targets.overlay import INK as _INK

    x, y = origin
    for colour, text, w in row:
        tx = x
        if colour:
            draw.rectangle((x, y + 2, x + _SWATCH - 1, y + 1 + _SWATCH), fill=colour, outline=_INK)
            tx = x + _SWATCH + 3
        draw.text((tx, y), text, font=font, fill=_INK if colour else _MUTED)
        x += w


def rows_sheet(rows: Sequence[tuple[str, np.ndarray]], notes: Sequence[str] = (),
               legend: Sequence[tuple[tuple[int, int, int] | None, str]] = ()) -> Image.Image:
    """A sheet of captioned picture rows in the contact sheet's style (its margins, font, colours).

    Each row's caption is written above its pixels; the notes follow in muted text, then the
    legend: each entry's colour as a swatch before its text (None: the text alone, muted),
    wrapped to the sheet's width. The same rows, the same pixels.

    Args:
      rows: (caption, RGB uint8 [h, w, 3]) in order, top to bottom.
      notes: Lines under the rows.
      legend: (colour or None, text) entries under the notes.
    """
    from readers.targets.overlay import INK, line_height

    font = _font(12)
    text = line_height(font)
    width = max([_MIN_SHEET_WIDTH] + [2 * _MARGIN + pixels.shape[1] for _, pixels in rows]
                + [2 * _MARGIN + int(font.getlength(line)) + 1 for line in notes])
    legend_rows = _legend_rows(legend, font, width - 2 * _MARGIN)
    height = (2 * _MARGIN + sum(text + pixels.shape[0] + _GAP for _, pixels in rows)
              + text * (len(notes) + len(legend_rows)))
    sheet = Image.new("RGB", (width, height), _WHITE)
    draw = ImageDraw.Draw(sheet)
    y = _MARGIN
    for caption, pixels in rows:
        draw.text((_MARGIN, y), caption, font=font, fill=INK)
        y += text
        sheet.paste(Image.fromarray(pixels), (_MARGIN, y))
        y += pixels.shape[0] + _GAP
    for line in notes:
        draw.text((_MARGIN, y), line, font=font, fill=_MUTED)
        y += text
    for legend_row in legend_rows:
        _draw_legend_row(draw, legend_row, (_MARGIN, y), font)
        y += text
    return sheet


def _raster_caption(image_size, resize, seed, bands, rgb_bands, dtype, stretch=True) -> tuple[str, str]:
    """The sheet's two lines saying how rasters are shown."""
    shown = ("band {} as grey".format(*rgb_bands) if len(rgb_bands) == 1
             else "bands {},{},{} as R,G,B".format(*rgb_bands))
    low, high = _STRETCH
    how = (f"each stretched to its {low:g}-{high:g} % percentiles per image" if stretch
           else "8-bit values as stored")
    return (
        f"{bands}-band rasters: {shown} (--rgb_bands), {how}.",
        f"image_size=({image_size}, {image_size}), resize='{resize}', dtype='{dtype}'; "
        f"nodata and NaN black; seed {seed}.",
    )


def contact_sheet(
    data_dir: str | os.PathLike,
    split: str = "train",
    *,
    per_class: int = 6,
    image_size: int = 128,
    seed: int = 0,
    max_classes: int = 20,
    max_records: int = 5000,
    resize: str = "stretch",
    rgb_bands: Sequence[int] | str | None = None,
) -> Image.Image:
    """A contact sheet of a split: a few images per class, as the reader gives them.

    Rows are classes in label order, labelled with the class name, its label
    and its image count; each tile is an image exactly as
    `image_dataset_from_tfrecords(..., image_size=(image_size, image_size),
    resize=resize, dtype='uint8')` returns it, captioned with its file name.
    Missing images leave grey tiles; the footer says what was left out.

    Args:
      data_dir: The dataset folder (local path or `tf.io.gfile` URL).
      split: The split to show.
      per_class: Images per class (columns), 1 to 100.
      image_size: Side of the square tiles: the reader's output size, 16 to 1024.
      seed: Picks the images (a non-negative integer); same seed, same sheet.
      max_classes: Show the first this many classes in label order.
      max_records: Scan at most this many records; classes not met by then
        are named in the footer.
      resize: The reader's resize policy, one of
        `readers.preprocess.RESIZE_POLICIES`.
      rgb_bands: For a split of rasters, the 1-based bands shown as red,
        green and blue (or one band as grey), e.g. (4, 3, 2) or '4,3,2';
        default the first three (the first alone for fewer than three).
        16-bit and float bands are each stretched to their 2-98 %
        percentiles per image, 8-bit ones shown as stored; nodata and NaN
        pixels are black.

    Returns:
      The RGB sheet as a PIL image.

    Raises:
      TypeError, ValueError: If an argument is invalid (the message names it,
        its allowed values and what was received), or the split is empty.
      FileNotFoundError: If `data_dir` is not a finished shardsmith dataset.
      schemas.ManifestError: If the dataset has no such split.
    """
    from readers.metadata import load_manifest

    if example_kind(load_manifest(data_dir).features) == TIME_SERIES:
        return stack_sheet(data_dir, split, rows=min(per_class * 2, 24), image_size=image_size,
                           rgb_bands=rgb_bands)
    return _build_sheet(
        data_dir, split, per_class=per_class, image_size=image_size, seed=seed,
        max_classes=max_classes, max_records=max_records, resize=resize, rgb_bands=rgb_bands,
    ).image


# Dates shown per stack, at most (evenly spaced over its dates).
_MAX_DATES = 12
# Sentinel-2 / Landsat red, green, blue band names, in preference order.
_RGB_NAMES = (("B04", "B03", "B02"), ("SR_B4", "SR_B3", "SR_B2"), ("B4", "B3", "B2"))


def stack_sheet(data_dir, split: str = "train", *, rows: int = 12, image_size: int = 96,
                rgb_bands: Sequence[int] | str | None = None) -> Image.Image:
    """A sheet of a time-series split: one row per stack, one date's RGB per tile, in date order.

    Each row is labelled with the stack's file name and class; each tile is
    one date (at most 12, evenly spaced), captioned with its date, its bands
    stretched as `contact_sheet` stretches rasters. Bands: `rgb_bands`
    (1-based), else B04, B03, B02 (or Landsat's SR_B4, SR_B3, SR_B2) when the
    stacks have them, else the first three.

    Raises:
      ValueError: For an argument out of range.
    """
    from readers.metadata import load_manifest
    from readers.targets.overlay import INK as _INK, fit as _fit, line_height as _line_height
    from readers.time_series import time_series_dataset_from_tfrecords
    from schemas.time_series import STACK_BANDS, STACK_DATES, date_of_days

    rows = _check_int("rows", rows, 1, 100)
    image_size = _check_int("image_size", image_size, 16, 1024)
    classes = load_manifest(data_dir).class_names
    ds = time_series_dataset_from_tfrecords(data_dir, split, batch_size=None, dtype=None, shuffle=False,
                                            label_mode="int" if classes else None, deterministic=True,
                                            extra_features=(FILENAME.key, STACK_DATES.key, STACK_BANDS.key))
    font = _font(12)
    line = _line_height(font)
    label_width = 220
    tiles = []
    for element in ds.take(rows):
        stack, extras = element[0].numpy(), element[-1]
        label = int(element[1].numpy()) if classes else -1
        names = [b.decode() for b in extras[STACK_BANDS.key].numpy()]
        if rgb_bands is not None:
            bands = _check_rgb_bands(rgb_bands, len(names))
        else:
            bands = next((tuple(names.index(n) + 1 for n in rgb) for rgb in _RGB_NAMES
                          if all(n in names for n in rgb)), _default_rgb_bands(len(names)))
        t = stack.shape[0]
        shown = min(t, _MAX_DATES)
        picks = sorted({round(k * (t - 1) / max(1, shown - 1)) for k in range(shown)})
        name = extras[FILENAME.key].numpy().decode("utf-8", "backslashreplace")
        cls = ds.class_names[label] if 0 <= label < len(ds.class_names) else "no class"
        dates = extras[STACK_DATES.key].numpy()
        tiles.append((f"{name} ({cls})", [
            (date_of_days(dates[k]).isoformat(),
             Image.fromarray(_stretch_to_rgb(stack[k], bands, stretch=stack.dtype != np.uint8)).resize(
                 (image_size, image_size), Image.NEAREST)) for k in picks]))
    if not tiles:
        raise ValueError(f"Split {split!r} of {os.fspath(data_dir)!r} has no stacks to show.")
    columns = max(len(row) for _, row in tiles)
    width = 2 * _MARGIN + label_width + columns * (image_size + _GAP)
    height = 2 * _MARGIN + len(tiles) * (image_size + line + _GAP)
    sheet = Image.new("RGB", (width, height), _WHITE)
    draw = ImageDraw.Draw(sheet)
    for r, (title, row) in enumerate(tiles):
        top = _MARGIN + r * (image_size + line + _GAP)
        draw.text((_MARGIN, top + image_size // 2), _fit(font, title, label_width - _GAP, path=True),
                  fill=_INK, font=font)
        for c, (caption, tile) in enumerate(row):
            left = _MARGIN + label_width + c * (image_size + _GAP)
            sheet.paste(tile, (left, top))
            draw.text((left, top + image_size), caption, fill=_MUTED, font=font)
    return sheet


# --- The count chart ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _ChartLayout:
    """Where the count chart's rows and bars go; all sizes in pixels."""

    classes: int
    splits: int
    label_width: int
    row: int
    header_height: int
    footer_height: int
    panel: int = 300
    # Room after the longest bar for its count.
    reserve: int = 60

    @property
    def bar_width(self) -> int:
        """Length of the longest bar of a panel."""
        return self.panel - self.reserve

    @property
    def size(self) -> tuple[int, int]:
        width = 2 * _MARGIN + self.label_width + max(1, self.splits) * (self.panel + 2 * _GAP)
        height = 2 * _MARGIN + self.header_height + self.classes * self.row + self.footer_height
        return width, height

    def row_top(self, row: int) -> int:
        return _MARGIN + self.header_height + row * self.row

    def bar_origin(self, panel: int, row: int) -> tuple[int, int]:
        """(x, y) of the axis of `panel` in the middle of `row`; the bar starts at x + 1."""
        x = _MARGIN + self.label_width + panel * (self.panel + 2 * _GAP) + _GAP
        return x, self.row_top(row) + self.row // 2


def _chart_layout(manifest: Manifest) -> _ChartLayout:
    from readers.targets.overlay import line_height as _line_height

    font = _font(12)
    names = manifest.class_names[:_MAX_CHART_CLASSES]
    return _ChartLayout(
        classes=len(names),
        splits=len(manifest.splits),
        label_width=min(max([60] + [int(font.getlength(n)) + _GAP for n in names]), 240),
        row=_line_height(font) + 4,
        header_height=_line_height(_font(16)) + _line_height(font) + _GAP,
        footer_height=_GAP + (len(manifest.class_names) > len(names)) * _line_height(font),
    )


def _count_chart(manifest: Manifest, title: str) -> Image.Image:
    """Horizontal bars of images per class, one panel per split."""
    from readers.targets.overlay import INK as _INK, fit as _fit, line_height as _line_height

    layout = _chart_layout(manifest)
    names = manifest.class_names[: layout.classes]
    title_font, font = _font(16), _font(12)
    width, height = layout.size
    image = Image.new("RGB", layout.size, _WHITE)
    draw = ImageDraw.Draw(image)
    draw.text(
        (_MARGIN, _MARGIN), _fit(title_font, title, width - 2 * _MARGIN, path=True),
        font=title_font, fill=_INK,
    )
    for i, name in enumerate(names):
        y = layout.row_top(i)
        if i % 2:
            draw.rectangle((_MARGIN, y, width - _MARGIN, y + layout.row - 1), fill=_STRIPE)
        name = _fit(font, name, layout.label_width - _GAP)
        draw.text((_MARGIN, y + 2), name, font=font, fill=_INK)
    for p, (split, info) in enumerate(manifest.splits.items()):
        counts = (info.class_counts or (0,) * len(manifest.class_names))[: layout.classes]
        x0, _ = layout.bar_origin(p, 0)
        top = layout.row_top(0)
        heading = _fit(font, f"{split}: {info.num_records:,} images", layout.panel)
        draw.text((x0, top - _line_height(font) - 2), heading, font=font, fill=_INK)
        draw.line((x0, top, x0, top + layout.classes * layout.row - 1), fill=_MUTED)
        largest = max(counts, default=0) or 1
        for i, n in enumerate(counts):
            y = layout.row_top(i)
            length = max(1, round(layout.bar_width * n / largest)) if n else 0
            if length:
                draw.rectangle((x0 + 1, y + 3, x0 + length, y + layout.row - 4), fill=_BAR)
            draw.text((x0 + length + 4, y + 2), f"{n:,}", font=font, fill=_INK if n else _WARN)
    if len(manifest.class_names) > layout.classes:
        note = f"{len(manifest.class_names) - layout.classes:,} more classes not shown."
        y = layout.row_top(layout.classes) + _GAP
        draw.text((_MARGIN, y), note, font=font, fill=_WARN)
    return image


def count_chart(data_dir: str | os.PathLike) -> Image.Image:
    """Images per class in every split, as horizontal bars, from the manifest.

    One panel per split, classes in label order (the first 1000), the count
    written after each bar; zero counts in red.

    Raises:
      FileNotFoundError: If `data_dir` is not a finished shardsmith dataset.
    """
    from readers.metadata import load_manifest

    manifest = load_manifest(data_dir)
    return _count_chart(manifest, f"Images per class: {os.fspath(data_dir)}")


# --- Command line -------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the options of `shardsmith preview` to `parser`."""
    parser.add_argument("dataset_dir", help="Folder written by the converter.")
    parser.add_argument("--split", default="train", help="Split to show (default: train).")
    parser.add_argument(
        "--output", default="preview.png",
        help="Contact sheet PNG to write (default: preview.png). The class-count chart "
        "goes beside it, as <name>_counts.png.",
    )
    parser.add_argument("--per_class", type=int, default=6, help="Images per class (default: 6).")
    parser.add_argument(
        "--image_size", type=int, default=128,
        help="Tile side: the size the reader resizes to (default: 128).",
    )
    parser.add_argument(
        "--resize", default="stretch", choices=_RESIZE_POLICIES,
        help="The reader's resize policy (default: stretch).",
    )
    parser.add_argument(
        "--rgb_bands", default=None,
        help="Rasters and patches of multi-band scenes: the bands shown as red, green, blue, "
        "numbered from 1 as GDAL numbers them, e.g. 4,3,2, or one band as grey (default: the "
        "first three, or the single band as grey); 16-bit and float bands are each stretched to "
        "their 2-98 %% percentiles per image, 8-bit ones shown as stored; nodata and NaN black.",
    )
    parser.add_argument("--seed", type=int, default=0, help="Picks the images (default: 0).")
    parser.add_argument(
        "--max_classes", type=int, default=20,
        help="Show the first this many classes in label order (default: 20).",
    )
    parser.add_argument(
        "--max_records", type=int, default=5000,
        help="Scan at most this many records to find images of every class (default: 5000).",
    )
    parser.add_argument(console.VERBOSE_FLAG, action="store_true", help=console.VERBOSE_HELP)


def _counts_path(output: str) -> str:
    root, _ = os.path.splitext(output)
    return f"{root}_counts.png"


def main(argv: list[str] | None = None) -> int:
    """`shardsmith preview`: writes the sheet and the chart, prints their paths.

    Returns:
      0 on success; 2 with a one-line error on stderr if the folder is not a
      dataset, the split does not exist, or an option is invalid.
    """
    argv = sys.argv[1:] if argv is None else argv
    with console.entry_point(argv):  # Logging, and quiet C++ libraries.
        return _main(argv)


def _op_error() -> type[Exception]:
    """TensorFlow's `OpError` (an unreadable shard), whose import the error path alone needs."""
    from schemas.tf_runtime import tf

    return tf.errors.OpError


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=_PROG, description=__doc__.splitlines()[0])
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or argparse's own usage error.
        return int(e.code or 0)
    counts_output = _counts_path(args.output)
    try:
        sheet = contact_sheet(
            args.dataset_dir, args.split, per_class=args.per_class, image_size=args.image_size,
            seed=args.seed, max_classes=args.max_classes, max_records=args.max_records,
            resize=args.resize, rgb_bands=args.rgb_bands,
        )
        chart = count_chart(args.dataset_dir)
        _save_png(sheet, args.output)
        _save_png(chart, counts_output)
    except (FileNotFoundError, ManifestError, ValueError, TypeError, _op_error()) as e:
        message = " ".join(str(getattr(e, "message", None) or e).split())
        print(f"{_PROG}: error: {message}", file=sys.stderr)
        return 2
    print(args.output)
    print(counts_output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
