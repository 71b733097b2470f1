"""Tests of readers.metadata: finding the manifest, the schema and the shards."""

import json

import pytest
import tensorflow as tf

from readers import image_dataset_from_tfrecords, load_manifest
from readers.metadata import load_split
import schemas
from schemas import MANIFEST_FILENAME, SCHEMA_VERSION, ManifestError, shard_filename

import _reader_data as rd


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return rd.write_dataset(
        tmp_path_factory.mktemp("meta"),
        splits={"train": 7, "validation": 2},
        num_shards={"train": 3, "validation": 4},
    )


def test_load_manifest_reads_what_was_written(written):
    manifest = load_manifest(written.data_dir)
    assert manifest.class_names == written.class_names
    assert manifest.split("train").num_records == len(written.sources["train"])
    assert manifest.split("validation").num_records == len(written.sources["validation"])


def test_load_split_lists_manifest_shards_in_order(written):
    files = load_split(str(written.data_dir), "train")
    assert [tf.io.gfile.join(str(written.data_dir), p.name) for p in written.shard_paths["train"]] == list(files.paths)
    expected = [sum(1 for s in written.sources["train"] if s.shard == i) for i in range(3)]
    assert list(files.num_records) == expected
    assert files.total_records == len(written.sources["train"])
    assert files.class_names == written.class_names


def test_empty_shards_are_left_out(written):
    # 2 validation records over 4 shards: shards 2 and 3 are empty.
    files = load_split(written.data_dir, "validation")
    assert [p.rsplit("/", 1)[-1] for p in files.paths] == [
        shard_filename("validation", i, 4) for i in (0, 1)
    ]
    assert files.total_records == 2


def test_stale_shard_files_are_never_listed(tmp_path):
    w = rd.write_dataset(tmp_path, splits={"train": 4}, num_shards=2)
    # Leftovers of an earlier conversion into the same folder.
    stale = [shard_filename("train", 2, 3), shard_filename("train", 0, 1), "train-extra.tfrecord"]
    for name in stale:
        (w.data_dir / name).write_bytes(w.shard_paths["train"][0].read_bytes())
    files = load_split(w.data_dir, "train")
    names = {p.rsplit("/", 1)[-1] for p in files.paths}
    assert names == {p.name for p in w.shard_paths["train"]}
    assert not names & set(stale)


def test_missing_data_dir(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=r"`data_dir` does not exist.*nope"):
        load_manifest(missing)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        image_dataset_from_tfrecords(missing)


def test_folder_without_anything_is_not_a_dataset(tmp_path):
    (tmp_path / "cat.jpg").write_bytes(b"not really")
    with pytest.raises(
        FileNotFoundError,
        match=r"not a finished shardsmith dataset.*not the output folder.*--output_dir",
    ):
        image_dataset_from_tfrecords(tmp_path)


def test_unfinished_conversion_is_named(tmp_path):
    w = rd.write_dataset(tmp_path, write_manifest=False)
    with pytest.raises(
        FileNotFoundError,
        match=rf"not a finished shardsmith dataset.*3 shard file\(s\) but no {MANIFEST_FILENAME}"
        r".*did not finish.*Run the conversion again",
    ):
        load_manifest(w.data_dir)


def test_unknown_schema_version(tmp_path):
    w = rd.write_dataset(tmp_path, schema_version=SCHEMA_VERSION + 41)
    with pytest.raises(ManifestError, match=rf"schema_version={SCHEMA_VERSION + 41}.*reads"):
        image_dataset_from_tfrecords(w.data_dir)


def test_damaged_manifest(tmp_path):
    w = rd.write_dataset(tmp_path)
    path = w.data_dir / MANIFEST_FILENAME
    path.write_text(path.read_text()[:50])
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(w.data_dir)


def test_schema_mismatch(tmp_path):
    w = rd.write_dataset(tmp_path)
    path = w.data_dir / MANIFEST_FILENAME
    doc = json.loads(path.read_text())
    first_int = next(k for k, v in doc["features"].items() if v["dtype"] == "int64")
    doc["features"][first_int]["dtype"] = "bytes"
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=rf"schema.*does not match.*{first_int}"):
        load_split(w.data_dir, "train")


def test_missing_split_lists_the_splits(written):
    with pytest.raises(
        ManifestError,
        match=r"`split` must be one of .*\['train', 'validation'\].*Received: split='test'",
    ):
        image_dataset_from_tfrecords(written.data_dir, "test")


@pytest.mark.parametrize("alias", ["val", "valid", "Val", "validation"])
def test_the_converters_split_aliases_name_their_split(written, alias):
    files = load_split(written.data_dir, alias)
    assert files.split == "validation"
    assert files.total_records == len(written.sources["validation"])
    ds = image_dataset_from_tfrecords(written.data_dir, alias, batch_size=2, image_size=(4, 4))
    assert sum(int(labels.shape[0]) for _, labels in ds) == len(written.sources["validation"])


def test_an_alias_of_a_missing_split_is_refused_by_the_name_given(written):
    with pytest.raises(ManifestError, match=r"Received: split='testing'"):
        load_split(written.data_dir, "testing")


def test_the_reader_and_the_converter_share_one_alias_table():
    from conversion import plan
    from schemas import manifest

    assert plan.SPLIT_ALIASES is manifest.SPLIT_ALIASES
    assert set(manifest.SPLIT_ALIASES.values()) == set(manifest.SPLITS)


