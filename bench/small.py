"""Conversion of many small images, and the validation ceiling on photos.

Scenario 1, many small images: ``count`` (default 100,000) real-photo crops of
32x32 px as JPEG (`bench.corpus tiny`: ~1.5 KB, 10 class folders), each
converter a whole process, one after the other:

- shardsmith's default command (`python -m beam_jobs.convert`), which decodes
  every image with TensorFlow's decoder (JPEGs at 1/8 scale);
- (b) the hand-written 2-process validating converter, a full Pillow decode
  of every image (`bench._baselines multiprocess`);
- (c) the tutorial loop, no validation (`bench._baselines naive`).

It prints images/s, CPU seconds and peak tree memory of each, the ratios to
(b), and shardsmith's peak memory at ``count`` against ``count / 10`` images,
both with the same number of worker processes: the converter starts them only
from 1,000 files (`conversion.shard_maker.worker_processes`), each ~450 MiB with
TensorFlow's decoders, so a ``count / 10`` below that is run with the worker
processes the ``count`` run starts (`--worker_processes`): the ratio is then
what grows with the input, not the process count.

Scenario 2, photos (`bench.corpus photos`, 2,000 by default): shardsmith and
(b), the ratio to (b), and shardsmith's steady rate, the marginal rate between
its fastest run on a quarter of the photos and its fastest on all of them
(start-up cancels out), against the validation ceiling: TensorFlow's decode at
the same scale (1/8 for JPEG, PNG in full) over the same bytes held in memory,
on every core (a tf.data map over in-memory bytes; its fastest pass). Both are
measured in the same interleaved rounds (``--steady-rounds``, default 3), one
right after the other, with CPU per image beside the rates. The same rounds
measure `bench.read`'s decode ceiling (every photo decoded whole and resized to
224, bytes in memory, every core; issue 40's "limit") and print the converter's
share of it (issue 40: >= 70%).

Targets (issue 40): small images >= 1.5x (b), whole process; photos >= 1.6x (b); photo
steady state >= 0.8x the ceiling; peak memory at ``count`` <= 1.1x at
``count / 10``. Shared cores make figures noisy: compare contenders of the
same run, CPU seconds move less than wall time.

Usage:

  python -m bench.small [--count 100000] [--photos 2000] [--repeat 1] [--steady-rounds 3]
                        [--skip-photos | --only steady]
  python -m bench.small --only steady   # the photo steady state and its ceiling alone
  python -m bench.small ceiling --input_dir DIR   # the ceiling alone, one JSON line
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

from bench import corpus
from bench.convert import CONTENDERS, Contender, Measurement, _best, _run_one

__all__ = ["run", "ceiling", "main"]

_LOG = logging.getLogger("shardsmith.bench.small")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MIB = 1 << 20
_BY_NAME = {c.name: c for c in CONTENDERS}
_LABELS = {"shardsmith": "shardsmith (default command)",
           "multiprocess": "(b) 2-process converter, Pillow decode",
           "naive": "(c) tutorial loop, no validation"}
# Issue 40's: converting small JPEGs >= 1.5x and photos >= 1.6x the two-process converter.
_TARGET_SMALL_VS_B = 1.5
_TARGET_PHOTOS_VS_B = 1.6
_TARGET_SHARE = 0.7
_TARGET_MEMORY = 1.1
_TARGET_CEILING = 0.8


def ceiling(input_dir: str, passes: int = 3, full: bool = False) -> dict:
    """TensorFlow's decode of every image of `input_dir`, held in memory, on every core.

    JPEGs at 1/8 scale (shardsmith's default validation), PNGs in full; or,
    with `full`, the decode ceiling of `bench.read` (issue 40's "limit"):
    every image decoded whole and resized to 224x224, as a reader does.

    Returns:
      {"images": n, "images_per_s": best of `passes`, "cpu_ms_per_image": the
      least CPU (every thread of the process) per image of a pass}.
    """
    import tensorflow as tf

    from bench._baselines import list_class_files

    _, files = list_class_files(input_dir)
    datas = []
    for _, _, path in files:
        with open(path, "rb") as f:
            datas.append(f.read())
    is_jpeg = [d[:3] == b"\xff\xd8\xff" for d in datas]

    def decode(data, jpeg):
        if full:
            image = tf.io.decode_image(data, channels=3, expand_animations=False)
            # A value of the pixels, not the shape: the resized shape is static, and TensorFlow's
            # graph optimizer then drops the decode (this ceiling read 29,888 images/s).
            return tf.reduce_mean(tf.image.resize(image, (224, 224)))
        return tf.cond(jpeg, lambda: tf.shape(tf.io.decode_jpeg(data, ratio=8)),
                       lambda: tf.shape(tf.io.decode_png(data)))

    ds = (tf.data.Dataset.from_tensor_slices((datas, is_jpeg))
          .map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
          .batch(256))
    best, best_cpu = 0.0, float("inf")
    for _ in range(passes):
        start, cpu = time.perf_counter(), time.process_time()
        n = sum(int(b.shape[0]) for b in ds)
        best = max(best, n / (time.perf_counter() - start))
        best_cpu = min(best_cpu, (time.process_time() - cpu) / n * 1e3)
    return {"images": len(datas), "images_per_s": best, "cpu_ms_per_image": best_cpu}


def _ceiling_subprocess(input_dir: str, full: bool = False) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.small", "ceiling", "--input_dir", input_dir]
                         + (["--full"] if full else []),
                         capture_output=True, text=True, check=True, cwd=_REPO).stdout
    return json.loads(out.strip().splitlines()[-1])


def _rounds(names, root, count, work, repeat, tag, extra=()) -> dict[str, Measurement]:
    """Each contender's best of `repeat` runs; `extra`: arguments added to each command."""
    runs: dict[str, list[Measurement]] = {n: [] for n in names}
    for r in range(repeat):
        for n in names:
            c = _BY_NAME[n]
            c = Contender(c.name, c.label, (*c.args, *extra))
            runs[n].append(_run_one(c, root, count, work, f"{tag}-{r}", False))
    return {n: _best(ms) for n, ms in runs.items()}


def _default_worker_processes(root: str) -> int:
    """The worker processes the default command starts for the folder `root` on this machine.

    The converter's own rule (`conversion.shard_maker.worker_processes`) on the
    folder's files, Beam's local runner running a thread per core (not yet
    planned: one process per core).
    """
    from conversion.shard_maker import worker_processes

    files = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        files += [types.SimpleNamespace(rel_path=os.path.relpath(os.path.join(folder, n), root),
                                        size=os.path.getsize(os.path.join(folder, n)))
                  for n in sorted(names)]
    cores = os.cpu_count() or 1
    return worker_processes(None, files, None, cores)


def _row(name: str, m: Measurement, ref: Measurement | None) -> str:
    ratio = f"{m.images_per_s / ref.images_per_s:>6.2f}x" if ref else f"{'-':>7}"
    bad = "" if m.returncode == 0 and m.records == m.images else f"  (exit {m.returncode}, {m.records} records)"
    return (f"{_LABELS[name]:<40} {m.images_per_s:>9.0f} {m.wall_s:>7.1f} {m.cpu_s:>6.1f} "
            f"{m.cpu_s / m.images * 1e3:>9.3f} {m.peak_rss / _MIB:>9.0f} {ratio}{bad}")


def _table(results: dict[str, Measurement]) -> list[str]:
    head = (f"{'converter':<40} {'images/s':>9} {'wall s':>7} {'CPU s':>6} {'CPU ms/img':>9} "
            f"{'peak MiB':>9} {'vs (b)':>7}")
    ref = results.get("multiprocess")
    return [head, "-" * len(head)] + [_row(n, m, ref) for n, m in results.items()]


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _photos(photos, seed, corpus_dir, work, repeat, steady_rounds, with_b=True) -> dict:
    """Scenario 2: shardsmith and (b) on photos, and shardsmith's steady state against the ceiling.

    The steady state and the ceiling are measured in the same rounds, one
    right after the other (the order turned round every other round, so a
    load that rises or falls during the run weighs on both alike): each round
    runs the ceiling, shardsmith on a quarter of the photos and on all of
    them, and (b) in the first `repeat` rounds. Each quantity is the best of
    its rounds: the steady rate from the fastest run on all photos and the
    fastest on a quarter (start-up cancels out), the ceiling from its fastest
    round. CPU per image (every thread) is printed beside them: it moves
    little with other load on the cores, wall time does. Without `with_b`
    (``--only steady``), (b) is not run and not compared.
    """
    quarter = max(1, photos // 4)
    main_c = corpus.generate("photos", os.path.join(corpus_dir, f"photos-{photos}-seed{seed}"),
                             count=photos, seed=seed)
    quarter_c = corpus.generate("photos", os.path.join(corpus_dir, f"photos-{quarter}-seed{seed}"),
                                count=quarter, seed=seed)
    runs: dict[str, list[Measurement]] = {"shardsmith": [], "multiprocess": [], "quarter": []}
    ceilings: list[dict] = []
    read_ceilings: list[dict] = []  # bench.read's decode ceiling: full decode, resize to 224
    for r in range(max(repeat, steady_rounds)):
        steps = [("ceiling", None), ("quarter", quarter_c), ("shardsmith", main_c),
                 ("read ceiling", None)]
        if with_b and r < repeat:
            steps.append(("multiprocess", main_c))
        for step, c in (steps if r % 2 == 0 else steps[::-1]):
            if step == "ceiling":
                ceilings.append(_ceiling_subprocess(main_c.root))
                _LOG.info("  validation ceiling                  %6.0f images/s %6.3f CPU ms/img",
                          ceilings[-1]["images_per_s"], ceilings[-1]["cpu_ms_per_image"])
                continue
            if step == "read ceiling":
                read_ceilings.append(_ceiling_subprocess(main_c.root, full=True))
                _LOG.info("  decode ceiling (full, 224)          %6.0f images/s %6.3f CPU ms/img",
                          read_ceilings[-1]["images_per_s"], read_ceilings[-1]["cpu_ms_per_image"])
                continue
            name = "shardsmith" if step == "quarter" else step
            count = quarter if step == "quarter" else photos
            runs[step].append(_run_one(_BY_NAME[name], c.root, count, work, f"photos-{step}-{r}", False))
    full = {n: _best(runs[n]) for n in ("shardsmith", "multiprocess") if runs[n]}
    part = _best(runs["quarter"])
    failed = any(m.returncode != 0 for ms in runs.values() for m in ms)
    steady = (photos - quarter) / max(1e-9, full["shardsmith"].wall_s - part.wall_s)
    steady_cpu_ms = (full["shardsmith"].cpu_s - part.cpu_s) / (photos - quarter) * 1e3
    ceil = {"images": ceilings[0]["images"],
            "images_per_s": max(c["images_per_s"] for c in ceilings),
            "cpu_ms_per_image": min(c["cpu_ms_per_image"] for c in ceilings)}
    p_vs_b = full["shardsmith"].images_per_s / full["multiprocess"].images_per_s if with_b else None
    vs_ceiling = steady / ceil["images_per_s"]
    rounds = len(ceilings)
    lines = ["", f"Converting {photos:,} photos ({rounds} rounds, (b) in {repeat if with_b else 0}; "
                 f"load average {os.getloadavg()[0]:.1f}):", *_table(full)]
    if with_b:
        lines.append(f"Target photos vs (b): {p_vs_b:.2f}x (>= {_TARGET_PHOTOS_VS_B}x: "
                     f"{_verdict(p_vs_b >= _TARGET_PHOTOS_VS_B)})")
    lines += [f"Steady state of shardsmith ({quarter:,} -> {photos:,} photos, best of {rounds}): "
              f"{steady:.0f} images/s, {steady_cpu_ms:.2f} CPU ms/img; validation ceiling (TF decode "
              f"of the same bytes in memory, same scale, every core, best of {rounds}): "
              f"{ceil['images_per_s']:.0f} images/s, {ceil['cpu_ms_per_image']:.2f} CPU ms/img",
              f"Target steady state vs ceiling: {vs_ceiling:.2f}x (>= {_TARGET_CEILING}x: "
              f"{_verdict(vs_ceiling >= _TARGET_CEILING)}); CPU per image, ceiling / shardsmith: "
              f"{ceil['cpu_ms_per_image'] / max(1e-9, steady_cpu_ms):.2f}x"]
    # Issue 40: the converter against the decode ceiling of reading (every photo decoded whole
    # and resized to 224, bytes in memory, every core), whole process (start-up included).
    read_ceiling = max(c["images_per_s"] for c in read_ceilings)
    share = full["shardsmith"].images_per_s / read_ceiling
    lines.append(f"Converter's share of the decode ceiling (full decode + resize to 224, "
                 f"{read_ceiling:.0f} images/s, best of {rounds}): whole process {share:.0%}, "
                 f"steady state {steady / read_ceiling:.0%} (issue 40, whole process: >= {_TARGET_SHARE:.0%}: "
                 f"{_verdict(share >= _TARGET_SHARE)})")
    return {"photos": {n: m.__dict__ for n, m in full.items()}, "photos_vs_b": p_vs_b,
            "steady_images_per_s": steady, "steady_cpu_ms_per_image": steady_cpu_ms,
            "ceiling": ceil, "ceilings": ceilings, "steady_vs_ceiling": vs_ceiling,
            "read_ceilings": read_ceilings, "share_of_read_ceiling": share,
            "failed": failed, "lines": lines}


def run(*, count: int = 100_000, photos: int = 2000, seed: int = 0, repeat: int = 1,
        steady_rounds: int = 3, skip_photos: bool = False, work: str | None = None,
        corpus_dir: str | None = None, only_steady: bool = False) -> dict:
    """Runs both scenarios and prints their tables; returns the figures.

    `only_steady`: only shardsmith's photo steady state and its ceiling (no
    small images, no (b)).
    """
    bench_root = os.path.join(_REPO, "build", "bench")
    corpus_dir = corpus_dir or os.path.join(bench_root, "corpora")
    own_work = work is None
    if own_work:
        os.makedirs(bench_root, exist_ok=True)
        work = tempfile.mkdtemp(prefix="small-", dir=bench_root)
    summary: dict = {"count": count, "cpu_count": os.cpu_count()}
    lines: list[str] = []
    failed = False
    try:
        if only_steady:
            photo = _photos(photos, seed, corpus_dir, work, repeat, steady_rounds, with_b=False)
            failed = photo.pop("failed")
            lines += photo.pop("lines")
            summary.update(photo)
        else:
            tenth = max(1, count // 10)
            tiny = corpus.generate("tiny", os.path.join(corpus_dir, f"tiny-{count}-seed{seed}"),
                                   count=count, seed=seed)
            tiny_tenth = corpus.generate("tiny", os.path.join(corpus_dir, f"tiny-{tenth}-seed{seed}"),
                                         count=tenth, seed=seed)
            stats = corpus.describe(tiny.root)
            _LOG.info("Small images: %s", corpus.format_stats(stats))
            small = _rounds(("shardsmith", "multiprocess", "naive"), tiny.root, count, work, repeat, "tiny")
            # The same worker processes at both sizes (see the module's docstring).
            processes = _default_worker_processes(tiny.root)
            same = _default_worker_processes(tiny_tenth.root) == processes
            memory = _rounds(("shardsmith",), tiny_tenth.root, tenth, work, repeat, "tiny-tenth",
                             () if same else ("--worker_processes", str(processes)))["shardsmith"]
            failed = any(m.returncode != 0 for m in [*small.values(), memory])
            vs_b = small["shardsmith"].images_per_s / small["multiprocess"].images_per_s
            mem_ratio = small["shardsmith"].peak_rss / memory.peak_rss
            lines += [f"Converting {count:,} small images ({corpus.format_stats(stats)}), whole processes, "
                      f"best of {repeat}, {os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f}):",
                      *_table(small),
                      f"Target small images vs (b): {vs_b:.2f}x (>= {_TARGET_SMALL_VS_B}x: "
                      f"{_verdict(vs_b >= _TARGET_SMALL_VS_B)})",
                      f"Peak memory of shardsmith: {tenth:,} images {memory.peak_rss / _MIB:.0f} MiB, "
                      f"{count:,} images {small['shardsmith'].peak_rss / _MIB:.0f} MiB: {mem_ratio:.2f}x "
                      f"(<= {_TARGET_MEMORY}x: {_verdict(mem_ratio <= _TARGET_MEMORY)}), "
                      f"{processes} worker processes in both"
                      + ("" if same else f" ({tenth:,} images: --worker_processes {processes}, its "
                                         "default starts none)")]
            summary.update(small={n: m.__dict__ for n, m in small.items()}, small_vs_b=vs_b,
                           memory_tenth=memory.__dict__, memory_ratio=mem_ratio,
                           memory_worker_processes=processes, memory_same_default=same)
            if not skip_photos:
                photo = _photos(photos, seed, corpus_dir, work, repeat, steady_rounds)
                failed = failed or photo.pop("failed")
                lines += photo.pop("lines")
                summary.update(photo)
    finally:
        if own_work and not failed:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        _LOG.error("A converter failed: its log is kept in %s", os.path.join(work, "logs"))
    print()
    print("\n".join(lines))
    summary["failed"] = failed
    return summary


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ceiling"]:
        parser = argparse.ArgumentParser(prog="python -m bench.small ceiling")
        parser.add_argument("--input_dir", required=True)
        parser.add_argument("--full", action="store_true",
                            help="Decode whole and resize to 224 (bench.read's ceiling).")
        args = parser.parse_args(argv[1:])
        print(json.dumps(ceiling(args.input_dir, full=args.full)))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.small", description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="Small images (default 100000).")
    parser.add_argument("--photos", type=int, default=2000, help="Photos (default 2000).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="Rounds; best wall time is kept.")
    parser.add_argument("--steady-rounds", type=int, default=3,
                        help="Rounds of the photo steady state and its ceiling (default 3).")
    parser.add_argument("--skip-photos", action="store_true", help="Only the small-image scenario.")
    parser.add_argument("--only", choices=("steady",),
                        help="steady: only the photo steady state and its ceiling (no small images, no (b)).")
    parser.add_argument("--work", help="Folder for outputs and logs (default: temporary, removed).")
    parser.add_argument("--corpus_dir", help="Folder of generated corpora (default build/bench/corpora).")
    parser.add_argument("--json", help="Write the figures to this file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.only and args.skip_photos:
        parser.error("--only steady runs photos only: it cannot be used with --skip-photos")
    if args.count < 10 or args.photos < 4 or args.repeat < 1 or args.steady_rounds < 1:
        parser.error("--count must be at least 10, --photos at least 4, --repeat and "
                     "--steady-rounds at least 1")
    summary = run(count=args.count, photos=args.photos, seed=args.seed, repeat=args.repeat,
                  steady_rounds=args.steady_rounds,
                  skip_photos=args.skip_photos, work=args.work, corpus_dir=args.corpus_dir,
                  only_steady=args.only == "steady")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, sort_keys=True, default=str)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
