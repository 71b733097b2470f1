"""DICOM SEG and RT Structure Sets decoded onto the voxel grid of the series they annotate.

A hospital's segmentation of a CT or MR series comes as a DICOM object beside it: a
Segmentation (SEG: one bit-packed or fractional frame per segment per slice, or a LABELMAP
SEG's one frame of segment numbers per slice) or an RT Structure Set (RTSTRUCT: closed planar
contours in patient millimetres). Both become the label volume of the series' grid, voxel for
voxel, or an `ImageRejected` saying why they cannot:

    grid = dicom_masks.SeriesGrid.from_stack(stack)          # the series, as `plan_stacks` found it
    mask = dicom_masks.read_dicom_mask(data, name, grid)      # SEG or RTSTRUCT, by SOP class

`dicom_mask_kind(head)` tells a SEG or RTSTRUCT from other files, `dicom_mask_bits(head)` the
label width (8 or 16 bits) it needs, both from its header. Any grid-like object will do as `grid` (`SeriesGrid.of`: its shape and affine, and the
slices' SOPInstanceUIDs where it has them); what it lacks (the series' UIDs) is not checked.
    mask.labels          # uint8|uint16 (depth, height, width): the volume's (k, j, i)
    mask.class_names     # ("background", segment labels / ROI names ...) by label value
    mask.notes           # decisions taken (overlaps, contours left out), for normalized.jsonl

Framework-free: numpy and pydicom. docs/preparing/dicom.md ("Segmentations: SEG and RTSTRUCT")
says what each step decides and why.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import struct
import warnings
from typing import NamedTuple

import numpy as np

from imaging import dicom
from imaging.errors import ImageRejected
from imaging.volumes import LPS_TO_RAS, Stack, stack_geometry

__all__ = ["SeriesGrid", "DicomMask", "MaskHeader", "read_mask_header", "labels_from_seg", "labels_from_rtstruct", "read_dicom_mask",
           "dicom_mask_kind", "dicom_mask_bits", "SEG_STORAGE", "LABEL_MAP_SEG_STORAGE", "RTSTRUCT_STORAGE", "REJECT_REASONS"]


SEG_STORAGE = "1.2.840.10008.5.1.4.1.1.66.4"
# Label Map Segmentation Storage (PS3.4, 2024): one frame of segment numbers per plane.
# pydicom 3.0's UID dictionary does not know it yet; highdicom writes it.
LABEL_MAP_SEG_STORAGE = "1.2.840.10008.5.1.4.1.1.66.7"
RTSTRUCT_STORAGE = "1.2.840.10008.5.1.4.1.1.481.3"

# The reasons this module raises (each in schemas.REJECT_REASONS, which a conversion reports
# them by; docs/preparing/output.md explains each).
REJECT_REASONS = {
    "mask_reference_mismatch": "A DICOM SEG or RTSTRUCT that annotates another series or frame of reference "
                               "than the volume's (SeriesInstanceUID, FrameOfReferenceUID, SOPInstanceUID; an "
                               "RTSTRUCT: none of its ROIs or contours).",
    "mask_geometry_mismatch": "The mask's grid is not the volume's: other size, spacing, orientation or "
                              "positions (a SEG frame or an RTSTRUCT contour off the series' slices).",
    "unsupported_mask": "A DICOM object that is no SEG or RTSTRUCT, or one whose frames or contours "
                        "cannot be placed (no reference and no position).",
}

# A frame or contour lies on slice k when its position is within this many voxels of the
# slice's (along the normal) and, for a SEG frame, of the slice's first voxel in-plane. The
# series' slices are one voxel apart, so 0.05 voxel is unmistakably one of them, while DS
# strings (16 characters: ~1e-4 mm at worst) and float32 writers (~1e-5 relative) stay far
# inside it. A resampled grid, or a slice position of another series, differs by more.
_POSITION_TOLERANCE = 0.05
# Direction cosines equal within this (ITK's check of two images' directions): across a
# 512-voxel slice 1e-4 moves the far edge 0.05 voxel, within `_POSITION_TOLERANCE`.
_COSINE_TOLERANCE = 1e-4
# PixelSpacing equal within this fraction: likewise 0.05 voxel across 512 voxels.
_SPACING_TOLERANCE = 1e-4
# A pixel centre within this many pixels of a contour is on it, and inside (the closed rule).
_EDGE_TOLERANCE = 1e-3
# How far past a slice's edges (in slice widths / heights) a contour point may lie: a structure cut
# by the field of view runs past it a little; a point 1e9 mm away is a damaged ContourData, whose
# polygon would fill most of the slice (found by a mutation run, mfuzz12).
_CONTOUR_REACH = 10
_BACKGROUND = "background"
_CLOSED = ("CLOSED_PLANAR", "CLOSEDPLANAR_XOR")


@dataclasses.dataclass(frozen=True, eq=False)
class SeriesGrid:
    """The voxel grid of a DICOM series stack (or of any volume): what a mask must describe.

    Attributes:
      shape: (depth, height, width): slices k, rows j, columns i, as `Volume.voxels`.
      affine: 4x4 float64, (i, j, k, 1) -> RAS mm, as `Volume.affine` (read-only; given
        as a 4x4 or as its 16 values row by row).
      sop_instance_uids: Each slice's SOPInstanceUID in k order; () when unknown (a NIfTI volume).
      frames: Each slice's frame in its file (0 for single-frame files) in k order; () all 0.
      series_uid: SeriesInstanceUID ('' when unknown).
      frame_of_reference_uid: FrameOfReferenceUID ('' when unknown: not checked).

    Raises:
      ValueError: Naming the attribute, what it allows and what it received.
    """

    shape: tuple[int, int, int]
    affine: np.ndarray
    sop_instance_uids: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    frames: tuple[int, ...] = dataclasses.field(default=(), repr=False)
    series_uid: str = ""
    frame_of_reference_uid: str = ""

    def __post_init__(self):
        shape = tuple(self.shape)
        if len(shape) != 3 or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1
                                  for n in shape):
            raise ValueError(f"`shape` must be 3 positive ints (depth, height, width). Received: {self.shape!r}")
        affine = np.array(self.affine, dtype=np.float64)
        if affine.size == 16:
            affine = affine.reshape(4, 4)
        if affine.shape != (4, 4) or not np.isfinite(affine).all() or abs(np.linalg.det(affine[:3, :3])) < 1e-12:
            raise ValueError(f"`affine` must be a finite invertible 4x4 matrix. Received: {self.affine!r}")
        affine.flags.writeable = False
        for attribute in ("sop_instance_uids", "frames"):
            value = tuple(getattr(self, attribute))
            if value and len(value) != shape[0]:
                raise ValueError(f"`{attribute}` must be empty or one per slice ({shape[0]}). "
                                 f"Received: {len(value)}")
            object.__setattr__(self, attribute, value)
        object.__setattr__(self, "shape", tuple(int(n) for n in shape))
        object.__setattr__(self, "affine", affine)

    @classmethod
    def from_stack(cls, stack: Stack) -> SeriesGrid:
        """The grid of a `volumes.plan_stacks` stack: `read_stack`'s volume has this shape and affine."""
        slices = stack.slices
        affine, _ = stack_geometry(slices)
        references = sorted({s.frame_of_reference_uid for s in slices if s.frame_of_reference_uid})
        return cls((len(slices), slices[0].rows, slices[0].columns), affine,
                   tuple(s.sop_instance_uid for s in slices), tuple(s.frame for s in slices), stack.series_uid,
                   references[0] if len(references) == 1 else "")

    @classmethod
    def of(cls, grid) -> SeriesGrid:
        """`grid` itself, or a SeriesGrid of any grid-like object: its `shape` and `affine` (4x4 or
        16 values), and where it has them `sop_instance_uids`, `frames`, `series_uid`,
        `frame_of_reference_uid` (a volume-mask table's grid; what it lacks is not checked)."""
        if isinstance(grid, cls):
            return grid
        return cls(tuple(grid.shape), grid.affine, tuple(getattr(grid, "sop_instance_uids", ()) or ()),
                   tuple(getattr(grid, "frames", ()) or ()), str(getattr(grid, "series_uid", "") or ""),
                   str(getattr(grid, "frame_of_reference_uid", "") or ""))

    @property
    def lps(self) -> np.ndarray:
        """(i, j, k, 1) -> DICOM patient coordinates (LPS mm)."""
        return LPS_TO_RAS @ self.affine

    def to_voxels(self, points_lps: np.ndarray) -> np.ndarray:
        """(n, 3) LPS mm -> (n, 3) fractional (i, j, k)."""
        points = np.asarray(points_lps, dtype=np.float64).reshape(-1, 3)
        inverse = np.linalg.inv(self.lps)
        return points @ inverse[:3, :3].T + inverse[:3, 3]