def test_split_must_be_a_string(written):
    with pytest.raises(TypeError, match=r"`split` must be a str.*Received: split=0"):
        load_split(written.data_dir, 0)


def test_data_dir_must_be_a_path():
    with pytest.raises(TypeError, match=r"`data_dir` must be a str or os.PathLike.*Received: data_dir=3"):
        load_manifest(3)


def test_missing_shard_file(tmp_path):
    w = rd.write_dataset(tmp_path)
    w.shard_paths["train"][1].unlink()
    with pytest.raises(FileNotFoundError, match=rf"missing.*{shard_filename('train', 1, 3)}"):
        image_dataset_from_tfrecords(w.data_dir)


def test_split_without_records(tmp_path):
    w = rd.write_dataset(tmp_path, splits={"train": 3, "test": 0}, num_shards=1)
    with pytest.raises(ValueError, match=r"Split 'test' .* has no records"):
        load_split(w.data_dir, "test")


def test_reads_through_tf_gfile(written):
    # The in-memory file system stands in for gs://: only tf.io.gfile reaches it.
    url = "ram://shardsmith-meta-test"
    tf.io.gfile.makedirs(url)
    for path in written.data_dir.iterdir():
        tf.io.gfile.copy(str(path), f"{url}/{path.name}", overwrite=True)
    files = load_split(url, "train")
    assert all(p.startswith(url + "/") for p in files.paths)
    ds = image_dataset_from_tfrecords(url, batch_size=3, image_size=(4, 4))
    assert sum(int(x.shape[0]) for x, _ in ds) == len(written.sources["train"])


def _grow(written, split="train"):
    """Rewrites the manifest of rd.write_dataset(3 shards, 3 classes) as two versions:
    version 1 held shards 0 and 1 (classes cat, dog), version 2 added shard 2 (eel)."""
    import dataclasses

    from schemas import Manifest, VersionInfo

    path = written.data_dir / MANIFEST_FILENAME
    manifest = Manifest.from_json(path.read_text())
    shards = manifest.split(split).shards
    assert [s.class_counts[2] for s in shards] == [0, 0, shards[2].num_records] and shards[2].num_records
    v1 = VersionInfo(1, {split: (shards[0].file, shards[1].file)},
                     {split: shards[0].num_records + shards[1].num_records},
                     {split: tuple(a + b for a, b in zip(shards[0].class_counts[:2],
                                                          shards[1].class_counts[:2]))},
                     2, "2026-12-01T00:00:00Z", dict(manifest.options))
    v2 = VersionInfo(2, {split: (shards[2].file,)}, {split: shards[2].num_records},
                     {split: tuple(shards[2].class_counts)}, 3, "2026-12-08T00:00:00Z",
                     dict(manifest.options))
    grown = dataclasses.replace(manifest, versions=(v1, v2), class_order="first_appearance")
    path.write_text(grown.to_json())
    return shards


def test_version_pins_what_each_version_of_a_grown_dataset_held(tmp_path):
    written = rd.write_dataset(tmp_path, splits={"train": 12}, num_shards=3)
    _grow(written)
    sources = written.sources["train"]
    old = sorted(s.filename for s in sources if s.shard in (0, 1))
    every = sorted(s.filename for s in sources)

    def names(ds):
        return sorted(f.decode() for batch in ds for f in batch[2][schemas.FILENAME.key].numpy())

    kw = dict(batch_size=4, image_size=(8, 8), shuffle=False,
              extra_features=(schemas.FILENAME.key,))
    first = image_dataset_from_tfrecords(written.data_dir, version=1, **kw)
    assert first.class_names == ["cat", "dog"]
    assert int(first.cardinality()) == len(old) // 4
    assert names(first) == old
    latest = image_dataset_from_tfrecords(written.data_dir, **kw)
    assert latest.class_names == ["cat", "dog", "eel"] and names(latest) == every
    assert names(image_dataset_from_tfrecords(written.data_dir, version=2, **kw)) == every
    assert load_manifest(written.data_dir, version=1).class_names == ("cat", "dog")
    assert load_split(written.data_dir, "train", version=1).total_records == len(old)
    with pytest.raises(ManifestError, match=r"received version=3"):
        image_dataset_from_tfrecords(written.data_dir, version=3, **kw)
    # A shuffled read of version 1 is a permutation of what version 1 held.
    shuffled = image_dataset_from_tfrecords(written.data_dir, version=1, **dict(
        kw, shuffle=True, seed=3))
    assert names(shuffled) == old


def test_distributed_builders_read_the_version_asked_for(tmp_path):
    from readers.distributed import distributed_dataset, make_dataset_fn

    written = rd.write_dataset(tmp_path, splits={"train": 12}, num_shards=3)
    _grow(written)
    old = sum(1 for s in written.sources["train"] if s.shard in (0, 1))
    kw = dict(global_batch_size=2, image_size=(8, 8), shuffle=False)
    fn = make_dataset_fn(written.data_dir, version=1, **kw)
    assert sum(int(tf.shape(b[1])[0]) for b in fn(tf.distribute.InputContext())) == old
    fn = make_dataset_fn(written.data_dir, **kw)
    assert sum(int(tf.shape(b[1])[0]) for b in fn(tf.distribute.InputContext())) == 12
    dist = distributed_dataset(tf.distribute.OneDeviceStrategy("/cpu:0"), written.data_dir,
                               version=1, **kw)
    assert dist.class_names == ["cat", "dog"]
    assert sum(int(tf.shape(b[1])[0]) for b in dist) == old
