"""convert --append: new files as a new version in new shards, the old ones untouched (issue 38).

From files on disk through Beam's local runner to records read back with TensorFlow's own
TFRecord reader; the grown dataset is compared with a full rebuild of the grown folder.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from helpers import convert, encode, make_class_tree, pixels, read_records, write  # noqa: E402

import schemas  # noqa: E402
from schemas.manifest import SHARD_FILENAME_RE  # noqa: E402
from conversion import append as _append, append_run  # noqa: E402
from conversion.lock import LOCK_FILENAME, LockError, OutputLock  # noqa: E402

SPLIT = ("--split", "train=0.6,validation=0.4", "--min_shards", "2")


def _files_state(out: pathlib.Path) -> dict[str, tuple[bytes, int]]:
    """Bytes and mtime of every shard and index file."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.iterdir())
            if SHARD_FILENAME_RE.match(p.name)}


def _by_name(records) -> dict[str, dict]:
    return {r["filename"].decode(): r for r in records}


def _add_images(root: pathlib.Path, names, seed=50):
    for i, rel in enumerate(names):
        write(root / rel, encode(pixels(seed + i), "JPEG", quality=90))


@pytest.fixture
def grown(tmp_path):
    """A dataset converted, then grown by an append that adds files and a new class."""
    inp, out = tmp_path / "in", tmp_path / "out"
    make_class_tree(inp, classes=("cat", "dog"), per_class=6)
    first = convert(inp, out, *SPLIT)
    before = _files_state(out)
    _add_images(inp, [f"dog/new_{i}.jpg" for i in range(4)] + [f"ant/a_{i}.jpg" for i in range(5)])
    second = convert(inp, out, *SPLIT, "--append")
    return inp, out, first, second, before


def test_an_append_adds_new_shards_and_leaves_every_old_byte(grown, tmp_path):
    inp, out, first, second, before = grown
    after = _files_state(out)
    # Every old shard and index file: the same bytes and the same modification time.
    for name, state in before.items():
        assert after[name] == state, name
    added = sorted(set(after) - set(before))
    assert added and all(SHARD_FILENAME_RE.match(n)["version"] == "00002" for n in added)
    # Class indices never change: the new class comes last, and the manifest says so.
    assert first.class_names == ("cat", "dog")
    assert second.class_names == ("cat", "dog", "ant")
    assert second.class_order == "first_appearance"
    assert [v.version for v in second.versions] == [1, 2]
    v2 = second.versions[1]
    assert v2.inputs["new"] == 9 and v2.inputs["held"] == 12
    assert v2.inputs["changed"] == 0 and v2.inputs["missing_from_input"] == 0
    assert sum(v2.num_records.values()) == 9
    # Version 1 reads as it was.
    assert second.at_version(1).splits["train"].shards == tuple(
        s for s in first.splits["train"].shards)
    records = _by_name(read_records(out))
    assert len(records) == 21
    # Same splits as a full rebuild of the grown folder; labels by the grown class names.
    rebuilt = convert(inp, tmp_path / "rebuilt", *SPLIT)
    full = _by_name(read_records(tmp_path / "rebuilt"))
    assert set(full) == set(records)
    for name, rec in records.items():
        assert rec["split"] == full[name]["split"], name
        assert second.class_names[rec["label"]] == rebuilt.class_names[full[name]["label"]], name
        assert rec["image"] == full[name]["image"], name
    held = [f.rel_path for f in _append.load_base(str(out)).held.values()]
    assert sorted(held) == sorted(records)


def test_changed_and_missing_files_are_reported_not_rewritten(grown):
    inp, out, _, second, _ = grown
    before = _files_state(out)
    (inp / "cat" / "img_00.jpg").write_bytes(encode(pixels(999), "JPEG", quality=90))
    os.remove(inp / "dog" / "img_01.jpg")
    _add_images(inp, ["cat/later.jpg"], seed=77)
    third = convert(inp, out, *SPLIT, "--append")
    v3 = third.versions[-1]
    assert (v3.version, v3.inputs["changed"], v3.inputs["missing_from_input"], v3.inputs["new"]) == (3, 1, 1, 1)
    report = json.loads((out / _append.REPORT_FILENAME).read_text())
    assert report["changed"] == ["cat/img_00.jpg"] and report["missing_from_input"] == ["dog/img_01.jpg"]
    after = _files_state(out)
    assert all(after[n] == s for n, s in before.items())
    names = [r["filename"].decode() for r in read_records(out)]
    assert names.count("cat/img_00.jpg") == 1 and "dog/img_01.jpg" in names and "cat/later.jpg" in names


