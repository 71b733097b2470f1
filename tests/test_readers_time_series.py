"""readers.time_series_dataset_from_tfrecords on stack records written with the schema alone."""

import hashlib
import json

import numpy as np
import pytest

import schemas
from schemas.tfrecord import format_index, frame_record

tf = pytest.importorskip("tensorflow")
import readers  # noqa: E402


def _write_dataset(out, stacks, *, classes=("corn", "wheat"), split_of=lambda i: "train", nodata=None, masks=None):
    """A finished dataset of `stacks` ((values (t, h, w, b), dates, label)), one shard per split."""
    schema = schemas.TimeSeriesExampleSchema(mask=masks is not None)
    out.mkdir(parents=True, exist_ok=True)
    by_split = {}
    for i, (values, dates, label) in enumerate(stacks):
        record = schemas.StackRecord(
            stack=values.astype(values.dtype.newbyteorder("<")).tobytes(), dtype=values.dtype.name,
            shape=values.shape, dates=dates, bands=tuple(f"B{b + 1}" for b in range(values.shape[3])),
            label=label, filename=f"loc_{i}", epsg=32631, geotransform=(0.0, 10.0, 0.0, 0.0, 0.0, -10.0),
            mask=None if masks is None else masks[i])
        by_split.setdefault(split_of(i), []).append((schema.encode(record), values, label))
    splits = {}
    for split, records in by_split.items():
        name = schemas.shard_filename(split, 0, 1)
        framed = [frame_record(r) for r, _, _ in records]
        data = b"".join(framed)
        (out / name).write_bytes(data)
        offsets, pos = [], 0
        for f in framed:
            offsets.append((pos, len(f)))
            pos += len(f)
        index = format_index(offsets)
        (out / schemas.index_filename(name)).write_bytes(index)
        stats = schemas.BandStats.combine([
            schemas.BandStats(1, *_stats(v, nodata)) for _, v, _ in records])
        counts = [sum(1 for _, _, lab in records if lab == c) for c in range(len(classes))]
        splits[split] = schemas.SplitInfo(split, (schemas.ShardInfo(
            name, len(records), len(data), hashlib.sha256(data).hexdigest(), tuple(counts),
            schemas.index_filename(name), hashlib.sha256(index).hexdigest(), band_stats=stats),))
    section = {"dtypes": sorted({v.dtype.name for v, _, _ in stacks}),
               "steps": sorted({v.shape[0] for v, _, _ in stacks}),
               "sizes": [list(s) for s in sorted({v.shape[1:3] for v, _, _ in stacks})],
               "bands": [f"B{b + 1}" for b in range(stacks[0][0].shape[3])]}
    extra = {schemas.TIME_SERIES: section}
    if masks is not None:
        extra["targets"] = {"mask": {"dtype": "uint8"}}
    manifest = schemas.Manifest(schemas.SCHEMA_VERSION, "test", schema.to_json(), tuple(classes), splits,
                                {}, {}, {}, {}, extra)
    (out / schemas.MANIFEST_FILENAME).write_text(manifest.to_json())
    return out


def _stats(values, nodata):
    b = values.shape[3]
    flat = values.reshape(-1, b).astype(np.float64)
    count, mins, maxs, means, m2s, nod = [], [], [], [], [], []
    for k in range(b):
        col = flat[:, k]
        good = col[~np.isnan(col)] if nodata is None else col[(col != nodata) & ~np.isnan(col)]
        count.append(len(good))
        mins.append(float(good.min()))
        maxs.append(float(good.max()))
        means.append(float(good.mean()))
        m2s.append(float(((good - good.mean()) ** 2).sum()))
        nod.append(len(col) - len(good))
    return tuple(count), tuple(mins), tuple(maxs), tuple(means), tuple(m2s), tuple(nod)


def _stack(seed, t, h=6, w=5, b=3, dtype=np.uint16):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 10000, size=(t, h, w, b)).astype(dtype)


def _dates(t, first=18000):
    return tuple(first + 10 * k for k in range(t))


def test_stacks_come_back_exactly_as_stored(tmp_path):
    stacks = [(_stack(i, t), _dates(t, 18000 + i), i % 2) for i, t in enumerate((3, 5, 4))]
    data = _write_dataset(tmp_path / "ds", stacks)
    ds = readers.time_series_dataset_from_tfrecords(data, "train", batch_size=None, dtype=None, shuffle=False,
                                                    deterministic=True, extra_features=("stack/dates", "filename", "stack/bands"))
    got = list(ds)
    assert len(got) == 3
    for (stack, label, extras), (values, dates, lab) in zip(got, stacks):
        assert stack.dtype == tf.uint16
        np.testing.assert_array_equal(stack.numpy(), values)
        assert label.numpy() == lab
        assert extras["stack/dates"].numpy().tolist() == list(dates)
        assert [b.decode() for b in extras["stack/bands"].numpy()] == ["B1", "B2", "B3"]
    assert ds.class_names == ["corn", "wheat"] and ds.band_names == ["B1", "B2", "B3"]


