"""Writing one shard's file: read, validate, encode, frame and index its images.

Beam-free, so that a shard is written the same way in the runner's thread
(`beam_jobs._write.WriteShardFn`) and in a worker process (`processes`) that never
imports Beam for local files. `write_shard` takes a `ShardJob` of plain,
picklable values and returns the `ShardOutcome`; only `files` reaches
Beam, and only for a URL.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import threading
import types
from typing import NamedTuple

import schemas
from conversion import guard, masks as _masks, targets as _targets
from conversion import scene_log as _scene_log
from conversion.elements import Reject, ShardOutcome, ShardResult
from conversion.files import AtomicWriter, exists, is_local, match, open_to_read, read_bytes, write_shard_index
from imaging import ImageRejected, ImageValidator, ValidationOptions, ValidImage
from imaging import boxes as _boxes
from schemas.tfrecord import frame_record

__all__ = ["ShardFile", "ShardJob", "ShardOutcome", "write_shard", "warm_up", "warm_call", "record_schema",
           "default_threads"]

# Files of a shard read and validated ahead of the writer, per thread (see `read_ahead`).
_READ_AHEAD = 8
# Files validated together (`ImageValidator.validate_many`): at most this many,
# and of at most this many planned bytes, so that the groups read ahead hold
# a bounded amount of memory whatever the image sizes. 1 MiB keeps 64 small
# images (~1-3 KB) in one batch; with 8 MiB, 2,000 ~125 KB photos converted
# at 684-708 MiB peak instead of 569-576 (_READ_AHEAD groups in flight per
# shard writer), at the same speed.
_GROUP_FILES = 64
_GROUP_BYTES = 1 << 20
_GROUP_NAME_BYTES = 8 * 1024
_LOG = logging.getLogger("shardsmith.convert")
# The extra features of a record when no DICOM tags are asked for (never changed).
_NO_EXTRA = types.MappingProxyType({})
# normalized.jsonl actions of a scene's work item (--raster_patch): cut, with the
# offsets of the patches skipped for nodata; or failed (its patches missing).
_CUT_ACTION = _scene_log.CUT_ACTION
_FAILED_ACTION = _scene_log.FAILED_ACTION
# The mask kind (`conversion.targets.masks`): its pixels are counted per shard.
_MASK = _targets.masks.NAME
# What every JPEG record's samples decode to (`schemas.sample_dtype`), without asking per record.
_JPEG = "jpeg"
_UINT8 = schemas.sample_dtype(_JPEG, b"")
_ValidImage = ValidImage


class ShardFile(NamedTuple):
    """One planned file of a shard, as the writer needs it.

    Attributes:
      rel_path: Its path under the input folder (the record's filename).
      path: Where to read it.
      size: Its planned size in bytes (groups files for validation).
      label: Its class index.
      duplicate: With --dedup, the message of its 'duplicate' reject (it
        is then not read); None otherwise.
      targets: Its targets beyond one class (its mask's path and dtype
        among them), as compact JSON (`conversion.targets`); None when the
        dataset has none.
      patch_rows: With --raster_patch, for a work item of a scene: "y0,y1",
        its patches are those whose top row is in [y0, y1); "y0,y1,x0,x1",
        those whose left column is also in [x0, x1) (`imaging.scenes.WorkItem`,
        `imaging.scenes.cut_rows`); None: the whole file.
    """

    rel_path: str
    path: str
    size: int
    label: int
    duplicate: str | None = None
    targets: str | None = None
    patch_rows: str | None = None


@dataclasses.dataclass(frozen=True)
class ShardJob:
    """Everything one shard's writer needs: plain values, pickled to a worker process.

    Attributes:
      output_dir: Folder of the shards.
      split, index, num_shards: Which shard.
      name: Its file name (`schemas.shard_filename`).
      files: Its `ShardFile`s, in record order.
      num_classes: For the per-shard class counts.
      validation: The `imaging.ValidationOptions` of every file.
      threads: Threads that read and validate groups of files ahead of the
        writer; 0 reads and validates in the writer's own thread (a worker
        process, where no other Python thread competes for the GIL).
    """

    output_dir: str
    split: str
    index: int
    num_shards: int
    name: str
    files: tuple[ShardFile, ...]
    num_classes: int
    validation: ValidationOptions
    threads: int
    # (rel_path, reason, message) of its files that crashed or hung a process
    # before (`guard.Quarantine`): rejected without being read.
    quarantined: tuple[tuple[str, str, str], ...] = ()
    # The kinds of target every record carries (`schemas.TARGET_KINDS`), sorted.
    targets: tuple[str, ...] = ()


def record_schema(validation: ValidationOptions, targets: tuple[str, ...] = ()):
    """The schema of every image record a conversion with these options (and kinds of target) writes."""
    return schemas.ImageExampleSchema(
        extra_string_features=tuple(schemas.dicom_tag_key(t) for t in validation.dicom.tags),
        georef=validation.raster.georef,
        targets=tuple(targets),
    )


@functools.lru_cache(maxsize=4)
def _validator(validation: ValidationOptions) -> ImageValidator:
    # One per options and process: a worker process writes many shards.
    return ImageValidator(validation)


@functools.lru_cache(maxsize=4)
def _schema(validation: ValidationOptions, targets: tuple[str, ...] = ()) -> schemas.ImageExampleSchema:
    return record_schema(validation, targets)


def read_ahead(fn, items, *, threads: int, depth: int = _READ_AHEAD):
    """Yields (item, fn(item)) in order, computing up to `depth` items ahead on `threads`.

    Reads wait on storage (tens of milliseconds per object on cloud storage)
    and decoders release the GIL, so a small pool keeps every core and the
    network busy within one shard. At most `depth` results are in memory at
    once; the output order, and so the shard's bytes, do not depend on the pool.
    With 0 threads, each item is computed when it is asked for.
    """
    if threads == 0:
        for item in items:
            yield item, fn(item)
        return
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
    """`files` in order, in lists of at most _GROUP_FILES files and _GROUP_BYTES planned bytes.

    And of at most _GROUP_NAME_BYTES of paths: a group's names fit in one
    slot of the process's journal (`guard`).
    """
    group, size, names = [], 0, 0
    for f in files:
        name = len(f.rel_path) + len(f.path)
        if group and (len(group) == _GROUP_FILES or size + f.size > _GROUP_BYTES
                      or names + name > _GROUP_NAME_BYTES):
            yield group
            group, size, names = [], 0, 0
        group.append(f)
        size += f.size
        names += name
    if group:
        yield group


def _georef_values(georef) -> dict:
    """The georef features of a record: unknown where the image has none (`imaging.georef.Georef`)."""
    if georef is None:
        return schemas.georef_values()
    return schemas.georef_values(georef.epsg, georef.geotransform)


class _Shard:
    """What one shard collects while its records are written."""

    def __init__(self, num_classes: int):
        self.index_entries: list[tuple[int, int]] = []  # (offset, framed length) of each record
        self.classes = _targets.CLASS.counter(num_classes)  # Its records per class (`class_counts`)
        # (format, height, width, channels, sample dtype) of each record, for schemas.ImageStats.
        self.stored: list[tuple[str, int, int, int, str]] = []
        self.rejects: list[Reject] = []
        self.normalized: list[tuple] = []
        self.num_sources = 0
        self.band_stats = schemas.BandStatsAccumulator()  # Of its raster records
        self.georeferenced = 0  # Records with a known EPSG code or geotransform
        self.targets = _targets.TargetCounts()  # What its records hold, by kind of target
        self.mask_pixels = _masks.PixelCounter()  # Pixels per class id of its masks


def write_shard(job: ShardJob) -> ShardOutcome:
    """Writes the shard's file and its index atomically; returns what the manifest needs of it.

    Every file ends up as records or as a Reject with its reason. Errors
    other than a file's own (the output not writable, ...) are raised, and
    nothing is left under the shard's final name.
    """
    return _Writer(job).write()


class _Writer:
    """One shard being written (`write_shard`)."""

    def __init__(self, job: ShardJob):
        self._job = job
        self._validator = _validator(job.validation)
        self._schema = _schema(job.validation, job.targets)
        self._tag_keys = tuple((t, schemas.dicom_tag_key(t)) for t in job.validation.dicom.tags)
        self._quarantined = {path: (reason, message) for path, reason, message in job.quarantined}
        # Records with no extra feature (no DICOM tags asked for, no georef, no targets): the
        # plain path of `write` (`_encode_plain`) where a file has no targets.
        self._plain = not self._tag_keys and not self._schema.georef and not job.targets
        # rel_path -> (EXIF orientation, raw width, raw height) of targeted files turned upright
        # (`_validate_group`, on the read-ahead threads; read after their results).
        self._raw_frames: dict[str, tuple[int, int, int]] = {}
        # The objects of the remote folders its rasters lie in, listed once for their sidecars.
        self._folders = _RemoteFolders()

    def write(self) -> ShardOutcome:
        job = self._job
        writer = AtomicWriter(job.output_dir, job.name)
        shard = _Shard(job.num_classes)
        try:
            for f, outcome in self._validated(job.files, job.threads):
                if f.patch_rows is not None and isinstance(outcome, _scenes().Cut):  # Only a scene's item is cut.
                    outcome = self._cut_outcome(shard, f, outcome)
                elif isinstance(outcome, Reject) and f.patch_rows is not None:
                    outcome = self._failed_rows(shard, f, outcome)
                    if outcome is None:
                        continue
                if f.targets is None and type(outcome) is list and self._plain:
                    # The common record (an image alone: no mask, targets, tags or georef):
                    # encoded and written without the per-record objects of the general path.
                    try:
                        records = [(image, *self._encode_plain(f, image)) for image in outcome]
                    except ImageRejected as e:
                        shard.rejects.append(Reject(f.rel_path, e.reason, e.message))
                        continue
                    except Exception as e:  # noqa: BLE001 - this file alone: rejected, reported
                        shard.rejects.append(_internal_error(f, e))
                        continue
                    if f.patch_rows is None or _item(f).first:
                        shard.num_sources += 1
                    for image, filename, framed in records:
                        self._write_plain(writer, shard, f, image, filename, framed)
                    continue
                if not isinstance(outcome, Reject):
                    try:
                        # One record per kept image (frame, page), with its mask and targets.
                        targets = [self._targets(f, _masks.unpack(item)[0]) for item in outcome]
                        records = [(item, *self._encode(f, item, t), t) for item, t in zip(outcome, targets)]
                    except ImageRejected as e:  # Its targets cannot be stored (bad_target)
                        outcome = Reject(f.rel_path, e.reason, e.message)
                    except Exception as e:  # noqa: BLE001 - this file alone: rejected, reported
                        outcome = _internal_error(f, e)
                if isinstance(outcome, Reject):
                    shard.rejects.append(outcome)
                    continue
                if f.patch_rows is None or _item(f).first:
                    # A scene is counted once, by its first item, wherever its other items are.
                    shard.num_sources += 1
                for item, filename, framed, t in records:
                    self._write_record(writer, shard, f, item, filename, framed, t)
        except BaseException:
            writer.abort()
            raise
        writer.commit()
        index_name, index_sha256 = write_shard_index(job.output_dir, job.name, shard.index_entries)
        stats = schemas.ImageStats.of(shard.stored)
        band_stats = shard.band_stats.result()  # None: no rasters, or mixed band counts
        result = ShardResult(
            job.split, job.index, job.num_shards, job.name, len(shard.index_entries), writer.num_bytes,
            writer.sha256, shard.classes.to_json(), index_name, index_sha256,
            shard.num_sources, images=stats.to_json() if stats else None,
            band_stats=None if band_stats is None else band_stats.to_json(),
            georeferenced=shard.georeferenced if self._schema.georef else None,
            targets=shard.targets.to_json(),
            mask_pixels=shard.mask_pixels.to_json() if _MASK in job.targets else None,
        )
        return ShardOutcome(result, shard.rejects, shard.normalized)

    def _cut_outcome(self, shard: _Shard, f: ShardFile, cut) -> list:
        """The patches of a scene's item, its rows listed in normalized.jsonl with what was skipped."""
        details = {**_item_details(f), "written": len(cut.images),
                   "skipped": [[y, x] for y, x in cut.skipped],
                   "skipped_nodata_share": [round(v, 6) for v in cut.shares]}
        if cut.scene_size is not None:
            # The scene's size fixes its patch grid: what verify checks the offsets against.
            details["scene_size"] = list(cut.scene_size)
        shard.normalized.append((_item(f).name(f.rel_path), "tiff", (_CUT_ACTION,), details))
        return cut.images

    def _failed_rows(self, shard: _Shard, f: ShardFile, reject: Reject) -> Reject | None:
        """The Reject of a scene's first item stays the scene's; a later item's failure is listed.

        A scene is one input: rejected by its first item (whose shard counts
        it), while the failure of a later item, whose patches are then
        missing, is listed in normalized.jsonl with its reason.
        """
        if _item(f).first:
            return reject
        shard.normalized.append((_item(f).name(f.rel_path), "tiff", (_FAILED_ACTION,),
                                 {**_item_details(f), "reason": reject.reason, "message": reject.message}))
        return None

    def _targets(self, f: ShardFile, image):
        """The record's `conversion.targets.RecordTargets`, or None when the dataset has no targets."""
        if f.targets is None:
            return None
        return _targets.record_targets(f.targets, image, self._raw_frames.get(f.rel_path), f.rel_path)

    def _encode(self, f: ShardFile, item, targets=None) -> tuple[str, bytes]:
        """The record's filename and its framed bytes (every record of a file is encoded before any is written)."""
        image, mask, _ = _masks.unpack(item)
        # One record per kept frame: its filename says which.
        filename = f.rel_path if image.frame is None else f"{f.rel_path}#frame={image.frame}"
        if image.page is not None:
            filename += f"#page={image.page}"
        if image.patch is not None:
            filename += f"{_scene_log.PATCH_MARK}{image.patch[0]},{image.patch[1]}"
        record = self._schema.encode(schemas.ImageRecord(
            image=image.data,
            label=f.label,
            filename=filename,
            format=image.format,
            height=image.height,
            width=image.width,
            channels=image.channels,
            extra=self._extra(image, mask) if targets is None else {**self._extra(image, mask), **targets.extra},
        ))
        return filename, frame_record(record)

    def _encode_plain(self, f: ShardFile, image) -> tuple[str, bytes]:
        """`_encode` of an image alone (a `ValidImage`, no mask or targets) when records have no extra feature."""
        if type(image) is not _ValidImage or image.frame is not None or image.page is not None \
                or image.patch is not None:
            return self._encode(f, image)  # A mask, or a filename that says which frame, page or patch.
        return f.rel_path, frame_record(self._schema.encode(schemas.ImageRecord(
            image.data, f.label, f.rel_path, image.format, image.height, image.width, image.channels, _NO_EXTRA)))

    def _write_plain(self, writer: AtomicWriter, shard: _Shard, f: ShardFile, image, filename: str,
                     framed: bytes) -> None:
        """`_write_record` of a record `_encode_plain` encoded."""
        if type(image) is not _ValidImage:
            self._write_record(writer, shard, f, image, filename, framed)
            return
        self._add_record(writer, shard, f, image, filename, framed, image.actions, image.details)

    def _write_record(self, writer: AtomicWriter, shard: _Shard, f: ShardFile, item, filename: str,
                      framed: bytes, targets=None) -> None:
        """Writes one framed record; notes it in the shard's index, counts and normalisations."""
        image, _, mask_counts = _masks.unpack(item)
        if mask_counts is not None:
            shard.mask_pixels.add(mask_counts)
        actions, details = image.actions, image.details
        if targets is not None:
            shard.targets.add(targets)
            if targets.details:
                # What was done to its targets (by kind), next to what was done to its pixels.
                actions = (*actions, *targets.actions)
                details = {**(details or {}), **targets.details}
        self._add_record(writer, shard, f, image, filename, framed, actions, details)

    @staticmethod
    def _add_record(writer: AtomicWriter, shard: _Shard, f: ShardFile, image, filename: str, framed: bytes,
                    actions, details) -> None:
        """Writes one framed record of `image`; notes it in the shard's index, counts and normalisations."""
        if actions:
            shard.normalized.append((filename, image.source_format, tuple(actions), details))
        shard.index_entries.append((writer.num_bytes, len(framed)))
        writer.write(framed)
        shard.classes.add(f.label)
        fmt = image.format
        shard.stored.append((fmt, image.height, image.width, image.channels,
                             _UINT8 if fmt == _JPEG else schemas.sample_dtype(fmt, image.data)))
        if image.georef is not None and (image.georef.epsg or image.georef.geotransform is not None):
            shard.georeferenced += 1
        if image.band_stats is not None:
            shard.band_stats.add(image.band_stats)

    def _extra(self, image, mask: bytes | None = None) -> dict:
        """The record's optional features: the DICOM tags asked for, its georeferencing, its mask."""
        if not self._tag_keys and not self._schema.georef and mask is None:
            return _NO_EXTRA  # The common case: no dict per record.
        extra = {key: image.tags.get(t, "") for t, key in self._tag_keys}
        if self._schema.georef:
            extra.update(_georef_values(image.georef))
        if mask is not None:
            extra[schemas.MASK.key] = mask
        return extra

    def _validated(self, files, threads: int):
        """Yields (file, its images or its Reject) in order; groups of files validated ahead."""
        groups = read_ahead(self._validate_group, _groups(files), threads=threads, depth=threads)
        for group, outcomes in groups:
            yield from zip(group, outcomes)

    def _validate_group(self, group: list[ShardFile]):
        """Reads and validates a group of files: for each, its images or its Reject.

        The files are noted in this process's journal meanwhile (`guard`):
        if a decoder kills the process, whoever started it knows which files
        were in work.
        """
        outcomes: list = [None] * len(group)
        todo = []
        for k, f in enumerate(group):
            if f.duplicate is not None:
                outcomes[k] = Reject(f.rel_path, "duplicate", f.duplicate)
            elif f.rel_path in self._quarantined:
                outcomes[k] = Reject(f.rel_path, *self._quarantined[f.rel_path])
            elif f.patch_rows is not None:
                outcomes[k] = self._cut(f)
            else:
                todo.append(k)
        if not todo:
            return outcomes
        # `now_on(j)` as the work on the j-th noted file starts: --file_timeout times each file.
        with guard.working_on([(group[k].rel_path, group[k].path) for k in todo]) as now_on:
            read = []  # (position in the group, position in the journal's slot, bytes)
            for j, k in enumerate(todo):
                try:
                    read.append((k, j, _read(group[k])))
                except ImageRejected as e:
                    outcomes[k] = Reject(group[k].rel_path, e.reason, e.message)
                except Exception as e:  # noqa: BLE001 - this file alone: rejected, reported
                    outcomes[k] = _internal_error(group[k], e)
            items = [(data, group[k].rel_path) for k, _, data in read]
            georef = self._job.validation.raster.georef
            sidecars = {}  # The TIFFs' and JPEG 2000s' GIS sidecars, by name.
            for k, _, data in read:
                if _has_sidecars(data):
                    found = _sidecars(group[k], georef, self._folders)
                    if found is not None:
                        sidecars[group[k].rel_path] = found

            def on_file(i: int) -> None:  # `validate_many`'s i-th item (-1: a batch of them).
                now_on(read[i][1] if i >= 0 else -1)

            try:
                results = self._validator.validate_many(items, on_file, sidecars)
            except Exception:  # noqa: BLE001 - which file, and why: one at a time below
                results = []
                for i, (data, name) in enumerate(items):
                    on_file(i)
                    results.append(self._validate_one(data, name, sidecars.get(name)))
            for (k, j, data), result in zip(read, results):
                if isinstance(result, ImageRejected):
                    result = Reject(group[k].rel_path, result.reason, result.message)
                elif isinstance(result, Exception):
                    result = _internal_error(group[k], result)
                else:
                    if group[k].targets is not None:
                        now_on(j)
                    result = self._with_targets(group[k], result, data)
                outcomes[k] = result
        return outcomes

    def _cut(self, f: ShardFile):
        """The `imaging.scenes.Cut` of a scene's work item, or its Reject; read window by window.

        With a mask (--masks_dir), its label raster is cut at the same
        offsets, and each patch paired with its mask (`conversion.masks.MaskedImage`).
        """
        item = _item(f)
        columns = None if item.x0 is None else (item.x0, item.x1)
        validation = self._job.validation
        with guard.working_on([(f.rel_path, f.path)]):
            try:
                mask = _targets.masks.of_file(f.targets)
                with contextlib.ExitStack() as stack:
                    labels = None if mask is None else stack.enter_context(self._labels(f, *mask))
                    fh = stack.enter_context(open_to_read(f.path))
                    cut = _scenes().cut_rows(fh, f.rel_path, item.y0, item.y1, validation.raster,
                                             validation.resize, labels, columns,
                                             _sidecars(f, validation.raster.georef, self._folders))
                if cut.masks is None:
                    return cut
                # Encoded here, on the read-ahead threads, as photos' masks are.
                images = _masks.pair_patches(cut.images, cut.masks, mask[1])
                return dataclasses.replace(cut, images=images, masks=None)
            except ImageRejected as e:
                return Reject(f.rel_path, e.reason, e.message)
            except OSError as e:
                return Reject(f.rel_path, "unreadable", f"{f.rel_path}: {e}")
            except Exception as e:  # noqa: BLE001 - this scene's item alone: rejected, reported
                return _internal_error(f, e)

    @contextlib.contextmanager
    def _labels(self, f: ShardFile, path: str, dtype: str):
        """The scene's label raster (`imaging.scenes.LabelRaster`) at `path`, open for the item."""
        try:
            fh = open_to_read(path)
        except OSError as e:
            raise ImageRejected("mask_unreadable", f"mask of {f.rel_path}: {e}") from e
        with fh, _scenes().LabelRaster(fh, path, dtype) as labels:
            yield labels

    def _with_targets(self, f: ShardFile, images, data: bytes):
        """The file's images, paired with its mask (`conversion.masks.pair`), its raw frame noted
        for its boxes (`_note_raw_frame`); or the pair's Reject."""
        if f.targets is None:
            return images
        try:
            self._note_raw_frame(f, data, images)
            drawn = _targets.masks.drawn_regions(f.targets)
            if drawn is not None:
                from conversion import annotation_masks  # Only runs with --annotation_masks load pycocotools.

                return annotation_masks.pair(f.rel_path, drawn[0], images, data, drawn[1])
            mask = _targets.masks.of_file(f.targets)
            if mask is None:
                return images
            path, dtype = mask
            return _masks.pair(f.rel_path, path, images, data, dtype, self._job.validation.max_pixels,
                               _targets.masks.drawn_of(f.targets))
        except ImageRejected as e:
            return Reject(f.rel_path, e.reason, e.message)
        except Exception as e:  # noqa: BLE001 - this pair alone: rejected, reported
            return _internal_error(f, e)

    def _note_raw_frame(self, f: ShardFile, data: bytes, result) -> None:
        """Notes the raw frame of a file with targets that was turned upright (its boxes may need it)."""
        if f.targets is None or not isinstance(result, list):
            return
        if any("exif_transpose" in image.actions for image in result):
            try:
                self._raw_frames[f.rel_path] = _boxes.raw_frame(data)
            except (OSError, ValueError) as e:
                # Rejected as bad_target by the boxes' `record` (`conversion.targets.boxes`), which needs it.
                _LOG.debug("No raw frame of %s", f.rel_path, exc_info=e)

    def _validate_one(self, data: bytes, name: str, sidecars=None):
        """A file's images, its ImageRejected, or the unexpected error it raised (returned)."""
        try:
            return self._validator.validate_all(data, name, sidecars)
        except ImageRejected as e:
            return e
        except Exception as e:  # noqa: BLE001 - returned, and rejected as internal_error
            return e


