"""Encoding one record: shardsmith's wire encoder against protobuf's serialisation.

    python -m bench.encode [--repeats 7]

Times `ImageExampleSchema.encode` (the hand-written wire encoder the converter
uses) and building the same `tf.train.Example` with protobuf, then
`SerializeToString(deterministic=True)`: with the message classes of the
converter's own descriptor (`schemas.features._example_class`, no TensorFlow)
and with TensorFlow's `example_pb2`. Images of 5 KB and 150 KB, the core
features plus two DICOM tags whose keys prefix one another (where protobuf's
upb backend orders map entries differently, see schemas/features.py). Reports
CPU microseconds per record (best of the repeats) and whether the bytes are equal.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import timeit

import schemas
from schemas import features

_LOG = logging.getLogger("shardsmith.bench.encode")
_TAGS = ("Manufacturer", "ManufacturerModelName")


def _record(size: int, tags: tuple[str, ...]) -> schemas.ImageRecord:
    return schemas.ImageRecord(
        image=os.urandom(size), label=3, filename="class_a/image_000123.jpg", format="jpeg",
        height=375, width=500, channels=3,
        extra={schemas.dicom_tag_key(t): f"value of {t}" for t in tags},
    )


def _protobuf_encoder(example_class, schema: schemas.ImageExampleSchema):
    """record -> bytes through protobuf messages, as a converter using protobuf would."""
    def encode(record: schemas.ImageRecord) -> bytes:
        values = {spec.key: getattr(record, spec.key) for spec in schema._CORE}
        values.update(record.extra)
        example = example_class()
        feature = example.features.feature
        for spec in schema.features:
            value = values[spec.key]
            if spec.dtype == "bytes":
                feature[spec.key].bytes_list.value.append(
                    os.fsencode(value) if isinstance(value, str) else value)
            else:
                feature[spec.key].int64_list.value.append(value)
        return example.SerializeToString(deterministic=True)

    return encode


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from schemas import tf_runtime

    encoders = {"hand": None, "protobuf (own descriptor)": features._example_class(),
                "protobuf (tf example_pb2)": tf_runtime.example_pb2().Example}
    results = {}
    for tags in ((), _TAGS):
        schema = schemas.ImageExampleSchema(tuple(schemas.dicom_tag_key(t) for t in tags))
        for size in (5_000, 150_000):
            record = _record(size, tags)
            want = schema.encode(record)
            for name, example_class in encoders.items():
                encode = schema.encode if example_class is None else _protobuf_encoder(
                    example_class, schema)
                number = 20_000 if size < 100_000 else 5_000
                best = min(timeit.repeat(lambda: encode(record), number=number,
                                         repeat=args.repeats, timer=time.process_time)) / number
                same = encode(record) == want
                key = f"{size // 1000} KB, tags={list(tags)}, {name}"
                results[key] = {"us": best * 1e6, "identical": same}
                _LOG.info("%-70s %7.2f us  identical=%s", key, best * 1e6, same)
    return results


if __name__ == "__main__":
    main()
