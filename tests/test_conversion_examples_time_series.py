"""The time-series row of the kinds of examples (conversion/examples/time_series.py): locations written by GDAL."""

import datetime
import json

import numpy as np
import pytest

import schemas
from beam_jobs.convert import build_plan
from conversion import examples, listing
from conversion.config import ConversionConfig
from conversion.examples import image as image_kind, time_series as time_series_kind
from conversion.options import ShardingOptions
from imaging import RasterOptions, ValidationOptions
from imaging.patches import PatchOptions
from imaging.time_series import TimeSeriesOptions
from helpers import convert, write_geotiff

rasterio = pytest.importorskip("rasterio")

_EPOCH = datetime.date(1970, 1, 1)
_TIME_SERIES = ValidationOptions(time_series=TimeSeriesOptions())


def _values(seed, bands=2, height=8, width=6):
    return np.random.default_rng(seed).integers(1, 9000, size=(bands, height, width)).astype("uint16")


@pytest.fixture(scope="module")
def passes(tmp_path_factory):
    """Two locations of dated passes (one with a date in another CRS), and a note that is no raster."""
    root = tmp_path_factory.mktemp("ts_examples") / "in"
    for i, date in enumerate(["2020-06-01", "2020-05-01", "2020-07-01"]):
        write_geotiff(root / "wheat" / "field_a" / f"{date}.tif", _values(i))
    write_geotiff(root / "corn" / "field_b" / "20200502.tif", _values(10))
    write_geotiff(root / "corn" / "field_b" / "20200612.tif", _values(11), crs="EPSG:32634")
    (root / "corn" / "field_b" / "notes.txt").write_text("not a pass")
    return root


def _config(root, out, validation=_TIME_SERIES):
    return ConversionConfig(str(root), str(out), validation=validation, sharding=ShardingOptions(num_shards=1))


def test_the_time_series_row_comes_before_the_image_row_and_takes_only_time_series():
    assert examples.KINDS.index(time_series_kind.KIND) < examples.KINDS.index(image_kind.KIND)
    assert examples.kind_for(_TIME_SERIES) is time_series_kind.KIND
    assert examples.kind_for(ValidationOptions()) is image_kind.KIND
    assert examples.record_schema(_TIME_SERIES) == schemas.TimeSeriesExampleSchema(mask=False)
    assert examples.record_schema(_TIME_SERIES, ("mask",)) == schemas.TimeSeriesExampleSchema(mask=True)


def test_the_row_groups_the_passes_of_each_location_in_date_order(passes, tmp_path):
    files, problems = listing.list_input(str(passes))
    grouped = time_series_kind.KIND.group(list(files), list(problems), _config(passes, tmp_path / "out"))
    assert [f.rel_path for f in grouped.files] == ["corn/field_b", "wheat/field_a"]
    assert grouped.members == {
        "corn/field_b": ("corn/field_b/20200502.tif",),
        "wheat/field_a": tuple(f"wheat/field_a/2020-0{m}-01.tif" for m in (5, 6, 7)),
    }
    # Each date as rasterio reads the file's name and CRS: the one in another CRS is left out, saying so.
    dates = [d.days for d in grouped.plans["wheat/field_a"].dates]
    assert dates == [(datetime.date(2020, m, 1) - _EPOCH).days for m in (5, 6, 7)]
    with rasterio.open(passes / "corn" / "field_b" / "20200612.tif") as src:
        assert src.crs.to_epsg() == 32634
    reasons = {p.rel_path: p.reason for p in grouped.problems}
    assert reasons == {"corn/field_b/20200612.tif": "misaligned", "corn/field_b/notes.txt": "not_a_raster"}


def test_the_planner_plans_locations_and_counts_every_file(passes, tmp_path):
    plan = build_plan(_config(passes, tmp_path / "out"))
    assert sorted(f.rel_path for f in plan.files) == ["corn/field_b", "wheat/field_a"]
    assert sorted(plan.stacks) == ["corn/field_b", "wheat/field_a"]
    assert plan.num_found == 6  # Five rasters and the note.
    assert plan.class_names == ("corn", "wheat")


def test_patches_are_windows_of_every_location(passes, tmp_path):
    validation = ValidationOptions(time_series=TimeSeriesOptions(),
                                   raster=RasterOptions(patch=PatchOptions((4, 3))))
    plan = build_plan(_config(passes, tmp_path / "out", validation))
    # 8x6 pixels in 4x3 patches: four patches per location, in its work items.
    names = sorted({f.rel_path for f in plan.files})
    assert names == ["corn/field_b", "wheat/field_a"]
    assert all(f.patch_rows is not None for f in plan.files)


def test_the_manifest_holds_the_rows_schema_and_its_section(passes, tmp_path):
    out = tmp_path / "out"
    convert(passes, out, "--time_series", "--num_shards", "1", "--max_reject_fraction", "1")
    manifest = json.loads((out / schemas.MANIFEST_FILENAME).read_text())
    assert manifest["features"] == examples.record_schema(_TIME_SERIES).to_json()
    section = manifest[schemas.TIME_SERIES]
    assert section["locations"]["wheat/field_a"]["kept"] == ["2020-05-01", "2020-06-01", "2020-07-01"]
    assert list(section["locations"]["corn/field_b"]["dropped"]) == ["2020-06-12"]
