"""conversion.shard_plans: each shard's planned files in a small JSON file, and back."""

from __future__ import annotations

import dataclasses
import json
import os

import schemas
from conversion.files import TMP_DIRNAME
from conversion.plan import PlannedFile
from conversion.shard_plans import PLANS_DIRNAME, load_shard_plan, write_shard_plans


def _files() -> list[PlannedFile]:
    odd = os.fsdecode(b"a/caf\xe9.jpg")  # Not UTF-8: kept intact through the JSON.
    return [
        PlannedFile("train", 0, 3, "a/1.jpg", "/in/a/1.jpg", 10, 0, 2),
        PlannedFile("train", 1, 0, odd, "/in/" + odd, 11, 1, 2, duplicate_of="a/1.jpg"),
        PlannedFile("validation", 0, 0, "b/é.png", "/in/b/é.png", 12, 1, 1, targets='{"boxes":[]}',
                    patch_rows="0,256"),
        PlannedFile("train", 0, 1, "a/2.jpg", "/in/a/2.jpg", 13, 0, 2),
    ]


def test_each_shard_gets_one_file_named_after_it_and_comes_back_equal(tmp_path):
    files = _files()
    paths = write_shard_plans(files, str(tmp_path))
    folder = tmp_path / TMP_DIRNAME / PLANS_DIRNAME
    assert paths == [str(folder / (schemas.shard_filename(*key) + ".json"))
                     for key in (("train", 0, 2), ("train", 1, 2), ("validation", 0, 1))]
    loaded = [load_shard_plan(p) for p in paths]
    # Each shard's files in the order given (a stable sort by shard).
    assert loaded == [(("train", 0), [files[0], files[3]]), (("train", 1), [files[1]]),
                      (("validation", 0), [files[2]])]


def test_the_file_is_what_json_writes_of_the_rows(tmp_path):
    files = _files()
    for path in write_shard_plans(files, str(tmp_path)):
        shard = load_shard_plan(path)[1]
        rows = [list(dataclasses.astuple(f)) for f in shard]
        with open(path, "rb") as f:
            assert f.read() == json.dumps(rows, ensure_ascii=True).encode()


def test_an_int_field_of_another_type_is_written_as_json_would(tmp_path):
    # A bool label (True == 1) is written as JSON writes it, not as an int.
    odd = dataclasses.replace(_files()[0], label=True)
    (path,) = write_shard_plans([odd], str(tmp_path))
    with open(path, "rb") as f:
        assert f.read() == json.dumps([list(dataclasses.astuple(odd))], ensure_ascii=True).encode()
    assert load_shard_plan(path)[1][0].label is True
