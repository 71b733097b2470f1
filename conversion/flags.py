"""The conversion's flags, declared without Beam: what `ConvertOptions` and a plain parser both take.

Every flag is declared once, here, group by group; its default is read from
its group (`conversion.options`, `imaging`), where it is defined once.
`beam_jobs._options.ConvertOptions` (Beam's `PipelineOptions`) declares them
through `add_flags`, and so does the Beam-free parser of a local run that reads
its arguments before it imports Beam (`beam_jobs._startup.early_config`).
"""

from __future__ import annotations

from conversion.config import ANNOTATION_FRAMES, BOX_SHAPES, ConversionConfig
from conversion.options import ShardingOptions, WritingOptions
from imaging import DicomOptions, RasterOptions, ResizeOptions, ValidationOptions

__all__ = ["add_flags"]

_VALIDATION = ValidationOptions()
_DICOM = DicomOptions()
_RASTER = RasterOptions()
_SHARDING = ShardingOptions()
_RESIZE = ResizeOptions()
_WRITING = WritingOptions()


def add_flags(parser) -> None:
    """Declares the conversion's flags on an argparse parser, group by group (`_FLAG_GROUPS`)."""
    for add in _FLAG_GROUPS:
        add(parser)


def _add_input_flags(parser) -> None:
    """The input, the output, and where labels and targets come from."""
    parser.add_argument("--input_dir", help="Folder of images (local or a FileSystems URL).")
    parser.add_argument("--output_dir", help="Folder to write the dataset into.")
    parser.add_argument(
        "--labels_csv",
        help="CSV with columns path,label[,split]; paths relative to --input_dir. Several "
        "labels per image as cat|dog; numeric targets in a target column (0.5|1.25, path,target "
        "needs no label).",
    )
    parser.add_argument(
        "--annotations",
        help="Boxes: a COCO instances JSON file (images by file_name under --input_dir), a CVAT "
        "for images 1.1 annotations.xml, a folder of Pascal VOC XML files (each matched to the "
        "image of its own stem), a folder of LabelMe JSON files (each naming its imagePath), or "
        "YOLO labels: an Ultralytics data.yaml, or a labels folder of .txt files (names from its "
        "classes.txt or --class_names). Images then need no class folders.",
    )
    parser.add_argument(
        "--annotations_frame", choices=ANNOTATION_FRAMES, default=None,
        help="On which frame of an EXIF-rotated photo its boxes (--annotations) and masks "
        "(--masks_dir) were drawn: raw (as stored, EXIF-blind tools), upright (as a viewer shows "
        "it: tools that turn photos upright), or auto (default: the annotation's or mask's size "
        "decides, the raw frame where it cannot tell: square photos, 180-degree turns; for CVAT "
        "and LabelMe, which show photos upright, the upright one; for YOLO labels, upright).",
    )
    parser.add_argument(
        "--boxes", choices=BOX_SHAPES, default=None,
        help="How the boxes of --annotations are stored: axis (default: axis-aligned, a CVAT "
        "rotated box as its extent) or oriented (each box's 4 corners, obb/corners: DOTA labelTxt "
        "folders, Ultralytics YOLO-OBB labels or data.yaml, CVAT rotated boxes).",
    )
    parser.add_argument(
        "--annotation_masks", action="store_true",
        help="With --annotations: draw each image's regions (COCO polygons and RLE, CVAT and LabelMe "
        "shapes, YOLO-seg polygons; VOC and YOLO boxes as rectangles) into a segmentation mask "
        "stored as masks of --masks_dir are: 0 background, box class index + 1, crowd regions "
        "255 (ignore); a later region over an earlier.",
    )
    parser.add_argument(
        "--class_names",
        help="Comma-separated class names in label order (default: sorted names found); with "
        "CVAT or LabelMe annotations, and YOLO labels that name none (no data.yaml, no "
        "classes.txt), the box classes, id 0 first.",
    )


def _add_split_flags(parser) -> None:
    """Splits and shards."""
    parser.add_argument(
        "--split",
        help="Split by a seeded hash of each path, e.g. train=0.8,validation=0.1,test=0.1. "
        "Default: split folders if present, else everything in train.",
    )
    parser.add_argument(
        "--seed", type=int, default=ConversionConfig.seed,
        help="Seed of every hash (splits, shards, order).",
    )
    parser.add_argument("--num_shards", type=int, help="Shards per split (default: by size).")
    parser.add_argument(
        "--target_shard_mb", type=int, default=_SHARDING.target_shard_mb,
        help="Shard size to aim for, in MiB.",
    )
    parser.add_argument(
        "--min_shards", type=int, default=_SHARDING.min_shards,
        help="Fewest shards per split (when it has that many images), for parallel reads.",
    )


