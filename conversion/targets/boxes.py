"""The boxes kind: COCO, CVAT, VOC, LabelMe or YOLO boxes (--annotations), one row of `conversion.targets.TARGETS`.

- Planning (`_plan`, on the driver): reads --annotations in one of the box
  formats (`FORMATS`, a row each): a COCO instances JSON file
  (`conversion.targets.coco`), a CVAT for images XML file
  (`conversion.targets.cvat`), a folder of VOC XML files
  (`conversion.targets.voc`), a folder of LabelMe JSON files
  (`conversion.targets.labelme`) or YOLO labels (`conversion.targets.yolo`:
  a labels folder or a data.yaml), and gives each annotated file its boxes, in
  pixels of the frame they were drawn on (YOLO's: fractions of it); the
  annotations name the dataset's files (a file they do not name is skipped,
  'no_label'; YOLO's: every image, a background one without labels).
- Writing (`_record`, per record): once the image is validated, its boxes are
  clipped to the frame they were drawn on, turned upright with the photo
  when drawn on its raw frame (`imaging.boxes`), normalised to the stored
  image and returned as the record's features; what was done to them goes
  to normalized.jsonl (`BOX_ACTIONS`).
- The manifest: boxes per class and split, images without boxes, issues.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import posixpath
from collections.abc import Callable, Sequence
from typing import NamedTuple

import schemas
from conversion import listing as _listing
from conversion.files import exists, read_bytes, read_many
from conversion.targets import yolo as _yolo
from conversion.targets._box_files import BoxAnnotations
from conversion.targets._counts import BoxCounts, appended_order, box_description, box_merge, box_section
from conversion.targets.kind import PlannedKind, RecordPart, TargetKind, TargetRequest
from imaging import ImageRejected
from imaging import boxes as _boxes

__all__ = ["KIND", "BOX_ACTIONS", "FORMATS", "BoxFormat", "plan_annotations", "read_annotations", "Frame",
           "annotation_frame_of", "cvat_xml"]

_LOG = logging.getLogger("shardsmith.convert")
# Per-record actions on boxes, listed in normalized.jsonl.
BOX_ACTIONS = ("boxes_clipped", "boxes_dropped", "boxes_exif_transpose")
# The kind's key (`schemas.TARGET_KINDS`): the one whose features are the boxes'.
NAME = next(kind for kind, specs in schemas.TARGET_KINDS.items() if specs == schemas.BOX_FEATURES)


def _plan(request: TargetRequest) -> PlannedKind | None:
    if not request.config.annotations or getattr(request.config, "boxes", "axis") != "axis":
        return None
    return plan_annotations(request, FORMATS, NAME, _LABEL_AT)


# Where a planned box's label is: [ref, xmin, ymin, xmax, ymax, label, is_crowd].
_LABEL_AT = 5


def plan_annotations(request: TargetRequest, formats, name: str, label_at: int) -> PlannedKind:
    """--annotations read in the first of `formats` that accepts it, planned as kind `name`.

    Args:
      request: The kind's `TargetRequest`.
      formats: `BoxFormat` rows, tried in order.
      name: The kind's key (the held dataset's section of it, with --append).
      label_at: Where a planned box's label is in its list (renumbered with --append).
    """
    annotations = request.config.annotations
    form, (boxes, splits) = read_annotations(annotations, request, formats)
    held = request.held_section(name)
    if held is not None:
        boxes = _in_held_order(boxes, held, label_at)
    missing = tuple(_listing.Problem(rel, "missing_file", message) for rel, message in boxes.missing)
    issues = dict(boxes.issues)
    if missing:
        issues["missing_file"] = len(missing)
    section = {
        "format": boxes.format, "source": annotations, "class_names": list(boxes.class_names),
        "category_ids": None if boxes.category_ids is None else list(boxes.category_ids),
        "issues": dict(sorted(issues.items())),
    }
    _LOG.info("Read %s boxes of %d classes for %s images from --annotations %s (%s)",
              f"{sum(len(e['boxes']) for e in boxes.files.values()):,}", len(boxes.class_names),
              f"{len(boxes.files):,}", annotations, boxes.format)
    values = dict(boxes.files)
    if not getattr(request.config, "annotation_masks", False):
        # Each box's region travels only to be drawn (--annotation_masks, `conversion.annotation_masks`):
        # without it, the planned targets stay as they were.
        values = {rel: {k: v for k, v in entry.items() if k != "regions"} for rel, entry in values.items()}
    drawn = request.config.annotations_frame
    if drawn == "auto":
        drawn = boxes.frame
    if drawn != "auto":
        # Only where given: the default's planned targets stay as they were.
        values = {rel: {**entry, "frame": drawn} for rel, entry in values.items()}
    own = _annotation_files(annotations, boxes, request.files)
    return PlannedKind(
        values=values, section=section,
        rejects={rel: ("bad_target", message) for rel, message in boxes.invalid.items()},
        missing=missing, source="the annotations", splits=splits,
        takes_class_names=form.takes_class_names and request.config.class_names is not None,
        files=[f for f in request.files if f.rel_path not in own] if own else None,
        problems=[*request.problems, *(_listing.Problem(rel, "annotation_file", why) for rel, why in sorted(own.items()))]
        if own else None,
    )


# What the files of annotations are named (never images): VOC's XML, COCO's, LabelMe's and CVAT's
# JSON/XML, YOLO's label files, data.yaml and classes.txt, and Ultralytics' label caches.
_ANNOTATION_SUFFIXES = (".xml", ".json", ".txt", ".yaml", ".yml", ".cache")


def _annotation_files(annotations: str, boxes: BoxAnnotations, files) -> dict[str, str]:
    """Relative path -> why, of the listed inputs that are the annotations' own files, not images.

    Annotations often lie inside --input_dir (a YOLO dataset's `labels/` beside `images/`, LabelMe's
    JSON beside each image, a VOC or COCO export's root): they are skipped as 'annotation_file',
    not as images the annotations do not name ('no_label').
    """
    named = set(boxes.files) | set(boxes.invalid)
    given = _listing.full_path(annotations)
    sources = {_listing.full_path(p) for p in boxes.sources}
    # Ultralytics caches a labels folder's reading beside it: `labels/train.cache` for `labels/train/`.
    caches = {posixpath.dirname(p) + ".cache" for p in sources}
    own = {}
    for f in files:
        if f.rel_path in named:
            continue
        path = _listing.full_path(f.path)
        if path == given or path in sources or path in caches:
            own[f.rel_path] = f"a file of --annotations {annotations} ({boxes.format})"
        elif path.startswith(given + "/") and f.rel_path.lower().endswith(_ANNOTATION_SUFFIXES):
            own[f.rel_path] = f"in the --annotations folder {annotations} ({boxes.format})"
    return own


def _in_held_order(boxes: BoxAnnotations, held, label_at: int) -> BoxAnnotations:
    """With --append: the boxes' labels renumbered so that the dataset's box classes keep their indices.

    The held classes come first, in their order, then this run's new ones in
    the annotations' order; a held class the new annotations lack keeps its
    index (and its COCO category id).
    """
    held_names = list(held.get("class_names") or ())
    names, remap = appended_order(held_names, boxes.class_names)
    if names == tuple(boxes.class_names):
        return boxes
    ids = None
    if boxes.category_ids is not None:
        held_ids = list(held.get("category_ids") or [None] * len(held_names))
        ids = held_ids + [None] * (len(names) - len(held_ids))
        for i, cid in zip(remap, boxes.category_ids):
            ids[i] = cid
        ids = tuple(ids)
    files = {}
    for rel, entry in boxes.files.items():
        entry = dict(entry)
        entry["boxes"] = [[*b[:label_at], remap[b[label_at]], *b[label_at + 1:]] for b in entry["boxes"]]
        files[rel] = entry
    return dataclasses.replace(boxes, class_names=names, category_ids=ids, files=files)


class BoxFormat(NamedTuple):
    """One format --annotations may be in: a row of `FORMATS`.

    Attributes:
      name: The manifest's targets.boxes.format.
      accepts: (path, whether it is a file, the files of a folder: `listing.InputFile`s,
        () for a file) -> whether --annotations is in this format.
      read: (path, the files of a folder, `TargetRequest`) -> (`BoxAnnotations`,
        relative path -> split where the annotations give each image its split, else None).
      takes_class_names: Whether --class_names names this format's box classes
        (read passes it on), not the images' classes.
    """

    name: str
    accepts: Callable[[str, bool, Sequence], bool]
    read: Callable[[str, Sequence, TargetRequest], tuple[BoxAnnotations, dict | None]]
    takes_class_names: bool = False


def _read_coco(path: str, found, request: TargetRequest):
    # Their readers (voc's XML parser, yolo's YAML) are imported with --annotations only: not on every run.
    from conversion.targets import coco as _coco

    return _coco.read_coco(read_bytes(path), path, request.listed), None


def _read_yolo(path: str, found, request: TargetRequest):
    config = request.config
    return _yolo.read_yolo(path, config.input_dir, [f.rel_path for f in request.files],
                           class_names=config.class_names, found=found or None, listed=request.listed)


def _read_dota(path: str, found, request: TargetRequest):
    """DOTA's oriented boxes as axis boxes: each the extent of its corners ('bbox_from_rotation')."""
    from conversion.targets import dota as _dota

    read = _dota.read_dota(found, path, request.listed, class_names=request.config.class_names)
    files = {}
    for rel, entry in read.files.items():
        boxes = [[r, min(c[0::2]), min(c[1::2]), max(c[0::2]), max(c[1::2]), label, difficult]
                 for r, *c, label, difficult in entry["boxes"]]
        files[rel] = {**entry, "boxes": boxes}
    issues = dict(read.issues)
    count = sum(len(e["boxes"]) for e in files.values())
    if count:
        issues["bbox_from_rotation"] = count
    return dataclasses.replace(read, files=files, issues=issues), None


def _is_dota(path: str, is_file: bool, found) -> bool:
    from conversion.targets import dota as _dota

    return not is_file and _dota.looks_like_dota(found)


def _read_voc(path: str, found, request: TargetRequest):
    from conversion.targets import voc as _voc

    # Sorted by relative path (the listing's order): the first of two XMLs of one image wins.
    return _voc.read_voc(_documents([f for f in found if _is_xml(f)]), path, request.listed), None


def _read_cvat(path: str, found, request: TargetRequest):
    from conversion.targets import cvat as _cvat

    xml = cvat_xml(path, not found, found)
    return _cvat.read_cvat(read_bytes(xml), xml, request.listed, class_names=request.config.class_names), None


def cvat_xml(path: str, is_file: bool, found) -> str | None:
    """CVAT's XML file: --annotations itself, or the annotations.xml of the unpacked export it holds, alone."""
    if is_file:
        return path if path.lower().endswith(".xml") else None
    xml = [f for f in found if _is_xml(f)]
    return xml[0].path if len(xml) == 1 and xml[0].rel_path == "annotations.xml" else None


def _read_labelme(path: str, found, request: TargetRequest):
    from conversion.targets import labelme as _labelme

    config = request.config
    return _labelme.read_labelme(_documents([f for f in found if _is_json(f)]), path, config.input_dir,
                                 request.listed, class_names=config.class_names), None


def _documents(found) -> list[tuple[str, bytes | OSError]]:
    """(relative path, bytes or the OSError of its read) of each listed file, in their order, read
    on threads (`files.read_many`: a request each on cloud storage)."""
    return list(zip([f.rel_path for f in found], read_many([f.path for f in found])))


def _is_xml(f) -> bool:
    return f.rel_path.lower().endswith(".xml")


def _is_json(f) -> bool:
    return f.rel_path.lower().endswith(".json")


def _is_labels_txt(f) -> bool:
    return f.rel_path.lower().endswith(".txt") and posixpath.basename(f.rel_path) != "classes.txt"


def _mostly_json(found) -> bool:
    # A folder of both: each format has a file per image, so the more numerous ones are the labels.
    return sum(map(_is_json, found)) > sum(map(_is_labels_txt, found))


# The formats, tried in this order: a YAML file is YOLO's data.yaml, an XML file CVAT's, any other file
# COCO's JSON; a folder whose one XML file is annotations.xml is CVAT's export, one with other XML files
# VOC's, else one with more JSON files than text files LabelMe's, else one whose text files hold DOTA's
# lines (a class name after 8 numbers) DOTA's labelTxt, else one with text files YOLO's labels.
FORMATS: tuple[BoxFormat, ...] = (
    BoxFormat("cvat", lambda path, is_file, found: cvat_xml(path, is_file, found) is not None, _read_cvat,
              takes_class_names=True),
    BoxFormat("coco", lambda path, is_file, found: is_file and not _yolo.is_data_yaml(path), _read_coco),
    BoxFormat("voc", lambda path, is_file, found: not is_file and any(map(_is_xml, found)), _read_voc),
    BoxFormat("labelme", lambda path, is_file, found: not is_file and _mostly_json(found), _read_labelme,
              takes_class_names=True),
    BoxFormat("dota", _is_dota, _read_dota, takes_class_names=True),
    BoxFormat(_yolo.YOLO_FORMAT, lambda path, is_file, found: _yolo.is_data_yaml(path) if is_file
              else any(f.rel_path.lower().endswith(".txt") for f in found), _read_yolo, takes_class_names=True),
)


def read_annotations(path: str, request: TargetRequest, formats: Sequence[BoxFormat] = FORMATS,
                     ) -> tuple[BoxFormat, tuple[BoxAnnotations, dict | None]]:
    """Reads --annotations in the first of `formats` that accepts it: (that row, what its `read` returns).

    Raises:
      ValueError: When none accepts it (the last row may raise its own, saying what is read).
    """
    is_file = _is_file(path)
    # On object stores (gs://) a folder is only a prefix of object names: no object has its
    # name, so it exists where its listing finds files.
    prefix = not is_file and not _listing.is_local(path)
    if not prefix and not exists(path):
        raise FileNotFoundError(f"--annotations {path!r} does not exist.")
    try:
        found = () if is_file else tuple(_listing.list_input(path)[0])
    except FileNotFoundError:
        if not prefix:
            raise
        raise FileNotFoundError(f"--annotations {path!r} does not exist or is empty.") from None
    for form in formats:
        if form.accepts(path, is_file, found):
            return form, form.read(path, found, request)
    raise ValueError(f"--annotations {path!r} is a folder without Pascal VOC XML files (*.xml), LabelMe JSON "
                     "files (*.json) or YOLO label files (*.txt); give a COCO instances JSON file, a CVAT "
                     "annotations.xml, a YOLO data.yaml or labels folder, or a folder of VOC XML or LabelMe "
                     "JSON files.")


def _is_file(path: str) -> bool:
    if _listing.is_local(path):
        return os.path.isfile(path)
    return path.lower().endswith((".json", ".yaml", ".yml", ".xml"))


class Frame(NamedTuple):
    """The frame a record's annotation was drawn on (`annotation_frame_of`).

    Attributes:
      frame: 'raw' or 'upright'.
      orientation: The photo's EXIF orientation (1 when it was not turned).
      size: The annotation's (width, height), or None.
      drawn: (width, height) of the frame drawn on, in pixels.
      upright: (width, height) of the upright photo at full scale.
    """

    frame: str
    orientation: int
    size: tuple | None
    drawn: tuple[int, int]
    upright: tuple[int, int]


def annotation_frame_of(entry: dict, image, raw_frame, name: str) -> Frame:
    """On which frame of the validated `image` a file's planned boxes `entry` were drawn.

    Raises:
      ImageRejected: 'bad_target' when the annotation's size fits neither frame, or the
        raw frame of a photo turned upright cannot be read.
    """
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
    drawn = entry.get("frame", "auto")
    frame = _boxes.annotation_frame(size, raw, orientation, drawn)
    if frame is None and drawn in ("raw", "upright"):
        want = raw if drawn == "raw" else upright
        raise ImageRejected("bad_target", (
            f"{name}: the annotation's image size {size[0]}x{size[1]} is not the photo's {drawn} size "
            f"{want[0]}x{want[1]} (width x height), as --annotations_frame {drawn} says"))
    if frame is None:
        raise ImageRejected("bad_target", (
            f"{name}: the annotation's image size {size[0]}x{size[1]} is neither the photo's raw "
            f"size {raw[0]}x{raw[1]} nor its upright size {upright[0]}x{upright[1]} (width x height)"))
    return Frame(frame, orientation, size, raw if frame == "raw" else upright, upright)


def _record(entry: dict, image, raw_frame, name: str) -> RecordPart:
    frame, orientation, size, (fw, fh), upright = annotation_frame_of(entry, image, raw_frame, name)
    ref = entry.get("ref", "box")
    if entry.get("units") == "fraction":
        # YOLO's fractions of the frame, in its pixels: clipped and counted as COCO's and VOC's are.
        entry = {**entry, "boxes": [[r, x0 * fw, y0 * fh, x1 * fw, y1 * fh, *rest]
                                    for r, x0, y0, x1, y1, *rest in entry["boxes"]]}
    kept, clipped, dropped, issues = [], [], [], []
    for r, reason in entry["dropped"]:
        dropped.append({ref: r, "reason": reason})
    for r, x0, y0, x1, y1, label, crowd in entry["boxes"]:
        box = (x0, y0, x1, y1)
        inside = _boxes.clip_box(box, fw, fh)
        if _boxes.is_empty(inside):
            # A box of some area that lies wholly outside the frame is no empty box: said apart.
            reason = "zero_area" if _boxes.is_empty(box) else "outside_image"
            dropped.append({ref: r, "reason": reason, "box": list(box)})
            issues.append(reason)
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
    return RecordPart(extra, tuple(actions), details or None, tuple(issues))


def _verify(section, num_classes: int):
    names = section.get("class_names")
    if not isinstance(names, list):
        return None, "the manifest's targets.boxes has no class_names list"
    return (lambda values, height, width, tf: _check_boxes(values, len(names))), None


def _check_boxes(values, num_box_classes: int) -> str | None:
    """The first problem of one record's boxes: list lengths, corners in [0, 1], labels, is_crowd."""
    columns = [values[spec.key] for spec in schemas.BOX_FEATURES]
    lengths = {spec.key: len(c) for spec, c in zip(schemas.BOX_FEATURES, columns)}
    if len(set(lengths.values())) > 1:
        return f"box lists of different lengths {lengths}"
    xmin, ymin, xmax, ymax, labels, crowd = columns
    for i, corners in enumerate(zip(xmin, ymin, xmax, ymax)):
        if not all(0.0 <= v <= 1.0 for v in corners):  # NaN fails too.
            return f"box {i} {list(corners)} (xmin, ymin, xmax, ymax) is outside [0, 1]"
        if corners[0] > corners[2] or corners[1] > corners[3]:
            return f"box {i} {list(corners)} (xmin, ymin, xmax, ymax) has a min above its max"
        if not 0 <= labels[i] < num_box_classes:
            return (f"box {i} has {schemas.BBOX_LABEL.key} {labels[i]}, outside [0, {num_box_classes}) "
                    "of the manifest's targets.boxes.class_names")
        if crowd[i] not in (0, 1):
            return f"box {i} has {schemas.BBOX_IS_CROWD.key} {crowd[i]}, not 0 or 1"
    return None


KIND = TargetKind(name=NAME, flag="--annotations", plan=_plan, record=_record,
                  counter=functools.partial(BoxCounts, schemas.BBOX_LABEL.key),
                  section=functools.partial(box_section, NAME), verify=_verify,
                  describe=functools.partial(box_description, "box"), merge=box_merge)
