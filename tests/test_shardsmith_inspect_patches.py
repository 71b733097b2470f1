"""`shardsmith inspect` of a dataset of scene patches: the grid, the totals, the first scenes and their counts.

23 small GDAL-written scenes (some with nodata blocks) and one large scene
whose later band of patch rows is damaged (a corrupt tile): its first work
item is written, the second fails. Counts are computed here with numpy.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
import tifffile  # noqa: E402
from rasterio.transform import from_origin  # noqa: E402

import schemas  # noqa: E402
from beam_jobs import verify  # noqa: E402
from helpers import convert, write_geotiff  # noqa: E402
from shardsmith import cli  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")

_RNG = np.random.default_rng(2526)
_PATCH = 32
_SMALL = 23
_BIG = "big/big.tif"
# 80 patches of 13 float64 bands (8.3 MiB): two work items of patch rows, the second from row 224.
_BIG_SHAPE = (13, 256, 320)


def _scene(path: pathlib.Path, array: np.ndarray, nodata=None, **profile) -> pathlib.Path:
    """A GeoTIFF of (bands, height, width) written by GDAL."""
    return write_geotiff(path, array, nodata, crs="EPSG:32633", transform=from_origin(300000.0, 5000000.0, 10.0, 10.0), **profile)


def _starts(length: int) -> list[int]:
    """Patch starts under 'shift' with stride = patch."""
    starts = list(range(0, length - _PATCH + 1, _PATCH))
    return starts + [length - _PATCH] if starts[-1] + _PATCH < length else starts


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect_patches") / "in"
    counts = {}  # rel -> (height, width, written, skipped)
    for i in range(_SMALL):
        array = _RNG.integers(1, 256, (1, 80, 80 + i), dtype=np.uint8)
        array[:, : 16 * (i % 4), :] = 0  # 0, 16, 32 or 48 rows of nodata.
        rel = f"s/scene_{i:02d}.tif"
        _scene(root / rel, array, nodata=0, tiled=False, blockysize=8, compress="lzw")
        skipped = 0
        for y in _starts(80):
            for x in _starts(80 + i):
                skipped += (array[0, y:y + _PATCH, x:x + _PATCH] == 0).mean() > 0.5
        patches = len(_starts(80)) * len(_starts(80 + i))
        counts[rel] = (80, 80 + i, patches - skipped, skipped)
    big = np.broadcast_to(np.arange(_BIG_SHAPE[2], dtype=np.float64), _BIG_SHAPE)
    _scene(root / _BIG, np.ascontiguousarray(big), tiled=True, blockxsize=32, blockysize=32, compress="deflate")
    with tifffile.TiffFile(root / _BIG) as tif:
        page = tif.pages[0]
        across = -(-page.imagewidth // page.tilewidth)
        damaged = int(page.dataoffsets[7 * across])  # The first tile of rows 224-255: the second item's.
    with open(root / _BIG, "r+b") as f:
        f.seek(damaged)
        f.write(b"\xff" * 16)  # No zlib header: the tile does not decode.
    out = root.parent / "out"
    manifest = convert(root, out, "--raster_patch", _PATCH, "--raster_max_nodata", 0.5)
    return out, manifest, counts


def _work_items(out):
    """{scene: (cut items, failed items)} from normalized.jsonl."""
    items = {}
    for line in (out / schemas.NORMALIZED_FILENAME).read_text().splitlines():
        entry = json.loads(line)
        scene, _, rows = entry["path"].partition("#patch_rows=")
        if rows:
            cut, failed = items.setdefault(scene, ([], []))
            (failed if "patch_rows_failed" in entry["actions"] else cut).append(entry["details"])
    return items


def test_the_large_scene_has_a_failed_work_item_and_verify_still_passes(dataset):
    out, manifest, _ = dataset
    cut, failed = _work_items(out)[_BIG]
    assert len(cut) == 1 and len(failed) == 1 and failed[0]["reason"] == "corrupt"
    assert manifest.extra["patches"]["failed_items"] == 1
    # The failed rows' patches are missing, as listed: nothing for verify to object to.
    assert verify.main([str(out)]) == 0


def test_inspect_lists_the_first_scenes_with_their_counts(dataset, capsys):
    out, manifest, counts = dataset
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    cut, _ = _work_items(out)[_BIG]
    big_written = cut[0]["written"]
    assert big_written == len([y for y in _starts(_BIG_SHAPE[1]) if y < cut[0]["patch_rows"][1]]) \
        * len(_starts(_BIG_SHAPE[2]))
    written = sum(c[2] for c in counts.values()) + big_written
    skipped = sum(c[3] for c in counts.values())
    assert skipped > 0
    assert (f"patches: {_PATCH}x{_PATCH} px (height x width), stride {_PATCH}x{_PATCH}, edge shift, max nodata "
            f"share 0.5; {_SMALL + 1} scenes: {written:,} patches written, {skipped:,} skipped (nodata), "
            f"1 work item failed") in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()
            if line.startswith(("big/", "s/scene_"))}
    # 20 scenes shown, in path order: big/big.tif first, then 19 small ones.
    assert list(rows) == [_BIG] + [f"s/scene_{i:02d}.tif" for i in range(19)]
    assert rows[_BIG] == [f"{_BIG_SHAPE[1]}x{_BIG_SHAPE[2]}", f"{big_written:,}", "0", "1"]
    for rel, cells in rows.items():
        if rel != _BIG:
            h, w, n, s = counts[rel]
            assert cells == [f"{h}x{w}", str(n), str(s), "0"], rel
    assert f"... and {_SMALL + 1 - 20} more scenes" in text
    assert "1 work item of scenes failed, their patches missing" in text
    # The manifest lists every scene here (fewer than its limit of 100), the same counts.
    listed = manifest.extra["patches"]["listed"]
    assert len(listed) == _SMALL + 1
    assert listed["s/scene_22.tif"] == {"size": [80, 102], "written": counts["s/scene_22.tif"][2],
                                        "skipped_nodata": counts["s/scene_22.tif"][3], "failed_items": 0}
