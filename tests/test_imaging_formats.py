"""The dispatch table of imaging/formats: which handler reads a file, decided once from its bytes."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile
from helpers import encode, make_dicom, pixels

from imaging import ImageRejected, ValidationOptions, formats
from imaging.formats import dicom, jpeg, pillow, png, tiff


def _tiff(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    tifffile.imwrite(buf, arr, photometric="minisblack", planarconfig="contig")
    return buf.getvalue()


@pytest.mark.parametrize("make, fmt, handler", [
    (lambda: encode(pixels(0), "JPEG"), "jpeg", jpeg),
    (lambda: encode(pixels(0), "PNG"), "png", png),
    (lambda: encode(pixels(0), "GIF"), "gif", pillow),
    (lambda: encode(pixels(0), "BMP"), "bmp", pillow),
    (lambda: encode(pixels(0), "WEBP", lossless=True), "webp", pillow),
    (lambda: _tiff(np.zeros((4, 5, 6), np.uint16)), "tiff", tiff),
    (lambda: make_dicom(np.zeros((4, 5))), "dicom", dicom),
    # A bare DICOM dataset has no signature; is_dicom still knows it.
    (lambda: make_dicom(np.zeros((4, 5)), file_format=False), "dicom", dicom),
    # Pillow knows PPM; no row does: Pillow's handler recognises it.
    (lambda: encode(pixels(0), "PPM"), None, pillow),
    (lambda: b"just some text\n", None, pillow),
])
def test_each_file_has_one_format_and_one_handler(make, fmt, handler):
    data = make()
    assert formats.format_of(data) == fmt
    assert formats.handler_for(fmt) is handler


def test_dicom_wins_over_the_signature_in_its_preamble():
    # A dual-personality file: a TIFF header in the DICOM preamble.
    dcm = make_dicom(np.arange(20).reshape(4, 5))
    dual = b"II*\x00" + dcm[4:]
    assert formats.format_of(dual) == "dicom"
    [image] = formats.images(dual, "dual.dcm", formats.Context(ValidationOptions()))
    assert image.source_format == "dicom"


def test_an_empty_file_is_rejected_before_any_handler():
    with pytest.raises(ImageRejected) as e:
        formats.images(b"", "empty.jpg", formats.Context(ValidationOptions()))
    assert e.value.reason == "empty_file" and "empty.jpg" in e.value.message


def test_every_handler_takes_the_same_arguments():
    import inspect

    for handler in {formats.handler_for(f) for f in ("jpeg", "png", "gif", "tiff", "dicom", None)}:
        assert list(inspect.signature(handler.images).parameters) == ["data", "name", "fmt", "context"]
