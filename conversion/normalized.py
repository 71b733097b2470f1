"""normalized.jsonl: each file stored other than byte for byte, and what the manifest sums up of them.

A line says what was done to one record's file (`line`); the manifest sums up
how the DICOM records were windowed and rescaled (`dicom_summary`) and the
scenes cut into patches (`patches_summary`, from `conversion.scene_log`).
Pure Python, no Beam.
"""

from __future__ import annotations

import collections

from conversion import listing, scene_log

__all__ = ["line", "dicom_summary", "patches_summary"]


def line(path, source_format, actions, details) -> dict:
    """One line of normalized.jsonl: the file's printable path, its source format, the actions and their details."""
    entry = {"path": listing.display_path(path), "source_format": source_format,
             "actions": list(actions)}
    if details:
        entry["details"] = details
    return entry


def patches_summary(normalized) -> dict:
    """With --raster_patch: scenes cut, patches written and skipped (nodata), work items that failed.

    From the normalized.jsonl entries of the scenes' work items
    (`conversion.shard_writer`), named PATH#patch_rows=Y0,Y1 (then
    #patch_columns=X0,X1 for a column range of a wide row); the first scenes by
    path are listed with their own counts (`conversion.scene_log`).
    """
    return scene_log.patches_section(scene_log.scene_logs(
        (path, actions, details) for path, _, actions, details in normalized))


def dicom_summary(normalized) -> dict:
    """How many DICOM records got each rescale, window source, inversion and bit depth."""
    counters = collections.defaultdict(collections.Counter)
    for _, source_format, _, details in normalized:
        if source_format != "dicom" or not details:
            continue
        window = details.get("window") or {}
        counters["window_source"][window.get("source", "none (colour)")] += 1
        counters["rescaled"][str(bool(details.get("rescale") or details.get("modality_lut")))] += 1
        counters["inverted_monochrome1"][str(bool(details.get("inverted")))] += 1
        counters["bit_depth"][str(details.get("bit_depth"))] += 1
        counters["photometric"][str(details.get("photometric"))] += 1
    return {name: dict(sorted(c.items())) for name, c in sorted(counters.items())}
