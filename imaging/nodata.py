"""A raster's nodata value: one for every band, or one per band as GDAL keeps them.

GDAL keeps a nodata value per band (`src.nodatavals`): a TIFF's GDAL_NODATA
tag gives every band the same one, and GDAL's PAM file (`scene.tif.aux.xml`,
`imaging.sidecars`) may give each band its own (`<PAMRasterBand band="k">`).
A raster's nodata here is therefore either

- a float, or None: the same for every band (what almost every file has,
  and what records and normalized.jsonl held before per-band values); or
- a tuple of one float or None per band, where the bands' values differ.

`collapse` turns per-band values into the first form wherever they agree, so
a raster whose bands share one value is described as it always was. Values
compare with NaN equal to NaN (a NaN nodata value is one value). Framework-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Union

__all__ = ["Nodata", "collapse", "per_band", "select", "same", "to_json", "from_json", "text"]

# A raster's nodata: one value (or None) for every band, or one per band.
Nodata = Union[float, None, tuple]


def _same_value(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def collapse(values: Iterable[float | None]) -> Nodata:
    """Per-band values as a raster's nodata: the one value where every band has it, else the tuple."""
    values = tuple(None if v is None else float(v) for v in values)
    if not values or all(_same_value(values[0], v) for v in values[1:]):
        return values[0] if values else None
    return values


def per_band(nodata: Nodata, bands: int) -> tuple[float | None, ...]:
    """The nodata value of each of `bands` bands.

    Raises:
      ValueError: For per-band values of another number of bands.
    """
    if not isinstance(nodata, tuple):
        return (nodata,) * bands
    if len(nodata) != bands:
        raise ValueError(f"{len(nodata)} per-band nodata values for {bands} bands")
    return nodata


def select(nodata: Nodata, indices: Sequence[int]) -> Nodata:
    """The nodata of the bands at 0-based `indices`, in that order (--raster_bands)."""
    if not isinstance(nodata, tuple):
        return nodata
    return collapse(nodata[i] for i in indices)


def same(a: Nodata, b: Nodata) -> bool:
    """Whether two rasters' nodata are the same (NaN equal to NaN; per band where either is per band)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        bands = len(a) if isinstance(a, tuple) else len(b)
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) != len(b):
            return False
        return all(_same_value(x, y) for x, y in zip(per_band(a, bands), per_band(b, bands)))
    return _same_value(a, b)


def _json_value(value: float | None):
    if value is None:
        return None
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return int(value) if value == int(value) else value


def to_json(nodata: Nodata):
    """As JSON holds it: a number (an int where it is one), 'nan', 'inf', '-inf' or null; a list of them per band."""
    if isinstance(nodata, tuple):
        return [_json_value(v) for v in nodata]
    return _json_value(nodata)


def from_json(value) -> Nodata:
    """What `to_json` wrote (a list: per band)."""
    if isinstance(value, list):
        return tuple(None if v is None else float(v) for v in value)
    return None if value is None else float(value)


def text(nodata: Nodata) -> str:
    """For messages: '7', 'nan', 'none', or 'band 1: 7, band 2: none'."""
    def one(v):
        return "none" if v is None else f"{v:g}"
    if isinstance(nodata, tuple):
        return ", ".join(f"band {b}: {one(v)}" for b, v in enumerate(nodata, 1))
    return one(nodata)
