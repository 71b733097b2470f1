"""conversion.verification: a converted dataset's shards checked without Beam (`ShardVerifier`), a
damaged byte found and named, and the report built from the checks (`report`)."""

from __future__ import annotations

import pytest
from helpers import convert, make_class_tree

import schemas
from conversion import verification


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("verification")
    written = make_class_tree(root / "in", per_class=5)
    manifest = convert(root / "in", root / "out", "--split", "train=0.6,validation=0.4", "--num_shards", "2")
    return root / "out", manifest, written


def _verifier(out, manifest) -> verification.ShardVerifier:
    verifier = verification.ShardVerifier(str(out), manifest.features, len(manifest.class_names))
    verifier.setup()
    return verifier


def _checks(out, manifest):
    verifier = _verifier(out, manifest)
    checks, contents = [], []
    for split, info in manifest.splits.items():
        for shard in info.shards:
            *tagged, check = verifier.check(split, shard)
            assert isinstance(check, verification.ShardCheck)
            contents += [value for tag, value in tagged if tag == verification.CONTENT]
            checks.append(check)
    return checks, contents


def test_every_record_of_an_intact_dataset_is_checked_and_holds(dataset):
    out, manifest, written = dataset
    checks, contents = _checks(out, manifest)
    assert [p for c in checks for p in c.problems] == []
    assert sum(c.num_records for c in checks) == len(written)
    # One content digest per record, naming its split and its source file.
    assert sorted(name for _, (_, name) in contents) == sorted(written)
    doc = verification.report(manifest, checks, duplicates=[])
    assert doc["ok"] is True and doc["records"] == len(written)
    assert {s: v["records"] for s, v in doc["splits"].items()} == {
        s: info.num_records for s, info in manifest.splits.items()}


def test_a_changed_byte_is_found_and_named(dataset, tmp_path):
    out, manifest, _ = dataset
    shard = manifest.splits["train"].shards[0]
    damaged = tmp_path / "out"
    damaged.mkdir()
    for path in out.iterdir():
        if path.is_file():
            (damaged / path.name).write_bytes(path.read_bytes())
    data = bytearray((damaged / shard.file).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (damaged / shard.file).write_bytes(bytes(data))
    *_, check = _verifier(damaged, manifest).check("train", shard)
    assert check.problems and all(p.startswith(shard.file) for p in check.problems)
    doc = verification.report(manifest, [check], duplicates=[])
    assert doc["ok"] is False
    # The split's other shards were not checked: its record count is named as wrong.
    assert any(p.startswith("split train:") for p in doc["problems"]) == (
        len(manifest.splits["train"].shards) > 1 or check.num_records != shard.num_records)


def test_duplicate_groups_name_every_copy_in_order():
    groups = list(verification.duplicate_group(("ab", [("train", "b.jpg"), ("test", "a.jpg")])))
    assert groups == [{"sha256": "ab", "splits": ["test", "train"],
                       "images": [{"split": "test", "filename": "a.jpg"},
                                  {"split": "train", "filename": "b.jpg"}]}]
    assert list(verification.duplicate_group(("cd", [("train", "c.jpg")]))) == []


def test_class_counts_agree_only_when_the_unchecked_records_explain_the_gap():
    assert verification.counts_agree((3, 2), (3, 2), unchecked=0)
    assert not verification.counts_agree((3, 1), (3, 2), unchecked=0)
    assert verification.counts_agree((3, 1), (3, 2), unchecked=1)
    assert not verification.counts_agree((3, 1), (3, 2), unchecked=2)


def test_raster_records_are_read_from_normalized_jsonl():
    lines = "\n".join([
        '{"path": "a.tif", "details": {"source_bands": 3, "nodata": 0}}',
        '{"path": "b.jpg", "details": {}}',
        '{"path": "c.tif", "details": {"source_bands": 1}}',
    ])
    assert verification.raster_records(lines) == {"a.tif": 0.0, "c.tif": None}
    assert schemas.NORMALIZED_FILENAME  # The file these lines come from.
