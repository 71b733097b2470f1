"""convert --volumes --append: new DICOM series and NIfTI files as a new version, the old shards untouched.

Series written with pydicom (from pydicom's CT_small), NIfTI with nibabel; converted on Beam's
local runner; read back with the volume reader (every version, and version 1 alone) and compared
with SimpleITK and nibabel, and with a full rebuild of the grown folder (splits, labels).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import nibabel
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from helpers import convert  # noqa: E402
from test_imaging_volumes import read_sitk, write_series  # noqa: E402

import readers  # noqa: E402
import schemas  # noqa: E402
from conversion import append as _append  # noqa: E402
from conversion.lock import LOCK_FILENAME  # noqa: E402
from schemas.manifest import SHARD_FILENAME_RE  # noqa: E402

FLAGS = ("--volumes", "--split", "train=0.5,validation=0.5", "--runner", "DirectRunner",
         "--direct_num_workers", "1")


def _shard_state(out: pathlib.Path) -> dict[str, tuple[bytes, int]]:
    """Bytes and modification time of every shard and index file."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.iterdir())
            if SHARD_FILENAME_RE.match(p.name)}


def _volumes(out, split, version=None) -> dict[str, tuple]:
    """Filename -> (voxels as stored, label) of a split, read by the volume reader."""
    ds = readers.volume_dataset_from_tfrecords(out, split, dtype=None, extra_features=("filename",),
                                               version=version)
    return {e[2]["filename"].numpy().decode(): (e[0].numpy()[..., 0], int(e[1])) for e in ds}


def _all(out, manifest, version=None) -> dict[str, tuple]:
    got = {}
    for split in manifest.at_version(version).splits:
        got.update({name: (*v, split) for name, v in _volumes(out, split, version).items()})
    return got


def _nifti(path: pathlib.Path, seed: int) -> np.ndarray:
    data = np.random.default_rng(seed).integers(-500, 1500, (4, 5, 6)).astype(np.int16)
    nibabel.save(nibabel.Nifti1Image(data, np.diag([1.5, 1.0, 2.0, 1.0])), path)
    return data


@pytest.fixture
def grown(tmp_path):
    """A volume dataset of two classes, then grown by new series, a NIfTI file and a new class."""
    scans, out = tmp_path / "scans", tmp_path / "out"
    uids = {}
    for i in range(4):
        uids[f"healthy/p{i}"], _ = write_series(scans / "healthy" / f"p{i}", count=3)
    for i in range(2):
        uids[f"sick/q{i}"], _ = write_series(scans / "sick" / f"q{i}", count=4, orientation="sagittal")
    first = convert(scans, out, *FLAGS)
    before = _shard_state(out)
    for rel in ("healthy/p4", "sick/q2", "odd/r0", "odd/r1"):
        uids[rel], _ = write_series(scans / rel, count=3, orientation="oblique")
    _nifti(scans / "sick" / "v.nii.gz", seed=3)
    second = convert(scans, out, *FLAGS, "--append")
    return scans, out, first, second, before, uids


