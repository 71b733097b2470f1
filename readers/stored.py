"""What a split stores, and how the reader decodes it: photos, rasters or both.

The manifest's image stats (`schemas.ImageStats.formats`) say which formats a
split holds: 'jpeg' and 'png' (photos, decoded by `readers.decode` to the
`color_mode`'s channels) and 'raw-<dtype>' (rasters: every band, as stored,
`readers.decode.decode_raw`). `plan` resolves the reader's image options
against them once, before the pipeline is built:

- A split of photos only is read as it always was (`plan` returns None);
  `color_mode=None` and `dtype=None` mean its stored channels and sample
  dtype, as the manifest records them (`schemas.ImageStats.layouts`, e.g.
  16-bit RGB PNGs read as uint16 (h, w, 3)), resolved by `photo_options`
  and refused where the split holds several or the manifest does not say.
- A split of rasters yields every band (`color_mode=None`) in the stored
  dtype (`dtype=None`), values exactly as stored; with `image_size`, a float
  `dtype` and `augment`, through the usual crop, flip and resize (done after
  decoding: there is no JPEG decoder to fuse the crop with).
- Photos and rasters, or rasters of several dtypes, share one output only
  with a given `dtype` (and, with photos, a `color_mode` whose channels are
  the rasters' band count); otherwise they are refused here, naming what the
  split holds and what to pass.

- A split of rasters only that is stored as PNG (1, 3 or 4 bands of 8 or 16
  bits; the manifest records band statistics for a split only when every
  record is a raster) is read by the photo pipeline, but at the stored depth
  (`png_raster_depth`): its values are kept, as raw-stored ones are, where a
  photo split's come out in 0-255.

`normalize='dataset'` (splits of rasters only, however stored) takes the
per-band mean and std the converter recorded for the train split (`dataset_band_stats`): statistics of the data being
evaluated would leak into training otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import tensorflow as tf

from readers import decode, preprocess
from schemas.features import CHANNELS, FORMAT, HEIGHT, IMAGE, WIDTH, parse_raw_format, raw_format
from schemas.manifest import ImageStats, Manifest, ManifestError

__all__ = [
    "BandStats",
    "RasterPlan",
    "STATS_SPLIT",
    "dataset_band_stats",
    "split_band_stats",
    "stored_formats",
    "photo_options",
    "is_raster_split",
    "plan",
    "png_raster_depth",
]

logger = logging.getLogger(__name__)

# The split whose statistics `normalize='dataset'` uses, whatever split is read.
STATS_SPLIT = "train"
# Features a raster record is decoded from, besides the image bytes.
SHAPE_KEYS = (FORMAT.key, HEIGHT.key, WIDTH.key, CHANNELS.key)


@dataclasses.dataclass(frozen=True)
class BandStats:
    """Per-band statistics of one split, as the converter recorded them.

    Attributes:
      mean, std: One value per band, band order as stored; None for a band
        with no valid sample (nodata everywhere), refused only where
        `normalize='dataset'` would divide by it (`dataset_band_stats`).
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def bands(self) -> int:
        return len(self.mean)


def split_band_stats(manifest: Manifest, split: str) -> BandStats | None:
    """The per-band mean and std the manifest records for `split`, or None.

    The one place the reader takes them from: `SplitInfo.band_stats`, merged
    exactly from the shards' statistics the converter accumulated while it
    wrote them (None unless every record of the split is a raster with the
    same number of bands). Every split's are loaded with the split read, so a
    band without a valid sample is no error here: only normalising with it is.
    """
    stats = manifest.split(split).band_stats
    if stats is None:
        return None
    return BandStats(mean=tuple(stats.mean), std=tuple(stats.std))


