"""Converts a folder of images into a validated, shuffled, sharded TFRecord dataset.

Locally, on every core:

  python -m beam_jobs.convert \\
      --input_dir ./photos --output_dir ./dataset \\
      --split train=0.8,validation=0.1,test=0.1

On Dataflow (workers install shardsmith from setup.py):

  python -m beam_jobs.convert \\
      --input_dir gs://BUCKET/photos --output_dir gs://BUCKET/dataset \\
      --runner DataflowRunner --project PROJECT --region REGION \\
      --temp_location gs://BUCKET/tmp --setup_file ./setup.py

The input is `ROOT/<class>/...`, `ROOT/<split>/<class>/...` or a flat folder
with a `--labels_csv`. The output folder holds `{split}-{i:05d}-of-{n:05d}.tfrecord`
shards, `rejects.jsonl` (every input not converted, with its reason),
`normalized.jsonl` (every input stored other than byte for byte, with what was
done) and `manifest.json`, written last.

Only paths go through Beam's shuffle: each shard's worker reads, validates and
writes its own images, one at a time, so memory stays bounded whatever the size
of the dataset. On the local runner, shards of a folder of 1,000 files or more
are written by one worker process per core (`--worker_processes`), so that
the Python work of validation and encoding is not held to one core by the GIL.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys

if __name__ == "__main__":
    # Run as a program (`python -m beam_jobs.convert`): Beam logs a notice about
    # BigQuery clients on the root logger as it is imported, below, before
    # `main` runs; the console's logging must be in place first. Imported as
    # a module (`shardsmith convert`, tests), this does nothing.
    from conversion import console as _console

    _console.configure_logging(_console.is_verbose(sys.argv[1:]))

import apache_beam as beam  # noqa: E402 (after the logging of a program run)
from apache_beam.options.pipeline_options import WorkerOptions

from beam_jobs import _append, _runner, args
from beam_jobs._finalize import FinalizeFn
from beam_jobs._options import ConversionConfig, ConvertOptions, config_from_options
from conversion.lock import LockError
from conversion.output_folder import (check_output, is_finished, prepare_append, prepare_output, read_manifest,
                                      summarize)
from conversion.progress import ProgressBar
from beam_jobs._shards import ImagesToTFRecords
from beam_jobs._write import RECEIPTS_DIRNAME, WriteShardFn
from conversion import console, elements, guard, plan as _plan, processes as _processes, recovery
from conversion.examples import kind_for, record_schema
from conversion.planning import build_plan, group_section
from conversion.shard_maker import ShardMaker, ShardSpec
from conversion.shard_plans import write_shard_plans

__all__ = ["ConvertOptions", "ConversionConfig", "config_from_options", "ConvertImages", "run", "main", "summarize", "help_text",
           "EXIT_FILES_FAILED"]

_LOG = logging.getLogger("shardsmith.convert")
# Worker processes by default only from this many files: each costs ~0.6 s of
# CPU to start, and ~2 s more and ~300 MB with TensorFlow's decode ops.
_PROCESSES_MIN_FILES = 1000
# ... and only for a folder whose validation is mostly Python work: rasters
# and DICOM files (tifffile, pydicom, numpy), or small images (a fixed ~0.1 ms
# per file around TensorFlow's decode). A photo's decode releases the GIL
# for most of its time: threads already use every core (2,000 ~125 KB photos
# on 2 cores: 6.8 s in threads, 7.8 s with 2 processes; 100,000 1.4 KB JPEGs:
# 15.2 s and 13.4 s; 20,000 13-band rasters: 37.5 s and 13.1 s).
_PYTHON_BOUND_SUFFIXES = (".tif", ".tiff", ".dcm", ".dicom")
# ... or from this many planned bytes of scenes' patches (--raster_patch): one scene is
# one file, but its work items are Python-bound (band statistics, nodata shares,
# encoding) while their tiles decode (a 6144 x 6144 x 13 uint16 scene, 981 MB, on 2
# cores: 22.5 s in threads, 13.8 s with 2 processes).
_PROCESSES_MIN_SCENE_BYTES = 64 << 20
_SMALL_FILE_BYTES = 32 * 1024
# Files that a worker process reads without TensorFlow's decoders (rasters
# stored raw); any other file has it load them while the driver plans.
_RASTER_SUFFIXES = (".tif", ".tiff")

_EXAMPLE = """\
    example:
      shardsmith convert --input_dir ./photos --output_dir ./dataset \\
          --split train=0.8,validation=0.1,test=0.1

    Every Beam option works too (--runner DataflowRunner --project ... --setup_file ./setup.py)."""


class ConvertImages(beam.PTransform):
    """The whole conversion of a plan: shards, rejects, and the manifest last.

    Args:
      plan: The `Plan` of the conversion (labels, splits, shards of each file).
      config: The `ConversionConfig`.
      plan_paths: The shard plan files of `plan` (`conversion.shard_plans.write_shard_plans`).
      spec: The `ShardSpec` every shard is written with (the driver's maker's);
        by default the one `plan` and `config` make, for a run of its own.
      append: With --append, `FinalizeFn`'s `append` (`beam_jobs._append.AppendRun.finalize_args`).
    """

    def __init__(self, plan: _plan.Plan, config: ConversionConfig, plan_paths: list[str],
                 spec: ShardSpec | None = None, append: dict | None = None):
        super().__init__()
        self._plan = plan
        self._config = config
        self._plan_paths = plan_paths
        self._append = append
        spec = spec or _planned_spec(ShardSpec(config.output_dir, config.validation), plan, config)
        self._write = ImagesToTFRecords(spec)

    def expand(self, pbegin):
        plan, config = self._plan, self._config
        written = (
            pbegin
            | "ShardPlans" >> beam.Create(self._plan_paths)  # path of a shard's plan
            | "ImagesToTFRecords" >> self._write
        )
        listing_rejects = (
            pbegin
            | "ListingProblems" >> beam.Create(plan.problems, reshuffle=False)
            | "AsRejects" >> beam.Map(elements.problem_to_reject)  # Reject
        )
        rejects = (listing_rejects, written[WriteShardFn.REJECTED]) | "AllRejects" >> beam.Flatten()
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "WriteManifest" >> beam.ParDo(
                FinalizeFn(
                    output_dir=config.output_dir,
                    class_names=plan.class_names,
                    shard_counts=plan.shard_counts,
                    num_found=plan.num_found,
                    options=config.manifest_options(plan.split_source),
                    max_reject_fraction=config.max_reject_fraction,
                    features=record_schema(config.validation, _targets(plan)).to_json(),
                    extra={**group_section(plan, config),
                           **kind_for(config.validation).manifest_section(plan, config)},
                    targets=plan.targets_section,
                    append=self._append,
                ),
                shards=beam.pvalue.AsList(written.shards),
                rejects=beam.pvalue.AsList(rejects),
                normalized=beam.pvalue.AsList(written[WriteShardFn.NORMALIZED]),
            )
        )


def _targets(plan: _plan.Plan) -> tuple[str, ...]:
    """The target kinds of the plan's records (`schemas.TARGET_KINDS`, `conversion.targets.TARGETS`)."""
    return tuple(plan.target_kinds)


