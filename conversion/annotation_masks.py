"""Segmentation masks drawn from the regions of --annotations (--annotation_masks): Beam-free.

Each image's regions (COCO polygons and RLE, CVAT polygons, boxes, ellipses
and masks, LabelMe polygons, rectangles, circles and masks, YOLO-seg polygons; a
box where the format gives no region: VOC objects, YOLO detection lines)
are drawn into one class-id mask on the frame the annotation was drawn on,
then aligned with each stored image as a mask file is (`imaging.masks.align_mask`:
turned with an EXIF-rotated photo, resized by nearest neighbour):

- ids: 0 is background, box class index + 1 each class of the annotations'
  class list (`mask_class_names`); a crowd region (COCO `iscrowd`, VOC
  `difficult`) is the dtype's ignore id (255, or 65535 for uint16 masks),
  the VOC convention for void pixels;
- order: regions are drawn in annotation order, a later one over an earlier;
- rasterisation: polygons and RLE are pycocotools' own (`mask.frPyObjects`,
  `merge`, `decode`), so a stored mask is what `COCO.annToMask` gives COCO
  users; boxes, rotated boxes and ellipses cover the pixels whose centre lies
  inside (for an axis-aligned box on whole pixels both rules agree);
- shapes without area (CVAT polylines and points, LabelMe lines and points)
  draw nothing; a region that cannot be drawn (a malformed polygon, an RLE of
  another size than its image) rejects the image as 'bad_target'.

The region of each box travels in the box kind's planned value (`regions`,
one per box, `conversion.targets.boxes`); the shard writer calls `pair` on
its read-ahead threads, as it calls `conversion.masks.pair` for mask files.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence

import numpy as np
from PIL import Image

from conversion.masks import MaskedImage, masked_image
from imaging import boxes as _boxes
from imaging.errors import ImageRejected

__all__ = ["BACKGROUND", "IGNORE_IDS", "mask_dtype", "mask_class_names", "draw_ids", "pair"]

# The mask class name of id 0: pixels no region covers.
BACKGROUND = "background"
# The id of crowd regions at each mask dtype (`readers.targets.masks.MASK_IGNORE_IDS` pads with it too).
IGNORE_IDS = {"uint8": 255, "uint16": 65535}


def mask_dtype(num_box_classes: int) -> str:
    """'uint8' while every class id (index + 1) stays below the ignore id 255; else 'uint16'."""
    return "uint8" if num_box_classes + 1 < IGNORE_IDS["uint8"] else "uint16"


def mask_class_names(box_class_names: Sequence[str]) -> list[str]:
    """The name of each mask id: 'background' for 0, then the box classes (id = index + 1)."""
    return [BACKGROUND, *box_class_names]


def _masks():
    from imaging import masks

    return masks


def _coco_mask():
    """pycocotools' mask API, imported when a polygon or RLE is drawn."""
    from pycocotools import mask

    return mask


# pycocotools' decoder asks numpy 2 for a copy-free array of its RLE object, which raises a
# DeprecationWarning per region (no change to the pixels). It is left alone: importing this module
# changes no process-wide state (such as the warnings filters), Python's default filters do not show
# a DeprecationWarning raised in a library, and the converter shows Python's warnings only with
# --verbose (`conversion.console`).


def draw_ids(entry: dict, width: int, height: int, dtype: str, name: str) -> np.ndarray:
    """The class ids (height, width) that an image's regions draw on a frame of `width` x `height`.

    Args:
      entry: The box kind's planned value of the image: 'boxes' ([ref, x0,
        y0, x1, y1, label, is_crowd], ...), 'regions' (one per box; absent:
        boxes only) and 'units' ('fraction': YOLO's fractions of the frame).
      width, height: The frame the annotation was drawn on, in pixels.
      dtype: 'uint8' or 'uint16'.
      name: The image's relative path, for messages.

    Raises:
      ImageRejected: 'bad_target' for a region that cannot be drawn.
    """
    ids = np.zeros((height, width), np.uint8 if dtype == "uint8" else np.uint16)
    boxes = entry["boxes"]
    regions = entry.get("regions") or [None] * len(boxes)
    sx, sy = (width, height) if entry.get("units") == "fraction" else (1.0, 1.0)
    for (ref, x0, y0, x1, y1, label, crowd), region in zip(boxes, regions, strict=True):
        value = IGNORE_IDS[dtype] if crowd else label + 1
        what = f"{name}: {entry.get('ref', 'box')} {ref}"
        covered = _covered(region, (x0 * sx, y0 * sy, x1 * sx, y1 * sy), (sx, sy), width, height, what)
        if covered is not None:
            ids[covered] = value
    return ids


