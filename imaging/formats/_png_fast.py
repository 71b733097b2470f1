"""An accept-only check that a plain PNG decodes, without decoding its pixels.

`shape` proves what TensorFlow's `decode_png` would give for the plainest
PNGs (the shape, at the dtype `Context.png_dtype` asks for) by walking what
libpng walks and erroring on: every chunk's length and CRC, IHDR's fields,
one run of IDAT chunks, IEND at the very end, the zlib stream inflated whole
(its header, every DEFLATE block and its Adler-32), exactly the bytes the rows
need, and every row's filter type. Unfiltering cannot fail once those hold,
so it is not done.

It answers None at the least doubt (palette, interlacing, bit depths below 8,
a tRNS or any chunk outside a short list, a zlib window below 32 KiB, data
after the zlib stream, ...): the caller then decodes with TensorFlow as
always, which decides, and words any rejection, exactly as before. So this
module never rejects a file and never changes what is stored or reported.

Why not a PNG decoding library: per PNG of the bench's photos (469x402 RGB,
~400 KB; CPU ms, 60 files, 2026-12-06), tf.io.decode_png 3.81,
imagecodecs.png_decode 3.33, spng 3.30, Pillow 4.85: a full decode costs as
much whoever does it, most of it in unfiltering. Inflating the IDAT data alone
costs 2.48 with zlib, 1.80 with zlib-ng and 1.34 with libdeflate
(`imagecodecs.deflate_decode` given the output size), so the check inflates
with libdeflate and skips unfiltering.
"""

from __future__ import annotations

import functools
import struct
import zlib

import numpy as np

__all__ = ["shape"]

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Channels of colour types 0 (grey), 2 (RGB), 4 (grey + alpha), 6 (RGBA), as
# decode_png(channels=0) gives them; palette (3) is left to TensorFlow.
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}
# Ancillary chunks that carry no pixels and that libpng reads without failing
# (a damaged one gets a libpng warning, which TensorFlow prints to stderr),
# with the length each must have (None: any); any other chunk, tRNS included
# (it adds an alpha channel), or another length leaves the file to TensorFlow.
_BEFORE_IDAT = {b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9, b"tEXt": None, b"tIME": 7}
_AFTER_IDAT = {b"tEXt": None, b"tIME": 7}
# libpng's default user limits (PNG_USER_WIDTH_MAX, PNG_USER_HEIGHT_MAX), and
# a decoded size far below any of TensorFlow's own size checks.
_SIDE_MAX = 1_000_000
_BYTES_MAX = 1 << 30
_CHUNK_HEAD = struct.Struct(">I4s")
_U32 = struct.Struct(">I")



@functools.cache
def _libdeflate():
    """(imagecodecs' libdeflate inflate, its errors), or None without libdeflate; loaded at the first PNG."""
    try:  # imagecodecs is a dependency; a build without libdeflate leaves every PNG to TensorFlow.
        import imagecodecs
        if not imagecodecs.DEFLATE.available:
            return None
        return imagecodecs.deflate_decode, (imagecodecs.DeflateError, MemoryError)
    except (ImportError, AttributeError):  # pragma: no cover - depends on the installed build
        return None


def shape(data: bytes) -> tuple[int, int, int] | None:
    """(height, width, channels) TensorFlow's `decode_png` gives `data`, when surely decodable; else None.

    Args:
      data: A whole PNG file.

    Returns:
      The decoded shape, only for a plain, intact PNG; None where anything
      is unusual or damaged (TensorFlow must decide then).
    """
    codec = _libdeflate()
    if codec is None or not data.startswith(_SIGNATURE) or len(data) < 57:
        return None
    inflate, inflate_errors = codec
    view = memoryview(data)
    end = len(data)
    pos = 8
    ihdr = None
    idat: list[memoryview] = []
    state = 0  # 0: before IDAT, 1: in the IDAT run, 2: after it.
    while True:
        if pos + 12 > end:
            return None
        length, kind = _CHUNK_HEAD.unpack_from(data, pos)
        body_end = pos + 8 + length
        if length > 0x7FFFFFFF or body_end + 4 > end:
            return None
        if zlib.crc32(view[pos + 4:body_end]) != _U32.unpack_from(data, body_end)[0]:
            return None
        if ihdr is None:
            if kind != b"IHDR" or length != 13:
                return None
            ihdr = data[pos + 8:body_end]
        elif kind == b"IDAT":
            if state == 2:
                return None
            state = 1
            idat.append(view[pos + 8:body_end])
        elif kind == b"IEND":
            if length != 0 or state == 0 or body_end + 4 != end:
                return None
            break
        elif (_BEFORE_IDAT if state == 0 else _AFTER_IDAT).get(kind, -1) not in (None, length):
            return None
        else:
            state = 2 if state == 1 else state
        pos = body_end + 4
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", ihdr)
    channels = _CHANNELS.get(colour)
    if (channels is None or depth not in (8, 16) or compression or filtering or interlace
            or not 0 < width <= _SIDE_MAX or not 0 < height <= _SIDE_MAX):
        return None
    row = 1 + width * channels * depth // 8
    size = height * row
    if size > _BYTES_MAX:
        return None
    stream = b"".join(idat)
    # A zlib header: DEFLATE, no preset dictionary, and a window that holds
    # every distance. libdeflate ignores the window size, zlib (libpng's)
    # refuses a distance beyond it: a window below 32 KiB (libpng writes
    # them for small images) is accepted only when it holds all the rows.
    if len(stream) < 6 or (stream[0] << 8 | stream[1]) % 31 or stream[1] & 0x20:
        return None
    method, window = stream[0] & 15, stream[0] >> 4
    if method != 8 or window > 7 or window < 7 and size > 1 << (window + 8):
        return None
    try:
        # One byte of room more than the rows need: a stream holding more
        # inflates to more, and is left to TensorFlow.
        pixels = inflate(stream, out=size + 1)
    except inflate_errors:  # Damaged, or too large to hold: TensorFlow decides.
        return None
    if len(pixels) != size:
        return None
    # libdeflate (as zlib) stops at the stream's end and ignores what follows,
    # which libpng refuses. It checked the Adler-32 of `pixels` at the stream's
    # true end: that value must be the last 4 bytes and appear nowhere
    # earlier, or the stream may end before the data does (a duplicated IDAT,
    # say): exact, and left to TensorFlow about once in 10,000 intact files.
    tail = stream[-4:]
    if zlib.adler32(pixels) != _U32.unpack(tail)[0] or stream.find(tail) != len(stream) - 4:
        return None
    filters = np.frombuffer(pixels, np.uint8)[::row]
    if int(filters.max()) > 4:
        return None
    return height, width, channels
