"""One handler per format family, and the one table that says which reads a file.

A file's format is decided once, from its first bytes (`format_of`); its
handler alone then reads it, keeps it or rejects it. No handler hands a file
to another by failing: where two libraries share a format (TIFF: tifffile
for rasters, Pillow for the rest), that format's handler decides between
them.

A handler is a module with one function,

    images(data, name, fmt, context) -> list[ValidImage]

which returns the file's images (several for multi-page TIFFs and
multi-frame DICOM files), each at the size --max_side/--min_side asks for,
or raises `ImageRejected`. `context` (a `Context`) holds the options and
TensorFlow's decode ops; handlers are framework-free otherwise. Adding a
format is one module and one row of `_HANDLERS`.
"""

from __future__ import annotations

from imaging import dicom as _dicom
from imaging.errors import ImageRejected
from imaging.formats import dicom, jpeg, jpeg2000, pillow, png, tiff
from imaging.formats._shared import Context, ValidImage
from imaging.sniff import sniff_format

__all__ = ["Context", "ValidImage", "format_of", "handler_for", "images"]

# Sniffed format -> its handler. Formats without a row (and files no
# signature matches: None) are Pillow's to recognise or reject.
_HANDLERS = {
    "jpeg": jpeg,
    "png": png,
    "gif": pillow,
    "bmp": pillow,
    "webp": pillow,
    "tiff": tiff,
    "dicom": dicom,
    "jpeg2000": jpeg2000,
}


def format_of(data: bytes) -> str | None:
    """A file's format from its first bytes: `sniff_format`'s answer, or 'dicom'.

    DICOM wins over the signature: a DICOM file's 128-byte preamble may hold
    another format's (dual-personality DICOM/TIFF files), and a bare DICOM
    dataset has no signature at all (`imaging.dicom.is_dicom`).
    """
    fmt = sniff_format(data[:132])
    if fmt == "dicom" or _dicom.is_dicom(data[:1024]):
        return "dicom"
    return fmt


def handler_for(fmt: str | None):
    """The handler module of a format `format_of` returned."""
    return _HANDLERS.get(fmt, pillow)


def images(data: bytes, name: str, context: Context, sidecars=None) -> list[ValidImage]:
    """Every image one file gives, from the handler of its format.

    Args:
      data: The whole file.
      name: Its relative path, for messages.
      context: The options and decode ops (`Context`).
      sidecars: What its GIS sidecars say (`imaging.sidecars.Sidecars`), or
        None; read for TIFFs and JPEG 2000 (GDAL's GTiff and JP2OpenJPEG drivers read them).

    Raises:
      ImageRejected: With the reason the file cannot be stored.
    """
    if not data:
        raise ImageRejected("empty_file", f"{name} has zero bytes")
    fmt = format_of(data)
    if sidecars is not None and fmt == "tiff":
        return tiff.images_with_sidecars(data, name, context, sidecars)
    if sidecars is not None and fmt == "jpeg2000":
        return jpeg2000.images_with_sidecars(data, name, context, sidecars)
    return handler_for(fmt).images(data, name, fmt, context)
