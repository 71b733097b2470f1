"""Labels, splits and shards of every file (beam_jobs/_plan.py) and the listing."""

from __future__ import annotations

import os

import pytest
from helpers import write

from beam_jobs._listing import InputFile, list_input
from beam_jobs._plan import make_plan, read_labels_csv


def _files(paths, size=1000):
    return [InputFile(p, "/in/" + p, size) for p in sorted(paths)]


def _plan(paths, **kw):
    kw.setdefault("seed", 0)
    kw.setdefault("split_ratios", None)
    kw.setdefault("target_shard_bytes", 1 << 27)
    kw.setdefault("min_shards", 4)
    return make_plan(_files(paths), [], **kw)


def test_adding_files_never_moves_existing_files_between_splits():
    ratios = {"train": 0.8, "validation": 0.1, "test": 0.1}
    before = {f.rel_path: f.split for f in _plan([f"c/{i}.jpg" for i in range(300)], split_ratios=ratios).files}
    after = {f.rel_path: f.split for f in _plan([f"c/{i}.jpg" for i in range(600)], split_ratios=ratios).files}
    assert all(after[p] == s for p, s in before.items())
    share = sum(s == "train" for s in after.values()) / len(after)
    assert 0.74 < share < 0.86
    assert {"train", "validation", "test"} == set(after.values())


def test_seed_changes_the_split():
    ratios = {"train": 0.5, "test": 0.5}
    paths = [f"c/{i}.jpg" for i in range(100)]
    a = {f.rel_path: f.split for f in _plan(paths, split_ratios=ratios, seed=1).files}
    b = {f.rel_path: f.split for f in _plan(paths, split_ratios=ratios, seed=2).files}
    assert a != b


def test_shard_counts_follow_size_with_a_floor_and_cap():
    paths = [f"c/{i}.jpg" for i in range(10)]
    assert _plan(paths).shard_counts == {"train": 4}  # floor of min_shards
    assert _plan(paths[:2]).shard_counts == {"train": 2}  # never more shards than images
    assert _plan(paths, target_shard_bytes=1000, min_shards=1).shard_counts == {"train": 10}
    assert _plan(paths, target_shard_bytes=2500, min_shards=1).shard_counts == {"train": 4}
    assert _plan(paths, num_shards=3).shard_counts == {"train": 3}
    plan = _plan(paths, num_shards=3)
    sizes = [sum(f.shard == i for f in plan.files) for i in range(3)]
    assert sorted(sizes) == [3, 3, 4]


def test_integer_class_names_sort_as_numbers():
    plan = _plan([f"{c}/a.jpg" for c in ("10", "2", "1")])
    assert plan.class_names == ("1", "2", "10")


def test_mixed_split_and_class_folders_are_refused():
    with pytest.raises(ValueError, match=r"mixes split folders \['train'\] with class folders \['cat'\]"):
        _plan(["train/cat/a.jpg", "cat/b.jpg"])


def test_split_flag_with_split_folders_is_refused():
    with pytest.raises(ValueError, match="already has split folders"):
        _plan(["train/cat/a.jpg"], split_ratios={"train": 1.0})


def test_labels_csv_errors_name_the_row():
    with pytest.raises(ValueError, match="columns path,label"):
        read_labels_csv("file,class\na.jpg,x\n", "l.csv")
    with pytest.raises(ValueError, match="row 3: split must be one of"):
        read_labels_csv("path,label,split\na.jpg,x,train\nb.jpg,y,holdout\n", "l.csv")
    with pytest.raises(ValueError, match="row 3: 'a.jpg' is listed twice"):
        read_labels_csv("path,label\na.jpg,x\na.jpg,y\n", "l.csv")
    assert read_labels_csv("path,label\n.\\sub\\a.jpg,x\n", "l.csv") == {"sub/a.jpg": ("x", None)}


def test_listing_reports_links_loops_hidden_and_odd_names(tmp_path):
    root = tmp_path / "in"
    write(root / "cat" / "a.jpg", b"x")
    write(root / "cat" / "sp ace é.jpg", b"x")
    write(root / ".hidden_dir" / "b.jpg", b"x")
    write(root / "cat" / "Thumbs.db", b"x")
    (root / "cat" / "dir.jpg").mkdir()
    write(root / "cat" / "dir.jpg" / "inner.png", b"x")
    os.symlink(root / "cat" / "a.jpg", root / "cat" / "link.jpg")
    os.symlink(root / "nowhere.jpg", root / "cat" / "dangling.jpg")
    os.symlink(root / "cat" / "self1.jpg", root / "cat" / "self2.jpg")
    os.symlink(root / "cat" / "self2.jpg", root / "cat" / "self1.jpg")
    os.symlink(root / "cat", root / "cat" / "loop")
    raw_name = os.fsencode(str(root / "cat")) + b"/bad\xff.jpg"
    with open(raw_name, "wb") as f:
        f.write(b"x")
    files, problems = list_input(str(root))
    assert [f.rel_path for f in files] == [
        "cat/a.jpg", os.fsdecode(b"cat/bad\xff.jpg"), "cat/dir.jpg/inner.png", "cat/link.jpg",
        "cat/sp ace é.jpg",
    ]
    assert {(p.rel_path, p.reason) for p in problems} == {
        (".hidden_dir", "hidden_file"),
        ("cat/Thumbs.db", "hidden_file"),
        ("cat/dangling.jpg", "broken_symlink"),
        ("cat/self1.jpg", "symlink_loop"),
        ("cat/self2.jpg", "symlink_loop"),
        ("cat/loop", "symlink_loop"),
    }
