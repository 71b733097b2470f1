"""Labels and splits of volumes with masks (--volumes --masks_dir), on Beam's DirectRunner.

The structural rule images with masks follow (docs/preparing/masks.md, "Layout and labels"),
volume-shaped: class folders only when every volume lies at ROOT/<class>/<volume> (a NIfTI
file, or a series folder holding its DICOM files) with two classes or more; else label -1, no
class names, and a DICOM series' split drawn by its top folder (a TCIA patient). Volumes are
written by nibabel and pydicom, masks by nibabel and SimpleITK.
"""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk

import readers
from beam_jobs import convert
from test_imaging_volumes import write_series

AFFINE = np.array([[-0.8, 0, 0, 41.0], [0, -0.9, 0, 33.5], [0, 0, 2.5, -20.0], [0, 0, 0, 1]])
SHAPE = (6, 5, 4)


def _nifti_case(image_path, mask_path):
    """A small NIfTI volume and its label volume on the same grid."""
    image_path.parent.mkdir(parents=True, exist_ok=True)
    mask_path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(np.arange(np.prod(SHAPE), dtype=np.int16).reshape(SHAPE), AFFINE), image_path)
    labels = np.zeros(SHAPE, np.uint8)
    labels[1:4, 1:3, 1:3] = 1
    nib.save(nib.Nifti1Image(labels, AFFINE), mask_path)


def _series_case(folder, mask_path, count=3):
    """A DICOM series in `folder` and a SimpleITK label volume on its grid at `mask_path`."""
    uid = write_series(folder, count=count)[0]
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(folder), uid))
    image = reader.Execute()
    labels = np.zeros(tuple(reversed(image.GetSize())), np.uint8)
    labels[:, 10:20, 10:30] = 1
    label = sitk.GetImageFromArray(labels)
    label.CopyInformation(image)
    mask_path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(label, str(mask_path))


def _convert(scans, masks, out, *more):
    convert.run(["--volumes", "--input_dir", str(scans), "--masks_dir", str(masks), *more,
                 "--output_dir", str(out), "--runner", "DirectRunner", "--direct_num_workers", "1"])
    return json.loads((out / "manifest.json").read_text())


def _labels(out, manifest):
    """filename -> (label, split) of every stored volume, read back by the reader."""
    got = {}
    for split in manifest["splits"]:
        ds = readers.volume_dataset_from_tfrecords(out, split, dtype=None, extra_features=("filename",))
        got.update({e["filename"].numpy().decode(): (int(label), split) for _, label, e in ds})
    return got


def test_a_tcia_tree_with_masks_has_no_classes_and_keeps_each_patient_in_one_split(tmp_path, caplog):
    """ROOT/<patient>/<study>/<series>/<file>: the patients are no classes; their studies share a split."""
    scans, masks = tmp_path / "tcia", tmp_path / "masks"
    patients = [f"LIDC-{p:04d}" for p in range(8)]
    for patient in patients:
        for study in ("01-01-2000-CT", "02-02-2001-CT"):
            # A NIfTI mask of a series is named by its volume: MASKS/<patient>/<study>.nii.gz.
            _series_case(scans / patient / study / "3.000000-CT-1", masks / patient / f"{study}.nii.gz")
    out = tmp_path / "out"
    with caplog.at_level("INFO", logger="shardsmith.convert"):
        manifest = _convert(scans, masks, out, "--split", "train=0.5,validation=0.5", "--seed", "1")
    # The log says which rule applies, and why.
    assert ("No volume labels (label -1, class_names []): LIDC-0000/01-01-2000-CT is not at "
            "ROOT/<class>/<volume>") in caplog.text
    assert manifest["counts"] == {"found": 48, "written": 48, "rejected": 0, "skipped": 0}  # In files.
    assert manifest["class_names"] == []
    got = _labels(out, manifest)
    assert len(got) == 16 and {label for label, _ in got.values()} == {-1}
    split_of = {}
    for name, (_, split) in got.items():
        split_of.setdefault(name.split("/")[0], set()).add(split)
    assert sorted(split_of) == patients
    assert all(len(splits) == 1 for splits in split_of.values()), split_of  # No patient in two splits.
    assert {s for splits in split_of.values() for s in splits} == {"train", "validation"}
    volumes_json = json.loads((out / "volumes.json").read_text())
    assert volumes_json["class_names"] == []


