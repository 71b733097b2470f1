"""Tests of readers.dataset: image_dataset_from_tfrecords end to end from shards."""

import collections
import dataclasses
import inspect
import math

import numpy as np
import pytest
import tensorflow as tf

from readers import ReaderConfig, image_dataset_from_tfrecords, preprocess
from readers.options import GROUP_NAMES
from readers.dataset import (OPTION_NAMES, ImageOptions, ReadOptions, ServiceReadOptions,
                             ShuffleOptions, without_extras)
from schemas import CHANNELS, FILENAME, HEIGHT, IMAGE, LABEL, shard_filename

import _reader_data as rd

NAMES = (FILENAME.key,)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """14 records of every kind and several sizes over 4 shards."""
    return rd.write_dataset(
        tmp_path_factory.mktemp("mixed"), splits={"train": 14, "validation": 3}, num_shards=4
    )


@pytest.fixture(scope="module")
def uniform(tmp_path_factory):
    """Same-size images, so they batch at their own size without resizing."""
    return rd.write_dataset(
        tmp_path_factory.mktemp("uniform"), splits={"train": 7}, sizes=((10, 13),),
        kinds=("rgb_jpeg", "rgb_png", "gray_jpeg", "rgba_png"), num_shards=3,
    )


def _names(batch_extras):
    return [n.decode() for n in batch_extras[FILENAME.key].numpy()]


def _epoch_names(ds):
    names = []
    for element in ds:
        names.extend(_names(element[-1]))
    return names


def test_batched_uint8_pixels_equal_the_source(uniform):
    ds = image_dataset_from_tfrecords(
        uniform.data_dir, image_size=(10, 13), dtype="uint8", batch_size=3,
        extra_features=NAMES, shuffle=False,
    )
    by_name = uniform.by_filename()
    seen = []
    for images, labels, extras in ds:
        assert images.dtype == tf.uint8 and labels.dtype == tf.int32
        for image, label, name in zip(images.numpy(), labels.numpy(), _names(extras)):
            np.testing.assert_array_equal(image, rd.decoded(by_name[name]))
            assert label == by_name[name].label
            seen.append(name)
    assert sorted(seen) == sorted(by_name)


@pytest.mark.parametrize("image_stats", [True, False])
def test_batches_of_one_size_of_jpegs_equal_image_by_image(tmp_path, image_stats):
    # JPEGs of one size decode without a loop, in full batches and in the
    # last, partial one (7 = 3 + 3 + 1), then resize as a batch; the graph
    # holds that path alone when the manifest says what the images are.
    written = rd.write_dataset(tmp_path, splits={"train": 7}, sizes=((10, 13),),
                               kinds=("rgb_jpeg", "gray_jpeg"), num_shards=2,
                               image_stats=image_stats)
    ds = image_dataset_from_tfrecords(written.data_dir, image_size=(21, 17), batch_size=3,
                                      extra_features=NAMES, shuffle=False)
    by_name = written.by_filename()
    seen = []
    for images, _, extras in ds:
        for image, name in zip(images.numpy(), _names(extras)):
            expected = preprocess.load_image(tf.constant(by_name[name].data), image_size=(21, 17))
            np.testing.assert_array_equal(image, expected.numpy())
            seen.append(name)
    assert sorted(seen) == sorted(by_name)


def test_one_size_jpegs_batched_at_the_stored_size_equal_decode_jpeg(tmp_path):
    # image_size=None with batches: nothing resized, the decoded pixels as floats.
    written = rd.write_dataset(tmp_path, splits={"train": 7}, sizes=((10, 13),),
                               kinds=("rgb_jpeg",), num_shards=2)
    ds = image_dataset_from_tfrecords(written.data_dir, image_size=None, batch_size=3,
                                      extra_features=NAMES, shuffle=False)
    assert ds.element_spec[0].shape.as_list() == [None, 10, 13, 3]
    by_name = written.by_filename()
    seen = []
    for images, _, extras in ds:
        assert images.dtype == tf.float32
        for image, name in zip(images.numpy(), _names(extras)):
            expected = tf.io.decode_jpeg(by_name[name].data, channels=3).numpy()
            np.testing.assert_array_equal(image, expected.astype(np.float32))
            seen.append(name)
    assert sorted(seen) == sorted(by_name)


