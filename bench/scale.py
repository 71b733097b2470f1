"""Scaling benchmark: 1 vs 2 workers, and peak memory as the dataset grows.

Two questions (issue 6), on the photos corpus of `bench.corpus`:

1. Throughput with 1 and with 2 workers, every worker with
   `--worker_threads 1` (one read-ahead thread per shard writer):

   - local x1: `--direct_num_workers 1 --direct_running_mode in_memory`;
   - local x2: `--direct_num_workers 2 --direct_running_mode multi_threading`;
   - Dask x1, Dask x2: 1 or 2 worker processes of `--nthreads 1` on
     127.0.0.1, started here (a scheduler and the workers, each in a process
     group of its own) and killed when done, whatever happened. Each cluster
     runs one throw-away conversion first, so that its workers have imported
     TensorFlow, as in a long-lived cluster.

   Even so, one worker is not one core: its shard writer validates on the
   read-ahead thread while its own thread encodes, hashes and writes, and
   decoders release the GIL. So "x1 on 1 core" runs the x1 setup with its
   processes restricted to one core (CPU affinity; for Dask, the worker
   processes), and the table shows the cores each setup used (CPU s / wall s).
   x2 / x1 answers "what does a second worker add"; x2 / (x1 on 1 core)
   answers "what does a second core add".

   Each conversion runs as a subprocess (`bench.convert.measure`), timed from
   start to exit: images / wall seconds is the end-to-end rate. It includes
   a fixed start-up of 2-3 s (interpreter, TensorFlow and Beam imports,
   listing, pipeline construction, manifest) that a second worker cannot
   shorten. So each setup also converts the 1x corpus, and the steady
   rate is (16x images - 1x images) / (16x wall - 1x wall): the rate at
   which the workers convert once running, which is what the time of a large
   dataset is made of. The target (at least 1.6x with 2 workers on 2 cores)
   applies to the steady rate; the end-to-end ratio tends to it as datasets grow.

2. Peak memory of the default command (no runner flag: threads on every
   core) at 1x, 4x and 16x the images (default 250 / 1,000 / 4,000): RSS and
   PSS of the whole process tree, sampled every 50 ms. Target: the 16x peak
   within 1.2x of the 1x peak.

The cores may be shared with other work: the load average is recorded with
every run, and the CPU seconds of each run are shown (for Dask they include
the workers' CPU). Use `--repeat` for the best wall time of N interleaved rounds.

Usage:

  python -m bench.scale [--count 250] [--repeat 1] [--skip-dask] [--work DIR]
      [--json FILE] [--seed 0] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
import time

import psutil

from devtools.local_dask import LocalDaskCluster
from bench import corpus
from bench.convert import Contender, Measurement, count_records, measure
from bench._cli import write_json

__all__ = ["SETUPS", "Setup", "DEFAULT", "DaskCluster", "run", "main"]

_LOG = logging.getLogger("shardsmith.bench.scale")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MIB = 1 << 20
_FACTORS = (1, 4, 16)
_TARGET_RATIO = 1.6
_TARGET_MEMORY = 1.2
_DASK_START_TIMEOUT_S = 120  # Workers that import TensorFlow, on busy cores.


def _convert(name: str, label: str, *extra: str, cpu: int | None = None) -> Contender:
    # Limited to one core: a launcher sets the affinity, then execs the
    # conversion (same pid, so the process tree measured is the same).
    pin = () if cpu is None else ("-c", _PIN_CODE, str(cpu))
    return Contender(name, label, (
        *pin, "-m", "beam_jobs.convert", "--input_dir", "{input}", "--output_dir", "{output}",
        "--overwrite", *extra,
    ))


_PIN_CODE = ("import os, sys; os.sched_setaffinity(0, [int(sys.argv[1])]); "
             "os.execv(sys.executable, [sys.executable] + sys.argv[2:])")
# One worker: the in-process runner, one bundle at a time, one read-ahead thread.
_ONE = ("--direct_num_workers", "1", "--direct_running_mode", "in_memory", "--worker_threads", "1")
_TWO = ("--direct_num_workers", "2", "--direct_running_mode", "multi_threading", "--worker_threads", "1")


@dataclasses.dataclass(frozen=True)
class Setup:
    """One configuration of the throughput comparison.

    Attributes:
      key: Short id (results, logs, outputs).
      runner: 'local' or 'dask'.
      workers: Workers (local runner threads, or Dask worker processes of 1 thread).
      one_core: Whether it may use only one core (CPU affinity).
    """

    key: str
    runner: str
    workers: int
    one_core: bool = False

    @property
    def label(self) -> str:
        what = {"local": "local", "dask": "Dask"}[self.runner]
        return f"{what} x{self.workers}" + (" on 1 core" if self.one_core else "")


SETUPS = (
    Setup("local-1", "local", 1), Setup("local-1-core", "local", 1, True), Setup("local-2", "local", 2),
    Setup("dask-1", "dask", 1), Setup("dask-1-core", "dask", 1, True), Setup("dask-2", "dask", 2),
)
DEFAULT = _convert("default", "default command")


def _first_cpu() -> int:
    return min(os.sched_getaffinity(0))


def _local_contender(s: Setup) -> Contender:
    return _convert(s.key, s.label, *(_ONE if s.workers == 1 else _TWO),
                    cpu=_first_cpu() if s.one_core else None)


def _dask_contender(s: Setup, address: str) -> Contender:
    return _convert(s.key, s.label, "--runner", "DaskRunner", "--dask_client_address", address,
                    "--worker_threads", "1")


# --- A local Dask cluster ----------------------------------------------------


class DaskCluster(LocalDaskCluster):
    """A scheduler and `workers` worker processes of 1 thread on 127.0.0.1.

    Use as a context manager: on exit (or any error while starting) every
    process group started is killed. With `cpu`, the workers may run on that
    core only. `cpu_seconds` is here, not in `LocalDaskCluster`, as psutil is
    a dependency of the benchmarks only.
    """

    def __init__(self, workers: int, folder: str, cpu: int | None = None):
        super().__init__(workers, folder, cpu=cpu, name_prefix="bench-scale",
                         start_timeout=_DASK_START_TIMEOUT_S)

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of every process of the cluster so far."""
        total = 0.0
        for p in self.procs:
            try:
                procs = [psutil.Process(p.pid)]
                procs += procs[0].children(recursive=True)
            except psutil.Error:
                continue
            for q in procs:
                with contextlib.suppress(psutil.Error):
                    t = q.cpu_times()
                    total += t.user + t.system
        return total


