"""A seeded, structure-aware mutator of image files (issue 39): damaged files derived from real ones.

    from bench import mutate
    for case in mutate.mutations(data, "jpeg", count=50, seed=0):
        case.data, case.how   # the damaged bytes, and what was done ('field IHDR.width=0', ...)

Byte-level mutations (bit flips, truncation, inserted and deleted bytes) hit
any format; structure-aware ones act on the units a decoder walks: JPEG
segments, PNG chunks, TIFF IFD entries, DICOM elements and, in encapsulated
pixel data, its items and each fragment's codestream (JPEG, JPEG-LS and
JPEG 2000 marker segments, RLE's segment header), NIfTI-1's and NIfTI-2's
header (duplicated, dropped, or a header field set to 0, -1 or a huge value).
Same data, format and seed, same cases.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Iterator

__all__ = ["Mutation", "mutations", "FORMATS", "VOLUME_FORMATS"]

FORMATS = ("jpeg", "png", "tiff", "dicom")
# Read by `--volumes` only (`bench.mutations_convert`): NIfTI-1 and NIfTI-2 files (.nii; .nii.gz
# gzipped after).
VOLUME_FORMATS = ("nifti",)
# A field's new value: 0, all ones (-1 read unsigned), huge (its top bit set: negative read
# signed), or large (positive read either way: a size a signed field can claim).
_EXTREMES = ("zero", "minus_one", "huge", "large")


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
    value = {"zero": 0, "minus_one": 2**bits - 1, "huge": 2**(bits - 1) + rng.randrange(2**(bits - 1)),
             "large": 2**(bits - 2) + rng.randrange(2**(bits - 2))}[extreme]
    out = bytearray(data)
    out[at:at + size] = value.to_bytes(size, order)
    return Mutation(bytes(out), f"field {name}={extreme}")


# --- Units (spans a decoder walks) and fields (header values), per format ------
# Each parser is forgiving: it returns what it finds of a well-formed seed file.


def _jpeg_units(data: bytes):
    return _marker_units(data, 0)


def _marker_units(data: bytes, base: int):
    """(name, start, end) of the marker segments of a JPEG-family or JPEG 2000 codestream at `base`.

    JPEG (baseline, lossless, JPEG-LS) up to its scan header; JPEG 2000 (SOC
    FF4F) up to its first tile-part's data (SOD FF93, which has no length).
    """
    units, i = [], base + 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker in (0xD9, 0x93):
            break
        length = struct.unpack_from(">H", data, i + 2)[0]
        units.append((f"segment FF{marker:02X}", i, min(i + 2 + length, len(data))))
        if marker == 0xDA:  # Entropy-coded data follows: stop at the scan header.
            break
        i += 2 + length
    return units


# Start of frame: baseline, extended, progressive, lossless (Process 14), JPEG-LS.
_SOF_MARKERS = ("segment FFC0", "segment FFC1", "segment FFC2", "segment FFC3", "segment FFF7")
# JPEG 2000's image and tile size (SIZ), coding style (COD) and tile-part (SOT) fields: (name, at, size).
_J2K_FIELDS = {"segment FF51": (("Xsiz", 6, 4), ("Ysiz", 10, 4), ("XOsiz", 14, 4), ("XTsiz", 22, 4),
                                ("YTsiz", 26, 4), ("Csiz", 38, 2), ("Ssiz", 40, 1), ("XRsiz", 41, 1)),
               "segment FF52": (("layers", 6, 2), ("levels", 9, 1), ("codeblock_width", 10, 1)),
               "segment FF90": (("Isot", 4, 2), ("Psot", 6, 4), ("TPsot", 10, 1))}


def _jpeg_fields(data: bytes):
    return _marker_fields(data, 0)


def _marker_fields(data: bytes, base: int):
    fields = []
    for name, start, end in _marker_units(data, base):
        fields.append((f"{name}.length", start + 2, 2, "big"))
        if name in _SOF_MARKERS:
            fields += [(f"{name}.bits", start + 4, 1, "big"), (f"{name}.height", start + 5, 2, "big"),
                       (f"{name}.width", start + 7, 2, "big"), (f"{name}.components", start + 9, 1, "big")]
        fields += [(f"{name}.{field}", start + at, size, "big") for field, at, size in _J2K_FIELDS.get(name, ())
                   if start + at + size <= end]
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


def _dicom_fragments(data: bytes):
    """(item start, value start, value end) of the items of encapsulated Pixel Data (at most 8).

    The first is the Basic Offset Table, the rest the fragments of the frames' codestreams.
    """
    at = data.rfind(b"\xe0\x7f\x10\x00")
    if at < 0 or data[at + 8:at + 12] != b"\xff\xff\xff\xff":  # Explicit VR, undefined length.
        return []
    out, i = [], at + 12
    while i + 8 <= len(data) and data[i:i + 4] == b"\xfe\xff\x00\xe0" and len(out) < 8:
        length = struct.unpack_from("<I", data, i + 4)[0]
        out.append((i, i + 8, min(i + 8 + length, len(data))))
        i += 8 + length
    return out


def _codestream_start(data: bytes, start: int, end: int) -> tuple[str, int] | None:
    """The kind of codestream a fragment holds, and where it starts (after a JP2 wrapper's boxes)."""
    if data[start:start + 2] == b"\xff\xd8":
        return "jpeg", start
    soc = data.find(b"\xff\x4f\xff\x51", start, min(end, start + 512))
    if soc >= 0:
        return "j2k", soc
    # RLE's 64-byte header: the number of segments, then their 15 offsets (little-endian).
    if end - start >= 64 and struct.unpack_from("<I", data, start)[0] in range(1, 16):
        return "rle", start
    return None


def _dicom_units(data: bytes):
    units = [(f"element {name}", start, min(value + size, len(data)))
             for name, start, value, size in _dicom_elements(data) if name != "PixelData"]
    for k, (item, start, end) in enumerate(_dicom_fragments(data)):
        units.append((f"pixel item {k}", item, end))
        found = _codestream_start(data, start, end)
        if found and found[0] != "rle":
            units += [(f"item {k} {name}", a, b) for name, a, b in _marker_units(data[:end], found[1])]
    return units


def _dicom_fields(data: bytes):
    fields = [(f"{name}.{'length' if name == 'PixelData' else 'value'}", value, size, "little")
              for name, _, value, size in _dicom_elements(data)]
    for k, (item, start, end) in enumerate(_dicom_fragments(data)):
        fields.append((f"pixel item {k}.length", item + 4, 4, "little"))
        found = _codestream_start(data, start, end)
        if found is None:
            continue
        kind, at = found
        if kind == "rle":
            fields += [(f"item {k} RLE.segments", at, 4, "little"), (f"item {k} RLE.offset[0]", at + 4, 4, "little"),
                       (f"item {k} RLE.offset[1]", at + 8, 4, "little")]
        else:
            fields += [(f"item {k} {name}", a, size, order)
                       for name, a, size, order in _marker_fields(data[:end], at)]
    return fields


# NIfTI-1's 348-byte header (little-endian as nibabel writes it): the fields a reader sizes and
# places the voxels by; then the 4-byte extension flag and the voxels from vox_offset.
_NIFTI_FIELDS = (("sizeof_hdr", 0, 4), ("dim[0]", 40, 2), ("dim[1]", 42, 2), ("dim[2]", 44, 2), ("dim[3]", 46, 2),
                 ("dim[4]", 48, 2), ("datatype", 70, 2), ("bitpix", 72, 2), ("pixdim[1]", 80, 4),
                 ("pixdim[3]", 88, 4), ("vox_offset", 108, 4), ("scl_slope", 112, 4), ("scl_inter", 116, 4),
                 ("qform_code", 252, 2), ("sform_code", 254, 2), ("srow_x[0]", 280, 4), ("magic", 344, 4),
                 ("extension", 348, 1))
# NIfTI-2's 540-byte header (nibabel's Nifti2Header): the same fields, 64-bit sizes and offsets,
# double-precision spacings, scalings and affines, its magic at byte 4.
_NIFTI2_FIELDS = (("sizeof_hdr", 0, 4), ("magic", 4, 4), ("datatype", 12, 2), ("bitpix", 14, 2), ("dim[0]", 16, 8),
                  ("dim[1]", 24, 8), ("dim[2]", 32, 8), ("dim[3]", 40, 8), ("dim[4]", 48, 8), ("pixdim[1]", 112, 8),
                  ("pixdim[3]", 128, 8), ("vox_offset", 168, 8), ("scl_slope", 176, 8), ("scl_inter", 184, 8),
                  ("qform_code", 344, 4), ("sform_code", 348, 4), ("quatern_b", 352, 8), ("qoffset_x", 376, 8),
                  ("srow_x[0]", 400, 8), ("srow_y[1]", 440, 8), ("srow_z[3]", 488, 8), ("extension", 540, 1))


def _nifti_header_size(data: bytes) -> int:
    """348 (NIfTI-1) or 540 (NIfTI-2), from sizeof_hdr as nibabel writes it (little-endian)."""
    return 540 if data[:4] == struct.pack("<i", 540) else 348


def _nifti_units(data: bytes):
    size = _nifti_header_size(data)
    if len(data) < size + 4:
        return []
    return [("header", 0, size), ("extension flag", size, size + 4),
            ("first voxels", size + 4, min(len(data), size + 4 + 64))]


def _nifti_fields(data: bytes):
    table = _NIFTI2_FIELDS if _nifti_header_size(data) == 540 else _NIFTI_FIELDS
    return [(f"header.{name}", at, size, "little") for name, at, size in table if at + size <= len(data)]


_UNITS = {"jpeg": _jpeg_units, "png": _png_units, "tiff": _tiff_units, "dicom": _dicom_units, "nifti": _nifti_units}
_FIELDS = {"jpeg": _jpeg_fields, "png": _png_fields, "tiff": _tiff_fields, "dicom": _dicom_fields,
           "nifti": _nifti_fields}
