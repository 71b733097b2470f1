"""The body of the conversion: validating and writing shards, then the manifest.

These DoFns and element types live in an importable module (not the script
run as __main__), so every runner can pickle them to its workers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import itertools
import json
import logging
import os

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

import schemas
from schemas.tfds_metadata import tfds_files
from schemas.tfrecord import format_index, frame_record
from beam_jobs import _listing, _plan
from imaging import ImageRejected, ImageValidator
from beam_jobs._tfrecord import TMP_DIRNAME, AtomicWriter, read_bytes, write_atomically

__all__ = [
    "ConversionError", "ShardResult", "Reject", "WriteShardFn", "ImagesToTFRecords", "FinalizeFn",
    "problem_to_reject", "remove_dataset_files", "delete_if_exists", "write_shard_plans",
    "load_shard_plan",
]

_LOG = logging.getLogger("shardsmith.convert")
_NAMESPACE = "shardsmith"
# Files of a shard read and validated ahead of the writer, and the threads
# that do it (see `WriteShardFn._validated`).
_READ_AHEAD = 8
_POOL_THREADS = min(4, os.cpu_count() or 1)
# Inside the temporary folder: one receipt per finished shard, for --resume.
RECEIPTS_DIRNAME = "done"


class ConversionError(Exception):
    """The conversion ran but its result must not be used (e.g. too many rejects)."""


@dataclasses.dataclass(frozen=True)
class ShardResult:
    split: str
    index: int
    count: int
    file: str
    num_records: int
    num_bytes: int
    sha256: str
    class_counts: tuple[int, ...]
    index_file: str
    index_sha256: str
    # Input files that gave records (a multi-frame DICOM file gives several).
    num_sources: int
    # schemas.ImageStats.to_json() of its records (None: none, or an older receipt).
    images: dict | None = None


@dataclasses.dataclass(frozen=True)
class Reject:
    rel_path: str
    reason: str
    message: str

    @property
    def kind(self) -> str:
        return "skipped" if self.reason in schemas.SKIP_REASONS else "rejected"

    def to_json(self) -> str:
        return json.dumps(
            {
                "path": _listing.display_path(self.rel_path),
                "kind": self.kind,
                "reason": self.reason,
                "message": self.message,
            },
            sort_keys=True,
            ensure_ascii=False,
        )


class WriteShardFn(beam.DoFn):
    """Reads, validates and writes the images of one shard.

    Input: ((split, shard_index), iterable of PlannedFile).
    Main output: ShardResult. Tagged outputs: REJECTED (Reject) and
    NORMALIZED ((record filename, source_format, actions, details or None)).

    After a shard and its index are renamed into place, a small receipt with
    everything the manifest needs from the shard is saved in the temporary
    folder; with `resume`, a shard whose receipt and file still match is not
    written again.
    """

    REJECTED = "rejected"
    NORMALIZED = "normalized"

    def __init__(self, *, output_dir, num_classes, total_shards, max_pixels, background, full_decode,
                 resume=False, dicom=None, worker_threads=None):
        # Plain values only: the DoFn is pickled to every worker.
        self._output_dir = output_dir
        # Threads that read and validate ahead (None: `_POOL_THREADS` of the
        # worker's machine). They change speed only, never the shard's bytes,
        # so they are not part of `_fingerprint`.
        self._worker_threads = worker_threads
        self._num_classes = num_classes
        self._total_shards = total_shards
        self._validator_args = dict(max_pixels=max_pixels, background=background,
                                    full_decode=full_decode, dicom=dicom)
        self._tags = tuple(dicom.tags) if dicom is not None else ()
        self._resume = resume
        self._written = Metrics.counter(_NAMESPACE, "records_written")
        self._shards = Metrics.counter(_NAMESPACE, "shards_written")
        self._resumed = Metrics.counter(_NAMESPACE, "shards_resumed")
        self._validator = None

    def setup(self):
        self._validator = ImageValidator(**self._validator_args)
        self._schema = schemas.ImageExampleSchema(
            extra_string_features=tuple(schemas.dicom_tag_key(t) for t in self._tags)
        )

    def process(self, element):
        (split, index), files = element
        files = sorted(files)
        name = schemas.shard_filename(split, index, files[0].num_shards)
        fingerprint = self._fingerprint(files)
        outcome = self._load_receipt(name, fingerprint) if self._resume else None
        if outcome is not None:
            self._resumed.inc()
            _LOG.info("Kept %s from the interrupted run (--resume)", name)
        else:
            outcome = self._write(split, index, name, files)
            self._save_receipt(name, fingerprint, outcome)
            _LOG.info(
                "Wrote %s: %s image%s%s [%d of %d shards done]",
                name, f"{outcome[0].num_records:,}", "" if outcome[0].num_records == 1 else "s",
                f", {len(outcome[1])} rejected" if outcome[1] else "",
                self._count_done(), self._total_shards,
            )
        result, rejects, normalized = outcome
        for reject in rejects:
            Metrics.counter(_NAMESPACE, f"rejected_{reject.reason}").inc()
            yield beam.pvalue.TaggedOutput(self.REJECTED, reject)
        for item in normalized:
            yield beam.pvalue.TaggedOutput(self.NORMALIZED, item)
        yield result

    def _write(self, split, index, name, files):
        """Writes the shard and its index; returns (ShardResult, rejects, normalized)."""
        writer = AtomicWriter(self._output_dir, name)
        index_entries = []  # (offset, framed length) of each record
        class_counts = [0] * self._num_classes
        stored = []  # (format, height, width) of each record
        rejects, normalized = [], []
        num_sources = 0
        try:
            for f, outcome in self._validated(files):
                if isinstance(outcome, Reject):
                    rejects.append(outcome)
                    continue
                images = outcome
                num_sources += 1
                for image in images:
                    # One record per kept frame: its filename says which.
                    filename = f.rel_path if image.frame is None else f"{f.rel_path}#frame={image.frame}"
                    if image.actions:
                        normalized.append((filename, image.source_format, tuple(image.actions),
                                           image.details))
                    record = self._schema.encode(schemas.ImageRecord(
                        image=image.data,
                        label=f.label,
                        filename=filename,
                        format=image.format,
                        height=image.height,
                        width=image.width,
                        channels=image.channels,
                        extra={schemas.dicom_tag_key(t): image.tags.get(t, "") for t in self._tags},
                    ))
                    framed = frame_record(record)
                    index_entries.append((writer.num_bytes, len(framed)))
                    writer.write(framed)
                    class_counts[f.label] += 1
                    stored.append((image.format, image.height, image.width))
                    self._written.inc()
        except BaseException:
            writer.abort()
            raise
        writer.commit()
        index_name = schemas.index_filename(name)
        index_writer = AtomicWriter(self._output_dir, index_name)
        index_writer.write(format_index(index_entries))
        index_writer.commit()
        self._shards.inc()
        result = ShardResult(
            split, index, files[0].num_shards, name, sum(class_counts), writer.num_bytes,
            writer.sha256, tuple(class_counts), index_name, index_writer.sha256, num_sources,
            images=(stats.to_json() if (stats := schemas.ImageStats.of(stored)) else None),
        )
        return result, rejects, normalized

    def _validate(self, f):
        """Reads and validates one file: its images, or its Reject."""
        if f.duplicate_of is not None:
            return Reject(f.rel_path, "duplicate",
                          "same content as " + _listing.display_path(f.duplicate_of))
        try:
            return self._validator.validate_all(self._read(f), f.rel_path)
        except ImageRejected as e:
            return Reject(f.rel_path, e.reason, e.message)

    def _validated(self, files):
        """Yields (file, images or Reject) in order, working a few files ahead.

        Reads wait on storage (tens of milliseconds per object on cloud
        storage) and decoders release the GIL, so a small pool keeps every
        core and the network busy within one shard. At most `_READ_AHEAD`
        files are in memory at once; the output order, and so the shard's
        bytes, do not depend on the pool.
        """
        pending = collections.deque()
        files = iter(files)
        threads = self._worker_threads or _POOL_THREADS
        with concurrent.futures.ThreadPoolExecutor(threads, "shardsmith-read") as pool:
            for f in itertools.islice(files, _READ_AHEAD):
                pending.append((f, pool.submit(self._validate, f)))
            while pending:
                f, future = pending.popleft()
                outcome = future.result()
                for nxt in itertools.islice(files, 1):
                    pending.append((nxt, pool.submit(self._validate, nxt)))
                yield f, outcome

    def _fingerprint(self, files) -> str:
        """What the shard's bytes depend on: its planned files and the validation options."""
        h = hashlib.sha256(repr(sorted(self._validator_args.items())).encode())
        for f in files:
            h.update(repr((os.fsencode(f.rel_path), f.size, f.label, f.order, f.duplicate_of)).encode())
        return h.hexdigest()

    def _receipt_path(self, name: str) -> str:
        return FileSystems.join(self._output_dir, TMP_DIRNAME, RECEIPTS_DIRNAME, name + ".json")

    def _save_receipt(self, name, fingerprint, outcome):
        result, rejects, normalized = outcome
        receipt = {
            "fingerprint": fingerprint,
            "result": dataclasses.asdict(result),
            "rejects": [dataclasses.astuple(r) for r in rejects],
            "normalized": [[p, src, list(actions), details] for p, src, actions, details in normalized],
        }
        text = json.dumps(receipt, sort_keys=True, ensure_ascii=True)
        write_atomically(FileSystems.join(self._output_dir, TMP_DIRNAME, RECEIPTS_DIRNAME),
                         name + ".json", text.encode("utf-8", "surrogateescape"))

    def _load_receipt(self, name, fingerprint):
        """The saved outcome of a shard, if its files are still exactly as written."""
        path = self._receipt_path(name)
        if not FileSystems.exists(path):
            return None
        receipt = json.loads(read_bytes(path).decode("utf-8", "surrogateescape"))
        if receipt["fingerprint"] != fingerprint:
            return None
        fields = receipt["result"]
        fields["class_counts"] = tuple(fields["class_counts"])
        result = ShardResult(**fields)
        for file_name, sha in ((result.file, result.sha256), (result.index_file, result.index_sha256)):
            path = FileSystems.join(self._output_dir, file_name)
            if not FileSystems.exists(path) or hashlib.sha256(read_bytes(path)).hexdigest() != sha:
                return None
        rejects = [Reject(*r) for r in receipt["rejects"]]
        normalized = [(p, src, tuple(actions), details) for p, src, actions, details in receipt["normalized"]]
        return result, rejects, normalized

    def _read(self, f):
        try:
            return read_bytes(f.path)
        except OSError as e:
            # Beam wraps local I/O errors (permissions, vanished files).
            raise ImageRejected("unreadable", f"{f.rel_path}: {e}") from e

    def _count_done(self) -> int:
        # Workers share no memory; the finished shards on disk are the progress.
        pattern = FileSystems.join(self._output_dir, "*.tfrecord")
        return len(FileSystems.match([pattern])[0].metadata_list)


