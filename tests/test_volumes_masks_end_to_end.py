"""Segmentation masks of volumes (--volumes --masks_dir) on Beam's DirectRunner, read back with label_mode="mask".

Images and label volumes are written by nibabel, pydicom, SimpleITK and
dcm2niix; each label voxel's class is a function of its RAS position
(`_class_at`), so the truth of any stored or read voxel is computed from its
own affine, independently of how shardsmith placed it.
"""

from __future__ import annotations

import importlib
import json
import subprocess

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk

import readers
from beam_jobs import convert
from test_imaging_volumes import DCM2NIIX, write_series


def _class_at(world: np.ndarray) -> np.ndarray:
    """The class id of RAS positions [3, n]: bands of a few mm along each axis (offsets keep centres off edges)."""
    x, y, z = world[:3]
    return ((np.floor((x + 0.123) / 2.3) + 2 * np.floor((y + 0.31) / 2.1) + np.floor((z + 0.7) / 3.3)) % 4).astype(
        np.int64)


def _clear_of_edges(shape_dhw, affine) -> np.ndarray:
    """[k, j, i]: voxels whose centre lies more than 1e-3 mm from a band's edge (two writers' float
    geometry cannot put those on different sides)."""
    ijk = np.indices(tuple(reversed(shape_dhw))).reshape(3, -1)
    x, y, z = (affine @ np.vstack([ijk, np.ones(ijk.shape[1])]))[:3]
    clear = np.ones(x.shape, bool)
    for v, offset, width in ((x, 0.123, 2.3), (y, 0.31, 2.1), (z, 0.7, 3.3)):
        u = (v + offset) / width
        clear &= np.abs(u - np.round(u)) * width > 1e-3
    return clear.reshape(tuple(reversed(shape_dhw))).transpose(2, 1, 0)


def _labels_on(shape_ijk, affine) -> np.ndarray:
    """The label volume of a grid, indexed (i, j, k) as NIfTI is."""
    ijk = np.indices(shape_ijk).reshape(3, -1)
    world = affine @ np.vstack([ijk, np.ones(ijk.shape[1])])
    return _class_at(world).reshape(shape_ijk)


def _truth_of(shape_dhw, affine) -> np.ndarray:
    """What a stored mask of a grid must hold, [k, j, i]."""
    return _labels_on(tuple(reversed(shape_dhw)), affine).transpose(2, 1, 0)


def _save(values, affine, path, dtype):
    values = np.asarray(values).astype(dtype)
    image = nib.Nifti1Image(values, affine, dtype=values.dtype)
    image.set_sform(affine, code=1)
    image.set_qform(affine, code=1)
    nib.save(image, path)


IMAGE_AFFINE = np.array([[-0.8, 0, 0, 41.0], [0, -0.9, 0, 33.5], [0, 0, 2.5, -20.0], [0, 0, 0, 1]])
SHAPE_IJK = (9, 8, 5)


def _decathlon(root):
    """A Medical Segmentation Decathlon task: imagesTr/<case>_0000.nii.gz, labelsTr/<case>.nii.gz."""
    images, labels = root / "imagesTr", root / "labelsTr"
    images.mkdir(parents=True)
    labels.mkdir()
    rng = np.random.default_rng(5)
    for case in range(7):
        _save(rng.integers(-500, 500, SHAPE_IJK), IMAGE_AFFINE, images / f"la_00{case}_0000.nii.gz", np.int16)
    truth = _labels_on(SHAPE_IJK, IMAGE_AFFINE)
    _save(truth, IMAGE_AFFINE, labels / "la_000.nii.gz", np.uint8)  # The same grid.
    canonical = nib.as_closest_canonical(nib.Nifti1Image(truth.astype(np.uint8), IMAGE_AFFINE))
    nib.save(canonical, labels / "la_001.nii.gz")  # Saved RAS by another tool: i and j flipped.
    permuted = IMAGE_AFFINE[:, [2, 0, 1, 3]]  # Axes (k, i, j), float labels.
    _save(truth.transpose(2, 0, 1), permuted, labels / "la_002.nii.gz", np.float32)
    shifted = IMAGE_AFFINE.copy()
    shifted[0, 3] += 0.4  # Half a column.
    _save(truth, shifted, labels / "la_003.nii.gz", np.uint8)
    _save(np.stack([truth, truth], axis=-1), IMAGE_AFFINE, labels / "la_004.nii.gz", np.uint8)  # 4-D
    _save(truth + 0.5, IMAGE_AFFINE, labels / "la_005.nii.gz", np.float32)  # Not ids.
    # la_006 has no label; a label without an image is no input.
    _save(truth, IMAGE_AFFINE, labels / "la_099.nii.gz", np.uint8)
    (root / "dataset.json").write_text(json.dumps({"labels": {"0": "background", "1": "left atrium",
                                                              "2": "wall", "3": "vessel"}}))
    return images, labels


