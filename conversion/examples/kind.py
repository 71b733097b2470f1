"""The row type of the example-kind table (`conversion.examples.KINDS`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

__all__ = ["ExampleKind", "Grouped"]


class Grouped(NamedTuple):
    """The listed files as examples (`ExampleKind.group`).

    Attributes:
      files: The files planned further (`conversion.listing.InputFile`s): one
        per example; for a kind of several files, the one that names it.
      problems: The listing's problems, plus the files this kind refused.
      members: Example name -> the relative paths of the files it is made
        of, for a kind of several files; None when each file is one example.
      plans: Example name -> the kind's plan of it, when it has one.
      labels: Example name -> (class, split or None), for a kind that labels
        its examples itself (a series' class folder or --labels_csv row above
        it); None: labelled as files are (class folders, --labels_csv).
      split_source: With `labels`: the manifest's split source ("csv" when
        the labels carry the splits; else each example's split is its own).
      groups: With --group_by, for a kind that splits its examples by group itself
        (volumes: a series' PatientID, read with its headers): example name -> its
        group value, for those that have one; the manifest's `groups` come from
        them. None: the planner reads each example's group (`conversion.planning.group_keys`).
    """

    files: list
    problems: list
    members: Mapping[str, tuple[str, ...]] | None = None
    plans: Mapping[str, Any] | None = None
    labels: Mapping[str, tuple[str, str | None]] | None = None
    split_source: str | None = None
    groups: Mapping[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class ExampleKind:
    """One kind of example: one row of `conversion.examples.KINDS`.

    Attributes:
      name: The kind's name ("image", ...), as the reading side's row names it.
      applies: Takes the conversion's `imaging.ValidationOptions`; True when
        the conversion writes this kind.
      group: (files, problems, config, appending) -> `Grouped`: the listed
        files as examples; config is the `conversion.config.ConversionConfig`,
        appending the `conversion.append_run.AppendRun` with --append (its
        files are those the dataset does not hold), else None.
      record_schema: (validation, targets) -> the schema of its records.
      write_shard: `conversion.shard_writer.ShardJob` -> its `ShardOutcome`.
      warm_call: (validation, processes, decoders) -> the warm-up (fn, args)
        of a worker process.
      windows: (files, grouped, targets, config) -> (windows, failed): with
        --raster_patch, the work items of the examples cut into patches
        (`conversion.plan.make_plan`'s `windows`, None when none is cut),
        and relative path -> (reason, message) of those that cannot be.
      cut_masks: (mask_plan, windows, config) -> the `conversion.masks.MaskPlan`
        of examples cut into those windows.
      sized_masks: (mask_plan, plans, config) -> the `conversion.masks.MaskPlan`
        whose files' sizes count their masks as this kind's records store them
        (shards are sized by them); `plans` is `Grouped.plans`.
      finish_plan: (plan, grouped) -> the `conversion.plan.Plan` completed
        with what the kind keeps of its examples.
      manifest_section: (plan, config) -> the kind's sections of the manifest.
      prepare_output: (plan, config) -> None: what its shard writers read,
        written by the driver into config.output_dir before the pipeline runs.
      finish_output: (manifest, rejects, output_dir) -> None, or None: what
        the kind writes after manifest.json (`schemas.Manifest`, the
        `conversion.elements.Reject`s), for its own tools.
      record_noun: What one record is, in the log's words ("image", "stack", "volume").
    """

    name: str
    applies: Callable[[Any], bool]
    group: Callable[[list, list, Any, Any], Grouped]
    record_schema: Callable[[Any, tuple[str, ...]], Any]
    write_shard: Callable[[Any], Any]
    warm_call: Callable[[Any, int, bool], tuple]
    # The rest are optional: by default none is cut, and there is nothing more to plan or write.
    windows: Callable[[list, Grouped, tuple[str, ...], Any], tuple[Mapping | None, Mapping]] = (
        lambda files, grouped, targets, config: (None, {}))
    cut_masks: Callable[[Any, Mapping, Any], Any] = lambda mask_plan, windows, config: mask_plan
    sized_masks: Callable[[Any, Mapping | None, Any], Any] = lambda mask_plan, plans, config: mask_plan
    finish_plan: Callable[[Any, Grouped], Any] = lambda plan, grouped: plan
    manifest_section: Callable[[Any, Any], dict] = lambda plan, config: {}
    prepare_output: Callable[[Any, Any], None] = lambda plan, config: None
    finish_output: Callable[[Any, list, str], None] | None = None
    record_noun: str = "image"
