"""The stack record of a satellite time series (schemas/time_series.py), read by TensorFlow's own parser."""

import datetime
import math

import numpy as np
import pytest

import schemas
from schemas import StackRecord, TimeSeriesExampleSchema


def _record(mask=None, dtype="uint16", shape=(3, 4, 5, 2), seed=0):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 60000, size=shape).astype(dtype)
    dates = tuple(schemas.time_series.days_since_epoch(datetime.date(2020, 5, d)) for d in (4, 14, 24)[:shape[0]])
    return values, StackRecord(
        stack=values.astype(values.dtype.newbyteorder("<")).tobytes(), dtype=dtype, shape=shape,
        dates=dates, bands=("B04", "B08")[:shape[3]], label=1, filename="fields/a b/ä",
        epsg=32631, geotransform=(600000.123, 10.0, 0.0, 5000000.5, 0.0, -10.0), mask=mask)


@pytest.mark.parametrize("mask", [None, b"\x89PNG fake"])
def test_tensorflow_parses_what_the_schema_writes(mask):
    import tensorflow as tf

    schema = TimeSeriesExampleSchema(mask=mask is not None)
    values, record = _record(mask)
    serialized = schema.encode(record)
    # TensorFlow's own message class reads the same bytes, feature by feature.
    example = tf.train.Example.FromString(serialized)
    assert set(example.features.feature) == {spec.key for spec in schema.features}
    parsed = tf.io.parse_single_example(serialized, schema.parse_spec())
    stack = tf.reshape(tf.io.decode_raw(parsed[schemas.STACK.key], tf.uint16, little_endian=True),
                       parsed[schemas.STACK_SHAPE.key])
    np.testing.assert_array_equal(stack.numpy(), values)
    assert parsed[schemas.STACK_DTYPE.key].numpy() == b"uint16"
    assert parsed[schemas.STACK_DATES.key].numpy().tolist() == [18386, 18396, 18406]
    assert [b.decode() for b in parsed[schemas.STACK_BANDS.key].numpy()] == ["B04", "B08"]
    assert parsed[schemas.FILENAME.key].numpy().decode() == "fields/a b/ä"
    gt = schemas.GEOTRANSFORM.finish_parsed(parsed[schemas.GEOTRANSFORM.key]).numpy().tolist()
    assert gt == [600000.123, 10.0, 0.0, 5000000.5, 0.0, -10.0]  # float64, exactly
    assert parsed[schemas.EPSG.key].numpy() == 32631
    if mask is not None:
        assert parsed[schemas.MASK.key].numpy() == mask
    # The Python decoder agrees.
    decoded = schema.decode(serialized)
    np.testing.assert_array_equal(TimeSeriesExampleSchema.array(decoded), values)
    assert decoded[schemas.STACK_SHAPE.key] == (3, 4, 5, 2)
    assert decoded[schemas.STACK_BANDS.key] == (b"B04", b"B08")
    # Same record, same bytes.
    assert schema.encode(record) == serialized


def test_batches_of_stacks_parse_with_ragged_dates():
    import tensorflow as tf

    schema = TimeSeriesExampleSchema()
    _, one = _record(shape=(3, 2, 2, 1))
    _, two = _record(shape=(2, 2, 2, 1), seed=1)
    parsed = tf.io.parse_example([schema.encode(one), schema.encode(two)], schema.parse_spec())
    assert parsed[schemas.STACK_SHAPE.key].numpy().tolist() == [[3, 2, 2, 1], [2, 2, 2, 1]]
    assert parsed[schemas.STACK_DATES.key].to_list() == [[18386, 18396, 18406], [18386, 18396]]


def test_unknown_georef_is_explicit():
    schema = TimeSeriesExampleSchema()
    _, record = _record()
    import dataclasses

    decoded = schema.decode(schema.encode(dataclasses.replace(record, epsg=0, geotransform=None)))
    assert decoded[schemas.EPSG.key] == 0
    assert all(math.isnan(v) for v in decoded[schemas.GEOTRANSFORM.key])


@pytest.mark.parametrize("change, match", [
    ({"stack": b"\0" * 3}, "do not fill"),
    ({"dates": (3, 2, 1)}, "strictly ascending"),
    ({"dates": (1, 2)}, "3 strictly ascending"),
    ({"bands": ("B04",)}, "name 2 bands"),
    ({"dtype": "int8"}, "stacks hold one of"),
    ({"mask": b"png"}, "takes no mask"),
    ({"shape": (3, 4, 5)}, "stack/shape"),
])
def test_bad_records_are_refused_naming_what_is_wrong(change, match):
    import dataclasses

    _, record = _record()
    with pytest.raises(ValueError, match=match):
        TimeSeriesExampleSchema().encode(dataclasses.replace(record, **change))


def test_the_manifest_round_trip_and_its_mismatches():
    schema = TimeSeriesExampleSchema(mask=True)
    stored = schema.to_json()
    assert TimeSeriesExampleSchema.from_json(stored) == schema
    assert schemas.example_kind(stored) == schemas.TIME_SERIES
    assert schemas.example_kind(schemas.IMAGE_SCHEMA.to_json()) == "image"
    broken = {**stored, schemas.STACK_SHAPE.key: {"dtype": "int64_list", "description": ""}}
    with pytest.raises(ValueError, match="stack/shape"):
        TimeSeriesExampleSchema.from_json(broken)
    with pytest.raises(ValueError, match="lacks"):
        TimeSeriesExampleSchema.from_json({k: v for k, v in stored.items() if k != schemas.STACK_DATES.key})
    # An image schema is not a stack schema, and says so.
    with pytest.raises(ValueError):
        TimeSeriesExampleSchema.from_json(schemas.IMAGE_SCHEMA.to_json())
