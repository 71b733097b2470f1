"""conversion.shard_writer: one shard's file from a `ShardJob` of real files, read back with TensorFlow."""

from __future__ import annotations

import hashlib

import pytest
import tensorflow as tf
from helpers import encode, pixels, write

import schemas
from conversion import guard
from conversion.shard_writer import ShardFile, ShardJob, write_shard
from imaging import ValidationOptions

_NAME = schemas.shard_filename("train", 0, 1)


@pytest.fixture
def inputs(tmp_path):
    """Two JPEGs (classes 0 and 1), a truncated JPEG, a PNG with alpha."""
    root = tmp_path / "in"
    files = {"a/0.jpg": encode(pixels(0), "JPEG", quality=90), "b/1.jpg": encode(pixels(1), "JPEG", quality=90),
             "b/cut.jpg": encode(pixels(2), "JPEG")[:200], "a/alpha.png": encode(pixels(3, mode="RGBA"), "PNG")}
    for rel, data in files.items():
        write(root / rel, data)
    return root, files


def _job(out, root, rels, threads=0, **kwargs) -> ShardJob:
    files = tuple(ShardFile(rel, str(root / rel), (root / rel).stat().st_size if (root / rel).exists() else 0,
                            0 if rel.startswith("a/") else 1, *extra)
                  for rel, *extra in rels)
    return ShardJob(str(out), "train", 0, 1, _NAME, files, 2, ValidationOptions(), threads=threads, **kwargs)


def _records(path) -> list[dict]:
    spec = schemas.ImageExampleSchema().parse_spec()
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(raw, spec).items()}
            for raw in tf.data.TFRecordDataset(str(path))]


def test_a_shard_holds_its_good_files_in_order_and_says_why_of_the_others(inputs, tmp_path):
    root, files = inputs
    out = tmp_path / "out"
    result, rejects, normalized = write_shard(_job(out, root, [("a/0.jpg",), ("b/cut.jpg",), ("a/alpha.png",),
                                                                ("b/1.jpg",)]))
    records = _records(out / _NAME)
    assert [r[schemas.FILENAME.key].decode() for r in records] == ["a/0.jpg", "a/alpha.png", "b/1.jpg"]
    # A valid JPEG is stored byte for byte; the PNG's alpha is flattened, and listed.
    assert records[0][schemas.IMAGE.key] == files["a/0.jpg"] and records[2][schemas.IMAGE.key] == files["b/1.jpg"]
    assert [(p, actions) for p, _, actions, _ in normalized] == [("a/alpha.png", ("flatten_alpha",))]
    assert [(r.rel_path, r.reason) for r in rejects] == [("b/cut.jpg", "corrupt")]
    assert (result.num_records, result.class_counts, result.num_sources) == (3, (2, 1), 3)
    assert result.sha256 == hashlib.sha256((out / _NAME).read_bytes()).hexdigest()
    assert result.index_sha256 == hashlib.sha256((out / result.index_file).read_bytes()).hexdigest()


def test_copies_and_quarantined_files_are_rejected_unread(inputs, tmp_path):
    root, _ = inputs
    quarantined = (("b/1.jpg", guard.DECODER_CRASHED, "b/1.jpg: the process validating it ended (SIGSEGV)"),)
    _, rejects, _ = write_shard(_job(tmp_path / "out", root, [("a/0.jpg",), ("a/gone.jpg", "same content as a/0.jpg"),
                                                              ("b/1.jpg",)], quarantined=quarantined))
    assert [(r.rel_path, r.reason, r.message) for r in rejects] == [
        ("a/gone.jpg", "duplicate", "same content as a/0.jpg"), quarantined[0]]
    assert [r[schemas.FILENAME.key] for r in _records(tmp_path / "out" / _NAME)] == [b"a/0.jpg"]


def test_reading_ahead_on_threads_writes_the_same_bytes(inputs, tmp_path):
    root, _ = inputs
    rels = [("a/0.jpg",), ("b/cut.jpg",), ("a/alpha.png",), ("b/1.jpg",)]
    alone = write_shard(_job(tmp_path / "alone", root, rels, threads=0))
    threaded = write_shard(_job(tmp_path / "threads", root, rels, threads=3))
    assert alone == threaded
    assert (tmp_path / "alone" / _NAME).read_bytes() == (tmp_path / "threads" / _NAME).read_bytes()