def _add_image_flags(parser) -> None:
    """What every image must be and how it is stored; masks; groups kept in one split."""
    parser.add_argument(
        "--max_pixels", type=int, default=_VALIDATION.max_pixels,
        help="Reject images with more pixels than this (decompression bombs).",
    )
    parser.add_argument(
        "--max_reject_fraction", type=float, default=None,
        help=f"Fail the job when more than this fraction of images is rejected. (default: "
        f"{ConversionConfig.max_reject_fraction:g}; 1 with --volumes, where files outside any volume are no failure)",
    )
    parser.add_argument(
        "--background", default=",".join(map(str, _VALIDATION.background)),
        help="R,G,B colour that transparent images are flattened onto.",
    )
    parser.add_argument(
        "--full_decode", action="store_true",
        help="Validate JPEGs at full resolution instead of libjpeg's 1/8 scale.",
    )
    parser.add_argument(
        "--max_side", type=int, default=None,
        help="Store images whose longer side exceeds N scaled down to N (aspect kept, never "
        "up; Lanczos after EXIF orientation). Default: every valid image as it is.",
    )
    parser.add_argument(
        "--min_side", type=int, default=None,
        help="The alternative to --max_side: scale the shorter side down to N, as the "
        "ImageNet preprocessing scripts do.",
    )
    parser.add_argument(
        "--jpeg_quality", type=int, default=None,
        help=f"Quality of resized JPEGs, 1-100 (default {_RESIZE.jpeg_quality}); needs "
        "--max_side or --min_side.",
    )
    parser.add_argument(
        "--masks_dir",
        help="Folder of segmentation masks mirroring --input_dir: the mask of INPUT/a/b.jpg is "
        "MASKS/a/b.png (or .tif, .tiff, .bmp, .gif), one class id per pixel, stored with each "
        "image as a PNG. Images need no class folders then. With --volumes: NIfTI label volumes, "
        "MASKS/a/b.nii.gz (or .nii) for INPUT/a/b.nii.gz or the series folder INPUT/a/b/; or DICOM "
        "SEG/RTSTRUCT files (any names) paired with the series they reference, MASKS may then be "
        "--input_dir itself (TCIA's layout).",
    )
    parser.add_argument(
        "--mask_suffix",
        help="IMAGE_SUFFIX:MASK_SUFFIX for masks named differently from their images, e.g. "
        "_leftImg8bit:_gtFine_labelIds (Cityscapes); needs --masks_dir.",
    )
    parser.add_argument(
        "--group_by",
        help="Keep groups in one split: dicom:PatientID, dicom:StudyInstanceUID (any DICOM "
        "keyword), or regex:PATTERN over the relative path (its first group, else the match). "
        "With --volumes, a series' group is the value most of its files give (its headers or "
        "paths); with --time_series, regex: only, over the location's path.",
    )


def _add_dicom_flags(parser) -> None:
    """DICOM files."""
    parser.add_argument(
        "--dicom_window",
        help="CENTER,WIDTH applied to every greyscale DICOM image (e.g. 40,400); "
        "default: the file's own window.",
    )
    parser.add_argument(
        "--dicom_bit_depth", type=int, default=_DICOM.bit_depth,
        help="8, or 16 to keep the windowed range in 16-bit PNGs.",
    )
    parser.add_argument(
        "--dicom_frames", default=_DICOM.frames,
        help="Frames of multi-frame DICOM files to keep: first, middle or all (one record each).",
    )
    parser.add_argument(
        "--dicom_tags",
        help="Comma-separated DICOM keywords stored as string features, e.g. Modality,BodyPartExamined.",
    )
    parser.add_argument(
        "--dicom_allow_identifying_tags", action="store_true",
        help="Allow --dicom_tags that identify patients (PatientName, PatientID, ...).",
    )


