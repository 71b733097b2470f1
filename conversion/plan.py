"""Planning a conversion: labels, splits and shard membership of every file.

Everything here is a pure function of the listing and the options, computed
once before the pipeline runs. Split and shard membership come from seeded,
stable hashes of the relative path, so:

- the same input and seed give the same plan on every run and every runner;
- adding files later never moves an existing file to another split;
- every shard is a uniform random mix of classes (never one class per shard).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import operator
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conversion.listing import InputFile, Problem
from conversion.targets import classes as _classes
from conversion.targets.kind import PlanTargets
from conversion.targets.labels_csv import read_labels_csv
from schemas.manifest import SPLIT_ALIASES

__all__ = ["PlannedFile", "Plan", "PlanTargets", "make_plan", "stable_hash", "hash_split", "split_groups",
           "SPLIT_ALIASES", "read_labels_csv", "image_labels_optional", "sorted_class_names"]

# The image-level class's planning, its row's (`conversion.targets.classes`), under the names it had here.
sorted_class_names = _classes.sorted_class_names
image_labels_optional = _classes.image_labels_optional


def stable_hash(seed: int, purpose: str, *parts: str) -> int:
    """A 64-bit hash that is the same on every machine and Python run."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{seed}\0{purpose}".encode())
    for part in parts:
        h.update(b"\0")
        h.update(os.fsencode(part))
    return int.from_bytes(h.digest(), "big")


# `os.fsencode` without its per-call Python checks: planning encodes every
# path, and encoding it once and directly is most of the saving.
_FS_ENCODING = sys.getfilesystemencoding()
_FS_ERRORS = sys.getfilesystemencodeerrors()


def _fs_bytes(text: str) -> bytes:
    """`os.fsencode(text)` for a str."""
    return text.encode(_FS_ENCODING, _FS_ERRORS)


def _hasher(seed: int, purpose: str, *parts: str) -> Callable[[bytes], int]:
    """`stable_hash(seed, purpose, *parts, last)` as a function of `_fs_bytes(last)`.

    The hash of the common prefix is computed once; each call copies that
    state and feeds only the last part (blake2b's input is the concatenation
    of its updates, so the value is the same).
    """
    prefix = hashlib.blake2b(digest_size=8)
    prefix.update(f"{seed}\0{purpose}".encode())
    for part in parts:
        prefix.update(b"\0")
        prefix.update(_fs_bytes(part))
    prefix.update(b"\0")

    def hash_of(last: bytes) -> int:
        h = prefix.copy()
        h.update(last)
        return int.from_bytes(h.digest(), "big")

    return hash_of


@dataclasses.dataclass(frozen=True, order=True)
class PlannedFile:
    """A file with its place in the dataset.

    Attributes:
      split: Split name.
      shard: Shard index within the split.
      order: Position key within the shard (records are written by `order`).
      rel_path, path, size: As listed.
      label: Class index.
      num_shards: Shards in the split.
    """

    split: str
    shard: int
    order: int
    rel_path: str
    path: str
    size: int
    label: int
    num_shards: int
    # With --dedup: the kept file with the same content, when this one is a copy.
    duplicate_of: str | None = None
    # Its targets beyond one class (mask, boxes, several labels, numbers: one
    # value per kind of `conversion.targets.TARGETS`) as compact JSON
    # (`PlanTargets.values`); None when the dataset has none.
    targets: str | None = None
    # With --raster_patch, for a scene's work item: "y0,y1", its patches are those whose
    # top row y is in [y0, y1), or "y0,y1,x0,x1", those whose left column is also in
    # [x0, x1) (`imaging.scenes.WorkItem.key`); None: the whole file.
    patch_rows: str | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """The plan of a whole conversion.

    Attributes:
      files: Files to convert, sorted by (split, shard, order).
      problems: Inputs that will not be converted (rejected or skipped).
      class_names: Class names in label order.
      shard_counts: Split name to number of shards.
      num_found: Every input: what the listing found (files and problems)
        and the labels CSV rows that name no file.
      split_source: 'folders', 'csv' or 'hash'.
      groups: With --group_by: per split, the sorted hashes of its groups
        (values are hashed so that no patient identifier is stored).
      target_kinds: The kinds of target every record carries
        (`schemas.TARGET_KINDS`), sorted; () for one label per image.
      targets_section: The dataset-level part of the manifest's targets
        section (`PlanTargets.section`).
      masks: With --masks_dir: the `conversion.masks.MaskPlan`.
      stacks: With --time_series: each planned location's plan.
      volumes: With --volumes: each planned volume's plan (`conversion.volumes.VolumeJob`).
    """

    files: tuple[PlannedFile, ...]
    problems: tuple[Problem, ...]
    class_names: tuple[str, ...]
    shard_counts: Mapping[str, int]
    num_found: int
    split_source: str
    groups: Mapping[str, tuple[str, ...]] | None = None
    target_kinds: tuple[str, ...] = ()
    targets_section: Mapping | None = None
    masks: Any = None
    # With --time_series: location -> its `imaging.time_series.LocationPlan` (`conversion.time_series`).
    stacks: Any = None
    volumes: Any = None


