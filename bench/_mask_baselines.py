"""The hand-written 2-process segmentation converter that `bench.targets_convert` measures shardsmith against.

What a user writes by hand for images with masks: `multiprocessing.Pool(2)`;
each task writes one shard with `tf.io.TFRecordWriter`, and per image reads
the JPEG's bytes, decodes its PNG mask with Pillow, checks that the mask has
the image's size (from the JPEG header), re-encodes the mask as PNG and writes
a `tf.train.Example` of both, the file name and the size. Prints one JSON
line, e.g. ``{"records": 1000, "shards": 8, "skipped": 0}``.

Usage:

  python -m bench._mask_baselines --images_dir IN --masks_dir MASKS --output_dir OUT [--processes 2]
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import sys

# Imported at the top, as a hand-written script does; forked pool workers
# inherit the imported modules.
import numpy as np
import tensorflow as tf
from PIL import Image

__all__ = ["list_pairs", "convert", "main"]

_NUM_SHARDS = 8


def list_pairs(images_dir: str, masks_dir: str) -> list[tuple[str, str, str]]:
    """(name, image path, mask path) of every image of `images_dir` (flat), sorted.

    The mask of `a/b.jpg` is `masks_dir/a/b.png`.
    """
    pairs = []
    for name in sorted(os.listdir(images_dir)):
        if name.startswith("."):
            continue
        stem = os.path.splitext(name)[0]
        pairs.append((name, os.path.join(images_dir, name), os.path.join(masks_dir, stem + ".png")))
    return pairs


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int(value: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def _write_shard(task) -> tuple[int, int]:
    output_dir, index, num_shards, pairs = task
    path = os.path.join(output_dir, f"train-{index:05d}-of-{num_shards:05d}.tfrecord")
    written = skipped = 0
    with tf.io.TFRecordWriter(path) as writer:
        for name, image_path, mask_path in pairs:
            with open(image_path, "rb") as f:
                image = f.read()
            with Image.open(io.BytesIO(image)) as im:
                width, height = im.size  # The header only.
            with Image.open(mask_path) as m:
                mask = np.asarray(m)
            if mask.shape[:2] != (height, width):
                print(f"skipping {name}: mask {mask.shape[:2]}, image {(height, width)}", file=sys.stderr)
                skipped += 1
                continue
            buf = io.BytesIO()
            Image.fromarray(mask).save(buf, format="PNG")
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": _bytes(image), "mask": _bytes(buf.getvalue()),
                "filename": _bytes(name.encode()), "height": _int(height), "width": _int(width),
            }))
            writer.write(example.SerializeToString())
            written += 1
    return written, skipped


def convert(images_dir: str, masks_dir: str, output_dir: str, processes: int = 2,
            num_shards: int = _NUM_SHARDS) -> tuple[int, int]:
    """Converts the images of `images_dir` with their masks into `num_shards` shards.

    Returns:
      (records written, images skipped for a mask of another size).
    """
    pairs = list_pairs(images_dir, masks_dir)
    os.makedirs(output_dir, exist_ok=True)
    tasks = [(output_dir, i, num_shards, pairs[i::num_shards]) for i in range(num_shards)]
    with multiprocessing.Pool(processes) as pool:
        results = pool.map(_write_shard, tasks, chunksize=1)
    return sum(w for w, _ in results), sum(s for _, s in results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._mask_baselines",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--images_dir", required=True)
    parser.add_argument("--masks_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    written, skipped = convert(args.images_dir, args.masks_dir, args.output_dir, args.processes)
    print(json.dumps({"records": written, "shards": _NUM_SHARDS, "skipped": skipped}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
