"""Pillow's handler (imaging/formats/pillow.py): GIF, BMP, WebP and unsniffed formats as PNG."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tensorflow as tf
from helpers import encode, pixels
from PIL import Image

from imaging import ImageRejected, ValidationOptions, formats
from imaging.formats import pillow


@pytest.fixture(scope="module")
def context():
    return formats.Context(ValidationOptions())


@pytest.mark.parametrize("fmt, kwargs", [("BMP", {}), ("WEBP", {"lossless": True}), ("PPM", {})])
def test_lossless_formats_become_png_with_the_same_pixels(context, fmt, kwargs):
    arr = pixels(1, size=(12, 17))
    data = encode(arr, fmt, **kwargs)
    sniffed = formats.format_of(data)
    [image] = pillow.images(data, "x", sniffed, context)
    assert image.format == "png" and image.source_format == fmt.lower()
    assert image.actions == (f"reencode_{fmt.lower()}_to_png",)
    np.testing.assert_array_equal(tf.io.decode_png(image.data).numpy(), arr)


def test_an_animation_keeps_its_first_frame(context):
    frames = [Image.fromarray(np.full((8, 9, 3), v, np.uint8)) for v in (40, 200)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    [image] = pillow.images(buf.getvalue(), "a.gif", "gif", context)
    assert image.actions == ("reencode_gif_to_png", "first_frame")
    assert (tf.io.decode_png(image.data).numpy() == 40).all()


def test_unknown_bytes_are_not_an_image_and_a_damaged_header_is_corrupt(context):
    with pytest.raises(ImageRejected) as e:
        pillow.images(b"plain text, not a picture", "notes.jpg", None, context)
    assert e.value.reason == "not_an_image"
    with pytest.raises(ImageRejected) as e:
        pillow.images(b"GIF89a" + b"\xff" * 4, "bad.gif", "gif", context)
    assert e.value.reason == "corrupt" and "GIF" in e.value.message


def test_a_container_pillow_only_names_is_not_an_image_rather_than_corrupt(context):
    # nibabel's MINC2 test volume is a whole HDF5 file: Pillow's HDF5 stub recognises it and
    # raises "cannot find loader" on load, which is no damage to the file.
    from nibabel.testing import data_path

    with open(f"{data_path}/small.mnc", "rb") as f:
        minc2 = f.read()
    with pytest.raises(ImageRejected) as e:
        pillow.images(minc2, "brain.mnc", formats.format_of(minc2), context)
    assert e.value.reason == "not_an_image"
    assert "HDF5" in e.value.message and "no decoder" in e.value.message


def test_a_heic_or_jpeg_xl_photo_is_named_in_its_rejection(context):
    """"IMG_0001.HEIC is not in a known image format" left an iPhone user guessing."""
    import imagecodecs

    jxl = imagecodecs.jpegxl_encode(pixels(2, size=(8, 8)))
    # The ISO base media header of an iPhone photo (no HEIF writer is installed to make a whole one).
    heic = b"\0\0\0\x18ftypheic\0\0\0\0mif1heic" + b"\0" * 64
    for data, name, kind in ((jxl, "a.jxl", "JPEG XL image"), (heic, "IMG_0001.HEIC", "HEIF (HEIC) image")):
        with pytest.raises(ImageRejected) as e:
            pillow.images(data, name, formats.format_of(data), context)
        assert e.value.reason == "not_an_image"
        assert e.value.message == f"{name} is a {kind}, a format shardsmith does not read: convert it to JPEG or PNG first"


@pytest.mark.parametrize("orientation, turned", [(0, False), (9, False), (1, False), (6, True)])
def test_exif_transpose_is_listed_only_where_the_orientation_turns_the_image(context, orientation, turned):
    """Orientation 0 (some cameras write it) or 9 turns nothing, but was listed as 'exif_transpose'."""
    arr = pixels(3, size=(10, 20))
    exif = Image.Exif()
    exif[0x0112] = orientation
    [image] = pillow.images(encode(arr, "WEBP", lossless=True, exif=exif), "o.webp", "webp", context)
    assert ("exif_transpose" in image.actions) is turned
    decoded = tf.io.decode_png(image.data).numpy()
    np.testing.assert_array_equal(decoded, np.rot90(arr, -1) if turned else arr)


@pytest.mark.parametrize("driver, name, what, options", [
    ("VRT", "view.vrt", "GDAL virtual raster", {}), ("ENVI", "scene.hdr", "ENVI header", {}),
    ("HFA", "scene.img", "ERDAS Imagine", {}), ("netCDF", "scene.nc", "NetCDF", {"FORMAT": "NC"}),
    ("PCIDSK", "scene.pix", "PCIDSK", {})])
def test_a_raster_format_only_gdal_reads_is_named_with_how_to_convert_it(tmp_path, driver, name, what, options):
    # Written by GDAL itself: 'not in a known image format' alone does not tell a remote-sensing
    # user that the file is fine and one gdal_translate away from being read.
    rasterio = pytest.importorskip("rasterio")
    import rasterio.shutil
    from rasterio.transform import from_origin

    base = tmp_path / "base.tif"
    with rasterio.open(base, "w", driver="GTiff", width=8, height=6, count=2, dtype="uint16",
                       crs="EPSG:32633", transform=from_origin(300000, 5000000, 10, 10)) as dst:
        dst.write(np.arange(96, dtype=np.uint16).reshape(2, 6, 8))
    target = tmp_path / (name if driver != "ENVI" else "scene.img")
    rasterio.shutil.copy(base, target, driver=driver, **options)
    path = tmp_path / name
    with pytest.raises(ImageRejected) as e:
        formats.images(path.read_bytes(), name, formats.Context(ValidationOptions()))
    assert e.value.reason == "not_an_image"
    assert what in e.value.message and "gdal_translate -of GTiff" in e.value.message, e.value.message
