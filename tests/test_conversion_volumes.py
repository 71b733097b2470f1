"""conversion.volumes: NIfTI files written by nibabel planned, converted, sharded and summarised without Beam,
each record's voxels and affine compared with nibabel's own read."""

from __future__ import annotations

import nibabel
import numpy as np
import tensorflow as tf

from conversion import volumes as cv
from schemas.volumes import VOLUME_SCHEMA


def _write(path, values, affine):
    path.parent.mkdir(parents=True, exist_ok=True)
    nibabel.save(nibabel.Nifti1Image(values, affine), path)


def test_nifti_volumes_from_plan_to_manifest(tmp_path):
    scans = tmp_path / "scans"
    rng = np.random.default_rng(3)
    _write(scans / "healthy" / "a.nii.gz", rng.integers(0, 900, (4, 5, 6)).astype(np.int16), np.diag([1.0, 2, 3, 1]))
    _write(scans / "sick" / "b.nii", rng.normal(0, 1, (3, 3, 2)).astype(np.float32), np.diag([-1.5, 1, 2, 1]))
    (scans / "stray.nii").write_bytes(b"outside any class folder")
    (scans / "sick" / "broken.nii.gz").write_bytes(b"not gzip")

    jobs, rejects, class_names = cv.plan_volumes(str(scans))
    assert class_names == ["healthy", "sick"]
    assert [(j.filename, j.split, j.label) for j in jobs] == [
        ("healthy/a.nii.gz", "train", 0), ("sick/b.nii", "train", 1), ("sick/broken.nii.gz", "train", 1)]
    assert rejects == [("stray.nii", "no_label", "outside any class folder")]

    results = [cv.convert_job(job, str(scans)) for job in jobs]
    assert [r[0] for r in results[:2]] == ["ok", "ok"]
    # Fewer bytes than a NIfTI header: a reject, not an error that stops the job.
    assert results[2][:3] == ("reject", "sick/broken.nii.gz", "not_an_image")
    shards = cv.shard_of(jobs, records_per_shard=1)
    assert shards == {"healthy/a.nii.gz": ("train", 0, 3), "sick/b.nii": ("train", 1, 3),
                      "sick/broken.nii.gz": ("train", 2, 3)}
    out = tmp_path / "out"
    counts = []
    for _, split, name, record in (r for r in results if r[0] == "ok"):
        split, index, count = shards[name]
        counts.append((split, index, count, cv.write_shard(split, index, count, [(name, record)], str(out))))
    manifest = cv.write_manifest(str(out), class_names, counts, rejects + [results[2][1:]])
    assert cv.read_manifest(str(out)) == manifest
    assert manifest["splits"] == {"train": {"records": 2, "shards": 3}}
    assert [r["path"] for r in manifest["rejects"]] == ["sick/broken.nii.gz", "stray.nii"]

    for name, shard in (("healthy/a.nii.gz", "train-00000-of-00003.tfrecord"), ("sick/b.nii", "train-00001-of-00003.tfrecord")):
        (raw,) = list(tf.data.TFRecordDataset(str(out / shard)))
        decoded = VOLUME_SCHEMA.decode(raw.numpy())
        back = nibabel.load(scans / name)
        # Stored (depth, height, width): NIfTI's (i, j, k) axes reversed.
        np.testing.assert_array_equal(decoded["volume"], np.asarray(back.dataobj).transpose(2, 1, 0))
        np.testing.assert_allclose(np.reshape(decoded["volume/affine"], (4, 4)), back.affine)
