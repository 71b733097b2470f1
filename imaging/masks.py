"""Segmentation masks: read class ids exactly, align them with their stored image, encode them.

A mask is an image whose pixels are class ids. Reading one keeps the ids
exactly, whatever the file: a palette PNG or GIF gives its indices (never
its palette's colours), greyscale modes their values, an RGB(A) file whose
three channels are equal (and whose alpha is opaque) one channel, and TIFF
masks are read by tifffile. What holds no ids (a lossy JPEG, colours, floats
with fractions, negative ids, ids above 65535) is rejected with the reason
`schemas.REJECT_REASONS` gives for it.

Whatever is done to the image is done to its mask: a mask drawn on the raw
frame of an EXIF-rotated photo is turned the same way, and a resized image's
mask is resized with the nearest neighbour, so its values stay ids.

Framework-free (Pillow, tifffile, numpy):

    ids = read_mask(data, "masks/a.png")                    # raises ImageRejected
    aligned = align_mask(ids, MaskFrame(...), "images/a.jpg")  # (ids, actions, details)
    png = encode_mask(aligned.ids, "uint8")
"""

from __future__ import annotations

import dataclasses
import io
import struct
import warnings

import numpy as np
from PIL import Image

from imaging import boxes as _boxes, resize as _resize
from imaging.errors import ImageRejected
from imaging.formats import _pil
from imaging.sniff import sniff_format

__all__ = [
    "MASK_EXTENSIONS", "MASK_DTYPES", "MaskFrame", "AlignedMask", "mask_bit_depth", "read_mask",
    "align_mask", "encode_mask", "storable_as_is", "pixel_counts", "image_frame", "class_ids",
]

# Extensions a mask file may have, in the order they are looked for.
MASK_EXTENSIONS = (".png", ".tif", ".tiff", ".bmp", ".gif")
# The stored masks' sample types: one for every mask of a dataset.
MASK_DTYPES = ("uint8", "uint16")
# The largest id a stored mask holds (16-bit PNG).
_MAX_ID = 65535
# Pillow modes whose values are the ids as they are.
_VALUE_MODES = ("L", "P", "1", "I;16", "I;16L", "I;16B", "I;16N", "I", "F")
# Level 6, as the validator's PNGs: most of the size win at a fraction of level 9's time.
_PNG_LEVEL = 6
# TIFF tags read from a mask's header (`mask_bit_depth`).
_BITS_PER_SAMPLE = 258
# Orientations whose transform swaps height and width.
_TRANSPOSING = (5, 6, 7, 8)


def mask_bit_depth(head: bytes) -> int | None:
    """The bits per sample of a mask file, from its first bytes (no pixel is decoded).

    Args:
      head: The file's first bytes: 32 for PNG, GIF and BMP; a TIFF's first
        IFD must lie within them.

    Returns:
      16 for a 16-bit PNG, a TIFF's BitsPerSample (the largest of its
      samples), 8 for other known formats; None where the header does not
      say (a TIFF whose first IFD lies further, an unknown format): the
      caller then reads the whole file, or leaves the mask to the shard
      writer, which rejects what it cannot read.
    """
    fmt = sniff_format(head[:132])
    if fmt == "png":
        return head[24] if len(head) > 24 else None
    if fmt in ("gif", "bmp", "jpeg"):
        return 8
    if fmt == "tiff":
        return _tiff_bits(head)
    return None


