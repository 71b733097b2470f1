"""What travels between the conversion's steps: shard results and rejects.

Plain frozen values in an importable module (not the script run as __main__),
so every runner can pickle them to its workers. Beam-free: the shard
writers' worker processes (`processes`) build them without importing Beam.
"""

from __future__ import annotations

import dataclasses
import json
from typing import NamedTuple

import schemas
from conversion import listing

__all__ = ["ConversionError", "ShardResult", "ShardOutcome", "Reject", "problem_to_reject"]


class ConversionError(Exception):
    """The conversion ran but its result must not be used (e.g. too many rejects)."""


@dataclasses.dataclass(frozen=True)
class ShardResult:
    split: str
    index: int
    count: int
    file: str
    num_records: int
    num_bytes: int
    sha256: str
    class_counts: tuple[int, ...]
    index_file: str
    index_sha256: str
    # Input files that gave records (a multi-frame DICOM file gives several).
    num_sources: int
    # schemas.ImageStats.to_json() of its records (None: none, or an older receipt).
    images: dict | None = None
    # schemas.BandStats.to_json() of its raster records (None: none).
    band_stats: dict | None = None
    # With --raster_georef, its records with a known EPSG code or geotransform (else None).
    georeferenced: int | None = None
    # Counts of its records' targets (`annotations.TargetCounts.to_json`): boxes per class,
    # images without boxes, images per class of several labels; None when none.
    targets: dict | None = None
    # With --masks_dir, pixels per class id of its masks ({"<id>": pixels}; else None).
    mask_pixels: dict | None = None


@dataclasses.dataclass(frozen=True)
class Reject:
    rel_path: str
    reason: str
    message: str

    @property
    def kind(self) -> str:
        return "skipped" if self.reason in schemas.SKIP_REASONS else "rejected"

    def to_json(self) -> str:
        return json.dumps(
            {
                "path": listing.display_path(self.rel_path),
                "kind": self.kind,
                "reason": self.reason,
                "message": self.message,
            },
            sort_keys=True,
            ensure_ascii=False,
        )


def problem_to_reject(p) -> Reject:
    """The Reject of a `listing.Problem`."""
    return Reject(p.rel_path, p.reason, p.message)


class ShardOutcome(NamedTuple):
    """What writing a shard gives: its result, its rejects, its normalisations."""

    result: ShardResult
    rejects: list[Reject]
    # (record filename, source format, actions, details or None) of each record not stored as read.
    normalized: list[tuple]
