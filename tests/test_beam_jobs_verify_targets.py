"""verify: the targets of issue 24 (masks, boxes, multi-labels, numbers) checked record by record."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from _target_data import Box, TargetItem, photo, targets_section, write_target_dataset

import schemas
from beam_jobs import verify

_SIZE = (12, 16)
_BOX_NAMES = ("cat", "dog")
_CLASS_NAMES = ("indoor", "outdoor", "night")
_ALL = ("boxes", "labels", "mask", "target")


def _mask(seed: int, size=_SIZE, dtype=np.uint8) -> np.ndarray:
    """Class ids 0..2 in bands, and an ignore stripe of 255 (65535 for uint16)."""
    h, w = size
    mask = ((np.arange(w)[None, :] + seed) // 6 % 3).repeat(h, axis=0).astype(dtype)
    mask[0, :] = np.iinfo(dtype).max
    return mask


def _items(n: int = 6, dtype=np.uint8) -> list[TargetItem]:
    items = []
    for i in range(n):
        boxes = () if i % 3 == 2 else (
            Box(0.1, 0.2, 0.5, 0.9, i % 2), Box(0.0, 0.0, 1.0, 1.0, 1, is_crowd=1))
        items.append(TargetItem(
            filename=f"img_{i:02d}.png", pixels=photo(i, _SIZE), label=-1,
            split="train" if i < 4 else "validation", mask=_mask(i, dtype=dtype), boxes=boxes,
            labels=tuple(sorted({i % 3, (i + 1) % 3})), target=(float(i), 0.5)))
    return items


def _write(tmp_path, items, kinds=_ALL, class_names=_CLASS_NAMES, mask_dtype="uint8", **section):
    section = section.get("section") or targets_section(
        items, kinds, class_names=class_names, box_names=_BOX_NAMES, mask_dtype=mask_dtype,
        target_length=2)
    out = tmp_path / "dataset"
    write_target_dataset(out, items, kinds, class_names=class_names, section=section)
    return out


def _problems(out) -> list[str]:
    return json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())["problems"]


def test_a_dataset_with_every_kind_of_target_verifies(tmp_path, capsys):
    out = _write(tmp_path, _items())
    assert verify.main([str(out)]) == 0
    report = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())
    assert report["ok"] and report["problems"] == [] and report["records"] == 6
    assert report["targets"] == ["boxes", "labels", "mask", "target"]
    assert "targets checked: boxes, labels, mask, target" in capsys.readouterr().out


def test_16_bit_masks_verify_when_the_manifest_says_uint16(tmp_path):
    items = _items(4, dtype=np.uint16)
    out = _write(tmp_path, items, ("mask",), class_names=(), mask_dtype="uint16")
    assert verify.main([str(out)]) == 0


def _replace(items, index, **changes):
    items = list(items)
    items[index] = dataclasses.replace(items[index], **changes)
    return items


# (what is broken, the change to record 1, fragments the problem must hold)
_BROKEN = [
    ("mask of another size", dict(mask=_mask(1, size=(10, 16))),
     ["mask", "(10, 16, 1)", "(12, 16, 1)"]),
    ("16-bit mask in a uint8 dataset", dict(mask=_mask(1, dtype=np.uint16)), ["mask", "uint16", "uint8"]),
    ("mask id above num_classes", dict(mask=np.full(_SIZE, 7, np.uint8)), ["mask", "[7]", "num_classes"]),
    ("box right of the image", dict(boxes=(Box(0.5, 0.1, 1.25, 0.4, 0),)), ["box 0", "1.25", "[0, 1]"]),
    ("box with xmin above xmax", dict(boxes=(Box(0.1, 0.6, 0.9, 0.2, 0),)), ["box 0", "min above its max"]),
    ("box label out of range", dict(boxes=(Box(0.1, 0.1, 0.2, 0.2, 0), Box(0.1, 0.1, 0.2, 0.2, 2))),
     ["box 1", schemas.BBOX_LABEL.key, "2", "[0, 2)"]),
    ("is_crowd not 0 or 1", dict(boxes=(Box(0.1, 0.1, 0.2, 0.2, 0, is_crowd=3),)),
     ["box 0", schemas.BBOX_IS_CROWD.key, "3"]),
    ("box lists of different lengths", dict(extra={schemas.BBOX_LABEL.key: [0, 1, 1]}),
     ["box lists of different lengths", f"'{schemas.BBOX_LABEL.key}': 3"]),
    ("multi-label out of range", dict(labels=(0, 3)), [schemas.LABELS.key, "[3]", "[0, 3)"]),
    ("multi-labels unsorted", dict(labels=(2, 0)), [schemas.LABELS.key, "not sorted"]),
    ("multi-label twice", dict(labels=(1, 1)), [schemas.LABELS.key, "not sorted"]),
    ("target of another length", dict(target=(1.0, 2.0, 3.0)), [schemas.TARGET.key, "3 values", "length is 2"]),
    ("image label out of range", dict(label=3), ["label 3", "[0, 3)"]),
]


@pytest.mark.parametrize("change, fragments", [b[1:] for b in _BROKEN], ids=[b[0] for b in _BROKEN])
def test_a_broken_target_is_a_problem_naming_the_record(tmp_path, capsys, change, fragments):
    good = _items()
    section = targets_section(good, _ALL, class_names=_CLASS_NAMES, box_names=_BOX_NAMES,
                              target_length=2)
    out = _write(tmp_path, _replace(good, 1, **change), section=section)
    assert verify.main([str(out)]) == 1
    problems = _problems(out)
    mine = [p for p in problems if "img_01.png" in p]
    assert len(mine) == 1, problems
    assert "train-00001-of-00002.tfrecord: record 0" in mine[0]  # Item 1: shard 1's first record.
    for fragment in fragments:
        assert fragment in mine[0]
    # Every other record is fine: nothing else names a record.
    assert not [p for p in problems if ": record " in p and p not in mine]
    assert "MISMATCH" in capsys.readouterr().out


def test_no_label_is_allowed_only_without_class_names(tmp_path):
    items = [dataclasses.replace(item, label=-1) for item in _items(4)]
    out = _write(tmp_path, items, ("mask",), class_names=())
    assert verify.main([str(out)]) == 0
    # The same records in a dataset that names classes (and has no multi-labels): every record fails.
    out = _write(tmp_path / "named", items, ("mask",), class_names=_CLASS_NAMES)
    assert verify.main([str(out)]) == 1
    problems = [p for p in _problems(out) if ": record " in p]
    assert len(problems) == 4 and all("label -1" in p and "3 class_names" in p for p in problems)


def test_a_manifest_without_the_targets_section_is_named_once_per_shard(tmp_path):
    items = _items(4)
    out = _write(tmp_path, items, ("mask", "boxes"), class_names=(), section={"boxes": {}})
    assert verify.main([str(out)]) == 1
    problems = _problems(out)
    assert len([p for p in problems if "targets.mask" in p]) == 2  # One per shard of train.
    assert len([p for p in problems if "targets.boxes" in p and "class_names" in p]) == 2
