"""imaging.volume_masks: NIfTI label volumes read onto their volume's grid, against SimpleITK and nibabel.

Images and labels are written by nibabel in several voxel orders; the truth a
stored mask is compared with comes from SimpleITK (the label resampled onto the
image by nearest neighbour, its own reader and geometry) or nibabel's
`as_closest_canonical` of both files.
"""

from __future__ import annotations

import dataclasses
import gzip
import struct
import tracemalloc
import zlib

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk

from imaging import volume_masks, volumes
from imaging.errors import ImageRejected

SHAPE_IJK = (7, 6, 5)


def _oblique_affine(degrees=0.0):
    """An LPS-like image affine (i -> left, j -> posterior), spacing (0.8, 0.9, 2.5), rotated about z."""
    t = np.radians(degrees)
    rot = np.array([[np.cos(t), -np.sin(t), 0], [np.sin(t), np.cos(t), 0], [0, 0, 1]])
    affine = np.eye(4)
    affine[:3, :3] = rot @ np.diag([-0.8, -0.9, 2.5])
    affine[:3, 3] = (40.0, 31.5, -17.25)
    return affine


def _labels(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 4, SHAPE_IJK).astype(np.uint8)


def _nifti(values, affine, path=None, dtype=None) -> bytes:
    values = np.asarray(values, dtype=dtype or values.dtype)
    image = nib.Nifti1Image(values, affine, dtype=values.dtype)
    image.set_sform(affine, code=1)
    image.set_qform(affine, code=1)
    data = image.to_bytes()
    if path is not None:
        path.write_bytes(data)
    return data


def _grid(image_bytes):
    return volume_masks.VolumeGrid.of(volumes.read_nifti(image_bytes, "image.nii"))


def _sitk_truth(image_path, mask_path):
    """The mask resampled by SimpleITK onto the image's grid (nearest), as [k, j, i]."""
    image = sitk.ReadImage(str(image_path))
    mask = sitk.ReadImage(str(mask_path))
    out = sitk.Resample(mask, image, sitk.Transform(), sitk.sitkNearestNeighbor, 255)
    return sitk.GetArrayFromImage(out)


def _reoriented(values, affine, order, flips):
    """The same label volume saved with its axes in another order (`order`) and flipped (`flips`)."""
    out = values
    to_old = np.zeros((4, 4))
    to_old[3, 3] = 1
    for axis in flips:
        out = np.flip(out, axis)
    shape = out.shape
    out = out.transpose(order)
    # New index n maps to old index: old[order[a]] = n[a] (flipped where asked).
    for a, old in enumerate(order):
        if old in flips:
            to_old[old, a] = -1
            to_old[old, 3] = shape[old] - 1
        else:
            to_old[old, a] = 1
    return np.ascontiguousarray(out), affine @ to_old


@pytest.mark.parametrize("degrees", [0.0, 17.0])
@pytest.mark.parametrize("order,flips", [
    ((0, 1, 2), ()),            # The same grid.
    ((0, 1, 2), (0, 1)),        # RAS beside LPS: i and j run the other way.
    ((2, 0, 1), ()),            # Axes permuted.
    ((1, 2, 0), (2,)),          # Permuted and stacked the other way.
])
def test_a_label_in_any_voxel_order_lands_on_the_image_voxels_as_simpleitk_resamples_it(
        tmp_path, order, flips, degrees):
    affine = _oblique_affine(degrees)
    image_path, mask_path = tmp_path / "image.nii", tmp_path / "mask.nii.gz"
    image = _nifti(np.arange(np.prod(SHAPE_IJK), dtype=np.int16).reshape(SHAPE_IJK), affine, image_path)
    values, mask_affine = _reoriented(_labels(), affine, order, flips)
    mask_path.write_bytes(gzip.compress(_nifti(values, mask_affine)))
    out = volume_masks.read_mask_volume(mask_path.read_bytes(), "mask.nii.gz", _grid(image))
    truth = _sitk_truth(image_path, mask_path)
    assert out.ids.shape == truth.shape == (5, 6, 7)
    np.testing.assert_array_equal(out.ids, truth)
    np.testing.assert_array_equal(out.ids, _labels().transpose(2, 1, 0))
    assert out.ids.dtype == np.uint8
    assert bool(out.notes) == (order != (0, 1, 2) or bool(flips))
    assert all(n.startswith("mask_reoriented") for n in out.notes)


