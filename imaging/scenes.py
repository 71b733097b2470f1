"""Scenes cut into stored patches: the planning header and the patches of a band of patch rows.

`imaging.patches` says where patches start and reads windows; this module
turns a scene into what the converter plans and stores (issue 25):

- `scene_header` reads a TIFF's header only (a few KB), for the driver to
  plan the scene's work items (`work_items`: bands of patch rows, a row
  wider than the budget split into column ranges);
- `cut_rows` reads the patches of one work item window by window
  (`SceneReader`: never the whole scene), skips those with too much nodata,
  applies `--raster_bands`/`--raster_dtype` as `imaging.raster` does, then
  `--max_side`/`--min_side` as `imaging.formats.tiff` resizes a whole raster
  (its georeferencing scaled with it), and stores each as a raw or PNG
  record like a whole raster;
- `label_header` and `LabelRaster` read a scene's label raster (its mask,
  --masks_dir): the same windows as class ids, padded with its nodata value
  or the ignore id (255, 65535 for 16-bit masks), cut at the same offsets
  as the scene and resized with the nearest neighbour.

Framework-free (numpy, tifffile, Pillow).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import math
import os
import warnings
from typing import Any, BinaryIO

import numpy as np
from PIL import Image

import schemas
from imaging import masks as _masks, raster as _raster, resize as _resize
from imaging.errors import ImageRejected
from imaging.formats import _pil
from imaging.formats._shared import ValidImage, with_georef, with_mask_stats
from imaging.patches import PatchOptions, SceneReader, nodata_share, offsets, open_scene, patch_georef
from imaging.sniff import sniff_format

__all__ = ["SceneHeader", "Cut", "WorkItem", "scene_header", "work_items", "cut_rows", "LabelHeader",
           "label_header", "label_padding", "LabelRaster", "external_mask"]

_log = logging.getLogger(__name__)
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
      masks: With a label raster, the class ids (height, width) of each
        stored patch at its stored size, in the order of `images`; None
        without one.
      scene_size: (height, width) of the whole scene, which fixes its patch
        grid (`imaging.patches.grid`): recorded for `verify` and `inspect`;
        None when unknown.
    """

    images: list[ValidImage]
    skipped: list[tuple[int, int]]
    shares: list[float]
    masks: list[np.ndarray] | None = None
    scene_size: tuple[int, int] | None = None


