"""--annotation_masks: masks drawn from --annotations' regions, end to end on Beam's local runner.

The independent reader is pycocotools: `COCO.annToMask` draws each COCO
annotation (polygons, compressed and uncompressed RLE) and the stored PNGs,
decoded by TensorFlow, must hold the same ids pixel for pixel.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert, encode, oriented_jpeg, pixels, records_by_name, rows_by_path, write
from PIL import Image
from pycocotools import mask as coco_mask
from pycocotools.coco import COCO

import schemas
from beam_jobs import convert as convert_module
from conversion import annotation_masks
from imaging import ImageRejected


def _mask_of(rec) -> np.ndarray:
    return tf.io.decode_png(rec[schemas.MASK.key], channels=1).numpy()[..., 0]


def _expected(coco: COCO, image_id: int, label_of: dict) -> np.ndarray:
    """pycocotools' drawing of an image's annotations: id order, a later one over an earlier, crowd 255."""
    info = coco.imgs[image_id]
    ids = np.zeros((info["height"], info["width"]), np.uint8)
    for ann in sorted(coco.imgToAnns[image_id], key=lambda a: a["id"]):
        ids[coco.annToMask(ann) == 1] = 255 if ann.get("iscrowd") else label_of[ann["category_id"]] + 1
    return ids


def _compressed(mask: np.ndarray) -> dict:
    rle = coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": rle["size"], "counts": rle["counts"].decode("ascii")}


def _uncompressed(mask: np.ndarray) -> dict:
    flat = mask.astype(np.uint8).ravel(order="F")
    changes = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0] == 1:
        counts = [0, *counts]
    return {"size": list(mask.shape), "counts": counts}


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    base = tmp_path_factory.mktemp("annmasks")
    root = base / "images"
    for i in range(4):
        write(root / f"p{i}.png", encode(pixels(i, size=(30, 40)), "PNG"))
    write(root / "bad.png", encode(pixels(7, size=(30, 40)), "PNG"))
    write(root / "wrong_rle.png", encode(pixels(8, size=(30, 40)), "PNG"))
    # Stored on its side (EXIF 6): the raw frame is 48 wide, 32 high; annotated on it.
    write(root / "rot6.jpg", oriented_jpeg(np.zeros((32, 48, 3), np.uint8), 6))
    blob = np.zeros((30, 40), bool)
    blob[5:20, 8:30] = True
    blob[10:14, 12:16] = False  # A hole: RLE keeps it, a polygon could not.
    crowd = np.zeros((30, 40), bool)
    crowd[18:28, 2:38] = True
    images = [{"id": k + 1, "file_name": f"p{k}.png", "width": 40, "height": 30} for k in range(4)]
    images += [{"id": 5, "file_name": "bad.png", "width": 40, "height": 30},
               {"id": 6, "file_name": "wrong_rle.png", "width": 40, "height": 30},
               {"id": 7, "file_name": "rot6.jpg", "width": 48, "height": 32}]
    doc = {
        "images": images,
        "categories": [{"id": 7, "name": "cat"}, {"id": 2, "name": "dog"}, {"id": 5, "name": "bird"}],
        "annotations": [
            # p0: two polygons of one annotation with fractional corners, then one over them (id order).
            {"id": 3, "image_id": 1, "category_id": 2, "bbox": [1, 1, 30, 25], "iscrowd": 0,
             "segmentation": [[1.2, 1.7, 25.5, 2.3, 18.9, 20.4], [26.0, 10.0, 31.4, 26.2, 22.2, 24.8, 21.5, 15.0]]},
            {"id": 9, "image_id": 1, "category_id": 5, "bbox": [10, 5, 20, 15], "iscrowd": 0,
             "segmentation": [[10.5, 5.5, 29.5, 8.0, 24.0, 19.5, 12.0, 17.25]]},
            # p1: a compressed RLE with a hole, and a crowd's uncompressed RLE over part of it.
            {"id": 4, "image_id": 2, "category_id": 7, "bbox": [8, 5, 22, 15], "iscrowd": 0,
             "segmentation": _compressed(blob)},
            {"id": 5, "image_id": 2, "category_id": 2, "bbox": [2, 18, 36, 10], "iscrowd": 1,
             "segmentation": _uncompressed(crowd)},
            # p2: a crowd polygon under a later region; p3: no annotation at all (all background).
            {"id": 6, "image_id": 3, "category_id": 5, "bbox": [0, 0, 40, 30], "iscrowd": 1,
             "segmentation": [[0, 0, 39.5, 0.5, 39, 29.2, 0.8, 29]]},
            {"id": 8, "image_id": 3, "category_id": 7, "bbox": [5, 5, 10, 10], "iscrowd": 0,
             "segmentation": [[5, 5, 15, 5, 15, 15, 5, 15]]},
            # bad: a polygon of two points; wrong_rle: an RLE of another image's size.
            {"id": 10, "image_id": 5, "category_id": 7, "bbox": [1, 1, 4, 4], "iscrowd": 0,
             "segmentation": [[1, 1, 5, 5]]},
            {"id": 11, "image_id": 6, "category_id": 7, "bbox": [1, 1, 4, 4], "iscrowd": 1,
             "segmentation": {"size": [10, 10], "counts": [5, 90, 5]}},
            # rot6: drawn on the raw frame (48 x 32), stored upright (32 x 48).
            {"id": 12, "image_id": 7, "category_id": 2, "bbox": [4, 6, 20, 10], "iscrowd": 0,
             "segmentation": [[4, 6, 24, 6, 24, 16, 10, 16]]},
        ],
    }
    ann = base / "instances.json"
    ann.write_text(json.dumps(doc))
    out = base / "out"
    manifest = convert(root, out, "--annotations", ann, "--annotation_masks", "--max_reject_fraction", "0.5")
    return root, ann, out, manifest


def test_masks_are_pycocotools_drawings_of_the_annotations(coco):
    _, ann, out, _ = coco
    reference = COCO(str(ann))
    # Box classes in category id order (dog 2, bird 5, cat 7), as the boxes number them.
    label_of = {cid: k for k, cid in enumerate(sorted(reference.cats))}
    records = records_by_name(out)
    for image_id in (1, 2, 3, 4):
        name = reference.imgs[image_id]["file_name"]
        expected = _expected(reference, image_id, label_of)
        np.testing.assert_array_equal(_mask_of(records[name]), expected, err_msg=name)
    assert (_mask_of(records["p3.png"]) == 0).all()
    # The drawing is not trivially empty: every id of the annotations is there.
    assert set(np.unique(_mask_of(records["p0.png"]))) == {0, 2, 1}
    assert set(np.unique(_mask_of(records["p1.png"]))) == {0, 3, 255}


def test_raw_frame_regions_are_turned_with_the_photo(coco):
    _, ann, out, _ = coco
    reference = COCO(str(ann))
    raw = coco_mask.decode(coco_mask.frPyObjects([[4, 6, 24, 6, 24, 16, 10, 16]], 32, 48))[..., 0]
    stored = _mask_of(records_by_name(out)["rot6.jpg"])
    assert stored.shape == (48, 32)
    # EXIF 6: the raw frame turned a quarter clockwise to stand upright.
    np.testing.assert_array_equal(stored, np.rot90(raw, k=-1) * 1)  # dog: box class 0, mask id 1
    assert reference.imgs[7]["width"] == 48


def test_malformed_regions_are_bad_targets(coco):
    _, _, out, _ = coco
    rejects = rows_by_path(out / "rejects.jsonl")
    assert rejects["bad.png"]["reason"] == "bad_target"
    assert "polygon" in rejects["bad.png"]["message"]
    assert rejects["wrong_rle.png"]["reason"] == "bad_target"
    assert "10x10" in rejects["wrong_rle.png"]["message"]


def test_manifest_names_the_mask_ids(coco):
    _, _, _, manifest = coco
    section = manifest.extra[schemas.TARGETS_SECTION]["mask"]
    assert section["class_names"] == ["background", "dog", "bird", "cat"]
    assert section["dtype"] == "uint8" and section["ignore_id"] == 255
    assert section["num_classes"] == 4
    assert "boxes" in manifest.extra[schemas.TARGETS_SECTION]  # The boxes are stored too.


def test_verify_and_the_reader_take_the_drawn_masks(coco):
    _, _, out, _ = coco
    import readers
    from beam_jobs import verify

    assert verify.main([str(out)]) == 0
    ds = readers.image_dataset_from_tfrecords(str(out), "train", label_mode="mask", batch_size=None,
                                              shuffle=False, image_size=None)
    stored = {name: _mask_of(rec) for name, rec in records_by_name(out).items()}
    assert ds.class_names == ["background", "dog", "bird", "cat"]  # Mask id -> name.
    read = [mask.numpy()[..., 0] for _, mask in ds]
    assert len(read) == len(stored)
    assert sorted(m.tobytes() for m in read) == sorted(m.astype(np.int32).tobytes() for m in stored.values())


def test_resized_masks_follow_their_images_by_nearest(coco, tmp_path):
    root, ann, out, _ = coco
    small = tmp_path / "small"
    convert(root, small, "--annotations", ann, "--annotation_masks", "--max_side", "20",
            "--max_reject_fraction", "0.5")
    full, resized = records_by_name(out)["p0.png"], records_by_name(small)["p0.png"]
    from imaging.masks import nearest

    np.testing.assert_array_equal(_mask_of(resized), nearest(_mask_of(full), (15, 20)))


def test_the_same_input_gives_the_same_bytes(coco, tmp_path):
    root, ann, out, _ = coco
    again = tmp_path / "again"
    convert(root, again, "--annotations", ann, "--annotation_masks", "--max_reject_fraction", "0.5")
    first, second = records_by_name(out), records_by_name(again)
    assert {k: v[schemas.MASK.key] for k, v in first.items()} == {k: v[schemas.MASK.key] for k, v in second.items()}


@pytest.mark.parametrize("extra, words", [
    (["--masks_dir", "{root}"], ("--annotation_masks with --masks_dir", "give one of them")),
    ([], ("give --annotations with it", "--annotation_masks alone")),
])
def test_usage_errors_name_both_flags(tmp_path, capsys, extra, words):
    root = tmp_path / "images"
    write(root / "a.png", encode(pixels(0), "PNG"))
    args = ["--input_dir", str(root), "--output_dir", str(tmp_path / "out"), "--annotation_masks"]
    if extra:
        args += ["--annotations", str(tmp_path / "a.json")] + [a.format(root=root) for a in extra]
    status = convert_module.main(args)
    assert status == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_shapes_of_cvat_labelme_and_yolo():
    """Boxes, rotated boxes, ellipses, CVAT masks and YOLO fractions, drawn by their pixel centres."""
    entry = {"ref": "shape", "boxes": [
        [1, 2, 2, 8, 6, 0, 0],  # the box [2, 8) x [2, 6)
        [2, 0, 0, 10, 10, 1, 0],  # an ellipse about (5, 5), radii 3 and 2
        [3, 1, 1, 4, 3, 2, 0],  # a CVAT mask at left 1, top 1: 3 x 2
        [4, 0, 0, 0, 0, 0, 0],  # a polyline: nothing
    ], "regions": [None, ["ellipse", [5.0, 5.0, 3.0, 2.0, 0.0]], ["bitmap", [1, 1, 3, 2, [1, 2, 2, 1]]], ["none"]]}
    ids = annotation_masks.draw_ids(entry, 10, 8, "uint8", "x.png")
    expected = np.zeros((8, 10), np.uint8)
    expected[2:6, 2:8] = 1
    yy, xx = np.mgrid[0:8, 0:10] + 0.5
    expected[((xx - 5) / 3) ** 2 + ((yy - 5) / 2) ** 2 <= 1] = 2
    expected[1, 2:4] = 3
    expected[2, 3] = 3  # row by row: 0 1 1, then 0 0 1
    np.testing.assert_array_equal(ids, expected)
    yolo = {"units": "fraction", "boxes": [[1, 0.1, 0.25, 0.5, 0.75, 0, 0]], "regions": [None]}
    expected = np.zeros((8, 10), np.uint8)
    expected[2:6, 1:5] = 1
    np.testing.assert_array_equal(annotation_masks.draw_ids(yolo, 10, 8, "uint8", "y.png"), expected)


def test_many_classes_take_uint16_and_its_ignore_id():
    assert annotation_masks.mask_dtype(253) == "uint8"
    assert annotation_masks.mask_dtype(254) == "uint16"
    entry = {"boxes": [[1, 0, 0, 2, 2, 300, 0], [2, 1, 1, 3, 3, 0, 1]]}
    ids = annotation_masks.draw_ids(entry, 4, 4, "uint16", "z.png")
    assert ids.dtype == np.uint16 and ids[0, 0] == 301 and ids[2, 2] == 65535


def _poly(points, height, width) -> np.ndarray:
    flat = [float(v) for p in points for v in p]
    return coco_mask.decode(coco_mask.frPyObjects([flat], height, width))[..., 0].astype(bool)


_TRIANGLE = [(5.5, 5.0), (30.0, 6.0), (10.0, 25.0)]
_QUAD = [(12.0, 2.0), (38.0, 4.0), (36.5, 28.0), (20.0, 20.0)]


def _expected_two(height=30, width=40) -> np.ndarray:
    """The triangle (class 0, id 1), then the quadrilateral over it (class 1, id 2), as pycocotools draws them."""
    ids = np.zeros((height, width), np.uint8)
    ids[_poly(_TRIANGLE, height, width)] = 1
    ids[_poly(_QUAD, height, width)] = 2
    return ids


@pytest.mark.parametrize("form", ["cvat", "labelme", "yolo"])
def test_polygons_of_cvat_labelme_and_yolo_are_pycocotools_drawings(tmp_path, form):
    root = tmp_path / "images"
    write(root / "a.png", encode(pixels(1, size=(30, 40)), "PNG"))
    write(root / "plain.png", encode(pixels(2, size=(30, 40)), "PNG"))
    if form == "cvat":
        def pts(points):
            return ";".join(f"{x},{y}" for x, y in points)
        ann = tmp_path / "annotations.xml"
        ann.write_text(f"""<?xml version="1.0" encoding="utf-8"?>
