"""Reading with 3 of 16 shards damaged, on_corrupt='skip', against reading the undamaged copy (issue 39).

    .venv/bin/python -m bench.corrupt_read --images 4000 --rounds 3

Converts `bench.corpus` small images into 16 shards with the real converter,
damages a copy (a data byte in one shard, a length byte in another, a third
cut short), and reads every batch of both, alternating, `--rounds` times.
Prints the records read, the count of skipped ones against the damage, and
the ratio of images/s (damaged with on_corrupt='skip' / undamaged with the
default reader, and / undamaged with on_corrupt='skip'), medians; and the
default reader and on_corrupt='skip' on the undamaged copy against the same
reader without its damage handling (TensorFlow's sequential reader alone,
the cost of the guard: the reader's private `_past_damage` swapped out).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]


def _damage(copy: Path, split) -> int:
    """Damages 3 shards of `copy`; returns the records lost."""
    lost = 0
    for shard, record, how in ((split.shards[2], 1, "data"), (split.shards[7], 3, "length"),
                               (split.shards[11], 5, "cut")):
        lines = (copy / shard.index_file).read_text().splitlines()
        offset, length = map(int, lines[record].split())
        path = copy / shard.file
        data = bytearray(path.read_bytes())
        if how == "data":
            data[offset + length // 2] ^= 0xFF
            lost += 1
        elif how == "length":
            data[offset + 1] ^= 0x01
            lost += 1
        else:
            data = data[:offset + length // 2]
            lost += len(lines) - record
        path.write_bytes(bytes(data))
    return lost


def _bare(read_shard, *_):
    """The reader without its damage handling: TensorFlow's sequential reader alone (the baseline)."""
    def read(path, shard, count, start, stop):
        return read_shard(path).take(stop).skip(start)
    return read


def _read(data_dir: Path, bare: bool = False, **kw) -> tuple[int, float, object]:
    import readers
    from readers import dataset

    past_damage = dataset._past_damage
    if bare:
        dataset._past_damage = _bare
    start = time.perf_counter()
    ds = readers.image_dataset_from_tfrecords(data_dir, batch_size=64, image_size=(64, 64), shuffle=True,
                                              seed=1, **kw)
    n = sum(int(images.shape[0]) for images, _ in ds)
    dataset._past_damage = past_damage
    return n, n / (time.perf_counter() - start), ds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from beam_jobs import convert as convert_module
    import schemas
    from bench import corpus

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "images").mkdir()
        corpus.make_small(str(root / "images"), count=args.images)
        convert_module.run(["--input_dir", str(root / "images"), "--output_dir", str(root / "clean"),
                            "--num_shards", "16"])
        manifest = schemas.Manifest.from_json((root / "clean" / schemas.MANIFEST_FILENAME).read_text())
        (split,) = manifest.splits.values()
        shutil.copytree(root / "clean", root / "damaged")
        lost = _damage(root / "damaged", split)
        rates = {"bare": [], "clean": [], "clean_skip": [], "damaged_skip": []}
        for _ in range(args.rounds):
            rates["bare"].append(_read(root / "clean", bare=True)[1])
            n_clean, rate, _ = _read(root / "clean")
            rates["clean"].append(rate)
            _, rate, _ = _read(root / "clean", on_corrupt="skip")
            rates["clean_skip"].append(rate)
            n_damaged, rate, ds = _read(root / "damaged", on_corrupt="skip")
            rates["damaged_skip"].append(rate)
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(f"corrupt_read: {split.num_records} records in 16 shards, 3 damaged ({lost} records lost)")
        print(f"  read: clean {n_clean}, damaged with on_corrupt='skip' {n_damaged} "
              f"(expected {split.num_records - lost}); ds.corrupt_records = {int(ds.corrupt_records)}")
        print(f"  images/s (median of {args.rounds}): clean default {med['clean']:.0f}, clean skip "
              f"{med['clean_skip']:.0f}, damaged skip {med['damaged_skip']:.0f}")
        print(f"  bare TensorFlow reader {med['bare']:.0f} images/s: clean default / bare "
              f"{med['clean'] / med['bare']:.3f}, clean skip / bare {med['clean_skip'] / med['bare']:.3f}")
        print(f"  ratio damaged skip / clean default {med['damaged_skip'] / med['clean']:.3f}, "
              f"/ clean skip {med['damaged_skip'] / med['clean_skip']:.3f}")
        return 0 if n_damaged == split.num_records - lost == int(split.num_records - int(ds.corrupt_records)) else 1


if __name__ == "__main__":
    sys.exit(main())
