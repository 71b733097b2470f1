"""Image folders made from the photographs scikit-image ships, for demos and benchmarks.

Every image is a crop of a real photograph bundled with scikit-image (the
astronaut, Chelsea the cat, a cup of coffee, a rocket, a motorcycle, the Hubble
deep field, ...), so JPEG and PNG files have the statistics of photos rather
than of synthetic noise. Only images that scikit-image bundles are used: nothing
is downloaded.

Kinds:

- ``demo``: about 50 small images in 6 class folders, plus the files that show
  what shardsmith takes care of: a phone photo stored sideways with an EXIF
  orientation, a PNG with real transparency, an animated GIF, a truncated JPEG,
  a text file named ``.jpg`` and a ``.DS_Store``.
- ``photos``: an ImageNet-like benchmark corpus: ``count`` images in 10 class
  folders, about 500x375 pixels, JPEG quality 90 of 100-150 KB, 10% PNG.
- ``small``: ``count`` 64x64 JPEG images in 10 class folders (reader benchmarks).
- ``tiny``: ``count`` 32x32 JPEG crops of about 1.4 KB in 10 class folders,
  the size of CIFAR-, MNIST-, patch- and thumbnail-sized datasets
  (`bench.small`, conversion of many small images).
- ``phone``: ``count`` phone-camera-sized JPEGs of 4032x3024 (a quarter
  portrait, 3024x4032) in 10 class folders, 2-4 MB each: the photographs
  upscaled, sharpened and given sensor grain (reader first-batch benchmarks).
- ``rasters``: ``count`` EuroSAT-sized multispectral patches: 64x64 TIFFs of
  13 uint16 bands (Sentinel-2's), uncompressed, pixel-interleaved, written
  with tifffile, in 10 class folders, 104 KB each (`bench.rasters`). The
  bands are mixes of a photo crop's colours with their own gain, offset and
  noise, in reflectance-like values up to about 10,000.

The output is a pure function of (kind, count, seed): image ``i`` is drawn from
its own random generator seeded with ``(seed, kind, i)``, so the result does not
depend on the number of worker processes, and a corpus of ``n`` images is the
first ``n`` images of any larger corpus with the same seed.

A generated folder is recorded in a hidden file beside it
(``.<name>.corpus.json``); asking again for the same corpus reuses the folder,
and a folder this module did not make (or that was changed since) is only
replaced with ``overwrite=True``.

Usage:

  python -m bench.corpus demo build/demo/images
  python -m bench.corpus photos build/bench/photos --count 2000 --seed 0
  python -m bench.corpus small build/bench/small --count 20000
  python -m bench.corpus tiny build/bench/tiny --count 100000
  python -m bench.corpus phone build/bench/phone --count 120
  python -m bench.corpus rasters build/bench/rasters --count 20000
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from PIL import Image, ImageFilter

__all__ = [
    "KINDS",
    "DEFAULT_COUNTS",
    "CorpusInfo",
    "generate",
    "make_demo",
    "make_photos",
    "make_small",
    "describe",
    "main",
]

_LOG = logging.getLogger("shardsmith.bench.corpus")

# Bump when the images made for a (kind, count, seed) change, so that folders
# made by an older version are regenerated instead of reused.
GENERATOR_VERSION = 1

KINDS = ("demo", "photos", "small", "tiny", "phone", "rasters")
DEFAULT_COUNTS = {"demo": None, "photos": 2000, "small": 20000, "tiny": 100000, "phone": 120,
                  "rasters": 20000}
_KIND_IDS = {"demo": 1, "photos": 2, "small": 3, "tiny": 4, "phone": 5, "rasters": 6}
_RASTER_BANDS = 13  # Sentinel-2's bands, as EuroSAT stores them.
_RASTER_SIDE = 64
_PHONE_SIZE = (4032, 3024)  # A 12-megapixel phone camera's 4:3 frame.

# Class name -> names of the bundled scikit-image photographs it is cropped
# from. 'motorcycle_left' and 'motorcycle_right' are the two views of
# `skimage.data.stereo_motorcycle()`.
_PHOTO_CLASSES = {
    "astronaut": ("astronaut",),
    "cat": ("chelsea",),
    "coffee": ("coffee",),
    "rocket": ("rocket",),
    "motorcycle": ("motorcycle_left", "motorcycle_right"),
    "galaxy": ("hubble_deep_field",),
    "tissue": ("immunohistochemistry",),
    "retina": ("retina",),
    "coins": ("coins",),
    "cameraman": ("camera",),
}
_DEMO_CLASSES = ("astronaut", "cat", "coffee", "galaxy", "motorcycle", "rocket")
_DEMO_PER_CLASS = 8
# Grey-level photographs whose fine detail is added to the benchmark photos.
_TEXTURES = ("gravel", "grass")
_BANK_SIZE = 1024  # Side of the noise and texture banks; larger than any image.
_STAMP_VERSION_KEY = "generator_version"


@dataclasses.dataclass(frozen=True)
class CorpusInfo:
    """What `generate` made or found.

    Attributes:
      kind: 'demo', 'photos', 'small', 'tiny', 'phone' or 'rasters'.
      root: Absolute path of the corpus folder.
      count: Requested image count (None for 'demo').
      seed: Seed of the corpus.
      files: Relative paths of every file, sorted.
      num_bytes: Total size of the files.
      reused: True when an identical corpus was already there.
    """

    kind: str
    root: str
    count: int | None
    seed: int
    files: tuple[str, ...]
    num_bytes: int
    reused: bool


# ---------------------------------------------------------------------------
# Source photographs.


@functools.cache
def _source(name: str) -> Image.Image:
    """A bundled scikit-image photograph as an RGB image (grey ones too).

    Raises:
      RuntimeError: If scikit-image cannot load it without a download.
    """
    import skimage.data

    try:
        if name.startswith("motorcycle_"):
            left, right, _ = skimage.data.stereo_motorcycle()
            arr = left if name == "motorcycle_left" else right
        else:
            arr = getattr(skimage.data, name)()
    except Exception as e:  # ModuleNotFoundError (pooch) or a failed download.
        raise RuntimeError(
            f"scikit-image could not load its bundled image {name!r} offline: {e}"
        ) from e
    arr = np.asarray(arr)
    if arr.dtype != np.uint8:
        raise RuntimeError(f"skimage.data.{name} is {arr.dtype}, expected uint8")
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    return Image.fromarray(np.ascontiguousarray(arr[:, :, :3]))


@functools.cache
def _texture_bank() -> np.ndarray:
    """(2, 1024, 1024) float32 band-passed grey textures, unit variance.

    Only detail 1-6 pixels across is kept (gravel, grass), so that over a
    photo it reads as fine surface detail rather than as a second picture.
    """
    import skimage.data
    from scipy import ndimage  # A dependency of scikit-image.

    banks = []
    for name in _TEXTURES:
        t = getattr(skimage.data, name)().astype(np.float32)
        t = ndimage.gaussian_filter(t, 0.6) - ndimage.gaussian_filter(t, 3.0)
        t /= t.std()
        # Mirror-tile the 512x512 texture so crops of any size fit, seamlessly.
        t = np.concatenate([t, t[::-1]], axis=0)
        t = np.concatenate([t, t[:, ::-1]], axis=1)
        banks.append(t[:_BANK_SIZE, :_BANK_SIZE])
    return np.stack(banks)


@functools.cache
def _noise_bank(seed: int) -> np.ndarray:
    """(1024, 1024, 3) float32 standard normal noise, a function of `seed`."""
    rng = np.random.default_rng([seed, 0xB4A5])
    return rng.standard_normal((_BANK_SIZE, _BANK_SIZE, 3), dtype=np.float32)


def _rng(seed: int, kind: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, _KIND_IDS[kind], index])


# ---------------------------------------------------------------------------
# Drawing one image.


def _random_crop(rng: np.random.Generator, src: Image.Image, size: tuple[int, int],
                 min_area: float) -> Image.Image:
    """A random crop of `src` scaled to `size`, flipped left-right half the time.

    The crop has the aspect of `size` and covers at least `min_area` of the
    largest crop of that aspect that fits in `src`.
    """
    w, h = src.size
    aspect = size[0] / size[1]
    max_w = min(w, h * aspect)
    scale = np.sqrt(rng.uniform(min_area, 1.0))
    cw = max(8, int(round(max_w * scale)))
    ch = max(8, min(h, int(round(cw / aspect))))
    x = int(rng.integers(0, w - cw + 1))
    y = int(rng.integers(0, h - ch + 1))
    # Cropping through resize's box copies no pixels; reducing_gap makes large
    # reductions (the 64x64 corpus) fast at no visible cost.
    im = src.resize(size, Image.BICUBIC, box=(x, y, x + cw, y + ch), reducing_gap=3.0)
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return im


def _colour_jitter(rng: np.random.Generator, a: np.ndarray, amount: float) -> np.ndarray:
    """Slight brightness, contrast and per-channel gain changes (float32 in/out)."""
    gains = 1.0 + rng.normal(0.0, amount, size=3).astype(np.float32)
    brightness = np.float32(rng.uniform(-20, 20) * amount / 0.05)
    contrast = np.float32(1.0 + rng.uniform(-1.5, 1.5) * amount)
    mean = a.mean()
    return (a - mean) * contrast + mean * gains + brightness


def _photo_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) distributed roughly like ImageNet's photos."""
    long_side = 500 if rng.random() < 0.7 else int(rng.integers(333, 641))
    aspect = rng.choice([4 / 3, 3 / 2, 1.0, 5 / 4, 16 / 9], p=[0.55, 0.2, 0.1, 0.1, 0.05])
    short_side = int(round(long_side / aspect))
    if rng.random() < 0.22:  # Portrait.
        return short_side, long_side
    return long_side, short_side


