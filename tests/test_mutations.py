"""Mutation testing of every decoder path (issue 39): a few hundred damaged files, each a verdict.

Damaged files come from real ones (`bench.mutations.seed_files`: Pillow's JPEG
and PNG, tifffile's TIFFs, pydicom's bundled DICOM files) by `bench.mutate`.
Each must be read or rejected with a listed reason: an exception other than a
rejection is a bug, and no file may hold the reader. Thousands of cases:
`python -m bench.mutations --cases 4000`; `SHARDSMITH_MUTATIONS=N` runs N per
seed file here.
"""

from __future__ import annotations

import os

import pytest

from bench import mutate, mutations
from schemas import REJECT_REASONS

_PER_FILE = int(os.environ.get("SHARDSMITH_MUTATIONS", "16"))


def test_the_mutator_is_seeded_and_structure_aware():
    [(_, fmt, data)] = [s for s in mutations.seed_files() if s[0] == "rgb.png"]
    first = [(m.how, m.data) for m in mutate.mutations(data, fmt, count=40, seed=3)]
    assert first == [(m.how, m.data) for m in mutate.mutations(data, fmt, count=40, seed=3)]
    assert first != [(m.how, m.data) for m in mutate.mutations(data, fmt, count=40, seed=4)]
    hows = " ".join(how for how, _ in first)
    assert "IHDR" in hows or "chunk" in hows


@pytest.mark.parametrize("seed", [0, 1])
def test_every_damaged_file_is_read_or_rejected_with_a_reason(seed):
    outcome = mutations.run_cases(_PER_FILE, seed, case_timeout=60.0)
    assert not outcome.crashes, outcome.crashes[:5]
    assert not outcome.hangs, outcome.hangs[:5]
    for fmt in mutate.FORMATS:
        assert outcome.cases[fmt] > 0, fmt
        assert sum(outcome.rejected[fmt].values()) + outcome.written[fmt] == outcome.cases[fmt]
        assert set(outcome.rejected[fmt]) <= set(REJECT_REASONS), outcome.rejected[fmt]
        # The mutations do damage: each format has files rejected as corrupt.
        assert outcome.rejected[fmt]["corrupt"] > 0, fmt
