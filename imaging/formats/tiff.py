"""TIFF: rasters read by imaging/raster.py (every band and bit), the rest by Pillow.

`raster.read_tiff` parses the header once and either decodes the pages it
keeps or declines the file (None): Pillow's ordinary TIFFs (8-bit grey, RGB,
...), which keep Pillow's bytes, and headers tifffile cannot read, of which
Pillow then says what is wrong. Which files `read_tiff` declines is its
decision alone: this module stores what it is given.
"""

from __future__ import annotations

import dataclasses

from imaging import georef as _georef
from imaging import raster as _raster
from imaging.errors import ImageRejected
from imaging.formats import _notes, pillow
from imaging.formats._shared import Context, ValidImage, stored_raster

__all__ = ["images", "images_with_sidecars"]


def images(data: bytes, name: str, fmt: str, context: Context) -> list[ValidImage]:
    """A TIFF's kept pages (one image each), with their georeferencing when asked for.

    What tifffile logs about the file while it is read (a tag it cannot read,
    ...) is listed in each image's details under 'warnings', or added to the
    message it is rejected with.

    Raises:
      ImageRejected: With the reason the file cannot be stored.
    """
    return images_with_sidecars(data, name, context, None)


def images_with_sidecars(data: bytes, name: str, context: Context, sidecars) -> list[ValidImage]:
    """`images`, with what the file's GIS sidecars say (`imaging.sidecars.Sidecars`, or None).

    A world file, `.prj`, `.aux.xml` or `.msk` is applied over the file's
    tags as GDAL applies them: all of them to its first page; to later pages
    (`--raster_pages all`; GDAL's `GTIFF_DIR:N:path`) the world file and the
    `.prj` only. The sidecars read, and those left out, are listed in the
    details ('sidecars', 'sidecar_warnings').

    Raises:
      ImageRejected: With the reason the file cannot be stored.
    """
    with _notes.library_notes("tifffile") as notes:
        try:
            found = _read(data, name, context, sidecars)
        except ImageRejected as e:
            if not notes:
                raise
            raise ImageRejected(e.reason, f"{e.message} ({'; '.join(notes)})") from e
    if not notes:
        return found
    return [dataclasses.replace(image, details={**(image.details or {}), "warnings": list(notes)})
            for image in found]


def _read(data: bytes, name: str, context: Context, sidecars) -> list[ValidImage]:
    rasters = _raster.read_tiff(data, name, context.raster, sidecars)
    if rasters is None:
        found = pillow.images(data, name, "tiff", context)
    else:
        found = [stored_raster(r, name, "tiff", context) for r in rasters]
    found = _with_georef(found, data, name, context, sidecars)
    if sidecars is None:
        return found
    out = []
    for image in found:
        noted = sidecars.details(first_page=not image.page)
        out.append(dataclasses.replace(image, details={**(image.details or {}), **noted}) if noted else image)
    return out


def _with_georef(found: list[ValidImage], data: bytes, name: str, context: Context,
                 sidecars=None) -> list[ValidImage]:
    """The images with their page's georeferencing (--raster_georef), true for the stored pixels.

    A resize scales the pixel size (listed: 'scale_geotransform', with the
    file's own geotransform in the details). Pixels turned by EXIF
    orientation no longer match the file's grid: their georeferencing is
    dropped, and listed ('drop_georef'), rather than stored wrong.
    """
    if not context.raster.georef:
        return found
    pages = _georef.read_georef(data, name)
    if sidecars is not None and pages:
        # GDAL reads every sidecar for the file's dataset, its first page; a later page (GTIFF_DIR:N)
        # takes the world file alone (`Sidecars.page_georef`).
        pages = [sidecars.georef(g) if i == 0 else sidecars.page_georef(g) for i, g in enumerate(pages)]
    out = []
    for image in found:
        page = image.page or 0
        georef = pages[page] if page < len(pages) else None
        if georef is None:
            out.append(image)
            continue
        actions, details = image.actions, dict(image.details or {})
        if "exif_transpose" in actions and georef.geotransform is not None:
            georef = dataclasses.replace(georef, geotransform=None)
            actions += ("drop_georef",)
            details["georef_dropped"] = "exif_transpose turned the pixels off the file's grid"
        stored = georef.for_size(image.height, image.width)
        if stored.geotransform != georef.geotransform:
            actions += ("scale_geotransform",)
            details["source_geotransform"] = list(georef.geotransform)
        out.append(dataclasses.replace(image, georef=stored, actions=actions,
                                       details=details or image.details))
    return out
