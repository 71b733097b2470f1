"""`DaskClusterRunner`: shardsmith's pipelines on a Dask distributed cluster (`--runner DaskRunner`).

Chosen by `_runner.make_runner`; the Beam internals it relies on are in
`compat.beam_internals`.
"""

from __future__ import annotations

import functools
import logging
import re
import time

from apache_beam.pipeline import PipelineVisitor
from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState

from compat import beam_internals

__all__ = ["DaskClusterRunner"]

_LOG = logging.getLogger("shardsmith.dask")

_BUNDLES_PER_THREAD = 4
# While waiting, the client checks every _POLL_S seconds; after _SETTLED_POLLS checks in a
# row in which the scheduler holds every remaining sink in memory, the job is done.
_POLL_S = 10.0
_SETTLED_POLLS = 2

# Beam 2.77's `apache_beam.runners.dask.dask_runner.DaskRunner` is the base of
# this one: same options (`--dask_client_address`, `--dask_scheduler_file`,
# `--dask_npartitions`, ...), same overrides, same Dask bags. Three things of
# its translation break shardsmith's pipelines, and are done differently here:
#   1. It hands every output of a multi-output ParDo to each of its tagged
#      PCollections (the shard writer's results, rejects and normalisations
#      all arrive in each of the three); here outputs keep their tags.
#   2. It computes side inputs inside the consuming task, with a nested
#      `compute` per side input: upstream work runs once per side input, and a
#      worker thread blocks on its own cluster. Here side inputs are ordinary
#      graph dependencies, computed once.
#   3. It computes only the last transform visited; here every sink.
# GroupByKey groups by the deterministically encoded key, as Beam does, then
# runs Beam's own GroupAlsoByWindow. Stateful DoFns, timers, splittable DoFns
# and Beam metrics are not supported.


class DaskClusterRunner(PipelineRunner):
    """Runs a pipeline on a Dask distributed cluster, one Dask task per bundle.

    Takes Beam's `DaskOptions`: `--dask_client_address tcp://HOST:8786` (or
    `--dask_scheduler_file`; without either, Dask starts a local cluster) and
    `--dask_npartitions` / `--dask_partition_size` for how `Create`d
    elements are cut into bundles (default: 4 per worker thread of the
    cluster when the job starts; shuffles keep the count).
    Workers must be able to import shardsmith and its dependencies.
    """

    @staticmethod
    def is_fnapi_compatible():
        return False

    def run_pipeline(self, pipeline, options):
        beam_internals.check()  # Before any work: a clear error on an untested Beam.
        import dask.distributed as ddist
        from apache_beam.runners.dask.dask_runner import DaskOptions

        dask_options = options.view_as(DaskOptions).get_all_options(
            drop_default=True, current_only=True
        )
        bag_kwargs = beam_internals.bag_kwargs(dask_options)
        try:
            client = ddist.Client(**dask_options)
        except (OSError, TimeoutError) as e:
            where = dask_options.get("address") or dask_options.get("scheduler_file")
            raise ConnectionError(
                f"--runner DaskRunner: no Dask scheduler answered at {where!r} "
                f"(--dask_client_address / --dask_scheduler_file): {e}"
            ) from e
        try:
            if not bag_kwargs:
                # shardsmith's Creates list work (files, shards), not data:
                # a few bundles per worker thread spread it over the cluster.
                threads = sum(client.nthreads().values())
                bag_kwargs = {"npartitions": max(1, _BUNDLES_PER_THREAD * threads)}
            pipeline.replace_all(beam_internals.overrides())
            translator = _BagTranslator(bag_kwargs)
            pipeline.visit(translator)
            futures = client.compute([bag.count() for bag in translator.sinks()])
        except BaseException:
            client.close()
            raise
        return _DaskResult(client, futures)


