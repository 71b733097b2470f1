"""TensorFlow for shardsmith: the whole library, or only the ops the converter runs.

A converter process that only decodes images needs TensorFlow's op runtime,
not its Python API (a third of the import's cost): `image_ops()` loads just
that, through `compat.tf_internals` (where the why, the measurements and the
tested TensorFlow releases are), and falls back to the whole library when
those internals are not usable. `full()` imports the whole library with the
collector paused. Both are loaded once per process: later calls return what
was loaded and change nothing.

`tf` (`from schemas.tf_runtime import tf`) is the whole library, imported the cheap
way on first use.
"""

from __future__ import annotations

import logging
import sys
import threading
import types
from collections.abc import Callable
from typing import NamedTuple

from compat import UntestedVersion, tf_internals

__all__ = ["full", "image_ops", "image_ops_loaded", "jpeg_batch_decoder", "set_batch_decoder_threads", "example_pb2",
           "api_loaded"]

_LOG = logging.getLogger("shardsmith")
_LOCK = threading.RLock()
_LOADED: dict[str, object] = {}  # 'image_ops', 'example_pb2': loaded once per process.
# (size, ratio) -> batch decoder, or None where the internals are not usable.
_BATCH_DECODERS: dict[tuple[int, int, int], Callable | None] = {}
# Threads of each batch decoder's runs; 0: TensorFlow's default (every core).
_BATCH_THREADS = [0]
# setup.py leaves the TensorFlow build to the user (CPU-only or GPU).
_NO_TENSORFLOW = (
    "shardsmith needs TensorFlow, and leaves the build to you: "
    "pip install 'tensorflow-cpu>=2.16,<2.22' (CPU only: CPU machines, Dataflow workers) or "
    "'tensorflow[and-cuda]>=2.16,<2.22' (GPU), or install shardsmith with its `cpu` or `gpu` "
    "extra (pip install '.[cpu]' in a clone)."
)


def api_loaded() -> bool:
    """Whether TensorFlow's Python API has been loaded in this process."""
    return tf_internals.api_loaded()


def full() -> types.ModuleType:
    """The whole `tensorflow` module, imported with the collector paused."""
    with _LOCK:
        module = sys.modules.get("tensorflow")
        if module is None:
            with tf_internals.collector_paused():
                try:
                    import tensorflow as module
                except ModuleNotFoundError as e:
                    if e.name != "tensorflow":
                        raise
                    raise ModuleNotFoundError(_NO_TENSORFLOW, name=e.name) from None
        else:
            tf_internals.load_api(module)
    return module


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
    release move or change the internals this needs, the ops come from the
    whole library instead: the same ops, a slower start.
    """
    with _LOCK:
        if "image_ops" not in _LOADED:
            _LOADED["image_ops"] = _load_image_ops()
        return _LOADED["image_ops"]


def image_ops_loaded() -> bool:
    """Whether `image_ops` has loaded the decode ops in this process (loads nothing)."""
    return "image_ops" in _LOADED


def _load_image_ops() -> ImageOps:
    try:
        jpeg, png, op_error, uint8, uint16, constant, string = _ops_without_api()
        return ImageOps(_with_tensor_input(jpeg, constant, string),
                        _with_tensor_input(png, constant, string), op_error, uint8, uint16)
    except (ImportError, AttributeError, UntestedVersion) as e:
        _LOG.info("Loading all of TensorFlow for its decode ops (%s: %s)", type(e).__name__, e)
        tf = full()
        return ImageOps(_with_tensor_input(tf.io.decode_jpeg, tf.constant, tf.string),
                        _with_tensor_input(tf.io.decode_png, tf.constant, tf.string),
                        tf.errors.OpError, tf.uint8, tf.uint16)


def _ops_without_api():
    # A seam for the fallback's test.
    return tf_internals.decode_ops_without_api()


def _with_tensor_input(op, constant, string):
    def run(contents: bytes, **attrs):
        # Given a tensor, TF's C fast path runs the op: given Python bytes,
        # every call takes the slow Python path (1.7x the overhead), and the
        # second call imports resource_variable_ops, half a second, to check
        # the bytes are not a variable.
        return op(constant(contents, dtype=string), **attrs)

    return run


def set_batch_decoder_threads(threads: int) -> None:
    """Threads that decoders made from now on decode a batch with (0: every core, the default).

    A converter's worker process, one of one per core, sets 1: with
    TensorFlow's default each would run a pool per core, and their spinning
    threads would compete for the same cores.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"`threads` must be 0 (every core) or more. Received: {threads!r}")
    with _LOCK:
        _BATCH_THREADS[0] = threads


def jpeg_batch_decoder(size: int, ratio: int) -> Callable | None:
    """A function decoding `size` JPEGs at 1/`ratio` scale in one TensorFlow run, or None.

    The same DecodeJpeg op as `image_ops().decode_jpeg`, `size` of them in one
    graph run on TensorFlow's threads (see `compat.tf_internals`); built once
    per (size, ratio) and process. None when those internals are not usable:
    callers then decode one image at a time with `image_ops()`.

    The function takes a list of `size` bytes and returns the decoded shapes,
    an int array (size, 3); it raises `image_ops().OpError` if any image fails.
    """
    with _LOCK:
        key = (size, ratio, _BATCH_THREADS[0])
        if key not in _BATCH_DECODERS:
            image_ops()  # The fallback decision is made once, there.
            try:
                _BATCH_DECODERS[key] = tf_internals.jpeg_batch_decoder(size, ratio, key[2])
            except (ImportError, AttributeError, UntestedVersion) as e:
                _LOG.info("Decoding JPEGs one at a time (%s: %s)", type(e).__name__, e)
                _BATCH_DECODERS[key] = None
        return _BATCH_DECODERS[key]


def example_pb2() -> types.ModuleType:
    """TensorFlow's `Example` protocol buffer module, without the Python API if not loaded."""
    with _LOCK:
        if "example_pb2" not in _LOADED:
            try:
                _LOADED["example_pb2"] = tf_internals.example_pb2_without_api()
            except (ImportError, AttributeError, UntestedVersion) as e:
                _LOG.info("Loading all of TensorFlow for Example (%s: %s)", type(e).__name__, e)
                train = full().train
                # The same message classes, from their public names.
                _LOADED["example_pb2"] = types.SimpleNamespace(**{
                    name: getattr(train, name)
                    for name in ("Example", "Features", "Feature", "BytesList", "Int64List",
                                 "FloatList")
                })
        return _LOADED["example_pb2"]


def __getattr__(name):
    # `from schemas.tf_runtime import tf`: the whole library, on first use only.
    if name == "tf":
        return full()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