<annotations><version>1.1</version>
  <meta><task><labels><label><name>ant</name></label><label><name>bee</name></label></labels></task></meta>
  <image id="0" name="a.png" width="40" height="30">
    <polygon label="ant" points="{pts(_TRIANGLE)}"/>
    <polyline label="ant" points="0,0;39,29"/>
    <polygon label="bee" points="{pts(_QUAD)}"/>
  </image>
  <image id="1" name="plain.png" width="40" height="30"></image>
</annotations>""")
    elif form == "labelme":
        ann = tmp_path / "labelme"
        for name, shapes in (("a", [("ant", _TRIANGLE), ("bee", _QUAD)]), ("plain", [])):
            doc = {"imagePath": f"../images/{name}.png", "imageWidth": 40, "imageHeight": 30,
                   "shapes": [{"label": label, "shape_type": "polygon", "points": [list(p) for p in points]}
                              for label, points in shapes]}
            write(ann / f"{name}.json", json.dumps(doc).encode())
    else:
        ann = tmp_path / "labels"

        def line(cls, points):
            return f"{cls} " + " ".join(f"{x / 40!r} {y / 30!r}" for x, y in points)
        write(ann / "a.txt", f"{line(0, _TRIANGLE)}\n{line(1, _QUAD)}\n".encode())
        write(ann / "plain.txt", b"")
        (ann / "classes.txt").write_text("ant\nbee\n")
    extra = ["--class_names", "ant,bee"] if form == "labelme" else []
    manifest = convert(root, tmp_path / "out", "--annotations", ann, "--annotation_masks", *extra)
    records = records_by_name(tmp_path / "out")
    expected = _expected_two()
    if form == "yolo":
        # Fractions back to pixels are not always the same floats: pycocotools' drawing of those.
        expected = np.zeros((30, 40), np.uint8)
        for cls, points in ((1, _TRIANGLE), (2, _QUAD)):
            flat = [v for x, y in points for v in (x / 40 * 40, y / 30 * 30)]
            expected[coco_mask.decode(coco_mask.frPyObjects([flat], 30, 40))[..., 0] == 1] = cls
    np.testing.assert_array_equal(_mask_of(records["a.png"]), expected)
    assert (_mask_of(records["plain.png"]) == 0).all()
    assert manifest.extra[schemas.TARGETS_SECTION]["mask"]["class_names"] == ["background", "ant", "bee"]


def test_append_draws_the_new_images_masks_and_adds_their_pixels(tmp_path):
    root = tmp_path / "images"
    write(root / "a.png", encode(pixels(1, size=(30, 40)), "PNG"))
    square = [[4, 4, 20, 4, 20, 20, 4, 20]]
    doc = {"images": [{"id": 1, "file_name": "a.png", "width": 40, "height": 30}],
           "categories": [{"id": 1, "name": "ant"}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [4, 4, 16, 16], "iscrowd": 0,
                            "segmentation": square}]}
    ann = tmp_path / "instances.json"
    ann.write_text(json.dumps(doc))
    out = tmp_path / "out"
    convert(root, out, "--annotations", ann, "--annotation_masks")
    write(root / "b.png", encode(pixels(2, size=(30, 40)), "PNG"))
    doc["images"].append({"id": 2, "file_name": "b.png", "width": 40, "height": 30})
    doc["categories"].append({"id": 2, "name": "bee"})
    doc["annotations"].append({"id": 2, "image_id": 2, "category_id": 2, "bbox": [0, 0, 10, 10], "iscrowd": 0,
                               "segmentation": [[0, 0, 10, 0, 10, 10, 0, 10]]})
    ann.write_text(json.dumps(doc))
    manifest = convert(root, out, "--annotations", ann, "--annotation_masks", "--append")
    section = manifest.extra[schemas.TARGETS_SECTION]["mask"]
    assert section["class_names"] == ["background", "ant", "bee"]
    assert section["num_classes"] == 3
    b = _mask_of(records_by_name(out)["b.png"])
    assert b[:10, :10].min() == 2 and (b == 2).sum() == 100
    assert section["pixel_counts"]["train"] == {"0": 2 * 1200 - 256 - 100, "1": 256, "2": 100}
    # Boxes alone cannot be added to a dataset of boxes and masks: the message names the flag.
    write(root / "c.png", encode(pixels(3, size=(30, 40)), "PNG"))
    doc["images"].append({"id": 3, "file_name": "c.png", "width": 40, "height": 30})
    ann.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="--annotation_masks"):
        convert(root, out, "--annotations", ann, "--append")


def test_inspect_names_the_drawn_ids(coco):
    _, ann, _, manifest = coco
    from conversion.targets import masks as mask_kind

    shown = mask_kind.KIND.describe(manifest.extra[schemas.TARGETS_SECTION]["mask"], [], ["train"], 10)
    assert f"drawn from --annotations {ann}" in shown.head[0]
    names = [row[0] for row in shown.rows[1:]]
    assert "0 background" in names and "1 dog" in names and "255 (ignore)" in names


def test_cvat_rotated_boxes_ellipses_and_masks_are_read_as_regions():
    from conversion.targets.cvat import read_cvat

    xml = b"""<?xml version="1.0" encoding="utf-8"?>
