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
    # BigQuery clients on the root logger as it is imported; the console's
    # logging must be in place first. Imported as a module (`shardsmith
    # convert`, tests), this does nothing.
    from conversion import console as _console

    _console.configure_logging(_console.is_verbose(sys.argv[1:]))

# Beam is not imported here: a plain local run lists, plans and starts its shard
# writers first (`_startup.early_config`), and imports Beam while they load their
# decoders; any other run imports it as it reads its options (`_beam_options`).
from schemas.tfds_metadata import tfds_files

from beam_jobs import _startup, args
from conversion.config import ConversionConfig
from conversion.files import write_atomically
from conversion.lock import LockError
from conversion.output_folder import (check_output, is_finished, prepare_append, prepare_output, read_manifest,
                                      summarize)
from conversion.progress import ProgressBar
from conversion.receipts import RECEIPTS_DIRNAME
from conversion import append_run, console, guard, plan as _plan, recovery
from conversion.examples import kind_for, record_schema
from conversion.planning import build_plan
from conversion.shard_maker import ShardMaker, ShardSpec, needs_decoders, planned_spec, worker_processes
from conversion.shard_plans import write_shard_plans

__all__ = ["ConvertOptions", "ConversionConfig", "config_from_options", "ConvertImages", "run", "main", "summarize", "help_text",
           "EXIT_FILES_FAILED"]

_LOG = logging.getLogger("shardsmith.convert")
_EXAMPLE = """\
    example:
      shardsmith convert --input_dir ./photos --output_dir ./dataset \\
          --split train=0.8,validation=0.1,test=0.1

    Every Beam option works too (--runner DataflowRunner --project ... --setup_file ./setup.py)."""
# Names of this module that need Beam, imported when first asked for.
_WITH_BEAM = {"ConvertImages": "beam_jobs._convert_images", "ConvertOptions": "beam_jobs._options",
              "config_from_options": "beam_jobs._options"}


