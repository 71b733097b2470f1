"""The start of a shuffled pass: shard heads first, so the first batch need not wait
for the record shuffle buffer (`readers.dataset._ramped_epoch`)."""

import pytest

from readers import image_dataset_from_tfrecords
from readers.dataset import _RAMP_PARSE_AHEAD, _RAMP_RECORDS, _ramp_head
from schemas import FILENAME

from tests import _reader_data as rd

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
