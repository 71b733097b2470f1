"""Targets beyond one class per image: COCO/VOC boxes, several labels and numbers from a CSV.

Three stages, each a plain function of plain values (no Beam):

- Planning, on the driver (`plan_targets`): reads --annotations (a COCO
  instances JSON file or a folder of Pascal VOC XML files) and the labels
  CSV's multi-label (`cat|dog`) or numeric (`target`) columns, matches them
  to the listed files, and gives each file its targets as a compact JSON
  text (`conversion.plan.PlanTargets.values`), which travels in the
  picklable `ShardFile` to whichever process writes its shard.
- Writing, per record (`record_targets`): once the image is validated, its
  boxes are clipped to the frame they were drawn on, turned upright with the
  photo when drawn on its raw frame (`imaging.boxes`), normalised to the
  stored image and returned as the record's features; what was done to them
  goes to normalized.jsonl. `TargetCounts` sums a shard's boxes and labels.
- Finalizing (`targets_section`): the manifest's `targets` section from the
  planned, dataset-level part and the shards' counts.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import json
import logging
import math
import os
import posixpath
import struct
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import schemas
from conversion import listing as _listing, plan as _plan
from conversion.config import ConversionConfig
from conversion.files import exists, read_bytes
from imaging import ImageRejected
from imaging import boxes as _boxes
from schemas.manifest import SPLIT_ALIASES
__all__ = ["TargetsCsv", "read_targets_csv", "read_coco", "read_voc", "BoxAnnotations", "plan_targets",
           "RecordTargets", "record_targets", "TargetCounts", "targets_section", "BOX_ACTIONS"]

_LOG = logging.getLogger("shardsmith.convert")
# Per-record actions on boxes, listed in normalized.jsonl.
BOX_ACTIONS = ("boxes_clipped", "boxes_dropped", "boxes_exif_transpose")
# The kinds of target (keys of schemas.TARGET_KINDS, and of the manifest's targets section)
# this module plans: the per-file targets are keyed by them too.
_KIND_OF = {specs: kind for kind, specs in schemas.TARGET_KINDS.items()}
_BOXES = _KIND_OF[schemas.BOX_FEATURES]
_LABELS = _KIND_OF[(schemas.LABELS,)]
_TARGET = _KIND_OF[(schemas.TARGET,)]
# Unknown image ids (and like lists) named in a log line at most.
_LOG_AT_MOST = 10
# Suffixes never taken for the image a VOC XML file's stem names.
_NOT_IMAGES = (".xml", ".json", ".txt", ".csv")


def _dumps(value) -> str:
    """Compact, deterministic JSON: what a file's targets travel as."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _normalise_rel(path: str) -> str:
    path = path.strip().replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path.lstrip("/")


# --------------------------------------------------------------------------
# Labels CSV: several labels, numbers.


@dataclasses.dataclass(frozen=True)
class TargetsCsv:
    """A labels CSV that holds more than one label per image or numbers.

    Attributes:
      rows: Relative path to (label names or None, split or None, numbers or
        None): label names is a tuple of names (several labels, sorted,
        each once) or of one name (one label per image); None without a
        label column.
      multi_label: Whether labels are sets (any row has a `|` in its label).
      target_length: Numbers per row of the `target` column; None without one.
    """

    rows: Mapping[str, tuple[tuple[str, ...] | None, str | None, tuple[float, ...] | None]]
    multi_label: bool
    target_length: int | None

    def labels_csv(self) -> dict[str, tuple[str | None, str | None]]:
        """The rows as `plan.make_plan`'s labels_csv: the one label of each row, else None."""
        return {path: (names[0] if names is not None and not self.multi_label else None, split)
                for path, (names, split, _) in self.rows.items()}


