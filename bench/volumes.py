"""Benchmark: DICOM series -> volume records, and random patches read back (issue 36).

Three figures, each a ratio against a baseline measured in the same run:

1. Conversion: `convert --volumes` (DirectRunner) against a hand-written
   two-process converter (pydicom + numpy + tf.io.TFRecordWriter, series in
   a `multiprocessing.Pool(2)`, sorted by ImagePositionPatient z).
2. Peak memory of the process tree during shardsmith's conversion, minus
   what it held before, against one volume's size.
3. Random 96^3 patches read: `readers.volume_dataset_from_tfrecords`
   against a hand-written tf.data pipeline (parse, decode_raw, reshape,
   `tf.image.random_crop`) over the baseline's records.

Both sides run `--rounds` times, interleaved, who goes first alternating;
each round gives a ratio (wall and CPU: user+sys of this process and its
reaped children), and the figure is the median of the rounds' ratios: on a
shared machine one measurement after the other mostly measures who ran
first. The 1-minute load goes beside each round. `--profile` prints CPU per
stage of both sides, in this process, one stage at a time.

    python -m bench.volumes            # 20 series of 200 512x512 int16 slices (~2 GB of DICOM)
    python -m bench.volumes --small    # 4 series of 24 64x64 slices, patches of 16^3
    python -m bench.volumes --series 4 --slices 50  # a quick look: 512x512 slices, 50^3 patches
    python -m bench.volumes --series 2 --slices 100 --profile  # CPU per stage, both sides
    python -m bench.volumes --masks    # 4 CT-like 300x512x512 int16 volumes with uint8 masks
    python -m bench.volumes --masks --small  # 4 of 24x64x64, patches of 16^3
    python -m bench.volumes --foreground  # the foreground search of one 300x512x512 mask alone

`--masks` compares the patch reader's label modes on volumes converted with
`--masks_dir` (NIfTI images and label volumes): label_mode='int' (the
baseline), 'mask', 'mask' with foreground_fraction=0.33, and both mask rows
again through the decoded-volume path (what the reader does where it resamples;
every masked patch took it before the raw-bytes path learned masks), and the
foreground row once more with the baseline's flat `tf.where` search (the
reader's before it searched busy rows only): patches/s and CPU ms per patch,
each round's ratio to 'int' in the same round, variants' order rotating from
round to round. `--foreground` times that search alone on one mask: the
reader's `foreground_voxels` against the flat `tf.where`, same voxels checked.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import multiprocessing
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

_LOG = logging.getLogger("bench.volumes")


def make_corpus(root: Path, series: int, slices: int, size: int, seed: int = 0) -> None:
    """`series` CT series of `slices` int16 slices of size x size, names shuffled, under root/c/p<i>."""
    import pydicom
    from pydicom.data import get_testdata_file
    from pydicom.uid import generate_uid

    rng = np.random.default_rng(seed)
    names = random.Random(seed)
    template = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    for s in range(series):
        folder = root / "c" / f"p{s:03d}"
        folder.mkdir(parents=True)
        uid = generate_uid()
        base = rng.integers(0, 2000, (size, size), dtype=np.int16)
        for k in range(slices):
            ds = template.copy()
            ds.Rows = ds.Columns = size
            ds.PixelData = (base + k).astype(np.int16).tobytes()
            ds.ImagePositionPatient = ["-100.0", "-100.0", f"{k * 1.25:.3f}"]
            ds.ImageOrientationPatient = ["1", "0", "0", "0", "1", "0"]
            ds.SeriesInstanceUID = uid
            ds.SOPInstanceUID = generate_uid()
            ds.save_as(folder / f"{names.getrandbits(40):010x}", enforce_file_format=True)


def _baseline_series(args):
    """One series the hand-written way: read, sort by z, stack, rescale, return bytes."""
    import pydicom

    folder = args
    datasets = [pydicom.dcmread(p) for p in sorted(Path(folder).iterdir())]
    datasets.sort(key=lambda ds: float(ds.ImagePositionPatient[2]))
    volume = np.stack([ds.pixel_array for ds in datasets]).astype(np.int16)
    volume = volume * int(datasets[0].RescaleSlope) + int(datasets[0].RescaleIntercept)
    return volume.astype(np.int16).tobytes(), volume.shape


def baseline_convert(root: Path, out: Path) -> None:
    """The hand-written converter: two processes, one TFRecord file."""
    import tensorflow as tf

    folders = sorted(str(p) for p in (root / "c").iterdir())
    out.mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("spawn").Pool(2) as pool, \
            tf.io.TFRecordWriter(str(out / "train.tfrecord")) as writer:
        for data, shape in pool.imap(_baseline_series, folders):
            example = tf.train.Example(features=tf.train.Features(feature={
                "volume": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=list(shape))),
            }))
            writer.write(example.SerializeToString())


class _PeakRss:
    """Samples the resident memory of this process and its children every 20 ms."""

    def __init__(self):
        import psutil

        self._process = psutil.Process()
        self.start = self._rss()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> int:
        import psutil

        total = 0
        for p in [self._process, *self._process.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        return total

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._rss())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _cpu() -> float:
    """User+sys seconds of this process and of its children that were waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _load() -> float:
    return os.getloadavg()[0]


