"""`shardsmith preview`: the contact sheet shows the reader's pixels, class by class."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import readers
import schemas
from shardsmith import cli
from helpers import convert, make_class_tree
from shardsmith import preview

_CLASSES = ("cat", "dog", "fish", "owl")
_SIZE = 32


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """train: 4 classes x 6 images in 2 shards; validation: 2 images of 3 classes, no owl."""
    root = tmp_path_factory.mktemp("images")
    train = make_class_tree(root / "train", _CLASSES, per_class=6)
    validation = make_class_tree(root / "validation", _CLASSES[:3], per_class=2, seed=1)
    sources = {f"train/{rel}": c for rel, c in train.items()}
    sources.update({f"validation/{rel}": c for rel, c in validation.items()})
    out = tmp_path_factory.mktemp("dataset")
    manifest = convert(root, out, "--overwrite", "--num_shards", "2")
    assert manifest.class_names == _CLASSES
    return out, sources, manifest


def _sheet(out, split="train", **kwargs):
    options = dict(per_class=3, image_size=_SIZE, seed=0, max_classes=20, max_records=5000,
                   resize="stretch")
    options.update(kwargs)
    return preview._build_sheet(out, split, **options)


def _reader_images(out, split, resize="stretch"):
    ds = readers.image_dataset_from_tfrecords(
        out, split, batch_size=None, image_size=(_SIZE, _SIZE), shuffle=False, dtype="uint8",
        resize=resize, extra_features=(schemas.FILENAME.key,),
    )
    return {
        extras[schemas.FILENAME.key].numpy().decode(): (image.numpy(), int(label))
        for image, label, extras in ds
    }


def _tile(sheet, row, column):
    x, y = sheet.layout.tile_origin(row, column)
    return np.asarray(sheet.image)[y:y + _SIZE, x:x + _SIZE]


@pytest.mark.parametrize("resize", ["stretch", "pad"])
def test_tiles_are_the_readers_pixels_in_label_order(dataset, resize):
    out, sources, _ = dataset
    sheet = _sheet(out, resize=resize)
    by_reader = _reader_images(out, "train", resize)

    assert sheet.image.mode == "RGB" and sheet.image.size == sheet.layout.size
    assert [label for label, _ in sheet.rows] == [0, 1, 2, 3]
    for row, (label, filenames) in enumerate(sheet.rows):
        assert len(filenames) == 3
        for column, name in enumerate(filenames):
            pixels, reader_label = by_reader[name]
            assert reader_label == label and sources[name] == _CLASSES[label]
            np.testing.assert_array_equal(_tile(sheet, row, column), pixels)
        # The class name is written left of the row.
        x, y = sheet.layout.tile_origin(row, 0)
        assert np.asarray(sheet.image)[y:y + _SIZE, :x].min() < 128


def test_same_seed_same_sheet_another_seed_other_images(dataset):
    out, _, _ = dataset
    first, again = _sheet(out, per_class=2), _sheet(out, per_class=2)
    assert first.image.tobytes() == again.image.tobytes()
    assert first.rows == again.rows
    assert _sheet(out, per_class=2, seed=1).rows != first.rows


def test_missing_images_leave_blank_tiles(dataset):
    out, _, manifest = dataset
    sheet = _sheet(out, "validation", per_class=4)
    assert [len(names) for _, names in sheet.rows] == [2, 2, 2, 0]
    blank = np.array(preview._BLANK, np.uint8)
    for row in range(3):
        assert (_tile(sheet, row, 3) == blank).all()
    # owl: none in this split; its grey tiles say so (the text runs across them).
    owl = [_tile(sheet, 3, column) for column in range(4)]
    assert all((tile[:8] == blank).all() for tile in owl)
    assert min(tile.min() for tile in owl) < 200
    assert manifest.splits["validation"].class_counts[3] == 0


def test_max_classes_and_max_records_are_reported(dataset):
    out, _, _ = dataset
    few = _sheet(out, max_classes=2)
    assert few.layout.rows == 2 and [label for label, _ in few.rows] == [0, 1]
    assert any("2 more classes not shown" in note for note in few.notes)

    capped = _sheet(out, per_class=6, max_records=5)
    assert capped.scanned == 5
    assert sum(len(names) for _, names in capped.rows) == 5
    assert any("not (fully) found within the first 5 records" in n for n in capped.notes)


def test_scan_stops_once_every_class_has_its_pool(dataset):
    out, _, manifest = dataset
    sheet = _sheet(out, per_class=1)  # A pool of 4 per class: 16 of 24 records suffice.
    assert 16 <= sheet.scanned < manifest.splits["train"].num_records
    assert not any("not (fully) found" in note for note in sheet.notes)


def test_count_chart_bars_follow_the_manifest(dataset):
    out, _, manifest = dataset
    chart = np.asarray(preview.count_chart(out))
    layout = preview._chart_layout(manifest)
    assert chart.shape == (layout.size[1], layout.size[0], 3)
    bar = np.array(preview._BAR, np.uint8)
    for p, info in enumerate(manifest.splits.values()):
        counts = info.class_counts
        for i, n in enumerate(counts):
            x0, y = layout.bar_origin(p, i)
            row = chart[y]
            is_bar = (row == bar).all(axis=-1)
            length = int(is_bar[x0:x0 + layout.bar_width + 1].sum())
            assert length == (max(1, round(layout.bar_width * n / max(counts))) if n else 0)


def test_main_writes_sheet_and_chart(dataset, tmp_path, capsys):
    out, _, manifest = dataset
    target = tmp_path / "new" / "sheet.png"
    code = cli.main(["preview", str(out), "--split", "validation", "--output", str(target),
                     "--per_class", "2", "--image_size", str(_SIZE), "--seed", "3"])
    assert code == 0
    counts = tmp_path / "new" / "sheet_counts.png"
    assert capsys.readouterr().out.split() == [str(target), str(counts)]
    with Image.open(target) as im:
        assert im.format == "PNG" and im.mode == "RGB"
        sheet = _sheet(out, "validation", per_class=2, seed=3)
        assert im.size == sheet.layout.size
        assert im.tobytes() == sheet.image.tobytes()
    with Image.open(counts) as im:
        assert im.format == "PNG" and im.size == preview._chart_layout(manifest).size


@pytest.mark.parametrize(
    "args, message",
    [
        (["--split", "nope"], "'nope'"),
        (["--per_class", "0"], "per_class"),
        (["--image_size", "8"], "image_size"),
        (["--seed", "-1"], "seed"),
    ],
)
def test_bad_arguments_give_one_line_errors(dataset, tmp_path, capsys, args, message):
    out, _, _ = dataset
    code = preview.main([str(out), "--output", str(tmp_path / "p.png"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("shardsmith preview: error: ") and err.count("\n") == 1
    assert message in err
    assert not (tmp_path / "p.png").exists()


def test_folder_without_manifest_is_an_error(tmp_path, capsys):
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    assert preview.main([str(tmp_path), "--output", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardsmith preview: error: ") and err.count("\n") == 1
    assert schemas.MANIFEST_FILENAME in err


def test_help_lists_the_options(capsys):
    assert cli.main(["preview", "--help"]) == 0
    text = capsys.readouterr().out
    for option in ("--split", "--output", "--per_class", "--image_size", "--seed", "--max_classes",
                   "--max_records", "--resize"):
        assert option in text
    # --resize's choices, spelled in preview (whose import leaves TensorFlow out): the reader's.
    assert "{" + ",".join(readers.preprocess.RESIZE_POLICIES) + "}" in text
