"""Issue 24's central test: annotated samples in each real layout -> Beam conversion -> verify ->
reader, compared with the sources read by Pillow and with arithmetic on the annotations."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert
from PIL import Image

import readers
import schemas
from beam_jobs import verify

# Four regions of every image, each a flat colour and a class id in its mask.
_COLOURS = np.array([(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 40)], np.uint8)
_IDS = np.array([3, 7, 12, 15], np.uint8)


def _regions(h: int, w: int, seed: int) -> np.ndarray:
    """Which of the four regions each pixel is in: quadrants split at a per-image point."""
    rng = np.random.default_rng(seed)
    cy, cx = int(rng.integers(h // 3, 2 * h // 3)), int(rng.integers(w // 3, 2 * w // 3))
    rows, cols = np.mgrid[:h, :w]
    return (rows >= cy).astype(int) * 2 + (cols >= cx).astype(int)


def _save(path: pathlib.Path, image: Image.Image, **kwargs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **kwargs)


def _voc_palette() -> list[int]:
    # Pascal VOC's colour map: id i drawn in a colour, never the value i.
    return [c for i in range(256) for c in ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)]


def _verify(out) -> None:
    assert verify.main([str(out)]) == 0


def _read(out, split, label_mode, **options):
    ds = readers.image_dataset_from_tfrecords(
        str(out), split, batch_size=None, image_size=None, dtype="uint8", shuffle=False,
        label_mode=label_mode, extra_features=(schemas.FILENAME.key,), **options)
    return {extras[schemas.FILENAME.key].numpy().decode(): (image.numpy(), target)
            for image, target, extras in ds}


@pytest.fixture(scope="module")
def voc_segmentation(tmp_path_factory):
    """VOC's layout: JPEGImages/<id>.jpg, SegmentationClass/<id>.png palette masks (255 border)."""
    root = tmp_path_factory.mktemp("voc_seg")
    sources = {}
    for k in range(10):
        h, w = 40 + 2 * k, 56 - k
        regions = _regions(h, w, k)
        ids = _IDS[regions]
        ids[0, :] = ids[-1, :] = 255
        mask = Image.fromarray(ids, "P")
        mask.putpalette(_voc_palette())
        _save(root / "SegmentationClass" / f"2007_{k:06d}.png", mask)
        _save(root / "JPEGImages" / f"2007_{k:06d}.jpg", Image.fromarray(_COLOURS[regions]), quality=95)
        sources[f"2007_{k:06d}.jpg"] = ids
    out = root / "out"
    manifest = convert(root / "JPEGImages", out, "--masks_dir", root / "SegmentationClass",
                       "--split", "train=0.6,validation=0.4", "--min_shards", "2")
    return root, out, manifest, sources


def test_voc_masks_convert_verify_and_read_back_exactly(voc_segmentation):
    root, out, manifest, sources = voc_segmentation
    _verify(out)
    assert manifest.class_names == () and manifest.targets["mask"]["dtype"] == "uint8"
    seen = {}
    for split in manifest.splits:
        seen.update(_read(out, split, "mask"))
    assert sorted(seen) == sorted(sources)
    counts = np.zeros(256, np.int64)
    for name, (image, mask) in seen.items():
        # Pillow's reading of the palette PNG: its indices.
        np.testing.assert_array_equal(mask.numpy()[..., 0], sources[name], err_msg=name)
        source = tf.io.decode_jpeg((root / "JPEGImages" / name).read_bytes()).numpy()
        np.testing.assert_array_equal(image, source, err_msg=name)
        counts += np.bincount(sources[name].ravel(), minlength=256)
    stored = collect_pixel_counts(manifest.targets["mask"]["pixel_counts"])
    assert stored == {i: int(n) for i, n in enumerate(counts) if n}


def collect_pixel_counts(per_split) -> dict[int, int]:
    total: dict[int, int] = {}
    for counts in per_split.values():
        for class_id, n in counts.items():
            total[int(class_id)] = total.get(int(class_id), 0) + n
    return total


def test_augmented_masks_stay_under_their_image_regions(voc_segmentation):
    _, out, manifest, _ = voc_segmentation
    ds = readers.image_dataset_from_tfrecords(
        str(out), "train", batch_size=4, image_size=(32, 32), augment="standard", seed=11,
        label_mode="mask", dtype="uint8")
    checked = 0
    for images, masks in ds.repeat(3):
        images, masks = images.numpy().astype(int), masks.numpy()[..., 0]
        for k, class_id in enumerate(_IDS):
            where = masks == class_id
            if where.sum() < 20:
                continue
            # The image's colour under the mask's class, away from JPEG's edges: its region's colour.
            mean = np.median(images[where], axis=0)
            assert np.abs(mean - _COLOURS[k]).max() < 40, (class_id, mean)
            checked += 1
        assert set(np.unique(masks)) <= {*map(int, _IDS), 255}
    assert checked >= 8


