"""LabelMe JSON files (conversion/targets/labelme.py): every shape boxed, through the real Beam runner.

The independent side is globox: it writes a COCO file and the LabelMe JSONs
of the same boxes (next to the images, LabelMe's way), and both conversions
must store the same boxes. The shapes globox does not write and every
malformed case are hand-made files.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import (
    boxes_in_pixels, convert, encode, globox_images, marked_photo, pixels, records_by_name,
    rows_by_path, upright_marker, write,
)

import schemas
from beam_jobs import convert as convert_module
from conversion.targets.labelme import read_labelme

_NAMES = ("bird", "cat", "dog")  # Sorted: LabelMe's classes are the labels found, sorted.


# --------------------------------------------------------------------------
# The same boxes, written by globox as COCO and as LabelMe JSONs next to the images


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    # The test extra installs it; only these tests need it.
    globox = pytest.importorskip("globox")
    base = tmp_path_factory.mktemp("labelme_twins")
    images = base / "images"
    sizes = {"a.png": (32, 24), "b.png": (40, 30), "c.png": (27, 33), "d.png": (32, 24)}
    annotations = globox_images(globox, images, sizes, _NAMES, 5)
    dataset = globox.AnnotationSet(annotations)
    dataset.save_coco(base / "instances.json", label_to_id={name: i for i, name in enumerate(_NAMES)},
                      imageid_to_id={a.image_id: i for i, a in enumerate(annotations)})
    dataset.save_labelme(images)  # x.json next to x.png, imagePath 'x.png'
    dataset.save_labelme(base / "apart")  # a folder of their own: imagePath 'x.png' is there no file
    coco = convert(images, base / "out_coco", "--annotations", base / "instances.json")
    labelme = convert(images, base / "out_labelme", "--annotations", images)
    return base, dataset, coco, labelme


def test_labelme_jsons_store_the_boxes_their_coco_twin_stores(twins):
    base, dataset, coco, labelme = twins
    from_coco, from_labelme = records_by_name(base / "out_coco"), records_by_name(base / "out_labelme")
    assert sorted(from_labelme) == sorted(from_coco) == sorted(a.image_id for a in dataset)
    assert labelme.targets["boxes"]["class_names"] == coco.targets["boxes"]["class_names"] == list(_NAMES)
    assert labelme.targets["boxes"]["format"] == "labelme"
    for name in from_coco:
        got, want = boxes_in_pixels(from_labelme[name]), boxes_in_pixels(from_coco[name])
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            np.testing.assert_allclose(g[:4], w[:4], atol=1e-3)
            assert g[4] == w[4]
    assert labelme.targets["boxes"]["counts"] == coco.targets["boxes"]["counts"]


def test_jsons_beside_the_images_are_skipped_as_inputs(twins):
    _, _, _, labelme = twins
    # The 4 JSONs under --input_dir are no images: skipped, not rejected.
    assert (labelme.counts["written"], labelme.counts["skipped"], labelme.counts["rejected"]) == (4, 4, 0)


def test_jsons_in_a_folder_of_their_own_find_their_images_by_name(twins):
    base, dataset, _, _ = twins
    documents = sorted((p.name, p.read_bytes()) for p in (base / "apart").iterdir())
    listed = sorted(a.image_id for a in dataset)
    boxes = read_labelme(documents, str(base / "apart"), str(base / "images"), listed)
    assert sorted(boxes.files) == listed
    assert boxes.invalid == {} and boxes.missing == ()


# --------------------------------------------------------------------------
# Hand-made: every shape type, imagePath forms, EXIF-turned photos, malformed files


def _doc(image_path, shapes, width=40, height=30, **extra) -> dict:
    return {"version": "5.4.1", "flags": {}, "shapes": shapes, "imagePath": image_path, "imageData": None,
            "imageHeight": height, "imageWidth": width, **extra}


def _shape(label, kind, points) -> dict:
    return {"label": label, "points": points, "group_id": None, "description": "", "shape_type": kind,
            "flags": {}}


_SHAPES = [
    _shape("cat", "rectangle", [[10, 12], [2, 1]]),  # corners in any order
    _shape("dog", "polygon", [[5, 5], [20, 6], [10, 25]]),
    _shape("cat", "circle", [[20, 15], [23, 19]]),  # radius 5
    _shape("dog", "line", [[1, 1], [30, 4]]),
    _shape("cat", "linestrip", [[3, 3], [9, 12], [6, 20]]),
    _shape("dog", "point", [[7, 7]]),  # no area: dropped when stored
    {"label": "cat", "points": [[1, 2], [3, 9], [8, 4]]},  # no shape_type: LabelMe reads a polygon
    _shape("dog", "cuboid", [[1, 1], [2, 2]]),
]
_BAD = {
    "not_json": None,
    "bad_points": _doc("../images/bad_points.png", [_shape("cat", "rectangle", [[1, 2], [3, "x"]])]),
    "short_rectangle": _doc("../images/short_rectangle.png", [_shape("cat", "rectangle", [[1, 2]])]),
    "no_label": _doc("../images/no_label.png", [_shape("", "polygon", [[1, 2], [3, 4], [5, 1]])]),
    "bad_size": _doc("../images/bad_size.png", [], width=40.5),
    "no_shapes": {"imagePath": "../images/no_shapes.png", "imageWidth": 40, "imageHeight": 30},
    "wrong_size": _doc("../images/wrong_size.png", [], width=41),
}


@pytest.fixture(scope="module")
def handmade(tmp_path_factory):
    base = tmp_path_factory.mktemp("labelme_handmade")
    images, anns = base / "images", base / "anns"
    names = ["shapes.png", "nested/empty.png", "unannotated.png", *(f"{n}.png" for n in _BAD)]
    for k, name in enumerate(names):
        write(images / name, encode(pixels(k, size=(30, 40)), "PNG"))
    write(anns / "shapes.json", json.dumps(_doc("..\\images\\shapes.png", _SHAPES, imageData="aGk=")).encode())
    write(anns / "nested" / "empty.json", json.dumps(_doc("../../images/nested/empty.png", [])).encode())
    write(anns / "gone.json", json.dumps(_doc("../images/gone.png", [])).encode())
    for name, doc in _BAD.items():
        write(anns / f"{name}.json", b"{ not json" if doc is None else json.dumps(doc).encode())
    marks = {name: marked_photo(orientation) for name, orientation in (("rot6.jpg", 6), ("rot3.jpg", 3))}
    for name, data in marks.items():
        write(images / name, data)
        w, h = (32, 48) if name == "rot6.jpg" else (48, 32)
        x0, y0, x1, y1 = upright_marker(data)
        write(anns / f"{name[:-4]}.json",
              json.dumps(_doc(f"../images/{name}", [_shape("cat", "rectangle", [[x0, y0], [x1, y1]])],
                              width=w, height=h)).encode())
    out = base / "out"
    manifest = convert(images, out, "--annotations", anns, "--max_reject_fraction", "0.9")
    return base, out, manifest, records_by_name(out)


def test_every_shape_type_is_boxed_by_its_extent(handmade):
    _, out, manifest, records = handmade
    boxes = manifest.targets["boxes"]
    assert boxes["format"] == "labelme"
    assert boxes["class_names"] == ["cat", "dog"]
    cat, dog = 0, 1
    np.testing.assert_allclose(boxes_in_pixels(records["shapes.png"]), [
        (2, 1, 10, 12, cat),
        (5, 5, 20, 25, dog),
        (15, 10, 25, 20, cat),
        (1, 1, 30, 4, dog),
        (3, 3, 9, 20, cat),
        (1, 2, 8, 9, cat),
    ], atol=1e-3)
    dropped = rows_by_path(out / schemas.NORMALIZED_FILENAME)["shapes.png"]["details"]["boxes"]["dropped"]
    assert {"shape": 6, "reason": "zero_area", "box": [7.0, 7.0, 7.0, 7.0]} in dropped
    assert {"shape": 8, "reason": "unsupported_shape"} in dropped
    assert boxes["issues"]["bbox_from_segmentation"] == 5
    assert boxes["issues"]["unsupported_shape"] == 1


def test_image_paths_relative_to_the_json_and_images_without_jsons(handmade):
    _, _, manifest, records = handmade
    assert boxes_in_pixels(records["nested/empty.png"]) == []
    assert "unannotated.png" not in records  # no JSON: skipped, as COCO's unnamed images
    assert manifest.targets["boxes"]["issues"]["missing_file"] == 1  # gone.json's image


def test_exif_photos_are_read_upright(handmade):
    _, out, _, records = handmade
    details = rows_by_path(out / schemas.NORMALIZED_FILENAME)
    for name in ("rot6.jpg", "rot3.jpg"):
        (box,) = boxes_in_pixels(records[name])
        np.testing.assert_allclose(box[:4], upright_marker(records[name][schemas.IMAGE.key]), atol=1.01, err_msg=name)
        assert details[name]["details"]["boxes"]["frame"] == "upright"


@pytest.mark.parametrize("name, says", [
    ("not_json", "LabelMe file not_json.json is not JSON"),
    ("bad_points", "LabelMe file bad_points.json shape 1 (rectangle): points [[1, 2], [3, \"x\"]] must be"),
    ("short_rectangle", "LabelMe file short_rectangle.json shape 1 (rectangle) has 1 points; a rectangle has 2"),
    ("no_label", "LabelMe file no_label.json shape 1 (polygon) has no label"),
    ("bad_size", "imageWidth 40.5 and imageHeight 30 must be whole numbers above 0"),
    ("no_shapes", "LabelMe file no_shapes.json has no 'shapes' list"),
    ("wrong_size", "the annotation's image size 41x30 is neither the photo's raw size 40x30"),
])
def test_malformed_file_rejects_its_image_saying_what_was_wrong(handmade, name, says):
    base, out, _, records = handmade
    rejects = rows_by_path(out / schemas.REJECTS_FILENAME)
    assert rejects[f"{name}.png"]["reason"] == "bad_target"
    assert says in rejects[f"{name}.png"]["message"]
    assert str(base) not in rejects[f"{name}.png"]["message"]
    assert f"{name}.png" not in records


# --------------------------------------------------------------------------
# read_labelme on its own: --class_names; which folders are LabelMe's


def test_class_names_order_the_classes_and_refuse_other_labels(tmp_path):
    doc = json.dumps(_doc("x.png", [_shape("b", "rectangle", [[1, 1], [4, 4]])])).encode()
    boxes = read_labelme([("x.json", doc)], str(tmp_path), str(tmp_path), ["x.png"], class_names=("z", "b"))
    assert boxes.class_names == ("z", "b")
    assert boxes.files["x.png"]["boxes"] == [[1, 1.0, 1.0, 4.0, 4.0, 1, 0]]
    refused = read_labelme([("x.json", doc)], str(tmp_path), str(tmp_path), ["x.png"], class_names=("z",))
    assert "LabelMe file x.json shape 1 (rectangle): label 'b' is not among --class_names (z)" in refused.invalid["x.png"]


def test_folder_of_neither_format_is_a_usage_error(tmp_path, capfd):
    write(tmp_path / "images" / "a.png", encode(pixels(0), "PNG"))
    write(tmp_path / "anns" / "notes.md", b"nothing here")
    status = convert_module.main(["--input_dir", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out"),
                                  "--annotations", str(tmp_path / "anns")])
    assert status == 2
    assert "LabelMe JSON files (*.json)" in capfd.readouterr().err


def test_image_path_resolves_under_a_bucket_url():
    # Two listed files have the name: only the imagePath, resolved from the JSON's folder, tells them apart.
    doc = json.dumps(_doc("../../images/sub/x.png", [])).encode()
    boxes = read_labelme([("nested/x.json", doc)], "gs://bucket/anns", "gs://bucket/images",
                         ["other/x.png", "sub/x.png"])
    assert sorted(boxes.files) == ["sub/x.png"]


def test_a_json_that_cannot_be_read_rejects_the_image_of_its_stem_only(tmp_path):
    from conversion.targets.labelme import read_labelme

    shape = {"label": "cat", "shape_type": "rectangle", "points": [[1, 1], [3, 3]]}
    good = json.dumps({"imagePath": "b.png", "shapes": [shape]}).encode()
    gone = FileNotFoundError(2, "No such file or directory", str(tmp_path / "ann" / "a.json"))
    found = read_labelme([("a.json", gone), ("b.json", good)], str(tmp_path / "ann"), str(tmp_path / "img"),
                         ["a.png", "b.png"])
    assert found.invalid == {"a.png": "LabelMe file a.json cannot be read (No such file or directory)"}
    assert sorted(found.files) == ["b.png"] and found.class_names == ("cat",)
