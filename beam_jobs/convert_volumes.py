"""Converts DICOM series and NIfTI files to volume records (issue 36).

    python -m beam_jobs.convert --volumes --input_dir scans --output_dir out \\
        --split train=0.8,validation=0.2
    shardsmith convert --volumes --input_dir scans --output_dir out

`input_dir/<class>/<series folder>/...` (DICOM files at any depth, any
names) and `input_dir/<class>/<name>.nii[.gz]`. The driver plans the series
(headers only, `conversion.volumes.plan_volumes`); the runner's workers decode
each volume (`convert_job`); the shards are written sorted by filename, then
`volumes.json` last. Read back with `readers.volume_dataset_from_tfrecords`.
"""

from __future__ import annotations

import logging
import sys

import apache_beam as beam

from beam_jobs import _runner, args
from beam_jobs._options import ConvertOptions
from conversion import volumes as _volumes
from conversion.options import parse_split

__all__ = ["run", "main"]

_LOG = logging.getLogger("shardsmith.convert")
# Volumes per shard: a CT of 300 slices of 512x512 int16 is ~150 MB, so 8 make a shard of ~1 GB.
_RECORDS_PER_SHARD = 8


class _ConvertVolume(beam.DoFn):
    """One planned volume -> ('ok', split, filename, bytes) or ('reject', ...)."""

    def __init__(self, input_dir: str):
        self._input_dir = input_dir

    def process(self, job):
        result = _volumes.convert_job(job, self._input_dir)
        beam.metrics.Metrics.counter("volumes", "written" if result[0] == "ok" else "rejected").inc()
        yield result


def run(argv: list[str] | None = None, *, wait: bool = True):
    """Runs the volume conversion; returns the manifest written (a dict).

    Raises:
      ValueError: For bad arguments, before any work starts.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    # --volumes and --min_slices are ConvertOptions' too: one command, one set of options.
    options = args.pipeline_options(argv, ConvertOptions)
    o = common = options.view_as(ConvertOptions)
    if not common.input_dir or not common.output_dir:
        raise ValueError("--volumes needs --input_dir and --output_dir. "
                         f"Received: --input_dir {common.input_dir!r} --output_dir {common.output_dir!r}")
    if o.min_slices < 1:
        raise ValueError(f"--min_slices must be >= 1. Received: {o.min_slices}")
    ratios = parse_split(common.split) if common.split else {"train": 1.0}
    jobs, rejects, class_names = _volumes.plan_volumes(common.input_dir, split_ratios=ratios, seed=common.seed,
                                                       min_slices=o.min_slices)
    if not jobs:
        raise ValueError(f"--input_dir {common.input_dir!r} holds no volume (rejects: {len(rejects)})")
    runner = _runner.make_runner(options)
    input_dir, output_dir, per_shard = common.input_dir, common.output_dir, _RECORDS_PER_SHARD
    shards = _volumes.shard_of(jobs, _RECORDS_PER_SHARD)
    with beam.Pipeline(runner=runner, options=options) as pipeline:
        results = (pipeline
                   | "Planned volumes" >> beam.Create(jobs, reshuffle=False)
                   | "Reshuffle" >> beam.Reshuffle()
                   | "Decode and encode" >> beam.ParDo(_ConvertVolume(input_dir)))
        written = (results
                   | "Converted" >> beam.Filter(lambda r: r[0] == "ok")
                   # Keyed by the shard planned for each name: a worker holds one shard's volumes.
                   | "By shard" >> beam.Map(lambda r: (shards[r[2]], (r[2], r[3])))
                   | "Group shards" >> beam.GroupByKey()
                   | "Write shards" >> beam.Map(lambda kv: (*kv[0], _volumes.write_shard(
                       *kv[0], kv[1], output_dir))))
        rejected = (results
                    | "Rejected" >> beam.Filter(lambda r: r[0] == "reject")
                    | "As rejects" >> beam.Map(lambda r: tuple(r[1:])))
        _ = (pipeline
             | "Once" >> beam.Create([None])
             | "Manifest last" >> beam.Map(
                 lambda _, counts, late: _volumes.write_manifest(
                     output_dir, class_names, counts, [*rejects, *late]),
                 counts=beam.pvalue.AsList(written), late=beam.pvalue.AsList(rejected)))
    _LOG.info("volumes: %d planned, %d files rejected", len(jobs), len(rejects))
    return _volumes.read_manifest(common.output_dir)


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 converted, 2 a usage error."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        manifest = run(argv)
    except (ValueError, FileNotFoundError, args.UsageError) as e:
        print(f"shardsmith convert --volumes: error: {e}", file=sys.stderr)
        return 2
    print(f"volumes: {sum(s['records'] for s in manifest['splits'].values())} written, "
          f"{len(manifest['rejects'])} files rejected")
    return 0
