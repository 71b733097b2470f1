"""The conversion of volumes (--volumes, issue 36) that needs no Beam: plan, convert, write.

    jobs, rejects, class_names = plan_volumes("scans", split_ratios={"train": 0.8, "validation": 0.2})
    results = [convert_job(job, "scans", "out") for job in jobs]  # ('ok', split, filename, record path) or a reject
    shards = shard_of(jobs)                                 # filename -> (split, index, count)
    write_shard(...) per shard, then write_manifest(...) last

`VolumeConverter` runs `convert_job` in worker processes (`conversion.processes`)
with the image path's guard (`conversion.guard`, `conversion.recovery`): a
series whose decode crashes its process, or runs past --file_timeout, is
rejected as `decoder_crashed` or `timeout` and quarantined, and the others are
converted. Headers read while planning are noted in the journal too, so that
the command's supervising process (`recovery.supervise`) knows a file that
crashes the driver.

Layout: `input_dir/<class>/<series folder>/...` (DICOM files at any depth below
the series folder, any names) and `input_dir/<class>/<file>.nii[.gz]`. The
class is the first folder; a series is planned as a whole (its headers are
read here, its pixels by `convert_job`), and its split comes from the hash
of its name, never of a slice's, so no series is split across train and
validation. A series whose SeriesInstanceUID also appears under another class
is rejected as `mixed_labels`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Mapping

from conversion import files as _files, guard, processes as _processes, recovery
from conversion.elements import Reject
from conversion.listing import list_input
from conversion.plan import hash_split, sorted_class_names
from imaging import volumes
from imaging.errors import ImageRejected
from schemas import REJECTS_FILENAME, tfrecord
from schemas.volumes import VOLUME_SCHEMA, VOLUMES_MANIFEST_FILENAME, VolumeRecord

__all__ = ["VolumeJob", "plan_volumes", "convert_job", "VolumeConverter", "shard_of", "write_shard",
           "write_missing_shards", "write_manifest", "record_path", "read_manifest", "VOLUMES_MANIFEST"]

_LOG = logging.getLogger("shardsmith.convert")
# Written last: the volume dataset's summary (class names, splits, rejects).
VOLUMES_MANIFEST = VOLUMES_MANIFEST_FILENAME
_NIFTI_SUFFIXES = (".nii", ".nii.gz")
# Inside the output's temporary folder: each converted volume's framed record until its shard is written.
_RECORDS_DIRNAME = "volume_records"
# Bytes copied at a time from a volume's record file into its shard.
_COPY_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True)
class VolumeJob:
    """One volume to convert: a DICOM stack or a NIfTI file.

    Attributes:
      filename: The record's `filename` (series folder, `#series=N` when it holds several).
      split: Its split.
      label: Its class index.
      stack: The planned DICOM stack, or None for NIfTI.
      nifti: The NIfTI file's relative path, or None.
    """

    filename: str
    split: str
    label: int
    stack: volumes.Stack | None = None
    nifti: str | None = None


def _unit_of(rel_path: str) -> tuple[str, str] | None:
    """(class, series unit) of a file: input/<class>/<series>/...; None outside any class folder."""
    parts = rel_path.split("/")
    if len(parts) < 2:
        return None
    if _is_nifti_name(rel_path):
        return parts[0], rel_path  # A NIfTI file is its own unit.
    if len(parts) == 2:
        return parts[0], parts[0]  # Slices directly in the class folder: one series folder.
    return parts[0], "/".join(parts[:2])


def _is_nifti_name(rel_path: str) -> bool:
    return rel_path.lower().endswith(_NIFTI_SUFFIXES)


def _csv_entry_of(rel_path: str, labels_csv: Mapping[str, tuple[str, str | None]]) -> str | None:
    """The --labels_csv path that labels a file: the file itself, else its deepest folder listed."""
    if rel_path in labels_csv:
        return rel_path
    parts = rel_path.split("/")
    for depth in range(len(parts) - 1, 0, -1):
        folder = "/".join(parts[:depth])
        if folder in labels_csv:
            return folder
    return None


def plan_volumes(input_dir: str, *, split_ratios=None, seed: int = 0, min_slices: int = 2, quarantined=None,
                 labels_csv: Mapping[str, tuple[str, str | None]] | None = None, dedup: bool = False):
    """Plans every volume under `input_dir`.

    Args:
      split_ratios: --split; None: the CSV's split column, else all in 'train'.
      quarantined: rel_path -> (reason, message) of files that crashed or hung
        an earlier attempt (`guard.Quarantine`): rejected without being read.
      labels_csv: --labels_csv's rows (`conversion.plan.read_labels_csv`):
        path -> (label, split or None); a path names a NIfTI file or a folder,
        whose every series takes its label (and split). None: class folders.
      dedup: --dedup: of volumes whose files are byte for byte the same, the
        one with the smallest name is kept, the others rejected `duplicate`.

    Returns:
      (jobs sorted by filename, rejects as (path, reason, message), class names).

    Raises:
      ValueError: For --split together with a CSV split column.
    """
    quarantined = dict(quarantined or {})
    listed, problems = list_input(input_dir)
    rejects = [(p.rel_path, p.reason, p.message) for p in problems]
    # (class, series unit) -> its files; unit -> its split when the CSV gives one.
    by_unit: dict[tuple[str, str], list] = defaultdict(list)
    csv_splits: dict[str, str] = {}
    if labels_csv is not None:
        if any(split for _, split in labels_csv.values()) and split_ratios is not None:
            raise ValueError("--split assigns splits by hash, but the --labels_csv has a split column. "
                             "Use one or the other.")
        used = set()
        for f in listed:
            entry = _csv_entry_of(f.rel_path, labels_csv)
            if entry is None:
                rejects.append((f.rel_path, "no_label", "not in --labels_csv (nor any folder above it)"))
                continue
            used.add(entry)
            label, split = labels_csv[entry]
            # A folder is one unit (split together); a NIfTI file its own.
            unit = f.rel_path if _is_nifti_name(f.rel_path) else entry
            by_unit[(label, unit)].append(f.rel_path)
            if split is not None:
                csv_splits[unit] = split
        for path in sorted(set(labels_csv) - used):
            rejects.append((path, "missing_file", "listed in --labels_csv but no file is there"))
        class_names = list(sorted_class_names({label for label, _ in by_unit}))
    else:
        for f in listed:
            unit = _unit_of(f.rel_path)
            if unit is None:
                rejects.append((f.rel_path, "no_label", "outside any class folder"))
            else:
                by_unit[unit].append(f.rel_path)
        class_names = sorted({cls for cls, _ in by_unit})
    split_ratios = dict(split_ratios or {"train": 1.0})
    digests: dict[str, bytes] = {}  # With --dedup: rel_path -> the SHA-256 of its bytes.
    planned = []  # (class, unit, filename, stack or None, nifti or None)
    for (cls, unit), paths in sorted(by_unit.items()):
        slices = []
        for rel in sorted(paths):
            if rel in quarantined:
                rejects.append((rel, *quarantined[rel]))
                continue
            path = _files.join(input_dir, rel)
            if _is_nifti_name(rel):
                if dedup:
                    digests[rel] = _digest(path, rel, rejects)
                planned.append((cls, rel, rel, None, rel))
                continue
            # Noted in the journal: a header that crashes the driver is known to the command above it.
            with guard.working_on([(rel, path)]):
                try:
                    if dedup:  # The whole file: its digest.
                        data = _files.read_bytes(path)
                        slices += volumes.read_slices(data, rel)
                        digests[rel] = hashlib.sha256(data).digest()
                    else:  # Its header: the pixels are read once, by the converter.
                        with _files.open_to_read(path) as f:
                            slices += volumes.read_slice_headers(f, rel)
                except ImageRejected as e:
                    rejects.append((rel, e.reason, e.message))
                except OSError as e:
                    rejects.append((rel, "unreadable", f"{rel}: {e}"))
                except Exception as e:  # noqa: BLE001 - this file alone: rejected, reported
                    _LOG.debug("Unexpected error reading the header of %s", rel, exc_info=e)
                    rejects.append((rel, guard.INTERNAL_ERROR, guard.internal_error_message(rel, e)))
        if not slices:
            continue
        plan = volumes.plan_stacks(slices, min_slices=min_slices,
                                   pixel_hash=functools.partial(_pixel_hash, input_dir))
        rejects += list(plan.rejects)
        for stack in plan.stacks:
            name = unit if len(plan.stacks) == 1 else f"{unit}#series={stack.index}"
            planned.append((cls, unit, name, stack, None))
    planned.sort(key=lambda p: os.fsencode(p[2]))
    if dedup:
        # Before the labels are compared: a copied series is a duplicate, wherever it lies.
        planned, copies = _drop_copies(planned, digests)
        rejects += copies
    uid_classes: dict[str, set[str]] = defaultdict(set)
    for cls, _, _, stack, _ in planned:
        if stack is not None:
            uid_classes[stack.series_uid].add(cls)
    jobs = []
    for cls, unit, name, stack, nifti in planned:
        if stack is not None and len(uid_classes[stack.series_uid]) > 1:
            for s in stack.slices:
                rejects.append((s.name, "mixed_labels", f"series {stack.series_uid} lies under the classes "
                                                        f"{sorted(uid_classes[stack.series_uid])}"))
            continue
        # The split of the series unit's name (the folder), never of a slice.
        split = csv_splits.get(unit) or hash_split(seed, unit, split_ratios)
        if split is None:  # Its split's ratio is zero: said, not silently dropped.
            rejects.append((name, "not_in_split", f"{name}: its split has a ratio of zero (--split)"))
            continue
        jobs.append(VolumeJob(name, split, class_names.index(cls), stack, nifti))
    return jobs, sorted(set(rejects)), class_names


def _pixel_hash(input_dir: str, s: volumes.DicomSlice) -> str:
    """The pixel digest of a slice planned from its header, read when another slice shares its position."""
    path = _files.join(input_dir, s.name)
    with guard.working_on([(s.name, path)]):
        return volumes.read_slices(_files.read_bytes(path), s.name)[s.frame].pixel_hash


def _digest(path: str, rel: str, rejects: list) -> bytes:
    """The SHA-256 of a file's bytes (--dedup); a file that cannot be read gets a key of its own."""
    try:
        with _files.open_to_read(path) as f:
            return hashlib.file_digest(f, "sha256").digest()
    except OSError:
        return b"unreadable:" + os.fsencode(rel)  # The converter reads it again and says why.


