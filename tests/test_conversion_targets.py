"""End to end: COCO and VOC boxes, several labels and numbers, from files on disk to records read back.

Images are written by Pillow, annotations as COCO's and VOC's tools write them (JSON and XML
written here); records are read back with the schema (`schema.decode`), images with Pillow, and
every expected box is computed here from the annotation itself.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from helpers import convert, encode, oriented_jpeg, pixels, records_by_name, rows_by_path, write
from PIL import Image, ImageOps

import schemas
from beam_jobs import convert as convert_module
from conversion.targets.coco import read_coco
from conversion.targets.labels_csv import read_targets_csv
from conversion.targets.voc import read_voc

# float32, as the records store them.
_TOL = 1e-6


def _boxes_of(rec) -> list[tuple]:
    keys = [spec.key for spec in schemas.BOX_FEATURES]
    return list(zip(*(rec[k] for k in keys)))


def _assert_boxes(rec, expected):
    """The record's boxes equal `expected` [(xmin, ymin, xmax, ymax, label, is_crowd)], in order."""
    got = _boxes_of(rec)
    assert len(got) == len(expected), (got, expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g[:4], e[:4], atol=_TOL)
        assert tuple(g[4:]) == tuple(e[4:])


def _marker_box(image_bytes: bytes) -> tuple[int, int, int, int]:
    """(xmin, ymin, xmax, ymax) of the bright marker of a decoded image, pixel edges included."""
    arr = np.asarray(Image.open(io.BytesIO(image_bytes)).convert("L"))
    ys, xs = np.nonzero(arr > 127)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def _coco_expected(doc, image_id, size):
    """The stored boxes of a COCO image, from its annotations: declared categories, clipped, non-empty."""
    label_of = {c["id"]: i for i, c in enumerate(sorted(doc["categories"], key=lambda c: c["id"]))}
    w, h = size
    out = []
    for ann in sorted(doc["annotations"], key=lambda a: a["id"]):
        if ann["image_id"] != image_id or ann["category_id"] not in label_of:
            continue
        x, y, bw, bh = ann["bbox"]
        x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + bw, w), min(y + bh, h)
        if x1 > x0 and y1 > y0:
            out.append((x0 / w, y0 / h, x1 / w, y1 / h, label_of[ann["category_id"]], ann.get("iscrowd", 0)))
    return out


# --------------------------------------------------------------------------
# COCO


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    base = tmp_path_factory.mktemp("coco")
    root = base / "images"
    sizes = {}
    for i in range(6):
        write(root / "photos" / f"p{i}.png", encode(pixels(i, size=(24, 32)), "PNG"))
        sizes[f"photos/p{i}.png"] = (32, 24)
    write(root / "photos" / "extra.png", encode(pixels(9, size=(24, 32)), "PNG"))
    write(root / "photos" / "mismatch.png", encode(pixels(10, size=(24, 32)), "PNG"))
    # Phone photos stored on their side: raw frame 48 wide, 32 high, shown 32 wide, 48 high.
    raw6 = np.zeros((32, 48, 3), np.uint8)
    raw6[6:14, 4:16] = 255  # The marker, on the raw frame: x 4..16, y 6..14.
    write(root / "photos" / "rot6.jpg", oriented_jpeg(raw6, 6))
    raw8 = np.zeros((32, 48, 3), np.uint8)
    raw8[4:12, 30:44] = 255
    rot8 = oriented_jpeg(raw8, 8)
    write(root / "photos" / "rot8.jpg", rot8)
    # Drawn on the upright photo: where a viewer (Pillow) shows the marker.
    upright8 = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(rot8))).convert("L"))
    ys, xs = np.nonzero(upright8 > 127)
    mx0, my0, mx1, my1 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
    doc = {
        "info": {"description": "test"},
        "images": [
            {"id": 1, "file_name": "photos/p0.png", "width": 32, "height": 24},
            {"id": 2, "file_name": "photos/p1.png", "width": 32, "height": 24},
            {"id": 3, "file_name": "photos/p2.png", "width": 32, "height": 24},
            {"id": 4, "file_name": "photos/p3.png", "width": 32, "height": 24},
            {"id": 5, "file_name": "photos/p4.png", "width": 32, "height": 24},  # no annotations
            {"id": 6, "file_name": "p5.png", "width": 32, "height": 24},  # a bare, unique name
            {"id": 7, "file_name": "photos/nowhere.png", "width": 32, "height": 24},
            {"id": 8, "file_name": "photos/rot6.jpg", "width": 48, "height": 32},  # the raw frame
            {"id": 9, "file_name": "photos/rot8.jpg", "width": 32, "height": 48},  # upright
            {"id": 10, "file_name": "photos/mismatch.png", "width": 100, "height": 90},
        ],
        # Non-contiguous ids, not in id order.
        "categories": [{"id": 90, "name": "zebra", "supercategory": "animal"},
                       {"id": 1, "name": "person", "supercategory": "person"},
                       {"id": 3, "name": "car", "supercategory": "vehicle"}],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 1, "bbox": [2, 3, 10, 8], "iscrowd": 0, "area": 80},
            {"id": 4, "image_id": 1, "category_id": 90, "bbox": [0, 0, 32, 24], "iscrowd": 1, "area": 768},
            {"id": 11, "image_id": 2, "category_id": 3, "bbox": [20, 10, 20, 20], "iscrowd": 0},  # outside
            {"id": 12, "image_id": 2, "category_id": 1, "bbox": [5, 5, 0, 4], "iscrowd": 0},  # zero area
            {"id": 13, "image_id": 3, "category_id": 2, "bbox": [1, 1, 4, 4], "iscrowd": 0},  # undeclared
            {"id": 14, "image_id": 999, "category_id": 1, "bbox": [1, 1, 4, 4], "iscrowd": 0},  # no image
            {"id": 15, "image_id": 3, "category_id": 3, "bbox": [1.5, 2.25, 4.0, 4.5], "iscrowd": 0},
            {"id": 16, "image_id": 4, "category_id": 90, "bbox": [8, 4, 8, 8], "iscrowd": 0},
            {"id": 17, "image_id": 6, "category_id": 90, "bbox": [0, 0, 8, 8], "iscrowd": 0},
            {"id": 20, "image_id": 8, "category_id": 1, "bbox": [4, 6, 12, 8], "iscrowd": 0},
            {"id": 21, "image_id": 9, "category_id": 3, "bbox": [mx0, my0, mx1 - mx0, my1 - my0], "iscrowd": 0},
            {"id": 22, "image_id": 10, "category_id": 1, "bbox": [1, 1, 4, 4], "iscrowd": 0},
        ],
    }
    ann = base / "instances.json"
    ann.write_text(json.dumps(doc))
    out = base / "out"
    manifest = convert(root, out, "--annotations", ann, "--max_reject_fraction", "0.5")
    return doc, ann, out, manifest


