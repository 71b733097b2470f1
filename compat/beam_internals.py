"""Private Apache Beam internals shardsmith relies on, and nothing else.

1. What Beam's import does without the clients of remote systems
   (`import_without_remote_clients`): `import apache_beam` imports, from
   `apache_beam.io` and `apache_beam.typehints`, MongoDB's client (pymongo,
   bson), Google Cloud Storage's and pyarrow, each inside a
   `try: ... except ImportError` of Beam's own (they are optional to it:
   their connectors and batch converters are then not registered). A local
   conversion uses none of them.
2. The local runner's output streams (`untimed_local_flushes`): Beam's
   in-process workers flush each output stream on a timer, racing the
   writes.
3. The Dask runner, below.

`beam_jobs._dask.DaskClusterRunner` translates a pipeline to Dask bags
itself (Beam's own Dask runner mixes up the outputs of multi-output ParDos).
It needs what Beam keeps private: the Dask overrides' primitive transforms,
how `DaskOptions` picks the bag arguments, a side input's view options, and
running a DoFn over a bundle with Beam's own invoker and output handler.
Written against Beam 2.77 (`TESTED`); checked at use, not import: another
release raises `compat.UntestedVersion` when the runner starts.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import logging
import sys

from compat._versions import UntestedVersion, check_version, installed_version

__all__ = ["TESTED", "check", "import_without_remote_clients", "untimed_local_flushes", "bag_kwargs", "overrides", "primitive_kind", "side_input_views",
           "run_bundle", "receiver_class", "dumps", "loads"]

# The lowest Beam release these internals were used with and the first one
# they were not tested with.
TESTED = ("2.77", "2.78")
_WHAT = "--runner DaskRunner (shardsmith's DaskClusterRunner)"


def check(what: str = _WHAT) -> None:
    """Raises compat.UntestedVersion if the installed Beam is outside `TESTED`."""
    check_version("apache_beam", installed_version("apache-beam"), TESTED, what)


# The packages of the clients `import apache_beam` tries (1. above), with Beam's own GCS modules:
# `apache_beam.io.filesystems` passes over a GCS file system that is not installed in silence,
# but warns about one whose client is missing. And Beam's loggers that warn when a client is
# missing (mongodbio: "Could not find a compatible bson package.").
_REMOTE_CLIENTS = ("pymongo", "bson", "google.cloud.storage", "pyarrow", "pyarrow_hotfix",
                   "apache_beam.io.gcp.gcsfilesystem", "apache_beam.io.gcp.gcsio")
_WARNS_WITHOUT = ("apache_beam.io.mongodbio",)


class _Refuse(importlib.abc.MetaPathFinder):
    """Answers an import of `_REMOTE_CLIENTS` (or a submodule) as a module that is not installed."""

    def find_spec(self, name, path=None, target=None):
        if any(name == c or name.startswith(c + ".") for c in _REMOTE_CLIENTS):
            raise ModuleNotFoundError(f"No module named {name!r} (not needed by a local run)", name=name)
        return None


def import_without_remote_clients() -> bool:
    """Imports `apache_beam` as if `_REMOTE_CLIENTS` were not installed; whether it did.

    They cost ~0.2-0.3 s of CPU (measured, of Beam's ~1 s import) at the
    start of every command, before anything else can run. Only for a run
    that touches no remote system: Beam registers no GCS file system and no
    Arrow batch converter in this process. Later imports of these modules
    (by code that wants them) work as usual: they are refused only while
    Beam is imported.

    Returns:
      False, and nothing done, where Beam is imported already or is outside
      `TESTED` (the caller's plain `import apache_beam` then imports it all).
    """
    if "apache_beam" in sys.modules:
        return False
    try:
        check("Importing Beam without its remote clients")
    except UntestedVersion:
        return False
    refuse = _Refuse()
    with contextlib.ExitStack() as stack:
        for name in _WARNS_WITHOUT:
            logger = logging.getLogger(name)
            stack.callback(setattr, logger, "disabled", logger.disabled)
            logger.disabled = True  # The warning is about a client the run does not use.
        sys.meta_path.insert(0, refuse)
        stack.callback(sys.meta_path.remove, refuse)
        import apache_beam  # noqa: F401
    return True


@contextlib.contextmanager
def untimed_local_flushes():
    """While open, the local runner's in-process workers send their outputs by size only, never on a timer.

    With `direct_running_mode="multi_threading"` (`beam_jobs._runner`), each
    worker flushes every output stream once a second from a timer thread,
    without the lock of the bundle's thread that writes elements into it:
    bytes written between the timer's read and clear of the buffer are lost,
    and an element can be cut in two. A step that emits for over a second
    (100,000 rejects of missing files, say) then loses elements unsaid, or
    fails to decode them ("Invalid PaneInfoEncoding", "Error decoding input
    stream"). A batch job needs no timed flush: buffers go out when full and
    at the bundle's end. The time limit is read when a worker starts (inside
    the runner's `run_pipeline`); a negative one turns the timer off (Beam
    takes 0 for "its default"). Beam's own limit is put back on exit, so that
    a caller's later pipelines in the same process run as Beam made them.

    Yields:
      True; False, with nothing done, where Beam is outside `TESTED`.
    """
    try:
        check("the local runner's untimed output flushes")
    except UntestedVersion:
        yield False
        return
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    before = worker_handlers.DATA_BUFFER_TIME_LIMIT_MS
    worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = -1
    try:
        yield True
    finally:
        worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = before


def bag_kwargs(dask_options: dict) -> dict:
    """The `dask.bag.from_sequence` arguments Beam's Dask runner takes from its options."""
    check()
    from apache_beam.runners.dask.dask_runner import DaskOptions

    return DaskOptions._extract_bag_kwargs(dask_options)


def overrides() -> list:
    """The PTransform overrides that turn a pipeline into the Dask runner's primitives."""
    check()
    from apache_beam.runners.dask.overrides import dask_overrides

    return dask_overrides()


def primitive_kind(transform) -> str | None:
    """'create', 'group_by_key', 'flatten' or 'reshuffle' for the Dask overrides' primitives."""
    from apache_beam.runners.dask import overrides as ov

    kinds = ((ov._Create, "create"), (ov._GroupByKeyOnly, "group_by_key"),
             (ov._Flatten, "flatten"), (ov._Reshuffle, "reshuffle"))
    return next((kind for cls, kind in kinds if isinstance(transform, cls)), None)


def side_input_views(side_inputs) -> list[tuple[type, dict]]:
    """(view class, view options) of each side input, to rebuild them on a worker."""
    return [(type(si), si._view_options()) for si in side_inputs]


def run_bundle(fn, args, kwargs, side_inputs, window_fn, label, elements, receivers) -> None:
    """Runs a DoFn over one bundle of WindowedValues, as Beam's workers do.

    Args:
      fn, args, kwargs: The ParDo's DoFn and its extra arguments.
      side_inputs: `SideInputMap`s, in the ParDo's order.
      window_fn: The main input's window function.
      label: The transform's full label.
      elements: The bundle's WindowedValues.
      receivers: Output receivers by tag (None: the main output).
    """
    check()
    from apache_beam import DoFn
    from apache_beam.runners import common

    handler = common._OutputHandler(
        window_fn=window_fn, main_receivers=receivers[None], tagged_receivers=receivers,
        per_element_output_counter=None, output_batch_converter=None,
        process_yields_batches=False, process_batch_yields_elements=False,
    )
    invoker = common.DoFnInvoker.create_invoker(
        common.DoFnSignature(fn), handler, context=common.DoFnContext(label, state=None),
        side_inputs=side_inputs, input_args=args, input_kwargs=kwargs,
        user_state_context=None, bundle_finalizer_param=DoFn.BundleFinalizerParam(),
    )
    invoker.invoke_setup()
    try:
        invoker.invoke_start_bundle()
        for element in elements:
            invoker.invoke_process(element)
        invoker.invoke_finish_bundle()
    finally:
        invoker.invoke_teardown()


def receiver_class():
    """Beam's `Receiver` base class (of what `run_bundle` hands outputs to)."""
    from apache_beam.runners.common import Receiver

    return Receiver


def dumps(value) -> bytes:
    """Pickles a DoFn and its arguments as Beam sends them to its workers."""
    from apache_beam.internal import pickler

    return pickler.dumps(value)


def loads(payload: bytes):
    """The inverse of `dumps`."""
    from apache_beam.internal import pickler

    return pickler.loads(payload)
