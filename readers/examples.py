"""Kinds of examples on the reading side: one row per kind, as `conversion.examples` writes them.

A row says how to recognise a dataset of its kind from the record schema in
its manifest, how to rebuild that schema, and which public reader reads it.
`load_split` asks the table when a dataset's records are not this reader's,
so that the error names the reader that is.

Adding a kind (docs/architecture.md, "Adding a kind of example"): its reader
module in `readers/`, one row in `KINDS` here, its row in `conversion.examples`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from schemas.features import ImageExampleSchema
from schemas.time_series import TIME_SERIES, TimeSeriesExampleSchema

__all__ = ["ReadingKind", "KINDS", "kind_of", "kind_named"]


@dataclasses.dataclass(frozen=True)
class ReadingKind:
    """One kind of example on the reading side.

    Attributes:
      name: The kind's name, as its row in `conversion.examples` names it.
      reader: The public function of `readers` that reads its datasets.
      stores: Takes the manifest's `features`; True when they are this kind's records.
      schema_from_json: The manifest's `features` -> the kind's record schema
        (raises ValueError, naming what does not match).
    """

    name: str
    reader: str
    stores: Callable[[Mapping[str, Any]], bool]
    schema_from_json: Callable[[Mapping[str, Any]], Any]


def _parses(schema_from_json: Callable[[Mapping[str, Any]], Any]) -> Callable[[Mapping[str, Any]], bool]:
    """`stores` of a kind whose schema is rebuilt by `schema_from_json`."""

    def stores(features: Mapping[str, Any]) -> bool:
        try:
            schema_from_json(features)
        except ValueError:
            return False
        return True

    return stores


IMAGE = ReadingKind(
    name="image",
    reader="image_dataset_from_tfrecords",
    stores=_parses(ImageExampleSchema.from_json),
    schema_from_json=ImageExampleSchema.from_json,
)

STACKS = ReadingKind(
    name=TIME_SERIES,
    reader="time_series_dataset_from_tfrecords",
    stores=_parses(TimeSeriesExampleSchema.from_json),
    schema_from_json=TimeSeriesExampleSchema.from_json,
)

KINDS: tuple[ReadingKind, ...] = (STACKS, IMAGE)


def kind_of(features: Mapping[str, Any]) -> ReadingKind | None:
    """The kind whose records a manifest's `features` describe; None when no row knows them."""
    for kind in KINDS:
        if kind.stores(features):
            return kind
    return None


def kind_named(name: str) -> ReadingKind:
    """The row named `name` (a reader asks for its own)."""
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise ValueError(f"`kind` must be one of {[k.name for k in KINDS]}. Received: kind={name!r}")
