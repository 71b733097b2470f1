"""Tests of shuffle='global': index files, the permutation, exact and elastic
resume, augmentation seeds and damaged records.

One dataset is converted for the module (200 small images, 2 classes of 100,
8 shards of 25) by the real converter, so the index files are the ones it
writes.
"""

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import readers
import schemas
from readers import global_shuffle, record_index
from readers.positions import PositionTracker, ReadPosition
from schemas import FILENAME, LABEL

import _reader_data as rd
import _reader_resume_child as child
from helpers import convert, make_class_tree, read_records

REPO = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "_reader_resume_child.py"
NAMES = (FILENAME.key,)
SMALL = dict(image_size=(8, 8), extra_features=NAMES)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("global")
    make_class_tree(root / "images", classes=("cat", "dog"), per_class=100)
    manifest = convert(root / "images", root / "dataset")
    (split,) = manifest.splits.values()
    assert split.num_records == 200 and len(split.shards) > 1
    return root / "dataset", manifest


def _names(ds) -> list[str]:
    out = []
    for element in ds:
        extras = element[-1]
        out.extend(n.decode() for n in np.atleast_1d(extras[FILENAME.key].numpy()))
    return out


def _index(data_dir, shard) -> list[tuple[int, int]]:
    text = (Path(data_dir) / shard.index_file).read_text()
    return [tuple(map(int, line.split())) for line in text.splitlines()]


# --- Index files -------------------------------------------------------------


# Runs without TensorFlow: the `tfrecord` package registers its own copy of
# tensorflow/example.proto, which clashes with TensorFlow's in one process
# ("duplicate symbol 'tensorflow.BytesList'", vahidk/tfrecord PR #103).
_TFRECORD_CHILD = """
import hashlib, json, sys
from tfrecord.reader import tfrecord_iterator, tfrecord_loader
path, index, n, filename_key, label_key = sys.argv[1:6]
n = int(n)
# Record i alone, found through the index: shard=(i, n) reads entries [i, i+1).
alone = [hashlib.sha256(bytes(b)).hexdigest()
         for i in range(n) for b in tfrecord_iterator(path, index, shard=(i, n))]
every = list(tfrecord_loader(path, index, None, shard=(0, 1)))
typed = list(tfrecord_loader(path, index, {filename_key: "byte", label_key: "int"},
                             shard=(0, 1)))
print(json.dumps({
    "alone": alone,
    "keys": sorted(every[0]),
    "filenames": [t[filename_key].decode() for t in typed],
    "labels": [int(t[label_key][0]) for t in typed],
}))
"""


def test_index_files_read_by_the_tfrecord_package(converted):
    """Another reader of the DALI / `tfrecord` index format finds every record."""
    if importlib.util.find_spec("tfrecord") is None:  # not imported: see above
        pytest.skip("the `tfrecord` package is not installed")
    data_dir, manifest = converted
    for shard in manifest.splits["train"].shards[:3]:
        path = str(data_dir / shard.file)
        ours = [r.numpy() for r in tf.data.TFRecordDataset(path)]
        decoded = [schemas.IMAGE_SCHEMA.decode(r) for r in ours]
        proc = subprocess.run(
            [sys.executable, "-c", _TFRECORD_CHILD, path, str(data_dir / shard.index_file),
             str(len(ours)), FILENAME.key, LABEL.key],
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout)
        assert got["alone"] == [hashlib.sha256(r).hexdigest() for r in ours]
        assert got["keys"] == sorted(spec.key for spec in schemas.IMAGE_SCHEMA.features)
        assert got["filenames"] == [d[FILENAME.key].decode() for d in decoded]
        assert got["labels"] == [d[LABEL.key] for d in decoded]


def test_index_must_match_the_manifest(converted, tmp_path):
    data_dir = tmp_path / "copy"
    shutil.copytree(converted[0], data_dir)
    shard = converted[1].splits["train"].shards[1]
    index = data_dir / shard.index_file
    index.write_text(index.read_text().replace("\n", " \n", 1))
    name = shard.index_file
    with pytest.raises(schemas.ManifestError, match=rf"{name}.*sha256.*shardsmith verify"):
        readers.image_dataset_from_tfrecords(data_dir, shuffle="global", seed=1)
    index.unlink()
    with pytest.raises(FileNotFoundError, match=rf"{name}.*missing.*shardsmith verify"):
        readers.image_dataset_from_tfrecords(data_dir, shuffle="global", seed=1)
    # The other modes do not need the index, unless they skip damaged records.
    assert len(_names(readers.image_dataset_from_tfrecords(data_dir, **SMALL))) == 200
    with pytest.raises(FileNotFoundError, match=rf"{name}.*missing"):
        readers.image_dataset_from_tfrecords(data_dir, max_bad_records=1)


