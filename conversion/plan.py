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
import csv
import dataclasses
import hashlib
import io
import logging
import math
import operator
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from conversion.listing import InputFile, Problem
from schemas.manifest import SPLIT_ALIASES

__all__ = ["PlannedFile", "Plan", "PlanTargets", "make_plan", "stable_hash", "hash_split", "SPLIT_ALIASES",
           "read_labels_csv", "image_labels_optional", "sorted_class_names"]

_LOG = logging.getLogger("shardsmith.convert")


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


@dataclasses.dataclass(frozen=True)
class PlanTargets:
    """Targets beyond one class, planned per file before `make_plan` (`conversion.targets`).

    Attributes:
      kinds: Kinds of target (`schemas.TARGET_KINDS` keys), sorted.
      values: Relative path to the file's targets (compact JSON text), for
        every file that has all of them.
      source: What names the dataset's files (e.g. 'the annotations'):
        listed files it does not name are skipped as `no_label` ("not in
        the annotations"), and no class folders are needed; None when the
        labels CSV names them.
      missing: Entries that name files which do not exist: rejected as
        `missing_file`, counted as found inputs (like CSV rows).
      rejects: Relative path to (reason, message) of files whose targets
        cannot be stored: rejected without being read.
      class_names: The image-level class names when the targets decide them
        (several labels per image: their sorted union); None otherwise.
      section: The dataset-level part of the manifest's targets section.
    """

    kinds: tuple[str, ...]
    values: Mapping[str, str]
    source: str | None = None
    missing: tuple[Problem, ...] = ()
    rejects: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    class_names: tuple[str, ...] | None = None
    section: Mapping = dataclasses.field(default_factory=dict)


def read_labels_csv(text: str, source: str) -> dict[str, tuple[str, str | None]]:
    """Parses a labels CSV with columns `path,label[,split]`.

    Returns:
      Relative path to (label, split or None).

    Raises:
      ValueError: Naming the file and row, for a missing column, an unknown
        split or a path listed twice with different labels.
    """
    reader = csv.DictReader(io.StringIO(text))
    columns = [c.strip() for c in (reader.fieldnames or [])]
    if "path" not in columns or "label" not in columns:
        raise ValueError(
            f"--labels_csv {source} must have a header with columns path,label[,split]. "
            f"Received columns: {columns}"
        )
    reader.fieldnames = columns
    has_split = "split" in columns
    out: dict[str, tuple[str, str | None]] = {}
    for row_number, row in enumerate(reader, start=2):
        path = _normalise_rel(row["path"] or "")
        label = (row["label"] or "").strip()
        if not path or not label:
            raise ValueError(f"--labels_csv {source} row {row_number}: empty path or label.")
        split = None
        if has_split:
            raw = (row["split"] or "").strip().lower()
            if raw not in SPLIT_ALIASES:
                raise ValueError(
                    f"--labels_csv {source} row {row_number}: split must be one of "
                    f"{sorted(SPLIT_ALIASES)}. Received: {raw!r}"
                )
            split = SPLIT_ALIASES[raw]
        if path in out and out[path] != (label, split):
            raise ValueError(
                f"--labels_csv {source} row {row_number}: {path!r} is listed twice "
                f"with different labels or splits."
            )
        out[path] = (label, split)
    return out


def _normalise_rel(path: str) -> str:
    path = path.strip().replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path.lstrip("/")


def sorted_class_names(names) -> tuple[str, ...]:
    """Names in label order: integer-like labels ('2', '10') sort as numbers, so label 10 comes after 2."""
    names = set(names)
    if names and all(n.lstrip("-").isdigit() for n in names):
        return tuple(sorted(names, key=int))
    return tuple(sorted(names))


def _labels_from_folders(files: Sequence[InputFile], split_ratios):
    """Returns ({rel_path: (class, split or None)}, unlabeled, split_source)."""
    top = {f.rel_path.partition("/")[0] for f in files if "/" in f.rel_path}
    split_dirs = {d for d in top if d.lower() in SPLIT_ALIASES}
    if split_dirs and split_dirs != top:
        raise ValueError(
            f"--input_dir mixes split folders {sorted(split_dirs)} with class folders "
            f"{sorted(top - split_dirs)} at the top level. Use ROOT/<class>/... or "
            f"ROOT/<split>/<class>/..., or give a --labels_csv."
        )
    if split_dirs and split_ratios is not None:
        raise ValueError(
            f"--split assigns splits by hash, but --input_dir already has split folders "
            f"{sorted(split_dirs)}. Drop --split, or move the files into class folders."
        )
    labels, unlabeled = {}, []
    for f in files:
        # ROOT/<class>/... or ROOT/<split>/<class>/...: partitions, not a split
        # into every folder of the path.
        first, has_folder, rest = f.rel_path.partition("/")
        if split_dirs:
            name, has_folder, _ = rest.partition("/")
            if has_folder:
                labels[f.rel_path] = (name, SPLIT_ALIASES[first.lower()])
            else:
                unlabeled.append(f)
        elif has_folder:
            labels[f.rel_path] = (first, None)
        else:
            unlabeled.append(f)
    return labels, unlabeled, ("folders" if split_dirs else "hash")


