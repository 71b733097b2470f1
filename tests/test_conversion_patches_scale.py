"""Scenes at scale (issue 25): work items bounded in both directions, the same patches whether a
wide row is split or not, and --resume of a patch conversion.

Scenes are GeoTIFFs written by rasterio (GDAL); stored patches are compared
with rasterio's boundless window reads, and runs with each other byte for byte.
"""

from __future__ import annotations

import collections
import hashlib
import json
import pathlib

import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402
from rasterio.windows import Window  # noqa: E402

import schemas  # noqa: E402
from beam_jobs import verify  # noqa: E402
from conversion.files import TMP_DIRNAME  # noqa: E402
from helpers import convert, decoded_records, write_geotiff  # noqa: E402
from imaging import scenes  # noqa: E402
from imaging.patches import PatchOptions, grid  # noqa: E402

# rasterio builds its transforms with `*` (affine 2.4 asks for `@`): its own warning, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")

_RNG = np.random.default_rng(2525)
_TRANSFORM = from_origin(300000.0, 4600000.0, 20.0, 20.0)
_BUDGET = 8 << 20  # imaging.scenes' budget of decoded patch bytes per work item, as documented


def _scene(path: pathlib.Path, array: np.ndarray, nodata=None, **profile) -> pathlib.Path:
    """A GeoTIFF of (bands, height, width) written by GDAL."""
    return write_geotiff(path, array, nodata, crs="EPSG:32632", transform=_TRANSFORM, **profile)


# --------------------------------------------------------------------------
# Planning


