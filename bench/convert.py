"""Conversion benchmark: shardsmith against a naive loop and a multiprocessing converter.

Converts the same generated corpus of realistic photos (`bench.corpus photos`:
ImageNet-like sizes around 500x375, 100-150 KB JPEGs, about 10% PNG) with:

- (a) the naive single-process loop of the tutorials, which validates nothing
  (`bench._baselines naive`);
- (b) a hand-written multiprocessing converter, one process per core, that
  fully decodes every image with Pillow (`bench._baselines multiprocess`);
- shardsmith (`python -m beam_jobs.convert`), which validates every image with
  TensorFlow's own decoders, in three DirectRunner modes: multi_processing and
  multi_threading with 2 workers, and in_memory with 1.

Every contender runs as its own subprocess, timed from start to exit (Python,
TensorFlow and Beam start-up included), while the RSS of its whole process tree
(the process and all its children, summed) is sampled every 50 ms. The CPU
seconds of the tree are reported too: on shared cores they move less than wall
time. Summed RSS
counts the pages that processes share (TensorFlow's libraries) once per
process; `--pss` also samples proportional set size, which does not, at a
sampling cost of about 10 ms per process.

Then shardsmith's peak memory on the corpus is compared with its peak on a
quarter of it: memory must stay bounded whatever the dataset's size.

Targets (2-core machine), for shardsmith's default command (threads on every
core): at least 1.2x the images/s of (b), at least 0.5x those of (a), and peak
memory at 4x the images within 1.2x of the peak at 1x.

The machine's cores may be shared: figures are noisy. Compare contenders of the
same run, and use `--repeat` (best wall time of N interleaved rounds).

Usage:

  python -m bench.convert [--count 2000] [--seed 0] [--repeat 1] [--skip-memory]
      [--work DIR] [--corpus_dir DIR] [--json FILE] [--pss] [--keep]
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

from bench import corpus
from schemas import tfrecord
from bench._cli import parse_only, write_json

__all__ = ["Contender", "Measurement", "CONTENDERS", "measure", "count_records", "run", "main"]

_LOG = logging.getLogger("shardsmith.bench.convert")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MIB = 1 << 20
# The default command, as a user runs it: every core, threads.
_HEADLINE = "shardsmith"
_TARGET_VS_B = 1.2
_TARGET_VS_A = 0.5
_TARGET_MEMORY = 1.2


@dataclasses.dataclass(frozen=True)
class Contender:
    """One converter to time.

    Attributes:
      name: Short id, used for output folders and in the JSON results.
      label: Row title of the table.
      args: Arguments after `python`, with {input} and {output} placeholders.
    """

    name: str
    label: str
    args: tuple[str, ...]

    def argv(self, input_dir: str, output_dir: str) -> list[str]:
        return [sys.executable] + [a.format(input=input_dir, output=output_dir) for a in self.args]


def _shardsmith(name: str, label: str, mode: str | None, workers: int | None) -> Contender:
    runner = () if mode is None else ("--direct_num_workers", str(workers), "--direct_running_mode", mode)
    return Contender(name, label, (
        "-m", "beam_jobs.convert", "--input_dir", "{input}", "--output_dir", "{output}",
        "--overwrite", *runner,
    ))


CONTENDERS = (
    Contender("naive", "(a) naive loop, 1 process",
              ("-m", "bench._baselines", "naive", "--input_dir", "{input}", "--output_dir", "{output}")),
    Contender("multiprocess", "(b) Pool(cpu_count), Pillow decode",
              ("-m", "bench._baselines", "multiprocess", "--input_dir", "{input}",
               "--output_dir", "{output}")),
    _shardsmith(_HEADLINE, "shardsmith (default command)", None, None),
    _shardsmith("shardsmith-mp2", "shardsmith multi_processing x2", "multi_processing", 2),
    _shardsmith("shardsmith-mt2", "shardsmith multi_threading x2", "multi_threading", 2),
    _shardsmith("shardsmith-mem1", "shardsmith in_memory x1", "in_memory", 1),
)


@dataclasses.dataclass
class Measurement:
    """One run of one contender.

    Attributes:
      name: The contender's name.
      images: Images in the input corpus.
      wall_s: Wall-clock seconds from start to exit.
      cpu_s: CPU seconds (user + system) of the whole process tree: less
        sensitive than wall time to other load on shared cores.
      peak_rss: Peak summed RSS of the process tree, bytes.
      peak_pss: Peak summed PSS, bytes (None unless sampled).
      records: Records found in the output shards.
      returncode: The process's exit status.
      log: Path of its captured stdout and stderr.
    """

    name: str
    images: int
    wall_s: float
    cpu_s: float
    peak_rss: int
    peak_pss: int | None
    records: int
    returncode: int
    log: str

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s


def _tree_memory(proc: psutil.Process, pss: bool) -> tuple[int, int]:
    """(summed RSS, summed PSS or 0) of `proc` and all its descendants."""
    rss = pss_total = 0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return 0, 0
    for p in procs:
        try:
            if pss:
                info = p.memory_full_info()
                pss_total += info.pss
            else:
                info = p.memory_info()
            rss += info.rss
        except psutil.Error:  # Exited between listing and reading.
            continue
    return rss, pss_total


def measure(argv: list[str], log_path: str, *, interval: float = 0.05,
            pss: bool = False) -> tuple[float, float, int, int | None, int]:
    """Runs `argv`, sampling its process tree's memory until it exits.

    Args:
      argv: The command.
      log_path: File that receives its stdout and stderr.
      interval: Seconds between memory samples.
      pss: Also sample PSS (costly: reads /proc/PID/smaps of every process).

    Returns:
      (wall seconds, CPU seconds, peak summed RSS, peak summed PSS or None,
      exit status). CPU seconds come from getrusage(RUSAGE_CHILDREN), which
      counts every descendant that was waited for.
    """
    peak_rss = peak_pss = 0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log_path, "wb") as log:
        start = time.perf_counter()
        proc = psutil.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=_REPO)
        while True:
            rss, pss_now = _tree_memory(proc, pss)
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss_now)
            try:
                returncode = proc.wait(timeout=interval)  # Returns as soon as it exits.
                break
            except psutil.TimeoutExpired:
                continue
        wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, peak_rss, (peak_pss if pss else None), returncode


def count_records(output_dir: str) -> int:
    """Counts the records of every `*.tfrecord` file in `output_dir` (no TF needed; CRCs checked)."""
    total = 0
    for path in sorted(glob.glob(os.path.join(output_dir, "*.tfrecord"))):
        with open(path, "rb") as f:
            total += sum(1 for _ in tfrecord.iter_records(f, path))
    return total


def _run_one(c: Contender, corpus_dir: str, images: int, work: str, tag: str,
             pss: bool) -> Measurement:
    out = os.path.join(work, "out", c.name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    log_path = os.path.join(work, "logs", f"{c.name}-{tag}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    wall, cpu, rss, pss_peak, rc = measure(c.argv(corpus_dir, out), log_path, pss=pss)
    m = Measurement(c.name, images, wall, cpu, rss, pss_peak, count_records(out), rc, log_path)
    _LOG.info("  %-34s %6.1f s wall %6.1f s CPU %6.0f MiB  %d records%s", c.label, wall, cpu,
              rss / _MIB, m.records,
              "" if rc == 0 else f"  EXIT {rc}: see {log_path}")
    return m


def _best(runs: list[Measurement]) -> Measurement:
    """The fastest run, with the least CPU and the highest peak memory of any run."""
    best = dataclasses.replace(min(runs, key=lambda m: m.wall_s))
    best.cpu_s = min(m.cpu_s for m in runs)
    best.peak_rss = max(m.peak_rss for m in runs)
    if best.peak_pss is not None:
        best.peak_pss = max(m.peak_pss or 0 for m in runs)
    return best


def _table(results: dict[str, Measurement], pss: bool) -> str:
    a = results.get("naive")
    b = results.get("multiprocess")
    head = f"{'contender':<36} {'images/s':>9} {'wall s':>7} {'CPU s':>6} {'peak MiB':>9}"
    if pss:
        head += f" {'PSS MiB':>8}"
    head += f" {'vs (a)':>7} {'vs (b)':>7}"
    lines = [head, "-" * len(head)]
    for c in CONTENDERS:
        m = results.get(c.name)
        if m is None:
            continue
        row = (f"{c.label:<36} {m.images_per_s:>9.1f} {m.wall_s:>7.1f} {m.cpu_s:>6.1f} "
               f"{m.peak_rss / _MIB:>9.0f}")
        if pss:
            row += f" {(m.peak_pss or 0) / _MIB:>8.0f}"
        for ref in (a, b):
            row += f" {m.images_per_s / ref.images_per_s:>6.2f}x" if ref else f" {'-':>7}"
        if m.returncode != 0 or m.records != m.images:
            row += f"  (exit {m.returncode}, {m.records} records)"
        lines.append(row)
    return "\n".join(lines)


def run(*, count: int = 2000, seed: int = 0, repeat: int = 1, skip_memory: bool = False,
        work: str | None = None, corpus_dir: str | None = None, pss: bool = False,
        keep: bool = False, names: tuple[str, ...] | None = None) -> dict:
    """Runs the benchmark and prints its table.

    Args:
      count: Images in the corpus.
      seed: Seed of the corpus.
      repeat: Interleaved rounds; each contender's best wall time is kept.
      skip_memory: Skip shardsmith's run on a quarter of the corpus.
      work: Folder for outputs and logs (default: a temporary folder under
        build/bench, removed at the end unless `keep`).
      corpus_dir: Folder of the generated corpora (default build/bench/corpora;
        an identical corpus there is reused).
      pss: Also sample PSS.
      keep: Keep the outputs of a default `work` folder.
      names: Contenders to run (default: all).

    Returns:
      The results as a JSON-able dict.
    """
    bench_root = os.path.join(_REPO, "build", "bench")
    corpus_dir = corpus_dir or os.path.join(bench_root, "corpora")
    own_work = work is None
    if own_work:
        os.makedirs(bench_root, exist_ok=True)
        work = tempfile.mkdtemp(prefix="convert-", dir=bench_root)
    os.makedirs(work, exist_ok=True)
    contenders = [c for c in CONTENDERS if names is None or c.name in names]
    quarter = max(1, count // 4)
    failed = False
    try:
        t0 = time.perf_counter()
        main_corpus = corpus.generate("photos", os.path.join(corpus_dir, f"photos-{count}-seed{seed}"),
                                      count=count, seed=seed)
        small_corpus = None
        if not skip_memory:
            small_corpus = corpus.generate(
                "photos", os.path.join(corpus_dir, f"photos-{quarter}-seed{seed}"),
                count=quarter, seed=seed)
        stats = corpus.describe(main_corpus.root)
        _LOG.info("Corpus %s (ready in %.1f s): %s", main_corpus.root, time.perf_counter() - t0,
                  corpus.format_stats(stats))
        load_before = psutil.getloadavg()
        runs: dict[str, list[Measurement]] = {c.name: [] for c in contenders}
        for r in range(repeat):
            _LOG.info("Round %d of %d (%d images):", r + 1, repeat, count)
            for c in contenders:
                runs[c.name].append(_run_one(c, main_corpus.root, count, work, f"{count}-{r}", pss))
        results = {name: _best(ms) for name, ms in runs.items()}
        failed = any(m.returncode != 0 for ms in runs.values() for m in ms)
        memory = None
        headline = next((c for c in contenders if c.name == _HEADLINE), None)
        if small_corpus is not None and headline is not None:
            _LOG.info("Memory check: %s on %d images:", headline.label, quarter)
            small_runs = [
                _run_one(headline, small_corpus.root, quarter, work, f"{quarter}-{r}", pss)
                for r in range(repeat)
            ]
            small = _best(small_runs)
            failed = failed or any(m.returncode != 0 for m in small_runs)
            memory = {"images_1x": quarter, "images_4x": count,
                      "peak_1x": small.peak_rss, "peak_4x": results[_HEADLINE].peak_rss}
        load_after = psutil.getloadavg()
    finally:
        if own_work and not keep and not failed:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        _LOG.error("A contender failed: its log is kept in %s", os.path.join(work, "logs"))

    print()
    print(f"Converting {count:,} photos ({corpus.format_stats(stats)}); "
          f"best of {repeat}; {os.cpu_count()} cores, load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after. Shared cores: figures are noisy.")
    print(_table(results, pss))
    summary = {"count": count, "seed": seed, "repeat": repeat, "corpus": stats,
               "cpu_count": os.cpu_count(), "load_average": [load_before[0], load_after[0]],
               "results": {n: dict(dataclasses.asdict(m), images_per_s=m.images_per_s)
                           for n, m in results.items()}}
    labels = {c.name: c.label for c in contenders}
    modes = [results[c.name] for c in contenders if c.name.startswith("shardsmith")]
    fastest = max(modes, key=lambda m: m.images_per_s) if modes else None
    if fastest is not None:
        print(f"Fastest shardsmith mode: {labels[fastest.name]} ({fastest.images_per_s:.1f} images/s, "
              f"{fastest.cpu_s:.1f} CPU s)")
        summary["fastest_shardsmith"] = fastest.name
    if "naive" in results and "multiprocess" in results:
        summary["ratios"] = {}
        for m in modes:
            vs_a = m.images_per_s / results["naive"].images_per_s
            vs_b = m.images_per_s / results["multiprocess"].images_per_s
            summary["ratios"][m.name] = {"vs_a": vs_a, "vs_b": vs_b}
            if m.name == _HEADLINE or m is fastest:
                print(f"Targets for {labels[m.name]}: vs (b) {vs_b:.2f}x (target >= {_TARGET_VS_B}x: "
                      f"{_verdict(vs_b >= _TARGET_VS_B)}), vs (a) {vs_a:.2f}x (target >= "
                      f"{_TARGET_VS_A}x: {_verdict(vs_a >= _TARGET_VS_A)})")
    if memory:
        ratio = memory["peak_4x"] / memory["peak_1x"]
        print(f"Memory of {headline.label}: {memory['images_1x']:,} images {memory['peak_1x'] / _MIB:.0f} MiB, "
              f"{memory['images_4x']:,} images {memory['peak_4x'] / _MIB:.0f} MiB: {ratio:.2f}x "
              f"(target <= {_TARGET_MEMORY}x: {_verdict(ratio <= _TARGET_MEMORY)})")
        summary["memory"] = dict(memory, ratio=ratio)
    return summary


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.convert",
        description="Time shardsmith against a naive loop and a multiprocessing converter.",
    )
    parser.add_argument("--count", type=int, default=2000, help="Images in the corpus (default 2000).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the corpus (default 0).")
    parser.add_argument("--repeat", type=int, default=1, help="Rounds; best wall time is kept.")
    parser.add_argument("--skip-memory", action="store_true",
                        help="Skip the memory check on a quarter of the corpus.")
    parser.add_argument("--work", help="Folder for outputs and logs, kept "
                        "(default: a temporary folder under build/bench, removed).")
    parser.add_argument("--corpus_dir", help="Folder of generated corpora (default build/bench/corpora).")
    parser.add_argument("--only", help="Comma-separated contenders: " + ",".join(c.name for c in CONTENDERS))
    parser.add_argument("--pss", action="store_true", help="Also sample PSS (slower sampling).")
    parser.add_argument("--keep", action="store_true", help="Keep the default work folder.")
    parser.add_argument("--json", help="Write the results to this file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.count < 4 or args.repeat < 1:
        parser.error("--count must be at least 4 and --repeat at least 1")
    names = parse_only(parser, args.only, CONTENDERS)
    summary = run(count=args.count, seed=args.seed, repeat=args.repeat, skip_memory=args.skip_memory,
                  work=args.work, corpus_dir=args.corpus_dir, pss=args.pss, keep=args.keep,
                  names=names)
    write_json(args.json, summary)
    failed = [m for m in summary["results"].values() if m["returncode"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
