"""A shard's whole life, from its planned files to its file, its index and its receipt: `ShardMaker`.

One object per conversion and process owns everything about making shards:

- the `ShardSpec`, one frozen value with what every shard is written with
  (output folder, validation and writing options, classes, targets);
- the worker processes that write them (`conversion.processes`), with the
  spec's one `--file_timeout`, started early (while the driver plans) and
  handed the first shards before the runner starts (`start_early`);
- resume receipts and the fingerprint that keys them (`conversion.receipts`);
- crash retry: a worker process that dies on a file costs that file only
  (`conversion.recovery.crash_culprits`, the quarantine of `conversion.guard`);
- the progress lines ("[4 of 7 shards done]").

The driver makes it from the conversion's config (`ShardMaker.shared`) and
completes its spec once the plan is known; a runner's shard writer
(`beam_jobs._write.WriteShardFn`, a thin adapter) gets the same maker when it
runs in the driver's process, or makes its own from the spec elsewhere:

    maker = ShardMaker.shared(spec, processes=2)
    try:
        shard = maker.shard("train", 0, planned_files)
        outcome = maker.kept(shard) or maker.write(shard)
    finally:
        maker.release()

Beam-free: what a shard's file holds is its kind of example's
(`conversion.examples.write_shard`).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import logging
import operator
import os
import threading
import uuid

import schemas
from conversion import guard, listing, processes as _processes, recovery
from conversion.elements import ShardOutcome
from conversion.examples import kind_for, warm_call, write_shard
from conversion.files import join, match
from conversion.options import WritingOptions
from conversion.plan import PlannedFile
from conversion.receipts import Receipts, shard_fingerprint
from conversion.shard_plans import load_shard_plan, plan_shard
from conversion.shard_writer import ShardFile, ShardJob, default_threads
from imaging import ValidationOptions

__all__ = ["ShardSpec", "PlannedShard", "ShardMaker", "shard_file", "worker_processes", "first_shards",
           "needs_decoders", "write_planned_shard", "planned_spec"]

_LOG = logging.getLogger("shardsmith.convert")
# Worker processes by default only from this many files: each costs ~0.6 s of
# CPU to start, and ~2 s more and ~300 MB with TensorFlow's decode ops.
_PROCESSES_MIN_FILES = 1000
# ... and only for a folder whose validation is mostly Python work: rasters
# and DICOM files (tifffile, pydicom, numpy), small images (a fixed ~0.1 ms
# per file around TensorFlow's decode), or JPEG and PNG photos, checked
# without TensorFlow (`imaging.formats._jpeg_fast`, `_png_fast`: markers and
# chunks walked in Python around Pillow's or zlib's work). Other photos'
# decodes release the GIL for most of their time: threads use every core.
# (On 2 cores: 100,000 1.4 KB JPEGs 15.2 s in threads, 13.4 s with 2
# processes; 20,000 13-band rasters 37.5 s and 13.1 s; 2,000 ~125 KB photos,
# 90% JPEG, 3.12-3.18 s and 2.79-2.84 s with 2 processes that load no
# TensorFlow, 3.01-3.12 s with 2 that load its decode ops ahead, as they
# did before JPEGs were checked without it: 6.8 s and 7.8 s then.)
_PYTHON_BOUND_SUFFIXES = (".tif", ".tiff", ".dcm", ".dicom")
# Photos validated without TensorFlow's decode ops where plain (the checks above).
_CHECKED_SUFFIXES = (".jpg", ".jpeg", ".png")
# ... or from this many planned bytes of scenes' patches (--raster_patch): one scene is
# one file, but its work items are Python-bound (band statistics, nodata shares,
# encoding) while their tiles decode (a 6144 x 6144 x 13 uint16 scene, 981 MB, on 2
# cores: 22.5 s in threads, 13.8 s with 2 processes).
_PROCESSES_MIN_SCENE_BYTES = 64 << 20
_SMALL_FILE_BYTES = 32 * 1024
# Files that a worker process reads without TensorFlow's decoders (rasters
# stored raw); any other file has it load them while the driver plans.
_RASTER_SUFFIXES = (".tif", ".tiff")

# A shard whose worker processes die this often is given up (each death blames a file or retries once).
_MAX_CRASHES_PER_SHARD = 50


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """What every shard of one conversion is written with; plain values, pickled to the runner's workers.

    Attributes:
      output_dir: Folder of the shards.
      validation: The `imaging.ValidationOptions` of every file.
      writing: The `WritingOptions`: resume, worker processes and threads, --file_timeout.
      num_classes: Number of classes (for per-shard class counts).
      total_shards: Shards of all splits together (for progress lines).
      targets: The kinds of target every record carries (`schemas.TARGET_KINDS`), sorted.
      run: This run of the conversion (a random id): the driver's maker and
        the runner's shard writers in the driver's process share one maker
        (`ShardMaker.shared`); another run never shares it.
    """

    output_dir: str
    validation: ValidationOptions = ValidationOptions()
    writing: WritingOptions = WritingOptions()
    num_classes: int = 0
    total_shards: int = 0
    targets: tuple[str, ...] = ()
    run: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets))


@dataclasses.dataclass(frozen=True)
class PlannedShard:
    """One shard to make: which one, its planned files in record order, and its fingerprint."""

    split: str
    index: int
    name: str
    files: tuple
    fingerprint: str


def planned_spec(spec: ShardSpec, plan, config) -> ShardSpec:
    """`spec` completed with what the plan decided (classes, shards, targets) and the settled writing.

    Args:
      spec: The spec the driver's maker was made with.
      plan: The conversion's `conversion.plan.Plan`.
      config: The `conversion.config.ConversionConfig`, its writing settled.
    """
    return dataclasses.replace(
        spec, writing=config.writing, num_classes=len(plan.class_names),
        total_shards=sum(plan.shard_counts.values()), targets=plan.target_kinds)


class ShardMaker:
    """Makes the shards of one conversion in this process, and owns what that takes.

    Use `ShardMaker.shared(spec)` (one maker per run and process, released by
    each user) rather than the constructor.

    Args:
      spec: The `ShardSpec`.
    """

    def __init__(self, spec: ShardSpec):
        self._spec = spec
        self._receipts = Receipts(spec.output_dir)
        self._quarantine = guard.Quarantine(guard.quarantine_path(spec.output_dir))
        self._quarantined: dict = {}
        self._crashes_seen: dict = {}
        self._crash_lock = threading.Lock()
        self._pool: _processes.WorkerProcesses | None = None
        self._waiting: concurrent.futures.ThreadPoolExecutor | None = None
        self._decoders = True
        self._progress = _Progress()
        self._users = 0

    # --- Sharing: one maker per run in a process ------------------------------------------

    @classmethod
    def shared(cls, spec: ShardSpec, processes: int = 0) -> ShardMaker:
        """The maker of `spec`'s run in this process, made if there is none; give it back with `release`.

        The driver's maker, found by a shard writer in its process, has its
        worker processes already (and the first shards started early); a
        maker without any starts `processes` of them.
        """
        with _MAKERS_LOCK:
            maker = _MAKERS.get(spec.run)
            if maker is None:
                if not _MAKERS:
                    atexit.register(_close_all)
                maker = _MAKERS[spec.run] = cls(spec)
            maker._users += 1
            if processes and maker._pool is None:
                maker.start_processes(processes)
        maker.load_quarantine()
        return maker

    def release(self) -> None:
        """Gives back a maker of `shared`; the last user closes its worker processes."""
        with _MAKERS_LOCK:
            self._users -= 1
            if self._users > 0:
                return
            if _MAKERS.get(self._spec.run) is self:
                del _MAKERS[self._spec.run]
        self._close_pool()

    def abort(self) -> None:
        """Kills the worker processes now, whoever else uses the maker: its run failed or was interrupted.

        Their children ignore Ctrl-C and would finish their shards first.
        """
        with _MAKERS_LOCK:
            if _MAKERS.get(self._spec.run) is self:
                del _MAKERS[self._spec.run]
        self._close_pool(kill=True)

    # --- The spec and the worker processes -------------------------------------------------

    @property
    def spec(self) -> ShardSpec:
        return self._spec

    @spec.setter
    def spec(self, spec: ShardSpec) -> None:
        """The spec completed once the plan is known (classes, shards, targets, the settled writing).

        What the worker processes were started for stays: the same run,
        output folder, validation options and --file_timeout.
        """
        old = self._spec
        if (spec.run, spec.output_dir, spec.validation, spec.writing.file_timeout, spec.writing.file_memory) != (
                old.run, old.output_dir, old.validation, old.writing.file_timeout, old.writing.file_memory):
            raise ValueError("A maker's spec changes only in what the plan decides.")
        self._spec = spec

    @property
    def processes(self) -> int:
        """The worker processes writing the shards (0: this process's own threads write them)."""
        return 0 if self._pool is None else self._pool.processes

    @property
    def pool(self) -> _processes.WorkerProcesses | None:
        """The worker processes (`conversion.processes.WorkerProcesses`), or None."""
        return self._pool

    def start_processes(self, processes: int, decoders: bool | None = None, fork: bool = False) -> None:
        """Has `processes` worker processes write the shards from now on (0: this process's threads).

        Started now, they load their decoders while the caller goes on; a
        pool of another size is closed first.

        Args:
          processes: How many.
          decoders: Whether they load TensorFlow's decoders (not for a folder
            of rasters stored raw); None: as the last start asked (yes at first).
          fork: Fork them from this process where that is safe (before Beam
            and TensorFlow are imported: `processes.WorkerProcesses`), so that
            they start with its modules.
        """
        if decoders is not None:
            self._decoders = decoders
        if self.processes == processes:
            return
        self._close_pool()
        if not processes:
            return
        self._pool = _processes.WorkerProcesses(
            processes, warm=warm_call(self._spec.validation, processes, self._decoders),
            file_timeout=self._spec.writing.file_timeout, file_memory=self._spec.writing.memory_bound, fork=fork)
        # One thread per worker process waits on it (`write_later`).
        self._waiting = concurrent.futures.ThreadPoolExecutor(processes, "shardsmith-shard")

    def _close_pool(self, kill: bool = False) -> None:
        pool, self._pool = self._pool, None
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            # Killed: its threads' calls fail as their children die; else they are done by now.
            waiting.shutdown(wait=not kill, cancel_futures=True)
        if pool is not None:
            pool.close(kill=kill)

    def load_quarantine(self) -> None:
        """Reads the files that crashed or hung a process in this run or an earlier one (--resume)."""
        with self._crash_lock:
            self._quarantined = self._quarantine.load()

    # --- A shard's life ------------------------------------------------------------------------

    def shard(self, split: str, index: int, files) -> PlannedShard:
        """The `PlannedShard` of a shard's PlannedFiles (in any order)."""
        files = in_order(files)
        name = schemas.shard_filename(split, index, files[0].num_shards, self._spec.writing.version)
        fingerprint = shard_fingerprint(self._spec.validation, files)
        return PlannedShard(split, index, name, files, fingerprint)

    def kept(self, shard: PlannedShard) -> ShardOutcome | None:
        """With --resume, the outcome of a shard an interrupted run finished, if it is still as written."""
        if not self._spec.writing.resume:
            return None
        outcome = self._receipts.load(shard.name, shard.fingerprint)
        if outcome is not None:
            _LOG.info("Kept %s from the interrupted run (--resume)", shard.name)
        return outcome

    def write(self, shard: PlannedShard) -> ShardOutcome:
        """Writes the shard and its index, saves its receipt and logs it; in a worker process if there are some."""
        self._progress.started(shard.name)
        outcome = self._write(shard) if self._pool is None else self._write_in_pool(shard)
        self._receipts.save(shard.name, shard.fingerprint, outcome)
        self._log_written(shard.name, outcome)
        return outcome

    def write_later(self, shard: PlannedShard) -> concurrent.futures.Future:
        """`write` on a thread of the maker's own, which waits on a worker process; its future.

        The caller keeps at most `processes` in flight: each holds its files'
        list, and memory stays bounded whatever the number of shards.
        """
        if self._waiting is None:
            raise RuntimeError("No worker processes: `write` the shard in this thread.")
        return self._waiting.submit(self.write, shard)

    def start_early(self, shards) -> None:
        """Starts writing `shards` in the worker processes now, before the runner asks for them.

        The first `write` of each then gets its outcome
        (`processes.WorkerProcesses.start_early`): the worker processes work
        while Beam's runner starts. The jobs are those `write` makes of the
        same planned files (and this run's quarantine); a shard whose job
        differs by then is written again, the same bytes.

        Args:
          shards: Lists of the PlannedFiles of each shard to start, from the plan.
        """
        self.load_quarantine()
        for files in shards:
            shard = self.shard(files[0].split, files[0].shard, files)
            self._pool.start_early(write_shard, self._job(shard))

    def _write(self, shard: PlannedShard) -> ShardOutcome:
        return write_shard(self._job(shard))

    def write_plan(self, path: str) -> ShardOutcome:
        """`write` of the shard whose planned files are in the shard plan file `path`, read by a worker process.

        The worker process loads the plan, writes the shard and saves its
        receipt (`write_planned_shard`): the driver neither loads the files
        nor pickles them to it (100,000 tiny files: ~1.5 s of the driver's
        CPU). Only with worker processes and without --resume, whose kept
        shards are known by their fingerprint before any is written.
        """
        if self._pool is None or self._spec.writing.resume:
            raise RuntimeError("write_plan needs worker processes and no --resume: load the plan, then `write`.")
        job = self._plan_job(path)
        self._progress.started(job.name)
        outcome = self._call_in_pool(job.name, None, lambda: self._plan_job(path), write_planned_shard, job, path)
        self._log_written(job.name, outcome)
        return outcome

    def write_plan_later(self, path: str) -> concurrent.futures.Future:
        """`write_plan` on a thread of the maker's own, which waits on a worker process; its future."""
        if self._waiting is None:
            raise RuntimeError("No worker processes: load the plan, then `write` the shard in this thread.")
        return self._waiting.submit(self.write_plan, path)

    def start_early_plans(self, paths) -> None:
        """`start_early` for `write_plan`: the shards of the plan files `paths` start now."""
        self.load_quarantine()
        for path in paths:
            self._pool.start_early(write_planned_shard, self._plan_job(path), path)

    def _plan_job(self, path: str) -> ShardJob:
        """The `ShardJob` of a shard plan file, without its files (`write_planned_shard` reads them).

        It carries the whole quarantine (as loaded): the worker keeps its files' entries.
        """
        spec = self._spec
        split, index, count = plan_shard(path)
        q = self._quarantined
        return ShardJob(
            output_dir=spec.output_dir, split=split, index=index, num_shards=count,
            name=schemas.shard_filename(split, index, count, spec.writing.version), files=(),
            num_classes=spec.num_classes, validation=spec.validation,
            threads=spec.writing.worker_threads or 0,
            quarantined=tuple((p, *q[p]) for p in sorted(q)),
            targets=spec.targets,
        )

    def _write_in_pool(self, shard: PlannedShard) -> ShardOutcome:
        """Writes the shard in a worker process; one that dies on a file costs that file only."""
        job = self._job(shard)
        return self._call_in_pool(
            shard.name, len(shard.files),
            lambda: dataclasses.replace(job, quarantined=self._quarantined_of(shard.files)), write_shard, job)

    def _call_in_pool(self, name: str, count: int | None, requarantined, fn, job: ShardJob, *args):
        """`fn(job, *args)` in a worker process; one that dies on a file costs that file only.

        The file is found from the process's journal, quarantined, and the
        shard is written again without it (`recovery.crash_culprits`), with
        the job `requarantined()` makes.
        """
        for _ in range(_MAX_CRASHES_PER_SHARD):
            try:
                return self._pool.call(fn, job, *args)
            except _processes.WorkerDied as e:
                self._blame(name, count, e)
                job = requarantined()
        raise _processes.WorkerDied(f"Shard {name}: its worker processes died {_MAX_CRASHES_PER_SHARD} times.")

    def _blame(self, name: str, count: int | None, died: _processes.WorkerDied) -> None:
        """Quarantines the files a dead worker process was working on; raises if it was none's doing."""
        with self._crash_lock:
            found = recovery.crash_culprits(self._pool.journal_folder, died.pid, died.returncode,
                                            self._spec.validation, self._spec.writing.file_timeout,
                                            self._crashes_seen, self._spec.writing.memory_bound)
            if found is None:  # Not while working on a file: not a file's doing.
                files = "" if count is None else f" ({count} files)"
                raise _processes.WorkerDied(f"{died} Shard: {name}{files}.",
                                            died.pid, died.returncode) from None
            for path, (reason, message) in sorted(found.items()):
                _LOG.warning("Rejected %s (%s): %s", path, reason, message)
            if found:
                self._quarantined = self._quarantine.add(found)

    def _job(self, shard: PlannedShard) -> ShardJob:
        """The `ShardJob` of a shard (the quarantine as loaded)."""
        spec, files = self._spec, shard.files
        return ShardJob(
            output_dir=spec.output_dir, split=shard.split, index=shard.index, num_shards=files[0].num_shards,
            name=shard.name, files=tuple(shard_file(f) for f in files), num_classes=spec.num_classes,
            validation=spec.validation,
            # A worker process has no other thread to hand the GIL to: it
            # reads and validates in its own, unless told otherwise.
            threads=spec.writing.worker_threads or (0 if self._pool is not None else default_threads()),
            quarantined=self._quarantined_of(files),
            targets=spec.targets,
        )

    def _quarantined_of(self, files) -> tuple:
        """(rel_path, reason, message) of the shard's quarantined files."""
        q = self._quarantined
        if not q:
            return ()
        return tuple((f.rel_path, *q[f.rel_path]) for f in files if f.rel_path in q)

    def _log_written(self, name: str, outcome: ShardOutcome) -> None:
        result, rejects, _ = outcome
        _LOG.info(
            "Wrote %s: %s %s%s%s [%d of %d shards done]",
            name, f"{result.num_records:,}", kind_for(self._spec.validation).record_noun,
            "" if result.num_records == 1 else "s",
            f", {len(rejects)} rejected" if rejects else "",
            self._progress.done(name, self._shards_on_disk), self._spec.total_shards,
        )

    def _shards_on_disk(self) -> set[str]:
        # The runner's workers share no memory; the finished shards on disk are the progress
        # (this version's: an append's folder holds the shards of earlier ones too).
        version = self._spec.writing.version
        names = {path.rsplit("/", 1)[-1] for path in match(join(self._spec.output_dir, "*.tfrecord"))}
        return {name for name in names if (m := schemas.manifest.SHARD_FILENAME_RE.match(name))
                and int(m["version"] or 1) == version}


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


# The makers of the runs going on in this process, by `ShardSpec.run`: the driver's, found by
# the runner's shard writers when they run in its process (on its threads).
_MAKERS: dict[str, ShardMaker] = {}
_MAKERS_LOCK = threading.RLock()


def _close_all() -> None:
    with _MAKERS_LOCK:
        makers = list(_MAKERS.values())
        _MAKERS.clear()
    for maker in makers:
        maker._close_pool()


def first_shards(files, count: int) -> list[list]:
    """The PlannedFiles of the plan's first `count` shards (in (split, shard) order), a list each."""
    shards: list[list] = []
    key = None
    for f in files:  # In (split, shard, order) order (`conversion.plan.make_plan`).
        if (f.split, f.shard) != key:
            if len(shards) == count:
                break
            key = (f.split, f.shard)
            shards.append([])
        shards[-1].append(f)
    return shards


def worker_processes(asked: int | None, files, shards: int | None, runner_threads: int) -> int:
    """How many worker processes write the shards: `asked`, or what suits the runner and input.

    By default: one per core where the runner runs its DoFns in this
    process's threads (Beam's local runner) on a machine of several cores,
    for `_PROCESSES_MIN_FILES` files or more, most of them Python-bound
    (`_python_bound`), or scenes' work items of `_PROCESSES_MIN_SCENE_BYTES`
    or more, and at least two shards (None: not planned yet);
    otherwise none (the runner's threads write them: Dataflow and Beam's
    'multi_processing' mode already give each core a process).

    Args:
      asked: --worker_processes, or None.
      files: The listed or planned files (`.rel_path`, `.size`).
      shards: Shards planned, or None.
      runner_threads: Threads of this process that run the runner's shard
        writers (Beam's local runner: several; a runner of processes: 0).
    """
    if asked is not None:
        return asked
    cores = os.cpu_count() or 1
    if runner_threads < 2 or cores < 2:
        return 0
    if len(files) < _PROCESSES_MIN_FILES and _scene_bytes(files) < _PROCESSES_MIN_SCENE_BYTES:
        return 0
    if not _python_bound(files):
        return 0
    if shards is None:
        return cores
    return min(cores, shards) if shards >= 2 else 0


def _scene_bytes(files) -> int:
    """Planned decoded bytes of the scenes' work items among planned `files` (0 for listed files)."""
    return sum(f.size for f in files if _scene_item(f))


def _python_bound(files) -> bool:
    """Whether validating most of `files` is Python work (see `_PYTHON_BOUND_SUFFIXES`)."""
    bound = sum(1 for f in files if f.size < _SMALL_FILE_BYTES
                or f.rel_path.lower().endswith(_PYTHON_BOUND_SUFFIXES) or _checked_photo(f))
    return 2 * bound >= len(files)


def needs_decoders(files) -> bool:
    """Whether worker processes load TensorFlow's decode ops ahead for `files`.

    Not for rasters stored raw, nor where most files are JPEG or PNG photos
    that the checks validate without TensorFlow (loading it costs a worker
    ~0.55 s of CPU; a file that needs it loads it then). Tiny images want it:
    TensorFlow decodes a batch of 32x32 JPEGs for a fifth of the check's CPU.
    """
    need = sum(1 for f in files if not f.rel_path.lower().endswith(_RASTER_SUFFIXES) and not _checked_photo(f)
               and not _scene_item(f))
    return need > 0 and 2 * need >= len(files)


def _scene_item(f) -> bool:
    """A scene's work item (--raster_patch): cut without TensorFlow, whatever its format (TIFF, JPEG 2000)."""
    return getattr(f, "patch_rows", None) is not None


def _checked_photo(f) -> bool:
    """A JPEG or PNG photo (not a tiny image) that is validated without TensorFlow where plain."""
    return f.size >= _SMALL_FILE_BYTES and f.rel_path.lower().endswith(_CHECKED_SUFFIXES)


# A PlannedFile's fields in order: sorting by them is sorting the dataclasses (order=True), without
# building two tuples per comparison.
_FIELDS = operator.attrgetter(*(field.name for field in dataclasses.fields(PlannedFile)))


def in_order(files) -> tuple:
    """`tuple(sorted(files))` of PlannedFiles: their record order in the shard."""
    return tuple(sorted(files, key=_FIELDS))


def write_planned_shard(job: ShardJob, plan_path: str) -> ShardOutcome:
    """`write_shard` of `job` with the files of the shard plan file `plan_path`; its receipt saved.

    Run by a worker process (`ShardMaker.write_plan`): it reads the plan
    itself. The job's quarantine may name files of other shards: only this
    shard's are kept, as `ShardMaker.write` would pass them.
    """
    files = in_order(load_shard_plan(plan_path)[1])
    quarantined = {entry[0]: entry for entry in job.quarantined}
    job = dataclasses.replace(
        job, files=tuple(map(shard_file, files)),
        quarantined=tuple(quarantined[f.rel_path] for f in files if f.rel_path in quarantined) if quarantined else ())
    outcome = write_shard(job)
    Receipts(job.output_dir).save(job.name, shard_fingerprint(job.validation, files), outcome)
    return outcome


def shard_file(f) -> ShardFile:
    """The `ShardFile` of a PlannedFile; a copy (--dedup) carries its reject message."""
    duplicate = None
    if f.duplicate_of is not None:
        duplicate = "same content as " + listing.display_path(f.duplicate_of)
    return ShardFile(f.rel_path, f.path, f.size, f.label, duplicate, f.targets, f.patch_rows)
