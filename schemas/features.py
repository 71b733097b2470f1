"""The record format: one spec per feature, shared by the writer and the reader.

Every key, dtype, write-time encoding and read-time parse of a shardsmith record
is defined here and nowhere else. The converter calls `ImageExampleSchema.encode`,
the reader calls `ImageExampleSchema.parse_spec`, verify and inspect call
`ImageExampleSchema.decode`, and tests import the same constants, so the sides
cannot drift apart. All three are driven by the list of specs: a feature is one
`FeatureSpec` (and, for a core feature, a field of `ImageRecord`), and what
depends on a dtype is one entry of `_DTYPES`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import struct
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from schemas import tf_runtime

__all__ = [
    "SCHEMA_VERSION",
    "FeatureSpec",
    "ImageRecord",
    "ImageExampleSchema",
    "parse_spec_of",
    "IMAGE",
    "LABEL",
    "FILENAME",
    "FORMAT",
    "HEIGHT",
    "WIDTH",
    "CHANNELS",
    "IMAGE_SCHEMA",
    "dicom_tag_key",
    "EPSG",
    "GEOTRANSFORM",
    "GEOREF_FEATURES",
    "UNKNOWN_EPSG",
    "georef_values",
    "RAW_FORMAT_PREFIX",
    "RAW_DTYPES",
    "raw_format",
    "parse_raw_format",
    "raw_itemsize",
    "MASK",
    "BBOX_XMIN",
    "BBOX_YMIN",
    "BBOX_XMAX",
    "BBOX_YMAX",
    "BBOX_LABEL",
    "BBOX_IS_CROWD",
    "BOX_FEATURES",
    "OBB_CORNERS",
    "OBB_LABEL",
    "OBB_DIFFICULT",
    "OBB_FEATURES",
    "LABELS",
    "TARGET",
    "TARGET_KINDS",
    "target_features",
    "decode_example",
    "encode_example",
    "encode_example_parts",
]

# Bump when a key, a dtype or an encoding changes; readers refuse versions they
# do not know (see schemas/manifest.py).
SCHEMA_VERSION = 1

_UINT64_MASK = (1 << 64) - 1


# Varints of 0..127: one byte each, the common case (tags, short lengths).
_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))
# Encoded map entries of int and str values kept per feature of a schema (see
# `ImageExampleSchema.encode`), at most this many.
_CACHED_ENTRIES = 1024
_CACHED_TYPES = (int, str)


def _varint(value: int) -> bytes:
    """Protocol buffer base-128 varint of a non-negative int."""
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:  # Two bytes: lengths of small images and of their records.
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_header(field: int, length: int) -> bytes:
    """Tag and length of a length-delimited field (wire type 2) of `length` bytes."""
    return _ONE_BYTE[field << 3 | 2] + _varint(length)


def _bytes_list(key: str, value: Any) -> tuple[bytes, bytes]:
    """BytesList{value (field 1): [value]} as (header, payload)."""
    if isinstance(value, str):
        # The file system encoding, so undecodable file names survive.
        value = os.fsencode(value)
    if isinstance(value, memoryview) and value.contiguous:
        # Not copied here: a stack's values (tens of MB) are joined into the record once.
        value = value.cast("B")
        return _field_header(1, value.nbytes), value
    if not isinstance(value, (bytes, bytearray)):
        raise TypeError(f"Feature {key!r} takes bytes or str. Received: {type(value).__name__}")
    return _field_header(1, len(value)), bytes(value)


def _int64_list(key: str, value: Any) -> tuple[bytes, bytes]:
    """Int64List{value (field 1, packed): [value]} as (header, payload)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Feature {key!r} takes an int. Received: {type(value).__name__}")
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"Feature {key!r} takes a 64-bit int. Received: {value}")
    packed = _varint(value & _UINT64_MASK)
    return _field_header(1, len(packed)) + packed, b""


def _int64_values(key: str, value: Any) -> tuple[bytes, bytes]:
    """Int64List{value (field 1, packed): values} as (header, payload); any count, 0 too."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"Feature {key!r} takes a list of ints. Received: {type(value).__name__}")
    packed = bytearray()
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            # numpy integers are ints to the user: accepted, as exact Python ints.
            if not hasattr(v, "__index__") or isinstance(v, bool):
                raise TypeError(f"Feature {key!r} takes a list of ints. Received: {v!r}")
            v = int(v)
        if not -(1 << 63) <= v < (1 << 63):
            raise ValueError(f"Feature {key!r} takes 64-bit ints. Received: {v}")
        packed += _varint(v & _UINT64_MASK)
    if not packed:
        return b"", b""  # Int64List{}: an empty message.
    return _field_header(1, len(packed)), bytes(packed)


def _float32_values(key: str, value: Any) -> tuple[bytes, bytes]:
    """FloatList{value (field 1, packed): values} as (header, payload); any count, 0 too.

    float32, as `tf.train.FloatList` holds: box corners normalised to [0, 1]
    and regression targets need no more (a value is rounded to the nearest
    float32, which is what the reader yields).
    """
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"Feature {key!r} takes a list of floats. Received: {type(value).__name__}")
    value = list(value)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__")
           for v in value):
        raise TypeError(f"Feature {key!r} takes a list of floats. Received: {value!r}")
    if not value:
        return b"", b""
    try:
        payload = struct.pack(f"<{len(value)}f", *map(float, value))
    except OverflowError as e:
        raise ValueError(f"Feature {key!r}: a value does not fit in float32. Received: {value!r}") from e
    return _field_header(1, len(payload)), payload


def _bytes_values(key: str, value: Any) -> tuple[bytes, bytes]:
    """BytesList{value (field 1): values} as (header, payload); any count, 0 too.

    Each value is its own field (bytes are never packed); str values are
    encoded with the file system encoding, as single bytes features are.
    """
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"Feature {key!r} takes a list of bytes or str. Received: {type(value).__name__}")
    parts = []
    for v in value:
        header, payload = _bytes_list(key, v)
        parts += (header, payload)
    return b"", b"".join(parts)


def _int64_vector(key: str, value: Any, length: int) -> tuple[bytes, bytes]:
    """Int64List{value (packed): exactly `length` ints} as (header, payload)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"Feature {key!r} takes {length} ints. Received: {type(value).__name__}")
    if len(value) != length:
        raise ValueError(f"Feature {key!r} takes {length} ints. Received: {len(value)}")
    return _int64_values(key, value)


