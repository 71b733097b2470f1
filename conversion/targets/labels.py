"""The kind of several labels per image (`cat|dog` in --labels_csv), one row of `conversion.targets.TARGETS`.

Planned from the labels CSV's rows whose labels are sets: the class names are
--class_names or the sorted union of every row's names, and each file's labels
their sorted indices (a name outside --class_names rejects the file,
'unknown_class'). Stored as the `labels` feature; counted per class and split
in the manifest.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import schemas
from conversion.targets.classes import sorted_class_names
from conversion.targets._counts import appended_order, as_list, per_split_rows, summed, summed_per_split
from conversion.targets.kind import Description, PlannedKind, RecordPart, TargetKind, TargetRequest

__all__ = ["KIND"]

# The kind's key (`schemas.TARGET_KINDS`): the one whose feature is `labels`.
NAME = next(kind for kind, specs in schemas.TARGET_KINDS.items() if specs == (schemas.LABELS,))


def _plan(request: TargetRequest) -> PlannedKind | None:
    table = request.labels_csv.table if request.labels_csv is not None else None
    if table is None or not table.multi_label:
        return None
    config = request.config
    found = {n for names, _, _ in table.rows.values() for n in names}
    class_names = tuple(config.class_names) if config.class_names else sorted_class_names(found)
    if request.held is not None and not config.class_names:
        # --append: the dataset's classes keep their indices, this run's new ones come after.
        class_names, _ = appended_order(request.held.class_names, class_names)
    index = {name: i for i, name in enumerate(class_names)}
    values, rejects = {}, {}
    for rel, (names, _, _) in table.rows.items():
        unknown = sorted(set(names) - set(index))
        if unknown:
            rejects[rel] = ("unknown_class", f"classes {unknown} are not in --class_names")
        else:
            values[rel] = sorted(index[n] for n in names)
    return PlannedKind(values=values, section={}, rejects=rejects, class_names=class_names)


def _record(value, image, raw_frame, name: str) -> RecordPart:
    return RecordPart({schemas.LABELS.key: tuple(value)})


class _Counts:
    """One shard's images per class."""

    def __init__(self):
        self._labels = collections.Counter()
        self._seen = False

    def add(self, part: RecordPart) -> None:
        self._seen = True
        self._labels.update(part.extra[schemas.LABELS.key])

    def to_json(self) -> dict | None:
        return {"counts": as_list(self._labels)} if self._seen else None


def _section(section: dict, shards, splits: Sequence[str], num_classes: int) -> dict:
    section["counts"] = {
        split: summed([s.targets[NAME]["counts"] for s in shards
                       if s.split == split and s.targets and NAME in s.targets], num_classes)
        for split in sorted(splits)
    }
    return section


def _merge(held: dict, mine: dict) -> dict:
    """The grown dataset's section: images per class and split added up."""
    return {**mine, "counts": summed_per_split(held.get("counts") or {}, mine.get("counts") or {})}


def _verify(section, num_classes: int):
    key = schemas.LABELS.key

    def check(values, height, width, tf) -> str | None:
        labels = values[key]
        outside = [v for v in labels if not 0 <= v < num_classes]
        if outside:
            return f"{key} {list(labels)} has {outside} outside [0, {num_classes})"
        if any(a >= b for a, b in zip(labels, labels[1:])):
            return f"{key} {list(labels)} is not sorted with each class once"
        return None

    return check, None


def _describe(labels, class_names, splits, max_classes: int) -> Description:
    """Images having each class, per split (several labels per image)."""
    counts = labels.get("counts") or {}
    rows = per_split_rows(
        "class", class_names[:max_classes], splits,
        lambda s, i: (counts.get(s) or [])[i] if i < len(counts.get(s) or ()) else 0)
    tail = [f"... and {len(class_names) - max_classes} more classes"] if len(class_names) > max_classes else []
    return Description(["multi-label: images having each class"], rows, tail)


KIND = TargetKind(name=NAME, flag="--labels_csv (several labels per row)", plan=_plan, record=_record,
                  counter=_Counts, section=_section, verify=_verify, describe=_describe, merge=_merge)
