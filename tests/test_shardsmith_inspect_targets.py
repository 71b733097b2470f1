"""`shardsmith inspect` of datasets with targets: masks, boxes, multi-labels and numbers (issue 24)."""

from __future__ import annotations

import numpy as np
import pytest
from _target_data import Box, TargetItem, photo, targets_section, write_target_dataset

from shardsmith import cli

_SIZE = (10, 20)
_BOX_NAMES = ("car", "person", "tree")
_CLASS_NAMES = ("sunny", "rainy")


def _row(text: str, first: str) -> list[str]:
    """The cells of the table row of `text` whose first cell is `first`."""
    rows = [line.split() for line in text.splitlines() if line.split()[:1] == [first]]
    assert len(rows) == 1, (first, text)
    return rows[0]


@pytest.fixture(scope="module")
def masks_and_boxes(tmp_path_factory):
    """train: 3 images, validation: 1; masks of ids 0, 1 and 255; boxes of 3 classes; no classes."""
    items = []
    for i in range(4):
        mask = np.zeros(_SIZE, np.uint8)
        mask[:, : 5 * (i + 1)] = 1  # Id 1 covers 50, 100, 150 pixels in train; 200 in validation.
        mask[0, :] = 255  # 20 pixels to ignore in each mask.
        boxes = () if i == 1 else tuple(Box(0.1, 0.1, 0.5, 0.5, label) for label in range(i % 3 + 1))
        items.append(TargetItem(f"img_{i}.png", photo(i, _SIZE), split="train" if i < 3 else "validation",
                                mask=mask, boxes=boxes))
    section = targets_section(items, ("mask", "boxes"), box_names=_BOX_NAMES)
    out = tmp_path_factory.mktemp("inspect") / "dataset"
    write_target_dataset(out, items, ("mask", "boxes"), section=section)
    return out, items, section


def test_masks_show_dtype_classes_and_pixel_shares(masks_and_boxes, capsys):
    out, items, section = masks_and_boxes
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "masks: uint8, 2 classes" in text  # Ids 0 and 1; 255 is the ignore id.
    assert _row(text, "mask")[:4] == ["mask", "id", "train", "pixels"]
    # Shares computed here from the masks themselves.
    for split in ("train", "validation"):
        masks = np.stack([item.mask for item in items if item.split == split])
        column = 1 if split == "train" else 2
        for mask_id, first in ((0, "0"), (1, "1"), (255, "255")):
            share = (masks == mask_id).sum() / masks.size
            cells = _row(text, first)
            if mask_id == 255:
                assert cells[1] == "(ignore)"
                cells = cells[1:]
            assert cells[column] == f"{share:.1%}"
    assert "no image-level classes" in text


def test_boxes_show_counts_per_class_images_without_and_issues(masks_and_boxes, capsys):
    out, items, section = masks_and_boxes
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "boxes: coco annotations from annotations.json, 3 classes" in text
    for label, name in enumerate(_BOX_NAMES):
        per = [sum(1 for item in items if item.split == split for box in item.boxes if box.label == label)
               for split in ("train", "validation")]
        assert _row(text, name) == [name, *(f"{n:,}" for n in per), f"{sum(per):,}"]
    without = {split: sum(1 for item in items if item.split == split and not item.boxes)
               for split in ("train", "validation")}
    assert f"images without boxes: train {without['train']}, validation {without['validation']}" in text
    assert "annotation issues: clipped 1" in text


def test_multi_labels_and_regression_targets(tmp_path, capsys):
    labels = [(0,), (0, 1), (), (1,), (0, 1)]
    items = [TargetItem(f"img_{i}.png", photo(i, _SIZE), split="train" if i < 4 else "test",
                        labels=lab, target=(1.0, 2.0, 3.0)) for i, lab in enumerate(labels)]
    section = targets_section(items, ("labels", "target"), class_names=_CLASS_NAMES, target_length=3)
    out = tmp_path / "dataset"
    write_target_dataset(out, items, ("labels", "target"), class_names=_CLASS_NAMES, section=section)
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "multi-label: images having each class" in text
    for c, name in enumerate(_CLASS_NAMES):
        per = [sum(1 for item in items if item.split == split and c in item.labels) for split in ("test", "train")]
        # The multi-label table alone: the records have no image-level label.
        assert _row(text, name) == [name, *(f"{n:,}" for n in per), f"{sum(per):,}"]
    assert "regression targets: 3 values per image" in text
    # Classes are missing from a split by the images having them, not by the image-level labels
    # (-1 here): both classes are in the test split.
    assert "have no test images" not in text
    rainy_only = [TargetItem("only.png", photo(9, _SIZE), split="validation", labels=(1,), target=(0.0,) * 3)]
    section = targets_section(items + rainy_only, ("labels", "target"), class_names=_CLASS_NAMES,
                              target_length=3)
    out = tmp_path / "missing"
    write_target_dataset(out, items + rainy_only, ("labels", "target"), class_names=_CLASS_NAMES,
                         section=section)
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 class(es) have no validation images: sunny" in text and "have no test images" not in text
