"""Labels, splits and shards of every file (conversion/plan.py) and the listing."""

from __future__ import annotations

import os

import pytest
from helpers import write

from conversion.listing import InputFile, list_input
from conversion.plan import make_plan, read_labels_csv


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


def _random_rel_paths(rng, n):
    """Relative paths like a real listing's, with names that are not UTF-8 (surrogate escapes)."""
    pieces = ["a", "Z", "é", "猫", "🐈", " ", "-", ".", "_", "'", '"', "\\", "\t", "0", "9"]
    folders = ["cat", "dog", "b" + os.fsdecode(b"\xff")]
    paths = set()
    while len(paths) < n:
        name = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 9)))
        if rng.random() < 0.3:
            name = os.fsdecode(os.fsencode(name) + bytes([rng.randrange(0x80, 0x100)]))
        paths.add(f"{rng.choice(folders)}/{name}.jpg")
    return sorted(paths, key=os.fsencode)


def test_pre_seeded_hashes_equal_a_fresh_blake2b_of_the_documented_input():
    import hashlib
    import random

    from conversion.plan import _fs_bytes, _hasher, stable_hash

    rng = random.Random(7)
    for path in _random_rel_paths(rng, 300) + ["", "x"]:
        seed = rng.randrange(-5, 10**12)
        for purpose, parts in (("split", ()), ("order", ("train",)), ("order", ("é", os.fsdecode(b"\xfe")))):
            # stable_hash's contract: blake2b-64 of 'seed\0purpose' then '\0' + each part's bytes.
            data = f"{seed}\0{purpose}".encode() + b"".join(b"\0" + os.fsencode(p) for p in (*parts, path))
            expected = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
            assert _fs_bytes(path) == os.fsencode(path)
            assert _hasher(seed, purpose, *parts)(_fs_bytes(path)) == expected
            assert stable_hash(seed, purpose, *parts, path) == expected


