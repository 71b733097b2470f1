"""JPEG 2000 scenes read a tile at a time, and their georeferencing (GeoJP2, GMLJP2), as GDAL reads them.

A Sentinel-2 band is one JP2 file of 10980 x 10980 samples (240 MB decoded
for a 10 m uint16 band), its codestream cut into tiles (GDAL's JP2OpenJPEG
driver writes 1024 x 1024 tiles by default). This module reads such a file a
few KB at a time (issue 25's scene path, for JPEG 2000):

- `read_structure` walks the file's top-level boxes (seeking past the
  codestream), then the codestream's main header (its SIZ marker: size,
  tiles, components) and the header of every tile-part (12 bytes each), so
  that each tile's bytes are known without reading them;
- `Jp2SceneReader` reads windows as `imaging.patches.SceneReader` reads a
  TIFF's: only the tiles a window overlaps are read and decoded, those of the
  current row of tiles kept, so a row of patches decodes each tile once. A
  tile is decoded on its own by OpenJPEG (imagecodecs) as a one-tile
  codestream: the main header with its image area narrowed to the tile (its
  tile grid moved onto the tile, so the tile keeps its reference-grid
  coordinates: code-blocks and precincts are the same) followed by the
  tile's own tile-parts. A codestream of one tile, or with packed packet
  headers in its main header (PPM: they belong to every tile), or whose
  tile grid does not start at the image's corner (XTOsiz, YTOsiz other than
  XOsiz, YOsiz; GDAL writes all four 0), is decoded whole,
  once per work item;
- `georef` is what GDAL reports by default (GEOREF_SOURCES
  PAM,INTERNAL,WORLDFILE; internal: GeoJP2 first, then GMLJP2): the GeoTIFF
  of a GeoJP2 box (`imaging.georef`), else the GMLJP2 coverage (`gmljp2_georef`).
  PAM (.aux.xml) and world files are sidecars, not read here.

GMLJP2 (an `asoc` box labelled 'gml.data' holding the 'gml.root-instance'
XML box: a FeatureCollection with a gml:RectifiedGrid, what Sentinel-2's
L1C/L2A tiles carry) gives the grid's origin, which is the centre of the
first pixel, and two offset vectors; the geotransform's origin is the corner,
half a pixel back along both vectors. The CRS comes from the origin Point's
srsName (else the FeatureCollection's envelope's, else the grid's):
'EPSG:n' as written; 'urn:ogc:def:crs:EPSG::n' and
'http://www.opengis.net/def/crs/EPSG/0/n' in the EPSG axis order, so that a
geographic CRS's coordinates (EPSG:4326) are latitude first, and are swapped
to GDAL's x (longitude), y (latitude) order, unless the grid's axisNames say
easting/longitude first. Without a CRS database, the codes taken to be
latitude or northing first are the geographic ones (4000-4999) and the
projected ones of `_NORTHING_FIRST` (ETRS89-LAEA and -LCC Europe, the ETRS89
TM zones, Gauss-Krueger zones of Germany, Poland, Sweden, Finland, Norway,
Pulkovo; each checked against GDAL's reading in the tests): another
projected CRS whose EPSG order is northing first is read easting first,
where GDAL would swap it.

Framework-free (numpy, imagecodecs).
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import struct
import xml.etree.ElementTree as ElementTree
from typing import Any, BinaryIO

import numpy as np

from imaging import georef as _georef
from imaging._windows import check_window, outside, padding_fill
from imaging.errors import ImageRejected

__all__ = ["Jp2Structure", "Jp2SceneReader", "decode", "is_jpeg2000", "read_structure", "georef", "gmljp2_georef"]

JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
J2K_SIGNATURE = b"\xff\x4f\xff\x51"  # SOC, then SIZ.
_GEOJP2_UUID = bytes.fromhex("b14bf8bd083d4b43a5ae8cd7d5a6ce03")
_SOT, _EOC, _TLM, _PLM, _PPM, _SIZ = 0xFF90, 0xFFD9, 0xFF55, 0xFF57, 0xFF60, 0xFF51
_MAX_TILES = 65535  # Isot, a tile's index, is 16 bits.
# Georeferencing boxes larger than this are no georeferencing (a GeoJP2 is a few hundred
# bytes, a GMLJP2 coverage a few KB): they are not read.
_MAX_GEO_BOX = 4 << 20
_EPSG_CODE = re.compile(r"^(?:urn:ogc:def:crs:EPSG:[^:]*:|http://www\.opengis\.net/def/crs/EPSG/[^/]*/)(\d+)$",
                        re.IGNORECASE)
_PLAIN_EPSG = re.compile(r"^EPSG:(\d+)$", re.IGNORECASE)
# Projected CRSs whose EPSG axis order is northing, easting (GMLJP2 writes their coordinates so).
_NORTHING_FIRST = frozenset((
    3034, 3035, *range(3038, 3052),  # ETRS89: LCC and LAEA Europe, TM zones 26-39.
    *range(31466, 31470),  # DHDN / 3-degree Gauss-Krueger zones 2-5.
    2180, *range(2176, 2180),  # Poland CS92, CS2000 zones.
    *range(3006, 3019),  # SWEREF99 TM and its local zones.
    *range(3126, 3141),  # ETRS89 / ETRS-GK19FIN to GK31FIN, and the rest of that range.
    *range(5105, 5131),  # ETRS89 / NTM zones 5-30 (Norway).
    3844,  # Pulkovo 1942(58) / Stereo70.
    *range(28404, 28433), 3333, 3833,  # Pulkovo 1942 / Gauss-Krueger zones 4-32; 1942(58) zones 2, 3.
))


def is_jpeg2000(head: bytes) -> bool:
    """Whether a file's first bytes are a JP2 file's or a bare J2K codestream's."""
    return head.startswith(JP2_SIGNATURE) or head.startswith(J2K_SIGNATURE)


