"""The hand-written 2-process scene cutters that `bench.patches` measures shardsmith against.

What a user writes without shardsmith: `multiprocessing.Pool(2)`, each task
one shard; tifffile's segment access (the page's tile offsets and byte
counts, `TiffPage.decode`) reads windows of the scene; each patch of
``--patch`` pixels becomes a `tf.train.Example` of the features shardsmith's
raw records have (its bytes little-endian, label, ``path#patch=Y,X``
filename, raw format, height, width, channels; the keys from `schemas`),
written with `tf.io.TFRecordWriter`. Two ways to read (``--read``):

- ``window`` (the loop of the tutorials, rasterio or tifffile windows): each
  patch is one window read, decoding the tiles it overlaps; shard ``i`` holds
  the patch rows ``i, i + num_shards, ...``. A tile larger than a patch is
  decoded once per patch in it.
- ``band`` (a careful user): shard ``i`` holds the bands of tile rows ``i, i +
  num_shards, ...``; each band's tiles are decoded once into one array, cut
  into its patches.

The scene's sides must be multiples of the patch, and the patch and the tile
of each other (no edge policy, no nodata check, no statistics). Prints one
JSON line, e.g. ``{"records": 576, "shards": 8}``.

Usage:

  python -m bench._patch_baselines --scene FILE --output_dir OUT [--read window|band] [--patch 256]
      [--processes 2] [--num_shards 8]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys

import numpy as np

# Imported at the top, as a hand-written script does; forked pool workers
# inherit the imported modules.
import tensorflow as tf
import tifffile

import schemas

__all__ = ["READS", "convert", "main"]

# How the cutters read the scene (see the module doc).
READS = ("window", "band")


def _window(tif: tifffile.TiffFile, y0: int, x0: int, rows: int, columns: int) -> np.ndarray:
    """The window [y0, y0 + rows) x [x0, x0 + columns) of the page, its tiles decoded."""
    page = tif.pages[0]
    th, tw = page.tilelength, page.tilewidth
    bands = page.samplesperpixel
    across = math.ceil(page.imagewidth / tw)
    out = np.empty((rows, columns, bands), page.dtype)
    fh = tif.filehandle
    for trow in range(y0 // th, (y0 + rows - 1) // th + 1):
        for tcol in range(x0 // tw, (x0 + columns - 1) // tw + 1):
            index = trow * across + tcol
            fh.seek(page.dataoffsets[index])
            tile, _, _ = page.decode(fh.read(page.databytecounts[index]), index)
            tile = tile.reshape(th, tw, bands)
            top, left = trow * th, tcol * tw
            a, b = max(y0, top), min(y0 + rows, top + th)
            c, d = max(x0, left), min(x0 + columns, left + tw)
            out[a - y0:b - y0, c - x0:d - x0] = tile[a - top:b - top, c - left:d - left]
    return out


def _feature(**kwargs) -> tf.train.Feature:
    return tf.train.Feature(**kwargs)


def _int(value: int) -> tf.train.Feature:
    return _feature(int64_list=tf.train.Int64List(value=[value]))


def _bytes(value: bytes) -> tf.train.Feature:
    return _feature(bytes_list=tf.train.BytesList(value=[value]))


def _patches(tif: tifffile.TiffFile, read: str, index: int, num_shards: int, patch: int):
    """(y, x, array) of the shard's patches, read `read`'s way (see the module doc)."""
    page = tif.pages[0]
    width = page.imagewidth
    if read == "window":
        for y in range(index * patch, page.imagelength, num_shards * patch):
            for x in range(0, width, patch):
                yield y, x, _window(tif, y, x, patch, patch)
        return
    band_rows = max(patch, page.tilelength)
    for y0 in range(index * band_rows, page.imagelength, num_shards * band_rows):
        band = _window(tif, y0, 0, band_rows, width)
        for dy in range(0, band_rows, patch):
            for x in range(0, width, patch):
                yield y0 + dy, x, band[dy:dy + patch, x:x + patch]


def _write_shard(task) -> int:
    scene, rel_path, output_dir, index, num_shards, patch, read = task
    path = os.path.join(output_dir, f"train-{index:05d}-of-{num_shards:05d}.tfrecord")
    records = 0
    with tifffile.TiffFile(scene) as tif, tf.io.TFRecordWriter(path) as writer:
        raw = schemas.raw_format(tif.pages[0].dtype).encode()
        for y, x, array in _patches(tif, read, index, num_shards, patch):
            example = tf.train.Example(features=tf.train.Features(feature={
                schemas.IMAGE.key: _bytes(array.astype(array.dtype.newbyteorder("<")).tobytes()),
                schemas.LABEL.key: _int(0),
                schemas.FILENAME.key: _bytes(f"{rel_path}#patch={y},{x}".encode()),
                schemas.FORMAT.key: _bytes(raw),
                schemas.HEIGHT.key: _int(array.shape[0]),
                schemas.WIDTH.key: _int(array.shape[1]),
                schemas.CHANNELS.key: _int(array.shape[2]),
            }))
            writer.write(example.SerializeToString())
            records += 1
    return records


def convert(scene: str, output_dir: str, *, read: str = "window", patch: int = 256, processes: int = 2,
            num_shards: int = 8, rel_path: str | None = None) -> int:
    """Cuts `scene` into patches written as `num_shards` shards on `processes` processes.

    Returns:
      The number of records written.
    """
    with tifffile.TiffFile(scene) as tif:
        page = tif.pages[0]
        if not page.is_tiled or page.imagelength % patch or page.imagewidth % patch or (
                max(patch, page.tilelength) % min(patch, page.tilelength)):
            raise ValueError(f"--scene must be tiled, its sides multiples of --patch {patch}, and its "
                             f"tiles and the patch multiples of each other. Received: {scene!r} "
                             f"({page.imagewidth}x{page.imagelength}, tiles {page.tilewidth}x{page.tilelength})")
    os.makedirs(output_dir, exist_ok=True)
    rel_path = rel_path or os.path.basename(scene)
    if read not in READS:
        raise ValueError(f"--read must be one of {', '.join(READS)}. Received: {read!r}")
    tasks = [(scene, rel_path, output_dir, i, num_shards, patch, read) for i in range(num_shards)]
    with multiprocessing.Pool(processes) as pool:
        return sum(pool.map(_write_shard, tasks, chunksize=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._patch_baselines",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--scene", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--rel_path", help="The records' filename before #patch= (default: the file's name).")
    parser.add_argument("--read", choices=READS, default="window")
    parser.add_argument("--patch", type=int, default=256)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--num_shards", type=int, default=8)
    args = parser.parse_args(argv)
    n = convert(args.scene, args.output_dir, read=args.read, patch=args.patch, processes=args.processes,
                num_shards=args.num_shards, rel_path=args.rel_path)
    print(json.dumps({"records": n, "shards": args.num_shards}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
