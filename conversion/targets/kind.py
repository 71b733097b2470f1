"""The row types of the table of target kinds (`conversion.targets.TARGETS` and its class row,
`conversion.targets.CLASS`), and what they trade."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import schemas

__all__ = ["TargetKind", "ClassKind", "TargetRequest", "PlannedKind", "PlanTargets", "RecordPart", "Description"]


class TargetRequest(NamedTuple):
    """What a kind may read to plan its targets (`TargetKind.plan`).

    Attributes:
      config: The `conversion.config.ConversionConfig`.
      files, problems: The examples to plan (`conversion.listing.InputFile`s,
        grouped by the kind of example) and the problems so far.
      listed: Every relative path the listing found (files and problems),
        before any was refused: what annotations may name.
      labels_csv: The parsed --labels_csv (`conversion.targets.labels_csv.LabelsCsv`),
        or None without one.
      windows: With --raster_patch, the examples' work items (the example
        kind's `windows`); None otherwise.
      example: The conversion's kind of example (`conversion.examples.ExampleKind`):
        how its examples cut into windows cut their label rasters (`cut_masks`).
      held: With --append, the `schemas.Manifest` of the dataset appended to
        (its targets section says what a kind's new targets must agree with:
        box classes, mask dtype, ...); None for a first conversion.
      planned: The manifest sections of the rows planned before this one,
        by kind (the masks that --annotation_masks draws take the boxes' classes).
      plans: Example name -> the kind of example's plan of it (`Grouped.plans`: a
        volume's `conversion.volumes.VolumeJob`, whose series a DICOM SEG references), or None.
    """

    config: Any
    files: list
    problems: list
    listed: tuple[str, ...]
    labels_csv: Any = None
    windows: Mapping | None = None
    example: Any = None
    held: Any = None
    planned: Mapping[str, Any] = {}
    plans: Mapping[str, Any] | None = None

    def held_section(self, name: str) -> Mapping[str, Any] | None:
        """The held dataset's manifest section of kind `name`; None for a first conversion or none."""
        if self.held is None:
            return None
        return (self.held.extra.get(schemas.TARGETS_SECTION) or {}).get(name)


class PlannedKind(NamedTuple):
    """One kind's targets, planned (`TargetKind.plan`).

    Attributes:
      values: Relative path to the file's value of this kind (plain JSON
        values): what travels with the file to its shard's writer.
      section: This kind's part of the manifest's `targets` section, as
        known before the run.
      rejects: Relative path to (reason, message) of files whose targets
        cannot be stored: rejected without being read.
      missing: Entries naming files that do not exist (`listing.Problem`s,
        'missing_file'), counted as found inputs.
      source: What names the dataset's files (e.g. 'the annotations'), for
        a kind whose files need no class; None when it names none.
      class_names: The image-level class names when this kind decides them;
        None otherwise.
      files, problems: The examples and problems after this kind took its
        own (e.g. images without a mask become problems); None: unchanged.
      labels_from: Without a labels CSV, what gives each file's label and
        split (`conversion.plan.make_plan`'s `folder_labels`); None: class
        folders.
      summary: What the rest of the run needs of this kind (e.g. the
        `conversion.masks.MaskPlan`), or None.
      splits: Relative path to split, where this kind's files say each
        file's split (a YOLO data.yaml's train/val/test); None: they do not.
      takes_class_names: Whether --class_names named this kind's classes
        (YOLO labels without names of their own), not the images' classes.
    """

    values: Mapping[str, Any]
    section: Mapping[str, Any]
    rejects: Mapping[str, tuple[str, str]] = {}
    missing: tuple = ()
    source: str | None = None
    class_names: tuple[str, ...] | None = None
    files: list | None = None
    problems: list | None = None
    labels_from: Callable | None = None
    summary: Any = None
    splits: Mapping[str, str] | None = None
    takes_class_names: bool = False


class RecordPart(NamedTuple):
    """One kind's features of one record (`TargetKind.record`).

    Attributes:
      extra: Feature key to values (`schemas.ImageRecord.extra`).
      actions: What was done to the targets, for normalized.jsonl, or ().
      details: Their details (normalized.jsonl's details[kind]), or None.
      issues: Dataset-level issues of this record (counted per shard).
    """

    extra: Mapping[str, Any]
    actions: tuple[str, ...] = ()
    details: Any = None
    issues: tuple[str, ...] = ()


class Description(NamedTuple):
    """How `shardsmith inspect` shows one kind's manifest section (`TargetKind.describe`).

    Attributes:
      head: Lines before the table.
      rows: The table, its first row the header; [] for none.
      tail: Lines after the table.
    """

    head: list[str]
    rows: list[list[str]]
    tail: list[str] = []


@dataclasses.dataclass(frozen=True)
class TargetKind:
    """One kind of target: one row of `conversion.targets.TARGETS`.

    Attributes:
      name: Its key in `schemas.TARGET_KINDS` (its features), in the
        manifest's `targets` section and in each file's planned targets.
      plan: `TargetRequest` -> `PlannedKind`: how it is read from the
        user's files and matched to them, on the driver, before any image
        is read; None when the conversion does not ask for it.
      record: (value, image, raw_frame, name) -> `RecordPart`: the record's
        features from the file's planned value and its validated image
        (`imaging.ValidImage`; raw_frame: (EXIF orientation, raw width, raw
        height) when it was turned upright, else None), in the shard
        writer. Raises `imaging.ImageRejected` when they cannot be stored.
      counter: () -> a new per-shard counter with `add(RecordPart)` and
        `to_json()` (None when it saw nothing), for the manifest; None: not
        counted.
      section: (planned section, shards, splits, num_classes) -> this kind's
        manifest section, completed from the shards' results
        (`conversion.elements.ShardResult`s); None: the planned one as is.
      verify: (manifest section, num_classes) -> (check, problem), for
        `shardsmith verify`: `check(values, height, width, tf)` gives the
        problem of one decoded record's features of this kind (values:
        `schema.decode`; height, width: its stored image's; tf: TensorFlow)
        or None; `problem` says what the section lacks to check them (check
        is then None). None: its records are not checked.
      describe: (manifest section, class_names, splits, max_classes) ->
        `Description`, how `shardsmith inspect` shows it (at most
        `max_classes` rows of classes); None: not shown.
      merge: (held section, this run's section) -> the section of the dataset
        grown by an append (`convert --append`): counts added up, the planned
        values this run's (planned against the held ones); None: this run's.
      flag: The option that asks for it, for messages (an append that would
        add or lose the kind names it); None: its name.
    """

    name: str
    plan: Callable[[TargetRequest], PlannedKind | None]
    record: Callable[[Any, Any, Any, str], RecordPart]
    counter: Callable[[], Any] | None = None
    section: Callable[[dict, Any, Any, int], dict] | None = None
    verify: Callable[[Mapping[str, Any], int], tuple[Callable | None, str | None]] | None = None
    describe: Callable[[Mapping[str, Any], Any, list, int], Description] | None = None
    merge: Callable[[Mapping[str, Any], Mapping[str, Any]], dict] | None = None
    flag: str | None = None


@dataclasses.dataclass(frozen=True)
class PlanTargets:
    """Targets beyond one class, planned per file before `conversion.plan.make_plan` (`conversion.targets.plan_targets`).

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
      splits: Relative path to split where the targets give each file's
        split (`PlannedKind.splits`); None: the folders or --split do.
      takes_class_names: Whether --class_names named a kind's classes, not the images'.
    """

    kinds: tuple[str, ...]
    values: Mapping[str, str]
    source: str | None = None
    missing: tuple = ()
    rejects: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    class_names: tuple[str, ...] | None = None
    section: Mapping = dataclasses.field(default_factory=dict)
    splits: Mapping[str, str] | None = None
    takes_class_names: bool = False


@dataclasses.dataclass(frozen=True)
class ClassKind:
    """The image-level class: the first row of the table of target kinds (`conversion.targets.CLASS`).

    Its hooks are those of a `TargetKind`, shaped by where the class lives:
    its value is every record's core `label` feature (`PlannedFile.label`, an
    index into the manifest's class_names, -1 for none), not a value of the
    file's targets, and its counts are each shard's `class_counts`, not a
    part of the manifest's `targets` section. It is planned first, because
    the class decides the splits that every other row's files go to.

    Attributes:
      name: 'class' (the reader's rows of the class, `readers.targets.classes`,
        say the same).
      plan: (files, problems, *, split_ratios, labels_csv, class_names,
        targets, folder_labels, known_classes) -> `conversion.targets.classes.Labelled`:
        each file's class and split and the dataset's class names, from the
        labels CSV, the class folders, the kind of example's own labels or
        what the other rows planned (`PlanTargets`); step 1 of
        `conversion.plan.make_plan`, whose arguments these are.
      counter: num_classes -> a new per-shard counter with `add(label)` and
        `to_json()` (the shard's class_counts), in every kind of example's
        shard writer.
      merge: (held class_counts, width) -> those counts as the grown dataset
        has them (`convert --append`: a class this run found comes last).
      verify: (counts read, the manifest's, unchecked records) -> whether they
        agree, for `shardsmith verify` (per shard, split and version).
      describe: (`schemas.Manifest`, max_classes) -> `Description` of the
        images per class and split, for `shardsmith inspect`; its rows are []
        when another kind's table says it all, its head names no classes.
      per_split: `schemas.Manifest` -> split -> images having each class,
        for inspect's warnings (classes missing from a split, imbalance).
    """

    name: str
    plan: Callable[..., Any]
    counter: Callable[[int], Any]
    merge: Callable[[tuple, int], tuple]
    verify: Callable[[Any, Any, int], bool]
    describe: Callable[[Any, int], Description]
    per_split: Callable[[Any], Mapping[str, tuple[int, ...]]]
