"""convert --volumes --append: new DICOM series and NIfTI files as a new version, the old shards untouched.

Series written with pydicom (from pydicom's CT_small), NIfTI with nibabel; converted on Beam's
local runner; read back with the volume reader (every version, and version 1 alone) and compared
with SimpleITK and nibabel, and with a full rebuild of the grown folder (splits, labels).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
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


def _records(out: pathlib.Path, manifest) -> dict[str, tuple[str, str, bytes]]:
    """Filename -> (split, class name, the record's bytes) of every record the manifest names."""
    from schemas.features import FILENAME, LABEL
    from schemas.tf_runtime import example_pb2
    from schemas.tfrecord import iter_records

    example = example_pb2().Example()
    got = {}
    for split, info in manifest.splits.items():
        for shard in info.shards:
            with open(out / shard.file, "rb") as f:
                for _, _, data in iter_records(f, shard.file):
                    example.ParseFromString(data)
                    name = example.features.feature[FILENAME.key].bytes_list.value[0].decode()
                    label = manifest.class_names[example.features.feature[LABEL.key].int64_list.value[0]]
                    got[name] = (split, label, data)
    return got


def _relabelled(data: bytes, index: int) -> bytes:
    """A volume record's bytes with its label set to `index` (the rest as written)."""
    from schemas.features import LABEL
    from schemas.tf_runtime import example_pb2

    example = example_pb2().Example()
    example.ParseFromString(data)
    example.features.feature[LABEL.key].int64_list.value[0] = index
    return example.SerializeToString(deterministic=True)


def _write_csv(path: pathlib.Path, rows: dict[str, tuple[str, str]]) -> pathlib.Path:
    path.write_text("path,label,split\n" + "".join(f"{p},{label},{split}\n" for p, (label, split) in rows.items()))
    return path


def _whole_state(out: pathlib.Path) -> dict[str, bytes]:
    """Every file under the output folder (a refused append writes none)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


CSV_FLAGS = ("--volumes", "--runner", "DirectRunner", "--direct_num_workers", "1")


@pytest.fixture(params=[(), ("--append",)], ids=["first_plain", "first_append"])
def csv_grown(tmp_path, request):
    """A --labels_csv volume dataset (rows name patients' folders and NIfTI files, no class folders),
    converted without --append (no inventory: rebuilt, its labels read from the shards) or with it
    (an inventory of labelled units), then grown by new rows and a new class."""
    scans, out = tmp_path / "scans", tmp_path / "out"
    rows = {"site1/p0": ("a", "train"), "site1/p1": ("b", "validation"), "site2/p2": ("a", "validation"),
            "site2/n0.nii.gz": ("b", "train")}
    for i, unit in enumerate(("site1/p0", "site1/p1", "site2/p2")):
        write_series(scans / unit / "ct", count=3 + i)
    _nifti(scans / "site2" / "n0.nii.gz", seed=1)
    csv = _write_csv(tmp_path / "labels.csv", rows)
    first = convert(scans, out, *CSV_FLAGS, "--labels_csv", csv, *request.param)
    before = _shard_state(out)
    # New rows: a patient of a new class sorting first ('aa'), one of a held class, a NIfTI file
    # of a new class sorting last; and a file no row names.
    rows.update({"site3/p3": ("aa", "train"), "site3/p4": ("b", "validation"), "site3/n1.nii.gz": ("c", "train")})
    write_series(scans / "site3" / "p3", count=3, orientation="oblique")
    write_series(scans / "site3" / "p4" / "mr", count=4, orientation="sagittal")
    _nifti(scans / "site3" / "n1.nii.gz", seed=2)
    write_series(scans / "loose", count=2)
    _write_csv(csv, rows)
    second = convert(scans, out, *CSV_FLAGS, "--labels_csv", csv, "--append")
    return scans, out, csv, rows, first, second, before


def test_a_labels_csv_grows_by_rows_with_the_records_a_full_conversion_gives(csv_grown, tmp_path):
    scans, out, csv, rows, first, second, before = csv_grown
    assert {name: s for name, s in _shard_state(out).items() if name in before} == before
    assert [v.version for v in second.versions] == [1, 2]
    # Class indices never move: the new classes come after the held ones.
    assert first.class_names == ("a", "b") and second.class_names[:2] == ("a", "b")
    assert set(second.class_names[2:]) == {"aa", "c"} and second.class_order == "first_appearance"
    inputs = second.versions[1].inputs
    assert (inputs["held"], inputs["new"], inputs["changed"], inputs["missing_from_input"]) == (4, 3 + 4 + 1 + 2, 0, 0)
    # The held rows are no 'missing_file'; the file no row names is 'no_label', as in a full conversion.
    rejects = [json.loads(line) for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()]
    assert {r["reason"] for r in rejects} == {"no_label"} and len(rejects) == 2

    latest = _records(out, second)
    assert {name: (split, label) for name, (split, label, _) in latest.items()} == \
        {unit: (split, label) for unit, (label, split) in rows.items()}
    # Version 1's records are the bytes it read before the append.
    assert {n: r for n, r in _records(out, second.at_version(1)).items()} == \
        {n: r for n, r in _records(out, first).items()}
    # A full conversion of the grown folder and CSV gives every record the same bytes, but for
    # the label index of the classes it orders otherwise (sorted, not first appearance).
    rebuilt_out = tmp_path / "rebuilt"
    rebuilt = convert(scans, rebuilt_out, *CSV_FLAGS, "--labels_csv", csv)
    again = _records(rebuilt_out, rebuilt)
    assert sorted(again) == sorted(latest)
    same_index = 0
    for name, (split, label, data) in latest.items():
        assert again[name][:2] == (split, label)
        index = second.class_names.index(label)
        if rebuilt.class_names.index(label) == index:
            assert again[name][2] == data, name
            same_index += 1
        else:
            assert _relabelled(again[name][2], index) == _relabelled(data, index), name
    assert second.class_names == ("a", "b", "aa", "c") and rebuilt.class_names == ("a", "aa", "b", "c")
    assert same_index == 3  # Those of 'a' and 'c' (the same index both ways), byte for byte.
    # The inventories hold each unit (a CSV row's folder, or a NIfTI file) with its label and split;
    # version 1's, which it lacked, read once from its shards.
    for version, units in ((1, ("site1/p0", "site1/p1", "site2/n0.nii.gz", "site2/p2")),
                           (2, ("site3/n1.nii.gz", "site3/p3", "site3/p4"))):
        inventory = [json.loads(line) for line in (out / _append.inputs_filename(version)).read_text().splitlines()]
        assert [e["path"] for e in inventory] == list(units)
        assert {e["path"]: (e["label"], e["split"]) for e in inventory} == {u: rows[u] for u in units}


def test_a_held_unit_the_csv_relabels_or_resplits_is_refused_before_anything_is_written(csv_grown, tmp_path):
    from beam_jobs import convert as convert_module

    scans, out, csv, rows, *_ = csv_grown
    write_series(scans / "site4" / "p5", count=3)
    state = _whole_state(out)
    for unit, now, said in (("site1/p0", ("b", "train"), "label 'b', split 'train'"),
                            ("site3/n1.nii.gz", ("c", "validation"), "label 'c', split 'validation'")):
        _write_csv(csv, {**rows, unit: now, "site4/p5": ("a", "train")})
        was = rows[unit]
        version = 1 if unit.startswith("site1") else 2
        with pytest.raises(ValueError, match=r"--labels_csv .*{}".format(re.escape(
                f"{unit} (held by version {version} with label {was[0]!r}, split {was[1]!r}; "
                f"the CSV now says {said})"))):
            convert_module.run(["--input_dir", str(scans), "--output_dir", str(out), *CSV_FLAGS,
                                "--labels_csv", str(csv), "--append"])
        assert _whole_state(out) == state  # Nor a lock, nor a temporary folder, nor an inventory.
    # The rows restored, the new patient is appended.
    _write_csv(csv, {**rows, "site4/p5": ("a", "train")})
    third = convert(scans, out, *CSV_FLAGS, "--labels_csv", csv, "--append")
    assert third.latest_version == 3 and sum(third.versions[-1].num_records.values()) == 1


def _copy(src: pathlib.Path, dst: pathlib.Path) -> None:
    """A byte-for-byte copy of a series folder or a NIfTI file."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst) if src.is_dir() else shutil.copyfile(src, dst)


@pytest.mark.parametrize("stored", [True, False], ids=["digests_stored", "digests_recomputed"])
def test_dedup_rejects_copies_of_held_and_of_new_series(tmp_path, monkeypatch, stored):
    """A new series (or NIfTI file) whose files are a copy of a held one's is a `duplicate` naming it and
    its version; a copy of another new one, as in a conversion. Held digests are read from the
    inventories (stored by an append with --dedup), else computed from the held files once."""
    from conversion import volumes

    scans, out = tmp_path / "scans", tmp_path / "out"
    for i in range(3):
        write_series(scans / "healthy" / f"p{i}", count=3)
    (scans / "sick").mkdir()
    _nifti(scans / "sick" / "v.nii.gz", seed=4)
    # Stored: a first conversion by --append --dedup records them. Else a plain one (no inventory).
    convert(scans, out, *FLAGS, *(("--append", "--dedup") if stored else ()))
    before = _shard_state(out)
    _copy(scans / "healthy" / "p0", scans / "sick" / "copy_of_p0")
    _copy(scans / "sick" / "v.nii.gz", scans / "healthy" / "w.nii.gz")
    write_series(scans / "healthy" / "p9", count=4)
    _copy(scans / "healthy" / "p9", scans / "sick" / "p9_again")
    real = volumes.content_digests
    read = []
    monkeypatch.setattr(volumes, "content_digests", lambda units, *a: read.append(sorted(units)) or real(units, *a))
    second = convert(scans, out, *FLAGS, "--append", "--dedup")
    assert read == ([] if stored else [["healthy/p0", "healthy/p1", "healthy/p2", "sick/v.nii.gz"]])
    assert {name: s for name, s in _shard_state(out).items() if name in before} == before
    v2 = second.versions[-1]
    assert sum(v2.num_records.values()) == 1  # healthy/p9 alone.
    assert (v2.inputs["duplicates_of_held"], v2.inputs["new"], v2.inputs["held"]) == (3 + 1, 4 + 4, 4)
    rejects = {json.loads(line)["path"]: json.loads(line) for line in
               (out / schemas.REJECTS_FILENAME).read_text().splitlines()}
    assert {r["reason"] for r in rejects.values()} == {"duplicate"} and len(rejects) == 3 + 1 + 4
    messages = {r["message"] for r in rejects.values()}
    assert messages == {"sick/copy_of_p0: same content as healthy/p0, held by version 1",
                        "healthy/w.nii.gz: same content as sick/v.nii.gz, held by version 1",
                        "sick/p9_again: same content as healthy/p9"}
    report = json.loads((out / _append.REPORT_FILENAME).read_text())
    assert report["duplicates_of_held"] == {
        **{f"sick/copy_of_p0/{p.name}": "healthy/p0" for p in (scans / "sick" / "copy_of_p0").iterdir()},
        "healthy/w.nii.gz": "sick/v.nii.gz"}
    names = [n for split in second.splits for n in _volumes(out, split)]
    assert sorted(names) == ["healthy/p0", "healthy/p1", "healthy/p2", "healthy/p9", "sick/v.nii.gz"]
    # Every version's inventory holds its series' content digests now (version 1's written once).
    for version in (1, 2):
        entries = [json.loads(line) for line in (out / _append.inputs_filename(version)).read_text().splitlines()]
        assert all(set(e["contents"]) == {e["path"]} for e in entries), entries
    # The next append reads them back: no held file is read again, a copy of p9 (version 2) is found.
    monkeypatch.setattr(volumes, "content_digests", lambda *a: pytest.fail("a held series was read again"))
    _copy(scans / "healthy" / "p9", scans / "sick" / "p9_later")
    write_series(scans / "sick" / "q0", count=3)
    third = convert(scans, out, *FLAGS, "--append", "--dedup")
    # The copies version 2 rejected are tried again (held by no version), counted apart.
    v3 = third.versions[-1]
    assert (v3.inputs["duplicates_of_held"], v3.inputs["retried"], v3.inputs["retried_rejected_again"]) == (4, 8, 8)
    assert sum(v3.num_records.values()) == 1
    assert "sick/p9_later: same content as healthy/p9, held by version 2" in {
        json.loads(line)["message"] for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()}


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