@dataclasses.dataclass(frozen=True)
class Jp2Structure:
    """What a JPEG 2000 file's headers say (`read_structure`); no sample is decoded.

    Attributes:
      height, width: The image's size.
      components: Its components (bands).
      bits: Bits per component; signed: whether any component is signed.
      subsampled: 'DXxDY' of each component when any is subsampled, else ().
      tile_shape: (rows, columns) of one tile (the last row and column of
        tiles may be smaller).
      tiles: (down, across) tiles.
      parts: For each tile (row-major), its tile-parts' (offset, length) in the file.
      main_header: The codestream's main header (SOC to the first SOT), without
        TLM and PLM markers (they index every tile).
      siz: The SIZ marker's fields (Rsiz, Xsiz, Ysiz, XOsiz, YOsiz, XTsiz,
        YTsiz, XTOsiz, YTOsiz); siz_at: where SIZ's Xsiz lies in `main_header`.
      whole: True when the codestream is decoded whole: one tile; packet headers
        of every tile in the main header (PPM); or a tile grid that does not
        start at the image's corner (its first tiles narrower than the rest).
      codestream: (offset, length) of the codestream in the file.
      geo_boxes: (kind, contents) of the boxes that may hold georeferencing:
        GeoJP2 'uuid' boxes (their GeoTIFF, UUID removed) and 'asoc' boxes.
    """

    height: int
    width: int
    components: int
    bits: tuple[int, ...]
    signed: bool
    subsampled: tuple[str, ...]
    tile_shape: tuple[int, int]
    tiles: tuple[int, int]
    parts: tuple[tuple[tuple[int, int], ...], ...]
    main_header: bytes
    siz: tuple[int, ...]
    siz_at: int
    whole: bool
    codestream: tuple[int, int]
    geo_boxes: tuple[tuple[bytes, bytes], ...]

    @property
    def dtype(self) -> np.dtype:
        """The samples' type as OpenJPEG decodes them: 8, 16 or 32 bits, signed or not."""
        bits = max(self.bits)
        size = 8 if bits <= 8 else 16 if bits <= 16 else 32
        return np.dtype(f"{'int' if self.signed else 'uint'}{size}")


