"""The mask kind: segmentation masks (--masks_dir, --mask_suffix), one row of `conversion.targets.TARGETS`.

- Planning (`_plan`, on the driver): pairs each example with its mask
  (`conversion.masks.plan_masks`: an image without one is a 'missing_mask'
  problem), decides the image labels where the layout has class folders and
  the one mask dtype of the dataset from the masks' headers; with
  --raster_patch, the kind of example checks the label rasters against its
  windows (`cut_masks`). Each file's value is its mask's path and the dtype.
- Writing: the mask is a second file per example, read on the shard
  writer's read-ahead threads with its image (`conversion.masks.pair`),
  aligned with each stored image and encoded as a PNG (the `mask` feature).
- The manifest: the dtype and folder, then pixels per class id and split
  (the shards' `mask_pixels`).

With --annotation_masks (and --annotations) no mask file is read: planned
after the boxes row, every image that row planned gets a mask drawn from
its boxes' regions (`conversion.annotation_masks`, `drawn_regions`); the
section then names each id (`class_names`: 'background', then the box
classes) and the crowd regions' `ignore_id`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Mapping

import logging

import numpy as np

import schemas
from conversion import masks as _masks
from conversion.targets import boxes as _boxes
from conversion.targets.kind import Description, PlannedKind, RecordPart, TargetKind, TargetRequest

__all__ = ["KIND", "NAME", "of_file", "class_table_of", "drawn_of", "drawn_regions"]

_LOG = logging.getLogger("shardsmith.convert")
# The kind's key (`schemas.TARGET_KINDS`): the one whose feature is `mask`.
NAME = _masks.TARGET_KIND


def _plan(request: TargetRequest) -> PlannedKind | None:
    config = request.config
    if getattr(config, "annotation_masks", False):
        return _plan_drawn(request)
    options = config.masks
    if not options.active:
        return None
    held = request.held_section(NAME)
    volumes = getattr(request.example, "name", None) == "volume"
    mask_plan = _masks.plan_masks(
        request.files, request.problems, options, input_dir=config.input_dir,
        split_ratios=config.split_ratios, labels_csv=request.labels_csv is not None,
        class_names=config.class_names,
        # --volumes: NIfTI label volumes by name, DICOM SEG/RTSTRUCT by the series they reference.
        volumes=volumes, plans=request.plans)
    if request.windows is not None:
        # Label rasters cut with their examples' windows, as the kind of example cuts them.
        mask_plan = request.example.cut_masks(mask_plan, request.windows, config)
    if held is not None and volumes:
        # The dataset's class table (held ids never move) and dtype, before the dtype is kept.
        mask_plan = _held_volume_table(mask_plan, held, options)
    if held is not None:
        mask_plan = _held_dtype(mask_plan, held, options)
    if request.example is not None:
        # Each example's size with its mask as its records store it (a volume's raw ids): shards are sized by it.
        mask_plan = request.example.sized_masks(mask_plan, request.plans, config)
    # --annotations_frame only where given: the default's planned targets stay as they were.
    drawn = {} if config.annotations_frame == "auto" else {"frame": config.annotations_frame}
    # DICOM masks' labels become ids of the dataset's class table, in the shard writer.
    if mask_plan.section.get(_BY_REFERENCE):
        drawn = {**drawn, _TABLE: list(mask_plan.section["class_names"])}
    values = {f.rel_path: {"dtype": mask_plan.dtype, "path": mask_plan.mask_of[f.rel_path], **drawn}
              for f in mask_plan.files}
    # Only what the rest of the run needs (dtype, section): the driver holds no
    # second object per image while the pipeline runs.
    summary = dataclasses.replace(mask_plan, files=(), problems=(), mask_of={}, labels_from=None)
    return PlannedKind(values=values, section=dict(mask_plan.section), files=list(mask_plan.files),
                       problems=list(mask_plan.problems), labels_from=mask_plan.labels_from,
                       summary=summary)


def _plan_drawn(request: TargetRequest) -> PlannedKind:
    """--annotation_masks: every image the boxes row planned gets a mask drawn from its regions
    (`conversion.annotation_masks`), of ids 0 (background) and box class index + 1."""
    from conversion import annotation_masks as _drawn

    box_names = list(request.planned[_boxes.NAME]["class_names"])
    dtype = _drawn.mask_dtype(len(box_names))
    held = request.held_section(NAME)
    if held is not None and held.get("dtype") != dtype:
        raise ValueError(
            f"--append adds to a dataset of {held.get('dtype')} masks (its manifest's targets.{NAME}.dtype), "
            f"and the masks --annotation_masks draws of {len(box_names)} box classes need {dtype}: the "
            "held masks' PNGs cannot change. Convert the grown folder with --overwrite.")
    section = {"dtype": dtype, "drawn_from": request.config.annotations,
               "class_names": _drawn.mask_class_names(box_names), "ignore_id": _drawn.IGNORE_IDS[dtype]}
    # Files the boxes row did not plan stay out of the plan's values (`plan_targets`).
    values = {f.rel_path: {"dtype": dtype, _DRAWN: True} for f in request.files}
    return PlannedKind(values=values, section=section)


# A file's mask value with this key set is drawn from its boxes' regions, not read from a mask file.
_DRAWN = "drawn"
# A file's mask value's class table (DICOM SEG/RTSTRUCT masks: names by dataset id), and the
# section's mark of masks paired by the series they reference.
_TABLE = "class_table"
_BY_REFERENCE = "paired_by"


def class_table_of(targets: str | None) -> tuple[str, ...] | None:
    """The dataset's class table (names by id) a file's DICOM mask's labels are mapped to, from its
    planned targets' JSON text; None for other masks (NIfTI, PNG), whose ids are stored as they are."""
    if targets is None:
        return None
    table = (json.loads(targets).get(NAME) or {}).get(_TABLE)
    return None if table is None else tuple(table)


