"""label_mode='oriented_boxes' (readers/targets/oriented.py) of a DOTA dataset converted on the Beam runner:
corners after resize, crop, padding and flip against corners computed here in numpy; `xywhr`; inspect and
preview drawing them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert, encode, pixels, records_by_name, write

import schemas
from readers import image_dataset_from_tfrecords
from readers.targets import mode_of
from readers.targets.geometry import Geometry
from readers.targets.oriented import xywhr
from shardsmith import cli, preview

_SIZE = (24, 24)
_LINES = {
    # 64 x 48 (w x h): a turned box inside, one across the right edge, one in the far left strip.
    "wide": (64, 48, b"10 5 40 8 37 30 7 27 plane 0\n50 10 70 12 68 30 48 28 ship 1\n"
                     b"1 20 5 20 5 28 1 28 ship 0\n"),
    # 40 x 56: one box near the bottom.
    "tall": (40, 56, b"20 40 36 44 34 52 18 48 harbor 0\n"),
}


@pytest.fixture(scope="module")
def dota(tmp_path_factory):
    base = tmp_path_factory.mktemp("obb_read")
    for i, (name, (w, h, lines)) in enumerate(_LINES.items()):
        write(base / "images" / f"{name}.png", encode(pixels(i, size=(h, w)), "PNG"))
        write(base / "labelTxt" / f"{name}.txt", lines)
    manifest = convert(base / "images", base / "out", "--annotations", base / "labelTxt", "--boxes", "oriented")
    stored = {}
    for name, rec in records_by_name(base / "out").items():
        corners = np.asarray(rec[schemas.OBB_CORNERS.key], np.float32).reshape(-1, 4, 2)
        stored[name] = (corners.astype(np.float64), np.asarray(rec[schemas.OBB_LABEL.key]),
                        int(rec[schemas.HEIGHT.key]), int(rec[schemas.WIDTH.key]))
    return base / "out", manifest, stored


def _examples(out, **options):
    options = {"image_size": _SIZE, "batch_size": 2, "shuffle": False, "label_mode": "oriented_boxes",
               "extra_features": (schemas.FILENAME.key,), **options}
    found = {}
    for _, labels, extras in image_dataset_from_tfrecords(out, **options):
        for i, name in enumerate(extras[schemas.FILENAME.key].numpy()):
            found[name.decode()] = tf.nest.map_structure(lambda t, i=i: np.asarray(t[i]), labels)
    return found


def _kept(corners, classes):
    """The boxes whose corners' extent keeps some area inside [0, 1] (the axis boxes' rule)."""
    lo, hi = np.clip(corners.min(1), 0, 1), np.clip(corners.max(1), 0, 1)
    keep = (hi > lo).all(-1)
    return corners[keep], classes[keep]


def test_a_plain_resize_keeps_the_stored_corners(dota):
    out, manifest, stored = dota
    ds = image_dataset_from_tfrecords(out, image_size=_SIZE, batch_size=2, shuffle=False, label_mode="oriented_boxes")
    assert ds.class_names == ["harbor", "plane", "ship"] == manifest.targets["oriented_boxes"]["class_names"]
    _, labels = next(iter(ds))
    assert isinstance(labels["corners"], tf.RaggedTensor) and labels["corners"].shape.as_list() == [2, None, 4, 2]
    for name, label in _examples(out).items():
        corners, classes, _, _ = stored[name]
        np.testing.assert_array_equal(label["corners"], corners.astype(np.float32))
        np.testing.assert_array_equal(label["classes"], classes)


def test_corners_follow_a_centre_crop_and_are_not_clipped(dota):
    out, _, stored = dota
    for fraction in (1.0, 0.5):
        for name, label in _examples(out, resize="crop", crop_fraction=fraction).items():
            corners, classes, height, width = stored[name]
            side = int(min(height, width) * fraction)
            top, left = (height - side) // 2, (width - side) // 2
            want = np.stack([(corners[..., 0] * width - left) / side, (corners[..., 1] * height - top) / side], -1)
            want, want_classes = _kept(want, classes)
            np.testing.assert_allclose(label["corners"], want, atol=1e-5)
            np.testing.assert_array_equal(label["classes"], want_classes)
            if name == "wide.png" and fraction == 1.0:
                # The ship across the right edge keeps its corners outside [0, 1]; the sliver at the left is cut away.
                assert (label["corners"] > 1).any() and len(label["classes"]) == 2


def test_corners_follow_padding(dota):
    out, _, stored = dota
    for name, label in _examples(out, resize="pad", image_size=(30, 30)).items():
        corners, classes, height, width = stored[name]
        side = max(height, width)
        top, left = (side - height) // 2, (side - width) // 2
        want = np.stack([(corners[..., 0] * width + left) / side, (corners[..., 1] * height + top) / side], -1)
        np.testing.assert_allclose(label["corners"], want, atol=1e-5)
        np.testing.assert_array_equal(label["classes"], classes)


def _signed_area(points):
    x, y = points[..., 0], points[..., 1]
    return (x * np.roll(y, -1, -1) - np.roll(x, -1, -1) * y).sum(-1) / 2


def test_a_flip_mirrors_the_corners_and_keeps_their_winding():
    mode = mode_of("oriented_boxes")
    corners = np.array([[[0.1, 0.2], [0.5, 0.25], [0.45, 0.6], [0.05, 0.55]],
                        [[0.7, 0.1], [0.9, 0.1], [0.9, 0.3], [0.7, 0.3]]], np.float32)
    features = {schemas.OBB_CORNERS.key: tf.constant(corners.reshape(-1)),
                schemas.OBB_LABEL.key: tf.constant([3, 1], tf.int64)}
    window = tf.constant([10, 20, 80, 170])  # offset_y, offset_x, height, width of a 100 x 200 image.
    for flip in (False, True):
        geometry = Geometry(tf.constant(100), tf.constant(200), window=window, flip=tf.constant(flip), resized=True)
        label = mode.label(features, geometry, mode.settings(None, _Reading()), _SIZE)
        xs = (corners[..., 0].astype(np.float64) * 200 - 20) / 170
        ys = (corners[..., 1].astype(np.float64) * 100 - 10) / 80
        want = np.stack([xs, ys], -1)
        if flip:
            want = np.stack([1 - xs, ys], -1)[:, [0, 3, 2, 1]]
        np.testing.assert_allclose(label["corners"].numpy(), want, atol=1e-6)
        np.testing.assert_array_equal(label["classes"].numpy(), [3, 1])
        # Clockwise on the image (y down: a positive shoelace sum) before and after.
        assert (_signed_area(label["corners"].numpy()) > 0).all() and (_signed_area(corners) > 0).all()


class _Reading:
    pad_boxes = None


def test_standard_augmentation_flips_some_and_keeps_the_boxes_in_the_crop(dota):
    out, _, stored = dota
    windings = set()
    for seed in range(6):
        for name, label in _examples(out, augment="standard", seed=seed).items():
            corners = label["corners"]
            assert corners.shape[1:] == (4, 2) and len(corners) == len(label["classes"])
            if len(corners):
                # Each kept box keeps some area in the output, and its winding (clockwise, as stored).
                assert ((np.clip(corners.max(1), 0, 1) - np.clip(corners.min(1), 0, 1)) > 0).all()
                signs = np.sign(_signed_area(corners))
                windings.add(bool((signs == np.sign(_signed_area(stored[name][0][:1]))).all()))
    assert windings == {True}


def test_pad_boxes_pads_corners_and_classes_with_minus_one(dota):
    out, _, stored = dota
    ds = image_dataset_from_tfrecords(out, image_size=_SIZE, batch_size=2, shuffle=False,
                                      label_mode="oriented_boxes", pad_boxes=2)
    _, labels = next(iter(ds))
    assert labels["corners"].shape == (2, 2, 4, 2) and labels["classes"].shape == (2, 2)
    found = _examples(out, pad_boxes=2)
    np.testing.assert_array_equal(found["tall.png"]["classes"], [0, -1])
    np.testing.assert_array_equal(found["tall.png"]["corners"][1], -np.ones((4, 2)))
    np.testing.assert_array_equal(found["wide.png"]["corners"], stored["wide.png"][0][:2].astype(np.float32))


@pytest.mark.parametrize("degrees, want_w, want_h, want_angle", [
    (30, 20, 10, 30), (0, 20, 10, 0), (120, 10, 20, 30), (-30, 10, 20, 60), (200, 20, 10, 20)])
def test_xywhr_is_ultralytics_centre_size_and_angle(degrees, want_w, want_h, want_angle):
    height, width = 50, 100
    t = math.radians(degrees)
    turn = np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])
    corners = np.array([[-10, -5], [10, -5], [10, 5], [-10, 5]], np.float64) @ turn.T + [40, 25]
    got = xywhr(corners[None] / [width, height], height, width).numpy()[0]
    np.testing.assert_allclose(got, [40, 25, want_w, want_h, math.radians(want_angle)], atol=1e-4)


def test_inspect_shows_the_oriented_boxes_per_class(dota, capsys):
    out, _, _ = dota
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "oriented boxes: dota annotations" in text and "3 classes" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.split()[:1] in (["plane"], ["ship"])}
    assert rows["ship"][1] == "2" and rows["plane"][1] == "1"


def test_preview_draws_each_box_as_its_polygon(tmp_path):
    # An upright square box over the middle half of a 64 x 64 image: its edges on tile pixels 16 and 47.
    write(tmp_path / "images" / "img.png", encode(pixels(3, size=(64, 64)), "PNG"))
    write(tmp_path / "labelTxt" / "img.txt", b"16 16 48 16 48 48 16 48 ship 0\n")
    convert(tmp_path / "images", tmp_path / "out", "--annotations", tmp_path / "labelTxt", "--boxes", "oriented")
    sheet = preview._build_sheet(tmp_path / "out", "train", per_class=1, image_size=64, seed=0, max_classes=20,
                                 max_records=5000, resize="stretch")
    x, y = sheet.layout.tile_origin(0, 0)
    tile = np.asarray(sheet.image)[y:y + 64, x:x + 64].astype(np.int64)
    colour = np.array(preview.colour_of(0))
    # The bottom edge and the lower parts of the left and right edges: the class colour.
    assert (tile[47:49, 20:44] == colour).all(axis=-1).any(axis=0).all()
    assert (tile[34:44, 15:18] == colour).all(axis=-1).any(axis=1).all()
    assert (tile[34:44, 46:49] == colour).all(axis=-1).any(axis=1).all()
    # Inside, below the name tag: not the class colour.
    assert not (tile[36:44, 26:40] == colour).all(axis=-1).any()


def test_standard_augmentation_moves_the_corners_onto_the_painted_box(tmp_path):
    # A red turned box on black, a green spot inside it by its first corner: after each random crop and
    # flip, the coloured pixels lie inside the label's polygon and the spot is nearest its first corner.
    from PIL import Image, ImageDraw

    corners = [(14, 6), (44, 12), (38, 40), (8, 34)]
    image = Image.new("RGB", (64, 48))
    draw = ImageDraw.Draw(image)
    draw.polygon(corners, fill=(255, 0, 0))
    spot = np.add(corners[0], np.subtract(np.mean(corners, 0), corners[0]) * 0.3)
    draw.ellipse((spot[0] - 3, spot[1] - 3, spot[0] + 3, spot[1] + 3), fill=(0, 255, 0))
    write(tmp_path / "images" / "painted.png", encode(np.asarray(image), "PNG"))
    write(tmp_path / "labelTxt" / "painted.txt", " ".join(f"{x} {y}" for x, y in corners).encode() + b" ship 0\n")
    convert(tmp_path / "images", tmp_path / "out", "--annotations", tmp_path / "labelTxt", "--boxes", "oriented")
    checked, flipped = 0, set()
    for seed in range(8):
        ds = image_dataset_from_tfrecords(tmp_path / "out", image_size=(32, 32), batch_size=None, shuffle=False,
                                          label_mode="oriented_boxes", augment="standard", seed=seed,
                                          interpolation="nearest")
        for pixels_out, label in ds:
            pixels_out = pixels_out.numpy()
            red = (pixels_out[..., 0] > 127) & (pixels_out[..., 1] < 128)
            green = (pixels_out[..., 1] > 127) & (pixels_out[..., 0] < 128)
            if not len(label["classes"]):
                assert (red | green).sum() <= 2  # Dropped: at most a sliver of the box is in the crop.
                continue
            polygon = label["corners"].numpy()[0] * 32
            ys, xs = np.nonzero(red | green)
            centres = np.stack([xs + 0.5, ys + 0.5], -1)
            # Inside the (convex, clockwise) polygon, each edge's cross product, give or take the pixel
            # Pillow's fill adds along the edges, as large as the crop's upscaling makes it.
            edges = np.roll(polygon, -1, 0) - polygon
            cross = (edges[None, :, 0] * (centres[:, None, 1] - polygon[None, :, 1])
                     - edges[None, :, 1] * (centres[:, None, 0] - polygon[None, :, 0]))
            lengths = np.linalg.norm(edges, axis=-1)
            stored = np.linalg.norm(np.roll(corners, -1, 0) - np.asarray(corners), axis=-1)
            tolerance = 1.0 + 1.5 * (lengths / stored).max()
            assert (cross / lengths >= -tolerance).all(), seed
            if green.sum() >= 4:
                ys, xs = np.nonzero(green)
                at = np.array([xs.mean() + 0.5, ys.mean() + 0.5])
                assert np.argmin(np.linalg.norm(polygon - at, axis=-1)) == 0, seed
                flipped.add(bool(polygon[0, 0] > polygon[2, 0]))
                checked += 1
    assert checked >= 4 and flipped == {True, False}
