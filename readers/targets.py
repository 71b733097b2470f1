"""Targets beyond one class per image: masks, boxes, several labels, numbers.

The label modes of datasets converted with targets (issue 24; the record
features are `schemas.TARGET_KINDS`, what they mean is in the manifest's
`targets` section):

- 'mask': `(image, mask)`, mask int32 [height, width, 1] of class ids
  (int32, what Keras's sparse losses take, whether the PNGs are 8- or
  16-bit).
- 'boxes': `(image, {"boxes": float32 [n, 4], "classes": int32 [n]})`,
  boxes (ymin, xmin, ymax, xmax) as fractions of the output image; with
  `pad_boxes=N` every image has N rows, padded with class -1 and boxes -1.
- 'multi_hot': float32 [num_classes], 1 for every class of the image.
- 'target': float32 [k], the regression targets.

Geometry: every step that moves pixels (centre or random crop, padding,
resize, flip) moves the mask and the boxes with the image, with the same
parameters: the window is computed once per example, from the image's
stored size (JPEG header; decoded for other formats); the random crop and
flip come from one stateless per-example seed, split exactly as
`preprocess.load_image` splits it, so the image is the one the
classification modes give for the same seed. The mask is decoded whole (a
PNG has no fused crop), cut to the window, padded with the ignore id (255
for 8-bit masks, 65535 for 16-bit: `MASK_IGNORE_IDS`), resized with nearest
neighbour (ids are never blended) and flipped. Boxes are shifted and scaled
to the window and padding, clipped to [0, 1], dropped when no area is left,
and mirrored (x -> 1 - x) with the image.

Decoding (`readers.decode.decode_mask`, `stack_boxes`) depends on the schema
alone; this module is the model side, as `readers.preprocess` is for images.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from readers import decode, preprocess
from schemas.features import BOX_FEATURES, IMAGE, LABELS, MASK, TARGET

__all__ = [
    "TARGET_LABEL_MODES",
    "KIND_OF_MODE",
    "MASK_IGNORE_IDS",
    "BOXES",
    "CLASSES",
    "TargetPlan",
    "supported_label_modes",
]

# The label modes of targets, and the kind of target (`schemas.TARGET_KINDS`) each reads.
KIND_OF_MODE: Mapping[str, str] = {
    "mask": "mask", "boxes": "boxes", "multi_hot": "labels", "target": "target",
}
TARGET_LABEL_MODES = tuple(KIND_OF_MODE)
# The class id given to mask pixels that padding adds (resize='pad'): the
# largest id of the mask's depth, for a loss to ignore (Keras:
# `SparseCategoricalCrossentropy(ignore_class=255)`).
MASK_IGNORE_IDS: Mapping[str, int] = {"uint8": 255, "uint16": 65535}
# The keys of label_mode='boxes' labels.
BOXES = "boxes"
CLASSES = "classes"
# Boxes and classes of padding rows (pad_boxes).
_PAD_BOX = -1.0
_PAD_CLASS = -1
# The image-level modes, and whether each needs exactly two classes.
_CLASS_MODES = ("int", "categorical", "binary")


def supported_label_modes(class_names, targets) -> tuple:
    """The label modes a dataset can be read with.

    Args:
      class_names: The manifest's class names ([] when records carry no
        image-level class: label -1).
      targets: The schema's kinds of target (`ImageExampleSchema.targets`).

    Returns:
      The modes, in `readers.options.LABEL_MODES` order, None last.
    """
    modes = []
    if class_names:
        modes += ["int", "categorical"] + (["binary"] if len(class_names) == 2 else [])
    modes += [mode for mode, kind in KIND_OF_MODE.items() if kind in targets]
    return (*modes, None)


def _mask_dtype(targets: Mapping[str, Any]) -> str:
    dtype = targets.get("mask", {}).get("dtype", "uint8")
    if dtype not in MASK_IGNORE_IDS:
        raise ValueError(
            f"The manifest's targets.mask.dtype must be one of {tuple(MASK_IGNORE_IDS)}. "
            f"Received: {dtype!r}"
        )
    return dtype


@dataclasses.dataclass(frozen=True)
class TargetPlan:
    """How the target of one label mode is read and transformed, resolved once.

    Attributes:
      label_mode: One of `TARGET_LABEL_MODES`.
      mask_dtype: 'uint8' or 'uint16', the depth of the stored masks.
      num_classes: Classes of label_mode='multi_hot' (the manifest's
        class_names).
      target_length: Values of label_mode='target' (targets.target.length),
        None when the manifest does not say.
      pad_boxes: Rows of label_mode='boxes' per image, or None (ragged).
      all_jpeg: Every image of the split is a JPEG (the manifest's image
        stats): decoded without a format check (a conditional per image).
    """

    label_mode: str
    mask_dtype: str = "uint8"
    num_classes: int = 0
    target_length: int | None = None
    pad_boxes: int | None = None
    all_jpeg: bool = False

    @classmethod
    def of(cls, split_files, label_mode, pad_boxes=None) -> TargetPlan | None:
        """The plan of `label_mode` for a split (`readers.metadata.SplitFiles`); None for the
        image-level modes."""
        if label_mode not in KIND_OF_MODE:
            return None
        targets = split_files.targets
        length = targets.get("target", {}).get("length")
        stats = split_files.images
        return cls(
            label_mode=label_mode,
            mask_dtype=_mask_dtype(targets) if label_mode == "mask" else "uint8",
            num_classes=len(split_files.class_names),
            target_length=int(length) if length is not None else None,
            pad_boxes=pad_boxes,
            all_jpeg=bool(stats) and [f for f, _ in stats.formats] == ["jpeg"],
        )

    @property
    def keys(self) -> tuple[str, ...]:
        """The record features this mode reads."""
        if self.label_mode == "mask":
            return (MASK.key,)
        if self.label_mode == "boxes":
            return tuple(spec.key for spec in BOX_FEATURES)
        return (LABELS.key,) if self.label_mode == "multi_hot" else (TARGET.key,)

    @property
    def ignore_id(self) -> int:
        """The mask id of padded pixels."""
        return MASK_IGNORE_IDS[self.mask_dtype]

    @property
    def ragged(self) -> bool:
        """Whether labels differ in shape between examples (boxes without `pad_boxes`)."""
        return self.label_mode == "boxes" and self.pad_boxes is None

    def label_spec(self, image_size) -> Any:
        """The `tf.TypeSpec` structure of one example's label at `image_size`, or
        None when its shape is not known in advance (ragged boxes, a target
        length the manifest does not give)."""
        if self.label_mode == "mask":
            return tf.TensorSpec([*image_size, 1], tf.int32)
        if self.label_mode == "boxes":
            if self.pad_boxes is None:
                return None
            return {BOXES: tf.TensorSpec([self.pad_boxes, 4], tf.float32),
                    CLASSES: tf.TensorSpec([self.pad_boxes], tf.int32)}
        if self.label_mode == "multi_hot":
            return tf.TensorSpec([self.num_classes], tf.float32)
        if self.target_length is None:
            return None
        return tf.TensorSpec([self.target_length], tf.float32)

    def placeholder_values(self) -> dict[str, Any]:
        """Feature values of a stand-in record for a skipped damaged one (1x1 image)
        that decode and transform like any other."""
        if self.label_mode == "mask":
            depth = tf.as_dtype(self.mask_dtype)
            return {MASK.key: tf.io.encode_png(tf.zeros([1, 1, 1], depth)).numpy()}
        if self.label_mode == "target":
            return {TARGET.key: [0.0] * (self.target_length or 0)}
        return {}

    def load(self, features, image, *, channels: int, depth: tf.DType, seed=None):
        """Decodes one record's image and target, with the same geometry.

        Args:
          features: One parsed record: the image bytes and this mode's `keys`.
          image: The `readers.options.ImageOptions`.
          channels: Channels of the output image.
          depth: The image decoding depth (tf.uint8 or tf.uint16).
          seed: Shape [2] int tensor, the example's seed (augment='standard').

        Returns:
          (image, label): the float32 image [height, width, channels] exactly
          as `preprocess.load_image` gives it for the same seed, and the
          label of this mode (see the module docstring).
        """
        if self.label_mode == "multi_hot":
            return self._load_image(features, image, channels, depth, seed)[0], self._multi_hot(
                features[LABELS.key])
        if self.label_mode == "target":
            target = tf.cast(features[TARGET.key], tf.float32)
            if self.target_length is not None:
                target = tf.ensure_shape(target, [self.target_length])
            return self._load_image(features, image, channels, depth, seed)[0], target
        if self.label_mode == "mask":
            pixels, geometry = self._load_image(features, image, channels, depth, seed,
                                                flip_later=True)
            mask = self._mask(features[MASK.key], geometry, image.image_size)
            if geometry.flip is not None:
                pixels, mask = tf.cond(
                    geometry.flip,
                    lambda: (tf.reverse(pixels, [1]), tf.reverse(mask, [1])),
                    lambda: (pixels, mask),
                )
            return pixels, mask
        pixels, geometry = self._load_image(features, image, channels, depth, seed)
        return pixels, self._boxes(features, geometry)

    def _load_image(self, features, image, channels, depth, seed, flip_later=False):
        """The output image and its `_Geometry` (not `resized` for image_size=None: as
        stored); with `flip_later`, the image is not flipped yet (the caller flips it
        with its mask, in one conditional)."""
        encoded = features[IMAGE.key]
        if image.image_size is None:
            pixels = self._decode(encoded, channels, depth)
            shape = tf.shape(pixels)
            geometry = _Geometry(shape[0], shape[1])
            return tf.cast(pixels, tf.float32), geometry
        flip_seed = None
        if image.standard_augment:
            if seed is None:
                raise ValueError("augment='standard' needs a per-example `seed`. Received: seed=None")
            # As `preprocess.load_image` splits it: the same crop and flip as the image alone.
            crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
            window_fn = lambda h, w: preprocess.random_crop_window(h, w, crop_seed)  # noqa: E731
        elif image.resize == "crop":
            window_fn = lambda h, w: preprocess.center_crop_window(  # noqa: E731
                h, w, image.image_size, image.crop_fraction)
        else:
            window_fn = None
        if window_fn is None:
            pixels = self._decode(encoded, channels, depth)
            shape = tf.shape(pixels)
            geometry = _Geometry(shape[0], shape[1], resized=True)
            if image.resize == "pad":
                geometry = dataclasses.replace(
                    geometry, pad=preprocess.pad_window(shape[0], shape[1], image.image_size))
                pixels = preprocess.pad_to_aspect_ratio(pixels, image.image_size)
        else:
            pixels, height, width, window = _decode_window(encoded, window_fn, channels, depth,
                                                           self.all_jpeg)
            geometry = _Geometry(height, width, window=window, resized=True)
        pixels = tf.cast(tf.image.resize(pixels, image.image_size, method=image.interpolation),
                         tf.float32)
        if flip_seed is not None:
            geometry = dataclasses.replace(geometry, flip=preprocess.flips_left_right(flip_seed))
            if not flip_later:
                pixels = _flip_if(geometry.flip, pixels)
        return tf.ensure_shape(pixels, [*image.image_size, channels]), geometry

    def _decode(self, encoded, channels, depth):
        """The whole image, without a format check when every image is a JPEG."""
        if self.all_jpeg:
            return decode.decode_jpeg(encoded, channels=channels, dtype=depth)
        return decode.decode_image(encoded, channels=channels, dtype=depth)

    def _mask(self, encoded, geometry: _Geometry, image_size) -> tf.Tensor:
        """The mask under the image's geometry: int32 [height, width, 1]."""
        mask = decode.decode_mask(encoded, tf.as_dtype(self.mask_dtype))
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
                constant_values=self.ignore_id,
            )
        # Nearest neighbour: every output id is one of the stored ids (or the
        # ignore id), with the same half-pixel centres as the image's resize.
        mask = tf.image.resize(mask, image_size, method="nearest")
        return tf.ensure_shape(tf.cast(mask, tf.int32), [*image_size, 1])

    def _boxes(self, features, geometry: _Geometry) -> dict[str, tf.Tensor]:
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
        if self.pad_boxes is not None:
            n = self.pad_boxes
            boxes, classes = boxes[:n], classes[:n]
            missing = n - tf.shape(classes)[0]
            boxes = tf.pad(boxes, [[0, missing], [0, 0]], constant_values=_PAD_BOX)
            classes = tf.pad(classes, [[0, missing]], constant_values=_PAD_CLASS)
            boxes, classes = tf.ensure_shape(boxes, [n, 4]), tf.ensure_shape(classes, [n])
        return {BOXES: boxes, CLASSES: classes}

    def _multi_hot(self, labels) -> tf.Tensor:
        # A sum, not a max: an image without classes is all zeros (a max of
        # nothing is -inf); the converter stores each class once.
        hot = tf.reduce_sum(tf.one_hot(labels, self.num_classes, dtype=tf.float32), axis=0)
        return tf.ensure_shape(tf.minimum(hot, 1.0), [self.num_classes])


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """What one example's image went through, for its mask and boxes.

    Attributes:
      height, width: The stored image's size (scalar int32 tensors).
      window: [offset_y, offset_x, height, width] of the crop, in stored
        pixels; None when nothing was cropped.
      pad: `preprocess.pad_window` of the padding (resize='pad'), or None.
      flip: Scalar bool tensor, whether it was mirrored; None: never.
      resized: False for image_size=None: nothing changed.
    """

    height: Any
    width: Any
    window: Any = None
    pad: Any = None
    flip: Any = None
    resized: bool = False


def _flip_if(flip, image):
    """`image` mirrored left-right when `flip` (as `stateless_random_flip_left_right`)."""
    return tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)


def _decode_window(encoded, window_fn, channels, depth, all_jpeg=False):
    """Decodes the window `window_fn(height, width)` of an image (fused for JPEG).

    As `preprocess`'s own window decoding, also returning the stored size and
    the window; with `all_jpeg`, the JPEG branch alone.

    Returns:
      (pixels, height, width, window).
    """

    def jpeg():
        shape = tf.io.extract_jpeg_shape(encoded)
        window = window_fn(shape[0], shape[1])
        pixels = decode.decode_cropped_jpeg(encoded, window, channels=channels, dtype=depth)
        return pixels, shape[0], shape[1], window

    def other():
        pixels = decode.decode_image(encoded, channels=channels, dtype=depth)
        shape = tf.shape(pixels)
        window = window_fn(shape[0], shape[1])
        pixels = tf.slice(pixels, tf.concat([window[:2], [0]], 0),
                          tf.concat([window[2:], [channels]], 0))
        return pixels, shape[0], shape[1], window

    return jpeg() if all_jpeg else tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
