"""The shard-writing step: resume receipts, a worker process or this thread, and counters.

`WriteShardFn` is built from plain option groups (it is pickled to every
worker). What a shard's file holds is written by its kind of example (`conversion.examples.write_shard`),
in one of the worker processes of `processes` (`WritingOptions.worker_processes`)
or in the runner's own thread; either way the same bytes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

import schemas
from conversion import guard, listing, processes as _processes, recovery
from conversion.elements import ShardResult
from conversion.examples import warm_call, write_shard
from conversion.options import WritingOptions
from conversion.receipts import RECEIPTS_DIRNAME, Receipts, shard_fingerprint
from conversion.shard_writer import ShardFile, ShardJob, ShardOutcome, default_threads
from imaging import ValidationOptions

__all__ = ["WriteShardFn", "RECEIPTS_DIRNAME"]

_LOG = logging.getLogger("shardsmith.convert")
_NAMESPACE = "shardsmith"
# A shard whose worker processes die this often is given up (each death blames a file or retries once).
_MAX_CRASHES_PER_SHARD = 50


# Declared (the main output's): Beam would otherwise infer it from the bytecode of
# `process` (~0.1 s per DoFn, on the driver, before any work starts).
@beam.typehints.with_output_types(ShardResult)
class WriteShardFn(beam.DoFn):
    """Reads, validates and writes the images of one shard.

    Input: ((split, shard_index), iterable of PlannedFile).
    Main output: ShardResult. Tagged outputs: REJECTED (Reject) and
    NORMALIZED ((record filename, source_format, actions, details or None)).

    After a shard and its index are renamed into place, a small receipt with
    everything the manifest needs from the shard is saved in the temporary
    folder; with `writing.resume`, a shard whose receipt and file still match
    is not written again.

    Args:
      output_dir: Folder of the shards.
      num_classes: Number of classes (for per-shard class counts).
      total_shards: Shards of all splits together (for progress lines).
      validation: The `imaging.ValidationOptions` of every file.
      writing: The `WritingOptions` (resume, worker processes and threads).
      targets: The kinds of target every record carries (`schemas.TARGET_KINDS`).
    """

    REJECTED = "rejected"
    NORMALIZED = "normalized"

    def __init__(self, *, output_dir: str, num_classes: int, total_shards: int,
                 validation: ValidationOptions, writing: WritingOptions | None = None,
                 targets: tuple[str, ...] = ()):
        # Plain values only: the DoFn is pickled to every worker.
        self._targets = tuple(targets)
        self._output_dir = output_dir
        # This run's progress counter, shared by the DoFn's copies in this process' threads.
        self._run = uuid.uuid4().hex
        self._num_classes = num_classes
        self._total_shards = total_shards
        self._validation = validation
        self._writing = writing or WritingOptions()
        self._written = Metrics.counter(_NAMESPACE, "records_written")
        self._shards = Metrics.counter(_NAMESPACE, "shards_written")
        self._resumed = Metrics.counter(_NAMESPACE, "shards_resumed")
        self._pool = None

    def setup(self):
        self._receipts = Receipts(self._output_dir)
        # Files that crashed or hung a process in this run or an earlier one (--resume).
        self._quarantine = guard.Quarantine(guard.quarantine_path(self._output_dir))
        self._quarantined = self._quarantine.load()
        self._crashes_seen = {}
        processes = self._writing.worker_processes
        if not processes and self._writing.isolated:
            processes = _threads_of_this_worker()
        if processes:
            # Shared with the driver, which started them early (`convert.run`).
            self._pool = _processes.acquire(processes, warm=warm_call(self._validation, processes),
                                            file_timeout=self._writing.file_timeout)
            # One thread per worker process waits on it: the shards of a
            # bundle are written at once, whatever the runner's threads.
            self._waiting = concurrent.futures.ThreadPoolExecutor(processes, "shardsmith-shard")

    def teardown(self):
        if self._pool is not None:
            self._waiting.shutdown(cancel_futures=True)
            _processes.release(self._pool)
            self._pool = None

    def start_bundle(self):
        self._in_flight = collections.deque()  # Futures of shards written in worker processes

    def process(self, element):
        (split, index), files = element
        files = sorted(files)
        name = schemas.shard_filename(split, index, files[0].num_shards)
        fingerprint = self._fingerprint(files)
        outcome = self._receipts.load(name, fingerprint) if self._writing.resume else None
        if outcome is not None:
            self._resumed.inc()
            _LOG.info("Kept %s from the interrupted run (--resume)", name)
            yield from self._outputs(outcome, written=False)
        elif self._pool is None:
            yield from self._outputs(self._write_and_save(split, index, name, files, fingerprint))
        else:
            # At most one shard per process in flight: each holds its files'
            # list (memory stays bounded whatever the number of shards).
            while len(self._in_flight) >= self._pool.processes:
                yield from self._outputs(self._in_flight.popleft().result())
            self._in_flight.append(self._waiting.submit(self._write_and_save, split, index, name,
                                                        files, fingerprint))
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

    def _write_and_save(self, split, index, name, files, fingerprint) -> ShardOutcome:
        _progress_of(self._run).started(name)
        outcome = self._write(split, index, name, files)
        self._receipts.save(name, fingerprint, outcome)
        self._log_written(name, outcome)
        return outcome

    def _write(self, split, index, name, files) -> ShardOutcome:
        """Writes the shard and its index (in a worker process, if there are some).

        A worker process that dies on a file (a crash, --file_timeout) costs
        that file only: it is found from the process's journal, quarantined,
        and the shard is written again without it (`recovery.crash_culprits`).
        """
        job = self._job(split, index, name, files, pooled=self._pool is not None)
        if self._pool is None:
            return write_shard(job)
        for _ in range(_MAX_CRASHES_PER_SHARD):
            try:
                return self._pool.call(write_shard, job)
            except _processes.WorkerDied as e:
                found = recovery.crash_culprits(self._pool.journal_folder, e.pid, e.returncode,
                                              self._validation, self._writing.file_timeout,
                                              self._crashes_seen)
                if found is None:  # Not while working on a file: not a file's doing.
                    raise _processes.WorkerDied(f"{e} Shard: {name} ({len(files)} files).", e.pid,
                                                e.returncode) from None
                for path, (reason, message) in sorted(found.items()):
                    _LOG.warning("Rejected %s (%s): %s", path, reason, message)
                if found:
                    self._quarantined = self._quarantine.add(found)
                job = dataclasses.replace(job, quarantined=self._quarantined_of(files))
        raise _processes.WorkerDied(f"Shard {name}: its worker processes died {_MAX_CRASHES_PER_SHARD} times.")

    def _job(self, split, index, name, files, pooled: bool) -> ShardJob:
        """The `ShardJob` of a shard's sorted PlannedFiles (`_quarantined` loaded)."""
        return ShardJob(
            output_dir=self._output_dir, split=split, index=index, num_shards=files[0].num_shards,
            name=name, files=tuple(_shard_file(f) for f in files), num_classes=self._num_classes,
            validation=self._validation,
            # A worker process has no other thread to hand the GIL to: it
            # reads and validates in its own, unless told otherwise.
            threads=self._writing.worker_threads or (0 if pooled else default_threads()),
            quarantined=self._quarantined_of(files),
            targets=self._targets,
        )

    def start_early(self, pool: _processes.WorkerProcesses, shards) -> None:
        """Starts writing `shards` in `pool` now, in the driver, before the pipeline runs.

        The DoFn's own calls for these shards then get their outcomes
        (`processes.WorkerProcesses.start_early`): the worker processes work
        while Beam's runner starts. The jobs are those `process` makes of
        the same planned files (and this run's quarantine); a shard whose
        job differs by then is written again by `process`, the same bytes.

        Args:
          pool: The worker processes that `setup` will acquire (the driver's).
          shards: Lists of the PlannedFiles of each shard to start, from the plan.
        """
        self._quarantined = guard.Quarantine(guard.quarantine_path(self._output_dir)).load()
        for files in shards:
            files = sorted(files)
            name = schemas.shard_filename(files[0].split, files[0].shard, files[0].num_shards)
            pool.start_early(write_shard, self._job(files[0].split, files[0].shard, name, files, pooled=True))

    def _quarantined_of(self, files) -> tuple:
        """(rel_path, reason, message) of the shard's quarantined files."""
        q = self._quarantined
        if not q:
            return ()
        return tuple((f.rel_path, *q[f.rel_path]) for f in files if f.rel_path in q)

    def _fingerprint(self, files) -> str:
        """What the shard's bytes depend on (`conversion.receipts.shard_fingerprint`)."""
        return shard_fingerprint(self._validation, files)

    def _log_written(self, name, outcome) -> None:
        result, rejects, _ = outcome
        _LOG.info(
            "Wrote %s: %s image%s%s [%d of %d shards done]",
            name, f"{result.num_records:,}", "" if result.num_records == 1 else "s",
            f", {len(rejects)} rejected" if rejects else "",
            _progress_of(self._run).done(name, self._shards_on_disk), self._total_shards,
        )

    def _shards_on_disk(self) -> set[str]:
        # Workers share no memory; the finished shards on disk are the progress.
        pattern = FileSystems.join(self._output_dir, "*.tfrecord")
        return {m.path.rsplit("/", 1)[-1] for m in FileSystems.match([pattern])[0].metadata_list}