def test_new_series_are_a_new_version_and_every_old_byte_stays(grown, tmp_path):
    scans, out, first, second, before, uids = grown
    after = _shard_state(out)
    assert {name: after[name] for name in before} == before  # Bytes and modification times.
    assert [v.version for v in second.versions] == [1, 2]
    assert all("_v00002-" in f for files in second.versions[1].shards.values() for f in files)
    # Class indices never move: the new class comes at the end.
    assert first.class_names == ("healthy", "sick")
    assert second.class_names == ("healthy", "sick", "odd") and second.class_order == "first_appearance"
    assert second.versions[1].inputs["new"] == 4 * 3 + 1
    assert second.versions[1].inputs["held"] == 6 and second.versions[1].inputs["changed"] == 0

    # Version 1 reads exactly what it read before the append; the latest every volume once.
    v1 = _all(out, second, version=1)
    assert sorted(v1) == [*(f"healthy/p{i}" for i in range(4)), "sick/q0", "sick/q1"]
    latest = _all(out, second)
    assert sorted(latest) == sorted([*uids, "sick/v.nii.gz"])
    for name, (voxels, label, split) in latest.items():
        if name.endswith(".nii.gz"):
            back = nibabel.load(scans / name)
            np.testing.assert_array_equal(voxels, np.asarray(back.dataobj).transpose(2, 1, 0))
        else:
            want, _ = read_sitk(scans / name, uids[name])
            np.testing.assert_array_equal(voxels, want)
        assert second.class_names[label] == name.split("/")[0]
        if name in v1:  # The same record in version 1: its voxels, label and split.
            assert v1[name][1:] == (label, split)
            np.testing.assert_array_equal(v1[name][0], voxels)

    # A full rebuild of the grown folder puts every series in the same split, with the same class.
    rebuilt_out = tmp_path / "rebuilt"
    rebuilt = convert(scans, rebuilt_out, *FLAGS)
    again = _all(rebuilt_out, rebuilt)
    assert {n: v[2] for n, v in again.items()} == {n: v[2] for n, v in latest.items()}
    assert {n: rebuilt.class_names[v[1]] for n, v in again.items()} == \
        {n: second.class_names[v[1]] for n, v in latest.items()}
    assert {v[2] for v in latest.values()} == {"train", "validation"}

    # volumes.json and the manifest's volume section describe every version.
    summary = json.loads((out / "volumes.json").read_text())
    assert [v["version"] for v in summary["versions"]] == [1, 2]
    assert summary["class_names"] == ["healthy", "sick", "odd"]
    assert sum(e["records"] for e in summary["splits"].values()) == 11
    section = json.loads((out / schemas.MANIFEST_FILENAME).read_text())["volumes"]
    assert sum(e["volumes"] for e in section["splits"].values()) == 11
    assert sum(e["files"] for e in section["splits"].values()) == 4 * 3 + 2 * 4 + 4 * 3 + 1
    assert section["planned"] == {"dicom": 10, "nifti": 1}
    # The inventory holds series units, each with its split.
    inventory = [json.loads(line) for line in (out / _append.inputs_filename(2)).read_text().splitlines()]
    assert [e["path"] for e in inventory] == ["healthy/p4", "odd/r0", "odd/r1", "sick/q2", "sick/v.nii.gz"]
    assert all("sources" not in e for e in inventory)


def test_inspect_and_verify_know_the_versions(grown, capsys):
    from beam_jobs import verify
    from shardsmith import cli

    _, out, _, second, _, _ = grown
    capsys.readouterr()
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "versions: 2 (read one with version=N)" in text and "    v2 (" in text
    assert text.count("healthy/p4") == 1 and text.count("healthy/p0") == 1  # Every version's records, once.
    report = verify.run([str(out)])
    assert report["ok"], report["problems"]
    assert [v["version"] for v in report["versions"]] == [1, 2]
    assert cli.main(["verify", str(out)]) == 0


def test_held_series_are_not_rewritten_and_a_grown_one_is_reported_changed(grown):
    scans, out, _, second, _, uids = grown
    state = _shard_state(out)
    # Nothing new: no version.
    again = convert(scans, out, *FLAGS, "--append")
    assert again.latest_version == 2 and _shard_state(out) == state
    # A held series gains a slice, another loses its folder; one new series arrives.
    write_series(scans / "healthy" / "p0" / "late", count=1, series_uid=uids["healthy/p0"])
    for path in sorted((scans / "healthy" / "p1").iterdir()):
        path.unlink()
    (scans / "healthy" / "p1").rmdir()
    write_series(scans / "sick" / "q3", count=3)
    third = convert(scans, out, *FLAGS, "--append")
    v3 = third.versions[-1]
    assert v3.version == 3 and sum(v3.num_records.values()) == 1
    assert (v3.inputs["changed"], v3.inputs["missing_from_input"]) == (1, 1)
    report = json.loads((out / _append.REPORT_FILENAME).read_text())
    assert report["changed"] == ["healthy/p0"] and report["missing_from_input"] == ["healthy/p1"]
    names = [n for split in third.splits for n in _volumes(out, split)]
    assert names.count("healthy/p0") == 1 and names.count("sick/q3") == 1
    assert {name: s for name, s in _shard_state(out).items() if name in state} == state


