"""Training benchmark: how much of each step a model waits for its input.

Trains a small Keras convolutional network with `tf.distribute.MirroredStrategy`
over every visible GPU (the CPU when there is none) for a fixed number of
steps, once per input pipeline, from one converted dataset:

- ``shardsmith``: `readers.distributed_dataset` (default options, repeated);
- ``hand``: the hand-tuned tf.data TFRecord reader of `bench._read_baselines`
  (its ``stretch`` preset: the same work per image), given to
  `strategy.experimental_distribute_dataset`.

A step is a custom training loop step (`strategy.run` of forward, loss,
gradients and update), its loss fetched so that the step has finished when
its time is taken. For each reader it prints:

- images/s over the timed steps (after `--warmup` untimed ones, which trace
  the step function and fill the pipeline);
- input share: the time blocked in the distributed iterator's `next` (the
  input pipeline plus the copy to the devices) over the whole step time, in
  [0, 1]: 0 when the input is always ready, near 1 when the devices wait;
- the mean step and `next` times in milliseconds.

The model (a few strided convolutions, global pooling, a dense layer) is kept
small on purpose: the faster the step, the more the input shows.

Without `--data_dir`, a photo corpus (`bench.corpus photos`, `--count`
images) is made and converted first, as `bench.read` does (reused later).

Usage:

  python -m bench.gpu [--data_dir DIR | --count 2000] [--steps 200] [--warmup 20]
      [--batch_size 64] [--image_size 224] [--readers shardsmith,hand] [--json FILE]

`--batch_size` is the global batch size (split over the replicas).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from bench._cli import write_json

__all__ = ["READERS", "run", "main"]

_LOG = logging.getLogger("shardsmith.bench.gpu")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READERS = ("shardsmith", "hand")


def _model(keras, image_size: int, num_classes: int):
    layers = keras.layers
    inputs = keras.Input((image_size, image_size, 3))
    x = layers.Rescaling(1.0 / 255)(inputs)
    for filters in (32, 64, 128):
        x = layers.Conv2D(filters, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes)(x))


def _dataset(tf, strategy, reader: str, data_dir: str, batch_size: int, image_size: int):
    if reader == "shardsmith":
        import readers

        return readers.distributed_dataset(
            strategy, data_dir, global_batch_size=batch_size,
            image_size=(image_size, image_size), repeat=True,
        )
    from bench import _read_baselines

    ds = _read_baselines.hand(data_dir, "stretch", (image_size, image_size), batch_size)
    return strategy.experimental_distribute_dataset(ds)


def _train(tf, keras, strategy, dist_ds, *, num_classes: int, batch_size: int,
           image_size: int, steps: int, warmup: int) -> dict:
    """Runs `warmup` + `steps` steps; the figures of the timed ones."""
    with strategy.scope():
        model = _model(keras, image_size, num_classes)
        optimizer = keras.optimizers.SGD(0.01)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.nn.compute_average_loss(loss_fn(labels, logits),
                                              global_batch_size=batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(batch):
        losses = strategy.run(replica_step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    it = iter(dist_ds)
    for _ in range(warmup):
        step(next(it)).numpy()
    wait = total = 0.0
    images = 0
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        loss = float(step(batch).numpy())
        t2 = time.perf_counter()
        wait += t1 - t0
        total += t2 - t0
        images += batch_size
    if loss != loss:  # NaN: the step did not train on real numbers.
        raise RuntimeError("the training loss is NaN")
    return {
        "images_per_s": images / total,
        "input_share": wait / total,
        "step_ms": 1000 * total / steps,
        "next_ms": 1000 * wait / steps,
        "final_loss": loss,
    }


def run(*, data_dir: str, steps: int = 200, warmup: int = 20, batch_size: int = 64,
        image_size: int = 224, readers_: tuple[str, ...] = READERS) -> dict:
    """Trains once per reader; prints a table and returns the figures.

    Returns:
      {"devices": [...], "replicas": n, "results": {reader: {images_per_s,
      input_share, step_ms, next_ms, final_loss}}, ...}.
    """
    import keras
    import tensorflow as tf

    import readers

    gpus = tf.config.list_logical_devices("GPU")
    devices = [d.name for d in gpus] or ["/cpu:0"]
    strategy = tf.distribute.MirroredStrategy(devices)
    if batch_size % strategy.num_replicas_in_sync:
        raise ValueError(
            f"`batch_size` must be divisible by the number of replicas "
            f"({strategy.num_replicas_in_sync}). Received: batch_size={batch_size}"
        )
    num_classes = len(readers.load_manifest(data_dir).class_names)
    results = {}
    for reader in readers_:
        _LOG.info("Training from the %s reader: %d + %d steps", reader, warmup, steps)
        dist_ds = _dataset(tf, strategy, reader, data_dir, batch_size, image_size)
        results[reader] = _train(tf, keras, strategy, dist_ds, num_classes=num_classes,
                                 batch_size=batch_size, image_size=image_size, steps=steps,
                                 warmup=warmup)
    print(f"Training a small CNN with MirroredStrategy on {len(devices)} device(s) "
          f"({', '.join(devices)}), global batch {batch_size}, {image_size}x{image_size}, "
          f"{steps} timed steps after {warmup}; data {data_dir}")
    head = f"{'reader':<12} {'images/s':>9} {'input share':>12} {'step ms':>8} {'next ms':>8}"
    print(head)
    print("-" * len(head))
    for reader, r in results.items():
        print(f"{reader:<12} {r['images_per_s']:>9.1f} {r['input_share']:>12.3f} "
              f"{r['step_ms']:>8.2f} {r['next_ms']:>8.2f}")
    if "shardsmith" in results and "hand" in results:
        ratio = results["shardsmith"]["images_per_s"] / results["hand"]["images_per_s"]
        print(f"shardsmith vs hand-tuned: {ratio:.2f}x images/s")
    return {"devices": devices, "replicas": strategy.num_replicas_in_sync,
            "batch_size": batch_size, "image_size": image_size, "steps": steps,
            "warmup": warmup, "data_dir": data_dir, "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu",
        description="Train a small model with MirroredStrategy from shardsmith's reader and a "
        "hand-tuned one; print images/s and the share of each step spent waiting for input.",
    )
    parser.add_argument("--data_dir", help="A converted dataset (default: convert --count photos).")
    parser.add_argument("--count", type=int, default=2000,
                        help="Photos to generate and convert without --data_dir (default 2000).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of that corpus (default 0).")
    parser.add_argument("--work", default=os.path.join(_REPO, "build", "bench"),
                        help="Folder of corpora and conversions (default build/bench).")
    parser.add_argument("--steps", type=int, default=200, help="Timed steps (default 200).")
    parser.add_argument("--warmup", type=int, default=20, help="Untimed steps first (default 20).")
    parser.add_argument("--batch_size", type=int, default=64,
                        help="Global batch size (default 64).")
    parser.add_argument("--image_size", type=int, default=224, help="Side of the images.")
    parser.add_argument("--readers", default=",".join(READERS),
                        help=f"Comma-separated, of {READERS} (default both).")
    parser.add_argument("--json", help="Also write the results to this file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = tuple(n.strip() for n in args.readers.split(",") if n.strip())
    unknown = sorted(set(names) - set(READERS))
    if unknown or not names:
        parser.error(f"--readers must name some of {READERS}. Received: {args.readers!r}")
    if min(args.steps, args.batch_size, args.image_size, args.count) < 1 or args.warmup < 0:
        parser.error("--steps, --batch_size, --image_size and --count must be positive, "
                     "--warmup >= 0")
    data_dir = args.data_dir
    if data_dir is None:
        from bench import read

        _, data_dir = read.prepare("photos", args.count, args.seed, os.path.abspath(args.work))
    import readers

    # As the README tells a trainer to: before TensorFlow's first op.
    readers.use_pooled_host_memory()
    summary = run(data_dir=data_dir, steps=args.steps, warmup=args.warmup,
                  batch_size=args.batch_size, image_size=args.image_size, readers_=names)
    write_json(args.json, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
