"""`shardsmith preview` of datasets with targets: mask colours and box outlines on the reader's tiles."""

from __future__ import annotations

import numpy as np
import pytest
from _target_data import Box, TargetItem, photo, write_target_dataset
from PIL import Image

import readers
import schemas
from shardsmith import cli, preview

_IGNORE = 255


def _halves_mask(size) -> np.ndarray:
    """Id 1 on the left half, id 2 on the right, the ignore id on the top row."""
    h, w = size
    mask = np.ones((h, w), np.uint8)
    mask[:, w // 2:] = 2
    mask[0, :] = _IGNORE
    return mask


def _reader_images(out, size, resize):
    ds = readers.image_dataset_from_tfrecords(
        out, "train", batch_size=None, image_size=(size, size), shuffle=False, dtype="uint8",
        resize=resize, label_mode=None, extra_features=(schemas.FILENAME.key,),
    )
    return {extras[schemas.FILENAME.key].numpy().decode(): image.numpy() for image, extras in ds}


def _sheet(out, size, resize="stretch", per_class=3):
    return preview._build_sheet(out, "train", per_class=per_class, image_size=size, seed=0,
                                max_classes=20, max_records=5000, resize=resize)


def _tile(sheet, column, size):
    x, y = sheet.layout.tile_origin(0, column)
    return np.asarray(sheet.image)[y:y + size, x:x + size].astype(np.int64)


def _blend(pixels, mask_id):
    colour = np.array(preview.colour_of(mask_id), np.float64)
    return np.round(pixels * (1 - preview.MASK_ALPHA) + colour * preview.MASK_ALPHA)


@pytest.fixture(scope="module")
def masks(tmp_path_factory):
    """3 images of 32x32 with masks of ids 1 (left), 2 (right), 255 (top row); no classes."""
    items = [TargetItem(f"img_{i}.png", photo(i, (32, 32)), mask=_halves_mask((32, 32))) for i in range(3)]
    out = tmp_path_factory.mktemp("preview") / "masks"
    write_target_dataset(out, items, ("mask",))
    return out


def test_mask_ids_are_coloured_over_the_readers_pixels(masks):
    sheet = _sheet(masks, 32)
    by_reader = _reader_images(masks, 32, "stretch")
    # No image-level classes: one row of every image.
    assert len(sheet.rows) == 1 and sorted(sheet.rows[0][1]) == sorted(by_reader)
    for column, name in enumerate(sheet.rows[0][1]):
        tile, pixels = _tile(sheet, column, 32), by_reader[name].astype(np.int64)
        np.testing.assert_array_equal(tile[0], pixels[0])  # The ignore row: not coloured.
        np.testing.assert_allclose(tile[1:, :16], _blend(pixels[1:, :16], 1), atol=1)
        np.testing.assert_allclose(tile[1:, 16:], _blend(pixels[1:, 16:], 2), atol=1)
    # The legend under the grid shows a swatch of each id's colour.
    below = np.asarray(sheet.image)[sheet.layout.tile_origin(0, 0)[1] + 32 + 16:]
    for mask_id in (1, 2):
        assert (below == np.array(preview.colour_of(mask_id), np.uint8)).all(axis=-1).sum() >= 50
    assert not (below == np.array(preview.colour_of(_IGNORE), np.uint8)).all(axis=-1).any()


def test_masks_follow_the_readers_pad(tmp_path):
    # 32 high, 16 wide: 'pad' centres it in a 32x32 square, 8 columns of padding on each side.
    items = [TargetItem("tall.png", photo(7, (32, 16)), mask=np.full((32, 16), 3, np.uint8))]
    out = tmp_path / "tall"
    write_target_dataset(out, items, ("mask",), num_shards=1)
    sheet = _sheet(out, 32, resize="pad", per_class=1)
    pixels = _reader_images(out, 32, "pad")["tall.png"].astype(np.int64)
    tile = _tile(sheet, 0, 32)
    np.testing.assert_array_equal(tile[:, :8], pixels[:, :8])
    np.testing.assert_array_equal(tile[:, 24:], pixels[:, 24:])
    np.testing.assert_allclose(tile[:, 8:24], _blend(pixels[:, 8:24], 3), atol=1)


def test_boxes_are_outlined_where_they_are(tmp_path):
    # A box over the middle half of a 64x64 image: tile pixels 16..47 at image_size 64.
    items = [TargetItem("img.png", photo(3, (64, 64)), boxes=(Box(0.25, 0.25, 0.75, 0.75, 1),))]
    out = tmp_path / "boxes"
    section = {"boxes": {"format": "voc", "source": "ann", "class_names": ["car", "person"],
                         "category_ids": None, "counts": {"train": [0, 1]},
                         "images_without_boxes": {"train": 0}, "issues": {}}}
    write_target_dataset(out, items, ("boxes",), section=section, num_shards=1)
    sheet = _sheet(out, 64, per_class=1)
    pixels = _reader_images(out, 64, "stretch")["img.png"].astype(np.int64)
    tile = _tile(sheet, 0, 64)
    colour = np.array(preview.colour_of(1))
    # The left and right edges below the name tag, the bottom edge: the box colour.
    assert (tile[32:48, 16] == colour).all() and (tile[32:48, 47] == colour).all()
    assert (tile[47, 16:48] == colour).all() and (tile[16, 40:48] == colour).all()
    # Inside (below the name tag) and outside: the reader's pixels.
    np.testing.assert_array_equal(tile[34:46, 30:46], pixels[34:46, 30:46])
    np.testing.assert_array_equal(tile[:15], pixels[:15])
    np.testing.assert_array_equal(tile[49:], pixels[49:])
    # The class name is written in the tag: dark text pixels on the box colour.
    tag = tile[17:30, 17:47]
    assert (tag == colour).all(axis=-1).sum() > 50 and (tag.sum(axis=-1) < 150).sum() > 5


def test_main_writes_the_sheet_of_a_dataset_with_targets(masks, tmp_path, capsys):
    target = tmp_path / "sheet.png"
    assert cli.main(["preview", str(masks), "--output", str(target), "--per_class", "2",
                     "--image_size", "32"]) == 0
    assert capsys.readouterr().out.split()[0] == str(target)
    with Image.open(target) as im:
        assert im.tobytes() == _sheet(masks, 32, per_class=2).image.tobytes()


def test_a_new_kind_is_drawn_by_its_row_alone(masks, monkeypatch):
    # A row whose overlay paints every tile pixel one colour and adds a legend entry: preview
    # draws it with no change of its own (the mask row's overlay still draws before it).
    from readers import targets
    from readers.targets.mode import TargetMode
    from readers.targets.overlay import Overlay

    seen = []

    class Stripe(Overlay):
        def read(self, values):
            return values[schemas.FILENAME.key].decode()

        def paint(self, pixels, name, frame):
            seen.append((name, frame.height, frame.width, frame.size))
            out = pixels.copy()
            out[-2:] = (1, 2, 3)
            return out

        def legend(self, shown):
            return [((1, 2, 3), "stripe")]

    row = TargetMode(name="stripe", kind="stripe", keys=(), overlay=lambda manifest, split: Stripe())
    monkeypatch.setattr(targets, "MODES", (*targets.MODES, row))
    sheet = _sheet(masks, 32)
    names = sheet.rows[0][1]
    assert sorted(n for n, *_ in seen) == sorted(names) and {s[1:] for s in seen} == {(32, 32, 32)}
    by_reader = _reader_images(masks, 32, "stretch")
    for column, name in enumerate(names):
        tile = _tile(sheet, column, 32)
        assert (tile[-2:] == (1, 2, 3)).all()
        # The mask's colours are there still, above the stripe.
        np.testing.assert_allclose(tile[1:-2, :16], _blend(by_reader[name][1:-2, :16].astype(np.int64), 1), atol=1)
