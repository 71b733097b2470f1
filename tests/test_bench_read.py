"""bench.read's ratios over interleaved rounds and its separate conversions (no TensorFlow run)."""

import json
import os

from bench import read


def _run(rnd, images_per_s, cpu_ms, ttfb, ttfb_cpu):
    return {"round": rnd, "images_per_s": images_per_s, "cpu_ms_per_image": cpu_ms,
            "ttfb_s": ttfb, "ttfb_cpu_s": ttfb_cpu}


def test_round_ratios_pair_runs_of_the_same_round_and_take_the_median():
    runs = {
        # Round 1 of "b" failed: its round-1 run of "a" has no pair and is left out.
        "a": [_run(0, 100, 2.0, 1.0, 0.5), _run(1, 900, 1.0, 9.0, 9.0), _run(2, 300, 2.0, 1.0, 0.2),
              _run(3, 200, 4.0, 2.0, 0.3)],
        "b": [_run(0, 50, 4.0, 2.0, 0.25), _run(2, 100, 3.0, 4.0, 0.4), _run(3, 400, 2.0, 1.0, 0.3)],
    }
    speed = read.Target("speed", "images_per_s", "a", "b", 1.0)
    # Per round: 2.0, 3.0, 0.5 (wall); 2.0, 1.5, 0.5 (CPU, b's CPU over a's).
    assert read._round_ratios(runs, speed) == (2.0, 1.5)
    first = read.Target("first", "ttfb_s", "a", "b", 1.0, at_most=True)
    # Per round: 0.5, 0.25, 2.0 (wall); 2.0, 0.5, 1.0 (CPU, a's over b's).
    assert read._round_ratios(runs, first) == (0.5, 1.0)
    assert read._round_ratios({"a": runs["a"]}, speed) is None


def test_a_conversion_with_flags_has_its_own_stamp(tmp_path):
    stats = read.corpus.CorpusInfo(kind="photos", root=str(tmp_path), count=2, seed=0,
                                   files=["a/x.jpg", "b/y.jpg"], num_bytes=10, reused=False)
    out = tmp_path / "read"
    out.mkdir()
    plain = read._corpus_key(stats)
    capped = read._corpus_key(stats, ("--min_side", "224"))
    assert "convert_args" not in plain  # the stamps of earlier runs stay valid
    assert capped == dict(plain, convert_args=["--min_side", "224"])
    (out / "manifest.json").write_text("{}")
    with open(os.path.join(out, read._STAMP), "w", encoding="utf-8") as f:
        json.dump(plain, f)
    assert read._converted(stats, str(out))
    assert not read._converted(stats, str(out), ("--min_side", "224"))
