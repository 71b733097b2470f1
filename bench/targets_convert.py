"""Segmentation conversion: shardsmith with --masks_dir against a hand-written 2-process converter.

The corpus: ``count`` (default 1,000) photo-like JPEGs of about 400x300
(`bench.corpus`'s drawing: crops of real photographs with texture and grain,
quality 90), each with a PNG mask of the same size holding class ids 0-4 in
a few shapes and an ignore border of 255, laid out as a user has them:

  images/seg_000000.jpg ...   masks/seg_000000.png ...

Each converter runs as a whole process (start-up included), one after the
other, best wall time of ``--repeat``:

- shardsmith's default command, `python -m beam_jobs.convert --input_dir
  images --masks_dir masks`: every image decoded with TensorFlow's decoder,
  every mask read, checked (class ids, size) and stored as PNG, the pixel
  counts of the manifest;
- (b) a hand-written 2-process converter (`bench._mask_baselines`,
  `multiprocessing.Pool(2)`): the JPEG's bytes, the mask decoded with Pillow,
  sizes checked, the mask re-encoded, both written as `tf.train.Example`s with
  `tf.io.TFRecordWriter`.

On a small (``--small``, default 200) and the large corpus. Target: shardsmith
>= 1.2x (b) on both (ratio = (b)'s wall time / shardsmith's).

Usage:

  python -m bench.targets_convert [--count 1000] [--small 200] [--seed 0] [--repeat 1]
      [--work DIR] [--corpus_dir DIR] [--only shardsmith,baseline] [--json FILE]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import shutil
import sys
import tempfile

import numpy as np
from PIL import Image, ImageDraw

from bench import corpus
from bench._cli import parse_only, write_json
from bench.convert import Contender, Measurement, _best, _run_one

__all__ = ["CONVERTERS", "MASK_FLAG", "make_segmentation", "run", "main"]

_LOG = logging.getLogger("shardsmith.bench.targets_convert")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TARGET = 1.2
MASK_FLAG = "--masks_dir"
_IMAGES, _MASKS = "images", "masks"
_NUM_CLASSES = 5
_IGNORE = 255
_GENERATOR_VERSION = 1
_STAMP = ".segmentation.json"
_CHUNK = 50

CONVERTERS = (
    Contender("shardsmith", "shardsmith --masks_dir (default command)", (
        "-m", "beam_jobs.convert", "--input_dir", "{input}/" + _IMAGES, MASK_FLAG, "{input}/" + _MASKS,
        "--output_dir", "{output}", "--overwrite")),
    Contender("baseline", "(b) Pool(2), Pillow mask", (
        "-m", "bench._mask_baselines", "--images_dir", "{input}/" + _IMAGES,
        "--masks_dir", "{input}/" + _MASKS, "--output_dir", "{output}")),
)


# ---------------------------------------------------------------------------
# The corpus.


def _mask(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """Class ids: background 0, a few filled shapes of ids 1-4, an ignore border of 255."""
    im = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = int(rng.integers(0, width - 20)), int(rng.integers(0, height - 20))
        x1, y1 = x0 + int(rng.integers(20, width // 2)), y0 + int(rng.integers(20, height // 2))
        fill = int(rng.integers(1, _NUM_CLASSES))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    draw.rectangle((0, 0, width - 1, height - 1), outline=_IGNORE, width=2)
    return np.asarray(im)


def _pair(seed: int, index: int) -> tuple[str, bytes, bytes]:
    """(stem, JPEG bytes, mask PNG bytes) of image `index`."""
    rng = np.random.default_rng([seed, 0x5E6, index])
    size = (400, 300) if rng.random() < 0.8 else (300, 400)
    sources = corpus._PHOTO_CLASSES[sorted(corpus._PHOTO_CLASSES)[index % len(corpus._PHOTO_CLASSES)]]
    photo = corpus._draw_photo(rng, seed, sources, size, texture=(0.0, 8.0), grain=(6.0, 11.0),
                               jitter=0.05, sharpen=(50.0, 150.0))
    return (f"seg_{index:06d}", corpus._encode(photo, "JPEG", quality=90),
            corpus._encode(_mask(rng, *size), "PNG"))


def _make_chunk(root: str, seed: int, start: int, stop: int) -> None:
    for i in range(start, stop):
        stem, jpeg, png = _pair(seed, i)
        with open(os.path.join(root, _IMAGES, stem + ".jpg"), "wb") as f:
            f.write(jpeg)
        with open(os.path.join(root, _MASKS, stem + ".png"), "wb") as f:
            f.write(png)


def make_segmentation(root: str, count: int, seed: int = 0, workers: int | None = None) -> str:
    """Writes (or reuses) a corpus of `count` JPEGs and their masks under `root`; returns `root`."""
    stamp = {"count": count, "seed": seed, "version": _GENERATOR_VERSION}
    stamp_path = os.path.join(root, _STAMP)
    if os.path.exists(stamp_path):
        with open(stamp_path, encoding="utf-8") as f:
            if json.load(f) == stamp:
                return root
    shutil.rmtree(root, ignore_errors=True)
    for sub in (_IMAGES, _MASKS):
        os.makedirs(os.path.join(root, sub))
    bounds = [(s, min(s + _CHUNK, count)) for s in range(0, count, _CHUNK)]
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for future in [pool.submit(_make_chunk, root, seed, s, e) for s, e in bounds]:
            future.result()
    with open(stamp_path, "w", encoding="utf-8") as f:  # Last: a corpus without it is unfinished.
        json.dump(stamp, f)
    return root


# ---------------------------------------------------------------------------
# The run.


def run(*, count: int = 1000, small: int = 200, seed: int = 0, repeat: int = 1,
        work: str | None = None, corpus_dir: str | None = None,
        names: tuple[str, ...] | None = None) -> dict:
    """Times the converters on the small and the large corpus; prints the table.

    Returns:
      The results as a JSON-able dict: per size, each converter's measurement,
      and the ratio (b) / shardsmith when both ran.
    """
    bench_root = os.path.join(_REPO, "build", "bench")
    corpus_dir = corpus_dir or os.path.join(bench_root, "corpora")
    own_work = work is None
    if own_work:
        os.makedirs(bench_root, exist_ok=True)
        work = tempfile.mkdtemp(prefix="targets-", dir=bench_root)
    converters = [c for c in CONVERTERS if names is None or c.name in names]
    summary: dict = {"count": count, "small": small, "seed": seed, "repeat": repeat, "sizes": {}}
    failed = False
    try:
        for images in sorted({small, count}):
            root = make_segmentation(os.path.join(corpus_dir, f"segmentation-{images}-seed{seed}"),
                                     images, seed)
            _LOG.info("%d images with masks (%s):", images, root)
            runs: dict[str, list[Measurement]] = {c.name: [] for c in converters}
            for r in range(repeat):
                for c in converters:
                    runs[c.name].append(_run_one(c, root, images, work, f"{images}-{r}", False))
            best = {name: _best(ms) for name, ms in runs.items()}
            failed = failed or any(m.returncode != 0 for ms in runs.values() for m in ms)
            entry = {"results": {n: dict(vars(m), images_per_s=m.images_per_s) for n, m in best.items()}}
            if len(best) == 2:
                entry["ratio"] = best["baseline"].wall_s / best["shardsmith"].wall_s
            summary["sizes"][str(images)] = entry
    finally:
        if own_work and not failed:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        _LOG.error("A converter failed: its log is kept in %s", os.path.join(work, "logs"))
    print()
    print(f"Converting JPEGs of ~400x300 with PNG masks; best of {repeat}; {os.cpu_count()} cores.")
    head = f"{'images':>7} {'converter':<42} {'wall s':>7} {'CPU s':>6} {'images/s':>9} {'records':>8}"
    print(head)
    print("-" * len(head))
    for images, entry in summary["sizes"].items():
        for c in converters:
            m = entry["results"][c.name]
            print(f"{int(images):>7,} {c.label:<42} {m['wall_s']:>7.1f} {m['cpu_s']:>6.1f} "
                  f"{m['images_per_s']:>9.1f} {m['records']:>8,}"
                  + ("" if m["returncode"] == 0 else f"  (exit {m['returncode']})"))
    for images, entry in summary["sizes"].items():
        if "ratio" in entry:
            ok = "met" if entry["ratio"] >= _TARGET else "MISSED"
            print(f"Target on {int(images):,} images: shardsmith {entry['ratio']:.2f}x (b) "
                  f"(target >= {_TARGET}x: {ok})")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.targets_convert",
        description="Time shardsmith --masks_dir against a hand-written 2-process converter.")
    parser.add_argument("--count", type=int, default=1000, help="Images of the large corpus (default 1000).")
    parser.add_argument("--small", type=int, default=200, help="Images of the small corpus (default 200).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the corpora (default 0).")
    parser.add_argument("--repeat", type=int, default=1, help="Rounds; best wall time is kept.")
    parser.add_argument("--work", help="Folder for outputs and logs, kept "
                        "(default: a temporary folder under build/bench, removed).")
    parser.add_argument("--corpus_dir", help="Folder of generated corpora (default build/bench/corpora).")
    parser.add_argument("--only", help="Comma-separated converters: " + ",".join(c.name for c in CONVERTERS))
    parser.add_argument("--json", help="Write the results to this file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.count < 1 or args.small < 1 or args.repeat < 1:
        parser.error(f"--count, --small and --repeat must be at least 1. Received: --count {args.count}, "
                     f"--small {args.small}, --repeat {args.repeat}")
    names = parse_only(parser, args.only, CONVERTERS)
    summary = run(count=args.count, small=args.small, seed=args.seed, repeat=args.repeat,
                  work=args.work, corpus_dir=args.corpus_dir, names=names)
    write_json(args.json, summary)
    failed = [m for e in summary["sizes"].values() for m in e["results"].values() if m["returncode"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
