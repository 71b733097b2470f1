"""conversion.finalize: a conversion's last step, without Beam. Run again on the shard results of a
real conversion it writes the same manifest and TFDS files, byte for byte; inputs that do not
reconcile, or too many rejects, leave no manifest."""

from __future__ import annotations

import json

import pytest
from helpers import convert, make_class_tree

import schemas
from conversion.elements import ConversionError, Reject, ShardResult
from conversion.finalize import Finalizer


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("finalize")
    written = make_class_tree(root / "in", per_class=4)
    manifest = convert(root / "in", root / "out", "--split", "train=0.5,test=0.5", "--num_shards", "2")
    return root / "out", manifest, written


def _results(manifest) -> list[ShardResult]:
    """The shard writers' results, as the manifest records them."""
    return [
        ShardResult(split, index, len(info.shards), s.file, s.num_records, s.num_bytes, s.sha256,
                    tuple(s.class_counts), s.index_file, s.index_sha256, s.num_records,
                    images=s.images.to_json() if s.images else None)
        for split, info in manifest.splits.items() for index, s in enumerate(info.shards)
    ]


def _finalizer(out, manifest, **overrides) -> Finalizer:
    args = dict(
        output_dir=str(out), class_names=manifest.class_names,
        # In the plan's order (that of --split), which TFDS's split list keeps.
        shard_counts={split: len(manifest.splits[split].shards) for split in ("train", "test")},
        num_found=manifest.counts["found"], options=manifest.options, max_reject_fraction=0.1,
        features=manifest.features, extra=manifest.extra,
    )
    return Finalizer(**{**args, **overrides})


def _copy(out, to):
    to.mkdir()
    for path in out.iterdir():
        if path.is_file():
            (to / path.name).write_bytes(path.read_bytes())
    return to


def test_the_same_results_give_the_same_metadata_bytes(dataset, tmp_path):
    out, manifest, written = dataset
    assert manifest.counts["found"] == len(written) and not manifest.normalized
    again = _copy(out, tmp_path / "again")
    (again / schemas.MANIFEST_FILENAME).unlink()
    got = _finalizer(again, manifest).finish(_results(manifest), rejects=[], normalized=[])
    assert got.splits == manifest.splits
    names = sorted(p.name for p in out.iterdir() if p.is_file())
    assert sorted(p.name for p in again.iterdir() if p.is_file()) == names
    for name in names:
        if name == schemas.MANIFEST_FILENAME:  # Its tool version is the same; nothing else may differ.
            assert json.loads((again / name).read_text()) == json.loads((out / name).read_text())
        else:
            assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_too_many_rejects_leave_no_manifest(dataset, tmp_path):
    out, manifest, written = dataset
    again = _copy(out, tmp_path / "rejects")
    (again / schemas.MANIFEST_FILENAME).unlink()
    rejects = [Reject(f"bad_{i}.jpg", "not_an_image", "not an image") for i in range(3)]
    finalizer = _finalizer(again, manifest, num_found=len(written) + 3)
    with pytest.raises(ConversionError, match="max_reject_fraction"):
        finalizer.finish(_results(manifest), rejects=rejects, normalized=[])
    assert not (again / schemas.MANIFEST_FILENAME).exists()
    # The rejects list is written first, so the user sees why.
    assert len((again / schemas.REJECTS_FILENAME).read_text().splitlines()) == 3


def test_inputs_that_do_not_reconcile_are_an_error(dataset, tmp_path):
    out, manifest, written = dataset
    again = _copy(out, tmp_path / "lost")
    with pytest.raises(RuntimeError, match="do not reconcile"):
        _finalizer(again, manifest, num_found=len(written) + 1).finish(
            _results(manifest), rejects=[], normalized=[])
