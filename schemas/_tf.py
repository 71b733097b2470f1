"""TensorFlow for shardsmith: the whole library, or only the ops the converter runs.

Two costs of `import tensorflow` matter to a converter whose whole run may last
seconds:

1. The import creates about a million Python objects. With the collector on,
   it runs many full collections during the import, and every later full
   collection (and interpreter exit) scans those objects again: more than a
   second of CPU in every process. Both entry points below import with the
   collector paused, then freeze what was created into the permanent
   generation, where the collector leaves it.
2. Most of the import builds the Python API (tf.distribute, tf.keras,
   autograph, feature columns...), none of which the converter uses: it only
   runs image decode ops eagerly. `image_ops()` loads the op runtime and those
   ops alone, about a third of the full import. The `tensorflow` package is
   registered without running its `__init__`; the first time any code asks
   the package itself for anything (`tf.data`, `from tensorflow import keras`,
   `tf.__version__`), its `__init__` runs in place, so code that uses
   TensorFlow later in the same process sees the whole library, as usual.

`tf` (`from schemas._tf import tf`) is the whole library, imported the cheap
way on first use.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import sys
import threading
import types
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["full", "image_ops", "example_pb2", "api_loaded"]

_LOG = logging.getLogger("shardsmith")
_PACKAGE = "tensorflow"
# Re-entrant: loading the API imports modules that may ask for it again.
_LOCK = threading.RLock()


@contextlib.contextmanager
def _collector_paused():
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


class _PackageWithoutApi(types.ModuleType):
    """The `tensorflow` package before its `__init__` has run.

    Submodules import normally (the import system reads `__path__` and
    `__spec__`, which are set). Any other attribute runs the real `__init__`
    first, in this very module object.
    """

    def __getattr__(self, name):
        _load_api(self)
        return getattr(self, name)


def _load_api(module: types.ModuleType) -> None:
    with _LOCK:
        if type(module) is not _PackageWithoutApi:
            return
        # As during a normal import, code that imports the package while its
        # `__init__` runs sees a partly initialised module.
        module.__class__ = types.ModuleType
        with _collector_paused():
            module.__spec__.loader.exec_module(module)


def api_loaded() -> bool:
    """Whether TensorFlow's Python API has been loaded in this process."""
    module = sys.modules.get(_PACKAGE)
    return module is not None and type(module) is not _PackageWithoutApi


def full() -> types.ModuleType:
    """The whole `tensorflow` module, imported with the collector paused."""
    with _LOCK:
        module = sys.modules.get(_PACKAGE)
        if module is None:
            with _collector_paused():
                import tensorflow as module
        else:
            _load_api(module)
    return module


def _register_package_without_api() -> None:
    """Registers the bare package, then turns on TF2 behaviour as its `__init__` would."""
    with _LOCK:
        if _PACKAGE in sys.modules:
            return
        spec = importlib.util.find_spec(_PACKAGE)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {_PACKAGE!r}", name=_PACKAGE)
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _PackageWithoutApi
        sys.modules[_PACKAGE] = module
        with _collector_paused():
            from tensorflow.python import tf2
            from tensorflow.python.compat import v2_compat

            # The first thing TensorFlow's `__init__` does, and its last:
            # modules read `tf2.enabled()` when imported, and ops run eagerly.
            tf2.enable()
            v2_compat.enable_v2_behavior()


class ImageOps(NamedTuple):
    """The TensorFlow ops and types the converter's validation uses.

    These are the very ops `tf.io.decode_jpeg` and `tf.io.decode_png` are
    (generated op wrappers), so the validation runs the reader's decoders.
    """

    decode_jpeg: Callable
    decode_png: Callable
    OpError: type
    uint8: object
    uint16: object


def image_ops() -> ImageOps:
    """TensorFlow's image decode ops, without loading the Python API if not loaded yet.

    The ops take the encoded bytes (Python bytes) and keyword attributes, as
    `tf.io.decode_jpeg` and `tf.io.decode_png` do. Should a TensorFlow
    release move the internal modules this needs, the ops come from the whole
    library instead: the same ops, a slower start.
    """
    try:
        return _ops_without_api()
    except (ImportError, AttributeError) as e:
        _LOG.info("Loading all of TensorFlow for its decode ops (%s: %s)", type(e).__name__, e)
        tf = full()
        return ImageOps(_with_tensor_input(tf.io.decode_jpeg, tf.constant, tf.string),
                        _with_tensor_input(tf.io.decode_png, tf.constant, tf.string),
                        tf.errors.OpError, tf.uint8, tf.uint16)


def _ops_without_api() -> ImageOps:
    _register_package_without_api()
    with _LOCK, _collector_paused():
        from tensorflow.python.framework import constant_op, dtypes, errors
        from tensorflow.python.ops import gen_image_ops
    constant, string = constant_op.constant, dtypes.string
    return ImageOps(_with_tensor_input(gen_image_ops.decode_jpeg, constant, string),
                    _with_tensor_input(gen_image_ops.decode_png, constant, string),
                    errors.OpError, dtypes.uint8, dtypes.uint16)


def _with_tensor_input(op, constant, string):
    def run(contents: bytes, **attrs):
        # Given a tensor, TF's C fast path runs the op: given Python bytes,
        # every call takes the slow Python path (1.7x the overhead), and the
        # second call imports resource_variable_ops, half a second, to check
        # the bytes are not a variable.
        return op(constant(contents, dtype=string), **attrs)

    return run


def example_pb2() -> types.ModuleType:
    """TensorFlow's `Example` protocol buffer module, without the Python API."""
    _register_package_without_api()
    with _LOCK, _collector_paused():
        from tensorflow.core.example import example_pb2 as module
    return module


def __getattr__(name):
    # `from schemas._tf import tf`: the whole library, on first use only.
    if name == "tf":
        return full()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