def test_nibabel_closest_canonical_of_both_files_agrees(tmp_path):
    """An independent path: both files reoriented to RAS by nibabel hold the same voxels."""
    affine = _oblique_affine()
    image = _nifti(np.zeros(SHAPE_IJK, np.int16), affine)
    values, mask_affine = _reoriented(_labels(3), affine, (2, 1, 0), (0,))
    mask = _nifti(values, mask_affine)
    out = volume_masks.read_mask_volume(mask, "m.nii", _grid(image))
    canonical_mask = nib.as_closest_canonical(nib.Nifti1Image.from_bytes(mask))
    # The stored ids on the image's grid, saved with the image's affine, then made canonical.
    stored = nib.as_closest_canonical(nib.Nifti1Image(out.ids.transpose(2, 1, 0).copy(), affine))
    np.testing.assert_allclose(stored.affine, canonical_mask.affine, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(stored.dataobj), np.asarray(canonical_mask.dataobj))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.int64, np.uint16])
def test_labels_of_any_numeric_type_holding_whole_ids_are_read(dtype):
    affine = _oblique_affine()
    image = _nifti(np.zeros(SHAPE_IJK, np.int16), affine)
    out = volume_masks.read_mask_volume(_nifti(_labels(), affine, dtype=dtype), "m.nii", _grid(image))
    np.testing.assert_array_equal(out.ids, _labels().transpose(2, 1, 0))
    assert out.ids.dtype == (np.uint8 if np.dtype(dtype).itemsize == 1 else np.uint16)
    assert out.notes == ()


@pytest.mark.parametrize("change,expect", [
    ("shift", "voxel centres up to 0.4 mm apart"),
    ("spacing", "axes that are not the volume's"),
    ("shape", "shape (depth, height, width) (5, 6, 8) against the volume's (5, 6, 7)"),
    ("oblique", "axes that are not the volume's"),
    ("stretch", "voxel centres up to"),
])
def test_another_grid_is_rejected_naming_what_differs(change, expect):
    affine = _oblique_affine()
    image = _nifti(np.zeros(SHAPE_IJK, np.int16), affine)
    values, mask_affine = _labels(), affine.copy()
    if change == "shift":
        mask_affine[:3, 3] += mask_affine[:3, 0] / 2  # Half a column: 0.4 mm.
    elif change == "spacing":
        mask_affine[:3, 2] *= 2
    elif change == "shape":
        values = np.zeros((8, 6, 5), np.uint8)
    elif change == "oblique":
        mask_affine = _oblique_affine(30.0)
    elif change == "stretch":
        mask_affine[:3, 1] *= 1.05  # 5% of a row: 0.27 mm at the far row.
    with pytest.raises(ImageRejected) as e:
        volume_masks.read_mask_volume(_nifti(values, mask_affine), "m.nii", _grid(image))
    assert e.value.reason == "mask_geometry_mismatch"
    assert "m.nii" in e.value.message
    assert expect in e.value.message


def test_a_difference_within_the_tolerance_is_the_same_grid():
    affine = _oblique_affine(17.0)
    image = _nifti(np.zeros(SHAPE_IJK, np.int16), affine)
    near = affine.copy()
    near[:3, 3] += 1e-4  # float32 rounding of a stored origin is ~1e-5 mm.
    out = volume_masks.read_mask_volume(_nifti(_labels(), near), "m.nii", _grid(image))
    assert out.notes == ()
    far = affine.copy()
    far[:3, 3] += 0.01  # 1.2% of the smallest spacing (0.8 mm).
    with pytest.raises(ImageRejected):
        volume_masks.read_mask_volume(_nifti(_labels(), far), "m.nii", _grid(image))


@pytest.mark.parametrize("values,reason,words", [
    (np.full(SHAPE_IJK, 0.5, np.float32), "mask_not_class_ids", "not whole numbers"),
    (np.full(SHAPE_IJK, -1, np.int16), "mask_not_class_ids", "negative"),
    (np.full(SHAPE_IJK, 70000, np.int32), "mask_not_class_ids", "more than 65535"),
    (np.full(SHAPE_IJK, np.nan, np.float32), "mask_not_class_ids", "not whole numbers"),
    (np.zeros((*SHAPE_IJK, 3), np.uint8), "mask_geometry_mismatch", "not 3-D"),
])
def test_what_holds_no_class_ids_or_is_4d_is_rejected(values, reason, words):
    affine = _oblique_affine()
    image = _nifti(np.zeros(SHAPE_IJK, np.int16), affine)
    with pytest.raises(ImageRejected) as e:
        volume_masks.read_mask_volume(_nifti(values, affine), "m.nii", _grid(image))
    assert (e.value.reason, words in e.value.message) == (reason, True), e.value.message