def _convert(images, labels, out, *more):
    convert.run(["--volumes", "--input_dir", str(images), "--masks_dir", str(labels), *more,
                 "--output_dir", str(out), "--runner", "DirectRunner", "--direct_num_workers", "1"])
    return json.loads((out / "manifest.json").read_text())


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _stored(out, split="train"):
    """filename -> (volume, mask, affine) as stored."""
    ds = readers.volume_dataset_from_tfrecords(out, split, dtype=None, label_mode="mask",
                                               extra_features=("volume/affine", "filename"))
    return {e["filename"].numpy().decode(): (v.numpy()[..., 0], m.numpy()[..., 0], e["volume/affine"].numpy())
            for v, m, e in ds}


def _check_patches(out, stored, **reading):
    """Every voxel of every patch holds the class of the stored voxel nearest its RAS position (0 outside)."""
    ds = readers.volume_dataset_from_tfrecords(out, "train", label_mode="mask", seed=3,
                                               extra_features=("volume/affine", "filename"), **reading)
    checked = 0
    for volumes, masks, extras in ds:
        affines, names = extras["volume/affine"].numpy(), extras["filename"].numpy()
        if masks.shape.rank == 4:  # batch_size=None: one volume.
            masks, affines, names = masks[None], affines[None], [names]
        for mask, affine, name in zip(masks.numpy(), affines, names):
            _, stored_mask, stored_affine = stored[name.decode()]
            k, j, i = np.indices(mask.shape[:3]).reshape(3, -1)
            world = affine @ np.vstack([i, j, k, np.ones_like(i)])
            at = np.linalg.inv(stored_affine) @ world
            near = np.round(at[:3])
            # Voxels half-way between two stored voxels could go either way: left out.
            clear = np.all(np.abs(np.abs(at[:3] - near) - 0.5) > 1e-3, axis=0)
            si, sj, sk = near.astype(int)
            inside = ((si >= 0) & (sj >= 0) & (sk >= 0) & (sk < stored_mask.shape[0]) & (sj < stored_mask.shape[1])
                      & (si < stored_mask.shape[2]))
            got = mask[..., 0].reshape(-1)
            want = np.zeros_like(got)
            want[inside] = stored_mask[sk[inside], sj[inside], si[inside]]
            np.testing.assert_array_equal(got[clear], want[clear])
            assert (got[~inside] == 0).all()  # Padding is background.
            checked += 1
        assert masks.dtype.name == "int32" and volumes.dtype.name == "float32"
    return checked


