"""The conversion's last step as a DoFn: rejects.jsonl, normalized.jsonl, then manifest.json
(`conversion.finalize.Finalizer`)."""

from __future__ import annotations

import apache_beam as beam

import schemas
from conversion.finalize import Finalizer

__all__ = ["FinalizeFn"]


# Declared: Beam would otherwise infer it from the bytecode of `process` (~0.1 s per DoFn).
@beam.typehints.with_output_types(schemas.Manifest)
class FinalizeFn(beam.DoFn):
    """Writes rejects.jsonl, normalized.jsonl, then manifest.json (last), once, from the
    side inputs of every shard result, reject and normalised entry.

    Args: those of `conversion.finalize.Finalizer`, by keyword.
    """

    def __init__(self, **kwargs):
        self._finalizer = Finalizer(**kwargs)

    def process(self, unused_element, shards, rejects, normalized):
        yield self._finalizer.finish(shards, rejects, normalized)
