"""DICOM series and NIfTI files as 3-D volumes in RAS (issue 36), framework-free.

A folder's DICOM files go through three steps:

    slices = [s for name, data in files for s in volumes.read_slices(data, name)]
    plan = volumes.plan_stacks(slices, min_slices=2)       # stacks and rejects
    volume = volumes.read_stack(plan.stacks[0], read_bytes)  # voxels, spacing, affine

`read_slices` keeps headers only (the pixels are decoded once, by
`read_stack`, into one preallocated array). A NIfTI file is one call:
`volumes.read_nifti(data, name)`. docs/preparing/volumes.md says what each
step decides and why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import os
import math
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from imaging import dicom
from imaging.errors import ImageRejected

__all__ = ["VolumeOptions", "DicomSlice", "Stack", "StackPlan", "Volume", "read_slices", "read_slice_headers", "plan_stacks",
           "read_stack", "read_nifti", "nifti_image", "check_nifti_size", "is_nifti", "nifti_voxels", "LPS_TO_RAS"]

_LOG = logging.getLogger(__name__)

# RAS = diag(-1, -1, 1) x LPS: DICOM's patient axes to NIfTI's world.
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
# A gap between two slices larger than this times the usual spacing is a missing slice.
_GAP_FACTOR = 1.5
# Any other step further than this fraction of the usual spacing from it is unequal spacing: one
# affine cannot place those slices (a slice 10% off is a tenth of a voxel out, at least).
_SPACING_TOLERANCE = 0.1
# Orientations equal to this many decimals are one (direction cosines are written with ~6).
_ORIENTATION_DECIMALS = 4
_INT16 = np.iinfo(np.int16)
# Planning parses a header from this many first bytes of a file in memory (`_header_from_memory`).
_HEADER_BYTES = 16384


@dataclasses.dataclass(frozen=True)
class VolumeOptions:
    """How DICOM series and NIfTI files become volume records (--volumes); validated when built.

    Attributes:
      min_slices: A stack needs at least this many slices (--min_slices).

    Raises:
      ValueError: Naming the flag, what it allows and what it received.
    """

    min_slices: int = 2

    def __post_init__(self):
        if isinstance(self.min_slices, bool) or not isinstance(self.min_slices, int) or self.min_slices < 1:
            raise ValueError(f"--min_slices must be >= 1. Received: {self.min_slices!r}")

    def to_json(self) -> dict:
        return {"min_slices": self.min_slices}


@dataclasses.dataclass(frozen=True)
class DicomSlice:
    """The header of one slice (one frame of an enhanced file), all a plan needs.

    Attributes:
      name: The file's relative path (read back with `read_stack`'s `read_bytes`).
      frame: The frame index in the file (0 for single-frame files).
      series_uid: SeriesInstanceUID ('' when absent).
      orientation: ImageOrientationPatient: row then column direction (LPS).
      position: ImagePositionPatient of the first voxel (LPS, mm).
      rows, columns: The slice's size.
      pixel_spacing: PixelSpacing: (row spacing dy, column spacing dx) in mm.
      slope, intercept: The rescale of this slice.
      stored_range: (lowest, highest) stored value its BitsStored and PixelRepresentation allow.
      stored_dtype: The numpy dtype name its stored values decode to.
      monochrome1: Whether low values are bright.
      pixel_hash: A digest of the slice's stored pixel bytes (exact duplicates).
      modality: DICOM Modality.
      series_number: SeriesNumber as written ('' when absent): names a folder's series.
      frames: The file's NumberOfFrames: a multi-frame (enhanced) file is a stack by itself.
      pixel_offset: Where the file's pixel values lie as stored, or -1: `read_stack`
        reads them there without parsing the file again (`dicom.native_pixel_offset`).
      sop_instance_uid: SOPInstanceUID ('' when absent; the frames of an enhanced file
        share it): what a SEG's frames and an RTSTRUCT's contours name the slice by
        (`imaging.dicom_masks`).
      frame_of_reference_uid: FrameOfReferenceUID ('' when absent): the patient
        coordinate system the slice's position is in.
      group_value: The value of the DICOM keyword asked for when it was read
        (--group_by dicom:KEYWORD: `read_slice_headers`' `group_keyword`); '' when
        not asked, absent or empty.
    """

    name: str
    frame: int
    series_uid: str
    orientation: tuple[float, ...]
    position: tuple[float, float, float]
    rows: int
    columns: int
    pixel_spacing: tuple[float, float]
    slope: float
    intercept: float
    stored_range: tuple[int, int]
    stored_dtype: str
    monochrome1: bool
    pixel_hash: str
    modality: str = ""
    series_number: str = ""
    frames: int = 1
    pixel_offset: int = -1
    sop_instance_uid: str = ""
    frame_of_reference_uid: str = ""
    group_value: str = ""

    @property
    def normal(self) -> np.ndarray:
        r, c = np.asarray(self.orientation[:3]), np.asarray(self.orientation[3:])
        return np.cross(r, c)


@dataclasses.dataclass(frozen=True)
class Stack:
    """Slices of one series, orientation and size, sorted along the slice normal.

    Attributes:
      series_uid: The series.
      index: Its place among the folder's stacks (sorted by series, then size of stack).
      slices: Sorted by position along the normal, ascending.
      notes: What was decided on the way (duplicates dropped), for the report.
    """

    series_uid: str
    index: int
    slices: tuple[DicomSlice, ...]
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """The stack as JSON (a plan file the shard writer reads back with `from_json`).

        Without its slices' `group_value`: planning's alone (a PatientID is no reader's business,
        and the plan files of a run that stopped stay in its output folder).
        """
        out = dataclasses.asdict(self)
        for data in out["slices"]:
            del data["group_value"]
        return out

    @classmethod
    def from_json(cls, data: dict) -> Stack:
        def as_slice(d):
            return DicomSlice(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

        return cls(data["series_uid"], data["index"], tuple(as_slice(d) for d in data["slices"]),
                   tuple(data["notes"]))


@dataclasses.dataclass(frozen=True)
class StackPlan:
    """What `plan_stacks` made of a folder's slices.

    Attributes:
      stacks: The stacks to read.
      rejects: (file name, reason, message) for each file that is in no stack.
    """

    stacks: tuple[Stack, ...]
    rejects: tuple[tuple[str, str, str], ...]


@dataclasses.dataclass(frozen=True)
class Volume:
    """A volume ready for `schemas.volumes.VolumeRecord`.

    Attributes:
      voxels: (depth, height, width): slice k, row j, column i.
      spacing: (z, y, x) in mm.
      affine: 4x4 (i, j, k, 1) -> RAS mm.
      modality: DICOM Modality, '' for NIfTI.
      notes: Decisions taken, for normalized.jsonl.
    """

    voxels: np.ndarray
    spacing: tuple[float, float, float]
    affine: np.ndarray
    modality: str = ""
    notes: tuple[str, ...] = ()


def _floats(value, count: int, what: str, name: str) -> tuple[float, ...]:
    if value is None or (not isinstance(value, (int, float)) and not value):
        # Absent (or empty): an image without the Image Plane module (a secondary capture, an
        # X-ray, an ultrasound frame) is a valid DICOM image, just not a slice of a volume.
        raise ImageRejected("not_a_volume", f"{name} has no {what}: a DICOM image without a position and "
                                            "orientation in the patient cannot be placed in a volume")
    values = _finite_floats(value or ())
    if values is None or len(values) != count:
        raise ImageRejected("corrupt", f"{name}: {what} {value!r} is not {count} numbers; "
                                       "a slice without it cannot be placed in a volume")
    return values


def _finite_floats(values) -> tuple[float, ...] | None:
    """`values` (a DICOM multi-value) as floats; None where one is no number or not finite."""
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        return None
    return out if np.isfinite(out).all() else None


def _is_mosaic(ds) -> bool:
    image_type = [str(v).upper() for v in (ds.get("ImageType") or ())]
    # (0019,100A) NumberOfImagesInMosaic, Siemens' private CSA element.
    return "MOSAIC" in image_type or (0x0019, 0x100A) in ds


def read_slices(data: bytes, name: str, group_keyword: str | None = None) -> list[DicomSlice]:
    """The slices (frames) of one DICOM file, from its bytes; each with its pixels' digest.

    `group_keyword`: as `read_slice_headers`'.

    Raises:
      ImageRejected: 'not_an_image', 'no_pixel_data' (skipped as in 2-D),
        'not_a_volume' (no position, orientation or pixel spacing), 'corrupt' (one that is
        not numbers), 'mosaic'.
    """
    try:
        ds = dicom.read_dataset(data, name)
    except ImageRejected as e:
        raise _what_else(e, data[:_PAIR_HEADER_BYTES], name) from None
    pixels = ds.get("PixelData")
    return _slices(ds, name, "PixelData" if pixels is not None else "FloatPixelData", pixels or b"",
                   dicom.dataset_pixel_offset(ds, data), group_keyword)


def read_slice_headers(f, name: str, group_keyword: str | None = None) -> list[DicomSlice]:
    """The slices (frames) of one DICOM file, its header only: its pixels are not read.

    Planning a series needs the pixels of two slices only when they share a
    position (a copy, or a conflict): their `pixel_hash` is '' here, and
    `plan_stacks` asks its `pixel_hash` function for them. A 512x512 slice's
    header is ~2% of its bytes: planning reads each file's start, not twice
    the whole file (once here, once by `read_stack`).

    Args:
      f: A binary file object at the file's start.
      group_keyword: A DICOM keyword (--group_by dicom:KEYWORD) whose value each slice
        keeps as its `group_value`, read from the same parse of the header.

    Raises:
      ImageRejected: As `read_slices`.
    """
    parsed = _header_from_memory(f, name)
    if parsed is None:
        f.seek(0)
        try:
            parsed = dicom.read_header(f, name)
        except ImageRejected as e:
            f.seek(0)
            raise _what_else(e, f.read(_PAIR_HEADER_BYTES), name) from None
    ds, keyword, pixel_offset = parsed
    return _slices(ds, name, keyword, None, pixel_offset, group_keyword)


# A NIfTI-1 or Analyze 7.5 header is 348 bytes, a NIfTI-2 header 540.
_PAIR_HEADER_BYTES = 540
# The magic of a NIfTI .hdr/.img pair's header (a single .nii file's is n+1 / n+2).
_PAIR_MAGICS = (b"ni1\x00", b"ni2\x00")


def _what_else(rejected: ImageRejected, head: bytes, name: str) -> ImageRejected:
    """`rejected` ('not_an_image': not DICOM) said of a --volumes input: what else it is, where known.

    "Not a DICOM file" is true of a NIfTI or Analyze .hdr/.img pair too, yet tells its owner
    nothing: its header is named, with the way to a file --volumes reads.
    """
    if rejected.reason != "not_an_image":
        return rejected
    sizes = {int.from_bytes(head[:4], "little"), int.from_bytes(head[:4], "big")}
    if head[344:348] in _PAIR_MAGICS or head[4:8] in _PAIR_MAGICS:
        kind = "a NIfTI .hdr/.img pair"
    elif 348 in sizes and len(head) >= 348:
        kind = "an Analyze 7.5 .hdr/.img pair"
    else:
        return ImageRejected("not_an_image", f"{name} is neither a DICOM file nor a NIfTI file (.nii, .nii.gz)")
    return ImageRejected(
        "not_an_image",
        f"{name} is the header of {kind}, which --volumes does not read (NIfTI as one .nii or .nii.gz "
        "file only); save it as one file, e.g. nibabel.save(nibabel.load(HDR), 'volume.nii')",
    )


def _header_from_memory(f, name: str):
    """`dicom.read_header` of the file's first `_HEADER_BYTES`, when the header ends inside them; else None.

    pydicom reads a header element by element: from bytes in memory that
    costs ~0.5 ms less a 512x512 slice than from an open file (a third of
    planning). Only a file several times that size is read so (a small one
    is read from the file: its start is most of it). The parse of a prefix
    is the file's whenever it reached the pixel element's tag and the 8
    bytes after it with bytes to spare: pydicom reads nothing beyond them.
    """
    try:
        if os.fstat(f.fileno()).st_size < 4 * _HEADER_BYTES:
            return None
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError.
        return None
    head = f.read(_HEADER_BYTES)
    buffer = io.BytesIO(head)
    try:
        parsed = dicom.read_header(buffer, name)
    except Exception:  # noqa: BLE001 - the prefix cut the header short: the whole file decides, and says why
        return None
    return parsed if buffer.tell() < len(head) else None


def _slices(ds, name: str, pixel_keyword: str, pixels: bytes | None, pixel_offset: int = -1,
            group_keyword: str | None = None) -> list[DicomSlice]:
    """The slices of a parsed file; `pixels` None: digests left to `plan_stacks` ('')."""
    dicom.check_not_segmentation(ds, name)  # A SEG's frames are a mask's, not a volume's.
    if _is_mosaic(ds):
        raise ImageRejected("mosaic", f"{name} is a Siemens mosaic (its slices packed in one image); "
                                      "convert it with dcm2niix, or export classic slices")
    frames = dicom.num_frames(ds, name)
    try:
        rows, columns = int(ds.Rows), int(ds.Columns)
    except (AttributeError, TypeError, ValueError):  # Dropped or emptied (issue 39's mutations).
        raise ImageRejected("corrupt", f"{name}: its header has no Rows and Columns") from None
    bits = int(ds.get("BitsStored") or ds.get("BitsAllocated") or 16)
    signed = int(ds.get("PixelRepresentation") or 0) == 1
    allocated = int(ds.get("BitsAllocated") or 16)
    if pixel_keyword == "PixelData" and (allocated not in (1, 8, 16, 32, 64) or not 1 <= bits <= 64):
        # A damaged header (issue 39's mutations): BitsStored 56080 made a 16,882-digit stored range.
        raise ImageRejected("corrupt", f"{name}: BitsAllocated {allocated} and BitsStored {bits} are no sample "
                                       "size (BitsAllocated 1, 8, 16, 32 or 64; BitsStored 1 to 64)")
    samples = ds.get("SamplesPerPixel")
    if samples not in (None, "", 1, 3, 4):
        # A damaged header (issue 39's mutations): SamplesPerPixel 65535 was "colour pixels" when its
        # series was read, and rejected every slice of it as unsupported_dtype.
        raise ImageRejected("corrupt", f"{name}: SamplesPerPixel {samples} is no pixel's (1, 3 or 4)")
    if pixel_keyword != "PixelData":
        stored_dtype, stored_range = "float32", (0, 0)
    else:
        stored_dtype = f"{'int' if signed else 'uint'}{max(8, allocated)}"
        stored_range = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    photometric = str(ds.get("PhotometricInterpretation", "")).strip().upper()
    offsets = _grid_frame_offsets(ds, frames, name)
    dose_scaling = _dose_grid_scaling(ds, name)
    group_value = (dicom.header_value(ds, group_keyword) or "") if group_keyword else ""
    slices = []
    for index in range(frames):
        orientation = _floats(dicom.frame_value(ds, index, "PlaneOrientationSequence",
                                                "ImageOrientationPatient", multi=True),
                              6, "ImageOrientationPatient", name)
        position = _floats(dicom.frame_value(ds, index, "PlanePositionSequence",
                                             "ImagePositionPatient", multi=True),
                           3, "ImagePositionPatient", name)
        if offsets is not None:
            # PS3.3 C.8.8.3.2: frame k lies offsets[k] along the normal from the first frame,
            # whose position is ImagePositionPatient (relative offsets start at 0; absolute
            # ones, allowed for axial frames only, start at its z).
            normal = np.cross(orientation[:3], orientation[3:])
            position = tuple(float(v) for v in np.add(position, (offsets[index] - offsets[0]) * normal))
        spacing = _floats(dicom.frame_value(ds, index, "PixelMeasuresSequence", "PixelSpacing",
                                            multi=True), 2, "PixelSpacing", name)
        slope = dicom.frame_value(ds, index, "PixelValueTransformationSequence", "RescaleSlope")
        if dose_scaling is not None and slope in (None, ""):
            slope = dose_scaling
        intercept = dicom.frame_value(ds, index, "PixelValueTransformationSequence", "RescaleIntercept")
        try:
            slope = 1.0 if slope in (None, "") else float(slope)
            intercept = 0.0 if intercept in (None, "") else float(intercept)
        except (TypeError, ValueError):
            raise ImageRejected("corrupt", f"{name}: RescaleSlope/Intercept {slope!r}/{intercept!r} "
                                           "are not numbers") from None
        digest = "" if pixels is None else _pixel_digest(pixels, frames, index)
        slices.append(DicomSlice(
            name=name, frame=index, series_uid=str(ds.get("SeriesInstanceUID", "")),
            orientation=orientation, position=position, rows=rows, columns=columns,
            pixel_spacing=spacing, slope=slope, intercept=intercept, stored_range=stored_range,
            stored_dtype=stored_dtype, monochrome1=photometric == "MONOCHROME1",
            pixel_hash=digest, modality=str(ds.get("Modality", "") or ""),
            series_number=str(ds.get("SeriesNumber", "") or "").strip(), frames=frames,
            pixel_offset=pixel_offset if frames == 1 else -1,
            sop_instance_uid=str(ds.get("SOPInstanceUID", "") or ""),
            frame_of_reference_uid=str(ds.get("FrameOfReferenceUID", "") or ""),
            group_value=group_value,
        ))
    return slices


def _grid_frame_offsets(ds, frames: int, name: str) -> tuple[float, ...] | None:
    """An RT Dose's GridFrameOffsetVector (PS3.3 C.8.8.3.2), one offset per frame; None without one.

    A multi-frame RT Dose file gives one ImagePositionPatient for all its frames and places
    frame k by the k-th offset; read as one position, its frames would all be at one place.
    """
    vector = ds.get("GridFrameOffsetVector")
    if frames < 2 or vector in (None, "") or "PerFrameFunctionalGroupsSequence" in ds:
        return None
    values = [vector] if isinstance(vector, (str, bytes, int, float)) else vector  # One value, or a MultiValue.
    offsets = _finite_floats(values)
    if offsets is None or len(offsets) != frames:
        raise ImageRejected("corrupt", f"{name}: GridFrameOffsetVector {vector!r} is not {frames} numbers, "
                                       "one per frame")
    return offsets


def _dose_grid_scaling(ds, name: str) -> float | None:
    """An RT Dose's DoseGridScaling: stored value x scaling = dose in DoseUnits (PS3.3 C.8.8.3)."""
    value = ds.get("DoseGridScaling")
    if value in (None, ""):
        return None
    try:
        scaling = float(value)
    except (TypeError, ValueError):
        scaling = math.nan
    if not math.isfinite(scaling) or scaling <= 0:
        raise ImageRejected("corrupt", f"{name}: DoseGridScaling {value!r} is not a positive number")
    return scaling


def _pixel_digest(pixels: bytes, frames: int, index: int) -> str:
    """A frame's `pixel_hash`: of a single frame's pixel bytes; of a multi-frame file's with its index."""
    return hashlib.sha1(bytes(pixels) if frames == 1 else bytes(pixels) + b"#%d" % index).hexdigest()


def _stack_key(s: DicomSlice):
    return (tuple(np.round(s.orientation, _ORIENTATION_DECIMALS) + 0.0), s.rows, s.columns)


def plan_stacks(slices: Sequence[DicomSlice], min_slices: int = 2,
                pixel_hash: Callable[[DicomSlice], str] | None = None) -> StackPlan:
    """Groups slices into stacks: series, then orientation and size; sorts and checks each.

    Args:
      slices: The slices of one folder (`read_slices` or `read_slice_headers`), in any order.
      min_slices: A stack needs at least this many slices (--min_slices).
      pixel_hash: The `pixel_hash` of a slice read without its pixels
        (`read_slice_headers`), asked only for slices that share a position.

    Returns:
      The stacks (each sorted along its normal, duplicates dropped) and the
      files rejected: 'too_few_slices', 'duplicate', 'conflicting_slices',
      'repeated_positions', 'missing_slice'.
    """
    if isinstance(min_slices, bool) or not isinstance(min_slices, int) or min_slices < 1:
        raise ValueError(f"`min_slices` must be an int >= 1. Received: {min_slices!r}")
    groups: dict[tuple, list[DicomSlice]] = defaultdict(list)
    for s in slices:
        # An enhanced file's frames are one stack, never mixed with another file's (two time
        # points written as two enhanced files of one series are two volumes).
        groups[(s.series_uid, s.name if s.frames > 1 else "") + _stack_key(s)].append(s)
    stacks, rejects = [], []
    # Stacks in a stable order: series, then most slices first, then the key.
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]), repr(kv[0])))
    for key, members in ordered:
        stack, dropped = _check_stack(key[0], members, min_slices, pixel_hash)
        rejects += dropped
        if stack is not None:
            stacks.append(dataclasses.replace(stack, index=len(stacks)))
    return StackPlan(tuple(stacks), tuple(sorted(set(rejects))))


