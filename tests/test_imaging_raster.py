"""TIFF rasters: every band, every bit, read back exactly from the records."""

from __future__ import annotations

import io
import json
from fractions import Fraction

import numpy as np
import pytest
import tensorflow as tf
import tifffile
from helpers import convert, read_records, stored_values, write

import schemas
from beam_jobs import verify
from imaging import raster
from imaging import ImageRejected, ImageValidator, RasterOptions, ValidationOptions

_RNG = np.random.default_rng(16)


def _tiff(array, **kwargs) -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, array, **kwargs)
    return buf.getvalue()


def _u16(*shape):
    return _RNG.integers(0, 65536, shape, dtype=np.uint16)


def _dem():
    return _RNG.uniform(-125, 295, (64, 64)).astype(np.float32)


# name -> (array as stored (h, w, bands), tiff bytes, expected format)
def _layouts():
    rgbn = _u16(64, 64, 4)
    s2 = _u16(64, 64, 13)
    planar = _u16(3, 32, 48)
    rgb16 = _u16(40, 30, 3)
    dem = _dem()
    i16 = _RNG.integers(-32768, 32768, (33, 17), dtype=np.int16)
    tiled = _u16(100, 90, 5)
    u32 = _RNG.integers(0, 2**32, (16, 16, 2), dtype=np.uint32)
    i32 = _RNG.integers(-2**31, 2**31, (16, 16), dtype=np.int32)
    f64 = _RNG.normal(size=(16, 16, 3))
    return {
        "rgbn_uint16": (rgbn, _tiff(rgbn, photometric="rgb", extrasamples=[0]), "png"),
        "sentinel2_13_bands": (s2, _tiff(s2, photometric="minisblack", planarconfig="contig"),
                               "raw-uint16"),
        "planar_rgb_uint16": (planar.transpose(1, 2, 0),
                              _tiff(planar, photometric="rgb", planarconfig="separate"), "png"),
        "interleaved_rgb_uint16": (rgb16, _tiff(rgb16, photometric="rgb"), "png"),
        "dem_float32": (dem[:, :, None], _tiff(dem), "raw-float32"),
        "int16": (i16[:, :, None], _tiff(i16), "raw-int16"),
        "tiled_5_bands": (tiled, _tiff(tiled, photometric="minisblack", planarconfig="contig",
                                      tile=(32, 32)), "raw-uint16"),
        "lzw": (s2, _tiff(s2, photometric="minisblack", planarconfig="contig", compression="lzw"),
                "raw-uint16"),
        "deflate": (dem[:, :, None], _tiff(dem, compression="zlib", predictor=True), "raw-float32"),
        "zstd_planar": (tiled, _tiff(tiled.transpose(2, 0, 1), photometric="minisblack",
                                     planarconfig="separate", compression="zstd"), "raw-uint16"),
        "bigtiff": (s2, _tiff(s2, photometric="minisblack", planarconfig="contig", bigtiff=True),
                    "raw-uint16"),
        "uint32_2_bands": (u32, _tiff(u32, photometric="minisblack", planarconfig="contig"),
                           "raw-uint32"),
        "int32": (i32[:, :, None], _tiff(i32), "raw-int32"),
        "float64_3_bands": (f64, _tiff(f64, photometric="minisblack", planarconfig="contig"),
                            "raw-float64"),
        "grey_uint16": (rgb16[:, :, :1], _tiff(rgb16[:, :, 0]), "png"),
    }


_LAYOUTS = _layouts()




@pytest.fixture(scope="module")
def validator():
    return ImageValidator()


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_every_layout_is_stored_without_changing_a_value(validator, layout):
    expected, data, fmt = _LAYOUTS[layout]
    [image] = validator.validate_all(data, f"{layout}.tif")
    assert image.format == fmt
    got = stored_values(image)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    assert image.band_stats.num_bands == expected.shape[2]
    np.testing.assert_allclose(image.band_stats.mean, expected.reshape(-1, expected.shape[2]).mean(0))


def test_validate_takes_a_raster_too(validator):
    expected, data, _ = _LAYOUTS["dem_float32"]
    image = validator.validate(data, "dem.tif")
    np.testing.assert_array_equal(stored_values(image), expected)
    assert image.actions == ("store_tiff_as_raw",)


