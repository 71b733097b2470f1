"""The JPEG 2000 handler (imaging/formats/jpeg2000.py): every value as GDAL reads it.

The files are written by GDAL's JP2OpenJPEG driver (rasterio), as Sentinel-2's bands and
orthophotos are, and by imagecodecs; what is stored is decoded back (raw bytes as `schemas`
says, PNG by TensorFlow) and compared with GDAL's own read through rasterio, the
independent reader. Pillow, the handler of JPEG 2000 before, stretched 15-bit samples onto
16 bits (every Sentinel-2 value doubled), read int16 as uint16, cut 16-bit RGB to 8 bits,
and failed on GDAL's RGB files.
"""

from __future__ import annotations

import pathlib

import imagecodecs
import numpy as np
import pytest
import rasterio
import tensorflow as tf
from helpers import convert, gdal_read, read_records, stored_values
from rasterio.transform import Affine

import schemas
from imaging import ImageRejected, ImageValidator, RasterOptions, ResizeOptions, sniff_format

_RNG = np.random.default_rng(2000)
_TRANSFORM = Affine(10.0, 0.0, 399960.0, 0.0, -10.0, 5800020.0)


def _gdal_jp2(path: pathlib.Path, array: np.ndarray, **options) -> bytes:
    """`array` (bands, height, width) as GDAL's JP2OpenJPEG driver writes it, losslessly."""
    bands, height, width = array.shape
    with rasterio.open(path, "w", driver="JP2OpenJPEG", height=height, width=width, count=bands,
                       dtype=array.dtype.name, crs="EPSG:32633", transform=_TRANSFORM,
                       QUALITY=100, REVERSIBLE="YES", **options) as dst:
        dst.write(array)
    return path.read_bytes()






def _u16(bands, bits=16, h=37, w=53):
    return _RNG.integers(0, 2 ** bits, (bands, h, w), dtype=np.uint16)


# name -> (array (bands, h, w), GDAL creation options, the stored format)
_GDAL_CASES = {
    # Sentinel-2's L1C/L2A bands: uint16 with 15-bit precision (GDAL: NBITS=15).
    "sentinel2_uint16_15bit": (_u16(1, 15), {"NBITS": 15}, "png"),
    "uint16_12bit": (_u16(1, 12), {"NBITS": 12}, "png"),
    "uint16_full": (_u16(1), {}, "png"),
    "int16_dem": (_RNG.integers(-400, 4000, (1, 37, 53), dtype=np.int16), {}, "raw-int16"),
    "uint16_rgb": (_u16(3), {}, "png"),
    "uint16_13_bands": (_u16(13, 15), {"NBITS": 15}, "raw-uint16"),
    "uint8_rgb": (_RNG.integers(0, 256, (3, 37, 53), dtype=np.uint8), {}, "png"),
    "uint8_2_bands": (_RNG.integers(0, 256, (2, 37, 53), dtype=np.uint8), {}, "raw-uint8"),
    "uint8_grey_codestream": (_RNG.integers(0, 256, (1, 37, 53), dtype=np.uint8), {"CODEC": "J2K"}, "png"),
}


@pytest.fixture(scope="module")
def validator():
    return ImageValidator()


@pytest.mark.parametrize("name", sorted(_GDAL_CASES))
def test_a_gdal_jpeg2000_is_stored_as_gdal_reads_it(validator, tmp_path, name):
    array, options, fmt = _GDAL_CASES[name]
    path = tmp_path / f"{name}.jp2"
    data = _gdal_jp2(path, array, **options)
    assert sniff_format(data[:132]) == "jpeg2000"
    [image] = validator.validate_all(data, path.name)
    gdal = gdal_read(path)
    assert image.format == fmt and image.source_format == "jpeg2000"
    stored = stored_values(image)
    assert stored.dtype == gdal.dtype and stored.shape == gdal.shape, (stored.shape, gdal.shape)
    np.testing.assert_array_equal(stored, gdal)
    np.testing.assert_array_equal(gdal, array.transpose(1, 2, 0))  # GDAL reads what was written.
    # Photos (8-bit grey or RGB) stay photos; every other JPEG 2000 is a raster, with statistics.
    photo = array.dtype == np.uint8 and array.shape[0] in (1, 3)
    assert (image.band_stats is None) == photo
    assert image.actions[0] == ("reencode_jpeg2000_to_png" if fmt == "png" else "store_jpeg2000_as_raw")