@pytest.fixture(scope="module")
def cityscapes(tmp_path_factory):
    """Cityscapes' layout: leftImg8bit/<split>/<city>/<name>_leftImg8bit.png and gtFine/... labelIds."""
    root = tmp_path_factory.mktemp("cityscapes")
    sources = {}
    for split in ("train", "val"):
        for k, city in enumerate(("aachen", "bremen")):
            name = f"{city}_{k:06d}_000019"
            regions = _regions(32, 64, hash((split, city)) % 1000)
            ids = (_IDS[regions] + 20).astype(np.uint8)  # labelIds: 0-33
            _save(root / "gtFine" / split / city / f"{name}_gtFine_labelIds.png", Image.fromarray(ids))
            _save(root / "leftImg8bit" / split / city / f"{name}_leftImg8bit.png",
                  Image.fromarray(_COLOURS[regions]))
            sources[f"{split}/{city}/{name}_leftImg8bit.png"] = ids
    out = root / "out"
    manifest = convert(root / "leftImg8bit", out, "--masks_dir", root / "gtFine",
                       "--mask_suffix", "_leftImg8bit:_gtFine_labelIds")
    return root, out, manifest, sources


def test_cityscapes_suffixes_and_split_folders(cityscapes):
    root, out, manifest, sources = cityscapes
    _verify(out)
    assert sorted(manifest.splits) == ["train", "validation"]
    seen = {}
    for split in manifest.splits:
        seen.update(_read(out, split, "mask"))
    assert sorted(seen) == sorted(sources)
    for name, (image, mask) in seen.items():
        np.testing.assert_array_equal(mask.numpy()[..., 0], sources[name])
        np.testing.assert_array_equal(image, np.asarray(Image.open(root / "leftImg8bit" / name)))


def _box_image(h, w, boxes) -> Image.Image:
    """A grey image with each box (x, y, w, h in pixels) filled in its colour."""
    arr = np.full((h, w, 3), 90, np.uint8)
    for k, (x, y, bw, bh) in enumerate(boxes):
        arr[y:y + bh, x:x + bw] = _COLOURS[k % 4]
    return Image.fromarray(arr)


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    """COCO's layout: images/ and an instances JSON with non-contiguous category ids."""
    root = tmp_path_factory.mktemp("coco")
    categories = [{"id": 90, "name": "toothbrush"}, {"id": 1, "name": "person"}, {"id": 18, "name": "dog"}]
    images, annotations, expected = [], [], {}
    for k in range(8):
        h, w = 48, 64 + 4 * k
        boxes = [(4 + k, 6, 20, 12), (30, 20 + k, 16, 20)][: 1 + k % 2] if k != 3 else []
        _save(root / "images" / f"{k:012d}.png", _box_image(h, w, boxes))
        images.append({"id": 100 + k, "file_name": f"{k:012d}.png", "width": w, "height": h})
        cats = [1, 90, 18]
        for j, box in enumerate(boxes):
            annotations.append({"id": 1000 + 10 * k + j, "image_id": 100 + k, "bbox": list(box),
                                "category_id": cats[(k + j) % 3], "iscrowd": int(j == 1 and k == 5),
                                "area": box[2] * box[3]})
        # Labels are categories in id order: person (1) 0, dog (18) 1, toothbrush (90) 2.
        label_of = {1: 0, 18: 1, 90: 2}
        expected[f"{k:012d}.png"] = [
            ((y / h, x / w, (y + bh) / h, (x + bw) / w), label_of[cats[(k + j) % 3]])
            for j, (x, y, bw, bh) in enumerate(boxes)]
    (root / "instances.json").write_text(json.dumps(
        {"images": images, "annotations": annotations, "categories": categories}))
    out = root / "out"
    manifest = convert(root / "images", out, "--annotations", root / "instances.json")
    return root, out, manifest, expected


