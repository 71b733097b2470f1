"""imaging.volumes against independent readers: SimpleITK's ImageSeriesReader, dcm2niix + nibabel.

Series are built from pydicom's bundled real slices (CT_small: CT with a rescale; MR_small in
JPEG-LS and RLE), with positions and orientations written here; every comparison is voxel for
voxel in world (RAS) coordinates, so a reader that orders slices or rows differently still agrees.
"""

import dataclasses
import random
import shutil
import subprocess
import sys
from pathlib import Path

import nibabel
import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

from imaging import ImageRejected
from imaging import volumes

# The dcm2niix wheel puts its binary beside the interpreter; `make test` may not have it on PATH.
DCM2NIIX = shutil.which("dcm2niix") or str(Path(sys.executable).parent / "dcm2niix")
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


def _rotation(axis, degrees):
    a = np.radians(degrees)
    c, s = np.cos(a), np.sin(a)
    if axis == "x":
        return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])
    if axis == "y":
        return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


ORIENTATIONS = {
    "axial": np.eye(3),
    "sagittal": np.array([[0, 0, -1], [1, 0, 0], [0, -1, 0]]).T,  # rows A->P... columns S->I
    "coronal": np.array([[1, 0, 0], [0, 0, 1], [0, -1, 0]]).T,
    "oblique": _rotation("x", 20) @ _rotation("z", 15),
}


def write_series(folder: Path, source="CT_small.dcm", count=6, orientation="axial", spacing=2.5,
                 descending=False, names="shuffled", skip=(), series_uid=None, extra=None):
    """Writes `count` slices of one series, each the source's pixels plus 10*k (so order shows)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = pydicom.dcmread(get_testdata_file(source))
    rot = ORIENTATIONS[orientation]
    row, col, normal = rot[:, 0], rot[:, 1], np.cross(rot[:, 0], rot[:, 1])
    origin = np.array([-80.5, -91.25, 12.0])
    series_uid = series_uid or generate_uid()
    paths = []
    order = list(range(count))
    rng = random.Random(count)
    for k in order:
        if k in skip:
            continue
        ds = pydicom.dcmread(get_testdata_file(source))
        if not ds.file_meta.TransferSyntaxUID.is_compressed:
            ds.PixelData = (base.pixel_array + 10 * k).astype(base.pixel_array.dtype).tobytes()
        pos = origin + (count - 1 - k if descending else k) * spacing * normal
        ds.ImagePositionPatient = [f"{v:.6f}" for v in pos]
        ds.ImageOrientationPatient = [f"{v:.6f}" for v in (*row, *col)]
        ds.SeriesInstanceUID = series_uid
        ds.SOPInstanceUID = generate_uid()
        ds.InstanceNumber = rng.randint(1, 999)  # never the order
        if "SliceLocation" in ds:
            del ds.SliceLocation
        if extra:
            extra(ds, k)
        name = {"shuffled": f"x{rng.randint(0, 10**9):09d}", "dcm": f"s{k:03d}.dcm"}[names]
        path = folder / name
        ds.save_as(path, enforce_file_format=True)
        paths.append(path)
    return series_uid, paths


def read_ours(folder: Path, min_slices=2, headers=False):
    """Plans and reads the folder's stacks; `headers`: planned from headers only, as the converter does."""
    slices = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if headers:
            with open(path, "rb") as f:
                slices += volumes.read_slice_headers(f, str(path.relative_to(folder)))
        else:
            slices += volumes.read_slices(path.read_bytes(), str(path.relative_to(folder)))
    read = lambda name: (folder / name).read_bytes()
    pixel_hash = (lambda s: volumes.read_slices(read(s.name), s.name)[s.frame].pixel_hash) if headers else None
    plan = volumes.plan_stacks(slices, min_slices=min_slices, pixel_hash=pixel_hash)
    return plan, [volumes.read_stack(stack, read) for stack in plan.stacks]


def read_sitk(folder: Path, series_uid: str):
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(folder), series_uid))
    image = reader.Execute()
    direction = np.array(image.GetDirection()).reshape(3, 3)
    lps = np.eye(4)
    lps[:3, :3] = direction * np.array(image.GetSpacing())
    lps[:3, 3] = image.GetOrigin()
    return sitk.GetArrayFromImage(image), LPS_TO_RAS @ lps


def read_dcm2niix(folder: Path, out: Path):
    out.mkdir()
    subprocess.run([DCM2NIIX, "-z", "n", "-b", "n", "-f", "vol", "-o", str(out), str(folder)],
                   check=True, capture_output=True)
    files = sorted(out.glob("*.nii"))
    assert len(files) == 1, files
    image = nibabel.load(files[0])
    return np.asarray(image.get_fdata()).transpose(2, 1, 0), image.affine


def assert_same_in_world(ours, our_affine, theirs, their_affine):
    """Every voxel of ours lands on a voxel centre of theirs with the same value."""
    assert ours.size == theirs.size, (ours.shape, theirs.shape)
    k, j, i = np.indices(ours.shape).reshape(3, -1)
    ijk = np.stack([i, j, k, np.ones_like(i)]).astype(np.float64)
    theirs_ijk = np.linalg.inv(their_affine) @ our_affine @ ijk
    rounded = np.round(theirs_ijk[:3])
    np.testing.assert_allclose(theirs_ijk[:3], rounded, atol=1e-3)
    ti, tj, tk = rounded.astype(int)
    np.testing.assert_array_equal(ours[k, j, i].astype(np.float64), theirs[tk, tj, ti].astype(np.float64))