def test_batches_at_the_stored_size_refused_for_several_sizes(mixed, tmp_path):
    with pytest.raises(ValueError, match=(
            r"`image_size=None` batches images at their stored size, but split 'train' of .* "
            r"holds images of several sizes, from 9x10 to 16x16 \(height x width\): pass "
            r"image_size=\(height, width\), or batch_size=None. "
            r"Received: image_size=None, batch_size=4")):
        image_dataset_from_tfrecords(mixed.data_dir, image_size=None, batch_size=4)
    unknown = rd.write_dataset(tmp_path, splits={"train": 3}, sizes=((10, 13),),
                               kinds=("rgb_jpeg",), image_stats=False)
    with pytest.raises(ValueError, match=r"holds sizes its manifest does not record .*"
                                         r"pass image_size=\(height, width\)"):
        image_dataset_from_tfrecords(unknown.data_dir, image_size=None, batch_size=4)


def test_unbatched_original_sizes_equal_the_source(mixed):
    ds = image_dataset_from_tfrecords(
        mixed.data_dir, batch_size=None, image_size=None, dtype="uint8", extra_features=NAMES
    )
    by_name = mixed.by_filename()
    seen = []
    for image, label, extras in ds:
        name = extras[FILENAME.key].numpy().decode()
        np.testing.assert_array_equal(image.numpy(), rd.decoded(by_name[name]))
        assert int(label) == by_name[name].label
        seen.append(name)
    assert sorted(seen) == sorted(by_name)


def test_default_float_path_keeps_0_255_values(uniform):
    ds = image_dataset_from_tfrecords(uniform.data_dir, image_size=(10, 13), extra_features=NAMES)
    by_name = uniform.by_filename()
    for images, _, extras in ds:
        assert images.dtype == tf.float32
        for image, name in zip(images.numpy(), _names(extras)):
            np.testing.assert_array_equal(image, rd.decoded(by_name[name]).astype(np.float32))


@pytest.mark.parametrize("batch_size, drop_remainder", [(4, False), (4, True), (14, False), (5, True)])
def test_one_epoch_yields_every_record_once(mixed, batch_size, drop_remainder):
    ds = image_dataset_from_tfrecords(
        mixed.data_dir, batch_size=batch_size, image_size=(8, 8),
        drop_remainder=drop_remainder, extra_features=NAMES,
    )
    total = len(mixed.sources["train"])
    expected_batches = total // batch_size if drop_remainder else math.ceil(total / batch_size)
    assert int(ds.cardinality()) == expected_batches
    names = []
    batches = 0
    for images, labels, extras in ds:
        assert images.shape[1:] == (8, 8, 3) and images.shape[0] == labels.shape[0]
        names.extend(_names(extras))
        batches += 1
    assert batches == expected_batches
    counts = collections.Counter(names)
    assert set(counts.values()) == {1}
    assert len(names) == (expected_batches * batch_size if drop_remainder else total)
    assert set(counts) <= set(mixed.by_filename())
    if not drop_remainder:
        assert set(counts) == set(mixed.by_filename())


def test_class_names_and_element_spec(mixed):
    ds = image_dataset_from_tfrecords(mixed.data_dir, "validation", batch_size=2, image_size=(5, 6))
    assert ds.class_names == list(mixed.class_names)
    images, labels = ds.element_spec
    assert images.shape.as_list() == [None, 5, 6, 3] and images.dtype == tf.float32
    assert labels.shape.as_list() == [None] and labels.dtype == tf.int32


def test_stale_files_in_the_folder_are_not_read(tmp_path):
    w = rd.write_dataset(tmp_path, splits={"train": 6}, num_shards=2)
    # A leftover shard of an earlier run, with records of its own.
    (w.data_dir / shard_filename("train", 2, 3)).write_bytes(w.shard_paths["train"][0].read_bytes())
    ds = image_dataset_from_tfrecords(w.data_dir, batch_size=4, image_size=(4, 4), extra_features=NAMES)
    assert sorted(_epoch_names(ds)) == sorted(w.by_filename())


def test_shards_that_disagree_with_the_manifest_fail_loudly(tmp_path):
    w = rd.write_dataset(tmp_path, splits={"train": 6}, num_shards=2)
    # Shard 1 loses a record after the manifest was written.
    shard = w.shard_paths["train"][1]
    kept = [r.numpy() for r in tf.data.TFRecordDataset(str(shard))][:-1]
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for record in kept:
            writer.write(record)
    ds = image_dataset_from_tfrecords(w.data_dir, batch_size=2, image_size=(4, 4), shuffle=False)
    # The shard is named, with what was found and what to run (issue 39).
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Shard .*train-00001-of-00002.tfrecord holds 2 readable records, the manifest says 3"):
        for _ in ds:
            pass


