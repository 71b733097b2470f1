"""label_mode='multi_hot': float32 [num_classes], 1 for every class of the image.

Several labels per image (the `labels` feature) index the manifest's
class_names; the image's geometry does not change them.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from readers.targets.mode import TargetMode
from schemas.features import LABELS

__all__ = ["MODE"]


@dataclasses.dataclass(frozen=True)
class MultiHotSettings:
    """num_classes: Entries of the multi-hot vector (the manifest's class_names)."""

    num_classes: int = 0


def _settings(split_files, reading) -> MultiHotSettings:
    return MultiHotSettings(len(split_files.class_names))


def _label(features, geometry, settings: MultiHotSettings, image_size) -> tf.Tensor:
    # A sum, not a max: an image without classes is all zeros (a max of
    # nothing is -inf); the converter stores each class once.
    hot = tf.reduce_sum(tf.one_hot(features[LABELS.key], settings.num_classes, dtype=tf.float32), axis=0)
    return tf.ensure_shape(tf.minimum(hot, 1.0), [settings.num_classes])


def _label_spec(settings: MultiHotSettings, image_size):
    return tf.TensorSpec([settings.num_classes], tf.float32)


MODE = TargetMode(
    name="multi_hot",
    kind="labels",
    keys=(LABELS.key,),
    settings=_settings,
    label=_label,
    label_spec=_label_spec,
)
