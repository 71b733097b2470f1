"""Kinds of target, as a table: one module per kind, one row (`CLASS`, then `TARGETS`).

The image-level class is the first row, `CLASS` (`classes`): planned before
the others (it decides the splits), its value every record's `label`, its
counts each shard's `class_counts`. The kinds beyond one class per image are
the rows of `TARGETS`: a mask, boxes, several labels, numbers
(`schemas.TARGET_KINDS` names their features).
Each is a module here with its `KIND`, a `TargetKind` row that says how it is
read from the user's files and matched to them (`plan`), what features a
record gets from a file's planned value (`record`), what a shard counts of
them (`counter`) and how its part of the manifest's `targets` section is
completed (`section`):

- `masks`: --masks_dir (the pairing itself is `conversion.masks`);
- `boxes`: --annotations, COCO (`coco`), CVAT (`cvat`), Pascal VOC (`voc`),
  LabelMe (`labelme`), DOTA (`dota`, each box's extent) or YOLO (`yolo`);
- `oriented_boxes` (`oriented`): --annotations with --boxes oriented, each
  box's 4 corners: CVAT rotated boxes, DOTA, YOLO-OBB;
- `labels`: several labels per image in --labels_csv (`labels_csv`);
- `numbers`: a `target` column of numbers in --labels_csv.

The planner, the shard writer, the finalizer, verify and inspect ask the
table (as it is at the call: `kind_named`) and name no kind: every planned
value of a file beyond its class travels as one compact JSON text
(`conversion.plan.PlannedFile.targets`) to whichever process writes its
shard. The reading side is `readers.targets`, one row per label mode.

Adding a kind (see docs/architecture.md, "A new target kind"): its features
in `schemas/` (a row of `TARGET_KINDS`), a module here with its `KIND` and
its row in `TARGETS`, a module and a row in `readers.targets`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from conversion.targets import boxes as _boxes, classes as _classes, labels as _labels, masks as _masks
from conversion.targets import numbers as _numbers, oriented as _oriented
from conversion.targets._counts import per_split_rows
from conversion.targets.kind import (ClassKind, Description, PlannedKind, PlanTargets, RecordPart, TargetKind,
                                     TargetRequest)
from conversion.targets.labels_csv import LabelsCsv, read as read_labels_csv

__all__ = [
    "CLASS", "TARGETS", "kind_named", "TargetKind", "ClassKind", "PlanTargets", "TargetRequest", "PlannedKind", "RecordPart", "PlannedTargets",
    "LabelsCsv", "read_labels_csv", "plan_targets", "RecordTargets", "record_targets",
    "TargetCounts", "targets_section", "merge_sections", "BOX_ACTIONS", "Description", "per_split_rows",
]

_LOG = logging.getLogger("shardsmith.convert")
# The image-level class: the table's first row, planned before the others (`make_plan`'s labels), its
# value every record's `label`, its counts each shard's `class_counts` (`conversion.targets.classes`).
CLASS: ClassKind = _classes.KIND
# The table, one row per kind. Planned in this order: a file's reject is the first row's
# that rejects it; the mask row, last, pairs the examples that are left.
TARGETS: tuple[TargetKind, ...] = (_labels.KIND, _boxes.KIND, _oriented.KIND, _numbers.KIND, _masks.KIND)
BOX_ACTIONS = _boxes.BOX_ACTIONS


def kind_named(name: str) -> TargetKind | None:
    """The row of `TARGETS` named `name`, or None.

    Looked up in `TARGETS` as it is at the call: every user of the table
    (planner, shard writer, finalizer, verify, inspect) sees the same rows.
    """
    return next((kind for kind in TARGETS if kind.name == name), None)


def _dumps(value) -> str:
    """Compact, deterministic JSON: what a file's targets travel as."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


class PlannedTargets(NamedTuple):
    """Every kind's targets of a conversion, planned (`plan_targets`).

    Attributes:
      files, problems: The examples and problems after the kinds took theirs.
      labels_csv: The labels CSV's one-label mapping for `plan.make_plan`, or None.
      targets: The `plan.PlanTargets`, or None without targets beyond one class.
      labels_from: `make_plan`'s `folder_labels`, or None.
      summaries: Kind -> what the rest of the run needs of it (`PlannedKind.summary`).
    """

    files: list
    problems: list
    labels_csv: Mapping | None
    targets: PlanTargets | None
    labels_from: Any = None
    summaries: Mapping[str, Any] = {}


