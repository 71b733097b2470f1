"""`convert --volumes --group_by` (and `--time_series --group_by regex:`) on Beam's DirectRunner: every
series of one patient in one split, the manifest's hashed groups, the volume's mask beside it, a held
patient's new series in its split after `--append`, and the refusals that remain.

DICOM series are written with pydicom (from pydicom's CT_small, `test_imaging_volumes.write_series`),
NIfTI files with nibabel, masks with SimpleITK on the series' grid, rasters with GDAL.
"""

from __future__ import annotations

import hashlib
import json

import nibabel
import numpy as np
import pytest

import readers
import schemas
from conversion.plan import hash_split
from helpers import convert, write_geotiff
from test_imaging_volumes import write_series

RUN = ("--runner", "DirectRunner", "--direct_num_workers", "1", "--min_shards", "1")
# Patient of each series folder: the folders' names say nothing of it (the hash of a folder would part them).
PATIENTS = {"s0": "PAT-ANNA", "s1": "PAT-BERT", "s2": "PAT-ANNA", "s3": "PAT-CARL", "s4": "PAT-BERT",
            "s5": "PAT-DORA", "s6": "PAT-CARL", "s7": "PAT-DORA"}


def _patient(pid):
    """`write_series`' `extra`: every slice of the series says PatientID `pid` (None: deletes it)."""
    def extra(ds, k):
        if pid is None:
            if "PatientID" in ds:
                del ds.PatientID
        else:
            ds.PatientID = pid(k) if callable(pid) else pid
    return extra


def _group_id(seed, value):
    """The manifest's stored form of a group value (docs/preparing/output.md): no identifier is stored."""
    return hashlib.sha256(f"{seed}\0{value}".encode()).hexdigest()[:16]


def _splits(out, manifest, **reading) -> dict[str, str]:
    """Record filename -> its split, read back by the volume reader."""
    got = {}
    for split, info in manifest.splits.items():
        if not info.num_records:
            continue
        ds = readers.volume_dataset_from_tfrecords(out, split, dtype=None, extra_features=("filename",), **reading)
        for e in ds:
            got[e[-1]["filename"].numpy().decode()] = split
    return got


@pytest.fixture(scope="module")
def patients(tmp_path_factory):
    """Eight series folders of four patients (two each, under two classes), the patient in the headers only."""
    scans = tmp_path_factory.mktemp("patients")
    for i, (folder, pid) in enumerate(sorted(PATIENTS.items())):
        write_series(scans / ("ct" if i % 2 else "pet") / folder, count=3, extra=_patient(pid))
    return scans


# Seeds whose hash of the series folders would part PAT-ANNA's two series (pet/s0, pet/s2).
@pytest.mark.parametrize("seed, split", [
    (2, "train=0.5,validation=0.5"), (6, "train=0.6,validation=0.2,test=0.2"),
])
def test_every_series_of_a_patient_lies_in_one_split(patients, tmp_path, seed, split):
    out = tmp_path / "out"
    ratios = dict((k, float(v)) for k, v in (part.split("=") for part in split.split(",")))
    manifest = convert(patients, out, "--volumes", "--group_by", "dicom:PatientID", "--split", split,
                       "--seed", seed, *RUN)
    got = _splits(out, manifest)
    assert sorted(got) == sorted(f"{'ct' if i % 2 else 'pet'}/{f}" for i, f in enumerate(sorted(PATIENTS)))
    by_patient = {}
    for name, split_name in got.items():
        by_patient.setdefault(PATIENTS[name.split("/")[1]], set()).add(split_name)
    # One split per patient: the one an image of that patient gets (the hash of its group).
    assert by_patient == {pid: {hash_split(seed, "group:" + pid, ratios)} for pid in set(PATIENTS.values())}
    groups = manifest.extra["groups"]
    assert groups["by"] == "dicom:PatientID"
    assert hash_split(seed, "pet/s0", ratios) != hash_split(seed, "pet/s2", ratios)
    assert {s: g["sha256_16"] for s, g in groups["per_split"].items()} == {
        s: sorted({_group_id(seed, pid) for pid, splits in by_patient.items() if s in splits})
        for s in manifest.splits}
    assert len(manifest.splits) >= 2
    assert sum(g["count"] for g in groups["per_split"].values()) == 4
    # No PatientID in any file of the dataset (records, manifests, notes): only their hashes.
    for path in out.rglob("*"):
        if path.is_file():
            assert not any(pid.encode() in path.read_bytes() for pid in PATIENTS.values()), path


