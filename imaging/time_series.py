"""Satellite time series: the dated passes over one location as one stack (time, height, width, bands).

A **location** is every folder that directly holds rasters (TIFF or JPEG 2000 files).
Its files are grouped by date into one stack, dates ascending (issue 37):

- **A file's date** comes from its name, else from its TIFF DateTime tag
  (306, 'YYYY:MM:DD HH:MM:SS', what GDAL writes for TIFFTAG_DATETIME). In a
  name, the first date found, scanning left to right, of the forms
  `YYYY-MM-DD` and `YYYYMMDD` (8 digits with no digit on either side, or
  followed by `T` and a time): `2020-05-14.tif`; the sensing date of a
  Sentinel-2 product, `S2B_MSIL2A_20200514T103629_N0214_R008_T31TFJ_20200514T124004`,
  and the acquisition date of a Landsat Collection 2 product,
  `LC08_L2SP_198030_20200514_20200820_02_T1_SR_B4`, both the first date of
  the name (the later ones are processing dates). A file with neither is
  rejected `no_date`.
- **Bands.** Files of one date that end (before the extension) in a band
  suffix are the bands of that date: `_B02`, `_B4`, `_B8A`, `.B11`, and
  Landsat's `_SR_B4`, `_ST_B10` (named `SR_B4`, `ST_B10`). Band names are
  ordered by `TimeSeriesOptions.bands` (--bands B02,B03,B04,B08; bands not
  named there are left out), else in natural order: letters as text, digit
  runs as numbers (B1 < B2 < B8 < B8A < B9 < B10 < B11, SR_B1 < ST_B10). A
  file without a band suffix holds every band of its date, named '1', '2',
  ... as GDAL numbers them (--bands 4,3,2 then picks and orders them).
- **Alignment is checked**, never assumed: every file of every date must
  share the CRS (EPSG code), geotransform (to a millionth of a pixel),
  width, height, dtype, band count and nodata value with the stack: those
  of the date most dates agree with, the earliest on a tie. A date that
  does not is left out of the stack (its files rejected `misaligned`, with
  what differs); a date without every band is left out (`missing_band`);
  two files for one date and band leave that date out (`conflicting_dates`);
  band files of one date in several dtypes reject the location
  (`mixed_dtypes`). Nothing is resampled: that is the user's decision.
- **Reading** uses `imaging.patches.open_scene`: `SceneReader` for TIFFs
  (tifffile, imagecodecs), `imaging.jp2.Jp2SceneReader` for JPEG 2000 (its
  tiles, OpenJPEG; georeferencing from GeoJP2 or GMLJP2, no nodata value):
  one window of each file at a time, decoding only the strips or tiles it
  overlaps, so a location cut into patches (`read_patches`) holds one
  work item's patches of every date, never the whole stack.
- **Masks** count as nodata, as a single scene's do: each file's GDAL mask
  (its internal one, else its `.msk`) marks its samples as no data in the
  band statistics (`stack_band_stats`) and in a patch's nodata share
  (`read_patches`); the stored samples keep their values.

`plan_location` reads headers only (a few KB per file) and says what each
input file becomes; `read_stack` and `read_patches` read the values.
Framework-free (numpy, tifffile).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import math
import os
import posixpath
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

import schemas
from imaging import nodata as _nodata
from imaging import raster as _raster
from imaging import sidecars as _sidecars
from imaging.errors import ImageRejected
from imaging.patches import PatchOptions, SceneReader, nodata_share, offsets, open_scene, patch_geotransform

__all__ = ["TimeSeriesOptions", "LocationPlan", "DatePlan", "Outcome", "RASTER_EXTENSIONS", "is_raster_name",
           "name_date", "band_of", "natural_key", "plan_location", "read_stack", "read_patches",
           "stack_band_stats", "location_of", "patch_of"]

# Extensions of the files a location is made of (case-insensitive): GeoTIFFs, and
# JPEG 2000 (Sentinel-2's bands as delivered, read tile by tile: `imaging.jp2`).
RASTER_EXTENSIONS = (".tif", ".tiff", ".jp2", ".j2k")
_DATETIME_TAG = 306
# Lossless widening of sample types that records do not hold (as `imaging.raster` widens).
_WIDEN = {"int8": "int16", "float16": "float32", "bool": "uint8"}
# Dates before or after these are digits of something else (an orbit, a tile number).
_FIRST_YEAR, _LAST_YEAR = 1950, 2100
_ISO = r"(?<!\d)(\d{4})-(\d{2})-(\d{2})(?!\d)"
_COMPACT = r"(?<!\d)(\d{4})(\d{2})(\d{2})(?=T\d|(?!\d))"
_DATE_RE = re.compile(f"{_ISO}|{_COMPACT}")
# A band suffix at the end of a file's stem: _B02, _B4, _B8A, .B11, _SR_B4, _ST_B10.
# A band suffix: Sentinel-2's and Landsat's band numbers, and the other layers their
# products hold beside the bands (Landsat Collection 2: QA_PIXEL, QA_RADSAT, SR_QA_AEROSOL,
# the ST_ layers, the angle layers; Sentinel-2 L2A: SCL, AOT, WVP, TCI), each a band of its
# date: as whole-date files they left every date of a Landsat download out
# (conflicting_dates). Sentinel-2 L2A's resolution suffix (`_B02_10m`) is no part of the name.
_BAND_RE = re.compile(r"[._]((?:SR_|ST_)?B\d{1,2}A?|QA_PIXEL|QA_RADSAT|SR_QA_AEROSOL|"
                      r"ST_(?:QA|ATRAN|CDIST|DRAD|EMIS|EMSD|TRAD|URAD)|[SV][AZ]A|SCL|AOT|WVP|TCI)"
                      r"(?:_[126]0M)?$", re.IGNORECASE)
_DIGITS = re.compile(r"(\d+)")


def is_raster_name(name: str) -> bool:
    """Whether a file's name says it is a raster a location is made of."""
    return name.lower().endswith(RASTER_EXTENSIONS)


