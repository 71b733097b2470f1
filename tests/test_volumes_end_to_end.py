"""DICOM series and NIfTI on disk -> `convert --volumes` on Beam's DirectRunner -> the volume reader,
compared with SimpleITK (DICOM) and nibabel (NIfTI): voxels, affines and names."""

import json

import nibabel
import numpy as np
import pydicom

import readers
from beam_jobs import convert
from conversion.volumes import read_manifest
from helpers import run_without_core_dumps
from test_imaging_volumes import read_sitk, write_series


def _run(argv):
    """`convert --volumes` through the shared pipeline; its volumes.json (written after manifest.json)."""
    convert.run(argv)
    return read_manifest(argv[argv.index("--output_dir") + 1])


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0]


def test_direct_runner_end_to_end(tmp_path):
    scans = tmp_path / "scans"
    uid_a, _ = write_series(scans / "healthy" / "p1", count=5, orientation="oblique")
    uid_b, _ = write_series(scans / "sick" / "p2" / "deep" / "er", count=4, orientation="sagittal",
                            descending=True)
    # A scout in p1 (rejected as too few), and a report without pixels.
    write_series(scans / "healthy" / "p1" / "scout", count=1, orientation="coronal", series_uid=uid_a)
    image = nibabel.Nifti1Image(np.arange(60, dtype=np.int16).reshape(3, 4, 5),
                                np.diag([-2.0, 1.5, 3.0, 1.0]))
    nibabel.save(image, scans / "sick" / "v.nii.gz")
    out = tmp_path / "out"
    manifest = _run(["--volumes", "--input_dir", str(scans), "--output_dir", str(out),
                            "--runner", "DirectRunner", "--direct_num_workers", "1"])
    assert manifest["class_names"] == ["healthy", "sick"]
    # Shards sized as every kind's (--target_shard_mb, --min_shards): the files there, each read.
    assert manifest["splits"]["train"]["records"] == 3
    assert len(list(out.glob("train-*.tfrecord"))) == manifest["splits"]["train"]["shards"]
    assert [r["reason"] for r in manifest["rejects"]] == ["too_few_slices"]
    assert json.loads((out / "volumes.json").read_text()) == manifest
    # The shared manifest reconciles: every input file is in a written volume or the rejects.
    shared = json.loads((out / "manifest.json").read_text())
    assert shared["counts"] == {"found": 11, "written": 10, "rejected": 1, "skipped": 0}
    # Its volume section: per split, volumes and their files; both reconciliations.
    section = shared["volumes"]
    assert section["splits"] == {"train": {"volumes": 3, "files": 10}}
    assert section["reconciliation"] == {
        "files": {"inputs": 11, "in_volumes": 10, "rejected": 1, "skipped": 0},
        "volumes": {"planned": 3, "written": 3, "rejected_while_decoding": 0}}
    # What the command prints says files and volumes, not images.
    from conversion.output_folder import summarize

    assert summarize(str(out)).startswith("Converted 10 files as 3 volumes into ")
    assert "Inputs 11 = 10 written + 1 rejected + 0 skipped." in summarize(str(out))

    ds = readers.volume_dataset_from_tfrecords(out, "train", dtype=None,
                                                extra_features=("volume/affine", "filename"))
    got = {e[2]["filename"].numpy().decode(): e for e in ds}
    assert sorted(got) == ["healthy/p1", "sick/p2", "sick/v.nii.gz"]
    for name, folder, uid, label in [("healthy/p1", scans / "healthy" / "p1", uid_a, 0),
                                     ("sick/p2", scans / "sick" / "p2" / "deep" / "er", uid_b, 1)]:
        volume, got_label, extras = got[name]
        want, want_affine = read_sitk(folder, uid)
        np.testing.assert_array_equal(volume.numpy()[..., 0], want)
        np.testing.assert_allclose(extras["volume/affine"].numpy(), want_affine, atol=1e-4)
        assert int(got_label) == label
    volume, label, extras = got["sick/v.nii.gz"]
    back = nibabel.load(scans / "sick" / "v.nii.gz")
    np.testing.assert_array_equal(volume.numpy()[..., 0], np.asarray(back.dataobj).transpose(2, 1, 0))
    np.testing.assert_allclose(extras["volume/affine"].numpy(), back.affine)


