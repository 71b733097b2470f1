"""Label volumes of 3-D volumes: a mask file read onto its volume's voxel grid, framework-free.

A segmentation mask of a volume (Medical Segmentation Decathlon's `labelsTr`,
a 3D Slicer or ITK-SNAP export of a DICOM series) is a volume of class ids.
It must describe the image's voxels: `read_mask_volume` reads one onto the
`VolumeGrid` of its volume (its stored shape and voxel -> RAS affine,
`imaging.volumes.Volume`) and refuses what would be stored misaligned:

- the same grid: stored as is;
- the same grid in another voxel order (axes permuted and/or flipped: a label
  saved RAS beside an LPS image, a series stacked the other way): reoriented
  onto the volume's voxel order, with the note `mask_reoriented`;
- anything else (another shape, spacing, origin, an oblique difference):
  'mask_geometry_mismatch', naming the shapes and how far apart the voxel
  centres are, in mm. A mask is never resampled.

Its values must be class ids (`imaging.masks.class_ids`: whole numbers from 0
to 65535; float labels holding whole numbers are fine), else 'mask_not_class_ids'.

One reader per mask file format, in `MASK_READERS` (format -> reader); each
takes (file bytes, name for messages, grid) and returns a `MaskVolume` whose
ids have the grid's shape:

    grid = VolumeGrid.of(volume)                              # shape + affine
    mask = read_mask_volume(data, "labelsTr/la_003.nii.gz", grid)
    mask.ids        # uint8/uint16 [depth, height, width], the volume's voxel order
    mask.notes      # ("mask_reoriented: ...",) or ()

A format is one row: `MASK_READERS["dicom"]` reads a DICOM SEG or RTSTRUCT
(`imaging.dicom_masks`) on the grid of the series it annotates (`VolumeGrid.of(volume,
stack)` carries the series' UIDs, checked), its labels named by `MaskVolume.class_names`;
files are told apart by `mask_format`, their class-id width by a `MASK_BITS` row.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import zlib
from collections.abc import Callable

import numpy as np

from imaging.errors import ImageRejected

__all__ = ["VolumeGrid", "MaskVolume", "MASK_READERS", "MASK_BITS", "VOLUME_MASK_EXTENSIONS", "mask_format",
           "read_mask_volume", "mask_bits", "read_nifti_mask", "read_dicom_mask", "place_on_grid",
           "POSITION_TOLERANCE"]

# The mask file names --masks_dir is searched for, beside a volume's stem (longest first).
VOLUME_MASK_EXTENSIONS = (".nii.gz", ".nii")
# Two grids are one when no voxel centre of the volume moves by more than this fraction of its
# smallest spacing (1% of a voxel). It absorbs what storing a grid costs: NIfTI's float32 srow
# (~1e-7 relative: 5e-5 mm at 500 mm), a qform's quaternion, DICOM's 6-decimal direction cosines
# (1e-6 x 500 mm = 5e-4 mm at the far corner); a real misalignment (a shifted origin, another
# spacing, a tilt) moves voxels by far more. ITK's own check (1e-6 of a spacing, 1e-6 of a cosine)
# refuses dcm2niix's exports of some series for their cosines' rounding.
POSITION_TOLERANCE = 0.01


@dataclasses.dataclass(frozen=True)
class VolumeGrid:
    """The voxel grid of a stored volume: what a mask must describe.

    Attributes:
      shape: (depth, height, width) as the volume is stored (slice k, row j, column i).
      affine: 16 floats, row-major 4x4, (i column, j row, k slice, 1) -> RAS mm.
      sop_instance_uids: For a DICOM series, each slice's SOPInstanceUID in the
        stored order (slice k is `sop_instance_uids[k]`; the frames of an enhanced
        multi-frame file share one, in frame order); () for NIfTI.
      frames: For a DICOM series, each slice's frame in its file (0 for single-frame
        files) in the stored order; () for NIfTI (or all 0).
      series_uid: The series' SeriesInstanceUID ('' for NIfTI: not checked).
      frame_of_reference_uid: Its FrameOfReferenceUID ('' when unknown: not checked).

    A DICOM SEG's or RTSTRUCT's reader (`MASK_READERS["dicom"]`) checks its references
    against these: the one grid of `imaging.dicom_masks.SeriesGrid.of`.

    Raises:
      ValueError: A shape that is not 3 positive ints, or an affine that is not a finite 4x4.
    """

    shape: tuple[int, int, int]
    affine: tuple[float, ...]
    sop_instance_uids: tuple[str, ...] = ()
    frames: tuple[int, ...] = ()
    series_uid: str = ""
    frame_of_reference_uid: str = ""

    def __post_init__(self):
        shape = tuple(int(n) for n in self.shape)
        affine = tuple(float(v) for v in np.asarray(self.affine, dtype=np.float64).ravel())
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"`shape` must be 3 positive ints (depth, height, width). Received: {self.shape!r}")
        if len(affine) != 16 or not np.isfinite(affine).all():
            raise ValueError(f"`affine` must be a finite 4x4. Received: {self.affine!r}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "affine", affine)
        uids = tuple(str(u) for u in self.sop_instance_uids)
        if uids and len(uids) != shape[0]:
            raise ValueError(f"`sop_instance_uids` names each of the {shape[0]} slices, or none. "
                             f"Received: {len(uids)}")
        object.__setattr__(self, "sop_instance_uids", uids)
        frames = tuple(int(f) for f in self.frames)
        if frames and len(frames) != shape[0]:
            raise ValueError(f"`frames` names each of the {shape[0]} slices' frame, or none. Received: {len(frames)}")
        object.__setattr__(self, "frames", frames)
        object.__setattr__(self, "series_uid", str(self.series_uid or ""))
        object.__setattr__(self, "frame_of_reference_uid", str(self.frame_of_reference_uid or ""))

    @classmethod
    def of(cls, volume, stack=None) -> VolumeGrid:
        """The grid of an `imaging.volumes.Volume`; with the `imaging.volumes.Stack` it was read
        from (a DICOM series), its slices' SOPInstanceUIDs and frames, its series and frame of
        reference: what a SEG's or RTSTRUCT's references are checked against."""
        shape, affine = tuple(volume.voxels.shape), tuple(np.asarray(volume.affine).ravel())
        if stack is None or len(stack.slices) != shape[0]:
            return cls(shape, affine)
        slices = stack.slices
        references = sorted({s.frame_of_reference_uid for s in slices if s.frame_of_reference_uid})
        return cls(shape, affine, tuple(s.sop_instance_uid for s in slices), tuple(s.frame for s in slices),
                   stack.series_uid, references[0] if len(references) == 1 else "")

    @property
    def matrix(self) -> np.ndarray:
        """The affine as a 4x4 float64 array."""
        return np.asarray(self.affine, dtype=np.float64).reshape(4, 4)

    @property
    def spacing(self) -> tuple[float, float, float]:
        """(z, y, x) voxel spacing in mm, from the affine's columns."""
        norms = np.linalg.norm(self.matrix[:3, :3], axis=0)
        return float(norms[2]), float(norms[1]), float(norms[0])