def _reject_all(members, reason, message):
    return None, [(s.name, reason, message) for s in members]


def _check_stack(series_uid, members, min_slices, pixel_hash=None):
    normal = members[0].normal
    where = sorted(members, key=lambda s: (float(np.dot(s.position, normal)), s.name, s.frame))
    depth = [float(np.dot(s.position, normal)) for s in where]
    spacing_hint = min(members[0].pixel_spacing) or 1.0
    tolerance = 1e-3 * spacing_hint
    # Slices at one position: copies (same pixels) are dropped, others conflict.
    positions: list[list[DicomSlice]] = []
    last = None
    for d, s in zip(depth, where):
        if last is not None and abs(d - last) <= tolerance:
            positions[-1].append(s)
        else:
            positions.append([s])
            last = d
    kept, dropped, notes = [], [], []
    repeated = []
    for group in positions:
        if len(group) > 1 and pixel_hash is not None:
            # Slices at one position: their pixels decide (a copy, or a conflict).
            group = [s if s.pixel_hash else dataclasses.replace(s, pixel_hash=pixel_hash(s)) for s in group]
        unique = {}
        for s in group:
            if s.pixel_hash in unique:
                dropped.append((s.name, "duplicate", f"{s.name}: same pixels and position as "
                                                     f"{unique[s.pixel_hash].name}"))
                notes.append(f"dropped duplicate slice {s.name}")
            else:
                unique[s.pixel_hash] = s
        repeated.append(len(unique))
        kept.append(next(iter(unique.values())) if len(unique) == 1 else list(unique.values()))
    if max(repeated) > 1:
        counts = sorted(set(repeated))
        if len(counts) == 1 and len(positions) >= min_slices:
            return _reject_all(members, "repeated_positions",
                               f"every one of the {len(positions)} positions of the series "
                               f"holds {counts[0]} slices with different pixels (time points or echoes?)")
        where_bad = [f"{depth_of(g, normal):.3f}" for g in kept if isinstance(g, list)]
        return _reject_all(members, "conflicting_slices",
                           "the series has different slices at the same position(s) "
                           f"{', '.join(where_bad[:5])} mm along the normal")
    if len(kept) < min_slices:
        duplicates = {n for n, _, _ in dropped}
        return None, dropped + [(s.name, "too_few_slices",
                                 f"{len(kept)} slice(s) of the series in this orientation and "
                                 f"size ({members[0].columns}x{members[0].rows}), fewer than "
                                 f"--min_slices={min_slices} (a scout or localizer?)") for s in members
                                if s.name not in duplicates]
    if len(kept) >= 3:
        depths = np.array([depth_of([s], normal) for s in kept])
        steps = np.diff(depths)
        usual = float(np.median(steps))
        gaps = np.nonzero(steps > _GAP_FACTOR * usual)[0]
        if len(gaps):
            text = ", ".join(f"{depths[i]:.3f} to {depths[i + 1]:.3f}" for i in gaps[:5])
            return _reject_all(members, "missing_slice",
                               f"gap(s) between the series' slices at {text} mm along the "
                               f"normal, usual spacing {usual:.3f} mm")
        unequal = np.nonzero(np.abs(steps - usual) > _SPACING_TOLERANCE * usual)[0]
        if len(unequal):
            text = ", ".join(f"{depths[i]:.3f} to {depths[i + 1]:.3f} ({steps[i]:.3f} mm)" for i in unequal[:5])
            return _reject_all(members, "missing_slice",
                               f"unequal spacing between the series' slices at {text} along the "
                               f"normal, usual spacing {usual:.3f} mm (tolerance "
                               f"{100 * _SPACING_TOLERANCE:.0f}%): one affine cannot place them")
    return Stack(series_uid, 0, tuple(kept), tuple(notes)), dropped