def test_raster_options_apply_to_jpeg2000_too(tmp_path):
    array = _u16(4, 15)
    data = _gdal_jp2(tmp_path / "b.jp2", array, NBITS=15)
    options = RasterOptions(bands=(4, 2), dtype="uint8", value_range=(0.0, 32767.0))
    [image] = ImageValidator(raster=options).validate_all(data, "b.jp2")
    expected = np.clip(np.rint(array[[3, 1]].astype(np.float64) * (255 / 32767.0)), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(stored_values(image), expected.transpose(1, 2, 0))
    assert "select_bands" in image.actions and "scale_to_uint8" in image.actions
    with pytest.raises(ImageRejected) as e:
        ImageValidator(raster=RasterOptions(bands=(5,))).validate_all(data, "b.jp2")
    assert e.value.reason == "missing_bands"


def test_max_side_resizes_a_jpeg2000_raster(tmp_path):
    data = _gdal_jp2(tmp_path / "c.jp2", _u16(1, 15, h=64, w=96), NBITS=15)
    [image] = ImageValidator(resize=ResizeOptions(max_side=48)).validate_all(data, "c.jp2")
    assert (image.height, image.width) == (32, 48) and "resize_max_side" in image.actions


def test_too_large_is_refused_from_the_header_before_decoding(tmp_path):
    data = _gdal_jp2(tmp_path / "d.jp2", _u16(3, h=40, w=50))
    with pytest.raises(ImageRejected) as e:
        ImageValidator(max_pixels=40 * 50 * 3 - 1).validate_all(data, "d.jp2")
    assert e.value.reason == "too_large" and "50x40 with 3 components" in e.value.message


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_a_truncated_jpeg2000_is_corrupt(tmp_path, cut):
    data = imagecodecs.jpeg2k_encode(_u16(1, 15)[0], level=0, codecformat="jp2", bitspersample=15)
    with pytest.raises(ImageRejected) as e:
        ImageValidator().validate_all(data[:int(len(data) * cut)], "t.jp2")
    assert e.value.reason == "corrupt", e.value


def test_a_damaged_size_marker_is_corrupt():
    data = bytearray(imagecodecs.jpeg2k_encode(_u16(1)[0], level=0, codecformat="j2k"))
    data[4:6] = (7).to_bytes(2, "big")  # Lsiz: no SIZ marker is 7 bytes long.
    with pytest.raises(ImageRejected) as e:
        ImageValidator().validate_all(bytes(data), "s.j2k")
    assert e.value.reason == "corrupt" and "JPEG 2000 header" in e.value.message


@pytest.mark.parametrize("transform", [_TRANSFORM, Affine(10.0, 2.0, 399960.0, 3.0, -10.0, 5800020.0),
                                       Affine(10.0, 0.0, 399960.0, 0.0, 10.0, 5800020.0)],
                         ids=["north_up", "rotated", "south_up"])
@pytest.mark.parametrize("bits", [8, 15])
def test_raster_georef_reads_the_geojp2_box_as_gdal_does(tmp_path, transform, bits):
    path = tmp_path / "g.jp2"
    array = _u16(1, bits) if bits > 8 else _RNG.integers(0, 256, (1, 37, 53), dtype=np.uint8)
    with rasterio.open(path, "w", driver="JP2OpenJPEG", height=37, width=53, count=1, dtype=array.dtype.name,
                       crs="EPSG:32633", transform=transform, QUALITY=100, REVERSIBLE="YES",
                       GMLJP2="NO", **({"NBITS": bits} if bits > 8 else {})) as dst:
        dst.write(array)
    with rasterio.open(path) as src:
        gdal = src.transform.to_gdal()
        epsg = src.crs.to_epsg()
    [image] = ImageValidator(raster=RasterOptions(georef=True)).validate_all(path.read_bytes(), "g.jp2")
    assert image.georef.epsg == epsg == 32633
    np.testing.assert_allclose(image.georef.geotransform, gdal, rtol=0, atol=1e-9)
    assert (image.georef.height, image.georef.width) == (37, 53)
    # --max_side scales the pixel size, as for a GeoTIFF.
    [small] = ImageValidator(raster=RasterOptions(georef=True), resize=ResizeOptions(max_side=26)).validate_all(
        path.read_bytes(), "g.jp2")
    assert "scale_geotransform" in small.actions
    assert small.georef.geotransform[1] == pytest.approx(gdal[1] * 53 / small.width)
    # Without the option, or without a GeoJP2 box: unknown.
    [plain] = ImageValidator().validate_all(path.read_bytes(), "g.jp2")
    assert plain.georef is None


def test_a_folder_of_sentinel2_bands_converts_with_their_values(tmp_path):
    root, out = tmp_path / "in", tmp_path / "out"
    expected = {}
    for k, cls in enumerate(("forest", "water")):
        (root / cls).mkdir(parents=True)
        path = root / cls / f"T31TFJ_20200514T103629_B0{k + 2}.jp2"
        _gdal_jp2(path, _u16(1, 15), NBITS=15)
        expected[f"{cls}/{path.name}"] = gdal_read(path)
    manifest = convert(root, out, "--min_shards", "1", "--num_shards", "1")
    assert manifest.split("train").num_records == 2
    for rec in read_records(out):
        got = tf.io.decode_png(rec[schemas.IMAGE.key], dtype=tf.uint16).numpy()
        np.testing.assert_array_equal(got, expected[rec[schemas.FILENAME.key].decode()])
    stats = manifest.split("train").band_stats
    assert stats is not None and stats.records == 2
    assert max(stats.max) < 2 ** 15  # 15-bit values, not stretched onto 16 bits.
