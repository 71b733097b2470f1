"""An accept-only check that a plain JPEG decodes, without loading TensorFlow.

`decodes` lets Pillow's libjpeg-turbo decode the file at the scale the
converter checks at (libjpeg's DCT scaling: every entropy-coded byte is still
read and Huffman-decoded) and answers True only where that decode succeeds on
a file of the plainest kind: one Huffman frame (baseline, extended or
progressive), 8-bit, 1 or 3 components, only table, restart-interval, APPn
and COM segments before the first scan, and EOI as its last two bytes.

It answers False at the least doubt (another frame type, an unusual segment,
data after EOI, any Pillow error): the caller then decodes with TensorFlow as
always, which decides, and words any rejection, exactly as before. So this
module never rejects a file and never changes what is stored or reported.

Why it is safe although it is not TensorFlow's decoder: both run libjpeg-turbo
(TensorFlow 2.21's 2.1.4, Pillow 12's 3.1) with errors fatal and warnings
(corrupt entropy data, extraneous bytes) ignored, and both read the whole file
up to EOI. `tests/test_imaging_jpeg_fast.py` checks, on thousands of damaged
files, that it never accepts one TensorFlow's `decode_jpeg` rejects
(bench/RESULTS.md, branch jpegfast10, has the full study).

Why: a photo conversion whose JPEGs all pass never loads TensorFlow's decode
ops (~0.7 CPU s, ~0.5 s before the first shard's first decode), and the
decode itself costs as much in either library (~1.4 CPU ms per bench photo at
1/8 scale, both releasing the GIL).
"""

from __future__ import annotations

import io
import re

from PIL import Image

__all__ = ["decodes"]

# Start-of-frame markers left to this check: Huffman baseline, extended and
# progressive DCT. Lossless, hierarchical and arithmetic frames go to TensorFlow.
_SOF_HUFFMAN = frozenset((0xC0, 0xC1, 0xC2))
# Segments allowed before the first scan besides the frame: DHT, DQT, DRI, APPn, COM.
_TABLES = frozenset((0xC4, 0xDB, 0xDD, 0xFE, *range(0xE0, 0xF0)))
_MODES = {1: "L", 3: "RGB"}
# The next marker past entropy-coded data: 0xFF then neither a stuffed zero
# nor a restart marker (a fill byte 0xFF matches too: left to TensorFlow).
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7]")
# Errors Pillow raises for a file it cannot read (OSError covers its
# UnidentifiedImageError and libjpeg's errors; the others come from its
# marker parser on damaged segments).
_PILLOW_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError, TypeError,
                  Image.DecompressionBombError)


def decodes(data: bytes, ratio: int) -> bool:
    """Whether TensorFlow's `decode_jpeg` surely decodes `data` (False: unknown, TensorFlow decides).

    Args:
      data: A whole JPEG file.
      ratio: The libjpeg scale denominator the converter checks at (1, 2, 4 or 8).

    Returns:
      True only for a plain JPEG that libjpeg-turbo decodes without error.
    """
    frame = _plain_frame(data)
    if frame is None:
        return False
    components, pixels = frame
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and pixels > limit:
        return False  # Pillow would warn, or refuse, for its own reasons.
    try:
        with Image.open(io.BytesIO(data), formats=("JPEG",)) as im:
            width, height = im.size
            if im.mode != _MODES[components] or width * height != pixels:
                return False
            # The smallest size libjpeg's scale 1/ratio gives: Pillow picks that scale.
            im.draft(im.mode, (max(1, width // ratio), max(1, height // ratio)))
            im.load()
    except _PILLOW_ERRORS:
        return False
    return True


def _plain_frame(data: bytes) -> tuple[int, int] | None:
    """The frame's (components, pixels) when the file's marker structure is plain, else None.

    Walks every segment, and past each scan's entropy-coded data to the
    next marker: the scans (one interleaved scan, or a progressive frame's
    scans with their DHT segments) must be followed by EOI, the file's last
    two bytes. Why the whole file: once the last scanline is out, Pillow
    takes running out of data before EOI as the end (it ignores
    `jpeg_finish_decompress` suspending) where TensorFlow fails: a
    segment after the scan whose length runs past the end, say.
    """
    end = len(data)
    if not data.startswith(b"\xff\xd8") or not data.endswith(b"\xff\xd9"):
        return None
    pos = 2
    components = progressive = None
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        length = data[pos + 2] << 8 | data[pos + 3]
        if length < 2 or pos + 2 + length > end:
            return None
        if marker == 0xDA:
            break
        if marker in _SOF_HUFFMAN:
            if components is not None or length < 8:
                return None
            precision, count = data[pos + 4], data[pos + 9]
            pixels = (data[pos + 5] << 8 | data[pos + 6]) * (data[pos + 7] << 8 | data[pos + 8])
            if precision != 8 or count not in _MODES or length != 8 + 3 * count or not pixels:
                return None  # Not 8-bit, 1 or 3 components, or a height given later (DNL).
            components, progressive = count, marker == 0xC2
        elif marker not in _TABLES:
            return None
        pos += 2 + length
    else:
        return None
    if components is None:
        return None
    while True:  # At an SOS segment.
        scan_components = data[pos + 4]
        if length != 6 + 2 * scan_components or not progressive and scan_components != components:
            return None  # A multi-scan sequential frame is left to TensorFlow.
        found = _MARKER.search(data, pos + 2 + length)
        if found is None:
            return None
        pos = found.start()
        if pos == end - 2:
            return components, pixels
        if not progressive:
            return None
        # Between a progressive frame's scans: Huffman tables, then the next scan.
        while data[pos + 1] == 0xC4:
            length = data[pos + 2] << 8 | data[pos + 3] if pos + 4 <= end else 0
            if length < 2 or pos + 2 + length + 4 > end:
                return None
            pos += 2 + length
            if data[pos] != 0xFF:
                return None
        if data[pos + 1] != 0xDA:
            return None
        length = data[pos + 2] << 8 | data[pos + 3]
        if length < 8 or pos + 2 + length > end - 2:
            return None
