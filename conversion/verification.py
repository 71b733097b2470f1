"""Verifying a dataset's shards, Beam-free: what `shardsmith verify` checks and reports.

`ShardVerifier` reads one shard and checks every record, its index file, its
class counts, image stats and band statistics against the manifest;
`check_scene` a scene's patch offsets against its grid; `report` builds the
report of every check. `beam_jobs.verify` runs them as a pipeline, through
thin DoFns (`beam_jobs._verify_fns`).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math

import numpy as np

import schemas
from imaging import ResizeOptions
from imaging.resize import target_size as _resize_target
from imaging import nodata as _nodata
from imaging import raster as _raster
from schemas import tf_runtime
from schemas import volumes as _volume_schemas
from schemas.tfrecord import RecordError, check_frame, format_index, frame_data, iter_records
from conversion import guard, scene_log
from conversion.targets import CLASS as _CLASS, kind_named as _kind_named, labels as _target_labels
from conversion.files import exists, join, open_to_read, read_bytes, write_atomically
from imaging import patches as _patches

__all__ = ["ShardCheck", "ShardVerifier", "TargetCheck", "CONTENT", "PATCHES", "CHECK_FAILED",
           "counts_agree", "raster_records", "check_scene", "duplicate_group", "report",
           "write_report", "check_volume_mask", "mask_voxel_problems"]

# The tags of what `ShardVerifier.check` gives out besides the shard's `ShardCheck`.
CONTENT = "content"
PATCHES = "patches"

# How a record whose check raised an unexpected error is reported: the record
# is not known to be bad, and the other records are still verified.
CHECK_FAILED = f"the check itself failed ({guard.INTERNAL_ERROR})"

# How far a recomputed band mean or m2 may be from the manifest's, relative to
# the scale of the values (max |min|, |max| of the band; squared times the
# sample count for m2). Both sides are float64 sums of the same stored
# values; only numpy's summation order may differ (pairwise blocks, SIMD
# width of the build), which moves a sum of n terms by at most ~n * 2**-53
# of that scale: 1e-9 covers a billion samples per shard, and a changed
# sample moves the mean of a 64x64 band by ~2e-4 of the scale.
BAND_STATS_RTOL = 1e-9


@dataclasses.dataclass(frozen=True)
class ShardCheck:
    split: str
    file: str
    num_records: int
    class_counts: tuple[int, ...]
    problems: tuple[str, ...]
    # Records whose check raised an unexpected error: their class is unknown (`counts_agree`).
    unchecked: int = 0
    # A masked volume dataset's: (class id, voxels) of the shard's masks, ascending ids.
    mask_voxels: tuple[tuple[int, int], ...] = ()


# Whether class counts match the manifest's, given `unchecked` records of unknown class: the class's row's.
counts_agree = _CLASS.verify



class ShardVerifier:
    """Reads one shard and checks everything about it (`check`), Beam-free.

    `beam_jobs.verify`'s DoFn is a thin adapter of it: built with the
    arguments below (cheap, picklable), `setup()` on the worker, then
    `check(split, shard)` per shard.

    Args:
      dataset_dir: The dataset folder.
      features: The manifest's feature specs.
      num_classes: Number of classes.
      resize: The manifest's `options.resize` (--max_side/--min_side), whose
        sizes every stored image must obey; None when the dataset has none.
      rasters: Record filename to nodata value (or None) of each raster
        record, whose values the band statistics cover (`raster_records`);
        None when they cannot be known (no normalized.jsonl).
      targets: The manifest's `targets` section (`Manifest.targets`): what
        the target features of the records must hold (`TargetCheck`).
      patch_size: With --raster_patch, (height, width) of a patch (the
        manifest's options.raster.patch.size): every patch record
        (PATH#patch=Y,X) must have it, and its (scene, (y, x)) is given out
        tagged PATCHES (`check_scene` checks each scene's offsets).
        None: not a dataset of patches.
    """

    def __init__(self, dataset_dir: str, features, num_classes: int, resize: dict | None = None,
                 rasters: dict[str, float | None] | None = None, targets: dict | None = None,
                 patch_size: tuple[int, int] | None = None):
        self._dir = dataset_dir
        self._patch_size = None if patch_size is None else (int(patch_size[0]), int(patch_size[1]))
        self._rasters = rasters
        self._targets = dict(targets or {})
        self._target_check = None
        # Plain JSON in, validated here: a malformed manifest fails before any worker starts.
        self._resize = ResizeOptions.from_json(resize) if resize else None
        self._features = dict(features)
        self._num_classes = num_classes
        self._schema = None
        self._tf = None

    def setup(self):
        # The whole library (decode_image is not a plain op), imported the
        # cheap way (schemas/tf_runtime.py).
        self._tf = tf_runtime.full()
        if _volume_schemas.VOLUME.key in self._features:  # --volumes: each record parsed and its voxels counted.
            self._schema = _volume_schemas.VolumeExampleSchema.from_json(self._features)
        elif schemas.example_kind(self._features) == schemas.TIME_SERIES:
            self._schema = schemas.TimeSeriesExampleSchema.from_json(self._features)
        else:
            self._schema = schemas.ImageExampleSchema.from_json(self._features)
        self._target_check = TargetCheck(getattr(self._schema, "targets", ()), self._targets, self._num_classes)

    def check(self, split: str, shard):
        """Checks one shard (a `schemas.ShardInfo` of `split`).

        Yields:
          (CONTENT, (sha256 of the image bytes, (split, filename))) per good
          record, (PATCHES, (scene, (y, x))) per patch record, and last the
          shard's `ShardCheck`.
        """
        problems = []
        classes = _CLASS.counter(self._num_classes)
        mask_voxels = collections.Counter()  # A masked volume's voxels per class id.
        stored = []  # (format, height, width, channels, sample dtype) of each good record
        bands = _BandCheck(shard, self._rasters)
        path = join(self._dir, shard.file)
        sha = hashlib.sha256()
        size = 0
        offsets = []
        unchecked = 0
        damaged = False  # Damaged records listed one by one (`_damaged_records`).
        if not exists(path):
            yield ShardCheck(split, shard.file, 0, classes.to_json(), (f"{shard.file}: file is missing",))
            return
        # A targets section that cannot say what the records must hold: once per shard, not per record.
        problems.extend(f"{shard.file}: {p}" for p in self._target_check.section_problems)
        later = 0  # Records after a damaged one that hold (read by the index file).

        def take(number: int, offset: int, data: bytes):
            """Checks one record; counts its class; yields its CONTENT (and PATCHES)."""
            nonlocal unchecked
            problem, label, digest, name, image, pixels = self._check_record_guarded(data, mask_voxels)
            if problem and CHECK_FAILED in problem:
                unchecked += 1
            if problem:
                problems.append(f"{shard.file}: record {number} (byte {offset}): {problem}")
                return
            classes.add(label)
            stored.append(image)
            bands.add(name, pixels)
            yield CONTENT, (digest, (split, name))
            patch = self._patch(name, image)
            if patch is not None:
                patch_problem, scene_offset = patch
                if patch_problem:
                    problems.append(f"{shard.file}: record {number} (byte {offset}): {patch_problem}")
                yield PATCHES, scene_offset

        with open_to_read(path) as f:
            reader = _HashingReader(f, sha)
            try:
                for number, (offset, length, data) in enumerate(iter_records(reader, shard.file)):
                    offsets.append((offset, length))
                    yield from take(number, offset, data)
            except RecordError as e:
                # The error names the shard file and the record's offset; the index file (when it
                # is the manifest's) says where every later record starts, so each is looked at:
                # a damaged one listed, one that holds checked and counted as any other.
                entries = self._intact_index(shard)
                if entries is None:
                    problems.append(f"{e}; the rest of the shard is unreadable (no intact index file "
                                    "says where its records start)")
                else:
                    lost = []
                    for number, offset, what, frame in self._after_damage(path, entries, len(offsets)):
                        if what is None:
                            later += 1
                            yield from take(number, offset, frame_data(frame))
                        else:
                            lost.append(f"{shard.file}: record {number} (byte {offset}): {what}; source file "
                                        f"lost: {self._source_of(frame)}")
                    # A lost record's class is unknown: the counts agree if the rest add up (`counts_agree`).
                    unchecked += len(lost)
                    problems.extend(lost)
                    problems.append(
                        f"{shard.file}: {len(lost)} damaged record(s) of {len(entries)} (read by its index file, "
                        f"from the first damage at byte {e.offset}: {e.reason}); {later} later record(s) hold "
                        "and were checked. `shardsmith convert --resume` with the same input writes the shard again")
                    damaged = True
                while reader.read(1 << 22):  # The whole file's size and sha256, as for a shard that holds.
                    pass
            size = reader.size
        if size != shard.num_bytes:
            problems.append(f"{shard.file}: {size} bytes, the manifest says {shard.num_bytes}")
        elif sha.hexdigest() != shard.sha256:
            problems.append(f"{shard.file}: sha256 differs from the manifest")
        if len(offsets) != shard.num_records and not damaged:
            problems.append(f"{shard.file}: {len(offsets)} records, the manifest says {shard.num_records}")
        counts = classes.to_json()
        if not counts_agree(counts, shard.class_counts, unchecked):
            problems.append(f"{shard.file}: class counts {list(counts)}, the manifest says {list(shard.class_counts)}")
        stats = schemas.ImageStats.of(stored)
        if stats is not None and shard.images is not None and shard.images.layouts is None:
            stats = dataclasses.replace(stats, layouts=None)  # Not recorded by an older version.
        if shard.images is not None and not problems and stats != shard.images:
            # Readers specialise on these (e.g. JPEGs of one size): they must be true.
            problems.append(f"{shard.file}: images {stats and stats.to_json()}, the manifest "
                            f"says {shard.images.to_json()}")
        if not problems:
            problems.extend(bands.problems())
        if not damaged:  # Else the index file was read, and held.
            problems.extend(self._check_index(shard, offsets))
        yield ShardCheck(split, shard.file, len(offsets) + later, counts, tuple(problems), unchecked,
                         tuple(sorted(mask_voxels.items())))

    def _intact_index(self, shard) -> list[tuple[int, int]] | None:
        """(offset, length) of each record of a shard, from its index file; None without one that is the manifest's."""
        if not shard.index_file:
            return None
        index_path = join(self._dir, shard.index_file)
        if not exists(index_path):
            return None
        data = read_bytes(index_path)
        if shard.index_sha256 and hashlib.sha256(data).hexdigest() != shard.index_sha256:
            return None
        return [tuple(map(int, line.split())) for line in data.decode("ascii").splitlines()]

    @staticmethod
    def _after_damage(path: str, entries, first: int):
        """Yields (number, offset, what is wrong or None, frame) of each record from `first` on, by `entries`.

        What is wrong: `schemas.tfrecord.check_frame`'s bad length CRC or bad data
        CRC, or truncated. One record's frame is held at a time.
        """
        with open_to_read(path) as f:
            for number in range(first, len(entries)):
                offset, length = entries[number]
                f.seek(offset)
                frame = f.read(length)
                what = check_frame(frame)
                if what is not None and len(frame) < length:
                    what = f"truncated (the shard ends {len(frame)} bytes into this {length}-byte record)"
                yield number, offset, what, frame

    def _source_of(self, frame: bytes) -> str:
        """The filename a damaged record names, if its data still parses; else a word that it is unknown."""
        try:
            name = self._schema.decode(frame_data(frame))[schemas.FILENAME.key]
            if isinstance(name, bytes):  # A volume's is a str already.
                name = name.decode("utf-8", "backslashreplace")
            return name + " (read from the damaged record)"
        except Exception:  # noqa: BLE001 - damaged bytes: any parse error means unknown
            return "unknown (the record's data does not parse)"

    def _patch(self, name: str, image):
        """(problem or None, (scene, (y, x))) of a patch record; None for another record or dataset.

        The record's stored height and width must be the manifest's patch
        size (resized by the manifest's --max_side/--min_side, if any),
        whatever the edge policy (padding fills a patch, never shortens it).
        """
        if self._patch_size is None:
            return None
        parsed = scene_log.split_patch_name(name)
        if parsed is None:
            return None
        scene, y, x = parsed
        problem = None
        h, w = self._patch_size
        # With --max_side/--min_side every patch is stored at the size the policy gives a patch.
        stored = _resize_target(h, w, self._resize) if self._resize is not None else (h, w)
        if (image[1], image[2]) != stored:
            problem = (f"{name}: a patch of {image[1]}x{image[2]} pixels, but the manifest's patch "
                       f"size (options.raster.patch.size, --raster_patch) is {h}x{w} (height x width)")
            if stored != (h, w):
                problem += f", stored at {stored[0]}x{stored[1]} under its resize {self._resize.to_json()}"
        return problem, (scene, (y, x))

    def _check_record_guarded(self, data: bytes, mask_voxels: collections.Counter | None = None):
        """`_check_record`; an unexpected error checking one record is that record's problem alone."""
        try:
            return self._check_record(data, mask_voxels)
        except Exception as e:  # noqa: BLE001 - reported; the other records are still verified
            return _failed(f"{CHECK_FAILED}: {guard.internal_error_message('check', e)}")

    def _check_record(self, data: bytes, mask_voxels: collections.Counter | None = None):
        """Returns (problem or None, label, content digest, filename, image, pixels).

        `image` is (format, height, width, channels, sample dtype); `pixels`
        the decoded values of a raster record (see `_BandCheck`), else None.
        A masked volume's voxels per class id are added to `mask_voxels`.
        """
        if isinstance(self._schema, _volume_schemas.VolumeExampleSchema):
            return self._check_volume(data, mask_voxels)
        try:
            values = self._schema.decode(data)
        except ValueError as e:
            return _failed(f"does not parse: {e}")
        name = values[schemas.FILENAME.key].decode("utf-8", "backslashreplace")
        label = values[schemas.LABEL.key]
        if isinstance(self._schema, schemas.TimeSeriesExampleSchema):
            return self._check_stack(values, name, label, data)
        if label == -1 and self._target_check.allows_no_label:
            pass  # No image-level class: masks, boxes, numbers or several labels instead.
        elif label == -1:
            return _failed(f"{name}: label -1 (no class), but the manifest has "
                           f"{self._num_classes} class_names", name)
        elif not 0 <= label < self._num_classes:
            return _failed(f"{name}: label {label} is outside [0, {self._num_classes})", name)
        image = values[schemas.IMAGE.key]
        stored = (values[schemas.HEIGHT.key], values[schemas.WIDTH.key], values[schemas.CHANNELS.key])
        fmt = values[schemas.FORMAT.key].decode("ascii", "replace")
        try:
            raw = schemas.parse_raw_format(fmt)
            dtype = schemas.sample_dtype(fmt, image)
        except ValueError as e:
            return _failed(f"{name}: {e}", name)
        wanted = self._rasters is not None and name in self._rasters
        pixels = None
        try:
            if raw is None:
                decoded = self._tf.io.decode_image(image, expand_animations=False,
                                                   dtype=getattr(self._tf, dtype))
                shape = decoded.shape
                pixels = decoded.numpy() if wanted else None
            else:
                shape, pixels = self._raw_pixels(image, raw, stored)
        except self._tf.errors.OpError as e:
            return _failed(f"{name}: image does not decode ({e.message.split('}}')[-1].strip()})", name)
        if tuple(shape) != stored:
            return _failed(f"{name}: decodes to {tuple(shape)}, the record says {stored}", name)
        if self._resize is not None and not self._resize.allows(stored[0], stored[1]):
            return _failed(f"{name}: stored at {stored[0]}x{stored[1]}, larger than the manifest's "
                          f"resize {self._resize.to_json()} allows", name)
        problem = self._target_check.check(values, stored[0], stored[1], self._tf)
        if problem:
            return _failed(f"{name}: {problem}", name)
        return (None, label, hashlib.sha256(image).hexdigest(), name,
                (fmt, stored[0], stored[1], stored[2], dtype), pixels if wanted else None)

    def _check_volume(self, data: bytes, mask_voxels: collections.Counter | None = None):
        """`_check_record` of a volume: its voxels fill its shape and dtype, its affine is finite, its label a
        class; its mask (--masks_dir) as `check_volume_mask` says, its voxels per class counted."""
        try:
            values = self._schema.decode(data)  # Raises on voxels that do not fill the shape.
        except ValueError as e:
            return _failed(f"does not parse: {e}")
        name, label = values[schemas.FILENAME.key], values[schemas.LABEL.key]
        if label != -1 and not 0 <= label < self._num_classes:
            return _failed(f"{name}: label {label} is outside [0, {self._num_classes})", name)
        if not np.isfinite(values[_volume_schemas.VOLUME_AFFINE.key]).all():
            return _failed(f"{name}: its affine is not finite", name)
        if self._schema.mask:
            problem, voxels = check_volume_mask(values, self._targets.get("mask") or {})
            if mask_voxels is not None:
                mask_voxels.update(voxels)
            if problem:
                return _failed(f"{name}: {problem}", name)
        voxels = values[_volume_schemas.VOLUME.key]
        _, h, w = voxels.shape
        return (None, label, hashlib.sha256(voxels.tobytes()).hexdigest(), name,
                ("volume", h, w, 1, voxels.dtype.name), None)

    def _check_stack(self, values: dict, name: str, label: int, data: bytes):
        """`_check_record` of a time series' stack: its values fill its shape, one ascending date per
        step, one name per band, the label and the mask as for images."""
        if not (label == -1 and self._target_check.allows_no_label) and not 0 <= label < self._num_classes:
            return _failed(f"{name}: label {label} is outside [0, {self._num_classes})", name)
        try:
            stack = schemas.TimeSeriesExampleSchema.array(values)
        except ValueError as e:
            return _failed(f"{name}: {e}", name)
        t, h, w, b = stack.shape
        dates = values[schemas.STACK_DATES.key]
        if len(dates) != t or any(a >= c for a, c in zip(dates, dates[1:])):
            return _failed(f"{name}: stack/dates {list(dates)} are not {t} ascending days", name)
        if len(values[schemas.STACK_BANDS.key]) != b:
            return _failed(f"{name}: stack/bands names {len(values[schemas.STACK_BANDS.key])} bands, the stack "
                           f"has {b}", name)
        problem = self._target_check.check(values, h, w, self._tf)
        if problem:
            return _failed(f"{name}: {problem}", name)
        dtype = values[schemas.STACK_DTYPE.key].decode("ascii", "replace")
        location = name.partition("#patch=")[0]
        pixels = None
        if self._rasters is not None and location in self._rasters:
            # As the writer computes them: every date's pixels, the location's nodata left out.
            self._rasters.setdefault(name, self._rasters[location])
            pixels = stack.reshape(t * h, w, b)
        return (None, label, hashlib.sha256(values[schemas.STACK.key]).hexdigest(), name,
                ("stack", h, w, b, dtype), pixels)

    def _raw_pixels(self, image: bytes, dtype: str, stored):
        """(shape, values) of a raw record: its bytes as `dtype`, reshaped as the record says."""
        tf = self._tf
        # DecodeRaw has no uint32 (as in readers.decode): the same bytes as int32, reinterpreted.
        as_read = tf.int32 if dtype == "uint32" else getattr(tf, dtype)
        values = tf.io.decode_raw(image, as_read, little_endian=True)
        if dtype == "uint32":
            values = tf.bitcast(values, tf.uint32)
        h, w, c = stored
        if int(values.shape[0]) != h * w * c:
            # Not reshapeable: report the sample count the bytes hold.
            return (int(values.shape[0]),), None
        pixels = tf.reshape(values, (h, w, c))
        return tuple(pixels.shape), pixels.numpy()

    def _check_index(self, shard, offsets):
        if not shard.index_file:
            return []
        path = join(self._dir, shard.index_file)
        if not exists(path):
            return [f"{shard.index_file}: index file is missing"]
        data = read_bytes(path)
        if hashlib.sha256(data).hexdigest() != shard.index_sha256:
            return [f"{shard.index_file}: sha256 differs from the manifest"]
        if data != format_index(offsets):
            return [f"{shard.index_file}: offsets do not match the shard's records"]
        return []



# The kind of several labels per image: its records may have no image-level class.
_LABELS = _target_labels.NAME


class TargetCheck:
    """Checks the target features of one record (issue 24's contract) against the manifest.

    Each kind's check is its row's (`conversion.targets.TargetKind.verify`):

    - mask: a PNG that decodes (`tf.io.decode_png` at targets.mask.dtype, at
      that bit depth) to exactly the image's height x width x 1, with class
      ids below targets.mask.num_classes (or the ignore id, 255 / 65535);
    - boxes: the six lists equally long, corners in [0, 1] with xmin <= xmax
      and ymin <= ymax, labels indexing targets.boxes.class_names, is_crowd
      0 or 1;
    - labels: indices into class_names, sorted and each once;
    - target: as many values as targets.target.length.

    The per-class pixel counts of the manifest are not recomputed: they are
    per split, and verify has no deeper mode to spend that on.

    Args:
      kinds: The target kinds of the schema (`ImageExampleSchema.targets`).
      targets: The manifest's `targets` section.
      num_classes: len(class_names).

    Attributes:
      section_problems: What the section lacks for the schema's kinds (then
        those kinds are not checked record by record).
      allows_no_label: Whether the image-level label may be -1: the dataset
        has no class names, or its class names are those of several labels
        per image.
    """

    def __init__(self, kinds, targets: dict, num_classes: int):
        problems, self._checks = [], []
        # In the schema's order of kinds: a record's first problem is the same on every run.
        for name in [k for k in schemas.TARGET_KINDS if k in kinds]:
            kind = _kind_named(name)  # Its row of `conversion.targets.TARGETS`.
            if kind is None or kind.verify is None:
                continue
            check, problem = kind.verify(targets.get(name) or {}, num_classes)
            if problem is not None:
                problems.append(problem)
            if check is not None:
                self._checks.append(check)
        self.section_problems = tuple(problems)
        self.allows_no_label = num_classes == 0 or _LABELS in kinds

    def check(self, values: dict, height: int, width: int, tf) -> str | None:
        """The first problem of one decoded record's targets (`values`: `schema.decode`), or None."""
        for check in self._checks:
            problem = check(values, height, width, tf)
            if problem:
                return problem
        return None


def _failed(problem: str, name: str | None = None):
    """What `_check_record` returns for a record with a problem."""
    return problem, None, None, name, None, None


def raster_records(normalized_jsonl: str) -> dict[str, float | None]:
    """Record filename to nodata (`imaging.nodata`: per band where listed so) of every raster record in normalized.jsonl.

    Raster records are those read by imaging/raster.py, whose details name
    their source dtype and bands; the converter's band statistics cover
    exactly these, with samples equal to the nodata value left out. A record
    whose internal mask left pixels out maps to its `schemas.BandStats` as
    recorded ('masked_stats'): the stored pixels alone cannot give them.
    """
    rasters = {}
    for line in normalized_jsonl.split("\n"):  # Not splitlines: a path may hold U+0085 or U+2028.
        if not line.strip():
            continue
        entry = json.loads(line)
        details = entry.get("details") or {}
        if "masked_stats" in details:
            # An internal mask left pixels out that the stored values do not show: its statistics.
            rasters[entry["path"]] = schemas.BandStats.from_json(details["masked_stats"])
        elif "source_bands" in details:
            rasters[entry["path"]] = _nodata.from_json(details.get("nodata"))  # Per band: a list.
    return rasters


# Offsets named per scene at most: a scene whose grid is wholly off says so in a few lines.
_MAX_NAMED = 5


def _listed(offsets, limit: int = _MAX_NAMED) -> str:
    """Some (y, x) offsets as 'Y,X; Y,X and K more'."""
    offsets = list(offsets)
    text = "; ".join(f"{y},{x}" for y, x in offsets[:limit])
    return text + (f" and {len(offsets) - limit} more" if len(offsets) > limit else "")


def check_scene(element, options: _patches.PatchOptions) -> list[str]:
    """The problems of one scene's patch records against its grid and its normalized.jsonl entries.

    Args:
      element: (scene path, {"log": [its `scene_log.SceneLog`] or [],
        "patches": [(y, x) of each patch record found]}), as CoGroupByKey
        gives it.
      options: The manifest's patch options (size, stride, edge).

    Checked: every record's offset lies on the scene's grid (`imaging.patches.offsets`
    of its recorded size under the stride and edge policy) in the rows of a work item
    that was cut; no offset is stored twice or is both stored and skipped; the
    records are as many as the entries say were written; written + skipped
    equals the grid's patches in the cut rows; every row of the grid is in a work item.
    """
    scene, groups = element
    logs, found = list(groups["log"]), sorted(groups["patches"])
    if not logs:
        return [f"{scene}: {len(found)} patch records, but {schemas.NORMALIZED_FILENAME} lists no "
                f"{scene_log.CUT_ACTION} entry of this scene (its grid is unknown)"]
    log = logs[0]
    if log.size is None:
        return [f"{scene}: {schemas.NORMALIZED_FILENAME} does not record the scene's size "
                f"(scene_size of its {scene_log.CUT_ACTION} entries): its patch offsets cannot be checked"]
    height, width = log.size
    (ph, pw), (sh, sw), edge = options.size, options.stride, options.edge
    rows = _patches.offsets(height, ph, sh, edge)
    columns = _patches.offsets(width, pw, sw, edge)
    grid = (f"the grid of its {height}x{width} scene (--raster_patch {ph},{pw} --raster_stride {sh},{sw} "
            f"--raster_edge {edge}: rows {_preview(rows)}, columns {_preview(columns)})")
    problems = []
    # The grid's patches of the work items cut, and of every work item (cut or failed): an
    # item is a band of patch rows, or a range of columns of them (`scene_log.covered`).
    cut_set = scene_log.covered(log.rows, rows, columns)
    in_items = cut_set | scene_log.covered(log.failed, rows, columns)
    row_set, column_set = set(rows), set(columns)
    off_grid = [(y, x) for y, x in found if y not in row_set or x not in column_set]
    if off_grid:
        problems.append(f"{scene}: patch offsets {_listed(off_grid)} are not on {grid}")
    outside = [(y, x) for y, x in found if y in row_set and x in column_set and (y, x) not in cut_set]
    if outside:
        problems.append(f"{scene}: patches {_listed(outside)} lie in rows of no work item that was cut "
                        f"({scene_log.CUT_ACTION} entries of {schemas.NORMALIZED_FILENAME})")
    counts: dict = {}
    for offset in found:
        counts[offset] = counts.get(offset, 0) + 1
    twice = [o for o, n in counts.items() if n > 1]
    if twice:
        problems.append(f"{scene}: patches {_listed(twice)} are stored more than once")
    both = sorted(set(counts) & set(log.skipped))
    if both:
        problems.append(f"{scene}: patches {_listed(both)} are stored, and listed as skipped for nodata")
    if len(found) != log.written:
        problems.append(f"{scene}: {len(found)} patch records, {schemas.NORMALIZED_FILENAME} says "
                        f"{log.written} were written")
    expected = len(cut_set)
    good = len({o for o in counts if o in cut_set})
    if good + len(log.skipped) != expected:
        problems.append(f"{scene}: {good} patches written + {len(log.skipped)} skipped for nodata, "
                        f"but {grid} has {expected} in the rows of its work items")
    missing = [y for y in rows if any((y, x) not in in_items for x in columns)]
    if missing:
        problems.append(f"{scene}: patch rows {_preview(missing)} are in no work item of "
                        f"{schemas.NORMALIZED_FILENAME} (neither cut nor failed)")
    return problems


def _preview(values, limit: int = 6) -> str:
    """Some integers of a list: '0, 48, 96, ..., 960 (21)'."""
    values = list(values)
    if len(values) <= limit:
        return ", ".join(map(str, values)) or "none"
    return ", ".join(map(str, values[:limit - 1])) + f", ..., {values[-1]} ({len(values)})"


class _BandCheck:
    """The band statistics of a shard's raster records, recomputed and compared with the manifest's."""

    def __init__(self, shard, rasters: dict[str, float | None] | None):
        self._shard = shard
        self._rasters = rasters
        self._stats = schemas.BandStatsAccumulator()  # As the writer combines them.
        self._mask_problems: list[str] = []

    def add(self, name: str, pixels) -> None:
        if pixels is None:
            return
        known = self._rasters[name]
        if isinstance(known, schemas.BandStats):
            self._stats.add(self._masked(name, np.asarray(pixels), known))
        else:
            self._stats.add(_raster.band_stats(np.asarray(pixels), known))

    def _masked(self, name: str, pixels: np.ndarray, known: schemas.BandStats) -> schemas.BandStats:
        """The recorded statistics of a record with an internal mask, checked as far as its pixels allow.

        Its valid and nodata samples must add up to its pixels, and its
        minimum and maximum lie within theirs; what does not is a problem.
        """
        whole = _raster.band_stats(pixels, None)
        pixels_per_band = pixels.shape[0] * pixels.shape[1]
        for b in range(min(known.num_bands, whole.num_bands)):
            low, high = whole.min[b], whole.max[b]
            inside = known.min[b] is None or (low <= known.min[b] and known.max[b] <= high)
            if known.count[b] + known.nodata[b] != pixels_per_band or not inside:
                self._mask_problems.append(
                    f"{self._shard.file}: {name}: band {b + 1}'s recorded statistics under its internal "
                    f"mask ({known.count[b]} valid + {known.nodata[b]} nodata, {known.min[b]}..{known.max[b]}) "
                    f"do not fit its {pixels_per_band} stored pixels ({low}..{high})")
        if known.num_bands != whole.num_bands:
            self._mask_problems.append(f"{self._shard.file}: {name}: {known.num_bands} bands of recorded "
                                       f"statistics, {whole.num_bands} stored")
        return known

    def problems(self) -> list[str]:
        """Problem lines, naming the shard and the band (1-based, as GDAL numbers them)."""
        want, file = self._shard.band_stats, self._shard.file
        if want is None:
            return []  # None recorded (photos, mixed band counts, or an older version).
        if self._rasters is None:
            return [f"{file}: band statistics cannot be checked: {schemas.NORMALIZED_FILENAME}, "
                    "which names the raster records, is missing"]
        got = self._stats.result()
        if got is None or got.records != want.records or got.num_bands != want.num_bands:
            what = "none" if got is None else f"{got.records} records of {got.num_bands} bands"
            return [f"{file}: band statistics of {what}, the manifest says {want.records} records "
                    f"of {want.num_bands} bands"]
        out = list(self._mask_problems)
        for b in range(want.num_bands):
            scale = max(abs(v) for v in (got.min[b], got.max[b], 0.0) if v is not None)
            for field in ("count", "nodata", "min", "max", "mean", "m2"):
                g, w = getattr(got, field)[b], getattr(want, field)[b]
                if field in ("mean", "m2"):
                    tol = BAND_STATS_RTOL * (scale if field == "mean" else scale * scale * max(got.count[b], 1))
                    same = math.isclose(g, w, rel_tol=BAND_STATS_RTOL, abs_tol=tol)
                else:
                    same = g == w
                if not same:
                    out.append(f"{file}: band {b + 1} {field} {g!r}, the manifest says {w!r}")
        return out


class _HashingReader:
    """A file wrapper that hashes and counts what is read through it."""

    def __init__(self, f, sha):
        self._f = f
        self._sha = sha
        self.size = 0

    def read(self, n: int) -> bytes:
        data = self._f.read(n)
        self._sha.update(data)
        self.size += len(data)
        return data


def duplicate_group(element):
    digest, members = element
    members = sorted(members)
    if len(members) > 1:
        yield {"sha256": digest, "images": [{"split": s, "filename": n} for s, n in members],
               "splits": sorted({s for s, _ in members})}



def check_volume_mask(values: dict, section: dict) -> tuple[str | None, dict[int, int]]:
    """(problem or None, voxels per class id) of a decoded masked volume record's `volume/mask`
    (`VOLUME_MASK_SCHEMA.decode`) against the manifest's `targets.mask` section.

    Its dtype must be the section's `dtype` (a mask of another shape than its volume's, whose byte
    count fits the other dtype, reads so), and its ids must index `class_names` (or be the ignore id,
    the dtype's largest value); unnamed ids may be any value of the dtype.
    """
    ids = values[_volume_schemas.VOLUME_MASK.key]
    # bincount, not unique: one pass over the voxels, no sort (a CT's mask holds ~100 M).
    counts = np.bincount(ids.reshape(-1))
    voxels = {int(i): int(counts[i]) for i in np.flatnonzero(counts)}
    dtype, names = section.get("dtype"), section.get("class_names") or []
    if ids.dtype.name != dtype:
        return (f"its mask is {ids.dtype.name}, the manifest's targets.mask.dtype is {dtype} (or the mask is not "
                f"of its volume's shape {tuple(ids.shape)})"), voxels
    if names:
        ignore = int(np.iinfo(dtype).max)
        bad = [i for i in voxels if i >= len(names) and i != ignore]
        if bad:
            return (f"its mask holds class ids {bad[:5]}, outside the manifest's {len(names)} "
                    f"targets.mask.class_names ({ignore}: ignore)"), voxels
    return None, voxels


def mask_voxel_problems(split: str, voxels, section: dict, holders) -> list[str]:
    """A split's voxels per class id (`voxels`: id -> count, from its masks) against the manifest's
    `targets.mask.pixel_counts`: a problem per class that differs, naming `holders[id]` (what holds it)."""
    names = section.get("class_names") or []
    want = {int(k): int(v) for k, v in ((section.get("pixel_counts") or {}).get(split) or {}).items()}
    out = []
    for i in sorted(set(want) | set(voxels)):
        if want.get(i, 0) != voxels.get(i, 0):
            name = f"{i} {names[i]}" if i < len(names) else str(i)
            held = sorted(set(holders.get(i, ())))
            out.append(f"split {split}: class {name}: {voxels.get(i, 0)} voxels in the masks, the manifest's "
                       f"targets.mask.pixel_counts says {want.get(i, 0)} (held by: {', '.join(held[:5]) or 'none'})")
    return out


def report(manifest, checks, duplicates, scene_problems=()) -> dict:
    """The verify report (report.json's document) of every shard check, duplicate group and
    scene problem (`check_scene`) of a dataset of `manifest` (`schemas.Manifest`)."""
    problems = [p for c in sorted(checks, key=lambda c: c.file) for p in c.problems]
    problems += sorted(scene_problems)  # With --raster_patch (`check_scene`).
    splits = {}
    for name, info in manifest.splits.items():
        mine = [c for c in checks if c.split == name]
        records = sum(c.num_records for c in mine)
        counts = tuple(sum(col) for col in zip(*(c.class_counts for c in mine))) if mine else ()
        if records != info.num_records:
            problems.append(f"split {name}: {records} records, the manifest says {info.num_records}")
        if mine and not counts_agree(counts, info.class_counts, sum(c.unchecked for c in mine)):
            problems.append(f"split {name}: class counts {list(counts)}, the manifest says "
                            f"{list(info.class_counts)}")
        splits[name] = {"shards": len(mine), "records": records}
        if (manifest.targets or {}).get("mask") and _volume_schemas.VOLUME_MASK.key in manifest.features and \
                not any(c.problems for c in mine):  # Damaged or bad records: their voxels are not all counted.
            voxels, holders = collections.Counter(), collections.defaultdict(list)
            for c in mine:
                for class_id, n in c.mask_voxels:
                    voxels[class_id] += n
                    holders[class_id].append(c.file)
            problems += mask_voxel_problems(name, voxels, manifest.targets["mask"], holders)
    versions = _versions_section(manifest, checks, problems)
    duplicates = sorted(duplicates, key=lambda d: d["images"][0]["filename"])
    doc = {
        "ok": not problems,
        "problems": problems,
        "splits": splits,
        "records": sum(s["records"] for s in splits.values()),
        "targets": [] if _volume_schemas.VOLUME.key in manifest.features else list(
            (schemas.TimeSeriesExampleSchema if schemas.example_kind(manifest.features)
             == schemas.TIME_SERIES else schemas.ImageExampleSchema).from_json(manifest.features).targets),
        "duplicates": {
            "groups": len(duplicates),
            "across_splits": sum(1 for d in duplicates if len(d["splits"]) > 1),
            "list": duplicates,
        },
    }
    if versions:
        doc["versions"] = versions
    return doc


def write_report(report_path: str, report: dict) -> None:
    """Writes `report` (from `report`) to `report_path`, atomically."""
    text = json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    directory, name = report_path.rsplit("/", 1) if "/" in report_path else (".", report_path)
    write_atomically(directory, name, text.encode())


def _versions_section(manifest, checks, problems: list) -> list[dict]:
    """With versions (`convert --append`): each version's shards, and its records and class counts as read.

    A version's counts that differ from what the manifest says it added are
    appended to `problems`, naming the version. [] for a dataset that never grew.
    """
    if not manifest.versions:
        return []
    by_file = {(c.split, c.file): c for c in checks}
    out = []
    for v in manifest.versions:
        records = 0
        for split, files in sorted(v.shards.items()):
            mine = [by_file[(split, f)] for f in files if (split, f) in by_file]
            got = sum(c.num_records for c in mine)
            records += got
            if got != v.num_records.get(split, 0):
                problems.append(f"version {v.version}, split {split}: {got} records, the manifest says "
                                f"{v.num_records.get(split, 0)}")
            counts = tuple(sum(col) for col in zip(*(c.class_counts for c in mine))) if mine else ()
            if mine and not counts_agree(counts[:v.num_classes], v.class_counts.get(split, ()),
                                         sum(c.unchecked for c in mine)):
                problems.append(f"version {v.version}, split {split}: class counts {list(counts[:v.num_classes])}, "
                                f"the manifest says {list(v.class_counts.get(split, ()))}")
        out.append({"version": v.version, "time": v.time, "records": records,
                    "shards": {split: list(files) for split, files in sorted(v.shards.items())}})
    return out
