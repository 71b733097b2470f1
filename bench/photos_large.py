"""Camera-sized photos: storing them at the size training reads them (--max_side).

Photos are `bench.corpus`'s 'phone' kind: scikit-image's bundled photographs
upscaled to 4032x3024 (a 12 Mpx phone camera), sharpened, with sensor-like
grain, 2.5-3.5 MB each, as phone photos are; the folder is cached.

Then, in one run:

- converting with `--max_side 512` vs a hand-written 2-process Pillow converter
  that resizes the same way (draft, Lanczos, quality 95 4:4:4; tf.io.TFRecordWriter);
- reading at 224x224 (batch 8, eval crop) the dataset converted with
  `--max_side 512` (shardsmith's reader) vs the hand-tuned tf.data reader
  (bench/_read_baselines.py) over the same photos converted without it;
- the output size, MB per 1,000 images, with and without the flag.

  python -m bench.photos_large                 # 120 photos
  python -m bench.photos_large --count 24 --rounds 1
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import multiprocessing
import os
import subprocess
import sys

from PIL import Image

from bench import corpus
from bench._cli import write_json

__all__ = ["make_large_photos", "convert_pillow", "run", "main"]

_LOG = logging.getLogger("shardsmith.bench.photos_large")
_SIZE = (4032, 3024)
_MAX_SIDE = 512
_TARGET_READ = 10.0
_TARGET_CONVERT = 1.2


def make_large_photos(root: str, count: int, seed: int = 0) -> int:
    """Makes (or reuses) `count` camera-sized photos in `root`; returns their total bytes.

    The 'phone' kind of `bench.corpus` (4032x3024, 2.5-3.5 MB, as phone cameras
    write them), also used by `bench.read`'s first-batch scenario.
    """
    return corpus.generate("phone", root, count=count, seed=seed).num_bytes


# ---------------------------------------------------------------------------
# The hand-written converter: 2 processes, Pillow, draft + Lanczos.


def _pillow_resized(data: bytes, max_side: int) -> tuple[bytes, int, int]:
    from PIL import ImageOps

    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        scale = max_side / max(w, h)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        im.draft("RGB", size)  # libjpeg's scaled decode, to the smallest scale >= size.
        im = ImageOps.exif_transpose(im)
        small = im.convert("RGB").resize(size, Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    small.save(buf, "JPEG", quality=95, subsampling=0)
    return buf.getvalue(), small.height, small.width


def _pillow_shard(task) -> int:
    import tensorflow as tf

    from schemas import IMAGE_SCHEMA, ImageRecord

    out_dir, index, num_shards, files, max_side = task
    path = os.path.join(out_dir, f"train-{index:05d}-of-{num_shards:05d}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for label, rel, src in files:
            with open(src, "rb") as f:
                data, h, w = _pillow_resized(f.read(), max_side)
            writer.write(IMAGE_SCHEMA.encode(ImageRecord(
                image=data, label=label, filename=rel, format="jpeg", height=h, width=w, channels=3)))
    return len(files)


def convert_pillow(input_dir: str, output_dir: str, max_side: int, processes: int = 2,
                   num_shards: int = 8) -> int:
    """Converts with `processes` Pillow workers, each image resized to `max_side`."""
    from bench._baselines import list_class_files

    _, files = list_class_files(input_dir)
    os.makedirs(output_dir, exist_ok=True)
    tasks = [(output_dir, i, num_shards, files[i::num_shards], max_side) for i in range(num_shards)]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return sum(pool.map(_pillow_shard, tasks, chunksize=1))


# ---------------------------------------------------------------------------
# The run.


def _mb_per_1000(folder: str, images: int) -> float:
    total = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if n.endswith(".tfrecord"))
    return total / 1e6 / images * 1000


def _timed(argv: list[str], log: str, rounds: int) -> tuple[float, float]:
    from bench.convert import measure

    best = None
    for _ in range(rounds):
        wall, cpu, _, _, code = measure(argv, log)
        if code != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: see {log}")
        best = (wall, cpu) if best is None or wall < best[0] else best
    return best


def _read_rate(kind: str, folder: str, batches: int, rounds: int) -> dict:
    """Images/s of one reader, in a fresh interpreter (best of `rounds`)."""
    code = (
        "import json, sys; from bench import _read_baselines as rb;"
        f"build = lambda: getattr(rb, {kind!r})({folder!r}, 'eval', (224, 224), 8);"
        f"print(json.dumps(max((rb.measure(build, warmup=2, batches={batches}) for _ in range({rounds})),"
        " key=lambda r: r['images_per_s'])))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(*, count: int = 120, seed: int = 0, work: str = "build/bench", rounds: int = 2) -> dict:
    """Makes the photos, converts them three ways, reads two of them; returns the figures."""
    raw = os.path.join(work, "photos_large")
    num_bytes = make_large_photos(raw, count, seed)
    _LOG.info("%d photos, %.1f MB each", count, num_bytes / count / 1e6)
    outs = {k: os.path.join(work, f"photos_large_{k}") for k in ("plain", "max512", "pillow")}
    log = os.path.join(work, "photos_large.log")
    convert = [sys.executable, "-m", "beam_jobs.convert", "--input_dir", raw, "--overwrite"]
    wall_plain, _ = _timed(convert + ["--output_dir", outs["plain"]], log, 1)
    wall_ours, cpu_ours = _timed(convert + ["--output_dir", outs["max512"], "--max_side", str(_MAX_SIDE)],
                                 log, rounds)
    pillow = [sys.executable, "-m", "bench.photos_large", "--pillow_convert", raw, outs["pillow"]]
    wall_pil, cpu_pil = _timed(pillow, log, rounds)
    read_batches = max(4, count // 8)
    hand = _read_rate("hand", outs["plain"], read_batches, rounds)
    ours = _read_rate("shardsmith", outs["max512"], read_batches, rounds)
    hand_small = _read_rate("hand", outs["max512"], read_batches, rounds)
    return {
        "photos": count,
        "mb_per_photo": num_bytes / count / 1e6,
        "convert_s": {"shardsmith_max_side_512": wall_ours, "pillow_2proc": wall_pil,
                      "shardsmith_plain": wall_plain},
        "convert_cpu_ms_per_image": {"shardsmith_max_side_512": 1000 * cpu_ours / count,
                                     "pillow_2proc": 1000 * cpu_pil / count},
        "convert_ratio": wall_pil / wall_ours,
        "read_images_per_s": {"shardsmith_max_side_512": ours["images_per_s"],
                              "hand_plain": hand["images_per_s"],
                              "hand_max_side_512": hand_small["images_per_s"]},
        "read_cpu_ms_per_image": {"shardsmith_max_side_512": ours["cpu_ms_per_image"],
                                  "hand_plain": hand["cpu_ms_per_image"]},
        "read_ratio": ours["images_per_s"] / hand["images_per_s"],
        "mb_per_1000": {"plain": _mb_per_1000(outs["plain"], count),
                        "max_side_512": _mb_per_1000(outs["max512"], count)},
    }


def _report(r: dict) -> str:
    verdict = lambda ok: "meets target" if ok else "BELOW target"  # noqa: E731
    return "\n".join([
        f"{r['photos']} camera photos 4032x3024, {r['mb_per_photo']:.2f} MB each",
        f"convert: shardsmith --max_side 512 {r['convert_s']['shardsmith_max_side_512']:.1f} s "
        f"({r['convert_cpu_ms_per_image']['shardsmith_max_side_512']:.0f} CPU ms/image), 2-process Pillow "
        f"{r['convert_s']['pillow_2proc']:.1f} s ({r['convert_cpu_ms_per_image']['pillow_2proc']:.0f} CPU "
        f"ms/image): {r['convert_ratio']:.2f}x ({verdict(r['convert_ratio'] >= _TARGET_CONVERT)} "
        f"{_TARGET_CONVERT}x); without the flag {r['convert_s']['shardsmith_plain']:.1f} s",
        f"read 224x224: shardsmith over --max_side 512 {r['read_images_per_s']['shardsmith_max_side_512']:.0f} "
        f"images/s, hand-tuned over the originals {r['read_images_per_s']['hand_plain']:.1f} images/s: "
        f"{r['read_ratio']:.1f}x ({verdict(r['read_ratio'] >= _TARGET_READ)} {_TARGET_READ}x); hand-tuned "
        f"over --max_side 512 {r['read_images_per_s']['hand_max_side_512']:.0f} images/s",
        f"size: {r['mb_per_1000']['plain']:.0f} MB per 1,000 images as they are, "
        f"{r['mb_per_1000']['max_side_512']:.0f} MB with --max_side 512",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.photos_large", description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2, help="Best of N rounds per timing.")
    parser.add_argument("--work", default="build/bench")
    parser.add_argument("--json", help="Also write the figures to this file.")
    parser.add_argument("--pillow_convert", nargs=2, metavar=("INPUT", "OUTPUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pillow_convert:
        convert_pillow(*args.pillow_convert, max_side=_MAX_SIDE)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = run(count=args.count, seed=args.seed, work=args.work, rounds=args.rounds)
    print(_report(results))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