def test_max_steps_pads_with_a_mask_and_subsamples_in_date_order(tmp_path):
    stacks = [(_stack(0, 3), _dates(3), 0), (_stack(1, 8), _dates(8), 1)]
    data = _write_dataset(tmp_path / "ds", stacks)
    ds = readers.time_series_dataset_from_tfrecords(
        data, batch_size=2, max_steps=5, shuffle=False, seed=7,
        extra_features=("stack/dates", "stack/valid"))
    (stack, labels, extras), = list(ds)
    assert stack.shape == (2, 5, 6, 5, 3) and stack.dtype == tf.float32
    valid = extras["stack/valid"].numpy()
    assert valid.tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    np.testing.assert_array_equal(stack[0, :3].numpy(), stacks[0][0].astype(np.float32))
    assert not stack[0, 3:].numpy().any()
    assert extras["stack/dates"][0].numpy().tolist() == list(_dates(3)) + [0, 0]
    # Sub-sampled: 5 of the 8 dates, ascending, each with its own values.
    dates = extras["stack/dates"][1].numpy().tolist()
    assert dates == sorted(dates) and len(set(dates)) == 5 and set(dates) <= set(_dates(8))
    for k, d in enumerate(dates):
        np.testing.assert_array_equal(stack[1, k].numpy(), stacks[1][0][_dates(8).index(d)].astype(np.float32))
    # Seeded: the same draw on a new dataset with the same seed.
    again = readers.time_series_dataset_from_tfrecords(
        data, batch_size=2, max_steps=5, shuffle=False, seed=7, extra_features=("stack/dates",))
    assert next(iter(again))[2]["stack/dates"][1].numpy().tolist() == dates


def test_batching_stacks_of_several_lengths_needs_max_steps(tmp_path):
    data = _write_dataset(tmp_path / "ds", [(_stack(0, 3), _dates(3), 0), (_stack(1, 4), _dates(4), 1)])
    with pytest.raises(ValueError, match="max_steps"):
        readers.time_series_dataset_from_tfrecords(data, batch_size=2)
    with pytest.raises(ValueError, match="max_steps"):
        readers.time_series_dataset_from_tfrecords(data, max_steps=0)
    with pytest.raises(ValueError, match="extra_features"):
        readers.time_series_dataset_from_tfrecords(data, batch_size=None, extra_features=("image",))
    with pytest.raises(ValueError, match="mask"):
        readers.time_series_dataset_from_tfrecords(data, batch_size=None, label_mode="mask")
    # An image reader refuses stacks, naming the reader to use.
    with pytest.raises(schemas.ManifestError, match="time_series_dataset_from_tfrecords"):
        readers.image_dataset_from_tfrecords(data, "train")


def test_normalize_dataset_uses_the_train_statistics_and_resize_keeps_every_date_alike(tmp_path):
    stacks = [(_stack(i, 4), _dates(4), i % 2) for i in range(4)]
    data = _write_dataset(tmp_path / "ds", stacks, split_of=lambda i: "train" if i < 3 else "validation")
    train = np.concatenate([s.reshape(-1, 3) for s, _, _ in stacks[:3]]).astype(np.float64)
    mean, std = train.mean(axis=0), train.std(axis=0)
    ds = readers.time_series_dataset_from_tfrecords(data, "validation", batch_size=None, normalize="dataset",
                                                    shuffle=False)
    stack, _ = next(iter(ds))
    np.testing.assert_allclose(stack.numpy(), (stacks[3][0] - mean) / std, rtol=1e-4, atol=1e-4)
    ds = readers.time_series_dataset_from_tfrecords(data, "validation", batch_size=1, image_size=(3, 10),
                                                    interpolation="nearest", shuffle=False)
    stack, _ = next(iter(ds))
    assert stack.shape == (1, 4, 3, 10, 3)
    for t in range(4):  # every date resized as TF resizes one image
        np.testing.assert_array_equal(
            stack[0, t].numpy(),
            tf.image.resize(stacks[3][0][t].astype(np.float32), (3, 10), method="nearest").numpy())


