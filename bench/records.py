"""CPU per record of the conversion's per-file work, after the file's bytes are read.

    python -m bench.records [--rasters DIR] [--jpegs DIR] [--files N] [--repeats 3]

In one thread, on files held in memory: the validator (`validate_all` for
each TIFF raster; `validate_many` on groups of 64 for small JPEGs, as the
writer calls it), then what the writer does per record (`ImageExampleSchema
.encode`, `schemas.tfrecord.frame_record`, sha256 of the framed bytes). Prints
CPU milliseconds per record of each stage and of the whole, best of the
repeats (the machine is shared and noisy: CPU time, not wall time). The
corpora are those of `bench.corpus` (`bench.rasters` and `bench.small` make
them); either may be left out.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import pathlib
import time

import schemas
from schemas.tfrecord import frame_record

_LOG = logging.getLogger("shardsmith.bench.records")
_GROUP = 64  # Files per `validate_many` call, as the writer's groups of small files.
_STAGES = ("validate", "encode", "frame", "sha256")


def _load(root: pathlib.Path, suffixes: tuple[str, ...], limit: int) -> list[tuple[bytes, str, int]]:
    """(bytes, relative path, label) of the first `limit` files, in sorted order."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = sorted((p for c in classes for p in (root / c).iterdir() if p.suffix in suffixes),
                   key=lambda p: p.name)[:limit]
    return [(p.read_bytes(), p.relative_to(root).as_posix(), classes.index(p.parent.name))
            for p in files]


def _store(schema, images, name: str, label: int, clock) -> dict[str, float]:
    """Encode, frame and hash each image as the writer does; CPU seconds per stage."""
    spent = dict.fromkeys(_STAGES[1:], 0.0)
    for image in images:
        t0 = clock()
        record = schema.encode(schemas.ImageRecord(
            image=image.data, label=label, filename=name, format=image.format,
            height=image.height, width=image.width, channels=image.channels, extra={}))
        t1 = clock()
        framed = frame_record(record)
        t2 = clock()
        hashlib.sha256(framed).digest()
        t3 = clock()
        spent["encode"] += t1 - t0
        spent["frame"] += t2 - t1
        spent["sha256"] += t3 - t2
    return spent


def _one_pass(validator, schema, files, batched: bool) -> dict[str, float]:
    clock = time.process_time
    spent = dict.fromkeys(_STAGES, 0.0)
    step = _GROUP if batched else 1
    for start in range(0, len(files), step):
        group = files[start:start + step]
        t0 = clock()
        if batched:
            outcomes = validator.validate_many([(data, name) for data, name, _ in group])
        else:
            outcomes = [validator.validate_all(data, name) for data, name, _ in group]
        spent["validate"] += clock() - t0
        for (_, name, label), images in zip(group, outcomes):
            if isinstance(images, Exception):
                raise images
            for stage, seconds in _store(schema, images, name, label, clock).items():
                spent[stage] += seconds
    return spent


def _measure(label: str, files, batched: bool, repeats: int) -> dict[str, float]:
    from conversion.shard_writer import record_schema
    from imaging import ImageValidator, ValidationOptions

    options = ValidationOptions()
    validator = ImageValidator(options)
    schema = record_schema(options)
    _one_pass(validator, schema, files[:_GROUP * 2], batched)  # Warm-up: graphs, imports.
    best = None
    for _ in range(repeats):
        spent = _one_pass(validator, schema, files, batched)
        total = sum(spent.values())
        if best is None or total < sum(best.values()):
            best = spent
    per = {stage: 1000 * seconds / len(files) for stage, seconds in best.items()}
    per["total"] = sum(per.values())
    _LOG.info("%s, %d files, best of %d, CPU ms per record: %s", label, len(files), repeats,
              ", ".join(f"{k} {v:.4f}" for k, v in per.items()))
    return per


def main(argv=None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    corpora = pathlib.Path("build/bench/corpora")
    parser.add_argument("--rasters", default=str(corpora / "rasters-20000-seed0"),
                        help="folder of 13-band TIFFs by class ('' to skip)")
    parser.add_argument("--jpegs", default=str(corpora / "tiny-100000-seed0"),
                        help="folder of small JPEGs by class ('' to skip)")
    parser.add_argument("--files", type=int, default=4000, help="files per workload")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    results = {}
    if args.rasters:
        files = _load(pathlib.Path(args.rasters), (".tif", ".tiff"), args.files)
        results["rasters"] = _measure("13-band uint16 TIFFs", files, False, args.repeats)
    if args.jpegs:
        files = _load(pathlib.Path(args.jpegs), (".jpg", ".jpeg"), args.files)
        results["jpegs"] = _measure("small JPEGs", files, True, args.repeats)
    return results


if __name__ == "__main__":
    main()
