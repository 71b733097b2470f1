"""Child process of test_readers_distributed: MirroredStrategy on 2 logical CPUs.

Logical devices must be configured before TensorFlow initialises its devices,
which the test process has long done, hence a fresh interpreter. Prints one
JSON line with what it observed; the test makes the assertions.

Usage: python _reader_strategy_child.py DATA_DIR

Run with TF_ENABLE_ONEDNN_OPTS=0: with oneDNN, Keras's Dense fails on the empty
per-replica batch MirroredStrategy gives a replica at the end of an epoch
whose last global batch is partial ("Matrix size-incompatible: In[0]: [0,3]").
"""

import json
import sys

import tensorflow as tf

cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
)


from readers import distributed_dataset  # noqa: E402
from schemas import FILENAME  # noqa: E402
from _reader_data import exit_child, fit_one_epoch, strategy_label_sum  # noqa: E402


def main(data_dir: str) -> dict:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    result = {"replicas": strategy.num_replicas_in_sync}

    # One epoch, custom loop: which filenames reach which replica.
    dist = distributed_dataset(
        strategy, data_dir, "train", global_batch_size=4, image_size=(8, 8),
        extra_features=(FILENAME.key,), seed=3,
    )
    result["class_names"] = dist.class_names
    per_replica = [[] for _ in range(strategy.num_replicas_in_sync)]
    shapes = set()
    for images, labels, extras in dist:
        local_images = strategy.experimental_local_results(images)
        local_names = strategy.experimental_local_results(extras[FILENAME.key])
        for replica, (im, names) in enumerate(zip(local_images, local_names)):
            per_replica[replica].extend(n.decode() for n in names.numpy())
            shapes.add(tuple(im.shape[1:]))
            if im.shape[0]:
                # Each replica's tensors live on its own device.
                result.setdefault("devices", {})[str(replica)] = im.device
    result["filenames_per_replica"] = per_replica
    result["image_shapes"] = sorted(shapes)

    # A train step through strategy.run on the same pipeline.
    dist = distributed_dataset(
        strategy, data_dir, "train", global_batch_size=4, image_size=(8, 8), seed=3
    )
    result["label_sum_by_step"] = strategy_label_sum(strategy, dist)

    # model.fit, one epoch end to end.
    train = distributed_dataset(
        strategy, data_dir, "train", global_batch_size=4, image_size=(8, 8),
        augment="standard", scale=1 / 255, label_mode="categorical",
    )
    result.update(fit_one_epoch(strategy, train, len(dist.class_names)))
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
    exit_child()
