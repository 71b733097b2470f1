"""Locations of dated passes written by GDAL (rasterio), stacked by imaging/time_series.py, and
every value and date compared with rasterio's own read."""

import datetime

import numpy as np
import pytest

import schemas
from imaging import time_series as ts
from imaging.patches import PatchOptions
from helpers import write_geotiff

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402


def _values(seed, bands=3, height=12, width=10, dtype="uint16"):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 30000, size=(bands, height, width)).astype(dtype)


def _files(folder):
    # The rasters, as the listing gives them (GDAL's sidecars, scene.tif.msk, are no passes).
    return [(p.relative_to(folder.parent).as_posix(), str(p)) for p in sorted(folder.iterdir())
            if ts.is_raster_name(p.name)]


def _rasterio_stack(paths_per_date, bands_per_file=None):
    """(time, height, width, bands) as rasterio reads it: each date's files, band by band."""
    dates = []
    for paths in paths_per_date:
        planes = []
        for path in paths:
            with rasterio.open(path) as src:
                planes.append(src.read())  # (bands, h, w)
        stacked = np.concatenate(planes, axis=0)
        if bands_per_file is not None:
            stacked = stacked[list(bands_per_file)]
        dates.append(np.transpose(stacked, (1, 2, 0)))
    return np.stack(dates)


def test_name_dates_and_band_suffixes():
    assert ts.name_date("2020-05-14.tif") == datetime.date(2020, 5, 14)
    assert ts.name_date("S2B_MSIL2A_20200514T103629_N0214_R008_T31TFJ_20200514T124004.tif") == \
        datetime.date(2020, 5, 14)
    assert ts.name_date("LC08_L2SP_198030_20200601_20200820_02_T1_SR_B4.TIF") == datetime.date(2020, 6, 1)
    assert ts.name_date("field_20190102.tif") == datetime.date(2019, 1, 2)
    assert ts.name_date("orbit_12345678.tif") is None  # 1234-56-78 is no date
    assert ts.name_date("tile_0001.tif") is None
    assert ts.name_date("scene_123456789.tif") is None  # nine digits: not a date
    assert ts.band_of("x_B02.tif") == "B02"
    assert ts.band_of("x_B4.TIF") == "B4"
    assert ts.band_of("x_b8a.tif") == "B8A"
    assert ts.band_of("x.B11.tif") == "B11"
    assert ts.band_of("LC08_L2SP_198030_20200601_20200820_02_T1_SR_B4.TIF") == "SR_B4"
    assert ts.band_of("2020-05-14.tif") is None
    assert sorted(["B11", "B8A", "B2", "B10", "B8", "B1"], key=ts.natural_key) == \
        ["B1", "B2", "B8", "B8A", "B10", "B11"]


def test_one_multiband_file_per_date_in_date_order(tmp_path):
    loc = tmp_path / "wheat" / "field_1"
    names = ["S2B_MSIL2A_20200714T103629_N0214_R008_T31TFJ_20200714T124004.tif",
             "S2A_MSIL2A_20200514T103629_N0214_R008_T31TFJ_20200901T124004.tif",
             "S2A_MSIL2A_20200604T103629_N0214_R008_T31TFJ_20200604T124004.tif"]
    for i, name in enumerate(names):
        write_geotiff(loc / name, _values(i, bands=4), crs="EPSG:32631")
    plan = ts.plan_location("wheat/field_1", _files(loc), ts.TimeSeriesOptions())
    assert plan.rejected is None and plan.outcomes == ()
    assert [d.date for d in plan.dates] == ["2020-05-14", "2020-06-04", "2020-07-14"]
    assert [d.days for d in plan.dates] == [
        (datetime.date(2020, 5, 14) - datetime.date(1970, 1, 1)).days,
        (datetime.date(2020, 6, 4) - datetime.date(1970, 1, 1)).days,
        (datetime.date(2020, 7, 14) - datetime.date(1970, 1, 1)).days]
    assert plan.bands == ("1", "2", "3", "4") and plan.epsg == 32631
    with rasterio.open(loc / names[1]) as src:
        assert plan.geotransform == tuple(src.transform.to_gdal())
    stack = ts.read_stack(plan)
    expected = _rasterio_stack([[loc / names[1]], [loc / names[2]], [loc / names[0]]])
    assert stack.dtype == np.uint16 and stack.shape == (3, 12, 10, 4)
    np.testing.assert_array_equal(stack, expected)
    # --bands picks and orders the bands of multi-band files by GDAL number.
    plan = ts.plan_location("wheat/field_1", _files(loc), ts.TimeSeriesOptions(bands=("4", "1")))
    np.testing.assert_array_equal(ts.read_stack(plan), expected[..., [3, 0]])


