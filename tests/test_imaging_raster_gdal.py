"""Rasters as real writers write them: GDAL's GTiff and COG drivers, tifffile and Pillow.

Each layout is written in the test (small: 37x53), converted through the public
validator, and what is stored is decoded back (raw bytes as `schemas` says, PNG by
TensorFlow, as the reader does) and compared value for value, dtype exact, with
GDAL's own read of the file through rasterio (bands first, transposed to
height, width, bands): rasterio is the independent reader here, not tifffile,
which shardsmith reads with.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pathlib
import warnings

import numpy as np
import pytest
import rasterio  # The `test` extra installs it (setup.py).
import tensorflow as tf
import tifffile
from helpers import convert, gdal_read, read_records, stored_values, write
from PIL import Image
from rasterio.enums import Resampling
from rasterio.errors import NotGeoreferencedWarning, RasterioIOError
from rasterio.transform import Affine

import schemas
from imaging import ImageRejected, ImageValidator

_H, _W = 37, 53
_CRS = "EPSG:32633"
# A Sentinel-2 10 m grid: x0, y0 of the top-left corner, north up.
_TRANSFORM = Affine(10.0, 0.0, 399960.0, 0.0, -10.0, 5800020.0)


@dataclasses.dataclass(frozen=True)
class Layout:
    """One GeoTIFF as GDAL writes it.

    Attributes:
      dtype: GDAL data type, as rasterio names it.
      bands: Band count.
      options: Creation options of the driver (COMPRESS, TILED, NBITS, ...).
      driver: 'GTiff' or 'COG'.
      nodata: The nodata value written (None: none).
      mask: Write an internal mask (GDAL_TIFF_INTERNAL_MASK).
      overviews: Build internal overviews (GTiff) at these factors.
      scale_offset: Set band scales and offsets (GDAL metadata, values unchanged).
      values: 'random' over the type's range, 'smooth' (for lossy codecs),
        or 'bits:N' (N-bit values).
      reject: The reason the validator must give, or None when it stores it.
    """

    dtype: str = "uint16"
    bands: int = 1
    options: tuple = ()
    driver: str = "GTiff"
    nodata: float | None = None
    mask: bool = False
    overviews: tuple = ()
    scale_offset: bool = False
    values: str = "random"
    reject: str | None = None


def _layouts() -> dict[str, Layout]:
    L = Layout
    out: dict[str, Layout] = {}
    # Every GDAL data type rasterio writes: 1 band, striped, uncompressed.
    for dtype in ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "float64"):
        out[f"dtype_{dtype}"] = L(dtype)
    # 64-bit integers and complex samples: no raw record type holds them
    # (schemas.RAW_DTYPES; README: 'unsupported_dtype (complex, uint64)').
    for dtype in ("uint64", "int64", "complex64", "complex128", "complex_int16"):
        out[f"dtype_{dtype}"] = L(dtype, reject="unsupported_dtype")
    # Band counts and interleaving, striped and tiled.
    for dtype in ("uint8", "uint16", "float32"):
        for bands in (1, 3, 4, 13):
            for interleave in ("pixel", "band"):
                for tiled in (False, True):
                    opts = (("interleave", interleave),) + ((("tiled", True), ("blockxsize", 16),
                                                             ("blockysize", 16)) if tiled else ())
                    name = f"{dtype}_{bands}b_{interleave}_{'tiled' if tiled else 'striped'}"
                    out[name] = L(dtype, bands, opts)
    # Every compression GDAL's GTiff driver offers in this wheel, striped and tiled.
    lossless = ("lzw", "deflate", "zstd", "packbits", "lzma", "lerc", "lerc_deflate", "lerc_zstd")
    for codec in lossless:
        for dtype, bands in (("uint8", 3), ("uint16", 4), ("int16", 1), ("float32", 1), ("float64", 2)):
            out[f"{codec}_{dtype}_{bands}b"] = L(dtype, bands, (("compress", codec),))
            out[f"{codec}_{dtype}_{bands}b_tiled_band"] = L(
                dtype, bands, (("compress", codec), ("tiled", True), ("blockxsize", 16),
                               ("blockysize", 16), ("interleave", "band")))
    out["jpeg_ycbcr_rgb"] = L("uint8", 3, (("compress", "jpeg"), ("photometric", "ycbcr")),
                              values="smooth")
    out["jpeg_ycbcr_rgb_tiled"] = L("uint8", 3, (("compress", "jpeg"), ("photometric", "ycbcr"),
                                                 ("tiled", True), ("blockxsize", 16),
                                                 ("blockysize", 16)), values="smooth")
    out["jpeg_grey"] = L("uint8", 1, (("compress", "jpeg"),), values="smooth")
    out["jpeg_rgb_band_interleave"] = L("uint8", 3, (("compress", "jpeg"), ("interleave", "band")),
                                        values="smooth")
    # Band-interleaved JPEG that Pillow does not read (mask pages, a fourth band): tifffile's path.
    out["jpeg_rgb_band_interleave_mask"] = L("uint8", 3, (("compress", "jpeg"), ("interleave", "band")),
                                             mask=True, values="smooth")
    out["jpeg_4b_band_interleave_tiled"] = L("uint8", 4, (("compress", "jpeg"), ("interleave", "band"),
                                                          ("tiled", True), ("blockxsize", 16),
                                                          ("blockysize", 16)), values="smooth")
    out["jpeg_4b_pixel_interleave"] = L("uint8", 4, (("compress", "jpeg"),), values="smooth")
    out["webp_lossy_rgb"] = L("uint8", 3, (("compress", "webp"),), values="smooth")
    out["webp_lossless_rgba"] = L("uint8", 4, (("compress", "webp"), ("webp_lossless", True),
                                               ("photometric", "rgb"), ("alpha", "yes")))
    # JPEG-XL: GDAL's GTiff offers it when built with libjxl (skipped, saying so, where not).
    out["jxl_uint16_3b"] = L("uint16", 3, (("compress", "jxl"),))
    out["lerc_lossy_float32"] = L("float32", 1, (("compress", "lerc"), ("max_z_error", 0.01)),
                                  values="smooth")
    # Predictors: horizontal differencing (2) and floating point (3).
    for codec in ("lzw", "deflate", "zstd"):
        for dtype in ("uint8", "uint16", "int16", "uint32", "int32"):
            out[f"predictor2_{codec}_{dtype}"] = L(dtype, 3, (("compress", codec), ("predictor", 2)))
        for dtype in ("float32", "float64"):
            out[f"predictor3_{codec}_{dtype}"] = L(dtype, 1, (("compress", codec), ("predictor", 3)))
            out[f"predictor3_{codec}_{dtype}_tiled_4b"] = L(
                dtype, 4, (("compress", codec), ("predictor", 3), ("tiled", True),
                           ("blockxsize", 16), ("blockysize", 16)))
    # Packed samples (NBITS): sub-byte and 12/24-bit, where GDAL allows them.
    for bits, dtype in ((1, "uint8"), (2, "uint8"), (4, "uint8"), (12, "uint16"), (24, "uint32")):
        for bands in (1, 3):
            out[f"nbits{bits}_{bands}b"] = L(dtype, bands, (("nbits", bits),), values=f"bits:{bits}")
        out[f"nbits{bits}_tiled_deflate"] = L(dtype, 1, (("nbits", bits), ("compress", "deflate"),
                                                         ("tiled", True), ("blockxsize", 16),
                                                         ("blockysize", 16)), values=f"bits:{bits}")
    out["nbits12_band_interleave_3b"] = L("uint16", 3, (("nbits", 12), ("interleave", "band")),
                                          values="bits:12")
    out["nbits16_float32_half"] = L("float32", 1, (("nbits", 16),), values="smooth")
    # Extra samples: alpha and unspecified.
    out["rgba_uint8_alpha"] = L("uint8", 4, (("photometric", "rgb"), ("alpha", "yes")))
    out["rgbn_uint8_unspecified"] = L("uint8", 4, (("photometric", "rgb"), ("alpha", "unspecified")))
    out["rgbn_uint8_minisblack"] = L("uint8", 4, (("photometric", "minisblack"),))
    out["rgba_uint16_alpha_deflate"] = L("uint16", 4, (("photometric", "rgb"), ("alpha", "yes"),
                                                       ("compress", "deflate")))
    out["rgb_5b_unspecified_uint8"] = L("uint8", 5, (("photometric", "rgb"),))
    # Internal masks and overviews.
    out["mask_uint8_rgb"] = L("uint8", 3, mask=True)
    out["mask_uint16_1b_deflate"] = L("uint16", 1, (("compress", "deflate"),), mask=True)
    out["mask_uint8_rgb_jpeg_ycbcr"] = L("uint8", 3, (("compress", "jpeg"), ("photometric", "ycbcr")),
                                         mask=True, values="smooth")
    out["overviews_uint16_4b"] = L("uint16", 4, overviews=(2, 4))
    out["overviews_uint8_rgb"] = L("uint8", 3, overviews=(2, 4))
    out["overviews_and_mask_float32"] = L("float32", 1, (("tiled", True), ("blockxsize", 16),
                                                         ("blockysize", 16)),
                                          mask=True, overviews=(2,))
    # BigTIFF.
    out["bigtiff_uint16_13b"] = L("uint16", 13, (("bigtiff", "yes"),))
    out["bigtiff_float32_tiled_lzw"] = L("float32", 1, (("bigtiff", "yes"), ("tiled", True),
                                                        ("blockxsize", 16), ("blockysize", 16),
                                                        ("compress", "lzw")))
    # Nodata: a value, NaN, -3.4e38 (float32's lowest, common in DEMs).
    out["nodata_int16_minus9999"] = L("int16", 1, nodata=-9999)
    out["nodata_uint16_0_4b"] = L("uint16", 4, nodata=0)
    out["nodata_float32_nan"] = L("float32", 1, nodata=float("nan"))
    out["nodata_float64_nan_deflate"] = L("float64", 1, (("compress", "deflate"),), nodata=float("nan"))
    out["nodata_float32_minus3.4e38"] = L("float32", 1, nodata=-3.4e38)
    # Scale and offset (GDAL metadata; the stored values are the file's).
    out["scale_offset_uint16_3b"] = L("uint16", 3, scale_offset=True)
    # Cloud-Optimized GeoTIFFs: tiled, with overviews, masks, JPEG YCbCr.
    cog = (("blocksize", 16), ("overview_count", 2))
    for codec in ("none", "deflate", "lzw", "zstd", "lerc"):
        out[f"cog_{codec}_uint16_4b"] = L("uint16", 4, cog + (("compress", codec),), driver="COG")
    out["cog_deflate_predictor3_float32"] = L("float32", 1, cog + (("compress", "deflate"),
                                                                  ("predictor", "yes")), driver="COG")
    out["cog_deflate_float64_dem"] = L("float64", 1, cog + (("compress", "deflate"),), driver="COG",
                                       nodata=-9999.0)
    out["cog_jpeg_ycbcr_rgb"] = L("uint8", 3, cog + (("compress", "jpeg"),), driver="COG",
                                  values="smooth")
    out["cog_jpeg_ycbcr_rgb_mask"] = L("uint8", 3, cog + (("compress", "jpeg"),), driver="COG",
                                       mask=True, values="smooth")
    out["cog_deflate_rgb_mask"] = L("uint8", 3, cog + (("compress", "deflate"),), driver="COG",
                                    mask=True)
    out["cog_webp_rgb"] = L("uint8", 3, cog + (("compress", "webp"),), driver="COG", values="smooth")
    out["cog_deflate_rgba"] = L("uint8", 4, cog + (("compress", "deflate"),), driver="COG")
    out["cog_bigtiff_int16"] = L("int16", 1, cog + (("bigtiff", "yes"),), driver="COG")
    return out


_LAYOUTS = _layouts()
# Lossy codecs too compare exactly: GDAL's libjpeg 9 and imagecodecs' libjpeg-turbo
# (and both libwebps) decode these streams to the same values (measured: 0 of
# 5,883 samples differ on smooth images like these), so no tolerance is needed.


def _values(layout: Layout, rng: np.random.Generator) -> np.ndarray:
    """(bands, height, width) values for `layout`, as rasterio writes them."""
    shape = (layout.bands, _H, _W)
    dtype = np.dtype("complex64" if layout.dtype == "complex_int16" else layout.dtype)
    if layout.values.startswith("bits:"):
        return rng.integers(0, 2 ** int(layout.values[5:]), shape).astype(dtype)
    if layout.values == "smooth":
        y, x = np.mgrid[0:_H, 0:_W]
        # A gentle ramp, as of land cover: lossy codecs keep it close (no sharp edges).
        base = np.stack([x * 2 + y + 30 * b + 10 for b in range(layout.bands)])
        return base.astype(dtype)
    if dtype.kind == "c":
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype)
    if dtype.kind == "f":
        values = rng.normal(100, 50, shape).astype(dtype)
        if layout.nodata is not None:
            values[:, :3, :5] = layout.nodata  # Some nodata pixels (NaN included).
        return values
    info = np.iinfo(dtype)
    values = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if layout.nodata is not None:
        values[:, :3, :5] = layout.nodata
    return values


def _write_geotiff(path: pathlib.Path, layout: Layout, seed: int) -> None:
    values = _values(layout, np.random.default_rng(seed))
    profile = dict(driver=layout.driver, width=_W, height=_H, count=layout.bands,
                   dtype=layout.dtype, crs=_CRS, transform=_TRANSFORM, **dict(layout.options))
    if layout.nodata is not None:
        profile["nodata"] = layout.nodata
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=True), warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        try:
            dst = rasterio.open(path, "w", **profile)
        except RasterioIOError as e:
            if "missing codec" in str(e):  # The one case skipped: this GDAL build cannot write it.
                pytest.skip(f"GDAL {rasterio.__gdal_version__} in rasterio's wheel lacks this codec: {e}")
            raise
        with dst:
            dst.write(values)
            if layout.scale_offset:
                dst.scales = tuple(0.0001 * (b + 1) for b in range(layout.bands))
                dst.offsets = tuple(-0.1 * b for b in range(layout.bands))
            if layout.mask:
                mask = np.full((_H, _W), 255, np.uint8)
                mask[:4, :] = 0  # A nodata strip along the top, as at a scene's edge.
                dst.write_mask(mask)
            if layout.overviews:
                dst.build_overviews(list(layout.overviews), Resampling.nearest)






def _expected_dtype(gdal: np.ndarray) -> np.dtype:
    # int8 is widened to int16 without loss (raw records hold no int8).
    return np.dtype("int16") if gdal.dtype == np.int8 else gdal.dtype


def _assert_same(stored: np.ndarray, gdal: np.ndarray) -> None:
    assert stored.shape == gdal.shape, (stored.shape, gdal.shape)
    assert stored.dtype == _expected_dtype(gdal), (stored.dtype, gdal.dtype)
    np.testing.assert_array_equal(stored, gdal.astype(stored.dtype))  # NaN == NaN here


@pytest.fixture(scope="module")
def validator():
    return ImageValidator()


@pytest.mark.parametrize("name", sorted(_LAYOUTS))
def test_a_gdal_layout_is_stored_as_gdal_reads_it(validator, tmp_path, name):
    layout = _LAYOUTS[name]
    path = tmp_path / f"{name}.tif"
    _write_geotiff(path, layout, seed=sorted(_LAYOUTS).index(name))
    data = path.read_bytes()
    if layout.reject:
        with pytest.raises(ImageRejected) as info:
            validator.validate_all(data, path.name)
        assert info.value.reason == layout.reject, info.value
        return
    gdal = gdal_read(path)
    images = validator.validate_all(data, path.name)
    # Masks and overviews are neither bands nor records.
    assert len(images) == 1, [(i.height, i.width, i.channels) for i in images]
    [image] = images
    _assert_same(stored_values(image), gdal)
    # 8-bit grey and RGB GeoTIFFs stay on Pillow's path (the same bytes), without band statistics.
    assert image.band_stats is None or image.band_stats.num_bands == layout.bands


# Files other writers make: (writer keyword arguments, array as written).
def _other_writers() -> dict[str, tuple]:
    rng = np.random.default_rng(22)
    dem64 = rng.uniform(-125, 2950, (_H, _W))
    rgba = rng.integers(0, 256, (_H, _W, 4), dtype=np.uint8)
    u16 = rng.integers(0, 65536, (_H, _W, 3), dtype=np.uint16)
    f32 = rng.normal(size=(_H, _W)).astype(np.float32)
    grey = rng.integers(0, 256, (_H, _W), dtype=np.uint8)
    return {
        "tifffile_float64_dem": ("tifffile", dem64, {}),
        "tifffile_float64_predictor3": ("tifffile", dem64, dict(compression="zlib", predictor=3)),
        "tifffile_float32_predictor3_tiled": ("tifffile", f32, dict(compression="zstd", predictor=3,
                                                                     tile=(16, 16))),
        "tifffile_rgba_uint8": ("tifffile", rgba, dict(photometric="rgb", extrasamples=[2])),
        "tifffile_rgbn_uint8_lzw": ("tifffile", rgba, dict(photometric="rgb", extrasamples=[0],
                                                           compression="lzw")),
        "tifffile_uint16_lerc": ("tifffile", u16, dict(photometric="rgb", compression="lerc")),
        "tifffile_uint8_webp": ("tifffile", rgba[:, :, :3], dict(photometric="rgb",
                                                                  compression="webp",
                                                                  compressionargs={"level": 100,
                                                                                   "lossless": True})),
        "pillow_rgba": ("pillow", rgba, {}),
        "pillow_rgba_deflate": ("pillow", rgba, dict(compression="tiff_adobe_deflate")),
        "pillow_uint16_grey": ("pillow", u16[:, :, 0], {}),
        "pillow_float32": ("pillow", f32, {}),
        "pillow_grey_lzw": ("pillow", grey, dict(compression="tiff_lzw")),
        "pillow_rgb_packbits": ("pillow", rgba[:, :, :3], dict(compression="packbits")),
    }


_OTHER = _other_writers()


@pytest.mark.parametrize("name", sorted(_OTHER))
def test_other_writers_files_are_stored_as_gdal_reads_them(validator, tmp_path, name):
    writer, array, kwargs = _OTHER[name]
    buf = io.BytesIO()
    if writer == "tifffile":
        tifffile.imwrite(buf, array, **kwargs)
    else:
        Image.fromarray(array).save(buf, "TIFF", **kwargs)
    path = write(tmp_path / f"{name}.tif", buf.getvalue())
    [image] = validator.validate_all(buf.getvalue(), path.name)
    gdal = gdal_read(path)
    _assert_same(stored_values(image), gdal)


def _patch_compression(data: bytes, code: int) -> bytes:
    """A little-endian classic TIFF with its first IFD's Compression tag set to `code`."""
    ifd = int.from_bytes(data[4:8], "little")
    count = int.from_bytes(data[ifd:ifd + 2], "little")
    out = bytearray(data)
    for k in range(count):
        entry = ifd + 2 + 12 * k
        if int.from_bytes(data[entry:entry + 2], "little") == 259:
            out[entry + 8:entry + 10] = code.to_bytes(2, "little")
            return bytes(out)
    raise AssertionError("no Compression tag")


