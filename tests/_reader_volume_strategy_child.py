"""Child process of test_readers_volumes: the volume reader under MirroredStrategy on 2 logical CPUs.

Logical devices must be configured before TensorFlow initialises its devices, hence a fresh
interpreter. Prints one JSON line with what it observed; the test makes the assertions.

Usage: python _reader_volume_strategy_child.py DATA_DIR
"""

import json
import sys

import tensorflow as tf

cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)

import readers  # noqa: E402


def main(data_dir: str) -> dict:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def dataset_fn(context):
        return readers.volume_dataset_from_tfrecords(
            data_dir, "train", batch_size=context.get_per_replica_batch_size(2), patch_size=(4, 4, 4),
            patches_per_volume=2, seed=0, input_context=context, extra_features=("filename",))

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    result = {"replicas": strategy.num_replicas_in_sync, "names_per_replica": [[], []]}
    shapes, devices, label_sum = set(), set(), 0

    @tf.function
    def step(labels):
        return strategy.run(lambda y: tf.reduce_sum(y), args=(labels,))

    for volumes, labels, extras in dist:
        local = strategy.experimental_local_results(volumes)
        names = strategy.experimental_local_results(extras["filename"])
        for replica, (v, n) in enumerate(zip(local, names)):
            result["names_per_replica"][replica] += [x.decode() for x in n.numpy()]
            if v.shape[0]:
                shapes.add(tuple(v.shape[1:]))
                devices.add(v.device)
        label_sum += int(strategy.reduce(tf.distribute.ReduceOp.SUM, step(labels), axis=None))
    result.update(shapes=sorted(shapes), devices=sorted(devices), label_sum=label_sum)
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
