"""Conversion and verification on a real Dask cluster of two workers on 127.0.0.1.

The fixture starts `dask scheduler` and two `dask worker` processes from this
interpreter's bin folder, each in a process group of its own, and kills those
groups when the module is done, whatever happened.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import pathlib
import re
import shutil

import distributed  # shardsmith[dask]; the test extra has it.
import numpy as np
import pytest
import rasterio
from rasterio.transform import from_origin
from rasterio.windows import Window

from helpers import (add_faulty_files, encode, faulty_plugin, make_class_tree, pixels, read_records, write,
                     write_geotiff)

import schemas
from beam_jobs import convert as convert_module
from beam_jobs import verify as verify_module
from devtools.local_dask import LocalDaskCluster
from schemas.tfrecord import iter_records

_LOG = logging.getLogger(__name__)
_START_TIMEOUT_S = 120  # Two workers that each import TensorFlow, on a busy 2-core machine.
_ARGS = ("--split", "train=0.6,validation=0.4", "--seed", "7", "--max_reject_fraction", "0.5")


@dataclasses.dataclass
class Cluster:
    """What the tests get of the cluster.

    Attributes:
      address: The scheduler's tcp:// address.
      client: A client connected to it.
      worker_logs: Output files of the two worker process groups.
      pgids: Process groups of everything started (scheduler, workers).
    """

    address: str
    client: "distributed.Client"
    worker_logs: list[pathlib.Path]
    pgids: set[int]

    def log_sizes(self) -> list[int]:
        return [p.stat().st_size for p in self.worker_logs]

    def shards_written(self, since: list[int]) -> dict[int, list[str]]:
        """{pid: [shard names]} from the workers' "Wrote ..." lines after `since`."""
        written = collections.defaultdict(list)
        for path, offset in zip(self.worker_logs, since):
            with open(path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
            for pid, name in re.findall(r"^(\d+) shardsmith\.convert INFO Wrote (\S+):", text, re.M):
                written[int(pid)].append(name)
        return dict(written)


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """A `Cluster` of a scheduler and two workers on 127.0.0.1."""
    local = LocalDaskCluster(
        2, tmp_path_factory.mktemp("dask"), name_prefix="shardsmith-test",
        start_timeout=_START_TIMEOUT_S,
        # Workers print shardsmith's lines ("Wrote <shard>: ..."), each with its pid.
        env={"DASK_LOGGING__SHARDSMITH": "info",
             "DASK_DISTRIBUTED__ADMIN__LOG_FORMAT": "%(process)d %(name)s %(levelname)s %(message)s",
             # A Pillow plugin that fails on made-up files only (`test_a_file_that_crashes...`).
             "PYTHONPATH": str(faulty_plugin(tmp_path_factory.mktemp("plugin")))},
    )
    try:
        local.start()
    except RuntimeError as e:  # Did not start; the message holds the logs' tails.
        pytest.fail(str(e))
    try:
        with distributed.Client(local.address, timeout=_START_TIMEOUT_S) as client:
            yield Cluster(local.address, client, local.worker_logs, local.pgids)
    finally:
        local.stop()


@pytest.fixture(scope="module")
def dataset_input(tmp_path_factory):
    """A class tree with a reject, a hidden file and an image that gets normalised."""
    root = tmp_path_factory.mktemp("dask_input") / "images"
    make_class_tree(root, per_class=8)
    write(root / "cat" / "truncated.jpg", encode(pixels(1), "JPEG")[:200])
    write(root / "dog" / ".DS_Store", b"\0" * 16)
    write(root / "fish" / "alpha.png", encode(pixels(2, mode="RGBA"), "PNG"))
    return root


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_convert_and_verify_on_dask_match_local_runner(dask_cluster, dataset_input, tmp_path):
    cluster = dask_cluster
    local_out, dask_out = tmp_path / "local", tmp_path / "dask"
    convert_module.run(["--input_dir", str(dataset_input), "--output_dir", str(local_out), *_ARGS])

    before = cluster.log_sizes()
    convert_module.run([
        "--input_dir", str(dataset_input), "--output_dir", str(dask_out), *_ARGS,
        "--runner", "DaskRunner", "--dask_client_address", cluster.address,
    ])

    # Every shard was written by a worker process of the groups this module
    # started, not by this test process.
    manifest = schemas.Manifest.from_json((local_out / schemas.MANIFEST_FILENAME).read_text())
    shards = sorted(s.file for info in manifest.splits.values() for s in info.shards)
    written = cluster.shards_written(before)
    assert sorted(name for names in written.values() for name in names) == shards
    worker_pids = set(cluster.client.run(os.getpid).values())
    assert set(written) <= worker_pids and os.getpid() not in written
    assert {os.getpgid(pid) for pid in written} <= cluster.pgids
    _LOG.info("shards written by %d of 2 workers: %s", len(written),
              {pid: len(names) for pid, names in written.items()})

    # Byte for byte the local runner's dataset: shards, indexes, rejects, manifest.
    local, on_dask = _files(local_out), _files(dask_out)
    assert sorted(on_dask) == sorted(local)
    assert [name for name in local if on_dask[name] != local[name]] == []
    assert set(manifest.splits) == {"train", "validation"}
    assert manifest.counts["rejected"] == 1 and manifest.counts["skipped"] == 1
    assert manifest.normalized == {"flatten_alpha": 1}

    report = verify_module.run([str(dask_out), "--runner", "DaskRunner", "--dask_client_address",
                                cluster.address])
    assert report["ok"], report["problems"]
    assert report["records"] == manifest.counts["written"]
    local_report = verify_module.run([str(local_out)])
    assert {k: v for k, v in report.items() if k != "report_path"} == {
        k: v for k, v in local_report.items() if k != "report_path"
    }


def test_worker_error_reaches_the_caller(dask_cluster, dataset_input, tmp_path):
    """Too many rejects: the ConversionError raised on a worker fails the run here."""
    out = tmp_path / "out"
    with pytest.raises(Exception, match="max_reject_fraction"):
        convert_module.run([
            "--input_dir", str(dataset_input), "--output_dir", str(out), "--max_reject_fraction", "0",
            "--runner", "DaskRunner", "--dask_client_address", dask_cluster.address,
            "--dask_partition_size", "5",
        ])
    assert not (out / schemas.MANIFEST_FILENAME).exists()


def test_a_file_that_raises_crashes_or_hangs_a_worker_costs_that_file_only(dask_cluster, dataset_input, tmp_path):
    """Each Dask worker writes its shards in child processes of its own: its decoder's crash is theirs."""
    root = tmp_path / "images"
    shutil.copytree(dataset_input, root)
    faulty = add_faulty_files(root, "dog")
    out = tmp_path / "out"
    workers = set(dask_cluster.client.run(os.getpid).values())
    convert_module.run([
        "--input_dir", str(root), "--output_dir", str(out), *_ARGS, "--file_timeout", "4",
        "--runner", "DaskRunner", "--dask_client_address", dask_cluster.address,
    ])
    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    rejects = {r["path"]: r["reason"] for r in map(json.loads, (out / schemas.REJECTS_FILENAME).read_text().splitlines())}
    expected = {"RAISE": "internal_error", "SEGV": "decoder_crashed", "HANG": "timeout"}
    assert {p: r for p, r in rejects.items() if p in faulty} == {p: expected[k] for p, k in faulty.items()}
    assert manifest.counts["written"] == len(list(dataset_input.rglob("*.*"))) - 2  # truncated.jpg, .DS_Store
    # The same two workers still serve: none died with its file.
    assert set(dask_cluster.client.run(os.getpid).values()) == workers


def test_masks_and_boxes_together_on_dask_match_the_local_runner(dask_cluster, tmp_path):
    """Targets of two kinds in one dataset (a mask and COCO boxes per image), written by the
    cluster's workers: the same bytes as the local runner's, verified on the cluster."""
    from PIL import Image

    images, masks = tmp_path / "images", tmp_path / "masks"
    entries, annotations = [], []
    for k in range(12):
        h, w = 24 + k, 32
        write(images / f"img{k:02d}.png", encode(pixels(k, size=(h, w)), "PNG"))
        ids = np.zeros((h, w), np.uint8)
        ids[h // 2:, :] = 1 + k % 3
        masks.mkdir(exist_ok=True)
        Image.fromarray(ids).save(masks / f"img{k:02d}.png")
        entries.append({"id": k, "file_name": f"img{k:02d}.png", "width": w, "height": h})
        annotations.append({"id": 100 + k, "image_id": k, "category_id": 5 + k % 2,
                            "bbox": [2, 3, 10, 8 + k % 4], "iscrowd": 0, "area": 80})
    coco = tmp_path / "instances.json"
    coco.write_text(json.dumps({"images": entries, "annotations": annotations,
                                "categories": [{"id": 5, "name": "crack"}, {"id": 6, "name": "dent"}]}))
    args = ["--input_dir", str(images), "--masks_dir", str(masks), "--annotations", str(coco),
            "--split", "train=0.5,validation=0.5", "--min_shards", "3", "--seed", "1"]
    local_out, dask_out = tmp_path / "local", tmp_path / "dask"
    convert_module.run([*args, "--output_dir", str(local_out)])
    convert_module.run([*args, "--output_dir", str(dask_out), "--runner", "DaskRunner",
                        "--dask_client_address", dask_cluster.address])
    local, on_dask = _files(local_out), _files(dask_out)
    assert sorted(on_dask) == sorted(local)
    assert [name for name in local if on_dask[name] != local[name]] == []
    manifest = schemas.Manifest.from_json((dask_out / schemas.MANIFEST_FILENAME).read_text())
    assert manifest.counts["written"] == 12
    assert sorted(manifest.targets) == ["boxes", "mask"]
    assert sum(sum(c) for c in manifest.targets["boxes"]["counts"].values()) == 12
    records = read_records(dask_out)
    assert all(schemas.MASK.key in r and len(r[schemas.BBOX_LABEL.key]) == 1 for r in records)
    report = verify_module.run([str(dask_out), "--runner", "DaskRunner", "--dask_client_address",
                                dask_cluster.address])
    assert report["ok"], report["problems"]


def _scene(path: pathlib.Path, array: np.ndarray, nodata=None, **profile) -> pathlib.Path:
    """A GeoTIFF of (bands, height, width) written by GDAL."""
    return write_geotiff(path, array, nodata, crs="EPSG:32631", transform=from_origin(400000.0, 5000000.0, 10.0, 10.0), **profile)


@pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")
def test_a_patch_conversion_on_dask_gives_the_local_runners_bytes(dask_cluster, tmp_path):
    """Scenes cut into patches (work items of patch rows and of column ranges) by the cluster's
    workers: the local runner's bytes, each patch rasterio's window."""
    address = dask_cluster.address
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


def test_volumes_on_dask_give_the_local_runners_bytes(dask_cluster, tmp_path):
    """`convert --volumes` (issue 36) on the cluster's workers: the DirectRunner's shards, byte for byte."""
    from test_imaging_volumes import write_series

    for i, orientation in enumerate(["axial", "oblique", "sagittal"]):
        write_series(tmp_path / "in" / ("a" if i < 2 else "b") / f"p{i}", count=3 + i, orientation=orientation)
    args = ["--volumes", "--input_dir", str(tmp_path / "in"), "--split", "train=0.5,validation=0.5"]
    local_out, dask_out = tmp_path / "local", tmp_path / "dask"
    convert_module.run([*args, "--output_dir", str(local_out)])
    convert_module.run([*args, "--output_dir", str(dask_out), "--runner", "DaskRunner",
                        "--dask_client_address", dask_cluster.address])
    local, on_dask = _files(local_out), _files(dask_out)
    assert sorted(on_dask) == sorted(local) and "volumes.json" in local
    assert [name for name in local if on_dask[name] != local[name]] == []
    manifest = json.loads(local["volumes.json"])
    assert sum(s["records"] for s in manifest["splits"].values()) == 3


def test_a_time_series_conversion_on_dask_gives_the_local_runners_bytes(dask_cluster, tmp_path):
    """Locations of dated passes stacked by the cluster's workers (--time_series, whole and in
    patches): the local runner's bytes."""
    rng = np.random.default_rng(37)
    for cls in ("corn", "wheat"):
        for k in range(3):
            for date in ("2020-05-14", "2020-06-01", "2020-07-04"):
                _scene(tmp_path / "in" / cls / f"field_{k}" / f"{date}_B04.tif",
                       rng.integers(1, 9000, (1, 40, 30), dtype=np.uint16))
                _scene(tmp_path / "in" / cls / f"field_{k}" / f"{date}_B08.tif",
                       rng.integers(1, 9000, (1, 40, 30), dtype=np.uint16))
    for extra in ([], ["--raster_patch", "16", "--raster_edge", "pad"]):
        args = ["--input_dir", str(tmp_path / "in"), "--time_series", "--num_shards", "3", *extra]
        local_out, dask_out = tmp_path / f"local{len(extra)}", tmp_path / f"dask{len(extra)}"
        convert_module.run([*args, "--output_dir", str(local_out)])
        convert_module.run([*args, "--output_dir", str(dask_out), "--runner", "DaskRunner",
                            "--dask_client_address", dask_cluster.address])
        local, on_dask = _files(local_out), _files(dask_out)
        assert sorted(on_dask) == sorted(local)
        assert [name for name in local if on_dask[name] != local[name]] == []
        manifest = schemas.Manifest.from_json((dask_out / schemas.MANIFEST_FILENAME).read_text())
        assert manifest.counts["written"] == 36
        assert manifest.splits["train"].num_records == (6 if not extra else 6 * 3 * 2)


def test_append_on_dask_matches_the_local_runner(dask_cluster, dataset_input, tmp_path):
    """convert --append on the Dask cluster: the new version's shards are the local runner's, byte for byte."""
    root = tmp_path / "images"
    shutil.copytree(dataset_input, root)
    outs = {"local": tmp_path / "local", "dask": tmp_path / "dask"}
    # Version 1 of both by the local runner: one conversion, copied (conversions are deterministic;
    # tests/golden_hashes.json holds them to it), so that both append to the same bytes.
    convert_module.run(["--input_dir", str(root), "--output_dir", str(outs["local"]), *_ARGS])
    shutil.copytree(outs["local"], outs["dask"])
    for i in range(5):
        write(root / "eel" / f"e_{i}.jpg", encode(pixels(80 + i), "JPEG", quality=90))
    convert_module.run(["--input_dir", str(root), "--output_dir", str(outs["local"]), *_ARGS, "--append"])
    convert_module.run(["--input_dir", str(root), "--output_dir", str(outs["dask"]), *_ARGS, "--append",
                        "--runner", "DaskRunner", "--dask_client_address", dask_cluster.address])
    local, on_dask = _files(outs["local"]), _files(outs["dask"])
    assert sorted(on_dask) == sorted(local)
    new = [n for n in local if "_v00002-" in n]
    assert new and [n for n in new if on_dask[n] != local[n]] == []
    manifest = schemas.Manifest.from_json(on_dask[schemas.MANIFEST_FILENAME].decode())
    assert manifest.latest_version == 2 and manifest.class_names[-1] == "eel"
    # The 5 new files; the truncated JPEG version 1 rejected is tried again (and rejected again).
    assert manifest.versions[1].inputs["new"] == 5 and manifest.versions[1].inputs["retried"] == 1
    assert manifest.rejects == {"corrupt": 1, "hidden_file": 1}


def test_a_volume_append_by_csv_rows_with_dedup_on_dask_gives_the_local_runners_bytes(dask_cluster, tmp_path):
    """`convert --volumes --append --labels_csv --dedup`: planned against the held dataset (its rows,
    its content digests) in the driver, written on the cluster's workers: the local runner's files."""
    from test_imaging_volumes import write_series

    scans, csv = tmp_path / "in", tmp_path / "labels.csv"
    rows = ["site1/p0,a,train", "site1/p1,b,validation", "site2/p2,a,validation"]
    for i, unit in enumerate(("site1/p0", "site1/p1", "site2/p2")):
        write_series(scans / unit, count=3 + i)
    csv.write_text("path,label,split\n" + "\n".join(rows) + "\n")
    args = ["--volumes", "--input_dir", str(scans), "--labels_csv", str(csv), "--dedup", "--append"]
    outs = {"local": tmp_path / "local", "dask": tmp_path / "dask"}
    # Version 1 by the local runner, copied: both append to the same bytes.
    convert_module.run([*args, "--output_dir", str(outs["local"])])
    shutil.copytree(outs["local"], outs["dask"])
    # A new row of a new class, and a row naming a copy of a held series.
    write_series(scans / "site3" / "p3", count=4, orientation="oblique")
    shutil.copytree(scans / "site1" / "p0", scans / "site3" / "copy_of_p0")
    csv.write_text(csv.read_text() + "site3/p3,c,train\nsite3/copy_of_p0,b,train\n")
    convert_module.run([*args, "--output_dir", str(outs["local"])])
    convert_module.run([*args, "--output_dir", str(outs["dask"]), "--runner", "DaskRunner",
                        "--dask_client_address", dask_cluster.address])
    local, on_dask = _files(outs["local"]), _files(outs["dask"])
    assert sorted(on_dask) == sorted(local)
    # The metadata files record when each version was written, and nothing else differs in them.
    stamped = ("manifest.json", "volumes.json")
    assert [name for name in local if name not in stamped and on_dask[name] != local[name]] == []
    for name in stamped:
        assert _untimed(json.loads(on_dask[name])) == _untimed(json.loads(local[name])), name
    rejects = [json.loads(line) for line in local[schemas.REJECTS_FILENAME].decode().splitlines()]
    # One line per file of the copy (3 slices).
    assert [(r["reason"], r["message"]) for r in rejects] == [
        ("duplicate", "site3/copy_of_p0: same content as site1/p0, held by version 1")] * 3
    volumes = json.loads(local["volumes.json"])
    assert sum(s["records"] for s in volumes["splits"].values()) == 4


def _untimed(value):
    """A JSON value without its "time" entries (when a version was written), at any depth."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k != "time"}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value
