"""Command-line pieces the benchmarks share."""

from __future__ import annotations

__all__ = ["parse_only"]


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
