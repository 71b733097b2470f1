"""--volumes: DICOM series and NIfTI files planned, decoded and written as shards (Beam-free, issue 36).

What a volume conversion does beyond an image conversion (the example kind
`conversion.examples.volumes`, through the same pipeline, guard, receipts,
--resume and manifest):

- **Planning** (`plan_volumes`, on the driver, headers only): the listed
  files are grouped into series units (`input_dir/<class>/<series folder>/...`,
  DICOM files at any depth, any names; or the folder a --labels_csv row
  names), each unit's slices into stacks (`imaging.volumes.plan_stacks`), and
  each `.nii`/`.nii.gz` file is a volume of its own. A volume becomes one
  planned "file" whose relative path is its record's filename and whose path
  is its plan's JSON file (`write_volume_plans`), which the shard writer
  reads. Labels and splits are decided per series unit, never per slice (no
  series lies in two splits). Every input file is in exactly one written
  volume, a note of one, or the rejects.
- **Writing** (`write_volumes`, in the shard writer's process, inside the
  guard): each volume is decoded into one preallocated array, encoded as a
  `schemas.volumes.VolumeRecord`, framed and written, then let go.
- **After the manifest** (`write_manifest`): `volumes.json`, the summary
  that `readers.metadata` and `shardsmith inspect/verify/preview` read.

The headers read while planning are noted in the journal (`guard`), so
that the command's supervising process knows a file that crashes the driver.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from conversion import files as _files, guard
from conversion.elements import Reject, ShardOutcome, ShardResult
from conversion.listing import InputFile, Problem
from conversion.plan import hash_split, sorted_class_names
from conversion.masks import PixelCounter as _PixelCounter, TARGET_KIND as _MASK
from conversion.targets import CLASS
from conversion.targets.masks import class_table_of as _mask_table, of_file as _mask_of
from imaging import volumes
from imaging.errors import ImageRejected
from schemas import tfrecord
from schemas.volumes import VOLUME_MASK_SCHEMA, VOLUME_SCHEMA, VOLUMES_MANIFEST_FILENAME, VolumeRecord, unit_of_volume

__all__ = ["VolumeJob", "VolumesPlan", "HeldVolumes", "plan_volumes", "content_digests", "read_labels_csv",
           "csv_unit_locator", "check_held_rows", "write_volume_plans", "volume_plan_path", "write_volumes",
           "warm_up", "mask_bytes", "manifest_section", "counted_section", "stack_names", "write_manifest",
           "read_manifest", "VOLUMES_MANIFEST",
           "series_unit", "unit_of_volume", "merge_sections", "split_key"]

_LOG = logging.getLogger("shardsmith.convert")
# Written after manifest.json: the volume dataset's summary (class names, splits, rejects).
VOLUMES_MANIFEST = VOLUMES_MANIFEST_FILENAME
_NIFTI_SUFFIXES = (".nii", ".nii.gz")
# Read of a NIfTI file's start for its header (`VolumeJob.voxel_count`): a gzipped header inflates from far fewer.
_NIFTI_HEAD_BYTES = 65536
# Reading NIfTI headers while planning waits on storage, not the CPU.
_HEADER_THREADS = 8
# Inside the temporary folder: each volume's plan, read by the shard writer.
_PLANS_DIRNAME = "volumes"
# What `stack_names` adds after a series folder's name when it gives several volumes.


@dataclasses.dataclass(frozen=True)
class VolumeJob:
    """One planned volume: a DICOM stack or a NIfTI file.

    Attributes:
      filename: The record's `filename` (series folder, `#series=N` when it holds several: `stack_names`).
      label: Its class name.
      split: Its split.
      stack: The planned DICOM stack, or None for NIfTI.
      nifti: The NIfTI file's relative path, or None.
      sources: The input files it counts (each input is counted once, in one volume).
      notes: Files of the volume's series that it leaves out and why (a
        duplicate slice, a frame of another stack), for normalized.jsonl.
      content: With --dedup, the SHA-256 (hex) of its content (`content_digests`),
        kept in an append's inventory; else None.
    """

    filename: str
    label: str
    split: str
    stack: volumes.Stack | None = None
    nifti: str | None = None
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    content: str | None = None

    @property
    def nbytes(self) -> int:
        """Its decoded size, about (shards are sized by it)."""
        if self.stack is None:
            return 0
        first = self.stack.slices[0]
        return len(self.stack.slices) * first.rows * first.columns * 2

    def voxel_count(self, input_dir: str) -> int | None:
        """Its voxels: a DICOM stack's from its plan, a NIfTI file's from its header (its first bytes
        read under --input_dir); None for a header that says none (the shard writer reads the file
        and rejects it). A --masks_dir mask holds as many, on its grid (`mask_bytes`)."""
        if self.stack is not None:
            first = self.stack.slices[0]
            return len(self.stack.slices) * first.rows * first.columns
        try:
            with _files.open_to_read(_files.join(input_dir, self.nifti)) as f:
                head = f.read(_NIFTI_HEAD_BYTES)
        except OSError:
            return None
        return volumes.nifti_voxels(head)

    def to_json(self) -> dict:
        out = {"filename": self.filename, "label": self.label, "split": self.split,
               "stack": None if self.stack is None else self.stack.to_json(), "nifti": self.nifti,
               "sources": list(self.sources), "notes": list(self.notes)}
        if self.content is not None:
            out["content"] = self.content
        return out

    @classmethod
    def from_json(cls, data: dict) -> VolumeJob:
        stack = None if data["stack"] is None else volumes.Stack.from_json(data["stack"])
        return cls(data["filename"], data["label"], data["split"], stack, data["nifti"],
                   tuple(data["sources"]), tuple(data["notes"]), data.get("content"))


@dataclasses.dataclass(frozen=True)
class VolumesPlan:
    """The volumes of a listing (`plan_volumes`).

    Attributes:
      files: One `InputFile` per volume: rel_path its filename, path its plan
        file (`volume_plan_path`), size its decoded bytes (about).
      problems: The listing's problems, and every input file in no volume.
      jobs: Volume filename -> its `VolumeJob`.
      class_names: The classes found.
      split_source: "csv" when --labels_csv gave the splits, else "series".
      duplicates_of_held: With --append --dedup: each input file rejected as a
        copy of a volume the dataset holds, to that volume's filename.
      groups: With --group_by: volume filename -> its group's value (a PatientID), for
        the volumes that have one (`_group_of`); the others are split by their series.
    """

    files: tuple[InputFile, ...]
    problems: tuple[Problem, ...]
    jobs: dict[str, VolumeJob]
    class_names: tuple[str, ...]
    split_source: str
    duplicates_of_held: Mapping[str, str] = dataclasses.field(default_factory=dict)
    groups: Mapping[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class HeldVolumes:
    """What the dataset an append grows holds already, as `plan_volumes` plans against it.

    Attributes:
      files: The listed input files of its series units (held or changed): a
        --labels_csv row of theirs is no `missing_file`.
      contents: With --dedup: the content digest (hex, `content_digests`) of
        each held volume, to its (record filename, version).
      class_names: The dataset's class names: with --masks_dir, [] keeps every new
        volume without a class (label -1) and a list keeps the class folders,
        whatever layout the new volumes alone would show (`_class_layout`).
    """

    files: frozenset[str] = frozenset()
    contents: Mapping[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    class_names: tuple[str, ...] | None = None


def volume_plan_path(output_dir: str, filename: str) -> str:
    """Where a volume's plan is written (`write_volume_plans`): a stable name in the temporary folder."""
    digest = hashlib.blake2b(os.fsencode(filename), digest_size=12).hexdigest()
    return _files.join(output_dir, _files.TMP_DIRNAME, _PLANS_DIRNAME, digest + ".json")


