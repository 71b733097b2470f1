"""`python -m bench.targets_convert` on tiny corpora: the baseline's records, and shardsmith's half.

One run of the whole benchmark for the module (each converter is a process that imports
TensorFlow: seconds of CPU each); the tests read its summary and the baseline's records.
"""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """(the finished process, its summary, its folder) of one run on 3 and on 6 images."""
    tmp_path = tmp_path_factory.mktemp("targets_convert")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.targets_convert", "--count", "6", "--small", "3",
         "--work", str(tmp_path / "work"), "--corpus_dir", str(tmp_path / "corpora"),
         "--json", str(tmp_path / "out.json")],
        capture_output=True, text=True, cwd=_REPO, env=_ENV, stdin=subprocess.DEVNULL, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads((tmp_path / "out.json").read_text()), tmp_path


def test_the_baseline_writes_every_image_with_its_mask(bench_run):
    _, summary, tmp_path = bench_run
    assert set(summary["sizes"]) == {"3", "6"}
    for images, entry in summary["sizes"].items():
        m = entry["results"]["baseline"]
        assert m["returncode"] == 0 and m["records"] == int(images) and m["wall_s"] > 0
    # The records of the large corpus (the last one converted), read with TensorFlow's own parser; masks and sizes
    # compared with the corpus files read by Pillow.
    corpus = tmp_path / "corpora" / "segmentation-6-seed0"
    records = tf.data.TFRecordDataset(sorted(str(p) for p in (tmp_path / "work" / "out" / "baseline")
                                             .glob("*.tfrecord")))
    seen = set()
    for raw in records:
        features = tf.train.Example.FromString(raw.numpy()).features.feature
        name = features["filename"].bytes_list.value[0].decode()
        stem = name.rsplit(".", 1)[0]
        image = features["image"].bytes_list.value[0]
        assert image == (corpus / "images" / name).read_bytes()
        mask = np.asarray(Image.open(io.BytesIO(features["mask"].bytes_list.value[0])))
        with Image.open(corpus / "masks" / f"{stem}.png") as source:
            np.testing.assert_array_equal(mask, np.asarray(source))
        with Image.open(corpus / "images" / name) as photo:
            assert photo.format == "JPEG" and photo.size[0] * photo.size[1] == 400 * 300
            assert mask.shape == (photo.size[1], photo.size[0])
            assert features["height"].int64_list.value[0] == photo.size[1]
        assert set(np.unique(mask)) <= set(range(5)) | {255}
        seen.add(name)
    assert len(seen) == 6


def test_shardsmith_and_the_baseline_each_write_every_image(bench_run):
    proc, summary, _ = bench_run
    for images, entry in summary["sizes"].items():
        for name in ("shardsmith", "baseline"):
            assert entry["results"][name]["records"] == int(images), (images, name)
        ratio = entry["results"]["baseline"]["wall_s"] / entry["results"]["shardsmith"]["wall_s"]
        assert abs(entry["ratio"] - ratio) < 1e-9
    assert proc.stdout.count("Target on") == 2
