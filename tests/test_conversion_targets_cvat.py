"""CVAT for images 1.1 XML (conversion/targets/cvat.py): every shape boxed, through the real Beam runner.

The independent side is globox: it writes a COCO file and the CVAT XML of
the same boxes, and both conversions must store the same boxes. The shapes
globox does not write (polygons, rotated boxes, ellipses, masks, tags) and
every malformed case are hand-made files.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import (
    boxes_in_pixels, convert, encode, globox_images, marked_photo, pixels, records_by_name,
    rows_by_path, upright_marker, write,
)

import schemas
from beam_jobs import convert as convert_module
from conversion.targets.cvat import read_cvat

_NAMES = ("bird", "cat", "dog")  # Sorted: the classes of a CVAT file without <meta> labels.


# --------------------------------------------------------------------------
# The same boxes, written by globox as COCO and as CVAT XML


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    # The test extra installs it; only these tests need it.
    globox = pytest.importorskip("globox")
    base = tmp_path_factory.mktemp("cvat_twins")
    images = base / "images"
    sizes = {"a.png": (32, 24), "sub/b.png": (40, 30), "sub/deep/c.png": (27, 33), "d.png": (32, 24)}
    annotations = globox_images(globox, images, sizes, _NAMES, 7)
    dataset = globox.AnnotationSet(annotations)
    dataset.save_coco(base / "instances.json", label_to_id={name: i for i, name in enumerate(_NAMES)},
                      imageid_to_id={a.image_id: i for i, a in enumerate(annotations)})
    dataset.save_cvat(base / "annotations.xml")
    coco = convert(images, base / "out_coco", "--annotations", base / "instances.json")
    cvat = convert(images, base / "out_cvat", "--annotations", base / "annotations.xml")
    return base, dataset, coco, cvat


def test_cvat_xml_stores_the_boxes_its_coco_twin_stores(twins):
    base, dataset, coco, cvat = twins
    from_coco, from_cvat = records_by_name(base / "out_coco"), records_by_name(base / "out_cvat")
    assert sorted(from_cvat) == sorted(from_coco) == sorted(a.image_id for a in dataset)
    assert cvat.targets["boxes"]["class_names"] == coco.targets["boxes"]["class_names"] == list(_NAMES)
    assert cvat.targets["boxes"]["format"] == "cvat"
    for name in from_coco:
        got, want = boxes_in_pixels(from_cvat[name]), boxes_in_pixels(from_coco[name])
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            np.testing.assert_allclose(g[:4], w[:4], atol=1e-3)
            assert g[4] == w[4]
    assert cvat.targets["boxes"]["counts"] == coco.targets["boxes"]["counts"]
    assert cvat.targets["boxes"]["images_without_boxes"] == {"train": 1}


# --------------------------------------------------------------------------
# Hand-made: every shape, <meta> labels, EXIF-turned photos, malformed images

_XML = """<?xml version="1.0" encoding="utf-8"?>
<annotations>
  <version>1.1</version>
  <meta><task><id>3</id><labels>
    <label><name>zebra</name><type>any</type></label>
    <label><name>ant</name><type>any</type></label>
    <label><name>unused</name><type>any</type></label>
  </labels></task></meta>
  <image id="0" name="shapes.png" width="40" height="30">
    <box label="ant" source="manual" occluded="1" xtl="1" ytl="2" xbr="10" ybr="12" z_order="0"/>
    <box label="zebra" xtl="10" ytl="10" xbr="30" ybr="20" rotation="90.0"/>
    <polygon label="ant" points="5.5,5;20,6;10,25"/>
    <polyline label="zebra" points="1,1;30,2"/>
    <points label="ant" points="3,4;9,12"/>
    <ellipse label="zebra" cx="20" cy="15" rx="8" ry="4"/>
    <mask label="ant" rle="1, 2, 3" left="2" top="3" width="5" height="6"/>
    <tag label="zebra"/>
    <skeleton label="zebra"><points label="nose" points="1,1"/></skeleton>
  </image>
  <image id="1" name="folder/empty.png" width="40" height="30"></image>
  <image id="2" name="rotated45.png" width="40" height="30">
    <box label="zebra" xtl="10" ytl="10" xbr="30" ybr="20" rotation="45"/>
  </image>
  <image id="3" name="rot6.jpg" width="32" height="48">
    <box label="ant" xtl="{u6[0]}" ytl="{u6[1]}" xbr="{u6[2]}" ybr="{u6[3]}"/>
  </image>
  <image id="4" name="rot6_old.jpg" width="48" height="32">
    <box label="ant" xtl="4" ytl="6" xbr="16" ybr="14"/>
  </image>
  <image id="5" name="rot3.jpg" width="48" height="32">
    <box label="ant" xtl="{u3[0]}" ytl="{u3[1]}" xbr="{u3[2]}" ybr="{u3[3]}"/>
  </image>
  <image id="6" name="bad_number.png" width="40" height="30"><box label="ant" xtl="1" ytl="two" xbr="5" ybr="6"/></image>
  <image id="7" name="no_label.png" width="40" height="30"><box xtl="1" ytl="2" xbr="5" ybr="6"/></image>
  <image id="8" name="other_label.png" width="40" height="30"><box label="cow" xtl="1" ytl="2" xbr="5" ybr="6"/></image>
  <image id="9" name="bad_points.png" width="40" height="30"><polygon label="ant" points="1,2;3"/></image>
  <image id="10" name="bad_size.png" width="forty" height="30"></image>
  <image id="11" name="bad_rotation.png" width="40" height="30">
    <box label="ant" xtl="1" ytl="2" xbr="5" ybr="6" rotation="left"/>
  </image>
  <image id="12" name="wrong_size.png" width="41" height="30"><box label="ant" xtl="1" ytl="2" xbr="5" ybr="6"/></image>
  <image id="13" name="gone.png" width="40" height="30"></image>
  <image id="14" name="shapes.png" width="40" height="30"><box label="ant" xtl="0" ytl="0" xbr="5" ybr="5"/></image>
