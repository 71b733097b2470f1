"""`shardsmith preview`, `inspect` and `verify` of volume datasets with masks (`shardsmith.volumes`).

Small NIfTI trees written with nibabel are converted on Beam's DirectRunner; the sheets are read back
as PNG pixels and compared with the label volumes as written.
"""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from beam_jobs import convert
from schemas import tfrecord
from schemas.volumes import VOLUME, VOLUME_AFFINE, VOLUME_MASK_SCHEMA, VOLUME_SPACING, VolumeRecord
from shardsmith import preview, volumes

NAMES = ["background", "liver", "tumour", "vessel"]
# (depth, height, width) = (6, 16, 20) voxels of (5, 1, 1) mm: anisotropic, as thick-slice CT.
SHAPE_KJI = (6, 16, 20)
AFFINE = np.diag([1.0, 1.0, 5.0, 1.0])


def _mask_kji() -> np.ndarray:
    """Class ids [k, j, i]: a liver block, a tumour bar on row j=6 and a vessel column at i=5.

    Foreground voxels per slice make (k=2, j=6, i=5) the fullest slice of each axis.
    """
    m = np.zeros(SHAPE_KJI, np.uint8)
    m[2:4, 4:11, 3:9] = 1
    m[1:3, 6, 12:16] = 2
    m[0, 0:3, 5] = 3
    return m


