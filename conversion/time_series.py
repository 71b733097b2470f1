"""--time_series: locations of dated passes planned, stacked and written as shards (Beam-free).

What a time-series conversion does beyond an image conversion (issue 37):

- **Planning** (`plan_locations`, on the driver): the listed files are
  grouped into locations (every folder directly holding TIFFs); each
  location is planned from its files' names and headers
  (`imaging.time_series.plan_location`, headers read on threads). A
  location that gives a stack becomes one planned "file" whose relative
  path is the location's (so class folders, --labels_csv keyed by the
  location's path, --masks_dir's `<masks_dir>/<location>.tif`, splits and
  shards work on locations as they do on images), and whose path is its
  plan's JSON file (`write_stack_plans`), which the shard writer reads. Every
  input file that is in no stack is a `Problem` with its reason; the count
  of inputs stays that of files (`expand_problems`).
- **Writing** (`write_stacks`, in the shard writer's process): each planned
  location (or work item of patches, --raster_patch) is read window by
  window (`imaging.time_series`), encoded as `schemas.TimeSeriesExampleSchema`
  records, framed, indexed and written atomically, with per-band statistics.
- **The manifest's section** (`manifest_section`): per location the dates
  kept and dropped, and the stacks' dtypes, lengths, sizes and bands.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

import schemas
from conversion import guard
from conversion.elements import Reject, ShardOutcome, ShardResult
from conversion.files import (
    TMP_DIRNAME, AtomicWriter, join, open_to_read, read_bytes, write_atomically, write_shard_index,
)
from conversion.listing import InputFile, Problem
from conversion.targets import CLASS, masks as _target_masks
from imaging import time_series as _ts
from imaging.errors import ImageRejected
from schemas.tfrecord import frame_record

__all__ = ["LocationsPlan", "plan_locations", "stack_windows", "expand_problems", "write_stack_plans",
           "stack_plan_path", "write_stacks", "warm_up", "manifest_section", "merge_time_series", "CUT_ACTION",
           "MASK_ACTION"]

_LOG = logging.getLogger("shardsmith.convert")
_HEADER_THREADS = 8
# Inside the temporary folder: each location's plan, read by the shard writer.
STACKS_DIRNAME = "stacks"
# normalized.jsonl's action of a stack's work item of patches.
CUT_ACTION = "cut_into_patches"
# normalized.jsonl's action of a stack record whose files' masks left samples out of its statistics.
MASK_ACTION = "mask_as_nodata"
# Decoded bytes of the patches of one work item at most (at least one patch), as for scenes.
_ITEM_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class LocationsPlan:
    """The locations of a listing (`plan_locations`).

    Attributes:
      files: One `InputFile` per location that gives a stack: rel_path the
        location's, path its plan file (`stack_plan_path`), size the stack's
        decoded bytes.
      problems: The listing's problems, and every input file in no stack.
      stacks: Location -> its `imaging.time_series.LocationPlan`.
    """

    files: tuple[InputFile, ...]
    problems: tuple[Problem, ...]
    stacks: dict[str, _ts.LocationPlan]


def stack_plan_path(output_dir: str, location: str) -> str:
    """Where a location's plan is written (`write_stack_plans`): a stable name in the temporary folder."""
    digest = hashlib.blake2b(os.fsencode(location), digest_size=12).hexdigest()
    return join(output_dir, TMP_DIRNAME, STACKS_DIRNAME, digest + ".json")