def test_series_are_never_split_across_splits(tmp_path):
    scans = tmp_path / "scans"
    for i in range(8):
        write_series(scans / "c" / f"p{i}", count=3)
    out = tmp_path / "out"
    manifest = _run(["--volumes", "--input_dir", str(scans), "--output_dir", str(out),
                            "--split", "train=0.5,validation=0.5", "--runner", "DirectRunner",
                            "--direct_num_workers", "1"])
    names = {}
    for split in manifest["splits"]:
        for e in readers.volume_dataset_from_tfrecords(out, split, dtype=None, extra_features=("filename",)):
            assert e[0].shape[0] == 3  # every slice of a series together
            names[e[2]["filename"].numpy().decode()] = split
    assert sorted(names) == [f"c/p{i}" for i in range(8)]
    assert set(names.values()) == {"train", "validation"}


def test_one_series_under_two_classes_is_mixed_labels(tmp_path):
    from pydicom.uid import generate_uid

    scans = tmp_path / "scans"
    uid = generate_uid()
    write_series(scans / "a" / "p", count=3, series_uid=uid)
    write_series(scans / "b" / "p", count=3, series_uid=uid)
    write_series(scans / "b" / "q", count=3)
    manifest = _run(["--volumes", "--input_dir", str(scans), "--output_dir", str(tmp_path / "out"),
                            "--runner", "DirectRunner", "--direct_num_workers", "1"])
    assert manifest["splits"]["train"]["records"] == 1
    reasons = [r["reason"] for r in manifest["rejects"]]
    assert reasons == ["mixed_labels"] * 6
    assert "'a', 'b'" in manifest["rejects"][0]["message"]
    # No identifying value of any input (UIDs, names, dates) is in any file of the dataset: records,
    # manifests, rejects (which name the series by its files, never its UID).
    identifying = set()
    for path in scans.rglob("*"):
        if path.is_file():
            ds = pydicom.dcmread(path, stop_before_pixels=True)
            identifying |= {str(ds.get(k, "")) for k in ("SeriesInstanceUID", "SOPInstanceUID", "StudyInstanceUID",
                                                         "PatientName", "PatientID", "StudyDate", "PatientBirthDate")}
    identifying = {v.encode() for v in identifying if len(v) >= 6}
    assert uid.encode() in identifying and len(identifying) > 10
    stored = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert any(p.suffix == ".tfrecord" for p in stored)
    for path in stored:
        data = path.read_bytes()
        assert not [v for v in identifying if v in data], path.name