def _int64_vector_parsed(parsed, length: int):
    """A parsed int64 vector feature as int64 of shape S + [length] (`FixedLenFeature([length])`)."""
    return parsed


def _int64_vector_decoded(key: str, values, length: int) -> tuple[int, ...]:
    if len(values) != length:
        raise ValueError(f"feature {key!r} holds {len(values)} ints, not {length}")
    return tuple(int(v) for v in values)


def _list_parse_spec(tf, tf_name: str):
    """Variable-length lists: ragged across a batch, a 1-D tensor for one record."""
    return tf.io.RaggedFeature(getattr(tf, tf_name), row_splits_dtype=tf.int64)


def _float64_bytes(key: str, value: Any, length: int) -> bytes:
    """`length` floats as little-endian IEEE 754 float64 bytes."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"Feature {key!r} takes {length} floats. Received: {type(value).__name__}")
    if len(value) != length:
        raise ValueError(f"Feature {key!r} takes {length} floats. Received: {len(value)}")
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise TypeError(f"Feature {key!r} takes {length} floats. Received: {list(value)!r}")
    return struct.pack(f"<{length}d", *value)


def _float64_list(key: str, value: Any, length: int) -> tuple[bytes, bytes]:
    """BytesList{value: [<length> little-endian float64]} as (header, payload).

    Why bytes and not FloatList: `tf.train.Example`'s only float type is
    FloatList, which holds float32 (24-bit mantissa). A geotransform's
    origin in metres (UTM eastings ~500000.123, northings ~5000000.5) does
    not survive float32 (500000.123 -> 500000.125), and a value changed
    without saying so is what this schema never does. So float64 features
    are one bytes value of their doubles, read back with
    `tf.io.decode_raw(value, tf.float64)` (`FeatureSpec.finish_parsed`).
    """
    return _bytes_list(key, _float64_bytes(key, value, length))


def _float64_parsed(parsed, length: int):
    """A parsed float64 feature (bytes, any batch shape S) as float64 of shape S + [length]."""
    tf = tf_runtime.full()
    values = tf.io.decode_raw(parsed, tf.float64, little_endian=True)
    # Checked and static: a record of another length fails here, not later.
    return tf.ensure_shape(values, parsed.shape.concatenate([length]))


def _float64_decoded(key: str, raw: bytes, length: int) -> tuple[float, ...]:
    if len(raw) != 8 * length:
        raise ValueError(f"feature {key!r} holds {len(raw)} bytes, not {length} float64")
    return struct.unpack(f"<{length}d", raw)


@dataclasses.dataclass(frozen=True)
class _Dtype:
    """Everything that depends on a schema dtype: writing, parsing and reading back.

    Attributes:
      tf_name: The TensorFlow dtype it is parsed as (`tf.io.FixedLenFeature`).
      kind: The `tf.train.Feature` oneof field that holds it (`decode`).
      field: That field's number (`encode`).
      wire_list: (key, value, length) -> the list message as (header, payload).
      empty: length -> a value that any record may hold (placeholders).
      finish: (parsed tensor, length) -> the tensor the reader yields.
      decoded: (key, the one stored value, length) -> its Python value.
      out_name: The TensorFlow dtype the reader yields.
      sized: Whether the feature has a fixed `length` of values.
      listed: Whether a record holds any number of values (0 too): parsed
        as `tf.io.RaggedFeature`, read back in Python as a tuple.
      vector: Whether a record holds exactly `length` values of the list
        (parsed as `tf.io.FixedLenFeature([length])`); `sized` too.
    """

    tf_name: str
    kind: str
    field: int
    wire_list: Callable[[str, Any, int | None], tuple[bytes, bytes]]
    empty: Callable[[int | None], Any]
    finish: Callable[[Any, int | None], Any] = lambda parsed, length: parsed
    decoded: Callable[[str, Any, int | None], Any] = lambda key, value, length: value
    out_name: str | None = None
    sized: bool = False
    listed: bool = False
    vector: bool = False


# Schema dtype -> how it is written and read. A new dtype is one entry here.
_DTYPES = {
    "bytes": _Dtype("string", "bytes_list", 1, lambda k, v, n: _bytes_list(k, v), lambda n: b""),
    "int64": _Dtype("int64", "int64_list", 3, lambda k, v, n: _int64_list(k, v), lambda n: 0),
    # A fixed number of float64 values in one bytes value (see `_float64_list`).
    "float64": _Dtype("string", "bytes_list", 1, _float64_list, lambda n: (math.nan,) * n,
                      _float64_parsed, _float64_decoded, out_name="float64", sized=True),
    # Any number of values per record (targets: boxes, several labels, numbers).
    "int64_list": _Dtype("int64", "int64_list", 3, lambda k, v, n: _int64_values(k, v), lambda n: (),
                         decoded=lambda key, values, length: tuple(int(v) for v in values), listed=True),
    "float32_list": _Dtype("float32", "float_list", 2, lambda k, v, n: _float32_values(k, v),
                           lambda n: (), decoded=lambda key, values, length: tuple(values), listed=True),
    # Any number of bytes values per record (the band names of a stack).
    "bytes_list": _Dtype("string", "bytes_list", 1, lambda k, v, n: _bytes_values(k, v), lambda n: (),
                         decoded=lambda key, values, length: tuple(bytes(v) for v in values), listed=True),
    # Exactly `length` ints per record (the shape of a stack).
    "int64_vector": _Dtype("int64", "int64_list", 3, _int64_vector, lambda n: (0,) * n,
                           _int64_vector_parsed, _int64_vector_decoded, sized=True, vector=True),
}


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One feature of a record: its key, dtype, encoding and parsing.

    Attributes:
      key: The key in `tf.train.Example.features`.
      dtype: 'bytes', 'int64' or 'float64' (one value each), 'int64_vector'
        (exactly `length` ints), or 'int64_list', 'float32_list' or
        'bytes_list' (any number of values, 0 too); read
        as tf.string, tf.int64, tf.float64 (float64: `length` values in one
        little-endian bytes value, see `_float64_list`), or ragged tf.int64
        and tf.float32 lists (`tf.io.RaggedFeature`: a 1-D tensor for one
        record, a RaggedTensor for a batch).
      description: What the value means, stored in the manifest for humans.
      length: For 'float64', the number of values (the reader yields shape
        [length]); None for the scalar dtypes.
    """

    key: str
    dtype: str
    description: str
    length: int | None = None

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise ValueError(
                f"`dtype` of feature {self.key!r} must be one of {tuple(_DTYPES)}. "
                f"Received: dtype={self.dtype!r}"
            )
        sized = _DTYPES[self.dtype].sized
        if sized != (isinstance(self.length, int) and not isinstance(self.length, bool)
                     and self.length >= 1):
            raise ValueError(
                f"`length` of feature {self.key!r} must be "
                f"{'a count of values >= 1' if sized else 'None'} for dtype {self.dtype!r}. "
                f"Received: length={self.length!r}"
            )

    def encode(self, value: Any) -> bytes:
        """Encodes one Python value as a serialized `tf.train.Feature`.

        The wire format is written directly: TensorFlow's Python API is not
        needed to write records (the converter does not load it), and the
        bytes equal those of `tf.train.Feature(...).SerializeToString()`
        (tests/test_schemas.py compares them).

        Args:
          value: bytes or str for 'bytes' features (str is encoded with the
            file system encoding, so undecodable file names survive), int for
            'int64' features, a sequence of `length` floats for 'float64'.

        Returns:
          The serialized feature message.

        Raises:
          TypeError: If the value does not fit the dtype.
          ValueError: If an int does not fit in 64 bits.
        """
        header, payload = self._wire_parts(value)
        return header + payload

    def _wire_parts(self, value: Any) -> tuple[bytes, bytes]:
        """The serialized feature as (header, payload): small framing, then the value.

        Kept apart so a record is joined once: an image's bytes are copied a
        single time whatever the nesting of the messages around them.
        """
        dtype = _DTYPES[self.dtype]
        header, payload = dtype.wire_list(self.key, value, self.length)
        return _field_header(dtype.field, len(header) + len(payload)) + header, payload

    def parse_spec(self):
        """The parse spec of this feature for `tf.io.parse_example` (see `finish_parsed`)."""
        tf = tf_runtime.full()
        dtype = _DTYPES[self.dtype]
        if dtype.listed:
            return _list_parse_spec(tf, dtype.tf_name)
        if dtype.vector:
            return tf.io.FixedLenFeature([self.length], getattr(tf, dtype.tf_name))
        return tf.io.FixedLenFeature([], getattr(tf, dtype.tf_name))

    @property
    def listed(self) -> bool:
        """Whether a record holds any number of values of this feature (ragged when batched)."""
        return _DTYPES[self.dtype].listed

    def finish_parsed(self, parsed):
        """The parsed tensor (shape S) as the reader yields it: float64 S + [length] for
        'float64' features, the tensor itself for the others."""
        return _DTYPES[self.dtype].finish(parsed, self.length)

    @property
    def empty_value(self) -> Any:
        """A value of this feature's dtype (b'', 0, NaNs, no values), for placeholder records."""
        return _DTYPES[self.dtype].empty(self.length)

    @property
    def tf_dtype(self):
        """The dtype of the tensor the reader yields."""
        dtype = _DTYPES[self.dtype]
        return getattr(tf_runtime.full(), dtype.out_name or dtype.tf_name)

    def to_json(self) -> dict[str, Any]:
        d = {"dtype": self.dtype, "description": self.description}
        if self.length is not None:  # Only then: older manifests keep their bytes.
            d["length"] = self.length
        return d


