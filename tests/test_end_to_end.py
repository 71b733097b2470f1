"""The central test: files on disk -> Beam conversion -> reader batches, compared with the sources."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert, encode, make_class_tree, pixels, write

import readers
import schemas


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    root = tmp / "images"
    files = make_class_tree(root, classes=("ant", "bee", "cow", "dog"), per_class=8)
    write(root / "bee" / "broken.jpg", b"\xff\xd8\xff\xe0 not really")
    write(root / "cow" / "odd.bmp", encode(pixels(77), "BMP"))  # re-encoded to PNG, losslessly
    files["cow/odd.bmp"] = "cow"
    out = tmp / "out"
    manifest = convert(root, out, "--split", "train=0.7,validation=0.3", "--min_shards", "3",
                       "--max_reject_fraction", "0.2")
    return root, files, out, manifest


def test_batches_match_the_source_files(dataset):
    root, files, out, manifest = dataset
    seen = {}
    for split in ("train", "validation"):
        ds = readers.image_dataset_from_tfrecords(
            str(out), split, batch_size=None, image_size=None, dtype="uint8", shuffle=False,
            extra_features=(schemas.FILENAME.key,),
        )
        assert list(ds.class_names) == ["ant", "bee", "cow", "dog"]
        for image, label, extras in ds:
            seen[extras[schemas.FILENAME.key].numpy().decode()] = (image.numpy(), int(label), split)
    assert sorted(seen) == sorted(files)
    for rel, (image, label, split) in seen.items():
        source = tf.io.decode_image((root / rel).read_bytes(), channels=3, expand_animations=False).numpy()
        np.testing.assert_array_equal(image, source, err_msg=rel)
        assert manifest.class_names[label] == files[rel]
    assert {s for _, _, s in seen.values()} == {"train", "validation"}


def test_training_batches_have_the_model_shape_and_every_record_once(dataset):
    _, files, out, manifest = dataset
    ds = readers.image_dataset_from_tfrecords(str(out), "train", batch_size=4, image_size=(32, 32),
                                              augment="standard", seed=7,
                                              extra_features=(schemas.FILENAME.key,))
    assert ds.cardinality().numpy() == -(-manifest.splits["train"].num_records // 4)
    names = []
    for images, labels, extras in ds:
        assert images.dtype == tf.float32 and images.shape[1:] == (32, 32, 3)
        assert float(tf.reduce_max(images)) <= 255.0
        names += [n.decode() for n in extras[schemas.FILENAME.key].numpy()]
    assert len(names) == len(set(names)) == manifest.splits["train"].num_records


@pytest.mark.parametrize("options", [
    dict(image_size=(16, 16), seed=3, augment="standard"),  # training preset
    dict(image_size=(20, 12), resize="pad", dtype="uint8", shuffle=False, deterministic=True),
    dict(image_size=(16, 16), resize="crop", label_mode="categorical", shuffle=False, deterministic=True,
         extra_features=(schemas.FILENAME.key,)),
])
def test_batched_and_per_image_decoding_give_the_same_batches(dataset, monkeypatch, options):
    """Small records take the batch-at-a-time decode path; large ones decode per image."""
    from readers import dataset as dataset_module

    _, _, out, _ = dataset

    def batches():
        ds = readers.image_dataset_from_tfrecords(str(out), "train", batch_size=4, **options)
        return [tf.nest.map_structure(lambda t: t.numpy(), b) for b in ds]

    small_path = batches()
    monkeypatch.setattr(dataset_module, "_BATCHED_DECODE_MAX_RECORD_BYTES", 0)
    per_image = batches()
    assert len(small_path) == len(per_image) > 1
    for a, b in zip(small_path, per_image):
        tf.nest.map_structure(np.testing.assert_array_equal, a, b)
