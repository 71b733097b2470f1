"""Metadata files that let TensorFlow Datasets read a shardsmith dataset as is.

    builder = tfds.builder_from_directory("/data/pets")
    ds = builder.as_dataset(split="train")  # {"image": uint8 [h, w, 3], "label": ..., ...}
    ds = builder.as_dataset(split="train", as_supervised=True)  # (image, label)

`tfds.builder_from_directory` reads any folder of TFRecord files of
`tf.train.Example`s that holds (see https://www.tensorflow.org/datasets/external_tfrecord):

- `dataset_info.json`: the protobuf JSON of a TFDS `DatasetInfo`: name,
  version, file format, and per split the record count of every shard and a
  file name template (`filepathTemplate`) that finds the shards. The template
  `{SPLIT}-{SHARD_X_OF_Y}.tfrecord` names our shard files exactly, so they are
  read where they are, without copies or renames. In a dataset that grew
  (`convert --append`), each version's shards of a split follow it under a
  split name of their own ('train', 'train_v00002', ...; `schemas.shard_filename`),
  and TFDS reads the whole split as `split='train+train_v00002'` (the
  description says which splits to join).
- `features.json`: the `tfds.features` that decode each Example key.
- `<key>.labels.txt`: the class names of a `ClassLabel` feature, one a line.

`tfds_files` writes their text from the manifest alone, by hand from those
formats: producing them needs neither TFDS nor any data file, so the converter
writes them with the manifest at no cost.

How each record feature is exposed:

- the image as `tfds.features.Image(shape=(None, None, 3), dtype=uint8)`.
  TFDS decodes it with `tf.image.decode_image(channels=3)`, which reads every
  image shardsmith stores (JPEG, 8- or 16-bit PNG, 1 to 4 channels): grey is
  replicated to RGB, alpha dropped, 16-bit PNGs keep their high byte. These
  are the pixels of the shardsmith reader with its defaults `color_mode='rgb'`
  and `dtype='uint8'`, and the convention of TFDS's image classification
  datasets, so TFDS models and pipelines work unchanged. Full 16-bit depth
  or alpha needs `readers.image_dataset_from_tfrecords(dtype='uint16',
  color_mode='rgba')`; the encoded bytes are not exposed raw, as TFDS users
  expect decoded images.
- the label as `tfds.features.ClassLabel` with the manifest's class names.
- other bytes features (file name, format, extra string features) as
  `tfds.features.Text`, int64 features as scalar int64 `tfds.features.Tensor`.

Stacks of dated passes (`--time_series`) are described when every stack of
the dataset has one dtype, one size and one list of bands (the manifest's
`time_series` section): `stack` as a `tfds.features.Tensor` of that dtype
and shape (time, height, width, bands), time -1 unless every stack has one
length, with encoding 'bytes' (TFDS's `decode_raw` of our little-endian
bytes); the lists (`stack/dates`, `stack/bands`) as 1-D tensors, the
float64 vectors (`geotransform`) as byte-encoded float64 tensors, the mask
as a one-channel `tfds.features.Image`. Stacks of several dtypes, sizes or
band lists ("mixed") cannot be one tensor: `stack` is then their stored
bytes, a uint8 tensor [-1] (encoding 'bytes'), and each record's
`stack/dtype` and `stack/shape` say how to view it
(`np.frombuffer(stack, '<' + dtype).reshape(shape)`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from schemas.features import IMAGE, LABEL, MASK, ImageExampleSchema
from schemas.manifest import Manifest, shard_filename
from schemas.time_series import STACK, TIME_SERIES, TimeSeriesExampleSchema, example_kind
from schemas.volumes import VOLUME

__all__ = ["TFDS_DATASET_INFO_FILENAME", "TFDS_FEATURES_FILENAME", "TFDS_FILENAMES", "tfds_files"]

TFDS_DATASET_INFO_FILENAME = "dataset_info.json"
TFDS_FEATURES_FILENAME = "features.json"

# TFDS's file name template for our shard names (`schemas.shard_filename`):
# TFDS writes SHARD_X_OF_Y with at least 5 digits, as we do.
_FILEPATH_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.tfrecord"
# A TFDS dataset version; the data has no versions of its own.
_VERSION = "1.0.0"
_DATASET_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_SPLIT_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")

_CLASS = "tensorflow_datasets.core.features."
_IMAGE_FEATURE = {
    "pythonClassName": _CLASS + "image_feature.Image",
    "image": {"dtype": "uint8", "shape": {"dimensions": ["-1", "-1", "3"]}},
}
_TEXT_FEATURE = {"pythonClassName": _CLASS + "text_feature.Text", "text": {}}
_INT64_FEATURE = {
    "pythonClassName": _CLASS + "tensor_feature.Tensor",
    "tensor": {"dtype": "int64", "encoding": "none", "shape": {}},
}


def _tensor_feature(dtype: str, dimensions: list[int], encoding: str = "none") -> dict[str, Any]:
    return {"pythonClassName": _CLASS + "tensor_feature.Tensor",
            "tensor": {"dtype": dtype, "encoding": encoding, "shape": {"dimensions": [str(d) for d in dimensions]}}}


def _labels_filename(key: str) -> str:
    return f"{key}.labels.txt"


# Every file `tfds_files` may write, for a new conversion to clear first.
TFDS_FILENAMES = (TFDS_DATASET_INFO_FILENAME, TFDS_FEATURES_FILENAME, _labels_filename(LABEL.key))


def _storable_names(names: tuple[str, ...]) -> bool:
    """Whether TFDS reads the names back as written.

    TFDS splits `<key>.labels.txt` at line breaks, strips each line and drops
    empty ones.
    """
    return all(name and name == name.strip() and "\n" not in name for name in names)


def _feature_json(spec_key: str, dtype: str, num_classes: int) -> dict[str, Any]:
    if spec_key == IMAGE.key:
        return _IMAGE_FEATURE
    if spec_key == LABEL.key:
        return {
            "pythonClassName": _CLASS + "class_label_feature.ClassLabel",
            "classLabel": {"numClasses": str(num_classes)},
        }
    return _TEXT_FEATURE if dtype == "bytes" else _INT64_FEATURE


def _dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _splits(manifest: Manifest) -> tuple[list[dict], dict[str, list[str]]]:
    """`dataset_info.json`'s splits: those with records, each shard named as TFDS's template names it.

    In a dataset that grew (`convert --append`), each version's shards of a
    split follow the template under a split name of their own, e.g.
    'train_v00002' (`schemas.shard_filename`): TFDS reads the whole split as
    'train+train_v00002'.

    Returns:
      (the splits, each split's TFDS split names in version order).

    Raises:
      ValueError: For a split or shard name TFDS cannot take.
    """
    splits = []
    grown: dict[str, list[str]] = {}
    for version in manifest.all_versions:
        for name, info in manifest.splits.items():
            by_file = {s.file: s for s in info.shards}
            shards = [by_file[f] for f in version.shards.get(name, ()) if f in by_file]
            if sum(s.num_records for s in shards) == 0:
                # TFDS lists an empty split but fails to read it; leaving it out
                # makes `as_dataset` name the splits there are instead.
                continue
            if not _SPLIT_NAME_RE.fullmatch(name):
                raise ValueError(
                    f"Split name {name!r} cannot be described to TFDS: it takes letters, "
                    "digits, '_' and '-'."
                )
            for index, shard in enumerate(shards):
                expected = shard_filename(name, index, len(shards), version.version)
                if shard.file != expected:
                    raise ValueError(
                        f"Shard {index} of split {name!r} (version {version.version}) is "
                        f"{shard.file!r}; TFDS's file template {_FILEPATH_TEMPLATE!r} names it "
                        f"{expected!r}."
                    )
            tfds_name = expected.rsplit("-", 3)[0]  # 'train', or 'train_v00002'
            grown.setdefault(name, []).append(tfds_name)
            splits.append(
                {
                    "filepathTemplate": _FILEPATH_TEMPLATE,
                    "name": tfds_name,
                    # Protobuf JSON writes int64 fields as strings.
                    "numBytes": str(sum(s.num_bytes for s in shards)),
                    "shardLengths": [str(s.num_records) for s in shards],
                }
            )
    return splits, grown


def _description(manifest: Manifest, class_names: tuple, grown: dict, records: str) -> str:
    """`dataset_info.json`'s description: what the records are (`records`, by their kind), how a
    grown split reads whole, and where the class names are when TFDS cannot store them."""
    description = records
    parts = {name: names for name, names in grown.items() if len(names) > 1}
    if parts:
        description += (
            f" The dataset grew to version {manifest.latest_version}: each version's records of a "
            "split are a TFDS split of their own; read a whole split as "
            + ", ".join(f"split='{'+'.join(names)}'" for name, names in parts.items()) + "."
        )
    if not _storable_names(class_names):
        description += (
            f" Class names are not stored for TFDS (one has leading or trailing white "
            f"space or a line break): '{LABEL.key}' indexes class_names in manifest.json."
        )
    return description


def tfds_files(manifest: Manifest, dataset_name: str = "shardsmith") -> dict[str, str]:
    """The TFDS metadata files of a dataset, for `tfds.builder_from_directory`.

    A pure function of the manifest: the same manifest gives the same text.
    Write each file, UTF-8 encoded, into the dataset folder beside the shards.

    Args:
      manifest: The dataset's manifest.
      dataset_name: The TFDS dataset name (`builder.info.name`): a letter,
        then letters, digits or underscores.

    Returns:
      {file name: text}: `dataset_info.json`, `features.json` and
      `<label key>.labels.txt`. The class names file is left out, and the
      description says so, when a class name would not survive TFDS's format
      (leading or trailing white space, a line break): TFDS then names the
      classes '0', '1', ... Splits without records are left out (TFDS
      cannot read an empty split); empty shards are described and skipped.

    Raises:
      ValueError: If `dataset_name` is not a valid TFDS name, or if the
        manifest's schema, split names or shard file names cannot be
        described to TFDS (not a dataset this shardsmith wrote).
    """
    if not isinstance(dataset_name, str) or not _DATASET_NAME_RE.fullmatch(dataset_name):
        raise ValueError(
            "`dataset_name` must be a letter followed by letters, digits or "
            f"underscores. Received: dataset_name={dataset_name!r}"
        )
    class_names = tuple(manifest.class_names)
    if VOLUME.key in manifest.features:
        # Volumes of any shape and dtype, with their geometry: no TFDS feature describes them
        # (read them with readers.volume_dataset_from_tfrecords).
        return {}
    if example_kind(manifest.features) == TIME_SERIES:
        described = _stack_features(manifest, len(class_names))
        if described is None:
            return {}
        features, description = described
        supervised = STACK.key
    else:
        schema = ImageExampleSchema.from_json(manifest.features)
        features = {spec.key: _feature_json(spec.key, spec.dtype, len(class_names)) for spec in schema.features}
        description = (
            f"Images converted by shardsmith {manifest.tool_version} (record schema "
            f"v{manifest.schema_version}), {len(class_names)} classes. "
            f"'{IMAGE.key}' decodes to 8-bit RGB; shardsmith's "
            "readers.image_dataset_from_tfrecords also reads 16-bit depth and alpha."
        )
        supervised = IMAGE.key
    splits, grown = _splits(manifest)
    files = {}
    if _storable_names(class_names):
        files[_labels_filename(LABEL.key)] = "".join(f"{n}\n" for n in class_names)
    description = _description(manifest, class_names, grown, description)
    files[TFDS_DATASET_INFO_FILENAME] = _dumps(
        {
            "name": dataset_name,
            "version": _VERSION,
            "description": description,
            "fileFormat": "tfrecord",
            "splits": splits,
            "supervisedKeys": {
                "tuple": {"items": [{"featureKey": supervised}, {"featureKey": LABEL.key}]}
            },
        }
    )
    files[TFDS_FEATURES_FILENAME] = _dumps(
        {
            "pythonClassName": _CLASS + "features_dict.FeaturesDict",
            "featuresDict": {"features": features},
        }
    )
    return files


# A stack record's schema dtype -> its TFDS feature (`_stack_features`), the stack, label and mask aside.
_LIST_DTYPES = {"int64_list": "int64", "bytes_list": "string"}


def _stack_features(manifest: Manifest, num_classes: int) -> tuple[dict[str, Any], str] | None:
    """The TFDS features of a dataset of stacks, and its description; None when its stacks differ in
    dtype, size or bands (see the module's docstring)."""
    schema = TimeSeriesExampleSchema.from_json(manifest.features)
    section = manifest.extra.get(TIME_SERIES, {})
    dtypes, sizes, bands = section.get("dtypes", ()), section.get("sizes", ()), section.get("bands")
    if not dtypes or not sizes:
        return None
    # Stacks of one dtype, size and band list have one shape but their length; mixed ones are
    # given as their stored bytes, which `stack/dtype` and `stack/shape` describe.
    mixed = len(dtypes) != 1 or len(sizes) != 1 or not bands
    steps = section.get("steps", ())
    features: dict[str, Any] = {}
    for spec in schema.features:
        if spec.key == STACK.key and mixed:
            features[spec.key] = _tensor_feature("uint8", [-1], "bytes")
        elif spec.key == STACK.key:
            (height, width), = sizes
            features[spec.key] = _tensor_feature(
                dtypes[0], [steps[0] if len(steps) == 1 else -1, height, width, len(bands)], "bytes")
        elif spec.key == LABEL.key or spec.dtype in ("bytes", "int64"):
            features[spec.key] = _feature_json(spec.key, spec.dtype, num_classes)
        elif spec.key == MASK.key:
            dtype = manifest.extra.get("targets", {}).get("mask", {}).get("dtype", "uint8")
            features[spec.key] = {"pythonClassName": _CLASS + "image_feature.Image",
                                  "image": {"dtype": dtype, "shape": {"dimensions": ["-1", "-1", "1"]}}}
        elif spec.dtype in _LIST_DTYPES:
            features[spec.key] = _tensor_feature(_LIST_DTYPES[spec.dtype], [-1])
        elif spec.dtype == "int64_vector":
            features[spec.key] = _tensor_feature("int64", [spec.length])
        elif spec.dtype == "float64":
            features[spec.key] = _tensor_feature("float64", [spec.length], "bytes")
        else:
            raise ValueError(f"Feature {spec.key!r} of dtype {spec.dtype!r} cannot be described to TFDS.")
    what = (f"'{STACK.key}' is the stored bytes of stacks of {list(dtypes)} (dtypes, sizes or bands "
            f"differ): 'stack/dtype' and 'stack/shape' (time, height, width, bands) say how to view each"
            if mixed else
            f"'{STACK.key}' is {dtypes[0]} (time, height, width, bands) with bands {list(bands)}")
    description = (
        f"Stacks of dated passes converted by shardsmith {manifest.tool_version} (record schema "
        f"v{manifest.schema_version}), {num_classes} classes: {what}, 'stack/dates' days since 1970-01-01; "
        "shardsmith's readers.time_series_dataset_from_tfrecords pads, sub-samples and normalises them."
    )
    return features, description
