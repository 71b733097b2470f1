"""`python -m bench.append` on a small corpus end to end: both scenarios, their ratios, the records."""

import json
import os
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_append_small(tmp_path):
    out = tmp_path / "append.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.append", "--count", "200", "--new", "20", "--photos", "30", "--work", str(tmp_path / "work"),
         "--json", str(out)],
        capture_output=True, text=True, cwd=_REPO, env=env, stdin=subprocess.DEVNULL, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())
    new, fraction = results["new"], results["fraction"]
    assert results["count"] == 200 and new["files"] == 20
    assert new["records_after_append"] == 220 and new["records_empty_folder"] == 20
    # Scenario 2 on photos (--photos): 30 of them grown by 10%.
    assert (fraction["kind"], fraction["base"], fraction["files"]) == ("photos", 30, 3)
    assert fraction["records_after_append"] == fraction["records_rebuild"] == 33
    assert new["ratio"] == new["append_s"] / new["empty_folder_s"]
    assert fraction["ratio"] == fraction["append_s"] / fraction["rebuild_s"]
    # CPU seconds of each process tree (the converter's worker processes included), steadier than wall time.
    assert fraction["rebuild_cpu_s"] > 0 and new["cpu_ratio"] == new["append_cpu_s"] / new["empty_folder_cpu_s"]
    assert fraction["cpu_ratio"] == fraction["append_cpu_s"] / fraction["rebuild_cpu_s"] and "by CPU" in proc.stdout
    assert "(target <= 2x)" in proc.stdout and "(target <= 15%)" in proc.stdout
    assert results["startup_s"] > 0 and "net of start-up" in proc.stdout
    if fraction["net_ratio"] is not None:
        startup = results["startup_s"]
        assert fraction["net_ratio"] == (fraction["append_s"] - startup) / (fraction["rebuild_s"] - startup)
    manifest = json.loads((tmp_path / "work" / "appended" / "manifest.json").read_text())
    assert [v["version"] for v in manifest["versions"]] == [1, 2] and manifest["versions"][1]["inputs"]["new"] == 3