def read_targets_csv(text: str, source: str) -> TargetsCsv | None:
    """Parses a labels CSV whose labels are sets (`cat|dog`) or that has a numeric `target` column.

    Args:
      text: The CSV's text.
      source: --labels_csv, for messages.

    Returns:
      The parsed CSV, or None for a CSV of one label per row and no `target`
      column (`plan.read_labels_csv` reads those).

    Raises:
      ValueError: Naming the file and row: a missing column, an empty path,
        an unknown split, a path listed twice with different values, a
        non-numeric target, or rows with different counts of targets.
    """
    reader = csv.DictReader(io.StringIO(text))
    columns = [c.strip() for c in (reader.fieldnames or [])]
    reader.fieldnames = columns
    has_label, has_target = "label" in columns, "target" in columns
    if "path" not in columns or not (has_label or has_target):
        if not has_target:
            return None  # `plan.read_labels_csv` says what a labels CSV needs.
        raise ValueError(
            f"--labels_csv {source} must have a header with columns path,label[,split] or "
            f"path,target[,split] (or both label and target). Received columns: {columns}"
        )
    if not has_target and "|" not in text:
        return None  # One label per row: read by `plan.read_labels_csv`, without parsing it twice.
    rows = list(enumerate(reader, start=2))
    multi = has_label and any("|" in (row["label"] or "") for _, row in rows)
    if not multi and not has_target:
        return None
    has_split = "split" in columns
    out = {}
    length = None
    for row_number, row in rows:
        where = f"--labels_csv {source} row {row_number}"
        path = _normalise_rel(row["path"] or "")
        if not path:
            raise ValueError(f"{where}: empty path.")
        names = None
        if has_label:
            raw = (row["label"] or "").strip()
            if multi:
                names = tuple(sorted({n.strip() for n in raw.split("|") if n.strip()}))
            elif not raw:
                raise ValueError(f"{where}: empty label.")
            else:
                names = (raw,)
        numbers = None
        if has_target:
            numbers = _parse_numbers(row["target"], where)
            if length is None:
                length = len(numbers)
            elif len(numbers) != length:
                raise ValueError(
                    f"{where}: {len(numbers)} targets, but the rows before have {length}; every "
                    f"row needs the same number of targets (separated by |)."
                )
        split = None
        if has_split:
            raw_split = (row["split"] or "").strip().lower()
            if raw_split not in SPLIT_ALIASES:
                raise ValueError(f"{where}: split must be one of {sorted(SPLIT_ALIASES)}. "
                                 f"Received: {raw_split!r}")
            split = SPLIT_ALIASES[raw_split]
        value = (names, split, numbers)
        if path in out and _row_key(out[path]) != _row_key(value):
            raise ValueError(f"{where}: {path!r} is listed twice with different labels, targets or splits.")
        out[path] = value
    return TargetsCsv(rows=out, multi_label=multi, target_length=length)


def _row_key(value):
    # NaN != NaN: compared by text, so a row listed twice with the same NaN is the same row.
    names, split, numbers = value
    return names, split, None if numbers is None else tuple(map(repr, numbers))


def _parse_numbers(cell: str | None, where: str) -> tuple[float, ...]:
    raw = (cell or "").strip()
    if not raw:
        raise ValueError(f"{where}: empty target (numbers separated by |, e.g. 0.5|1.25).")
    try:
        return tuple(float(part) for part in raw.split("|"))
    except ValueError:
        raise ValueError(f"{where}: target must be numbers separated by | (e.g. 0.5|1.25). "
                         f"Received: {raw!r}") from None


def _bad_numbers(numbers: Sequence[float]) -> str | None:
    """Why numbers cannot be stored as float32 (NaN, infinite, out of range), or None."""
    for v in numbers:
        if not math.isfinite(v):
            return f"target {v!r} is not a finite number"
        try:
            struct.pack("<f", v)
        except OverflowError:
            return f"target {v!r} does not fit in float32"
    return None


# --------------------------------------------------------------------------
# Boxes: COCO and Pascal VOC.


