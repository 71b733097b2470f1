"""The start of a shuffled pass: shard heads first, so the first batch need not wait
for the record shuffle buffer (`readers.dataset._ramped_epoch`)."""

import pytest

from readers import dataset, image_dataset_from_tfrecords
from readers.dataset import _RAMP_PARSE_AHEAD, _RAMP_RECORDS, _RAMP_WINDOW, _ramp_head, _ramp_window
from schemas import FILENAME

import _reader_data as rd

NAMES = (FILENAME.key,)
_SHARDS = 4
_RECORDS = 400  # A default buffer of 400 records, more than the 256 of the heads.
_HEAD = -(-(_RAMP_RECORDS + _RAMP_PARSE_AHEAD) // _SHARDS)


@pytest.fixture(scope="module")
def larger(tmp_path_factory):
    """400 tiny records over 4 shards: record i is number i // 4 of shard i % 4."""
    return rd.write_dataset(
        tmp_path_factory.mktemp("larger"), splits={"train": _RECORDS}, num_shards=_SHARDS,
        sizes=((6, 5),), kinds=("rgb_jpeg", "rgb_png"),
    )


def _passes(ds, n):
    out = []
    for _ in range(n):
        names = []
        for _, _, extras in ds:
            names.extend(v.decode() for v in extras[FILENAME.key].numpy())
        out.append(names)
    return out


def _heads(written):
    """File names of the first `_HEAD` records of every shard."""
    return {s.filename for i, s in enumerate(written.sources["train"]) if i // _SHARDS < _HEAD}


def test_the_heads_shuffle_holds_one_batch_not_every_head(larger):
    # The first batch waits for `window + batch - 1` records, not every head (issue 40's
    # thirteenth pass): the heads' buffer is one batch and at least `_RAMP_WINDOW` records.
    assert _ramp_window(32, 8, 64) == 64 == _RAMP_WINDOW
    assert _ramp_window(80, 8, 256) == 256
    assert _ramp_window(32, 8, None) == 64
    assert _ramp_window(4, 8, 64) == 32                # never more than the heads
    import tensorflow as tf

    ds = image_dataset_from_tfrecords(larger.data_dir, batch_size=8, image_size=(4, 4), seed=3)
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    consts = {n.name: n for n in graph.node if n.op == "Const"}
    buffers = sorted(int(tf.make_ndarray(consts[n.input[1].split(":")[0]].attr["value"].tensor))
                     for n in graph.node if n.op.startswith("ShuffleDataset") and n.input[1].split(":")[0] in consts)
    # The files' (4, once per interleave), the heads' (one batch of 8: at least 64), the
    # rest's (the default 400). Main before: the heads' held all 256.
    assert set(buffers[:-2]) == {_SHARDS} and buffers[-2:] == [_RAMP_WINDOW, _RECORDS], buffers
    # The first batch still comes from the heads of every shard.
    (names,) = _passes(image_dataset_from_tfrecords(
        larger.data_dir, batch_size=8, image_size=(4, 4), seed=3, extra_features=NAMES), 1)
    position = {s.filename: i for i, s in enumerate(larger.sources["train"])}
    assert all(position[n] // _SHARDS < 2 * _RAMP_WINDOW // _SHARDS for n in names[:8]), names[:8]


def test_ramp_head_sizes():
    # 128 records (or two batches), and the parse stage's read-ahead of two
    # parse batches: the first batch is decoded before the rest's buffer fills.
    assert _ramp_head(1024, 8, 64) == 32          # 128 + 128 records from 8 shards
    assert _ramp_head(2048, 8, 256) == 80         # two batches of 256, + 128
    assert _ramp_head(1024, 3, None) == 86        # rounded up
    assert _ramp_head(256, 8, 32) == 0            # heads would fill the buffer anyway
    assert _ramp_head(0, 8, 32) == 0              # not shuffled


def test_each_pass_starts_with_the_shard_heads_shuffled(larger):
    ds = image_dataset_from_tfrecords(
        larger.data_dir, batch_size=8, image_size=(4, 4), seed=3, extra_features=NAMES,
    )
    every = sorted(larger.by_filename())
    heads = _heads(larger)
    assert len(heads) == _HEAD * _SHARDS < _RECORDS
    passes = _passes(ds, 3)
    for names in passes:
        assert sorted(names) == every  # each record exactly once
        assert set(names[:len(heads)]) == heads
    # The heads are shuffled, not read in interleave order, and reshuffled per pass.
    position = {s.filename: i for i, s in enumerate(larger.sources["train"])}
    assert any(position[a] > position[b] for a, b in zip(passes[0], passes[0][1:len(heads)]))
    assert len({tuple(p) for p in passes}) == 3


def test_ramp_keeps_seeded_runs_identical(larger):
    def build(seed, **kw):
        return image_dataset_from_tfrecords(
            larger.data_dir, batch_size=8, image_size=(4, 4), seed=seed, extra_features=NAMES,
            **kw,
        )

    first = _passes(build(7), 2)
    assert _passes(build(7), 2) == first
    assert _passes(build(8), 1)[0] != first[0]
    # Repeated: every epoch starts with the heads, reshuffled (the first as a single
    # pass does), every epoch holds every record, and a seeded run repeats exactly.
    def repeated(seed):
        names = []
        for _, _, extras in build(seed, repeat=True).take(2 * _RECORDS // 8):
            names.extend(v.decode() for v in extras[FILENAME.key].numpy())
        return names

    names = repeated(7)
    assert names[:_RECORDS] == first[0]
    assert sorted(names[:_RECORDS]) == sorted(names[_RECORDS:]) == sorted(larger.by_filename())
    heads = _heads(larger)
    assert set(names[_RECORDS:_RECORDS + len(heads)]) == heads
    assert names[_RECORDS:_RECORDS + len(heads)] != names[:len(heads)]
    assert repeated(7) == names
    assert repeated(8)[_RECORDS:] != names[_RECORDS:]


def test_small_buffers_read_as_before(larger):
    # With a buffer no larger than the heads there is no ramp: records of one
    # shard keep their file order with a one-record buffer.
    ds = image_dataset_from_tfrecords(
        larger.data_dir, batch_size=8, image_size=(4, 4), seed=1, shuffle_buffer=1,
        extra_features=NAMES,
    )
    position = {s.filename: i for i, s in enumerate(larger.sources["train"])}
    (names,) = _passes(ds, 1)
    for shard in range(_SHARDS):
        in_shard = [position[n] for n in names if position[n] % _SHARDS == shard]
        assert in_shard == sorted(in_shard)


def _functions(ds):
    """Names of the functions in the dataset's graph (what its iterator instantiates)."""
    import tensorflow as tf

    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    return [f.signature.name for f in graph.library.function]


def test_the_first_batch_waits_for_few_functions(larger, monkeypatch):
    # Each function of the pipeline is traced as it is built and instantiated (placed,
    # optimised) as its iterator starts, before the first batch. The ramp's heads and rest
    # share one read function (with the damaged-shard guard's tail), the decode has no
    # format cond, and photos are parsed in their decode function (no parse map, no
    # unbatch): read, guard tail, load. Main before issue 40's ninth pass: 7 (two reads,
    # the per-shard `tf.function`, `normalize`, two cond branches); before its thirteenth,
    # 4 (a batched parse map). Photos' path (per image), as records of over 32 KiB take.
    monkeypatch.setattr(dataset, "_BATCHED_DECODE_MAX_RECORD_BYTES", 0)
    ds = image_dataset_from_tfrecords(larger.data_dir, batch_size=8, image_size=(4, 4), repeat=True)
    names = _functions(ds)
    assert len(names) == 3, names
    assert sum("interleave" in n for n in names) == 1, names
    assert not any("parse" in n for n in names), names
    assert not any("normalize" in n or n.startswith("cond_") for n in names), names


def test_the_shard_heads_are_read_in_parallel_by_the_shared_function(larger):
    # The heads' shuffle holds every head record before its first one: they are read by a
    # deterministic parallel interleave (`_HEAD_READERS` threads), the rest sequentially, both
    # through the one read function. Main before issue 40's eleventh pass: two sequential ones.
    import tensorflow as tf

    ds = image_dataset_from_tfrecords(larger.data_dir, batch_size=8, image_size=(4, 4), repeat=True)
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    reads = {n.op: n for n in graph.node if n.op in ("ParallelInterleaveDatasetV4", "InterleaveDataset")}
    assert sorted(reads) == ["InterleaveDataset", "ParallelInterleaveDatasetV4"], [n.op for n in graph.node]
    heads = reads["ParallelInterleaveDatasetV4"]
    assert heads.attr["deterministic"].s == b"true"
    assert heads.attr["f"].func.name == reads["InterleaveDataset"].attr["f"].func.name
    # Not for a pass without the ramp (no shuffle): one sequential interleave.
    unshuffled = image_dataset_from_tfrecords(larger.data_dir, batch_size=8, image_size=(4, 4), shuffle=False)
    graph.ParseFromString(unshuffled._as_serialized_graph().numpy())
    assert not any(n.op == "ParallelInterleaveDatasetV4" for n in graph.node)


def test_seeded_order_is_pinned(larger):
    # The seeded order, pinned: the same seed gives the same records in the same order,
    # repeated epochs too. The order of main at f617f97 (before issue 40's ninth pass) until
    # its thirteenth, whose heads' shuffle holds one batch, not every head (shuffled digests
    # a3fe024669c06b71 and 1248d9de49381ea8 before; the unshuffled order is unchanged).
    import hashlib

    def digest(names):
        return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]

    (once,) = _passes(image_dataset_from_tfrecords(
        larger.data_dir, batch_size=8, image_size=(4, 4), seed=7, extra_features=NAMES), 1)
    assert digest(once) == "6818054c51832685"
    ds = image_dataset_from_tfrecords(larger.data_dir, batch_size=8, image_size=(4, 4), seed=7,
                                      extra_features=NAMES, repeat=True).take(120)
    repeated = [v.decode() for *_, extras in ds for v in extras[FILENAME.key].numpy()]
    assert len(repeated) == 960 and digest(repeated) == "2198ee1ccfe9fdfe"
    (unshuffled,) = _passes(image_dataset_from_tfrecords(
        larger.data_dir, batch_size=8, image_size=(4, 4), seed=7, shuffle=False, extra_features=NAMES), 1)
    assert digest(unshuffled) == "cd2b6fdd33a05263"
