"""JPEG 2000 (JP2 files and bare J2K codestreams): Sentinel-2 bands, orthophotos, scans.

Decoded by OpenJPEG through imagecodecs, as GDAL's JP2OpenJPEG driver
decodes them, never by Pillow: Pillow stretches samples of fewer than 16
bits (Sentinel-2's 15-bit bands, 12-bit sensors) onto 16 bits, reads signed
samples as unsigned, cuts 16-bit colour to 8 bits and takes a second or
fourth component for alpha.

- 8-bit unsigned images of 1 or 3 components (photos, RGB orthophotos) are
  stored as PNG, as Pillow's path stored them, without band statistics;
- everything else is a raster (`imaging.formats._shared.stored_raster`): every
  component a band, every value as decoded (PNG for 8/16-bit of 1, 3 or 4
  bands, raw otherwise), with band statistics, `--raster_bands` and
  `--raster_dtype`; so is every JPEG 2000 when those options are given.

The size is read from the codestream's SIZ marker and checked against
--max_pixels before anything is decoded. With --raster_georef, the
georeferencing is what GDAL reads (`imaging.jp2.georef`): the GeoJP2 box (a
GeoTIFF's tags in a 'uuid' box, which GDAL writes by default and reads
first), else the GMLJP2 coverage (Sentinel-2's tiles). With --raster_patch,
.jp2/.j2k scenes are cut into patches tile by tile instead
(`imaging.jp2.Jp2SceneReader`).

GIS sidecars (`images_with_sidecars`, `imaging.sidecars`) are read as GDAL's
JP2OpenJPEG driver reads them (checked with GDAL 3.10): the PAM file's
(`scene.jp2.aux.xml`) nodata value and georeferencing win over the boxes,
which win over a world file (`scene.j2w`, `scene.jp2w`, `scene.wld`; a
`.j2k`'s `scene.jkw`, `scene.j2kw`); an external mask (`scene.jp2.msk`) is
the image's mask. A file with a nodata value or a mask is a raster, never a
photo.
"""

from __future__ import annotations

import dataclasses
import io

from PIL import Image

from imaging import jp2 as _jp2
from imaging import raster as _raster
from imaging.errors import ImageRejected
from imaging.formats import _pil
from imaging.formats._shared import Context, ValidImage, stored_raster, with_georef

__all__ = ["images", "images_with_sidecars"]


def images(data: bytes, name: str, fmt: str, context: Context) -> list[ValidImage]:
    """The one image of a JPEG 2000 file (without its sidecars: `images_with_sidecars`).

    Raises:
      ImageRejected: 'corrupt' for a damaged header or codestream;
        'too_large' above --max_pixels (samples: height x width x
        components, as for TIFF rasters); 'unsupported_dtype' for
        subsampled components (they are no bands of one grid);
        'missing_bands' and the others of `imaging.raster.apply_options`.
    """
    return images_with_sidecars(data, name, context, None)


def images_with_sidecars(data: bytes, name: str, context: Context, sidecars) -> list[ValidImage]:
    """`images`, with what the file's GIS sidecars say (`imaging.sidecars.Sidecars`, or None).

    The PAM file's nodata value, and its external mask, count as no data in
    the band statistics (as a TIFF's); its georeferencing is applied over the
    boxes' as GDAL applies it; the sidecars read, and those left out, are
    listed in the details ('sidecars', 'sidecar_warnings').

    Raises:
      ImageRejected: As `images`.
    """
    structure = _jp2.read_structure(io.BytesIO(data), name)  # Headers only: SIZ, tile-parts, boxes.
    height, width, components = structure.height, structure.width, structure.components
    signed, bits, subsampled = structure.signed, structure.bits, structure.subsampled
    samples = height * width * components
    if samples > context.raster.max_pixels:
        raise ImageRejected(
            "too_large",
            f"{name} is {width}x{height} with {components} component{'s' * (components != 1)} = "
            f"{samples:,} samples, more than --max_pixels={context.raster.max_pixels:,}")
    if subsampled:
        raise ImageRejected(
            "unsupported_dtype",
            f"{name} has subsampled components (sizes {subsampled}): they are not bands of one "
            "grid; save it without subsampling (gdal_translate to GeoTIFF)")
    array = _jp2.decode(data, name)
    if array.shape[:2] != (height, width) or array.shape[2] != components:
        raise ImageRejected("corrupt", f"{name} decodes to {array.shape}, not its header's "
                                       f"{height}x{width}x{components}")
    nodata = masked = None
    if sidecars is not None:
        nodata = sidecars.nodata_over(None, components)  # A JPEG 2000 holds no nodata value of its own.
        masked = _raster.external_mask(sidecars, (height, width), name)
    photo = (not signed and max(bits) == 8 and components in (1, 3) and nodata is None and masked is None
             and context.raster.reads_pixels_as_default)
    if photo:
        png = _pil.encode(Image.fromarray(array[:, :, 0] if components == 1 else array), "png")
        image = context.fit(context.stored(png, "jpeg2000", ("reencode_jpeg2000_to_png",), name), name)
    else:
        r = _raster.apply_options(array, nodata, context.raster, name, masked)
        image = stored_raster(r, name, "jpeg2000", context)
    image = _with_georef(image, structure, name, context, sidecars)
    noted = {} if sidecars is None else sidecars.details()
    if noted:
        image = dataclasses.replace(image, details={**(image.details or {}), **noted})
    return [image]


def _with_georef(image: ValidImage, structure: _jp2.Jp2Structure, name: str, context: Context,
                 sidecars=None) -> ValidImage:
    """The image with its georeferencing (--raster_georef), scaled to its stored size.

    GDAL's order: the PAM file's, then the GeoJP2 box's, then the GMLJP2
    coverage's, then a world file's (a `.prj` only where none gives a CRS).
    """
    if not context.raster.georef:
        return image
    found = _jp2.georef(structure, name)
    if sidecars is not None:
        found = sidecars.georef(found)
    if found.geotransform is None and not found.epsg:
        return image  # Neither box: stored as unknown.
    return with_georef(image, found)