@pytest.mark.parametrize("orientation", sorted(ORIENTATIONS))
@pytest.mark.parametrize("descending", [False, True])
def test_stack_matches_simpleitk_and_dcm2niix(tmp_path, orientation, descending):
    uid, _ = write_series(tmp_path / "s", orientation=orientation, descending=descending)
    plan, [volume] = read_ours(tmp_path / "s")
    assert plan.rejects == ()
    assert volume.voxels.shape == (6, 128, 128) and volume.voxels.dtype == np.int16
    # CT_small: stored + 10k, rescaled by -1024: slice k is the k-th along the normal.
    np.testing.assert_allclose(volume.spacing, (2.5, 0.661468, 0.661468), rtol=1e-6)
    theirs, their_affine = read_sitk(tmp_path / "s", uid)
    np.testing.assert_allclose(volume.affine, their_affine, atol=1e-4)
    np.testing.assert_array_equal(volume.voxels, theirs)
    n2, n2_affine = read_dcm2niix(tmp_path / "s", tmp_path / "nii")
    assert_same_in_world(volume.voxels, volume.affine, n2, n2_affine)
    # Left-right is where mistakes hide: nibabel names the axes of both the same.
    assert nibabel.aff2axcodes(volume.affine) == nibabel.aff2axcodes(their_affine)


def _jpeg_lossless_sv1(ds, k):
    """`write_series`'s `extra`: the slice as JPEG Lossless process 14 SV1 (libjpeg-turbo, via imagecodecs)."""
    import imagecodecs
    from pydicom.encaps import encapsulate
    from pydicom.uid import JPEGLosslessSV1

    ds.PixelData = encapsulate([imagecodecs.jpeg8_encode(ds.pixel_array.astype(np.uint16), lossless=True,
                                                         predictor=1, bitspersample=16)])
    ds["PixelData"].VR = "OB"
    ds.file_meta.TransferSyntaxUID = JPEGLosslessSV1


def _jpeg2000_lossless(ds, k):
    """`write_series`'s `extra`: the slice as lossless JPEG 2000 (OpenJPEG, via pydicom's encoder)."""
    from pydicom.uid import JPEG2000Lossless

    ds.compress(JPEG2000Lossless, ds.pixel_array)


# Real compressed slices (pydicom's: JPEG-LS, RLE, JPEG 2000 lossless MR, a lossy JPEG 2000 CT of
# 512x512), each four times at four positions; and CT_small's slices, each its own pixels, compressed
# here as PACS store CT: JPEG Lossless SV1 (the most common) and JPEG 2000 lossless.
COMPRESSED = {
    "jpeg_ls": ("MR_small_jpeg_ls_lossless.dcm", None),
    "rle": ("MR_small_RLE.dcm", None),
    "jpeg2000_mr": ("MR_small_jp2klossless.dcm", None),
    "jpeg2000_lossy_ct": ("693_J2KI.dcm", None),
    "jpeg_lossless_sv1": ("CT_small.dcm", _jpeg_lossless_sv1),
    "jpeg2000_lossless": ("CT_small.dcm", _jpeg2000_lossless),
}


@pytest.mark.parametrize("kind", sorted(COMPRESSED))
def test_compressed_slices_decode_as_simpleitk_and_dcm2niix(tmp_path, kind):
    source, compress = COMPRESSED[kind]
    uid, paths = write_series(tmp_path / "s", source=source, count=4, orientation="oblique", extra=compress)
    assert pydicom.dcmread(paths[0], stop_before_pixels=True).file_meta.TransferSyntaxUID.is_compressed
    plan, [volume] = read_ours(tmp_path / "s")
    theirs, their_affine = read_sitk(tmp_path / "s", uid)
    np.testing.assert_allclose(volume.affine, their_affine, atol=1e-4)
    np.testing.assert_array_equal(volume.voxels, theirs)
    assert volume.voxels.dtype == np.int16
    if compress is not None:  # Each slice its own pixels (stored + 10k): the order shows.
        assert [int(np.mean(volume.voxels[k] - volume.voxels[0])) for k in range(4)] == [0, 10, 20, 30]
    n2, n2_affine = read_dcm2niix(tmp_path / "s", tmp_path / "nii")
    assert_same_in_world(volume.voxels, volume.affine, n2, n2_affine)


@pytest.mark.parametrize("headers", [False, True], ids=["bytes", "headers"])
def test_scout_duplicate_and_nested_names(tmp_path, headers):
    uid, paths = write_series(tmp_path / "s" / "a" / "b", count=5, names="dcm")
    # A scout of another orientation in the same series, and a copy of one slice.
    write_series(tmp_path / "s" / "scout", count=1, orientation="sagittal", series_uid=uid)
    shutil.copy(paths[2], tmp_path / "s" / "copy_of_slice")
    plan, [volume] = read_ours(tmp_path / "s", headers=headers)
    reasons = sorted((reason, name) for name, reason, _ in plan.rejects)
    assert [r for r, _ in reasons] == ["duplicate", "too_few_slices"]
    assert volume.voxels.shape[0] == 5
    assert any("duplicate" in note for note in volume.notes)
    # SimpleITK on the clean slices agrees.
    theirs, their_affine = read_sitk(tmp_path / "s" / "a" / "b", uid)
    np.testing.assert_array_equal(volume.voxels, theirs)
    np.testing.assert_allclose(volume.affine, their_affine, atol=1e-4)


def test_monochrome1_is_inverted_as_the_2d_path_shows_it(tmp_path):
    """High values are bright in every record: MONOCHROME1 slices (0 is white) are inverted within
    their stored range, then rescaled; the 2-D path's PNG of a slice brightens with the volume's value."""
    import io

    from PIL import Image

    from imaging import dicom

    def monochrome1(ds, k):
        ds.PhotometricInterpretation = "MONOCHROME1"
        ds.BitsStored, ds.HighBit = 12, 11
        ds.PixelData = (np.clip(ds.pixel_array, 0, 4095)).astype(np.int16).tobytes()

    uid, paths = write_series(tmp_path / "m", count=3, extra=monochrome1)
    plan, [volume] = read_ours(tmp_path / "m")
    assert "monochrome1_inverted" in volume.notes and volume.voxels.dtype == np.int16
    # Signed 12-bit: the stored range is -2048..2047; CT_small's rescale is x1 - 1024.
    by_position = sorted(paths, key=lambda p: float(pydicom.dcmread(p).ImagePositionPatient[2]))
    for k, path in enumerate(by_position):
        stored = pydicom.dcmread(path).pixel_array.astype(np.int64)
        np.testing.assert_array_equal(volume.voxels[k], (-2048 + 2047 - stored) - 1024)
        # The 2-D path (window over the whole range) shows the same slice: brighter where ours is higher.
        (frame,) = dicom.decode_dicom(path.read_bytes(), path.name,
                                      dicom.DicomOptions(window=(float(stored.mean()), 4096.0)))
        png = np.asarray(Image.open(io.BytesIO(frame.png))).astype(np.int64)
        order = np.argsort(volume.voxels[k].ravel(), kind="stable")
        assert (np.diff(png.ravel()[order]) >= 0).all() and png.max() > png.min()


