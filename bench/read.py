"""Reading benchmark: shardsmith's reader against the usual ways to feed a model.

On the corpora of the conversion benchmark (`bench.corpus photos`: ImageNet-like
~500x375 JPEGs of 100-150 KB, 10% PNG; `bench.corpus small`: 64x64 JPEGs; and `bench.corpus tiny`: 32x32 JPEGs,
read at 32x32 (issue 40), as many as --small-count),
converted once with `beam_jobs.convert`, it measures at 224x224, batch 32:

- images/s in steady state: a timed window of batches after a warm-up;
- time to first batch (TTFB): from the start of dataset construction, in a
  fresh process (after `import tensorflow`), and the CPU time of the process
  over the same span (steadier on shared cores);
- CPU time of the process per image in the window: on a machine shared with
  other work it is steadier than images/s, and shows the work each contender
  does per image;

for these contenders (`bench._read_baselines` describes each exactly):

- shardsmith: `readers.image_dataset_from_tfrecords`;
- shuffle='global' (training preset only): the same reader with a true
  per-epoch permutation, each record read alone at its offset (Python
  positioned reads for local files); and, for reference, the same reading
  with TensorFlow's TFRecord reader at an offset (what URLs use);
- hand-tuned: a tuned tf.data TFRecord pipeline (interleave, batched parse,
  fused decode, batch, prefetch), written against `schemas` alone; its
  1,024-record shuffle buffer fills before its first batch;
- plain TFRecord ("photos, b64" only): the same pipeline with no record
  buffer, nothing to fill before the first batch: with
  `image_dataset_from_directory`, the fastest honest start to compare the
  first batch against (issue 26);
- decode ceiling: the same encoded bytes already in memory, decoded and
  resized with the same per-image work by a parallel map on all cores;
- keras: `keras.utils.image_dataset_from_directory` on the raw image files
  (full decode and stretch resize), followed for the training preset by the
  same random resized crop and flip.

Scenarios:

- photos eval: the evaluation path (centre crop of 0.875, fused with JPEG
  decoding, resized), not shuffled;
- photos train: the training preset (`augment="standard"`: random resized crop
  fused with decoding, random flip), shuffled;
- small, cold: the 64x64 corpus, default options (shuffled, stretch resize to
  224x224), timed over its first epoch (time to first batch included) after
  every image file and shard was dropped from the page cache
  (`posix_fadvise(DONTNEED)`, Linux): each loose file is then read from the
  disk, as in a first epoch or a dataset larger than memory, which is where
  the per-file cost of loose files shows;
- small, warm: the same in steady state on a warm page cache; and, for
  reference, at 64x64 output ('small @64x64'), where the resize to 224x224
  is gone.
- photos, b64: the default options (`shuffle=True`, stretch resize), batch
  64, steady images/s and TTFB, at least 5 rounds: the "kickstart" case of a
  trainer that must show its first loss soon (issue 15);
- phone, 1st b.: the first batch of 64 from `bench.corpus phone` (4032x3024
  JPEGs, `--phone-count`, default 120), default options, warm page cache:
  TTFB only (images/s over that first batch), at least 5 rounds. With fewer
  phone photos than the batch, Keras's first batch holds them all and no more
  (a TTFB of fewer images: printed as not comparable).
- photos crop (issue 40): `resize="crop"` against
  `image_dataset_from_directory(crop_to_aspect_ratio=True)`, the same values;
  the reader decodes the centred window alone (`decode_and_crop_jpeg`), Keras
  the whole image; batch 64, at least 5 rounds.
- capped 224 (issue 40): a separate, documented configuration, not the
  default figure: the photos converted again with `--min_side 224` (stored at
  the training size: other bytes, other values), read with the default
  options and compared with the peers reading the original photos.

Targets (2-core machine): photos eval, shardsmith >= 0.95x the hand-tuned
pipeline and >= 0.9x the decode ceiling in images/s, TTFB <= 1.5x the
hand-tuned pipeline's; photos train, shardsmith >= 1.5x keras followed by the
same random crop; small (cold), shardsmith >= 3x keras; photos train,
shuffle='global' >= 0.9x shardsmith's default (shards) shuffle; photos b64,
TTFB <= 1.2x the hand-tuned pipeline's and <= 1.5x idfd's, <= 1.2x the plain
TFRecord reader's, images/s >= 1.0x hand-tuned and idfd, >= 0.95x plain;
phone, TTFB <= 1.2x hand-tuned and <= 1.5x idfd. Issue 40 raised the photos
b64 bounds: images/s >= 1.05x hand-tuned, >= 1.10x idfd and >= 0.95x the decode
ceiling of the same scenario ('kick-ceiling'), TTFB <= 1.0x idfd; and phone,
TTFB with `reduced_decode=True` ('phone-reduced') <= 1.0x idfd. Below the
targets, each contender's share of its scenario's decode ceiling is printed.

Every contender runs in its own process, one after another; each is run
`--repeat` times (default 3, rounds interleaved), and its best images/s and
best TTFB and CPU time per image are kept; each ratio is also printed as the
median over rounds of the ratio within each round (wall and CPU) (the cores may be shared with
other work: figures are noisy; CPU time per image is the steadier figure, and
each target is also shown as a ratio of images per CPU-second). The steady
window is at least one epoch, 64 batches and `--min-seconds`. Page caches are
warmed first (and dropped again before each cold contender).

Measured on the 2-core machine on 2026-11-30 (evening; defaults: 2,000 photos,
20,000 small images; best of 3; load average 1.1-2.0), images/s: photos eval
shardsmith 588, hand-tuned 598, ceiling 618 (0.98x, 0.95x; TTFB 0.50 s vs
0.70 s); photos train shardsmith 629 vs idfd + crop 300 (2.09x); global
shuffle 599 (0.95x of shards mode). Small (a later run, after the manifest's
image stats; best of 3, load 1.2-1.8): cold 5236 vs idfd 1494 (3.50x; every
round >= 3.26x), warm 5361 vs 2628 (2.04x), at 64x64 output 15117 vs 8812
(1.72x); CPU ms per image 0.35 / 0.35 / 0.13 against idfd's 1.08 / 0.74 /
0.21. With the same host-memory pool idfd reaches 2030 cold and 3062 warm
(shardsmith 2.58x and 1.75x of that). Earlier figures (2026-11-29, best of 3,
load 1.2-3.2): photos eval 949 vs hand-tuned 956 vs ceiling 1047; train 978 vs
601; small warm 4731 vs 4815; small @64x64 24145 vs 18696 (a faster day).

Corpora are made in `WORK/corpora` (shared with `bench.convert`) and converted
into `WORK/read/`; both are reused by later runs with the same count and seed.

Usage:

  python -m bench.read [--count 2000] [--small-count 20000] [--seed 0]
      [--work build/bench] [--skip-small] [--phone-count 120] [--skip-phone] [--repeat 3] [--warmup 16] [--only NAMES]
      [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

from bench import corpus
from bench._cli import parse_only, write_json

__all__ = ["Contender", "CONTENDERS", "TARGETS", "prepare", "run_contender", "run", "main"]

_LOG = logging.getLogger("shardsmith.bench.read")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STAMP = ".bench-read.json"
_STAMP_VERSION = 2  # 2: manifests with image stats
# What `bench._read_baselines` prints before its result (not imported from
# there: that would load TensorFlow into this process).
RESULT_PREFIX = "BENCH_READ_RESULT "


@dataclasses.dataclass(frozen=True)
class Contender:
    """One pipeline on one corpus.

    Attributes:
      name: Short id (`--only`, JSON results).
      corpus: 'photos', 'small', 'tiny' (32x32, as many as 'small') or 'phone'.
      pipeline: One of `bench._read_baselines.PIPELINES`.
      preset: One of `bench._read_baselines.PRESETS`.
      label: Row title of the table.
      image_size: Side of the square output images.
      cold: Measure the first epoch after the corpus's files (images and
        shards) are dropped from the page cache, instead of the steady state.
      env: Extra environment variables of its process.
      batch_size: Images per batch.
      first_batch_only: Time the first batch alone (TTFB, warm page cache):
        for corpora too large to reach a steady state quickly.
      rounds: Runs at least this many rounds of it, whatever `--repeat`.
      convert_args: Extra flags of the conversion it reads (e.g. `--min_side 224`: a
        separate, documented configuration that stores other bytes, not the default figure).
    """

    name: str
    corpus: str
    pipeline: str
    preset: str
    label: str
    image_size: int = 224
    cold: bool = False
    env: tuple[tuple[str, str], ...] = ()
    batch_size: int = 32
    first_batch_only: bool = False
    rounds: int = 0
    convert_args: tuple[str, ...] = ()


# The host-memory pool that `readers.use_pooled_host_memory()` turns on (readers/_allocator.py).
# The decode ceilings always have it (a ceiling is the fastest this TensorFlow
# can go); the '-pool' rows give it to a baseline, to show what it alone is worth.
_POOL = (("TF_CPU_ALLOCATOR_USE_BFC", "true"),)


CONTENDERS = (
    Contender("eval-shardsmith", "photos", "shardsmith", "eval", "shardsmith reader"),
    Contender("eval-hand", "photos", "hand", "eval", "hand-tuned TFRecord"),
    Contender("eval-ceiling", "photos", "ceiling", "eval", "decode ceiling (in memory)",
              env=_POOL),
    Contender("eval-hand-pool", "photos", "hand", "eval", "hand-tuned, TF's BFC pool", env=_POOL),
    Contender("eval-keras", "photos", "keras", "stretch", "image_dataset_from_directory*"),
    Contender("train-shardsmith", "photos", "shardsmith", "train", "shardsmith augment=standard"),
    Contender("train-keras", "photos", "keras", "train", "idfd + random crop + flip"),
    Contender("train-hand", "photos", "hand", "train", "hand-tuned TFRecord"),
    Contender("train-ceiling", "photos", "ceiling", "train", "decode ceiling (in memory)",
              env=_POOL),
    Contender("train-global", "photos", "global", "train", "shuffle='global'"),
    Contender("train-global-tf", "photos", "global-tf", "train", "shuffle='global', TF reads"),
    # Where per-file cost dominates: the first epoch read from storage, as
    # in training on a dataset that is not in memory (or larger than it).
    Contender("smallcold-shardsmith", "small", "shardsmith", "stretch", "shardsmith reader",
              cold=True),
    Contender("smallcold-keras", "small", "keras", "stretch", "image_dataset_from_directory",
              cold=True),
    Contender("smallcold-keras-pool", "small", "keras", "stretch", "idfd, TF's BFC pool",
              cold=True, env=_POOL),
    Contender("smallcold-hand", "small", "hand", "stretch", "hand-tuned TFRecord", cold=True),
    Contender("small-shardsmith", "small", "shardsmith", "stretch", "shardsmith reader"),
    Contender("small-keras", "small", "keras", "stretch", "image_dataset_from_directory"),
    Contender("small-keras-pool", "small", "keras", "stretch", "idfd, TF's BFC pool", env=_POOL),
    Contender("small-hand", "small", "hand", "stretch", "hand-tuned TFRecord"),
    Contender("small-ceiling", "small", "ceiling", "stretch", "decode ceiling (in memory)",
              env=_POOL),
    # For reference: the same at the images' own size, where the resize to
    # 224x224 (most of the work above) all but vanishes.
    Contender("small64-shardsmith", "small", "shardsmith", "stretch", "shardsmith reader", 64),
    Contender("small64-keras", "small", "keras", "stretch", "image_dataset_from_directory", 64),
    Contender("small64-ceiling", "small", "ceiling", "stretch", "decode ceiling (in memory)", 64,
              env=_POOL),
    # Issue 40: 32x32 JPEGs (`bench.corpus tiny`, ~1.4 KB) read at their own size, where the
    # per-record and per-file costs are the work, not the decode (steady state).
    Contender("tiny32-shardsmith", "tiny", "shardsmith", "stretch", "shardsmith reader", 32),
    Contender("tiny32-keras", "tiny", "keras", "stretch", "image_dataset_from_directory", 32),
    Contender("tiny32-hand", "tiny", "hand", "stretch", "hand-tuned TFRecord", 32),
    # The "kickstart" case (issue 15): the default options (shuffle=True,
    # stretch resize), batch 64; a trainer that shows its first loss soon
    # waits for the first batch more than for the steady rate.
    Contender("kick-shardsmith", "photos", "shardsmith", "stretch", "shardsmith, defaults",
              batch_size=64, rounds=5),
    Contender("kick-hand", "photos", "hand", "stretch", "hand-tuned TFRecord", batch_size=64,
              rounds=5),
    Contender("kick-keras", "photos", "keras", "stretch", "image_dataset_from_directory",
              batch_size=64, rounds=5),
    # The fastest honest start of a TFRecord reader: no record buffer to fill.
    Contender("kick-plain", "photos", "plain", "stretch", "plain TFRecord, no buffer",
              batch_size=64, rounds=5),
    # The limit of the default path (issue 40): the same decode and resize of the same bytes
    # held in memory, on every core.
    Contender("kick-ceiling", "photos", "ceiling", "stretch", "decode ceiling (in memory)",
              batch_size=64, rounds=5, env=_POOL),
    # Issue 40: resize="crop" (Keras's crop_to_aspect_ratio, the same values), where the reader
    # decodes the centred window alone and Keras decodes the whole image, then crops.
    Contender("crop-shardsmith", "photos", "shardsmith", "crop", "shardsmith, resize='crop'",
              batch_size=64, rounds=5),
    Contender("crop-keras", "photos", "keras", "crop", "idfd, crop_to_aspect_ratio",
              batch_size=64, rounds=5),
    # A separate configuration (issue 40): the photos converted with `--min_side 224`, stored
    # at the training size (shorter side 224, antialiased, JPEG re-encoded): other bytes and
    # values than the exact path, compared with the peers on the original photos.
    Contender("capped-shardsmith", "photos", "shardsmith", "stretch",
              "shardsmith, --min_side 224 copy", batch_size=64, rounds=5,
              convert_args=("--min_side", "224")),
    # The same first batch from 12-megapixel phone photos (4032x3024).
    Contender("phone-shardsmith", "phone", "shardsmith", "stretch", "shardsmith, defaults",
              batch_size=64, first_batch_only=True, rounds=5),
    Contender("phone-hand", "phone", "hand", "stretch", "hand-tuned TFRecord", batch_size=64,
              first_batch_only=True, rounds=5),
    Contender("phone-keras", "phone", "keras", "stretch", "image_dataset_from_directory",
              batch_size=64, first_batch_only=True, rounds=5),
    # Opt-in: 12-megapixel JPEGs decoded at 1/8 scale (504x378), then resized.
    Contender("phone-reduced", "phone", "reduced", "stretch", "shardsmith, reduced_decode=True",
              batch_size=64, first_batch_only=True, rounds=5),
)

_SCENARIOS = (
    ("photos eval", "eval-"),
    ("photos train", "train-"),
    ("small, cold", "smallcold-"),
    ("small, warm", "small-"),
    ("small @64x64", "small64-"),
    ("tiny @32x32", "tiny32-"),
    ("photos, b64", "kick-"),
    ("photos crop", "crop-"),
    ("capped 224", "capped-"),
    ("phone, 1st b.", "phone-"),
)


@dataclasses.dataclass(frozen=True)
class Target:
    """A ratio of two contenders' figures that must reach a bound."""

    label: str
    metric: str  # 'images_per_s' or 'ttfb_s'
    numerator: str
    denominator: str
    bound: float
    at_most: bool = False  # True: the ratio must stay at or below `bound`.


