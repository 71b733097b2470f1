"""The driver's side of planning: reads the listing, labels CSV and group keys, then plans.

`conversion.plan` decides from what it is given (pure functions); this module
fetches it: the input listing, the labels CSV, and each file's group value for
--group_by (DICOM headers, read on a few threads). No image is decoded, and
Beam is imported only for an input or labels CSV at a URL (`conversion.files`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import gc
import logging
import os
import re

from conversion import examples as _examples, guard, listing as _listing
from conversion import plan as _plan, targets as _targets
from conversion.config import ConversionConfig
from conversion.files import exists, open_to_read, read_bytes
from conversion.targets.classes import sorted_class_names
from imaging import dicom as _dicom

__all__ = ["build_plan", "group_section", "paused_gc"]

_LOG = logging.getLogger("shardsmith.convert")
# DICOM headers are read from this many first bytes of each file (the whole
# file when the keyword lies further in).
_HEAD_BYTES = 65536
# The work is I/O: waits on storage, not the CPU.
_HEADER_THREADS = 8


def build_plan(config: ConversionConfig, on_listed=None, *, select=None, known_classes=None,
               held=None, appending=None) -> _plan.Plan:
    """Lists the input and plans the conversion (no image is read).

    Args:
      config: The conversion's config (`conversion.config.ConversionConfig`).
      on_listed: Called with the listed files (`listing.InputFile`s) as
        soon as they are known, before the planning proper (the driver
        starts its worker processes there).
      select, known_classes, held: With --append
        (`conversion.append_run.AppendRun`): the listed files to convert, the
        dataset's class names and its manifest (the targets' kinds plan new
        targets against it: box classes, mask dtype).
      appending: With --append, the `conversion.append_run.AppendRun` those
        come from, for a kind that plans against the dataset (`ExampleKind.group`).

    Raises:
      FileNotFoundError: For an empty --input_dir or a missing --labels_csv.
      ValueError: When no file has a label.
    """
    with paused_gc():
        return _build_plan(config, on_listed, select, known_classes, held, appending)


@contextlib.contextmanager
def paused_gc():
    """Pauses Python's cyclic garbage collector for the block, then restores it.

    Planning allocates a few objects per file and keeps them all (no cycles):
    the collector's passes, triggered by the allocation count, would walk them
    and every object of the process and free nothing, ~30% of planning 100k
    files. Reference counting frees as always.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():
            # What survived is the plan, kept for the whole run: moved to the
            # oldest generation (freeze, unfreeze) so that the next young
            # collections do not walk it all again (~0.2 s at 100k files).
            gc.freeze()
            gc.unfreeze()
        gc.enable()


def _build_plan(config: ConversionConfig, on_listed, select, known_classes, held_manifest, appending) -> _plan.Plan:
    files, problems = _listing.list_input(config.input_dir)
    if not files and not problems:
        raise FileNotFoundError(f"--input_dir {config.input_dir!r} contains no files.")
    held = frozenset()
    if select is not None:
        found = {f.rel_path for f in files}
        files, problems = select(files, problems)
        # Listed, and held by the dataset already: no "missing_file" for their rows of the CSV.
        held = frozenset(found - {f.rel_path for f in files} - {p.rel_path for p in problems})
    if on_listed is not None:
        on_listed(files)
    # The files as examples, by the conversion's kind (`conversion.examples`): one file each for images,
    # one location of dated passes each for time series.
    kind = _examples.kind_for(config.validation)
    grouped = kind.group(files, problems, config, appending)
    files, problems = grouped.files, grouped.problems
    # A kind that labels its examples itself (volumes: a series' class folder or CSV row above it)
    # has read --labels_csv already.
    labels_csv = _read_labels_csv(config) if grouped.labels is None else None
    # What annotations may name: every listed example, before any is refused below.
    # With --append, the held files too: annotations name them, and they are no 'missing_file'.
    listed = tuple([f.rel_path for f in files] + [p.rel_path for p in problems] + sorted(held))
    groups = None
    if config.group_by and grouped.groups is None:
        failed = _quarantined(config) if config.writing.resume else {}
        groups = group_keys([f for f in files if f.rel_path not in failed], config.group_by, failed)
        if failed:
            # Files whose header crashed a process (an earlier run's) or raised: rejected here.
            files = [f for f in files if f.rel_path not in failed]
            problems = [*problems, *(_listing.Problem(p, r, m) for p, (r, m) in sorted(failed.items()))]
    # With --raster_patch: the work items of the examples cut into patches, by their kind.
    # (Targets beyond one class that a scene cannot take yet: several labels or numbers per file.)
    windows, failed = kind.windows(files, grouped, labels_csv and labels_csv.table, config)
    if failed:
        files = [f for f in files if f.rel_path not in failed]
        problems = [*problems, *(_listing.Problem(p, r, m) for p, (r, m) in sorted(failed.items()))]
    # Targets beyond one class, one row of `conversion.targets.TARGETS` each: masks, boxes, labels, numbers.
    planned = _targets.plan_targets(_targets.TargetRequest(config, files, problems, listed, labels_csv,
                                                           windows, kind, held_manifest, plans=grouped.plans))
    files, problems = planned.files, planned.problems
    csv_rows = planned.labels_csv
    if held and csv_rows is not None:
        csv_rows = {path: row for path, row in csv_rows.items() if path not in held}
    mask_plan = planned.summaries.get(_targets.masks.NAME)
    sharding = config.sharding
    plan = _plan.make_plan(
        files, problems,
        groups=groups,
        seed=config.seed,
        split_ratios=config.split_ratios,
        labels_csv=csv_rows,
        # With YOLO labels without names of their own, --class_names names the box classes.
        class_names=None if planned.targets and planned.targets.takes_class_names else config.class_names,
        num_shards=sharding.num_shards,
        target_shard_bytes=sharding.target_shard_bytes,
        min_shards=sharding.min_shards,
        targets=planned.targets,
        folder_labels=planned.labels_from if grouped.labels is None else _kind_labels(grouped),
        windows=windows,
        known_classes=known_classes,
    )
    if mask_plan is not None:
        # Its summary (dtype, section): each file's mask travels in its targets.
        plan = dataclasses.replace(plan, masks=mask_plan)
    if config.group_by and grouped.groups is not None:
        # A kind that split its examples by group itself (volumes): the manifest's groups of its planned ones.
        plan = dataclasses.replace(plan, groups=_plan.split_groups(plan.files, grouped.groups, plan.shard_counts,
                                                                   config.seed))
    return _checked(kind.finish_plan(plan, grouped), config, masked=mask_plan is not None,
                    appending=held_manifest is not None)