def plan_locations(files: Sequence[InputFile], problems: Sequence[Problem], options: _ts.TimeSeriesOptions,
                   output_dir: str) -> LocationsPlan:
    """Groups the listing into locations and plans each from its files' names and headers.

    Args:
      files, problems: The listing (`conversion.listing.list_input`).
      options: --bands, --max_pixels, --raster_patch.
      output_dir: --output_dir (where the plans will be written).

    Raises:
      ValueError: When no file of the listing is a TIFF raster.
    """
    problems = list(problems)
    by_location: dict[str, list[InputFile]] = collections.defaultdict(list)
    for f in files:
        if _ts.is_raster_name(f.rel_path):
            by_location[_ts.location_of(f.rel_path)].append(f)
        else:
            problems.append(Problem(f.rel_path, "not_a_raster",
                                    "not a raster (.tif, .tiff, .jp2, .j2k): a location is made of rasters"))
    if not by_location:
        raise ValueError(f"--time_series found no raster among {len(files)} files: a location is a "
                         "folder directly holding the passes (.tif, .tiff, .jp2, .j2k) over one place.")

    def plan(location):
        members = by_location[location]
        with guard.working_on([(f.rel_path, f.path) for f in members]):
            try:
                return _ts.plan_location(location, [(f.rel_path, f.path) for f in members], options)
            except Exception as e:  # noqa: BLE001 - this location alone: its files rejected, reported
                _LOG.debug("Unexpected error planning location %s", location, exc_info=e)
                message = guard.internal_error_message(location, e)
                return _ts.LocationPlan(location, (), (), 0, 0, "", 0, None, None, tuple(
                    _ts.Outcome(f.rel_path, guard.INTERNAL_ERROR, message) for f in members),
                    (guard.INTERNAL_ERROR, message))

    locations = sorted(by_location, key=os.fsencode)
    with concurrent.futures.ThreadPoolExecutor(max_workers=_HEADER_THREADS) as pool:
        plans = list(pool.map(plan, locations))
    planned, stacks = [], {}
    for location, p in zip(locations, plans):
        problems += [Problem(o.rel_path, o.reason, o.message) for o in p.outcomes]
        if p.rejected is None:
            stacks[location] = p
            planned.append(InputFile(location, stack_plan_path(output_dir, location), p.nbytes))
    _LOG.info("Found %s locations in %s files; %s give a stack", f"{len(locations):,}",
              f"{len(files):,}", f"{len(stacks):,}")
    return LocationsPlan(tuple(planned), tuple(problems), stacks)


def stack_windows(stacks: dict[str, _ts.LocationPlan], patch) -> dict[str, tuple[tuple[str, int], ...]]:
    """The work items of every location cut into patches (--raster_patch), as `conversion.plan.make_plan` takes them.

    Each item is a band of patch rows, or a range of columns of them
    (`imaging.scenes.WorkItem` keys), of at most `_ITEM_BYTES` of decoded
    patches of every date (at least one patch): what a writer holds. As for
    a scene, the patch rows a tile row holds stay in one item (the budget
    allowing), so that a tile taller than a patch (a Sentinel-2 JPEG 2000
    band's 1024 px, a tiled GeoTIFF's) is decoded once per date, not once
    per patch row.
    """
    from imaging import scenes as _scenes

    out = {}
    for location, plan in stacks.items():
        t, h, w, b = plan.shape
        header = _scenes.SceneHeader(h, w, t * b, plan.dtype, plan.segment_shape)
        items = _scenes.work_items(header, patch)
        patch_bytes = patch.size[0] * patch.size[1] * t * b * np.dtype(plan.dtype).itemsize
        out[location] = tuple((item.key, max(1, item.patches) * patch_bytes) for item in items)
    return out


def expand_problems(plan, stacks: dict[str, _ts.LocationPlan]):
    """The plan with a location's problems (no_label, unknown_class, missing_mask, ...) given to each of its files.

    A location is planned as one "file", but the inputs are its files: the
    rejects list names each, and `num_found` counts each.
    """
    problems = []
    for p in plan.problems:
        stack = stacks.get(p.rel_path)
        if stack is None:
            problems.append(p)
            continue
        members = [rel for date in stack.dates for rel in date.rel_paths]
        problems += [Problem(rel, p.reason, f"its location {p.rel_path}: {p.message}") for rel in members]
    # make_plan counted each location once (planned, or a problem): its files instead.
    extra = sum(len([rel for date in stack.dates for rel in date.rel_paths]) - 1 for stack in stacks.values())
    problems.sort(key=lambda p: os.fsencode(p.rel_path))
    return dataclasses.replace(plan, problems=tuple(problems), num_found=plan.num_found + extra)


