"""LabelMe JSON files (--annotations FOLDER of *.json): each file's shapes boxed, matched to its image.

LabelMe writes one JSON beside each image (or in a folder of their own):
`imagePath` (the image, relative to the JSON's folder), `imageWidth`,
`imageHeight`, maybe the image itself (`imageData`, not used: the file under
--input_dir is), and `shapes`, each a `label`, a `shape_type` and `points`
([[x, y], ...]). Each shape becomes the box of its extent:

- `rectangle` (two corners, in any order) and `mask` (its two corners) as
  they are;
- `circle` (its centre and a point on it): the circle's square;
- `polygon` (LabelMe's shape where `shape_type` is not given), `line`,
  `linestrip`, `point`, `points`: the extent of their points (counted
  'bbox_from_segmentation'; a point or a straight line has no area and is
  dropped as 'zero_area' when stored).

An image is found by its `imagePath` under --input_dir, else by the
`imagePath`'s name or the JSON's stem where one listed file has it. Classes
are the labels found, sorted, or --class_names. A file or shape that cannot
be read rejects its image ('bad_target', naming the JSON by its path under
--annotations and what was wrong). LabelMe shows and measures each photo
turned upright by its EXIF orientation: the sizes tell the frames apart, and
where they cannot, the upright photo is taken.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import posixpath
from collections.abc import Sequence

from conversion import listing as _listing
from conversion.targets._box_files import BoxAnnotations, Index, finite, size_of, some
from conversion.targets.labels_csv import normalise_rel

__all__ = ["LABELME_FORMAT", "read_labelme"]

_LOG = logging.getLogger("shardsmith.convert")
LABELME_FORMAT = "labelme"
# The frame of the boxes where --annotations_frame is 'auto' (`imaging.boxes.annotation_frame`).
FRAME = "auto_upright"
# shape_type -> the number of points it needs: (at least, at most; None: no most).
_POINTS = {"rectangle": (2, 2), "mask": (2, 2), "circle": (2, 2), "polygon": (3, None), "line": (2, 2),
           "linestrip": (2, None), "point": (1, 1), "points": (1, None)}
# Shapes whose box is their extent as a rectangle, not an outline's.
_CORNERS = ("rectangle", "mask")


def read_labelme(documents: Sequence[tuple[str, bytes | OSError]], annotations: str, input_dir: str,
                 listed: Sequence[str], class_names=None) -> BoxAnnotations:
    """Reads LabelMe JSON files and matches each to its image among the listed files.

    Args:
      documents: (JSON file's path relative to --annotations, its bytes or the
        OSError of its read: its image's 'bad_target' where its stem finds it), sorted.
      annotations: --annotations, the folder of the JSON files.
      input_dir: --input_dir (the listed paths are relative to it).
      listed: Relative paths under --input_dir (files and problems).
      class_names: --class_names: the box classes in label order, in place of the sorted labels.
    """
    index = Index(listed)
    issues = collections.Counter()
    folder, images_root = _listing.full_path(annotations), _listing.full_path(input_dir)
    parsed = []
    for name, data in documents:
        doc, error = _load(data, name)
        parsed.append((name, doc, error))
    found = sorted({s["label"].strip() for _, doc, _ in parsed if doc for s in _shape_list(doc)
                    if isinstance(s, dict) and isinstance(s.get("label"), str) and s["label"].strip()})
    names = tuple(class_names) if class_names is not None else tuple(found)
    label_of = {label: i for i, label in enumerate(names)}
    files, missing, invalid = {}, {}, {}
    for name, doc, error in parsed:
        image_path = doc.get("imagePath") if doc else None
        rel = _image_of(name, image_path, folder, images_root, index, issues)
        if rel is None:
            if isinstance(image_path, str) and image_path:
                wanted = normalise_rel(image_path.replace("\\", "/"))
                missing.setdefault(wanted, f"LabelMe file {name} in --annotations {annotations} names image "
                                           f"{image_path!r}, which is not under --input_dir")
            else:
                issues["unreadable_annotation"] += 1
                _LOG.warning("--annotations %s: %s names no image of --input_dir (%s); ignored", annotations,
                             name, error or "no imagePath")
            continue
        if rel in files or rel in invalid:
            issues["duplicate_image"] += 1
            _LOG.warning("--annotations %s: %s annotates %s again; ignored", annotations, name, rel)
            continue
        if error is not None:
            invalid[rel] = error
            continue
        try:
            files[rel] = _entry(doc, f"LabelMe file {name}", label_of, class_names is not None, issues)
        except _Malformed as e:
            invalid[rel] = str(e)
    return BoxAnnotations(LABELME_FORMAT, names, None, files, tuple(sorted(missing.items())), invalid,
                          dict(issues), frame=FRAME)


class _Malformed(ValueError):
    """A LabelMe file that cannot be read: its message names the file and what was wrong."""


def _load(data: bytes | OSError, name: str):
    """(the JSON object, None), or (None, why it is no LabelMe file or cannot be read)."""
    if isinstance(data, OSError):
        return None, f"LabelMe file {name} cannot be read ({data.strerror or data})"
    try:
        doc = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"LabelMe file {name} is not JSON ({e})"
    if not isinstance(doc, dict):
        return None, f"LabelMe file {name} is not a JSON object (LabelMe writes one with 'shapes' and 'imagePath')"
    if not isinstance(doc.get("shapes"), list):
        return doc, f"LabelMe file {name} has no 'shapes' list"
    return doc, None


def _shape_list(doc: dict) -> list:
    shapes = doc.get("shapes")
    return shapes if isinstance(shapes, list) else []


def _resolved(folder: str, rel: str) -> str:
    """`rel` under `folder` with its '..' and '.' resolved; a URL's scheme ('gs://') kept whole."""
    scheme, sep, rest = folder.partition("://")
    if not sep:
        return posixpath.normpath(posixpath.join(folder, rel))
    return scheme + sep + posixpath.normpath(posixpath.join(rest, rel))


def _image_of(name: str, image_path, folder: str, images_root: str, index: Index, issues) -> str | None:
    """The listed path of a JSON's image: its imagePath from the JSON's folder, else a unique name or stem."""
    if isinstance(image_path, str) and image_path.strip():
        # Windows' LabelMe writes '..\\images\\x.jpg'.
        path = image_path.strip().replace("\\", "/")
        if not (path.startswith("/") or (len(path) > 1 and path[1] == ":")):
            full = _resolved(folder, posixpath.join(posixpath.dirname(name), path))
            if full.startswith(images_root + "/") and full[len(images_root) + 1:] in index.paths:
                return full[len(images_root) + 1:]
        same_name = index.by_name.get(posixpath.basename(path), [])
        if len(same_name) == 1:
            return same_name[0]
        if same_name:
            issues["ambiguous_image"] += 1
            _LOG.warning("LabelMe file %s: its image %r could be any of %s; ignored", name, image_path,
                         some(same_name))
            return None
    stem = posixpath.splitext(posixpath.basename(name))[0]
    by_stem = index.by_stem.get(stem, [])
    return by_stem[0] if len(by_stem) == 1 else None


def _entry(doc: dict, where: str, label_of: dict, given: bool, issues) -> dict:
    """{'size', 'ref', 'boxes', 'dropped'} of one LabelMe file; raises `_Malformed` with what was wrong."""
    size = None
    width, height = doc.get("imageWidth"), doc.get("imageHeight")
    if width is not None or height is not None:
        size = size_of(width, height)
        if size is None:
            raise _Malformed(f"{where}: imageWidth {width!r} and imageHeight {height!r} must be whole numbers "
                             "above 0")
    boxes, dropped, regions = [], [], []
    for k, shape in enumerate(doc["shapes"], start=1):
        what = f"{where} shape {k}"
        if not isinstance(shape, dict):
            raise _Malformed(f"{what} is not a JSON object")
        kind = shape.get("shape_type") or "polygon"  # LabelMe reads a shape without a type as a polygon.
        label = shape.get("label")
        if not isinstance(label, str) or not label.strip():
            raise _Malformed(f"{what} ({kind}) has no label")
        label = label.strip()
        if label not in label_of:
            raise _Malformed(f"{what} ({kind}): label {label!r} is not among --class_names ({some(list(label_of))})")
        if kind not in _POINTS:
            issues["unsupported_shape"] += 1
            dropped.append([k, "unsupported_shape"])
            continue
        points = _points(shape.get("points"), f"{what} ({kind})")
        least, most = _POINTS[kind]
        if len(points) < least or (most is not None and len(points) > most):
            wanted = str(least) if least == most else f"{least} or more"
            raise _Malformed(f"{what} ({kind}) has {len(points)} points; a {kind} has {wanted}")
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        if kind == "circle":
            r = math.hypot(xs[1] - xs[0], ys[1] - ys[0])
            box = [xs[0] - r, ys[0] - r, xs[0] + r, ys[0] + r]
        else:
            box = [min(xs), min(ys), max(xs), max(ys)]
            if kind not in _CORNERS:
                issues["bbox_from_segmentation"] += 1
        boxes.append([k, *box, label_of[label], 0])
        regions.append(_region(kind, points, shape.get("mask")))
    return {"size": size, "ref": "shape", "boxes": boxes, "dropped": dropped, "regions": regions}


def _region(kind: str, points, bitmap) -> list | None:
    """The region a shape draws (`conversion.annotation_masks`): None for a rectangle (its box), a
    circle, a polygon, a mask shape's bitmap (a base64 PNG placed at its first corner); ['none'] for
    lines and points (no area); ['bad', why] for a mask shape without its bitmap."""
    if kind == "rectangle":
        return None
    if kind == "circle":
        r = math.hypot(points[1][0] - points[0][0], points[1][1] - points[0][1])
        return ["ellipse", [points[0][0], points[0][1], r, r, 0.0]]
    if kind == "polygon":
        return ["polygons", [[v for p in points for v in p]]]
    if kind == "mask":
        if not isinstance(bitmap, str) or not bitmap:
            return ["bad", "its mask shape has no 'mask' bitmap (a base64 PNG) to draw"]
        left, top = min(p[0] for p in points), min(p[1] for p in points)
        return ["png_bitmap", [math.floor(left), math.floor(top), bitmap]]
    return ["none"]


def _points(value, what: str) -> list[tuple[float, float]]:
    """A shape's points as (x, y) pairs; raises `_Malformed` when they are not [[x, y], ...] of finite numbers."""
    points = []
    for point in value if isinstance(value, list) else [None]:
        xy = finite(point) if isinstance(point, list) and len(point) == 2 else None
        if xy is None or any(isinstance(v, bool) for v in point):
            raise _Malformed(f"{what}: points {json.dumps(value)[:80]} must be [[x, y], ...] of finite numbers")
        points.append((xy[0], xy[1]))
    return points