def test_coco_boxes_are_the_annotations_normalised(coco):
    doc, _, out, manifest = coco
    records = records_by_name(out)
    names = {im["id"]: im["file_name"] for im in doc["images"]}
    for image_id in (1, 2, 3, 4, 5):
        rec = records[names[image_id]]
        _assert_boxes(rec, _coco_expected(doc, image_id, (32, 24)))
        assert rec[schemas.LABEL.key] == -1
    _assert_boxes(records["photos/p5.png"], _coco_expected(doc, 6, (32, 24)))
    assert _boxes_of(records["photos/p4.png"]) == []
    # Annotation order (by id): the crowd box (id 4) before id 10.
    assert records["photos/p0.png"][schemas.BBOX_IS_CROWD.key] == (1, 0)
    assert manifest.class_names == ()
    boxes = manifest.targets["boxes"]
    assert boxes["class_names"] == ["person", "car", "zebra"]
    assert boxes["category_ids"] == [1, 3, 90]
    assert boxes["format"] == "coco"


def test_coco_rotated_photos_boxes_land_on_the_marker(coco):
    doc, _, out, _ = coco
    records = records_by_name(out)
    for name in ("photos/rot6.jpg", "photos/rot8.jpg"):
        rec = records[name]
        w, h = rec[schemas.WIDTH.key], rec[schemas.HEIGHT.key]
        assert (w, h) == (32, 48)  # Stored upright.
        (x0, y0, x1, y1, _, _), = _boxes_of(rec)
        marker = _marker_box(rec[schemas.IMAGE.key])
        np.testing.assert_allclose((x0 * w, y0 * h, x1 * w, y1 * h), marker, atol=1.01)
    # Orientation 6 turns the raw (x, y) to (raw height - y, x): computed here from the annotation.
    x, y, bw, bh = doc["annotations"][9]["bbox"]
    _assert_boxes(records["photos/rot6.jpg"], [((32 - (y + bh)) / 32, x / 48, (32 - y) / 32, (x + bw) / 48, 0, 0)])
    normalized = rows_by_path(out / schemas.NORMALIZED_FILENAME)
    assert normalized["photos/rot6.jpg"]["actions"] == ["exif_transpose", "boxes_exif_transpose"]
    assert normalized["photos/rot6.jpg"]["details"]["boxes"]["frame"] == "raw"
    assert normalized["photos/rot8.jpg"]["actions"] == ["exif_transpose"]
    assert normalized["photos/rot8.jpg"]["details"]["boxes"]["frame"] == "upright"


