"""DICOM: every frame rendered by imaging/dicom.py (modality LUT, VOI window) as PNG."""

from __future__ import annotations

import dataclasses

from imaging import dicom as _dicom
from imaging.formats._shared import Context, ValidImage

__all__ = ["images"]


def images(data: bytes, name: str, fmt: str, context: Context) -> list[ValidImage]:
    """A DICOM file's frames: one image, or each frame with --dicom_frames all.

    Raises:
      ImageRejected: With the reason the file cannot be stored.
    """
    all_frames = context.dicom.frames == "all"
    frames = []
    for frame in _dicom.decode_dicom(data, name, context.dicom):
        checked = context.stored(frame.png, "dicom", ("dicom_to_png",), name)
        frames.append(dataclasses.replace(
            checked,
            frame=frame.frame if all_frames and frame.num_frames > 1 else None,
            tags=dict(frame.tags),
            details=frame.provenance,
        ))
    # Every frame is decoded and checked before any is resized.
    return [context.fit(image, name) for image in frames]
