"""YOLO box labels (conversion/targets/yolo.py): Ultralytics and Darknet layouts, through the real Beam runner.

The independent side is globox: it writes a COCO file and the YOLO labels of
the same boxes, and both conversions must store the same boxes.
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
from conversion import listing
from conversion.targets.yolo import read_yolo

_NAMES = ("cat", "dog", "bird")


# --------------------------------------------------------------------------
# The same boxes, written by globox as COCO and as YOLO labels


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    # The test extra installs it; only these tests need it.
    globox = pytest.importorskip("globox")
    base = tmp_path_factory.mktemp("yolo_twins")
    images = base / "images"
    sizes = {"a.png": (32, 24), "b.png": (40, 30), "c.png": (27, 33), "d.png": (32, 24)}
    annotations = globox_images(globox, images, sizes, _NAMES, 11, least=0)
    # A phone photo stored on its side (EXIF 6): the boxes of both are drawn on the upright photo.
    rot6 = marked_photo(6)
    write(images / "rot6.jpg", rot6)
    mx0, my0, mx1, my1 = upright_marker(rot6)
    annotations.append(globox.Annotation("rot6.jpg", image_size=(32, 48), boxes=[
        globox.BoundingBox(label="dog", xmin=mx0, ymin=my0, xmax=mx1, ymax=my1)]))
    dataset = globox.AnnotationSet(annotations)
    label_to_id = {name: i for i, name in enumerate(_NAMES)}
    dataset.save_coco(base / "instances.json", label_to_id=label_to_id,
                      imageid_to_id={a.image_id: i for i, a in enumerate(annotations)})
    (base / "labels").mkdir()
    dataset.save_yolo_darknet(base / "labels", label_to_id=label_to_id)
    (base / "data.yaml").write_text("train: images\nnames: [cat, dog, bird]\n")
    coco = convert(images, base / "out_coco", "--annotations", base / "instances.json")
    yolo = convert(images, base / "out_yolo", "--annotations", base / "data.yaml")
    return base, dataset, coco, yolo


def test_yolo_labels_store_the_boxes_their_coco_twin_stores(twins):
    base, dataset, coco, yolo = twins
    from_coco, from_yolo = records_by_name(base / "out_coco"), records_by_name(base / "out_yolo")
    assert sorted(from_yolo) == sorted(from_coco) == sorted(a.image_id for a in dataset)
    assert yolo.targets["boxes"]["class_names"] == coco.targets["boxes"]["class_names"] == list(_NAMES)
    assert yolo.targets["boxes"]["format"] == "yolo"
    for name in from_coco:
        got, want = boxes_in_pixels(from_yolo[name]), boxes_in_pixels(from_coco[name])
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            # globox writes YOLO's fractions with a few decimals: within a tenth of a pixel.
            np.testing.assert_allclose(g[:4], w[:4], atol=0.1)
            assert g[4] == w[4]
    assert yolo.targets["boxes"]["counts"] == coco.targets["boxes"]["counts"]


def test_yolo_labels_are_read_on_the_upright_photo_by_default(twins):
    base, _, _, _ = twins
    rec = records_by_name(base / "out_yolo")["rot6.jpg"]
    assert (rec[schemas.WIDTH.key], rec[schemas.HEIGHT.key]) == (32, 48)
    (box,) = boxes_in_pixels(rec)
    np.testing.assert_allclose(box[:4], upright_marker(rec[schemas.IMAGE.key]), atol=1.01)
    details = rows_by_path(base / "out_yolo" / schemas.NORMALIZED_FILENAME)["rot6.jpg"]["details"]["boxes"]
    assert details["frame"] == "upright"


def test_yolo_labels_on_the_raw_frame_with_annotations_frame_raw(tmp_path):
    # Tools that ignore EXIF measure the raw frame: --annotations_frame raw turns their boxes.
    rot6 = marked_photo(6)
    write(tmp_path / "images" / "rot6.jpg", rot6)
    write(tmp_path / "labels" / "rot6.txt", f"0 {10 / 48} {10 / 32} {12 / 48} {8 / 32}\n".encode())
    (tmp_path / "labels" / "classes.txt").write_text("marker\n")
    convert(tmp_path / "images", tmp_path / "out", "--annotations", tmp_path / "labels",
            "--annotations_frame", "raw")
    rec = records_by_name(tmp_path / "out")["rot6.jpg"]
    (box,) = boxes_in_pixels(rec)
    np.testing.assert_allclose(box[:4], upright_marker(rec[schemas.IMAGE.key]), atol=1.01)


# --------------------------------------------------------------------------
# Ultralytics' layout: images/{train,val}, labels/{train,val}, data.yaml


@pytest.fixture(scope="module")
def ultralytics(tmp_path_factory):
    base = tmp_path_factory.mktemp("yolo_ultralytics")
    root = base / "ds"
    for split in ("train", "val"):
        for i in range(3):
            write(root / "images" / split / f"im{i}.png", encode(pixels(i, size=(24, 32)), "PNG"))
    write(root / "labels" / "train" / "im0.txt", b"0 0.5 0.5 0.25 0.5\n1 0.1 0.1 0.4 0.4\n")
    write(root / "labels" / "train" / "im1.txt", b"")  # empty: no boxes
    # im2 of train and of val: no label file, YOLO's background images.
    write(root / "labels" / "val" / "im0.txt", b"2 0.25 0.25 0.5 0.25 0.375 0.75\n")  # a polygon
    write(root / "labels" / "val" / "im1.txt", b"3 0.5 0.5 0.2 0.2\n")  # class 3 of 3
    write(root / "labels" / "val" / "ghost.txt", b"0 0.5 0.5 0.2 0.2\n")  # no image
    write(root / "labels" / "train.cache", b"Ultralytics' cache")
    (root / "data.yaml").write_text("path: ../ds\ntrain: images/train\nval: images/val\n"
                                    "names:\n  0: cat\n  1: dog\n  2: bird\n")
    out = base / "out"
    manifest = convert(root / "images", out, "--annotations", root / "data.yaml", "--max_reject_fraction", "0.5")
    return root, out, manifest


def test_data_yaml_gives_names_splits_and_boxes(ultralytics):
    _, out, manifest = ultralytics
    records = records_by_name(out)
    assert {name: rec["split"] for name, rec in records.items()} == {
        "train/im0.png": "train", "train/im1.png": "train", "train/im2.png": "train",
        "val/im0.png": "validation", "val/im2.png": "validation"}
    assert manifest.options["split"]["source"] == "annotations"
    boxes = manifest.targets["boxes"]
    assert boxes["class_names"] == ["cat", "dog", "bird"]
    assert manifest.class_names == ()
    # 0.5 0.5 0.25 0.5 on 32 x 24: x 12..20, y 6..18; the second box clipped at the top-left corner.
    np.testing.assert_allclose(boxes_in_pixels(records["train/im0.png"]),
                               [(12, 6, 20, 18, 0), (0, 0, 9.6, 7.2, 1)],
                               atol=1e-4)
    assert boxes_in_pixels(records["train/im1.png"]) == []
    assert boxes_in_pixels(records["train/im2.png"]) == []
    # The polygon (0.25, 0.25) (0.5, 0.25) (0.375, 0.75): boxed by its points' extent.
    np.testing.assert_allclose(boxes_in_pixels(records["val/im0.png"]), [(8, 6, 16, 18, 2)], atol=1e-4)
    assert boxes["images_without_boxes"] == {"train": 2, "validation": 1}
    assert boxes["issues"]["no_label_file"] == 2
    assert boxes["issues"]["unknown_image"] == 1
    assert boxes["issues"]["bbox_from_segmentation"] == 1
    assert boxes["issues"]["clipped"] == 1


def test_a_dataset_root_as_input_skips_its_label_files_as_annotation_files(ultralytics, tmp_path):
    root, out_of_images, _ = ultralytics
    # The whole dataset as --input_dir: its labels/, data.yaml and Ultralytics' cache lie among the images.
    manifest = convert(root, tmp_path / "out", "--annotations", root / "data.yaml", "--max_reject_fraction", "0.5")
    rows = [json.loads(line) for line in (tmp_path / "out" / schemas.REJECTS_FILENAME).read_text().splitlines()]
    skipped = {r["path"]: r["reason"] for r in rows if r["kind"] == "skipped"}
    assert skipped == {
        "data.yaml": "annotation_file",
        "labels/train.cache": "annotation_file",
        **{f"labels/{name}.txt": "annotation_file"
           for name in ("train/im0", "train/im1", "val/im0", "val/im1", "val/ghost")},
    }
    # The same images stored as from images/ alone.
    first = schemas.Manifest.from_json((out_of_images / schemas.MANIFEST_FILENAME).read_text())
    assert manifest.counts["written"] == first.counts["written"] == 5  # val/im1 rejected (class 3 of 3)
    assert manifest.rejects["annotation_file"] == 7 and "no_label" not in manifest.rejects


def test_data_yaml_class_outside_the_names_rejects_the_image(ultralytics):
    _, out, _ = ultralytics
    rejects = {d["path"]: d for d in map(json.loads, (out / schemas.REJECTS_FILENAME).read_text().splitlines())}
    assert rejects["val/im1.png"]["reason"] == "bad_target"
    message = rejects["val/im1.png"]["message"]
    # Named from the folder the labels share with the images, as the rejects name images.
    assert "label file labels/val/im1.txt line 1: class 3 is not one of the 3 classes (0-2)" in message
    assert str(ultralytics[0]) not in message


def test_labels_folder_splits_come_from_the_split_folders(ultralytics, tmp_path):
    root, _, _ = ultralytics
    convert(root / "images", tmp_path / "out", "--annotations", root / "labels", "--class_names",
            "cat,dog,bird,fish")
    manifest = schemas.Manifest.from_json((tmp_path / "out" / schemas.MANIFEST_FILENAME).read_text())
    assert manifest.targets["boxes"]["class_names"] == ["cat", "dog", "bird", "fish"]
    assert manifest.class_names == ()
    assert sorted(manifest.splits) == ["train", "validation"]
    assert boxes_in_pixels(records_by_name(tmp_path / "out")["val/im1.png"]) == [
        pytest.approx((12.8, 9.6, 19.2, 14.4, 3))]


# --------------------------------------------------------------------------
# Darknet / LabelImg: the labels and classes.txt next to the images


def test_darknet_folder_with_classes_txt(tmp_path):
    folder = tmp_path / "set"
    write(folder / "a.png", encode(pixels(1, size=(20, 40)), "PNG"))
    write(folder / "b.png", encode(pixels(2, size=(20, 40)), "PNG"))
    write(folder / "a.txt", b"1 0.5 0.5 0.5 0.5\n\n")
    (folder / "classes.txt").write_text("person\ncar\n")
    convert(folder, tmp_path / "out", "--annotations", folder)
    records = records_by_name(tmp_path / "out")
    assert sorted(records) == ["a.png", "b.png"]  # The label files and classes.txt are no images.
    np.testing.assert_allclose(boxes_in_pixels(records["a.png"]), [(10, 5, 30, 15, 1)], atol=1e-4)
    manifest = schemas.Manifest.from_json((tmp_path / "out" / schemas.MANIFEST_FILENAME).read_text())
    assert manifest.targets["boxes"]["class_names"] == ["person", "car"]
    assert manifest.targets["boxes"]["images_without_boxes"] == {"train": 1}


# --------------------------------------------------------------------------
# Malformed labels: the image is rejected with the file, the line and what was wrong


@pytest.mark.parametrize("line, says", [
    ("0 0.5 0.5 0.2", "4 fields"),
    ("0 0.5 0.5 0.2 0.2 0.3", "6 fields"),
    ("0 0.5 half 0.2 0.2", "not a number"),
    ("0 0.5 nan 0.2 0.2", "not a finite number"),
    ("2 0.5 0.5 0.2 0.2", "class 2 is not one of the 2 classes (0-1)"),
    ("-1 0.5 0.5 0.2 0.2", "class -1 is not one of the 2 classes"),
    ("0.5 0.5 0.5 0.2 0.2", "class 0.5 is not one of the 2 classes"),
    ("0 0.5 0.5 0 0.2", "width 0 and height 0.2 must be above 0"),
    ("0 0.5 0.5 0.2 -0.1", "must be above 0"),
    ("0 1.2 0.5 0.2 0.2", "outside [0, 1]"),
    ("0 0.5 -0.05 0.2 0.2", "outside [0, 1]"),
    ("0 12 8 4 4", "outside [0, 1]"),  # pixels, not fractions
    ("1 0.1 0.1 0.9 0.1 1.5 0.9", "a polygon point is outside [0, 1]"),
])
def test_malformed_line_rejects_the_image(tmp_path, line, says):
    write(tmp_path / "labels" / "x.txt", f"0 0.5 0.5 0.2 0.2\n{line}\n".encode())
    (tmp_path / "labels" / "classes.txt").write_text("a\nb\n")
    boxes, splits = read_yolo(str(tmp_path / "labels"), str(tmp_path / "images"), ["x.jpg", "y.jpg"])
    assert splits is None
    assert sorted(boxes.invalid) == ["x.jpg"]
    assert "x.txt line 2: " in boxes.invalid["x.jpg"] and says in boxes.invalid["x.jpg"]
    assert boxes.files["y.jpg"]["boxes"] == []  # No label file: a background image.


def test_a_label_file_gone_after_the_listing_rejects_its_image_only(tmp_path):
    for name in ("a", "b", "c"):
        write(tmp_path / "labels" / f"{name}.txt", b"0 0.5 0.5 0.2 0.2\n")
    found, _ = listing.list_input(str(tmp_path / "labels"))
    (tmp_path / "labels" / "b.txt").unlink()
    boxes, _ = read_yolo(str(tmp_path / "labels"), str(tmp_path / "images"), ["a.jpg", "b.jpg", "c.jpg"],
                         class_names=("a",), found=found)
    assert boxes.invalid == {"b.jpg": "label file labels/b.txt cannot be read (No such file or directory)"}
    assert sorted(boxes.files) == ["a.jpg", "c.jpg"] and len(boxes.files["c.jpg"]["boxes"]) == 1


def test_coordinates_within_the_tolerance_are_kept(tmp_path):
    # Ultralytics accepts 1% either side of [0, 1] (rounding); the box is clipped when stored.
    write(tmp_path / "labels" / "x.txt", b"0 1.005 0.5 0.2 0.2\n0 0.5 0.5 1.01 0.2\n")
    boxes, _ = read_yolo(str(tmp_path / "labels"), str(tmp_path), ["x.jpg"], class_names=("a",))
    assert boxes.invalid == {}
    assert [b[0] for b in boxes.files["x.jpg"]["boxes"]] == [1, 2]


def test_a_repeated_line_is_dropped_and_counted_as_ultralytics_drops_it(tmp_path):
    write(tmp_path / "labels" / "x.txt", b"0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n0 0.50 0.5 0.2 0.20\n"
                                         b"1 0.3 0.3 0.1 0.2\n")
    boxes, _ = read_yolo(str(tmp_path / "labels"), str(tmp_path), ["x.jpg"], class_names=("a", "b"))
    assert boxes.invalid == {}
    # Line 3 repeats line 1 (the same numbers, written otherwise); line 4 differs from line 2.
    assert [b[0] for b in boxes.files["x.jpg"]["boxes"]] == [1, 2, 4]
    assert boxes.issues["duplicate_line"] == 1


def test_a_bad_label_file_is_one_reject_of_a_conversion(tmp_path):
    root = tmp_path / "images"
    for name in ("a", "b", "c"):
        write(root / f"{name}.png", encode(pixels(3, size=(24, 32)), "PNG"))
    write(tmp_path / "labels" / "a.txt", b"0 0.5 0.5 0.2 0.2\n")
    write(tmp_path / "labels" / "b.txt", b"0 0.5 0.5 0.2\n")
    manifest = convert(root, tmp_path / "out", "--annotations", tmp_path / "labels", "--class_names", "thing",
                       "--max_reject_fraction", "0.5")
    rejects = [json.loads(line) for line in (tmp_path / "out" / schemas.REJECTS_FILENAME).read_text().splitlines()]
    assert [(r["path"], r["reason"]) for r in rejects] == [("b.png", "bad_target")]
    assert "b.txt line 1: 4 fields" in rejects[0]["message"]
    assert sorted(records_by_name(tmp_path / "out")) == ["a.png", "c.png"]
    assert manifest.targets["boxes"]["issues"]["no_label_file"] == 1


# --------------------------------------------------------------------------
# Class names: data.yaml, classes.txt, --class_names, else a usage error


def test_labels_without_class_names_is_a_usage_error_that_says_which_file(tmp_path, capfd):
    write(tmp_path / "images" / "a.png", encode(pixels(0), "PNG"))
    write(tmp_path / "labels" / "a.txt", b"0 0.5 0.5 0.2 0.2\n")
    status = convert_module.main(["--input_dir", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out"),
                                  "--annotations", str(tmp_path / "labels")])
    assert status == 2
    err = capfd.readouterr().err
    assert "without class names" in err and "data.yaml" in err and "classes.txt" in err and "--class_names" in err
    assert not (tmp_path / "out" / schemas.MANIFEST_FILENAME).exists()


@pytest.mark.parametrize("yaml_text, says", [
    ("train: images\nnames:\n  0: a\n  2: c\n", "has the class ids 0-1"),
    ("train: images\nnames: [a, b]\nnc: 3\n", "'nc: 3' and the 2 'names' disagree"),
    ("train: images\n", "names no classes"),
    ("names: [a]\n", "no 'train', 'val' or 'test' images"),
    ("train: elsewhere\nnames: [a]\n", "none of the images under --input_dir"),
    ("- just\n- a list\n", "must be an Ultralytics data YAML mapping"),
])
def test_bad_data_yaml_is_refused(tmp_path, yaml_text, says):
    write(tmp_path / "images" / "a.png", b"")
    (tmp_path / "data.yaml").write_text(yaml_text)
    with pytest.raises(ValueError) as e:
        read_yolo(str(tmp_path / "data.yaml"), str(tmp_path / "images"), ["a.png"])
    assert says in str(e.value)


def test_data_yaml_names_list_nc_and_list_files(tmp_path):
    # 'validation' for 'val', 'nc' without names, and a list file of './' paths (Ultralytics' forms).
    for name in ("a", "b"):
        write(tmp_path / "images" / f"{name}.png", b"")
    write(tmp_path / "labels" / "b.txt", b"1 0.5 0.5 0.2 0.2\n")
    (tmp_path / "val.txt").write_text("./images/b.png\n")
    (tmp_path / "data.yaml").write_text("train: [other]\nvalidation: val.txt\nnc: 2\n")
    boxes, splits = read_yolo(str(tmp_path / "data.yaml"), str(tmp_path / "images"), ["a.png", "b.png"])
    assert boxes.class_names == ("class_0", "class_1")
    assert splits == {"b.png": "validation"}  # a.png is in none of them.
    assert boxes.files["b.png"]["boxes"] == [[1, 0.4, 0.4, 0.6, 0.6, 1, 0]]


def test_class_names_beside_names_of_the_labels_is_refused(tmp_path):
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "classes.txt").write_text("a\n")
    with pytest.raises(ValueError, match="--class_names is not needed"):
        read_yolo(str(tmp_path / "labels"), str(tmp_path), ["x.png"], class_names=("a",))


def test_roboflow_layout_in_one_run_from_the_data_yaml(tmp_path):
    # Roboflow's export: {train,valid}/{images,labels}, its data.yaml naming '../train/images' (not
    # there from the YAML's folder: tried without the '../', as Ultralytics does).
    root = tmp_path / "export"
    for split in ("train", "valid"):
        write(root / split / "images" / "x.png", encode(pixels(5, size=(24, 32)), "PNG"))
        write(root / split / "labels" / "x.txt", b"0 0.5 0.5 0.5 0.5\n" if split == "train" else b"")
    (root / "data.yaml").write_text("train: ../train/images\nval: ../valid/images\nnc: 1\nnames: ['box']\n")
    manifest = convert(root, tmp_path / "out", "--annotations", root / "data.yaml")
    records = records_by_name(tmp_path / "out")
    assert {name: rec["split"] for name, rec in records.items()} == {
        "train/images/x.png": "train", "valid/images/x.png": "validation"}
    np.testing.assert_allclose(boxes_in_pixels(records["train/images/x.png"]), [(8, 6, 24, 18, 0)], atol=1e-4)
    assert manifest.targets["boxes"]["images_without_boxes"] == {"train": 0, "validation": 1}
    # The label files and the YAML under --input_dir are no images: skipped, not rejected.
    assert (manifest.counts["skipped"], manifest.counts["rejected"]) == (3, 0)


def test_data_yaml_splits_refuse_split(tmp_path, capfd):
    write(tmp_path / "images" / "train" / "a.png", encode(pixels(0), "PNG"))
    (tmp_path / "data.yaml").write_text("train: images/train\nnames: [a]\n")
    status = convert_module.main(["--input_dir", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out"),
                                  "--annotations", str(tmp_path / "data.yaml"), "--split", "train=0.5,test=0.5"])
    assert status == 2
    assert "give each image its split (a data.yaml's train/val/test). Drop --split." in capfd.readouterr().err


def test_data_yaml_run_of_one_split_folder_counts_no_other_splits_labels(ultralytics, tmp_path):
    root, _, _ = ultralytics
    manifest = convert(root / "images" / "train", tmp_path / "out", "--annotations", root / "data.yaml")
    assert sorted(records_by_name(tmp_path / "out")) == ["im0.png", "im1.png", "im2.png"]
    assert sorted(manifest.splits) == ["train"]
    assert "unknown_image" not in manifest.targets["boxes"]["issues"]  # val's labels are not this run's


def test_append_counts_no_held_images_labels_as_unknown(tmp_path):
    root, labels = tmp_path / "images", tmp_path / "labels"
    write(root / "a.png", encode(pixels(1), "PNG"))
    write(labels / "a.txt", b"0 0.5 0.5 0.5 0.5\n")
    (labels / "classes.txt").write_text("cat\ndog\n")
    convert(root, tmp_path / "out", "--annotations", labels)
    write(root / "b.png", encode(pixels(2), "PNG"))
    write(labels / "b.txt", b"1 0.5 0.5 0.5 0.5\n")
    manifest = convert(root, tmp_path / "out", "--annotations", labels, "--append")
    assert manifest.targets["boxes"]["counts"] == {"train": [1, 1]}
    assert "unknown_image" not in manifest.targets["boxes"]["issues"]
