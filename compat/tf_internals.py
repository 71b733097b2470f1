"""Private TensorFlow internals shardsmith relies on, and nothing else.

Tested with TensorFlow 2.16 to 2.21 (`TESTED`); checked at use, not import.

1. TensorFlow's op runtime without its Python API. `import tensorflow`
   builds the whole Python API (tf.distribute, tf.keras, autograph...), about
   two thirds of the import's cost, none of which the converter uses: it only
   runs image decode ops eagerly. Measured, a fresh interpreter that decodes
   one JPEG takes 1.7 s of CPU this way, 4.0 s with the whole library imported
   with the collector paused and 4.7 s with a plain `import tensorflow`; every
   converter worker process pays that. The `tensorflow` package is registered
   in `sys.modules` without running its `__init__`; the first time any code
   asks the package itself for anything (`tf.data`, `tf.__version__`), its
   `__init__` runs in place, so later code in the process sees the whole
   library, as usual.
2. The import creates about a million Python objects; with the collector on,
   it runs many full collections during the import, and every later full
   collection scans them again. Each load runs with the collector paused and
   then freezes what it created into the permanent generation, once per load
   (a call that loads nothing new freezes nothing: freezing on every call
   kept the garbage of every decoded record alive for good).
3. Whether TensorFlow's eager context created its devices
   (`context_initialized`), which the public API cannot tell without creating
   them.
4. The constant TensorFlow pads an index_shuffle seed with
   (`index_shuffle_seed_pad`).
5. A graph of many decode ops run by a TF1-style session
   (`jpeg_batch_decoder`), still without the Python API. Each eager op call
   costs ~200 us of CPU under the GIL, more than libjpeg takes to decode a
   small JPEG at 1/8 scale; one `Session.run` of a graph holding 64 DecodeJpeg
   nodes costs ~21 us per image, on TensorFlow's inter-op threads with the GIL
   released. Measured against the alternatives: `map_fn` in the graph (a while
   loop) ~47 us per image and a type-inference warning; a `tf.function` needs
   the whole Python API (~2.3 s more CPU per process at start). The graph is
   run through `BaseSession._make_callable_from_options` (the runtime's own
   callable): the public `make_callable` with a feed costs ~330 us of CPU per
   run, ~95 us this way.
6. The tf.data service's servers (`readers.service`): stopping one in the
   process that started it (`_stop`: the public API has `join` only, which
   waits forever) and the number of workers registered with a dispatcher
   (`_num_workers`), which `shardsmith serve-data` waits for before printing
   its address; and a worker with a cross-trainer cache of a given size
   (`data_service_worker`): the public `WorkerConfig` has no field for
   `cross_trainer_cache_size_bytes`, which the worker's config proto has
   (TensorFlow's own tests build the proto), so without it every worker may
   hold TensorFlow's default of 10 GiB per job that trainers share with
   trainer ids.
7. The dataset of one TFRecord file (`tfrecord_file_dataset`): the source op
   that `tf.data.TFRecordDataset` wraps in a `flat_map` over a dataset of its
   file names, a second function to trace inside every interleave function
   that opens one shard. Without the wrapper, the same records in the same
   order, one trace fewer per interleave (measured in a fresh process: 0.05
   -> 0.02 CPU s per interleave built, part of the time to the first batch).
8. One interleave function for several interleaves (`interleave_each`): the
   reader's shuffled pass reads the shard heads, then the rest, through two
   interleaves of one read function. `Dataset.interleave` traces its function
   anew for each (a FunctionDef each, each instantiated - placed and optimised
   by grappler - when its iterator starts); here the second dataset op names
   the first one's function (`_InterleaveDataset` built around the first's
   `StructuredFunctionWrapper`). The first may be a deterministic parallel
   interleave (`_ParallelInterleaveDataset`, the ramp's shard heads, which the
   heads' shuffle reads whole before its first record), sharing the function
   the same way.
9. `unbatch` without its identity map (`unbatch_dense`): `Dataset.unbatch`
   maps every element through `normalize_to_dense` first, a function that is
   an identity for dense tensors, but one more to trace and to instantiate
   before the first batch; `_UnbatchDataset` is the op alone.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib.util
import logging
import sys
import threading
import types
import weakref

from compat._versions import UntestedVersion, check_version, installed_version

__all__ = [
    "TESTED",
    "check",
    "api_loaded",
    "load_api",
    "decode_ops_without_api",
    "example_pb2_without_api",
    "context_initialized",
    "index_shuffle_seed_pad",
    "jpeg_batch_decoder",
    "freeze_imports",
    "stop_data_service_server",
    "data_service_worker_count",
    "data_service_worker",
    "tfrecord_file_dataset",
    "interleave_each",
    "unbatch_dense",
]

# The lowest TensorFlow release these internals were used with and the first
# one they were not tested with.
TESTED = ("2.16", "2.22")
# Distributions that install the `tensorflow` package.
_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos",
                  "tf-nightly", "tf-nightly-cpu")
_PACKAGE = "tensorflow"
# Re-entrant: loading the API imports modules that may ask for it again.
_LOCK = threading.RLock()


def check(what: str) -> None:
    """Raises compat.UntestedVersion if the installed TensorFlow is outside `TESTED`."""
    check_version(_PACKAGE, installed_version(*_DISTRIBUTIONS), TESTED, what)


@contextlib.contextmanager
def collector_paused():
    """Pauses the cyclic collector for the block (an import of TensorFlow), then restores it.

    Importing TensorFlow creates ~520,000 objects that live as long as the
    process: with the collector running, the import triggers collections
    that walk them all and free nothing. Nothing stays frozen afterwards:
    `gc.freeze()` cannot tell TensorFlow's objects from the caller's, and
    would keep every object the program created before (and their reference
    cycles) out of all collections for good. What survived is moved to the
    oldest generation (freeze, then unfreeze, when nothing else is frozen)
    so that it does not count as new long-lived objects, which would trigger
    a full collection soon after the import.

    Measured (after `import readers` and TensorFlow's API, then 300,000 new
    lists): a full collection takes ~0.3 s with those objects in the heap,
    where frozen ones made it ~0; 3 full collections (1.0 s for the
    allocations) without this move, 2 (0.63 s) with it. A program that wants
    TensorFlow's objects out of every collection can call `gc.freeze()`
    itself, as Python's documentation suggests after start-up.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _FREEZE_IMPORTS[0]:
            gc.freeze()  # shardsmith's own process (`freeze_imports`).
        elif not gc.get_freeze_count():
            gc.freeze()
            gc.unfreeze()
        if was_enabled:
            gc.enable()


