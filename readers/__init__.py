"""tf.data readers for datasets written by the shardsmith converter.

    ds = readers.image_dataset_from_tfrecords("gs://bucket/pets", "train",
                                              image_size=(224, 224))
    model.fit(ds, epochs=10)

The lower-level pieces live in `readers.metadata` (manifest and shard files),
`readers.decode` (records to tensors, schema only) and `readers.preprocess`
(resize policies, augmentation, output dtype). `shuffle="global"` (a true
per-epoch permutation read by offset, resumable exactly from a
`ReadPosition`) lives in `readers.global_shuffle`, `readers.record_index`
and `readers.positions`; `ResumeCallback` (which imports Keras) is loaded on
first use.

Importing `readers` before TensorFlow runs its first op turns on TensorFlow's
pooling allocator for host memory (`TF_CPU_ALLOCATOR_USE_BFC=true`, unless
that variable is set already): see `readers._allocator` for why and how to
opt out.
"""

# First: host memory from a pool, chosen before TensorFlow creates its
# devices; then TensorFlow, imported once, the cheap way (schemas/_tf.py).
from readers import _allocator  # isort: skip
from schemas import _tf  # isort: skip

_allocator.use_pooling_allocator()
_tf.full()
from readers.dataset import ReaderConfig, image_dataset_from_tfrecords
from readers.distributed import distributed_dataset, make_dataset_fn
from readers.metadata import load_manifest
from readers.positions import PositionTracker, ReadPosition

__all__ = [
    "ReaderConfig",
    "image_dataset_from_tfrecords",
    "distributed_dataset",
    "make_dataset_fn",
    "load_manifest",
    "ReadPosition",
    "PositionTracker",
    "ResumeCallback",
]


def __getattr__(name):
    # Keras costs a second to import; only training with fit needs it here.
    if name == "ResumeCallback":
        from readers.resume import ResumeCallback

        return ResumeCallback
    raise AttributeError(f"module 'readers' has no attribute {name!r}")
