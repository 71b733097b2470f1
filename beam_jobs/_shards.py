"""The body of the conversion: validating and writing shards, then the manifest.

These DoFns and element types live in an importable module (not the script
run as __main__), so every runner can pickle them to its workers.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

import schemas
from beam_jobs import _listing, _plan
from beam_jobs._images import ImageRejected, ImageValidator
from beam_jobs._tfrecord import TMP_DIRNAME, AtomicWriter, frame_record, read_bytes, write_atomically

__all__ = [
    "ConversionError", "ShardResult", "Reject", "WriteShardFn", "ImagesToTFRecords", "FinalizeFn",
    "problem_to_reject", "remove_dataset_files", "delete_if_exists",
]

_LOG = logging.getLogger("shardsmith.convert")
_NAMESPACE = "shardsmith"


class ConversionError(Exception):
    """The conversion ran but its result must not be used (e.g. too many rejects)."""


@dataclasses.dataclass(frozen=True)
class ShardResult:
    split: str
    index: int
    count: int
    file: str
    num_records: int
    num_bytes: int
    sha256: str
    class_counts: tuple[int, ...]
    index_file: str
    index_sha256: str


@dataclasses.dataclass(frozen=True)
class Reject:
    rel_path: str
    reason: str
    message: str

    @property
    def kind(self) -> str:
        return "skipped" if self.reason in schemas.SKIP_REASONS else "rejected"

    def to_json(self) -> str:
        return json.dumps(
            {
                "path": _listing.display_path(self.rel_path),
                "kind": self.kind,
                "reason": self.reason,
                "message": self.message,
            },
            sort_keys=True,
            ensure_ascii=False,
        )


class WriteShardFn(beam.DoFn):
    """Reads, validates and writes the images of one shard.

    Input: ((split, shard_index), iterable of PlannedFile).
    Main output: ShardResult. Tagged outputs: REJECTED (Reject) and
    NORMALIZED ((rel_path, source_format, actions)).
    """

    REJECTED = "rejected"
    NORMALIZED = "normalized"

    def __init__(self, *, output_dir, num_classes, total_shards, max_pixels, background, full_decode):
        # Plain values only: the DoFn is pickled to every worker.
        self._output_dir = output_dir
        self._num_classes = num_classes
        self._total_shards = total_shards
        self._validator_args = dict(max_pixels=max_pixels, background=background, full_decode=full_decode)
        self._written = Metrics.counter(_NAMESPACE, "records_written")
        self._shards = Metrics.counter(_NAMESPACE, "shards_written")
        self._validator = None

    def setup(self):
        self._validator = ImageValidator(**self._validator_args)

    def process(self, element):
        (split, index), files = element
        files = sorted(files)
        name = schemas.shard_filename(split, index, files[0].num_shards)
        writer = AtomicWriter(self._output_dir, name)
        index_lines = []
        class_counts = [0] * self._num_classes
        rejected = 0
        try:
            for f in files:
                try:
                    image = self._validator.validate(self._read(f), f.rel_path)
                except ImageRejected as e:
                    rejected += 1
                    Metrics.counter(_NAMESPACE, f"rejected_{e.reason}").inc()
                    yield beam.pvalue.TaggedOutput(self.REJECTED, Reject(f.rel_path, e.reason, e.message))
                    continue
                if image.actions:
                    Metrics.counter(_NAMESPACE, "normalized").inc()
                    yield beam.pvalue.TaggedOutput(
                        self.NORMALIZED, (f.rel_path, image.source_format, image.actions)
                    )
                record = schemas.IMAGE_SCHEMA.encode(schemas.ImageRecord(
                    image=image.data,
                    label=f.label,
                    filename=f.rel_path,
                    format=image.format,
                    height=image.height,
                    width=image.width,
                    channels=image.channels,
                ))
                framed = frame_record(record)
                index_lines.append(f"{writer.num_bytes} {len(framed)}\n")
                writer.write(framed)
                class_counts[f.label] += 1
                self._written.inc()
        except BaseException:
            writer.abort()
            raise
        writer.commit()
        index_name = schemas.index_filename(name)
        index_writer = AtomicWriter(self._output_dir, index_name)
        index_writer.write("".join(index_lines).encode())
        index_writer.commit()
        self._shards.inc()
        num_records = sum(class_counts)
        _LOG.info(
            "Wrote %s: %s images%s [%d of %d shards done]",
            name, f"{num_records:,}", f", {rejected} rejected" if rejected else "",
            self._count_done(), self._total_shards,
        )
        yield ShardResult(
            split, index, files[0].num_shards, name, num_records, writer.num_bytes,
            writer.sha256, tuple(class_counts), index_name, index_writer.sha256,
        )

    def _read(self, f):
        try:
            return read_bytes(f.path)
        except OSError as e:
            # Beam wraps local I/O errors (permissions, vanished files).
            raise ImageRejected("unreadable", f"{f.rel_path}: {e}") from e

    def _count_done(self) -> int:
        # Workers share no memory; the finished shards on disk are the progress.
        pattern = FileSystems.join(self._output_dir, "*.tfrecord")
        return len(FileSystems.match([pattern])[0].metadata_list)


def _key_by_shard(f: _plan.PlannedFile):
    return (f.split, f.shard), f


class ImagesToTFRecords(beam.PTransform):
    """Writes planned files into shards: only paths are grouped, never bytes.

    Input: PCollection of `PlannedFile`. Output: a tuple-like with the main
    output (shard results) and the tagged outputs `rejected` and `normalized`.

    Args:
      output_dir: Folder of the shards.
      num_classes: Number of classes (for per-shard class counts).
      total_shards: Shards of all splits together (for progress lines).
      max_pixels, background, full_decode: See `ImageValidator`.
    """

    def __init__(self, *, output_dir, num_classes, total_shards, max_pixels,
                 background=(255, 255, 255), full_decode=False):
        super().__init__()
        self._fn = WriteShardFn(
            output_dir=output_dir, num_classes=num_classes, total_shards=total_shards,
            max_pixels=max_pixels, background=background, full_decode=full_decode,
        )

    def expand(self, files):
        return (
            files
            | "KeyByShard" >> beam.Map(_key_by_shard)  # ((split, shard), PlannedFile)
            | "GroupByShard" >> beam.GroupByKey()  # ((split, shard), [PlannedFile])
            | "ValidateAndWrite" >> beam.ParDo(self._fn).with_outputs(
                WriteShardFn.REJECTED, WriteShardFn.NORMALIZED, main="shards"
            )
        )


class FinalizeFn(beam.DoFn):
    """Writes rejects.jsonl, normalized.jsonl, then manifest.json (last)."""

    def __init__(self, *, output_dir, class_names, shard_counts, num_found, options,
                 max_reject_fraction):
        self._output_dir = output_dir
        self._class_names = tuple(class_names)
        self._shard_counts = dict(shard_counts)
        self._num_found = num_found
        self._options = options
        self._max_reject_fraction = max_reject_fraction

    def process(self, unused_element, shards, rejects, normalized):
        rejects = sorted(rejects, key=lambda r: os.fsencode(r.rel_path))
        write_atomically(
            self._output_dir, schemas.REJECTS_FILENAME,
            "".join(r.to_json() + "\n" for r in rejects).encode(),
        )
        normalized = sorted(normalized, key=lambda n: os.fsencode(n[0]))
        write_atomically(
            self._output_dir, schemas.NORMALIZED_FILENAME,
            "".join(
                json.dumps({"path": _listing.display_path(p), "source_format": src,
                            "actions": list(actions)}, sort_keys=True, ensure_ascii=False) + "\n"
                for p, src, actions in normalized
            ).encode(),
        )
        written = sum(s.num_records for s in shards)
        kinds = collections.Counter(r.kind for r in rejects)
        counts = {
            "found": self._num_found,
            "written": written,
            "rejected": kinds["rejected"],
            "skipped": kinds["skipped"],
        }
        if written + kinds["rejected"] + kinds["skipped"] != self._num_found:
            # An internal invariant, not a user error: an input went missing.
            raise RuntimeError(f"Inputs do not reconcile, nothing may be lost: {counts}")
        considered = written + kinds["rejected"]
        if considered and kinds["rejected"] / considered > self._max_reject_fraction:
            raise ConversionError(
                f"{kinds['rejected']:,} of {considered:,} images were rejected, more than "
                f"--max_reject_fraction={self._max_reject_fraction:g}; see "
                f"{FileSystems.join(self._output_dir, schemas.REJECTS_FILENAME)}. "
                "No manifest was written."
            )
        splits = {}
        for split, count in self._shard_counts.items():
            mine = sorted((s for s in shards if s.split == split), key=lambda s: s.index)
            if [s.index for s in mine] != list(range(count)):
                raise RuntimeError(f"Split {split!r}: shards {[s.index for s in mine]} of {count}")
            splits[split] = schemas.SplitInfo(split, tuple(
                schemas.ShardInfo(s.file, s.num_records, s.num_bytes, s.sha256, s.class_counts,
                                  s.index_file, s.index_sha256)
                for s in mine
            ))
        actions = collections.Counter(a for _, _, acts in normalized for a in acts)
        manifest = schemas.Manifest(
            schema_version=schemas.SCHEMA_VERSION,
            tool_version=schemas.__version__,
            features=schemas.IMAGE_SCHEMA.to_json(),
            class_names=self._class_names,
            splits=splits,
            counts=counts,
            rejects=dict(sorted(collections.Counter(r.reason for r in rejects).items())),
            normalized=dict(sorted(actions.items())),
            options=self._options,
        )
        keep = {name for info in splits.values() for s in info.shards for name in (s.file, s.index_file)}
        remove_dataset_files(self._output_dir, keep=keep)
        write_atomically(self._output_dir, schemas.MANIFEST_FILENAME, manifest.to_json().encode())
        delete_if_exists(FileSystems.join(self._output_dir, TMP_DIRNAME))
        yield manifest


def problem_to_reject(p: _listing.Problem) -> Reject:
    return Reject(p.rel_path, p.reason, p.message)


def delete_if_exists(path: str) -> None:
    if FileSystems.exists(path):
        FileSystems.delete([path])


def remove_dataset_files(output_dir: str, keep=frozenset()) -> list[str]:
    """Deletes shards not in `keep`, so no stale file looks part of the dataset."""
    removed = []
    for meta in FileSystems.match([FileSystems.join(output_dir, "*")])[0].metadata_list:
        name = meta.path.rstrip("/").rsplit("/", 1)[-1]
        if schemas.manifest.SHARD_FILENAME_RE.match(name) and name not in keep:
            FileSystems.delete([meta.path])
            removed.append(name)
    if removed:
        _LOG.info("Removed %d shard files of an earlier dataset", len(removed))
    return removed
