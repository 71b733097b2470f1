"""Formats TensorFlow lacks or decodes as animations (GIF, BMP, WebP, ...): re-encoded as PNG.

Read by Pillow and stored losslessly as PNG: the first frame of an animation,
turned upright by its EXIF orientation, transparency flattened onto
--background. Also the handler of files no signature matched: whatever
Pillow recognises is read the same way, and the rest is 'not_an_image'.
"""

from __future__ import annotations

from PIL import Image, ImageOps

from imaging.formats import _pil
from imaging.formats._shared import Context, ValidImage

__all__ = ["images", "reencode"]


def images(data: bytes, name: str, fmt: str | None, context: Context) -> list[ValidImage]:
    """The one image (the first frame) of a file Pillow reads.

    Args:
      fmt: The sniffed format ('gif', 'bmp', ...), or None where no signature
        matched: the format is then Pillow's name for it.

    Raises:
      ImageRejected: With the reason the file cannot be stored.
    """
    # Pillow recognises JPEG and PNG by the very signatures `sniff_format`
    # reads, so what reaches this handler is never kept byte for byte.
    return [context.fit(_pil.read(data, name, fmt, context, reencode), name)]


def reencode(data: bytes, im: Image.Image, fmt: str, name: str, context: Context) -> ValidImage:
    """`im` (opened by Pillow from `data`) as a PNG of its first frame, upright and opaque."""
    actions = [f"reencode_{fmt}_to_png"]
    if getattr(im, "n_frames", 1) > 1:
        actions.append("first_frame")
    im.seek(0)
    # Only 2-8 turn the image (0 and 9+ are written by some cameras and tools,
    # and `exif_transpose` leaves them be): listing any other would be untrue.
    if im.getexif().get(_pil.EXIF_ORIENTATION) in range(2, 9):
        im = ImageOps.exif_transpose(im)
        actions.append("exif_transpose")
    if _pil.has_transparency(im):
        actions.append("flatten_alpha")
    flat = _pil.to_storable_mode(im, context.background)
    return context.checked(_pil.encode(flat, "png"), fmt, tuple(actions), name)
