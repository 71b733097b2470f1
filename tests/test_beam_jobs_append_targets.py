"""convert --append on datasets of targets: boxes (COCO, VOC), several labels, numbers, masks (issue 38).

Each test converts a folder of real image files with its targets, adds files (and their targets: a
new COCO or VOC annotation file, new rows in the labels CSV, new masks), appends, and then reads the
dataset back with the reader: version 1 exactly as it was before the append, the latest version like
a full conversion of the grown folder (the same files in the same splits with the same pixels and
targets, compared by class name: the grown dataset's classes come by first appearance), the old
shard bytes unchanged, and `verify` passing on every version.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from helpers import convert  # noqa: E402

import readers  # noqa: E402
import schemas  # noqa: E402
from beam_jobs import verify  # noqa: E402
from schemas.manifest import SHARD_FILENAME_RE  # noqa: E402

SPLIT = ("--split", "train=0.6,validation=0.4", "--min_shards", "1")
SPLITS = ("train", "validation")


def _shard_bytes(out: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if SHARD_FILENAME_RE.match(p.name)}


def _photo(path: pathlib.Path, seed: int, size=(20, 28)) -> None:
    rng = np.random.default_rng(seed)
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w]
    arr = ((rng.integers(0, 256, 3) + 5 * yy[..., None] + 3 * xx[..., None]) % 256).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)  # PNG: lossless, pixels compare exactly


def _read(out, mode, version=None) -> dict[str, tuple[str, np.ndarray, object]]:
    """Name -> (split, pixels, target as numpy values) of every record the reader gives."""
    seen = {}
    manifest = readers.load_manifest(str(out), version=version)
    for split in SPLITS:
        if split not in manifest.splits or not manifest.splits[split].num_records:
            continue
        ds = readers.image_dataset_from_tfrecords(
            str(out), split, batch_size=None, image_size=None, dtype="uint8", shuffle=False,
            label_mode=mode, extra_features=(schemas.FILENAME.key,), version=version)
        for image, target, extras in ds:
            name = extras[schemas.FILENAME.key].numpy().decode()
            value = {k: v.numpy() for k, v in target.items()} if isinstance(target, dict) else target.numpy()
            seen[name] = (split, image.numpy(), value)
    return seen


def _by_name(seen, manifest, mode):
    """The targets of `_read` with class indices replaced by class names (orders differ by design)."""
    out = {}
    for name, (split, image, target) in seen.items():
        if mode == "boxes":
            names = manifest.targets["boxes"]["class_names"]
            target = (target["boxes"].round(6).tolist(), [names[c] for c in target["classes"]])
        elif mode == "multi_hot":
            target = sorted(manifest.class_names[i] for i in np.flatnonzero(target))
        elif mode == "mask":
            target = target.tobytes()
        else:
            target = target.tolist()
        out[name] = (split, image.tobytes(), target)
    return out


def _check_grown(tmp_path, inp, out, flags, mode, v1_seen, v1_shards, rebuild_flags=None):
    """The grown dataset against version 1 as it was and against a full conversion of the grown folder."""
    grown = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    assert grown.latest_version == 2
    # The held files the annotations, CSV rows and masks still name are held, not 'missing_file'.
    assert grown.rejects == {} and grown.counts["found"] == grown.counts["written"]
    # Old shards: every byte as before; version 1 reads exactly as before the append.
    after = _shard_bytes(out)
    assert {n: b for n, b in after.items() if n in v1_shards} == v1_shards
    assert set(after) - set(v1_shards), "the append wrote no new shard"
    v1_now = _read(out, mode, version=1)
    assert v1_now.keys() == v1_seen.keys()
    v1_manifest = readers.load_manifest(str(out), version=1)
    assert _by_name(v1_now, v1_manifest, mode) == _by_name(v1_seen, v1_manifest, mode)
    # The latest version, and version=2, like a full conversion of the grown folder.
    rebuilt = tmp_path / "rebuilt"
    convert(inp, rebuilt, *SPLIT, *(flags if rebuild_flags is None else rebuild_flags))
    full = _by_name(_read(rebuilt, mode), readers.load_manifest(str(rebuilt)), mode)
    latest = _by_name(_read(out, mode), grown, mode)
    assert latest.keys() == full.keys()
    for name in full:
        assert latest[name] == full[name], name
    assert _by_name(_read(out, mode, version=2), grown, mode) == latest
    assert len(latest) > len(v1_now)
    # verify reads every shard of every version and checks every record's targets.
    assert verify.main([str(out)]) == 0
    return grown, readers.load_manifest(str(rebuilt))


def _grow(tmp_path, inp, out, flags, mode, add):
    """Converts, reads version 1, calls `add()` to grow the folder, appends; the grown manifest."""
    convert(inp, out, *SPLIT, *flags)
    v1_seen = _read(out, mode)
    v1_shards = _shard_bytes(out)
    new_flags = add() or flags
    convert(inp, out, *SPLIT, *new_flags, "--append")
    return _check_grown(tmp_path, inp, out, new_flags, mode, v1_seen, v1_shards)


def _coco(path: pathlib.Path, images: dict[str, list], categories: dict[int, str]) -> None:
    """A COCO instances file: images by file name, each with its boxes (x, y, w, h, category id)."""
    doc = {"images": [], "annotations": [], "categories": [{"id": i, "name": n} for i, n in categories.items()]}
    for k, (name, boxes) in enumerate(sorted(images.items())):
        doc["images"].append({"id": 10 + k, "file_name": name, "width": 28, "height": 20})
        for j, (x, y, w, h, cid) in enumerate(boxes):
            doc["annotations"].append({"id": 100 * k + j, "image_id": 10 + k, "bbox": [x, y, w, h],
                                       "category_id": cid, "iscrowd": 0, "area": w * h})
    path.write_text(json.dumps(doc))


def test_coco_boxes_grow_with_a_new_annotation_file_and_a_new_category(tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    images = {}
    for k in range(8):
        _photo(inp / f"img_{k}.png", k)
        images[f"img_{k}.png"] = [(1 + k, 2, 10, 8, (1, 18)[k % 2])] + ([(12, 5, 9, 9, 1)] if k % 3 == 0 else [])
    _coco(tmp_path / "v1.json", images, {1: "person", 18: "dog"})

    def add():
        for k in range(8, 14):
            _photo(inp / f"img_{k}.png", k)
            # "cat" has id 5: a full conversion puts it between person and dog (id order).
            images[f"img_{k}.png"] = [(2, 3, 11, 7, (5, 18, 1)[k % 3])]
        _coco(tmp_path / "v2.json", images, {1: "person", 18: "dog", 5: "cat"})
        return ("--annotations", tmp_path / "v2.json")

    grown, rebuilt = _grow(tmp_path, inp, out, ("--annotations", tmp_path / "v1.json"), "boxes", add)
    boxes = grown.targets["boxes"]
    # Held classes keep their indices (and COCO ids); the new one comes last, by first appearance.
    assert boxes["class_names"] == ["person", "dog", "cat"] and boxes["category_ids"] == [1, 18, 5]
    assert boxes["class_order"] == "first_appearance" and "missing_file" not in boxes["issues"]
    assert rebuilt.targets["boxes"]["class_names"] == ["person", "cat", "dog"]
    # Boxes per class and split: every version's, added up, as the full conversion counts them.
    order = [rebuilt.targets["boxes"]["class_names"].index(n) for n in boxes["class_names"]]
    for split in SPLITS:
        want = rebuilt.targets["boxes"]["counts"].get(split, [0, 0, 0])
        assert boxes["counts"].get(split, [0, 0, 0]) == [want[i] for i in order], split
        assert boxes["images_without_boxes"].get(split, 0) == rebuilt.targets["boxes"]["images_without_boxes"].get(
            split, 0)
    # Version 1 as it was: two box classes.
    assert readers.load_manifest(str(out), version=1).targets["boxes"]["class_names"] == ["person", "dog"]


def _voc(folder: pathlib.Path, stem: str, objects) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    body = "".join(f"<object><name>{n}</name><bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax>"
                   f"<ymax>{y2}</ymax></bndbox></object>" for n, x1, y1, x2, y2 in objects)
    (folder / f"{stem}.xml").write_text(f"<annotation><filename>{stem}.png</filename><size><width>28</width>"
                                        f"<height>20</height><depth>3</depth></size>{body}</annotation>")


def test_voc_boxes_grow_with_new_xml_files(tmp_path):
    inp, out, ann = tmp_path / "in", tmp_path / "out", tmp_path / "Annotations"
    for k in range(8):
        _photo(inp / f"v{k}.png", 40 + k)
        _voc(ann, f"v{k}", [(("horse", "sheep")[k % 2], 2 + k, 3, 20, 15)])

    def add():
        for k in range(8, 13):
            _photo(inp / f"v{k}.png", 40 + k)
            # "cow" sorts first in a full conversion; here it comes after the held classes.
            _voc(ann, f"v{k}", [(("cow", "horse")[k % 2], 1, 1, 12 + k, 18)])

    grown, rebuilt = _grow(tmp_path, inp, out, ("--annotations", ann), "boxes", add)
    assert grown.targets["boxes"]["class_names"] == ["horse", "sheep", "cow"]
    assert rebuilt.targets["boxes"]["class_names"] == ["cow", "horse", "sheep"]


def _labels_csv(path: pathlib.Path, rows: dict[str, str], column="label") -> None:
    path.write_text(f"path,{column}\n" + "".join(f"{p},{v}\n" for p, v in rows.items()))


def test_several_labels_grow_with_new_csv_rows_and_a_new_class(tmp_path):
    inp, out, csv = tmp_path / "in", tmp_path / "out", tmp_path / "labels.csv"
    rows = {}
    for k in range(8):
        _photo(inp / f"x{k}.png", 80 + k)
        rows[f"x{k}.png"] = ("Mass|Nodule", "Nodule", "Effusion|Mass")[k % 3]
    _labels_csv(csv, rows)

    def add():
        for k in range(8, 13):
            _photo(inp / f"x{k}.png", 80 + k)
            rows[f"x{k}.png"] = ("Atelectasis|Mass", "Nodule")[k % 2]
        _labels_csv(csv, rows)

    grown, rebuilt = _grow(tmp_path, inp, out, ("--labels_csv", csv), "multi_hot", add)
    assert grown.class_names == ("Effusion", "Mass", "Nodule", "Atelectasis")
    assert grown.class_order == "first_appearance"
    assert readers.load_manifest(str(out), version=1).class_names == ("Effusion", "Mass", "Nodule")
    order = [rebuilt.class_names.index(n) for n in grown.class_names]
    for split in SPLITS:
        want = rebuilt.targets["labels"]["counts"].get(split, [0] * 4)
        assert grown.targets["labels"]["counts"].get(split, [0] * 4) == [want[i] for i in order], split


def test_numbers_grow_with_new_csv_rows_and_another_count_is_refused(tmp_path):
    inp, out, csv = tmp_path / "in", tmp_path / "out", tmp_path / "targets.csv"
    rows = {}
    for k in range(7):
        _photo(inp / f"n{k}.png", 120 + k)
        rows[f"n{k}.png"] = f"{k * 0.5}|{-k}"
    _labels_csv(csv, rows, "target")

    def add():
        for k in range(7, 11):
            _photo(inp / f"n{k}.png", 120 + k)
            rows[f"n{k}.png"] = f"{k * 0.25}|{k + 0.125}"
        _labels_csv(csv, rows, "target")

    grown, _ = _grow(tmp_path, inp, out, ("--labels_csv", csv), "target", add)
    assert grown.targets["target"]["length"] == 2
    # Three numbers per image now: refused, naming the option, and nothing written.
    _photo(inp / "n99.png", 199)
    _labels_csv(csv, {p: "1|2|3" for p in [*rows, "n99.png"]}, "target")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match="--labels_csv"):
        convert(inp, out, *SPLIT, "--labels_csv", csv, "--append")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def _mask(path: pathlib.Path, seed: int, dtype=np.uint8, top=4, size=(20, 28)) -> None:
    rng = np.random.default_rng(seed)
    ids = np.zeros(size, dtype)
    ids[: size[0] // 2] = rng.integers(0, top)
    ids[size[0] // 2:, : size[1] // 3] = rng.integers(0, top)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(ids).save(path)


def test_masks_grow_with_new_masks_in_class_folders(tmp_path):
    inp, out, masks = tmp_path / "in", tmp_path / "out", tmp_path / "masks"
    for k in range(8):
        rel = f"{('road', 'field')[k % 2]}/m{k}.png"
        _photo(inp / rel, 160 + k)
        _mask(masks / rel, k)

    def add():
        for k in range(8, 13):
            rel = f"{('road', 'field', 'lake')[k % 3]}/m{k}.png"
            _photo(inp / rel, 160 + k)
            _mask(masks / rel, k, top=6)  # class ids 4 and 5 appear only now

    grown, rebuilt = _grow(tmp_path, inp, out, ("--masks_dir", masks), "mask", add)
    section, full = grown.targets["mask"], rebuilt.targets["mask"]
    assert section["dtype"] == full["dtype"] == "uint8"
    assert section["num_classes"] == full["num_classes"]
    assert section["pixel_counts"] == full["pixel_counts"]
    assert grown.class_names == ("field", "road", "lake") and grown.class_order == "first_appearance"


def test_a_uint16_mask_dataset_takes_8_bit_masks_and_an_8_bit_one_refuses_16_bit_masks(tmp_path):
    inp, out, masks = tmp_path / "in", tmp_path / "out", tmp_path / "masks"
    for k in range(6):
        _photo(inp / f"a/w{k}.png", 200 + k)
        _mask(masks / f"a/w{k}.png", k, np.uint16, top=300)

    def add():
        for k in range(6, 9):
            _photo(inp / f"a/w{k}.png", 200 + k)
            _mask(masks / f"a/w{k}.png", k)  # 8-bit PNGs: stored at the dataset's 16 bits

    grown, _ = _grow(tmp_path, inp, out, ("--masks_dir", masks), "mask", add)
    assert grown.targets["mask"]["dtype"] == "uint16"

    inp8, out8, masks8 = tmp_path / "in8", tmp_path / "out8", tmp_path / "masks8"
    for k in range(4):
        _photo(inp8 / f"a/w{k}.png", 300 + k)
        _mask(masks8 / f"a/w{k}.png", k)
    convert(inp8, out8, *SPLIT, "--masks_dir", masks8)
    _photo(inp8 / "a/w9.png", 309)
    _mask(masks8 / "a/w9.png", 9, np.uint16, top=1000)
    before = {p.name: p.read_bytes() for p in out8.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match="--masks_dir"):
        convert(inp8, out8, *SPLIT, "--masks_dir", masks8, "--append")
    assert {p.name: p.read_bytes() for p in out8.iterdir() if p.is_file()} == before


def test_an_append_that_changes_the_target_kind_or_label_mode_is_refused(tmp_path):
    inp, out, csv = tmp_path / "in", tmp_path / "out", tmp_path / "labels.csv"
    rows = {f"p{k}.png": "a|b" for k in range(5)}
    for k in range(5):
        _photo(inp / f"p{k}.png", 240 + k)
        _mask(tmp_path / "masks" / f"p{k}.png", k)
    _labels_csv(csv, rows)
    convert(inp, out, *SPLIT, "--labels_csv", csv)
    _photo(inp / "p9.png", 249)
    _mask(tmp_path / "masks" / "p9.png", 9)
    rows["p9.png"] = "b"
    _labels_csv(csv, rows)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir() if p.is_file()}
    # Masks beside the labels: another target kind.
    with pytest.raises(ValueError, match=r"another target kind .*mask \(--masks_dir or --annotation_masks\)"):
        convert(inp, out, *SPLIT, "--labels_csv", csv, "--masks_dir", tmp_path / "masks", "--append")
    # Numbers instead of several labels: another label mode of the labels CSV.
    _labels_csv(tmp_path / "numbers.csv", {p: "1.5" for p in rows}, "target")
    with pytest.raises(ValueError, match=r"another target kind .*--labels_csv \(a target column\)"):
        convert(inp, out, *SPLIT, "--labels_csv", tmp_path / "numbers.csv", "--append")
    # No labels CSV at all: another label mode.
    with pytest.raises(ValueError, match="--labels_csv"):
        convert(inp, out, *SPLIT, "--append")
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir() if p.is_file()} == before


def _read_stacks(out, version=None) -> dict[str, tuple[str, bytes, str, list]]:
    """Location -> (split, stack bytes, class name, dates) of every stack the reader gives."""
    manifest = readers.load_manifest(str(out), version=version)
    seen = {}
    for split in SPLITS:
        if split not in manifest.splits or not manifest.splits[split].num_records:
            continue
        ds = readers.time_series_dataset_from_tfrecords(
            str(out), split, batch_size=None, dtype=None, shuffle=False, version=version,
            extra_features=(schemas.FILENAME.key, "stack/dates"))
        for stack, label, extras in ds:
            seen[extras[schemas.FILENAME.key].numpy().decode()] = (
                split, stack.numpy().tobytes(), manifest.class_names[int(label)],
                extras["stack/dates"].numpy().tolist())
    return seen


def test_time_series_grow_by_new_locations_and_a_new_pass_of_a_held_one_is_reported(tmp_path):
    from helpers import write_geotiff

    pytest.importorskip("rasterio")
    inp, out = tmp_path / "in", tmp_path / "out"
    rng = np.random.default_rng(7)

    def location(rel, dates):
        for date in dates:
            write_geotiff(inp / rel / f"{date}.tif", rng.integers(0, 3000, (2, 6, 5), dtype=np.uint16))

    for k in range(5):
        location(f"{('corn', 'wheat')[k % 2]}/field_{k}", ("2021-04-01", "2021-05-01", "2021-06-01"))
    flags = ("--time_series",)
    convert(inp, out, *SPLIT, *flags, "--append")
    v1_seen, v1_shards = _read_stacks(out), _shard_bytes(out)
    for k in range(5, 9):
        location(f"{('corn', 'wheat', 'rice')[k % 3]}/field_{k}", ("2021-04-02", "2021-05-02"))
    location("corn/field_0", ("2021-07-01",))  # a new pass of a held location: its record stays
    grown = convert(inp, out, *SPLIT, *flags, "--append")
    assert grown.latest_version == 2 and grown.versions[-1].inputs["changed"] == 1
    report = json.loads((out / "append_report.json").read_text())
    assert report["changed"] == ["corn/field_0"]
    after = _shard_bytes(out)
    assert {n: b for n, b in after.items() if n in v1_shards} == v1_shards
    assert _read_stacks(out, version=1) == v1_seen
    assert readers.load_manifest(str(out), version=1).extra[schemas.TIME_SERIES]["steps"] == [3]
    # The latest version against a full conversion of the grown folder without field_0's new pass.
    (inp / "corn/field_0/2021-07-01.tif").unlink()
    convert(inp, tmp_path / "rebuilt", *SPLIT, *flags)
    full = _read_stacks(tmp_path / "rebuilt")
    latest = _read_stacks(out)
    assert latest.keys() == full.keys() and len(latest) == 9
    for name in full:
        assert latest[name] == full[name], name
    assert _read_stacks(out, version=2) == latest
    rebuilt = readers.load_manifest(str(tmp_path / "rebuilt"))
    section = grown.extra[schemas.TIME_SERIES]
    assert section["locations"] == rebuilt.extra[schemas.TIME_SERIES]["locations"]
    assert section["steps"] == [2, 3] and grown.class_names == ("corn", "wheat", "rice")
    assert verify.main([str(out)]) == 0
    # Nothing new: no version added.
    assert convert(inp, out, *SPLIT, *flags, "--append").latest_version == 2


def test_time_series_converted_without_append_get_their_locations_from_the_shards(tmp_path):
    from helpers import write_geotiff

    pytest.importorskip("rasterio")
    inp, out = tmp_path / "in", tmp_path / "out"
    rng = np.random.default_rng(11)

    def location(rel, dates):
        for date in dates:
            write_geotiff(inp / rel / f"{date}.tif", rng.integers(0, 3000, (1, 4, 4), dtype=np.uint16))

    for k in range(3):
        location(f"a/loc{k}", ("2022-01-01", "2022-02-01"))
    convert(inp, out, "--time_series", "--num_shards", "1")
    location("a/loc9", ("2022-01-01", "2022-02-01"))
    grown = convert(inp, out, "--time_series", "--num_shards", "1", "--append")
    inventory = [json.loads(line) for line in (out / "inputs-v00001.jsonl").read_text().splitlines()]
    assert [e["path"] for e in inventory] == ["a/loc0", "a/loc1", "a/loc2"]
    assert all(e["sha256"] for e in inventory)
    assert grown.versions[-1].inputs["new"] == 2 and grown.versions[-1].inputs["held"] == 3
    location("a/loc1", ("2022-03-01",))
    location("a/loc8", ("2022-01-01",))
    third = convert(inp, out, "--time_series", "--num_shards", "1", "--append")
    assert third.latest_version == 3 and third.versions[-1].inputs["changed"] == 1
    report = json.loads((out / "append_report.json").read_text())
    assert report["changed"] == ["a/loc1"]