def test_augmentation_moves_every_date_and_the_mask_alike(tmp_path):
    import io

    from PIL import Image

    h, w = 6, 6
    values = np.zeros((3, h, w, 1), np.uint16)
    ids = np.zeros((h, w), np.uint8)
    values[:, 0, 1, 0] = [1, 2, 3]  # a marked pixel on every date
    ids[0, 1] = 7
    buf = io.BytesIO()
    Image.fromarray(ids).save(buf, "png")
    data = _write_dataset(tmp_path / "ds", [(values, _dates(3), 0)] * 6, masks=[buf.getvalue()] * 6)
    ds = readers.time_series_dataset_from_tfrecords(data, batch_size=None, label_mode="mask",
                                                    augment="flip_rotate", seed=3, shuffle=False)
    positions = set()
    for stack, mask in ds:
        stack, mask = stack.numpy(), mask.numpy()
        where = np.argwhere(mask[:, :, 0] == 7)
        assert len(where) == 1
        y, x = where[0]
        assert stack[:, y, x, 0].tolist() == [1, 2, 3]  # same move for every date and the mask
        assert np.count_nonzero(stack) == 3
        positions.add((y, x))
    assert len(positions) > 1  # it did move


def test_distributed_pipelines_read_disjoint_shares(tmp_path):
    stacks = [(_stack(i, 2), _dates(2), i % 2) for i in range(6)]
    data = _write_dataset(tmp_path / "ds", stacks, split_of=lambda i: "train")
    names = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline,
                                             num_replicas_in_sync=2)
        ds = readers.time_series_dataset_from_tfrecords(data, batch_size=None, shuffle=False,
                                                        extra_features=("filename",), input_context=context)
        names.append([e[2]["filename"].numpy().decode() for e in ds])
    assert sorted(names[0] + names[1]) == [f"loc_{i}" for i in range(6)]
    assert not set(names[0]) & set(names[1])


def test_stacks_of_one_shape_have_a_static_shape_and_every_value_in_batches(tmp_path):
    stacks = [(_stack(i, 4), _dates(4, 18000 + i), i % 2) for i in range(5)]
    data = _write_dataset(tmp_path / "ds", stacks)
    mean, std = (100.0, 200.0, 300.0), (2.0, 4.0, 8.0)
    ds = readers.time_series_dataset_from_tfrecords(
        data, batch_size=2, max_steps=6, normalize=(mean, std), label_mode="categorical", shuffle=False,
        extra_features=("stack/dates", "stack/valid", "filename", "geotransform", "stack/shape"))
    # One shape for the split (the manifest's): every axis but the batch's is known before reading.
    assert ds.element_spec[0].shape.as_list() == [None, 6, 6, 5, 3]
    got = list(ds)
    assert [int(s.shape[0]) for s, _, _ in got] == [2, 2, 1]
    stack = np.concatenate([s.numpy() for s, _, _ in got])
    labels = np.concatenate([lab.numpy() for _, lab, _ in got])
    extras = {k: np.concatenate([e[k].numpy() for _, _, e in got]) for k in got[0][2]}
    for i, (values, dates, label) in enumerate(stacks):
        expected = (values.astype(np.float64) - mean) / std  # padded steps: zeros after normalizing, as per stack
        np.testing.assert_allclose(stack[i, :4], expected, rtol=1e-6)
        assert not stack[i, 4:].any()
        assert labels[i].tolist() == [1.0 - label, float(label)]
        assert extras["stack/dates"][i].tolist() == list(dates) + [0, 0]
        assert extras["stack/valid"][i].tolist() == [True] * 4 + [False] * 2
        assert extras["filename"][i].decode() == f"loc_{i}"
        assert extras["stack/shape"][i].tolist() == [4, 6, 5, 3]
        np.testing.assert_array_equal(extras["geotransform"][i], (0.0, 10.0, 0.0, 0.0, 0.0, -10.0))
    # As stored (dtype=None) and resized, every date as TF resizes one image; whole batches only.
    exact = readers.time_series_dataset_from_tfrecords(data, batch_size=2, dtype=None, shuffle=False,
                                                       drop_remainder=True)
    assert exact.element_spec[0].shape.as_list() == [2, 4, 6, 5, 3]
    batches = [s.numpy() for s, _ in exact]
    assert len(batches) == 2 and batches[0].dtype == np.uint16
    np.testing.assert_array_equal(np.concatenate(batches), np.stack([v for v, _, _ in stacks[:4]]))
    resized = readers.time_series_dataset_from_tfrecords(data, batch_size=5, image_size=(3, 10),
                                                         interpolation="nearest", shuffle=False)
    (stack, _), = list(resized)
    for i, (values, _, _) in enumerate(stacks):
        for t in range(4):
            np.testing.assert_array_equal(
                stack[i, t].numpy(), tf.image.resize(values[t].astype(np.float32), (3, 10), method="nearest").numpy())


def _by_name(ds):
    """filename -> stack of every element of an unbatched dataset read with extra_features=('filename',)."""
    return [(extras["filename"].numpy().decode(), stack.numpy()) for stack, _, extras in ds]


