"""Validation and normalisation of one image file.

Every image is decoded with TensorFlow's own decode ops (the ones the reader
runs), so nothing undecodable reaches a shard; plain PNGs are instead checked
on everything that decode can fail on (`imaging.formats._png_fast`), and plain
JPEGs decoded by Pillow's libjpeg-turbo where that proves TensorFlow decodes
them (`imaging.formats._jpeg_fast`). Valid JPEG and PNG files are kept
byte for byte; what TensorFlow cannot decode, or would show differently from
how a person sees the file, is normalised and the action recorded:

- EXIF-rotated photos are turned upright (re-encoded JPEG);
- transparent images are flattened onto a background colour (PNG);
- GIF keeps its first frame, and formats TF lacks or decodes as animations
  (TIFF, BMP, WebP, ...) are re-encoded losslessly as PNG.

A file's format is sniffed once and one handler of `imaging.formats` reads
it; this module holds the options and the batched decoding of small JPEGs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from imaging import dicom as _dicom
from imaging import formats as _formats
from imaging import raster as _raster
from imaging import resize as _resize
from imaging.errors import ImageRejected
from imaging.formats import ValidImage
from imaging.formats import jpeg as _jpeg
from imaging.sniff import sniff_format

if TYPE_CHECKING:  # Imported where given: a conversion of photos never loads them.
    from imaging import time_series as _time_series
    from imaging import volumes as _volumes

__all__ = ["ValidationOptions", "ValidImage", "ImageValidator"]

# Sizes of the batches `validate_many` decodes in one TensorFlow run: a run
# of any length is split into these (55 = 32 + 16 + 4 + 2 + 1), so no image
# is decoded twice to pad a batch, and at most len(_BATCH_SIZES) graphs are
# built per process.
_BATCH_SIZES = (64, 32, 16, 8, 4, 2, 1)


def _nothing(i: int) -> None:
    """`validate_many`'s `on_file` when none is given."""


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
      time_series: With --time_series, how each location's passes become
        one stack (`imaging.time_series.TimeSeriesOptions`); held to
        `max_pixels` and cut by `raster.patch`. None: one record per image.
      volumes: With --volumes, how DICOM series and NIfTI files become volume
        records (`imaging.volumes.VolumeOptions`). None: not volumes.

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
    time_series: _time_series.TimeSeriesOptions | None = None
    volumes: _volumes.VolumeOptions | None = None

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
        if self.time_series is not None:
            from imaging import time_series as _time_series

            if not isinstance(self.time_series, _time_series.TimeSeriesOptions):
                raise ValueError("time_series must be an imaging.time_series.TimeSeriesOptions or None. "
                                 f"Received: {self.time_series!r}")
            wanted = dataclasses.replace(self.time_series, max_pixels=self.max_pixels, patch=self.raster.patch)
            if wanted != self.time_series:
                object.__setattr__(self, "time_series", wanted)
        if self.volumes is not None:
            from imaging import volumes as _volumes

            if not isinstance(self.volumes, _volumes.VolumeOptions):
                raise ValueError(
                    f"volumes must be an imaging.volumes.VolumeOptions or None. Received: {self.volumes!r}")


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
        self._context = _formats.Context(options)

    def load_decoders(self) -> None:
        """Loads TensorFlow's decode ops now rather than at the first file that needs them."""
        self._context.ops  # noqa: B018 (the property loads them)

    def validate_all(self, data: bytes, name: str, sidecars=None) -> list[ValidImage]:
        """Checks one file's bytes; a multi-frame DICOM file or multi-page TIFF may give several images.

        `sidecars`: what a TIFF's or a JPEG 2000's GIS sidecars say (`imaging.sidecars.load`), or None.

        Raises:
          ImageRejected: With the reason the file cannot be stored.
        """
        return _formats.images(data, name, self._context, sidecars)

    def validate(self, data: bytes, name: str) -> ValidImage:
        """Checks one file's bytes (one image; see `validate_all` for DICOM).

        Args:
          data: The whole file.
          name: Its relative path, for messages.

        Returns:
          The image to store, at the size `ValidationOptions.resize` asks for.

        Raises:
          ImageRejected: With the reason the file cannot be stored.
          ValueError: For a file of several frames or pages.
        """
        images = _formats.images(data, name, self._context)
        if len(images) != 1:
            parts = "frames" if _formats.format_of(data) == "dicom" else "pages"
            raise ValueError(f"{name} has {len(images)} {parts}: use validate_all")
        return images[0]

    def validate_many(self, items: Sequence[tuple[bytes, str]],
                      on_file: Callable[[int], None] | None = None,
                      sidecars: Mapping[str, Any] | None = None) -> list[list[ValidImage] | ImageRejected]:
        """Checks many files at once: for each, what `validate_all` returns or raises.

        Ordinary upright JPEGs (those `validate` keeps byte for byte after one
        decode) are decoded together, up to 64 in one TensorFlow run on its
        own threads: one op call per image costs more CPU than decoding a small
        JPEG at 1/8 scale. A batch in which any image fails is decoded again
        one image at a time by `validate_all`, so rejects and their messages
        are exactly its. Every other file goes through `validate_all`.

        Args:
          items: (data, name) of each file: its bytes and its relative path.
          on_file: Called with i as the work on the i-th item alone starts,
            and with -1 as work on several starts (a batch's decode, the
            header checks of the JPEGs that may join one): the conversion's
            journal, so that its watchdog times each file (`conversion.guard`).
          sidecars: Name -> what that file's GIS sidecars say
            (`imaging.sidecars.Sidecars`), for the TIFFs that have some.

        Returns:
          One entry per item, in order: its images, or the `ImageRejected` it
          was rejected with (returned, not raised).
        """
        on_file = on_file or _nothing
        results: list = [None] * len(items)
        batch: list[tuple[int, ValidImage]] = []
        for i, (data, name) in enumerate(items):
            # A JPEG's signature never passes `dicom.is_dicom`'s bare-dataset
            # check, so the sniff alone says which files may join a batch.
            image = _jpeg.batchable(data, self._context) if sniff_format(data[:132]) == "jpeg" else None
            if image is None:
                on_file(i)
                results[i] = self._validate_or_reject(data, name, sidecars and sidecars.get(name))
                on_file(-1)
            else:
                batch.append((i, image))
        start = 0
        for size in _BATCH_SIZES:
            while len(batch) - start >= size:
                group = batch[start:start + size]
                on_file(-1)
                if _jpeg.decode_together([image for _, image in group], self._context):
                    for i, image in group:
                        results[i] = [image]
                else:
                    # Which image failed, and why: `validate_all` says.
                    for i, _ in group:
                        on_file(i)
                        results[i] = self._validate_or_reject(*items[i])
                start += size
        return results

    def _validate_or_reject(self, data: bytes, name: str, sidecars=None) -> list[ValidImage] | ImageRejected:
        try:
            return self.validate_all(data, name, sidecars)
        except ImageRejected as e:
            return e