def _save(values_kji, path, dtype):
    image = nib.Nifti1Image(np.asarray(values_kji).transpose(2, 1, 0).astype(dtype), AFFINE)
    image.set_sform(AFFINE, code=1)
    image.set_qform(AFFINE, code=1)
    nib.save(image, path)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A Decathlon-like tree: 'a' masked, 'b' with an empty mask and one very bright voxel."""
    root = tmp_path_factory.mktemp("task")
    images, labels, out = root / "imagesTr", root / "labelsTr", root / "out"
    images.mkdir()
    labels.mkdir()
    rng = np.random.default_rng(3)
    _save(rng.integers(0, 100, SHAPE_KJI), images / "a.nii.gz", np.int16)
    _save(_mask_kji(), labels / "a.nii.gz", np.uint8)
    bright = rng.integers(0, 100, SHAPE_KJI)
    bright[0, 0, 0] = 30000
    _save(bright, images / "b.nii.gz", np.int16)
    _save(np.zeros(SHAPE_KJI), labels / "b.nii.gz", np.uint8)
    _save(_mask_kji(), labels / "unpaired.nii.gz", np.uint8)
    (root / "dataset.json").write_text(json.dumps({"labels": {str(i): n for i, n in enumerate(NAMES)}}))
    convert.run(["--volumes", "--input_dir", str(images), "--masks_dir", str(labels), "--output_dir", str(out),
                 "--split", "train=1.0", "--runner", "DirectRunner", "--direct_num_workers", "1"])
    return out


def _records(out):
    """[(shard path, decoded record)] of every record."""
    found = []
    for shard in sorted(out.glob("*.tfrecord")):
        with open(shard, "rb") as f:
            found += [(shard, VOLUME_MASK_SCHEMA.decode(p)) for _, _, p in tfrecord.iter_records(f, shard.name)]
    return found


def _hits(sheet: np.ndarray, part: np.ndarray) -> list[tuple[int, int]]:
    """(y, x) of every place `part` lies in `sheet`, pixel for pixel."""
    h, w = part.shape[:2]
    return [(y, x) for y in range(sheet.shape[0] - h + 1) for x in range(sheet.shape[1] - w + 1)
            if (sheet[y, x] == part[0, 0]).all() and (sheet[y:y + h, x:x + w] == part).all()]


def _find(sheet: np.ndarray, part: np.ndarray) -> tuple[int, int]:
    """(y, x) of the one place `part` lies in `sheet`, pixel for pixel."""
    hits = _hits(sheet, part)
    assert len(hits) == 1, hits
    return hits[0]


def test_preview_shows_planes_through_the_mask_at_the_voxel_spacing(converted):
    path = volumes.preview_volumes(str(converted))
    sheet = np.asarray(Image.open(path).convert("RGB"))
    records = {r["filename"]: r for _, r in _records(converted)}
    a = records["a.nii.gz"]
    planes = volumes.volume_planes(a[VOLUME.key], a[VOLUME_SPACING.key], "", a["volume/mask"],
                                   affine=a[VOLUME_AFFINE.key])
    assert planes.slices == (2, 6, 5) and planes.through_foreground
    # 5 mm slices drawn 5 pixels high (1 mm per pixel): coronal and sagittal are 30 pixels high.
    assert [g.shape for g in planes.grey] == [(16, 20), (30, 20), (30, 16)]
    row = volumes.render_row(planes)
    gap = (row.shape[1] - sum(g.shape[1] for g in planes.grey)) // 2
    y, x = _find(sheet, row)
    truth = _mask_kji()
    # Stored RAS (i to the right, j anterior, k superior): shown radiologically every plane is
    # reversed both ways (the patient's right on the left, anterior and superior up).
    expected = (truth[2][::-1, ::-1], np.repeat(truth[:, 6, :], 5, axis=0)[::-1, ::-1],
                np.repeat(truth[:, :, 5], 5, axis=0)[::-1, ::-1])
    left = 0
    for plane, ids in zip(planes.grey, expected):
        pixels = sheet[y:y + plane.shape[0], x + left:x + left + plane.shape[1]].astype(np.int64)
        coloured = (pixels.max(axis=2) != pixels.min(axis=2))
        np.testing.assert_array_equal(coloured, ids > 0)  # Coloured exactly where the mask is.
        for i in np.unique(ids[ids > 0]):
            # Each class's colour at MASK_ALPHA over a grey: the same grey left on every channel.
            grey = (pixels[ids == i] - np.asarray(preview.colour_of(int(i))) * preview.MASK_ALPHA) / (
                1 - preview.MASK_ALPHA)
            assert np.ptp(grey, axis=1).max() < 2.5
        left += plane.shape[1] + gap
    assert sheet.shape[0] > y + 30
    # The legend under the rows: a swatch of each class shown, by name.
    legend = sheet[y + 30:]
    for i in (1, 2, 3):
        swatch = (legend == np.asarray(preview.colour_of(i), np.uint8)).all(axis=2)
        assert swatch.sum() >= 64, i
    # The same dataset, the same bytes.
    first = open(path, "rb").read()
    assert open(volumes.preview_volumes(str(converted)), "rb").read() == first


def _reordered(values_kji, affine, order):
    """(values [k, j, i], affine) of the same grid in another voxel order: 'ras' as given, 'lps' with
    i and j reversed (as DICOM stores an axial scan), 'sagittal' with its axes permuted (i, j, k) ->
    (k, i, j)."""
    ijk = np.asarray(values_kji).transpose(2, 1, 0)
    if order == "lps":
        nx, ny = ijk.shape[:2]
        flip = np.array([[-1, 0, 0, nx - 1], [0, -1, 0, ny - 1], [0, 0, 1, 0], [0, 0, 0, 1]], float)
        return ijk[::-1, ::-1, :].transpose(2, 1, 0), affine @ flip
    if order == "sagittal":
        return ijk.transpose(2, 0, 1).transpose(2, 1, 0), affine[:, [2, 0, 1, 3]]
    return np.asarray(values_kji), affine


def test_preview_shows_a_volume_the_same_whatever_its_voxel_order(tmp_path):
    """One anisotropic volume and its mask, written by nibabel RAS, LPS and sagittally: the same
    planes, pixel for pixel, in the radiological convention; crossing at the same RAS position."""
    images, labels, out = tmp_path / "imagesTr", tmp_path / "labelsTr", tmp_path / "out"
    images.mkdir()
    labels.mkdir()
    values = np.random.default_rng(4).integers(0, 1000, SHAPE_KJI)
    affine = np.array([[0.8, 0, 0, -10.0], [0, 0.9, 0, 4.0], [0, 0, 3.0, 20.0], [0, 0, 0, 1]])
    for order in ("ras", "lps", "sagittal"):
        for folder, what, dtype in ((images, values, np.int16), (labels, _mask_kji(), np.uint8)):
            data, moved = _reordered(what, affine, order)
            image = nib.Nifti1Image(np.asarray(data).transpose(2, 1, 0).astype(dtype), moved)
            image.set_sform(moved, code=1)
            image.set_qform(moved, code=1)
            nib.save(image, folder / f"{order}.nii.gz")
    convert.run(["--volumes", "--input_dir", str(images), "--masks_dir", str(labels), "--output_dir", str(out),
                 "--runner", "DirectRunner", "--direct_num_workers", "1"])
    records = {r["filename"]: r for _, r in _records(out)}
    assert sorted(records) == ["lps.nii.gz", "ras.nii.gz", "sagittal.nii.gz"]
    assert records["sagittal.nii.gz"][VOLUME.key].shape == (16, 20, 6)  # Stored in its own voxel order.
    shown, crossings = {}, {}
    for name, r in records.items():
        planes = volumes.volume_planes(r[VOLUME.key], r[VOLUME_SPACING.key], "", r["volume/mask"],
                                       affine=r[VOLUME_AFFINE.key])
        shown[name] = (planes, volumes.render_row(planes))
        k, j, i = planes.slices
        crossings[name] = (r[VOLUME_AFFINE.key] @ [i, j, k, 1])[:3]
    ras, row = shown.pop("ras.nii.gz")
    assert ras.through_foreground
    for name, (planes, other) in shown.items():
        np.testing.assert_array_equal(other, row, err_msg=name)
        for a, b in zip(planes.ids, ras.ids):
            np.testing.assert_array_equal(a, b, err_msg=name)
        np.testing.assert_allclose(crossings[name], crossings["ras.nii.gz"], err_msg=name)
    # RAS stored: the axial plane shows the stored slice reversed both ways (right on the left, anterior up).
    k = ras.slices[0]
    np.testing.assert_array_equal(ras.ids[0], _nearest_ids(_mask_kji()[k][::-1, ::-1], ras.grey[0].shape))
    # The sheet shows the three rows and says how.
    sheet = np.asarray(Image.open(volumes.preview_volumes(str(out))).convert("RGB"))
    assert len(_hits(sheet, row)) == 3
    assert volumes.DISPLAY_CONVENTION[0].startswith("Planes in the radiological convention")


def _nearest_ids(ids, shape):
    """`ids` [r, c] sampled at `shape`'s pixel centres by nearest neighbour (as the preview resamples)."""
    rows = np.clip(np.floor((np.arange(shape[0]) + 0.5) * ids.shape[0] / shape[0]).astype(int), 0, ids.shape[0] - 1)
    cols = np.clip(np.floor((np.arange(shape[1]) + 0.5) * ids.shape[1] / shape[1]).astype(int), 0, ids.shape[1] - 1)
    return ids[rows[:, None], cols[None, :]]


