"""A corpus of everything that goes wrong in real image folders, converted in one run."""

from __future__ import annotations

import io
import json
import os
import struct
import zlib

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert, encode, pixels, read_records, write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import schemas
from imaging import ImageRejected, ImageValidator


def _png_with_bad_crc() -> bytes:
    data = bytearray(encode(pixels(3, size=(32, 32)), "PNG"))
    data[-20] ^= 0xFF  # Inside the IDAT chunk: its CRC no longer matches.
    return bytes(data)


def _bomb_header_jpeg() -> bytes:
    data = bytearray(encode(pixels(4), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5: sof + 9] = struct.pack(">HH", 60000, 60000)  # height, width
    return bytes(data)


def _exif_rotated() -> tuple[bytes, np.ndarray]:
    upright = np.zeros((48, 24, 3), np.uint8)
    upright[:12] = (240, 20, 20)
    exif = Image.Exif()
    exif[0x0112] = 8  # "Rotate 90 CCW to display."
    buf = io.BytesIO()
    Image.fromarray(upright).transpose(Image.Transpose.ROTATE_270).save(buf, "JPEG", exif=exif, quality=95)
    return buf.getvalue(), upright


def _animated_gif() -> bytes:
    frames = [Image.fromarray(pixels(i)).convert("P") for i in (5, 6, 7)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100)
    return buf.getvalue()


@pytest.fixture(scope="module")
def bad_corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    root = tmp / "images"
    c = root / "things"
    jpeg = encode(pixels(1, size=(64, 64)), "JPEG")
    png = encode(pixels(2, size=(64, 64)), "PNG")
    rotated, upright = _exif_rotated()
    cmyk = io.BytesIO()
    Image.fromarray(pixels(8)).convert("CMYK").save(cmyk, "JPEG")
    transparent = np.dstack([pixels(9), np.tile(np.arange(0, 256, 8, dtype=np.uint8), (24, 1))])
    expected = {  # relative path -> reason, or None for converted
        "things/zero.jpg": "empty_file",
        "things/truncated.jpg": "corrupt",
        "things/truncated.png": "corrupt",
        "things/bad_crc.png": "corrupt",
        "things/text.jpg": "not_an_image",
        "things/png_named.jpg": None,
        "things/cmyk.jpg": None,
        "things/progressive.jpg": None,
        "things/sixteen.png": None,
        "things/palette.png": None,
        "things/transparent.png": None,
        "things/animated.gif": None,
        "things/huge_header.jpg": "too_large",
        "things/rotated.jpg": None,
        "things/with space.jpg": None,
        "things/ünïcødé.png": None,
        os.fsdecode(b"things/raw\xff\xfe.jpg"): None,
        "things/link.jpg": None,
        "things/dangling.jpg": "broken_symlink",
        "things/loop_a.jpg": "symlink_loop",
        "things/loop_b.jpg": "symlink_loop",
        "things/x.jpg/inside.png": None,
        "things/.DS_Store": "hidden_file",
        "things/._photo.jpg": "hidden_file",
        "things/Thumbs.db": "hidden_file",
    }
    write(c / "zero.jpg", b"")
    write(c / "truncated.jpg", jpeg[: len(jpeg) // 2])
    write(c / "truncated.png", png[: len(png) // 2])
    write(c / "bad_crc.png", _png_with_bad_crc())
    write(c / "text.jpg", b"Just some notes, not a photo.\n")
    write(c / "png_named.jpg", png)
    write(c / "cmyk.jpg", cmyk.getvalue())
    write(c / "progressive.jpg", encode(pixels(10), "JPEG", progressive=True))
    write(c / "sixteen.png", encode((np.arange(24 * 32, dtype=np.uint16).reshape(24, 32) * 70), "PNG"))
    write(c / "palette.png", encode(np.asarray(Image.fromarray(pixels(11)).convert("P")), "PNG"))
    write(c / "transparent.png", encode(transparent, "PNG"))
    write(c / "animated.gif", _animated_gif())
    write(c / "huge_header.jpg", _bomb_header_jpeg())
    write(c / "rotated.jpg", rotated)
    write(c / "with space.jpg", jpeg)
    write(c / "ünïcødé.png", png)
    with open(os.fsencode(str(c)) + b"/raw\xff\xfe.jpg", "wb") as f:
        f.write(encode(pixels(12), "JPEG"))
    os.symlink(c / "with space.jpg", c / "link.jpg")
    os.symlink(c / "missing.jpg", c / "dangling.jpg")
    os.symlink(c / "loop_b.jpg", c / "loop_a.jpg")
    os.symlink(c / "loop_a.jpg", c / "loop_b.jpg")
    write(c / "x.jpg" / "inside.png", encode(pixels(13), "PNG"))
    write(c / ".DS_Store", b"\0\0\0\1Bud1")
    write(c / "._photo.jpg", b"\0\5\26\7")
    write(c / "Thumbs.db", b"\xd0\xcf\x11\xe0")
    out = tmp / "out"
    manifest = convert(root, out, "--max_pixels", "100000000", "--max_reject_fraction", "1")
    return root, out, manifest, expected, upright


def test_every_file_is_converted_or_rejected_with_the_right_reason(bad_corpus):
    _, out, manifest, expected, _ = bad_corpus
    rejects = {r["path"]: r["reason"] for r in map(json.loads, (out / schemas.REJECTS_FILENAME).open())}
    records = read_records(out)
    converted = {os.fsdecode(r[schemas.FILENAME.key]) for r in records}
    display = {p: os.fsencode(p).decode("utf-8", "backslashreplace") for p in expected}
    assert converted == {p for p, why in expected.items() if why is None}
    assert rejects == {display[p]: why for p, why in expected.items() if why is not None}
    c = manifest.counts
    assert c["found"] == len(expected) == c["written"] + c["rejected"] + c["skipped"]


def test_undecodable_names_survive_as_bytes(bad_corpus):
    _, out, _, _, _ = bad_corpus
    names = {r[schemas.FILENAME.key] for r in read_records(out)}
    assert b"things/raw\xff\xfe.jpg" in names
    assert "things/ünïcødé.png".encode() in names


def test_normalised_images_decode_as_a_person_sees_them(bad_corpus):
    root, out, manifest, _, upright = bad_corpus
    by_name = {os.fsdecode(r[schemas.FILENAME.key]): r for r in read_records(out)}
    got = tf.io.decode_image(by_name["things/rotated.jpg"][schemas.IMAGE.key]).numpy()
    assert got.shape == upright.shape and np.abs(got.astype(int) - upright).mean() < 6
    flat = tf.io.decode_image(by_name["things/transparent.png"][schemas.IMAGE.key]).numpy()
    assert flat.shape[-1] == 3
    gif = tf.io.decode_image(by_name["things/animated.gif"][schemas.IMAGE.key], expand_animations=False)
    assert gif.shape.rank == 3
    for name in ("things/cmyk.jpg", "things/progressive.jpg", "things/png_named.jpg", "things/sixteen.png"):
        assert by_name[name][schemas.IMAGE.key] == (root / name).read_bytes()  # kept as they are
    normalized = {json.loads(line)["path"]: json.loads(line)["actions"]
                  for line in (out / schemas.NORMALIZED_FILENAME).open()}
    assert normalized == {"things/rotated.jpg": ["exif_transpose"],
                          "things/transparent.png": ["flatten_alpha"],
                          "things/animated.gif": ["reencode_gif_to_png", "first_frame"]}
    assert manifest.normalized == {"exif_transpose": 1, "first_frame": 1, "flatten_alpha": 1,
                                   "reencode_gif_to_png": 1}


_SEEDS = [encode(pixels(20, size=(40, 40)), fmt) for fmt in ("JPEG", "PNG", "GIF", "BMP", "TIFF")]


@st.composite
def _mutated_images(draw):
    data = bytearray(draw(st.sampled_from(_SEEDS)))
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "zero"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[pos: pos + draw(st.integers(1, 64))]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        else:
            data[pos: pos + 8] = b"\0" * 8
    return bytes(data)


@settings(max_examples=150, deadline=10_000, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(_mutated_images(), st.binary(max_size=512)))
def test_random_and_mutated_bytes_never_crash_and_never_pass_undecodable(data):
    validator = ImageValidator(max_pixels=4_000_000)
    try:
        image = validator.validate(data, "fuzz")
    except ImageRejected as e:
        assert e.reason in schemas.REJECT_REASONS
        return
    # Whatever is accepted decodes with the reader's op, at the size it claims:
    # decode_image, or for a raw raster decode_raw of its dtype, reshaped.
    raw = schemas.parse_raw_format(image.format)
    if raw is None:
        decoded = tf.io.decode_image(image.data, expand_animations=False)
    else:
        decoded = tf.reshape(tf.io.decode_raw(image.data, getattr(tf, raw)),
                             (image.height, image.width, image.channels))
    assert tuple(decoded.shape) == (image.height, image.width, image.channels)
