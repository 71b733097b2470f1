"""conversion.append's reading of an output folder, whatever a reject's message holds."""

from __future__ import annotations

import json
import types

import pytest

import schemas
from conversion import append


@pytest.mark.parametrize("odd", ["\x85", "\u2028"])
def test_earlier_rejects_read_messages_holding_characters_splitlines_breaks_at(tmp_path, odd):
    """Found by bench.mutations_convert (issue 39): a damaged DICOM UID put U+0085 in a reject's
    message, written as it is (rejects.jsonl is UTF-8), and reading the file with str.splitlines
    broke the line there (JSONDecodeError: an append or a mend of that folder failed)."""
    rejects = [{"kind": "rejected", "message": f"a.dcm is a DICOM 1.2.840.10008.{odd}5.1 without pixel data",
                "path": "a.dcm", "reason": "no_pixel_data"},
               {"kind": "rejected", "message": "b.jpg is cut short", "path": "b.jpg", "reason": "corrupt"}]
    (tmp_path / schemas.REJECTS_FILENAME).write_text(
        "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rejects), encoding="utf-8")
    # Only the manifest's reject counts are read (a manifest as the finished run wrote them).
    manifest = types.SimpleNamespace(rejects={"no_pixel_data": 1, "corrupt": 1})
    assert append.earlier_rejects(str(tmp_path), manifest) == {"a.dcm": "no_pixel_data", "b.jpg": "corrupt"}


def test_an_inventory_line_keeps_a_series_label_and_contents_and_an_image_line_as_it_was():
    image = append.HeldFile("cat/a.jpg", 10, 5, "ab", "train", 1)
    assert image.to_json() == '{"mtime_ns": 5, "path": "cat/a.jpg", "sha256": "ab", "size": 10, "split": "train"}'
    series = image._replace(rel_path="p0", label="a", contents={"p0#series=2": "ff", "p0#series=1": "ee"})
    back = append.read_inventory(append.inventory_text([series, image]).decode(), 3)
    assert back == (image._replace(version=3), series._replace(version=3))
    assert json.loads(series.to_json())["contents"] == {"p0#series=1": "ee", "p0#series=2": "ff"}


def test_amended_entries_are_written_again_with_their_whole_version():
    held = {path: append.HeldFile(path, 1, 0, None, "train", version)
            for path, version in (("a", 1), ("b", 1), ("c", 2))}
    base = append.Base(types.SimpleNamespace(), held, 3)
    grown = append.amended(base, [held["b"]._replace(contents={"b": "00"})])
    assert grown.rebuilt == {1: (held["a"], held["b"]._replace(contents={"b": "00"}))}
    assert grown.held["b"].contents == {"b": "00"} and base.held["b"].contents is None
