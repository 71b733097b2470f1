"""The row type of the example-kind table (`conversion.examples.KINDS`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

__all__ = ["ExampleKind", "Grouped"]


class Grouped(NamedTuple):
    """The listed files as examples (`ExampleKind.group`).

    Attributes:
      files: The files planned further (`conversion.listing.InputFile`s): one
        per example; for a kind of several files, the one that names it.
      problems: The listing's problems, plus the files this kind refused.
      members: Example name -> the relative paths of the files it is made
        of, for a kind of several files; None when each file is one example.
    """

    files: list
    problems: list
    members: Mapping[str, tuple[str, ...]] | None = None


@dataclasses.dataclass(frozen=True)
class ExampleKind:
    """One kind of example: one row of `conversion.examples.KINDS`.

    Attributes:
      name: The kind's name ("image", ...), as the reading side's row names it.
      applies: Takes the conversion's `imaging.ValidationOptions`; True when
        the conversion writes this kind.
      group: (files, problems, config) -> `Grouped`: the listed files as
        examples; config is the `conversion.config.ConversionConfig`.
      record_schema: (validation, targets) -> the schema of its records.
      write_shard: `conversion.shard_writer.ShardJob` -> its `ShardOutcome`.
      warm_call: (validation, processes, decoders) -> the warm-up (fn, args)
        of a worker process.
    """

    name: str
    applies: Callable[[Any], bool]
    group: Callable[[list, list, Any], Grouped]
    record_schema: Callable[[Any, tuple[str, ...]], Any]
    write_shard: Callable[[Any], Any]
    warm_call: Callable[[Any, int, bool], tuple]
