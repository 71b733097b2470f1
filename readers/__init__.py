"""tf.data readers for datasets written by the shardsmith converter.

    ds = readers.image_dataset_from_tfrecords("gs://bucket/pets", "train",
                                              image_size=(224, 224))
    model.fit(ds, epochs=10)

The lower-level pieces live in `readers.metadata` (manifest and shard files),
`readers.decode` (records to tensors, schema only), `readers.preprocess`
(resize policies, augmentation, output dtype) and `readers.targets` (the
label modes 'mask', 'boxes', 'oriented_boxes', 'multi_hot' and 'target' of datasets converted
with targets, each target moved with its image). `shuffle="global"` (a true
per-epoch permutation read by offset, resumable exactly from a
`ReadPosition`) lives in `readers.global_shuffle`, `readers.record_index`
and `readers.positions`; `diagnose` (`readers.doctor`) says whether a model's
training steps wait for their input, and which stage bounds it;
`ResumeCallback` (which imports Keras) is loaded on first use.
`readers.service` runs the tf.data service (`shardsmith serve-data`) that the
readers' `service=` option reads through.

Importing `readers` changes nothing in the process (no environment variable,
logger or allocator). `readers.use_pooled_host_memory()`, called by a training
script before TensorFlow runs its first op, gives TensorFlow's host memory a
pool: see `readers._allocator` for when that helps.
"""

# TensorFlow, imported once, the cheap way (schemas/tf_runtime.py), before the
# modules below import it.
from schemas import tf_runtime as _tf_runtime  # isort: skip

_tf_runtime.full()
from readers._allocator import use_pooled_host_memory
from readers.dataset import ReaderConfig, image_dataset_from_tfrecords, without_extras
from readers.distributed import distributed_dataset, make_dataset_fn
from readers.doctor import Diagnosis, DoctorOptions, diagnose
from readers.metadata import load_manifest
from readers.options import ImageOptions, ReadOptions, ServiceReadOptions, ShuffleOptions
from readers.positions import PositionTracker, ReadPosition
from readers.volumes import volume_dataset_from_tfrecords
from readers.time_series import time_series_dataset_from_tfrecords

__all__ = [
    "ReaderConfig",
    "ReadOptions",
    "ImageOptions",
    "ShuffleOptions",
    "ServiceReadOptions",
    "image_dataset_from_tfrecords",
    "volume_dataset_from_tfrecords",
    "time_series_dataset_from_tfrecords",
    "distributed_dataset",
    "make_dataset_fn",
    "load_manifest",
    "ReadPosition",
    "PositionTracker",
    "ResumeCallback",
    "use_pooled_host_memory",
    "without_extras",
    "diagnose",
    "DoctorOptions",
    "Diagnosis",
]


def __getattr__(name):
    # Keras costs a second to import; only training with fit needs it here.
    if name == "ResumeCallback":
        from readers.resume import ResumeCallback

        return ResumeCallback
    raise AttributeError(f"module 'readers' has no attribute {name!r}")