def test_coco_problems_are_listed(coco):
    _, _, out, manifest = coco
    rejects = rows_by_path(out / schemas.REJECTS_FILENAME)
    assert rejects["photos/nowhere.png"]["reason"] == "missing_file"
    assert rejects["photos/extra.png"]["reason"] == "no_label"
    assert rejects["photos/extra.png"]["message"] == "not in the annotations"
    bad = rejects["photos/mismatch.png"]
    assert bad["reason"] == "bad_target" and "100x90" in bad["message"] and "32x24" in bad["message"]
    assert manifest.counts == {"found": 11, "written": 8, "rejected": 2, "skipped": 1}
    normalized = rows_by_path(out / schemas.NORMALIZED_FILENAME)
    p1 = normalized["photos/p1.png"]
    assert p1["actions"] == ["boxes_clipped", "boxes_dropped"]
    assert p1["details"]["boxes"]["clipped"] == [
        {"annotation_id": 11, "from": [20.0, 10.0, 40.0, 30.0], "to": [20.0, 10.0, 32.0, 24.0]}]
    assert [(d["annotation_id"], d["reason"]) for d in p1["details"]["boxes"]["dropped"]] == [(12, "zero_area")]
    assert [(d["annotation_id"], d["reason"]) for d in normalized["photos/p2.png"]["details"]["boxes"]["dropped"]] \
        == [(13, "unknown_category")]
    boxes = manifest.targets["boxes"]
    assert boxes["issues"] == {"clipped": 1, "missing_file": 1, "unknown_category": 1, "unknown_image": 1,
                               "zero_area": 1}


def test_coco_counts_in_the_manifest(coco):
    doc, ann, out, manifest = coco
    records = records_by_name(out)
    counts, without = {}, {}
    for rec in records.values():
        split = counts.setdefault(rec["split"], [0, 0, 0])
        for label in rec[schemas.BBOX_LABEL.key]:
            split[label] += 1
        without[rec["split"]] = without.get(rec["split"], 0) + (not rec[schemas.BBOX_LABEL.key])
    boxes = manifest.targets["boxes"]
    assert boxes["counts"] == counts == {"train": [2, 3, 3]}
    assert boxes["images_without_boxes"] == without == {"train": 1}
    assert boxes["source"] == str(ann)
    assert manifest.targets.keys() == {"boxes"}
    assert set(schemas.ImageExampleSchema.from_json(manifest.features).targets) == {"boxes"}


def test_coco_resume_keeps_shards_and_their_box_counts(coco, tmp_path):
    _, ann, out, _ = coco
    root = out.parent / "images"
    resumed = tmp_path / "resumed"
    # 2 of 10 rejected is over the default 0.1: every shard and receipt is written, no manifest.
    with pytest.raises(Exception, match="max_reject_fraction"):
        convert(root, resumed, "--annotations", ann)
    assert not (resumed / schemas.MANIFEST_FILENAME).exists()
    shards = {p.name: p.stat().st_mtime_ns for p in resumed.glob("*.tfrecord")}
    assert shards
    convert(root, resumed, "--annotations", ann, "--max_reject_fraction", "0.5", "--resume")
    assert {p.name: p.stat().st_mtime_ns for p in resumed.glob("*.tfrecord")} == shards  # Kept, not rewritten.
    for path in sorted(out.iterdir()):
        assert (resumed / path.name).read_bytes() == path.read_bytes(), path.name


# --------------------------------------------------------------------------
# VOC