def run(argv: list[str] | None = None, *, wait: bool = True):
    """Runs the conversion.

    Args:
      argv: Command-line arguments (ConvertOptions and Beam's options).
      wait: Wait for the pipeline to finish and log the summary.

    Returns:
      The `PipelineResult`.

    Raises:
      ValueError, FileNotFoundError, FileExistsError, PermissionError: For bad
        arguments (an unknown one too: `args.UsageError`), input or output,
        before any work starts.
    """
    argv = sys.argv[1:] if argv is None else list(argv)  # As PipelineOptions(None) reads them.
    if "--volumes" in argv:
        from beam_jobs import convert_volumes

        _refuse_volumes_append(argv)
        return convert_volumes.run(argv, wait=wait)
    options = args.pipeline_options(argv, ConvertOptions)
    config = config_from_options(options)
    if config.append:
        # One writer at a time: a second append is refused, naming the first (`conversion.lock`).
        with _append.holding_lock(config.output_dir):
            return _run(options, config, wait=True)
    return _run(options, config, wait=wait)


def _run(options, config: ConversionConfig, *, wait: bool):
    """`run` once the options are read (and, with --append, the output folder locked)."""
    runner = _runner.make_runner(options)
    # The shards' maker owns the worker processes (started by the driver only when it waits
    # for the pipeline; otherwise the shard writers start their own).
    maker = ShardMaker.shared(ShardSpec(config.output_dir, config.validation, config.writing))
    progress = None
    appending = None
    try:
        appending = _append.AppendRun(config) if config.append else None
        try:
            plan, config = _plan_and_settle(config, options, maker, start=wait, appending=appending)
        except _append.NothingNew as e:
            _LOG.warning("%s", _append.nothing_new_text(config.output_dir, appending.base, e.listing))
            # What a killed append left (its new shards, its temporary folder) goes.
            prepare_append(config.output_dir, _held_files(appending.base.manifest), resume=False)
            return None
        if runner is not None and wait and ProgressBar.wanted():
            # The bar replaces the per-shard lines on a terminal.
            options.view_as(WorkerOptions).sdk_harness_log_level_overrides = {"shardsmith": "WARNING"}
            _LOG.setLevel(logging.WARNING)
            progress = ProgressBar(config.output_dir, len(plan.files), RECEIPTS_DIRNAME)
            progress.start()
        result = _run_pipeline(plan, config, options, runner, maker,
                               append=None if appending is None else appending.finalize_args())
        if wait:
            result.wait_until_finish()
    except BaseException:
        maker.abort()  # Ctrl-C or a failed shard: no child finishes its shard first.
        raise
    finally:
        maker.release()  # The shard writers, done, have released it too.
        if progress is not None:
            progress.stop()
            _LOG.setLevel(logging.NOTSET)
    if wait:
        _LOG.info("%s", summarize(config.output_dir))
        if appending is not None and appending.base is not None:
            _LOG.info("%s", _append.version_summary(read_manifest(config.output_dir)))
    return result