def test_a_decathlon_task_converts_with_its_labels_and_reads_back_as_masks(tmp_path):
    images, labels = _decathlon(tmp_path / "Task02_Heart")
    out = tmp_path / "out"
    manifest = _convert(images, labels, out, "--mask_suffix", "_0000:")
    rejects = {r["path"]: r for r in _lines(out / "rejects.jsonl")}
    assert {p: r["reason"] for p, r in rejects.items()} == {
        "la_003_0000.nii.gz": "mask_geometry_mismatch", "la_004_0000.nii.gz": "mask_geometry_mismatch",
        "la_005_0000.nii.gz": "mask_not_class_ids", "la_006_0000.nii.gz": "missing_mask"}
    assert "voxel centres up to 0.4 mm apart" in rejects["la_003_0000.nii.gz"]["message"]
    assert "not 3-D" in rejects["la_004_0000.nii.gz"]["message"]
    assert manifest["counts"] == {"found": 7, "written": 3, "rejected": 4, "skipped": 0}
    section = manifest["targets"]["mask"]
    # float32 labels in one header: uint16 for every mask (decided before any shard).
    assert section["dtype"] == "uint16" and section["unmatched_masks"] == 1
    assert section["class_names"] == ["background", "left atrium", "wall", "vessel"]
    assert set(manifest["features"]) >= {"volume", "volume/mask"}
    notes = {n["path"]: n["actions"] for n in _lines(out / "normalized.jsonl")}
    assert "mask_reoriented" in notes["la_001_0000.nii.gz"] and "mask_reoriented" in notes["la_002_0000.nii.gz"]
    assert "mask_reoriented" not in notes.get("la_000_0000.nii.gz", [])

    stored = _stored(out)
    assert sorted(stored) == ["la_000_0000.nii.gz", "la_001_0000.nii.gz", "la_002_0000.nii.gz"]
    for name, (volume, mask, affine) in stored.items():
        image = nib.load(images / name)
        np.testing.assert_allclose(affine, image.affine, atol=1e-5)
        np.testing.assert_array_equal(volume, np.asarray(image.dataobj).transpose(2, 1, 0))
        np.testing.assert_array_equal(mask, _truth_of(volume.shape, affine))
    # The volume tools read the masked records (volumes.json names their features).
    from shardsmith.volumes import inspect_volumes, verify_volumes

    assert verify_volumes(str(out)) == []
    assert "la_000_0000.nii.gz: int16 (5, 8, 9)" in inspect_volumes(str(out))
    assert "class -, mask ids [0, 1, 2, 3]" in inspect_volumes(str(out))
    # Pixel counts per class id add up to the stored voxels.
    assert sum(section["pixel_counts"]["train"].values()) == 3 * np.prod(SHAPE_IJK)

    # Resampled (nearest for the mask) and cut into patches, larger than the volume along z (padded).
    assert _check_patches(out, stored, batch_size=2, spacing=(1.1, 0.7, 0.55), patch_size=(14, 6, 7),
                          patches_per_volume=3, window=(0, 1000)) == 9
    assert _check_patches(out, stored, batch_size=None, volume_size=(7, 5, 11)) == 3
    assert _check_patches(out, stored, batch_size=4, patch_size=(3, 4, 5), patches_per_volume=4) == 12

    # The same input, the same bytes.
    again = tmp_path / "again"
    _convert(images, labels, again, "--mask_suffix", "_0000:")
    shards = sorted(p.name for p in out.glob("*.tfrecord"))
    assert shards and shards == sorted(p.name for p in again.glob("*.tfrecord"))
    for name in shards:
        assert (out / name).read_bytes() == (again / name).read_bytes()
    # Damaged shards are mended by --resume to the same bytes, masks and all.
    for name in shards:
        data = bytearray((again / name).read_bytes() or b"\0")
        data[len(data) // 2] ^= 0xFF
        (again / name).write_bytes(bytes(data))
    _convert(images, labels, again, "--mask_suffix", "_0000:", "--resume")
    for name in shards:
        assert (out / name).read_bytes() == (again / name).read_bytes()


def test_label_mode_mask_is_refused_on_a_dataset_without_masks(tmp_path):
    images, _ = _decathlon(tmp_path / "task")
    (images / "c").mkdir()
    (images / "la_000_0000.nii.gz").rename(images / "c" / "la_000_0000.nii.gz")
    out = tmp_path / "out"
    convert.run(["--volumes", "--input_dir", str(images), "--output_dir", str(out), "--runner", "DirectRunner",
                 "--direct_num_workers", "1"])
    with pytest.raises(ValueError, match="hold no 'volume/mask'.*--masks_dir"):
        readers.volume_dataset_from_tfrecords(out, "train", dtype=None, label_mode="mask")
    with pytest.raises(ValueError, match="`label_mode` must be one of"):
        readers.volume_dataset_from_tfrecords(out, "train", dtype=None, label_mode="categorical")


def _sitk_label(reference: sitk.Image) -> sitk.Image:
    """A label image on `reference`'s grid (SimpleITK's own geometry), classes from RAS positions."""
    size = reference.GetSize()
    lps = np.eye(4)
    lps[:3, :3] = np.array(reference.GetDirection()).reshape(3, 3) * np.array(reference.GetSpacing())
    lps[:3, 3] = reference.GetOrigin()
    ras = np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps
    label = sitk.GetImageFromArray(_labels_on(size, ras).transpose(2, 1, 0).astype(np.uint8))
    label.CopyInformation(reference)
    return label


def test_dicom_series_with_masks_exported_by_simpleitk_and_dcm2niix(tmp_path):
    scans, masks = tmp_path / "scans", tmp_path / "masks"
    uids = {"p1": write_series(scans / "ct" / "p1", count=5, orientation="oblique")[0],
            "p2": write_series(scans / "ct" / "p2", count=4, orientation="sagittal", descending=True)[0],
            "p3": write_series(scans / "ct" / "p3", count=4)[0]}
    (masks / "ct").mkdir(parents=True)
    reader = sitk.ImageSeriesReader()
    images = {}
    for name, uid in uids.items():
        reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(scans / "ct" / name), uid))
        images[name] = reader.Execute()
    # p1: SimpleITK's label on the series' grid; p3: the same, flipped along the slices (stacked the
    # other way: another voxel order of one grid).
    sitk.WriteImage(_sitk_label(images["p1"]), str(masks / "ct" / "p1.nii.gz"))
    sitk.WriteImage(sitk.Flip(_sitk_label(images["p3"]), [False, False, True]), str(masks / "ct" / "p3.nii"))
    # p2: on dcm2niix's NIfTI of the series (its own voxel order and affine).
    subprocess.run([DCM2NIIX, "-z", "n", "-b", "n", "-f", "vol", "-o", str(tmp_path), str(scans / "ct" / "p2")],
                   check=True, capture_output=True)
    exported = nib.load(tmp_path / "vol.nii")
    _save(_labels_on(exported.shape[:3], exported.affine), exported.affine, masks / "ct" / "p2.nii.gz", np.uint8)
    out = tmp_path / "out"
    manifest = _convert(scans, masks, out)
    assert manifest["counts"]["rejected"] == 0 and manifest["counts"]["written"] == 13
    assert manifest["targets"]["mask"]["dtype"] == "uint8"
    notes = {n["path"]: n["actions"] for n in _lines(out / "normalized.jsonl")}
    assert "mask_reoriented" in notes["ct/p3"]
    stored = _stored(out)
    assert sorted(stored) == ["ct/p1", "ct/p2", "ct/p3"]
    for name, (volume, mask, affine) in stored.items():
        clear = _clear_of_edges(volume.shape, affine)
        assert clear.mean() > 0.99
        np.testing.assert_array_equal(mask[clear], _truth_of(volume.shape, affine)[clear], err_msg=name)
        assert len(np.unique(mask)) > 1
    assert _check_patches(out, stored, batch_size=1, spacing=(1.7, 0.9, 1.3), patch_size=(8, 16, 16),
                          patches_per_volume=2) == 6