def write_stack_plans(stacks: dict[str, _ts.LocationPlan], output_dir: str) -> None:
    """Writes each location's plan where its planned file's path says (`stack_plan_path`)."""
    folder = join(output_dir, TMP_DIRNAME, STACKS_DIRNAME)
    for location, plan in stacks.items():
        name = stack_plan_path(output_dir, location).rsplit("/", 1)[-1]
        write_atomically(folder, name, json.dumps(plan.to_json(), ensure_ascii=True).encode())


@dataclasses.dataclass(frozen=True)
class _Item:
    """One planned location, or a work item of its patches, as the writer gets it."""

    rel_path: str
    path: str
    label: int
    mask: str | None
    patch_rows: str | None


def write_stacks(job, options: _ts.TimeSeriesOptions):
    """Writes one shard of stack records (`conversion.shard_writer.write_shard` with --time_series).

    Args:
      job: The `conversion.shard_writer.ShardJob`: its files are planned
        locations (path: the location's plan file) or their work items.
      options: The time-series options.

    Returns:
      The `conversion.shard_writer.ShardOutcome`.
    """
    masked = _target_masks.NAME in job.targets
    schema = schemas.TimeSeriesExampleSchema(mask=masked)
    writer = AtomicWriter(job.output_dir, job.name)
    index_entries: list[tuple[int, int]] = []
    classes = CLASS.counter(job.num_classes)
    rejects: list[Reject] = []
    normalized: list[tuple] = []
    band_stats = schemas.BandStatsAccumulator()
    mask_counts = np.zeros(0, np.int64)
    sources = 0
    try:
        for f in job.files:
            mask, mask_dtype = _target_masks.of_file(f.targets) or (None, None)
            item = _Item(f.rel_path, f.path, f.label, mask, f.patch_rows)
            plan = _ts.LocationPlan.from_json(json.loads(read_bytes(item.path)))
            members = [rel for date in plan.dates for rel in date.rel_paths]
            with guard.working_on([(rel, item.path) for rel in members[:1]]):
                try:
                    records, notes = _records(item, plan, options, schema, mask_dtype)
                except ImageRejected as e:
                    rejects += [Reject(rel, e.reason, f"{plan.location}: {e.message}") for rel in members]
                    continue
                except Exception as e:  # noqa: BLE001 - this location alone: its files rejected, reported
                    _LOG.debug("Unexpected error writing location %s", plan.location, exc_info=e)
                    message = guard.internal_error_message(plan.location, e)
                    rejects += [Reject(rel, guard.INTERNAL_ERROR, message) for rel in members]
                    continue
            normalized += notes
            if item.patch_rows is None or _work_item(item).first:
                sources += len(members)  # A location counts its files once, by its first item.
            for framed, stats, counts in records:
                offset = writer.num_bytes
                writer.write(framed)
                index_entries.append((offset, len(framed)))
                classes.add(item.label)
                band_stats.add(stats)
                if counts is not None:
                    if len(counts) > len(mask_counts):
                        mask_counts = np.pad(mask_counts, (0, len(counts) - len(mask_counts)))
                    mask_counts[:len(counts)] += counts
    except BaseException:
        writer.abort()
        raise
    writer.commit()
    index_name, index_sha256 = write_shard_index(job.output_dir, job.name, index_entries)
    stats = band_stats.result()
    result = ShardResult(
        job.split, job.index, job.num_shards, job.name, len(index_entries), writer.num_bytes, writer.sha256,
        classes.to_json(), index_name, index_sha256, sources,
        band_stats=None if stats is None else stats.to_json(),
        mask_pixels={str(i): int(n) for i, n in enumerate(mask_counts) if n} if masked else None)
    return ShardOutcome(result, rejects, normalized)


