"""The record of a 3-D volume: one DICOM series stack or one NIfTI file (issue 36).

- `volume`: the voxels, little-endian, C order (depth, height, width): slice k,
  row j, column i;
- `volume/dtype`: their numpy dtype name (int16 when the rescaled values are
  whole numbers, else float32; a NIfTI file's own dtype when it is unscaled);
- `volume/shape`: (depth, height, width), int64 [3];
- `volume/spacing`: (z, y, x) voxel spacing in mm, float64 [3] (z from the
  slice positions, never SliceThickness);
- `volume/affine`: 16 float64, row-major 4x4, mapping (i column, j row,
  k slice, 1) to RAS millimetres, as NIfTI's sform does;
- `volume/modality`: DICOM Modality ('CT', 'MR', ...), '' when unknown;
- `label`: the class index (-1 without one);
- `filename`: the series folder relative to --input_dir, POSIX separators
  (`#series=N` when a folder holds several series), or the NIfTI file;
- `volume/mask` (a dataset converted with --masks_dir only,
  `VOLUME_MASK_SCHEMA`): the class id of each voxel, little-endian, C order
  (depth, height, width) as `volume/shape` says, uint8 or uint16: one dtype per
  dataset, the manifest's `targets.mask.dtype` (its byte count tells it too).

A plain reader needs nothing of shardsmith:

    parsed = tf.io.parse_single_example(serialized, VOLUME_SCHEMA.parse_spec())
    volume = tf.reshape(tf.io.decode_raw(parsed["volume"], tf.int16), parsed["volume/shape"])
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import numpy as np

from schemas.features import (FILENAME, LABEL, FeatureSpec, decode_example, encode_example, encode_example_parts,
                              parse_spec_of)

__all__ = ["VOLUME", "VOLUME_MASK", "VOLUME_MASK_DTYPES", "VOLUME_MASK_SCHEMA", "VOLUME_DTYPE", "VOLUME_SHAPE", "VOLUME_SPACING", "VOLUME_AFFINE",
           "VOLUME_MODALITY", "VOLUME_FEATURES", "VOLUME_DTYPES", "VOLUMES", "VOLUMES_MANIFEST_FILENAME", "VolumeRecord",
           "VolumeExampleSchema", "VOLUME_SCHEMA", "unit_of_volume"]

# The marks a volume's `filename` ends with when its folder gave several volumes
# (`#series=N`, `#stack=k`; conversion.volumes.stack_names writes them).
_VOLUME_MARK = re.compile(r"#(?:series|stack)=.*$")


def unit_of_volume(filename: str) -> str:
    """The series unit of a volume record's `filename`: the name without its `#series=`/`#stack=` mark."""
    return _VOLUME_MARK.sub("", filename)


# The `example_kind` of a manifest whose records are volumes.
VOLUMES = "volumes"
# A volume dataset's manifest (`conversion.volumes.write_manifest`), written last.
VOLUMES_MANIFEST_FILENAME = "volumes.json"
# The dtypes a volume is stored in.
# Those tf.io.decode_raw reads (no uint32).
VOLUME_DTYPES = ("uint8", "int8", "uint16", "int16", "int32", "float32", "float64")

VOLUME = FeatureSpec(
    "volume", "bytes",
    "The voxels, little-endian, C order (depth, height, width) as volume/shape says, of "
    "volume/dtype, after DICOM's RescaleSlope/Intercept or NIfTI's scl_slope/scl_inter.",
)
VOLUME_DTYPE = FeatureSpec("volume/dtype", "bytes", "numpy dtype name of the voxels (int16, float32, ...).")
# int64_list: a record holds exactly 3, checked on encode and decode; parsed
# ragged, a 1-D tensor of 3 for one record.
VOLUME_SHAPE = FeatureSpec("volume/shape", "int64_list", "(depth, height, width) of the volume.")
VOLUME_SPACING = FeatureSpec("volume/spacing", "float64",
                             "(z, y, x) voxel spacing in mm: between slices, rows, columns.", length=3)
