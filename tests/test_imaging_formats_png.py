"""The PNG handler (imaging/formats/png.py): kept bytes, 16 bits, flattened transparency."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers import encode, pixels

from imaging import ImageRejected, ValidationOptions, formats
from imaging.formats import png


@pytest.fixture(scope="module")
def context():
    return formats.Context(ValidationOptions(max_pixels=100_000, background=(10, 200, 30)))


def test_an_opaque_png_is_kept_byte_for_byte(context):
    for arr in (pixels(1), pixels(2, mode="L"), pixels(3, mode="RGBA") | np.uint8(255)):
        data = encode(arr, "PNG")
        [image] = png.images(data, "a.png", "png", context)
        assert image.data == data and image.format == "png" and image.actions == ()
        channels = 1 if arr.ndim == 2 else arr.shape[2]
        assert (image.height, image.width, image.channels) == (*arr.shape[:2], channels)


def test_a_16_bit_png_keeps_its_16_bits(context):
    arr = (np.arange(20 * 30, dtype=np.uint16).reshape(20, 30) * 97)
    data = encode(arr, "PNG")
    [image] = png.images(data, "deep.png", "png", context)
    assert image.data == data
    np.testing.assert_array_equal(tf.io.decode_png(image.data, dtype=tf.uint16).numpy()[..., 0], arr)


def test_transparency_is_flattened_onto_the_background(context):
    arr = pixels(4, mode="RGBA")
    arr[..., 3] = 255
    arr[0, 0, 3] = 0
    [image] = png.images(encode(arr, "PNG"), "t.png", "png", context)
    assert image.actions == ("flatten_alpha",) and image.channels == 3
    decoded = tf.io.decode_png(image.data).numpy()
    assert tuple(decoded[0, 0]) == (10, 200, 30)
    np.testing.assert_array_equal(decoded[1:, 1:], arr[1:, 1:, :3])


def test_a_damaged_header_is_corrupt_and_says_png(context):
    data = encode(pixels(5), "PNG")
    with pytest.raises(ImageRejected) as e:
        png.images(data[:8] + b"\0" * 40, "d.png", "png", context)
    assert e.value.reason == "corrupt" and "PNG" in e.value.message


def test_a_header_over_max_pixels_is_too_large(context):
    with pytest.raises(ImageRejected) as e:
        png.images(encode(pixels(6, size=(400, 300)), "PNG"), "big.png", "png", context)
    assert e.value.reason == "too_large"


def _with_trns(data: bytes, body: bytes) -> bytes:
    """`data` with a tRNS chunk (the transparent colour) before its first IDAT."""
    import struct
    import zlib

    at = data.index(b"IDAT") - 4
    chunk = struct.pack(">I", len(body)) + b"tRNS" + body + struct.pack(">I", zlib.crc32(b"tRNS" + body))
    return data[:at] + chunk + data[at:]


@pytest.mark.parametrize("kind", ["rgba", "grey_alpha", "rgb_trns", "grey_trns"])
def test_a_transparent_16_bit_png_is_flattened_at_16_bits(context, kind):
    """Pillow reads 16-bit colour and grey+alpha PNGs as 8-bit RGBA: flattening through it cut
    every value to 8 bits, and grey+alpha to RGB."""
    import imagecodecs  # An independent writer of 16-bit colour PNGs.

    grey = (np.arange(20 * 30, dtype=np.uint16).reshape(20, 30) * 97 + 1)
    alpha = np.full_like(grey, 65535)
    alpha[0, 0], alpha[0, 1] = 0, 32768
    colour = np.dstack([grey, grey // 2, 65535 - grey])
    data = {
        "rgba": lambda: imagecodecs.png_encode(np.dstack([colour, alpha])),
        "grey_alpha": lambda: imagecodecs.png_encode(np.dstack([grey, alpha])),
        "rgb_trns": lambda: _with_trns(imagecodecs.png_encode(colour), colour[0, 0].astype(">u2").tobytes()),
        "grey_trns": lambda: _with_trns(imagecodecs.png_encode(grey), grey[0, :1].astype(">u2").tobytes()),
    }[kind]()
    [image] = png.images(data, "t16.png", "png", context)
    expected = colour if kind.startswith("rgb") else grey[..., None]
    assert image.actions == ("flatten_alpha",)
    assert (image.height, image.width, image.channels) == expected.shape
    decoded = tf.io.decode_png(image.data, dtype=tf.uint16).numpy()
    background = np.array([10, 200, 30]) * 257
    if expected.shape[2] == 1:
        background = [round(float(background @ [0.299, 0.587, 0.114]))]
    np.testing.assert_array_equal(decoded[0, 0], background)  # Transparent: the background.
    np.testing.assert_array_equal(decoded[1:], expected[1:])  # Opaque: every 16-bit value kept.
    if kind in ("rgba", "grey_alpha"):
        half = np.rint(expected[0, 1] * (32768 / 65535) + np.asarray(background) * (32767 / 65535))
        np.testing.assert_array_equal(decoded[0, 1], half)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("kind", ["rgb", "grey16", "transparent"])
def test_a_png_with_an_exif_orientation_is_turned_upright(context, kind, orientation):
    """As JPEG, WebP and TIFF photos are (a PNG's eXIf chunk was ignored: the photo stayed on its
    side where every viewer and Pillow's `exif_transpose` turn it upright)."""
    from PIL import Image, ImageOps
    import io

    arr = {"rgb": lambda: pixels(8, size=(12, 20)),
           "grey16": lambda: np.arange(12 * 20, dtype=np.uint16).reshape(12, 20) * 211,
           "transparent": lambda: pixels(9, size=(12, 20), mode="RGBA") | np.uint8(255)}[kind]()
    if kind == "transparent":
        arr[0, 0, 3] = 0
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(arr, "PNG", exif=exif)
    [image] = png.images(data, "r.png", "png", context)
    source = Image.open(io.BytesIO(data))
    if kind == "transparent":
        flat = Image.new("RGBA", source.size, (10, 200, 30, 255))
        flat.alpha_composite(source.convert("RGBA"))
        flat.info["exif"] = source.info["exif"]
        source = flat.convert("RGB")
        source.info["exif"] = flat.info["exif"]
    expected = np.asarray(ImageOps.exif_transpose(source))
    dtype = tf.uint16 if kind == "grey16" else tf.uint8
    decoded = tf.io.decode_png(image.data, dtype=dtype).numpy()
    np.testing.assert_array_equal(decoded.reshape(expected.shape), expected)
    turned = ("exif_transpose",) if orientation > 1 else ()
    assert image.actions == turned + (("flatten_alpha",) if kind == "transparent" else ())
    assert (image.height, image.width) == expected.shape[:2]


def test_a_reject_speaks_of_the_file_not_of_tensorflows_op(tmp_path):
    # 'Invalid PNG data, size 300 [Op:DecodePng] name:' said which TensorFlow op failed, not why the file did.
    import json

    from helpers import convert, write

    import schemas

    write(tmp_path / "in" / "a" / "ok.png", encode(pixels(0, size=(64, 64)), "PNG"))
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    write(tmp_path / "in" / "a" / "trunc.png", encode(noise, "PNG")[:300])
    convert(tmp_path / "in", tmp_path / "out", "--max_reject_fraction", "0.9")
    [reject] = [json.loads(line) for line in (tmp_path / "out" / schemas.REJECTS_FILENAME).read_text().splitlines()]
    assert reject["reason"] == "corrupt"
    assert reject["message"].startswith("a/trunc.png: ")
    assert "[Op:" not in reject["message"] and "name:" not in reject["message"]