def test_foreground_fraction_centres_that_share_of_patches_on_the_foreground(tmp_path):
    images, labels = tmp_path / "imagesTr", tmp_path / "labelsTr"
    images.mkdir()
    labels.mkdir()
    shape = (24, 20, 16)
    for case in range(2):
        _save(np.zeros(shape), IMAGE_AFFINE, images / f"c{case}_0000.nii.gz", np.int16)
        blob = np.zeros(shape)
        if case == 0:
            blob[3:5, 14:16, 2:4] = 2  # 8 voxels of 7680: a random 5^3 patch rarely holds one.
        _save(blob, IMAGE_AFFINE, labels / f"c{case}.nii.gz", np.uint8)
    out = tmp_path / "out"
    _convert(images, labels, out, "--mask_suffix", "_0000:")
    stored = _stored(out)

    def share(fraction, seed=0):
        ds = readers.volume_dataset_from_tfrecords(out, "train", patch_size=(5, 5, 5), patches_per_volume=40,
                                                   seed=seed, label_mode="mask", foreground_fraction=fraction,
                                                   extra_features=("filename",))
        held = {}
        for _, mask, extras in ds:
            held.setdefault(extras["filename"].numpy().decode(), []).append(bool((mask.numpy() > 0).any()))
        return {name: float(np.mean(v)) for name, v in held.items()}

    assert share(1.0) == {"c0_0000.nii.gz": 1.0, "c1_0000.nii.gz": 0.0}  # c1 has no foreground.
    assert share(0.0)["c0_0000.nii.gz"] < 0.2
    assert 0.3 < share(0.5)["c0_0000.nii.gz"] < 0.8
    # A seed repeats its patches: test_foreground_patches_of_a_seed_are_those_a_listed_search_gives.
    # Foreground patches still hold the stored ids at their voxels' positions.
    assert _check_patches(out, stored, batch_size=3, patch_size=(5, 6, 7), patches_per_volume=3,
                          foreground_fraction=0.7, spacing=(1.5, 1.0, 1.0)) == 6
    with pytest.raises(ValueError, match="`foreground_fraction` must be a number in"):
        readers.volume_dataset_from_tfrecords(out, "train", patch_size=(5, 5, 5), label_mode="mask",
                                              foreground_fraction=1.5)
    with pytest.raises(ValueError, match="needs label_mode='mask' and `patch_size`"):
        readers.volume_dataset_from_tfrecords(out, "train", batch_size=None, label_mode="mask",
                                              foreground_fraction=0.5)