def dataset_band_stats(band_stats: Mapping[str, BandStats], data_dir: str) -> BandStats:
    """The statistics `normalize='dataset'` uses: those of the train split.

    Raises:
      ManifestError: If the manifest records none for the train split, or a
        band of it has no valid sample (nodata everywhere), so no std.
    """
    stats = band_stats.get(STATS_SPLIT)
    if stats is None:
        raise ManifestError(
            f"normalize='dataset' needs the per-band statistics of the {STATS_SPLIT!r} split, "
            f"which the manifest of {data_dir!r} does not record (converted by a shardsmith "
            f"that did not compute them, or without a {STATS_SPLIT!r} split): convert the "
            "images again, or pass normalize=(mean, std). Received: normalize='dataset'"
        )
    if any(std is None for std in stats.std):
        empty = [b + 1 for b, std in enumerate(stats.std) if std is None]
        raise ManifestError(
            f"split {STATS_SPLIT!r} of {data_dir!r} has no valid sample in band(s) {empty} "
            "(all nodata), so no statistics to normalise with: pass normalize=(mean, std). "
            "Received: normalize='dataset'"
        )
    return stats


def stored_formats(stats: ImageStats | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(photo formats, raw dtypes) of a split's image stats, each sorted.

    A manifest without image stats (an older converter) holds photos only.
    """
    if stats is None:
        return (), ()
    photos, raws = [], []
    for fmt, _ in stats.formats:
        dtype = parse_raw_format(fmt)
        (photos if dtype is None else raws).append(fmt if dtype is None else dtype)
    return tuple(photos), tuple(raws)


@dataclasses.dataclass(frozen=True)
class RasterPlan:
    """How the reader decodes a split that holds raw-stored rasters.

    Attributes:
      raw_dtypes: The stored dtypes of its rasters.
      photos: The split holds photos too (decoded to `bands` channels).
      bands: Channels of every output image.
      output_dtype: The dtype of the output images.
      as_stored: Decoded images keep their stored dtype until the end (one
        raw dtype, no resize, no photos); else they are float32 in between.
      one_shape: (height, width, bands) of every raster of a split of one raw
        dtype, one size and one band count (the manifest's image and band
        stats); None otherwise. Batches of such a split decode in one op.
    """

    raw_dtypes: tuple[str, ...]
    photos: bool
    bands: int
    output_dtype: str
    as_stored: bool
    one_shape: tuple[int, int, int] | None = None

    def decodes_by_batch(self, image) -> bool:
        """Whether a batch of this split decodes in one op (`decode_batch`) with these options.

        For a split whose rasters share one shape and dtype, read without
        standard augmentation (a random window per image) or padding.
        """
        return (self.one_shape is not None and not image.standard_augment
                and image.resize in ("stretch", "crop"))

    def decode_batch(self, encoded: tf.Tensor, image) -> tf.Tensor:
        """`decode` of a batch of records at once; the same values, in one decode and resize.

        Args:
          encoded: [N] image bytes of rasters of `one_shape` (see `decodes_by_batch`).
          image: The `ImageOptions`.
        """
        stored = self.raw_dtypes[0]
        pixels = decode.decode_raw_batch(encoded, self.one_shape, stored)
        if image.image_size is None:
            return pixels if self.as_stored else tf.cast(pixels, tf.float32)
        height, width, _ = self.one_shape
        if self._resize_is_identity(image):
            # Integers only: a resize to the same size weighs each pixel 1 and its
            # neighbours exactly 0, which a NaN or inf neighbour would not keep.
            if (stored in _EXACT_IN_FLOAT32 and self.output_dtype == stored
                    and image.scale is None and image.normalize is None):
                # The float32 round trip (cast, round, saturate_cast back) changes nothing.
                return pixels
            return tf.cast(pixels, tf.float32)
        # What `preprocess.fit_image` does per image, for a batch of one size:
        # every image has the same window.
        pixels = tf.cast(pixels, tf.float32)
        if image.resize == "crop":
            window = preprocess.center_crop_window(height, width, image.image_size,
                                                   image.crop_fraction)
            pixels = tf.slice(pixels, tf.concat([[0], window[:2], [0]], 0),
                              tf.concat([[-1], window[2:], [-1]], 0))
        return tf.image.resize(pixels, image.image_size, method=image.interpolation)

    def decode(self, features: Mapping[str, tf.Tensor], image, seed=None) -> tf.Tensor:
        """Decodes and preprocesses one record's image (`image`: the `ImageOptions`)."""
        encoded, fmt = features[IMAGE.key], features[FORMAT.key]
        height, width, channels = features[HEIGHT.key], features[WIDTH.key], features[CHANNELS.key]

        def raster(dtype):
            def fn():
                with tf.control_dependencies([tf.debugging.assert_equal(
                        channels, tf.constant(self.bands, tf.int64),
                        message=f"a raster of this split has another band count than "
                                f"its first ({self.bands}); read it with batch_size=None")]):
                    pixels = decode.decode_raw(encoded, height, width, channels, dtype)
                pixels = tf.ensure_shape(pixels, [None, None, self.bands])
                if image.image_size is not None:
                    return preprocess.fit_image(
                        pixels, image_size=image.image_size, resize=image.resize,
                        crop_fraction=image.crop_fraction, interpolation=image.interpolation,
                        augment=image.standard_augment, seed=seed)
                return pixels if self.as_stored else tf.cast(pixels, tf.float32)
            return fn

        branches = [(tf.equal(fmt, raw_format(d)), raster(d)) for d in self.raw_dtypes]
        if self.photos:
            def photo():
                return preprocess.load_image(
                    encoded, image_size=image.image_size, resize=image.resize,
                    crop_fraction=image.crop_fraction, interpolation=image.interpolation,
                    channels=self.bands, depth=image.depth, augment=image.standard_augment,
                    seed=seed)
            default = photo
        else:
            default = branches.pop()[1]
        if not branches:
            return default()
        return tf.case(branches, default=default, exclusive=True)


    def _resize_is_identity(self, image) -> bool:
        """Whether `fit_image` gives integer rasters of `one_shape` back unchanged (as float32)."""
        height, width, _ = self.one_shape
        stored = tf.as_dtype(self.raw_dtypes[0])
        return (tuple(image.image_size) == (height, width) and stored.is_integer
                and image.interpolation in _IDENTITY_INTERPOLATIONS
                and (image.resize == "stretch"
                     or image.resize == "crop" and image.crop_fraction == 1.0))


# Resize methods that, at the image's own size, sample each pixel exactly.
_IDENTITY_INTERPOLATIONS = ("bilinear", "nearest", "bicubic", "area")
# Raw dtypes whose every value a float32 holds exactly.
_EXACT_IN_FLOAT32 = ("uint8", "uint16", "int16")


def _count_bands(split_files, band_stats: BandStats | None) -> int:
    """The band count of the split's rasters: from the statistics, else its first raster."""
    if band_stats is not None:
        return band_stats.bands
    schema = split_files.schema
    for path in split_files.paths:
        for serialized in tf.data.TFRecordDataset(path):
            record = schema.decode(serialized.numpy())
            fmt = record[FORMAT.key].decode("utf-8", "replace")
            if parse_raw_format(fmt) is not None:
                return int(record[CHANNELS.key])
    raise ManifestError(
        f"The manifest of {split_files.data_dir!r} lists raw images in split "
        f"{split_files.split!r}, but its shard files hold none."
    )


def _formats_text(photos: Sequence[str], raws: Sequence[str]) -> str:
    return ", ".join([*photos, *(raw_format(d) for d in raws)])


# The color mode that keeps a stored channel count (2, grey and alpha, has none).
_COLOR_MODE_BY_CHANNELS = {c: mode for mode, c in decode.CHANNELS_BY_COLOR_MODE.items()}


def _unknown_layout(name: str, value, where: str, photos: Sequence[str], raws: Sequence[str]):
    allowed = (tuple(decode.CHANNELS_BY_COLOR_MODE) if name == "color_mode"
               else preprocess.OUTPUT_DTYPES)
    return ValueError(
        f"`{name}=None` keeps what the images store; {where} holds "
        f"{_formats_text(photos, raws) or 'jpeg/png'} images, whose channels and depth the "
        f"manifest does not record (converted by an older shardsmith): pass one of {allowed}. "
        f"Received: {name}={value!r}"
    )


def _layouts_text(layouts) -> str:
    return ", ".join(f"{n} {fmt} of {c} channel{'s' * (c != 1)} {dtype}"
                     for fmt, c, dtype, n in layouts)


def photo_options(split_files, image) -> dict[str, str]:
    """The stored `color_mode` and `dtype` of a split of photos, for those given as None.

    Returns:
      The options to replace (none for a split holding rasters, which `plan`
      resolves, or when neither is None).

    Raises:
      ValueError: If the manifest does not record what the images store, or
        they have several channel counts or sample dtypes; the message says
        what the split holds and which `color_mode`/`dtype` to pass.
    """
    photos, raws = stored_formats(split_files.images)
    if raws or (image.color_mode is not None and image.dtype is not None):
        return {}
    where = f"split {split_files.split!r} of {split_files.data_dir!r}"
    layouts = split_files.images.layouts if split_files.images is not None else None
    changes = {}
    if image.color_mode is None:
        if layouts is None:
            raise _unknown_layout("color_mode", None, where, photos, raws)
        channels = sorted({c for _, c, _, _ in layouts})
        if len(channels) != 1 or channels[0] not in _COLOR_MODE_BY_CHANNELS:
            raise ValueError(
                f"`color_mode=None` keeps the stored channels, but {where} holds "
                f"{_layouts_text(layouts)}: no one color mode keeps them. Pass "
                f"color_mode= one of {tuple(decode.CHANNELS_BY_COLOR_MODE)} to decode every "
                "image to that many channels. Received: color_mode=None"
            )
        changes["color_mode"] = _COLOR_MODE_BY_CHANNELS[channels[0]]
    if image.dtype is None:
        if layouts is None:
            raise _unknown_layout("dtype", None, where, photos, raws)
        dtypes = sorted({d for _, _, d, _ in layouts})
        if len(dtypes) != 1:
            raise ValueError(
                f"`dtype=None` keeps the stored dtype, but {where} holds {_layouts_text(layouts)}: "
                "no one dtype keeps them. Pass dtype='uint16' (8-bit images come out multiplied "
                f"by 257) or one of {preprocess.OUTPUT_DTYPES}. Received: dtype=None"
            )
        changes["dtype"] = dtypes[0]
    return changes


def is_raster_split(split_files) -> bool:
    """Whether every record of the split is a raster (raw- or PNG-stored).

    Rasters of 1, 3 or 4 bands of 8 or 16 bits are stored as PNG, like
    photos; the manifest records band statistics for a split only when every
    record of it is a raster, which says they are rasters all the same.
    """
    photos, raws = stored_formats(split_files.images)
    if raws:
        return not photos
    return split_files.band_stats.get(split_files.split) is not None


def png_raster_depth(split_files, image) -> tf.DType | None:
    """The depth a split of PNG-stored rasters decodes at; None for any other split.

    Such rasters keep their values, as raw-stored ones do: a 16-bit band
    decodes at 16 bits (5237 stays 5237.0 in float32, not 20.0 as a 16-bit
    photo at the photo pipeline's 8 bits), whatever the output `dtype`.
    Photo splits keep the photo pipeline's depth (`ImageOptions.depth`), and
    so do 8- and 16-bit rasters in one split read with dtype='uint16' (the
    8-bit ones multiplied by 257, as for photos).

    Args:
      split_files: The split.
      image: The `ImageOptions`.

    Raises:
      ValueError: If the split holds 8- and 16-bit rasters and `dtype` is not
        'uint16': one decoding depth would change the values of some.
    """
    photos, raws = stored_formats(split_files.images)
    layouts = split_files.images.layouts if split_files.images is not None else None
    if raws or not photos or layouts is None or not is_raster_split(split_files):
        return None
    dtypes = sorted({d for _, _, d, _ in layouts})
    if len(dtypes) == 1:
        return tf.as_dtype(dtypes[0])
    if image.dtype == "uint16":
        return None
    raise ValueError(
        f"split {split_files.split!r} of {split_files.data_dir!r} holds PNG-stored rasters "
        f"of several depths ({_layouts_text(layouts)}): one decoding depth would change the "
        "values of some. Read it with dtype='uint16' (8-bit ones multiplied by 257), or "
        "convert with --raster_dtype. Received: "
        f"dtype={image.dtype!r}"
    )


def plan(split_files, image) -> RasterPlan | None:
    """Resolves the image options (`readers.options.ImageOptions`) against a split.

    Returns:
      None for a split of photos only (read as before), else the `RasterPlan`.

    Raises:
      ValueError: If the options cannot give one output shape and dtype for
        what the split stores; the message names both.
    """
    photos, raws = stored_formats(split_files.images)
    where = f"split {split_files.split!r} of {split_files.data_dir!r}"
    if not raws:
        # `photo_options` has resolved None where the manifest says what is stored.
        for name, value in (("color_mode", image.color_mode), ("dtype", image.dtype)):
            if value is None:
                raise _unknown_layout(name, value, where, photos, raws)
        return None
    held = _formats_text(photos, raws)
    if photos and (image.color_mode is None or image.dtype is None):
        raise ValueError(
            f"{where} holds photos and rasters ({held}), which share one output only with a "
            "given `color_mode` (the rasters' band count) and `dtype`; read the rasters "
            "alone, or pass both. Received: "
            f"color_mode={image.color_mode!r}, dtype={image.dtype!r}"
        )
    if len(raws) > 1 and image.dtype is None:
        raise ValueError(
            f"{where} holds rasters of several dtypes ({held}), so there is no one stored "
            f"dtype to keep: pass one of {preprocess.OUTPUT_DTYPES}. Received: dtype=None"
        )
    bands = _count_bands(split_files, split_files.band_stats.get(split_files.split))
    if image.channels is not None and image.channels != bands:
        raise ValueError(
            f"color_mode={image.color_mode!r} gives {image.channels} channels, but the rasters "
            f"of {where} ({held}) have {bands} bands: pass color_mode=None to read every band. "
            f"Received: color_mode={image.color_mode!r}"
        )
    output = image.dtype or raws[0]
    if (image.scale is not None or image.normalize is not None) and not tf.as_dtype(
            output).is_floating:
        raise ValueError(
            f"`scale` and `normalize` need a float output; the rasters of {where} are "
            f"{output}: pass dtype='float32'. Received: dtype={image.dtype!r}"
        )
    for name, value in (("scale", image.scale), ("normalize", image.normalize)):
        parts = value if name == "normalize" and isinstance(value, tuple) else (value,)
        if any(isinstance(p, tuple) and len(p) not in (1, bands) for p in parts):
            raise ValueError(
                f"`{name}` must have 1 or {bands} values (the bands of {where}). "
                f"Received: {name}={value!r}"
            )
    one_size = split_files.images.one_size
    # One shape only where the manifest says so: one size and one dtype (image
    # stats), and one band count (band stats are recorded only then).
    one_shape = ((*one_size, bands) if one_size is not None and len(raws) == 1 and not photos
                 and split_files.band_stats.get(split_files.split) is not None else None)
    return RasterPlan(
        raw_dtypes=raws,
        photos=bool(photos),
        bands=bands,
        output_dtype=output,
        as_stored=(len(raws) == 1 and not photos and image.image_size is None
                   and output == raws[0]),
        one_shape=one_shape,
    )


def resolve_normalize(split_files, image):
    """`normalize` with 'dataset' replaced by the train split's (mean, std)."""
    if image.normalize != "dataset":
        return image.normalize
    if not is_raster_split(split_files):
        # The statistics are of raster values; photos come out of the photo pipeline in
        # its own scale (0-255 floats), where they would not apply.
        photos, raws = stored_formats(split_files.images)
        raise ValueError(
            f"normalize='dataset' applies the band statistics of rasters; split "
            f"{split_files.split!r} holds {_formats_text(photos, raws)} images that are not "
            "all rasters: pass normalize=(mean, std) in the output's scale. "
            "Received: normalize='dataset'"
        )
    stats = dataset_band_stats(split_files.band_stats, split_files.data_dir)
    logger.info(
        "normalize='dataset': the per-band mean and std of the %r split (%d bands), "
        "for split %r.", STATS_SPLIT, stats.bands, split_files.split,
    )
    return stats.mean, stats.std