def test_missing_slice_is_rejected_with_positions(tmp_path):
    write_series(tmp_path / "s", count=6, skip=(3,))
    plan, stacks = read_ours(tmp_path / "s")
    assert stacks == []
    assert {reason for _, reason, _ in plan.rejects} == {"missing_slice"}
    assert len(plan.rejects) == 5
    assert "gap" in plan.rejects[0][2] and "2.500" in plan.rejects[0][2]


def _shift_from(first: int, mm: float):
    """`write_series`'s `extra`: slices `first`.. moved `mm` further along the (axial) normal."""
    def shift(ds, k):
        if k >= first:
            x, y, z = (float(v) for v in ds.ImagePositionPatient)
            ds.ImagePositionPatient = [f"{x:.6f}", f"{y:.6f}", f"{z + mm:.6f}"]
    return shift


def test_unequal_spacing_is_rejected_with_positions_and_a_small_jitter_is_not(tmp_path):
    # Steps 2.5, 2.5, 3.0, 2.5, 2.5: no gap of 1.5x, but one affine cannot place slices 3-5.
    write_series(tmp_path / "u", count=6, extra=_shift_from(3, 0.5))
    plan, stacks = read_ours(tmp_path / "u")
    assert stacks == [] and {r for _, r, _ in plan.rejects} == {"missing_slice"} and len(plan.rejects) == 6
    message = plan.rejects[0][2]
    assert "unequal spacing" in message and "(3.000 mm)" in message and "usual spacing 2.500" in message
    # 0.1 mm (4% of the spacing, as positions rounded by a scanner drift): one volume, as SimpleITK's.
    uid, _ = write_series(tmp_path / "j", count=6, extra=_shift_from(3, 0.1))
    plan, [volume] = read_ours(tmp_path / "j")
    assert plan.rejects == ()
    theirs, _ = read_sitk(tmp_path / "j", uid)
    np.testing.assert_array_equal(volume.voxels, theirs)


@pytest.mark.parametrize("headers", [False, True], ids=["bytes", "headers"])
def test_conflicting_and_repeated_positions(tmp_path, headers):
    uid, paths = write_series(tmp_path / "c", count=4)
    ds = pydicom.dcmread(paths[1])
    ds.PixelData = (ds.pixel_array + 1).astype(ds.pixel_array.dtype).tobytes()
    ds.SOPInstanceUID = generate_uid()
    ds.save_as(tmp_path / "c" / "other", enforce_file_format=True)
    plan, stacks = read_ours(tmp_path / "c", headers=headers)
    assert stacks == [] and {r for _, r, _ in plan.rejects} == {"conflicting_slices"}
    # Two time points: every position twice.
    uid, _ = write_series(tmp_path / "t", count=4)
    write_series(tmp_path / "t" / "t2", count=4, series_uid=uid,
                 extra=lambda ds, k: setattr(ds, "PixelData", (ds.pixel_array + 7).tobytes()))
    plan, stacks = read_ours(tmp_path / "t", headers=headers)
    assert stacks == [] and {r for _, r, _ in plan.rejects} == {"repeated_positions"}


def test_two_series_in_one_folder_and_too_few(tmp_path):
    a, _ = write_series(tmp_path / "s", count=3)
    b, _ = write_series(tmp_path / "s", count=4, orientation="coronal")
    plan, stacks = read_ours(tmp_path / "s")
    assert sorted(v.voxels.shape[0] for v in stacks) == [3, 4]
    plan, stacks = read_ours(tmp_path / "s", min_slices=4)
    assert [v.voxels.shape[0] for v in stacks] == [4]
    assert {r for _, r, _ in plan.rejects} == {"too_few_slices"} and len(plan.rejects) == 3


def write_enhanced(path: Path, frames: int = 5, series_uid=None):
    """An enhanced CT file of `frames` oblique frames stored top down (frame k: stored + 10k), its
    geometry and rescale in the functional groups; returns (dataset, stored order of the frames)."""
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    pixels = np.stack([ds.pixel_array + 10 * k for k in range(frames)]).astype(np.int16)
    rot = ORIENTATIONS["oblique"]
    origin = np.array([10.0, -20.0, 30.0])
    normal = np.cross(rot[:, 0], rot[:, 1])
    per_frame = []
    # Frames stored from the top down (dcm2niix, without DimensionIndexValues, takes frames
    # in stored order; any order is sorted the same here).
    order = list(range(frames))[::-1]
    pixels = pixels[order]
    for k in order:
        item = Dataset()
        pos = Dataset()
        pos.ImagePositionPatient = [f"{v:.6f}" for v in origin + k * 3.0 * normal]
        item.PlanePositionSequence = Sequence([pos])
        per_frame.append(item)
    shared = Dataset()
    orient = Dataset()
    orient.ImageOrientationPatient = [f"{v:.6f}" for v in (*rot[:, 0], *rot[:, 1])]
    shared.PlaneOrientationSequence = Sequence([orient])
    measures = Dataset()
    measures.PixelSpacing = ds.PixelSpacing
    measures.SliceThickness = "3.0"
    shared.PixelMeasuresSequence = Sequence([measures])
    transform = Dataset()
    transform.RescaleSlope = "1"
    transform.RescaleIntercept = "-1024"
    transform.RescaleType = "HU"
    shared.PixelValueTransformationSequence = Sequence([transform])
    ds.SharedFunctionalGroupsSequence = Sequence([shared])
    ds.PerFrameFunctionalGroupsSequence = Sequence(per_frame)
    for keyword in ("ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing",
                    "RescaleSlope", "RescaleIntercept", "SliceLocation", "SliceThickness",
                    "SpacingBetweenSlices"):
        if keyword in ds:
            delattr(ds, keyword)
    ds.NumberOfFrames = frames
    ds.PixelData = pixels.tobytes()
    ds.SeriesInstanceUID = series_uid or generate_uid()
    ds.SOPInstanceUID = generate_uid()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return ds, order


