"""Resume receipts (conversion/receipts.py): a shard's outcome kept while its files are as written."""

import dataclasses
import hashlib

from conversion import plan as _plan
from conversion.elements import Reject, ShardResult
from conversion.receipts import Receipts, shard_fingerprint, validation_fingerprint
from conversion.shard_writer import ShardOutcome
from imaging import ResizeOptions, ValidationOptions


def _written(out, data=b"records", index=b"index") -> ShardOutcome:
    (out / "train-00000-of-00001.tfrecord").write_bytes(data)
    (out / "train-00000-of-00001.tfrecord.index").write_bytes(index)
    result = ShardResult(
        split="train", index=0, count=1, file="train-00000-of-00001.tfrecord", num_records=2,
        num_bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), class_counts=(1, 1),
        index_file="train-00000-of-00001.tfrecord.index", index_sha256=hashlib.sha256(index).hexdigest(),
        num_sources=2,
    )
    return ShardOutcome(result, [Reject("b/\u00e9.png", "corrupt", "cannot decode")],
                        [("a/1.jpg", "a/1.jpg", ("exif_rotated",), {"angle": 90})])


def test_a_receipt_gives_back_the_outcome_while_the_files_are_as_written(tmp_path):
    outcome = _written(tmp_path)
    receipts = Receipts(str(tmp_path))
    receipts.save("train-00000", "fp", outcome)
    assert receipts.load("train-00000", "fp") == outcome
    assert receipts.load("train-00000", "another") is None  # Other options or files.
    assert receipts.load("train-00001", "fp") is None  # No receipt.
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"changed")
    assert receipts.load("train-00000", "fp") is None


def test_the_fingerprint_follows_what_the_bytes_depend_on():
    files = [_plan.PlannedFile("train", 0, 5, "a/1.jpg", "/in/a/1.jpg", 100, 0, 1)]
    base = shard_fingerprint(ValidationOptions(), files)
    assert base == shard_fingerprint(ValidationOptions(), list(files))
    assert base != shard_fingerprint(ValidationOptions(max_pixels=1000), files)
    # A mask (its path and dtype travel in the file's targets) changes what the bytes depend on.
    masked = [dataclasses.replace(files[0], targets='{"mask":{"dtype":"uint8","path":"/m/a/1.png"}}')]
    assert base != shard_fingerprint(ValidationOptions(), masked)
    deeper = [dataclasses.replace(files[0], targets='{"mask":{"dtype":"uint16","path":"/m/a/1.png"}}')]
    assert shard_fingerprint(ValidationOptions(), deeper) != shard_fingerprint(ValidationOptions(), masked)
    moved = [_plan.PlannedFile("train", 0, 6, "a/1.jpg", "/in/a/1.jpg", 100, 0, 1)]
    assert base != shard_fingerprint(ValidationOptions(), moved)
    # Resizing enters the text only when asked for, as older receipts have it.
    assert "resize" not in validation_fingerprint(ValidationOptions())
    assert "resize" in validation_fingerprint(ValidationOptions(resize=ResizeOptions(max_side=64)))
