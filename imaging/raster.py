"""TIFF rasters (satellite, scientific, 16-bit cameras) to storable arrays, without loss.

Read with `tifffile` (and `imagecodecs` for its compressions): strips and tiles,
interleaved and planar, BigTIFF, any number of bands and the sample types of
`schemas.RAW_DTYPES`. Bands come last: (height, width, bands). What is stored
(see `schemas.raw_format`):

- 8- and 16-bit unsigned images of 1, 3 or 4 bands: PNG (TF decodes it);
- anything else: the array's bytes, little-endian, C order, format
  'raw-<dtype>'.

No value changes unless asked (`RasterOptions.dtype`). Framework-free.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import math
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

import schemas
from imaging import _tiff_ifds, _tiff_strips
from imaging import nodata as _nodata
from imaging.errors import ImageRejected
from imaging.patches import PatchOptions

__all__ = ["RasterOptions", "Raster", "read_tiff", "png_bytes",
           "raw_bytes", "band_stats", "is_png_storable", "apply_options", "external_mask"]

_PAGES = ("first", "all")
_log = logging.getLogger(__name__)
# Opt-in conversions (--raster_dtype): the target types, each a linear scaling.
_TARGET_DTYPES = ("uint8", "uint16")
# Lossless widening of sample types that raw records do not hold.
_WIDEN = {"int8": "int16", "float16": "float32"}
# zlib level of 16-bit PNGs: level 6 as the validator's Pillow encoder.
_PNG_LEVEL = 6
_PNG_BANDS = {1: 0, 3: 2, 4: 6}  # bands -> PNG colour type (grey, RGB, RGBA)


@dataclasses.dataclass(frozen=True)
class RasterOptions:
    """How TIFF rasters are read; validated when built.

    Attributes:
      pages: 'first', or 'all' for one record per page of a multi-page file
        (reduced-resolution pages, GeoTIFF overviews, are never records)
        (--raster_pages).
      bands: 1-based band numbers to keep, in this order, as GDAL numbers
        them (--raster_bands 4,3,2,8); None keeps every band.
      dtype: None stores every value as it is (the default). 'uint8' or
        'uint16' scales linearly from `value_range` onto the full range of
        that type, rounding to nearest and clipping (--raster_dtype); the
        scaling is listed in normalized.jsonl.
      value_range: (low, high) mapped onto 0..max of `dtype`
        (--raster_range); None: the full range of an integer source type
        (a float source then needs it).
      max_pixels: Set by `ValidationOptions` to --max_pixels: height * width
        * bands * pages kept above it is rejected before decoding.
      georef: Store each record's GeoTIFF georeferencing, EPSG code and
        geotransform (`imaging.georef`), as features (--raster_georef). It
        reads tags only: which TIFFs Pillow keeps reading is unchanged.
      patch: Cut every TIFF into patches (`imaging.patches.PatchOptions`,
        --raster_patch and its companions); None stores each page whole.

    Raises:
      ValueError: Naming the flag, what it allows and what it received.
    """

    pages: str = "first"
    bands: tuple[int, ...] | None = None
    dtype: str | None = None
    value_range: tuple[float, float] | None = None
    max_pixels: int = 178_956_970
    georef: bool = False
    patch: PatchOptions | None = None

    def __post_init__(self):
        if self.patch is not None and not isinstance(self.patch, PatchOptions):
            raise ValueError(f"patch must be an imaging.patches.PatchOptions or None. Received: {self.patch!r}")
        if self.patch is not None and self.pages != "first":
            raise ValueError("--raster_patch cuts the first page of each TIFF: --raster_pages all cannot "
                             "go with it (give one of them).")
        if not isinstance(self.georef, bool):
            raise ValueError(f"--raster_georef is a switch (True or False). Received: {self.georef!r}")
        if self.pages not in _PAGES:
            raise ValueError(f"--raster_pages must be one of {', '.join(_PAGES)}. Received: {self.pages!r}")
        if self.bands is not None:
            bands = tuple(self.bands)
            if not bands or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in bands):
                raise ValueError(
                    f"--raster_bands must be band numbers from 1, e.g. 4,3,2. Received: {self.bands!r}"
                )
            object.__setattr__(self, "bands", bands)
        if self.dtype is not None and self.dtype not in _TARGET_DTYPES:
            raise ValueError(
                f"--raster_dtype must be one of {', '.join(_TARGET_DTYPES)} (default: keep the "
                f"file's type). Received: {self.dtype!r}"
            )
        if self.value_range is not None:
            low, high = (float(v) for v in self.value_range)
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ValueError(
                    f"--raster_range must be LOW,HIGH with LOW < HIGH. Received: {self.value_range!r}"
                )
            if self.dtype is None:
                raise ValueError("--raster_range scales values, so it needs --raster_dtype.")
            object.__setattr__(self, "value_range", (low, high))

    @classmethod
    def parse_bands(cls, text: str) -> tuple[int, ...]:
        """'4,3,2,8' -> (4, 3, 2, 8); raises ValueError naming --raster_bands."""
        try:
            return tuple(int(b) for b in text.split(","))
        except ValueError:
            raise ValueError(
                f"--raster_bands must be band numbers from 1, e.g. 4,3,2. Received: {text!r}"
            ) from None

    @classmethod
    def parse_range(cls, text: str) -> tuple[float, float]:
        """'0,10000' -> (0.0, 10000.0); raises ValueError naming --raster_range."""
        parts = text.split(",")
        try:
            low, high = (float(p) for p in parts)
        except ValueError:
            raise ValueError(f"--raster_range must be LOW,HIGH. Received: {text!r}") from None
        return low, high

    @property
    def is_default(self) -> bool:
        """Whether every option but max_pixels is its default (the output then matches older runs)."""
        return dataclasses.replace(self, max_pixels=RasterOptions.max_pixels) == RasterOptions()

    @functools.cached_property
    def reads_pixels_as_default(self) -> bool:
        """Whether every option that changes how pixels are read is its default (`georef` reads tags).

        Asked once per TIFF: computed once (the options are frozen).
        """
        return dataclasses.replace(self, georef=False).is_default

    def to_json(self) -> dict[str, Any]:
        d = {"pages": self.pages, "bands": list(self.bands) if self.bands else None,
             "dtype": self.dtype, "range": list(self.value_range) if self.value_range else None}
        if self.georef:  # Only then: manifests of runs without it keep their bytes.
            d["georef"] = True
        if self.patch is not None:  # Likewise.
            d["patch"] = self.patch.to_json()
        return d


@dataclasses.dataclass(frozen=True)
class Raster:
    """One page of a TIFF, decoded.

    Attributes:
      array: (height, width, bands), the stored sample type.
      page: Its page index when every page is kept and the file has several;
        otherwise None.
      nodata: The page's GDAL nodata (`imaging.nodata`): one value (or None)
        for every band, or a tuple of one per band where they differ.
      actions: What was changed beyond re-encoding ('select_bands', ...).
      details: JSON-safe provenance for normalized.jsonl.
      masked: (height, width) booleans, True where the page's internal mask
        (GDAL's, a mask page after it) says no data: left out of the band
        statistics as nodata samples are, whatever their values; None
        without a mask.
    """

    array: np.ndarray
    page: int | None
    nodata: _nodata.Nodata
    actions: tuple[str, ...]
    details: dict[str, Any]
    masked: np.ndarray | None = None


# 8-bit TIFFs that Pillow has always read and shows as a person sees them
# (palette, CMYK, bilevel, YCbCr) keep Pillow's path and bytes: its
# photometric interpretations and compressions.
_PILLOW_PHOTOMETRIC = {"MINISWHITE", "MINISBLACK", "RGB", "PALETTE", "YCBCR", "SEPARATED"}
_PILLOW_COMPRESSION = {"NONE", "LZW", "ADOBE_DEFLATE", "DEFLATE", "PACKBITS", "JPEG",
                       "CCITTRLE", "CCITT_T4", "CCITT_T6"}
# Tags only georeferenced or GDAL-written files carry: ModelPixelScale,
# ModelTiepoint, ModelTransformation, GeoKeyDirectory, GDAL_METADATA, GDAL_NODATA.
_GEO_TAGS = (33550, 33922, 34264, 34735, 42112, 42113)
_OJPEG = 6  # Old-style JPEG: TIFF 6.0's first, underspecified, JPEG scheme.
# What tifffile raises on damaged headers, beside its TiffFileError: its
# parsers fail on wrongly typed tag values (tuples for ints, missing tags).
_HEADER_ERRORS = (ValueError, TypeError, KeyError, IndexError, OverflowError, struct.error, EOFError)


def read_tiff(data: bytes, name: str, options: RasterOptions, sidecars=None) -> list[Raster] | None:
    """A TIFF file's kept pages, or None where it stays on Pillow's path; one header parse.

    `sidecars` (an `imaging.sidecars.Sidecars`, or None) are the file's GIS
    sidecars: a nodata value in its `.aux.xml` wins over its GDAL_NODATA tag,
    as GDAL reads it.

    Pillow keeps (None) unsigned images of at most 8 bits per sample with 1 or
    3 bands, or 4 when the image is CMYK, compressed in a way Pillow decodes,
    when no raster option asks for more; also files whose header tifffile
    cannot read (Pillow then says what is wrong, as it did). A fourth band
    that is alpha or near-infrared is a band of a raster, kept (Pillow would
    flatten or drop it); so are the samples of sub-byte GeoTIFFs (class codes,
    masks: Pillow would stretch them to 0-255), and files with mask pages
    (GDAL's internal masks, which Pillow cannot open).

    Raises:
      ImageRejected: For a file Pillow does not own: 'corrupt' for damaged
        headers, truncated or undecodable data; 'unsupported_dtype' for sample
        types raw records cannot hold (complex, 64-bit integers, ...);
        'too_large' above max_pixels; 'unsupported_compression' for a compression
        with no decoder installed (LogLuv, ...) or old-style JPEG that does
        not decode.
    """
    plain = _tiff_strips.read_plain(data, options.max_pixels)
    if plain is not None:
        # The plainest multi-band files, without tifffile's per-tag cost
        # (imaging/_tiff_strips.py says which, and why).
        array, nodata = plain
        masked = None
        if sidecars is not None:
            nodata = sidecars.nodata_over(nodata, array.shape[2])
            masked = external_mask(sidecars, array.shape[:2], name)
        widened = _WIDEN.get(_dtype_name(array.dtype))
        if widened:
            array = array.astype(widened)
        return [_finish(array, None, nodata, options, name, masked)]
    loop = _tiff_ifds.ifd_loop(data)
    if loop:
        # Before tifffile (and Pillow), which would read the same pages for ever.
        raise ImageRejected("corrupt", f"{name}: {loop}")
    default = options.reads_pixels_as_default
    tif = _open(data) if default else _open_or_reject(data, name)
    if tif is None:
        return None  # An unreadable header: Pillow says what is wrong with it.
    with tif:
        if default and _pillow_owns_file(tif):
            return None
        return _decode_pages(tif, data, name, options, sidecars)


def _open(data: bytes):
    """The `tifffile.TiffFile` of `data`, or None when tifffile cannot read its header."""
    import tifffile  # Heavy-ish; only files that are TIFFs need it.

    try:
        return tifffile.TiffFile(io.BytesIO(data))
    except (tifffile.TiffFileError, *_HEADER_ERRORS):
        return None


def _open_or_reject(data: bytes, name: str):
    import tifffile

    try:
        return tifffile.TiffFile(io.BytesIO(data))
    except (tifffile.TiffFileError, *_HEADER_ERRORS) as e:
        raise ImageRejected("corrupt", f"{name} looks like TIFF but its header is damaged ({e})") from e


def _pillow_owns_file(tif) -> bool:
    """Whether an opened TIFF stays on Pillow's path (raster options at their defaults)."""
    import tifffile

    try:
        page = tif.pages.first
        bits = page.bitspersample
        samples = page.samplesperpixel
        photometric = _enum_name(page.photometric)
        compression = _enum_name(page.compression)
        extra = tuple(int(e) for e in page.extrasamples)
        fmt = _sample_format(page)
        georeferenced = any(tag in page.tags for tag in _GEO_TAGS)
    except (tifffile.TiffFileError, *_HEADER_ERRORS):
        return True
    if isinstance(bits, tuple):  # Samples of different sizes (5-6-5, or a damaged header).
        bits = max(bits, default=0)
    if bits > 8 or fmt != "UINT" or photometric not in _PILLOW_PHOTOMETRIC:
        return False
    if compression not in _PILLOW_COMPRESSION:
        return False
    if bits < 8 and georeferenced:
        return False  # A GeoTIFF's 1/2/4-bit samples are values (GDAL's NBITS), not grey levels.
    if extra or not (samples in (1, 3) or samples == 4 and photometric == "SEPARATED"):
        return False
    return not _has_mask_pages(tif)


def _has_mask_pages(tif) -> bool:
    """Whether a page after the first is a transparency mask (NewSubfileType bit 4, GDAL's internal mask)."""
    import tifffile

    try:
        return any(_is_mask(p) for p in tif.pages[1:])
    except (tifffile.TiffFileError, *_HEADER_ERRORS):
        return False  # Pillow reads the first page and says what is wrong with the rest, as it did.


def _decode_pages(tif, data: bytes, name: str, options: RasterOptions, sidecars=None) -> list[Raster]:
    """The kept pages of an opened TIFF (`read_tiff`)."""
    import tifffile

    try:
        # Overviews and masks are views of another page's pixels: neither records nor bands.
        pages = [p for p in tif.pages if not _is_reduced(p) and not _is_mask(p)] or [tif.pages.first]
    except (tifffile.TiffFileError, *_HEADER_ERRORS) as e:
        raise ImageRejected("corrupt", f"{name}: damaged page directory ({e})") from e
    keep = pages if options.pages == "all" else pages[:1]
    shapes = [_from_header(name, _shape, p, name) for p in keep]
    total = sum(h * w * b for h, w, b in shapes)
    if total > options.max_pixels:
        h, w, b = shapes[0]
        raise ImageRejected(
            "too_large",
            f"{name} is {w}x{h} with {b} band{'s' * (b != 1)}"
            f"{f' on {len(keep)} pages' if len(keep) > 1 else ''} = {total:,} samples, more than "
            f"--max_pixels={options.max_pixels:,}",
        )
    out = []
    for index, page in enumerate(keep):
        array = _read_page(page, data, name)
        page_index = index if options.pages == "all" and len(keep) > 1 else None
        # Each page's own GDAL_NODATA, as GDAL opens it (GTIFF_DIR:N). The PAM file and the
        # external mask are the first page's alone: GDAL applies neither to a later page.
        nodata = _tag_nodata(page)
        masked = _internal_mask(tif, page, data, name)
        if index == 0 and sidecars is not None:
            nodata = sidecars.nodata_over(nodata, array.shape[2])
            if masked is None:
                masked = external_mask(sidecars, array.shape[:2], name)
        out.append(_finish(array, page_index, nodata, options, name, masked))
    return out


def external_mask(sidecars, size: tuple[int, int], name: str) -> np.ndarray | None:
    """GDAL's external mask (`scene.tif.msk`, `imaging.sidecars.Sidecars.mask`) as `_internal_mask` gives one.

    Its first full-resolution page, of the raster's size; zeros are no data
    (where it has a band per raster band, a pixel is no data where every
    band's mask says so). One that cannot be read, or of another size, is
    left out with a warning: the raster is still read, as GDAL's data is.
    """
    import tifffile

    if sidecars.mask is None:
        return None
    what = f"{name}'s external mask ({name}.msk)"
    try:
        with tifffile.TiffFile(io.BytesIO(sidecars.mask)) as tif:
            page = next((p for p in tif.pages if not _is_reduced(p)), tif.pages.first)
            values = _read_page(page, sidecars.mask, what)
    except (ImageRejected, tifffile.TiffFileError, *_HEADER_ERRORS) as e:
        _log.warning("%s is left out: %s", what, getattr(e, "message", e))
        return None
    if values.shape[:2] != tuple(size):
        _log.warning("%s is left out: it is %dx%d, the raster %dx%d", what, values.shape[1], values.shape[0],
                     size[1], size[0])
        return None
    return (values == 0).all(axis=2)


def _internal_mask(tif, page, data: bytes, name: str) -> np.ndarray | None:
    """(height, width) booleans, True where the page's internal mask says no data; None without one.

    GDAL's internal mask of a page (GDAL_TIFF_INTERNAL_MASK) is the next
    mask page of its size (overviews have masks of their own sizes), as
    `imaging.patches.SceneReader` finds it. GDAL's dataset mask is then that
    mask: its zeros are no data, whatever the pixels hold.
    """
    import tifffile

    try:
        after = list(tif.pages)[page.index + 1:]
        mask = next((p for p in after if _is_mask(p) and not _is_reduced(p)
                     and (p.imagelength, p.imagewidth) == (page.imagelength, page.imagewidth)), None)
    except (tifffile.TiffFileError, *_HEADER_ERRORS) as e:
        raise ImageRejected("corrupt", f"{name}: damaged page directory ({e})") from e
    if mask is None:
        return None
    values = _read_page(mask, data, f"{name} (its internal mask)")
    return (values == 0).all(axis=2)


def _from_header(name: str, fn, *args):
    """`fn(*args)`, which reads header fields: tifffile gives a damaged field as whatever its
    bytes say (a tuple, a string, 0), so the errors of using it mean a damaged header."""
    try:
        return fn(*args)
    except _HEADER_ERRORS as e:
        raise ImageRejected("corrupt", f"{name}: damaged header ({type(e).__name__}: {e})") from e


def _is_reduced(page) -> bool:
    return bool(getattr(page, "is_reduced", False))


def _is_mask(page) -> bool:
    return bool(getattr(page, "is_mask", False))


def _shape(page, name: str) -> tuple[int, int, int]:
    if getattr(page, "imagedepth", 1) > 1:
        raise ImageRejected("unsupported_dtype", f"{name} is a volume TIFF (ImageDepth {page.imagedepth})")
    return (_one_value(page.imagelength, "ImageLength", name),
            _one_value(page.imagewidth, "ImageWidth", name),
            _one_value(page.samplesperpixel, "SamplesPerPixel", name))


def _one_value(value, tag: str, name: str) -> int:
    """A header field that must be one number; a damaged header can give several (tifffile: a tuple)."""
    if isinstance(value, tuple):
        raise ImageRejected("corrupt", f"{name}: its header gives {tag} as {value}, not one number")
    return int(value)


def _source_dtype(page, name: str) -> np.dtype:
    dtype = page.dtype
    bits = page.bitspersample
    if dtype is None and isinstance(bits, tuple) and not all(0 < int(b) <= 128 for b in bits):
        # A damaged BitsPerSample (its offset moved onto other bytes): sizes no sample has, not
        # a layout raw records lack (found by bench.mutations_convert, issue 39).
        raise ImageRejected("corrupt", f"{name}: its header says {', '.join(map(str, bits))} bits per sample")
    if dtype is None and isinstance(bits, tuple):
        raise ImageRejected(
            "unsupported_dtype",
            f"{name} has samples of different sizes ({', '.join(map(str, bits))} bits), "
            "which no raw record holds")
    if dtype is None and not 0 < int(bits) <= 128:
        raise ImageRejected("corrupt", f"{name}: its header says {bits} bits per sample")
    if dtype is None:
        raise ImageRejected(
            "unsupported_dtype",
            f"{name} has samples of {page.bitspersample} bits, sample format "
            f"{_sample_format(page)}, which no raw record holds",
        )
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return np.dtype(np.uint8)  # 1-bit samples: tifffile's bool, stored as their values 0 and 1.
    name_ = _dtype_name(dtype)
    name_ = _WIDEN.get(name_, name_)
    if name_ not in schemas.RAW_DTYPES:
        raise ImageRejected(
            "unsupported_dtype",
            f"{name} has {dtype.name} samples ({page.bitspersample} bits, sample format "
            f"{_sample_format(page)}); stored types are {', '.join(schemas.RAW_DTYPES)}",
        )
    return dtype


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: np.dtype) -> str:
    """`dtype.name`, remembered: numpy computes it in Python (~10 us), and each raster asks several times."""
    return dtype.name


def _enum_name(value) -> str:
    return getattr(value, "name", str(value))


def _sample_format(page) -> str:
    """'UINT', 'INT', 'IEEEFP', 'COMPLEXIEEEFP', ... (tifffile gives the tag's int)."""
    import tifffile

    try:
        return tifffile.SAMPLEFORMAT(int(page.sampleformat)).name
    except ValueError:
        return str(page.sampleformat)


def _read_page(page, data: bytes, name: str) -> np.ndarray:
    """The page's samples as (height, width, bands), every byte of it read and checked."""
    import tifffile

    _from_header(name, _check_decoder, page, name)
    _from_header(name, _source_dtype, page, name)  # An unsupported sample format is refused here.
    _from_header(name, _check_segments, page, len(data), name)
    compression = int(page.compression)
    try:
        if compression == 7 and page.planarconfig == 2:
            array = _planar_jpeg(page, data)
        else:
            # One thread: the writer already validates several files at once.
            array = page.asarray(maxworkers=1)
    except tifffile.TiffFileError as e:
        raise ImageRejected("corrupt", f"{name}: {e}") from e
    except (ValueError, RuntimeError, OSError, EOFError, struct.error, IndexError, TypeError,
            KeyError, ZeroDivisionError) as e:  # ZeroDivisionError: a damaged RowsPerStrip of 0.
        message = str(e)
        if "imagecodecs" in message or "requires" in message.lower():
            raise ImageRejected("unsupported_compression", f"{name}: {message}") from e
        if compression == _OJPEG:
            # libtiff reads old-style JPEG by rebuilding JPEG streams from
            # scattered tags; tifffile only where each strip is already one
            # whole stream. A file GDAL may read is not called corrupt for that.
            raise ImageRejected(
                "unsupported_compression",
                f"{name} is compressed with old-style JPEG (compression 6), which tifffile "
                f"decodes only where each strip is a complete JPEG stream ({type(e).__name__}: {e}); "
                "re-save it with new-style JPEG (compression 7) or a lossless compression",
            ) from e
        # imagecodecs' errors subclass RuntimeError (LZW, deflate, zstd, ...).
        raise ImageRejected("corrupt", f"{name}: compressed data does not decode ({type(e).__name__}: {e})") from e
    if array.dtype.kind == "b":
        array = array.view(np.uint8)  # 1-bit samples (`_source_dtype`): 0 and 1.
    if _enum_name(page.photometric) == "PALETTE" and page.colormap is not None:
        # The pixels are indices: what the file shows is the colour map's entries.
        array = np.moveaxis(page.colormap, 0, -1)[array]
    axes = page.axes
    order = [axes.index(a) for a in "YXS" if a in axes]
    if len(order) != array.ndim:
        raise ImageRejected("unsupported_dtype", f"{name} has axes {axes!r}, not height, width, bands")
    array = np.transpose(array, order)
    if array.ndim == 2:
        array = array[:, :, np.newaxis]
    widened = _WIDEN.get(_dtype_name(array.dtype))
    if widened:
        array = array.astype(widened)
    return array


def _check_decoder(page, name: str) -> None:
    """Rejects, before reading any pixel, a compression no installed decoder reads (LogLuv, ...)."""
    import tifffile

    compression = page.compression
    try:
        tifffile.TIFF.DECOMPRESSORS[compression]
    except KeyError as e:  # tifffile's way of saying it has no decoder (or needs imagecodecs).
        raise ImageRejected(
            "unsupported_compression",
            f"{name} is compressed with {_enum_name(compression)} ({int(compression)}), which no "
            f"installed decoder reads (tifffile with imagecodecs: {e.args[0] if e.args else e})",
        ) from e


def _planar_jpeg(page, data: bytes) -> np.ndarray:
    """A band-interleaved (PlanarConfiguration 2) JPEG page, (bands, height, width), as libtiff reads it.

    tifffile (2026.3.3) asks libjpeg for an RGB stream when the photometric
    is RGB, but each segment of such a page is a one-component (grey) JPEG,
    which libjpeg then refuses ("Bogus JPEG colorspace"); GDAL writes these
    (COMPRESS=JPEG INTERLEAVE=BAND). Each segment is decoded here as grey
    by imagecodecs, the decoder tifffile itself would use.
    """
    import imagecodecs

    h, w, bands = int(page.imagelength), int(page.imagewidth), int(page.samplesperpixel)
    if page.is_tiled:
        seg_h, seg_w = int(page.tilelength), int(page.tilewidth)
    else:
        seg_h, seg_w = min(int(page.rowsperstrip), h), w
    across, down = -(-w // seg_w), -(-h // seg_h)
    offsets, counts = page.dataoffsets, page.databytecounts
    if len(offsets) != bands * across * down:
        raise ValueError(f"{len(offsets)} segments for {bands} planes of {down}x{across}")
    out = np.empty((bands, h, w), np.uint8)
    view = memoryview(data)
    for i, (offset, count) in enumerate(zip(offsets, counts)):
        plane, k = divmod(i, across * down)
        y, x = divmod(k, across)
        y, x = y * seg_h, x * seg_w
        piece = imagecodecs.jpeg_decode(view[offset:offset + count], tables=page.jpegtables)
        rows, cols = min(seg_h, h - y), min(seg_w, w - x)
        if piece.ndim != 2 or piece.shape[0] < rows or piece.shape[1] < cols:
            raise ValueError(f"a segment decodes to {piece.shape}, not one {rows}x{cols} band")
        out[plane, y:y + rows, x:x + cols] = piece[:rows, :cols]
    return out


def _check_segments(page, file_size: int, name: str) -> None:
    """Rejects strips or tiles past the end of the file (tifffile would fill them with zeros)."""
    offsets, counts = page.dataoffsets, page.databytecounts
    if not offsets or len(offsets) != len(counts):
        raise ImageRejected("corrupt", f"{name}: no strip or tile offsets")
    if not all(isinstance(v, int) for v in (*offsets, *counts)):
        raise ImageRejected("corrupt", f"{name}: its strip or tile offsets are not numbers")
    uncompressed = _one_value(page.compression, "Compression", name) == 1
    if uncompressed:
        # What the strips must hold together (the last strip may be shorter):
        # rows of packed samples, each row starting on a byte, as TIFF packs
        # 1/2/4/12/24-bit samples (GDAL's NBITS); planes row by row when
        # band-interleaved.
        h, w, b = _shape(page, name)
        bits = page.bitspersample
        if isinstance(bits, tuple):
            bits = sum(bits) // len(bits)  # Different sizes: `_source_dtype` rejected them already.
        planes = b if page.planarconfig == 2 else 1
        total = planes * h * -(-(w * (b // planes) * int(bits)) // 8)
    else:
        total = 0
    sparse = 0
    for offset, count in zip(offsets, counts):
        if offset == 0 and count == 0:
            # GDAL's sparse files (SPARSE_OK): a segment never written reads
            # as nodata, or zeros, as tifffile fills it.
            sparse += 1
            continue
        if count == 0 or offset + count > file_size:
            raise ImageRejected(
                "corrupt",
                f"{name}: a strip or tile of {count} bytes at offset {offset} ends past the file's "
                f"{file_size} bytes (truncated)",
            )
    if uncompressed and not page.is_tiled and not sparse and sum(counts) < total:
        raise ImageRejected(
            "corrupt", f"{name}: its strips hold {sum(counts)} of the {total} bytes the image needs (truncated)"
        )


def _tag_nodata(page) -> float | None:
    value = getattr(page, "nodata", 0)
    # tifffile reports 0 when there is no GDAL_NODATA tag.
    if 42113 not in page.tags:
        return None
    return float(value)


def apply_options(array: np.ndarray, nodata: _nodata.Nodata, options: RasterOptions, name: str,
                  masked: np.ndarray | None = None) -> Raster:
    """An array read from a TIFF (a whole page or a window of one) as `read_tiff` keeps it.

    Sample types raw records do not hold are widened losslessly (int8,
    float16), then `--raster_bands` and `--raster_dtype` apply: both act on
    each pixel alone, so a window's result is the window of the page's.

    Raises:
      ImageRejected: 'missing_bands' for bands the array lacks;
        'unsupported_dtype' for a float array to scale without a range.
    """
    widened = _WIDEN.get(_dtype_name(array.dtype))
    if widened:
        array = array.astype(widened)
    return _finish(array, None, nodata, options, name, masked)


def _finish(array, page, nodata, options: RasterOptions, name: str, masked=None) -> Raster:
    actions: list[str] = []
    details: dict[str, Any] = {"source_dtype": _dtype_name(array.dtype), "source_bands": int(array.shape[2])}
    if options.bands is not None:
        bands = array.shape[2]
        missing = [b for b in options.bands if b > bands]
        if missing:
            raise ImageRejected(
                "missing_bands",
                f"{name} has {bands} band{'s' * (bands != 1)}; --raster_bands asks for {missing}",
            )
        array = array[:, :, [b - 1 for b in options.bands]]
        nodata = _nodata.select(_nodata.per_band(nodata, bands), [b - 1 for b in options.bands])
        actions.append("select_bands")
        details["bands"] = list(options.bands)
    if options.dtype is not None:
        array, scaling = _scale(array, nodata, options, name)
        actions.append(f"scale_to_{options.dtype}")
        details["scaling"] = scaling
    if nodata is not None:
        details["nodata"] = _nodata.to_json(nodata)
    if masked is not None and not masked.any():
        masked = None  # A mask that masks nothing: the statistics are those of every pixel.
    return Raster(np.ascontiguousarray(array), page, nodata, tuple(actions), details, masked)


def _scale(array, nodata, options: RasterOptions, name: str):
    """Linear scaling of (low, high) onto 0..max of the target type, rounded and clipped."""
    if options.value_range is not None:
        low, high = options.value_range
    elif array.dtype.kind in "ui":
        info = np.iinfo(array.dtype)
        low, high = float(info.min), float(info.max)
    else:
        raise ImageRejected(
            "unsupported_dtype",
            f"{name} has {array.dtype.name} samples: --raster_dtype needs --raster_range LOW,HIGH for them",
        )
    top = float(np.iinfo(options.dtype).max)
    values = array.astype(np.float64)
    scaled = np.rint((values - low) * (top / (high - low)))
    scaled = np.clip(np.nan_to_num(scaled, nan=0.0), 0, top).astype(options.dtype)
    return scaled, {"from": [low, high], "to": [0, int(top)], "rounding": "nearest, clipped",
                    "nan": 0}


def is_png_storable(array: np.ndarray) -> bool:
    """Whether the contract stores this array as PNG: uint8/uint16 with 1, 3 or 4 bands."""
    return _dtype_name(array.dtype) in ("uint8", "uint16") and array.shape[2] in _PNG_BANDS


def png_bytes(array: np.ndarray) -> bytes:
    """A 16-bit PNG of a (height, width, 1|3|4) uint16 array (Pillow writes 16-bit grey only).

    Deterministic: the 'Up' filter on every row, zlib level 6.
    """
    h, w, b = array.shape
    filtered = np.empty((h, 2 * w * b + 1), np.uint8)
    filtered[:, 0] = 2  # Up: each byte minus the one above it (above the first row: zeros).
    # A block of rows at a time, into place, and compressed from the array's own buffer:
    # no big-endian copy of the whole image beside it (a 16-bit scene cost three times itself).
    above = np.zeros(2 * w * b, np.uint8)
    step = max(1, _SUMS_BLOCK // max(1, w * b))
    for top in range(0, h, step):
        rows = array[top:top + step].astype(">u2").reshape(-1, w * b).view(np.uint8)
        out = filtered[top:top + rows.shape[0], 1:]
        np.subtract(rows[0], above, out=out[0])
        np.subtract(rows[1:], rows[:-1], out=out[1:])
        above = rows[-1].copy()
    body = zlib.compress(filtered, _PNG_LEVEL)
    del filtered
    ihdr = struct.pack(">IIBBBBB", w, h, 16, _PNG_BANDS[b], 0, 0, 0)
    return b"".join((b"\x89PNG\r\n\x1a\n", *_chunk(b"IHDR", ihdr), *_chunk(b"IDAT", body),
                     *_chunk(b"IEND", b"")))


def _chunk(kind: bytes, body: bytes) -> tuple[bytes, ...]:
    """A PNG chunk's parts: joined once by the caller, not a copy of a large body per `+`."""
    return struct.pack(">I", len(body)), kind, body, struct.pack(">I", zlib.crc32(body, zlib.crc32(kind)))


def raw_bytes(array: np.ndarray) -> bytes:
    """The raw record payload: little-endian, C order, (height, width, bands)."""
    little = array.dtype.newbyteorder("<")
    if array.dtype == little:
        # One copy: `tobytes` writes a view (a patch of a decoded tile) in C order itself;
        # `ascontiguousarray` first would copy every sample twice.
        return array.tobytes()
    return np.ascontiguousarray(array, dtype=little).tobytes()


def band_stats(array: np.ndarray, nodata: _nodata.Nodata,
               masked: np.ndarray | None = None) -> schemas.BandStats:
    """Per band: valid samples, min, max, mean, sum of squared deviations, nodata count.

    Samples equal to `nodata` (a band's own value where it has one per band,
    `imaging.nodata`, as GDAL's per-band masks take them), NaN, and every
    sample of a pixel `masked` marks ((height, width) booleans: an internal
    mask's no data) are counted as nodata and left out. Integer samples with
    no nodata among them: from exact integer sums, each statistic the
    correctly rounded float of its exact value (`_band_stats_exact`);
    otherwise float64 sums.
    """
    if isinstance(nodata, tuple):
        values = _nodata.per_band(nodata, array.shape[2])
        if not any(v is not None and not math.isnan(v) and bool((array[:, :, b] == v).any())
                   for b, v in enumerate(values)):
            nodata = None  # No band holds its own value: the statistics of every sample, as below.
        else:
            return _band_stats_loop(array, values, None if masked is None or not masked.any() else masked.ravel())
    if masked is not None and masked.any():
        return _band_stats_loop(array, nodata, masked.ravel())
    if array.dtype.kind in "ui":
        exact = _band_stats_exact(array, nodata)
        if exact is not None:
            return exact
    fast = _band_stats_all_valid(array, nodata)
    if fast is not None:
        return fast
    return _band_stats_loop(array, nodata)


def _band_stats_loop(array: np.ndarray, nodata: _nodata.Nodata,
                     masked: np.ndarray | None = None) -> schemas.BandStats:
    """`band_stats` band by band in float64; `masked`: per pixel, flattened, True where left out."""
    counts, mins, maxs, means, m2s, missing = [], [], [], [], [], []
    for band, nodata in zip(_bands(array), _nodata.per_band(nodata, array.shape[2])):
        values = band.astype(np.float64, copy=False).ravel()
        invalid = np.isnan(values)
        if masked is not None:
            invalid |= masked
        if nodata is not None and not math.isnan(nodata):
            invalid |= values == nodata
        n_invalid = int(invalid.sum())
        if n_invalid:
            values = values[~invalid]
        n = int(values.size)
        counts.append(n)
        missing.append(n_invalid)
        if n:
            mean = float(values.mean())
            mins.append(float(values.min()))
            maxs.append(float(values.max()))
            means.append(mean)
            m2s.append(float(np.square(values - mean).sum()))
        else:
            mins.append(None)
            maxs.append(None)
            means.append(0.0)
            m2s.append(0.0)
    return schemas.BandStats(1, tuple(counts), tuple(mins), tuple(maxs), tuple(means),
                             tuple(m2s), tuple(missing))


# Integer sums are exact in float64 below _FLOAT64_EXACT, and in int64 below
# _INT64_EXACT (the bounds `_exact_sums` checks).
_FLOAT64_EXACT = 1 << 53
_INT64_EXACT = 1 << 63
# Samples `_exact_sums` widens at once (8 bytes each: 2 MiB), and `png_bytes` filters.
_SUMS_BLOCK = 1 << 18


def _band_stats_exact(array: np.ndarray, nodata: float | None) -> schemas.BandStats | None:
    """`band_stats` of integer samples, none of them nodata, from exact sums; else None.

    Per band, the sum S and the sum of squares Q of its n samples, exactly
    (`_exact_sums`); then in Python integers mean = S / n and m2 =
    (n Q - S^2) / n, each one division, so each is the correctly rounded
    float of its exact value (Python's int / int rounds correctly). min and
    max are the samples' own. None when some sample is nodata, or when the
    sums could overflow int64 (32-bit samples of large magnitude): the
    float64 path then answers.
    """
    h, w, bands = array.shape
    n = h * w
    if n == 0:
        return None
    # Reduced over rows, then over columns: each reduction runs along a long
    # contiguous axis (h * w rows of `bands` samples would cost one short
    # inner loop per pixel).
    rows = array.reshape(h, w * bands)
    minima = _per_band(np.minimum, rows, w, bands).tolist()
    maxima = _per_band(np.maximum, rows, w, bands).tolist()
    low, high = min(minima), max(maxima)
    if (nodata is not None and not math.isnan(nodata) and low <= nodata <= high
            and bool((rows == nodata).any())):
        return None
    sums = _exact_sums(rows, w, bands, max(-low, high))
    if sums is None:
        return None
    means, m2s = [], []
    for s, q in zip(*sums):
        means.append(s / n)
        m2s.append((n * q - s * s) / n)
    return schemas.BandStats(1, (n,) * bands, tuple(float(v) for v in minima),
                             tuple(float(v) for v in maxima), tuple(means), tuple(m2s),
                             (0,) * bands)


def _per_band(ufunc, rows: np.ndarray, width: int, bands: int) -> np.ndarray:
    """`ufunc` reduced over every pixel of (height, width * bands) rows: one value per band."""
    return ufunc.reduce(ufunc.reduce(rows, axis=0).reshape(width, bands), axis=0)


def _exact_sums(rows: np.ndarray, width: int, bands: int,
                largest: int) -> tuple[list[int], list[int]] | None:
    """Per band of (height, width * bands) integer rows of magnitude <= `largest`: sum and sum of squares.

    Exact, as Python ints; None when n * largest^2 reaches 2^63. Below 2^53
    every partial sum is an integer that float64 holds exactly, whatever the
    order of the additions, so float64 sums do; else int64 sums, exact below
    2^63. Reduced over rows, then over columns (`_per_band`), as fast on one
    core as BLAS's matrix-vector product, which was used before and spins
    threads against each other on busy cores (10x the CPU on two).
    """
    n = rows.shape[0] * width
    bound = n * largest * largest
    if bound >= _INT64_EXACT:
        return None
    dtype = np.float64 if bound < _FLOAT64_EXACT else np.int64
    sums, squares = [0] * bands, [0] * bands
    # A block of rows at a time: each block's sums are exact too, and so is their total in
    # Python ints, so the statistics are the same to the bit; a whole 16-bit scene cast to
    # 8-byte sums at once cost four times the scene (1.5 GB for 8000 x 8000 x 3).
    step = max(1, _SUMS_BLOCK // max(1, rows.shape[1]))
    for top in range(0, rows.shape[0], step):
        values = rows[top:top + step].astype(dtype)
        for b, v in enumerate(_per_band(np.add, values, width, bands).tolist()):
            sums[b] += int(v)
        squared = np.multiply(values, values, out=values)
        for b, v in enumerate(_per_band(np.add, squared, width, bands).tolist()):
            squares[b] += int(v)
    return sums, squares


def _band_stats_all_valid(array: np.ndarray, nodata: float | None) -> schemas.BandStats | None:
    """`band_stats` of an array with no nodata or NaN sample, every band at once; else None.

    The same numbers, bit for bit, as the per-band loop: each band is one
    contiguous float64 row, reduced along it (numpy sums a contiguous row
    pairwise, as it sums the band alone).
    """
    h, w, bands = array.shape
    n = h * w
    if n == 0:
        return None
    rows = np.ascontiguousarray(np.moveaxis(array, 2, 0).reshape(bands, n), dtype=np.float64)
    if np.may_share_memory(rows, array):
        # One float64 band is already such a row: `rows` is then the caller's
        # array itself (tifffile's may be a read-only view of the file's bytes,
        # and is what gets stored), which the in-place steps below must not touch.
        rows = rows.copy()
    if array.dtype.kind == "f" and np.isnan(rows).any():
        return None
    if nodata is not None and not math.isnan(nodata) and (rows == nodata).any():
        return None
    means = rows.mean(axis=1)
    # In place: arrays this size are fresh pages (mmap), each costly to fault in.
    minima, maxima = rows.min(axis=1), rows.max(axis=1)
    np.subtract(rows, means[:, None], out=rows)
    m2s = np.square(rows, out=rows).sum(axis=1)
    return schemas.BandStats(1, (n,) * bands, tuple(float(v) for v in minima),
                             tuple(float(v) for v in maxima),
                             tuple(float(v) for v in means), tuple(float(v) for v in m2s),
                             (0,) * bands)


def _bands(array: np.ndarray) -> Iterator[np.ndarray]:
    for b in range(array.shape[2]):
        yield array[:, :, b]

