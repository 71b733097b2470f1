"""Command-line pieces the benchmarks share."""

from __future__ import annotations

import json

__all__ = ["parse_only", "write_json"]


def parse_only(parser, text: str | None, contenders) -> tuple[str, ...] | None:
    """The names given to `--only a,b`, checked against the contenders; None for all.

    Exits through `parser.error` naming the unknown ones.
    """
    if not text:
        return None
    names = tuple(n.strip() for n in text.split(","))
    unknown = set(names) - {c.name for c in contenders}
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; known: {[c.name for c in contenders]}")
    return names


def write_json(path: str | None, results: dict) -> None:
    """Writes a benchmark's figures to `path` (--json), sorted and indented; nothing when None."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2, sort_keys=True)
