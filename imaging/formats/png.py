"""PNG: kept byte for byte once TensorFlow decodes it; transparency flattened onto --background.

A plain, intact PNG is not decoded: `_png_fast` proves TensorFlow would decode it.
"""

from __future__ import annotations

from PIL import Image

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
    if _pil.has_transparency(im):
        flat = _pil.to_storable_mode(im, context.background)
        return context.checked(_pil.encode(flat, "png"), "png", ("flatten_alpha",), name)
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
