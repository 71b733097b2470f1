"""label_mode='oriented_boxes': `(image, {"corners": float32 [n, 4, 2], "classes": int32 [n]})`.

Each oriented box's 4 corners (x, y), as fractions of the output image's
width and height, as the axis boxes of label_mode='boxes' are fractions;
`classes` index the manifest's targets.oriented_boxes.class_names. They
follow the image's geometry:

- a crop or the padding of resize='pad' shifts and scales them; corners are
  never clipped (a clipped turned rectangle is no rectangle): they may lie
  outside [0, 1], and a box is dropped only when the extent of its corners
  has no area left inside the image (the rule of the axis boxes, which are
  clipped to it);
- a flip mirrors them (x -> 1 - x) and reverses their order after the first
  (p1, p4, p3, p2): the first corner stays the mirror of the first, and a
  box given clockwise on the image (DOTA's order) stays clockwise.

With `pad_boxes=N` every image has N rows, padded with class -1 and corners
-1; without, labels are ragged. `xywhr` gives Ultralytics' (cx, cy, w, h,
angle) of the corners. On preview's tiles each box is its polygon with its
class name (`overlay`).
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from readers.targets import overlay as _overlay
from readers.targets.mode import TargetMode
from schemas.features import OBB_CORNERS, OBB_DIFFICULT, OBB_FEATURES, OBB_LABEL, TARGET_KINDS

__all__ = ["MODE", "CORNERS", "CLASSES", "xywhr"]

# The keys of label_mode='oriented_boxes' labels.
CORNERS = "corners"
CLASSES = "classes"
# The kind of target read: the one whose features are the oriented boxes'.
_KIND = next(kind for kind, specs in TARGET_KINDS.items() if specs == OBB_FEATURES)
# Corners and classes of padding rows (pad_boxes).
_PAD_CORNER = -1.0
_PAD_CLASS = -1


@dataclasses.dataclass(frozen=True)
class OrientedSettings:
    """pad_boxes: Rows per image (the reader's `pad_boxes`), or None (ragged)."""

    pad_boxes: int | None = None


def _settings(split_files, reading) -> OrientedSettings:
    return OrientedSettings(reading.pad_boxes)


def _label(features, geometry, settings: OrientedSettings, image_size) -> dict[str, tf.Tensor]:
    """The corners under the image's geometry, see the module docstring."""
    corners = tf.reshape(tf.cast(features[OBB_CORNERS.key], tf.float32), [-1, 4, 2])
    classes = tf.cast(features[OBB_LABEL.key], tf.int32)
    if geometry.resized:
        xs, ys = corners[..., 0], corners[..., 1]
        height = tf.cast(geometry.height, tf.float32)
        width = tf.cast(geometry.width, tf.float32)
        if geometry.window is not None:
            # Stored fractions -> pixels -> fractions of the window.
            offset_y, offset_x, crop_height, crop_width = tf.unstack(tf.cast(geometry.window, tf.float32))
            ys = (ys * height - offset_y) / crop_height
            xs = (xs * width - offset_x) / crop_width
        if geometry.pad is not None:
            offset_y, offset_x, pad_height, pad_width = tf.unstack(tf.cast(geometry.pad, tf.float32))
            ys = (ys * height + offset_y) / pad_height
            xs = (xs * width + offset_x) / pad_width
        if geometry.flip is not None:
            # Mirrored, and p1, p4, p3, p2: the winding kept (see the module docstring).
            mirrored = tf.gather(1.0 - xs, [0, 3, 2, 1], axis=1)
            xs = tf.where(geometry.flip, mirrored, xs)
            ys = tf.where(geometry.flip, tf.gather(ys, [0, 3, 2, 1], axis=1), ys)
        corners = tf.stack([xs, ys], axis=-1)
        # Kept where the corners' extent has some area inside the image (axis boxes: once clipped).
        x0 = tf.clip_by_value(tf.reduce_min(xs, axis=1), 0.0, 1.0)
        x1 = tf.clip_by_value(tf.reduce_max(xs, axis=1), 0.0, 1.0)
        y0 = tf.clip_by_value(tf.reduce_min(ys, axis=1), 0.0, 1.0)
        y1 = tf.clip_by_value(tf.reduce_max(ys, axis=1), 0.0, 1.0)
        keep = tf.logical_and(x1 > x0, y1 > y0)
        corners = tf.boolean_mask(corners, keep)
        classes = tf.boolean_mask(classes, keep)
    if settings.pad_boxes is not None:
        n = settings.pad_boxes
        corners, classes = corners[:n], classes[:n]
        missing = n - tf.shape(classes)[0]
        corners = tf.pad(corners, [[0, missing], [0, 0], [0, 0]], constant_values=_PAD_CORNER)
        classes = tf.pad(classes, [[0, missing]], constant_values=_PAD_CLASS)
        corners, classes = tf.ensure_shape(corners, [n, 4, 2]), tf.ensure_shape(classes, [n])
    return {CORNERS: corners, CLASSES: classes}


def _label_spec(settings: OrientedSettings, image_size):
    if settings.pad_boxes is None:
        return None
    return {CORNERS: tf.TensorSpec([settings.pad_boxes, 4, 2], tf.float32),
            CLASSES: tf.TensorSpec([settings.pad_boxes], tf.int32)}


def _ragged(settings: OrientedSettings) -> bool:
    return settings.pad_boxes is None


def _class_names(split_files) -> list[str]:
    return list(split_files.targets.get(_KIND, {}).get("class_names", []))


def xywhr(corners, height, width) -> tf.Tensor:
    """Ultralytics' (cx, cy, w, h, angle) of oriented boxes, in pixels of an image of `height` x `width`.

    The centre is the corners' mean; w the mean length of the edges p1-p2 and
    p3-p4, h of p2-p3 and p4-p1 (a rectangle's sides; for a quadrilateral
    that is none, DOTA's, their averages: not OpenCV's minimum-area
    rectangle); the angle, in radians, that of the edge p1-p2 from the x
    axis, clockwise on the image (y down), brought into [0, pi/2) as
    Ultralytics' `regularize_rboxes` does: a box turned by pi/2 or more has
    w and h swapped and pi/2 taken off.

    Args:
      corners: float [..., 4, 2] fractions (the label's `corners`).
      height, width: The image's size in pixels.

    Returns:
      float32 [..., 5].
    """
    corners = tf.cast(corners, tf.float32)
    points = corners * tf.cast(tf.stack([width, height]), tf.float32)
    p1, p2, p3, p4 = tf.unstack(points, num=4, axis=-2)
    centre = tf.reduce_mean(points, axis=-2)
    w = (tf.norm(p2 - p1, axis=-1) + tf.norm(p3 - p4, axis=-1)) / 2
    h = (tf.norm(p3 - p2, axis=-1) + tf.norm(p4 - p1, axis=-1)) / 2
    edge = p2 - p1
    angle = tf.math.floormod(tf.atan2(edge[..., 1], edge[..., 0]), math.pi)
    swap = angle >= math.pi / 2
    w, h = tf.where(swap, h, w), tf.where(swap, w, h)
    angle = tf.where(swap, angle - math.pi / 2, angle)
    return tf.concat([centre, tf.stack([w, h, angle], axis=-1)], axis=-1)


class OrientedBoxOverlay(_overlay.Overlay):
    """Each oriented box its polygon in its class's colour, its first corner marked, with its class name.

    Args:
      class_names: The manifest's targets.oriented_boxes.class_names.
    """

    def __init__(self, class_names):
        self._names = tuple(class_names)

    def _name(self, label: int) -> str:
        return self._names[label] if 0 <= label < len(self._names) else f"? {label}"

    def read(self, values: dict) -> tuple:
        """((x1, y1, ..., x4, y4), label, difficult) per box, normalised corners."""
        corners = list(values[OBB_CORNERS.key])
        return tuple((tuple(corners[8 * i:8 * i + 8]), int(label), int(difficult))
                     for i, (label, difficult) in enumerate(zip(values[OBB_LABEL.key], values[OBB_DIFFICULT.key])))

    def draw(self, draw, boxes, frame: _overlay.Frame, font) -> None:
        size = frame.size
        line = max(1, size // 64)
        for corners, label, difficult in boxes or ():
            points = [(frame.x(x), frame.y(y)) for x, y in zip(corners[0::2], corners[1::2])]
            colour = _overlay.colour_of(label)
            draw.line([*points, points[0]], fill=colour, width=line)
            x, y = points[0]
            draw.ellipse((x - 2 * line, y - 2 * line, x + 2 * line, y + 2 * line), fill=colour)
            text = _overlay.fit(font, self._name(label) + (" (difficult)" if difficult else ""), max(size / 3, 8))
            tx = min(max(0, round(min(p[0] for p in points))), size - 1)
            ty = min(max(0, round(min(p[1] for p in points))), size - 1)
            right = min(size - 1, tx + int(font.getlength(text)) + 1)
            draw.rectangle((tx, ty, right, ty + _overlay.line_height(font) - 2), fill=colour)
            draw.text((tx + 1, ty), text, font=font, fill=_overlay.INK)

    def legend(self, shown: list) -> list:
        labels = sorted({b[1] for boxes in shown if boxes is not None for b in boxes})
        return [(None, "oriented boxes:")] + [(_overlay.colour_of(i), self._name(i))
                                              for i in labels][:_overlay.MAX_LEGEND]


def _overlay_of(manifest, split_files) -> OrientedBoxOverlay | None:
    if _KIND not in split_files.schema.targets:
        return None
    return OrientedBoxOverlay((manifest.targets.get(_KIND) or {}).get("class_names") or ())


MODE = TargetMode(
    name="oriented_boxes",
    kind=_KIND,
    keys=tuple(spec.key for spec in OBB_FEATURES),
    settings=_settings,
    label=_label,
    label_spec=_label_spec,
    ragged=_ragged,
    moves_with_image=True,
    class_names=_class_names,
    overlay=_overlay_of,
)
