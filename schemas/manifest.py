"""The dataset metadata: `manifest.json`, shard names and reject reasons.

The manifest is written last by the converter, so its presence marks a complete
dataset. It holds everything a reader needs (schema, class names, shard files
and their counts) and nothing that changes between two runs of the same input
and seed (no timestamps, no output path), so two such runs compare equal byte
for byte.

A dataset that grew (`convert --append`) also holds `versions`: one entry per
conversion, each naming the shards it added. A manifest without it is one
version that holds every shard, and is written without it, so a dataset that
never grew keeps its bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any

from schemas.features import SCHEMA_VERSION

__all__ = [
    "is_url",
    "not_a_dataset_folder",
    "MANIFEST_FILENAME",
    "REJECTS_FILENAME",
    "NORMALIZED_FILENAME",
    "VERIFY_REPORT_FILENAME",
    "SPLITS",
    "SPLIT_ALIASES",
    "REJECT_REASONS",
    "SKIP_REASONS",
    "TARGETS_SECTION",
    "ManifestError",
    "ImageStats",
    "BandStats",
    "ShardInfo",
    "SplitInfo",
    "VersionInfo",
    "CLASS_ORDERS",
    "Manifest",
    "shard_filename",
    "index_filename",
    "SHARD_FILENAME_RE",
]

MANIFEST_FILENAME = "manifest.json"
REJECTS_FILENAME = "rejects.jsonl"
NORMALIZED_FILENAME = "normalized.jsonl"
# Written by `beam_jobs.verify`; removed by a new conversion into the folder.
VERIFY_REPORT_FILENAME = "verify_report.json"

# Canonical split names, in the order they are reported.
SPLITS = ("train", "validation", "test")

# Names accepted for a split (folder names, --split, labels CSV, the reader's
# `split=`), and the canonical split each one means.
SPLIT_ALIASES = {
    "train": "train",
    "training": "train",
    "validation": "validation",
    "val": "validation",
    "valid": "validation",
    "test": "test",
    "testing": "test",
}

# Why an input file was rejected: it was meant to be converted and could not be.
REJECT_REASONS = {
    "empty_file": "The file has zero bytes.",
    "not_an_image": "The bytes are not in any image format shardsmith reads.",
    "corrupt": "The image could not be decoded (truncated or damaged data).",
    "too_large": "The image has more pixels than --max_pixels allows.",
    "unreadable": "The file could not be read (permissions, I/O error).",
    "broken_symlink": "A symbolic link whose target does not exist.",
    "symlink_loop": "A symbolic link that points back at itself.",
    "missing_file": "A path named in the labels CSV or the annotations does not exist.",
    "unknown_class": "The file's class is not among --class_names.",
    "unsupported_codec": "The image uses a compression whose decoder is not installed.",
    "unsupported_compression": "The TIFF uses a compression no installed decoder reads (LogLuv, old-style JPEG).",
    "no_pixel_data": "A DICOM file without an image (e.g. a report or a plan).",
    "duplicate": "Same content as another input that was kept.",
    "unsupported_dtype": "The image's sample type (complex, bit depth, ...) cannot be stored.",
    "missing_bands": "The image has fewer bands than --raster_bands asks for.",
    "smaller_than_patch": "The scene is smaller than one patch, and --raster_edge drop leaves no patch of it.",
    # shardsmith or a decoder failed on the file; every other file was converted (exit status 3).
    "internal_error": "shardsmith or a library raised an unexpected error on this file (please report it).",
    "decoder_crashed": "The process decoding this file died (a crash in C code, or out of memory).",
    "timeout": "Decoding this file did not finish within --file_timeout seconds.",
    # Targets (--masks_dir, --annotations): the pair is rejected, never stored half.
    "missing_mask": "The image has no mask under --masks_dir.",
    "mask_unreadable": "The mask could not be read or decoded.",
    "mask_lossy": "The mask is stored in a lossy format (JPEG): its class ids are not exact.",
    "mask_not_class_ids": "The mask holds no class ids: colours (RGB with unequal channels), "
                          "floats, negative values or ids above 65535.",
    "mask_size_mismatch": "The mask's size is neither the image's upright size nor its raw frame's.",
    "mask_geometry_mismatch": "A volume's mask does not lie on the volume's voxel grid (another shape, spacing, "
                              "origin or orientation beyond a reordering of its axes), or is not 3-D.",
    "mask_reference_mismatch": "A volume's DICOM SEG or RTSTRUCT annotates another series or frame of reference "
                               "than the volume's (SeriesInstanceUID, FrameOfReferenceUID, SOPInstanceUID).",
    "unsupported_mask": "A volume's DICOM mask that is no SEG or RTSTRUCT, or whose frames or contours cannot "
                        "be placed (no reference and no position).",
    "bad_target": "The image's target (labels, numbers, boxes) cannot be stored as given.",
    # Volumes (--volumes): a DICOM series stack or a NIfTI file that cannot be one volume.
    "missing_slice": "A gap between a stack's slices of more than 1.5 times its usual spacing, or a step more than 10% off it.",
    "conflicting_slices": "Two slices of a stack at the same position with different pixels.",
    "repeated_positions": "Every position of a stack holds several slices (time points, echoes).",
    "mosaic": "A Siemens mosaic: the slices of a volume packed in one image.",
    "too_few_slices": "A stack with fewer slices than --min_slices (a scout or localizer).",
    "mixed_labels": "The files of one series lie under different class folders.",
    "not_a_volume": "A NIfTI file that is not 3-D (a 4-D time series, a 2-D image), or a DICOM image "
                    "without a position and orientation (a secondary capture, an X-ray).",
    # Time series (--time_series): a location's dated passes stacked.
    "no_date": "A pass with no date in its name and no TIFF DateTime tag, or a location with no date left.",
    "misaligned": "A date whose CRS, geotransform, size, dtype, band count or nodata value differs "
                  "from the stack's (those most of the location's dates share): left out of the stack.",
    "missing_band": "A date without a file for one of the stack's bands: left out of the stack.",
    "conflicting_dates": "Two files for the same date and band of one location: that date is left out.",
    "mixed_dtypes": "The band files of one date are of several dtypes: the location gives no stack.",
}
# Why an input file was skipped: it was never meant to be an image of the set.
# The manifest's section describing targets beyond one class (`Manifest.targets`):
# {"mask": {"dtype": "uint8"|"uint16", "pixel_counts": {split: {"<id>": pixels}}, ...
#           (--annotation_masks: "class_names": ["background", box classes...] by mask id, "ignore_id")},
#  "boxes": {"format": "coco"|"cvat"|"voc"|"labelme"|"yolo", "class_names": [...], "category_ids": [...] (COCO),
#            "counts": {split: [boxes per class]}, "issues": {...}},
#  "labels": {"counts": {split: [images per class]}},  (multi-label; names: class_names)
#  "target": {"length": k}}
TARGETS_SECTION = "targets"

SKIP_REASONS = {
    "hidden_file": "Hidden or system file (.DS_Store, ._*, Thumbs.db, ...).",
    "no_label": "The file has no label: outside any class folder, or not in the CSV.",
    "not_in_split": "The file's split has a ratio of zero.",
    "not_a_raster": "With --time_series, a file that is not a TIFF raster (a location is made of rasters).",
    "band_not_selected": "With --time_series, a band file of a band --bands leaves out.",
    "annotation_file": "A file of --annotations inside --input_dir (a YOLO label file or data.yaml, a LabelMe "
                       "JSON, a VOC or CVAT XML, a COCO JSON): part of the labels, not an image.",
    "segmentation_object": "With --volumes, a DICOM SEG or RTSTRUCT among the inputs without --masks_dir over it: "
                           "the mask of the series it references (give --masks_dir), not a volume.",
    "sidecar": "A GIS sidecar of another input (GDAL's .aux.xml, .ovr, .msk; a world file, .prj): "
               "part of that file, not an image.",
}

_SHARD_TEMPLATE = "{split}-{index:05d}-of-{count:05d}.tfrecord"
# The shards an append (version 2, 3, ...) adds: the split's name with the version, so
# that they never take an older shard's name, and TFDS's '{SPLIT}-{SHARD_X_OF_Y}' template
# still describes each version's shards (`schemas.tfds_metadata`).
_VERSION_TEMPLATE = "{split}_v{version:05d}-{index:05d}-of-{count:05d}.tfrecord"
# Shard files and their index files, as written by any run of the converter.
SHARD_FILENAME_RE = re.compile(
    r"^(?P<split>[A-Za-z0-9_]+?)(?:_v(?P<version>\d{5}))?-(?P<index>\d{5})-of-(?P<count>\d{5})"
    r"\.(?P<ext>tfrecord|idx)$"
)
_SHARD_SUFFIX = ".tfrecord"
INDEX_SUFFIX = ".idx"


def shard_filename(split: str, index: int, count: int, version: int = 1) -> str:
    """The file name of shard `index` of `count` in `split`, written by dataset version `version`.

    Version 1 (a conversion) names them `train-00000-of-00004.tfrecord`; a later
    version (`convert --append`) `train_v00002-00000-of-00001.tfrecord`.
    """
    if not 0 <= index < count:
        raise ValueError(f"shard index must be in [0, {count}). Received: {index}")
    if version == 1:
        return _SHARD_TEMPLATE.format(split=split, index=index, count=count)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 < version < 100000:
        raise ValueError(f"version must be an integer in [1, 100000). Received: {version!r}")
    return _VERSION_TEMPLATE.format(split=split, version=version, index=index, count=count)


def is_url(path) -> bool:
    """Whether a dataset's file or folder is on an object store or another filesystem by URL
    (`gs://bucket/...`, `s3://...`, `hdfs://...`) rather than a local path.

    Such a path cannot be listed, locked or renamed with `os`; a read of it is a request.
    """
    return "://" in str(path)


def not_a_dataset_folder(path: str, *, exists: bool | None, is_file: bool) -> str | None:
    """Why `path`, given where a dataset's folder is expected, cannot be one; None if it may be.

    Args:
      path: What the user gave.
      exists: Whether it exists; None where that cannot be told (an object
        store's "folder" is only a prefix).
      is_file: Whether it is a file.

    Returns:
      One sentence ("... is a shard file: give its dataset folder, ...", "...
      does not exist."), or None.
    """
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if SHARD_FILENAME_RE.match(name) or (is_file and name in (MANIFEST_FILENAME, VERIFY_REPORT_FILENAME)):
        folder = path.rstrip("/").rsplit("/", 1)[0] if "/" in path.rstrip("/") else "."
        return f"{path} is a file of a dataset, not its folder: give the folder, {folder}"
    if exists is False:
        return f"{path} does not exist."
    if is_file:
        return f"{path} is a file, not a dataset folder."
    return None


def index_filename(shard_file: str) -> str:
    """The index file of a shard: one line per record, 'offset length'.

    The format of NVIDIA DALI's and the PyPI `tfrecord` package's TFRecord
    readers: the byte offset of each record in the shard and its framed length.
    """
    return shard_file.removesuffix(_SHARD_SUFFIX) + INDEX_SUFFIX


class ManifestError(ValueError):
    """A dataset folder whose metadata is missing, unreadable or incompatible."""


@dataclasses.dataclass(frozen=True)
class ImageStats:
    """What the stored images of a shard or split are: formats, sizes, channels and dtypes.

    A reader uses it to specialise its pipeline (a split of JPEGs that all
    have one size needs no per-batch checks) and to read images as stored
    (`color_mode=None`, `dtype=None`: the channels and sample dtype recorded
    here); `verify` checks it against the records.

    Attributes:
      formats: (format, records) pairs, sorted by format ('jpeg', 'png').
      min_size: (smallest height, smallest width).
      max_size: (largest height, largest width).
      layouts: (format, channels, sample dtype, records) of the images,
        sorted, e.g. ('png', 3, 'uint16', 12): the dtype is that of the
        samples at full depth (`schemas.sample_dtype`). None when unknown (a
        manifest of a version that did not record them).
    """

    formats: tuple[tuple[str, int], ...]
    min_size: tuple[int, int]
    max_size: tuple[int, int]
    layouts: tuple[tuple[str, int, str, int], ...] | None = None

    @classmethod
    def of(cls, images: Sequence[tuple]) -> ImageStats | None:
        """The stats of images; None if there are none.

        Args:
          images: (format, height, width, channels, sample dtype) of each
            image; (format, height, width) leaves `layouts` unknown.
        """
        if not images:
            return None
        formats: dict[str, int] = {}
        layouts: dict[tuple[str, int, str], int] | None = {}
        for image in images:
            formats[image[0]] = formats.get(image[0], 0) + 1
            if len(image) == 5 and layouts is not None:
                key = (image[0], int(image[3]), str(image[4]))
                layouts[key] = layouts.get(key, 0) + 1
            else:
                layouts = None
        heights = [image[1] for image in images]
        widths = [image[2] for image in images]
        return cls(tuple(sorted(formats.items())), (min(heights), min(widths)),
                   (max(heights), max(widths)), _sorted_layouts(layouts))

    def merge(self, other: ImageStats) -> ImageStats:
        formats = dict(self.formats)
        for fmt, n in other.formats:
            formats[fmt] = formats.get(fmt, 0) + n
        layouts = None
        if self.layouts is not None and other.layouts is not None:
            # Unknown for either part is unknown for the whole.
            layouts = {}
            for fmt, channels, dtype, n in self.layouts + other.layouts:
                layouts[(fmt, channels, dtype)] = layouts.get((fmt, channels, dtype), 0) + n
        return ImageStats(
            tuple(sorted(formats.items())),
            (min(self.min_size[0], other.min_size[0]), min(self.min_size[1], other.min_size[1])),
            (max(self.max_size[0], other.max_size[0]), max(self.max_size[1], other.max_size[1])),
            _sorted_layouts(layouts),
        )

    @property
    def one_size(self) -> tuple[int, int] | None:
        """(height, width) if every image has that size, else None."""
        return self.min_size if self.min_size == self.max_size else None

    def to_json(self) -> dict[str, Any]:
        d = {"formats": dict(self.formats), "min_size": list(self.min_size),
             "max_size": list(self.max_size)}
        if self.layouts is not None:
            # 'format:channels:dtype' keys: one short line each in the indented manifest.
            d["layouts"] = {f"{fmt}:{channels}:{dtype}": n for fmt, channels, dtype, n in self.layouts}
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> ImageStats | None:
        if d is None:
            return None
        layouts = None
        if d.get("layouts") is not None:
            layouts = {}
            for key, n in d["layouts"].items():
                fmt, channels, dtype = str(key).split(":")
                layouts[(fmt, int(channels), dtype)] = int(n)
        return cls(
            tuple(sorted((str(k), int(v)) for k, v in d["formats"].items())),
            (int(d["min_size"][0]), int(d["min_size"][1])),
            (int(d["max_size"][0]), int(d["max_size"][1])),
            _sorted_layouts(layouts),
        )


def _sorted_layouts(layouts: Mapping[tuple[str, int, str], int] | None):
    if layouts is None:
        return None
    return tuple((fmt, channels, dtype, n) for (fmt, channels, dtype), n in sorted(layouts.items()))


@dataclasses.dataclass(frozen=True)
class BandStats:
    """Per-band statistics of the raster records of a shard or split, mergeable.

    Computed while converting (no second pass) on the stored values; samples
    equal to the file's nodata value, and NaN, are counted in `nodata` and
    left out of the rest. Shards keep `m2` (sum of squared deviations from
    the mean) so splits merge exactly (Chan et al.'s parallel variance).

    Attributes:
      records: Records these statistics cover.
      count: Valid samples per band.
      min, max: Per band; None for a band with no valid sample.
      mean: Per band (0.0 with no valid sample).
      m2: Per band, sum of squared deviations from `mean`.
      nodata: Per band, samples that were nodata or NaN.
    """

    records: int
    count: tuple[int, ...]
    min: tuple[float | None, ...]
    max: tuple[float | None, ...]
    mean: tuple[float, ...]
    m2: tuple[float, ...]
    nodata: tuple[int, ...]

    @property
    def num_bands(self) -> int:
        return len(self.count)

    @property
    def std(self) -> tuple[float | None, ...]:
        """Population standard deviation per band (None with no valid sample)."""
        return tuple((m2 / n) ** 0.5 if n else None for n, m2 in zip(self.count, self.m2))

    def merge(self, other: BandStats) -> BandStats | None:
        """Both together; None when their band counts differ (nothing to merge band by band)."""
        if other.num_bands != self.num_bands:
            return None
        count, mins, maxs, means, m2s = [], [], [], [], []
        for b in range(self.num_bands):
            na, nb = self.count[b], other.count[b]
            n = na + nb
            delta = other.mean[b] - self.mean[b]
            mean = self.mean[b] + delta * nb / n if n else 0.0
            m2 = self.m2[b] + other.m2[b] + (delta * delta * na * nb / n if n else 0.0)
            count.append(n)
            means.append(mean)
            m2s.append(m2)
            mins.append(_pick(min, self.min[b], other.min[b]))
            maxs.append(_pick(max, self.max[b], other.max[b]))
        nodata = tuple(a + b for a, b in zip(self.nodata, other.nodata))
        return BandStats(self.records + other.records, tuple(count), tuple(mins), tuple(maxs),
                         tuple(means), tuple(m2s), nodata)

    @classmethod
    def combine(cls, parts: Sequence[BandStats]) -> BandStats | None:
        """All of `parts` (at least one) together in one pass; None when their band counts differ.

        What `merge` gives one part after the other, computed from exactly
        rounded sums (`math.fsum`), so no less exact and independent of the
        order: per band the mean is sum(n_i mean_i) / n and m2 is
        sum(m2_i) + sum(n_i (mean_i - mean)^2). A shard's writer and its
        verifier combine each record's statistics with it: ~2 us per
        record where `merge` takes ~50.

        Raises:
          ValueError: If `parts` is empty.
        """
        if not parts:
            raise ValueError("`parts` must hold at least one BandStats. Received: none")
        first = parts[0]
        if len(parts) == 1:
            return first
        if any(p.num_bands != first.num_bands for p in parts):
            return None
        count, mins, maxs, means, m2s = [], [], [], [], []
        for counts, part_means, part_m2s, lows, highs in zip(
                zip(*(p.count for p in parts)), zip(*(p.mean for p in parts)),
                zip(*(p.m2 for p in parts)), zip(*(p.min for p in parts)),
                zip(*(p.max for p in parts))):
            n = sum(counts)
            mean = math.fsum(map(operator.mul, counts, part_means)) / n if n else 0.0
            spread = math.fsum(c * (m - mean) ** 2 for c, m in zip(counts, part_means)) if n else 0.0
            count.append(n)
            means.append(mean)
            m2s.append(math.fsum(part_m2s) + spread)
            mins.append(min((v for v in lows if v is not None), default=None))
            maxs.append(max((v for v in highs if v is not None), default=None))
        nodata = tuple(map(sum, zip(*(p.nodata for p in parts))))
        return BandStats(sum(p.records for p in parts), tuple(count), tuple(mins), tuple(maxs),
                         tuple(means), tuple(m2s), nodata)

    def to_json(self) -> dict[str, Any]:
        """Everything, for a shard (merged later)."""
        return {"records": self.records, "count": list(self.count), "min": list(self.min),
                "max": list(self.max), "mean": list(self.mean), "m2": list(self.m2),
                "nodata": list(self.nodata)}

    def summary_json(self) -> dict[str, Any]:
        """What a split reports: per band min, max, mean, std and nodata count."""
        return {"records": self.records, "count": list(self.count), "min": list(self.min),
                "max": list(self.max), "mean": list(self.mean), "std": list(self.std),
                "nodata_count": list(self.nodata)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> BandStats | None:
        if d is None:
            return None
        opt = lambda v: None if v is None else float(v)  # noqa: E731
        return cls(int(d["records"]), tuple(int(v) for v in d["count"]),
                   tuple(opt(v) for v in d["min"]), tuple(opt(v) for v in d["max"]),
                   tuple(float(v) for v in d["mean"]), tuple(float(v) for v in d["m2"]),
                   tuple(int(v) for v in d["nodata"]))


class BandStatsAccumulator:
    """Per-record `BandStats` combined as they come, in bounded memory; writer and verifier share it.

    Parts are combined (`BandStats.combine`) `_CHUNK` at a time, the running
    total first: the same parts in the same order give the same numbers
    wherever they are accumulated.
    """

    _CHUNK = 512

    def __init__(self):
        self._parts: list[BandStats] = []
        self._mixed = False

    def add(self, part: BandStats) -> None:
        if self._mixed:
            return
        self._parts.append(part)
        if len(self._parts) > self._CHUNK:
            self._fold()

    def _fold(self) -> None:
        combined = BandStats.combine(self._parts)
        self._mixed = combined is None
        self._parts = [] if combined is None else [combined]

    def result(self) -> BandStats | None:
        """Every part together; None with no part or with parts of different band counts."""
        if self._mixed or not self._parts:
            return None
        self._fold()
        return self._parts[0] if self._parts else None


def _pick(fn, a, b):
    return b if a is None else a if b is None else fn(a, b)


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard file of a split."""

    file: str
    num_records: int
    num_bytes: int
    sha256: str
    # Records per class, indexed like the manifest's class_names.
    class_counts: tuple[int, ...]
    # The shard's index file (see `index_filename`) and its checksum.
    index_file: str | None = None
    index_sha256: str | None = None
    # Formats and sizes of its images (None: no records, or written by a
    # version that did not record them).
    images: ImageStats | None = None
    # Per-band statistics of its raster records (absent: none, or an older
    # version; only written when present, so other datasets keep their bytes).
    band_stats: BandStats | None = None
    # With --raster_georef: its records whose EPSG code or geotransform is
    # known (the others hold the unknown values); None (absent) without it.
    georeferenced: int | None = None

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["class_counts"] = list(self.class_counts)
        d["images"] = self.images.to_json() if self.images else None
        d.pop("band_stats")
        if self.band_stats is not None:
            d["band_stats"] = self.band_stats.to_json()
        if d.pop("georeferenced") is not None:
            d["georeferenced"] = self.georeferenced
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ShardInfo:
        return cls(
            file=str(d["file"]),
            num_records=int(d["num_records"]),
            num_bytes=int(d["num_bytes"]),
            sha256=str(d["sha256"]),
            class_counts=tuple(int(c) for c in d["class_counts"]),
            index_file=d.get("index_file"),
            index_sha256=d.get("index_sha256"),
            images=ImageStats.from_json(d.get("images")),
            band_stats=BandStats.from_json(d.get("band_stats")),
            georeferenced=d.get("georeferenced"),
        )


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """The shards of one split, in index order."""

    name: str
    shards: tuple[ShardInfo, ...]

    @property
    def num_records(self) -> int:
        return sum(s.num_records for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.shards)

    @property
    def class_counts(self) -> tuple[int, ...]:
        if not self.shards:
            return ()
        return tuple(sum(col) for col in zip(*(s.class_counts for s in self.shards)))

    @property
    def images(self) -> ImageStats | None:
        """The stats of all its images; None if a shard with records has none."""
        stats = None
        for shard in self.shards:
            if shard.num_records == 0:
                continue
            if shard.images is None:
                return None
            stats = shard.images if stats is None else stats.merge(shard.images)
        return stats

    @property
    def band_stats(self) -> BandStats | None:
        """Per-band statistics of the split; None unless every record is a raster with as many bands."""
        stats = None
        for shard in self.shards:
            if shard.band_stats is None:
                continue
            stats = shard.band_stats if stats is None else stats.merge(shard.band_stats)
            if stats is None:
                return None
        if stats is None or stats.records != self.num_records:
            return None
        return stats

    def to_json(self, class_names: Sequence[str]) -> dict[str, Any]:
        counts = self.class_counts or (0,) * len(class_names)
        d = {
            "num_records": self.num_records,
            "num_bytes": self.num_bytes,
            "class_counts": dict(zip(class_names, counts)),
            "shards": [s.to_json() for s in self.shards],
        }
        stats = self.band_stats
        if stats is not None:
            d["band_stats"] = stats.summary_json()
        georeferenced = self.georeferenced
        if georeferenced is not None:
            d["georeferenced"] = georeferenced
        return d

    @property
    def georeferenced(self) -> int | None:
        """Records carrying known georeferencing (--raster_georef); None: the split has no georef features."""
        counts = [s.georeferenced for s in self.shards if s.georeferenced is not None]
        return sum(counts) if counts else None


# How class_names is ordered: "sorted" (a conversion sorts the class folders) or
# "first_appearance" (an append added a class at the end, after the sorted ones).
CLASS_ORDERS = ("sorted", "first_appearance")


@dataclasses.dataclass(frozen=True)
class VersionInfo:
    """One conversion of a dataset that grows: what it added.

    Attributes:
      version: 1 for the first conversion, then 2, 3, ... per append.
      shards: Split name to the shard files this version added (old ones are
        held by earlier versions and never rewritten).
      num_records: Split name to the records this version added.
      class_counts: Split name to the records this version added per class,
        indexed like the manifest's class_names (num_classes long).
      num_classes: How many classes the dataset had once this version was
        written: class_names[:num_classes] (indices never move, new classes
        come at the end).
      time: When it was written (ISO 8601, UTC); None for the implicit version
        of a manifest written without `versions`.
      options: The conversion options of this version.
      inputs: What an append found in the input folder, counted: "listed",
        "new", "held" (unchanged), "changed" (held, bytes differ: not
        rewritten), "missing_from_input" (held, no longer listed),
        "duplicates_of_held" (--dedup), "retried" (rejected by the version
        before, tried again; not among "new") and "retried_rejected_again";
        {} for a first conversion.
      sections: The manifest's sections that describe the whole dataset
        (`targets`: box classes, mask dtype, counts; `time_series`: its
        locations) as this version left them, in a dataset that grew; {}
        otherwise (the manifest's sections are the latest's).
    """

    version: int
    shards: Mapping[str, tuple[str, ...]]
    num_records: Mapping[str, int]
    class_counts: Mapping[str, tuple[int, ...]]
    num_classes: int
    time: str | None
    options: Mapping[str, Any]
    inputs: Mapping[str, int] = dataclasses.field(default_factory=dict)
    sections: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self, class_names: Sequence[str]) -> dict[str, Any]:
        names = list(class_names)[: self.num_classes]
        inputs = {"inputs": dict(self.inputs)} if self.inputs else {}
        sections = {"sections": json.loads(json.dumps(dict(self.sections)))} if self.sections else {}
        return {
            **inputs,
            **sections,
            "version": self.version,
            "time": self.time,
            "num_classes": self.num_classes,
            "options": dict(self.options),
            "splits": {
                split: {
                    "shards": list(files),
                    "num_records": int(self.num_records.get(split, 0)),
                    "class_counts": dict(
                        zip(names, self.class_counts.get(split, (0,) * len(names)))
                    ),
                }
                for split, files in sorted(self.shards.items())
            },
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], class_names: Sequence[str]) -> VersionInfo:
        """Parses one entry of `versions`; KeyError/TypeError/ValueError if damaged."""
        num_classes = int(d["num_classes"])
        names = list(class_names)[:num_classes]
        splits = d["splits"]
        if not isinstance(splits, Mapping):
            raise TypeError(f"versions[].splits must be an object, got {splits!r}")
        return cls(
            version=int(d["version"]),
            shards={k: tuple(str(f) for f in v["shards"]) for k, v in splits.items()},
            num_records={k: int(v["num_records"]) for k, v in splits.items()},
            class_counts={
                k: tuple(int(v["class_counts"].get(n, 0)) for n in names)
                for k, v in splits.items()
            },
            num_classes=num_classes,
            time=None if d.get("time") is None else str(d["time"]),
            options=dict(d.get("options") or {}),
            inputs={str(k): int(n) for k, n in (d.get("inputs") or {}).items()},
            sections=dict(d.get("sections") or {}),
        )


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything stored about a converted dataset.

    Attributes:
      schema_version: Version of the record format (schemas.SCHEMA_VERSION).
      tool_version: shardsmith version that wrote the data.
      features: The stored schema, `ImageExampleSchema.to_json()`.
      class_names: Class names in label order (label i is class_names[i]).
      splits: Split name to `SplitInfo`.
      counts: 'found', 'written', 'rejected', 'skipped' input files;
        found == written + rejected + skipped.
      rejects: Reason code to number of rejected or skipped inputs.
      normalized: Normalisation applied (e.g. 'exif_transpose') to count.
      options: The conversion options that shape the output (seed, shard policy).
      extra: Further sections owned by other parts (e.g. DICOM provenance).
      versions: One `VersionInfo` per conversion, oldest first; () for a
        dataset that never grew (one implicit version holding every shard,
        see `all_versions`).
      class_order: One of CLASS_ORDERS: "first_appearance" once an append
        added a class at the end of class_names.
    """

    schema_version: int
    tool_version: str
    features: Mapping[str, Any]
    class_names: tuple[str, ...]
    splits: Mapping[str, SplitInfo]
    counts: Mapping[str, int]
    rejects: Mapping[str, int]
    normalized: Mapping[str, int]
    options: Mapping[str, Any]
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    versions: tuple[VersionInfo, ...] = ()
    class_order: str = "sorted"

    def __post_init__(self):
        self._check_versions()

    def _check_versions(self) -> None:
        """Raises ManifestError unless versions and class_order agree with the shards."""
        if self.class_order not in CLASS_ORDERS:
            raise ManifestError(
                f"The manifest's class_order must be one of {list(CLASS_ORDERS)}; "
                f"got {self.class_order!r}."
            )
        if not self.versions:
            return
        numbers = [v.version for v in self.versions]
        if numbers != list(range(1, len(numbers) + 1)):
            raise ManifestError(
                f"The manifest's versions must be numbered 1, 2, ... in order; got {numbers}."
            )
        shards = {(split, s.file): s for split, info in self.splits.items() for s in info.shards}
        owner: dict[tuple[str, str], int] = {}
        previous_classes = 0
        for v in self.versions:
            if not previous_classes <= v.num_classes <= len(self.class_names):
                raise ManifestError(
                    f"The manifest's version {v.version} has num_classes={v.num_classes}; "
                    f"allowed: {previous_classes}..{len(self.class_names)} (classes are "
                    f"only added, at the end of class_names)."
                )
            previous_classes = v.num_classes
            for split, files in v.shards.items():
                records = 0
                counts = [0] * len(self.class_names)
                for f in files:
                    key = (split, f)
                    if key not in shards:
                        raise ManifestError(
                            f"The manifest's version {v.version} names shard {f!r} of split "
                            f"{split!r}, which the manifest's splits do not hold."
                        )
                    if key in owner:
                        raise ManifestError(
                            f"Shard {f!r} of split {split!r} is in versions {owner[key]} and "
                            f"{v.version}; a shard belongs to the one version that wrote it."
                        )
                    owner[key] = v.version
                    records += shards[key].num_records
                    for i, c in enumerate(shards[key].class_counts):
                        if c and i >= v.num_classes:
                            raise ManifestError(
                                f"Shard {f!r} of version {v.version} holds class "
                                f"{self.class_names[i] if i < len(self.class_names) else i!r}, "
                                f"which that version did not have (num_classes={v.num_classes})."
                            )
                        if i < len(counts):
                            counts[i] += c
                if records != v.num_records.get(split, 0):
                    raise ManifestError(
                        f"The manifest's version {v.version} says split {split!r} gained "
                        f"{v.num_records.get(split, 0)} records, but its shards hold {records}."
                    )
                expected = tuple(counts[: v.num_classes])
                got = tuple(v.class_counts.get(split, ()))
                if got != expected:
                    raise ManifestError(
                        f"The manifest's version {v.version} gives class counts {list(got)} for "
                        f"split {split!r}, but its shards hold {list(expected)}."
                    )
        orphans = sorted(set(shards) - set(owner))
        if orphans:
            raise ManifestError(
                f"The manifest's shards {[f'{s}/{f}' for s, f in orphans]} belong to no version."
            )
        if self.versions[-1].num_classes != len(self.class_names):
            raise ManifestError(
                f"The manifest's latest version has num_classes={self.versions[-1].num_classes}"
                f", but class_names holds {len(self.class_names)}."
            )

    @property
    def all_versions(self) -> tuple[VersionInfo, ...]:
        """The versions; a manifest written without them is one version holding every shard."""
        if self.versions:
            return self.versions
        width = len(self.class_names)
        return (
            VersionInfo(
                version=1,
                shards={n: tuple(s.file for s in i.shards) for n, i in self.splits.items()},
                num_records={n: i.num_records for n, i in self.splits.items()},
                class_counts={
                    n: tuple(i.class_counts or (0,) * width)[:width]
                    for n, i in self.splits.items()
                },
                num_classes=width,
                time=None,
                options=dict(self.options),
            ),
        )

    @property
    def latest_version(self) -> int:
        """The number of the newest version (1 for a dataset that never grew)."""
        return self.all_versions[-1].version

    def version_of(self, split: str, shard_file: str) -> int:
        """The version that wrote a shard; raises ManifestError if no version holds it."""
        for v in self.all_versions:
            if shard_file in v.shards.get(split, ()):
                return v.version
        raise ManifestError(f"No version of the dataset holds shard {shard_file!r} of {split!r}.")

    def at_version(self, version: int | None) -> Manifest:
        """The dataset as version `version` held it (None: the latest, this manifest).

        Its splits keep only the shards versions 1..version wrote, its
        class_names the classes it had then; counts and rejects stay the
        latest's (they describe the last run).

        Raises:
          ManifestError: If `version` is not one of the dataset's versions.
        """
        latest = self.latest_version
        if version is None or (isinstance(version, int) and version == latest):
            return self
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= latest:
            raise ManifestError(
                f"`version` must be None (the latest) or an integer in 1..{latest} "
                f"(the dataset's versions); received version={version!r}."
            )
        kept = self.versions[:version]
        width = kept[-1].num_classes
        held = {(split, f) for v in kept for split, files in v.shards.items() for f in files}
        splits = {
            name: SplitInfo(
                name=name,
                shards=tuple(
                    dataclasses.replace(s, class_counts=tuple(s.class_counts[:width]))
                    for s in info.shards
                    if (name, s.file) in held
                ),
            )
            for name, info in self.splits.items()
        }
        order = "first_appearance" if self.class_order == "first_appearance" and any(
            v.num_classes > self.versions[0].num_classes for v in kept
        ) else "sorted"
        extra = dict(self.extra)
        # The targets and locations as version `version` left them (its box classes, its counts).
        extra.update(kept[-1].sections)
        return dataclasses.replace(
            self,
            class_names=self.class_names[:width],
            extra=extra,
            splits=splits,
            options=dict(kept[-1].options) or dict(self.options),
            versions=kept,
            class_order=order,
        )

    def to_json(self) -> str:
        """Serializes with sorted keys, so equal manifests are equal bytes."""
        doc = {
            "format": "shardsmith",
            "schema_version": self.schema_version,
            "tool_version": self.tool_version,
            "features": dict(self.features),
            "class_names": list(self.class_names),
            "splits": {
                name: info.to_json(self.class_names) for name, info in self.splits.items()
            },
            "counts": dict(self.counts),
            "rejects": dict(self.rejects),
            "normalized": dict(self.normalized),
            "options": dict(self.options),
        }
        doc.update(self.extra)
        if self.versions:
            doc["versions"] = [v.to_json(self.class_names) for v in self.versions]
        if self.class_order != "sorted":
            doc["class_order"] = self.class_order
        return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = MANIFEST_FILENAME) -> Manifest:
        """Parses and checks a manifest.

        Args:
          text: The file content.
          source: Where it came from, for error messages.

        Raises:
          ManifestError: If it is not a shardsmith manifest or has a schema
            version this code does not read.
        """
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ManifestError(f"{source} is not valid JSON ({e}).") from e
        if not isinstance(doc, dict) or doc.get("format") != "shardsmith":
            raise ManifestError(f"{source} is not a shardsmith manifest.")
        version = doc.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ManifestError(
                f"{source} has schema_version={version!r}, but this shardsmith reads "
                f"schema_version={SCHEMA_VERSION}. Convert the images again with this "
                f"version, or install the shardsmith version that wrote them "
                f"({doc.get('tool_version', 'unknown')})."
            )
        try:
            splits = {
                name: SplitInfo(
                    name=name,
                    shards=tuple(ShardInfo.from_json(s) for s in info["shards"]),
                )
                for name, info in doc["splits"].items()
            }
            known = {
                "format", "schema_version", "tool_version", "features", "class_names",
                "splits", "counts", "rejects", "normalized", "options",
                "versions", "class_order",
            }
            class_names = tuple(doc["class_names"])
            raw_versions = doc.get("versions", [])
            if not isinstance(raw_versions, list):
                raise TypeError(f"versions must be a list, got {type(raw_versions).__name__}")
            versions = tuple(VersionInfo.from_json(v, class_names) for v in raw_versions)
            return cls(
                schema_version=version,
                tool_version=str(doc["tool_version"]),
                features=doc["features"],
                class_names=class_names,
                splits=splits,
                counts=doc["counts"],
                rejects=doc["rejects"],
                normalized=doc["normalized"],
                options=doc["options"],
                extra={k: v for k, v in doc.items() if k not in known},
                versions=versions,
                class_order=str(doc.get("class_order", "sorted")),
            )
        except ManifestError as e:
            raise ManifestError(f"{source}: {e}") from e
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{source} is incomplete or damaged ({e!r}).") from e

    @property
    def targets(self) -> Mapping[str, Any]:
        """The `targets` section (see TARGETS_SECTION): {} for a dataset of one label per image."""
        return self.extra.get(TARGETS_SECTION, {})

    def split(self, name: str) -> SplitInfo:
        """The named split; raises ManifestError listing the splits there are."""
        if name not in self.splits:
            raise ManifestError(
                f"The dataset has no split {name!r}; it has {sorted(self.splits)}."
            )
        return self.splits[name]