# Inside the temporary folder: the files of each shard, written by the driver.
PLANS_DIRNAME = "plans"


def write_shard_plans(files, output_dir: str) -> list[str]:
    """Writes each shard's planned files to a small JSON file; returns their paths.

    The pipeline then carries one path per shard instead of one element per
    image: a job graph of a few kilobytes whatever the size of the dataset
    (Dataflow refuses requests over 10 MB, about a million files inline).
    """
    by_shard = collections.defaultdict(list)
    for f in files:
        by_shard[(f.split, f.shard, f.num_shards)].append(dataclasses.astuple(f))
    folder = FileSystems.join(output_dir, TMP_DIRNAME, PLANS_DIRNAME)
    paths = []
    for (split, shard, count), rows in sorted(by_shard.items()):
        name = schemas.shard_filename(split, shard, count) + ".json"
        # ASCII escapes keep file names that are not UTF-8 intact.
        write_atomically(folder, name, json.dumps(rows, ensure_ascii=True).encode())
        paths.append(FileSystems.join(folder, name))
    return paths


def load_shard_plan(path: str):
    """((split, shard), [PlannedFile]) from a file of `write_shard_plans`."""
    files = [_plan.PlannedFile(*row) for row in json.loads(read_bytes(path))]
    return (files[0].split, files[0].shard), files