@dataclasses.dataclass(frozen=True)
class BoxAnnotations:
    """Boxes read from --annotations, matched to the listed files.

    Attributes:
      format: 'coco' or 'voc'.
      class_names: Box class names in label order.
      category_ids: COCO category id of each label; None for VOC.
      files: Relative path to {'size': [w, h] or None, 'ref': what a box's
        reference is, 'boxes': [[ref, xmin, ymin, xmax, ymax, label,
        is_crowd], ...], 'dropped': [[ref, reason], ...]} (pixels, on the
        frame the annotation was drawn on).
      missing: Entries naming files that do not exist (rel_path, message).
      invalid: Files whose annotation cannot be read (rel_path -> message).
      issues: Dataset-level counts of what was dropped or not matched.
    """

    format: str
    class_names: tuple[str, ...]
    category_ids: tuple[int, ...] | None
    files: Mapping[str, dict]
    missing: tuple[tuple[str, str], ...]
    invalid: Mapping[str, str]
    issues: Mapping[str, int]


class _Index:
    """The listed paths (files and problems alike), by path and by base name."""

    def __init__(self, paths: Sequence[str]):
        self.paths = frozenset(paths)
        self.by_name = collections.defaultdict(list)
        self.by_stem = collections.defaultdict(list)
        for p in sorted(paths):
            name = posixpath.basename(p)
            self.by_name[name].append(p)
            stem, suffix = posixpath.splitext(name)
            if suffix.lower() not in _NOT_IMAGES:
                self.by_stem[stem].append(p)

    def find(self, file_name: str) -> str | None:
        """The listed path of a COCO file_name: relative to the input, or a unique bare name."""
        rel = _normalise_rel(file_name)
        if rel in self.paths:
            return rel
        found = self.by_name.get(posixpath.basename(rel), ())
        return found[0] if len(found) == 1 else None


def _size(width, height) -> list[int] | None:
    """[width, height] when both are positive integers (VOC and COCO files write 0 for unknown)."""
    try:
        w, h = float(width), float(height)
    except (TypeError, ValueError):
        return None
    if not (w > 0 and h > 0 and w.is_integer() and h.is_integer()):
        return None
    return [int(w), int(h)]


def _finite(values) -> list[float] | None:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        return None
    return out if all(math.isfinite(v) for v in out) else None