def _tiff_bits(head: bytes) -> int | None:
    """The largest BitsPerSample of a TIFF's first IFD (classic or BigTIFF), or None."""
    order = "<" if head[:2] == b"II" else ">"
    try:
        big = struct.unpack(order + "H", head[2:4])[0] == 43
        if big:
            ifd = struct.unpack(order + "Q", head[8:16])[0]
            count = struct.unpack(order + "Q", head[ifd:ifd + 8])[0]
            entry_size, first, field = 20, ifd + 8, "Q"
        else:
            ifd = struct.unpack(order + "I", head[4:8])[0]
            count = struct.unpack(order + "H", head[ifd:ifd + 2])[0]
            entry_size, first, field = 12, ifd + 2, "I"
        for k in range(count):
            at = first + k * entry_size
            tag, kind = struct.unpack(order + "HH", head[at:at + 4])
            if tag != _BITS_PER_SAMPLE:
                continue
            n = struct.unpack(order + field, head[at + 4:at + 4 + struct.calcsize(field)])[0]
            value_at = at + 4 + struct.calcsize(field)
            inline = struct.calcsize(field)
            if kind != 3 or n < 1:  # Not SHORTs: let the reader say what it is.
                return None
            if 2 * n > inline:
                value_at = struct.unpack(order + field, head[value_at:value_at + inline])[0]
            values = struct.unpack(order + "H" * n, head[value_at:value_at + 2 * n])
            return max(values)
    except struct.error:
        return None  # The IFD lies beyond `head`.
    return 1  # No BitsPerSample: TIFF's default, bilevel.


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_mask(data: bytes, name: str, max_pixels: int | None = None) -> np.ndarray:
    """The class ids of a mask file, exactly: a 2-D uint8 or uint16 array.

    uint8 for 8-bit files (and 1-bit), uint16 for 16-bit and deeper files
    (their ids checked to fit in 16 bits).

    Args:
      data: The whole mask file.
      name: Its path, for messages.
      max_pixels: Masks with more pixels are refused before decoding (no
        image of the dataset has that many).

    Raises:
      ImageRejected: 'mask_unreadable', 'mask_lossy' or 'mask_not_class_ids'.
    """
    if not data:
        raise ImageRejected("mask_unreadable", f"mask {name} has zero bytes")
    fmt = sniff_format(data[:132])
    if fmt == "jpeg":
        raise ImageRejected(
            "mask_lossy", f"mask {name} is a JPEG: lossy compression changes class ids; store masks as PNG")
    if fmt == "tiff":
        return _tiff_ids(data, name, max_pixels)
    if fmt == "webp" and b"VP8 " in data[12:16]:
        raise ImageRejected("mask_lossy", f"mask {name} is a lossy WebP: store masks as PNG")
    if fmt == "png" and len(data) > 25 and data[24] == 16 and data[25] in (2, 6):
        # Pillow reads 16-bit colour PNGs as 8-bit: the ids would be cut.
        raise ImageRejected(
            "mask_not_class_ids",
            f"mask {name} is a 16-bit colour PNG; store masks with one channel (greyscale or palette)")
    return _pillow_ids(data, name, max_pixels)


def _pillow_ids(data: bytes, name: str, max_pixels: int | None) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            im = Image.open(io.BytesIO(data))
            _check_pixels(im.width, im.height, name, max_pixels)
            im.seek(0)
            im.load()
        except ImageRejected:
            raise
        except _pil.PIL_ERRORS as e:
            raise ImageRejected("mask_unreadable", f"mask {name}: {type(e).__name__}: {e}") from None
    mode = im.mode
    if mode in _VALUE_MODES:
        # np.asarray of a "P" image is its indices: the palette is never applied.
        arr = np.asarray(im)
        if mode == "1":
            arr = arr.astype(np.uint8)
        return _as_ids(arr, name)
    if mode in ("RGB", "RGBA", "LA", "PA"):
        return _one_channel(np.asarray(im), mode, name)
    raise ImageRejected(
        "mask_not_class_ids", f"mask {name} is a {mode} image; masks hold one class id per pixel")


def _one_channel(arr: np.ndarray, mode: str, name: str) -> np.ndarray:
    """The ids of an RGB(A)/LA/PA mask whose colour channels are equal and alpha opaque."""
    colour = arr[..., :1] if mode in ("LA", "PA") else arr[..., :3]
    if mode in ("RGBA", "LA", "PA"):
        alpha = arr[..., -1]
        if alpha.size and alpha.min() != np.iinfo(alpha.dtype).max:
            raise ImageRejected(
                "mask_not_class_ids", f"mask {name} has transparent pixels; a mask's every pixel is a class id")
    if colour.shape[-1] == 3 and not (np.array_equal(colour[..., 0], colour[..., 1])
                                      and np.array_equal(colour[..., 0], colour[..., 2])):
        raise ImageRejected(
            "mask_not_class_ids",
            f"mask {name} is a colour image (its R, G and B differ): class ids are one channel; "
            "convert colours to ids first (e.g. a palette PNG)")
    return _as_ids(np.ascontiguousarray(colour[..., 0]), name)


def _tiff_ids(data: bytes, name: str, max_pixels: int | None) -> np.ndarray:
    import tifffile  # Only masks stored as TIFF need it.

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with tifffile.TiffFile(io.BytesIO(data)) as tif:
                page = tif.pages.first
                shape = page.shape
                if len(shape) >= 2:
                    _check_pixels(int(page.imagewidth), int(page.imagelength), name, max_pixels)
                arr = page.asarray()
        except ImageRejected:
            raise
        except Exception as e:  # noqa: BLE001 - tifffile raises many kinds on damaged files: this mask's reject
            raise ImageRejected("mask_unreadable", f"mask {name}: {type(e).__name__}: {e}") from None
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    elif arr.ndim == 3 and arr.shape[-1] in (3, 4) and arr.dtype == np.uint8:
        return _one_channel(arr, "RGB" if arr.shape[-1] == 3 else "RGBA", name)
    if arr.ndim != 2:
        raise ImageRejected(
            "mask_not_class_ids",
            f"mask {name} has shape {tuple(arr.shape)}; a mask is one band of class ids")
    return _as_ids(arr, name)


