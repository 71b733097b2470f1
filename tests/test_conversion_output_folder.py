"""conversion.output_folder: the output folder before a run, stale shards, and the summary after."""

from __future__ import annotations

import pytest
from helpers import convert, make_class_tree

import schemas
from conversion.files import TMP_DIRNAME
from conversion.output_folder import (
    check_output, is_finished, prepare_output, read_manifest, remove_dataset_files, summarize,
)


def test_a_missing_or_empty_folder_is_taken_and_made(tmp_path):
    out = tmp_path / "new" / "dataset"
    check_output(str(out), overwrite=False, resume=False)
    prepare_output(str(out), overwrite=False, resume=False)
    assert out.is_dir() and list(out.iterdir()) == [] and not is_finished(str(out))


def test_a_full_folder_needs_overwrite_or_resume_and_a_file_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"--output_dir .* is not empty \(1 entries\). Pass --overwrite"):
        check_output(str(tmp_path), overwrite=False, resume=False)
    check_output(str(tmp_path), overwrite=True, resume=False)
    with pytest.raises(NotADirectoryError, match="--output_dir .* exists and is not a folder"):
        check_output(str(tmp_path / "notes.txt"), overwrite=True, resume=False)


def test_overwrite_clears_our_files_only_and_resume_keeps_the_shards(tmp_path):
    shard = schemas.shard_filename("train", 0, 1)
    for name in (schemas.MANIFEST_FILENAME, schemas.REJECTS_FILENAME, shard, "notes.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / TMP_DIRNAME / "done").mkdir(parents=True)
    (tmp_path / TMP_DIRNAME / "done" / f"{shard}.json").write_text("{}")
    prepare_output(str(tmp_path), overwrite=False, resume=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([TMP_DIRNAME, shard, "notes.txt"])
    prepare_output(str(tmp_path), overwrite=True, resume=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_stale_shards_go_and_kept_ones_stay(tmp_path):
    names = [schemas.shard_filename("train", i, 3) for i in range(3)]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert remove_dataset_files(str(tmp_path), keep={names[1]}) == sorted([names[0], names[2]])
    assert [p.name for p in tmp_path.iterdir()] == [names[1]]


def test_the_summary_of_a_finished_dataset(tmp_path):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a", "b"), per_class=4)
    (root / "a" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    out = tmp_path / "out"
    convert(root, out, "--split", "train=0.5,validation=0.5", "--max_reject_fraction", "0.5")
    assert is_finished(str(out))
    manifest = read_manifest(str(out))
    text = summarize(str(out))
    shards = sum(len(s.shards) for s in manifest.splits.values())
    assert text.startswith(f"Converted 8 images into {shards} shards (")
    assert "rejected 1 (" in text and f"see {schemas.REJECTS_FILENAME}" in text
    assert text.endswith("Inputs 9 = 8 written + 1 rejected + 0 skipped.")


def test_the_summary_of_one_image_reads_as_a_sentence(tmp_path):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a",), per_class=1)
    out = tmp_path / "out"
    convert(root, out)
    assert summarize(str(out)).startswith("Converted 1 image into 1 shard (train 1)")
