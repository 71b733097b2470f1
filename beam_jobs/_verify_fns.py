"""The DoFns of `beam_jobs.verify`, in an importable module.

`python -m beam_jobs.verify` runs verify.py as __main__; classes defined there
could not be unpickled by worker processes (multi_processing, Dask, Dataflow).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

import schemas
from imaging import ResizeOptions
from schemas import _tf
from schemas.tfrecord import RecordError, format_index, iter_records
from beam_jobs._files import read_bytes, write_atomically

__all__ = ["ShardCheck", "VerifyShardFn", "duplicate_group", "ReportFn"]

_NAMESPACE = "shardsmith"


@dataclasses.dataclass(frozen=True)
class ShardCheck:
    split: str
    file: str
    num_records: int
    class_counts: tuple[int, ...]
    problems: tuple[str, ...]


class VerifyShardFn(beam.DoFn):
    """Reads one shard and checks everything about it.

    Input: (split, ShardInfo). Main output: ShardCheck. Tagged output
    CONTENT: (sha256 of image bytes, (split, filename)).

    Args:
      dataset_dir: The dataset folder.
      features: The manifest's feature specs.
      num_classes: Number of classes.
      resize: The manifest's `options.resize` (--max_side/--min_side), whose
        sizes every stored image must obey; None when the dataset has none.
    """

    CONTENT = "content"

    def __init__(self, dataset_dir: str, features, num_classes: int, resize: dict | None = None):
        self._dir = dataset_dir
        # Plain JSON in, validated here: a malformed manifest fails before any worker starts.
        self._resize = ResizeOptions.from_json(resize) if resize else None
        self._features = dict(features)
        self._num_classes = num_classes
        self._records = Metrics.counter(_NAMESPACE, "records_verified")
        self._schema = None
        self._tf = None

    def setup(self):
        # The whole library (decode_image is not a plain op), imported the
        # cheap way (schemas/_tf.py).
        self._tf = _tf.full()
        self._schema = schemas.ImageExampleSchema.from_json(self._features)

    def process(self, element):
        split, shard = element
        problems = []
        counts = [0] * self._num_classes
        stored = []  # (format, height, width) of each good record
        path = FileSystems.join(self._dir, shard.file)
        sha = hashlib.sha256()
        size = 0
        offsets = []
        if not FileSystems.exists(path):
            yield ShardCheck(split, shard.file, 0, tuple(counts), (f"{shard.file}: file is missing",))
            return
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            reader = _HashingReader(f, sha)
            try:
                for number, (offset, length, data) in enumerate(iter_records(reader, shard.file)):
                    offsets.append((offset, length))
                    problem, label, digest, name, image = self._check_record(data)
                    if problem:
                        problems.append(f"{shard.file}: record {number} (byte {offset}): {problem}")
                        continue
                    counts[label] += 1
                    stored.append(image)
                    self._records.inc()
                    yield beam.pvalue.TaggedOutput(self.CONTENT, (digest, (split, name)))
            except RecordError as e:
                # The error names the shard file and the record's offset.
                problems.append(f"{e}; the rest of the shard is unreadable")
            size = reader.size
        if size != shard.num_bytes:
            problems.append(f"{shard.file}: {size} bytes, the manifest says {shard.num_bytes}")
        elif sha.hexdigest() != shard.sha256:
            problems.append(f"{shard.file}: sha256 differs from the manifest")
        if len(offsets) != shard.num_records:
            problems.append(f"{shard.file}: {len(offsets)} records, the manifest says {shard.num_records}")
        if tuple(counts) != tuple(shard.class_counts):
            problems.append(f"{shard.file}: class counts {counts}, the manifest says {list(shard.class_counts)}")
        stats = schemas.ImageStats.of(stored)
        if shard.images is not None and not problems and stats != shard.images:
            # Readers specialise on these (e.g. JPEGs of one size): they must be true.
            problems.append(f"{shard.file}: images {stats and stats.to_json()}, the manifest "
                            f"says {shard.images.to_json()}")
        problems.extend(self._check_index(shard, offsets))
        yield ShardCheck(split, shard.file, len(offsets), tuple(counts), tuple(problems))

    def _check_record(self, data: bytes):
        """Returns (problem or None, label, content digest, filename, (format, height, width))."""
        try:
            values = self._schema.decode(data)
        except ValueError as e:
            return f"does not parse: {e}", None, None, None, None
        name = values[schemas.FILENAME.key].decode("utf-8", "backslashreplace")
        label = values[schemas.LABEL.key]
        if not 0 <= label < self._num_classes:
            return f"{name}: label {label} is outside [0, {self._num_classes})", None, None, name, None
        image = values[schemas.IMAGE.key]
        stored = (values[schemas.HEIGHT.key], values[schemas.WIDTH.key], values[schemas.CHANNELS.key])
        try:
            raw = schemas.parse_raw_format(values[schemas.FORMAT.key])
        except ValueError as e:
            return f"{name}: {e}", None, None, name, None
        try:
            if raw is None:
                shape = self._tf.io.decode_image(image, expand_animations=False).shape
            else:
                shape = self._raw_shape(image, raw, stored)
        except self._tf.errors.OpError as e:
            return (f"{name}: image does not decode ({e.message.split('}}')[-1].strip()})", None,
                    None, name, None)
        if tuple(shape) != stored:
            return f"{name}: decodes to {tuple(shape)}, the record says {stored}", None, None, name, None
        if self._resize is not None and not self._resize.allows(stored[0], stored[1]):
            return (f"{name}: stored at {stored[0]}x{stored[1]}, larger than the manifest's "
                    f"resize {self._resize.to_json()} allows"), None, None, name, None
        fmt = values[schemas.FORMAT.key].decode("ascii", "replace")
        return None, label, hashlib.sha256(image).hexdigest(), name, (fmt, stored[0], stored[1])

    def _raw_shape(self, image: bytes, dtype: str, stored):
        """The shape a raw record decodes to: its bytes as `dtype`, reshaped as the record says."""
        tf = self._tf
        values = tf.io.decode_raw(image, getattr(tf, dtype), little_endian=True)
        h, w, c = stored
        if int(values.shape[0]) != h * w * c:
            # Not reshapeable: report the sample count the bytes hold.
            return (int(values.shape[0]),)
        return tuple(tf.reshape(values, (h, w, c)).shape)

    def _check_index(self, shard, offsets):
        if not shard.index_file:
            return []
        path = FileSystems.join(self._dir, shard.index_file)
        if not FileSystems.exists(path):
            return [f"{shard.index_file}: index file is missing"]
        data = read_bytes(path)
        if hashlib.sha256(data).hexdigest() != shard.index_sha256:
            return [f"{shard.index_file}: sha256 differs from the manifest"]
        if data != format_index(offsets):
            return [f"{shard.index_file}: offsets do not match the shard's records"]
        return []


class _HashingReader:
    """A file wrapper that hashes and counts what is read through it."""

    def __init__(self, f, sha):
        self._f = f
        self._sha = sha
        self.size = 0

    def read(self, n: int) -> bytes:
        data = self._f.read(n)
        self._sha.update(data)
        self.size += len(data)
        return data


def duplicate_group(element):
    digest, members = element
    members = sorted(members)
    if len(members) > 1:
        yield {"sha256": digest, "images": [{"split": s, "filename": n} for s, n in members],
               "splits": sorted({s for s, _ in members})}


class ReportFn(beam.DoFn):
    """Builds the report from every shard check and duplicate group; writes it."""

    def __init__(self, manifest_json: str, report_path: str):
        self._manifest_json = manifest_json
        self._report_path = report_path

    def process(self, unused, checks, duplicates):
        manifest = schemas.Manifest.from_json(self._manifest_json)
        problems = [p for c in sorted(checks, key=lambda c: c.file) for p in c.problems]
        splits = {}
        for name, info in manifest.splits.items():
            mine = [c for c in checks if c.split == name]
            records = sum(c.num_records for c in mine)
            counts = tuple(sum(col) for col in zip(*(c.class_counts for c in mine))) if mine else ()
            if records != info.num_records:
                problems.append(f"split {name}: {records} records, the manifest says {info.num_records}")
            if mine and counts != info.class_counts:
                problems.append(f"split {name}: class counts {list(counts)}, the manifest says "
                                f"{list(info.class_counts)}")
            splits[name] = {"shards": len(mine), "records": records}
        duplicates = sorted(duplicates, key=lambda d: d["images"][0]["filename"])
        report = {
            "ok": not problems,
            "problems": problems,
            "splits": splits,
            "records": sum(s["records"] for s in splits.values()),
            "duplicates": {
                "groups": len(duplicates),
                "across_splits": sum(1 for d in duplicates if len(d["splits"]) > 1),
                "list": duplicates,
            },
        }
        text = json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        directory, name = self._report_path.rsplit("/", 1) if "/" in self._report_path else (".", self._report_path)
        write_atomically(directory, name, text.encode())
        yield report