def test_nothing_new_adds_no_version(grown):
    inp, out, _, second, _ = grown
    manifest = (out / schemas.MANIFEST_FILENAME).read_bytes()
    convert(inp, out, *SPLIT, "--append")
    assert (out / schemas.MANIFEST_FILENAME).read_bytes() == manifest


def test_dedup_skips_a_new_copy_of_a_held_file(grown):
    inp, out, _, _, _ = grown
    write(inp / "dog" / "copy_of_cat.jpg", (inp / "cat" / "img_00.jpg").read_bytes())
    _add_images(inp, ["dog/fresh.jpg"], seed=90)
    # As within one run, a duplicate counts as a reject (--max_reject_fraction).
    third = convert(inp, out, *SPLIT, "--append", "--dedup", "--max_reject_fraction", "0.5")
    assert third.versions[-1].inputs["duplicates_of_held"] == 1
    assert third.rejects == {"duplicate": 1}
    lines = [json.loads(line) for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()]
    assert lines[0]["path"] == "dog/copy_of_cat.jpg" and "cat/img_00.jpg" in lines[0]["message"]
    assert [r["filename"].decode() for r in read_records(out)].count("dog/fresh.jpg") == 1


def test_append_into_an_empty_folder_is_a_first_conversion(tmp_path):
    inp = tmp_path / "in"
    make_class_tree(inp, classes=("a", "b"), per_class=3)
    appended = convert(inp, tmp_path / "appended", *SPLIT, "--append")
    plain = convert(inp, tmp_path / "plain", *SPLIT)
    assert appended.to_json() == plain.to_json()
    assert _files_state(tmp_path / "appended") == {
        n: (b, (tmp_path / "appended" / n).stat().st_mtime_ns)
        for n, (b, _) in _files_state(tmp_path / "plain").items()}
    inventory = (tmp_path / "appended" / _append.inputs_filename(1)).read_text().splitlines()
    assert len(inventory) == 6


@pytest.mark.parametrize("flags, named", [
    (("--seed", "3"), "--seed"),
    (("--split", "train=0.5,validation=0.5"), "--split"),
    (("--max_side", "16"), "--max_side"),
    (("--background", "0,0,0"), "--background"),
    (("--class_names", "dog,cat"), "--class_names"),
])
def test_an_inconsistent_option_is_refused_before_anything_is_written(grown, flags, named):
    from beam_jobs import convert as convert_module

    inp, out, *_ = grown
    _add_images(inp, ["cat/one_more.jpg"], seed=120)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    split = list(SPLIT)
    if flags[0] == "--split":
        split = ["--min_shards", "2"]
    with pytest.raises(ValueError, match=named):
        convert_module.run(["--input_dir", str(inp), "--output_dir", str(out), *split, *flags, "--append"])
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_a_second_append_is_refused_and_a_stale_lock_explained(grown, tmp_path):
    from beam_jobs import convert as convert_module

    inp, out, *_ = grown
    argv = ["--input_dir", str(inp), "--output_dir", str(out), *SPLIT, "--append"]
    with OutputLock(str(out), command="another append"):
        with pytest.raises(LockError, match="being written by .*another append"):
            convert_module.run(argv)
    # A lock left by a process that is gone.
    holder = json.loads(json.dumps({"host": os.uname().nodename, "pid": 2**22 + 12345, "time": "t",
                                    "command": "killed append", "token": "x"}))
    (out / LOCK_FILENAME).write_text(json.dumps(holder))
    with pytest.raises(LockError, match="no longer runs"):
        convert_module.run(argv)
    assert (out / LOCK_FILENAME).exists()


