"""Satellite scenes into training patches: the patch grid, and windows read without decoding a scene.

A scene (a Sentinel-2 tile is 10980 x 10980 pixels in 13 bands, ~3 GB
decoded) is cut into patches of `PatchOptions.size`, their top-left corners
`stride` apart (issue 25):

- `offsets` and `grid` say where the patches start, under the edge policies
  `drop` (the remainder is left out), `shift` (the last patch of a row or
  column moves inward to end at the scene's edge) and `pad` (patches go on
  past the edge, the outside filled);
- `SceneReader` reads one window of a TIFF, decoding only the strips or tiles
  it overlaps (tifffile's segment decoder, imagecodecs' codecs), and keeps the
  decoded segments of the current row band, so the windows of one row of
  patches decode each segment once (`keep_columns` bounds that band to the
  columns a work item reads: strips span the scene's width); pixels outside
  the scene hold the nodata value (GDAL_NODATA), 0 without one;
- `nodata_share` is the share of a window's pixels that hold no data
  (`--raster_max_nodata` skips patches above it);
- `patch_geotransform` and `patch_georef` move a scene's GDAL geotransform
  to a patch's corner.

The converter's flags are parsed here (`PatchOptions.parse`, held by
`imaging.RasterOptions.patch`); `imaging.scenes` plans and stores the
patches. Framework-free (numpy, tifffile, imagecodecs).

    options = PatchOptions.parse("256", stride="128", edge="shift")
    with SceneReader("scene.tif") as scene:
        for y, x in grid(scene.height, scene.width, options):
            window = scene.read(y, x, *options.size)
            if nodata_share(window, scene.padded(y, x, *options.size), scene.nodata) <= options.max_nodata:
                ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import struct
from typing import Any, BinaryIO

import numpy as np

from imaging import _tiff_ifds
from imaging.errors import ImageRejected
from imaging import nodata as _nodata
from imaging._windows import check_window, outside, padding_fill, plane_fill
from imaging.georef import Georef, page_georef

__all__ = ["EDGES", "PatchOptions", "SceneReader", "grid", "nodata_share", "offsets", "open_scene",
           "padding_fill", "patch_georef", "patch_geotransform"]

# --raster_edge values; `shift` first: the default.
EDGES = ("shift", "pad", "drop")
_GDAL_NODATA = 42113
_JPEG = 7
# What tifffile raises on damaged headers and segments, beside its TiffFileError
# (its parsers and codecs fail with these on wrongly typed or truncated data).
_DAMAGE = (ValueError, TypeError, KeyError, IndexError, OverflowError, struct.error, EOFError,
           RuntimeError, OSError)


@dataclasses.dataclass(frozen=True)
class PatchOptions:
    """How rasters are cut into patches; validated when built.

    Attributes:
      size: (height, width) of a patch in pixels (--raster_patch N or H,W);
        an int N means (N, N).
      stride: (rows, columns) between the top-left corners of neighbouring
        patches (--raster_stride S or H,W); None (the default) is `size`, no
        overlap; smaller overlaps. Larger than `size` would leave pixels out
        of every patch, and is refused.
      edge: 'shift' (the default: the last patch of a row or column moves
        inward to end at the scene's edge), 'pad' (patches go on past the
        edge, the outside holding the nodata value) or 'drop' (what a whole
        patch does not fit is left out) (--raster_edge).
      max_nodata: Patches whose share of nodata pixels exceeds this are
        skipped; 1.0 (the default) keeps every patch (--raster_max_nodata).

    Raises:
      ValueError: Naming the flag, what it allows and what it received.
    """

    size: tuple[int, int]
    stride: tuple[int, int] | None = None
    edge: str = "shift"
    max_nodata: float = 1.0

    def __post_init__(self):
        size = _pair(self.size, "--raster_patch", "a patch size in pixels, N or H,W, each at least 1")
        object.__setattr__(self, "size", size)
        if self.stride is None:
            object.__setattr__(self, "stride", size)
        else:
            stride = _pair(self.stride, "--raster_stride",
                           "a stride in pixels, S or H,W, each at least 1")
            if stride[0] > size[0] or stride[1] > size[1]:
                raise ValueError(
                    f"--raster_stride must be at most the patch size {size[0]},{size[1]} (a longer "
                    f"stride leaves pixels out of every patch). Received: {self.stride!r}")
            object.__setattr__(self, "stride", stride)
        if self.edge not in EDGES:
            raise ValueError(f"--raster_edge must be one of {', '.join(EDGES)}. Received: {self.edge!r}")
        share = self.max_nodata
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise ValueError(
                f"--raster_max_nodata must be a share of pixels from 0 to 1. Received: {share!r}")
        object.__setattr__(self, "max_nodata", float(share))

    @classmethod
    def parse(cls, patch: str, stride: str | None = None, edge: str = "shift",
              max_nodata: str | float = 1.0) -> PatchOptions:
        """The options from the flags' text: '256' or '256,512', '128', 'pad', '0.5'.

        Raises:
          ValueError: Naming the flag, what it allows and what it received.
        """
        size = _parse_pair(patch, "--raster_patch", "N or H,W, e.g. 256 or 256,512")
        step = None if stride is None else _parse_pair(stride, "--raster_stride", "S or H,W, e.g. 128")
        if isinstance(max_nodata, str):
            try:
                share: Any = float(max_nodata)
            except ValueError:
                raise ValueError(f"--raster_max_nodata must be a share of pixels from 0 to 1, "
                                 f"e.g. 0.5. Received: {max_nodata!r}") from None
        else:
            share = max_nodata
        return cls(size, step, edge, share)

    def to_json(self) -> dict[str, Any]:
        """JSON-safe, for manifests and normalized.jsonl."""
        return {"size": list(self.size), "stride": list(self.stride), "edge": self.edge,
                "max_nodata": self.max_nodata}


def _pair(value, flag: str, allowed: str) -> tuple[int, int]:
    """An int N as (N, N), or two ints, each >= 1; else ValueError naming `flag`."""
    pair = (value, value) if isinstance(value, (int, np.integer)) else value
    try:
        ok = len(pair) == 2 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in pair)
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"{flag} must be {allowed}. Received: {value!r}")
    return int(pair[0]), int(pair[1])


def _parse_pair(text: str, flag: str, allowed: str):
    parts = str(text).split(",")
    try:
        numbers = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{flag} must be {allowed}. Received: {text!r}") from None
    if len(numbers) == 1:
        return numbers[0]
    if len(numbers) != 2:
        raise ValueError(f"{flag} must be {allowed}. Received: {text!r}")
    return numbers


def offsets(length: int, size: int, stride: int, edge: str) -> tuple[int, ...]:
    """The start of each patch along an axis of `length` pixels, ascending.

    - 'drop': 0, S, 2S, ... while start + size <= length;
    - 'shift': those, and one more at length - size when they leave pixels
      uncovered;
    - 'pad': 0, S, 2S, ... until a patch reaches length (it then holds
      padding past it).

    An axis shorter than a patch gives one (padded) patch at 0 under 'shift'
    and 'pad', none under 'drop'.

    Raises:
      ValueError: For a length, size or stride below 1, a stride above the
        size, or an unknown edge policy.
    """
    for what, value in (("length", length), ("size", size), ("stride", stride)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"offsets: {what} must be an integer of at least 1. Received: {value!r}")
    if stride > size:
        raise ValueError(f"offsets: stride must be at most size {size}. Received: {stride!r}")
    if edge not in EDGES:
        raise ValueError(f"offsets: edge must be one of {', '.join(EDGES)}. Received: {edge!r}")
    length, size, stride = int(length), int(size), int(stride)
    if edge == "pad":
        # The first start whose patch reaches the end is the last: ceil((L - N) / S) strides.
        last = max(0, -(-(length - size) // stride))
        return tuple(range(0, last * stride + 1, stride))
    starts = tuple(range(0, length - size + 1, stride))  # Empty when the axis is shorter than a patch.
    if edge == "drop":
        return starts
    if not starts:
        return (0,)  # Shift cannot move inward past 0: one patch, padded.
    if starts[-1] + size < length:
        return starts + (length - size,)
    return starts


def grid(height: int, width: int, options: PatchOptions) -> list[tuple[int, int]]:
    """The (y, x) top-left corner of every patch of a height x width scene, row by row."""
    rows = offsets(height, options.size[0], options.stride[0], options.edge)
    columns = offsets(width, options.size[1], options.stride[1], options.edge)
    return [(y, x) for y in rows for x in columns]


def nodata_share(window: np.ndarray, padded: np.ndarray | None, nodata: _nodata.Nodata) -> float:
    """The share of the window's pixels that hold no data, from 0 to 1.

    A pixel holds no data when every band holds `nodata`; NaN counts as
    nodata in floating-point windows, whatever `nodata` is (a NaN is no
    measurement); pixels marked in `padded` (outside the scene) count too.

    Args:
      window: (height, width, bands), or (height, width) for one band.
      padded: (height, width) booleans, True outside the scene; None: none.
      nodata: The raster's nodata value, or None; or one per band
        (`imaging.nodata`): a pixel holds no data where each band holds its own.

    Raises:
      ValueError: For an empty window, or a `padded` mask of another shape.
    """
    window = np.asarray(window)
    if window.ndim == 2:
        window = window[:, :, np.newaxis]
    if window.ndim != 3 or window.shape[0] * window.shape[1] == 0:
        raise ValueError(f"nodata_share: window must be (height, width[, bands]), not empty. "
                         f"Received shape {window.shape}")
    floating = window.dtype.kind in "fc"
    empty: np.ndarray | None = None
    if floating:
        empty = np.isnan(window)
    if isinstance(nodata, tuple):
        equal = np.zeros(window.shape, bool)
        for b, value in enumerate(_nodata.per_band(nodata, window.shape[2])):
            if value is not None and not math.isnan(value):
                np.equal(window[:, :, b], value, out=equal[:, :, b])
        empty = equal if empty is None else empty | equal
    elif nodata is not None and not math.isnan(nodata):
        equal = window == nodata
        empty = equal if empty is None else empty | equal
    if empty is None:
        missing = np.zeros(window.shape[:2], bool)
    else:
        missing = empty.all(axis=2)
    if padded is not None:
        padded = np.asarray(padded, bool)
        if padded.shape != missing.shape:
            raise ValueError(f"nodata_share: padded must have the window's shape {missing.shape}. "
                             f"Received shape {padded.shape}")
        missing |= padded
    return float(np.count_nonzero(missing)) / missing.size


def patch_geotransform(geotransform: tuple[float, ...] | None, y: int, x: int) -> tuple[float, ...] | None:
    """A scene's geotransform (GDAL order x0, dx, rx, y0, ry, dy) moved to the pixel at row y, column x.

    x0' = x0 + x*dx + y*rx and y0' = y0 + x*ry + y*dy; pixel sizes and rotation
    stay. None (no georeferencing) stays None.
    """
    if geotransform is None:
        return None
    x0, dx, rx, y0, ry, dy = geotransform
    return (x0 + x * dx + y * rx, dx, rx, y0 + x * ry + y * dy, ry, dy)


def patch_georef(georef: Georef, y: int, x: int, height: int, width: int) -> Georef:
    """The `imaging.georef.Georef` of the height x width patch at (y, x) of a scene's."""
    return Georef(georef.epsg, patch_geotransform(georef.geotransform, y, x), height, width)


