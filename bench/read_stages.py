"""Where the reader spends its time: each stage alone, and the levers, in one process.

On the photos of `bench.read` (`bench.corpus photos`, ~500x375 JPEGs, 10% PNG,
converted once by `beam_jobs.convert`), every stage of reading is timed alone
on the same bytes, one tf.data pipeline per stage, all cores (AUTOTUNE):

- read: the shard files through an interleave of TFRecord readers, nothing
  parsed (warm page cache);
- parse: `tf.io.parse_example` of serialized records held in memory, 64 a
  call (the reader's way), and one record a call (for the per-element cost);
- decode: the stored image bytes held in memory, decoded whole, one per
  call; and at a reduced JPEG scale where that stays at least the output
  size (`reduced`, the opt-in `reduced_decode=True`; output 112 here, where
  it applies to these photos; at 224 it needs stored sides >= 448);
- decode + resize: the same, resized to the output size (the stretch
  policy): the decode ceiling of `bench.read`;
- resize: 256 images decoded beforehand, resized one per call;
- per element: an image-sized float32 tensor (and a uint8 one) through a map
  and a batch of 32, no work in the map: what tf.data costs per element and
  per copy into its batch;
- reader: `readers.image_dataset_from_tfrecords` from the files (stretch,
  shuffled, the defaults), with `dtype="uint8"`, at 112 with and without
  `reduced_decode`, and unshuffled; ablations of two of its changes (8-bit
  output converted per batch; parse, decode and finish as three maps); the
  hand-tuned TFRecord pipeline of `bench._read_baselines` for reference;
- interleave: the reader's record stream alone (shards shuffled, interleave,
  record buffer), and with block_length 1 against 8.

Each stage runs in `--rounds` rounds (order rotated per round); every figure
is the median over rounds of images/s and CPU ms per image (process CPU over
the timed window). CPU per image is the steadier figure on shared cores; the
share column is a stage's CPU per image over the reader's.

Then the first batch (time to first batch, TTFB): in this process after a
warm-up build, median of the rounds: dataset construction, then the first
`next()`; the reader against the hand-tuned pipeline and keras's
`image_dataset_from_directory` on the raw files, the reader before its fused
photo stages, the reader with tf.data's autotuner starting at full
parallelism (`initial_parallelism`), and the evaluation path of both TFRecord
readers.

Usage:

  python -m bench.read_stages [--count 2000] [--work build/bench] [--rounds 5]
      [--images 1024] [--only NAMES] [--json FILE]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

from bench._cli import write_json

__all__ = ["STAGES", "run", "main"]

_LOG = logging.getLogger("shardsmith.bench.read_stages")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SIZE = 224
_SMALL_OUT = 112
_BATCH = 32

# (name, label); the builders are in `_builders`.
STAGES = (
    ("read", "read: interleaved TFRecord files, no parse"),
    ("parse64", "parse: parse_example, 64 records a call"),
    ("parse1", "parse: one record a call"),
    ("decode", "decode: whole image, one a call"),
    ("decode_resize", "decode + resize to 224 (decode ceiling)"),
    ("resize", "resize to 224 alone (decoded beforehand)"),
    ("elem_f32", "per element: map + batch, float32 224x224x3"),
    ("elem_u8", "per element: map + batch, uint8 224x224x3"),
    ("elem_tiny", "per element: map + batch, a scalar"),
    ("records", "reader's record stream (interleave + buffer)"),
    ("records_b8", "same, interleave block_length 8"),
    ("reader", "reader, defaults (stretch 224, shuffled)"),
    ("reader_unfused", "reader, parse/decode/finish as 3 maps (before)"),
    ("reader_noshuf", "reader, shuffle=False"),
    ("reader_u8", "reader, dtype='uint8' (converted per image)"),
    ("reader_u8_batch", "reader, dtype='uint8', converted per batch (before)"),
    ("hand", "hand-tuned TFRecord (bench._read_baselines)"),
    ("decode_resize112", "decode + resize to 112"),
    ("decode_reduced112", "decode at 1/2 scale + resize to 112"),
    ("reader112", "reader at 112"),
    ("reader112_reduced", "reader at 112, reduced_decode=True"),
)


def _builders(data_dir: str, raw_dir: str):
    """Every stage's `() -> (dataset, images per element)`, over data loaded once."""
    import tensorflow as tf

    import readers
    from bench import _read_baselines as baselines
    from readers import dataset as reader_dataset
    from readers import metadata
    from readers.options import ReaderConfig
    from schemas import IMAGE, IMAGE_SCHEMA, LABEL

    files = sorted(tf.io.gfile.glob(os.path.join(data_dir, "train-*.tfrecord")))
    serialized = tf.concat(list(tf.data.TFRecordDataset(files).batch(512)), 0)
    spec = IMAGE_SCHEMA.parse_spec([IMAGE.key, LABEL.key])
    encoded = tf.io.parse_example(serialized, IMAGE_SCHEMA.parse_spec([IMAGE.key]))[IMAGE.key]
    size = (_SIZE, _SIZE)
    decoded = [tf.io.decode_image(e, channels=3, expand_animations=False)
               for e in tf.unstack(encoded[:256])]
    # One dense tensor (zero-padded) and the sizes: each element sliced back in the map.
    shapes = tf.constant([d.shape[:2] for d in decoded], tf.int32)
    padded = tf.stack([tf.image.pad_to_bounding_box(d, 0, 0, int(tf.reduce_max(shapes[:, 0])),
                                                    int(tf.reduce_max(shapes[:, 1])))
                       for d in decoded])
    del decoded
    AUTO = tf.data.AUTOTUNE

    def mem(tensor):
        return tf.data.Dataset.from_tensor_slices(tensor).repeat()

    def decode(e):
        return tf.io.decode_image(e, channels=3, expand_animations=False)

    def reduced(e, out):
        from readers import preprocess
        return preprocess.load_image(e, image_size=(out, out), reduced_decode=True)

    def stretch(e, out):
        return tf.image.resize(decode(e), (out, out))

    def reader(**options):
        options = {"batch_size": _BATCH, "image_size": size, "repeat": True, **options}
        return readers.image_dataset_from_tfrecords(data_dir, "train", **options)

    def per_batch_cast(**options):
        # The reader as it was before `_Stages.converts_per_image`: float32 pixels batched,
        # converted per batch (an ablation of the bench, not an option).
        saved = reader_dataset._Stages.converts_per_image
        reader_dataset._Stages.converts_per_image = property(lambda self: False)
        try:
            return reader(**options)
        finally:
            reader_dataset._Stages.converts_per_image = saved

    def unfused(**options):
        # The reader before `_PHOTOS_PER_IMAGE`: parse, decode and finish in three maps.
        reader_dataset._FUSED_PHOTO_STAGES = False
        try:
            return reader(**options)
        finally:
            reader_dataset._FUSED_PHOTO_STAGES = True

    def records(block_length=1):
        split = metadata.load_split(data_dir, "train")
        config = ReaderConfig(batch_size=_BATCH, repeat=True)
        saved = reader_dataset._BLOCK_LENGTH if hasattr(reader_dataset, "_BLOCK_LENGTH") else None
        if saved is not None:
            reader_dataset._BLOCK_LENGTH = block_length
        try:
            ds, _, _ = reader_dataset._shards_records(
                split, config.shuffling, config.reading, pipeline_id=0, num_pipelines=1,
                standard=False)
        finally:
            if saved is not None:
                reader_dataset._BLOCK_LENGTH = saved
        return ds.batch(_BATCH).prefetch(AUTO)

    elem_f32 = tf.zeros([_SIZE, _SIZE, 3], tf.float32)
    elem_u8 = tf.zeros([_SIZE, _SIZE, 3], tf.uint8)

    def per_element(value):
        ds = tf.data.Dataset.from_tensors(value).repeat()
        return ds.map(lambda x: x + 0, num_parallel_calls=AUTO).batch(_BATCH).prefetch(AUTO)

    crop = {"shuffle": False, "resize": "crop", "crop_fraction": 0.875}
    return {
        "read": lambda: (tf.data.Dataset.from_tensor_slices(files).interleave(
            tf.data.TFRecordDataset, cycle_length=len(files), num_parallel_calls=AUTO,
            deterministic=False).repeat().batch(_BATCH).prefetch(AUTO), _BATCH),
        "parse64": lambda: (mem(serialized).batch(64).map(
            lambda s: tf.io.parse_example(s, spec), num_parallel_calls=AUTO).prefetch(AUTO), 64),
        "parse1": lambda: (mem(serialized).map(
            lambda s: tf.io.parse_single_example(s, spec), num_parallel_calls=AUTO)
            .batch(64).prefetch(AUTO), 64),
        "decode": lambda: (mem(encoded).map(lambda e: tf.shape(decode(e)),
                                            num_parallel_calls=AUTO).batch(_BATCH)
                           .prefetch(AUTO), _BATCH),
        "decode_resize": lambda: (mem(encoded).map(lambda e: stretch(e, _SIZE),
                                                   num_parallel_calls=AUTO)
                                  .batch(_BATCH).prefetch(AUTO), _BATCH),
        "resize": lambda: (mem((padded, shapes)).map(
            lambda d, hw: tf.image.resize(d[:hw[0], :hw[1]], size), num_parallel_calls=AUTO)
                           .batch(_BATCH).prefetch(AUTO), _BATCH),
        "elem_f32": lambda: (per_element(elem_f32), _BATCH),
        "elem_u8": lambda: (per_element(elem_u8), _BATCH),
        "elem_tiny": lambda: (per_element(tf.constant(0.0)), _BATCH),
        "records": lambda: (records(1), _BATCH),
        "records_b8": lambda: (records(8), _BATCH),
        "reader": lambda: (reader(), _BATCH),
        "reader_noshuf": lambda: (reader(shuffle=False), _BATCH),
        "reader_u8": lambda: (reader(dtype="uint8"), _BATCH),
        "reader_u8_batch": lambda: (per_batch_cast(dtype="uint8"), _BATCH),
        "reader_unfused": lambda: (unfused(), _BATCH),
        "hand": lambda: (baselines.hand(data_dir, "stretch", size, _BATCH), _BATCH),
        "decode_resize112": lambda: (mem(encoded).map(lambda e: stretch(e, _SMALL_OUT),
                                                      num_parallel_calls=AUTO)
                                     .batch(_BATCH).prefetch(AUTO), _BATCH),
        "decode_reduced112": lambda: (mem(encoded).map(lambda e: reduced(e, _SMALL_OUT),
                                                       num_parallel_calls=AUTO)
                                      .batch(_BATCH).prefetch(AUTO), _BATCH),
        "reader112": lambda: (reader(image_size=(_SMALL_OUT, _SMALL_OUT)), _BATCH),
        "reader112_reduced": lambda: (reader(image_size=(_SMALL_OUT, _SMALL_OUT),
                                             reduced_decode=True), _BATCH),
    }, {
        "reader": lambda **o: reader(**o),
        "hand": lambda: baselines.hand(data_dir, "stretch", size, _BATCH),
        "reader, before (3 maps)": lambda: unfused(),
        "keras image_dataset_from_directory": lambda: baselines.keras_directory(
            raw_dir, "stretch", size, _BATCH),
        "reader, eval (crop 0.875, unshuffled)": lambda: reader(**crop),
        "hand, eval": lambda: baselines.hand(data_dir, "eval", size, _BATCH),
    }


