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
    def number(n):
        return lambda ds, k: setattr(ds, "SeriesNumber", n)

    write_series(scans / "c" / "two" / "ct", count=4, series_uid=generate_uid(), extra=number(3))
    write_series(scans / "c" / "two" / "mr", count=3, orientation="sagittal", series_uid=generate_uid(),
                 extra=number(12))
    # Two series with one SeriesNumber (CT_small's 1): named by their stacks' places instead.
    write_series(scans / "c" / "same" / "a", count=2)
    write_series(scans / "c" / "same" / "b", count=3)
    # One series in two orientations (each a stack): its stacks numbered.
    uid, _ = write_series(scans / "c" / "tilt", count=3, extra=number(4))
    write_series(scans / "c" / "tilt" / "t", count=2, orientation="oblique", series_uid=uid, extra=number(4))
    write_series(scans / "c" / "p0" / "scout", count=1, orientation="coronal")  # A series of its own: too few.
    (scans / "stray.dcm").write_bytes(b"outside any class folder")
    plan = build_plan(_config(scans, tmp_path / "out", split_ratios={"train": 0.5, "validation": 0.5}))

    names = sorted(f.rel_path for f in plan.files)
    assert names == [*(f"c/p{i}" for i in range(6)), "c/same#stack=0", "c/same#stack=1",
                     "c/tilt#stack=0", "c/tilt#stack=1", "c/two#series=12", "c/two#series=3"]
    assert [len(plan.volumes[f"c/tilt#stack={k}"].sources) for k in (0, 1)] == [3, 2]  # most slices first
    assert len(plan.volumes["c/two#series=3"].sources) == 4
    split = {f.rel_path: f.split for f in plan.files}
    assert split["c/two#series=3"] == split["c/two#series=12"]
    assert set(split.values()) == {"train", "validation"}
    assert plan.split_source == "series" and plan.class_names == ("c",)
    # Inputs are files: 6 x 3 + 4 + 3 + 5 + 5 in volumes, the scout and the stray rejected.
    assert sorted(p.reason for p in plan.problems) == ["no_label", "too_few_slices"]
    assert sum(len(plan.volumes[n].sources) for n in names) == 35
    assert plan.num_found == len(list_input(str(scans))[0]) + len(list_input(str(scans))[1]) == 37


def test_a_volume_the_plan_refuses_rejects_each_of_its_files(tmp_path):
    scans = tmp_path / "scans"
    write_series(scans / "kept" / "p", count=3)
    write_series(scans / "other" / "q", count=4)
    plan = build_plan(_config(scans, tmp_path / "out", class_names=("kept",)))
    assert [f.rel_path for f in plan.files] == ["kept/p"]
    assert [p.reason for p in plan.problems] == ["unknown_class"] * 4
    assert all(p.rel_path.startswith("other/q/") and "its volume other/q" in p.message for p in plan.problems)
    assert plan.num_found == 7