IMAGE = FeatureSpec(
    "image", "bytes", "Encoded image bytes (JPEG or PNG), decodable by tf.io.decode_image."
)
LABEL = FeatureSpec("label", "int64", "Index into the manifest's class_names (0-based).")
FILENAME = FeatureSpec(
    "filename", "bytes", "Path relative to the input root, POSIX separators."
)
FORMAT = FeatureSpec("format", "bytes", "Format of the stored image bytes: 'jpeg' or 'png' "
                     "(encoded), or 'raw-<dtype>' (e.g. 'raw-uint16': raster samples stored raw).")
HEIGHT = FeatureSpec("height", "int64", "Image height in pixels, as decoded.")
WIDTH = FeatureSpec("width", "int64", "Image width in pixels, as decoded.")
CHANNELS = FeatureSpec("channels", "int64", "Channels of the decoded image (1, 3 or 4).")

# GeoTIFF georeferencing (--raster_georef): optional, every record of such a
# dataset carries both. "Unknown" is explicit, never a guess: EPSG 0 (no EPSG
# code is 0) and a geotransform of six NaNs (no real one has a NaN) for
# records without georeferencing: non-TIFF images, TIFFs without the tags,
# or a CRS the file defines itself (user-defined, GeoKey value 32767) rather
# than by EPSG code (its geotransform is still kept).
UNKNOWN_EPSG = 0
EPSG = FeatureSpec(
    "epsg", "int64",
    "EPSG code of the coordinate reference system (ProjectedCSTypeGeoKey, else "
    "GeographicTypeGeoKey); 0 when unknown.",
)
GEOTRANSFORM = FeatureSpec(
    "geotransform", "float64",
    "GDAL geotransform (x0, dx, rx, y0, ry, dy) of the stored pixels, float64 "
    "(X = x0 + col*dx + row*rx, Y = y0 + col*ry + row*dy, at the top-left pixel "
    "corner); six NaNs when unknown.",
    length=6,
)
GEOREF_FEATURES = (EPSG, GEOTRANSFORM)