def test_files_no_reader_takes_are_mask_unreadable():
    grid = volume_masks.VolumeGrid((2, 2, 2), np.eye(4))
    for data in (b"not a mask at all", gzip.compress(b"garbage")):
        with pytest.raises(ImageRejected) as e:
            volume_masks.read_mask_volume(data, "m", grid)
        assert e.value.reason == "mask_unreadable"
    # A DICOM file goes to the DICOM row (SEG, RTSTRUCT), which says it is neither.
    with pytest.raises(ImageRejected) as e:
        volume_masks.read_mask_volume(b"\x00" * 128 + b"DICM" + b"\x00" * 100, "m", grid)
    assert e.value.reason == "unsupported_mask" and "not a Segmentation" in e.value.message


def test_mask_bits_come_from_the_header_alone():
    affine = np.eye(4)
    small = np.zeros((2, 2, 2))
    assert volume_masks.mask_bits(_nifti(small, affine, dtype=np.uint8)[:400]) == 8
    assert volume_masks.mask_bits(gzip.compress(_nifti(small, affine, dtype=np.uint8))) == 8
    assert volume_masks.mask_bits(_nifti(small, affine, dtype=np.int16)[:400]) == 16
    assert volume_masks.mask_bits(gzip.compress(_nifti(small, affine, dtype=np.float32))) == 16
    two = nib.Nifti2Image(small.astype(np.uint8), affine).to_bytes()
    assert volume_masks.mask_bits(two) == 8
    assert volume_masks.mask_bits(b"png or anything") is None


def test_the_grid_is_a_small_frozen_validated_object():
    uids = ["1.2.3", "1.2.4", "1.2.5"]
    grid = volume_masks.VolumeGrid([3, 4, 5], np.diag([2.0, 3.0, 4.0, 1.0]), uids)
    assert grid.shape == (3, 4, 5) and len(grid.affine) == 16 and grid.sop_instance_uids == tuple(uids)
    assert grid.spacing == (4.0, 3.0, 2.0)
    assert grid == volume_masks.VolumeGrid((3, 4, 5), tuple(np.diag([2.0, 3.0, 4.0, 1.0]).ravel()), tuple(uids))
    assert hash(grid) == hash(volume_masks.VolumeGrid((3, 4, 5), np.diag([2.0, 3.0, 4.0, 1.0]), uids))
    with pytest.raises(ValueError, match="`sop_instance_uids` names each of the 3 slices"):
        volume_masks.VolumeGrid((3, 4, 5), np.eye(4), ["1.2.3"])
    with pytest.raises(ValueError, match="`shape`"):
        volume_masks.VolumeGrid((3, 4), np.eye(4))
    with pytest.raises(ValueError, match="`affine`"):
        volume_masks.VolumeGrid((3, 4, 5), np.full((4, 4), np.nan))


def test_the_dicom_row_checks_the_series_grid_of_a_stack(tmp_path):
    """`VolumeGrid.of(volume, stack)` carries the series' UIDs and slices: a SEG read through
    `MASK_READERS["dicom"]` is checked against them, and names its labels."""
    from imaging import dicom_masks
    from test_imaging_dicom_masks import blobs, sources_in_k_order, stacked, write_seg, write_series

    folder = tmp_path / "s"
    series_uid, frame_of_reference, _ = write_series(folder, count=4, descending=True)
    slices = [s for p in sorted(folder.iterdir()) for s in volumes.read_slices(p.read_bytes(), p.name)]
    stack = volumes.plan_stacks(slices).stacks[0]
    volume = volumes.read_stack(stack, lambda n: (folder / n).read_bytes())
    grid = volume_masks.VolumeGrid.of(volume, stack)
    series = dicom_masks.SeriesGrid.from_stack(stack)
    assert (grid.series_uid, grid.frame_of_reference_uid) == (series_uid, frame_of_reference)
    assert (grid.sop_instance_uids, grid.frames) == (series.sop_instance_uids, series.frames)
    assert volume_masks.VolumeGrid.of(volume).series_uid == ""
    truth = blobs(4, 2, seed=2)
    seg = write_seg(sources_in_k_order(folder, series), stacked(truth, 2), count=2)
    mask = volume_masks.read_mask_volume(seg, "seg.dcm", grid)
    np.testing.assert_array_equal(mask.ids, truth)
    assert mask.class_names == ("background", "organ 1", "organ 2")
    other = dataclasses.replace(grid, series_uid="1.2.3.4")
    with pytest.raises(ImageRejected) as e:
        volume_masks.read_mask_volume(seg, "seg.dcm", other)
    assert e.value.reason == "mask_reference_mismatch" and "1.2.3.4" in e.value.message
    with pytest.raises(ValueError, match="`frames`"):
        volume_masks.VolumeGrid((4, 2, 2), np.eye(4), frames=(0, 0))