def test_a_shard_with_more_records_than_the_manifest_fails_loudly(tmp_path):
    w = rd.write_dataset(tmp_path, splits={"train": 6}, num_shards=2)
    shard = w.shard_paths["train"][0]
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(shard))]
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for record in records + records[:1]:
            writer.write(record)
    ds = image_dataset_from_tfrecords(w.data_dir, batch_size=2, image_size=(4, 4), shuffle=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Shard .*train-00000-of-00002.tfrecord holds \d+ bytes, "
                       r"the manifest says \d+"):
        for _ in ds:
            pass


def test_seeded_runs_repeat_and_epochs_reshuffle(mixed):
    def build(seed, **kw):
        return image_dataset_from_tfrecords(
            mixed.data_dir, batch_size=3, image_size=(4, 4), seed=seed,
            extra_features=NAMES, deterministic=True, **kw,
        )

    first = build(5)
    epoch1, epoch2, epoch3 = (_epoch_names(first) for _ in range(3))
    # A fresh dataset with the same seed replays the same epochs.
    again = build(5)
    assert _epoch_names(again) == epoch1
    assert _epoch_names(again) == epoch2
    assert sorted(epoch1) == sorted(epoch2) == sorted(epoch3) == sorted(mixed.by_filename())
    assert len({tuple(epoch1), tuple(epoch2), tuple(epoch3)}) > 1
    assert _epoch_names(build(6)) != epoch1


def test_file_order_changes_between_epochs(mixed):
    # With a one-record buffer, the order is the interleave of the files:
    # which shard comes first shows the per-epoch file shuffle.
    ds = image_dataset_from_tfrecords(
        mixed.data_dir, batch_size=14, image_size=(4, 4), seed=1, shuffle_buffer=1,
        extra_features=NAMES,
    )
    shard_of = {s.filename: s.shard for s in mixed.sources["train"]}
    position = {s.filename: i for i, s in enumerate(mixed.sources["train"])}
    orders = []
    for _ in range(4):
        names = _epoch_names(ds)
        assert sorted(names) == sorted(shard_of)
        # Records of one shard keep their file order.
        for shard in range(4):
            in_shard = [position[n] for n in names if shard_of[n] == shard]
            assert in_shard == sorted(in_shard)
        orders.append(tuple(shard_of[n] for n in names[:4]))
    assert len(set(orders)) > 1


def test_no_shuffle_reads_in_manifest_order(mixed):
    ds = image_dataset_from_tfrecords(
        mixed.data_dir, batch_size=5, image_size=(4, 4), shuffle=False, extra_features=NAMES,
        deterministic=True,
    )
    names = _epoch_names(ds)
    shard_of = {s.filename: s.shard for s in mixed.sources["train"]}
    assert [shard_of[n] for n in names[:4]] == [0, 1, 2, 3]
    assert names == _epoch_names(ds)


@pytest.mark.parametrize("policy", ["stretch", "pad", "crop"])
def test_resize_policies_shapes(mixed, policy):
    ds = image_dataset_from_tfrecords(mixed.data_dir, batch_size=6, image_size=(7, 5), resize=policy)
    images, labels = next(iter(ds))
    assert images.shape == (6, 7, 5, 3) and labels.shape == (6,)


def test_label_modes(mixed):
    common = dict(batch_size=4, image_size=(4, 4), extra_features=NAMES)
    by_name = mixed.by_filename()
    ds = image_dataset_from_tfrecords(mixed.data_dir, label_mode="categorical", **common)
    assert ds.element_spec[1].shape.as_list() == [None, 3]
    for _, labels, extras in ds:
        assert labels.dtype == tf.float32
        expected = np.eye(3)[[by_name[n].label for n in _names(extras)]]
        np.testing.assert_array_equal(labels.numpy(), expected)
    ds = image_dataset_from_tfrecords(mixed.data_dir, label_mode=None, **common)
    images, extras = next(iter(ds))
    assert images.shape == (4, 4, 4, 3) and set(extras) == set(NAMES)
    ds = image_dataset_from_tfrecords(mixed.data_dir, label_mode=None, batch_size=4, image_size=(4, 4))
    assert isinstance(ds.element_spec, tf.TensorSpec)


def test_binary_labels(tmp_path):
    w = rd.write_dataset(tmp_path, splits={"train": 5}, class_names=("no", "yes"), num_shards=2)
    ds = image_dataset_from_tfrecords(
        w.data_dir, label_mode="binary", batch_size=5, image_size=(4, 4), extra_features=NAMES
    )
    _, labels, extras = next(iter(ds))
    assert labels.dtype == tf.float32 and labels.shape == (5, 1)
    by_name = w.by_filename()
    assert labels.numpy()[:, 0].tolist() == [float(by_name[n].label) for n in _names(extras)]


