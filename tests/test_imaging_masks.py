"""imaging.masks: class ids read exactly from real mask files, aligned with their images, encoded."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tifffile
from PIL import Image

from imaging import ImageRejected
from imaging import masks


def _png(arr: np.ndarray, mode: str | None = None, palette=None) -> bytes:
    im = Image.fromarray(arr, mode) if mode else Image.fromarray(arr)
    if palette is not None:
        im.putpalette(palette)
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def _tiff(arr: np.ndarray, **kwargs) -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, arr, **kwargs)
    return buf.getvalue()


def _voc_ids(h=24, w=32, seed=0) -> np.ndarray:
    """VOC-like ids: classes 0..20 inside, 255 on the border."""
    ids = np.random.default_rng(seed).integers(0, 21, (h, w)).astype(np.uint8)
    ids[0, :] = ids[-1, :] = ids[:, 0] = ids[:, -1] = 255
    return ids


# VOC's colour map: id i is drawn in a colour, never its value.
_VOC_PALETTE = [c for i in range(256) for c in ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)]


def test_palette_png_gives_its_indices_not_its_colours():
    ids = _voc_ids()
    data = _png(ids, "P", _VOC_PALETTE)
    assert Image.open(io.BytesIO(data)).mode == "P"
    got = masks.read_mask(data, "m.png")
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, ids)
    assert masks.mask_bit_depth(data[:64]) == 8


def test_16_bit_png_keeps_ids_above_255():
    ids = np.arange(24 * 32, dtype=np.uint16).reshape(24, 32) * 50
    data = _png(ids)  # Pillow writes uint16 as a 16-bit greyscale PNG.
    assert data[24] == 16
    got = masks.read_mask(data, "m.png")
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, ids)
    assert masks.mask_bit_depth(data[:64]) == 16


def test_grey_rgb_mask_is_one_channel_and_colour_mask_is_rejected():
    ids = _voc_ids()
    grey = np.repeat(ids[..., None], 3, axis=2)
    np.testing.assert_array_equal(masks.read_mask(_png(grey), "grey.png"), ids)
    rgba = np.concatenate([grey, np.full(ids.shape + (1,), 255, np.uint8)], axis=2)
    np.testing.assert_array_equal(masks.read_mask(_png(rgba), "grey_rgba.png"), ids)
    colour = grey.copy()
    colour[3, 4] = (10, 20, 30)
    with pytest.raises(ImageRejected) as e:
        masks.read_mask(_png(colour), "colour.png")
    assert e.value.reason == "mask_not_class_ids"
    see_through = rgba.copy()
    see_through[0, 0, 3] = 0
    with pytest.raises(ImageRejected) as e:
        masks.read_mask(_png(see_through), "alpha.png")
    assert e.value.reason == "mask_not_class_ids"


def test_jpeg_mask_is_lossy_and_garbage_unreadable():
    buf = io.BytesIO()
    Image.fromarray(_voc_ids()).save(buf, "JPEG")
    with pytest.raises(ImageRejected) as e:
        masks.read_mask(buf.getvalue(), "m.jpg")
    assert e.value.reason == "mask_lossy"
    for data in (b"not an image at all", b"", b"\x89PNG\r\n\x1a\n" + b"\0" * 40):
        with pytest.raises(ImageRejected) as e:
            masks.read_mask(data, "m.png")
        assert e.value.reason == "mask_unreadable"


def test_bmp_and_gif_masks():
    ids = _voc_ids()
    for fmt in ("BMP", "GIF"):
        im = Image.fromarray(ids, "P")
        im.putpalette(_VOC_PALETTE)
        buf = io.BytesIO()
        # Unoptimised: Pillow's GIF writer otherwise renumbers the palette it uses.
        im.save(buf, fmt, optimize=False)
        np.testing.assert_array_equal(masks.read_mask(buf.getvalue(), f"m.{fmt.lower()}"), ids)


@pytest.mark.parametrize("dtype,bits,stored", [
    (np.uint8, 8, np.uint8), (np.uint16, 16, np.uint16), (np.uint32, 32, np.uint16),
    (np.int16, 16, np.uint16), (np.int32, 32, np.uint16), (np.float32, 32, np.uint16),
])
def test_tiff_masks(dtype, bits, stored):
    ids = _voc_ids().astype(dtype)
    if np.dtype(dtype).itemsize > 1:
        ids[5, 5] = 1000  # Above 255: kept.
    data = _tiff(ids)
    assert masks.mask_bit_depth(data[:65536]) == bits
    got = masks.read_mask(data, "m.tif")
    assert got.dtype == stored
    np.testing.assert_array_equal(got, ids.astype(np.int64))


def test_tiff_mask_of_one_band_and_bigtiff():
    ids = _voc_ids()
    np.testing.assert_array_equal(masks.read_mask(_tiff(ids[..., None], photometric="minisblack"), "m.tif"), ids)
    big = _tiff(ids.astype(np.uint16), bigtiff=True)
    assert masks.mask_bit_depth(big) == 16
    np.testing.assert_array_equal(masks.read_mask(big, "m.tif"), ids)


@pytest.mark.parametrize("arr,why", [
    (np.full((4, 4), 0.5, np.float32), "whole numbers"),
    (np.full((4, 4), -1, np.int16), "negative"),
    (np.full((4, 4), 70000, np.uint32), "65535"),
])
def test_tiff_values_that_are_no_class_ids(arr, why):
    with pytest.raises(ImageRejected) as e:
        masks.read_mask(_tiff(arr), "m.tif")
    assert e.value.reason == "mask_not_class_ids"
    assert why in e.value.message


def test_align_upright_mask_is_kept_and_raw_frame_mask_turned():
    ids = _voc_ids(20, 30)
    # An image stored upright as 30x20 (h, w) from a raw 20x30 frame with orientation 6.
    frame = masks.MaskFrame(upright=(30, 20), stored=(30, 20), orientation=6)
    aligned = masks.align_mask(ids, frame, "a.jpg")
    assert aligned.actions == ("mask_exif_transpose",)
    # Orientation 6: the raw frame turned 90 degrees clockwise (Pillow's transpose).
    expected = np.asarray(Image.fromarray(ids).transpose(Image.Transpose.ROTATE_270))
    np.testing.assert_array_equal(aligned.ids, expected)
    upright = masks.align_mask(expected, frame, "a.jpg")
    assert upright.actions == ()
    np.testing.assert_array_equal(upright.ids, expected)


def test_square_photo_mask_is_taken_as_drawn_on_the_raw_frame():
    ids = _voc_ids(16, 16)
    aligned = masks.align_mask(ids, masks.MaskFrame((16, 16), (16, 16), orientation=8), "sq.jpg")
    assert aligned.actions == ("mask_exif_transpose",)
    np.testing.assert_array_equal(aligned.ids, np.asarray(Image.fromarray(ids).transpose(Image.Transpose.ROTATE_90)))


def test_size_mismatch_names_both_sizes():
    with pytest.raises(ImageRejected) as e:
        masks.align_mask(np.zeros((10, 12), np.uint8), masks.MaskFrame((30, 20), (30, 20), 6), "a.jpg")
    assert e.value.reason == "mask_size_mismatch"
    assert "12x10" in e.value.message and "20x30" in e.value.message and "30x20" in e.value.message


def test_resize_is_nearest_neighbour():
    ids = _voc_ids(24, 32)
    aligned = masks.align_mask(ids, masks.MaskFrame((24, 32), (12, 16)), "a.png")
    assert aligned.actions == ("mask_resized",)
    assert aligned.ids.shape == (12, 16)
    assert set(np.unique(aligned.ids)) <= set(np.unique(ids))
    # Halving: every output pixel is one of its 2x2 source block's.
    for r in range(12):
        for c in range(16):
            assert aligned.ids[r, c] in ids[2 * r:2 * r + 2, 2 * c:2 * c + 2]


def test_encoded_masks_decode_to_the_same_ids_in_tensorflow():
    import tensorflow as tf

    ids8 = _voc_ids()
    png8 = masks.encode_mask(ids8, "uint8")
    np.testing.assert_array_equal(tf.io.decode_png(png8, dtype=tf.uint8).numpy()[..., 0], ids8)
    # An 8-bit mask in a 16-bit dataset: the same ids, never scaled by 257.
    png16 = masks.encode_mask(ids8, "uint16")
    assert png16[24] == 16
    np.testing.assert_array_equal(tf.io.decode_png(png16, dtype=tf.uint16).numpy()[..., 0], ids8)
    deep = np.arange(24 * 32, dtype=np.uint16).reshape(24, 32) * 80
    np.testing.assert_array_equal(
        tf.io.decode_png(masks.encode_mask(deep, "uint16"), dtype=tf.uint16).numpy()[..., 0], deep)
    assert masks.encode_mask(ids8, "uint8") == png8  # Same ids, same bytes.
    with pytest.raises(ValueError, match="uint8"):
        masks.encode_mask(deep, "uint8")


def test_pixel_counts_are_bincounts():
    ids = _voc_ids()
    counts = masks.pixel_counts(ids)
    values, n = np.unique(ids, return_counts=True)
    assert {int(v): int(c) for v, c in zip(values, n)} == {i: int(c) for i, c in enumerate(counts) if c}


def test_grey_pngs_of_the_datasets_depth_are_stored_as_they_are_and_decode_exactly():
    import tensorflow as tf

    ids = np.random.default_rng(3).integers(0, 21, (30, 40)).astype(np.uint8)
    grey = io.BytesIO()
    Image.fromarray(ids).save(grey, "PNG")  # Mode "L": greyscale, 8-bit
    grey = grey.getvalue()
    assert masks.storable_as_is(grey, "uint8")
    np.testing.assert_array_equal(tf.io.decode_png(grey, channels=1, dtype=tf.uint8).numpy()[..., 0], ids)
    # In a dataset of 16-bit masks it is encoded again, at 16 bits with the same ids.
    assert not masks.storable_as_is(grey, "uint16")
    palette = Image.fromarray(ids, "P")
    palette.putpalette([v for i in range(256) for v in (i * 7 % 256, i * 13 % 256, i * 29 % 256)])
    buf = io.BytesIO()
    palette.save(buf, "PNG")
    # A palette PNG decodes to colours in TensorFlow: never stored as it is.
    assert not masks.storable_as_is(buf.getvalue(), "uint8")
    deep = io.BytesIO()
    Image.fromarray(ids.astype(np.uint16) * 300).save(deep, "PNG")
    assert masks.storable_as_is(deep.getvalue(), "uint16") and not masks.storable_as_is(deep.getvalue(), "uint8")
    assert not masks.storable_as_is(b"not a png at all, just bytes", "uint8")


@pytest.mark.parametrize("drawn, shape, want", [("upright", (20, 30), "20x30 (upright"),
                                                ("raw", (30, 20), "30x20 (raw")])
def test_a_mask_of_the_other_frame_than_annotations_frame_says_is_refused_naming_it(drawn, shape, want):
    # A photo on its side (EXIF 6): raw 30 wide x 20 high, 20 x 30 upright.
    frame = masks.MaskFrame(upright=(30, 20), stored=(30, 20), orientation=6)
    with pytest.raises(ImageRejected) as e:
        masks.align_mask(np.ones(shape, np.uint8), frame, "a/p.jpg", drawn)
    assert e.value.reason == "mask_size_mismatch"
    assert want in e.value.message and f"--annotations_frame {drawn}" in e.value.message
    # The size the flag names is taken, turned only when drawn on the raw frame.
    ok = masks.align_mask(np.ones(frame.raw if drawn == "raw" else frame.upright, np.uint8), frame, "a/p.jpg", drawn)
    assert ok.ids.shape == (30, 20)
    assert ("mask_exif_transpose" in ok.actions) is (drawn == "raw")
