"""Validation and normalisation of one image file.

Every image is decoded with TensorFlow's own decode ops (the ones the reader
runs), so nothing undecodable reaches a shard. Valid JPEG and PNG files are kept
byte for byte; what TensorFlow cannot decode, or would show differently from
how a person sees the file, is normalised and the action recorded:

- EXIF-rotated photos are turned upright (re-encoded JPEG);
- transparent images are flattened onto a background colour (PNG);
- GIF keeps its first frame, and formats TF lacks or decodes as animations
  (TIFF, BMP, WebP, ...) are re-encoded losslessly as PNG.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from imaging import dicom as _dicom
from imaging import georef as _georef
from imaging import raster as _raster
from imaging import resize as _resize
from imaging.errors import ImageRejected
from imaging.sniff import JpegHeader, jpeg_header, sniff_format
import schemas
from schemas import _tf

__all__ = ["ValidationOptions", "ValidImage", "ImageValidator"]

# Errors Pillow raises on damaged or hostile files: its plugins use OSError for
# truncation, SyntaxError and ValueError for bad headers, EOFError for missing
# frames, struct.error for short chunks, TypeError for a TIFF page without
# dimensions ("Missing dimensions", met when seeking its frames).
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, TypeError,
               Image.DecompressionBombError)

_EXIF_ORIENTATION = 0x0112

# Sizes of the batches `validate_many` decodes in one TensorFlow run: a run
# of any length is split into these (55 = 32 + 16 + 4 + 2 + 1), so no image
# is decoded twice to pad a batch, and at most len(_BATCH_SIZES) graphs are
# built per process.
_BATCH_SIZES = (64, 32, 16, 8, 4, 2, 1)

# Re-encoded photos (EXIF rotation) keep JPEG's size; quality 95 with 4:4:4
# chroma keeps the re-encoding error below what the eye notices.
_JPEG_QUALITY = 95


@dataclasses.dataclass(frozen=True)
class ValidImage:
    """An image ready to be stored.

    Attributes:
      data: Encoded bytes to store (the original bytes unless normalised).
      format: 'jpeg' or 'png'.
      height, width, channels: Shape of the decoded image.
      source_format: What the input was ('jpeg', 'png', 'gif', 'tiff', ...).
      actions: Normalisations applied, e.g. ('exif_transpose',); empty when the
        original bytes are stored.
      frame: For one frame of a multi-frame file kept with every frame, its
        index (the record's filename says which frame); otherwise None.
      tags: Requested DICOM tags as strings (keyword to value).
      details: What a conversion applied, JSON-safe (DICOM provenance).
      page: For one page of a multi-page TIFF kept with every page, its index
        (the record's filename says which page); otherwise None.
      band_stats: Per-band `schemas.BandStats` of a raster read by
        imaging/raster.py, for the manifest; None for other images.
      georef: With --raster_georef, the `imaging.georef.Georef` of a TIFF's
        page for the pixels as stored (resizing scales its pixel size); None
        when not asked for or not a TIFF (stored as "unknown").
    """

    data: bytes
    format: str
    height: int
    width: int
    channels: int
    source_format: str
    actions: tuple[str, ...] = ()
    frame: int | None = None
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    details: Mapping[str, Any] | None = None
    page: int | None = None
    band_stats: schemas.BandStats | None = None
    georef: _georef.Georef | None = None


@dataclasses.dataclass(frozen=True)
class ValidationOptions:
    """How files are checked and normalised; validated when built.

    Attributes:
      max_pixels: Images with more pixels are rejected as 'too_large' before
        any pixel is decoded (decompression bombs) (--max_pixels). DICOM files
        are held to the same limit: `dicom.max_pixels` is set to it.
      background: RGB colour that transparent pixels are flattened onto
        (--background).
      full_decode: Decode JPEGs at full resolution (--full_decode). By default
        libjpeg decodes at 1/8 scale, which still reads and checks every
        entropy-coded byte (a truncated or damaged stream fails the same way)
        at a fraction of the cost.
      dicom: How DICOM files are rendered (`DicomOptions`).
      resize: The size images are stored at (`imaging.resize.ResizeOptions`,
        --max_side/--min_side); by default none is resized.
      raster: How TIFF rasters are read (`imaging.raster.RasterOptions`);
        held to `max_pixels` as `dicom` is.

    Raises:
      ValueError: Naming the flag, what it allows and what it received.
    """

    # One definition of the default: DicomOptions' (Pillow's decompression-bomb
    # error limit), which DICOM files are held to when used on their own.
    max_pixels: int = _dicom.DicomOptions.max_pixels
    background: tuple[int, int, int] = (255, 255, 255)
    full_decode: bool = False
    dicom: _dicom.DicomOptions = dataclasses.field(default_factory=_dicom.DicomOptions)
    resize: _resize.ResizeOptions = dataclasses.field(default_factory=_resize.ResizeOptions)
    raster: _raster.RasterOptions = dataclasses.field(default_factory=_raster.RasterOptions)

    def __post_init__(self):
        if isinstance(self.max_pixels, bool) or not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise ValueError(f"--max_pixels must be at least 1. Received: {self.max_pixels}")
        background = tuple(self.background)
        if len(background) != 3 or not all(0 <= c <= 255 for c in background):
            raise ValueError(f"--background must be R,G,B in 0-255. Received: {self.background}")
        object.__setattr__(self, "background", background)
        if not isinstance(self.dicom, _dicom.DicomOptions):
            raise ValueError(f"dicom must be an imaging.DicomOptions. Received: {self.dicom!r}")
        if not isinstance(self.resize, _resize.ResizeOptions):
            raise ValueError(f"resize must be an imaging.ResizeOptions. Received: {self.resize!r}")
        if self.dicom.max_pixels != self.max_pixels:
            object.__setattr__(self, "dicom", dataclasses.replace(self.dicom, max_pixels=self.max_pixels))
        if not isinstance(self.raster, _raster.RasterOptions):
            raise ValueError(f"raster must be an imaging.RasterOptions. Received: {self.raster!r}")
        if self.raster.max_pixels != self.max_pixels:
            object.__setattr__(self, "raster", dataclasses.replace(self.raster, max_pixels=self.max_pixels))


class ImageValidator:
    """Validates and normalises encoded images.

    Built once per worker (it imports TensorFlow); `validate` is then called
    per file.

        ImageValidator(ValidationOptions(max_pixels=50_000_000, full_decode=True))
        ImageValidator(max_pixels=50_000_000, full_decode=True)  # the same

    Args:
      options: The `ValidationOptions`; None for the defaults.
      **overrides: Fields of `ValidationOptions` to set (on top of `options`).

    Raises:
      ValueError: From `ValidationOptions`, for a bad value.
    """

    def __init__(self, options: ValidationOptions | None = None, **overrides):
        if options is None:
            options = ValidationOptions(**overrides)
        elif overrides:
            options = dataclasses.replace(options, **overrides)
        self._max_pixels = options.max_pixels
        self._background = options.background
        self._jpeg_ratio = 1 if options.full_decode else 8
        self._dicom = options.dicom
        self._resize = options.resize
        self._raster = options.raster

    @functools.cached_property
    def _ops(self):
        # Heavy (~2 s of CPU, ~300 MB): only the decode ops (see
        # schemas/_tf.py), not TensorFlow's whole Python API, and only once a
        # file needs them: rasters stored raw never do.
        return _tf.image_ops()

    def load_decoders(self) -> None:
        """Loads TensorFlow's decode ops now rather than at the first file that needs them."""
        self._ops  # noqa: B018 (the property loads them)

    def validate_all(self, data: bytes, name: str) -> list[ValidImage]:
        """Checks one file's bytes; a multi-frame DICOM file may give several images.

        Raises:
          ImageRejected: With the reason the file cannot be stored.
        """
        fmt = sniff_format(data[:132]) if data else None
        if data and (fmt == "dicom" or _dicom.is_dicom(data[:1024])):
            return [self._fit(frame, name) for frame in self._dicom_frames(data, name)]
        if fmt == "tiff":
            # One parse of the header says who reads it, and decodes a raster.
            rasters = _raster.read_tiff(data, name, self._raster)
            if rasters is not None:
                return self._with_georef(self._rasters(rasters, name), data, name)
            # What `validate` does for a TIFF (no JPEG resize path), less asking again.
            return self._with_georef([self._fit(self._validate(data, name, pillow_tiff=True), name)],
                                     data, name)
        return self._with_georef([self.validate(data, name)], data, name)

    def _with_georef(self, images: list[ValidImage], data: bytes, name: str) -> list[ValidImage]:
        """TIFF images with their page's georeferencing (--raster_georef), true for the stored pixels.

        A resize scales the pixel size (listed: 'scale_geotransform', with the
        file's own geotransform in the details). Pixels turned by EXIF
        orientation no longer match the file's grid: their georeferencing is
        dropped, and listed ('drop_georef'), rather than stored wrong.
        """
        if not self._raster.georef or sniff_format(data[:132]) != "tiff":
            return images
        pages = _georef.read_georef(data, name)
        out = []
        for image in images:
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

    def _rasters(self, rasters: list[_raster.Raster], name: str) -> list[ValidImage]:
        """A TIFF's pages read by imaging/raster.py: every band and bit, PNG or raw (see there)."""
        out = []
        for r in rasters:
            array, actions = r.array, r.actions
            if self._resize.active and not self._resize.allows(*array.shape[:2]):
                # The one size cap for every kind of input (--max_side/--min_side).
                original = array.shape[:2]
                array = _resize.resize_array(array, self._resize)
                actions = actions + (self._resize.action,)
                details = {**(r.details or {}), "original": list(original), "stored": list(array.shape[:2])}
                r = dataclasses.replace(r, array=array, actions=actions, details=details)
            h, w, c = array.shape
            stats = _raster.band_stats(array, r.nodata)
            if _raster.is_png_storable(array):
                if array.dtype == np.uint8:
                    # Pillow's encoder, as for the 8-bit TIFFs Pillow reads.
                    png = _encode(Image.fromarray(array[:, :, 0] if c == 1 else array), "png")
                else:
                    png = _raster.png_bytes(array)
                try:
                    image = self._checked(png, "tiff", ("reencode_tiff_to_png",) + actions, name)
                except self._ops.OpError as e:
                    raise ImageRejected("corrupt", f"{name}: {_tf_message(e)}") from e
                out.append(dataclasses.replace(image, page=r.page, details=r.details, band_stats=stats))
            else:
                out.append(ValidImage(_raster.raw_bytes(array), schemas.raw_format(array.dtype), h, w, c,
                                      "tiff", ("store_tiff_as_raw",) + actions, page=r.page,
                                      details=r.details, band_stats=stats))
        return out

    def validate_many(self, items: Sequence[tuple[bytes, str]]) -> list[list[ValidImage] | ImageRejected]:
        """Checks many files at once: for each, what `validate_all` returns or raises.

        Ordinary upright JPEGs (those `validate` keeps byte for byte after one
        decode) are decoded together, up to 64 in one TensorFlow run on its
        own threads: one op call per image costs more CPU than decoding a small
        JPEG at 1/8 scale. A batch in which any image fails is decoded again
        one image at a time by `validate_all`, so rejects and their messages
        are exactly its. Every other file goes through `validate_all`.

        Args:
          items: (data, name) of each file: its bytes and its relative path.

        Returns:
          One entry per item, in order: its images, or the `ImageRejected` it
          was rejected with (returned, not raised).
        """
        results: list = [None] * len(items)
        batch: list[tuple[int, ValidImage]] = []
        for i, (data, name) in enumerate(items):
            image = self._batchable_jpeg(data, name)
            if image is None:
                results[i] = self._validate_or_reject(data, name)
            else:
                batch.append((i, image))
        start = 0
        for size in _BATCH_SIZES:
            while len(batch) - start >= size:
                self._decode_batch(items, batch[start:start + size], results)
                start += size
        return results

    def _batchable_jpeg(self, data: bytes, name: str) -> ValidImage | None:
        """What `validate` returns for `data` if it is an ordinary upright JPEG that TF decodes, else None.

        The conditions of `validate`'s `_plain_jpeg` path (a JPEG never looks
        like DICOM: `dicom.is_dicom`); None also where no batch decoder is
        available, or for a header over --max_pixels (`validate` says so).
        """
        if not data or sniff_format(data[:132]) != "jpeg":
            return None
        header = jpeg_header(data)
        if header is None or header.orientation in range(2, 9):
            return None
        if header.width * header.height > self._max_pixels:
            return None
        if self._resize.active and not self._resize.allows(header.height, header.width):
            return None  # Resized by `validate` (--max_side/--min_side).
        return ValidImage(data, "jpeg", header.height, header.width, header.components, "jpeg")

    def _decode_batch(self, items, batch: list[tuple[int, ValidImage]], results: list) -> None:
        """Decodes a batch of ordinary JPEGs in one run; one at a time if any fails."""
        decode = _tf.jpeg_batch_decoder(len(batch), self._jpeg_ratio)
        if decode is not None:
            try:
                decode([image.data for _, image in batch])
            except self._ops.OpError:
                pass  # Which image failed, and why: `validate` says, below.
            else:
                for i, image in batch:
                    results[i] = [image]
                return
        for i, _ in batch:
            results[i] = self._validate_or_reject(*items[i])

    def _validate_or_reject(self, data: bytes, name: str) -> list[ValidImage] | ImageRejected:
        try:
            return self.validate_all(data, name)
        except ImageRejected as e:
            return e

    def _dicom_frames(self, data: bytes, name: str) -> list[ValidImage]:
        out = []
        all_frames = self._dicom.frames == "all"
        for frame in _dicom.decode_dicom(data, name, self._dicom):
            try:
                checked = self._checked(frame.png, "dicom", ("dicom_to_png",), name)
            except self._ops.OpError as e:
                raise ImageRejected("corrupt", f"{name}: {_tf_message(e)}") from e
            out.append(dataclasses.replace(
                checked,
                frame=frame.frame if all_frames and frame.num_frames > 1 else None,
                tags=dict(frame.tags),
                details=frame.provenance,
            ))
        return out

    def validate(self, data: bytes, name: str) -> ValidImage:
        """Checks one file's bytes (one image; see `validate_all` for DICOM).

        Args:
          data: The whole file.
          name: Its relative path, for messages.

        Returns:
          The image to store, at the size `ValidationOptions.resize` asks for.

        Raises:
          ImageRejected: With the reason the file cannot be stored.
        """
        if self._resize.active and data[:2] == b"\xff\xd8":
            header = jpeg_header(data)
            if header is not None and not self._resize.allows(header.height, header.width):
                return self._resized_jpeg(data, header, name)
        return self._fit(self._validate(data, name), name)

    def _validate(self, data: bytes, name: str, pillow_tiff: bool = False) -> ValidImage:
        """`validate` less the resize of JPEGs; `pillow_tiff`: `read_tiff` left this TIFF to Pillow."""
        if not data:
            raise ImageRejected("empty_file", f"{name} has zero bytes")
        fmt = sniff_format(data[:132])
        if fmt == "dicom" or _dicom.is_dicom(data[:1024]):
            frames = self._dicom_frames(data, name)
            if len(frames) != 1:
                raise ValueError(f"{name} has {len(frames)} frames: use validate_all")
            return frames[0]
        if fmt == "jpeg":
            header = jpeg_header(data)
            if header is not None and header.orientation not in range(2, 9):
                return self._plain_jpeg(data, header, name)
        rasters = _raster.read_tiff(data, name, self._raster) if fmt == "tiff" and not pillow_tiff else None
        if rasters is not None:
            images = self._rasters(rasters, name)
            if len(images) != 1:
                raise ValueError(f"{name} has {len(images)} pages: use validate_all")
            return images[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            try:
                im = _open(data)
            except UnidentifiedImageError:
                if fmt is None:
                    raise ImageRejected(
                        "not_an_image", f"{name} is not in a known image format"
                    ) from None
                raise ImageRejected(
                    "corrupt", f"{name} looks like {fmt.upper()} but its header is damaged"
                ) from None
            except _PIL_ERRORS as e:
                raise ImageRejected("corrupt", f"{name}: unreadable header ({e})") from e
            fmt = fmt or (im.format or "unknown").lower()
            width, height = im.size
            self._check_pixels(width, height, name)
            if width == 0 or height == 0:
                raise ImageRejected("corrupt", f"{name} has an empty size {width}x{height}")
            try:
                if fmt == "jpeg":
                    return self._jpeg(data, im, name)
                if fmt == "png":
                    return self._png(data, im, name)
                return self._reencode(im, fmt, name)
            except _PIL_ERRORS as e:
                raise ImageRejected("corrupt", f"{name}: {e}") from e
            except self._ops.OpError as e:
                raise ImageRejected("corrupt", f"{name}: {_tf_message(e)}") from e

    def _resized_jpeg(self, data: bytes, header: JpegHeader, name: str) -> ValidImage:
        """A JPEG larger than --max_side/--min_side: decoded once, at libjpeg's reduced scale.

        That decode is the validation too (TF's op reads every entropy-coded
        byte at any scale); what is stored is checked by `_checked`.
        """
        self._check_pixels(header.width, header.height, name)
        ratio = _resize.jpeg_scale(header.height, header.width, self._resize)
        try:
            pixels = np.asarray(self._ops.decode_jpeg(data, ratio=ratio))
        except self._ops.OpError as e:
            raise ImageRejected("corrupt", f"{name}: {_tf_message(e)}") from e
        actions = ("exif_transpose",) if header.orientation in range(2, 9) else ()
        upright = _resize.orient_array(pixels, header.orientation)
        # The upright size at full scale: what a viewer shows, what the cap applies to.
        full = (header.height, header.width) if upright.shape[:2] == pixels.shape[:2] \
            else (header.width, header.height)
        return self._store_resized(upright, full, "jpeg", "jpeg", actions, None, name)

    def _fit(self, image: ValidImage, name: str) -> ValidImage:
        """`image` scaled down to --max_side/--min_side when larger; itself otherwise."""
        if not self._resize.active or self._resize.allows(image.height, image.width):
            return image
        if image.format == "jpeg":
            pixels = self._ops.decode_jpeg(image.data)
        else:
            pixels = self._ops.decode_png(image.data, dtype=self._png_dtype(image.data))
        return self._store_resized(np.asarray(pixels), (image.height, image.width), image.format,
                                   image.source_format, image.actions, image.details, name,
                                   frame=image.frame, tags=image.tags)

    def _store_resized(self, pixels, original, fmt, source_format, actions, details, name, **fields):
        small = _resize.resize_array(pixels, self._resize)
        out = _resize.encode(small, fmt, self._resize.jpeg_quality)
        try:
            image = self._checked(out, source_format, (*actions, self._resize.action), name)
        except self._ops.OpError as e:
            raise ImageRejected("corrupt", f"{name}: {_tf_message(e)}") from e
        sizes = {"original": list(original), "stored": [image.height, image.width]}
        return dataclasses.replace(image, details={**(details or {}), **sizes}, **fields)

    def _check_pixels(self, width: int, height: int, name: str) -> None:
        """Rejects decompression bombs from the header's size, before any decoding."""
        if width * height > self._max_pixels:
            raise ImageRejected(
                "too_large",
                f"{name} is {width}x{height} = {width * height:,} pixels, more than "
                f"--max_pixels={self._max_pixels:,}",
            )

    def _plain_jpeg(self, data: bytes, header: JpegHeader, name: str) -> ValidImage:
        """An upright 8-bit JPEG whose markers were read by `jpeg_header`: TF decodes it."""
        self._check_pixels(header.width, header.height, name)
        try:
            # Kept byte for byte; the decode only proves TF can read every byte.
            self._ops.decode_jpeg(data, ratio=self._jpeg_ratio)
        except self._ops.OpError as e:
            raise ImageRejected("corrupt", f"{name}: {_tf_message(e)}") from e
        return ValidImage(data, "jpeg", header.height, header.width, header.components, "jpeg")

    def _jpeg(self, data: bytes, im: Image.Image, name: str) -> ValidImage:
        orientation = im.getexif().get(_EXIF_ORIENTATION, 1)
        if orientation not in (1, None) and 2 <= int(orientation) <= 8:
            # TF ignores EXIF: without this the model would see the photo on
            # its side while every image viewer shows it upright.
            upright = ImageOps.exif_transpose(im)
            upright = _to_storable_mode(upright, self._background)
            out = _encode(upright, "jpeg" if upright.mode in ("L", "RGB") else "png")
            return self._checked(out, "jpeg", ("exif_transpose",), name)
        # Kept byte for byte; the decode only proves TF can read every byte.
        self._ops.decode_jpeg(data, ratio=self._jpeg_ratio)
        channels = 1 if im.mode == "L" else 3
        return ValidImage(data, "jpeg", im.height, im.width, channels, "jpeg")

    def _png(self, data: bytes, im: Image.Image, name: str) -> ValidImage:
        if _has_transparency(im):
            flat = _to_storable_mode(im, self._background)
            return self._checked(_encode(flat, "png"), "png", ("flatten_alpha",), name)
        # An alpha channel that is opaque everywhere is kept as it is.
        decoded = self._ops.decode_png(data, dtype=self._png_dtype(data))
        h, w, c = decoded.shape
        return ValidImage(data, "png", int(h), int(w), int(c), "png")

    def _reencode(self, im: Image.Image, fmt: str, name: str) -> ValidImage:
        actions = [f"reencode_{fmt}_to_png"]
        if getattr(im, "n_frames", 1) > 1:
            actions.append("first_frame")
        im.seek(0)
        if im.getexif().get(_EXIF_ORIENTATION, 1) not in (1, None):
            im = ImageOps.exif_transpose(im)
            actions.append("exif_transpose")
        if _has_transparency(im):
            actions.append("flatten_alpha")
        flat = _to_storable_mode(im, self._background)
        return self._checked(_encode(flat, "png"), fmt, tuple(actions), name)

    def _png_dtype(self, data: bytes):
        # Byte 24 is the IHDR bit depth: decoding 16-bit PNGs as uint16 checks
        # them exactly as a reader asking for 16 bits would.
        return self._ops.uint16 if data[24] == 16 else self._ops.uint8

    def _checked(self, out: bytes, source_format: str, actions, name: str) -> ValidImage:
        """Decodes normalised bytes with TF, so what is stored is what TF reads."""
        fmt = "jpeg" if out.startswith(b"\xff\xd8") else "png"
        if fmt == "jpeg":
            decoded = self._ops.decode_jpeg(out)
        else:
            decoded = self._ops.decode_png(out, dtype=self._png_dtype(out))
        h, w, c = decoded.shape
        return ValidImage(out, fmt, int(h), int(w), int(c), source_format, tuple(actions))


def _tf_message(e) -> str:
    # TF prefixes op errors with a long '{{function_node ...}}' tag.
    text = getattr(e, "message", str(e))
    return text.split("}}")[-1].strip() or text


def _open(data: bytes) -> Image.Image:
    """`Image.open`, but the pixel count is checked by the validator, not by Pillow.

    The validator checks the header's size against --max_pixels itself, before
    decoding. Pillow's own guard (`Image.MAX_IMAGE_PIXELS`, a module global:
    setting it would change it for the whole process) refuses headers above
    twice its limit; such a header is opened again by the format's own opener,
    which reads the header without that check, so the validator can say how
    large it is (or accept it, under a larger --max_pixels).
    """
    try:
        return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        return _open_without_pixel_limit(data)


def _open_without_pixel_limit(data: bytes) -> Image.Image:
    # What `Image.open` does for bytes (Pillow 10 to 12), less the pixel check:
    # the registered openers in order, the common plugins first.
    prefix, tried = data[:16], set()
    for load_plugins in (Image.preinit, Image.init):
        load_plugins()
        for fmt in [f for f in Image.ID if f not in tried]:
            tried.add(fmt)
            factory, accept = Image.OPEN[fmt]
            accepted = not accept or accept(prefix)
            if not accepted or isinstance(accepted, str):
                continue
            try:
                return factory(io.BytesIO(data), "")
            except (SyntaxError, IndexError, TypeError, struct.error):
                continue  # As Image.open: the next format may read it.
    raise UnidentifiedImageError("cannot identify image file")


def _has_transparency(im: Image.Image) -> bool:
    """True when some pixel is not fully opaque (decodes the pixels)."""
    if im.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        alpha = im.getchannel("A")
        return alpha.getextrema()[0] < 255
    if "transparency" in im.info:
        rgba = im.convert("RGBA")
        return rgba.getchannel("A").getextrema()[0] < 255
    return False


def _to_storable_mode(im: Image.Image, background) -> Image.Image:
    """Converts to L, RGB or 16-bit grey, flattening transparency."""
    if im.mode in ("I", "F", "I;16", "I;16B", "I;16L", "I;16N"):
        arr = np.asarray(im)
        if arr.dtype.kind == "f":
            arr = np.nan_to_num(arr)
        return Image.fromarray(np.clip(arr, 0, 65535).astype(np.uint16))
    if im.mode in ("RGBA", "LA", "PA", "P", "La", "RGBa") or "transparency" in im.info:
        rgba = im.convert("RGBA")
        if rgba.getchannel("A").getextrema()[0] < 255:
            base = Image.new("RGBA", rgba.size, tuple(background) + (255,))
            rgba = Image.alpha_composite(base, rgba)
        grey = im.mode in ("LA", "La") or (im.mode == "L" and "transparency" in im.info)
        return rgba.convert("L" if grey else "RGB")
    if im.mode in ("1", "L"):
        return im.convert("L")
    return im.convert("RGB")


def _encode(im: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    if fmt == "jpeg":
        im.save(buf, "JPEG", quality=_JPEG_QUALITY, subsampling=0)
    else:
        # Level 6 gives most of the size win at a fraction of level 9's time.
        im.save(buf, "PNG", compress_level=6)
    return buf.getvalue()
