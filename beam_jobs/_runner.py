"""What every shardsmith pipeline does the same way: runner choice and the console flag.

The Dask translation (`--runner DaskRunner`) lives in `_dask`.
"""

from __future__ import annotations

import functools
import os

from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
    WorkerOptions,
)

from compat import beam_internals
from conversion import console

__all__ = ["make_runner", "is_dask", "in_process_threads", "run_in_one_thread", "ConsoleOptions"]

_DASK_RUNNER_NAMES = ("DaskRunner", "dask", "apache_beam.runners.dask.dask_runner.DaskRunner")


def make_runner(options: PipelineOptions):
    """The runner to pass to `beam.Pipeline`, or None to let Beam pick by name.

    Also quiets local worker processes: they log at WARNING, except
    shardsmith's own progress lines.

    Raises:
      ImportError: If `--runner DaskRunner` is asked for without dask installed.
    """
    worker = options.view_as(WorkerOptions)
    if worker.default_sdk_harness_log_level is None:
        worker.default_sdk_harness_log_level = "WARNING"
        worker.sdk_harness_log_level_overrides = {"shardsmith": "INFO"}
    runner = options.view_as(StandardOptions).runner
    if runner in (None, "DirectRunner", "direct"):
        given = options.get_all_options(drop_default=True)
        if "direct_running_mode" not in given and "direct_num_workers" not in given:
            # Every core by default. Threads, not processes: TensorFlow's and
            # Pillow's decoders release the GIL, and each worker process would
            # import TensorFlow again (seconds of CPU, ~0.5 GB each).
            direct = options.view_as(DirectOptions)
            direct.direct_running_mode = "multi_threading"
            direct.direct_num_workers = os.cpu_count() or 1
        # The DirectRunner first tries the Prism runner, which downloads a
        # binary; offline it waits and fails. Beam's in-process portable
        # runner is what it falls back to: use it straight away.
        return _local_runner_class()()
    if runner in _DASK_RUNNER_NAMES:
        # Beam knows no short name for its Dask runner, and its translation
        # mixes up the outputs of multi-output ParDos: use ours (`_dask`).
        try:
            import dask.distributed  # noqa: F401
            # Registers --dask_client_address & co. with the options parser.
            from apache_beam.runners.dask import dask_runner  # noqa: F401
        except ImportError as e:
            raise ImportError(
                f"--runner {runner} needs dask[distributed]: pip install 'dask[distributed]' "
                f"(import failed: {e})."
            ) from e
        from beam_jobs._dask import DaskClusterRunner

        return DaskClusterRunner()
    return None


@functools.cache
def _local_runner_class():
    """Beam's in-process portable runner, whose workers do not flush on a timer while it runs.

    Their timed flushes lose elements (`compat.beam_internals.untimed_local_flushes`).
    The runner runs a pipeline to its end inside `run_pipeline`, so the switch
    is scoped to that call. Imported here, not at the module's import: the
    runner's modules are not needed to parse options.
    """
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    class BatchFnApiRunner(FnApiRunner):
        def run_pipeline(self, pipeline, options):
            with beam_internals.untimed_local_flushes():
                return super().run_pipeline(pipeline, options)

    return BatchFnApiRunner


def is_dask(options: PipelineOptions) -> bool:
    """Whether the pipeline runs on a Dask cluster (`--runner DaskRunner`)."""
    return options.view_as(StandardOptions).runner in _DASK_RUNNER_NAMES


def run_in_one_thread(options: PipelineOptions) -> None:
    """Has Beam's local runner run the pipeline in one thread, unless its mode was asked for.

    For a pipeline whose heavy step hands its work to worker processes (the
    shard writer keeps every one busy from one bundle): the runner's
    multi-threaded mode would only add its gRPC threads' polling.
    """
    given = options.get_all_options(drop_default=True)
    if "direct_running_mode" in given or "direct_num_workers" in given:
        return
    direct = options.view_as(DirectOptions)
    direct.direct_running_mode = "in_memory"
    direct.direct_num_workers = 1


def in_process_threads(options: PipelineOptions) -> int:
    """Threads that run the pipeline's DoFns in this very process (after `make_runner`); 0 if none.

    Beam's local runner runs them in this process's threads in its
    'multi_threading' and 'in_memory' (one thread) modes; in
    'multi_processing' and on every other runner they run elsewhere.
    """
    if options.view_as(StandardOptions).runner not in (None, "DirectRunner", "direct"):
        return 0
    direct = options.view_as(DirectOptions)
    if direct.direct_running_mode == "multi_threading":
        return max(1, direct.direct_num_workers or 1)
    return 1 if direct.direct_running_mode == "in_memory" else 0


class ConsoleOptions(PipelineOptions):
    """Options every shardsmith pipeline's command takes (declared once for all of them)."""

    SHARED_BY_ALL_PIPELINES = True  # Not foreign to any pipeline (see `args`).

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument(console.VERBOSE_FLAG, action="store_true", help=console.VERBOSE_HELP)