class _DaskResult(PipelineResult):
    """The futures of a pipeline's sinks; closes its client once they are done."""

    def __init__(self, client, futures):
        super().__init__(PipelineState.RUNNING)
        self._client = client
        self._futures = futures

    def wait_until_finish(self, duration=None):
        import dask.distributed as ddist

        deadline = None if duration is None else time.monotonic() + duration / 1000
        pending = set(self._futures)
        settled_polls = 0
        try:
            while pending:
                step = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
                if step <= 0:
                    return self._state
                try:
                    done, pending = ddist.wait(pending, timeout=step, return_when="FIRST_COMPLETED")
                except TimeoutError:
                    settled_polls = settled_polls + 1 if self._scheduler_has_finished(pending) else 0
                    if settled_polls >= _SETTLED_POLLS:
                        # Seen once in a test: every sink in memory on the scheduler and
                        # the client still waiting on its futures. The sinks' values
                        # (counts) are not needed, so the job is done.
                        _LOG.warning(
                            "The Dask scheduler reports the pipeline's %d remaining sink(s) done; "
                            "this client was not told. Taking the job as finished.", len(pending),
                        )
                        break
                    continue
                for future in done:
                    if future.status == "error":
                        future.result()  # Raises the worker's exception, as it was raised.
        except BaseException:
            self._state = PipelineState.FAILED
            self._client.close()
            raise
        # No gather: the sinks are counts nobody reads, and a gather is one more
        # round trip per sink to the workers that hold them.
        self._state = PipelineState.DONE
        self._client.close()
        return self._state

    def _scheduler_has_finished(self, futures):
        """Whether the scheduler holds every one of `futures` in memory."""

        def states(dask_scheduler, keys):  # Nested: pickled by value, the scheduler needs no shardsmith.
            tasks = dask_scheduler.tasks
            return [tasks[k].state if k in tasks else None for k in keys]

        try:
            found = self._client.run_on_scheduler(states, keys=[f.key for f in futures])
        except (OSError, TimeoutError) as e:  # A busy or restarting scheduler: ask next time.
            _LOG.debug("Could not ask the Dask scheduler for the sinks' states: %s", e)
            return False
        return all(state == "memory" for state in found)

    def cancel(self):
        self._client.cancel(self._futures)
        self._client.close()
        self._state = PipelineState.CANCELLED
        return self._state

    def metrics(self):
        raise NotImplementedError("DaskClusterRunner does not collect Beam metrics.")


def _task_name(label: str) -> str:
    """A Dask key prefix that names the Beam transform (shown on the dashboard)."""
    return "beam_" + re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_")


