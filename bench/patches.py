"""Satellite scenes cut into patches (issue 25): speed against a hand-written cutter, and memory.

Scenes are generated once into ``build/bench/corpora`` (13 uint16 bands, 512 x
512 tiles, DEFLATE at level 1; smooth fields plus noise, as imagery
compresses): every contender reads the same file.

Speed (`run_speed`), each converter a whole process (start-up included), one
after the other, one run each (``--repeat`` for more, best kept):

- shardsmith (`python -m beam_jobs.convert --raster_patch 256 --worker_processes 2
  --num_shards 8`): plans the scene's work items from its header, reads them
  window by window, checks each patch's nodata share, computes its band
  statistics, writes raw records, index files and the manifest;
- (b) the hand-written 2-process cutter of the tutorials (`bench._patch_baselines
  --read window`): one tifffile window read per patch (the tiles it overlaps
  decoded by tifffile's segment access), written as `tf.train.Example`s of
  the same features with `tf.io.TFRecordWriter`; nothing checked;
- (b') the same, written by a careful user (`--read band`): each band of tile
  rows decoded once into one array, then cut (the tiles of 512 px hold 4
  patches of 256: (b) decodes each 4 times, (b') once, as shardsmith does).

The outputs are then compared: the same patches (filename, image bytes).
Target: shardsmith >= 1.2x (b) (ratio = (b)'s wall time / shardsmith's); the
ratio to (b') is printed beside it.

Memory (`run_memory`): the peak of converting a 5000 x 4000 x 13 uint16 scene
(520 MB decoded) and of one four times larger (10000 x 8000, 2 GB), against
a small raster (512 x 512) converted with the same options (``--raster_patch
256 --worker_processes 2``). Peak: the max RSS of the conversion's processes
(driver and worker processes), from getrusage(RUSAGE_CHILDREN) in a parent
of the command, as tests/test_conversion_patches*.py measure it; the sampled
sum of the process tree's RSS (every 50 ms) is printed beside it. Targets: the
scene's peak less than 300 MiB above the small raster's; the larger scene's
within 10% of the scene's.

Usage:

  python -m bench.patches [--skip-speed] [--skip-memory] [--side 6144] [--repeat 1] [--work DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import sys
import tempfile

import numpy as np
import psutil

from bench.convert import measure
from bench._cli import write_json

__all__ = ["make_scene", "run_memory", "run_speed", "main"]

_LOG = logging.getLogger("shardsmith.bench.patches")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MIB = 1 << 20
_BANDS = 13
_TILE = 512
_PATCH = 256
_SHARDS = 8
_TARGET_SPEED = 1.2
_TARGET_ABOVE_MIB = 300
_TARGET_GROWTH = 0.10
# (name, height, width): the scene, four times it, and the control.
_MEMORY_SCENES = (("small", 512, 512), ("scene", 4000, 5000), ("scene_x4", 8000, 10000))
_PROBE = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
          "print('MAXRSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True); "
          "sys.exit(rc)")


def make_scene(path: str, height: int, width: int, *, bands: int = _BANDS, seed: int = 0) -> str:
    """Writes (once) a tiled, DEFLATE-compressed uint16 GeoTIFF-like scene, tile by tile; returns its path.

    Never held whole in memory: tifffile writes the tiles an iterator yields.
    """
    import tifffile

    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:_TILE, 0:_TILE]
    field = (yy + xx).astype(np.uint16)[:, :, None]  # A gradient per tile: compresses like imagery.
    offsets = np.arange(bands, dtype=np.uint16) * 1500

    def tiles():
        for ty in range(-(-height // _TILE)):
            for tx in range(-(-width // _TILE)):
                noise = rng.integers(0, 64, (_TILE, _TILE, bands), dtype=np.uint16)
                yield field + offsets + noise + np.uint16((ty * 37 + tx * 11) % 200)

    tmp = path + ".tmp"
    tifffile.imwrite(tmp, tiles(), shape=(height, width, bands), dtype=np.uint16, tile=(_TILE, _TILE),
                     photometric="minisblack", planarconfig="contig", compression="zlib",
                     compressionargs={"level": 1}, metadata=None)
    os.replace(tmp, path)
    return path


@dataclasses.dataclass
class Run:
    """One timed command: wall and CPU seconds, peaks (bytes), exit status."""

    wall_s: float
    cpu_s: float
    tree_rss: int
    max_rss: int | None
    returncode: int
    log: str


def _timed(argv: list[str], log: str) -> Run:
    """Runs `argv` under the RUSAGE_CHILDREN probe, sampling its tree's RSS (`bench.convert.measure`)."""
    os.makedirs(os.path.dirname(log), exist_ok=True)
    wall, cpu, tree, _, rc = measure([sys.executable, "-c", _PROBE, *argv], log)
    max_rss = None
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("MAXRSS_KIB "):
                max_rss = int(line.split()[1]) * 1024
    return Run(wall, cpu, tree, max_rss, rc, log)