def read_coco(data: bytes, source: str, listed: Sequence[str]) -> BoxAnnotations:
    """Reads a COCO instances file and matches its images to the listed paths.

    Categories in id order become labels 0..k-1; each image's boxes come in
    annotation id order, [x, y, w, h] becoming corners (x, y, x + w, y + h).

    Args:
      data: The JSON file's bytes.
      source: --annotations, for messages.
      listed: Relative paths under --input_dir (files and problems).

    Raises:
      ValueError: When the file is not a COCO instances JSON document.
    """
    try:
        doc = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--annotations {source} is not a JSON file ({e}).") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise ValueError(f"--annotations {source} must be a COCO instances JSON object with an "
                         f"'images' list (and 'categories', 'annotations').")
    try:
        categories = sorted(doc.get("categories") or [], key=lambda c: int(c["id"]))
        category_ids = tuple(int(c["id"]) for c in categories)
        class_names = tuple(str(c.get("name", c["id"])) for c in categories)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"--annotations {source}: every category needs an integer 'id' ({e!r}).") from None
    if len(set(category_ids)) != len(category_ids):
        raise ValueError(f"--annotations {source}: category ids are not unique: {list(category_ids)}")
    label_of = {cid: i for i, cid in enumerate(category_ids)}
    index = _Index(listed)
    issues = collections.Counter()
    files: dict[str, dict] = {}
    image_file: dict[Any, str | None] = {}
    missing: dict[str, str] = {}
    for image in sorted(doc["images"], key=lambda im: _id_key(im.get("id") if isinstance(im, dict) else None)):
        if not isinstance(image, dict) or "id" not in image or not isinstance(image.get("file_name"), str):
            issues["bad_image_entry"] += 1
            continue
        rel = index.find(image["file_name"])
        if rel is None:
            name = _normalise_rel(image["file_name"])
            missing.setdefault(name, f"named in --annotations {source} (image id {image['id']}) "
                                     "but not found under --input_dir")
            image_file[image["id"]] = None
            continue
        if rel in files:
            issues["duplicate_image"] += 1
            _LOG.warning("--annotations %s: image id %s names %s again; its annotations are ignored",
                         source, image["id"], rel)
            image_file[image["id"]] = None
            continue
        image_file[image["id"]] = rel
        files[rel] = {"size": _size(image.get("width"), image.get("height")), "ref": "annotation_id",
                      "boxes": [], "dropped": []}
    unknown_images = []
    annotations = doc.get("annotations") or []
    keyed = sorted(((_id_key(a.get("id") if isinstance(a, dict) else None), k, a)
                    for k, a in enumerate(annotations)), key=lambda t: (t[0], t[1]))
    for _, position, ann in keyed:
        if not isinstance(ann, dict):
            issues["bad_annotation"] += 1
            continue
        ref = ann.get("id", f"#{position}")
        if ann.get("image_id") not in image_file:
            issues["unknown_image"] += 1
            unknown_images.append(ann.get("image_id"))
            continue
        rel = image_file[ann["image_id"]]
        if rel is None:
            continue  # Its image is missing (or named twice): listed there.
        entry = files[rel]
        category = ann.get("category_id")
        bbox = ann.get("bbox")
        corners = _finite(bbox) if isinstance(bbox, (list, tuple)) and len(bbox) == 4 else None
        if category not in label_of:
            issues["unknown_category"] += 1
            entry["dropped"].append([ref, "unknown_category"])
        elif corners is None:
            issues["bad_bbox"] += 1
            entry["dropped"].append([ref, "bad_bbox"])
        else:
            x, y, w, h = corners
            entry["boxes"].append([ref, x, y, x + w, y + h, label_of[category], 1 if ann.get("iscrowd") else 0])
    if unknown_images:
        _LOG.warning("--annotations %s: %d annotations name image ids that are not among its images: %s",
                     source, len(unknown_images), _some(unknown_images))
    return BoxAnnotations("coco", class_names, category_ids, files, tuple(sorted(missing.items())), {},
                          dict(issues))


def _id_key(value):
    # Ids are ints in COCO files; anything else sorts after them, by its text.
    if isinstance(value, int) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, str(value))


def _some(values) -> str:
    shown = ", ".join(map(str, values[:_LOG_AT_MOST]))
    return shown + (f" and {len(values) - _LOG_AT_MOST} more" if len(values) > _LOG_AT_MOST else "")