def depth_of(group, normal) -> float:
    return float(np.dot(group[0].position, normal))


def _out_dtype(slices: Sequence[DicomSlice]) -> np.dtype:
    """The stored dtype without rescaling; int16 for whole-number rescaling (widened to
    int32 by `read_stack` if a slice's values do not fit); float32 otherwise."""
    if any(s.stored_dtype == "float32" for s in slices):
        return np.dtype(np.float32)
    if all(s.slope == 1.0 and s.intercept == 0.0 and not s.monochrome1 for s in slices) \
            and len({s.stored_dtype for s in slices}) == 1:
        return np.dtype(slices[0].stored_dtype)
    if all(float(s.slope).is_integer() and float(s.intercept).is_integer() for s in slices):
        return np.dtype(np.int16)
    return np.dtype(np.float32)


def stack_geometry(slices: Sequence[DicomSlice]) -> tuple[np.ndarray, tuple[float, float, float]]:
    """The RAS affine and (z, y, x) spacing of sorted slices."""
    first = slices[0]
    r = np.asarray(first.orientation[:3])
    c = np.asarray(first.orientation[3:])
    dy, dx = first.pixel_spacing
    lps = np.eye(4)
    lps[:3, 0] = r * dx
    lps[:3, 1] = c * dy
    if len(slices) > 1:
        step = (np.asarray(slices[-1].position) - np.asarray(first.position)) / (len(slices) - 1)
    else:
        step = first.normal * 1.0
    lps[:3, 2] = step
    lps[:3, 3] = first.position
    dz = float(abs(np.dot(step, first.normal)))
    return LPS_TO_RAS @ lps, (dz, float(dy), float(dx))