def _straightforward_plan(files, seed, ratios, groups, num_shards, class_names):
    """make_plan's files computed the plain way: a hash per decision, one sort of PlannedFiles."""
    from conversion.plan import PlannedFile, _shard_count, stable_hash

    assigned = []
    for f in files:
        label = class_names.index(f.rel_path.split("/")[0])
        key = "group:" + groups[f.rel_path] if f.rel_path in groups else f.rel_path
        u, acc, split = stable_hash(seed, "split", key) / 2.0**64, 0.0, None
        for name, ratio in ratios.items():
            acc += ratio
            if u < acc:
                split = name
                break
        else:
            split = [n for n, r in ratios.items() if r > 0][-1]
        assigned.append((f, label, split))
    planned = []
    for split in ratios:
        members = sorted((stable_hash(seed, "order", split, f.rel_path), f.rel_path, f, label)
                         for f, label, s in assigned if s == split)
        n = _shard_count(len(members), sum(m[2].size for m in members), num_shards, 1 << 27, 4)
        planned += [PlannedFile(split, rank * n // len(members), order, f.rel_path, f.path, f.size, label, n)
                    for rank, (order, _, f, label) in enumerate(members)]
    return sorted(planned)


@pytest.mark.parametrize("ratios", [
    {"train": 1.0},
    {"test": 0.0, "train": 1.0, "validation": 0.0},
    {"train": 0.5, "test": 0.5},
    {"train": 0.7, "validation": 0.2, "test": 0.1},
])
def test_plan_equals_the_straightforward_computation(ratios):
    import random

    rng = random.Random(len(ratios))
    paths = _random_rel_paths(rng, 400)
    files = [InputFile(p, "/in/" + p, rng.randrange(1, 10**6)) for p in paths]
    groups = {p: str(rng.randrange(40)) for p in paths if rng.random() < 0.3}
    class_names = sorted({p.split("/")[0] for p in paths})
    for seed, num_shards in ((0, None), (12345, 3)):
        plan = make_plan(files, [], seed=seed, split_ratios=ratios, groups=groups, num_shards=num_shards,
                         target_shard_bytes=1 << 27, min_shards=4)
        assert list(plan.files) == _straightforward_plan(files, seed, ratios, groups, num_shards, class_names)
        assert [vars(f) for f in plan.files] == [vars(f) for f in sorted(plan.files)]


def test_a_single_split_with_a_share_is_what_the_hash_gives_every_file():
    from conversion.plan import _hash_split, _split_by_hash

    for ratios in ({"train": 1.0}, {"a": 0.0, "train": 1.0, "b": 0.0}, {"train": 0.9999995}, {"a": 0.0}):
        split_of = _split_by_hash(0, ratios)
        for hash_value in (0, 1, 2**63, 2**64 - 2**11, 2**64 - 1):
            assert split_of(b"any") == _hash_split(hash_value, ratios)


def test_sorting_by_the_hash_alone_sorts_as_the_tuples_do_even_when_hashes_are_equal():
    import random

    from conversion.plan import _sorted_by_order

    rng = random.Random(3)
    paths = _random_rel_paths(rng, 200)
    for hash_range in (2**64, 5):  # distinct hashes; then many equal ones, ordered by path
        members = [(rng.randrange(hash_range), p, object(), 0) for p in paths]
        assert _sorted_by_order(list(members)) == sorted(members)


def test_shard_plan_files_are_json_dumps_of_each_shards_rows(tmp_path):
    import dataclasses
    import json
    import random

    from conversion import shard_plans
    from conversion.plan import PlannedFile

    rng = random.Random(5)
    paths = _random_rel_paths(rng, 300) + ['q"uote/\\back\u2028\x00\x7f.jpg']
    files = [PlannedFile(rng.choice(["train", "test"]), rng.randrange(3), rng.randrange(2**64), p,
                         "/in/" + p, rng.randrange(10**12), rng.randrange(3), 3,
                         rng.choice([None, paths[0]]))
             for p in paths]  # Not in shard order: each shard keeps the files' order.
    odd = [dataclasses.replace(files[0], label=True), dataclasses.replace(files[1], size=2.5),
           dataclasses.replace(files[2], path=None, num_shards=4)]

    def expected(fs):
        by_shard = {}
        for f in fs:
            by_shard.setdefault((f.split, f.shard, f.num_shards), []).append(dataclasses.astuple(f))
        return [json.dumps(rows, ensure_ascii=True).encode() for _, rows in sorted(by_shard.items())]

    for case, fs in (("plain", files), ("odd", files + odd)):
        out = tmp_path / case
        written = shard_plans.write_shard_plans(fs, str(out))
        assert [open(p, "rb").read() for p in written] == expected(fs)
        loaded = [f for p in written for f in shard_plans.load_shard_plan(p)[1]]
        assert sorted(map(repr, loaded)) == sorted(map(repr, fs))


def test_planning_pauses_the_garbage_collector_and_restores_it():
    import gc

    from conversion.planning import paused_gc

    assert gc.isenabled()
    with pytest.raises(KeyError), paused_gc():
        assert not gc.isenabled()
        raise KeyError("x")
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_of_two_ways_into_one_folder_the_folder_itself_is_listed(tmp_path):
    root = tmp_path / "in"
    for name in ("b.jpg", "a.jpg"):
        write(root / "zeta" / name, b"x")
    write(root / "cat" / "c.jpg", b"x")
    os.symlink(root / "zeta", root / "alpha")  # A link that sorts before its target.
    os.symlink(root / "cat", root / "zeta" / "to_cat")
    write(tmp_path / "outside" / "o.jpg", b"x")
    os.symlink(tmp_path / "outside", root / "zeta" / "two")  # Two links into a folder outside
    os.symlink(tmp_path / "outside", root / "zeta" / "one")  # the input: the first in name order.
    files, problems = list_input(str(root))
    assert [f.rel_path for f in files] == ["cat/c.jpg", "zeta/a.jpg", "zeta/b.jpg", "zeta/one/o.jpg"]
    assert [(p.rel_path, p.reason) for p in problems] == [
        ("alpha", "symlink_loop"), ("zeta/to_cat", "symlink_loop"), ("zeta/two", "symlink_loop")]
    assert problems[0].message == "link to a folder already listed, as 'zeta'"