class MaskVolume:
    """A mask read onto a grid: `ids` [depth, height, width] (uint8 or uint16), `notes` (for
    normalized.jsonl) and `class_names` (by id, "background" first: a DICOM SEG's segment labels or
    an RTSTRUCT's ROI names; () for a NIfTI label volume, whose ids have no names in the file)."""

    __slots__ = ("ids", "notes", "class_names")

    def __init__(self, ids: np.ndarray, notes: tuple[str, ...] = (), class_names: tuple[str, ...] = ()):
        self.ids = ids
        self.notes = tuple(notes)
        self.class_names = tuple(class_names)

    def __repr__(self):
        return f"MaskVolume(ids={self.ids.dtype.name}{list(self.ids.shape)}, notes={self.notes})"


def _corners(shape_ijk) -> np.ndarray:
    """The 8 corner voxel centres (i, j, k, 1) of a grid, as columns."""
    return np.array([[*c, 1.0] for c in itertools.product(*[(0, n - 1) for n in shape_ijk])]).T


def place_on_grid(values_ijk: np.ndarray, affine: np.ndarray, grid: VolumeGrid, name: str) -> MaskVolume:
    """A mask array in NIfTI order (i, j, k) with its voxel -> RAS affine, put on `grid`'s voxels.

    The mask's axes are matched to the grid's by their directions: where each
    mask axis is a grid axis (either way), the array is transposed and flipped
    onto the grid's order; then every voxel centre of the grid must land on the
    same RAS position within `POSITION_TOLERANCE` of a voxel. The ids are
    checked (`imaging.masks.class_ids`) after the geometry.

    Args:
      values_ijk: The mask's voxels, 3-D, indexed (i, j, k) as its affine says.
      affine: Its 4x4 voxel (i, j, k, 1) -> RAS mm.
      grid: The volume's grid.
      name: The mask's name, for messages.

    Raises:
      ImageRejected: 'mask_geometry_mismatch' (other grid, naming the shapes and
        the largest displacement in mm), 'mask_not_class_ids'.
    """
    from imaging.masks import class_ids

    affine = np.asarray(affine, dtype=np.float64)
    want_ijk = tuple(reversed(grid.shape))
    target = grid.matrix
    tolerance = POSITION_TOLERANCE * min(grid.spacing)
    if values_ijk.ndim != 3:
        raise ImageRejected("mask_geometry_mismatch", f"mask {name} has shape {values_ijk.shape}, not 3-D: one "
                            "label volume of class ids per volume (one channel per class is not read)")
    # R[a, c]: steps of the volume's axis a per step of the mask's axis c; a signed permutation when
    # both grids share their axes.
    try:
        steps = np.linalg.solve(target[:3, :3], affine[:3, :3])
    except np.linalg.LinAlgError:
        steps = np.full((3, 3), np.nan)
    perm = np.round(steps)
    is_permutation = (np.isfinite(steps).all() and np.all(np.abs(perm).sum(axis=0) == 1)
                      and np.all(np.abs(perm).sum(axis=1) == 1))
    notes = ()
    if is_permutation:
        # Mask axis feeding each volume axis, and whether it runs the other way.
        source = [int(np.flatnonzero(perm[a])[0]) for a in range(3)]
        flips = [perm[a, source[a]] < 0 for a in range(3)]
        oriented = values_ijk.transpose(source)
        flip_axes = tuple(a for a in range(3) if flips[a])
        if flip_axes:
            oriented = np.flip(oriented, axis=flip_axes)
        # The reoriented mask's own affine: volume index -> mask index -> RAS.
        to_mask = np.zeros((4, 4))
        to_mask[3, 3] = 1.0
        for a in range(3):
            n = values_ijk.shape[source[a]]
            to_mask[source[a], a] = -1.0 if flips[a] else 1.0
            to_mask[source[a], 3] = n - 1 if flips[a] else 0.0
        moved = affine @ to_mask
        if source != [0, 1, 2] or flip_axes:
            axes = "".join("ijk"[c] for c in source)
            flipped = ",".join("ijk"[a] for a in flip_axes) or "none"
            notes = (f"mask_reoriented: the mask's axes taken as {axes} of its file, flipped along "
                     f"{flipped}, onto the volume's voxel order",)
    else:
        oriented, moved = values_ijk, affine
    shape_ok = tuple(oriented.shape) == want_ijk
    corners = _corners(want_ijk if shape_ok else tuple(min(a, b) for a, b in zip(want_ijk, oriented.shape)))
    shift = float(np.max(np.linalg.norm((moved @ corners - target @ corners)[:3], axis=0)))
    if not (is_permutation and shape_ok and shift <= tolerance):
        stored = tuple(reversed(oriented.shape)) if is_permutation else tuple(reversed(values_ijk.shape))
        why = [] if shape_ok else [f"shape (depth, height, width) {stored} against the volume's {grid.shape}"]
        if not is_permutation:
            why.append("axes that are not the volume's (another spacing or an oblique difference)")
        why.append(f"voxel centres up to {shift:.4g} mm apart (tolerance {tolerance:.3g} mm); largest "
                   f"affine difference {float(np.max(np.abs(moved - target))):.4g} mm")
        raise ImageRejected("mask_geometry_mismatch", f"mask {name} does not lie on its volume's grid: "
                            + "; ".join(why) + ". A mask is never resampled: export it on the image's grid")
    ids = class_ids(np.ascontiguousarray(oriented.transpose(2, 1, 0)), name)
    return MaskVolume(np.ascontiguousarray(ids), notes)