def read_stack(stack: Stack, read_bytes: Callable[[str], bytes]) -> Volume:
    """Decodes a stack's slices into one preallocated (depth, height, width) array.

    Args:
      stack: From `plan_stacks`.
      read_bytes: Relative file name -> the file's bytes.

    Raises:
      ImageRejected: A slice that does not decode ('corrupt', 'unsupported_codec', ...).
    """
    slices = stack.slices
    first = slices[0]
    dtype = _out_dtype(slices)
    voxels = np.empty((len(slices), first.rows, first.columns), dtype)
    cached_name, ds = None, None
    for k, s in enumerate(slices):
        stored = None
        if s.pixel_offset >= 0:
            # Uncompressed: the values as they lie in the file, without parsing it again.
            ds, cached_name = None, None
            stored = dicom.decode_native_frame(read_bytes(s.name), s.pixel_offset, s.rows, s.columns,
                                               s.stored_dtype, _bits_stored(s))
        if stored is None:
            if s.name != cached_name:
                ds, cached_name = None, None  # The previous file's pixels go before the next is read.
                ds = dicom.read_dataset(read_bytes(s.name), s.name)
                cached_name = s.name
            stored = dicom.decode_stored_frame(ds, s.frame, s.name)
        if stored.shape != (first.rows, first.columns):
            raise ImageRejected("corrupt", f"{s.name}: decoded {stored.shape}, header says "
                                           f"{(first.rows, first.columns)}")
        if (s.monochrome1 or s.slope != 1.0 or s.intercept != 0.0) and voxels.dtype.kind == "i":
            widened = _rescale_whole(voxels, k, stored, s)
            if widened is not None:
                voxels = widened
                continue
        if s.monochrome1:
            lo, hi = s.stored_range
            stored = (lo + hi) - stored.astype(np.float64)
        if s.slope != 1.0 or s.intercept != 0.0:
            stored = stored * s.slope + s.intercept
        if voxels.dtype == np.int16 and stored.size and (
                stored.min() < _INT16.min or stored.max() > _INT16.max):
            # Whole numbers beyond int16 (rare: 16-bit unsigned with an intercept): widened
            # once, the only copy of the array.
            voxels = voxels.astype(np.int32)
        voxels[k] = stored
    del ds
    affine, spacing = stack_geometry(slices)
    notes = stack.notes + (("monochrome1_inverted",) if any(s.monochrome1 for s in slices) else ())
    return Volume(voxels, spacing, affine, first.modality, notes)