def test_a_dataset_converted_without_append_gets_its_inventory_from_its_shards(tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    make_class_tree(inp, classes=("x", "y"), per_class=4)
    convert(inp, out, *SPLIT)
    assert not (out / _append.inputs_filename(1)).exists()
    _add_images(inp, ["y/z.jpg"], seed=300)
    grown = convert(inp, out, *SPLIT, "--append")
    assert grown.versions[-1].inputs["new"] == 1 and grown.versions[-1].inputs["held"] == 8
    v1 = [json.loads(line) for line in (out / _append.inputs_filename(1)).read_text().splitlines()]
    assert sorted(e["path"] for e in v1) == sorted(
        r["filename"].decode() for r in read_records(out) if r["shard"].count("_v") == 0)
    assert all(len(e["sha256"]) == 64 for e in v1)


def _append_process(inp, out, *extra):
    import subprocess

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        [sys.executable, "-m", "beam_jobs.convert", "--input_dir", str(inp), "--output_dir", str(out), *SPLIT,
         "--num_shards", "6", "--worker_processes", "0", "--append", *extra],
        cwd=pathlib.Path(__file__).parent.parent, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill_when(proc, seen) -> bool:
    """SIGKILLs the append's whole process group as soon as `seen()` holds; whether it was still running."""
    import signal
    import time

    deadline = time.monotonic() + 120
    while not seen() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    running = proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return running


def _readable_as_a_version(out: pathlib.Path) -> schemas.Manifest:
    """The folder's manifest, every shard it names whole (sha256), and its records all there."""
    import hashlib

    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    for info in manifest.splits.values():
        for shard in info.shards:
            assert hashlib.sha256((out / shard.file).read_bytes()).hexdigest() == shard.sha256, shard.file
    assert len(read_records(out)) == sum(i.num_records for i in manifest.splits.values())
    return manifest


@pytest.mark.parametrize("point", ["listing", "first_new_shard", "inventory"])
def test_an_append_killed_at_any_point_leaves_the_previous_version_and_the_next_finishes_it(tmp_path, point):
    inp, out = tmp_path / "in", tmp_path / "out"
    make_class_tree(inp, classes=("cat", "dog"), per_class=6)
    convert(inp, out, *SPLIT)
    before = _files_state(out)
    _add_images(inp, [f"{c}/new_{i:03d}.jpg" for c in ("cat", "dog", "eel") for i in range(40)])
    seen = {
        "listing": lambda: (out / LOCK_FILENAME).exists(),
        "first_new_shard": lambda: any(p.name.startswith("train_v00002") and p.suffix == ".tfrecord"
                                       for p in out.iterdir()),
        "inventory": lambda: (out / _append.inputs_filename(2)).exists(),
    }[point]
    assert _kill_when(_append_process(inp, out), seen), "the append ended before the kill"
    manifest = _readable_as_a_version(out)
    if point != "inventory":  # Written just before the manifest: killed before or after it.
        assert manifest.latest_version == 1
    old = {n: s for n, s in _files_state(out).items() if n in before}
    assert old == before
    killed_before = manifest.latest_version == 1
    if (out / LOCK_FILENAME).exists():
        # The lock left is explained; once removed, the next append finishes version 2 (killed
        # before its manifest) or finds nothing new and clears what the killed run left (after).
        proc = _append_process(inp, out)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2 and b"no longer runs" in err, err
        (out / LOCK_FILENAME).unlink()
        proc = _append_process(inp, out, *(("--resume",) if point == "first_new_shard" else ()))
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-3000:]
        manifest = _readable_as_a_version(out)
    print(point, "killed before the manifest" if killed_before else "killed after the manifest")
    assert manifest.latest_version == 2
    assert sum(manifest.versions[1].num_records.values()) == 120
    assert manifest.class_names == ("cat", "dog", "eel")
    named = {f for i in manifest.splits.values() for s in i.shards for f in (s.file, s.index_file)}
    assert {n for n in _files_state(out)} == named  # Nothing the killed run left.
    assert not (out / "_shardsmith_tmp").exists() and not (out / LOCK_FILENAME).exists()
    assert {n: s for n, s in _files_state(out).items() if n in before} == before