def _draw_photo(rng: np.random.Generator, seed: int, sources: tuple[str, ...],
                size: tuple[int, int], *, texture: tuple[float, float],
                grain: tuple[float, float], jitter: float,
                sharpen: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """One uint8 RGB photo: crop, scale, flip, sharpen, jitter, texture, grain.

    Sharpening (as camera firmware does), fine texture and sensor grain give
    the JPEG the high-frequency content, and so the size, of a camera photo.
    """
    w, h = size
    src = _source(sources[int(rng.integers(len(sources)))])
    im = _random_crop(rng, src, (w, h), min_area=0.35)
    if sharpen[1] > 0:
        percent = int(rng.uniform(*sharpen))
        im = im.filter(ImageFilter.UnsharpMask(radius=1.5, percent=percent, threshold=1))
    a = _colour_jitter(rng, np.asarray(im, dtype=np.float32), jitter)
    if texture[1] > 0:
        tex = _texture_bank()[int(rng.integers(len(_TEXTURES)))]
        y, x = rng.integers(0, _BANK_SIZE - h + 1), rng.integers(0, _BANK_SIZE - w + 1)
        a += np.float32(rng.uniform(*texture)) * tex[y:y + h, x:x + w, None]
    if grain[1] > 0:
        noise = _noise_bank(seed)
        y, x = rng.integers(0, _BANK_SIZE - h + 1), rng.integers(0, _BANK_SIZE - w + 1)
        a += np.float32(rng.uniform(*grain)) * noise[y:y + h, x:x + w]
    return np.clip(a, 0, 255).astype(np.uint8)


def _encode(arr_or_im, fmt: str, **kwargs) -> bytes:
    im = arr_or_im if isinstance(arr_or_im, Image.Image) else Image.fromarray(arr_or_im)
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _class_of(index: int, classes: tuple[str, ...]) -> str:
    return classes[index % len(classes)]


def _photo_file(seed: int, index: int) -> tuple[str, bytes]:
    """Relative path and bytes of image `index` of a 'photos' corpus."""
    rng = _rng(seed, "photos", index)
    classes = tuple(_PHOTO_CLASSES)
    cls = _class_of(index, classes)
    arr = _draw_photo(
        rng, seed, _PHOTO_CLASSES[cls], _photo_size(rng),
        texture=(0.0, 8.0), grain=(6.0, 11.0), jitter=0.05, sharpen=(50.0, 150.0),
    )
    stem = f"{cls}/{cls}_{index:06d}"
    if rng.random() < 0.10:
        return f"{stem}.png", _encode(arr, "PNG")
    if rng.random() < 0.03:  # A few greyscale photos, as in ImageNet.
        arr = np.asarray(Image.fromarray(arr).convert("L"))
    # 4:4:4 chroma, as cameras and editors save at high quality.
    return f"{stem}.jpg", _encode(arr, "JPEG", quality=90, subsampling=0)


def _patch_file(kind: str, seed: int, index: int, size: int, grain: tuple[float, float],
                quality: int) -> tuple[str, bytes]:
    """Relative path and bytes of image `index` of a corpus of small square JPEG patches."""
    rng = _rng(seed, kind, index)
    classes = tuple(_PHOTO_CLASSES)
    cls = _class_of(index, classes)
    arr = _draw_photo(
        rng, seed, _PHOTO_CLASSES[cls], (size, size), texture=(0.0, 0.0), grain=grain,
        jitter=0.05,
    )
    return f"{cls}/{cls}_{index:06d}.jpg", _encode(arr, "JPEG", quality=quality)


def _small_file(seed: int, index: int) -> tuple[str, bytes]:
    """Relative path and bytes of image `index` of a 'small' corpus (64x64)."""
    return _patch_file("small", seed, index, 64, grain=(0.0, 4.0), quality=90)


def _tiny_file(seed: int, index: int) -> tuple[str, bytes]:
    """Relative path and bytes of image `index` of a 'tiny' corpus (32x32, ~1.4 KB)."""
    return _patch_file("tiny", seed, index, 32, grain=(4.0, 9.0), quality=95)


def _phone_file(seed: int, index: int) -> tuple[str, bytes]:
    """Relative path and bytes of image `index` of a 'phone' corpus.

    The bundled photographs are at most ~1 megapixel, so a crop is upscaled
    to 12 megapixels; sharpening and per-pixel grain (the noise bank tiled
    with a random offset) then give it a camera file's detail and size.
    """
    rng = _rng(seed, "phone", index)
    classes = tuple(_PHOTO_CLASSES)
    cls = _class_of(index, classes)
    sources = _PHOTO_CLASSES[cls]
    w, h = _PHONE_SIZE if rng.random() >= 0.25 else _PHONE_SIZE[::-1]
    im = _random_crop(rng, _source(sources[int(rng.integers(len(sources)))]), (w, h),
                      min_area=0.5)
    im = im.filter(ImageFilter.UnsharpMask(radius=2.0, percent=int(rng.uniform(80, 160)),
                                           threshold=1))
    a = np.asarray(im, dtype=np.int16)
    noise = _noise_bank(seed)
    dy, dx = (int(v) for v in rng.integers(0, _BANK_SIZE, size=2))
    reps = (-(-(h + dy) // _BANK_SIZE), -(-(w + dx) // _BANK_SIZE), 1)
    grain = np.tile(noise, reps)[dy:dy + h, dx:dx + w] * np.float32(rng.uniform(4.0, 8.0))
    a = np.clip(a + grain.astype(np.int16), 0, 255).astype(np.uint8)
    return (f"{cls}/{cls}_{index:06d}.jpg",
            _encode(a, "JPEG", quality=92, subsampling=2))


def _raster_file(seed: int, index: int) -> tuple[str, bytes]:
    """Relative path and bytes of patch `index` of a 'rasters' corpus (13-band uint16 TIFF).

    Each band is a random mix of a photo crop's three colours, with its own
    gain, offset and noise, so bands are correlated as spectral bands are and
    the values span a reflectance-like range (0 to about 10,000).
    """
    import tifffile

    rng = _rng(seed, "rasters", index)
    classes = tuple(_PHOTO_CLASSES)
    cls = _class_of(index, classes)
    side = _RASTER_SIDE
    rgb = _draw_photo(rng, seed, _PHOTO_CLASSES[cls], (side, side), texture=(0.0, 0.0),
                      grain=(0.0, 4.0), jitter=0.05).astype(np.float32)
    mix = rng.dirichlet(np.ones(3), size=_RASTER_BANDS).astype(np.float32)  # (bands, 3)
    gain = rng.uniform(12.0, 36.0, _RASTER_BANDS).astype(np.float32)
    offset = rng.uniform(200.0, 1500.0, _RASTER_BANDS).astype(np.float32)
    bands = rgb @ mix.T * gain + offset
    bands += rng.standard_normal(bands.shape, dtype=np.float32) * 20.0
    array = np.clip(np.rint(bands), 0, 65535).astype(np.uint16)
    buf = io.BytesIO()
    tifffile.imwrite(buf, array, photometric="minisblack", planarconfig="contig")
    return f"{cls}/{cls}_{index:06d}.tif", buf.getvalue()


_FILE_MAKERS = {"photos": _photo_file, "small": _small_file, "tiny": _tiny_file,
                "phone": _phone_file, "rasters": _raster_file}


def _write(root: str, rel_path: str, data: bytes) -> tuple[str, int]:
    path = os.path.join(root, *rel_path.split("/"))
    with open(path, "wb") as f:
        f.write(data)
    return rel_path, len(data)


def _make_chunk(kind: str, root: str, seed: int, start: int, stop: int) -> list[tuple[str, int]]:
    maker = _FILE_MAKERS[kind]
    return [_write(root, *maker(seed, i)) for i in range(start, stop)]


def _make_many(kind: str, root: str, count: int, seed: int, workers: int | None) -> list[str]:
    """Writes images 0..count-1 of `kind` into `root`, on `workers` processes."""
    if count < 0:
        raise ValueError(f"`count` must be at least 0. Received: count={count}")
    for cls in _PHOTO_CLASSES:
        os.makedirs(os.path.join(root, cls), exist_ok=True)
    # Load the photographs once here: forked workers inherit them.
    for names in _PHOTO_CLASSES.values():
        for name in names:
            _source(name)
    _texture_bank()
    _noise_bank(seed)
    workers = workers or os.cpu_count() or 1
    chunk = {"photos": 100, "phone": 4}.get(kind, 1000)
    bounds = [(s, min(s + chunk, count)) for s in range(0, count, chunk)]
    written: list[tuple[str, int]] = []
    if workers == 1 or len(bounds) <= 1:
        for start, stop in bounds:
            written += _make_chunk(kind, root, seed, start, stop)
    else:
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_make_chunk, kind, root, seed, s, e) for s, e in bounds]
            for future in futures:
                written += future.result()
    return sorted(rel for rel, _ in written)


def make_photos(root: str, count: int = 2000, seed: int = 0, workers: int | None = None) -> list[str]:
    """Writes an ImageNet-like corpus into an existing, empty folder.

    Args:
      root: The folder; class folders are created in it.
      count: Number of images, spread evenly over 10 classes.
      seed: Seed of the corpus.
      workers: Processes to use (default: one per core).

    Returns:
      Relative paths of the files written, sorted.
    """
    return _make_many("photos", root, count, seed, workers)


def make_small(root: str, count: int = 20000, seed: int = 0, workers: int | None = None) -> list[str]:
    """Writes `count` 64x64 JPEG images in 10 class folders into `root`.

    Args:
      root: An existing, empty folder.
      count: Number of images.
      seed: Seed of the corpus.
      workers: Processes to use (default: one per core).

    Returns:
      Relative paths of the files written, sorted.
    """
    return _make_many("small", root, count, seed, workers)


# ---------------------------------------------------------------------------
# The demo.


def _demo_photo(rng: np.random.Generator, seed: int, cls: str, size=None) -> np.ndarray:
    if size is None:
        w = int(rng.integers(280, 401))
        size = (w, int(round(w / rng.choice([4 / 3, 3 / 2, 1.0]))))
        if rng.random() < 0.25:
            size = size[::-1]
    return _draw_photo(rng, seed, _PHOTO_CLASSES[cls], size, texture=(0.0, 0.0),
                       grain=(0.0, 3.0), jitter=0.04)


def _exif_rotated_jpeg(rng: np.random.Generator, seed: int) -> bytes:
    """A portrait photo stored as a phone stores it: sideways, with Orientation=6.

    Orientation 6 tells viewers to turn the stored pixels 90 degrees clockwise;
    the stored pixels are therefore the upright photo turned 90 degrees
    counter-clockwise.
    """
    upright = Image.fromarray(_demo_photo(rng, seed, "cat", size=(240, 320)))
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # Counter-clockwise.
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display.
    exif[0x010F] = "shardsmith"  # Make
    exif[0x0110] = "demo phone"  # Model
    return _encode(stored, "JPEG", quality=90, exif=exif.tobytes())


def _transparent_png(rng: np.random.Generator, seed: int) -> bytes:
    """The cup of coffee cut out of its background: alpha 0 outside an ellipse."""
    arr = _demo_photo(rng, seed, "coffee", size=(320, 240))
    h, w = arr.shape[:2]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    r = np.sqrt(((xx - w / 2) / (0.42 * w)) ** 2 + ((yy - h / 2) / (0.42 * h)) ** 2)
    alpha = np.clip((1.0 - r) * 12.0, 0.0, 1.0)  # Soft edge over a few pixels.
    rgba = np.dstack([arr, (alpha * 255).astype(np.uint8)])
    return _encode(Image.fromarray(rgba, "RGBA"), "PNG")


def _animated_gif(rng: np.random.Generator, seed: int) -> bytes:
    """Two frames of a rocket lifting off."""
    arr = _demo_photo(rng, seed, "rocket", size=(320, 240))
    frames = [Image.fromarray(arr), Image.fromarray(np.roll(arr, -24, axis=0))]
    frames = [f.convert("P", palette=Image.Palette.ADAPTIVE) for f in frames]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=400, loop=0)
    return buf.getvalue()