def drawn_regions(targets: str | None) -> tuple[dict, str] | None:
    """(the boxes row's value, mask dtype) of a file whose mask is drawn from its annotation
    (--annotation_masks), from its planned targets' JSON text; None otherwise."""
    if targets is None:
        return None
    values = json.loads(targets)
    value = values.get(NAME)
    if value is None or not value.get(_DRAWN):
        return None
    return values[_boxes.NAME], value["dtype"]


def _held_dtype(mask_plan, held, options):
    """With --append: the new masks stored at the dataset's dtype (as a full conversion of the grown
    folder stores them), refused when they need a wider one than its held masks' PNGs."""
    dtype = held.get("dtype")
    if dtype == mask_plan.dtype or dtype not in _MASK_DTYPES:
        return mask_plan
    if mask_plan.dtype == "uint16":
        raise ValueError(
            f"--append adds to a dataset of {dtype} masks (its manifest's targets.{NAME}.dtype), and "
            f"the new masks under --masks_dir {options.masks_dir} need uint16 (ids or samples above "
            "8 bits): the held masks' PNGs cannot change. Convert the grown folder with --overwrite.")
    return dataclasses.replace(mask_plan, dtype=dtype, section={**mask_plan.section, "dtype": dtype})


def _held_volume_table(mask_plan, held, options):
    """--volumes --append: the new masks' class table is the dataset's, grown at its end.

    DICOM SEG/RTSTRUCT masks: a name the dataset's table (`targets.mask.class_names`) lacks is
    appended after its last id (new names sorted among themselves), so every held id keeps its
    name and the held records stay true; the dtype is the grown table's, refused where it must
    grow past the held one's. NIfTI label volumes keep the dataset's names (a Decathlon
    `dataset.json`'s). Masks of the other family than the dataset's are refused.

    Raises:
      ValueError: Naming --masks_dir and --overwrite, for DICOM masks added to a dataset of
        NIfTI masks (or the reverse), or a grown table that needs uint16 in a uint8 dataset.
    """
    from conversion import dicom_masks as _dicom

    by_reference, held_by_reference = bool(mask_plan.section.get(_BY_REFERENCE)), bool(held.get(_BY_REFERENCE))
    if mask_plan.files and by_reference != held_by_reference:
        kinds = ("DICOM SEG/RTSTRUCT masks (ids of a named class table)", "NIfTI label volumes (ids as stored)")
        raise ValueError(
            f"--append adds to a dataset of {kinds[not held_by_reference]}, and the new masks under --masks_dir "
            f"{options.masks_dir} are {kinds[not by_reference]}: one dataset cannot hold both meanings. Convert "
            "the grown folder with --overwrite, or the new volumes into another --output_dir.")
    held_names = list(held.get("class_names") or ())
    if not by_reference:
        if held_names:  # The Decathlon names the dataset was converted with.
            return dataclasses.replace(mask_plan, section={**mask_plan.section, "class_names": held_names})
        return mask_plan
    new = sorted(set(mask_plan.section.get("class_names") or ()) - set(held_names) - {_dicom.BACKGROUND})
    table = [*held_names, *new]
    dtype = _dicom.mask_dtype(table)
    if new:
        _LOG.info("Mask classes: %d new names appended at the end of the dataset's class table (ids %d to %d): %s",
                  len(new), len(held_names), len(table) - 1, ", ".join(new))
    if held.get("dtype") in _MASK_DTYPES and _MASK_DTYPES.index(dtype) > _MASK_DTYPES.index(held["dtype"]):
        raise ValueError(
            f"--append adds to a dataset of {held['dtype']} masks (its manifest's targets.{NAME}.dtype), and the "
            f"new masks under --masks_dir {options.masks_dir} grow its class table to {len(table)} names "
            f"({len(new)} new), which need {dtype}: the held records' masks cannot change. Convert the grown "
            "folder with --overwrite.")
    return dataclasses.replace(mask_plan, dtype=dtype, section={**mask_plan.section, "class_names": table,
                                                                "dtype": dtype, _BY_REFERENCE: held[_BY_REFERENCE]})


