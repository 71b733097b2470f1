"""--raster_patch on the driver: the work items of every scene and the masks cut with them, from headers.

The image kind's planning of scenes cut into patches (`conversion.examples.image`):
each TIFF or JPEG 2000 scene's header is read (no pixel decoded) on a few threads, into
work items of patches (`imaging.scenes.work_items`), and each scene's label
raster (--masks_dir) is checked against it. A scene or mask whose header
fails is rejected with its reason; the others are planned.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging

import numpy as np

from conversion import guard, listing as _listing
from conversion.files import open_to_read

__all__ = ["SCENE_SUFFIXES", "scene_masks", "scene_windows"]

# With --raster_patch, the inputs cut into patches (any other is converted as without it):
# GeoTIFFs, and JPEG 2000 (Sentinel-2's bands), read tile by tile (`imaging.patches.open_scene`).
SCENE_SUFFIXES = (".tif", ".tiff", ".jp2", ".j2k")

_LOG = logging.getLogger("shardsmith.convert")
# The work is I/O: waits on storage, not the CPU.
_HEADER_THREADS = 8


def scene_windows(files, raster) -> tuple[dict[str, tuple[tuple[str, int], ...]], dict[str, tuple[str, str]]]:
    """The work items of every TIFF or JPEG 2000 scene (--raster_patch), from their headers read on threads.

    Args:
      files: The listed files; those named .tif/.tiff/.jp2/.j2k are scenes.
      raster: The `imaging.RasterOptions`, `patch` set.

    Returns:
      (relative path to its items, (key, planned bytes) each, in row then
      column order (`imaging.scenes.WorkItem.key`: "y0,y1" for a band of
      whole patch rows, "y0,y1,x0,x1" for a column range of a row wider than
      the budget); relative path to (reason, message) of the scenes rejected from
      their header: unreadable, too large a patch, missing bands, ...). A
      scene without a patch (smaller than one, under 'drop') is rejected
      as 'smaller_than_patch'.
    """
    from imaging import ImageRejected
    from imaging import scenes as _scenes

    scenes = [f for f in files if f.rel_path.lower().endswith(SCENE_SUFFIXES)]

    def items(f):
        with guard.working_on([(f.rel_path, f.path)]):
            try:
                with open_to_read(f.path) as fh:
                    header = _scenes.scene_header(fh, f.rel_path, raster)
            except ImageRejected as e:
                return f.rel_path, None, (e.reason, e.message)
            except OSError as e:
                return f.rel_path, None, ("unreadable", f"{f.rel_path}: {e}")
            except Exception as e:  # noqa: BLE001 - this file alone: rejected, reported
                _LOG.debug("Unexpected error reading the header of %s", f.rel_path, exc_info=e)
                return f.rel_path, None, (guard.INTERNAL_ERROR, guard.internal_error_message(f.rel_path, e))
        items = _scenes.work_items(header, raster.patch)
        if not items:
            return f.rel_path, None, ("smaller_than_patch", f"{f.rel_path} is {header.width}x{header.height}, smaller "
                                                   f"than one patch: --raster_edge drop leaves no patch")
        scale = header.bands * np.dtype(header.dtype).itemsize * raster.patch.size[0] * raster.patch.size[1]
        return f.rel_path, tuple((item.key, item.patches * scale) for item in items), None

    windows, failed = {}, {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=_HEADER_THREADS) as pool:
        for path, planned, problem in pool.map(items, scenes):
            if problem is None:
                windows[path] = planned
            else:
                failed[path] = problem
    _LOG.info("Read the headers of %s scenes: %s work items of patches (--raster_patch)",
              f"{len(scenes):,}", f"{sum(map(len, windows.values())):,}")
    return windows, failed


def scene_masks(mask_plan, windows, raster):
    """The mask plan without the scenes whose label raster cannot be cut with them (--raster_patch).

    Each scene's mask header is read (no pixel decoded) beside the scene's:
    a mask of another size is rejected 'mask_size_mismatch', one whose
    header does not read 'mask_unreadable', a TIFF of several bands or with
    a nodata value that is no class id of the dataset's masks
    'mask_not_class_ids' (`imaging.scenes.label_header`, `label_padding`).
    Other inputs keep their masks as without --raster_patch.

    Args:
      mask_plan: The `conversion.masks.MaskPlan`.
      windows: `scene_windows`'s work items of the scenes.
      raster: The `imaging.RasterOptions`, `patch` set.
    """
    from imaging import ImageRejected
    from imaging import scenes as _scenes

    scenes = [f for f in mask_plan.files if f.rel_path in windows]

    def problem(f):
        mask = mask_plan.mask_of[f.rel_path]
        with guard.working_on([(f.rel_path, f.path)]):
            try:
                with open_to_read(mask) as fh:
                    labels = _scenes.label_header(fh, mask)
                _scenes.label_padding(labels.nodata, mask_plan.dtype, mask)
                with open_to_read(f.path) as fh:
                    scene = _scenes.scene_header(fh, f.rel_path, raster)
            except ImageRejected as e:
                return e.reason, e.message
            except OSError as e:
                return "mask_unreadable", f"mask of {f.rel_path}: {e}"
            except Exception as e:  # noqa: BLE001 - this pair alone: rejected, reported
                _LOG.debug("Unexpected error reading the mask header of %s", f.rel_path, exc_info=e)
                return guard.INTERNAL_ERROR, guard.internal_error_message(f.rel_path, e)
        if (labels.height, labels.width) != (scene.height, scene.width):
            return "mask_size_mismatch", (f"mask of {f.rel_path} is {labels.width}x{labels.height}, the "
                                          f"scene {scene.width}x{scene.height}: a label raster is cut into "
                                          "the scene's patches, pixel for pixel")
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=_HEADER_THREADS) as pool:
        failed = {f.rel_path: p for f, p in zip(scenes, pool.map(problem, scenes)) if p is not None}
    if not failed:
        return mask_plan
    return dataclasses.replace(
        mask_plan, files=tuple(f for f in mask_plan.files if f.rel_path not in failed),
        problems=(*mask_plan.problems, *(_listing.Problem(p, r, m) for p, (r, m) in sorted(failed.items()))))
