"""The TFRecord framing and index-file format (schemas/tfrecord.py)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from schemas import tfrecord

_RECORDS = [b"first", b"", b"\x00" * 300, bytes(range(256)) * 40]


def _framed_file(tmp_path, records=_RECORDS):
    path = tmp_path / "shard.tfrecord"
    path.write_bytes(b"".join(tfrecord.frame_record(r) for r in records))
    return path


def test_frames_equal_tensorflows_writer_and_read_back(tmp_path):
    # TensorFlow's own writer is the reference for the bytes (and so for the
    # masked CRC32C); its reader checks both CRCs of every frame.
    reference = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(reference)) as writer:
        for record in _RECORDS:
            writer.write(record)
    path = _framed_file(tmp_path)
    assert path.read_bytes() == reference.read_bytes()
    read = [t.numpy() for t in tf.data.TFRecordDataset(str(path))]
    assert read == _RECORDS


def test_masked_crc_known_value():
    # The first frame of a file holding b"first": its 8-byte length and the
    # masked CRC32C of it, as TensorFlow's writer wrote them (see above).
    assert tfrecord.masked_crc(b"\x05" + b"\x00" * 7) == int.from_bytes(
        tfrecord.frame_record(b"first")[8:12], "little")
    # CRC32C("123456789") is 0xE3069283 (RFC 3720's check value), then masked.
    crc = 0xE3069283
    assert tfrecord.masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_iter_records_gives_offsets_lengths_and_data(tmp_path):
    path = _framed_file(tmp_path)
    with open(path, "rb") as f:
        got = list(tfrecord.iter_records(f))
    assert [data for _, _, data in got] == _RECORDS
    offsets = [o for o, _, _ in got]
    lengths = [n for _, n, _ in got]
    assert lengths == [len(r) + tfrecord.FRAME_BYTES for r in _RECORDS]
    assert offsets == [0, *np.cumsum(lengths)[:-1].tolist()]
    assert offsets[-1] + lengths[-1] == os.path.getsize(path)
    blob = path.read_bytes()
    for offset, length, data in got:
        frame = blob[offset:offset + length]
        assert tfrecord.check_frame(frame) is None
        assert tfrecord.frame_data(frame) == data


def _damage(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 0x01]) + blob[at + 1:]


@pytest.mark.parametrize("where, reason", [
    (lambda start: start + 3, "length checksum mismatch"),
    (lambda start: start + 9, "length checksum mismatch"),
    (lambda start: start + 14, "data checksum mismatch in the record"),
])
def test_a_damaged_frame_names_the_file_and_its_offset(where, reason):
    blob = b"".join(tfrecord.frame_record(r) for r in _RECORDS)
    third = sum(len(r) + tfrecord.FRAME_BYTES for r in _RECORDS[:2])
    f = io.BytesIO(_damage(blob, where(third)))
    records = tfrecord.iter_records(f, "train-00000-of-00001.tfrecord")
    assert [data for _, _, data in (next(records), next(records))] == _RECORDS[:2]
    with pytest.raises(tfrecord.RecordError) as e:
        next(records)
    assert (e.value.offset, e.value.reason) == (third, reason)
    assert str(e.value) == f"train-00000-of-00001.tfrecord: {reason} at byte {third}"


def test_truncated_files_name_the_offset(tmp_path):
    blob = _framed_file(tmp_path).read_bytes()
    last = len(blob) - len(_RECORDS[-1]) - tfrecord.FRAME_BYTES
    for cut, reason in ((last + 5, "truncated record header"), (len(blob) - 1, "truncated record")):
        with pytest.raises(tfrecord.RecordError, match=rf"^x.tfrecord: {reason} at byte {last}$"):
            list(tfrecord.iter_records(io.BytesIO(blob[:cut]), "x.tfrecord"))
    # Without a name, the file object's own.
    path = tmp_path / "cut.tfrecord"
    path.write_bytes(blob[:-1])
    with open(path, "rb") as f, pytest.raises(tfrecord.RecordError, match=rf"cut.tfrecord: truncated"):
        list(tfrecord.iter_records(f))


def test_check_frame_says_why():
    frame = tfrecord.frame_record(b"payload")
    assert tfrecord.check_frame(frame[:10]) == "truncated (10 bytes)"
    assert tfrecord.check_frame(_damage(frame, 0)) == "bad length CRC"
    assert tfrecord.check_frame(_damage(frame, 13)) == "bad data CRC"
    assert tfrecord.check_frame(_damage(frame, len(frame) - 1)) == "bad data CRC"
    # A frame read with another record's length (an index of another shard).
    longer = frame + b"\x00"
    assert tfrecord.check_frame(longer) == "length 7 differs from the index (8)"


def test_index_round_trip():
    entries = [(0, 21), (21, 16), (37, 316)]
    data = tfrecord.format_index(entries)
    assert data == b"0 21\n21 16\n37 316\n"
    offsets, lengths = tfrecord.parse_index(data, "x.index", num_records=3, num_bytes=353)
    assert offsets.dtype == lengths.dtype == np.int64
    assert list(zip(offsets.tolist(), lengths.tolist())) == entries
    empty = tfrecord.parse_index(tfrecord.format_index([]), "e.index", num_records=0, num_bytes=0)
    assert [len(a) for a in empty] == [0, 0]


def test_index_of_a_written_shard(tmp_path):
    path = _framed_file(tmp_path)
    with open(path, "rb") as f:
        entries = [(o, n) for o, n, _ in tfrecord.iter_records(f)]
    offsets, lengths = tfrecord.parse_index(
        tfrecord.format_index(entries), "shard.index", num_records=len(_RECORDS),
        num_bytes=os.path.getsize(path))
    blob = path.read_bytes()
    assert [tfrecord.frame_data(blob[o:o + n]) for o, n in zip(offsets, lengths)] == _RECORDS


@pytest.mark.parametrize("data, records, size, match", [
    (b"0 21\n21\n", 2, 37, "does not hold 'offset length' lines"),
    (b"0 x\n", 1, 21, "does not hold 'offset length' lines"),
    (b"0 21\n21 16\n", 3, 37, "says 3 records in 37 bytes, the index has 2 entries"),
    (b"0 21\n22 15\n", 2, 37, "do not tile the file"),
    (b"1 21\n22 16\n", 2, 38, "do not tile the file"),
    (b"0 21\n21 16\n", 2, 40, "do not tile the file"),
    (b"0 10\n10 10\n", 2, 20, "do not tile the file"),
])
def test_index_errors_name_the_file(data, records, size, match):
    with pytest.raises(tfrecord.IndexFileError, match=rf"^Index file bad.index .*{match}"):
        tfrecord.parse_index(data, "bad.index", num_records=records, num_bytes=size)


def test_the_format_layer_loads_neither_beam_nor_tensorflow():
    # Verify-like use in a fresh interpreter: frame, read back, decode a record.
    code = (
        "import io, sys\n"
        "from schemas import IMAGE_SCHEMA, ImageRecord, tfrecord\n"
        "record = IMAGE_SCHEMA.encode(ImageRecord(image=b'x', label=1, filename='a', format='png',"
        " height=1, width=1, channels=1))\n"
        "((_, _, data),) = tfrecord.iter_records(io.BytesIO(tfrecord.frame_record(record)))\n"
        "print(IMAGE_SCHEMA.decode(data)['label'])\n"
        "print(sorted(m for m in ('tensorflow', 'apache_beam') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(__file__))).stdout
    assert out.split("\n")[:2] == ["1", "[]"]