def _listed_foreground(mask, ranks):
    """The foreground search as first written (every foreground voxel listed by a flat `tf.where`, the
    ranks' gathered): the reader's `foreground_voxels` must pick the same voxels."""
    import tensorflow as tf

    foreground = tf.where(tf.reshape(mask, [-1]) > 0)[:, 0]
    n = tf.size(foreground, out_type=tf.int64)
    foreground = tf.concat([foreground, tf.zeros([1], tf.int64)], 0)
    return n, tf.gather(foreground, ranks % tf.maximum(n, 1))


def test_foreground_patches_of_a_seed_are_those_a_listed_search_gives(tmp_path, monkeypatch):
    """The reader's cheaper foreground search (busy rows only, skipped for a volume no patch of which
    wants the foreground) changes no patch: for several seeds and fractions, on both patch paths, the
    same (volume, mask, affine) patches as with every foreground voxel listed."""
    images, labels = tmp_path / "imagesTr", tmp_path / "labelsTr"
    images.mkdir()
    labels.mkdir()
    rng = np.random.default_rng(9)
    for case, shape in enumerate([(24, 20, 16), (12, 30, 9), (24, 20, 16)]):
        _save(rng.integers(-900, 900, shape), IMAGE_AFFINE, images / f"c{case}_0000.nii.gz", np.int16)
        blob = np.zeros(shape, np.int64)
        if case != 2:  # The last without foreground.
            blob[rng.random(shape) < 0.01] = 1
            blob[2:5, 1:3, 3:6] = 3
        _save(blob, IMAGE_AFFINE, labels / f"c{case}.nii.gz", np.uint8)
    out = tmp_path / "out"
    _convert(images, labels, out, "--mask_suffix", "_0000:")
    volumes_module = importlib.import_module("readers.volumes")
    search = volumes_module.foreground_voxels

    def read(listed, **reading):
        monkeypatch.setattr(volumes_module, "foreground_voxels", _listed_foreground if listed else search)
        ds = readers.volume_dataset_from_tfrecords(out, "train", label_mode="mask", patch_size=(6, 7, 5),
                                                   patches_per_volume=4, extra_features=("volume/affine",),
                                                   **reading)
        return [(v.numpy(), m.numpy(), e["volume/affine"].numpy()) for v, m, e in ds]

    centred = 0
    for reading in [dict(foreground_fraction=0.33), dict(foreground_fraction=1.0),
                    dict(foreground_fraction=0.5, spacing=(2.0, 1.0, 1.0))]:  # The decoded path.
        for seed in (0, 23):
            got, want = read(False, seed=seed, **reading), read(True, seed=seed, **reading)
            assert len(got) == len(want) == 12
            for a, b in zip(got, want):
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(x, y)
            centred += sum(int((m > 0).any()) for _, m, _ in got)
    assert centred > 20  # Foreground patches were drawn and compared, not only random ones.


