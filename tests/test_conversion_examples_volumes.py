"""The volume row of the example-kind table (conversion/examples/volumes.py), through the planner
(`conversion.planning.build_plan`, no Beam): DICOM series written with pydicom from pydicom's CT_small,
planned from their headers into one example per stack, split by series folder, every file counted."""

from __future__ import annotations

from conversion.config import ConversionConfig
from conversion.listing import list_input
from conversion.planning import build_plan
from imaging import ValidationOptions
from imaging.volumes import VolumeOptions
from test_imaging_volumes import write_series


def _config(scans, out, **kwargs):
    return ConversionConfig(str(scans), str(out), validation=ValidationOptions(volumes=VolumeOptions()), **kwargs)


def test_series_are_planned_as_examples_split_by_their_folder_and_every_file_counted(tmp_path):
    from pydicom.uid import generate_uid

    scans = tmp_path / "scans"
    for i in range(6):
        write_series(scans / "c" / f"p{i}", count=3)
    # One folder, two series: two examples, always in one split.
    write_series(scans / "c" / "two" / "ct", count=4, series_uid=generate_uid())
    write_series(scans / "c" / "two" / "mr", count=3, orientation="sagittal", series_uid=generate_uid())
    write_series(scans / "c" / "p0" / "scout", count=1, orientation="coronal")  # A series of its own: too few.
    (scans / "stray.dcm").write_bytes(b"outside any class folder")
    plan = build_plan(_config(scans, tmp_path / "out", split_ratios={"train": 0.5, "validation": 0.5}))

    names = sorted(f.rel_path for f in plan.files)
    assert names == [*(f"c/p{i}" for i in range(6)), "c/two#series=0", "c/two#series=1"]
    split = {f.rel_path: f.split for f in plan.files}
    assert split["c/two#series=0"] == split["c/two#series=1"]
    assert set(split.values()) == {"train", "validation"}
    assert plan.split_source == "series" and plan.class_names == ("c",)
    # Inputs are files: 6 x 3 + 4 + 3 in volumes, the scout and the stray rejected.
    assert sorted(p.reason for p in plan.problems) == ["no_label", "too_few_slices"]
    assert sum(len(plan.volumes[n].sources) for n in names) == 25
    assert plan.num_found == len(list_input(str(scans))[0]) + len(list_input(str(scans))[1]) == 27


def test_a_volume_the_plan_refuses_rejects_each_of_its_files(tmp_path):
    scans = tmp_path / "scans"
    write_series(scans / "kept" / "p", count=3)
    write_series(scans / "other" / "q", count=4)
    plan = build_plan(_config(scans, tmp_path / "out", class_names=("kept",)))
    assert [f.rel_path for f in plan.files] == ["kept/p"]
    assert [p.reason for p in plan.problems] == ["unknown_class"] * 4
    assert all(p.rel_path.startswith("other/q/") and "its volume other/q" in p.message for p in plan.problems)
    assert plan.num_found == 7