</annotations>
"""
_PLAIN = ("shapes.png", "folder/empty.png", "rotated45.png", "bad_number.png", "no_label.png", "other_label.png",
          "bad_points.png", "bad_size.png", "bad_rotation.png", "wrong_size.png", "unnamed.png")


@pytest.fixture(scope="module")
def handmade(tmp_path_factory):
    base = tmp_path_factory.mktemp("cvat_handmade")
    images = base / "images"
    for k, name in enumerate(_PLAIN):
        write(images / name, encode(pixels(k, size=(30, 40)), "PNG"))
    marks = {}
    for name, orientation in (("rot6.jpg", 6), ("rot6_old.jpg", 6), ("rot3.jpg", 3)):
        marks[name] = marked_photo(orientation)
        write(images / name, marks[name])
    (base / "annotations.xml").write_text(_XML.format(u6=upright_marker(marks["rot6.jpg"]), u3=upright_marker(marks["rot3.jpg"])))
    out = base / "out"
    manifest = convert(images, out, "--annotations", base / "annotations.xml", "--max_reject_fraction", "0.9")
    return base, out, manifest, records_by_name(out), marks


def test_meta_labels_give_the_classes_in_their_order(handmade):
    _, _, manifest, _, _ = handmade
    boxes = manifest.targets["boxes"]
    assert boxes["format"] == "cvat"
    assert boxes["class_names"] == ["zebra", "ant", "unused"]
    assert manifest.class_names == ()


def test_every_shape_is_boxed_by_its_extent(handmade):
    _, out, manifest, records, _ = handmade
    zebra, ant = 0, 1
    np.testing.assert_allclose(boxes_in_pixels(records["shapes.png"]), [
        (1, 2, 10, 12, ant),
        (15, 5, 25, 25, zebra),  # 20 x 10 turned by 90 degrees about (20, 15)
        (5.5, 5, 20, 25, ant),  # polygon
        (1, 1, 30, 2, zebra),  # polyline
        (3, 4, 9, 12, ant),  # points
        (12, 11, 28, 19, zebra),  # ellipse
        (2, 3, 7, 9, ant),  # mask: its left, top, width, height
    ], atol=1e-3)
    half = 15 * math.sqrt(0.5)  # (10 + 5) / sqrt(2): the extent of a 20 x 10 box turned by 45 degrees
    np.testing.assert_allclose(boxes_in_pixels(records["rotated45.png"]),
                               [(20 - half, 15 - half, 20 + half, 15 + half, zebra)], atol=1e-3)
    issues = manifest.targets["boxes"]["issues"]
    assert issues["bbox_from_segmentation"] == 3
    assert issues["bbox_from_rotation"] == 2
    assert issues["tag"] == 1
    assert issues["unsupported_shape"] == 1
    dropped = rows_by_path(out / schemas.NORMALIZED_FILENAME)["shapes.png"]["details"]["boxes"]["dropped"]
    assert dropped == [{"shape": 9, "reason": "unsupported_shape"}]  # the skeleton, listed


def test_images_without_shapes_are_kept_and_subfolders_found(handmade):
    _, _, manifest, records, _ = handmade
    assert boxes_in_pixels(records["folder/empty.png"]) == []
    assert manifest.targets["boxes"]["images_without_boxes"] == {"train": 1}
    assert "unnamed.png" not in records  # not in the XML: skipped, as COCO's
    assert manifest.targets["boxes"]["issues"]["duplicate_image"] == 1
    assert manifest.targets["boxes"]["issues"]["missing_file"] == 1


def test_exif_photos_upright_by_default_and_old_raw_exports_by_their_size(handmade):
    _, out, _, records, _ = handmade
    for name in ("rot6.jpg", "rot6_old.jpg", "rot3.jpg"):
        rec = records[name]
        (box,) = boxes_in_pixels(rec)
        np.testing.assert_allclose(box[:4], upright_marker(rec[schemas.IMAGE.key]), atol=1.01, err_msg=name)
    details = rows_by_path(out / schemas.NORMALIZED_FILENAME)
    assert details["rot6.jpg"]["details"]["boxes"]["frame"] == "upright"
    assert details["rot6_old.jpg"]["details"]["boxes"]["frame"] == "raw"  # older CVAT: the raw size
    # Turned by 180 degrees the sizes agree: the upright photo, as CVAT shows it.
    assert details["rot3.jpg"]["details"]["boxes"]["frame"] == "upright"


@pytest.mark.parametrize("name, says", [
    ("bad_number.png", "annotations.xml <image name='bad_number.png'> shape 1 <box>: xtl='1', ytl='two', "
                       "xbr='5', ybr='6': each must be a finite number"),
    ("no_label.png", "<image name='no_label.png'> shape 1 <box> has no label"),
    ("other_label.png", "label 'cow' is not among the file's <meta> labels (zebra, ant, unused)"),
    ("bad_points.png", "shape 1 <polygon>: points '1,2;3' must be 'x1,y1;x2,y2;...'"),
    ("bad_size.png", "width 'forty' and height '30' must be whole numbers above 0"),
    ("bad_rotation.png", "rotation='left': each must be a finite number"),
    ("wrong_size.png", "the annotation's image size 41x30 is neither the photo's raw size 40x30"),
])
def test_malformed_image_is_rejected_saying_what_was_wrong(handmade, name, says):
    base, out, _, records, _ = handmade
    rejects = rows_by_path(out / schemas.REJECTS_FILENAME)
    assert rejects[name]["reason"] == "bad_target"
    assert says in rejects[name]["message"]
    assert str(base) not in rejects[name]["message"]  # the file by its name, not its absolute path
    assert name not in records


# --------------------------------------------------------------------------
# read_cvat on its own: classes, --class_names, what is no CVAT for images file


def _xml(meta: str, *images: str) -> bytes:
    return f"<annotations><version>1.1</version><meta>{meta}</meta>{''.join(images)}</annotations>".encode()


def test_labels_used_sorted_without_meta_and_project_meta_order():
    image = ('<image id="0" name="x.png" width="10" height="10"><box label="b" xtl="1" ytl="1" xbr="2" ybr="2"/>'
             '<box label="a" xtl="1" ytl="1" xbr="2" ybr="2"/><tag label="t"/></image>')
    assert read_cvat(_xml("", image), "a.xml", ["x.png"]).class_names == ("a", "b")
    project = ("<project><labels><label><name>b</name></label><label><name>a</name></label>"
               "<label><name>nose</name><parent>b</parent></label></labels></project>")
    boxes = read_cvat(_xml(project, image), "a.xml", ["x.png"])
    assert boxes.class_names == ("b", "a")  # a skeleton's point label (with a <parent>) is no class
    assert [b[5] for b in boxes.files["x.png"]["boxes"]] == [0, 1]


def test_class_names_override_the_labels_and_refuse_others():
    image = '<image id="0" name="x.png" width="10" height="10"><box label="a" xtl="1" ytl="1" xbr="2" ybr="2"/></image>'
    meta = "<task><labels><label><name>a</name></label></labels></task>"
    boxes = read_cvat(_xml(meta, image), "a.xml", ["x.png"], class_names=("z", "a"))
    assert boxes.class_names == ("z", "a")
    assert boxes.files["x.png"]["boxes"][0][5] == 1
    refused = read_cvat(_xml(meta, image), "a.xml", ["x.png"], class_names=("z",))
    assert "label 'a' is not among --class_names (z)" in refused.invalid["x.png"]


@pytest.mark.parametrize("data, says", [
    (b"<annotations><image", "is not valid XML"),
    (b"<annotation><filename>x.png</filename></annotation>", "its root element is <annotation>, not <annotations>"),
    (b"<annotations><track id='0' label='a'><box frame='0' xtl='1' ytl='1' xbr='2' ybr='2'/></track></annotations>",
     "is a 'CVAT for video 1.1' export"),
])
def test_what_is_no_cvat_for_images_file_is_refused(data, says):
    with pytest.raises(ValueError) as e:
        read_cvat(data, "ann.xml", ["x.png"])
    assert says in str(e.value)


def test_unreadable_xml_is_a_usage_error_at_planning(tmp_path, capfd):
    write(tmp_path / "images" / "a.png", encode(pixels(0), "PNG"))
    (tmp_path / "annotations.xml").write_text("<annotations><image name='a.png'>")
    status = convert_module.main(["--input_dir", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out"),
                                  "--annotations", str(tmp_path / "annotations.xml")])
    assert status == 2
    assert "is not valid XML" in capfd.readouterr().err
    assert not (tmp_path / "out" / schemas.MANIFEST_FILENAME).exists()


def test_class_names_name_the_box_classes_of_a_conversion(tmp_path):
    write(tmp_path / "images" / "a.png", encode(pixels(0), "PNG"))
    (tmp_path / "annotations.xml").write_text(
        '<annotations><image id="0" name="a.png" width="32" height="24">'
        '<box label="dog" xtl="1" ytl="2" xbr="8" ybr="9"/></image></annotations>')
    manifest = convert(tmp_path / "images", tmp_path / "out", "--annotations", tmp_path / "annotations.xml",
                       "--class_names", "cat,dog")
    assert manifest.targets["boxes"]["class_names"] == ["cat", "dog"]
    assert manifest.class_names == ()
    assert boxes_in_pixels(records_by_name(tmp_path / "out")["a.png"]) == [pytest.approx((1, 2, 8, 9, 1))]


def test_append_keeps_the_held_classes_indices(tmp_path):
    images, xml = tmp_path / "images", tmp_path / "annotations.xml"
    write(images / "a.png", encode(pixels(1), "PNG"))
    box = '<box label="{}" xtl="1" ytl="2" xbr="8" ybr="9"/>'
    labels = "".join(f"<label><name>{n}</name></label>" for n in ("a", "b"))
    xml.write_bytes(_xml(f"<task><labels>{labels}</labels></task>",
                         f'<image id="0" name="a.png" width="32" height="24">{box.format("b")}</image>'))
    convert(images, tmp_path / "out", "--annotations", xml)
    # The grown task's labels in another order, with a new one first: the held indices stay.
    write(images / "b.png", encode(pixels(2), "PNG"))
    labels = "".join(f"<label><name>{n}</name></label>" for n in ("c", "b", "a"))
    xml.write_bytes(_xml(f"<task><labels>{labels}</labels></task>",
                         f'<image id="0" name="a.png" width="32" height="24">{box.format("b")}</image>',
                         f'<image id="1" name="b.png" width="32" height="24">{box.format("c")}{box.format("a")}</image>'))
    manifest = convert(images, tmp_path / "out", "--annotations", xml, "--append")
    assert manifest.targets["boxes"]["class_names"] == ["a", "b", "c"]
    assert [b[4] for b in boxes_in_pixels(records_by_name(tmp_path / "out")["b.png"])] == [2, 0]
    assert manifest.targets["boxes"]["counts"] == {"train": [1, 1, 1]}


def test_the_unpacked_exports_folder_is_read_as_its_annotations_xml(tmp_path):
    # CVAT's export: annotations.xml next to images/; the folder given is CVAT's, not a VOC folder.
    export = tmp_path / "export"
    write(export / "images" / "a.png", encode(pixels(0), "PNG"))
    (export / "annotations.xml").write_text(
        '<annotations><image id="0" name="a.png" width="32" height="24">'
        '<box label="dog" xtl="1" ytl="2" xbr="8" ybr="9"/></image></annotations>')
    manifest = convert(export / "images", tmp_path / "out", "--annotations", export)
    assert manifest.targets["boxes"]["format"] == "cvat"
    assert boxes_in_pixels(records_by_name(tmp_path / "out")["a.png"]) == [pytest.approx((1, 2, 8, 9, 0))]