def test_an_8_bit_rgb_tiff_keeps_pillows_bytes_whichever_path_reads_it(validator):
    rgb = _RNG.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    pillow = validator.validate_all(_tiff(rgb, photometric="rgb"), "a.tif")[0]
    # zstd: Pillow cannot decode it, so tifffile reads it.
    raster = validator.validate_all(_tiff(rgb, photometric="rgb", compression="zstd"), "b.tif")[0]
    assert pillow.band_stats is None and raster.band_stats is not None
    assert pillow.data == raster.data
    np.testing.assert_array_equal(stored_values(raster), rgb)


def test_every_page_with_pages_all_and_the_first_by_default():
    stack = _u16(3, 16, 16)
    data = _tiff(stack, photometric="minisblack")  # three pages
    first = ImageValidator().validate_all(data, "z.tif")
    assert len(first) == 1 and first[0].page is None
    np.testing.assert_array_equal(stored_values(first[0])[:, :, 0], stack[0])
    pages = ImageValidator(raster=RasterOptions(pages="all")).validate_all(data, "z.tif")
    assert [p.page for p in pages] == [0, 1, 2]
    for page, want in zip(pages, stack):
        np.testing.assert_array_equal(stored_values(page)[:, :, 0], want)


def test_bands_are_selected_in_order_and_the_change_listed():
    s2, data, _ = _LAYOUTS["sentinel2_13_bands"]
    [image] = ImageValidator(raster=RasterOptions(bands=(4, 3, 2, 8))).validate_all(data, "s2.tif")
    np.testing.assert_array_equal(stored_values(image), s2[:, :, [3, 2, 1, 7]])
    assert "select_bands" in image.actions and image.details["bands"] == [4, 3, 2, 8]
    with pytest.raises(ImageRejected) as e:
        ImageValidator(raster=RasterOptions(bands=(14,))).validate_all(data, "s2.tif")
    assert e.value.reason == "missing_bands" and "13 bands" in e.value.message