def _files_of(element):
    return element[1]


def _key_by_shard(f: _plan.PlannedFile):
    return (f.split, f.shard), f


def _key_by_content(f: _plan.PlannedFile):
    """(sha256 of the file's bytes, file); unreadable files get a key of their own."""
    try:
        return hashlib.sha256(read_bytes(f.path)).hexdigest(), f
    except OSError:
        # The shard writer reads it again and rejects it with the reason.
        return "unreadable:" + f.rel_path, f


def _mark_copies(element):
    """Keeps the file with the smallest path of each content; marks the others."""
    _, files = element
    files = sorted(files, key=lambda f: os.fsencode(f.rel_path))
    yield files[0]
    for copy in files[1:]:
        yield dataclasses.replace(copy, duplicate_of=files[0].rel_path)


class ImagesToTFRecords(beam.PTransform):
    """Writes planned shards: the pipeline carries paths, never image bytes.

    Input: PCollection of shard plan paths (`write_shard_plans`). Output: a
    tuple-like with the main output (shard results) and the tagged outputs
    `rejected` and `normalized`.

    Args:
      output_dir: Folder of the shards.
      num_classes: Number of classes (for per-shard class counts).
      total_shards: Shards of all splits together (for progress lines).
      max_pixels, background, full_decode: See `ImageValidator`.
      dedup: Keep one file of each content (the smallest path); the copies
        are rejected as 'duplicate'. Only hashes and paths are grouped.
      resume: Keep shards an interrupted run finished (see `WriteShardFn`).
      dicom: `_dicom.DicomOptions` for DICOM inputs; its tags become extra
        string features of every record.
      worker_threads: Threads of each shard writer that read and validate
        files ahead (None: min(4, cores of the worker)). Output bytes do not
        depend on it.
    """

    def __init__(self, *, output_dir, num_classes, total_shards, max_pixels,
                 background=(255, 255, 255), full_decode=False, dedup=False, resume=False,
                 dicom=None, worker_threads=None):
        super().__init__()
        self._dedup = dedup
        self._fn = WriteShardFn(
            output_dir=output_dir, num_classes=num_classes, total_shards=total_shards,
            max_pixels=max_pixels, background=background, full_decode=full_decode, resume=resume,
            dicom=dicom, worker_threads=worker_threads,
        )

    def expand(self, plan_paths):
        shards = plan_paths | "LoadShardPlans" >> beam.Map(load_shard_plan)  # ((split, shard), [PlannedFile])
        if self._dedup:
            # Copies may sit in any shard: hashes and paths meet in one shuffle.
            shards = (
                shards
                | "Files" >> beam.FlatMap(_files_of)  # PlannedFile
                | "HashContent" >> beam.Map(_key_by_content)  # (sha256, PlannedFile)
                | "GroupByContent" >> beam.GroupByKey()  # (sha256, [PlannedFile])
                | "MarkCopies" >> beam.FlatMap(_mark_copies)  # PlannedFile
                | "KeyByShard" >> beam.Map(_key_by_shard)  # ((split, shard), PlannedFile)
                | "GroupByShard" >> beam.GroupByKey()  # ((split, shard), [PlannedFile])
            )
        return shards | "ValidateAndWrite" >> beam.ParDo(self._fn).with_outputs(
            WriteShardFn.REJECTED, WriteShardFn.NORMALIZED, main="shards"
        )