def _merge(held: dict, mine: dict) -> dict:
    """The grown dataset's section: pixels per class id and split added up, num_classes of both."""
    pixels = {}
    for section in (held, mine):
        for split, counts in (section.get("pixel_counts") or {}).items():
            into = pixels.setdefault(split, collections.Counter())
            for class_id, n in counts.items():
                into[str(class_id)] += int(n)
    return {**mine,
            "num_classes": max(_num_classes(pixels, mine.get("dtype")), len(mine.get("class_names") or ()))
            if pixels else max(int(held.get("num_classes") or 0), int(mine.get("num_classes") or 0)),
            "pixel_counts": {split: {str(i): counts[str(i)] for i in sorted(map(int, counts))}
                             for split, counts in sorted(pixels.items())}}


def drawn_of(targets: str) -> str:
    """--annotations_frame for a file's mask, from its planned targets' JSON text: 'auto' unless given."""
    return (json.loads(targets).get(NAME) or {}).get("frame", "auto")


def of_file(targets: str | None) -> tuple[str, str] | None:
    """(path, dtype) of a file's mask, from its planned targets' JSON text (`ShardFile.targets`);
    None without one. The dtype ('uint8' or 'uint16') is the dataset's, the same in every file."""
    if targets is None:
        return None
    value = json.loads(targets).get(NAME)
    return None if value is None or value.get(_DRAWN) else (value["path"], value["dtype"])


def _record(value, image, raw_frame, name: str) -> RecordPart:
    # The mask's PNG is made on the read-ahead threads with its image (`conversion.masks.pair`).
    return RecordPart({})


def _section(section: dict, shards, splits, num_classes: int) -> dict:
    """The planned section with num_classes and the pixels per class id and split."""
    per_split = {split: collections.Counter() for split in splits}
    for s in shards:
        for class_id, pixels in (s.mask_pixels or {}).items():
            per_split.setdefault(s.split, collections.Counter())[class_id] += pixels
    # Drawn masks (--annotation_masks) name their ids: every class counts, though no pixel has it.
    section["num_classes"] = max(_num_classes(per_split, section.get("dtype")), len(section.get("class_names") or ()))
    section["pixel_counts"] = {
        split: {str(i): counts[str(i)] for i in sorted(map(int, counts))}
        for split, counts in sorted(per_split.items())
    }
    return section


# The mask id that means "ignore this pixel" at each mask dtype: allowed above num_classes.
_IGNORE_ID = {"uint8": 255, "uint16": 65535}


