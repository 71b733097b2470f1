"""Child process of test_readers_global: resumes a shuffle='global' read.

A fresh interpreter, as after a crash: it restores the read position from a
`tf.train.Checkpoint` of a `readers.PositionTracker` (and checks it against the
JSON of `ReadPosition.to_dict` written beside it), reads the rest of the epoch
with the same seed and options, and prints one JSON line: the (file name,
pixel hash) of every record it read, in order, and the position it restored.

Usage: python _reader_resume_child.py DATA_DIR CHECKPOINT_PREFIX POSITION_JSON
"""

import hashlib
import json
import sys

import numpy as np
import tensorflow as tf

import readers
from schemas import FILENAME

# The options of the interrupted run, shared with the test.
OPTIONS = dict(
    batch_size=20, image_size=(16, 16), shuffle="global", seed=7, augment="standard",
    extra_features=(FILENAME.key,),
)


def records(batches) -> list[list[str]]:
    """[file name, sha256 of the image's float32 pixels] of each record, in order."""
    out = []
    for images, _, extras in batches:
        for image, name in zip(images.numpy(), extras[FILENAME.key].numpy()):
            digest = hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()
            out.append([name.decode(), digest])
    return out


def main(data_dir: str, prefix: str, position_json: str) -> dict:
    probe = readers.image_dataset_from_tfrecords(data_dir, **OPTIONS)
    tracker = readers.PositionTracker(probe.records_per_epoch, repeat=False)
    tf.train.Checkpoint(position=tracker).restore(prefix).assert_consumed()
    with open(position_json, encoding="utf-8") as f:
        saved = readers.ReadPosition.from_dict(json.load(f))
    position = tracker.position()
    ds = readers.image_dataset_from_tfrecords(data_dir, **OPTIONS, start=position)
    return {
        "position": position.to_dict(),
        "json_position": saved.to_dict(),
        "records": records(ds),
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
    from _reader_data import exit_child

    exit_child()
