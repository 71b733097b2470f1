"""PNG: kept byte for byte once TensorFlow decodes it; transparency flattened, EXIF orientation applied.

A plain, intact PNG is not decoded: `_png_fast` proves TensorFlow would decode it.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from imaging import raster as _raster
from imaging import resize as _resize
from imaging.formats import _pil, _png_fast
from imaging.formats._shared import Context, ValidImage

__all__ = ["images"]


def images(data: bytes, name: str, fmt: str, context: Context) -> list[ValidImage]:
    """The one image a PNG file gives.

    Raises:
      ImageRejected: With the reason the file cannot be stored.
    """
    return [context.fit(_pil.read(data, name, "png", context, _from_pillow), name)]


def _from_pillow(data: bytes, im: Image.Image, fmt: str, name: str, context: Context) -> ValidImage:
    orientation = _exif_orientation(data, im)
    actions = ("exif_transpose",) if orientation else ()
    flat = None
    if data[24] == 16 and (data[25] in (4, 6) or "transparency" in im.info):
        # Pillow reads 16-bit colour and grey+alpha PNGs as 8-bit RGBA: its
        # flattening would cut every value to 8 bits (and grey to RGB).
        flat = _flattened_16(data, context)
    elif _pil.has_transparency(im):
        flat = _pil.to_storable_mode(im, context.background)
        if not orientation:
            return context.checked(_pil.encode(flat, "png"), "png", ("flatten_alpha",), name)
        flat = np.asarray(flat)
    if flat is not None:
        actions += ("flatten_alpha",)
    if orientation:
        # As JPEG, WebP and TIFF photos are: upright, as viewers show them.
        pixels = flat if flat is not None else \
            np.asarray(context.ops.decode_png(data, dtype=context.png_dtype(data)))
        upright = _resize.orient_array(pixels, orientation)
        return context.checked(_resize.encode(upright, "png", context.resize.jpeg_quality),
                               "png", actions, name)
    if flat is not None:
        return context.checked(_raster.png_bytes(flat), "png", actions, name)
    # A plain, intact PNG is proven decodable without TensorFlow's decode
    # (`_png_fast`: ~1.5 ms instead of ~3.8 for a bench photo); anything else
    # is decoded as before, which accepts or rejects it and words why.
    fast = _png_fast.shape(data)
    if fast is not None:
        h, w, c = fast
        return ValidImage(data, "png", h, w, c, "png")
    # An alpha channel that is opaque everywhere is kept as it is; 16-bit
    # PNGs are decoded as uint16, as a reader asking for 16 bits would.
    decoded = context.ops.decode_png(data, dtype=context.png_dtype(data))
    h, w, c = decoded.shape
    return ValidImage(data, "png", int(h), int(w), int(c), "png")


def _exif_orientation(data: bytes, im: Image.Image) -> int | None:
    """The EXIF orientation (2-8) of a PNG with an eXIf chunk before its pixels; else None.

    Only the chunk headers before the first IDAT are read (a few microseconds;
    searching a whole file's bytes costs milliseconds): where a viewer decoding
    the stream can still honour it, as browsers do.
    """
    pos = 8
    while pos + 8 <= len(data):
        kind = data[pos + 4:pos + 8]
        if kind in (b"IDAT", b"IEND"):
            return None
        if kind == b"eXIf":
            orientation = im.getexif().get(_pil.EXIF_ORIENTATION)
            return orientation if orientation in range(2, 9) else None
        pos += 12 + int.from_bytes(data[pos:pos + 4], "big")
    return None


def _flattened_16(data: bytes, context: Context) -> np.ndarray | None:
    """A 16-bit PNG with alpha or tRNS flattened onto --background at 16 bits; None if opaque.

    Decoded by TensorFlow as 16-bit RGBA (tRNS applied). Grey PNGs (colour
    types 0 and 4) stay one band, flattened onto the background's luma, as
    8-bit grey ones are by Pillow's conversion to 'L'.
    """
    rgba = np.asarray(context.ops.decode_png(data, channels=4, dtype=context.ops.uint16))
    if rgba[..., 3].min() == 65535:
        return None
    background = np.asarray(context.background, np.float64) * 257
    if data[25] in (0, 4):
        rgba = rgba[..., ::3]  # The grey band and alpha (TF repeats grey into R, G, B).
        background = background @ np.array([0.299, 0.587, 0.114])
    alpha = rgba[..., -1:].astype(np.float64) / 65535
    flat = rgba[..., :-1] * alpha + background * (1 - alpha)
    return np.rint(flat).astype(np.uint16)
