"""verify: every shard re-read and checked against the manifest (beam_jobs/verify.py)."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil

import numpy as np
import pytest
import tifffile
from helpers import convert, encode, make_class_tree, pixels, write

import schemas
from beam_jobs import verify
from schemas.tfrecord import frame_data


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(folder, manifest) of the dataset the tests tamper with, converted once for the module."""
    root = tmp_path_factory.mktemp("verify") / "images"
    make_class_tree(root, per_class=4)
    # The same picture under two names: the hash split may put them apart.
    same = encode(pixels(99), "JPEG")
    for i in range(6):
        write(root / "cat" / f"copy_{i}.jpg", same)
    out = root.parent / "out"
    manifest = convert(root, out, "--split", "train=0.5,test=0.5", "--min_shards", "2")
    return out, manifest


@pytest.fixture
def dataset(converted, tmp_path):
    """(folder, manifest): this test's own copy of the converted dataset, to tamper with."""
    source, manifest = converted
    out = tmp_path / "out"
    shutil.copytree(source, out)
    return out, manifest


def test_a_fresh_dataset_verifies_and_duplicates_are_reported(dataset, capsys):
    folder, manifest = dataset
    assert verify.main([str(folder)]) == 0
    report = json.loads((folder / schemas.VERIFY_REPORT_FILENAME).read_text())
    assert report["ok"] and report["problems"] == []
    assert report["records"] == manifest.counts["written"] == 18
    groups = report["duplicates"]["list"]
    assert len(groups) == 1 and len(groups[0]["images"]) == 6
    assert {img["filename"] for img in groups[0]["images"]} == {f"cat/copy_{i}.jpg" for i in range(6)}
    assert report["duplicates"]["across_splits"] == (1 if len(groups[0]["splits"]) > 1 else 0)
    out = capsys.readouterr().out  # The verdict is the result: stdout.
    assert out.startswith("OK: 18 records") and "Duplicates: 1 group of identical images" in out
    if report["duplicates"]["across_splits"]:
        assert verify.main([str(folder), "--fail_on_duplicates"]) == 1


def test_a_flipped_byte_is_found_and_named(dataset):
    out, manifest = dataset
    shard = manifest.splits["train"].shards[0]
    data = bytearray((out / shard.file).read_bytes())
    data[len(data) // 2] ^= 0x01
    (out / shard.file).write_bytes(bytes(data))
    assert verify.main([str(out)]) == 1
    report = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())
    assert any(shard.file in p and "checksum mismatch" in p for p in report["problems"])
    # The damaged record is listed alone (read by the index file), with the source file it held.
    assert any(p.startswith(f"{shard.file}: record ") and "bad data CRC; source file lost: " in p
               for p in report["problems"]), report["problems"]