def _voc_xml(filename, size, objects) -> str:
    """A Pascal VOC annotation as LabelImg writes it."""
    parts = [f"<annotation><folder>VOC2012</folder><filename>{filename}</filename>"]
    if size:
        parts.append(f"<size><width>{size[0]}</width><height>{size[1]}</height><depth>3</depth></size>")
    for name, (x0, y0, x1, y1), difficult in objects:
        parts.append(
            f"<object><name>{name}</name><pose>Unspecified</pose><truncated>0</truncated>"
            f"<difficult>{difficult}</difficult><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin>"
            f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox>"
            # A part inside an object (VOC's person layout) is not a box of the image.
            + ("<part><name>head</name><bndbox><xmin>2</xmin><ymin>2</ymin><xmax>5</xmax>"
               "<ymax>5</ymax></bndbox></part>" if name == "person" else "")
            + "</object>")
    parts.append("</annotation>")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def voc(tmp_path_factory):
    base = tmp_path_factory.mktemp("voc")
    root = base / "images"
    write(root / "train" / "JPEGImages" / "000001.png", encode(pixels(1, size=(30, 40)), "PNG"))
    write(root / "val" / "JPEGImages" / "000002.png", encode(pixels(2, size=(30, 40)), "PNG"))
    write(root / "train" / "JPEGImages" / "000003.png", encode(pixels(3, size=(30, 40)), "PNG"))
    xml = base / "Annotations"
    objects1 = [("dog", (5, 6, 20, 25), 1), ("person", (1, 1, 40, 30), 0)]
    objects2 = [("bird", (10, 2, 45, 12), 0)]  # Past the right edge: clipped.
    write(xml / "000001.xml", _voc_xml("2008_000001.jpg", (40, 30), objects1).encode())
    write(xml / "000002.xml", _voc_xml("some_other_name.jpg", None, objects2).encode())
    write(xml / "000009.xml", _voc_xml("000009.jpg", (40, 30), [("cat", (1, 1, 5, 5), 0)]).encode())
    out = base / "out"
    manifest = convert(root, out, "--annotations", xml, "--max_reject_fraction", "0.5")
    return {"000001": objects1, "000002": objects2}, out, manifest


def test_voc_boxes_by_the_xml_files_stem(voc):
    objects, out, manifest = voc
    records = records_by_name(out)
    names = ["bird", "cat", "dog", "person"]  # Sorted object names, of every XML file.
    assert manifest.targets["boxes"]["class_names"] == names
    assert manifest.targets["boxes"]["category_ids"] is None
    assert manifest.targets["boxes"]["format"] == "voc"
    for stem, path, split in (("000001", "train/JPEGImages/000001.png", "train"),
                              ("000002", "val/JPEGImages/000002.png", "validation")):
        expected = []
        for name, (x0, y0, x1, y1), difficult in objects[stem]:
            # 1-based corners: the min corner moves by one pixel, the max corner stays.
            expected.append(((x0 - 1) / 40, (y0 - 1) / 30, min(x1, 40) / 40, min(y1, 30) / 30,
                             names.index(name), difficult))
        _assert_boxes(records[path], expected)
        assert records[path]["split"] == split
        assert records[path][schemas.LABEL.key] == -1
    rejects = rows_by_path(out / schemas.REJECTS_FILENAME)
    assert rejects["train/JPEGImages/000003.png"]["reason"] == "no_label"
    assert rejects["000009"]["reason"] == "missing_file"
    assert manifest.counts == {"found": 4, "written": 2, "rejected": 1, "skipped": 1}
    assert manifest.targets["boxes"]["counts"] == {"train": [0, 0, 1, 1], "validation": [1, 0, 0, 0]}
    assert manifest.targets["boxes"]["issues"] == {"clipped": 1, "missing_file": 1}


def test_voc_is_deterministic(voc, tmp_path):
    _, out, _ = voc
    again = tmp_path / "again"
    root = out.parent / "images"
    convert(root, again, "--annotations", out.parent / "Annotations", "--max_reject_fraction", "0.5")
    for path in sorted(out.iterdir()):
        assert (again / path.name).read_bytes() == path.read_bytes(), path.name


def test_annotations_with_class_folders_keep_image_labels(tmp_path):
    root = tmp_path / "images"
    doc = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    for k, rel in enumerate(["cat/a.png", "cat/b.png", "dog/c.png"], start=1):
        write(root / rel, encode(pixels(k), "PNG"))
        doc["images"].append({"id": k, "file_name": rel, "width": 32, "height": 24})
        doc["annotations"].append({"id": k, "image_id": k, "category_id": 1, "bbox": [1, 1, 5, 5]})
    (tmp_path / "ann.json").write_text(json.dumps(doc))
    manifest = convert(root, tmp_path / "out", "--annotations", tmp_path / "ann.json")
    assert manifest.class_names == ("cat", "dog")
    records = records_by_name(tmp_path / "out")
    assert {name: rec[schemas.LABEL.key] for name, rec in records.items()} == {
        "cat/a.png": 0, "cat/b.png": 0, "dog/c.png": 1}


# --------------------------------------------------------------------------
# Several labels, numbers


def test_multi_label_csv(tmp_path):
    root = tmp_path / "images"
    rows = {"a.png": "cat|dog", "b.png": "cat|cat", "c.png": "dog", "d.png": "bird|cat"}
    for k, name in enumerate(rows):
        write(root / name, encode(pixels(k), "PNG"))
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("path,label\n" + "".join(f"{p},{label}\n" for p, label in rows.items()))
    manifest = convert(root, tmp_path / "out", "--labels_csv", csv_path)
    names = sorted({n for label in rows.values() for n in label.split("|")})
    assert manifest.class_names == tuple(names)
    records = records_by_name(tmp_path / "out")
    for path, label in rows.items():
        assert records[path][schemas.LABELS.key] == tuple(sorted({names.index(n) for n in label.split("|")}))
        assert records[path][schemas.LABEL.key] == -1
    per_class = [sum(n in label.split("|") for label in rows.values()) for n in names]
    assert manifest.targets == {"labels": {"counts": {"train": per_class}}}


