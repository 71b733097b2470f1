"""readers.volume_dataset_from_tfrecords on shards written with the schema's encoder."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import ndimage

import readers
from schemas.volumes import VOLUME_SCHEMA, VolumeRecord


def _affine(offset=0.0):
    return np.array([[-0.8, 0, 0, 100.0 + offset], [0, -0.7, 0, 50.0], [0, 0, 2.5, -30.0], [0, 0, 0, 1]])


def _volumes():
    rng = np.random.default_rng(0)
    return [
        VolumeRecord(rng.integers(-1000, 1000, (6, 10, 12)).astype(np.int16), (2.5, 0.7, 0.8), _affine(), 0, "a"),
        VolumeRecord(rng.integers(-1000, 1000, (5, 9, 8)).astype(np.int16), (2.5, 0.7, 0.8), _affine(5), 1, "b"),
        VolumeRecord(rng.normal(size=(4, 7, 7)).astype(np.float32), (2.5, 0.7, 0.8), _affine(9), 1, "c"),
    ]


@pytest.fixture
def data_dir(tmp_path):
    records = _volumes()
    for index, record in enumerate(records):
        with tf.io.TFRecordWriter(str(tmp_path / f"train-{index:05d}-of-00003.tfrecord")) as writer:
            writer.write(VOLUME_SCHEMA.encode(record))
    return tmp_path


def test_as_stored(data_dir):
    ds = readers.volume_dataset_from_tfrecords(data_dir, "train", dtype=None,
                                                extra_features=("volume/affine", "volume/spacing", "filename"))
    got = list(ds.take(2))
    for (volume, label, extras), record in zip(got, _volumes()):
        assert volume.dtype == tf.int16 and volume.shape == record.volume.shape + (1,)
        np.testing.assert_array_equal(volume.numpy()[..., 0], record.volume)
        assert int(label) == record.label
        np.testing.assert_array_equal(extras["volume/affine"].numpy(), record.affine)
        assert extras["volume/affine"].dtype == tf.float64
        assert extras["filename"].numpy().decode() == record.filename


def test_float_of_any_stored_dtype(data_dir):
    got = list(readers.volume_dataset_from_tfrecords(data_dir, "train"))
    for (volume, _), record in zip(got, _volumes()):
        assert volume.dtype == tf.float32
        np.testing.assert_array_equal(volume.numpy()[..., 0], record.volume.astype(np.float32))


def test_volume_size_is_trilinear_as_scipy(data_dir):
    ds = readers.volume_dataset_from_tfrecords(data_dir, "train", batch_size=3, volume_size=(8, 16, 16),
                                                extra_features=("volume/affine",))
    volumes, labels, extras = next(iter(ds))
    assert volumes.shape == (3, 8, 16, 16, 1)
    for volume, affine, record in zip(volumes.numpy(), extras["volume/affine"].numpy(), _volumes()):
        zoom = np.array((8, 16, 16)) / record.volume.shape
        # scipy's linear zoom with half-pixel centres (grid_mode) is tf.image.resize's bilinear.
        want = ndimage.zoom(record.volume.astype(np.float64), zoom, order=1, grid_mode=True, mode="nearest")
        np.testing.assert_allclose(volume[..., 0], want, atol=1e-2, rtol=1e-4)
        # Voxel centre (i, j, k) of the resampled volume is at old index (n + 0.5) / zoom - 0.5.
        old = (np.array([3, 5, 2]) + 0.5) / zoom[::-1] - 0.5
        np.testing.assert_allclose(affine @ [3, 5, 2, 1], record.affine @ [*old, 1])


def test_spacing_then_window(data_dir):
    ds = readers.volume_dataset_from_tfrecords(data_dir, "train", spacing=(5.0, 1.4, 1.6), window=(0, 1000),
                                                extra_features=("volume/spacing",))
    volume, _, extras = next(iter(ds))
    assert volume.shape == (3, 5, 6, 1)
    np.testing.assert_allclose(extras["volume/spacing"].numpy(), (5.0, 1.4, 1.6))
    assert float(tf.reduce_min(volume)) >= 0 and float(tf.reduce_max(volume)) <= 1


def test_patches_are_seeded_crops_the_affine_locates(data_dir):
    def patches(seed):
        return list(readers.volume_dataset_from_tfrecords(
            data_dir, "train", patch_size=(4, 6, 6), patches_per_volume=3, seed=seed,
            extra_features=("volume/affine", "filename")))
    first, again, other = patches(1), patches(1), patches(2)
    assert len(first) == 9
    for (a, _, _), (b, _, _) in zip(first, again):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert any(not np.array_equal(a.numpy(), b.numpy()) for (a, _, _), (b, _, _) in zip(first, other))
    records = {r.filename: r for r in _volumes()}
    for patch, _, extras in first:
        record = records[extras["filename"].numpy().decode()]
        i, j, k, _ = np.round(np.linalg.inv(record.affine) @ extras["volume/affine"].numpy()[:, 3]).astype(int)
        np.testing.assert_array_equal(patch.numpy()[..., 0],
                                      record.volume[k:k + 4, j:j + 6, i:i + 6].astype(np.float32))


def test_input_context_shards_files(data_dir):
    names = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline)
        ds = readers.volume_dataset_from_tfrecords(data_dir, "train", input_context=context,
                                                    extra_features=("filename",))
        names.append(sorted(e[2]["filename"].numpy().decode() for e in ds))
    assert names == [["a", "c"], ["b"]]


def test_fewer_files_than_pipelines_shard_records_as_the_image_reader_does(data_dir, caplog):
    """3 shard files, 4 pipelines: every pipeline reads each file and keeps one record in every 4 (the
    same share whatever the seed), a warning says so; tf.distribute's own sharding is off."""
    import logging

    for options in ({}, {"shuffle": True, "seed": 3}):
        names = []
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="readers"):
            for pipeline in range(4):
                context = tf.distribute.InputContext(num_input_pipelines=4, input_pipeline_id=pipeline)
                ds = readers.volume_dataset_from_tfrecords(data_dir, "train", input_context=context,
                                                            extra_features=("filename",), **options)
                policy = ds.options().experimental_distribute.auto_shard_policy
                assert policy == tf.data.experimental.AutoShardPolicy.OFF
                names.append(sorted(e[2]["filename"].numpy().decode() for e in ds))
        assert sorted(sum(names, [])) == ["a", "b", "c"] and sorted(map(len, names)) == [0, 1, 1, 1]
        assert any("3 shard file(s) for 4 input pipelines" in r.getMessage() for r in caplog.records)
    # One file of three volumes, two pipelines: both read (files alone would give one of them none).
    one = data_dir / "one"
    one.mkdir()
    with tf.io.TFRecordWriter(str(one / "train-00000-of-00001.tfrecord")) as writer:
        for record in _volumes():
            writer.write(VOLUME_SCHEMA.encode(record))
    names = [sorted(e[2]["filename"].numpy().decode() for e in readers.volume_dataset_from_tfrecords(
        one, "train", input_context=tf.distribute.InputContext(2, p), extra_features=("filename",)))
        for p in range(2)]
    assert names == [["a", "c"], ["b"]]