TARGETS = (
    Target("tiny @32x32: images/s vs idfd", "images_per_s", "tiny32-shardsmith", "tiny32-keras", 1.5),
    Target("tiny @32x32: images/s vs hand-tuned", "images_per_s", "tiny32-shardsmith", "tiny32-hand", 1.5),
    Target("photos eval: images/s vs hand-tuned", "images_per_s", "eval-shardsmith", "eval-hand", 0.95),
    Target("photos eval: images/s vs decode ceiling", "images_per_s", "eval-shardsmith",
           "eval-ceiling", 0.9),
    Target("photos eval: TTFB vs hand-tuned", "ttfb_s", "eval-shardsmith", "eval-hand", 1.5,
           at_most=True),
    Target("photos train: images/s vs idfd + same crop", "images_per_s", "train-shardsmith",
           "train-keras", 1.5),
    Target("small, cold: images/s vs idfd", "images_per_s", "smallcold-shardsmith",
           "smallcold-keras", 3.0),
    Target("photos train: global shuffle vs shards", "images_per_s", "train-global",
           "train-shardsmith", 0.9),
    Target("photos b64: TTFB vs hand-tuned", "ttfb_s", "kick-shardsmith", "kick-hand", 1.2,
           at_most=True),
    Target("photos b64: TTFB vs idfd", "ttfb_s", "kick-shardsmith", "kick-keras", 1.5,
           at_most=True),
    # Issue 40's bounds: ahead of the peers on the same bytes.
    Target("photos b64: images/s vs hand-tuned", "images_per_s", "kick-shardsmith", "kick-hand",
           1.05),
    Target("photos b64: images/s vs idfd", "images_per_s", "kick-shardsmith", "kick-keras", 1.10),
    Target("photos b64: images/s vs decode ceiling", "images_per_s", "kick-shardsmith",
           "kick-ceiling", 0.95),
    Target("photos b64: TTFB vs idfd (issue 40)", "ttfb_s", "kick-shardsmith", "kick-keras", 1.0,
           at_most=True),
    # The fastest honest first batch of a TFRecord reader: no buffer to fill.
    Target("photos b64: TTFB vs plain TFRecord", "ttfb_s", "kick-shardsmith", "kick-plain", 1.2,
           at_most=True),
    Target("photos b64: images/s vs plain TFRecord", "images_per_s", "kick-shardsmith",
           "kick-plain", 0.95),
    Target("phone: TTFB vs hand-tuned", "ttfb_s", "phone-shardsmith", "phone-hand", 1.2,
           at_most=True),
    Target("phone: TTFB vs idfd", "ttfb_s", "phone-shardsmith", "phone-keras", 1.5,
           at_most=True),
    Target("phone: TTFB, reduced_decode vs idfd", "ttfb_s", "phone-reduced", "phone-keras", 1.0,
           at_most=True),
)