def test_scaling_to_uint8_is_opt_in_and_stated():
    dem, data, _ = _LAYOUTS["dem_float32"]
    options = RasterOptions(dtype="uint8", value_range=(-125.0, 295.0))
    [image] = ImageValidator(raster=options).validate_all(data, "dem.tif")
    want = np.clip(np.rint((dem.astype(np.float64) + 125) * (255 / 420)), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(stored_values(image), want)
    assert "scale_to_uint8" in image.actions
    assert image.details["scaling"]["from"] == [-125.0, 295.0]
    with pytest.raises(ImageRejected, match="--raster_range"):
        ImageValidator(raster=RasterOptions(dtype="uint8")).validate_all(data, "dem.tif")


def test_nodata_is_recorded_counted_and_left_out_of_the_statistics(validator):
    dem = _dem()
    dem[:4] = -9999
    dem[4, 0] = np.nan
    data = _tiff(dem, extratags=[(42113, "s", 0, "-9999", True)])
    [image] = validator.validate_all(data, "dem.tif")
    assert image.details["nodata"] == -9999
    valid = dem[4:].ravel()
    valid = valid[~np.isnan(valid)]
    stats = image.band_stats
    assert stats.nodata == (4 * 64 + 1,) and stats.count == (valid.size,)
    assert stats.min[0] == float(valid.min()) and stats.max[0] == float(valid.max())
    np.testing.assert_allclose(stats.std[0], valid.astype(np.float64).std(), rtol=1e-9)


@pytest.mark.parametrize("case", ["truncated", "broken_zstd", "broken_zlib", "broken_lzw", "too_large", "complex", "uint64"])
def test_bad_rasters_are_rejected_naming_what_was_found(case):
    s2 = _u16(64, 64, 13)
    max_pixels = ValidationOptions().max_pixels
    if case == "truncated":
        data, reason = _tiff(s2, photometric="minisblack", planarconfig="contig")[:30_000], "corrupt"
    elif case.startswith("broken_"):
        data = bytearray(_tiff(s2, photometric="minisblack", planarconfig="contig",
                               compression=case.removeprefix("broken_"), rowsperstrip=16))
        start = tifffile.TiffFile(io.BytesIO(bytes(data))).pages.first.dataoffsets[1]
        data[start:start + 8] = b"\xff" * 8  # the second strip's stream header
        data, reason = bytes(data), "corrupt"
    elif case == "too_large":
        # 64 * 64 * 13 = 53,248 samples: above 50,000 though 64 * 64 pixels are not.
        data, reason, max_pixels = _tiff(s2, photometric="minisblack", planarconfig="contig"), "too_large", 50_000
    elif case == "complex":
        data, reason = _tiff(np.zeros((8, 8), np.complex64)), "unsupported_dtype"
    else:
        data, reason = _tiff(np.zeros((8, 8), np.uint64)), "unsupported_dtype"
    with pytest.raises(ImageRejected) as e:
        ImageValidator(max_pixels=max_pixels).validate_all(data, "bad.tif")
    assert e.value.reason == reason, e.value.message
    assert reason in schemas.REJECT_REASONS
    if case == "too_large":
        assert "13 bands" in e.value.message and "53,248" in e.value.message
    if case in ("complex", "uint64"):
        assert ("complex64" if case == "complex" else "uint64") in e.value.message


@pytest.mark.parametrize("bits", [(8805, 8250, 13403), (12, 0, 272)])
def test_samples_of_sizes_no_sample_has_are_corrupt_not_an_unsupported_type(bits):
    """Found by bench.mutations_convert (issue 39): BitsPerSample's offset moved onto other bytes
    gave (8805, 8250, 13403) bits, and was called unsupported_dtype."""
    data = bytearray(_tiff(np.zeros((4, 4, 3), np.uint8), photometric="rgb"))
    tag = tifffile.TiffFile(io.BytesIO(bytes(data))).pages.first.tags["BitsPerSample"]
    data[tag.valueoffset:tag.valueoffset + 6] = np.array(bits, "<u2").tobytes()
    with pytest.raises(ImageRejected) as e:
        ImageValidator().validate_all(bytes(data), "bad.tif")
    assert e.value.reason == "corrupt", e.value.message
    assert f"{', '.join(map(str, bits))} bits per sample" in e.value.message


@pytest.mark.parametrize("kwargs, flag", [
    (dict(pages="every"), "--raster_pages"), (dict(bands=(0, 1)), "--raster_bands"),
    (dict(dtype="int8"), "--raster_dtype"), (dict(dtype="uint8", value_range=(5, 1)), "--raster_range"),
    (dict(value_range=(0, 1)), "--raster_dtype"),
])
def test_options_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        RasterOptions(**kwargs)


def test_band_stats_merge_like_one_pass():
    a, b = _u16(8, 8, 2), _u16(5, 8, 2)
    from imaging.raster import band_stats
    merged = band_stats(a, None).merge(band_stats(b, None))
    both = np.concatenate([a.reshape(-1, 2), b.reshape(-1, 2)]).astype(np.float64)
    np.testing.assert_allclose(merged.mean, both.mean(0), rtol=1e-12)
    np.testing.assert_allclose(merged.std, both.std(0), rtol=1e-12)
    assert merged.records == 2 and merged.count == (both.shape[0],) * 2
    assert schemas.BandStats.from_json(json.loads(json.dumps(merged.to_json()))) == merged


def test_conversion_round_trip_through_the_beam_runner(tmp_path):
    root, out = tmp_path / "in", tmp_path / "out"
    arrays = {}
    for i in range(4):
        for cls in ("forest", "water"):
            s2 = _u16(64, 64, 13)
            arrays[f"{cls}/{i}.tif"] = s2
            write(root / cls / f"{i}.tif", _tiff(s2, photometric="minisblack", planarconfig="contig",
                                                 compression="zstd" if i % 2 else None))
    manifest = convert(root, out, "--num_shards", "2", "--min_shards", "1")
    records = read_records(out)
    assert len(records) == 8
    for rec in records:
        name = rec[schemas.FILENAME.key].decode()
        assert rec[schemas.FORMAT.key] == b"raw-uint16"
        shape = (rec[schemas.HEIGHT.key], rec[schemas.WIDTH.key], rec[schemas.CHANNELS.key])
        got = np.frombuffer(rec[schemas.IMAGE.key], "<u2").reshape(shape)
        np.testing.assert_array_equal(got, arrays[name])
    split = manifest.split("train")
    stats = split.band_stats
    every = np.stack(list(arrays.values())).reshape(-1, 13).astype(np.float64)
    np.testing.assert_allclose(stats.mean, every.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.std, every.std(0), rtol=1e-12)
    assert stats.min == tuple(every.min(0)) and stats.max == tuple(every.max(0))
    stored = json.loads((out / schemas.MANIFEST_FILENAME).read_text())["splits"]["train"]["band_stats"]
    assert set(stored) == {"records", "count", "min", "max", "mean", "std", "nodata_count"}
    normalized = [json.loads(line) for line in (out / schemas.NORMALIZED_FILENAME).read_text().splitlines()]
    assert {tuple(n["actions"]) for n in normalized} == {("store_tiff_as_raw",)}
    assert manifest.normalized == {"store_tiff_as_raw": 8}
    report = verify.run(["--dataset_dir", str(out)])
    assert report["ok"], report


def test_pages_all_records_are_named_by_page_and_verify(tmp_path):
    root, out = tmp_path / "in", tmp_path / "out"
    stack = _RNG.normal(size=(3, 8, 8)).astype(np.float32)
    write(root / "a" / "stack.tif", _tiff(stack, photometric="minisblack"))
    manifest = convert(root, out, "--raster_pages", "all", "--num_shards", "1")
    records = sorted(read_records(out), key=lambda r: r[schemas.FILENAME.key])
    assert [r[schemas.FILENAME.key] for r in records] == [b"a/stack.tif#page=0", b"a/stack.tif#page=1",
                                                         b"a/stack.tif#page=2"]
    for rec, want in zip(records, stack):
        np.testing.assert_array_equal(np.frombuffer(rec[schemas.IMAGE.key], "<f4").reshape(8, 8), want)
    assert manifest.options["raster"]["pages"] == "all"
    assert verify.run(["--dataset_dir", str(out)])["ok"]


def test_max_side_caps_rasters_too_keeping_dtype_and_bands():
    from imaging import ResizeOptions

    s2 = _u16(80, 40, 13)
    contig = dict(photometric="minisblack", planarconfig="contig")
    [image] = ImageValidator(resize=ResizeOptions(max_side=20)).validate_all(_tiff(s2, **contig), "s2.tif")
    stored = stored_values(image)
    assert stored.shape == (20, 10, 13) and stored.dtype == np.uint16
    assert image.format == schemas.raw_format("uint16")
    assert image.actions[-1] == "resize_max_side"
    assert image.details["original"] == [80, 40] and image.details["stored"] == [20, 10]
    # A band's mean survives an antialiased downscale (no aliasing, no band mix-up).
    np.testing.assert_allclose(stored.mean(axis=(0, 1)), s2.mean(axis=(0, 1)), rtol=0.05)
    small = _u16(16, 8, 13)
    [kept] = ImageValidator(resize=ResizeOptions(max_side=20)).validate_all(_tiff(small, **contig), "s.tif")
    np.testing.assert_array_equal(stored_values(kept), small)
    assert "resize_max_side" not in kept.actions


# --- Georeferencing (--raster_georef) ------------------------------------------------------------

_CONTIG = dict(photometric="minisblack", planarconfig="contig")
_UTM_ORIGIN = (500000.123, 5000000.5)


def _geokeys(*entries):
    """A GeoKeyDirectoryTag: version 1.1.0, then (key, location 0, count 1, value) per entry."""
    values = [1, 1, 0, len(entries)]
    for key, value in entries:
        values += [key, 0, 1, value]
    return (34735, "H", len(values), values, True)


def _geotiff(array, *, epsg=32633, raster_type=1, transform=None, scale=(10.0, 10.0),
             tiepoint=(0.0, 0.0, 0.0, *_UTM_ORIGIN, 0.0), key=3072, **kwargs) -> bytes:
    """A GeoTIFF written by tifffile, with its GeoTIFF tags as `extratags`."""
    tags = [_geokeys((1024, 1), (1025, raster_type), (key, epsg))]
    if transform is not None:
        tags.append((34264, "d", 16, transform, True))
    else:
        tags += [(33550, "d", 3, (*scale, 0.0), True), (33922, "d", len(tiepoint), tiepoint, True)]
    return _tiff(array, extratags=tags, **kwargs)


def test_georef_is_read_from_pixel_scale_and_tiepoint_exactly():
    from imaging.georef import read_georef

    [g] = read_georef(_geotiff(_u16(6, 8, 4), **_CONTIG), "a.tif")
    assert g.epsg == 32633 and (g.height, g.width) == (6, 8)
    assert g.geotransform == (500000.123, 10.0, 0.0, 5000000.5, 0.0, -10.0)
    # A tiepoint at pixel (2, 3): the origin moves back to the corner of pixel (0, 0).
    [g] = read_georef(_geotiff(_u16(6, 8), tiepoint=(2.0, 3.0, 0.0, 100.0, 200.0, 0.0),
                               scale=(0.5, 0.25), key=2048, epsg=4326), "b.tif")
    assert g.epsg == 4326 and g.geotransform == (99.0, 0.5, 0.0, 200.75, 0.0, -0.25)


def test_georef_from_model_transformation_and_pixel_is_point_as_gdal_reports_them():
    from imaging.georef import read_georef

    matrix = (2.0, 0.5, 0.0, 1000.0, 0.25, -3.0, 0.0, 2000.0, 0, 0, 0, 0, 0, 0, 0, 1.0)
    [g] = read_georef(_geotiff(_u16(4, 4), transform=matrix), "t.tif")
    assert g.geotransform == (1000.0, 2.0, 0.5, 2000.0, 0.25, -3.0)
    # PixelIsPoint: the tiepoint is a pixel's centre, GDAL's origin its corner (half a pixel off).
    [g] = read_georef(_geotiff(_u16(4, 4), raster_type=2, tiepoint=(0, 0, 0, 100.0, 200.0, 0)), "p.tif")
    assert g.geotransform == (95.0, 10.0, 0.0, 205.0, 0.0, -10.0)


@pytest.mark.parametrize("tiepoint", [(0.0, 0.0, 0.0, *_UTM_ORIGIN, 0.0), (2.0, 3.0, 0.0, *_UTM_ORIGIN, 0.0)],
                         ids=["at_the_corner", "at_pixel_2_3"])
def test_a_negative_pixel_scale_y_is_read_north_up_as_gdal_reads_it(tmp_path, tiepoint):
    # Some writers store the geotransform's negative dy as ModelPixelScale's Y. GDAL ignores
    # that sign by default (GTIFF_HONOUR_NEGATIVE_SCALEY=NO), so every GIS shows the image
    # north up; the stored geotransform must be the one they show, not a mirror image.
    import rasterio

    from imaging.georef import read_georef

    data = _geotiff(_u16(6, 8), scale=(10.0, -10.0), tiepoint=tiepoint)
    [g] = read_georef(data, "n.tif")
    path = write(tmp_path / "n.tif", data)
    with rasterio.open(path) as src:
        gdal = src.transform.to_gdal()
    assert g.geotransform == gdal
    assert g.geotransform[5] == -10.0


def test_no_or_user_defined_georef_is_unknown_not_rejected():
    from imaging.georef import read_georef

    [plain] = read_georef(_tiff(_u16(4, 4)), "plain.tif")
    assert plain.epsg == 0 and plain.geotransform is None
    [user] = read_georef(_geotiff(_u16(4, 4), epsg=32767), "user.tif")
    assert user.epsg == 0 and user.geotransform is not None
    gcps = (0, 0, 0, 1.0, 2.0, 0, 3, 3, 0, 4.0, 5.0, 0)
    [ground] = read_georef(_geotiff(_u16(4, 4), tiepoint=gcps), "gcp.tif")
    assert ground.geotransform is None and ground.epsg == 32633
    bad = _tiff(_u16(4, 4), extratags=[(34735, "H", 4, [1, 1, 0, 5], True)])
    with pytest.raises(ImageRejected, match="GeoKeyDirectoryTag") as e:
        read_georef(bad, "bad.tif")
    assert e.value.reason == "corrupt"


def test_validator_attaches_georef_only_when_asked_and_keeps_the_stored_bytes():
    on = ImageValidator(raster=RasterOptions(georef=True))
    for array, kwargs in ((_u16(6, 8, 13), _CONTIG), (_RNG.integers(0, 256, (6, 8, 3), np.uint8), {})):
        data = _geotiff(array, **kwargs)
        [plain] = ImageValidator().validate_all(data, "g.tif")
        [geo] = on.validate_all(data, "g.tif")
        assert plain.georef is None
        assert geo.georef.epsg == 32633 and geo.georef.geotransform[0] == _UTM_ORIGIN[0]
        # The flag reads tags only: the same bytes, format and actions (Pillow keeps its 8-bit TIFFs).
        assert (geo.data, geo.format, geo.actions) == (plain.data, plain.format, plain.actions)
    png = ImageValidator(raster=RasterOptions(georef=True)).validate_all(
        _tiff(_u16(4, 4)), "plain.tif")[0]
    assert png.georef.epsg == 0 and png.georef.geotransform is None


def test_a_resize_scales_the_pixel_size_and_lists_it():
    from imaging import ResizeOptions

    data = _geotiff(_u16(80, 40, 5), **_CONTIG)
    [image] = ImageValidator(raster=RasterOptions(georef=True),
                             resize=ResizeOptions(max_side=20)).validate_all(data, "big.tif")
    assert (image.height, image.width) == (20, 10)
    assert image.georef.geotransform == (500000.123, 40.0, 0.0, 5000000.5, 0.0, -40.0)
    assert "scale_geotransform" in image.actions
    assert image.details["source_geotransform"] == [500000.123, 10.0, 0.0, 5000000.5, 0.0, -10.0]


def test_every_page_gets_its_own_georef():
    buf = io.BytesIO()
    with tifffile.TiffWriter(buf) as w:
        for x0 in (100.0, 900.0):
            w.write(_u16(4, 4, 5), extratags=[_geokeys((3072, 32633)), (33550, "d", 3, (1.0, 1.0, 0.0), True),
                                              (33922, "d", 6, (0, 0, 0, x0, 50.0, 0), True)], **_CONTIG)
    images = ImageValidator(raster=RasterOptions(georef=True, pages="all")).validate_all(buf.getvalue(), "p.tif")
    assert [i.georef.geotransform[0] for i in images] == [100.0, 900.0]


def test_band_stats_of_all_bands_at_once_match_the_per_band_sums():
    """The all-bands float path (no nodata) gives the per-band loop's numbers, bit for bit."""
    rng = np.random.default_rng(7)
    for dtype, shape in (("float32", (7, 3, 4)), ("float64", (33, 17, 2)), ("uint32", (4, 4, 13))):
        if np.dtype(dtype).kind == "f":
            a = (rng.standard_normal(shape) * 1e5).astype(dtype)
        else:  # Near 2^32: beyond the exact integer sums, so the float path answers.
            a = rng.integers(2**32 - 1000, 2**32 - 1, shape, dtype=dtype, endpoint=True)
        stats = raster.band_stats(a, None)
        for b in range(shape[2]):
            values = a[:, :, b].astype(np.float64).ravel()
            mean = float(values.mean())
            assert stats.count[b] == values.size and stats.nodata[b] == 0
            assert (stats.min[b], stats.max[b]) == (float(values.min()), float(values.max()))
            assert stats.mean[b] == mean, (dtype, b)
            assert stats.m2[b] == float(np.square(values - mean).sum()), (dtype, b)


def test_band_stats_never_write_into_the_array_they_are_given():
    """One float64 band is already a contiguous float64 row: the statistics must work on a copy."""
    dem = np.random.default_rng(8).uniform(-125, 2950, (37, 53, 1))
    kept = dem.copy()
    stats = raster.band_stats(dem, None)
    np.testing.assert_array_equal(dem, kept)
    assert stats.mean[0] == float(kept.mean())
    dem.flags.writeable = False  # As tifffile hands back a view of the file's bytes.
    assert raster.band_stats(dem, None) == stats


def _exact_band_stats(a: np.ndarray, nodata=None):
    """Per band (count, min, max, mean, m2, nodata count) of integer samples, in Python integers:
    mean and m2 the correctly rounded floats of the exact fractions."""
    out = []
    for b in range(a.shape[2]):
        values = [int(v) for v in a[:, :, b].ravel().tolist()]
        valid = [v for v in values if nodata is None or v != nodata]
        n = len(valid)
        s, q = sum(valid), sum(v * v for v in valid)
        out.append((n, float(min(valid)), float(max(valid)), float(Fraction(s, n)),
                    float(Fraction(n * q - s * s, n)), len(values) - n))
    return out


def _generated_integer_arrays():
    """(label, array) of integer samples, the edge cases of `band_stats`'s exact sums."""
    rng = np.random.default_rng(11)
    yield "all equal", np.full((9, 7, 3), 1234, np.uint16)
    yield "all 65535", np.full((64, 64, 13), 65535, np.uint16)
    yield "zeros", np.zeros((3, 5, 2), np.uint16)
    yield "one pixel", np.array([[[7, 65535]]], np.uint16)
    for i in range(40):
        h, w = int(rng.integers(1, 80)), int(rng.integers(1, 80))
        bands = (1, 2, 3, 4, 13)[i % 5]
        dtype = ("uint8", "uint16", "int16", "int32", "uint32")[i // 8 % 5]
        info = np.iinfo(dtype)
        low, high = (info.min, info.max) if i % 2 else (max(info.min, -3000), min(info.max, 3000))
        yield f"{dtype} {h}x{w}x{bands}", rng.integers(low, high, (h, w, bands), dtype=dtype, endpoint=True)
    yield "int16 negatives", rng.integers(-32768, -1, (50, 40, 4), dtype=np.int16, endpoint=True)
    yield "uint16 full range, 1 band", rng.integers(0, 65535, (64, 64, 1), dtype=np.uint16, endpoint=True)
    # n * max^2 above 2^53 (int64 sums), below and above 2^63 (the float path).
    yield "uint16 above 2^53", rng.integers(60000, 65535, (1500, 1500, 1), dtype=np.uint16, endpoint=True)
    yield "uint32 ~2^24", rng.integers(0, 2**24, (64, 64, 3), dtype=np.uint32, endpoint=True)
    yield "int32 ~-2^24", rng.integers(-2**24, 0, (64, 64, 2), dtype=np.int32, endpoint=True)


def test_band_stats_of_integers_are_the_exact_values_correctly_rounded():
    """Integer samples: every statistic is the float nearest its exact value (Python integers, Fraction)."""
    checked = 0
    for label, a in _generated_integer_arrays():
        h, w, bands = a.shape
        largest = int(np.abs(a.astype(np.int64)).max())
        if h * w * largest * largest >= 2**63:
            continue  # Beyond exact int64 sums: the float path (the test above).
        stats = raster.band_stats(a, None)
        got = list(zip(stats.count, stats.min, stats.max, stats.mean, stats.m2, stats.nodata))
        assert got == _exact_band_stats(a), label
        checked += 1
    assert checked >= 40


def test_band_stats_of_integers_with_nodata():
    """A nodata value among integer samples is left out, as NaN and nodata always were; absent, it changes nothing."""
    rng = np.random.default_rng(3)
    a = rng.integers(1, 1000, (20, 30, 4), dtype=np.uint16)
    a[3, 4, :] = 0
    a[:, :, 2] = 0  # A band of nodata only.
    stats = raster.band_stats(a, 0.0)
    want = raster.band_stats(a.astype(np.float32), 0.0)  # The float path: NaN and nodata handling.
    assert stats == want
    assert stats.nodata[2] == 600 and stats.min[2] is None and stats.count[0] == 599
    assert raster.band_stats(a + 1, 0.0) == raster.band_stats(a + 1, None)
    assert raster.band_stats(a + 1, 0.0).mean == tuple(v[3] for v in _exact_band_stats(a + 1))

def test_band_statistics_and_16_bit_png_hold_little_beside_the_raster():
    # A 16-bit scene stored whole: its statistics widened every sample to 8 bytes at once
    # (four times the scene), and its PNG made a big-endian copy beside the filtered rows.
    import tracemalloc

    # 12 MB of a smooth 16-bit scene with noise in its low bits, as sensors give.
    ramp = (np.arange(1500, dtype=np.uint16)[:, None, None] * 7 + np.arange(1400, dtype=np.uint16)[None, :, None] * 11
            + np.array([0, 900, 1800], np.uint16))
    array = ramp + _RNG.integers(0, 16, (1500, 1400, 3), dtype=np.uint16)
    tracemalloc.start()
    try:
        stats = raster.band_stats(array, None)
        stats_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        png = raster.png_bytes(array)
        png_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stats_peak < array.nbytes, stats_peak / array.nbytes  # Was four times.
    # The filtered rows (the scene's size) and a block: not two more copies beside them.
    assert png_peak < array.nbytes * 1.3 + 3 * len(png), (png_peak / array.nbytes, len(png) / array.nbytes)
    tf_values = tf.io.decode_png(png, dtype=tf.uint16).numpy()
    np.testing.assert_array_equal(tf_values, array)
    values = array.reshape(-1, 3).astype(np.float64)
    assert stats.mean == tuple(float(m) for m in (np.sum(array.reshape(-1, 3).astype(np.int64), axis=0) / values.shape[0]))
    assert stats.min == tuple(float(v) for v in values.min(axis=0))
