"""The one definition of shardsmith's record format and dataset metadata.

`schemas.features`: the features of a record; `schemas.manifest`: the dataset's
metadata; `schemas.tfrecord`: the TFRecord framing, CRC and index-file format.
"""

from schemas._version import __version__
from schemas.features import (
    CHANNELS,
    EPSG,
    FILENAME,
    FORMAT,
    GEOREF_FEATURES,
    GEOTRANSFORM,
    HEIGHT,
    IMAGE,
    IMAGE_SCHEMA,
    LABEL,
    SCHEMA_VERSION,
    UNKNOWN_EPSG,
    WIDTH,
    FeatureSpec,
    ImageExampleSchema,
    ImageRecord,
    RAW_DTYPES,
    RAW_FORMAT_PREFIX,
    dicom_tag_key,
    georef_values,
    parse_raw_format,
    raw_format,
    raw_itemsize,
    sample_dtype,
)
from schemas.manifest import (
    MANIFEST_FILENAME,
    NORMALIZED_FILENAME,
    REJECT_REASONS,
    REJECTS_FILENAME,
    SKIP_REASONS,
    SPLITS,
    VERIFY_REPORT_FILENAME,
    BandStats,
    BandStatsAccumulator,
    ImageStats,
    Manifest,
    ManifestError,
    ShardInfo,
    SplitInfo,
    index_filename,
    shard_filename,
)

__all__ = [
    "__version__",
    "SCHEMA_VERSION", "FeatureSpec", "ImageRecord", "ImageExampleSchema", "IMAGE_SCHEMA",
    "dicom_tag_key", "RAW_FORMAT_PREFIX", "RAW_DTYPES", "raw_format", "parse_raw_format",
    "raw_itemsize", "sample_dtype", "IMAGE", "LABEL", "FILENAME", "FORMAT", "HEIGHT", "WIDTH", "CHANNELS",
    "EPSG", "GEOTRANSFORM", "GEOREF_FEATURES", "UNKNOWN_EPSG", "georef_values",
    "MANIFEST_FILENAME", "REJECTS_FILENAME", "NORMALIZED_FILENAME", "VERIFY_REPORT_FILENAME", "SPLITS",
    "REJECT_REASONS", "SKIP_REASONS", "Manifest", "ManifestError", "ImageStats", "BandStats",
    "BandStatsAccumulator", "ShardInfo",
    "SplitInfo", "shard_filename", "index_filename",
]