def _rescale_whole(voxels: np.ndarray, k: int, stored: np.ndarray, s: DicomSlice) -> np.ndarray | None:
    """voxels[k] = the slice's values MONOCHROME1-inverted and rescaled, in whole numbers, in place.

    The float path's values exactly, without its two float64 copies of the
    slice (~40% of a 512x512 slice's stacking): inverting and rescaling is
    x -> a*x + b with whole a and b, and the lowest and highest results come
    from the lowest and highest stored values. When they fit the volume's
    integers, computing modulo 2**bits in them (numpy's integer arithmetic)
    gives the true values.

    Returns:
      The volume (widened to int32 where int16 cannot hold the values, as
      the float path does), or None when this slice is not for this path
      (float values, a fractional rescale, results beyond int32): the float
      path does it.
    """
    if stored.dtype.kind not in "iu" or stored.dtype.itemsize > 4 or not stored.size \
            or not (float(s.slope).is_integer() and float(s.intercept).is_integer()):
        return None
    a, b = int(s.slope), int(s.intercept)
    if s.monochrome1:
        lo, hi = s.stored_range
        a, b = -a, (lo + hi) * a + b
    ends = (a * int(stored.min()) + b, a * int(stored.max()) + b)
    if voxels.dtype == np.int16 and (min(ends) < _INT16.min or max(ends) > _INT16.max):
        voxels = voxels.astype(np.int32)
    limits = np.iinfo(voxels.dtype)
    if min(ends) < limits.min or max(ends) > limits.max:
        return None
    plane = voxels[k]
    np.copyto(plane, stored, casting="unsafe")
    if a != 1:
        np.multiply(plane, np.array(a).astype(plane.dtype), out=plane)
    if b:
        np.add(plane, np.array(b).astype(plane.dtype), out=plane)
    return voxels