def test_regression_csv(tmp_path):
    root = tmp_path / "images"
    rows = {"a.png": "0.5|1.25", "b.png": "-3|2e3", "c.png": "nan|1"}
    for k, name in enumerate(rows):
        write(root / name, encode(pixels(k), "PNG"))
    csv_path = tmp_path / "targets.csv"
    csv_path.write_text("path,target\n" + "".join(f"{p},{t}\n" for p, t in rows.items()))
    manifest = convert(root, tmp_path / "out", "--labels_csv", csv_path, "--max_reject_fraction", "0.5")
    records = records_by_name(tmp_path / "out")
    for path in ("a.png", "b.png"):
        want = np.array([float(v) for v in rows[path].split("|")], np.float32)
        np.testing.assert_array_equal(np.array(records[path][schemas.TARGET.key], np.float32), want)
        assert records[path][schemas.LABEL.key] == -1
    assert manifest.targets == {"target": {"length": 2}}
    assert manifest.class_names == ()
    rejects = rows_by_path(tmp_path / "out" / schemas.REJECTS_FILENAME)
    assert rejects["c.png"]["reason"] == "bad_target"


def test_targets_csv_errors_name_the_row():
    with pytest.raises(ValueError, match=r"row 3: 1 targets, but the rows before have 2"):
        read_targets_csv("path,target\na.png,1|2\nb.png,3\n", "t.csv")
    with pytest.raises(ValueError, match=r"row 2: target must be numbers"):
        read_targets_csv("path,target\na.png,big\n", "t.csv")
    assert read_targets_csv("path,label\na.png,cat\n", "t.csv") is None


def test_bad_targets_csv_is_a_usage_error(tmp_path, capsys):
    root = tmp_path / "images"
    write(root / "a.png", encode(pixels(0), "PNG"))
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("path,target\na.png,one\n")
    status = convert_module.main(["--input_dir", str(root), "--output_dir", str(tmp_path / "out"),
                                  "--labels_csv", str(csv_path)])
    assert status == 2
    assert "row 2" in capsys.readouterr().err


def test_voc_unreadable_xml_and_ambiguous_stems():
    listed = ["JPEGImages/a.jpg", "JPEGImages/b.jpg", "SegmentationClass/b.png", "c/x.jpg", "d/x.jpg"]
    documents = [
        ("a.xml", b"<annotation><object><name>dog"),  # cut short
        ("b.xml", _voc_xml("b.jpg", (4, 4), [("dog", (1, 1, 2, 2), 0)]).encode()),  # the tag breaks the tie
        ("x.xml", _voc_xml("elsewhere.jpg", (4, 4), [("cat", (1, 1, 2, 2), 0)]).encode()),
    ]
    found = read_voc(documents, "ann", listed)
    assert found.invalid.keys() == {"JPEGImages/a.jpg"}
    assert "not valid XML" in found.invalid["JPEGImages/a.jpg"]
    assert found.files.keys() == {"JPEGImages/b.jpg"}
    assert found.files["JPEGImages/b.jpg"]["boxes"] == [[1, 0.0, 0.0, 2.0, 2.0, 1, 0]]
    assert found.issues == {"ambiguous_image": 1}
    assert found.class_names == ("cat", "dog")


def test_voc_xml_that_cannot_be_read_rejects_its_image_only():
    listed = ["JPEGImages/a.jpg", "JPEGImages/b.jpg"]
    gone = FileNotFoundError(2, "No such file or directory", "/ann/a.xml")
    documents = [("a.xml", gone), ("b.xml", _voc_xml("b.jpg", (4, 4), [("dog", (1, 1, 2, 2), 0)]).encode())]
    found = read_voc(documents, "ann", listed)
    assert found.invalid == {"JPEGImages/a.jpg": "annotation a.xml in --annotations ann cannot be read "
                                                 "(No such file or directory)"}
    assert found.files.keys() == {"JPEGImages/b.jpg"} and found.class_names == ("dog",)


