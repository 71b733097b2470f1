"""label_mode='mask': `(image, mask)`, the mask int32 [height, width, 1] of class ids.

int32 is what Keras's sparse losses take, whether the stored PNGs are 8- or
16-bit. The mask is decoded whole (a PNG has no fused crop), cut to the
image's window, padded with the ignore id (255 for 8-bit masks, 65535 for
16-bit: `MASK_IGNORE_IDS`), resized with nearest neighbour (ids are never
blended) and flipped in one conditional with its image. On preview's tiles
each id is a semi-transparent colour (`overlay`), the ignore id left uncoloured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from readers import decode
from readers.targets import overlay as _overlay
from readers.targets.mode import TargetMode
from schemas.features import FILENAME, MASK

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


class MaskOverlay(_overlay.Overlay):
    """Each tile pixel's mask id (nearest, through the reader's resize) coloured over it.

    Args:
      dtype: The stored masks' depth (the manifest's targets.mask.dtype).
    """

    def __init__(self, dtype: str):
        self._dtype = dtype
        self._ignore = MASK_IGNORE_IDS[dtype]
        self._undecodable: list[str] = []

    def read(self, values: dict) -> np.ndarray | None:
        """Class ids [h, w] (the mask's own size); None when the mask does not decode."""
        try:
            return tf.io.decode_png(values[MASK.key], channels=1,
                                    dtype=getattr(tf, self._dtype)).numpy()[..., 0]
        except tf.errors.OpError:
            # verify names such a record; the sheet shows the image without its mask.
            self._undecodable.append(values[FILENAME.key].decode("utf-8", "replace"))
            return None

    def paint(self, pixels: np.ndarray, mask, frame: _overlay.Frame) -> np.ndarray:
        if mask is None:
            return pixels
        # Tile pixel centre -> stored image position -> mask pixel (the mask's own size).
        ys, xs = frame.centres()
        inside_y, inside_x = (ys >= 0) & (ys < 1), (xs >= 0) & (xs < 1)
        rows = np.clip((ys * mask.shape[0]).astype(np.int64), 0, mask.shape[0] - 1)
        cols = np.clip((xs * mask.shape[1]).astype(np.int64), 0, mask.shape[1] - 1)
        ids = mask[rows[:, None], cols[None, :]].astype(np.int64)
        shown = inside_y[:, None] & inside_x[None, :] & (ids != self._ignore)
        palette = _overlay.PALETTE
        colours = np.asarray(palette, np.float64)[ids % len(palette)]
        alpha = _overlay.MASK_ALPHA
        blended = pixels.astype(np.float64) * (1 - alpha) + colours * alpha
        return np.where(shown[..., None], np.round(blended), pixels).astype(np.uint8)

    def legend(self, shown: list) -> list:
        ids = sorted({int(i) for mask in shown if mask is not None for i in np.unique(mask)})
        entries = [(None, "mask ids:")]
        entries += [(_overlay.colour_of(i), str(i)) for i in ids if i != self._ignore][:_overlay.MAX_LEGEND]
        return entries + [(None, f"({self._ignore}: ignore, not coloured)")]

    def notes(self) -> list[str]:
        if not self._undecodable:
            return []
        return [f"{len(self._undecodable)} masks do not decode (shown without): "
                f"{', '.join(sorted(self._undecodable)[:3])}; run shardsmith verify."]


def _overlay_of(manifest, split_files) -> MaskOverlay | None:
    if "mask" not in split_files.schema.targets:
        return None
    return MaskOverlay((manifest.targets.get("mask") or {}).get("dtype", "uint8"))


def _class_names(split_files) -> list[str] | None:
    """The name of each mask id where the converter drew the masks from annotations
    (targets.mask.class_names: 'background', then the box classes); else the manifest's class_names."""
    names = split_files.targets.get("mask", {}).get("class_names")
    return list(names) if names else None


MODE = TargetMode(
    name="mask",
    kind="mask",
    keys=(MASK.key,),
    settings=_settings,
    class_names=_class_names,
    label=_label,
    label_spec=_label_spec,
    flip=_flip,
    placeholder=_placeholder,
    moves_with_image=True,
    image_shaped=True,
    overlay=_overlay_of,
)
