"""The chain of a TIFF's image file directories (IFDs), walked without following a loop.

Each IFD ends with the offset of the next; a damaged offset that points back
to an earlier IFD (or to itself) makes a reader that trusts the chain read the
same pages for ever (tifffile did, growing by about 30 MB/s: issue 39). The
chain is walked here, header by header, before tifffile sees the file, and a
loop is a damaged file. Only the 2 or 8 bytes of each count and next offset
are read, so the walk costs microseconds on files of any size.
"""

from __future__ import annotations

import io
import struct

__all__ = ["ifd_loop"]

# (byte order, magic) -> (offset of the first IFD's offset, its format, entry
# count format, entry size, next offset format).
_LAYOUTS = {
    (b"II", 42): (4, "<I", "<H", 12, "<I"),
    (b"MM", 42): (4, ">I", ">H", 12, ">I"),
    (b"II", 43): (8, "<Q", "<Q", 20, "<Q"),  # BigTIFF
    (b"MM", 43): (8, ">Q", ">Q", 20, ">Q"),
}


# The largest offset a file can seek to (a signed 64-bit position).
_MAX_OFFSET = (1 << 63) - 1


def ifd_loop(source) -> str | None:
    """What loops in a TIFF's IFD chain, or None (no loop, not a TIFF, or cut short).

    Args:
      source: The file's bytes, or a seekable binary file.

    Returns:
      A sentence naming the IFD offset the chain comes back to, for the
      rejects list; None when the chain ends (a next offset of 0, or one past
      the end of the file: the readers say what is wrong with that).
    """
    fh = io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
    start = fh.tell()
    try:
        head = _read(fh, 0, 4)
        if head is None:
            return None
        layout = _LAYOUTS.get((head[:2], struct.unpack(">H" if head[:2] == b"MM" else "<H", head[2:4])[0]))
        if layout is None:
            return None
        first_at, offset_fmt, count_fmt, entry_size, next_fmt = layout
        raw = _read(fh, first_at, struct.calcsize(offset_fmt))
        if raw is None:
            return None
        offset = struct.unpack(offset_fmt, raw)[0]
        seen: set[int] = set()
        index = 0
        while offset:
            if offset in seen:
                return f"its IFD {index - 1} points back to the IFD at offset {offset} (a loop in the page chain)"
            seen.add(offset)
            raw = _read(fh, offset, struct.calcsize(count_fmt))
            if raw is None:
                return None
            count = struct.unpack(count_fmt, raw)[0]
            raw = _read(fh, offset + struct.calcsize(count_fmt) + count * entry_size, struct.calcsize(next_fmt))
            if raw is None:
                return None
            offset = struct.unpack(next_fmt, raw)[0]
            index += 1
        return None
    finally:
        fh.seek(start)


def _read(fh, offset: int, size: int) -> bytes | None:
    """`size` bytes at `offset`, or None past the end of the file."""
    if offset > _MAX_OFFSET:
        # A BigTIFF's 8-byte offset past what a file can seek to (OverflowError: found by
        # bench.mutations_convert, issue 39): past the end of any file.
        return None
    fh.seek(offset)
    data = fh.read(size)
    return data if len(data) == size else None
