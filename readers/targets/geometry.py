"""One example's image decoded and transformed, with the geometry its target follows.

Every step that moves pixels (centre or random crop, padding, resize, flip) is
computed once per example, from the image's stored size (JPEG header; decoded
for other formats), and returned as a `Geometry` for the target modes
(`readers.targets.MODES`) to move their label with the same parameters. The
random crop and flip come from one stateless per-example seed, split exactly
as `readers.preprocess.load_image` splits it, so the image is the one the
classification modes give for the same seed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from readers import decode, preprocess

__all__ = ["Geometry", "load_image", "flip_if"]


@dataclasses.dataclass(frozen=True)
class Geometry:
    """What one example's image went through, for its target.

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


def load_image(encoded, image, channels: int, depth: tf.DType, seed=None, *, all_jpeg: bool = False,
               flip_later: bool = False):
    """Decodes one example's image as the reader's options ask, and says how.

    Args:
      encoded: The stored image's bytes (scalar string tensor).
      image: The `readers.options.ImageOptions`.
      channels: Channels of the output image.
      depth: The decoding depth (tf.uint8 or tf.uint16).
      seed: Shape [2] int tensor, the example's seed (augment='standard').
      all_jpeg: Every image of the split is a JPEG: decoded without a format
        check (a conditional per image).
      flip_later: Leave the image unflipped (the caller flips it with its
        target, in one conditional).

    Returns:
      (pixels, geometry): the float32 image [height, width, channels] and its
      `Geometry` (not `resized` for image_size=None: as stored).
    """
    if image.image_size is None:
        pixels = _decode(encoded, channels, depth, all_jpeg)
        shape = tf.shape(pixels)
        return tf.cast(pixels, tf.float32), Geometry(shape[0], shape[1])
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
        pixels = _decode(encoded, channels, depth, all_jpeg)
        shape = tf.shape(pixels)
        geometry = Geometry(shape[0], shape[1], resized=True)
        if image.resize == "pad":
            geometry = dataclasses.replace(
                geometry, pad=preprocess.pad_window(shape[0], shape[1], image.image_size))
            pixels = preprocess.pad_to_aspect_ratio(pixels, image.image_size)
    else:
        pixels, height, width, window = _decode_window(encoded, window_fn, channels, depth, all_jpeg)
        geometry = Geometry(height, width, window=window, resized=True)
    pixels = tf.cast(tf.image.resize(pixels, image.image_size, method=image.interpolation),
                     tf.float32)
    if flip_seed is not None:
        geometry = dataclasses.replace(geometry, flip=preprocess.flips_left_right(flip_seed))
        if not flip_later:
            pixels = flip_if(geometry.flip, pixels)
    return tf.ensure_shape(pixels, [*image.image_size, channels]), geometry


def flip_if(flip, image):
    """`image` mirrored left-right when `flip` (as `stateless_random_flip_left_right`)."""
    return tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)


def _decode(encoded, channels, depth, all_jpeg):
    """The whole image, without a format check when every image is a JPEG."""
    if all_jpeg:
        return decode.decode_jpeg(encoded, channels=channels, dtype=depth)
    return decode.decode_image(encoded, channels=channels, dtype=depth)


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
