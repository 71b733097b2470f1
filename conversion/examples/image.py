"""The image kind: one input file (a photo, a DICOM slice, a raster or a patch of it) per record.

Its records are `schemas.ImageExampleSchema`'s; its shards are written by
`conversion.shard_writer`; with --raster_patch its TIFF scenes are cut into
patches planned from their headers (`conversion.scenes`). It is the table's
last row: it applies to every conversion that no other kind claims.
"""

from __future__ import annotations

from conversion import scenes as _scenes, shard_writer as _shard_writer
from conversion.examples.kind import ExampleKind, Grouped

__all__ = ["KIND"]


def _applies(validation) -> bool:
    return True


def _group(files: list, problems: list, config, appending=None) -> Grouped:
    # One file, one example (a scene's patches are planned later, from its windows).
    return Grouped(files, problems, None)


def _windows(files: list, grouped: Grouped, targets, config):
    raster = config.validation.raster
    if raster.patch is None:
        return None, {}
    if targets is not None:
        raise ValueError("--raster_patch does not combine with targets beyond one class (several "
                         "labels or numbers in --labels_csv) yet: give one label per scene.")
    return _scenes.scene_windows(files, raster)


def _cut_masks(mask_plan, windows, config):
    return _scenes.scene_masks(mask_plan, windows, config.validation.raster)


KIND = ExampleKind(
    name="image",
    applies=_applies,
    group=_group,
    record_schema=_shard_writer.record_schema,
    write_shard=_shard_writer.write_shard,
    warm_call=_shard_writer.warm_call,
    windows=_windows,
    cut_masks=_cut_masks,
)
