"""pytest configuration and shared fixtures of the test suite.

Only fixtures and pytest hooks live here; the plain helper functions the tests import are in
`helpers.py` (a conftest is loaded by pytest, not meant to be imported as a library).
"""

from __future__ import annotations

import logging
import os

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
# run alone. Figures: seconds of the module's tests of 10 s or more in `make test` at load ~10
# (2026-12-06, 2,043 s in all; quiet runs take about a third), after this branch's cuts where
# marked; "~": a module of many shorter tests, estimated from its quiet time on 2026-12-02.
_LONGEST_FIRST = (
    "test_conversion_guard.py",  # 128 (~110 without the verify interpreters)
    "test_beam_jobs_runner_dask.py",  # ~110 (167 quiet on 2026-12-02, its cluster start included)
    "test_bench_mutations_convert.py",  # 110
    "test_gcs.py",  # 103
    "test_quiet.py",  # 116 (~90 with the CPU burners for one command)
    "test_beam_jobs_append_targets.py",  # 86
    "test_readers_distributed.py",  # 84
    "test_docs.py",  # 84
    "test_readers_targets.py",  # ~80 (79 quiet on 2026-12-02, in one process)
    "test_bench_append.py",  # 78
    "test_bench_targets_convert.py",  # 74
    "test_bench_rasters.py",  # 72
    "test_beam_jobs_append.py",  # 72
    "test_conversion_patches_memory.py",  # 72
    "test_bench_time_series.py",  # 69
    "test_beam_jobs_mend.py",  # 67
    "test_readers_service.py",  # 62
    "test_cli_errors.py",  # 132 (~60 with its forked commands)
    "test_compat.py",  # 55
    "test_conversion_patches_scale.py",  # 51
    "test_readers_global.py",  # ~50
    "test_readers_rasters.py",  # ~50
    "test_rasters_end_to_end.py",  # ~50
    "test_readers_dataset.py",  # ~50
    "test_packaging.py",  # 48
    "test_readers_doctor.py",  # 46
    "test_bench_patches.py",  # 45
    "test_conversion_patches.py",  # ~45
    "test_readers_multiworker.py",  # ~40
    "test_conversion_shard_maker.py",  # 37
    "test_conversion_processes.py",  # 35
    "test_imports.py",  # 34
    "test_schemas.py",  # 34
    "test_golden.py",  # 31
    "test_imaging_resize.py",  # 30
    "test_readers_volumes.py",  # 30
    "test_volumes_end_to_end.py",  # ~30 (last of the alphabet otherwise)
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
