"""The record format and the manifest (schemas/)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

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


def _tf_example(schema, record):
    """The same record built with TensorFlow's own protos, the reference encoding."""
    values = {
        schemas.IMAGE.key: record.image, schemas.LABEL.key: record.label,
        schemas.FILENAME.key: record.filename, schemas.FORMAT.key: record.format,
        schemas.HEIGHT.key: record.height, schemas.WIDTH.key: record.width,
        schemas.CHANNELS.key: record.channels, **record.extra,
    }
    feature = {}
    for spec in schema.features:
        value = values[spec.key]
        if spec.dtype == "bytes":
            value = os.fsencode(value) if isinstance(value, str) else value
            feature[spec.key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        else:
            feature[spec.key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString(deterministic=True)


_INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)


@settings(max_examples=200, deadline=None)
@given(
    image=st.binary(max_size=300), label=_INT64, filename=_TEXT, fmt=_TEXT,
    sizes=st.tuples(_INT64, _INT64, _INT64),
    extra=st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), _TEXT, max_size=3),
)
def test_encoding_equals_tensorflows_own_serialization(image, label, filename, fmt, sizes, extra):
    # The writer frames wire bytes itself; they must be exactly what
    # tf.train.Example would give, for any value (negative and 64-bit ints,
    # empty and non-ASCII strings, extra features sorting among the core keys).
    extra = {k: v for k, v in extra.items() if k not in {s.key for s in ImageExampleSchema._CORE}}
    schema = ImageExampleSchema(extra_string_features=tuple(extra))
    record = _record(image=image, label=label, filename=filename, format=fmt,
                     height=sizes[0], width=sizes[1], channels=sizes[2], extra=extra)
    ours = schema.encode(record)
    assert tf.train.Example.FromString(ours) == tf.train.Example.FromString(_tf_example(schema, record))
    assert schema.decode(ours)[schemas.LABEL.key] == label
    keys = [spec.key for spec in schema.features]
    if not any(a != b and b.startswith(a) for a in keys for b in keys):
        # Byte for byte too. (When a key is a prefix of another, protobuf's
        # upb backend puts the longer first; we keep plain byte order.)
        assert ours == _tf_example(schema, record)


def test_one_schema_encodes_repeated_values_as_tensorflow_does():
    # A schema keeps the encoded entries of the int and str values it has
    # seen (labels, sizes, formats repeat in every dataset): records that
    # reuse them, and more distinct values than it keeps, encode exactly as
    # tf.train.Example does; an equal value of another type is still refused.
    schema = ImageExampleSchema(extra_string_features=("dicom_Modality",))
    for i in range(2500):
        record = _record(image=bytes([i % 251]) * (i % 300), label=i % 7, filename=f"c/{i % 40}.jpg",
                         format=("jpeg", "png", "")[i % 3], height=i, width=(1 << 40) + i % 5,
                         channels=-(i % 3), extra={"dicom_Modality": ("CT", "MR")[i % 2]})
        assert schema.encode(record) == _tf_example(schema, record), i
    with pytest.raises(TypeError, match="'label' takes an int"):
        schema.encode(_record(label=True, extra={"dicom_Modality": "CT"}))
    with pytest.raises(TypeError, match="'format' takes bytes or str"):
        schema.encode(_record(format=1, extra={"dicom_Modality": "CT"}))


def test_keys_that_prefix_others_stay_in_byte_order():
    # Real --dicom_tags such as Manufacturer,ManufacturerModelName: entries in
    # plain byte order of their keys (shorter first), whatever protobuf's
    # backend would do (upb puts the longer key first, see schemas/features.py).
    tags = ("ManufacturerModelName", "Manufacturer", "StudyIDIssuer", "StudyID")
    keys = [schemas.dicom_tag_key(t) for t in tags]
    schema = ImageExampleSchema(extra_string_features=tuple(keys))
    record = _record(extra={k: f"v{i}" for i, k in enumerate(keys)})
    ours = schema.encode(record)
    every = [spec.key.encode() for spec in schema.features]
    positions = {key: ours.index(b"\n" + bytes([len(key)]) + key) for key in every}
    assert sorted(every, key=positions.get) == sorted(every)
    assert tf.train.Example.FromString(ours) == tf.train.Example.FromString(_tf_example(schema, record))


