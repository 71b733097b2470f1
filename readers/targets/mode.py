"""The row type of the reader's table of label modes (`readers.targets.MODES`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["TargetMode"]


def _nothing(*_) -> dict:
    """The default `settings` (split_files, reading) and `placeholder` (settings): nothing."""
    return {}


def _never(settings) -> bool:
    return False


def _manifest_class_names(split_files) -> None:
    return None


def _no_overlay(manifest, split_files):
    return None


@dataclasses.dataclass(frozen=True)
class TargetMode:
    """One label mode of a kind of target: one row of `readers.targets.MODES`.

    A row reads its label one of two ways: per example, with the image's
    geometry (`label`: masks, boxes, several labels, numbers), or per batch
    from the image-level class (`from_class`: 'int', 'categorical',
    'binary'), the image then taking the plain image path.

    Attributes:
      name: The `label_mode` value ('int', 'mask', 'boxes', ...).
      kind: The kind of target it reads: a key of `schemas.TARGET_KINDS`
        (of the schema's `targets` and of the manifest's `targets`
        section), or `readers.targets.classes.KIND` for the image-level
        class (the `label` feature).
      keys: The record features it reads.
      settings: (split_files, reading) -> what the mode needs to know of
        the split (`readers.metadata.SplitFiles`, its manifest's `targets`
        section) and of the reading options (`readers.options.ReadOptions`,
        e.g. `pad_boxes`), resolved once per read; a frozen value.
      label: (features, geometry, settings, image_size) -> the label of one
        example under its image's `readers.targets.geometry.Geometry`
        (image_size: the output size, or None when nothing is resized).
      label_spec: (settings, image_size) -> the `tf.TypeSpec` structure of
        one example's label, or None when its shape is not known in advance.
      flip: label -> the label mirrored left-right, done in one conditional
        with the image's flip (a mask); None when the label needs no flip or
        reads `geometry.flip` itself (boxes).
      placeholder: settings -> the feature values of a stand-in record for a
        skipped damaged one (a 1x1 image) that decode like any other.
      ragged: settings -> whether labels differ in shape between examples
        (batched as RaggedTensors).
      moves_with_image: Whether the label follows the image's geometry (a
        callable `augment`, which sees the image alone, is then refused).
      image_shaped: Whether the label has its image's height and width (it
        then gets the static shape of a split of one stored size).
      class_names: split_files -> the class names its labels index, or None
        for the manifest's `class_names`.
      from_class: (labels, num_classes) -> the labels of the image-level
        classes `labels` (int64, of one example or a batch: elementwise),
        for a mode of the image-level class; None for a mode read per
        example with its image's geometry (`label`).
      applies: (class_names, targets) -> whether a dataset of these class
        names and kinds of target (`ImageExampleSchema.targets`) can be read
        in this mode. Default: its `kind` is among `targets`.
      overlay: (manifest, split_files) -> how `shardsmith preview` draws
        this kind on its tiles (`readers.targets.overlay.Overlay`), or None
        when the dataset has none of it; the default draws nothing. Asked
        of one row per kind.
    """

    name: str
    kind: str
    keys: tuple[str, ...]
    settings: Callable[[Any, Any], Any] = _nothing
    label: Callable[[Any, Any, Any, Any], Any] | None = None
    label_spec: Callable[[Any, Any], Any] | None = None
    flip: Callable[[Any], Any] | None = None
    placeholder: Callable[[Any], dict] = _nothing
    ragged: Callable[[Any], bool] = _never
    moves_with_image: bool = False
    image_shaped: bool = False
    class_names: Callable[[Any], list[str] | None] = _manifest_class_names
    from_class: Callable[[Any, int], Any] | None = None
    applies: Callable[[Any, Any], bool] | None = None
    overlay: Callable[[Any, Any], Any] = _no_overlay

    def applies_to(self, class_names, targets) -> bool:
        """Whether a dataset of `class_names` and kinds of target `targets` reads in this mode."""
        return self.kind in targets if self.applies is None else bool(self.applies(class_names, targets))
