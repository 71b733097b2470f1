"""Where every record of a split lies, and reading single records by offset.

The converter writes one index file per shard (`schemas.index_filename`): one
line per record, `offset length`, the byte offset of the framed record in the
shard and its framed length (12-byte header + data + 4-byte CRC), the format
of NVIDIA DALI's and the PyPI `tfrecord` package's readers (`schemas.tfrecord`
defines it and the framing). The manifest lists each index file with its
sha256, which is checked here before use.

`read_records_at` turns a dataset of record locations into a dataset of the
records' bytes, one per location and in the same order, reading each record
alone. A damaged record (bad CRC, truncated) becomes an empty string, so that
the caller can count, log and skip it without losing its place: nothing else
is dropped (unlike `ignore_errors` on a `TFRecordDataset`, which gives up on the
rest of the file).

Two ways to read at an offset:

- Local files: a `tf.py_function` reads batches of records with positioned
  reads (`os.pread`) and checks their lengths and CRCs
  (`schemas.tfrecord.check_frame`). Measured on ImageNet-like 150 KB records
  (2 cores), it costs some 80 us of CPU per record, less than reading the shards
  sequentially with `TFRecordDataset` (about 100 us).
- Object stores and other `tf.io.gfile` URLs: `tf.raw_ops.TFRecordDatasetV2`
  with `byte_offsets` (what `tf.data.TFRecordDataset` runs; that input is not
  part of the documented Python API, so it is probed and used in `_record_at`
  alone), one dataset per record inside a deterministic `interleave` that
  overlaps up to 64 reads, which hides the latency of one ranged request per
  record. Locally it costs some 230 us of CPU per record (a dataset and its
  iterator per record), hence the Python reads there (`bench.read`: 0.95x
  the images/s of the Python reads for the training preset). Where TensorFlow lacks
  the `byte_offsets` input, URLs are read in Python too (through
  `tf.io.gfile`, one request at a time per call).

(`tf.data.FixedLengthRecordDataset` with `header_bytes=offset` reads through
the skipped bytes rather than seeking: some 3.5 ms per record at 150 KB, so
it is not used.)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import inspect
import logging
import os

import numpy as np
import tensorflow as tf

from readers.metadata import SplitFiles
from schemas.features import FILENAME, ImageExampleSchema
from schemas.manifest import ManifestError, is_url
from schemas.tfrecord import IndexFileError, check_frame, frame_data, parse_index

__all__ = [
    "RecordIndex", "load_record_index", "load_shard_index", "read_frames", "read_records_at",
    "supports_offset_reads", "check_frame", "describe_damaged",
]

logger = logging.getLogger(__name__)

# Records read concurrently by TensorFlow's reader. Object stores: enough to
# hide the latency of one ranged request per record. Local files (only when
# forced, for comparison): more in flight only adds threads that compete with
# decoding (2 cores: 937 images/s with 4, 916 with 8, 675 with 16, 551 with 64).
_CYCLE_LENGTH_REMOTE = 64
_CYCLE_LENGTH_LOCAL = 8
# Records per call of the Python reader.
_PY_READ_BATCH = 16
# Index files loaded at once.
_INDEX_LOAD_THREADS = 16


def _remedy(data_dir: str) -> str:
    return (
        f"Run `shardsmith verify {data_dir}` to check the dataset, and convert the "
        "images again (with --overwrite) to rewrite it; shuffle='shards' reads "
        "without index files."
    )


@dataclasses.dataclass(frozen=True)
class RecordIndex:
    """Every record of a split: its shard file, byte offset and framed length.

    Records are numbered shard by shard in manifest order, then in file order;
    that number is the record index the global shuffle permutes.

    Attributes:
      paths: The shard files (`SplitFiles.paths`).
      shard: int32 [num_records], index into `paths` of each record.
      offset: int64 [num_records], byte offset of each framed record.
      length: int64 [num_records], framed length (data + 16 bytes).
    """

    paths: tuple[str, ...]
    shard: np.ndarray
    offset: np.ndarray
    length: np.ndarray

    @property
    def num_records(self) -> int:
        return int(self.shard.shape[0])


def load_record_index(split_files: SplitFiles) -> RecordIndex:
    """Loads and checks the index files of a split, as the manifest lists them.

    Args:
      split_files: The split, from `readers.metadata.load_split`.

    Returns:
      The `RecordIndex` of the split.

    Raises:
      schemas.ManifestError: If the manifest lists no index files (a dataset
        converted before they existed), or an index file's sha256 differs from
        the manifest or it does not describe its shard.
      FileNotFoundError: If an index file is missing.
    """
    data_dir = split_files.data_dir
    if len(split_files.index_files) != len(split_files.paths) or not all(
        split_files.index_files
    ):
        raise ManifestError(
            f"The manifest of {data_dir!r} lists no index file for some shards of "
            f"split {split_files.split!r}: the dataset was converted by a shardsmith "
            "version that wrote none. Convert the images again (with --overwrite), or "
            "read with shuffle=True ('shards') or False."
        )
    # In parallel: on an object store each file is a request of its own.
    with concurrent.futures.ThreadPoolExecutor(_INDEX_LOAD_THREADS) as pool:
        parts = list(pool.map(lambda i: load_shard_index(split_files, i), range(len(split_files.paths))))
    shards = [np.full(len(o), i, np.int32) for i, (o, _) in enumerate(parts)]
    offsets = [o for o, _ in parts]
    lengths = [n for _, n in parts]
    logger.debug("Loaded the index of %d shard files of %s.", len(shards), data_dir)
    return RecordIndex(
        paths=tuple(split_files.paths),
        shard=np.concatenate(shards),
        offset=np.concatenate(offsets),
        length=np.concatenate(lengths),
    )


def load_shard_index(split_files: SplitFiles, shard: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, lengths) of the records of shard number `shard` of a split, from its index file.

    Checked as `load_record_index` checks every shard's (the manifest's sha256,
    the entries tiling the shard).

    Raises:
      schemas.ManifestError: If the manifest lists no index file for the shard,
        or the file does not match the manifest.
      FileNotFoundError: If the index file is missing.
    """
    data_dir = split_files.data_dir
    path = split_files.index_files[shard] if shard < len(split_files.index_files) else None
    if not path:
        raise ManifestError(
            f"The manifest of {data_dir!r} lists no index file for shard "
            f"{os.path.basename(split_files.paths[shard])}: the dataset was converted by a shardsmith "
            "version that wrote none. Convert the images again (with --overwrite)."
        )
    name = os.path.basename(path)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(
            f"Index file {name} listed in the manifest is missing from "
            f"{data_dir!r}. {_remedy(data_dir)}"
        )
    with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != split_files.index_sha256[shard]:
        raise ManifestError(
            f"Index file {name} of {data_dir!r} does not match its sha256 in the "
            f"manifest: it was changed or damaged after the conversion. "
            f"{_remedy(data_dir)}"
        )
    try:
        # The manifest's checksum vouches for the file; this check catches
        # an index that belongs to another shard or conversion.
        return parse_index(data, f"{name} of {data_dir!r}", num_records=split_files.num_records[shard],
                           num_bytes=split_files.num_bytes[shard])
    except IndexFileError as e:
        raise ManifestError(f"{e}. {_remedy(data_dir)}") from e


