"""Tests of readers.decode: records back to the tensors that were stored."""

import numpy as np
import pytest
import tensorflow as tf

from readers import decode
from readers.metadata import load_split
from schemas import CHANNELS, FILENAME, FORMAT, HEIGHT, IMAGE, IMAGE_SCHEMA, LABEL, WIDTH

import _reader_data as rd


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return rd.write_dataset(
        tmp_path_factory.mktemp("decode"),
        splits={"train": 12},
        kinds=tuple(rd.KINDS),
        num_shards=2,
    )


@pytest.fixture(scope="module")
def serialized(written):
    """Every record of the split, as stored."""
    paths = list(load_split(written.data_dir, "train").paths)
    return [r.numpy() for r in tf.data.TFRecordDataset(paths)]


def _source(written, features):
    return written.by_filename()[features[FILENAME.key].numpy().decode()]


def test_decode_example_round_trips_every_record(written, serialized):
    assert len(serialized) == len(written.sources["train"])
    seen = set()
    for record in serialized:
        features = decode.decode_example(record)
        source = _source(written, features)
        seen.add(source.filename)
        assert set(features) == {spec.key for spec in IMAGE_SCHEMA.features}
        image = features[IMAGE.key]
        assert image.dtype == tf.uint8
        np.testing.assert_array_equal(image.numpy(), rd.decoded(source))
        assert features[LABEL.key].dtype == tf.int64
        assert int(features[LABEL.key]) == source.label
        assert features[FORMAT.key].numpy().decode() == rd.KINDS[source.kind][1].lower()
        height, width = source.pixels.shape[:2]
        assert (int(features[HEIGHT.key]), int(features[WIDTH.key])) == (height, width)
        assert int(features[CHANNELS.key]) == rd.KINDS[source.kind][3]
    assert seen == set(written.by_filename())


@pytest.mark.parametrize("num_channels", [1, 3, 4])
def test_requested_channels(written, serialized, num_channels):
    channels = num_channels
    for record in serialized:
        features = decode.decode_example(record, channels=channels, keys=[IMAGE.key, FILENAME.key])
        source = _source(written, features)
        image = features[IMAGE.key].numpy()
        assert image.shape == source.pixels.shape[:2] + (channels,)
        if rd.KINDS[source.kind][1] == "JPEG" and channels == 4:
            # JPEG has no alpha: the colour channels, plus opaque alpha.
            np.testing.assert_array_equal(image[..., :3], rd.decoded(source, 3))
            assert (image[..., 3] == 255).all()
        else:
            np.testing.assert_array_equal(image, rd.decoded(source, channels))


def test_uint16_keeps_16_bit_pngs_and_scales_8_bit_sources(written, serialized):
    kinds = set()
    for record in serialized:
        features = decode.decode_example(record, channels=1, dtype=tf.uint16)
        source = _source(written, features)
        image = features[IMAGE.key].numpy()
        assert image.dtype == np.uint16
        if source.kind == "gray16_png":
            np.testing.assert_array_equal(image[..., 0], source.pixels)
        else:
            np.testing.assert_array_equal(image.astype(np.int64), rd.decoded(source, 1).astype(np.int64) * 257)
        kinds.add(source.kind)
    assert {"gray16_png", "rgb_jpeg", "rgb_png"} <= kinds


def test_16_bit_png_as_uint8_keeps_the_high_byte(written):
    source = next(s for s in written.sources["train"] if s.kind == "gray16_png")
    image = decode.decode_image(tf.constant(source.data), channels=1)
    np.testing.assert_array_equal(image.numpy()[..., 0], source.pixels >> 8)


def test_parse_examples_is_vectorised(written, serialized):
    batch = decode.parse_examples(tf.constant(serialized), [LABEL.key, FILENAME.key])
    assert set(batch) == {LABEL.key, FILENAME.key}
    assert batch[LABEL.key].shape == (len(serialized),)
    by_name = written.by_filename()
    for name, label in zip(batch[FILENAME.key].numpy(), batch[LABEL.key].numpy()):
        assert by_name[name.decode()].label == label


@pytest.fixture(scope="module")
def one_size(tmp_path_factory):
    """Three JPEGs (one grey) and a PNG, all 10x7."""
    written = rd.write_dataset(tmp_path_factory.mktemp("one_size"), splits={"train": 4},
                               kinds=("rgb_jpeg", "gray_jpeg", "rgb_jpeg", "rgb_png"),
                               sizes=((10, 7),) * 4, num_shards=1)
    return [s.data for s in written.sources["train"]]


@pytest.mark.parametrize("channels, dtype", [(3, tf.uint8), (1, tf.uint8), (4, tf.uint16)])
@pytest.mark.parametrize("batch_size", [None, 3, 5])  # A loop, a full batch, a partial one.
def test_batch_decode_equals_decode_of_each(one_size, channels, dtype, batch_size):
    # JPEGs alone are decoded without a loop when the batch size is known;
    # with the PNG, in a loop. Same pixels either way.
    for images in (one_size[:3], one_size):
        if batch_size is not None and len(images) > batch_size:
            continue
        encoded = tf.constant(images)
        batch = decode.decode_image_batch(encoded, batch_size=batch_size, channels=channels,
                                          dtype=dtype)
        each = [decode.decode_image(e, channels=channels, dtype=dtype) for e in encoded]
        assert batch.dtype == dtype
        np.testing.assert_array_equal(batch.numpy(), np.stack(each))