def mask_bytes(files: Sequence[InputFile], jobs: Mapping[str, VolumeJob], dtype: str,
               input_dir: str) -> list[InputFile]:
    """The planned volumes with their masks' bytes added to their sizes (--masks_dir): shards are sized by them.

    A record holds its mask as stored (`schemas.volumes`): one id per voxel of its volume's
    grid, raw (`dtype`, uint8 or uint16), in uncompressed shards; so a volume's share of a shard
    grows by its voxels x the dtype's size (NIfTI headers read on threads). A volume whose
    voxels are unknown (an unreadable header: the writer rejects it) keeps its size.

    Args:
      files: The planned volumes (`VolumesPlan.files`: rel_path the volume's name).
      jobs: Volume name -> its `VolumeJob`.
      dtype: The dataset's mask dtype.
      input_dir: --input_dir, under which the NIfTI volumes lie.
    """
    itemsize = np.dtype(dtype).itemsize
    with concurrent.futures.ThreadPoolExecutor(max_workers=_HEADER_THREADS) as pool:
        voxels = list(pool.map(lambda f: jobs[f.rel_path].voxel_count(input_dir) if f.rel_path in jobs else None,
                               files))
    return [f if n is None else dataclasses.replace(f, size=f.size + n * itemsize) for f, n in zip(files, voxels)]


def _unit_of(rel_path: str) -> tuple[str, str] | None:
    """(class, series unit) of a file: input/<class>/<series>/...; None outside any class folder."""
    parts = rel_path.split("/")
    if len(parts) < 2:
        return None
    if _is_nifti_name(rel_path):
        return parts[0], rel_path  # A NIfTI file is its own unit.
    if len(parts) == 2:
        return parts[0], parts[0]  # Slices directly in the class folder: one series folder.
    return parts[0], "/".join(parts[:2])


def series_unit(rel_path: str) -> str | None:
    """The series unit a file belongs to (its series folder, or the NIfTI file itself); None outside a class folder.

    With --append a unit is held, new or changed as a whole (`conversion.append.sort_locations`):
    its volumes' labels and splits are decided by it, never by a slice.
    """
    if _is_nifti_name(rel_path):
        return rel_path  # Its own unit, in a class folder or not (--masks_dir: the Decathlon's flat imagesTr).
    unit = _unit_of(rel_path)
    return None if unit is None else unit[1]


def _is_nifti_name(rel_path: str) -> bool:
    return rel_path.lower().endswith(_NIFTI_SUFFIXES)


def _csv_entry_of(rel_path: str, labels_csv: Mapping[str, tuple[str, str | None]]) -> str | None:
    """The --labels_csv path that labels a file: the file itself, else its deepest folder listed."""
    if rel_path in labels_csv:
        return rel_path
    parts = rel_path.split("/")
    for depth in range(len(parts) - 1, 0, -1):
        folder = "/".join(parts[:depth])
        if folder in labels_csv:
            return folder
    return None


def read_labels_csv(path: str) -> dict[str, tuple[str, str | None]]:
    """--labels_csv's rows for volumes: path -> (label, split or None).

    Raises:
      FileNotFoundError: For a missing file.
    """
    if not _files.exists(path):
        raise FileNotFoundError(f"--labels_csv {path!r} does not exist.")
    from conversion.plan import read_labels_csv as read

    return read(_files.read_bytes(path).decode("utf-8-sig"), path)


def csv_unit_locator(labels_csv: Mapping[str, tuple[str, str | None]], held_units: Collection[str]):
    """With --append --labels_csv: the series unit of a listed file, as `conversion.append.sort_locations` takes it.

    A file's unit is the one `plan_volumes` gives it (its CSV row's folder, or the
    NIfTI file itself), except that a DICOM file under a held unit's folder is that
    unit's (a slice added to a held series makes it `changed`, whatever rows came since).

    Returns:
      (location_of, is_member): a file's unit (None: under no row nor held unit), and
      whether it has one.
    """
    held_units = frozenset(held_units)

    def location_of(rel_path: str) -> str | None:
        if _is_nifti_name(rel_path):
            held = rel_path in held_units
            return rel_path if held or _csv_entry_of(rel_path, labels_csv) is not None else None
        parts = rel_path.split("/")
        for depth in range(len(parts), 0, -1):
            folder = "/".join(parts[:depth])
            if folder in held_units:
                return folder
        return _csv_entry_of(rel_path, labels_csv)

    return location_of, lambda rel_path: location_of(rel_path) is not None


