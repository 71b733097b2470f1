"""Model-side image preprocessing: resize policies, augmentation, output dtype.

Per example (before batching), `load_image` decodes the stored bytes and
brings them to the model's `image_size` with one of Keras's resize policies
(`image_dataset_from_directory` semantics):

- 'stretch': resize the whole image, ignoring its aspect ratio.
- 'crop': take the largest centred window with the target aspect ratio, then
  resize it (Keras's `crop_to_aspect_ratio=True`). With `crop_fraction` < 1
  the window shrinks around its centre: `crop_fraction=0.875` is the classic
  ImageNet evaluation path (resize, then centre crop). JPEGs decode only the
  window (`tf.io.decode_and_crop_jpeg`).
- 'pad': pad with zeros (centred) to the target aspect ratio, then resize
  (Keras's `pad_to_aspect_ratio=True`).

`augment=True` replaces the policy by the standard ImageNet training recipe:
a random resized crop (`tf.image.stateless_sample_distorted_bounding_box`, area
8%-100%, aspect ratio 3/4-4/3) fused with JPEG decoding, then a random
horizontal flip. Randomness is stateless, driven by a per-example seed, so a
seeded pipeline is reproducible.

Per batch (vectorised), `convert_images` applies the optional scaling and
normalisation and casts to the output dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from readers.decode import (
    JPEG_RATIOS,
    decode_cropped_jpeg,
    decode_image,
    decode_non_jpeg,
    decode_image_batch,
    decode_reduced_jpeg,
    reduced_jpeg_ratio,
)

__all__ = [
    "RESIZE_POLICIES",
    "INTERPOLATIONS",
    "OUTPUT_DTYPES",
    "center_crop_window",
    "pad_window",
    "pad_to_aspect_ratio",
    "flips_left_right",
    "random_crop_window",
    "load_image",
    "convert_images",
    "fit_image",
]

RESIZE_POLICIES = ("stretch", "pad", "crop")
INTERPOLATIONS = (
    "bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian",
    "mitchellcubic",
)
OUTPUT_DTYPES = ("float32", "bfloat16", "float16", "uint8", "uint16")

# The ImageNet ("Inception") random resized crop.
_CROP_AREA_RANGE = (0.08, 1.0)
_CROP_ASPECT_RATIO_RANGE = (3.0 / 4.0, 4.0 / 3.0)
_CROP_MIN_OBJECT_COVERED = 0.1
_CROP_MAX_ATTEMPTS = 10


def _trunc(x) -> tf.Tensor:
    return tf.cast(x, tf.int32)


def center_crop_window(height, width, target_size, crop_fraction=1.0) -> tf.Tensor:
    """The centred window with the aspect ratio of `target_size`.

    Mirrors Keras's `crop_to_aspect_ratio`: the largest such window, shrunk
    around its centre by `crop_fraction`.

    Args:
      height: Image height (int or scalar int tensor).
      width: Image width.
      target_size: (target_height, target_width) whose aspect ratio to take.
      crop_fraction: Fraction (0, 1] of the largest window's sides to keep.

    Returns:
      An int32 tensor [offset_y, offset_x, crop_height, crop_width].
    """
    height = tf.cast(height, tf.int32)
    width = tf.cast(width, tf.int32)
    target_height, target_width = target_size
    crop_height = _trunc(tf.cast(width * target_height, tf.float32) / target_width)
    crop_height = tf.maximum(tf.minimum(height, crop_height), 1)
    crop_width = _trunc(tf.cast(height * target_width, tf.float32) / target_height)
    crop_width = tf.maximum(tf.minimum(width, crop_width), 1)
    if crop_fraction != 1.0:
        crop_height = tf.maximum(_trunc(tf.cast(crop_height, tf.float32) * crop_fraction), 1)
        crop_width = tf.maximum(_trunc(tf.cast(crop_width, tf.float32) * crop_fraction), 1)
    offset_y = _trunc(tf.cast(height - crop_height, tf.float32) / 2)
    offset_x = _trunc(tf.cast(width - crop_width, tf.float32) / 2)
    return tf.stack([offset_y, offset_x, crop_height, crop_width])


def pad_window(height, width, target_size) -> tf.Tensor:
    """Where `pad_to_aspect_ratio` puts an image of `height` x `width`.

    Args:
      height: Image height (int or scalar int tensor).
      width: Image width.
      target_size: (target_height, target_width) whose aspect ratio to take.

    Returns:
      An int32 tensor [offset_y, offset_x, padded_height, padded_width]: the
      image's top-left corner in the padded image, and the padded size.
    """
    height = tf.cast(height, tf.int32)
    width = tf.cast(width, tf.int32)
    target_height, target_width = target_size
    pad_height = tf.maximum(
        height, _trunc(tf.cast(width * target_height, tf.float32) / target_width)
    )
    pad_width = tf.maximum(
        width, _trunc(tf.cast(height * target_width, tf.float32) / target_height)
    )
    offset_y = _trunc(tf.cast(pad_height - height, tf.float32) / 2)
    offset_x = _trunc(tf.cast(pad_width - width, tf.float32) / 2)
    return tf.stack([offset_y, offset_x, pad_height, pad_width])


def pad_to_aspect_ratio(image: tf.Tensor, target_size) -> tf.Tensor:
    """Pads `image` with zeros, centred, to `target_size`'s aspect ratio.

    Mirrors Keras's `pad_to_aspect_ratio`. `image` is [H, W, C] or a batch
    [N, H, W, C] of one size. The placement is `pad_window`'s.
    """
    shape = tf.shape(image)
    offset_y, offset_x, pad_height, pad_width = tf.unstack(
        pad_window(shape[-3], shape[-2], target_size))
    return tf.image.pad_to_bounding_box(image, offset_y, offset_x, pad_height, pad_width)


def flips_left_right(seed: tf.Tensor) -> tf.Tensor:
    """Whether `tf.image.stateless_random_flip_left_right(image, seed)` flips one image.

    The same draw as TensorFlow's (a uniform float32 in [0, 1) below 0.5), so
    that a mask or boxes can be flipped together with the image.

    Args:
      seed: Shape [2] int tensor, the stateless seed of the flip.

    Returns:
      A scalar bool tensor.
    """
    return tf.random.stateless_uniform([], seed=seed, minval=0, maxval=1.0) < 0.5


def random_crop_window(height, width, seed: tf.Tensor) -> tf.Tensor:
    """A random window of the ImageNet random-resized-crop recipe.

    Args:
      height: Image height (int or scalar int tensor).
      width: Image width.
      seed: Shape [2] int tensor, the stateless seed of this example.

    Returns:
      An int32 tensor [offset_y, offset_x, crop_height, crop_width]; the whole
      image when no window satisfying the constraints is found.
    """
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.stack([tf.cast(height, tf.int32), tf.cast(width, tf.int32), 1]),
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        min_object_covered=_CROP_MIN_OBJECT_COVERED,
        aspect_ratio_range=_CROP_ASPECT_RATIO_RANGE,
        area_range=_CROP_AREA_RANGE,
        max_attempts=_CROP_MAX_ATTEMPTS,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.concat([begin[:2], size[:2]], axis=0)


def _decode_window(encoded, window_fn, channels, depth, reduced_to=None):
    """Decodes the window `window_fn(height, width)`; fused for JPEG.

    `reduced_to`: the output size, for a JPEG window decoded at a reduced
    scale that stays at least that size (`load_image`'s `reduced_decode`).
    """

    def jpeg():
        shape = tf.io.extract_jpeg_shape(encoded)
        window = window_fn(shape[0], shape[1])
        if reduced_to is not None:
            ratio = reduced_jpeg_ratio(window[2], window[3], reduced_to)
            return decode_reduced_jpeg(encoded, ratio, window, channels=channels, dtype=depth)
        # Each branch knows its format: no second format check inside it (a nested
        # conditional: 72 -> 30 ms to trace, paid by every dataset's first batch).
        return decode_cropped_jpeg(encoded, window, channels=channels, dtype=depth)

    def other():
        image = decode_non_jpeg(encoded, channels=channels, dtype=depth)
        shape = tf.shape(image)
        window = window_fn(shape[0], shape[1])
        return tf.slice(
            image,
            tf.concat([window[:2], [0]], 0),
            tf.concat([window[2:], [channels]], 0),
        )

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def load_image(
    encoded: tf.Tensor,
    *,
    image_size: tuple[int, int] | None,
    resize: str = "stretch",
    crop_fraction: float = 1.0,
    interpolation: str = "bilinear",
    channels: int = 3,
    depth: tf.dtypes.DType = tf.uint8,
    augment: bool = False,
    seed: tf.Tensor | None = None,
    reduced_decode: bool = False,
) -> tf.Tensor:
    """Decodes one stored image and brings it to `image_size`.

    Args:
      encoded: Scalar string tensor, the stored JPEG or PNG bytes.
      image_size: (height, width) of the output, or None to keep the stored
        size (then `resize` and `augment` do not apply).
      resize: One of `RESIZE_POLICIES`, see the module docstring.
      crop_fraction: For resize='crop', the centre fraction to keep.
      interpolation: One of `INTERPOLATIONS`.
      channels: 1, 3 or 4.
      depth: tf.uint8 (pixel values 0-255) or tf.uint16 (0-65535, full depth
        of 16-bit PNGs), the decoding depth.
      augment: Use the standard random-resized-crop and flip recipe instead
        of `resize`.
      seed: Shape [2] int tensor; required when `augment` is True.
      reduced_decode: Decode a JPEG whose region (the whole image, its crop
        window or its random crop) is at least twice `image_size` on both
        sides at 1/2, 1/4 or 1/8 scale (the largest that keeps it at least
        `image_size`, `decode.reduced_jpeg_ratio`), then resize the rest:
        not the values of decoding whole and resizing (see
        `decode.decode_reduced_jpeg` and docs/reading/performance), faster
        for large photos. Other images and formats decode exactly.

    Returns:
      A float32 tensor [height, width, channels] of pixel values in the range
      of `depth`.
    """
    if image_size is None:
        return tf.cast(decode_image(encoded, channels=channels, dtype=depth), tf.float32)
    reduced_to = tuple(image_size) if reduced_decode else None
    if augment:
        if seed is None:
            raise ValueError("`seed` is required when `augment` is True. Received: seed=None")
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        image = _decode_window(
            encoded, lambda h, w: random_crop_window(h, w, crop_seed), channels, depth,
            reduced_to,
        )
    elif resize == "crop":
        image = _decode_window(
            encoded,
            lambda h, w: center_crop_window(h, w, image_size, crop_fraction),
            channels,
            depth,
            reduced_to,
        )
    elif reduced_decode:
        def jpeg():
            shape = tf.io.extract_jpeg_shape(encoded)
            ratio = reduced_jpeg_ratio(shape[0], shape[1], reduced_to)
            return decode_reduced_jpeg(encoded, ratio, channels=channels, dtype=depth)

        image = tf.cond(tf.io.is_jpeg(encoded), jpeg,
                        lambda: decode_non_jpeg(encoded, channels=channels, dtype=depth))
        if resize == "pad":
            image = pad_to_aspect_ratio(image, image_size)
    else:
        image = decode_image(encoded, channels=channels, dtype=depth)
        if resize == "pad":
            image = pad_to_aspect_ratio(image, image_size)
    image = tf.image.resize(image, image_size, method=interpolation)
    image = tf.cast(image, tf.float32)
    if augment:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return tf.ensure_shape(image, [*image_size, channels])


def fit_image(
    image: tf.Tensor,
    *,
    image_size: tuple[int, int],
    resize: str = "stretch",
    crop_fraction: float = 1.0,
    interpolation: str = "bilinear",
    augment: bool = False,
    seed: tf.Tensor | None = None,
) -> tf.Tensor:
    """`load_image`'s resize policies and augmentation for an image already decoded.

    For images with any number of bands (raw-stored rasters), where there is
    no JPEG decoder to fuse the crop with: the window is cut after decoding.

    Args:
      image: Tensor [height, width, bands] of any real dtype.
      image_size, resize, crop_fraction, interpolation, augment, seed: As
        for `load_image`.

    Returns:
      A float32 tensor [*image_size, bands].
    """
    image = tf.cast(image, tf.float32)
    shape = tf.shape(image)
    if augment:
        if seed is None:
            raise ValueError("`seed` is required when `augment` is True. Received: seed=None")
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        window = random_crop_window(shape[0], shape[1], crop_seed)
    elif resize == "crop":
        window = center_crop_window(shape[0], shape[1], image_size, crop_fraction)
    else:
        window = None
    if window is not None:
        image = tf.slice(image, tf.concat([window[:2], [0]], 0),
                         tf.concat([window[2:], [shape[2]]], 0))
    elif resize == "pad":
        image = pad_to_aspect_ratio(image, image_size)
    image = tf.image.resize(image, image_size, method=interpolation)
    if augment:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return image


def load_image_batch(
    encoded: tf.Tensor,
    heights: tf.Tensor,
    widths: tf.Tensor,
    *,
    image_size: tuple[int, int],
    resize: str = "stretch",
    crop_fraction: float = 1.0,
    interpolation: str = "bilinear",
    channels: int = 3,
    depth: tf.dtypes.DType = tf.uint8,
    batch_size: int | None = None,
    jpegs_of_size: tuple[int, int] | None = None,
    reduced_decode: bool = False,
) -> tf.Tensor:
    """`load_image` of a batch of stored images (no augmentation).

    When the batch's images all have one stored size (as in most datasets of
    small images) and the policy is 'stretch' or 'pad', they are decoded at
    that size (`decode_image_batch`) and the whole batch is resized by one
    op: the same pixels as image by image, with the per-image resize call and
    the copy of each resized image into the batch saved (about a sixth of the
    CPU for 64x64 JPEGs read at 224x224). Other batches go image by image.

    When the manifest says every image is a JPEG of one size
    (`jpegs_of_size`), the graph holds that path alone: no run-time checks,
    and half the tracing (0.6 -> 0.3 s to the first batch of 64x64 JPEGs).

    Args:
      encoded: String tensor [batch], the stored image bytes.
      heights, widths: int tensors [batch], the stored sizes (the records'
        `height` and `width` features).
      image_size, resize, crop_fraction, interpolation, channels, depth: As
        for `load_image`.
      batch_size: The largest batch, when known (see `decode_image_batch`).
      jpegs_of_size: (height, width) when every image is known to be a JPEG
        of that size; needs `batch_size`.
      reduced_decode: As for `load_image`: with `jpegs_of_size`, the whole
        batch decoded at the one reduced scale that size allows.

    Returns:
      A float32 tensor [batch, height, width, channels].
    """
    one_by_one_spec = tf.TensorSpec([*image_size, channels], tf.float32)
    output_shape = [None, *image_size, channels]

    def one_by_one():
        return tf.map_fn(
            lambda e: load_image(e, image_size=image_size, resize=resize,
                                 crop_fraction=crop_fraction, interpolation=interpolation,
                                 channels=channels, depth=depth,
                                 reduced_decode=reduced_decode),
            encoded, fn_output_signature=one_by_one_spec,
        )

    if resize not in ("stretch", "pad"):
        return one_by_one()
    ratio = 1
    if reduced_decode:
        if jpegs_of_size is None or batch_size is None:
            return tf.ensure_shape(one_by_one(), output_shape)
        # `reduced_jpeg_ratio` of the one stored size, known here.
        ratio = max(r for r in JPEG_RATIOS if jpegs_of_size[0] >= r * image_size[0]
                    and jpegs_of_size[1] >= r * image_size[1])

    def together(all_jpeg=False, stored_size=None):
        images = decode_image_batch(encoded, batch_size=batch_size, channels=channels,
                                    dtype=depth, all_jpeg=all_jpeg, ratio=ratio)
        if resize == "pad":
            images = pad_to_aspect_ratio(images, image_size)
        # The same values either way. Enlarging, each input pixel is read for
        # several output pixels, and converting the input to float32 once
        # first is cheaper (0.67 -> 0.52 CPU ms per 64x64 image at 224x224);
        # otherwise converting the whole input costs more than it saves.
        as_float = lambda: tf.image.resize(  # noqa: E731
            tf.cast(images, tf.float32), image_size, method=interpolation)
        as_is = lambda: tf.cast(  # noqa: E731
            tf.image.resize(images, image_size, method=interpolation), tf.float32)
        if stored_size is not None and resize == "stretch":
            enlarging = (-(-stored_size[0] // ratio) * -(-stored_size[1] // ratio)
                         < image_size[0] * image_size[1])
            return as_float() if enlarging else as_is()
        height_width = tf.shape(images)[1:3]
        enlarging = height_width[0] * height_width[1] < image_size[0] * image_size[1]
        return tf.cond(enlarging, as_float, as_is)

    if jpegs_of_size is not None and batch_size is not None:
        # A batch can be empty when every record of it was damaged (max_bad_records).
        images = tf.cond(tf.size(encoded) > 0,
                         lambda: together(all_jpeg=True, stored_size=jpegs_of_size),
                         lambda: tf.zeros([0, *image_size, channels], tf.float32))
        return tf.ensure_shape(images, output_shape)
    uniform = tf.logical_and(
        tf.size(heights) > 0,
        tf.logical_and(tf.reduce_all(tf.equal(heights, heights[:1])),
                       tf.reduce_all(tf.equal(widths, widths[:1]))),
    )
    images = tf.cond(uniform, together, one_by_one)
    return tf.ensure_shape(images, output_shape)


def _per_channel(value, dtype=tf.float32) -> tf.Tensor:
    return tf.constant(value, dtype)


def convert_images(
    images: tf.Tensor,
    dtype: str = "float32",
    *,
    scale: float | Sequence[float] | None = None,
    normalize: tuple | None = None,
) -> tf.Tensor:
    """Scales, normalises and casts float32 pixels; works on one image or a batch.

    Computes `images * scale`, then `(x - mean) / std` for `normalize=(mean,
    std)`, each a float or a per-channel sequence, then casts to `dtype`.
    Integer dtypes are rounded and saturated.

    Args:
      images: float32 tensor [..., height, width, channels].
      dtype: One of `OUTPUT_DTYPES`.
      scale: Optional multiplier, e.g. 1/255.
      normalize: Optional (mean, std), applied after `scale`.

    Returns:
      The converted tensor, same shape.
    """
    # In the images' own float dtype (float64 rasters read as stored).
    if scale is not None:
        images = images * _per_channel(scale, images.dtype)
    if normalize is not None:
        mean, std = normalize
        images = (images - _per_channel(mean, images.dtype)) / _per_channel(std, images.dtype)
    dtype = tf.as_dtype(dtype)
    if images.dtype == dtype:
        return images
    if dtype.is_integer:
        return tf.saturate_cast(tf.round(images), dtype)
    return tf.cast(images, dtype)