def test_dataset_without_index_files_is_refused(tmp_path):
    written = rd.write_dataset(tmp_path, splits={"train": 6}, num_shards=2)
    with pytest.raises(schemas.ManifestError, match=r"wrote none.*--overwrite"):
        readers.image_dataset_from_tfrecords(written.data_dir, shuffle="global", seed=1)
    with pytest.raises(ValueError, match=r"`max_bad_records` needs the index files"):
        readers.image_dataset_from_tfrecords(written.data_dir, max_bad_records=1)


# --- The permutation ---------------------------------------------------------


def test_index_shuffle_batches_equal_the_public_function():
    index = tf.range(50, dtype=tf.int64)
    epoch = tf.constant([0] * 25 + [3] * 25, tf.int64)
    got = global_shuffle._index_shuffle(index, 1234, epoch, 49).numpy()
    want = [
        tf.random.experimental.index_shuffle(i, tf.constant([1234, e], tf.int64), 49).numpy()
        for i, e in zip(index.numpy(), epoch.numpy())
    ]
    assert list(got) == want


def test_every_epoch_is_a_fresh_permutation_of_every_record(converted):
    data_dir, _ = converted
    ds = readers.image_dataset_from_tfrecords(
        data_dir, batch_size=20, shuffle="global", seed=11, repeat=True, **SMALL
    )
    assert ds.records_per_epoch == 200 and ds.seed == 11
    batches = [_names([element]) for element in ds.take(20)]
    epochs = [sum(batches[:10], []), sum(batches[10:], [])]
    manifest_order = [r[FILENAME.key].decode() for r in read_records(data_dir)]
    for epoch in epochs:
        assert sorted(epoch) == sorted(manifest_order)  # each record once
    # A record's position in epoch 1 is uncorrelated with its position in
    # epoch 0, and with its place in the shards (|r| < 0.25: 3.5 sigma for
    # 200 independent positions).
    second = [epochs[1].index(n) for n in epochs[0]]
    stored = [manifest_order.index(n) for n in epochs[0]]
    assert abs(np.corrcoef(range(200), second)[0, 1]) < 0.25
    assert abs(np.corrcoef(range(200), stored)[0, 1]) < 0.25
    # Every batch mixes the two classes (100 each; hypergeometric, P(< 3 of a
    # class in 20) ~ 1e-4 per batch).
    for batch in batches:
        cats = sum(n.startswith("cat/") for n in batch)
        assert 3 <= cats <= 17, batch
    # Without repeat: one epoch, the same as the first one here.
    once = readers.image_dataset_from_tfrecords(
        data_dir, batch_size=20, shuffle="global", seed=11, **SMALL
    )
    assert int(once.cardinality()) == 10
    assert _names(once) == epochs[0]


# --- Positions and resuming ---------------------------------------------------


def test_read_position_arithmetic():
    p = ReadPosition(epoch=1, consumed=150)
    assert p.advance(100, records_per_epoch=200) == ReadPosition(2, 50)
    assert p.advance(100, records_per_epoch=200, repeat=False) == ReadPosition(2, 0)
    assert p.advance(30, records_per_epoch=200, repeat=False) == ReadPosition(1, 180)
    assert ReadPosition(0, 450).normalized(200) == ReadPosition(2, 50)
    assert ReadPosition.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    with pytest.raises(ValueError, match=r"`consumed` must be a non-negative integer. Received: "):
        ReadPosition(0, -1)
    with pytest.raises(ValueError, match=r"exactly the keys"):
        ReadPosition.from_dict({"epoch": 1})

    tracker = PositionTracker(200, start=ReadPosition(1, 150))
    tf.function(lambda: tracker.advance(tf.constant(100)))()
    assert tracker.position() == ReadPosition(2, 50)
    finite = PositionTracker(200, repeat=False, start=ReadPosition(0, 190))
    finite.advance(20)
    assert finite.position() == ReadPosition(1, 0)
    finite.advance(60)
    finite.end_epoch()  # a dropped partial batch: on to the next epoch
    assert finite.position() == ReadPosition(2, 0)