def check_held_rows(labels_csv: Mapping[str, tuple[str, str | None]], held: Mapping, source: str) -> None:
    """Refuses a --labels_csv that relabels or resplits a series unit the dataset holds (--append).

    An append never rewrites a held record: a row that now gives its unit another
    label, or another split, would leave the dataset unlike the CSV. A held unit
    no row names keeps its record.

    Args:
      labels_csv: The CSV's rows (path -> (label, split or None)).
      held: Unit -> its `conversion.append.HeldFile` (label, split, version).
      source: --labels_csv, for the message.

    Raises:
      ValueError: Naming --labels_csv, each unit (up to 5), what it was and what the CSV says now.
    """
    differ = []
    for unit in sorted(held, key=os.fsencode):
        entry = _csv_entry_of(unit, labels_csv)
        if entry is None:
            continue
        h = held[unit]
        label, split = labels_csv[entry]
        if (h.label is not None and label != h.label) or (split is not None and split != h.split):
            now = f"label {label!r}" + (f", split {split!r}" if split is not None else "")
            differ.append(f"{unit} (held by version {h.version} with label {h.label!r}, split {h.split!r}; "
                          f"the CSV now says {now})")
    if differ:
        more = f" and {len(differ) - 5} more" if len(differ) > 5 else ""
        raise ValueError(
            f"--labels_csv {source} gives {len(differ)} series the dataset holds another label or split: "
            f"{'; '.join(differ[:5])}{more}. --append never rewrites a held record: restore those rows, or "
            "convert the grown folder with --overwrite (or into another --output_dir) to relabel them.")


def plan_volumes(files: Sequence[InputFile], problems: Sequence[Problem], input_dir: str, output_dir: str, *,
                 options: volumes.VolumeOptions, split_ratios=None, seed: int = 0, quarantined=None,
                 labels_csv: Mapping[str, tuple[str, str | None]] | None = None,
                 dedup: bool = False, held: HeldVolumes | None = None, masked: bool = False,
                 group_by: str | None = None) -> VolumesPlan:
    """Plans every volume of a listing, from headers only.

    Args:
      files, problems: The listing (`conversion.listing.list_input`).
      input_dir, output_dir: --input_dir; --output_dir (where the plans go).
      options: --min_slices.
      split_ratios: --split; None: the CSV's split column, else all in 'train'.
      quarantined: rel_path -> (reason, message) of files that crashed or hung
        an earlier attempt (`guard.Quarantine`): rejected without being read.
      labels_csv: --labels_csv's rows (`conversion.targets.labels_csv.read_labels_csv`):
        path -> (label, split or None); a path names a NIfTI file or a folder,
        whose every series takes its label (and split). None: class folders.
      dedup: --dedup: of volumes whose files are byte for byte the same, the
        one with the smallest name is kept, the others rejected `duplicate`.
      held: With --append: what the dataset holds (`files` are not planned here);
        with --dedup a new volume whose content it holds is a `duplicate` too.
      masked: --masks_dir without a CSV (masks are the targets): classes by the
        structural rule (`_class_layout`): the first folder is a class only when
        every volume lies at ROOT/<class>/<volume> with two classes or more, else
        every volume has label -1, no class names, and its split is drawn by
        `split_key` (a patient's series together); a NIfTI file directly under
        --input_dir is a volume, not `no_label`.
      group_by: --group_by (dicom:KEYWORD or regex:PATTERN): a volume's split is its
        group's (`_group_of`), as an image's is, so every series of one patient lies in
        one split; a volume without a group is split as without it.

    Raises:
      ValueError: For --split together with a CSV split column, or --group_by dicom:KEYWORD
        when every volume is a NIfTI file (no DICOM header to read it from).
    """
    quarantined = dict(quarantined or {})
    group_kind, _, group_value = (group_by or "").partition(":")
    # dicom:KEYWORD is read from the headers planning reads anyway (`_headers`), never twice.
    keyword = group_value if group_kind == "dicom" else None
    rejects = [(p.rel_path, p.reason, p.message) for p in problems]
    # (class, series unit) -> its files; unit -> its split when the CSV gives one.
    by_unit: dict[tuple[str, str], list] = defaultdict(list)
    csv_splits: dict[str, str] = {}
    if labels_csv is not None:
        has_split = any(split for _, split in labels_csv.values())
        if has_split and split_ratios is not None:
            raise ValueError("--split assigns splits by hash, but the --labels_csv has a split column. "
                             "Use one or the other.")
        used = set()
        for f in files:
            entry = _csv_entry_of(f.rel_path, labels_csv)
            if entry is None:
                rejects.append((f.rel_path, "no_label", "not in --labels_csv (nor any folder above it)"))
                continue
            used.add(entry)
            label, split = labels_csv[entry]
            # A folder is one unit (split together); a NIfTI file its own.
            unit = f.rel_path if _is_nifti_name(f.rel_path) else entry
            by_unit[(label, unit)].append(f.rel_path)
            if split is not None:
                csv_splits[unit] = split
        if held is not None:  # A row of held series: listed, and held already.
            used.update(filter(None, (_csv_entry_of(rel, labels_csv) for rel in held.files)))
        for path in sorted(set(labels_csv) - used):
            rejects.append((path, "missing_file", "listed in --labels_csv but no file is there"))
        split_source = "csv" if has_split else "series"
    else:
        for f in files:
            unit = _unit_of(f.rel_path)
            if unit is None and masked and _is_nifti_name(f.rel_path):
                unit = (None, f.rel_path)  # Its own unit, without a class.
            if unit is None:
                rejects.append((f.rel_path, "no_label", "directly under --input_dir, outside any series folder"
                                if masked else "outside any class folder"))
            else:
                by_unit[unit].append(f.rel_path)
        split_source = "series"
    split_ratios = dict(split_ratios or {"train": 1.0})
    digests: dict[str, bytes] = {}  # With --dedup: rel_path -> the SHA-256 of its bytes.
    planned = []  # (class, unit, filename, stack or None, nifti or None)
    for (cls, unit), paths in sorted(by_unit.items(), key=lambda item: (item[0][0] or "", item[0][1])):
        planned += [(cls, unit, name, stack, nifti) for name, stack, nifti in
                    _plan_unit(unit, paths, input_dir, options, rejects, digests if dedup else None, quarantined,
                               keyword)]
    planned.sort(key=lambda p: os.fsencode(p[2]))
    classless = False
    if masked and labels_csv is None:
        # Decided on the planned volumes (a file no volume takes, a README, does not count), before --dedup
        # drops any: the same listing gives the same labels.
        if held is not None and held.class_names is not None:
            # --append: the dataset's rule, not the new volumes' alone (its labels cannot change).
            classless = not held.class_names
            if not classless:
                planned = _in_class_layout(planned, rejects)
        else:
            classless = not _class_layout(planned)
        if classless:
            planned = [(None, *rest) for _, *rest in planned]
    class_names = tuple(sorted_class_names({p[0] for p in planned} - {None} if masked and labels_csv is None
                                           else {label for label, _ in by_unit if label is not None}))
    contents: dict[str, str] = {}
    of_held: dict[str, str] = {}
    if dedup:
        # Before the labels are compared: a copied series is a duplicate, wherever it lies.
        planned, copies, contents, of_held = _drop_copies(planned, digests, {} if held is None else held.contents)
        rejects += copies
    uid_classes: dict[str, set[str]] = defaultdict(set)
    for cls, _, _, stack, _ in planned:
        if stack is not None:
            uid_classes[stack.series_uid].add(cls)
    groups, group_notes = ({}, {}) if group_by is None else _groups_of(planned, group_by, held is not None)
    jobs = []
    for cls, unit, name, stack, nifti in planned:
        members = _members(stack, nifti)
        if stack is not None and len(uid_classes[stack.series_uid]) > 1:
            rejects += [(rel, "mixed_labels", "the series lies under the classes "
                                              f"{sorted(uid_classes[stack.series_uid])}") for rel in members]
            continue
        # The split of the series unit's name (the folder), never of a slice; with --group_by, of its
        # group's value, as an image's ('group:' + value: an image and a volume of one group share a split).
        key = ("group:" + groups[name] if name in groups
               else split_key(unit, nifti) if classless else unit)
        split = csv_splits.get(unit) or hash_split(seed, key, split_ratios)
        if split is None:  # Its split's ratio is zero: said, not silently dropped.
            rejects += [(rel, "not_in_split", f"{name}: its split has a ratio of zero (--split)") for rel in members]
            continue
        jobs.append(VolumeJob(name, cls, split, stack, nifti, members, notes=group_notes.get(name, ()),
                              content=contents.get(name)))
    sizes = {f.rel_path: f.size for f in files}
    settled = _settled(jobs, rejects, class_names, split_source, output_dir, sizes)
    if group_by is not None:
        kept = {job.filename for job in settled.jobs.values()}
        settled = dataclasses.replace(settled, groups={name: g for name, g in groups.items() if name in kept})
    if of_held:  # The files rejected as copies of held volumes (not those a kept volume counts).
        rejected = {p.rel_path for p in settled.problems if p.reason == "duplicate"}
        settled = dataclasses.replace(settled, duplicates_of_held={
            rel: name for rel, name in sorted(of_held.items()) if rel in rejected})
    return settled