def _add_raster_flags(parser) -> None:
    """TIFF rasters: pages, bands, values, georeferencing, patches."""
    parser.add_argument(
        "--raster_pages", default=_RASTER.pages,
        help="Pages of multi-page TIFFs to keep: first, or all (one record each, PATH#page=N).",
    )
    parser.add_argument(
        "--raster_bands",
        help="1-based TIFF bands to keep, in this order (as GDAL numbers them), e.g. 4,3,2,8.",
    )
    parser.add_argument(
        "--raster_dtype",
        help="Opt-in, value-changing: scale TIFF rasters linearly to uint8 or uint16 "
        "(from --raster_range, default the source type's full range; rounded, clipped). "
        "Default: every value kept.",
    )
    parser.add_argument(
        "--raster_range",
        help="LOW,HIGH mapped onto 0..max of --raster_dtype (needed for float rasters).",
    )
    parser.add_argument(
        "--raster_georef", action="store_true",
        help="Store each record's GeoTIFF EPSG code and geotransform (GDAL order, float64) "
        "as features epsg and geotransform; 0 and NaNs where unknown (non-GeoTIFFs).",
    )
    parser.add_argument(
        "--raster_patch",
        help="Cut every TIFF into patches of N or H,W pixels, one record each, named "
        "PATH#patch=Y,X (the offset of its top-left corner); read window by window.",
    )
    parser.add_argument(
        "--raster_stride",
        help="Pixels between neighbouring patches, S or H,W (default: the patch size, no "
        "overlap; smaller overlaps); needs --raster_patch.",
    )
    parser.add_argument(
        "--raster_edge", default=None,
        help="The last patch of a row or column: shift (default: moved inward to end at the "
        "edge), pad (past the edge, filled with nodata or 0) or drop (left out).",
    )
    parser.add_argument(
        "--raster_max_nodata", default=None,
        help="Skip patches whose share of nodata pixels (padding included) exceeds this, 0 to 1 "
        "(default 1: keep every patch); skipped patches are listed in normalized.jsonl.",
    )


def _add_kind_flags(parser) -> None:
    """Kinds of example other than one image: volumes, time series."""
    parser.add_argument(
        "--volumes", action="store_true",
        help="DICOM series and NIfTI files as 3-D volume records: input_dir/<class>/<series "
        "folder>/... or input_dir/<class>/<file>.nii[.gz] (docs/preparing/volumes.md).",
    )
    parser.add_argument(
        "--min_slices", type=int, default=2,
        help="With --volumes: a stack needs at least this many slices (default 2).",
    )
    parser.add_argument(
        "--time_series", action="store_true",
        help="Satellite time series: every folder directly holding TIFFs is one location, its "
        "passes grouped by date (from the name, else the TIFF DateTime tag) into one stack "
        "(time, height, width, bands) per record; alignment checked (docs/preparing/time-series.md).",
    )
    parser.add_argument(
        "--bands",
        help="With --time_series: the band names to keep, in this order, e.g. B02,B03,B04,B08 "
        "(band files' suffixes; 4,3,2 for multi-band files); default every band, natural order.",
    )


def _add_writing_flags(parser) -> None:
    """How the shards are written: copies, an existing output, threads, processes, timeouts."""
    parser.add_argument(
        "--dedup", action="store_true",
        help="Keep one copy of identical files (the smallest path; with --volumes, of identical "
        "series); list the others as duplicates. With --append, a copy of a held file is one too.",
    )
    parser.add_argument(
        "--overwrite", action="store_true",
        help="Replace the dataset in a non-empty --output_dir.",
    )
    parser.add_argument(
        "--append", action="store_true",
        help="Add the input files the dataset in --output_dir does not hold yet, as a new "
        "version in new shards (old shards, splits and class indices untouched); on a folder "
        "without a dataset, a first conversion. See docs/preparing/appending.md.",
    )
    parser.add_argument(
        "--resume", action="store_true",
        help="Finish an interrupted conversion into --output_dir, keeping its complete shards.",
    )
    parser.add_argument(
        "--worker_threads", type=int, default=None,
        help="Threads of each shard writer that read and validate images ahead "
        "(default: min(4, cores of the worker) in the runner's threads, none in a worker "
        "process). Speed only: the output is the same.",
    )
    parser.add_argument(
        "--worker_processes", type=int, default=None,
        help="Processes that write shards, one at a time each; 0 writes them in the runner's "
        "own threads (default: one per core on the local runner for a folder of 1,000 files "
        "or more, else 0). Speed only: the output is the same.",
    )
    parser.add_argument(
        "--file_timeout", type=float, default=_WRITING.file_timeout,
        help="Seconds one file may take to read and validate; a file that takes longer is "
        f"rejected as 'timeout' and the rest converted (default: {_WRITING.file_timeout:g}).",
    )
    parser.add_argument(
        "--file_memory", default=None,
        help="Memory a process may hold while it reads one file, e.g. 4GiB or 512MiB; a process "
        "that grows past it is stopped and the file rejected as 'too_large', the rest converted "
        "(default: 4GiB, or the machine's memory over its cores if less, at least 1.5GiB).",
    )


# In the order of `--help`.
_FLAG_GROUPS = (_add_input_flags, _add_split_flags, _add_image_flags, _add_dicom_flags, _add_raster_flags,
                _add_kind_flags, _add_writing_flags)
