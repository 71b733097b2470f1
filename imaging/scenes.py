"""Scenes cut into stored patches: the planning header and the patches of a band of patch rows.

`imaging.patches` says where patches start and reads windows; this module
turns a scene into what the converter plans and stores (issue 25):

- `scene_header` reads a TIFF's header only (a few KB), for the driver to
  plan the scene's work items (`row_bands`);
- `cut_rows` reads the patches of one band of patch rows window by window
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

__all__ = ["SceneHeader", "Cut", "scene_header", "row_bands", "cut_rows"]

# Decoded bytes of the patches one work item holds at most (at least one patch row):
# a large scene spreads over workers and shards, and a shard writer holds
# about one item's records at a time per read-ahead thread.
_ITEM_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class SceneHeader:
    """What planning needs of a scene: its size, bands and sample type."""

    height: int
    width: int
    bands: int
    dtype: str


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
        header = SceneHeader(scene.height, scene.width, scene.bands, scene.dtype.name)
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


def row_bands(header: SceneHeader, options: PatchOptions) -> list[tuple[int, int, int]]:
    """The scene's work items: (y0, y1, patches) for bands of whole patch rows.

    An item holds the patches whose top row y is in [y0, y1): as many patch
    rows as fit `_ITEM_BYTES` of decoded patches, at least one. A scene
    without patches (smaller than one, under 'drop') has none.
    """
    rows = offsets(header.height, options.size[0], options.stride[0], options.edge)
    columns = len(offsets(header.width, options.size[1], options.stride[1], options.edge))
    if not rows or not columns:
        return []
    patch_bytes = options.size[0] * options.size[1] * header.bands * np.dtype(header.dtype).itemsize
    per_item = max(1, _ITEM_BYTES // max(1, patch_bytes * columns))
    out = []
    for k in range(0, len(rows), per_item):
        chunk = rows[k:k + per_item]
        end = rows[k + per_item] if k + per_item < len(rows) else chunk[-1] + 1
        out.append((chunk[0], end, len(chunk) * columns))
    return out


def cut_rows(source: str | os.PathLike | BinaryIO, name: str, y0: int, y1: int,
             options: _raster.RasterOptions) -> Cut:
    """The stored patches of the scene whose top row lies in [y0, y1) (`row_bands`).

    A patch whose nodata share (`nodata_share`: padding counts) exceeds
    --raster_max_nodata is skipped. The others are stored as whole rasters
    are (`imaging.formats.tiff`): uint8/uint16 of 1, 3 or 4 bands as PNG,
    the rest raw; band statistics of each; with --raster_georef the scene's
    georeferencing moved to the patch's corner.

    Raises:
      ImageRejected: As `SceneReader.read` and `imaging.raster.apply_options` do.
    """
    patch = options.patch
    height, width = patch.size
    images, skipped, shares = [], [], []
    with SceneReader(source, name) as scene:
        rows = [y for y in offsets(scene.height, height, patch.stride[0], patch.edge) if y0 <= y < y1]
        columns = offsets(scene.width, width, patch.stride[1], patch.edge)
        georef = scene.georef if options.georef else None
        for y in rows:
            for x in columns:
                window = scene.read(y, x, height, width)
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
