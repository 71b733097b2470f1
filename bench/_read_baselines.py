"""The input pipelines `bench.read` times, and the loop that times one of them.

Every contender yields batches of `batch_size` float32 images of `image_size`
(and int labels, except the decode ceiling) forever, so that a steady-state
window can be taken after a warm-up whatever the corpus size. Three kinds of
per-image work ("presets") are compared like for like:

- ``eval``: the ImageNet evaluation path: the centred square of 0.875 of the
  shorter side, decoded fused with the crop (`tf.io.decode_and_crop_jpeg`),
  resized to `image_size` (shardsmith's `resize="crop", crop_fraction=0.875`).
- ``train``: the ImageNet training recipe: a random resized crop (area
  8%-100%, aspect ratio 3/4-4/3) fused with decoding, then a random flip
  (shardsmith's `augment="standard"`).
- ``stretch``: decode the whole image and resize it to `image_size`, aspect
  ratio ignored (shardsmith's and `image_dataset_from_directory`'s default).
- ``crop``: the largest centred window of the output's aspect ratio, resized
  to `image_size` (shardsmith's `resize="crop"`, the same values as
  `image_dataset_from_directory(crop_to_aspect_ratio=True)`, which decodes
  the whole image and crops it; shardsmith decodes the window alone).

Contenders (`PIPELINES`):

- ``shardsmith``: `readers.image_dataset_from_tfrecords` with the preset's
  options and `repeat=True`; shuffled except for ``eval``. ``reduced``: the
  same with `reduced_decode=True` (JPEGs at least twice the output size
  decoded at a reduced scale: not the exact values).
- ``global``: the same with `shuffle="global"` (seed 0): a true per-epoch
  permutation, each record read alone by offset (for local files, positioned
  reads in a `tf.py_function`); ``global-tf``: the same, reading with
  TensorFlow's TFRecord reader at an offset (what URLs use), for reference.
- ``hand``: a hand-tuned tf.data TFRecord pipeline: the shard files, an
  AUTOTUNE interleave of `TFRecordDataset`s, `parse_example` on batches of
  64 records, the preset's decode per record, batch, prefetch; no ordering
  guarantee. Written against `schemas` only (not `readers`).
- ``plain``: a plain TFRecord reader with no record buffer: the shard files
  shuffled, an AUTOTUNE interleave of `TFRecordDataset`s, then the same
  stages as ``hand`` (batched parse, the preset's decode per record, batch,
  prefetch) but no record shuffle buffer, so nothing fills before the first
  batch: the fastest honest start of a TFRecord reader (its shuffle is the
  file order and the interleave only).
- ``ceiling``: the decode ceiling: the same encoded bytes, read into memory
  before the clock starts, decoded with the preset's work by an AUTOTUNE
  parallel map (all cores); small images (up to 32 KiB) a batch per call.
- ``keras``: `keras.utils.image_dataset_from_directory` on the raw files
  (full decode and stretch resize). With the ``train`` preset it is followed,
  per batch, by the same random resized crop and flip (vectorised with
  `tf.image.crop_and_resize`), as a user of it would add them.

Run as ``python -m bench._read_baselines PIPELINE PRESET --tfrecords DIR --raw
DIR ...``: the process imports its libraries, then starts the clock, builds the
dataset and takes batches; it prints one line ``BENCH_READ_RESULT {json}``
with the time to first batch (from the start of dataset construction), the
images/s over the timed window (at least `--batches` batches and
`--min_seconds`) that follows `--warmup` further batches, the
CPU time of the process per image in that window and its peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import tensorflow as tf

from schemas import IMAGE, IMAGE_SCHEMA, LABEL

__all__ = [
    "PIPELINES", "PRESETS", "RESULT_PREFIX", "shardsmith", "global_shuffle", "hand",
    "load_encoded", "ceiling",
    "keras_directory", "measure", "main",
]

PIPELINES = ("shardsmith", "reduced", "global", "global-tf", "hand", "plain", "ceiling", "keras")
PRESETS = ("eval", "train", "stretch", "crop")
RESULT_PREFIX = "BENCH_READ_RESULT "  # Also in bench.read, which does not import TensorFlow.

_SPLIT = "train"
_EVAL_CROP = 0.875
_PARSE_BATCH = 64
_AREA = (0.08, 1.0)
_ASPECT = (3.0 / 4.0, 4.0 / 3.0)
_MIN_COVERED = 0.1
_ATTEMPTS = 10
_SMALL_IMAGE_BYTES = 32 * 1024


# ---------------------------------------------------------------------------
# Per-image work shared by the hand-tuned pipeline and the decode ceiling.


def _decode_window(encoded, window):
    """Decodes `window` [y, x, h, w] of one image; fused with the crop for JPEG."""

    def other():
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        return tf.slice(image, tf.concat([window[:2], [0]], 0), tf.concat([window[2:], [3]], 0))

    return tf.cond(
        tf.io.is_jpeg(encoded),
        lambda: tf.io.decode_and_crop_jpeg(encoded, window, channels=3),
        other,
    )


def _shape(encoded):
    return tf.cond(
        tf.io.is_jpeg(encoded),
        lambda: tf.io.extract_jpeg_shape(encoded)[:2],
        lambda: tf.shape(tf.io.decode_image(encoded, channels=3, expand_animations=False))[:2],
    )


def _eval_image(encoded, size):
    hw = _shape(encoded)
    side = tf.cast(tf.cast(tf.reduce_min(hw), tf.float32) * _EVAL_CROP, tf.int32)
    window = tf.stack([(hw[0] - side) // 2, (hw[1] - side) // 2, side, side])
    image = tf.image.resize(_decode_window(encoded, window), size)
    return tf.ensure_shape(image, [*size, 3])


def _random_window(hw):
    begin, crop, _ = tf.image.sample_distorted_bounding_box(
        tf.concat([hw, [3]], 0),
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        min_object_covered=_MIN_COVERED,
        aspect_ratio_range=_ASPECT,
        area_range=_AREA,
        max_attempts=_ATTEMPTS,
        use_image_if_no_bounding_boxes=True,
    )
    return begin, crop


def _train_image(encoded, size):
    begin, crop = _random_window(_shape(encoded))
    window = tf.concat([begin[:2], crop[:2]], 0)
    image = tf.image.resize(_decode_window(encoded, window), size)
    image = tf.image.random_flip_left_right(image)
    return tf.ensure_shape(image, [*size, 3])


def _stretch_image(encoded, size):
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    return tf.ensure_shape(tf.image.resize(image, size), [*size, 3])


def _crop_image(encoded, size):
    # Keras's crop_to_aspect_ratio window (`smart_resize`), decoded fused with the crop.
    hw = _shape(encoded)
    crop_h = tf.maximum(tf.minimum(hw[0], tf.cast(tf.cast(hw[1] * size[0], tf.float32) / size[1],
                                                  tf.int32)), 1)
    crop_w = tf.maximum(tf.minimum(hw[1], tf.cast(tf.cast(hw[0] * size[1], tf.float32) / size[0],
                                                  tf.int32)), 1)
    window = tf.stack([tf.cast(tf.cast(hw[0] - crop_h, tf.float32) / 2, tf.int32),
                       tf.cast(tf.cast(hw[1] - crop_w, tf.float32) / 2, tf.int32), crop_h, crop_w])
    image = tf.image.resize(_decode_window(encoded, window), size)
    return tf.ensure_shape(image, [*size, 3])


_IMAGE_FNS = {"eval": _eval_image, "train": _train_image, "stretch": _stretch_image,
              "crop": _crop_image}


# ---------------------------------------------------------------------------
# The pipelines.


def _shard_files(data_dir: str) -> list[str]:
    files = sorted(tf.io.gfile.glob(os.path.join(data_dir, f"{_SPLIT}-*.tfrecord")))
    if not files:
        raise FileNotFoundError(f"No {_SPLIT}-*.tfrecord shard files in {data_dir}")
    return files


def shardsmith(data_dir: str, preset: str, size, batch_size: int, *,
               reduced_decode: bool = False) -> tf.data.Dataset:
    import readers

    options = {
        "eval": dict(shuffle=False, resize="crop", crop_fraction=_EVAL_CROP),
        "train": dict(shuffle=True, augment="standard"),
        "stretch": dict(shuffle=True),
        "crop": dict(shuffle=True, resize="crop"),
    }[preset]
    return readers.image_dataset_from_tfrecords(
        data_dir, _SPLIT, batch_size=batch_size, image_size=size, repeat=True,
        reduced_decode=reduced_decode, **options
    )


def global_shuffle(data_dir: str, preset: str, size, batch_size: int,
                   tf_reader: bool = False) -> tf.data.Dataset:
    """shardsmith's reader with shuffle='global' (and the preset's decode)."""
    import readers
    from readers import record_index

    if tf_reader:
        record_index._READER = "tf"
    options = {
        "eval": dict(resize="crop", crop_fraction=_EVAL_CROP),
        "train": dict(augment="standard"),
        "stretch": {},
        "crop": dict(resize="crop"),
    }[preset]
    return readers.image_dataset_from_tfrecords(
        data_dir, _SPLIT, batch_size=batch_size, image_size=size, repeat=True,
        shuffle="global", seed=0, **options,
    )


def hand(data_dir: str, preset: str, size, batch_size: int, *,
         record_buffer: int = 1024) -> tf.data.Dataset:
    """The hand-tuned TFRecord pipeline; with `record_buffer=0`, the plain one."""
    files = _shard_files(data_dir)
    spec = IMAGE_SCHEMA.parse_spec([IMAGE.key, LABEL.key])
    image_fn = _IMAGE_FNS[preset]
    shuffle = preset != "eval"
    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle:
        ds = ds.shuffle(len(files), reshuffle_each_iteration=True)
    ds = ds.interleave(
        tf.data.TFRecordDataset,
        cycle_length=len(files),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    if shuffle and record_buffer:
        ds = ds.shuffle(record_buffer)
    ds = ds.repeat()
    ds = ds.batch(_PARSE_BATCH).map(
        lambda s: tf.io.parse_example(s, spec), num_parallel_calls=tf.data.AUTOTUNE
    ).unbatch()
    ds = ds.map(
        lambda f: (image_fn(f[IMAGE.key], size), tf.cast(f[LABEL.key], tf.int32)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    ds = ds.batch(batch_size, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return ds.prefetch(tf.data.AUTOTUNE)


def load_encoded(data_dir: str) -> tf.Tensor:
    """The stored image bytes of every record, in memory (before the clock)."""
    spec = IMAGE_SCHEMA.parse_spec([IMAGE.key])
    ds = tf.data.TFRecordDataset(_shard_files(data_dir)).batch(256).map(
        lambda s: tf.io.parse_example(s, spec)[IMAGE.key]
    )
    return tf.concat(list(ds), axis=0)


def ceiling(encoded: tf.Tensor, preset: str, size, batch_size: int) -> tf.data.Dataset:
    """The decode ceiling: in-memory bytes, decoded by a parallel map.

    Images decode one per map call, except small ones (mean size up to 32
    KiB), which decode a batch per call (a loop in the function): for them
    tf.data's per-element overhead is a large part of the work.
    """
    image_fn = _IMAGE_FNS[preset]
    ds = tf.data.Dataset.from_tensor_slices(encoded).repeat()
    mean_bytes = float(tf.reduce_mean(tf.cast(tf.strings.length(encoded), tf.float32)))
    if mean_bytes <= _SMALL_IMAGE_BYTES:
        spec = tf.TensorSpec([*size, 3], tf.float32)
        ds = ds.batch(batch_size).map(
            lambda b: tf.map_fn(lambda e: image_fn(e, size), b, fn_output_signature=spec),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    else:
        ds = ds.map(lambda e: image_fn(e, size), num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=False)
        ds = ds.batch(batch_size, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return ds.prefetch(tf.data.AUTOTUNE)


def _random_crop_batch(images, labels, size):
    """The training preset's random resized crop and flip, after Keras's loader."""
    shape = tf.shape(images)
    n = shape[0]

    def box(_):
        begin, crop = _random_window(shape[1:3])
        begin = tf.cast(begin[:2], tf.float32)
        crop = tf.cast(crop[:2], tf.float32)
        hw = tf.cast(shape[1:3], tf.float32)
        return tf.concat([begin / hw, (begin + crop) / hw], 0)

    boxes = tf.map_fn(box, tf.range(n), fn_output_signature=tf.float32)
    out = tf.image.crop_and_resize(images, boxes, tf.range(n), size)
    flip = tf.random.uniform([n]) < 0.5
    out = tf.where(flip[:, None, None, None], tf.reverse(out, [2]), out)
    return out, labels


def keras_directory(raw_dir: str, preset: str, size, batch_size: int) -> tf.data.Dataset:
    import keras

    ds = keras.utils.image_dataset_from_directory(
        raw_dir, image_size=size, batch_size=batch_size, shuffle=preset != "eval", verbose=False,
        crop_to_aspect_ratio=preset == "crop",
    )
    ds = ds.repeat()
    if preset == "train":
        ds = ds.map(lambda x, y: _random_crop_batch(x, y, size),
                    num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    return ds


# ---------------------------------------------------------------------------
# Timing.


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _images_in(batch) -> int:
    """Images in a batch: `(images, labels)` or images alone."""
    return int((batch[0] if isinstance(batch, tuple) else batch).shape[0])


def measure(build, *, warmup: int, batches: int, min_seconds: float = 0.0) -> dict:
    """Times `build()` and the batches it yields.

    Args:
      build: Builds the dataset; the clock starts just before it is called.
      warmup: Batches taken after the first one before the timed window.
      batches: Fewest batches in the timed window.
      min_seconds: The window goes on until it lasted at least this long.

    Returns:
      A dict with ttfb_s, ttfb_cpu_s (CPU time of the process to the first
      batch: steadier than ttfb_s on shared cores), images_per_s,
      cpu_ms_per_image, images (timed), window_s and peak_rss_mib.
    """
    cpu_start, start = _cpu_seconds(), time.perf_counter()
    it = iter(build())
    first_images = _images_in(next(it))
    ttfb = time.perf_counter() - start
    ttfb_cpu = _cpu_seconds() - cpu_start
    for _ in range(warmup):
        next(it)
    images = 0
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    taken = 0
    while taken < batches or time.perf_counter() - t0 < min_seconds:
        batch = next(it)
        images += _images_in(batch)
        taken += 1
    window = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    return {
        "ttfb_s": ttfb,
        "ttfb_cpu_s": ttfb_cpu,
        "first_batch_images": first_images,
        "images_per_s": images / window,
        "cpu_ms_per_image": 1000 * cpu / images,
        "images": images,
        "window_s": window,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def measure_first(build, *, images: int) -> dict:
    """Times `build()` and its first `images` images, start-up included (a cold epoch).

    Returns:
      The dict of `measure`, over the whole span.
    """
    cpu0, start = _cpu_seconds(), time.perf_counter()
    it = iter(build())
    batch = next(it)
    ttfb = time.perf_counter() - start
    ttfb_cpu = _cpu_seconds() - cpu0
    taken = first_images = _images_in(batch)
    while taken < images:
        batch = next(it)
        taken += _images_in(batch)
    span = time.perf_counter() - start
    return {
        "ttfb_s": ttfb,
        "ttfb_cpu_s": ttfb_cpu,
        # Fewer than the batch size where the corpus is smaller (Keras's last, partial batch).
        "first_batch_images": first_images,
        "images_per_s": taken / span,
        "cpu_ms_per_image": 1000 * (_cpu_seconds() - cpu0) / taken,
        "images": taken,
        "window_s": span,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._read_baselines",
                                     description="Time one input pipeline (see bench.read).")
    parser.add_argument("pipeline", choices=PIPELINES)
    parser.add_argument("preset", choices=PRESETS)
    parser.add_argument("--tfrecords", required=True, help="Dataset written by the converter.")
    parser.add_argument("--raw", required=True, help="The image folder it was converted from.")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=16)
    parser.add_argument("--batches", type=int, default=64)
    parser.add_argument("--min_seconds", type=float, default=0.0)
    parser.add_argument("--first_images", type=int, default=0,
                        help="Time the first N images from the start instead (a cold epoch).")
    args = parser.parse_args(argv)
    size = (args.image_size, args.image_size)
    if args.pipeline == "keras":
        import keras  # noqa: F401  (imported before the clock, like TensorFlow)
    if args.pipeline in ("shardsmith", "reduced", "global", "global-tf"):
        import readers

        # As the README tells a trainer to: before TensorFlow's first op.
        readers.use_pooled_host_memory()

    if args.pipeline == "ceiling":
        encoded = load_encoded(args.tfrecords)
        build = lambda: ceiling(encoded, args.preset, size, args.batch_size)  # noqa: E731
    else:
        fn = {
            "shardsmith": shardsmith, "hand": hand, "keras": keras_directory,
            "reduced": lambda *a: shardsmith(*a, reduced_decode=True),
            "plain": lambda *a: hand(*a, record_buffer=0),
            "global": global_shuffle,
            "global-tf": lambda *a: global_shuffle(*a, tf_reader=True),
        }[args.pipeline]
        source = args.raw if args.pipeline == "keras" else args.tfrecords
        build = lambda: fn(source, args.preset, size, args.batch_size)  # noqa: E731
    if args.first_images:
        result = measure_first(build, images=args.first_images)
    else:
        result = measure(build, warmup=args.warmup, batches=args.batches,
                         min_seconds=args.min_seconds)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    # Without the interpreter's teardown after TensorFlow (~2 s of CPU per reading process; its
    # figures are taken in the process, before the end).
    from conversion import console

    console.exit_program(main())