def scene_header(source: str | os.PathLike | BinaryIO, name: str, options: _raster.RasterOptions) -> SceneHeader:
    """A scene's size, bands and sample type from its header; no pixel is decoded.

    Raises:
      ImageRejected: As `SceneReader` does; 'missing_bands' for --raster_bands
        past its bands; 'too_large' when one patch holds more samples than
        --max_pixels, or a JPEG 2000 scene decoded whole (one tile) does;
        'unsupported_dtype' for samples raw records cannot hold.
    """
    with open_scene(source, name) as scene:  # A TIFF's or a JPEG 2000's (`imaging.jp2`).
        header = SceneHeader(scene.height, scene.width, scene.bands, scene.dtype.name, scene.segment_shape)
        whole = scene.decodes_whole
    if whole and header.height * header.width * header.bands > options.max_pixels:
        # Every work item would decode all of it: --max_pixels bounds that decode as a whole image's.
        raise ImageRejected(
            "too_large", f"{name} is a JPEG 2000 of {header.width}x{header.height}x{header.bands} = "
                         f"{header.height * header.width * header.bands:,} samples decoded whole for each work item "
                         "(one tile, or every tile's packet headers in its main header), more than "
                         f"--max_pixels={options.max_pixels:,}; tile it (gdal_translate -of JP2OpenJPEG -co "
                         "BLOCKXSIZE=1024 -co BLOCKYSIZE=1024, or to a tiled GeoTIFF)")
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
    not once per patch row. So are the rows of a tiled scene whose tiles
    hold more patch rows than an item of whole rows would (a Sentinel-2
    JPEG 2000 band's 1024-px tiles and 256-px patches: each tile row was
    decoded 4 times, once per item). A scene without patches (smaller than
    one, under 'drop') has none.
    """
    rows = offsets(header.height, options.size[0], options.stride[0], options.edge)
    columns = offsets(header.width, options.size[1], options.stride[1], options.edge)
    if not rows or not columns:
        return []
    patch_bytes = max(1, options.size[0] * options.size[1] * header.bands * np.dtype(header.dtype).itemsize)
    per_item = _ITEM_BYTES // patch_bytes  # Patches an item holds within the budget.
    out = []
    if per_item >= len(columns) and not _tall_tiles(header, options, per_item // len(columns), len(rows)):
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


def _tall_tiles(header: SceneHeader, options: PatchOptions, step: int, rows: int) -> bool:
    """Whether a tiled scene's tile rows hold more patch rows than items of `step` whole rows.

    Strips span the scene's width: column ranges would decode them again, so
    a striped scene keeps whole rows.
    """
    if header.segment_shape is None or header.segment_shape[1] >= header.width:
        return False
    return min(-(-header.segment_shape[0] // options.stride[0]), rows) > step


def cut_rows(source: str | os.PathLike | BinaryIO, name: str, y0: int, y1: int,
             options: _raster.RasterOptions, resize: _resize.ResizeOptions | None = None,
             labels: LabelRaster | None = None, columns: tuple[int, int] | None = None,
             sidecars=None) -> Cut:
    """The stored patches of the scene whose top row lies in [y0, y1) (a `WorkItem`).

    A patch whose nodata share (`nodata_share`: padding counts) exceeds
    --raster_max_nodata is skipped (its mask too). The others are stored as
    whole rasters are (`imaging.formats.tiff`): resized by `resize` (each
    patch cut at full resolution, then scaled as a whole raster of its size
    would be: Lanczos, `imaging.resize.resize_array`), uint8/uint16 of 1, 3
    or 4 bands as PNG, the rest raw; band statistics of each; with
    --raster_georef the scene's georeferencing moved to the patch's corner,
    and scaled with a resize (`imaging.georef.Georef.for_size`).

    Args:
      source: The scene (a path or a seekable binary file).
      name: Its relative path, for messages.
      y0, y1: The work item's rows of patch corners, half-open.
      options: The raster options, `patch` set.
      resize: --max_side/--min_side; None or inactive: stored at full size.
      labels: The scene's label raster (`LabelRaster`, of the scene's size):
        the same window of each kept patch, resized with the nearest
        neighbour, goes to `Cut.masks`; None: no masks.
      columns: (x0, x1): only the patches whose left column is in [x0, x1)
        (an item of a row split into column ranges); None: every column.
        The reader then keeps only those columns of what it decodes (strips
        span the scene's width).
      sidecars: What the scene's GIS sidecars say (`imaging.sidecars.Sidecars`:
        a PAM file's nodata, a world file's georeferencing), applied over its
        tags as GDAL applies them; None: its tags alone.

    Raises:
      ImageRejected: As `SceneReader.read`, `imaging.raster.apply_options`
        and `LabelRaster.read` do.
    """
    patch = options.patch
    height, width = patch.size
    resize = resize if resize is not None and resize.active else None
    images, skipped, shares = [], [], []
    masks: list[np.ndarray] | None = None if labels is None else []
    with open_scene(source, name) as scene, contextlib.ExitStack() as stack:
        external = None if scene.has_mask else external_mask(sidecars, scene, name)
        if external is not None:
            stack.enter_context(external)
        rows = [y for y in offsets(scene.height, height, patch.stride[0], patch.edge) if y0 <= y < y1]
        xs = offsets(scene.width, width, patch.stride[1], patch.edge)
        if columns is not None:
            xs = tuple(x for x in xs if columns[0] <= x < columns[1])
            if xs:
                scene.keep_columns(xs[0], xs[-1] + width)
        georef = scene.georef if options.georef else None
        if sidecars is not None:
            scene.use_nodata(sidecars.nodata_over(scene.nodata, scene.bands))
            georef = None if georef is None else sidecars.georef(georef)
        for y in rows:
            for x in xs:
                window = scene.read(y, x, height, width, copy=False)  # Encoded at once
                padded = scene.padded(y, x, height, width)
                masked = None
                if scene.has_mask:
                    # GDAL's internal mask marks no data too (orthophotos, COGs): as its dataset mask.
                    masked = scene.masked(y, x, height, width)
                    padded = padded | masked
                elif external is not None:  # Its external mask (scene.tif.msk), as GDAL takes it.
                    masked = (external.read(y, x, height, width) == 0).all(axis=2) & ~padded
                    padded = padded | masked
                share = nodata_share(window, padded if padded.any() else None, scene.nodata)
                if share > patch.max_nodata:
                    skipped.append((y, x))
                    shares.append(share)
                    continue
                image = _stored(_raster.apply_options(window, scene.nodata, options, name, masked), y, x, resize,
                                scene.source_format)
                if sidecars is not None and (sidecars.used or sidecars.warnings):
                    image = dataclasses.replace(image, details={**(image.details or {}), **sidecars.details()})
                if georef is not None:
                    image = with_georef(image, patch_georef(georef, y, x, height, width))
                if labels is not None:
                    image, ids = _with_mask(image, labels.read(y, x, height, width))
                    masks.append(ids)
                images.append(image)
        size = (scene.height, scene.width)
    return Cut(images, skipped, shares, masks, size)


def external_mask(sidecars, scene: SceneReader, name: str) -> SceneReader | None:
    """A reader of the scene's external mask (`imaging.sidecars.Sidecars.mask`), of its size; else None.

    One that cannot be read, or of another size, is left out with a warning
    (the scene is still cut), as `imaging.raster` leaves it out of a whole raster.
    """
    if sidecars is None or sidecars.mask is None:
        return None
    what = f"{name}'s external mask ({name}.msk)"
    try:
        reader = SceneReader(sidecars.mask, what)
    except ImageRejected as e:
        _log.warning("%s is left out: %s", what, e.message)
        return None
    if (reader.height, reader.width) != (scene.height, scene.width):
        _log.warning("%s is left out: it is %dx%d, the scene %dx%d", what, reader.width, reader.height,
                     scene.width, scene.height)
        reader.close()
        return None
    return reader


def _with_mask(image: ValidImage, ids: np.ndarray) -> tuple[ValidImage, np.ndarray]:
    """The patch and its mask at the patch's stored size (nearest neighbour, as `imaging.masks.align_mask`)."""
    stored = (image.height, image.width)
    if tuple(ids.shape) == stored:
        return image, ids
    original = list(ids.shape)
    ids = np.ascontiguousarray(_masks.nearest(ids, stored))
    details = {**(image.details or {}), "mask": {"original": original, "stored": list(stored)}}
    return dataclasses.replace(image, actions=(*image.actions, "mask_resized"), details=details), ids