def read_structure(handle: BinaryIO, name: str) -> Jp2Structure:
    """The boxes, main header and tile-parts of a JP2 file or J2K codestream open in `handle`.

    Reads headers only: each top-level box's header, the small georeferencing
    boxes, the codestream's main header and each tile-part's SOT marker.

    Raises:
      ImageRejected: 'corrupt' for a damaged or truncated header (a box or a
        tile-part past the end of the file, no codestream, a SIZ marker that
        does not parse, a tile index out of range).
    """
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(0)
    head = handle.read(12)
    geo: list[tuple[bytes, bytes]] = []
    if head.startswith(JP2_SIGNATURE):
        stream = None
        pos = 0
        while pos + 8 <= size:
            handle.seek(pos)
            length, kind = struct.unpack(">I4s", _exactly(handle, 8, name))
            header = 8
            if length == 1:
                length, header = struct.unpack(">Q", _exactly(handle, 8, name))[0], 16
            elif length == 0:
                length = size - pos
            if length < header or pos + length > size:
                if kind == b"jp2c" and length >= header:
                    raise ImageRejected("corrupt", f"{name}: its codestream box ends past the end of the "
                                                   f"file ({pos + length} > {size} bytes: truncated)")
                break
            body = (pos + header, length - header)
            if kind == b"jp2c" and stream is None:
                stream = body
            elif kind in (b"uuid", b"asoc") and body[1] <= _MAX_GEO_BOX:
                handle.seek(body[0])
                if kind == b"asoc":
                    geo.append((kind, _exactly(handle, body[1], name)))
                elif body[1] >= 16 and _exactly(handle, 16, name) == _GEOJP2_UUID:  # Not XMP's, nor others.
                    geo.append((kind, _exactly(handle, body[1] - 16, name)))
            pos += length
        if stream is None:
            raise ImageRejected("corrupt", f"{name}: a JP2 file without a codestream box (truncated or damaged)")
    elif head.startswith(J2K_SIGNATURE):
        stream = (0, size)
    else:
        raise ImageRejected("corrupt", f"{name}: not a JPEG 2000 file (no JP2 signature, no SOC marker)")
    return _codestream_structure(handle, stream, tuple(geo), name)


def _exactly(handle: BinaryIO, count: int, name: str) -> bytes:
    data = handle.read(count)
    if len(data) != count:
        raise ImageRejected("corrupt", f"{name}: read {len(data)} of {count} bytes of a JPEG 2000 header "
                                       "(truncated)")
    return data


