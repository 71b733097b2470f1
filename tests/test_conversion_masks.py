"""--masks_dir end to end: image+mask pairs on disk -> the converter -> shards -> masks read back.

Masks are written by Pillow and tifffile, read back from the shards with the
schema and `tf.io.decode_png`, and compared with the source masks as Pillow
and tifffile read them.
"""

from __future__ import annotations

import collections
import io
import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf
import tifffile
from helpers import convert, encode, pixels, read_records, write
from PIL import Image, ImageOps

import schemas
from beam_jobs import convert as convert_module
from conversion.config import ConversionConfig
from conversion.masks import TARGET_KIND, MaskOptions
from conversion.planning import build_plan
from conversion.targets.masks import of_file

_PALETTE = [c for i in range(256) for c in ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)]


def _palette_png(ids: np.ndarray) -> bytes:
    im = Image.fromarray(ids.astype(np.uint8), "P")
    im.putpalette(_PALETTE)
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def _tiff(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, arr)
    return buf.getvalue()


def _voc_ids(seed: int, h=24, w=32) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(0, 21, (h, w)).astype(np.uint8)
    ids[0, :] = ids[-1, :] = ids[:, 0] = ids[:, -1] = 255
    return ids


def _rotated_jpeg(orientation: int = 6) -> bytes:
    """A 20x30 (h x w) raw frame, dark with a bright block at its top-left, EXIF-rotated."""
    raw = np.full((20, 30, 3), 40, np.uint8)
    raw[:6, :10] = 250
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(raw).save(buf, "JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


def _raw_marker_ids() -> np.ndarray:
    ids = np.ones((20, 30), np.uint8)
    ids[:6, :10] = 7
    return ids


def _decoded_mask(record: dict, dtype) -> np.ndarray:
    return tf.io.decode_png(record[schemas.MASK.key], dtype=dtype).numpy()[..., 0]


def _by_name(records) -> dict:
    return {r[schemas.FILENAME.key].decode(): r for r in records}


def _jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.fixture(scope="module")
def voc(tmp_path_factory):
    """A flat VOC-like folder (JPEGImages/ + SegmentationClass/) with every kind of mask."""
    root = tmp_path_factory.mktemp("voc")
    images, masks = root / "JPEGImages", root / "SegmentationClass"
    expected = {}  # image name -> the ids its stored mask must hold (upright, as read by Pillow)
    for i in range(4):
        write(images / f"voc{i}.jpg", encode(pixels(i), "JPEG"))
        ids = _voc_ids(i)
        write(masks / f"voc{i}.png", _palette_png(ids))
        expected[f"voc{i}.jpg"] = ids
    write(images / "tifmask.jpg", encode(pixels(10), "JPEG"))
    write(masks / "tifmask.tif", _tiff(_voc_ids(10)))
    expected["tifmask.jpg"] = tifffile.imread(masks / "tifmask.tif")
    write(images / "greyrgb.png", encode(pixels(11), "PNG"))
    write(masks / "greyrgb.png", _png(np.repeat(_voc_ids(11)[..., None], 3, axis=2)))
    expected["greyrgb.png"] = np.asarray(Image.open(masks / "greyrgb.png"))[..., 0]
    # Rejected pairs.
    write(images / "colour.jpg", encode(pixels(12), "JPEG"))
    write(masks / "colour.png", _png(np.random.default_rng(12).integers(0, 255, (24, 32, 3), np.uint8)))
    write(images / "lossy.jpg", encode(pixels(13), "JPEG"))
    write(masks / "lossy.jpg", encode(np.repeat(_voc_ids(13)[..., None], 3, axis=2), "JPEG"))
    write(images / "nomask.jpg", encode(pixels(14), "JPEG"))
    write(images / "mismatch.jpg", encode(pixels(15), "JPEG"))
    write(masks / "mismatch.png", _palette_png(_voc_ids(15, 10, 10)))
    write(images / "ambiguous.jpg", encode(pixels(16), "JPEG"))
    write(masks / "ambiguous.png", _palette_png(_voc_ids(16)))
    write(masks / "ambiguous.tif", _tiff(_voc_ids(16)))
    # EXIF-rotated photos: one mask drawn on the raw frame, one drawn upright.
    write(images / "rot_raw.jpg", _rotated_jpeg())
    write(masks / "rot_raw.png", _palette_png(_raw_marker_ids()))
    write(images / "rot_up.jpg", _rotated_jpeg())
    upright = np.asarray(ImageOps.exif_transpose(Image.open(images / "rot_up.jpg")).convert("L"))
    up_ids = np.where(upright > 150, 7, 1).astype(np.uint8)
    write(masks / "rot_up.png", _palette_png(up_ids))
    expected["rot_up.jpg"] = up_ids
    expected["rot_raw.jpg"] = np.asarray(
        Image.fromarray(_raw_marker_ids()).transpose(Image.Transpose.ROTATE_270))  # Orientation 6
    write(masks / "orphan.png", _palette_png(_voc_ids(17)))
    args = ["--masks_dir", masks, "--split", "train=0.6,validation=0.4", "--max_reject_fraction", "0.5"]
    manifest = convert(images, root / "out", *args)
    return root, expected, manifest, args


def test_pairs_are_stored_with_exact_ids(voc):
    root, expected, manifest, _ = voc
    records = _by_name(read_records(root / "out"))
    assert sorted(records) == sorted(expected)
    for name, rec in records.items():
        mask = _decoded_mask(rec, tf.uint8)
        np.testing.assert_array_equal(mask, expected[name], err_msg=name)
        assert mask.shape == (rec[schemas.HEIGHT.key], rec[schemas.WIDTH.key])
        assert rec[schemas.LABEL.key] == -1
    assert manifest.class_names == ()
    assert schemas.ImageExampleSchema.from_json(manifest.features).targets == (TARGET_KIND,)


def test_mask_drawn_on_the_raw_frame_lands_on_the_upright_marker(voc):
    root, _, _, _ = voc
    records = _by_name(read_records(root / "out"))
    for name in ("rot_raw.jpg", "rot_up.jpg"):
        rec = records[name]
        image = tf.io.decode_image(rec[schemas.IMAGE.key], channels=1).numpy()[..., 0]
        assert image.shape == (30, 20)  # Upright.
        bright = image > 150
        mask = _decoded_mask(rec, tf.uint8)
        assert bright.sum() > 30
        assert (mask[bright] == 7).mean() > 0.9, name
        assert (mask[~bright] == 1).mean() > 0.9, name


def test_rejects_and_normalized_actions(voc):
    root, _, manifest, _ = voc
    rejects = {r["path"]: r for r in _jsonl(root / "out" / schemas.REJECTS_FILENAME)}
    assert {p: r["reason"] for p, r in rejects.items()} == {
        "colour.jpg": "mask_not_class_ids",
        "lossy.jpg": "mask_lossy",
        "nomask.jpg": "missing_mask",
        "mismatch.jpg": "mask_size_mismatch",
        "ambiguous.jpg": "mask_unreadable",
    }
    assert "ambiguous.png" in rejects["ambiguous.jpg"]["message"]
    assert "ambiguous.tif" in rejects["ambiguous.jpg"]["message"]
    assert "SegmentationClass/nomask" in rejects["nomask.jpg"]["message"]
    assert "10x10" in rejects["mismatch.jpg"]["message"] and "32x24" in rejects["mismatch.jpg"]["message"]
    assert manifest.counts == {"found": 13, "written": 8, "rejected": 5, "skipped": 0}
    normalized = {n["path"]: n["actions"] for n in _jsonl(root / "out" / schemas.NORMALIZED_FILENAME)}
    assert normalized["rot_raw.jpg"] == ["exif_transpose", "mask_exif_transpose"]
    assert normalized["rot_up.jpg"] == ["exif_transpose"]
    assert manifest.normalized["mask_exif_transpose"] == 1


def test_manifest_targets_mask_section(voc):
    root, expected, manifest, _ = voc
    records = read_records(root / "out")
    section = manifest.targets[TARGET_KIND]
    assert section["dtype"] == "uint8"
    assert section["masks_dir"] == str(root / "SegmentationClass")
    assert section["mask_suffix"] is None
    assert section["unmatched_masks"] == 1
    want = collections.defaultdict(collections.Counter)
    for rec in records:
        values, counts = np.unique(expected[rec[schemas.FILENAME.key].decode()], return_counts=True)
        want[rec["split"]].update({str(v): int(c) for v, c in zip(values, counts)})
    assert section["pixel_counts"] == {split: dict(c) for split, c in want.items()}
    # VOC's border (255, the reader's ignore id) is in the pixel counts but is no class.
    ids = {int(i) for counts in want.values() for i in counts}
    assert 255 in ids
    assert section["num_classes"] == max(ids - {255}) + 1 < 255
    assert set(section["pixel_counts"]) == set(manifest.splits)


def test_same_input_same_bytes(voc, tmp_path):
    root, _, _, args = voc
    convert(root / "JPEGImages", tmp_path / "again", *args)
    first = sorted((root / "out").glob("*.tfrecord"))
    assert first and [p.name for p in first] == sorted(p.name for p in (tmp_path / "again").glob("*.tfrecord"))
    for path in first:
        assert path.read_bytes() == (tmp_path / "again" / path.name).read_bytes()
    for name in (schemas.NORMALIZED_FILENAME, schemas.REJECTS_FILENAME, schemas.MANIFEST_FILENAME):
        assert (root / "out" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()


def _blocks(h: int, w: int, ids: tuple[int, int, int, int]) -> np.ndarray:
    """Four quadrants of the given ids."""
    out = np.empty((h, w), np.int64)
    out[:h // 2, :w // 2], out[:h // 2, w // 2:], out[h // 2:, :w // 2], out[h // 2:, w // 2:] = ids
    return out


@pytest.fixture(scope="module")
def cityscapes(tmp_path_factory):
    """Cityscapes' layout: leftImg8bit/<split>/<city>/x_leftImg8bit.png, gtFine/... 16-bit ids, resized."""
    root = tmp_path_factory.mktemp("city")
    sources = {}  # image rel path -> source ids (as Pillow / tifffile read the mask)
    cases = [
        ("train", "aachen", "a1", "png16", (24, 32), (300, 7, 1000, 0)),
        ("train", "aachen", "a2", "png8", (24, 32), (1, 2, 3, 4)),
        ("train", "bonn", "b1", "tif32", (24, 32), (65535, 5, 6, 300)),
        ("train", "bonn", "b2", "png8", (12, 16), (9, 8, 7, 6)),  # Not resized: exact.
        ("val", "aachen", "a3", "png16", (24, 32), (500, 501, 502, 503)),
        ("val", "bonn", "b3", "png8", (24, 32), (11, 12, 13, 14)),
    ]
    for split, city, stem, kind, (h, w), ids in cases:
        rel = f"{split}/{city}/{stem}_leftImg8bit.png"
        write(root / "leftImg8bit" / rel, encode(pixels(len(sources), size=(h, w)), "PNG"))
        mask_dir = root / "gtFine" / split / city
        ids = _blocks(h, w, ids)
        if kind == "png16":
            path = write(mask_dir / f"{stem}_gtFine_labelIds.png", _png(ids.astype(np.uint16)))
            sources[rel] = np.asarray(Image.open(path))
        elif kind == "png8":
            path = write(mask_dir / f"{stem}_gtFine_labelIds.png", _png(ids.astype(np.uint8)))
            sources[rel] = np.asarray(Image.open(path))
        else:
            path = write(mask_dir / f"{stem}_gtFine_labelIds.tif", _tiff(ids.astype(np.uint32)))
            sources[rel] = tifffile.imread(path)
        # Cityscapes' other annotation files: not masks of any image.
        write(mask_dir / f"{stem}_gtFine_color.png", _png(np.zeros((h, w, 3), np.uint8)))
        write(mask_dir / f"{stem}_gtFine_polygons.json", b"{}")
    write(root / "leftImg8bit" / "train" / "bonn" / "odd_name.png", encode(pixels(99), "PNG"))
    args = ["--masks_dir", root / "gtFine", "--mask_suffix", "_leftImg8bit:_gtFine_labelIds",
            "--max_side", "16", "--worker_processes", "1", "--max_reject_fraction", "0.5"]
    manifest = convert(root / "leftImg8bit", root / "out", *args)
    return root, sources, manifest


def test_cityscapes_suffix_splits_and_16_bit_ids(cityscapes):
    root, sources, manifest = cityscapes
    records = _by_name(read_records(root / "out"))
    assert sorted(records) == sorted(sources)
    assert sorted(manifest.splits) == ["train", "validation"]
    # ROOT/<split>/<city>/<file>: the city folders are the class folders.
    assert manifest.class_names == ("aachen", "bonn")
    section = manifest.targets[TARGET_KIND]
    assert section["dtype"] == "uint16"
    assert section["mask_suffix"] == "_leftImg8bit:_gtFine_labelIds"
    assert section["unmatched_masks"] == len(sources)  # The _gtFine_color.png files.
    for rel, rec in records.items():
        split, city, _ = rel.split("/")
        assert rec["split"] == {"val": "validation"}.get(split, split)
        assert manifest.class_names[rec[schemas.LABEL.key]] == city
        mask = _decoded_mask(rec, tf.uint16)
        src = sources[rel]
        assert mask.shape == (rec[schemas.HEIGHT.key], rec[schemas.WIDTH.key])
        assert max(mask.shape) <= 16
        if mask.shape == src.shape:
            np.testing.assert_array_equal(mask, src, err_msg=rel)
        else:
            # Nearest neighbour: ids only from the source, each quadrant its own id.
            assert set(np.unique(mask)) <= set(np.unique(src))
            h, w = mask.shape
            sh, sw = src.shape
            for r, c in ((h // 4, w // 4), (h // 4, 3 * w // 4), (3 * h // 4, w // 4), (3 * h // 4, 3 * w // 4)):
                assert mask[r, c] == src[r * sh // h, c * sw // w], rel
    want = collections.defaultdict(collections.Counter)
    for rec in records.values():
        values, counts = np.unique(_decoded_mask(rec, tf.uint16), return_counts=True)
        want[rec["split"]].update({str(v): int(c) for v, c in zip(values, counts)})
    assert section["pixel_counts"] == {split: dict(c) for split, c in want.items()}
    ids = {int(i) for counts in want.values() for i in counts}
    assert section["num_classes"] == max(ids - {65535}) + 1


def test_cityscapes_rejects_and_resize_actions(cityscapes):
    root, sources, manifest = cityscapes
    rejects = _jsonl(root / "out" / schemas.REJECTS_FILENAME)
    assert [(r["path"], r["reason"]) for r in rejects] == [("train/bonn/odd_name.png", "missing_mask")]
    assert "_leftImg8bit" in rejects[0]["message"]
    normalized = {n["path"]: n for n in _jsonl(root / "out" / schemas.NORMALIZED_FILENAME)}
    resized = {rel for rel, src in sources.items() if max(src.shape) > 16}
    assert set(normalized) == resized
    for rel in resized:
        assert normalized[rel]["actions"] == ["resize_max_side", "mask_resized"]
        assert normalized[rel]["details"]["mask"]["stored"] == normalized[rel]["details"]["stored"]


def _plan(root, masks_dir, *, mask_suffix=None, **fields):
    config = ConversionConfig(input_dir=str(root), output_dir=str(root.parent / "out"),
                              masks=MaskOptions(str(masks_dir), mask_suffix), **fields)
    return build_plan(config)


def test_labels_from_class_folders_only_when_the_layout_is_exactly_class_folders(tmp_path):
    images, masks = tmp_path / "images", tmp_path / "masks"
    for rel in ("cat/a.png", "cat/b.png", "dog/c.png"):
        write(images / rel, encode(pixels(1, size=(4, 4)), "PNG"))
        write(masks / rel, _png(np.zeros((4, 4), np.uint8)))
    plan = _plan(images, masks)
    assert plan.class_names == ("cat", "dog")
    assert {f.rel_path: f.label for f in plan.files} == {"cat/a.png": 0, "cat/b.png": 0, "dog/c.png": 1}
    assert {f.rel_path: of_file(f.targets)[0] for f in plan.files} == {
        rel: str(masks / rel) for rel in ("cat/a.png", "cat/b.png", "dog/c.png")}
    # One file nested deeper: not class folders, every label -1.
    write(images / "dog" / "deep" / "d.png", encode(pixels(1, size=(4, 4)), "PNG"))
    write(masks / "dog" / "deep" / "d.png", _png(np.zeros((4, 4), np.uint8)))
    plan = _plan(images, masks)
    assert plan.class_names == ()
    assert {f.label for f in plan.files} == {-1}
    with pytest.raises(ValueError, match="--class_names"):
        _plan(images, masks, class_names=("cat", "dog"))


def test_masks_inside_the_input_are_not_inputs_and_16_bit_headers_decide_the_dtype(tmp_path):
    root = tmp_path / "photos"
    write(root / "a.jpg", encode(pixels(1, size=(4, 4)), "JPEG"))
    write(root / "b.jpg", encode(pixels(2, size=(4, 4)), "JPEG"))
    write(root / "masks" / "a.png", _palette_png(np.zeros((4, 4), np.uint8)))
    write(root / "masks" / "b.tif", _tiff(np.zeros((4, 4), np.uint16)))
    plan = _plan(root, root / "masks")
    assert sorted(f.rel_path for f in plan.files) == ["a.jpg", "b.jpg"]
    assert plan.num_found == 2 and not plan.problems
    assert plan.masks.dtype == "uint16"


@pytest.mark.parametrize("suffix", ["nocolon", "a:b:c", ":", "a/b:c"])
def test_mask_suffix_is_validated(suffix):
    with pytest.raises(ValueError) as e:
        MaskOptions("masks", suffix)
    assert "--mask_suffix" in str(e.value) and "IMAGE_SUFFIX:MASK_SUFFIX" in str(e.value)
    assert repr(suffix) in str(e.value)


def test_mask_suffix_alone_is_a_usage_error(tmp_path, capsys):
    write(tmp_path / "in" / "a" / "x.png", encode(pixels(1), "PNG"))
    status = convert_module.main(["--input_dir", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"),
                                  "--mask_suffix", "_a:_b"])
    assert status == 2
    assert "--masks_dir" in capsys.readouterr().err


def test_resume_keeps_finished_shards_and_their_pixel_counts(voc, tmp_path):
    root, _, _, args = voc
    out = tmp_path / "resumed"
    strict = [a for a in args if a not in ("--max_reject_fraction", "0.5")]
    # Too many rejects for the default fraction: every shard is written, then no manifest.
    with pytest.raises(Exception, match="max_reject_fraction"):
        convert(root / "JPEGImages", out, *strict)
    assert not (out / schemas.MANIFEST_FILENAME).exists()
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tfrecord")}
    assert kept
    convert(root / "JPEGImages", out, *args, "--resume")
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.tfrecord")} == kept
    for name in [*kept, schemas.MANIFEST_FILENAME, schemas.NORMALIZED_FILENAME, schemas.REJECTS_FILENAME]:
        assert (out / name).read_bytes() == (root / "out" / name).read_bytes(), name


def test_every_page_of_a_multi_page_tiff_gets_the_mask(tmp_path):
    images, masks = tmp_path / "images", tmp_path / "masks"
    pages = np.stack([pixels(i, size=(24, 32), mode="L") for i in range(2)])
    tifffile.imwrite(write(images / "stack.tif", b""), pages)
    assert len(tifffile.TiffFile(images / "stack.tif").pages) == 2
    write(images / "single.png", encode(pixels(5), "PNG"))
    for i, name in enumerate(("stack.png", "single.png")):
        write(masks / name, _palette_png(_voc_ids(20 + i)))
    manifest = convert(images, tmp_path / "out", "--masks_dir", masks, "--raster_pages", "all")
    records = _by_name(read_records(tmp_path / "out"))
    assert sorted(records) == ["single.png", "stack.tif#page=0", "stack.tif#page=1"]
    for name, rec in records.items():
        source = masks / ("single.png" if name == "single.png" else "stack.png")
        np.testing.assert_array_equal(_decoded_mask(rec, tf.uint8), np.asarray(Image.open(source)))
    counts = collections.Counter()
    for rec in records.values():
        values, n = np.unique(_decoded_mask(rec, tf.uint8), return_counts=True)
        counts.update({str(v): int(c) for v, c in zip(values, n)})
    assert manifest.targets[TARGET_KIND]["pixel_counts"] == {"train": dict(counts)}


def test_masks_beside_their_images(tmp_path):
    root = tmp_path / "photos"
    for name in ("a", "b"):
        write(root / f"{name}.jpg", encode(pixels(1, size=(4, 4)), "JPEG"))
        write(root / f"{name}_mask.png", _palette_png(np.zeros((4, 4), np.uint8)))
    write(root / "c.jpg", encode(pixels(3, size=(4, 4)), "JPEG"))
    plan = _plan(root, root, mask_suffix=":_mask")
    assert {f.rel_path: of_file(f.targets)[0] for f in plan.files} == {
        "a.jpg": str(root / "a_mask.png"), "b.jpg": str(root / "b_mask.png")}
    assert [(p.rel_path, p.reason) for p in plan.problems] == [("c.jpg", "missing_mask")]
    assert plan.num_found == 3 and plan.masks.unmatched == 0
    with pytest.raises(ValueError, match="--mask_suffix"):
        _plan(root, root)


def test_a_missing_masks_dir_is_named(tmp_path):
    write(tmp_path / "in" / "a.png", encode(pixels(1), "PNG"))
    with pytest.raises(FileNotFoundError, match="--masks_dir"):
        _plan(tmp_path / "in", tmp_path / "nowhere")


@pytest.mark.parametrize("drawn", [None, "upright", "raw"])
def test_annotations_frame_says_on_which_frame_an_ambiguous_photos_mask_was_drawn(tmp_path, drawn):
    # An upside-down phone photo (EXIF 3) keeps its size when turned: a mask cannot tell by its size
    # whether it was drawn on the raw frame or where a viewer shows the photo.
    root, masks = tmp_path / "images", tmp_path / "masks"
    rot3 = _rotated_jpeg(3)
    for name in ("a/p.jpg", "b/q.jpg"):
        write(root / name, rot3)
    upright = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(rot3))).convert("L")) > 127
    drawn_upright = np.where(upright, 7, 1).astype(np.uint8)  # The block where a viewer shows it.
    for name in ("a/p.png", "b/q.png"):
        write(masks / name, _png(drawn_upright))
    flags = ["--annotations_frame", drawn] if drawn else []
    convert(root, tmp_path / "out", "--masks_dir", masks, *flags)
    for name, record in _by_name(read_records(tmp_path / "out")).items():
        stored = np.asarray(Image.open(io.BytesIO(record[schemas.IMAGE.key])).convert("L")) > 127
        on_block = _decoded_mask(record, tf.uint8)[stored]
        if drawn == "upright":
            assert (on_block == 7).all(), name  # Kept as drawn: on the block.
        else:
            # Taken as drawn on the raw frame (the default where the size cannot tell), and turned.
            assert (on_block == 1).all(), name
