"""The hand-written 2-process scene cutter that `bench.patches` measures shardsmith against.

What a careful user writes without shardsmith: `multiprocessing.Pool(2)`; each
task is one shard, the bands of tile rows ``index, index + num_shards, ...``
of the scene. For each band, tifffile's segment access (the page's tile
offsets and byte counts, `TiffPage.decode`) decodes each tile of the band
once into one array, which is cut into patches of ``--patch`` pixels; each
patch becomes a `tf.train.Example` of the features shardsmith's raw records
have (its bytes little-endian, label, ``path#patch=Y,X`` filename, raw
format, height, width, channels; the keys from `schemas`), written with
`tf.io.TFRecordWriter`. The scene's sides must be multiples of the patch and
the patch of the tile, or the tile of the patch (no edge policy, no nodata
check, no statistics). Prints one JSON line, e.g. ``{"records": 576, "shards": 8}``.

Usage:

  python -m bench._patch_baselines --scene FILE --output_dir OUT [--patch 256] [--processes 2] [--num_shards 8]
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

__all__ = ["convert", "main"]


def _band(tif: tifffile.TiffFile, y0: int, rows: int) -> np.ndarray:
    """Rows [y0, y0 + rows) of the page, every tile of them decoded once."""
    page = tif.pages[0]
    th, tw = page.tilelength, page.tilewidth
    width, bands = page.imagewidth, page.samplesperpixel
    across = math.ceil(width / tw)
    out = np.empty((rows, width, bands), page.dtype)
    fh = tif.filehandle
    for trow in range(y0 // th, (y0 + rows - 1) // th + 1):
        for tcol in range(across):
            index = trow * across + tcol
            fh.seek(page.dataoffsets[index])
            tile, _, _ = page.decode(fh.read(page.databytecounts[index]), index)
            tile = tile.reshape(th, tw, bands)
            top, left = trow * th, tcol * tw
            a, b = max(y0, top), min(y0 + rows, top + th)
            c = min(width, left + tw)
            out[a - y0:b - y0, left:c] = tile[a - top:b - top, :c - left]
    return out


def _feature(**kwargs) -> tf.train.Feature:
    return tf.train.Feature(**kwargs)


def _int(value: int) -> tf.train.Feature:
    return _feature(int64_list=tf.train.Int64List(value=[value]))


def _bytes(value: bytes) -> tf.train.Feature:
    return _feature(bytes_list=tf.train.BytesList(value=[value]))


def _write_shard(task) -> int:
    scene, rel_path, output_dir, index, num_shards, patch = task
    path = os.path.join(output_dir, f"train-{index:05d}-of-{num_shards:05d}.tfrecord")
    records = 0
    with tifffile.TiffFile(scene) as tif, tf.io.TFRecordWriter(path) as writer:
        page = tif.pages[0]
        band_rows = max(patch, page.tilelength)
        raw = schemas.raw_format(page.dtype).encode()
        for y0 in range(index * band_rows, page.imagelength, num_shards * band_rows):
            band = _band(tif, y0, band_rows)
            for dy in range(0, band_rows, patch):
                for x in range(0, page.imagewidth, patch):
                    array = band[dy:dy + patch, x:x + patch]
                    example = tf.train.Example(features=tf.train.Features(feature={
                        schemas.IMAGE.key: _bytes(array.astype(array.dtype.newbyteorder("<")).tobytes()),
                        schemas.LABEL.key: _int(0),
                        schemas.FILENAME.key: _bytes(f"{rel_path}#patch={y0 + dy},{x}".encode()),
                        schemas.FORMAT.key: _bytes(raw),
                        schemas.HEIGHT.key: _int(array.shape[0]),
                        schemas.WIDTH.key: _int(array.shape[1]),
                        schemas.CHANNELS.key: _int(array.shape[2]),
                    }))
                    writer.write(example.SerializeToString())
                    records += 1
    return records


def convert(scene: str, output_dir: str, *, patch: int = 256, processes: int = 2, num_shards: int = 8,
            rel_path: str | None = None) -> int:
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
    tasks = [(scene, rel_path, output_dir, i, num_shards, patch) for i in range(num_shards)]
    with multiprocessing.Pool(processes) as pool:
        return sum(pool.map(_write_shard, tasks, chunksize=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._patch_baselines",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--scene", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--rel_path", help="The records' filename before #patch= (default: the file's name).")
    parser.add_argument("--patch", type=int, default=256)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--num_shards", type=int, default=8)
    args = parser.parse_args(argv)
    n = convert(args.scene, args.output_dir, patch=args.patch, processes=args.processes,
                num_shards=args.num_shards, rel_path=args.rel_path)
    print(json.dumps({"records": n, "shards": args.num_shards}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