def test_binary_needs_two_classes(mixed):
    with pytest.raises(ValueError, match=r"label_mode='binary' needs exactly 2 classes.*3"):
        image_dataset_from_tfrecords(mixed.data_dir, label_mode="binary")


def test_extra_features_from_the_schema(mixed):
    ds = image_dataset_from_tfrecords(
        mixed.data_dir, batch_size=14, image_size=(4, 4),
        extra_features=(FILENAME.key, HEIGHT.key, CHANNELS.key),
    )
    _, _, extras = next(iter(ds))
    assert extras[HEIGHT.key].dtype == tf.int64
    by_name = mixed.by_filename()
    for name, height, channels in zip(
        _names(extras), extras[HEIGHT.key].numpy(), extras[CHANNELS.key].numpy()
    ):
        assert height == by_name[name].pixels.shape[0]
        assert channels == rd.KINDS[by_name[name].kind][3]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "uint8", tf.uint8, np.float16])
def test_output_dtypes(uniform, dtype):
    ds = image_dataset_from_tfrecords(
        uniform.data_dir, batch_size=7, image_size=(10, 13), dtype=dtype, extra_features=NAMES
    )
    images, _, extras = next(iter(ds))
    assert images.dtype == tf.as_dtype(dtype)
    by_name = uniform.by_filename()
    expected = np.stack([rd.decoded(by_name[n]) for n in _names(extras)]).astype(np.float32)
    np.testing.assert_allclose(tf.cast(images, tf.float32).numpy(), expected, rtol=1e-2)


def test_uint16_reads_16_bit_pngs_at_full_depth(tmp_path):
    w = rd.write_dataset(tmp_path, splits={"train": 3}, kinds=("gray16_png",), sizes=((6, 5),), num_shards=1)
    ds = image_dataset_from_tfrecords(
        w.data_dir, batch_size=3, image_size=(6, 5), dtype="uint16", color_mode="grayscale",
        extra_features=NAMES,
    )
    images, _, extras = next(iter(ds))
    assert images.dtype == tf.uint16 and images.shape == (3, 6, 5, 1)
    by_name = w.by_filename()
    for image, name in zip(images.numpy(), _names(extras)):
        np.testing.assert_array_equal(image[..., 0], by_name[name].pixels)


def test_scale_and_normalize(uniform):
    mean, std = (120.0, 110.0, 100.0), (60.0, 50.0, 40.0)
    ds = image_dataset_from_tfrecords(
        uniform.data_dir, batch_size=7, image_size=(10, 13), scale=2.0, normalize=(mean, std),
        extra_features=NAMES,
    )
    images, _, extras = next(iter(ds))
    by_name = uniform.by_filename()
    raw = np.stack([rd.decoded(by_name[n]) for n in _names(extras)]).astype(np.float32)
    np.testing.assert_allclose(images.numpy(), (raw * 2 - mean) / np.array(std), rtol=1e-5, atol=1e-5)


def test_color_modes(mixed):
    for mode, channels in (("grayscale", 1), ("rgba", 4)):
        ds = image_dataset_from_tfrecords(mixed.data_dir, batch_size=14, image_size=(4, 4), color_mode=mode)
        assert next(iter(ds))[0].shape == (14, 4, 4, channels)


def test_standard_augmentation(mixed):
    def build():
        return image_dataset_from_tfrecords(
            mixed.data_dir, batch_size=7, image_size=(9, 11), augment="standard", seed=2,
            extra_features=NAMES, dtype="bfloat16",
        )

    first = [(x.numpy(), _names(e)) for x, _, e in build()]
    assert all(x.shape == (7, 9, 11, 3) and x.dtype == tf.bfloat16.as_numpy_dtype for x, _ in first)
    assert all(0 <= x.astype(np.float32).min() and x.astype(np.float32).max() <= 255 for x, _ in first)
    # Reproducible with a seed, pixels included.
    second = [(x.numpy(), _names(e)) for x, _, e in build()]
    for (x1, n1), (x2, n2) in zip(first, second):
        assert n1 == n2
        np.testing.assert_array_equal(x1, x2)
    # Differs from the plain resize.
    plain = image_dataset_from_tfrecords(
        mixed.data_dir, batch_size=7, image_size=(9, 11), seed=2, extra_features=NAMES,
        dtype="bfloat16",
    )
    assert any(not np.array_equal(a[0], b.numpy()) for a, (b, _, _) in zip(first, plain))


