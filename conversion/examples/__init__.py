"""Kinds of examples: what one record is made of, as a table (one module per kind, one row).

A kind says how the listed files are grouped into examples (one photo; a DICOM
series of slices; the passes of one location), the schema of its records, and
how a shard of its examples is written. `KINDS` is the table, asked in order:
the first row whose `applies` takes the conversion's options is its kind; the
image row, last, takes every conversion no other row claims. The reading side
is `readers.examples`, one row per kind too.

Adding a kind (see docs/architecture.md, "Adding a kind of example"): a module
here with its `KIND`, one row in `KINDS` before the image's, a module and a
row in `readers.examples`, its features in `schemas/`.
"""

from __future__ import annotations

from conversion.examples import image as _image, time_series as _time_series, volumes as _volumes
from conversion.examples.kind import ExampleKind, Grouped

__all__ = ["ExampleKind", "Grouped", "KINDS", "kind_for", "record_schema", "write_shard", "warm_call"]

# Asked in order; the image row last (it applies to everything).
KINDS: tuple[ExampleKind, ...] = (_volumes.KIND, _time_series.KIND, _image.KIND)


def kind_for(validation) -> ExampleKind:
    """The kind of example a conversion with these options (`imaging.ValidationOptions`) writes."""
    for kind in KINDS:
        if kind.applies(validation):
            return kind
    raise AssertionError("the image row applies to every conversion")  # Not a user error: a table bug.


def write_shard(job):
    """Writes one shard (`conversion.shard_writer.ShardJob`) with its kind's writer.

    A module-level function, so that worker processes receive it pickled by name.
    """
    return kind_for(job.validation).write_shard(job)


def record_schema(validation, targets: tuple[str, ...] = ()):
    """The schema of every record of a conversion with these options (and kinds of target)."""
    return kind_for(validation).record_schema(validation, tuple(targets))


def warm_call(validation, processes: int, decoders: bool = True) -> tuple:
    """The warm-up (fn, args) of `processes` worker processes for this conversion's kind."""
    return kind_for(validation).warm_call(validation, processes, decoders)
