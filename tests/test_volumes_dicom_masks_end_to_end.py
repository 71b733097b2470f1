"""DICOM SEG and RTSTRUCT masks of DICOM series volumes (--volumes --masks_dir), on Beam's DirectRunner.

A TCIA-like tree (`patient/study/<series folder>/*.dcm`, the segmentations in folders of
their own beside the series, named `1-1.dcm`) with --masks_dir equal to --input_dir: SEGs
written by highdicom, an RTSTRUCT by rt-utils, CT slices by pydicom (the fixtures of
test_imaging_dicom_masks). The truth of every voxel is the label array the writers were
given; the stored ids are its labels mapped by name to the dataset's class table.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.uid import generate_uid
from rt_utils import RTStructBuilder

import readers
from beam_jobs import convert
from test_imaging_dicom_masks import blobs, grid_of, sources_in_k_order, stacked, write_series

DEPTH = 6
# Segment labels of the SEG (by SegmentNumber 1, 2, 3) and ROI names of the RTSTRUCT (in its
# StructureSetROISequence order): the same organs under other numbers.
SEG_LABELS = ("liver", "spleen", "kidney")
ROI_NAMES = ("kidney", "tumour", " liver ")  # Names are compared stripped of spaces.
# "background" first, then every name sorted.
TABLE = ["background", "kidney", "liver", "spleen", "tumour"]


def _seg(sources, labels, names, **kwargs):
    descriptions = [hd.seg.SegmentDescription(
        segment_number=n, segment_label=name,
        segmented_property_category=hd.sr.CodedConcept("91723000", "SCT", "Anatomical Structure"),
        segmented_property_type=hd.sr.CodedConcept("10200004", "SCT", "Liver"),
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL) for n, name in enumerate(names, start=1)]
    seg = hd.seg.Segmentation(
        source_images=sources, pixel_array=stacked(labels, len(names)), segmentation_type="BINARY",
        segment_descriptions=descriptions, series_instance_uid=generate_uid(), series_number=300,
        sop_instance_uid=generate_uid(), instance_number=1, manufacturer="test", manufacturer_model_name="test",
        software_versions="1", device_serial_number="1", **kwargs)
    out = io.BytesIO()
    seg.save_as(out)
    return out.getvalue()


def _reframed(data):
    """The SEG in another frame of reference (same series reference)."""
    ds = pydicom.dcmread(io.BytesIO(data))
    ds.FrameOfReferenceUID = generate_uid()
    out = io.BytesIO()
    ds.save_as(out)
    return out.getvalue()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """The tree, and per volume name its truth (stored ids, k order) where it is written."""
    root = tmp_path_factory.mktemp("tcia") / "input"
    truths = {}
    # A: the SEG's series, stacked in reverse order of its files' positions (descending).
    write_series(root / "P1/ST1/1.000000-CT-A", count=DEPTH, descending=True)
    grid, _ = grid_of(root / "P1/ST1/1.000000-CT-A")
    labels = blobs(DEPTH, 3, seed=3)
    (root / "P1/ST1/300.000000-SEG-A").mkdir()
    (root / "P1/ST1/300.000000-SEG-A/1-1.dcm").write_bytes(
        _seg(sources_in_k_order(root / "P1/ST1/1.000000-CT-A", grid), labels, SEG_LABELS))
    truths["P1/ST1"] = np.array([0] + [TABLE.index(n) for n in SEG_LABELS])[labels]
    # B: an RTSTRUCT by rt-utils, its ROIs in another order than the SEG's segments, two of the same names.
    folder = root / "P2/ST1/1.000000-CT-B"
    write_series(folder, count=DEPTH)
    labels = blobs(DEPTH, 3, seed=11)
    builder = RTStructBuilder.create_new(dicom_series_path=str(folder))
    for number, name in enumerate(ROI_NAMES, start=1):
        builder.add_roi(mask=np.ascontiguousarray((labels == number).transpose(1, 2, 0)), name=name)
    (root / "P2/ST1/2.000000-RTSTRUCT-B").mkdir()
    builder.save(str(root / "P2/ST1/2.000000-RTSTRUCT-B/1-1.dcm"))
    truths["P2/ST1"] = np.array([0] + [TABLE.index(n.strip()) for n in ROI_NAMES])[labels]
    # C: two SEGs of one series: ambiguous.
    write_series(root / "P3/ST1/1.000000-CT-C", count=DEPTH)
    grid, _ = grid_of(root / "P3/ST1/1.000000-CT-C")
    sources = sources_in_k_order(root / "P3/ST1/1.000000-CT-C", grid)
    for n in (1, 2):
        (root / f"P3/ST1/30{n}.000000-SEG-C").mkdir()
        (root / f"P3/ST1/30{n}.000000-SEG-C/1-1.dcm").write_bytes(_seg(sources, blobs(DEPTH, 1, seed=n), ["liver"]))
    # D: a SEG referencing D's series, but in another frame of reference.
    write_series(root / "P4/ST1/1.000000-CT-D", count=DEPTH)
    grid, _ = grid_of(root / "P4/ST1/1.000000-CT-D")
    seg = _seg(sources_in_k_order(root / "P4/ST1/1.000000-CT-D", grid), blobs(DEPTH, 1, seed=4), ["spleen"])
    (root / "P4/ST1/300.000000-SEG-D").mkdir()
    (root / "P4/ST1/300.000000-SEG-D/1-1.dcm").write_bytes(_reframed(seg))
    # E: a series without a mask.
    write_series(root / "P5/ST1/1.000000-CT-E", count=DEPTH)
    # A SEG of a series that is not among the inputs (its slices elsewhere): an unmatched mask.
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "ct"
    write_series(elsewhere, count=DEPTH)
    grid, _ = grid_of(elsewhere)
    (root / "P6/ST1/300.000000-SEG-X").mkdir(parents=True)
    (root / "P6/ST1/300.000000-SEG-X/1-1.dcm").write_bytes(
        _seg(sources_in_k_order(elsewhere, grid), blobs(DEPTH, 1, seed=6), ["bladder"]))
    return root, truths


def _convert(root, out, *more):
    convert.run(["--volumes", "--input_dir", str(root), *more, "--output_dir", str(out), "--runner", "DirectRunner",
                 "--direct_num_workers", "1"])
    return json.loads((out / "manifest.json").read_text())


def _rejects(out):
    return [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines() if line.strip()]


def _shard_digests(out):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.tfrecord"))}


# rt-utils 1.2.7 sets FileDataset.is_little_endian / is_implicit_VR, which pydicom 3 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:'FileDataset.is_:DeprecationWarning")


def test_tcia_tree_with_seg_and_rtstruct_beside_their_series(tree, tmp_path):
    root, truths = tree
    manifest = _convert(root, tmp_path / "out", "--masks_dir", str(root))
    section = manifest["targets"]["mask"]
    # One table for the dataset: the SEG's liver (segment 1) and the RTSTRUCT's (ROI 3) are one id.
    assert section["class_names"] == TABLE
    assert section["dtype"] == "uint8" and section["paired_by"] == "reference"
    # Patients are no classes (ROOT/<patient>/<study>/<series>/<file>): label -1, no class names.
    assert manifest["class_names"] == []
    assert section["unmatched_masks"] == 1  # The SEG of a series not among the inputs.
    assert readers.metadata.load_split(tmp_path / "out", "train", kind="volume").targets["mask"]["class_names"] == TABLE
    ds = readers.volume_dataset_from_tfrecords(tmp_path / "out", "train", dtype=None, label_mode="mask",
                                               extra_features=("filename",))
    stored = {e["filename"].numpy().decode(): m.numpy()[..., 0] for _, m, e in ds}
    assert sorted(stored) == sorted(truths)
    for name, truth in truths.items():
        np.testing.assert_array_equal(stored[name], truth, err_msg=name)  # Every voxel.
    assert set(np.unique(stored["P2/ST1"])) == {0, 1, 2, 4}  # kidney, liver, tumour remapped.
    # The volume tools: classes by name, paired by reference; CT planes through each mask, in CT's window.
    from shardsmith import volumes

    text = volumes.inspect_volumes(str(tmp_path / "out"))
    assert "paired by reference, 1 unmatched mask file(s)" in text
    assert f"class 1 {TABLE[1]}: train " in text
    assert volumes.verify_volumes(str(tmp_path / "out")) == []
    ds = readers.volume_dataset_from_tfrecords(tmp_path / "out", "train", dtype=None, label_mode="mask",
                                               extra_features=("filename", "volume/spacing", "volume/modality"))
    for v, m, e in ds:
        planes = volumes.volume_planes(v.numpy()[..., 0], e["volume/spacing"].numpy(),
                                       e["volume/modality"].numpy().decode(), m.numpy()[..., 0].astype(np.uint8))
        fg = stored[e["filename"].numpy().decode()] > 0
        assert planes.window == (-160.0, 240.0) and planes.through_foreground == bool(fg.any())
        assert planes.slices == tuple(int(np.argmax(fg.sum(axis=tuple(a for a in range(3) if a != axis))))
                                      for axis in range(3)) or not fg.any()
    assert volumes.preview_volumes(str(tmp_path / "out")) == str(tmp_path / "out" / "preview.png")
    # Counts: the CT slices are the inputs (5 series of 6); the SEG/RTSTRUCT files are masks, not counted.
    counts = manifest["counts"]
    assert counts == {"found": 30, "written": 12, "rejected": 18, "skipped": 0}
    assert counts["found"] == counts["written"] + counts["rejected"] + counts["skipped"]
    rejects = _rejects(tmp_path / "out")
    by_series = {}
    for r in rejects:
        by_series.setdefault(r["path"].split("/")[0], set()).add(r["reason"])
    assert by_series == {"P3": {"mask_unreadable"}, "P4": {"mask_reference_mismatch"}, "P5": {"missing_mask"}}
    ambiguous = next(r["message"] for r in rejects if r["path"].startswith("P3/"))
    assert "P3/ST1/301.000000-SEG-C/1-1.dcm and P3/ST1/302.000000-SEG-C/1-1.dcm" in ambiguous
    assert "ambiguous" in ambiguous
    reframed = next(r["message"] for r in rejects if r["path"].startswith("P4/"))
    assert "FrameOfReferenceUID" in reframed and "SEG-D/1-1.dcm" in reframed
    missing = next(r["message"] for r in rejects if r["path"].startswith("P5/"))
    assert "no SEG or RTSTRUCT" in missing
    # Same input, same bytes.
    _convert(root, tmp_path / "again", "--masks_dir", str(root))
    assert _shard_digests(tmp_path / "out") == _shard_digests(tmp_path / "again")
    assert (tmp_path / "out" / "rejects.jsonl").read_bytes() == (tmp_path / "again" / "rejects.jsonl").read_bytes()


def test_masks_dir_outside_the_input(tree, tmp_path):
    """The segmentations in a folder of their own (any names, any depth): paired by reference too."""
    root, truths = tree
    images, masks = tmp_path / "images", tmp_path / "masks"
    for series in ("P1/ST1/1.000000-CT-A", "P2/ST1/1.000000-CT-B"):
        shutil.copytree(root / series, images / series)
    masks.mkdir()
    shutil.copy(root / "P1/ST1/300.000000-SEG-A/1-1.dcm", masks / "a")
    (masks / "deep" / "er").mkdir(parents=True)
    shutil.copy(root / "P2/ST1/2.000000-RTSTRUCT-B/1-1.dcm", masks / "deep" / "er" / "rs")
    (masks / "notes.txt").write_text("not a mask")
    manifest = _convert(images, tmp_path / "out", "--masks_dir", str(masks))
    assert manifest["targets"]["mask"]["class_names"] == TABLE
    assert manifest["counts"] == {"found": 12, "written": 12, "rejected": 0, "skipped": 0}
    ds = readers.volume_dataset_from_tfrecords(tmp_path / "out", "train", dtype=None, label_mode="mask",
                                               extra_features=("filename",))
    for _, m, e in ds:
        name = e["filename"].numpy().decode()
        np.testing.assert_array_equal(m.numpy()[..., 0], truths[name], err_msg=name)


def test_without_masks_dir_segmentations_are_skipped(tree, tmp_path):
    root, _ = tree
    manifest = _convert(root, tmp_path / "out")
    counts = manifest["counts"]
    # 30 CT slices in 5 volumes; the 4 SEGs, the RTSTRUCT and the unmatched SEG skipped.
    assert counts == {"found": 36, "written": 30, "rejected": 0, "skipped": 6}
    skipped = [r for r in _rejects(tmp_path / "out") if r["reason"] == "segmentation_object"]
    assert len(skipped) == 6
    assert all("--masks_dir" in r["message"] for r in skipped)
    rtstruct = next(r for r in skipped if "RTSTRUCT-B" in r["path"])
    assert "RT Structure Set" in rtstruct["message"]
    assert "mask" not in manifest.get("targets", {})


def test_nifti_and_dicom_masks_in_one_dataset_are_refused(tree, tmp_path):
    import nibabel as nib

    root, _ = tree
    images = tmp_path / "images"
    shutil.copytree(root / "P1", images / "P1")
    (images / "Q").mkdir()
    volume = nib.Nifti1Image(np.zeros((4, 4, 3), np.int16), np.eye(4))
    nib.save(volume, images / "Q" / "case.nii.gz")
    nib.save(nib.Nifti1Image(np.zeros((4, 4, 3), np.uint8), np.eye(4)), images / "Q" / "case_mask.nii.gz")
    with pytest.raises(ValueError, match="DICOM SEG/RTSTRUCT masks and 1 with NIfTI"):
        _convert(images, tmp_path / "out", "--masks_dir", str(images), "--mask_suffix", ":_mask")


def test_seg_header_gives_references_and_names(tree):
    from imaging import dicom_masks

    root, _ = tree
    with open(root / "P2/ST1/2.000000-RTSTRUCT-B/1-1.dcm", "rb") as f:
        header = dicom_masks.read_mask_header(f, "rs")
    assert header.kind == "rtstruct" and header.class_names == tuple(n.strip() for n in ROI_NAMES)
    series = pydicom.dcmread(next((root / "P2/ST1/1.000000-CT-B").iterdir())).SeriesInstanceUID
    assert header.series_uids == (series,)
    # The images it lists as drawn on: every slice of its series (rt-utils lists them all).
    slices = tuple(sorted(pydicom.dcmread(p).SOPInstanceUID for p in (root / "P2/ST1/1.000000-CT-B").iterdir()))
    assert header.instance_uids == slices
    with open(root / "P1/ST1/300.000000-SEG-A/1-1.dcm", "rb") as f:
        header = dicom_masks.read_mask_header(f, "seg")
    assert header.kind == "seg" and header.class_names == SEG_LABELS
    slices = tuple(sorted(pydicom.dcmread(p).SOPInstanceUID for p in (root / "P1/ST1/1.000000-CT-A").iterdir()))
    assert header.instance_uids == slices
    with open(next((root / "P1/ST1/1.000000-CT-A").iterdir()), "rb") as f:
        assert dicom_masks.read_mask_header(f, "ct") is None


def test_each_stack_of_a_series_gets_its_mask_decoded_on_its_own_grid(tmp_path):
    """A series of two stacks (two orientations, `#stack=k`): both are paired with the SEG drawn on
    one; the other's slices are not the SEG's, and it is rejected as mask_geometry_mismatch."""
    from imaging import volumes

    root = tmp_path / "input"
    folder = root / "P1/ST1/1.000000-CT"
    series_uid, frame_of_reference, axial = write_series(folder, count=6)
    write_series(folder, count=5, orientation="oblique", series_uid=series_uid, frame_of_reference=frame_of_reference)
    slices = [s for p in axial for s in volumes.read_slices(p.read_bytes(), p.name)]
    stack = volumes.plan_stacks(slices).stacks[0]
    from imaging.dicom_masks import SeriesGrid

    grid = SeriesGrid.from_stack(stack)
    by_uid = {pydicom.dcmread(p).SOPInstanceUID: pydicom.dcmread(p) for p in axial}
    labels = blobs(6, 2, seed=8)
    (root / "P1/ST1/300.000000-SEG").mkdir()
    (root / "P1/ST1/300.000000-SEG/1-1.dcm").write_bytes(
        _seg([by_uid[u] for u in grid.sop_instance_uids], labels, ("liver", "spleen")))
    manifest = _convert(root, tmp_path / "out", "--masks_dir", str(root))
    assert manifest["counts"] == {"found": 11, "written": 6, "rejected": 5, "skipped": 0}
    rejects = _rejects(tmp_path / "out")
    assert {r["reason"] for r in rejects} == {"mask_geometry_mismatch"}
    assert all("#stack=" in r["message"] and "SEG/1-1.dcm" in r["message"] for r in rejects)
    ds = readers.volume_dataset_from_tfrecords(tmp_path / "out", "train", dtype=None, label_mode="mask",
                                               extra_features=("filename",))
    (name, mask), = [(e["filename"].numpy().decode(), m.numpy()[..., 0]) for _, m, e in ds]
    assert name.startswith("P1/ST1#stack=")
    np.testing.assert_array_equal(mask, labels)


def _series_with_seg(root, series, names, seed):
    """A CT series at root/<series> and a SEG of `names` beside it (<study>/300.000000-SEG-<seed>/1-1.dcm);
    its labels (0 background, k the k-th name)."""
    write_series(root / series, count=DEPTH)
    grid, _ = grid_of(root / series)
    labels = blobs(DEPTH, len(names), seed=seed)
    seg = root / series.rsplit("/", 1)[0] / f"300.000000-SEG-{seed}"
    seg.mkdir()
    (seg / "1-1.dcm").write_bytes(_seg(sources_in_k_order(root / series, grid), labels, names))
    return labels


def _masks_by_name(out, version=None):
    ds = readers.volume_dataset_from_tfrecords(out, "train", dtype=None, label_mode="mask", version=version,
                                               extra_features=("filename",))
    return {e["filename"].numpy().decode(): m.numpy()[..., 0] for _, m, e in ds}


def test_append_new_series_with_a_seg_naming_a_new_class(tmp_path):
    """A week of new CT series with their SEGs: held ids never move, a new name comes at the table's end."""
    root = tmp_path / "input"
    first = {"P1/ST1": _series_with_seg(root, "P1/ST1/1.000000-CT", ("liver", "spleen"), 1),
             "P2/ST1": _series_with_seg(root, "P2/ST1/1.000000-CT", ("kidney",), 2)}
    out = tmp_path / "out"
    manifest = _convert(root, out, "--masks_dir", str(root))
    v1_table = ["background", "kidney", "liver", "spleen"]
    assert manifest["targets"]["mask"]["class_names"] == v1_table and manifest["class_names"] == []
    v1 = _masks_by_name(out)
    v1_shards = _shard_digests(out)
    # The new week: a new patient's series whose SEG names "aorta" (sorted first, yet appended last), and a
    # new study of a held patient.
    second = {"P3/ST1": _series_with_seg(root, "P3/ST1/1.000000-CT", ("liver", "aorta"), 3),
              "P1/ST2": _series_with_seg(root, "P1/ST2/1.000000-CT", ("spleen",), 4)}
    grown = _convert(root, out, "--masks_dir", str(root), "--append")
    table = [*v1_table, "aorta"]
    section = grown["targets"]["mask"]
    assert section["class_names"] == table and section["dtype"] == "uint8" and section["paired_by"] == "reference"
    assert grown["class_names"] == [] and len(grown["versions"]) == 2
    assert readers.metadata.load_split(out, "train", kind="volume").targets["mask"]["class_names"] == table
    # Held records are never rewritten: version 1 reads as it did, its ids unchanged.
    assert {k: v for k, v in _shard_digests(out).items() if k in v1_shards} == v1_shards
    old = _masks_by_name(out, version=1)
    assert sorted(old) == sorted(v1)
    for name, mask in old.items():
        np.testing.assert_array_equal(mask, v1[name], err_msg=name)
    truth = {name: np.array([0, *(table.index(n) for n in names)])[labels] for name, labels, names in (
        ("P1/ST1", first["P1/ST1"], ("liver", "spleen")), ("P2/ST1", first["P2/ST1"], ("kidney",)),
        ("P3/ST1", second["P3/ST1"], ("liver", "aorta")), ("P1/ST2", second["P1/ST2"], ("spleen",)))}
    now = _masks_by_name(out)
    assert sorted(now) == sorted(truth)
    for name, mask in now.items():
        np.testing.assert_array_equal(mask, truth[name], err_msg=name)
    assert set(np.unique(now["P3/ST1"])) == {0, 2, 4}  # liver keeps its held id, aorta is 4.
    # Same input, same bytes: the same two runs into another folder.
    again = tmp_path / "again"
    for series in second:
        shutil.move(str(root / series.split("/")[0] / series.split("/")[1]), str(tmp_path / series.replace("/", "_")))
    _convert(root, again, "--masks_dir", str(root))
    for series in second:
        shutil.move(str(tmp_path / series.replace("/", "_")), str(root / series.split("/")[0] / series.split("/")[1]))
    _convert(root, again, "--masks_dir", str(root), "--append")
    assert _shard_digests(again) == _shard_digests(out)
    assert json.loads((again / "manifest.json").read_text())["targets"] == grown["targets"]


