"""Multispectral rasters: conversion and reading of EuroSAT-sized 13-band patches.

The corpus (`bench.corpus rasters`): ``count`` (default 20,000) 64x64 TIFFs
of 13 uint16 bands, uncompressed, in 10 class folders (104 KB each), stored by
shardsmith as raw records ('raw-uint16').

Conversion, each converter a whole process (start-up included), one after
the other, best of ``--repeat``:

- shardsmith's default command (`python -m beam_jobs.convert`): tifffile
  reads every strip, checks it against the header, computes the per-band
  statistics of the manifest;
- (b) a hand-written 2-process converter (`bench._raster_baselines`,
  `multiprocessing.Pool(2)`): `tifffile.imread` of each file, then its
  bytes, shape and label into TFRecords with `tf.io.TFRecordWriter`; nothing
  validated beyond the read.

Reading, warm page cache, steady state (a timed window of at least one epoch
after a warm-up), each contender in its own process, best of ``--repeat``
(the processes are forked one after the other from one that imported
TensorFlow, before any op: `reads`; the clocks start after the import):

- shardsmith: `readers.image_dataset_from_tfrecords(dir, "train",
  batch_size=64, image_size=None, color_mode=None, dtype=...)` with `dtype`
  None (the stored uint16) and 'float32' (what a model takes), shuffled (its
  default), `repeat=True`;
- hand-written tf.data over the same shards: the shard files shuffled, an
  AUTOTUNE interleave of `TFRecordDataset`s, a 1024-record shuffle buffer,
  batches of 64 parsed with `tf.io.parse_example`, one `tf.io.decode_raw`
  and reshape to the known (64, 64, 13) per batch, (cast to float32,)
  prefetch.

Targets: conversion >= 1.2x (b) (ratio = (b)'s wall time / shardsmith's);
reading >= 0.95x the hand-written reader's images/s, at the same output
dtype. CPU time per image is printed beside each: on shared cores it moves
less than wall time.

Usage:

  python -m bench.rasters [--count 20000] [--seed 0] [--repeat 3] [--work DIR] [--json FILE]
  python -m bench.rasters read {shardsmith,hand} --data_dir DIR [--dtype float32]
  python -m bench.rasters reads --data_dir DIR --readers shardsmith:,hand:float32,...
  python -m bench.rasters compare --data_dir DIR [--dtype float32] [--rounds 8]

`compare` times both readers in one process, in alternating windows (the same
load for both; see `compare_in_process`), on shards written before.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile

import psutil

from bench import corpus
from bench.convert import Contender, Measurement, _best, _run_one

__all__ = ["CONVERTERS", "READERS", "compare_in_process", "hand_reader", "read_one", "run", "main"]

_LOG = logging.getLogger("shardsmith.bench.rasters")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RESULT = "BENCH_RASTERS_RESULT "
_SPLIT = "train"
_SHAPE = (64, 64, 13)
_BATCH = 64
_SHUFFLE_RECORDS = 1024
_TARGET_CONVERT = 1.2
_TARGET_READ = 0.95

CONVERTERS = (
    Contender("shardsmith", "shardsmith (default command)", (
        "-m", "beam_jobs.convert", "--input_dir", "{input}", "--output_dir", "{output}",
        "--overwrite")),
    Contender("baseline", "(b) Pool(2), tifffile.imread", (
        "-m", "bench._raster_baselines", "--input_dir", "{input}", "--output_dir", "{output}")),
)


@dataclasses.dataclass(frozen=True)
class Reader:
    """One reading contender: a pipeline and its output dtype ('' = as stored)."""

    name: str
    pipeline: str
    dtype: str
    label: str


READERS = (
    Reader("shardsmith-uint16", "shardsmith", "", "shardsmith, dtype=None (uint16)"),
    Reader("hand-uint16", "hand", "", "hand-written tf.data, uint16"),
    Reader("shardsmith-float32", "shardsmith", "float32", "shardsmith, dtype='float32'"),
    Reader("hand-float32", "hand", "float32", "hand-written tf.data, float32"),
)
# (contender, reference) pairs with the reading target.
_READ_TARGETS = (("shardsmith-uint16", "hand-uint16"), ("shardsmith-float32", "hand-float32"))


# ---------------------------------------------------------------------------
# Reading.


def hand_reader(data_dir: str, dtype: str = ""):
    """The hand-written tf.data reader of shardsmith's raw records (see the module doc)."""
    import tensorflow as tf

    from schemas import IMAGE, IMAGE_SCHEMA, LABEL

    files = sorted(tf.io.gfile.glob(os.path.join(data_dir, f"{_SPLIT}-*.tfrecord")))
    spec = IMAGE_SCHEMA.parse_spec([IMAGE.key, LABEL.key])

    def parse(serialized):
        features = tf.io.parse_example(serialized, spec)
        images = tf.reshape(tf.io.decode_raw(features[IMAGE.key], tf.uint16, little_endian=True),
                            [-1, *_SHAPE])
        if dtype:
            images = tf.cast(images, dtype)
        return images, tf.cast(features[LABEL.key], tf.int32)

    ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), reshuffle_each_iteration=True)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=len(files),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    ds = ds.shuffle(_SHUFFLE_RECORDS).repeat()
    ds = ds.batch(_BATCH).map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return ds.prefetch(tf.data.AUTOTUNE)


