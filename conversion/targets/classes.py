"""The image-level class, the first row of the table of target kinds (`conversion.targets.CLASS`).

Every record's `label` feature is its class: an index into the manifest's
class_names, or -1 when the dataset has none (only masks, boxes or numbers, or
several labels per image). The class is planned first (`plan`, step 1 of
`conversion.plan.make_plan`), because it decides the splits every other
row's files go to, from the first of:

- the labels CSV's one label per row (`labels_csv.read_labels_csv`), its
  split column;
- what the other rows planned (`PlanTargets.source`: annotations or masks
  name the files), with optional class folders (`image_labels_optional`);
- a kind of example that labels its examples itself (a series under its class
  folder), or the class folders (`labels_from_folders`).

Its value travels in `PlannedFile.label`, its counts are each shard's
`class_counts` (`counter`, in every kind of example's writer), widened by an
append (`merge`), checked by `verify` and shown by `inspect` (`describe`). The
reading side is `readers.targets.classes` ('int', 'categorical', 'binary').
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import schemas
from conversion.listing import InputFile, Problem
from conversion.targets._counts import per_split_rows
from conversion.targets.kind import ClassKind, Description
from schemas.manifest import SPLIT_ALIASES

__all__ = ["KIND", "NAME", "Labelled", "sorted_class_names", "labels_from_folders", "image_labels_optional"]

_LOG = logging.getLogger("shardsmith.convert")
# The kind's name: the reader's rows of the class say the same (`readers.targets.classes.KIND`).
NAME = "class"
# The kind of several labels per image (`conversion.targets.labels`): its table says what the class's would.
_LABELS = next(kind for kind, specs in schemas.TARGET_KINDS.items() if specs == (schemas.LABELS,))


def sorted_class_names(names) -> tuple[str, ...]:
    """Names in label order: integer-like labels ('2', '10') sort as numbers, so label 10 comes after 2."""
    names = set(names)
    if names and all(n.lstrip("-").isdigit() for n in names):
        return tuple(sorted(names, key=int))
    return tuple(sorted(names))


def labels_from_folders(files: Sequence[InputFile], split_ratios):
    """Classes from class folders (ROOT/<class>/..., ROOT/<split>/<class>/...), the default.

    Returns:
      ({rel_path: (class, split or None)}, unlabeled, split_source).
    """
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


class Labelled(NamedTuple):
    """What the class's planning decides (`make_plan`'s first step): each file's label, and how splits are chosen.

    Attributes:
      labels: Relative path -> (label or None, split or None) of every labelled file.
      class_names: The dataset's classes, in index order.
      split_source: "hash", "csv", "folders" or "annotations" (the manifest's split source).
      ratios: Split name -> fraction, for hash splits; None otherwise.
      num_found: The inputs: the listing's plus the CSV's rows and targets that point nowhere.
    """

    labels: dict
    class_names: tuple[str, ...]
    split_source: str
    ratios: dict[str, float] | None
    num_found: int


def _plan(files, problems: list, *, split_ratios, labels_csv, class_names, targets,
          folder_labels, known_classes=None) -> Labelled:
    """Step 1 of `conversion.plan.make_plan` (its arguments): each file's label (and split, when given),
    the classes; appends problems."""
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
        if targets.splits is not None:
            labels, split_source = _splits_of_targets(named, targets, split_ratios)
        else:
            labels, split_source = image_labels_optional(named, split_ratios)
        unlabeled = [f for f in files if f.rel_path not in labels]
    else:
        labels, unlabeled, split_source = (folder_labels or labels_from_folders)(files, split_ratios)
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
    if class_names is not None and labels and not found_classes and (targets is None or targets.class_names is None):
        # Else the manifest would name classes that no record has (every label -1), and
        # label_mode="int" would read them.
        raise ValueError(
            f"--class_names {','.join(class_names)} names the images' own classes, but no image has one: "
            "they are neither in class folders (ROOT/[<split>/]<class>/<file>, 2 classes or more) nor "
            "labelled by --labels_csv. Box classes come from --annotations (COCO's categories, VOC's "
            "object names) and mask ids from the masks: drop --class_names.")
    if targets is not None and targets.class_names is not None:
        class_names = targets.class_names
    elif class_names is None and known_classes is not None:
        known = set(known_classes)
        class_names = (*known_classes, *sorted_class_names(found_classes - known))
    elif class_names is None:
        class_names = sorted_class_names(found_classes)
    ratios = dict(split_ratios or {"train": 1.0}) if split_source == "hash" else None
    return Labelled(labels, tuple(class_names), split_source, ratios, num_found)


def _splits_of_targets(files, targets, split_ratios) -> tuple[dict, str]:
    """({rel_path: (None, split)}, 'annotations'): the splits the targets give (a YOLO data.yaml's keys)."""
    if split_ratios is not None:
        raise ValueError(f"--split assigns splits by hash, but {targets.source} give each image its split "
                         "(a data.yaml's train/val/test). Drop --split.")
    return {f.rel_path: (None, targets.splits[f.rel_path]) for f in files if f.rel_path in targets.splits}, \
        "annotations"


class _Counts:
    """One shard's records per class (its `class_counts`)."""

    def __init__(self, num_classes: int):
        self._counts = [0] * num_classes

    def add(self, label: int) -> None:
        if 0 <= label < len(self._counts):  # -1: no image-level class (masks, boxes, several labels, numbers)
            self._counts[label] += 1

    def to_json(self) -> tuple[int, ...]:
        return tuple(self._counts)


def _merge(counts, width: int) -> tuple[int, ...]:
    """A held shard's class counts in a dataset grown to `width` classes (new classes come last)."""
    return tuple(counts) + (0,) * (width - len(counts))


def _verify(counts, expected, unchecked: int) -> bool:
    """Whether class counts match the manifest's, given `unchecked` records of unknown class."""
    counts, expected = tuple(counts), tuple(expected)
    if not unchecked:
        return counts == expected
    return (len(counts) == len(expected) and all(c <= e for c, e in zip(counts, expected))
            and sum(expected) - sum(counts) == unchecked)


def _describe(manifest, max_classes: int) -> Description:
    """Images per class and split; none when the table of several labels per image says it all."""
    names, splits = manifest.class_names, manifest.splits
    # Several labels per image and no image-level label: the multi-label table says it all.
    multi_only = _LABELS in manifest.targets and not any(sum(i.class_counts) for i in splits.values())
    if not names:
        return Description(["no image-level classes (label -1 in every record)"], [])
    rows = [] if multi_only else per_split_rows(
        "class", names[:max_classes], list(splits),
        lambda s, i: splits[s].class_counts[i] if splits[s].class_counts else 0)
    tail = [f"... and {len(names) - max_classes} more classes"] if len(names) > max_classes else []
    return Description([], rows, tail)


def _per_split(manifest) -> dict[str, tuple[int, ...]]:
    """Images having each class, per split: with several labels per image, those the labels kind
    counted (the records' image-level labels are -1), else the shards' class counts."""
    multi = (manifest.targets.get(_LABELS) or {}).get("counts")
    return {split: tuple(multi.get(split, ())) if multi is not None else tuple(info.class_counts)
            for split, info in manifest.splits.items()}


KIND = ClassKind(name=NAME, plan=_plan, counter=_Counts, merge=_merge, verify=_verify, describe=_describe,
                 per_split=_per_split)