def test_every_damaged_record_is_listed_with_its_offset_what_is_wrong_and_its_source(dataset):
    out, manifest = dataset
    first, second = manifest.splits["train"].shards[:2]
    entries = [tuple(map(int, line.split())) for line in (out / first.index_file).read_text().splitlines()]
    assert len(entries) >= 3
    data = bytearray((out / first.file).read_bytes())
    (o0, l0), (o1, _), (olast, llast) = entries[0], entries[1], entries[-1]
    data[o0 + l0 // 2] ^= 0xFF  # In record 0's image bytes: bad data CRC.
    data[o1 + 2] ^= 0x01  # Record 1's length: bad length CRC.
    (out / first.file).write_bytes(bytes(data[:olast + llast // 2]))  # The last record cut short.
    expected = [
        f"{first.file}: record 0 (byte {o0}): bad data CRC; source file lost: ",
        f"{first.file}: record 1 (byte {o1}): bad length CRC; source file lost: ",
        f"{first.file}: record {len(entries) - 1} (byte {olast}): truncated (the shard ends {llast // 2} bytes "
        f"into this {llast}-byte record); source file lost: ",
    ]
    assert verify.main([str(out)]) == 1
    problems = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())["problems"]
    listed = [p for p in problems if p.startswith(f"{first.file}: record ")]
    assert [p[:len(e)] for p, e in zip(listed, expected)] == expected and len(listed) == 3, problems
    # Both damaged records still name their source (read by the index's length); the cut one cannot.
    assert listed[0].endswith("(read from the damaged record)") and listed[1].endswith("(read from the damaged record)")
    assert listed[2].endswith("unknown (the record's data does not parse)")
    # The name record 0 held, from the undamaged bytes.
    original = bytes(data[o0:o0 + l0])
    original = original[:l0 // 2] + bytes([original[l0 // 2] ^ 0xFF]) + original[l0 // 2 + 1:]
    name = schemas.ImageExampleSchema.from_json(manifest.features).decode(frame_data(original))[schemas.FILENAME.key]
    assert f"source file lost: {name.decode()} (read from the damaged record)" in listed[0]
    assert any(f"{first.file}: 3 damaged record(s) of {len(entries)}" in p for p in problems)
    assert not any(second.file in p for p in problems)


def test_the_records_after_a_damaged_one_are_checked_and_counted_by_class(dataset):
    """Record 1 of a shard damaged: the records after it (found by the index file) are checked and
    counted; with the lost record's class unknown, the class counts add up and are no problem."""
    from conversion.verification import ShardCheck, ShardVerifier

    out, manifest = dataset
    shard = manifest.splits["train"].shards[0]
    entries = [tuple(map(int, line.split())) for line in (out / shard.index_file).read_text().splitlines()]
    assert len(entries) >= 3
    schema = schemas.ImageExampleSchema.from_json(manifest.features)
    data = bytearray((out / shard.file).read_bytes())
    labels = [int(schema.decode(frame_data(bytes(data[o:o + n])))[schemas.LABEL.key]) for o, n in entries]
    offset, length = entries[1]
    data[offset + length // 2] ^= 0xFF
    (out / shard.file).write_bytes(bytes(data))
    verifier = ShardVerifier(str(out), manifest.features, len(manifest.class_names))
    verifier.setup()
    [check] = [c for c in verifier.check("train", shard) if isinstance(c, ShardCheck)]
    expected = [0] * len(manifest.class_names)
    for k, label in enumerate(labels):
        if k != 1:
            expected[label] += 1
    assert list(check.class_counts) == expected and check.num_records == len(entries) - 1
    assert check.unchecked == 1
    assert verify.main([str(out)]) == 1
    problems = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())["problems"]
    assert any(f"{shard.file}: 1 damaged record(s) of {len(entries)}" in p and
               f"{len(entries) - 2} later record(s) hold and were checked" in p for p in problems), problems
    assert not any("class counts" in p for p in problems), problems
    # One record of the split is lost, and said so.
    assert any(p.startswith("split train: ") and "records, the manifest says" in p for p in problems), problems


def test_missing_shard_and_wrong_counts_are_mismatches(dataset):
    out, manifest = dataset
    gone = manifest.splits["test"].shards[-1]
    (out / gone.file).unlink()
    # The folder named as convert names it (`--output_dir`, a hidden alias of DATASET_DIR).
    assert verify.main([f"--output_dir={out}"]) == 1
    problems = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())["problems"]
    assert f"{gone.file}: file is missing" in problems
    assert any(p.startswith("split test:") for p in problems)


def test_a_folder_without_manifest_gets_one_clear_error(tmp_path, capsys):
    (tmp_path / "half").mkdir()
    assert verify.main([str(tmp_path / "half")]) == 2
    err = capsys.readouterr().err
    assert "not a finished shardsmith dataset" in err and "--overwrite" in err


def test_a_tampered_index_file_is_found(dataset):
    out, manifest = dataset
    shard = manifest.splits["train"].shards[0]
    shutil.copy(out / manifest.splits["test"].shards[0].index_file, out / shard.index_file)
    assert verify.main([str(out)]) == 1
    problems = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())["problems"]
    assert f"{shard.index_file}: sha256 differs from the manifest" in problems


def _write_with_first_train_shard(out, manifest, shard):
    """Rewrites the manifest with `shard` in place of the train split's first one."""
    train = dataclasses.replace(manifest.splits["train"],
                                shards=(shard, *manifest.splits["train"].shards[1:]))
    changed = dataclasses.replace(manifest, splits={**manifest.splits, "train": train})
    (out / schemas.MANIFEST_FILENAME).write_text(changed.to_json())


def test_false_image_stats_are_found(dataset):
    # Readers specialise on the manifest's formats and sizes: verify checks them.
    out, manifest = dataset
    shard = manifest.splits["train"].shards[0]
    false = dataclasses.replace(shard.images, formats=(("png", shard.num_records),))
    _write_with_first_train_shard(out, manifest, dataclasses.replace(shard, images=false))
    assert verify.main([str(out)]) == 1
    problems = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())["problems"]
    assert [p for p in problems if p.startswith(f"{shard.file}: images ")] == [
        f"{shard.file}: images {shard.images.to_json()}, the manifest says {false.to_json()}"]


@pytest.fixture
def raster_dataset(tmp_path):
    rng = np.random.default_rng(16)
    for c, cls in enumerate(("forest", "water")):
        for i in range(3):
            buf = io.BytesIO()
            # 5 bands of uint16 (stored raw), with a nodata value that some samples hold.
            array = rng.integers(0, 65536, (12, 10, 5), dtype=np.uint16)
            array[0, : 1 + c + i] = 7
            tifffile.imwrite(buf, array, photometric="minisblack", planarconfig="contig",
                             extratags=[(42113, "s", 0, "7", True)])
            write(tmp_path / "images" / cls / f"patch_{i}.tif", buf.getvalue())
    out = tmp_path / "out"
    manifest = convert(tmp_path / "images", out, "--min_shards", "2")
    return out, manifest


def test_band_statistics_are_recomputed_and_a_tampered_band_is_named(raster_dataset):
    out, manifest = raster_dataset
    shard = manifest.splits["train"].shards[0]
    stats = shard.band_stats
    assert stats is not None and stats.num_bands == 5 and sum(stats.nodata) > 0
    assert verify.main([str(out)]) == 0  # Untampered: clean.
    mean = list(stats.mean)
    mean[0] *= 1 + 1e-12  # Within the float tolerance: summation order only.
    mean[2] += 0.5
    maxs = list(stats.max)
    maxs[1] += 1
    nodata = list(stats.nodata)
    nodata[3] += 1
    false = dataclasses.replace(stats, mean=tuple(mean), max=tuple(maxs), nodata=tuple(nodata))
    _write_with_first_train_shard(out, manifest, dataclasses.replace(shard, band_stats=false))
    assert verify.main([str(out)]) == 1
    problems = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())["problems"]
    assert problems == [
        f"{shard.file}: band 2 max {stats.max[1]!r}, the manifest says {maxs[1]!r}",
        f"{shard.file}: band 3 mean {stats.mean[2]!r}, the manifest says {mean[2]!r}",
        f"{shard.file}: band 4 nodata {stats.nodata[3]!r}, the manifest says {nodata[3]!r}",
    ]
    # Without normalized.jsonl, which names the raster records, they cannot be checked: said so.
    (out / schemas.MANIFEST_FILENAME).write_text(manifest.to_json())
    (out / schemas.NORMALIZED_FILENAME).unlink()
    assert verify.main([str(out)]) == 1
    problems = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())["problems"]
    assert problems == [f"{s.file}: band statistics cannot be checked: {schemas.NORMALIZED_FILENAME}, "
                        "which names the raster records, is missing"
                        for s in manifest.splits["train"].shards if s.band_stats is not None]


