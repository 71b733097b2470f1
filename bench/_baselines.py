"""The two converters shardsmith is measured against in `bench.convert`.

- ``naive``: the single-process loop of the tutorials. It walks the class
  folders in sorted order, reads each file's bytes, takes the size from the
  image header and writes a `tf.train.Example` round-robin into shards with
  `tf.io.TFRecordWriter`. It validates nothing: a truncated or mislabelled
  file goes into the dataset as it is.
- ``multiprocess``: a hand-written parallel converter, one process per core
  (`multiprocessing.Pool(os.cpu_count())`); every worker fully decodes each of
  its images with Pillow before writing it to its own shard.

Both write records with shardsmith's schema, so the three converters produce
the same features. Each prints one JSON line, e.g. ``{"records": 2000,
"shards": 8}``, when done.

Usage:

  python -m bench._baselines naive --input_dir IN --output_dir OUT [--num_shards 8]
  python -m bench._baselines multiprocess --input_dir IN --output_dir OUT [--processes N]
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
import tensorflow as tf
from PIL import Image, UnidentifiedImageError

from schemas import IMAGE_SCHEMA, ImageRecord

__all__ = ["list_class_files", "convert_naive", "convert_multiprocess", "main"]


def list_class_files(root: str) -> tuple[list[str], list[tuple[int, str, str]]]:
    """The images of `root/<class>/...`, as a tutorial lists them.

    Args:
      root: The input folder.

    Returns:
      (class_names, files): sorted class folder names, and (label, relative
      path, full path) of every non-hidden file in them, sorted.
    """
    class_names = sorted(
        e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")
    )
    files = []
    for label, name in enumerate(class_names):
        folder = os.path.join(root, name)
        for dirpath, dirs, names in os.walk(folder):
            dirs.sort()
            for fname in sorted(names):
                if fname.startswith("."):
                    continue
                path = os.path.join(dirpath, fname)
                files.append((label, os.path.relpath(path, root).replace(os.sep, "/"), path))
    return class_names, files


def _shard_path(output_dir: str, prefix: str, index: int, num_shards: int) -> str:
    return os.path.join(output_dir, f"{prefix}-{index:05d}-of-{num_shards:05d}.tfrecord")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _header_record(label: int, rel: str, data: bytes) -> bytes:
    """A record with the sizes from the image header; no pixel is decoded."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = (im.format or "unknown").lower()
            width, height = im.size
            channels = len(im.getbands())
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        fmt, width, height, channels = "unknown", 0, 0, 0  # Validates nothing.
    return IMAGE_SCHEMA.encode(ImageRecord(
        image=data, label=label, filename=rel, format=fmt,
        height=height, width=width, channels=channels,
    ))


def convert_naive(input_dir: str, output_dir: str, num_shards: int = 8) -> int:
    """The tutorial loop: one process, no validation.

    Returns:
      The number of records written.
    """
    _, files = list_class_files(input_dir)
    os.makedirs(output_dir, exist_ok=True)
    writers = [
        tf.io.TFRecordWriter(_shard_path(output_dir, "naive", i, num_shards))
        for i in range(num_shards)
    ]
    try:
        for k, (label, rel, path) in enumerate(files):
            writers[k % num_shards].write(_header_record(label, rel, _read(path)))
    finally:
        for w in writers:
            w.close()
    return len(files)


def _decoded_record(label: int, rel: str, data: bytes) -> bytes:
    """A record of an image that Pillow fully decoded first."""
    with Image.open(io.BytesIO(data)) as im:
        fmt = (im.format or "unknown").lower()
        im.load()  # Decodes every pixel: a damaged file raises here.
        channels = len(im.getbands())
        rgb = im.convert("RGB")
    return IMAGE_SCHEMA.encode(ImageRecord(
        image=data, label=label, filename=rel, format=fmt,
        height=rgb.height, width=rgb.width, channels=channels,
    ))


def _write_shard(task: tuple[str, int, int, list[tuple[int, str, str]]]) -> int:
    output_dir, index, num_shards, files = task
    written = 0
    with tf.io.TFRecordWriter(_shard_path(output_dir, "mp", index, num_shards)) as writer:
        for label, rel, path in files:
            try:
                record = _decoded_record(label, rel, _read(path))
            except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
                print(f"skipping {rel}: {e}", file=sys.stderr)
                continue
            writer.write(record)
            written += 1
    return written


def convert_multiprocess(input_dir: str, output_dir: str, num_shards: int = 8,
                         processes: int | None = None) -> int:
    """One process per core, each fully decoding its images with Pillow.

    Shard i holds files i, i + num_shards, ...; each pool task writes one shard.

    Returns:
      The number of records written.
    """
    _, files = list_class_files(input_dir)
    os.makedirs(output_dir, exist_ok=True)
    tasks = [(output_dir, i, num_shards, files[i::num_shards]) for i in range(num_shards)]
    with multiprocessing.Pool(processes or os.cpu_count()) as pool:
        return sum(pool.map(_write_shard, tasks, chunksize=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._baselines", description=__doc__.split("\n")[0])
    parser.add_argument("converter", choices=("naive", "multiprocess"))
    parser.add_argument("--input_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--num_shards", type=int, default=8)
    parser.add_argument("--processes", type=int, help="Pool size of 'multiprocess' (default: cores).")
    args = parser.parse_args(argv)
    if args.converter == "naive":
        n = convert_naive(args.input_dir, args.output_dir, args.num_shards)
    else:
        n = convert_multiprocess(args.input_dir, args.output_dir, args.num_shards, args.processes)
    print(json.dumps({"records": n, "shards": args.num_shards}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