def test_coco_boxes_convert_verify_and_read_back(coco):
    root, out, manifest, expected = coco
    _verify(out)
    boxes = manifest.targets["boxes"]
    assert boxes["class_names"] == ["person", "dog", "toothbrush"] and boxes["category_ids"] == [1, 18, 90]
    seen = _read(out, "train", "boxes")
    assert sorted(seen) == sorted(expected)
    for name, (image, target) in seen.items():
        want = expected[name]
        got_boxes, got_classes = target["boxes"].numpy(), target["classes"].numpy()
        assert got_boxes.shape == (len(want), 4)
        np.testing.assert_allclose(got_boxes, [b for b, _ in want] or np.zeros((0, 4)), atol=1e-6)
        assert got_classes.tolist() == [c for _, c in want]
        # The boxes frame their colours in the stored pixels.
        h, w = image.shape[:2]
        for k, (ymin, xmin, ymax, xmax) in enumerate(got_boxes):
            inside = image[round(ymin * h):round(ymax * h), round(xmin * w):round(xmax * w)]
            np.testing.assert_array_equal(inside.reshape(-1, 3).min(0), inside.reshape(-1, 3).max(0))
            np.testing.assert_array_equal(inside[0, 0], _COLOURS[k % 4])


def test_coco_boxes_batch_padded_for_a_detector(coco):
    _, out, manifest, expected = coco
    ds = readers.image_dataset_from_tfrecords(str(out), "train", batch_size=4, image_size=(32, 32),
                                              label_mode="boxes", pad_boxes=3, shuffle=False)
    total = 0
    for images, target in ds:
        assert images.shape[1:] == (32, 32, 3) and target["boxes"].shape[1:] == (3, 4)
        classes = target["classes"].numpy()
        total += int((classes >= 0).sum())
        assert ((classes == -1) | (classes >= 0)).all()
    assert total == sum(len(v) for v in expected.values())


def test_voc_xml_boxes_are_one_based_and_matched_by_their_stem(tmp_path):
    root = tmp_path
    expected = {}
    for k, name in enumerate(("cat", "dog", "cat")):
        h, w = 40, 50
        x1, y1, x2, y2 = 5 + k, 7, 30, 25 + k  # VOC: 1-based, inclusive corners
        _save(root / "JPEGImages" / f"00{k}.png", _box_image(h, w, [(x1 - 1, y1 - 1, x2 - x1 + 1, y2 - y1 + 1)]))
        (root / "Annotations").mkdir(exist_ok=True)
        # A <filename> that disagrees with the file's stem, as real VOC files do.
        (root / "Annotations" / f"00{k}.xml").write_text(
            f"<annotation><filename>other_{k}.jpg</filename><size><width>{w}</width>"
            f"<height>{h}</height><depth>3</depth></size><object><name>{name}</name>"
            f"<difficult>{int(k == 2)}</difficult><bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin>"
            f"<xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object></annotation>")
        expected[f"00{k}.png"] = ((y1 - 1) / h, (x1 - 1) / w, y2 / h, x2 / w), ["cat", "dog"].index(name)
    out = root / "out"
    manifest = convert(root / "JPEGImages", out, "--annotations", root / "Annotations")
    _verify(out)
    assert manifest.targets["boxes"]["class_names"] == ["cat", "dog"]
    seen = _read(out, "train", "boxes")
    for name, (_, target) in seen.items():
        box, label = expected[name]
        np.testing.assert_allclose(target["boxes"].numpy(), [box], atol=1e-6)
        assert target["classes"].numpy().tolist() == [label]


def test_multi_label_and_regression_csvs(tmp_path):
    root = tmp_path / "xrays"
    findings = {"a.png": "Effusion|Mass", "b.png": "No Finding", "c.png": "Mass|Mass|Nodule",
                "d.png": "Nodule|Effusion"}
    for k, name in enumerate(findings):
        _save(root / name, Image.fromarray(np.full((16, 16), 40 * k, np.uint8)))
    (tmp_path / "labels.csv").write_text(
        "path,label\n" + "".join(f"{p},{v}\n" for p, v in findings.items()))
    out = tmp_path / "out"
    manifest = convert(root, out, "--labels_csv", tmp_path / "labels.csv")
    _verify(out)
    names = list(manifest.class_names)
    assert names == sorted({c for v in findings.values() for c in v.split("|")})
    for name, (_, hot) in _read(out, "train", "multi_hot").items():
        want = np.zeros(len(names), np.float32)
        want[[names.index(c) for c in findings[name].split("|")]] = 1
        np.testing.assert_array_equal(hot.numpy(), want)

    scores = {"a.png": (0.5, 1.25), "b.png": (-3.0, 2.0), "c.png": (0.1, 0.2), "d.png": (7.0, 8.5)}
    (tmp_path / "targets.csv").write_text(
        "path,target\n" + "".join(f"{p},{a}|{b}\n" for p, (a, b) in scores.items()))
    out = tmp_path / "out_regression"
    manifest = convert(root, out, "--labels_csv", tmp_path / "targets.csv")
    _verify(out)
    assert manifest.targets["target"]["length"] == 2
    for name, (_, target) in _read(out, "train", "target").items():
        np.testing.assert_array_equal(target.numpy(), np.float32(scores[name]))
