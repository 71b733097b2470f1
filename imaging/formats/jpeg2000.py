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
"""

from __future__ import annotations

import io

from PIL import Image

from imaging import jp2 as _jp2
from imaging import raster as _raster
from imaging.errors import ImageRejected
from imaging.formats import _pil
from imaging.formats._shared import Context, ValidImage, stored_raster, with_georef

__all__ = ["images"]


def images(data: bytes, name: str, fmt: str, context: Context) -> list[ValidImage]:
    """The one image of a JPEG 2000 file.

    Raises:
      ImageRejected: 'corrupt' for a damaged header or codestream;
        'too_large' above --max_pixels (samples: height x width x
        components, as for TIFF rasters); 'unsupported_dtype' for
        subsampled components (they are no bands of one grid);
        'missing_bands' and the others of `imaging.raster.apply_options`.
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
    photo = (not signed and max(bits) == 8 and components in (1, 3)
             and context.raster.reads_pixels_as_default)
    if photo:
        png = _pil.encode(Image.fromarray(array[:, :, 0] if components == 1 else array), "png")
        image = context.fit(context.stored(png, "jpeg2000", ("reencode_jpeg2000_to_png",), name), name)
    else:
        r = _raster.apply_options(array, None, context.raster, name)
        image = stored_raster(r, name, "jpeg2000", context)
    return [_with_georef(image, structure, name, context)]


def _with_georef(image: ValidImage, structure: _jp2.Jp2Structure, name: str, context: Context) -> ValidImage:
    """The image with its GeoJP2 or GMLJP2 georeferencing (--raster_georef), scaled to its stored size."""
    if not context.raster.georef:
        return image
    found = _jp2.georef(structure, name)
    if found.geotransform is None and not found.epsg:
        return image  # Neither box: stored as unknown.
    return with_georef(image, found)

