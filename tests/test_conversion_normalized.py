"""conversion.normalized: normalized.jsonl's lines, and the manifest's summaries of them."""

from __future__ import annotations

import os

from conversion.normalized import dicom_summary, line, patches_summary
from conversion.scene_log import CUT_ACTION


def test_a_line_has_a_printable_path_and_details_only_when_there_are_some():
    assert line(os.fsdecode(b"a/caf\xe9.png"), "png", ("flatten_alpha",), None) == {
        "path": "a/caf\\xe9.png", "source_format": "png", "actions": ["flatten_alpha"]}
    assert line("b.dcm", "dicom", ["window"], {"window": {"source": "file"}})["details"] == {"window": {"source": "file"}}


def test_the_dicom_summary_counts_dicom_records_only():
    normalized = [
        ("a.dcm", "dicom", ("window",), {"window": {"source": "file"}, "rescale": [1, -1024], "bit_depth": 8,
                                          "photometric": "MONOCHROME2"}),
        ("b.dcm", "dicom", ("window", "invert"), {"window": {"source": "flag"}, "inverted": True, "bit_depth": 16,
                                                  "photometric": "MONOCHROME1"}),
        ("c.png", "png", ("flatten_alpha",), {"window": {"source": "file"}}),
        ("d.dcm", "dicom", (), None),  # No details: nothing to count.
    ]
    assert dicom_summary(normalized) == {
        "bit_depth": {"16": 1, "8": 1}, "inverted_monochrome1": {"False": 1, "True": 1},
        "photometric": {"MONOCHROME1": 1, "MONOCHROME2": 1}, "rescaled": {"False": 1, "True": 1},
        "window_source": {"file": 1, "flag": 1}}
    assert dicom_summary([]) == {}


def test_the_patches_summary_gathers_the_scenes_work_items():
    normalized = [("s.tif#patch_rows=0,16", "tiff", (CUT_ACTION,), {"written": 3, "skipped": [[0, 16]],
                                                                    "scene_size": [16, 64]}),
                  ("s.tif#patch_rows=16,32", "tiff", ("patch_rows_failed",), None),
                  ("p.png", "png", ("flatten_alpha",), None)]
    assert patches_summary(normalized) == {
        "scenes": 1, "written": 3, "skipped_nodata": 1, "failed_items": 1,
        "listed": {"s.tif": {"size": [16, 64], "written": 3, "skipped_nodata": 1, "failed_items": 1}}}
    assert patches_summary(normalized[2:]) == {}