def make_plan(
    files: Sequence[InputFile],
    problems: Sequence[Problem],
    *,
    seed: int,
    split_ratios: Mapping[str, float] | None,
    labels_csv: Mapping[str, tuple[str, str | None]] | None = None,
    class_names: Sequence[str] | None = None,
    num_shards: int | None = None,
    target_shard_bytes: int,
    min_shards: int,
    groups: Mapping[str, str] | None = None,
    targets: PlanTargets | None = None,
    folder_labels: Callable | None = None,
    windows: Mapping[str, Sequence[tuple[str, int]]] | None = None,
    known_classes: Sequence[str] | None = None,
) -> Plan:
    """Assigns every listed file a label, a split and a shard, in four steps: labels, splits, shards, groups.

    Args:
      files: The listing, sorted.
      problems: Inputs the listing already gave up on.
      seed: Seed of every hash.
      split_ratios: Split name to fraction (summing to 1), for hash splitting;
        None means split folders, the CSV's split column, or all 'train'.
      labels_csv: Parsed labels CSV, or None for class folders.
      class_names: Fixed class order, or None for sorted names.
      num_shards: Shards per split (capped at its record count), or None to
        size shards by bytes.
      target_shard_bytes: Shard size to aim for when num_shards is None.
      min_shards: Fewest shards a split gets (when it has enough records), so
        that readers can interleave files in parallel.
      groups: Relative path to group (e.g. a PatientID), for hash splitting:
        every file of a group lands in the same split. Files without a group
        are their own group.
      targets: Per-file targets beyond one class (`PlanTargets`), or None.
        Labels of None (the labels CSV's, or `image_labels_optional`'s)
        become label -1.
      folder_labels: Without a labels CSV, what gives each file's (label,
        split): `(files, split_ratios) -> (labels, unlabeled, split_source)`;
        a label of None is stored as -1 (no image-level class). Default:
        class folders (`ROOT/<class>/...`, `ROOT/<split>/<class>/...`).
      windows: With --raster_patch: relative path of a scene to its work
        items, (patch_rows "y0,y1" or "y0,y1,x0,x1", planned bytes) each. The
        scene's split is its path's; each item is placed in a shard by the
        hash of its name (`imaging.scenes.WorkItem.name`), as files are, so
        one scene spreads over the split's shards.
      known_classes: With --append (and no `class_names`): the dataset's
        classes, which keep their indices; a class found that is not among
        them comes after them (several: in sorted order).

    Returns:
      The plan.

    Raises:
      ValueError: On inconsistent labels or split options.
    """
    problems = list(problems)
    # Step 1, labels: the image-level class's row plans each file's class (and split, when given).
    labelled = _classes.KIND.plan(files, problems, split_ratios=split_ratios, labels_csv=labels_csv,
                                  class_names=class_names, targets=targets, folder_labels=folder_labels,
                                  known_classes=known_classes)
    by_split = _plan_splits(files, problems, labelled, seed=seed, groups=groups, targets=targets, windows=windows)
    shard_counts, planned = _plan_shards(by_split, labelled.ratios, seed=seed, num_shards=num_shards,
                                         target_shard_bytes=target_shard_bytes, min_shards=min_shards,
                                         targets=targets)
    problems.sort(key=lambda p: os.fsencode(p.rel_path))
    return Plan(
        files=tuple(planned),
        problems=tuple(problems),
        class_names=labelled.class_names,
        shard_counts=shard_counts,
        num_found=labelled.num_found,
        split_source=labelled.split_source,
        groups=_plan_groups(planned, groups, labelled.ratios, shard_counts, seed),
        target_kinds=() if targets is None else tuple(targets.kinds),
        targets_section=None if targets is None else targets.section,
    )