def _stored(r: _raster.Raster, y: int, x: int, resize: _resize.ResizeOptions | None = None,
            fmt: str = "tiff") -> ValidImage:
    """One patch as a record's image: resized, then PNG or raw, as `imaging.formats.tiff` stores a page.

    `fmt` is the scene's format ('tiff', 'jpeg2000'), as the record and its actions say.
    """
    array = r.array
    details: dict[str, Any] = r.details
    actions = r.actions
    if resize is not None and not resize.allows(*array.shape[:2]):
        original = array.shape[:2]
        array = _resize.resize_array(array, resize)
        actions = actions + (resize.action,)
        details = {**(details or {}), "original": list(original), "stored": list(array.shape[:2])}
    masked = r.masked
    if masked is not None and masked.shape != array.shape[:2]:
        masked = _masks.nearest(masked.astype(np.uint8), array.shape[:2]).astype(bool)
    h, w, c = array.shape
    stats = _raster.band_stats(array, r.nodata, masked)
    details = with_mask_stats(dataclasses.replace(r, masked=masked, details=details), stats).details
    if not _raster.is_png_storable(array):
        return ValidImage(_raster.raw_bytes(array), schemas.raw_format(array.dtype), h, w, c, fmt,
                          (f"store_{fmt}_as_raw",) + actions, details=details, band_stats=stats,
                          patch=(y, x))
    if array.dtype == np.uint8:
        # Pillow's encoder, as for whole 8-bit rasters.
        png = _pil.encode(Image.fromarray(array[:, :, 0] if c == 1 else array), "png")
    else:
        png = _raster.png_bytes(array)
    return ValidImage(png, "png", h, w, c, fmt, (f"reencode_{fmt}_to_png",) + actions, details=details,
                      band_stats=stats, patch=(y, x))