@pytest.mark.parametrize("headers", [False, True], ids=["bytes", "headers"])
def test_enhanced_multiframe_matches_dcm2niix(tmp_path, headers):
    ds, order = write_enhanced(tmp_path / "e" / "enhanced")
    plan, [volume] = read_ours(tmp_path / "e", headers=headers)
    assert volume.voxels.shape == (5, 128, 128)
    # Sorted by position: slice k holds stored + 10k - 1024.
    np.testing.assert_array_equal(volume.voxels[2], ds.pixel_array[order.index(2)] - 1024)
    np.testing.assert_allclose(volume.spacing[0], 3.0, rtol=1e-6)
    n2, n2_affine = read_dcm2niix(tmp_path / "e", tmp_path / "nii")
    assert_same_in_world(volume.voxels, volume.affine, n2, n2_affine)


@pytest.mark.parametrize("headers", [False, True], ids=["bytes", "headers"])
def test_each_enhanced_file_is_a_stack_by_itself(tmp_path, headers):
    """Two enhanced files of one series at the same positions (two time points): two volumes, never
    their frames mixed (which would be `conflicting_slices`)."""
    uid = generate_uid()
    first, order = write_enhanced(tmp_path / "e" / "t1", series_uid=uid)
    second, _ = write_enhanced(tmp_path / "e" / "t2", frames=4, series_uid=uid)
    plan, got = read_ours(tmp_path / "e", headers=headers)
    assert plan.rejects == () and sorted(v.voxels.shape[0] for v in got) == [4, 5]
    five = next(v for v in got if v.voxels.shape[0] == 5)
    np.testing.assert_array_equal(five.voxels[2], first.pixel_array[order.index(2)] - 1024)
    assert {s.slices[0].name for s in plan.stacks} == {"t1", "t2"}


@pytest.mark.parametrize("source", ["CT_small.dcm", "MR_small.dcm", "MR_small_jpeg_ls_lossless.dcm", "MR_small_RLE.dcm"])
def test_headers_give_the_slices_the_bytes_give_without_reading_the_pixels(source):
    """read_slice_headers reads a file's start only, and plans as read_slices does."""
    import io

    data = Path(get_testdata_file(source)).read_bytes()

    class Counting(io.BytesIO):
        def read(self, n=-1):
            out = super().read(n)
            self.most = max(getattr(self, "most", 0), self.tell())
            return out

    f = Counting(data)
    from_headers = volumes.read_slice_headers(f, "x")
    from_bytes = volumes.read_slices(data, "x")
    assert [dataclasses.replace(s, pixel_hash="") for s in from_bytes] == from_headers
    assert f.most < len(data) // 2  # The pixels were never read.
    report = pydicom.dcmread(get_testdata_file(source))
    del report.PixelData
    buffer = io.BytesIO()
    report.save_as(buffer, enforce_file_format=True)
    with pytest.raises(ImageRejected) as info:
        volumes.read_slice_headers(io.BytesIO(buffer.getvalue()), "report")
    assert info.value.reason == "no_pixel_data"


def test_mosaic_and_non_image(tmp_path):
    ds = pydicom.dcmread(get_testdata_file("MR_small.dcm"))
    ds.ImageType = ["ORIGINAL", "PRIMARY", "M", "ND", "MOSAIC"]
    path = tmp_path / "mosaic"
    ds.save_as(path, enforce_file_format=True)
    with pytest.raises(ImageRejected) as info:
        volumes.read_slices(path.read_bytes(), "mosaic")
    assert info.value.reason == "mosaic"
    with pytest.raises(ImageRejected) as info:
        volumes.read_slices(b"not dicom at all" * 100, "x")
    assert info.value.reason == "not_an_image"


@pytest.mark.parametrize("variant", ["sform", "qform", "scaled", "scaled_whole", "gz", "qform_gz"])
def test_nifti_as_nibabel_reads_it(tmp_path, variant):
    rng = np.random.default_rng(1)
    data = rng.integers(-100, 100, size=(7, 6, 5)).astype(np.int16)
    affine = np.array([[-0.9, 0.1, 0, 90.0], [0.05, 0.8, 0.1, -120.0], [0, -0.1, 2.0, 40.0], [0, 0, 0, 1]])
    image = nibabel.Nifti1Image(data, None)
    if variant.startswith("qform"):
        image.set_qform(np.diag([-1.0, 1.0, 3.0, 1.0]) + np.array([[0, 0, 0, 5], [0] * 4, [0] * 4, [0] * 4]), code=1)
        image.set_sform(None, code=0)
    else:
        image.set_sform(affine, code=2)
        image.set_qform(np.eye(4), code=1)  # the sform wins when both are set
    if variant == "scaled":
        image.header.set_slope_inter(0.5, 10.0)
    if variant == "scaled_whole":  # CT in HU from stored values: whole numbers, int16 again.
        image.header.set_slope_inter(2.0, -1024.0)
    path = tmp_path / ("v.nii.gz" if variant.endswith("gz") else "v.nii")
    nibabel.save(image, path)
    volume = volumes.read_nifti(path.read_bytes(), path.name)
    back = nibabel.load(path)
    np.testing.assert_array_equal(volume.voxels, np.asarray(back.get_fdata()).transpose(2, 1, 0))
    np.testing.assert_allclose(volume.affine, back.affine)
    if variant.startswith("qform"):
        np.testing.assert_allclose(volume.affine, back.get_qform())
        assert volume.notes == ("affine_from_qform",)
        assert volume.spacing == (3.0, 1.0, 1.0)
    else:
        np.testing.assert_allclose(volume.affine, affine)
    assert volume.voxels.dtype == (np.float32 if variant == "scaled" else np.int16)


