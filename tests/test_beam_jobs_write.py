"""--worker_threads and --worker_processes: how shards are written changes speed, never the output."""

from __future__ import annotations

import pathlib
import threading

import pytest
from helpers import convert, encode, make_class_tree, pixels, write

import schemas
from imaging import ValidationOptions
from conversion import shard_writer
from conversion.shard_maker import ShardMaker, ShardSpec
from conversion.options import WritingOptions
from beam_jobs import convert as convert_module
from conversion import plan as _plan

# Enough files per shard (> the 8 read ahead) for the pool to finish out of order;
# groups of 4 files (validated together) so that each shard has several groups.
_ARGS = ("--split", "train=0.7,validation=0.3", "--num_shards", "2", "--seed", "3",
         "--max_reject_fraction", "0.5")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A class tree with a reject and an image that gets normalised."""
    root = tmp_path_factory.mktemp("threads") / "images"
    make_class_tree(root, per_class=14)
    write(root / "cat" / "truncated.jpg", encode(pixels(1), "JPEG")[:200])
    write(root / "fish" / "alpha.png", encode(pixels(2, mode="RGBA"), "PNG"))
    return root


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def default_output(images, tmp_path_factory):
    out = tmp_path_factory.mktemp("threads_default") / "out"
    convert(images, out, *_ARGS)
    return _files(out)


# The default output is written with groups of 64 files: groups of 4 give
# the same bytes.
@pytest.mark.parametrize("threads", [1, 3])
def test_output_is_byte_identical_to_the_default(images, default_output, tmp_path, monkeypatch, threads):
    names = set()
    validate = shard_writer._Writer._validate_group

    def recording_validate(self, group):
        names.add(threading.current_thread().name)
        return validate(self, group)

    monkeypatch.setattr(shard_writer._Writer, "_validate_group", recording_validate)
    monkeypatch.setattr(shard_writer, "_GROUP_FILES", 4)
    out = tmp_path / "out"
    # In the runner's threads (as by default for so few files): the patches apply there.
    manifest = convert(images, out, *_ARGS, "--worker_threads", threads, "--worker_processes", 0)

    assert manifest.counts["rejected"] == 1 and manifest.normalized == {"flatten_alpha": 1}
    assert sum(len(s.shards) for s in manifest.splits.values()) == 4
    mine = _files(out)
    assert sorted(mine) == sorted(default_output)
    assert [name for name in mine if mine[name] != default_output[name]] == []
    # Each shard writer's pool had `threads` threads at most (the runner's
    # threads may run several shard writers, each with a pool of its own).
    assert names and names <= {f"shardsmith-read_{i}" for i in range(threads)}


def test_not_part_of_the_resume_fingerprint():
    files = [_plan.PlannedFile("train", 0, 0, "a/0.jpg", "/x/a/0.jpg", 1, 0, 1)]

    def fingerprint(threads):
        maker = ShardMaker(ShardSpec("/tmp/x", ValidationOptions(max_pixels=10, background=(0, 0, 0)),
                                     WritingOptions(worker_threads=threads), num_classes=2, total_shards=1))
        return maker.shard("train", 0, files).fingerprint

    assert fingerprint(1) == fingerprint(3) == fingerprint(None)


def test_config_and_manifest_options():
    config = convert_module.config_from_options(convert_module.ConvertOptions(
        ["--input_dir", "in", "--output_dir", "out", "--worker_threads", "2"]))
    assert config.writing.worker_threads == 2
    default = convert_module.ConversionConfig(input_dir="in", output_dir="out")
    assert default.writing.worker_threads is None
    # It does not shape the output, so the manifest does not record it.
    assert config.manifest_options("folders") == default.manifest_options("folders")


@pytest.mark.parametrize("value", ["0", "-1"])
def test_fewer_than_one_thread_is_one_clear_sentence(tmp_path, capsys, value):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a",), per_class=1)
    code = convert_module.main(["--input_dir", str(root), "--output_dir", str(tmp_path / "o"),
                                "--worker_threads", value])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == f"shardsmith convert: error: --worker_threads must be at least 1. Received: {value}"
    assert not (tmp_path / "o").exists()
