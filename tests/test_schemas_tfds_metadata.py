"""TensorFlow Datasets reads a converted folder with `tfds.builder_from_directory`.

The metadata comes from `schemas.tfds_metadata.tfds_files(manifest)`; TFDS
itself is a test dependency only.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

import readers
import schemas
from schemas.tfds_metadata import TFDS_DATASET_INFO_FILENAME, TFDS_FEATURES_FILENAME, tfds_files
from helpers import convert, encode, make_class_tree, pixels, write

_CLASSES = ("cat", "dog", "fish")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A converted class tree (JPEG, PNG, grey, RGBA, 16-bit) with TFDS metadata."""
    root = tmp_path_factory.mktemp("images")
    sources = make_class_tree(root, classes=_CLASSES, per_class=5)
    rgba = np.dstack([pixels(7), np.full((24, 32), 255, np.uint8)])  # Opaque: kept as RGBA.
    write(root / "dog/rgba.png", encode(rgba, "PNG"))
    sources["dog/rgba.png"] = "dog"
    deep = (pixels(8, mode="L").astype(np.uint16) * 257 + 3).astype(np.uint16)
    write(root / "fish/deep16.png", encode(deep, "PNG"))
    sources["fish/deep16.png"] = "fish"
    out = tmp_path_factory.mktemp("dataset")
    manifest = convert(
        root, out, "--overwrite", "--split", "train=0.6,validation=0.4", "--num_shards", "2"
    )
    # The converter writes TFDS's metadata with the manifest.
    for name, text in tfds_files(manifest).items():
        assert (out / name).read_text(encoding="utf-8") == text
    return root, sources, out, manifest


def _reader_images(out, split) -> dict[str, np.ndarray]:
    ds = readers.image_dataset_from_tfrecords(
        out, split, batch_size=None, image_size=None, shuffle=False, dtype="uint8",
        extra_features=(schemas.FILENAME.key,),
    )
    return {extras[schemas.FILENAME.key].numpy().decode(): image.numpy() for image, _, extras in ds}


def _source_rgb8(path) -> np.ndarray:
    with Image.open(path) as im:
        if im.mode.startswith("I"):  # 16-bit grey: TF keeps the high byte.
            grey = (np.asarray(im, dtype=np.uint32) >> 8).astype(np.uint8)
            return np.repeat(grey[..., None], 3, axis=-1)
        return np.asarray(im.convert("RGB"))


def test_builder_from_directory_reads_every_split(dataset):
    root, sources, out, manifest = dataset
    builder = tfds.builder_from_directory(str(out))

    assert builder.info.name == "shardsmith"
    assert builder.info.features[schemas.LABEL.key].names == list(_CLASSES)
    assert set(builder.info.splits) == set(manifest.splits)
    seen = set()
    for split, info in manifest.splits.items():
        assert builder.info.splits[split].num_examples == info.num_records
        assert builder.info.splits[split].shard_lengths == [s.num_records for s in info.shards]
        by_reader = _reader_images(out, split)
        examples = list(tfds.as_numpy(builder.as_dataset(split=split)))
        assert len(examples) == info.num_records
        for ex in examples:
            name = ex[schemas.FILENAME.key].decode()
            image = ex[schemas.IMAGE.key]
            assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[-1] == 3
            assert _CLASSES[ex[schemas.LABEL.key]] == sources[name]
            assert (ex[schemas.HEIGHT.key], ex[schemas.WIDTH.key]) == image.shape[:2]
            assert ex[schemas.FORMAT.key] in (b"jpeg", b"png")
            # The same pixels as shardsmith's own reader (rgb, uint8, stored size) ...
            np.testing.assert_array_equal(image, by_reader[name])
            # ... and as the source file (JPEG decoders may differ by rounding).
            source = _source_rgb8(root / name)
            if name.endswith(".png"):
                np.testing.assert_array_equal(image, source)
            else:
                assert np.abs(image.astype(int) - source.astype(int)).mean() < 1.5
            seen.add(name)
    assert seen == set(sources)