class DicomMask(NamedTuple):
    """A SEG's or RTSTRUCT's label volume on a `SeriesGrid`.

    Attributes:
      labels: uint8 (uint16 when a label exceeds 255), (depth, height, width) as the grid.
      class_names: By label value: "background", then segment labels / ROI names.
      notes: Decisions taken (overlaps resolved, contours left out), for normalized.jsonl.
    """

    labels: np.ndarray
    class_names: tuple[str, ...]
    notes: tuple[str, ...]


class MaskHeader(NamedTuple):
    """What planning needs of a SEG or RTSTRUCT, from its header (`read_mask_header`).

    Attributes:
      kind: 'seg' or 'rtstruct'.
      series_uids: The SeriesInstanceUIDs it references, sorted (a SEG's
        ReferencedSeriesSequence; an RTSTRUCT's ReferencedFrameOfReferenceSequence >
        RTReferencedStudySequence > RTReferencedSeriesSequence).
      class_names: Its segments' labels (by SegmentNumber) or ROIs' names (in
        StructureSetROISequence order), as `read_dicom_mask` names its labels 1, 2, ...
        (stripped of spaces; an empty one `segment_<n>` / `roi_<n>`).
      instance_uids: The SOPInstanceUIDs of the images it lists as drawn on, sorted (a SEG's
        ReferencedSeriesSequence > ReferencedInstanceSequence; an RTSTRUCT's
        RTReferencedSeriesSequence > ContourImageSequence); () when it lists none.
    """

    kind: str
    series_uids: tuple[str, ...]
    class_names: tuple[str, ...]
    instance_uids: tuple[str, ...] = ()


# The top-level elements `read_mask_header` reads; pydicom steps over the others (their bytes unread).
_HEADER_KEYWORDS = ("SOPClassUID", "SegmentationType", "ReferencedSeriesSequence", "SegmentSequence",
                    "ReferencedFrameOfReferenceSequence", "StructureSetROISequence")


