"""Scenes cut into stored patches: the planning header and the patches of a band of patch rows.

`imaging.patches` says where patches start and reads windows; this module
turns a scene into what the converter plans and stores (issue 25):

- `scene_header` reads a TIFF's header only (a few KB), for the driver to
  plan the scene's work items (`work_items`: bands of patch rows, a row
  wider than the budget split into column ranges);
- `cut_rows` reads the patches of one work item window by window
  (`SceneReader`: never the whole scene), skips those with too much nodata,
  applies `--raster_bands`/`--raster_dtype` as `imaging.raster` does, and
  stores each as a raw or PNG record like a whole raster.

Framework-free (numpy, tifffile, Pillow).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, BinaryIO

import numpy as np
from PIL import Image

import schemas
from imaging import raster as _raster
from imaging.errors import ImageRejected
from imaging.formats import _pil
from imaging.formats._shared import ValidImage
from imaging.patches import PatchOptions, SceneReader, nodata_share, offsets, patch_georef

__all__ = ["SceneHeader", "Cut", "WorkItem", "scene_header", "work_items", "cut_rows"]

# Decoded bytes of the patches one work item holds at most (at least one patch):
# a large scene spreads over workers and shards, and a shard writer holds
# about one item's records at a time per read-ahead thread. A patch row wider
# than this (a Sentinel-2 row of 512-px patches in 13 float32 bands is ~300 MB)
# is split into column ranges.
_ITEM_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class SceneHeader:
    """What planning needs of a scene: its size, bands and sample type, and how it is stored.

    Attributes:
      segment_shape: (rows, columns) of one tile or strip; None: unknown
        (work items then ignore how the scene is stored).
    """

    height: int
    width: int
    bands: int
    dtype: str
    segment_shape: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class Cut:
    """The outcome of one band of patch rows (`cut_rows`).

    Attributes:
      images: The stored patches (`ValidImage`, `patch` set), row by row.
      skipped: (y, x) of the patches left out for their nodata share.
      shares: The nodata share of each skipped patch, in the same order.
    """

    images: list[ValidImage]
    skipped: list[tuple[int, int]]
    shares: list[float]


def scene_header(source: str | os.PathLike | BinaryIO, name: str, options: _raster.RasterOptions) -> SceneHeader:
    """A scene's size, bands and sample type from its header; no pixel is decoded.

    Raises:
      ImageRejected: As `SceneReader` does; 'missing_bands' for --raster_bands
        past its bands; 'too_large' when one patch holds more samples than
        --max_pixels; 'unsupported_dtype' for samples raw records cannot hold.
    """
    with SceneReader(source, name) as scene:
        header = SceneHeader(scene.height, scene.width, scene.bands, scene.dtype.name, scene.segment_shape)
    dtype = {"int8": "int16", "float16": "float32"}.get(header.dtype, header.dtype)
    if dtype not in schemas.RAW_DTYPES:
        raise ImageRejected("unsupported_dtype", f"{name} has {header.dtype} samples; stored types are "
                                                 f"{', '.join(schemas.RAW_DTYPES)}")
    if options.bands is not None:
        missing = [b for b in options.bands if b > header.bands]
        if missing:
            raise ImageRejected("missing_bands", f"{name} has {header.bands} band{'s' * (header.bands != 1)}; "
                                                 f"--raster_bands asks for {missing}")
    patch = options.patch
    bands = header.bands if options.bands is None else len(options.bands)
    samples = patch.size[0] * patch.size[1] * bands
    if samples > options.max_pixels:
        raise ImageRejected("too_large", f"{name}: a {patch.size[0]}x{patch.size[1]} patch of {bands} "
                                         f"bands is {samples:,} samples, more than "
                                         f"--max_pixels={options.max_pixels:,}")
    return header


@dataclasses.dataclass(frozen=True)
class WorkItem:
    """One work item of a scene: the patches whose top row y is in [y0, y1), left column x in [x0, x1).

    Attributes:
      y0, y1: The rows of the patches' top-left corners, half-open.
      x0, x1: Their columns, half-open; None: every column (the item is a
        band of whole patch rows, the common case).
      patches: How many patches it holds (kept or skipped).
    """

    y0: int
    y1: int
    x0: int | None = None
    x1: int | None = None
    patches: int = 0

    @property
    def key(self) -> str:
        """How the plan carries it: 'y0,y1', or 'y0,y1,x0,x1' for a column range (`parse`)."""
        if self.x0 is None:
            return f"{self.y0},{self.y1}"
        return f"{self.y0},{self.y1},{self.x0},{self.x1}"

    @property
    def first(self) -> bool:
        """Whether it is the scene's first item (the one that counts the scene as an input)."""
        return self.y0 == 0 and not self.x0

    def name(self, rel_path: str) -> str:
        """How normalized.jsonl names it: PATH#patch_rows=Y0,Y1[#patch_columns=X0,X1].

        Also what places it in a shard (`conversion.plan`): a band of whole
        rows keeps the name, and so the shard, it had before rows were split.
        """
        name = f"{rel_path}#patch_rows={self.y0},{self.y1}"
        if self.x0 is not None:
            name += f"#patch_columns={self.x0},{self.x1}"
        return name

    @classmethod
    def parse(cls, key: str) -> WorkItem:
        """The item of a `key` ('y0,y1' or 'y0,y1,x0,x1'); `patches` is not carried (0).

        Raises:
          ValueError: For any other text, naming what was received.
        """
        try:
            numbers = [int(v) for v in key.split(",")]
        except (AttributeError, ValueError):
            numbers = []
        if len(numbers) not in (2, 4) or numbers[0] >= numbers[1] or (
                len(numbers) == 4 and numbers[2] >= numbers[3]):
            raise ValueError(f"A scene's work item must be 'y0,y1' or 'y0,y1,x0,x1' with y0 < y1 and "
                             f"x0 < x1. Received: {key!r}")
        return cls(*numbers)