def test_preview_of_an_empty_mask_shows_middle_slices_by_percentiles(converted):
    b = {r["filename"]: r for _, r in _records(converted)}["b.nii.gz"]
    planes = volumes.volume_planes(b[VOLUME.key], b[VOLUME_SPACING.key], "", b["volume/mask"])
    assert planes.slices == (3, 8, 10) and not planes.through_foreground
    # One voxel of 30000 among values below 100: min/max scaling drew everything black.
    assert planes.window[1] < 100 and np.median(planes.grey[0]) > 80
    colourless = volumes.render_row(planes)
    assert (colourless.max(axis=2) == colourless.min(axis=2)).all()


def test_ct_is_shown_in_a_soft_tissue_window():
    volume = np.array([-1000, -160, 40, 240, 3000] * 4, np.int16).reshape(1, 4, 5)
    planes = volumes.volume_planes(volume, (1.0, 1.0, 1.0), "CT")
    assert planes.window == (-160.0, 240.0)
    np.testing.assert_array_equal(planes.grey[0][0], [0, 0, 128, 255, 255])
    # Not CT: the volume's own percentiles.
    assert volumes.volume_planes(volume, (1.0, 1.0, 1.0), "MR").window[0] < -160


def test_a_large_volume_is_shown_at_a_coarser_scale():
    planes = volumes.volume_planes(np.zeros((100, 512, 512), np.int16), (2.5, 0.7, 0.7))
    assert planes.step == pytest.approx(512 * 0.7 / 256)
    assert [g.shape for g in planes.grey] == [(256, 256), (179, 256), (179, 256)]
    with pytest.raises(ValueError, match=r"max_side must be a positive int \(pixels\). Received: 0"):
        volumes.volume_planes(np.zeros((2, 2, 2), np.int16), (1.0, 1.0, 1.0), max_side=0)  # 250 mm of slices: 179 pixels