# Set by `freeze_imports` in shardsmith's own processes, never on import.
_FREEZE_IMPORTS = [False]


def freeze_imports() -> None:
    """Has this process freeze what loading TensorFlow creates, for good.

    For shardsmith's own processes only (the command's child, which owns the
    whole process): nothing of a caller's is frozen with it. There, the
    ~520,000 objects of TensorFlow are then skipped by every collection
    instead of walked by each full one (~0.3 s each).
    """
    _FREEZE_IMPORTS[0] = True


class _PackageWithoutApi(types.ModuleType):
    """The `tensorflow` package before its `__init__` has run.

    Submodules import normally (the import system reads `__path__` and
    `__spec__`, which are set). Any other attribute runs the real `__init__`
    first, in this very module object.
    """

    def __getattr__(self, name):
        load_api(self)
        return getattr(self, name)


def load_api(module: types.ModuleType) -> None:
    """Runs the real `__init__` of a package registered without it (else nothing)."""
    with _LOCK:
        if type(module) is not _PackageWithoutApi:
            return
        # As during a normal import, code that imports the package while its
        # `__init__` runs sees a partly initialised module.
        module.__class__ = types.ModuleType
        with collector_paused():
            module.__spec__.loader.exec_module(module)


def api_loaded() -> bool:
    """Whether TensorFlow's Python API has been loaded in this process."""
    module = sys.modules.get(_PACKAGE)
    return module is not None and type(module) is not _PackageWithoutApi