def _plan_splits(files, problems: list, labelled: _classes.Labelled, *, seed, groups, targets, windows) -> dict:
    """Step 2 of `make_plan`: each labelled file's split; appends the files refused on the way.

    Returns:
      Split -> its members, (file, encoded name, label index, patch rows or None, planned bytes) each.
    """
    index = {name: i for i, name in enumerate(labelled.class_names)}
    labels, ratios = labelled.labels, labelled.ratios
    # Each path is encoded once, for its split hash and its order hash.
    split_of = _split_by_hash(seed, ratios) if ratios is not None else None
    by_split: dict[str, list[tuple[InputFile, bytes, int, str | None, int]]] = collections.defaultdict(list)
    for f in files:
        if f.rel_path not in labels:
            continue
        label, split = labels[f.rel_path]
        if targets is not None and f.rel_path in targets.rejects:
            problems.append(Problem(f.rel_path, *targets.rejects[f.rel_path]))
            continue
        if label is not None and label not in index:
            problems.append(Problem(
                f.rel_path, "unknown_class", f"class {label!r} is not in --class_names"
            ))
            continue
        encoded = _fs_bytes(f.rel_path)
        if split_of is not None:
            if groups is None or f.rel_path not in groups:
                key = encoded
            else:
                key = _fs_bytes("group:" + groups[f.rel_path])
            split = split_of(key)
            if split is None:
                problems.append(Problem(f.rel_path, "not_in_split", "hashed into no split"))
                continue
        label_index = -1 if label is None else index[label]
        if windows is not None and f.rel_path in windows:
            from imaging.scenes import WorkItem  # Only with --raster_patch: numpy, Pillow

            for rows, size in windows[f.rel_path]:
                name = WorkItem.parse(rows).name(f.rel_path)
                by_split[split].append((f, _fs_bytes(name), label_index, rows, size))
        else:
            by_split[split].append((f, encoded, label_index, None, f.size))
    return by_split


def _plan_shards(by_split: Mapping, ratios, *, seed, num_shards, target_shard_bytes, min_shards,
                 targets) -> tuple[dict[str, int], list[PlannedFile]]:
    """Step 3 of `make_plan`: each split's shard count, and each member's shard and order in it."""
    split_names = list(ratios) if ratios is not None else sorted(by_split)
    shard_counts = {}
    for split in split_names:
        members = by_split.get(split, ())
        shard_counts[split] = _shard_count(
            len(members), sum(size for *_, size in members), num_shards, target_shard_bytes, min_shards
        )
    planned = []
    # Splits in name order, each in (shard, order) order: the plan's sort
    # order, (split, shard, order, rel_path), without comparing PlannedFiles.
    for split in sorted(shard_counts):
        n = shard_counts[split]
        order_hash = _hasher(seed, "order", split)
        members = _sorted_by_order(
            [(order_hash(encoded), f.rel_path, rows or "", f, label, size)
             for f, encoded, label, rows, size in by_split.get(split, ())]
        )
        # Range partition of the hash order: shards differ by at most one
        # record, and each is a uniform random sample of the split.
        for rank, (order, _, rows, f, label, size) in enumerate(members):
            planned.append(PlannedFile(
                split=split,
                shard=rank * n // len(members),
                order=order,
                rel_path=f.rel_path,
                path=f.path,
                size=size,
                label=label,
                num_shards=n,
                targets=None if targets is None else targets.values[f.rel_path],
                patch_rows=rows or None,
            ))
    return shard_counts, planned