def test_an_append_of_rejected_series_only_adds_no_version(grown):
    """A series rejected whole (too few slices) is held by no version: each append tries it again,
    and one that writes nothing and rejects nothing new leaves the dataset as it was."""
    scans, out, _, _, _, _ = grown
    write_series(scans / "sick" / "short", count=1)
    third = convert(scans, out, *FLAGS, "--append")
    assert third.latest_version == 3 and sum(third.versions[-1].num_records.values()) == 0
    assert [json.loads(line)["reason"] for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()] \
        == ["too_few_slices"]
    kept = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != _append.REPORT_FILENAME}
    fourth = convert(scans, out, *FLAGS, "--append")
    assert fourth.latest_version == 3
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != _append.REPORT_FILENAME} \
        == kept
    report = json.loads((out / _append.REPORT_FILENAME).read_text())
    assert report["version"] is None and report["kept_version"] == 3
    assert report["retried_rejected_again"] == [f"sick/short/{p.name}" for p in (scans / "sick" / "short").iterdir()]
    # Once it holds enough slices, it is written by the next version.
    write_series(scans / "sick" / "short" / "more", count=2, series_uid=None)
    fifth = convert(scans, out, *FLAGS, "--append")
    assert fifth.latest_version == 4 and fifth.versions[-1].inputs["retried"] == 1


def test_options_volumes_cannot_grow_with_are_refused_before_anything_is_written(grown, tmp_path):
    from beam_jobs import convert as convert_module

    scans, out, *_ = grown
    state = _shard_state(out)
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\nhealthy/p0,a\n")
    for flags in (("--labels_csv", str(csv)), ("--dedup",)):
        with pytest.raises(ValueError, match=f"does not combine with {flags[0]} yet"):
            convert_module.run(["--input_dir", str(scans), "--output_dir", str(out), *FLAGS, "--append", *flags])
    assert _shard_state(out) == state and not (out / LOCK_FILENAME).exists()


def test_an_append_killed_while_writing_leaves_version_1_and_the_next_finishes_it(tmp_path):
    import subprocess

    from test_beam_jobs_append import _kill_when

    scans, out = tmp_path / "scans", tmp_path / "out"
    for i in range(3):
        write_series(scans / "c" / f"p{i}", count=3)
    first = convert(scans, out, *FLAGS)
    before = _shard_state(out)
    for i in range(3, 40):
        write_series(scans / ("c" if i % 2 else "d") / f"p{i}", count=3)

    def append(*extra):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        return subprocess.Popen(
            [sys.executable, "-m", "beam_jobs.convert", "--input_dir", str(scans), "--output_dir", str(out),
             *FLAGS, "--num_shards", "6", "--worker_processes", "0", "--append", *extra],
            cwd=pathlib.Path(__file__).parent.parent, env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    seen = lambda: any(p.name.startswith(("train_v00002", "validation_v00002")) for p in out.iterdir())  # noqa: E731
    assert _kill_when(append(), seen), "the append ended before the kill"
    # The previous version, whole: its manifest, its shards, read by the volume reader.
    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    assert manifest.latest_version == 1 and manifest == first
    assert {n: s for n, s in _shard_state(out).items() if n in before} == before
    assert sorted(_all(out, manifest)) == ["c/p0", "c/p1", "c/p2"]
    (out / LOCK_FILENAME).unlink()  # Left by the killed process (a later append explains it).
    proc = append("--resume")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-3000:]
    grown = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    assert grown.latest_version == 2 and grown.class_names == ("c", "d")
    assert sorted(_all(out, grown)) == sorted(f"{'c' if i % 2 or i < 3 else 'd'}/p{i}" for i in range(40))
    assert {n: s for n, s in _shard_state(out).items() if n in before} == before
    named = {f for i in grown.splits.values() for s in i.shards for f in (s.file, s.index_file)}
    assert set(_shard_state(out)) == named and not (out / "_shardsmith_tmp").exists()
