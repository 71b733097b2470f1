"""conversion.volumes: NIfTI files written by nibabel and DICOM series written with pydicom, planned from a
listing (headers only) and written as a shard by the volume kind's writer without Beam, each record's voxels
and affine compared with nibabel's and SimpleITK's own reads; every input file accounted for once."""

from __future__ import annotations

import json
import types

import nibabel
import numpy as np
import pytest
import tensorflow as tf

from conversion import volumes as cv
from conversion.examples import kind_for, write_shard
from conversion.listing import list_input
from conversion.plan import hash_split
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


def test_content_digests_of_held_series_are_those_a_dedup_plan_gives_its_volumes(tmp_path):
    """An append computes a held series' digests without its plan: they must be the plan's, per volume."""
    scans, out = tmp_path / "scans", tmp_path / "out"
    write_series(scans / "c" / "two" / "a", count=3)
    write_series(scans / "c" / "two" / "b", count=4, orientation="sagittal")
    write_series(scans / "c" / "one", count=3)
    _write(scans / "d" / "v.nii.gz", np.arange(24, dtype=np.int16).reshape(2, 3, 4), np.eye(4))
    plan = _plan(scans, out, dedup=True)
    assert len(plan.jobs) == 4 and all(job.content for job in plan.jobs.values())
    units = {}
    for f in list_input(str(scans))[0]:
        units.setdefault(cv.series_unit(f.rel_path), []).append(f.rel_path)
    assert cv.content_digests(units, str(scans), VolumeOptions()) == \
        {name: job.content for name, job in plan.jobs.items()}
    # Without --dedup no file is read whole: no digest.
    assert not any(job.content for job in _plan(scans, out).jobs.values())


def test_a_copy_of_a_held_volume_is_a_duplicate_naming_it_and_its_version(tmp_path):
    scans, out = tmp_path / "scans", tmp_path / "out"
    write_series(scans / "c" / "new", count=3)
    held_plan = _plan(scans, out, dedup=True)
    (digest,) = [job.content for job in held_plan.jobs.values()]
    plan = _plan(scans, out, dedup=True, held=cv.HeldVolumes(frozenset(), {digest: ("c/old", 2)}))
    assert plan.jobs == {}
    assert {(p.reason, p.message) for p in plan.problems} == {
        ("duplicate", "c/new: same content as c/old, held by version 2")}
    assert plan.duplicates_of_held == {p.rel_path: "c/old" for p in plan.problems}


def test_with_append_the_csv_units_are_its_rows_and_the_held_units():
    rows = {"site/p0": ("a", None), "site/p0/late": ("b", None), "site": ("c", None), "n/x.nii.gz": ("a", None)}
    location_of, is_member = cv.csv_unit_locator(rows, held_units={"site/p0", "other/h.nii"})
    # A held folder keeps its files, even under a deeper row since; else the deepest row wins.
    assert location_of("site/p0/late/s1") == "site/p0" and location_of("site/p0/s1") == "site/p0"
    assert location_of("site/p1/s1") == "site"
    # A NIfTI file is its own unit, held or under a row; a file under neither is none.
    assert location_of("n/x.nii.gz") == "n/x.nii.gz" and location_of("site/y.nii") == "site/y.nii"
    assert location_of("other/h.nii") == "other/h.nii" and not is_member("other/s1")


def test_a_csv_that_relabels_or_resplits_a_held_unit_is_refused_naming_each():
    held = {unit: types.SimpleNamespace(label=label, split=split, version=version) for unit, label, split, version in (
        ("p0", "a", "train", 1), ("p1", "b", "validation", 2), ("p2", None, "train", 1), ("gone", "a", "train", 1))}
    cv.check_held_rows({"p0": ("a", "train"), "p1": ("b", None), "p2": ("z", "train")}, held, "l.csv")  # Unchanged.
    with pytest.raises(ValueError) as e:
        cv.check_held_rows({"p0": ("b", "train"), "p1": ("b", "test"), "p2": ("a", "train")}, held, "l.csv")
    assert str(e.value).startswith("--labels_csv l.csv gives 2 series the dataset holds another label or split: "
                                   "p0 (held by version 1 with label 'a', split 'train'; the CSV now says label "
                                   "'b', split 'train'); p1 (held by version 2 with label 'b', split 'validation'; "
                                   "the CSV now says label 'b', split 'test')")
    assert "--overwrite" in str(e.value)


