"""A seeded, structure-aware mutator of image files (issue 39): damaged files derived from real ones.

    from bench import mutate
    for case in mutate.mutations(data, "jpeg", count=50, seed=0):
        case.data, case.how   # the damaged bytes, and what was done ('field IHDR.width=0', ...)

Byte-level mutations (bit flips, truncation, inserted and deleted bytes) hit
any format; structure-aware ones act on the units a decoder walks: JPEG
segments, PNG chunks, TIFF IFD entries, DICOM elements, NIfTI-1's header (duplicated, dropped,
or a header field set to 0, -1 or a huge value). Same data, format and seed,
same cases.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Iterator

__all__ = ["Mutation", "mutations", "FORMATS", "VOLUME_FORMATS"]

FORMATS = ("jpeg", "png", "tiff", "dicom")
# Read by `--volumes` only (`bench.mutations_convert`): NIfTI-1 files (.nii; .nii.gz gzipped after).
VOLUME_FORMATS = ("nifti",)
# A field's new value: 0, all ones (-1 read unsigned), or huge.
_EXTREMES = ("zero", "minus_one", "huge")


@dataclasses.dataclass(frozen=True)
class Mutation:
    data: bytes
    how: str


def mutations(data: bytes, fmt: str, *, count: int, seed: int) -> Iterator[Mutation]:
    """`count` damaged versions of `data` (a file of format `fmt`), drawn with `seed`."""
    rng = random.Random(f"{fmt}:{seed}:{len(data)}")
    units = _UNITS[fmt](data)
    fields = _FIELDS[fmt](data)
    ops = ["flip", "truncate", "insert", "delete", "duplicate", "drop", "field", "field"]
    for _ in range(count):
        op = rng.choice(ops)
        if op in ("duplicate", "drop") and not units or op == "field" and not fields:
            op = "flip"
        yield _apply(op, data, units, fields, rng)


def _apply(op: str, data: bytes, units, fields, rng: random.Random) -> Mutation:
    n = len(data)
    if op == "flip":
        out = bytearray(data)
        flips = rng.choice((1, 1, 2, 8))
        for _ in range(flips):
            i = rng.randrange(n)
            out[i] ^= 1 << rng.randrange(8)
        return Mutation(bytes(out), f"flip {flips} bit(s)")
    if op == "truncate":
        at = rng.randrange(1, n)
        return Mutation(data[:at], f"truncate at {at} of {n}")
    if op == "insert":
        at, size = rng.randrange(n), rng.choice((1, 2, 4, 64))
        return Mutation(data[:at] + bytes(rng.randrange(256) for _ in range(size)) + data[at:],
                        f"insert {size} byte(s) at {at}")
    if op == "delete":
        at, size = rng.randrange(n), rng.choice((1, 2, 4, 64))
        return Mutation(data[:at] + data[at + size:], f"delete {size} byte(s) at {at}")
    if op in ("duplicate", "drop"):
        name, start, end = rng.choice(units)
        if op == "duplicate":
            return Mutation(data[:end] + data[start:end] + data[end:], f"duplicate {name}")
        return Mutation(data[:start] + data[end:], f"drop {name}")
    name, at, size, order = rng.choice(fields)
    extreme = rng.choice(_EXTREMES)
    bits = 8 * size
    value = {"zero": 0, "minus_one": 2**bits - 1, "huge": 2**(bits - 1) + rng.randrange(2**(bits - 1))}[extreme]
    out = bytearray(data)
    out[at:at + size] = value.to_bytes(size, order)
    return Mutation(bytes(out), f"field {name}={extreme}")


# --- Units (spans a decoder walks) and fields (header values), per format ------
# Each parser is forgiving: it returns what it finds of a well-formed seed file.


def _jpeg_units(data: bytes):
    units, i = [], 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xD9:
            break
        length = struct.unpack_from(">H", data, i + 2)[0]
        units.append((f"segment FF{marker:02X}", i, min(i + 2 + length, len(data))))
        if marker == 0xDA:  # Entropy-coded data follows: stop at the scan header.
            break
        i += 2 + length
    return units


def _jpeg_fields(data: bytes):
    fields = []
    for name, start, end in _jpeg_units(data):
        fields.append((f"{name}.length", start + 2, 2, "big"))
        if name in ("segment FFC0", "segment FFC1", "segment FFC2"):
            fields += [(f"{name}.bits", start + 4, 1, "big"), (f"{name}.height", start + 5, 2, "big"),
                       (f"{name}.width", start + 7, 2, "big"), (f"{name}.components", start + 9, 1, "big")]
    return fields


def _png_units(data: bytes):
    units, i = [], 8
    while i + 12 <= len(data):
        length = struct.unpack_from(">I", data, i)[0]
        kind = data[i + 4:i + 8].decode("latin-1")
        units.append((f"chunk {kind}", i, min(i + 12 + length, len(data))))
        i += 12 + length
    return units


def _png_fields(data: bytes):
    fields = [(f"{name}.length", start, 4, "big") for name, start, _ in _png_units(data)]
    fields += [("IHDR.width", 16, 4, "big"), ("IHDR.height", 20, 4, "big"), ("IHDR.bit_depth", 24, 1, "big"),
               ("IHDR.colour_type", 25, 1, "big"), ("IHDR.interlace", 28, 1, "big")]
    return fields


def _tiff_entries(data: bytes):
    """(tag, entry offset, order, big) for the entries of every IFD (at most 64 IFDs)."""
    if data[:2] not in (b"II", b"MM") or len(data) < 16:
        return []
    order = "little" if data[:2] == b"II" else "big"
    e = "<" if order == "little" else ">"
    big = struct.unpack_from(e + "H", data, 2)[0] == 43
    count_fmt, entry, next_fmt = (e + "Q", 20, e + "Q") if big else (e + "H", 12, e + "I")
    offset = struct.unpack_from(e + ("Q" if big else "I"), data, 8 if big else 4)[0]
    out, seen = [], set()
    while offset and offset not in seen and len(seen) < 64 and offset + 8 < len(data):
        seen.add(offset)
        count = struct.unpack_from(count_fmt, data, offset)[0]
        first = offset + struct.calcsize(count_fmt)
        if first + count * entry + struct.calcsize(next_fmt) > len(data):
            break
        for k in range(count):
            at = first + k * entry
            out.append((struct.unpack_from(e + "H", data, at)[0], at, order, big))
        offset = struct.unpack_from(next_fmt, data, first + count * entry)[0]
    return out


def _tiff_units(data: bytes):
    size = lambda big: 20 if big else 12  # noqa: E731
    return [(f"IFD entry {tag}", at, at + size(big)) for tag, at, _, big in _tiff_entries(data)]


def _tiff_fields(data: bytes):
    fields = []
    for tag, at, order, big in _tiff_entries(data):
        value_size = 8 if big else 4
        fields.append((f"tag {tag}.value", at + (12 if big else 8), value_size, order))
        fields.append((f"tag {tag}.count", at + 4, value_size, order))
    return fields


# Rows, Columns, BitsAllocated, BitsStored, SamplesPerPixel, NumberOfFrames
# sit in group 0028; Pixel Data's length is the one that matters most.
_DICOM_TAGS = {(0x0028, 0x0010): "Rows", (0x0028, 0x0011): "Columns", (0x0028, 0x0100): "BitsAllocated",
               (0x0028, 0x0101): "BitsStored", (0x0028, 0x0002): "SamplesPerPixel",
               (0x0028, 0x0008): "NumberOfFrames", (0x7FE0, 0x0010): "PixelData"}


def _dicom_elements(data: bytes):
    """(name, start, value offset, value size) of known elements, found by their explicit-VR little-endian bytes."""
    out = []
    for (group, element), name in _DICOM_TAGS.items():
        key = struct.pack("<HH", group, element)
        at = data.find(key, 132)
        if at < 0:
            continue
        vr = data[at + 4:at + 6]
        if vr in (b"OB", b"OW", b"OF", b"SQ", b"UT", b"UN"):
            out.append((name, at, at + 8, 4))  # 2 reserved bytes, then a 4-byte length.
        elif vr.isalpha():
            length = struct.unpack_from("<H", data, at + 6)[0]
            out.append((name, at, at + 8, min(length, 4) or 2))
        else:  # Implicit VR: a 4-byte length, then the value.
            out.append((name, at, at + 8, 2))
    return out


def _dicom_units(data: bytes):
    return [(f"element {name}", start, min(value + size, len(data)))
            for name, start, value, size in _dicom_elements(data) if name != "PixelData"]


def _dicom_fields(data: bytes):
    return [(f"{name}.{'length' if name == 'PixelData' else 'value'}", value, size, "little")
            for name, _, value, size in _dicom_elements(data)]


# NIfTI-1's 348-byte header (little-endian as nibabel writes it): the fields a reader sizes and
# places the voxels by; then the 4-byte extension flag and the voxels from vox_offset.
_NIFTI_FIELDS = (("sizeof_hdr", 0, 4), ("dim[0]", 40, 2), ("dim[1]", 42, 2), ("dim[2]", 44, 2), ("dim[3]", 46, 2),
                 ("dim[4]", 48, 2), ("datatype", 70, 2), ("bitpix", 72, 2), ("pixdim[1]", 80, 4),
                 ("pixdim[3]", 88, 4), ("vox_offset", 108, 4), ("scl_slope", 112, 4), ("scl_inter", 116, 4),
                 ("qform_code", 252, 2), ("sform_code", 254, 2), ("srow_x[0]", 280, 4), ("magic", 344, 4),
                 ("extension", 348, 1))


def _nifti_units(data: bytes):
    if len(data) < 352:
        return []
    return [("header", 0, 348), ("extension flag", 348, 352), ("first voxels", 352, min(len(data), 352 + 64))]


def _nifti_fields(data: bytes):
    return [(f"header.{name}", at, size, "little") for name, at, size in _NIFTI_FIELDS if at + size <= len(data)]


_UNITS = {"jpeg": _jpeg_units, "png": _png_units, "tiff": _tiff_units, "dicom": _dicom_units, "nifti": _nifti_units}
_FIELDS = {"jpeg": _jpeg_fields, "png": _png_fields, "tiff": _tiff_fields, "dicom": _dicom_fields,
           "nifti": _nifti_fields}
