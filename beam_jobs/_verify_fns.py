"""The DoFns of `beam_jobs.verify`, in an importable module: thin adapters of
`conversion.verification`, where the checks are.

`python -m beam_jobs.verify` runs verify.py as __main__; classes defined there
could not be unpickled by worker processes (multi_processing, Dask, Dataflow).
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

import schemas
from conversion import verification
from conversion.verification import CHECK_FAILED, ShardCheck, check_scene, duplicate_group, raster_records

__all__ = ["ShardCheck", "VerifyShardFn", "duplicate_group", "ReportFn", "raster_records",
           "check_scene", "CHECK_FAILED"]

_NAMESPACE = "shardsmith"


class VerifyShardFn(beam.DoFn):
    """Reads one shard and checks everything about it (`conversion.verification.ShardVerifier`).

    Input: (split, ShardInfo). Main output: ShardCheck. Tagged outputs
    CONTENT: (sha256 of image bytes, (split, filename)); PATCHES: (scene,
    (y, x)) of each patch record. Arguments: those of `ShardVerifier`.
    """

    CONTENT = verification.CONTENT
    PATCHES = verification.PATCHES

    def __init__(self, dataset_dir: str, features, num_classes: int, resize: dict | None = None,
                 rasters: dict[str, float | None] | None = None, targets: dict | None = None,
                 patch_size: tuple[int, int] | None = None):
        # Plain JSON in, validated here: a malformed manifest fails before any worker starts.
        self._verifier = verification.ShardVerifier(dataset_dir, features, num_classes, resize=resize,
                                                    rasters=rasters, targets=targets, patch_size=patch_size)
        self._records = Metrics.counter(_NAMESPACE, "records_verified")

    def setup(self):
        self._verifier.setup()

    def process(self, element):
        split, shard = element
        for out in self._verifier.check(split, shard):
            if isinstance(out, ShardCheck):
                yield out
                continue
            tag, value = out
            if tag == self.CONTENT:
                self._records.inc()
            yield beam.pvalue.TaggedOutput(tag, value)


class ReportFn(beam.DoFn):
    """Builds the report from every shard check and duplicate group (`conversion.verification.report`);
    writes it."""

    def __init__(self, manifest_json: str, report_path: str):
        self._manifest_json = manifest_json
        self._report_path = report_path

    def process(self, unused, checks, duplicates, scene_problems=()):
        manifest = schemas.Manifest.from_json(self._manifest_json)
        report = verification.report(manifest, checks, duplicates, scene_problems)
        verification.write_report(self._report_path, report)
        yield report