def _held_files(manifest) -> set[str]:
    """The shard and index files a manifest names: an append never touches them."""
    return {name for info in manifest.splits.values() for s in info.shards for name in (s.file, s.index_file)}


def _plan_and_settle(config: ConversionConfig, options, maker: ShardMaker, start: bool,
                     appending: _append.AppendRun | None = None):
    """Lists and plans the input, and settles the worker processes; the plan and the settled config.

    The worker processes start once the files are listed (with `start`):
    they load their decoders while the driver plans and builds the pipeline.
    The maker's spec is then completed with what the plan decided. With
    --append (`appending`), only the files the dataset does not hold are
    planned, into the new version's shards.

    Raises:
      beam_jobs._append.NothingNew: With --append, when every listed file is held.
    """
    asked = config.writing.worker_processes

    def on_listed(files):
        if start:  # The shards are not known yet: as many as the listed files call for.
            # Rasters stored raw need no TensorFlow decoders: not loaded for a folder of TIFFs only.
            decoders = any(not f.rel_path.lower().endswith(_RASTER_SUFFIXES) for f in files)
            maker.start_processes(_worker_processes(asked, files, None, options), decoders)

    first = appending is None or appending.base is None
    # --append into a folder without a dataset: a first conversion, which replaces what an
    # unfinished one left there (or, with --resume, finishes it).
    overwrite = config.overwrite or (appending is not None and not config.writing.resume)
    if first:
        # A full output folder is refused before the input is listed (minutes on a large one).
        check_output(config.output_dir, overwrite=overwrite, resume=config.writing.resume)
    plan = build_plan(config, on_listed=on_listed,
                      select=None if appending is None else appending.select,
                      known_classes=None if appending is None else appending.known_classes)
    if appending is not None:
        # Before anything is written: the new records must be like the dataset's.
        appending.check_plan(plan, record_schema(config.validation, _targets(plan)).to_json())
    if first:
        prepare_output(config.output_dir, overwrite=overwrite, resume=config.writing.resume)
    else:
        prepare_append(config.output_dir, _held_files(appending.base.manifest), resume=config.writing.resume)
    if appending is not None:
        appending.write_pending(plan)
        config = dataclasses.replace(config, writing=dataclasses.replace(
            config.writing, version=appending.version))
    # What its kind's shard writers read beside the shard plans (a location's plan, for time series).
    kind_for(config.validation).prepare_output(plan, config.output_dir)
    # Fewer shards than cores: fewer processes.
    processes = _worker_processes(asked, plan.files, sum(plan.shard_counts.values()), options)
    if start:
        maker.start_processes(processes)
    if processes and not config.writing.dedup:
        # The shard writer keeps every worker busy from one thread; with
        # --dedup, hashing every file needs the runner's threads.
        _runner.run_in_one_thread(options)
    config = dataclasses.replace(
        config, writing=dataclasses.replace(
            config.writing, worker_processes=processes,
            # On a Dask cluster each worker writes its shards in child processes of its own,
            # so that a decoder's crash costs its file, not the worker (`WritingOptions.isolated`).
            isolated=not processes and asked is None and _runner.is_dask(options)))
    maker.spec = _planned_spec(maker.spec, plan, config)
    return plan, config


