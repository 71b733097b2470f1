"""`python -m bench.gpu` on the CPU, from a tiny dataset: sane figures for both readers."""

import json
import os
import subprocess
import sys

import pytest

import _reader_data as rd

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return rd.write_dataset(
        tmp_path_factory.mktemp("gpu"), splits={"train": 24}, num_shards=2,
        sizes=((12, 10), (9, 14)), kinds=("rgb_jpeg", "rgb_png"),
    )


def test_bench_gpu_on_the_cpu(tiny, tmp_path):
    out = tmp_path / "gpu.json"
    # No GPU, whatever the machine has: the CPU path is the one tested here.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--data_dir", str(tiny.data_dir), "--steps", "6",
         "--warmup", "2", "--batch_size", "4", "--image_size", "16", "--json", str(out)],
        capture_output=True, text=True, cwd=_REPO, env=env, stdin=subprocess.DEVNULL,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(out.read_text())
    assert summary["replicas"] == 1 and summary["devices"] == ["/cpu:0"]
    assert set(summary["results"]) == {"shardsmith", "hand"}
    for reader, r in summary["results"].items():
        assert r["images_per_s"] > 0, reader
        assert 0.0 <= r["input_share"] <= 1.0, reader
        assert 0.0 <= r["next_ms"] <= r["step_ms"], reader
        # images/s is the images of the timed steps over their time.
        assert r["images_per_s"] == pytest.approx(4 / (r["step_ms"] / 1000), rel=1e-6)
        assert r["final_loss"] == r["final_loss"] and r["final_loss"] > 0
        line = next(l for l in proc.stdout.splitlines() if l.startswith(reader + " "))
        assert f"{r['images_per_s']:.1f}" in line and f"{r['input_share']:.3f}" in line
    assert "shardsmith vs hand-tuned:" in proc.stdout