class _Progress:
    """The shards done so far for the progress lines of one run, in this process.

    The shards on disk, less those this process is still to report: two
    threads that finish together each see both shards on disk, and would
    both say "[4 of 7 shards done]".
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._reported: set[str] = set()

    def started(self, name: str) -> None:
        with self._lock:
            self._pending.add(name)

    def done(self, name: str, on_disk) -> int:
        """Shards done once `name` is, counted as each is reported; `on_disk()` lists the folder's."""
        with self._lock:
            self._pending.discard(name)
            self._reported.add(name)
            return len((on_disk() - self._pending) | self._reported)


_PROGRESS: dict[str, _Progress] = {}
_PROGRESS_LOCK = threading.Lock()


def _progress_of(run: str) -> _Progress:
    with _PROGRESS_LOCK:
        return _PROGRESS.setdefault(run, _Progress())


def _threads_of_this_worker() -> int:
    """The threads of the Dask worker running this DoFn (each may write a shard at once); else 1."""
    try:
        from dask.distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # Not on a Dask worker.
        return 1
    state = getattr(worker, "state", worker)
    return max(1, int(getattr(state, "nthreads", 1) or 1))


def _shard_file(f) -> ShardFile:
    """The `ShardFile` of a PlannedFile; a copy (--dedup) carries its reject message."""
    duplicate = None
    if f.duplicate_of is not None:
        duplicate = "same content as " + listing.display_path(f.duplicate_of)
    return ShardFile(f.rel_path, f.path, f.size, f.label, duplicate, f.targets, f.patch_rows)
