"""What a file is, from its first bytes: format signatures and ordinary JPEG headers.

The JPEG header reader answers size, components and EXIF orientation from the
markers in microseconds (Pillow's open + getexif cost ~100-150 us per image
under the GIL); anything unusual returns None and is left to Pillow.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["JpegHeader", "jpeg_header", "sniff_format", "unread_format"]

_EXIF_ORIENTATION = 0x0112


def sniff_format(head: bytes) -> str | None:
    """Detects the image format from the first bytes of a file.

    Args:
      head: At least the first 132 bytes (fewer for short files).

    Returns:
      'jpeg', 'png', 'gif', 'bmp', 'webp', 'tiff', 'dicom', 'jpeg2000', or None when the
      bytes match no signature shardsmith knows (Pillow may still read them).
    """
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head.startswith(b"BM") and len(head) >= 26:
        return "bmp"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    # Classic TIFF, then BigTIFF (version 43).
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "tiff"
    if head[128:132] == b"DICM":
        return "dicom"
    # JPEG 2000: the JP2 signature box, or a bare codestream (SOC, then SIZ).
    if head.startswith(b"\x00\x00\x00\x0cjP  \r\n\x87\n") or head.startswith(b"\xff\x4f\xff\x51"):
        return "jpeg2000"
    return None


# ISO base media ("ftyp") brands of HEIF images: iPhones' HEIC photos.
_HEIF_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs"})


def unread_format(head: bytes) -> str | None:
    """Names a common image format that shardsmith does not read, from its first bytes.

    For the message of a file rejected as 'not_an_image': "an iPhone's HEIC
    photo" says what to do, where "not in a known image format" does not.

    Returns:
      'HEIF (HEIC) image', 'JPEG XL image', or None.
    """
    if head[4:8] == b"ftyp" and head[8:12] in _HEIF_BRANDS:
        return "HEIF (HEIC) image"
    if head.startswith((b"\xff\x0a", b"\x00\x00\x00\x0cJXL \r\n\x87\n")):
        return "JPEG XL image"
    return None


# Start-of-frame markers (baseline, extended, progressive, lossless; Huffman
# and arithmetic); not DHT (C4), JPG (C8) or DAC (CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class JpegHeader(NamedTuple):
    """What `jpeg_header` reads (a named tuple: built once per JPEG validated, 0.3 us, not a dataclass's 0.8)."""

    height: int
    width: int
    components: int
    orientation: int | None


def jpeg_header(data: bytes) -> JpegHeader | None:
    """Size, components and EXIF orientation of an ordinary JPEG, from its markers.

    Walks the marker segments up to the first scan: a few microseconds in
    place of Pillow's `open` and `getexif` (a tenth of a millisecond under
    the GIL, per image). Returns None for anything out of the ordinary (other
    than 8-bit, 1 or 3 components, a height given later by DNL, damaged
    segments, an orientation not stored as one SHORT); Pillow then reads the
    file as before and says what is wrong with it.
    """
    pos, end = 2, len(data)
    sof = None
    orientation = None
    exif_seen = False
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # Fill byte.
            pos += 1
            continue
        if marker == 0xDA:  # Start of scan: the header is over.
            break
        if marker in (0x01, 0xD8, 0xD9) or 0xD0 <= marker <= 0xD7:
            return None
        length = data[pos + 2] << 8 | data[pos + 3]
        if length < 2 or pos + 2 + length > end:
            return None
        # Only the segments read below are copied out (tables are skipped).
        if marker in _JPEG_SOF:
            if sof is not None or length < 8:
                return None
            sof = data[pos + 4:pos + 2 + length]
        elif marker == 0xE1 and data.startswith(b"Exif\0\0", pos + 4, pos + 2 + length) and not exif_seen:
            # Pillow reads the first Exif segment only.
            exif_seen = True
            orientation = _exif_orientation(data[pos + 10:pos + 2 + length])
            if orientation is False:
                return None
        pos += 2 + length
    else:
        return None
    if sof is None:
        return None
    precision, components = sof[0], sof[5]
    height, width = int.from_bytes(sof[1:3], "big"), int.from_bytes(sof[3:5], "big")
    if precision != 8 or components not in (1, 3) or height == 0 or width == 0:
        return None
    return JpegHeader(height, width, components, orientation)


def _exif_orientation(tiff: bytes):
    """The Orientation of IFD0 of an EXIF block: an int, None if absent, False if unreadable."""
    if tiff[:4] == b"II*\0":
        order = "little"
    elif tiff[:4] == b"MM\0*":
        order = "big"
    else:
        return False
    ifd = int.from_bytes(tiff[4:8], order)
    if ifd + 2 > len(tiff):
        return False
    count = int.from_bytes(tiff[ifd:ifd + 2], order)
    entries = tiff[ifd + 2:ifd + 2 + 12 * count]
    if len(entries) < 12 * count:
        return False
    for i in range(0, len(entries), 12):
        if int.from_bytes(entries[i:i + 2], order) == _EXIF_ORIENTATION:
            kind = int.from_bytes(entries[i + 2:i + 4], order)
            values = int.from_bytes(entries[i + 4:i + 8], order)
            if kind != 3 or values != 1:  # Not one SHORT: let Pillow interpret it.
                return False
            return int.from_bytes(entries[i + 8:i + 10], order)
    return None
