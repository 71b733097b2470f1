"""imaging.dicom_masks against independent writers and readers of DICOM SEG and RTSTRUCT.

SEGs are written by highdicom (the reference implementation of the standard's Segmentation
IOD) from known label blobs, and read back by highdicom too, and by dcmqi (3D Slicer's SEG
writer) from label images placed by SimpleITK; RTSTRUCTs by rt-utils (contours
traced from masks by OpenCV) and by pydicom here with contours of known shapes, whose truth
scikit-image's polygon rasteriser draws. Series are pydicom-written CT slices (pydicom's
bundled CT_small) planned by imaging.volumes as a conversion plans them.
"""

import dataclasses
import io
import json
import pathlib
import random
import shutil
import subprocess
import sys

import highdicom as hd
import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from pydicom.data import get_testdata_file
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.pixels import pack_bits, unpack_bits
from pydicom.sequence import Sequence
from pydicom.uid import generate_uid
from rt_utils import RTStructBuilder
from skimage.draw import polygon

from imaging import ImageRejected
from imaging import dicom_masks, volumes
from imaging.dicom_masks import SeriesGrid

# dcmqi's wheel puts its tools beside the interpreter; `make test` may not have them on PATH.
ITKIMAGE2SEGIMAGE = shutil.which("itkimage2segimage") or str(pathlib.Path(sys.executable).parent / "itkimage2segimage")
SIZE = 128  # CT_small's rows and columns (0.661468 mm pixels, equal: rt-utils swaps them).
ORIENTATIONS = {
    "axial": (np.array([1.0, 0, 0]), np.array([0, 1.0, 0])),
    # Oblique: rows and columns rotated about two axes (the grid's affine is no permutation).
    "oblique": (np.array([0.9659258, 0.2588190, 0.0]), np.array([-0.2432103, 0.9076734, 0.3420201])),
}


def write_series(folder, count=8, orientation="axial", spacing=2.5, descending=False, series_uid=None,
                 frame_of_reference=None):
    """`count` CT slices of one series in `folder` under shuffled names; (series uid, FoR uid, paths)."""
    folder.mkdir(parents=True, exist_ok=True)
    row, column = ORIENTATIONS[orientation]
    normal = np.cross(row, column)
    series_uid, frame_of_reference = series_uid or generate_uid(), frame_of_reference or generate_uid()
    rng = random.Random(count)
    paths = []
    for k in range(count):
        ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
        position = np.array([-80.5, -91.25, 12.0]) + (count - 1 - k if descending else k) * spacing * normal
        ds.ImagePositionPatient = [f"{v:.6f}" for v in position]
        ds.ImageOrientationPatient = [f"{v:.7f}" for v in (*row, *column)]
        ds.SeriesInstanceUID, ds.FrameOfReferenceUID, ds.SOPInstanceUID = series_uid, frame_of_reference, generate_uid()
        ds.InstanceNumber = rng.randint(1, 999)
        path = folder / f"x{rng.randint(0, 10**9):09d}.dcm"
        ds.save_as(path, enforce_file_format=True)
        paths.append(path)
    return series_uid, frame_of_reference, paths


def grid_of(folder):
    """The series' grid as a conversion would plan it (imaging.volumes), and its volume."""
    slices = [s for p in sorted(folder.iterdir()) for s in volumes.read_slices(p.read_bytes(), p.name)]
    plan = volumes.plan_stacks(slices)
    assert len(plan.stacks) == 1, plan
    stack = plan.stacks[0]
    return SeriesGrid.from_stack(stack), volumes.read_stack(stack, lambda n: (folder / n).read_bytes())


def sources_in_k_order(folder, grid):
    by_uid = {}
    for path in folder.iterdir():
        ds = pydicom.dcmread(path)
        by_uid[ds.SOPInstanceUID] = ds
    return [by_uid[uid] for uid in grid.sop_instance_uids]


def blobs(depth, segments=3, seed=0):
    """Truth: `segments` label blobs (ellipsoids, a box), some touching; (depth, SIZE, SIZE) uint8."""
    rng = np.random.default_rng(seed)
    k, j, i = np.meshgrid(np.arange(depth), np.arange(SIZE), np.arange(SIZE), indexing="ij")
    labels = np.zeros((depth, SIZE, SIZE), np.uint8)
    for number in range(1, segments + 1):
        c = (rng.uniform(1, depth - 2), rng.uniform(25, SIZE - 25), rng.uniform(25, SIZE - 25))
        r = (rng.uniform(1.5, 3), rng.uniform(8, 20), rng.uniform(8, 20))
        labels[((k - c[0]) / r[0]) ** 2 + ((j - c[1]) / r[1]) ** 2 + ((i - c[2]) / r[2]) ** 2 <= 1] = number
    return labels


def descriptions(count):
    return [hd.seg.SegmentDescription(
        segment_number=n, segment_label=f"organ {n}",
        segmented_property_category=hd.sr.CodedConcept("91723000", "SCT", "Anatomical Structure"),
        segmented_property_type=hd.sr.CodedConcept("10200004", "SCT", "Liver"),
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL) for n in range(1, count + 1)]


def write_seg(sources, pixel_array, segment_type="BINARY", count=3, **kwargs):
    seg = hd.seg.Segmentation(
        source_images=sources, pixel_array=pixel_array, segmentation_type=segment_type,
        segment_descriptions=descriptions(count), series_instance_uid=generate_uid(), series_number=99,
        sop_instance_uid=generate_uid(), instance_number=1, manufacturer="test", manufacturer_model_name="test",
        software_versions="1", device_serial_number="1", **kwargs)
    out = io.BytesIO()
    seg.save_as(out)
    return out.getvalue()


def stacked(labels, count):
    """A label volume as highdicom's stacked-segments array (slices, rows, columns, segments) of bools."""
    return np.stack([labels == n for n in range(1, count + 1)], axis=-1)


def rewrite(data, change):
    ds = pydicom.dcmread(io.BytesIO(data))
    change(ds)
    out = io.BytesIO()
    ds.save_as(out)
    return out.getvalue()


def shuffle_frames(ds, seed=1):
    """The SEG's frames (pixels and per-frame groups together) in a random order."""
    frames, rows, columns = int(ds.NumberOfFrames), int(ds.Rows), int(ds.Columns)
    if int(ds.BitsAllocated) == 1:
        pixels = unpack_bits(ds.PixelData)[:frames * rows * columns].reshape(frames, rows * columns)
    else:
        pixels = np.frombuffer(ds.PixelData, np.uint8 if int(ds.BitsAllocated) == 8 else np.uint16)
        pixels = pixels[:frames * rows * columns].reshape(frames, rows * columns)
    order = np.random.default_rng(seed).permutation(frames)
    assert (order != np.arange(frames)).any()
    pixels = pixels[order]
    ds.PixelData = pack_bits(pixels.ravel()) if int(ds.BitsAllocated) == 1 else pixels.tobytes()
    ds.PerFrameFunctionalGroupsSequence = Sequence([ds.PerFrameFunctionalGroupsSequence[int(i)] for i in order])
    # The dimension index no longer says the order; readers must use each frame's own references.
    if "DimensionOrganizationType" in ds:
        del ds.DimensionOrganizationType


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ct") / "series"
    series_uid, frame_of_reference, _ = write_series(folder, count=8)
    grid, volume = grid_of(folder)
    return folder, grid, volume


# --- the grid ---------------------------------------------------------------------------------


@pytest.mark.parametrize("orientation", ["axial", "oblique"])
@pytest.mark.parametrize("descending", [False, True])
def test_grid_is_the_volume_s(tmp_path, orientation, descending):
    series_uid, frame_of_reference, paths = write_series(tmp_path / "s", count=5, orientation=orientation,
                                                         descending=descending)
    grid, volume = grid_of(tmp_path / "s")
    assert grid.shape == volume.voxels.shape
    np.testing.assert_array_equal(grid.affine, volume.affine)
    assert (grid.series_uid, grid.frame_of_reference_uid) == (series_uid, frame_of_reference)
    # sop_instance_uids in k order: slice k's ImagePositionPatient is the affine's voxel (0, 0, k).
    positions = {pydicom.dcmread(p).SOPInstanceUID: np.array(pydicom.dcmread(p).ImagePositionPatient, float)
                 for p in paths}
    for k, uid in enumerate(grid.sop_instance_uids):
        np.testing.assert_allclose(grid.to_voxels(positions[uid])[0], (0, 0, k), atol=1e-5)
    assert grid.frames == (0,) * 5


def test_grid_from_headers_and_from_a_plan_file(tmp_path):
    """The converter plans from headers (`read_slice_headers`) and hands stacks to its workers as
    JSON (`Stack.to_json`): the grid made there is the one made from whole files."""
    write_series(tmp_path / "s", count=5, orientation="oblique")
    grid, _ = grid_of(tmp_path / "s")
    slices = []
    for path in sorted((tmp_path / "s").iterdir()):
        with open(path, "rb") as f:
            slices += volumes.read_slice_headers(f, path.name)
    stack = volumes.plan_stacks(slices).stacks[0]
    for again in (stack, volumes.Stack.from_json(json.loads(json.dumps(stack.to_json())))):
        other = SeriesGrid.from_stack(again)
        assert (other.shape, other.sop_instance_uids, other.frames, other.series_uid, other.frame_of_reference_uid) == \
               (grid.shape, grid.sop_instance_uids, grid.frames, grid.series_uid, grid.frame_of_reference_uid)
        np.testing.assert_array_equal(other.affine, grid.affine)
    # A plan file written before slices carried these UIDs still loads (without them).
    old = stack.to_json()
    for item in old["slices"]:
        del item["sop_instance_uid"], item["frame_of_reference_uid"]
    assert SeriesGrid.from_stack(volumes.Stack.from_json(old)).sop_instance_uids == ("",) * 5