def _timed(fn) -> tuple[float, float]:
    """(wall s, CPU s) of fn()."""
    cpu, wall = _cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - wall, _cpu() - cpu


def _patches_taken(ds, count: int) -> tuple[float, float]:
    """(wall s, CPU s) to take `count` patches, after a first batch (graph tracing, buffers) not counted."""
    it = iter(ds)
    next(it)
    cpu, wall = _cpu(), time.perf_counter()
    n = 0
    for element in it:
        n += int(element[0].shape[0])
        if n >= count:
            break
    return time.perf_counter() - wall, _cpu() - cpu


def _hand_written_patches(records: str, shape, per_volume: int = 4, batch: int = 4):
    """The hand-written tf.data pipeline: parse, decode_raw, reshape, `per_volume` random crops, batch."""
    import tensorflow as tf

    def parse(serialized):
        f = tf.io.parse_single_example(serialized, {"volume": tf.io.FixedLenFeature([], tf.string),
                                                    "shape": tf.io.FixedLenFeature([3], tf.int64)})
        v = tf.reshape(tf.io.decode_raw(f["volume"], tf.int16), f["shape"])
        crops = [tf.image.random_crop(v, shape, seed=i) for i in range(per_volume)]
        return tf.data.Dataset.from_tensor_slices(tf.cast(tf.stack(crops), tf.float32)[..., None])

    return (tf.data.TFRecordDataset(records).flat_map(parse)
            .batch(batch).map(lambda v: (v, 0)).prefetch(tf.data.AUTOTUNE))


def _median(values):
    return float(np.median(values))