def _run_pipeline(plan: _plan.Plan, config: ConversionConfig, options, runner, maker: ShardMaker,
                  append: dict | None = None):
    """Builds and starts the pipeline of a plan, the maker's first shards started early; its result."""
    plan_paths = write_shard_plans(plan.files, config.output_dir)
    first = []
    if maker.processes and not config.writing.resume and not config.writing.dedup:
        # One shard per worker process starts now: they write while Beam builds and starts
        # the pipeline (~1-2 s of the driver's wall time on busy cores), whose shard writer
        # then takes their outcomes. Not with --resume: its receipts decide what is written;
        # nor with --dedup: the shards' files are known once the pipeline compared them.
        first = _first_shards(plan.files, maker.processes)
    # The shard writers read their files from the plan files: the driver need
    # not hold one object per image while the pipeline runs (~0.7 KB each,
    # 70 MiB of peak memory at 100,000 images).
    plan = dataclasses.replace(plan, files=())
    convert = ConvertImages(plan, config, plan_paths, maker.spec, append=append)
    if first:
        maker.start_early(first)
    del first  # Their planned files, as the plan's: not held while the pipeline runs.
    pipeline = beam.Pipeline(runner=runner, options=options)
    _ = pipeline | "ConvertImages" >> convert
    return pipeline.run()


def _planned_spec(spec: ShardSpec, plan: _plan.Plan, config: ConversionConfig) -> ShardSpec:
    """`spec` completed with what the plan decided (classes, shards, targets) and the settled writing."""
    return dataclasses.replace(
        spec, writing=config.writing, num_classes=len(plan.class_names),
        total_shards=sum(plan.shard_counts.values()), targets=_targets(plan))


def _first_shards(files, count: int) -> list[list]:
    """The PlannedFiles of the plan's first `count` shards (in (split, shard) order), a list each."""
    shards: list[list] = []
    key = None
    for f in files:  # In (split, shard, order) order (`conversion.plan.make_plan`).
        if (f.split, f.shard) != key:
            if len(shards) == count:
                break
            key = (f.split, f.shard)
            shards.append([])
        shards[-1].append(f)
    return shards


def _worker_processes(asked: int | None, files, shards: int | None, options) -> int:
    """How many worker processes write the shards: `asked`, or what suits the runner and input.

    By default: one per core where the runner runs its DoFns in this
    process's threads (Beam's local runner) on a machine of several cores,
    for `_PROCESSES_MIN_FILES` files or more, most of them Python-bound
    (`_python_bound`), or scenes' work items of `_PROCESSES_MIN_SCENE_BYTES`
    or more, and at least two shards (None: not planned yet);
    otherwise none (the runner's threads write them: Dataflow and Beam's
    'multi_processing' mode already give each core a process).

    Args:
      asked: --worker_processes, or None.
      files: The listed or planned files (`.rel_path`, `.size`).
      shards: Shards planned, or None.
      options: The pipeline options, after `_runner.make_runner`.
    """
    if asked is not None:
        return asked
    cores = os.cpu_count() or 1
    if _runner.in_process_threads(options) < 2 or cores < 2:
        return 0
    if len(files) < _PROCESSES_MIN_FILES and _scene_bytes(files) < _PROCESSES_MIN_SCENE_BYTES:
        return 0
    if not _python_bound(files):
        return 0
    if shards is None:
        return cores
    return min(cores, shards) if shards >= 2 else 0


def _scene_bytes(files) -> int:
    """Planned decoded bytes of the scenes' work items among planned `files` (0 for listed files)."""
    return sum(f.size for f in files if getattr(f, "patch_rows", None) is not None)


def _python_bound(files) -> bool:
    """Whether validating most of `files` is Python work (see `_PYTHON_BOUND_SUFFIXES`)."""
    bound = sum(1 for f in files if f.size < _SMALL_FILE_BYTES
                or f.rel_path.lower().endswith(_PYTHON_BOUND_SUFFIXES))
    return 2 * bound >= len(files)


def help_text() -> str:
    """The text of `shardsmith convert --help`: every option and an example."""

    def add_arguments(parser):
        ConvertOptions._add_argparse_args(parser)
        _runner.ConsoleOptions._add_argparse_args(parser)

    return args.help_text("shardsmith convert", __doc__.splitlines()[0], _EXAMPLE, add_arguments,
                          required=("--input_dir", "--output_dir"))


