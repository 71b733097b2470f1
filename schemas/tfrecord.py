"""The TFRecord file format and its index files, as bytes: no I/O library, no TensorFlow.

A TFRecord file is a sequence of framed records, each

    uint64 length | uint32 masked CRC32C of length | data | uint32 masked CRC32C of data

(little-endian), the format `tf.io.TFRecordWriter` writes and
`tf.data.TFRecordDataset` reads. The converter writes shards with
`frame_record`, verify reads them back with `iter_records`, and the reader
checks single records read at an offset with `check_frame`.

An index file lists every record of one shard, one line `offset length` per
record (the byte offset of the framed record and its framed length), the
format of NVIDIA DALI's and the PyPI `tfrecord` package's readers.
`format_index` writes it and `parse_index` reads and checks it.

The file I/O around these (Beam's FileSystems for the pipelines, `os.pread`
and `tf.io.gfile` for the reader) lives with its users.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import google_crc32c
import numpy as np

__all__ = [
    "HEADER_BYTES", "FOOTER_BYTES", "FRAME_BYTES", "RecordError", "IndexFileError",
    "masked_crc", "frame_record", "frame_parts", "iter_records", "check_frame", "frame_data",
    "format_index", "parse_index",
]

# Header: the 8-byte length and the 4-byte masked CRC of it. Footer: the
# 4-byte masked CRC of the data.
HEADER_BYTES = 12
FOOTER_BYTES = 4
FRAME_BYTES = HEADER_BYTES + FOOTER_BYTES
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_CRC_MASK_DELTA = 0xA282EAD8
# Bytes of a large part (a volume's voxels) copied at a time for its checksum (`frame_parts`).
_CRC_CHUNK = 4 << 20


class RecordError(ValueError):
    """A TFRecord whose framing or checksum is wrong.

    Attributes:
      name: The file (or stream) the record was read from.
      offset: Byte offset of the damaged record's frame in it.
      reason: What is wrong, e.g. 'data checksum mismatch in the record'.
    """

    def __init__(self, name: str, offset: int, reason: str):
        super().__init__(f"{name}: {reason} at byte {offset}")
        self.name = name
        self.offset = offset
        self.reason = reason


class IndexFileError(ValueError):
    """An index file that is not 'offset length' lines tiling its shard."""


def masked_crc(data) -> int:
    """TFRecord's masked CRC32C of `data` (bytes-like)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def frame_record(record: bytes) -> bytes:
    """One framed TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    header = _LENGTH.pack(len(record))
    return b"".join(
        (header, _CRC.pack(masked_crc(header)), record, _CRC.pack(masked_crc(record)))
    )


def frame_parts(parts) -> list:
    """`frame_record` of the record made of `parts` (bytes-like), as parts: no part is copied.

    A volume's record, hundreds of MB, is written part by part, its voxels
    straight from their array (`schemas.features.encode_example_parts`).
    """
    size = sum(memoryview(p).nbytes for p in parts)
    header = _LENGTH.pack(size)
    crc = 0
    for p in parts:
        if isinstance(p, bytes):
            crc = google_crc32c.extend(crc, p)
            continue
        # The library takes bytes only: a large buffer goes through it a bounded chunk at a time.
        view = memoryview(p).cast("B")
        for start in range(0, view.nbytes, _CRC_CHUNK):
            crc = google_crc32c.extend(crc, bytes(view[start:start + _CRC_CHUNK]))
    masked = (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF
    return [header, _CRC.pack(masked_crc(header)), *parts, _CRC.pack(masked)]


def iter_records(f: BinaryIO, name: str | None = None) -> Iterator[tuple[int, int, bytes]]:
    """Reads framed TFRecords from a binary file object, checking both checksums.

    Args:
      f: Anything with `read(n)`, positioned at the first record.
      name: The file's name in errors (default: `f.name`, if it has one).

    Yields:
      (offset, framed_length, data) per record.

    Raises:
      RecordError: On a truncated record or a checksum mismatch, naming the
        file and the record's offset. Records before it have been yielded.
    """
    if name is None:
        name = str(getattr(f, "name", "TFRecord stream"))
    offset = 0
    while True:
        header = f.read(HEADER_BYTES)
        if not header:
            return
        if len(header) < HEADER_BYTES:
            raise RecordError(name, offset, "truncated record header")
        (length,) = _LENGTH.unpack_from(header)
        (length_crc,) = _CRC.unpack_from(header, 8)
        if masked_crc(header[:8]) != length_crc:
            raise RecordError(name, offset, "length checksum mismatch")
        body = f.read(length + FOOTER_BYTES)
        if len(body) < length + FOOTER_BYTES:
            raise RecordError(name, offset, "truncated record")
        data = body[:length]
        if masked_crc(data) != _CRC.unpack_from(body, length)[0]:
            raise RecordError(name, offset, "data checksum mismatch in the record")
        yield offset, FRAME_BYTES + length, data
        offset += FRAME_BYTES + length


def check_frame(frame: bytes) -> str | None:
    """Why one framed TFRecord (read by its index entry) is damaged, or None if it holds.

    Args:
      frame: Exactly the bytes of one frame, as long as the index says.

    Returns:
      None if its length matches and both CRCs hold; else the reason.
    """
    if len(frame) < FRAME_BYTES:
        return f"truncated ({len(frame)} bytes)"
    (size,) = _LENGTH.unpack_from(frame)
    (header_crc,) = _CRC.unpack_from(frame, 8)
    if header_crc != masked_crc(frame[:8]):
        return "bad length CRC"
    if size != len(frame) - FRAME_BYTES:
        return f"length {size} differs from the index ({len(frame) - FRAME_BYTES})"
    (data_crc,) = _CRC.unpack_from(frame, len(frame) - FOOTER_BYTES)
    if data_crc != masked_crc(frame_data(frame)):
        return "bad data CRC"
    return None


def frame_data(frame: bytes) -> bytes:
    """The data of one framed record (not checked: see `check_frame`)."""
    return frame[HEADER_BYTES:-FOOTER_BYTES]


def format_index(entries: Iterable[tuple[int, int]]) -> bytes:
    """The index file of a shard: one `offset length` line per framed record."""
    return "".join(f"{offset} {length}\n" for offset, length in entries).encode("ascii")


def parse_index(
    data: bytes, name: str, *, num_records: int, num_bytes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Reads an index file and checks that it describes its shard.

    Args:
      data: The index file's bytes.
      name: The index file's name, for errors.
      num_records: Records the shard holds (as the manifest says).
      num_bytes: Size of the shard file (as the manifest says).

    Returns:
      (offsets, lengths), int64 arrays of `num_records` entries.

    Raises:
      IndexFileError: If the file is not `offset length` lines, or its entries
        do not tile a file of `num_records` records in `num_bytes` bytes (an
        index of another shard or conversion).
    """
    try:
        rows = np.array(data.split(), dtype=np.int64).reshape(-1, 2)
    except ValueError as e:
        raise IndexFileError(f"Index file {name} does not hold 'offset length' lines ({e})") from e
    offsets, lengths = rows[:, 0], rows[:, 1]
    tiles = (
        len(rows) == num_records
        and (num_records == 0 or offsets[0] == 0)
        and bool(np.all(lengths >= FRAME_BYTES))
        and bool(np.all(offsets[1:] == offsets[:-1] + lengths[:-1]))
        and (num_records == 0 or int(offsets[-1] + lengths[-1]) == num_bytes)
    )
    if not tiles:
        raise IndexFileError(
            f"Index file {name} does not describe its shard: the manifest says "
            f"{num_records} records in {num_bytes} bytes, the index has {len(rows)} "
            "entries that do not tile the file"
        )
    return offsets, lengths