def _class_layout(planned: Sequence[tuple]) -> bool:
    """Whether the first folders are classes of volumes with masks (the log says which rule applies).

    They are when every planned volume lies exactly at ROOT/<class>/<volume>: a NIfTI file
    ROOT/<class>/<name>.nii(.gz), or a DICOM series whose every file lies directly in its series
    folder ROOT/<class>/<series>/<file>; and there are two classes or more. A series' files one
    folder deeper (a TCIA tree, ROOT/<patient>/<study>/<series>/<file>), slices directly in a
    top folder (ROOT/<case>/<file>) or a NIfTI file directly under ROOT say the first folder is no
    class, as images' class folders are only ROOT/<class>/<file> (docs/preparing/masks.md).
    """
    classes: set = set()
    off = None  # The first volume that is not at ROOT/<class>/<volume>, for the log.
    for cls, _, name, stack, nifti in planned:
        if not _at_class_volume(cls, stack, nifti):
            off = off or name
        classes.add(cls)
    if off is None and len(classes) >= 2:
        _LOG.info("Volume labels from the %d class folders (ROOT/<class>/<volume>; --masks_dir gives the masks)",
                  len(classes))
        return True
    why = (f"{off} is not at ROOT/<class>/<volume> (a NIfTI file, or a series folder holding its DICOM files)"
           if off is not None else f"{len(classes)} class folder{'s' if len(classes) != 1 else ''}, not two or more")
    _LOG.info("No volume labels (label -1, class_names []): %s; each volume's split is drawn by its top folder "
              "(a TCIA patient), a NIfTI file by itself. --labels_csv labels them.", why)
    return False


def _at_class_volume(cls, stack, nifti) -> bool:
    """Whether a planned volume lies exactly at ROOT/<class>/<volume> (`_class_layout`)."""
    depth = 2 if nifti is not None else 3
    paths = (nifti,) if nifti is not None else tuple(s.name for s in stack.slices)
    return cls is not None and all(path.count("/") == depth - 1 for path in paths)


def _in_class_layout(planned: Sequence[tuple], rejects: list) -> list[tuple]:
    """--append to a dataset with class folders and masks: the new volumes at ROOT/<class>/<volume>;
    the others rejected `no_label` (a full conversion of the grown folder would give no classes)."""
    kept = []
    for entry in planned:
        cls, _, name, stack, nifti = entry
        if _at_class_volume(cls, stack, nifti):
            kept.append(entry)
            continue
        rejects += [(rel, "no_label", f"{name}: not at ROOT/<class>/<volume>, where the dataset's volumes "
                                      "take their class folders") for rel in _members(stack, nifti)]
    return kept


def _groups_of(planned: Sequence[tuple], group_by: str, appending: bool) -> tuple[dict[str, str], dict]:
    """--group_by: each planned volume's group value (`_group_of`), and the notes of those its files disagree on.

    dicom:KEYWORD is read from each series' headers (read while planning: `DicomSlice.group_value`);
    regex:PATTERN is matched on each of its files' relative paths (a NIfTI file's: its own), as an
    image's. A NIfTI volume has no DICOM header: with dicom:KEYWORD it is its own group, as a
    non-DICOM image is; and when every volume is one, the flag would group nothing, which is refused.

    Args:
      planned: (class, unit, filename, stack, nifti) of each volume.
      group_by: --group_by.
      appending: With --append: a new batch of NIfTI files only is not refused (the
        dataset's --group_by is held), only told.

    Returns:
      (filename -> group value, for the volumes that have one; filename -> its notes).

    Raises:
      ValueError: With dicom:KEYWORD, when every planned volume is a NIfTI file.
    """
    kind, _, value = group_by.partition(":")
    pattern = re.compile(value) if kind == "regex" else None
    groups, notes = {}, {}
    niftis = 0
    for _, _, name, stack, nifti in planned:
        if pattern is None and nifti is not None:
            niftis += 1
            continue
        if pattern is not None:
            values = {rel: _matched(pattern, rel) for rel in _members(stack, nifti)}
        else:  # One value per file: the frames of an enhanced file share its header.
            values = {s.name: s.group_value or None for s in stack.slices}
        found, note = _group_of(values, group_by)
        if found is not None:
            groups[name] = found
        if note:
            notes[name] = (note,)
    if niftis and niftis == len(planned):
        message = (f"--group_by {group_by} reads each series' DICOM headers, and every volume here is a NIfTI "
                   f"file ({niftis}), which has none: group them by their paths with --group_by regex:PATTERN "
                   "(e.g. regex:^([^/]+)/ for the top folder, regex:(case_[0-9]+) for a case id in the name). "
                   f"Received: --volumes --group_by {group_by} with {niftis} NIfTI files and no DICOM series")
        if not appending:
            raise ValueError(message)
        _LOG.warning("%s; each is its own group (split by itself)", message)
    elif niftis:
        _LOG.info("%d NIfTI volumes have no DICOM header to read %s from: each is its own group (--group_by)",
                  niftis, value)
    _LOG.info("Grouped %s of %s volumes (--group_by %s); the others are split by their own series folder "
              "or NIfTI file", f"{len(groups):,}", f"{len(planned):,}", group_by)
    return groups, notes


