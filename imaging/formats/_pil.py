"""Pillow's part, shared by the handlers that read a file with it: open, check, encode.

`read` opens a file and checks its header (size, --max_pixels) once for every
handler that goes through Pillow; the handler's own `finish` then says what is
stored.
"""

from __future__ import annotations

import io
import struct
import warnings
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageFile, UnidentifiedImageError

from imaging.errors import ImageRejected
from imaging.sniff import unread_format

__all__ = ["EXIF_ORIENTATION", "PIL_ERRORS", "encode", "has_transparency", "read",
           "to_storable_mode"]

# Errors Pillow raises on damaged or hostile files: its plugins use OSError for
# truncation, SyntaxError and ValueError for bad headers, EOFError for missing
# frames, struct.error for short chunks, TypeError for a TIFF page without
# dimensions ("Missing dimensions", met when seeking its frames).
PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, TypeError,
              Image.DecompressionBombError)

EXIF_ORIENTATION = 0x0112

# Re-encoded photos (EXIF rotation) keep JPEG's size; quality 95 with 4:4:4
# chroma keeps the re-encoding error below what the eye notices.
_JPEG_QUALITY = 95


def read(data: bytes, name: str, fmt: str | None, context, finish: Callable):
    """Opens `data` with Pillow, checks its size, and returns `finish(data, im, fmt, name, context)`.

    Args:
      data: The whole file.
      name: Its relative path, for messages.
      fmt: The sniffed format, or None where no signature matched (Pillow's
        name for the format it recognises is used then).
      context: The handlers' `Context`.
      finish: What the handler stores for the opened image (a `ValidImage`).

    Raises:
      ImageRejected: 'not_an_image' where Pillow knows no format and nothing
        was sniffed, or knows it only by name (a stub: HDF5, GRIB, BUFR);
        'corrupt' for damaged headers and for what `finish` raises from
        Pillow or TensorFlow; 'too_large' above --max_pixels.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = _open(data)
        except UnidentifiedImageError:
            if fmt is None:
                known = unread_format(data[:16])
                if known is not None:
                    raise ImageRejected(
                        "not_an_image", f"{name} is a {known}, a format shardsmith does not read: "
                        "convert it to JPEG or PNG first") from None
                raise ImageRejected("not_an_image", f"{name} is not in a known image format"
                                                    f"{_gdal_format_hint(data)}") from None
            raise ImageRejected(
                "corrupt", f"{name} looks like {fmt.upper()} but its header is damaged"
            ) from None
        except PIL_ERRORS as e:
            raise ImageRejected("corrupt", f"{name}: unreadable header ({e})") from e
        fmt = fmt or (im.format or "unknown").lower()
        width, height = im.size
        context.check_pixels(width, height, name)
        if width == 0 or height == 0:
            raise ImageRejected("corrupt", f"{name} has an empty size {width}x{height}")
        try:
            return finish(data, im, fmt, name, context)
        except PIL_ERRORS as e:
            if isinstance(im, ImageFile.StubImageFile) and isinstance(e, OSError):
                # Pillow names some containers (HDF5, so MINC2 volumes; GRIB, BUFR; WMF
                # off Windows) by their signature, but only a registered handler reads
                # them: the file is whole, just in no format shardsmith reads.
                raise ImageRejected(
                    "not_an_image",
                    f"{name} is a {im.format} file, which Pillow recognises but has no decoder for: "
                    "not in an image format shardsmith reads",
                ) from e
            raise ImageRejected("corrupt", f"{name}: {e}") from e
        except context.ops.OpError as e:
            raise context.corrupt(e, name) from e


# Raster formats GDAL reads and shardsmith does not, by their first bytes: named in the
# rejection with how to convert them, rather than 'not in a known image format' alone.
_GDAL_FORMATS = (
    (b"<VRTDataset", "a GDAL virtual raster (VRT: XML pointing at other files)"),
    (b"ENVI", "an ENVI header (its samples are in the raw file beside it)"),
    (b"EHFA_HEADER_TAG", "an ERDAS Imagine (.img) raster"),
    (b"CDF\x01", "a NetCDF file"),
    (b"CDF\x02", "a NetCDF file"),
    (b"\x0e\x03\x13\x01", "an HDF4 file"),
    (b"PCIDSK", "a PCIDSK raster"),
    (b"SIMPLE  =", "a FITS file"),
)


def _gdal_format_hint(data: bytes) -> str:
    """': it is <format>; ...' for a raster format GDAL reads, else ''."""
    for signature, what in _GDAL_FORMATS:
        if data.startswith(signature):
            return (f": it is {what}, which shardsmith does not read; convert it to GeoTIFF "
                    f"(gdal_translate -of GTiff) to keep every band and value")
    return ""


def _open(data: bytes) -> Image.Image:
    """`Image.open`, but the pixel count is checked by the validator, not by Pillow.

    The validator checks the header's size against --max_pixels itself, before
    decoding. Pillow's own guard (`Image.MAX_IMAGE_PIXELS`, a module global:
    setting it would change it for the whole process) refuses headers above
    twice its limit; such a header is opened again by the format's own opener,
    which reads the header without that check, so the validator can say how
    large it is (or accept it, under a larger --max_pixels).
    """
    try:
        return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        return _open_without_pixel_limit(data)


def _open_without_pixel_limit(data: bytes) -> Image.Image:
    # What `Image.open` does for bytes (Pillow 10 to 12), less the pixel check:
    # the registered openers in order, the common plugins first.
    prefix, tried = data[:16], set()
    for load_plugins in (Image.preinit, Image.init):
        load_plugins()
        for fmt in [f for f in Image.ID if f not in tried]:
            tried.add(fmt)
            factory, accept = Image.OPEN[fmt]
            accepted = not accept or accept(prefix)
            if not accepted or isinstance(accepted, str):
                continue
            try:
                return factory(io.BytesIO(data), "")
            except (SyntaxError, IndexError, TypeError, struct.error):
                continue  # As Image.open: the next format may read it.
    raise UnidentifiedImageError("cannot identify image file")


def has_transparency(im: Image.Image) -> bool:
    """True when some pixel is not fully opaque (decodes the pixels)."""
    if im.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        alpha = im.getchannel("A")
        return alpha.getextrema()[0] < 255
    if "transparency" in im.info:
        rgba = im.convert("RGBA")
        return rgba.getchannel("A").getextrema()[0] < 255
    return False


def to_storable_mode(im: Image.Image, background) -> Image.Image:
    """Converts to L, RGB or 16-bit grey, flattening transparency."""
    if im.mode in ("I", "F", "I;16", "I;16B", "I;16L", "I;16N"):
        arr = np.asarray(im)
        if arr.dtype.kind == "f":
            arr = np.nan_to_num(arr)
        return Image.fromarray(np.clip(arr, 0, 65535).astype(np.uint16))
    if im.mode in ("RGBA", "LA", "PA", "P", "La", "RGBa") or "transparency" in im.info:
        rgba = im.convert("RGBA")
        if rgba.getchannel("A").getextrema()[0] < 255:
            base = Image.new("RGBA", rgba.size, tuple(background) + (255,))
            rgba = Image.alpha_composite(base, rgba)
        grey = im.mode in ("LA", "La") or (im.mode == "L" and "transparency" in im.info)
        return rgba.convert("L" if grey else "RGB")
    if im.mode in ("1", "L"):
        return im.convert("L")
    return im.convert("RGB")


def encode(im: Image.Image, fmt: str) -> bytes:
    """`im` as JPEG (quality 95, 4:4:4) or PNG (compression level 6) bytes."""
    buf = io.BytesIO()
    if fmt == "jpeg":
        im.save(buf, "JPEG", quality=_JPEG_QUALITY, subsampling=0)
    else:
        # Level 6 gives most of the size win at a fraction of level 9's time.
        im.save(buf, "PNG", compress_level=6)
    return buf.getvalue()
