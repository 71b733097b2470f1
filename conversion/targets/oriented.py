"""The oriented boxes kind (--annotations with --boxes oriented), one row of `conversion.targets.TARGETS`.

Remote-sensing detection (DOTA, DIOR-R, Ultralytics' `-obb` models) labels
objects with oriented boxes; this kind keeps each box's 4 corners
(`schemas.OBB_FEATURES`), where the boxes kind keeps an axis-aligned extent.

- Planning (`_plan`, on the driver): --annotations in one of `FORMATS`: a
  CVAT for images XML file (`conversion.targets.cvat`, its `<box>`es with
  their `rotation`), a DOTA labelTxt folder (`conversion.targets.dota`, told
  apart by content), or Ultralytics YOLO-OBB labels (`conversion.targets.yolo`:
  a data.yaml or a labels folder). COCO, VOC and LabelMe hold no oriented
  boxes: refused. Matching, splits, --append's class order and the
  annotation files inside --input_dir are the boxes kind's
  (`conversion.targets.boxes.plan_annotations`).
- Writing (`_record`, per record): each box's corners, in the annotation's
  order, turned upright with the photo when drawn on its raw frame
  (`imaging.boxes.orient_point`) and normalised to the stored image. Corners
  are never clipped (clipping a turned rectangle makes it no rectangle; DOTA
  has boxes across the image's edge): a box with a corner outside the image
  is kept and listed ('oriented_boxes_outside' in normalized.jsonl); a box
  whose corners' extent misses the image, or of no area, is dropped
  ('oriented_boxes_dropped': 'outside_image', 'zero_area'), as the boxes
  kind drops them.
- The manifest: boxes per class and split, images without boxes, issues.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import schemas
from conversion.targets import boxes as _boxes_kind
from conversion.targets import yolo as _yolo
from conversion.targets._counts import BoxCounts, box_description, box_merge, box_section
from conversion.targets.boxes import BoxFormat
from conversion.targets.kind import PlannedKind, RecordPart, TargetKind, TargetRequest
from imaging import boxes as _geometry

__all__ = ["KIND", "OBB_ACTIONS", "FORMATS", "polygon_area"]

# Per-record actions on oriented boxes, listed in normalized.jsonl.
OBB_ACTIONS = ("oriented_boxes_outside", "oriented_boxes_dropped", "oriented_boxes_exif_transpose")
# The kind's key (`schemas.TARGET_KINDS`): the one whose features are the oriented boxes'.
NAME = next(kind for kind, specs in schemas.TARGET_KINDS.items() if specs == schemas.OBB_FEATURES)
# Where a planned box's label is: [ref, x1, y1, x2, y2, x3, y3, x4, y4, label, difficult].
_LABEL_AT = 9


def _plan(request: TargetRequest) -> PlannedKind | None:
    if not request.config.annotations or getattr(request.config, "boxes", "axis") != "oriented":
        return None
    return _boxes_kind.plan_annotations(request, FORMATS, NAME, _LABEL_AT)


def _read_cvat(path: str, found, request: TargetRequest):
    from conversion.files import read_bytes
    from conversion.targets import cvat as _cvat

    xml = _boxes_kind.cvat_xml(path, not found, found)
    return _cvat.read_cvat(read_bytes(xml), xml, request.listed, class_names=request.config.class_names,
                           oriented=True), None


def _read_dota(path: str, found, request: TargetRequest):
    from conversion.targets import dota as _dota

    return _dota.read_dota(found, path, request.listed, class_names=request.config.class_names), None


def _read_yolo_obb(path: str, found, request: TargetRequest):
    config = request.config
    return _yolo.read_yolo(path, config.input_dir, [f.rel_path for f in request.files],
                           class_names=config.class_names, found=found or None, listed=request.listed,
                           oriented=True)


def _is_dota(path: str, is_file: bool, found) -> bool:
    from conversion.targets import dota as _dota

    return not is_file and _dota.looks_like_dota(found)


def _is_yolo(path: str, is_file: bool, found) -> bool:
    if is_file:
        return _yolo.is_data_yaml(path)
    return any(f.rel_path.lower().endswith(".txt") for f in found)


def _refuse(path: str, found, request: TargetRequest):
    raise ValueError(f"--boxes oriented reads oriented boxes from a CVAT for images annotations.xml, a DOTA "
                     f"labelTxt folder, or Ultralytics YOLO-OBB labels (a data.yaml or a labels folder). "
                     f"Received: --annotations {path}, none of these (COCO, Pascal VOC and LabelMe files "
                     "hold axis-aligned boxes: drop --boxes oriented)")


# The formats, tried in this order: CVAT's XML (as the boxes kind finds it), a folder of DOTA's lines,
# YOLO-OBB's data.yaml or labels folder; anything else is refused.
FORMATS: tuple[BoxFormat, ...] = (
    BoxFormat("cvat", lambda path, is_file, found: _boxes_kind.cvat_xml(path, is_file, found) is not None,
              _read_cvat, takes_class_names=True),
    BoxFormat("dota", _is_dota, _read_dota, takes_class_names=True),
    BoxFormat(_yolo.YOLO_OBB_FORMAT, _is_yolo, _read_yolo_obb, takes_class_names=True),
    BoxFormat("none", lambda path, is_file, found: True, _refuse),
)


def polygon_area(points: Sequence[tuple[float, float]]) -> float:
    """The area of a polygon of (x, y) points (the shoelace formula), whatever its winding."""
    n = len(points)
    twice = sum(points[i][0] * points[(i + 1) % n][1] - points[(i + 1) % n][0] * points[i][1] for i in range(n))
    return abs(twice) / 2


def _record(entry: dict, image, raw_frame, name: str) -> RecordPart:
    frame, orientation, size, (fw, fh), upright = _boxes_kind.annotation_frame_of(entry, image, raw_frame, name)
    ref = entry.get("ref", "box")
    scale = (fw, fh) if entry.get("units") == "fraction" else (1.0, 1.0)
    kept, outside, dropped, issues = [], [], [], []
    for r, reason in entry["dropped"]:
        dropped.append({ref: r, "reason": reason})
    for r, *rest in entry["boxes"]:
        values, label, difficult = rest[:8], rest[8], rest[9]
        # YOLO-OBB's fractions of the frame, in its pixels, as the other formats give them.
        points = [(x * scale[0], y * scale[1]) for x, y in zip(values[0::2], values[1::2])]
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        extent = (min(xs), min(ys), max(xs), max(ys))
        corners = [v for p in points for v in p]
        if not polygon_area(points) > 0:
            dropped.append({ref: r, "reason": "zero_area", "corners": corners})
            issues.append("zero_area")
            continue
        if _geometry.is_empty(_geometry.clip_box(extent, fw, fh)):
            dropped.append({ref: r, "reason": "outside_image", "corners": corners})
            issues.append("outside_image")
            continue
        if _geometry.clip_box(extent, fw, fh) != extent:
            outside.append({ref: r, "corners": corners})
            issues.append("corners_outside")
        if frame == "raw" and orientation != 1:
            points = [_geometry.orient_point(x, y, orientation, fw, fh) for x, y in points]
        kept.append(([v for x, y in points for v in (x / upright[0], y / upright[1])], label, difficult))
    extra = {
        schemas.OBB_CORNERS.key: tuple(v for c, _, _ in kept for v in c),
        schemas.OBB_LABEL.key: tuple(label for _, label, _ in kept),
        schemas.OBB_DIFFICULT.key: tuple(difficult for _, _, difficult in kept),
    }
    actions, details = [], {}
    if outside:
        actions.append("oriented_boxes_outside")
        details["outside"] = outside
    if dropped:
        actions.append("oriented_boxes_dropped")
        details["dropped"] = dropped
    if orientation != 1:
        details["frame"] = frame
        details["orientation"] = orientation
        details["annotation_size"] = list(size) if size else None
        if frame == "raw" and entry["boxes"]:
            actions.append("oriented_boxes_exif_transpose")
    return RecordPart(extra, tuple(actions), details or None, tuple(issues))


def _verify(section, num_classes: int):
    names = section.get("class_names")
    if not isinstance(names, list):
        return None, f"the manifest's targets.{NAME} has no class_names list"
    return (lambda values, height, width, tf: check_oriented_boxes(values, len(names))), None


def check_oriented_boxes(values, num_classes: int) -> str | None:
    """The first problem of one record's oriented boxes: list lengths, finite corners, labels, difficult."""
    corners, labels, difficult = (values[spec.key] for spec in schemas.OBB_FEATURES)
    if len(corners) != 8 * len(labels) or len(labels) != len(difficult):
        return (f"{len(corners)} corner numbers, {len(labels)} labels and {len(difficult)} difficult flags: "
                "8 numbers, a label and a flag per oriented box")
    for i in range(len(labels)):
        box = list(corners[8 * i:8 * i + 8])
        if not all(math.isfinite(v) for v in box):
            return f"oriented box {i} {box} has a corner that is not a finite number"
        if not 0 <= labels[i] < num_classes:
            return (f"oriented box {i} has {schemas.OBB_LABEL.key} {labels[i]}, outside [0, {num_classes}) "
                    f"of the manifest's targets.{NAME}.class_names")
        if difficult[i] not in (0, 1):
            return f"oriented box {i} has {schemas.OBB_DIFFICULT.key} {difficult[i]}, not 0 or 1"
    return None


KIND = TargetKind(name=NAME, flag="--boxes oriented", plan=_plan, record=_record,
                  counter=functools.partial(BoxCounts, schemas.OBB_LABEL.key),
                  section=functools.partial(box_section, NAME), verify=_verify,
                  describe=functools.partial(box_description, "oriented box"), merge=box_merge)
