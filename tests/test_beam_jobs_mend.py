"""`shardsmith convert --resume` on a finished dataset mends the shards damaged since, and nothing else (issue 39)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from helpers import convert, make_class_tree, read_records, run_without_core_dumps

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
    convert(root, out, "--num_shards", "16")  # In-process: the mends below are the commands under test.
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



def test_a_file_that_crashes_or_hangs_the_mend_is_named_and_every_shard_is_mended(tmp_path):
    """Converted without the faulty plugin (its files are no images then, rejected); mended with it:
    one file segfaults the mending process, one hangs it, one raises. The mend runs supervised, as a
    conversion does: each is quarantined in turn and the mend goes on (unsupervised, it died on the first)."""
    import os

    from helpers import add_faulty_files, faulty_plugin

    root = tmp_path / "images"
    images = make_class_tree(root, classes=("a", "b"), per_class=12)
    faulty = add_faulty_files(root, "b")
    out = tmp_path / "out"
    convert(root, out, "--num_shards", "16", "--max_reject_fraction", "0.5")  # In-process, as `converted`.
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    for shard in out.glob("*.tfrecord"):
        data = bytearray(shard.read_bytes() or b"\0")  # A byte flipped, or one in an empty shard.
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(faulty_plugin(tmp_path)), *filter(None, [os.environ.get("PYTHONPATH")])])}
    mended = run_without_core_dumps([sys.executable, "-m", "shardsmith", "convert", "--input_dir", str(root),
                                    "--output_dir", str(out), "--num_shards", "16", "--max_reject_fraction", "0.5",
                                    "--file_timeout", "8", "--resume"], env=env, capture_output=True, text=True,
                                    timeout=600)
    assert mended.returncode == 0, mended.stderr[-3000:]
    by_kind = {kind: rel for rel, kind in faulty.items()}
    assert f"Rejected {by_kind['SEGV']} (decoder_crashed)" in mended.stderr, mended.stderr[-3000:]
    assert f"Rejected {by_kind['HANG']} (timeout)" in mended.stderr, mended.stderr[-3000:]
    # Those files were rejects of the conversion: every shard is its bytes again, nothing else changed.
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not (out / "_shardsmith_tmp").exists()
    assert sorted(r["filename"].decode() for r in read_records(out)) == sorted(images)


def test_a_shard_holding_a_file_that_failed_in_the_mend_is_left_and_named(converted):
    """A file of a damaged shard that crashed an earlier attempt of the mend (quarantined): that shard
    cannot be the manifest's bytes without it, so it is left as it was and the file named."""
    import json

    root, out, _ = converted
    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    import tensorflow as tf

    shard = manifest.splits["train"].shards[5]  # One no other test damages (`_damage`).
    name = shard.file
    spec = schemas.ImageExampleSchema.from_json(manifest.features).parse_spec()
    raw = next(iter(tf.data.TFRecordDataset(str(out / name))))
    victim = tf.io.parse_single_example(raw, spec)["filename"].numpy().decode()
    data = bytearray((out / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / name).write_bytes(bytes(data))
    broken = bytes(data)
    (out / "_shardsmith_tmp").mkdir()
    (out / "_shardsmith_tmp" / "quarantine.jsonl").write_text(json.dumps(
        {"path": victim, "reason": "decoder_crashed", "message": f"{victim}: the process ended (SIGSEGV)"}) + "\n")
    result = _convert(root, out, "--resume")
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"{name} (sha256 differs from the manifest): left as it was: {victim} failed while it was read " \
           "again (decoder_crashed" in result.stderr, result.stderr[-3000:]
    assert (out / name).read_bytes() == broken
    # Mended by a later --resume once the file reads again (the quarantine was this mend's alone).
    assert not (out / "_shardsmith_tmp").exists()
    assert _convert(root, out, "--resume").returncode == 0
    assert (out / name).read_bytes() != broken