@pytest.mark.parametrize("code, label", [(6, "old-style JPEG"), (34676, "SGILog (LogLuv)"),
                                         (34677, "SGILog24 (LogLuv)")])
@pytest.mark.parametrize("dtype", ["uint8", "uint16"])
def test_a_compression_without_a_decoder_is_unsupported_not_corrupt(validator, code, label, dtype):
    array = np.zeros((_H, _W, 3), dtype)
    buf = io.BytesIO()
    tifffile.imwrite(buf, array, photometric="rgb")
    with pytest.raises(ImageRejected) as info:
        validator.validate_all(_patch_compression(buf.getvalue(), code), "x.tif")
    assert info.value.reason == "unsupported_compression", info.value
    assert str(code) in info.value.message or label.split()[0].lower() in info.value.message.lower()


def test_a_folder_of_geotiffs_converts_end_to_end(tmp_path):
    """One-band GeoTIFFs of several writers' layouts, through the Beam converter."""
    root, out = tmp_path / "in", tmp_path / "out"
    cases = {"dem/a.tif": "dtype_float64", "dem/b.tif": "cog_deflate_float64_dem",
             "dem/c.tif": "predictor3_deflate_float64", "dem/d.tif": "nodata_float32_nan",
             "scene/a.tif": "nbits12_1b", "scene/b.tif": "mask_uint16_1b_deflate",
             "scene/c.tif": "nbits1_tiled_deflate"}
    expected = {}
    for i, (rel, name) in enumerate(sorted(cases.items())):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_geotiff(path, _LAYOUTS[name], seed=100 + i)
        expected[rel] = gdal_read(path)
    manifest = convert(root, out, "--min_shards", "1", "--num_shards", "1")
    assert (out / schemas.MANIFEST_FILENAME).is_file()
    assert manifest.split("train").num_records == len(cases)
    assert not (out / schemas.REJECTS_FILENAME).exists() or not (out / schemas.REJECTS_FILENAME).read_text()
    records = read_records(out)
    assert sorted(rec[schemas.FILENAME.key].decode() for rec in records) == sorted(cases)
    for rec in records:
        rel = rec[schemas.FILENAME.key].decode()
        shape = (rec[schemas.HEIGHT.key], rec[schemas.WIDTH.key], rec[schemas.CHANNELS.key])
        dtype = schemas.parse_raw_format(rec[schemas.FORMAT.key].decode())
        if dtype is not None:
            got = np.frombuffer(rec[schemas.IMAGE.key], np.dtype(dtype).newbyteorder("<")).reshape(shape)
        else:
            got = tf.io.decode_png(rec[schemas.IMAGE.key], dtype=tf.as_dtype(expected[rel].dtype)).numpy()
        _assert_same(got, expected[rel])
    # Every record is a one-band raster: the split has band statistics, NaN counted as nodata.
    stats = manifest.split("train").band_stats
    assert stats is not None and stats.records == len(cases)
    nans = int(np.isnan(expected["dem/d.tif"]).sum())
    assert nans and stats.nodata[0] >= nans
    written = json.loads((out / schemas.MANIFEST_FILENAME).read_text())["splits"]["train"]
    assert written["band_stats"]["nodata_count"] == list(stats.nodata)


