"""Satellite time series (issue 37): conversion and reading speed against hand-written code, and memory.

Speed of conversion (`run_convert`): N locations (default 200) x T dates (24)
of 64 x 64 x 10 uint16 passes, one GDAL-written GeoTIFF per date, converted
by

- shardsmith: `python -m beam_jobs.convert --time_series --worker_processes 2`
  (dates from names, alignment checked, stacks written with band statistics,
  index files and the manifest), and
- the baseline: `python -m bench._time_series_baseline`, the hand-written
  two-process converter (tifffile reads, numpy stacking, TFRecordWriter);

each a whole process, one after the other in this run. Target: ratio
(baseline's wall time / shardsmith's) >= 1.2.

Speed of reading (`run_read`): one epoch of the converted train split in
batches of 32 at max_steps=24, by `readers.time_series_dataset_from_tfrecords`
and by a hand-written tf.data pipeline over the same records (TFRecordDataset,
parse, decode_raw, reshape, cast, batch). One untimed epoch of each, then
`--repetitions` (7) epochs of each, interleaved, each reader first in every
other pair; the ratio is of the medians (and the median of the pairs' own
ratios is printed beside it).
Target: ratio (hand-written's time / ours) >= 0.9. The process's CPU seconds
per epoch are compared too: on a shared, loaded machine wall times of single
epochs vary 2-4x, CPU time far less.

Memory (`run_memory`): the peak summed RSS of the process tree converting
one location of 60 dates of 2000 x 2000 x 10 uint16 (4.8 GB of values) with
--raster_patch 256, beside a whole-stack control (a location 4x smaller on
each side, converted without patches, its stack in memory). Target: the
patch conversion under 1.5 GiB.

Usage:

  python -m bench.time_series [--small] [--skip-memory] [--skip-convert] [--repetitions N] [--work DIR]
                             [--json FILE]

`--small`: 40 locations x 12 dates, reading the same; memory at 60 dates of
400 x 400 (control 100 x 100): a quick run, not the issue's figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from bench._cli import write_json
from bench.convert import measure

__all__ = ["make_locations", "run_convert", "run_read", "run_memory", "main"]

_LOG = logging.getLogger("shardsmith.bench.time_series")


def make_locations(root: str, locations: int, dates: int, size: int, bands: int = 10, seed: int = 0) -> None:
    """`locations` folders of `dates` GDAL-written GeoTIFFs (one per date, `bands` uint16 bands)."""
    import rasterio
    from rasterio.transform import from_origin

    rng = np.random.default_rng(seed)
    first = datetime.date(2020, 1, 1)
    for k in range(locations):
        folder = os.path.join(root, f"class_{k % 2}", f"loc_{k:04d}")
        os.makedirs(folder, exist_ok=True)
        base = rng.integers(500, 4000, size=(bands, 1, 1), dtype=np.uint16)
        for t in range(dates):
            values = (base + rng.integers(0, 300, size=(bands, size, size), dtype=np.uint16)).astype(np.uint16)
            date = first + datetime.timedelta(days=5 * t)
            with rasterio.open(os.path.join(folder, f"{date.isoformat()}.tif"), "w", driver="GTiff",
                               height=size, width=size, count=bands, dtype="uint16", crs="EPSG:32631",
                               transform=from_origin(400000.0 + 640 * k, 5000000.0, 10.0, 10.0)) as dst:
                dst.write(values)


def _convert(input_dir, output_dir, log, *extra):
    argv = [sys.executable, "-m", "beam_jobs.convert", "--input_dir", input_dir, "--output_dir", output_dir,
            "--time_series", "--worker_processes", "2", *extra]
    return measure(argv, log)


def run_convert(work: str, locations: int, dates: int) -> dict:
    corpus = os.path.join(work, "corpus")
    if not os.path.isdir(corpus):
        make_locations(corpus, locations, dates, 64)
    ours = os.path.join(work, "shardsmith")
    base = os.path.join(work, "baseline")
    for folder in (ours, base):
        shutil.rmtree(folder, ignore_errors=True)
    wall, cpu, rss, _, rc = _convert(corpus, ours, os.path.join(work, "shardsmith.log"))
    b_wall, b_cpu, b_rss, _, b_rc = measure(
        [sys.executable, "-m", "bench._time_series_baseline", corpus, base], os.path.join(work, "baseline.log"))
    if rc or b_rc:
        raise SystemExit(f"a converter failed (shardsmith {rc}, baseline {b_rc}); see the logs in {work}")
    result = {"locations": locations, "dates": dates,
              "shardsmith": {"wall_s": wall, "cpu_s": cpu, "peak_rss": rss},
              "baseline": {"wall_s": b_wall, "cpu_s": b_cpu, "peak_rss": b_rss},
              "ratio": b_wall / wall}
    print(f"Convert {locations} locations x {dates} dates of 64x64x10 uint16: shardsmith {wall:.2f} s, "
          f"hand-written 2-process converter {b_wall:.2f} s; ratio {result['ratio']:.2f} (target >= 1.2)")
    return result


def run_read(work: str, max_steps: int = 24, batch_size: int = 32, epochs: int = 7) -> dict:
    import tensorflow as tf

    import readers

    data = os.path.join(work, "shardsmith")
    ds = readers.time_series_dataset_from_tfrecords(data, batch_size=batch_size, max_steps=max_steps, seed=0)
    manifest = json.load(open(os.path.join(data, "manifest.json")))
    files = [os.path.join(data, s["file"]) for s in manifest["splits"]["train"]["shards"]]
    dtype = tf.as_dtype(manifest["time_series"]["dtypes"][0])
    spec = {"stack": tf.io.FixedLenFeature([], tf.string), "stack/shape": tf.io.FixedLenFeature([4], tf.int64),
            "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(serialized):
        f = tf.io.parse_single_example(serialized, spec)
        stack = tf.cast(tf.reshape(tf.io.decode_raw(f["stack"], dtype), f["stack/shape"]), tf.float32)
        return stack[:max_steps], tf.cast(f["label"], tf.int32)

    hand = (tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
            .shuffle(256, seed=0).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch_size).prefetch(tf.data.AUTOTUNE))

    def one_epoch(dataset):
        start, cpu = time.perf_counter(), time.process_time()
        n = sum(int(x.shape[0]) for x, _ in dataset)
        return time.perf_counter() - start, n, time.process_time() - cpu

    # One epoch of each first (tracing, the page cache), untimed; then interleaved repetitions,
    # so that a shared machine's load falls on both alike, and the median of each.
    n, m = one_epoch(ds)[1], one_epoch(hand)[1]
    assert n == m, (n, m)
    load_before = os.getloadavg()[0]
    ours, theirs = [], []
    for k in range(epochs):
        # Each goes first in every other pair (A B B A ...): a load that comes and goes with the
        # machine's other work falls on neither by its place in the pair.
        if k % 2 == 0:
            ours.append(one_epoch(ds))
            theirs.append(one_epoch(hand))
        else:
            theirs.append(one_epoch(hand))
            ours.append(one_epoch(ds))
    ours_s, theirs_s = (statistics.median(r[0] for r in runs) for runs in (ours, theirs))
    # CPU seconds of the whole process (every tf.data thread): the work itself, less sensitive
    # than wall time to what else the machine runs.
    ours_cpu, theirs_cpu = (statistics.median(r[2] for r in runs) for runs in (ours, theirs))
    pairs = sorted(t[0] / o[0] for o, t in zip(ours, theirs))
    # The median of the pairs' own ratios: each pair ran at nearly the same time, so under the
    # same load.
    pair_median = statistics.median(pairs)
    result = {"stacks": n, "batch_size": batch_size, "max_steps": max_steps, "repetitions": epochs,
              "shardsmith_s": ours_s, "hand_written_s": theirs_s, "ratio": theirs_s / ours_s,
              "pair_ratios": pairs, "pair_ratio_median": pair_median, "shardsmith_cpu_s": ours_cpu, "hand_written_cpu_s": theirs_cpu,
              "cpu_ratio": theirs_cpu / ours_cpu, "load_average": [load_before, os.getloadavg()[0]]}
    print(f"Read {n} stacks in batches of {batch_size} at max_steps={max_steps}: shardsmith {ours_s:.3f} s, "
          f"hand-written tf.data {theirs_s:.3f} s per epoch (median of {epochs} interleaved); ratio "
          f"{result['ratio']:.2f} (target >= 0.9); per repetition {pairs[0]:.2f} to {pairs[-1]:.2f}, "
          f"median {pair_median:.2f}; "
          f"CPU s per epoch {ours_cpu:.2f} vs {theirs_cpu:.2f}, ratio {result['cpu_ratio']:.2f}; "
          f"load average {load_before:.1f} to {result['load_average'][1]:.1f} on {os.cpu_count()} cores")
    return result


def run_memory(work: str, side: int, dates: int = 60) -> dict:
    big = os.path.join(work, "memory_big")
    control = os.path.join(work, "memory_control")
    if not os.path.isdir(big):
        make_locations(big, 1, dates, side, seed=1)
    if not os.path.isdir(control):
        make_locations(control, 1, dates, side // 4, seed=2)
    out = {}
    for name, corpus, extra in (("patches", big, ("--raster_patch", "256")),
                                ("whole_control", control, ("--max_pixels", str(10 ** 12)))):
        target = os.path.join(work, f"out_{name}")
        shutil.rmtree(target, ignore_errors=True)
        wall, cpu, rss, _, rc = _convert(corpus, target, os.path.join(work, f"{name}.log"), *extra)
        if rc:
            raise SystemExit(f"the {name} conversion failed ({rc}); see {work}/{name}.log")
        out[name] = {"wall_s": wall, "peak_rss_mib": rss / 2 ** 20}
    values = dates * side * side * 10 * 2
    out.update(side=side, dates=dates, values_gb=values / 1e9)
    print(f"Memory: {dates} dates of {side}x{side}x10 uint16 ({values / 1e9:.2f} GB of values) with "
          f"--raster_patch 256: peak {out['patches']['peak_rss_mib']:.0f} MiB (target < 1536); whole-stack "
          f"control ({side // 4}x{side // 4}): {out['whole_control']['peak_rss_mib']:.0f} MiB")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-convert", action="store_true", help="read the conversion of an earlier run in --work")
    parser.add_argument("--repetitions", type=int, default=7, help="interleaved epochs of each reader")
    parser.add_argument("--work")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="bench_time_series_")
    os.makedirs(work, exist_ok=True)
    locations, dates = (40, 12) if args.small else (200, 24)
    results = {} if args.skip_convert else {"convert": run_convert(work, locations, dates)}
    results["read"] = run_read(work, max_steps=min(24, dates), epochs=args.repetitions)
    if not args.skip_memory:
        results["memory"] = run_memory(work, 400 if args.small else 2000)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