def georef_values(epsg: int = UNKNOWN_EPSG, geotransform=None) -> dict[str, Any]:
    """The georef features of one record, keyed by feature key (`ImageRecord.extra`).

    Args:
      epsg: The EPSG code, or UNKNOWN_EPSG.
      geotransform: The six GDAL-order floats, or None when unknown.
    """
    if geotransform is None:
        geotransform = GEOTRANSFORM.empty_value
    return {EPSG.key: epsg, GEOTRANSFORM.key: tuple(geotransform)}


# Targets beyond one class (--masks_dir, --annotations, a labels CSV with
# several labels or numbers): optional groups of features, each carried by
# every record of a dataset that has that kind of target. Values go in
# `ImageRecord.extra` under these keys; the manifest's `targets` section
# says what the values mean (mask dtype, box class names, ...).
MASK = FeatureSpec(
    "mask", "bytes",
    "Single-channel PNG of the class id of each pixel, the image's height and width; 8-bit, "
    "or 16-bit for every mask of the dataset when the manifest's targets.mask.dtype is uint16.",
)
BBOX_XMIN = FeatureSpec("bbox/xmin", "float32_list",
                        "Left edge of each box, as a fraction of the stored image's width.")
BBOX_YMIN = FeatureSpec("bbox/ymin", "float32_list",
                        "Top edge of each box, as a fraction of the stored image's height.")
BBOX_XMAX = FeatureSpec("bbox/xmax", "float32_list",
                        "Right edge of each box, as a fraction of the stored image's width.")
BBOX_YMAX = FeatureSpec("bbox/ymax", "float32_list",
                        "Bottom edge of each box, as a fraction of the stored image's height.")
BBOX_LABEL = FeatureSpec("bbox/label", "int64_list",
                         "Class of each box: index into the manifest's targets.boxes.class_names.")
BBOX_IS_CROWD = FeatureSpec("bbox/is_crowd", "int64_list",
                            "1 where a box covers a crowd (COCO iscrowd) or is marked difficult "
                            "(VOC), else 0; one per box.")
BOX_FEATURES = (BBOX_XMIN, BBOX_YMIN, BBOX_XMAX, BBOX_YMAX, BBOX_LABEL, BBOX_IS_CROWD)
# Oriented boxes (--boxes oriented): one flat list of 8 numbers per box, not 8 lists as the axis
# boxes' 4: a box's corners travel together (no lists of different lengths to check), and a
# reader reshapes the one list to [n, 4, 2]. The corners keep the annotation's point order.
OBB_CORNERS = FeatureSpec("obb/corners", "float32_list",
                          "Corners of each oriented box, 8 numbers per box: x1, y1, x2, y2, x3, y3, x4, y4 "
                          "as fractions of the stored image's width (x) and height (y), in the "
                          "annotation's point order (DOTA's: clockwise on the image from its first point); "
                          "corners may lie outside [0, 1] where the annotation's did.")
