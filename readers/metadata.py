"""Finds what a reader may read: the manifest, the schema and a split's shards.

Everything comes from `manifest.json`, which the converter writes last. Shard
files are taken from the manifest and never from a directory glob, so stale or
half-written files left in the folder are never read. All file access goes
through `tf.io.gfile`, so `data_dir` may be a local path or a `gs://` URL.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from readers import examples as _examples
from schemas.features import ImageExampleSchema
from schemas.time_series import TIME_SERIES, TimeSeriesExampleSchema
from schemas.manifest import (
    not_a_dataset_folder,
    MANIFEST_FILENAME,
    SHARD_FILENAME_RE,
    SPLIT_ALIASES,
    ImageStats,
    Manifest,
    ManifestError,
)

__all__ = ["SplitFiles", "load_manifest", "load_split"]

logger = logging.getLogger(__name__)

# How many missing shard names an error message lists before eliding.
_MAX_LISTED = 5


@dataclasses.dataclass(frozen=True)
class SplitFiles:
    """The shard files of one split, resolved against `data_dir`.

    Attributes:
      data_dir: The dataset folder, as given (local path or URL).
      split: The split name.
      paths: Full paths of the shard files holding at least one record, in
        manifest order.
      num_records: Records in each of `paths`.
      num_bytes: Bytes of each of `paths`.
      class_names: Class names in label order.
      schema: The record schema stored in the manifest.
      index_files: Full path of each shard's index file (None where the
        manifest lists none), for `readers.record_index`.
      index_sha256: The manifest's sha256 of each index file.
      images: Formats and sizes of the split's images, if the manifest
        has them.
      band_stats: Per-band statistics the manifest records, by split name
        (`readers.stored.split_band_stats`), for `normalize='dataset'`.
      targets: The manifest's `targets` section (`schemas.Manifest.targets`):
        what the target features mean (mask dtype, box class names, target
        length); {} for a dataset of one label per image.
      time_series: The manifest's `time_series` section (stack dtypes, band
        names, time steps) for a dataset of stacks; {} otherwise.
    """

    data_dir: str
    split: str
    paths: tuple[str, ...]
    num_records: tuple[int, ...]
    num_bytes: tuple[int, ...]
    class_names: tuple[str, ...]
    schema: ImageExampleSchema | TimeSeriesExampleSchema
    index_files: tuple[str | None, ...] = ()
    index_sha256: tuple[str | None, ...] = ()
    images: ImageStats | None = None
    band_stats: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    targets: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    time_series: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def total_records(self) -> int:
        return sum(self.num_records)

    @property
    def total_bytes(self) -> int:
        return sum(self.num_bytes)


def _check_data_dir(data_dir) -> str:
    if isinstance(data_dir, bytes) or not isinstance(data_dir, (str, os.PathLike)):
        raise TypeError(
            "`data_dir` must be a str or os.PathLike path to a folder written by "
            f"shardsmith. Received: data_dir={data_dir!r} of type "
            f"{type(data_dir).__name__}"
        )
    path = os.fspath(data_dir)
    if not path:
        raise ValueError("`data_dir` must not be empty. Received: data_dir=''")
    if not tf.io.gfile.isdir(path):
        exists = tf.io.gfile.exists(path)
        problem = not_a_dataset_folder(path, exists=None, is_file=exists)
        if problem:  # A shard file or another file, where its folder belongs.
            raise FileNotFoundError(f"`data_dir`: {problem}")
        raise FileNotFoundError(
            f"`data_dir` does not exist or is not a folder. Received: data_dir={path!r}"
        )
    return path


def _listdir(path: str) -> set[str]:
    # gfile lists sub-folders of object stores with a trailing slash.
    return {name.rstrip("/") for name in tf.io.gfile.listdir(path)}


def _read_manifest(path: str, names: set[str]) -> Manifest:
    manifest_path = tf.io.gfile.join(path, MANIFEST_FILENAME)
    if MANIFEST_FILENAME not in names:
        shards = sorted(n for n in names if SHARD_FILENAME_RE.match(n))
        if shards:
            why = (
                f"It holds {len(shards)} shard file(s) but no {MANIFEST_FILENAME}, "
                "which the converter writes last: the conversion did not finish "
                "(it failed or is still running). Run the conversion again into "
                "this folder (with --overwrite) and read it once it has finished."
            )
        else:
            why = (
                f"It has no {MANIFEST_FILENAME} and no shard files: this is not "
                "the output folder of a shardsmith conversion. Pass the folder given "
                "as --output_dir to shardsmith convert."
            )
        raise FileNotFoundError(
            f"`data_dir` is not a finished shardsmith dataset. {why} "
            f"Received: data_dir={path!r}"
        )
    with tf.io.gfile.GFile(manifest_path, "r") as f:
        text = f.read()
    return Manifest.from_json(text, source=manifest_path)


def load_manifest(data_dir: str | os.PathLike, version: int | None = None) -> Manifest:
    """Reads and checks the manifest of a converted dataset.

    Args:
      data_dir: The dataset folder (the converter's `--output_dir`), a local
        path or a URL `tf.io.gfile` understands such as `gs://bucket/data`.
      version: None for the latest version (every shard), or N for exactly
        what version N of a dataset that grew held (`Manifest.at_version`).

    Returns:
      The parsed `schemas.Manifest`.

    Raises:
      TypeError: If `data_dir` is not a path.
      FileNotFoundError: If `data_dir` does not exist, or holds no manifest
        (an unfinished conversion, or not a shardsmith folder).
      schemas.ManifestError: If the manifest is damaged or was written with a
        schema version this reader does not read.
    """
    path = _check_data_dir(data_dir)
    return _read_manifest(path, _listdir(path)).at_version(version)


def _resolve_split(split: str, available: Mapping[str, Any]) -> str:
    """The dataset's name for `split`: itself, or the split an alias of the
    converter's means (e.g. 'val' -> 'validation', as for folder names)."""
    if split in available:
        return split
    return SPLIT_ALIASES.get(split.strip().lower(), split)


def load_split(data_dir: str | os.PathLike, split: str, version: int | None = None,
               kind: str = "image") -> SplitFiles:
    """Resolves the shard files of one split and checks they are all there.

    Args:
      data_dir: The dataset folder, see `load_manifest`.
      split: The split to read, e.g. 'train'; an alias the converter accepts
        (`schemas.manifest.SPLIT_ALIASES`, e.g. 'val') names the split it means.
      kind: The kind of record the caller reads: 'image', or
        `schemas.TIME_SERIES` (stacks); a dataset of another kind is refused,
        naming the reader it needs.
      version: None for the latest version, N for exactly the shards and
        classes version N held, see `load_manifest`.

    Returns:
      A `SplitFiles`; shards with no records are left out.

    Raises:
      TypeError: If `data_dir` or `split` has the wrong type.
      FileNotFoundError: As `load_manifest`, or if shard files named by the
        manifest are missing.
      schemas.ManifestError: As `load_manifest`, if the dataset has no such
        split, or if the stored schema does not match this reader.
      ValueError: If the split has no records.
    """
    if not isinstance(split, str):
        raise TypeError(
            f"`split` must be a str such as 'train'. Received: split={split!r} "
            f"of type {type(split).__name__}"
        )
    path = _check_data_dir(data_dir)
    names = _listdir(path)
    manifest = _read_manifest(path, names).at_version(version)
    resolved = _resolve_split(split, manifest.splits)
    if resolved not in manifest.splits:
        raise ManifestError(
            f"`split` must be one of the dataset's splits {sorted(manifest.splits)}. "
            f"Received: split={split!r} (data_dir={path!r})"
        )
    split = resolved
    schema = _schema_of(manifest, path, kind)
    shards = _present_shards(manifest, split, path, names)
    logger.debug(
        "Split %r of %s: %d records in %d shards.",
        split, path, sum(s.num_records for s in shards), len(shards),
    )
    return SplitFiles(
        data_dir=path,
        split=split,
        paths=tuple(tf.io.gfile.join(path, s.file) for s in shards),
        num_records=tuple(s.num_records for s in shards),
        num_bytes=tuple(s.num_bytes for s in shards),
        class_names=tuple(manifest.class_names),
        schema=schema,
        index_files=tuple(
            tf.io.gfile.join(path, s.index_file) if s.index_file else None for s in shards
        ),
        index_sha256=tuple(s.index_sha256 for s in shards),
        images=manifest.split(split).images,
        band_stats=_band_stats(manifest),
        targets=dict(manifest.targets),
        time_series=dict(manifest.extra.get(TIME_SERIES, {})),
    )


def _schema_of(manifest: Manifest, path: str, kind: str):
    """The record schema of a dataset read as `kind`; a dataset of another kind names its reader.

    Raises:
      schemas.ManifestError: For another kind, or a schema this reader does not read.
    """
    # The kinds of example are a table (`readers.examples`): a dataset of another kind names its reader.
    wanted = _examples.kind_named(kind)
    stored = _examples.kind_of(manifest.features)
    if stored is not None and stored is not wanted:
        raise ManifestError(
            f"The dataset at {path!r} holds {stored.name} records, which "
            f"readers.{stored.reader} reads, not readers.{wanted.reader}."
        )
    try:
        return wanted.schema_from_json(manifest.features)
    except ValueError as e:
        found = _examples.kind_of(manifest.features)
        other = f" It holds {found.name} examples: read it with readers.{found.reader}." if found else ""
        raise ManifestError(
            f"The record schema in {tf.io.gfile.join(path, MANIFEST_FILENAME)} does "
            f"not match this reader: {e}.{other}"
        ) from e


def _present_shards(manifest: Manifest, split: str, path: str, names) -> list:
    """The split's shards with records, once each is found among the folder's `names`.

    Raises:
      ValueError: If the split has no records.
      FileNotFoundError: Naming the shard files missing.
    """
    shards = [s for s in manifest.split(split).shards if s.num_records > 0]
    if not shards:
        raise ValueError(
            f"Split {split!r} of the dataset at {path!r} has no records; choose "
            f"another `split`. Received: split={split!r}"
        )
    missing = [s.file for s in shards if s.file not in names]
    if missing:
        listed = ", ".join(missing[:_MAX_LISTED]) + (", ..." if len(missing) > _MAX_LISTED else "")
        raise FileNotFoundError(
            f"{len(missing)} shard file(s) of split {split!r} named in the manifest "
            f"are missing from {path!r}: {listed}. The folder was changed after the "
            "conversion; convert the images again."
        )
    return shards


def _band_stats(manifest: Manifest) -> dict[str, Any]:
    from readers.stored import split_band_stats  # It imports the decoders.

    stats = {name: split_band_stats(manifest, name) for name in manifest.splits}
    return {name: s for name, s in stats.items() if s is not None}
