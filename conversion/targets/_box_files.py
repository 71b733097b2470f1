"""What the readers of box annotations share: `BoxAnnotations`, and the listed files by name.

`conversion.targets.coco`, `cvat`, `voc`, `labelme`, `dota` and `yolo` read an
annotation format each into a `BoxAnnotations`; the boxes kind
(`conversion.targets.boxes`) and the oriented boxes kind
(`conversion.targets.oriented`) plan and store them whatever their format.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import posixpath
from collections.abc import Mapping, Sequence

from conversion.targets.labels_csv import normalise_rel

__all__ = ["BoxAnnotations", "Index", "size_of", "finite", "id_key", "some"]

# Unknown image ids (and like lists) named in a log line at most.
_LOG_AT_MOST = 10
# Suffixes never taken for the image a VOC XML file's stem names.
_NOT_IMAGES = (".xml", ".json", ".txt", ".csv")


@dataclasses.dataclass(frozen=True)
class BoxAnnotations:
    """Boxes read from --annotations, matched to the listed files.

    Attributes:
      format: 'coco', 'cvat', 'voc', 'labelme', 'dota', 'yolo' or 'yolo_obb'.
      class_names: Box class names in label order.
      category_ids: COCO category id of each label; None for VOC.
      files: Relative path to {'size': [w, h] or None, 'ref': what a box's
        reference is, 'boxes': [[ref, xmin, ymin, xmax, ymax, label,
        is_crowd], ...], 'dropped': [[ref, reason], ...]} (pixels, on the
        frame the annotation was drawn on; with 'units': 'fraction',
        fractions of that frame's width and height, as YOLO gives them);
        oriented boxes (--boxes oriented) are [ref, x1, y1, ..., x4, y4,
        label, difficult], the corners in the annotation's order;
        'regions', where the format has some: the region of each box, in
        the same order, that --annotation_masks draws (`conversion.annotation_masks`;
        None: the box itself).
      missing: Entries naming files that do not exist (rel_path, message).
      invalid: Files whose annotation cannot be read (rel_path -> message).
      issues: Dataset-level counts of what was dropped or not matched.
      frame: The frame the format's boxes are drawn on where
        --annotations_frame is 'auto': 'auto' (each image's annotated size
        decides), 'upright' (YOLO: Ultralytics measures the upright photo), or
        'auto_upright' (the size decides, the upright photo where it cannot:
        CVAT and LabelMe show photos upright).
      sources: Full paths of the files the boxes were read from where the
        format's reader knows more of them than --annotations names (YOLO's
        label files beside a data.yaml); the rest are found by
        `conversion.targets.boxes`.
    """

    format: str
    class_names: tuple[str, ...]
    category_ids: tuple[int, ...] | None
    files: Mapping[str, dict]
    missing: tuple[tuple[str, str], ...]
    invalid: Mapping[str, str]
    issues: Mapping[str, int]
    frame: str = "auto"
    sources: frozenset = frozenset()


class Index:
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
        rel = normalise_rel(file_name)
        if rel in self.paths:
            return rel
        found = self.by_name.get(posixpath.basename(rel), ())
        return found[0] if len(found) == 1 else None


def size_of(width, height) -> list[int] | None:
    """[width, height] when both are positive integers (VOC and COCO files write 0 for unknown)."""
    try:
        w, h = float(width), float(height)
    except (TypeError, ValueError):
        return None
    if not (w > 0 and h > 0 and w.is_integer() and h.is_integer()):
        return None
    return [int(w), int(h)]


def finite(values) -> list[float] | None:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        return None
    return out if all(math.isfinite(v) for v in out) else None


def id_key(value):
    # Ids are ints in COCO files; anything else sorts after them, by its text.
    if isinstance(value, int) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, str(value))


def some(values) -> str:
    shown = ", ".join(map(str, values[:_LOG_AT_MOST]))
    return shown + (f" and {len(values) - _LOG_AT_MOST} more" if len(values) > _LOG_AT_MOST else "")