def _matched(pattern: re.Pattern, rel_path: str) -> str | None:
    """A path's group by --group_by regex:PATTERN: its first group, else the match, as an image's."""
    m = pattern.search(rel_path)
    if m is None:
        return None
    return m.group(1) if m.groups() else m.group(0)


def _group_of(values: Mapping[str, str | None], group_by: str) -> tuple[str | None, str | None]:
    """A volume's group from its files' values: (value, note or None).

    The value most of its files give (ties: the smallest, so the same files give the same
    group); None when none gives one (the volume is then its own group, as an image without
    one is). The note, when some files give another value or none, says how many of each,
    never the values (a PatientID is an identifier: it is stored hashed only).

    Args:
      values: Each of the volume's files -> its value (None: absent or empty, no match).
      group_by: --group_by, for the note.
    """
    counts = Counter(v for v in values.values() if v)
    if not counts:
        return None, None
    value = min(counts, key=lambda v: (-counts[v], v))
    agree, given = counts[value], sum(counts.values())
    if agree == len(values):
        return value, None
    parts = [f"grouped by the value {agree} of its {len(values)} files give"]
    if given > agree:
        parts.append(f"{given - agree} give another")
    if given < len(values):
        parts.append(f"{len(values) - given} none")
    return value, f"--group_by {group_by}: " + "; ".join(parts)


def split_key(unit: str, nifti: str | None) -> str:
    """What a volume without a class (--masks_dir, no class folders) has its split drawn by.

    Its top folder under --input_dir when it is a DICOM series: TCIA's patient
    (ROOT/<patient>/<study>/<series>/...), whose every study and series then share one split
    (no patient in two splits); a case folder (ROOT/<case>/<files>) is its own series folder. A
    NIfTI file by itself (its own series unit, as the Decathlon's and nnU-Net's one case per file).
    """
    return unit if nifti is not None else unit.split("/")[0]


def _plan_unit(unit: str, paths: Sequence[str], input_dir: str, options: volumes.VolumeOptions, rejects: list,
               digests: dict | None, quarantined: Mapping, keyword: str | None = None) -> list[tuple]:
    """(filename, stack or None, nifti or None) of each volume of a series unit, from its files' headers.

    With `digests` (--dedup), each file is read whole and the SHA-256 of its bytes kept there.
    With `keyword` (--group_by dicom:KEYWORD), each slice keeps its value (`DicomSlice.group_value`).
    """
    slices, out = [], []
    for rel in sorted(paths):
        if rel in quarantined:
            rejects.append((rel, *quarantined[rel]))
            continue
        path = _files.join(input_dir, rel)
        if _is_nifti_name(rel):
            if digests is not None:
                digests[rel] = _digest(path, rel, rejects)
            out.append((rel, None, rel))
            continue
        slices += _headers(path, rel, rejects, digests, keyword)
    if slices:
        plan = volumes.plan_stacks(slices, min_slices=options.min_slices,
                                   pixel_hash=functools.partial(_pixel_hash, input_dir))
        rejects += list(plan.rejects)
        out += [(name, stack, None) for stack, name in zip(plan.stacks, stack_names(unit, plan.stacks))]
    return out


def content_digests(units: Mapping[str, Sequence[str]], input_dir: str,
                    options: volumes.VolumeOptions) -> dict[str, str]:
    """Record filename -> content digest (hex) of each volume of series units, read whole (--dedup).

    For an append's held series whose version did not record them (`conversion.append_run`):
    each unit is planned as `plan_volumes` planned it (its stacks, their names), so a
    digest is the one its volume had when written.

    Args:
      units: Series unit -> the relative paths of its files.
      input_dir: --input_dir.
      options: --min_slices.
    """
    digests: dict[str, bytes] = {}
    out = {}
    for unit, paths in sorted(units.items()):
        for name, stack, nifti in _plan_unit(unit, paths, input_dir, options, [], digests, {}):
            out[name] = _content_key(stack, nifti, digests).hex()
    return out


def stack_names(unit: str, stacks: Sequence[volumes.Stack]) -> list[str]:
    """Each stack's `filename`: its folder (`unit`), alone when the folder gives one stack.

    Else `#series=N`, N the series' SeriesNumber, when the folder holds several series, and
    `#stack=k` (k its place among its series' stacks) when the series gives several stacks (two
    orientations or sizes). A series without a SeriesNumber, or sharing one with another series of
    the folder, is `#stack=k`, k the stack's place among the folder's stacks.
    """
    if len(stacks) == 1:
        return [unit]
    uids_of_number: dict[str, set[str]] = defaultdict(set)
    for stack in stacks:
        uids_of_number[stack.slices[0].series_number].add(stack.series_uid)
    several_series = len({stack.series_uid for stack in stacks}) > 1
    stacks_of_series = Counter(stack.series_uid for stack in stacks)
    seen: Counter = Counter()
    names = []
    for stack in stacks:
        number = stack.slices[0].series_number
        if number and len(uids_of_number[number]) == 1:
            name = f"{unit}#series={number}" if several_series else unit
            if stacks_of_series[stack.series_uid] > 1:
                name += f"#stack={seen[stack.series_uid]}"
            seen[stack.series_uid] += 1
        else:
            name = f"{unit}#stack={stack.index}"
        names.append(name)
    return names