def test_grid_options_are_validated():
    with pytest.raises(ValueError, match="`shape`"):
        SeriesGrid((2, 3), np.eye(4))
    with pytest.raises(ValueError, match="`affine`"):
        SeriesGrid((2, 3, 4), np.zeros((4, 4)))
    with pytest.raises(ValueError, match="`sop_instance_uids`.*Received: 1"):
        SeriesGrid((2, 3, 4), np.eye(4), sop_instance_uids=("1.2",))


# --- SEG ---------------------------------------------------------------------------------------


def highdicom_labels(data, grid):
    """highdicom's own reading of the SEG, slice by slice of the series (its labels: segment numbers)."""
    seg = hd.seg.Segmentation.from_dataset(pydicom.dcmread(io.BytesIO(data)))
    return seg.get_pixels_by_source_instance(list(grid.sop_instance_uids), combine_segments=True, relabel=False)


@pytest.mark.parametrize("shuffled", [False, True])
def test_binary_seg_matches_truth_and_highdicom(series, shuffled):
    folder, grid, _ = series
    truth = blobs(grid.shape[0])
    data = write_seg(sources_in_k_order(folder, grid), stacked(truth, 3))
    if shuffled:
        data = rewrite(data, shuffle_frames)
    mask = dicom_masks.labels_from_seg(data, "seg.dcm", grid)
    assert mask.labels.dtype == np.uint8 and mask.labels.shape == grid.shape
    np.testing.assert_array_equal(mask.labels, truth)
    np.testing.assert_array_equal(mask.labels, highdicom_labels(data, grid))
    assert mask.class_names == ("background", "organ 1", "organ 2", "organ 3")
    assert mask.notes == ()
    # The same through the dispatcher, and the object is told apart by its header.
    assert dicom_masks.dicom_mask_kind(data) == "seg"
    np.testing.assert_array_equal(dicom_masks.read_dicom_mask(data, "seg.dcm", grid).labels, truth)


def test_seg_written_in_reverse_order_is_placed_by_its_sources(series):
    folder, grid, _ = series
    truth = blobs(grid.shape[0], seed=3)
    # The SEG's frames follow the sources given: here the series' last slice first.
    data = write_seg(sources_in_k_order(folder, grid)[::-1], stacked(truth[::-1], 3))
    np.testing.assert_array_equal(dicom_masks.labels_from_seg(data, "seg.dcm", grid).labels, truth)
    np.testing.assert_array_equal(highdicom_labels(data, grid), truth)


def test_seg_of_a_descending_series(tmp_path):
    write_series(tmp_path / "s", count=6, orientation="oblique", descending=True)
    grid, _ = grid_of(tmp_path / "s")
    truth = blobs(6, seed=5)
    data = write_seg(sources_in_k_order(tmp_path / "s", grid), stacked(truth, 3))
    np.testing.assert_array_equal(dicom_masks.labels_from_seg(data, "seg.dcm", grid).labels, truth)


def test_seg_frames_without_source_references_are_placed_by_position(series):
    folder, grid, _ = series
    truth = blobs(grid.shape[0], seed=7)

    def drop_references(ds):
        for item in ds.PerFrameFunctionalGroupsSequence:
            del item.DerivationImageSequence
        shuffle_frames(ds, seed=4)

    data = rewrite(write_seg(sources_in_k_order(folder, grid), stacked(truth, 3)), drop_references)
    assert "DerivationImageSequence" not in pydicom.dcmread(io.BytesIO(data)).PerFrameFunctionalGroupsSequence[0]
    np.testing.assert_array_equal(dicom_masks.labels_from_seg(data, "seg.dcm", grid).labels, truth)
    # Without references a SEG needs no SOPInstanceUIDs: a grid of shape and affine only (NIfTI's) works.
    bare = SeriesGrid(grid.shape, grid.affine)
    np.testing.assert_array_equal(dicom_masks.labels_from_seg(data, "seg.dcm", bare).labels, truth)


def test_fractional_seg_thresholds_at_one_half(series):
    folder, grid, _ = series
    rng = np.random.default_rng(11)
    # Values well either side of 0.5 (highdicom stores round(v * 255)): 0.3, 0.45, 0.55, 0.7, 1.
    fractions = rng.choice([0.0, 0.3, 0.45, 0.55, 0.7, 1.0], size=(grid.shape[0], SIZE, SIZE, 2),
                           p=[0.5, 0.1, 0.1, 0.1, 0.1, 0.1]).astype(np.float32)
    fractions[..., 1][fractions[..., 0] >= 0.5] = 0.0  # No overlap: highdicom combines only disjoint segments.
    data = rewrite(write_seg(sources_in_k_order(folder, grid), fractions, "FRACTIONAL", count=2,
                             max_fractional_value=255), shuffle_frames)
    mask = dicom_masks.labels_from_seg(data, "seg.dcm", grid)
    truth = np.zeros(grid.shape, np.uint8)
    truth[fractions[..., 0] >= 0.5] = 1
    truth[fractions[..., 1] >= 0.5] = 2
    np.testing.assert_array_equal(mask.labels, truth)
    seg = hd.seg.Segmentation.from_dataset(pydicom.dcmread(io.BytesIO(data)))
    theirs = seg.get_pixels_by_source_instance(list(grid.sop_instance_uids))  # Fractions, rescaled to 0..1.
    np.testing.assert_array_equal(mask.labels == 1, theirs[..., 0] >= 0.5)
    np.testing.assert_array_equal(mask.labels == 2, theirs[..., 1] >= 0.5)


def test_labelmap_seg(series):
    folder, grid, _ = series
    truth = blobs(grid.shape[0], seed=13)
    data = write_seg(sources_in_k_order(folder, grid), truth, "LABELMAP")
    ds = pydicom.dcmread(io.BytesIO(data))
    assert ds.SOPClassUID == dicom_masks.LABEL_MAP_SEG_STORAGE and ds.SegmentationType == "LABELMAP"
    mask = dicom_masks.labels_from_seg(data, "seg.dcm", grid)
    np.testing.assert_array_equal(mask.labels, truth)
    np.testing.assert_array_equal(mask.labels, highdicom_labels(data, grid))
    assert mask.class_names[1:] == ("organ 1", "organ 2", "organ 3")


@pytest.mark.parametrize("kind, syntax", [("FRACTIONAL", pydicom.uid.JPEG2000Lossless),
                                          ("LABELMAP", pydicom.uid.RLELossless),
                                          ("LABELMAP", pydicom.uid.JPEGLSLossless)])
def test_compressed_seg(series, kind, syntax):
    folder, grid, _ = series
    truth = blobs(grid.shape[0], seed=29)
    pixels = stacked(truth, 3).astype(np.float32) if kind == "FRACTIONAL" else truth
    data = rewrite(write_seg(sources_in_k_order(folder, grid), pixels, kind, transfer_syntax_uid=syntax),
                   lambda ds: None)
    assert pydicom.dcmread(io.BytesIO(data)).file_meta.TransferSyntaxUID == syntax
    np.testing.assert_array_equal(dicom_masks.labels_from_seg(data, "seg.dcm", grid).labels, truth)


def enhanced_ct(order, position=(-80.5, -91.25, 12.0), spacing=2.5):
    """One Enhanced CT file whose frame f lies at slice order[f] (frames not in position order)."""
    ct = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    ds.SOPClassUID, ds.SOPInstanceUID = pydicom.uid.EnhancedCTImageStorage, generate_uid()
    for keyword in ("PatientID", "PatientName", "PatientBirthDate", "PatientSex", "StudyInstanceUID", "StudyID",
                    "StudyDate", "StudyTime", "AccessionNumber", "ReferringPhysicianName"):
        setattr(ds, keyword, ct.get(keyword, ""))
    ds.Modality, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = "CT", generate_uid(), generate_uid()
    ds.SeriesNumber, ds.InstanceNumber, ds.ImageType = 1, 1, ["ORIGINAL", "PRIMARY", "AXIAL", "NONE"]
    ds.Rows, ds.Columns, ds.NumberOfFrames = ct.Rows, ct.Columns, len(order)
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
    shared, plane, measures = Dataset(), Dataset(), Dataset()
    plane.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    measures.PixelSpacing, measures.SliceThickness = list(ct.PixelSpacing), spacing
    shared.PlaneOrientationSequence, shared.PixelMeasuresSequence = Sequence([plane]), Sequence([measures])
    ds.SharedFunctionalGroupsSequence = Sequence([shared])
    frames = []
    for k in order:
        item, where = Dataset(), Dataset()
        where.ImagePositionPatient = [position[0], position[1], position[2] + spacing * k]
        item.PlanePositionSequence = Sequence([where])
        frames.append(item)
    ds.PerFrameFunctionalGroupsSequence = Sequence(frames)
    ds.PixelData = np.concatenate([ct.pixel_array + 10 * k for k in order]).astype(np.int16).tobytes()
    return ds


def test_seg_of_an_enhanced_multiframe_series(tmp_path):
    order = [3, 0, 5, 1, 4, 2]
    source = enhanced_ct(order)
    (tmp_path / "s").mkdir()
    source.save_as(tmp_path / "s" / "enhanced.dcm", enforce_file_format=True)
    grid, volume = grid_of(tmp_path / "s")
    assert grid.frames == tuple(order.index(k) for k in range(6)) and set(grid.sop_instance_uids) == {source.SOPInstanceUID}
    truth = blobs(6, seed=31)
    # highdicom's source frames are the file's, in its frame order: frame f is slice order[f].
    data = write_seg([source], stacked(truth[order], 3))
    first = pydicom.dcmread(io.BytesIO(data)).PerFrameFunctionalGroupsSequence[0]
    assert "ReferencedFrameNumber" in first.DerivationImageSequence[0].SourceImageSequence[0]
    np.testing.assert_array_equal(dicom_masks.labels_from_seg(data, "seg.dcm", grid).labels, truth)


