"""A reader for the plainest multi-band TIFFs, beside tifffile; anything else is tifffile's.

Why not tifffile for these too: it builds every tag of a page in Python
(~15 us each), ~350 us of CPU to open a 64x64 13-band uint16 patch and read
its one strip, where the converter's other work on it is ~300 us (measured
on 4,000 EuroSAT-sized patches, tifffile 2026.3.3). This reads the first
IFD with `struct`, and only when everything in it is plain:

- classic TIFF (not BigTIFF), one page (the next-IFD offset is 0);
- samples of more than 8 bits, or signed or floating point (8-bit unsigned
  images keep deciding between Pillow and tifffile as before);
- strips, chunky (PlanarConfiguration 1), uncompressed or deflate without
  predictor, each strip exactly the bytes its rows need, inside the file;
- photometric minisblack or RGB; no tag outside a list of metadata tags
  that do not change the pixels tifffile reads (GeoTIFF's, GDAL's, ...);
- a GDAL_NODATA value parsed as tifffile parses it, and castable.

Then it returns what tifffile's `TiffPage.asarray` gives, as an array in
native byte order, and the page's nodata; otherwise None, and tifffile reads
the file (and says what is wrong with a damaged one) exactly as before.
tests/test_imaging_raster.py compares both on generated files.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

__all__ = ["read_plain"]

_NONE, _DEFLATE, _ADOBE_DEFLATE = 1, 32946, 8
# Tags that change nothing in what tifffile's asarray reads (descriptions,
# dates, resolution, georeferencing, GDAL metadata), beside those read here.
_METADATA_TAGS = frozenset({
    269, 270, 271, 272, 274, 282, 283, 285, 296, 297, 305, 306, 315, 316, 338, 33432,
    33550, 33922, 34264, 34735, 34736, 34737, 42112,
})
_NEW_SUBFILE_TYPE, _WIDTH, _LENGTH, _BITS, _COMPRESSION, _PHOTOMETRIC = 254, 256, 257, 258, 259, 262
_FILL_ORDER, _STRIP_OFFSETS, _SAMPLES, _ROWS_PER_STRIP, _STRIP_BYTES = 266, 273, 277, 278, 279
_PLANAR, _PREDICTOR, _SAMPLE_FORMAT, _NODATA = 284, 317, 339, 42113
_READ_TAGS = frozenset({_NEW_SUBFILE_TYPE, _WIDTH, _LENGTH, _BITS, _COMPRESSION, _PHOTOMETRIC,
                        _FILL_ORDER, _STRIP_OFFSETS, _SAMPLES, _ROWS_PER_STRIP, _STRIP_BYTES,
                        _PLANAR, _PREDICTOR, _SAMPLE_FORMAT, _NODATA})
_KNOWN_TAGS = _READ_TAGS | _METADATA_TAGS
# TIFF field types: struct code and size of one value.
_TYPES = {1: ("B", 1), 2: ("s", 1), 3: ("H", 2), 4: ("I", 4), 5: ("II", 8), 6: ("b", 1),
          7: ("B", 1), 8: ("h", 2), 9: ("i", 4), 10: ("ii", 8), 11: ("f", 4), 12: ("d", 8)}
# (bits per sample, SampleFormat) -> numpy type; 8-bit unsigned is left out on purpose.
_DTYPES = {(16, 1): "u2", (32, 1): "u4", (8, 2): "i1", (16, 2): "i2", (32, 2): "i4",
           (16, 3): "f2", (32, 3): "f4", (64, 3): "f8"}


class _NotPlain(Exception):
    """The file is not one this reader takes: tifffile reads it."""


def read_plain(data: bytes, max_samples: int) -> tuple[np.ndarray, float | None] | None:
    """(array (height, width, bands) in native byte order, nodata or None), or None for tifffile.

    Never raises for a file it does not take: damaged, unusual or merely
    different files all give None; so do files of more than `max_samples`
    samples (tifffile's path rejects them before decoding anything).
    """
    try:
        return _read(data, max_samples)
    except (_NotPlain, struct.error, zlib.error, ValueError, OverflowError, UnicodeDecodeError):
        return None


def _read(data: bytes, max_samples: int):
    order = {b"II": "<", b"MM": ">"}.get(data[:2])
    if order is None or struct.unpack_from(order + "H", data, 2)[0] != 42:
        raise _NotPlain
    tags = _first_ifd(data, order)
    if not _KNOWN_TAGS.issuperset(tags):
        raise _NotPlain
    one = _one_value
    if one(tags, _NEW_SUBFILE_TYPE, 0) != 0 or one(tags, _FILL_ORDER, 1) != 1:
        raise _NotPlain
    if one(tags, _PLANAR, 1) != 1 or one(tags, _PREDICTOR, 1) != 1:
        raise _NotPlain
    if one(tags, _PHOTOMETRIC, None) not in (1, 2):
        raise _NotPlain
    compression = one(tags, _COMPRESSION, _NONE)
    if compression not in (_NONE, _DEFLATE, _ADOBE_DEFLATE):
        raise _NotPlain
    width, height, samples = one(tags, _WIDTH, None), one(tags, _LENGTH, None), one(tags, _SAMPLES, 1)
    if not (width and height and samples) or width * height * samples > max_samples:
        raise _NotPlain
    bits = _same_values(tags, _BITS, samples, 1)
    fmt = _same_values(tags, _SAMPLE_FORMAT, samples, 1)
    code = _DTYPES.get((bits, fmt))
    if code is None:
        raise _NotPlain
    dtype = np.dtype(order + code)
    rows = min(one(tags, _ROWS_PER_STRIP, 2**32 - 1), height)
    if rows <= 0:
        raise _NotPlain  # RowsPerStrip 0 (a damaged header): tifffile's path says what is wrong.
    offsets, counts = tags.get(_STRIP_OFFSETS), tags.get(_STRIP_BYTES)
    strips = -(-height // rows)
    if offsets is None or counts is None or len(offsets) != strips or len(counts) != strips:
        raise _NotPlain
    row_bytes = width * samples * dtype.itemsize
    pieces = []
    for i, (offset, count) in enumerate(zip(offsets, counts)):
        need = min(rows, height - i * rows) * row_bytes
        if count <= 0 or offset + count > len(data):
            raise _NotPlain
        if compression == _NONE:
            if count != need:
                raise _NotPlain
            pieces.append(memoryview(data)[offset:offset + count])
        else:
            # At most one byte more than the strip needs: a deflate bomb stops there.
            piece = zlib.decompressobj().decompress(memoryview(data)[offset:offset + count], need + 1)
            if len(piece) != need:
                raise _NotPlain
            pieces.append(piece)
    raw = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    array = np.frombuffer(raw, dtype).reshape(height, width, samples)
    native = dtype.newbyteorder("=")
    if dtype != native:
        array = array.astype(native)
    return array, _nodata(tags, native)


def _first_ifd(data: bytes, order: str) -> dict[int, tuple]:
    """The first IFD's tags that this reader reads, {code: values}; every entry checked in bounds."""
    (offset,) = struct.unpack_from(order + "I", data, 4)
    (n,) = struct.unpack_from(order + "H", data, offset)
    entries = struct.unpack_from(order + "HHII" * n, data, offset + 2)
    (next_ifd,) = struct.unpack_from(order + "I", data, offset + 2 + 12 * n)
    if next_ifd != 0:
        raise _NotPlain  # Several pages: tifffile says which are images.
    tags: dict[int, tuple] = {}
    previous = -1
    for k in range(n):
        code, kind, count, value = entries[4 * k:4 * k + 4]
        if code < previous or code == previous and code in _READ_TAGS or kind not in _TYPES:
            # Unsorted tags, a repeated pixel tag, unknown types: tifffile's to judge.
            # (tifffile repeats ImageDescription: the caller's, then its own shape.)
            raise _NotPlain
        previous = code
        fmt, size = _TYPES[kind]
        total = size * count
        where = offset + 2 + 12 * k + 8 if total <= 4 else value
        if where + total > len(data):
            raise _NotPlain
        if code not in _READ_TAGS:
            tags[code] = ()
            continue
        if kind == 2:
            tags[code] = (data[where:where + total],)
        elif kind in (5, 10):
            raise _NotPlain
        else:
            tags[code] = struct.unpack_from(f"{order}{count}{fmt}", data, where)
    return tags


def _one_value(tags, code: int, default):
    values = tags.get(code)
    if values is None:
        return default
    if len(values) != 1 or not isinstance(values[0], int):
        raise _NotPlain
    return values[0]


def _same_values(tags, code: int, samples: int, default: int) -> int:
    """A per-sample field that must hold one value for every sample (or one for all)."""
    values = tags.get(code)
    if values is None:
        return default
    if len(values) not in (1, samples) or len(set(values)) != 1:
        raise _NotPlain
    return values[0]


def _nodata(tags, dtype: np.dtype) -> float | None:
    """GDAL_NODATA as tifffile reads it (int for integer samples, float otherwise); castable."""
    if _NODATA not in tags:
        return None
    (raw,) = tags[_NODATA]
    raw = raw.rstrip(b"\0")
    if b"\0" in raw:
        raise _NotPlain  # Several strings: tifffile's reading of it decides.
    text = raw.decode("ascii").replace(",", ".")
    value = type(dtype.type(0).item())(text)
    if not np.can_cast(np.min_scalar_type(value), dtype):
        raise _NotPlain  # tifffile warns and takes 0: let it.
    return float(value)