def run(series: int, slices: int, size: int, patch: int, work: Path, rounds: int = 3) -> dict:
    """`rounds` interleaved rounds of both converters, then of both patch readers; per-round ratios."""
    import readers
    from beam_jobs import convert

    corpus = work / "in"
    make_corpus(corpus, series, slices, size)
    volume_bytes = slices * size * size * 2
    rows, peaks = [], []

    def baseline():
        shutil.rmtree(work / "baseline", ignore_errors=True)
        return _timed(lambda: baseline_convert(corpus, work / "baseline"))

    def ours():
        shutil.rmtree(work / "out", ignore_errors=True)
        with _PeakRss() as rss:
            timing = _timed(lambda: convert.run(["--volumes", "--input_dir", str(corpus), "--output_dir",
                                                 str(work / "out"), "--runner", "DirectRunner"]))
        peaks.append(rss.peak - rss.start)
        return timing

    for r in range(rounds):
        load = _load()
        if r % 2 == 0:  # Who goes first alternates.
            (base_wall, base_cpu), (our_wall, our_cpu) = baseline(), ours()
        else:
            (our_wall, our_cpu), (base_wall, base_cpu) = ours(), baseline()
        rows.append({"base_wall": base_wall, "base_cpu": base_cpu, "our_wall": our_wall, "our_cpu": our_cpu,
                     "load": (load, _load())})
        _LOG.info("convert round %d: %s", r, rows[-1])
    shape = (patch, patch, patch)
    # One pass (each volume once, 4 patches of it), at least 16 volumes: a measurement of a few
    # volumes is a few ticks of CPU time.
    count = 4 * max(series, 16)
    theirs_ds = _hand_written_patches(str(work / "baseline" / "train.tfrecord"), shape).repeat()
    ours_ds = readers.volume_dataset_from_tfrecords(work / "out", "train", batch_size=4, patch_size=shape,
                                                    patches_per_volume=4, seed=0).repeat()
    reads = []
    for r in range(rounds):
        load = _load()
        if r % 2 == 0:
            (our_wall, our_cpu), (base_wall, base_cpu) = _patches_taken(ours_ds, count), _patches_taken(theirs_ds, count)
        else:
            (base_wall, base_cpu), (our_wall, our_cpu) = _patches_taken(theirs_ds, count), _patches_taken(ours_ds, count)
        reads.append({"base_wall": base_wall, "base_cpu": base_cpu, "our_wall": our_wall, "our_cpu": our_cpu,
                      "load": (load, _load())})
        _LOG.info("patches round %d: %s", r, reads[-1])
    return {"convert": rows, "patches": reads, "count": count, "peak_over_volume": max(peaks) / volume_bytes,
            "volume_mb": volume_bytes / 2**20}


def organ_mask(depth: int, size: int) -> np.ndarray:
    """uint8 ids [depth, size, size]: an organ-sized ellipsoid of id 1 and a small one of id 2 (~3% foreground)."""
    ids = np.zeros((depth, size, size), np.uint8)
    k, j, i = np.ogrid[:depth, :size, :size]
    ids[((k - depth / 2) / (depth / 5)) ** 2 + ((j - size / 2) / (size / 6)) ** 2
        + ((i - size * 0.4) / (size / 5)) ** 2 < 1] = 1
    ids[((k - depth / 3) / (depth / 15)) ** 2 + ((j - size * 0.6) / (size / 25)) ** 2
        + ((i - size * 0.6) / (size / 25)) ** 2 < 1] = 2
    return ids


def _flat_foreground(mask, ranks):
    """The baseline foreground search (the reader's before vmfix13, what one writes first): every
    foreground voxel's flat index listed by `tf.where`, the ranks' gathered from the list."""
    import tensorflow as tf

    foreground = tf.where(tf.reshape(mask, [-1]) > 0)[:, 0]
    n = tf.size(foreground, out_type=tf.int64)
    foreground = tf.concat([foreground, tf.zeros([1], tf.int64)], 0)
    return n, tf.gather(foreground, ranks % tf.maximum(n, 1))


def run_foreground(depth: int, size: int, rounds: int = 5, calls: int = 10) -> dict:
    """The foreground search of one mask alone (`foreground_fraction`'s, per volume read): the reader's
    `foreground_voxels` against `_flat_foreground`, both traced once, interleaved rounds of `calls`.

    Returns:
      {"rounds": [{"flat": (wall s, CPU s), "rows": (...)}, ...], "loads": [...], "foreground": share}.
    """
    import tensorflow as tf

    from readers.volumes import foreground_voxels

    mask = tf.constant(organ_mask(depth, size))
    ranks = tf.constant(np.random.default_rng(0).integers(0, 2**31 - 1, 4), tf.int64)
    spec = [tf.TensorSpec([None, None, None], tf.uint8), tf.TensorSpec([None], tf.int64)]
    searches = {"flat": tf.function(_flat_foreground, input_signature=spec),
                "rows": tf.function(foreground_voxels, input_signature=spec)}
    got = {name: [t.numpy() for t in fn(mask, ranks)] for name, fn in searches.items()}
    # The same voxels, or the figure means nothing.
    assert all((a == b).all() for a, b in zip(got["flat"], got["rows"])), got
    rows, loads = [], []
    for r in range(rounds):
        load = _load()
        order = list(searches)[r % 2:] + list(searches)[:r % 2]  # Who goes first alternates.
        row = {}
        for name in order:
            row[name] = _timed(lambda: [searches[name](mask, ranks)[1].numpy() for _ in range(calls)])
        rows.append(row)
        loads.append((load, _load()))
    share = float(got["flat"][0]) / mask.shape.num_elements()
    return {"rounds": rows, "loads": loads, "calls": calls, "foreground": share}


