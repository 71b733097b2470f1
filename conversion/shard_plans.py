"""The shard plan files: each shard's planned files in a small JSON file, written by the driver.

The pipeline then carries one path per shard instead of one element per
image (`beam_jobs._shards.ImagesToTFRecords` reads them back with
`load_shard_plan`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import operator

import schemas
from conversion.files import TMP_DIRNAME, join, read_bytes, write_atomically
from conversion.plan import PlannedFile

__all__ = ["PLANS_DIRNAME", "write_shard_plans", "load_shard_plan", "plan_shard"]

# Inside the temporary folder: the files of each shard, written by the driver.
PLANS_DIRNAME = "plans"
# A planned file's fields in order: a row of a shard plan file.
_ROW_OF = operator.attrgetter(*(field.name for field in dataclasses.fields(PlannedFile)))
_SHARD_OF = operator.attrgetter("split", "shard", "num_shards")
_INTS_OF = operator.attrgetter("shard", "order", "size", "label", "num_shards")


def write_shard_plans(files, output_dir: str) -> list[str]:
    """Writes each shard's planned files to a small JSON file; returns their paths.

    The pipeline then carries one path per shard instead of one element per
    image: a job graph of a few kilobytes whatever the size of the dataset
    (Dataflow refuses requests over 10 MB, about a million files inline).
    """
    folder = join(output_dir, TMP_DIRNAME, PLANS_DIRNAME)
    paths = []
    # A stable sort: shards in (split, shard, count) order, each with its
    # files in the given order.
    for (split, shard, count), members in itertools.groupby(sorted(files, key=_SHARD_OF), _SHARD_OF):
        name = schemas.shard_filename(split, shard, count) + ".json"
        write_atomically(folder, name, _rows_json(list(members)).encode())
        paths.append(join(folder, name))
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
        f"{'null' if f.duplicate_of is None else quote(f.duplicate_of)}, "
        f"{'null' if f.targets is None else quote(f.targets)}, "
        f"{'null' if f.patch_rows is None else quote(f.patch_rows)}]"
        for f in files
    ]) + "]"


def load_shard_plan(path: str):
    """((split, shard), [PlannedFile]) from a file of `write_shard_plans`."""
    files = [PlannedFile(*row) for row in json.loads(read_bytes(path))]
    return (files[0].split, files[0].shard), files


def plan_shard(path: str) -> tuple[str, int, int]:
    """(split, shard index, shard count) of a shard plan file, from its name (`write_shard_plans`)."""
    name = path.rsplit("/", 1)[-1].removesuffix(".json")
    m = schemas.manifest.SHARD_FILENAME_RE.match(name)
    if m is None or m["version"] is not None:
        raise ValueError(f"Not a shard plan file: {path!r}")
    return m["split"], int(m["index"]), int(m["count"])