def _shardsmith_reader(data_dir: str, dtype: str = ""):
    import readers

    # image_size=None: batches at the stored size (the split has one), nothing resized.
    return readers.image_dataset_from_tfrecords(
        data_dir, _SPLIT, batch_size=_BATCH, image_size=None, color_mode=None,
        dtype=dtype or None, repeat=True)


def read_one(pipeline: str, data_dir: str, dtype: str, *, records: int, warmup: int = 16,
             seconds: float = 3.0) -> dict:
    """Times one reader in this process: steady images/s over at least one epoch and `seconds`."""
    from bench._read_baselines import measure

    build = {"shardsmith": _shardsmith_reader, "hand": hand_reader}[pipeline]
    batches = max(64, -(-records // _BATCH))
    return measure(lambda: build(data_dir, dtype), warmup=warmup, batches=batches, min_seconds=seconds)


def compare_in_process(data_dir: str, dtype: str = "", *, rounds: int = 8,
                       window_s: float = 1.5, warmup: int = 40) -> dict:
    """Both readers in one process, timed in alternating windows, best of `rounds`.

    On shared cores, separate processes measured minutes apart see different
    loads (one quiet slot decides a best-of-3); alternating windows of the
    same process put both readers under the same load. Both are warmed up
    first (their record shuffle buffers filled), so this is the steady state.

    Returns:
      {reader: {"images_per_s", "cpu_ms_per_image"}} (best of the rounds), and
      "ratio" (shardsmith / hand images/s) and "cpu_ratio" (hand / shardsmith
      CPU per image: images per CPU-second).
    """
    import time

    from bench._read_baselines import _cpu_seconds

    iterators = {"shardsmith": iter(_shardsmith_reader(data_dir, dtype)),
                 "hand": iter(hand_reader(data_dir, dtype))}
    for it in iterators.values():
        for _ in range(warmup):
            next(it)
    best = {name: {"images_per_s": 0.0, "cpu_ms_per_image": float("inf")} for name in iterators}
    for _ in range(rounds):
        for name, it in iterators.items():
            cpu0, t0, images = _cpu_seconds(), time.perf_counter(), 0
            while time.perf_counter() - t0 < window_s:
                images += int(next(it)[0].shape[0])
            wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
            best[name]["images_per_s"] = max(best[name]["images_per_s"], images / wall)
            best[name]["cpu_ms_per_image"] = min(best[name]["cpu_ms_per_image"],
                                                 1000 * cpu / images)
    return dict(best, ratio=best["shardsmith"]["images_per_s"] / best["hand"]["images_per_s"],
                cpu_ratio=best["hand"]["cpu_ms_per_image"] / best["shardsmith"]["cpu_ms_per_image"])


def _read_subprocesses(readers: list[Reader], data_dir: str, records: int, seconds: float) -> list[dict]:
    """`read_one` of each reader in turn, each in its own process, forked from one that imported
    TensorFlow (`python -m bench.rasters reads`): a fresh process per reader, as TensorFlow
    runs no op before the fork, without an import of its own (~3.5 s of CPU each, which the
    figures never included: they start after the import)."""
    argv = [sys.executable, "-m", "bench.rasters", "reads", "--data_dir", data_dir,
            "--records", str(records), "--seconds", str(seconds),
            "--readers", ",".join(f"{r.pipeline}:{r.dtype}" for r in readers)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=_REPO, env=env,
                          stdin=subprocess.DEVNULL)
    lines = [l for l in proc.stdout.splitlines() if l.startswith(_RESULT)]
    if proc.returncode != 0 or len(lines) != len(readers):
        done = ", ".join(r.label for r in readers[:len(lines)]) or "none"
        raise RuntimeError(f"reading failed (exit {proc.returncode}; done: {done}):\n{proc.stderr[-3000:]}")
    return [json.loads(l[len(_RESULT):]) for l in lines]


def _read_forked(jobs: list[tuple[str, str]], data_dir: str, records: int, seconds: float) -> int:
    """`read_one` of each (pipeline, dtype) in a child forked from this process, one after the
    other; prints each result line. Returns 0, or the first failed child's exit status."""
    import tensorflow  # noqa: F401  (imported once, before the forks and the clocks; no op run)

    for pipeline, dtype in jobs:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # The child: one reader, then out without the interpreter's teardown.
            code = 1
            try:
                result = read_one(pipeline, data_dir, dtype, records=records, seconds=seconds)
                print(_RESULT + json.dumps(result), flush=True)
                code = 0
            except BaseException:  # noqa: BLE001 - printed as Python would, then the status
                import traceback

                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code != 0:
            return code if code > 0 else 1
    return 0


# ---------------------------------------------------------------------------
# The benchmark.


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _convert_table(results: dict[str, Measurement]) -> list[str]:
    head = (f"{'converter':<34} {'images/s':>9} {'wall s':>7} {'CPU s':>6} {'CPU ms/img':>10} "
            f"{'(b)/it':>7}")
    ref = results["baseline"]
    rows = [head, "-" * len(head)]
    for c in CONVERTERS:
        m = results[c.name]
        bad = "" if m.returncode == 0 and m.records == m.images else (
            f"  (exit {m.returncode}, {m.records} records)")
        rows.append(f"{c.label:<34} {m.images_per_s:>9.0f} {m.wall_s:>7.1f} {m.cpu_s:>6.1f} "
                    f"{m.cpu_s / m.images * 1e3:>10.3f} {ref.wall_s / m.wall_s:>6.2f}x{bad}")
    return rows


def _read_table(results: dict[str, dict]) -> list[str]:
    head = f"{'reader (batch 64, warm)':<34} {'images/s':>9} {'CPU ms/img':>10} {'TTFB s':>7}"
    rows = [head, "-" * len(head)]
    for r in READERS:
        m = results[r.name]
        rows.append(f"{r.label:<34} {m['images_per_s']:>9.0f} {m['cpu_ms_per_image']:>10.3f} "
                    f"{m['ttfb_s']:>7.2f}")
    return rows


def _best_read(runs: list[dict]) -> dict:
    best = dict(max(runs, key=lambda m: m["images_per_s"]))
    best["cpu_ms_per_image"] = min(m["cpu_ms_per_image"] for m in runs)
    best["ttfb_s"] = min(m["ttfb_s"] for m in runs)
    return best


def run(*, count: int = 20_000, seed: int = 0, repeat: int = 3, work: str | None = None,
        corpus_dir: str | None = None, read_seconds: float = 3.0) -> dict:
    """Runs conversion and reading, prints both tables; returns the figures."""
    bench_root = os.path.join(_REPO, "build", "bench")
    corpus_dir = corpus_dir or os.path.join(bench_root, "corpora")
    own_work = work is None
    if own_work:
        os.makedirs(bench_root, exist_ok=True)
        work = tempfile.mkdtemp(prefix="rasters-", dir=bench_root)
    failed = True
    try:
        info = corpus.generate("rasters", os.path.join(corpus_dir, f"rasters-{count}-seed{seed}"),
                               count=count, seed=seed)
        stats = corpus.format_stats(corpus.describe(info.root))
        _LOG.info("Rasters: %s", stats)
        load = [psutil.getloadavg()[0]]
        runs: dict[str, list[Measurement]] = {c.name: [] for c in CONVERTERS}
        for r in range(repeat):
            for c in CONVERTERS:
                runs[c.name].append(_run_one(c, info.root, count, work, f"rasters-{r}", False))
        convert = {n: _best(ms) for n, ms in runs.items()}
        failed = any(m.returncode != 0 or m.records != count for ms in runs.values() for m in ms)
        if failed:
            raise RuntimeError(f"A converter failed: its log is kept in {os.path.join(work, 'logs')}")
        load.append(psutil.getloadavg()[0])
        data_dir = os.path.join(work, "out", "shardsmith")  # The last round's output.
        reads: dict[str, list[dict]] = {r.name: [] for r in READERS}
        order = [reader for _ in range(repeat) for reader in READERS]  # Interleaved rounds.
        for reader, m in zip(order, _read_subprocesses(order, data_dir, count, read_seconds)):
            _LOG.info("  %-34s %8.0f images/s %7.3f CPU ms/image", reader.label,
                      m["images_per_s"], m["cpu_ms_per_image"])
            reads[reader.name].append(m)
        read = {n: _best_read(ms) for n, ms in reads.items()}
        load.append(psutil.getloadavg()[0])
    finally:
        if own_work and not failed:
            shutil.rmtree(work, ignore_errors=True)
    convert_ratio = convert["baseline"].wall_s / convert["shardsmith"].wall_s
    read_ratios = {a: read[a]["images_per_s"] / read[b]["images_per_s"] for a, b in _READ_TARGETS}
    lines = [
        f"Converting {count:,} rasters ({stats}), whole processes, best of {repeat}, "
        f"{os.cpu_count()} cores, load average {' / '.join(f'{v:.1f}' for v in load)} "
        "(start / after conversion / after reading):",
        *_convert_table(convert),
        f"Target conversion vs (b): {convert_ratio:.2f}x (>= {_TARGET_CONVERT}x: "
        f"{_verdict(convert_ratio >= _TARGET_CONVERT)})",
        "",
        f"Reading them (shardsmith's shards, {count:,} records; steady state over >= 1 epoch, "
        f"best of {repeat}):",
        *_read_table(read),
    ]
    for a, b in _READ_TARGETS:
        ratio = read_ratios[a]
        cpu = read[b]["cpu_ms_per_image"] / read[a]["cpu_ms_per_image"]
        lines.append(f"Target reading, {a} vs {b}: {ratio:.2f}x images/s (>= {_TARGET_READ}x: "
                     f"{_verdict(ratio >= _TARGET_READ)}); images per CPU-second {cpu:.2f}x")
    print()
    print("\n".join(lines))
    return {"count": count, "seed": seed, "repeat": repeat, "cpu_count": os.cpu_count(),
            "load_average": load, "corpus": stats,
            "convert": {n: dict(dataclasses.asdict(m), images_per_s=m.images_per_s)
                        for n, m in convert.items()},
            "convert_ratio": convert_ratio, "read": read, "read_ratios": read_ratios,
            "failed": False}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        parser = argparse.ArgumentParser(prog="python -m bench.rasters compare")
        parser.add_argument("--data_dir", required=True)
        parser.add_argument("--dtype", default="", choices=("", "float32"))
        parser.add_argument("--rounds", type=int, default=8)
        parser.add_argument("--window_s", type=float, default=1.5)
        args = parser.parse_args(argv[1:])
        result = compare_in_process(args.data_dir, args.dtype, rounds=args.rounds,
                                    window_s=args.window_s)
        print(_RESULT + json.dumps(result), flush=True)
        return 0
    if argv[:1] == ["reads"]:
        parser = argparse.ArgumentParser(prog="python -m bench.rasters reads")
        parser.add_argument("--data_dir", required=True)
        parser.add_argument("--readers", required=True,
                            help="PIPELINE:DTYPE,... in order, e.g. shardsmith:,hand:float32.")
        parser.add_argument("--records", type=int, required=True, help="Records of the split.")
        parser.add_argument("--seconds", type=float, default=3.0, help="Shortest timed window.")
        args = parser.parse_args(argv[1:])
        jobs = [tuple(job.split(":", 1)) for job in args.readers.split(",")]
        for pipeline, dtype in jobs:
            if pipeline not in ("shardsmith", "hand") or dtype not in ("", "float32"):
                parser.error(f"--readers: each one PIPELINE:DTYPE with PIPELINE shardsmith or hand "
                             f"and DTYPE empty or float32. Received: {pipeline}:{dtype}")
        return _read_forked(jobs, args.data_dir, args.records, args.seconds)
    if argv[:1] == ["read"]:
        parser = argparse.ArgumentParser(prog="python -m bench.rasters read")
        parser.add_argument("pipeline", choices=("shardsmith", "hand"))
        parser.add_argument("--data_dir", required=True)
        parser.add_argument("--dtype", default="", choices=("", "float32"))
        parser.add_argument("--records", type=int, required=True, help="Records of the split.")
        parser.add_argument("--seconds", type=float, default=3.0, help="Shortest timed window.")
        args = parser.parse_args(argv[1:])
        import tensorflow  # noqa: F401  (imported before the clock starts)

        result = read_one(args.pipeline, args.data_dir, args.dtype, records=args.records,
                          seconds=args.seconds)
        print(_RESULT + json.dumps(result), flush=True)
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.rasters",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=20_000, help="Rasters (default 20000).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="Rounds; the best of each is kept.")
    parser.add_argument("--work", help="Folder for outputs and logs (default: temporary, removed).")
    parser.add_argument("--corpus_dir", help="Folder of generated corpora (default build/bench/corpora).")
    parser.add_argument("--json", help="Write the figures to this file.")
    parser.add_argument("--read_seconds", type=float, default=3.0,
                        help="Shortest timed window of each reader (default 3; the test runs less).")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.count < 10 or args.repeat < 1:
        parser.error("--count must be at least 10 and --repeat at least 1")
    try:
        summary = run(count=args.count, seed=args.seed, repeat=args.repeat, work=args.work,
                      corpus_dir=args.corpus_dir, read_seconds=args.read_seconds)
    except RuntimeError as e:
        _LOG.error("bench.rasters: %s", e)
        return 1
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, sort_keys=True, default=str)
    return 0


if __name__ == "__main__":
    # Without the interpreter's teardown after TensorFlow (~2 s of CPU per reading process; its
    # figures are taken in the process, before the end).
    from conversion import console

    console.exit_program(main())