def _print_foreground(r: dict, depth: int, size: int) -> None:
    calls = r["calls"]
    print(f"foreground search of one {depth}x{size}x{size} uint8 mask ({100 * r['foreground']:.1f}% foreground), "
          f"x{calls} per side and round (flat tf.where / rows: above 1 is the reader's search cheaper):")
    for i, (row, load) in enumerate(zip(r["rounds"], r["loads"])):
        (fw, fc), (rw, rc) = row["flat"], row["rows"]
        print(f"  round {i}: flat {1000 * fc / calls:.1f} ms CPU, rows {1000 * rc / calls:.1f} ms CPU "
              f"(CPU {fc / rc:.2f}x, wall {fw / rw:.2f}x), load {load[0]:.1f}-{load[1]:.1f}")
    print(f"  median of the rounds' ratios: CPU {_median([x['flat'][1] / x['rows'][1] for x in r['rounds']]):.2f}x, "
          f"wall {_median([x['flat'][0] / x['rows'][0] for x in r['rounds']]):.2f}x")


def make_masked_corpus(root: Path, volumes: int, depth: int, size: int, seed: int = 0) -> tuple[Path, Path]:
    """`volumes` CT-like int16 NIfTI volumes (depth x size x size) and uint8 label volumes (an organ-sized
    ellipsoid of id 1 and a small one of id 2, ~3% foreground) as a segmentation task lays them out."""
    import nibabel as nib

    images, labels = root / "imagesTr", root / "labelsTr"
    images.mkdir(parents=True)
    labels.mkdir()
    rng = np.random.default_rng(seed)
    affine = np.diag([0.8, 0.8, 1.25, 1.0])
    ids = organ_mask(depth, size)
    for n in range(volumes):
        ct = rng.integers(-1000, 1500, (depth, size, size), dtype=np.int16)
        # NIfTI is indexed (i, j, k): the volume's (k, j, i) transposed.
        nib.save(nib.Nifti1Image(ct.transpose(2, 1, 0), affine), images / f"case{n:03d}_0000.nii")
        nib.save(nib.Nifti1Image(ids.transpose(2, 1, 0), affine), labels / f"case{n:03d}.nii")
    return images, labels