@dataclasses.dataclass(frozen=True)
class LabelHeader:
    """What planning needs of a scene's label raster (its mask), from its header.

    Attributes:
      height, width: Its size in pixels.
      bands: Its bands (a label raster read window by window has one).
      dtype: Its sample type, as numpy names it.
      nodata: Its GDAL_NODATA value, or None (always None for PNG and other
        non-TIFF masks).
      windowed: True for a TIFF, read window by window (`SceneReader`);
        False for a PNG, BMP or GIF, decoded whole (they have no windows).
    """

    height: int
    width: int
    bands: int
    dtype: str
    nodata: float | None
    windowed: bool


def label_header(source: str | os.PathLike | BinaryIO, name: str) -> LabelHeader:
    """A label raster's size, bands, sample type and nodata; no pixel is decoded.

    Raises:
      ImageRejected: 'mask_unreadable' for a header that does not read;
        'mask_lossy' for a JPEG; 'mask_not_class_ids' for a TIFF of several
        bands (a label raster is one band of class ids).
    """
    handle, close = _open(source)
    try:
        fmt = _sniff(handle)
        if fmt == "tiff":
            try:
                with SceneReader(handle, name) as scene:
                    header = LabelHeader(scene.height, scene.width, scene.bands, scene.dtype.name,
                                         scene.nodata, True)
            except ImageRejected as e:
                raise ImageRejected("mask_unreadable", f"mask {e.message}") from e
            if header.bands != 1:
                raise ImageRejected(
                    "mask_not_class_ids", f"mask {name} is a TIFF of {header.bands} bands; a label raster "
                                          "cut into patches is one band of class ids")
            return header
        if fmt == "jpeg":
            raise ImageRejected("mask_lossy", f"mask {name} is a JPEG: lossy compression changes class "
                                              "ids; store masks as PNG or TIFF")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with Image.open(handle) as im:  # Reads the header only.
                    return LabelHeader(im.height, im.width, len(im.getbands()), im.mode, None, False)
            except _pil.PIL_ERRORS as e:
                raise ImageRejected("mask_unreadable", f"mask {name}: {type(e).__name__}: {e}") from None
    finally:
        if close:
            handle.close()


def label_padding(nodata: float | None, dtype: str, name: str) -> int:
    """What a label raster's patches hold past the scene's edge: its nodata value, or the ignore id.

    The ignore id is the largest id of the stored masks' depth (255 for
    'uint8', 65535 for 'uint16'), the one the reader pads masks with and
    losses are told to ignore.

    Raises:
      ImageRejected: 'mask_not_class_ids' for a nodata value that is no
        class id of `dtype` (negative, fractional, NaN, too large).
    """
    largest = int(np.iinfo(np.dtype(dtype)).max)
    if nodata is None:
        return largest
    if math.isnan(nodata) or nodata != math.floor(nodata) or not 0 <= nodata <= largest:
        raise ImageRejected(
            "mask_not_class_ids", f"mask {name} has nodata {nodata:g}, which is no class id of its "
                                  f"{dtype} masks (0 to {largest}); it would pad its patches")
    return int(nodata)