def _members(stack, nifti) -> tuple[str, ...]:
    """The input files of a volume, each once, in its order."""
    if nifti is not None:
        return (nifti,)
    return tuple(dict.fromkeys(s.name for s in stack.slices))


def _settled(jobs: list[VolumeJob], rejects: list, class_names, split_source, output_dir,
             sizes: Mapping[str, int]) -> VolumesPlan:
    """The plan with every input file counted once: in one volume, else in the rejects.

    A multi-frame file can give frames to two stacks, and a file can be
    rejected for one frame yet give another to a volume: it is counted by
    its first volume (by filename), and the others note it.
    """
    counted: dict[str, str] = {}
    settled = []
    for job in jobs:
        mine = tuple(rel for rel in job.sources if rel not in counted)
        notes = [f"{rel}: counted in {counted[rel]}" for rel in job.sources if rel in counted]
        counted.update((rel, job.filename) for rel in mine)
        # Its stack's notes, then its own (--group_by's), then the files other volumes count.
        settled.append(dataclasses.replace(job, sources=mine, notes=(*job.stack.notes, *job.notes, *notes)
                                           if job.stack is not None else (*job.notes, *notes)))
    jobs = settled
    by_name = {job.filename: i for i, job in enumerate(jobs)}
    problems = []
    for rel, reason, message in sorted(set(map(tuple, rejects))):
        if rel in counted:  # Rejected for one frame, in a volume by another: a note of that volume.
            i = by_name[counted[rel]]
            jobs[i] = dataclasses.replace(jobs[i], notes=(*jobs[i].notes, f"{rel}: {reason}: {message}"))
        elif not any(p.rel_path == rel for p in problems[-1:]):  # One reject per file (the first reason).
            problems.append(Problem(rel, reason, message))
    # Shards are sized by each volume's decoded bytes: a NIfTI file's own size (x4 when gzipped), about.
    files = tuple(InputFile(job.filename, volume_plan_path(output_dir, job.filename),
                            job.nbytes if job.nifti is None
                            else sizes.get(job.nifti, 0) * (4 if job.nifti.lower().endswith(".gz") else 1))
                  for job in jobs)
    _LOG.info("Planned %s volumes from %s files", f"{len(jobs):,}", f"{len(counted) + len(problems):,}")
    return VolumesPlan(files, tuple(problems), {job.filename: job for job in jobs}, class_names, split_source)


def _headers(path: str, rel: str, rejects: list, digests: dict | None, keyword: str | None = None) -> list:
    """The slices of one DICOM file, from its header (its whole bytes with --dedup); rejects it on failure.

    `keyword`: --group_by's DICOM keyword, read from the same parse (`DicomSlice.group_value`).
    """
    # Noted in the journal: a header that crashes the driver is known to the command above it.
    with guard.working_on([(rel, path)]):
        try:
            if digests is not None:  # The whole file: its digest.
                data = _files.read_bytes(path)
                digests[rel] = hashlib.sha256(data).digest()
                return volumes.read_slices(data, rel, keyword)
            with _files.open_to_read(path) as f:  # Its header: the pixels are read once, by the writer.
                return volumes.read_slice_headers(f, rel, keyword)
        except ImageRejected as e:
            rejects.append((rel, e.reason, e.message))
        except OSError as e:
            rejects.append((rel, "unreadable", f"{rel}: {e}"))
        except Exception as e:  # noqa: BLE001 - this file alone: rejected, reported
            _LOG.debug("Unexpected error reading the header of %s", rel, exc_info=e)
            rejects.append((rel, guard.INTERNAL_ERROR, guard.internal_error_message(rel, e)))
    return []


def _pixel_hash(input_dir: str, s: volumes.DicomSlice) -> str:
    """The pixel digest of a slice planned from its header, read when another slice shares its position."""
    path = _files.join(input_dir, s.name)
    with guard.working_on([(s.name, path)]):
        return volumes.read_slices(_files.read_bytes(path), s.name)[s.frame].pixel_hash


def _digest(path: str, rel: str, rejects: list) -> bytes:
    """The SHA-256 of a file's bytes (--dedup); a file that cannot be read gets a key of its own."""
    try:
        with _files.open_to_read(path) as f:
            return hashlib.file_digest(f, "sha256").digest()
    except OSError:
        return b"unreadable:" + os.fsencode(rel)  # The converter reads it again and says why.


def _content_key(stack, nifti, digests: Mapping[str, bytes]) -> bytes:
    """A volume's content digest: its files' bytes in its own order (a series' slices sorted along the normal)."""
    h = hashlib.sha256()
    if nifti is not None:
        h.update(digests[nifti])
    else:
        for s in stack.slices:  # In the volume's order, each frame by its file's bytes.
            h.update(digests[s.name] + s.frame.to_bytes(4, "little"))
    return h.digest()


def _drop_copies(planned: list[tuple], digests: Mapping[str, bytes], held: Mapping[str, tuple[str, int]]):
    """--dedup: of volumes made of the same bytes, the one with the smallest name is kept.

    A volume's content is its files' bytes in its own order (`_content_key`),
    so a copied series folder, under any name or class, is a copy; one slice
    differing makes another series. With --append, a copy of a volume the
    dataset holds (`held`) is rejected too, naming it and its version.

    Args:
      planned: (class, unit, filename, stack, nifti) sorted by filename.
      digests: rel_path -> the SHA-256 of the file's bytes.
      held: Content digest (hex) -> (filename, version) of the held volumes.

    Returns:
      (the kept items, the copies' rejects, filename -> content digest (hex) of
      the kept, each copy of a held volume's files -> that volume's filename).
    """
    kept: dict[str, str] = {}
    out, copies, contents, of_held = [], [], {}, {}
    for item in planned:  # Sorted by filename: the first of each content is kept.
        _, _, name, stack, nifti = item
        key = _content_key(stack, nifti, digests).hex()
        members = _members(stack, nifti)
        if key in held:
            held_name, version = held[key]
            copies += [(rel, "duplicate", f"{name}: same content as {held_name}, held by version {version}")
                       for rel in members]
            of_held.update(dict.fromkeys(members, held_name))
        elif key in kept:
            copies += [(rel, "duplicate", f"{name}: same content as {kept[key]}") for rel in members]
        else:
            kept[key] = name
            contents[name] = key
            out.append(item)
    return out, copies, contents, of_held