def location_of(rel_path: str) -> str:
    """The location (folder) of a file's relative path; '' for a file at the input's root."""
    return posixpath.dirname(rel_path)


def name_date(name: str) -> datetime.date | None:
    """The date in a file's name (the first, left to right), or None; see the module's docstring."""
    stem = posixpath.basename(name)
    for match in _DATE_RE.finditer(stem):
        groups = [g for g in match.groups() if g is not None]
        year, month, day = (int(g) for g in groups)
        if not _FIRST_YEAR <= year <= _LAST_YEAR:
            continue
        try:
            return datetime.date(year, month, day)
        except ValueError:
            continue  # 8 digits that are no date (20201399): look further.
    return None


def band_of(name: str) -> str | None:
    """The band a file's name ends in ('B02', 'B8A', 'SR_B4', 'QA_PIXEL', 'SCL', upper case), or None."""
    stem = posixpath.basename(name)
    for ext in RASTER_EXTENSIONS:
        if stem.lower().endswith(ext):
            stem = stem[:-len(ext)]
            break
    match = _BAND_RE.search(stem)
    return match.group(1).upper() if match else None


def natural_key(name: str) -> tuple:
    """Sort key of a band name: text as text, digit runs as numbers (B8 < B8A < B10)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in _DIGITS.split(name) if part != "")


@dataclasses.dataclass(frozen=True)
class TimeSeriesOptions:
    """How a location's files become a stack; validated when built.

    Attributes:
      bands: Band names to keep, in this order (--bands B02,B03,B04,B08;
        for locations of multi-band files, GDAL's band numbers: 4,3,2);
        None keeps every band, in natural order (`natural_key`).
      max_pixels: A stack of more samples (time x height x width x bands)
        is rejected `too_large` unless it is cut into patches (--max_pixels).
      patch: Cut every location into patches, the same window of every date
        (`imaging.patches.PatchOptions`, --raster_patch and its companions);
        None stores each location whole.

    Raises:
      ValueError: Naming the flag, what it allows and what it received.
    """

    bands: tuple[str, ...] | None = None
    max_pixels: int = 178_956_970
    patch: PatchOptions | None = None

    def __post_init__(self):
        if self.bands is not None:
            bands = tuple(self.bands)
            if not bands or any(not isinstance(b, str) or not b.strip() for b in bands):
                raise ValueError(f"--bands must be band names, e.g. B02,B03,B04,B08. Received: {self.bands!r}")
            bands = tuple(b.strip().upper() for b in bands)
            twice = sorted({b for b in bands if bands.count(b) > 1})
            if twice:
                raise ValueError(f"--bands names each band once. Received {twice} more than once")
            object.__setattr__(self, "bands", bands)
        if isinstance(self.max_pixels, bool) or not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise ValueError(f"--max_pixels must be a positive int. Received: {self.max_pixels!r}")
        if self.patch is not None and not isinstance(self.patch, PatchOptions):
            raise ValueError(f"patch must be an imaging.patches.PatchOptions or None. Received: {self.patch!r}")

    @classmethod
    def parse_bands(cls, text: str) -> tuple[str, ...]:
        """'B02,B03,B04' -> ('B02', 'B03', 'B04'); raises ValueError naming --bands."""
        bands = tuple(b.strip() for b in text.split(","))
        if not all(bands):
            raise ValueError(f"--bands must be band names separated by commas, e.g. B02,B03,B04. Received: {text!r}")
        return bands

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"bands": list(self.bands) if self.bands else None}
        if self.patch is not None:
            d["patch"] = self.patch.to_json()
        return d


@dataclasses.dataclass(frozen=True)
class DatePlan:
    """One time step of a location: its date and the files holding its bands.

    Attributes:
      date: ISO date.
      files: (relative path, path to open, band index in that file (0-based))
        per band of the stack, in stack order; a multi-band file appears once
        per band it gives.
    """

    date: str
    files: tuple[tuple[str, str, int], ...]

    @property
    def days(self) -> int:
        return schemas.time_series.days_since_epoch(datetime.date.fromisoformat(self.date))

    @property
    def rel_paths(self) -> tuple[str, ...]:
        """Its files' relative paths, each once, in stack order."""
        return tuple(dict.fromkeys(rel for rel, _, _ in self.files))


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of one input file that is in no stack: rejected, or noted.

    Attributes:
      rel_path: The file.
      reason: A key of `schemas.REJECT_REASONS` (or `schemas.SKIP_REASONS`).
      message: What went wrong, naming the date and what differs.
      date: Its date (ISO) when it has one.
    """

    rel_path: str
    reason: str
    message: str
    date: str | None = None


@dataclasses.dataclass(frozen=True)
class LocationPlan:
    """What a location becomes, from its files' names and headers (`plan_location`).

    Attributes:
      location: Its relative path (the records' filename).
      dates: The time steps kept, ascending.
      bands: The band names, in stack order.
      height, width, dtype: Of every date (dtype: the stored type).
      epsg, geotransform: Of the reference date (all kept dates share them).
      nodata: The reference date's GDAL nodata value (all kept dates share it), or None;
        per stack band (`imaging.nodata`) where its bands' differ (`_stack_nodata`).
      outcomes: Every file in no stack: the dates left out and why, and
        files rejected on their own (`no_date`), sorted by path.
      rejected: (reason, message) when the location gives no stack at all;
        its files are then each in `outcomes` with that reason.
      segment_shape: (rows, columns) of one tile or strip of the reference
        date's first file (a product's passes are stored alike): what its
        work items keep together (`imaging.scenes.work_items`); None: unknown.
    """

    location: str
    dates: tuple[DatePlan, ...]
    bands: tuple[str, ...]
    height: int
    width: int
    dtype: str
    epsg: int
    geotransform: tuple[float, ...] | None
    nodata: _nodata.Nodata
    outcomes: tuple[Outcome, ...]
    rejected: tuple[str, str] | None = None
    segment_shape: tuple[int, int] | None = None

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.dates), self.height, self.width, len(self.bands))

    @property
    def samples(self) -> int:
        t, h, w, b = self.shape
        return t * h * w * b

    @property
    def nbytes(self) -> int:
        return self.samples * np.dtype(self.dtype).itemsize

    def dropped(self) -> dict[str, dict[str, str]]:
        """The dates left out: ISO date -> {'reason', 'message'} (the first file's, per date)."""
        out: dict[str, dict[str, str]] = {}
        for o in self.outcomes:
            if o.date is not None and o.date not in out:
                out[o.date] = {"reason": o.reason, "message": o.message}
        return dict(sorted(out.items()))

    def to_json(self) -> dict[str, Any]:
        """JSON-safe, to carry the plan to the worker that reads it (`from_json`)."""
        return {"location": self.location, "dates": [[d.date, [list(f) for f in d.files]] for d in self.dates],
                "bands": list(self.bands), "height": self.height, "width": self.width, "dtype": self.dtype,
                "epsg": self.epsg, "geotransform": None if self.geotransform is None else list(self.geotransform),
                "nodata": ([_json_float(v) for v in self.nodata] if isinstance(self.nodata, tuple)
                           else _json_float(self.nodata)),
                "outcomes": [[o.rel_path, o.reason, o.message, o.date] for o in self.outcomes],
                "rejected": None if self.rejected is None else list(self.rejected),
                "segment_shape": None if self.segment_shape is None else list(self.segment_shape)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LocationPlan:
        nodata = d["nodata"]
        segment = d.get("segment_shape")  # Absent from a plan written before it was kept.
        return cls(d["location"],
                   tuple(DatePlan(date, tuple((rel, path, int(b)) for rel, path, b in files))
                         for date, files in d["dates"]),
                   tuple(d["bands"]), int(d["height"]), int(d["width"]), d["dtype"], int(d["epsg"]),
                   None if d["geotransform"] is None else tuple(float(v) for v in d["geotransform"]),
                   _nodata.from_json(nodata),
                   tuple(Outcome(*o) for o in d["outcomes"]),
                   None if d["rejected"] is None else tuple(d["rejected"]),
                   None if segment is None else (int(segment[0]), int(segment[1])))


def _json_float(value: float | None):
    if value is None:
        return None
    if math.isnan(value):
        return "nan"
    return value


@dataclasses.dataclass(frozen=True)
class _Header:
    """What alignment compares of one file, from its header."""

    rel_path: str
    path: str
    date: datetime.date | None
    band: str | None
    epsg: int = 0
    geotransform: tuple[float, ...] | None = None
    height: int = 0
    width: int = 0
    bands: int = 0
    dtype: str = ""
    nodata: _nodata.Nodata = None
    segment_shape: tuple[int, int] | None = None
    error: ImageRejected | None = None


def _header(rel_path: str, path: str) -> _Header:
    date = name_date(rel_path)
    band = band_of(rel_path)
    try:
        with open_scene(path, rel_path) as scene:
            georef, nodata = scene.georef, scene.nodata
            # A world file, `.prj` or `.aux.xml` beside it, read as GDAL reads them.
            sidecars = _sidecars.load(path, rel_path)
            if sidecars is not None:
                georef, nodata = sidecars.georef(georef), sidecars.nodata_over(nodata, scene.bands)
            dtype = _WIDEN.get(scene.dtype.name, scene.dtype.name)
            if date is None:
                date = _tag_date(scene)
            return _Header(rel_path, path, date, band, georef.epsg, georef.geotransform, scene.height,
                           scene.width, scene.bands, dtype, nodata, scene.segment_shape)
    except ImageRejected as e:
        return _Header(rel_path, path, date, band, error=e)


def _tag_date(scene: SceneReader) -> datetime.date | None:
    """The date of the TIFF DateTime tag ('YYYY:MM:DD HH:MM:SS'), or None (and for a JPEG 2000: no such tag)."""
    if not isinstance(scene, SceneReader):
        return None
    tag = scene._page.tags.get(_DATETIME_TAG)  # Same package: the page SceneReader opened.
    value = None if tag is None else tag.value
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        return None
    match = re.match(r"\s*(\d{4})[:\-](\d{2})[:\-](\d{2})", value)
    if not match:
        return None
    try:
        return datetime.date(*(int(g) for g in match.groups()))
    except ValueError:
        return None


def _differences(ref: _Header, h: _Header, band_file: bool, same_band: _Header | None = None) -> list[str]:
    """What differs between a file and the location's reference (the first file of its reference date).

    The nodata value is compared with `same_band`'s, the reference date's file of the
    file's own band (default: `ref`).
    """
    same_band = ref if same_band is None else same_band
    out = []
    if h.epsg != ref.epsg:
        out.append(f"CRS EPSG:{h.epsg} (the stack's: EPSG:{ref.epsg})")
    if not _same_grid(h, ref):
        out.append(f"geotransform {_gt(h.geotransform)} (the stack's: {_gt(ref.geotransform)})")
    if (h.height, h.width) != (ref.height, ref.width):
        out.append(f"size {h.width}x{h.height} (the stack's: {ref.width}x{ref.height})")
    if h.dtype != ref.dtype:
        out.append(f"dtype {h.dtype} (the stack's: {ref.dtype})")
    if h.bands != (1 if band_file else ref.bands):
        out.append(f"{h.bands} bands (the stack's: {1 if band_file else ref.bands})")
    if not _same_nodata(h.nodata, same_band.nodata):
        # Another date's nodata value would be counted as data (band statistics,
        # --raster_max_nodata) and read as values by a model.
        out.append(f"nodata {_nodata_text(h.nodata)} (the stack's: {_nodata_text(same_band.nodata)})")
    return out


# Geotransforms that differ by less than this share of a pixel at every corner of the grid
# are one grid: float noise of reprojection tools (1e-9 m on 10 m pixels), not a shift.
_GRID_TOLERANCE = 1e-6


def _same_grid(h: _Header, ref: _Header) -> bool:
    """Whether two files' geotransforms put every corner of the grid within `_GRID_TOLERANCE` pixel."""
    a, b = h.geotransform, ref.geotransform
    if a is None or b is None:
        return a is b
    if a == b:
        return True
    x0, dx, rx, y0, ry, dy = b
    det = dx * dy - rx * ry
    if det == 0:
        return False
    for row, col in ((0, 0), (0, ref.width), (ref.height, 0), (ref.height, ref.width)):
        # Where `h` puts this corner, in `ref`'s pixels.
        ex = a[0] + col * a[1] + row * a[2] - (x0 + col * dx + row * rx)
        ey = a[3] + col * a[4] + row * a[5] - (y0 + col * ry + row * dy)
        dcol, drow = (ex * dy - ey * rx) / det, (ey * dx - ex * ry) / det
        if max(abs(dcol), abs(drow)) >= _GRID_TOLERANCE:
            return False
    return True


def _same_nodata(a: _nodata.Nodata, b: _nodata.Nodata) -> bool:
    return _nodata.same(a, b)


def _nodata_text(value: _nodata.Nodata) -> str:
    return _nodata.text(value)


def _gt(geotransform) -> str:
    # repr: two geotransforms that differ must not print alike (f"{v:g}" shows 6 digits).
    return "none" if geotransform is None else "(" + ", ".join(repr(float(v)) for v in geotransform) + ")"


def plan_location(location: str, files: Sequence[tuple[str, str]], options: TimeSeriesOptions) -> LocationPlan:
    """What a location's files become, from their names and headers (no pixel is decoded).

    Args:
      location: The folder's path relative to the input root.
      files: (relative path, path to open) of every raster it directly holds.
      options: --bands, --max_pixels, --raster_patch.

    Returns:
      The plan: the dates kept, and every other file with its reason.
    """
    headers = [_header(rel, path) for rel, path in sorted(files, key=lambda f: os.fsencode(f[0]))]
    outcomes, by_date = _dated(headers)
    dates = _one_file_per_band(location, by_date, outcomes)
    rejected = functools.partial(_rejected, location, dates, outcomes)
    if not dates:
        return rejected("no_date", f"{location or '.'}: no date left to stack")
    band_files = any(band is not None for per_band in dates.values() for band in per_band)
    for date, per_band in dates.items():
        # Only the bands --bands keeps: the others are skipped (band_not_selected).
        chosen = {b: h for b, h in per_band.items() if options.bands is None or b is None or b in options.bands}
        dtypes = sorted({h.dtype for h in chosen.values()})
        if len(dtypes) > 1:
            which = "; ".join(f"{d}: {', '.join(sorted((b for b, h in chosen.items() if h.dtype == d), key=natural_key))}"
                              for d in dtypes)
            return rejected("mixed_dtypes", f"{location or '.'}: the band files of {date.isoformat()} are of "
                                            f"several dtypes ({which}); a stack has one: pick bands of one "
                                            f"dtype with --bands")
    ref, ref_bands = _reference(dates, band_files, options.bands)
    bands, unselected = _stack_bands(dates, ref, band_files, options)
    kept = [date_plan for date, per_band in dates.items()
            if (date_plan := _date_plan(date, per_band, ref, ref_bands, band_files, bands, unselected,
                                        outcomes)) is not None]
    outcomes.sort(key=lambda o: os.fsencode(o.rel_path))
    if not kept:
        return LocationPlan(location, (), tuple(bands), 0, 0, "", 0, None, None, tuple(outcomes),
                            ("no_date", f"{location or '.'}: no date left to stack (every date was left "
                                        f"out: see its files)"))
    dtype = ref.dtype
    if dtype not in schemas.RAW_DTYPES:
        return rejected("unsupported_dtype", f"{location or '.'}: {dtype} samples; stacks hold "
                                             f"{', '.join(schemas.RAW_DTYPES)}")
    plan = LocationPlan(location, tuple(kept), tuple(bands), ref.height, ref.width, dtype, ref.epsg,
                        ref.geotransform, _stack_nodata(ref, ref_bands, band_files, bands), tuple(outcomes),
                        None, ref.segment_shape)
    if options.patch is None and plan.samples > options.max_pixels:
        return rejected("too_large", f"{location or '.'}: a stack of {plan.shape} is {plan.samples:,} samples, "
                                     f"more than --max_pixels={options.max_pixels:,}; cut it into patches "
                                     f"(--raster_patch 256) or raise --max_pixels")
    return plan


def _stack_nodata(ref: _Header, ref_bands: dict, band_files: bool, bands) -> _nodata.Nodata:
    """The stack's nodata (`imaging.nodata`), per stack band where its bands' differ.

    Each band's is its reference file's (`_date_plan` holds every date to
    it): a band file's own value (Landsat's QA_PIXEL fills with 1, its
    surface reflectance with 0), or the band's of a file of several bands
    (a PAM file may give each its own, as GDAL reads it).
    """
    if band_files:
        return _nodata.collapse(_nodata.per_band(ref_bands.get(b, ref).nodata, 1)[0] for b in bands)
    if not all(b.isdigit() and 1 <= int(b) <= ref.bands for b in bands):
        return ref.nodata
    return _nodata.select(_nodata.per_band(ref.nodata, ref.bands), [int(b) - 1 for b in bands])


def _dated(headers: list[_Header]) -> tuple[list[Outcome], dict[datetime.date, list[_Header]]]:
    """The outcomes of the files without a date or a readable header, and the others by date."""
    outcomes: list[Outcome] = []
    by_date: dict[datetime.date, list[_Header]] = {}
    for h in headers:
        if h.error is not None:
            outcomes.append(Outcome(h.rel_path, h.error.reason, h.error.message,
                                    None if h.date is None else h.date.isoformat()))
        elif h.date is None:
            outcomes.append(Outcome(h.rel_path, "no_date", f"{h.rel_path}: no date in its name "
                                    "(YYYY-MM-DD, YYYYMMDD, a Sentinel-2 or Landsat product name) "
                                    "and no TIFF DateTime tag"))
        else:
            by_date.setdefault(h.date, []).append(h)
    return outcomes, by_date


def _one_file_per_band(location: str, by_date, outcomes: list[Outcome]) -> dict:
    """{date: {band or None: header}}, in date order; two files for one date and band leave the date out.

    The files of a date left out are added to `outcomes` ('conflicting_dates').
    """
    dates: dict[datetime.date, dict[str | None, _Header]] = {}
    for date, group in sorted(by_date.items()):
        per_band: dict[str | None, list[_Header]] = {}
        for h in group:
            per_band.setdefault(h.band, []).append(h)
        clash = {band: hs for band, hs in per_band.items() if len(hs) > 1}
        if None in per_band and len(per_band) > 1:
            clash[None] = per_band[None]  # A whole-date file beside band files of that date.
        if clash:
            what = "; ".join(
                f"{'band ' + band if band else 'the whole date'}: " + ", ".join(h.rel_path for h in hs)
                for band, hs in sorted(clash.items(), key=lambda kv: natural_key(kv[0] or "")))
            for h in group:
                outcomes.append(Outcome(h.rel_path, "conflicting_dates",
                                        f"{location or '.'}: {date.isoformat()} has several files for one "
                                        f"band ({what})", date.isoformat()))
            continue
        dates[date] = {band: hs[0] for band, hs in per_band.items()}
    return dates


def _rejected(location: str, dates, outcomes: list[Outcome], reason: str, message: str) -> LocationPlan:
    """The plan of a location rejected as a whole: every file of its dates gets the reason too."""
    gone = [Outcome(h.rel_path, reason, message, d.isoformat())
            for d, per_band in dates.items() for h in per_band.values()]
    return LocationPlan(location, (), (), 0, 0, "", 0, None, None,
                        tuple(sorted(outcomes + gone, key=lambda o: os.fsencode(o.rel_path))),
                        (reason, message))


def _reference(dates, band_files: bool, selected) -> tuple[_Header, dict]:
    """The header every date is checked against, and its date's files by band.

    The first file (of the bands --bands keeps, when given) of the date that most
    dates agree with; the earliest such date when several tie. A location whose
    first pass alone was delivered in another CRS or grid keeps its other dates,
    rather than that pass only.
    """
    def first(per_band):
        kept = [b for b in per_band if selected is None or b is None or b in selected] or list(per_band)
        return per_band[min(kept, key=lambda b: natural_key(b or ""))]

    per_date = list(dates.values())
    firsts = [first(per_band) for per_band in per_date]
    best = 0
    if len(firsts) > 2:
        agree = [sum(not _differences(ref, h, band_files) for h in firsts) for ref in firsts]
        best = agree.index(max(agree))
    return firsts[best], per_date[best]


def _stack_bands(dates, ref: _Header, band_files: bool, options: TimeSeriesOptions) -> tuple[list, list]:
    """The stack's bands (--bands, else every band found, in natural order) and the bands found but not kept."""
    if band_files:
        found = sorted({band for per_band in dates.values() for band in per_band if band is not None},
                       key=natural_key)
    else:
        found = [str(i + 1) for i in range(ref.bands)]
    bands = list(options.bands) if options.bands is not None else found
    return bands, [b for b in found if b not in bands]


def _date_plan(date, per_band, ref: _Header, ref_bands: dict, band_files: bool, bands, unselected,
               outcomes: list[Outcome]) -> DatePlan | None:
    """One date's files in the stack's band order; None (its files' outcomes added) when it is left out.

    `ref_bands`: the reference date's files by band; each band's nodata value is its own
    (Landsat's QA_PIXEL fills with 1, its surface reflectance with 0), the same on every date.
    """
    iso = date.isoformat()
    diffs = {h.rel_path: _differences(ref, h, band_files, ref_bands.get(band, ref))
             for band, h in per_band.items() if band not in unselected}
    diffs = {rel: d for rel, d in diffs.items() if d}
    if diffs:
        what = "; ".join(f"{rel}: {', '.join(d)}" for rel, d in sorted(diffs.items()))
        for h in per_band.values():
            outcomes.append(Outcome(h.rel_path, "misaligned", f"{iso} differs from the stack (the grid most "
                                    f"dates share, the earliest's on a tie: {what}); left out of the "
                                    f"stack, nothing resampled", iso))
        return None
    if band_files:
        missing = [b for b in bands if b not in per_band]
    else:
        missing = [b for b in bands if not (b.isdigit() and 1 <= int(b) <= ref.bands)]
    if missing:
        for h in per_band.values():
            outcomes.append(Outcome(h.rel_path, "missing_band",
                                    f"{iso} has no band {', '.join(missing)} (the stack's bands: "
                                    f"{', '.join(bands)}); left out of the stack", iso))
        return None
    if not band_files:
        h = per_band[None]
        return DatePlan(iso, tuple((h.rel_path, h.path, int(b) - 1) for b in bands))
    for b in unselected:
        if b in per_band:
            outcomes.append(Outcome(per_band[b].rel_path, "band_not_selected",
                                    f"band {b} is not among --bands {','.join(bands)}", None))
    return DatePlan(iso, tuple((per_band[b].rel_path, per_band[b].path, 0) for b in bands))


def read_stack(plan: LocationPlan, window: tuple[int, int, int, int] | None = None, *,
               with_mask: bool = False):
    """The stack (time, height, width, bands) of a planned location, or of one window of it.

    Args:
      plan: From `plan_location`, not rejected.
      window: (y, x, height, width); None: the whole location. A window
        reaching past the edges holds each file's nodata value (0 without).
      with_mask: Also return where the files' masks say no data (`_PassFile`).

    Returns:
      The stack; with `with_mask`, (stack, masked): masked is (time, height,
      width, bands) booleans, True where a file's mask (GDAL's internal one,
      else its `.msk`) marks the sample as no data, or None when no file of
      the stack has a mask.

    Raises:
      ImageRejected: As `imaging.patches.SceneReader` does (a damaged strip).
    """
    y, x, h, w = (0, 0, plan.height, plan.width) if window is None else window
    out = np.empty((len(plan.dates), h, w, len(plan.bands)), np.dtype(plan.dtype))
    masked: np.ndarray | None = None
    for t, date in enumerate(plan.dates):
        for rel, (path, picks) in _picks_by_file(date).items():
            with _PassFile(path, rel, plan.nodata, picks) as source:
                values = source.scene.read(y, x, h, w)
                file_mask = source.masked(y, x, h, w)
            for b, band in picks:
                out[t, :, :, b] = values[:, :, band]
            if file_mask is not None and with_mask:
                if masked is None:
                    masked = np.zeros(out.shape, bool)
                for b, _ in picks:
                    masked[t, :, :, b] = file_mask
    return (out, masked) if with_mask else out


def _picks_by_file(date: DatePlan) -> dict[str, tuple[str, list[tuple[int, int]]]]:
    """rel_path -> (path, [(band of the stack, band of the file), ...]) of one date's files, in their order."""
    by_file: dict[str, tuple[str, list[tuple[int, int]]]] = {}
    for b, (rel, path, band) in enumerate(date.files):
        by_file.setdefault(rel, (path, []))[1].append((b, band))
    return by_file


class _PassFile:
    """One file of a pass opened for windows, with GDAL's mask of it, as a single scene is read.

    The mask is the file's internal one (GDAL_TIFF_INTERNAL_MASK), else its
    external `.msk` (`imaging.sidecars`, `imaging.scenes.external_mask`: one
    of another size or damaged is left out with a warning). A file holding
    several bands of the stack masks each of them; a band file, its band.
    """

    def __init__(self, path: str, rel: str, nodata: _nodata.Nodata, picks: Sequence[tuple[int, int]] = ()):
        """`nodata`: the stack's (`LocationPlan.nodata`); `picks`: (band of the stack, band of the file) pairs."""
        from imaging import scenes as _scenes

        self._stack = contextlib.ExitStack()
        try:
            self.scene = self._stack.enter_context(open_scene(path, rel))
            if isinstance(nodata, tuple):  # Per stack band: the file's bands each take their own.
                values: list[float | None] = [None] * self.scene.bands
                for b, band in picks:
                    values[band] = nodata[b]
                nodata = _nodata.collapse(values)
            self.scene.use_nodata(nodata)  # A PAM file's may stand for the tag's: padding holds it.
            self._external = None
            if not self.scene.has_mask:
                self._external = _scenes.external_mask(_sidecars.load(path, rel, georef=False), self.scene, rel)
                if self._external is not None:
                    self._stack.enter_context(self._external)
        except BaseException:
            self._stack.close()
            raise

    def __enter__(self) -> _PassFile:
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def keep_columns(self, left: int, right: int) -> None:
        self.scene.keep_columns(left, right)
        if self._external is not None:
            self._external.keep_columns(left, right)

    def masked(self, y: int, x: int, height: int, width: int) -> np.ndarray | None:
        """(height, width) booleans, True where the file's mask says no data (never past its edge); None without."""
        if self.scene.has_mask:
            return self.scene.masked(y, x, height, width)
        if self._external is None:
            return None
        return (self._external.read(y, x, height, width) == 0).all(axis=2) & ~self.scene.padded(y, x, height, width)


def read_patches(plan: LocationPlan, options: PatchOptions, y0: int, y1: int,
                 columns: tuple[int, int] | None = None
                 ) -> Iterator[tuple[int, int, np.ndarray | None, float, np.ndarray | None]]:
    """The patches of a location whose top row is in [y0, y1) (and left column in `columns`).

    Every patch is the same window of every date. The patches of the item
    are read date by date (each file opened once per item), so what is held
    is the item's patches of every date, not the location's stack.

    Yields:
      (y, x, stack (time, h, w, bands) or None when skipped, nodata share,
      masked): a patch whose share of pixels holding no data, over all its
      dates, exceeds --raster_max_nodata is skipped. A pixel of a date holds
      no data where each band is the nodata value, NaN or under its file's
      mask (`read_stack`'s `masked`, here (time, h, w, bands) or None when no
      file has a mask), or lies past the location's edge, as a single
      scene's patch counts them (`imaging.patches.nodata_share`).
    """
    height, width = options.size
    rows = [y for y in offsets(plan.height, height, options.stride[0], options.edge) if y0 <= y < y1]
    xs = offsets(plan.width, width, options.stride[1], options.edge)
    if columns is not None:
        xs = tuple(x for x in xs if columns[0] <= x < columns[1])
    corners = [(y, x) for y in rows for x in xs]
    if not corners:
        return
    shape = (len(plan.dates), height, width, len(plan.bands))
    # One array per patch, each let go once yielded: the caller's encoded record need not sit
    # beside every decoded patch of the item.
    stacks: list[np.ndarray | None] = [np.empty(shape, np.dtype(plan.dtype)) for _ in corners]
    masks: list[np.ndarray | None] = [None] * len(corners)
    for t, date in enumerate(plan.dates):
        for rel, (path, picks) in _picks_by_file(date).items():
            with _PassFile(path, rel, plan.nodata, picks) as source:
                if xs:
                    source.keep_columns(max(xs[0], 0), xs[-1] + width)
                for k, (y, x) in enumerate(corners):
                    values = source.scene.read(y, x, height, width, copy=False)
                    for b, band in picks:
                        stacks[k][t, :, :, b] = values[:, :, band]
                    file_mask = source.masked(y, x, height, width)
                    if file_mask is not None and file_mask.any():
                        if masks[k] is None:
                            masks[k] = np.zeros(shape, bool)
                        for b, _ in picks:
                            masks[k][t, :, :, b] = file_mask
    for k, (y, x) in enumerate(corners):
        inside_rows = (np.arange(y, y + height) >= 0) & (np.arange(y, y + height) < plan.height)
        inside_cols = (np.arange(x, x + width) >= 0) & (np.arange(x, x + width) < plan.width)
        padded = ~(inside_rows[:, None] & inside_cols[None, :])
        stack, stacks[k] = stacks[k], None
        masked, masks[k] = masks[k], None
        share = float(np.mean([_date_share(stack[t], padded, plan.nodata, None if masked is None else masked[t])
                               for t in range(stack.shape[0])]))
        if share > options.max_nodata:
            yield y, x, None, share, None
        else:
            yield y, x, stack, share, masked


def _date_share(window: np.ndarray, padded: np.ndarray, nodata: _nodata.Nodata, masked: np.ndarray | None) -> float:
    """One date's nodata share of a patch: `nodata_share`, a masked sample counting as nodata."""
    if masked is None:
        return nodata_share(window, padded if padded.any() else None, nodata)
    empty = masked.copy()
    if window.dtype.kind == "f":
        empty |= np.isnan(window)
    for b, value in enumerate(_nodata.per_band(nodata, window.shape[2])):
        if value is not None and not math.isnan(value):
            empty[:, :, b] |= window[:, :, b] == value
    return float(np.count_nonzero(empty.all(axis=2) | padded)) / padded.size


def patch_of(plan: LocationPlan, y: int, x: int, height: int, width: int) -> tuple[str, tuple[float, ...] | None]:
    """A patch's record filename (`location#patch=Y,X`) and its own geotransform."""
    return f"{plan.location}#patch={y},{x}", patch_geotransform(plan.geotransform, y, x)


def stack_band_stats(stack: np.ndarray, nodata: _nodata.Nodata, masked: np.ndarray | None = None) -> schemas.BandStats:
    """Per-band statistics of a stack (time, height, width, bands): every date's pixels, nodata and NaN left out.

    `masked` ((time, height, width, bands) booleans, `read_stack`'s): samples
    under their file's mask are counted as nodata too, as a single scene's
    masked statistics count them (`imaging.raster.band_stats`).
    """
    t, h, w, b = stack.shape
    if masked is None or not masked.any():
        return _raster.band_stats(np.ascontiguousarray(stack).reshape(t * h, w, b), nodata)
    # Each band under its own file's mask (band files of one date have one each).
    values = _nodata.per_band(nodata, b)
    per_band = [_raster.band_stats(np.ascontiguousarray(stack[..., k:k + 1]).reshape(t * h, w, 1), values[k],
                                   masked[..., k].reshape(t * h, w)) for k in range(b)]
    return schemas.BandStats(1, *(tuple(v for s in per_band for v in getattr(s, field))
                                  for field in ("count", "min", "max", "mean", "m2", "nodata")))