class LabelRaster:
    """Windows of a scene's label raster as class ids, padded past its edge (`label_padding`).

    A TIFF is read window by window (`SceneReader`: only the tiles or strips
    a window overlaps); a PNG, BMP or GIF, which has no windows, is decoded
    whole once (`imaging.masks.read_mask`: palette indices, grey RGB as one
    channel). Ids are checked window by window (`imaging.masks.class_ids`):
    a float raster with fractions is rejected when a window holds one.

    Args:
      source: The label raster (a path or a seekable binary file; the caller
        closes a file it gave).
      name: Its path, for messages.
      dtype: The dataset's mask dtype, 'uint8' or 'uint16': the ids' type.

    Raises:
      ImageRejected: As `label_header` and `label_padding` do.
    """

    def __init__(self, source: str | os.PathLike | BinaryIO, name: str, dtype: str):
        if dtype not in _masks.MASK_DTYPES:
            raise ValueError(f"LabelRaster: dtype must be one of {_masks.MASK_DTYPES}. Received: {dtype!r}")
        self.name = name
        self.dtype = np.dtype(dtype)
        header = label_header(source, name)
        self.height, self.width = header.height, header.width
        self.pad = label_padding(header.nodata, dtype, name)
        self._scene: SceneReader | None = None
        self._ids: np.ndarray | None = None
        if header.windowed:
            if hasattr(source, "seek"):
                source.seek(0)
            try:
                self._scene = SceneReader(source, name)
            except ImageRejected as e:
                raise ImageRejected("mask_unreadable", f"mask {e.message}") from e
            return
        handle, close = _open(source)
        try:
            handle.seek(0)
            self._ids = self._fit(_masks.read_mask(handle.read(), name))
        finally:
            if close:
                handle.close()
        if self._ids.shape != (self.height, self.width):
            raise ImageRejected("mask_unreadable", f"mask {name} decodes to {self._ids.shape[1]}x"
                                                   f"{self._ids.shape[0]}, its header says "
                                                   f"{self.width}x{self.height}")

    @property
    def decoded_segments(self) -> int | None:
        """Strips or tiles of a TIFF label raster decoded so far (`SceneReader`); None for one decoded whole."""
        return None if self._scene is None else self._scene.decoded_segments

    def close(self) -> None:
        """Closes the TIFF (not a file the caller gave) and drops what was decoded."""
        if self._scene is not None:
            self._scene.close()
        self._ids = None

    def __enter__(self) -> LabelRaster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, y: int, x: int, height: int, width: int) -> np.ndarray:
        """The (height, width) class ids of the window at (y, x), `pad` outside the raster.

        Raises:
          ImageRejected: 'mask_not_class_ids' for a window that holds no
            class ids; 'mask_unreadable' for a strip or tile that does not
            decode.
        """
        if self._scene is not None:
            try:
                window = self._scene.read(y, x, height, width)[:, :, 0]
            except ImageRejected as e:
                raise ImageRejected("mask_unreadable", f"mask {e.message}") from e
            ids = self._fit(_masks.class_ids(window, self.name))
            padded = self._scene.padded(y, x, height, width)
        else:
            ids = np.full((height, width), self.pad, self.dtype)
            top, bottom = max(y, 0), min(y + height, self.height)
            left, right = max(x, 0), min(x + width, self.width)
            if top < bottom and left < right:
                ids[top - y:bottom - y, left - x:right - x] = self._ids[top:bottom, left:right]
            return ids
        ids = np.array(ids, order="C")  # Owned: the reader's window buffer is not kept.
        ids[padded] = self.pad
        return ids

    def _fit(self, ids: np.ndarray) -> np.ndarray:
        """Ids in the dataset's dtype; those a uint8 dataset cannot hold rejected."""
        if ids.dtype == self.dtype:
            return ids
        if self.dtype == np.uint8 and ids.size and int(ids.max()) > 255:
            raise ImageRejected(
                "mask_not_class_ids", f"mask {self.name} holds ids up to {int(ids.max())}, but its "
                                      "header said 8-bit")
        return ids.astype(self.dtype)


def _open(source) -> tuple[BinaryIO, bool]:
    """(a binary file, whether to close it) of a path, bytes or an open file."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(source), True
    if isinstance(source, (str, os.PathLike)):
        return open(source, "rb"), True
    return source, False


def _sniff(handle: BinaryIO) -> str | None:
    """The format of a file from its first bytes; the file is left at its start."""
    handle.seek(0)
    head = handle.read(132)
    handle.seek(0)
    return sniff_format(head)