def write_volume_plans(jobs: Mapping[str, VolumeJob], input_dir: str, output_dir: str) -> None:
    """Writes each volume's plan (and --input_dir, which its files are under) where its planned file's path says."""
    folder = _files.join(output_dir, _files.TMP_DIRNAME, _PLANS_DIRNAME)
    for filename, job in jobs.items():
        name = volume_plan_path(output_dir, filename).rsplit("/", 1)[-1]
        _files.write_atomically(folder, name, json.dumps({**job.to_json(), "input_dir": input_dir},
                                                         ensure_ascii=True).encode())


def write_volumes(job):
    """Writes one shard of volume records (`conversion.shard_writer.write_shard` with --volumes).

    Each volume is decoded, encoded, framed and written in turn, then let
    go: a writer holds one volume at a time, once (`_framed`). Each is noted in the process's journal by its
    name meanwhile (`guard`): if its decoder kills the process or runs past
    --file_timeout, the shard's maker quarantines that volume and writes the
    shard again without it, and each of its files is rejected with the reason.

    Args:
      job: The `conversion.shard_writer.ShardJob`: its files are planned
        volumes (path: the volume's plan file, `write_volume_plans`).

    Returns:
      The `conversion.shard_writer.ShardOutcome`.
    """
    writer = _files.AtomicWriter(job.output_dir, job.name)
    quarantined = {rel: (reason, message) for rel, reason, message in job.quarantined}
    index_entries: list[tuple[int, int]] = []
    classes = CLASS.counter(job.num_classes)
    masked = _MASK in job.targets
    pixels = _PixelCounter() if masked else None
    rejects: list[Reject] = []
    normalized: list[tuple] = []
    sources = 0
    try:
        for f in job.files:
            data = json.loads(_files.read_bytes(f.path))
            plan, input_dir = VolumeJob.from_json(data), data["input_dir"]
            if f.rel_path in quarantined:
                rejects += [Reject(rel, *quarantined[f.rel_path]) for rel in plan.sources]
                continue
            with guard.working_on([(f.rel_path, f.path)]):
                try:
                    mask = (*_mask_of(f.targets), _mask_table(f.targets)) if masked else None
                    framed, notes, counts = _framed(plan, f.label, input_dir, mask)
                except ImageRejected as e:
                    # Each file of a series names its series; a NIfTI file's message names it already.
                    message = e.message if e.message.startswith(f.rel_path) else f"{f.rel_path}: {e.message}"
                    rejects += [Reject(rel, e.reason, message) for rel in plan.sources]
                    continue
                except OSError as e:
                    rejects += [Reject(rel, "unreadable", f"{f.rel_path}: {e}") for rel in plan.sources]
                    continue
                except Exception as e:  # noqa: BLE001 - this volume alone: its files rejected, reported
                    _LOG.debug("Unexpected error on %s", f.rel_path, exc_info=e)
                    message = guard.internal_error_message(f.rel_path, e)
                    rejects += [Reject(rel, guard.INTERNAL_ERROR, message) for rel in plan.sources]
                    continue
            if notes:
                actions = ("volume_notes",) + (("mask_reoriented",) if any(n.startswith("mask_reoriented")
                                                                            for n in notes) else ())
                normalized.append((f.rel_path, "nifti" if plan.nifti else "dicom_series", actions,
                                   {"notes": list(notes)}))
            if counts is not None:
                pixels.add(counts)
            offset = writer.num_bytes
            for part in framed:
                writer.write(part)
            index_entries.append((offset, writer.num_bytes - offset))
            framed = None  # The volume goes before the next is decoded.
            sources += len(plan.sources)
            classes.add(f.label)
    except BaseException:
        writer.abort()
        raise
    writer.commit()
    index_name, index_sha256 = _files.write_shard_index(job.output_dir, job.name, index_entries)
    result = ShardResult(job.split, job.index, job.num_shards, job.name, len(index_entries), writer.num_bytes,
                         writer.sha256, classes.to_json(), index_name, index_sha256, sources,
                         mask_pixels=pixels.to_json() if masked else None)
    return ShardOutcome(result, rejects, normalized)


def _framed(plan: VolumeJob, label: int, input_dir: str, mask: tuple | None = None):
    """One volume decoded and encoded as its framed record's parts, its notes, and its mask's voxels per id.

    The voxels are decoded into one preallocated array (`imaging.volumes`);
    the record's parts hold them as a view of that array, and the framing
    (`schemas.tfrecord.frame_parts`) and the writer (`AtomicWriter.write`)
    copy no part: the volume is held once, plus one slice while decoding.
    With `mask` ((path, dataset dtype, class table or None), --masks_dir), its
    label volume is read onto the volume's grid (`imaging.volume_masks`:
    reoriented when only its voxel order differs, else rejected; a DICOM SEG or
    RTSTRUCT on the grid of the series stack, its references checked, its labels
    mapped to the dataset's class table) and stored beside it.

    Returns:
      (framed parts, notes, voxels per class id (None without a mask)).
    """
    read = lambda rel: _files.read_bytes(_files.join(input_dir, rel))
    if plan.nifti is not None:
        volume = volumes.read_nifti(read(plan.nifti), plan.nifti)
    else:
        volume = volumes.read_stack(plan.stack, read)
    notes = tuple(dict.fromkeys((*plan.notes, *volume.notes)))
    ids = counts = None
    if mask is not None:
        ids, mask_notes = _mask_ids(volume, *mask, stack=plan.stack)
        notes = (*notes, *mask_notes)
        counts = np.bincount(ids.ravel())
    schema = VOLUME_SCHEMA if mask is None else VOLUME_MASK_SCHEMA
    parts = schema.encode_parts(VolumeRecord(volume.voxels, volume.spacing, volume.affine, label,
                                             plan.filename, volume.modality, ids))
    return tfrecord.frame_parts(parts), notes, counts