def _bits_stored(s: DicomSlice) -> int:
    """BitsStored, from the stored range `_slices` made of it."""
    lowest, highest = s.stored_range
    return highest.bit_length() + (1 if lowest < 0 else 0)


_NIFTI_MAGICS = (b"n+1\x00", b"ni1\x00", b"n+2\x00")


def is_nifti(head: bytes) -> bool:
    """Whether the first bytes are a NIfTI-1/2 header (or gzip, which `read_nifti` checks)."""
    return head[:2] == b"\x1f\x8b" or head[344:348] in _NIFTI_MAGICS or head[4:8] in _NIFTI_MAGICS


# NIfTI-2's 540-byte header and the 4-byte extension flag after it: every size a header gives is in these.
_NIFTI_HEAD = 544
# Bytes a .nii.gz may hold before its voxels (header extensions: a few KiB of XML or DICOM tags in
# practice) and after them: past these a gzip is not inflated further (a gzip bomb, a damaged
# vox_offset), as the voxels themselves are not past what the header's shape asks.
_NIFTI_MAX_EXTRA = 64 << 20
# The most bytes deflate makes of one byte (RFC 1951: a 258-byte match in under 2 bits): a header
# asking more than this times the gzip's size is cut short or damaged, known without inflating.
_DEFLATE_MAX_RATIO = 1032
# Inflated in chunks this size when only the gzip's check (CRC, length) is wanted, not the bytes.
_DRAIN_CHUNK = 1 << 20


def nifti_layout(head: bytes) -> tuple[tuple[int, ...], int, int] | None:
    """(shape, voxel data offset, voxel bytes) a NIfTI-1/2 header says, from the file's first bytes.

    Read by hand, before nibabel, to know how far a .nii.gz is worth inflating. The
    offset is at least the header's end; a shape with a dim below 1 gives 0 bytes.

    Returns:
      None when `head` is no NIfTI-1/2 header (nor one nibabel fixes up: a damaged sizeof_hdr),
      its dim[0] is not 1..7, or its datatype is none nibabel knows (nibabel then says why).
    """
    from nibabel.nifti1 import data_type_codes

    for order in ("<", ">"):
        if len(head) < 348:
            return None
        size = int(np.frombuffer(head, f"{order}i4", 1, 0)[0])
        if size == 348:
            rank, dims = int(np.frombuffer(head, f"{order}i2", 1, 40)[0]), np.frombuffer(head, f"{order}i2", 7, 42)
            code = int(np.frombuffer(head, f"{order}i2", 1, 70)[0])
            offset = float(np.frombuffer(head, f"{order}f4", 1, 108)[0])
        elif size == 540 and len(head) >= 540:
            rank, dims = int(np.frombuffer(head, f"{order}i8", 1, 16)[0]), np.frombuffer(head, f"{order}i8", 7, 24)
            code = int(np.frombuffer(head, f"{order}i2", 1, 12)[0])
            offset = float(np.frombuffer(head, f"{order}i8", 1, 168)[0])
        else:
            continue
        if not 1 <= rank <= 7 or code not in data_type_codes.dtype:
            return None
        shape = tuple(int(n) for n in dims[:rank])
        itemsize = np.dtype(data_type_codes.dtype[code]).itemsize
        voxels = math.prod(shape) if min(shape) > 0 else 0
        # nibabel reads from int(vox_offset) (fixed up to the header's end when smaller); 16 bytes of slack.
        start = int(offset) + 16 if math.isfinite(offset) and offset > 0 else 0
        return shape, max(start, size + 4 + 16), voxels * itemsize
    return _nibabel_layout(head)