def test_one_file_per_band_and_date_landsat_names(tmp_path):
    loc = tmp_path / "tile"
    paths = {}
    for d, date in enumerate(["20200601", "20200517"]):
        for b, band in enumerate(["SR_B5", "SR_B4", "SR_B10"]):
            name = f"LC08_L2SP_198030_{date}_20200820_02_T1_{band}.TIF"
            paths[date, band] = write_geotiff(loc / name, _values(10 * d + b, bands=1))
    plan = ts.plan_location("tile", _files(loc), ts.TimeSeriesOptions())
    assert plan.bands == ("SR_B4", "SR_B5", "SR_B10")  # natural order
    assert [d.date for d in plan.dates] == ["2020-05-17", "2020-06-01"]
    expected = _rasterio_stack([[paths["20200517", b] for b in plan.bands],
                                [paths["20200601", b] for b in plan.bands]])
    np.testing.assert_array_equal(ts.read_stack(plan), expected)
    # --bands orders them (and leaves the others out, noted).
    plan = ts.plan_location("tile", _files(loc), ts.TimeSeriesOptions(bands=("SR_B10", "SR_B4")))
    assert plan.bands == ("SR_B10", "SR_B4")
    np.testing.assert_array_equal(ts.read_stack(plan), expected[..., [2, 0]])
    assert sorted((o.reason, o.rel_path.rsplit("_", 1)[-1]) for o in plan.outcomes) == [
        ("band_not_selected", "B5.TIF"), ("band_not_selected", "B5.TIF")]


def test_a_landsat_collection_2_download_with_its_qa_and_st_layers_stacks_the_bands_asked_for(tmp_path):
    # What USGS delivers per scene, in one folder: the SR and ST bands and the product's other
    # layers. Those were whole-date files beside band files: every date conflicting_dates.
    loc = tmp_path / "tile"
    paths = {}
    layers = {"SR_B2": ("uint16", 0), "SR_B3": ("uint16", 0), "SR_B4": ("uint16", 0), "ST_B10": ("uint16", 0),
              "QA_PIXEL": ("uint16", 1), "QA_RADSAT": ("uint16", None), "ST_ATRAN": ("int16", -9999),
              "ST_QA": ("int16", -9999), "SR_QA_AEROSOL": ("uint8", 1)}
    for d, (date, processed) in enumerate([("20200514", "20200820"), ("20200530", "20200907")]):
        for k, (layer, (dtype, nodata)) in enumerate(layers.items()):
            name = f"LC08_L2SP_198030_{date}_{processed}_02_T1_{layer}.TIF"
            paths[date, layer] = write_geotiff(loc / name, _values(10 * d + k, bands=1, dtype=dtype), nodata=nodata)
    assert {ts.band_of(p.name) for p in paths.values()} == set(layers)
    plan = ts.plan_location("tile", _files(loc), ts.TimeSeriesOptions(bands=("SR_B4", "SR_B3", "SR_B2")))
    assert [d.date for d in plan.dates] == ["2020-05-14", "2020-05-30"] and plan.nodata == 0
    assert {o.reason for o in plan.outcomes} == {"band_not_selected"} and len(plan.outcomes) == 2 * 6
    np.testing.assert_array_equal(ts.read_stack(plan), _rasterio_stack(
        [[paths[date, b] for b in plan.bands] for date in ("20200514", "20200530")]))
    # Bands of one dtype with nodata values of their own (QA_PIXEL fills with 1): a stack.
    plan = ts.plan_location("tile", _files(loc), ts.TimeSeriesOptions(bands=("SR_B4", "QA_PIXEL")))
    assert len(plan.dates) == 2
    # Every layer: several dtypes, said band by band, with what to do.
    plan = ts.plan_location("tile", _files(loc), ts.TimeSeriesOptions())
    assert plan.rejected[0] == "mixed_dtypes"
    assert "uint8: SR_QA_AEROSOL" in plan.rejected[1] and "--bands" in plan.rejected[1]


