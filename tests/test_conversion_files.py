"""Atomic writes and whole-file reads (beam_jobs/files.py)."""

from __future__ import annotations

import hashlib
import os

import pytest

from conversion import files
from conversion.files import TMP_DIRNAME, AtomicWriter, read_bytes


def test_writes_in_chunks_give_the_same_file_size_and_checksum(tmp_path):
    # Writes are collected into ~1 MiB chunks: the file, its size and its
    # checksum are those of every write in order, across chunk boundaries
    # (a record larger than a chunk too), and nothing shows before commit.
    parts = [bytes([i % 256]) * (i * 37 % 5000) for i in range(1200)]
    parts.insert(600, os.urandom(3 * files._WRITE_CHUNK // 2))
    writer = AtomicWriter(str(tmp_path), "shard.tfrecord")
    offsets = []
    for part in parts:
        offsets.append(writer.num_bytes)
        writer.write(part)
    assert not (tmp_path / "shard.tfrecord").exists()
    writer.commit()
    data = (tmp_path / "shard.tfrecord").read_bytes()
    assert data == b"".join(parts)
    assert writer.num_bytes == len(data)
    assert writer.sha256 == hashlib.sha256(data).hexdigest()
    assert [data[o:o + len(p)] == p for o, p in zip(offsets, parts)] == [True] * len(parts)


def test_abort_leaves_no_file(tmp_path):
    writer = AtomicWriter(str(tmp_path), "shard.tfrecord")
    writer.write(b"x" * (files._WRITE_CHUNK + 1))
    writer.write(b"pending")
    writer.abort()
    assert not (tmp_path / "shard.tfrecord").exists()
    assert list((tmp_path / TMP_DIRNAME).iterdir()) == []


def test_read_bytes_of_local_files_and_their_errors(tmp_path):
    path = tmp_path / "a.jpg.gz"  # No decompression whatever the extension.
    path.write_bytes(b"\x1f\x8bnot gzip")
    assert read_bytes(str(path)) == b"\x1f\x8bnot gzip"
    with pytest.raises(FileNotFoundError):
        read_bytes(str(tmp_path / "missing.jpg"))
    with pytest.raises(IsADirectoryError):
        read_bytes(str(tmp_path))


def test_remove_deletes_one_file_and_ignores_a_missing_one(tmp_path):
    path = tmp_path / "gone.txt"
    path.write_text("x")
    files.remove(str(path))
    assert not path.exists()
    files.remove(str(path))
    assert not path.exists()


def test_read_many_keeps_the_order_and_each_files_error(tmp_path):
    # More files than one local task reads, so several tasks run on the pool.
    count = 3 * files._LOCAL_READ_CHUNK + 5
    paths = []
    for i in range(count):
        path = tmp_path / f"f{i:04d}.txt"
        path.write_bytes(f"file {i}".encode() * (i % 7 + 1))
        paths.append(str(path))
    paths[10] = str(tmp_path / "gone.txt")  # Removed after it was listed.
    (tmp_path / "folder.txt").mkdir()
    paths[150] = str(tmp_path / "folder.txt")
    found = files.read_many(reversed(paths))[::-1]
    assert len(found) == count
    assert isinstance(found[10], FileNotFoundError) and found[10].filename == paths[10]
    assert isinstance(found[150], IsADirectoryError)
    assert [found[i] == read_bytes(paths[i]) for i in range(count) if i not in (10, 150)] == [True] * (count - 2)
    assert files.read_many([]) == []