def __getattr__(name):
    if name in _WITH_BEAM:
        import importlib

        return getattr(importlib.import_module(_WITH_BEAM[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _beam_options(argv: list[str]):
    """Beam's `PipelineOptions` of `argv` (Beam imported for the run first: `_startup.import_beam`).

    Raises:
      args.UsageError: For an argument no option takes.
    """
    _startup.import_beam(argv)
    from beam_jobs import _runner  # noqa: F401 (its `ConsoleOptions` declare --verbose to Beam's parser)
    from beam_jobs._options import ConvertOptions

    return args.pipeline_options(argv, ConvertOptions)


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
    # A plain local run reads its flags without Beam, which it imports once its
    # shard writers have started (`_run`); any other reads Beam's options now.
    config = _startup.early_config(argv) if wait else None
    if config is not None:
        return _run(argv, None, config, wait=True)
    from beam_jobs._options import config_from_options

    options = _beam_options(argv)
    config = config_from_options(options)
    if config.append:
        # One writer at a time: a second append is refused, naming the first (`conversion.lock`).
        with append_run.holding_lock(config.output_dir):
            return _run(argv, options, config, wait=True)
    return _run(argv, options, config, wait=wait)


def _run(argv: list[str], options, config: ConversionConfig, *, wait: bool):
    """`run` once the flags are read (and, with --append, the output folder locked).

    `options` is None where Beam is not imported yet (`_startup.early_config`):
    the runner is then Beam's local one in its default mode (one thread per
    core), and Beam is imported once the first shards are started.
    """
    runner = None
    early = options is None
    # Threads of this process that run the runner's shard writers: what `make_runner`
    # gives the local runner by default where Beam is not imported yet.
    threads, dask = os.cpu_count() or 1, False
    if options is not None:
        from beam_jobs import _runner

        runner = _runner.make_runner(options)
        threads, dask = _runner.in_process_threads(options), _runner.is_dask(options)
    # The shards' maker owns the worker processes (started by the driver only when it waits
    # for the pipeline; otherwise the shard writers start their own).
    maker = ShardMaker.shared(ShardSpec(config.output_dir, config.validation, config.writing))
    progress = None
    appending = None
    try:
        appending = append_run.AppendRun(config) if config.append else None
        try:
            plan, config = _plan_and_settle(config, threads, dask, maker, start=wait, appending=appending,
                                            before_beam=options is None)
        except append_run.NothingNew as e:
            _LOG.warning("%s", append_run.nothing_new_text(config.output_dir, appending.base, e.listing))
            # What a killed append left (its new shards, its temporary folder) goes, and TFDS's
            # metadata is the manifest's again (a run killed between the two left the older).
            prepare_append(config.output_dir, _held_files(appending.base.manifest), resume=False)
            for name, text in tfds_files(appending.base.manifest).items():
                write_atomically(config.output_dir, name, text.encode())
            return None
        num_files = len(plan.files)
        plan, plan_paths = _start_shards(plan, config, maker)
        if options is None:
            # Now: the worker processes load their decoders and write the first shards meanwhile.
            options = _beam_options(argv)
        from beam_jobs import _runner  # After `_beam_options`: it imports Beam.

        if early:
            runner = _runner.make_runner(options)
        if config.writing.worker_processes and not config.writing.dedup:
            # The shard writer keeps every worker busy from one thread; with
            # --dedup, hashing every file needs the runner's threads.
            _runner.run_in_one_thread(options)
        if runner is not None and wait and ProgressBar.wanted():
            from apache_beam.options.pipeline_options import WorkerOptions

            # The bar replaces the per-shard lines on a terminal.
            options.view_as(WorkerOptions).sdk_harness_log_level_overrides = {"shardsmith": "WARNING"}
            _LOG.setLevel(logging.WARNING)
            progress = ProgressBar(config.output_dir, num_files, RECEIPTS_DIRNAME)
            progress.start()
        result = _run_pipeline(plan, plan_paths, config, options, runner, maker,
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
            grown = read_manifest(config.output_dir)
            if grown.latest_version == appending.version:  # Else none added (`Finalizer`): said there.
                _LOG.info("%s", append_run.version_summary(grown))
    return result


def _held_files(manifest) -> set[str]:
    """The shard and index files a manifest names: an append never touches them."""
    return {name for info in manifest.splits.values() for s in info.shards for name in (s.file, s.index_file)}


def _plan_and_settle(config: ConversionConfig, threads: int, dask: bool, maker: ShardMaker, start: bool,
                     appending: append_run.AppendRun | None = None, before_beam: bool = False):
    """Lists and plans the input, and settles the worker processes; the plan and the settled config.

    The worker processes start once the files are listed (with `start`):
    they load their decoders while the driver plans, builds the pipeline
    and, `before_beam`, imports Beam. The maker's spec is then completed
    with what the plan decided. With --append (`appending`), only the files
    the dataset does not hold are planned, into the new version's shards.

    Args:
      threads: Threads of this process that run the runner's shard writers
        (`_runner.in_process_threads`).
      dask: Whether the runner is a Dask cluster's.

    Raises:
      conversion.append_run.NothingNew: With --append, when every listed file is held.
    """
    asked = config.writing.worker_processes

    def on_listed(files):
        if start:  # The shards are not known yet: as many as the listed files call for.
            # Before Beam's import they are forks of this process: they start with its modules.
            maker.start_processes(worker_processes(asked, files, None, threads), needs_decoders(files),
                                  fork=before_beam)

    first = appending is None or appending.base is None
    # --append into a folder without a dataset: a first conversion, which replaces what an
    # unfinished one left there (or, with --resume, finishes it).
    overwrite = config.overwrite or (appending is not None and not config.writing.resume)
    if first:
        # A full output folder is refused before the input is listed (minutes on a large one).
        check_output(config.output_dir, overwrite=overwrite, resume=config.writing.resume)
    plan = build_plan(config, on_listed=on_listed,
                      select=None if appending is None else appending.select,
                      known_classes=None if appending is None else appending.known_classes,
                      held=None if appending is None or appending.base is None else appending.base.manifest,
                      appending=appending)
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
    kind_for(config.validation).prepare_output(plan, config)
    # Fewer shards than cores: fewer processes.
    processes = worker_processes(asked, plan.files, sum(plan.shard_counts.values()), threads)
    if start:
        maker.start_processes(processes)
    config = dataclasses.replace(
        config, writing=dataclasses.replace(
            config.writing, worker_processes=processes,
            # On a Dask cluster each worker writes its shards in child processes of its own,
            # so that a decoder's crash costs its file, not the worker (`WritingOptions.isolated`).
            isolated=not processes and asked is None and dask))
    maker.spec = planned_spec(maker.spec, plan, config)
    return plan, config


def _start_shards(plan: _plan.Plan, config: ConversionConfig, maker: ShardMaker):
    """Writes the plan's shard plans and starts its first shards early; (the plan without its files, their paths)."""
    plan_paths = write_shard_plans(plan.files, config.output_dir)
    # The shard writers read their files from the plan files: the driver need
    # not hold one object per image while the pipeline runs (~0.7 KB each,
    # 70 MiB of peak memory at 100,000 images).
    plan = dataclasses.replace(plan, files=())
    if maker.processes and not config.writing.resume and not config.writing.dedup:
        # One shard per worker process starts now: they write while Beam builds and starts
        # the pipeline (~1-2 s of the driver's wall time on busy cores; more where Beam is
        # still to import), whose shard writer then takes their outcomes. Not with --resume:
        # its receipts decide what is written; nor with --dedup: the shards' files are known
        # once the pipeline compared them. The plan files are in (split, shard) order, the
        # plan's: its first shards.
        maker.start_early_plans(plan_paths[:maker.processes])
    return plan, plan_paths


def _run_pipeline(plan: _plan.Plan, plan_paths: list[str], config: ConversionConfig, options, runner,
                  maker: ShardMaker, append: dict | None = None):
    """Builds and starts the pipeline of a plan (its shards' plan files written, the first started); its result."""
    import apache_beam as beam

    from beam_jobs._convert_images import ConvertImages

    convert = ConvertImages(plan, config, plan_paths, maker.spec, append=append)
    pipeline = beam.Pipeline(runner=runner, options=options)
    _ = pipeline | "ConvertImages" >> convert
    return pipeline.run()


def help_text() -> str:
    """The text of `shardsmith convert --help`: every option and an example."""
    from conversion.flags import add_flags

    def add_arguments(parser):
        add_flags(parser)  # `ConvertOptions`' flags and the console's (`_runner.ConsoleOptions`'), without Beam.
        parser.add_argument(console.VERBOSE_FLAG, action="store_true", help=console.VERBOSE_HELP)

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


def _main(argv: list[str]) -> int:
    if args.print_help_if_asked(argv, help_text):
        return 0
    try:
        config = _startup.early_config(argv)  # A plain local run: read without Beam (see `run`).
        if config is None:
            from beam_jobs._options import config_from_options

            config = config_from_options(_beam_options(argv))
    except (ValueError, FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError) as e:
        print(f"shardsmith convert: error: {e}", file=sys.stderr)
        return 2
    quarantine = guard.Quarantine(guard.quarantine_path(config.output_dir))
    if config.writing.resume and not config.append and is_finished(config.output_dir):
        # The mend reads headers and decodes as a conversion does: supervised the same way (a file
        # that crashes or hangs its process is quarantined, and the mend goes on without it).
        return recovery.supervise(
            lambda _: _mend_finished(config), argv, quarantine=quarantine, validation=config.validation,
            timeout=config.writing.file_timeout, resume_argv=lambda a: a, memory=config.writing.memory_bound)
    # On the local runner the driver validates files in its threads, and on
    # any runner it reads DICOM headers while planning: a decoder that crashes
    # or hangs there must not end the job. This process forks before any work
    # and carries on without such a file (`recovery.supervise`).
    supervised = functools.partial(
        recovery.supervise,
        functools.partial(_attempt, output_dir=config.output_dir), argv,
        quarantine=quarantine, validation=config.validation, timeout=config.writing.file_timeout,
        resume_argv=_resume_argv, memory=config.writing.memory_bound,
    )
    if not config.append:
        return supervised()
    try:
        # Held by the command's process over every attempt (one that goes on after a
        # crash is a child of it): a second append on this folder is refused meanwhile.
        with append_run.holding_lock(config.output_dir):
            return supervised()
    except LockError as e:
        print(f"shardsmith convert: error: {e}", file=sys.stderr)
        return 2


def _mend_finished(config: ConversionConfig) -> int:
    """--resume on a finished dataset: writes again the shards damaged since, and nothing else (`conversion.mend`)."""
    from conversion import mend

    manifest = read_manifest(config.output_dir)
    damaged = mend.damaged_shards(config.output_dir, manifest)
    if not damaged:
        print(f"shardsmith convert: nothing to do: {config.output_dir} is a finished dataset (its "
              "manifest is written last) and every shard matches it; --overwrite converts it again.",
              file=sys.stderr)
        return 0
    print(f"shardsmith convert: {len(damaged)} shard(s) of the finished dataset {config.output_dir} differ "
          f"from its manifest ({', '.join(sorted(damaged))}): writing them again from their sources.",
          file=sys.stderr)
    problems = mend.mend(config, manifest, damaged, _targets)
    for problem in problems:
        print(f"shardsmith convert: error: {problem}", file=sys.stderr)
    return 1 if problems else 0


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
        message = recovery.failure_message(e)
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


if __name__ == "__main__":
    console.exit_program(main())
