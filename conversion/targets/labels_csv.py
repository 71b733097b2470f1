"""The labels CSV (--labels_csv): one label per image, several labels (`cat|dog`), numbers.

Read once, on the driver, before planning: `read` gives the one-label mapping
`conversion.plan.make_plan` takes, and, for a CSV whose labels are sets or
that has a `target` column, the rows that the kinds of several labels
(`conversion.targets.labels`) and numbers (`conversion.targets.numbers`) plan.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from schemas.manifest import SPLIT_ALIASES

__all__ = ["LabelsCsv", "TargetsCsv", "read", "read_labels_csv", "read_targets_csv", "bad_numbers", "normalise_rel"]


def normalise_rel(path: str) -> str:
    """A path as the CSV or an annotation gives it, relative to --input_dir and with '/'."""
    path = path.strip().replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path.lstrip("/")


class LabelsCsv(NamedTuple):
    """A parsed --labels_csv.

    Attributes:
      labels: Relative path to (label or None, split or None): `make_plan`'s labels_csv.
      table: The rows of several labels or numbers (`TargetsCsv`), or None
        for a CSV of one label per row.
    """

    labels: Mapping[str, tuple[str | None, str | None]]
    table: TargetsCsv | None


def read(text: str, source: str) -> LabelsCsv:
    """Parses --labels_csv (its text; `source` is the flag's value, for messages).

    Raises:
      ValueError: Naming the file and row, for what `read_targets_csv` and
        `read_labels_csv` refuse.
    """
    table = read_targets_csv(text, source)
    labels = read_labels_csv(text, source) if table is None else table.labels_csv()
    return LabelsCsv(labels, table)


def read_labels_csv(text: str, source: str) -> dict[str, tuple[str, str | None]]:
    """Parses a labels CSV with columns `path,label[,split]`.

    Returns:
      Relative path to (label, split or None).

    Raises:
      ValueError: Naming the file and row, for a missing column, an unknown
        split or a path listed twice with different labels.
    """
    reader = csv.DictReader(io.StringIO(text))
    columns = [c.strip() for c in (reader.fieldnames or [])]
    if "path" not in columns or "label" not in columns:
        raise ValueError(
            f"--labels_csv {source} must have a header with columns path,label[,split]. "
            f"Received columns: {columns}"
        )
    reader.fieldnames = columns
    has_split = "split" in columns
    out: dict[str, tuple[str, str | None]] = {}
    for row_number, row in enumerate(reader, start=2):
        path = normalise_rel(row["path"] or "")
        label = (row["label"] or "").strip()
        if not path or not label:
            raise ValueError(f"--labels_csv {source} row {row_number}: empty path or label.")
        split = None
        if has_split:
            raw = (row["split"] or "").strip().lower()
            if raw not in SPLIT_ALIASES:
                raise ValueError(
                    f"--labels_csv {source} row {row_number}: split must be one of "
                    f"{sorted(SPLIT_ALIASES)}. Received: {raw!r}"
                )
            split = SPLIT_ALIASES[raw]
        if path in out and out[path] != (label, split):
            raise ValueError(
                f"--labels_csv {source} row {row_number}: {path!r} is listed twice "
                f"with different labels or splits."
            )
        out[path] = (label, split)
    return out


@dataclasses.dataclass(frozen=True)
class TargetsCsv:
    """A labels CSV that holds more than one label per image or numbers.

    Attributes:
      rows: Relative path to (label names or None, split or None, numbers or
        None): label names is a tuple of names (several labels, sorted,
        each once) or of one name (one label per image); None without a
        label column.
      multi_label: Whether labels are sets (any row has a `|` in its label).
      target_length: Numbers per row of the `target` column; None without one.
    """

    rows: Mapping[str, tuple[tuple[str, ...] | None, str | None, tuple[float, ...] | None]]
    multi_label: bool
    target_length: int | None

    def labels_csv(self) -> dict[str, tuple[str | None, str | None]]:
        """The rows as `plan.make_plan`'s labels_csv: the one label of each row, else None."""
        return {path: (names[0] if names is not None and not self.multi_label else None, split)
                for path, (names, split, _) in self.rows.items()}


def read_targets_csv(text: str, source: str) -> TargetsCsv | None:
    """Parses a labels CSV whose labels are sets (`cat|dog`) or that has a numeric `target` column.

    Args:
      text: The CSV's text.
      source: --labels_csv, for messages.

    Returns:
      The parsed CSV, or None for a CSV of one label per row and no `target`
      column (`read_labels_csv` reads those).

    Raises:
      ValueError: Naming the file and row: a missing column, an empty path,
        an unknown split, a path listed twice with different values, a
        non-numeric target, or rows with different counts of targets.
    """
    reader = csv.DictReader(io.StringIO(text))
    columns = [c.strip() for c in (reader.fieldnames or [])]
    reader.fieldnames = columns
    has_label, has_target = "label" in columns, "target" in columns
    if "path" not in columns or not (has_label or has_target):
        if not has_target:
            return None  # `read_labels_csv` says what a labels CSV needs.
        raise ValueError(
            f"--labels_csv {source} must have a header with columns path,label[,split] or "
            f"path,target[,split] (or both label and target). Received columns: {columns}"
        )
    if not has_target and "|" not in text:
        return None  # One label per row: read by `read_labels_csv`, without parsing it twice.
    rows = list(enumerate(reader, start=2))
    multi = has_label and any("|" in (row["label"] or "") for _, row in rows)
    if not multi and not has_target:
        return None
    has_split = "split" in columns
    out = {}
    length = None
    for row_number, row in rows:
        where = f"--labels_csv {source} row {row_number}"
        path = normalise_rel(row["path"] or "")
        if not path:
            raise ValueError(f"{where}: empty path.")
        names = None
        if has_label:
            raw = (row["label"] or "").strip()
            if multi:
                names = tuple(sorted({n.strip() for n in raw.split("|") if n.strip()}))
            elif not raw:
                raise ValueError(f"{where}: empty label.")
            else:
                names = (raw,)
        numbers = None
        if has_target:
            numbers = _parse_numbers(row["target"], where)
            if length is None:
                length = len(numbers)
            elif len(numbers) != length:
                raise ValueError(
                    f"{where}: {len(numbers)} targets, but the rows before have {length}; every "
                    f"row needs the same number of targets (separated by |)."
                )
        split = None
        if has_split:
            raw_split = (row["split"] or "").strip().lower()
            if raw_split not in SPLIT_ALIASES:
                raise ValueError(f"{where}: split must be one of {sorted(SPLIT_ALIASES)}. "
                                 f"Received: {raw_split!r}")
            split = SPLIT_ALIASES[raw_split]
        value = (names, split, numbers)
        if path in out and _row_key(out[path]) != _row_key(value):
            raise ValueError(f"{where}: {path!r} is listed twice with different labels, targets or splits.")
        out[path] = value
    return TargetsCsv(rows=out, multi_label=multi, target_length=length)


def _row_key(value):
    # NaN != NaN: compared by text, so a row listed twice with the same NaN is the same row.
    names, split, numbers = value
    return names, split, None if numbers is None else tuple(map(repr, numbers))


def _parse_numbers(cell: str | None, where: str) -> tuple[float, ...]:
    raw = (cell or "").strip()
    if not raw:
        raise ValueError(f"{where}: empty target (numbers separated by |, e.g. 0.5|1.25).")
    try:
        return tuple(float(part) for part in raw.split("|"))
    except ValueError:
        raise ValueError(f"{where}: target must be numbers separated by | (e.g. 0.5|1.25). "
                         f"Received: {raw!r}") from None


def bad_numbers(numbers: Sequence[float]) -> str | None:
    """Why numbers cannot be stored as float32 (NaN, infinite, out of range), or None."""
    for v in numbers:
        if not math.isfinite(v):
            return f"target {v!r} is not a finite number"
        try:
            struct.pack("<f", v)
        except OverflowError:
            return f"target {v!r} does not fit in float32"
    return None