def test_sentinel_2_l2a_layer_names_with_their_resolution_are_bands():
    assert ts.band_of("T31TFJ_20200514T103629_B02_10m.tif") == "B02"
    assert ts.band_of("T31TFJ_20200514T103629_B8A_20m.tif") == "B8A"
    assert ts.band_of("T31TFJ_20200514T103629_SCL_20m.tif") == "SCL"
    assert ts.band_of("S2A_31TFJ_20200514_0_L2A_AOT.tif") == "AOT"
    assert ts.band_of("T31TFJ_20200514T103629_TCI_60m.tif") == "TCI"
    assert ts.band_of("2020-05-14_10m.tif") is None and ts.band_of("field_PIXEL.tif") is None


def test_sentinel_2_band_suffixes_of_every_spelling_are_ordered_by_bands(tmp_path):
    loc = tmp_path / "tile"
    names = {"B02": "{d}_B02.tif", "B4": "{d}_B4.tif", "B8A": "{d}_b8a.tif", "B11": "{d}.B11.tif"}
    paths = {(d, band): write_geotiff(loc / name.format(d=d), _values(10 * i + k, bands=1))
             for i, d in enumerate(("2020-06-01", "2020-05-02")) for k, (band, name) in enumerate(names.items())}
    plan = ts.plan_location("tile", _files(loc), ts.TimeSeriesOptions())
    assert plan.bands == ("B02", "B4", "B8A", "B11")  # natural order
    by_date = [[paths[d, b] for b in plan.bands] for d in ("2020-05-02", "2020-06-01")]
    np.testing.assert_array_equal(ts.read_stack(plan), _rasterio_stack(by_date))
    plan = ts.plan_location("tile", _files(loc), ts.TimeSeriesOptions(bands=("B8A", "B11", "B02", "B4")))
    assert plan.bands == ("B8A", "B11", "B02", "B4") and plan.outcomes == ()
    by_date = [[paths[d, b] for b in plan.bands] for d in ("2020-05-02", "2020-06-01")]
    np.testing.assert_array_equal(ts.read_stack(plan), _rasterio_stack(by_date))


def test_dates_only_in_the_tiff_tag(tmp_path):
    loc = tmp_path / "loc"
    for name, stamp, seed in (("pass_a.tif", "2021:03:09 10:00:00", 0), ("pass_b.tif", "2021:01:30 10:00:00", 1)):
        path = write_geotiff(loc / name, _values(seed))
        with rasterio.open(path, "r+") as dst:
            dst.update_tags(TIFFTAG_DATETIME=stamp)
    with rasterio.open(loc / "pass_a.tif") as src:
        assert src.tags()["TIFFTAG_DATETIME"] == "2021:03:09 10:00:00"  # GDAL wrote the tag
    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions())
    assert [d.date for d in plan.dates] == ["2021-01-30", "2021-03-09"]
    np.testing.assert_array_equal(ts.read_stack(plan), _rasterio_stack([[loc / "pass_b.tif"], [loc / "pass_a.tif"]]))