def _covered(region, box, scale, width: int, height: int, what: str) -> np.ndarray | None:
    """The pixels (a bool array, or None for none) one region covers."""
    kind = "box" if region is None else region[0]
    if kind == "box":
        return _centres_inside(box, width, height, lambda x, y: np.ones_like(x, bool))
    if kind == "polygons":
        polygons = [[v * scale[k % 2] for k, v in enumerate(p)] for p in region[1]]
        return _decoded(_coco_mask().merge(_coco_mask().frPyObjects(polygons, height, width)))
    if kind == "rle":
        return _decoded(_rle(region[1], width, height, what))
    if kind == "ellipse":
        cx, cy, rx, ry, angle = region[1]
        return _rotated(cx, cy, rx, ry, angle, width, height, lambda u, v: u * u + v * v <= 1.0)
    if kind == "rotated_box":
        cx, cy, hw, hh, angle = region[1]
        return _rotated(cx, cy, hw, hh, angle, width, height, lambda u, v: (np.abs(u) <= 1.0) & (np.abs(v) <= 1.0))
    if kind == "bitmap":
        return _bitmap(region[1], width, height, what)
    if kind == "png_bitmap":
        return _png_bitmap(region[1], width, height, what)
    if kind == "none":
        return None
    if kind == "bad":
        raise ImageRejected("bad_target", f"{what}: {region[1]}")
    raise ImageRejected("bad_target", f"{what}: a region of kind {kind!r} cannot be drawn")


def _decoded(rle) -> np.ndarray:
    return _coco_mask().decode(rle).astype(bool)


def _rle(segmentation: dict, width: int, height: int, what: str) -> dict:
    """A COCO RLE (compressed counts text or uncompressed counts list) checked against the frame."""
    size = segmentation.get("size")
    if list(size) != [height, width]:
        raise ImageRejected("bad_target", (
            f"{what}: its RLE is {size[1]}x{size[0]} (width x height), the image it was drawn on is "
            f"{width}x{height}"))
    counts = segmentation["counts"]
    if isinstance(counts, list):
        return _coco_mask().frPyObjects({"size": [height, width], "counts": counts}, height, width)
    rle = {"size": [height, width], "counts": counts.encode("ascii")}
    try:
        area = int(_coco_mask().area(rle))
    except Exception as e:  # noqa: BLE001 - pycocotools' C decoder: this region's reject
        raise ImageRejected("bad_target", f"{what}: its compressed RLE does not decode ({e})") from None
    if area > height * width:
        raise ImageRejected("bad_target", f"{what}: its compressed RLE covers more than its image")
    return rle


def _centres_inside(box, width: int, height: int, inside) -> np.ndarray | None:
    """Pixels whose centre lies in the axis-aligned `box` (x0, y0, x1, y1) and satisfies `inside`."""
    x0, y0, x1, y1 = box
    cols = np.arange(max(0, math.floor(x0)), min(width, math.ceil(x1) + 1))
    rows = np.arange(max(0, math.floor(y0)), min(height, math.ceil(y1) + 1))
    cols = cols[(cols + 0.5 >= x0) & (cols + 0.5 < x1)]
    rows = rows[(rows + 0.5 >= y0) & (rows + 0.5 < y1)]
    if not len(cols) or not len(rows):
        return None
    out = np.zeros((height, width), bool)
    x, y = np.meshgrid(cols + 0.5, rows + 0.5)
    out[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1] = inside(x, y)
    return out


def _rotated(cx, cy, a, b, angle, width, height, inside) -> np.ndarray | None:
    """Pixels whose centre lies in a shape of half-axes a, b about (cx, cy), turned by `angle` degrees."""
    if not (a > 0 and b > 0):
        return None
    theta = math.radians(angle)
    cos, sin = math.cos(theta), math.sin(theta)
    ex, ey = abs(a * cos) + abs(b * sin), abs(a * sin) + abs(b * cos)

    def test(x, y):
        dx, dy = x - cx, y - cy
        # Back into the shape's own axes (CVAT turns shapes clockwise on screen: y points down).
        return inside((dx * cos + dy * sin) / a, (-dx * sin + dy * cos) / b)

    return _centres_inside((cx - ex, cy - ey, cx + ex, cy + ey), width, height, test)


