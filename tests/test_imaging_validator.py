"""Validation and normalisation of single images (imaging/validator.py, imaging/sniff.py)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import tensorflow as tf
from helpers import encode, pixels
from PIL import Image

from imaging import ImageRejected, ImageValidator, sniff_format
from imaging.sniff import jpeg_header


@pytest.fixture(scope="module")
def validator():
    return ImageValidator(max_pixels=10_000_000)


def _decode(data: bytes) -> np.ndarray:
    return tf.io.decode_image(data, expand_animations=False).numpy()


@pytest.mark.parametrize(
    "data, expected",
    [
        (encode(pixels(0), "JPEG"), "jpeg"),
        (encode(pixels(0), "PNG"), "png"),
        (encode(pixels(0), "GIF"), "gif"),
        (encode(pixels(0), "BMP"), "bmp"),
        (encode(pixels(0), "WEBP"), "webp"),
        (encode(pixels(0), "TIFF"), "tiff"),
        (b"\0" * 128 + b"DICM" + b"\0" * 8, "dicom"),  # DICOM preamble then magic
        (b"hello world", None),
    ],
)
def test_sniff_format_reads_bytes_not_names(data, expected):
    assert sniff_format(data[:132]) == expected


def test_valid_jpeg_and_png_are_kept_byte_for_byte(validator):
    for fmt, data in (("jpeg", encode(pixels(1), "JPEG", quality=90)),
                      ("jpeg", encode(pixels(2), "JPEG", progressive=True)),
                      ("jpeg", encode(pixels(3, mode="L"), "JPEG")),
                      ("png", encode(pixels(4), "PNG")),
                      ("png", encode(pixels(5, mode="L"), "PNG"))):
        out = validator.validate(data, "x")
        assert out.data == data and out.format == fmt and out.actions == ()
        assert (out.height, out.width, out.channels) == _decode(data).shape


def _jpeg_variants():
    """JPEGs as cameras and tools write them, and some they should not."""
    out = []
    for i, (size, mode) in enumerate((((24, 32), "RGB"), ((7, 300), "RGB"), ((33, 17), "L"))):
        arr = pixels(i, size=size, mode=mode)
        out.append(encode(arr, "JPEG"))
        out.append(encode(arr, "JPEG", progressive=True, optimize=True))
        for orientation in (1, 3, 6, 8, 9):
            exif = Image.Exif()
            exif[0x0112] = orientation
            exif[0x010F] = "maker"  # Another tag before it in IFD0.
            out.append(encode(arr, "JPEG", exif=exif))
        buf = io.BytesIO()
        Image.fromarray(arr).convert("CMYK").save(buf, "JPEG")
        out.append(buf.getvalue())
    data = out[0]
    out.append(data[:2] + b"\xff\xe1\x00\x10Exif\x00\x00MM\x00*\x00\x00" + data[2:])  # Damaged EXIF.
    out.append(data[:2] + b"\xff\xff" + data[2:])  # A fill byte.
    out.append(data[:40])  # Cut in its header.
    out.append(data[:2] + b"\xff\xc0\x00\x02" + data[2:])  # A frame header with no frame.
    return out


def test_jpeg_marker_reader_agrees_with_pillow_or_leaves_the_file_to_it():
    # The marker walk replaces Pillow on ordinary JPEGs: where it answers, it
    # must give Pillow's size, channels and orientation; where it cannot, it
    # returns None and Pillow reads the file as before.
    answered = 0
    for data in _jpeg_variants():
        header = jpeg_header(data)
        if header is None:
            continue
        answered += 1
        with Image.open(io.BytesIO(data)) as im:
            assert (header.width, header.height) == im.size
            assert header.components == len(im.getbands())
            assert header.orientation == im.getexif().get(0x0112)
    # Every RGB and grey variant and the one with a fill byte; not CMYK, not
    # the damaged ones.
    assert answered == 22


def test_cmyk_jpeg_is_kept_and_decodes_to_rgb(validator):
    buf = io.BytesIO()
    Image.fromarray(pixels(6)).convert("CMYK").save(buf, "JPEG")
    data = buf.getvalue()
    out = validator.validate(data, "cmyk.jpg")
    assert out.data == data and out.channels == 3


def test_exif_rotated_photo_is_turned_upright(validator):
    upright = np.zeros((40, 20, 3), np.uint8)
    upright[:10] = (250, 10, 10)  # A red band at the top of the upright picture.
    stored = Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90)  # As a camera stores it.
    exif = Image.Exif()
    exif[0x0112] = 6  # "Rotate 90 CW to display."
    buf = io.BytesIO()
    stored.save(buf, "JPEG", exif=exif, quality=95)
    out = validator.validate(buf.getvalue(), "phone.jpg")
    assert out.actions == ("exif_transpose",)
    got = _decode(out.data)
    assert got.shape == (40, 20, 3)
    assert np.abs(got.astype(int) - upright.astype(int)).mean() < 6
    assert got[:10, :, 0].mean() > 200 and got[20:, :, 0].mean() < 50


def test_transparent_png_is_flattened_onto_the_background():
    arr = np.zeros((8, 8, 4), np.uint8)
    arr[:, :4] = (255, 0, 0, 0)  # Invisible red: a viewer shows the background.
    arr[:, 4:] = (0, 0, 255, 255)
    data = encode(arr, "PNG")
    for background in ((255, 255, 255), (0, 0, 0)):
        out = ImageValidator(max_pixels=100, background=background).validate(data, "t.png")
        assert out.actions == ("flatten_alpha",) and out.channels == 3
        got = _decode(out.data)
        assert (got[:, :4] == background).all() and (got[:, 4:] == (0, 0, 255)).all()


def test_opaque_rgba_png_is_kept(validator):
    arr = np.dstack([pixels(7), np.full((24, 32), 255, np.uint8)])
    data = encode(arr, "PNG")
    out = validator.validate(data, "opaque.png")
    assert out.data == data and out.channels == 4


def test_sixteen_bit_png_is_kept(validator):
    arr = (np.arange(24 * 32, dtype=np.uint16).reshape(24, 32) * 80)
    data = encode(arr, "PNG")
    out = validator.validate(data, "ct.png")
    assert out.data == data and out.channels == 1
    np.testing.assert_array_equal(tf.io.decode_png(out.data, dtype=tf.uint16).numpy()[..., 0], arr)


def test_animated_gif_keeps_its_first_frame(validator):
    frames = [Image.fromarray(pixels(i)).convert("P") for i in (8, 9)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    out = validator.validate(buf.getvalue(), "anim.gif")
    assert out.format == "png" and "first_frame" in out.actions
    np.testing.assert_array_equal(_decode(out.data), np.asarray(frames[0].convert("RGB")))


@pytest.mark.parametrize("fmt, kwargs", [("TIFF", {}), ("BMP", {}), ("WEBP", {"lossless": True})])
def test_formats_tf_lacks_are_reencoded_losslessly(validator, fmt, kwargs):
    arr = pixels(10)
    out = validator.validate(encode(arr, fmt, **kwargs), f"x.{fmt.lower()}")
    assert out.format == "png" and out.actions[0] == f"reencode_{fmt.lower()}_to_png"
    np.testing.assert_array_equal(_decode(out.data), arr)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def test_decompression_bomb_header_is_rejected_before_decoding(validator):
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(b"\0" * 64))
    with pytest.raises(ImageRejected) as e:
        validator.validate(data, "bomb.png")
    assert e.value.reason == "too_large" and "10,000,000,000" in e.value.message


@pytest.mark.parametrize(
    "name, mutate, reason",
    [
        ("empty", lambda b: b"", "empty_file"),
        ("text", lambda b: b"GIF? no, text", "not_an_image"),
        ("truncated", lambda b: b[: len(b) // 2], "corrupt"),
        ("bad_crc", lambda b: b[:40] + bytes([b[40] ^ 0xFF]) + b[41:], "corrupt"),
    ],
)
def test_broken_png_is_rejected_with_reason(validator, name, mutate, reason):
    data = mutate(encode(pixels(11, size=(64, 64)), "PNG"))
    with pytest.raises(ImageRejected) as e:
        validator.validate(data, f"{name}.png")
    assert e.value.reason == reason
    assert f"{name}.png" in e.value.message or reason == "corrupt"


@pytest.mark.parametrize("full_decode", [False, True])
def test_truncated_jpeg_is_caught_at_both_validation_scales(full_decode):
    data = encode(pixels(12, size=(256, 256)), "JPEG", quality=95)
    v = ImageValidator(max_pixels=10**7, full_decode=full_decode)
    for cut in (0.3, 0.7, 0.95):
        with pytest.raises(ImageRejected) as e:
            v.validate(data[: int(len(data) * cut)], "cut.jpg")
        assert e.value.reason == "corrupt"


def test_options_object_and_keywords_build_the_same_validator():
    from imaging import DicomOptions, ValidationOptions

    data = encode(np.full((8, 8, 4), (10, 20, 30, 0), np.uint8), "PNG")
    by_options = ImageValidator(ValidationOptions(max_pixels=100, background=(0, 0, 255)))
    by_keywords = ImageValidator(max_pixels=100, background=(0, 0, 255))
    assert by_options.validate(data, "t.png") == by_keywords.validate(data, "t.png")
    with pytest.raises(ImageRejected, match="more than --max_pixels=10"):
        ImageValidator(ValidationOptions(max_pixels=100), max_pixels=10).validate(data, "t.png")
    assert ValidationOptions(max_pixels=7, dicom=DicomOptions(frames="all")).dicom == DicomOptions(
        frames="all", max_pixels=7)
    with pytest.raises(ValueError, match=r"--max_pixels must be at least 1. Received: 0"):
        ValidationOptions(max_pixels=0)
    with pytest.raises(ValueError, match=r"--background must be R,G,B in 0-255. Received: \(1, 2\)"):
        ValidationOptions(background=(1, 2))
