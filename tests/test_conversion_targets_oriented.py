"""Oriented boxes (conversion/targets/oriented.py, dota.py, YOLO-OBB and CVAT rotated boxes), through the real
Beam runner: the stored corners against the annotations' own, read back from the shards."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import convert, encode, marked_photo, pixels, records_by_name, rows_by_path, upright_marker, write

import schemas
from beam_jobs import convert as convert_module
from conversion.targets import oriented

_KIND = "oriented_boxes"


def _corners_in_pixels(rec) -> list[np.ndarray]:
    """Each stored oriented box's corners [4, 2] in pixels of its stored image."""
    w, h = rec[schemas.WIDTH.key], rec[schemas.HEIGHT.key]
    flat = np.asarray(rec[schemas.OBB_CORNERS.key], np.float64).reshape(-1, 4, 2)
    return list(flat * [w, h])


def _float32(values) -> np.ndarray:
    return np.asarray(np.asarray(values, np.float32), np.float64)


# --------------------------------------------------------------------------
# DOTA: a labelTxt folder beside the images, as DOTA's devkit writes it


_P1 = ("imagesource:GoogleEarth\ngsd:0.146343590398\n"
       "10.0 5.0 40.0 8.0 37.0 30.0 7.0 27.0 plane 0\n"
       "50 40 70 40 70 52 50 52 small-vehicle 1\n"  # Across the bottom-right edge: kept, listed.
       "80 80 90 80 90 90 80 90 ship 0\n"  # Wholly outside: dropped.
       "12.5 20.25 20.5 20.25 20.5 30.75 12.5 30.75 small-vehicle 0\n")


@pytest.fixture(scope="module")
def dota(tmp_path_factory):
    base = tmp_path_factory.mktemp("dota")
    for i, name in enumerate(("P0001", "P0002", "P0003", "P0004")):
        write(base / "images" / f"{name}.png", encode(pixels(i, size=(48, 64)), "PNG"))
    labels = base / "labelTxt"
    write(labels / "P0001.txt", _P1.encode())
    write(labels / "P0002.txt", b"1 2 30 2 30 20 1 20 ship\n")  # No difficult field: not difficult.
    write(labels / "P0003.txt", b"1 2 30 2 30 20 1 20 ship 0\n1 2 30 2 30 20 plane 0\n")  # 8 fields.
    write(labels / "P0004.txt", b"1 2 30 2 30 x 1 20 ship 0\n")
    write(labels / "P9999.txt", b"1 2 30 2 30 20 1 20 ship 0\n")  # No such image.
    manifest = convert(base / "images", base / "out", "--annotations", labels, "--boxes", "oriented",
                       "--max_reject_fraction", "0.6")
    return base, manifest


def test_dota_corners_are_stored_in_their_order_within_float32(dota):
    base, manifest = dota
    records = records_by_name(base / "out")
    assert sorted(records) == ["P0001.png", "P0002.png"]
    section = manifest.targets[_KIND]
    assert section["format"] == "dota"
    assert section["class_names"] == ["plane", "ship", "small-vehicle"]  # The names used, sorted.
    assert "boxes" not in manifest.targets
    rec = records["P0001.png"]
    want = [[10, 5, 40, 8, 37, 30, 7, 27], [50, 40, 70, 40, 70, 52, 50, 52],
            [12.5, 20.25, 20.5, 20.25, 20.5, 30.75, 12.5, 30.75]]
    got = np.asarray(rec[schemas.OBB_CORNERS.key], np.float64)
    np.testing.assert_array_equal(got, _float32(np.asarray(want) / np.tile([64, 48], 4)).reshape(-1))
    np.testing.assert_allclose(np.concatenate(_corners_in_pixels(rec)).reshape(-1), np.ravel(want), atol=1e-4)
    assert list(rec[schemas.OBB_LABEL.key]) == [0, 2, 2]
    assert list(rec[schemas.OBB_DIFFICULT.key]) == [0, 1, 0]
    assert list(records["P0002.png"][schemas.OBB_DIFFICULT.key]) == [0]
    assert section["counts"] == {"train": [1, 1, 2]}
    assert section["issues"]["unknown_image"] == 1
    assert section["issues"]["corners_outside"] == 1 and section["issues"]["outside_image"] == 1


