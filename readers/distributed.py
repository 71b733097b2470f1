"""Reading a converted dataset under a `tf.distribute.Strategy`.

`distributed_dataset` builds one input pipeline per worker with
`strategy.distribute_datasets_from_function`. Each pipeline reads its own
subset of the shard files (`input_pipeline_id::num_input_pipelines`) and
batches at the per-replica batch size, so no two workers read the same record
and nothing is read only to be thrown away. tf.data auto-sharding is switched
off, as the pipelines are sharded here.

If there are fewer shard files than input pipelines, file sharding would
leave pipelines without data: then every pipeline reads all files in the same
fixed order and keeps every n-th record (a warning says so; convert with more
shards to avoid the wasted reading).

With `service="grpc://HOST:PORT"` the tf.data service's workers run the
pipeline (`readers.service`): each input pipeline reads per-replica batches
from them, several input pipelines (workers of a multi-worker strategy) one
job by `service_job_name`, which they then must pass.

With several workers, pipelines may get different numbers of records; for
multi-worker training pass `repeat=True` and run a fixed number of steps so
all workers run the same number. (Keras 3's `model.fit` itself fails under
MultiWorkerMirroredStrategy whatever the input, keras-team/keras#20585: train
with `strategy.run` in a custom loop there.)

When the last global batch of an epoch is partial, some replicas get an empty
batch. Keras's Dense layer fails on those on CPU with oneDNN enabled (the TF
default): train with `drop_remainder=True` there (or TF_ENABLE_ONEDNN_OPTS=0).
The distributed dataset has no cardinality, so `fit` shows no epoch total.

With `shuffle="global"` (which needs a `seed`, the same on every worker) the
pipelines do not split the files: pipeline p of P reads its contiguous slice
of G/P positions of every global batch of G (`global_batch_size`, which must
divide by P and by the number of replicas), and its replicas (consecutive
replica ids) get consecutive per-replica batches of that slice. The
per-replica batches of a step, concatenated in replica order, are then
global batch b of the global order whatever P and the replica count, so a
run can be resumed (`start`) with another number of workers or replicas. A
partial last global batch (without `repeat`) is cut the same way, so some
replicas may get fewer records or none.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from readers import corrupt
from readers.dataset import OPTION_NAMES, ReaderConfig, ReadOptions, build_dataset, label_names
from readers.options import GROUP_NAMES
from readers.metadata import SplitFiles, load_split

__all__ = ["make_dataset_fn", "distributed_dataset"]

logger = logging.getLogger(__name__)

_OPTION_NAMES = tuple(name for name in OPTION_NAMES if name != "batch_size")


def _config(global_batch_size, options: dict[str, Any]) -> ReaderConfig:
    unknown = sorted(set(options) - set(_OPTION_NAMES) - set(GROUP_NAMES))
    if unknown:
        hint = " (pass `global_batch_size` instead)" if "batch_size" in unknown else ""
        raise TypeError(
            f"Unknown reader options {unknown}{hint}; the options are {list(_OPTION_NAMES)}."
        )
    if not isinstance(global_batch_size, int) or isinstance(global_batch_size, bool) or (
        global_batch_size < 1
    ):
        raise ValueError(
            "`global_batch_size` must be a positive integer. "
            f"Received: global_batch_size={global_batch_size!r}"
        )
    options = dict(options)
    reading = options.pop("reading", None)
    if reading is None:
        config = ReaderConfig(batch_size=global_batch_size, **options)
    elif isinstance(reading, ReadOptions):
        # Its batch is the global one, whatever the group says.
        config = ReaderConfig(reading=dataclasses.replace(reading, batch_size=global_batch_size), **options)
    else:
        raise TypeError(f"`reading` must be a ReadOptions. Received: reading={reading!r}")
    if config.shuffle_mode == "global" and config.seed is None:
        raise ValueError(
            "shuffle='global' in a distributed read needs a `seed`: every input "
            "pipeline (on every worker) must compute the same permutation. "
            "Received: seed=None"
        )
    return config


def _pipeline_dataset(
    split_files: SplitFiles, config: ReaderConfig, context: tf.distribute.InputContext,
    skipped: corrupt.CorruptRecords | None = None,
) -> tf.data.Dataset:
    per_replica = context.get_per_replica_batch_size(config.batch_size)
    num_pipelines = context.num_input_pipelines
    pipeline_id = context.input_pipeline_id
    if config.remote.service is not None:
        if num_pipelines > 1 and config.remote.service_job_name is None:
            raise ValueError(
                f"`service` with {num_pipelines} input pipelines needs a `service_job_name`: "
                "without one each pipeline reads a job of its own, so every worker host "
                f"would get the whole split. Received: service={config.remote.service!r}, "
                "service_job_name=None"
            )
        # The service's workers shard (or hand out) the files: every pipeline
        # builds the whole split's pipeline and reads its share of one job.
        pipeline_id, num_pipelines = 0, 1
    if config.shuffle_mode != "global" and len(split_files.paths) < num_pipelines:
        logger.warning(
            "Split %r of %s has %d shard file(s) for %d input pipelines: every "
            "pipeline reads all files and keeps one record in every %d, so each reads "
            "%d times the data it uses. Convert with at least %d shards per split "
            "to shard by file.%s",
            split_files.split, split_files.data_dir, len(split_files.paths),
            num_pipelines, num_pipelines, num_pipelines, num_pipelines,
            "" if config.seed is not None or not config.shuffle else
            " Without a `seed` the file order is not shuffled in this mode.",
        )
    logger.info(
        "Input pipeline %d of %d: per-replica batch size %d.",
        pipeline_id, num_pipelines, per_replica,
    )
    return build_dataset(
        split_files,
        config,
        batch_size=per_replica,
        pipeline_id=pipeline_id,
        num_pipelines=num_pipelines,
        # Served, the service shards; tf.data's own auto-sharding stays as it is.
        sharded_here=config.remote.service is None,
        skipped=skipped,
    )


def make_dataset_fn(
    data_dir: str | os.PathLike,
    split: str = "train",
    *,
    global_batch_size: int,
    version: int | None = None,
    **options: Any,
) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """The dataset function `distributed_dataset` hands to the strategy.

    Reads and checks the manifest now, so errors surface here rather than
    inside the strategy.

    Args:
      data_dir: The dataset folder, as for `image_dataset_from_tfrecords`.
      split: The split to read.
      global_batch_size: Batch size summed over all replicas; must divide by
        the number of replicas.
      version: None for the latest version of a dataset that grew, N for
        exactly what version N held, as for `image_dataset_from_tfrecords`.
      **options: Any `ReaderConfig` option except `batch_size`, or the
        option groups whole (`reading=`, `image=`, `shuffling=`,
        `remote=`), as for `image_dataset_from_tfrecords`; a `reading`
        group's batch size is `global_batch_size`.

    Returns:
      `fn(input_context) -> tf.data.Dataset` building the pipeline of input
      pipeline `input_context.input_pipeline_id`, batched at
      `input_context.get_per_replica_batch_size(global_batch_size)`.

    Raises:
      TypeError: For an unknown option.
      ValueError, FileNotFoundError, schemas.ManifestError: As
        `image_dataset_from_tfrecords`.
    """
    config = _config(global_batch_size, options)
    split_files = load_split(data_dir, split, version=version)
    config.check_schema(split_files)
    return lambda context: _pipeline_dataset(split_files, config, context)


def distributed_dataset(
    strategy: tf.distribute.Strategy,
    data_dir: str | os.PathLike,
    split: str = "train",
    *,
    global_batch_size: int,
    version: int | None = None,
    **options: Any,
) -> tf.distribute.DistributedDataset:
    """Reads one split as a distributed dataset for `strategy`.

    Works with `MirroredStrategy`, `MultiWorkerMirroredStrategy` and other
    strategies supporting `distribute_datasets_from_function`, for
    `model.fit` and custom training loops (`strategy.run`).

    Args:
      strategy: The `tf.distribute.Strategy`.
      data_dir: The dataset folder, as for `image_dataset_from_tfrecords`.
      split: The split to read.
      global_batch_size: Batch size summed over all replicas; each replica
        gets `global_batch_size // strategy.num_replicas_in_sync`.
      version: None for the latest version, N for what version N held, see
        `make_dataset_fn`.
      **options: Any `ReaderConfig` option except `batch_size`, e.g.
        `image_size`, `seed`, `augment`, `repeat`.

    Returns:
      A `tf.distribute.DistributedDataset` whose per-replica elements are
      those of `image_dataset_from_tfrecords`. It has a `class_names`
      attribute, and `corrupt_records` (the damaged records this process's
      pipelines skipped, `readers.corrupt.CorruptRecords`).

    Raises:
      ValueError: If `global_batch_size` does not divide by the number of
        replicas, or an option is invalid.
      TypeError, FileNotFoundError, schemas.ManifestError: As
        `make_dataset_fn`.
    """
    replicas = strategy.num_replicas_in_sync
    if isinstance(global_batch_size, int) and global_batch_size % replicas:
        raise ValueError(
            f"`global_batch_size` must be divisible by the number of replicas "
            f"({replicas}). Received: global_batch_size={global_batch_size!r}"
        )
    config = _config(global_batch_size, options)
    split_files = load_split(data_dir, split, version=version)
    config.check_schema(split_files)
    skipped = corrupt.CorruptRecords()  # Every input pipeline of this process counts here.
    dataset = strategy.distribute_datasets_from_function(
        lambda context: _pipeline_dataset(split_files, config, context, skipped)
    )
    try:
        dataset.class_names = label_names(split_files, config.label_mode)
        dataset.corrupt_records = skipped
    except AttributeError:  # Some DistributedDataset types refuse attributes.
        logger.debug("Could not attach class_names to %r.", dataset)
    return dataset
