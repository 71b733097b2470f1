"""DICOM SEG and RTSTRUCT masks of DICOM series volumes: found by content, paired by reference, one class table.

A SEG's or RTSTRUCT's file name means nothing (`1-1.dcm`, a UID): under
--volumes --masks_dir, every DICOM file under --masks_dir whose SOPClassUID is
a Segmentation or an RT Structure Set is the mask of the planned series volume
whose SeriesInstanceUID it references (`imaging.dicom_masks.read_mask_header`,
header only). Beam-free, for the driver (`conversion.masks.plan_masks`):

- `read_headers`: the candidates' headers, each read inside the guard's
  journal as every planning header read is;
- `pair_by_reference`: volume -> its masks (a series with several is refused
  by the caller as ambiguous), and the masks no planned series references;
- `class_table`: the one dataset-wide table of class names, "background" id 0
  then the names sorted: each volume's local ids (segment numbers, ROI
  positions, which differ between files) are mapped to it by the shard writer
  (`remap`), so "liver" is one id in every record.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from conversion import guard
from conversion.files import open_to_read
from imaging.errors import ImageRejected

__all__ = ["DicomMaskFile", "read_headers", "pair_by_reference", "class_table", "mask_dtype", "remap",
           "display", "BACKGROUND"]

_LOG = logging.getLogger("shardsmith.convert")
# Class id 0 of every table: a voxel of no segment / ROI.
BACKGROUND = "background"
# The largest table a uint8 mask holds: ids 0..254 (255 is the ignore id of uint8 masks,
# `conversion.targets.masks`, never counted as a class).
_UINT8_CLASSES = 255


@dataclasses.dataclass(frozen=True)
class DicomMaskFile:
    """A SEG or RTSTRUCT found under --masks_dir.

    Attributes:
      rel_path: Its path for messages (relative to --masks_dir, or to --input_dir when inside it).
      path: Its full path, which the shard writer reads.
      kind: 'seg' or 'rtstruct'.
      series_uids: The SeriesInstanceUIDs it references.
      class_names: Its labels' names (segment labels, ROI names), stripped of spaces.
      instance_uids: The SOPInstanceUIDs of the images it lists as drawn on (() when none).
    """

    rel_path: str
    path: str
    kind: str
    series_uids: tuple[str, ...]
    class_names: tuple[str, ...]
    instance_uids: tuple[str, ...] = ()


def read_headers(candidates: Sequence[tuple[str, str]]) -> tuple[list[DicomMaskFile], list[tuple[str, str]]]:
    """The SEGs and RTSTRUCTs among (rel_path, path) files, from their headers.

    Other files (a CT slice, a report) are no masks and are left out. Each read is noted
    in the journal (`guard.working_on`): a header that crashes the driver is known to the
    command above it.

    Returns:
      (masks in the candidates' order, (rel_path, why) of SEG/RTSTRUCT-looking files whose
      header could not be read: not paired, counted as unmatched masks).
    """
    from imaging import dicom_masks

    found, failed = [], []
    for rel, path in candidates:
        with guard.working_on([(rel, path)]):
            try:
                with open_to_read(path) as f:
                    header = dicom_masks.read_mask_header(f, rel)
            except ImageRejected as e:
                failed.append((rel, e.message))
                continue
            except OSError as e:
                failed.append((rel, str(e)))
                continue
        if header is not None:
            found.append(DicomMaskFile(rel, path, header.kind, header.series_uids, header.class_names,
                                       header.instance_uids))
    for rel, why in failed:
        _LOG.warning("Mask %s under --masks_dir is unreadable, paired with no volume: %s", rel, why)
    return found, failed


def pair_by_reference(volume_series: Mapping[str, str], masks: Sequence[DicomMaskFile],
                      volume_instances: Mapping[str, frozenset] | None = None):
    """Each volume's masks by the series they reference.

    Where several masks reference a volume's series, those listing the images they were drawn
    on (`DicomMaskFile.instance_uids`) none of which is a slice of that volume are left out
    of its masks: a SEG whose ReferencedSeriesSequence names another series than its
    images' (a damaged or hand-edited header) no longer makes that series' volume ambiguous
    (found by a mutation run of mask files, mfuzz12). A volume's only mask stays its mask
    (the decoder says why its frames are not the volume's slices).

    Args:
      volume_series: Volume name -> its SeriesInstanceUID (DICOM series volumes only;
        the stacks of one series each get its masks).
      masks: The masks found (`read_headers`).
      volume_instances: Volume name -> its slices' SOPInstanceUIDs; None (or a volume
        missing): every mask of its series is its.

    Returns:
      (volume name -> its masks (one, or several: ambiguous), the masks paired with no
      volume: referencing no planned series, or left out as above).
    """
    by_series = defaultdict(list)
    for m in masks:
        for uid in m.series_uids:
            by_series[uid].append(m)
    instances = volume_instances or {}

    def fits(mask: DicomMaskFile, name: str) -> bool:
        slices = instances.get(name)
        return not mask.instance_uids or slices is None or not slices.isdisjoint(mask.instance_uids)

    found = {}
    for name, uid in volume_series.items():
        fitting = by_series.get(uid, [])
        if len(fitting) > 1:
            fitting = [m for m in fitting if fits(m, name)] or fitting
        if fitting:
            found[name] = fitting
    paired = {m.rel_path for ms in found.values() for m in ms}
    unmatched = [m for m in masks if m.rel_path not in paired]
    return found, unmatched


def class_table(masks: Sequence[DicomMaskFile]) -> tuple[str, ...]:
    """The dataset's class names by id: "background" (0), then every mask's names sorted.

    Sorted by name (code points: case kept, "Liver" before "liver"), not by first
    appearance: the table is the same whatever order the files are listed, read or planned
    in. A segment or ROI named "background" is id 0.
    """
    return (BACKGROUND, *sorted({n for m in masks for n in m.class_names} - {BACKGROUND}))


def mask_dtype(table: Sequence[str]) -> str:
    """'uint8' for a table of up to 255 classes (ids 0..254; 255 is uint8's ignore id), else 'uint16'."""
    return "uint8" if len(table) <= _UINT8_CLASSES else "uint16"


def remap(labels: np.ndarray, names: Sequence[str], table: Sequence[str], dtype: str, name: str) -> np.ndarray:
    """A DICOM mask's local labels (`MaskVolume.class_names` by label) as ids of the dataset's `table`.

    Raises:
      ImageRejected: 'mask_unreadable' for a label whose name the table lacks (the file
        changed since planning read its header).
    """
    index = {n: i for i, n in enumerate(table)}
    present = np.unique(labels)
    lut = np.zeros(int(present.max()) + 1 if present.size else 1, np.dtype(dtype))
    for value in present.tolist():
        if not value:
            continue
        label = names[value].strip() if value < len(names) else ""
        if label not in index:
            raise ImageRejected("mask_unreadable", f"mask {name}: label {value} ({label or 'unnamed'}) is not in the "
                                f"dataset's class table, read from the masks' headers while planning (was the file "
                                "changed since?)")
        lut[value] = index[label]
    return lut[labels]


def display(masks: Sequence[DicomMaskFile]) -> str:
    """The masks' paths for a message, sorted."""
    return " and ".join(sorted((m.rel_path for m in masks), key=os.fsencode))
