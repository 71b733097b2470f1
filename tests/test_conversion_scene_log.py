"""conversion.scene_log: normalized.jsonl's entries of scenes cut into patches, gathered per scene.

A real conversion of GeoTIFFs written by GDAL (rasterio) with --raster_patch; what the log says
is compared with the patch records read back with TensorFlow's own reader, and with the grid.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import convert, write_geotiff

import schemas
from conversion.scene_log import (
    CUT_ACTION, LISTED_SCENES, covered, patches_section, scene_logs, scene_logs_from_jsonl, split_patch_name,
)
from imaging.patches import offsets

pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")

_PATCH = 16


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes") / "in"
    rng = np.random.default_rng(7)
    full = rng.integers(1, 255, (1, 40, 50), dtype=np.uint8)
    holed = rng.integers(1, 255, (1, 33, 20), dtype=np.uint8)
    holed[:, :16, :16] = 0  # One patch all nodata: skipped.
    write_geotiff(root / "a" / "full.tif", full)
    write_geotiff(root / "a" / "holed.tif", holed, nodata=0)
    out = tmp_path_factory.mktemp("scenes") / "out"
    manifest = convert(root, out, "--raster_patch", _PATCH, "--raster_max_nodata", "0.9", "--num_shards", 1)
    return out, manifest, {"a/full.tif": (40, 50), "a/holed.tif": (33, 20)}


def _patch_records(out) -> list[str]:
    import tensorflow as tf

    spec = {schemas.FILENAME.key: tf.io.FixedLenFeature([], tf.string)}
    return [tf.io.parse_single_example(raw, spec)[schemas.FILENAME.key].numpy().decode()
            for shard in sorted(out.glob("*.tfrecord")) for raw in tf.data.TFRecordDataset(str(shard))]


def test_the_log_of_each_scene_matches_its_records_and_its_grid(converted):
    out, manifest, sizes = converted
    scenes = scene_logs_from_jsonl((out / schemas.NORMALIZED_FILENAME).read_text())
    assert list(scenes) == sorted(sizes)
    records = [split_patch_name(name) for name in _patch_records(out)]
    for path, log in scenes.items():
        height, width = sizes[path]
        assert log.size == (height, width) and log.failed == []
        written = {(y, x) for scene, y, x in records if scene == path}
        assert log.written == len(written)
        # Every patch of the grid is in an item that was cut: written, or skipped for nodata.
        grid = {(y, x) for y in offsets(height, _PATCH, _PATCH, "shift")
                for x in offsets(width, _PATCH, _PATCH, "shift")}
        rows, columns = sorted({y for y, _ in grid}), sorted({x for _, x in grid})
        assert covered(log.rows, rows, columns) == grid
        assert written | set(log.skipped) == grid and not written & set(log.skipped)
    assert scenes["a/holed.tif"].skipped == [(0, 0)] and scenes["a/full.tif"].skipped == []


def test_the_manifest_section_counts_every_scene(converted):
    out, manifest, _ = converted
    section = patches_section(scene_logs_from_jsonl((out / schemas.NORMALIZED_FILENAME).read_text()))
    assert manifest.extra["patches"] == section
    assert section["scenes"] == 2 and section["written"] == len(_patch_records(out))
    assert section["skipped_nodata"] == 1 and section["failed_items"] == 0
    assert patches_section({}) == {}


def test_entries_of_other_actions_are_passed_over_and_scenes_sorted_by_bytes():
    entries = [("b#patch_rows=0,16", [CUT_ACTION], {"written": 2, "scene_size": [16, 32]}),
               ("a.tif", ["flatten_alpha"], None),
               ("a#patch_rows=16,32", [CUT_ACTION], {"written": 1}),
               ("a#patch_rows=0,16", ["patch_rows_failed"], None)]
    logs = scene_logs(entries)
    assert list(logs) == ["a", "b"]
    assert logs["a"].rows == [(16, 32, 0, None)] and logs["a"].failed == [(0, 16, 0, None)]
    assert logs["a"].size is None and logs["b"].size == (16, 32) and logs["b"].written == 2


def test_only_the_first_scenes_are_listed():
    many = {f"s{i:04d}": scene_logs([(f"s{i:04d}#patch_rows=0,1", [CUT_ACTION], {"written": 1})])[f"s{i:04d}"]
            for i in range(LISTED_SCENES + 5)}
    section = patches_section(many)
    assert section["scenes"] == LISTED_SCENES + 5 and section["written"] == LISTED_SCENES + 5
    assert list(section["listed"]) == sorted(many)[:LISTED_SCENES]


def test_a_patch_name_and_other_names():
    assert split_patch_name("a/b.tif#patch=16,32") == ("a/b.tif", 16, 32)
    assert split_patch_name("a/b.tif") is None and split_patch_name("a#patch=x,1") is None
    assert split_patch_name("a#patch=16") is None