def image_labels_optional(files: Sequence[InputFile], split_ratios):
    """Image-level classes and splits of files whose targets need no class (boxes, masks).

    Top-level split folders (`SPLIT_ALIASES`) give splits. Classes come from
    folders only when the layout is exactly ROOT/<class>/<file> (or
    ROOT/<split>/<class>/<file>) with at least 2 class folders; otherwise
    no file has a class (label -1, and the manifest's class_names is []):
    flat folders (VOC's JPEGImages/) and any nesting are accepted.

    Args:
      files: The files that have targets.
      split_ratios: --split, or None.

    Returns:
      ({rel_path: (class or None, split or None)}, split_source).

    Raises:
      ValueError: For split folders mixed with other files or folders at
        the top, or split folders together with --split.
    """
    top = {f.rel_path.partition("/")[0] for f in files if "/" in f.rel_path}
    split_dirs = {d for d in top if d.lower() in SPLIT_ALIASES}
    at_root = any("/" not in f.rel_path for f in files)
    if split_dirs and (split_dirs != top or at_root):
        raise ValueError(
            f"--input_dir mixes split folders {sorted(split_dirs)} with other files or folders "
            f"{sorted(top - split_dirs)} at the top level. Put every image under a split folder, "
            "or none."
        )
    if split_dirs and split_ratios is not None:
        raise ValueError(
            f"--split assigns splits by hash, but --input_dir already has split folders "
            f"{sorted(split_dirs)}. Drop --split, or move the files out of the split folders."
        )
    placed = {}
    for f in files:
        if split_dirs:
            first, _, rest = f.rel_path.partition("/")
            placed[f.rel_path] = (rest, SPLIT_ALIASES[first.lower()])
        else:
            placed[f.rel_path] = (f.rel_path, None)
    classes = {rest.partition("/")[0] for rest, _ in placed.values()}
    by_class = all(rest.count("/") == 1 for rest, _ in placed.values()) and len(classes) >= 2
    if by_class:
        _LOG.info("Image-level labels from the %d class folders (ROOT/%s<class>/<file>)", len(classes),
                  "<split>/" if split_dirs else "")
    else:
        _LOG.info("No image-level labels (label -1): the images are not in ROOT/%s<class>/<file> with "
                  "2 class folders or more", "<split>/" if split_dirs else "")
    labels = {path: (rest.partition("/")[0] if by_class else None, split)
              for path, (rest, split) in placed.items()}
    return labels, ("folders" if split_dirs else "hash")


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
    labelled = _plan_labels(files, problems, split_ratios=split_ratios, labels_csv=labels_csv,
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


class _Labelled(NamedTuple):
    """What `make_plan`'s first step decides: each file's label, and how splits are chosen.

    Attributes:
      labels: Relative path -> (label or None, split or None) of every labelled file.
      class_names: The dataset's classes, in index order.
      split_source: "hash", "csv" or "folders" (the manifest's split source).
      ratios: Split name -> fraction, for hash splits; None otherwise.
      num_found: The inputs: the listing's plus the CSV's rows and targets that point nowhere.
    """

    labels: dict
    class_names: tuple[str, ...]
    split_source: str
    ratios: dict[str, float] | None
    num_found: int


def _plan_labels(files, problems: list, *, split_ratios, labels_csv, class_names, targets,
                 folder_labels, known_classes=None) -> _Labelled:
    """Step 1 of `make_plan`: each file's label (and split, when given), the classes; appends problems."""
    # Inputs are what the listing found plus CSV rows that point nowhere, so
    # that inputs == written + rejected + skipped holds exactly.
    num_found = len(files) + len(problems)
    if targets is not None:
        problems.extend(targets.missing)
        num_found += len(targets.missing)
    if labels_csv is not None:
        has_csv_split = any(split for _, split in labels_csv.values())
        if has_csv_split and split_ratios is not None:
            raise ValueError(
                "--split assigns splits by hash, but the --labels_csv has a split column. "
                "Use one or the other."
            )
        by_path = {f.rel_path: f for f in files}
        labels = {}
        unlabeled = []
        for f in files:
            if f.rel_path in labels_csv:
                labels[f.rel_path] = labels_csv[f.rel_path]
            else:
                unlabeled.append(f)
        for path in sorted(set(labels_csv) - set(by_path)):
            problems.append(Problem(path, "missing_file", "listed in --labels_csv but not found"))
            num_found += 1
        split_source = "csv" if has_csv_split else "hash"
    elif targets is not None and targets.source is not None:
        named = [f for f in files if f.rel_path in targets.values or f.rel_path in targets.rejects]
        labels, split_source = image_labels_optional(named, split_ratios)
        unlabeled = [f for f in files if f.rel_path not in labels]
    else:
        labels, unlabeled, split_source = (folder_labels or _labels_from_folders)(files, split_ratios)
    for f in unlabeled:
        if targets is not None and targets.source is not None and labels_csv is None:
            why = f"not in {targets.source}"
        else:
            why = "not in --labels_csv" if labels_csv is not None else "not inside a class folder"
        problems.append(Problem(f.rel_path, "no_label", why))
    if targets is not None:
        # Labelled by the CSV but without targets: not in the annotations.
        for path in [p for p in labels if p not in targets.values and p not in targets.rejects]:
            problems.append(Problem(path, "no_label", f"not in {targets.source or '--labels_csv'}"))
            del labels[path]

    found_classes = {label for label, _ in labels.values() if label is not None}
    if targets is not None and targets.class_names is not None:
        class_names = targets.class_names
    elif class_names is None and known_classes is not None:
        known = set(known_classes)
        class_names = (*known_classes, *sorted_class_names(found_classes - known))
    elif class_names is None:
        class_names = sorted_class_names(found_classes)
    ratios = dict(split_ratios or {"train": 1.0}) if split_source == "hash" else None
    return _Labelled(labels, tuple(class_names), split_source, ratios, num_found)


def _plan_splits(files, problems: list, labelled: _Labelled, *, seed, groups, targets, windows) -> dict:
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
