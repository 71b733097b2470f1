"""pytest configuration and shared fixtures of the test suite.

Only fixtures and pytest hooks live here; the plain helper functions the tests import are in
`helpers.py` (a conftest is loaded by pytest, not meant to be imported as a library).

The helpers are imported by their plain names (`helpers`, `_reader_data`): pytest puts tests/
on sys.path. Never as `tests.helpers`: `tests` here is a namespace package, and a third-party
wheel that ships a top-level `tests` package (rt-utils 1.2.7 does) wins over a namespace.
"""

from __future__ import annotations

import logging
import os
import signal

import pytest

from helpers import make_class_tree

# TensorFlow's C++ start-up lines and Beam's INFO lines bury the output the
# tests check. Set for the whole test session (and inherited by the child
# processes the tests start), not by any package on import.
_TF_LOG_ENV = "TF_CPP_MIN_LOG_LEVEL"
_QUIET_LOGGERS = ("apache_beam",)


def pytest_configure(config):
    """Quiets TensorFlow's C++ log (unless the caller set it) and Beam's loggers for the session.

    Runs before any test module is imported, so before TensorFlow reads the variable.
    """
    os.environ.setdefault(_TF_LOG_ENV, "2")
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    _register_hypothesis_profile()
    # A run started in the background of a shell without job control (`nohup make test &`)
    # inherits SIGINT ignored, and so would every command the Ctrl-C tests interrupt. A handler
    # here is reset to the default in each child at exec, where Python installs its own.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _register_hypothesis_profile() -> None:
    """Property tests check values, never time: no per-example deadline.

    Hypothesis's default 200 ms deadline fails a correct example when the shared
    2-core machine is loaded (it did at load 20); speed is checked in `bench/`.
    Tests that set their own `@settings` keep them.
    """
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "shardsmith", deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.load_profile("shardsmith")


# `make test` runs `pytest -n auto --dist loadfile`: each test module on one pytest-xdist worker,
# so its module-scoped fixtures (most convert a dataset) run once. Many tests start interpreters
# that import TensorFlow, and conversions start worker processes per core, so a worker per core
# beyond a few adds memory more than speed: at most _MAX_XDIST_WORKERS, and none (a plain run
# in this process) on one core.
_MAX_XDIST_WORKERS = 4


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; a run without xdist never calls it.
def pytest_xdist_auto_num_workers(config):
    """The workers of `-n auto`: the usable cores, at most _MAX_XDIST_WORKERS; 0 on one core.

    `PYTEST_XDIST_AUTO_NUM_WORKERS` (xdist's own setting) still wins.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's implementation reads it.
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # Not on Linux.
        cores = os.cpu_count() or 1
    return min(cores, _MAX_XDIST_WORKERS) if cores > 1 else 0


# The modules that take longest, longest first. `make test` hands whole modules to the workers in
# collection order (`--dist loadfile --no-loadscope-reorder`), the next one to a worker as its
# module nears its end: these first, so that the workers' last modules are short ones and both end
# together. Collected as-is otherwise (alphabetically), so a slow module missing here can end the
# run alone: keep it up to date from `--durations=0`. Figures: the seconds of each module's tests
# (setup, call, teardown) in `make test` on 2 cores, 2026-12-07, twelfth session (1,241 s in all,
# on a slower hour of this shared machine than the eleventh session's 996 s).
_LONGEST_FIRST = (
    "test_beam_jobs_runner_dask.py",  # 72
    "test_volumes_masks_end_to_end.py",  # 70
    "test_conversion_guard.py",  # 61
    "test_gcs.py",  # 57
    "test_beam_jobs_append.py",  # 46
    "test_readers_targets.py",  # 41
    "test_cli_errors.py",  # 35
    "test_readers_service.py",  # 34
    "test_quiet.py",  # 32
    "test_beam_jobs_append_targets.py",  # 29
    "test_beam_jobs_append_volumes.py",  # 25
    "test_readers_dataset.py",  # 24
    "test_compat.py",  # 24
    "test_readers_volumes.py",  # 22
    "test_volumes_end_to_end.py",  # 22
    "test_conversion_patches.py",  # 22
    "test_readers_global.py",  # 21
    "test_readers_rasters.py",  # 20
    "test_bench_rasters.py",  # 20
    "test_beam_jobs_mend.py",  # 19
    "test_rasters_end_to_end.py",  # 18
    "test_bench_append.py",  # 15
    "test_docs.py",  # 15
    "test_bench_time_series.py",  # 14
    "test_conversion_patch_masks.py",  # 14
    "test_readers_distributed.py",  # 14
    "test_imaging_resize.py",  # 14
    "test_readers_doctor.py",  # 13
    "test_volumes_dicom_masks_end_to_end.py",  # 12
    "test_patches_end_to_end.py",  # 12
    "test_packaging.py",  # 12
    "test_imaging_dicom_masks.py",  # 12
    "test_conversion_shard_maker.py",  # 12
    "test_bench_targets_convert.py",  # 11
    "test_bench_patches.py",  # 11
    "test_imaging_patches.py",  # 11
    "test_bench_mutations_convert.py",  # 11
    "test_beam_jobs_convert.py",  # 10
    "test_conversion_patches_scale.py",  # 10
    "test_beam_jobs_transforms.py",  # 10
    "test_beam_jobs_verify_targets.py",  # 10
    "test_volumes_mask_labels_end_to_end.py",  # 9
    "test_schemas.py",  # 9
    "test_readers_targets_oriented.py",  # 9
    "test_time_series_end_to_end.py",  # 9
    "test_readers_first_batch.py",  # 8
    "test_readers_multiworker.py",  # 8
    "test_conversion_patches_memory.py",  # 8
    "test_targets_end_to_end.py",  # 8
    "test_beam_jobs_verify.py",  # 8
    "test_conversion_masks.py",  # 8
    "test_beam_jobs_convert_early.py",  # 8
    "test_readers_corrupt.py",  # 7
    "test_volumes_group_by_end_to_end.py",  # 7
    "test_readers_versions.py",  # 7
)


def pytest_collection_modifyitems(session, config, items):
    """The modules of `_LONGEST_FIRST` first, in its order; each module's tests stay together."""
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # Stable: the rest as collected.


@pytest.fixture
def class_tree(tmp_path):
    """(root, {relative path: class name}) of a small ROOT/<class>/... tree of JPEG and PNG files."""
    root = tmp_path / "images"
    files = make_class_tree(root)
    return root, files
