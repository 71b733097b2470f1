"""Planned shards to written shards: the transform, and the plan files it reads.

The driver writes each shard's planned files to a small JSON file
(`write_shard_plans`); the pipeline carries only their paths. `ImagesToTFRecords`
loads them, optionally marks duplicate content, and writes each shard with
`_write.WriteShardFn`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import operator
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
# A planned file's fields in order: a row of a shard plan file.
_ROW_OF = operator.attrgetter(*(field.name for field in dataclasses.fields(_plan.PlannedFile)))
_SHARD_OF = operator.attrgetter("split", "shard", "num_shards")
_INTS_OF = operator.attrgetter("shard", "order", "size", "label", "num_shards")


def write_shard_plans(files, output_dir: str) -> list[str]:
    """Writes each shard's planned files to a small JSON file; returns their paths.

    The pipeline then carries one path per shard instead of one element per
    image: a job graph of a few kilobytes whatever the size of the dataset
    (Dataflow refuses requests over 10 MB, about a million files inline).
    """
    folder = FileSystems.join(output_dir, TMP_DIRNAME, PLANS_DIRNAME)
    paths = []
    # A stable sort: shards in (split, shard, count) order, each with its
    # files in the given order.
    for (split, shard, count), members in itertools.groupby(sorted(files, key=_SHARD_OF), _SHARD_OF):
        name = schemas.shard_filename(split, shard, count) + ".json"
        write_atomically(folder, name, _rows_json(list(members)).encode())
        paths.append(FileSystems.join(folder, name))
    return paths


def _rows_json(files) -> str:
    """`json.dumps` of the files' rows (their fields in order), read by `load_shard_plan`.

    ASCII escapes keep file names that are not UTF-8 intact.
    """
    # JSON writes an int subclass as `int.__repr__` does, but bools as true/false.
    if set(map(type, itertools.chain.from_iterable(map(_INTS_OF, files)))) <= {int}:
        try:
            return _plain_rows_json(files)
        except TypeError:
            pass  # A field that is not a str: json.dumps writes it, or says why not.
    # Fields are plain values: a shallow tuple is `dataclasses.astuple`'s
    # result without its deep copies (~0.1 ms per file, on the driver).
    return json.dumps(list(map(_ROW_OF, files)), ensure_ascii=True)


def _plain_rows_json(files) -> str:
    """`_rows_json` of files of one shard whose ints are ints, written directly.

    Byte for byte what `json.dumps` writes (its separators, its own ASCII
    escaping of strings, which raises TypeError for anything else), in half
    its time: no tuple and no pass of the encoder per file. The driver writes
    every file of the dataset before the pipeline starts.
    """
    quote = json.encoder.encode_basestring_ascii
    first = files[0]
    # Split, shard and count are the shard's: the same in every row.
    head = f"[{quote(first.split)}, {first.shard}, "
    count = first.num_shards
    return "[" + ", ".join([
        f"{head}{f.order}, {quote(f.rel_path)}, {quote(f.path)}, {f.size}, {f.label}, {count}, "
        f"{'null' if f.duplicate_of is None else quote(f.duplicate_of)}]"
        for f in files
    ]) + "]"


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