def _register_package_without_api() -> None:
    """Registers the bare package, then turns on TF2 behaviour as its `__init__` would."""
    with _LOCK:
        if _PACKAGE in sys.modules:
            return
        check("Loading TensorFlow's decode ops without its Python API")
        spec = importlib.util.find_spec(_PACKAGE)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {_PACKAGE!r}", name=_PACKAGE)
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _PackageWithoutApi
        sys.modules[_PACKAGE] = module
        with collector_paused():
            from tensorflow.python import tf2
            from tensorflow.python.compat import v2_compat

            # The first thing TensorFlow's `__init__` does, and its last:
            # modules read `tf2.enabled()` when imported, and ops run eagerly.
            tf2.enable()
            v2_compat.enable_v2_behavior()


def decode_ops_without_api():
    """(decode_jpeg, decode_png, OpError, uint8, uint16, constant, string), API not loaded.

    The decoders are the generated op wrappers `tf.io.decode_jpeg` and
    `tf.io.decode_png` are.

    Raises:
      compat.UntestedVersion: Outside `TESTED` (and TensorFlow not imported yet).
      ImportError, AttributeError: If a release moved these modules.
    """
    _register_package_without_api()
    with _LOCK, collector_paused():
        from tensorflow.python.framework import constant_op, dtypes, errors
        from tensorflow.python.ops import gen_image_ops
    return (gen_image_ops.decode_jpeg, gen_image_ops.decode_png, errors.OpError,
            dtypes.uint8, dtypes.uint16, constant_op.constant, dtypes.string)


def example_pb2_without_api() -> types.ModuleType:
    """TensorFlow's `Example` protocol buffer module, without the Python API."""
    _register_package_without_api()
    with _LOCK, collector_paused():
        from tensorflow.core.example import example_pb2
    return example_pb2


def context_initialized() -> bool:
    """Whether TensorFlow created its devices (and so its host allocator) already.

    False when TensorFlow's eager context module is not even imported.

    Raises:
      compat.UntestedVersion: Outside `TESTED`.
    """
    context = sys.modules.get("tensorflow.python.eager.context")
    if context is None:
        return False
    check("Telling whether TensorFlow has started")
    ctx = context.context_safe()
    return ctx is not None and bool(ctx._initialized)


def index_shuffle_seed_pad() -> int:
    """What `tf.random.experimental.index_shuffle` puts before a [2] seed to make its op's [3] seed.

    Copied from tensorflow/python/ops/stateless_random_ops.py (`index_shuffle`).

    Raises:
      compat.UntestedVersion: Outside `TESTED`: a release may have changed it,
        and with it every permutation.
    """
    check("shuffle='global' (TensorFlow's index_shuffle seed layout)")
    return 498247692


# Sessions of the batch decoders, closed at exit (see `_close_at_exit`).
_SESSIONS: weakref.WeakSet = weakref.WeakSet()


def _close_at_exit(sess) -> None:
    """Closes `sess` when the interpreter exits, before its modules are torn down.

    A runtime callable (`_make_callable_from_options`) releases itself in its
    `__del__`, which at interpreter teardown runs after TensorFlow's C
    bindings are gone and prints "Exception ignored ... TF_SessionReleaseCallable"
    on stderr; on a closed session it does nothing. Registered at the first
    decoder built, not on import.
    """
    atexit.unregister(_close_sessions)  # Registered once, however many decoders.
    atexit.register(_close_sessions)
    _SESSIONS.add(sess)


def _close_sessions() -> None:
    for sess in list(_SESSIONS):
        sess.close()
    _SESSIONS.clear()