def work_items(header: SceneHeader, options: PatchOptions) -> list[WorkItem]:
    """The scene's work items, in row order then column order, covering each patch once.

    An item holds as many whole patch rows as fit `_ITEM_BYTES` of decoded
    patches (the scene's bands and sample type). Rows wider than that are
    split into column ranges of about equal numbers of patches, each item
    within `_ITEM_BYTES` and of one patch at least: every item stays near
    the budget in both directions, whatever the scene's width. Those items
    hold the patch rows that start within one tile's height together (as
    the budget allows), so that a tile taller than a patch is decoded once,
    not once per patch row. A scene without patches (smaller than one,
    under 'drop') has none.
    """
    rows = offsets(header.height, options.size[0], options.stride[0], options.edge)
    columns = offsets(header.width, options.size[1], options.stride[1], options.edge)
    if not rows or not columns:
        return []
    patch_bytes = max(1, options.size[0] * options.size[1] * header.bands * np.dtype(header.dtype).itemsize)
    per_item = _ITEM_BYTES // patch_bytes  # Patches an item holds within the budget.
    out = []
    if per_item >= len(columns):
        step = per_item // len(columns)
        for k in range(0, len(rows), step):
            chunk = rows[k:k + step]
            end = rows[k + step] if k + step < len(rows) else chunk[-1] + 1
            out.append(WorkItem(chunk[0], end, patches=len(chunk) * len(columns)))
        return out
    # Rows wider than the budget: ranges of columns, split as evenly as the count allows,
    # of `together` patch rows (those a tile row holds, within the budget).
    segment_rows = header.segment_shape[0] if header.segment_shape else 1
    together = max(1, min(per_item, -(-segment_rows // options.stride[0]), len(rows)))
    per_range = max(1, per_item // together)
    ranges = -(-len(columns) // per_range)
    cuts = [len(columns) * k // ranges for k in range(ranges + 1)]
    for k in range(0, len(rows), together):
        chunk = rows[k:k + together]
        end = rows[k + together] if k + together < len(rows) else chunk[-1] + 1
        for a, b in zip(cuts, cuts[1:]):
            x1 = columns[b] if b < len(columns) else columns[-1] + 1
            out.append(WorkItem(chunk[0], end, columns[a], x1, len(chunk) * (b - a)))
    return out


def cut_rows(source: str | os.PathLike | BinaryIO, name: str, y0: int, y1: int,
             options: _raster.RasterOptions, columns: tuple[int, int] | None = None) -> Cut:
    """The stored patches of the scene whose top row lies in [y0, y1) (a `WorkItem`).

    A patch whose nodata share (`nodata_share`: padding counts) exceeds
    --raster_max_nodata is skipped. The others are stored as whole rasters
    are (`imaging.formats.tiff`): uint8/uint16 of 1, 3 or 4 bands as PNG,
    the rest raw; band statistics of each; with --raster_georef the scene's
    georeferencing moved to the patch's corner.

    Args:
      source, name: The scene, and how errors name it.
      y0, y1: The item's rows of patch corners, half-open.
      options: The raster options, `patch` set.
      columns: (x0, x1): only the patches whose left column is in [x0, x1)
        (an item of a row split into column ranges); None: every column.
        The reader then keeps only those columns of what it decodes (strips
        span the scene's width).

    Raises:
      ImageRejected: As `SceneReader.read` and `imaging.raster.apply_options` do.
    """
    patch = options.patch
    height, width = patch.size
    images, skipped, shares = [], [], []
    with SceneReader(source, name) as scene:
        rows = [y for y in offsets(scene.height, height, patch.stride[0], patch.edge) if y0 <= y < y1]
        xs = offsets(scene.width, width, patch.stride[1], patch.edge)
        if columns is not None:
            xs = tuple(x for x in xs if columns[0] <= x < columns[1])
            if xs:
                scene.keep_columns(xs[0], xs[-1] + width)
        georef = scene.georef if options.georef else None
        for y in rows:
            for x in xs:
                window = scene.read(y, x, height, width, copy=False)  # Encoded at once
                padded = scene.padded(y, x, height, width)
                share = nodata_share(window, padded if padded.any() else None, scene.nodata)
                if share > patch.max_nodata:
                    skipped.append((y, x))
                    shares.append(share)
                    continue
                image = _stored(_raster.apply_options(window, scene.nodata, options, name), y, x)
                if georef is not None:
                    image = dataclasses.replace(image, georef=patch_georef(georef, y, x, height, width))
                images.append(image)
    return Cut(images, skipped, shares)


def _stored(r: _raster.Raster, y: int, x: int) -> ValidImage:
    """One patch as a record's image: PNG or raw, as `imaging.formats.tiff` stores a page."""
    array = r.array
    h, w, c = array.shape
    stats = _raster.band_stats(array, r.nodata)
    details: dict[str, Any] = r.details
    if not _raster.is_png_storable(array):
        return ValidImage(_raster.raw_bytes(array), schemas.raw_format(array.dtype), h, w, c, "tiff",
                          ("store_tiff_as_raw",) + r.actions, details=details, band_stats=stats,
                          patch=(y, x))
    if array.dtype == np.uint8:
        # Pillow's encoder, as for whole 8-bit rasters.
        png = _pil.encode(Image.fromarray(array[:, :, 0] if c == 1 else array), "png")
    else:
        png = _raster.png_bytes(array)
    return ValidImage(png, "png", h, w, c, "tiff", ("reencode_tiff_to_png",) + r.actions, details=details,
                      band_stats=stats, patch=(y, x))