def read_voc(documents: Sequence[tuple[str, bytes]], source: str, listed: Sequence[str]) -> BoxAnnotations:
    """Reads Pascal VOC XML files and matches each to the listed image of its own stem.

    The `<filename>` tag is not used to find the image (real files disagree
    with their names); it only breaks a tie between several images of the
    stem. `<bndbox>` corners are 1-based: the min corner becomes
    (xmin - 1, ymin - 1), the max corner stays (as detectron2 reads VOC).
    Labels are the sorted object names; `<difficult>` is the box's is_crowd.

    Args:
      documents: (XML file's name relative to --annotations, its bytes), sorted.
      source: --annotations, for messages.
      listed: Relative paths under --input_dir (files and problems).
    """
    index = _Index(listed)
    issues = collections.Counter()
    parsed: dict[str, dict] = {}  # rel_path -> {"size", "objects": [(ref, name, box or None, difficult)]}
    missing: dict[str, str] = {}
    invalid: dict[str, str] = {}
    # Of every readable XML file, its image found or not: the classes do not depend on the images.
    names: set[str] = set()
    for name, data in documents:
        stem = posixpath.splitext(posixpath.basename(name))[0]
        try:
            root = ElementTree.fromstring(data)
        except ElementTree.ParseError as e:
            root, error = None, f"annotation {name} in --annotations {source} is not valid XML ({e})"
        tag_name = (root.findtext("filename") or "").strip() if root is not None else ""
        objects = [] if root is None else _voc_objects(root)
        names.update(label for _, label, corners, _ in objects if label and corners is not None)
        rel = _voc_image(index, stem, tag_name, name, source, issues)
        if rel is None:
            if not index.by_stem.get(stem):
                missing.setdefault(stem, f"annotation {name} in --annotations {source} names image "
                                         f"{stem!r} (its file's stem), which is not under --input_dir")
            continue
        if rel in parsed or rel in invalid:
            issues["duplicate_image"] += 1
            _LOG.warning("--annotations %s: %s annotates %s again; ignored", source, name, rel)
            continue
        if root is None:
            invalid[rel] = error
            continue
        size = root.find("size")
        parsed[rel] = {"size": None if size is None else _size(size.findtext("width"), size.findtext("height")),
                       "objects": objects}
    class_names = tuple(sorted(names))
    label_of = {name: i for i, name in enumerate(class_names)}
    files = {}
    for rel, entry in parsed.items():
        boxes, dropped = [], []
        for ref, label, corners, difficult in entry["objects"]:
            if not label:
                issues["no_name"] += 1
                dropped.append([ref, "no_name"])
            elif corners is None:
                issues["bad_bbox"] += 1
                dropped.append([ref, "bad_bbox"])
            else:
                xmin, ymin, xmax, ymax = corners
                boxes.append([ref, xmin - 1.0, ymin - 1.0, xmax, ymax, label_of[label], difficult])
        files[rel] = {"size": entry["size"], "ref": "object", "boxes": boxes, "dropped": dropped}
    return BoxAnnotations("voc", class_names, None, files, tuple(sorted(missing.items())), invalid,
                          dict(issues))


def _voc_objects(root) -> list[tuple]:
    """(position from 1, name, [xmin, ymin, xmax, ymax] or None, difficult) of each <object>, in order.

    Only the annotation's own <object> elements: a <part> inside one (VOC's
    person layout) is not a box of the image.
    """
    objects = []
    for k, obj in enumerate(root.findall("object"), start=1):
        label = (obj.findtext("name") or "").strip()
        box = obj.find("bndbox")
        corners = None if box is None else _finite(box.findtext(t) for t in ("xmin", "ymin", "xmax", "ymax"))
        try:
            difficult = 1 if float(obj.findtext("difficult") or 0) else 0
        except ValueError:
            difficult = 0
        objects.append((k, label, corners, difficult))
    return objects


def _voc_image(index: _Index, stem: str, tag_name: str, name: str, source: str, issues) -> str | None:
    """The listed image of a VOC XML file's stem; None when there is none or the stem is ambiguous."""
    found = index.by_stem.get(stem, [])
    if len(found) > 1:
        by_tag = [p for p in found if posixpath.basename(p) == posixpath.basename(tag_name)]
        if len(by_tag) != 1:
            issues["ambiguous_image"] += 1
            _LOG.warning("--annotations %s: %s could annotate any of %s (the same stem); ignored. "
                         "Point --input_dir at the images' folder.", source, name, _some(found))
            return None
        found = by_tag
    return found[0] if found else None


def _read_annotations(path: str, listed: Sequence[str]) -> BoxAnnotations:
    """Reads --annotations: a COCO JSON file, or a folder of VOC XML files."""
    if not exists(path):
        raise FileNotFoundError(f"--annotations {path!r} does not exist.")
    if _is_file(path):
        return read_coco(read_bytes(path), path, listed)
    found, _ = _listing.list_input(path)
    xmls = [f for f in found if f.rel_path.lower().endswith(".xml")]
    if not xmls:
        raise ValueError(f"--annotations {path!r} is a folder without Pascal VOC XML files (*.xml); "
                         "give a COCO instances JSON file or a folder of VOC XML files.")
    # Sorted by relative path (the listing's order): the first of two XMLs of one image wins.
    return read_voc([(f.rel_path, read_bytes(f.path)) for f in xmls], path, listed)