# The exit status of a conversion that finished, and wrote its manifest, but on some of whose
# files shardsmith or a decoder failed (internal_error, decoder_crashed, timeout).
EXIT_FILES_FAILED = 3


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the conversion; returns its exit status.

    0: converted (rejects, if any, are the files' own faults); 1: failed (no
    usable dataset: too many rejects, a failure not tied to one file); 2: a
    usage error (one sentence); 3 (`EXIT_FILES_FAILED`): converted, but
    shardsmith or a decoder failed on some files, which are listed in
    rejects.jsonl (`internal_error`, `decoder_crashed`, `timeout`).
    """
    argv = sys.argv[1:] if argv is None else argv
    with console.entry_point(argv):  # Logging, and quiet C++ libraries.
        return _main(argv)


def _refuse_volumes_append(argv) -> None:
    """--volumes has its own pipeline, which does not grow a dataset yet: refused before any work."""
    if "--append" in argv:
        raise ValueError("--append does not grow a dataset of --volumes yet: convert the grown folder "
                         "with --overwrite.")


def _main(argv: list[str]) -> int:
    if "--volumes" in argv:
        # DICOM series and NIfTI files as volumes: their own pipeline (issue 36).
        from beam_jobs import convert_volumes

        try:
            _refuse_volumes_append(argv)
        except ValueError as e:
            print(f"shardsmith convert: error: {e}", file=sys.stderr)
            return 2

        return convert_volumes.main(argv)
    if args.print_help_if_asked(argv, help_text):
        return 0
    try:
        options = args.pipeline_options(argv, ConvertOptions)
        config = config_from_options(options)
    except (ValueError, FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError) as e:
        print(f"shardsmith convert: error: {e}", file=sys.stderr)
        return 2
    if config.writing.resume and not config.append and is_finished(config.output_dir):
        print(f"shardsmith convert: nothing to do: {config.output_dir} is a finished dataset (its "
              "manifest is written last); --overwrite converts it again.",
              file=sys.stderr)
        return 0
    # On the local runner the driver validates files in its threads, and on
    # any runner it reads DICOM headers while planning: a decoder that crashes
    # or hangs there must not end the job. This process forks before any work
    # and carries on without such a file (`recovery.supervise`).
    supervised = functools.partial(
        recovery.supervise,
        functools.partial(_attempt, output_dir=config.output_dir), argv,
        quarantine=guard.Quarantine(guard.quarantine_path(config.output_dir)),
        validation=config.validation, timeout=config.writing.file_timeout, resume_argv=_resume_argv,
    )
    if not config.append:
        return supervised()
    try:
        # Held by the command's process over every attempt (one that goes on after a
        # crash is a child of it): a second append on this folder is refused meanwhile.
        with _append.holding_lock(config.output_dir):
            return supervised()
    except LockError as e:
        print(f"shardsmith convert: error: {e}", file=sys.stderr)
        return 2


def _attempt(argv: list[str], output_dir: str) -> int:
    """One run of the conversion in this process; its exit status (0, 1, 2, or 3: see `main`).

    `output_dir` is `argv`'s, already parsed (a resumed run's arguments differ only in --resume).
    """
    try:
        run(argv)
    except (ValueError, FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError) as e:
        print(f"shardsmith convert: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # The runner wraps errors raised inside workers.
        message = _conversion_error_message(e)
        if message is None:
            raise
        print(f"shardsmith convert: error: {message}", file=sys.stderr)
        return 1
    sentence = guard.failure_sentence(read_manifest(output_dir).rejects)
    if sentence:
        print(f"shardsmith convert: {sentence}", file=sys.stderr)
        return EXIT_FILES_FAILED
    return 0


def _resume_argv(argv: list[str]) -> list[str]:
    """The arguments of the run that goes on after a crash: --resume instead of --overwrite."""
    out = [a for a in argv if a != "--overwrite"]
    return out if "--resume" in out else [*out, "--resume"]


def _conversion_error_message(e: BaseException) -> str | None:
    """The ConversionError (or WorkerDied) text inside a runner's wrapped exception, if any."""
    for line in str(e).splitlines():
        for kind in ("ConversionError:", "WorkerDied:"):
            if kind in line:
                return line.split(kind, 1)[1].strip()
    if isinstance(e, (elements.ConversionError, _processes.WorkerDied)):
        return str(e)
    return None


if __name__ == "__main__":
    console.exit_program(main())