def test_resume_in_a_new_process_continues_the_epoch_exactly(converted, tmp_path):
    data_dir, _ = converted
    full = child.records(readers.image_dataset_from_tfrecords(data_dir, **child.OPTIONS))
    assert len(full) == 200 and len({r[0] for r in full}) == 200

    # Half an epoch, then "crash": save the position both ways.
    ds = readers.image_dataset_from_tfrecords(data_dir, **child.OPTIONS)
    tracker = PositionTracker(ds.records_per_epoch, repeat=False)
    first = child.records(ds.take(5))
    for _ in range(5):
        tracker.advance(child.OPTIONS["batch_size"])
    prefix = tf.train.Checkpoint(position=tracker).save(str(tmp_path / "ckpt" / "position"))
    (tmp_path / "position.json").write_text(json.dumps(tracker.position().to_dict()))

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(data_dir), prefix, str(tmp_path / "position.json")],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["position"] == result["json_position"] == {"epoch": 0, "consumed": 100}
    # The same records in the same order, with the same random crops.
    assert first + result["records"] == full


def test_resume_with_another_number_of_input_pipelines(converted):
    """One pipeline before, two after (e.g. a second worker): the per-replica
    batches of each step, in replica order, continue the global order, across
    the epoch boundary, with the same augmentation."""
    data_dir, _ = converted
    options = dict(child.OPTIONS, repeat=True)
    global_batch = options.pop("batch_size")
    reference = child.records(
        readers.image_dataset_from_tfrecords(data_dir, batch_size=global_batch, **options)
        .take(15)  # 1.5 epochs
    )
    start = ReadPosition().advance(7 * global_batch, records_per_epoch=200)
    fn = readers.make_dataset_fn(
        data_dir, global_batch_size=global_batch, start=start, **options
    )
    pipelines = [
        iter(fn(tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=i, num_replicas_in_sync=2)))
        for i in range(2)
    ]
    resumed = []
    for _ in range(8):
        for pipeline in pipelines:  # replica order
            resumed.extend(child.records([next(pipeline)]))
    assert resumed == reference[7 * global_batch:]


def test_resume_callback_counts_fit_steps(converted):
    keras = pytest.importorskip("keras")
    data_dir, _ = converted
    ds = readers.image_dataset_from_tfrecords(
        data_dir, batch_size=20, image_size=(8, 8), shuffle="global", seed=3, repeat=True,
        start=ReadPosition(0, 180),
    )
    tracker = PositionTracker(ds.records_per_epoch, start=ReadPosition(0, 180))
    model = keras.Sequential(
        [keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(2)]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=2, steps_per_epoch=2, verbose=0, shuffle=False,
              callbacks=[readers.ResumeCallback(tracker, 20)])
    assert tracker.position() == ReadPosition(1, 60)


# --- Damaged records -----------------------------------------------------------


