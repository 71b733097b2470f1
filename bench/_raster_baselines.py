"""The hand-written 2-process TIFF converter that `bench.rasters` measures shardsmith against.

`multiprocessing.Pool(2)`; each task `tifffile.imread`s the files of one shard
and writes, per file, a `tf.train.Example` of its array's bytes
(little-endian), its shape and its label with `tf.io.TFRecordWriter`. Nothing
is checked beyond what the read itself raises. Prints one JSON line, e.g.
``{"records": 20000, "shards": 8}``.

Usage:

  python -m bench._raster_baselines --input_dir IN --output_dir OUT [--processes 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys

# Imported at the top, as a hand-written script does; forked pool workers
# inherit the imported modules.
import tensorflow as tf
import tifffile

from bench._baselines import list_class_files

__all__ = ["convert", "main"]

_NUM_SHARDS = 8


def _feature(**kwargs) -> tf.train.Feature:
    return tf.train.Feature(**kwargs)


def _write_shard(task) -> int:
    output_dir, index, num_shards, files = task
    path = os.path.join(output_dir, f"train-{index:05d}-of-{num_shards:05d}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for label, _, file_path in files:
            array = tifffile.imread(file_path)
            if array.ndim == 2:
                array = array[:, :, None]
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": _feature(bytes_list=tf.train.BytesList(
                    value=[array.astype(array.dtype.newbyteorder("<")).tobytes()])),
                "shape": _feature(int64_list=tf.train.Int64List(value=list(array.shape))),
                "label": _feature(int64_list=tf.train.Int64List(value=[label])),
            }))
            writer.write(example.SerializeToString())
    return len(files)


def convert(input_dir: str, output_dir: str, processes: int = 2,
            num_shards: int = _NUM_SHARDS) -> int:
    """Converts `input_dir/<class>/*.tif` into `num_shards` shards on `processes` processes.

    Returns:
      The number of records written.
    """
    _, files = list_class_files(input_dir)
    os.makedirs(output_dir, exist_ok=True)
    tasks = [(output_dir, i, num_shards, files[i::num_shards]) for i in range(num_shards)]
    with multiprocessing.Pool(processes) as pool:
        return sum(pool.map(_write_shard, tasks, chunksize=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._raster_baselines",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--input_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    n = convert(args.input_dir, args.output_dir, args.processes)
    print(json.dumps({"records": n, "shards": _NUM_SHARDS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