def test_coco_bare_names_must_be_unique():
    doc = {"images": [{"id": 1, "file_name": "x.jpg"}, {"id": 2, "file_name": "a/y.jpg"}],
           "categories": [], "annotations": []}
    found = read_coco(json.dumps(doc).encode(), "ann.json", ["c/x.jpg", "d/x.jpg", "b/y.jpg"])
    assert found.files.keys() == {"b/y.jpg"}
    assert [path for path, _ in found.missing] == ["x.jpg"]
    with pytest.raises(ValueError, match="not a JSON file"):
        read_coco(b"{", "ann.json", [])


def test_coco_an_image_id_given_to_two_files_rejects_both(tmp_path):
    # Two exports concatenated (each numbering its images from 1): id 1 names two files.
    root = tmp_path / "images"
    first = np.full((20, 20, 3), 40, np.uint8)
    first[2:8, 2:8] = 255
    second = np.full((20, 20, 3), 40, np.uint8)
    second[12:18, 12:18] = 255
    write(root / "task1" / "a.png", encode(first, "PNG"))
    write(root / "task2" / "a.png", encode(second, "PNG"))
    write(root / "task2" / "b.png", encode(second, "PNG"))
    doc = {"images": [{"id": 1, "file_name": "task1/a.png", "width": 20, "height": 20},
                      {"id": 1, "file_name": "task2/a.png", "width": 20, "height": 20},
                      {"id": 2, "file_name": "task2/b.png", "width": 20, "height": 20}],
           "categories": [{"id": 1, "name": "square"}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 2, 6, 6], "iscrowd": 0},
                           {"id": 2, "image_id": 2, "category_id": 1, "bbox": [12, 12, 6, 6], "iscrowd": 0}]}
    (tmp_path / "ann.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    manifest = convert(root, out, "--annotations", tmp_path / "ann.json", "--max_reject_fraction", "0.9")
    # Neither file is stored with the other's box (nor with none): both are rejected, saying why.
    assert set(records_by_name(out)) == {"task2/b.png"}
    rejects = rows_by_path(out / schemas.REJECTS_FILENAME)
    for path in ("task1/a.png", "task2/a.png"):
        assert rejects[path]["reason"] == "bad_target"
        assert "image id 1 to 2 images (task1/a.png, task2/a.png)" in rejects[path]["message"]
    assert manifest.targets["boxes"]["issues"] == {"duplicate_image_id": 1}
    assert manifest.counts == {"found": 3, "written": 1, "rejected": 2, "skipped": 0}


def test_coco_an_image_entry_repeated_keeps_its_boxes():
    entry = {"id": 7, "file_name": "a.jpg", "width": 4, "height": 4}
    doc = {"images": [entry, dict(entry), {"id": 8, "file_name": "a.jpg", "width": 4, "height": 4}],
           "categories": [{"id": 1, "name": "dot"}],
           "annotations": [{"id": 1, "image_id": 7, "category_id": 1, "bbox": [1, 1, 2, 2]},
                           {"id": 2, "image_id": 8, "category_id": 1, "bbox": [0, 0, 1, 1]}]}
    found = read_coco(json.dumps(doc).encode(), "ann.json", ["a.jpg"])
    # The same entry twice is one image; another id naming its file again is ignored, and counted.
    assert found.files["a.jpg"]["boxes"] == [[1, 1.0, 1.0, 3.0, 3.0, 0, 0]]
    assert found.invalid == {}
    assert found.issues == {"duplicate_image": 1}


def test_voc_namespaced_xml_keeps_its_boxes_and_other_xml_is_refused():
    plain = _voc_xml("a.jpg", (8, 8), [("dog", (2, 3, 6, 7), 0)])
    namespaced = plain.replace("<annotation>", '<annotation xmlns="http://example.org/voc">', 1)
    # An XML file that is no VOC annotation (CVAT's own format, say) beside an image of its stem.
    cvat = '<?xml version="1.0"?><annotations><version>1.1</version></annotations>'
    listed = ["a.jpg", "b.jpg"]
    found = read_voc([("a.xml", b"\xef\xbb\xbf" + namespaced.encode()), ("b.xml", cvat.encode())], "ann", listed)
    assert found.files["a.jpg"]["boxes"] == [[1, 1.0, 2.0, 6.0, 7.0, 0, 0]]
    assert found.files["a.jpg"]["size"] == [8, 8]
    assert found.class_names == ("dog",)
    assert "b.jpg" not in found.files
    assert "its root element is <annotations>, not <annotation>" in found.invalid["b.jpg"]


def test_coco_ids_and_iscrowd_written_as_text():
    # Category ids as text are read as numbers, in the categories and the annotations alike.
    doc = {"images": [{"id": 1, "file_name": "a.jpg", "width": "10", "height": "10"}],
           "categories": [{"id": "1", "name": "x"}, {"id": 3, "name": "y"}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": "1", "bbox": [1, 1, 2, 2], "iscrowd": "0"},
                           {"id": 2, "image_id": 1, "category_id": 3.0, "bbox": ["1", "1", "2", "2"], "iscrowd": "1"},
                           {"id": 3, "image_id": 1, "category_id": "3", "bbox": [0, 0, 1, 1], "iscrowd": False}]}
    found = read_coco(json.dumps(doc).encode(), "ann.json", ["a.jpg"])
    assert found.category_ids == (1, 3)
    assert found.files["a.jpg"]["boxes"] == [[1, 1.0, 1.0, 3.0, 3.0, 0, 0], [2, 1.0, 1.0, 3.0, 3.0, 1, 1],
                                             [3, 0.0, 0.0, 1.0, 1.0, 1, 0]]
    assert found.files["a.jpg"]["size"] == [10, 10]
    assert found.issues == {}


def test_coco_a_box_wholly_outside_the_image_is_said_apart_from_an_empty_one(tmp_path):
    root = tmp_path / "images"
    write(root / "a.png", encode(pixels(0, size=(20, 30)), "PNG"))
    doc = {"images": [{"id": 1, "file_name": "a.png", "width": 30, "height": 20}],
           "categories": [{"id": 1, "name": "thing"}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [40, 5, 6, 6]},  # right of it
                           {"id": 2, "image_id": 1, "category_id": 1, "bbox": [5, 5, -3, 4]},  # negative width
                           {"id": 3, "image_id": 1, "category_id": 1, "bbox": [5, 5, 4, 4]}]}
    (tmp_path / "ann.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    manifest = convert(root, out, "--annotations", tmp_path / "ann.json")
    _assert_boxes(records_by_name(out)["a.png"], [(5 / 30, 5 / 20, 9 / 30, 9 / 20, 0, 0)])
    dropped = rows_by_path(out / schemas.NORMALIZED_FILENAME)["a.png"]["details"]["boxes"]["dropped"]
    assert [(d["annotation_id"], d["reason"], d["box"]) for d in dropped] == [
        (1, "outside_image", [40.0, 5.0, 46.0, 11.0]), (2, "zero_area", [5.0, 5.0, 2.0, 9.0])]
    assert manifest.targets["boxes"]["issues"] == {"outside_image": 1, "zero_area": 1}


def test_coco_a_bare_name_of_several_files_says_which():
    doc = {"images": [{"id": 1, "file_name": "x.jpg"}, {"id": 2, "file_name": "gone.jpg"}],
           "categories": [], "annotations": []}
    found = read_coco(json.dumps(doc).encode(), "ann.json", ["c/x.jpg", "d/x.jpg"])
    missing = dict(found.missing)
    assert "2 files there have its name (c/x.jpg, d/x.jpg): give file_name relative to --input_dir" \
        in missing["x.jpg"]
    assert missing["gone.jpg"].endswith("(image id 2) but not found under --input_dir")


@pytest.mark.parametrize("kind", ["voc", "numbers"])
def test_class_names_without_image_classes_is_a_usage_error(tmp_path, capfd, kind):
    # Given to order VOC's box classes, or beside numeric targets: no image has a class of its own,
    # and the manifest would have named classes with every label -1.
    root = tmp_path / "images"
    write(root / "a.png", encode(pixels(0), "PNG"))
    if kind == "voc":
        write(tmp_path / "ann" / "a.xml", _voc_xml("a.png", (32, 24), [("dog", (1, 1, 5, 5), 0)]).encode())
        flags = ["--annotations", str(tmp_path / "ann")]
    else:
        (tmp_path / "t.csv").write_text("path,target\na.png,0.5\n")
        flags = ["--labels_csv", str(tmp_path / "t.csv")]
    status = convert_module.main(["--input_dir", str(root), "--output_dir", str(tmp_path / "out"), *flags,
                                  "--class_names", "dog,cat"])
    assert status == 2
    # Said by the process that plans (a child of this one): read from the file descriptor.
    assert "--class_names dog,cat names the images' own classes, but no image has one" in capfd.readouterr().err
    assert not (tmp_path / "out" / schemas.MANIFEST_FILENAME).exists()


def test_annotations_frame_says_on_which_frame_an_ambiguous_photos_boxes_were_drawn(tmp_path):
    # An upside-down phone photo (EXIF 3) keeps its size when turned: the annotation's width and
    # height cannot tell a box drawn on the raw frame from one drawn where a viewer shows it.
    root = tmp_path / "images"
    raw3 = np.zeros((32, 48, 3), np.uint8)
    raw3[4:12, 30:44] = 255
    rot3 = oriented_jpeg(raw3, 3)
    write(root / "photos" / "rot3.jpg", rot3)
    raw6 = np.zeros((32, 48, 3), np.uint8)
    write(root / "photos" / "rot6.jpg", oriented_jpeg(raw6, 6))
    upright3 = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(rot3))).convert("L"))
    ys, xs = np.nonzero(upright3 > 127)
    mx0, my0, mx1, my1 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
    doc = {
        "images": [{"id": 1, "file_name": "photos/rot3.jpg", "width": 48, "height": 32},
                   {"id": 2, "file_name": "photos/rot6.jpg", "width": 48, "height": 32}],  # raw size
        "categories": [{"id": 1, "name": "marker"}],
        "annotations": [
            # Drawn on the upright photo, as a tool that shows photos upright draws it.
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [mx0, my0, mx1 - mx0, my1 - my0], "iscrowd": 0},
            {"id": 2, "image_id": 2, "category_id": 1, "bbox": [1, 1, 4, 4], "iscrowd": 0},
        ],
    }
    ann = tmp_path / "instances.json"
    ann.write_text(json.dumps(doc))

    def marker_vs_box(out):
        rec = records_by_name(out)["photos/rot3.jpg"]
        w, h = rec[schemas.WIDTH.key], rec[schemas.HEIGHT.key]
        (x0, y0, x1, y1, _, _), = _boxes_of(rec)
        return np.array(_marker_box(rec[schemas.IMAGE.key])), np.array((x0 * w, y0 * h, x1 * w, y1 * h))

    convert(root, tmp_path / "auto", "--annotations", ann)
    marker, box = marker_vs_box(tmp_path / "auto")
    assert np.abs(marker - box).max() > 10  # Taken as drawn on the raw frame, turned: off the marker.
    manifest = convert(root, tmp_path / "upright", "--annotations", ann, "--annotations_frame", "upright",
                       "--max_reject_fraction", "0.5")
    marker, box = marker_vs_box(tmp_path / "upright")
    np.testing.assert_allclose(box, marker, atol=1.01)
    assert rows_by_path(tmp_path / "upright" / schemas.NORMALIZED_FILENAME)["photos/rot3.jpg"]["actions"] == ["exif_transpose"]
    assert manifest.options["annotations_frame"] == "upright"
    # A photo whose annotation gives the other frame's size is refused, naming the flag.
    rejects = rows_by_path(tmp_path / "upright" / schemas.REJECTS_FILENAME)
    assert rejects["photos/rot6.jpg"]["reason"] == "bad_target"
    assert "is not the photo's upright size 32x48" in rejects["photos/rot6.jpg"]["message"]
    assert "--annotations_frame upright" in rejects["photos/rot6.jpg"]["message"]