@pytest.mark.parametrize("orientation", [3, 6, 8])
@pytest.mark.parametrize("dtype,bands", [("uint16", 1), ("uint16", 3), ("float32", 2), ("uint8", 4)])
def test_rasters_ignore_the_tiff_orientation_tag_as_gdal_does_and_8_bit_photos_honour_it(
        tmp_path, orientation, dtype, bands):
    """GDAL reads a TIFF's pixels in stored order whatever its Orientation tag (274) says, and its
    geotransform refers to that order: rasters keep it (docs/preparing/rasters.md, Orientation)."""
    array = np.arange(4 * 6 * bands).reshape(4, 6, bands).astype(dtype)
    path = tmp_path / "o.tif"
    layout = {"planarconfig": "contig"} if bands > 1 else {}
    tifffile.imwrite(path, array if bands > 1 else array[:, :, 0], photometric="minisblack",
                     extratags=[(274, 3, 1, orientation, True)], **layout)
    (image,) = ImageValidator().validate_all(path.read_bytes(), "o.tif")
    assert np.array_equal(gdal_read(path), array)
    assert np.array_equal(stored_values(image), array) and "exif_transpose" not in image.actions
    # An 8-bit grey photo TIFF (Pillow's path) is turned upright, as image viewers show it.
    photo = tmp_path / "photo.tif"
    tifffile.imwrite(photo, array[:, :, 0].astype(np.uint8), extratags=[(274, 3, 1, orientation, True)])
    (upright,) = ImageValidator().validate_all(photo.read_bytes(), "photo.tif")
    assert "exif_transpose" in upright.actions
    assert stored_values(upright).shape[:2] == ((6, 4) if orientation in (6, 8) else (4, 6))