# Printed with the targets, without a bound (issue 40): where the reader does less work than the
# peer on the same values (a crop decoded alone), and the separate --min_side 224 configuration
# against the peers reading the original photos.
LESS_WORK = (
    Target("photos crop: images/s vs idfd crop_to_aspect", "images_per_s", "crop-shardsmith",
           "crop-keras", 0.0),
    Target("photos crop: TTFB vs idfd crop_to_aspect", "ttfb_s", "crop-shardsmith",
           "crop-keras", 0.0, at_most=True),
    Target("--min_side 224 copy: images/s vs idfd", "images_per_s", "capped-shardsmith",
           "kick-keras", 0.0),
    Target("--min_side 224 copy: images/s vs hand-tuned", "images_per_s", "capped-shardsmith",
           "kick-hand", 0.0),
    Target("--min_side 224 copy: images/s vs ceiling", "images_per_s", "capped-shardsmith",
           "kick-ceiling", 0.0),
    Target("--min_side 224 copy: TTFB vs idfd", "ttfb_s", "capped-shardsmith", "kick-keras",
           0.0, at_most=True),
)

# Printed with the targets, without a bound: the same comparisons with the
# baseline given the host-memory pool too, so the pool's share is visible.
SAME_POOL = (
    Target("photos eval: vs hand-tuned with the pool", "images_per_s", "eval-shardsmith",
           "eval-hand-pool", 0.0),
    Target("small, cold: vs idfd with the pool", "images_per_s", "smallcold-shardsmith",
           "smallcold-keras-pool", 0.0),
    Target("small, warm: vs idfd with the pool", "images_per_s", "small-shardsmith",
           "small-keras-pool", 0.0),
)


