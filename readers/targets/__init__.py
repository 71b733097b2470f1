"""Every label mode, as a table: one module per kind of target, one row per mode.

What the reader's `label_mode` gives as each example's label, one
`TargetMode` row of `MODES` each: the image-level class (the `label`
feature), and the kinds of target of datasets converted with targets (issue
24; the record features are `schemas.TARGET_KINDS`, what they mean is in the
manifest's `targets` section):

- 'int', 'categorical', 'binary' (`readers.targets.classes`): the class
  index, one-hot, or 0/1 of a two-class dataset, converted per batch.

- 'mask' (`readers.targets.masks`): `(image, mask)`, mask int32
  [height, width, 1] of class ids; padding gets `MASK_IGNORE_IDS`.
- 'boxes' (`readers.targets.boxes`): `(image, {"boxes": float32 [n, 4],
  "classes": int32 [n]})`, boxes (ymin, xmin, ymax, xmax) as fractions of
  the output image; with `pad_boxes=N` every image has N rows.
- 'oriented_boxes' (`readers.targets.oriented`): `(image, {"corners":
  float32 [n, 4, 2], "classes": int32 [n]})`, each box's corners (x, y) as
  fractions of the output image; with `pad_boxes=N` every image has N rows.
- 'multi_hot' (`readers.targets.labels`): float32 [num_classes], 1 for
  every class of the image.
- 'target' (`readers.targets.numbers`): float32 [k], the regression targets.

Geometry: every step that moves pixels (centre or random crop, padding,
resize, flip) moves the target with the image, with the same parameters:
`readers.targets.geometry` decodes the image and returns what it went through
(a `Geometry`), and the mode's row moves its label by it. `TargetPlan` is a
mode of a target kind resolved once for a split; decoding
(`readers.decode.decode_mask`, `stack_boxes`) depends on the schema alone;
this package is the model side, as `readers.preprocess` is for images.

`shardsmith preview` draws each kind on its tiles as its row says
(`TargetMode.overlay`, `overlays`; `readers.targets.overlay`).

Adding a label mode (see docs/architecture.md, "A new target kind"): a module
here with its `MODE` (its label, and how it is drawn), and its row in `MODES`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from readers.targets import boxes as _boxes, classes as _classes, labels as _labels, masks as _masks
from readers.targets import numbers as _numbers, oriented as _oriented
from readers.targets.geometry import load_image
from readers.targets.mode import TargetMode
from schemas.features import IMAGE

__all__ = [
    "MODES",
    "TargetMode",
    "LABEL_MODES",
    "CLASS_KIND",
    "TARGET_LABEL_MODES",
    "KIND_OF_MODE",
    "MASK_IGNORE_IDS",
    "BOXES",
    "CLASSES",
    "TargetPlan",
    "mode_of",
    "supported_label_modes",
    "class_names",
    "overlays",
]

# The table: one row per label mode, in `readers.options.LABEL_MODES` order.
MODES: tuple[TargetMode, ...] = (*_classes.MODES, _masks.MODE, _boxes.MODE, _oriented.MODE, _labels.MODE,
                                 _numbers.MODE)

# Every label mode (None, no label, aside), and the kind of target each reads:
# `classes.KIND` for the image-level class, else a key of `schemas.TARGET_KINDS`.
LABEL_MODES = tuple(mode.name for mode in MODES)
CLASS_KIND = _classes.KIND
KIND_OF_MODE: Mapping[str, str] = {mode.name: mode.kind for mode in MODES}
# The modes of targets beyond the class: read per example, with the image's geometry.
TARGET_LABEL_MODES = tuple(mode.name for mode in MODES if mode.from_class is None)
MASK_IGNORE_IDS = _masks.MASK_IGNORE_IDS
BOXES, CLASSES = _boxes.BOXES, _boxes.CLASSES


def mode_of(label_mode) -> TargetMode | None:
    """The row of `label_mode`; None for None (no label) or a name no row has.

    Looked up in `MODES` as it is at the call, as every user of the table does.
    """
    if label_mode is None:
        return None
    return next((mode for mode in MODES if mode.name == label_mode), None)


def supported_label_modes(class_names, targets) -> tuple:
    """The label modes a dataset can be read with.

    Args:
      class_names: The manifest's class names ([] when records carry no
        image-level class: label -1).
      targets: The schema's kinds of target (`ImageExampleSchema.targets`).

    Returns:
      The modes, in `readers.options.LABEL_MODES` order, None last.
    """
    return (*(mode.name for mode in MODES if mode.applies_to(class_names, targets)), None)


def class_names(split_files, label_mode) -> list[str]:
    """The class names the labels of `label_mode` index, in label order (the
    manifest's class_names, unless the mode's row names others: those of the boxes)."""
    mode = mode_of(label_mode)
    names = mode.class_names(split_files) if mode is not None else None
    return list(split_files.class_names) if names is None else names


@dataclasses.dataclass(frozen=True)
class TargetPlan:
    """How the target of one label mode is read and transformed, resolved once.

    Attributes:
      mode: The `TargetMode` row.
      settings: What the mode resolved of the split and the options
        (`TargetMode.settings`).
      all_jpeg: Every image of the split is a JPEG (the manifest's image
        stats): decoded without a format check (a conditional per image).
    """

    mode: TargetMode
    settings: Any = None
    all_jpeg: bool = False

    @classmethod
    def of(cls, split_files, reading) -> TargetPlan | None:
        """The plan of `reading.label_mode` (`readers.options.ReadOptions`) for a split
        (`readers.metadata.SplitFiles`); None for the modes of the image-level class
        (`TargetMode.from_class`: converted per batch) and for None."""
        mode = mode_of(reading.label_mode)
        if mode is None or mode.from_class is not None:
            return None
        stats = split_files.images
        return cls(
            mode=mode,
            settings=mode.settings(split_files, reading),
            all_jpeg=bool(stats) and [f for f, _ in stats.formats] == ["jpeg"],
        )

    @property
    def label_mode(self) -> str:
        return self.mode.name

    @property
    def keys(self) -> tuple[str, ...]:
        """The record features this mode reads."""
        return self.mode.keys

    @property
    def ragged(self) -> bool:
        """Whether labels differ in shape between examples (boxes without `pad_boxes`)."""
        return self.mode.ragged(self.settings)

    def label_spec(self, image_size) -> Any:
        """The `tf.TypeSpec` structure of one example's label at `image_size`, or
        None when its shape is not known in advance (ragged boxes, a target
        length the manifest does not give)."""
        return self.mode.label_spec(self.settings, image_size)

    def placeholder_values(self) -> dict[str, Any]:
        """Feature values of a stand-in record for a skipped damaged one (1x1 image)
        that decode and transform like any other."""
        return self.mode.placeholder(self.settings)

    def load(self, features, image, *, channels: int, depth: tf.DType, seed=None):
        """Decodes one record's image and target, with the same geometry.

        Args:
          features: One parsed record: the image bytes and this mode's `keys`.
          image: The `readers.options.ImageOptions`.
          channels: Channels of the output image.
          depth: The image decoding depth (tf.uint8 or tf.uint16).
          seed: Shape [2] int tensor, the example's seed (augment='standard').

        Returns:
          (image, label): the float32 image [height, width, channels] exactly
          as `preprocess.load_image` gives it for the same seed, and the
          label of this mode (see its module).
        """
        mode = self.mode
        pixels, geometry = load_image(features[IMAGE.key], image, channels, depth, seed,
                                      all_jpeg=self.all_jpeg, flip_later=mode.flip is not None)
        label = mode.label(features, geometry, self.settings, image.image_size)
        if mode.flip is not None and geometry.flip is not None:
            pixels, label = tf.cond(
                geometry.flip,
                lambda: (tf.reverse(pixels, [1]), mode.flip(label)),
                lambda: (pixels, label),
            )
        return pixels, label


def overlays(manifest, split_files) -> list:
    """How `shardsmith preview` draws the dataset's targets: the `readers.targets.overlay.Overlay`
    of each kind it holds (`TargetMode.overlay`, asked of the first row of each kind), in table order."""
    out, kinds = [], set()
    for mode in MODES:
        if mode.kind not in kinds:
            kinds.add(mode.kind)
            overlay = mode.overlay(manifest, split_files)
            if overlay is not None:
                out.append(overlay)
    return out