@pytest.mark.parametrize("height, width, bands, dtype, segment, patch, stride, edge", [
    (10980, 10980, 13, "float32", (1024, 1024), 512, None, "shift"),  # Sentinel-2: a patch is over the budget
    (10980, 10980, 13, "uint16", (512, 512), 256, 192, "pad"),  # 58 columns of 1.7 MB, tiles of 3 patch rows
    (10980, 10980, 13, "uint16", (1, 10980), 256, None, "shift"),  # the same, striped: one patch row each
    (7801, 7651, 11, "uint16", (256, 256), 128, None, "drop"),  # Landsat-like: 59 columns of 360 KB
    (3000, 40000, 1, "uint8", None, 64, 32, "shift"),  # a long strip of a DEM, overlapping
    (1000, 1000, 13, "uint16", (256, 256), 256, None, "shift"),  # narrow: bands of whole rows, as before
    (10980, 10980, 1, "uint16", (1024, 1024), 256, None, "shift"),  # a Sentinel-2 JPEG 2000 band: tall tiles
    (10980, 10980, 1, "uint16", (2048, 10980), 256, None, "shift"),  # tall strips: whole rows still
    (300, 200, 4, "uint8", (16, 200), 512, None, "pad"),  # smaller than a patch: one padded patch
])
def test_work_items_are_bounded_and_cover_every_patch_once(height, width, bands, dtype, segment, patch, stride,
                                                           edge):
    header = scenes.SceneHeader(height, width, bands, dtype, segment)
    options = PatchOptions(patch, stride, edge)
    items = scenes.work_items(header, options)
    patch_bytes = options.size[0] * options.size[1] * bands * np.dtype(dtype).itemsize
    rows = sorted({y for y, _ in grid(height, width, options)})
    columns = sorted({x for _, x in grid(height, width, options)})
    covered = collections.Counter()
    for item in items:
        mine = [(y, x) for y in rows if item.y0 <= y < item.y1
                for x in columns if item.x0 is None or item.x0 <= x < item.x1]
        covered.update(mine)
        assert item.patches == len(mine) >= 1, item
        # Bounded above: within the budget, unless one patch alone is larger (then exactly one).
        assert item.patches * patch_bytes <= _BUDGET or item.patches == 1, item
        assert scenes.WorkItem.parse(item.key) == scenes.WorkItem(item.y0, item.y1, item.x0, item.x1)
    assert sorted(covered) == sorted(grid(height, width, options))
    assert set(covered.values()) == {1}
    assert len({item.name("s.tif") for item in items}) == len(items)
    assert [i.first for i in items].count(True) == 1 and items[0].first
    # Bounded below: a row is split only when it does not fit, or when the tiles hold more patch
    # rows than an item of whole rows, and then in ranges of at least half the budget's patches
    # (as even as the count allows), so items are few and large.
    per_item = max(1, _BUDGET // patch_bytes)
    tiled = segment is not None and segment[1] < width
    tall = tiled and len(columns) <= per_item and min(-(-segment[0] // options.stride[0]), len(rows)) > (
        per_item // len(columns))
    if len(columns) <= per_item and not tall:
        assert all(item.x0 is None for item in items)
        assert len(items) == -(-len(rows) // (per_item // len(columns)))
    else:
        # Patch rows that start within one tile's height go together, within the budget.
        together = max(1, min(per_item, -(-(segment or (1,))[0] // options.stride[0])))
        assert all(item.x0 is not None and len([y for y in rows if item.y0 <= y < item.y1]) <= together
                   for item in items)
        columns_each = [len([x for x in columns if item.x0 <= x < item.x1]) for item in items]
        assert min(columns_each) >= max(1, per_item // together) // 2
    assert scenes.work_items(header, options) == items  # Deterministic


def test_a_sentinel_2_row_is_split_into_one_patch_items():
    items = scenes.work_items(scenes.SceneHeader(10980, 10980, 13, "float32"), PatchOptions(512))
    assert len(items) == 22 * 22 and {i.patches for i in items} == {1}
    assert items[1].key == "0,512,512,1024" and items[1].name("t.tif") == "t.tif#patch_rows=0,512#patch_columns=512,1024"


def test_a_tile_row_of_a_narrow_scene_is_decoded_once_not_once_per_patch_row():
    # A Sentinel-2 10 m band: 1024-px tiles, 43 columns of 256-px uint16 patches (128 KB) fit one item,
    # but a tile row holds 4 patch rows: items of 4 rows and a third of the columns each.
    items = scenes.work_items(scenes.SceneHeader(10980, 10980, 1, "uint16", (1024, 1024)), PatchOptions(256))
    assert len(items) == 11 * 3 and all(i.y0 % 1024 == 0 and i.x0 is not None for i in items)
    assert [i.key for i in items[:3]] == ["0,1024,0,3584", "0,1024,3584,7168", "0,1024,7168,10725"]


def test_the_patch_rows_of_one_tile_row_go_together():
    # 512-px tiles, 256-px patches of 13 uint16 bands (1.7 MB): 2 rows x 2 columns a tile, 6.8 MB.
    items = scenes.work_items(scenes.SceneHeader(6144, 6144, 13, "uint16", (512, 512)), PatchOptions(256))
    assert len(items) == 12 * 12 and {i.patches for i in items} == {4}
    assert {i.y0 % 512 for i in items} == {i.x0 % 512 for i in items} == {0}
    assert [i.key for i in items[:2]] == ["0,512,0,512", "0,512,512,1024"]


@pytest.mark.parametrize("key", ["", "1", "0,5,3", "5,5", "0,5,7,7", "a,b", "0,5,1,2,3"])
def test_a_bad_work_item_key_is_refused_naming_it(key):
    with pytest.raises(ValueError, match="'y0,y1' or 'y0,y1,x0,x1'.*Received: " + repr(key)):
        scenes.WorkItem.parse(key)


# --------------------------------------------------------------------------
# End to end: split rows against unsplit rows


_PATCH, _STRIDE, _MAX_NODATA = 256, 224, 0.4


def _inputs(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Two 13-band uint16 scenes whose rows of 256-px patches are ~9 MB (> the budget): tiled and striped."""
    tiled = _RNG.integers(1, 65536, (13, 420, 1400), dtype=np.uint16)
    tiled[:, :200, 900:] = 0  # Nodata: the patches of that corner are skipped.
    striped = _RNG.integers(0, 65536, (13, 300, 1350), dtype=np.uint16)
    return {
        "tiled": _scene(root / "scenes" / "tiled.tif", tiled, nodata=0, tiled=True, blockxsize=128,
                        blockysize=128, compress="deflate"),
        "striped": _scene(root / "scenes" / "striped.tif", striped, tiled=False, blockysize=8,
                          compress="lzw", interleave="pixel"),
    }


def _records(out) -> dict[str, tuple[bytes, str]]:
    """Record filename to (its serialized tf.train.Example, its shard)."""
    found = {}
    for record, payload, shard in decoded_records(out):
        name = record[schemas.FILENAME.key].decode()
        assert name not in found, name
        found[name] = (payload, shard)
    return found


def _cut_entries(out) -> list[dict]:
    lines = (pathlib.Path(out) / schemas.NORMALIZED_FILENAME).read_text().splitlines()
    return [e for e in map(json.loads, lines) if "cut_into_patches" in e["actions"]]


def _hashes(out: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())
            if p.suffix in (".tfrecord", ".idx", ".json", ".jsonl")}


_ARGS = ("--raster_patch", _PATCH, "--raster_stride", _STRIDE, "--raster_max_nodata", _MAX_NODATA,
         "--raster_georef", "--num_shards", 3)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """The scenes converted with rows split (default budget, 0 and 2 worker processes) and unsplit."""
    tmp = tmp_path_factory.mktemp("wide")
    paths = _inputs(tmp / "in")
    convert(tmp / "in", tmp / "split", *_ARGS, "--worker_processes", 0)
    convert(tmp / "in", tmp / "split2", *_ARGS, "--worker_processes", 2)
    with pytest.MonkeyPatch.context() as mp:
        # A budget of whole scenes: every item a band of whole rows (the driver plans; the
        # writers only read what the plan says).
        mp.setattr(scenes, "_ITEM_BYTES", 1 << 40)
        convert(tmp / "in", tmp / "whole", *_ARGS, "--worker_processes", 0)
    return paths, tmp


def test_split_rows_give_the_patches_of_unsplit_rows_byte_for_byte(wide):
    paths, tmp = wide
    split, whole = _records(tmp / "split"), _records(tmp / "whole")
    assert sorted(split) == sorted(whole)
    assert [name for name in split if split[name][0] != whole[name][0]] == []
    # Split items are what the split run planned, unsplit ones the other's.
    entries = _cut_entries(tmp / "split")
    assert {e["path"].partition("#")[0] for e in entries if "patch_columns" in e["details"]} == {
        "scenes/tiled.tif", "scenes/striped.tif"}
    assert all("#patch_columns=" in e["path"] for e in entries)
    assert not any("patch_columns" in e["details"] for e in _cut_entries(tmp / "whole"))
    # Spread over the shards: the patches of one row of one scene land in more than one.
    row0 = {shard for name, (_, shard) in split.items() if name.startswith("scenes/tiled.tif#patch=0,")}
    assert len(row0) >= 2


def test_split_rows_hold_the_scenes_windows_and_are_the_same_with_worker_processes(wide):
    paths, tmp = wide
    assert _hashes(tmp / "split") == _hashes(tmp / "split2")
    options = PatchOptions(_PATCH, _STRIDE)
    manifest = schemas.Manifest.from_json((tmp / "split" / schemas.MANIFEST_FILENAME).read_text())
    schema = schemas.ImageExampleSchema.from_json(manifest.features)
    records = _records(tmp / "split")
    checked = 0
    for key, path in paths.items():
        with rasterio.open(path) as src:
            for y, x in grid(src.height, src.width, options):
                name = f"scenes/{path.name}#patch={y},{x}"
                if name not in records:
                    continue
                record = schema.decode(records[name][0])
                assert record[schemas.FORMAT.key] == b"raw-uint16"
                got = np.frombuffer(record[schemas.IMAGE.key], "<u2").reshape(_PATCH, _PATCH, 13)
                window = src.read(window=Window(x, y, _PATCH, _PATCH), boundless=True, fill_value=0)
                np.testing.assert_array_equal(got, np.moveaxis(window, 0, -1), err_msg=name)
                np.testing.assert_allclose(record[schemas.GEOTRANSFORM.key],
                                           src.window_transform(Window(x, y, 1, 1)).to_gdal(), atol=1e-6)
                checked += 1
    assert checked == len(records) > 0


def test_skipped_patches_and_the_summary_are_the_same_split_or_not(wide):
    paths, tmp = wide
    summaries = {}
    for run in ("split", "whole"):
        entries = _cut_entries(tmp / run)
        skipped = sorted((e["path"].partition("#")[0], *p) for e in entries for p in e["details"]["skipped"])
        written = sum(e["details"]["written"] for e in entries)
        manifest = json.loads((tmp / run / schemas.MANIFEST_FILENAME).read_text())
        summaries[run] = (skipped, written, manifest["patches"], manifest["counts"])
    assert summaries["split"] == summaries["whole"]
    skipped, written, patches, counts = summaries["split"]
    # Expected from the scene itself: patches of the tiled scene's nodata corner (share > 0.4).
    with rasterio.open(paths["tiled"]) as src:
        band = src.read(1)
    expected = []
    for y, x in grid(*band.shape, PatchOptions(_PATCH, _STRIDE)):
        window = np.zeros((_PATCH, _PATCH), bool)
        inside = band[y:y + _PATCH, x:x + _PATCH] == 0
        window[:inside.shape[0], :inside.shape[1]] = inside
        if window.mean() > _MAX_NODATA:
            expected.append(("scenes/tiled.tif", y, x))
    assert skipped == sorted(expected) and expected
    listed = patches.pop("listed")
    assert patches == {"scenes": 2, "written": written, "skipped_nodata": len(expected), "failed_items": 0}
    assert listed["scenes/tiled.tif"] == {"size": [420, 1400], "written": 14 - len(expected),
                                          "skipped_nodata": len(expected), "failed_items": 0}
    assert counts == {"found": 2, "written": 2, "rejected": 0, "skipped": 0}
    assert verify.main([str(tmp / "split")]) == 0


# --------------------------------------------------------------------------
# --resume


def test_resume_of_a_patch_conversion_rewrites_only_missing_shards_to_the_same_bytes(wide, tmp_path):
    _, tmp = wide
    root = tmp_path / "in"
    import shutil

    shutil.copytree(tmp / "in", root)
    (root / "scenes" / "broken.tif").write_bytes(b"II*\0" + b"\xff" * 60)  # Rejected at planning
    args = (*_ARGS, "--worker_processes", 0)
    reference = tmp_path / "reference"
    convert(root, reference, *args, "--max_reject_fraction", "0.5")
    out = tmp_path / "out"
    # 1 of 3 inputs rejected is over the default 0.1: every shard is written, then no manifest.
    with pytest.raises(Exception, match="max_reject_fraction"):
        convert(root, out, *args)
    assert not (out / schemas.MANIFEST_FILENAME).exists()
    shards = sorted(out.glob("*.tfrecord"))
    assert len(shards) == 3
    # As if the run had been killed before its last two shards landed.
    for gone in shards[1:]:
        gone.unlink()
    kept = {shards[0].name: shards[0].stat().st_mtime_ns}
    assert (out / TMP_DIRNAME).is_dir()
    convert(root, out, *args, "--max_reject_fraction", "0.5", "--resume")
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.tfrecord") if p.name in kept} == kept
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())
    for p in sorted(reference.iterdir()):
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name
    rejects = [json.loads(line) for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()]
    assert [(r["path"], r["reason"]) for r in rejects] == [("scenes/broken.tif", "corrupt")]


# --------------------------------------------------------------------------
# The reader's windows without copies


def test_windows_read_without_copying_equal_copied_windows_and_are_read_only(tmp_path):
    from imaging.patches import SceneReader

    array = _RNG.integers(0, 65536, (3, 300, 260), dtype=np.uint16)
    path = _scene(tmp_path / "t.tif", array, tiled=True, blockxsize=128, blockysize=128, compress="deflate")
    with rasterio.open(path) as src:
        expected = {w: np.moveaxis(src.read(window=Window(w[1], w[0], w[2], w[3]), boundless=True,
                                            fill_value=0), 0, -1)
                    for w in [(0, 0, 64, 64), (130, 140, 100, 100), (100, 100, 64, 64), (256, 0, 64, 64),
                              (280, 250, 40, 40)]}  # Inside a tile, across tiles, past the edges
    with SceneReader(path) as scene:
        for (y, x, h, w), want in expected.items():
            view = scene.read(y, x, h, w, copy=False)
            own = scene.read(y, x, h, w)
            np.testing.assert_array_equal(view, want)
            np.testing.assert_array_equal(own, want)
            assert own.flags.writeable and own.flags.owndata
        view = scene.read(0, 0, 64, 64, copy=False)
        assert not view.flags.writeable and not view.flags.owndata  # A view of the decoded tile
        with pytest.raises(ValueError):
            view[0, 0, 0] = 1
        scene.keep_columns(128, 256)
        np.testing.assert_array_equal(scene.read(0, 130, 64, 64, copy=False), _window(array, 0, 130, 64))
        with pytest.raises(ValueError, match="outside the columns kept, 128-256"):
            scene.read(0, 100, 64, 64)


def _window(array: np.ndarray, y: int, x: int, size: int) -> np.ndarray:
    return np.moveaxis(array[:, y:y + size, x:x + size], 0, -1)


# --------------------------------------------------------------------------
# Worker processes by default for large scenes


@pytest.mark.skipif((__import__("os").cpu_count() or 1) < 2, reason="the default needs 2 or more cores")
def test_large_scenes_are_cut_in_one_process_per_core_by_default():
    import os

    from beam_jobs import _runner, convert as convert_module
    from conversion import plan as _plan, shard_maker

    local = convert_module.ConvertOptions([])
    _runner.make_runner(local)

    def decide(asked, files, shards, options):  # As the driver asks, on its runner.
        return shard_maker.worker_processes(asked, files, shards, _runner.in_process_threads(options))

    def items(n, size):  # A scene's work items as planned: size = decoded bytes of its patches
        return [_plan.PlannedFile("train", 0, i, "s/scene.tif", "", size, 0, 8, patch_rows=f"{i},{i + 1}")
                for i in range(n)]

    assert decide(None, items(144, 6 << 20), 8, local) == min(os.cpu_count(), 8)  # 864 MiB of patches
    assert decide(None, items(4, 1 << 20), 8, local) == 0  # 4 MiB: not worth a process's start
    assert decide(None, items(144, 6 << 20), 1, local) == 0  # One shard: one writer
    assert decide(0, items(144, 6 << 20), 8, local) == 0  # What is asked for is what runs
    listed = [_plan.PlannedFile("train", 0, 0, "s/scene.tif", "", 3 << 30, 0, 1)]
    assert decide(None, listed, None, local) == 0  # Listed, not planned: a file, whatever its size


def test_verify_checks_patches_against_the_columns_of_the_items_cut(wide, tmp_path):
    import shutil

    _, tmp = wide
    out = tmp_path / "tampered"
    shutil.copytree(tmp / "split", out)
    lines = (out / schemas.NORMALIZED_FILENAME).read_text().splitlines()
    # One column range of the tiled scene's first rows listed as failed, its patches still stored.
    k = next(i for i, line in enumerate(lines) if "scenes/tiled.tif#patch_rows=0," in line
             and "#patch_columns=" in line and "cut_into_patches" in line and '"written": 0' not in line)
    entry = json.loads(lines[k])
    entry["actions"] = ["patch_rows_failed"]
    entry["details"] = {"patch_rows": entry["details"]["patch_rows"],
                        "patch_columns": entry["details"]["patch_columns"], "reason": "corrupt", "message": "x"}
    lines[k] = json.dumps(entry)
    (out / schemas.NORMALIZED_FILENAME).write_text("\n".join(lines) + "\n")
    report = verify.run([str(out)])
    assert not report["ok"]
    x0, x1 = entry["details"]["patch_columns"]
    problems = "\n".join(map(str, report["problems"]))
    assert "scenes/tiled.tif: patches" in problems and "lie in rows of no work item that was cut" in problems
    assert f"0,{x0}" in problems, problems
    assert "scenes/striped.tif" not in problems