def test_inspect_verify_preview(tmp_path, capsys):
    from PIL import Image

    from shardsmith import cli

    scans = tmp_path / "scans"
    uid, _ = write_series(scans / "c" / "p", count=5, orientation="sagittal")
    out = tmp_path / "out"
    convert.run(["--volumes", "--input_dir", str(scans), "--output_dir", str(out),
                 "--runner", "DirectRunner", "--direct_num_workers", "1"])
    capsys.readouterr()
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    # SimpleITK's orientation of the same stack, in RAS codes as nibabel names them.
    want, want_affine = read_sitk(scans / "c" / "p", uid)
    codes = "".join(nibabel.aff2axcodes(want_affine))
    assert f"c/p: int16 {want.shape}" in text and codes in text and "rejected files: 0" in text
    assert "train: 1 volumes (5 files) in 1 shard(s)" in text
    assert "inputs 5 = 5 in volumes + 0 rejected + 0 skipped; volumes 1 planned = 1 written + 0" in text
    assert cli.main(["verify", str(out)]) == 0
    assert cli.main(["preview", str(out)]) == 0
    sheet = np.asarray(Image.open(out / "preview.png").convert("RGB"))
    from schemas import tfrecord
    from schemas.volumes import VOLUME_SCHEMA
    from shardsmith import volumes

    with open(next(out.glob("train-*.tfrecord")), "rb") as f:
        record = VOLUME_SCHEMA.decode(next(tfrecord.iter_records(f))[2])
    assert record["volume/modality"] == "CT"
    planes = volumes.volume_planes(record["volume"], record["volume/spacing"], "CT")
    # The middle slice in CT's soft-tissue window (W 400, L 40 HU), at its own pixel spacing.
    middle = want[want.shape[0] // 2].astype(np.float64)
    np.testing.assert_array_equal(planes.grey[0], np.round(np.clip((middle + 160) / 400, 0, 1) * 255))
    # The sheet shows the planes in the radiological convention (the record's affine decides).
    row = volumes.render_row(volumes.volume_planes(record["volume"], record["volume/spacing"], "CT",
                                                   affine=record["volume/affine"]))
    y = next((y for y in range(sheet.shape[0] - row.shape[0] + 1)
              if (sheet[y:y + row.shape[0], 12:12 + row.shape[1]] == row).all()), None)
    assert y is not None and y > 0  # Under its caption.
    # A damaged shard fails verify.
    shard = next(out.glob("train-*.tfrecord"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert cli.main(["verify", "--output_dir", str(out)]) == 1
    # The full check (as for images): the damaged record is named, with the series it held.
    said = capsys.readouterr()
    assert f"{shard.name}: record 0 (byte 0)" in said.out + said.err and "c/p" in said.out + said.err


# A DICOM decoder that fails on a series by its SeriesDescription, registered in every process of
# the conversion (the command, its supervised child, its worker processes) by a `sitecustomize`
# module on PYTHONPATH, as a third-party decoder plugin would be: it raises, segfaults or loops.
# And pydicom's parser as if it segfaulted on one file's header (PatientID CRASH-ME), in the driver.
_FAULTY_DECODER = '''
import ctypes
import time

import pydicom
from pydicom.pixels.decoders.base import Decoder

_as_array = Decoder.as_array


def as_array(self, src, *args, **kwargs):
    kind = str(getattr(src, "SeriesDescription", "")) if hasattr(src, "get") else ""
    if kind == "RAISE":
        raise ZeroDivisionError("the decoder's own bug")  # A RuntimeError is pydicom's "cannot decode"
    if kind == "SEGV":
        ctypes.string_at(0)  # Reads address 0: SIGSEGV.
    if kind == "HANG":
        while True:
            time.sleep(0.5)
    return _as_array(self, src, *args, **kwargs)


Decoder.as_array = as_array
_read = pydicom.dcmread


def dcmread(fp, *args, **kwargs):
    data = b""
    if hasattr(fp, "getvalue"):
        data = fp.getvalue()
    elif hasattr(fp, "seek"):  # A file: the planner reads headers from open files.
        where = fp.tell()
        data = fp.read()
        fp.seek(where)
    if b"CRASH-ME" in data:
        ctypes.string_at(0)
    return _read(fp, *args, **kwargs)


pydicom.dcmread = dcmread
'''
# Far above a small series' decode on a loaded machine, yet short: the hanging series waits it out once.
_TIMEOUT = 8


def test_a_series_whose_decoder_crashes_hangs_or_raises_costs_that_series_only(tmp_path):
    """The real command: the driver supervised, each series decoded in a worker process."""
    import os
    import sys

    scans = tmp_path / "scans"
    good = ["ok/p0", "ok/p1"]
    for name in good:
        write_series(scans / name, count=3)
    faulty = {"bad/raise": "internal_error", "bad/segv": "decoder_crashed", "bad/hang": "timeout"}
    for name in faulty:
        kind = name.split("/")[1].upper()
        # RLE-compressed: a decoder decodes them (uncompressed slices are read as they lie, no decoder).
        write_series(scans / name, source="MR_small_RLE.dcm", count=3,
                     extra=lambda ds, k, kind=kind: setattr(ds, "SeriesDescription", kind))
    # One slice of a good series whose header crashes the driver's parser while planning.
    _, paths = write_series(scans / "ok" / "p2", count=4)
    crash = pydicom.dcmread(paths[0])
    crash.PatientID = "CRASH-ME"
    crash.save_as(paths[0], enforce_file_format=True)
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "sitecustomize.py").write_text(_FAULTY_DECODER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = tmp_path / "out"

    command = [sys.executable, "-m", "beam_jobs.convert", "--volumes", "--input_dir", str(scans),
               "--output_dir", str(out), "--file_timeout", str(_TIMEOUT), "--worker_processes", "2"]
    result = run_without_core_dumps(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 3, result.stderr[-3000:]
    assert "hit an error in shardsmith or a decoder" in result.stderr
    manifest = json.loads((out / "volumes.json").read_text())
    rejects = {r["path"]: r for r in manifest["rejects"]}
    crashed = str(paths[0].relative_to(scans))
    # Every file of a faulty series is rejected with its series' reason; the crashing header alone.
    by_series = {}
    for p, r in rejects.items():
        if p != crashed:
            by_series.setdefault(_folder(p), set()).add(r["reason"])
    assert by_series == {name: {reason} for name, reason in faulty.items()}
    assert len(rejects) == 3 * len(faulty) + 1 and rejects[crashed]["reason"] == "decoder_crashed"
    message = {_folder(p): r["message"] for p, r in rejects.items()}
    assert "SIGSEGV" in message["bad/segv"] and "SIGSEGV" in rejects[crashed]["message"]
    assert "ZeroDivisionError: the decoder's own bug" in message["bad/raise"]
    assert "--file_timeout=8" in message["bad/hang"]
    # rejects.jsonl says the same, as an image dataset's does.
    listed = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert {r["path"]: r["reason"] for r in listed} == {p: r["reason"] for p, r in rejects.items()}
    # Every other series was converted (p2 without its crashing slice), and reads back by name.
    ds = readers.volume_dataset_from_tfrecords(out, "train", dtype=None, extra_features=("filename",))
    depths = {e[2]["filename"].numpy().decode(): e[0].shape[0] for e in ds}
    assert depths == {"ok/p0": 3, "ok/p1": 3, "ok/p2": 3}
    assert not (out / "_shardsmith_tmp").exists()
    # Every shard damaged since: --resume mends them all and reads no faulty series again (each
    # would crash, raise or hang the mending process), so the shards are the manifest's bytes again.
    # The mend is supervised as the run was: the slice whose header crashes the planner crashes the
    # mend's first attempt too, is quarantined, and its series plans the same without it.
    before = {p.name: p.read_bytes() for p in out.glob("*.tfrecord")}
    for shard in out.glob("*.tfrecord"):
        # A flipped byte, or a byte in a shard that holds only faulty series (and is empty).
        data = bytearray(shard.read_bytes() or b"\0")
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    mended = run_without_core_dumps([*command, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert mended.returncode == 0, mended.stderr[-3000:]
    assert f"Rejected {crashed} (decoder_crashed)" in mended.stderr, mended.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in out.glob("*.tfrecord")} == before
    assert not (out / "_shardsmith_tmp").exists()


def _convert(scans, out, *args):
    return _run(["--volumes", "--input_dir", str(scans), "--output_dir", str(out), *args,
                        "--runner", "DirectRunner", "--direct_num_workers", "1", "--worker_processes", "0"])


def _names(out, split):
    ds = readers.volume_dataset_from_tfrecords(out, split, dtype=None, extra_features=("filename",))
    return {e[2]["filename"].numpy().decode(): (int(e[1]), e[0].shape[0]) for e in ds}


def test_labels_csv_names_nifti_files_and_folders_whose_every_series_takes_the_label(tmp_path):
    """No class folders: the CSV labels a patient folder (its CT and its MR) and a NIfTI file."""
    import shutil

    scans = tmp_path / "scans"
    write_series(scans / "site1" / "p1" / "ct", count=4, extra=lambda ds, k: setattr(ds, "SeriesNumber", 2))
    write_series(scans / "site1" / "p1" / "mr", count=3, orientation="sagittal",
                 extra=lambda ds, k: setattr(ds, "SeriesNumber", 5))
    write_series(scans / "site2" / "p2", count=5)
    write_series(scans / "site2" / "unlisted", count=3)
    nibabel.save(nibabel.Nifti1Image(np.arange(24, dtype=np.int16).reshape(2, 3, 4), np.eye(4)),
                 scans / "site2" / "v.nii.gz")
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\nsite1/p1,sick\nsite2/p2,healthy\nsite2/v.nii.gz,sick\nsite9/gone,sick\n")
    out = tmp_path / "out"
    manifest = _convert(scans, out, "--labels_csv", str(csv))
    assert manifest["class_names"] == ["healthy", "sick"]
    # p1's two series (one folder, two stacks), p2, and the NIfTI file; the unlisted folder skipped.
    got = _names(out, "train")
    # (A folder's series are named by their SeriesNumber.)
    assert sorted(got.items()) == [("site1/p1#series=2", (1, 4)), ("site1/p1#series=5", (1, 3)),
                                   ("site2/p2", (0, 5)), ("site2/v.nii.gz", (1, 4))]
    reasons = {}
    for r in manifest["rejects"]:
        reasons.setdefault(r["reason"], set()).add(r["path"].split("/")[1])
    assert reasons == {"no_label": {"unlisted"}, "missing_file": {"gone"}}

    # A split column puts a whole folder (both series) in its split.
    csv.write_text("path,label,split\nsite1/p1,sick,validation\nsite2/p2,healthy,train\n")
    shutil.rmtree(out)
    manifest = _convert(scans, out, "--labels_csv", str(csv))
    assert set(_names(out, "validation")) == {"site1/p1#series=2", "site1/p1#series=5"}
    assert set(_names(out, "train")) == {"site2/p2"}


def test_dedup_drops_byte_identical_series_and_keeps_the_smallest_name(tmp_path):
    import shutil

    scans = tmp_path / "scans"
    write_series(scans / "a" / "p1", count=4)
    shutil.copytree(scans / "a" / "p1", scans / "b" / "copy")  # The same series under another class.
    write_series(scans / "a" / "p2", count=4)
    _, paths = write_series(scans / "a" / "p3", count=3)
    shutil.copytree(scans / "a" / "p3", scans / "a" / "p4")
    changed = pydicom.dcmread(paths[0])  # One slice of the copy differs: another series.
    changed.PixelData = bytes(len(changed.PixelData))
    changed.save_as(scans / "a" / "p4" / paths[0].name, enforce_file_format=True)
    nibabel.save(nibabel.Nifti1Image(np.ones((2, 3, 4), np.int16), np.eye(4)), scans / "a" / "v.nii")
    shutil.copy(scans / "a" / "v.nii", scans / "b" / "w.nii")
    out = tmp_path / "out"
    manifest = _convert(scans, out, "--dedup", "--split", "train=0.5,validation=0.5")
    names = {**_names(out, "train"), **_names(out, "validation")}
    assert sorted(names) == ["a/p1", "a/p2", "a/p3", "a/p4", "a/v.nii"]
    copies = {r["path"] if r["path"].endswith(".nii") else _folder(r["path"]): r["message"]
              for r in manifest["rejects"] if r["reason"] == "duplicate"}
    assert copies == {"b/copy": "b/copy: same content as a/p1", "b/w.nii": "b/w.nii: same content as a/v.nii"}
    assert sum(r["reason"] == "duplicate" for r in manifest["rejects"]) == 4 + 1  # Each file of the copy.
    # Without --dedup both NIfTI copies are converted, and the series under two classes conflicts.
    shutil.rmtree(out)
    manifest = _convert(scans, out, "--split", "train=0.5,validation=0.5")
    assert sorted({**_names(out, "train"), **_names(out, "validation")}) == ["a/p2", "a/p3", "a/p4", "a/v.nii",
                                                                             "b/w.nii"]
    assert {r["path"].split("/")[1] for r in manifest["rejects"] if r["reason"] == "mixed_labels"} == {"p1", "copy"}


def test_a_split_whose_every_series_is_rejected_while_decoding_still_has_its_shard(tmp_path):
    """Colour slices pass planning (headers) and are rejected when decoded: validation holds none."""
    from shardsmith.volumes import verify_volumes

    scans = tmp_path / "scans"
    write_series(scans / "good", count=3)

    def colour(ds, k):
        ds.SamplesPerPixel = 3
        ds.PlanarConfiguration = 0
        ds.PhotometricInterpretation = "RGB"

    write_series(scans / "bad", count=3, extra=colour)
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label,split\ngood,a,train\nbad,b,validation\n")
    out = tmp_path / "out"
    manifest = _convert(scans, out, "--labels_csv", str(csv))
    assert manifest["splits"] == {"train": {"records": 1, "shards": 1}, "validation": {"records": 0, "shards": 1}}
    assert [(_folder(r["path"]), r["reason"]) for r in manifest["rejects"]] == [("bad", "unsupported_dtype")] * 3
    assert (out / "validation-00000-of-00001.tfrecord").stat().st_size == 0
    section = json.loads((out / "manifest.json").read_text())["volumes"]
    assert section["splits"] == {"train": {"volumes": 1, "files": 3}, "validation": {"volumes": 0, "files": 0}}
    assert section["reconciliation"]["volumes"] == {"planned": 2, "written": 1, "rejected_while_decoding": 1}
    assert section["reconciliation"]["files"] == {"inputs": 6, "in_volumes": 3, "rejected": 3, "skipped": 0}
    assert list(readers.volume_dataset_from_tfrecords(out, "validation", dtype=None)) == []
    assert verify_volumes(str(out)) == []


def test_resume_goes_on_from_written_shards_and_mends_a_damaged_one(tmp_path):
    """--resume through the shared pipeline: a finished volume dataset whose shard was damaged since is
    mended from its sources (the manifest's bytes again); the reader then reads every volume."""
    scans = tmp_path / "scans"
    write_series(scans / "c" / "p0", count=3)
    write_series(scans / "c" / "p1", count=4, orientation="sagittal")
    out = tmp_path / "out"
    args = ["--volumes", "--input_dir", str(scans), "--output_dir", str(out), "--runner", "DirectRunner",
            "--worker_processes", "0"]
    _run(args)
    before = {p.name: p.read_bytes() for p in out.glob("*.tfrecord")}
    shard = sorted(out.glob("train-*.tfrecord"))[-1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert convert.main([*args, "--resume"]) == 0
    assert {p.name: p.read_bytes() for p in out.glob("*.tfrecord")} == before
    assert sorted(_names(out, "train")) == ["c/p0", "c/p1"]
    assert (out / "volumes.json").exists()


def test_every_odd_series_is_explained_and_every_file_accounted_for(tmp_path):
    """An enhanced multi-frame file, a mosaic, a report, a missing slice, conflicting slices, two time
    points and a copied slice through `convert --volumes`: each file in a written volume or in the
    rejects with its reason, once."""
    import shutil

    from pydicom.data import get_testdata_file
    from pydicom.uid import generate_uid

    from test_imaging_volumes import write_enhanced

    scans = tmp_path / "scans"
    ds, order = write_enhanced(scans / "c" / "enh" / "IM0001")
    mosaic = pydicom.dcmread(get_testdata_file("MR_small.dcm"))
    mosaic.ImageType = ["ORIGINAL", "PRIMARY", "M", "ND", "MOSAIC"]
    (scans / "c" / "mosaic").mkdir(parents=True)
    mosaic.save_as(scans / "c" / "mosaic" / "m", enforce_file_format=True)
    report = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    del report.PixelData
    (scans / "c" / "report").mkdir(parents=True)
    report.save_as(scans / "c" / "report" / "sr", enforce_file_format=True)
    write_series(scans / "c" / "gap", count=6, skip=(3,))
    _, paths = write_series(scans / "c" / "conflict", count=4)
    other = pydicom.dcmread(paths[1])
    other.PixelData = (other.pixel_array + 1).astype(other.pixel_array.dtype).tobytes()
    other.SOPInstanceUID = generate_uid()
    other.save_as(scans / "c" / "conflict" / "other", enforce_file_format=True)
    uid, _ = write_series(scans / "c" / "fmri", count=3)
    write_series(scans / "c" / "fmri" / "t2", count=3, series_uid=uid,
                 extra=lambda ds, k: setattr(ds, "PixelData", (ds.pixel_array + 7).tobytes()))
    uid, paths = write_series(scans / "c" / "dup", count=4)
    shutil.copy(paths[0], scans / "c" / "dup" / "copy")
    out = tmp_path / "out"
    manifest = _run(["--volumes", "--input_dir", str(scans), "--output_dir", str(out),
                     "--runner", "DirectRunner", "--direct_num_workers", "1"])

    files = sorted(str(p.relative_to(scans)) for p in scans.rglob("*") if p.is_file())
    rejected = [r["path"] for r in manifest["rejects"]]
    assert len(rejected) == len(set(rejected))  # each file once
    reason = {r["path"]: r["reason"] for r in manifest["rejects"]}
    assert reason.pop("c/mosaic/m") == "mosaic"
    assert reason.pop("c/report/sr") == "no_pixel_data"
    # The copy and its original: the smaller name is kept, the other is the duplicate.
    (copy,) = [p for p, why in reason.items() if why == "duplicate"]
    assert copy == max("c/dup/copy", str(paths[0].relative_to(scans)))
    reason.pop(copy)
    by_folder = {}
    for path, why in reason.items():
        by_folder.setdefault(path.split("/")[1], set()).add(why)
    assert by_folder == {"gap": {"missing_slice"}, "conflict": {"conflicting_slices"},
                         "fmri": {"repeated_positions"}}
    written = [f for f in files if f not in rejected]
    assert sorted({f.split("/")[1] for f in written}) == ["dup", "enh"] and len(written) == 5
    shared = json.loads((out / "manifest.json").read_text())
    assert shared["counts"]["found"] == len(files) == 24
    assert shared["counts"]["written"] == len(written)
    assert shared["counts"]["rejected"] + shared["counts"]["skipped"] == len(rejected)
    assert shared["volumes"]["reconciliation"]["volumes"] == {"planned": 2, "written": 2, "rejected_while_decoding": 0}
    # The enhanced file is one volume, its frames sorted by position; the copy is noted on its volume.
    got = {e[2]["filename"].numpy().decode(): e for e in readers.volume_dataset_from_tfrecords(
        out, "train", dtype=None, extra_features=("filename", "volume/spacing"))}
    assert sorted(got) == ["c/dup", "c/enh"]
    volume = got["c/enh"][0].numpy()[..., 0]
    np.testing.assert_array_equal(volume[2], ds.pixel_array[order.index(2)] - 1024)
    np.testing.assert_allclose(got["c/enh"][2]["volume/spacing"].numpy()[0], 3.0, rtol=1e-6)
    notes = [json.loads(line) for line in (out / "normalized.jsonl").read_text().splitlines()]
    assert any(n["path"] == "c/dup" and copy in json.dumps(n) for n in notes)


def test_verify_checks_a_volume_dataset_and_names_a_damaged_volume(tmp_path):
    """`shardsmith verify` on a --volumes dataset: every record parsed, its voxels filling its shape;
    a flipped byte in a volume is found, with the series it held (it raised on the volume schema)."""
    import schemas
    from beam_jobs import verify

    scans = tmp_path / "scans"
    write_series(scans / "c" / "p0", count=3)
    write_series(scans / "c" / "p1", count=4)
    nibabel.save(nibabel.Nifti1Image(np.arange(24, dtype=np.int16).reshape(2, 3, 4), np.eye(4)), scans / "c" / "v.nii")
    out = tmp_path / "out"
    _convert(scans, out, "--num_shards", "1")
    assert verify.main([str(out)]) == 0
    [shard] = sorted(out.glob("*.tfrecord"))
    index = [tuple(map(int, line.split())) for line in shard.with_suffix(".idx").read_text().splitlines()]
    assert len(index) == 3
    offset, length = index[1]
    data = bytearray(shard.read_bytes())
    data[offset + length // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert verify.main([str(out)]) == 1
    problems = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())["problems"]
    assert any(p.startswith(f"{shard.name}: record 1 (byte {offset}): bad data CRC; source file lost: ")
               and p.endswith("(read from the damaged record)") for p in problems), problems
    assert any("1 later record(s) hold and were checked" in p for p in problems), problems