def _is_file(path: str) -> bool:
    if _listing.is_local(path):
        return os.path.isfile(path)
    return path.lower().endswith(".json")


# --------------------------------------------------------------------------
# Planning.


def plan_targets(config: ConversionConfig, files, problems, csv_text: str | None):
    """The labels CSV's mapping and the per-file targets of a conversion.

    Args:
      config: The conversion's options (`annotations`, `labels_csv`, `class_names`).
      files, problems: The listing.
      csv_text: The labels CSV's text, or None without one.

    Returns:
      (labels_csv for `plan.make_plan` or None, `plan.PlanTargets` or None
      when the conversion has no targets beyond one class).

    Raises:
      ValueError, FileNotFoundError: For bad --annotations or labels CSV.
    """
    table = None
    labels_csv = None
    if csv_text is not None:
        table = read_targets_csv(csv_text, config.labels_csv)
        labels_csv = _plan.read_labels_csv(csv_text, config.labels_csv) if table is None else table.labels_csv()
    annotations = config.annotations
    if table is None and not annotations:
        return labels_csv, None
    listed = [f.rel_path for f in files] + [p.rel_path for p in problems]
    values: dict[str, dict] = collections.defaultdict(dict)
    rejects: dict[str, tuple[str, str]] = {}
    section: dict[str, Any] = {}
    class_names = None
    missing = []
    kinds = []
    members = None
    if annotations:
        boxes = _read_annotations(annotations, listed)
        kinds.append(_BOXES)
        for rel, entry in boxes.files.items():
            values[rel][_BOXES] = entry
        for rel, message in boxes.invalid.items():
            rejects[rel] = ("bad_target", message)
        missing = [_listing.Problem(rel, "missing_file", message) for rel, message in boxes.missing]
        issues = dict(boxes.issues)
        if missing:
            issues["missing_file"] = len(missing)
        section[_BOXES] = {
            "format": boxes.format, "source": annotations, "class_names": list(boxes.class_names),
            "category_ids": None if boxes.category_ids is None else list(boxes.category_ids),
            "issues": dict(sorted(issues.items())),
        }
        members = set(boxes.files) | set(boxes.invalid)
        _LOG.info("Read %s boxes of %d classes for %s images from --annotations %s (%s)",
                  f"{sum(len(e['boxes']) for e in boxes.files.values()):,}", len(boxes.class_names),
                  f"{len(boxes.files):,}", annotations, boxes.format)
    if table is not None:
        if table.multi_label:
            kinds.append(_LABELS)
            found = {n for names, _, _ in table.rows.values() for n in names}
            class_names = tuple(config.class_names) if config.class_names else _plan.sorted_class_names(found)
            index = {name: i for i, name in enumerate(class_names)}
            for rel, (names, _, _) in table.rows.items():
                unknown = sorted(set(names) - set(index))
                if unknown:
                    rejects[rel] = ("unknown_class", f"classes {unknown} are not in --class_names")
                else:
                    values[rel][_LABELS] = sorted(index[n] for n in names)
            section[_LABELS] = {}
        if table.target_length is not None:
            kinds.append(_TARGET)
            for rel, (_, _, numbers) in table.rows.items():
                why = _bad_numbers(numbers)
                if why is not None:
                    rejects.setdefault(rel, ("bad_target", f"--labels_csv {config.labels_csv}: {why}"))
                else:
                    values[rel][_TARGET] = list(numbers)
            section[_TARGET] = {"length": table.target_length}
    kinds = tuple(sorted(kinds))
    # Files without a value of every kind (not in the CSV, say) stay out of `values`: the plan skips them.
    encoded = {rel: _dumps(v) for rel, v in values.items() if rel not in rejects and len(v) == len(kinds)}
    return labels_csv, _plan.PlanTargets(
        kinds=kinds, values=encoded,
        source="the annotations" if members is not None else None,
        missing=tuple(missing), rejects=rejects, class_names=class_names, section=section,
    )


# --------------------------------------------------------------------------
# Writing: one record's target features.