def test_a_mask_reader_row_gets_the_series_grid_with_its_sop_instance_uids(tmp_path, monkeypatch):
    """What a DICOM SEG or RTSTRUCT reader plugged into `MASK_READERS` receives: the stored grid, and
    each stored slice's SOPInstanceUID in the stored order (pydicom's positions along the normal)."""
    import pydicom

    from imaging import volume_masks

    scans, masks = tmp_path / "scans", tmp_path / "masks"
    uid = write_series(scans / "ct" / "p1", count=5, orientation="oblique", descending=True)[0]
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(scans / "ct" / "p1"), uid))
    (masks / "ct").mkdir(parents=True)
    sitk.WriteImage(_sitk_label(reader.Execute()), str(masks / "ct" / "p1.nii.gz"))
    grids = []

    def row(data, name, grid):
        grids.append(grid)
        return volume_masks.read_nifti_mask(data, name, grid)

    monkeypatch.setitem(volume_masks.MASK_READERS, "nifti", row)
    out = tmp_path / "out"
    _convert(scans, masks, out, "--worker_processes", "0")  # Decoded in this process: the row is seen.
    (grid,) = grids
    slices = [pydicom.dcmread(p, stop_before_pixels=True) for p in (scans / "ct" / "p1").iterdir()]
    normal = np.cross(*np.reshape(np.asarray(slices[0].ImageOrientationPatient, float), (2, 3)))
    slices.sort(key=lambda ds: float(np.dot(np.asarray(ds.ImagePositionPatient, float), normal)))
    assert grid.sop_instance_uids == tuple(str(ds.SOPInstanceUID) for ds in slices)
    (volume, mask, affine), = _stored(out).values()
    assert grid.shape == volume.shape
    np.testing.assert_allclose(grid.matrix, affine)


def test_masks_beside_their_volumes_in_class_folders(tmp_path):
    """ITK-SNAP's layout: case.nii.gz beside case_seg.nii.gz, told apart by --mask_suffix; classes kept."""
    scans = tmp_path / "scans"
    for cls in ("liver", "kidney"):
        (scans / cls).mkdir(parents=True)
        _save(np.ones(SHAPE_IJK), IMAGE_AFFINE, scans / cls / "case.nii.gz", np.int16)
        _save(_labels_on(SHAPE_IJK, IMAGE_AFFINE), IMAGE_AFFINE, scans / cls / "case_seg.nii.gz", np.uint8)
    out = tmp_path / "out"
    manifest = _convert(scans, scans, out, "--mask_suffix", ":_seg")
    assert manifest["counts"] == {"found": 2, "written": 2, "rejected": 0, "skipped": 0}
    assert manifest["class_names"] == ["kidney", "liver"] and manifest["targets"]["mask"]["dtype"] == "uint8"
    ds = readers.volume_dataset_from_tfrecords(out, "train", dtype=None, extra_features=("filename",))
    assert sorted((e["filename"].numpy().decode(), int(label)) for _, label, e in ds) == [
        ("kidney/case.nii.gz", 0), ("liver/case.nii.gz", 1)]
    for name, (volume, mask, affine) in _stored(out).items():
        np.testing.assert_array_equal(mask, _truth_of(volume.shape, affine))


