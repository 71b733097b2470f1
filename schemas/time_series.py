"""The record of a satellite time series: one location's dated passes as one stack.

A location (a field, a tile, a patch of one) seen on T dates in B bands of
H x W pixels is one record (issue 37):

- `stack`: the values, little-endian, C order (time, height, width, bands),
  exactly as in the files (nothing rescaled);
- `stack/dtype`: their numpy dtype name (one of `schemas.RAW_DTYPES`);
- `stack/shape`: (time, height, width, bands), int64 [4];
- `stack/dates`: each time step's date, days since 1970-01-01, ascending;
- `stack/bands`: each band's name ('B02', 'SR_B4', or '1', '2', ... for the
  bands of one multi-band file);
- `epsg`, `geotransform`: as rasters have them (`schemas.EPSG`,
  `schemas.GEOTRANSFORM`), of the stack's pixels (a patch's own corner);
- `label`: the class index (-1 without one), and with per-pixel labels
  `mask` (`schemas.MASK`, a PNG of class ids at height x width);
- `filename`: the location's path relative to --input_dir, POSIX
  separators, with `#patch=Y,X` for a patch.

A plain reader needs nothing of shardsmith:

    parsed = tf.io.parse_single_example(serialized, schema.parse_spec())
    stack = tf.reshape(tf.io.decode_raw(parsed["stack"], tf.uint16), parsed["stack/shape"])

`TimeSeriesExampleSchema` writes, parses and decodes these records, as
`schemas.ImageExampleSchema` does images; the manifest's features say which
kind a dataset holds (`example_kind`).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from schemas.features import (
    EPSG, FILENAME, GEOTRANSFORM, LABEL, MASK, RAW_DTYPES, FeatureSpec, decode_example, encode_example, parse_spec_of,
    raw_itemsize,
)

__all__ = ["STACK", "STACK_DTYPE", "STACK_SHAPE", "STACK_DATES", "STACK_BANDS", "STACK_VALID",
           "STACK_FEATURES", "TIME_SERIES", "StackRecord", "TimeSeriesExampleSchema", "example_kind",
           "days_since_epoch", "date_of_days"]

# The `example_kind` of a manifest whose records are stacks.
TIME_SERIES = "time_series"
_EPOCH = datetime.date(1970, 1, 1)

STACK = FeatureSpec(
    "stack", "bytes",
    "The location's values, little-endian, C order (time, height, width, bands) as stack/shape "
    "says, of stack/dtype, exactly as in the files.",
)
STACK_DTYPE = FeatureSpec("stack/dtype", "bytes",
                          "numpy dtype name of the stack's values (uint16, float32, ...).")
STACK_SHAPE = FeatureSpec("stack/shape", "int64_vector",
                          "(time, height, width, bands) of the stack.", length=4)
STACK_DATES = FeatureSpec("stack/dates", "int64_list",
                          "Each time step's acquisition date, days since 1970-01-01, ascending.")
STACK_BANDS = FeatureSpec("stack/bands", "bytes_list",
                          "Each band's name, in stack order (B02, SR_B4, or 1, 2, ... for the "
                          "bands of one multi-band file).")
STACK_FEATURES = (STACK, STACK_DTYPE, STACK_SHAPE, STACK_DATES, STACK_BANDS)
# Not stored: the reader's boolean [time] mask of the real (not padded) time
# steps, with `max_steps` (readers.time_series_dataset_from_tfrecords).
STACK_VALID = "stack/valid"


def days_since_epoch(date: datetime.date) -> int:
    """A date as days since 1970-01-01 (`stack/dates`)."""
    return (date - _EPOCH).days


def date_of_days(days: int) -> datetime.date:
    """The date of a `stack/dates` value."""
    return _EPOCH + datetime.timedelta(days=int(days))


@dataclasses.dataclass(frozen=True)
class StackRecord:
    """The Python-side values of one stack record, before encoding.

    Attributes:
      stack: The values' bytes, little-endian, C order (time, height, width, bands)
        (bytes, or a contiguous memoryview of them, which is not copied).
      dtype: Their numpy dtype name, one of `schemas.RAW_DTYPES`.
      shape: (time, height, width, bands).
      dates: Days since 1970-01-01 of each time step, ascending.
      bands: The band names.
      label: Class index, -1 without one.
      filename: The location's relative path (`#patch=Y,X` for a patch).
      epsg: EPSG code, 0 when unknown.
      geotransform: GDAL order; None when unknown (stored as six NaNs).
      mask: With per-pixel labels, the class ids as PNG; None otherwise.
    """

    stack: bytes
    dtype: str
    shape: tuple[int, int, int, int]
    dates: tuple[int, ...]
    bands: tuple[str, ...]
    label: int
    filename: str
    epsg: int = 0
    geotransform: tuple[float, ...] | None = None
    mask: bytes | None = None


class TimeSeriesExampleSchema:
    """The features of a stack record; `mask` when the dataset has per-pixel labels.

    Args:
      mask: Whether every record carries `schemas.MASK` (--masks_dir).
    """

    kind = TIME_SERIES

    def __init__(self, mask: bool = False):
        if not isinstance(mask, bool):
            raise ValueError(f"`mask` must be True or False. Received: {mask!r}")
        self.mask = mask
        self.features: tuple[FeatureSpec, ...] = (
            STACK_FEATURES + (LABEL, FILENAME, EPSG, GEOTRANSFORM) + ((MASK,) if mask else ()))

    def __eq__(self, other):
        return isinstance(other, TimeSeriesExampleSchema) and self.features == other.features

    def __hash__(self):
        return hash(self.features)

    def __repr__(self):
        return f"TimeSeriesExampleSchema({[spec.key for spec in self.features]})"

    def __reduce__(self):
        return type(self), (self.mask,)

    @property
    def targets(self) -> tuple[str, ...]:
        """The kinds of target beyond one label (`schemas.TARGET_KINDS` keys)."""
        return ("mask",) if self.mask else ()

    def encode(self, record: StackRecord) -> bytes:
        """Serializes a stack record to `tf.train.Example` bytes, deterministically.

        Raises:
          ValueError: If the values do not fill the shape at the dtype, the
            dates are not one per time step in ascending order, the band
            names not one per band, or a mask is missing or unexpected.
        """
        name = record.filename
        if record.dtype not in RAW_DTYPES:
            raise ValueError(f"Record {name!r}: stacks hold one of {RAW_DTYPES}. Received: {record.dtype!r}")
        shape = tuple(int(v) for v in record.shape)
        if len(shape) != 4 or min(shape) < 1:
            raise ValueError(f"Record {name!r}: stack/shape is (time, height, width, bands), each >= 1. "
                             f"Received: {record.shape!r}")
        t, h, w, b = shape
        if len(record.stack) != t * h * w * b * raw_itemsize(record.dtype):
            raise ValueError(f"Record {name!r}: {len(record.stack)} bytes of values do not fill "
                             f"{shape} of {record.dtype}")
        dates = tuple(int(d) for d in record.dates)
        if len(dates) != t or any(a >= b_ for a, b_ in zip(dates, dates[1:])):
            raise ValueError(f"Record {name!r}: stack/dates must be {t} strictly ascending days. "
                             f"Received: {dates!r}")
        if len(record.bands) != b:
            raise ValueError(f"Record {name!r}: stack/bands must name {b} bands. Received: {record.bands!r}")
        if (record.mask is not None) != self.mask:
            raise ValueError(f"Record {name!r}: this schema "
                             f"{'needs a mask (--masks_dir)' if self.mask else 'takes no mask'}.")
        values = {
            STACK.key: record.stack, STACK_DTYPE.key: record.dtype, STACK_SHAPE.key: shape,
            STACK_DATES.key: dates, STACK_BANDS.key: tuple(record.bands), LABEL.key: record.label,
            FILENAME.key: record.filename, EPSG.key: record.epsg,
            GEOTRANSFORM.key: GEOTRANSFORM.empty_value if record.geotransform is None
            else tuple(float(v) for v in record.geotransform),
        }
        if self.mask:
            values[MASK.key] = record.mask
        return encode_example(self.features, values, name)

    def parse_spec(self, keys=None) -> dict:
        """The `tf.io.parse_example` spec for `keys` (default: every feature).

        Raises:
          ValueError: If a key is not part of the schema.
        """
        return parse_spec_of(self.features, keys)

    def decode(self, serialized: bytes) -> dict[str, Any]:
        """Parses a record in Python (no TensorFlow), checking the schema.

        Bytes features come back as bytes, int64 as int, the shape, dates and
        geotransform as tuples, the band names as a tuple of bytes.

        Raises:
          ValueError: Naming the feature that is missing or of another dtype.
        """
        return decode_example(self.features, serialized)

    @staticmethod
    def array(decoded: Mapping[str, Any]):
        """The numpy array (time, height, width, bands) of a `decode`d record (a read-only view).

        Raises:
          ValueError: If the bytes do not fill the shape at the dtype.
        """
        import numpy as np

        dtype = decoded[STACK_DTYPE.key]
        dtype = dtype.decode("ascii") if isinstance(dtype, bytes) else dtype
        if dtype not in RAW_DTYPES:
            raise ValueError(f"stack/dtype {dtype!r} is not one of {RAW_DTYPES}")
        shape = tuple(decoded[STACK_SHAPE.key])
        data = decoded[STACK.key]
        count = 1
        for v in shape:
            count *= v
        if len(data) != count * raw_itemsize(dtype):
            raise ValueError(f"{len(data)} bytes of stack values do not fill {shape} of {dtype}")
        return np.frombuffer(data, np.dtype(dtype).newbyteorder("<")).reshape(shape)

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {spec.key: spec.to_json() for spec in self.features}

    @classmethod
    def from_json(cls, features: Mapping[str, Any]) -> TimeSeriesExampleSchema:
        """Rebuilds the schema stored in a manifest; raises ValueError naming a mismatch."""
        schema = cls(mask=MASK.key in features)
        for spec in schema.features:
            if spec.key not in features:
                raise ValueError(f"the stored schema lacks the stack feature {spec.key!r}")
            got = {k: v for k, v in dict(features[spec.key]).items() if k != "description"}
            want = {k: v for k, v in spec.to_json().items() if k != "description"}
            if got != want:
                raise ValueError(f"feature {spec.key!r} is stored as {got}, this reader expects {want}")
        unknown = sorted(set(features) - {spec.key for spec in schema.features})
        if unknown:
            raise ValueError(f"the stored schema has features a stack record does not: {unknown}")
        return schema


def example_kind(features: Mapping[str, Any]) -> str:
    """The kind of record a manifest's features describe: TIME_SERIES, or 'image'."""
    return TIME_SERIES if STACK.key in features else "image"