VOLUME_AFFINE = FeatureSpec(
    "volume/affine", "float64",
    "Row-major 4x4 float64 mapping (i column, j row, k slice, 1) to RAS mm, as NIfTI's sform.",
    length=16,
)
VOLUME_MODALITY = FeatureSpec("volume/modality", "bytes", "DICOM Modality (CT, MR, ...); '' when unknown.")
VOLUME_FEATURES = (VOLUME, VOLUME_DTYPE, VOLUME_SHAPE, VOLUME_SPACING, VOLUME_AFFINE, VOLUME_MODALITY)
VOLUME_MASK = FeatureSpec(
    "volume/mask", "bytes",
    "Class id of each voxel, little-endian, C order (depth, height, width) as volume/shape says; "
    "uint8 or uint16, one dtype per dataset (the manifest's targets.mask.dtype).",
)
# The dtypes a dataset's masks are stored in (the narrowest every mask's header allows).
VOLUME_MASK_DTYPES = ("uint8", "uint16")


@dataclasses.dataclass(frozen=True)
class VolumeRecord:
    """The Python-side values of one volume record, before encoding.

    Attributes:
      volume: The voxels, (depth, height, width), any byte order (stored
        little-endian, C order).
      spacing: (z, y, x) in mm.
      affine: 4x4 voxel (i, j, k) -> RAS mm.
      label: Class index, -1 without one.
      filename: Series folder or NIfTI file, relative to --input_dir.
      modality: DICOM Modality, '' when unknown.
      mask: With --masks_dir: the class ids, the volume's shape, uint8 or uint16; else None.
    """

    volume: np.ndarray
    spacing: tuple[float, float, float]
    affine: np.ndarray
    label: int
    filename: str
    modality: str = ""
    mask: np.ndarray | None = None