def test_masked_volumes_are_sized_into_shards_with_their_masks(tmp_path):
    """A record holds its mask beside its voxels: the masks' bytes count where shards are sized.

    8 uncompressed NIfTI volumes of 48x64x64 int16 (384 KiB each, their file size as planned) with
    uint16 masks (the same voxels, 2 bytes each: 384 KiB more) and --target_shard_mb 1: the
    unmasked dataset's shards hold 1 MiB at most on average, and the masked one's must too
    (planned on the volumes' bytes alone they held twice that).
    """
    shape_ijk = (64, 64, 48)
    affine = np.diag([0.8, 0.8, 2.5, 1.0])
    scans, labels = tmp_path / "scans" / "ct", tmp_path / "labels" / "ct"
    scans.mkdir(parents=True)
    labels.mkdir(parents=True)
    rng = np.random.default_rng(2)
    for case in range(8):
        _save(rng.integers(-500, 500, shape_ijk), affine, scans / f"case{case}.nii", np.int16)
        # Ids above 255: uint16 masks, gzipped (a fraction of their stored bytes on disk).
        _save(_labels_on(shape_ijk, affine) * 100, affine, labels / f"case{case}.nii.gz", np.uint16)
    target = 1 << 20
    sizing = ["--target_shard_mb", "1", "--min_shards", "1"]
    convert.run(["--volumes", "--input_dir", str(tmp_path / "scans"), "--output_dir", str(tmp_path / "plain"),
                 *sizing, "--runner", "DirectRunner", "--direct_num_workers", "1"])
    manifest = _convert(tmp_path / "scans", tmp_path / "labels", tmp_path / "masked", *sizing)
    assert manifest["counts"]["written"] == 8 and manifest["targets"]["mask"]["dtype"] == "uint16"
    shards = {}
    for name in ("plain", "masked"):
        shards[name] = [f.stat().st_size for f in sorted((tmp_path / name).glob("train-*.tfrecord"))]
        # As every kind's: ceil(bytes / target) shards (records apart by one at most), 1 MiB on average.
        assert sum(shards[name]) / len(shards[name]) <= target, (name, shards[name])
    assert sum(shards["masked"]) > 1.9 * sum(shards["plain"]) and len(shards["masked"]) > len(shards["plain"])


# A mask decoder that crashes or hangs on the masks marked so (in their NIfTI `descrip`), loaded into
# every process of the real command.
_FAULTY_MASK_DECODER = '''
import os, signal, time
import nibabel

_from_bytes = nibabel.Nifti1Image.from_bytes.__func__

def from_bytes(cls, data, *args, **kwargs):
    if b"MASK-SEGV" in bytes(data[:348]):
        os.kill(os.getpid(), signal.SIGSEGV)
    if b"MASK-HANG" in bytes(data[:348]):
        time.sleep(3600)
    return _from_bytes(cls, data, *args, **kwargs)

nibabel.Nifti1Image.from_bytes = classmethod(from_bytes)
'''