def test_dota_corners_outside_are_kept_and_listed_and_a_box_outside_dropped(dota):
    base, _ = dota
    row = rows_by_path(base / "out" / schemas.NORMALIZED_FILENAME)["P0001.png"]
    assert {"oriented_boxes_outside", "oriented_boxes_dropped"} <= set(row["actions"])
    details = row["details"][_KIND]
    assert details["outside"] == [{"line": 4, "corners": [50, 40, 70, 40, 70, 52, 50, 52]}]
    assert details["dropped"] == [{"line": 5, "reason": "outside_image", "corners": [80, 80, 90, 80, 90, 90, 80, 90]}]


def test_dota_bad_lines_reject_their_image_naming_file_and_line(dota):
    base, _ = dota
    rejects = rows_by_path(base / "out" / schemas.REJECTS_FILENAME)
    assert rejects["P0003.png"]["reason"] == "bad_target"
    assert "P0003.txt line 2: 8 fields" in rejects["P0003.png"]["message"]
    assert "P0004.txt line 1: a corner is not a number" in rejects["P0004.png"]["message"]


def test_dota_without_boxes_oriented_stores_each_box_extent(dota, tmp_path):
    base, _ = dota
    manifest = convert(base / "images", tmp_path / "out", "--annotations", base / "labelTxt",
                       "--max_reject_fraction", "0.6")
    assert manifest.targets["boxes"]["format"] == "dota" and _KIND not in manifest.targets
    rec = records_by_name(tmp_path / "out")["P0001.png"]
    w, h = 64, 48
    got = np.stack([rec[spec.key] for spec in schemas.BOX_FEATURES[:4]], -1) * [w, h, w, h]
    # The extent of each box, clipped to the image as axis boxes are; the one outside dropped.
    np.testing.assert_allclose(got, [[7, 5, 40, 30], [50, 40, 64, 48], [12.5, 20.25, 20.5, 30.75]], atol=1e-4)
    assert list(rec[schemas.BBOX_IS_CROWD.key]) == [0, 1, 0]  # difficult, as VOC's


def test_dota_class_names_given_refuse_a_name_outside_them(dota, tmp_path):
    base, _ = dota
    manifest = convert(base / "images", tmp_path / "out", "--annotations", base / "labelTxt", "--boxes", "oriented",
                       "--class_names", "ship,plane,small-vehicle,harbor", "--max_reject_fraction", "0.6")
    assert manifest.targets[_KIND]["class_names"] == ["ship", "plane", "small-vehicle", "harbor"]
    assert list(records_by_name(tmp_path / "out")["P0001.png"][schemas.OBB_LABEL.key]) == [1, 2, 2]
    convert(base / "images", tmp_path / "out2", "--annotations", base / "labelTxt", "--boxes", "oriented",
            "--class_names", "ship,small-vehicle", "--max_reject_fraction", "0.8")
    rejects = rows_by_path(tmp_path / "out2" / schemas.REJECTS_FILENAME)
    assert "class 'plane' is not among --class_names" in rejects["P0001.png"]["message"]


# --------------------------------------------------------------------------
# Ultralytics YOLO-OBB, laid out as its dota8: data.yaml, images/{train,val}, labels/{train,val}


@pytest.fixture(scope="module")
def dota8(tmp_path_factory):
    base = tmp_path_factory.mktemp("yolo_obb")
    root = base / "dota8"
    for split in ("train", "val"):
        for i in range(2):
            write(root / "images" / split / f"im{i}.jpg", encode(pixels(i, size=(40, 60)), "JPEG"))
    write(root / "labels" / "train" / "im0.txt",
          b"0 0.1 0.2 0.5 0.25 0.45 0.6 0.05 0.55\n1 0.9 0.9 1.0 0.95 0.95 1.0 0.85 0.95\n")
    write(root / "labels" / "train" / "im1.txt", b"1 0.5 0.5 0.2 0.2\n")  # A 'class cx cy w h' box.
    write(root / "labels" / "val" / "im0.txt", b"2 0.2 0.2 0.4 0.2 0.4 0.4 0.2 0.4\n")
    write(root / "labels" / "val" / "im1.txt", b"7 0.2 0.2 0.4 0.2 0.4 0.4 0.2 0.4\n")  # No class 7.
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\n"
                                    "names:\n  0: plane\n  1: ship\n  2: storage tank\n")
    manifest = convert(root / "images", base / "out", "--annotations", root / "data.yaml", "--boxes", "oriented",
                       "--max_reject_fraction", "0.6")
    return root, base / "out", manifest