def warm_up() -> None:
    """Prepares a worker process for stack shards: nothing beyond this module (stacks are read with tifffile)."""


def _work_item(item: _Item):
    from imaging.scenes import WorkItem

    return WorkItem.parse(item.patch_rows)


def _records(item: _Item, plan: _ts.LocationPlan, options: _ts.TimeSeriesOptions, schema, mask_dtype):
    """(framed record, band stats, mask pixel counts or None) of each stack of the item; its normalized.jsonl notes.

    The notes: a work item's of patches (`CUT_ACTION`), and one per record
    whose files' masks left samples out of its band statistics
    (`_masked_note`).
    """
    encode = _encoder(schema, plan, item.label)
    if item.patch_rows is None:
        stack, masked = _ts.read_stack(plan, with_mask=True)
        mask = counts = None
        if mask_dtype is not None:
            mask, counts = _whole_mask(item.mask, plan, mask_dtype)
        stats = _ts.stack_band_stats(stack, plan.nodata, masked)
        record = encode(stack, plan.location, plan.geotransform, mask)
        stack = None  # Held twice at most, as patches are.
        framed = frame_record(record)
        record = None
        return [(framed, stats, counts)], _masked_note(plan.location, masked, stats)
    from imaging import masks as _masks, scenes as _scenes

    work = _work_item(item)
    patch = options.patch
    h, w = patch.size
    columns = None if work.x0 is None else (work.x0, work.x1)
    labels = None
    if mask_dtype is not None:
        labels = _scenes.LabelRaster(open_to_read(item.mask), item.mask, mask_dtype)
        if (labels.height, labels.width) != (plan.height, plan.width):
            labels.close()
            raise ImageRejected("mask_size_mismatch", f"its mask {item.mask} is {labels.width}x{labels.height}, "
                                                      f"the location {plan.width}x{plan.height}")
    out, skipped, shares, notes = [], [], [], []
    try:
        for y, x, stack, share, masked in _ts.read_patches(plan, patch, work.y0, work.y1, columns):
            if stack is None:
                skipped.append([y, x])
                shares.append(round(share, 6))
                continue
            name, geotransform = _ts.patch_of(plan, y, x, h, w)
            mask = counts = None
            if labels is not None:
                ids = labels.read(y, x, h, w)
                mask, counts = _masks.encode_mask(ids, mask_dtype), _masks.pixel_counts(ids)
            stats = _ts.stack_band_stats(stack, plan.nodata, masked)
            notes += _masked_note(name, masked, stats)
            record = encode(stack, name, geotransform, mask)
            # Each let go as soon as the next form exists: one patch is held twice at most.
            stack = None
            framed = frame_record(record)
            record = None
            out.append((framed, stats, counts))
            framed = None
    finally:
        if labels is not None:
            labels.close()
    details: dict[str, Any] = {"patch_rows": [work.y0, work.y1], "written": len(out), "skipped": skipped,
                               "skipped_nodata_share": shares, "scene_size": [plan.height, plan.width]}
    if columns is not None:
        details["patch_columns"] = list(columns)
    return out, [(work.name(plan.location), "tiff", (CUT_ACTION,), details), *notes]


def _masked_note(name: str, masked, stats) -> list[tuple]:
    """normalized.jsonl's note of a stack record whose files' masks marked samples as no data; [] without.

    The stored samples keep their values under a mask, so the record's band
    statistics are listed (`masked_stats`, as a single raster's): `shardsmith
    verify` checks them against the stored samples instead of recomputing them.
    """
    if masked is None or not masked.any():
        return []
    return [(name, "tiff", (MASK_ACTION,), {"masked_samples": int(np.count_nonzero(masked)),
                                            "masked_stats": stats.to_json()})]