def _internal_error(f: ShardFile, error: Exception) -> Reject:
    """The Reject of a file on which shardsmith or a library failed unexpectedly; logged with its traceback."""
    _LOG.debug("Unexpected error on %s", f.rel_path, exc_info=error)
    return Reject(f.rel_path, guard.INTERNAL_ERROR, guard.internal_error_message(f.rel_path, error))


def _item(f: ShardFile):
    """The `imaging.scenes.WorkItem` of a scene's work item."""
    return _scenes().WorkItem.parse(f.patch_rows)


def _scenes():
    """`imaging.scenes`, imported once a scene is cut (--raster_patch): a photo run never loads it."""
    from imaging import scenes

    return scenes


def _item_details(f: ShardFile) -> dict:
    """normalized.jsonl's patch_rows [y0, y1] of a scene's work item, and patch_columns [x0, x1] of a range."""
    item = _item(f)
    if item.x0 is None:
        return {"patch_rows": [item.y0, item.y1]}
    return {"patch_rows": [item.y0, item.y1], "patch_columns": [item.x0, item.x1]}


# The first bytes of a TIFF (II or MM; 42, or 43 for BigTIFF).
_TIFF_MAGIC = frozenset((b"II*\0", b"MM\0*", b"II+\0", b"MM\0+"))


