"""conversion.time_series: a listing grouped into locations of dated passes (written by GDAL), planned and
carried to the shard writers; every file of the input ends up in a stack or among the problems."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import write_geotiff

from conversion import time_series as cts
from conversion.listing import list_input
from imaging import time_series as ts
from imaging.patches import PatchOptions
from imaging.scenes import WorkItem

pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")


def _values(seed, bands=2, height=12, width=10):
    return np.random.default_rng(seed).integers(1, 30000, size=(bands, height, width)).astype("uint16")


@pytest.fixture
def listing(tmp_path):
    root = tmp_path / "in"
    for i, date in enumerate(("2020-05-14", "2020-06-04")):
        write_geotiff(root / "wheat" / "field_1" / f"{date}.tif", _values(i))
        write_geotiff(root / "corn" / "field_2" / f"{date}.tif", _values(10 + i))
    write_geotiff(root / "corn" / "field_2" / "2020-07-01.tif", _values(20, height=8))  # Misaligned.
    write_geotiff(root / "rye" / "field_3" / "orbit_12.tif", _values(30))  # No date in its name or tags.
    (root / "wheat" / "field_1" / "notes.txt").write_text("not a raster")
    return root, *list_input(str(root))


def test_every_input_is_in_a_stack_or_a_problem(listing, tmp_path):
    root, files, problems = listing
    planned = cts.plan_locations(files, problems, ts.TimeSeriesOptions(), str(tmp_path / "out"))
    assert sorted(planned.stacks) == ["corn/field_2", "wheat/field_1"]
    assert [f.rel_path for f in planned.files] == ["corn/field_2", "wheat/field_1"]
    stacked = {rel for plan in planned.stacks.values() for date in plan.dates for rel in date.rel_paths}
    reasons = {p.rel_path: p.reason for p in planned.problems}
    assert reasons == {"corn/field_2/2020-07-01.tif": "misaligned", "rye/field_3/orbit_12.tif": "no_date",
                       "wheat/field_1/notes.txt": "not_a_raster"}
    assert stacked | set(reasons) == {f.rel_path for f in files}
    plan = planned.stacks["wheat/field_1"]
    assert plan.shape == (2, 12, 10, 2) and planned.files[1].size == plan.nbytes
    assert planned.files[1].path == cts.stack_plan_path(str(tmp_path / "out"), "wheat/field_1")


def test_the_plans_written_for_the_shard_writers_read_back_equal(listing, tmp_path):
    _, files, problems = listing
    out = tmp_path / "out"
    planned = cts.plan_locations(files, problems, ts.TimeSeriesOptions(), str(out))
    cts.write_stack_plans(planned.stacks, str(out))
    for f in planned.files:
        with open(f.path) as stream:
            assert ts.LocationPlan.from_json(json.load(stream)) == planned.stacks[f.rel_path]


def test_patches_of_a_location_are_work_items_of_bounded_bytes(listing, tmp_path):
    _, files, problems = listing
    planned = cts.plan_locations(files, problems, ts.TimeSeriesOptions(), str(tmp_path / "out"))
    windows = cts.stack_windows(planned.stacks, PatchOptions(size=(4, 5)))
    assert sorted(windows) == sorted(planned.stacks)
    for location, items in windows.items():
        t, h, w, b = planned.stacks[location].shape
        assert items and all(size >= 4 * 5 * t * b * 2 for _, size in items)
        assert sum(size for _, size in items) >= (h // 4) * (w // 5) * 4 * 5 * t * b * 2


def test_a_folder_without_rasters_is_one_sentence(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(b"x")
    files, problems = list_input(str(tmp_path))
    with pytest.raises(ValueError, match="--time_series found no raster among 1 files"):
        cts.plan_locations(files, problems, ts.TimeSeriesOptions(), str(tmp_path / "out"))


def test_work_items_of_tall_tiles_decode_each_tile_once_per_date(tmp_path, monkeypatch):
    """1024-px tiles, 256-px patches (a Sentinel-2 band's layout): each item holds a tile row's patch rows."""
    root = tmp_path / "in"
    for i in range(4):
        values = np.full((1, 2048, 2048), 100 + i, np.uint16)
        write_geotiff(root / "loc" / f"2020-0{i + 1}-01.tif", values, tiled=True, blockxsize=1024,
                      blockysize=1024, compress="deflate")
    files, problems = list_input(str(root))
    planned = cts.plan_locations(files, problems, ts.TimeSeriesOptions(), str(tmp_path / "out"))
    plan = planned.stacks["loc"]
    assert plan.segment_shape == (1024, 1024)
    assert ts.LocationPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    options = PatchOptions(size=(256, 256))
    items = [WorkItem.parse(key) for key, _ in cts.stack_windows(planned.stacks, options)["loc"]]
    readers, real_open = [], ts.open_scene

    def counted(*args, **kwargs):  # The real readers, kept to count what they decoded.
        readers.append(real_open(*args, **kwargs))
        return readers[-1]

    monkeypatch.setattr(ts, "open_scene", counted)
    corners = []
    for item in items:
        columns = None if item.x0 is None else (item.x0, item.x1)
        corners += [(y, x) for y, x, stack, _, _ in ts.read_patches(plan, options, item.y0, item.y1, columns)]
    assert sorted(corners) == [(y, x) for y in range(0, 2048, 256) for x in range(0, 2048, 256)]
    # 4 dates x 4 tiles, each decoded once: each item's rows lie in one tile row, its columns in tiles.
    assert sum(r.decoded_segments for r in readers) == 16
    assert all(item.y0 // 1024 == (item.y1 - 1) // 1024 for item in items)