OBB_LABEL = FeatureSpec("obb/label", "int64_list",
                        "Class of each oriented box: index into the manifest's targets.oriented_boxes.class_names.")
OBB_DIFFICULT = FeatureSpec("obb/difficult", "int64_list",
                            "1 where an oriented box is marked difficult (DOTA), else 0; one per box.")
OBB_FEATURES = (OBB_CORNERS, OBB_LABEL, OBB_DIFFICULT)
LABELS = FeatureSpec("labels", "int64_list",
                     "Every class of the image (multi-label): indices into class_names, sorted, "
                     "each once.")
TARGET = FeatureSpec("target", "float32_list",
                     "Numeric targets of the image (regression), as many as the manifest's "
                     "targets.target.length.")
# Kind of target -> its features, in the order `ImageExampleSchema` lists them.
TARGET_KINDS: Mapping[str, tuple[FeatureSpec, ...]] = {
    "mask": (MASK,),
    "boxes": BOX_FEATURES,
    "oriented_boxes": OBB_FEATURES,
    "labels": (LABELS,),
    "target": (TARGET,),
}


def _target_specs() -> tuple[FeatureSpec, ...]:
    """Every kind's target features, from `TARGET_KINDS` as it is at the call."""
    return tuple(spec for specs in TARGET_KINDS.values() for spec in specs)


def target_features(kinds) -> tuple[FeatureSpec, ...]:
    """The features of the target `kinds` (keys of TARGET_KINDS), in schema order.

    Raises:
      ValueError: Naming a kind that is not one of TARGET_KINDS.
    """
    unknown = sorted(set(kinds) - set(TARGET_KINDS))
    if unknown:
        raise ValueError(f"Targets are among {sorted(TARGET_KINDS)}. Received: {unknown}")
    return tuple(spec for kind in TARGET_KINDS if kind in kinds for spec in TARGET_KINDS[kind])


@dataclasses.dataclass(frozen=True)
class ImageRecord:
    """The Python-side values of one record, before encoding.

    One field per core feature (`ImageExampleSchema._CORE`), named by its key.
    """

    image: bytes
    label: int
    filename: str
    format: str
    height: int
    width: int
    channels: int
    # Optional features (chosen DICOM tags as strings, georeferencing from
    # `georef_values`, targets: TARGET_KINDS), keyed by feature key; the
    # schema must declare each.
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def parse_spec_of(features, keys=None) -> dict:
    """The `tf.io.parse_example` spec of a schema's `features` for `keys` (default: every one).

    One definition for every record kind's schema (images, volumes, stacks).

    Raises:
      ValueError: If a key is not part of the schema.
    """
    by_key = {spec.key: spec for spec in features}
    keys = list(by_key) if keys is None else list(keys)
    unknown = [k for k in keys if k not in by_key]
    if unknown:
        raise ValueError(f"Unknown feature keys {unknown}; the schema has {list(by_key)}.")
    return {k: by_key[k].parse_spec() for k in keys}