def read_nifti_mask(data: bytes, name: str, grid: VolumeGrid) -> MaskVolume:
    """A NIfTI label volume (.nii, .nii.gz; any integer or float type) on `grid` (`place_on_grid`).

    The affine is nibabel's (the sform when its code is set, else the qform);
    scl_slope/scl_inter are applied, so a scaled file must still give whole ids.

    Raises:
      ImageRejected: 'mask_unreadable' (not a NIfTI file, damaged), 'mask_geometry_mismatch'
        (4-D, another grid), 'mask_not_class_ids'.
    """
    from imaging import volumes

    def check_shape(shape):
        # Before a voxel is inflated: a header asking more voxels than the volume has (2^31 of
        # them, a gzip bomb's) is no label volume of it, however its file ends.
        if len(shape) == 4 and shape[3] == 1:
            shape = shape[:3]
        if len(shape) != 3:
            raise _not_3d(name, shape)
        voxels = math.prod(shape) if min(shape) > 0 else 0
        if voxels > math.prod(grid.shape):
            raise ImageRejected("mask_geometry_mismatch", f"mask {name} does not lie on its volume's grid: shape "
                                f"(depth, height, width) {tuple(reversed(shape))} against the volume's {grid.shape}, "
                                f"{voxels:,} voxels against {math.prod(grid.shape):,} (refused before its voxels "
                                "are read). A mask is never resampled: export it on the image's grid")

    try:
        image, raw = volumes.nifti_image(data, name, check_shape)
        volumes.check_nifti_size(image, raw, name)
    except ImageRejected as e:
        if e.reason == "mask_geometry_mismatch":
            raise
        raise ImageRejected("mask_unreadable", f"mask {e.message}") from e
    shape = image.shape
    if min(shape, default=0) < 1:  # A damaged dim[] (0, negative): numpy's "negative count" says less.
        raise ImageRejected("mask_unreadable", f"mask {name}: its header gives an empty shape {shape}")
    if len(shape) == 4 and shape[3] == 1:
        shape = shape[:3]
    if len(shape) != 3:
        raise _not_3d(name, image.shape)
    try:
        values = np.asarray(image.dataobj).reshape(shape)
    except (ValueError, OSError, EOFError) as e:
        raise ImageRejected("mask_unreadable", f"mask {name}: {e}") from e
    affine = np.asarray(image.affine, dtype=np.float64)
    if not np.isfinite(affine).all():
        raise ImageRejected("mask_unreadable", f"mask {name}: its affine is not finite")
    return place_on_grid(values, affine, grid, name)


