"""Box geometry: EXIF orientation transforms, clipping and normalising of box corners.

Framework-free arithmetic on (xmin, ymin, xmax, ymax) corners in pixels,
measured from the top-left corner of the image, pixel edges included (a box
covering the whole of a W x H image is (0, 0, W, H)). The conversion reads
boxes from annotations (`conversion.targets.boxes`) drawn either on the file's
raw frame or on the upright photo a viewer shows, and stores them as corners
normalised to [0, 1] of the stored (upright) image.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image

from imaging.sniff import jpeg_header

__all__ = ["Box", "SWAPPING_ORIENTATIONS", "upright_size", "orient_box", "orient_point", "clip_box", "is_empty",
           "normalise_box", "annotation_frame", "raw_frame"]

# The EXIF tag of the orientation.
_ORIENTATION_TAG = 0x0112

# (xmin, ymin, xmax, ymax) in pixels.
Box = tuple[float, float, float, float]
# EXIF orientations whose upright image has width and height swapped (transpose, rotations by 90).
SWAPPING_ORIENTATIONS = frozenset({5, 6, 7, 8})


def _check_orientation(orientation: int) -> None:
    if orientation not in range(1, 9):
        raise ValueError(f"An EXIF orientation is 1-8. Received: {orientation!r}")


def upright_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """(width, height) of the upright image of a raw frame of `width` x `height` (EXIF 1-8)."""
    _check_orientation(orientation)
    return (height, width) if orientation in SWAPPING_ORIENTATIONS else (width, height)


def orient_box(box: Box, orientation: int, width: float, height: float) -> Box:
    """The box of the raw frame (`width` x `height`) in the upright image, per an EXIF orientation.

    The same transforms as Pillow's `ImageOps.exif_transpose` applies to the
    pixels (and `imaging.resize.orient_array`): each corner is mapped, then
    the min and max corners are taken again.

    Raises:
      ValueError: For an orientation outside 1-8.
    """
    _check_orientation(orientation)
    x0, y0, x1, y1 = box
    w, h = width, height
    # Where a raw point (x, y) lands in the upright image, for each orientation.
    if orientation == 1:
        return box
    if orientation == 2:  # Mirrored left-right.
        xs, ys = (w - x1, w - x0), (y0, y1)
    elif orientation == 3:  # Turned 180 degrees.
        xs, ys = (w - x1, w - x0), (h - y1, h - y0)
    elif orientation == 4:  # Mirrored top-bottom.
        xs, ys = (x0, x1), (h - y1, h - y0)
    elif orientation == 5:  # Transposed: (x, y) -> (y, x).
        xs, ys = (y0, y1), (x0, x1)
    elif orientation == 6:  # Turned 90 degrees clockwise to view: (x, y) -> (h - y, x).
        xs, ys = (h - y1, h - y0), (x0, x1)
    elif orientation == 7:  # Transversed: (x, y) -> (h - y, w - x).
        xs, ys = (h - y1, h - y0), (w - x1, w - x0)
    else:  # 8, turned 90 degrees anticlockwise to view: (x, y) -> (y, w - x).
        xs, ys = (y0, y1), (w - x1, w - x0)
    return (min(xs), min(ys), max(xs), max(ys))


def orient_point(x: float, y: float, orientation: int, width: float, height: float) -> tuple[float, float]:
    """Where the point (x, y) of the raw frame (`width` x `height`) lands in the upright image.

    The point maps of `orient_box` (Pillow's `ImageOps.exif_transpose`), for
    the corners of an oriented box: each corner keeps its place in the box's
    point order.

    Raises:
      ValueError: For an orientation outside 1-8.
    """
    _check_orientation(orientation)
    w, h = width, height
    return {
        1: (x, y),
        2: (w - x, y),  # Mirrored left-right.
        3: (w - x, h - y),  # Turned 180 degrees.
        4: (x, h - y),  # Mirrored top-bottom.
        5: (y, x),  # Transposed.
        6: (h - y, x),  # Turned 90 degrees clockwise to view.
        7: (h - y, w - x),  # Transversed.
        8: (y, w - x),  # Turned 90 degrees anticlockwise to view.
    }[orientation]


def clip_box(box: Box, width: float, height: float) -> Box:
    """The part of the box inside the image [0, width] x [0, height] (may be empty: see `is_empty`)."""
    x0, y0, x1, y1 = box
    width, height = float(width), float(height)
    return (min(max(x0, 0.0), width), min(max(y0, 0.0), height),
            min(max(x1, 0.0), width), min(max(y1, 0.0), height))


def is_empty(box: Box) -> bool:
    """Whether the box covers no area (zero or negative width or height, or NaN corners)."""
    x0, y0, x1, y1 = box
    return not (x1 > x0 and y1 > y0)


def normalise_box(box: Box, width: float, height: float) -> Box:
    """The corners as fractions of the image's width and height."""
    x0, y0, x1, y1 = box
    return (x0 / width, y0 / height, x1 / width, y1 / height)


def annotation_frame(size: tuple[int, int] | None, raw: tuple[int, int], orientation: int,
                     drawn: str = "auto") -> str | None:
    """On which frame a photo's boxes were drawn, from the size its annotation gives.

    Args:
      size: (width, height) the annotation gives for the image (COCO's
        images[].width/height, VOC's <size>), or None when it gives none.
      raw: (width, height) of the file's raw frame (as stored in the file).
      orientation: The file's EXIF orientation (1-8).
      drawn: --annotations_frame: 'auto' (the size decides), 'raw' or
        'upright' (the annotations say which; the size must agree); or
        'auto_upright': the size decides, and where it cannot, the upright
        photo (a tool that shows photos upright, as CVAT and LabelMe do).

    Returns:
      'raw' or 'upright'; with 'auto', 'raw' where the size cannot tell (no
      size given; a square photo and orientations that keep the size: as
      pycocotools reads the file). None when the size does not fit.
    """
    upright = upright_size(raw[0], raw[1], orientation)
    if drawn == "raw":
        return "raw" if size is None or tuple(size) == tuple(raw) else None
    if drawn == "upright":
        return "upright" if size is None or tuple(size) == upright else None
    if drawn == "auto_upright" and (size is None or tuple(size) == upright):
        return "upright"
    if size is None or tuple(size) == tuple(raw):
        return "raw"
    if tuple(size) == upright:
        return "upright"
    return None


def raw_frame(data: bytes) -> tuple[int, int, int]:
    """(EXIF orientation, width, height) of an image file's raw frame, from its bytes.

    The JPEG markers when they say it (`imaging.sniff.jpeg_header`), else
    Pillow's header and EXIF (no pixel is decoded; Pillow's warnings about
    odd EXIF are the validator's to report). An orientation outside 1-8, or
    none, is 1. Boxes and masks (`imaging.masks.image_frame`) both turn by it.

    Raises:
      OSError, ValueError: When Pillow cannot read the file's header.
    """
    header = jpeg_header(data) if data[:2] == b"\xff\xd8" else None
    orientation = None if header is None else header.orientation
    if orientation not in range(2, 9):
        # No turn in the markers read: Pillow's EXIF reader, which looks further.
        with warnings.catch_warnings(), Image.open(io.BytesIO(data)) as im:
            warnings.simplefilter("ignore")
            orientation = im.getexif().get(_ORIENTATION_TAG)
            size = im.size
        width, height = (header.width, header.height) if header is not None else size
    else:
        width, height = header.width, header.height
    try:
        orientation = int(orientation) if orientation is not None else 1
    except (TypeError, ValueError):
        orientation = 1
    return (orientation if orientation in range(1, 9) else 1), width, height