def test_annotations_frame_needs_annotations_or_masks(tmp_path, capfd):
    write(tmp_path / "in" / "a" / "x.png", encode(pixels(0), "PNG"))
    write(tmp_path / "in" / "b" / "y.png", encode(pixels(1), "PNG"))
    status = convert_module.main(["--input_dir", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"),
                                  "--annotations_frame", "upright"])
    assert status == 2
    assert "--annotations_frame says on which frame boxes or masks were drawn" in capfd.readouterr().err


def test_coco_an_annotation_with_polygons_but_no_bbox_is_boxed_around_them():
    # The format asks for both; some exporters write the polygons only.
    doc = {"images": [{"id": 1, "file_name": "a.jpg", "width": 40, "height": 30}],
           "categories": [{"id": 1, "name": "x"}],
           "annotations": [
               {"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0,
                "segmentation": [[2, 3, 12, 3, 12, 9], [20.5, 1, 25, 4, 21, 7.25]]},
               {"id": 2, "image_id": 1, "category_id": 1, "iscrowd": 1, "bbox": None,
                "segmentation": {"counts": [5, 10, 1185], "size": [30, 40]}},  # RLE: not boxed here
               {"id": 3, "image_id": 1, "category_id": 1, "bbox": [1, 2], "segmentation": [[0, 0, 5, 0, 5, 5]]},
               {"id": 4, "image_id": 1, "category_id": 1, "segmentation": [[0, 0, 5, "x", 5, 5]]}]}
    found = read_coco(json.dumps(doc).encode(), "ann.json", ["a.jpg"])
    assert found.files["a.jpg"]["boxes"] == [[1, 2.0, 1.0, 25.0, 9.0, 0, 0]]
    # A malformed bbox stays a bad one: only a missing one is made from the polygons.
    assert [d[:2] for d in found.files["a.jpg"]["dropped"]] == [[2, "bad_bbox"], [3, "bad_bbox"], [4, "bad_bbox"]]
    assert found.issues == {"bbox_from_segmentation": 1, "bad_bbox": 3}
