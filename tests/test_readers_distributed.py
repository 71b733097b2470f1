"""Tests of readers.distributed: per-pipeline sharding and tf.distribute strategies."""

import collections
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from readers import distributed_dataset, make_dataset_fn
from schemas import FILENAME

import _reader_data as rd

NAMES = (FILENAME.key,)
REPO = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "_reader_strategy_child.py"


@pytest.fixture(scope="module")
def five_shards(tmp_path_factory):
    return rd.write_dataset(tmp_path_factory.mktemp("dist5"), splits={"train": 13}, num_shards=5)


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory):
    return rd.write_dataset(tmp_path_factory.mktemp("dist1"), splits={"train": 9}, num_shards=1)


def _context(pipeline_id, num_pipelines=2):
    return tf.distribute.InputContext(
        num_input_pipelines=num_pipelines, input_pipeline_id=pipeline_id,
        num_replicas_in_sync=num_pipelines,
    )


def _names(ds):
    names = []
    for _, _, extras in ds:
        names.extend(n.decode() for n in extras[FILENAME.key].numpy())
    return names


def _pipelines(written, num_pipelines=2, **options):
    fn = make_dataset_fn(
        written.data_dir, "train", global_batch_size=2 * num_pipelines, image_size=(4, 4),
        extra_features=NAMES, **options,
    )
    return [fn(_context(i, num_pipelines)) for i in range(num_pipelines)]


def test_pipelines_read_disjoint_file_subsets(five_shards, caplog):
    with caplog.at_level(logging.WARNING, logger="readers"):
        datasets = _pipelines(five_shards)
        per_pipeline = [_names(ds) for ds in datasets]
    assert not caplog.records
    shard_of = {s.filename: s.shard for s in five_shards.sources["train"]}
    for pipeline_id, (ds, names) in enumerate(zip(datasets, per_pipeline)):
        # Pipeline i reads shard files i, i+2, ...: whole files, nobody else's.
        assert {shard_of[n] for n in names} == set(range(5)[pipeline_id::2])
        assert int(ds.cardinality()) == -(-len(names) // 2)  # per-replica batches of 2
        options = ds.options().experimental_distribute
        assert options.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF
    assert not set(per_pipeline[0]) & set(per_pipeline[1])
    together = collections.Counter(per_pipeline[0] + per_pipeline[1])
    assert together == collections.Counter(list(shard_of))


def test_fewer_files_than_pipelines_falls_back_to_record_sharding(one_shard, caplog):
    for options in ({}, {"seed": 3}):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="readers"):
            datasets = _pipelines(one_shard, 3, **options)
        assert any(
            "1 shard file(s) for 3 input pipelines" in r.getMessage()
            and "keeps one record in every 3" in r.getMessage()
            for r in caplog.records
        )
        per_pipeline = [_names(ds) for ds in datasets]
        sizes = sorted(len(n) for n in per_pipeline)
        assert sizes == [3, 3, 3]
        for a in range(3):
            for b in range(a + 1, 3):
                assert not set(per_pipeline[a]) & set(per_pipeline[b])
        union = collections.Counter(sum(per_pipeline, []))
        assert union == collections.Counter(list(one_shard.by_filename()))


def test_per_replica_batch_size(five_shards):
    fn = make_dataset_fn(five_shards.data_dir, global_batch_size=8, image_size=(4, 4))
    context = tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=4
    )
    ds = fn(context)
    images, labels = next(iter(ds))
    assert images.shape == (2, 4, 4, 3) and labels.shape == (2,)
    # One pipeline reads everything, yet auto-sharding stays off.
    policy = ds.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.OFF


def test_seeded_pipelines_are_reproducible(five_shards):
    first = [_names(ds) for ds in _pipelines(five_shards, seed=9)]
    second = [_names(ds) for ds in _pipelines(five_shards, seed=9)]
    assert first == second


def test_option_groups_read_as_their_options(five_shards):
    from readers import ImageOptions, ReadOptions, ShuffleOptions

    by_name = [_names(ds) for ds in _pipelines(five_shards, seed=9)]
    fn = make_dataset_fn(
        five_shards.data_dir, "train", global_batch_size=4, image=ImageOptions(image_size=(4, 4)),
        reading=ReadOptions(batch_size=1, extra_features=NAMES), shuffling=ShuffleOptions(seed=9))
    grouped = [_names(fn(_context(i))) for i in range(2)]
    assert grouped == by_name and sum(map(len, grouped)) > 0


def test_argument_errors(five_shards):
    strategy = tf.distribute.get_strategy()  # the default, one replica
    with pytest.raises(TypeError, match=r"Unknown reader options \['batch_size'\].*global_batch_size"):
        distributed_dataset(strategy, five_shards.data_dir, global_batch_size=4, batch_size=4)
    with pytest.raises(ValueError, match=r"`global_batch_size` must be a positive integer. Received: global_batch_size=0"):
        make_dataset_fn(five_shards.data_dir, global_batch_size=0)
    with pytest.raises(ValueError, match=r"`resize` must be one of"):
        make_dataset_fn(five_shards.data_dir, global_batch_size=4, resize="squash")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_dataset_fn(five_shards.data_dir / "missing", global_batch_size=4)
    fn = make_dataset_fn(five_shards.data_dir, global_batch_size=3)
    with pytest.raises(ValueError, match="divisible"):
        fn(_context(0))


def test_default_strategy_dataset(five_shards):
    ds = distributed_dataset(
        tf.distribute.get_strategy(), five_shards.data_dir, global_batch_size=4,
        image_size=(4, 4), extra_features=NAMES,
    )
    assert ds.class_names == list(five_shards.class_names)
    assert sorted(_names(ds)) == sorted(five_shards.by_filename())


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    """Runs the MirroredStrategy child process on a 10-record, 3-shard dataset."""
    written = rd.write_dataset(tmp_path_factory.mktemp("mirrored"), splits={"train": 10}, num_shards=3)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"  # see the child's docstring
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(written.data_dir)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return written, json.loads(proc.stdout.strip().splitlines()[-1])


def test_mirrored_strategy_reads_every_record_once_across_replicas(mirrored):
    written, result = mirrored
    assert result["replicas"] == 2
    per_replica = result["filenames_per_replica"]
    assert all(per_replica)  # both replicas got data
    assert collections.Counter(per_replica[0] + per_replica[1]) == collections.Counter(
        list(written.by_filename())
    )
    assert result["devices"]["0"].endswith("CPU:0") and result["devices"]["1"].endswith("CPU:1")
    assert result["image_shapes"] == [[8, 8, 3]]
    assert result["class_names"] == list(written.class_names)
    # The custom loop saw every label once.
    assert result["label_sum_by_step"] == sum(s.label for s in written.sources["train"])


def test_model_fit_under_mirrored_strategy(mirrored):
    _, result = mirrored
    assert result["fit_steps"] == 3  # 10 records, global batch 4
    (loss,) = result["fit_loss"]
    assert loss == loss and 0 < loss < 10  # finite
