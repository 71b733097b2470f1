"""conversion.elements: what travels between the steps; a reject's line in rejects.jsonl."""

from __future__ import annotations

import json
import os

import schemas
from conversion.elements import Reject, problem_to_reject
from conversion.listing import list_input


def test_a_reject_line_says_kind_reason_and_a_printable_path():
    line = json.loads(Reject(os.fsdecode(b"a/caf\xe9.jpg"), "corrupt", "truncated JPEG").to_json())
    assert line == {"path": "a/caf\\xe9.jpg", "kind": "rejected", "reason": "corrupt", "message": "truncated JPEG"}
    skip = next(iter(schemas.SKIP_REASONS))
    assert Reject("a/x", skip, "m").kind == "skipped"
    # Sorted keys, UTF-8 kept: the same line every run.
    assert Reject("b/é.png", "corrupt", "é").to_json() == \
        '{"kind": "rejected", "message": "é", "path": "b/é.png", "reason": "corrupt"}'


def test_a_listing_problem_becomes_its_reject(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".hidden.jpg").write_bytes(b"x")
    _, problems = list_input(str(tmp_path))
    assert [problem_to_reject(p) for p in problems] == [Reject("a/.hidden.jpg", "hidden_file", "hidden or system file")]
    assert problem_to_reject(problems[0]).kind == ("skipped" if "hidden_file" in schemas.SKIP_REASONS else "rejected")