def test_labelmap_seg_with_two_frames_on_one_slice_is_corrupt(series):
    folder, grid, _ = series
    data = write_seg(sources_in_k_order(folder, grid), blobs(grid.shape[0], seed=43), "LABELMAP")

    def second_on_first(ds):  # Frame 2 derives from, and lies on, frame 1's slice (whichever it is).
        ds.PerFrameFunctionalGroupsSequence[1] = ds.PerFrameFunctionalGroupsSequence[0]

    with pytest.raises(ImageRejected, match=r"several frames on slice\(s\) \[\d\] of the series") as e:
        dicom_masks.labels_from_seg(rewrite(data, second_on_first), "seg.dcm", grid)
    assert e.value.reason == "corrupt"


@pytest.mark.parametrize("orientation", ["axial", "oblique"])
def test_seg_written_by_dcmqi(tmp_path, orientation):
    """3D Slicer's writer: a label image in ITK's geometry of the series (SimpleITK's reading of it) to a
    SEG, binary and label map; its frames' positions come from ITK's geometry, not from our grid."""
    series_uid, _, _ = write_series(tmp_path / "s", count=8, orientation=orientation)
    grid, _ = grid_of(tmp_path / "s")
    truth = blobs(8, seed=47)
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(tmp_path / "s"), series_uid))
    image = reader.Execute()
    values = np.zeros(sitk.GetArrayFromImage(image).shape, np.uint8)  # ITK's (z, y, x), its own slice order.
    k, j, i = np.nonzero(truth)
    world = np.c_[i, j, k, np.ones(len(i))] @ grid.lps.T  # Each labelled voxel's centre, LPS mm.
    index = np.array([image.TransformPhysicalPointToIndex(tuple(p[:3])) for p in world])
    values[index[:, 2], index[:, 1], index[:, 0]] = truth[k, j, i]
    label = sitk.GetImageFromArray(values)
    label.CopyInformation(image)
    sitk.WriteImage(label, str(tmp_path / "label.nrrd"))
    code = {"CodeValue": "91723000", "CodingSchemeDesignator": "SCT", "CodeMeaning": "Anatomical Structure"}
    liver = {"CodeValue": "10200004", "CodingSchemeDesignator": "SCT", "CodeMeaning": "Liver"}
    (tmp_path / "meta.json").write_text(json.dumps({
        "ContentCreatorName": "test", "ClinicalTrialSeriesID": "1", "ClinicalTrialTimePointID": "1",
        "SeriesDescription": "seg", "SeriesNumber": "300", "InstanceNumber": "1", "ContentLabel": "SEG",
        "ContentDescription": "seg", "ClinicalTrialCoordinatingCenterName": "test",
        "segmentAttributes": [[{"labelID": n, "SegmentLabel": f"organ {n}", "SegmentAlgorithmType": "MANUAL",
                                "SegmentedPropertyCategoryCodeSequence": code,
                                "SegmentedPropertyTypeCodeSequence": liver} for n in (1, 2, 3)]]}))
    for kind in ("binary", "labelmap"):
        out = tmp_path / f"{kind}.dcm"
        subprocess.run([ITKIMAGE2SEGIMAGE, "--inputImageList", str(tmp_path / "label.nrrd"), "--inputDICOMDirectory",
                        str(tmp_path / "s"), "--outputDICOM", str(out), "--inputMetadata", str(tmp_path / "meta.json"),
                        "--segmentationType", kind], check=True, capture_output=True, timeout=120)
        assert pydicom.dcmread(out).SegmentationType == kind.upper()
        mask = dicom_masks.labels_from_seg(out.read_bytes(), "seg.dcm", grid)
        np.testing.assert_array_equal(mask.labels, truth, err_msg=kind)
        assert mask.class_names == ("background", "organ 1", "organ 2", "organ 3")


@dataclasses.dataclass(frozen=True)
class TableGrid:
    """A grid as a volume-mask table keeps it: shape, 16 affine values row by row, UIDs; no more."""

    shape: tuple
    affine: tuple
    sop_instance_uids: tuple = ()


def test_a_plain_grid_object_is_accepted(series):
    folder, grid, _ = series
    truth = blobs(grid.shape[0], seed=53)
    data = rewrite(write_seg(sources_in_k_order(folder, grid), stacked(truth, 3)), shuffle_frames)
    plain = TableGrid(grid.shape, tuple(grid.affine.ravel()), grid.sop_instance_uids)
    np.testing.assert_array_equal(dicom_masks.read_dicom_mask(data, "seg.dcm", plain).labels, truth)
    square = np.array([[20.5, 20.5], [60.5, 20.5], [60.5, 60.5], [20.5, 60.5]])
    rs = to_bytes(rtstruct_dataset(grid, [(1, "a", [("CLOSED_PLANAR", 2, square)])]))
    np.testing.assert_array_equal(dicom_masks.read_dicom_mask(rs, "rs.dcm", plain).labels,
                                  dicom_masks.read_dicom_mask(rs, "rs.dcm", grid).labels)


def test_enhanced_series_on_a_grid_without_frame_indices(tmp_path):
    """A grid that knows the slices' UIDs but not which frame of the file each slice is: the SEG's
    frames, all from the one file, go by position; an RTSTRUCT's contours on named frames too."""
    order = [3, 0, 5, 1, 4, 2]
    source = enhanced_ct(order)
    (tmp_path / "s").mkdir()
    source.save_as(tmp_path / "s" / "enhanced.dcm", enforce_file_format=True)
    grid, _ = grid_of(tmp_path / "s")
    plain = TableGrid(grid.shape, tuple(grid.affine.ravel()), grid.sop_instance_uids)
    truth = blobs(6, seed=59)
    data = write_seg([source], stacked(truth[order], 3))
    mask = dicom_masks.read_dicom_mask(data, "seg.dcm", plain)
    np.testing.assert_array_equal(mask.labels, truth)
    assert mask.notes == ()
    # A contour drawn on the file's frame 2 (slice 0): ContourImageSequence names the frame.
    square = np.array([[20.5, 20.5], [60.5, 20.5], [60.5, 60.5], [20.5, 60.5]])
    ds = rtstruct_dataset(grid, [(1, "a", [("CLOSED_PLANAR", 0, square)])])
    image = Dataset()
    image.ReferencedSOPInstanceUID, image.ReferencedFrameNumber = source.SOPInstanceUID, order.index(0) + 1
    ds.ROIContourSequence[0].ContourSequence[0].ContourImageSequence = Sequence([image])
    for which in (grid, plain):
        assert dicom_masks.read_dicom_mask(to_bytes(ds), "rs.dcm", which).labels[0, 40, 40] == 1
    image.ReferencedFrameNumber = order.index(3) + 1  # Another frame than the contour's plane.
    with pytest.raises(ImageRejected, match=r"drawn on slice \[3\]") as e:
        dicom_masks.read_dicom_mask(to_bytes(ds), "rs.dcm", grid)
    assert e.value.reason == "mask_geometry_mismatch"


def test_overlapping_segments_keep_the_highest_number(series):
    folder, grid, _ = series
    masks = np.zeros(grid.shape + (2,), bool)
    masks[2:5, 20:60, 20:60, 0] = True
    masks[3:6, 40:80, 40:80, 1] = True
    data = write_seg(sources_in_k_order(folder, grid), masks, count=2)
    mask = dicom_masks.labels_from_seg(rewrite(data, shuffle_frames), "seg.dcm", grid)
    both = masks[..., 0] & masks[..., 1]
    assert both.sum() == 2 * 20 * 20
    np.testing.assert_array_equal(mask.labels[both], 2)
    np.testing.assert_array_equal(mask.labels[masks[..., 0] & ~both], 1)
    assert mask.notes == ("mask_overlap: 800 voxel(s) in several segments; the highest SegmentNumber kept",)
    # highdicom, asked for one segment at a time, agrees on each.
    seg = hd.seg.Segmentation.from_dataset(pydicom.dcmread(io.BytesIO(data)))
    np.testing.assert_array_equal(seg.get_pixels_by_source_instance(list(grid.sop_instance_uids))[..., 1], masks[..., 1])


def test_seg_of_another_series_or_frame_of_reference(series, tmp_path):
    folder, grid, _ = series
    truth = blobs(grid.shape[0], seed=17)
    # Another series at the very same positions, in the same frame of reference (a second reconstruction).
    write_series(tmp_path / "other", count=grid.shape[0], frame_of_reference=grid.frame_of_reference_uid)
    other, _ = grid_of(tmp_path / "other")
    data = write_seg(sources_in_k_order(tmp_path / "other", other), stacked(truth, 3))
    with pytest.raises(ImageRejected, match=f"segments series {other.series_uid}, not the volume's series "
                                            f"{grid.series_uid}") as e:
        dicom_masks.labels_from_seg(data, "seg.dcm", grid)
    assert e.value.reason == "mask_reference_mismatch"
    # Without the series reference, the frames' source images still tell.
    unreferenced = rewrite(data, lambda ds: delattr(ds, "ReferencedSeriesSequence"))
    with pytest.raises(ImageRejected, match="derives from image .* not a slice of series") as e:
        dicom_masks.labels_from_seg(unreferenced, "seg.dcm", grid)
    assert e.value.reason == "mask_reference_mismatch"
    own = write_seg(sources_in_k_order(folder, grid), stacked(truth, 3))
    # A frame from a slice the stack left out (an exact duplicate `plan_stacks` dropped) of the SEG's
    # own series: placed by its position, noted.
    dropped = SeriesGrid(grid.shape, grid.affine, ("1.2.3",) + grid.sop_instance_uids[1:], grid.frames, grid.series_uid,
                         grid.frame_of_reference_uid)
    mask = dicom_masks.labels_from_seg(own, "seg.dcm", dropped)
    np.testing.assert_array_equal(mask.labels, truth)
    on_first = len(np.unique(truth[0])) - 1  # highdicom writes a frame per segment present on the slice.
    assert on_first > 0
    assert mask.notes == (f"frames_placed_by_position: {on_first} frame(s) derive from images of the series "
                          "that are not slices of the stack (a duplicate left out)",)
    moved = rewrite(own, lambda ds: setattr(ds, "FrameOfReferenceUID", "1.2.3.4"))
    with pytest.raises(ImageRejected, match="FrameOfReferenceUID 1.2.3.4, the series in") as e:
        dicom_masks.labels_from_seg(moved, "seg.dcm", grid)
    assert e.value.reason == "mask_reference_mismatch"