class RecordTargets(NamedTuple):
    """The target features of one record, and what was done to its boxes.

    Attributes:
      extra: Feature key to values (`schemas.ImageRecord.extra`).
      actions: Box actions for normalized.jsonl (BOX_ACTIONS), or ().
      details: Their details (normalized.jsonl's details['boxes']), or None.
      issues: Dataset-level issue of each box clipped or dropped here.
    """

    extra: dict
    actions: tuple[str, ...]
    details: dict | None
    issues: tuple[str, ...]


def record_targets(targets: str, image, raw_frame: tuple[int, int, int] | None, name: str) -> RecordTargets:
    """The target features of a record of the validated `image`, from its file's planned targets.

    Args:
      targets: The file's targets (`PlanTargets.values`).
      image: The `imaging.ValidImage` stored (its size, actions, details).
      raw_frame: (EXIF orientation, raw width, raw height) of the file when
        the validator turned it upright (`imaging.boxes.raw_frame`), else None.
      name: The file's relative path, for messages.

    Raises:
      ImageRejected: 'bad_target' when the annotation's image size is neither
        the file's raw nor its upright size.
    """
    values = json.loads(targets)
    extra = {}
    actions, details, issues = (), None, ()
    if _BOXES in values:
        box_extra, actions, details, issues = _record_boxes(values[_BOXES], image, raw_frame, name)
        extra.update(box_extra)
    if _LABELS in values:
        extra[schemas.LABELS.key] = tuple(values[_LABELS])
    if _TARGET in values:
        extra[schemas.TARGET.key] = tuple(values[_TARGET])
    return RecordTargets(extra, actions, details, issues)


def _record_boxes(entry: dict, image, raw_frame, name: str):
    # The upright size at full scale (before --max_side): what the annotation may give.
    original = (image.details or {}).get("original")
    upright = (int(original[1]), int(original[0])) if original else (image.width, image.height)
    if "exif_transpose" in image.actions:
        if raw_frame is None:
            raise ImageRejected("bad_target", f"{name}: the photo was turned upright, but its raw frame "
                                "could not be read to turn its boxes with it")
        orientation, raw_w, raw_h = raw_frame
        raw = (raw_w, raw_h)
        upright = _boxes.upright_size(raw_w, raw_h, orientation)
    else:
        orientation, raw = 1, upright
    size = tuple(entry["size"]) if entry["size"] else None
    frame = _boxes.annotation_frame(size, raw, orientation)
    if frame is None:
        raise ImageRejected("bad_target", (
            f"{name}: the annotation's image size {size[0]}x{size[1]} is neither the photo's raw "
            f"size {raw[0]}x{raw[1]} nor its upright size {upright[0]}x{upright[1]} (width x height)"))
    fw, fh = raw if frame == "raw" else upright
    ref = entry.get("ref", "box")
    kept, clipped, dropped, issues = [], [], [], []
    for r, reason in entry["dropped"]:
        dropped.append({ref: r, "reason": reason})
    for r, x0, y0, x1, y1, label, crowd in entry["boxes"]:
        box = (x0, y0, x1, y1)
        inside = _boxes.clip_box(box, fw, fh)
        if _boxes.is_empty(inside):
            dropped.append({ref: r, "reason": "zero_area", "box": list(box)})
            issues.append("zero_area")
            continue
        if inside != box:
            clipped.append({ref: r, "from": list(box), "to": list(inside)})
            issues.append("clipped")
        if frame == "raw" and orientation != 1:
            inside = _boxes.orient_box(inside, orientation, fw, fh)
        kept.append((_boxes.normalise_box(inside, upright[0], upright[1]), label, crowd))
    extra = {
        schemas.BBOX_XMIN.key: tuple(b[0] for b, _, _ in kept),
        schemas.BBOX_YMIN.key: tuple(b[1] for b, _, _ in kept),
        schemas.BBOX_XMAX.key: tuple(b[2] for b, _, _ in kept),
        schemas.BBOX_YMAX.key: tuple(b[3] for b, _, _ in kept),
        schemas.BBOX_LABEL.key: tuple(label for _, label, _ in kept),
        schemas.BBOX_IS_CROWD.key: tuple(crowd for _, _, crowd in kept),
    }
    actions, details = [], {}
    if clipped:
        actions.append("boxes_clipped")
        details["clipped"] = clipped
    if dropped:
        actions.append("boxes_dropped")
        details["dropped"] = dropped
    if orientation != 1:
        # Either way it is said: the boxes were turned with the photo, or were drawn upright.
        details["frame"] = frame
        details["orientation"] = orientation
        details["annotation_size"] = list(size) if size else None
        if frame == "raw" and entry["boxes"]:
            actions.append("boxes_exif_transpose")
    return extra, tuple(actions), (details or None), tuple(issues)