class FinalizeFn(beam.DoFn):
    """Writes rejects.jsonl, normalized.jsonl, then manifest.json (last)."""

    def __init__(self, *, output_dir, class_names, shard_counts, num_found, options,
                 max_reject_fraction, features=None, extra=None):
        self._output_dir = output_dir
        self._features = dict(features or schemas.IMAGE_SCHEMA.to_json())
        # Further manifest sections known before the run (e.g. split groups).
        self._extra = dict(extra or {})
        self._class_names = tuple(class_names)
        self._shard_counts = dict(shard_counts)
        self._num_found = num_found
        self._options = options
        self._max_reject_fraction = max_reject_fraction

    def process(self, unused_element, shards, rejects, normalized):
        rejects = sorted(rejects, key=lambda r: os.fsencode(r.rel_path))
        write_atomically(
            self._output_dir, schemas.REJECTS_FILENAME,
            "".join(r.to_json() + "\n" for r in rejects).encode(),
        )
        normalized = sorted(normalized, key=lambda n: os.fsencode(n[0]))
        write_atomically(
            self._output_dir, schemas.NORMALIZED_FILENAME,
            "".join(
                json.dumps(_normalized_entry(p, src, actions, details), sort_keys=True,
                           ensure_ascii=False) + "\n"
                for p, src, actions, details in normalized
            ).encode(),
        )
        written = sum(s.num_sources for s in shards)
        kinds = collections.Counter(r.kind for r in rejects)
        counts = {
            "found": self._num_found,
            "written": written,
            "rejected": kinds["rejected"],
            "skipped": kinds["skipped"],
        }
        if written + kinds["rejected"] + kinds["skipped"] != self._num_found:
            # An internal invariant, not a user error: an input went missing.
            raise RuntimeError(f"Inputs do not reconcile, nothing may be lost: {counts}")
        considered = written + kinds["rejected"]
        if considered and kinds["rejected"] / considered > self._max_reject_fraction:
            raise ConversionError(
                f"{kinds['rejected']:,} of {considered:,} images were rejected, more than "
                f"--max_reject_fraction={self._max_reject_fraction:g}; see "
                f"{FileSystems.join(self._output_dir, schemas.REJECTS_FILENAME)}. "
                "No manifest was written."
            )
        splits = {}
        for split, count in self._shard_counts.items():
            mine = sorted((s for s in shards if s.split == split), key=lambda s: s.index)
            if [s.index for s in mine] != list(range(count)):
                raise RuntimeError(f"Split {split!r}: shards {[s.index for s in mine]} of {count}")
            splits[split] = schemas.SplitInfo(split, tuple(
                schemas.ShardInfo(s.file, s.num_records, s.num_bytes, s.sha256, s.class_counts,
                                  s.index_file, s.index_sha256,
                                  schemas.ImageStats.from_json(s.images))
                for s in mine
            ))
        actions = collections.Counter(a for _, _, acts, _ in normalized for a in acts)
        extra = dict(self._extra)
        dicom = _dicom_summary(normalized)
        if dicom:
            extra["dicom"] = {**extra.get("dicom", {}), "applied": dicom}
        manifest = schemas.Manifest(
            schema_version=schemas.SCHEMA_VERSION,
            tool_version=schemas.__version__,
            features=self._features,
            class_names=self._class_names,
            splits=splits,
            counts=counts,
            rejects=dict(sorted(collections.Counter(r.reason for r in rejects).items())),
            normalized=dict(sorted(actions.items())),
            options=self._options,
            extra=extra,
        )
        keep = {name for info in splits.values() for s in info.shards for name in (s.file, s.index_file)}
        remove_dataset_files(self._output_dir, keep=keep)
        # TFDS's metadata too, so `tfds.builder_from_directory` reads the folder as is.
        for name, text in tfds_files(manifest).items():
            write_atomically(self._output_dir, name, text.encode())
        write_atomically(self._output_dir, schemas.MANIFEST_FILENAME, manifest.to_json().encode())
        delete_if_exists(FileSystems.join(self._output_dir, TMP_DIRNAME))
        yield manifest