def test_nifti_4d_is_not_a_volume(tmp_path):
    path = tmp_path / "t.nii"
    nibabel.save(nibabel.Nifti1Image(np.zeros((3, 3, 3, 2), np.int16), np.eye(4)), path)
    with pytest.raises(ImageRejected) as info:
        volumes.read_nifti(path.read_bytes(), "t.nii")
    assert info.value.reason == "not_a_volume"


def test_nifti_voxels_from_the_first_bytes_of_a_nii_or_nii_gz(tmp_path):
    """What --masks_dir's shard sizing counts a NIfTI volume's mask by: its voxels, from the header alone."""
    image = nibabel.Nifti2Image(np.zeros((5, 7, 3), np.float32), np.eye(4))
    for name in ("v.nii", "v.nii.gz"):
        nibabel.save(image, tmp_path / name)
        head = (tmp_path / name).read_bytes()[:1024]  # A gzipped header inflates from a few hundred.
        assert volumes.nifti_voxels(head) == 105, name
    four_d = nibabel.Nifti1Image(np.zeros((2, 3, 4, 1), np.int16), np.eye(4)).to_bytes()
    assert volumes.nifti_voxels(four_d[:400]) == 24
    assert volumes.nifti_voxels(b"\x1f\x8b" + bytes(200)) is None  # A damaged gzip: the writer says why.
    assert volumes.nifti_voxels(b"not a header") is None


def _nifti_bytes(**fields) -> bytes:
    """The smallest NIfTI-1 file (2x3x4 int16, nibabel's), with header fields (offset: (size, value)) overwritten."""
    import struct

    data = bytearray(nibabel.Nifti1Image(np.arange(24, dtype=np.int16).reshape(2, 3, 4), np.eye(4)).to_bytes())
    for at, (fmt, value) in fields.items():
        struct.pack_into(fmt, data, int(at), value)
    return bytes(data)


def test_nifti_with_an_empty_dimension_is_corrupt_not_an_internal_error():
    """Found by bench.mutations_convert (issue 39): dim[2]=0 raised the schema's ValueError later."""
    with pytest.raises(ImageRejected) as info:
        volumes.read_nifti(_nifti_bytes(**{"44": ("<h", 0)}), "v.nii")
    assert info.value.reason == "corrupt" and "empty volume of shape (2, 0, 4)" in info.value.message


def test_nifti_whose_header_claims_more_voxels_than_it_holds_is_refused_before_they_are_allocated():
    """dim = 1024 x 1024 x 512 int16 (1 GiB) in a 400-byte file: nibabel would allocate 1 GiB to read it."""
    data = _nifti_bytes(**{"42": ("<h", 1024), "44": ("<h", 1024), "46": ("<h", 512)})
    rejected, peak = _refused_with_peak(data, "v.nii")
    assert rejected.reason == "corrupt", rejected
    assert "(1024, 1024, 512) voxels of int16 from byte 352, 1,073,742,176 bytes; the file holds 400" \
        in rejected.message
    assert peak < 16 << 20


