"""Nothing is lost and nothing looks complete when it is not: dedup, faults, re-runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import convert, encode, make_class_tree, pixels, write

import schemas
from imaging import ValidationOptions
from beam_jobs import _write, verify
from conversion import plan, shard_writer
from conversion.shard_maker import ShardMaker, ShardSpec
from conversion.files import TMP_DIRNAME
from schemas.tfrecord import iter_records


def _rejects(out):
    return {r["path"]: r for r in map(json.loads, (out / schemas.REJECTS_FILENAME).open())}


def test_dedup_keeps_the_smallest_path_and_lists_the_copies(tmp_path):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a", "b"), per_class=3)
    same = encode(pixels(42), "PNG")
    for rel in ("b/z_copy.png", "a/m_copy.png", "b/a_copy.png"):
        write(root / rel, same)
    manifest = convert(root, tmp_path / "out", "--dedup", "--max_reject_fraction", "0.5")
    rejects = _rejects(tmp_path / "out")
    assert {p: r["reason"] for p, r in rejects.items()} == {"b/a_copy.png": "duplicate",
                                                            "b/z_copy.png": "duplicate"}
    assert rejects["b/z_copy.png"]["message"] == "same content as a/m_copy.png"
    assert manifest.counts == {"found": 9, "written": 7, "rejected": 2, "skipped": 0}
    report = verify.run([str(tmp_path / "out")])
    assert report["ok"] and report["duplicates"]["groups"] == 0


def _corpus(root, n=240):
    """Enough work that a conversion is still running when the first shard lands."""
    for i in range(n):
        write(root / f"c{i % 3}" / f"{i:04d}.png", encode(pixels(i, size=(160, 160)), "PNG"))


def _start(root, out, *extra):
    cmd = [sys.executable, "-m", "beam_jobs.convert", "--input_dir", str(root), "--output_dir",
           str(out), "--num_shards", "12", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def _kill_after_first_shard(proc, out, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(out.glob("*.tfrecord")):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return
        if proc.poll() is not None:
            pytest.fail("the conversion finished before it could be interrupted: "
                        + proc.stderr.read().decode()[-2000:])
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("no shard appeared in time")


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A reference conversion and a conversion killed after its first shard."""
    tmp = tmp_path_factory.mktemp("kill")
    root = tmp / "images"
    _corpus(root)
    convert(root, tmp / "reference", "--num_shards", "12")
    out = tmp / "killed"
    proc = _start(root, out)
    _kill_after_first_shard(proc, out)
    return root, tmp / "reference", out


def test_a_killed_conversion_leaves_no_manifest_and_no_partial_shard(interrupted):
    _, reference, out = interrupted
    assert not (out / schemas.MANIFEST_FILENAME).exists()
    finals = sorted(out.glob("*.tfrecord"))
    assert finals and len(finals) < 12
    for shard in finals:
        # Every file under a final name is whole: all records read with valid CRCs,
        # and it is the very file an uninterrupted run writes.
        with shard.open("rb") as f:
            assert sum(1 for _ in iter_records(f)) > 0
        assert shard.read_bytes() == (reference / shard.name).read_bytes()
    assert verify.main([str(out)]) == 2  # "not a finished shardsmith dataset"
    import readers

    with pytest.raises(FileNotFoundError, match="not a finished shardsmith dataset.*did not finish"):
        readers.image_dataset_from_tfrecords(str(out), "train")


def test_resume_finishes_with_the_bytes_of_an_uninterrupted_run(interrupted, tmp_path):
    import shutil

    root, reference, killed = interrupted
    out = tmp_path / "resumed"
    shutil.copytree(killed, out)
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tfrecord")}
    receipts = list((out / TMP_DIRNAME / _write.RECEIPTS_DIRNAME).glob("*.json"))
    with pytest.raises(FileExistsError, match="--resume to finish an interrupted conversion"):
        convert(root, out, "--num_shards", "12")
    convert(root, out, "--num_shards", "12", "--resume")
    for p in sorted(reference.iterdir()):
        assert p.read_bytes() == (out / p.name).read_bytes(), p.name
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())
    # Shards whose receipts survived the kill were kept, not written again.
    for receipt in receipts:
        name = receipt.name.removesuffix(".json")
        if name.endswith(".tfrecord"):
            assert (out / name).stat().st_mtime_ns == kept[name]


def test_overwrite_after_a_kill_completes_and_verifies(interrupted, tmp_path):
    import shutil

    root, _, killed = interrupted
    out = tmp_path / "again"
    shutil.copytree(killed, out)
    convert(root, out, "--num_shards", "6", "--overwrite")
    report = verify.run([str(out)])
    assert report["ok"] and report["records"] == 240
    assert len(list(out.glob("*.tfrecord"))) == 6 and not (out / TMP_DIRNAME).exists()


def test_a_shard_write_that_fails_once_and_is_retried_gives_the_same_bytes(tmp_path, monkeypatch):
    root = tmp_path / "images"
    make_class_tree(root, per_class=4)
    files = [plan.PlannedFile("train", 0, i, rel, str(root / rel), 1, 0, 1)
             for i, rel in enumerate(sorted(p.relative_to(root).as_posix() for p in root.rglob("*.*")))]
    out = tmp_path / "out"

    def maker():
        return ShardMaker(ShardSpec(str(out), ValidationOptions(max_pixels=10**7), num_classes=3, total_shards=1))

    clean = maker().write(maker().shard("train", 0, files))
    first = (out / "train-00000-of-00001.tfrecord").read_bytes()
    (out / "train-00000-of-00001.tfrecord").unlink()
    # The worker dies half-way through the shard, after writing some records.
    class Boom(Exception):
        pass

    attempt = maker()
    # Not a file's fault (that file alone would be rejected): the output
    # fails under the writer, at its fourth record.
    real_write = shard_writer.AtomicWriter.write
    calls = []

    def write(self, data):
        calls.append(len(data))
        if len(calls) == 4:
            raise Boom()
        return real_write(self, data)

    monkeypatch.setattr(shard_writer.AtomicWriter, "write", write)
    with pytest.raises(Boom):
        attempt.write(attempt.shard("train", 0, files))
    monkeypatch.undo()
    # The failed attempt left nothing under the final name ...
    assert not (out / "train-00000-of-00001.tfrecord").exists()
    assert not list((out / TMP_DIRNAME).glob("train-00000-of-00001.tfrecord.*"))
    # ... and the retry writes exactly the bytes of a clean run.
    retried = maker().write(maker().shard("train", 0, files))
    assert (out / "train-00000-of-00001.tfrecord").read_bytes() == first
    assert retried == clean