<annotations><version>1.1</version>
  <meta><task><labels><label><name>ant</name></label></labels></task></meta>
  <image id="0" name="a.png" width="10" height="10">
    <box label="ant" xtl="1" ytl="3" xbr="9" ybr="7" rotation="90"/>
    <ellipse label="ant" cx="5" cy="5" rx="3" ry="2"/>
    <mask label="ant" rle="1, 2, 2, 1" left="1" top="1" width="3" height="2"/>
    <mask label="ant" rle="1, 2" left="1" top="1" width="3" height="2"/>
  </image>
</annotations>"""
    entry = read_cvat(xml, "annotations.xml", ["a.png"]).files["a.png"]
    kinds = [r[0] for r in entry["regions"]]
    assert kinds == ["rotated_box", "ellipse", "bitmap", "bitmap"]
    # A box 8 wide and 4 high about (5, 5), turned a quarter: 4 wide and 8 high.
    ids = annotation_masks.draw_ids({**entry, "boxes": entry["boxes"][:1], "regions": entry["regions"][:1]},
                                    10, 10, "uint8", "a.png")
    expected = np.zeros((10, 10), np.uint8)
    expected[1:9, 3:7] = 1
    np.testing.assert_array_equal(ids, expected)
    # The last mask's run lengths do not fill its 3 x 2 box: the image is a bad target.
    with pytest.raises(ImageRejected) as raised:
        annotation_masks.draw_ids(entry, 10, 10, "uint8", "a.png")
    assert raised.value.reason == "bad_target" and "3x2" in raised.value.message


def test_labelme_mask_shapes_draw_their_bitmaps(tmp_path):
    from conversion.targets.labelme import read_labelme

    bits = np.zeros((3, 4), np.uint8)
    bits[0, 1:3] = 1
    bits[2, :] = 1
    buf = io.BytesIO()
    Image.fromarray(bits * 255).save(buf, "PNG")
    shapes = [{"label": "ant", "shape_type": "mask", "points": [[2.0, 1.0], [5.0, 3.0]],
               "mask": base64.b64encode(buf.getvalue()).decode()},
              {"label": "ant", "shape_type": "mask", "points": [[0, 0], [1, 1]]}]
    doc = {"imagePath": "a.png", "imageWidth": 8, "imageHeight": 6, "shapes": shapes}
    found = read_labelme([("a.json", json.dumps(doc).encode())], str(tmp_path), str(tmp_path), ["a.png"],
                         class_names=("ant",))
    entry = found.files["a.png"]
    first = {**entry, "boxes": entry["boxes"][:1], "regions": entry["regions"][:1]}
    expected = np.zeros((6, 8), np.uint8)
    expected[1:4, 2:6] = bits
    np.testing.assert_array_equal(annotation_masks.draw_ids(first, 8, 6, "uint8", "a.png"), expected)
    with pytest.raises(ImageRejected) as raised:
        annotation_masks.draw_ids(entry, 8, 6, "uint8", "a.png")
    assert raised.value.reason == "bad_target" and "no 'mask' bitmap" in raised.value.message


def test_voc_boxes_draw_rectangles_and_difficult_objects_are_ignored(tmp_path):
    root = tmp_path / "images"
    write(root / "a.png", encode(pixels(1, size=(30, 40)), "PNG"))

    def obj(name, box, difficult):
        x0, y0, x1, y1 = box
        return (f"<object><name>{name}</name><difficult>{difficult}</difficult><bndbox><xmin>{x0}</xmin>"
                f"<ymin>{y0}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>")
    # VOC's corners are 1-based pixels, both inclusive: xmin 3 .. xmax 10 are the columns 2..9.
    xml = ("<annotation><filename>a.png</filename><size><width>40</width><height>30</height></size>"
           + obj("dog", (3, 2, 10, 12), 0) + obj("cat", (8, 10, 20, 25), 0) + obj("dog", (30, 1, 40, 5), 1)
           + "</annotation>")
    write(tmp_path / "voc" / "a.xml", xml.encode())
    manifest = convert(root, tmp_path / "out", "--annotations", tmp_path / "voc", "--annotation_masks")
    expected = np.zeros((30, 40), np.uint8)
    expected[1:12, 2:10] = 2  # dog: class 1 of (cat, dog)
    expected[9:25, 7:20] = 1  # cat, drawn over the dog
    expected[0:5, 29:40] = 255  # difficult: void, as VOC's own masks have it
    np.testing.assert_array_equal(_mask_of(records_by_name(tmp_path / "out")["a.png"]), expected)
    assert manifest.extra[schemas.TARGETS_SECTION]["mask"]["class_names"] == ["background", "cat", "dog"]