def jpeg_batch_decoder(size: int, ratio: int, threads: int = 0):
    """A function decoding `size` JPEGs in one graph run, API not loaded.

    The graph holds `size` DecodeJpeg nodes (the op `tf.io.decode_jpeg` runs,
    with `ratio`), each followed by Shape: decoded pixels are freed as soon as
    their shape is taken, so at most one image per inter-op thread is held.
    Its session runs them on `threads` inter- and intra-op threads (0:
    TensorFlow's default, one per core).

    Returns:
      f(list of `size` bytes) -> int numpy array (size, 3) of decoded shapes.
      It raises the first failing node's `errors.OpError` (which node failed
      is not reported in a stable form: callers decode a failed batch again
      one image at a time). Safe to call from several threads.

    Raises:
      compat.UntestedVersion: Outside `TESTED` (and TensorFlow not imported yet).
      ImportError, AttributeError: If a release moved these modules.
    """
    _register_package_without_api()
    with _LOCK, collector_paused():
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.client import session
        from tensorflow.python.framework import dtypes
        from tensorflow.python.framework import ops as framework_ops
        from tensorflow.python.ops import array_ops, array_ops_stack, gen_image_ops

        graph = framework_ops.Graph()
        with graph.as_default():
            contents = array_ops.placeholder(dtypes.string, [size])
            shapes = array_ops_stack.stack([
                array_ops.shape(gen_image_ops.decode_jpeg(one, ratio=ratio))
                for one in array_ops_stack.unstack(contents, num=size)
            ])
        graph.finalize()
        # A callable made by the session runtime (TF_SessionMakeCallable), not
        # `Session.make_callable`: with a feed, that one goes through
        # `Session.run` on every call (fetch and feed handlers rebuilt),
        # measured ~230 us more CPU per call under the GIL, as much as
        # decoding a photo's JPEG at 1/8 scale.
        config = None
        if threads:
            config = config_pb2.ConfigProto(inter_op_parallelism_threads=threads,
                                            intra_op_parallelism_threads=threads)
        sess = session.Session(graph=graph, config=config)
        run = sess._make_callable_from_options(
            config_pb2.CallableOptions(feed=[contents.name], fetch=[shapes.name]))
        _close_at_exit(sess)

    def decode(datas):
        return run(datas)[0]

    return decode


def stop_data_service_server(server) -> None:
    """Stops a tf.data service `DispatchServer` or `WorkerServer` of this process.

    Raises:
      compat.UntestedVersion: Outside `TESTED`.
    """
    check("Stopping a tf.data service server")
    server._stop()


def data_service_worker_count(dispatcher) -> int:
    """Workers registered with a tf.data service `DispatchServer` of this process.

    Raises:
      compat.UntestedVersion: Outside `TESTED`.
    """
    check("Counting a tf.data service dispatcher's workers")
    return int(dispatcher._num_workers())


def data_service_worker(config, cross_trainer_cache_bytes: int):
    """A started tf.data service `WorkerServer` of `config` whose cross-trainer cache
    holds at most `cross_trainer_cache_bytes` per job.

    Where a release has moved the proto, or is outside `TESTED`, the public
    server of `config`: its cache then has TensorFlow's default size (10 GiB),
    as a warning says.

    Args:
      config: A public `tf.data.experimental.service.WorkerConfig` (its
        defaults filled in).
      cross_trainer_cache_bytes: The size limit, > 0.
    """
    import tensorflow as tf

    service = tf.data.experimental.service
    try:
        check("sizing a tf.data service worker's cross-trainer cache")
        from tensorflow.core.protobuf import service_config_pb2
    except (ImportError, UntestedVersion) as e:
        logging.getLogger(__name__).warning(
            "The worker's cross-trainer cache keeps TensorFlow's default size (10 GiB): %s", e)
        return service.WorkerServer(config)
    proto = service_config_pb2.WorkerConfig(
        dispatcher_address=config.dispatcher_address, worker_address=config.worker_address,
        port=config.port, protocol=config.protocol,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        dispatcher_timeout_ms=config.dispatcher_timeout_ms,
        data_transfer_protocol=config.data_transfer_protocol,
        data_transfer_address=config.data_transfer_address,
        cross_trainer_cache_size_bytes=int(cross_trainer_cache_bytes),
    )
    # `WorkerServer` takes the proto as it is (its own `isinstance` branch).
    return service.WorkerServer(proto)


def tfrecord_file_dataset(path):
    """The records of one TFRecord file, as `tf.data.TFRecordDataset(path)` reads them.

    Without its `flat_map` over a one-element dataset of file names (see the
    module's docstring, 6); for use inside an interleave function. Where a
    release has moved the class, or is outside `TESTED`, the public reader.

    Args:
      path: A scalar tf.string tensor, the file's path.
    """
    import tensorflow as tf

    try:
        check("reading one TFRecord file without its flat_map")
        from tensorflow.python.data.ops import readers
        source = readers._TFRecordDataset
    except (ImportError, AttributeError, UntestedVersion):
        return tf.data.TFRecordDataset(path)
    return source(path)