def _checked(plan: _plan.Plan, config: ConversionConfig, masked: bool, appending: bool = False) -> _plan.Plan:
    """The plan, once it has a file to convert (else the ValueError that says why none), logged.

    An append to a dataset may plan none: its new inputs all refused while planning (a series
    of too few slices, a file outside any class folder) are its rejects (`conversion.finalize`).
    """
    if not plan.files and appending:
        _LOG.info("No new input to convert: the %s new ones are rejected", f"{len(plan.problems):,}")
        return plan
    if not plan.files and masked:
        raise ValueError(
            f"--input_dir {config.input_dir!r} has no image with a mask under --masks_dir "
            f"{config.masks.masks_dir!r}: {len(plan.problems)} files found, none paired (see the file names "
            "and --mask_suffix)."
        )
    if not plan.files:
        raise ValueError(_nothing_to_convert(plan.problems, config.input_dir))
    _LOG.info(
        "Found %s files belonging to %d classes; %s to convert into %s",
        f"{plan.num_found:,}", len(plan.class_names), f"{len(plan.files):,}",
        ", ".join(f"{split} ({n} shards)" for split, n in plan.shard_counts.items()),
    )
    empty = _empty_class_folders(config, plan)
    if empty:
        every = ",".join(sorted_class_names((*plan.class_names, *empty)))
        _LOG.warning(
            "Class folders without a file under --input_dir: %s. They are no classes here, where "
            "keras's image_dataset_from_directory would count them among its classes (so labels "
            "could differ from its); give --class_names %s to keep an index for them.",
            ", ".join(repr(name) for name in empty), every)
    return plan


def _empty_class_folders(config: ConversionConfig, plan: _plan.Plan) -> tuple[str, ...]:
    """Folders at a class folder's place (`ROOT/<class>`, `ROOT/<split>/<class>`) holding no file.

    Only for classes taken from local folders, where an empty folder is the
    one difference from keras's `image_dataset_from_directory` a user could
    not see in the rejects list (it lists no file).
    """
    if (config.class_names is not None or config.labels_csv or config.annotations or config.masks.masks_dir
            or not plan.class_names or not _listing.is_local(config.input_dir)):
        return ()
    parents = [config.input_dir]
    if plan.split_source == "folders":
        parents = [entry.path for entry in _scan(config.input_dir) if entry.name.lower() in _plan.SPLIT_ALIASES]
    # Hidden folders (.git, __MACOSX) are no class folders; a folder of skipped files only
    # (.DS_Store) is one without a file to convert.
    names = {entry.name for parent in parents for entry in _scan(parent)
             if not entry.name.startswith((".", "__"))}
    return tuple(sorted(names - set(plan.class_names)))