def test_shifted_and_reprojected_dates_are_left_out_saying_what_differs(tmp_path):
    loc = tmp_path / "loc"
    write_geotiff(loc / "2020-01-01.tif", _values(0))
    write_geotiff(loc / "2020-02-01.tif", _values(1),
                  transform=from_origin(300005.0, 5000000.0, 10.0, 10.0))  # half a pixel east
    write_geotiff(loc / "2020-03-01.tif", _values(2), crs="EPSG:32632")  # the next UTM zone
    write_geotiff(loc / "2020-04-01.tif", _values(3))
    write_geotiff(loc / "2020-05-01.tif", _values(4, height=11))
    write_geotiff(loc / "2020-06-01.tif", _values(5, dtype="int16"))
    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions())
    assert [d.date for d in plan.dates] == ["2020-01-01", "2020-04-01"]
    why = {o.rel_path: (o.reason, o.message) for o in plan.outcomes}
    assert why["loc/2020-02-01.tif"][0] == "misaligned" and "geotransform (300005" in why["loc/2020-02-01.tif"][1]
    assert why["loc/2020-03-01.tif"][0] == "misaligned" and "EPSG:32632" in why["loc/2020-03-01.tif"][1]
    assert "size 10x11" in why["loc/2020-05-01.tif"][1]
    assert "dtype int16" in why["loc/2020-06-01.tif"][1]
    assert plan.dropped()["2020-03-01"]["reason"] == "misaligned"
    np.testing.assert_array_equal(ts.read_stack(plan),
                                  _rasterio_stack([[loc / "2020-01-01.tif"], [loc / "2020-04-01.tif"]]))


def test_a_first_pass_in_another_grid_is_left_out_not_every_other_pass(tmp_path):
    # The first pass alone came in the next UTM zone: the stack is the three that agree.
    loc = tmp_path / "loc"
    write_geotiff(loc / "2020-01-01.tif", _values(0), crs="EPSG:32632")
    for month in (2, 3, 4):
        write_geotiff(loc / f"2020-0{month}-01.tif", _values(month))
    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions())
    assert [d.date for d in plan.dates] == ["2020-02-01", "2020-03-01", "2020-04-01"]
    assert plan.epsg == 32633
    [odd] = plan.outcomes
    assert (odd.rel_path, odd.reason) == ("loc/2020-01-01.tif", "misaligned")
    assert "CRS EPSG:32632 (the stack's: EPSG:32633)" in odd.message
    np.testing.assert_array_equal(ts.read_stack(plan), _rasterio_stack(
        [[loc / f"2020-0{m}-01.tif"] for m in (2, 3, 4)]))


def test_float_noise_in_a_geotransform_is_one_grid_and_a_shift_is_printed_exactly(tmp_path):
    loc = tmp_path / "loc"
    write_geotiff(loc / "2020-01-01.tif", _values(0))
    # What a reprojection tool leaves: 1e-10 m on 10 m pixels.
    write_geotiff(loc / "2020-02-01.tif", _values(1),
                  transform=from_origin(300000.0000000001, 5000000.0, 10.000000000001, 10.0))
    # A thousandth of a pixel is a shift, and the message shows which digits differ.
    write_geotiff(loc / "2020-03-01.tif", _values(2), transform=from_origin(300000.01, 5000000.0, 10.0, 10.0))
    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions())
    assert [d.date for d in plan.dates] == ["2020-01-01", "2020-02-01"]
    [shifted] = plan.outcomes
    assert shifted.reason == "misaligned" and "300000.01, 10.0" in shifted.message, shifted.message


def test_a_pass_with_another_nodata_value_is_left_out(tmp_path):
    # One nodata value per stack: -9999 of the second pass would count as data in the band
    # statistics and in --raster_max_nodata, and be read as a value.
    loc = tmp_path / "loc"
    write_geotiff(loc / "2020-01-01.tif", _values(0, dtype="int16"), nodata=0)
    write_geotiff(loc / "2020-02-01.tif", _values(1, dtype="int16"), nodata=-9999)
    write_geotiff(loc / "2020-03-01.tif", _values(2, dtype="int16"), nodata=0)
    write_geotiff(loc / "2020-04-01.tif", _values(3, dtype="int16"))
    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions())
    assert [d.date for d in plan.dates] == ["2020-01-01", "2020-03-01"] and plan.nodata == 0
    why = {o.rel_path: o.message for o in plan.outcomes if o.reason == "misaligned"}
    assert "nodata -9999 (the stack's: 0)" in why["loc/2020-02-01.tif"]
    assert "nodata none (the stack's: 0)" in why["loc/2020-04-01.tif"]
    nan = tmp_path / "nan"
    for month in (1, 2):
        write_geotiff(nan / f"2020-0{month}-01.tif", _values(month, dtype="float32"), nodata=float("nan"))
    assert len(ts.plan_location("nan", _files(nan), ts.TimeSeriesOptions()).dates) == 2


