"""What every shardsmith pipeline does the same way: runner choice and logging."""

from __future__ import annotations

import logging

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, WorkerOptions

__all__ = ["make_runner", "configure_logging"]


def make_runner(options: PipelineOptions):
    """The runner to pass to `beam.Pipeline`, or None to let Beam pick by name.

    Also quiets local worker processes: they log at WARNING, except
    shardsmith's own progress lines.
    """
    worker = options.view_as(WorkerOptions)
    if worker.default_sdk_harness_log_level is None:
        worker.default_sdk_harness_log_level = "WARNING"
        worker.sdk_harness_log_level_overrides = {"shardsmith": "INFO"}
    runner = options.view_as(StandardOptions).runner
    if runner in (None, "DirectRunner", "direct"):
        # The DirectRunner first tries the Prism runner, which downloads a
        # binary; offline it waits and fails. Beam's in-process portable
        # runner is what it falls back to: use it straight away.
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    return None


def configure_logging() -> None:
    """INFO for shardsmith's lines, WARNING for Beam's and TensorFlow's."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    for noisy in ("apache_beam", "absl", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
