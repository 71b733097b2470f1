"""The record format and the manifest (schemas/)."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

import schemas
from schemas import IMAGE_SCHEMA, ImageExampleSchema, ImageRecord


def _record(**kw):
    values = dict(image=b"\xff\xd8bytes", label=2, filename="cat/ä b.jpg", format="jpeg",
                  height=3, width=4, channels=3)
    values.update(kw)
    return ImageRecord(**values)


def test_encode_then_parse_gives_the_values_back():
    serialized = IMAGE_SCHEMA.encode(_record())
    parsed = tf.io.parse_single_example(serialized, IMAGE_SCHEMA.parse_spec())
    assert parsed[schemas.IMAGE.key].numpy() == b"\xff\xd8bytes"
    assert parsed[schemas.LABEL.key].numpy() == 2
    assert parsed[schemas.FILENAME.key].numpy().decode() == "cat/ä b.jpg"
    assert parsed[schemas.HEIGHT.key].dtype == tf.int64
    assert set(parsed) == {spec.key for spec in IMAGE_SCHEMA.features}


def test_encoding_is_deterministic_and_keeps_undecodable_names():
    name = b"bad\xff.jpg".decode("utf-8", "surrogateescape")
    a = IMAGE_SCHEMA.encode(_record(filename=name))
    assert a == IMAGE_SCHEMA.encode(_record(filename=name))
    parsed = tf.io.parse_single_example(a, IMAGE_SCHEMA.parse_spec([schemas.FILENAME.key]))
    assert parsed[schemas.FILENAME.key].numpy() == b"bad\xff.jpg"


def test_wrong_types_name_the_feature():
    with pytest.raises(TypeError, match="'label' takes an int"):
        IMAGE_SCHEMA.encode(_record(label="2"))
    with pytest.raises(ValueError, match="Unknown feature keys"):
        IMAGE_SCHEMA.parse_spec(["nope"])


def test_extra_string_features_round_trip_through_the_manifest():
    schema = ImageExampleSchema(extra_string_features=("Modality", "BodyPart"))
    rebuilt = ImageExampleSchema.from_json(json.loads(json.dumps(schema.to_json())))
    assert rebuilt == schema
    serialized = schema.encode(_record(extra={"Modality": "CT", "BodyPart": "HEAD"}))
    parsed = tf.io.parse_single_example(serialized, schema.parse_spec(["Modality"]))
    assert parsed["Modality"].numpy() == b"CT"
    with pytest.raises(ValueError, match="no value for feature 'BodyPart'"):
        schema.encode(_record(extra={"Modality": "CT"}))
    with pytest.raises(ValueError, match="reuse the core keys"):
        ImageExampleSchema(extra_string_features=(schemas.LABEL.key,))


def test_stored_schema_with_other_dtype_is_explained():
    stored = IMAGE_SCHEMA.to_json()
    stored[schemas.LABEL.key] = {"dtype": "bytes", "description": ""}
    with pytest.raises(ValueError, match="'label' is stored as 'bytes', this reader expects 'int64'"):
        ImageExampleSchema.from_json(stored)


def _manifest(**kw):
    shard = schemas.ShardInfo(schemas.shard_filename("train", 0, 1), 3, 100, "ab", (1, 2))
    values = dict(schema_version=schemas.SCHEMA_VERSION, tool_version="0.1.0",
                  features=IMAGE_SCHEMA.to_json(), class_names=("a", "b"),
                  splits={"train": schemas.SplitInfo("train", (shard,))},
                  counts={"found": 3, "written": 3, "rejected": 0, "skipped": 0},
                  rejects={}, normalized={}, options={"seed": 0})
    values.update(kw)
    return schemas.Manifest(**values)


def test_manifest_round_trips_byte_for_byte():
    text = _manifest().to_json()
    again = schemas.Manifest.from_json(text)
    assert again.to_json() == text
    assert again.split("train").class_counts == (1, 2)
    assert json.loads(text)["splits"]["train"]["class_counts"] == {"a": 1, "b": 2}


def test_manifest_errors_say_what_to_do():
    with pytest.raises(schemas.ManifestError, match="schema_version=99.*Convert the images again"):
        schemas.Manifest.from_json(_manifest(schema_version=99).to_json())
    with pytest.raises(schemas.ManifestError, match="not valid JSON"):
        schemas.Manifest.from_json("{", "x/manifest.json")
    with pytest.raises(schemas.ManifestError, match=r"no split 'test'; it has \['train'\]"):
        _manifest().split("test")


def test_shard_filename():
    assert schemas.shard_filename("validation", 3, 16) == "validation-00003-of-00016.tfrecord"
    with pytest.raises(ValueError):
        schemas.shard_filename("train", 16, 16)