def test_a_mask_whose_decoder_crashes_or_hangs_rejects_its_volume_only(tmp_path):
    import os
    import sys

    from helpers import run_without_core_dumps

    scans, masks = tmp_path / "scans", tmp_path / "masks"
    (masks / "ct").mkdir(parents=True)
    reader = sitk.ImageSeriesReader()
    for name, mark in (("p0", b""), ("segv", b"MASK-SEGV"), ("hang", b"MASK-HANG")):
        uid = write_series(scans / "ct" / name, count=3)[0]
        reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(scans / "ct" / name), uid))
        sitk.WriteImage(_sitk_label(reader.Execute()), str(masks / "ct" / f"{name}.nii"))
        image = nib.load(masks / "ct" / f"{name}.nii")
        image.header["descrip"] = mark
        nib.save(nib.Nifti1Image(np.asarray(image.dataobj), image.affine, image.header),
                 masks / "ct" / f"{name}.nii.gz")
        (masks / "ct" / f"{name}.nii").unlink()
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "sitecustomize.py").write_text(_FAULTY_MASK_DECODER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = tmp_path / "out"
    command = [sys.executable, "-m", "beam_jobs.convert", "--volumes", "--input_dir", str(scans), "--masks_dir",
               str(masks), "--output_dir", str(out), "--file_timeout", "8", "--worker_processes", "2"]
    result = run_without_core_dumps(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 3, result.stderr[-3000:]
    reasons = {}
    for r in _lines(out / "rejects.jsonl"):
        reasons.setdefault(r["path"].rsplit("/", 1)[0], set()).add(r["reason"])
    assert reasons == {"ct/segv": {"decoder_crashed"}, "ct/hang": {"timeout"}}
    assert list(_stored(out)) == ["ct/p0"]


@pytest.mark.parametrize("big_ids", [False, True], ids=["uint8", "uint16"])
def test_mask_patches_cut_from_the_stored_bytes_are_the_decoded_paths_bit_for_bit(tmp_path, monkeypatch, big_ids):
    """label_mode='mask' patches of volumes as stored take the raw-bytes path (`_patches_of_raw`): the
    same (volume, mask, affine) patches as the decoded-volume path, padded ones and foreground-centred
    ones included, under four seeds."""
    images, labels = tmp_path / "imagesTr", tmp_path / "labelsTr"
    images.mkdir()
    labels.mkdir()
    rng = np.random.default_rng(1)
    # Volumes thinner than the patches below along each axis in turn (padded), one without foreground.
    for case, shape in enumerate([(24, 20, 16), (30, 7, 18), (9, 26, 11), (24, 20, 16)]):
        _save(rng.integers(-900, 900, shape), IMAGE_AFFINE, images / f"c{case}_0000.nii.gz", np.int16)
        blob = np.zeros(shape, np.int64)
        if case != 3:
            blob[rng.random(shape) < 0.03] = 1
            blob[2:5, 1:3, 3:6] = 300 if big_ids else 2
        _save(blob, IMAGE_AFFINE, labels / f"c{case}.nii.gz", np.uint16 if big_ids else np.uint8)
    out = tmp_path / "out"
    manifest = _convert(images, labels, out, "--mask_suffix", "_0000:")
    assert manifest["targets"]["mask"]["dtype"] == ("uint16" if big_ids else "uint8")
    volumes_module = importlib.import_module("readers.volumes")
    raw_cuts = []
    cut = volumes_module._patches_of_raw
    monkeypatch.setattr(volumes_module, "_patches_of_raw", lambda *a: raw_cuts.append(1) or cut(*a))

    def read(fast, seed, **reading):
        monkeypatch.setattr(volumes_module, "_BITCAST_IS_LITTLE_ENDIAN", fast)  # False: the decoded path.
        ds = readers.volume_dataset_from_tfrecords(out, "train", label_mode="mask", seed=seed,
                                                   extra_features=("volume/affine",), **reading)
        return [(v.numpy(), m.numpy(), e["volume/affine"].numpy()) for v, m, e in ds]

    # Each reading under a seed of its own (each seed's patches differ; make test's time).
    for seed, reading in [(0, dict(patch_size=(8, 8, 8), patches_per_volume=3)),
                          (11, dict(patch_size=(10, 12, 9), patches_per_volume=4, foreground_fraction=0.5,
                                    window=(0, 800))),
                          (5, dict(patch_size=(5, 5, 5), patches_per_volume=6, foreground_fraction=1.0, batch_size=4)),
                          (23, dict(patch_size=(12, 30, 6), patches_per_volume=2, foreground_fraction=0.33,
                                    dtype="bfloat16"))]:
        raw_cuts.clear()
        fast = read(True, seed, **reading)
        assert raw_cuts, "the raw-bytes path was not taken"
        raw_cuts.clear()
        slow = read(False, seed, **reading)
        assert not raw_cuts and len(fast) == len(slow) > 0
        for got, want in zip(fast, slow):
            for a, b in zip(got, want):
                assert (a.dtype, a.shape) == (b.dtype, b.shape)
                np.testing.assert_array_equal(a, b)
        if reading.get("foreground_fraction") == 1.0:  # Every patch of a volume with foreground holds some.
            assert sum(bool((m > 0).any()) for _, masks, _ in fast for m in masks) >= 12
