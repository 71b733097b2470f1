"""label_mode='boxes': `(image, {"boxes": float32 [n, 4], "classes": int32 [n]})`.

Boxes (ymin, xmin, ymax, xmax) as fractions of the output image: shifted and
scaled to the image's window and padding, clipped to [0, 1], dropped when no
area is left, and mirrored (x -> 1 - x) with the image. With `pad_boxes=N`
every image has N rows, padded with class -1 and boxes -1; without, labels
are ragged. Classes index the manifest's targets.boxes.class_names. On
preview's tiles each box is a rectangle with its class name (`overlay`).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from readers import decode
from readers.targets import overlay as _overlay
from readers.targets.mode import TargetMode
from schemas.features import BOX_FEATURES

__all__ = ["MODE", "BOXES", "CLASSES"]

# The keys of label_mode='boxes' labels.
BOXES = "boxes"
CLASSES = "classes"
# Boxes and classes of padding rows (pad_boxes).
_PAD_BOX = -1.0
_PAD_CLASS = -1


@dataclasses.dataclass(frozen=True)
class BoxSettings:
    """pad_boxes: Rows per image (the reader's `pad_boxes`), or None (ragged)."""

    pad_boxes: int | None = None


def _settings(split_files, reading) -> BoxSettings:
    return BoxSettings(reading.pad_boxes)


def _label(features, geometry, settings: BoxSettings, image_size) -> dict[str, tf.Tensor]:
    """The boxes under the image's geometry, see the module docstring."""
    boxes, labels = decode.stack_boxes(features)
    boxes = tf.reshape(tf.cast(boxes, tf.float32), [-1, 4])
    classes = tf.cast(labels, tf.int32)
    if geometry.resized:
        ymin, xmin, ymax, xmax = tf.unstack(boxes, num=4, axis=-1)
        height = tf.cast(geometry.height, tf.float32)
        width = tf.cast(geometry.width, tf.float32)
        if geometry.window is not None:
            # Stored fractions -> pixels -> fractions of the window.
            offset_y, offset_x, crop_height, crop_width = tf.unstack(
                tf.cast(geometry.window, tf.float32))
            ymin, ymax = [(v * height - offset_y) / crop_height for v in (ymin, ymax)]
            xmin, xmax = [(v * width - offset_x) / crop_width for v in (xmin, xmax)]
        if geometry.pad is not None:
            offset_y, offset_x, pad_height, pad_width = tf.unstack(
                tf.cast(geometry.pad, tf.float32))
            ymin, ymax = [(v * height + offset_y) / pad_height for v in (ymin, ymax)]
            xmin, xmax = [(v * width + offset_x) / pad_width for v in (xmin, xmax)]
        # A plain resize keeps fractions as they are; the rest is cut to the image.
        ymin, xmin, ymax, xmax = [tf.clip_by_value(v, 0.0, 1.0)
                                  for v in (ymin, xmin, ymax, xmax)]
        if geometry.flip is not None:
            xmin, xmax = (tf.where(geometry.flip, 1.0 - xmax, xmin),
                          tf.where(geometry.flip, 1.0 - xmin, xmax))
        keep = tf.logical_and(ymax > ymin, xmax > xmin)
        boxes = tf.boolean_mask(tf.stack([ymin, xmin, ymax, xmax], axis=-1), keep)
        classes = tf.boolean_mask(classes, keep)
    if settings.pad_boxes is not None:
        n = settings.pad_boxes
        boxes, classes = boxes[:n], classes[:n]
        missing = n - tf.shape(classes)[0]
        boxes = tf.pad(boxes, [[0, missing], [0, 0]], constant_values=_PAD_BOX)
        classes = tf.pad(classes, [[0, missing]], constant_values=_PAD_CLASS)
        boxes, classes = tf.ensure_shape(boxes, [n, 4]), tf.ensure_shape(classes, [n])
    return {BOXES: boxes, CLASSES: classes}


def _label_spec(settings: BoxSettings, image_size):
    if settings.pad_boxes is None:
        return None
    return {BOXES: tf.TensorSpec([settings.pad_boxes, 4], tf.float32),
            CLASSES: tf.TensorSpec([settings.pad_boxes], tf.int32)}


def _ragged(settings: BoxSettings) -> bool:
    return settings.pad_boxes is None


def _class_names(split_files) -> list[str]:
    return list(split_files.targets.get("boxes", {}).get("class_names", []))


class BoxOverlay(_overlay.Overlay):
    """Each box a rectangle in its class's colour, with its class name (and '(crowd)').

    Args:
      class_names: The manifest's targets.boxes.class_names.
    """

    def __init__(self, class_names):
        self._names = tuple(class_names)

    def _name(self, label: int) -> str:
        return self._names[label] if 0 <= label < len(self._names) else f"? {label}"

    def read(self, values: dict) -> tuple:
        """(xmin, ymin, xmax, ymax, label, is_crowd) per box, normalised corners."""
        return tuple(zip(*(values[spec.key] for spec in BOX_FEATURES)))

    def draw(self, draw, boxes, frame: _overlay.Frame, font) -> None:
        size = frame.size
        line = max(1, size // 64)
        for xmin, ymin, xmax, ymax, label, crowd in boxes or ():
            x0, x1, y0, y1 = frame.x(xmin), frame.x(xmax), frame.y(ymin), frame.y(ymax)
            box = (round(x0), round(y0), max(round(x0), round(x1) - 1), max(round(y0), round(y1) - 1))
            colour = _overlay.colour_of(label)
            draw.rectangle(box, outline=colour, width=line)
            text = _overlay.fit(font, self._name(label) + (" (crowd)" if crowd else ""),
                                max(size - box[0] - 2, 8))
            tx, ty = box[0] + line, box[1] + line
            right = min(size - 1, tx + int(font.getlength(text)) + 1)
            draw.rectangle((tx, ty, right, ty + _overlay.line_height(font) - 2), fill=colour)
            draw.text((tx + 1, ty), text, font=font, fill=_overlay.INK)

    def legend(self, shown: list) -> list:
        labels = sorted({int(b[4]) for boxes in shown if boxes is not None for b in boxes})
        return [(None, "boxes:")] + [(_overlay.colour_of(i), self._name(i)) for i in labels][:_overlay.MAX_LEGEND]


def _overlay_of(manifest, split_files) -> BoxOverlay | None:
    if "boxes" not in split_files.schema.targets:
        return None
    return BoxOverlay((manifest.targets.get("boxes") or {}).get("class_names") or ())


MODE = TargetMode(
    name="boxes",
    kind="boxes",
    keys=tuple(spec.key for spec in BOX_FEATURES),
    settings=_settings,
    label=_label,
    label_spec=_label_spec,
    ragged=_ragged,
    moves_with_image=True,
    class_names=_class_names,
    overlay=_overlay_of,
)
