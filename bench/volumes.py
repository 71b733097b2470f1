"""Benchmark: DICOM series -> volume records, and random patches read back (issue 36).

Three figures, each a ratio against a baseline measured in the same run:

1. Conversion time: `convert --volumes` (DirectRunner) against a hand-written
   two-process converter (pydicom + numpy + tf.io.TFRecordWriter, series in
   a `multiprocessing.Pool(2)`, sorted by ImagePositionPatient z).
2. Peak memory of the process tree during shardsmith's conversion, minus
   what it held before, against one volume's size.
3. Random 96^3 patches read per second: `readers.volume_dataset_from_tfrecords`
   against a hand-written tf.data pipeline (parse, decode_raw, reshape,
   `tf.image.random_crop`) over the baseline's records; three alternated
   rounds, the median of each.

    python -m bench.volumes            # 20 series of 200 512x512 int16 slices (~2 GB of DICOM)
    python -m bench.volumes --small    # 4 series of 24 64x64 slices, patches of 16^3
    python -m bench.volumes --series 4 --slices 120  # 512x512 slices and 96^3 patches, fewer of them
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

_LOG = logging.getLogger("bench.volumes")


def make_corpus(root: Path, series: int, slices: int, size: int, seed: int = 0) -> None:
    """`series` CT series of `slices` int16 slices of size x size, names shuffled, under root/c/p<i>."""
    import pydicom
    from pydicom.data import get_testdata_file
    from pydicom.uid import generate_uid

    rng = np.random.default_rng(seed)
    names = random.Random(seed)
    template = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    for s in range(series):
        folder = root / "c" / f"p{s:03d}"
        folder.mkdir(parents=True)
        uid = generate_uid()
        base = rng.integers(0, 2000, (size, size), dtype=np.int16)
        for k in range(slices):
            ds = template.copy()
            ds.Rows = ds.Columns = size
            ds.PixelData = (base + k).astype(np.int16).tobytes()
            ds.ImagePositionPatient = ["-100.0", "-100.0", f"{k * 1.25:.3f}"]
            ds.ImageOrientationPatient = ["1", "0", "0", "0", "1", "0"]
            ds.SeriesInstanceUID = uid
            ds.SOPInstanceUID = generate_uid()
            ds.save_as(folder / f"{names.getrandbits(40):010x}", enforce_file_format=True)


def _baseline_series(args):
    """One series the hand-written way: read, sort by z, stack, rescale, return bytes."""
    import pydicom

    folder = args
    datasets = [pydicom.dcmread(p) for p in sorted(Path(folder).iterdir())]
    datasets.sort(key=lambda ds: float(ds.ImagePositionPatient[2]))
    volume = np.stack([ds.pixel_array for ds in datasets]).astype(np.int16)
    volume = volume * int(datasets[0].RescaleSlope) + int(datasets[0].RescaleIntercept)
    return volume.astype(np.int16).tobytes(), volume.shape


def baseline_convert(root: Path, out: Path) -> None:
    """The hand-written converter: two processes, one TFRecord file."""
    import tensorflow as tf

    folders = sorted(str(p) for p in (root / "c").iterdir())
    out.mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("spawn").Pool(2) as pool, \
            tf.io.TFRecordWriter(str(out / "train.tfrecord")) as writer:
        for data, shape in pool.imap(_baseline_series, folders):
            example = tf.train.Example(features=tf.train.Features(feature={
                "volume": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=list(shape))),
            }))
            writer.write(example.SerializeToString())


class _PeakRss:
    """Samples the resident memory of this process and its children every 20 ms."""

    def __init__(self):
        import psutil

        self._process = psutil.Process()
        self.start = self._rss()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> int:
        import psutil

        total = 0
        for p in [self._process, *self._process.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        return total

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._rss())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _patches_per_second(ds, count: int) -> float:
    it = iter(ds)
    next(it)  # warm up (graph tracing)
    start = time.perf_counter()
    n = 0
    for element in it:
        n += int(element[0].shape[0])
        if n >= count:
            break
    return n / (time.perf_counter() - start)


def run(series: int, slices: int, size: int, patch: int, work: Path) -> dict:
    import tensorflow as tf

    import readers
    from beam_jobs import convert

    corpus = work / "in"
    make_corpus(corpus, series, slices, size)
    volume_bytes = slices * size * size * 2
    load = {"start": os.getloadavg()[0]}
    start = time.perf_counter()
    baseline_convert(corpus, work / "baseline")
    baseline_s = time.perf_counter() - start
    with _PeakRss() as rss:
        start = time.perf_counter()
        convert.run(["--volumes", "--input_dir", str(corpus), "--output_dir", str(work / "out"),
                     "--runner", "DirectRunner"])
        ours_s = time.perf_counter() - start
    peak_over = rss.peak - rss.start
    load["convert"] = os.getloadavg()[0]

    shape = (patch, patch, patch)
    count = 4 * series * 4
    ours = readers.volume_dataset_from_tfrecords(work / "out", "train", batch_size=4, patch_size=shape,
                                                  patches_per_volume=4, seed=0).repeat()

    def parse(serialized):
        f = tf.io.parse_single_example(serialized, {"volume": tf.io.FixedLenFeature([], tf.string),
                                                    "shape": tf.io.FixedLenFeature([3], tf.int64)})
        v = tf.reshape(tf.io.decode_raw(f["volume"], tf.int16), f["shape"])
        crops = [tf.image.random_crop(v, shape, seed=i) for i in range(4)]
        return tf.data.Dataset.from_tensor_slices(tf.cast(tf.stack(crops), tf.float32)[..., None])

    theirs = (tf.data.TFRecordDataset(str(work / "baseline" / "train.tfrecord")).flat_map(parse)
              .batch(4).map(lambda v: (v, 0)).prefetch(tf.data.AUTOTUNE).repeat())
    # Alternated, three rounds, the median of each: on a shared machine one
    # measurement after the other mostly measures who ran first.
    ours_rates, their_rates = [], []
    for _ in range(3):
        ours_rates.append(_patches_per_second(ours, count))
        their_rates.append(_patches_per_second(theirs, count))
    ours_rate, their_rate = sorted(ours_rates)[1], sorted(their_rates)[1]
    load["patches"] = os.getloadavg()[0]
    return {
        "convert_s": ours_s, "baseline_s": baseline_s, "convert_ratio": baseline_s / ours_s,
        "peak_over_volume": peak_over / volume_bytes, "volume_mb": volume_bytes / 2**20,
        "patches_per_s": ours_rate, "baseline_patches_per_s": their_rate, "read_ratio": ours_rate / their_rate,
        "load": load,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.volumes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="4 series of 24 64x64 slices, 16^3 patches.")
    parser.add_argument("--work_dir", help="Where the corpus and outputs go (default: a temporary folder).")
    parser.add_argument("--series", type=int, help="Series in the corpus (default 20; 4 with --small).")
    parser.add_argument("--slices", type=int, help="Slices per series (default 200; 24 with --small).")
    args = parser.parse_args(argv)
    series, slices, size, patch = (4, 24, 64, 16) if args.small else (20, 200, 512, 96)
    series, slices = args.series or series, args.slices or slices
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_volumes_"))
    try:
        r = run(series, slices, size, patch, work)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"volumes: {series} series x {slices} slices of {size}x{size} int16 ({r['volume_mb']:.1f} MB each)")
    print(f"convert: shardsmith {r['convert_s']:.2f} s, hand-written 2-process {r['baseline_s']:.2f} s, "
          f"speed ratio {r['convert_ratio']:.2f}x")
    print(f"peak memory of the process tree over its start: {r['peak_over_volume']:.1f} volumes")
    print(f"random {patch}^3 patches: shardsmith {r['patches_per_s']:.0f}/s, hand-written tf.data "
          f"{r['baseline_patches_per_s']:.0f}/s, ratio {r['read_ratio']:.2f}x")
    # On a shared machine the figures move with the load: it goes beside them.
    print("load (1-minute average) at start, after converting, after patches: "
          + ", ".join(f"{r['load'][k]:.1f}" for k in ("start", "convert", "patches")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