def test_user_augmentation_runs_per_example_before_batching(uniform):
    calls = []

    def invert(image):
        calls.append(image.shape.as_list())  # traced once, per example
        return 255.0 - image

    ds = image_dataset_from_tfrecords(
        uniform.data_dir, batch_size=7, image_size=(10, 13), augment=invert, dtype="uint8",
        extra_features=NAMES,
    )
    images, _, extras = next(iter(ds))
    assert calls and calls[0] == [10, 13, 3]
    by_name = uniform.by_filename()
    for image, name in zip(images.numpy(), _names(extras)):
        np.testing.assert_array_equal(image, 255 - rd.decoded(by_name[name]))


def test_repeat_and_cache(mixed):
    # Deterministic: otherwise parallel stages may move a few records across
    # the epoch boundary.
    ds = image_dataset_from_tfrecords(
        mixed.data_dir, batch_size=4, image_size=(4, 4), repeat=True, extra_features=NAMES,
        seed=4,
    )
    assert ds.cardinality() in (tf.data.INFINITE_CARDINALITY, tf.data.UNKNOWN_CARDINALITY)
    names = _epoch_names(ds.take(7))  # 28 records: two epochs of 14
    assert sorted(names[:14]) == sorted(names[14:]) == sorted(mixed.by_filename())
    assert names[:14] != names[14:]  # reshuffled
    cached = image_dataset_from_tfrecords(
        mixed.data_dir, batch_size=4, image_size=(4, 4), cache=True, extra_features=NAMES
    )
    for _ in range(2):
        assert sorted(_epoch_names(cached)) == sorted(mixed.by_filename())
    cached_repeat = image_dataset_from_tfrecords(
        mixed.data_dir, batch_size=7, image_size=(4, 4), cache=True, repeat=True,
        extra_features=NAMES, deterministic=True,
    )
    names = _epoch_names(cached_repeat.take(6))
    for epoch in range(3):
        assert sorted(names[14 * epoch : 14 * (epoch + 1)]) == sorted(mixed.by_filename())


