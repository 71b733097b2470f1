"""Child process of test_readers_multiworker: one worker of a 2-worker MWMS.

The test starts two of these, each with its own TF_CONFIG (same cluster,
task index 0 or 1) and no GPU. They rendezvous when the strategy is built and
at every collective (the iterator's "any worker still has data?" all-reduce,
`strategy.reduce`, the gradient all-reduce), so both must run the
same program. Each writes a JSON file with what it observed; the test makes
the assertions.

Usage: python _reader_multiworker_child.py DATA_DIR OUT_JSON
"""

import json
import sys

import tensorflow as tf

# Two workers share a 2-core machine: keep each one's thread pools small.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402

from readers import distributed_dataset  # noqa: E402
from schemas import FILENAME  # noqa: E402
from _reader_data import exit_child, strategy_label_sum  # noqa: E402

GLOBAL_BATCH = 4
TRAIN_STEPS = 4


def _model(num_classes):
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(2, 3),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(num_classes, activation="softmax"),
    ])


def main(data_dir: str) -> dict:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    result = {
        "task_index": resolver.task_id,
        "replicas": strategy.num_replicas_in_sync,
        "local_replicas": len(strategy.extended.worker_devices),
    }

    # One epoch, no repeat, partial batches kept: which filenames this worker
    # saw, and its local per-replica batch size at every step.
    dist = distributed_dataset(
        strategy, data_dir, "train", global_batch_size=GLOBAL_BATCH, image_size=(8, 8),
        extra_features=(FILENAME.key,), seed=5, drop_remainder=False,
    )
    result["class_names"] = dist.class_names
    names, sizes = [], []
    for _images, _labels, extras in dist:
        for batch in strategy.experimental_local_results(extras[FILENAME.key]):
            names.extend(n.decode() for n in batch.numpy())
            sizes.append(int(batch.shape[0]))
    result["filenames"] = names
    result["local_batch_sizes"] = sizes

    # Custom loop: strategy.run plus a cross-worker reduce, so each step is a
    # collective; the global label sum must be the same on both workers.
    dist = distributed_dataset(
        strategy, data_dir, "train", global_batch_size=GLOBAL_BATCH, image_size=(8, 8), seed=5,
    )
    result["label_sum"] = strategy_label_sum(strategy, dist)

    # Training a Keras model: the documented multi-worker recipe (repeat, a
    # fixed number of steps, drop_remainder so no replica gets an empty batch)
    # in a custom loop. The optimizer all-reduces the gradients over workers.
    train = distributed_dataset(
        strategy, data_dir, "train", global_batch_size=GLOBAL_BATCH, image_size=(8, 8),
        seed=5, scale=1 / 255, label_mode="categorical", repeat=True, drop_remainder=True,
    )
    with strategy.scope():
        model = _model(len(dist.class_names))
        optimizer = keras.optimizers.SGD(0.5)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.CategoricalCrossentropy(reduction=None)

    @tf.function
    def train_step(images, labels):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                per_example = loss_fn(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        per = strategy.run(replica_fn, args=(images, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)

    batches = iter(train)
    result["train_losses"] = [float(train_step(*next(batches))) for _ in range(TRAIN_STEPS)]
    # The variables are mirrored: identical on both workers after training.
    result["weights"] = [w.numpy().ravel().tolist() for w in model.trainable_variables]

    # model.fit, as is. With Keras 3 (3.15) it fails under MWMS before the
    # first step, whatever the data (keras-team/keras#20585):
    # `_maybe_symbolic_build` calls `strategy.reduce("MEAN", (x, y),
    # axis=None)` on the whole batch structure, which the cross-worker reduce
    # cannot convert ("Attempt to convert a value (PerReplica...)"); and,
    # past that, `reduce_per_replica` reduces the scalar logs with
    # `strategy.reduce("MEAN", v, axis=0)` ("Invalid reduction dimension 0").
    # Both workers fail the same way, before any collective.
    with strategy.scope():
        fit_model = _model(len(dist.class_names))
        fit_model.compile(optimizer="sgd", loss="categorical_crossentropy")
    try:
        history = fit_model.fit(train, epochs=1, steps_per_epoch=TRAIN_STEPS, verbose=0)
        result["fit"] = {"loss": history.history["loss"]}
    except Exception as e:  # noqa: BLE001 - reported to the test
        message = " ".join(str(e).split())  # the PerReplica repr is long
        if len(message) > 240:
            message = f"{message[:100]} ... {message[-120:]}"
        result["fit"] = {"error": f"{type(e).__name__}: {message}"}
    return result


if __name__ == "__main__":
    out = main(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    exit_child()