@pytest.mark.parametrize("flags", [(), ("--raster_patch", "16", "--raster_georef")], ids=["rasters", "patches"])
def test_rasters_and_patches_grow_as_images_do(tmp_path, flags):
    """Multi-band uint16 GeoTIFFs (GDAL), whole or cut into patches: version 1 untouched, the new
    scenes' records like a full rebuild's (the same bytes, band statistics added up per split)."""
    import numpy as np

    from helpers import write_geotiff

    inp, out = tmp_path / "in", tmp_path / "out"
    rng = np.random.default_rng(3)

    def scene(rel):
        write_geotiff(inp / rel, rng.integers(0, 4000, (3, 40, 36), dtype=np.uint16))

    for i in range(4):
        scene(f"field/s{i}.tif")
        scene(f"forest/s{i}.tif")
    first = convert(inp, out, *SPLIT, *flags)
    before = _files_state(out)
    for i in range(3):
        scene(f"water/w{i}.tif")
        scene(f"field/later{i}.tif")
    grown = convert(inp, out, *SPLIT, *flags, "--append")
    assert {n: s for n, s in _files_state(out).items() if n in before} == before
    assert grown.class_names == (*first.class_names, "water")
    full = _by_name(read_records(out))
    convert(inp, tmp_path / "rebuilt", *SPLIT, *flags)
    rebuilt = _by_name(read_records(tmp_path / "rebuilt"))
    assert set(full) == set(rebuilt)
    for name, rec in full.items():
        assert (rec["split"], rec["image"]) == (rebuilt[name]["split"], rebuilt[name]["image"]), name
    rebuilt_manifest = schemas.Manifest.from_json((tmp_path / "rebuilt" / schemas.MANIFEST_FILENAME).read_text())
    for split, info in grown.splits.items():
        ours, theirs = info.band_stats, rebuilt_manifest.splits[split].band_stats
        assert ours.records == theirs.records == info.num_records
        assert ours.count == theirs.count and ours.min == theirs.min and ours.max == theirs.max
        np.testing.assert_allclose(ours.mean, theirs.mean, rtol=1e-9)


def test_a_new_file_of_a_held_group_joins_its_group_split(tmp_path):
    """--group_by: a patient's new image lands in the split of the patient's old ones; the groups merge."""
    inp, out = tmp_path / "in", tmp_path / "out"
    flags = ("--split", "train=0.5,validation=0.5", "--group_by", r"regex:(p\d+)_", "--min_shards", "1")
    for p in range(8):
        _add_images(inp, [f"{'ab'[p % 2]}/p{p}_0.jpg"], seed=10 * p)
    first = convert(inp, out, *flags)
    for p in range(8):
        _add_images(inp, [f"{'ab'[p % 2]}/p{p}_1.jpg"], seed=10 * p + 5)
    grown = convert(inp, out, *flags, "--append")
    split_of = {r["filename"].decode(): r["split"] for r in read_records(out)}
    for p in range(8):
        assert split_of[f"{'ab'[p % 2]}/p{p}_1.jpg"] == split_of[f"{'ab'[p % 2]}/p{p}_0.jpg"]
    assert grown.extra["groups"]["per_split"] == first.extra["groups"]["per_split"]


def test_a_labels_csv_that_grows_with_the_folder(tmp_path):
    """--labels_csv names every file, held ones too: those rows are no 'missing_file', new rows label new files."""
    inp, out = tmp_path / "in", tmp_path / "out"
    rows = {f"img_{i}.jpg": "ab"[i % 2] for i in range(6)}
    _add_images(inp, list(rows), seed=200)
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\n" + "".join(f"{p},{c}\n" for p, c in rows.items()))
    convert(inp, out, *SPLIT, "--labels_csv", csv)
    rows.update({"img_6.jpg": "c", "img_7.jpg": "a"})
    _add_images(inp, ["img_6.jpg", "img_7.jpg"], seed=300)
    csv.write_text("path,label\n" + "".join(f"{p},{c}\n" for p, c in rows.items()))
    grown = convert(inp, out, *SPLIT, "--labels_csv", csv, "--append")
    assert grown.rejects == {} and grown.versions[-1].inputs["new"] == 2
    assert grown.class_names == ("a", "b", "c")
    assert {r["filename"].decode(): grown.class_names[r["label"]] for r in read_records(out)} == rows