def test_as_supervised_gives_image_label_pairs(dataset):
    _, sources, out, manifest = dataset
    builder = tfds.builder_from_directory(str(out))
    ds = builder.as_dataset(split="train", as_supervised=True)
    labels = sorted(int(label) for _, label in tfds.as_numpy(ds))
    expected = [i for i, n in enumerate(manifest.splits["train"].class_counts) for _ in range(n)]
    assert labels == expected
    assert ds.element_spec[0].shape.as_list() == [None, None, 3]


def test_files_are_deterministic_sorted_json(dataset):
    _, _, _, manifest = dataset
    files = tfds_files(manifest)
    assert files == tfds_files(schemas.Manifest.from_json(manifest.to_json()))
    assert set(files) == {
        TFDS_DATASET_INFO_FILENAME, TFDS_FEATURES_FILENAME, f"{schemas.LABEL.key}.labels.txt",
    }
    for name in (TFDS_DATASET_INFO_FILENAME, TFDS_FEATURES_FILENAME):
        doc = json.loads(files[name])
        assert files[name] == json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert files[f"{schemas.LABEL.key}.labels.txt"] == "cat\ndog\nfish\n"
    info = json.loads(files[TFDS_DATASET_INFO_FILENAME])
    templates = [s["filepathTemplate"] for s in info["splits"]]
    assert templates == ["{SPLIT}-{SHARD_X_OF_Y}.tfrecord"] * 2


def test_dataset_name_is_checked_and_used(dataset):
    _, _, _, manifest = dataset
    info = json.loads(tfds_files(manifest, dataset_name="my_pets")[TFDS_DATASET_INFO_FILENAME])
    assert info["name"] == "my_pets"
    for bad in ("", "9lives", "my-pets", "pets/v2", None):
        with pytest.raises(ValueError, match="dataset_name"):
            tfds_files(manifest, dataset_name=bad)


def test_empty_split_is_left_out(dataset):
    _, _, _, manifest = dataset
    splits = dict(manifest.splits)
    splits["test"] = schemas.SplitInfo(name="test", shards=())
    info = json.loads(
        tfds_files(dataclasses.replace(manifest, splits=splits))[TFDS_DATASET_INFO_FILENAME]
    )
    assert [s["name"] for s in info["splits"]] == list(manifest.splits)


def test_unstorable_class_names_fall_back_to_indices(dataset, tmp_path):
    _, _, out, manifest = dataset
    odd = dataclasses.replace(manifest, class_names=("cat ", "dog", "fish"))
    files = tfds_files(odd)
    assert f"{schemas.LABEL.key}.labels.txt" not in files
    description = json.loads(files[TFDS_DATASET_INFO_FILENAME])["description"]
    assert "Class names are not stored" in description
    # TFDS still reads the data, naming the classes by index.
    copy = tmp_path / "copy"
    copy.mkdir()
    for shard in manifest.splits["train"].shards:
        (copy / shard.file).write_bytes((out / shard.file).read_bytes())
    train_only = dataclasses.replace(odd, splits={"train": manifest.splits["train"]})
    for name, text in tfds_files(train_only).items():
        (copy / name).write_text(text, encoding="utf-8")
    builder = tfds.builder_from_directory(str(copy))
    assert builder.info.features[schemas.LABEL.key].num_classes == 3
    assert len(list(builder.as_dataset(split="train"))) == manifest.splits["train"].num_records


def test_shard_names_tfds_cannot_find_are_refused(dataset):
    _, _, _, manifest = dataset
    info = manifest.splits["train"]
    renamed = dataclasses.replace(info.shards[0], file="train-0-of-2.tfrecord")
    train = dataclasses.replace(info, shards=(renamed, *info.shards[1:]))
    bad = dataclasses.replace(manifest, splits={**manifest.splits, "train": train})
    with pytest.raises(ValueError, match="train-0-of-2.tfrecord"):
        tfds_files(bad)