class _BagTranslator(PipelineVisitor):
    """A pipeline visitor that builds one Dask bag of WindowedValues per PCollection."""

    def __init__(self, bag_kwargs):
        self._bag_kwargs = bag_kwargs
        self._bags = {}  # PCollection -> dask.bag.Bag
        self._consumed = set()  # id() of PCollections read by a transform

    def sinks(self):
        """The bags of the PCollections that no transform reads."""
        return [bag for pcoll, bag in self._bags.items() if id(pcoll) not in self._consumed]

    def visit_transform(self, node):
        import apache_beam as beam
        import dask.bag as db

        transform = node.transform
        kind = beam_internals.primitive_kind(transform)
        inputs = [
            self._input(pcoll) for pcoll in node.main_inputs.values()
            if isinstance(pcoll, beam.pvalue.PCollection)  # Not PBegin.
        ]
        outputs = list(node.outputs.items())
        if kind == "create":
            values = list(transform.values)
            kwargs = dict(self._bag_kwargs)
            if "npartitions" in kwargs:
                kwargs["npartitions"] = max(1, min(kwargs["npartitions"], len(values)))
            bag = db.from_sequence(values, **kwargs).map(_in_global_window)
            self._set_only_output(node, bag)
        elif isinstance(transform, beam.ParDo):
            self._par_do(node, inputs[0], outputs)
        elif kind == "group_by_key":
            grouped = inputs[0].map(_key_and_encoded_key).groupby(_second, shuffle="tasks")
            self._set_only_output(node, grouped.map(_merge_group))
        elif kind == "flatten":
            bag = db.concat(inputs) if inputs else db.from_sequence([], npartitions=1)
            self._set_only_output(node, bag)
        elif kind == "reshuffle":
            self._set_only_output(node, inputs[0])
        else:
            raise NotImplementedError(
                f"DaskClusterRunner cannot run {node.full_label!r} "
                f"({type(transform).__name__}): supported are Create, ParDo, GroupByKey, "
                "Flatten and Reshuffle."
            )

    def _input(self, pcoll):
        self._consumed.add(id(pcoll))
        return self._bags[pcoll]

    def _set_only_output(self, node, bag):
        (pcoll,) = node.outputs.values()
        self._bags[pcoll] = bag

    def _par_do(self, node, input_bag, outputs):
        import dask.bag as db
        from dask.base import tokenize
        from dask.highlevelgraph import HighLevelGraph

        transform = node.transform
        side_bags = [self._input(si.pvalue) for si in node.side_inputs]
        views = beam_internals.side_input_views(node.side_inputs)
        window_fn = next(iter(node.main_inputs.values())).windowing.windowfn
        payload = beam_internals.dumps(
            (transform.fn, transform.args, transform.kwargs, views, window_fn, node.full_label)
        )
        # Built by hand: Dask finalises (and so recomputes) each collection
        # passed as an argument to map_partitions on its own.
        name = f"{_task_name(node.full_label)}-{tokenize(input_bag.name, payload, *side_bags)}"
        fn_key = f"{name}-fn"
        layer = {fn_key: payload}  # Sent to each worker once, not with every task.
        side_keys = []
        for j, bag in enumerate(side_bags):
            # Each side input: one list, computed once, read by every bundle.
            key = f"{name}-side{j}"
            layer[key] = (_concat, *[(bag.name, i) for i in range(bag.npartitions)])
            side_keys.append(key)
        for i in range(input_bag.npartitions):
            layer[(name, i)] = (_run_bundle, (input_bag.name, i), fn_key, *side_keys)
        graph = HighLevelGraph.from_collections(name, layer, dependencies=[input_bag, *side_bags])
        # (tag, WindowedValue) pairs; tag None for the main output.
        results = db.Bag(graph, name, input_bag.npartitions)
        for tag, pcoll in outputs:
            tag = None if tag in (None, "None") else tag
            self._bags[pcoll] = results.filter(functools.partial(_has_tag, tag)).map(_second)


def _in_global_window(value):
    from apache_beam.utils.windowed_value import WindowedValue
    from apache_beam.transforms.window import GlobalWindow

    return WindowedValue(value, 0, (GlobalWindow(),))


def _key_and_encoded_key(wv):
    """(WindowedValue of (k, v), key bytes): Beam groups by the encoded key."""
    from apache_beam.coders import coders

    key = wv.value[0]
    return wv, coders.FastPrimitivesCoder().as_deterministic_coder("GroupByKey").encode(key)


def _merge_group(group):
    from apache_beam.utils.windowed_value import WindowedValue
    from apache_beam.transforms.window import GlobalWindow

    _, members = group
    key = members[0][0].value[0]
    return WindowedValue((key, [wv.value[1] for wv, _ in members]), 0, (GlobalWindow(),))


def _concat(*parts):
    return [x for part in parts for x in part]


def _second(pair):
    return pair[1]


def _has_tag(tag, pair):
    return pair[0] == tag


def _run_bundle(elements, payload, *side_values):
    """Runs a DoFn over one partition (a bundle); returns [(tag, WindowedValue)]."""
    from apache_beam.transforms.sideinputs import SideInputMap

    fn, args, kwargs, views, window_fn, label = beam_internals.loads(payload)
    side_inputs = [
        SideInputMap(view_class, view_options, values)
        for (view_class, view_options), values in zip(views, side_values)
    ]
    out = []
    beam_internals.run_bundle(fn, args, kwargs, side_inputs, window_fn, label, elements,
                              _Receivers(out))
    return out


class _Receivers(dict):
    """Receivers by output tag, all appending (tag, WindowedValue) to one list."""

    def __init__(self, out):
        super().__init__()
        self._out = out

    def __missing__(self, tag):
        receiver = self[tag] = _tag_receiver(tag, self._out)
        return receiver


def _tag_receiver(tag, out):
    class _TagReceiver(beam_internals.receiver_class()):
        def receive(self, windowed_value):
            out.append((tag, windowed_value))

    return _TagReceiver()

