"""JPEG: kept byte for byte once TensorFlow decodes it; turned upright or resized when asked.

Ordinary upright JPEGs, read from their markers (`imaging.sniff.jpeg_header`),
are decoded once at libjpeg's 1/8 scale (every entropy-coded byte is still
read) and stored unchanged: by Pillow where `_jpeg_fast` proves TensorFlow
would decode them too (no TensorFlow loaded), else by TensorFlow, many of them
in one run (`batchable`, `decode_together`). The rest (EXIF-rotated
photos, 12-bit or CMYK files, odd headers) go through Pillow.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageOps

from imaging import resize as _resize
from imaging.errors import ImageRejected
from imaging.formats import _jpeg_fast, _pil
from imaging.formats._shared import Context, ValidImage, plain_image
from imaging.sniff import JpegHeader, jpeg_header
from schemas import tf_runtime

__all__ = ["batchable", "decode_together", "images"]


def images(data: bytes, name: str, fmt: str, context: Context) -> list[ValidImage]:
    """The one image a JPEG file gives.

    Raises:
      ImageRejected: With the reason the file cannot be stored.
    """
    try:
        return _images(data, name, context)
    except ImageRejected as e:
        process = _unread_process(data) if e.reason == "corrupt" else None
        if process is None:
            raise
        # Whole and valid, just in a JPEG process no decoder here reads:
        # 'corrupt' ("its header is damaged") would send the user looking for damage.
        raise ImageRejected(
            "unsupported_codec",
            f"{name} is a {process}, which TensorFlow's JPEG decoder does not read (it reads "
            "8-bit baseline and progressive JPEGs): convert it to PNG or TIFF first",
        ) from e


def _images(data: bytes, name: str, context: Context) -> list[ValidImage]:
    header = jpeg_header(data)
    if header is not None:
        if context.resize.active and not context.resize.allows(header.height, header.width):
            return [_resized(data, header, name, context)]
        if header.orientation not in range(2, 9):
            return [context.fit(_plain(data, header, name, context), name)]
    return [context.fit(_pil.read(data, name, "jpeg", context, _from_pillow), name)]


# Start-of-frame markers of the lossless processes, JPEG-LS's (SOF55) among them.
_LOSSLESS_SOF = {0xC3: "lossless JPEG", 0xC7: "lossless JPEG", 0xCB: "lossless JPEG",
                 0xCF: "lossless JPEG", 0xF7: "JPEG-LS image"}


def _unread_process(data: bytes) -> str | None:
    """The JPEG process of a file TF cannot decode although it may be whole, from its first
    start-of-frame: '12-bit JPEG', 'lossless JPEG', 'JPEG-LS image'; None for any other."""
    pos = 2
    while pos + 9 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker in _LOSSLESS_SOF:
            return _LOSSLESS_SOF[marker]
        if marker in (0xC0, 0xC1, 0xC2) and data[pos + 4] == 12:
            return "12-bit JPEG"  # The DCT processes' only other precision (any other is damage).
        if marker == 0xDA or 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return None
        pos += 2 + (data[pos + 2] << 8 | data[pos + 3])
    return None


def batchable(data: bytes, context: Context) -> ValidImage | None:
    """What `images` gives for `data` if it is an ordinary upright JPEG that TF decodes, else None.

    The conditions of `images`'s plain path, for a file sniffed as JPEG. None
    also for a header over --max_pixels or one to be resized: `images` says
    or does so.
    """
    header = jpeg_header(data)
    if header is None or header.orientation in range(2, 9):
        return None
    if header.width * header.height > context.max_pixels:
        return None
    if context.resize.active and not context.resize.allows(header.height, header.width):
        return None  # Resized by `images` (--max_side/--min_side).
    return plain_image(data, "jpeg", header.height, header.width, header.components, "jpeg")


def decode_together(batch: Sequence[ValidImage], context: Context) -> bool:
    """Decodes the `batchable` images of `batch` in one TensorFlow run.

    One op call per image costs more CPU than decoding a small JPEG at 1/8
    scale; the run decodes them on TensorFlow's threads, without the GIL.

    Returns:
      True when every image decoded. False when one failed, or where no
      batch decoder is available: `images` then says, one file at a time,
      which failed and why.
    """
    # Plain, intact files are proven decodable without TensorFlow (`_jpeg_fast`);
    # TensorFlow decodes the rest, which decides.
    rest = [image.data for image in batch if not _surely_decodable(image.data, context)]
    if not rest:
        return True
    # Part of a batch left (rare: a damaged or unusual file) is decoded one
    # file at a time: no batch decoder built for each size a remainder has.
    decode = tf_runtime.jpeg_batch_decoder(len(rest), context.jpeg_ratio) if len(rest) == len(batch) \
        else _one_at_a_time(context)
    if decode is None:
        return False
    try:
        decode(rest)
    except context.ops.OpError:
        return False
    return True


def _surely_decodable(data: bytes, context: Context) -> bool:
    """Whether `_jpeg_fast` proves TF decodes `data`, asked only while TF's decode ops are not loaded.

    The check is what spares a photo conversion loading TensorFlow (~0.7 CPU
    s). Once the ops are loaded (a file needed them, or a worker process
    loaded them ahead), TensorFlow's decode is the cheaper one: about as
    cheap for a photo, a fifth of the CPU for a 32x32 JPEG in a batch of 64
    (0.013 ms against 0.067).
    """
    return not tf_runtime.image_ops_loaded() and _jpeg_fast.decodes(data, context.jpeg_ratio)


def _one_at_a_time(context: Context):
    def decode(datas: list[bytes]) -> None:
        for data in datas:
            context.ops.decode_jpeg(data, ratio=context.jpeg_ratio)
    return decode


def _plain(data: bytes, header: JpegHeader, name: str, context: Context) -> ValidImage:
    """An upright 8-bit JPEG whose markers were read by `jpeg_header`: TF decodes it, unless surely decodable."""
    context.check_pixels(header.width, header.height, name)
    if not _surely_decodable(data, context):
        try:
            # Kept byte for byte; the decode only proves TF can read every byte.
            context.ops.decode_jpeg(data, ratio=context.jpeg_ratio)
        except context.ops.OpError as e:
            raise context.corrupt(e, name) from e
    return ValidImage(data, "jpeg", header.height, header.width, header.components, "jpeg")


def _resized(data: bytes, header: JpegHeader, name: str, context: Context) -> ValidImage:
    """A JPEG larger than --max_side/--min_side: decoded once, at libjpeg's reduced scale.

    That decode is the validation too (TF's op reads every entropy-coded
    byte at any scale); what is stored is checked by `Context.stored`.
    """
    context.check_pixels(header.width, header.height, name)
    ratio = _resize.jpeg_scale(header.height, header.width, context.resize)
    try:
        pixels = np.asarray(context.ops.decode_jpeg(data, ratio=ratio))
    except context.ops.OpError as e:
        raise context.corrupt(e, name) from e
    actions = ("exif_transpose",) if header.orientation in range(2, 9) else ()
    upright = _resize.orient_array(pixels, header.orientation)
    # The upright size at full scale: what a viewer shows, what the cap applies to.
    full = (header.height, header.width) if upright.shape[:2] == pixels.shape[:2] \
        else (header.width, header.height)
    return context.store_resized(upright, full, "jpeg", "jpeg", actions, None, name)


def _from_pillow(data: bytes, im: Image.Image, fmt: str, name: str, context: Context) -> ValidImage:
    """A JPEG `jpeg_header` left to Pillow: turned upright by its EXIF orientation, or kept."""
    orientation = im.getexif().get(_pil.EXIF_ORIENTATION, 1)
    if orientation not in (1, None) and 2 <= int(orientation) <= 8:
        # TF ignores EXIF: without this the model would see the photo on
        # its side while every image viewer shows it upright.
        upright = ImageOps.exif_transpose(im)
        upright = _pil.to_storable_mode(upright, context.background)
        out = _pil.encode(upright, "jpeg" if upright.mode in ("L", "RGB") else "png")
        return context.checked(out, "jpeg", ("exif_transpose",), name)
    # Kept byte for byte; the decode only proves TF can read every byte.
    context.ops.decode_jpeg(data, ratio=context.jpeg_ratio)
    channels = 1 if im.mode == "L" else 3
    return ValidImage(data, "jpeg", im.height, im.width, channels, "jpeg")