def test_an_earlier_reject_is_tried_again_and_counted_as_retried_not_new(tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    make_class_tree(inp, classes=("cat", "dog"), per_class=6)
    write(inp / "cat" / "fixed_later.jpg", b"not a jpeg at all")
    write(inp / "dog" / "still_bad.jpg", b"neither is this")
    first = convert(inp, out, *SPLIT, "--max_reject_fraction", "0.5")
    earlier = {json.loads(line)["path"]: json.loads(line)["reason"]
               for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()}
    assert set(earlier) == {"cat/fixed_later.jpg", "dog/still_bad.jpg"} and first.counts["rejected"] == 2
    # The owner replaces one bad file with a good one, and a new photo arrives.
    write(inp / "cat" / "fixed_later.jpg", encode(pixels(70), "JPEG", quality=90))
    _add_images(inp, ["dog/brand_new.jpg"], seed=71)
    second = convert(inp, out, *SPLIT, "--append", "--max_reject_fraction", "0.5")
    v2 = second.versions[-1]
    assert (v2.inputs["new"], v2.inputs["retried"], v2.inputs["retried_rejected_again"]) == (1, 2, 1)
    report = json.loads((out / _append.REPORT_FILENAME).read_text())
    assert report["new"] == 1 and report["retried"] == earlier
    assert report["retried_rejected_again"] == ["dog/still_bad.jpg"]
    names = [r["filename"].decode() for r in read_records(out)]
    assert names.count("cat/fixed_later.jpg") == 1 and names.count("dog/brand_new.jpg") == 1
    assert "dog/still_bad.jpg" not in names
    summary = append_run.version_summary(second)
    assert "2 rejected by an earlier version and tried again (1 written, 1 rejected again)" in summary
    # Still rejected, the bad file is tried again by the next append, and still not counted as new.
    _add_images(inp, ["cat/week3.jpg"], seed=72)
    third = convert(inp, out, *SPLIT, "--append", "--max_reject_fraction", "0.5")
    assert (third.versions[-1].inputs["new"], third.versions[-1].inputs["retried"]) == (1, 1)


def test_an_append_whose_only_inputs_are_earlier_rejects_rejected_again_adds_no_version(tmp_path):
    """Tried again each time, an earlier reject that is still bad makes no empty version; a new
    reject does (rejects.jsonl names every input not converted), and so does a fixed file."""
    inp, out = tmp_path / "in", tmp_path / "out"
    make_class_tree(inp, classes=("cat", "dog"), per_class=6)
    write(inp / "dog" / "still_bad.jpg", b"not a jpeg")
    convert(inp, out, *SPLIT, "--max_reject_fraction", "1")
    kept = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    again = convert(inp, out, *SPLIT, "--append", "--max_reject_fraction", "1")
    assert again.latest_version == 1 and not again.versions
    # Every file as it was (the inventory of version 1, read from its shards once, is new).
    assert {name: (out / name).read_bytes() for name in kept} == kept
    report = json.loads((out / _append.REPORT_FILENAME).read_text())
    assert (report["version"], report["kept_version"], report["new"]) == (None, 1, 0)
    assert list(report["retried"]) == ["dog/still_bad.jpg"]
    assert report["retried_rejected_again"] == ["dog/still_bad.jpg"]
    # A new bad file is a new reject: a version (of no records) names it.
    write(inp / "cat" / "also_bad.jpg", b"nor this")
    second = convert(inp, out, *SPLIT, "--append", "--max_reject_fraction", "1")
    assert second.latest_version == 2 and sum(second.versions[-1].num_records.values()) == 0
    assert sorted(json.loads(line)["path"] for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()) \
        == ["cat/also_bad.jpg", "dog/still_bad.jpg"]
    assert convert(inp, out, *SPLIT, "--append", "--max_reject_fraction", "1").latest_version == 2
    # Fixed, it is written by the next version.
    write(inp / "dog" / "still_bad.jpg", encode(pixels(80), "JPEG", quality=90))
    third = convert(inp, out, *SPLIT, "--append", "--max_reject_fraction", "1")
    assert third.latest_version == 3 and sum(third.versions[-1].num_records.values()) == 1
