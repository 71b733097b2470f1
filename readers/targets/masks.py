"""label_mode='mask': `(image, mask)`, the mask int32 [height, width, 1] of class ids.

int32 is what Keras's sparse losses take, whether the stored PNGs are 8- or
16-bit. The mask is decoded whole (a PNG has no fused crop), cut to the
image's window, padded with the ignore id (255 for 8-bit masks, 65535 for
16-bit: `MASK_IGNORE_IDS`), resized with nearest neighbour (ids are never
blended) and flipped in one conditional with its image.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import tensorflow as tf

from readers import decode
from readers.targets.mode import TargetMode
from schemas.features import MASK

__all__ = ["MODE", "MASK_IGNORE_IDS"]

# The class id given to mask pixels that padding adds (resize='pad'): the
# largest id of the mask's depth, for a loss to ignore (Keras:
# `SparseCategoricalCrossentropy(ignore_class=255)`).
MASK_IGNORE_IDS: Mapping[str, int] = {"uint8": 255, "uint16": 65535}


@dataclasses.dataclass(frozen=True)
class MaskSettings:
    """dtype: 'uint8' or 'uint16', the depth of the stored masks (the manifest's targets.mask.dtype)."""

    dtype: str = "uint8"

    @property
    def ignore_id(self) -> int:
        """The mask id of padded pixels."""
        return MASK_IGNORE_IDS[self.dtype]


def _settings(split_files, reading) -> MaskSettings:
    dtype = split_files.targets.get("mask", {}).get("dtype", "uint8")
    if dtype not in MASK_IGNORE_IDS:
        raise ValueError(
            f"The manifest's targets.mask.dtype must be one of {tuple(MASK_IGNORE_IDS)}. "
            f"Received: {dtype!r}"
        )
    return MaskSettings(dtype)


def _label(features, geometry, settings: MaskSettings, image_size) -> tf.Tensor:
    """The mask under the image's geometry, unflipped: int32 [height, width, 1]."""
    mask = decode.decode_mask(features[MASK.key], tf.as_dtype(settings.dtype))
    # The converter stores masks of their image's size (else it rejects the
    # pair: mask_size_mismatch); a mask of another pixel count fails here.
    # (A reshape, not an assertion: that is a conditional per image.)
    mask = tf.reshape(mask, tf.stack([geometry.height, geometry.width, 1]))
    if not geometry.resized:
        return tf.cast(mask, tf.int32)
    # At the stored depth until the end: the ignore id fits it, and a crop
    # and resize of uint8 moves a quarter of the bytes of int32.
    if geometry.window is not None:
        window = geometry.window
        mask = tf.slice(mask, tf.concat([window[:2], [0]], 0),
                        tf.concat([window[2:], [1]], 0))
    if geometry.pad is not None:
        offset_y, offset_x, pad_height, pad_width = tf.unstack(geometry.pad)
        mask = tf.pad(
            mask,
            [[offset_y, pad_height - geometry.height - offset_y],
             [offset_x, pad_width - geometry.width - offset_x], [0, 0]],
            constant_values=settings.ignore_id,
        )
    # Nearest neighbour: every output id is one of the stored ids (or the
    # ignore id), with the same half-pixel centres as the image's resize.
    mask = tf.image.resize(mask, image_size, method="nearest")
    return tf.ensure_shape(tf.cast(mask, tf.int32), [*image_size, 1])


def _label_spec(settings: MaskSettings, image_size):
    return tf.TensorSpec([*image_size, 1], tf.int32)


def _flip(mask):
    return tf.reverse(mask, [1])


def _placeholder(settings: MaskSettings) -> dict:
    depth = tf.as_dtype(settings.dtype)
    return {MASK.key: tf.io.encode_png(tf.zeros([1, 1, 1], depth)).numpy()}


MODE = TargetMode(
    name="mask",
    kind="mask",
    keys=(MASK.key,),
    settings=_settings,
    label=_label,
    label_spec=_label_spec,
    flip=_flip,
    placeholder=_placeholder,
    moves_with_image=True,
    image_shaped=True,
)