def nifti_voxels(head: bytes) -> int | None:
    """The voxels a NIfTI-1/2 file's header says it holds, from its first bytes (gzipped or not).

    Enough of a .nii.gz's first bytes to inflate its header (a few hundred; a 64 KiB read holds it)
    is inflated, no further. None when they hold no header `nifti_layout` reads (the writer reads
    the whole file and says why).
    """
    if head[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, _NIFTI_HEAD)
        except zlib.error:
            return None
    layout = nifti_layout(head[:_NIFTI_HEAD])
    if layout is None:
        return None
    shape = layout[0]
    return math.prod(shape) if min(shape) > 0 else 0


def _nibabel_layout(head: bytes) -> tuple[tuple[int, ...], int, int] | None:
    """`nifti_layout` of a header nibabel fixes up (a damaged sizeof_hdr), as nibabel reads it."""
    import nibabel

    for cls in (nibabel.Nifti1Header, nibabel.Nifti2Header):
        size = cls.template_dtype.itemsize
        try:
            # Without its extensions (their flag zeroed): only the sizes are wanted.
            header = cls.from_fileobj(io.BytesIO(head[:size] + bytes(4)), check=True)
            shape, itemsize = tuple(int(n) for n in header.get_data_shape()), header.get_data_dtype().itemsize
            offset = int(header.get_data_offset())
        except (nibabel.filebasedimages.ImageFileError, nibabel.spatialimages.HeaderDataError,
                nibabel.wrapstruct.WrapStructError, ValueError, TypeError, OSError):
            continue
        voxels = math.prod(shape) if shape and min(shape) > 0 else 0
        return shape, max(offset + 16, size + 4 + 16), voxels * itemsize
    return None


class _Gunzip:
    """A gzip's members inflated on demand: `read(n)` at most n more bytes, `drain()` the rest checked, unkept."""

    def __init__(self, data: bytes, name: str):
        self._rest, self._inflater, self._name = data, None, name

    def _fail(self, why) -> ImageRejected:
        return ImageRejected("corrupt", f"{self._name}: damaged gzip ({why})")

    def read(self, n: int, keep: bool = True) -> tuple[bytes, int]:
        """(the next bytes, up to n, when `keep`; how many were inflated)."""
        parts, count = [], 0
        while count < n:
            if self._inflater is None:
                rest = self._rest
                if rest[:2] != b"\x1f\x8b":
                    if not rest.strip(b"\0"):  # The end (zero padding after the last member is allowed).
                        break
                    raise self._fail("bytes that are no gzip member after its end")
                self._inflater, self._rest, feed = zlib.decompressobj(16 + zlib.MAX_WBITS), b"", rest
            else:
                feed = self._inflater.unconsumed_tail
            try:
                out = self._inflater.decompress(feed, min(n - count, _DRAIN_CHUNK) if not keep else n - count)
            except zlib.error as e:
                raise self._fail(e) from e
            count += len(out)
            if keep:
                parts.append(out)
            if self._inflater.eof:
                self._rest, self._inflater = self._inflater.unused_data, None
            elif not out and not self._inflater.unconsumed_tail:
                raise self._fail("cut short: the file ends inside a gzip member")
        return b"".join(parts), count

    def drain(self, limit: int) -> int:
        """Inflates the rest (its CRCs checked), keeping nothing; the bytes there were, or limit + 1 past it."""
        _, count = self.read(limit + 1, keep=False)
        return count


def _gunzip_nifti(data: bytes, name: str, check_shape: Callable[[tuple[int, ...]], None] | None) -> bytes:
    """A .nii.gz inflated as far as its header says its voxels reach, and never further.

    The rest of the gzip is inflated unkept (its CRC checked, as `gzip.decompress`
    does); more than `_NIFTI_MAX_EXTRA` bytes past the voxels, or voxels starting past
    it, are refused before they are inflated: a gzip bomb costs no memory.
    """
    stream = _Gunzip(data, name)
    head, _ = stream.read(_NIFTI_HEAD)
    layout = nifti_layout(head)
    if layout is None:
        stream.drain(_NIFTI_MAX_EXTRA)  # A damaged gzip says so first; else nibabel says what it is not.
        return head
    shape, offset, nbytes = layout
    if check_shape is not None:
        check_shape(shape)
    if offset + nbytes > _DEFLATE_MAX_RATIO * len(data) + _NIFTI_HEAD:
        raise ImageRejected("corrupt", f"{name}: its header gives {shape} voxels, {offset + nbytes:,} bytes; a gzip "
                                       f"of {len(data):,} bytes cannot hold them (cut short, or a damaged header)")
    if offset > _NIFTI_MAX_EXTRA:
        raise ImageRejected("corrupt", f"{name}: its header puts its voxels at byte {offset - 16:,}, past the "
                                       f"{_NIFTI_MAX_EXTRA >> 20} MiB of header extensions read (a damaged vox_offset)")
    # Inflated again from the start, in one piece: no copy of the voxels to join them to the header.
    stream = _Gunzip(data, name)
    whole, _ = stream.read(max(len(head), offset + nbytes))
    extra = stream.drain(_NIFTI_MAX_EXTRA)
    if extra > _NIFTI_MAX_EXTRA:
        raise ImageRejected("corrupt", f"{name}: its gzip inflates to more than {_NIFTI_MAX_EXTRA >> 20} MiB past "
                                       f"the {offset + nbytes:,} bytes its header's shape {shape} asks (a gzip bomb, "
                                       "or a damaged header)")
    return whole