def _check_pixels(width: int, height: int, name: str, max_pixels: int | None) -> None:
    if max_pixels is not None and width * height > max_pixels:
        raise ImageRejected(
            "mask_unreadable", f"mask {name} is {width}x{height}, more than --max_pixels={max_pixels:,}")


def class_ids(arr: np.ndarray, name: str) -> np.ndarray:
    """The class ids of decoded mask pixels (a whole mask or a window of one), as `read_mask` keeps them.

    uint8 for 8-bit and narrower samples, uint16 otherwise; floats must be
    whole numbers; ids from 0 to 65535.

    Raises:
      ImageRejected: 'mask_not_class_ids' (fractions, negative ids, ids
        above 65535, samples that are no numbers); 'mask_unreadable' for no
        pixels.
    """
    return _as_ids(np.asarray(arr), name)


def _as_ids(arr: np.ndarray, name: str) -> np.ndarray:
    """`arr` as uint8 (8-bit and narrower sources) or uint16 ids; rejected when they are no ids."""
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8)
    if arr.dtype == np.uint8:
        return arr
    if arr.size == 0:
        raise ImageRejected("mask_unreadable", f"mask {name} has no pixels")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or not np.array_equal(arr, np.floor(arr)):
            raise ImageRejected(
                "mask_not_class_ids", f"mask {name} holds {arr.dtype} values that are not whole numbers")
    elif not np.issubdtype(arr.dtype, np.integer):
        raise ImageRejected("mask_not_class_ids", f"mask {name} holds {arr.dtype} values, not class ids")
    low, high = arr.min(), arr.max()
    if low < 0:
        raise ImageRejected("mask_not_class_ids", f"mask {name} holds negative values (lowest {low:g})")
    if high > _MAX_ID:
        raise ImageRejected(
            "mask_not_class_ids", f"mask {name} holds ids up to {high:g}, more than {_MAX_ID}")
    if arr.dtype.itemsize == 1:
        return arr.astype(np.uint8)  # int8 without negatives.
    return arr.astype(np.uint16)


@dataclasses.dataclass(frozen=True)
class MaskFrame:
    """The geometry of a stored image that its mask must follow.

    Attributes:
      upright: (height, width) of the image upright, before any resizing.
      stored: (height, width) of the stored image.
      orientation: The source's EXIF orientation (2-8) when the validator
        turned it upright ('exif_transpose'), else None.
    """

    upright: tuple[int, int]
    stored: tuple[int, int]
    orientation: int | None = None

    @property
    def raw(self) -> tuple[int, int]:
        """(height, width) of the file's raw frame, as a viewer that ignores EXIF shows it."""
        h, w = self.upright
        return (w, h) if self.orientation in _TRANSPOSING else (h, w)


@dataclasses.dataclass(frozen=True)
class AlignedMask:
    """A mask as stored: its ids at the stored image's size, and what was done to them.

    Attributes:
      ids: (height, width) ids of the stored image's pixels.
      actions: 'mask_exif_transpose', 'mask_resized' (normalized.jsonl).
      details: JSON-safe sizes and orientation, for normalized.jsonl.
    """

    ids: np.ndarray
    actions: tuple[str, ...] = ()
    details: dict | None = None


def align_mask(ids: np.ndarray, frame: MaskFrame, name: str, drawn: str = "auto") -> AlignedMask:
    """The mask's ids at the stored image's pixels.

    A mask of the image's upright size is taken as drawn upright, one of its
    raw frame's size as drawn on the raw frame (then turned like the image).
    Where both sizes are equal (a square photo, orientations 2-4) the raw
    frame is meant, as pycocotools and every EXIF-blind tool draws on it,
    unless `drawn` says otherwise. Then it is resized to the stored size with
    the nearest neighbour.

    Args:
      ids: The mask's class ids.
      frame: The stored image's geometry.
      name: The image's relative path, for messages.
      drawn: --annotations_frame: 'auto' (the size decides), 'raw' or
        'upright' (every mask was drawn on that frame; its size must agree).

    Raises:
      ImageRejected: 'mask_size_mismatch', naming the sizes (and the flag).
    """
    shape = tuple(ids.shape[:2])
    actions, details = [], {}
    turned = frame.orientation is not None
    if turned and drawn != "upright" and shape == frame.raw:
        ids = _resize.orient_array(ids, frame.orientation)
        actions.append("mask_exif_transpose")
        details["orientation"] = int(frame.orientation)
    # Upright-sized, unless the flag says every mask of a turned photo is of its raw frame.
    elif shape != tuple(frame.upright) or (drawn == "raw" and turned):
        if drawn == "auto":
            sizes = f"{_size(frame.upright)} (upright)"
            if turned and frame.raw != tuple(frame.upright):
                sizes += f" or {_size(frame.raw)} (its raw frame before EXIF orientation)"
        else:
            want = frame.raw if drawn == "raw" and turned else tuple(frame.upright)
            sizes = f"{_size(want)} ({drawn}, as --annotations_frame {drawn} says)"
        raise ImageRejected(
            "mask_size_mismatch", f"mask of {name} is {_size(shape)}, the image {sizes}")
    if tuple(ids.shape[:2]) != tuple(frame.stored):
        ids = nearest(ids, frame.stored)
        actions.append("mask_resized")
        details["original"] = list(shape)
        details["stored"] = list(frame.stored)
    return AlignedMask(np.ascontiguousarray(ids), tuple(actions), details or None)