def _cpu() -> float:
    # Every thread of the process, at the clock's resolution (os.times: 10 ms ticks).
    return time.process_time()


# Warm-up before a stage's window, in images: the autotuner's ramp; for the pipelines
# that read files, past the fill of the reader's record buffer (1,024 records).
_WARMUP_IMAGES = 128
_WARMUP_READ_IMAGES = 1152


def _time_stage(build, images: int, warmup: int) -> dict:
    ds, per = build()
    it = iter(ds)
    for _ in range(-(-warmup // per)):
        next(it)
    taken = 0
    c0, t0 = _cpu(), time.perf_counter()
    while taken < images:
        next(it)
        taken += per
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    del it
    return {"images_per_s": taken / wall, "cpu_ms_per_image": 1000 * cpu / taken}


def _time_first(build) -> dict:
    c0, t0 = _cpu(), time.perf_counter()
    ds = build()
    built = time.perf_counter() - t0
    next(iter(ds))
    return {"build_s": built, "ttfb_s": time.perf_counter() - t0, "ttfb_cpu_s": _cpu() - c0}


def run(data_dir: str, raw_dir: str, *, rounds: int, images: int,
        names: tuple[str, ...] | None) -> dict:
    import psutil
    import tensorflow as tf

    stages = [s for s in STAGES if names is None or s[0] in names]
    builders, firsts = _builders(data_dir, raw_dir)
    load = [psutil.getloadavg()[0]]
    runs: dict[str, list[dict]] = {name: [] for name, _ in stages}

    def initial_parallelism():
        ds = firsts["reader"]()
        options = tf.data.Options()
        options.autotune.initial_parallelism = os.cpu_count()
        return ds.with_options(options)

    first_kinds = {"reader": firsts["reader"], "hand": firsts["hand"],
                   "reader, before (3 maps)": firsts["reader, before (3 maps)"],
                   "keras image_dataset_from_directory":
                       firsts["keras image_dataset_from_directory"],
                   "reader, initial_parallelism=cores": initial_parallelism,
                   "reader, eval (crop 0.875, unshuffled)":
                       firsts["reader, eval (crop 0.875, unshuffled)"],
                   "hand, eval": firsts["hand, eval"]}
    first_runs: dict[str, list[dict]] = {k: [] for k in first_kinds}
    for name in first_kinds:  # warm-up: TensorFlow's one-off start-up costs
        _time_first(first_kinds[name])
    for r in range(rounds):
        order = stages[r % len(stages):] + stages[:r % len(stages)]
        for name, _ in order:
            warmup = (_WARMUP_READ_IMAGES if name.startswith(("reader", "records", "hand"))
                      else _WARMUP_IMAGES)
            runs[name].append(_time_stage(builders[name], images, warmup))
        kinds = list(first_kinds)
        for name in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            first_runs[name].append(_time_first(first_kinds[name]))
        load.append(psutil.getloadavg()[0])
        _LOG.info("round %d/%d done (load %.1f)", r + 1, rounds, load[-1])
    med = {name: {k: statistics.median(run[k] for run in rs) for k in rs[0]}
           for name, rs in runs.items()}
    first = {name: {k: statistics.median(run[k] for run in rs) for k in rs[0]}
             for name, rs in first_runs.items()}
    reader_cpu = med.get("reader", {}).get("cpu_ms_per_image")
    print(f"\nStages of reading {data_dir} (photos) alone, {images} images a stage per round, "
          f"median of {rounds} rounds (order rotated); {os.cpu_count()} cores, load average "
          f"{min(load):.1f}-{max(load):.1f} (uptime's 1-minute figure).")
    head = f"{'stage':<48} {'images/s':>9} {'CPU ms/img':>10} {'of reader CPU':>13}"
    print(head)
    print("-" * len(head))
    for name, label in stages:
        m = med[name]
        share = f"{m['cpu_ms_per_image'] / reader_cpu:>12.0%}" if reader_cpu else ""
        print(f"{label:<48} {m['images_per_s']:>9.0f} {m['cpu_ms_per_image']:>10.3f} {share:>13}")
    print("\nFirst batch (batch 32, 224), in this process after a warm-up build, "
          f"median of {rounds}:")
    for name, f in first.items():
        print(f"  {name:<36} build {f['build_s']:.3f} s, first batch {f['ttfb_s']:.3f} s "
              f"(CPU {f['ttfb_cpu_s']:.2f} s)")
    return {"stages": med, "runs": runs, "first_batch": first, "load": load,
            "rounds": rounds, "images": images}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.read_stages",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="Photos (default 2000).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=os.path.join(_REPO, "build", "bench"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--images", type=int, default=1024,
                        help="Images timed per stage and round (default 1024).")
    parser.add_argument("--only", help="Comma-separated stages: " + ",".join(n for n, _ in STAGES))
    parser.add_argument("--json", help="Also write the results to this file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = None
    if args.only:
        names = tuple(n.strip() for n in args.only.split(","))
        unknown = set(names) - {n for n, _ in STAGES}
        if unknown:
            parser.error(f"unknown stages {sorted(unknown)}")
    from bench import read

    raw_dir, data_dir = read.prepare("photos", args.count, args.seed, os.path.abspath(args.work))
    read._warm_page_cache(raw_dir, data_dir)
    import readers

    readers.use_pooled_host_memory()  # as bench.read's reader processes do
    import keras  # noqa: F401  (before the clock, as bench.read's keras process)

    summary = run(data_dir, raw_dir, rounds=args.rounds, images=args.images, names=names)
    write_json(args.json, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
