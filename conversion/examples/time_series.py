"""The time-series kind (--time_series): the dated passes over one location, one stack per record.

Its examples are locations (every folder directly holding TIFF rasters),
planned from their files' names and headers; its records are
`schemas.TimeSeriesExampleSchema`'s, written by `conversion.time_series`
(issue 37). With --raster_patch every patch is the same window of every date.
"""

from __future__ import annotations

import dataclasses

import schemas
from conversion.examples.kind import ExampleKind, Grouped

__all__ = ["KIND"]


def _time_series():
    """`conversion.time_series`, imported once a conversion of this kind asks: a photo run never loads it."""
    from conversion import time_series

    return time_series


def _applies(validation) -> bool:
    return validation.time_series is not None


def _group(files: list, problems: list, config, appending=None) -> Grouped:
    # Locations, not files, are planned: each one "file" whose path is its plan's.
    located = _time_series().plan_locations(files, problems, config.validation.time_series, config.output_dir)
    members = {name: tuple(rel for date in p.dates for rel in date.rel_paths) for name, p in located.stacks.items()}
    return Grouped(list(located.files), list(located.problems), members, located.stacks)


def _windows(files: list, grouped: Grouped, targets, config):
    if targets is not None:
        # A stack's record holds one class (`label`) or a label raster (`mask`), no other target.
        what = "several labels per row (a|b)" if targets.multi_label else "numbers (a target column)"
        raise ValueError(f"--time_series takes one class per location in --labels_csv (path,label), "
                         f"or --masks_dir for label rasters; stacks do not hold several labels or numbers "
                         f"yet. Received: --labels_csv {config.labels_csv} with {what}")
    patch = config.validation.raster.patch
    if patch is None:
        return None, {}
    return _time_series().stack_windows(grouped.plans, patch), {}


def _cut_masks(mask_plan, windows, config):
    # A location's label raster is checked against its stack, and cut, by the shard writer.
    return mask_plan


def _finish_plan(plan, grouped: Grouped):
    stacks = grouped.plans
    plan = _time_series().expand_problems(plan, stacks)
    return dataclasses.replace(plan, stacks={f.rel_path: stacks[f.rel_path] for f in plan.files})


def _record_schema(validation, targets: tuple[str, ...] = ()):
    return schemas.TimeSeriesExampleSchema(mask="mask" in targets)


def _write_shard(job):
    return _time_series().write_stacks(job, job.validation.time_series)


def _warm_call(validation, processes: int, decoders: bool = True) -> tuple:
    return _time_series().warm_up, ()


def _manifest_section(plan, config) -> dict:
    return _time_series().manifest_section(plan.stacks, plan, config.validation.time_series)


def _prepare_output(plan, config) -> None:
    # Each location's plan, which its shard writer reads (its planned file's path).
    _time_series().write_stack_plans(plan.stacks, config.output_dir)


KIND = ExampleKind(
    name=schemas.TIME_SERIES,
    record_noun="stack",
    applies=_applies,
    group=_group,
    record_schema=_record_schema,
    write_shard=_write_shard,
    warm_call=_warm_call,
    windows=_windows,
    cut_masks=_cut_masks,
    finish_plan=_finish_plan,
    manifest_section=_manifest_section,
    prepare_output=_prepare_output,
)
