"""Converts DICOM series and NIfTI files to volume records (issue 36).

    python -m beam_jobs.convert --volumes --input_dir scans --output_dir out \\
        --split train=0.8,validation=0.2
    shardsmith convert --volumes --input_dir scans --labels_csv labels.csv --dedup --output_dir out
    shardsmith convert --volumes --input_dir scans --output_dir out

`input_dir/<class>/<series folder>/...` (DICOM files at any depth, any
names) and `input_dir/<class>/<name>.nii[.gz]`. The driver plans the series
(headers only, `conversion.volumes.plan_volumes`); the runner's workers decode
each volume (`convert_job`); the shards are written sorted by filename, then
`volumes.json` last. Read back with `readers.volume_dataset_from_tfrecords`.

No single series stops the job: each is decoded in a worker process
(`conversion.volumes.VolumeConverter`, the image path's guard), and one whose
decoder crashes or runs past --file_timeout is rejected as `decoder_crashed`
or `timeout`; the command (`main`) runs the driver in a supervised child
(`conversion.recovery.supervise`), so a header that crashes the planning
costs that file only.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid

import apache_beam as beam

from beam_jobs import _runner, args
from beam_jobs._options import ConvertOptions
from conversion import guard, recovery, volumes as _volumes
from conversion.files import TMP_DIRNAME, exists, join, read_bytes, remove, remove_tree
from conversion.output_folder import check_output, prepare_output
from conversion.options import WritingOptions, parse_split
from conversion.plan import read_labels_csv

__all__ = ["run", "main"]

_LOG = logging.getLogger("shardsmith.convert")
# Volumes per shard: a CT of 300 slices of 512x512 int16 is ~150 MB, so 8 make a shard of ~1 GB.
_RECORDS_PER_SHARD = 8


class _ConvertVolume(beam.DoFn):
    """One planned volume -> ('ok', split, filename, record path) or ('reject', ...), in a worker process."""

    def __init__(self, run: str, input_dir: str, output_dir: str, processes: int, file_timeout: float):
        self._run = run
        self._input_dir = input_dir
        self._output_dir = output_dir
        self._processes = processes
        self._file_timeout = file_timeout
        self._converter = None

    def setup(self):
        # The runner's threads in this process share one converter and its worker processes.
        self._converter = _volumes.VolumeConverter.shared(self._run, self._input_dir, self._output_dir,
                                                          processes=self._processes,
                                                          file_timeout=self._file_timeout)

    def teardown(self):
        if self._converter is not None:
            self._converter.release()
            self._converter = None

    def process(self, job):
        result = self._converter.convert(job)
        beam.metrics.Metrics.counter("volumes", "written" if result[0] == "ok" else f"rejected_{result[2]}").inc()
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
    writing = WritingOptions(worker_processes=o.worker_processes, file_timeout=o.file_timeout)
    ratios = parse_split(common.split) if common.split else None
    labels = None
    if o.labels_csv:
        if not exists(o.labels_csv):
            raise FileNotFoundError(f"--labels_csv {o.labels_csv!r} does not exist.")
        labels = read_labels_csv(read_bytes(o.labels_csv).decode("utf-8-sig"), o.labels_csv)
    check_output(common.output_dir, overwrite=o.overwrite, resume=o.resume)
    # Files that crashed or hung an earlier attempt of this run (the supervisor resumes with --resume).
    quarantine = guard.Quarantine(guard.quarantine_path(common.output_dir))
    jobs, rejects, class_names = _volumes.plan_volumes(
        common.input_dir, split_ratios=ratios, seed=common.seed, min_slices=o.min_slices,
        quarantined=quarantine.load() if o.resume else None, labels_csv=labels, dedup=o.dedup)
    if not jobs:
        raise ValueError(f"--input_dir {common.input_dir!r} holds no volume (rejects: {len(rejects)})")
    prepare_output(common.output_dir, overwrite=o.overwrite, resume=o.resume)
    remove(join(common.output_dir, _volumes.VOLUMES_MANIFEST))
    runner = _runner.make_runner(options)
    input_dir, output_dir = common.input_dir, common.output_dir
    processes = writing.worker_processes
    if processes is None:
        # A volume is seconds of decoding: a worker process per core, at most one per volume.
        processes = max(1, min(os.cpu_count() or 1, len(jobs)))
    shards = _volumes.shard_of(jobs, _RECORDS_PER_SHARD)
    with beam.Pipeline(runner=runner, options=options) as pipeline:
        results = (pipeline
                   | "Planned volumes" >> beam.Create(jobs, reshuffle=False)
                   | "Reshuffle" >> beam.Reshuffle()
                   | "Decode and encode" >> beam.ParDo(_ConvertVolume(
                       uuid.uuid4().hex, input_dir, output_dir, processes, writing.file_timeout)))
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
                     output_dir, class_names,
                     # Every planned shard is there, an empty one where each of its volumes was rejected.
                     [*counts, *_volumes.write_missing_shards(output_dir, shards.values(), counts)],
                     [*rejects, *late]),
                 counts=beam.pvalue.AsList(written), late=beam.pvalue.AsList(rejected)))
    remove_tree(join(common.output_dir, TMP_DIRNAME))
    _LOG.info("volumes: %d planned, %d files rejected", len(jobs), len(rejects))
    return _volumes.read_manifest(common.output_dir)


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 converted, 2 a usage error, 3 converted but a decoder failed on some series.

    The driver runs in a supervised child (`recovery.supervise`): a file that
    crashes or hangs it while planning is quarantined and the run goes on
    without it (--resume).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        options = args.pipeline_options(argv, ConvertOptions).view_as(ConvertOptions)
        writing = WritingOptions(file_timeout=options.file_timeout)
    except (ValueError, args.UsageError) as e:
        print(f"shardsmith convert --volumes: error: {e}", file=sys.stderr)
        return 2
    if not options.output_dir:
        return _attempt(argv)  # The error, in one sentence.
    return recovery.supervise(
        _attempt, argv, quarantine=guard.Quarantine(guard.quarantine_path(options.output_dir)),
        validation=None, timeout=writing.file_timeout, resume_argv=_resume_argv)


def _attempt(argv: list[str]) -> int:
    """One run in this process: its exit status (see `main`)."""
    try:
        manifest = run(argv)
    except (ValueError, FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError,
            args.UsageError) as e:
        print(f"shardsmith convert --volumes: error: {e}", file=sys.stderr)
        return 2
    print(f"volumes: {sum(s['records'] for s in manifest['splits'].values())} written, "
          f"{len(manifest['rejects'])} files rejected")
    counts: dict[str, int] = {}
    for r in manifest["rejects"]:
        counts[r["reason"]] = counts.get(r["reason"], 0) + 1
    sentence = guard.failure_sentence(counts)
    if sentence:
        print(f"shardsmith convert --volumes: {sentence}", file=sys.stderr)
        return 3
    return 0


def _resume_argv(argv: list[str]) -> list[str]:
    """The arguments of the attempt after a crash: --resume (its quarantine kept) instead of --overwrite."""
    out = [a for a in argv if a != "--overwrite"]
    return out if "--resume" in out else [*out, "--resume"]
