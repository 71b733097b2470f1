"""Mutation run through the real conversion (issue 39): a folder of damaged files, one `shardsmith convert`.

    .venv/bin/python -m bench.mutations_convert --cases 2000 --seed 0 --file_timeout 20

The damaged files of `bench.mutations` (every seed file of every format:
JPEG baseline and progressive, PNG, TIFF striped, tiled, compressed and
multi-page, GDAL GeoTIFFs, DICOM files in every transfer syntax the converter
reads, and the seed files themselves) are written under `<format>/` class folders and
converted by the command, in its own process tree, with a short
`--file_timeout`. Then, from the output alone:

- the exit status is 0 or 3;
- the accounting holds: every input file is in a record (by its stored
  filename) or in rejects.jsonl with a known reason, never both, never twice;
- every record reads back through `readers.image_dataset_from_tfrecords` and
  decodes, and `shardsmith verify` passes;
- crashes (`internal_error`, `decoder_crashed`: shardsmith's or a decoder's
  failure, not the file's) and hangs (`timeout`) are counted;
- the peak memory of the command's whole process tree (sampled).

Prints cases per format, written, rejected per reason, crashes, hangs,
accounting breaks and peak memory; exits 1 on any crash, hang or break.

NIfTI files and DICOM series are read by `--volumes` only: a second folder
(`write_volume_cases`: nibabel's NIfTI-1 and NIfTI-2 files damaged by
`bench.mutate`, half of them gzipped after; series of pydicom slices, in
turn in every transfer syntax of `bench.mutation_seeds` (uncompressed, RLE,
JPEG-LS, JPEG 2000, HTJ2K, JPEG lossless and baseline), with a slice or two
damaged (its codestream too), dropped, duplicated or emptied) is converted
with `--volumes` and checked the same way, per file (`convert_volume_cases`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

from bench import mutate, mutation_seeds, mutations

__all__ = ["write_cases", "convert_cases", "write_volume_cases", "convert_volume_cases", "ConversionOutcome",
           "main"]

_SUFFIX = {"jpeg": ".jpg", "png": ".png", "tiff": ".tif", "dicom": ".dcm"}
# A split per kind of stored image (the reader reads photos, rasters and DICOM
# slices of one split into one output only with options that suit them all).
_SPLIT = {"jpeg": "train", "png": "train", "tiff": "validation", "dicom": "test"}
# The reasons that mean "shardsmith or a decoder failed", not "the file is bad" (`conversion.guard`).
_CRASHES = ("internal_error", "decoder_crashed")
_HANGS = ("timeout",)
# What the command itself says on stderr; any other line is a library's noise (issue 39).
_OWN_LINES = ("Found ", "Wrote ", "Kept ", "Converted ", "shardsmith convert: ", "Rejected ", "Stopping process ",
              "Going on without ", "No file crashes alone", "Mended ", "Planned ")


def write_cases(root: pathlib.Path, cases_per_file: int, seed: int) -> dict[str, tuple[str, str]]:
    """Writes every seed file and `cases_per_file` damaged copies of each under `root/<split>/<format>/`.

    Returns:
      rel_path -> (format, what was done) of every file written.
    """
    cases = {}
    for name, fmt, data in mutations.seed_files():
        stem = name.rsplit(".", 1)[0]
        (root / _SPLIT[fmt] / fmt).mkdir(parents=True, exist_ok=True)
        found = [("seed", data)] + [(m.how, m.data) for m in mutate.mutations(data, fmt, count=cases_per_file,
                                                                              seed=seed)]
        for k, (how, payload) in enumerate(found):
            rel = f"{_SPLIT[fmt]}/{fmt}/{stem}-{k:04d}{_SUFFIX[fmt]}"
            (root / rel).write_bytes(payload)
            cases[rel] = (fmt, f"{name}: {how}")
    return cases


@dataclasses.dataclass
class ConversionOutcome:
    """What one converted folder of damaged files gave (`convert_cases`)."""

    status: int
    seconds: float
    peak_rss: int  # Bytes: the most the command's process tree held at once (sampled).
    cases: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    written: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    rejected: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
    records: int = 0
    crashes: list = dataclasses.field(default_factory=list)
    hangs: list = dataclasses.field(default_factory=list)
    breaks: list = dataclasses.field(default_factory=list)  # Accounting breaks and unreadable output.
    stderr: str = ""
    noise: list = dataclasses.field(default_factory=list)  # Console lines that are not shardsmith's own.


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def _run_sampled(cmd: list[str], timeout: float, env: dict) -> tuple[subprocess.CompletedProcess, int, float]:
    """Runs `cmd`, sampling its process tree's memory; (result, peak bytes, seconds)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, stdin=subprocess.DEVNULL)
        peak = [0]
        done = threading.Event()

        def sample():
            while not done.wait(0.1):
                peak[0] = max(peak[0], _tree_rss(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        finally:
            done.set()
            sampler.join()
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(cmd, code, out.read().decode(errors="replace"),
                                             err.read().decode(errors="replace"))
    return result, peak[0], time.perf_counter() - start


def convert_cases(root: pathlib.Path, out: pathlib.Path, cases: dict[str, tuple[str, str]], *,
                  file_timeout: float, extra_args: tuple[str, ...] = (), verify: bool = True,
                  run_timeout: float = 1800) -> ConversionOutcome:
    """Converts `root` into `out` with the command and checks the output against `cases` (`write_cases`)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    cmd = [sys.executable, "-m", "shardsmith", "convert", "--input_dir", str(root), "--output_dir", str(out),
           "--file_timeout", f"{file_timeout:g}", "--max_reject_fraction", "1", *extra_args]
    result, peak, seconds = _run_sampled(cmd, run_timeout, env)
    outcome = ConversionOutcome(result.returncode, seconds, peak, stderr=result.stderr)
    outcome.noise = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(_OWN_LINES)]
    for fmt, _ in cases.values():
        outcome.cases[fmt] += 1
    if result.returncode not in (0, 3):
        outcome.breaks.append(f"exit status {result.returncode}: {result.stderr[-2000:]}")
        return outcome
    _account(out, cases, outcome)
    if verify:
        _verify(out, outcome)
    return outcome


def _verify(out: pathlib.Path, outcome: ConversionOutcome) -> None:
    """`shardsmith verify OUT`, in this process (the output is what is checked, not the command:
    a fresh interpreter would import TensorFlow and Beam again, ~4 s of CPU); a failure is a break."""
    import contextlib
    import io
    import logging

    from conversion import console

    # Its report and log lines kept for a break; the root logger's handlers put back after (the
    # command sets its own, on the stream it was given).
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            with console.entry_point([str(out)]):  # Beam's import-time notice quieted, as the command does.
                from beam_jobs import verify

                code = verify.main([str(out)])
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    if code != 0:
        outcome.breaks.append(f"verify exit status {code}: {text.getvalue()[-2000:]}")


def _tally_rejects(out: pathlib.Path, case_of: dict[str, tuple[str, str]],
                   outcome: ConversionOutcome) -> collections.Counter:
    """Counts rejects.jsonl into `outcome` (per format and reason; crashes, hangs, breaks); rejects per path.

    Args:
      case_of: (format, how it was damaged) of each input path.
    """
    import schemas

    seen: collections.Counter = collections.Counter()
    # Lines end at "\n" only: a message may hold U+0085 (a damaged UID's byte), which splitlines splits at.
    for line in (out / schemas.REJECTS_FILENAME).read_text(encoding="utf-8", errors="surrogateescape").split("\n"):
        if not line.strip():
            continue
        r = json.loads(line)
        path, reason = r["path"], r["reason"]
        seen[path] += 1
        if path not in case_of:
            outcome.breaks.append(f"a reject names no input: {path}")
            continue
        fmt, how = case_of[path]
        outcome.rejected[fmt][reason] += 1
        label = f"{path} ({how}): {reason}: {r.get('message', '')}"
        if reason not in schemas.REJECT_REASONS and reason not in schemas.SKIP_REASONS:
            outcome.breaks.append(f"unknown reason {label}")
        if reason in _CRASHES:
            outcome.crashes.append(label)
        elif reason in _HANGS:
            outcome.hangs.append(label)
    return seen


def _account(out: pathlib.Path, cases: dict[str, tuple[str, str]], outcome: ConversionOutcome) -> None:
    """Fills `outcome` from the output folder: every case in a record or a reject, once."""
    seen = _tally_rejects(out, cases, outcome)
    names = _read_back(out, outcome)
    for name in sorted(names):
        if name not in cases:
            outcome.breaks.append(f"a record names no input: {name}")
            continue
        if seen[name]:
            outcome.breaks.append(f"both written and rejected: {name}")
        outcome.written[cases[name][0]] += 1
    for rel in sorted(cases):
        if rel not in names and not seen[rel]:
            outcome.breaks.append(f"neither written nor rejected: {rel} ({cases[rel][1]})")
        elif seen[rel] > 1:
            outcome.breaks.append(f"rejected {seen[rel]} times: {rel}")


def _read_back(out: pathlib.Path, outcome: ConversionOutcome) -> set[str]:
    """The source files of every record, each record parsed and decoded by the reader's functions.

    Record by record (`readers.decode`: the stored format decides the decode),
    since one folder of damaged files holds photos, rasters and DICOM slices
    of every band count, which no one `image_dataset_from_tfrecords` output
    shape holds; the decoded shape must be the record's own.
    """
    import tensorflow as tf

    import schemas
    from readers import decode

    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    schema = schemas.ImageExampleSchema.from_json(manifest.features)
    names = set()
    for split, info in manifest.splits.items():
        for shard in info.shards:
            try:
                for raw in tf.data.TFRecordDataset(str(out / shard.file)):
                    f = decode.parse_examples(raw, schema=schema)
                    fmt = f[schemas.FORMAT.key].numpy().decode()
                    height, width, channels = (int(f[k.key]) for k in (schemas.HEIGHT, schemas.WIDTH,
                                                                        schemas.CHANNELS))
                    encoded = f[schemas.IMAGE.key]
                    dtype = schemas.sample_dtype(fmt, encoded.numpy()[:64])
                    if schemas.parse_raw_format(fmt) is not None:
                        image = decode.decode_raw(encoded, height, width, channels, dtype)
                    else:
                        image = decode.decode_image(encoded, channels=channels, dtype=tf.as_dtype(dtype))
                    name = f[schemas.FILENAME.key].numpy().decode("utf-8", "surrogateescape")
                    if tuple(image.shape) != (height, width, channels):
                        outcome.breaks.append(f"{name} in {shard.file}: decoded {tuple(image.shape)}, "
                                              f"the record says {(height, width, channels)}")
                    names.add(name)
                    outcome.records += 1
            except Exception as e:  # noqa: BLE001 - counted as a break of the output, with its text
                outcome.breaks.append(f"reading {shard.file} back failed: {type(e).__name__}: {str(e)[:500]}")
    return names


# --- Volumes (`--volumes`): NIfTI files and DICOM series ----------------------------------------

# A case of the volume run: its format ('nifti' or 'series'), what was done, and its files' relative paths.
VolumeCase = tuple[str, str, tuple[str, ...]]
VOLUME_FORMATS = ("nifti", "series")
# Slices of the seed series (int16, 16x16, from pydicom's CT_small.dcm; series k in the transfer
# syntax k of `mutation_seeds.SERIES_SYNTAXES`, cycling; uint8 for JPEG baseline), and what is
# done to a series: one slice (or two) damaged as a DICOM file is (`bench.mutate`: its elements,
# pixel data items and codestream), one dropped, duplicated or emptied.
_SERIES_SLICES = 4
_SERIES_OPS = ("slice", "slice", "slice", "two slices", "drop", "duplicate", "empty")


def _nifti_seeds() -> list[tuple[str, bytes]]:
    """(name, bytes) of the NIfTI-1 and NIfTI-2 files the mutations start from, written by nibabel."""
    import nibabel
    import numpy as np

    rng = np.random.default_rng(0)
    affine = np.diag([1.5, 1.5, 3.0, 1.0])
    affine[:3, 3] = (-10, -12, 4)
    stored = nibabel.Nifti1Image(rng.integers(-1000, 2000, (12, 10, 8)).astype(np.int16), affine)
    scaled = nibabel.Nifti1Image(rng.random((9, 11, 6)).astype(np.float32), affine)
    scaled.header.set_slope_inter(2.0, -1.0)
    # NIfTI-2 (64-bit dims and vox_offset, double scalings and affines): one with a qform only,
    # one with an sform and scaled uint16 voxels.
    wide = nibabel.Nifti2Image(rng.integers(-30000, 30000, (7, 9, 5)).astype(np.int32), None)
    wide.set_qform(affine, code=1)
    sformed = nibabel.Nifti2Image(rng.integers(0, 4000, (10, 8, 6)).astype(np.uint16), affine)
    sformed.header.set_slope_inter(0.5, 10.0)
    return [("int16.nii", stored.to_bytes()), ("float32.nii", scaled.to_bytes()),
            ("int32-nifti2.nii", wide.to_bytes()), ("uint16-nifti2.nii", sformed.to_bytes())]


def _series_slices(uid: str, seed: int, syntax: str = "explicit") -> list[bytes]:
    """The bytes of the seed series' slices (one series instance UID each case), in `syntax`.

    Args:
      syntax: A `mutation_seeds.SERIES_SYNTAXES` name.
    """
    import numpy as np
    import pydicom
    from pydicom.data import get_testdata_file
    from pydicom.uid import generate_uid

    rng = np.random.default_rng(seed)
    template = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    base = rng.integers(0, 2000, (16, 16), dtype=np.int16)
    out = []
    for k in range(_SERIES_SLICES):
        template.ImagePositionPatient = ["-100.0", "-100.0", f"{k * 1.25:.3f}"]
        template.ImageOrientationPatient = ["1", "0", "0", "0", "1", "0"]
        template.SeriesInstanceUID = uid
        template.SOPInstanceUID = generate_uid(entropy_srcs=[uid, str(k)])
        pixels = base + k
        if syntax == "jpeg_baseline":  # 8 bits a sample.
            pixels = (pixels // 8).astype(np.uint8)
        out.append(mutation_seeds.encoded_slice(template, pixels, syntax))
    return out


def write_volume_cases(root: pathlib.Path, cases_per_seed: int, seed: int) -> dict[str, VolumeCase]:
    """Writes the seed NIfTI files and series and damaged copies under `root/nifti/` and `root/series/`.

    NIfTI: each seed (two NIfTI-1, two NIfTI-2) and `cases_per_seed` mutations
    of it, every other one gzipped (.nii.gz) after the damage. Series: the
    seed series and `cases_per_seed` damaged ones, a folder each, each in the
    next transfer syntax of `mutation_seeds.SERIES_SYNTAXES`.

    Returns:
      The name a record of the case has (its file, or its folder) -> `VolumeCase`.
    """
    import gzip
    import random

    from pydicom.uid import generate_uid

    cases: dict[str, VolumeCase] = {}
    (root / "nifti").mkdir(parents=True, exist_ok=True)
    for name, data in _nifti_seeds():
        stem = name.rsplit(".", 1)[0]
        found = [("seed", data)] + [(m.how, m.data) for m in mutate.mutations(data, "nifti", count=cases_per_seed,
                                                                              seed=seed)]
        for k, (how, payload) in enumerate(found):
            gz = k % 2 == 1
            rel = f"nifti/{stem}-{k:04d}.nii" + (".gz" if gz else "")
            (root / rel).write_bytes(gzip.compress(payload, mtime=0) if gz else payload)
            cases[rel] = ("nifti", f"{name}: {how}" + (", gzipped" if gz else ""), (rel,))
    rng = random.Random(f"series:{seed}")
    syntaxes = list(mutation_seeds.SERIES_SYNTAXES)
    for k in range(cases_per_seed + 1):
        folder = f"series/s-{k:04d}"
        (root / folder).mkdir(parents=True, exist_ok=True)
        syntax = syntaxes[k % len(syntaxes)]
        slices = _series_slices(generate_uid(entropy_srcs=[f"mutations:{seed}:{k}"]), seed + k, syntax)
        files = {f"{folder}/i{j}.dcm": data for j, data in enumerate(slices)}
        how = f"seed ({syntax})"
        if k:
            op = rng.choice(_SERIES_OPS)
            picked = rng.sample(sorted(files), 2 if op == "two slices" else 1)
            hows = []
            for rel in picked:
                if op in ("slice", "two slices"):
                    m = next(mutate.mutations(files[rel], "dicom", count=1, seed=rng.randrange(1 << 30)))
                    files[rel] = m.data
                    hows.append(f"{rel.rsplit('/', 1)[1]}: {m.how}")
                elif op == "drop":
                    del files[rel]
                    hows.append(f"drop {rel.rsplit('/', 1)[1]}")
                elif op == "duplicate":
                    files[rel[:-4] + "b.dcm"] = files[rel]
                    hows.append(f"duplicate {rel.rsplit('/', 1)[1]}")
                else:
                    files[rel] = b""
                    hows.append(f"empty {rel.rsplit('/', 1)[1]}")
            how = f"{syntax}: " + "; ".join(hows)
        for rel, data in files.items():
            (root / rel).write_bytes(data)
        cases[folder] = ("series", how, tuple(sorted(files)))
    return cases


def convert_volume_cases(root: pathlib.Path, out: pathlib.Path, cases: dict[str, VolumeCase], *,
                         file_timeout: float, extra_args: tuple[str, ...] = (),
                         run_timeout: float = 1800) -> ConversionOutcome:
    """Converts `root` with `shardsmith convert --volumes` and checks the output against `cases`.

    The accounting, per file: rejected once with a known reason, or a file of
    a case that has a record (a series may lose a damaged slice and keep the
    rest), never a record of a case whose every file was rejected; the
    manifest counts every file. Every record reads back through
    `readers.volume_dataset_from_tfrecords`, and `shardsmith verify` passes. `outcome.written` counts cases
    with a record, `outcome.rejected` rejected files.
    """
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    cmd = [sys.executable, "-m", "shardsmith", "convert", "--volumes", "--input_dir", str(root), "--output_dir",
           str(out), "--file_timeout", f"{file_timeout:g}", *extra_args]
    result, peak, seconds = _run_sampled(cmd, run_timeout, env)
    outcome = ConversionOutcome(result.returncode, seconds, peak, stderr=result.stderr)
    outcome.noise = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(_OWN_LINES)]
    for fmt, _, _ in cases.values():
        outcome.cases[fmt] += 1
    if result.returncode not in (0, 3):
        outcome.breaks.append(f"exit status {result.returncode}: {result.stderr[-2000:]}")
        return outcome
    _account_volumes(out, cases, outcome)
    _verify(out, outcome)
    return outcome


def _account_volumes(out: pathlib.Path, cases: dict[str, VolumeCase], outcome: ConversionOutcome) -> None:
    import schemas

    case_of = {rel: name for name, (_, _, files) in cases.items() for rel in files}
    seen = _tally_rejects(out, {rel: cases[name][:2] for rel, name in case_of.items()}, outcome)
    written = _read_back_volumes(out, outcome)
    for name in sorted(written):
        if name not in cases:
            outcome.breaks.append(f"a record names no input: {name}")
            continue
        fmt, how, files = cases[name]
        outcome.written[fmt] += 1
        if all(seen[rel] for rel in files):
            outcome.breaks.append(f"written, and every file of it rejected: {name} ({how})")
    for rel, name in sorted(case_of.items()):
        if seen[rel] > 1:
            outcome.breaks.append(f"rejected {seen[rel]} times: {rel}")
        elif not seen[rel] and name not in written:
            outcome.breaks.append(f"neither written nor rejected: {rel} ({cases[name][1]})")
    manifest = json.loads((out / schemas.MANIFEST_FILENAME).read_text())
    if manifest["counts"]["found"] != len(case_of):
        outcome.breaks.append(f"the manifest found {manifest['counts']['found']} files, {len(case_of)} were written")


def _read_back_volumes(out: pathlib.Path, outcome: ConversionOutcome) -> set[str]:
    """The cases of every record (its filename up to '#series='), each volume read by the reader."""
    import readers

    manifest = json.loads((out / "volumes.json").read_text())
    names = set()
    for split in sorted(manifest["splits"]):
        try:
            ds = readers.volume_dataset_from_tfrecords(out, split, extra_features=("filename",))
            for volume, _, extra in ds:
                name = extra["filename"].numpy().decode("utf-8", "surrogateescape")
                if volume.shape.rank != 4 or min(volume.shape) < 1:  # (depth, height, width, channels)
                    outcome.breaks.append(f"{name}: read back as a volume of shape {tuple(volume.shape)}")
                names.add(name.split("#", 1)[0])
                outcome.records += 1
        except Exception as e:  # noqa: BLE001 - counted as a break of the output, with its text
            outcome.breaks.append(f"reading split {split} back failed: {type(e).__name__}: {str(e)[:500]}")
    return names


def report(outcome: ConversionOutcome, seed: int, formats=mutate.FORMATS) -> str:
    """The figures of a run, a line per format."""
    lines = [f"mutations through `shardsmith convert`: {sum(outcome.cases.values())} files, seed {seed}, "
             f"exit status {outcome.status}, {outcome.seconds:.0f} s, {outcome.records} records read back, "
             f"peak memory of the process tree {outcome.peak_rss / 2**20:.0f} MiB"]
    for fmt in formats:
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(outcome.rejected[fmt].items()))
        lines.append(f"  {fmt:6s} cases {outcome.cases[fmt]:5d}  written {outcome.written[fmt]:5d}  "
                     f"rejected: {reasons}")
    lines.append(f"  crashes {len(outcome.crashes)}, hangs {len(outcome.hangs)}, "
                 f"accounting breaks {len(outcome.breaks)}, console noise lines {len(outcome.noise)}")
    for line in (outcome.crashes + [f"HANG {h}" for h in outcome.hangs] + [f"BREAK {b}" for b in outcome.breaks]
                 + [f"NOISE {n}" for n in outcome.noise[:20]]):
        lines.append("    " + line[:400])
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000, help="damaged files in all (spread over the seed files)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--file_timeout", type=float, default=20.0)
    parser.add_argument("--volume_cases", type=int, default=300,
                        help="damaged NIfTI files and DICOM series, converted with --volumes apart (0: none)")
    parser.add_argument("--keep", help="convert into this folder (kept), not a temporary one")
    parser.add_argument("extra", nargs="*", help="more arguments for `shardsmith convert` (after --)")
    args = parser.parse_args(argv)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="shardsmith-mutations-") as tmp:
        out = pathlib.Path(args.keep) if args.keep else pathlib.Path(tmp) / "out"
        if args.cases:
            root = pathlib.Path(tmp) / "in"
            per_file = max(1, args.cases // len(mutations.seed_files()))
            cases = write_cases(root, per_file, args.seed)
            outcome = convert_cases(root, out, cases, file_timeout=args.file_timeout, extra_args=tuple(args.extra))
            outcomes.append(outcome)
            print(report(outcome, args.seed))
        if args.volume_cases:
            root = pathlib.Path(tmp) / "volumes"
            # Spread over the 4 NIfTI seeds and the series (a case per seed file or series each).
            volume_cases = write_volume_cases(root, max(1, args.volume_cases // 5), args.seed)
            outcome = convert_volume_cases(root, out.with_name(out.name + "-volumes"), volume_cases,
                                           file_timeout=args.file_timeout, extra_args=tuple(args.extra))
            outcomes.append(outcome)
            print(report(outcome, args.seed, VOLUME_FORMATS))
    return 1 if any(o.crashes or o.hangs or o.breaks or o.noise for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