def test_missing_band_duplicate_date_no_date_and_mixed_dtypes(tmp_path):
    loc = tmp_path / "loc"
    for date in ("20200101", "20200201", "20200301"):
        for band in ("B02", "B03"):
            if (date, band) != ("20200201", "B03"):
                write_geotiff(loc / f"T31TFJ_{date}_{band}.tif", _values(int(date[4:6]) + len(band), bands=1))
    write_geotiff(loc / "copy_20200301_B02.tif", _values(9, bands=1))  # a second B02 of 2020-03-01
    write_geotiff(loc / "undated_B02.tif", _values(8, bands=1))
    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions())
    assert [d.date for d in plan.dates] == ["2020-01-01"]
    why = {o.rel_path: o.reason for o in plan.outcomes}
    assert why == {"loc/T31TFJ_20200201_B02.tif": "missing_band",
                   "loc/T31TFJ_20200301_B02.tif": "conflicting_dates",
                   "loc/T31TFJ_20200301_B03.tif": "conflicting_dates",
                   "loc/copy_20200301_B02.tif": "conflicting_dates",
                   "loc/undated_B02.tif": "no_date"}
    # Every input file is in the stack or has a reason.
    kept = {rel for d in plan.dates for rel in d.rel_paths}
    assert kept | set(why) == {rel for rel, _ in _files(loc)} and not kept & set(why)
    # Band files of one date in two dtypes: no stack.
    mixed = tmp_path / "mixed"
    write_geotiff(mixed / "2020-01-01_B02.tif", _values(0, bands=1))
    write_geotiff(mixed / "2020-01-01_B03.tif", _values(1, bands=1, dtype="float32"))
    plan = ts.plan_location("mixed", _files(mixed), ts.TimeSeriesOptions())
    assert plan.rejected[0] == "mixed_dtypes" and {o.reason for o in plan.outcomes} == {"mixed_dtypes"}
    assert len(plan.outcomes) == 2


def test_too_large_without_patches_and_every_reason_is_known(tmp_path):
    loc = tmp_path / "loc"
    for i in range(3):
        write_geotiff(loc / f"2020-01-0{i + 1}.tif", _values(i))
    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions(max_pixels=3 * 12 * 10 * 3 - 1))
    assert plan.rejected[0] == "too_large" and "--raster_patch" in plan.rejected[1]
    assert len(plan.outcomes) == 3
    for reason in ("no_date", "misaligned", "missing_band", "conflicting_dates", "mixed_dtypes", "too_large"):
        assert reason in schemas.REJECT_REASONS
    assert "band_not_selected" in schemas.SKIP_REASONS
    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions(
        max_pixels=10, patch=PatchOptions((4, 4))))
    assert plan.rejected is None