def _has_sidecars(data: bytes) -> bool:
    """Whether GDAL reads GIS sidecars beside a file of these bytes: a TIFF's or a JPEG 2000's (JP2OpenJPEG)."""
    from imaging import jp2

    return data[:4] in _TIFF_MAGIC or jp2.is_jpeg2000(data[:12])


class _RemoteFolders:
    """The object names of the remote folders a shard's rasters lie in, each folder listed once.

    GDAL's sidecars of a raster are up to 11 names (`imaging.sidecars.sidecar_names`):
    an existence check of each on gs:// is a request per name and raster,
    though most rasters have none. One listing of the folder (a request per
    1,000 objects) answers them all. Shared by the shard's read-ahead threads.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._names: dict[str, frozenset[str] | None] = {}

    def names(self, folder: str) -> frozenset[str] | None:
        """The paths of the objects directly in `folder`; None where it cannot be listed as a pattern."""
        with self._lock:
            if folder not in self._names:
                self._names[folder] = self._list(folder)
            return self._names[folder]

    @staticmethod
    def _list(folder: str) -> frozenset[str] | None:
        if any(c in folder for c in "*?["):
            return None  # A wildcard of its own in the folder's name: one check per name instead.
        try:
            return frozenset(match(folder + "/*"))
        except OSError as e:
            _LOG.warning("%s is not listed for sidecars (%s): each name is checked instead", folder, e)
            return None


def _sidecars(f: ShardFile, georef: bool, folders: _RemoteFolders | None = None):
    """What the GIS sidecars beside a TIFF or a JPEG 2000 say (`imaging.sidecars.load`), or None without any.

    Local files are looked up one name at a time (a stat each); URLs in
    their folder's listing (`_RemoteFolders`, one per shard), else one
    existence check per name through Beam's FileSystems. A sidecar that
    cannot be read is passed over with a warning: the raster is converted
    without it.
    """
    from imaging import sidecars as _sidecars_module

    if is_local(f.path):
        return _sidecars_module.load(f.path, f.rel_path, georef)
    listed = None if folders is None else folders.names(f.path.rsplit("/", 1)[0])

    def read(path: str) -> bytes | None:
        try:
            there = path in listed if listed is not None else exists(path)
            return read_bytes(path) if there else None
        except OSError as e:
            _LOG.warning("%s: its sidecar %s is not read (%s)", f.rel_path, path, e)
            return None

    return _sidecars_module.load(f.path, f.rel_path, georef, read)


def _read(f: ShardFile) -> bytes:
    try:
        return read_bytes(f.path)
    except OSError as e:
        # Beam wraps I/O errors of URLs (permissions, vanished objects) in OSErrors too.
        raise ImageRejected("unreadable", f"{f.rel_path}: {e}") from e


def warm_up(validation: ValidationOptions, decoders: bool = True, decoder_threads: int = 0) -> None:
    """Prepares a worker process for shards of `validation`, ahead of its first one.

    Args:
      validation: The conversion's options.
      decoders: Load TensorFlow's decode ops too (~2 s of CPU): a worker
        process then does it while the driver still plans. Rasters stored
        raw never need them.
      decoder_threads: Threads of each batch of JPEG decodes (0: one per
        core); a worker among one per core takes 1.
    """
    from schemas import tf_runtime

    tf_runtime.set_batch_decoder_threads(decoder_threads)
    validator = _validator(validation)
    _schema(validation)
    if decoders:
        validator.load_decoders()


def warm_call(validation: ValidationOptions, processes: int, decoders: bool = True) -> tuple:
    """The warm-up (fn, args) of `processes` worker processes on this machine (`warm_up`).

    TensorFlow's decoding threads are split between the processes, not a
    pool per core in each.
    """
    return warm_up, (validation, decoders, max(1, (os.cpu_count() or 1) // processes))


def default_threads() -> int:
    """Read-ahead threads of a shard writer in the runner's thread: min(4, cores)."""
    return min(4, os.cpu_count() or 1)
