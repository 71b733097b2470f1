"""Planned shards to written shards: the transform, and the plan files it reads.

The driver writes each shard's planned files to a small JSON file
(`write_shard_plans`); the pipeline carries only their paths. `ImagesToTFRecords`
loads them, optionally marks duplicate content, and writes each shard with
`_write.WriteShardFn`.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

import schemas
from beam_jobs import _plan
from beam_jobs._options import WritingOptions
from beam_jobs._files import TMP_DIRNAME, read_bytes, write_atomically
from beam_jobs._write import WriteShardFn
from imaging import ValidationOptions

__all__ = ["ImagesToTFRecords", "write_shard_plans", "load_shard_plan"]

# Inside the temporary folder: the files of each shard, written by the driver.
PLANS_DIRNAME = "plans"


def write_shard_plans(files, output_dir: str) -> list[str]:
    """Writes each shard's planned files to a small JSON file; returns their paths.

    The pipeline then carries one path per shard instead of one element per
    image: a job graph of a few kilobytes whatever the size of the dataset
    (Dataflow refuses requests over 10 MB, about a million files inline).
    """
    by_shard = collections.defaultdict(list)
    # Fields are plain values: a shallow tuple is `dataclasses.astuple`'s
    # result without its deep copies (~0.1 ms per file, on the driver).
    names = [field.name for field in dataclasses.fields(_plan.PlannedFile)]
    for f in files:
        by_shard[(f.split, f.shard, f.num_shards)].append(tuple(getattr(f, n) for n in names))
    folder = FileSystems.join(output_dir, TMP_DIRNAME, PLANS_DIRNAME)
    paths = []
    for (split, shard, count), rows in sorted(by_shard.items()):
        name = schemas.shard_filename(split, shard, count) + ".json"
        # ASCII escapes keep file names that are not UTF-8 intact.
        write_atomically(folder, name, json.dumps(rows, ensure_ascii=True).encode())
        paths.append(FileSystems.join(folder, name))
    return paths


def load_shard_plan(path: str):
    """((split, shard), [PlannedFile]) from a file of `write_shard_plans`."""
    files = [_plan.PlannedFile(*row) for row in json.loads(read_bytes(path))]
    return (files[0].split, files[0].shard), files


def _files_of(element):
    return element[1]


def _key_by_shard(f: _plan.PlannedFile):
    return (f.split, f.shard), f


def _key_by_content(f: _plan.PlannedFile):
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
    """

    def __init__(self, *, output_dir: str, num_classes: int, total_shards: int,
                 validation: ValidationOptions, writing: WritingOptions | None = None):
        super().__init__()
        writing = writing or WritingOptions()
        self._dedup = writing.dedup
        self._fn = WriteShardFn(output_dir=output_dir, num_classes=num_classes,
                                total_shards=total_shards, validation=validation, writing=writing)

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
