"""Writing one shard: read and validate its files ahead, encode, frame, index, receipt.

`WriteShardFn` is built from plain option groups (it is pickled to every
worker); its validator and schema are built in `setup()`, on the worker.
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
import types

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

import schemas
from beam_jobs import _listing
from beam_jobs._elements import Reject, ShardResult
from beam_jobs._options import WritingOptions
from beam_jobs._files import TMP_DIRNAME, AtomicWriter, read_bytes, write_atomically
from imaging import ImageRejected, ImageValidator, ValidationOptions
from schemas.tfrecord import format_index, frame_record

__all__ = ["WriteShardFn", "RECEIPTS_DIRNAME", "record_schema"]

_LOG = logging.getLogger("shardsmith.convert")
_NAMESPACE = "shardsmith"
# Files of a shard read and validated ahead of the writer, and the threads
# that do it (see `read_ahead`).
_READ_AHEAD = 8
_POOL_THREADS = min(4, os.cpu_count() or 1)
# Files validated together (`ImageValidator.validate_many`): at most this many,
# and of at most this many planned bytes, so that the groups read ahead hold
# a bounded amount of memory whatever the image sizes. 1 MiB keeps 64 small
# images (~1-3 KB) in one batch; with 8 MiB, 2,000 ~125 KB photos converted
# at 684-708 MiB peak instead of 569-576 (_READ_AHEAD groups in flight per
# shard writer), at the same speed.
_GROUP_FILES = 64
_GROUP_BYTES = 1 << 20
# The extra features of a record when no DICOM tags are asked for (never changed).
_NO_EXTRA = types.MappingProxyType({})
# Inside the temporary folder: one receipt per finished shard, for --resume.
RECEIPTS_DIRNAME = "done"


def read_ahead(fn, items, *, threads: int, depth: int = _READ_AHEAD):
    """Yields (item, fn(item)) in order, computing up to `depth` items ahead on `threads`.

    Reads wait on storage (tens of milliseconds per object on cloud storage)
    and decoders release the GIL, so a small pool keeps every core and the
    network busy within one shard. At most `depth` results are in memory at
    once; the output order, and so the shard's bytes, do not depend on the pool.
    """
    pending = collections.deque()
    items = iter(items)
    with concurrent.futures.ThreadPoolExecutor(threads, "shardsmith-read") as pool:
        for item in itertools.islice(items, depth):
            pending.append((item, pool.submit(fn, item)))
        while pending:
            item, future = pending.popleft()
            outcome = future.result()
            for nxt in itertools.islice(items, 1):
                pending.append((nxt, pool.submit(fn, nxt)))
            yield item, outcome


def _groups(files):
    """`files` in order, in lists of at most _GROUP_FILES files and _GROUP_BYTES planned bytes."""
    group, size = [], 0
    for f in files:
        if group and (len(group) == _GROUP_FILES or size + f.size > _GROUP_BYTES):
            yield group
            group, size = [], 0
        group.append(f)
        size += f.size
    if group:
        yield group


def record_schema(validation: ValidationOptions) -> schemas.ImageExampleSchema:
    """The schema of every record a conversion with these options writes."""
    return schemas.ImageExampleSchema(
        extra_string_features=tuple(schemas.dicom_tag_key(t) for t in validation.dicom.tags),
        georef=validation.raster.georef,
    )


def _georef_values(georef) -> dict:
    """The georef features of a record: unknown where the image has none (`imaging.georef.Georef`)."""
    if georef is None:
        return schemas.georef_values()
    return schemas.georef_values(georef.epsg, georef.geotransform)


def validation_fingerprint(validation: ValidationOptions) -> str:
    """The text of the options a shard's bytes depend on (kept as receipts of older runs wrote it)."""
    args = dict(max_pixels=validation.max_pixels, background=validation.background,
                full_decode=validation.full_decode, dicom=validation.dicom)
    if validation.resize.active:  # Absent otherwise, as receipts of older runs have it.
        args["resize"] = validation.resize
    if not validation.raster.is_default:
        # Only then: receipts of runs without raster options stay valid.
        args["raster"] = validation.raster
    return repr(sorted(args.items()))


