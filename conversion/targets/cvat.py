"""CVAT for images 1.1 (--annotations annotations.xml): boxes of every shape, matched to the listed images.

CVAT's task, job and project exports write one `annotations.xml`: a
`<meta>` with the labels in their order (under `<task>`, `<job>` or
`<project>`), then an `<image name= width= height=>` per frame holding its
shapes. Each shape becomes a box:

- `<box xtl= ytl= xbr= ybr=>`, as it is; with `rotation=` (degrees about its
  centre), the extent of its rotated corners (counted 'bbox_from_rotation');
- `<polygon>`, `<polyline>`, `<points>` (`points="x1,y1;x2,y2;..."`): the
  extent of their points, as COCO's polygons are boxed (counted
  'bbox_from_segmentation');
- `<ellipse cx= cy= rx= ry=>` (with its rotation): the ellipse's extent;
- `<mask left= top= width= height=>`: the rectangle its RLE is cut to.

With --boxes oriented (`oriented=True`) each `<box>` is kept as its 4
corners instead (`rotated_box_corners`: top-left, top-right, bottom-right,
bottom-left of the unrotated box, turned clockwise on the image by `rotation`
degrees about its centre, as CVAT draws and exports it), a `<polygon>` of 4
points as those points in their order, and every other shape is dropped
('not_an_oriented_box').

A `<tag>` is a label of the whole image, no box (counted 'tag'); a
`<skeleton>` or `<cuboid>` is dropped ('unsupported_shape'). A shape that
cannot be read (a coordinate that is not a number, no label, a label not
among the classes) rejects its image ('bad_target', saying which shape and
what was wrong).

CVAT (since 2022, its pull request 4529) measures and shows each photo
upright by its EXIF orientation; older versions showed the raw frame: the
image's width and height tell them apart, and where they cannot (a square
photo, a photo turned by 180 degrees) the upright photo is taken.
"""

from __future__ import annotations

import collections
import logging
import math
import posixpath
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence

from conversion.targets._box_files import BoxAnnotations, Index, finite, size_of, some
from conversion.targets.labels_csv import normalise_rel

__all__ = ["CVAT_FORMAT", "read_cvat", "rotated_box_corners"]

_LOG = logging.getLogger("shardsmith.convert")
CVAT_FORMAT = "cvat"
# The frame of the boxes where --annotations_frame is 'auto' (`imaging.boxes.annotation_frame`).
FRAME = "auto_upright"
# Shapes boxed by the extent of their `points` attribute.
_POINT_SHAPES = ("polygon", "polyline", "points")
# Elements of an <image> that are no box: their count goes to the issues.
_UNSUPPORTED = ("skeleton", "cuboid")


def read_cvat(data: bytes, source: str, listed: Sequence[str], class_names=None,
              oriented: bool = False) -> BoxAnnotations:
    """Reads a CVAT for images 1.1 XML file and matches its images to the listed paths.

    Args:
      data: The XML file's bytes.
      source: --annotations, for messages.
      listed: Relative paths under --input_dir (files and problems).
      class_names: --class_names: the box classes in label order, in place of the file's labels.
      oriented: Keep boxes as their corners (--boxes oriented): each box
        [shape, x1, y1, ..., x4, y4, label, 0].

    Returns:
      The boxes, in pixels of the frame each image was drawn on, in the
      file's order of shapes.

    Raises:
      ValueError: When the file is not XML, or not a CVAT for images export.
    """
    root = _parse(data, source)
    images = root.findall("image")
    if not images and root.findall("track"):
        raise ValueError(f"--annotations {source} is a 'CVAT for video 1.1' export (tracks, no images): "
                         "export the task as 'CVAT for images 1.1'.")
    name = posixpath.basename(source.rstrip("/"))
    issues = collections.Counter()
    if root.findall("track"):
        issues["track"] += len(root.findall("track"))
        _LOG.warning("--annotations %s: %d <track> elements (CVAT for video) are not read; export the task "
                     "as 'CVAT for images 1.1' to keep them", source, len(root.findall("track")))
    names = _classes(root, images, class_names)
    label_of = {label: i for i, label in enumerate(names)}
    index = Index(listed)
    files, missing, invalid = {}, {}, {}
    for position, image in enumerate(images, start=1):
        image_name = image.get("name")
        if not image_name:
            issues["bad_image_entry"] += 1
            continue
        where = f"{name} <image name={image_name!r}>"
        rel = index.find(image_name)
        if rel is None:
            wanted = normalise_rel(image_name)
            missing.setdefault(wanted, f"{where} (image {position} of --annotations {source}) is not under "
                                       "--input_dir")
            continue
        if rel in files or rel in invalid:
            issues["duplicate_image"] += 1
            _LOG.warning("--annotations %s: %s names %s again; its shapes are ignored", source, where, rel)
            continue
        try:
            entry = _oriented_entry if oriented else _image_entry
            files[rel] = entry(image, where, label_of, class_names is not None, issues)
        except _Malformed as e:
            invalid[rel] = str(e)
    return BoxAnnotations(CVAT_FORMAT, names, None, files, tuple(sorted(missing.items())), invalid,
                          dict(issues), frame=FRAME)