class ImageExampleSchema:
    """The ordered set of feature specs that make up a shardsmith record.

    Args:
      extra_string_features: Keys of optional string features (e.g. DICOM tags
        the user asked for) that every record of the dataset carries.
      georef: Whether every record carries GEOREF_FEATURES (--raster_georef).
      targets: The kinds of target (keys of TARGET_KINDS: 'mask', 'boxes',
        'labels', 'target') whose features every record carries.

    Attributes:
      targets: The kinds of target, sorted.
    """

    _CORE = (IMAGE, LABEL, FILENAME, FORMAT, HEIGHT, WIDTH, CHANNELS)

    def __init__(self, extra_string_features: tuple[str, ...] = (), georef: bool = False,
                 targets: tuple[str, ...] = ()):
        reserved = {spec.key for spec in self._CORE + GEOREF_FEATURES + _target_specs()}
        clashes = sorted(set(extra_string_features) & reserved)
        if clashes:
            raise ValueError(
                f"Extra features may not reuse the core keys or georef keys {sorted(reserved)}. "
                f"Received: {clashes}"
            )
        self.georef = bool(georef)
        target_specs = target_features(targets)
        self.targets = tuple(sorted(set(targets)))
        self.extra = tuple(
            FeatureSpec(key, "bytes", "Extra string feature.")
            # Sorted, so the schema rebuilt from a manifest equals the original.
            for key in sorted(extra_string_features)
        ) + (GEOREF_FEATURES if self.georef else ()) + target_specs
        self.features: tuple[FeatureSpec, ...] = self._CORE + self.extra
        # Encoding order (see `encode`), each spec with its map entry's key
        # field (field 1: the key), which is the same in every record.
        self._encoding_order = tuple(
            (spec, _field_header(1, len(key)) + key)
            for spec, key in sorted(((spec, spec.key.encode()) for spec in self.features),
                                    key=lambda pair: pair[1])
        )
        # What `encode` needs of each feature, looked up once here rather than
        # per record: (spec, is core, map entry's key field, its dtype's
        # wire_list, the Feature tag of that dtype's list, kept entries).
        core = set(self._CORE)
        self._encoders = tuple(
            (spec, spec in core, key_field, _DTYPES[spec.dtype].wire_list,
             _ONE_BYTE[_DTYPES[spec.dtype].field << 3 | 2], {})
            for spec, key_field in self._encoding_order
        )

    def __reduce__(self):
        # Rebuilt from its arguments when pickled (Beam ships schemas to its
        # workers): the encoders table holds plain functions and per-process
        # caches of encoded entries, which are neither picklable nor worth sending.
        return type(self), (self.string_features, self.georef, self.targets)

    @property
    def string_features(self) -> tuple[str, ...]:
        """Keys of the extra string features (DICOM tags), sorted."""
        return tuple(spec.key for spec in self.extra
                     if spec not in GEOREF_FEATURES and spec not in _target_specs())

    def __eq__(self, other):
        return isinstance(other, ImageExampleSchema) and self.features == other.features

    def __hash__(self):
        return hash(self.features)

    def __repr__(self):
        return f"ImageExampleSchema({[spec.key for spec in self.features]})"

    def encode(self, record: ImageRecord) -> bytes:
        """Serializes a record to `tf.train.Example` bytes, deterministically.

        Raises:
          ValueError: If the record misses an extra feature the schema declares,
            naming the feature.
        """
        extra = record.extra
        for spec in self.extra:
            if spec.key not in extra:
                raise ValueError(
                    f"Record {record.filename!r} has no value for feature {spec.key!r}."
                )
        parts = []
        size = 0
        # Map entries sorted by key bytes, so the same input gives the same
        # shard bytes on every run, whatever the protobuf release. This is why
        # records are not built with protobuf's `SerializeToString(
        # deterministic=True)`: its upb backend (protobuf 6.33) writes a key
        # after its longer extensions ('dicom_Manufacturer' after
        # 'dicom_ManufacturerModelName', both --dicom_tags), unlike its
        # pure-Python backend (checked: byte order, as here) and C++'s
        # std::string order, and upb's order is being changed upstream
        # (protocolbuffers/protobuf#26621); each would change shard bytes.
        # Measured (bench/encode.py): 18 vs 11 us per 5 KB record, 22 vs 27
        # us at 150 KB, against milliseconds to validate the image.
        for spec, is_core, key_field, wire_list, list_tag, entries in self._encoders:
            # ImageRecord has one field per core feature, named by its key.
            value = getattr(record, spec.key) if is_core else extra[spec.key]
            # Labels, sizes, channels and formats take few values: the whole
            # map entry of an int or a str is kept (exactly: True == 1 must
            # still be refused, and equal values of these types encode alike).
            cacheable = type(value) in _CACHED_TYPES
            if cacheable:
                entry = entries.get(value)
                if entry is not None:
                    parts.append(entry)
                    size += len(entry)
                    continue
            try:
                header, payload = wire_list(spec.key, value, spec.length)
            except (TypeError, ValueError) as e:
                raise type(e)(f"Record {record.filename!r}: {e}") from e
            # The Feature message: its list (field `list_tag`), then the
            # Features.feature map entry (field 1): key (field 1), value
            # (field 2), each a length-delimited field.
            list_size = len(header) + len(payload)
            header = list_tag + _varint(list_size) + header
            value_size = len(header) + len(payload)
            entry = key_field + b"\x12" + _varint(value_size)
            head = b"\n" + _varint(len(entry) + value_size) + entry + header
            if cacheable and len(entries) < _CACHED_ENTRIES:
                entries[value] = head + payload
            parts += (head, payload)
            size += len(head) + len(payload)
        # Example.features (field 1).
        parts.insert(0, _field_header(1, size))
        return b"".join(parts)

    def parse_spec(self, keys=None) -> dict:
        """The `tf.io.parse_example` spec for `keys` (default: every feature).

        Raises:
          ValueError: If a key is not part of the schema.
        """
        return parse_spec_of(self.features, keys)

    def to_json(self) -> dict[str, dict[str, str]]:
        return {spec.key: spec.to_json() for spec in self.features}

    def decode(self, serialized: bytes) -> dict[str, Any]:
        """Parses serialized Example bytes in Python (no graph), checking the schema.

        The Python twin of `parse_spec`, for tools that look at single records
        (verify, inspect). Bytes features come back as bytes, int64 as int,
        float64 as a tuple of `length` floats.

        Raises:
          ValueError: Naming the feature that is missing, of another dtype, or
            not exactly one value.
        """
        return decode_example(self.features, serialized)

    @classmethod
    def from_json(cls, features: Mapping[str, Any]) -> ImageExampleSchema:
        """Rebuilds the schema stored in a manifest; raises ValueError on mismatch."""
        core = {spec.key: spec.to_json() for spec in cls._CORE}
        missing = [k for k in core if k not in features]
        if missing:
            raise ValueError(f"the stored schema lacks the core features {missing}")
        for key, want in core.items():
            got = dict(features[key])
            if got.get("dtype") != want["dtype"]:
                raise ValueError(
                    f"feature {key!r} is stored as {got.get('dtype')!r}, "
                    f"this reader expects {want['dtype']!r}"
                )
        georef = {spec.key: spec.to_json() for spec in GEOREF_FEATURES}
        present = [k for k in georef if k in features]
        if present and len(present) != len(georef):
            raise ValueError(f"the stored schema has {present} of the georef features {list(georef)}")
        for key in present:
            got = {k: v for k, v in dict(features[key]).items() if k != "description"}
            want = {k: v for k, v in georef[key].items() if k != "description"}
            if got != want:
                raise ValueError(f"feature {key!r} is stored as {got}, this reader expects {want}")
        kinds = []
        for kind, specs in TARGET_KINDS.items():
            found = [spec.key for spec in specs if spec.key in features]
            if found and len(found) != len(specs):
                raise ValueError(f"the stored schema has {found} of the {kind!r} target features "
                                 f"{[spec.key for spec in specs]}")
            for spec in specs if found else ():
                got = dict(features[spec.key]).get("dtype")
                if got != spec.dtype:
                    raise ValueError(f"feature {spec.key!r} is stored as {got!r}, "
                                     f"this reader expects {spec.dtype!r}")
            if found:
                kinds.append(kind)
        targets = {spec.key for spec in _target_specs()}
        extra = tuple(sorted(k for k in features if k not in core and k not in georef
                             and k not in targets))
        return cls(extra_string_features=extra, georef=bool(present), targets=tuple(kinds))


