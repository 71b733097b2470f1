"""Count lists of the manifest's `targets` section, shared by the kinds that count per class."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["as_list", "summed", "per_split_rows"]


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
