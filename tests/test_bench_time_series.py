"""`python -m bench.time_series --small --skip-memory --repetitions 3` end to end: both converters, both readers, the ratios."""

import json
import os
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_time_series_small(tmp_path):
    out = tmp_path / "ts.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.time_series", "--small", "--skip-memory", "--repetitions", "3", "--work", str(tmp_path / "work"),
         "--json", str(out)],
        capture_output=True, text=True, cwd=_REPO, env=env, stdin=subprocess.DEVNULL, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())
    convert, read = results["convert"], results["read"]
    assert convert["locations"] == 40 and convert["dates"] == 12
    assert convert["ratio"] == convert["baseline"]["wall_s"] / convert["shardsmith"]["wall_s"]
    assert read["stacks"] == 40 and read["ratio"] == read["hand_written_s"] / read["shardsmith_s"]
    assert read["cpu_ratio"] == read["hand_written_cpu_s"] / read["shardsmith_cpu_s"]
    assert len(read["pair_ratios"]) == read["repetitions"] == 3
    assert "(target >= 1.2)" in proc.stdout and "(target >= 0.9)" in proc.stdout
    assert len(read["load_average"]) == 2 and "load average" in proc.stdout  # what the machine ran besides
    assert read["pair_ratio_median"] == sorted(read["pair_ratios"])[1]
    manifest = json.loads((tmp_path / "work" / "shardsmith" / "manifest.json").read_text())
    assert manifest["counts"]["written"] == 40 * 12
    assert manifest["time_series"]["steps"] == [12]