# --- Measurements ------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """One conversion: a `bench.convert.Measurement` and the load around it."""

    m: Measurement
    load_before: float
    load_after: float


def _warm(root: str) -> None:
    """Reads every file once, so that no contender pays for a cold page cache."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                while f.read(1 << 20):
                    pass


def _run_one(c: Contender, corpus_root: str, images: int, work: str, tag: str, *,
             pss: bool = False, cluster: DaskCluster | None = None) -> Run:
    out = os.path.join(work, "out", c.name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    log_path = os.path.join(work, "logs", f"{c.name}-{tag}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    load_before = psutil.getloadavg()[0]
    cluster_cpu = cluster.cpu_seconds() if cluster else 0.0
    wall, cpu, rss, pss_peak, rc = measure(c.argv(corpus_root, out), log_path, pss=pss)
    if cluster:
        cpu += cluster.cpu_seconds() - cluster_cpu
    m = Measurement(c.name, images, wall, cpu, rss, pss_peak, count_records(out), rc, log_path)
    run = Run(m, load_before, psutil.getloadavg()[0])
    _LOG.info("  %-34s %5d images %6.1f s wall %6.1f s CPU %6.0f MiB  load %.1f%s", c.label, images,
              wall, cpu, rss / _MIB, load_before,
              "" if rc == 0 and m.records == images else f"  FAILED (exit {rc}, {m.records} records): "
              f"see {log_path}")
    return run


def _ok(r: Run) -> bool:
    return r.m.returncode == 0 and r.m.records == r.m.images


def _best(runs: list[Run]) -> Run:
    """The fastest run, with the highest peak memory of any run."""
    best = min(runs, key=lambda r: r.m.wall_s)
    m = dataclasses.replace(best.m, peak_rss=max(r.m.peak_rss for r in runs))
    if m.peak_pss is not None:
        m.peak_pss = max(r.m.peak_pss or 0 for r in runs)
    return Run(m, best.load_before, best.load_after)


def _rates(small: Run, big: Run) -> dict:
    """End-to-end rate on the big corpus, and the steady rate from the two sizes."""
    d_images = big.m.images - small.m.images
    d_wall = big.m.wall_s - small.m.wall_s
    return {
        "images": big.m.images,
        "wall_s": big.m.wall_s,
        "cpu_s": big.m.cpu_s,
        "images_per_s": big.m.images / big.m.wall_s,
        "small_images": small.m.images,
        "small_wall_s": small.m.wall_s,
        "startup_s": small.m.wall_s - small.m.images * d_wall / d_images if d_wall > 0 else None,
        "steady_images_per_s": d_images / d_wall if d_wall > 0 else None,
        "load": [small.load_before, big.load_before],
    }


def _scaling(name: str, one: dict, two: dict) -> dict:
    steady = None
    if one["steady_images_per_s"] and two["steady_images_per_s"]:
        steady = two["steady_images_per_s"] / one["steady_images_per_s"]
    return {"runner": name, "end_to_end": two["images_per_s"] / one["images_per_s"], "steady": steady}


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def run(*, count: int = 250, seed: int = 0, repeat: int = 1, skip_dask: bool = False,
        work: str | None = None, corpus_dir: str | None = None, keep: bool = False) -> dict:
    """Runs the benchmark and prints its tables; returns the results as a JSON-able dict.

    Args:
      count: Images of the 1x corpus; 4x and 16x are made too.
      seed: Seed of the corpora.
      repeat: Interleaved rounds; the best wall time of each is kept.
      skip_dask: Skip the Dask runner.
      work: Folder for outputs, logs and Dask clusters (default: a temporary
        folder under build/bench, removed at the end unless `keep` or a run failed).
      corpus_dir: Folder of generated corpora (default build/bench/corpora;
        an identical corpus there is reused).
      keep: Keep the default `work` folder.
    """
    bench_root = os.path.join(_REPO, "build", "bench")
    corpus_dir = corpus_dir or os.path.join(bench_root, "corpora")
    own_work = work is None
    if own_work:
        os.makedirs(bench_root, exist_ok=True)
        work = tempfile.mkdtemp(prefix="scale-", dir=bench_root)
    os.makedirs(work, exist_ok=True)
    if not skip_dask:
        try:
            import distributed  # noqa: F401
        except ImportError as e:
            _LOG.warning("Skipping Dask: %s (pip install 'shardsmith[dask]')", e)
            skip_dask = True

    sizes = [count * f for f in _FACTORS]
    small_n, big_n = sizes[0], sizes[-1]
    failed = False
    try:
        t0 = time.perf_counter()
        roots = {n: corpus.generate("photos", os.path.join(corpus_dir, f"photos-{n}-seed{seed}"),
                                    count=n, seed=seed).root for n in sizes}
        for root in roots.values():
            _warm(root)
        stats = {n: corpus.describe(roots[n]) for n in sizes}
        _LOG.info("Corpora ready in %.1f s; the %s-image one: %s", time.perf_counter() - t0,
                  f"{big_n:,}", corpus.format_stats(stats[big_n]))
        load_start = psutil.getloadavg()
        all_runs: list[Run] = []

        def rounds(contenders, cluster=None):
            got = {c.name: {small_n: [], big_n: []} for c in contenders}
            for r in range(repeat):
                _LOG.info("Round %d of %d:", r + 1, repeat)
                for c in contenders:
                    for n in (small_n, big_n):
                        run_ = _run_one(c, roots[n], n, work, f"{n}-{r}", cluster=cluster)
                        got[c.name][n].append(run_)
                        all_runs.append(run_)
            return {name: _rates(_best(by[small_n]), _best(by[big_n])) for name, by in got.items()}

        # 1. Throughput, local runner ...
        _LOG.info("Throughput (%s and %s images):", f"{small_n:,}", f"{big_n:,}")
        local = [s for s in SETUPS if s.runner == "local"]
        got = rounds([_local_contender(s) for s in local])
        rates = {s.key: got[s.key] for s in local}
        # ... and Dask, one cluster per setup.
        if not skip_dask:
            for s in (s for s in SETUPS if s.runner == "dask"):
                _LOG.info("Starting a Dask cluster for %s ...", s.label)
                folder = os.path.join(work, s.key)
                with DaskCluster(s.workers, folder, _first_cpu() if s.one_core else None) as cluster:
                    c = _dask_contender(s, cluster.address)
                    warm = _run_one(c, roots[small_n], small_n, work, "warm-up", cluster=cluster)
                    all_runs.append(warm)
                    rates[s.key] = rounds([c], cluster)[c.name]
        rows = [(s, rates[s.key]) for s in SETUPS if s.key in rates]
        scaling = []
        for runner in ("local", "dask"):
            if f"{runner}-2" in rates:
                two = rates[f"{runner}-2"]
                scaling.append(dict(_scaling(runner, rates[f"{runner}-1"], two), compare="workers"))
                scaling.append(dict(_scaling(runner, rates[f"{runner}-1-core"], two), compare="cores"))

        # 2. Peak memory of the default command.
        _LOG.info("Peak memory, %s:", DEFAULT.label)
        mem_runs = {n: [] for n in sizes}
        for r in range(repeat):
            for n in sizes:
                run_ = _run_one(DEFAULT, roots[n], n, work, f"mem-{n}-{r}", pss=True)
                mem_runs[n].append(run_)
                all_runs.append(run_)
        memory = {n: _best(runs).m for n, runs in mem_runs.items()}
        load_end = psutil.getloadavg()
        failed = not all(_ok(r) for r in all_runs)
    finally:
        if own_work and not keep and not failed:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        _LOG.error("A conversion failed: its log is kept in %s", os.path.join(work, "logs"))

    cores = os.cpu_count()
    print()
    print(f"Photos corpus (seed {seed}); {cores} cores, load average {load_start[0]:.1f} at the "
          f"start, {load_end[0]:.1f} at the end; best of {repeat}. Shared cores: figures are noisy.")
    head = (f"{'setup':<18} {'images/s':>9} {'wall s':>7} {'CPU s':>6} {'cores':>5}  "
            f"{'steady img/s':>12} {'start-up s':>10}  {'load':>7}")
    print(f"Throughput, every worker with --worker_threads 1: {big_n:,} images end to end; steady = "
          f"({big_n:,} - {small_n:,}) / wall difference; cores = CPU s / wall s")
    print(head)
    print("-" * len(head))
    for s, x in rows:
        print(f"{s.label:<18} {x['images_per_s']:>9.1f} {x['wall_s']:>7.1f} {x['cpu_s']:>6.1f} "
              f"{x['cpu_s'] / x['wall_s']:>5.2f}  {_fmt(x['steady_images_per_s'], '12.1f')} "
              f"{_fmt(x['startup_s'], '10.1f')}  {x['load'][0]:>3.1f}-{x['load'][1]:<3.1f}")
    for x in scaling:
        steady = x["steady"]
        what = "x2 / x1" if x["compare"] == "workers" else "x2 / x1 on 1 core"
        print(f"{x['runner']:<5} {what:<17} {x['end_to_end']:.2f}x end to end, {_fmt(steady, '.2f')}x "
              f"steady (target >= {_TARGET_RATIO}x steady: "
              f"{_verdict(steady is not None and steady >= _TARGET_RATIO)})")
    print()
    mhead = f"{'images':>7} {'x':>4}  {'peak RSS MiB':>12} {'peak PSS MiB':>12} {'wall s':>7}"
    print(f"Peak memory, {DEFAULT.label} (threads on every core), whole process tree")
    print(mhead)
    print("-" * len(mhead))
    for n, f in zip(sizes, _FACTORS):
        m = memory[n]
        print(f"{n:>7,} {f:>3}x  {m.peak_rss / _MIB:>12.0f} {(m.peak_pss or 0) / _MIB:>12.0f} {m.wall_s:>7.1f}")
    rss_ratio = memory[big_n].peak_rss / memory[small_n].peak_rss
    pss_ratio = (memory[big_n].peak_pss / memory[small_n].peak_pss
                 if memory[big_n].peak_pss and memory[small_n].peak_pss else None)
    print(f"{_FACTORS[-1]}x / 1x: RSS {rss_ratio:.2f}x, PSS {_fmt(pss_ratio, '.2f')}x "
          f"(target <= {_TARGET_MEMORY}x: {_verdict(rss_ratio <= _TARGET_MEMORY)})")

    return {
        "count": count, "seed": seed, "repeat": repeat, "sizes": sizes, "cpu_count": cores,
        "load_average": {"start": list(load_start), "end": list(load_end)},
        "corpus": {str(n): s for n, s in stats.items()},
        "throughput": [dict(dataclasses.asdict(s), label=s.label, **x) for s, x in rows],
        "scaling": scaling,
        "targets": {"steady_ratio": _TARGET_RATIO, "memory_ratio": _TARGET_MEMORY},
        "memory": {
            "sizes": {str(n): {"peak_rss": m.peak_rss, "peak_pss": m.peak_pss, "wall_s": m.wall_s}
                      for n, m in memory.items()},
            "rss_ratio": rss_ratio, "pss_ratio": pss_ratio,
        },
        "runs": [dict(dataclasses.asdict(r.m), load_before=r.load_before, load_after=r.load_after)
                 for r in all_runs],
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description="1 vs 2 workers (local and Dask), and peak memory at 1x, 4x and 16x the images.",
    )
    parser.add_argument("--count", type=int, default=250,
                        help="Images of the 1x corpus; 4x and 16x are used too (default 250).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the corpora (default 0).")
    parser.add_argument("--repeat", type=int, default=1, help="Rounds; best wall time is kept.")
    parser.add_argument("--skip-dask", action="store_true", help="Skip the Dask runner.")
    parser.add_argument("--work", help="Folder for outputs, logs and Dask clusters, kept "
                        "(default: a temporary folder under build/bench, removed).")
    parser.add_argument("--corpus_dir", help="Folder of generated corpora (default build/bench/corpora).")
    parser.add_argument("--keep", action="store_true", help="Keep the default work folder.")
    parser.add_argument("--json", help="Write the results to this file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.count < 1 or args.repeat < 1:
        parser.error("--count and --repeat must be at least 1")

    def on_term(signum, frame):
        raise SystemExit(128 + signum)  # Unwinds: Dask clusters are stopped on the way.

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        summary = run(count=args.count, seed=args.seed, repeat=args.repeat, skip_dask=args.skip_dask,
                      work=args.work, corpus_dir=args.corpus_dir, keep=args.keep)
    except BaseException:
        # Interrupted: a conversion this process started may still be running.
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    write_json(args.json, summary)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