class _Malformed(ValueError):
    """An image entry that cannot be read: its message names the image and what was wrong."""


def _parse(data: bytes, source: str):
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as e:
        raise ValueError(f"--annotations {source} is not valid XML ({e}).") from None
    if root.tag != "annotations":
        hint = " (a Pascal VOC file: give the folder of VOC XML files)" if root.tag == "annotation" else ""
        raise ValueError(f"--annotations {source} is not a CVAT for images 1.1 export: its root element is "
                         f"<{root.tag}>, not <annotations>{hint}.")
    return root


def _classes(root, images, class_names) -> tuple[str, ...]:
    """--class_names, else the labels of <meta> in their order, else the labels the shapes use, sorted."""
    if class_names is not None:
        return tuple(class_names)
    meta = root.find("meta")
    declared = []
    for owner in ("project", "task", "job"):
        labels = None if meta is None else meta.find(f"{owner}/labels")
        if labels is None:
            continue
        for label in labels.findall("label"):
            # A skeleton's points are labels of their own (with a <parent>): no box is theirs.
            label_name = (label.findtext("name") or "").strip()
            if label_name and not (label.findtext("parent") or "").strip():
                declared.append(label_name)
        break
    if declared:
        return tuple(dict.fromkeys(declared))
    used = {(shape.get("label") or "").strip() for image in images for shape in image
            if shape.tag != "tag" and shape.tag not in _UNSUPPORTED}
    return tuple(sorted(label for label in used if label))


def _image_entry(image, where: str, label_of: dict, given: bool, issues) -> dict:
    """{'size', 'ref', 'boxes', 'dropped'} of one <image>; raises `_Malformed` with what was wrong."""
    size = _image_size(image, where)
    boxes, dropped, regions = [], [], []
    for k, shape in enumerate(image, start=1):
        what = f"{where} shape {k} <{shape.tag}>"
        if shape.tag == "tag":
            issues["tag"] += 1
            continue
        if shape.tag in _UNSUPPORTED:
            issues["unsupported_shape"] += 1
            dropped.append([k, "unsupported_shape"])
            continue
        label = _label_index(shape, what, label_of, given)
        corners = _corners(shape, what, issues)
        if corners is None:
            issues["unsupported_shape"] += 1
            dropped.append([k, "unsupported_shape"])
            continue
        boxes.append([k, *corners, label, 0])
        regions.append(_region(shape, what))
    return {"size": size, "ref": "shape", "boxes": boxes, "dropped": dropped, "regions": regions}


def _image_size(image, where: str):
    """An <image>'s (width, height), None when it gives neither; raises `_Malformed` for a bad one."""
    if image.get("width") is None and image.get("height") is None:
        return None
    size = size_of(image.get("width"), image.get("height"))
    if size is None:
        raise _Malformed(f"{where}: width {image.get('width')!r} and height {image.get('height')!r} "
                         "must be whole numbers above 0")
    return size


def _label_index(shape, what: str, label_of: dict, given: bool) -> int:
    """A shape's class index; raises `_Malformed` for a shape without a label or with one not among the classes."""
    label = (shape.get("label") or "").strip()
    if not label:
        raise _Malformed(f"{what} has no label")
    if label not in label_of:
        said = "--class_names" if given else "the file's <meta> labels"
        raise _Malformed(f"{what}: label {label!r} is not among {said} ({some(list(label_of))})")
    return label_of[label]


def _oriented_entry(image, where: str, label_of: dict, given: bool, issues) -> dict:
    """{'size', 'ref', 'boxes', 'dropped'} of one <image>, its boxes as corners (--boxes oriented)."""
    size = _image_size(image, where)
    boxes, dropped = [], []
    for k, shape in enumerate(image, start=1):
        what = f"{where} shape {k} <{shape.tag}>"
        if shape.tag == "tag":
            issues["tag"] += 1
            continue
        corners = None
        if shape.tag == "box":
            label = _label_index(shape, what, label_of, given)
            box = _numbers(shape, ("xtl", "ytl", "xbr", "ybr"), what)
            corners = rotated_box_corners(box, _rotation(shape, what))
        elif shape.tag == "polygon":
            label = _label_index(shape, what, label_of, given)
            points = _points(shape.get("points"), what)
            if len(points) == 4:
                corners = [v for p in points for v in p]
                issues["oriented_box_from_polygon"] += 1
        if corners is None:
            issues["not_an_oriented_box"] += 1
            dropped.append([k, "not_an_oriented_box"])
            continue
        boxes.append([k, *corners, label, 0])
    return {"size": size, "ref": "shape", "boxes": boxes, "dropped": dropped}


