"""The hand-written time-series converter users write today (bench/time_series.py's baseline).

Two processes (multiprocessing), each taking every other location: the
location's files sorted by the date in their names, each read whole with
tifffile, stacked with numpy, written as a `tf.train.Example` (stack bytes,
shape, dates) with `tf.io.TFRecordWriter`, one file per process. Nothing is
checked: no alignment, no nodata, no statistics.

  python -m bench._time_series_baseline INPUT_DIR OUTPUT_DIR
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import re
import sys

_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


def _locations(root):
    found = []
    for folder, _, names in sorted(os.walk(root)):
        tifs = sorted(n for n in names if n.endswith(".tif"))
        if tifs:
            found.append((os.path.relpath(folder, root), [os.path.join(folder, n) for n in tifs]))
    return sorted(found)


def _work(args):
    root, out, index, count = args
    import numpy as np
    import tensorflow as tf
    import tifffile

    locations = _locations(root)[index::count]
    with tf.io.TFRecordWriter(os.path.join(out, f"part-{index}.tfrecord")) as writer:
        for name, files in locations:
            dated = sorted((datetime.date(*map(int, _DATE.search(os.path.basename(f)).groups())), f) for f in files)
            stack = np.stack([tifffile.imread(f) for _, f in dated])
            days = [(d - datetime.date(1970, 1, 1)).days for d, _ in dated]
            feature = {
                "stack": tf.train.Feature(bytes_list=tf.train.BytesList(value=[stack.tobytes()])),
                "stack/shape": tf.train.Feature(int64_list=tf.train.Int64List(value=list(stack.shape))),
                "stack/dates": tf.train.Feature(int64_list=tf.train.Int64List(value=days)),
                "filename": tf.train.Feature(bytes_list=tf.train.BytesList(value=[name.encode()])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return len(locations)


def main(argv):
    root, out = argv
    os.makedirs(out, exist_ok=True)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        done = pool.map(_work, [(root, out, i, 2) for i in range(2)])
    print(f"{sum(done)} locations")


if __name__ == "__main__":
    main(sys.argv[1:])