def test_a_series_without_the_keyword_is_its_own_group_and_one_whose_files_disagree_takes_most(tmp_path):
    scans, out = tmp_path / "scans", tmp_path / "out"
    for i in range(6):
        write_series(scans / "ct" / f"a{i}", count=3, extra=_patient("PAT-ANNA"))
    write_series(scans / "ct" / "anon", count=3, extra=_patient(None))
    # Two of its three files say PAT-ANNA, one another patient: grouped with PAT-ANNA, and noted.
    write_series(scans / "ct" / "mixed", count=3, extra=_patient(lambda k: "PAT-ZED" if k == 1 else "PAT-ANNA"))
    ratios = {"train": 0.5, "validation": 0.5}
    # A seed where the series without a PatientID, split by its folder, lands away from PAT-ANNA.
    seed = next(s for s in range(100) if hash_split(s, "ct/anon", ratios) != hash_split(s, "group:PAT-ANNA", ratios))
    manifest = convert(scans, out, "--volumes", "--group_by", "dicom:PatientID", "--split",
                       "train=0.5,validation=0.5", "--seed", seed, *RUN)
    got = _splits(out, manifest)
    anna = hash_split(seed, "group:PAT-ANNA", ratios)
    assert {got[f"ct/a{i}"] for i in range(6)} == {got["ct/mixed"]} == {anna}
    assert got["ct/anon"] == hash_split(seed, "ct/anon", ratios) != anna  # As without --group_by.
    assert manifest.counts["rejected"] == 0
    per_split = manifest.extra["groups"]["per_split"]
    assert per_split[anna]["sha256_16"] == [_group_id(seed, "PAT-ANNA")]
    assert sum(g["count"] for g in per_split.values()) == 1
    # The disagreement is noted (how many files, never the values) with the volume's other notes.
    notes = json.loads((out / schemas.MANIFEST_FILENAME).read_text())["volumes"]["notes"]
    assert notes["ct/mixed"] == ["--group_by dicom:PatientID: grouped by the value 2 of its 3 files give; "
                                 "1 give another"]
    normalized = [json.loads(line) for line in (out / "normalized.jsonl").read_text().splitlines()]
    assert [n["path"] for n in normalized] == ["ct/mixed"]
    assert b"PAT-ZED" not in (out / "normalized.jsonl").read_bytes()


def _nifti(path, seed):
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.random.default_rng(seed).integers(-500, 1500, (4, 5, 6)).astype(np.int16)
    nibabel.save(nibabel.Nifti1Image(data, np.diag([1.5, 1.0, 2.0, 1.0])), path)


def test_regex_groups_nifti_files_by_their_paths_and_dicom_keywords_are_refused_on_them(tmp_path):
    scans, out = tmp_path / "scans", tmp_path / "out"
    for case in range(6):
        for i, modality in enumerate(("t1", "t2", "flair")):
            _nifti(scans / ("tumour" if case % 2 else "healthy") / f"case_{case:03d}_{modality}.nii.gz",
                   10 * case + i)
    manifest = convert(scans, out, "--volumes", "--group_by", "regex:(case_[0-9]+)_", "--split",
                       "train=0.5,validation=0.5", "--seed", 4, *RUN)
    got = _splits(out, manifest)
    assert len(got) == 18
    by_case = {}
    for name, split in got.items():
        by_case.setdefault(name.split("/")[1][:8], set()).add(split)
    assert by_case == {f"case_{c:03d}": {hash_split(4, "group:" + f"case_{c:03d}", {"train": 0.5, "validation": 0.5})}
                       for c in range(6)}
    assert sum(g["count"] for g in manifest.extra["groups"]["per_split"].values()) == 6
    # A NIfTI file has no DICOM header: dicom:KEYWORD on NIfTI files alone would group nothing.
    with pytest.raises(ValueError) as caught:
        convert(scans, tmp_path / "other", "--volumes", "--group_by", "dicom:PatientID", "--split",
                "train=0.5,validation=0.5", *RUN)
    assert str(caught.value).startswith(
        "--group_by dicom:PatientID reads each series' DICOM headers, and every volume here is a NIfTI file (18), "
        "which has none: group them by their paths with --group_by regex:PATTERN")
    assert not (tmp_path / "other" / schemas.MANIFEST_FILENAME).exists()


def _label_of(folder):
    """A label volume (NIfTI) on a written series' grid, as SimpleITK reads the series."""
    import SimpleITK as sitk

    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(folder)))
    image = reader.Execute()
    ids = np.zeros(sitk.GetArrayFromImage(image).shape, np.uint8)
    ids[:, 2:6, 3:9] = 1
    label = sitk.GetImageFromArray(ids)
    label.CopyInformation(image)
    return label