def _ifd_loop(handle) -> str | None:
    """`_tiff_ifds.ifd_loop` of a path or an open binary file."""
    if isinstance(handle, str):
        with open(handle, "rb") as fh:
            return _tiff_ifds.ifd_loop(fh)
    return _tiff_ifds.ifd_loop(handle)


class SceneReader:
    """Windows of one TIFF page, decoding only the strips or tiles each overlaps.

    Strips and tiles, band-interleaved (planar) and pixel-interleaved, any
    compression tifffile decodes with imagecodecs (LZW, DEFLATE, ZSTD, JPEG,
    ..., with predictors), every sample type tifffile reads, any number of
    bands. Decoded segments of the current row band (the segment rows the
    last window covered) are kept: reading the windows of one row of patches
    left to right decodes each segment once, and at most one row band is
    held. Values are the file's, in native byte order; palette images give
    their indices.

    Not thread-safe: one reader per thread or process.

    Args:
      source: A path, the file's bytes, or a seekable binary file object.
      name: How errors name the file; default: the path, or '<bytes>'.
      page: Index among the file's full-resolution image pages (overviews and
        masks left out).

    Attributes:
      name: As given.
      height, width, bands: The page's size.
      dtype: The sample type of `read`'s arrays (1-bit samples as uint8).
      nodata: The GDAL_NODATA value (tag 42113) as a float, or None; after
        `use_nodata`, per band where a PAM file says so (`imaging.nodata`).
      fill: What pixels outside the scene hold: `nodata`, or 0 without one
        (per band where `nodata` is).
      segment_shape: (rows, columns) of one tile, or of one strip.
      planar: Whether bands are stored as separate planes.
      decoded_segments, decoded_bytes: How many segments were decoded so far,
        and their decoded bytes (what the cache saves shows here).

    Raises:
      ImageRejected: 'corrupt' for an unreadable header or a segment that
        does not decode or lies past the end of the file;
        'unsupported_compression' for a compression no installed decoder
        reads; 'unsupported_dtype' for a volume or samples tifffile does not
        map to a numpy type.
    """

    # What a patch's record says it was read from (`imaging.scenes`), and whether a window
    # decodes the whole scene (`imaging.jp2.Jp2SceneReader` of a one-tile JPEG 2000 does).
    source_format = "tiff"
    decodes_whole = False

    def __init__(self, source: str | os.PathLike | bytes | bytearray | memoryview | BinaryIO,
                 name: str | None = None, page: int = 0):
        import tifffile

        if isinstance(source, (bytes, bytearray, memoryview)):
            handle: Any = io.BytesIO(source)
            self.name = name or "<bytes>"
        else:
            handle = os.fspath(source) if isinstance(source, (str, os.PathLike)) else source
            self.name = name or (handle if isinstance(handle, str) else repr(source))
        loop = _ifd_loop(handle)
        if loop:
            # `_setup` walks every page: tifffile would follow the loop for ever.
            raise ImageRejected("corrupt", f"{self.name}: {loop}")
        try:
            self._tif = tifffile.TiffFile(handle)
        except (tifffile.TiffFileError, *_DAMAGE) as e:
            raise ImageRejected("corrupt", f"{self.name}: unreadable TIFF header ({e})") from e
        try:
            self._setup(page)
        except BaseException:
            self._tif.close()
            raise
        self._start_cache()
        self._mask_reader: SceneReader | None = None

    def _start_cache(self) -> None:
        # (plane, row, column) -> (decoded segment or None, its first column in the scene).
        self._cache: dict[tuple[int, int, int], tuple[np.ndarray | None, int]] = {}
        self._columns: tuple[int, int] | None = None  # `keep_columns`
        self.decoded_segments = 0
        self.decoded_bytes = 0

    def _setup(self, page_index: int) -> None:
        with self._damaged_header():
            every = list(self._tif.pages)
            pages = [p for p in every if not getattr(p, "is_reduced", False) and not getattr(p, "is_mask", False)]
            if not pages:
                raise ImageRejected("corrupt", f"{self.name}: a TIFF header without an image page")
            if not 0 <= page_index < len(pages):
                raise ValueError(f"SceneReader: page must be from 0 to {len(pages) - 1}. "
                                 f"Received: {page_index!r}")
            page = pages[page_index]
            # GDAL's internal mask of this page (GDAL_TIFF_INTERNAL_MASK): the next
            # mask page of its size (overviews have masks of their own sizes).
            after = every[every.index(page) + 1:]
            self._mask_page = next((p for p in after if getattr(p, "is_mask", False)
                                    and not getattr(p, "is_reduced", False)
                                    and (p.imagelength, p.imagewidth) == (page.imagelength, page.imagewidth)),
                                   None)
        self._setup_page(page)

    def _setup_page(self, page) -> None:
        """The layout of the page this reader reads (`_setup`; the mask reader's page too)."""
        import tifffile

        with self._damaged_header():
            self._page = page
            if int(getattr(page, "imagedepth", 1)) != 1:
                raise ImageRejected("unsupported_dtype",
                                    f"{self.name} is a volume TIFF (ImageDepth {page.imagedepth})")
            self.height, self.width = int(page.imagelength), int(page.imagewidth)
            self.bands = int(page.samplesperpixel)
            self.planar = int(page.planarconfig) == 2 and self.bands > 1
            if page.is_tiled:
                self.segment_shape = (int(page.tilelength), int(page.tilewidth))
            else:
                self.segment_shape = (min(int(page.rowsperstrip) or self.height, self.height), self.width)
            self._down = -(-self.height // self.segment_shape[0])
            self._across = -(-self.width // self.segment_shape[1])
            planes = self.bands if self.planar else 1
            self._offsets, self._counts = page.dataoffsets, page.databytecounts
            if len(self._offsets) != planes * self._down * self._across or len(self._counts) != len(self._offsets):
                raise ImageRejected(
                    "corrupt", f"{self.name}: {len(self._offsets)} strip or tile offsets and "
                               f"{len(self._counts)} byte counts for {planes} plane(s) of "
                               f"{self._down}x{self._across} segments")
            if page.dtype is None:
                raise ImageRejected("unsupported_dtype",
                                    f"{self.name} has samples of {page.bitspersample} bits, sample "
                                    f"format {page.sampleformat}, which numpy does not hold")
            dtype = np.dtype(page.dtype)
            self.dtype = np.dtype(np.uint8) if dtype.kind == "b" else dtype.newbyteorder("=")
            self.nodata = float(page.nodata) if _GDAL_NODATA in page.tags else None
            self.fill = self.nodata if self.nodata is not None else 0
            compression = int(page.compression)
            try:
                tifffile.TIFF.DECOMPRESSORS[page.compression]
            except KeyError as e:  # tifffile's way of saying no decoder is installed.
                raise ImageRejected(
                    "unsupported_compression",
                    f"{self.name} is compressed with {getattr(page.compression, 'name', compression)} "
                    f"({compression}), which no installed decoder reads ({e.args[0] if e.args else e})",
                ) from e
            # tifffile (2026.3.3) asks libjpeg for RGB from each plane of a
            # band-interleaved JPEG page, one grey JPEG each, which libjpeg
            # refuses: those are decoded here as grey (imaging/raster.py does too).
            self._planar_jpeg = compression == _JPEG and self.planar
            self._decode = page.decode
            self._jpeg_args = ({"jpegtables": page.jpegtables, "jpegheader": page.jpegheader}
                               if compression in (6, 7, 33007, 34892) else {})
            self._file_size = int(self._tif.filehandle.size)

    @contextlib.contextmanager
    def _damaged_header(self):
        """tifffile's and struct's errors on a damaged header (its pages, a page's tags) as 'corrupt'.

        `ImageRejected` and the reader's own argument errors ('SceneReader: ...') pass through.
        """
        import tifffile

        try:
            yield
        except ImageRejected:
            raise
        except (tifffile.TiffFileError, *_DAMAGE) as e:
            if isinstance(e, ValueError) and str(e).startswith("SceneReader:"):
                raise
            raise ImageRejected("corrupt", f"{self.name}: damaged header ({type(e).__name__}: {e})") from e

    @property
    def georef(self) -> Georef:
        """The page's EPSG code and geotransform (`imaging.georef`), from its tags."""
        return page_georef(self._page, self.name)

    def use_nodata(self, nodata: _nodata.Nodata) -> None:
        """Takes `nodata` as the page's nodata (a PAM file's, `imaging.sidecars`; per band where it gives
        bands their own values), padding included."""
        self.nodata = nodata
        self.fill = padding_fill(nodata, self.dtype)

    @property
    def has_mask(self) -> bool:
        """Whether the page has GDAL's internal mask (GDAL_TIFF_INTERNAL_MASK: a COG's, an orthophoto's)."""
        return self._mask_page is not None

    def masked(self, y: int, x: int, height: int, width: int) -> np.ndarray | None:
        """(height, width) booleans: True where the page's internal mask says no data; None without a mask.

        GDAL's dataset mask of a file with an internal mask is that mask: the
        pixels a JPEG-compressed orthophoto or a COG marks as outside its
        footprint, whatever their values. Pixels outside the scene are False
        here (`padded` says which). Only the mask's segments the window
        overlaps are decoded, as for `read`.
        """
        if self._mask_page is None:
            return None
        if self._mask_reader is None:
            reader = object.__new__(SceneReader)
            reader.name = f"{self.name} (its internal mask)"
            reader._tif = self._tif  # The same open file: closed with this reader.
            reader._mask_page = None
            reader._mask_reader = None
            reader._setup_page(self._mask_page)
            reader._start_cache()
            reader._columns = self._columns
            self._mask_reader = reader
        values = self._mask_reader.read(y, x, height, width)
        return (values == 0).all(axis=2) & ~self.padded(y, x, height, width)

    def close(self) -> None:
        """Closes the file and drops the cached segments."""
        self._cache.clear()
        if self._mask_reader is not None:
            self._mask_reader._cache.clear()
        self._tif.close()

    def __enter__(self) -> SceneReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def keep_columns(self, left: int, right: int) -> None:
        """From now on, reads only windows within scene columns [left, right), and keeps only those.

        Decoded segments are cut to these columns before they are kept: a
        work item of a few patches of a striped scene (each strip spans the
        scene's width) then holds its own columns of the current row band,
        not the band's whole width. Windows may still reach past the scene's
        edges (padding).

        Raises:
          ValueError: For non-integer bounds or right <= left.
        """
        check_window("SceneReader", 0, left, 1, 1)
        check_window("SceneReader", 0, right, 1, 1)
        if right <= left:
            raise ValueError(f"SceneReader.keep_columns: right must exceed left {left}. Received: {right!r}")
        self._cache.clear()
        self._columns = (max(int(left), 0), min(int(right), self.width))
        if self._mask_reader is not None:
            self._mask_reader.keep_columns(left, right)

    def padded(self, y: int, x: int, height: int, width: int) -> np.ndarray:
        """(height, width) booleans: True where the window at (y, x) lies outside the scene."""
        check_window("SceneReader", y, x, height, width)
        return outside(y, x, height, width, self.height, self.width)

    def read(self, y: int, x: int, height: int, width: int, *, copy: bool = True) -> np.ndarray:
        """The window of `height` x `width` pixels at row y, column x: (height, width, bands).

        The window may reach past the scene on any side: those pixels hold
        `fill` (`padded` says which). Only the segments it overlaps are
        decoded, those of the current row band once.

        Args:
          y, x, height, width: The window, in pixels.
          copy: False: a window that lies inside one decoded segment (a
            patch inside a tile) is a read-only view of the decoded segment
            (which it keeps alive); no pixel is copied (what a shard writer
            that encodes the patch at once wants). True: always an array of
            its own.

        Raises:
          ValueError: For a window of no pixels, non-integer coordinates, or
            scene columns outside those of `keep_columns`.
          ImageRejected: 'corrupt' for a segment that does not decode or lies
            past the end of the file; 'unsupported_compression' for one no
            decoder reads.
        """
        check_window("SceneReader", y, x, height, width)
        y, x, height, width = int(y), int(x), int(height), int(width)
        top, bottom = max(y, 0), min(y + height, self.height)
        left, right = max(x, 0), min(x + width, self.width)
        if top >= bottom or left >= right:
            return np.full((height, width, self.bands), self.fill, self.dtype)  # Wholly outside the scene.
        if self._columns is not None and not self._columns[0] <= left < right <= self._columns[1]:
            raise ValueError(f"SceneReader: the window's scene columns {left}-{right} lie outside the "
                             f"columns kept, {self._columns[0]}-{self._columns[1]} (keep_columns)")
        inside = (top, bottom, left, right) == (y, y + height, x, x + width)
        if not copy and inside and not self.planar:
            view = self._view(y, x, height, width)
            if view is not None:
                return view
        if inside:
            out = np.empty((height, width, self.bands), self.dtype)  # Every pixel is written below.
        else:
            out = np.full((height, width, self.bands), self.fill, self.dtype)
        seg_h, seg_w = self.segment_shape
        first_row, last_row = top // seg_h, (bottom - 1) // seg_h
        first_col, last_col = left // seg_w, (right - 1) // seg_w
        # One row band at most: the segments of rows this window does not touch go.
        for key in [k for k in self._cache if not first_row <= k[1] <= last_row]:
            del self._cache[key]
        planes = range(self.bands) if self.planar else (None,)
        for plane in planes:
            for row in range(first_row, last_row + 1):
                for col in range(first_col, last_col + 1):
                    segment, sx = self._segment(0 if plane is None else plane, row, col)
                    sy = row * seg_h
                    rows, cols = (seg_h, seg_w) if segment is None else segment.shape[:2]
                    y0, y1 = max(top, sy), min(bottom, sy + rows)
                    x0, x1 = max(left, sx), min(right, sx + cols)
                    if y0 >= y1 or x0 >= x1:
                        continue
                    target = out[y0 - y:y1 - y, x0 - x:x1 - x]
                    if segment is None:
                        # An empty (sparse) segment: GDAL reads it as nodata, the fill.
                        if inside:  # Else `out` holds the fill already.
                            if plane is None:
                                target[...] = self.fill
                            else:
                                target[:, :, plane] = plane_fill(self.fill, plane)
                        continue
                    piece = segment[y0 - sy:y1 - sy, x0 - sx:x1 - sx]
                    if plane is None:
                        target[...] = piece
                    else:
                        target[:, :, plane] = piece[:, :, 0]
        return out

    def _view(self, y: int, x: int, height: int, width: int) -> np.ndarray | None:
        """The window as a read-only view of the one decoded segment it lies in; None when it spans several."""
        seg_h, seg_w = self.segment_shape
        row, col = y // seg_h, x // seg_w
        if (y + height - 1) // seg_h != row or (x + width - 1) // seg_w != col:
            return None
        for key in [k for k in self._cache if k[1] != row]:
            del self._cache[key]  # One row band at most, as `read` keeps.
        segment, sx = self._segment(0, row, col)
        if segment is None or not sx <= x or x + width > sx + segment.shape[1]:
            return None  # Sparse (the fill), or cut by keep_columns: the copying path says what holds.
        sy = row * seg_h
        view = segment[y - sy:y - sy + height, x - sx:x - sx + width]
        view.flags.writeable = False
        return view

    def _segment(self, plane: int, row: int, col: int) -> tuple[np.ndarray | None, int]:
        """(the decoded segment (rows, columns, samples) clipped to the page and to the columns kept,
        or None when empty; the scene column of its first)."""
        key = (plane, row, col)
        if key in self._cache:
            return self._cache[key]
        sx = col * self.segment_shape[1]
        index = (plane * self._down + row) * self._across + col
        offset, count = int(self._offsets[index]), int(self._counts[index])
        segment = None
        if offset > 0 and count > 0:
            if offset + count > self._file_size:
                raise ImageRejected(
                    "corrupt", f"{self.name}: a strip or tile of {count} bytes at offset {offset} ends "
                               f"past the file's {self._file_size} bytes (truncated)")
            segment = self._decode_segment(self._read_bytes(offset, count), index, row, col)
            self.decoded_segments += 1
            self.decoded_bytes += segment.nbytes
            if self._columns is not None:
                a = min(max(self._columns[0] - sx, 0), segment.shape[1])
                b = max(min(self._columns[1] - sx, segment.shape[1]), a)
                if (a, b) != (0, segment.shape[1]):
                    # A copy: a view would keep the whole decoded segment alive.
                    segment, sx = segment[:, a:b].copy(), sx + a
        self._cache[key] = (segment, sx)
        return segment, sx

    def _read_bytes(self, offset: int, count: int) -> bytes:
        handle = self._tif.filehandle
        with handle.lock:
            handle.seek(offset)
            data = handle.read(count)
        if len(data) != count:
            raise ImageRejected("corrupt", f"{self.name}: read {len(data)} of the {count} bytes of a "
                                           f"segment at offset {offset} (truncated)")
        return data

    def _decode_segment(self, data: bytes, index: int, row: int, col: int) -> np.ndarray:
        import tifffile

        seg_h, seg_w = self.segment_shape
        rows = min(seg_h, self.height - row * seg_h)
        cols = min(seg_w, self.width - col * seg_w)
        try:
            if self._planar_jpeg:
                import imagecodecs

                array = imagecodecs.jpeg_decode(data, tables=self._page.jpegtables)
                array = array.reshape(array.shape[0], array.shape[1], -1)
            else:
                array, _, _ = self._decode(data, index, **self._jpeg_args)
                array = array.reshape(array.shape[-3:])  # (depth 1, rows, columns, samples)
        except NotImplementedError as e:
            raise ImageRejected("unsupported_compression", f"{self.name}: {e}") from e
        except (tifffile.TiffFileError, *_DAMAGE) as e:
            raise ImageRejected("corrupt", f"{self.name}: segment {index} does not decode "
                                           f"({type(e).__name__}: {e})") from e
        if array.shape[0] < rows or array.shape[1] < cols:
            raise ImageRejected("corrupt", f"{self.name}: segment {index} decodes to {array.shape[:2]}, "
                                           f"fewer than its {rows}x{cols} pixels")
        # Clipped to the page and owned: a view would keep the whole decoded buffer alive.
        array = array[:rows, :cols]
        if array.dtype.kind == "b":
            array = array.view(np.uint8)
        return np.ascontiguousarray(array, self.dtype)


def open_scene(source: str | os.PathLike | bytes | bytearray | memoryview | BinaryIO, name: str | None = None):
    """The reader of a scene by its first bytes: `imaging.jp2.Jp2SceneReader` for JPEG 2000, else `SceneReader`.

    Both read windows alike (`read`, `padded`, `keep_columns`, `georef`,
    `segment_shape`, ...); a file object is left at its start.

    Raises:
      ImageRejected: As the reader's constructor does.
    """
    from imaging import jp2

    if isinstance(source, (bytes, bytearray, memoryview)):
        head = bytes(source[:12])
    elif isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as fh:
            head = fh.read(12)
    else:
        source.seek(0)
        head = source.read(12)
        source.seek(0)
    if jp2.is_jpeg2000(head):
        return jp2.Jp2SceneReader(source, name)
    return SceneReader(source, name)