def nifti_image(data: bytes, name: str, check_shape: Callable[[tuple[int, ...]], None] | None = None):
    """A NIfTI-1/2 file's bytes (gzipped or not) as (a nibabel image, its voxels not read yet; the bytes ungzipped).

    A .nii.gz is inflated only as far as its header's voxels reach (`_gunzip_nifti`).

    Args:
      check_shape: Called with the header's shape before any voxel is inflated; may raise
        `ImageRejected` (a mask whose header asks more voxels than its volume has).

    Raises:
      ImageRejected: 'not_an_image' (no NIfTI header), 'corrupt' (a damaged gzip, one inflating
        far past its voxels), and `check_shape`'s.
    """
    import nibabel

    if data[:2] == b"\x1f\x8b":
        data = _gunzip_nifti(data, name, check_shape)
    elif check_shape is not None and (layout := nifti_layout(data[:_NIFTI_HEAD])) is not None:
        check_shape(layout[0])
    for cls in (nibabel.Nifti1Image, nibabel.Nifti2Image):
        try:
            return cls.from_bytes(data), data
        except (nibabel.filebasedimages.ImageFileError, nibabel.spatialimages.HeaderDataError,
                nibabel.wrapstruct.WrapStructError, ValueError, OSError):
            # WrapStructError: fewer bytes than a header (a truncated or empty .nii).
            continue
    raise ImageRejected("not_an_image", f"{name} is not a NIfTI file nibabel reads")


def check_nifti_size(image, data: bytes, name: str) -> None:
    """Refuses a NIfTI image whose header asks more voxel bytes than its file holds, before nibabel reads them.

    Raises:
      ImageRejected: 'corrupt'.
    """
    offset = int(getattr(image.dataobj, "offset", 0))  # The image's header copy says 0.
    needed = offset + math.prod(int(n) for n in image.shape) * image.get_data_dtype().itemsize
    if needed > len(data):
        raise ImageRejected("corrupt", f"{name}: its header gives {image.shape} voxels of "
                            f"{image.get_data_dtype().name} from byte {offset}, {needed:,} bytes; the file holds "
                            f"{len(data):,} (cut short, or a damaged header)")


def read_nifti(data: bytes, name: str) -> Volume:
    """A NIfTI-1/2 file (.nii, or gzipped .nii.gz) as a volume, with nibabel.

    The affine is the sform when its code is set, else the qform (nibabel's
    `affine`); scl_slope/scl_inter applied.

    Raises:
      ImageRejected: 'not_an_image', 'corrupt', 'not_a_volume', 'unsupported_dtype'.
    """
    image, data = nifti_image(data, name)
    shape = image.shape
    if len(shape) == 4 and shape[3] == 1:
        shape = shape[:3]
    if len(shape) != 3:
        raise ImageRejected("not_a_volume", f"{name} has shape {image.shape}, not 3-D")
    if min(shape) < 1:  # A damaged dim[] (issue 39's mutations): not a schema's error later.
        raise ImageRejected("corrupt", f"{name}: its header gives an empty volume of shape {image.shape}")
    check_nifti_size(image, data, name)
    try:
        # nibabel moves scl_slope/scl_inter from the header to the array proxy, which
        # applies them (to float) only when they are not 1 and 0.
        values = np.asarray(image.dataobj)
        if values.dtype != image.get_data_dtype():
            finite = np.isfinite(values)
            if finite.all() and (values == np.round(values)).all() and \
                    values.min(initial=0) >= _INT16.min and values.max(initial=0) <= _INT16.max:
                values = values.astype(np.int16)
            else:
                with np.errstate(over="ignore"):
                    scaled = values.astype(np.float32)
                # A damaged scl_slope or scl_inter (1e300, all ones) scales whole numbers to
                # inf or NaN, or finite ones past float32: stored, they would train a model on
                # inf (found by bench.mutations_convert, issue 39). NaN stored as float stays.
                if (image.get_data_dtype().kind != "f" and not finite.all()) or \
                        (np.isfinite(scaled) != finite).any():
                    raise ImageRejected("corrupt", f"{name}: its scl_slope {image.dataobj.slope} and scl_inter "
                                                   f"{image.dataobj.inter} scale its voxels past float32's range")
                values = scaled
    except (ValueError, OSError, EOFError) as e:
        raise ImageRejected("corrupt", f"{name}: {e}") from e
    values = values.reshape(shape)
    if values.dtype == np.float16:
        values = values.astype(np.float32)
    if values.dtype.name not in ("uint8", "int8", "uint16", "int16", "int32", "float32", "float64"):
        raise ImageRejected("unsupported_dtype", f"{name} holds {values.dtype.name} voxels")
    # NIfTI's array is (i, j, k); a volume is stored (k, j, i), the same affine.
    voxels = np.ascontiguousarray(values.transpose(2, 1, 0))
    affine = np.asarray(image.affine, dtype=np.float64)
    if not np.isfinite(affine).all():  # A damaged srow_x/y/z or pixdim (issue 39's mutations).
        raise ImageRejected("corrupt", f"{name}: its affine is not finite ({affine[:3].tolist()})")
    norms = np.linalg.norm(affine[:3, :3], axis=0)
    code = "sform" if int(image.header["sform_code"]) > 0 else (
        "qform" if int(image.header["qform_code"]) > 0 else "none")
    return Volume(voxels, (float(norms[2]), float(norms[1]), float(norms[0])), affine, "",
                  (f"affine_from_{code}",))