def _encoder(schema, plan: _ts.LocationPlan, label: int):
    """encode(stack, filename, geotransform, mask) -> the record's bytes, for one location's stacks."""
    dates = tuple(d.days for d in plan.dates)

    def encode(stack: np.ndarray, filename: str, geotransform, mask: bytes | None) -> bytes:
        values = np.ascontiguousarray(stack, stack.dtype.newbyteorder("<"))
        return schema.encode(schemas.StackRecord(
            stack=memoryview(values).cast("B"), dtype=plan.dtype, shape=tuple(values.shape), dates=dates,
            bands=plan.bands, label=label, filename=filename, epsg=plan.epsg, geotransform=geotransform,
            mask=mask))

    return encode


def _whole_mask(path: str, plan: _ts.LocationPlan, dtype: str) -> tuple[bytes, np.ndarray]:
    """The location's label raster as stored (PNG of class ids) and its pixel counts.

    Raises:
      ImageRejected: As `imaging.masks.read_mask`; 'mask_size_mismatch' for a
        mask of another size than the location's (nothing is resampled).
    """
    from imaging import masks as _masks

    ids = _masks.read_mask(read_bytes(path), path, plan.height * plan.width)
    if ids.shape != (plan.height, plan.width):
        raise ImageRejected("mask_size_mismatch", f"its mask {path} is {ids.shape[1]}x{ids.shape[0]}, the "
                                                  f"location {plan.width}x{plan.height}")
    return _masks.encode_mask(ids, dtype), _masks.pixel_counts(ids)


def _nodata_json(value):
    """A nodata value as JSON holds it ('nan' for NaN, which JSON has not); a list of them per band
    where the stack's bands have their own (`imaging.nodata`)."""
    if isinstance(value, tuple):
        return [_nodata_json(v) for v in value]
    if value is None:
        return None
    return "nan" if value != value else value


def manifest_section(stacks: dict[str, _ts.LocationPlan], plan, options: _ts.TimeSeriesOptions) -> dict:
    """The manifest's `time_series` section: the stacks' kind, and per location the dates kept and dropped.

    Args:
      stacks: The planned locations.
      plan: The `conversion.plan.Plan` (which locations were planned).
      options: The time-series options.
    """
    planned = {f.rel_path for f in plan.files} if plan.files else set(stacks)
    kept = [stacks[loc] for loc in sorted(planned, key=os.fsencode) if loc in stacks]
    patch = options.patch
    sizes = {tuple(patch.size)} if patch is not None else {(p.height, p.width) for p in kept}
    bands = sorted({p.bands for p in kept})
    return {schemas.TIME_SERIES: {
        "dtypes": sorted({p.dtype for p in kept}),
        "steps": sorted({len(p.dates) for p in kept}),
        "sizes": [list(s) for s in sorted(sizes)],
        "bands": list(bands[0]) if len(bands) == 1 else None,
        "options": options.to_json(),
        "locations": {p.location: {"kept": [d.date for d in p.dates], "dropped": p.dropped(),
                                   "nodata": _nodata_json(p.nodata)} for p in kept},
    }}


def merge_time_series(held: dict, mine: dict) -> dict:
    """The `time_series` section of a dataset grown by an append: the locations of every version.

    Args:
      held: The dataset's section before the append (`manifest_section`'s value).
      mine: This run's, of its new locations alone.
    """
    out = dict(mine)
    for key in ("dtypes", "steps"):
        out[key] = sorted({*held.get(key, ()), *mine.get(key, ())})
    out["sizes"] = [list(s) for s in sorted({tuple(s) for s in (*held.get("sizes", ()), *mine.get("sizes", ()))})]
    out["bands"] = held.get("bands") if held.get("bands") == mine.get("bands") else None
    out["locations"] = dict(sorted({**held.get("locations", {}), **mine.get("locations", {})}.items(),
                                   key=lambda item: os.fsencode(item[0])))
    return out