def _plan_groups(planned: list[PlannedFile], groups, ratios, shard_counts, seed) -> dict | None:
    """Step 4 of `make_plan`: with --group_by, each split's group ids (the manifest's)."""
    if groups is None:
        return None
    if ratios is None:
        raise ValueError(
            "--group_by decides splits by hashing each group, so it needs hash splits "
            "(--split ...), not split folders or the CSV's split column."
        )
    return split_groups(planned, groups, shard_counts, seed)


def split_groups(planned: Sequence[PlannedFile], groups: Mapping[str, str], shard_counts: Mapping[str, int],
                 seed: int) -> dict[str, tuple[str, ...]]:
    """Each split's group ids: the sorted hashes of the groups of its planned files (`Plan.groups`).

    Args:
      planned: The planned files (their split and relative path).
      groups: Relative path -> group value, for the files that have one.
      shard_counts: The splits (each one listed, an empty one too).
      seed: The conversion's seed (hashed with each value: no identifier is stored).
    """
    per_split = collections.defaultdict(set)
    for f in planned:
        if f.rel_path in groups:
            per_split[f.split].add(groups[f.rel_path])
    return {
        split: tuple(sorted({_group_id(seed, group) for group in per_split.get(split, ())}))
        for split in shard_counts
    }


def _sorted_by_order(members: list[tuple]) -> list[tuple]:
    """`sorted(members)` for (order hash, rel_path, ...) tuples, in place.

    Comparing the 64-bit hashes alone is ~2.5x faster than comparing tuples;
    only when two hashes are equal does the path decide, as in `sorted`.
    """
    members.sort(key=operator.itemgetter(0))
    if len(set(map(operator.itemgetter(0), members))) < len(members):
        members.sort()
    return members


def _group_id(seed: int, group: str) -> str:
    """The stored form of a group value: no patient identifier in the manifest."""
    return hashlib.sha256(f"{seed}\0{group}".encode()).hexdigest()[:16]


def _split_by_hash(seed: int, ratios: Mapping[str, float]) -> Callable[[bytes], str | None]:
    """The split of a key (a path or 'group:' + its group, as `_fs_bytes`), by its hash."""
    positive = [name for name, ratio in ratios.items() if ratio > 0]
    if len(positive) <= 1:
        # `_hash_split` gives every hash the one split with a share (or none):
        # the default, everything in 'train', needs no hash.
        only = positive[0] if positive else None
        return lambda key: only
    split_hash = _hasher(seed, "split")
    return lambda key: _hash_split(split_hash(key), ratios)


def hash_split(seed: int, key: str, ratios: Mapping[str, float]) -> str | None:
    """The split of `key` (a path, a series folder) by its seeded hash, as every file's split is drawn.

    The same split as a file whose relative path is `key` gets: `make_plan`'s hash.
    """
    return _hash_split(stable_hash(seed, "split", key), ratios)


def _hash_split(hash_value: int, ratios: Mapping[str, float]) -> str | None:
    """The split of a file whose split hash (`stable_hash(seed, 'split', key)`) is `hash_value`."""
    u = hash_value / 2.0**64
    acc = 0.0
    for name, ratio in ratios.items():
        acc += ratio
        if u < acc:
            return name
    # Rounding can leave a sliver above the last cumulative sum.
    nonzero = [n for n, r in ratios.items() if r > 0]
    return nonzero[-1] if nonzero else None


def _shard_count(n_records, n_bytes, num_shards, target_shard_bytes, min_shards) -> int:
    if n_records == 0:
        return 0
    if num_shards:
        return min(num_shards, n_records)
    by_size = math.ceil(n_bytes / target_shard_bytes)
    return min(n_records, max(min_shards, by_size))