def test_yolo_obb_corners_are_the_labels_fractions(dota8):
    _, out, manifest = dota8
    records = records_by_name(out)
    assert sorted(records) == ["train/im0.jpg", "val/im0.jpg"]
    assert records["val/im0.jpg"]["split"] == "validation"
    section = manifest.targets[_KIND]
    assert section["format"] == "yolo_obb" and section["class_names"] == ["plane", "ship", "storage tank"]
    rec = records["train/im0.jpg"]
    want = [0.1, 0.2, 0.5, 0.25, 0.45, 0.6, 0.05, 0.55, 0.9, 0.9, 1.0, 0.95, 0.95, 1.0, 0.85, 0.95]
    np.testing.assert_allclose(rec[schemas.OBB_CORNERS.key], _float32(want), rtol=0, atol=1e-7)
    assert list(rec[schemas.OBB_LABEL.key]) == [0, 1]
    assert manifest.options["boxes"] == "oriented"


def test_yolo_obb_axis_lines_and_unknown_classes_reject_their_image(dota8):
    _, out, _ = dota8
    rejects = rows_by_path(out / schemas.REJECTS_FILENAME)
    message = rejects["train/im1.jpg"]["message"]
    assert "labels/train/im1.txt line 1: 5 fields" in message and "mixes boxes and oriented boxes" in message
    assert "line 1: class 7 is not one of the 3 classes" in rejects["val/im1.jpg"]["message"]


def test_yolo_obb_labels_without_boxes_oriented_stay_polygon_extents(dota8, tmp_path):
    # The default is unchanged: a 9-field line is a YOLO-seg polygon, boxed by its extent.
    root, _, _ = dota8
    manifest = convert(root / "images", tmp_path / "out", "--annotations", root / "data.yaml",
                       "--max_reject_fraction", "0.6")
    assert set(manifest.targets) == {"boxes"} and "boxes" not in manifest.options
    rec = records_by_name(tmp_path / "out")["train/im0.jpg"]
    assert schemas.OBB_CORNERS.key not in rec
    np.testing.assert_allclose([rec[k.key][0] for k in schemas.BOX_FEATURES[:4]], [0.05, 0.2, 0.5, 0.6], atol=1e-6)


# --------------------------------------------------------------------------
# CVAT rotated boxes: the corners against hand geometry


_CVAT = """<?xml version="1.0" encoding="utf-8"?>
<annotations>
  <version>1.1</version>
  <meta><task><labels><label><name>ship</name></label><label><name>plane</name></label></labels></task></meta>
  <image id="0" name="a.png" width="64" height="48">
    <box label="ship" xtl="10" ytl="12" xbr="40" ybr="24" rotation="30"></box>
    <box label="plane" xtl="5" ytl="5" xbr="15" ybr="9"></box>
    <polygon label="plane" points="30,30;50,32;48,44;28,42"></polygon>
    <ellipse label="ship" cx="20" cy="20" rx="4" ry="2"></ellipse>
  </image>
</annotations>
"""


def _turned(x0, y0, x1, y1, degrees):
    """The corners tl, tr, br, bl of a box turned about its centre, clockwise on the image (y down)."""
    t = math.radians(degrees)
    turn = np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])
    centre = np.array([(x0 + x1) / 2, (y0 + y1) / 2])
    corners = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float64)
    return (corners - centre) @ turn.T + centre


