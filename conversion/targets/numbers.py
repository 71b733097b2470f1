"""The kind of numbers per image (a `target` column in --labels_csv), one row of `conversion.targets.TARGETS`.

Planned from the labels CSV's `target` column (`0.5|1.25`: every row the same
count of numbers); a number float32 cannot hold (NaN, infinite, out of
range) rejects its file, 'bad_target'. Stored as the `target` feature; the
manifest gives their count (`length`).
"""

from __future__ import annotations

import math

import schemas
from conversion.targets.kind import Description, PlannedKind, RecordPart, TargetKind, TargetRequest
from conversion.targets.labels_csv import bad_numbers

__all__ = ["KIND"]

# The kind's key (`schemas.TARGET_KINDS`): the one whose feature is `target`.
NAME = next(kind for kind, specs in schemas.TARGET_KINDS.items() if specs == (schemas.TARGET,))


def _plan(request: TargetRequest) -> PlannedKind | None:
    table = request.labels_csv.table if request.labels_csv is not None else None
    if table is None or table.target_length is None:
        return None
    values, rejects = {}, {}
    for rel, (_, _, numbers) in table.rows.items():
        why = bad_numbers(numbers)
        if why is not None:
            rejects[rel] = ("bad_target", f"--labels_csv {request.config.labels_csv}: {why}")
        else:
            values[rel] = list(numbers)
    held = request.held_section(NAME)
    if held is not None and held.get("length") != table.target_length:
        raise ValueError(
            f"--append adds to a dataset of {held.get('length')} numbers per image (its manifest's "
            f"targets.{NAME}.length), and --labels_csv {request.config.labels_csv} gives "
            f"{table.target_length}: the new records would not be like the held ones. Give the "
            "dataset's number of targets, or convert into another folder.")
    return PlannedKind(values=values, section={"length": table.target_length}, rejects=rejects)


def _record(value, image, raw_frame, name: str) -> RecordPart:
    return RecordPart({schemas.TARGET.key: tuple(value)})


def _verify(section, num_classes: int):
    length = section.get("length")
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        return None, f"the manifest's targets.target.length is {length!r}, not a count"
    key = schemas.TARGET.key

    def check(values, height, width, tf) -> str | None:
        target = values[key]
        if len(target) != length:
            return f"{key} has {len(target)} values, the manifest's targets.target.length is {length}"
        if not all(math.isfinite(v) for v in target):
            return f"{key} {list(target)} holds a value that is not finite"
        return None

    return check, None


def _describe(target, class_names, splits, max_classes: int) -> Description:
    return Description([f"regression targets: {target.get('length')} values per image"], [])


KIND = TargetKind(name=NAME, flag="--labels_csv (a target column)", plan=_plan, record=_record,
                  verify=_verify, describe=_describe)
