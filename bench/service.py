"""The tf.data service: images/s with 1 and 2 workers, and against the in-process reader.

On the photos corpus of `bench.corpus` (ImageNet-like ~500x375 JPEGs),
converted once (`bench.read.prepare`), every contender reads the training
split at 224x224, batch 32, default options (shuffled, stretch resize),
`repeat=True`, and is timed over a window of batches after a warm-up:

- service x1, service x2: `readers.service.start` (a dispatcher in this
  process and 1 or 2 local worker processes, static sharding), each worker
  process pinned to a core of its own (`os.sched_setaffinity`: worker i on
  core i); this process reads with `service=`;
- reader x1, reader x2: `readers.image_dataset_from_tfrecords` in a process
  of its own pinned to the same cores (core 0; cores 0 and 1).

Targets: service x2 / service x1 >= 1.8 (the workers scale), and service x2 /
reader x2 >= 0.9 (what gRPC and the trainer's share of the service cost, on
the same cores). The trainer (this process) is not pinned: on a machine with
as many cores as workers it takes CPU from them, which both ratios then
include; the output says how many cores the machine has.

Usage:

  python -m bench.service [--count 400] [--seconds 8] [--work DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
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
        "print(json.dumps(_read_here(sys.argv[1], float(sys.argv[2]), sys.argv[3])))"
        % ",".join(map(str, cores))
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_REPO, os.environ.get("PYTHONPATH")])),
               TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", code, data_dir, str(seconds), dtype], env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _served(data_dir: str, workers: int, seconds: float, dtype: str) -> dict:
    """Images/s read through `workers` local workers, worker i pinned to core i."""
    from readers import service

    running = service.start(service.ServiceOptions(workers=workers))
    try:
        for core, pid in enumerate(running.worker_pids):
            os.sched_setaffinity(pid, {core})
        return _read_here(data_dir, seconds, dtype, service=running.address)
    finally:
        running.stop()


def run(*, count: int = 400, seconds: float = 8.0, work: str | None = None,
        dtype: str = "float32") -> dict:
    from bench import read

    work = work or os.path.join(_REPO, "build", "bench")
    _, data_dir = read.prepare("photos", count, 0, work)
    read._warm_page_cache(data_dir)
    cores = sorted(os.sched_getaffinity(0))
    result = {"cores": len(cores), "load_before": os.getloadavg()[0], "count": count,
              "batch": _BATCH, "image_size": list(_SIZE), "dtype": dtype}
    if len(cores) < 2:
        raise SystemExit("bench.service needs at least 2 cores.")
    result["reader_x1"] = _reader_in_process(data_dir, cores[:1], seconds, dtype)
    result["reader_x2"] = _reader_in_process(data_dir, cores[:2], seconds, dtype)
    result["service_x1"] = _served(data_dir, 1, seconds, dtype)
    result["service_x2"] = _served(data_dir, 2, seconds, dtype)
    result["load_after"] = os.getloadavg()[0]
    rate = {k: result[k]["images_per_s"] for k in ("reader_x1", "reader_x2", "service_x1",
                                                    "service_x2")}
    result["scaling"] = rate["service_x2"] / rate["service_x1"]
    result["service_vs_reader_x2"] = rate["service_x2"] / rate["reader_x2"]
    result["service_vs_reader_x1"] = rate["service_x1"] / rate["reader_x1"]
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
    lines.append(f"  load average {r['load_before']:.1f} before, {r['load_after']:.1f} after")
    for key, label in (("reader_x1", "reader, 1 core"), ("reader_x2", "reader, 2 cores"),
                       ("service_x1", "service, 1 worker"), ("service_x2", "service, 2 workers")):
        lines.append(f"  {label:<20} {r[key]['images_per_s']:8.1f} images/s")
    lines.append(f"  2 workers / 1 worker        {r['scaling']:.2f}x (target >= 1.8x): "
                 + ("met" if r["scaling"] >= 1.8 else "NOT met"))
    lines.append(f"  service / reader, 2 cores   {r['service_vs_reader_x2']:.2f}x (target >= 0.9x): "
                 + ("met" if r["service_vs_reader_x2"] >= 0.9 else "NOT met"))
    lines.append(f"  service / reader, 1 core    {r['service_vs_reader_x1']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.service", description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=400, help="Photos (default 400).")
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="Timed window per contender (default 8).")
    parser.add_argument("--work", default=None, help="Folder of corpora (default build/bench).")
    parser.add_argument("--dtype", default="float32",
                        help="Output dtype of every contender (default float32, the reader's).")
    parser.add_argument("--json", default=None, help="Also write the figures here.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    result = run(count=args.count, seconds=args.seconds, work=args.work, dtype=args.dtype)
    print(_report(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
