"""label_mode='target': float32 [k], the regression targets of the `target` feature.

k is the manifest's targets.target.length; the image's geometry does not
change the numbers.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from readers.targets.mode import TargetMode
from schemas.features import TARGET

__all__ = ["MODE"]


@dataclasses.dataclass(frozen=True)
class NumberSettings:
    """length: Values per example (targets.target.length), None when the manifest does not say."""

    length: int | None = None


def _settings(split_files, reading) -> NumberSettings:
    length = split_files.targets.get("target", {}).get("length")
    return NumberSettings(int(length) if length is not None else None)


def _label(features, geometry, settings: NumberSettings, image_size) -> tf.Tensor:
    target = tf.cast(features[TARGET.key], tf.float32)
    if settings.length is not None:
        target = tf.ensure_shape(target, [settings.length])
    return target


def _label_spec(settings: NumberSettings, image_size):
    if settings.length is None:
        return None
    return tf.TensorSpec([settings.length], tf.float32)


def _placeholder(settings: NumberSettings) -> dict:
    return {TARGET.key: [0.0] * (settings.length or 0)}


MODE = TargetMode(
    name="target",
    kind="target",
    keys=(TARGET.key,),
    settings=_settings,
    label=_label,
    label_spec=_label_spec,
    placeholder=_placeholder,
)
