"""Files on disk written by GDAL -> `convert --time_series` on Beam's DirectRunner ->
`readers.time_series_dataset_from_tfrecords` -> every value and date compared with rasterio's read."""

import csv
import datetime
import json
import re

import numpy as np
import pytest

import schemas
from helpers import convert, write_geotiff

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402

_EPOCH = datetime.date(1970, 1, 1)


def _days(iso):
    return (datetime.date.fromisoformat(iso) - _EPOCH).days


def _values(seed, bands=3, height=10, width=8, dtype="uint16"):
    return np.random.default_rng(seed).integers(1, 30000, size=(bands, height, width)).astype(dtype)


def _read(*paths):
    """(height, width, bands) of one date, as rasterio reads its files (band files in the given order)."""
    planes = []
    for path in paths:
        with rasterio.open(path) as src:
            planes.append(src.read())
    return np.transpose(np.concatenate(planes), (1, 2, 0))


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Two classes of locations in every layout users keep, and every way a pass goes wrong."""
    root = tmp_path_factory.mktemp("passes")
    expected = {}  # location -> ([(iso date, [paths])], label name)
    # One multi-band file per date, Sentinel-2 product names (processing dates later, out of order).
    loc = root / "wheat" / "s2_field"
    names = {"2020-07-14": "S2B_MSIL2A_20200714T103629_N0214_R008_T31TFJ_20200714T124004.tif",
             "2020-05-14": "S2A_MSIL2A_20200514T103629_N0214_R008_T31TFJ_20200901T124004.tif",
             "2020-06-04": "S2A_MSIL2A_20200604T103629_N0214_R008_T31TFJ_20200604T124004.tif"}
    for i, (date, name) in enumerate(names.items()):
        write_geotiff(loc / name, _values(i, bands=4), crs="EPSG:32631")
    expected["wheat/s2_field"] = ([(d, [loc / names[d]]) for d in sorted(names)], "wheat")
    # One file per band and date, Landsat names; one date misses a band.
    loc = root / "corn" / "landsat_tile"
    dates = []
    for d, date in enumerate(["20200601", "20200517", "20200703"]):
        files = []
        for b, band in enumerate(["SR_B5", "SR_B4", "SR_B10"]):
            if (date, band) == ("20200703", "SR_B10"):
                continue
            files.append(write_geotiff(loc / f"LC08_L2SP_198030_{date}_20200820_02_T1_{band}.TIF",
                                       _values(10 * d + b, bands=1)))
        if date != "20200703":
            iso = f"{date[:4]}-{date[4:6]}-{date[6:]}"
            by_band = {p.name.rsplit("_", 1)[-1][:-4]: p for p in files}
            dates.append((iso, [by_band["B4"], by_band["B5"], by_band["B10"]]))
    expected["corn/landsat_tile"] = (sorted(dates), "corn")
    # Dates only in the TIFF tag; a shifted date, a date in the next UTM zone, a duplicate date.
    loc = root / "corn" / "tagged"
    for name, stamp, seed in (("pass_a.tif", "2021:03:09 10:00:00", 40), ("pass_b.tif", "2021:01:30 10:00:00", 41)):
        write_geotiff(loc / name, _values(seed))
        with rasterio.open(loc / name, "r+") as dst:
            dst.update_tags(TIFFTAG_DATETIME=stamp)
    write_geotiff(loc / "2021-02-10.tif", _values(42), transform=from_origin(300005.0, 5000000.0, 10.0, 10.0))
    write_geotiff(loc / "2021-02-20.tif", _values(43), crs="EPSG:32634")
    write_geotiff(loc / "2021-04-01.tif", _values(44))
    write_geotiff(loc / "2021-04-01_copy.tif", _values(45))
    write_geotiff(loc / "undated.tif", _values(46))
    (loc / "readme.txt").write_text("not a pass")
    expected["corn/tagged"] = ([("2021-01-30", [loc / "pass_b.tif"]), ("2021-03-09", [loc / "pass_a.tif"])], "corn")
    return root, expected


def test_every_stack_is_rasterios_read_in_date_order_and_every_file_is_accounted_for(layouts, tmp_path):
    root, expected = layouts
    out = tmp_path / "out"
    manifest = convert(root, out, "--time_series", "--max_reject_fraction", "1")
    assert manifest.class_names == ("corn", "wheat")
    # Written + rejected + skipped = every file found.
    assert manifest.counts == {"found": 19, "written": 11, "rejected": 7, "skipped": 1}
    rejects = {json.loads(line)["path"]: json.loads(line)["reason"]
               for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()}
    assert rejects == {
        "corn/landsat_tile/LC08_L2SP_198030_20200703_20200820_02_T1_SR_B4.TIF": "missing_band",
        "corn/landsat_tile/LC08_L2SP_198030_20200703_20200820_02_T1_SR_B5.TIF": "missing_band",
        "corn/tagged/2021-02-10.tif": "misaligned",
        "corn/tagged/2021-02-20.tif": "misaligned",
        "corn/tagged/2021-04-01.tif": "conflicting_dates",
        "corn/tagged/2021-04-01_copy.tif": "conflicting_dates",
        "corn/tagged/undated.tif": "no_date",
        "corn/tagged/readme.txt": "not_a_raster",
        # The misaligned and conflicting files of wheat are none; the rest of these:
    }
    section = manifest.extra[schemas.TIME_SERIES]
    assert section["locations"]["corn/tagged"]["kept"] == ["2021-01-30", "2021-03-09"]
    assert section["locations"]["corn/tagged"]["dropped"]["2021-02-20"]["reason"] == "misaligned"
    assert "EPSG:32634" in section["locations"]["corn/tagged"]["dropped"]["2021-02-20"]["message"]

    import readers
    import tensorflow as tf

    ds = readers.time_series_dataset_from_tfrecords(
        out, batch_size=None, dtype=None, shuffle=False,
        extra_features=("filename", "stack/dates", "stack/bands", "epsg", "geotransform"))
    seen = set()
    for stack, label, extras in ds:
        location = extras["filename"].numpy().decode()
        seen.add(location)
        dates, class_name = expected[location]
        assert stack.dtype == tf.uint16
        np.testing.assert_array_equal(stack.numpy(), np.stack([_read(*paths) for _, paths in dates]))
        assert extras["stack/dates"].numpy().tolist() == [_days(d) for d, _ in dates]
        assert manifest.class_names[label.numpy()] == class_name
        with rasterio.open(dates[0][1][0]) as src:
            assert extras["epsg"].numpy() == src.crs.to_epsg()
            assert tuple(extras["geotransform"].numpy()) == tuple(src.transform.to_gdal())
    assert seen == set(expected)
    bands = {rec[schemas.FILENAME.key].decode(): rec[schemas.STACK_BANDS.key] for rec in _records(out)}
    assert bands["corn/landsat_tile"] == (b"SR_B4", b"SR_B5", b"SR_B10")
    assert bands["wheat/s2_field"] == (b"1", b"2", b"3", b"4")
    # verify re-reads every stack: values fill their shapes, dates ascend, band statistics agree.
    from beam_jobs import verify as verify_module

    report = verify_module.run([str(out)])
    assert report["ok"], report
    assert report["records"] == 3


def _records(out, split=None):
    from schemas.tfrecord import iter_records

    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    schema = schemas.TimeSeriesExampleSchema.from_json(manifest.features)
    for name, info in manifest.splits.items():
        if split is not None and name != split:
            continue
        for shard in info.shards:
            with open(out / shard.file, "rb") as f:
                for _, _, payload in iter_records(f):
                    yield schema.decode(payload)


def test_same_input_same_bytes(layouts, tmp_path):
    root, _ = layouts
    convert(root, tmp_path / "a", "--time_series", "--max_reject_fraction", "1")
    convert(root, tmp_path / "b", "--time_series", "--max_reject_fraction", "1", "--worker_processes", "2")
    for name in sorted(p.name for p in (tmp_path / "a").iterdir() if p.is_file()):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_patches_with_label_rasters_and_a_labels_csv(tmp_path):
    root = tmp_path / "in"
    masks = tmp_path / "masks"
    paths = [write_geotiff(root / "tile_a" / f"2020-0{i + 1}-01_B0{b}.tif",
                           _values(10 * i + b, bands=1, height=37, width=45), nodata=0,
                           tiled=True, blockxsize=16, blockysize=16, compress="deflate")
             for i in range(3) for b in (2, 3)]
    ids = np.random.default_rng(5).integers(0, 6, size=(1, 37, 45)).astype("uint8")
    write_geotiff(masks / "tile_a.tif", ids)
    labels = tmp_path / "labels.csv"
    with open(labels, "w", newline="") as f:
        csv.writer(f).writerows([["path", "label"], ["tile_a", "forest"]])
    out = tmp_path / "out"
    manifest = convert(root, out, "--time_series", "--masks_dir", masks, "--raster_patch", "16",
                       "--raster_stride", "12", "--raster_edge", "pad", "--bands", "B03,B02")
    records = {rec[schemas.FILENAME.key].decode(): rec for rec in _records(out)}
    assert sorted(records) == sorted(f"tile_a#patch={y},{x}" for y in (0, 12, 24) for x in (0, 12, 24, 36))
    for name, rec in records.items():
        y, x = (int(v) for v in name.split("=")[1].split(","))
        window = ((y, y + 16), (x, x + 16))
        expected = []
        for date in range(3):
            planes = []
            for band in (3, 2):  # --bands B03,B02
                with rasterio.open(root / "tile_a" / f"2020-0{date + 1}-01_B0{band}.tif") as src:
                    planes.append(src.read(1, window=window, boundless=True, fill_value=0))
            expected.append(np.stack(planes, axis=-1))
        np.testing.assert_array_equal(schemas.TimeSeriesExampleSchema.array(rec), np.stack(expected))
        with rasterio.open(paths[0]) as src:
            assert rec[schemas.GEOTRANSFORM.key] == tuple(src.window_transform(window).to_gdal())
        import io

        from PIL import Image

        mask = np.asarray(Image.open(io.BytesIO(rec[schemas.MASK.key])))
        with rasterio.open(masks / "tile_a.tif") as src:
            want = src.read(1, window=window, boundless=True, fill_value=255)
        np.testing.assert_array_equal(mask, want)
    assert manifest.counts["written"] == 6
    from beam_jobs import verify as verify_module

    report = verify_module.run([str(out)])
    assert report["ok"], report
    # A labels CSV keyed by the location's path.
    out2 = tmp_path / "out2"
    manifest = convert(root, out2, "--time_series", "--labels_csv", labels)
    assert manifest.class_names == ("forest",)
    (rec,) = list(_records(out2))
    assert rec[schemas.LABEL.key] == 0 and rec[schemas.STACK_SHAPE.key] == (3, 37, 45, 2)


def test_a_stack_over_max_pixels_is_rejected_with_a_hint(tmp_path):
    root = tmp_path / "in"
    for i in range(2):
        write_geotiff(root / "c" / "loc" / f"2020-01-0{i + 1}.tif", _values(i))
    write_geotiff(root / "c" / "small" / "2020-01-01.tif", _values(9, height=2, width=2))
    out = tmp_path / "out"
    convert(root, out, "--time_series", "--max_pixels", "100", "--max_reject_fraction", "1")
    lines = [json.loads(line) for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()]
    assert {(r["path"], r["reason"]) for r in lines} == {
        ("c/loc/2020-01-01.tif", "too_large"), ("c/loc/2020-01-02.tif", "too_large")}
    assert all("--raster_patch" in r["message"] for r in lines)


def test_preview_and_inspect_know_stacks(layouts, tmp_path):
    import subprocess
    import sys

    root, expected = layouts
    out = tmp_path / "out"
    # Through the command a new user types (`shardsmith convert --time_series`).
    proc = subprocess.run([sys.executable, "-m", "shardsmith", "convert", "--input_dir", str(root),
                           "--output_dir", str(out), "--time_series", "--max_reject_fraction", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "3 give a stack" in proc.stderr + proc.stdout
    # Each shard's line counts what its records are: stacks, not images.
    assert re.search(r"Wrote \S+: \d+ stacks? \[", proc.stderr + proc.stdout), proc.stderr[-2000:]
    assert not re.search(r"Wrote \S+: \d+ images? \[", proc.stderr + proc.stdout)
    from shardsmith import preview

    sheet = preview.contact_sheet(out, "train", image_size=32)
    # One row per stack, one tile per date (the widest row: 3 dates).
    assert sheet.height > 3 * 32 and sheet.width >= 3 * 32
    pixels = np.asarray(sheet)
    assert pixels.std() > 10  # the dates are drawn, not blank tiles
    proc = subprocess.run([sys.executable, "-m", "shardsmith", "inspect", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "19 = 11 written + 7 rejected + 1 skipped" in proc.stdout


@pytest.mark.parametrize("rows, what", [("a,x|y\nb,y\n", "several labels per row"),
                                        ("a,1.5\nb,2.0\n", "numbers")])
def test_several_labels_or_numbers_per_location_are_refused_naming_the_csv(tmp_path, rows, what):
    root = tmp_path / "in"
    for loc in ("a", "b"):
        for i in range(2):
            write_geotiff(root / loc / f"2020-01-0{i + 1}.tif", _values(i, height=4, width=4))
    labels = tmp_path / "labels.csv"
    labels.write_text(("path,label\n" if "|" in rows else "path,target\n") + rows)
    out = tmp_path / "out"
    # Stacks hold one class or a label raster: the CSV's other targets would be lost without a word.
    with pytest.raises(ValueError, match=rf"--time_series takes one class per location .* "
                                         rf"Received: --labels_csv {labels} with {what}"):
        convert(root, out, "--time_series", "--labels_csv", labels)
    assert not (out / schemas.MANIFEST_FILENAME).exists()


def test_band_statistics_are_the_train_splits_values_without_nodata_or_nan(tmp_path):
    root = tmp_path / "in"
    rng = np.random.default_rng(11)
    for loc in range(6):
        for i in range(2):
            values = rng.normal(100.0 * (loc + 1), 10.0, size=(2, 5, 4)).astype("float32")
            values[0, 0, : loc % 3] = -9999.0  # the files' nodata
            values[1, 1, loc % 2] = np.nan
            write_geotiff(root / "crop" / f"loc_{loc}" / f"2020-01-0{i + 1}.tif", values, nodata=-9999.0)
    out = tmp_path / "out"
    manifest = convert(root, out, "--time_series", "--split", "train=0.5,validation=0.5", "--seed", "3")
    for split, info in manifest.splits.items():
        stats = schemas.BandStats.combine([shard.band_stats for shard in info.shards])
        locations = sorted(rec[schemas.FILENAME.key].decode() for rec in _records(out, split))
        assert locations
        samples = np.concatenate([_read(root / loc / "2020-01-01.tif").reshape(-1, 2) for loc in locations]
                                 + [_read(root / loc / "2020-01-02.tif").reshape(-1, 2) for loc in locations])
        good = (samples != -9999.0) & ~np.isnan(samples)
        assert stats.count == tuple(good.sum(axis=0).tolist()), split
        assert stats.nodata == tuple((~good).sum(axis=0).tolist())
        for b in range(2):
            assert stats.mean[b] == pytest.approx(samples[good[:, b], b].astype(np.float64).mean(), rel=1e-9)
            assert stats.std[b] == pytest.approx(samples[good[:, b], b].astype(np.float64).std(), rel=1e-9)
            assert stats.min[b] == samples[good[:, b], b].min() and stats.max[b] == samples[good[:, b], b].max()
    assert len(manifest.splits) == 2


@pytest.mark.parametrize("patch", [None, "16"])
def test_a_passs_mask_counts_as_its_nodata_and_verify_checks_its_statistics(tmp_path, patch):
    """An internal mask on one pass, an external `.msk` on another: GDAL's masked statistics, patches skipped."""
    root = tmp_path / "in"
    loc = root / "field" / "loc"
    loc.mkdir(parents=True)
    masks = [np.zeros((32, 32), bool) for _ in range(2)]
    masks[0][:14, :16] = True  # most of patch (0, 0) on the first date: skipped at 0.3
    masks[1][20:, 5:9] = True
    paths = []
    for i, internal in enumerate((True, False)):
        path = loc / f"2020-0{i + 1}-01.tif"
        with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=internal):
            with rasterio.open(path, "w", driver="GTiff", height=32, width=32, count=2, dtype="uint16",
                               crs="EPSG:32633", transform=from_origin(300000.0, 5000000.0, 10.0, 10.0),
                               tiled=True, blockxsize=16, blockysize=16) as dst:
                dst.write(_values(70 + i, bands=2, height=32, width=32))
                dst.write_mask(np.where(masks[i], 0, 255).astype(np.uint8))
        paths.append(path)
    assert (loc / "2020-02-01.tif.msk").exists()
    out = tmp_path / "out"
    args = ["--time_series"] + ([] if patch is None else ["--raster_patch", patch, "--raster_max_nodata", "0.3"])
    manifest = convert(root, out, *args)
    kept = set()
    for rec in _records(out):
        kept.add(rec[schemas.FILENAME.key].decode())
    if patch is None:
        assert kept == {"field/loc"}
        windows = [(0, 0, 32)]
    else:
        assert kept == {f"field/loc#patch={y},{x}" for y, x in ((0, 16), (16, 0), (16, 16))}
        windows = [(y, x, 16) for y, x in ((0, 16), (16, 0), (16, 16))]
    # GDAL's masked read of the records' windows, every date.
    good = [np.concatenate([rasterio.open(p).read(b + 1, masked=True)[y:y + s, x:x + s].compressed()
                            for p in paths for y, x, s in windows]) for b in range(2)]
    stats = manifest.splits["train"].band_stats
    for b in range(2):
        assert stats.count[b] == good[b].size and stats.min[b] == good[b].min() and stats.max[b] == good[b].max()
        assert stats.mean[b] == pytest.approx(good[b].astype(np.float64).mean(), rel=1e-12)
    assert sum(stats.nodata) == 2 * sum(int(m[y:y + s, x:x + s].sum()) for m in masks for y, x, s in windows)
    lines = [json.loads(line) for line in (out / schemas.NORMALIZED_FILENAME).read_text().splitlines()]
    noted = {line["path"] for line in lines if "mask_as_nodata" in line["actions"]}
    assert noted == ({"field/loc"} if patch is None else {"field/loc#patch=16,0"})
    from beam_jobs import verify as verify_module

    report = verify_module.run([str(out)])
    assert report["ok"], report