def _mask_ids(volume: volumes.Volume, path: str, dtype: str, table=None, *, stack=None):
    """(ids, notes): the class ids of a volume's mask file on its grid, in the dataset's mask dtype.

    Args:
      table: The dataset's class table (names by id) of DICOM masks, whose local labels
        (segment numbers, ROI positions) are mapped to it; None: ids stored as read.
      stack: The DICOM series stack the volume was read from: its grid's slices' UIDs,
        series and frame of reference, which a SEG's or RTSTRUCT's references must match.

    Raises:
      ImageRejected: 'mask_unreadable', 'mask_geometry_mismatch', 'mask_not_class_ids'
        (`imaging.volume_masks`; ids above 255 where the headers said uint8), and a DICOM
        mask's 'mask_reference_mismatch', 'unsupported_mask', 'corrupt'.
    """
    from imaging import volume_masks

    try:
        data = _files.read_bytes(path)
    except OSError as e:
        raise ImageRejected("mask_unreadable", f"mask {path}: {e}") from e
    grid = volume_masks.VolumeGrid.of(volume, stack)
    read = volume_masks.read_mask_volume(data, path, grid)
    ids = read.ids
    if read.class_names:  # A DICOM SEG or RTSTRUCT: its labels by name, as ids of the dataset's table.
        if table is None:
            raise ImageRejected("mask_unreadable", f"mask {path} is a DICOM SEG or RTSTRUCT that planning did not "
                                "pair by reference (the file changed since?)")
        from conversion import dicom_masks

        ids = dicom_masks.remap(ids, read.class_names, table, dtype, path)
    if ids.dtype.itemsize > np.dtype(dtype).itemsize and ids.size and int(ids.max()) > np.iinfo(dtype).max:
        raise ImageRejected("mask_not_class_ids", f"mask {path} holds ids up to {int(ids.max())}, more than the "
                            f"dataset's {dtype} masks hold (decided from the masks' headers)")
    return np.ascontiguousarray(ids.astype(dtype, copy=False)), read.notes


def warm_up() -> None:
    """Prepares a worker process for volume shards: pydicom and its pixel handlers."""
    from imaging import dicom  # noqa: F401 (imported once, before the first volume)


def manifest_section(jobs: Mapping[str, VolumeJob], plan, options: volumes.VolumeOptions) -> dict:
    """The manifest's `volumes` section: per planned volume, its files and the notes of its planning.

    Args:
      jobs: The planned volumes.
      plan: The `conversion.plan.Plan` (which volumes were planned).
      options: --min_slices.
    """
    planned = sorted(({f.rel_path for f in plan.files} if plan.files else set(jobs)) & set(jobs), key=os.fsencode)
    kinds = defaultdict(int)
    for name in planned:
        kinds["nifti" if jobs[name].nifti else "dicom"] += 1
    return {"volumes": {
        "options": options.to_json(),
        "planned": dict(sorted(kinds.items())),
        "files": sum(len(jobs[name].sources) for name in planned),
        "notes": {name: list(jobs[name].notes) for name in planned if jobs[name].notes},
    }}


def counted_section(section: dict, shards, counts: Mapping[str, int]) -> dict:
    """The `volumes` section with what the run wrote: per split, its volumes and their files; and
    the reconciliation, in files (inputs = in volumes + rejected + skipped, as the summary prints)
    and in volumes (planned = written + rejected while decoding).

    Args:
      section: `manifest_section`'s `volumes` value (known before the run).
      shards: The run's `conversion.elements.ShardResult`s.
      counts: The manifest's counts (found, written, rejected, skipped), in files.
    """
    splits: dict[str, dict[str, int]] = {}
    for shard in shards:
        split = splits.setdefault(shard.split, {"volumes": 0, "files": 0})
        split["volumes"] += shard.num_records
        split["files"] += shard.num_sources
    planned = sum(section.get("planned", {}).values())
    written = sum(s["volumes"] for s in splits.values())
    return {**section, "splits": dict(sorted(splits.items())), "reconciliation": {
        "files": {"inputs": counts["found"], "in_volumes": counts["written"], "rejected": counts["rejected"],
                  "skipped": counts["skipped"]},
        "volumes": {"planned": planned, "written": written, "rejected_while_decoding": planned - written},
    }}


def merge_sections(old: Mapping, new: Mapping) -> dict:
    """The `volumes` section of a dataset that grew (`convert --append`): every version's volumes.

    Planned volumes, files, notes and each split's volumes and files add up; the
    options and the reconciliation are the latest run's (as the manifest's counts are).
    """
    planned = Counter(old.get("planned", {}))
    planned.update(new.get("planned", {}))
    splits: dict[str, dict[str, int]] = {}
    for section in (old, new):
        for split, entry in section.get("splits", {}).items():
            mine = splits.setdefault(split, {"volumes": 0, "files": 0})
            mine["volumes"] += entry["volumes"]
            mine["files"] += entry["files"]
    merged = {**old, **new, "planned": dict(sorted(planned.items())),
              "files": old.get("files", 0) + new.get("files", 0),
              "notes": dict(sorted({**old.get("notes", {}), **new.get("notes", {})}.items(),
                                   key=lambda item: os.fsencode(item[0])))}
    if splits:
        merged["splits"] = dict(sorted(splits.items()))
    return merged


def write_manifest(manifest, rejects: Sequence[Reject], output_dir: str) -> dict:
    """Writes VOLUMES_MANIFEST, after manifest.json: what `shardsmith inspect/verify/preview` of volumes read.

    Args:
      manifest: The `schemas.Manifest` just written.
      rejects: Every `conversion.elements.Reject` of the run.
    """
    out = {
        "example_kind": VOLUME_SCHEMA.kind,
        # The records' features: with --masks_dir, `volume/mask` among them.
        "features": dict(manifest.features) or VOLUME_SCHEMA.to_json(),
        "class_names": list(manifest.class_names),
        "splits": {name: {"records": info.num_records, "shards": len(info.shards)}
                   for name, info in sorted(manifest.splits.items())},
        "rejects": [{"path": r.rel_path, "reason": r.reason, "message": r.message}
                    for r in sorted(rejects, key=lambda r: (os.fsencode(r.rel_path), r.reason))],
    }
    if manifest.versions:
        # A dataset that grew (`convert --append`): what each version added (its shards, in
        # manifest.json's order); the rejects are the latest run's, as rejects.jsonl's.
        out["versions"] = [{"version": v.version, "time": v.time, "num_classes": v.num_classes,
                            "splits": {split: {"records": v.num_records.get(split, 0), "shards": list(files)}
                                       for split, files in sorted(v.shards.items())}}
                           for v in manifest.versions]
    _files.write_atomically(output_dir, VOLUMES_MANIFEST, json.dumps(out, indent=1, sort_keys=True).encode())
    return out


def read_manifest(output_dir: str) -> dict:
    """The VOLUMES_MANIFEST of a converted folder."""
    return json.loads(_files.read_bytes(_files.join(output_dir, VOLUMES_MANIFEST)))
