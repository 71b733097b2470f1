"""Importing any shardsmith package (or command module) changes nothing in the process.

One interpreter imports the third-party libraries shardsmith uses (Pillow,
Beam, TensorFlow, without running an op), then forks a child per module: the
child imports it into a process that has nothing of shardsmith yet and
reports what a library could have changed: the environment, the root logger,
Pillow's pixel limit, the collector, and the allocator TensorFlow picks for
host memory (chosen at the child's first op, after the import). A control
child does the same without any import, so the libraries' own import effects
(Beam's root handler, TensorFlow's environment variables and its choice of
allocator on this CPU) are in both and cancel out. One TensorFlow and Beam
import for all, not one per module (each costs seconds of CPU).
"""

import functools
import json
import os

import pytest

from helpers import forked_programs

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The packages setup.py installs, then the modules the commands start from.
_MODULES = (
    "schemas", "imaging", "conversion", "beam_jobs", "readers", "shardsmith", "compat",
    "beam_jobs.convert", "beam_jobs.verify", "shardsmith.preview", "shardsmith.cli",
)

# Run once before the forks: the libraries' imports (their effects in the control too), and
# `report`, which each child calls after its import.
_PRELUDE = r'''
import gc, importlib, json, logging, os, sys, warnings
before = dict(os.environ)
import PIL.Image, apache_beam  # noqa: E401
import tensorflow as tf


def report(module):
    if module:
        importlib.import_module(module)
    after_import = dict(os.environ)
    # The collector as the import left it: a gc.freeze() would keep the caller's
    # objects (and their cycles) out of every collection from then on.
    frozen_by_import = gc.get_freeze_count()
    tf.zeros([64, 64]).numpy()
    try:
        tf.config.experimental.get_memory_info("CPU:0")
        allocator = "pool"
    except ValueError:
        allocator = "malloc"
    root = logging.getLogger()
    print(json.dumps({
        "env_changed_by_import": sorted(k for k in set(before) | set(after_import)
                                        if before.get(k) != after_import.get(k)),
        "env": dict(os.environ),
        "root_level": root.level,
        "root_handlers": [(type(h).__name__, getattr(getattr(h, "stream", None), "name", None),
                           h.level, [type(f).__name__ for f in h.filters]) for h in root.handlers],
        "root_filters": [type(f).__name__ for f in root.filters],
        "max_image_pixels": PIL.Image.MAX_IMAGE_PIXELS,
        # Python's warnings still shown by the warnings module (not routed to logging),
        # its filters as they were, and no library logger filtered (pydicom configures
        # its own logger as it is imported, so it is not compared).
        "showwarning": warnings.showwarning.__module__,
        "warning_filters": len(warnings.filters),
        "library_loggers": {name: (logging.getLogger(name).level, len(logging.getLogger(name).filters),
                                   len(logging.getLogger(name).handlers))
                            for name in ("tifffile", "PIL", "py.warnings")},
        "allocator": allocator,
        "frozen_by_import": frozen_by_import,
        "frozen_at_end": gc.get_freeze_count(),
        "gc_enabled": gc.isenabled(),
    }))
'''


@functools.lru_cache(maxsize=None)
def _states() -> dict:
    # The same environment for every child (pytest names the running test in it).
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPU_ALLOCATOR_USE_BFC", "TF_CPP_MIN_LOG_LEVEL", "PYTEST_CURRENT_TEST")}
    programs = {module or "control": (f"report({module!r})", {}) for module in (None, *_MODULES)}
    return {None if name == "control" else name: child
            for name, child in forked_programs(_PRELUDE, programs, cwd=_REPO, env=env).items()}


def _state(module: str | None) -> dict:
    status, out, err = _states()[module]
    assert status == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_the_control_reports_a_state():
    control = _state(None)
    assert control["allocator"] in ("pool", "malloc")  # TensorFlow's own choice here.
    assert "TF_CPU_ALLOCATOR_USE_BFC" not in control["env"]
    assert control["max_image_pixels"] == 89_478_485  # Pillow's default (1 GiB / 4 / 3).
    assert control["frozen_by_import"] == control["frozen_at_end"] == 0 and control["gc_enabled"]


@pytest.mark.parametrize("module", _MODULES)
def test_importing_changes_nothing(module):
    state, control = dict(_state(module)), dict(_state(None))
    # TensorFlow's own import sets a few (TF2_BEHAVIOR, TPU_ML_PLATFORM, ...), before
    # the fork: the control's; a module's import changes nothing more.
    assert state["env_changed_by_import"] == control["env_changed_by_import"]
    assert "TF_CPU_ALLOCATOR_USE_BFC" not in state["env"]
    assert "TF_CPP_MIN_LOG_LEVEL" not in state["env"]
    state.pop("env_changed_by_import"), control.pop("env_changed_by_import")
    assert state == control


def test_validating_an_image_leaves_pillows_limit_alone():
    # The validator checks pixel counts itself, without Pillow's global limit:
    # a header over Pillow's refusal threshold (twice its limit) is still
    # rejected as too large, and the limit is what it was.
    import struct
    import zlib

    from PIL import Image

    from imaging.errors import ImageRejected
    from imaging.validator import ImageValidator

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    before = Image.MAX_IMAGE_PIXELS
    assert before is not None
    side = int((2 * before) ** 0.5) + 10
    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)))
    with pytest.raises(Image.DecompressionBombError):  # The fact relied on: Pillow refuses it.
        Image.open(__import__("io").BytesIO(data))
    validator = ImageValidator(max_pixels=1_000_000)
    with pytest.raises(ImageRejected) as e:
        validator.validate(data, "bomb.png")
    assert e.value.reason == "too_large" and f"{side}x{side}" in e.value.message
    assert Image.MAX_IMAGE_PIXELS == before
