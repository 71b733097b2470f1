"""The conversion's config: the validated groups of options every part of it is handed.

`ConversionConfig.from_flags` builds it, once, from the flags' values
(`beam_jobs.config_from_options` passes Beam's parsed `ConvertOptions`), into
frozen groups that check themselves (`imaging.ValidationOptions`,
`conversion.options`' `ShardingOptions` and `WritingOptions`,
`conversion.masks.MaskOptions`); each part of the pipeline is handed the
group it uses, whole. Every default is defined once, in its group; the flags
read it from there. Beam-free: `conversion.planning.build_plan` takes it typed.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import TYPE_CHECKING

import schemas
from conversion import listing
from conversion.masks import MaskOptions
from conversion.options import ShardingOptions, WritingOptions, parse_memory, parse_split
from imaging import dicom as _dicom
from imaging.dicom import DicomOptions
from imaging.raster import RasterOptions
from imaging.resize import ResizeOptions
from imaging.validator import ValidationOptions

if TYPE_CHECKING:
    # Imported where their flag is given: a conversion of photos does not load
    # `imaging.time_series` and `imaging.volumes` (CPU before its first decode).
    from imaging.patches import PatchOptions
    from imaging.time_series import TimeSeriesOptions
    from imaging.volumes import VolumeOptions

__all__ = ["ConversionConfig", "ANNOTATION_FRAMES", "BOX_SHAPES"]

# --annotations_frame: 'auto', the annotation's image size decides (the raw frame where it cannot
# tell: a square photo, or an EXIF orientation that keeps the size); 'raw' or 'upright': every box
# and mask of an EXIF-rotated photo was drawn on that frame.
ANNOTATION_FRAMES = ("auto", "raw", "upright")
# --boxes: 'axis', the boxes kind (axis-aligned: a rotated shape's extent); 'oriented', the
# oriented_boxes kind (each box's 4 corners: DOTA, YOLO-OBB, CVAT's rotated boxes).
BOX_SHAPES = ("axis", "oriented")

_RESIZE = ResizeOptions()
_RASTER = RasterOptions()


def _patch_options(o) -> PatchOptions | None:
    """--raster_patch and its companions as `PatchOptions`; None without --raster_patch.

    Raises:
      ValueError: For a companion flag without --raster_patch, or a bad value.
    """
    if o.raster_patch is None:
        given = [flag for flag, value in (("--raster_stride", o.raster_stride), ("--raster_edge", o.raster_edge),
                                          ("--raster_max_nodata", o.raster_max_nodata)) if value is not None]
        if given:
            raise ValueError(f"{given[0]} shapes the patches of --raster_patch: give --raster_patch N "
                             f"with it. Received: {given[0]} without --raster_patch")
        return None
    from imaging.patches import PatchOptions

    return PatchOptions.parse(o.raster_patch, stride=o.raster_stride, edge=o.raster_edge or "shift",
                              max_nodata=1.0 if o.raster_max_nodata is None else o.raster_max_nodata)


def _time_series_options(o) -> TimeSeriesOptions | None:
    """--time_series and --bands as `TimeSeriesOptions` (max_pixels and patch set by ValidationOptions).

    Raises:
      ValueError: For --bands without --time_series, or an option stacks do not take yet.
    """
    if not o.time_series:
        if o.bands:
            raise ValueError(f"--bands orders the bands of a time series' stacks: give --time_series with it "
                             f"(for one raster's bands: --raster_bands). Received: --bands {o.bands} alone")
        return None
    if o.group_by and not o.group_by.startswith("regex:"):
        # A location's passes are rasters (GeoTIFF): no DICOM header to read a keyword from.
        raise ValueError(f"--time_series groups locations by their paths only: give --group_by regex:PATTERN "
                         f"(e.g. regex:(T[0-9]{{2}}[A-Z]{{3}}) for a Sentinel-2 tile id; every stack and patch of "
                         f"a group in one split). Received: --time_series with --group_by {o.group_by}")
    refused = [("--annotations", bool(o.annotations)), ("--dedup", o.dedup),
               ("--raster_bands", bool(o.raster_bands)), ("--raster_dtype", bool(o.raster_dtype)),
               ("--raster_pages", o.raster_pages != _RASTER.pages),
               ("--max_side", o.max_side is not None), ("--min_side", o.min_side is not None)]
    for flag, given in refused:
        if given:
            raise ValueError(f"--time_series stores every pass as it is and does not combine with {flag} "
                             f"(for bands: --bands B02,B03). Received: --time_series with {flag}")
    from imaging.time_series import TimeSeriesOptions

    return TimeSeriesOptions(bands=TimeSeriesOptions.parse_bands(o.bands) if o.bands else None)


def _volume_options(o) -> VolumeOptions | None:
    """--volumes and --min_slices as `VolumeOptions`.

    Raises:
      ValueError: For an option volumes do not take (yet).
    """
    if not getattr(o, "volumes", False):
        return None
    refused = [("--time_series", o.time_series),
               ("--annotations", bool(o.annotations)),
               ("--raster_patch", bool(o.raster_patch)),
               ("--max_side", o.max_side is not None), ("--min_side", o.min_side is not None)]
    for flag, given in refused:
        if given:
            raise ValueError(f"--volumes stores each series or NIfTI file whole and does not combine with {flag} "
                             f"yet. Received: --volumes with {flag}")
    from imaging.volumes import VolumeOptions

    return VolumeOptions(min_slices=o.min_slices)


def _check_patch_combinations(o) -> None:
    """Refuses the options that --raster_patch does not combine with yet (one sentence each).

    --max_side/--min_side (each patch resized) and --masks_dir (label rasters
    cut into the same patches) combine with it.
    """
    refused = [("--annotations", bool(o.annotations)), ("--dedup", o.dedup)]
    for flag, given in refused:
        if given:
            raise ValueError(f"--raster_patch does not combine with {flag} yet: cut the scenes into "
                             f"patches without it. Received: --raster_patch {o.raster_patch} with {flag}")


@dataclasses.dataclass(frozen=True)
class ConversionConfig:
    """The validated conversion options.

    Attributes mirror the command-line flags of `ConvertOptions`; see there.
    The options of one part of the pipeline come as one group: `validation`
    (`imaging.ValidationOptions`, DICOM rendering included), `sharding`
    (`ShardingOptions`), `writing` (`WritingOptions`) and `masks`
    (`conversion.masks.MaskOptions`).
    """

    input_dir: str
    output_dir: str
    labels_csv: str | None = None
    # --annotations: COCO instances JSON, CVAT XML, a folder of VOC XML or LabelMe JSON files, or YOLO labels (boxes).
    annotations: str | None = None
    # --annotations_frame: on which frame of an EXIF-rotated photo its boxes and masks were drawn.
    annotations_frame: str = "auto"
    # --boxes: 'axis' (the boxes kind) or 'oriented' (the oriented_boxes kind, `conversion.targets.oriented`).
    boxes: str = "axis"
    # --annotation_masks: the regions of --annotations drawn into each image's mask (`conversion.annotation_masks`).
    annotation_masks: bool = False
    class_names: tuple[str, ...] | None = None
    split_ratios: dict[str, float] | None = None
    seed: int = 0
    max_reject_fraction: float = 0.1
    group_by: str | None = None
    overwrite: bool = False
    # --append: add the files the output's dataset does not hold yet, as a new version.
    append: bool = False
    validation: ValidationOptions = dataclasses.field(default_factory=ValidationOptions)
    sharding: ShardingOptions = dataclasses.field(default_factory=ShardingOptions)
    writing: WritingOptions = dataclasses.field(default_factory=WritingOptions)
    masks: MaskOptions = dataclasses.field(default_factory=MaskOptions)

    def __post_init__(self):
        for name in ("input_dir", "output_dir"):
            if not getattr(self, name):
                raise ValueError(f"--{name} is required.")
        if not 0.0 <= self.max_reject_fraction <= 1.0:
            raise ValueError(
                f"--max_reject_fraction must be in [0, 1]. Received: {self.max_reject_fraction}"
            )
        if self.group_by is not None:
            self._check_group_by()
        if self.annotations_frame not in ANNOTATION_FRAMES:
            raise ValueError(f"--annotations_frame must be one of {', '.join(ANNOTATION_FRAMES)}. "
                             f"Received: {self.annotations_frame!r}")
        if self.annotations_frame != "auto" and not (self.annotations or self.masks.masks_dir):
            raise ValueError("--annotations_frame says on which frame boxes or masks were drawn: give "
                             f"--annotations or --masks_dir with it. Received: --annotations_frame "
                             f"{self.annotations_frame} alone")
        if self.boxes not in BOX_SHAPES:
            raise ValueError(f"--boxes must be one of {', '.join(BOX_SHAPES)}. Received: {self.boxes!r}")
        if self.boxes == "oriented" and not self.annotations:
            raise ValueError("--boxes oriented says how the boxes of --annotations are stored: give "
                             "--annotations with it. Received: --boxes oriented alone")
        if self.boxes == "oriented" and self.annotation_masks:
            raise ValueError("--annotation_masks draws the axis boxes' regions; it does not combine with "
                             "--boxes oriented yet. Received: --boxes oriented with --annotation_masks")
        if self.annotation_masks and not self.annotations:
            raise ValueError("--annotation_masks draws the regions of --annotations into masks: give "
                             "--annotations with it. Received: --annotation_masks alone")
        if self.annotation_masks and self.masks.masks_dir:
            raise ValueError("--annotation_masks draws each image's mask from --annotations, and --masks_dir "
                             "reads it from mask files: give one of them. Received: --annotation_masks with "
                             f"--masks_dir {self.masks.masks_dir}")
        if self.overwrite and self.writing.resume:
            raise ValueError(
                "--overwrite starts the dataset afresh and --resume keeps what an interrupted run "
                "wrote; give one of them."
            )
        if self.overwrite and self.append:
            raise ValueError(
                "--overwrite replaces the dataset and --append adds to it; give one of them."
            )
        if self.class_names is not None:
            dupes = sorted({c for c in self.class_names if self.class_names.count(c) > 1})
            if not self.class_names or dupes or "" in self.class_names:
                raise ValueError(
                    f"--class_names must be distinct, non-empty names. Received: {self.class_names}"
                )
        if listing.is_local(self.input_dir) and listing.is_local(self.output_dir):
            src = os.path.realpath(self.input_dir)
            dst = os.path.realpath(self.output_dir)
            if dst == src or dst.startswith(src + os.sep):
                raise ValueError(
                    f"--output_dir {self.output_dir!r} is inside --input_dir {self.input_dir!r}; "
                    "a later run would take the shards for input. Choose another folder."
                )

    def _check_group_by(self):
        kind, _, value = self.group_by.partition(":")
        if kind not in ("dicom", "regex") or not value:
            raise ValueError(
                "--group_by must be dicom:KEYWORD (e.g. dicom:PatientID) or regex:PATTERN. "
                f"Received: {self.group_by!r}"
            )
        if kind == "regex":
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"--group_by regex {value!r} does not compile: {e}.") from None
        elif not _dicom.is_keyword(value):
            raise ValueError(f"--group_by names {value!r}, which is not a DICOM keyword.")
        if self.split_ratios is None:
            raise ValueError(
                "--group_by keeps each group in one split chosen by hash, so it needs "
                "--split (e.g. --split train=0.8,validation=0.2)."
            )

    @classmethod
    def from_flags(cls, o) -> ConversionConfig:
        """Builds the config, and each group of it, once from the flags' values.

        Args:
          o: The parsed flags, one attribute per flag of `beam_jobs.ConvertOptions`
            (its `view_as(ConvertOptions)`; `beam_jobs.config_from_options` passes it).

        Raises:
          ValueError: For the first bad flag, naming it.
        """
        try:
            background = tuple(int(c) for c in o.background.split(","))
        except ValueError:
            raise ValueError(f"--background must be R,G,B in 0-255. Received: {o.background!r}") from None
        sharding = ShardingOptions(
            num_shards=o.num_shards, target_shard_mb=o.target_shard_mb, min_shards=o.min_shards,
        )
        writing = WritingOptions(dedup=o.dedup, resume=o.resume, worker_threads=o.worker_threads,
                                 worker_processes=o.worker_processes, file_timeout=o.file_timeout,
                                 file_memory=parse_memory(getattr(o, "file_memory", None)))
        resize = ResizeOptions(
            max_side=o.max_side, min_side=o.min_side,
            jpeg_quality=_RESIZE.jpeg_quality if o.jpeg_quality is None else o.jpeg_quality,
        )
        if o.jpeg_quality is not None and not resize.active:
            # Only resized images are re-encoded at it: alone it would change nothing.
            raise ValueError(
                "--jpeg_quality sets the quality of resized JPEGs: give --max_side or --min_side "
                f"with it. Received: --jpeg_quality {o.jpeg_quality} alone"
            )
        validation = ValidationOptions(
            max_pixels=o.max_pixels,
            background=background,
            full_decode=o.full_decode,
            dicom=DicomOptions(
                window=_dicom.parse_window(o.dicom_window) if o.dicom_window else None,
                bit_depth=o.dicom_bit_depth,
                frames=o.dicom_frames,
                tags=tuple(t.strip() for t in o.dicom_tags.split(",")) if o.dicom_tags else (),
                allow_identifying_tags=o.dicom_allow_identifying_tags,
            ),  # Held to --max_pixels by ValidationOptions.
            resize=resize,
            raster=RasterOptions(
                pages=o.raster_pages,
                bands=RasterOptions.parse_bands(o.raster_bands) if o.raster_bands else None,
                dtype=o.raster_dtype,
                value_range=RasterOptions.parse_range(o.raster_range) if o.raster_range else None,
                georef=o.raster_georef,
                patch=_patch_options(o),
            ),  # Held to --max_pixels too.
            time_series=_time_series_options(o),  # Held to --max_pixels, cut by --raster_patch.
            volumes=_volume_options(o),
        )
        if validation.raster.patch is not None:
            _check_patch_combinations(o)
        return cls(
            input_dir=o.input_dir,
            output_dir=o.output_dir,
            labels_csv=o.labels_csv,
            annotations=o.annotations,
            annotations_frame=getattr(o, "annotations_frame", None) or "auto",
            annotation_masks=bool(getattr(o, "annotation_masks", False)),
            boxes=getattr(o, "boxes", None) or "axis",
            class_names=tuple(c.strip() for c in o.class_names.split(",")) if o.class_names else None,
            split_ratios=parse_split(o.split) if o.split else None,
            seed=o.seed,
            # Volumes: files outside any volume (scouts, strays) are the data's, not a failure's.
            max_reject_fraction=(o.max_reject_fraction if o.max_reject_fraction is not None
                                 else 1.0 if validation.volumes is not None else cls.max_reject_fraction),
            group_by=o.group_by,
            overwrite=o.overwrite,
            append=bool(getattr(o, "append", False)),
            validation=validation,
            sharding=sharding,
            writing=writing,
            masks=MaskOptions(masks_dir=o.masks_dir, mask_suffix=o.mask_suffix),
        )

    def manifest_options(self, split_source: str) -> dict:
        """The options that shape the output; no paths, so runs compare equal."""
        v = self.validation
        options = {
            "seed": self.seed,
            "split": {"source": split_source, "ratios": self.split_ratios},
            "shard_policy": self.sharding.to_json(),
            "max_pixels": v.max_pixels,
            "max_reject_fraction": self.max_reject_fraction,
            "background": list(v.background),
            "validation": "full" if v.full_decode else "jpeg_scaled_1_8",
            "dedup": self.writing.dedup,
            "group_by": self.group_by,
            "dicom": {
                "window": list(v.dicom.window) if v.dicom.window else None,
                "bit_depth": v.dicom.bit_depth,
                "frames": v.dicom.frames,
                "tags": list(v.dicom.tags),
            },
            "labels": "csv" if self.labels_csv else "folders",
            "tool_version": schemas.__version__,
            # Only when asked for: datasets converted without it keep their exact manifest.
            **({"resize": v.resize.to_json()} if v.resize.active else {}),
        }
        if v.time_series is not None:
            options["time_series"] = v.time_series.to_json()
        if v.volumes is not None:
            options["volumes"] = v.volumes.to_json()
        if not v.raster.is_default:
            # Only then, so datasets converted without raster options keep their bytes.
            options["raster"] = v.raster.to_json()
        if self.annotations_frame != "auto":
            options["annotations_frame"] = self.annotations_frame
        if self.boxes != "axis":
            # Only then: datasets of axis boxes keep their exact manifest.
            options["boxes"] = self.boxes
        return options
