"""The image-level class's row (`conversion.targets.CLASS`): its planning, counter, merge, check and table."""

from __future__ import annotations

import pytest

import schemas
from conversion import plan as _plan, targets
from conversion.listing import InputFile
from conversion.targets import classes


def _files(*paths):
    return [InputFile(p, f"/in/{p}", 10) for p in paths]


def _label(files, problems=None, **kwargs):
    args = dict(split_ratios=None, labels_csv=None, class_names=None, targets=None, folder_labels=None,
                known_classes=None)
    return targets.CLASS.plan(files, [] if problems is None else problems, **{**args, **kwargs})


def test_the_class_is_the_tables_first_row_and_the_planner_asks_it():
    assert targets.CLASS is classes.KIND and targets.CLASS.name == "class"
    # `make_plan`'s first step is the row's: the same labels and classes.
    files = _files("dog/b.png", "cat/a.png", "loose.png")
    plan = _plan.make_plan(files, [], seed=1, split_ratios=None, target_shard_bytes=1 << 20, min_shards=1)
    labelled = _label(files)
    assert plan.class_names == labelled.class_names == ("cat", "dog")
    assert {f.rel_path: plan.class_names[f.label] for f in plan.files} == {
        p: label for p, (label, _) in labelled.labels.items()}
    assert [(p.rel_path, p.reason) for p in plan.problems] == [("loose.png", "no_label")]


def test_class_folders_split_folders_and_the_csv():
    labelled = _label(_files("train/cat/a.png", "validation/dog/b.png"))
    assert labelled.labels == {"train/cat/a.png": ("cat", "train"), "validation/dog/b.png": ("dog", "validation")}
    assert labelled.split_source == "folders" and labelled.ratios is None
    problems = []
    labelled = _label(_files("a.png", "b.png"), problems, labels_csv={"a.png": ("10", None), "b.png": ("2", None),
                                                                      "gone.png": ("2", None)})
    # Integer-like names sort as numbers; a row naming no file is a found input, 'missing_file'.
    assert labelled.class_names == ("2", "10") and labelled.num_found == 3
    assert [(p.rel_path, p.reason) for p in problems] == [("gone.png", "missing_file")]
    with pytest.raises(ValueError, match="--split assigns splits by hash"):
        _label(_files("a.png"), labels_csv={"a.png": ("x", "train")}, split_ratios={"train": 1.0})


def test_an_append_keeps_the_held_classes_first():
    labelled = _label(_files("ant/a.png", "zebra/b.png", "bee/c.png"), known_classes=("zebra",))
    assert labelled.class_names == ("zebra", "ant", "bee")


def test_the_counter_counts_labels_of_the_classes_and_no_others():
    counter = targets.CLASS.counter(3)
    for label in (0, 2, 2, -1):
        counter.add(label)
    assert counter.to_json() == (1, 0, 2)
    assert targets.CLASS.merge((1, 0, 2), 5) == (1, 0, 2, 0, 0)


def test_verify_explains_a_gap_only_by_unchecked_records():
    agree = targets.CLASS.verify
    assert agree((3, 2), (3, 2), 0) and not agree((3, 1), (3, 2), 0)
    assert agree((3, 1), (3, 2), 1) and not agree((3, 1), (3, 2), 2)


def _manifest(class_names, counts, targets_section=None):
    shards = {split: schemas.SplitInfo(split, (schemas.ShardInfo(f"{split}-0", 1, 1, "0" * 64, c, "i", "0" * 64),))
              for split, c in counts.items()}
    return type("M", (), {"class_names": class_names, "splits": shards, "targets": targets_section or {}})()


def test_inspect_shows_images_per_class_and_split():
    m = _manifest(("cat", "dog"), {"train": (3, 1), "validation": (1, 0)})
    shown = targets.CLASS.describe(m, max_classes=1)
    assert shown.rows[0] == ["class", "train", "validation", "total"]
    assert shown.rows[1:] == [["cat", "3", "1", "4"]] and shown.tail == ["... and 1 more classes"]
    assert targets.CLASS.per_split(m) == {"train": (3, 1), "validation": (1, 0)}
    none = targets.CLASS.describe(_manifest((), {"train": ()}), 30)
    assert none.head == ["no image-level classes (label -1 in every record)"] and none.rows == []
    # Several labels per image: its kind's counts are the images per class; no table of -1 labels.
    multi = _manifest(("a", "b"), {"train": (0, 0)}, {"labels": {"counts": {"train": [2, 1]}}})
    assert targets.CLASS.describe(multi, 30).rows == []
    assert targets.CLASS.per_split(multi) == {"train": (2, 1)}