def _bitmap(value, width: int, height: int, what: str) -> np.ndarray | None:
    """CVAT's `<mask>`: run lengths (background first, row by row) of its box [left, top, w, h]."""
    left, top, w, h, counts = value
    runs = np.asarray(counts, np.int64)
    if runs.size == 0 or runs.min() < 0 or int(runs.sum()) != w * h:
        raise ImageRejected("bad_target", f"{what}: its mask's run lengths sum to {int(runs.sum())}, "
                            f"its box is {w}x{h} = {w * h} pixels")
    return _placed(np.repeat(np.arange(runs.size) % 2 == 1, runs).reshape(h, w), left, top, width, height)


def _placed(bits: np.ndarray, left: int, top: int, width: int, height: int) -> np.ndarray | None:
    """A bitmap with its top-left pixel at (left, top) on the frame, cut to it; None when wholly outside."""
    h, w = bits.shape
    out = np.zeros((height, width), bool)
    r0, c0 = max(top, 0), max(left, 0)
    r1, c1 = min(top + h, height), min(left + w, width)
    if r1 <= r0 or c1 <= c0:
        return None
    out[r0:r1, c0:c1] = bits[r0 - top:r1 - top, c0 - left:c1 - left]
    return out


def _png_bitmap(value, width: int, height: int, what: str) -> np.ndarray | None:
    """LabelMe's mask shape: a base64 PNG of its box, nonzero pixels covered, its top-left at (left, top)."""
    left, top, text = value
    try:
        with Image.open(io.BytesIO(base64.b64decode(text, validate=True))) as im:
            bits = np.asarray(im.convert("L")) > 0
    except (ValueError, OSError) as e:  # binascii.Error is a ValueError; Pillow's are OSErrors
        raise ImageRejected("bad_target", f"{what}: its mask bitmap is not a base64 PNG ({e})") from None
    return _placed(bits, left, top, width, height)


def pair(rel_path: str, entry: dict, images, data: bytes, dtype: str, drawn: str = "auto") -> list[MaskedImage]:
    """A file's validated images, each with the mask its annotation's regions draw, aligned and encoded.

    Args:
      rel_path: The image's relative path (messages).
      entry: The box kind's planned value of the file (its boxes and regions,
        the annotation's image size, 'frame' where --annotations_frame said).
      images: Its `ValidImage`s.
      data: The image file's bytes (its EXIF orientation, when it was turned).
      dtype: The mask dtype ('uint8' or 'uint16').
      drawn: --annotations_frame as the boxes take it ('auto', 'raw', 'upright').

    Raises:
      ImageRejected: 'bad_target': a region that cannot be drawn, or an
        annotation of a size that is neither of the photo's frames.
    """
    masks = _masks()
    out, encoded = [], {}
    size = tuple(entry["size"]) if entry.get("size") else None
    drawn = entry.get("frame", drawn)
    for image in images:
        frame = masks.image_frame(data, image.actions, image.height, image.width, image.details)
        if frame not in encoded:
            upright_h, upright_w = frame.upright
            raw_h, raw_w = frame.raw
            orientation = frame.orientation or 1
            on = _boxes.annotation_frame(size, (raw_w, raw_h), orientation, drawn)
            if on is None:
                raise ImageRejected("bad_target", (
                    f"{rel_path}: the annotation's image size {size[0]}x{size[1]} is neither the photo's raw "
                    f"size {raw_w}x{raw_h} nor its upright size {upright_w}x{upright_h} (width x height)"))
            fw, fh = (raw_w, raw_h) if on == "raw" else (upright_w, upright_h)
            ids = draw_ids(entry, fw, fh, dtype, rel_path)
            aligned = masks.align_mask(ids, frame, rel_path, on if frame.orientation else "auto")
            encoded[frame] = (aligned, masks.encode_mask(aligned.ids, dtype), masks.pixel_counts(aligned.ids))
        out.append(masked_image(image, *encoded[frame]))
    return out