def read_frames(path: str, offsets, lengths):
    """Each indexed record of one shard file, in order, checked alone.

    Args:
      path: The shard file (a local path or a URL).
      offsets, lengths: Its index entries to read (framed records).

    Yields:
      (data, None) for a record that holds, (None, why) for a damaged one
      (`schemas.tfrecord.check_frame`'s reason; 'unreadable (...)' where the
      read itself failed, 'truncated (0 bytes)' past the file's end).
    """
    files = _Files()
    try:
        for offset, length in zip(offsets, lengths):
            try:
                frame = files.read(path, int(offset), int(length))
            except OSError as e:
                yield None, f"unreadable ({e})"
                continue
            why = check_frame(frame)
            yield (frame_data(frame), None) if why is None else (None, why)
    finally:
        files.close()


# --- Reading single records -------------------------------------------------


def _probe_byte_offsets() -> bool:
    op = getattr(tf.raw_ops, "TFRecordDatasetV2", None)
    if op is None:
        return False
    try:
        return "byte_offsets" in inspect.signature(op).parameters
    except (TypeError, ValueError):
        return False


# Whether `_record_at` can run.
_HAS_BYTE_OFFSETS = _probe_byte_offsets()
# 'auto' (TensorFlow's reader for URLs, Python for local files), 'tf' or
# 'python'; tests and the benchmark set it to compare the two.
_READER = "auto"


def supports_offset_reads() -> bool:
    """Whether TensorFlow's TFRecord reader can start at an offset here."""
    return _HAS_BYTE_OFFSETS