def interleave_each(inputs, map_func, *, cycle_length: int, block_length: int,
                    parallel_first: int | None = None) -> list:
    """`[d.interleave(map_func, cycle_length, block_length) for d in inputs]`, `map_func` traced once.

    tf.data traces the function of every `interleave` call anew, and each trace
    is a FunctionDef of its own, instantiated anew when its iterator starts.
    Here the first call traces it and every dataset's op names that one
    function (see the module's docstring, 8). Sequential interleaves, but for
    the first input's with `parallel_first`: a deterministic parallel
    interleave of that many threads (the sequential one's order). Where a
    release has moved the classes, or is outside `TESTED`, one public
    `interleave` per input.

    Args:
      inputs: Datasets of one element spec.
      map_func: `fn(*element) -> dataset`, as for `interleave`.
      cycle_length, block_length: As for `interleave`.
      parallel_first: None, or the `num_parallel_calls` of the first input's
        interleave (`deterministic=True`).
    """
    def public(d, parallel):
        if parallel is None:
            return d.interleave(map_func, cycle_length=cycle_length, block_length=block_length)
        return d.interleave(map_func, cycle_length=cycle_length, block_length=block_length,
                            num_parallel_calls=parallel, deterministic=True)

    try:
        check("one interleave function for several interleaves")
        from tensorflow.python.data.ops import dataset_ops, interleave_op
        from tensorflow.python.ops import gen_dataset_ops
        base = interleave_op._InterleaveDataset
        parallel_base = interleave_op._ParallelInterleaveDataset
    except (ImportError, AttributeError, UntestedVersion):
        return [public(d, parallel_first if i == 0 else None) for i, d in enumerate(inputs)]
    if not inputs:
        return []
    if parallel_first is None:
        first = base(inputs[0], map_func, cycle_length, block_length)
    else:
        first = parallel_base(inputs[0], map_func, cycle_length, block_length, parallel_first,
                              deterministic=True)
    shared = first._map_func

    class _SharedInterleave(base):
        # `_InterleaveDataset` with the wrapper of `first` instead of a new trace.
        def __init__(self, input_dataset):  # pylint: disable=super-init-not-called
            self._input_dataset = input_dataset
            self._map_func = shared
            self._structure = first._structure
            self._cycle_length = first._cycle_length
            self._block_length = first._block_length
            self._name = None
            variant_tensor = gen_dataset_ops.interleave_dataset(
                input_dataset._variant_tensor, shared.function.captured_inputs,
                self._cycle_length, self._block_length, f=shared.function, **self._common_args)
            dataset_ops.UnaryDataset.__init__(self, input_dataset, variant_tensor)

    return [first] + [_SharedInterleave(d) for d in inputs[1:]]


def unbatch_dense(dataset):
    """`dataset.unbatch()` of a dataset of dense tensors only, without its identity map.

    `unbatch` first maps every element through a function that re-encodes
    sparse and ragged components as dense ones (`normalize_to_dense`), for
    dense tensors an identity: one more function to trace as the dataset is
    built and to instantiate as its iterator starts, and one call per batch
    (see the module's docstring, 9). The same elements, in the same order.
    Where a component is not a dense `tf.TensorSpec`, where a release has
    moved the class, or outside `TESTED`, the public `unbatch`.

    Args:
      dataset: A dataset whose element components are dense tensors with a
        leading batch dimension.
    """
    import tensorflow as tf

    specs = tf.nest.flatten(dataset.element_spec)
    if not all(type(s) is tf.TensorSpec for s in specs):  # noqa: E721 (subclasses are not dense)
        return dataset.unbatch()
    try:
        check("unbatch without its identity map")
        from tensorflow.python.data.ops import unbatch_op
        unbatched = unbatch_op._UnbatchDataset
    except (ImportError, AttributeError, UntestedVersion):
        return dataset.unbatch()
    return unbatched(dataset)