def test_global_shuffle_reads_every_stack_once_per_epoch_in_a_seeded_permutation(tmp_path):
    stacks = [(_stack(i, 3), _dates(3), i % 2) for i in range(12)]
    data = _write_dataset(tmp_path / "ds", stacks)

    def read(seed):
        return readers.time_series_dataset_from_tfrecords(
            data, batch_size=None, dtype=None, shuffle="global", seed=seed, extra_features=("filename",))

    two = readers.time_series_dataset_from_tfrecords(
        data, batch_size=None, dtype=None, shuffle="global", seed=5, repeat=True, extra_features=("filename",))
    read_two = _by_name(two.take(24))
    epochs = [read_two[:12], read_two[12:]]
    for epoch in epochs:
        assert sorted(name for name, _ in epoch) == sorted(f"loc_{i}" for i in range(12))
        for name, values in epoch:  # each stack exactly as written
            np.testing.assert_array_equal(values, stacks[int(name[4:])][0])
    orders = [[name for name, _ in epoch] for epoch in epochs]
    assert orders[0] != [f"loc_{i}" for i in range(12)] and orders[0] != orders[1]
    assert [name for name, _ in _by_name(read(5))] == orders[0]  # the same seed, the same order
    batched = readers.time_series_dataset_from_tfrecords(data, batch_size=5, shuffle="global", seed=5,
                                                         drop_remainder=True)
    assert [int(s.shape[0]) for s, _ in batched] == [5, 5]
    with pytest.raises(ValueError, match="cache"):
        readers.time_series_dataset_from_tfrecords(data, shuffle="global", seed=1, cache=True)
    with pytest.raises(TypeError, match="shuffle"):
        readers.time_series_dataset_from_tfrecords(data, shuffle="everything")


def test_cache_keeps_the_first_epochs_stacks(tmp_path):
    stacks = [(_stack(i, 3), _dates(3), i % 2) for i in range(4)]
    data = _write_dataset(tmp_path / "ds", stacks)
    ds = readers.time_series_dataset_from_tfrecords(data, batch_size=None, dtype=None, shuffle=False,
                                                    deterministic=True, cache=str(tmp_path / "cache"),
                                                    extra_features=("filename",))
    first = _by_name(ds)
    assert list(tmp_path.glob("cache*"))  # written by the first epoch
    for shard in (tmp_path / "ds").glob("*.tfrecord"):
        shard.write_bytes(b"")  # later epochs read the cache, not the shards
    second = _by_name(ds)
    assert [n for n, _ in first] == [n for n, _ in second] == [f"loc_{i}" for i in range(4)]
    for (_, a), (_, b), (values, _, _) in zip(first, second, stacks):
        np.testing.assert_array_equal(a, values)
        np.testing.assert_array_equal(b, values)


@pytest.mark.parametrize("shuffle", [False, True, "global"])
def test_a_damaged_stack_fails_the_read_or_is_skipped_and_counted(tmp_path, shuffle):
    stacks = [(_stack(i, 3), _dates(3), i % 2) for i in range(6)]
    data = _write_dataset(tmp_path / "ds", stacks)
    shard = next((tmp_path / "ds").glob("*.tfrecord"))
    offsets = [tuple(map(int, line.split())) for line in
               (tmp_path / "ds" / schemas.index_filename(shard.name)).read_text().splitlines()]
    offset, length = offsets[2]
    damaged = bytearray(shard.read_bytes())
    damaged[offset + length // 2] ^= 0xFF  # a byte of loc_2's stack: its CRC no longer holds
    shard.write_bytes(bytes(damaged))
    kwargs = dict(batch_size=None, dtype=None, shuffle=shuffle, seed=2, extra_features=("filename",))
    # TensorFlow's reader fails on the bad CRC; the global shuffle's reads by offset name the record.
    with pytest.raises((tf.errors.DataLossError, tf.errors.InvalidArgumentError), match="(?i)corrupt|damaged"):
        list(readers.time_series_dataset_from_tfrecords(data, **kwargs))
    for budget in (dict(max_bad_records=1), dict(on_corrupt="skip")):
        ds = readers.time_series_dataset_from_tfrecords(data, **budget, **kwargs)
        got = _by_name(ds)
        assert sorted(n for n, _ in got) == [f"loc_{i}" for i in (0, 1, 3, 4, 5)]
        for name, values in got:
            np.testing.assert_array_equal(values, stacks[int(name[4:])][0])
        assert int(ds.corrupt_records) == 1
    batches = list(readers.time_series_dataset_from_tfrecords(data, batch_size=4, on_corrupt="skip",
                                                              shuffle=shuffle, seed=2))
    assert sum(int(s.shape[0]) for s, _ in batches) == 5