def test_signature_defaults_are_the_config_defaults():
    params = inspect.signature(image_dataset_from_tfrecords).parameters
    groups = (ImageOptions, ShuffleOptions, ReadOptions, ServiceReadOptions)
    fields = {f.name: f.default for g in groups for f in dataclasses.fields(g)}
    assert set(fields) == set(OPTION_NAMES)
    keyword_only = {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    # `version` picks the shards (as data_dir and split do), not how they are read.
    assert keyword_only.pop("version") is None
    # The whole groups, None by default.
    assert {name: keyword_only.pop(name) for name in GROUP_NAMES} == dict.fromkeys(GROUP_NAMES)
    assert set(keyword_only) == set(fields)
    for name, default in fields.items():
        assert keyword_only[name] == default, name
    assert ReaderConfig().batch_size == 32 and ReaderConfig().dtype == "float32"


def test_options_by_name_and_as_groups_read_the_same(mixed):
    by_name = image_dataset_from_tfrecords(
        mixed.data_dir, batch_size=4, image_size=(8, 8), resize="crop", shuffle=False, seed=1, label_mode="categorical")
    grouped = image_dataset_from_tfrecords(
        mixed.data_dir, reading=ReadOptions(batch_size=4, label_mode="categorical"),
        image=ImageOptions(image_size=(8, 8), resize="crop"), shuffling=ShuffleOptions(shuffle=False, seed=1))
    mixed_spelling = image_dataset_from_tfrecords(
        mixed.data_dir, image=ImageOptions(image_size=(8, 8), resize="crop"), batch_size=4, shuffle=False,
        seed=1, label_mode="categorical")
    first = [(x.numpy(), y.numpy()) for x, y in by_name]
    for other in (grouped, mixed_spelling):
        pairs = [(x.numpy(), y.numpy()) for x, y in other]
        assert len(pairs) == len(first) > 0
        for (x0, y0), (x1, y1) in zip(first, pairs):
            np.testing.assert_array_equal(x0, x1)
            np.testing.assert_array_equal(y0, y1)
    assert grouped.class_names == by_name.class_names


def test_a_group_and_its_options_by_name_are_refused(mixed):
    with pytest.raises(TypeError, match=r"Pass `image` or its options \['image_size'\], not both"):
        image_dataset_from_tfrecords(mixed.data_dir, image=ImageOptions(), image_size=(8, 8))
    with pytest.raises(TypeError, match=r"`reading` must be a ReadOptions. Received: reading=\{"):
        image_dataset_from_tfrecords(mixed.data_dir, reading={"batch_size": 4})


def test_deterministic_defaults_follow_the_seed():
    assert ReaderConfig(seed=1).is_deterministic
    assert not ReaderConfig().is_deterministic
    assert not ReaderConfig(seed=1, deterministic=False).is_deterministic


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"batch_size": 0}, ValueError, r"`batch_size` must be a positive integer or None. Received: batch_size=0"),
        ({"batch_size": 2.0}, ValueError, r"Received: batch_size=2.0"),
        ({"image_size": 224}, ValueError, r"`image_size` must be a tuple of two positive integers.*Received: image_size=224"),
        ({"image_size": (0, 3)}, ValueError, r"Received: image_size=\(0, 3\)"),
        ({"image_size": None}, ValueError, r"holds images of several sizes.*pass image_size=.*batch_size=32"),
        ({"color_mode": "bgr"}, ValueError, r"`color_mode` must be one of \('grayscale', 'rgb', 'rgba'\) or None \(every band, as stored\). Received: color_mode='bgr'"),
        ({"shuffle": "yes"}, TypeError, r"`shuffle` must be one of \(True, False, 'shards', 'global'\). Received: shuffle='yes'"),
        ({"seed": "1"}, TypeError, r"`seed` must be an integer or None. Received: seed='1'"),
        ({"label_mode": "onehot"}, ValueError, r"`label_mode` must be one of \('int', 'categorical', 'binary', 'mask', 'boxes', 'oriented_boxes', 'multi_hot', 'target', None\). Received: label_mode='onehot'"),
        ({"resize": "fit"}, ValueError, r"`resize` must be one of \('stretch', 'pad', 'crop'\). Received: resize='fit'"),
        ({"crop_fraction": 0.0, "resize": "crop"}, ValueError, r"`crop_fraction` must be a number in \(0, 1\]. Received: crop_fraction=0.0"),
        ({"crop_fraction": 0.875}, ValueError, r"`crop_fraction` only applies to resize='crop'.*resize='stretch'"),
        ({"interpolation": "cubic"}, ValueError, r"`interpolation` must be one of .*'bilinear'.*Received: interpolation='cubic'"),
        ({"dtype": "int32"}, ValueError, r"`dtype` must be one of \('float32', 'bfloat16', 'float16', 'uint8', 'uint16'\). Received: dtype='int32'"),
        ({"dtype": "pixels"}, ValueError, r"Received: dtype='pixels'"),
        ({"scale": 1 / 255, "dtype": "uint8"}, ValueError, r"`scale` needs a float `dtype`.*dtype='uint8'"),
        ({"scale": "1/255"}, TypeError, r"`scale` must be a number or a sequence.*Received: scale='1/255'"),
        ({"scale": (1.0, 2.0)}, ValueError, r"`scale` must have 1 or 3 values for color_mode='rgb'"),
        ({"normalize": (0.5,)}, TypeError, r"`normalize` must be a pair \(mean, std\). Received: normalize=\(0.5,\)"),
        ({"normalize": (0.5, 0.0)}, ValueError, r"`normalize std` must not contain zero"),
        ({"augment": "heavy"}, ValueError, r"`augment` must be one of \(None, 'standard'\) or a callable.*Received: augment='heavy'"),
        ({"augment": "standard", "image_size": None, "batch_size": None}, ValueError, r"`augment` needs a fixed `image_size`"),
        ({"extra_features": FILENAME.key}, TypeError, r"`extra_features` must be a tuple of feature keys"),
        ({"extra_features": (FILENAME.key, FILENAME.key)}, ValueError, r"must not repeat a key"),
        ({"extra_features": (IMAGE.key,)}, ValueError, r"`extra_features` must be a subset of this dataset's features"),
        ({"extra_features": (LABEL.key + "s",)}, ValueError, r"must be a subset.*Received: extra_features="),
        ({"deterministic": 1}, TypeError, r"`deterministic` must be True or False. Received: deterministic=1"),
        ({"cache": ""}, TypeError, r"`cache` must be True, False or a file path prefix. Received: cache=''"),
        ({"shuffle_buffer": 0}, ValueError, r"`shuffle_buffer` must be a positive integer or None. Received: shuffle_buffer=0"),
        ({"reduced_decode": "yes"}, TypeError, r"`reduced_decode` must be True or False. Received: reduced_decode='yes'"),
        ({"reduced_decode": True, "label_mode": "mask"}, ValueError, r"reduced_decode=True.*read them with reduced_decode=False.*label_mode='mask'"),
    ],
)
def test_bad_arguments(mixed, kwargs, error, match):
    with pytest.raises(error, match=match):
        image_dataset_from_tfrecords(mixed.data_dir, **kwargs)


def test_unknown_argument_is_a_type_error(mixed):
    with pytest.raises(TypeError, match=r"unknown options \['label_mod'\] \(did you mean \['label_mode'\]\?\)"):
        image_dataset_from_tfrecords(mixed.data_dir, label_mod="int")


