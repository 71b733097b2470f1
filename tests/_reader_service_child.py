"""Child process of test_readers_service: reads through a tf.data service.

A child so that a read the service leaves waiting cannot hang the test
process (the test kills it after its timeout), and for MirroredStrategy,
whose logical devices must be set before TensorFlow starts.

Usage: python _reader_service_child.py DATA_DIR SERVICE

In one process (TensorFlow starts once): reads of the split in static mode,
then MirroredStrategy on 2 logical CPUs (a custom read of the distributed
dataset, then `model.fit` from the service), then two trials of a sweep (one
job, a trainer id each), then one dynamic read that prints 'first batch'
after its first batch (the test then kills a worker).
Prints one JSON line last with what it observed; the test asserts.

Run with TF_ENABLE_ONEDNN_OPTS=0, as _reader_strategy_child.py (Keras's Dense
and the empty per-replica batches of MirroredStrategy).
"""

import json
import sys
import time

import tensorflow as tf

DATA_DIR, SERVICE = sys.argv[1:3]
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)


from readers import distributed_dataset, image_dataset_from_tfrecords  # noqa: E402
from schemas import FILENAME  # noqa: E402
from _reader_data import exit_child, fit_one_epoch  # noqa: E402

SMALL = dict(image_size=(8, 8), extra_features=(FILENAME.key,))


def _batches(ds):
    """[(filenames...), ...] and {filename: label} of a (images, labels, extras) dataset."""
    batches, labels, pixels = [], {}, {}
    for images, batch_labels, extras in ds:
        names = [n.decode() for n in extras[FILENAME.key].numpy()]
        batches.append(names)
        for name, label, image in zip(names, batch_labels.numpy(), images.numpy()):
            labels[name] = int(label)
            pixels[name] = float(image.sum())
    return batches, labels, pixels


def static() -> dict:
    result = {}
    ds = image_dataset_from_tfrecords(DATA_DIR, service=SERVICE, batch_size=4, **SMALL)
    result["cardinality"] = int(ds.cardinality())
    result["class_names"] = ds.class_names
    result["batches"], result["labels"], pixels = _batches(ds)
    # Compressed by the workers (snappy), uncompressed here: the same records, the same pixels.
    ds = image_dataset_from_tfrecords(DATA_DIR, service=SERVICE, batch_size=4,
                                      service_compression="snappy", **SMALL)
    snappy_batches, _, snappy_pixels = _batches(ds)
    result["snappy"] = {"names": sorted(n for b in snappy_batches for n in b),
                        "same_pixels": snappy_pixels == pixels}
    # Two trainers reading one job by name share it.
    shared = [
        iter(image_dataset_from_tfrecords(DATA_DIR, service=SERVICE, batch_size=2,
                                          service_job_name="sweep", **SMALL))
        for _ in range(2)
    ]
    per_trainer, live = [[], []], [True, True]
    while any(live):
        for i, it in enumerate(shared):
            if live[i]:
                try:
                    _, _, extras = next(it)
                except StopIteration:
                    live[i] = False
                    continue
                per_trainer[i] += [n.decode() for n in extras[FILENAME.key].numpy()]
    result["shared"] = per_trainer
    # Seeded, with augmentation on the workers: the same batches (in any order).
    seeded = []
    for _ in range(2):
        ds = image_dataset_from_tfrecords(DATA_DIR, service=SERVICE, batch_size=3, seed=7,
                                          augment="standard", **SMALL)
        batches, _, pixels = _batches(ds)
        seeded.append({"batches": sorted(batches), "pixels": pixels})
    result["seeded"] = seeded
    return result


def sweep() -> dict:
    """Two trials of a hyper-parameter sweep on one job, a trainer id each, read
    in turns until each has seen every record of the split (at most 60 s).

    A worker starts its part of a new job at its next heartbeat, and a reader
    looks for new parts every second or so: until then both trials read the
    other worker's stream alone, however many batches they take.
    """
    trials = [
        image_dataset_from_tfrecords(DATA_DIR, service=SERVICE, batch_size=2, repeat=True,
                                     service_job_name="trials", service_trainer_id=trial,
                                     **SMALL)
        for trial in ("trial-a", "trial-b")
    ]
    records = trials[0].records_per_epoch
    iterators = [iter(ds) for ds in trials]
    batches, seen = [[], []], [set(), set()]
    deadline = time.monotonic() + 60
    while min(len(s) for s in seen) < records and time.monotonic() < deadline:
        for i, it in enumerate(iterators):
            _, _, extras = next(it)
            names = [n.decode() for n in extras[FILENAME.key].numpy()]
            batches[i].append(names)
            seen[i].update(names)
        if len(batches[0]) % 20 == 0:
            time.sleep(0.1)  # wait for the other worker rather than spin through the first
    return {"batches": batches}


def dynamic() -> dict:
    def slow(image):
        # Some work per image (TensorFlow ops only: the workers run it), so that
        # the epoch lasts long enough to lose a worker in the middle of it.
        x = tf.ones([160, 160]) / 160.0
        for _ in range(12):
            x = tf.matmul(x, x)
        return image + 0.0 * tf.reduce_sum(x)

    # With every worker alive, a dynamic epoch is every record once (seeds per file:
    # the split provider takes them with the files).
    ds = image_dataset_from_tfrecords(DATA_DIR, service=SERVICE, service_sharding="dynamic",
                                      batch_size=3, augment="standard", seed=5, **SMALL)
    whole = [n for batch in _batches(ds)[0] for n in batch]
    ds = image_dataset_from_tfrecords(DATA_DIR, service=SERVICE, service_sharding="dynamic",
                                      batch_size=2, augment=slow, **SMALL)
    names = []
    for _, _, extras in ds:
        names += [n.decode() for n in extras[FILENAME.key].numpy()]
        if len(names) == 2:
            print("first batch", flush=True)
    return {"whole": whole, "names": names}


def fit() -> dict:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    result = {"replicas": strategy.num_replicas_in_sync}
    dist = distributed_dataset(strategy, DATA_DIR, global_batch_size=4, service=SERVICE, **SMALL)
    names = []
    for _, _, extras in dist:
        for local in strategy.experimental_local_results(extras[FILENAME.key]):
            names += [n.decode() for n in local.numpy()]
    result["names"] = names
    train = distributed_dataset(strategy, DATA_DIR, global_batch_size=4, service=SERVICE,
                                image_size=(8, 8), scale=1 / 255, label_mode="categorical",
                                augment="standard")
    result.update(fit_one_epoch(strategy, train, len(dist.class_names)))
    return result


if __name__ == "__main__":
    # Dynamic last: the worker it loses is back only some seconds later.
    result, seconds = {}, {}
    for name, part in (("static", static), ("fit", fit), ("sweep", sweep), ("dynamic", dynamic)):
        start = time.perf_counter()
        result[name] = part()
        seconds[name] = round(time.perf_counter() - start, 1)
    print(json.dumps({**result, "seconds": seconds}), flush=True)
    exit_child()
