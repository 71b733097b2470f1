"""conversion.listing: every file under the input root, sorted, and every input that is not one said why."""

from __future__ import annotations

import os

import pytest
from helpers import make_class_tree

from conversion.listing import InputFile, Problem, display_path, is_local, list_input


def test_every_file_is_listed_sorted_by_its_bytes_with_its_size(tmp_path):
    make_class_tree(tmp_path, classes=("b", "a", "B"), per_class=2)
    (tmp_path / "a" / "deep" / "er").mkdir(parents=True)
    (tmp_path / "a" / "deep" / "er" / "x.png").write_bytes(b"12345")
    files, problems = list_input(str(tmp_path))
    walked = sorted((p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()),
                    key=os.fsencode)
    assert [f.rel_path for f in files] == walked and problems == []
    assert InputFile("a/deep/er/x.png", str(tmp_path / "a" / "deep" / "er" / "x.png"), 5) in files
    assert all(f.size == os.path.getsize(f.path) for f in files)


def test_hidden_files_broken_links_and_loops_are_problems_not_silence(tmp_path):
    images = make_class_tree(tmp_path, classes=("a",), per_class=1)
    (tmp_path / "a" / ".DS_Store").write_bytes(b"x")
    (tmp_path / "a" / "Thumbs.db").write_bytes(b"x")
    os.symlink(tmp_path / "gone.jpg", tmp_path / "a" / "dangling.jpg")
    os.symlink(tmp_path / "a", tmp_path / "a" / "again")  # A folder already listed: a cycle.
    os.symlink("self", tmp_path / "a" / "self")  # Points at itself: ELOOP.
    files, problems = list_input(str(tmp_path))
    assert [f.rel_path for f in files] == list(images)
    reasons = {p.rel_path: p.reason for p in problems}
    assert reasons == {"a/.DS_Store": "hidden_file", "a/Thumbs.db": "hidden_file",
                       "a/dangling.jpg": "broken_symlink", "a/again": "symlink_loop",
                       "a/self": "symlink_loop"}
    assert [p.rel_path for p in problems] == sorted(reasons, key=os.fsencode)
    assert Problem("a/dangling.jpg", "broken_symlink", f"link to missing {str(tmp_path / 'gone.jpg')!r}") in problems


def test_a_missing_root_or_a_file_is_one_sentence_naming_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="--input_dir .* does not exist or is not a folder"):
        list_input(str(tmp_path / "nope"))
    (tmp_path / "file.jpg").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="--input_dir"):
        list_input(str(tmp_path / "file.jpg"))


def test_a_name_that_is_not_utf8_is_kept_and_printable(tmp_path):
    name = os.fsdecode(b"caf\xe9.jpg")  # Latin-1 bytes, as an old camera or zip tool writes.
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / name).write_bytes(b"x")
    files, _ = list_input(str(tmp_path))
    assert [os.fsencode(f.rel_path) for f in files] == [b"a/caf\xe9.jpg"]
    assert display_path(files[0].rel_path) == "a/caf\\xe9.jpg"
    assert display_path("a/café.jpg") == "a/café.jpg"


def test_file_urls_are_local_and_listed_alike(tmp_path):
    make_class_tree(tmp_path, classes=("a",), per_class=2)
    assert is_local(str(tmp_path)) and is_local("file://" + str(tmp_path)) and not is_local("gs://bucket/x")
    assert list_input("file://" + str(tmp_path)) == list_input(str(tmp_path))


def test_a_link_to_a_class_folder_never_takes_its_files_away(tmp_path):
    """A link inside one class to another class's folder (`cat/also_dogs -> ../dog`) is walked
    before `dog` in name order; `dog`'s images stay listed, and labelled, as `dog`."""
    make_class_tree(tmp_path, classes=("cat", "dog"), per_class=2)
    os.symlink("../dog", tmp_path / "cat" / "also_dogs")
    os.symlink("..", tmp_path / "dog" / "up")
    files, problems = list_input(str(tmp_path))
    assert sorted({f.rel_path.split("/")[0] for f in files}) == ["cat", "dog"]
    assert not any("also_dogs" in f.rel_path for f in files)
    assert [(p.rel_path, p.reason, p.message) for p in problems] == [
        ("cat/also_dogs", "symlink_loop", "link to a folder already listed, as 'dog'"),
        ("dog/up", "symlink_loop", "link to a folder above it (a cycle)")]
