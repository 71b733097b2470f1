"""Count lists of the manifest's `targets` section, shared by the kinds that count per class, and the
section, --append merge and inspect lines of the two box kinds (axis and oriented)."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

from conversion.targets.kind import Description

__all__ = ["as_list", "summed", "per_split_rows", "appended_order", "summed_per_split", "BoxCounts", "box_section",
           "box_merge", "box_description"]


def as_list(counter: Mapping[int, int], length: int = 0) -> list[int]:
    """Counts by index, 0 where none: [counter[0], counter[1], ...]."""
    n = max([length, *(k + 1 for k in counter)])
    return [counter.get(k, 0) for k in range(n)]


def summed(lists, width: int) -> list[int]:
    """The element-wise sum of count lists, at least `width` long."""
    out = [0] * max([width, *map(len, lists)])
    for counts in lists:
        for k, n in enumerate(counts):
            out[k] += n
    return out


def per_split_rows(head: str, names, splits, count) -> list[list[str]]:
    """A table of `count(split, i)` for each name, one column per split and a total (`shardsmith inspect`)."""
    rows = [[head, *splits, "total"]]
    for i, name in enumerate(names):
        per = [count(s, i) for s in splits]
        rows.append([name, *(f"{n:,}" for n in per), f"{sum(per):,}"])
    return rows


def appended_order(held, planned) -> tuple[tuple[str, ...], list[int]]:
    """With --append: the held class names first (their indices never move), then this run's new ones.

    Args:
      held: The dataset's class names, in index order.
      planned: This run's class names, in the order it planned them.

    Returns:
      (class names, `remap`): remap[i] is the new index of planned class i.
    """
    names = list(held)
    index = {name: i for i, name in enumerate(names)}
    for name in planned:
        if name not in index:
            index[name] = len(names)
            names.append(name)
    return tuple(names), [index[name] for name in planned]


def summed_per_split(held: dict, mine: dict) -> dict:
    """Split to count list (or count) of two versions, added up (`TargetKind.merge`)."""
    out = {}
    for split in sorted({*held, *mine}):
        a, b = held.get(split), mine.get(split)
        if isinstance(a, list) or isinstance(b, list):
            out[split] = summed([a or [], b or []], 0)
        else:
            out[split] = int(a or 0) + int(b or 0)
    return out


class BoxCounts:
    """One shard's boxes per class, images without any, and the issues of its boxes (axis or oriented).

    Args:
      label_key: The feature key of the boxes' labels in a `RecordPart`'s extra.
    """

    def __init__(self, label_key: str):
        self._label_key = label_key
        self._boxes = collections.Counter()
        self._without_boxes = 0
        self._issues = collections.Counter()
        self._seen = False

    def add(self, part) -> None:
        labels = part.extra[self._label_key]
        self._seen = True
        self._boxes.update(labels)
        self._without_boxes += not labels
        self._issues.update(part.issues)

    def to_json(self) -> dict | None:
        if not self._seen:
            return None
        return {"counts": as_list(self._boxes), "images_without_boxes": self._without_boxes,
                "issues": dict(sorted(self._issues.items()))}


def box_section(name: str, section: dict, shards, splits: Sequence[str], num_classes: int | None = None) -> dict:
    """Kind `name`'s planned section with its boxes per class and split, images without boxes, every issue
    (`TargetKind.section`, from the shards' `BoxCounts`)."""
    width = len(section["class_names"])
    issues = collections.Counter(section.get("issues", {}))
    section["counts"], section["images_without_boxes"] = {}, {}
    for split in sorted(splits):
        parts = [s.targets[name] for s in shards if s.split == split and s.targets and name in s.targets]
        section["counts"][split] = summed([p["counts"] for p in parts], width)
        section["images_without_boxes"][split] = sum(p["images_without_boxes"] for p in parts)
        for p in parts:
            issues.update(p["issues"])
    section["issues"] = dict(sorted(issues.items()))
    return section


def box_merge(held: dict, mine: dict) -> dict:
    """A box kind's grown section with --append (`TargetKind.merge`): this run's classes (the held ones
    first), counts and issues added up."""
    out = dict(mine)
    out["counts"] = summed_per_split(held.get("counts") or {}, mine.get("counts") or {})
    out["images_without_boxes"] = summed_per_split(held.get("images_without_boxes") or {},
                                                   mine.get("images_without_boxes") or {})
    issues = collections.Counter(held.get("issues") or {})
    issues.update(mine.get("issues") or {})
    out["issues"] = dict(sorted(issues.items()))
    if len(mine.get("class_names") or ()) > len(held.get("class_names") or ()) \
            or held.get("class_order") == "first_appearance":
        # A full conversion orders them as its annotations do; these came by first appearance.
        out["class_order"] = "first_appearance"
    return out


def box_description(noun: str, boxes: dict, class_names, splits, max_classes: int):
    """A box kind's `shardsmith inspect` lines (`TargetKind.describe`): its boxes per class per split,
    images without any, and the annotations' issues.

    Args:
      noun: What one box is called ("box", "oriented box"); its plural adds "es".
      boxes: The kind's manifest section (class_names: the image-level ones, not shown here).
    """
    names = list(boxes.get("class_names") or [])
    counts = boxes.get("counts") or {}
    head = [f"{noun}es: {boxes.get('format', '?')} annotations from {boxes.get('source')}, {len(names)} classes"]
    rows = per_split_rows(
        f"{noun} class", names[:max_classes], splits,
        lambda s, i: (counts.get(s) or [0] * len(names))[i] if i < len(counts.get(s) or ()) else 0)
    tail = [f"... and {len(names) - max_classes} more {noun} classes"] if len(names) > max_classes else []
    without = boxes.get("images_without_boxes") or {}
    tail.append(f"images without {noun}es: " + ", ".join(f"{s} {int(without.get(s, 0)):,}" for s in splits))
    issues = boxes.get("issues") or {}
    if issues:
        tail.append("annotation issues: " + ", ".join(f"{k} {int(n):,}" for k, n in sorted(issues.items())))
    return Description(head, rows, tail)
