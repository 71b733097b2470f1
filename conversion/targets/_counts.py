"""Count lists of the manifest's `targets` section, shared by the kinds that count per class."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

__all__ = ["as_list", "summed", "per_split_rows", "appended_order", "summed_per_split", "BoxCounts", "box_section"]


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