def _record_at(path: tf.Tensor, offset: tf.Tensor, length: tf.Tensor) -> tf.data.Dataset:
    """The record framed at `offset` of `path`, read alone and CRC-checked.

    The one use of `TFRecordDatasetV2`'s undocumented `byte_offsets` input: the
    reader starts there, and `take(1)` stops it after one record. The read
    buffer is the record's framed length, so one read fetches it whole.

    Returns:
      A dataset of one scalar string that fails with `DataLossError` if the
      record is damaged.
    """
    variant = tf.raw_ops.TFRecordDatasetV2(
        filenames=tf.reshape(path, [1]),
        compression_type="",
        buffer_size=length,
        byte_offsets=tf.reshape(offset, [1]),
    )
    return tf.data.experimental.from_variant(variant, tf.TensorSpec([], tf.string)).take(1)


class _Files:
    """Files opened for one batch of reads, closed together.

    Per call rather than cached for the process: a split may have more shards
    than a process may keep open, and a shared cache would need care that no
    thread reads from a descriptor another one closed.
    """

    def __init__(self):
        self._open: dict[str, object] = {}

    def read(self, path: str, offset: int, length: int) -> bytes:
        handle = self._open.get(path)
        if is_url(path):
            if handle is None:
                handle = self._open[path] = tf.io.gfile.GFile(path, "rb")
            handle.seek(offset)
            return handle.read(length)
        if handle is None:
            handle = self._open[path] = os.open(path, os.O_RDONLY)
        return os.pread(handle, length, offset)

    def close(self):
        for handle in self._open.values():
            if isinstance(handle, int):
                os.close(handle)
            else:
                handle.close()
        self._open.clear()


def _read_frame(path: str, offset: int, length: int) -> bytes:
    """The framed record bytes at `offset` of `path`, unchecked."""
    files = _Files()
    try:
        return files.read(path, offset, length)
    finally:
        files.close()


def _py_read_batch(paths, offsets, lengths):
    out = []
    files = _Files()
    try:
        for path, offset, length in zip(paths.numpy(), offsets.numpy(), lengths.numpy()):
            try:
                frame = files.read(os.fsdecode(path), int(offset), int(length))
            except OSError:
                # Reported (with the error) by the caller, like a bad CRC.
                frame = b""
            ok = check_frame(frame) is None
            out.append(frame_data(frame) if ok else b"")
    finally:
        files.close()
    return tf.constant(out, tf.string) if out else tf.zeros([0], tf.string)


def read_records_at(locations: tf.data.Dataset, *, remote: bool) -> tf.data.Dataset:
    """Reads the record at each location, in order; damaged ones as b"".

    Args:
      locations: A dataset of (path, offset, length) scalars: a shard file, the
        byte offset of a framed record in it and its framed length.
      remote: The files are URLs (object stores): overlap many reads with
        TensorFlow's reader if it can (see the module docstring).

    Returns:
      A dataset of scalar strings, one per location in the same order: the
      record's data, or an empty string if the record is damaged (bad CRC,
      truncated, unreadable). No record is ever empty, so b"" is unambiguous.
    """
    use_tf = _HAS_BYTE_OFFSETS and (_READER == "tf" or (_READER == "auto" and remote))
    if use_tf:
        empty = tf.data.Dataset.from_tensors(tf.constant(b""))

        # Each record is a dataset of its own: an error affects it alone. It
        # yields one element either way (its data, or b"" after the error), so
        # the output stays aligned with `locations`; deterministic interleave
        # keeps their order while several reads overlap.
        def one(path, offset, length):
            return _record_at(path, offset, length).ignore_errors().concatenate(empty).take(1)

        return locations.interleave(
            one,
            cycle_length=_CYCLE_LENGTH_REMOTE if remote else _CYCLE_LENGTH_LOCAL,
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    if remote and not _HAS_BYTE_OFFSETS:
        logger.warning(
            "tf.raw_ops.TFRecordDatasetV2 takes no byte_offsets in this TensorFlow: "
            "reading records by offset in Python, one request at a time per call "
            "(slow on object stores)."
        )
    return (
        locations.batch(_PY_READ_BATCH)
        .map(
            lambda p, o, n: tf.ensure_shape(
                tf.py_function(_py_read_batch, [p, o, n], tf.string), [None]
            ),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        .unbatch()
    )


def describe_damaged(path: str, offset: int, length: int, schema: ImageExampleSchema) -> str:
    """What is known of a damaged record: why, and its file name if it parses."""
    try:
        frame = _read_frame(path, offset, length)
    except OSError as e:
        return f"unreadable ({e})"
    why = check_frame(frame) or "unreadable by TensorFlow"
    try:
        values = schema.decode(frame_data(frame))
        name = values[FILENAME.key].decode("utf-8", "backslashreplace")
        return f"{why}; file name {name!r}"
    except (ValueError, KeyError):
        return f"{why}; the file name does not parse"