def test_a_flat_decathlon_folder_has_no_classes(tmp_path):
    scans, masks = tmp_path / "imagesTr", tmp_path / "labelsTr"
    for case in range(4):
        _nifti_case(scans / f"la_00{case}_0000.nii.gz", masks / f"la_00{case}.nii.gz")
    out = tmp_path / "out"
    manifest = _convert(scans, masks, out, "--mask_suffix", "_0000:")
    assert manifest["counts"]["written"] == 4 and manifest["class_names"] == []
    assert {label for label, _ in _labels(out, manifest).values()} == {-1}


@pytest.mark.parametrize("layout, class_names", [
    # ROOT/<class>/<file>.nii.gz, two classes: labelled.
    (("liver/a.nii.gz", "liver/b.nii.gz", "kidney/c.nii.gz"), ["kidney", "liver"]),
    # One class folder only (nnU-Net's imagesTr under a root): no classes.
    (("imagesTr/a.nii.gz", "imagesTr/b.nii.gz"), []),
    # One volume a folder deeper: the first folders are no classes.
    (("liver/a.nii.gz", "kidney/sub/c.nii.gz"), []),
    # A NIfTI file directly under ROOT beside class folders: no classes.
    (("liver/a.nii.gz", "kidney/c.nii.gz", "d.nii.gz"), []),
])
def test_nifti_class_folders_only_when_every_volume_is_root_class_volume(tmp_path, layout, class_names):
    scans, masks = tmp_path / "scans", tmp_path / "masks"
    for rel in layout:
        _nifti_case(scans / rel, masks / rel)
    out = tmp_path / "out"
    manifest = _convert(scans, masks, out)
    assert manifest["counts"]["written"] == len(layout) and manifest["class_names"] == class_names
    want = {rel: class_names.index(rel.split("/")[0]) if class_names else -1 for rel in layout}
    assert {name: label for name, (label, _) in _labels(out, manifest).items()} == want


def test_dicom_series_in_class_folders_with_masks_keep_their_classes(tmp_path):
    """ROOT/<class>/<series>/<file> with two classes: labelled; files a folder deeper would not be."""
    scans, masks = tmp_path / "scans", tmp_path / "masks"
    for cls, series in (("ct", "p1"), ("ct", "p2"), ("mr", "p3")):
        _series_case(scans / cls / series, masks / cls / f"{series}.nii.gz")
    out = tmp_path / "out"
    manifest = _convert(scans, masks, out)
    assert manifest["class_names"] == ["ct", "mr"]
    assert {n: label for n, (label, _) in _labels(out, manifest).items()} == {"ct/p1": 0, "ct/p2": 0, "mr/p3": 1}


def test_labels_csv_still_labels_volumes_with_masks(tmp_path):
    scans, masks = tmp_path / "scans", tmp_path / "masks"
    for rel in ("P1/a.nii.gz", "P2/b.nii.gz"):
        _nifti_case(scans / rel, masks / rel)
    (tmp_path / "labels.csv").write_text("path,label\nP1,tumour\nP2,healthy\n")
    out = tmp_path / "out"
    manifest = _convert(scans, masks, out, "--labels_csv", str(tmp_path / "labels.csv"))
    assert manifest["class_names"] == ["healthy", "tumour"]
    assert {n: label for n, (label, _) in _labels(out, manifest).items()} == {"P1/a.nii.gz": 1, "P2/b.nii.gz": 0}


def _decathlon_names(masks):
    (masks.parent / "dataset.json").write_text(json.dumps({"labels": {"0": "background", "1": "atrium"}}))