def _not_3d(name: str, shape) -> ImageRejected:
    return ImageRejected("mask_geometry_mismatch", f"mask {name} has shape {tuple(shape)}, not 3-D: one label "
                         "volume of class ids per volume (a 4-D file of one channel per class is not read)")


# NIfTI datatype codes of 8-bit and narrower samples (bool, uint8, int8): ids fit uint8.
_NIFTI_NARROW = frozenset({1, 2, 256})


def _nifti_bits(head: bytes) -> int | None:
    """Bits per sample a NIfTI header's datatype says (8 for 1-byte types, else 16); None when unread."""
    if head[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 560)
        except zlib.error:
            return None
    for order in ("<", ">"):
        if len(head) >= 348 and np.frombuffer(head[:4], f"{order}i4")[0] == 348:  # NIfTI-1
            code = int(np.frombuffer(head[70:72], f"{order}i2")[0])
            break
        if len(head) >= 540 and np.frombuffer(head[:4], f"{order}i4")[0] == 540:  # NIfTI-2
            code = int(np.frombuffer(head[12:14], f"{order}i2")[0])
            break
    else:
        return None
    return 8 if code in _NIFTI_NARROW else 16


def mask_format(head: bytes, name: str = "") -> str | None:
    """The `MASK_READERS` key of a mask file, from its first bytes (a gzip is NIfTI); None when unknown."""
    if head[:2] == b"\x1f\x8b" or _nifti_bits(head) is not None:
        return "nifti"
    if head[128:132] == b"DICM":
        return "dicom"
    return None


