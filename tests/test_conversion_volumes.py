"""conversion.volumes: NIfTI files written by nibabel and DICOM series written with pydicom, planned from a
listing (headers only) and written as a shard by the volume kind's writer without Beam, each record's voxels
and affine compared with nibabel's and SimpleITK's own reads; every input file accounted for once."""

from __future__ import annotations

import json

import nibabel
import numpy as np
import tensorflow as tf

from conversion import volumes as cv
from conversion.examples import kind_for, write_shard
from conversion.listing import list_input
from conversion.shard_writer import ShardFile, ShardJob
from imaging import ValidationOptions
from imaging.volumes import VolumeOptions
from schemas.volumes import VOLUME_SCHEMA
from test_imaging_volumes import read_sitk, write_series

_VALIDATION = ValidationOptions(volumes=VolumeOptions())


def _write(path, values, affine):
    path.parent.mkdir(parents=True, exist_ok=True)
    nibabel.save(nibabel.Nifti1Image(values, affine), path)


def _plan(scans, out, **kwargs):
    files, problems = list_input(str(scans))
    return cv.plan_volumes(files, problems, str(scans), str(out), options=VolumeOptions(), **kwargs)


def _write_one_shard(plan, scans, out, class_names):
    """The planned volumes as one shard, by the kind's writer (as a worker process calls it)."""
    cv.write_volume_plans(plan.jobs, str(scans), str(out))
    files = tuple(ShardFile(f.rel_path, f.path, f.size, class_names.index(plan.jobs[f.rel_path].label))
                  for f in plan.files)
    job = ShardJob(output_dir=str(out), split="train", index=0, num_shards=1, name="train-00000-of-00001.tfrecord",
                   files=files, num_classes=len(class_names), validation=_VALIDATION, threads=0)
    return write_shard(job)


def test_the_volume_kind_is_a_row_of_the_table():
    assert kind_for(_VALIDATION).name == "volume"
    assert kind_for(ValidationOptions()).name == "image"
    assert kind_for(_VALIDATION).record_schema(_VALIDATION, ()) == VOLUME_SCHEMA


def test_nifti_volumes_from_plan_to_shard(tmp_path):
    scans, out = tmp_path / "scans", tmp_path / "out"
    rng = np.random.default_rng(3)
    _write(scans / "healthy" / "a.nii.gz", rng.integers(0, 900, (4, 5, 6)).astype(np.int16), np.diag([1.0, 2, 3, 1]))
    _write(scans / "sick" / "b.nii", rng.normal(0, 1, (3, 3, 2)).astype(np.float32), np.diag([-1.5, 1, 2, 1]))
    (scans / "stray.nii").write_bytes(b"outside any class folder")
    (scans / "sick" / "broken.nii.gz").write_bytes(b"not gzip")

    plan = _plan(scans, out)
    assert plan.class_names == ("healthy", "sick")
    assert [(j.filename, j.split, j.label) for j in plan.jobs.values()] == [
        ("healthy/a.nii.gz", "train", "healthy"), ("sick/b.nii", "train", "sick"),
        ("sick/broken.nii.gz", "train", "sick")]
    assert [(p.rel_path, p.reason) for p in plan.problems] == [("stray.nii", "no_label")]

    result, rejects, _ = _write_one_shard(plan, scans, out, list(plan.class_names))
    # Fewer bytes than a NIfTI header: a reject of its file, not an error that stops the shard.
    assert [(r.rel_path, r.reason) for r in rejects] == [("sick/broken.nii.gz", "not_an_image")]
    assert (result.num_records, result.num_sources, result.class_counts) == (2, 2, (1, 1))
    records = {}
    for raw in tf.data.TFRecordDataset(str(out / result.file)):
        decoded = VOLUME_SCHEMA.decode(raw.numpy())
        records[decoded["filename"]] = decoded
    assert sorted(records) == ["healthy/a.nii.gz", "sick/b.nii"]
    for name, decoded in records.items():
        back = nibabel.load(scans / name)
        # Stored (depth, height, width): NIfTI's (i, j, k) axes reversed.
        np.testing.assert_array_equal(decoded["volume"], np.asarray(back.dataobj).transpose(2, 1, 0))
        np.testing.assert_allclose(np.reshape(decoded["volume/affine"], (4, 4)), back.affine)


def test_every_dicom_file_is_counted_once_in_a_volume_or_a_reject(tmp_path):
    """A series with a scout and a duplicated slice, planned from headers: the files reconcile."""
    import shutil

    scans, out = tmp_path / "scans", tmp_path / "out"
    uid, paths = write_series(scans / "c" / "p", count=5, orientation="oblique")
    write_series(scans / "c" / "p" / "scout", count=1, orientation="coronal", series_uid=uid)
    want, want_affine = read_sitk(scans / "c" / "p", uid)  # SimpleITK's read, before the copy.
    shutil.copy(paths[2], paths[2].parent / "copy_of_a_slice")
    listed = len(list_input(str(scans))[0])

    plan = _plan(scans, out)
    (job,) = plan.jobs.values()
    assert job.filename == "c/p" and len(job.sources) == 5
    assert sorted(p.reason for p in plan.problems) == ["duplicate", "too_few_slices"]
    assert len(job.sources) + len(plan.problems) == listed == 7
    result, rejects, notes = _write_one_shard(plan, scans, out, ["c"])
    assert (result.num_records, result.num_sources, rejects) == (1, 5, [])
    # The dropped copy is noted on the volume it was left out of.
    assert [n[0] for n in notes] == ["c/p"] and any("duplicate" in n for n in notes[0][3]["notes"])
    (raw,) = list(tf.data.TFRecordDataset(str(out / result.file)))
    decoded = VOLUME_SCHEMA.decode(raw.numpy())
    np.testing.assert_array_equal(decoded["volume"], want)
    np.testing.assert_allclose(np.reshape(decoded["volume/affine"], (4, 4)), want_affine, atol=1e-4)
    section = cv.manifest_section(plan.jobs, type("P", (), {"files": plan.files})(), VolumeOptions())
    assert json.loads(json.dumps(section))["volumes"]["files"] == 5
