"""Planned shards to written shards: the transform `ImagesToTFRecords`.

The driver writes each shard's planned files to a small JSON file
(`conversion.shard_plans`); the pipeline carries only their paths.
`ImagesToTFRecords` loads them, optionally marks duplicate content, and writes
each shard with `_write.WriteShardFn`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import apache_beam as beam

from beam_jobs._write import WriteShardFn
from conversion.files import read_bytes
from conversion.options import WritingOptions
from conversion.plan import PlannedFile
from conversion.shard_plans import load_shard_plan
from imaging import ValidationOptions

__all__ = ["ImagesToTFRecords"]


def _files_of(element):
    return element[1]


def _key_by_shard(f: PlannedFile):
    return (f.split, f.shard), f


def _key_by_content(f: PlannedFile):
    """(sha256 of the file's bytes, file); unreadable files get a key of their own."""
    try:
        return hashlib.sha256(read_bytes(f.path)).hexdigest(), f
    except OSError:
        # The shard writer reads it again and rejects it with the reason.
        return "unreadable:" + f.rel_path, f


def _mark_copies(element):
    """Keeps the file with the smallest path of each content; marks the others."""
    _, files = element
    files = sorted(files, key=lambda f: os.fsencode(f.rel_path))
    yield files[0]
    for copy in files[1:]:
        yield dataclasses.replace(copy, duplicate_of=files[0].rel_path)


class ImagesToTFRecords(beam.PTransform):
    """Writes planned shards: the pipeline carries paths, never image bytes.

    Input: PCollection of shard plan paths (`write_shard_plans`). Output: a
    tuple-like with the main output (shard results) and the tagged outputs
    `rejected` and `normalized`.

    Args:
      output_dir: Folder of the shards.
      num_classes: Number of classes (for per-shard class counts).
      total_shards: Shards of all splits together (for progress lines).
      validation: `imaging.ValidationOptions` of every file; its DICOM tags
        become extra string features of every record.
      writing: `WritingOptions`. With `dedup`, one file of each content is
        kept (the smallest path) and the copies are rejected as 'duplicate'
        (only hashes and paths are grouped); `resume` and `worker_threads`
        go to `WriteShardFn`.
      targets: The kinds of target every record carries (`schemas.TARGET_KINDS`).
    """

    def __init__(self, *, output_dir: str, num_classes: int, total_shards: int,
                 validation: ValidationOptions, writing: WritingOptions | None = None,
                 targets: tuple[str, ...] = ()):
        super().__init__()
        writing = writing or WritingOptions()
        self._dedup = writing.dedup
        self._fn = WriteShardFn(output_dir=output_dir, num_classes=num_classes,
                                total_shards=total_shards, validation=validation, writing=writing,
                                targets=targets)

    def start_early(self, pool, shards) -> None:
        """Starts writing `shards` (lists of one shard's PlannedFiles) in the driver's worker
        processes `pool` before the pipeline runs (`WriteShardFn.start_early`); not with --dedup,
        whose shards' files are known only once the pipeline has compared them."""
        if not self._dedup:
            self._fn.start_early(pool, shards)

    def expand(self, plan_paths):
        shards = plan_paths | "LoadShardPlans" >> beam.Map(load_shard_plan)  # ((split, shard), [PlannedFile])
        if self._dedup:
            # Copies may sit in any shard: hashes and paths meet in one shuffle.
            shards = (
                shards
                | "Files" >> beam.FlatMap(_files_of)  # PlannedFile
                | "HashContent" >> beam.Map(_key_by_content)  # (sha256, PlannedFile)
                | "GroupByContent" >> beam.GroupByKey()  # (sha256, [PlannedFile])
                | "MarkCopies" >> beam.FlatMap(_mark_copies)  # PlannedFile
                | "KeyByShard" >> beam.Map(_key_by_shard)  # ((split, shard), PlannedFile)
                | "GroupByShard" >> beam.GroupByKey()  # ((split, shard), [PlannedFile])
            )
        return shards | "ValidateAndWrite" >> beam.ParDo(self._fn).with_outputs(
            WriteShardFn.REJECTED, WriteShardFn.NORMALIZED, main="shards"
        )
