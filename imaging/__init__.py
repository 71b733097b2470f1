"""One input file to a storable image: sniffing, validation, normalisation, DICOM.

Framework-free: nothing here imports Beam or tf.data, so every step is tested
on its own. TensorFlow's decode ops validate images (the ops the reader runs),
loaded without TensorFlow's Python API (`schemas.tf_runtime`).

    validator = imaging.ImageValidator(imaging.ValidationOptions(max_pixels=50_000_000))
    for image in validator.validate_all(data, "cats/001.jpg"):  # raises ImageRejected
        ...
"""

from imaging.dicom import DicomOptions
from imaging.errors import ImageRejected
from imaging.raster import RasterOptions
from imaging.resize import ResizeOptions
from imaging.sniff import sniff_format
from imaging.validator import ImageValidator, ValidationOptions, ValidImage

__all__ = [
    "DicomOptions", "ImageRejected", "ImageValidator", "RasterOptions", "ResizeOptions",
    "ValidationOptions", "ValidImage", "sniff_format",
]