class _Shard:
    """What one shard collects while its records are written."""

    def __init__(self, num_classes: int):
        self.index_entries: list[tuple[int, int]] = []  # (offset, framed length) of each record
        self.class_counts = [0] * num_classes
        # (format, height, width, channels, sample dtype) of each record, for schemas.ImageStats.
        self.stored: list[tuple[str, int, int, int, str]] = []
        self.rejects: list[Reject] = []
        self.normalized: list[tuple] = []
        self.num_sources = 0
        self.band_stats = None  # schemas.BandStats of its raster records, merged as written
        self.mixed_bands = False
        self.georeferenced = 0  # Records with a known EPSG code or geotransform


class _Receipts:
    """One small JSON file per finished shard, in the temporary folder, for --resume."""

    def __init__(self, output_dir: str):
        self._output_dir = output_dir
        self._folder = FileSystems.join(output_dir, TMP_DIRNAME, RECEIPTS_DIRNAME)

    def save(self, name, fingerprint, outcome):
        result, rejects, normalized = outcome
        receipt = {
            "fingerprint": fingerprint,
            "result": dataclasses.asdict(result),
            "rejects": [dataclasses.astuple(r) for r in rejects],
            "normalized": [[p, src, list(actions), details] for p, src, actions, details in normalized],
        }
        text = json.dumps(receipt, sort_keys=True, ensure_ascii=True)
        write_atomically(self._folder, name + ".json", text.encode("utf-8", "surrogateescape"))

    def load(self, name, fingerprint):
        """The saved outcome of a shard, if its files are still exactly as written."""
        path = FileSystems.join(self._folder, name + ".json")
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
      writing: The `WritingOptions` (resume, worker threads).
    """

    REJECTED = "rejected"
    NORMALIZED = "normalized"

    def __init__(self, *, output_dir: str, num_classes: int, total_shards: int,
                 validation: ValidationOptions, writing: WritingOptions | None = None):
        # Plain values only: the DoFn is pickled to every worker.
        self._output_dir = output_dir
        self._num_classes = num_classes
        self._total_shards = total_shards
        self._validation = validation
        self._writing = writing or WritingOptions()
        self._tags = validation.dicom.tags
        self._written = Metrics.counter(_NAMESPACE, "records_written")
        self._shards = Metrics.counter(_NAMESPACE, "shards_written")
        self._resumed = Metrics.counter(_NAMESPACE, "shards_resumed")
        self._validator = None

    def setup(self):
        self._validator = ImageValidator(self._validation)
        self._tag_keys = tuple((t, schemas.dicom_tag_key(t)) for t in self._tags)
        self._schema = record_schema(self._validation)
        self._receipts = _Receipts(self._output_dir)

    def process(self, element):
        (split, index), files = element
        files = sorted(files)
        name = schemas.shard_filename(split, index, files[0].num_shards)
        fingerprint = self._fingerprint(files)
        outcome = self._receipts.load(name, fingerprint) if self._writing.resume else None
        if outcome is not None:
            self._resumed.inc()
            _LOG.info("Kept %s from the interrupted run (--resume)", name)
        else:
            outcome = self._write(split, index, name, files)
            self._receipts.save(name, fingerprint, outcome)
            self._log_written(name, outcome)
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
        shard = _Shard(self._num_classes)
        try:
            threads = self._writing.worker_threads or _POOL_THREADS
            for f, outcome in self._validated(files, threads):
                if isinstance(outcome, Reject):
                    shard.rejects.append(outcome)
                    continue
                shard.num_sources += 1
                for image in outcome:
                    self._write_record(writer, shard, f, image)
        except BaseException:
            writer.abort()
            raise
        writer.commit()
        # Counted once per shard: a counter call per record costs more than framing it.
        self._written.inc(len(shard.index_entries))
        index_name = schemas.index_filename(name)
        index_writer = AtomicWriter(self._output_dir, index_name)
        index_writer.write(format_index(shard.index_entries))
        index_writer.commit()
        self._shards.inc()
        stats = schemas.ImageStats.of(shard.stored)
        result = ShardResult(
            split, index, files[0].num_shards, name, sum(shard.class_counts), writer.num_bytes,
            writer.sha256, tuple(shard.class_counts), index_name, index_writer.sha256,
            shard.num_sources, images=stats.to_json() if stats else None,
            band_stats=None if shard.band_stats is None or shard.mixed_bands else shard.band_stats.to_json(),
            georeferenced=shard.georeferenced if self._schema.georef else None,
        )
        return result, shard.rejects, shard.normalized

    def _write_record(self, writer: AtomicWriter, shard: _Shard, f, image) -> None:
        """Encodes, frames and writes one image; notes it in the shard's index and counts."""
        # One record per kept frame: its filename says which.
        filename = f.rel_path if image.frame is None else f"{f.rel_path}#frame={image.frame}"
        if image.page is not None:
            filename += f"#page={image.page}"
        if image.actions:
            shard.normalized.append((filename, image.source_format, tuple(image.actions), image.details))
        record = self._schema.encode(schemas.ImageRecord(
            image=image.data,
            label=f.label,
            filename=filename,
            format=image.format,
            height=image.height,
            width=image.width,
            channels=image.channels,
            extra=self._extra(image),
        ))
        framed = frame_record(record)
        shard.index_entries.append((writer.num_bytes, len(framed)))
        writer.write(framed)
        shard.class_counts[f.label] += 1
        shard.stored.append((image.format, image.height, image.width, image.channels,
                             schemas.sample_dtype(image.format, image.data)))
        if image.georef is not None and (image.georef.epsg or image.georef.geotransform is not None):
            shard.georeferenced += 1
        if image.band_stats is not None and not shard.mixed_bands:
            merged = image.band_stats if shard.band_stats is None else shard.band_stats.merge(image.band_stats)
            shard.mixed_bands = merged is None
            shard.band_stats = merged

    def _extra(self, image) -> dict:
        """The record's optional features: the DICOM tags asked for, its georeferencing."""
        if not self._tag_keys and not self._schema.georef:
            return _NO_EXTRA  # The common case: no dict per record.
        extra = {key: image.tags.get(t, "") for t, key in self._tag_keys}
        if self._schema.georef:
            extra.update(_georef_values(image.georef))
        return extra

    def _validated(self, files, threads: int):
        """Yields (file, its images or its Reject) in order; groups of files validated ahead."""
        groups = read_ahead(self._validate_group, _groups(files), threads=threads, depth=threads)
        for group, outcomes in groups:
            yield from zip(group, outcomes)

    def _validate_group(self, group):
        """Reads and validates a group of files: for each, its images or its Reject."""
        outcomes: list = [None] * len(group)
        read = []  # (position in the group, bytes)
        for k, f in enumerate(group):
            if f.duplicate_of is not None:
                outcomes[k] = Reject(f.rel_path, "duplicate",
                                     "same content as " + _listing.display_path(f.duplicate_of))
                continue
            try:
                read.append((k, self._read(f)))
            except ImageRejected as e:
                outcomes[k] = Reject(f.rel_path, e.reason, e.message)
        results = self._validator.validate_many([(data, group[k].rel_path) for k, data in read])
        for (k, _), result in zip(read, results):
            if isinstance(result, ImageRejected):
                result = Reject(group[k].rel_path, result.reason, result.message)
            outcomes[k] = result
        return outcomes

    def _fingerprint(self, files) -> str:
        """What the shard's bytes depend on: its planned files and the validation options.

        The worker threads change speed only, never the bytes: not part of it.
        """
        h = hashlib.sha256(validation_fingerprint(self._validation).encode())
        for f in files:
            h.update(repr((os.fsencode(f.rel_path), f.size, f.label, f.order, f.duplicate_of)).encode())
        return h.hexdigest()

    def _read(self, f):
        try:
            return read_bytes(f.path)
        except OSError as e:
            # Beam wraps local I/O errors (permissions, vanished files).
            raise ImageRejected("unreadable", f"{f.rel_path}: {e}") from e

    def _log_written(self, name, outcome) -> None:
        result, rejects, _ = outcome
        _LOG.info(
            "Wrote %s: %s image%s%s [%d of %d shards done]",
            name, f"{result.num_records:,}", "" if result.num_records == 1 else "s",
            f", {len(rejects)} rejected" if rejects else "",
            self._count_done(), self._total_shards,
        )

    def _count_done(self) -> int:
        # Workers share no memory; the finished shards on disk are the progress.
        pattern = FileSystems.join(self._output_dir, "*.tfrecord")
        return len(FileSystems.match([pattern])[0].metadata_list)