def test_append_to_a_decathlon_folder_keeps_its_names_and_holds_its_volumes(tmp_path):
    scans, masks = tmp_path / "task" / "imagesTr", tmp_path / "task" / "labelsTr"
    for case in range(4):
        _nifti_case(scans / f"la_00{case}_0000.nii.gz", masks / f"la_00{case}.nii.gz")
    _decathlon_names(masks)
    out = tmp_path / "out"
    first = _convert(scans, masks, out, "--mask_suffix", "_0000:", "--split", "train=0.5,validation=0.5")
    assert first["targets"]["mask"]["class_names"] == ["background", "atrium"]
    before = _labels(out, first)
    for case in (4, 5):
        _nifti_case(scans / f"la_00{case}_0000.nii.gz", masks / f"la_00{case}.nii.gz")
    grown = _convert(scans, masks, out, "--mask_suffix", "_0000:", "--split", "train=0.5,validation=0.5", "--append")
    inputs = grown["versions"][-1]["inputs"]
    assert inputs["held"] == 4 and inputs["new"] == 2  # Held NIfTI files (flat, no class) are not read again.
    assert grown["targets"]["mask"]["class_names"] == ["background", "atrium"] and grown["class_names"] == []
    after = _labels(out, grown)
    assert len(after) == 6 and {label for label, _ in after.values()} == {-1}
    assert {name: after[name] for name in before} == before


def test_append_of_masks_that_need_uint16_to_a_uint8_dataset_is_refused(tmp_path):
    scans, masks = tmp_path / "imagesTr", tmp_path / "labelsTr"
    _nifti_case(scans / "a.nii.gz", masks / "a.nii.gz")
    out = tmp_path / "out"
    assert _convert(scans, masks, out)["targets"]["mask"]["dtype"] == "uint8"
    _nifti_case(scans / "b.nii.gz", masks / "b.nii.gz")
    labels = np.zeros(SHAPE, np.int16)
    labels[0, 0, 0] = 300
    nib.save(nib.Nifti1Image(labels, AFFINE), masks / "b.nii.gz")
    with pytest.raises(ValueError, match="need uint16.*--overwrite"):
        _convert(scans, masks, out, "--append")
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest.get("versions") or [1]) == 1 and manifest["targets"]["mask"]["dtype"] == "uint8"


def test_append_keeps_the_dataset_s_labels_rule(tmp_path):
    """New volumes follow the held dataset's rule, whatever layout they alone would show."""
    # Held with class folders: a new class comes at the end; a new volume a folder deeper is no_label.
    scans, masks = tmp_path / "scans", tmp_path / "masks"
    for rel in ("liver/a.nii.gz", "kidney/b.nii.gz"):
        _nifti_case(scans / rel, masks / rel)
    out = tmp_path / "out"
    assert _convert(scans, masks, out)["class_names"] == ["kidney", "liver"]
    for rel in ("spleen/c.nii.gz", "liver/deep/d.nii.gz"):
        _nifti_case(scans / rel, masks / rel)
    grown = _convert(scans, masks, out, "--append")
    assert grown["class_names"] == ["kidney", "liver", "spleen"]
    assert {n: label for n, (label, _) in _labels(out, grown).items()} == {
        "liver/a.nii.gz": 1, "kidney/b.nii.gz": 0, "spleen/c.nii.gz": 2}
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(r["path"], r["reason"]) for r in rejects] == [("liver/deep/d.nii.gz", "no_label")]
    # Held without classes: new volumes in two class-like folders stay without a class.
    scans, masks = tmp_path / "flat", tmp_path / "flat_masks"
    _nifti_case(scans / "x.nii.gz", masks / "x.nii.gz")
    out = tmp_path / "out_flat"
    assert _convert(scans, masks, out)["class_names"] == []
    for rel in ("liver/a.nii.gz", "kidney/b.nii.gz"):
        _nifti_case(scans / rel, masks / rel)
    grown = _convert(scans, masks, out, "--append")
    assert grown["class_names"] == []
    assert {label for label, _ in _labels(out, grown).values()} == {-1} and len(_labels(out, grown)) == 3