class VolumeExampleSchema:
    """The features of a volume record, their encoding (`encode`) and parsing.

    Args:
      mask: Whether its records hold a label volume (`volume/mask`, --masks_dir).
    """

    kind = VOLUMES

    def __init__(self, mask: bool = False):
        self.mask = bool(mask)
        self.features: tuple[FeatureSpec, ...] = VOLUME_FEATURES + (LABEL, FILENAME) + \
            ((VOLUME_MASK,) if self.mask else ())

    def __eq__(self, other):
        return isinstance(other, VolumeExampleSchema) and other.mask == self.mask

    def __hash__(self):
        return hash(self.features)

    def __repr__(self):
        return f"VolumeExampleSchema({[spec.key for spec in self.features]})"

    def values(self, record: VolumeRecord) -> dict[str, Any]:
        """The record's value of each feature, keyed by feature key.

        Raises:
          ValueError: A volume that is not 3-D, of a dtype outside
            VOLUME_DTYPES, or an affine that is not a finite 4x4.
        """
        volume = np.asarray(record.volume)
        if volume.ndim != 3 or 0 in volume.shape:
            raise ValueError(f"Record {record.filename!r}: a volume is 3-D and not empty. "
                             f"Received shape {volume.shape}")
        if volume.dtype.name not in VOLUME_DTYPES:
            raise ValueError(f"Record {record.filename!r}: volume dtype must be one of "
                             f"{VOLUME_DTYPES}. Received: {volume.dtype.name}")
        affine = np.asarray(record.affine, dtype=np.float64)
        if affine.shape != (4, 4) or not np.isfinite(affine).all():
            raise ValueError(f"Record {record.filename!r}: the affine must be a finite 4x4. "
                             f"Received: {affine!r}")
        little = np.ascontiguousarray(volume.astype(volume.dtype.newbyteorder("<"), copy=False))
        out = {}
        if self.mask:
            mask = None if record.mask is None else np.asarray(record.mask)
            if mask is None or mask.shape != volume.shape or mask.dtype.name not in VOLUME_MASK_DTYPES:
                raise ValueError(f"Record {record.filename!r}: its mask must be {VOLUME_MASK_DTYPES} of the "
                                 f"volume's shape {volume.shape}. Received: "
                                 f"{None if mask is None else (mask.dtype.name, mask.shape)}")
            out[VOLUME_MASK.key] = memoryview(np.ascontiguousarray(
                mask.astype(mask.dtype.newbyteorder("<"), copy=False))).cast("B")
        elif record.mask is not None:
            raise ValueError(f"Record {record.filename!r} has a mask; its schema holds none (VOLUME_MASK_SCHEMA does)")
        return out | {
            # A view, not a copy: the voxels (tens to hundreds of MB) are copied once, into the record.
            VOLUME.key: memoryview(little).cast("B"),
            VOLUME_DTYPE.key: volume.dtype.name,
            VOLUME_SHAPE.key: tuple(int(n) for n in volume.shape),
            VOLUME_SPACING.key: tuple(float(v) for v in record.spacing),
            VOLUME_AFFINE.key: tuple(float(v) for v in affine.ravel()),
            VOLUME_MODALITY.key: record.modality,
            LABEL.key: int(record.label),
            FILENAME.key: record.filename,
        }

    def encode(self, record: VolumeRecord) -> bytes:
        """Serializes a record to `tf.train.Example` bytes, deterministically (keys sorted)."""
        return encode_example(self.features, self.values(record), record.filename)

    def encode_parts(self, record: VolumeRecord) -> list:
        """`encode`'s bytes as consecutive parts, the voxels a view of `record.volume` (not copied)."""
        return encode_example_parts(self.features, self.values(record), record.filename)

    def parse_spec(self, keys=None) -> dict:
        """The `tf.io.parse_example` spec for `keys` (default: every feature)."""
        return parse_spec_of(self.features, keys)

    def finish_parsed(self, parsed: dict) -> dict:
        """Parsed tensors of one record as the reader yields them (affine [4, 4] float64)."""
        tf = _tf()
        out = dict(parsed)
        for spec in self.features:
            if spec.key in out:
                out[spec.key] = spec.finish_parsed(out[spec.key])
        if VOLUME_AFFINE.key in out:
            out[VOLUME_AFFINE.key] = tf.reshape(out[VOLUME_AFFINE.key], [4, 4])
        return out

    def to_json(self) -> dict[str, dict[str, str]]:
        return {spec.key: spec.to_json() for spec in self.features}

    @classmethod
    def from_json(cls, features) -> VolumeExampleSchema:
        """The schema of a manifest's `features` (with `volume/mask` or without).

        Raises:
          ValueError: Naming the features that are not a volume record's.
        """
        schema = cls(mask=VOLUME_MASK.key in features)
        want = schema.to_json()
        if dict(features) != want:
            missing = sorted(set(want) - set(features))
            other = sorted(k for k in features if k not in want or features[k] != want[k])
            raise ValueError(f"not the features of a volume record (missing {missing}, other {other})")
        return schema

    def decode(self, serialized: bytes) -> dict[str, Any]:
        """Parses one record in Python (no graph): the volume as a numpy array.

        Raises:
          ValueError: Naming the feature that is missing or inconsistent.
        """
        out = decode_example(self.features, serialized)
        out[VOLUME_SHAPE.key] = tuple(int(v) for v in out[VOLUME_SHAPE.key])
        shape = out[VOLUME_SHAPE.key]
        dtype = out[VOLUME_DTYPE.key].decode()
        if len(shape) != 3 or dtype not in VOLUME_DTYPES:
            raise ValueError(f"volume/shape {shape} or volume/dtype {dtype!r} is not a volume's")
        raw = out[VOLUME.key]
        if len(raw) != int(np.prod(shape)) * np.dtype(dtype).itemsize:
            raise ValueError(f"volume holds {len(raw)} bytes, not {shape} of {dtype}")
        out[VOLUME.key] = np.frombuffer(raw, np.dtype(dtype).newbyteorder("<")).reshape(shape)
        if self.mask:  # Its dtype is the dataset's; its byte count tells it.
            ids = out[VOLUME_MASK.key]
            width = len(ids) // max(int(np.prod(shape)), 1)
            if width not in (1, 2) or len(ids) != width * int(np.prod(shape)):
                raise ValueError(f"volume/mask holds {len(ids)} bytes, not {shape} of uint8 or uint16")
            out[VOLUME_MASK.key] = np.frombuffer(ids, np.dtype(VOLUME_MASK_DTYPES[width - 1]).newbyteorder("<")).reshape(shape)
        out[VOLUME_AFFINE.key] = np.asarray(out[VOLUME_AFFINE.key]).reshape(4, 4)
        for key in (VOLUME_DTYPE.key, VOLUME_MODALITY.key, FILENAME.key):
            out[key] = os.fsdecode(out[key])
        return out


def _tf():
    from schemas import tf_runtime
    return tf_runtime.full()


VOLUME_SCHEMA = VolumeExampleSchema()
# The records of a volume dataset converted with --masks_dir: each with its `volume/mask`.
VOLUME_MASK_SCHEMA = VolumeExampleSchema(mask=True)