# --- Option groups ---------------------------------------------------------------


def test_config_is_composed_of_its_option_groups():
    config = ReaderConfig(batch_size=8, image_size=[6, 7], dtype=tf.bfloat16, seed=3)
    assert config.reading == ReadOptions(batch_size=8)
    assert config.image == ImageOptions(image_size=(6, 7), dtype="bfloat16")
    assert config.shuffling == ShuffleOptions(seed=3)
    # Every option is readable by name, with its validated value.
    assert (config.batch_size, config.image_size, config.dtype, config.seed) == (8, (6, 7), "bfloat16", 3)
    assert ReaderConfig(image=ImageOptions(image_size=(6, 7), dtype="bfloat16"),
                        batch_size=8, seed=3) == config
    assert config.replace(seed=4).shuffling.seed == 4 and config.replace(seed=4).image == config.image
    assert dataclasses.replace(config, reading=ReadOptions(batch_size=2)).batch_size == 2
    assert set(config.options()) == set(OPTION_NAMES)
    with pytest.raises(AttributeError, match="no attribute 'batchsize'"):
        config.batchsize


def test_config_refuses_a_group_with_its_options_or_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"Pass `image` or its options \['dtype'\], not both"):
        ReaderConfig(image=ImageOptions(), dtype="uint8")
    with pytest.raises(TypeError, match=r"`shuffling` must be a ShuffleOptions. Received: shuffling=\{"):
        ReaderConfig(shuffling={"seed": 1})
    with pytest.raises(TypeError, match=r"unknown options \['label_mod'\]"):
        ReaderConfig(label_mod="int")


@pytest.mark.parametrize(
    "group, kwargs, error, match",
    [
        (ImageOptions, {"dtype": "int32"}, ValueError, r"`dtype` must be one of .*Received: dtype='int32'"),
        (ImageOptions, {"scale": (1.0, 2.0), "color_mode": "rgba"}, ValueError, r"1 or 4 values for color_mode='rgba'"),
        (ShuffleOptions, {"shuffle": "global", "shuffle_buffer": 8}, ValueError, r"`shuffle_buffer` does not apply to shuffle='global'.*Received: shuffle_buffer=8"),
        (ShuffleOptions, {"start": "0"}, TypeError, r"`start` must be a readers.ReadPosition or None. Received: start='0'"),
        (ReadOptions, {"max_bad_records": -1}, ValueError, r"`max_bad_records` must be a non-negative integer. Received: max_bad_records=-1"),
        (ReadOptions, {"repeat": 1}, TypeError, r"`repeat` must be True or False. Received: repeat=1"),
    ],
)
def test_each_group_validates_itself(group, kwargs, error, match):
    with pytest.raises(error, match=match):
        group(**kwargs)
    with pytest.raises(error, match=match):
        ReaderConfig(**kwargs)


def test_checks_across_groups_name_both_options():
    # Batching at the stored size depends on the split: checked when it is read (below).
    assert ReaderConfig(image_size=None, batch_size=4).image_size is None
    with pytest.raises(ValueError, match=r"`cache` does not apply to shuffle='global'.*Received: cache=True"):
        ReaderConfig(shuffle="global", cache=True)


# --- Extras with Keras -------------------------------------------------------------