def test_batch_decode_in_a_function_and_its_limits(one_size):
    decode_three = tf.function(lambda e: decode.decode_image_batch(e, batch_size=3))
    assert decode_three(tf.constant(one_size[:2])).shape == (2, 10, 7, 3)
    assert decode_three(tf.constant([], tf.string)).shape == (0, 0, 0, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="more images than batch_size"):
        decode_three(tf.constant(one_size[:3] * 2))


@pytest.mark.parametrize("kind", ["rgb_jpeg", "gray_jpeg", "rgb_png", "gray16_png"])
def test_cropped_decode_equals_decode_then_crop(written, kind):
    source = next(s for s in written.sources["train"] if s.kind == kind)
    height, width = source.pixels.shape[:2]
    window = tf.constant([1, 2, height - 3, width - 4])
    for dtype in (tf.uint8, tf.uint16):
        full = decode.decode_image(tf.constant(source.data), dtype=dtype).numpy()
        expected = full[1 : height - 2, 2 : width - 2]
        cropped = decode.decode_cropped_image(tf.constant(source.data), window, dtype=dtype)
        cropped = cropped.numpy()
        assert cropped.shape == expected.shape and cropped.dtype == expected.dtype
        if rd.KINDS[kind][1] == "JPEG":
            # libjpeg upsamples subsampled chroma without the pixels beyond the
            # window, so its last row and column may differ slightly.
            np.testing.assert_array_equal(cropped[:-1, :-1], expected[:-1, :-1])
            diff = np.abs(cropped.astype(np.int64) - expected.astype(np.int64))
            assert diff.max() <= (32 if dtype == tf.uint8 else 32 * 257)
        else:
            np.testing.assert_array_equal(cropped, expected)


def test_image_shape(written):
    for source in written.sources["train"]:
        shape = decode.image_shape(tf.constant(source.data)).numpy()
        assert tuple(shape) == source.pixels.shape[:2]


def test_decode_inside_tf_function_has_static_channels(written):
    spec = tf.TensorSpec([], tf.string)
    fn = tf.function(lambda s: decode.decode_image(s, channels=4), input_signature=[spec])
    concrete = fn.get_concrete_function()
    assert concrete.structured_outputs.shape.as_list() == [None, None, 4]
    source = written.sources["train"][0]
    assert fn(tf.constant(source.data)).shape[-1] == 4


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(channels=2), r"`channels` must be one of \(1, 3, 4\). Received: channels=2"),
        (dict(channels=True), r"`channels` must be one of .*Received: channels=True"),
        (dict(dtype=tf.float32), r"`dtype` must be one of \['uint8', 'uint16'\].*float32"),
        (dict(dtype="nope"), r"`dtype` must be one of .*Received: dtype='nope'"),
    ],
)
def test_bad_arguments(written, kwargs, match):
    with pytest.raises(ValueError, match=match):
        decode.decode_image(tf.constant(written.sources["train"][0].data), **kwargs)


def test_unknown_key(serialized):
    with pytest.raises(ValueError, match="Unknown feature keys"):
        decode.decode_example(serialized[0], keys=[IMAGE.key + "_nope"])


@pytest.mark.parametrize("channels", [1, 3])
def test_decode_image_needs_no_format_test_for_8_bit_rgb_or_gray(written, serialized, channels):
    # TensorFlow's decode_image decodes a JPEG as decode_jpeg does: the same pixels, so the
    # format `tf.cond` (two branch functions to instantiate before a first batch) is left out.
    for record in serialized:
        encoded = decode.parse_examples(tf.constant(record), [IMAGE.key])[IMAGE.key]
        expected = (tf.io.decode_jpeg(encoded, channels=channels) if tf.io.is_jpeg(encoded)
                    else tf.io.decode_image(encoded, channels=channels, expand_animations=False))
        np.testing.assert_array_equal(decode.decode_image(encoded, channels=channels).numpy(),
                                      expected.numpy())
    spec = tf.TensorSpec([], tf.string)
    graph = tf.function(lambda e: decode.decode_image(e, channels=channels)).get_concrete_function(spec).graph
    assert not {"If", "StatelessIf"} & {op.type for op in graph.get_operations()}
    # With alpha added to JPEGs, or 16-bit scaling, the JPEG branch stays.
    for kw in ({"channels": 4}, {"channels": channels, "dtype": tf.uint16}):
        graph = tf.function(lambda e: decode.decode_image(e, **kw)).get_concrete_function(spec).graph
        assert {"If", "StatelessIf"} & {op.type for op in graph.get_operations()}