def test_mirrored_strategy_reads_every_volume_once_across_replicas(data_dir):
    """distribute_datasets_from_function on 2 logical CPUs (a fresh interpreter: devices are set
    before TensorFlow starts): every patch reaches one replica, on that replica's device."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    child = Path(__file__).resolve().parent / "_reader_volume_strategy_child.py"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, str(child), str(data_dir)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert sorted(sum(result["names_per_replica"], [])) == ["a", "a", "b", "b", "c", "c"]
    assert all(result["names_per_replica"])  # both replicas got patches
    assert result["shapes"] == [[4, 4, 4, 1]]
    assert result["devices"] == ["/job:localhost/replica:0/task:0/device:CPU:0",
                                 "/job:localhost/replica:0/task:0/device:CPU:1"]
    assert result["label_sum"] == 2 * (0 + 1 + 1)


def test_options_name_the_argument(data_dir):
    with pytest.raises(ValueError, match="batch_size"):
        readers.volume_dataset_from_tfrecords(data_dir, "train", batch_size=2)
    with pytest.raises(ValueError, match="patch_size"):
        readers.volume_dataset_from_tfrecords(data_dir, "train", patch_size=(0, 2, 2))
    with pytest.raises(ValueError, match="extra_features"):
        readers.volume_dataset_from_tfrecords(data_dir, "train", extra_features=("volume",))


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16", "int32", "float32", "float64"])
def test_patches_of_every_stored_dtype_padded_and_windowed_as_numpy_does(tmp_path, dtype):
    """Patches are cut from the stored bytes: each dtype, a volume smaller than the patch, a window."""
    rng = np.random.default_rng(1)
    volume = (rng.normal(size=(5, 9, 8)) * 50 + (60 if dtype.startswith("u") else 0)).astype(dtype)
    record = VolumeRecord(volume, (2.5, 0.7, 0.8), _affine(), 0, "v")
    with tf.io.TFRecordWriter(str(tmp_path / "train-00000-of-00001.tfrecord")) as writer:
        writer.write(VOLUME_SCHEMA.encode(record))
    size = (8, 6, 10)  # Deeper and wider than the volume: padded with its lowest value.
    got = list(readers.volume_dataset_from_tfrecords(tmp_path, "train", patch_size=size, patches_per_volume=3,
                                                     window=(20, 100), seed=4, extra_features=("volume/affine",)))
    assert len(got) == 3
    pad = np.maximum(np.array(size) - volume.shape, 0)
    padded = np.pad(volume.astype(np.float32), np.stack([pad // 2, pad - pad // 2], axis=1),
                    constant_values=volume.min())
    for patch, _, extras in got:
        i, j, k, _ = np.round(np.linalg.inv(record.affine) @ extras["volume/affine"].numpy()[:, 3]).astype(int)
        k, j, i = np.array([k, j, i]) + pad // 2
        want = np.clip((padded[k:k + 8, j:j + 6, i:i + 10] - (20 - 50)) / 100, 0, 1)
        np.testing.assert_allclose(patch.numpy()[..., 0], want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32"])
def test_foreground_voxels_are_those_a_flat_search_of_the_mask_gives(dtype):
    """`foreground_fraction`'s centres: the (rank % n)-th foreground voxel in row-major order, as numpy
    lists them, whatever rows hold it (none, the first, the last, one voxel in all), shape unknown."""
    from readers.volumes import foreground_voxels

    rng = np.random.default_rng(7)
    search = tf.function(foreground_voxels, input_signature=[tf.TensorSpec([None, None, None], dtype),
                                                             tf.TensorSpec([None], tf.int64)])
    masks = [np.zeros((3, 4, 5), dtype), np.ones((2, 1, 7), dtype)]
    last = np.zeros((4, 3, 6), dtype)
    last[-1, -1, -1] = 300 if dtype != "uint8" else 200
    masks.append(last)
    for _ in range(20):
        shape = tuple(int(n) for n in rng.integers(1, 12, 3))
        share = rng.choice([0.005, 0.1, 0.6])
        masks.append(((rng.random(shape) < share) * rng.integers(1, 255, shape)).astype(dtype))
    for mask in masks:
        ranks = rng.integers(0, 2**31 - 1, 9)
        flat = np.flatnonzero(mask > 0)
        n, got = search(tf.constant(mask), tf.constant(ranks, tf.int64))
        assert int(n) == flat.size
        if flat.size:
            np.testing.assert_array_equal(got.numpy(), flat[ranks % flat.size])