IMAGE_SCHEMA = ImageExampleSchema()


def decode_example(specs, serialized: bytes) -> dict[str, Any]:
    """Parses serialized Example bytes in Python against `specs` (every one required).

    What `ImageExampleSchema.decode` and the other kinds of record share.

    Raises:
      ValueError: Naming the feature that is missing, of another dtype, or
        not the number of values its dtype holds.
    """
    try:
        example = _example_class().FromString(serialized)
    except message.DecodeError as e:
        raise ValueError(f"not a tf.train.Example ({type(e).__name__})") from e
    features = example.features.feature
    out = {}
    for spec in specs:
        if spec.key not in features:
            raise ValueError(f"feature {spec.key!r} is missing")
        feature = features[spec.key]
        kind = feature.WhichOneof("kind")
        dtype = _DTYPES[spec.dtype]
        if kind is None and dtype.listed:
            # A Feature with no list set: what some writers give an empty list.
            out[spec.key] = ()
            continue
        if kind != dtype.kind:
            raise ValueError(f"feature {spec.key!r} is {kind}, the schema says {dtype.kind}")
        values = getattr(feature, kind).value
        if dtype.listed or dtype.vector:
            out[spec.key] = dtype.decoded(spec.key, values, spec.length)
            continue
        if len(values) != 1:
            raise ValueError(f"feature {spec.key!r} has {len(values)} values, not 1")
        out[spec.key] = dtype.decoded(spec.key, values[0], spec.length)
    return out


def encode_example(specs, values: Mapping[str, Any], name: str) -> bytes:
    """Serializes `values` (one per spec, by key) as `tf.train.Example` bytes (`encode_example_parts`, joined)."""
    return b"".join(encode_example_parts(specs, values, name))


def encode_example_parts(specs, values: Mapping[str, Any], name: str) -> list:
    """The serialized `tf.train.Example` of `values` as its consecutive parts, deterministically.

    The plain form of `ImageExampleSchema.encode` (no cached entries): map
    entries sorted by key bytes, each feature's list written directly. For
    records of few, large features (stacks, volumes), where caching saves
    nothing. The parts are not joined: a large value given as a buffer (a
    volume's voxels) stays that buffer, so that a writer can frame and write
    the record without another copy of it (`schemas.tfrecord.frame_parts`).

    Args:
      specs: The features, every one required.
      values: Feature key -> value.
      name: How errors name the record (its filename).

    Raises:
      ValueError, TypeError: Naming the record and the feature that is
        missing or does not fit its dtype.
    """
    parts = []
    size = 0
    for spec in sorted(specs, key=lambda s: s.key.encode()):
        if spec.key not in values:
            raise ValueError(f"Record {name!r} has no value for feature {spec.key!r}.")
        try:
            header, payload = spec._wire_parts(values[spec.key])
        except (TypeError, ValueError) as e:
            raise type(e)(f"Record {name!r}: {e}") from e
        key = spec.key.encode()
        entry = _field_header(1, len(key)) + key + b"\x12" + _varint(len(header) + len(payload))
        head = b"\n" + _varint(len(entry) + len(header) + len(payload)) + entry + header
        parts += (head, payload)
        size += len(head) + len(payload)
    parts.insert(0, _field_header(1, size))
    return parts


@functools.cache
def _example_class() -> type[message.Message]:
    """`tf.train.Example`'s message class, built without TensorFlow.

    From TensorFlow's example.proto and feature.proto (same names, fields and
    numbers), in a pool of its own: registering `tensorflow.Example` in
    protobuf's default pool would clash with TensorFlow's own registration
    when both are loaded in one process.
    """
    file = descriptor_pb2.FileDescriptorProto(
        name="shardsmith/example.proto", package="tensorflow", syntax="proto3"
    )
    fields = descriptor_pb2.FieldDescriptorProto
    optional, repeated = fields.LABEL_OPTIONAL, fields.LABEL_REPEATED

    def add(owner, name, number, type_, label=optional, type_name=None, oneof=None):
        field = owner.field.add(name=name, number=number, type=type_, label=label)
        if type_name:
            field.type_name = type_name
        if oneof is not None:
            field.oneof_index = oneof
        return field

    for name, type_ in (("BytesList", fields.TYPE_BYTES), ("FloatList", fields.TYPE_FLOAT),
                        ("Int64List", fields.TYPE_INT64)):
        add(file.message_type.add(name=name), "value", 1, type_, repeated)
    feature = file.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, name in enumerate(("bytes_list", "float_list", "int64_list"), start=1):
        list_type = ".tensorflow." + name.title().replace("_", "")
        add(feature, name, number, fields.TYPE_MESSAGE, type_name=list_type, oneof=0)
    features = file.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    add(entry, "key", 1, fields.TYPE_STRING)
    add(entry, "value", 2, fields.TYPE_MESSAGE, type_name=".tensorflow.Feature")
    add(features, "feature", 1, fields.TYPE_MESSAGE, repeated,
        type_name=".tensorflow.Features.FeatureEntry")
    example = file.message_type.add(name="Example")
    add(example, "features", 1, fields.TYPE_MESSAGE, type_name=".tensorflow.Features")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