def test_cvat_rotated_boxes_are_kept_as_their_turned_corners(tmp_path):
    write(tmp_path / "images" / "a.png", encode(pixels(0, size=(48, 64)), "PNG"))
    (tmp_path / "annotations.xml").write_text(_CVAT)
    manifest = convert(tmp_path / "images", tmp_path / "out", "--annotations", tmp_path / "annotations.xml",
                       "--boxes", "oriented")
    section = manifest.targets[_KIND]
    assert section["format"] == "cvat" and section["class_names"] == ["ship", "plane"]
    assert section["issues"]["not_an_oriented_box"] == 1 and section["issues"]["oriented_box_from_polygon"] == 1
    rec = records_by_name(tmp_path / "out")["a.png"]
    got = _corners_in_pixels(rec)
    want = [_turned(10, 12, 40, 24, 30), _turned(5, 5, 15, 9, 0),
            np.array([[30, 30], [50, 32], [48, 44], [28, 42]], np.float64)]
    assert len(got) == 3
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4)
    # A turn by 30 degrees clockwise on the image: the top-right corner goes down, the top-left one up.
    assert got[0][1][1] > 12 and got[0][0][1] < 12
    assert list(rec[schemas.OBB_LABEL.key]) == [0, 1, 1]


def test_cvat_rotated_boxes_without_boxes_oriented_keep_their_extent(tmp_path):
    # The default is unchanged: the extent of the very corners --boxes oriented stores.
    write(tmp_path / "images" / "a.png", encode(pixels(0, size=(48, 64)), "PNG"))
    (tmp_path / "annotations.xml").write_text(_CVAT)
    convert(tmp_path / "images", tmp_path / "axis", "--annotations", tmp_path / "annotations.xml")
    convert(tmp_path / "images", tmp_path / "obb", "--annotations", tmp_path / "annotations.xml", "--boxes", "oriented")
    rec = records_by_name(tmp_path / "axis")["a.png"]
    first = [rec[spec.key][0] for spec in schemas.BOX_FEATURES[:4]]
    corners = _corners_in_pixels(records_by_name(tmp_path / "obb")["a.png"])[0]
    np.testing.assert_allclose(np.asarray(first) * [64, 48, 64, 48], [*corners.min(0), *corners.max(0)], atol=1e-4)


# --------------------------------------------------------------------------
# EXIF-turned photos, formats that hold none, and the helpers


def test_corners_drawn_on_the_raw_frame_turn_with_the_photo(tmp_path):
    # A phone photo stored on its side (EXIF 6): raw 48 x 32, its marker at x 4..16, y 6..14.
    photo = marked_photo(6)
    write(tmp_path / "images" / "rot6.jpg", photo)
    write(tmp_path / "labelTxt" / "rot6.txt", b"4 6 16 6 16 14 4 14 plane 0\n")
    convert(tmp_path / "images", tmp_path / "out", "--annotations", tmp_path / "labelTxt", "--boxes", "oriented")
    rec = records_by_name(tmp_path / "out")["rot6.jpg"]
    (corners,) = _corners_in_pixels(rec)
    x0, y0, x1, y1 = upright_marker(rec[schemas.IMAGE.key])
    np.testing.assert_allclose([*corners.min(0), *corners.max(0)], [x0, y0, x1, y1], atol=1.01)
    # Turned a quarter clockwise to view: the raw top-left corner is the upright top-right one.
    np.testing.assert_allclose(corners[0], [x1, y0], atol=1.01)
    np.testing.assert_allclose(corners[2], [x0, y1], atol=1.01)
    row = rows_by_path(tmp_path / "out" / schemas.NORMALIZED_FILENAME)["rot6.jpg"]
    assert "oriented_boxes_exif_transpose" in row["actions"]


def test_boxes_oriented_refuses_formats_without_oriented_boxes(tmp_path, capfd):
    write(tmp_path / "images" / "a.png", encode(pixels(0), "PNG"))
    (tmp_path / "instances.json").write_text('{"images": [], "annotations": [], "categories": []}')
    status = convert_module.main(["--input_dir", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out"),
                                  "--annotations", str(tmp_path / "instances.json"), "--boxes", "oriented"])
    assert status == 2
    assert "--boxes oriented reads oriented boxes from a CVAT" in capfd.readouterr().err


def test_boxes_oriented_needs_annotations(tmp_path, capfd):
    write(tmp_path / "images" / "a.png", encode(pixels(0), "PNG"))
    status = convert_module.main(["--input_dir", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out"),
                                  "--boxes", "oriented"])
    assert status == 2
    assert "give --annotations with it" in capfd.readouterr().err


