"""schemas.volumes: a volume record written by its spec, read back by TensorFlow's own parser."""

import numpy as np
import pytest

from schemas.volumes import (VOLUME, VOLUME_AFFINE, VOLUME_DTYPE, VOLUME_SCHEMA, VOLUME_SHAPE,
                             VOLUME_SPACING, VolumeRecord)
from schemas import FILENAME, LABEL


def _record(dtype="int16"):
    rng = np.random.default_rng(0)
    volume = rng.integers(-1000, 3000, size=(4, 5, 6)).astype(dtype)
    affine = np.array([[-0.7, 0, 0, 120.5], [0, -0.7, 0, 99.25], [0, 0, 2.5, -300.125], [0, 0, 0, 1]])
    return VolumeRecord(volume=volume, spacing=(2.5, 0.7, 0.7), affine=affine, label=3,
                        filename="ct/patient 1/series", modality="CT")


@pytest.mark.parametrize("dtype", ["int16", "float32", ">i2"])
def test_tensorflow_parses_what_the_spec_encodes(dtype):
    import tensorflow as tf

    record = _record(dtype)
    serialized = VOLUME_SCHEMA.encode(record)
    # TensorFlow's own Example proto reads the bytes.
    example = tf.train.Example.FromString(serialized)
    assert example.features.feature[VOLUME_SHAPE.key].int64_list.value == [4, 5, 6]
    parsed = VOLUME_SCHEMA.finish_parsed(tf.io.parse_single_example(serialized, VOLUME_SCHEMA.parse_spec()))
    stored = np.dtype(dtype).newbyteorder("=").name
    assert parsed[VOLUME_DTYPE.key].numpy().decode() == stored
    volume = tf.reshape(tf.io.decode_raw(parsed[VOLUME.key], tf.as_dtype(stored), little_endian=True),
                        parsed[VOLUME_SHAPE.key]).numpy()
    np.testing.assert_array_equal(volume, record.volume)
    np.testing.assert_array_equal(parsed[VOLUME_AFFINE.key].numpy(), record.affine)
    assert parsed[VOLUME_AFFINE.key].dtype == tf.float64
    np.testing.assert_array_equal(parsed[VOLUME_SPACING.key].numpy(), [2.5, 0.7, 0.7])
    assert int(parsed[LABEL.key]) == 3
    assert parsed[FILENAME.key].numpy() == b"ct/patient 1/series"


def test_python_decode_and_determinism():
    record = _record()
    serialized = VOLUME_SCHEMA.encode(record)
    assert serialized == VOLUME_SCHEMA.encode(_record())
    decoded = VOLUME_SCHEMA.decode(serialized)
    np.testing.assert_array_equal(decoded[VOLUME.key], record.volume)
    np.testing.assert_array_equal(decoded[VOLUME_AFFINE.key], record.affine)
    assert decoded[FILENAME.key] == record.filename and decoded[LABEL.key] == 3


def test_refuses_what_is_not_a_volume():
    with pytest.raises(ValueError, match="3-D"):
        VOLUME_SCHEMA.encode(VolumeRecord(np.zeros((3, 3), np.int16), (1, 1, 1), np.eye(4), 0, "x"))
    with pytest.raises(ValueError, match="dtype"):
        VOLUME_SCHEMA.encode(VolumeRecord(np.zeros((2, 3, 3), np.complex64), (1, 1, 1), np.eye(4), 0, "x"))
    with pytest.raises(ValueError, match="affine"):
        VOLUME_SCHEMA.encode(VolumeRecord(np.zeros((2, 3, 3), np.int16), (1, 1, 1), np.eye(3), 0, "x"))


def test_a_volume_record_framed_as_parts_is_the_framed_record_and_holds_its_voxels_uncopied():
    """`encode_parts` + `tfrecord.frame_parts`: the same bytes as `frame_record(encode(...))`, read back by
    TensorFlow's TFRecordDataset; the voxels travel as a view of their array (no copy of the volume)."""
    import tempfile

    import tensorflow as tf

    from schemas import tfrecord
    from schemas.volumes import VOLUME_SCHEMA, VolumeRecord

    voxels = np.random.default_rng(7).integers(-1024, 3000, (9, 300, 301)).astype(np.int16)  # > 1 CRC chunk
    record = VolumeRecord(voxels, (2.5, 0.7, 0.7), np.diag([-0.7, -0.7, 2.5, 1.0]), 1, "c/p")
    parts = tfrecord.frame_parts(VOLUME_SCHEMA.encode_parts(record))
    assert b"".join(bytes(p) for p in parts) == tfrecord.frame_record(VOLUME_SCHEMA.encode(record))
    big = [p for p in parts if not isinstance(p, bytes)]
    assert len(big) == 1 and np.shares_memory(np.frombuffer(big[0], np.uint8), voxels)
    with tempfile.NamedTemporaryFile(suffix=".tfrecord") as f:
        for p in parts:
            f.write(p)
        f.flush()
        (raw,) = list(tf.data.TFRecordDataset(f.name))
    np.testing.assert_array_equal(VOLUME_SCHEMA.decode(raw.numpy())["volume"], voxels)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", ">u2"])
def test_a_masked_record_holds_its_ids_little_endian_as_tensorflow_parses_them(dtype):
    import dataclasses

    import tensorflow as tf

    from schemas.volumes import VOLUME_MASK, VOLUME_MASK_SCHEMA, VolumeExampleSchema

    record = _record()
    ids = (np.arange(120).reshape(4, 5, 6) * (300 if np.dtype(dtype).itemsize == 2 else 2)).astype(dtype)
    masked = dataclasses.replace(record, mask=ids)
    serialized = VOLUME_MASK_SCHEMA.encode(masked)
    raw = tf.io.parse_single_example(serialized, VOLUME_MASK_SCHEMA.parse_spec())[VOLUME_MASK.key]
    stored = np.dtype(dtype).newbyteorder("=").name
    back = tf.reshape(tf.io.decode_raw(raw, tf.as_dtype(stored), little_endian=True), [4, 5, 6]).numpy()
    np.testing.assert_array_equal(back, ids)
    decoded = VOLUME_MASK_SCHEMA.decode(serialized)  # Its width told by its byte count.
    np.testing.assert_array_equal(decoded[VOLUME_MASK.key], ids)
    assert decoded[VOLUME_MASK.key].dtype.name == stored
    # The manifest's features say which schema; the plain one parses a masked record too.
    assert VolumeExampleSchema.from_json(VOLUME_MASK_SCHEMA.to_json()) == VOLUME_MASK_SCHEMA != VOLUME_SCHEMA
    assert VolumeExampleSchema.from_json(VOLUME_SCHEMA.to_json()) == VOLUME_SCHEMA
    np.testing.assert_array_equal(VOLUME_SCHEMA.decode(serialized)[VOLUME.key], record.volume)


def test_a_mask_must_fit_its_schema_and_volume():
    import dataclasses

    from schemas.volumes import VOLUME_MASK_SCHEMA

    record = _record()
    for mask in (None, np.zeros((4, 5, 7), np.uint8), np.zeros((4, 5, 6), np.int32)):
        with pytest.raises(ValueError, match="its mask must be"):
            VOLUME_MASK_SCHEMA.encode(dataclasses.replace(record, mask=mask))
    with pytest.raises(ValueError, match="its schema holds none"):
        VOLUME_SCHEMA.encode(dataclasses.replace(record, mask=np.zeros((4, 5, 6), np.uint8)))