def _size(shape) -> str:
    """'WxH' (width first, as image sizes are said)."""
    return f"{shape[1]}x{shape[0]}"


def nearest(ids: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """`ids` resized to (height, width) with the nearest neighbour: every value one of `ids`'.

    Each output pixel takes the source pixel under its centre, so the
    result depends on nothing but the two sizes.
    """
    h, w = ids.shape[:2]
    th, tw = size
    rows = np.minimum((np.arange(th) * 2 + 1) * h // (2 * th), h - 1)
    cols = np.minimum((np.arange(tw) * 2 + 1) * w // (2 * tw), w - 1)
    return ids[rows[:, None], cols[None, :]]


def encode_mask(ids: np.ndarray, dtype: str) -> bytes:
    """A single-channel PNG of `ids`: 8-bit ("L") or 16-bit ("I;16"), the same bytes every time.

    With dtype 'uint16' every mask is stored at 16 bits with the same ids
    (an 8-bit mask's values are never scaled).

    Raises:
      ValueError: For a dtype other than MASK_DTYPES, or ids that do not fit it.
    """
    if dtype not in MASK_DTYPES:
        raise ValueError(f"Mask dtype must be one of {MASK_DTYPES}. Received: {dtype!r}")
    if dtype == "uint8":
        if ids.dtype != np.uint8 and ids.size and int(ids.max()) > 255:
            raise ValueError(f"Mask ids up to {int(ids.max())} do not fit in uint8")
        im = Image.fromarray(np.ascontiguousarray(ids, dtype=np.uint8))  # Mode "L"
    else:
        im = Image.fromarray(np.ascontiguousarray(ids, dtype=np.uint16))  # Mode "I;16"
    buf = io.BytesIO()
    im.save(buf, "PNG", compress_level=_PNG_LEVEL)
    return buf.getvalue()


def storable_as_is(data: bytes, dtype: str) -> bool:
    """Whether a mask file's own bytes can be stored: a greyscale PNG of the dataset's bit depth.

    TensorFlow decodes such a PNG (colour type 0, 8 bits for 'uint8' or 16
    for 'uint16') to its ids exactly, as the reader asks for one channel at
    that dtype, so it is kept byte for byte, as images are: encoding a 400x300
    mask again took 0.9 ms, twice its decoding. Any other PNG (palette,
    RGB, 1-, 2- or 4-bit, whose values libpng scales when it expands them to
    8 bits) is encoded again (`encode_mask`), as is a mask turned or resized.
    """
    bits = 8 if dtype == "uint8" else 16
    return (len(data) > 25 and data.startswith(_PNG_SIGNATURE) and data[12:16] == b"IHDR"
            and data[24] == bits and data[25] == 0)


def pixel_counts(ids: np.ndarray) -> np.ndarray:
    """Pixels of each class id (index: id), `np.bincount` of the mask."""
    return np.bincount(ids.ravel())


def image_frame(data: bytes, actions, height: int, width: int, details) -> MaskFrame:
    """The `MaskFrame` of a validated image, from its source bytes and what the validator did.

    Args:
      data: The image file's bytes (read only for an 'exif_transpose'd image:
        its orientation, from the JPEG markers or Pillow's EXIF reader).
      actions: The validated image's actions.
      height, width: Its stored size.
      details: Its details: 'original' holds the upright size before a
        resize (--max_side/--min_side).
    """
    upright = (height, width)
    if details and "original" in details and "stored" in details:
        upright = tuple(int(v) for v in details["original"])
    orientation = None
    if "exif_transpose" in actions:
        orientation = _orientation(data)
    return MaskFrame(upright=upright, stored=(height, width), orientation=orientation)


def _orientation(data: bytes) -> int | None:
    """The EXIF orientation (2-8) of an image file, or None (`imaging.boxes.raw_frame`)."""
    try:
        orientation = _boxes.raw_frame(data)[0]
    except _pil.PIL_ERRORS:  # OSError and ValueError among them
        return None
    return orientation if orientation in range(2, 9) else None