def test_inspect_lists_the_classes_their_voxels_and_volumes(converted):
    text = volumes.inspect_volumes(str(converted))
    assert "masks: uint8, 4 classes, paired by name, 1 unmatched mask file(s)" in text
    truth = _mask_kji()
    background = 2 * truth.size - int((truth > 0).sum())
    assert f"class 0 background: train {background:,} voxels; in 2 volume(s)" in text
    assert f"class 1 liver: train {int((truth == 1).sum())} voxels; in 1 volume(s)" in text
    assert "class 3 vessel: train 3 voxels; in 1 volume(s)" in text


def _rewrite(shard, name, change):
    """Rewrites `shard` with the mask of record `name` changed by `change(mask)`: encoded by the schema,
    framed afresh (valid CRCs), so only the checks against the manifest can tell."""
    frames = []
    with open(shard, "rb") as f:
        for _, _, payload in tfrecord.iter_records(f, shard.name):
            r = VOLUME_MASK_SCHEMA.decode(payload)
            if r["filename"] == name:
                mask = r["volume/mask"].copy()
                change(mask)
                payload = VOLUME_MASK_SCHEMA.encode(VolumeRecord(
                    r[VOLUME.key], tuple(r[VOLUME_SPACING.key]), r[VOLUME_AFFINE.key], r["label"], name,
                    r["volume/modality"], mask))
            frames.append(tfrecord.frame_record(payload))
    shard.write_bytes(b"".join(frames))


def test_verify_names_a_record_whose_mask_was_altered(converted, tmp_path, capsys):
    import shutil

    from shardsmith import cli

    assert volumes.verify_volumes(str(converted)) == []
    report = tmp_path / "clean.json"
    assert cli.main(["verify", str(converted), "--report", str(report)]) == 0  # Voxels per class agree.
    out = tmp_path / "out"
    shutil.copytree(converted, out)
    shard = next(s for s, r in _records(out) if r["filename"] == "a.nii.gz")

    def liver_to_tumour(mask):
        mask[2, 5, 4] = 2

    _rewrite(shard, "a.nii.gz", liver_to_tumour)
    problems = volumes.verify_volumes(str(out))
    assert any(p.startswith("split train: class 1 liver:") and "a.nii.gz" in p for p in problems), problems
    assert any(p.startswith("split train: class 2 tumour:") and "a.nii.gz" in p for p in problems), problems

    def outside_the_table(mask):
        mask[0, 0, 0] = 7

    _rewrite(shard, "a.nii.gz", outside_the_table)
    problems = volumes.verify_volumes(str(out))
    assert any("a.nii.gz: its mask holds class ids [7]" in p for p in problems), problems
    # `shardsmith verify` (the Beam pipeline) names the record too.
    capsys.readouterr()
    assert cli.main(["verify", str(out), "--report", str(tmp_path / "altered.json")]) == 1
    found = json.loads((tmp_path / "altered.json").read_text())["problems"]
    assert any("a.nii.gz: its mask holds class ids [7], outside the manifest's 4" in p for p in found), found


def test_verify_report_compares_the_voxels_per_class_with_the_manifest(converted):
    from conversion import verification
    from readers.metadata import load_manifest

    manifest = load_manifest(str(converted))
    shards = manifest.splits["train"].shards
    truth = _mask_kji()
    good = {0: 2 * truth.size - int((truth > 0).sum()), 1: int((truth == 1).sum()), 2: 8, 3: 3}

    def checks(voxels):
        return [verification.ShardCheck("train", s.file, s.num_records, tuple(s.class_counts), (), 0,
                                         tuple(sorted(voxels.items())) if i == 0 else ()) for i, s in enumerate(shards)]

    assert verification.report(manifest, checks(good), [])["problems"] == []
    problems = verification.report(manifest, checks({**good, 1: good[1] - 1, 2: 9}), [])["problems"]
    assert [p.split(":")[1] for p in problems] == [" class 1 liver", " class 2 tumour"], problems
    assert f"held by: {shards[0].file}" in problems[0]
