"""JPEG 2000 (JP2 files and bare J2K codestreams): Sentinel-2 bands, orthophotos, scans.

Decoded by OpenJPEG through imagecodecs, as GDAL's JP2OpenJPEG driver
decodes them, never by Pillow: Pillow stretches samples of fewer than 16
bits (Sentinel-2's 15-bit bands, 12-bit sensors) onto 16 bits, reads signed
samples as unsigned, cuts 16-bit colour to 8 bits and takes a second or
fourth component for alpha.

- 8-bit unsigned images of 1 or 3 components (photos, RGB orthophotos) are
  stored as PNG, as Pillow's path stored them, without band statistics;
- everything else is a raster (`imaging.formats._shared.stored_raster`): every
  component a band, every value as decoded (PNG for 8/16-bit of 1, 3 or 4
  bands, raw otherwise), with band statistics, `--raster_bands` and
  `--raster_dtype`; so is every JPEG 2000 when those options are given.

The size is read from the codestream's SIZ marker and checked against
--max_pixels before anything is decoded. With --raster_georef, the
georeferencing is what GDAL reads (`imaging.jp2.georef`): the GeoJP2 box (a
GeoTIFF's tags in a 'uuid' box, which GDAL writes by default and reads
first), else the GMLJP2 coverage (Sentinel-2's tiles). With --raster_patch,
.jp2/.j2k scenes are cut into patches tile by tile instead
(`imaging.jp2.Jp2SceneReader`).
"""

from __future__ import annotations

import io
import struct

import numpy as np
from PIL import Image

from imaging import georef as _georef
from imaging import jp2 as _jp2
from imaging import raster as _raster
from imaging.errors import ImageRejected
from imaging.formats import _pil
from imaging.formats._shared import Context, ValidImage, stored_raster, with_georef

__all__ = ["images"]

# The JP2 signature box, and a codestream's SOC marker followed by its SIZ marker.
_JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
_J2K_SIGNATURE = b"\xff\x4f\xff\x51"
_CODESTREAM_BOX = b"jp2c"


def images(data: bytes, name: str, fmt: str, context: Context) -> list[ValidImage]:
    """The one image of a JPEG 2000 file.

    Raises:
      ImageRejected: 'corrupt' for a damaged header or codestream;
        'too_large' above --max_pixels (samples: height x width x
        components, as for TIFF rasters); 'unsupported_dtype' for
        subsampled components (they are no bands of one grid);
        'missing_bands' and the others of `imaging.raster.apply_options`.
    """
    height, width, components, signed, bits, subsampled = _header(data, name)
    samples = height * width * components
    if samples > context.raster.max_pixels:
        raise ImageRejected(
            "too_large",
            f"{name} is {width}x{height} with {components} component{'s' * (components != 1)} = "
            f"{samples:,} samples, more than --max_pixels={context.raster.max_pixels:,}")
    if subsampled:
        raise ImageRejected(
            "unsupported_dtype",
            f"{name} has subsampled components (sizes {subsampled}): they are not bands of one "
            "grid; save it without subsampling (gdal_translate to GeoTIFF)")
    array = _decode(data, name)
    if array.shape[:2] != (height, width) or array.shape[2] != components:
        raise ImageRejected("corrupt", f"{name} decodes to {array.shape}, not its header's "
                                       f"{height}x{width}x{components}")
    photo = (not signed and max(bits) == 8 and components in (1, 3)
             and context.raster.reads_pixels_as_default)
    if photo:
        png = _pil.encode(Image.fromarray(array[:, :, 0] if components == 1 else array), "png")
        image = context.fit(context.stored(png, "jpeg2000", ("reencode_jpeg2000_to_png",), name), name)
    else:
        r = _raster.apply_options(array, None, context.raster, name)
        image = stored_raster(r, name, "jpeg2000", context)
    return [_with_georef(image, data, height, width, name, context)]


def _with_georef(image: ValidImage, data: bytes, height: int, width: int, name: str,
                 context: Context) -> ValidImage:
    """The image with its GeoJP2 or GMLJP2 georeferencing (--raster_georef), scaled to its stored size."""
    if not context.raster.georef:
        return image
    found = _jp2.georef(_jp2.read_structure(io.BytesIO(data), name), name)
    if found.geotransform is None and not found.epsg:
        return image  # Neither box: stored as unknown.
    return with_georef(image, _georef.Georef(found.epsg, found.geotransform, height, width))


def _boxes(data: bytes):
    """(type, contents) of a JP2 file's top-level boxes, up to the first damaged one."""
    if not data.startswith(_JP2_SIGNATURE):
        return
    pos = 0
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        header = 8
        if length == 1:  # The length follows as 8 bytes.
            if pos + 16 > len(data):
                return
            length, header = struct.unpack(">Q", data[pos + 8:pos + 16])[0], 16
        elif length == 0:  # The last box: to the end of the file.
            length = len(data) - pos
        if length < header:
            return
        yield kind, data[pos + header:pos + length]
        pos += length


def _header(data: bytes, name: str):
    """(height, width, components, any signed, bits per component, subsampled sizes or ()) from SIZ."""
    stream = _codestream(data, name)
    try:
        if stream[:4] != _J2K_SIGNATURE:
            raise ValueError("no SOC and SIZ marker at the start of the codestream")
        (length, _caps, xsiz, ysiz, xo, yo, _xt, _yt, _xto, _yto,
         count) = struct.unpack(">HHIIIIIIIIH", stream[4:42])
        if count < 1 or length != 38 + 3 * count or len(stream) < 42 + 3 * count:
            raise ValueError(f"a SIZ marker of {length} bytes for {count} components")
        comps = [struct.unpack("BBB", stream[42 + 3 * k:45 + 3 * k]) for k in range(count)]
    except (ValueError, struct.error) as e:
        raise ImageRejected("corrupt", f"{name}: damaged JPEG 2000 header ({e})") from None
    width, height = xsiz - xo, ysiz - yo
    if width <= 0 or height <= 0:
        raise ImageRejected("corrupt", f"{name}: its JPEG 2000 header gives an empty size {width}x{height}")
    signed = any(s & 0x80 for s, _, _ in comps)
    bits = tuple((s & 0x7F) + 1 for s, _, _ in comps)
    subsampled = tuple(f"{dx}x{dy}" for _, dx, dy in comps) if any((dx, dy) != (1, 1) for _, dx, dy in comps) else ()
    return height, width, count, signed, bits, subsampled


def _codestream(data: bytes, name: str) -> bytes:
    """The codestream: the file itself (J2K), or the contents of a JP2 file's 'jp2c' box."""
    if not data.startswith(_JP2_SIGNATURE):
        return data
    for kind, body in _boxes(data):
        if kind == _CODESTREAM_BOX:
            return body
    raise ImageRejected("corrupt", f"{name}: a JP2 file without a codestream box (truncated or damaged)")


def _decode(data: bytes, name: str) -> np.ndarray:
    """(height, width, components), every value as OpenJPEG decodes it."""
    import imagecodecs

    try:
        array = imagecodecs.jpeg2k_decode(data, numthreads=1)
    except (imagecodecs.Jpeg2kError, ValueError, RuntimeError) as e:
        raise ImageRejected("corrupt", f"{name}: JPEG 2000 data does not decode ({type(e).__name__}: {e})") from e
    if array.ndim == 2:
        array = array[:, :, np.newaxis]
    return array
