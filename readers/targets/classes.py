"""label_mode 'int', 'categorical', 'binary': the image-level class of each example.

The class is the record's `label` feature, an index into the manifest's
class_names: one per image, which no geometric step changes. So these modes
read no target per example: the image takes the plain image path (decoded a
batch at a time where it can), and the labels of a batch are converted at
once (`TargetMode.from_class`, elementwise, so one example's label too):

- 'int': int32 class indices;
- 'categorical': float32 one-hot [num_classes];
- 'binary': float32 [1], 0 or 1, for a dataset of exactly two classes.

A dataset without image-level classes (class_names [], every label -1: only
masks, boxes or numbers) cannot be read in these modes.
"""

from __future__ import annotations

import tensorflow as tf

from readers.targets.mode import TargetMode
from schemas.features import LABEL

__all__ = ["KIND", "MODES"]

# The kind of target of these rows: the image-level class (not a `schemas.TARGET_KINDS` kind).
KIND = "class"


def _int(labels, num_classes: int) -> tf.Tensor:
    return tf.cast(labels, tf.int32)


def _categorical(labels, num_classes: int) -> tf.Tensor:
    return tf.one_hot(labels, num_classes, dtype=tf.float32)


def _binary(labels, num_classes: int) -> tf.Tensor:
    return tf.expand_dims(tf.cast(labels, tf.float32), -1)


def _has_classes(class_names, targets) -> bool:
    return bool(class_names)


def _has_two_classes(class_names, targets) -> bool:
    return len(class_names) == 2


def _row(name: str, from_class, applies=_has_classes) -> TargetMode:
    return TargetMode(name=name, kind=KIND, keys=(LABEL.key,), from_class=from_class, applies=applies)


# In `readers.options.LABEL_MODES` order.
MODES: tuple[TargetMode, ...] = (
    _row("int", _int),
    _row("categorical", _categorical),
    _row("binary", _binary, _has_two_classes),
)
