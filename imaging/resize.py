"""Storing images at the size training reads them (--max_side, --min_side).

Opt-in: with neither flag every image is stored as the validator leaves it.
With one of them, an image larger than the target is scaled down (never up),
keeping its aspect ratio, with an antialiased Lanczos filter, after EXIF
orientation. JPEGs are decoded by libjpeg at the smallest of its scales (1/8,
1/4, 1/2) that still gives at least the target size (Pillow's `draft`, TF's
`decode_jpeg(ratio=...)`), so a 100-megapixel photo never exists in memory in
full when the target is small.

Framework-free and array based, so any decoded image (8/16-bit, float,
any number of bands) is sized the same way:

    policy = ResizeOptions(max_side=512)
    target_size(3024, 4032, policy)      # (384, 512)
    small = resize_array(pixels, policy)  # same dtype and bands
"""

from __future__ import annotations

import dataclasses
import io
import struct
import zlib

import numpy as np
from PIL import Image

__all__ = ["ResizeOptions", "target_size", "resize_array", "jpeg_scale", "orient_array", "encode"]

# libjpeg's scaled decodes (the denominators Pillow's `draft` and TF's `ratio` allow).
_JPEG_SCALES = (8, 4, 2, 1)


@dataclasses.dataclass(frozen=True)
class ResizeOptions:
    """How stored images are sized; validated when built.

    Attributes:
      max_side: Scale images whose longer side exceeds this down to it
        (--max_side); None: no cap.
      min_side: Scale images whose shorter side exceeds this down to it, as
        the ImageNet preprocessing scripts do (--min_side); None: no cap.
        At most one of `max_side` and `min_side`.
      jpeg_quality: Quality of re-encoded (resized) JPEGs, 1-100
        (--jpeg_quality).

    Raises:
      ValueError: Naming the flag, what it allows and what it received.
    """

    max_side: int | None = None
    min_side: int | None = None
    jpeg_quality: int = 95

    def __post_init__(self):
        for flag in ("max_side", "min_side"):
            value = getattr(self, flag)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"--{flag} must be an integer of at least 1. Received: {value!r}")
        if self.max_side is not None and self.min_side is not None:
            raise ValueError(
                "--max_side caps the longer side and --min_side the shorter one; give one of them. "
                f"Received: --max_side {self.max_side} --min_side {self.min_side}"
            )
        q = self.jpeg_quality
        if isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= 100:
            raise ValueError(f"--jpeg_quality must be an integer in 1-100. Received: {q!r}")

    @property
    def active(self) -> bool:
        """Whether any image may be resized."""
        return self.max_side is not None or self.min_side is not None

    @property
    def action(self) -> str:
        """The action listed in normalized.jsonl for a resized image."""
        return "resize_max_side" if self.max_side is not None else "resize_min_side"

    def to_json(self) -> dict:
        """The manifest's `options.resize` (only written when active)."""
        if self.max_side is not None:
            return {"max_side": self.max_side, "jpeg_quality": self.jpeg_quality}
        return {"min_side": self.min_side, "jpeg_quality": self.jpeg_quality}

    @classmethod
    def from_json(cls, doc) -> ResizeOptions:
        """The inverse of `to_json`; None or {} for no policy."""
        return cls(**dict(doc or {}))

    def allows(self, height: int, width: int) -> bool:
        """Whether a stored image of this size obeys the policy."""
        return target_size(height, width, self) == (height, width)


def target_size(height: int, width: int, policy: ResizeOptions) -> tuple[int, int]:
    """The stored (height, width) of an image of this size: smaller or the same, never larger.

    The capped side becomes exactly N; the other keeps the aspect ratio
    (rounded, at least 1 pixel).
    """
    if policy.max_side is not None:
        n, side = policy.max_side, max(height, width)
    elif policy.min_side is not None:
        n, side = policy.min_side, min(height, width)
    else:
        return height, width
    if side <= n:
        return height, width
    scale = n / side
    # The capped side is exactly N; the other keeps the aspect ratio.
    return tuple(n if x == side else max(1, round(x * scale)) for x in (height, width))


