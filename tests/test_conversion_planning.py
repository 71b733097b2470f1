"""The driver's planning (conversion/planning.py): the listing, the labels CSV and groups, to a plan."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from helpers import encode, pixels, write  # noqa: E402

from conversion import listing  # noqa: E402
from conversion.config import ConversionConfig  # noqa: E402
from conversion.planning import build_plan, group_keys  # noqa: E402


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    root = tmp_path_factory.mktemp("planning") / "in"
    for i, (label, patient) in enumerate([("a", "p1"), ("a", "p2"), ("b", "p1"), ("b", "p3")]):
        write(root / label / f"{patient}_{i}.png", encode(pixels(i), "PNG"))
    return root


def test_every_listed_file_is_planned_once_in_a_split_and_a_shard(scans, tmp_path):
    plan = build_plan(ConversionConfig(str(scans), str(tmp_path / "out")))
    assert sorted(f.rel_path for f in plan.files) == ["a/p1_0.png", "a/p2_1.png", "b/p1_2.png", "b/p3_3.png"]
    assert plan.class_names == ("a", "b") and plan.num_found == 4 and plan.problems == ()
    assert all(0 <= f.shard < plan.shard_counts[f.split] for f in plan.files)


def test_a_regex_group_keeps_each_patient_in_one_split(scans, tmp_path):
    files, _ = listing.list_input(str(scans))
    assert group_keys(files, r"regex:/(p\d)_") == {
        "a/p1_0.png": "p1", "a/p2_1.png": "p2", "b/p1_2.png": "p1", "b/p3_3.png": "p3"}
    plan = build_plan(ConversionConfig(str(scans), str(tmp_path / "out"), group_by=r"regex:/(p\d)_",
                                       split_ratios={"train": 0.5, "validation": 0.5}, seed=3))
    split_of = {f.rel_path: f.split for f in plan.files}
    assert split_of["a/p1_0.png"] == split_of["b/p1_2.png"]
    assert sum(len(ids) for ids in plan.groups.values()) == 3


def test_a_missing_input_or_labels_csv_is_named(tmp_path, scans):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="contains no files"):
        build_plan(ConversionConfig(str(tmp_path / "empty"), str(tmp_path / "out")))
    with pytest.raises(FileNotFoundError, match="--labels_csv .* does not exist"):
        build_plan(ConversionConfig(str(scans), str(tmp_path / "out"), labels_csv=str(tmp_path / "none.csv")))


def test_a_folder_whose_every_file_is_refused_while_planning_is_told_why(tmp_path):
    # Under --volumes a single-slice series (pydicom's CT_small.dcm) and a report are refused
    # while planning: they lie in class folders, and the error says what refused them.
    import shutil

    from pydicom.data import get_testdata_file

    from imaging import ValidationOptions
    from imaging.volumes import VolumeOptions

    for series, name in (("s1", "CT_small.dcm"), ("s2", "rtplan.dcm")):
        (tmp_path / "in" / "a" / series).mkdir(parents=True)
        shutil.copy(get_testdata_file(name), tmp_path / "in" / "a" / series / name)
    config = ConversionConfig(str(tmp_path / "in"), str(tmp_path / "out"),
                              validation=ValidationOptions(volumes=VolumeOptions()))
    with pytest.raises(ValueError) as e:
        build_plan(config)
    message = str(e.value)
    assert "class folder" not in message
    assert "2 files found" in message and "no_pixel_data 1, too_few_slices 1" in message
    assert "e.g. a/s1/CT_small.dcm: 1 slice(s)" in message


@pytest.mark.parametrize("layout", ["classes", "splits"])
def test_an_empty_class_folder_is_said_with_the_class_names_that_keep_it(tmp_path, caplog, layout):
    # keras's image_dataset_from_directory counts an empty class folder; here it is no class.
    root = tmp_path / "in"
    top = root / "train" if layout == "splits" else root
    write(top / "cat" / "a.png", encode(pixels(0), "PNG"))
    write(top / "dog" / "b.png", encode(pixels(1), "PNG"))
    (top / "aardvark").mkdir()
    (top / ".cache").mkdir()  # Hidden: never a class.
    (top / "zebra").mkdir()
    write(top / "zebra" / ".DS_Store", b"\0")  # Only a skipped file: no image either.
    with caplog.at_level("WARNING", logger="shardsmith"):
        plan = build_plan(ConversionConfig(input_dir=str(root), output_dir=str(tmp_path / "out")))
    assert plan.class_names == ("cat", "dog")
    said = [r.getMessage() for r in caplog.records if "Class folders without a file" in r.getMessage()]
    assert said == ["Class folders without a file under --input_dir: 'aardvark', 'zebra'. They are no classes "
                    "here, where keras's image_dataset_from_directory would count them among its classes (so "
                    "labels could differ from its); give --class_names aardvark,cat,dog,zebra to keep an index "
                    "for them."]
    caplog.clear()
    with caplog.at_level("WARNING", logger="shardsmith"):
        plan = build_plan(ConversionConfig(input_dir=str(root), output_dir=str(tmp_path / "out"),
                                           class_names=("aardvark", "cat", "dog", "zebra")))
    assert plan.class_names == ("aardvark", "cat", "dog", "zebra")
    assert not [r for r in caplog.records if "Class folders without a file" in r.getMessage()]