def _refused_with_peak(data: bytes, name: str):
    """(the ImageRejected `read_nifti` raises, the peak of Python's allocations while it ran)."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(ImageRejected) as info:
            volumes.read_nifti(data, name)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info.value, peak


def test_nifti_gz_whose_deflate_stream_is_damaged_is_corrupt_not_an_internal_error():
    """Found by a mutation run of mask files (mfuzz12): a bit flipped in a .nii.gz's deflate stream
    makes zlib raise zlib.error ('invalid bit length repeat'), which is no OSError: it escaped as
    an internal_error. Every flip of the gzip is read or rejected with a reason."""
    import gzip
    import zlib

    data = gzip.compress(_nifti_bytes(), mtime=0)
    zlib_errors = 0
    for at in range(2, len(data)):
        for bit in (0, 5):
            damaged = bytearray(data)
            damaged[at] ^= 1 << bit
            try:
                gzip.decompress(bytes(damaged))
            except zlib.error:
                zlib_errors += 1
            except (OSError, EOFError):
                pass
            try:
                volumes.read_nifti(bytes(damaged), "v.nii.gz")
            except ImageRejected as e:
                assert e.reason in ("corrupt", "not_an_image"), (at, bit, e)
    assert zlib_errors > 10  # The flips include those zlib itself refuses.


def test_nifti_gz_is_inflated_only_as_far_as_its_header_asks():
    """A .nii.gz with 100 MiB of zeros after its voxels is refused without keeping them (a gzip
    bomb); one whose sizeof_hdr nibabel fixes up is read as nibabel reads it."""
    import gzip
    import struct
    import zlib

    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    bomb = deflate.compress(_nifti_bytes()) + b"".join(deflate.compress(bytes(1 << 22)) for _ in range(25))
    bomb += deflate.flush()
    rejected, peak = _refused_with_peak(bomb, "v.nii.gz")
    assert rejected.reason == "corrupt" and "a gzip bomb" in rejected.message, rejected
    assert peak < 16 << 20
    for cls in (nibabel.Nifti1Image, nibabel.Nifti2Image):
        data = bytearray(cls(np.arange(24, dtype=np.int16).reshape(2, 3, 4), np.eye(4)).to_bytes())
        struct.pack_into("<i", data, 0, 0)
        volume = volumes.read_nifti(gzip.compress(bytes(data)), "v.nii.gz")
        np.testing.assert_array_equal(volume.voxels, np.arange(24, dtype=np.int16).reshape(2, 3, 4).transpose(2, 1, 0))


def test_nibabels_header_fixes_stay_off_the_console(tmp_path):
    """sizeof_hdr=0: nibabel fixes the header and logs it on a handler of its own (twice, with the
    root's); shardsmith reads the file and the console stays quiet (found by bench.mutations_convert)."""
    path = tmp_path / "v.nii"
    path.write_bytes(_nifti_bytes(**{"0": ("<i", 0)}))
    code = ("import sys; from conversion import console; console.configure_logging(False); "
            "from imaging import volumes; v = volumes.read_nifti(open(sys.argv[1], 'rb').read(), 'v.nii'); "
            "print(v.voxels.shape)")
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(4, 3, 2)" and result.stderr == "", result.stderr
    loud = subprocess.run([sys.executable, "-c", code.replace("configure_logging(False)", "configure_logging(True)"),
                           str(path)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert "sizeof_hdr should be 348" in loud.stderr  # --verbose shows it.


@pytest.mark.parametrize("field, value", [("BitsStored", 56080), ("BitsStored", 65), ("BitsAllocated", 12),
                                          ("BitsAllocated", 65535)])
def test_a_slice_whose_bits_are_no_sample_size_is_corrupt(tmp_path, field, value):
    """Found by bench.mutations_convert (issue 39): BitsStored 56080 gave a stored range of 16,882
    digits, which stopped the whole conversion (exit 2) when its plan was written as JSON."""
    import io

    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    setattr(ds, field, value)
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    with pytest.raises(ImageRejected) as info:
        volumes.read_slice_headers(io.BytesIO(buf.getvalue()), "s.dcm")
    assert info.value.reason == "corrupt" and "are no sample size" in info.value.message


@pytest.mark.parametrize("samples", [65535, 0, 32520])
def test_a_slice_whose_samples_per_pixel_is_no_pixels_is_corrupt_alone(samples):
    """Found by bench.mutations_convert (issue 39): SamplesPerPixel 65535 in one slice was "colour
    pixels" when the series was read, and every slice of the series was rejected as unsupported_dtype."""
    import io

    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    ds.SamplesPerPixel = samples
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    with pytest.raises(ImageRejected) as info:
        volumes.read_slice_headers(io.BytesIO(buf.getvalue()), "s.dcm")
    assert info.value.reason == "corrupt" and f"SamplesPerPixel {samples} is no pixel's" in info.value.message


def test_a_slice_without_rows_is_corrupt_not_an_internal_error():
    """Found by bench.mutations_convert (issue 39): a slice whose Rows element was dropped."""
    import io

    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    del ds.Rows
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    with pytest.raises(ImageRejected) as info:
        volumes.read_slice_headers(io.BytesIO(buf.getvalue()), "s.dcm")
    assert info.value.reason == "corrupt" and "no Rows and Columns" in info.value.message


def test_nifti_whose_affine_is_not_finite_is_corrupt_not_an_internal_error():
    """Found by bench.mutations_convert (issue 39): srow_x[0] set to all ones (a NaN) with sform_code set."""
    data = _nifti_bytes(**{"254": ("<h", 2), "280": ("<I", 0xFFFFFFFF)})
    with pytest.raises(ImageRejected) as info:
        volumes.read_nifti(data, "v.nii")
    assert info.value.reason == "corrupt" and "its affine is not finite" in info.value.message


@pytest.mark.parametrize("slope", [1e300, 1e39])  # 1e39: finite, past float32 once scaled
def test_nifti2_whose_scaling_overflows_float32_is_corrupt_not_stored_as_inf(slope):
    """Found by bench.mutations_convert's NIfTI-2 cases (issue 39): scl_slope set to a huge double
    scaled int16 voxels past float32, and the record held inf."""
    import struct

    data = bytearray(nibabel.Nifti2Image(np.arange(24, dtype=np.int16).reshape(2, 3, 4), np.eye(4)).to_bytes())
    struct.pack_into("<d", data, 176, slope)  # NIfTI-2's scl_slope
    with pytest.raises(ImageRejected) as info:
        volumes.read_nifti(bytes(data), "v.nii")
    assert info.value.reason == "corrupt" and "scale its voxels past float32's range" in info.value.message
    # NaN stored as float (outside a brain mask) is the data's own: kept, scaled.
    values = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    values[0, 0, 0] = np.nan
    image = nibabel.Nifti2Image(values, np.eye(4))
    image.header.set_slope_inter(2.0, 1.0)
    volume = volumes.read_nifti(image.to_bytes(), "f.nii")
    np.testing.assert_array_equal(volume.voxels, (values * 2 + 1).transpose(2, 1, 0))


@pytest.mark.parametrize("damage", ["length 0", "VR US", "implicit length 0"])
def test_a_slice_whose_pixel_data_holds_no_bytes_is_corrupt_from_its_header(tmp_path, damage):
    """Found by bench.mutations_convert (issue 39): a slice whose PixelData length was set to 0
    planned as a good slice, then its series failed in pydicom's decoder (TypeError, internal_error)."""
    import io
    import struct

    source = "MR_small_implicit.dcm" if damage.startswith("implicit") else "CT_small.dcm"
    data = bytearray(pathlib_bytes(get_testdata_file(source)))
    at = data.rfind(b"\xe0\x7f\x10\x00")
    if damage == "implicit length 0":
        struct.pack_into("<I", data, at + 4, 0)
    elif damage == "length 0":
        assert data[at + 4:at + 6] == b"OW"
        struct.pack_into("<I", data, at + 8, 0)
    else:
        data[at + 4:at + 6] = b"US"
    with pytest.raises(ImageRejected) as info:
        volumes.read_slice_headers(io.BytesIO(bytes(data)), "s.dcm")
    assert info.value.reason == "corrupt" and "PixelData element" in info.value.message, info.value
    # The undamaged file plans as before.
    assert volumes.read_slice_headers(io.BytesIO(pathlib_bytes(get_testdata_file(source))), "s.dcm")


def pathlib_bytes(path) -> bytes:
    return Path(path).read_bytes()


def _uncompressed_slices(syntax, signed, photometric, count=3):
    """12-bit slices whose unused high bits are set (pydicom drops them), as bytes by name."""
    import io

    files = {}
    for k in range(count):
        ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
        ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 12, 11, signed
        ds.PhotometricInterpretation = photometric
        ds.PixelData = np.random.default_rng(k).integers(0, 65535, (128, 128), dtype=np.uint16).tobytes()
        ds.ImagePositionPatient = [0, 0, 2 * k]
        ds.file_meta.TransferSyntaxUID = syntax
        buffer = io.BytesIO()
        ds.save_as(buffer, implicit_vr=syntax == pydicom.uid.ImplicitVRLittleEndian, little_endian=True)
        files[f"s{k}"] = buffer.getvalue()
    return files


@pytest.mark.parametrize("syntax", [pydicom.uid.ImplicitVRLittleEndian, pydicom.uid.ExplicitVRLittleEndian])
@pytest.mark.parametrize("signed,photometric", [(1, "MONOCHROME2"), (0, "MONOCHROME2"), (0, "MONOCHROME1")])
def test_uncompressed_slices_read_where_they_lie_give_pydicoms_values(syntax, signed, photometric):
    """Read at the offset planning found (no second parse), the values are pydicom's, high bits dropped."""
    import io

    files = _uncompressed_slices(syntax, signed, photometric)
    slices = [s for name, data in files.items() for s in volumes.read_slice_headers(io.BytesIO(data), name)]
    assert all(s.pixel_offset > 0 for s in slices)
    volume = volumes.read_stack(volumes.plan_stacks(slices).stacks[0], files.__getitem__)
    expected = []
    for name in sorted(files):
        ds = pydicom.dcmread(io.BytesIO(files[name]))
        values = ds.pixel_array.astype(np.float64)
        if photometric == "MONOCHROME1":
            values = 4095 - values
        expected.append(values * float(ds.RescaleSlope) + float(ds.RescaleIntercept))
    assert volume.voxels.dtype == np.int16
    np.testing.assert_array_equal(volume.voxels, np.stack(expected))


def test_a_slice_changed_after_planning_is_decoded_by_pydicom_not_read_at_a_stale_offset():
    """A file rewritten between planning and writing (a longer header): its pixels are still its own."""
    import io

    files = _uncompressed_slices(pydicom.uid.ExplicitVRLittleEndian, 1, "MONOCHROME2")
    slices = [s for name, data in files.items() for s in volumes.read_slice_headers(io.BytesIO(data), name)]
    ds = pydicom.dcmread(io.BytesIO(files["s1"]))
    ds.StudyDescription = "a longer header" * 8
    buffer = io.BytesIO()
    ds.save_as(buffer)
    files["s1"] = buffer.getvalue()
    volume = volumes.read_stack(volumes.plan_stacks(slices).stacks[0], files.__getitem__)
    np.testing.assert_array_equal(volume.voxels[1], ds.pixel_array.astype(np.int16) * int(ds.RescaleSlope)
                                  + int(ds.RescaleIntercept))


@pytest.mark.parametrize("signed,photometric,slope,intercept,dtype", [
    (0, "MONOCHROME2", 1, -1024, np.int32),  # 16-bit unsigned with an intercept: beyond int16, widened
    (0, "MONOCHROME1", 2, -3, np.int32),
    (1, "MONOCHROME2", -1, -1, np.int16),  # -x - 1 of every int16 is an int16
    (1, "MONOCHROME2", 0.5, 0, np.float32),
])
def test_rescaled_and_inverted_values_are_the_float_formulas_in_the_dtype_it_needs(signed, photometric, slope,
                                                                                   intercept, dtype):
    """Whole rescales are computed in integers, widened to int32 as needed; the values are the formula's."""
    import io

    files, expected = {}, []
    for k in range(3):
        ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
        ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 15, signed
        ds.PhotometricInterpretation = photometric
        ds.RescaleSlope, ds.RescaleIntercept = slope, intercept
        values = np.random.default_rng(k).integers(0, 65535, (128, 128), dtype=np.uint16)
        ds.PixelData = values.tobytes()
        ds.ImagePositionPatient = [0, 0, 2 * k]
        buffer = io.BytesIO()
        ds.save_as(buffer)
        files[f"s{k}"] = buffer.getvalue()
        stored = values.view(np.int16 if signed else np.uint16).astype(np.float64)
        if photometric == "MONOCHROME1":
            stored = (65535 if not signed else -1) - stored
        expected.append(stored * slope + intercept)
    slices = [s for name, data in files.items() for s in volumes.read_slice_headers(io.BytesIO(data), name)]
    volume = volumes.read_stack(volumes.plan_stacks(slices).stacks[0], files.__getitem__)
    assert volume.voxels.dtype == dtype
    np.testing.assert_array_equal(volume.voxels, np.stack(expected).astype(dtype))


@pytest.mark.parametrize("header_padding", [0, 20000])
def test_headers_of_large_files_read_from_their_start_in_memory_are_the_whole_files(tmp_path, header_padding):
    """A 512x512 slice's header parsed from its first bytes; a header longer than them from the file."""
    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    ds.Rows = ds.Columns = 512
    ds.PixelData = np.arange(512 * 512, dtype=np.int16).tobytes()
    if header_padding:
        ds.ImageComments = "x" * header_padding  # The header ends past the bytes read first.
    path = tmp_path / "s.dcm"
    ds.save_as(path, enforce_file_format=True)
    with open(path, "rb") as f:
        from_header = volumes.read_slice_headers(f, "s.dcm")
    from_bytes = volumes.read_slices(path.read_bytes(), "s.dcm")
    assert [dataclasses.replace(s, pixel_hash="") for s in from_bytes] == from_header
    assert from_header[0].pixel_offset == pydicom.dcmread(path)["PixelData"].file_tell  # Where pydicom read them.


def test_a_pixel_element_with_an_implicit_vr_header_in_an_explicit_vr_file_holds_pixels():
    """pydicom's SC_rgb_jpeg.dcm: explicit VR, its PixelData written as tag + FFFFFFFF (no VR).

    pydicom reads that element as implicit VR and decodes it; the volume path's header check
    rejected it as corrupt ("VR 'ÿÿ' holds no pixel bytes"), a whole series with it.
    """
    import io

    from imaging import dicom

    data = pathlib_bytes(get_testdata_file("SC_rgb_jpeg.dcm"))
    at = data.rfind(b"\xe0\x7f\x10\x00")
    assert data[at + 4:at + 8] == b"\xff\xff\xff\xff"
    with pytest.warns(UserWarning, match="Expected explicit VR, but found implicit VR"):
        assert pydicom.dcmread(io.BytesIO(data)).pixel_array.shape == (256, 256, 3)
    ds, keyword, offset = dicom.read_header(io.BytesIO(data), "sc.dcm")
    assert keyword == "PixelData" and offset == -1


def test_an_image_without_a_position_is_not_a_volume_and_a_malformed_one_is_corrupt():
    """pydicom's SC_rgb_small_odd.dcm, a secondary capture (no Image Plane module), is a valid image that no
    volume can place: `not_a_volume`, not `corrupt`; an orientation of 5 numbers stays corrupt."""
    import io

    data = pathlib_bytes(get_testdata_file("SC_rgb_small_odd.dcm"))
    assert "ImageOrientationPatient" not in pydicom.dcmread(io.BytesIO(data))
    with pytest.raises(ImageRejected) as info:
        volumes.read_slice_headers(io.BytesIO(data), "sc.dcm")
    assert info.value.reason == "not_a_volume" and "has no ImageOrientationPatient" in info.value.message
    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1]
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    with pytest.raises(ImageRejected) as info:
        volumes.read_slice_headers(io.BytesIO(buf.getvalue()), "ct.dcm")
    assert info.value.reason == "corrupt" and "is not 6 numbers" in info.value.message


@pytest.mark.parametrize("source", ["rtdose.dcm", "rtdose_expb.dcm", "rtdose_rle.dcm"])
def test_an_rt_dose_grid_is_placed_by_its_frame_offsets_and_scaled_to_dose(source):
    """pydicom's RT Dose files: 15 frames, one ImagePositionPatient, GridFrameOffsetVector 0, 5, ..., 70
    and DoseGridScaling 1e-6. Read as 15 frames at one place they were `conflicting_slices`."""
    import io

    data = pathlib_bytes(get_testdata_file(source))
    ds = pydicom.dcmread(io.BytesIO(data))
    slices = volumes.read_slice_headers(io.BytesIO(data), source)
    first = np.array([float(v) for v in ds.ImagePositionPatient])
    offsets = [float(v) for v in ds.GridFrameOffsetVector]
    assert [s.position for s in slices] == [tuple(first + (0, 0, z)) for z in offsets]
    plan = volumes.plan_stacks(slices)
    assert not plan.rejects, plan.rejects
    volume = volumes.read_stack(plan.stacks[0], {source: data}.__getitem__)
    assert volume.voxels.dtype == np.float32 and volume.spacing == (5.0, 10.0, 10.0)
    np.testing.assert_allclose(volume.voxels, ds.pixel_array * float(ds.DoseGridScaling), rtol=1e-6)
    # The last frame's voxel (0, 0, 14) lies 70 mm above the first: RAS (-x, -y, z) of LPS.
    np.testing.assert_allclose(volume.affine @ [0, 0, 14, 1], [-first[0], -first[1], first[2] + 70, 1])


@pytest.mark.parametrize("image_class, kind", [(nibabel.Nifti1Pair, "a NIfTI .hdr/.img pair"),
                                               (nibabel.Nifti2Pair, "a NIfTI .hdr/.img pair"),
                                               (nibabel.AnalyzeImage, "an Analyze 7.5 .hdr/.img pair")])
def test_a_pair_header_is_named_as_what_it_is_not_only_as_not_dicom(tmp_path, image_class, kind):
    """nibabel's .hdr/.img pairs (SPM's format) under --volumes: "not a DICOM file" was true, and no help."""
    import io

    nibabel.save(image_class(np.arange(24, dtype=np.int16).reshape(2, 3, 4), np.eye(4)), tmp_path / "v.img")
    header, data = (tmp_path / "v.hdr").read_bytes(), (tmp_path / "v.img").read_bytes()
    for read in (lambda b: volumes.read_slice_headers(io.BytesIO(b), "v.hdr"),
                 lambda b: volumes.read_slices(b, "v.hdr")):
        with pytest.raises(ImageRejected) as info:
            read(header)
        assert info.value.reason == "not_an_image"
        assert f"v.hdr is the header of {kind}, which --volumes does not read" in info.value.message
    with pytest.raises(ImageRejected) as info:
        volumes.read_slice_headers(io.BytesIO(data), "v.img")
    assert info.value.message == "v.img is neither a DICOM file nor a NIfTI file (.nii, .nii.gz)"


@pytest.mark.filterwarnings("ignore:'FileDataset.is_:DeprecationWarning")
def test_seg_and_rtstruct_are_no_volumes(tmp_path):
    """A SEG's frames and an RTSTRUCT (no pixels) are masks of a series: 'segmentation_object'
    (skipped, naming --masks_dir), from the whole file and from its header alike."""
    import io as _io

    from rt_utils import RTStructBuilder

    import schemas
    from test_imaging_dicom_masks import blobs, grid_of, sources_in_k_order, stacked, write_seg
    from test_imaging_dicom_masks import write_series as write_ct

    folder = tmp_path / "s"
    write_ct(folder, count=4)
    grid, _ = grid_of(folder)
    seg = write_seg(sources_in_k_order(folder, grid), stacked(blobs(4, 1), 1), count=1)
    builder = RTStructBuilder.create_new(dicom_series_path=str(folder))
    builder.add_roi(mask=np.ascontiguousarray((blobs(4, 1) == 1).transpose(1, 2, 0)), name="a")
    builder.save(str(tmp_path / "rs.dcm"))
    for data, what in ((seg, "Segmentation (SEG)"), ((tmp_path / "rs.dcm").read_bytes(), "RT Structure Set")):
        for read in (lambda d: volumes.read_slices(d, "x.dcm"),
                     lambda d: volumes.read_slice_headers(_io.BytesIO(d), "x.dcm")):
            with pytest.raises(ImageRejected) as e:
                read(data)
            assert e.value.reason == "segmentation_object"
            assert what in e.value.message and "--masks_dir" in e.value.message
    assert "segmentation_object" in schemas.SKIP_REASONS