def test_tfds_reads_stacks_of_dated_passes_as_rasterio_reads_their_files(tmp_path):
    """`convert --time_series` writes TFDS metadata too: each stack, date and label as GDAL's files say."""
    rasterio = pytest.importorskip("rasterio")
    from helpers import write_geotiff

    days = {"2020-05-01": 18383, "2020-05-11": 18393, "2020-05-21": 18403}
    expected = {}
    for k, (label, location) in enumerate((("corn", "a"), ("corn", "b"), ("wheat", "c"), ("wheat", "d"))):
        folder = tmp_path / "in" / label / location
        for t, date in enumerate(days):
            values = np.random.default_rng(10 * k + t).integers(0, 60000, size=(4, 6, 5)).astype(np.uint16)
            write_geotiff(folder / f"{date}.tif", values)
        planes = []
        for date in days:
            with rasterio.open(folder / f"{date}.tif") as src:
                planes.append(np.transpose(src.read(), (1, 2, 0)))
        expected[f"{label}/{location}"] = (np.stack(planes), label)
    out = tmp_path / "out"
    manifest = convert(tmp_path / "in", out, "--time_series", "--split", "train=1.0", "--num_shards", "2")
    for name, text in tfds_files(manifest).items():
        assert (out / name).read_text(encoding="utf-8") == text
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["label"].names == ["corn", "wheat"]
    seen = set()
    for example in tfds.as_numpy(builder.as_dataset(split="train")):
        name = example["filename"].decode()
        stack, label = expected[name]
        assert example["stack"].dtype == np.uint16
        np.testing.assert_array_equal(example["stack"], stack)
        assert example["stack/dates"].tolist() == list(days.values())
        assert [b.decode() for b in example["stack/bands"]] == ["1", "2", "3", "4"]
        assert example["label"] == ["corn", "wheat"].index(label)
        with rasterio.open(tmp_path / "in" / name / "2020-05-01.tif") as src:
            np.testing.assert_array_equal(example["geotransform"], src.transform.to_gdal())
        seen.add(name)
    assert seen == set(expected)
    stack, label = next(iter(builder.as_dataset(split="train", as_supervised=True)))
    assert stack.shape == (3, 6, 5, 4) and label.dtype.name == "int64"


def test_tfds_reads_mixed_stacks_as_their_bytes_which_dtype_and_shape_describe(tmp_path):
    """Stacks of two dtypes, sizes and band counts: TFDS gives each one's stored bytes, and its
    `stack/dtype` and `stack/shape` view them as exactly what GDAL reads from the files."""
    rasterio = pytest.importorskip("rasterio")
    from helpers import write_geotiff

    shapes = {"corn/a": (2, 6, 5, "uint16"), "wheat/b": (3, 4, 7, "float32")}
    expected = {}
    for k, (name, (bands, height, width, dtype)) in enumerate(shapes.items()):
        planes = []
        for t, date in enumerate(("2020-05-01", "2020-05-11")):
            values = (np.random.default_rng(10 * k + t).random((bands, height, width)) * 1000).astype(dtype)
            path = write_geotiff(tmp_path / "in" / name / f"{date}.tif", values)
            with rasterio.open(path) as src:
                planes.append(np.transpose(src.read(), (1, 2, 0)))
        expected[name] = np.stack(planes)
    out = tmp_path / "out"
    manifest = convert(tmp_path / "in", out, "--time_series", "--split", "train=1.0", "--num_shards", "1")
    files = tfds_files(manifest)
    assert files and "stored bytes" in json.loads(files[TFDS_DATASET_INFO_FILENAME])["description"]
    builder = tfds.builder_from_directory(str(out))
    seen = set()
    for example in tfds.as_numpy(builder.as_dataset(split="train")):
        name = example["filename"].decode()
        dtype = example["stack/dtype"].decode()
        stack = np.frombuffer(example["stack"].tobytes(), "<" + np.dtype(dtype).str[1:]).reshape(
            example["stack/shape"])
        assert stack.dtype == expected[name].dtype
        np.testing.assert_array_equal(stack, expected[name])
        seen.add(name)
    assert seen == set(expected)