def _shardsmith_argv(input_dir: str, output_dir: str) -> list[str]:
    return [sys.executable, "-m", "beam_jobs.convert", "--input_dir", input_dir, "--output_dir", output_dir,
            "--raster_patch", str(_PATCH), "--worker_processes", "2", "--num_shards", str(_SHARDS),
            "--overwrite"]


def _patches(output_dir: str) -> dict[str, bytes]:
    """Filename to the sha256 of the image bytes of every record of a folder's shards (any writer)."""
    import glob
    import hashlib

    import schemas
    from schemas.tfrecord import iter_records

    schema = schemas.ImageExampleSchema()
    out = {}
    for path in sorted(glob.glob(os.path.join(output_dir, "*.tfrecord"))):
        with open(path, "rb") as f:
            for _, _, payload in iter_records(f, path):
                record = schema.decode(payload)
                out[record[schemas.FILENAME.key].decode()] = hashlib.sha256(record[schemas.IMAGE.key]).digest()
    return out


def run_speed(corpus_dir: str, work: str, *, side: int = 6144, repeat: int = 1) -> dict:
    """shardsmith against (b) on one tiled scene of side x side x 13 uint16; prints the table."""
    input_dir = os.path.join(corpus_dir, f"patches-speed-{side}")
    scene = make_scene(os.path.join(input_dir, "scenes", "scene.tif"), side, side)
    decoded = side * side * _BANDS * 2
    patches = (side // _PATCH) ** 2
    runs: dict[str, list[Run]] = {"shardsmith": [], "baseline": [], "baseline_band": []}
    for r in range(repeat):
        for name in runs:
            out = os.path.join(work, "out", name)
            shutil.rmtree(out, ignore_errors=True)
            if name == "shardsmith":
                argv = _shardsmith_argv(input_dir, out)
            else:
                argv = [sys.executable, "-m", "bench._patch_baselines", "--scene", scene, "--output_dir", out,
                        "--read", "band" if name == "baseline_band" else "window",
                        "--rel_path", "scenes/scene.tif", "--patch", str(_PATCH), "--processes", "2",
                        "--num_shards", str(_SHARDS)]
            run = _timed(argv, os.path.join(work, "logs", f"speed-{name}-{r}.log"))
            if run.returncode != 0:
                raise RuntimeError(f"{name} failed (exit {run.returncode}): see {run.log}")
            _LOG.info("  %-13s %6.1f s wall %6.1f s CPU %6.0f MiB (tree)", name, run.wall_s, run.cpu_s,
                      run.tree_rss / _MIB)
            runs[name].append(run)
    ours = _patches(os.path.join(work, "out", "shardsmith"))
    for name in ("baseline", "baseline_band"):
        theirs = _patches(os.path.join(work, "out", name))
        if ours != theirs or len(ours) != patches:
            raise RuntimeError(f"The outputs of shardsmith and {name} differ: {len(ours)} and {len(theirs)} "
                               f"patches, {sum(ours.get(k) != v for k, v in theirs.items())} not the same")
    best = {n: min(rs, key=lambda r: r.wall_s) for n, rs in runs.items()}
    ratio = best["baseline"].wall_s / best["shardsmith"].wall_s
    band_ratio = best["baseline_band"].wall_s / best["shardsmith"].wall_s
    head = (f"{'converter':<48} {'wall s':>7} {'CPU s':>6} {'MB/s':>6} {'tree MiB':>9} {'(b)/it':>7} "
            f"{'(b`)/it':>8}")
    lines = [f"Cutting a {side} x {side} x {_BANDS} uint16 scene ({decoded / 1e6:,.0f} MB decoded, tiles "
             f"{_TILE}, DEFLATE) into {patches} patches of {_PATCH} px, 2 processes, {_SHARDS} shards, "
             f"best of {repeat}, {os.cpu_count()} cores, load average {psutil.getloadavg()[0]:.1f}:",
             head, "-" * len(head)]
    for name, label in (("shardsmith", "shardsmith (--worker_processes 2)"),
                        ("baseline", "(b) Pool(2), a tifffile window per patch"),
                        ("baseline_band", "(b') Pool(2), tifffile bands of tile rows")):
        m = best[name]
        lines.append(f"{label:<48} {m.wall_s:>7.1f} {m.cpu_s:>6.1f} {decoded / 1e6 / m.wall_s:>6.0f} "
                     f"{m.tree_rss / _MIB:>9.0f} {best['baseline'].wall_s / m.wall_s:>6.2f}x "
                     f"{best['baseline_band'].wall_s / m.wall_s:>7.2f}x")
    lines.append(f"Target speed vs (b): {ratio:.2f}x (>= {_TARGET_SPEED}x: "
                 f"{'met' if ratio >= _TARGET_SPEED else 'MISSED'}); vs (b'): {band_ratio:.2f}x; "
                 f"the same {patches} patches, byte for byte")
    print("\n".join(lines), flush=True)
    return {"side": side, "ratio": ratio, "band_ratio": band_ratio, "patches": patches,
            **{n: dataclasses.asdict(m) for n, m in best.items()}}


def run_memory(corpus_dir: str, work: str) -> dict:
    """Peaks of the small raster, the scene and the scene x4; prints the table."""
    results = {}
    for name, height, width in _MEMORY_SCENES:
        input_dir = os.path.join(corpus_dir, f"patches-memory-{name}")
        make_scene(os.path.join(input_dir, "scenes", f"{name}.tif"), height, width)
        out = os.path.join(work, "out", f"memory-{name}")
        run = _timed(_shardsmith_argv(input_dir, out), os.path.join(work, "logs", f"memory-{name}.log"))
        if run.returncode != 0 or run.max_rss is None:
            raise RuntimeError(f"Converting {name} failed (exit {run.returncode}): see {run.log}")
        shutil.rmtree(out, ignore_errors=True)
        results[name] = dict(dataclasses.asdict(run), height=height, width=width,
                             decoded=height * width * _BANDS * 2)
        _LOG.info("  %-9s %6.1f s wall %6.0f MiB max RSS %6.0f MiB tree", name, run.wall_s,
                  run.max_rss / _MIB, run.tree_rss / _MIB)
    small, scene, large = (results[n] for n, *_ in _MEMORY_SCENES)
    above = (scene["max_rss"] - small["max_rss"]) / _MIB
    growth = large["max_rss"] / scene["max_rss"] - 1
    tree_growth = large["tree_rss"] / scene["tree_rss"] - 1
    head = f"{'raster':<30} {'decoded MB':>10} {'wall s':>7} {'max RSS MiB':>12} {'tree RSS MiB':>13}"
    lines = ["Peak memory converting with --raster_patch 256 --worker_processes 2 (max RSS: the largest "
             "process, getrusage; tree: the processes' sum, sampled):", head, "-" * len(head)]
    for name, height, width in _MEMORY_SCENES:
        r = results[name]
        lines.append(f"{f'{name} {width} x {height} x {_BANDS} uint16':<30} {r['decoded'] / 1e6:>10,.0f} "
                     f"{r['wall_s']:>7.1f} {r['max_rss'] / _MIB:>12.0f} {r['tree_rss'] / _MIB:>13.0f}")
    lines += [
        f"Target: the scene's peak {above:+.0f} MiB above the small raster's (< {_TARGET_ABOVE_MIB} MiB: "
        f"{'met' if above < _TARGET_ABOVE_MIB else 'MISSED'}); tree "
        f"{(scene['tree_rss'] - small['tree_rss']) / _MIB:+.0f} MiB",
        f"Target: the scene x4's peak {growth:+.1%} of the scene's (within {_TARGET_GROWTH:.0%}: "
        f"{'met' if abs(growth) <= _TARGET_GROWTH else 'MISSED'}); tree {tree_growth:+.1%}",
    ]
    print("\n".join(lines), flush=True)
    return {"runs": results, "above_small_mib": above, "growth_x4": growth, "tree_growth_x4": tree_growth}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.patches", description=__doc__.split("\n")[0])
    parser.add_argument("--skip-speed", action="store_true", help="Leave out the speed comparison.")
    parser.add_argument("--skip-memory", action="store_true", help="Leave out the memory figures.")
    parser.add_argument("--side", type=int, default=6144,
                        help="Side of the speed scene in pixels, a multiple of 512 (default 6144).")
    parser.add_argument("--repeat", type=int, default=1, help="Speed rounds; the best of each is kept.")
    parser.add_argument("--work", help="Folder for outputs and logs (default: temporary, removed).")
    parser.add_argument("--corpus_dir", help="Folder of generated scenes (default build/bench/corpora).")
    parser.add_argument("--json", help="Write the figures to this file.")
    args = parser.parse_args(argv)
    if args.side < _TILE or args.side % _TILE or args.repeat < 1:
        parser.error(f"--side must be a positive multiple of {_TILE} and --repeat at least 1. "
                     f"Received: --side {args.side}, --repeat {args.repeat}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bench_root = os.path.join(_REPO, "build", "bench")
    corpus_dir = args.corpus_dir or os.path.join(bench_root, "corpora")
    own_work = args.work is None
    os.makedirs(bench_root, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="patches-", dir=bench_root)
    summary, failed = {}, True
    try:
        if not args.skip_speed:
            summary["speed"] = run_speed(corpus_dir, work, side=args.side, repeat=args.repeat)
            print()
        if not args.skip_memory:
            summary["memory"] = run_memory(corpus_dir, work)
        failed = False
    except RuntimeError as e:
        _LOG.error("bench.patches: %s", e)
        return 1
    finally:
        if own_work and not failed:
            shutil.rmtree(work, ignore_errors=True)
    write_json(args.json, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
