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
from conversion.plan import PlannedFile
from conversion.shard_maker import ShardSpec
from conversion.shard_plans import load_shard_plan

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
      spec: The conversion's `conversion.shard_maker.ShardSpec`. With
        `spec.writing.dedup`, one file of each content is kept (the smallest
        path) and the copies are rejected as 'duplicate' (only hashes and
        paths are grouped).
    """

    def __init__(self, spec: ShardSpec):
        super().__init__()
        self._dedup = spec.writing.dedup
        self._fn = WriteShardFn(spec)

    def expand(self, plan_paths):
        shards = plan_paths  # The shard writer reads each plan (`WriteShardFn`)
        if self._dedup:
            # Copies may sit in any shard: hashes and paths meet in one shuffle.
            shards = (
                plan_paths
                | "LoadShardPlans" >> beam.Map(load_shard_plan)  # ((split, shard), [PlannedFile])
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