# --------------------------------------------------------------------------
# Counting, per shard, and the manifest's section.


class TargetCounts:
    """What one shard's records hold: boxes per class, images without boxes, images per class."""

    def __init__(self):
        self._boxes = collections.Counter()
        self._without_boxes = 0
        self._issues = collections.Counter()
        self._labels = collections.Counter()
        self._has_boxes = False
        self._has_labels = False

    def add(self, targets: RecordTargets) -> None:
        box_labels = targets.extra.get(schemas.BBOX_LABEL.key)
        if box_labels is not None:
            self._has_boxes = True
            self._boxes.update(box_labels)
            self._without_boxes += not box_labels
            self._issues.update(targets.issues)
        labels = targets.extra.get(schemas.LABELS.key)
        if labels is not None:
            self._has_labels = True
            self._labels.update(labels)

    def to_json(self) -> dict | None:
        """The shard's counts (`ShardResult.targets`); None when it holds no boxes or labels."""
        out = {}
        if self._has_boxes:
            out[_BOXES] = {"counts": _as_list(self._boxes), "images_without_boxes": self._without_boxes,
                            "issues": dict(sorted(self._issues.items()))}
        if self._has_labels:
            out[_LABELS] = {"counts": _as_list(self._labels)}
        return out or None


def _as_list(counter: Mapping[int, int], length: int = 0) -> list[int]:
    n = max([length, *(k + 1 for k in counter)])
    return [counter.get(k, 0) for k in range(n)]


def targets_section(base: Mapping[str, Any], shards, splits: Sequence[str], num_classes: int) -> dict:
    """The manifest's `targets` section (`schemas.TARGETS_SECTION`).

    Args:
      base: The planned, dataset-level part (`PlanTargets.section`).
      shards: The `ShardResult`s (their `split` and `targets`).
      splits: Every split's name.
      num_classes: Entries of the labels counts (the manifest's class_names).
    """
    section = json.loads(json.dumps(base))  # A deep copy of plain values.
    per_split = {split: [s.targets for s in shards if s.split == split and s.targets] for split in splits}
    if _BOXES in section:
        boxes = section[_BOXES]
        width = len(boxes["class_names"])
        issues = collections.Counter(boxes.get("issues", {}))
        boxes["counts"], boxes["images_without_boxes"] = {}, {}
        for split in sorted(splits):
            parts = [t[_BOXES] for t in per_split[split] if _BOXES in t]
            boxes["counts"][split] = _summed([p["counts"] for p in parts], width)
            boxes["images_without_boxes"][split] = sum(p["images_without_boxes"] for p in parts)
            for p in parts:
                issues.update(p["issues"])
        boxes["issues"] = dict(sorted(issues.items()))
    if _LABELS in section:
        section[_LABELS]["counts"] = {
            split: _summed([t[_LABELS]["counts"] for t in per_split[split] if _LABELS in t], num_classes)
            for split in sorted(splits)
        }
    return section


def _summed(lists, width: int) -> list[int]:
    out = [0] * max([width, *map(len, lists)])
    for counts in lists:
        for k, n in enumerate(counts):
            out[k] += n
    return out
