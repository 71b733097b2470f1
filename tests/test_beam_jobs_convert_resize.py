"""Converting with --max_side/--min_side through the Beam runner: records, normalized.jsonl, verify."""

from __future__ import annotations

import json

import pytest
from helpers import convert, encode, read_records, write

import schemas
from beam_jobs import convert as convert_module
from beam_jobs import verify
from test_imaging_resize import _photo


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    sizes = {"cat/wide.jpg": (120, 200), "cat/tall.jpg": (180, 90), "cat/small.jpg": (40, 30),
             "dog/wide.png": (100, 160), "dog/edge.jpg": (64, 48)}
    for i, (rel, (h, w)) in enumerate(sorted(sizes.items())):
        write(root / rel, encode(_photo(h, w, seed=i), "PNG" if rel.endswith(".png") else "JPEG",
                                 **({} if rel.endswith(".png") else {"quality": 90})))
    return root, sizes


def test_max_side_round_trip(photos, tmp_path):
    root, sizes = photos
    out = tmp_path / "out"
    manifest = convert(root, out, "--max_side", "64", "--jpeg_quality", "90")
    assert manifest.options["resize"] == {"max_side": 64, "jpeg_quality": 90}
    records = {r[schemas.FILENAME.key].decode(): r for r in read_records(out)}
    assert set(records) == set(sizes)
    for rel, (h, w) in sizes.items():
        r = records[rel]
        stored = (int(r[schemas.HEIGHT.key]), int(r[schemas.WIDTH.key]))
        assert max(stored) == min(64, max(h, w)), (rel, stored)
        assert r[schemas.FORMAT.key].decode() == ("png" if rel.endswith(".png") else "jpeg")
    listed = {e["path"]: e for e in map(json.loads, (out / schemas.NORMALIZED_FILENAME).read_text().splitlines())}
    # Only what was larger is listed, with its original size.
    assert set(listed) == {"cat/wide.jpg", "cat/tall.jpg", "dog/wide.png"}
    assert listed["cat/tall.jpg"]["actions"] == ["resize_max_side"]
    assert listed["cat/tall.jpg"]["details"] == {"original": [180, 90], "stored": [64, 32]}
    assert manifest.normalized == {"resize_max_side": 3}
    # Kept byte for byte when it fits.
    assert records["cat/small.jpg"][schemas.IMAGE.key] == (root / "cat/small.jpg").read_bytes()
    assert verify.main([str(out)]) == 0


def test_verify_catches_a_record_larger_than_the_manifest_allows(photos, tmp_path):
    root, _ = photos
    out = tmp_path / "out"
    convert(root, out, "--min_side", "48")
    path = out / schemas.MANIFEST_FILENAME
    doc = json.loads(path.read_text())
    assert doc["options"]["resize"] == {"min_side": 48, "jpeg_quality": 95}
    assert verify.main([str(out)]) == 0
    # A manifest that claims a smaller cap than the records were written with.
    doc["options"]["resize"] = {"min_side": 40, "jpeg_quality": 95}
    path.write_text(json.dumps(doc))
    assert verify.main([str(out)]) == 1
    report = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())
    assert any("cat/wide.jpg: stored at 48x80, larger than the manifest's resize" in p
               for p in report["problems"]), report["problems"]


def test_without_the_flags_the_manifest_has_no_resize(photos, tmp_path):
    manifest = convert(photos[0], tmp_path / "out")
    assert "resize" not in manifest.options and manifest.normalized == {}


@pytest.mark.parametrize("args, message", [
    (["--max_side", "64", "--min_side", "32"], "--max_side caps the longer side and --min_side the shorter"),
    (["--max_side", "0"], "--max_side must be an integer of at least 1. Received: 0"),
    (["--min_side", "-1"], "--min_side must be an integer of at least 1. Received: -1"),
    (["--max_side", "64", "--jpeg_quality", "0"], "--jpeg_quality must be an integer in 1-100. Received: 0"),
    (["--max_side", "64", "--jpeg_quality", "101"], "--jpeg_quality must be an integer in 1-100. Received: 101"),
    (["--jpeg_quality", "90"], "--jpeg_quality sets the quality of resized JPEGs"),
])
def test_bad_flags_exit_2_naming_the_flag(photos, tmp_path, capsys, args, message):
    code = convert_module.main(["--input_dir", str(photos[0]), "--output_dir", str(tmp_path / "o"), *args])
    assert code == 2
    assert message in capsys.readouterr().err