def test_each_core_feature_is_a_field_of_an_image_record():
    # encode reads the core values by key: a new core feature is a spec in
    # ImageExampleSchema._CORE and a field of ImageRecord of the same name.
    fields = [f.name for f in dataclasses.fields(ImageRecord)]
    assert fields == [spec.key for spec in ImageExampleSchema._CORE] + ["extra"]


def test_ints_beyond_64_bits_are_refused_with_the_feature_named():
    with pytest.raises(ValueError, match="'height'.*64-bit"):
        IMAGE_SCHEMA.encode(_record(height=1 << 63))


def _fresh_python(code: str) -> list[str]:
    """The lines `code` prints in a new interpreter (what TF loads depends on the process)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__))).stdout
    return out.split("\n")


def test_writing_records_does_not_load_tensorflows_python_api():
    # The converter encodes records and decodes images without TensorFlow's
    # Python API (a third of the start-up); code that asks for TensorFlow
    # afterwards in the same process still gets all of it.
    code = (
        "import sys\n"
        "from schemas import IMAGE_SCHEMA, ImageRecord, tf_runtime\n"
        "ops = tf_runtime.image_ops()\n"
        "record = IMAGE_SCHEMA.encode(ImageRecord(image=b'x', label=1, filename='a', format='png',"
        " height=1, width=1, channels=1))\n"
        "import io\n"
        "from PIL import Image\n"
        "buf = io.BytesIO()\n"
        "Image.new('L', (1, 1)).save(buf, 'PNG')\n"
        "png = buf.getvalue()\n"
        "assert ops.decode_png(png).shape == (1, 1, 1)\n"
        "print('before', tf_runtime.api_loaded())\n"
        "import tensorflow as tf\n"
        "parsed = tf.io.parse_single_example(record, IMAGE_SCHEMA.parse_spec())\n"
        "print('after', tf_runtime.api_loaded(), int(parsed['label']), tf.data.Dataset.__name__)\n"
    )
    assert _fresh_python(code)[:2] == ["before False", "after True 1 DatasetV2"]


def test_decode_ops_fall_back_to_the_whole_library():
    # A TensorFlow release that moved the internal modules the light path
    # needs must still convert: the same ops come from the whole library.
    code = (
        "import io\n"
        "from PIL import Image\n"
        "from schemas import tf_runtime\n"
        "def moved():\n"
        "    raise ImportError('cannot import name gen_image_ops')\n"
        "tf_runtime._ops_without_api = moved\n"
        "ops = tf_runtime.image_ops()\n"
        "buf = io.BytesIO()\n"
        "Image.new('RGB', (3, 2)).save(buf, 'JPEG')\n"
        "print(tuple(ops.decode_jpeg(buf.getvalue()).shape), tf_runtime.api_loaded())\n"
        "try:\n"
        "    ops.decode_jpeg(buf.getvalue()[:20])\n"
        "except ops.OpError:\n"
        "    print('OpError')\n"
    )
    assert _fresh_python(code)[:2] == ["(2, 3, 3) True", "OpError"]


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


def test_image_stats_merge_over_shards_and_round_trip():
    a = schemas.ImageStats.of([("jpeg", 64, 64), ("jpeg", 64, 64)])
    b = schemas.ImageStats.of([("png", 32, 80), ("jpeg", 64, 64)])
    assert a.one_size == (64, 64) and a.formats == (("jpeg", 2),)
    assert b.one_size is None and b.min_size == (32, 64) and b.max_size == (64, 80)
    assert schemas.ImageStats.of([]) is None
    shards = tuple(schemas.ShardInfo(schemas.shard_filename("train", i, 3), n, 10, "ab", (n,),
                                     images=stats)
                   for i, (n, stats) in enumerate([(2, a), (0, None), (2, b)]))
    split = schemas.SplitInfo("train", shards)
    assert split.images == schemas.ImageStats((("jpeg", 3), ("png", 1)), (32, 64), (64, 80))
    manifest = _manifest(class_names=("a",), splits={"train": split})
    again = schemas.Manifest.from_json(manifest.to_json())
    assert again.split("train").images == split.images
    assert again.to_json() == manifest.to_json()
    # A shard with records but no stats (an older converter): the split's are unknown.
    older = dataclasses.replace(shards[2], images=None)
    assert schemas.SplitInfo("train", (shards[0], older)).images is None


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


def test_image_stats_layouts_merge_round_trip_and_older_manifests_read_as_unknown():
    a = schemas.ImageStats.of([("png", 8, 8, 3, "uint16"), ("jpeg", 8, 8, 3, "uint8"),
                               ("png", 8, 8, 3, "uint16")])
    b = schemas.ImageStats.of([("png", 4, 4, 1, "uint8"), ("raw-float32", 4, 4, 13, "float32")])
    assert a.layouts == (("jpeg", 3, "uint8", 1), ("png", 3, "uint16", 2))
    merged = a.merge(b)
    assert merged.layouts == (("jpeg", 3, "uint8", 1), ("png", 1, "uint8", 1), ("png", 3, "uint16", 2),
                              ("raw-float32", 13, "float32", 1))
    assert merged.to_json()["layouts"] == {"jpeg:3:uint8": 1, "png:1:uint8": 1, "png:3:uint16": 2,
                                           "raw-float32:13:float32": 1}
    assert schemas.ImageStats.from_json(merged.to_json()) == merged
    # Older manifests: no 'layouts' key reads as unknown, and writes back without one.
    older = {k: v for k, v in a.to_json().items() if k != "layouts"}
    unknown = schemas.ImageStats.from_json(older)
    assert unknown.layouts is None and unknown.to_json() == older
    # Unknown for one shard is unknown for the split; (format, h, w) alone leaves it unknown.
    assert unknown.merge(b).layouts is None and b.merge(unknown).layouts is None
    assert schemas.ImageStats.of([("png", 4, 4)]).layouts is None
    shards = tuple(schemas.ShardInfo(schemas.shard_filename("train", i, 2), 2, 10, "ab", (2,),
                                     images=stats) for i, stats in enumerate([a, b]))
    manifest = _manifest(class_names=("a",), splits={"train": schemas.SplitInfo("train", shards)})
    again = schemas.Manifest.from_json(manifest.to_json())
    assert again.split("train").images.layouts == merged.layouts
    assert again.to_json() == manifest.to_json()
    damaged = manifest.to_json().replace('"png:3:uint16"', '"png-3-uint16"')
    with pytest.raises(schemas.ManifestError, match="incomplete or damaged"):
        schemas.Manifest.from_json(damaged)


def test_sample_dtype_reads_the_png_bit_depth():
    def png(array):
        buf = io.BytesIO()
        Image.fromarray(array).save(buf, "PNG")
        return buf.getvalue()

    assert schemas.sample_dtype("png", png(np.zeros((3, 3), np.uint16))) == "uint16"
    assert schemas.sample_dtype("png", png(np.zeros((3, 3, 3), np.uint8))) == "uint8"
    assert schemas.sample_dtype("jpeg", b"\xff\xd8") == "uint8"
    assert schemas.sample_dtype("raw-int16", b"") == "int16"
    with pytest.raises(ValueError, match="Unknown image format 'gif'"):
        schemas.sample_dtype("gif", b"GIF89a")


# --- Georeferencing (--raster_georef): a float64 feature and an int64 EPSG code ---------------

_UTM = (500000.123, 10.0, 0.0, 5000000.5, 0.0, -10.0)


def test_float64_feature_is_a_bytes_list_of_little_endian_doubles_as_protobuf_writes_it():
    import struct

    got = schemas.GEOTRANSFORM.encode(_UTM)
    want = tf.train.Feature(bytes_list=tf.train.BytesList(value=[struct.pack("<6d", *_UTM)]))
    assert got == want.SerializeToString()
    # Why not FloatList: float32 changes the value a UTM origin needs.
    assert float(tf.constant(_UTM[0], tf.float32).numpy()) != _UTM[0]


@settings(max_examples=40, deadline=None)
@given(epsg=_INT64, geotransform=st.lists(st.floats(allow_nan=False), min_size=6, max_size=6))
def test_a_georeferenced_record_equals_protobufs_bytes_and_parses_back_exactly(epsg, geotransform):
    import struct

    schema = ImageExampleSchema(extra_string_features=("dicom_Modality",), georef=True)
    record = _record(extra={"dicom_Modality": "CT", **schemas.georef_values(epsg, geotransform)})
    serialized = schema.encode(record)
    # The reference: the plain record by protobuf, plus the two features as protobuf builds them.
    proto = tf.train.Example.FromString(_tf_example(
        ImageExampleSchema(extra_string_features=("dicom_Modality",)),
        dataclasses.replace(record, extra={"dicom_Modality": "CT"})))
    proto.features.feature[schemas.EPSG.key].int64_list.value.append(epsg)
    proto.features.feature[schemas.GEOTRANSFORM.key].bytes_list.value.append(
        struct.pack("<6d", *geotransform))
    assert serialized == proto.SerializeToString(deterministic=True)
    decoded = schema.decode(serialized)
    assert decoded[schemas.EPSG.key] == epsg and decoded[schemas.GEOTRANSFORM.key] == tuple(geotransform)
    parsed = tf.io.parse_example([serialized] * 2, schema.parse_spec())
    gt = schemas.GEOTRANSFORM.finish_parsed(parsed[schemas.GEOTRANSFORM.key])
    assert gt.dtype == tf.float64 and gt.shape == (2, 6)
    assert [tuple(row) for row in gt.numpy().tolist()] == [tuple(geotransform)] * 2


def test_georef_schema_round_trips_through_the_manifest_json_and_checks_dtypes():
    schema = ImageExampleSchema(extra_string_features=("dicom_Modality",), georef=True)
    stored = json.loads(json.dumps(schema.to_json()))
    assert stored[schemas.GEOTRANSFORM.key]["length"] == 6
    assert stored[schemas.EPSG.key]["dtype"] == "int64"
    rebuilt = ImageExampleSchema.from_json(stored)
    assert rebuilt == schema and rebuilt.georef
    assert not ImageExampleSchema.from_json(IMAGE_SCHEMA.to_json()).georef
    # Older manifests (no length key anywhere) keep their exact JSON.
    assert all("length" not in f for f in IMAGE_SCHEMA.to_json().values())
    wrong = dict(stored, **{schemas.GEOTRANSFORM.key: {"dtype": "float64", "length": 3}})
    with pytest.raises(ValueError, match="geotransform"):
        ImageExampleSchema.from_json(wrong)
    half = {k: v for k, v in stored.items() if k != schemas.EPSG.key}
    with pytest.raises(ValueError, match="georef features"):
        ImageExampleSchema.from_json(half)


def test_unknown_georef_is_epsg_0_and_nans_and_float64_values_are_checked():
    import math

    unknown = schemas.georef_values()
    assert unknown[schemas.EPSG.key] == schemas.UNKNOWN_EPSG == 0
    assert len(unknown[schemas.GEOTRANSFORM.key]) == 6
    assert all(math.isnan(v) for v in unknown[schemas.GEOTRANSFORM.key])
    with pytest.raises(ValueError, match="takes 6 floats"):
        schemas.GEOTRANSFORM.encode((1.0, 2.0))
    with pytest.raises(TypeError, match="takes 6 floats"):
        schemas.GEOTRANSFORM.encode("abcdef")
    with pytest.raises(ValueError, match="`length`"):
        schemas.FeatureSpec("x", "float64", "no length")
    with pytest.raises(ValueError, match="`length`"):
        schemas.FeatureSpec("x", "int64", "a length", length=2)


def _random_band_stats(rng, bands, n_parts):
    """Per-part BandStats of random integer samples, and every sample of each band."""
    from fractions import Fraction

    parts, samples = [], [[] for _ in range(bands)]
    for _ in range(n_parts):
        n = int(rng.integers(1, 40))
        values = rng.integers(-500, 60000, (n, bands))
        counts, mins, maxs, means, m2s = [], [], [], [], []
        for b in range(bands):
            column = [int(v) for v in values[:, b]]
            samples[b] += column
            mean = Fraction(sum(column), n)
            counts.append(n)
            mins.append(float(min(column)))
            maxs.append(float(max(column)))
            means.append(float(mean))
            m2s.append(float(sum((v - mean) ** 2 for v in column)))
        parts.append(schemas.BandStats(1, tuple(counts), tuple(mins), tuple(maxs), tuple(means),
                                       tuple(m2s), (0,) * bands))
    return parts, samples


def test_band_stats_combine_agrees_with_merging_one_by_one_and_with_exact_values():
    from fractions import Fraction

    rng = np.random.default_rng(11)
    for bands, n_parts in ((1, 2), (3, 17), (13, 200)):
        parts, samples = _random_band_stats(rng, bands, n_parts)
        combined = schemas.BandStats.combine(parts)
        merged = parts[0]
        for p in parts[1:]:
            merged = merged.merge(p)
        assert combined.records == merged.records == n_parts
        assert combined.count == merged.count and combined.min == merged.min and combined.max == merged.max
        for b, values in enumerate(samples):
            exact_mean = Fraction(sum(values), len(values))
            exact_m2 = sum((v - exact_mean) ** 2 for v in values)
            assert combined.mean[b] == pytest.approx(float(exact_mean), rel=1e-13, abs=1e-9)
            assert combined.m2[b] == pytest.approx(float(exact_m2), rel=1e-12)
            assert merged.m2[b] == pytest.approx(combined.m2[b], rel=1e-11)


def test_band_stats_combine_edge_cases():
    one = schemas.BandStats(1, (4, 0), (1.0, None), (5.0, None), (2.0, 0.0), (3.0, 0.0), (0, 9))
    two = schemas.BandStats(2, (2, 0), (0.0, None), (9.0, None), (4.0, 0.0), (1.0, 0.0), (1, 3))
    both = schemas.BandStats.combine([one, two])
    assert both == one.merge(two)  # Small integers: every sum exact either way.
    assert both.min == (0.0, None) and both.nodata == (1, 12) and both.records == 3
    assert schemas.BandStats.combine([one]) is one
    three_bands = schemas.BandStats(1, (1,) * 3, (0.0,) * 3, (0.0,) * 3, (0.0,) * 3, (0.0,) * 3, (0,) * 3)
    assert schemas.BandStats.combine([one, three_bands]) is None
    with pytest.raises(ValueError, match="at least one"):
        schemas.BandStats.combine([])


def test_band_stats_accumulator_is_bounded_and_deterministic(monkeypatch):
    rng = np.random.default_rng(3)
    parts, _ = _random_band_stats(rng, 2, 50)
    monkeypatch.setattr(schemas.BandStatsAccumulator, "_CHUNK", 7)

    def accumulate(items):
        acc = schemas.BandStatsAccumulator()
        for p in items:
            acc.add(p)
            assert len(acc._parts) <= 8
        return acc.result()

    folded = accumulate(parts)
    assert folded == accumulate(parts)  # Same parts, same order: same numbers.
    whole = schemas.BandStats.combine(parts)
    assert folded.count == whole.count and folded.records == 50
    np.testing.assert_allclose(folded.m2, whole.m2, rtol=1e-13)
    assert schemas.BandStatsAccumulator().result() is None
    mixed = schemas.BandStatsAccumulator()
    mixed.add(parts[0])
    mixed.add(schemas.BandStats(1, (1,), (0.0,), (0.0,), (0.0,), (0.0,), (0,)))
    assert mixed.result() is None


@pytest.mark.parametrize("threads", [-1, True, 1.0])
def test_batch_decoder_threads_refuse_a_bad_count(threads):
    from schemas import tf_runtime

    with pytest.raises(ValueError, match=rf"`threads` must be 0 \(every core\) or more. Received: {threads!r}"):
        tf_runtime.set_batch_decoder_threads(threads)
    assert tf_runtime._BATCH_THREADS == [0]


_TARGETS = ("boxes", "labels", "mask", "target")


def _target_record(n: int) -> ImageRecord:
    rng = np.random.default_rng(n)
    corners = rng.random((4, n)).astype(np.float32)
    extra = {
        schemas.MASK.key: b"\x89PNG mask",
        **{spec.key: list(map(float, corners[i])) for i, spec in enumerate(schemas.BOX_FEATURES[:4])},
        schemas.BBOX_LABEL.key: [int(v) for v in rng.integers(0, 80, n)],
        schemas.BBOX_IS_CROWD.key: [int(v) for v in rng.integers(0, 2, n)],
        schemas.LABELS.key: sorted({int(v) for v in rng.integers(0, 14, n)}),
        schemas.TARGET.key: [float(v) for v in rng.normal(size=n).astype(np.float32)],
    }
    return ImageRecord(b"img", -1, f"r{n}.jpg", "jpeg", 4, 5, 3, extra)


@pytest.mark.parametrize("n", [0, 1, 7])
def test_target_lists_encode_as_protobuf_writes_them_and_parse_back_ragged(n):
    schema = ImageExampleSchema(targets=_TARGETS)
    record = _target_record(n)
    encoded = schema.encode(record)
    features = {}
    for spec in schema.features:
        value = getattr(record, spec.key) if spec in schema._CORE else record.extra[spec.key]
        if spec.dtype == "bytes":
            value = value.encode() if isinstance(value, str) else value
            features[spec.key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        elif spec.dtype == "int64":
            features[spec.key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        elif spec.dtype == "int64_list":
            features[spec.key] = tf.train.Feature(int64_list=tf.train.Int64List(value=value))
        else:
            features[spec.key] = tf.train.Feature(float_list=tf.train.FloatList(value=value))
    expected = tf.train.Example(features=tf.train.Features(feature=features))
    # Message equality, and each feature's bytes as protobuf writes them (the
    # map's order is the schema's own: see `ImageExampleSchema.encode`).
    parsed = tf.train.Example.FromString(encoded)
    assert parsed == expected
    for key, feature in features.items():
        assert parsed.features.feature[key].SerializeToString() == feature.SerializeToString()
    decoded = schema.decode(encoded)
    assert decoded[schemas.BBOX_LABEL.key] == tuple(record.extra[schemas.BBOX_LABEL.key])
    assert decoded[schemas.TARGET.key] == tuple(np.float32(record.extra[schemas.TARGET.key]).tolist())
    batch = tf.io.parse_example([encoded, schema.encode(_target_record(2))], schema.parse_spec())
    assert isinstance(batch[schemas.BBOX_XMIN.key], tf.RaggedTensor)
    assert batch[schemas.BBOX_XMIN.key].row_lengths().numpy().tolist() == [n, 2]
    np.testing.assert_array_equal(batch[schemas.LABELS.key][0].numpy(), record.extra[schemas.LABELS.key])


def test_target_schema_round_trips_and_checks_whole_groups():
    schema = ImageExampleSchema(extra_string_features=("dicom_Modality",), georef=True, targets=("mask", "boxes"))
    stored = json.loads(json.dumps(schema.to_json()))
    again = ImageExampleSchema.from_json(stored)
    assert again == schema and again.targets == ("boxes", "mask")
    assert again.string_features == ("dicom_Modality",)
    partial = {k: v for k, v in stored.items() if k != schemas.BBOX_YMAX.key}
    with pytest.raises(ValueError, match="'boxes' target features"):
        ImageExampleSchema.from_json(partial)
    with pytest.raises(ValueError, match="Targets are among"):
        ImageExampleSchema(targets=("keypoints",))
    with pytest.raises(ValueError, match="may not reuse"):
        ImageExampleSchema(extra_string_features=(schemas.MASK.key,))
    with pytest.raises(TypeError, match="bbox/label"):
        schema.encode(dataclasses.replace(_target_record(1), extra={
            **_target_record(1).extra, schemas.BBOX_LABEL.key: [1.5],
            schemas.GEOTRANSFORM.key: (0.0,) * 6, schemas.EPSG.key: 0, "dicom_Modality": "CT"}))


def _grown_manifest():
    """Version 1: one train shard with classes a, b; version 2 adds class c and a shard."""
    old = schemas.ShardInfo(schemas.shard_filename("train", 0, 1), 3, 100, "ab", (1, 2, 0))
    new = schemas.ShardInfo("train-v00002-00000-of-00001.tfrecord", 2, 60, "cd", (0, 1, 1))
    v1 = schemas.VersionInfo(1, {"train": (old.file,)}, {"train": 3}, {"train": (1, 2)}, 2,
                             "2026-12-01T00:00:00Z", {"seed": 0})
    v2 = schemas.VersionInfo(2, {"train": (new.file,)}, {"train": 2}, {"train": (0, 1, 1)}, 3,
                             "2026-12-08T00:00:00Z", {"seed": 0, "append": True})
    return _manifest(class_names=("a", "b", "c"),
                     splits={"train": schemas.SplitInfo("train", (old, new))},
                     versions=(v1, v2), class_order="first_appearance")


def test_manifest_without_versions_is_one_version_holding_every_shard():
    manifest = _manifest()
    assert "versions" not in json.loads(manifest.to_json())
    assert "class_order" not in json.loads(manifest.to_json())
    (only,) = manifest.all_versions
    assert only.version == 1 and manifest.latest_version == 1
    assert only.shards == {"train": (schemas.shard_filename("train", 0, 1),)}
    assert only.num_records == {"train": 3} and only.class_counts == {"train": (1, 2)}
    assert manifest.at_version(1) is manifest and manifest.at_version(None) is manifest
    assert manifest.version_of("train", schemas.shard_filename("train", 0, 1)) == 1


def test_manifest_versions_round_trip_and_pin_what_each_version_held():
    manifest = _grown_manifest()
    text = manifest.to_json()
    doc = json.loads(text)
    assert [v["version"] for v in doc["versions"]] == [1, 2]
    assert doc["versions"][0]["splits"]["train"]["class_counts"] == {"a": 1, "b": 2}
    assert doc["versions"][1]["splits"]["train"]["class_counts"] == {"a": 0, "b": 1, "c": 1}
    assert doc["class_order"] == "first_appearance"
    again = schemas.Manifest.from_json(text)
    assert again == manifest and again.to_json() == text
    assert again.latest_version == 2
    assert again.version_of("train", "train-v00002-00000-of-00001.tfrecord") == 2
    first = again.at_version(1)
    assert first.class_names == ("a", "b") and first.class_order == "sorted"
    assert [s.file for s in first.split("train").shards] == [schemas.shard_filename("train", 0, 1)]
    assert first.split("train").num_records == 3
    assert first.split("train").class_counts == (1, 2)
    assert first.options == {"seed": 0}
    assert again.at_version(2).split("train").num_records == 5
    for bad in (0, 3, "2", True, 1.0):
        with pytest.raises(schemas.ManifestError, match=r"`version` must be .* 1\.\.2"):
            again.at_version(bad)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["versions"].reverse(), "numbered 1, 2"),
    (lambda d: d["versions"][1]["splits"]["train"].update(num_records=7),
     "gained 7 records, but its shards hold 2"),
    (lambda d: d["versions"][1]["splits"]["train"]["class_counts"].update(c=5),
     r"class counts \[0, 1, 5\]"),
    (lambda d: d["versions"][1]["splits"]["train"]["shards"].append("nope.tfrecord"),
     "'nope.tfrecord' of split 'train', which the manifest's splits do not hold"),
    (lambda d: d["versions"][1]["splits"]["train"].update(
        shards=[schemas.shard_filename("train", 0, 1)], num_records=3,
        class_counts={"a": 1, "b": 2, "c": 0}), "is in versions 1 and 2"),
    (lambda d: d["versions"].pop(), "belong to no version"),
    (lambda d: d["versions"][0].update(num_classes=4), "num_classes=4; allowed: 0..3"),
    (lambda d: d.update(class_order="alphabetical"), "class_order must be one of"),
    (lambda d: d.update(versions={"1": {}}), "versions must be a list"),
])
def test_manifest_versions_that_disagree_with_the_shards_are_explained(edit, message):
    doc = json.loads(_grown_manifest().to_json())
    edit(doc)
    with pytest.raises(schemas.ManifestError, match=message) as info:
        schemas.Manifest.from_json(json.dumps(doc), source="/data/manifest.json")
    assert "/data/manifest.json" in str(info.value)


def test_shard_of_a_class_its_version_did_not_have_is_refused():
    doc = json.loads(_grown_manifest().to_json())
    doc["splits"]["train"]["shards"][0]["class_counts"] = [1, 1, 1]
    with pytest.raises(schemas.ManifestError, match="holds class 'c', which that version did not have"):
        schemas.Manifest.from_json(json.dumps(doc))


@pytest.mark.parametrize(("path", "url"), [
    ("gs://bucket/data/train-00000-of-00004.tfrecord", True), ("s3://b/d", True), ("hdfs://nn:8020/d", True),
    ("/data/train", False), ("relative/dir", False), ("C:\\data", False), ("", False),
])
def test_is_url_tells_an_object_store_from_a_local_path(path, url, tmp_path):
    assert schemas.is_url(path) is url
    # A path object of a local folder (the reader takes them) is local.
    assert schemas.is_url(tmp_path) is False