def _truncated_jpeg(rng: np.random.Generator, seed: int) -> bytes:
    """A JPEG whose download stopped part-way: the header is intact, the scan is not."""
    data = _encode(_demo_photo(rng, seed, "astronaut"), "JPEG", quality=90)
    return data[: len(data) * 55 // 100]


_NOT_A_JPEG = (
    b"This is not a photo. It is a text file whose name ends in .jpg,\n"
    b"as happens when a download saves an error page under the image's name.\n"
)
# The first bytes of a macOS Finder .DS_Store file (a 'Bud1' buddy allocator).
_DS_STORE = b"\x00\x00\x00\x01Bud1" + b"\x00" * 54 + b"\x10\x00\x00\x00" + b"\x00" * 4


def make_demo(root: str, seed: int = 0) -> list[str]:
    """Writes the demo sample into an existing, empty folder.

    Six class folders of eight photos each (mostly JPEG, some PNG), plus:
    ``cat/cat_phone_portrait.jpg`` (EXIF Orientation 6),
    ``coffee/coffee_cutout.png`` (transparent background),
    ``rocket/rocket_liftoff.gif`` (animated, 2 frames),
    ``astronaut/astronaut_truncated.jpg`` (cut short),
    ``motorcycle/download_error.jpg`` (a text file) and ``.DS_Store``.

    Args:
      root: The folder.
      seed: Seed of the sample.

    Returns:
      Relative paths of the files written, sorted.
    """
    files: dict[str, bytes] = {}
    index = 0
    for cls in _DEMO_CLASSES:
        for k in range(_DEMO_PER_CLASS):
            rng = _rng(seed, "demo", index)
            index += 1
            arr = _demo_photo(rng, seed, cls)
            if rng.random() < 0.15:
                files[f"{cls}/{cls}_{k:02d}.png"] = _encode(arr, "PNG")
            else:
                files[f"{cls}/{cls}_{k:02d}.jpg"] = _encode(arr, "JPEG", quality=90)
    specials = {
        "cat/cat_phone_portrait.jpg": _exif_rotated_jpeg,
        "coffee/coffee_cutout.png": _transparent_png,
        "rocket/rocket_liftoff.gif": _animated_gif,
        "astronaut/astronaut_truncated.jpg": _truncated_jpeg,
    }
    for rel, maker in specials.items():
        files[rel] = maker(_rng(seed, "demo", index), seed)
        index += 1
    files["motorcycle/download_error.jpg"] = _NOT_A_JPEG
    files[".DS_Store"] = _DS_STORE
    for cls in _DEMO_CLASSES:
        os.makedirs(os.path.join(root, cls), exist_ok=True)
    for rel in sorted(files):
        _write(root, rel, files[rel])
    return sorted(files)


# ---------------------------------------------------------------------------
# Folders, reuse and the command line.


def _stamp_path(root: str) -> str:
    parent, name = os.path.split(root)
    return os.path.join(parent, f".{name}.corpus.json")


def _listing(root: str) -> dict[str, int]:
    """Relative path -> size of every file under `root`."""
    out = {}
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        rel_folder = os.path.relpath(folder, root)
        for name in names:
            rel = name if rel_folder == "." else f"{rel_folder.replace(os.sep, '/')}/{name}"
            out[rel] = os.path.getsize(os.path.join(folder, name))
    return dict(sorted(out.items()))


def _read_stamp(root: str) -> dict | None:
    try:
        with open(_stamp_path(root), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _check_deletable(root: str) -> None:
    """Refuses to replace the file system root, the working folder or its parents."""
    cwd = os.path.realpath(os.getcwd())
    real = os.path.realpath(root)
    if real == os.path.dirname(real) or cwd == real or cwd.startswith(real.rstrip(os.sep) + os.sep):
        raise ValueError(f"Refusing to replace {root!r}: it holds the working folder.")


def generate(kind: str, root: str, *, count: int | None = None, seed: int = 0,
             overwrite: bool = False, workers: int | None = None) -> CorpusInfo:
    """Makes the corpus `kind` in folder `root`, or reuses an identical one.

    The corpus is written into a temporary folder beside `root` and renamed
    into place when complete, so an interrupted run leaves no partial corpus.

    Args:
      kind: 'demo', 'photos', 'small', 'tiny', 'phone' or 'rasters'.
      root: Folder to create.
      count: Number of images (all but 'demo'; default per kind).
      seed: Seed of the corpus.
      overwrite: Regenerate `root` even when it holds this very corpus, and
        replace it even when this module did not make it or it was changed.
      workers: Processes for all but 'demo' (default: one per core).

    Returns:
      A `CorpusInfo`.

    Raises:
      ValueError: For an unknown kind, a bad count, or a `root` that is not
        ours to replace.
    """
    if kind not in KINDS:
        raise ValueError(f"`kind` must be one of {KINDS}. Received: kind={kind!r}")
    if kind == "demo":
        if count is not None:
            raise ValueError("The 'demo' corpus has a fixed size; do not pass `count`.")
    else:
        count = DEFAULT_COUNTS[kind] if count is None else count
        if count < 1:
            raise ValueError(f"`count` must be at least 1. Received: count={count}")
    root = os.path.abspath(root)
    params = {_STAMP_VERSION_KEY: GENERATOR_VERSION, "kind": kind, "count": count, "seed": seed}

    if os.path.lexists(root):
        if not os.path.isdir(root) or os.path.islink(root):
            raise ValueError(f"{root!r} exists and is not a folder.")
        current = _listing(root)
        stamp = _read_stamp(root)
        ours = stamp is not None and stamp.get("files") == current
        if ours and not overwrite and all(stamp.get(k) == v for k, v in params.items()):
            _LOG.info("Reusing the %s corpus in %s (%d files)", kind, root, len(current))
            return CorpusInfo(kind, root, count, seed, tuple(current), sum(current.values()), True)
        if current and not ours and not overwrite:
            raise ValueError(
                f"{root!r} is not empty and is not an unchanged corpus made by bench.corpus. "
                "Pass --overwrite to replace it, or choose another folder."
            )
        _check_deletable(root)

    parent = os.path.dirname(root)
    os.makedirs(parent, exist_ok=True)
    start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(root)}.partial-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the corpus is not.
    try:
        if kind == "demo":
            make_demo(tmp, seed=seed)
        else:
            _make_many(kind, tmp, count, seed, workers)
        files = _listing(tmp)
        if os.path.lexists(root):
            shutil.rmtree(root)
        os.rename(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    stamp = dict(params, files=files)
    with open(_stamp_path(root), "w", encoding="utf-8") as f:
        json.dump(stamp, f, indent=0, sort_keys=True)
    _LOG.debug("Generated %s in %.1f s", root, time.perf_counter() - start)
    return CorpusInfo(kind, root, count, seed, tuple(files), sum(files.values()), False)


def _tiff_header(path: str) -> tuple[str, int, int]:
    """('tiff-<bands>x<dtype>', width, height) of a TIFF's first page."""
    import tifffile

    with tifffile.TiffFile(path) as tif:
        page = tif.pages.first
        return (f"tiff-{page.samplesperpixel}x{np.dtype(page.dtype).name}", page.imagewidth,
                page.imagelength)


def describe(root: str) -> dict:
    """Statistics of an image folder, reading only image headers.

    Args:
      root: The folder.

    Returns:
      A dict with 'files', 'classes', 'bytes', and per format ('jpeg', 'png',
      ...) a dict of 'count', 'mean_kb', 'mean_width', 'mean_height'.
    """
    listing = _listing(root)
    by_format: dict[str, list[tuple[int, int, int]]] = {}
    for rel, size in listing.items():
        path = os.path.join(root, rel)
        if rel.endswith((".tif", ".tiff")):
            # tifffile: Pillow opens no multispectral or 16-bit multi-band TIFF.
            fmt, w, h = _tiff_header(path)
        else:
            try:
                with Image.open(path) as im:
                    fmt, (w, h) = (im.format or "other").lower(), im.size
            except Exception:  # Not an image (the demo's specials): counted apart.
                fmt, w, h = "not_an_image", 0, 0
        by_format.setdefault(fmt, []).append((size, w, h))
    stats = {
        "files": len(listing),
        "classes": len({rel.split("/")[0] for rel in listing if "/" in rel}),
        "bytes": sum(listing.values()),
    }
    for fmt, rows in sorted(by_format.items()):
        a = np.array(rows, dtype=np.float64)
        stats[fmt] = {
            "count": len(rows),
            "mean_kb": round(a[:, 0].mean() / 1024, 1),
            "mean_width": round(a[:, 1].mean(), 1),
            "mean_height": round(a[:, 2].mean(), 1),
        }
    return stats


def format_stats(stats: dict) -> str:
    """One line about `describe`'s result."""
    parts = [f"{stats['files']:,} files in {stats['classes']} classes, "
             f"{stats['bytes'] / (1 << 20):.1f} MiB"]
    for fmt, s in stats.items():
        if isinstance(s, dict):
            parts.append(
                f"{fmt} {s['count']:,} (mean {s['mean_kb']:.1f} KB, "
                f"{s['mean_width']:.0f}x{s['mean_height']:.0f})"
            )
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.corpus KIND OUT [--count N] [--seed S]``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.corpus",
        description="Generate an image folder from scikit-image's bundled photographs.",
    )
    parser.add_argument("kind", choices=KINDS, help="demo, photos, small, tiny, phone or rasters")
    parser.add_argument("out", help="Folder to create (class folders go inside).")
    parser.add_argument("--count", type=int,
                        help="Number of images (photos: 2000, small: 20000, tiny: 100000, phone: 120, "
                        "rasters: 20000).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the corpus (default 0).")
    parser.add_argument("--workers", type=int, help="Processes to use (default: one per core).")
    parser.add_argument("--overwrite", action="store_true",
                        help="Regenerate OUT, replacing whatever is in it.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    try:
        info = generate(args.kind, args.out, count=args.count, seed=args.seed,
                        overwrite=args.overwrite, workers=args.workers)
    except (ValueError, RuntimeError) as e:
        _LOG.error("bench.corpus: error: %s", e)
        return 2
    if not info.reused:
        _LOG.info(
            "Wrote the %s corpus to %s: %d files, %.1f MiB, in %.1f s",
            info.kind, info.root, len(info.files), info.num_bytes / (1 << 20),
            time.perf_counter() - start,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