def test_a_rejected_nifti_file_is_named_once_in_its_message(tmp_path):
    scans, out = tmp_path / "scans", tmp_path / "out"
    _write(scans / "c" / "four.nii", np.zeros((2, 3, 4, 2), np.int16), np.eye(4))
    _write(scans / "c" / "three.nii", np.zeros((2, 3, 4), np.int16), np.eye(4))
    plan = _plan(scans, out)
    _, rejects, _ = _write_one_shard(plan, scans, out, ["c"])
    assert [(r.rel_path, r.reason, r.message) for r in rejects] == [
        ("c/four.nii", "not_a_volume", "c/four.nii has shape (2, 3, 4, 2), not 3-D")]


def test_group_values_come_from_the_headers_planning_reads_with_or_without_dedup(tmp_path, monkeypatch):
    """--group_by dicom:PatientID: each series' value read with its headers, once per file; none in the plan files."""
    scans, out = tmp_path / "scans", tmp_path / "out"
    ratios = {"train": 0.5, "test": 0.5}
    for name, pid in (("a", "PAT-1"), ("b", "PAT-2")):
        write_series(scans / "c" / name, count=3, extra=lambda ds, k, pid=pid: setattr(ds, "PatientID", pid))
    _write(scans / "c" / "v.nii.gz", np.arange(24, dtype=np.int16).reshape(2, 3, 4), np.eye(4))
    opened = []
    monkeypatch.setattr(cv._files, "open_to_read", lambda path, real=cv._files.open_to_read: (
        opened.append(path), real(path))[1])
    for dedup in (False, True):
        opened.clear()
        plan = _plan(scans, out, dedup=dedup, group_by="dicom:PatientID", split_ratios=ratios)
        # The NIfTI file has no DICOM header: its own group, split by itself.
        assert plan.groups == {"c/a": "PAT-1", "c/b": "PAT-2"}
        assert {n: j.split for n, j in plan.jobs.items()} == {
            "c/a": hash_split(0, "group:PAT-1", ratios), "c/b": hash_split(0, "group:PAT-2", ratios),
            "c/v.nii.gz": hash_split(0, "c/v.nii.gz", ratios)}
        if not dedup:  # Each DICOM file's header opened once: the value is read with it.
            assert len(opened) == len(set(opened)) == 6
    cv.write_volume_plans(plan.jobs, str(scans), str(out))
    written = [p.read_bytes() for p in out.rglob("*.json")]
    assert len(written) == 3 and not any(b"PAT-" in data for data in written)
    # The plan files read back whole (a slice's group value is planning's alone).
    assert {cv.VolumeJob.from_json(json.loads(data)).filename for data in written} == set(plan.jobs)


def test_an_append_of_nifti_files_only_to_a_dataset_grouped_by_a_dicom_keyword_is_told_not_refused(tmp_path, caplog):
    scans, out = tmp_path / "scans", tmp_path / "out"
    _write(scans / "c" / "v.nii.gz", np.arange(24, dtype=np.int16).reshape(2, 3, 4), np.eye(4))
    with pytest.raises(ValueError, match="every volume here is a NIfTI file"):
        _plan(scans, out, group_by="dicom:PatientID")
    plan = _plan(scans, out, group_by="dicom:PatientID", held=cv.HeldVolumes())
    assert list(plan.jobs) == ["c/v.nii.gz"] and plan.groups == {}
    assert "every volume here is a NIfTI file (1)" in caplog.text