def plan_targets(request: TargetRequest) -> PlannedTargets:
    """Asks every row of `TARGETS` for its targets, and merges them into the plan's.

    A file keeps its targets only when it has a value of every kind planned
    (`make_plan` skips the rest); its reject is the first row's that rejects it.

    Raises:
      ValueError, FileNotFoundError: For bad --annotations, masks or labels CSV.
    """
    files, problems = list(request.files), list(request.problems)
    values: dict[str, dict] = {}
    rejects: dict[str, tuple[str, str]] = {}
    section, missing, summaries = {}, [], {}
    source = class_names = labels_from = splits = None
    takes_class_names = False
    for kind in TARGETS:
        planned = kind.plan(request._replace(files=files, problems=problems, planned=dict(section)))
        if planned is None:
            continue
        for rel, value in planned.values.items():
            values.setdefault(rel, {})[kind.name] = value
        for rel, why in planned.rejects.items():
            rejects.setdefault(rel, why)
        section[kind.name] = dict(planned.section)
        missing += planned.missing
        source = source or planned.source
        class_names = class_names or planned.class_names
        labels_from = labels_from or planned.labels_from
        splits = splits or planned.splits
        takes_class_names = takes_class_names or planned.takes_class_names
        files = files if planned.files is None else planned.files
        problems = problems if planned.problems is None else planned.problems
        if planned.summary is not None:
            summaries[kind.name] = planned.summary
    labels_csv = None if request.labels_csv is None else request.labels_csv.labels
    if not section:
        return PlannedTargets(files, problems, labels_csv, None)
    kinds = tuple(sorted(section))
    # Files without a value of every kind (not in the CSV, say) stay out of `values`: the plan skips them.
    encoded = {rel: _dumps(v) for rel, v in values.items() if rel not in rejects and len(v) == len(kinds)}
    targets = PlanTargets(kinds=kinds, values=encoded, source=source, missing=tuple(missing),
                          rejects=rejects, class_names=class_names, section=section, splits=splits,
                          takes_class_names=takes_class_names)
    return PlannedTargets(files, problems, labels_csv, targets, labels_from, summaries)


class RecordTargets(NamedTuple):
    """The target features of one record, and what was done to them.

    Attributes:
      extra: Feature key to values (`schemas.ImageRecord.extra`).
      actions: Actions for normalized.jsonl (e.g. `BOX_ACTIONS`), or ().
      details: Their details by kind (normalized.jsonl's details[kind]), or None.
      parts: Kind -> its `RecordPart`, for the shard's counts.
    """

    extra: dict
    actions: tuple[str, ...]
    details: dict | None
    parts: Mapping[str, RecordPart]


def record_targets(targets: str, image, raw_frame: tuple[int, int, int] | None, name: str) -> RecordTargets:
    """The target features of a record of the validated `image`, from its file's planned targets.

    Args:
      targets: The file's targets (`PlanTargets.values`).
      image: The `imaging.ValidImage` stored (its size, actions, details).
      raw_frame: (EXIF orientation, raw width, raw height) of the file when
        the validator turned it upright (`imaging.boxes.raw_frame`), else None.
      name: The file's relative path, for messages.

    Raises:
      ImageRejected: 'bad_target' when a kind's targets cannot be stored.
    """
    values = json.loads(targets)
    extra, actions, details, parts = {}, (), {}, {}
    for kind in TARGETS:
        if kind.name in values:
            part = kind.record(values[kind.name], image, raw_frame, name)
            parts[kind.name] = part
            extra.update(part.extra)
            actions += part.actions
            if part.details:
                details[kind.name] = part.details
    return RecordTargets(extra, actions, details or None, parts)


class TargetCounts:
    """What one shard's records hold, by kind (the rows' counters)."""

    def __init__(self):
        self._counters = {kind.name: kind.counter() for kind in TARGETS if kind.counter is not None}

    def add(self, targets: RecordTargets) -> None:
        for name, part in targets.parts.items():
            counter = self._counters.get(name)
            if counter is not None:
                counter.add(part)

    def to_json(self) -> dict | None:
        """The shard's counts (`ShardResult.targets`); None when none of its kinds counted anything."""
        out = {name: counts for name, counter in self._counters.items()
               if (counts := counter.to_json()) is not None}
        return out or None


def targets_section(base: Mapping[str, Any], shards, splits: Sequence[str], num_classes: int) -> dict:
    """The manifest's `targets` section (`schemas.TARGETS_SECTION`).

    Args:
      base: The planned, dataset-level part (`PlanTargets.section`).
      shards: The `ShardResult`s (their `split`, `targets` and `mask_pixels`).
      splits: Every split's name.
      num_classes: Entries of the labels counts (the manifest's class_names).
    """
    section = json.loads(json.dumps(base))  # A deep copy of plain values.
    for name, part in section.items():
        kind = kind_named(name)
        if kind is not None and kind.section is not None:
            section[name] = kind.section(part, shards, splits, num_classes)
    return section


def merge_sections(held: Mapping[str, Any], mine: Mapping[str, Any]) -> dict:
    """The `targets` section of a dataset grown by an append: each kind's held and new sections merged.

    Args:
      held: The dataset's section before the append.
      mine: This run's (its kinds planned against the held ones).
    """
    out = json.loads(json.dumps(dict(mine)))
    for name, part in out.items():
        kind = kind_named(name)
        if name in held and kind is not None and kind.merge is not None:
            out[name] = kind.merge(held[name], part)
    return out
