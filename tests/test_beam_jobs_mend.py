"""`shardsmith convert --resume` on a finished dataset mends the shards damaged since, and nothing else (issue 39)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from helpers import make_class_tree, read_records

import schemas


def _convert(root, out, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardsmith", "convert", "--input_dir", str(root), "--output_dir",
                           str(out), "--num_shards", "16", *extra], capture_output=True, text=True, timeout=600)


def _damage(out: pathlib.Path, manifest: schemas.Manifest) -> list[str]:
    """A data byte flipped in one shard, a length byte in another, a third cut short; their names."""
    shards = manifest.splits["train"].shards
    damaged = []
    for shard, how in ((shards[2], "data"), (shards[7], "length"), (shards[11], "cut")):
        offset, length = map(int, (out / shard.index_file).read_text().splitlines()[0].split())
        path = out / shard.file
        data = bytearray(path.read_bytes())
        if how == "data":
            data[offset + length // 2] ^= 0xFF
        elif how == "length":
            data[offset + 1] ^= 0x01
        else:
            data = data[:offset + length // 2]
        path.write_bytes(bytes(data))
        damaged.append(shard.file)
    return damaged


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mend")
    root = tmp / "images"
    images = make_class_tree(root, classes=("a", "b"), per_class=24)
    out = tmp / "out"
    result = _convert(root, out)
    assert result.returncode == 0, result.stderr[-3000:]
    return root, out, images


def test_resume_rewrites_only_the_damaged_shards_and_everything_reads_back(converted):
    root, out, images = converted
    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    assert len(manifest.splits["train"].shards) == 16
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    damaged = _damage(out, manifest)
    damaged_times = {name: (out / name).stat().st_mtime_ns for name in damaged}

    result = _convert(root, out, "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "3 shard(s) of the finished dataset" in result.stderr
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    # The same files, every one with its bytes from before the damage.
    assert sorted(after) == sorted(before)
    assert all(after[name][0] == before[name][0] for name in before)
    # Only the 3 damaged shards were written (their indexes held and were kept).
    rewritten = sorted(name for name in after if after[name][1] != before[name][1])
    assert rewritten == sorted(damaged)
    assert all(after[name][1] != damaged_times[name] for name in damaged)
    assert sorted(r["filename"].decode() for r in read_records(out)) == sorted(images)


def test_resume_on_an_undamaged_finished_dataset_changes_nothing(converted):
    root, out, _ = converted
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    result = _convert(root, out, "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nothing to do" in result.stderr and "every shard matches it" in result.stderr
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_a_shard_whose_sources_changed_is_not_replaced(converted, tmp_path):
    root, out, _ = converted
    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    [name] = _damage(out, manifest)[:1]
    broken = (out / name).read_bytes()
    # Every source changed (same names, other pixels): the shard cannot be written as the manifest says.
    other = tmp_path / "other"
    make_class_tree(other, classes=("a", "b"), per_class=24, seed=5)
    result = _convert(other, out, "--resume")
    assert result.returncode == 1
    assert "its bytes differ from the manifest's" in result.stderr
    assert (out / name).read_bytes() == broken
