"""GeoTIFF georeferencing: the EPSG code and the GDAL geotransform of each page.

Read from the GeoTIFF tags with tifffile's public tag API (no GDAL):
GeoKeyDirectoryTag (34735) for ProjectedCSTypeGeoKey (3072), else
GeographicTypeGeoKey (2048), and GTRasterTypeGeoKey (1025); then either
ModelTransformationTag (34264) or ModelPixelScaleTag (33550) with one
ModelTiepointTag (33922). The geotransform is in GDAL order
(x0, dx, rx, y0, ry, dy) and refers to the top-left corner of the top-left
pixel, as GDAL reports it (PixelIsPoint files are shifted by half a pixel, and
a negative ModelPixelScale Y is taken as north up, as GDAL does by default).
Framework-free.
"""

from __future__ import annotations

import dataclasses
import io
import math


from imaging.errors import ImageRejected

__all__ = ["Georef", "page_georef", "read_georef"]

_GEOKEY_DIRECTORY = 34735
_MODEL_PIXEL_SCALE = 33550
_MODEL_TIEPOINT = 33922
_MODEL_TRANSFORMATION = 34264
_RASTER_TYPE_KEY = 1025
_PIXEL_IS_POINT = 2
_PROJECTED_CS_KEY = 3072
_GEOGRAPHIC_CS_KEY = 2048
# GeoKey values that are no EPSG code: undefined and user-defined.
_NOT_A_CODE = (0, 32767)


@dataclasses.dataclass(frozen=True)
class Georef:
    """The georeferencing of one page, for its pixels as stored in the file.

    Attributes:
      epsg: EPSG code of the CRS; 0 when the file gives none (no GeoKeys, or a
        user-defined CRS).
      geotransform: (x0, dx, rx, y0, ry, dy), GDAL order; None when the file
        has no affine georeferencing (no tags, or ground control points).
      height, width: The page's size in pixels, the grid it refers to.
    """

    epsg: int
    geotransform: tuple[float, ...] | None
    height: int
    width: int

    def for_size(self, height: int, width: int) -> Georef:
        """The same georeferencing for the page resampled to `height` x `width` pixels.

        The covered area stays (the resize maps the whole page onto the whole
        new grid), so each pixel's size and the rotation terms scale by the
        size ratio; the origin, the top-left corner, does not move.
        """
        if (height, width) == (self.height, self.width) or self.geotransform is None:
            return dataclasses.replace(self, height=height, width=width)
        x0, dx, rx, y0, ry, dy = self.geotransform
        sx, sy = self.width / width, self.height / height  # Source pixels per stored pixel.
        return Georef(self.epsg, (x0, dx * sx, rx * sy, y0, ry * sx, dy * sy), height, width)


def read_georef(data: bytes, name: str) -> list[Georef]:
    """The georeferencing of each full-resolution page of a TIFF, in file order.

    Reduced-resolution pages (overviews) are left out, as `read_tiff`
    leaves them out; so the list lines up with its pages.

    Raises:
      ImageRejected: 'corrupt' when a georeferencing tag is there but
        malformed (the file would otherwise be stored without saying its
        georeferencing was lost).
    """
    import tifffile

    from imaging import _tiff_ifds

    loop = _tiff_ifds.ifd_loop(data)
    if loop:  # The page walk below would follow it for ever.
        raise ImageRejected("corrupt", f"{name}: {loop}")
    try:
        with tifffile.TiffFile(io.BytesIO(data)) as tif:
            # Masks (GDAL's internal masks) are no pages of their own either, as for `read_tiff`.
            pages = [p for p in tif.pages if not getattr(p, "is_reduced", False)
                     and not getattr(p, "is_mask", False)] or [tif.pages.first]
            return [_page_georef(p, name) for p in pages]
    except (tifffile.TiffFileError, ValueError, TypeError, KeyError, IndexError) as e:
        raise ImageRejected("corrupt", f"{name}: unreadable GeoTIFF tags ({type(e).__name__}: {e})") from e