def test_append_of_seg_masks_to_a_dataset_of_nifti_masks_is_refused(tmp_path):
    import nibabel as nib

    root, masks = tmp_path / "input", tmp_path / "masks"
    write_series(root / "P1/ST1/1.000000-CT", count=DEPTH)
    grid, _ = grid_of(root / "P1/ST1/1.000000-CT")
    (masks / "P1").mkdir(parents=True)
    # The series' NIfTI mask by name (MASKS/<patient>/<study>.nii.gz), on its grid (k, j, i -> i, j, k).
    nib.save(nib.Nifti1Image(blobs(DEPTH, 1, seed=5).transpose(2, 1, 0).astype(np.uint8), grid.affine),
             masks / "P1" / "ST1.nii.gz")
    out = tmp_path / "out"
    assert _convert(root, out, "--masks_dir", str(masks))["counts"]["written"] == DEPTH
    labels_seg = _series_with_seg(root, "P2/ST1/1.000000-CT", ("liver",), 6)
    assert labels_seg.any()
    shutil.move(str(root / "P2/ST1/300.000000-SEG-6"), str(masks / "seg"))
    with pytest.raises(ValueError, match="dataset of NIfTI label volumes.*DICOM SEG/RTSTRUCT.*--overwrite"):
        _convert(root, out, "--masks_dir", str(masks), "--append")