def _scan(folder: str) -> list:
    """The folders of `folder` (links to folders included); none where it cannot be listed."""
    try:
        with os.scandir(folder) as it:
            return [entry for entry in it if entry.is_dir()]
    except OSError:
        return []


def _nothing_to_convert(problems, input_dir: str) -> str:
    """Why no file is left to convert, from the reasons of the files refused while planning.

    Files outside any class folder are the usual cause; but a folder of files each refused
    for a reason of its own (DICOM series of one slice, files without pixel data under
    --volumes) has its class folders, and is told what was refused instead.
    """
    reasons = collections.Counter(p.reason for p in problems)
    if set(reasons) <= {"no_label"}:
        return (f"--input_dir {input_dir!r} has no labelled images: {len(problems)} files found, none inside "
                "a class folder (ROOT/<class>/...) or the labels CSV.")
    counts = ", ".join(f"{reason} {n}" for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    example = min((p for p in problems if p.reason != "no_label"), key=lambda p: p.rel_path)
    shown = example.message if example.rel_path in example.message else f"{example.rel_path}: {example.message}"
    return (f"--input_dir {input_dir!r} has nothing to convert: {len(problems)} files found, every one refused "
            f"while planning ({counts}); e.g. {shown}")


def _kind_labels(grouped):
    """`make_plan`'s folder_labels for the examples a kind labelled itself (`Grouped.labels`)."""

    def labels_from(files, split_ratios):
        labels = {f.rel_path: grouped.labels[f.rel_path] for f in files if f.rel_path in grouped.labels}
        return labels, [f for f in files if f.rel_path not in labels], grouped.split_source

    return labels_from


def _read_labels_csv(config: ConversionConfig):
    """--labels_csv read once (`conversion.targets.LabelsCsv`), or None without one."""
    if not config.labels_csv:
        return None
    if not exists(config.labels_csv):
        raise FileNotFoundError(f"--labels_csv {config.labels_csv!r} does not exist.")
    return _targets.read_labels_csv(read_bytes(config.labels_csv).decode("utf-8-sig"), config.labels_csv)


def group_section(plan: _plan.Plan, config) -> dict:
    """The manifest's `groups` section (hashed group ids per split), if --group_by."""
    if plan.groups is None:
        return {}
    return {"groups": {
        "by": config.group_by,
        "per_split": {split: {"count": len(ids), "sha256_16": list(ids)} for split, ids in plan.groups.items()},
    }}


def group_keys(files, group_by: str, failed: dict | None = None) -> dict[str, str]:
    """Relative path to group value, for the files that have one.

    Args:
      files: The listed files.
      group_by: --group_by.
      failed: Where a file whose header reading raised an unexpected error
        goes (rel_path -> (reason, message)); it is then not planned.
    """
    kind, _, value = group_by.partition(":")
    if kind == "regex":
        return _regex_keys(files, re.compile(value))

    def key(f):
        # Noted in the journal: a header that crashes the driver is known to the command above it.
        with guard.working_on([(f.rel_path, f.path)]):
            try:
                return f.rel_path, _dicom_key(f, value)
            except Exception as e:  # noqa: BLE001 - this file alone: rejected, reported
                if failed is None:
                    raise
                _LOG.debug("Unexpected error reading the header of %s", f.rel_path, exc_info=e)
                failed[f.rel_path] = (guard.INTERNAL_ERROR, guard.internal_error_message(f.rel_path, e))
                return f.rel_path, None

    with concurrent.futures.ThreadPoolExecutor(max_workers=_HEADER_THREADS) as pool:
        found = dict(pool.map(key, files))
    keyed = {path: key for path, key in found.items() if key}
    _LOG.info("Read %s from %s of %s files (--group_by %s)", value, f"{len(keyed):,}",
              f"{len(files):,}", group_by)
    return keyed


def _quarantined(config) -> dict:
    """The files an interrupted run found to crash or hang a process (`guard.Quarantine`)."""
    return guard.Quarantine(guard.quarantine_path(config.output_dir)).load()


def _regex_keys(files, pattern: re.Pattern) -> dict[str, str]:
    out = {}
    for f in files:
        m = pattern.search(f.rel_path)
        if m:
            out[f.rel_path] = m.group(1) if m.groups() else m.group(0)
    return out


def _dicom_key(f, keyword: str) -> str | None:
    """The file's DICOM `keyword` value; None when it is no DICOM file or lacks it."""
    try:
        with open_to_read(f.path) as fh:
            head = fh.read(_HEAD_BYTES)
            if not _dicom.is_dicom(head[:1024]):
                return None
            key = _dicom.read_group_value(head, keyword)
            if key is None and f.size > len(head):
                key = _dicom.read_group_value(head + fh.read(), keyword)
    except OSError:
        return None  # The shard writer reads it again and says why.
    return key