def rotated_box_corners(box, rotation: float) -> list[float]:
    """[x1, y1, ..., x4, y4]: a CVAT box's corners, top-left, top-right, bottom-right, bottom-left of
    the box (xtl, ytl, xbr, ybr), turned by `rotation` degrees clockwise on the image (y down) about its centre."""
    x0, y0, x1, y1 = box
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    if rotation % 360.0 == 0.0:
        return [x0, y0, x1, y0, x1, y1, x0, y1]
    cos, sin = math.cos(math.radians(rotation)), math.sin(math.radians(rotation))
    out = []
    for x, y in ((x0, y0), (x1, y0), (x1, y1), (x0, y1)):
        dx, dy = x - cx, y - cy
        out += [cx + dx * cos - dy * sin, cy + dx * sin + dy * cos]
    return out


def _region(shape, what: str) -> list | None:
    """The region a shape draws (`conversion.annotation_masks`): None for an upright box; a rotated
    box, an ellipse, a polygon, a mask's run lengths; ['none'] for polylines and points (no area);
    ['bad', why] for a mask whose run lengths cannot be read. The shape's numbers are read already."""
    if shape.tag == "box":
        x0, y0, x1, y1 = _numbers(shape, ("xtl", "ytl", "xbr", "ybr"), what)
        angle = _rotation(shape, what)
        if angle % 360.0 == 0.0:
            return None
        return ["rotated_box", [(x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2, (y1 - y0) / 2, angle]]
    if shape.tag == "polygon":
        points = _points(shape.get("points"), what)
        return ["polygons", [[v for p in points for v in p]]] if len(points) >= 3 else ["none"]
    if shape.tag == "ellipse":
        return ["ellipse", [*_numbers(shape, ("cx", "cy", "rx", "ry"), what), _rotation(shape, what)]]
    if shape.tag == "mask":
        box = _numbers(shape, ("left", "top", "width", "height"), what)
        if not all(float(v).is_integer() for v in box) or box[2] < 1 or box[3] < 1:
            return ["bad", f"its mask's left, top, width and height {box} are not whole numbers (width and "
                           "height above 0)"]
        try:
            counts = [int(v) for v in (shape.get("rle") or "").split(",")]
        except ValueError:
            return ["bad", f"its mask's rle {(shape.get('rle') or '')[:40]!r} is not comma-separated run lengths"]
        return ["bitmap", [*(int(v) for v in box), counts]]
    return ["none"]


def _numbers(shape, names: Sequence[str], what: str) -> list[float]:
    values = finite(shape.get(n) for n in names)
    if values is None:
        given = ", ".join(f"{n}={shape.get(n)!r}" for n in names)
        raise _Malformed(f"{what}: {given}: each must be a finite number")
    return values


def _corners(shape, what: str, issues) -> list[float] | None:
    """[xmin, ymin, xmax, ymax] around a shape, or None for a shape of another kind."""
    if shape.tag == "box":
        x0, y0, x1, y1 = _numbers(shape, ("xtl", "ytl", "xbr", "ybr"), what)
        angle = _rotation(shape, what)
        if angle % 360.0 == 0.0:
            return [x0, y0, x1, y1]
        # A rotated box: the extent of its corners turned about its centre (either way round alike).
        issues["bbox_from_rotation"] += 1
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        cos, sin = abs(math.cos(math.radians(angle))), abs(math.sin(math.radians(angle)))
        hw, hh = (x1 - x0) / 2, (y1 - y0) / 2
        ex, ey = hw * cos + hh * sin, hw * sin + hh * cos
        return [cx - ex, cy - ey, cx + ex, cy + ey]
    if shape.tag in _POINT_SHAPES:
        points = _points(shape.get("points"), what)
        issues["bbox_from_segmentation"] += 1
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        return [min(xs), min(ys), max(xs), max(ys)]
    if shape.tag == "ellipse":
        cx, cy, rx, ry = _numbers(shape, ("cx", "cy", "rx", "ry"), what)
        angle = math.radians(_rotation(shape, what))
        ex = math.hypot(rx * math.cos(angle), ry * math.sin(angle))
        ey = math.hypot(rx * math.sin(angle), ry * math.cos(angle))
        return [cx - ex, cy - ey, cx + ex, cy + ey]
    if shape.tag == "mask":
        left, top, width, height = _numbers(shape, ("left", "top", "width", "height"), what)
        return [left, top, left + width, top + height]
    return None


def _rotation(shape, what: str) -> float:
    if shape.get("rotation") is None:
        return 0.0
    return _numbers(shape, ("rotation",), what)[0]


def _points(text, what: str) -> list[tuple[float, float]]:
    """CVAT's 'x1,y1;x2,y2;...' as (x, y) pairs; raises `_Malformed` when it is not that."""
    points = []
    for pair in (text or "").split(";"):
        values = finite(pair.split(",")) if pair.count(",") == 1 else None
        if values is None:
            raise _Malformed(f"{what}: points {text!r} must be 'x1,y1;x2,y2;...' of finite numbers")
        points.append((values[0], values[1]))
    return points