def run_masked(volumes: int, depth: int, size: int, patch: int, work: Path, rounds: int = 3) -> dict:
    """Patches of masked volumes by label mode and path, interleaved rounds; per-round ratios to label_mode='int'.

    Returns:
      {"variants": names, "rounds": [{name: (wall s, CPU s)}, ...], "loads": [(start, end)], "count": patches}.
    """
    import readers
    from beam_jobs import convert

    volumes_module = importlib.import_module("readers.volumes")
    images, labels = make_masked_corpus(work / "in", volumes, depth, size)
    out = work / "out"
    convert.run(["--volumes", "--input_dir", str(images), "--masks_dir", str(labels), "--mask_suffix", "_0000:",
                 "--output_dir", str(out), "--runner", "DirectRunner"])
    shape = (patch, patch, patch)

    search = volumes_module.foreground_voxels

    def reader(label_mode="int", fraction=0.0, decoded=False, flat=False):
        # The decoded-volume path, forced as a big-endian host would take it: the reader's path where it
        # resamples, and every masked patch's path before vfast12's change. `flat`: the foreground
        # found by the baseline's flat `tf.where` (the reader's before vmfix13), traced into this one.
        volumes_module._BITCAST_IS_LITTLE_ENDIAN = not decoded
        volumes_module.foreground_voxels = _flat_foreground if flat else search
        try:
            return readers.volume_dataset_from_tfrecords(out, "train", batch_size=4, patch_size=shape,
                                                         patches_per_volume=4, seed=0, label_mode=label_mode,
                                                         foreground_fraction=fraction).repeat()
        finally:
            volumes_module._BITCAST_IS_LITTLE_ENDIAN = True
            volumes_module.foreground_voxels = search

    datasets = {"int": reader(), "mask": reader("mask"), "mask fg 0.33": reader("mask", 0.33),
                "mask fg 0.33, flat search": reader("mask", 0.33, flat=True),
                "mask, decoded path": reader("mask", decoded=True),
                "mask fg 0.33, decoded path": reader("mask", 0.33, decoded=True)}
    names = list(datasets)
    # Each volume read twice at least (4 patches of each), and small volumes enough times for the
    # CPU clock's 10 ms ticks.
    count = 4 * max(2 * volumes, 16, 2**24 // (depth * size * size))
    rows, loads = [], []
    for r in range(rounds):
        load = _load()
        order = names[r % len(names):] + names[:r % len(names)]  # Who goes first rotates.
        rows.append({name: _settled(datasets[name], count) for name in order})
        loads.append((load, _load()))
        _LOG.info("masked patches round %d: %s", r, rows[-1])
    return {"variants": names, "rounds": rows, "loads": loads, "count": count}


def _settled(ds, count: int) -> tuple[float, float]:
    """`_patches_taken`, then a second's pause: the parallel maps' volumes still in flight when it stops
    (a few 200 MB records) finish or are cancelled before the next variant's clock starts."""
    timing = _patches_taken(ds, count)
    gc.collect()
    time.sleep(1.0)
    return timing


def _print_masked(r: dict, patch: int) -> None:
    count = r["count"]
    print(f"random {patch}^3 patches x{count} per variant and round (ratios to label_mode='int' in the same "
          "round: above 1 is slower or costlier than 'int'):")
    for i, (row, load) in enumerate(zip(r["rounds"], r["loads"])):
        print(f"  round {i} (load {load[0]:.1f}-{load[1]:.1f}):")
        for name in r["variants"]:
            wall, cpu = row[name]
            base_wall, base_cpu = row["int"][0], max(row["int"][1], 1e-9)
            print(f"    {name:28s} {count / wall:7.1f} patches/s  {1000 * cpu / count:8.1f} ms CPU/patch  "
                  f"(wall {wall / base_wall:.2f}x, CPU {cpu / base_cpu:.2f}x of 'int')")
    print("  medians of the rounds' ratios to 'int':")
    for name in r["variants"]:
        walls = [row[name][0] / row["int"][0] for row in r["rounds"]]
        cpus = [row[name][1] / max(row["int"][1], 1e-9) for row in r["rounds"]]
        rates = [count / row[name][0] for row in r["rounds"]]
        ms = [1000 * row[name][1] / count for row in r["rounds"]]
        print(f"    {name:28s} wall {_median(walls):.2f}x, CPU {_median(cpus):.2f}x "
              f"(median {_median(rates):.1f} patches/s, {_median(ms):.1f} ms CPU/patch)")
    for fast, slow in (("mask", "mask, decoded path"), ("mask fg 0.33", "mask fg 0.33, decoded path"),
                       ("mask fg 0.33", "mask fg 0.33, flat search")):
        walls = [row[slow][0] / row[fast][0] for row in r["rounds"]]
        cpus = [row[slow][1] / max(row[fast][1], 1e-9) for row in r["rounds"]]
        print(f"  {slow} / {fast}: wall {_median(walls):.2f}x, CPU {_median(cpus):.2f}x (median of rounds)")


def profile(series: int, slices: int, size: int, patch: int, work: Path) -> list[tuple[str, str, float, str]]:
    """CPU per stage of both converters and both patch readers, one stage at a time in this process.

    Returns:
      (side, stage, CPU ms, per what) rows.
    """
    import pydicom
    import tensorflow as tf

    import readers
    from beam_jobs import convert
    from conversion import files as _files
    from imaging import dicom, volumes
    from schemas import tfrecord
    from schemas.volumes import VOLUME_SCHEMA, VolumeRecord

    corpus = work / "in"
    make_corpus(corpus, series, slices, size)
    folders = sorted((corpus / "c").iterdir())
    n = series * slices
    out = []

    def stage(side, name, fn, per=n, unit="slice"):
        fn_result = [None]

        def call():
            fn_result[0] = fn()

        _, cpu = _timed(call)
        out.append((side, name, 1000 * cpu / per, unit))
        return fn_result[0]

    # shardsmith's converter, its stages as `conversion.volumes` runs them (one series at a time).
    paths = stage("shardsmith", "listing", lambda: [sorted(p for p in f.iterdir()) for f in folders])

    def headers():
        stacks = []
        for folder in paths:
            found = []
            for p in folder:
                with open(p, "rb") as f:
                    found += volumes.read_slice_headers(f, p.name)
            stacks.append((folder, volumes.plan_stacks(found).stacks[0]))
        return stacks

    stacks = stage("shardsmith", "header reads + planning", headers)
    blobs = stage("shardsmith", "file reads", lambda: [{p.name: p.read_bytes() for p in folder} for folder in paths])

    def decode():
        for (_, stack), files in zip(stacks, blobs):
            for s in stack.slices:
                data = files[s.name]
                bits = s.stored_range[1].bit_length() + (s.stored_range[0] < 0)  # BitsStored
                if s.pixel_offset < 0 or dicom.decode_native_frame(data, s.pixel_offset, s.rows, s.columns,
                                                                   s.stored_dtype, bits) is None:
                    dicom.decode_stored_frame(dicom.read_dataset(data, s.name), s.frame, s.name)

    stage("shardsmith", "pixel decode", decode)
    decode_ms = out[-1][2]
    vols = stage("shardsmith", "decode + stacking (read_stack)",
                 lambda: [volumes.read_stack(st, files.__getitem__) for (_, st), files in zip(stacks, blobs)])
    out.append(("shardsmith", "stacking (rescale, into the volume)", out[-1][2] - decode_ms, "slice"))
    parts = stage("shardsmith", "encoding (record parts)",
                  lambda: [VOLUME_SCHEMA.encode_parts(VolumeRecord(v.voxels, v.spacing, v.affine, 0, "x", v.modality))
                           for v in vols])
    framed = stage("shardsmith", "framing (CRC32C)", lambda: [tfrecord.frame_parts(p) for p in parts])

    def write():
        writer = _files.AtomicWriter(str(work), "profile.tfrecord")
        for f in framed:
            for part in f:
                writer.write(part)
        writer.commit()

    stage("shardsmith", "writing (+ SHA-256)", write)
    # Freed before the whole run: rebound, not `del`eted, as the stages' closures above name them.
    vols = parts = framed = blobs = None
    shutil.rmtree(work / "out", ignore_errors=True)
    wall, cpu = _timed(lambda: convert.run(["--volumes", "--input_dir", str(corpus), "--output_dir",
                                            str(work / "out"), "--runner", "DirectRunner"]))
    out.append(("shardsmith", f"whole convert.run (wall {wall:.1f} s)", 1000 * cpu / n, "slice"))

    # The hand-written converter, the same stages (one process here).
    base_paths = stage("hand-written", "listing", lambda: [sorted(f.iterdir()) for f in folders])
    datasets = stage("hand-written", "file reads + header parse (dcmread)",
                     lambda: [[pydicom.dcmread(p) for p in folder] for folder in base_paths])
    arrays = stage("hand-written", "pixel decode (pixel_array)",
                   lambda: [[ds.pixel_array for ds in sorted(group, key=lambda ds: float(ds.ImagePositionPatient[2]))]
                            for group in datasets])

    def stacking():
        result = []
        for group, planes in zip(datasets, arrays):
            volume = np.stack(planes).astype(np.int16)
            volume = volume * int(group[0].RescaleSlope) + int(group[0].RescaleIntercept)
            result.append((volume.astype(np.int16).tobytes(), volume.shape))
        return result

    stacked = stage("hand-written", "stacking (stack, rescale, tobytes)", stacking)
    arrays = datasets = None  # Freed (rebound: `stacking` and the lambdas above name them).
    examples = stage("hand-written", "encoding (tf.train.Example)", lambda: [tf.train.Example(
        features=tf.train.Features(feature={
            "volume": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
            "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=list(shape)))})).SerializeToString()
        for data, shape in stacked])
    stacked = None  # Freed (rebound: the lambda above names it).

    def base_write():
        (work / "baseline").mkdir(exist_ok=True)
        with tf.io.TFRecordWriter(str(work / "baseline" / "train.tfrecord")) as writer:
            for e in examples:
                writer.write(e)

    stage("hand-written", "writing (TFRecordWriter, CRC32C)", base_write)
    examples = None  # Freed (rebound: `base_write` names it).
    shutil.rmtree(work / "baseline", ignore_errors=True)
    wall, cpu = _timed(lambda: baseline_convert(corpus, work / "baseline"))
    out.append(("hand-written", f"whole, 2 processes (wall {wall:.1f} s)", 1000 * cpu / n, "slice"))

    # Patches: the hand-written pipeline one stage more at a time (CPU per volume), then ours whole.
    shape = (patch, patch, patch)
    records = str(work / "baseline" / "train.tfrecord")
    spec = {"volume": tf.io.FixedLenFeature([], tf.string), "shape": tf.io.FixedLenFeature([3], tf.int64)}
    parse = lambda s: tf.io.parse_single_example(s, spec)  # noqa: E731
    decoded = lambda f: tf.reshape(tf.io.decode_raw(f["volume"], tf.int16), f["shape"])  # noqa: E731

    def crops(v):
        return tf.cast(tf.stack([tf.image.random_crop(v, shape, seed=i) for i in range(4)]), tf.float32)[..., None]

    pipelines = [
        ("hand-written patches", "read (TFRecordDataset)", tf.data.TFRecordDataset(records)),
        ("hand-written patches", "+ parse", tf.data.TFRecordDataset(records).map(parse)),
        ("hand-written patches", "+ decode_raw, reshape", tf.data.TFRecordDataset(records).map(parse).map(decoded)),
        ("hand-written patches", "+ 4 crops, cast",
         tf.data.TFRecordDataset(records).map(parse).map(decoded).map(crops)),
        ("hand-written patches", "+ unbatch, batch 4 (the whole)", _hand_written_patches(records, shape)),
        ("shardsmith patches", "read (TFRecordDataset of its shards)",
         tf.data.TFRecordDataset(sorted(str(p) for p in (work / "out").glob("train-*.tfrecord")))),
        ("shardsmith patches", "volume_dataset_from_tfrecords, batch 4 (the whole)",
         readers.volume_dataset_from_tfrecords(work / "out", "train", batch_size=4, patch_size=shape,
                                               patches_per_volume=4, seed=0)),
    ]
    volumes_read = max(series, 16)
    for side, name, ds in pipelines:
        # Each element is one volume (its record, or its 4 patches as one batch); after the first
        # (tracing, buffers), over at least 16 volumes.
        it = iter(ds.repeat())
        next(it)
        _, cpu = _timed(lambda it=it: [next(it) for _ in range(volumes_read)])
        out.append((side, name, 1000 * cpu / volumes_read, "volume"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.volumes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="4 series of 24 64x64 slices, 16^3 patches.")
    parser.add_argument("--work_dir", help="Where the corpus and outputs go (default: a temporary folder).")
    parser.add_argument("--series", type=int, help="Series in the corpus (default 20; 4 with --small).")
    parser.add_argument("--slices", type=int, help="Slices per series (default 200; 24 with --small).")
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved rounds of each side (default 3).")
    parser.add_argument("--profile", action="store_true", help="CPU per stage of both sides, one stage at a time.")
    parser.add_argument("--masks", action="store_true",
                        help="Patches of volumes with masks by label mode (default 4 volumes of 300x512x512).")
    parser.add_argument("--foreground", action="store_true",
                        help="The foreground search of one mask alone (default 300x512x512; 24x64x64 with --small).")
    args = parser.parse_args(argv)
    if sum((args.masks, args.profile, args.foreground)) > 1:
        parser.error("--masks, --foreground and --profile are separate runs: pick one.")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1. Received: {args.rounds}")
    if args.foreground:
        depth, size = (24, 64) if args.small else (300, 512)
        depth = args.slices or depth
        print(f"load at start {_load():.1f}")
        _print_foreground(run_foreground(depth, size, args.rounds), depth, size)
        return 0
    if args.masks:
        volumes, depth, size, patch = (4, 24, 64, 16) if args.small else (4, 300, 512, 96)
        volumes, depth = args.series or volumes, args.slices or depth
        work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_volumes_"))
        print(f"masked volumes: {volumes} of {depth}x{size}x{size} int16 with uint8 masks, patches of {patch}^3 "
              f"({depth * size * size * 3 / 2**20:.1f} MB of record each); load at start {_load():.1f}")
        try:
            r = run_masked(volumes, depth, size, patch, work, args.rounds)
        finally:
            if not args.work_dir:
                shutil.rmtree(work, ignore_errors=True)
        _print_masked(r, patch)
        return 0
    series, slices, size, patch = (4, 24, 64, 16) if args.small else (20, 200, 512, 96)
    series, slices = args.series or series, args.slices or slices
    patch = min(patch, slices)  # The hand-written crop cannot pad a volume thinner than a patch.
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1. Received: {args.rounds}")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_volumes_"))
    print(f"volumes: {series} series x {slices} slices of {size}x{size} int16, patches of {patch}^3 "
          f"({slices * size * size * 2 / 2**20:.1f} MB each); load at start {_load():.1f}")
    try:
        if args.profile:
            rows = profile(series, slices, size, patch, work)
        else:
            r = run(series, slices, size, patch, work, args.rounds)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    if args.profile:
        print(f"CPU per stage, one at a time in one process (load now {_load():.1f}):")
        for side, stage, ms, per in rows:
            print(f"  {side:22s} {stage:45s} {ms:9.2f} ms/{per}")
        return 0
    # On a shared machine the figures move with the load: it goes beside each round.
    for what, rows in (("convert", r["convert"]), (f"random {patch}^3 patches x{r['count']}", r["patches"])):
        print(f"{what} (s; hand-written / shardsmith: above 1 is shardsmith faster or cheaper):")
        for i, row in enumerate(rows):
            print(f"  round {i}: wall {row['our_wall']:.2f} vs {row['base_wall']:.2f} "
                  f"({row['base_wall'] / row['our_wall']:.2f}x), CPU {row['our_cpu']:.2f} vs {row['base_cpu']:.2f} "
                  f"({row['base_cpu'] / row['our_cpu']:.2f}x), load {row['load'][0]:.1f}-{row['load'][1]:.1f}")
        print(f"  median of the rounds' ratios: wall {_median([x['base_wall'] / x['our_wall'] for x in rows]):.2f}x, "
              f"CPU {_median([x['base_cpu'] / x['our_cpu'] for x in rows]):.2f}x")
    print(f"peak memory of the process tree over its start: {r['peak_over_volume']:.1f} volumes (the highest round)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