@pytest.fixture
def damaged(converted, tmp_path):
    """A copy of the dataset with one byte flipped inside one record's data."""
    data_dir, manifest = converted
    copy = tmp_path / "damaged"
    shutil.copytree(data_dir, copy)
    shard = manifest.splits["train"].shards[2]
    offset, length = _index(copy, shard)[7]
    path = copy / shard.file
    data = bytearray(path.read_bytes())
    data[offset + length // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    record = next(iter(tf.data.TFRecordDataset(str(data_dir / shard.file)).skip(7)))
    victim = schemas.IMAGE_SCHEMA.decode(record.numpy())[FILENAME.key].decode()
    everyone = [r[FILENAME.key].decode() for r in read_records(data_dir)]
    return copy, shard.file, offset, victim, everyone


@pytest.mark.parametrize("reader", ["python", "tf"])
@pytest.mark.parametrize("augment", [None, "identity"])
def test_damaged_record_is_skipped_alone_within_budget(
    damaged, reader, augment, monkeypatch, caplog
):
    if reader == "tf" and not record_index.supports_offset_reads():
        pytest.skip("this TensorFlow cannot start a TFRecord read at an offset")
    monkeypatch.setattr(record_index, "_READER", reader)
    copy, shard, offset, victim, everyone = damaged
    with caplog.at_level(logging.WARNING, logger="readers"):
        ds = readers.image_dataset_from_tfrecords(
            copy, batch_size=20, shuffle="global", seed=5, max_bad_records=1,
            # A callable augmentation takes the per-example path.
            augment=(lambda image: image) if augment else None, **SMALL,
        )
        sizes, names = [], []
        for _, _, extras in ds:
            sizes.append(len(extras[FILENAME.key]))
            names.extend(n.decode() for n in extras[FILENAME.key].numpy())
    assert sorted(names) == sorted(n for n in everyone if n != victim)
    assert sorted(sizes) == [19] + [20] * 9  # its batch is one short, no other
    (warning,) = [r.getMessage() for r in caplog.records if "Damaged record" in r.getMessage()]
    assert f"shard {shard} at byte offset {offset}" in warning and "bad data CRC" in warning
    assert repr(victim) in warning


def test_damaged_record_fails_the_read_without_budget(damaged):
    copy, shard, offset, _, _ = damaged
    ds = readers.image_dataset_from_tfrecords(copy, shuffle="global", seed=5, **SMALL)
    match = rf"Damaged record in shard {shard} at byte offset {offset}.*max_bad_records=0"
    with pytest.raises(tf.errors.InvalidArgumentError, match=match + ".*shardsmith verify"):
        _names(ds)


@pytest.mark.parametrize("shuffle", [True, False])
def test_shards_mode_skips_a_damaged_record_alone(damaged, shuffle, caplog):
    # With a budget, shuffle='shards' and False read each shard in order, record
    # by record at the index's offsets: the rest of the damaged shard is still read.
    copy, shard, offset, victim, everyone = damaged
    with caplog.at_level(logging.WARNING, logger="readers"):
        ds = readers.image_dataset_from_tfrecords(
            copy, batch_size=20, shuffle=shuffle, seed=5, max_bad_records=1, **SMALL
        )
        sizes, names = [], []
        for _ in range(2):  # the budget is per epoch
            for _, _, extras in ds:
                sizes.append(len(extras[FILENAME.key]))
                names.extend(n.decode() for n in extras[FILENAME.key].numpy())
    assert sorted(names) == sorted(2 * [n for n in everyone if n != victim])
    assert sorted(sizes) == 2 * [19] + [20] * 18  # its batch is one short, no other
    warnings = [r.getMessage() for r in caplog.records if "Damaged record" in r.getMessage()]
    assert len(warnings) == 2
    assert f"shard {shard} at byte offset {offset}" in warnings[0]
    assert "bad data CRC" in warnings[0] and repr(victim) in warnings[0]
    assert "(1 of max_bad_records=1" in warnings[0]

    # With no budget the damaged record fails the read (on_corrupt='raise'), naming
    # the shard, the byte offset and what was found.
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"Damaged record in shard .*{shard} at byte offset {offset} "):
        _names(readers.image_dataset_from_tfrecords(copy, shuffle=shuffle, **SMALL))


# --- Arguments -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"shuffle": "global", "cache": True}, ValueError, r"`cache` does not apply to shuffle='global'"),
        ({"shuffle": "global", "shuffle_buffer": 8}, ValueError, r"`shuffle_buffer` does not apply"),
        ({"shuffle": "global", "start": ReadPosition()}, ValueError, r"`start` resumes.*needs that run's `seed`. Received: start=ReadPosition\(epoch=0, consumed=0\), seed=None"),
        ({"start": ReadPosition(), "seed": 1}, ValueError, r"`start` applies to shuffle='global' only. Received: start=ReadPosition\(epoch=0, consumed=0\), shuffle=True"),
        ({"shuffle": "global", "max_bad_records": -1}, ValueError, r"`max_bad_records` must be a non-negative integer. Received: max_bad_records=-1"),
        ({"shuffle": "global", "start": {"epoch": 0}, "seed": 1}, TypeError, r"`start` must be a readers.ReadPosition"),
    ],
)
def test_bad_arguments(converted, kwargs, error, match):
    with pytest.raises(error, match=match):
        readers.image_dataset_from_tfrecords(converted[0], **kwargs)


def test_distributed_global_read_needs_a_seed(converted):
    with pytest.raises(ValueError, match=r"needs a `seed`.*same permutation. Received: seed=None"):
        readers.make_dataset_fn(converted[0], global_batch_size=4, shuffle="global")
