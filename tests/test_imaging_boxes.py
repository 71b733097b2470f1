"""Box geometry: the EXIF transforms of boxes agree with Pillow's transforms of the pixels."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from imaging import boxes

_ORIENTATION = 0x0112


def _with_orientation(arr: np.ndarray, orientation: int, fmt: str = "PNG") -> bytes:
    """`arr` written by Pillow with an EXIF orientation tag."""
    exif = Image.Exif()
    exif[_ORIENTATION] = orientation
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, exif=exif.tobytes())
    return buf.getvalue()


def _marker_box(arr: np.ndarray) -> tuple[int, int, int, int]:
    """(xmin, ymin, xmax, ymax) of the bright pixels, pixel edges included."""
    ys, xs = np.nonzero(arr > 127)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_box_follows_pillows_exif_transpose(orientation):
    raw = np.zeros((30, 50), np.uint8)  # height 30, width 50
    raw[4:11, 7:19] = 255  # x 7..19, y 4..11
    upright = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(_with_orientation(raw, orientation)))))
    assert boxes.orient_box((7.0, 4.0, 19.0, 11.0), orientation, 50, 30) == _marker_box(upright)
    assert boxes.upright_size(50, 30, orientation) == (upright.shape[1], upright.shape[0])


def test_orient_box_rejects_an_orientation_outside_1_to_8():
    with pytest.raises(ValueError, match="1-8"):
        boxes.orient_box((0, 0, 1, 1), 9, 10, 10)


def test_clip_normalise_and_empty():
    assert boxes.clip_box((-2.0, 3.0, 45.0, 12.5), 40, 30) == (0.0, 3.0, 40.0, 12.5)
    assert boxes.clip_box((50.0, 3.0, 60.0, 12.0), 40, 30) == (40.0, 3.0, 40.0, 12.0)
    assert boxes.is_empty((40.0, 3.0, 40.0, 12.0))
    assert boxes.is_empty((5.0, 5.0, 4.0, 9.0))
    assert boxes.is_empty((float("nan"), 0.0, 1.0, 1.0))
    assert not boxes.is_empty((0.0, 0.0, 0.5, 0.5))
    assert boxes.normalise_box((10.0, 3.0, 40.0, 15.0), 40, 30) == (0.25, 0.1, 1.0, 0.5)


def test_annotation_frame():
    raw = (48, 32)
    assert boxes.annotation_frame(None, raw, 6) == "raw"
    assert boxes.annotation_frame((48, 32), raw, 6) == "raw"
    assert boxes.annotation_frame((32, 48), raw, 6) == "upright"
    assert boxes.annotation_frame((32, 32), (32, 32), 6) == "raw"  # Square: as pycocotools reads it.
    assert boxes.annotation_frame((48, 32), raw, 3) == "raw"  # 180 degrees keeps the size.
    assert boxes.annotation_frame((100, 100), raw, 6) is None


def test_annotation_frame_auto_upright_lets_the_size_decide_and_breaks_ties_upright():
    # CVAT and LabelMe show photos upright: where the size cannot tell, the upright photo.
    raw = (48, 32)
    assert boxes.annotation_frame((48, 32), raw, 6, "auto_upright") == "raw"  # an EXIF-blind export
    assert boxes.annotation_frame((32, 48), raw, 6, "auto_upright") == "upright"
    assert boxes.annotation_frame((48, 32), raw, 3, "auto_upright") == "upright"
    assert boxes.annotation_frame((32, 32), (32, 32), 6, "auto_upright") == "upright"
    assert boxes.annotation_frame(None, raw, 6, "auto_upright") == "upright"
    assert boxes.annotation_frame((100, 100), raw, 6, "auto_upright") is None


def test_raw_frame_from_jpeg_and_png_bytes():
    arr = np.zeros((32, 48, 3), np.uint8)
    assert boxes.raw_frame(_with_orientation(arr, 6, "JPEG")) == (6, 48, 32)
    assert boxes.raw_frame(_with_orientation(arr, 8, "PNG")) == (8, 48, 32)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    assert boxes.raw_frame(buf.getvalue()) == (1, 48, 32)
