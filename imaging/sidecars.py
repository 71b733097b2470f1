"""GIS sidecars of a raster: world files, `.prj` and GDAL's `.aux.xml`, read as GDAL reads them.

Users of QGIS, ArcGIS and GDAL keep a raster's georeferencing or nodata
value beside it rather than in its tags:

- a **world file** (`scene.tfw`, else `scene.tifw`, else `scene.wld`; each
  name as written, then in the other case, as GDAL looks for them): six
  numbers, the pixel size, the rotation terms and the *centre* of the
  top-left pixel, turned into GDAL's corner-based geotransform;
- an **ESRI projection file** (`scene.prj`, WKT): its CRS's EPSG code, where
  the WKT names one (an `AUTHORITY`/`ID` of the whole CRS, or one of the
  ESRI names of common CRSs). GDAL's GTiff driver does not read it (ArcGIS
  does): it is used only where nothing else gives a CRS;
- GDAL's **PAM file** (`scene.tif.aux.xml`): `<SRS>`, `<GeoTransform>` and
  each band's `<NoDataValue>` (GDAL's nodata is per band: `imaging.nodata`);
- GDAL's **external mask** (`scene.tif.msk`, a TIFF): the raster's mask
  where the file has no internal one, as GDAL takes it; its zeros are no
  data. Its bytes are kept (`Sidecars.mask`) for the reader of the pixels.

Precedence is GDAL's (GTiff's GDAL_GEOREF_SOURCES default,
PAM,INTERNAL,TABFILE,WORLDFILE, checked with GDAL 3.10): the PAM file's
georeferencing and nodata win over the TIFF's own tags, which win over a
world file; the CRS and the geotransform are each taken from the first
source that has one. A sidecar that is malformed is left out with a warning
(`Sidecars.warnings`); the raster is still read. A multi-page TIFF's later
pages, which GDAL opens as `GTIFF_DIR:N:path`, take the world file (and the
`.prj`) only: GDAL applies neither the PAM file nor the external mask to
them (`Sidecars.page_georef`). Framework-free.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import struct
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping

from imaging import nodata as _nodata
from imaging.georef import Georef

__all__ = ["Sidecars", "sidecar_names", "load", "parse", "world_geotransform", "wkt_epsg"]

_log = logging.getLogger(__name__)

# A sidecar larger than this is no sidecar GDAL writes (a PAM file of statistics
# and histograms is a few KB): not read, so a stray large file costs nothing.
_MAX_BYTES = 4 << 20
# An external mask is as large as a 1- or 8-bit band of the raster, compressed.
_MAX_MASK_BYTES = 256 << 20
_AUX = ".aux.xml"
_MSK = ".msk"
_TIFF_MAGIC = (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")
_PRJ = "prj"
_WLD = "wld"
_WARNED: set[tuple[str, str]] = set()


@dataclasses.dataclass(frozen=True)
class Sidecars:
    """What a raster's sidecars say (`parse`), to apply over its own tags.

    Attributes:
      pam_epsg: The PAM file's SRS as an EPSG code (0: an SRS without one);
        None when it gives none.
      pam_geotransform: The PAM file's `<GeoTransform>`; None when none.
      pam_nodata: The PAM file's nodata values, (band number, value) pairs
        sorted by band, for the bands that have one (`<PAMRasterBand band="k">`).
      world: The world file's geotransform (GDAL order, the top-left corner);
        None without a usable world file.
      prj_epsg: The `.prj` file's EPSG code (0: a CRS without one); None
        without a `.prj`.
      used: The names of the sidecars read, in the order read.
      warnings: One sentence per sidecar left out, or part of one.
      mask: The bytes of GDAL's external mask (`scene.tif.msk`, a TIFF);
        None without one.
    """

    pam_epsg: int | None = None
    pam_geotransform: tuple[float, ...] | None = None
    pam_nodata: tuple[tuple[int, float], ...] = ()
    world: tuple[float, ...] | None = None
    prj_epsg: int | None = None
    used: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    mask: bytes | None = dataclasses.field(default=None, repr=False)

    def georef(self, tags: Georef) -> Georef:
        """The georeferencing GDAL reports for the raster whose tags give `tags` (its first page).

        CRS: the PAM file's, else the tags', else the `.prj`'s. Geotransform:
        the PAM file's, else the tags', else the world file's.
        """
        epsg = tags.epsg
        if self.pam_epsg is not None:
            epsg = self.pam_epsg
        elif not epsg and self.prj_epsg is not None:
            epsg = self.prj_epsg
        geotransform = self.pam_geotransform or tags.geotransform or self.world
        return dataclasses.replace(tags, epsg=epsg, geotransform=geotransform)

    def page_georef(self, tags: Georef) -> Georef:
        """The georeferencing GDAL reports for a later page (`GTIFF_DIR:N:path`, N > 1) whose tags give `tags`.

        GDAL opens such a page as a subdataset: the world file applies to it
        as to the first (where its own tags give no geotransform), the PAM
        file does not (neither its top level nor a `<Subdataset>` of the
        page: GDAL 3.10 writes one, and reads it back for no page). The
        `.prj` (not GDAL's: ArcGIS's, the world file's companion) gives the
        CRS where its tags give none, as for the first page.
        """
        epsg = tags.epsg
        if not epsg and self.prj_epsg is not None:
            epsg = self.prj_epsg
        return dataclasses.replace(tags, epsg=epsg, geotransform=tags.geotransform or self.world)

    @property
    def nodata(self) -> float | None:
        """The PAM file's nodata value where every band it lists has the same; else None."""
        found = _nodata.collapse(v for _, v in self.pam_nodata)
        return None if isinstance(found, tuple) else found

    def nodata_over(self, tags: _nodata.Nodata, bands: int) -> _nodata.Nodata:
        """The nodata GDAL reports for the first page (`imaging.nodata`): per band, the PAM file's, else the tags'.

        Args:
          tags: What the file itself gives (its GDAL_NODATA tag: every band's), or None.
          bands: The raster's number of bands.
        """
        if not self.pam_nodata:
            return tags
        values = list(_nodata.per_band(tags, bands))
        for band, value in self.pam_nodata:
            if 1 <= band <= bands:
                values[band - 1] = value
        return _nodata.collapse(values)

    def details(self, first_page: bool = True) -> dict:
        """What a record's details say of them: the sidecars read and the warnings (JSON-safe).

        A later page's (`first_page` False) name only the sidecars it takes
        (`page_georef`): the world file and the `.prj`.
        """
        out: dict = {}
        used = self.used if first_page else [u for u in self.used if not u.lower().endswith((_AUX, _MSK))]
        if used:
            out["sidecars"] = list(used)
        if self.warnings:
            out["sidecar_warnings"] = list(self.warnings)
        return out


def sidecar_names(path: str) -> tuple[str, ...]:
    """The sidecars GDAL looks for beside `path`, in the order it looks (world files by precedence).

    `folder/scene.tif` -> scene.tif.aux.xml, scene.tif.msk, scene.tif.MSK,
    scene.tfw, scene.TFW, scene.tifw, scene.TIFW, scene.wld, scene.WLD,
    scene.prj, scene.PRJ (with the folder).
    """
    stem, dot, ext = path.rpartition(".")
    if not dot or "/" in ext or os.sep in ext:
        return _own_names(path)
    names = list(_own_names(path))
    for world_ext in _world_extensions(ext):
        names += [f"{stem}.{world_ext}", f"{stem}.{_other_case(world_ext)}"]
    names += [f"{stem}.{_PRJ}", f"{stem}.{_PRJ.upper()}"]
    return tuple(dict.fromkeys(names))  # A one-letter extension's two names can be one.


def _own_names(path: str) -> tuple[str, ...]:
    """The sidecars named after the raster's whole name: its PAM file and its external mask."""
    return (path + _AUX, path + _MSK, path + _MSK.upper())


def _world_extensions(ext: str) -> tuple[str, ...]:
    """GDAL's world file extensions of a raster's: first and last letter + 'w', then ext + 'w', then 'wld'."""
    if len(ext) < 2:
        return (_WLD,)
    w = "W" if ext.isupper() else "w"
    return (ext[0] + ext[-1] + w, ext + w, _WLD)


def _other_case(ext: str) -> str:
    return ext.upper() if ext == ext.lower() else ext.lower()


def load(path: str, name: str, georef: bool = True,
         read: Callable[[str], bytes | None] | None = None) -> Sidecars | None:
    """The sidecars of the raster at `path` (`parse`); None when it has none.

    Args:
      path: Where the raster is (its sidecars are looked for beside it).
      name: Its relative path, for warnings.
      georef: Whether georeferencing is wanted (--raster_georef): else only
        the PAM file (its nodata value) and the external mask are looked
        for, not world files or `.prj`.
      read: `read(path)` -> the file's bytes, or None when there is no such
        file; default: the local file system.
    """
    read = read or _read_local
    found: dict[str, bytes] = {}
    names = sidecar_names(path) if georef else _own_names(path)
    for candidate in names:
        data = read(candidate)
        if data is not None:
            found[candidate[len(path) - len(os.path.basename(path)):]] = data
    if not found:
        return None
    return parse(name, found)


def _read_local(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            limit = _MAX_MASK_BYTES if path.lower().endswith(_MSK) else _MAX_BYTES
            return f.read(limit + 1)  # Past the limit: `parse` says it is too large.
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as e:  # There, but unreadable (permissions): the raster is read without it.
        _warn_once(path, f"not read as a sidecar ({e.strerror})")
        return None


def parse(name: str, found: Mapping[str, bytes]) -> Sidecars:
    """What the sidecars `found` (file name -> bytes, as `sidecar_names` names them) say.

    Only the first usable world file (in `sidecar_names`' order) is read: a
    malformed one is passed over for the next, as GDAL does.
    """
    used: list[str] = []
    warnings: list[str] = []
    fields: dict = {}
    world_done = prj_done = False
    for file, data in found.items():
        lower = file.lower()
        what = None
        if lower.endswith(_MSK):
            if "mask" in fields:
                continue
            if len(data) > _MAX_MASK_BYTES or data[:4] not in _TIFF_MAGIC:
                warnings.append(f"{file}: {'larger than 256 MiB' if data[:4] in _TIFF_MAGIC else 'no TIFF'}, "
                                "not read as GDAL's external mask")
            else:
                fields["mask"] = bytes(data)
                used.append(file)
            continue
        if lower.endswith(_AUX):
            what = "PAM file"
        elif lower.endswith("." + _PRJ):
            if prj_done:
                continue
            prj_done, what = True, "projection file"
        elif not world_done:
            what = "world file"
        if what is None:
            continue
        if not data or len(data) > _MAX_BYTES:
            warnings.append(f"{file}: {'empty' if not data else 'larger than 4 MiB'}, not read as a {what}")
            continue
        try:
            if what == "PAM file":
                pam, problems = _pam(data)
                fields.update(pam)
                warnings += [f"{file}: {p}" for p in problems]
            elif what == "projection file":
                fields["prj_epsg"] = wkt_epsg(_text(data))
            else:
                fields["world"] = world_geotransform(_text(data))
                world_done = True
            used.append(file)
        except ValueError as e:
            warnings.append(f"{file}: not read as a {what} ({e})")
    for warning in warnings:
        _warn_once(name, warning)
    return Sidecars(used=tuple(used), warnings=tuple(warnings), **fields)


def _warn_once(name: str, warning: str) -> None:
    """Logs a sidecar's warning once per process: a scene's work items each read its sidecars."""
    key = (name, warning)
    if key not in _WARNED:
        _WARNED.add(key)
        _log.warning("%s: %s (the raster is read without it)", name, warning)


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")  # ESRI files from Windows tools: any 8-bit text.


def _number(text: str) -> float:
    """A decimal number as GDAL's CPLAtofM reads it: a comma may be the decimal point ('10,5')."""
    text = text.strip()
    if "," in text and "." not in text and text.count(",") == 1:
        text = text.replace(",", ".")
    value = float(text)  # ValueError names the text.
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def world_geotransform(text: str) -> tuple[float, ...]:
    """GDAL's geotransform (x0, dx, rx, y0, ry, dy) of a world file's text.

    A world file holds six numbers, one a line (blank lines skipped, lines
    after the sixth ignored, as GDAL does): A (pixel width), D and B (the
    rotation terms), E (pixel height, negative north up), C and F (the
    *centre* of the top-left pixel). The geotransform refers to its corner:
    half a pixel up and left.

    Raises:
      ValueError: Fewer than six numbers, a line that is no number, or a
        zero pixel size (GDAL ignores such a file too; it reads a line that
        is no number as 0, which is taken here as a mistake to report).
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 6:
        raise ValueError(f"{len(lines)} non-empty lines, not the 6 numbers of a world file")
    a, d, b, e, c, f = (_number(line) for line in lines[:6])
    if (a == 0 and b == 0) or (e == 0 and d == 0):
        raise ValueError(f"a pixel of size zero ({a}, {d}, {b}, {e})")
    # x = a*col + b*row + c at the centre of pixel (0, 0); its corner is at col = row = -0.5.
    return (c - 0.5 * a - 0.5 * b, a, b, f - 0.5 * d - 0.5 * e, d, e)


def _utm(north: int, south: int = 0) -> Callable[[re.Match], int]:
    """The EPSG code of a UTM zone's name ('..._Zone_33N'): `north` or `south` + zone; 0 past zone 60."""
    def code(m: re.Match) -> int:
        zone = int(m.group(1))
        base = north if m.group(2) == "N" else south
        return base + zone if base and 1 <= zone <= 60 else 0
    return code


# The ESRI names of common CRSs (what ArcGIS writes in a .prj, without an AUTHORITY):
# name pattern -> EPSG code (a function of the UTM zone where the name has one).
_ESRI_NAMES: tuple[tuple[re.Pattern, Callable[[re.Match], int]], ...] = (
    (re.compile(r"GCS_WGS_1984"), lambda m: 4326),
    (re.compile(r"WGS_1984_Web_Mercator(_Auxiliary_Sphere)?"), lambda m: 3857),
    (re.compile(r"WGS_1984_UTM_Zone_(\d{1,2})([NS])"), _utm(32600, 32700)),
    (re.compile(r"ETRS_1989_UTM_Zone_(\d{1,2})(N)"), _utm(25800)),
    (re.compile(r"NAD_1983_UTM_Zone_(\d{1,2})(N)"), _utm(26900)),
    (re.compile(r"GCS_ETRS_1989"), lambda m: 4258),
    (re.compile(r"GCS_North_American_1983"), lambda m: 4269),
)
_WKT_NODE = re.compile(r"\s*([A-Za-z][A-Za-z0-9_]*)\s*[\[(]")


def wkt_epsg(wkt: str) -> int:
    """The EPSG code of a CRS in WKT (1 or 2, OGC or ESRI flavour), or an 'EPSG:n' string; 0 when it names none.

    The code of the whole CRS: an `AUTHORITY["EPSG",...]` or `ID["EPSG",...]`
    directly in its outer node (those of its datum, unit, ... say nothing
    of it); else the ESRI name of a common CRS (`_ESRI_NAMES`), which is how
    ArcGIS writes a `.prj`.

    Raises:
      ValueError: For text that is no WKT (no outer `NAME[...]` node).
    """
    text = wkt.strip()
    code = re.fullmatch(r"(?i)EPSG:(\d+)", text)
    if code:
        return int(code.group(1))
    head = _WKT_NODE.match(text)
    if head is None or text[-1] not in "])":
        raise ValueError(f"no WKT: {text[:40]!r}")
    # The outer node's children, at depth 1: find their AUTHORITY/ID with the text itself.
    for found in re.finditer(r'(AUTHORITY|ID)\s*[\[(]\s*"EPSG"\s*,\s*"?(\d+)"?\s*[\])]', text):
        if _depth(text, found.start()) == 1:
            return int(found.group(2))
    name = re.match(r'\s*"([^"]*)"', text[head.end():])
    if name:
        for pattern, code_of in _ESRI_NAMES:
            match = pattern.fullmatch(name.group(1))
            if match:
                return code_of(match)
    return 0


def _depth(text: str, position: int) -> int:
    """How many brackets are open at `position` of `text` (quoted text left out)."""
    depth, quoted = 0, False
    for ch in text[:position]:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "[(":
            depth += 1
        elif not quoted and ch in "])":
            depth -= 1
    return depth


def _pam(data: bytes) -> tuple[dict, list[str]]:
    """The fields of `Sidecars` a PAM file (`.aux.xml`) gives, and what of it is left out.

    Raises:
      ValueError: For XML that does not parse, or is no `<PAMDataset>`.
    """
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as e:
        raise ValueError(f"XML that does not parse: {e}") from None
    if root.tag != "PAMDataset":
        raise ValueError(f"its root element is <{root.tag}>, not <PAMDataset>")
    fields: dict = {}
    problems = []
    srs = root.find("SRS")
    if srs is not None and (srs.text or "").strip():
        try:
            fields["pam_epsg"] = wkt_epsg(srs.text)
        except ValueError as e:
            problems.append(f"its <SRS> is left out: {e}")
    transform = root.find("GeoTransform")
    if transform is not None and (transform.text or "").strip():
        try:
            values = tuple(_number(v) for v in transform.text.split(","))
            if len(values) != 6:
                raise ValueError(f"{len(values)} numbers, not 6")
            fields["pam_geotransform"] = values
        except ValueError as e:
            problems.append(f"its <GeoTransform> is left out: {e}")
    values = {}
    for band in root.findall("PAMRasterBand"):
        element = band.find("NoDataValue")
        if element is None:
            continue
        try:
            number = int(band.get("band", "1"))
            if number < 1:
                raise ValueError(f"band {number} is no band number")
            values[number] = _nodata_value(element)
        except (ValueError, struct.error) as e:
            problems.append(f"the <NoDataValue> of band {band.get('band')} is left out: {e}")
    if values:
        fields["pam_nodata"] = tuple(sorted(values.items()))
    return fields, problems


def _nodata_value(element) -> float:
    """A `<NoDataValue>`: its exact double (`le_hex_equiv`, as GDAL writes for NaN payloads), else its text."""
    hex_value = element.get("le_hex_equiv")
    if hex_value:
        return struct.unpack("<d", bytes.fromhex(hex_value)[:8].ljust(8, b"\0"))[0]
    text = (element.text or "").strip()
    if text.lower() in ("nan", "-nan"):
        return math.nan
    if text.lower() in ("inf", "-inf", "infinity", "-infinity"):
        return float(text)
    return _number(text)