def test_a_record_whose_check_raises_is_reported_and_the_rest_verified(dataset, monkeypatch, capsys):
    """An unexpected error checking one record (shardsmith's or a library's): exit status 3, not a crash."""
    out, manifest = dataset
    real = schemas.ImageExampleSchema.decode

    def decode(self, data):
        if b"dog/img_01.jpg" in data:
            raise RuntimeError("a bug in a check")
        return real(self, data)

    monkeypatch.setattr(schemas.ImageExampleSchema, "decode", decode)
    assert verify.main([str(out)]) == verify.EXIT_CHECKS_FAILED
    report = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())
    failed = [p for p in report["problems"] if "RuntimeError: a bug in a check" in p]
    assert len(failed) == 1 and "internal_error" in failed[0]
    # That is the only problem: every record was read, the others parsed, decoded and counted
    # (the class counts agree with that one of unknown class).
    assert report["problems"] == failed
    assert report["records"] == manifest.counts["written"]
    assert "hit an error in shardsmith or a decoder" in capsys.readouterr().err


def test_duplicates_within_one_split_are_not_called_a_leak():
    """'6 groups of identical images, 0 of them across splits (a leak between train and
    evaluation)' read as if there were a leak."""
    report = {"ok": True, "records": 4, "splits": {"train": {"shards": 1, "records": 4}},
              "problems": [], "report_path": "verify_report.json",
              "duplicates": {"groups": 2, "across_splits": 0, "list": []}}
    assert verify.describe(report).splitlines()[-1] == \
        "Duplicates: 2 groups of identical images, none across splits: see verify_report.json"
    report["duplicates"]["across_splits"] = 1
    assert "1 of them across splits (a leak between train and evaluation)" in verify.describe(report)
