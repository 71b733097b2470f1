"""`python -m bench.rasters` end to end on a tiny corpus: both tables, sane figures."""

import json
import os
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_rasters_small_count(tmp_path, capsys):
    out = tmp_path / "rasters.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.rasters", "--count", "20", "--repeat", "1",
         "--work", str(tmp_path / "work"), "--corpus_dir", str(tmp_path / "corpora"),
         "--json", str(out), "--read_seconds", "0.3"],
        capture_output=True, text=True, cwd=_REPO, env=env, stdin=subprocess.DEVNULL,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(out.read_text())
    assert summary["count"] == 20 and "tiff-13xuint16 20" in summary["corpus"]
    for name in ("shardsmith", "baseline"):
        m = summary["convert"][name]
        assert m["returncode"] == 0 and m["records"] == 20, name
        assert m["wall_s"] > 0 and m["cpu_s"] > 0, name
    ratio = summary["convert"]["baseline"]["wall_s"] / summary["convert"]["shardsmith"]["wall_s"]
    assert abs(summary["convert_ratio"] - ratio) < 1e-9
    assert set(summary["read"]) == {"shardsmith-uint16", "hand-uint16", "shardsmith-float32",
                                    "hand-float32"}
    for name, m in summary["read"].items():
        assert m["images_per_s"] > 0 and m["cpu_ms_per_image"] > 0, name
        assert m["images"] >= 20, name  # At least one epoch in the window.
    assert "Target conversion vs (b):" in proc.stdout
    assert proc.stdout.count("Target reading,") == 2
    # The corpus is a real 13-band uint16 TIFF that shardsmith stored raw.
    manifest = json.loads((tmp_path / "work" / "out" / "shardsmith" / "manifest.json").read_text())
    assert "raw-uint16" in json.dumps(manifest)
    # The in-process comparison of the two readers, on those shards: its command, called in this
    # process (it imports TensorFlow, which the suite has already; a new interpreter costs seconds).
    from bench import rasters

    assert rasters.main(["compare", "--data_dir", str(tmp_path / "work" / "out" / "shardsmith"),
                         "--rounds", "1", "--window_s", "0.2"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines()
                if l.startswith("BENCH_RASTERS_RESULT "))
    result = json.loads(line.split(" ", 1)[1])
    for name in ("shardsmith", "hand"):
        assert result[name]["images_per_s"] > 0 and result[name]["cpu_ms_per_image"] > 0, name
    assert result["ratio"] == result["shardsmith"]["images_per_s"] / result["hand"]["images_per_s"]