def read_dicom_mask(data: bytes, name: str, grid: VolumeGrid) -> MaskVolume:
    """A DICOM SEG or RTSTRUCT on `grid` (`imaging.dicom_masks.read_dicom_mask`): its labels are its
    segment numbers / ROI positions, named by `class_names`; its references (series, frame of
    reference, source slices) checked against the grid's.

    Raises:
      ImageRejected: 'mask_reference_mismatch', 'mask_geometry_mismatch', 'unsupported_mask',
        'corrupt', 'unsupported_codec' (`imaging.dicom_masks`).
    """
    from imaging import dicom_masks

    mask = dicom_masks.read_dicom_mask(data, name, dicom_masks.SeriesGrid.of(grid))
    return MaskVolume(mask.labels, mask.notes, mask.class_names)


def _dicom_bits(head: bytes) -> int | None:
    from imaging import dicom_masks

    return dicom_masks.dicom_mask_bits(head)


# Mask file format -> its reader: (file bytes, name for messages, grid) -> MaskVolume on that grid.
MASK_READERS: dict[str, Callable[[bytes, str, VolumeGrid], MaskVolume]] = {
    "nifti": read_nifti_mask,
    "dicom": read_dicom_mask,
}
# Mask file format -> the bits its class ids need, from the file's first bytes (None: unknown):
# the dataset's one mask dtype is decided from these before any shard is written. (A conversion
# stores DICOM masks' labels remapped to its class table, whose size decides instead.)
MASK_BITS: dict[str, Callable[[bytes], int | None]] = {
    "nifti": _nifti_bits,
    "dicom": _dicom_bits,
}


def mask_bits(head: bytes, name: str = "") -> int | None:
    """Bits per class id a mask file needs by its header (8 or 16), from its first bytes; None when unknown."""
    bits = MASK_BITS.get(mask_format(head, name) or "")
    return None if bits is None else bits(head)


def read_mask_volume(data: bytes, name: str, grid: VolumeGrid) -> MaskVolume:
    """A mask file of any format `MASK_READERS` reads, on `grid`.

    Raises:
      ImageRejected: 'mask_unreadable' for a format no reader takes, else the reader's.
    """
    fmt = mask_format(data[:1024], name)
    reader = MASK_READERS.get(fmt or "")
    if reader is None:
        what = f"a {fmt} file" if fmt else "in no format shardsmith reads as a mask volume"
        raise ImageRejected("mask_unreadable", f"mask {name} is {what} (mask volumes are read from "
                            f"{', '.join(sorted(MASK_READERS))})")
    return reader(data, name, grid)

