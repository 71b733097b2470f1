"""Parsing and decoding of shardsmith records; depends on the schema alone.

Nothing here knows about models, image sizes or batches: it turns serialized
`tf.train.Example` bytes into tensors exactly as they were stored. Model-side
work (resizing, augmentation, scaling) lives in `readers.preprocess`.

Stored images are JPEG or PNG (8- or 16-bit, 1 to 4 channels). Decoding is
format-aware: JPEG goes through the JPEG decoder (which has no alpha channel,
so 'rgba' adds an opaque one), everything else through `tf.io.decode_image`.
8-bit sources read as uint16 are scaled by 257 (255 maps to 65535) whatever
their format; 16-bit PNGs read as uint8 keep their high byte.

Images PNG cannot hold (more bands, signed, 32-bit, float) are stored raw
(`schemas.features.RAW_FORMAT_PREFIX`): `decode_raw` gives them back exactly,
every band, in their stored dtype, from the record's height, width and
channels.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from schemas.features import (
    BBOX_LABEL,
    BBOX_XMAX,
    BBOX_XMIN,
    BBOX_YMAX,
    BBOX_YMIN,
    IMAGE,
    IMAGE_SCHEMA,
    RAW_DTYPES,
    ImageExampleSchema,
)

__all__ = [
    "CHANNELS_BY_COLOR_MODE",
    "parse_examples",
    "decode_image",
    "decode_cropped_image",
    "decode_cropped_jpeg",
    "decode_jpeg",
    "decode_non_jpeg",
    "JPEG_RATIOS",
    "reduced_jpeg_ratio",
    "decode_reduced_jpeg",
    "decode_image_batch",
    "image_shape",
    "decode_example",
    "decode_raw",
    "decode_raw_batch",
    "decode_mask",
    "stack_boxes",
]

# Keras's `color_mode` names and the channels they decode to.
CHANNELS_BY_COLOR_MODE = {"grayscale": 1, "rgb": 3, "rgba": 4}

_DECODE_DTYPES = (tf.uint8, tf.uint16)

# What `tf.io.is_jpeg` looks for: the SOI marker and the next marker's 0xFF.
_JPEG_START = b"\xff\xd8\xff"
# The scales libjpeg decodes a JPEG at (1/1, 1/2, 1/4, 1/8: its scaled IDCT),
# `decode_reduced_jpeg`'s ratios.
JPEG_RATIOS = (1, 2, 4, 8)
# Larger static batches decode in a loop: one op per image would make big graphs.
_MAX_UNROLLED_BATCH = 256


def decode_raw(encoded, height, width, channels, dtype: str) -> tf.Tensor:
    """Decodes one raw-stored image: its bytes, little-endian, C order.

    Args:
      encoded: A scalar string tensor, the stored array's bytes.
      height, width, channels: Scalar int tensors (the record's features).
      dtype: The stored dtype, one of `schemas.features.RAW_DTYPES` (from the
        format, 'raw-<dtype>').

    Returns:
      A `dtype` tensor [height, width, channels], the values as stored.

    Raises:
      ValueError: If `dtype` is not a raw dtype.
      InvalidArgumentError: At run time, if the bytes do not hold that shape.
    """
    flat = _decode_raw_flat(encoded, dtype)
    shape = tf.cast(tf.stack([height, width, channels]), tf.int32)
    return tf.reshape(flat, shape)


def decode_raw_batch(encoded, shape: tuple[int, int, int], dtype: str) -> tf.Tensor:
    """Decodes a batch of raw-stored images that all have one shape, in one op.

    Args:
      encoded: A [N] string tensor, each the bytes of one stored array
        (little-endian, C order), all of `shape` and `dtype`.
      shape: Their (height, width, channels).
      dtype: The stored dtype, one of `schemas.features.RAW_DTYPES`.

    Returns:
      A `dtype` tensor [N, *shape]; the same values `decode_raw` gives each.

    Raises:
      ValueError: If `dtype` is not a raw dtype.
      InvalidArgumentError: At run time, if a record holds another number of bytes.
    """
    # DecodeRaw of a batch needs strings of one length: [N, h * w * c].
    return tf.reshape(_decode_raw_flat(encoded, dtype), [-1, *shape])


def _decode_raw_flat(encoded, dtype: str) -> tf.Tensor:
    """The samples of raw-stored bytes (one string: [n]; a batch of one length: [N, n])."""
    if dtype not in RAW_DTYPES:
        raise ValueError(f"`dtype` must be one of {RAW_DTYPES}. Received: dtype={dtype!r}")
    # DecodeRaw has no uint32: the same bytes as int32, reinterpreted.
    as_read = tf.int32 if dtype == "uint32" else tf.as_dtype(dtype)
    flat = tf.io.decode_raw(encoded, as_read, little_endian=True)
    return tf.bitcast(flat, tf.uint32) if dtype == "uint32" else flat


def _check_channels(channels) -> int:
    if isinstance(channels, bool) or channels not in (1, 3, 4):
        raise ValueError(
            f"`channels` must be one of (1, 3, 4). Received: channels={channels!r}"
        )
    return int(channels)


def _check_decode_dtype(dtype) -> tf.dtypes.DType:
    try:
        as_dtype = tf.as_dtype(dtype)
    except TypeError:
        as_dtype = None
    if as_dtype not in _DECODE_DTYPES:
        raise ValueError(
            f"`dtype` must be one of {[d.name for d in _DECODE_DTYPES]}. "
            f"Received: dtype={dtype!r}"
        )
    return as_dtype


def parse_examples(
    serialized: tf.Tensor,
    keys: Sequence[str] | None = None,
    schema: ImageExampleSchema = IMAGE_SCHEMA,
) -> dict[str, tf.Tensor]:
    """Parses serialized records, vectorised over a batch.

    Args:
      serialized: A string tensor of serialized `tf.train.Example`s, of shape
        [] or [N].
      keys: Feature keys to parse (default: every feature of `schema`).
      schema: The record schema, e.g. the one stored in the manifest.

    Returns:
      A dict from feature key to a tensor of the same shape as `serialized`:
      tf.string for 'bytes' features, tf.int64 for 'int64' features; 'float64'
      features (the georeferencing) add a last axis of their length.

    Raises:
      ValueError: If a key is not part of the schema.
    """
    parsed = tf.io.parse_example(serialized, schema.parse_spec(keys))
    specs = {spec.key: spec for spec in schema.features}
    return {k: specs[k].finish_parsed(v) for k, v in parsed.items()}


def _finish(image: tf.Tensor, channels: int, dtype: tf.dtypes.DType) -> tf.Tensor:
    """Adds alpha to a JPEG-decoded uint8 image and converts it to `dtype`."""
    if channels == 4:
        alpha = tf.fill(tf.concat([tf.shape(image)[:2], [1]], 0), tf.constant(255, tf.uint8))
        image = tf.concat([image, alpha], axis=-1)
    if dtype == tf.uint16:
        image = tf.cast(image, tf.uint16) * 257
    return image


def _decode_jpeg(encoded, channels, dtype, crop_window=None, ratio=1):
    jpeg_channels = min(channels, 3)
    if crop_window is None:
        image = tf.io.decode_jpeg(encoded, channels=jpeg_channels, ratio=ratio)
    else:
        image = tf.io.decode_and_crop_jpeg(encoded, crop_window, channels=jpeg_channels,
                                           ratio=ratio)
    return _finish(image, channels, dtype)


def _decode_other(encoded, channels, dtype):
    return tf.io.decode_image(encoded, channels=channels, dtype=dtype, expand_animations=False)


def decode_image(
    encoded: tf.Tensor, *, channels: int = 3, dtype: tf.dtypes.DType = tf.uint8
) -> tf.Tensor:
    """Decodes one stored JPEG or PNG image.

    Args:
      encoded: A scalar string tensor, the stored image bytes.
      channels: 1 (grayscale), 3 (RGB) or 4 (RGBA); sources with other channel
        counts are converted.
      dtype: tf.uint8, or tf.uint16 to keep the full depth of 16-bit PNGs.

    Returns:
      A `dtype` tensor of shape [height, width, channels].

    Raises:
      ValueError: If `channels` or `dtype` is not supported.
    """
    channels = _check_channels(channels)
    dtype = _check_decode_dtype(dtype)
    if channels != 4 and dtype == tf.uint8:
        # TensorFlow's `decode_image` decodes a JPEG as `decode_jpeg` with its defaults does
        # (one kernel, the same flags: the same pixels and errors), so no format test (a
        # `tf.cond`, two branch functions to instantiate before the first batch) is needed
        # where `_decode_jpeg` would add nothing: no alpha, no 16-bit scaling.
        return tf.ensure_shape(_decode_other(encoded, channels, dtype), [None, None, channels])
    image = tf.cond(
        tf.io.is_jpeg(encoded),
        lambda: _decode_jpeg(encoded, channels, dtype),
        lambda: _decode_other(encoded, channels, dtype),
    )
    return tf.ensure_shape(image, [None, None, channels])


def decode_image_batch(
    encoded: tf.Tensor,
    *,
    batch_size: int | None = None,
    channels: int = 3,
    dtype: tf.dtypes.DType = tf.uint8,
    all_jpeg: bool = False,
    ratio: int = 1,
) -> tf.Tensor:
    """Decodes a batch of stored images that all have one size.

    The same pixels as `decode_image` of each. When every image of the batch
    is a JPEG and `batch_size` is known, the graph holds one JPEG decode per
    image, with no loop and no per-image format check: for 64x64 JPEGs,
    `tf.map_fn`'s loop and `decode_image`'s format check cost a quarter of
    the decoding (0.124 -> 0.088 ms of CPU per image). A batch of fewer
    images (the last one) is padded with copies of its last image, whose
    decodes are dropped. Other batches are decoded in a loop.

    Args:
      encoded: String tensor [n], the stored image bytes; every image has the
        same height and width.
      batch_size: The largest n, when known in advance (the dataset's batch
        size).
      channels, dtype: As for `decode_image`.
      all_jpeg: Every image is known to be a JPEG (the manifest says so):
        no check at run time.
      ratio: One of `JPEG_RATIOS`: with `all_jpeg`, decode at 1/ratio scale
        (`decode_reduced_jpeg`: not the stored pixels). 1: exact.

    Returns:
      A `dtype` tensor [n, height, width, channels] ([0, 0, 0, channels] when
      n is 0).

    Raises:
      ValueError: If `channels` or `dtype` is not supported.
      InvalidArgumentError: At run time, if the images differ in size or n
        exceeds `batch_size`.
    """
    channels = _check_channels(channels)
    dtype = _check_decode_dtype(dtype)
    if ratio not in JPEG_RATIOS or (ratio != 1 and not all_jpeg):
        raise ValueError(
            f"`ratio` must be one of {JPEG_RATIOS}, and 1 unless `all_jpeg`. "
            f"Received: ratio={ratio!r}, all_jpeg={all_jpeg!r}"
        )
    spec = tf.TensorSpec([None, None, channels], dtype)
    n = tf.size(encoded)

    def in_a_loop():
        if ratio != 1:
            return tf.map_fn(lambda e: _decode_jpeg(e, channels, dtype, ratio=ratio), encoded,
                             fn_output_signature=spec)
        return tf.map_fn(lambda e: decode_image(e, channels=channels, dtype=dtype), encoded,
                         fn_output_signature=spec)

    def unrolled():
        with tf.control_dependencies([tf.debugging.assert_less_equal(
                n, batch_size, message="decode_image_batch: more images than batch_size")]):
            # Index n - 1 again and again fills a partial batch.
            padded = tf.gather(encoded, tf.minimum(tf.range(batch_size), n - 1))
        # unstack: one op for all the slices (tracing cost shows in the
        # time to the first batch).
        images = [_decode_jpeg(e, channels, dtype, ratio=ratio)
                  for e in tf.unstack(padded, num=batch_size)]
        return tf.stack(images)[:n]

    def some():
        if batch_size is None or batch_size > _MAX_UNROLLED_BATCH:
            return in_a_loop()
        if all_jpeg:
            return unrolled()
        jpegs = tf.reduce_all(tf.equal(tf.strings.substr(encoded, 0, len(_JPEG_START)),
                                       _JPEG_START))
        return tf.cond(jpegs, unrolled, in_a_loop)

    # No images, no size: an empty batch is [0, 0, 0, channels].
    return tf.cond(n > 0, some, lambda: tf.zeros([0, 0, 0, channels], dtype))


def decode_cropped_image(
    encoded: tf.Tensor,
    crop_window: tf.Tensor,
    *,
    channels: int = 3,
    dtype: tf.dtypes.DType = tf.uint8,
) -> tf.Tensor:
    """Decodes only a window of a stored image (fused for JPEG).

    JPEGs go through `tf.io.decode_and_crop_jpeg`, which skips the work for
    pixels outside the window; other formats are decoded whole and sliced.
    For JPEGs with subsampled chroma, the window's last row and column can
    differ slightly from decoding the whole image and slicing it (libjpeg
    upsamples chroma without the pixels beyond the window).

    Args:
      encoded: A scalar string tensor, the stored image bytes.
      crop_window: An int32 tensor [offset_y, offset_x, height, width] within
        the image.
      channels: As `decode_image`.
      dtype: As `decode_image`.

    Returns:
      A `dtype` tensor of shape [crop height, crop width, channels].
    """
    channels = _check_channels(channels)
    dtype = _check_decode_dtype(dtype)
    crop_window = tf.cast(crop_window, tf.int32)

    def other():
        image = _decode_other(encoded, channels, dtype)
        return tf.slice(
            image,
            tf.concat([crop_window[:2], [0]], 0),
            tf.concat([crop_window[2:], [channels]], 0),
        )

    image = tf.cond(
        tf.io.is_jpeg(encoded),
        lambda: _decode_jpeg(encoded, channels, dtype, crop_window),
        other,
    )
    return tf.ensure_shape(image, [None, None, channels])


def decode_jpeg(
    encoded: tf.Tensor, *, channels: int = 3, dtype: tf.dtypes.DType = tf.uint8
) -> tf.Tensor:
    """`decode_image` of an image known to be a JPEG: no format check.

    For a split whose manifest says every image is a JPEG (each check is a
    conditional in the graph, run per image).

    Args:
      encoded: A scalar string tensor, JPEG bytes.
      channels, dtype: As `decode_image`.

    Returns:
      A `dtype` tensor of shape [height, width, channels].
    """
    channels = _check_channels(channels)
    dtype = _check_decode_dtype(dtype)
    return tf.ensure_shape(_decode_jpeg(encoded, channels, dtype), [None, None, channels])


def decode_non_jpeg(
    encoded: tf.Tensor, *, channels: int = 3, dtype: tf.dtypes.DType = tf.uint8
) -> tf.Tensor:
    """`decode_image` of an image known not to be a JPEG (PNG): no format check.

    For callers that have already branched on `tf.io.is_jpeg`.

    Args:
      encoded: A scalar string tensor, PNG (or another non-JPEG format's) bytes.
      channels, dtype: As `decode_image`.

    Returns:
      A `dtype` tensor of shape [height, width, channels].
    """
    channels = _check_channels(channels)
    dtype = _check_decode_dtype(dtype)
    return tf.ensure_shape(_decode_other(encoded, channels, dtype), [None, None, channels])


def decode_cropped_jpeg(
    encoded: tf.Tensor,
    crop_window: tf.Tensor,
    *,
    channels: int = 3,
    dtype: tf.dtypes.DType = tf.uint8,
) -> tf.Tensor:
    """`decode_cropped_image` of an image known to be a JPEG: no format check.

    For callers that have already branched on `tf.io.is_jpeg` (each check is
    a conditional in the graph, run per image).

    Args:
      encoded: A scalar string tensor, JPEG bytes.
      crop_window: An int32 tensor [offset_y, offset_x, height, width].
      channels: As `decode_image`.
      dtype: As `decode_image`.

    Returns:
      A `dtype` tensor of shape [crop height, crop width, channels].
    """
    channels = _check_channels(channels)
    dtype = _check_decode_dtype(dtype)
    image = _decode_jpeg(encoded, channels, dtype, tf.cast(crop_window, tf.int32))
    return tf.ensure_shape(image, [None, None, channels])


def reduced_jpeg_ratio(height, width, target_size) -> tf.Tensor:
    """The largest of `JPEG_RATIOS` that keeps a region at least `target_size`.

    A region of `height` x `width` stored pixels decoded at 1/ratio scale
    still has at least `target_size` pixels on both sides when it is at least
    ratio times `target_size` on both sides: the largest such ratio, 1 when
    the region is less than twice the target on either side.

    Args:
      height, width: The region's stored size (ints or scalar int tensors).
      target_size: (target_height, target_width) it is resized to next.

    Returns:
      An int32 scalar tensor, one of `JPEG_RATIOS`.
    """
    height = tf.cast(height, tf.int32)
    width = tf.cast(width, tf.int32)
    ratio = tf.constant(1, tf.int32)
    for r in JPEG_RATIOS[1:]:
        fits = tf.logical_and(height >= r * target_size[0], width >= r * target_size[1])
        ratio = tf.where(fits, tf.constant(r, tf.int32), ratio)
    return ratio


def decode_reduced_jpeg(
    encoded: tf.Tensor,
    ratio: tf.Tensor,
    crop_window: tf.Tensor | None = None,
    *,
    channels: int = 3,
    dtype: tf.dtypes.DType = tf.uint8,
) -> tf.Tensor:
    """A JPEG (or a window of it) decoded at 1/`ratio` scale: not the stored pixels.

    libjpeg's scaled IDCT decodes each 8x8 block straight to 8/ratio pixels,
    which skips most of the inverse DCT and the chroma upsampling: at 1/2
    scale a 500x375 photo decodes in about a third of the time. Each output
    pixel is close to the mean of the ratio x ratio stored pixels it covers
    (a box filter of the DCT), so the values differ from decoding whole and
    resizing (`readers.preprocess.load_image`'s `reduced_decode` documents by
    how much). A window given in stored pixels is widened outwards to whole
    reduced pixels: it can take in up to ratio - 1 more stored pixels on each
    side.

    Args:
      encoded: A scalar string tensor, JPEG bytes.
      ratio: An int scalar tensor, one of `JPEG_RATIOS` (e.g. from
        `reduced_jpeg_ratio`); 1 decodes exactly as `decode_jpeg` or
        `decode_cropped_jpeg`.
      crop_window: None (the whole image), or an int32 tensor [offset_y,
        offset_x, height, width] in stored pixels.
      channels, dtype: As `decode_image`.

    Returns:
      A `dtype` tensor [ceil(height / ratio) (about), ..., channels].
    """
    channels = _check_channels(channels)
    dtype = _check_decode_dtype(dtype)
    ratio = tf.cast(ratio, tf.int32)
    if crop_window is not None:
        crop_window = tf.cast(crop_window, tf.int32)
        stored = tf.io.extract_jpeg_shape(encoded)[:2]

    def at(r):
        if crop_window is None:
            return lambda: _decode_jpeg(encoded, channels, dtype, ratio=r)
        if r == 1:
            return lambda: _decode_jpeg(encoded, channels, dtype, crop_window)

        def cropped():
            # libjpeg's reduced image is ceil(stored / r); the window in its
            # pixels, widened outwards to cover the stored window.
            reduced = (stored + r - 1) // r
            start = crop_window[:2] // r
            stop = tf.minimum((crop_window[:2] + crop_window[2:] + r - 1) // r, reduced)
            return _decode_jpeg(encoded, channels, dtype,
                                tf.concat([start, stop - start], 0), ratio=r)
        return cropped

    # JPEG_RATIOS[index] == ratio.
    index = tf.add_n([tf.cast(ratio >= r, tf.int32) for r in JPEG_RATIOS[1:]])
    image = tf.switch_case(index, [at(r) for r in JPEG_RATIOS])
    return tf.ensure_shape(image, [None, None, channels])


def image_shape(encoded: tf.Tensor) -> tf.Tensor:
    """[height, width] (int32) of a stored image, reading only JPEG headers.

    Non-JPEG images are decoded to find out, so callers that decode them
    anyway should take the shape from the decoded tensor instead.
    """
    return tf.cond(
        tf.io.is_jpeg(encoded),
        lambda: tf.io.extract_jpeg_shape(encoded)[:2],
        lambda: tf.shape(_decode_other(encoded, 1, tf.uint8))[:2],
    )


def decode_example(
    serialized: tf.Tensor,
    schema: ImageExampleSchema = IMAGE_SCHEMA,
    *,
    keys: Sequence[str] | None = None,
    channels: int = 3,
    dtype: tf.dtypes.DType = tf.uint8,
) -> dict[str, tf.Tensor]:
    """Parses one serialized record and decodes its image.

    Args:
      serialized: A scalar string tensor, one serialized `tf.train.Example`.
      schema: The record schema (default: the current one; pass the schema
        stored in the manifest to get its extra features).
      keys: Feature keys to return (default: every feature of `schema`).
      channels: Channels of the decoded image, 1, 3 or 4.
      dtype: tf.uint8 or tf.uint16, see `decode_image`.

    Returns:
      A dict with one scalar-record entry per key:
        - `IMAGE.key`: `dtype` [height, width, channels], the decoded pixels.
        - `LABEL.key`: int64 [], index into the class names.
        - `FILENAME.key`: string [], path relative to the input root, POSIX
          separators.
        - `FORMAT.key`: string [], the stored format, jpeg or png.
        - `HEIGHT.key`, `WIDTH.key`, `CHANNELS.key`: int64 [], the stored
          image's size and channel count (before any channel conversion).
        - extra features of the schema (e.g. DICOM tags): string [];
          `EPSG.key` int64 [] and `GEOTRANSFORM.key` float64 [6] with
          --raster_georef.

    Raises:
      ValueError: If a key is not part of the schema, or `channels`/`dtype`
        are not supported.
    """
    features = parse_examples(serialized, keys, schema)
    if IMAGE.key in features:
        features[IMAGE.key] = decode_image(features[IMAGE.key], channels=channels, dtype=dtype)
    return features


def decode_mask(encoded: tf.Tensor, dtype: tf.dtypes.DType = tf.uint8) -> tf.Tensor:
    """Decodes one stored mask (`schemas.MASK`): the class id of every pixel.

    Args:
      encoded: A scalar string tensor, the single-channel PNG of the record.
      dtype: tf.uint8, or tf.uint16 for a dataset whose manifest says
        targets.mask.dtype is 'uint16' (its masks are 16-bit PNGs).

    Returns:
      A `dtype` tensor [height, width, 1], the ids exactly as stored.

    Raises:
      ValueError: If `dtype` is not supported.
    """
    dtype = _check_decode_dtype(dtype)
    return tf.ensure_shape(tf.io.decode_png(encoded, channels=1, dtype=dtype), [None, None, 1])


def stack_boxes(features) -> tuple[tf.Tensor, tf.Tensor]:
    """The boxes of one parsed record, as stored.

    Args:
      features: The parsed features of one record (`parse_examples` of a
        scalar), holding the `schemas.BOX_FEATURES` corners and labels.

    Returns:
      (boxes, labels): float32 [n, 4] rows (ymin, xmin, ymax, xmax), each a
      fraction of the stored image's height or width, and int64 [n], each
      an index into the manifest's targets.boxes.class_names.
    """
    corners = [features[spec.key] for spec in (BBOX_YMIN, BBOX_XMIN, BBOX_YMAX, BBOX_XMAX)]
    return tf.stack(corners, axis=-1), features[BBOX_LABEL.key]
