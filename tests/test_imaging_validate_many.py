"""ImageValidator.validate_many: batches of JPEGs decoded in one TensorFlow run, same results."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tensorflow as tf
from helpers import encode, pixels
from PIL import Image

from compat import tf_internals
from imaging import ImageRejected, ImageValidator
from schemas import tf_runtime


def _exif_jpeg(arr, orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(arr, "JPEG", exif=exif)


def _cmyk_jpeg(arr):
    buf = io.BytesIO()
    Image.fromarray(arr).convert("CMYK").save(buf, "JPEG")
    return buf.getvalue()


def _corrupt(data: bytes) -> bytes:
    """The scan's bytes overwritten by a run of markers libjpeg does not expect."""
    scan = data.index(b"\xff\xda") + 20
    return data[:scan] + b"\xff\xc0\x00\x02" * 8 + data[scan + 32:]


def _mix() -> list[tuple[bytes, str]]:
    good = encode(pixels(1), "JPEG", quality=90)
    items = [
        (good, "good.jpg"),
        (encode(pixels(2), "JPEG", progressive=True), "progressive.jpg"),
        (encode(pixels(3, mode="L"), "JPEG"), "grey.jpg"),
        (good[: len(good) // 2], "truncated.jpg"),
        (_corrupt(encode(pixels(4, size=(64, 64)), "JPEG")), "corrupt.jpg"),
        (_exif_jpeg(pixels(5), 6), "rotated.jpg"),
        (_exif_jpeg(pixels(6), 1), "upright_exif.jpg"),
        (_cmyk_jpeg(pixels(7)), "cmyk.jpg"),
        (encode(pixels(8), "PNG"), "photo.png"),
        (encode(np.arange(24 * 32, dtype=np.uint16).reshape(24, 32) * 80, "PNG"), "ct16.png"),
        (encode(pixels(9, mode="RGBA"), "PNG"), "alpha.png"),
        (encode(pixels(10, size=(200, 200)), "JPEG"), "too_large.jpg"),
        (b"", "empty.jpg"),
        (b"not an image at all", "text.jpg"),
        (b"\xff\xd8\xff\xe0" + b"\0" * 40, "header_only.jpg"),
    ]
    # Enough ordinary JPEGs around them for batches of every size.
    items += [(encode(pixels(20 + i, size=(8 + i % 5, 9)), "JPEG"), f"more_{i}.jpg") for i in range(70)]
    return items


def _one_by_one(validator, items):
    out = []
    for data, name in items:
        try:
            out.append(validator.validate_all(data, name))
        except ImageRejected as e:
            out.append(("rejected", e.reason, e.message))
    return out


def _many(validator, items):
    return [("rejected", r.reason, r.message) if isinstance(r, ImageRejected) else r
            for r in validator.validate_many(items)]


def test_the_batch_decoder_is_used_on_the_tested_tensorflow():
    # The fact the other tests rely on: on the installed TensorFlow (within
    # compat.tf_internals.TESTED) batches do run in one graph.
    tf_internals.check("test")
    assert tf_runtime.jpeg_batch_decoder(4, 8) is not None


@pytest.mark.parametrize("full_decode", [False, True])
def test_same_results_as_one_image_at_a_time(full_decode):
    validator = ImageValidator(max_pixels=30_000, full_decode=full_decode)
    items = _mix()
    expected = _one_by_one(validator, items)
    assert _many(validator, items) == expected
    reasons = sorted(e[1] for e in expected if isinstance(e, tuple))
    assert reasons == ["corrupt", "corrupt", "corrupt", "empty_file", "not_an_image", "too_large"]
    actions = {item[0][0].actions for item in zip(expected, items) if isinstance(item[0], list)}
    assert {("exif_transpose",), ("flatten_alpha",), ()} <= actions


@pytest.mark.parametrize("position", [0, 17, 63])
def test_a_bad_image_in_a_full_batch_rejects_it_alone(position):
    # A failing batch is decoded again one image at a time: the others are
    # kept and the reject says what `validate` says.
    validator = ImageValidator()
    items = [(encode(pixels(i, size=(12, 10)), "JPEG"), f"{i}.jpg") for i in range(64)]
    truncated = items[position][0][:-60]
    items[position] = (truncated, "bad.jpg")
    results = validator.validate_many(items)
    with pytest.raises(ImageRejected) as e:
        validator.validate(truncated, "bad.jpg")
    bad = results[position]
    assert isinstance(bad, ImageRejected) and (bad.reason, bad.message) == (e.value.reason, e.value.message)
    kept = [r for k, r in enumerate(results) if k != position]
    assert all(r[0].data == items[k + (k >= position)][0] for k, r in enumerate(kept))


def test_batch_decoder_decodes_like_the_eager_op():
    datas = [encode(pixels(i, size=(40 + i, 33)), "JPEG") for i in range(3)]
    for ratio in (1, 8):
        shapes = tf_runtime.jpeg_batch_decoder(3, ratio)(datas)
        assert [tuple(s) for s in shapes] == [tuple(tf.io.decode_jpeg(d, ratio=ratio).shape) for d in datas]
    with pytest.raises(tf_runtime.image_ops().OpError):
        tf_runtime.jpeg_batch_decoder(3, 8)([datas[0], datas[1][:100], datas[2]])


def test_empty_input():
    assert ImageValidator().validate_many([]) == []


def test_batched_jpegs_are_resized_as_validate_resizes_them():
    from imaging import ResizeOptions

    validator = ImageValidator(resize=ResizeOptions(max_side=16))
    big = encode(pixels(5, size=(48, 32)), "JPEG", quality=90)   # over the cap: resized
    small = encode(pixels(6, size=(12, 10)), "JPEG", quality=90)  # fits: kept byte for byte
    items = [(big, f"big{i}.jpg") for i in range(3)] + [(small, f"small{i}.jpg") for i in range(5)]
    got = validator.validate_many(items)
    for (data, name), images in zip(items, got):
        [want] = [validator.validate(data, name)]
        [image] = images
        assert (image.height, image.width, image.data) == (want.height, want.width, want.data), name
    assert (got[0][0].height, got[0][0].width) == (16, 11) and "resize_max_side" in got[0][0].actions
    assert got[3][0].data == small