# Raw rasters (schema-level contract shared by the converter and the reader).
# Images that PNG cannot hold losslessly in a way TF decodes (more than 4 or
# exactly 2 bands, signed, 32-bit, float) are stored as their array's bytes:
# `image` holds the array little-endian in C order, shape (height, width,
# channels) as the `height`, `width` and `channels` features say, and `format`
# is RAW_FORMAT_PREFIX + the numpy dtype name, e.g. 'raw-uint16', 'raw-float32'.
# A plain reader parses it with tf.io.decode_raw(image, dtype) and tf.reshape.
RAW_FORMAT_PREFIX = "raw-"
# Sample types a raw record may have, with their sizes in bytes.
_RAW_ITEMSIZE = {
    "uint8": 1, "uint16": 2, "int16": 2, "uint32": 4, "int32": 4, "float32": 4, "float64": 8,
}
RAW_DTYPES = tuple(_RAW_ITEMSIZE)
# `raw_format` of the dtype names and of the numpy dtypes met so far (at most
# _KEPT_RAW_FORMATS), looked up rather than computed: numpy computes
# `dtype.name` in Python (~10 us), and the converter asks once per raw record.
_RAW_FORMATS: dict[Any, str] = {name: RAW_FORMAT_PREFIX + name for name in RAW_DTYPES}
_KEPT_RAW_FORMATS = 64


def raw_format(dtype) -> str:
    """The `format` value of a raw record of `dtype` (a name, or a numpy dtype).

    Raises:
      ValueError: If the dtype is not one of RAW_DTYPES.
    """
    try:
        return _RAW_FORMATS[dtype]
    except (KeyError, TypeError):  # TypeError: unhashable.
        pass
    name = getattr(dtype, "name", dtype)
    if name not in _RAW_ITEMSIZE:
        raise ValueError(f"Raw records hold one of {RAW_DTYPES}. Received: dtype={dtype!r}")
    fmt = RAW_FORMAT_PREFIX + name
    if len(_RAW_FORMATS) < _KEPT_RAW_FORMATS:
        _RAW_FORMATS[dtype] = fmt
    return fmt


def parse_raw_format(fmt: str | bytes) -> str | None:
    """The dtype name of a raw record's `format` ('raw-uint16' -> 'uint16'); None if not raw.

    Raises:
      ValueError: For a raw format of a dtype this schema does not know.
    """
    if isinstance(fmt, bytes):
        fmt = fmt.decode("ascii", "replace")
    if not fmt.startswith(RAW_FORMAT_PREFIX):
        return None
    name = fmt[len(RAW_FORMAT_PREFIX):]
    if name not in _RAW_ITEMSIZE:
        raise ValueError(f"Unknown raw format {fmt!r}; raw records hold one of {RAW_DTYPES}.")
    return name


def raw_itemsize(dtype: str) -> int:
    """Bytes per sample of a raw dtype name (one of RAW_DTYPES)."""
    if dtype not in _RAW_ITEMSIZE:
        raise ValueError(f"Raw records hold one of {RAW_DTYPES}. Received: dtype={dtype!r}")
    return _RAW_ITEMSIZE[dtype]


# Byte 24 of a PNG file: the bit depth in its IHDR chunk, which the PNG
# specification puts first, right after the 8-byte signature.
_PNG_BIT_DEPTH_BYTE = 24


def sample_dtype(fmt: str, encoded: bytes) -> str:
    """The dtype an image's samples decode to at full depth: 'uint8', 'uint16' or a raw dtype.

    JPEG is 8-bit; PNG is 16-bit when its IHDR says so and 8-bit otherwise
    (TF decodes 1-, 2- and 4-bit PNGs to uint8); a raw record is its dtype.

    Raises:
      ValueError: For a format the schema does not know.
    """
    raw = parse_raw_format(fmt)
    if raw is not None:
        return raw
    if fmt == "jpeg":
        return "uint8"
    if fmt == "png":
        deep = len(encoded) > _PNG_BIT_DEPTH_BYTE and encoded[_PNG_BIT_DEPTH_BYTE] == 16
        return "uint16" if deep else "uint8"
    raise ValueError(f"Unknown image format {fmt!r}; records hold 'jpeg', 'png' or raw images.")


def dicom_tag_key(keyword: str) -> str:
    """The key of the extra string feature holding DICOM tag `keyword` (--dicom_tags)."""
    return f"dicom_{keyword}"
