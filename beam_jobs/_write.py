"""The shard-writing step: a thin Beam adapter over `conversion.shard_maker.ShardMaker`.

`WriteShardFn` is built from the conversion's `ShardSpec` (pickled to every
worker); `setup` gets the run's `ShardMaker` (the driver's, in its process),
`process` asks it for each shard, and the outputs are tagged and counted here.
"""

from __future__ import annotations

import collections

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from conversion.elements import ShardOutcome, ShardResult
from conversion.receipts import RECEIPTS_DIRNAME
from conversion.shard_maker import ShardMaker, ShardSpec
from conversion.shard_plans import load_shard_plan

__all__ = ["WriteShardFn", "RECEIPTS_DIRNAME"]

_NAMESPACE = "shardsmith"


# Declared (the main output's): Beam would otherwise infer it from the bytecode of
# `process` (~0.1 s per DoFn, on the driver, before any work starts).
@beam.typehints.with_output_types(ShardResult)
class WriteShardFn(beam.DoFn):
    """Reads, validates and writes the images of one shard, with the run's `ShardMaker`.

    Input: ((split, shard_index), iterable of PlannedFile), or the path of
    a shard plan file (`conversion.shard_plans`), read by the worker process
    that writes it where there are some (else here).
    Main output: ShardResult. Tagged outputs: REJECTED (Reject) and
    NORMALIZED ((record filename, source_format, actions, details or None)).

    With worker processes, the shards of a bundle are written at once (one
    per process), whatever the runner's threads; with `writing.resume`, a
    shard whose receipt and file still match is not written again.

    Args:
      spec: The conversion's `ShardSpec`.
    """

    REJECTED = "rejected"
    NORMALIZED = "normalized"

    def __init__(self, spec: ShardSpec):
        self._spec = spec  # Plain values only: the DoFn is pickled to every worker.
        self._written = Metrics.counter(_NAMESPACE, "records_written")
        self._shards = Metrics.counter(_NAMESPACE, "shards_written")
        self._resumed = Metrics.counter(_NAMESPACE, "shards_resumed")
        self._maker = None

    def setup(self):
        writing = self._spec.writing
        processes = writing.worker_processes
        if not processes and writing.isolated:
            processes = _threads_of_this_worker()
        # In the driver's process, the driver's maker: its processes started early.
        self._maker = ShardMaker.shared(self._spec, processes or 0)
        self._released = False

    def teardown(self):
        # The maker stays: a bundle still in flight when the run is stopped (Ctrl-C) writes in
        # this thread, its worker processes gone, rather than fail on a missing maker.
        if self._maker is not None and not getattr(self, "_released", False):
            self._released = True
            self._maker.release()

    def start_bundle(self):
        self._in_flight = collections.deque()  # Futures of shards written in worker processes

    def process(self, element):
        maker = self._maker
        if isinstance(element, str):  # A shard plan file's path (`conversion.shard_plans`)
            if maker.processes and not maker.spec.writing.resume:
                # A worker process reads the plan itself (`ShardMaker.write_plan`).
                yield from self._in_pool(lambda: maker.write_plan_later(element))
                return
            element = load_shard_plan(element)
        (split, index), files = element
        shard = maker.shard(split, index, files)
        outcome = maker.kept(shard)
        if outcome is not None:
            self._resumed.inc()
            yield from self._outputs(outcome, written=False)
        elif not maker.processes:
            yield from self._outputs(maker.write(shard))
        else:
            yield from self._in_pool(lambda: maker.write_later(shard))

    def _in_pool(self, submit):
        """Submits a shard to the worker processes (`submit()`: its future); the outputs of those done."""
        # At most one shard per process in flight: each holds its files'
        # list (memory stays bounded whatever the number of shards).
        while len(self._in_flight) >= self._maker.processes:
            yield from self._outputs(self._in_flight.popleft().result())
        self._in_flight.append(submit())
        # What finished meanwhile goes on now (any element's outputs are
        # this window's: the global one).
        while self._in_flight and self._in_flight[0].done():
            yield from self._outputs(self._in_flight.popleft().result())

    def finish_bundle(self):
        while self._in_flight:
            for output in self._outputs(self._in_flight.popleft().result()):
                if isinstance(output, beam.pvalue.TaggedOutput):
                    yield beam.pvalue.TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))
                else:
                    yield GlobalWindows.windowed_value(output)

    def _outputs(self, outcome: ShardOutcome, written: bool = True):
        """The shard's rejects and normalisations (tagged), then its result; counted."""
        result, rejects, normalized = outcome
        if written:
            # Once per shard: a counter call per record costs more than framing it.
            self._written.inc(result.num_records)
            self._shards.inc()
        for reject in rejects:
            Metrics.counter(_NAMESPACE, f"rejected_{reject.reason}").inc()
            yield beam.pvalue.TaggedOutput(self.REJECTED, reject)
        for item in normalized:
            yield beam.pvalue.TaggedOutput(self.NORMALIZED, item)
        yield result


def _threads_of_this_worker() -> int:
    """The threads of the Dask worker running this DoFn (each may write a shard at once); else 1."""
    try:
        from dask.distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # Not on a Dask worker.
        return 1
    state = getattr(worker, "state", worker)
    return max(1, int(getattr(state, "nthreads", 1) or 1))
