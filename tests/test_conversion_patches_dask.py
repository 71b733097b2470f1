"""Scenes cut into patches on a real Dask cluster of two workers on 127.0.0.1: the local runner's bytes.

The cluster (`devtools.local_dask.LocalDaskCluster`) is a scheduler and two
`dask worker` processes started from this interpreter's bin folder, each in a
process group of its own, stopped when the module is done.
"""

from __future__ import annotations

import json
import pathlib

import distributed  # shardsmith[dask]; the test extra has it.
import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402
from rasterio.windows import Window  # noqa: E402

import schemas  # noqa: E402
from beam_jobs import convert as convert_module  # noqa: E402
from devtools.local_dask import LocalDaskCluster  # noqa: E402
from schemas.tfrecord import iter_records  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")

_START_TIMEOUT_S = 120  # Two workers on a busy 2-core machine.


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The scheduler's address of a two-worker cluster on 127.0.0.1."""
    local = LocalDaskCluster(2, tmp_path_factory.mktemp("dask"), name_prefix="shardsmith-patches",
                             start_timeout=_START_TIMEOUT_S)
    try:
        local.start()
    except RuntimeError as e:  # Did not start; the message holds the logs' tails.
        pytest.fail(str(e))
    try:
        with distributed.Client(local.address, timeout=_START_TIMEOUT_S) as client:
            yield local.address, client
    finally:
        local.stop()


def _scene(path: pathlib.Path, array: np.ndarray, nodata=None, **profile) -> pathlib.Path:
    bands, height, width = array.shape
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(path, "w", driver="GTiff", height=height, width=width, count=bands,
                       dtype=array.dtype.name, nodata=nodata, crs="EPSG:32631",
                       transform=from_origin(400000.0, 5000000.0, 10.0, 10.0), **profile) as dst:
        dst.write(array)
    return path


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_patch_conversion_on_dask_gives_the_local_runners_bytes(cluster, tmp_path):
    address, client = cluster
    rng = np.random.default_rng(77)
    # 13 uint16 bands, rows of 256-px patches over the 8 MiB budget: items of column ranges.
    wide = rng.integers(1, 65536, (13, 300, 1300), dtype=np.uint16)
    wide[:, :150, :600] = 0
    _scene(tmp_path / "in" / "a" / "wide.tif", wide, nodata=0, tiled=True, blockxsize=256, blockysize=256,
           compress="deflate")
    small = rng.normal(0, 1, (4, 200, 180)).astype(np.float32)
    _scene(tmp_path / "in" / "b" / "small.tif", small, tiled=False, blockysize=32, compress="zstd")
    args = ["--input_dir", str(tmp_path / "in"), "--raster_patch", "256", "--raster_stride", "200",
            "--raster_max_nodata", "0.5", "--raster_georef", "--num_shards", "3", "--seed", "3"]
    local_out, dask_out = tmp_path / "local", tmp_path / "dask"
    convert_module.run([*args, "--output_dir", str(local_out)])
    convert_module.run([*args, "--output_dir", str(dask_out), "--runner", "DaskRunner",
                        "--dask_client_address", address])
    local, on_dask = _files(local_out), _files(dask_out)
    assert sorted(on_dask) == sorted(local)
    assert [name for name in local if on_dask[name] != local[name]] == []
    # What was compared holds the scenes' patches. The wide scene: rows 0, 44 (shift) x columns
    # 0, 200, ..., 1000, 1044; (0, 0) and (0, 200) are 59% nodata, skipped. The small one: one
    # padded patch, 45% padding, kept.
    manifest = schemas.Manifest.from_json((dask_out / schemas.MANIFEST_FILENAME).read_text())
    assert {k: v for k, v in manifest.extra["patches"].items() if k != "listed"} == {
        "scenes": 2, "written": 13, "skipped_nodata": 2, "failed_items": 0}
    entries = [json.loads(line) for line in (dask_out / schemas.NORMALIZED_FILENAME).read_text().splitlines()]
    assert any("#patch_columns=" in e["path"] for e in entries)
    schema = schemas.ImageExampleSchema.from_json(manifest.features)
    records = {}
    for shard in manifest.splits["train"].shards:
        with open(dask_out / shard.file, "rb") as f:
            for _, _, payload in iter_records(f):
                record = schema.decode(payload)
                records[record[schemas.FILENAME.key].decode()] = record
    assert len(records) == 13 and "a/wide.tif#patch=0,0" not in records
    with rasterio.open(tmp_path / "in" / "a" / "wide.tif") as src:
        for name, record in records.items():
            if name.startswith("a/wide.tif#patch="):
                y, x = map(int, name.rpartition("=")[2].split(","))
                window = src.read(window=Window(x, y, 256, 256))
                got = np.frombuffer(record[schemas.IMAGE.key], "<u2").reshape(256, 256, 13)
                np.testing.assert_array_equal(got, np.moveaxis(window, 0, -1), err_msg=name)