def _num_classes(pixel_counts: Mapping[str, Mapping], dtype: str | None) -> int:
    """The largest class id seen + 1, the dtype's ignore id left out.

    VOC and Cityscapes draw object borders and unlabelled pixels with 255, and the reader pads
    with the ignore id: counted as a class, it made VOC's 21 classes 256. Its pixels stay in
    `pixel_counts`.
    """
    ignore = _IGNORE_ID.get(dtype)
    ids = [int(i) for counts in pixel_counts.values() for i in counts if int(i) != ignore]
    return max(ids) + 1 if ids else 0
_MASK_DTYPES = tuple(_IGNORE_ID)
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _verify(section, num_classes: int):
    dtype, top = section.get("dtype"), section.get("num_classes")
    if dtype not in _MASK_DTYPES or not isinstance(top, int) or isinstance(top, bool):
        return None, (f"the manifest's targets.mask must give dtype (one of {_MASK_DTYPES}) "
                      f"and num_classes (an int); it says {dict(section)!r}")
    return (lambda values, height, width, tf: _check_mask(values[schemas.MASK.key], height, width, dtype,
                                                           top, tf)), None


def _check_mask(mask: bytes, height: int, width: int, dtype: str, num_classes: int, tf) -> str | None:
    """A PNG at the manifest's dtype that decodes to the image's size, of ids below num_classes (or ignore)."""
    key = schemas.MASK.key
    if not mask.startswith(_PNG_SIGNATURE):
        return f"{key} is not a PNG"
    depth = schemas.sample_dtype("png", mask)
    if depth != dtype:
        # decode_png would convert silently: the ids of a 16-bit mask read as 8-bit are not ids.
        return f"{key} is a {depth} PNG, the manifest's targets.mask.dtype is {dtype}"
    try:
        decoded = tf.io.decode_png(mask, channels=0, dtype=getattr(tf, dtype))
    except tf.errors.OpError as e:
        return f"{key} does not decode ({e.message.split('}}')[-1].strip()})"
    if tuple(decoded.shape) != (height, width, 1):
        return f"{key} decodes to {tuple(decoded.shape)}, the image is {(height, width, 1)}"
    ids = np.unique(decoded.numpy())
    bad = [int(i) for i in ids if i >= num_classes and i != _IGNORE_ID[dtype]]
    if bad:
        return (f"{key} holds class ids {bad[:5]}, the manifest's targets.mask.num_classes is "
                f"{num_classes} ({_IGNORE_ID[dtype]}: ignore)")
    return None


def _describe(mask, class_names, splits, max_classes: int) -> Description:
    """Mask dtype, classes, and each id's share of the pixels of every split."""
    dtype = mask.get("dtype", "?")
    ignore = _IGNORE_ID.get(dtype)
    suffix = mask.get("mask_suffix")
    where = (f"drawn from --annotations {mask['drawn_from']}" if mask.get("drawn_from")
             else f"from {mask.get('masks_dir')}" + (f" (suffix {suffix})" if suffix else ""))
    head = [f"masks: {dtype}, {mask.get('num_classes', '?')} classes, {where}"]
    names = mask.get("class_names") or []
    pixel_counts = {s: {int(k): int(v) for k, v in (mask.get("pixel_counts") or {}).get(s, {}).items()}
                    for s in splits}
    ids = sorted({i for counts in pixel_counts.values() for i in counts})
    totals = {s: sum(counts.values()) for s, counts in pixel_counts.items()}
    rows = [["mask id", *(f"{s} pixels" for s in splits)]]
    for i in ids[:max_classes]:
        name = f"{i} (ignore)" if i == ignore else f"{i} {names[i]}" if i < len(names) else str(i)
        rows.append([name, *(f"{pixel_counts[s].get(i, 0) / totals[s]:.1%}" if totals[s] else "-"
                             for s in splits)])
    tail = [f"... and {len(ids) - max_classes} more mask ids"] if len(ids) > max_classes else []
    return Description(head, rows, tail)


KIND = TargetKind(name=NAME, flag="--masks_dir or --annotation_masks", plan=_plan, record=_record,
                  section=_section, verify=_verify, describe=_describe, merge=_merge)