def jpeg_scale(height: int, width: int, policy: ResizeOptions) -> int:
    """libjpeg's scale denominator (1, 2, 4 or 8) to decode a JPEG of this size at.

    The smallest scale whose output is still at least the target size, so the
    filter only ever scales down from real pixels.
    """
    th, tw = target_size(height, width, policy)
    for d in _JPEG_SCALES:
        if -(-height // d) >= th and -(-width // d) >= tw:
            return d
    return 1


def orient_array(arr: np.ndarray, orientation: int | None) -> np.ndarray:
    """Turns decoded pixels (height, width[, bands]) upright per an EXIF orientation (1-8).

    The same transforms as Pillow's `ImageOps.exif_transpose`.
    """
    if orientation == 2:
        return arr[:, ::-1]
    if orientation == 3:
        return arr[::-1, ::-1]
    if orientation == 4:
        return arr[::-1]
    if orientation == 5:
        return np.swapaxes(arr, 0, 1)
    if orientation == 6:
        return np.rot90(arr, -1)
    if orientation == 7:
        return np.swapaxes(arr[::-1, ::-1], 0, 1)
    if orientation == 8:
        return np.rot90(arr, 1)
    return arr


def resize_array(arr: np.ndarray, policy: ResizeOptions) -> np.ndarray:
    """Scales pixels (height, width[, bands]) down to `target_size`, same dtype and bands.

    Lanczos (antialiased) on each band. 8-bit grey/RGB/RGBA go through
    Pillow's native modes; every other dtype or band count is filtered band
    by band in 32-bit float (exact for 8/16-bit and float32 inputs), then
    rounded and clipped back to the dtype. NaNs spread to their neighbours:
    a raster with NaN nodata should have it filled first.

    Returns:
      `arr` itself when it already fits.
    """
    if arr.ndim not in (2, 3) or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"resize_array takes (height, width[, bands]) pixels. Received shape {arr.shape}")
    h, w = arr.shape[:2]
    th, tw = target_size(h, w, policy)
    if (th, tw) == (h, w):
        return arr
    if arr.dtype == np.uint8 and (arr.ndim == 2 or arr.shape[2] in (1, 3, 4)):
        squeeze = arr.ndim == 3 and arr.shape[2] == 1
        im = Image.fromarray(np.ascontiguousarray(arr[..., 0] if squeeze else arr))
        out = np.asarray(im.resize((tw, th), Image.Resampling.LANCZOS))
        return out[..., None] if squeeze else out
    bands = arr[..., None] if arr.ndim == 2 else arr
    out = np.stack([_resize_band(bands[..., b], tw, th) for b in range(bands.shape[2])], axis=-1)
    if np.issubdtype(arr.dtype, np.integer):
        info = np.iinfo(arr.dtype)
        out = np.clip(np.rint(out), info.min, info.max)
    out = out.astype(arr.dtype)
    return out[..., 0] if arr.ndim == 2 else out


def _resize_band(band: np.ndarray, tw: int, th: int) -> np.ndarray:
    im = Image.fromarray(np.ascontiguousarray(band, dtype=np.float32), mode="F")
    return np.asarray(im.resize((tw, th), Image.Resampling.LANCZOS))


def encode(arr: np.ndarray, fmt: str, jpeg_quality: int) -> bytes:
    """Encodes resized pixels as `fmt` ('jpeg': 8-bit 1/3 bands; 'png': 8/16-bit 1-4 bands)."""
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    arr = np.ascontiguousarray(arr)
    buf = io.BytesIO()
    if fmt == "jpeg":
        # 4:4:4 chroma, as the validator's other re-encoded JPEGs.
        Image.fromarray(arr).save(buf, "JPEG", quality=jpeg_quality, subsampling=0)
        return buf.getvalue()
    if arr.dtype == np.uint16 and arr.ndim == 3:
        return _png16(arr)  # Pillow cannot write 16-bit colour PNGs.
    # Level 6 as the validator's PNGs: most of the size win at a fraction of level 9's time.
    Image.fromarray(arr).save(buf, "PNG", compress_level=6)
    return buf.getvalue()


def _png16(arr: np.ndarray) -> bytes:
    """A 16-bit PNG of 2-4 bands (grey+alpha, RGB, RGBA): unfiltered rows, zlib level 6."""
    h, w, c = arr.shape
    color_type = {2: 4, 3: 2, 4: 6}[c]
    rows = np.zeros((h, 1 + w * c * 2), np.uint8)
    rows[:, 1:] = arr.astype(">u2").reshape(h, -1).view(np.uint8)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)) + chunk(b"IEND", b""))