def _normalized_entry(path, source_format, actions, details) -> dict:
    entry = {"path": _listing.display_path(path), "source_format": source_format,
             "actions": list(actions)}
    if details:
        entry["details"] = details
    return entry


def _dicom_summary(normalized) -> dict:
    """How many DICOM records got each rescale, window source, inversion and bit depth."""
    counters = collections.defaultdict(collections.Counter)
    for _, source_format, _, details in normalized:
        if source_format != "dicom" or not details:
            continue
        window = details.get("window") or {}
        counters["window_source"][window.get("source", "none (colour)")] += 1
        counters["rescaled"][str(bool(details.get("rescale") or details.get("modality_lut")))] += 1
        counters["inverted_monochrome1"][str(bool(details.get("inverted")))] += 1
        counters["bit_depth"][str(details.get("bit_depth"))] += 1
        counters["photometric"][str(details.get("photometric"))] += 1
    return {name: dict(sorted(c.items())) for name, c in sorted(counters.items())}


def problem_to_reject(p: _listing.Problem) -> Reject:
    return Reject(p.rel_path, p.reason, p.message)


def delete_if_exists(path: str) -> None:
    """Deletes a file, or a folder with everything in it, if it is there.

    On object stores (gs://, s3://) a folder is only a prefix of object names:
    no object has its name, so its objects are listed and deleted.
    """
    if FileSystems.exists(path):
        FileSystems.delete([path])
    elif not _listing.is_local(path):
        inside = FileSystems.match([path.rstrip("/") + "/**"])[0].metadata_list
        if inside:
            FileSystems.delete([meta.path for meta in inside])


def remove_dataset_files(output_dir: str, keep=frozenset()) -> list[str]:
    """Deletes shards not in `keep`, so no stale file looks part of the dataset."""
    removed = []
    for meta in FileSystems.match([FileSystems.join(output_dir, "*")])[0].metadata_list:
        name = meta.path.rstrip("/").rsplit("/", 1)[-1]
        if schemas.manifest.SHARD_FILENAME_RE.match(name) and name not in keep:
            FileSystems.delete([meta.path])
            removed.append(name)
    if removed:
        _LOG.info("Removed %d shard files of an earlier dataset", len(removed))
    return removed
