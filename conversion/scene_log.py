"""What normalized.jsonl says of the scenes cut into patches (--raster_patch), scene by scene.

The shard writer lists each work item of a scene (a band of patch rows, or a
range of columns of rows wider than an item holds) in normalized.jsonl as
`PATH#patch_rows=Y0,Y1` (then `#patch_columns=X0,X1`): cut (`cut_into_patches`: the
scene's size, the patches written, the offsets skipped for nodata) or failed
(`patch_rows_failed`, its patches missing). This module gathers those entries
per scene, for the manifest's `patches` section (`patches_section`), for
`verify` (which checks the records' offsets against each scene's grid) and for
`inspect` (which prints the section). Pure Python, no Beam.

    scenes = scene_logs((path, actions, details) for path, _, actions, details in normalized)
    section = patches_section(scenes)
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from typing import Any

__all__ = ["CUT_ACTION", "FAILED_ACTION", "ROWS_MARK", "COLUMNS_MARK", "PATCH_MARK", "covered", "LISTED_SCENES", "SceneLog",
           "scene_logs", "scene_logs_from_jsonl", "patches_section", "split_patch_name"]

# normalized.jsonl actions of a scene's work item: cut, with the offsets of the
# patches skipped for nodata; or failed (its patches missing).
CUT_ACTION = "cut_into_patches"
FAILED_ACTION = "patch_rows_failed"
# How a work item is named in normalized.jsonl (PATH#patch_rows=Y0,Y1, then #patch_columns=X0,X1
# for a range of columns), and a patch record (PATH#patch=Y,X).
ROWS_MARK = "#patch_rows="
COLUMNS_MARK = "#patch_columns="
PATCH_MARK = "#patch="
# The manifest lists this many scenes (the first by path) with their counts; the
# totals cover every scene. Thousands of scenes would otherwise grow the manifest
# every reader parses; normalized.jsonl has them all.
LISTED_SCENES = 100


@dataclasses.dataclass
class SceneLog:
    """One scene's work items, as normalized.jsonl lists them.

    Attributes:
      path: The scene's relative path.
      size: (height, width) of the scene; None when no entry recorded it
        (a dataset converted before it was recorded).
      rows: (y0, y1, x0, x1) of each work item cut, sorted: the patches whose
        top row is in [y0, y1) and left column in [x0, x1); x1 None: every
        column from x0 (a band of whole rows: x0 0).
      failed: The same of each work item that failed (its patches missing), sorted.
      written: Patches the cut items say they wrote.
      skipped: (y, x) of the patches skipped for their nodata share, sorted.
    """

    path: str
    size: tuple[int, int] | None = None
    rows: list[tuple[int, int, int, int | None]] = dataclasses.field(default_factory=list)
    failed: list[tuple[int, int, int, int | None]] = dataclasses.field(default_factory=list)
    written: int = 0
    skipped: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The scene's line in the manifest's `patches.listed`."""
        return {"size": list(self.size) if self.size else None, "written": self.written,
                "skipped_nodata": len(self.skipped), "failed_items": len(self.failed)}


def _rows(details: dict, path: str) -> tuple[int, int, int, int | None]:
    """(y0, y1, x0, x1) of a work item's entry; x1 None: every column."""
    rows = details.get("patch_rows")
    if rows is None:  # Older entries: the rows are in the name only.
        rows = path.rpartition(ROWS_MARK)[2].partition(COLUMNS_MARK)[0].split(",")
    columns = details.get("patch_columns")
    if columns is None:
        return int(rows[0]), int(rows[1]), 0, None
    return int(rows[0]), int(rows[1]), int(columns[0]), int(columns[1])


def scene_logs(entries: Iterable[tuple[str, Iterable[str], dict | None]]) -> dict[str, SceneLog]:
    """The scenes of normalized.jsonl entries, by path, in path order (as bytes).

    Args:
      entries: (path, actions, details) of each entry; those of neither action
        are passed over.
    """
    scenes: dict[str, SceneLog] = {}
    for path, actions, details in entries:
        actions = tuple(actions)
        cut, failed = CUT_ACTION in actions, FAILED_ACTION in actions
        if not (cut or failed) or ROWS_MARK not in path:
            continue
        details = details or {}
        scene = path.rpartition(ROWS_MARK)[0]
        log = scenes.setdefault(scene, SceneLog(scene))
        rows = _rows(details, path)
        if failed:
            log.failed.append(rows)
            continue
        log.rows.append(rows)
        log.written += int(details.get("written", 0))
        log.skipped.extend((int(y), int(x)) for y, x in details.get("skipped", ()))
        if details.get("scene_size") is not None:
            log.size = (int(details["scene_size"][0]), int(details["scene_size"][1]))
    for log in scenes.values():
        log.rows.sort()
        log.failed.sort()
        log.skipped.sort()
    return {k: scenes[k] for k in sorted(scenes, key=os.fsencode)}


def scene_logs_from_jsonl(text: str) -> dict[str, SceneLog]:
    """`scene_logs` of normalized.jsonl's text.

    Only the lines of scenes' work items are parsed (a patch dataset has a
    line per patch besides).
    """
    entries = []
    for line in text.splitlines():
        if CUT_ACTION not in line and FAILED_ACTION not in line:
            continue
        entry = json.loads(line)
        entries.append((entry["path"], entry.get("actions", ()), entry.get("details")))
    return scene_logs(entries)


def patches_section(scenes: dict[str, SceneLog]) -> dict[str, Any]:
    """The manifest's `patches` section: totals over every scene, and the first scenes listed.

    {} without scenes. `listed` holds the first `LISTED_SCENES` scenes by path
    (size, written, skipped_nodata, failed_items each); `scenes` counts them all.
    """
    if not scenes:
        return {}
    listed = dict(list(scenes.items())[:LISTED_SCENES])
    return {
        "scenes": len(scenes),
        "written": sum(s.written for s in scenes.values()),
        "skipped_nodata": sum(len(s.skipped) for s in scenes.values()),
        "failed_items": sum(len(s.failed) for s in scenes.values()),
        "listed": {path: log.to_json() for path, log in listed.items()},
    }


def covered(items, rows, columns) -> set[tuple[int, int]]:
    """The (y, x) of a grid's patches that some of `items` holds (`SceneLog.rows` or `failed`).

    Args:
      items: (y0, y1, x0, x1) work items; x1 None: every column from x0.
      rows, columns: The grid's offsets (`imaging.patches.offsets`), ascending.
    """
    import bisect

    cells = set()
    for y0, y1, x0, x1 in items:
        ys = rows[bisect.bisect_left(rows, y0):bisect.bisect_left(rows, y1)]
        xs = columns[bisect.bisect_left(columns, x0):None if x1 is None else bisect.bisect_left(columns, x1)]
        cells.update((y, x) for y in ys for x in xs)
    return cells


def split_patch_name(filename: str) -> tuple[str, int, int] | None:
    """(scene path, y, x) of a patch record's filename PATH#patch=Y,X; None for another record."""
    scene, mark, offset = filename.rpartition(PATCH_MARK)
    if not mark:
        return None
    y, comma, x = offset.partition(",")
    try:
        return (scene, int(y), int(x)) if comma else None
    except ValueError:
        return None
