"""The PNG check without TensorFlow's decode (imaging/formats/_png_fast.py).

It may only accept: on every PNG, from independent writers or damaged, the
validator must give what it gives with TensorFlow's decode alone (the same
image, or the same rejection and message), and where it accepts, TensorFlow
must decode the file to the same shape.
"""

from __future__ import annotations

import io
import pathlib
import struct
import zlib

import imagecodecs
import numpy as np
import pytest
import skimage
import tensorflow as tf
from PIL import Image
from helpers import encode, pixels

from bench import mutate
from imaging import ImageRejected, ImageValidator, ValidationOptions
from imaging.formats import _png_fast

_SKIMAGE_DATA = pathlib.Path(skimage.__file__).parent / "data"


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png(width: int, height: int, colour: int, rows: bytes, *, depth: int = 8, interlace: int = 0,
         extra: bytes = b"", stream: bytes | None = None) -> bytes:
    """A PNG written by hand (zlib, no library): the cases the writers above cannot make."""
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace)
    body = zlib.compress(rows, 6) if stream is None else stream
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + extra + _chunk(b"IDAT", body)
            + _chunk(b"IEND", b""))


def _tf_shape(data: bytes):
    dtype = tf.uint16 if data[24] == 16 else tf.uint8
    try:
        return tuple(tf.io.decode_png(data, dtype=dtype).shape)
    except tf.errors.InvalidArgumentError:
        return None


def _outcome(validator: ImageValidator, data: bytes):
    try:
        return validator.validate(data, "x.png")
    except ImageRejected as e:
        return ("rejected", e.reason, str(e))


@pytest.fixture(scope="module")
def validator():
    return ImageValidator(ValidationOptions(max_pixels=10_000_000))


def _as_before(validator, data, monkeypatch):
    """The validator's outcome with TensorFlow's decode alone (the check answering None)."""
    with monkeypatch.context() as m:
        m.setattr(_png_fast, "shape", lambda data: None)
        return _outcome(validator, data)


def _small_window(rows: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, 9)
    return compressor.compress(rows) + compressor.flush()


def _pillow_palette(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).convert("P").save(buf, "PNG")
    return buf.getvalue()


def _writers() -> dict[str, bytes]:
    rgb = pixels(1, size=(37, 53))
    grey16 = (np.arange(37 * 53, dtype=np.uint16).reshape(37, 53) * 31)
    rgba16 = np.stack([grey16, grey16 // 3, grey16 // 5, np.full_like(grey16, 65535)], axis=-1)
    files = {
        "pillow RGB": encode(rgb, "PNG"),
        "pillow RGB with pHYs": encode(rgb, "PNG", dpi=(300, 300)),
        "pillow L": encode(pixels(2, size=(37, 53), mode="L"), "PNG"),
        "pillow RGBA opaque": encode(pixels(3, size=(37, 53), mode="RGBA") | np.uint8(255), "PNG"),
        "pillow I;16": encode(grey16, "PNG"),
        "pillow P (palette)": _pillow_palette(pixels(4)),
        "imagecodecs RGB": imagecodecs.png_encode(rgb),
        "imagecodecs grey": imagecodecs.png_encode(np.ascontiguousarray(rgb[..., 0])),
        "imagecodecs grey+alpha opaque": imagecodecs.png_encode(
            np.stack([rgb[..., 0], np.full_like(rgb[..., 0], 255)], axis=-1)),
        "imagecodecs grey 16": imagecodecs.png_encode(grey16),
        "imagecodecs RGBA 16 opaque": imagecodecs.png_encode(rgba16),
        "imagecodecs RGB level 1": imagecodecs.png_encode(rgb, level=1),
        # By hand: interlaced (Adam7 of a 1x1 image is one pixel), palette,
        # tRNS, 1-bit grey, and a trailing copy of the zlib stream.
        "hand interlaced": _png(1, 1, 2, b"\x00\x10\x20\x30", interlace=1),
        "hand palette": _png(2, 1, 3, b"\x00\x00\x01", extra=_chunk(b"PLTE", bytes(range(6)))),
        "hand tRNS": _png(2, 1, 0, b"\x00\x05\x06", extra=_chunk(b"tRNS", b"\x00\x07")),
        "hand 1-bit": _png(8, 1, 0, b"\x00\xa5", depth=1),
        "hand stream twice": _png(2, 1, 0, b"\x00\x05\x06",
                                  stream=zlib.compress(b"\x00\x05\x06") * 2),
        "hand plain": _png(2, 1, 0, b"\x00\x05\x06"),
        "hand gAMA": _png(2, 1, 0, b"\x00\x05\x06", extra=_chunk(b"gAMA", struct.pack(">I", 45455))),
        "hand gAMA of 3 bytes": _png(2, 1, 0, b"\x00\x05\x06", extra=_chunk(b"gAMA", b"\x00\x00\x01")),
        # A 512-byte zlib window: enough for 16 rows of 31 bytes, not for 17.
        "hand small window": _png(10, 16, 2, bytes(16 * 31), stream=_small_window(bytes(16 * 31))),
        "hand small window too small": _png(10, 17, 2, bytes(17 * 31), stream=_small_window(bytes(17 * 31))),
    }
    for name in ("astronaut.png", "camera.png", "logo.png", "chessboard_GRAY.png", "motorcycle_left.png"):
        path = _SKIMAGE_DATA / name
        if path.exists():
            files["skimage " + name] = path.read_bytes()
    return files


def test_independent_writers_give_what_tensorflow_gives(validator, monkeypatch):
    files = _writers()
    accepted = set()
    for name, data in files.items():
        fast = _png_fast.shape(data)
        if fast is not None:
            accepted.add(name)
            assert fast == _tf_shape(data), name
        assert _outcome(validator, data) == _as_before(validator, data, monkeypatch), name
    # The plain cases take the fast path; the unusual ones are left to TensorFlow.
    plain = ("pillow RGB", "pillow RGB with pHYs", "pillow L", "pillow RGBA opaque", "pillow I;16",
             "imagecodecs RGB", "imagecodecs grey", "imagecodecs grey+alpha opaque", "imagecodecs grey 16",
             "imagecodecs RGBA 16 opaque", "imagecodecs RGB level 1", "hand plain", "hand gAMA",
             "hand small window", "skimage camera.png")
    unusual = ("pillow P (palette)", "hand interlaced", "hand palette", "hand tRNS", "hand 1-bit",
               "hand stream twice", "hand small window too small", "hand gAMA of 3 bytes")
    assert [name for name in plain if name in files and name not in accepted] == []
    assert [name for name in unusual if name in accepted] == []


def test_damaged_pngs_are_never_accepted_where_tensorflow_refuses(validator, monkeypatch):
    seeds = [encode(pixels(5, size=(40, 60)), "PNG"),
             imagecodecs.png_encode(pixels(6, size=(30, 20), mode="L"))]
    accepted = refused = 0
    for seed in seeds:
        for case in mutate.mutations(seed, "png", count=150, seed=0):
            fast = _png_fast.shape(case.data)
            if fast is not None:
                accepted += 1
                assert fast == _tf_shape(case.data), case.how
            elif len(case.data) > 24 and _tf_shape(case.data) is None:
                refused += 1
            assert _outcome(validator, case.data) == _as_before(validator, case.data, monkeypatch), case.how
    # Both sides are exercised: some damage is harmless, most is refused.
    assert accepted > 0 and refused > 0