# ---------------------------------------------------------------------------
# Corpora and their conversion, reused across runs.


def _corpus_key(info: corpus.CorpusInfo, convert_args: tuple[str, ...] = ()) -> dict:
    digest = hashlib.sha256("\n".join(info.files).encode()).hexdigest()[:16]
    key = {"version": _STAMP_VERSION, "generator": corpus.GENERATOR_VERSION, "kind": info.kind,
           "count": info.count, "seed": info.seed, "files": len(info.files),
           "bytes": info.num_bytes, "listing": digest}
    if convert_args:
        key["convert_args"] = list(convert_args)
    return key


def _converted(info: corpus.CorpusInfo, out: str, convert_args: tuple[str, ...] = ()) -> bool:
    try:
        with open(os.path.join(out, _STAMP), encoding="utf-8") as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return False
    return stamp == _corpus_key(info, convert_args) and os.path.exists(os.path.join(out, "manifest.json"))


def prepare(kind: str, count: int, seed: int, work: str,
            convert_args: tuple[str, ...] = ()) -> tuple[str, str]:
    """Makes (or reuses) a corpus and its conversion (with `convert_args`, a separate one).

    Returns:
      (image folder, converted dataset folder).
    """
    name = f"{kind}-{count}-seed{seed}"
    info = corpus.generate(kind, os.path.join(work, "corpora", name), count=count, seed=seed)
    out = os.path.join(work, "read", name + "".join(
        "-" + a.lstrip("-").replace("/", "_") for a in convert_args))
    if _converted(info, out, convert_args):
        _LOG.info("Reusing the conversion in %s", out)
    else:
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        log_path = out + ".convert.log"
        _LOG.info("Converting %s into %s (log: %s)", info.root, out, log_path)
        start = time.perf_counter()
        with open(log_path, "wb") as log:
            subprocess.run(
                [sys.executable, "-m", "beam_jobs.convert", "--input_dir", info.root,
                 "--output_dir", out, "--overwrite", *convert_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=_REPO,
                check=True,
            )
        with open(os.path.join(out, _STAMP), "w", encoding="utf-8") as f:
            json.dump(_corpus_key(info, convert_args), f)
        _LOG.info("  converted in %.1f s", time.perf_counter() - start)
    return info.root, out


def _warm_page_cache(*folders: str) -> None:
    """Reads every file once: the benchmark is of a warm local disk."""
    for folder in folders:
        for dirpath, _, names in os.walk(folder):
            for fname in names:
                with open(os.path.join(dirpath, fname), "rb") as f:
                    while f.read(1 << 20):
                        pass


def _drop_page_cache(*folders: str) -> int:
    """Drops every file of `folders` from the page cache; returns how many.

    `posix_fadvise(DONTNEED)` on each file, after flushing it (dirty pages
    stay cached): no root needed, unlike `/proc/sys/vm/drop_caches`. The next
    read of each file goes to the disk.
    """
    count = 0
    for folder in folders:
        for dirpath, _, names in os.walk(folder):
            for fname in names:
                fd = os.open(os.path.join(dirpath, fname), os.O_RDONLY)
                try:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                count += 1
    return count


# ---------------------------------------------------------------------------
# Running the contenders.


def run_contender(c: Contender, raw: str, tfrecords: str, *, warmup: int, batches: int,
                  log_path: str, min_seconds: float = 0.0,
                  epoch_images: int = 0) -> dict | None:
    """Runs one contender in a fresh process; its result dict, or None on failure.

    A cold contender first drops `raw` and `tfrecords` from the page cache,
    then times its first `epoch_images` images from the dataset's
    construction on; a `first_batch_only` one times its first batch.
    """
    argv = [sys.executable, "-m", "bench._read_baselines", c.pipeline, c.preset,
            "--tfrecords", tfrecords, "--raw", raw, "--warmup", str(warmup),
            "--batches", str(batches), "--batch_size", str(c.batch_size),
            "--image_size", str(c.image_size), "--min_seconds", str(min_seconds)]
    if c.cold:
        argv += ["--first_images", str(epoch_images)]
        _drop_page_cache(raw, tfrecords)
    elif c.first_batch_only:
        argv += ["--first_images", str(c.batch_size)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    env.update(c.env)
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=_REPO, env=env,
                          stdin=subprocess.DEVNULL)
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(proc.stdout + proc.stderr)
    lines = [l for l in proc.stdout.splitlines() if l.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        _LOG.error("  %s failed (exit %d): see %s", c.name, proc.returncode, log_path)
        return None
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def _best(runs: list[dict]) -> dict:
    """Best images/s, TTFB and CPU time per image of the runs (each its own best)."""
    fastest = max(runs, key=lambda r: r["images_per_s"])
    return dict(fastest, ttfb_s=min(r["ttfb_s"] for r in runs),
                ttfb_cpu_s=min(r["ttfb_cpu_s"] for r in runs),
                cpu_ms_per_image=min(r["cpu_ms_per_image"] for r in runs),
                runs=[{k: r[k] for k in ("images_per_s", "ttfb_s")} for r in runs])


def _ratio(results: dict, t: Target) -> float | None:
    a, b = results.get(t.numerator), results.get(t.denominator)
    if not a or not b:
        return None
    return a[t.metric] / b[t.metric]


def _round_ratios(runs: dict, t: Target) -> tuple[float, float] | None:
    """The median over rounds of `t`'s ratio in each round (wall, CPU), or None.

    Rounds are interleaved (every contender once per round), so a ratio within
    one round compares runs made minutes apart under about the same load; the
    median of those is steadier than a ratio of bests on shared cores.
    """
    a = {r["round"]: r for r in runs.get(t.numerator, [])}
    b = {r["round"]: r for r in runs.get(t.denominator, [])}
    common = sorted(set(a) & set(b))
    if not common:
        return None
    wall = [a[k][t.metric] / b[k][t.metric] for k in common]
    if t.metric == "images_per_s":
        cpu = [b[k]["cpu_ms_per_image"] / a[k]["cpu_ms_per_image"] for k in common]
    else:
        cpu = [a[k]["ttfb_cpu_s"] / b[k]["ttfb_cpu_s"] for k in common]
    return statistics.median(wall), statistics.median(cpu)


def _ceiling_shares(results: dict) -> dict[str, list[tuple[str, float]]]:
    """Each contender's images/s over its scenario's decode ceiling, by scenario."""
    shares = {}
    for scenario, prefix in _SCENARIOS:
        ceiling = results.get(prefix + "ceiling")
        if not ceiling:
            continue
        row = [(c.pipeline, results[c.name]["images_per_s"] / ceiling["images_per_s"])
               for c in CONTENDERS if c.name.startswith(prefix) and c.pipeline != "ceiling"
               and results.get(c.name)]
        if row:
            shares[scenario] = row
    return shares


def _table(results: dict) -> str:
    head = (f"{'scenario':<13} {'contender':<30} {'images/s':>9} {'TTFB s':>7} {'CPU s':>6} "
            f"{'CPU ms/img':>10} {'RSS MiB':>8} {'vs hand':>8} {'vs ceil':>8} {'vs idfd':>8}")
    lines = [head, "-" * len(head)]
    for scenario, prefix in _SCENARIOS:
        first = True
        rows = [c for c in CONTENDERS if c.name.startswith(prefix) and c.name in results]
        for c in rows:
            r = results[c.name]
            title = scenario if first else ""
            first = False
            if r is None:
                lines.append(f"{title:<13} {c.label:<30} {'failed':>9}")
                continue
            row = (f"{title:<13} {c.label:<30} {r['images_per_s']:>9.1f} {r['ttfb_s']:>7.2f} "
                   f"{r['ttfb_cpu_s']:>6.2f} {r['cpu_ms_per_image']:>10.2f} "
                   f"{r['peak_rss_mib']:>8.0f}")
            for ref in ("hand", "ceiling", "keras"):
                ref_r = results.get(prefix + ref)
                if ref_r and c.pipeline != ref:
                    row += f" {r['images_per_s'] / ref_r['images_per_s']:>7.2f}x"
                else:
                    row += f" {'':>8}"
            lines.append(row)
    return "\n".join(lines)


def run(*, count: int = 2000, small_count: int = 20000, seed: int = 0, work: str = "build/bench",
        skip_small: bool = False, repeat: int = 3, warmup: int = 16, min_seconds: float = 5.0,
        names: tuple[str, ...] | None = None, phone_count: int = 120,
        skip_phone: bool = False) -> dict:
    """Runs the benchmark, prints its table and returns the results."""
    import psutil

    work = os.path.abspath(work)
    contenders = [c for c in CONTENDERS
                  if (names is None or c.name in names)
                  and not (skip_small and c.corpus in ("small", "tiny"))
                  and not (skip_phone and c.corpus == "phone")]
    if not hasattr(os, "posix_fadvise"):
        _LOG.warning("No posix_fadvise on this system: the cold-cache contenders are skipped.")
        contenders = [c for c in contenders if not c.cold]
    counts = {"photos": count, "small": small_count, "tiny": small_count, "phone": phone_count}
    data = {}
    for kind, args in sorted({(c.corpus, c.convert_args) for c in contenders}):
        data[kind, args] = prepare(kind, counts[kind], seed, work, args)
        _LOG.info("%s%s: %s", kind, "".join(" " + a for a in args),
                  corpus.format_stats(corpus.describe(data[kind, args][0])))
        _warm_page_cache(*data[kind, args])
    # The timed window: at least one epoch of images, 64 batches and
    # `min_seconds`.
    batches = {kind: max(64, math.ceil(counts[kind] / 32)) for kind, _ in data}
    logs = os.path.join(work, "read", "logs")
    os.makedirs(logs, exist_ok=True)
    load_before = psutil.getloadavg()[0]
    runs: dict[str, list[dict]] = {c.name: [] for c in contenders}
    rounds = max([repeat] + [c.rounds for c in contenders])
    for r in range(rounds):
        _LOG.info("Round %d of %d:", r + 1, rounds)
        for c in contenders:
            if r >= max(repeat, c.rounds):
                continue
            raw, tfrecords = data[c.corpus, c.convert_args]
            result = run_contender(c, raw, tfrecords, warmup=warmup, batches=batches[c.corpus],
                                   log_path=os.path.join(logs, f"{c.name}-{r}.log"),
                                   min_seconds=min_seconds, epoch_images=counts[c.corpus])
            if result is not None:
                result["round"] = r
                runs[c.name].append(result)
                _LOG.info("  %-18s %8.1f images/s  TTFB %5.2f s (CPU %5.2f s)  %5.2f CPU ms/image",
                          c.name, result["images_per_s"], result["ttfb_s"], result["ttfb_cpu_s"],
                          result["cpu_ms_per_image"])
    load_after = psutil.getloadavg()[0]
    results = {name: (_best(rs) if rs else None) for name, rs in runs.items()}

    print()
    print(f"Reading at 224x224, batch 32 (b64: 64): photos {count:,} images, small "
          f"{small_count:,}{' (skipped)' if skip_small else ''}, phone {phone_count:,}"
          f"{' (skipped)' if skip_phone else ''}, seed {seed}. Steady state: {warmup} warm-up "
          f"batches, then at least {' and '.join(f'{v} ({k})' for k, v in batches.items())} timed "
          f"batches and {min_seconds:g} s.")
    print(f"Best images/s, best TTFB and best CPU s to the first batch of {repeat} run(s) of "
          f"each contender (b64 and phone: {max(repeat, 5)}), one process at a "
          f"time; {os.cpu_count()} cores, load average {load_before:.1f} before, "
          f"{load_after:.1f} after (shared cores: figures are noisy).")
    print(_table(results))
    print("* photos eval: image_dataset_from_directory decodes and stretches the whole image "
          "(no crop): for reference. 'small, cold': the first epoch (TTFB included) after every "
          "image and shard was dropped from the page cache. 'small, warm' and 'small @64x64' "
          "(output at the images' own size): steady state, for reference. 'photos, b64': the default "
          "options (shuffled), batch 64; 'phone, 1st b.': the first batch of 64 of 12-megapixel "
          "photos (images/s over that batch).")
    verdicts = []
    for t in TARGETS:
        ratio = _ratio(results, t)
        if ratio is None:
            continue
        ok = ratio <= t.bound if t.at_most else ratio >= t.bound
        cpu_ratio = None
        if t.metric == "images_per_s":
            cpu_ratio = (results[t.denominator]["cpu_ms_per_image"]
                         / results[t.numerator]["cpu_ms_per_image"])
        else:
            cpu_ratio = (results[t.numerator]["ttfb_cpu_s"]
                         / results[t.denominator]["ttfb_cpu_s"])
        medians = _round_ratios(runs, t)
        sizes = {results[n].get("first_batch_images") for n in (t.numerator, t.denominator)}
        if t.metric == "ttfb_s" and len(sizes) > 1:
            # Keras's batches of a corpus smaller than the batch size hold the whole corpus only.
            print(f"  ({t.label}: first batches of {' and '.join(str(n) for n in sorted(sizes))} "
                  "images, not comparable)")
        verdicts.append({"target": t.label, "ratio": ratio, "bound": t.bound,
                         "at_most": t.at_most, "pass": ok, "cpu_ratio": cpu_ratio,
                         "median_ratio": medians and medians[0],
                         "median_cpu_ratio": medians and medians[1]})
        print(f"  {t.label:<45} {ratio:5.2f}x (target {'<=' if t.at_most else '>='} "
              f"{t.bound}x): {'PASS' if ok else 'FAIL'}"
              + (f"   [{'images per CPU-second' if t.metric == 'images_per_s' else 'CPU to it'}: "
                 f"{cpu_ratio:.2f}x]" if cpu_ratio else "")
              + (f"   median of rounds {medians[0]:.2f}x (CPU {medians[1]:.2f}x)" if medians else ""))
    for t in SAME_POOL:
        ratio = _ratio(results, t)
        if ratio is not None:
            print(f"  {t.label:<45} {ratio:5.2f}x (for reference)")
    for t in LESS_WORK:
        ratio = _ratio(results, t)
        medians = _round_ratios(runs, t)
        if ratio is not None:
            print(f"  {t.label:<45} {ratio:5.2f}x (for reference)"
                  + (f"   median of rounds {medians[0]:.2f}x (CPU {medians[1]:.2f}x)"
                     if medians else ""))
            verdicts.append({"target": t.label, "ratio": ratio, "bound": None, "pass": None,
                             "median_ratio": medians and medians[0],
                             "median_cpu_ratio": medians and medians[1]})
    shares = _ceiling_shares(results)
    if shares:
        print("Share of the decode ceiling (images/s over the in-memory ceiling of the same "
              "scenario, this run; issue 40's target for shardsmith: >= 95%):")
        for scenario, row in shares.items():
            print(f"  {scenario:<13} " + ", ".join(f"{name} {share:.0%}" for name, share in row))
    return {"count": count, "small_count": small_count, "phone_count": phone_count,
            "seed": seed, "repeat": repeat,
            "warmup": warmup, "batches": batches, "cpu_count": os.cpu_count(),
            "load_average": [load_before, load_after], "results": results, "targets": verdicts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.read",
        description="Time shardsmith's reader against image_dataset_from_directory, a "
        "hand-tuned tf.data pipeline and the decode ceiling.",
    )
    parser.add_argument("--count", type=int, default=2000, help="Photos (default 2000).")
    parser.add_argument("--small-count", type=int, default=20000,
                        help="64x64 images (default 20000).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the corpora (default 0).")
    parser.add_argument("--work", default=os.path.join(_REPO, "build", "bench"),
                        help="Folder of corpora, conversions and logs (default build/bench).")
    parser.add_argument("--skip-small", action="store_true", help="Skip the small-image scenarios (64x64 small and 32x32 tiny).")
    parser.add_argument("--phone-count", type=int, default=120,
                        help="4032x3024 phone photos (default 120).")
    parser.add_argument("--skip-phone", action="store_true", help="Skip the phone-photo scenario.")
    parser.add_argument("--repeat", type=int, default=3,
                        help="Runs of each contender; the best is kept (default 3).")
    parser.add_argument("--warmup", type=int, default=16,
                        help="Batches after the first one before the timed window (default 16).")
    parser.add_argument("--min-seconds", type=float, default=5.0,
                        help="Shortest timed window, in seconds (default 5).")
    parser.add_argument("--only", help="Comma-separated contenders: "
                        + ",".join(c.name for c in CONTENDERS))
    parser.add_argument("--json", help="Also write the results to this file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if (args.count < 1 or args.small_count < 1 or args.phone_count < 1 or args.repeat < 1
            or args.warmup < 0):
        parser.error("--count, --small-count, --phone-count and --repeat must be positive, "
                     "--warmup >= 0")
    names = parse_only(parser, args.only, CONTENDERS)
    summary = run(count=args.count, small_count=args.small_count, seed=args.seed, work=args.work,
                  skip_small=args.skip_small, repeat=args.repeat, warmup=args.warmup,
                  min_seconds=args.min_seconds, names=names, phone_count=args.phone_count,
                  skip_phone=args.skip_phone)
    write_json(args.json, summary)
    return 1 if any(r is None for r in summary["results"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
