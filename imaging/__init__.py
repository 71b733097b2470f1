"""One input file to a storable image: sniffing, validation, normalisation, DICOM.

Framework-free: nothing here imports Beam or tf.data, so every step is tested
on its own. TensorFlow's decode ops validate images (the ops the reader runs),
loaded without TensorFlow's Python API (`schemas.tf_runtime`).

    validator = imaging.ImageValidator(imaging.ValidationOptions(max_pixels=50_000_000))
    for image in validator.validate_all(data, "cats/001.jpg"):  # raises ImageRejected
        ...
"""

from __future__ import annotations

import importlib

__all__ = [
    "DicomOptions", "ImageRejected", "ImageValidator", "RasterOptions", "ResizeOptions",
    "ValidationOptions", "ValidImage", "sniff_format",
]

# Each public name's module, imported when the name is first asked for: a
# conversion of photos never imports the DICOM, raster or volume code that a
# whole-package import would load (~0.1 s of CPU before its first decode).
_HOMES = {
    "DicomOptions": "imaging.dicom", "ImageRejected": "imaging.errors", "ImageValidator": "imaging.validator",
    "RasterOptions": "imaging.raster", "ResizeOptions": "imaging.resize", "ValidationOptions": "imaging.validator",
    "ValidImage": "imaging.validator", "sniff_format": "imaging.sniff",
}


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value  # Asked once: the module's own attribute from then on.
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