def _drop_copies(planned: list[tuple], digests: Mapping[str, bytes]):
    """--dedup: of volumes made of the same bytes, the one with the smallest name is kept.

    A volume's content is its files' bytes in its own order (a series' slices
    sorted along the normal), so a copied series folder, under any name or
    class, is a copy; one slice differing makes another series.

    Args:
      planned: (class, unit, filename, stack, nifti) sorted by filename.
      digests: rel_path -> the SHA-256 of the file's bytes.
    """
    kept: dict[bytes, str] = {}
    out, copies = [], []
    for item in planned:  # Sorted by filename: the first of each content is kept.
        _, _, name, stack, nifti = item
        h = hashlib.sha256()
        if nifti is not None:
            h.update(digests[nifti])
        else:
            for s in stack.slices:  # In the volume's order, each frame by its file's bytes.
                h.update(digests[s.name] + s.frame.to_bytes(4, "little"))
        key = h.digest()
        if key in kept:
            copies.append((name, "duplicate", f"same content as {kept[key]}"))
        else:
            kept[key] = name
            out.append(item)
    return out, copies


def shard_of(jobs, records_per_shard: int = 8) -> dict[str, tuple[str, int, int]]:
    """Each job's shard, decided at planning from the sorted names: filename -> (split, index, count).

    So each shard is written by one worker holding only its own volumes.
    """
    by_split: dict[str, list[str]] = defaultdict(list)
    for job in jobs:
        by_split[job.split].append(job.filename)
    out = {}
    for split, names in by_split.items():
        names.sort(key=os.fsencode)
        count = -(-len(names) // records_per_shard)
        for position, name in enumerate(names):
            out[name] = (split, position // records_per_shard, count)
    return out


def write_shard(split: str, index: int, count: int, records, output_dir: str) -> int:
    """Writes one shard from its volumes' record files (`convert_job`), sorted by filename; returns its records.

    Args:
      records: (filename, record path) of each volume of the shard.

    The files are copied in chunks (a shard of 8 CTs is ~1 GB; at most
    `_COPY_BYTES` of it is in memory) and removed once the shard is in place.
    """
    records = sorted(records, key=lambda pair: os.fsencode(pair[0]))
    writer = _files.AtomicWriter(output_dir, f"{split}-{index:05d}-of-{count:05d}.tfrecord")
    try:
        for _, path in records:
            with _files.open_to_read(path) as f:
                while chunk := f.read(_COPY_BYTES):
                    writer.write(chunk)
    except BaseException:
        writer.abort()
        raise
    writer.commit()
    for _, path in records:
        _files.remove(path)
    return len(records)


def write_missing_shards(output_dir: str, planned, shard_counts) -> list[tuple[str, int, int, int]]:
    """Writes an empty file for each planned shard that got no volume (all of them rejected while decoding).

    So the set `<split>-NNNNN-of-MMMMM` is complete and reads (as zero
    records) wherever the converter rejected every volume planned for a shard.

    Args:
      planned: `shard_of`'s values: (split, index, count) of every planned shard.
      shard_counts: (split, index, count, records) of the shards written.

    Returns:
      (split, index, count, 0) of each empty shard written.
    """
    written = {tuple(c[:3]) for c in shard_counts}
    empty = []
    for split, index, count in sorted(set(planned) - written):
        write_shard(split, index, count, [], output_dir)
        empty.append((split, index, count, 0))
    return empty


def write_manifest(output_dir: str, class_names, shard_counts, rejects) -> dict:
    """Writes VOLUMES_MANIFEST (last): shard_counts are (split, index, count, records) of each shard."""
    splits: dict[str, dict] = {}
    for split, _index, count, records in sorted(shard_counts):
        entry = splits.setdefault(split, {"records": 0, "shards": count})
        entry["records"] += records
    manifest = {
        "example_kind": VOLUME_SCHEMA.kind,
        "features": VOLUME_SCHEMA.to_json(),
        "class_names": list(class_names),
        "splits": splits,
        "rejects": [{"path": p, "reason": r, "message": m} for p, r, m in sorted(set(map(tuple, rejects)))],
    }
    # rejects.jsonl as an image dataset's (`conversion.elements.Reject`), before the manifest.
    _files.write_atomically(output_dir, REJECTS_FILENAME, "".join(
        Reject(p, r, m).to_json() + "\n" for p, r, m in sorted(set(map(tuple, rejects)))).encode())
    _files.write_atomically(output_dir, VOLUMES_MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return manifest


def record_path(output_dir: str, filename: str) -> str:
    """Where `convert_job` leaves the framed record of the volume named `filename` until its shard is written."""
    return _files.join(*_record_location(output_dir, filename))


def _record_location(output_dir: str, filename: str) -> tuple[str, str]:
    digest = hashlib.sha256(os.fsencode(filename)).hexdigest()[:32]
    return _files.join(output_dir, _files.TMP_DIRNAME, _RECORDS_DIRNAME), f"{digest}.tfrecord"


def convert_job(job: VolumeJob, input_dir: str, output_dir: str):
    """Reads and encodes one volume, and leaves its framed record in the output's temporary folder.

    The record goes to a file (`record_path`), not back to the caller: a
    volume is tens to hundreds of MB, and only its path travels through the
    worker pipes and the runner, so each volume is held by one process, once
    as voxels and once as a record, and shards are written by copying files.

    The volume is noted in this process's journal meanwhile (`guard`), as one
    suspect named by its record name: if its decoder kills the process, or the
    watchdog stops it past --file_timeout, whoever started it knows which
    volume it was.

    Returns:
      ('ok', split, filename, record path) or ('reject', name, reason, message).
    """
    read = lambda rel: _files.read_bytes(_files.join(input_dir, rel))
    where = _files.join(input_dir, job.nifti or job.filename.split("#", 1)[0])
    with guard.working_on([(job.filename, where)]):
        try:
            if job.nifti is not None:
                volume = volumes.read_nifti(read(job.nifti), job.nifti)
            else:
                volume = volumes.read_stack(job.stack, read)
            record = VOLUME_SCHEMA.encode(VolumeRecord(volume.voxels, volume.spacing, volume.affine, job.label,
                                                       job.filename, volume.modality))
        except ImageRejected as e:
            return ("reject", job.filename, e.reason, e.message)
        except OSError as e:
            return ("reject", job.filename, "unreadable", f"{job.filename}: {e}")
        except Exception as e:  # noqa: BLE001 - this volume alone: rejected, reported
            _LOG.debug("Unexpected error on %s", job.filename, exc_info=e)
            return ("reject", job.filename, guard.INTERNAL_ERROR, guard.internal_error_message(job.filename, e))
    del volume  # The voxels go before the record is framed: one copy of the volume at a time beside it.
    folder, name = _record_location(output_dir, job.filename)
    writer = _files.AtomicWriter(folder, name, in_tmp_dir=False)
    try:
        writer.write(tfrecord.frame_record(record))
    except BaseException:
        writer.abort()
        raise
    writer.commit()
    return ("ok", job.split, job.filename, writer.final_path)


# A volume whose worker processes die this often is given up (each death blames it, or retries once).
_MAX_TRIES = 3


class VolumeConverter:
    """Runs `convert_job` in worker processes; a volume that crashes or hangs one costs itself only.

    The image path's isolation (`conversion.processes`, `conversion.guard`,
    `conversion.recovery`): each call notes its volume in the worker's
    journal; a worker that dies (a segfault in a decoder, the OOM killer, the
    watchdog past `file_timeout`) is replaced, its volume read from its
    journal, rejected as `decoder_crashed` or `timeout` and quarantined in the
    output's temporary folder (a re-run rejects it without reading it).
    Thread-safe: the runner's threads share one converter per run and process
    (`shared`), and so its worker processes and its one --file_timeout.

    Args:
      input_dir: --input_dir.
      output_dir: --output_dir (its quarantine, the records until their shard is written).
      processes: Worker processes; 0 converts in the caller's thread, unguarded
        (the command's supervising process still catches a crash).
      file_timeout: --file_timeout, seconds.
    """

    def __init__(self, input_dir: str, output_dir: str, *, processes: int, file_timeout: float):
        self._input_dir = input_dir
        self._output_dir = output_dir
        self._timeout = file_timeout
        self._quarantine = guard.Quarantine(guard.quarantine_path(output_dir))
        self._quarantined = self._quarantine.load()
        self._seen: dict = {}
        self._lock = threading.Lock()
        self._users = 0
        self._pool = _processes.WorkerProcesses(processes, file_timeout=file_timeout) if processes else None

    @classmethod
    def shared(cls, run: str, input_dir: str, output_dir: str, *, processes: int,
               file_timeout: float) -> VolumeConverter:
        """The converter of run `run` in this process, made if there is none; give it back with `release`."""
        with _CONVERTERS_LOCK:
            converter = _CONVERTERS.get(run)
            if converter is None:
                converter = _CONVERTERS[run] = cls(input_dir, output_dir, processes=processes,
                                                   file_timeout=file_timeout)
            converter._users += 1
            return converter

    def release(self) -> None:
        """Gives back a converter of `shared`; the last user closes its worker processes."""
        with _CONVERTERS_LOCK:
            self._users -= 1
            if self._users > 0:
                return
            for run, converter in list(_CONVERTERS.items()):
                if converter is self:
                    del _CONVERTERS[run]
        self.close()

    def convert(self, job: VolumeJob):
        """`convert_job`'s result; ('reject', name, 'decoder_crashed' or 'timeout', message) for a culprit."""
        if job.filename in self._quarantined:
            return ("reject", job.filename, *self._quarantined[job.filename])
        if self._pool is None:
            return convert_job(job, self._input_dir, self._output_dir)
        for _ in range(_MAX_TRIES):
            try:
                return self._pool.call(convert_job, job, self._input_dir, self._output_dir)
            except _processes.WorkerDied as e:
                with self._lock:
                    # One volume per call: its slot names it, no probing is needed (`validation` unused).
                    found = recovery.crash_culprits(self._pool.journal_folder, e.pid, e.returncode, None,
                                                    self._timeout, self._seen)
                    if found is None:  # Not while working on a volume: not a volume's doing.
                        raise
                    if found:
                        for name, (reason, message) in sorted(found.items()):
                            _LOG.warning("Rejected %s (%s): %s", name, reason, message)
                        self._quarantined = self._quarantine.add(found)
                if job.filename in self._quarantined:
                    return ("reject", job.filename, *self._quarantined[job.filename])
        raise _processes.WorkerDied(f"{job.filename}: its worker processes died {_MAX_TRIES} times.")

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


# One converter per run and process (`VolumeConverter.shared`).
_CONVERTERS: dict[str, VolumeConverter] = {}
_CONVERTERS_LOCK = threading.Lock()


def read_manifest(output_dir: str) -> dict:
    """The VOLUMES_MANIFEST of a converted folder."""
    return json.loads(_files.read_bytes(_files.join(output_dir, VOLUMES_MANIFEST)))
