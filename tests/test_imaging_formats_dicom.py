"""The DICOM handler (imaging/formats/dicom.py): frames rendered by imaging/dicom.py as PNG."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers import make_dicom

from imaging import DicomOptions, ImageRejected, ResizeOptions, ValidationOptions, formats
from imaging.formats import dicom


def _context(**options):
    return formats.Context(ValidationOptions(**options))


def test_one_frame_becomes_one_png_with_its_provenance():
    stored = np.arange(6 * 7).reshape(6, 7) * 10
    [image] = dicom.images(make_dicom(stored), "ct.dcm", "dicom", _context())
    assert image.format == "png" and image.source_format == "dicom"
    assert image.actions == ("dicom_to_png",) and image.frame is None
    assert (image.height, image.width, image.channels) == (6, 7, 1)
    assert image.details  # What the rendering applied (window, ...).
    decoded = tf.io.decode_png(image.data).numpy()[..., 0]
    # Monotonic rendering of a ramp: the order of the values is kept.
    assert (np.diff(decoded.ravel().astype(int)) >= 0).all() and decoded.max() > decoded.min()


def test_every_frame_when_asked():
    frames = np.stack([np.full((4, 5), v) for v in (0, 100, 200)])
    data = make_dicom(frames)
    found = dicom.images(data, "cine.dcm", "dicom", _context(dicom=DicomOptions(frames="all")))
    assert [image.frame for image in found] == [0, 1, 2]
    assert len(dicom.images(data, "cine.dcm", "dicom", _context())) == 1


def test_frames_are_resized_within_the_size_cap():
    stored = np.arange(40 * 30).reshape(40, 30)
    [image] = dicom.images(make_dicom(stored), "big.dcm", "dicom",
                           _context(resize=ResizeOptions(max_side=8)))
    assert max(image.height, image.width) == 8
    assert image.actions == ("dicom_to_png", "resize_max_side")


def test_too_many_pixels_are_rejected():
    with pytest.raises(ImageRejected) as e:
        dicom.images(make_dicom(np.zeros((50, 50))), "x.dcm", "dicom", _context(max_pixels=100))
    assert e.value.reason == "too_large"
