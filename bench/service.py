"""The tf.data service: images/s with 1 and 2 workers, and against the in-process reader.

On the photos corpus of `bench.corpus` (ImageNet-like ~500x375 JPEGs),
converted once (`bench.read.prepare`), every contender reads the training
split at 224x224, batch 32, default options (shuffled, stretch resize),
`repeat=True`, and is timed over a window of batches after a warm-up:

- service x1, service x2: `readers.service.start` (a dispatcher in this
  process and 1 or 2 local worker processes, static sharding), each worker
  process pinned to a core of its own (every thread of it: worker i on
  core i, `_pin_process`); this process reads with `service=`;
- service x2, snappy: the same with `service_compression="snappy"`
  (TensorFlow's own default), against the reader's default (none);
- reader x1, reader x2: `readers.image_dataset_from_tfrecords` in a process
  of its own pinned to the same cores (core 0; cores 0 and 1).

Targets: service x2 / service x1 >= 1.8 (the workers scale), and service x2 /
reader x2 >= 0.9 (what gRPC and the trainer's share of the service cost, on
the same cores). The trainer (this process) is not pinned: on a machine with
as many cores as workers it takes CPU from them, which both ratios then
include; the output says how many cores the machine has.

Usage:

  python -m bench.service [--count 400] [--seconds 6] [--rounds 3] [--dtype uint8]
                          [--work DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LOG = logging.getLogger("shardsmith.bench.service")
_BATCH = 32
_SIZE = (224, 224)
_WARMUP_BATCHES = 8


def _rate(ds, seconds: float) -> dict:
    """Images/s over a window of at least `seconds` after `_WARMUP_BATCHES` batches."""
    it = iter(ds)
    for _ in range(_WARMUP_BATCHES):
        next(it)
    images, start, cpu0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        images += int(next(it)[0].shape[0])
    wall = time.perf_counter() - start
    return {"images": images, "seconds": wall, "images_per_s": images / wall,
            "trainer_cpu_s": time.process_time() - cpu0}


def _read_here(data_dir: str, seconds: float, dtype: str, **options) -> dict:
    import readers

    ds = readers.image_dataset_from_tfrecords(data_dir, batch_size=_BATCH, image_size=_SIZE,
                                              repeat=True, dtype=dtype, **options)
    return _rate(ds, seconds)


def _reader_in_process(data_dir: str, cores: list[int], seconds: float, dtype: str) -> dict:
    """The in-process reader in a fresh process pinned to `cores`."""
    code = (
        "import json, os, sys; os.sched_setaffinity(0, {%s}); "
        "from bench.service import _read_here; "
        "print(json.dumps(_read_here(sys.argv[1], float(sys.argv[2]), sys.argv[3])), flush=True); "
        "os._exit(0)"  # Without the teardown after TensorFlow (~2 s of CPU).
        % ",".join(map(str, cores))
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_REPO, os.environ.get("PYTHONPATH")])),
               TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", code, data_dir, str(seconds), dtype], env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _pin_process(pid: int, cores: set[int]) -> int:
    """Pins every thread of process `pid` to `cores`; the number of threads pinned.

    `os.sched_setaffinity(pid, ...)` sets the affinity of one thread, the one
    whose id is `pid`: the thread pools a worker server started before it
    (TensorFlow's) would keep running on every core. Threads started later
    inherit the affinity of the pinned thread that starts them.
    """
    pinned = 0
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        try:
            os.sched_setaffinity(int(tid), cores)
            pinned += 1
        except ProcessLookupError:  # A thread that ended since the listing.
            pass
    return pinned


def _served(data_dir: str, workers: int, seconds: float, dtype: str,
            compression: str | None = None) -> dict:
    """Images/s read through `workers` local workers, worker i pinned to core i."""
    from readers import service

    running = service.start(service.ServiceOptions(workers=workers))
    try:
        for core, pid in enumerate(running.worker_pids):
            _pin_process(pid, {core})
        result = _read_here(data_dir, seconds, dtype, service=running.address,
                            service_compression=compression)
        # Every thread of every worker still on its own core after the read (threads the
        # job started included), or the figures would not be of one core a worker.
        result["worker_cores"] = [sorted({c for tid in os.listdir(f"/proc/{pid}/task")
                                          for c in os.sched_getaffinity(int(tid))})
                                  for pid in running.worker_pids]
        return result
    finally:
        running.stop()


_CONTENDERS = ("reader_x1", "reader_x2", "service_x1", "service_x2", "service_x2_snappy")
# Each ratio from the two rates of one round (measured minutes apart at most), then the median
# over the rounds: the load of a shared machine moves slower than a round.
_RATIOS = {"scaling": ("service_x2", "service_x1"),
           "service_vs_reader_x2": ("service_x2", "reader_x2"),
           "service_vs_reader_x1": ("service_x1", "reader_x1"),
           "snappy_vs_none_x2": ("service_x2_snappy", "service_x2")}


def _measure(key: str, data_dir: str, cores: list[int], seconds: float, dtype: str) -> dict:
    if key.startswith("reader"):
        return _reader_in_process(data_dir, cores[:int(key[-1])], seconds, dtype)
    workers = int(key.split("_x")[1][0])
    return _served(data_dir, workers, seconds, dtype,
                   compression="snappy" if key.endswith("snappy") else None)


def run(*, count: int = 400, seconds: float = 6.0, work: str | None = None,
        dtype: str = "float32", rounds: int = 3) -> dict:
    from bench import read

    work = work or os.path.join(_REPO, "build", "bench")
    _, data_dir = read.prepare("photos", count, 0, work)
    read._warm_page_cache(data_dir)
    cores = sorted(os.sched_getaffinity(0))
    result = {"cores": len(cores), "load_before": os.getloadavg()[0], "count": count,
              "batch": _BATCH, "image_size": list(_SIZE), "dtype": dtype, "rounds": rounds}
    if len(cores) < 2:
        raise SystemExit("bench.service needs at least 2 cores.")
    runs = {key: [] for key in _CONTENDERS}
    for i in range(rounds):
        # Each round in another order, so that no contender always runs first or last.
        order = _CONTENDERS[i % len(_CONTENDERS):] + _CONTENDERS[:i % len(_CONTENDERS)]
        for key in order:
            runs[key].append(_measure(key, data_dir, cores, seconds, dtype))
        _LOG.info("round %d of %d: %s", i + 1, rounds, ", ".join(
            f"{k} {runs[k][-1]['images_per_s']:.0f}/s" for k in _CONTENDERS))
    result["load_after"] = os.getloadavg()[0]
    for key, measured in runs.items():
        # The round of median rate, with every round's rate beside it.
        by_rate = sorted(measured, key=lambda m: m["images_per_s"])
        result[key] = dict(by_rate[len(by_rate) // 2],
                           rates=[m["images_per_s"] for m in measured])
    for name, (top, bottom) in _RATIOS.items():
        per_round = sorted(t["images_per_s"] / b["images_per_s"]
                           for t, b in zip(runs[top], runs[bottom]))
        result[name] = statistics.median(per_round)
        result[name + "_range"] = [per_round[0], per_round[-1]]
    return result


def _report(r: dict) -> str:
    lines = [
        f"tf.data service, {r['count']} photos at {r['image_size'][0]}x{r['image_size'][1]}, "
        f"batch {r['batch']}, {r['dtype']}; this machine has {r['cores']} cores",
    ]
    if r["cores"] <= 2:
        lines.append(
            f"  (only {r['cores']} cores: the trainer shares them with the workers, so the "
            "ratios below understate what workers on cores of their own give)")
    lines.append(f"  load average {r['load_before']:.1f} before, {r['load_after']:.1f} after; "
                 f"medians of {r['rounds']} rounds, each ratio within one round [range]")
    for key, label in (("reader_x1", "reader, 1 core"), ("reader_x2", "reader, 2 cores"),
                       ("service_x1", "service, 1 worker"), ("service_x2", "service, 2 workers"),
                       ("service_x2_snappy", "  same, snappy")):
        line = f"  {label:<20} {r[key]['images_per_s']:8.1f} images/s"
        if key.startswith("service"):  # What the trainer pays for the batches it receives.
            cpu_ms = 1000 * r[key]["trainer_cpu_s"] / r[key]["images"]
            line += f"   trainer {cpu_ms:.2f} ms CPU/image"
        lines.append(line)
    def ratio(name: str) -> str:
        low, high = r[name + "_range"]
        return f"{r[name]:.2f}x [{low:.2f}-{high:.2f}]"

    lines.append(f"  2 workers / 1 worker        {ratio('scaling')} (target >= 1.8x): "
                 + ("met" if r["scaling"] >= 1.8 else "NOT met"))
    lines.append(f"  service / reader, 2 cores   {ratio('service_vs_reader_x2')} (target >= 0.9x): "
                 + ("met" if r["service_vs_reader_x2"] >= 0.9 else "NOT met"))
    lines.append(f"  service / reader, 1 core    {ratio('service_vs_reader_x1')}")
    lines.append(f"  snappy / none, 2 workers    {ratio('snappy_vs_none_x2')} "
                 "(service_compression='snappy' against the default, none)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.service", description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=400, help="Photos (default 400).")
    parser.add_argument("--seconds", type=float, default=6.0,
                        help="Timed window per contender and round (default 6).")
    parser.add_argument("--rounds", type=int, default=3,
                        help="Rounds of every contender, each in another order (default 3).")
    parser.add_argument("--work", default=None, help="Folder of corpora (default build/bench).")
    parser.add_argument("--dtype", default="float32",
                        help="Output dtype of every contender (default float32, the reader's).")
    parser.add_argument("--json", default=None, help="Also write the figures here.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # The dispatcher's C++ start-up lines (its whole config, each round) off, as in the
    # processes this starts; before this process imports TensorFlow.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1. Received: --rounds={args.rounds}")
    result = run(count=args.count, seconds=args.seconds, work=args.work, dtype=args.dtype,
                 rounds=args.rounds)
    print(_report(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