def test_append_whose_class_table_outgrows_uint8_is_refused(tmp_path):
    """255 names fit uint8 (255 is its ignore id): an RTSTRUCT that grows the table past them needs
    uint16, which the held uint8 masks cannot become."""
    root = tmp_path / "input"
    _series_with_seg(root, "P1/ST1/1.000000-CT", ("liver",), 1)
    out = tmp_path / "out"
    assert _convert(root, out, "--masks_dir", str(root))["targets"]["mask"]["dtype"] == "uint8"
    folder = root / "P2/ST1/1.000000-CT"
    write_series(folder, count=DEPTH)
    builder = RTStructBuilder.create_new(dicom_series_path=str(folder))
    for n in range(255):  # With background and liver: 257 names.
        roi = np.zeros((128, 128, DEPTH), bool)
        roi[8 * (n % 15) + 2:8 * (n % 15) + 6, 8 * (n // 15) % 120 + 2:8 * (n // 15) % 120 + 6, n % DEPTH] = True
        builder.add_roi(mask=roi, name=f"structure {n:03d}")
    (root / "P2/ST1/2.000000-RTSTRUCT").mkdir()
    builder.save(str(root / "P2/ST1/2.000000-RTSTRUCT/1-1.dcm"))
    with pytest.raises(ValueError, match="grow its class table to 257 names .255 new., which need uint16.*--overwrite"):
        _convert(root, out, "--masks_dir", str(root), "--append")
    assert len(json.loads((out / "manifest.json").read_text()).get("versions") or [1]) == 1


def test_a_seg_naming_another_series_than_its_images_costs_only_its_own_volume(tmp_path):
    """Found by a mutation run of mask files (mfuzz12): B's SEG with its ReferencedSeriesSequence
    rewritten to name A's series (its images still B's slices) made A's volume ambiguous (two
    masks): A was lost for B's damaged header. Of several masks of a series, those listing none of
    its slices are left out: A is converted with its own SEG; B is missing_mask, naming its SEG and
    what that references (and C, whose SEG is cut short, naming it unreadable)."""
    root = tmp_path / "input"
    uids = {}
    for name in ("A", "B", "C"):
        folder = root / f"P{name}/ST1/1.000000-CT"
        uids[name], _, _ = write_series(folder, count=DEPTH)
        grid, _ = grid_of(folder)
        data = _seg(sources_in_k_order(folder, grid), blobs(DEPTH, 1, seed=7), ["liver"])
        if name == "B":
            ds = pydicom.dcmread(io.BytesIO(data))
            ds.ReferencedSeriesSequence[0].SeriesInstanceUID = uids["A"]
            out = io.BytesIO()
            ds.save_as(out)
            data = out.getvalue()
        elif name == "C":  # Cut short in its header: no reference to read.
            data = data[:1000]
        (root / f"P{name}/ST1/300.000000-SEG").mkdir()
        (root / f"P{name}/ST1/300.000000-SEG/1-1.dcm").write_bytes(data)
    manifest = _convert(root, tmp_path / "out", "--masks_dir", str(root))
    assert manifest["counts"] == {"found": 3 * DEPTH, "written": DEPTH, "rejected": 2 * DEPTH, "skipped": 0}
    assert manifest["targets"]["mask"]["unmatched_masks"] == 2
    rejects = _rejects(tmp_path / "out")
    assert {(r["path"].split("/")[0], r["reason"]) for r in rejects} == {("PB", "missing_mask"), ("PC", "missing_mask")}
    message = {r["path"].split("/")[0]: r["message"] for r in rejects}
    assert f"beside it, PB/ST1/300.000000-SEG/1-1.dcm references series {uids['A']}" in message["PB"]
    assert "beside it, PC/ST1/300.000000-SEG/1-1.dcm is unreadable (" in message["PC"]


def test_one_rtstruct_of_a_registered_ct_and_mr_is_the_mask_of_each(tmp_path):
    """Registration-based planning: one structure set outlines 'body' on the CT and 'gtv' on the
    registered MR, each ROI in its series' frame of reference, and references both series. Each
    series' volume takes it, keeping its own ROIs (the other's noted in normalized.jsonl); before,
    both volumes were rejected as mask_reference_mismatch. pydicom's rtstruct.dcm, whose series is
    not among the inputs, is an unmatched mask."""
    from pydicom.data import get_testdata_file

    from test_imaging_dicom_masks import rasterised, rtstruct_dataset, to_bytes

    root = tmp_path / "input"
    write_series(root / "P1/ST1/1.000000-CT", count=DEPTH)
    write_series(root / "P1/ST2/1.000000-MR", count=DEPTH, spacing=3.0)
    ct, _ = grid_of(root / "P1/ST1/1.000000-CT")
    mr, _ = grid_of(root / "P1/ST2/1.000000-MR")
    assert ct.frame_of_reference_uid != mr.frame_of_reference_uid
    square = np.array([[20.5, 20.5], [60.5, 20.5], [60.5, 60.5], [20.5, 60.5]])
    ds = rtstruct_dataset(ct, [(1, "body", [("CLOSED_PLANAR", 2, square)])])
    on_mr = rtstruct_dataset(mr, [(2, "gtv", [("CLOSED_PLANAR", 3, square + 10)])])
    ds.ReferencedFrameOfReferenceSequence.append(on_mr.ReferencedFrameOfReferenceSequence[0])
    ds.StructureSetROISequence.append(on_mr.StructureSetROISequence[0])
    ds.ROIContourSequence.append(on_mr.ROIContourSequence[0])
    (root / "P1/ST1/2.000000-RTSTRUCT").mkdir()
    (root / "P1/ST1/2.000000-RTSTRUCT/1-1.dcm").write_bytes(to_bytes(ds))
    (root / "P9").mkdir()
    shutil.copy(get_testdata_file("rtstruct.dcm"), root / "P9" / "rtstruct.dcm")
    out = tmp_path / "out"
    manifest = _convert(root, out, "--masks_dir", str(root))
    assert manifest["counts"] == {"found": 2 * DEPTH, "written": 2 * DEPTH, "rejected": 0, "skipped": 0}
    section = manifest["targets"]["mask"]
    # An unmatched mask adds no class: pydicom's structure set's names are not in the table.
    assert section["class_names"] == ["background", "body", "gtv"]
    assert section["unmatched_masks"] == 1
    ds = readers.volume_dataset_from_tfrecords(out, "train", dtype=None, label_mode="mask",
                                               extra_features=("filename",))
    stored = {e["filename"].numpy().decode(): m.numpy()[..., 0] for _, m, e in ds}
    truth = {name: np.zeros((DEPTH, 128, 128), np.uint8) for name in stored}
    ct_name, mr_name = sorted(stored)
    assert "ST1" in ct_name and "ST2" in mr_name
    truth[ct_name][2][rasterised(square)] = 1
    truth[mr_name][3][rasterised(square + 10)] = 2
    for name in stored:
        np.testing.assert_array_equal(stored[name], truth[name], err_msg=name)
    notes = {n["path"]: json.dumps(n) for n in
             (json.loads(line) for line in (out / "normalized.jsonl").read_text().splitlines() if line.strip())}
    assert "rois_other_frame_of_reference: ROI(s) 'gtv' left out" in notes[ct_name]
    assert "rois_other_frame_of_reference: ROI(s) 'body' left out" in notes[mr_name]
