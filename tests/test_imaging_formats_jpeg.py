"""The JPEG handler (imaging/formats/jpeg.py): kept bytes, EXIF rotation, resizing, batches."""

from __future__ import annotations

import io

import numpy as np
import pytest
from helpers import encode, pixels
from PIL import Image

from imaging import ImageRejected, ResizeOptions, ValidationOptions, formats
from imaging.formats import jpeg


@pytest.fixture(scope="module")
def context():
    return formats.Context(ValidationOptions(max_pixels=100_000))


def _rotated(arr: np.ndarray, orientation: int) -> bytes:
    im = Image.fromarray(arr)
    exif = im.getexif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=95, exif=exif)
    return buf.getvalue()


def test_an_upright_jpeg_is_kept_byte_for_byte(context):
    for arr in (pixels(1, size=(20, 30)), pixels(2, size=(9, 13), mode="L")):
        data = encode(arr, "JPEG", quality=90)
        [image] = jpeg.images(data, "a.jpg", "jpeg", context)
        assert image.data == data and image.format == "jpeg" and image.actions == ()
        assert (image.height, image.width, image.channels) == (*arr.shape[:2], 1 if arr.ndim == 2 else 3)


def test_an_exif_rotated_jpeg_is_turned_upright(context):
    arr = pixels(3, size=(20, 30))
    [image] = jpeg.images(_rotated(arr, 6), "r.jpg", "jpeg", context)
    assert image.actions == ("exif_transpose",) and image.source_format == "jpeg"
    assert (image.height, image.width) == (30, 20)  # Orientation 6: a quarter turn.


def test_a_truncated_jpeg_is_corrupt(context):
    data = encode(pixels(4, size=(40, 40)), "JPEG")
    with pytest.raises(ImageRejected) as e:
        jpeg.images(data[: len(data) // 2], "t.jpg", "jpeg", context)
    assert e.value.reason == "corrupt" and e.value.message.startswith("t.jpg: ")


def test_a_header_over_max_pixels_is_too_large_before_decoding(context):
    data = encode(pixels(5, size=(400, 300)), "JPEG")
    with pytest.raises(ImageRejected) as e:
        jpeg.images(data, "big.jpg", "jpeg", context)
    assert e.value.reason == "too_large" and "400" in e.value.message


def test_a_large_jpeg_is_decoded_once_at_a_smaller_scale_and_resized():
    context = formats.Context(ValidationOptions(resize=ResizeOptions(max_side=16)))
    data = _rotated(pixels(6, size=(40, 64)), 6)
    [image] = jpeg.images(data, "big.jpg", "jpeg", context)
    assert max(image.height, image.width) == 16 and image.height > image.width  # Upright.
    assert image.actions == ("exif_transpose", "resize_max_side")
    assert image.details == {"original": [64, 40], "stored": [image.height, image.width]}


def test_only_plain_jpegs_are_batchable(context):
    plain = encode(pixels(7), "JPEG")
    image = jpeg.batchable(plain, context)
    assert image == jpeg.images(plain, "p.jpg", "jpeg", context)[0]
    assert jpeg.batchable(_rotated(pixels(7), 3), context) is None
    assert jpeg.batchable(encode(pixels(7, size=(400, 300)), "JPEG"), context) is None  # Too large.


def test_a_batch_decodes_together_unless_one_fails(context):
    good = [jpeg.batchable(encode(pixels(i), "JPEG"), context) for i in range(3)]
    assert jpeg.decode_together(good, context)
    whole = encode(pixels(9, size=(200, 200)), "JPEG", quality=95)
    broken = jpeg.batchable(whole[: len(whole) // 2], context)
    assert broken is not None  # The header alone looks fine.
    assert not jpeg.decode_together(good + [broken], context)


@pytest.mark.parametrize("process", ["12-bit JPEG", "lossless JPEG", "JPEG-LS image"])
def test_a_whole_jpeg_in_a_process_tf_cannot_decode_is_unsupported_not_damaged(context, process):
    """A 12-bit, lossless or JPEG-LS file (imagecodecs writes them) was rejected as 'corrupt',
    "its header is damaged": the user would look for damage in a whole file."""
    import imagecodecs

    grey = pixels(7, size=(16, 24), mode="L")
    data = {
        "12-bit JPEG": lambda: imagecodecs.jpeg8_encode(grey.astype(np.uint16) * 16, bitspersample=12),
        "lossless JPEG": lambda: imagecodecs.ljpeg_encode(grey),
        "JPEG-LS image": lambda: imagecodecs.jpegls_encode(grey),
    }[process]()
    with pytest.raises(ImageRejected) as e:
        jpeg.images(data, "x.jpg", "jpeg", context)
    assert e.value.reason == "unsupported_codec"
    assert e.value.message.startswith(f"x.jpg is a {process}, which TensorFlow's JPEG decoder does not read")
    # A damaged 8-bit JPEG is still corrupt.
    with pytest.raises(ImageRejected) as e:
        jpeg.images(encode(grey, "JPEG")[:200], "t.jpg", "jpeg", context)
    assert e.value.reason == "corrupt"