def _codestream_structure(handle: BinaryIO, stream: tuple[int, int], geo, name: str) -> Jp2Structure:
    """The main header's SIZ and the tile-parts' places, from the codestream at `stream`."""
    start, length = stream
    end = start + length
    handle.seek(start)
    if _exactly(handle, 2, name) != b"\xff\x4f":
        raise ImageRejected("corrupt", f"{name}: its codestream does not start with an SOC marker")
    kept = [b"\xff\x4f"]
    siz = None
    siz_at = 0
    packed = False
    pos = start + 2
    while True:  # The main header's marker segments, up to the first SOT.
        if pos + 4 > end:
            raise ImageRejected("corrupt", f"{name}: its codestream ends within its JPEG 2000 header (truncated)")
        handle.seek(pos)
        marker, seg = struct.unpack(">HH", _exactly(handle, 4, name))
        if marker == _SOT:
            break
        if marker >> 8 != 0xFF or seg < 2 or pos + 2 + seg > end:
            raise ImageRejected("corrupt", f"{name}: damaged JPEG 2000 header (main header marker {marker:04X} of "
                                           f"{seg} bytes at {pos - start})")
        body = _exactly(handle, seg - 2, name)
        if marker == _SIZ:
            siz_at = sum(map(len, kept)) + 6  # After the marker, Lsiz and Rsiz.
            siz = body
        packed |= marker == _PPM
        if marker not in (_TLM, _PLM):
            kept.append(struct.pack(">HH", marker, seg) + body)
        pos += 2 + seg
    if siz is None:
        raise ImageRejected("corrupt", f"{name}: a JPEG 2000 main header without a SIZ marker")
    try:
        fields = struct.unpack(">HIIIIIIIIH", siz[:36])
        count = fields[-1]
        if count < 1 or len(siz) != 36 + 3 * count:
            raise ValueError(f"a SIZ marker of {len(siz) + 2} bytes for {count} components")
        comps = [struct.unpack("BBB", siz[36 + 3 * k:39 + 3 * k]) for k in range(count)]
    except (ValueError, struct.error) as e:
        raise ImageRejected("corrupt", f"{name}: damaged JPEG 2000 header ({e})") from None
    _rsiz, xsiz, ysiz, xo, yo, xt, yt, xto, yto, _ = fields
    width, height = xsiz - xo, ysiz - yo
    if width <= 0 or height <= 0 or xt < 1 or yt < 1 or xto > xo or yto > yo or xto + xt <= xo or yto + yt <= yo:
        raise ImageRejected("corrupt", f"{name}: its JPEG 2000 header gives an empty or inconsistent grid "
                                       f"(image {xo},{yo}-{xsiz},{ysiz}, tiles {xt}x{yt} from {xto},{yto})")
    across, down = -(-(xsiz - xto) // xt), -(-(ysiz - yto) // yt)
    if across * down > _MAX_TILES:
        raise ImageRejected("corrupt", f"{name}: its JPEG 2000 header gives {across}x{down} tiles, more than a "
                                       f"codestream numbers ({_MAX_TILES})")
    tiles: list[list[tuple[int, int]]] = [[] for _ in range(across * down)]
    while pos + 2 <= end:  # The tile-parts: 12 bytes of SOT each, then skipped.
        handle.seek(pos)
        marker = struct.unpack(">H", _exactly(handle, 2, name))[0]
        if marker == _EOC:
            break
        if marker != _SOT or pos + 12 > end:
            raise ImageRejected("corrupt", f"{name}: damaged JPEG 2000 tile-part header at {pos - start} "
                                           f"(marker {marker:04X})")
        _lsot, index, part_length, _tp, _tn = struct.unpack(">HHIBB", _exactly(handle, 10, name))
        if part_length == 0:  # The last tile-part: to the EOC marker.
            part_length = end - pos - 2
        if index >= len(tiles) or part_length < 14 or pos + part_length > end:
            raise ImageRejected("corrupt", f"{name}: a JPEG 2000 tile-part of tile {index} ({part_length} "
                                           f"bytes at {pos - start}) out of its {len(tiles)} tiles or past "
                                           "the codestream's end (truncated)")
        tiles[index].append((pos, part_length))
        pos += part_length
    signed = any(s & 0x80 for s, _, _ in comps)
    bits = tuple((s & 0x7F) + 1 for s, _, _ in comps)
    subsampled = (tuple(f"{dx}x{dy}" for _, dx, dy in comps)
                  if any((dx, dy) != (1, 1) for _, dx, dy in comps) else ())
    return Jp2Structure(height, width, count, bits, signed, subsampled, (yt, xt), (down, across),
                        tuple(tuple(p) for p in tiles), b"".join(kept), fields[:9], siz_at,
                        packed or across * down == 1 or (xo, yo) != (xto, yto), stream, geo)


def georef(structure: Jp2Structure, name: str) -> _georef.Georef:
    """The image's georeferencing as GDAL reads it: GeoJP2 first, then GMLJP2; EPSG 0 and None without.

    Raises:
      ImageRejected: 'corrupt' for a GeoJP2 box whose GeoTIFF tags are malformed.
    """
    height, width = structure.height, structure.width
    # GDAL weighs the first two GeoJP2 boxes (some writers add a second, wrong or empty one).
    for contents in [c for kind, c in structure.geo_boxes if kind == b"uuid"][:2]:
        pages = _georef.read_georef(contents, name)
        if pages and (pages[0].geotransform is not None or pages[0].epsg):
            return _georef.Georef(pages[0].epsg, pages[0].geotransform, height, width)
    for kind, contents in structure.geo_boxes:
        if kind == b"asoc":
            xml = _gml_root_instance(contents)
            if xml is not None:
                found = gmljp2_georef(xml, height, width)
                if found is not None:
                    return found
    return _georef.Georef(0, None, height, width)


def _children(data: bytes):
    """(type, contents) of the boxes in `data` (an 'asoc' box's contents), up to a damaged one."""
    pos = 0
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        header = 8
        if length == 1:
            if pos + 16 > len(data):
                return
            length, header = struct.unpack(">Q", data[pos + 8:pos + 16])[0], 16
        elif length == 0:
            length = len(data) - pos
        if length < header or pos + length > len(data):
            return
        yield kind, data[pos + header:pos + length]
        pos += length


def _gml_root_instance(asoc: bytes) -> bytes | None:
    """The XML labelled 'gml.root-instance' in an 'asoc' box labelled 'gml.data', or None."""
    boxes = list(_children(asoc))
    if not boxes or boxes[0][0] != b"lbl " or boxes[0][1].rstrip(b"\0").strip().lower() != b"gml.data":
        return None
    for kind, contents in boxes[1:]:
        if kind != b"asoc":
            continue
        label, xml = None, None
        for sub_kind, sub in _children(contents):
            if sub_kind == b"lbl ":
                label = sub.rstrip(b"\0").strip()
            elif sub_kind == b"xml ":
                xml = sub
        if label == b"gml.root-instance" and xml is not None:
            return xml
    return None


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(element, local: str):
    return next((c for c in element if _local(c.tag) == local), None)


def _attribute(element, local: str) -> str | None:
    if element is None:
        return None
    return next((v for k, v in element.attrib.items() if _local(k) == local), None)


def gmljp2_georef(xml: bytes, height: int, width: int) -> _georef.Georef | None:
    """The georeferencing of a GMLJP2 coverage (its first gml:RectifiedGrid), as GDAL reads it; None without one.

    See the module's docstring: origin at the first pixel's centre, CRS from
    the srsName, EPSG axis order for URN and URL CRS names. A grid whose CRS
    name is none of those forms gives EPSG 0 with its geotransform.
    """
    text = xml.rstrip(b"\0").replace(b"\0", b"\n")  # Some writers pad or split lines with NULs.
    try:
        root = ElementTree.fromstring(text)
    except (ElementTree.ParseError, ValueError):  # Not XML, or an encoding expat does not read.
        return None
    grid = next((e for e in root.iter() if _local(e.tag) == "RectifiedGrid"), None)
    if grid is None:
        return None
    origin = _child(grid, "origin")
    point = None if origin is None else _child(origin, "Point")
    elements = list(grid)
    first = next((k for k, e in enumerate(elements) if _local(e.tag) == "offsetVector"), None)
    if point is None or first is None or first + 1 >= len(elements) or \
            _local(elements[first + 1].tag) != "offsetVector":
        return None
    try:
        v1 = [float(t) for t in re.split(r"[ ,]+", (elements[first].text or "").strip())]
        v2 = [float(t) for t in re.split(r"[ ,]+", (elements[first + 1].text or "").strip())]
        position = _point(point)
    except ValueError:
        return None
    if len(v1) < 2 or len(v2) < 2 or position is None:
        return None
    gt = [position[0], v1[0], v2[0], position[1], v1[1], v2[1]]
    # The origin is the first pixel's centre: the corner is half a pixel back along both vectors.
    gt[0] -= gt[1] * 0.5
    gt[0] -= gt[2] * 0.5
    gt[3] -= gt[4] * 0.5
    gt[3] -= gt[5] * 0.5
    srs = _attribute(point, "srsName")
    if srs is None and _local(root.tag) == "FeatureCollection":
        bounded = _child(root, "boundedBy")
        srs = _attribute(None if bounded is None else _child(bounded, "Envelope"), "srsName")
    if srs is None:
        srs = _attribute(grid, "srsName")
    epsg, flip = 0, False
    srs = (srs or "").strip()
    if _PLAIN_EPSG.match(srs):
        epsg = int(_PLAIN_EPSG.match(srs).group(1))
    elif _EPSG_CODE.match(srs):
        epsg = int(_EPSG_CODE.match(srs).group(1))
        # Geographic (latitude first) and northing-first projected CRSs, in EPSG order.
        flip = (4000 <= epsg <= 4999 or epsg in _NORTHING_FIRST) and not _east_first(grid)
    if flip:
        alternate = b"GDAL_JP2K_ALT_OFFSETVECTOR_ORDER=TRUE" in text
        one, two = (5, 4) if alternate else (4, 5)
        gt[0], gt[3] = gt[3], gt[0]
        gt[1], gt[one] = gt[one], gt[1]
        gt[2], gt[two] = gt[two], gt[2]
    return _georef.Georef(epsg, tuple(gt), height, width)


def _point(point) -> tuple[float, float] | None:
    """A gml:Point's (first, second) coordinate: gml:pos, or gml:coordinates 'a,b'."""
    pos = _child(point, "pos")
    if pos is not None:
        values = (pos.text or "").split()
    else:
        coordinates = _child(point, "coordinates")
        if coordinates is None:
            return None
        values = re.split(r"[ ,]+", (coordinates.text or "").strip())
    if len(values) < 2:
        return None
    return float(values[0]), float(values[1])


def _east_first(grid) -> bool:
    """Whether the grid's gml:axisName elements say easting/longitude first, northing/latitude second."""
    names = [(e.text or "").strip().upper() for e in grid if _local(e.tag) == "axisName"]
    return (len(names) >= 2 and names[0].startswith(("EAST", "LONG"))
            and names[1].startswith(("NORTH", "LAT")))


class Jp2SceneReader:
    """Windows of a JPEG 2000 scene, decoding only the tiles each overlaps (`imaging.patches.SceneReader`'s interface).

    The tiles of the current row of tiles are kept: the windows of one row
    of patches, left to right, decode each tile once. Values are OpenJPEG's
    (imagecodecs), as GDAL's JP2OpenJPEG driver reads them. A JPEG 2000 file
    holds no nodata value (GDAL keeps one in its .aux.xml sidecar, which
    `use_nodata` takes): `nodata` is None, pixels past the edge hold 0.

    Not thread-safe: one reader per thread or process.

    Args:
      source: A path, the file's bytes, or a seekable binary file object (not
        closed here).
      name: How errors name the file.

    Raises:
      ImageRejected: As `read_structure`; 'unsupported_dtype' for subsampled
        components (no bands of one grid).
    """

    source_format = "jpeg2000"
    planar = False
    has_mask = False

    def __init__(self, source: Any, name: str | None = None):
        if isinstance(source, (bytes, bytearray, memoryview)):
            self._handle: BinaryIO = io.BytesIO(source)
            self._close = True
            self.name = name or "<bytes>"
        elif isinstance(source, (str, os.PathLike)):
            self._handle = open(source, "rb")
            self._close = True
            self.name = name or os.fspath(source)
        else:
            self._handle, self._close = source, False
            self.name = name or repr(source)
        try:
            self.structure = read_structure(self._handle, self.name)
        except BaseException:
            self.close()
            raise
        s = self.structure
        if s.subsampled:
            self.close()
            raise ImageRejected(
                "unsupported_dtype",
                f"{self.name} has subsampled components (sizes {s.subsampled}): they are not bands of one "
                "grid; save it without subsampling (gdal_translate to GeoTIFF)")
        self.height, self.width, self.bands = s.height, s.width, s.components
        self.dtype = s.dtype
        self.nodata: float | None = None
        self.fill = 0
        self.segment_shape = (s.height, s.width) if s.whole else s.tile_shape
        self.decodes_whole = s.whole
        self._cache: dict[tuple[int, int], np.ndarray] = {}
        self._columns: tuple[int, int] | None = None
        self.decoded_segments = 0
        self.decoded_bytes = 0

    @property
    def georef(self) -> _georef.Georef:
        """The scene's EPSG code and geotransform (`georef`: GeoJP2, else GMLJP2)."""
        return georef(self.structure, self.name)

    def use_nodata(self, nodata) -> None:
        """Takes `nodata` as the scene's nodata value (its .aux.xml's, `imaging.sidecars`: where GDAL keeps a
        JPEG 2000's; per band where it gives bands their own, `imaging.nodata`), padding included
        (`imaging._windows.padding_fill`)."""
        self.nodata = nodata
        self.fill = padding_fill(nodata, self.dtype)

    def masked(self, y: int, x: int, height: int, width: int) -> None:
        """None: a JPEG 2000 file has no internal mask here (`SceneReader.masked`)."""
        return None

    def close(self) -> None:
        """Closes the file (not a file object the caller gave) and drops the decoded tiles."""
        self._cache = {}
        if self._close:
            self._handle.close()

    def __enter__(self) -> Jp2SceneReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def keep_columns(self, left: int, right: int) -> None:
        """From now on, reads only windows within scene columns [left, right) (`SceneReader.keep_columns`).

        Tiles are decoded whole and kept whole (a tile is no wider than what it
        holds); the bound is checked on every read.

        Raises:
          ValueError: For non-integer bounds or right <= left.
        """
        check_window("Jp2SceneReader", 0, left, 1, 1)
        check_window("Jp2SceneReader", 0, right, 1, 1)
        if right <= left:
            raise ValueError(f"Jp2SceneReader.keep_columns: right must exceed left {left}. Received: {right!r}")
        self._columns = (max(int(left), 0), min(int(right), self.width))

    def padded(self, y: int, x: int, height: int, width: int) -> np.ndarray:
        """(height, width) booleans: True where the window at (y, x) lies outside the scene."""
        check_window("Jp2SceneReader", y, x, height, width)
        return outside(y, x, height, width, self.height, self.width)

    def read(self, y: int, x: int, height: int, width: int, *, copy: bool = True) -> np.ndarray:
        """The window of `height` x `width` pixels at row y, column x: (height, width, bands).

        Pixels past the scene hold `fill`. Only the tiles the window overlaps
        are read and decoded; `copy` False gives a read-only view of a
        decoded tile when the window lies inside one.

        Raises:
          ValueError: For a window of no pixels, non-integer coordinates, or
            columns outside those of `keep_columns`.
          ImageRejected: 'corrupt' for a tile that does not decode.
        """
        check_window("Jp2SceneReader", y, x, height, width)
        y, x, height, width = int(y), int(x), int(height), int(width)
        top, bottom = max(y, 0), min(y + height, self.height)
        left, right = max(x, 0), min(x + width, self.width)
        if top >= bottom or left >= right:
            return np.full((height, width, self.bands), self.fill, self.dtype)
        if self._columns is not None and not self._columns[0] <= left < right <= self._columns[1]:
            raise ValueError(f"Jp2SceneReader: the window's scene columns {left}-{right} lie outside the "
                             f"columns kept, {self._columns[0]}-{self._columns[1]} (keep_columns)")
        seg_h, seg_w = self.segment_shape
        first_row, last_row = top // seg_h, (bottom - 1) // seg_h
        first_col, last_col = left // seg_w, (right - 1) // seg_w
        for key in [k for k in self._cache if not first_row <= k[0] <= last_row]:
            del self._cache[key]  # One row of tiles at most.
        inside = (top, bottom, left, right) == (y, y + height, x, x + width)
        if not copy and inside and first_row == last_row and first_col == last_col:
            tile = self._tile(first_row, first_col)
            sy, sx = first_row * seg_h, first_col * seg_w
            view = tile[y - sy:y - sy + height, x - sx:x - sx + width]
            view.flags.writeable = False
            return view
        if inside:
            out = np.empty((height, width, self.bands), self.dtype)  # Every pixel is written below.
        else:
            out = np.full((height, width, self.bands), self.fill, self.dtype)
        for row in range(first_row, last_row + 1):
            for col in range(first_col, last_col + 1):
                tile = self._tile(row, col)
                sy, sx = row * seg_h, col * seg_w
                y0, y1 = max(top, sy), min(bottom, sy + tile.shape[0])
                x0, x1 = max(left, sx), min(right, sx + tile.shape[1])
                out[y0 - y:y1 - y, x0 - x:x1 - x] = tile[y0 - sy:y1 - sy, x0 - sx:x1 - sx]
        return out

    def _tile(self, row: int, col: int) -> np.ndarray:
        """The decoded tile (rows, columns, bands) at (row, col) of the reader's grid (`segment_shape`)."""
        key = (row, col)
        if key not in self._cache:
            s = self.structure
            if s.whole:
                start, length = s.codestream
                data = self._read(start, length)
                shape = (s.height, s.width)
            else:
                data, shape = self._one_tile(row, col)
            array = decode(data, self.name)
            if array.shape != (*shape, self.bands):
                raise ImageRejected("corrupt", f"{self.name}: tile {row},{col} decodes to {array.shape}, not "
                                               f"{shape[0]}x{shape[1]}x{self.bands}")
            array = np.ascontiguousarray(array, self.dtype)
            self.decoded_segments += 1
            self.decoded_bytes += array.nbytes
            self._cache[key] = array
        return self._cache[key]

    def _one_tile(self, row: int, col: int) -> tuple[bytes, tuple[int, int]]:
        """A one-tile codestream of tile (row, col), and the tile's (rows, columns) in the image."""
        s = self.structure
        _rsiz, xsiz, ysiz, xo, yo, xt, yt, xto, yto = s.siz
        # The tile's reference-grid area: the image area narrowed to it, its tile grid moved onto it.
        gx, gy = xto + col * xt, yto + row * yt
        x0, x1 = max(gx, xo), min(gx + xt, xsiz)
        y0, y1 = max(gy, yo), min(gy + yt, ysiz)
        header = bytearray(s.main_header)
        header[s.siz_at:s.siz_at + 32] = struct.pack(">IIIIIIII", x1, y1, x0, y0, xt, yt, gx, gy)
        parts = s.parts[row * s.tiles[1] + col]
        if not parts:
            raise ImageRejected("corrupt", f"{self.name}: tile {row},{col} has no tile-part (truncated)")
        pieces = [bytes(header)]
        for offset, length in parts:
            part = bytearray(self._read(offset, length))
            part[4:6] = b"\x00\x00"  # Isot: the one tile is tile 0.
            pieces.append(bytes(part))
        pieces.append(b"\xff\xd9")
        return b"".join(pieces), (y1 - y0, x1 - x0)

    def _read(self, offset: int, count: int) -> bytes:
        self._handle.seek(offset)
        return _exactly(self._handle, count, self.name)


def decode(data: bytes, name: str) -> np.ndarray:
    """(rows, columns, components) of a JP2 file or codestream, every value as OpenJPEG decodes it.

    Raises:
      ImageRejected: 'corrupt' for data that does not decode.
    """
    import imagecodecs

    try:
        array = imagecodecs.jpeg2k_decode(data, numthreads=1)
    except (imagecodecs.Jpeg2kError, ValueError, RuntimeError) as e:
        raise ImageRejected("corrupt", f"{name}: JPEG 2000 data does not decode ({type(e).__name__}: {e})") from e
    if array.ndim == 2:
        array = array[:, :, np.newaxis]
    return array