def test_seg_of_another_geometry(series):
    folder, grid, _ = series
    data = write_seg(sources_in_k_order(folder, grid), stacked(blobs(grid.shape[0], seed=19), 3))

    def spacing(ds):
        ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].PixelSpacing = [0.7, 0.7]

    def orientation(ds):
        ds.SharedFunctionalGroupsSequence[0].PlaneOrientationSequence[0].ImageOrientationPatient = \
            [0.9998477, 0.0174524, 0, -0.0174524, 0.9998477, 0]

    def shifted(ds):
        for item in ds.PerFrameFunctionalGroupsSequence:
            x, y, z = item.PlanePositionSequence[0].ImagePositionPatient
            item.PlanePositionSequence[0].ImagePositionPatient = [x + 0.5, y, z]

    for change, text in ((spacing, "PixelSpacing"), (orientation, "orientation"), (shifted, "is not on its source")):
        with pytest.raises(ImageRejected, match=text) as e:
            dicom_masks.labels_from_seg(rewrite(data, change), "seg.dcm", grid)
        assert e.value.reason == "mask_geometry_mismatch", change
    # Half a slice off, placed by position only.
    def between(ds):
        for item in ds.PerFrameFunctionalGroupsSequence:
            del item.DerivationImageSequence
            x, y, z = item.PlanePositionSequence[0].ImagePositionPatient
            item.PlanePositionSequence[0].ImagePositionPatient = [x, y, z + 1.25]

    with pytest.raises(ImageRejected, match="is not on a slice of the series") as e:
        dicom_masks.labels_from_seg(rewrite(data, between), "seg.dcm", grid)
    assert e.value.reason == "mask_geometry_mismatch"
    smaller = SeriesGrid((grid.shape[0], 64, 64), grid.affine, grid.sop_instance_uids, grid.frames, grid.series_uid,
                         grid.frame_of_reference_uid)
    with pytest.raises(ImageRejected, match="frames of 128x128 pixels, the series' slices 64x64") as e:
        dicom_masks.labels_from_seg(data, "seg.dcm", smaller)
    assert e.value.reason == "mask_geometry_mismatch"


def _replace(old, new):
    def change(data):
        assert len(old) == len(new) and old in data
        return data.replace(old, new)
    return change


def _without_references(ds):
    for item in ds.PerFrameFunctionalGroupsSequence:
        del item.DerivationImageSequence