def _tiny_model(num_classes):
    keras = tf.keras
    model = keras.Sequential(
        [keras.Input((4, 4, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
         keras.layers.Dense(num_classes)]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def test_without_extras_gives_fit_and_evaluate_what_they_take(mixed):
    common = dict(batch_size=4, image_size=(4, 4), shuffle=False, deterministic=True)
    with_names = image_dataset_from_tfrecords(mixed.data_dir, extra_features=NAMES, **common)
    plain = image_dataset_from_tfrecords(mixed.data_dir, **common)
    model = _tiny_model(len(with_names.class_names))
    history = model.fit(with_names.map(without_extras), epochs=2, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 2 and all(map(math.isfinite, history.history["loss"]))
    got = model.evaluate(with_names.map(without_extras), verbose=0, return_dict=True)
    assert got == pytest.approx(model.evaluate(plain, verbose=0, return_dict=True))
    # The file names stay with the predictions when the dataset itself is iterated.
    names, scores = [], []
    for images, _, extras in with_names:
        names.extend(_names(extras))
        scores.append(model.predict_on_batch(images))
    assert sorted(names) == sorted(mixed.by_filename())
    assert np.concatenate(scores).shape == (len(names), len(with_names.class_names))


def test_without_extras_leaves_images_alone_without_labels(mixed):
    ds = image_dataset_from_tfrecords(
        mixed.data_dir, batch_size=5, image_size=(4, 4), label_mode=None, extra_features=NAMES,
        shuffle=False, deterministic=True,
    )
    images = next(iter(ds.map(without_extras)))
    assert isinstance(images, tf.Tensor) and images.shape == (5, 4, 4, 3)
    predictions = _tiny_model(len(ds.class_names)).predict(ds.map(without_extras), verbose=0)
    assert predictions.shape == (len(mixed.by_filename()), len(ds.class_names))


@pytest.mark.parametrize("sizes", [((40, 52),), ((40, 52), (44, 36))], ids=["one_size", "sizes"])
@pytest.mark.parametrize("options", [{}, {"resize": "crop"}, {"augment": "standard", "seed": 3}],
                         ids=["stretch", "crop", "augment"])
def test_reduced_decode_reads_what_load_image_gives(tmp_path, sizes, options):
    # Opt-in: the reader's images are `load_image(..., reduced_decode=True)`'s (by batch for
    # JPEGs of one size, image by image otherwise); the default stays the exact path.
    written = rd.write_dataset(tmp_path, splits={"train": 5}, kinds=("rgb_jpeg", "rgb_png"),
                               sizes=sizes, num_shards=2)
    read = dict(image_size=(10, 12), batch_size=2, shuffle=False, extra_features=NAMES,
                **options)
    by_name = written.by_filename()
    def images_by_name(**more):
        ds = image_dataset_from_tfrecords(written.data_dir, **read, **more)
        return {name: image for images, _, extras in ds
                for image, name in zip(images.numpy(), _names(extras))}

    fast, exact = images_by_name(reduced_decode=True), images_by_name()
    assert sorted(fast) == sorted(exact) == sorted(by_name)
    differs = False
    for name, image in fast.items():
        source = by_name[name]
        if source.kind == "rgb_png":  # decoded whole either way
            np.testing.assert_array_equal(image, exact[name])
        else:
            differs = differs or not np.array_equal(image, exact[name])
        if not options:
            expected = preprocess.load_image(tf.constant(source.data), image_size=(10, 12),
                                             reduced_decode=True)
            np.testing.assert_allclose(image, expected.numpy(), atol=1e-4)
    assert differs


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """Records over the by-batch limit (noise images of 200x180): the per-image stages."""
    return rd.write_dataset(tmp_path_factory.mktemp("large"), splits={"train": 5},
                            kinds=("rgb_jpeg", "rgb_png"), sizes=((200, 180), (150, 210)),
                            num_shards=2)


@pytest.mark.parametrize("options", [
    dict(dtype="uint8"), dict(dtype="uint16"), dict(dtype="float16", scale=1 / 255),
    dict(dtype="bfloat16", normalize=(127.5, 64.0)), dict(dtype="uint8", resize="crop"),
    dict(dtype="uint8", augment="standard", seed=4),
], ids=["uint8", "uint16", "float16", "bfloat16", "uint8_crop", "uint8_augment"])
def test_narrow_dtypes_converted_per_image_equal_the_batch_conversion(large, options):
    # 8- and 16-bit outputs are converted per image, before the batch (a smaller copy into
    # it): the values of converting the float32 batch, as before.
    read = dict(image_size=(24, 20), batch_size=2, shuffle=False, extra_features=NAMES)
    dtype, scale, normalize = options["dtype"], options.get("scale"), options.get("normalize")
    geometry = {k: v for k, v in options.items() if k not in ("dtype", "scale", "normalize")}

    def by_name(ds):
        return {name: image for images, _, extras in ds
                for image, name in zip(images.numpy(), _names(extras))}

    got = by_name(image_dataset_from_tfrecords(large.data_dir, **read, **options))
    if dtype == "uint16":
        # Decoded at 16-bit depth, each image on its own, then converted.
        reference = {n: preprocess.convert_images(
            preprocess.load_image(tf.constant(s.data), image_size=(24, 20), depth=tf.uint16),
            "uint16").numpy() for n, s in large.by_filename().items()}
    else:
        # The float32 read of the same geometry (and seed), converted per batch.
        floats = by_name(image_dataset_from_tfrecords(large.data_dir, **read, **geometry))
        reference = {n: preprocess.convert_images(tf.constant(v)[None], dtype, scale=scale,
                                                  normalize=normalize)[0].numpy()
                     for n, v in floats.items()}
    assert sorted(got) == sorted(reference) and len(got) == 5
    for name, image in got.items():
        assert image.dtype == reference[name].dtype
        np.testing.assert_array_equal(image, reference[name])
