"""Child process of test_readers_targets: the target label modes under MirroredStrategy.

Two logical CPU devices must be configured before TensorFlow initialises its devices,
hence a fresh interpreter (as _reader_strategy_child.py). Prints one JSON line with what
it observed; the test makes the assertions.

Usage: python _reader_targets_strategy_child.py SEG_DATA_DIR MULTI_DATA_DIR
"""

import json
import sys

import tensorflow as tf

cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402

from readers import distributed_dataset, make_dataset_fn  # noqa: E402


def _local(strategy, value):
    return strategy.experimental_local_results(value)


def _fit(strategy, dist, outputs, loss, steps: list) -> float:
    with strategy.scope():
        inputs = keras.Input((24, 24, 3))
        x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
        model = keras.Model(inputs, outputs(x))
        model.compile(optimizer="sgd", loss=loss)
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: steps.append(b))
    return model.fit(dist, epochs=1, verbose=0, callbacks=[counter]).history["loss"][-1]


def main(seg_dir: str, multi_dir: str) -> dict:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    result = {"replicas": strategy.num_replicas_in_sync}
    common = {"global_batch_size": 4, "image_size": (24, 24), "scale": 1 / 255, "seed": 0}

    # Masks: per-replica batches, each replica's images with their own masks.
    dist = distributed_dataset(strategy, seg_dir, "train", label_mode="mask",
                               augment="standard", **common)
    shapes, images = set(), 0
    for x, y in dist:
        for im, mask in zip(_local(strategy, x), _local(strategy, y)):
            assert im.shape[:3] == mask.shape[:3]
            shapes.add(tuple(mask.shape))
            images += int(mask.shape[0])
    result["mask_shapes"] = sorted(shapes)
    result["mask_images"] = images

    # Padded boxes: dense per-replica tensors.
    dist = distributed_dataset(strategy, seg_dir, "train", label_mode="boxes", pad_boxes=3,
                               **common)
    result["boxes_shapes"] = sorted({tuple(b.shape) for _, y in dist
                                     for b in _local(strategy, y["boxes"])})
    # Ragged boxes: RaggedTensors per replica, in a custom loop.
    dist = distributed_dataset(strategy, seg_dir, "train", label_mode="boxes", resize="crop",
                               **common)
    result["ragged_boxes"] = sum(int(b.flat_values.shape[0]) for _, y in dist
                                 for b in _local(strategy, y["boxes"]))

    # model.fit, one epoch per mode. Keras takes one output here: the boxes of the
    # padded boxes, through make_dataset_fn and a map in each input pipeline.
    gap = keras.layers.GlobalAveragePooling2D
    boxes_fn = make_dataset_fn(seg_dir, "train", label_mode="boxes", pad_boxes=3, **common)
    runs = {
        "mask": (distributed_dataset(strategy, seg_dir, "train", label_mode="mask",
                                     augment="standard", **common),
                 lambda x: keras.layers.Conv2D(5, 1)(x),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        "boxes": (strategy.distribute_datasets_from_function(
                      lambda context: boxes_fn(context).map(lambda x, y: (x, y["boxes"]))),
                  lambda x: keras.layers.Reshape((3, 4))(keras.layers.Dense(12)(gap()(x))),
                  "mse"),
        "multi_hot": (distributed_dataset(strategy, multi_dir, "train", label_mode="multi_hot",
                                          **common),
                      lambda x: keras.layers.Dense(3, activation="sigmoid")(gap()(x)),
                      "binary_crossentropy"),
        "target": (distributed_dataset(strategy, multi_dir, "train", label_mode="target",
                                       **common),
                   lambda x: keras.layers.Dense(2)(gap()(x)), "mse"),
    }
    result["fit_loss"], result["fit_steps"] = {}, {}
    for mode, (dist, outputs, loss) in runs.items():
        steps = []
        result["fit_loss"][mode] = _fit(strategy, dist, outputs, loss, steps)
        result["fit_steps"][mode] = len(steps)
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
    from _reader_data import exit_child

    exit_child()