@pytest.mark.parametrize("change, reason, text", [
    (lambda d: d[:len(d) // 2], "corrupt", "pixel data"),
    (lambda d: rewrite(d, lambda ds: delattr(ds, "SegmentSequence")), "corrupt", "without a SegmentSequence"),
    (lambda d: rewrite(d, lambda ds: delattr(ds, "PixelData")), "corrupt", "without pixel data"),
    (lambda d: rewrite(d, lambda ds: setattr(ds, "NumberOfFrames", 400)), "corrupt", "NumberOfFrames 400"),
    (lambda d: rewrite(d, lambda ds: setattr(ds.PerFrameFunctionalGroupsSequence[0].SegmentIdentificationSequence[0],
                                             "ReferencedSegmentNumber", 9)), "corrupt", "belongs to segment 9"),
    (_replace(b"-91.25", b"-9x.25"), "corrupt", "ImagePositionPatient .* is not numbers"),
    (lambda d: rewrite(d, lambda ds: delattr(ds, "SegmentationType")), "unsupported_mask", "SegmentationType"),
    (lambda d: rewrite(d, lambda ds: (_without_references(ds), [delattr(item, "PlanePositionSequence") for item in
                                                                ds.PerFrameFunctionalGroupsSequence])),
     "unsupported_mask", "neither a source image of the series nor an ImagePositionPatient"),
])
def test_damaged_seg_is_rejected_with_a_reason(series, change, reason, text):
    folder, grid, _ = series
    data = change(write_seg(sources_in_k_order(folder, grid), stacked(blobs(grid.shape[0], seed=37), 3)))
    with pytest.raises(ImageRejected, match=text) as e:
        dicom_masks.read_dicom_mask(data, "seg.dcm", grid)
    assert e.value.reason == reason


def test_segment_numbers_past_255_give_16_bit_labels(series):
    folder, grid, _ = series
    truth = blobs(grid.shape[0], seed=41)

    def renumber(ds):  # Segment 3 becomes 300 (numbers may be sparse).
        ds.SegmentSequence[2].SegmentNumber = 300
        for item in ds.PerFrameFunctionalGroupsSequence:
            if item.SegmentIdentificationSequence[0].ReferencedSegmentNumber == 3:
                item.SegmentIdentificationSequence[0].ReferencedSegmentNumber = 300

    mask = dicom_masks.labels_from_seg(rewrite(write_seg(sources_in_k_order(folder, grid), stacked(truth, 3)),
                                               renumber), "seg.dcm", grid)
    assert mask.labels.dtype == np.uint16
    np.testing.assert_array_equal(mask.labels, np.where(truth == 3, 300, truth.astype(np.uint16)))
    assert len(mask.class_names) == 301 and mask.class_names[300] == "organ 3" and mask.class_names[4] == "segment_4"


def test_label_bits_from_the_header(series):
    """8 or 16 bits from a file's first bytes, or None (never a wrong width) however short they are."""
    folder, grid, _ = series
    truth = blobs(grid.shape[0], seed=67)

    def renumber(ds):
        ds.SegmentSequence[2].SegmentNumber = 256
        for item in ds.PerFrameFunctionalGroupsSequence:
            if item.SegmentIdentificationSequence[0].ReferencedSegmentNumber == 3:
                item.SegmentIdentificationSequence[0].ReferencedSegmentNumber = 256

    seg = write_seg(sources_in_k_order(folder, grid), stacked(truth, 3))
    wide = rewrite(seg, renumber)
    square = np.array([[20.5, 20.5], [60.5, 20.5], [60.5, 60.5], [20.5, 60.5]])
    rois = [(n, f"r{n}", [("CLOSED_PLANAR", 2, square)]) for n in range(1, 257)]
    many = to_bytes(rtstruct_dataset(grid, rois))
    few = to_bytes(rtstruct_dataset(grid, rois[:3]))
    for data, bits in ((seg, 8), (wide, 16), (many, 16), (few, 8)):
        assert dicom_masks.dicom_mask_bits(data) == bits
        assert dicom_masks.read_dicom_mask(data, "m.dcm", grid).labels.dtype == np.dtype(f"uint{bits}")
        answers = {dicom_masks.dicom_mask_bits(data[:n]) for n in range(0, len(data), max(1, len(data) // 400))}
        assert answers <= {None, bits}, answers
        assert bits in answers  # Known before the end of the file.
    assert dicom_masks.dicom_mask_bits(sorted(folder.iterdir())[0].read_bytes()) is None


def test_other_objects_are_unsupported(series):
    folder, grid, _ = series
    ct = sorted(folder.iterdir())[0].read_bytes()
    assert dicom_masks.dicom_mask_kind(ct) is None
    with pytest.raises(ImageRejected, match="CT Image Storage, not a Segmentation") as e:
        dicom_masks.read_dicom_mask(ct, "ct.dcm", grid)
    assert e.value.reason == "unsupported_mask"
    with pytest.raises(ImageRejected) as e:
        dicom_masks.read_dicom_mask(b"not dicom" * 100, "x.dcm", grid)
    assert e.value.reason == "not_an_image"


# --- RTSTRUCT ------------------------------------------------------------------------------------


def rtstruct_dataset(grid, rois, frame_of_reference=None, series_uid=None):
    """A minimal RT Structure Set written with pydicom: rois = [(number, name, [(type, k, (n, 2) i/j points)])].

    The points are voxel coordinates, turned into patient LPS mm through the series' own
    geometry, written here from the slices' ImagePositionPatient, orientation and spacing.
    """
    ds = Dataset()
    ds.SOPClassUID, ds.SOPInstanceUID = dicom_masks.RTSTRUCT_STORAGE, generate_uid()
    ds.Modality = "RTSTRUCT"
    ds.FrameOfReferenceUID = frame_of_reference or grid.frame_of_reference_uid
    reference = Dataset()
    reference.FrameOfReferenceUID = ds.FrameOfReferenceUID
    study, referenced_series = Dataset(), Dataset()
    referenced_series.SeriesInstanceUID = series_uid or grid.series_uid
    study.RTReferencedSeriesSequence = Sequence([referenced_series])
    reference.RTReferencedStudySequence = Sequence([study])
    ds.ReferencedFrameOfReferenceSequence = Sequence([reference])
    ds.StructureSetROISequence, ds.ROIContourSequence = Sequence(), Sequence()
    lps = grid.lps
    for number, name, contours in rois:
        roi = Dataset()
        roi.ROINumber, roi.ROIName = number, name
        roi.ReferencedFrameOfReferenceUID = ds.FrameOfReferenceUID
        ds.StructureSetROISequence.append(roi)
        item = Dataset()
        item.ReferencedROINumber = number
        item.ContourSequence = Sequence()
        for kind, k, points in contours:
            contour = Dataset()
            contour.ContourGeometricType = kind
            voxels = np.c_[points, np.full(len(points), k), np.ones(len(points))]
            world = (voxels @ lps.T)[:, :3]
            contour.NumberOfContourPoints = len(points)
            contour.ContourData = [f"{v:.6f}" for v in world.ravel()]
            item.ContourSequence.append(contour)
        ds.ROIContourSequence.append(item)
    ds.file_meta = pydicom.dataset.FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPClassUID, ds.SOPInstanceUID
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    return ds


def to_bytes(ds):
    out = io.BytesIO()
    ds.save_as(out, enforce_file_format=True)
    return out.getvalue()


def circle(ci, cj, radius, n=90):
    angles = np.linspace(0, 2 * np.pi, n, endpoint=False)
    return np.c_[ci + radius * np.cos(angles), cj + radius * np.sin(angles)]


def rasterised(points):
    """scikit-image's fill of a polygon given as (i, j) points (pixel centres inside or on it)."""
    out = np.zeros((SIZE, SIZE), bool)
    rows, columns = polygon(points[:, 1], points[:, 0], (SIZE, SIZE))
    out[rows, columns] = True
    return out


def test_rtstruct_contours_of_known_shapes(tmp_path):
    # Oblique: the contours' patient coordinates go through a rotated, sheared-free affine.
    write_series(tmp_path / "s", count=6, orientation="oblique")
    grid, _ = grid_of(tmp_path / "s")
    # Vertices at generic (non-integer) voxel positions: no pixel centre lies on an edge, so the
    # rule "inside or on the contour" is scikit-image's as well as ours, with no ties.
    rectangle = np.array([[10.3, 12.7], [50.6, 12.7], [50.6, 40.2], [10.3, 40.2]])
    outer, hole = circle(80.37, 70.61, 30.3), circle(82.11, 68.93, 12.45)
    island = circle(82.11, 68.93, 4.71)
    rois = [
        (7, "box", [("CLOSED_PLANAR", 1, rectangle), ("CLOSED_PLANAR", 2, rectangle + 3.1)]),
        (3, "ring", [("CLOSED_PLANAR", 3, outer), ("CLOSED_PLANAR", 3, hole), ("CLOSED_PLANAR", 3, island),
                     ("OPEN_PLANAR", 3, rectangle), ("POINT", 4, rectangle[:1])]),
        (12, "disc", [("CLOSED_PLANAR", 4, circle(40.2, 90.8, 17.77, n=37))]),
    ]
    data = to_bytes(rtstruct_dataset(grid, rois))
    assert dicom_masks.dicom_mask_kind(data) == "rtstruct"
    mask = dicom_masks.labels_from_rtstruct(data, "rs.dcm", grid)
    truth = np.zeros(grid.shape, np.uint8)
    truth[1][rasterised(rectangle)] = 1
    truth[2][rasterised(rectangle + 3.1)] = 1
    truth[3][rasterised(outer) & ~rasterised(hole) | rasterised(island)] = 2
    truth[4][rasterised(circle(40.2, 90.8, 17.77, n=37))] = 3
    np.testing.assert_array_equal(mask.labels, truth)
    assert mask.class_names == ("background", "box", "ring", "disc")
    assert mask.notes == ("contours_ignored: 1 OPEN_PLANAR (ROI(s) 'ring'), 1 POINT (ROI(s) 'ring') (markers and open "
                          "lines: only CLOSED_PLANAR contours enclose voxels)",)
    # Exact checks apart from any rasteriser: the rectangle's interior and exterior voxels.
    assert mask.labels[1, 13:41, 11:51].all() and not mask.labels[1, :12].any() and not mask.labels[1, :, 51:].any()
    assert mask.labels[3, 69, 82] == 2 and mask.labels[3, 60, 82] == 0 and mask.labels[3, 70, 110] == 2
    assert not mask.labels[[0, 5]].any()


def test_rtstruct_overlapping_rois_keep_the_later(series):
    _, grid, _ = series
    square = np.array([[20.5, 20.5], [60.5, 20.5], [60.5, 60.5], [20.5, 60.5]])
    rois = [(1, "a", [("CLOSED_PLANAR", 2, square)]), (2, "b", [("CLOSED_PLANAR", 2, square + 20)])]
    mask = dicom_masks.labels_from_rtstruct(to_bytes(rtstruct_dataset(grid, rois)), "rs.dcm", grid)
    assert mask.labels[2, 50, 50] == 2 and mask.labels[2, 30, 30] == 1 and mask.labels[2, 70, 70] == 2
    assert mask.notes == ("mask_overlap: 400 voxel(s) in several ROIs; the later ROI kept",)


# rt-utils 1.2.7 sets FileDataset.is_little_endian / is_implicit_VR, which pydicom 3 deprecates.
@pytest.mark.filterwarnings("ignore:'FileDataset.is_:DeprecationWarning")
def test_rtstruct_from_rt_utils_matches_its_masks_and_its_reader(tmp_path):
    folder = tmp_path / "s"
    write_series(folder, count=6)
    grid, _ = grid_of(folder)
    truth = blobs(6, segments=2, seed=23)
    ring = np.zeros((6, SIZE, SIZE), bool)
    j, i = np.mgrid[:SIZE, :SIZE]
    disc = (i - 90) ** 2 + (j - 40) ** 2
    ring[2:5] = (disc <= 20 ** 2) & (disc > 8 ** 2)  # A ring: its hole is a second contour.
    truth[ring] = 0  # Disjoint ROIs: each one's voxels are its mask's.
    builder = RTStructBuilder.create_new(dicom_series_path=str(folder))
    # rt-utils' masks are (rows, columns, slices), slices in its ascending-position order (= k).
    names = {"blob one": truth == 1, "blob two": truth == 2, "ring": ring}
    for name, roi in names.items():
        builder.add_roi(mask=np.ascontiguousarray(roi.transpose(1, 2, 0)), name=name)
    path = tmp_path / "rs.dcm"
    builder.save(str(path))
    mask = dicom_masks.labels_from_rtstruct(path.read_bytes(), "rs.dcm", grid)
    assert mask.class_names == ("background", "blob one", "blob two", "ring")
    # rt-utils traces each mask's boundary pixel centres (OpenCV): inside-or-on gives the mask back.
    for label, (name, roi) in enumerate(names.items(), start=1):
        np.testing.assert_array_equal(mask.labels == label, roi, err_msg=name)
    # OpenCV traces a blob's one-voxel tip as a contour of 1 or 2 points: kept as those voxels (noted).
    assert mask.notes == ("contours_degenerate: 1 closed contour(s) of 1 or 2 points (ROI(s) 'blob two') enclose no "
                          "area: kept as the voxel centres they pass through (how OpenCV and rt-utils trace a "
                          "structure one voxel wide)",)
    # rt-utils' own reader (OpenCV's fillPoly of the rounded vertices) of the same file.
    reread = RTStructBuilder.create_from(dicom_series_path=str(folder), rt_struct_path=str(path))
    for label, name in enumerate(names, start=1):
        theirs = reread.get_roi_mask_by_name(name).transpose(2, 0, 1)
        np.testing.assert_array_equal(mask.labels == label, theirs, err_msg=name)


@pytest.mark.parametrize("seed", range(40))
def test_fill_rule_is_scikit_image_s_on_random_polygons(series, seed):
    """Random polygons (star-shaped or self-intersecting, some past the slice's edges) at generic
    positions: our even-odd, pixel-centre fill and scikit-image's polygon agree pixel for pixel."""
    _, grid, _ = series
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 40))
    if seed % 2:  # Star-shaped (simple).
        angles = np.sort(rng.uniform(0, 2 * np.pi, n))
        radii = rng.uniform(5, 70, n)
        points = np.c_[64 + radii * np.cos(angles), 64 + radii * np.sin(angles)] + rng.uniform(-30, 30, 2)
    else:  # Any order: self-intersecting, parity decides.
        points = rng.uniform(-20, SIZE + 20, (n, 2))
    mask = dicom_masks.labels_from_rtstruct(to_bytes(rtstruct_dataset(grid, [(1, "p", [("CLOSED_PLANAR", 1, points)])])),
                                            "rs.dcm", grid)
    # Pixel centres within 2e-3 pixel of an edge: ours counts those within 1e-3 as on the contour
    # (the points went through 6-decimal millimetres: ~1e-6 pixel), scikit-image those exactly on it.
    j, i = np.mgrid[:SIZE, :SIZE]
    centres = np.c_[i.ravel(), j.ravel()].astype(float)
    a, b = points, np.roll(points, -1, axis=0)
    t = np.clip(((centres[:, None] - a) * (b - a)).sum(-1) / ((b - a) ** 2).sum(-1), 0, 1)
    distance = np.linalg.norm(centres[:, None] - (a + t[..., None] * (b - a)), axis=-1).min(axis=1)
    near = (distance < 2e-3).reshape(SIZE, SIZE)
    ours, theirs = mask.labels[1] == 1, rasterised(points)
    np.testing.assert_array_equal(ours[~near], theirs[~near])
    assert near.sum() <= 20  # A handful of the polygon's ~1,000 boundary pixels.


def _set_contour(ds, values):
    ds.ROIContourSequence[0].ContourSequence[0].ContourData = values


@pytest.mark.parametrize("change, reason, text", [
    (lambda ds: _set_contour(ds, ["1", "2", "3", "4"]), "corrupt", "4 ContourData values, not x, y, z triplets"),
    (lambda ds: setattr(ds.ROIContourSequence[0], "ReferencedROINumber", 5), "corrupt",
     "names ROI 5, which StructureSetROISequence does not"),
    (lambda ds: setattr(ds.StructureSetROISequence[1], "ROINumber", 1), "corrupt", "ROINumber 1 is no new number"),
    (lambda ds: (delattr(ds, "ReferencedFrameOfReferenceSequence"),
                 [delattr(roi, "ReferencedFrameOfReferenceUID") for roi in ds.StructureSetROISequence]),
     "mask_reference_mismatch", "names no FrameOfReferenceUID"),
])
def test_damaged_rtstruct_is_rejected_with_a_reason(series, change, reason, text):
    _, grid, _ = series
    square = np.array([[20.5, 20.5], [60.5, 20.5], [60.5, 60.5], [20.5, 60.5]])
    ds = rtstruct_dataset(grid, [(1, "a", [("CLOSED_PLANAR", 2, square)]), (2, "b", [("CLOSED_PLANAR", 3, square)])])
    change(ds)
    with pytest.raises(ImageRejected, match=text) as e:
        dicom_masks.read_dicom_mask(to_bytes(ds), "rs.dcm", grid)
    assert e.value.reason == reason


def test_contour_data_that_is_no_numbers_is_corrupt(series):
    _, grid, _ = series
    square = np.array([[20.5, 20.5], [60.5, 20.5], [60.5, 60.5], [20.5, 60.5]])
    ds = rtstruct_dataset(grid, [(1, "a", [("CLOSED_PLANAR", 2, square)])])
    first = str(ds.ROIContourSequence[0].ContourSequence[0].ContourData[0]).encode()
    data = to_bytes(ds)
    with pytest.raises(ImageRejected, match="ContourData .* is not numbers") as e:
        dicom_masks.labels_from_rtstruct(data.replace(first, b"x" * len(first), 1), "rs.dcm", grid)
    assert e.value.reason == "corrupt"


def test_rtstruct_mismatches(series):
    _, grid, _ = series
    square = np.array([[20.5, 20.5], [60.5, 20.5], [60.5, 60.5], [20.5, 60.5]])
    rois = [(1, "a", [("CLOSED_PLANAR", 2, square)])]
    cases = [
        (rtstruct_dataset(grid, rois, frame_of_reference="1.2.3.4"), "mask_reference_mismatch",
         "ROI 'a' is in FrameOfReferenceUID 1.2.3.4"),
        (rtstruct_dataset(grid, rois, series_uid="1.2.3.5"), "mask_reference_mismatch",
         "outlines series 1.2.3.5, not the volume's"),
        (rtstruct_dataset(grid, [(1, "a", [("CLOSED_PLANAR", 2.5, square)])]), "mask_geometry_mismatch",
         "a contour of ROI 'a' .* does not lie on one slice plane"),
        (rtstruct_dataset(grid, [(1, "a", [("CLOSED_PLANAR", grid.shape[0] + 1, square)])]),
         "mask_geometry_mismatch", "does not lie on one slice plane"),
    ]
    for ds, reason, text in cases:
        with pytest.raises(ImageRejected, match=text) as e:
            dicom_masks.labels_from_rtstruct(to_bytes(ds), "rs.dcm", grid)
        assert e.value.reason == reason
    tilted = rtstruct_dataset(grid, rois)
    values = [float(v) for v in tilted.ROIContourSequence[0].ContourSequence[0].ContourData]
    values[2] += 1.0  # One point 0.4 slice off its contour's plane.
    tilted.ROIContourSequence[0].ContourSequence[0].ContourData = [f"{v:.6f}" for v in values]
    with pytest.raises(ImageRejected, match="does not lie on one slice plane") as e:
        dicom_masks.labels_from_rtstruct(to_bytes(tilted), "rs.dcm", grid)
    assert e.value.reason == "mask_geometry_mismatch"
    # A contour whose ContourImageSequence names another slice of the series than its plane's.
    drawn = rtstruct_dataset(grid, rois)
    image = Dataset()
    image.ReferencedSOPInstanceUID = grid.sop_instance_uids[3]
    drawn.ROIContourSequence[0].ContourSequence[0].ContourImageSequence = Sequence([image])
    with pytest.raises(ImageRejected, match=r"drawn on slice \[3\]\) does not lie") as e:
        dicom_masks.labels_from_rtstruct(to_bytes(drawn), "rs.dcm", grid)
    assert e.value.reason == "mask_geometry_mismatch"
    image.ReferencedSOPInstanceUID = grid.sop_instance_uids[2]
    assert dicom_masks.labels_from_rtstruct(to_bytes(drawn), "rs.dcm", grid).labels[2, 40, 40] == 1
    with pytest.raises(ImageRejected, match="not an RT Structure Set") as e:
        dicom_masks.labels_from_rtstruct(sorted(series[0].iterdir())[0].read_bytes(), "ct.dcm", grid)
    assert e.value.reason == "unsupported_mask"


# --- RTSTRUCT as planning systems write them ------------------------------------------------------


def _square(i0, j0, i1, j1):
    return np.array([[i0, j0], [i1, j0], [i1, j1], [i0, j1]], float)


def test_contours_of_one_roi_on_one_slice_nested_keyhole_overlapping_touching(series):
    """Holes as planning systems write them, and pieces drawn over each other. Nested contours
    (a hole, an island in it) and a keyhole cut (one contour) are even-odd's; two contours that
    overlap, neither inside the other, are two drawn pieces: their union (even-odd, as
    rt-utils' OpenCV fill and dicompyler-core's XOR, left the overlap out). Touching pieces
    unite; a hole touching its outer contour is a hole. CLOSEDPLANAR_XOR contours combine by
    exclusive or, as PS3.3 C.8.8.6.3 says. Generic vertex positions: no pixel centre lies on an
    edge, so scikit-image's fill of each contour is the truth's building block."""
    _, grid, _ = series
    outer, hole, island = circle(40.3, 40.7, 30.2), circle(42.1, 38.9, 14.45), circle(42.1, 38.9, 5.71)
    # A keyhole: the outer square, a channel 0.8 pixel wide from its top edge down to the inner square.
    keyhole = np.array([[20.3, 20.2], [60.1, 20.2], [60.1, 60.6], [20.3, 60.6], [20.3, 20.2], [39.7, 20.2],
                        [39.7, 30.4], [30.2, 30.4], [30.2, 50.3], [50.4, 50.3], [50.4, 30.4], [40.5, 30.4],
                        [40.5, 20.2]])
    piece_a, piece_b = circle(50.2, 60.4, 25.3), circle(75.6, 66.1, 20.7)
    left, right = _square(10.3, 80.2, 40.6, 110.4), _square(40.6, 85.7, 70.2, 105.1)  # Touching along i = 40.6.
    frame, notch = _square(70.3, 10.2, 120.4, 60.3), _square(70.3, 20.6, 90.2, 40.3)  # The notch touches i = 70.3.
    xor_a, xor_b = circle(60.2, 60.4, 25.3), circle(80.6, 62.1, 20.7)
    rois = [(1, "organ", [("CLOSED_PLANAR", 1, outer), ("CLOSED_PLANAR", 1, island), ("CLOSED_PLANAR", 1, hole),
                          ("CLOSED_PLANAR", 2, keyhole),
                          ("CLOSED_PLANAR", 3, piece_a), ("CLOSED_PLANAR", 3, piece_b),
                          ("CLOSED_PLANAR", 4, right), ("CLOSED_PLANAR", 4, left), ("CLOSED_PLANAR", 4, notch),
                          ("CLOSED_PLANAR", 4, frame),
                          ("CLOSEDPLANAR_XOR", 5, xor_a), ("CLOSEDPLANAR_XOR", 5, xor_b)])]
    mask = dicom_masks.labels_from_rtstruct(to_bytes(rtstruct_dataset(grid, rois)), "rs.dcm", grid)
    truth = np.zeros(grid.shape, bool)
    truth[1] = rasterised(outer) & ~rasterised(hole) | rasterised(island)
    truth[2] = rasterised(keyhole)
    truth[3] = rasterised(piece_a) | rasterised(piece_b)
    truth[4] = rasterised(left) | rasterised(right) | rasterised(frame) & ~rasterised(notch)
    truth[5] = rasterised(xor_a) ^ rasterised(xor_b)
    np.testing.assert_array_equal(mask.labels == 1, truth)
    assert truth[2, 40, 40] == 0 and truth[2, 25, 25] and truth[3].sum() > rasterised(piece_a).sum()
    both = int((rasterised(piece_a) & rasterised(piece_b)).sum())
    assert both > 100
    assert mask.notes == (f"contours_united: {both} voxel(s) inside two overlapping contours of one ROI, neither "
                          "inside the other: kept, as the union of the pieces drawn (an even-odd fill leaves them "
                          "out)",)
    # Order does not matter: the hole before its outer contour, the pieces the other way round.
    again = [(1, "organ", [("CLOSED_PLANAR", 1, hole), ("CLOSED_PLANAR", 1, island), ("CLOSED_PLANAR", 1, outer),
                           ("CLOSED_PLANAR", 3, piece_b), ("CLOSED_PLANAR", 3, piece_a)])]
    reordered = dicom_masks.labels_from_rtstruct(to_bytes(rtstruct_dataset(grid, again)), "rs.dcm", grid)
    np.testing.assert_array_equal(reordered.labels[[1, 3]] == 1, truth[[1, 3]])


@pytest.mark.parametrize("seed", range(12))
def test_fill_rule_on_random_nested_and_overlapping_circles(series, seed):
    """Random discs of one ROI on one slice, nested, overlapping or apart (each two clearly so, at
    generic positions): the truth is built from scikit-image's fill of each contour, with the
    nesting told from the circles' centres and radii (a disc inside another is a hole of the
    smallest such, its own inner discs islands; the rest united)."""
    _, grid, _ = series
    rng = np.random.default_rng(seed)
    while True:
        discs = [(rng.uniform(20, 108), rng.uniform(20, 108), rng.uniform(4, 40)) for _ in range(rng.integers(3, 7))]
        relation, clear = {}, True
        for a, (xa, ya, ra) in enumerate(discs):
            for b, (xb, yb, rb) in enumerate(discs):
                d = np.hypot(xa - xb, ya - yb)
                if a != b:
                    relation[a, b] = "inside" if d + ra < rb - 1 else "holds" if d + rb < ra - 1 else \
                        "apart" if d > ra + rb + 1 else "overlap" if abs(ra - rb) + 1 < d < ra + rb - 1 else "unclear"
                    clear &= relation[a, b] != "unclear"
        if clear and "overlap" in relation.values() and "inside" in relation.values():
            break
    polygons = [circle(x, y, r, n=120) for x, y, r in discs]
    filled = [rasterised(p) for p in polygons]
    parent = {a: min((discs[b][2], b) for b in range(len(discs)) if relation.get((a, b)) == "inside")[1]
              if any(relation.get((a, b)) == "inside" for b in range(len(discs))) else None for a in range(len(discs))}

    def carved(a):
        region = filled[a].copy()
        for child in (c for c in parent if parent[c] == a):
            region &= ~carved(child)
        return region

    truth = np.zeros((SIZE, SIZE), bool)
    for root in (a for a in parent if parent[a] is None):
        truth |= carved(root)
    rois = [(1, "organ", [("CLOSED_PLANAR", 1, p) for p in polygons])]
    mask = dicom_masks.labels_from_rtstruct(to_bytes(rtstruct_dataset(grid, rois)), "rs.dcm", grid)
    ours = mask.labels[1] == 1
    # Where ours differs, the pixel centre must be on an edge (within 2e-3 pixel: ours counts those
    # within 1e-3 as on the contour, scikit-image those exactly on it).
    centres = np.argwhere(ours != truth)[:, ::-1].astype(float)
    a, b = np.concatenate(polygons), np.concatenate([np.roll(p, -1, axis=0) for p in polygons])
    t = np.clip(((centres[:, None] - a) * (b - a)).sum(-1) / ((b - a) ** 2).sum(-1), 0, 1)
    distance = np.linalg.norm(centres[:, None] - (a + t[..., None] * (b - a)), axis=-1).min(axis=1, initial=1.0)
    assert (distance < 2e-3).all(), centres[distance >= 2e-3][:5]
    assert len(centres) <= 10 and ours.sum() > 100
    assert not mask.labels[[0, 2]].any()


def test_a_piece_over_another_piece_s_hole_fills_it(series):
    """A hole belongs to the contour it lies in: a second piece drawn over that hole is drawn there."""
    _, grid, _ = series
    outer, hole, patch = _square(10.3, 10.2, 80.4, 80.6), _square(30.1, 30.3, 50.2, 50.4), _square(40.7, 35.2, 100.3, 45.1)
    rois = [(1, "organ", [("CLOSED_PLANAR", 2, outer), ("CLOSED_PLANAR", 2, hole), ("CLOSED_PLANAR", 2, patch)])]
    mask = dicom_masks.labels_from_rtstruct(to_bytes(rtstruct_dataset(grid, rois)), "rs.dcm", grid)
    np.testing.assert_array_equal(mask.labels[2] == 1, rasterised(outer) & ~rasterised(hole) | rasterised(patch))
    # Equal contours (one piece written twice) are that piece, not a piece and its hole.
    twice = [(1, "organ", [("CLOSED_PLANAR", 2, outer), ("CLOSED_PLANAR", 2, outer.copy())])]
    mask = dicom_masks.labels_from_rtstruct(to_bytes(rtstruct_dataset(grid, twice)), "rs.dcm", grid)
    np.testing.assert_array_equal(mask.labels[2] == 1, rasterised(outer))


def _second_frame_of_reference(ds, frame, series_uid, images=()):
    """Adds a frame of reference (and a series in it, with `images`) to a structure set's references."""
    reference, study, referenced = Dataset(), Dataset(), Dataset()
    reference.FrameOfReferenceUID = frame
    referenced.SeriesInstanceUID = series_uid
    if images:
        referenced.ContourImageSequence = Sequence(_image(uid) for uid in images)
    study.RTReferencedSeriesSequence = Sequence([referenced])
    reference.RTReferencedStudySequence = Sequence([study])
    ds.ReferencedFrameOfReferenceSequence.append(reference)


def _image(uid):
    image = Dataset()
    image.ReferencedSOPClassUID, image.ReferencedSOPInstanceUID = pydicom.uid.CTImageStorage, uid
    return image


def test_rtstruct_with_rois_on_two_frames_of_reference_keeps_the_series_ones(series):
    """Registration-based planning: ROIs drawn on the CT and on a registered MR, in the MR's frame
    of reference (its millimetres are another patient space). Those of the series' frame of
    reference are filled, the others left out with a note; none of it: rejected. Before, one ROI
    of another frame of reference rejected the whole structure set."""
    _, grid, _ = series
    square = _square(20.5, 20.5, 60.5, 60.5)
    mr_frame, mr_series = generate_uid(), generate_uid()
    rois = [(1, "body", [("CLOSED_PLANAR", 2, square)]),
            # Drawn on the MR: at no slice plane of the CT (k 2.5) and far off it.
            (2, "gtv mr", [("CLOSED_PLANAR", 2.5, square + 10)]),
            (3, "cord", [("CLOSED_PLANAR", 4, square + 30)]),
            (4, "gtv mr 2", [("CLOSED_PLANAR", 40, square)])]
    ds = rtstruct_dataset(grid, rois)
    _second_frame_of_reference(ds, mr_frame, mr_series)
    for i in (1, 3):
        ds.StructureSetROISequence[i].ReferencedFrameOfReferenceUID = mr_frame
    data = to_bytes(ds)
    for on in (grid, dataclasses.replace(grid, frame_of_reference_uid="")):
        # A grid that does not know its frame of reference: the structure set says which is its series'.
        mask = dicom_masks.labels_from_rtstruct(data, "rs.dcm", on)
        assert mask.class_names == ("background", "body", "gtv mr", "cord", "gtv mr 2")
        truth = np.zeros(grid.shape, np.uint8)
        truth[2][rasterised(square)] = 1
        truth[4][rasterised(square + 30)] = 3
        np.testing.assert_array_equal(mask.labels, truth)
        assert mask.notes == (f"rois_other_frame_of_reference: ROI(s) 'gtv mr', 'gtv mr 2' left out "
                              f"(FrameOfReferenceUID {mr_frame}, the series' {grid.frame_of_reference_uid}): "
                              "outlined in another patient space (a registered series'); their labels hold no voxel",)
    header = dicom_masks.read_mask_header(io.BytesIO(data), "rs.dcm")
    assert header.series_uids == tuple(sorted((grid.series_uid, mr_series)))
    # Every ROI in the MR's frame of reference: no mask of this series.
    for roi in ds.StructureSetROISequence:
        roi.ReferencedFrameOfReferenceUID = mr_frame
    with pytest.raises(ImageRejected, match=f"rs.dcm ROI 'body' is in FrameOfReferenceUID {mr_frame}, the series in "
                                            rf"{grid.frame_of_reference_uid}.* \(and 3 more ROI\(s\) likewise\)") as e:
        dicom_masks.labels_from_rtstruct(to_bytes(ds), "rs.dcm", grid)
    assert e.value.reason == "mask_reference_mismatch"


def test_rtstruct_with_contours_on_images_of_two_series(series):
    """A CT and a PET in one frame of reference, ROIs outlined on both: a contour whose
    ContourImageSequence names images the structure set files under the other series is left
    out (noted); the series' own contours are filled. Before, the PET's contours (between the
    CT's slices) rejected the whole structure set as off the slices."""
    _, grid, _ = series
    square = _square(20.5, 20.5, 60.5, 60.5)
    pet_series, pet_images = generate_uid(), [generate_uid() for _ in range(3)]
    rois = [(1, "body", [("CLOSED_PLANAR", 2, square), ("CLOSED_PLANAR", 1.5, square + 5)]),
            (2, "suv hot spot", [("CLOSED_PLANAR", 3.5, square + 10)])]
    ds = rtstruct_dataset(grid, rois)
    ct = ds.ReferencedFrameOfReferenceSequence[0].RTReferencedStudySequence[0].RTReferencedSeriesSequence[0]
    ct.ContourImageSequence = Sequence(_image(uid) for uid in grid.sop_instance_uids)
    pet = Dataset()
    pet.SeriesInstanceUID, pet.ContourImageSequence = pet_series, Sequence(_image(uid) for uid in pet_images)
    ds.ReferencedFrameOfReferenceSequence[0].RTReferencedStudySequence[0].RTReferencedSeriesSequence.append(pet)
    contours = ds.ROIContourSequence
    contours[0].ContourSequence[0].ContourImageSequence = Sequence([_image(grid.sop_instance_uids[2])])
    contours[0].ContourSequence[1].ContourImageSequence = Sequence([_image(pet_images[0])])
    contours[1].ContourSequence[0].ContourImageSequence = Sequence([_image(pet_images[2])])
    mask = dicom_masks.labels_from_rtstruct(to_bytes(ds), "rs.dcm", grid)
    truth = np.zeros(grid.shape, np.uint8)
    truth[2][rasterised(square)] = 1
    np.testing.assert_array_equal(mask.labels, truth)
    assert mask.notes == (f"contours_other_series: 2 contour(s) of ROI(s) 'body', 'suv hot spot' left out: drawn on "
                          f"images of series {pet_series}",)
    # Only the PET's contours: none of this series.
    del contours[0].ContourSequence[0]
    with pytest.raises(ImageRejected, match=f"every contour is drawn on images of series {pet_series}, none on the "
                                            f"volume's series {grid.series_uid}") as e:
        dicom_masks.labels_from_rtstruct(to_bytes(ds), "rs.dcm", grid)
    assert e.value.reason == "mask_reference_mismatch"


def test_markers_open_lines_and_contours_of_fewer_than_three_points(series):
    """POINT and OPEN_PLANAR contours (markers, lines) enclose nothing: left out, the note naming
    their ROIs. A closed contour of 1 or 2 points (OpenCV's trace of a one-voxel-wide structure,
    which rt-utils writes) is the voxels it passes through, noted. A contour off its slice plane by
    more than the tolerance is rejected, never placed on the nearest slice."""
    _, grid, _ = series
    rois = [(1, "seed", [("CLOSED_PLANAR", 2, np.array([[20.0, 30.0]])),
                         ("CLOSED_PLANAR", 3, np.array([[40.0, 50.0], [44.0, 50.0]]))]),
            (2, "isocenter", [("POINT", 4, np.array([[60.2, 60.2]]))]),
            (3, "applicator", [("OPEN_PLANAR", 4, _square(10.5, 10.5, 30.5, 30.5))])]
    mask = dicom_masks.labels_from_rtstruct(to_bytes(rtstruct_dataset(grid, rois)), "rs.dcm", grid)
    truth = np.zeros(grid.shape, np.uint8)
    truth[2, 30, 20] = 1
    truth[3, 50, 40:45] = 1
    np.testing.assert_array_equal(mask.labels, truth)
    assert mask.notes == (
        "contours_ignored: 1 OPEN_PLANAR (ROI(s) 'applicator'), 1 POINT (ROI(s) 'isocenter') (markers and open "
        "lines: only CLOSED_PLANAR contours enclose voxels)",
        "contours_degenerate: 2 closed contour(s) of 1 or 2 points (ROI(s) 'seed') enclose no area: kept as the "
        "voxel centres they pass through (how OpenCV and rt-utils trace a structure one voxel wide)")
    off = rtstruct_dataset(grid, [(1, "a", [("CLOSED_PLANAR", 2 + 2 * dicom_masks._POSITION_TOLERANCE,
                                             _square(20.5, 20.5, 60.5, 60.5))])])
    with pytest.raises(ImageRejected, match="does not lie on one slice plane of the series") as e:
        dicom_masks.labels_from_rtstruct(to_bytes(off), "rs.dcm", grid)
    assert e.value.reason == "mask_geometry_mismatch"


# pydicom's own test data: an RT Structure Set written by a planning system's export ('TPS'),
# whose CT series pydicom does not ship. Its header and contours (rtstruct.dump beside it):
PYDICOM_RTSTRUCT_SERIES = "1.2.826.0.1.3680043.8.498.2010020400001.2.1.1"
PYDICOM_RTSTRUCT_FRAME = "1.2.826.0.1.3680043.8.498.2010020400001.2"


def test_pydicom_s_rtstruct_without_its_series_and_on_its_series_rebuilt(series, tmp_path):
    """pydicom's rtstruct.dcm ('patient': a 400 x 300 mm box on z = -200, -190, -180 mm, two
    isocentre POINTs). Without its CT series (pydicom does not ship it) it pairs with no volume
    and, given another series' volume, is 'mask_reference_mismatch' naming the series it
    outlines. On a series rebuilt from its references (its series and frame of reference UIDs,
    slices on its contours' planes) the box is filled, the POINTs noted."""
    data = pathlib.Path(get_testdata_file("rtstruct.dcm")).read_bytes()
    header = dicom_masks.read_mask_header(io.BytesIO(data), "rtstruct.dcm")
    assert header == dicom_masks.MaskHeader("rtstruct", (PYDICOM_RTSTRUCT_SERIES,),
                                            ("patient", "Isocenter 1", "Isocenter 2"), ())
    _, grid, _ = series
    with pytest.raises(ImageRejected, match=f"rtstruct.dcm outlines series {PYDICOM_RTSTRUCT_SERIES}, not the "
                                            f"volume's series {grid.series_uid}") as e:
        dicom_masks.read_dicom_mask(data, "rtstruct.dcm", grid)
    assert e.value.reason == "mask_reference_mismatch"
    # Its series rebuilt: 3 axial slices of 128 x 128 pixels of 4 mm, the first voxel at (-254, -254) mm.
    folder = tmp_path / "ct"
    folder.mkdir()
    for k, z in enumerate((-180.0, -200.0, -190.0)):  # Files in no particular order.
        ds = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
        ds.ImagePositionPatient, ds.ImageOrientationPatient = [-254.0, -254.0, z], [1, 0, 0, 0, 1, 0]
        ds.PixelSpacing = [4.0, 4.0]
        ds.SeriesInstanceUID, ds.FrameOfReferenceUID = PYDICOM_RTSTRUCT_SERIES, PYDICOM_RTSTRUCT_FRAME
        ds.SOPInstanceUID = generate_uid()
        ds.save_as(folder / f"{k}.dcm", enforce_file_format=True)
    rebuilt, _ = grid_of(folder)
    mask = dicom_masks.read_dicom_mask(data, "rtstruct.dcm", rebuilt)
    assert mask.class_names == ("background", "patient", "Isocenter 1", "Isocenter 2")
    # x -200..200 mm: columns 13.5..113.5; y -150..150 mm: rows 26..101, both edges on pixel centres.
    truth = np.zeros((3, SIZE, SIZE), np.uint8)
    truth[:, 26:102, 14:114] = 1
    np.testing.assert_array_equal(mask.labels, truth)
    assert mask.notes == ("contours_ignored: 2 POINT (ROI(s) 'Isocenter 1', 'Isocenter 2') (markers and open lines: "
                          "only CLOSED_PLANAR contours enclose voxels)",)


def test_reasons_are_documented():
    text = (pathlib.Path(__file__).parent.parent / "docs/preparing/output.md").read_text(encoding="utf-8")
    assert [r for r in dicom_masks.REJECT_REASONS if f"`{r}`" not in text] == []


def test_rtstruct_cut_short_anywhere_is_corrupt_never_a_partial_mask(tmp_path):
    """Found by a mutation run of mask files (mfuzz12), on rt-utils' RTSTRUCT cut at many offsets:
    pydicom parses its sequences lazily, and a cut inside one raised OSError ('No tag to read at
    file position ...') while the mask was decoded: the volume was rejected 'unreadable', naming no
    mask. A cut before ROIContourSequence read without an error, as an all-background mask. Every
    cut is now rejected with a reason, or (past the contours) read whole."""
    folder = tmp_path / "s"
    write_series(folder, count=4)
    grid, _ = grid_of(folder)
    truth = blobs(4, segments=2, seed=5)
    builder = RTStructBuilder.create_new(dicom_series_path=str(folder))
    for number in (1, 2):
        builder.add_roi(mask=np.ascontiguousarray((truth == number).transpose(1, 2, 0)), name=f"organ {number}")
    path = tmp_path / "rs.dcm"
    builder.save(str(path))
    data = path.read_bytes()
    whole = dicom_masks.read_dicom_mask(data, "rs.dcm", grid).labels
    reasons = set()
    for at in range(200, len(data), 11):
        try:
            mask = dicom_masks.read_dicom_mask(data[:at], "rs.dcm", grid)
        except ImageRejected as e:
            reasons.add(e.reason)
            continue
        np.testing.assert_array_equal(mask.labels, whole, err_msg=f"cut at {at} of {len(data)}")
    assert "corrupt" in reasons
    # Cut right between two items (rt-utils writes the contours' sequences with their lengths):
    # pydicom reads the items before the cut without an error. The offsets above hit such a cut
    # by chance only (rt-utils' UIDs are random, the offsets move): each item start of the
    # contours is cut here.
    contours = data.index(b"\x06\x30\x39\x00")  # Implicit VR: tag, 4-byte length, the items.
    end = contours + 8 + int.from_bytes(data[contours + 4:contours + 8], "little")
    starts = [i for i in range(contours, end) if data.startswith(b"\xfe\xff\x00\xe0", i)]
    assert len(starts) > 4
    for at in starts[1:]:
        with pytest.raises(ImageRejected, match="cut short") as e:
            dicom_masks.read_dicom_mask(data[:at], "rs.dcm", grid)
        assert e.value.reason == "corrupt"
    with pytest.raises(ImageRejected, match="without ROIContourSequence") as e:
        dicom_masks.read_dicom_mask(data[:data.index(b"\x06\x30\x39\x00")], "rs.dcm", grid)  # (3006,0039)
    assert e.value.reason == "corrupt"


@pytest.mark.parametrize("x,y", [(1e308, -45.0), (-1e9, 1e9), (3e5, -45.0)])
def test_a_contour_point_far_off_the_slices_is_a_geometry_mismatch(series, x, y):
    """Found by a mutation run of mask files (mfuzz12): one point of a square moved to x = 1e308 mm
    (or -1e9, 1e9) was read, its polygon filling a wedge of the slice (1e308 overflowed to inf
    through the grid's inverse affine). A structure past the field of view by a little is read."""
    _, grid, _ = series
    square = np.array([[20.5, 20.5], [60.5, 20.5], [60.5, 60.5], [20.5, 60.5]])
    ds = rtstruct_dataset(grid, [(1, "a", [("CLOSED_PLANAR", 2, square)])])
    contour = ds.ROIContourSequence[0].ContourSequence[0]
    original = [float(v) for v in contour.ContourData]
    within = dicom_masks.read_dicom_mask(to_bytes(ds), "rs.dcm", grid).labels
    values = list(original)
    values[0], values[1] = x, y
    contour.ContourData = [f"{v:.10g}" for v in values]
    with pytest.raises(ImageRejected, match="slice widths off the series' 128x128 slices") as e:
        dicom_masks.read_dicom_mask(to_bytes(ds), "rs.dcm", grid)
    assert e.value.reason == "mask_geometry_mismatch"
    values = list(original)
    values[0], values[1] = values[3] - 200.0, values[4]  # 300 pixels past the edge: read, clipped to the slice.
    contour.ContourData = [f"{v:.10g}" for v in values]
    wider = dicom_masks.read_dicom_mask(to_bytes(ds), "rs.dcm", grid).labels
    assert wider.sum() > within.sum()