def read_mask_header(f, name: str) -> MaskHeader | None:
    """The references and class names of a SEG or RTSTRUCT from its header; None for any other file.

    Args:
      f: A binary file object at the file's start (seekable): only the elements named
        above are parsed, the contours' and pixels' bytes are stepped over.
      name: The file's name, for messages.

    Raises:
      ImageRejected: 'corrupt' (an unreadable header, a SegmentNumber that is no number).
    """
    import pydicom

    head = f.read(1024)
    if not dicom.is_dicom(head):
        return None
    f.seek(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ds = pydicom.dcmread(f, force=True, stop_before_pixels=True, specific_tags=list(_HEADER_KEYWORDS))
            sop_class = str(ds.get("SOPClassUID", "") or "")
            kind = dicom.SEGMENTATION_SOP_CLASSES.get(sop_class)
            if kind is None:
                return None
            if kind == "seg":
                labelmap = sop_class == LABEL_MAP_SEG_STORAGE or \
                    str(ds.get("SegmentationType", "") or "").upper() == "LABELMAP"
                names = _segment_names(ds, name, labelmap)
                items = list(ds.get("ReferencedSeriesSequence") or ())
                series = {str(item.get("SeriesInstanceUID", "") or "") for item in items}
                return MaskHeader(kind, tuple(sorted(series - {""})), tuple(names[n] for n in sorted(names)),
                                  _instances(items, "ReferencedInstanceSequence"))
            items = [item for reference in ds.get("ReferencedFrameOfReferenceSequence") or ()
                     for study in reference.get("RTReferencedStudySequence") or ()
                     for item in study.get("RTReferencedSeriesSequence") or ()]
            series = {str(item.get("SeriesInstanceUID", "") or "") for item in items}
            names = tuple(_roi_name(roi) for roi in ds.get("StructureSetROISequence") or ())
            return MaskHeader(kind, tuple(sorted(series - {""})), names, _instances(items, "ContourImageSequence"))
        except ImageRejected:
            raise
        except Exception as e:  # noqa: BLE001 - pydicom's many errors of a damaged header: said as 'corrupt'
            raise ImageRejected("corrupt", f"{name}: unreadable DICOM header ({type(e).__name__}: {e})"[:300]) from e


def _instances(series_items, sequence: str) -> tuple[str, ...]:
    """The ReferencedSOPInstanceUIDs of `sequence` in each referenced series' item, sorted."""
    uids = {str(image.get("ReferencedSOPInstanceUID", "") or "")
            for item in series_items for image in item.get(sequence) or ()}
    return tuple(sorted(uids - {""}))


def _roi_name(roi) -> str:
    """An ROI's class name: its ROIName without surrounding spaces, else `roi_<ROINumber>`."""
    return str(roi.get("ROIName", "") or "").strip() or f"roi_{roi.get('ROINumber')}"


def dicom_mask_kind(data: bytes) -> str | None:
    """'seg' or 'rtstruct' for a DICOM SEG (LABELMAP too) or RT Structure Set, else None (header only)."""
    sop_class = dicom.read_group_value(data, "SOPClassUID")
    if sop_class in (SEG_STORAGE, LABEL_MAP_SEG_STORAGE):
        return "seg"
    return "rtstruct" if sop_class == RTSTRUCT_STORAGE else None


# The sequence whose items decide a mask's label width, by SOP class: its items must all be
# in the bytes read (a later top-level element parsed) for the width to be known.
_LABEL_SEQUENCES = {SEG_STORAGE: ("SegmentSequence", 0x00620002), LABEL_MAP_SEG_STORAGE: ("SegmentSequence", 0x00620002),
                    RTSTRUCT_STORAGE: ("StructureSetROISequence", 0x30060020)}


# An RTSTRUCT's contours, and the end of a sequence of undefined length ((FFFE,E0DD), length 0)
# as little-endian transfer syntaxes write it.
_ROI_CONTOURS = 0x30060039
_SEQUENCE_END = b"\xfe\xff\xdd\xe0\x00\x00\x00\x00"


def dicom_mask_bits(head: bytes) -> int | None:
    """Bits per label (8 or 16) a SEG or RTSTRUCT needs, from its first bytes; None when unknown.

    The labels `read_dicom_mask` gives are uint16 when a SegmentNumber exceeds 255 (SEG)
    or there are more than 255 ROIs (RTSTRUCT), else uint8: told from the header, before
    any pixel is read. None for other files, and when `head` ends before the segments' or
    ROIs' sequence does (read more of the file and ask again).
    """
    import pydicom

    if not dicom.is_dicom(head[:1024]):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ds = pydicom.dcmread(io.BytesIO(head), force=True, stop_before_pixels=True)
            sop_class = str(ds.get("SOPClassUID", "") or "")
            keyword, tag = _LABEL_SEQUENCES.get(sop_class, (None, 0))
            # Complete when an element after the sequence was parsed (pydicom may stop quietly
            # inside a sequence that the bytes cut short).
            if keyword is None or keyword not in ds or not any(int(t) > tag for t in ds.keys()):
                return None
            items = list(ds[keyword].value)
            if sop_class == RTSTRUCT_STORAGE:
                top = len(items)
            else:
                top = max((_int(item.get("SegmentNumber")) or 0 for item in items), default=0)
        except Exception:  # noqa: BLE001 - a prefix cut inside an element: the whole file decides
            return None
    return 8 if top <= 255 else 16


def read_dicom_mask(data: bytes, name: str, grid: SeriesGrid) -> DicomMask:
    """A SEG or RTSTRUCT (by its SOPClassUID) as labels on `grid`; see the two functions.

    Raises:
      ImageRejected: 'unsupported_mask' for any other DICOM object, and the reasons of
        `labels_from_seg` and `labels_from_rtstruct`.
    """
    grid = SeriesGrid.of(grid)
    ds = dicom.read_dataset(data, name, require_pixels=False)
    sop_class = str(ds.get("SOPClassUID", "") or "")
    if sop_class == RTSTRUCT_STORAGE:
        if not _contours_complete(ds, data):
            raise ImageRejected("corrupt", f"{name}: cut short inside its ROIContourSequence (the file ends "
                                           "between two items of it, before the sequence's end)")
        return _lazily_parsed(_rtstruct, ds, name, grid)
    return _lazily_parsed(_seg, ds, name, grid)


def _contours_complete(ds, data: bytes) -> bool:
    """Whether an RTSTRUCT's ROIContourSequence ends inside `data`.

    pydicom reads a sequence that a file cut short ends between two items without an error:
    fewer contours, a partial mask (found as a flaky cut of the mutation test: rt-utils' random
    UIDs move the offsets). Of a sequence of defined length, pydicom keeps the bytes it got and
    the length declared (compared here, before the sequence is parsed); one of undefined length
    must end with its delimiter. Complete too when an element after the sequence was read.
    """
    if _ROI_CONTOURS not in ds or any(int(t) > _ROI_CONTOURS for t in ds.keys()):
        return True
    element = ds.get_item(_ROI_CONTOURS)
    length, value = getattr(element, "length", None), getattr(element, "value", None)
    if isinstance(value, (bytes, bytearray)) and length is not None and length != 0xFFFFFFFF:
        return len(value) >= length
    undefined = getattr(element, "is_undefined_length", False) or length == 0xFFFFFFFF
    if not undefined or getattr(ds, "is_little_endian", True) is False:
        return True
    return data.rstrip(b"\0").endswith(_SEQUENCE_END)


def _lazily_parsed(read, ds, name: str, grid: SeriesGrid) -> DicomMask:
    """`read(ds, name, grid)`, pydicom's errors of a damaged file said as 'corrupt'.

    pydicom parses a sequence when it is first used: in a file cut short, or whose lengths are
    damaged, that is where it raises OSError ('No tag to read at file position ...'), which was
    rejected as the volume's own 'unreadable', naming no mask (found by a mutation run, mfuzz12).
    """
    try:
        return read(ds, name, grid)
    except (OSError, EOFError, struct.error) as e:
        raise ImageRejected("corrupt", f"{name}: damaged or cut short: a sequence past its end "
                                       f"({type(e).__name__}: {e})"[:300]) from e


# --- SEG ------------------------------------------------------------------------------------


def labels_from_seg(data: bytes, name: str, grid: SeriesGrid) -> DicomMask:
    """A DICOM Segmentation (BINARY, FRACTIONAL or LABELMAP) as labels on `grid`.

    Label value = SegmentNumber, class_names[SegmentNumber] = SegmentLabel. Frames
    are placed by the slice they derive from (per-frame SourceImageSequence's
    SOPInstanceUID and frame number); without one, by their ImagePositionPatient.
    A FRACTIONAL frame marks the voxels whose value / MaximumFractionalValue >= 0.5.
    Where segments overlap, the highest SegmentNumber wins (noted). A slice
    without a frame is background.

    Raises:
      ImageRejected: 'unsupported_mask' (no SEG, an unknown SegmentationType, a frame
        that cannot be placed), 'mask_reference_mismatch' (other series or frame of
        reference), 'mask_geometry_mismatch' (other size, spacing, orientation, or a
        frame off the series' slices), 'corrupt', 'unsupported_codec'.
    """
    return _lazily_parsed(_seg, dicom.read_dataset(data, name, require_pixels=False), name, SeriesGrid.of(grid))


def _seg(ds, name: str, grid: SeriesGrid) -> DicomMask:
    sop_class = str(ds.get("SOPClassUID", "") or "")
    if sop_class not in (SEG_STORAGE, LABEL_MAP_SEG_STORAGE):
        raise ImageRejected("unsupported_mask", f"{name} is a DICOM {_sop_name(sop_class)}, not a Segmentation "
                                                "(SEG) or RT Structure Set (RTSTRUCT)")
    kind = str(ds.get("SegmentationType", "") or "").upper()
    if sop_class == LABEL_MAP_SEG_STORAGE and not kind:
        kind = "LABELMAP"
    if kind not in ("BINARY", "FRACTIONAL", "LABELMAP"):
        raise ImageRejected("unsupported_mask", f"{name}: SegmentationType {kind or '(none)'} is none of BINARY, "
                                                "FRACTIONAL, LABELMAP")
    if "PixelData" not in ds:
        raise ImageRejected("corrupt", f"{name}: a Segmentation without pixel data")
    _check_frame_of_reference(str(ds.get("FrameOfReferenceUID", "") or ""), grid, name)
    referenced_series = {str(item.get("SeriesInstanceUID", "")) for item in ds.get("ReferencedSeriesSequence") or ()}
    referenced_series.discard("")
    if grid.series_uid and referenced_series and grid.series_uid not in referenced_series:
        raise ImageRejected("mask_reference_mismatch",
                            f"{name} segments series {', '.join(sorted(referenced_series))}, not the volume's "
                            f"series {grid.series_uid}")
    names = _segment_names(ds, name, kind == "LABELMAP")
    frames = dicom.num_frames(ds, name)
    per_frame = ds.get("PerFrameFunctionalGroupsSequence")
    if per_frame is not None and len(per_frame) != frames:
        raise ImageRejected("corrupt", f"{name}: NumberOfFrames {frames}, PerFrameFunctionalGroupsSequence "
                                       f"{len(per_frame)} items")
    depth, height, width = grid.shape
    rows, columns = int(ds.get("Rows") or 0), int(ds.get("Columns") or 0)
    if (rows, columns) != (height, width):
        raise ImageRejected("mask_geometry_mismatch", f"{name}: frames of {columns}x{rows} pixels, the series' "
                                                      f"slices {width}x{height}")
    by_source = _by_source(grid)
    # Slices of the series that the stack left out (an exact duplicate dropped by `plan_stacks`)
    # are no slice of the grid: a frame derived from one is placed by its position, when the
    # SEG names the volume's series (a frame of another series is a mismatch).
    same_series = bool(grid.series_uid) and grid.series_uid in referenced_series
    placed = []  # (segment number, frame index, slice k)
    by_position = 0
    for index in range(frames):
        _check_in_plane(ds, index, grid, name)
        k, moved = _frame_slice(ds, index, grid, by_source, name, same_series)
        by_position += moved
        if kind == "LABELMAP":
            segment = 0
        else:
            segment = _int(dicom.frame_value(ds, index, "SegmentIdentificationSequence", "ReferencedSegmentNumber"))
            if segment not in names:
                raise ImageRejected("corrupt", f"{name}: frame {index + 1} belongs to segment {segment}, which "
                                               f"SegmentSequence does not describe (segments {sorted(names)})")
        placed.append((segment, index, k))
    if kind == "LABELMAP":
        slices = [k for _, _, k in placed]
        twice = sorted({k for k in slices if slices.count(k) > 1})
        if twice:
            raise ImageRejected("corrupt", f"{name}: a LABELMAP Segmentation with several frames on slice(s) "
                                           f"{twice[:5]} of the series: which one holds the labels is unknown")
    top = max(names, default=0)
    labels = np.zeros(grid.shape, np.uint8 if top <= 255 else np.uint16)
    overlap = 0
    highest = _int(ds.get("MaximumFractionalValue")) if kind == "FRACTIONAL" else None
    if kind == "FRACTIONAL" and not highest:
        raise ImageRejected("corrupt", f"{name}: a FRACTIONAL Segmentation without a MaximumFractionalValue")
    # Frames in segment order: where segments overlap, the highest SegmentNumber is written last,
    # whatever order the frames are stored in.
    for segment, index, k in sorted(placed):
        stored = dicom.decode_stored_frame(ds, index, name)
        plane = labels[k]
        if kind == "LABELMAP":
            values = np.unique(stored)
            unknown = sorted(int(v) for v in values if v and int(v) not in names)
            if unknown:
                raise ImageRejected("corrupt", f"{name}: frame {index + 1} holds values {unknown[:5]} that "
                                               f"SegmentSequence does not describe (segments {sorted(names)})")
            on = stored != 0
            plane[on] = stored[on]
            continue
        # BINARY: the bit set; FRACTIONAL: value / highest >= 0.5, in whole numbers (no rounding at 0.5).
        on = stored != 0 if highest is None else 2 * stored.astype(np.int64) >= highest
        overlap += int(np.count_nonzero(on & (plane != 0) & (plane != segment)))
        plane[on] = segment
    notes = []
    if by_position:
        notes.append(f"frames_placed_by_position: {by_position} frame(s) derive from images of the series that "
                     "are not slices of the stack (a duplicate left out)")
    if overlap:
        notes.append(f"mask_overlap: {overlap} voxel(s) in several segments; the highest SegmentNumber kept")
    class_names = tuple(names.get(v, f"segment_{v}") if v else _BACKGROUND for v in range(top + 1))
    return DicomMask(labels, class_names, tuple(notes))


def _by_source(grid: SeriesGrid) -> dict[tuple[str, int], int]:
    """{(SOPInstanceUID, frame index): slice k} of the grid's slices.

    A grid without `frames` whose UIDs repeat (an enhanced multi-frame file's, whose
    frames the stack may have reordered) cannot tell its frames apart: those are left
    out, and their SEG frames are placed by position.
    """
    uids = grid.sop_instance_uids
    if grid.frames:
        return {(uid, frame): k for k, (uid, frame) in enumerate(zip(uids, grid.frames)) if uid}
    counts = collections.Counter(uids)
    return {(uid, 0): k for k, uid in enumerate(uids) if uid and counts[uid] == 1}


def _references(items) -> list[tuple[str, int]]:
    """(SOPInstanceUID, frame index) of image references (a frame number each, else frame 0)."""
    out = []
    for item in items or ():
        uid = str(item.get("ReferencedSOPInstanceUID", "") or "")
        numbers = _as_list(item.get("ReferencedFrameNumber"))
        out += [(uid, _int(n) - 1 if _int(n) else 0) for n in numbers] if numbers else [(uid, 0)]
    return out


def _segment_names(ds, name: str, labelmap: bool) -> dict[int, str]:
    """{SegmentNumber: SegmentLabel} of the segments (a LABELMAP's segment 0, its background, left out)."""
    names = {}
    for item in ds.get("SegmentSequence") or ():
        number = _int(item.get("SegmentNumber"))
        if number == 0 and labelmap and 0 not in names:
            # A LABELMAP SEG may describe its pixel value 0 (highdicom writes "Background"): label 0 here.
            names[0] = _BACKGROUND
            continue
        if number is None or not 1 <= number <= 65535 or number in names:
            raise ImageRejected("corrupt", f"{name}: SegmentNumber {item.get('SegmentNumber')} is not a new "
                                           "number from 1 to 65535")
        names[number] = str(item.get("SegmentLabel", "") or "").strip() or f"segment_{number}"
    names.pop(0, None)
    if not names:
        raise ImageRejected("corrupt", f"{name}: a Segmentation without a SegmentSequence")
    return names


def _check_in_plane(ds, index: int, grid: SeriesGrid, name: str) -> None:
    """The frame's orientation and pixel spacing are the grid's (or absent: the series' own)."""
    orientation = _floats(dicom.frame_value(ds, index, "PlaneOrientationSequence", "ImageOrientationPatient",
                                            multi=True), "ImageOrientationPatient", name)
    lps = grid.lps
    spacing = np.linalg.norm(lps[:3, :2], axis=0)  # (dx, dy)
    if orientation is not None:
        if len(orientation) != 6:
            raise ImageRejected("corrupt", f"{name}: ImageOrientationPatient {orientation} is not 6 numbers")
        theirs = np.asarray(orientation)
        ours = np.concatenate([lps[:3, 0] / spacing[0], lps[:3, 1] / spacing[1]])
        if np.abs(theirs - ours).max() > _COSINE_TOLERANCE:
            raise ImageRejected("mask_geometry_mismatch",
                                f"{name}: frame {index + 1}'s orientation {_text(theirs)} is not the series' "
                                f"{_text(ours)} (tolerance {_COSINE_TOLERANCE} of a direction cosine)")
    pixel_spacing = _floats(dicom.frame_value(ds, index, "PixelMeasuresSequence", "PixelSpacing", multi=True),
                            "PixelSpacing", name)
    if pixel_spacing is not None:
        if len(pixel_spacing) != 2:
            raise ImageRejected("corrupt", f"{name}: PixelSpacing {pixel_spacing} is not 2 numbers")
        theirs, ours = np.asarray(pixel_spacing), spacing[::-1]  # PixelSpacing is (dy, dx).
        if (np.abs(theirs - ours) > _SPACING_TOLERANCE * ours).any():
            raise ImageRejected("mask_geometry_mismatch",
                                f"{name}: frame {index + 1}'s PixelSpacing {_text(theirs)} mm is not the series' "
                                f"{_text(ours)} mm")


def _frame_slice(ds, index: int, grid: SeriesGrid, by_source: dict, name: str,
                 same_series: bool) -> tuple[int, bool]:
    """(slice k, whether placed by position though it names a source) of a SEG frame.

    By the source image it derives from, else by its position; `same_series`: the SEG
    names the grid's series, so a source that is no slice of the stack is one the stack
    left out, and the position decides.
    """
    sources = []
    for derivation in _item(ds, index, "DerivationImageSequence") or ():
        sources += _references(derivation.get("SourceImageSequence"))
    position = _floats(dicom.frame_value(ds, index, "PlanePositionSequence", "ImagePositionPatient", multi=True),
                       "ImagePositionPatient", name)
    if position is not None and len(position) != 3:
        raise ImageRejected("corrupt", f"{name}: frame {index + 1}'s ImagePositionPatient {position} is not 3 numbers")
    k = None
    if sources and by_source:
        found = sorted({by_source[s] for s in sources if s in by_source})
        if not found and position is not None:
            if any(uid in grid.sop_instance_uids for uid, _ in sources):
                # A slice of the grid that `by_source` cannot name (frames of one file, no `frames`).
                return _slice_at(position, grid, index, name, None), False
            if same_series:
                return _slice_at(position, grid, index, name, None), True
        if not found:
            raise ImageRejected("mask_reference_mismatch",
                                f"{name}: frame {index + 1} derives from image {sources[0][0]} (frame "
                                f"{sources[0][1] + 1}), which is not a slice of series {grid.series_uid or '(the volume)'}")
        if len(found) > 1:
            raise ImageRejected("mask_geometry_mismatch", f"{name}: frame {index + 1} derives from several slices "
                                                          f"({[f + 1 for f in found]}) of the series")
        k = found[0]
    if position is None:
        if k is None:
            raise ImageRejected("unsupported_mask", f"{name}: frame {index + 1} has neither a source image of the "
                                                    "series nor an ImagePositionPatient: it cannot be placed")
        return k, False
    return _slice_at(position, grid, index, name, k), False


def _slice_at(position, grid: SeriesGrid, index: int, name: str, k: int | None) -> int:
    """The slice whose first voxel is at `position` (LPS mm): `k` when given (its source), else the nearest."""
    i, j, at = grid.to_voxels(np.asarray(position))[0]
    where = "its source slice" if k is not None else "a slice of the series"
    if k is None:
        k = int(round(at))
    if max(abs(i), abs(j), abs(at - k)) > _POSITION_TOLERANCE or not 0 <= k < grid.shape[0]:
        raise ImageRejected("mask_geometry_mismatch",
                            f"{name}: frame {index + 1} at {_text(position)} mm (voxel {_text((i, j, at))}) is not on "
                            f"{where} (tolerance {_POSITION_TOLERANCE} voxel; the series has {grid.shape[0]} slices)")
    return k


def _item(ds, index: int, sequence: str):
    """A functional group's sequence: the frame's own, else the shared one, else None (PS3.3 C.7.6.16)."""
    per_frame = ds.get("PerFrameFunctionalGroupsSequence") or ()
    shared = ds.get("SharedFunctionalGroupsSequence") or ()
    for group in ([per_frame[index]] if index < len(per_frame) else []) + list(shared[:1]):
        if sequence in group:
            return group.get(sequence)
    return None


# --- RTSTRUCT -------------------------------------------------------------------------------


def labels_from_rtstruct(data: bytes, name: str, grid: SeriesGrid) -> DicomMask:
    """An RT Structure Set's closed planar contours filled on `grid`.

    Label value = the ROI's position in StructureSetROISequence + 1 (ROINumbers may be
    sparse); class_names = "background" + ROINames. Each CLOSED_PLANAR contour goes to
    the slice whose plane it lies on; its points go to (column, row) through the
    grid's inverse affine. A voxel is in an ROI when its centre is inside the ROI's
    contours on that slice (`_fill_slice`: a contour inside another is a hole, one
    inside the hole an island; contours that overlap without one inside the other
    are pieces, united; CLOSEDPLANAR_XOR contours combine by exclusive or) or on one
    of them (within 1e-3 pixel). Where ROIs overlap the later ROI wins (noted).
    POINT and OPEN_* contours are left out (noted), and so are the ROIs of another
    frame of reference and the contours drawn on another series' images (noted:
    a structure set of a registered CT and MR outlines on both).

    Raises:
      ImageRejected: 'unsupported_mask' (no RTSTRUCT), 'mask_reference_mismatch'
        (another series, or no ROI / contour in the series' frame of reference or on
        its images), 'mask_geometry_mismatch' (a contour off the series' slice planes,
        or outside its slices), 'corrupt'.
    """
    return _lazily_parsed(_rtstruct, dicom.read_dataset(data, name, require_pixels=False), name,
                          SeriesGrid.of(grid))


# How many ROI names a note lists before "and N more".
_NAMED_IN_NOTES = 5


def _named(names) -> str:
    names = list(dict.fromkeys(names))
    shown = ", ".join(repr(n) for n in names[:_NAMED_IN_NOTES])
    return shown + (f" and {len(names) - _NAMED_IN_NOTES} more" if len(names) > _NAMED_IN_NOTES else "")


def _rtstruct(ds, name: str, grid: SeriesGrid) -> DicomMask:
    sop_class = str(ds.get("SOPClassUID", "") or "")
    if sop_class != RTSTRUCT_STORAGE:
        raise ImageRejected("unsupported_mask", f"{name} is a DICOM {_sop_name(sop_class)}, not an RT Structure Set")
    frames_of_reference, series = set(), set()
    series_frame, image_series = {}, {}  # SeriesInstanceUID -> its FrameOfReferenceUID; image -> its series.
    for reference in ds.get("ReferencedFrameOfReferenceSequence") or ():
        frame = str(reference.get("FrameOfReferenceUID", "") or "")
        frames_of_reference.add(frame)
        for study in reference.get("RTReferencedStudySequence") or ():
            for item in study.get("RTReferencedSeriesSequence") or ():
                uid = str(item.get("SeriesInstanceUID", "") or "")
                series.add(uid)
                series_frame.setdefault(uid, frame)
                for image in item.get("ContourImageSequence") or ():
                    image_series[str(image.get("ReferencedSOPInstanceUID", "") or "")] = uid
    frames_of_reference.discard("")
    series.discard("")
    image_series.pop("", None)
    if grid.series_uid and series and grid.series_uid not in series:
        raise ImageRejected("mask_reference_mismatch",
                            f"{name} outlines series {', '.join(sorted(series))}, not the volume's series "
                            f"{grid.series_uid}")
    rois = list(ds.get("StructureSetROISequence") or ())
    if not rois or not ds.get("ROIContourSequence"):
        # Both are Type 1 (an item at least). Without them every voxel would be stored as background:
        # a wrong mask, not none. pydicom reads a file cut short before its contours without an
        # error (found by a mutation run, mfuzz12).
        missing = [k for k in ("StructureSetROISequence", "ROIContourSequence") if not ds.get(k)]
        raise ImageRejected("corrupt", f"{name}: an RT Structure Set without {' or '.join(missing)} (required): "
                                       "it outlines no ROI (a file cut short?)")
    # The series' frame of reference: the grid's own, else the one the structure set files its
    # series under (a grid without one: a volume-mask table's).
    ours = grid.frame_of_reference_uid or series_frame.get(grid.series_uid, "")
    # An ROI's own ReferencedFrameOfReferenceUID, else the structure set's one (if it names one).
    default = next(iter(frames_of_reference)) if len(frames_of_reference) == 1 else ""
    label_of, class_names, elsewhere = {}, [_BACKGROUND], {}
    for position, roi in enumerate(rois, start=1):
        number = _int(roi.get("ROINumber"))
        if number is None or number in label_of:
            raise ImageRejected("corrupt", f"{name}: ROINumber {roi.get('ROINumber')} is no new number")
        label_of[number] = position
        class_names.append(_roi_name(roi))
        reference = str(roi.get("ReferencedFrameOfReferenceUID", "") or "") or default
        problem = _frame_of_reference_problem(reference, ours)
        if problem:
            elsewhere[number] = (class_names[-1], reference, problem)
    if len(elsewhere) == len(label_of):
        # Not one ROI in the series' patient space: no mask of this volume at all.
        roi_name, _, problem = next(iter(elsewhere.values()))
        more = f" (and {len(elsewhere) - 1} more ROI(s) likewise)" if len(elsewhere) > 1 else ""
        raise ImageRejected("mask_reference_mismatch", f"{name} ROI {roi_name!r} {problem}{more}")
    labels = np.zeros(grid.shape, np.uint8 if len(rois) <= 255 else np.uint16)
    by_uid, slice_uids = _by_source(grid), set(grid.sop_instance_uids)
    ignored: dict[str, list[str]] = {}
    other_series: dict[str, list[str]] = {}
    overlap = united = placed = 0
    degenerate = []
    contours_of = {}
    for roi_contour in ds.get("ROIContourSequence") or ():
        number = _int(roi_contour.get("ReferencedROINumber"))
        if number not in label_of:
            raise ImageRejected("corrupt", f"{name}: ROIContourSequence names ROI {number}, which "
                                           "StructureSetROISequence does not")
        contours_of.setdefault(number, []).extend(roi_contour.get("ContourSequence") or ())
    # ROIs in StructureSetROISequence order: where they overlap, the later one is written last.
    for number, label in sorted(label_of.items(), key=lambda kv: kv[1]):
        if number in elsewhere:
            continue
        roi_name = class_names[label]
        per_slice: dict[int, list[tuple[np.ndarray, bool]]] = {}
        for contour in contours_of.get(number, ()):
            kind = str(contour.get("ContourGeometricType", "") or "").upper()
            if kind not in _CLOSED:
                ignored.setdefault(kind or "(no type)", []).append(roi_name)
                continue
            drawn_on = _other_series(contour, grid, by_uid, slice_uids, image_series)
            if drawn_on:
                other_series.setdefault(drawn_on, []).append(roi_name)
                continue
            k, points = _place_contour(contour, grid, by_uid, name, roi_name)
            if len(points) < 3:
                degenerate.append(roi_name)
            per_slice.setdefault(k, []).append((points, kind != "CLOSED_PLANAR"))
            placed += 1
        for k in sorted(per_slice):
            window, inside, pieces = _fill_slice(per_slice[k], grid.shape[1], grid.shape[2])
            united += pieces
            plane = labels[k][window]
            overlap += int(np.count_nonzero(inside & (plane != 0) & (plane != label)))
            plane[inside] = label
    if other_series and not placed:
        drawn = ", ".join(sorted(other_series))
        raise ImageRejected("mask_reference_mismatch",
                            f"{name}: every contour is drawn on images of series {drawn}, none on the volume's "
                            f"series {grid.series_uid}")
    notes = []
    if elsewhere:
        frames = sorted({reference or "(none)" for _, reference, _ in elsewhere.values()})
        notes.append(f"rois_other_frame_of_reference: ROI(s) {_named(n for n, _, _ in elsewhere.values())} left out "
                     f"(FrameOfReferenceUID {', '.join(frames)}, the series' {ours}): outlined in another patient "
                     "space (a registered series'); their labels hold no voxel")
    for drawn in sorted(other_series):
        notes.append(f"contours_other_series: {len(other_series[drawn])} contour(s) of ROI(s) "
                     f"{_named(other_series[drawn])} left out: drawn on images of series {drawn}")
    if ignored:
        notes.append("contours_ignored: " + ", ".join(f"{len(rois_)} {kind} (ROI(s) {_named(rois_)})"
                                                        for kind, rois_ in sorted(ignored.items()))
                     + " (markers and open lines: only CLOSED_PLANAR contours enclose voxels)")
    if degenerate:
        notes.append(f"contours_degenerate: {len(degenerate)} closed contour(s) of 1 or 2 points (ROI(s) "
                     f"{_named(degenerate)}) enclose no area: kept as the voxel centres they pass through (how "
                     "OpenCV and rt-utils trace a structure one voxel wide)")
    if united:
        notes.append(f"contours_united: {united} voxel(s) inside two overlapping contours of one ROI, neither inside "
                     "the other: kept, as the union of the pieces drawn (an even-odd fill leaves them out)")
    if overlap:
        notes.append(f"mask_overlap: {overlap} voxel(s) in several ROIs; the later ROI kept")
    return DicomMask(labels, tuple(class_names), tuple(notes))


def _other_series(contour, grid: SeriesGrid, by_uid: dict, slice_uids: set, image_series: dict) -> str:
    """The series a contour is drawn on when that is another series than the grid's, else ''.

    Told by its ContourImageSequence: images none of which is a slice of the grid, that the
    structure set files under another series (RTReferencedSeriesSequence). A contour naming no
    image, or images the structure set does not file, is placed by its position as before.
    """
    if not grid.series_uid or not grid.sop_instance_uids:
        return ""
    references = _references(contour.get("ContourImageSequence"))
    if not references or any(r in by_uid or r[0] in slice_uids for r in references):
        return ""
    drawn = {image_series.get(uid, "") for uid, _ in references}
    return min(drawn) if "" not in drawn and grid.series_uid not in drawn else ""


def _place_contour(contour, grid: SeriesGrid, by_uid: dict, name: str, roi_name: str) -> tuple[int, np.ndarray]:
    """(slice k, (n, 2) points as (column i, row j)) of one closed planar contour."""
    values = _contour_data(contour, name)
    if not len(values) or len(values) % 3:
        raise ImageRejected("corrupt", f"{name}: a contour of ROI {roi_name!r} has {len(values)} "
                                       "ContourData values, not x, y, z triplets")
    with np.errstate(over="ignore", invalid="ignore"):
        points = grid.to_voxels(np.asarray(values).reshape(-1, 3))
    reach = _CONTOUR_REACH * max(grid.shape[1], grid.shape[2])
    with np.errstate(invalid="ignore"):
        off = ~np.isfinite(points).all(axis=1) | (np.abs(points[:, :2]) > reach).any(axis=1)
    if off.any():
        far = np.asarray(values).reshape(-1, 3)[int(np.argmax(off))]
        raise ImageRejected("mask_geometry_mismatch",
                            f"{name}: a contour of ROI {roi_name!r} has a point at ({far[0]:.6g}, {far[1]:.6g}, "
                            f"{far[2]:.6g}) mm, more than {_CONTOUR_REACH} slice widths off the series' "
                            f"{grid.shape[2]}x{grid.shape[1]} slices (a damaged ContourData)")
    depth = points[:, 2]
    k = int(round(float(np.median(depth))))
    references = sorted({by_uid[r] for r in _references(contour.get("ContourImageSequence")) if r in by_uid})
    where = np.asarray(values[2::3])
    if np.abs(depth - k).max() > _POSITION_TOLERANCE or not 0 <= k < grid.shape[0] \
            or (references and references != [k]):
        raise ImageRejected("mask_geometry_mismatch",
                            f"{name}: a contour of ROI {roi_name!r} (z {where.min():.3f} to {where.max():.3f} mm, "
                            f"slice {depth.min():.3f} to {depth.max():.3f} of 0 to {grid.shape[0] - 1}"
                            + (f", drawn on slice {references}" if references else "")
                            + f") does not lie on one slice plane of the series (tolerance {_POSITION_TOLERANCE} "
                              "slice)")
    return k, points[:, :2]


def _contour_data(contour, name: str) -> np.ndarray:
    """ContourData as float64, parsed by numpy from the element's bytes.

    pydicom turns each decimal string into a DSfloat (~2 us a value): 60% of the
    decoding of a structure set of 200-point contours. Parsed once here, as the same
    numbers; an element pydicom has converted already is taken as it is.
    """
    element = contour.get_item("ContourData") if "ContourData" in contour else None
    raw = getattr(element, "value", None)
    try:
        if isinstance(raw, bytes):
            text = raw.strip(b" \x00")
            values = np.array(text.split(b"\\") if text else [], dtype=np.bytes_).astype(np.float64)
        else:
            values = np.asarray(_as_list(raw), dtype=np.float64)
    except (TypeError, ValueError):
        values = np.array([np.nan])
    if not np.isfinite(values).all():
        raise ImageRejected("corrupt", f"{name}: ContourData {raw!r:.80} is not numbers")
    return values


def _fill_slice(contours: list[tuple[np.ndarray, bool]], height: int,
                width: int) -> tuple[tuple[slice, slice], np.ndarray, int]:
    """The pixels inside one ROI's contours on one slice, or on one of them.

    `contours`: (points as (column, row), whether CLOSEDPLANAR_XOR) each. The CLOSED_PLANAR
    contours are a forest (`_nesting`): a contour inside another is a hole of it, one inside
    a hole an island, and contours that overlap with neither inside the other are pieces,
    united. For nested contours this is the even-odd rule; for overlapping pieces even-odd
    (OpenCV's fillPoly: rt-utils; dicompyler-core's XOR of contour masks) would leave their
    overlap out, which nobody drew. CLOSEDPLANAR_XOR contours are combined by exclusive or,
    with each other and with that region (PS3.3 C.8.8.6.3). A contour crossing itself is
    filled even-odd within itself.

    Returns:
      (rows, columns) of the slice that the contours' bounding box covers; the pixels of
      that window (nothing outside it is inside: a small ROI on a 512x512 slice costs its
      box, not the slice); and how many pixels the union kept that even-odd leaves out.
    """
    every = np.concatenate([points for points, _ in contours])
    low = np.clip(np.floor(every.min(axis=0)), 0, (width, height)).astype(int)
    high = np.clip(np.ceil(every.max(axis=0)) + 1, 0, (width, height)).astype(int)
    window = (slice(low[1], high[1]), slice(low[0], high[0]))
    height, width = max(0, high[1] - low[1]), max(0, high[0] - low[0])
    edge = np.zeros((height, width), bool)
    if not (height and width):
        return window, edge, 0
    for points, _ in contours:
        _mark_edges(points - low, edge, height, width)
    xor = [points - low for points, is_xor in contours if is_xor]
    closed = [points - low for points, is_xor in contours if not is_xor]
    inside = _even_odd(xor, height, width) if xor else np.zeros_like(edge)
    united = 0
    if len(closed) == 1:
        inside ^= _even_odd(closed, height, width)
    elif closed:
        children, crossing = _nesting(closed)
        if not crossing:
            # Every two contours nested or apart: the forest's region is the even-odd one.
            inside ^= _even_odd(closed, height, width)
        else:
            interiors = [_even_odd([points], height, width) for points in closed]

            def carved(c: int) -> np.ndarray:  # A contour's interior less its holes (which keep their islands).
                region = interiors[c].copy()
                for child in children[c]:
                    region &= ~carved(child)
                return region

            region = np.zeros_like(edge)
            for root in children[None]:
                region |= carved(root)
            united = int(np.count_nonzero(region & ~np.logical_xor.reduce(interiors) & ~edge))
            inside ^= region
    return window, inside | edge, united


def _even_odd(contours: list[np.ndarray], height: int, width: int) -> np.ndarray:
    """The pixels strictly inside an odd number of `contours` (window coordinates)."""
    parity = np.zeros((height, width + 1), np.int32)
    for points in contours:
        _add_spans(points, parity, height, width)
    # Each contour's spans added +1/-1 at their ends: the running sum counts, per pixel, the
    # contours whose inside it is in.
    return (np.cumsum(parity, axis=1)[:, :width] % 2).astype(bool)


def _nesting(contours: list[np.ndarray]) -> tuple[dict, bool]:
    """Which contour lies inside which, and whether two may overlap with neither inside the other.

    A contour is inside another when every vertex of it is inside or on the other (a hole may
    touch its outer contour); its parent is the smallest such contour. Equal contours (each
    inside the other) are one piece drawn twice, neither the other's hole.

    Returns:
      ({parent index, or None for the outermost: [child indices]}, whether two contours whose
      bounding boxes meet are not nested: they may overlap, and the fill must unite them).
    """
    areas = [abs(_area(points)) for points in contours]
    lows = [points.min(axis=0) - _EDGE_TOLERANCE for points in contours]
    highs = [points.max(axis=0) + _EDGE_TOLERANCE for points in contours]
    children: dict = {a: [] for a in range(len(contours))}
    children[None] = []
    nested = set()
    crossing = False
    for a, points in enumerate(contours):
        parents = []
        for b, other in enumerate(contours):
            if a == b or (lows[a] > highs[b]).any() or (lows[b] > highs[a]).any():
                continue  # Apart: their boxes do not meet.
            # Only a larger contour (by area, then index: one parent each, no cycles) holds another,
            # and its box holds the other's.
            if (areas[b], b) > (areas[a], a) and (lows[a] >= lows[b]).all() and (highs[a] <= highs[b]).all() \
                    and _all_inside(points, other) \
                    and not (areas[b] - areas[a] <= 1e-9 * areas[b] and _all_inside(other, points)):
                parents.append((areas[b], b))
                nested.add((a, b))
        children[min(parents)[1] if parents else None].append(a)
    for a in range(len(contours)):
        for b in range(a + 1, len(contours)):
            boxes_meet = not ((lows[a] > highs[b]).any() or (lows[b] > highs[a]).any())
            if boxes_meet and (a, b) not in nested and (b, a) not in nested:
                crossing = True
    return children, crossing


def _area(points: np.ndarray) -> float:
    x, y = points[:, 0], points[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y))