def page_georef(page, name: str) -> Georef:
    """The georeferencing of one page of an opened `tifffile.TiffFile`.

    For readers that hold the file open already (`imaging.patches.SceneReader`
    reads scenes too large to pass around as bytes).

    Raises:
      ImageRejected: 'corrupt' when a georeferencing tag is there but malformed.
    """
    import tifffile

    try:
        return _page_georef(page, name)
    except (tifffile.TiffFileError, ValueError, TypeError, KeyError, IndexError) as e:
        raise ImageRejected("corrupt", f"{name}: unreadable GeoTIFF tags ({type(e).__name__}: {e})") from e


def _tag(page, code: int):
    tag = page.tags.get(code)
    return None if tag is None else tag.value


def _page_georef(page, name: str) -> Georef:
    keys = _geokeys(_tag(page, _GEOKEY_DIRECTORY), name)
    epsg = keys.get(_PROJECTED_CS_KEY) or keys.get(_GEOGRAPHIC_CS_KEY) or 0
    if epsg in _NOT_A_CODE:
        epsg = 0
    geotransform = _geotransform(page, name)
    if geotransform is not None and keys.get(_RASTER_TYPE_KEY) == _PIXEL_IS_POINT:
        x0, dx, rx, y0, ry, dy = geotransform
        geotransform = (x0 - 0.5 * dx - 0.5 * rx, dx, rx, y0 - 0.5 * ry - 0.5 * dy, ry, dy)
    return Georef(int(epsg), geotransform, int(page.imagelength), int(page.imagewidth))


def _geokeys(directory, name: str) -> dict[int, int]:
    """GeoKeys whose value is stored in the directory itself (TIFFTagLocation 0)."""
    if directory is None:
        return {}
    values = tuple(directory) if isinstance(directory, (tuple, list)) else (directory,)
    if len(values) < 4 or len(values) < 4 + 4 * int(values[3]):
        raise ImageRejected("corrupt", f"{name}: its GeoKeyDirectoryTag holds {len(values)} values, "
                                       f"too few for {values[3] if len(values) >= 4 else 'its'} keys")
    keys = {}
    for i in range(int(values[3])):
        key, location, _count, value = values[4 + 4 * i:8 + 4 * i]
        if location == 0:  # Other locations point into double or ASCII tags: no codes.
            keys[int(key)] = int(value)
    return keys


def _floats(page, code: int, name: str) -> tuple[float, ...] | None:
    value = _tag(page, code)
    if value is None:
        return None
    values = tuple(float(v) for v in (value if isinstance(value, (tuple, list)) else (value,)))
    if not all(math.isfinite(v) for v in values):
        raise ImageRejected("corrupt", f"{name}: GeoTIFF tag {code} holds non-finite values {values}")
    return values


def _geotransform(page, name: str) -> tuple[float, ...] | None:
    matrix = _floats(page, _MODEL_TRANSFORMATION, name)
    if matrix is not None:
        if len(matrix) != 16:
            raise ImageRejected("corrupt", f"{name}: ModelTransformationTag holds {len(matrix)} values, not 16")
        # Row-major 4x4: X = a*col + b*row + d, Y = e*col + f*row + h.
        a, b, _, d, e, f, _, h = matrix[:8]
        return (d, a, b, h, e, f)
    scale = _floats(page, _MODEL_PIXEL_SCALE, name)
    tiepoints = _floats(page, _MODEL_TIEPOINT, name)
    if scale is None or tiepoints is None:
        return None
    if len(scale) < 2 or len(tiepoints) < 6 or len(tiepoints) % 6:
        raise ImageRejected("corrupt", f"{name}: ModelPixelScaleTag {scale} / ModelTiepointTag "
                                       f"{tiepoints} are not a scale and (I, J, K, X, Y, Z) points")
    if len(tiepoints) > 6:
        return None  # Ground control points: no affine geotransform (GDAL fits none either).
    i, j, _, x, y, _ = tiepoints
    sx, sy = scale[:2]
    # Rows go south: the pixel scale's Y is positive, the geotransform's dy negative.
    # A negative Y scale is read as GDAL reads it by default (GTIFF_HONOUR_NEGATIVE_SCALEY=NO):
    # its sign is ignored, since writers that store one mostly mean a north-up image
    # (the geotransform's dy) rather than a south-up one; every GIS then shows it north up.
    sy = abs(sy)
    return (x - i * sx, sx, 0.0, y + j * sy, 0.0, -sy)