def _gzip_bomb(head: bytes, zeros: int) -> bytes:
    """A gzip of `head` then `zeros` zero bytes, deflated by chunks (about a thousandth of that on disk)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts, chunk = [deflate.compress(head)], bytes(1 << 22)
    for start in range(0, zeros, len(chunk)):
        parts.append(deflate.compress(chunk[:min(len(chunk), zeros - start)]))
    return b"".join(parts) + deflate.flush()


def _traced_peak(call):
    """(what `call` raised, the most memory Python held while it ran)."""
    tracemalloc.start()
    try:
        with pytest.raises(ImageRejected) as e:
            call()
        return e.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_gzip_bomb_mask_is_refused_before_its_voxels_are_inflated():
    """Found by a mutation run of mask files (mfuzz12): a .nii.gz of 512 KiB whose header gives
    1024 x 1024 x 512 voxels, all there (zeros), was inflated whole (512 MiB, and as much again
    for its array) before its shape was compared with the volume's: a conversion's process grew
    past --file_memory and was killed."""
    affine = _oblique_affine()
    grid = _grid(_nifti(np.zeros(SHAPE_IJK, np.int16), affine))
    head = bytearray(_nifti(_labels(), affine)[:352])
    struct.pack_into("<4h", head, 40, 3, 1024, 1024, 512)
    bomb = _gzip_bomb(bytes(head), 1 << 29)
    assert len(bomb) < 1 << 20
    error, peak = _traced_peak(lambda: volume_masks.read_mask_volume(bomb, "m.nii.gz", grid))
    assert error.reason == "mask_geometry_mismatch", error
    assert "(512, 1024, 1024) against the volume's (5, 6, 7)" in error.message
    assert "refused before its voxels are read" in error.message
    assert peak < 16 << 20


def test_a_mask_whose_gzip_inflates_far_past_its_voxels_is_refused_without_keeping_them():
    """A right label volume followed by 100 MiB of zeros in its gzip: nibabel reads the voxels and
    ignores the rest, but the rest was inflated (and kept) first. Now it is inflated a chunk at a
    time, unkept, up to 64 MiB past the voxels; a little padding is read as before."""
    affine = _oblique_affine()
    grid = _grid(_nifti(np.zeros(SHAPE_IJK, np.int16), affine))
    labels = _nifti(_labels(), affine)
    error, peak = _traced_peak(lambda: volume_masks.read_mask_volume(_gzip_bomb(labels, 100 << 20), "m.nii.gz",
                                                                     grid))
    assert error.reason == "mask_unreadable" and "a gzip bomb" in error.message, error
    assert peak < 16 << 20
    padded = volume_masks.read_mask_volume(_gzip_bomb(labels, 1 << 20), "m.nii.gz", grid)
    np.testing.assert_array_equal(padded.ids, _labels().transpose(2, 1, 0))


def test_a_mask_header_with_a_negative_dim_is_unreadable_naming_its_shape():
    """dim[1] = -7 (a mutation): numpy's 'negative count' was the whole message."""
    affine = _oblique_affine()
    grid = _grid(_nifti(np.zeros(SHAPE_IJK, np.int16), affine))
    data = bytearray(_nifti(_labels(), affine))
    struct.pack_into("<h", data, 42, -7)
    with pytest.raises(ImageRejected) as e:
        volume_masks.read_mask_volume(gzip.compress(bytes(data)), "m.nii.gz", grid)
    assert e.value.reason == "mask_unreadable" and "empty shape (-7, 6, 5)" in e.value.message, e.value
