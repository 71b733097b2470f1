"""`python -m bench.patches` end to end on a small scene: the speed table, the same patches both ways."""

import json
import os
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_patches_small_scene(tmp_path):
    out = tmp_path / "patches.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.patches", "--skip-memory", "--side", "512", "--work", str(tmp_path / "work"),
         "--corpus_dir", str(tmp_path / "corpora"), "--json", str(out)],
        capture_output=True, text=True, cwd=_REPO, env=env, stdin=subprocess.DEVNULL, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    speed = json.loads(out.read_text())["speed"]
    assert speed["side"] == 512 and speed["patches"] == 4
    for name in ("shardsmith", "baseline", "baseline_band"):
        assert speed[name]["returncode"] == 0 and speed[name]["wall_s"] > 0 and speed[name]["cpu_s"] > 0, name
    assert speed["ratio"] == speed["baseline"]["wall_s"] / speed["shardsmith"]["wall_s"]
    assert speed["band_ratio"] == speed["baseline_band"]["wall_s"] / speed["shardsmith"]["wall_s"]
    # The bench compared both outputs itself (it fails when they differ): 4 patches, byte for byte.
    assert "the same 4 patches, byte for byte" in proc.stdout and "Target speed vs (b):" in proc.stdout
    manifest = json.loads((tmp_path / "work" / "out" / "shardsmith" / "manifest.json").read_text())
    assert manifest["patches"]["written"] == 4