@pytest.mark.parametrize("tiled", [False, True])
def test_patches_are_the_same_window_of_every_date(tmp_path, tiled):
    loc = tmp_path / "loc"
    profile = {"tiled": True, "blockxsize": 16, "blockysize": 16} if tiled else {}
    paths = [write_geotiff(loc / f"2020-0{i + 1}-01.tif", _values(i, bands=2, height=37, width=45),
                           nodata=0, compress="deflate", **profile) for i in range(3)]
    options = PatchOptions((16, 16), stride=(12, 12), edge="pad")
    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions(patch=options))
    got = {(y, x): (stack, share) for y, x, stack, share, _ in ts.read_patches(plan, options, 0, 10 ** 6)}
    assert sorted(got) == [(y, x) for y in (0, 12, 24) for x in (0, 12, 24, 36)]  # 37 rows, 45 columns
    for (y, x), (stack, share) in got.items():
        expected = []
        for path in paths:
            with rasterio.open(path) as src:  # GDAL's boundless window read, filled with nodata
                expected.append(np.transpose(src.read(window=((y, y + 16), (x, x + 16)), boundless=True,
                                                      fill_value=0), (1, 2, 0)))
        np.testing.assert_array_equal(stack, np.stack(expected))
        outside = max(0, y + 16 - 37) * 16 + max(0, x + 16 - 45) * 16 - max(0, y + 16 - 37) * max(0, x + 16 - 45)
        assert share == pytest.approx(outside / 256)
        name, gt = ts.patch_of(plan, y, x, 16, 16)
        assert name == f"loc#patch={y},{x}"
        with rasterio.open(paths[0]) as src:
            assert gt == tuple(src.window_transform(((y, y + 16), (x, x + 16))).to_gdal())
    # --raster_max_nodata: patches mostly outside the location are skipped.
    strict = PatchOptions((16, 16), stride=(12, 12), edge="pad", max_nodata=0.5)
    skipped = [(y, x) for y, x, stack, _, _ in ts.read_patches(plan, strict, 0, 10 ** 6) if stack is None]
    assert (24, 36) in skipped and (0, 0) not in skipped


def test_band_statistics_leave_nodata_out(tmp_path):
    stack = np.array([[[[1, 5]], [[0, 7]]], [[[3, 0]], [[0, 9]]]], np.uint16)  # (2, 2, 1, 2)
    stats = ts.stack_band_stats(stack, 0.0)
    assert stats.count == (2, 3) and stats.nodata == (2, 1)
    assert stats.mean == pytest.approx((2.0, 7.0))


def test_the_plan_travels_as_json(tmp_path):
    loc = tmp_path / "loc"
    write_geotiff(loc / "2020-01-01.tif", _values(0), nodata=0)
    write_geotiff(loc / "2020-01-02.tif", _values(1), nodata=0)
    write_geotiff(loc / "nodate.tif", _values(1), nodata=0)
    import json

    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions())
    again = ts.LocationPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan


def _masked_geotiff(path, array, mask, internal, nodata=None):
    """A GeoTIFF (bands, h, w) with GDAL's mask (True: no data): internal (GDAL_TIFF_INTERNAL_MASK), else `.msk`."""
    bands, height, width = array.shape
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=internal):
        with rasterio.open(path, "w", driver="GTiff", height=height, width=width, count=bands,
                           dtype=array.dtype.name, nodata=nodata, crs="EPSG:32633",
                           transform=from_origin(300000.0, 5000000.0, 10.0, 10.0), tiled=True,
                           blockxsize=16, blockysize=16) as dst:
            dst.write(array)
            dst.write_mask(np.where(mask, 0, 255).astype(np.uint8))
    assert (path.parent / (path.name + ".msk")).exists() != internal
    return path


def _gdal_masked(paths_per_date):
    """(time, h, w, bands) booleans: where GDAL's masks (rasterio's read_masks: nodata and dataset mask) say no data."""
    dates = []
    for paths in paths_per_date:
        planes = []
        for path in paths:
            with rasterio.open(path) as src:
                planes.append(src.read_masks() == 0)
        dates.append(np.transpose(np.concatenate(planes), (1, 2, 0)))
    return np.stack(dates)


def _mask_location(tmp_path):
    """Three passes of 2 bands: an internal mask, an external `.msk`, none (nodata 0 in each)."""
    loc = tmp_path / "loc"
    height, width = 32, 32
    masks = [np.zeros((height, width), bool) for _ in range(3)]
    masks[0][:20, :16] = True  # most of patch (0, 0) on the first date
    masks[1][:, 24:] = True
    masks[1][5, 3] = True
    paths = [_masked_geotiff(loc / "2020-01-01.tif", _values(0, 2, height, width), masks[0], True, nodata=0),
             _masked_geotiff(loc / "2020-02-01.tif", _values(1, 2, height, width), masks[1], False, nodata=0),
             write_geotiff(loc / "2020-03-01.tif", _values(2, 2, height, width), nodata=0, tiled=True,
                           blockxsize=16, blockysize=16)]
    values = _values(2, 2, height, width)
    values[:, 30, 30] = 0  # nodata, under no mask
    write_geotiff(paths[2], values, nodata=0, tiled=True, blockxsize=16, blockysize=16)
    return loc, paths