# Points times edges compared at once by `_all_inside` (bounds its temporary arrays).
_BLOCK = 1 << 20


def _all_inside(points: np.ndarray, polygon: np.ndarray) -> bool:
    """Whether every point is inside `polygon` (crossing number) or within `_EDGE_TOLERANCE` of it."""
    x0, y0, x1, y1 = _edges(polygon)
    dx, dy = x1 - x0, y1 - y0
    slope = dx / np.where(dy == 0, 1, dy)
    step = max(1, _BLOCK // max(1, len(polygon)))
    for start in range(0, len(points), step):
        px, py = points[start:start + step, :1], points[start:start + step, 1:]
        crosses = ((y0 <= py) != (y1 <= py)) & (px < x0 + (py - y0) * slope)
        out = np.count_nonzero(crosses, axis=1) % 2 == 0
        if out.any():
            # Outside by the crossing number: inside still when on an edge (within the tolerance).
            px, py = px[out], py[out]
            t = np.clip(((px - x0) * dx + (py - y0) * dy) / np.maximum(dx * dx + dy * dy, 1e-300), 0, 1)
            if (np.hypot(px - x0 - t * dx, py - y0 - t * dy).min(axis=1) > _EDGE_TOLERANCE).any():
                return False
    return True


def _edges(points: np.ndarray):
    x0, y0 = points[:, 0], points[:, 1]
    return x0, y0, np.roll(x0, -1), np.roll(y0, -1)


def _crossings(x0, y0, x1, y1, first, stop):
    """(rows, xs): every whole row r in [first, stop) of each edge, and the edge's x on it; None for none."""
    count = np.maximum(stop - first, 0)
    if not count.sum():
        return None
    edge = np.repeat(np.arange(len(x0)), count)
    rows = first[edge] + np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    return rows, x0[edge] + (rows - y0[edge]) * (x1[edge] - x0[edge]) / (y1[edge] - y0[edge])


def _add_spans(points: np.ndarray, parity: np.ndarray, height: int, width: int) -> None:
    """+1 at each strictly-inside span's first column, -1 past its last (scanline, even-odd)."""
    x0, y0, x1, y1 = _edges(points)
    low, high = np.minimum(y0, y1), np.maximum(y0, y1)
    # Row r crosses an edge when low <= r < high (half-open: a vertex on the row counts once).
    first = np.clip(np.ceil(low), 0, height).astype(np.int64)
    stop = np.clip(np.ceil(high), 0, height).astype(np.int64)
    crossed = _crossings(x0, y0, x1, y1, first, stop)
    if crossed is None:
        return
    rows, xs = crossed
    order = np.lexsort((xs, rows))
    rows, xs = rows[order], xs[order]
    # Every row has an even number of crossings (the contour is closed; rows are whole), so
    # consecutive pairs are the row's inside spans: columns a < i < b.
    row, a, b = rows[0::2], xs[0::2], xs[1::2]
    start = np.clip(np.floor(a) + 1, 0, width).astype(np.int64)
    end = np.clip(np.ceil(b), 0, width).astype(np.int64)
    keep = start < end
    np.add.at(parity, (row[keep], start[keep]), 1)
    np.add.at(parity, (row[keep], end[keep]), -1)


def _mark_edges(points: np.ndarray, edge: np.ndarray, height: int, width: int) -> None:
    """The pixel centres on the contour (within `_EDGE_TOLERANCE`)."""
    x0, y0, x1, y1 = _edges(points)
    eps = _EDGE_TOLERANCE
    flat = np.abs(y1 - y0) <= eps
    # Rows along a horizontal edge: every whole column between its ends.
    for xa, xb, y in zip(np.minimum(x0, x1)[flat], np.maximum(x0, x1)[flat], y0[flat]):
        r = round(float(y))
        if abs(y - r) <= eps and 0 <= r < height:
            edge[r, max(0, int(np.ceil(xa - eps))):min(width, int(np.floor(xb + eps)) + 1)] = True
    x0, y0, x1, y1 = x0[~flat], y0[~flat], x1[~flat], y1[~flat]
    first = np.clip(np.ceil(np.minimum(y0, y1) - eps), 0, height).astype(np.int64)
    stop = np.clip(np.floor(np.maximum(y0, y1) + eps) + 1, 0, height).astype(np.int64)
    crossed = _crossings(x0, y0, x1, y1, first, stop)
    if crossed is None:
        return
    rows, xs = crossed
    columns = np.round(xs)
    on = (np.abs(xs - columns) <= eps) & (columns >= 0) & (columns < width)
    edge[rows[on], columns[on].astype(np.int64)] = True


# --- shared ---------------------------------------------------------------------------------


def _check_frame_of_reference(theirs: str, grid: SeriesGrid, name: str) -> None:
    problem = _frame_of_reference_problem(theirs, grid.frame_of_reference_uid)
    if problem:
        raise ImageRejected("mask_reference_mismatch", f"{name} {problem}")


def _frame_of_reference_problem(theirs: str, ours: str) -> str:
    """Why FrameOfReferenceUID `theirs` is not the series' `ours`, for a message; '' when it is."""
    if not ours:
        return ""  # Unknown for the volume (a series without it): positions and references decide.
    if not theirs:
        return f"names no FrameOfReferenceUID; the series' is {ours}"
    if theirs != ours:
        return f"is in FrameOfReferenceUID {theirs}, the series in {ours}: its coordinates are of another patient space"
    return ""


def _as_list(value) -> list:
    if value is None or value == "":
        return []
    if isinstance(value, (str, bytes, int, float)):
        return [value]
    return [v for v in value if v is not None and v != ""]


def _floats(value, what: str, name: str) -> list[float] | None:
    """A multi-valued number element as floats; None when absent. Raises ImageRejected('corrupt')."""
    items = _as_list(value)
    if not items:
        return None
    try:
        out = [float(v) for v in items]
    except (TypeError, ValueError):
        out = []
    if len(out) != len(items) or not np.isfinite(out).all():
        raise ImageRejected("corrupt", f"{name}: {what} {value!r} is not numbers")
    return out


def _int(value) -> int | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else None


def _text(values) -> str:
    return "(" + ", ".join(f"{float(v):.4f}" for v in values) + ")"


def _sop_name(uid: str) -> str:
    from pydicom.uid import UID

    return UID(uid).name if uid else "object without a SOPClassUID"
