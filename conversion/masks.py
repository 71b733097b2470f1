"""Segmentation masks in a conversion (--masks_dir, --mask_suffix): pairing, planning, storing.

The mask of `INPUT/a/b.jpg` is `MASKS/a/b.<png|tif|tiff|bmp|gif>`; with
`--mask_suffix _leftImg8bit:_gtFine_labelIds` the image's stem loses its
suffix and the mask's gains its own (Cityscapes). Beam-free, in three parts:

- planning (the driver, `plan_masks`): lists --masks_dir, pairs each image
  with its mask (an image without one is rejected `missing_mask`; a stem
  with masks of several extensions `mask_unreadable`), decides the image
  labels (class folders only where the layout is exactly class folders;
  -1 otherwise) and the one mask dtype of the dataset from the masks'
  headers, before any shard is written;
- writing (a shard writer, `pair`): reads a file's mask, aligns it with each
  of the file's stored images (`imaging.masks`), encodes it as a PNG;
- counting (`PixelCounter`): pixels per class id of a shard's masks.

With --volumes, a volume's mask is a NIfTI label volume paired by name, or a
DICOM SEG/RTSTRUCT paired with the series it references (`_plan_volume_masks`,
`conversion.dicom_masks`). The mask kind's row of the target table
(`conversion.targets.masks`) plans with these and completes the manifest's
`targets.mask` section.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

import schemas
from conversion import listing as _listing
from conversion.files import is_local, join as _join, open_to_read, read_bytes
from imaging.errors import ImageRejected
from schemas.manifest import SPLIT_ALIASES
from schemas.volumes import unit_of_volume

__all__ = ["TARGET_KIND", "drop_masks_dir", "MaskOptions", "MaskPlan", "MaskedImage", "plan_masks", "pair",
           "pair_patches", "unpack", "PixelCounter", "masked_image"]

_LOG = logging.getLogger("shardsmith.convert")
# A mask's header (PNG IHDR, a TIFF's first IFD) lies within these first bytes.
_HEAD_BYTES = 65536
# Reading headers waits on storage, not the CPU.
_HEADER_THREADS = 8
# The target kind of masks: the key of `schemas.TARGET_KINDS` (and of the
# manifest's targets section) whose feature is `schemas.MASK`.
TARGET_KIND = next(kind for kind, specs in schemas.TARGET_KINDS.items() if specs == (schemas.MASK,))
# Masks looked for besides `imaging.masks.MASK_EXTENSIONS`, only to be rejected
# as 'mask_lossy' (a JPEG's class ids are not exact) rather than 'missing_mask'.
_LOSSY_EXTENSIONS = (".jpg", ".jpeg")


def _masks():
    """`imaging.masks`, imported once masks are read (--masks_dir): a photo run never loads it."""
    from imaging import masks

    return masks


@dataclasses.dataclass(frozen=True)
class MaskOptions:
    """Where the images' segmentation masks are.

    Attributes:
      masks_dir: Folder of masks, mirroring the input folder (--masks_dir);
        None: no masks.
      mask_suffix: 'IMAGE_SUFFIX:MASK_SUFFIX' (--mask_suffix): the image's
        stem ends with IMAGE_SUFFIX, replaced by MASK_SUFFIX for its mask
        (either may be empty, not both); None: the same stem.

    Raises:
      ValueError: Naming the flag, what it allows and what it received.
    """

    masks_dir: str | None = None
    mask_suffix: str | None = None

    def __post_init__(self):
        if self.masks_dir is not None and not str(self.masks_dir).strip():
            raise ValueError(f"--masks_dir must be a folder of masks. Received: {self.masks_dir!r}")
        if self.mask_suffix is None:
            return
        if self.masks_dir is None:
            raise ValueError(
                "--mask_suffix maps image names to mask names under --masks_dir: give --masks_dir "
                f"with it. Received: --mask_suffix {self.mask_suffix!r} alone")
        parts = self.mask_suffix.split(":")
        if len(parts) != 2 or parts == ["", ""] or any("/" in p or "\\" in p for p in parts):
            raise ValueError(
                "--mask_suffix must be IMAGE_SUFFIX:MASK_SUFFIX (one colon, no slashes, not both "
                "empty), e.g. _leftImg8bit:_gtFine_labelIds. "
                f"Received: {self.mask_suffix!r}")

    @property
    def active(self) -> bool:
        return self.masks_dir is not None

    @property
    def suffixes(self) -> tuple[str, str] | None:
        """(image suffix, mask suffix), or None."""
        if self.mask_suffix is None:
            return None
        image, mask = self.mask_suffix.split(":")
        return image, mask

    def mask_stem(self, rel_path: str, volumes: bool = False) -> str | None:
        """The mask's path without extension for an image's relative path; None if its name does not fit.

        With `volumes`, `rel_path` is a planned volume's name: a NIfTI file's stem loses
        `.nii`/`.nii.gz`, a DICOM series folder is its own stem (`_volume_stem`).
        """
        stem = _volume_stem(rel_path) if volumes else _stem(rel_path)
        suffixes = self.suffixes
        if suffixes is None:
            return stem
        image, mask = suffixes
        if image and not stem.endswith(image):
            return None
        return stem[:len(stem) - len(image)] + mask


def _stem(rel_path: str) -> str:
    """The path without its extension ('a/b.c.png' -> 'a/b.c')."""
    folder, _, name = rel_path.rpartition("/")
    base, dot, _ = name.rpartition(".")
    name = base if dot and base else name
    return f"{folder}/{name}" if folder else name


def _volume_stem(rel_path: str) -> str:
    """A volume's or a mask volume's path without extension: 'a/b.nii.gz' -> 'a/b'; a series folder
    ('a/1.2.840.5', its `#series=N`/`#stack=k` marks dropped) is itself: its dots are no extension."""
    rel_path = unit_of_volume(rel_path)
    lower = rel_path.lower()
    for ext in _volume_masks().VOLUME_MASK_EXTENSIONS:
        if lower.endswith(ext):
            return rel_path[:len(rel_path) - len(ext)]
    return rel_path


def _volume_masks():
    """`imaging.volume_masks`, imported once volume masks are paired (--volumes --masks_dir)."""
    from imaging import volume_masks

    return volume_masks


@dataclasses.dataclass(frozen=True)
class _Family:
    """How the masks of one kind of example are named and sized: images' PNG/TIFF masks, or volumes' NIfTI masks."""

    extensions: tuple[str, ...]
    lossy: tuple[str, ...]
    stem: Any
    bits: Any  # First bytes -> bits per id (None: unknown).
    volumes: bool

    def extension_of(self, rel_path: str) -> str:
        lower = rel_path.lower()
        return next((ext for ext in self.extensions + self.lossy if lower.endswith(ext)), "")


def _family(volumes: bool) -> _Family:
    if volumes:
        vm = _volume_masks()
        return _Family(vm.VOLUME_MASK_EXTENSIONS, (), _volume_stem, vm.mask_bits, True)
    m = _masks()
    return _Family(m.MASK_EXTENSIONS, _LOSSY_EXTENSIONS, _stem, m.mask_bit_depth, False)


@dataclasses.dataclass(frozen=True)
class MaskPlan:
    """What planning decided about masks.

    Attributes:
      files: The input files that have exactly one mask (to be planned).
      problems: The listing's problems plus the images without a usable mask.
      mask_of: Relative path of each image in `files` to its mask's path.
      dtype: 'uint8' or 'uint16': the dtype of every stored mask.
      unmatched: Mask files no image pairs with.
      labels_from: For `conversion.plan.make_plan` (`folder_labels`): the
        labels and splits of the files, or None (a labels CSV gives them).
      section: The manifest's targets.mask section known before the run.
    """

    files: tuple
    problems: tuple
    mask_of: Mapping[str, str]
    dtype: str
    unmatched: int
    labels_from: Any
    section: Mapping[str, Any]


def plan_masks(files: Sequence, problems: Sequence, options: MaskOptions, *, input_dir: str,
               split_ratios, labels_csv: bool, class_names, volumes: bool = False,
               plans: Mapping | None = None) -> MaskPlan:
    """Pairs the listed images with their masks; decides labels and the mask dtype.

    With `volumes` (--volumes), `files` are planned volumes (labelled by their
    kind already): each NIfTI file's or series folder's mask is a `.nii.gz` or
    `.nii` file (`imaging.volume_masks.VOLUME_MASK_EXTENSIONS`), its dtype from
    the NIfTI header's datatype.

    Args:
      files, problems: The input listing (`conversion.listing.list_input`).
      options: The `MaskOptions` (active).
      input_dir: --input_dir (mask files inside it are not inputs).
      split_ratios: --split, or None.
      labels_csv: Whether a --labels_csv gives the labels.
      class_names: --class_names, or None.
      volumes: Whether the examples are volumes (see above).
      plans: With `volumes`, volume name -> its `conversion.volumes.VolumeJob`: a DICOM
        series volume's mask may be a SEG or RTSTRUCT referencing its series (`_plan_volume_masks`).

    Raises:
      FileNotFoundError: For a --masks_dir that does not exist.
      ValueError: For split folders mixed with other folders, --split with
        split folders, or --class_names without class folders.
    """
    if volumes:
        return _plan_volume_masks(files, problems, options, input_dir, plans or {})
    family = _family(volumes)
    mask_files = _list_masks(options.masks_dir)
    files, problems, is_mask = _drop_masks_dir(files, problems, input_dir, options, family)
    if is_mask is not None:  # Masks beside their images: only the masks are looked up.
        mask_files = [m for m in mask_files if is_mask(m.rel_path)]
    by_stem = collections.defaultdict(list)
    for m in mask_files:
        if family.extension_of(m.rel_path):
            by_stem[family.stem(m.rel_path)].append(m)
    kept, problems, mask_of, used = [], list(problems), {}, set()
    for f in files:
        stem = options.mask_stem(f.rel_path, volumes)
        found = by_stem.get(stem, []) if stem is not None else []
        if stem is not None:
            used.add(stem)
        lossless = [m for m in found if family.extension_of(m.rel_path) in family.extensions]
        if len(lossless) == 1 or (found and not lossless):
            # A JPEG mask alone is paired, then rejected 'mask_lossy' by the shard writer.
            kept.append(f)
            mask_of[f.rel_path] = (lossless or found)[0]
        elif not found:
            problems.append(_listing.Problem(f.rel_path, "missing_mask",
                                             _missing_message(f, stem, options, family.extensions)))
        else:
            names = " and ".join(_listing.display_path(m.rel_path) for m in lossless)
            problems.append(_listing.Problem(
                f.rel_path, "mask_unreadable",
                f"several masks under --masks_dir {options.masks_dir!r} fit it: {names}; which one is "
                "meant is ambiguous (keep one)"))
    unmatched = sum(len(ms) for stem, ms in by_stem.items() if stem not in used)
    if unmatched:
        _LOG.info("%s mask files under --masks_dir %s have no image (not inputs)", f"{unmatched:,}",
                  options.masks_dir)
    labels_from = None
    if not labels_csv and not volumes:  # Volumes are labelled by their kind (class folders).
        kept, outside, labels_from = _labels(kept, split_ratios, class_names)
        problems += outside
    dtype = _dataset_dtype([mask_of[f.rel_path] for f in kept], family.bits)
    section = {
        "dtype": dtype,
        "masks_dir": options.masks_dir,
        "mask_suffix": options.mask_suffix,
        "unmatched_masks": unmatched,
    }
    names = _decathlon_class_names(options.masks_dir) if volumes else None
    if names:
        section["class_names"] = names
    return MaskPlan(tuple(kept), tuple(problems), {p: m.path for p, m in mask_of.items()}, dtype,
                    unmatched, labels_from, section)


def _strays_beside(volume: str, series_uid: str, failed, unmatched) -> str:
    """What a volume's missing_mask message adds about the SEG/RTSTRUCTs in its top folder (a TCIA
    patient) that no volume took: unreadable ones, and what the others reference (the likely
    reason it has none); '' when there are none."""
    top = volume.split("/", 1)[0] + "/" if "/" in volume else None
    if top is None:
        return ""
    said = [f"{rel} is unreadable ({why})" for rel, why in failed if rel.startswith(top)]
    for m in unmatched:
        if m.rel_path.startswith(top):
            what = f"series {', '.join(m.series_uids)}" if m.series_uids else "no series"
            said.append(f"{m.rel_path} names this series but none of its slices" if series_uid in m.series_uids
                        else f"{m.rel_path} references {what}")
    return f"; beside it, {'; '.join(said[:3])}" if said else ""


def _plan_volume_masks(files, problems, options: MaskOptions, input_dir: str, plans: Mapping) -> MaskPlan:
    """`plan_masks` of volumes: NIfTI label volumes paired by name, DICOM SEG/RTSTRUCT by reference.

    A NIfTI mask is `<stem>.nii.gz`/`.nii` under --masks_dir (`mask_stem`). A DICOM series
    volume's mask may instead be any SEG or RTSTRUCT under --masks_dir (any name, any depth)
    that references its SeriesInstanceUID (`conversion.dicom_masks`); with --masks_dir
    --input_dir itself (or above the series, TCIA's `patient/study/<series>/`), those are the
    files the volume planning skipped as `segmentation_object`, no inputs then. Several masks
    for one volume refuse it (`mask_unreadable`, naming them). DICOM masks' labels are stored
    as ids of one class table (`conversion.dicom_masks.class_table`), their dtype by its size.

    Raises:
      FileNotFoundError: For a --masks_dir that does not exist.
      ValueError: For NIfTI and DICOM masks in one dataset (their ids mean different things).
    """
    from conversion import dicom_masks as _dicom

    family = _family(True)
    prefix = _inner_prefix(input_dir, options.masks_dir)
    same_folder = prefix == "" and options.suffixes is None
    # --masks_dir is --input_dir itself without --mask_suffix: masks are told from inputs by
    # content (a SEG or RTSTRUCT), never by name; the folder is listed once, as the input.
    mask_files = [] if same_folder else _list_masks(options.masks_dir)
    files, problems, is_mask = _drop_masks_dir(files, problems, input_dir, options, family)
    if is_mask is not None:
        mask_files = [m for m in mask_files if is_mask(m.rel_path)]
    inside = (lambda rel: True) if prefix == "" else (lambda rel: prefix is not None and rel.startswith(prefix))
    # DICOM candidates: the inputs skipped as SEG/RTSTRUCT inside --masks_dir (masks, no inputs),
    # and the files of --masks_dir that are no NIfTI mask (outside --input_dir: not read yet).
    candidates = [(p.rel_path, _join(input_dir, p.rel_path)) for p in problems
                  if p.reason == _SEGMENTATION_OBJECT and inside(p.rel_path)]
    problems = [p for p in problems if not (p.reason == _SEGMENTATION_OBJECT and inside(p.rel_path))]
    if prefix != "":
        candidates += [(m.rel_path, m.path) for m in mask_files if not family.extension_of(m.rel_path)]
    found, failed = _dicom.read_headers(candidates)
    by_stem = collections.defaultdict(list)
    for m in mask_files:
        if family.extension_of(m.rel_path):
            by_stem[family.stem(m.rel_path)].append(m)
    series_of = {f.rel_path: plans[f.rel_path].stack.series_uid for f in files
                 if f.rel_path in plans and plans[f.rel_path].stack is not None}
    instances_of = {name: frozenset(s.sop_instance_uid for s in plans[name].stack.slices) for name in series_of}
    by_reference, unmatched_dicom = _dicom.pair_by_reference(series_of, found, instances_of)
    kept, problems, mask_of, used = [], list(problems), {}, set()
    dicom_of = {}  # Volume name -> its DICOM mask.
    for f in files:
        stem = options.mask_stem(f.rel_path, True)
        if stem is not None:
            used.add(stem)
        niftis = by_stem.get(stem, []) if stem is not None else []
        dicoms = by_reference.get(f.rel_path, [])
        if len(niftis) + len(dicoms) == 1:
            kept.append(f)
            if dicoms:
                dicom_of[f.rel_path] = dicoms[0]
                mask_of[f.rel_path] = dicoms[0].path
            else:
                mask_of[f.rel_path] = niftis[0].path
        elif not niftis and not dicoms:
            message = _missing_message(f, stem, options, family.extensions)
            if f.rel_path in series_of:
                message += f", and no SEG or RTSTRUCT under it references series {series_of[f.rel_path]}"
                message += _strays_beside(f.rel_path, series_of[f.rel_path], failed, unmatched_dicom)
            problems.append(_listing.Problem(f.rel_path, "missing_mask", message))
        else:
            names = " and ".join([_listing.display_path(m.rel_path) for m in niftis]
                                 + ([_dicom.display(dicoms)] if dicoms else []))
            problems.append(_listing.Problem(
                f.rel_path, "mask_unreadable",
                f"several masks under --masks_dir {options.masks_dir!r} fit it: {names}; which one is meant is "
                "ambiguous (keep one)"))
    if dicom_of and len(dicom_of) != len(mask_of):
        nifti = sorted(set(mask_of) - set(dicom_of), key=os.fsencode)[:3]
        raise ValueError(
            f"--masks_dir {options.masks_dir!r} pairs {len(dicom_of):,} volumes with DICOM SEG/RTSTRUCT masks and "
            f"{len(mask_of) - len(dicom_of):,} with NIfTI label volumes (e.g. {', '.join(nifti)}): a NIfTI mask's "
            "ids are unnamed, a DICOM mask's are names mapped to one class table, and one dataset cannot hold "
            "both meanings. Convert them as two datasets, or export the NIfTI masks as SEGs.")
    unmatched = (sum(len(ms) for stem, ms in by_stem.items() if stem not in used) + len(unmatched_dicom)
                 + len(failed))
    if unmatched:
        _LOG.info("%s mask files under --masks_dir %s have no volume (not inputs)", f"{unmatched:,}",
                  options.masks_dir)
    section = {"masks_dir": options.masks_dir, "mask_suffix": options.mask_suffix, "unmatched_masks": unmatched}
    if dicom_of:
        paired = [dicom_of[f.rel_path] for f in kept]
        table = _dicom.class_table(paired)
        dtype = _dicom.mask_dtype(table)
        section = {"dtype": dtype, **section, "class_names": list(table), "paired_by": "reference"}
        _LOG.info("Masks: %s DICOM SEG/RTSTRUCT paired by reference, %s classes, stored as %s",
                  f"{len(paired):,}", f"{len(table):,}", dtype)
    else:
        dtype = _dataset_dtype([mask_of[f.rel_path] for f in kept], family.bits, path_of=lambda m: m)
        section = {"dtype": dtype, **section}
        names = _decathlon_class_names(options.masks_dir)
        if names:
            section["class_names"] = names
    return MaskPlan(tuple(kept), tuple(problems), dict(mask_of), dtype, unmatched, None, section)


# The skip reason of a SEG or RTSTRUCT among --volumes inputs (`imaging.dicom.check_not_segmentation`).
_SEGMENTATION_OBJECT = "segmentation_object"


def _decathlon_class_names(masks_dir: str) -> list[str] | None:
    """The class name of each mask id from a Decathlon `dataset.json` in --masks_dir or the folder above it.

    Its `labels` map is {"0": "background", "1": "left atrium"} (the Decathlon's) or
    {"background": 0, ...} (nnU-Net v2's); ids must run 0..n-1. None without one (or
    another JSON): the ids go unnamed.
    """
    import json

    from conversion import files as _files

    folder = masks_dir.rstrip("/")
    for candidate in (folder, folder.rpartition("/")[0]):
        if not candidate:
            continue
        path = _files.join(candidate, "dataset.json")
        try:
            if not _files.exists(path):
                continue
            labels = json.loads(read_bytes(path)).get("labels")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(labels, dict) or not labels:
            continue
        try:
            if all(str(k).isdigit() for k in labels):
                by_id = {int(k): str(v) for k, v in labels.items()}
            else:
                by_id = {int(v): str(k) for k, v in labels.items()}
        except (TypeError, ValueError):
            continue  # nnU-Net's region labels ([1, 2]): no one name per id.
        if sorted(by_id) == list(range(len(by_id))):
            _LOG.info("Mask class names from %s", path)
            return [by_id[i] for i in range(len(by_id))]
    return None


def _missing_message(f, stem: str | None, options: MaskOptions, extensions: Sequence[str]) -> str:
    if stem is None:
        image_suffix = options.suffixes[0]
        return (f"its name does not end with {image_suffix!r} (--mask_suffix {options.mask_suffix}), "
                "so it has no mask name")
    where = "/".join(p for p in (options.masks_dir.rstrip("/"), stem) if p)
    return f"no mask at {where}{{{','.join(extensions)}}}"


def _list_masks(masks_dir: str):
    try:
        found, _ = _listing.list_input(masks_dir)
    except FileNotFoundError:
        raise FileNotFoundError(f"--masks_dir {masks_dir!r} does not exist or is not a folder.") from None
    return found


def _drop_masks_dir(files, problems, input_dir: str, options: MaskOptions, family: _Family | None = None):
    """(files, problems, is_mask): the listing without the mask files (masks are not inputs).

    `is_mask` tells masks from images by name where both share one folder
    (else None).

    Masks in a folder inside --input_dir are left out whole; masks in
    --input_dir itself (beside their images) are told from the images by
    --mask_suffix, which is then needed.

    Raises:
      ValueError: For --masks_dir equal to --input_dir without a --mask_suffix
        that tells masks from images.
    """
    family = family or _family(False)
    prefix = _inner_prefix(input_dir, options.masks_dir)
    if prefix is None:
        return files, problems, None
    if prefix:
        def is_mask(rel: str) -> bool:
            return rel.startswith(prefix)
    else:
        suffixes = options.suffixes
        if suffixes is None and family.volumes:
            # Volumes' masks beside their series are DICOM SEGs and RTSTRUCTs, told from the
            # inputs by their content (`_plan_volume_masks`), not by name: nothing is left out here.
            return files, problems, None
        if suffixes is None:
            raise ValueError(
                f"--masks_dir {options.masks_dir!r} is --input_dir itself: give --mask_suffix "
                "IMAGE_SUFFIX:MASK_SUFFIX (e.g. :_mask for a.jpg beside a_mask.png) to tell masks "
                "from images.")
        image_suffix, mask_suffix = suffixes

        def is_mask(rel: str) -> bool:
            if family.extension_of(rel) not in family.extensions:
                return False
            stem = family.stem(rel)
            return stem.endswith(mask_suffix) if mask_suffix else not stem.endswith(image_suffix)

    kept = [f for f in files if not is_mask(f.rel_path)]
    if len(kept) != len(files):
        _LOG.info("Left out %s mask files under --input_dir from the inputs", f"{len(files) - len(kept):,}")
    return kept, [p for p in problems if not is_mask(p.rel_path)], (None if prefix else is_mask)


def drop_masks_dir(files, problems, input_dir: str, options: MaskOptions, volumes: bool = False):
    """(files, problems, is_mask): the input listing without the mask files under --input_dir
    (`plan_masks` does it for images; volumes do it before their series are planned).

    Raises:
      ValueError: For --masks_dir equal to --input_dir without a --mask_suffix.
    """
    return _drop_masks_dir(files, problems, input_dir, options, _family(volumes))


def _inner_prefix(input_dir: str, masks_dir: str) -> str | None:
    """'<folder>/' of --masks_dir inside --input_dir, '' for the same folder, None when outside."""
    if is_local(input_dir) != is_local(masks_dir):
        return None
    if is_local(input_dir):
        root = os.path.realpath(input_dir.removeprefix("file://"))
        inner = os.path.realpath(masks_dir.removeprefix("file://"))
        prefix = os.path.relpath(inner, root).replace(os.sep, "/")
        if prefix == ".":
            return ""
        if prefix == ".." or prefix.startswith("../"):
            return None
        return prefix + "/"
    root, inner = input_dir.rstrip("/") + "/", masks_dir.rstrip("/") + "/"
    if not inner.startswith(root):
        return None
    return inner[len(root):]


def _labels(files, split_ratios, class_names):
    """(files, problems, labels_from): splits from top-level split folders, labels from class folders.

    The rule of every dataset whose targets need no class
    (`conversion.targets.classes.image_labels_optional`); files beside the split
    folders, where there are some, belong to no split.
    """
    top = {f.rel_path.partition("/")[0] for f in files if "/" in f.rel_path}
    has_splits = any(d.lower() in SPLIT_ALIASES for d in top)
    outside = [_listing.Problem(f.rel_path, "not_in_split", "outside the split folders")
               for f in files if has_splits and "/" not in f.rel_path]
    kept = [f for f in files if not (has_splits and "/" not in f.rel_path)]
    # Here, not at the top: `conversion.targets` imports this module for its mask row.
    from conversion.targets.classes import image_labels_optional

    labels, source = image_labels_optional(kept, split_ratios)
    if class_names is not None and all(label is None for label, _ in labels.values()):
        raise ValueError(
            "--class_names names class folders, but with --masks_dir the input is not laid out "
            "as ROOT/<class>/<file> or ROOT/<split>/<class>/<file> with two classes or more. "
            "Drop --class_names (every label is then -1) or give a --labels_csv.")

    def labels_from(planned_files, unused_ratios):
        return {f.rel_path: labels[f.rel_path] for f in planned_files}, [], source

    return kept, outside, labels_from


def _dataset_dtype(paths: Sequence, bit_depth, path_of=None) -> str:
    """'uint16' when any mask file is 16-bit or deeper, from its header (`bit_depth` of its first bytes); else 'uint8'."""
    def depth(m):
        try:
            with open_to_read(m.path if path_of is None else path_of(m)) as fh:
                head = fh.read(_HEAD_BYTES)
                bits = bit_depth(head)
                if bits is None and len(head) == _HEAD_BYTES:
                    bits = bit_depth(head + fh.read())
        except OSError:
            return 8  # The shard writer reads it again and says why.
        return bits or 8

    with concurrent.futures.ThreadPoolExecutor(max_workers=_HEADER_THREADS) as pool:
        deepest = max(pool.map(depth, paths), default=8)
    dtype = "uint16" if deepest > 8 else "uint8"
    _LOG.info("Masks: %s files paired, stored as %s", f"{len(paths):,}", dtype)
    return dtype


class MaskedImage(NamedTuple):
    """A validated image and its mask as stored (a shard writer's outcome for a file with a mask).

    Attributes:
      image: The `imaging.ValidImage`, its actions and details extended
        with what was done to the mask.
      mask: The mask's PNG bytes.
      counts: Pixels per class id (`np.bincount`).
    """

    image: Any
    mask: bytes
    counts: np.ndarray


def unpack(item) -> tuple[Any, bytes | None, np.ndarray | None]:
    """(image, mask PNG or None, pixel counts or None) of a shard writer's outcome item."""
    if isinstance(item, MaskedImage):
        return item.image, item.mask, item.counts
    return item, None, None


def pair(rel_path: str, mask_path: str, images, data: bytes, dtype: str,
         max_pixels: int | None = None, drawn: str = "auto") -> list[MaskedImage]:
    """A file's validated images, each with its mask aligned and encoded.

    Args:
      rel_path: The image's relative path (messages).
      mask_path: Where its mask is.
      images: Its `ValidImage`s (several for multi-frame or multi-page files:
        the same mask goes with each).
      data: The image file's bytes (its EXIF orientation, when it was turned).
      dtype: The dataset's mask dtype.
      max_pixels: --max_pixels.
      drawn: --annotations_frame ('auto', 'raw', 'upright'): `imaging.masks.align_mask`.

    Raises:
      ImageRejected: With a mask reason: the pair is rejected.
    """
    try:
        mask_data = read_bytes(mask_path)
    except OSError as e:
        raise ImageRejected("mask_unreadable", f"mask of {rel_path}: {e}") from e
    ids = _masks().read_mask(mask_data, mask_path, max_pixels)
    if dtype == "uint8" and ids.dtype != np.uint8 and ids.size and int(ids.max()) > 255:
        raise ImageRejected(
            "mask_not_class_ids",
            f"mask {mask_path} holds ids up to {int(ids.max())}, but its header said 8-bit")
    out = []
    encoded = {}  # Frames of one file share a size: the mask is aligned and encoded once.
    for image in images:
        frame = _masks().image_frame(data, image.actions, image.height, image.width, image.details)
        if frame not in encoded:
            aligned = _masks().align_mask(ids, frame, rel_path, drawn)
            if not aligned.actions and _masks().storable_as_is(mask_data, dtype):
                png = mask_data  # Its ids exactly as TensorFlow decodes them: kept byte for byte.
            else:
                png = _masks().encode_mask(aligned.ids, dtype)
            encoded[frame] = (aligned, png, _masks().pixel_counts(aligned.ids))
        out.append(masked_image(image, *encoded[frame]))
    return out


def masked_image(image, aligned, png: bytes, counts) -> MaskedImage:
    """`image` with its encoded mask, and what aligning the mask did in its actions and details."""
    if aligned.actions:
        details = dict(image.details or {})
        details["mask"] = aligned.details
        image = dataclasses.replace(image, actions=(*image.actions, *aligned.actions), details=details)
    return MaskedImage(image, png, counts)


def pair_patches(images, ids: Sequence[np.ndarray], dtype: str) -> list[MaskedImage]:
    """Patches of a scene (--raster_patch), each with its window of the label raster encoded.

    Args:
      images: The stored patches (`imaging.scenes.Cut.images`).
      ids: Their class ids at their stored size (`imaging.scenes.Cut.masks`),
        already cut, padded and resized with them (`imaging.scenes.LabelRaster`).
      dtype: The dataset's mask dtype.
    """
    return [MaskedImage(image, _masks().encode_mask(window, dtype), _masks().pixel_counts(window))
            for image, window in zip(images, ids, strict=True)]


class PixelCounter:
    """Pixels per class id of a shard's masks."""

    def __init__(self):
        self._counts = np.zeros(0, np.int64)

    def add(self, counts: np.ndarray) -> None:
        if len(counts) > len(self._counts):
            self._counts = np.pad(self._counts, (0, len(counts) - len(self._counts)))
        self._counts[:len(counts)] += counts

    def to_json(self) -> dict[str, int]:
        """{"<id>": pixels} of the ids present, in id order."""
        return {str(i): int(n) for i, n in enumerate(self._counts) if n}