def test_a_passs_internal_or_external_mask_counts_as_its_nodata_as_gdal_reads_them(tmp_path):
    loc, paths = _mask_location(tmp_path)
    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions())
    stack, masked = ts.read_stack(plan, with_mask=True)
    np.testing.assert_array_equal(stack, _rasterio_stack([[p] for p in paths]))  # values kept under the mask
    gdal_empty = _gdal_masked([[p] for p in paths])  # GDAL: mask or nodata
    np.testing.assert_array_equal(masked | (stack == 0), gdal_empty)
    # Band statistics: GDAL's masked read (rasterio's masked arrays) of every date.
    stats = ts.stack_band_stats(stack, plan.nodata, masked)
    for b in range(2):
        kept = np.concatenate([rasterio.open(p).read(b + 1, masked=True).compressed() for p in paths])
        assert stats.count[b] == kept.size and stats.nodata[b] == gdal_empty[..., b].sum()
        assert (stats.min[b], stats.max[b]) == (kept.min(), kept.max())
        assert stats.mean[b] == pytest.approx(kept.astype(np.float64).mean(), rel=1e-12)
    # Patches: a masked pixel is a nodata pixel of its date in --raster_max_nodata's share.
    options = PatchOptions((16, 16), max_nodata=0.2)
    got = {(y, x): (stack, share, m) for y, x, stack, share, m in ts.read_patches(plan, options, 0, 32)}
    for (y, x), (patch, share, m) in got.items():
        empty = gdal_empty[:, y:y + 16, x:x + 16].all(axis=3)
        assert share == pytest.approx(empty.mean()), (y, x)
        assert (patch is None) == (empty.mean() > 0.2)
        if patch is not None:
            np.testing.assert_array_equal(m | (patch == 0), gdal_empty[:, y:y + 16, x:x + 16])
    assert got[(0, 0)][0] is None and got[(16, 0)][0] is not None  # 320 of 768 pixels masked
    assert got[(16, 16)][2][1, :, 8:].all() and not got[(16, 16)][2][1, :, :8].any()


def test_a_band_files_mask_masks_its_band_alone(tmp_path):
    loc = tmp_path / "loc"
    mask = np.zeros((16, 16), bool)
    mask[:8] = True
    paths = {}
    for d, date in enumerate(["20200601", "20200701"]):
        for b, band in enumerate(["B4", "B5"]):
            path = loc / f"T31TFJ_{date}_{band}.tif"
            if (d, band) == (1, "B5"):
                paths[d, b] = _masked_geotiff(path, _values(10 * d + b, 1, 16, 16), mask, False)
            else:
                paths[d, b] = write_geotiff(path, _values(10 * d + b, 1, 16, 16))
    plan = ts.plan_location("loc", _files(loc), ts.TimeSeriesOptions())
    stack, masked = ts.read_stack(plan, with_mask=True)
    by_date = [[paths[d, 0], paths[d, 1]] for d in range(2)]
    np.testing.assert_array_equal(masked, _gdal_masked(by_date))
    assert masked[1, :8, :, 1].all() and not masked[..., 0].any()
    stats = ts.stack_band_stats(stack, plan.nodata, masked)
    assert stats.count == (512, 384) and stats.nodata == (0, 128)
    # A pixel whose other band holds data is no nodata pixel: the patch is kept.
    (_, _, patch, share, _), = ts.read_patches(plan, PatchOptions((16, 16), max_nodata=0.0), 0, 16)
    assert patch is not None and share == 0.0