def test_polygon_area_either_winding():
    square = [(0, 0), (2, 0), (2, 3), (0, 3)]
    assert oriented.polygon_area(square) == oriented.polygon_area(square[::-1]) == 6
    assert oriented.polygon_area([(0, 0), (1, 1), (2, 2), (3, 3)]) == 0


# --------------------------------------------------------------------------
# verify and --append


def test_verify_checks_the_oriented_boxes(dota, capsys):
    from beam_jobs import verify

    base, _ = dota
    assert verify.main([str(base / "out")]) == 0
    assert "targets checked: oriented_boxes" in capsys.readouterr().out
    good = {schemas.OBB_CORNERS.key: [0.1] * 8, schemas.OBB_LABEL.key: [2], schemas.OBB_DIFFICULT.key: [1]}
    assert oriented.check_oriented_boxes(good, 3) is None
    assert "8 numbers, a label and a flag per oriented box" in oriented.check_oriented_boxes(
        {**good, schemas.OBB_CORNERS.key: [0.1] * 7}, 3)
    assert "outside [0, 3)" in oriented.check_oriented_boxes({**good, schemas.OBB_LABEL.key: [3]}, 3)
    assert "not 0 or 1" in oriented.check_oriented_boxes({**good, schemas.OBB_DIFFICULT.key: [2]}, 3)
    assert "not a finite number" in oriented.check_oriented_boxes(
        {**good, schemas.OBB_CORNERS.key: [float("nan")] * 8}, 3)


def test_append_keeps_the_held_classes_indices(tmp_path):
    for name in ("a", "b"):
        write(tmp_path / "images" / f"{name}.png", encode(pixels(0, size=(48, 64)), "PNG"))
    write(tmp_path / "labelTxt" / "a.txt", b"1 2 30 2 30 20 1 20 ship 0\n")
    convert(tmp_path / "images", tmp_path / "out", "--annotations", tmp_path / "labelTxt", "--boxes", "oriented")
    write(tmp_path / "labelTxt" / "b.txt", b"1 2 30 2 30 20 1 20 harbor 0\n5 5 9 5 9 9 5 9 ship 0\n")
    manifest = convert(tmp_path / "images", tmp_path / "out", "--annotations", tmp_path / "labelTxt",
                       "--boxes", "oriented", "--append")
    section = manifest.targets[_KIND]
    assert section["class_names"] == ["ship", "harbor"]  # The held class first, the new one after.
    records = records_by_name(tmp_path / "out")
    assert list(records["a.png"][schemas.OBB_LABEL.key]) == [0]
    assert list(records["b.png"][schemas.OBB_LABEL.key]) == [1, 0]
    assert section["counts"] == {"train": [2, 1]}


def test_a_dota_file_of_two_images_of_its_stem_is_counted_not_read(tmp_path):
    write(tmp_path / "images" / "a" / "x.png", encode(pixels(0), "PNG"))
    write(tmp_path / "images" / "b" / "x.png", encode(pixels(1), "PNG"))
    write(tmp_path / "images" / "y.png", encode(pixels(2), "PNG"))
    write(tmp_path / "labelTxt" / "x.txt", b"1 2 10 2 10 9 1 9 ship 0\n")
    write(tmp_path / "labelTxt" / "y.txt", b"1 2 10 2 10 9 1 9 ship 0\n")
    manifest = convert(tmp_path / "images", tmp_path / "out", "--annotations", tmp_path / "labelTxt",
                       "--boxes", "oriented")
    assert manifest.targets[_KIND]["issues"]["ambiguous_stem"] == 1
    assert sorted(records_by_name(tmp_path / "out")) == ["y.png"]


def test_boxes_oriented_does_not_combine_with_annotation_masks(tmp_path, capfd):
    write(tmp_path / "images" / "a.png", encode(pixels(0), "PNG"))
    write(tmp_path / "labelTxt" / "a.txt", b"1 2 10 2 10 9 1 9 ship 0\n")
    status = convert_module.main(["--input_dir", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out"),
                                  "--annotations", str(tmp_path / "labelTxt"), "--boxes", "oriented",
                                  "--annotation_masks"])
    assert status == 2
    assert "does not combine with --boxes oriented" in capfd.readouterr().err
