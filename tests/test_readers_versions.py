"""Reading a dataset that grew (`convert --append`): every version exactly, verify, TFDS (issue 38).

The dataset is converted, read (order under the global shuffle, a resume position), grown by an
append that adds a class, and read again: `version=1` gives back exactly what was read before.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from helpers import convert, encode, make_class_tree, pixels, write  # noqa: E402

import readers  # noqa: E402
from readers import ReadPosition  # noqa: E402

SPLIT = ("--split", "train=0.7,validation=0.3", "--min_shards", "2")
SMALL = {"image_size": (8, 8), "extra_features": ("filename",), "deterministic": True}



def _read(data_dir, **kwargs):
    ds = readers.image_dataset_from_tfrecords(data_dir, batch_size=4, **SMALL, **kwargs)
    out = []
    for images, labels, extra in ds:
        out += [(n.decode(), int(label)) for n, label in zip(extra["filename"].numpy(), labels.numpy())]
    return out


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    root = tmp_path_factory.mktemp("versions")
    inp, out = root / "in", root / "out"
    make_class_tree(inp, classes=("cat", "dog"), per_class=8)
    convert(inp, out, *SPLIT)
    before = {
        "latest": _read(out, shuffle=False),
        "global": _read(out, shuffle="global", seed=5),
        "resumed": _read(out, shuffle="global", seed=5, start=ReadPosition(0, 6)),
        "cardinality": int(readers.image_dataset_from_tfrecords(out, batch_size=None, shuffle=False, **SMALL)
                           .cardinality()),
    }
    for i in range(6):
        write(inp / "ant" / f"a_{i}.jpg", encode(pixels(400 + i), "JPEG", quality=90))
        write(inp / "dog" / f"d_{i}.jpg", encode(pixels(500 + i), "JPEG", quality=90))
    convert(inp, out, *SPLIT, "--append")
    return out, before


def test_version_1_reads_exactly_what_was_read_before_the_append(grown):
    out, before = grown
    assert _read(out, shuffle=False, version=1) == before["latest"]
    assert _read(out, shuffle="global", seed=5, version=1) == before["global"]
    # A resume position taken on version 1 stays valid while reading version 1.
    assert _read(out, shuffle="global", seed=5, start=ReadPosition(0, 6), version=1) == before["resumed"]
    assert before["resumed"] == before["global"][6:]
    assert int(readers.image_dataset_from_tfrecords(out, batch_size=None, shuffle=False, version=1, **SMALL)
               .cardinality()) == before["cardinality"]


def test_the_latest_version_reads_every_record_with_the_grown_classes(grown):
    out, before = grown
    latest = _read(out, shuffle=False)
    assert latest == _read(out, shuffle=False, version=2)
    new = {(n, label) for n, label in latest} - set(before["latest"])
    train_new = [n for n, _ in new]
    assert set(before["latest"]) <= set(latest)
    assert all(n.startswith(("ant/", "dog/d_")) for n in train_new)
    manifest = readers.load_manifest(out)
    assert manifest.class_names == ("cat", "dog", "ant")
    assert {label for n, label in new if n.startswith("ant/")} == {2}
    assert int(readers.image_dataset_from_tfrecords(out, batch_size=None, shuffle=False, **SMALL)
               .cardinality()) == len(latest)
    everything = _read(out, shuffle="global", seed=5)
    assert sorted(everything) == sorted(latest)
    with pytest.raises(ValueError, match="version"):
        readers.image_dataset_from_tfrecords(out, version=3)


def test_index_files_of_every_version_locate_their_records(grown):
    from schemas.tfrecord import check_frame

    out, _ = grown
    manifest = readers.load_manifest(out)
    for info in manifest.splits.values():
        for shard in info.shards:
            data = (out / shard.file).read_bytes()
            lines = (out / shard.index_file).read_text().split()
            entries = list(zip(map(int, lines[::2]), map(int, lines[1::2])))
            assert len(entries) == shard.num_records
            assert all(check_frame(data[o:o + n]) is None for o, n in entries)


def test_verify_checks_every_version_and_says_which_shard_each_wrote(grown):
    from beam_jobs import verify

    out, _ = grown
    report = verify.run([str(out)])
    manifest = readers.load_manifest(out)
    assert report["ok"], report["problems"]
    assert [v["version"] for v in report["versions"]] == [1, 2]
    for v, info in zip(report["versions"], manifest.versions):
        assert v["shards"] == {s: list(f) for s, f in info.shards.items()}
        assert v["records"] == sum(info.num_records.values())
    assert "Versions (convert --append): 1 (" in verify.describe(report)


def test_tfds_reads_every_version_of_a_grown_dataset(grown):
    tfds = pytest.importorskip("tensorflow_datasets")
    out, _ = grown
    manifest = readers.load_manifest(out)
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["label"].names == list(manifest.class_names)
    for split, info in manifest.splits.items():
        parts = "+".join([split, *(f"{split}_v{v.version:05d}" for v in manifest.versions[1:]
                                   if v.num_records.get(split))])
        got = sorted(ex["filename"].decode() for ex in tfds.as_numpy(builder.as_dataset(split=parts)))
        ours = sorted(n for n, _ in _read(out, split=split, shuffle=False))
        assert got == ours and len(got) == info.num_records
        labels = {ex["filename"].decode(): int(ex["label"]) for ex in tfds.as_numpy(builder.as_dataset(split=parts))}
        assert all(labels[n] == label for n, label in _read(out, split=split, shuffle=False))
    assert "split='train+train_v00002'" in builder.info.description
    np.testing.assert_equal(len(builder.info.splits), sum(1 for v in manifest.versions
                                                          for n in v.num_records.values() if n))