@pytest.mark.parametrize("seed", [5])
def test_a_volumes_mask_goes_with_it_to_its_patients_split(tmp_path, seed):
    """Case folders with masks (no classes: split by the top folder without --group_by): by the patient with it."""
    import SimpleITK as sitk

    scans, masks, out = tmp_path / "scans", tmp_path / "masks", tmp_path / "out"
    masks.mkdir()
    cases = {f"case{i}": f"PAT-{'AB'[i % 2]}" for i in range(6)}
    for case, pid in cases.items():
        write_series(scans / case, count=3, extra=_patient(pid))
        sitk.WriteImage(_label_of(scans / case), str(masks / f"{case}.nii.gz"))
    manifest = convert(scans, out, "--volumes", "--masks_dir", masks, "--group_by", "dicom:PatientID",
                       "--split", "train=0.5,validation=0.5", "--seed", seed, *RUN)
    assert manifest.counts["rejected"] == 0
    got = {}
    for split, info in manifest.splits.items():
        if info.num_records:
            ds = readers.volume_dataset_from_tfrecords(out, split, dtype=None, label_mode="mask",
                                                       extra_features=("filename",))
            for volume, mask, extras in ds:
                assert volume.shape == mask.shape and int(mask.numpy().sum()) == 3 * 4 * 6
                got[extras["filename"].numpy().decode()] = split
    ratios = {"train": 0.5, "validation": 0.5}
    assert got == {case: hash_split(seed, "group:" + pid, ratios) for case, pid in cases.items()}
    assert manifest.extra["groups"]["by"] == "dicom:PatientID"


def test_append_puts_a_held_patients_new_series_in_its_split(tmp_path):
    scans, out = tmp_path / "scans", tmp_path / "out"
    flags = ("--volumes", "--group_by", "dicom:PatientID", "--split", "train=0.5,validation=0.5", *RUN)
    pids = [f"PAT-{i}" for i in range(6)]
    for i, pid in enumerate(pids):
        write_series(scans / "ct" / f"first{i}", count=3, extra=_patient(pid))
    first = convert(scans, out, *flags)
    held = _splits(out, first)
    for i, pid in enumerate(pids):  # A second series of every patient, in folders hashed anywhere.
        write_series(scans / "ct" / f"second{i}", count=3, extra=_patient(pid))
    grown = convert(scans, out, *flags, "--append")
    got = _splits(out, grown)
    assert {name: got[name] for name in held} == held
    for i in range(6):
        assert got[f"ct/second{i}"] == held[f"ct/first{i}"]
    assert grown.extra["groups"]["per_split"] == first.extra["groups"]["per_split"]


def _stack_values(seed):
    return np.random.default_rng(seed).integers(1, 30000, size=(2, 12, 10)).astype("uint16")


def test_time_series_locations_of_one_tile_lie_in_one_split(tmp_path):
    pytest.importorskip("rasterio")
    root, out = tmp_path / "in", tmp_path / "out"
    tiles = ["T31TFJ", "T32ULU", "T33UXP", "T30TWT"]
    for t, tile in enumerate(tiles):
        for field in range(3):
            for d, date in enumerate(("2020-05-14", "2020-06-04")):
                write_geotiff(root / "crops" / f"{tile}_field{field}" / f"{date}.tif",
                              _stack_values(100 * t + 10 * field + d))
    # Patches of 8 of the 12x10 locations: each location's work items follow its split.
    manifest = convert(root, out, "--time_series", "--group_by", "regex:(T[0-9]{2}[A-Z]{3})_", "--split",
                       "train=0.5,validation=0.5", "--seed", 2, "--raster_patch", "8", *RUN)
    from schemas.tfrecord import iter_records

    schema = schemas.TimeSeriesExampleSchema.from_json(manifest.features)
    by_tile = {}
    for split, info in manifest.splits.items():
        for shard in info.shards:
            with open(out / shard.file, "rb") as f:
                for _, _, payload in iter_records(f):
                    name = schema.decode(payload)["filename"]
                    name = name.decode() if isinstance(name, bytes) else name
                    by_tile.setdefault(name.split("/")[1][:6], set()).add(split)
    assert by_tile == {tile: {hash_split(2, "group:" + tile, {"train": 0.5, "validation": 0.5})} for tile in tiles}
    assert sum(g["count"] for g in manifest.extra["groups"]["per_split"].values()) == 4
