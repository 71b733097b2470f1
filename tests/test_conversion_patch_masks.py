"""Scenes cut into patches with their label rasters (--masks_dir) and resized (--max_side/--min_side).

Scenes and label rasters are GeoTIFFs written by rasterio (GDAL), tiled and
deflate-compressed; every stored patch and mask is compared with rasterio's
boundless window read of the scene or label raster, resized where asked with
Pillow and an index computation of our own (never shardsmith's code), and
read back through the Beam converter and the TensorFlow reader.
"""

from __future__ import annotations

import io
import json
import pathlib
import warnings

import imagecodecs
import numpy as np
import pytest
from PIL import Image

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import Affine, from_origin  # noqa: E402
from rasterio.windows import Window  # noqa: E402

import schemas  # noqa: E402
from beam_jobs import verify  # noqa: E402
from helpers import convert, decoded_records, write_geotiff  # noqa: E402
from imaging.patches import PatchOptions, grid  # noqa: E402

# rasterio builds its transforms with `*` (affine 2.4 asks for `@`): its own warning, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")

_RNG = np.random.default_rng(2025)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", PendingDeprecationWarning)  # rasterio's own (see pytestmark)
    _TRANSFORM = from_origin(600000.0, 5200000.0, 10.0, 10.0)
_PATCH, _STRIDE, _MAX_NODATA = 64, 48, 0.5
_HEIGHT, _WIDTH = 150, 230
_TILES = {"tiled": True, "blockxsize": 32, "blockysize": 32, "compress": "deflate"}


def _tif(path: pathlib.Path, array: np.ndarray, nodata=None, **profile) -> pathlib.Path:
    """A GeoTIFF of (bands, height, width) written by GDAL."""
    return write_geotiff(path, array, nodata, crs="EPSG:32633", transform=_TRANSFORM, **profile)


def _labels(height: int, width: int, ids, block: int = 8) -> np.ndarray:
    """A land-cover-like map: blocks of `block` pixels, each one of `ids`."""
    coarse = _RNG.choice(np.asarray(ids), (-(-height // block), -(-width // block)))
    return np.kron(coarse, np.ones((block, block), coarse.dtype))[:height, :width]


def _colour(ids: np.ndarray) -> np.ndarray:
    """The scene's bands (3, h, w) uint8 drawn from its classes: each class its own colour, never 0."""
    ids = ids.astype(np.int64) % 12
    return np.stack([ids * 20 + 5 + 2 * b for b in range(3)]).astype(np.uint8)


# Two label rasters: 8-bit without nodata (padded with 255), 16-bit with ids above 255 and its own
# nodata (9, a class id: the padding). The scene beside each has a corner of nodata (0).
_CASES = {
    "u8_no_nodata": (np.uint8, (0, 1, 2, 3, 7), None),
    "u16_nodata_9": (np.uint16, (0, 4, 9, 300, 1000), 9),
}


@pytest.fixture(scope="module", params=[(c, e) for c in sorted(_CASES) for e in ("shift", "pad", "drop")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def cut(request, tmp_path_factory):
    case, edge = request.param
    dtype, ids, nodata = _CASES[case]
    tmp = tmp_path_factory.mktemp(f"{case}_{edge}")
    labels = _labels(_HEIGHT, _WIDTH, ids).astype(dtype)
    bands = _colour(labels)
    bands[:, :70, :100] = 0
    scene = _tif(tmp / "in" / "scenes" / "scene.tif", bands, nodata=0, **_TILES)
    mask = _tif(tmp / "masks" / "scenes" / "scene.tif", labels[np.newaxis], nodata=nodata, **_TILES)
    convert(tmp / "in", tmp / "out", "--masks_dir", tmp / "masks", "--raster_patch", _PATCH,
            "--raster_stride", _STRIDE, "--raster_edge", edge, "--raster_max_nodata", _MAX_NODATA,
            "--num_shards", 2)
    return scene, mask, tmp / "out", PatchOptions(_PATCH, _STRIDE, edge), np.dtype(dtype)


def _boundless(path, y: int, x: int, h: int, w: int, fill) -> tuple[np.ndarray, np.ndarray]:
    """rasterio's boundless window (h, w, bands) and which pixels lie outside the raster."""
    with rasterio.open(path) as src:
        pixels = np.moveaxis(src.read(window=Window(x, y, w, h), boundless=True, fill_value=fill), 0, -1)
        outside = ~((np.arange(y, y + h) < src.height)[:, None] & (np.arange(x, x + w) < src.width)[None, :])
    return pixels, outside


def _expected(scene, mask, options: PatchOptions, ignore: int):
    """{(y, x): (scene window, label window)} of the patches kept (nodata share <= _MAX_NODATA)."""
    h, w = options.size
    with rasterio.open(mask) as src:
        pad = ignore if src.nodata is None else int(src.nodata)
    kept = {}
    for y, x in grid(_HEIGHT, _WIDTH, options):
        pixels, outside = _boundless(scene, y, x, h, w, 0)
        empty = (pixels == 0).all(axis=2) | outside
        if np.count_nonzero(empty) / empty.size <= _MAX_NODATA:
            kept[(y, x)] = (pixels, _boundless(mask, y, x, h, w, pad)[0][:, :, 0])
    return kept


def _records(out) -> dict[str, dict]:
    """Filename to decoded record (schemas' Python decoder)."""
    return {record[schemas.FILENAME.key].decode(): record for record, _, _ in decoded_records(out)}


def _png(data: bytes) -> np.ndarray:
    """A PNG's samples as Pillow reads them (one channel: (h, w))."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im)


def test_every_patch_mask_is_the_label_rasters_window(cut):
    scene, mask, out, options, dtype = cut
    ignore = int(np.iinfo(dtype).max)
    kept = _expected(scene, mask, options, ignore)
    records = _records(out)
    assert kept and len(kept) < len(grid(_HEIGHT, _WIDTH, options)), "the case must keep and skip patches"
    assert sorted(records) == sorted(f"scenes/scene.tif#patch={y},{x}" for y, x in kept)
    padded = 0
    for (y, x), (pixels, labels) in kept.items():
        record = records[f"scenes/scene.tif#patch={y},{x}"]
        np.testing.assert_array_equal(imagecodecs.png_decode(record[schemas.IMAGE.key]), pixels)
        stored = _png(record[schemas.MASK.key])
        assert stored.dtype == dtype and stored.shape == (_PATCH, _PATCH)
        np.testing.assert_array_equal(stored, labels, err_msg=f"mask of patch {y},{x}")
        padded += y + _PATCH > _HEIGHT or x + _PATCH > _WIDTH
    assert (padded > 0) == (options.edge == "pad")
    manifest = json.loads((out / schemas.MANIFEST_FILENAME).read_text())
    section = manifest["targets"]["mask"]
    assert section["dtype"] == dtype.name
    counts = np.zeros(ignore + 1, np.int64)
    for _, labels in kept.values():
        counts += np.bincount(labels.ravel(), minlength=ignore + 1)
    assert section["pixel_counts"]["train"] == {str(i): int(n) for i, n in enumerate(counts) if n}
    assert verify.main([str(out)]) == 0


def test_the_reader_gives_each_patch_with_its_mask_at_stored_size_and_resized_jointly(cut):
    import readers

    scene, mask, out, options, dtype = cut
    kept = _expected(scene, mask, options, int(np.iinfo(dtype).max))
    ds = readers.image_dataset_from_tfrecords(
        str(out), "train", batch_size=4, image_size=None, dtype="uint8", shuffle=False,
        label_mode="mask", extra_features=(schemas.FILENAME.key,))
    seen = set()
    for images, masks, extras in ds:
        assert images.shape[1:] == (_PATCH, _PATCH, 3) and masks.shape[1:] == (_PATCH, _PATCH, 1)
        for image, ids, name in zip(images.numpy(), masks.numpy(), extras[schemas.FILENAME.key].numpy()):
            y, x = map(int, name.decode().rpartition("=")[2].split(","))
            pixels, labels = kept[(y, x)]
            np.testing.assert_array_equal(image, pixels)
            np.testing.assert_array_equal(ids[:, :, 0], labels)
            seen.add((y, x))
    assert seen == set(kept)

    # The reader's resize (image_size smaller than a patch): the mask takes the nearest label
    # (half-pixel centres: output pixel i samples source pixel 2i + 1 for a halving), and the
    # image, wherever its neighbourhood is one class, that class's colour: the two stay aligned.
    half = _PATCH // 2
    ds = readers.image_dataset_from_tfrecords(
        str(out), "train", batch_size=4, image_size=(half, half), dtype="float32", shuffle=False,
        label_mode="mask", extra_features=(schemas.FILENAME.key,))
    checked = 0
    for images, masks, extras in ds:
        for image, ids, name in zip(images.numpy(), masks.numpy(), extras[schemas.FILENAME.key].numpy()):
            y, x = map(int, name.decode().rpartition("=")[2].split(","))
            pixels, labels = kept[(y, x)]
            centres = np.floor((np.arange(half) + 0.5) * _PATCH / half).astype(int)
            np.testing.assert_array_equal(ids[:, :, 0], labels[centres[:, None], centres[None, :]])
            # Pixels (2i, 2j) whose 6x6 full-resolution neighbourhood (rows 2i-2 to 2i+3) is one class and
            # one colour: the resized image there holds that colour.
            calm = _uniform(labels) & _uniform(pixels)
            rows, cols = np.nonzero(calm[0::2, 0::2])
            np.testing.assert_allclose(image[rows, cols], pixels[2 * rows, 2 * cols], atol=1.0)
            checked += len(rows)
    assert checked > 1000


def _uniform(array: np.ndarray, before: int = 2, after: int = 3) -> np.ndarray:
    """(h, w) booleans: whether every pixel from -before to +after rows and columns away (within the
    array) equals this one, in every band."""
    a = array if array.ndim == 3 else array[:, :, np.newaxis]
    h, w = a.shape[:2]
    padded = np.pad(a, ((before, after), (before, after), (0, 0)), mode="edge")
    same = np.ones((h, w), bool)
    for dy in range(before + after + 1):
        for dx in range(before + after + 1):
            same &= (padded[dy:dy + h, dx:dx + w] == a).all(axis=2)
    return same


def _pillow_lanczos(window: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The documented resize computed here: Lanczos per band in 32-bit float (8-bit RGB natively), rounded."""
    th, tw = size
    if window.dtype == np.uint8 and window.shape[2] == 3:
        return np.asarray(Image.fromarray(window).resize((tw, th), Image.Resampling.LANCZOS))
    bands = [np.asarray(Image.fromarray(window[:, :, b].astype(np.float32), mode="F")
                        .resize((tw, th), Image.Resampling.LANCZOS)) for b in range(window.shape[2])]
    out = np.stack(bands, axis=-1)
    if window.dtype.kind in "ui":
        info = np.iinfo(window.dtype)
        out = np.clip(np.rint(out), info.min, info.max)
    return out.astype(window.dtype)


def _nearest(labels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The label under each output pixel's centre."""
    h, w = labels.shape
    rows = np.floor((np.arange(size[0]) + 0.5) * h / size[0]).astype(int)
    cols = np.floor((np.arange(size[1]) + 0.5) * w / size[1]).astype(int)
    return labels[rows[:, None], cols[None, :]]


@pytest.mark.parametrize("flag, side, patch, stored", [
    ("--max_side", 40, "64,48", (40, 30)),  # The longer side capped: 64x48 -> 40x30.
    ("--min_side", 36, "64,48", (48, 36)),  # The shorter side capped: 64x48 -> 48x36.
])
def test_resized_patches_hold_the_resized_window_its_mask_and_the_scaled_georef(tmp_path, flag, side, patch,
                                                                                 stored):
    labels = _labels(_HEIGHT, _WIDTH, (0, 1, 2, 5)).astype(np.uint8)
    colour = _tif(tmp_path / "in" / "s" / "rgb.tif", _colour(labels), **_TILES)
    floats = _RNG.normal(100, 30, (4, _HEIGHT, _WIDTH)).astype(np.float32)
    raw = _tif(tmp_path / "in" / "s" / "f32.tif", floats, tiled=True, blockxsize=48, blockysize=48,
               compress="deflate", predictor=3)
    for name in ("rgb", "f32"):
        _tif(tmp_path / "masks" / "s" / f"{name}.tif", labels[np.newaxis], **_TILES)
    convert(tmp_path / "in", tmp_path / "out", "--masks_dir", tmp_path / "masks", "--raster_patch", patch,
            "--raster_edge", "pad", "--raster_georef", flag, side, "--num_shards", 1)
    records = _records(tmp_path / "out")
    options = PatchOptions((64, 48), None, "pad")
    th, tw = stored
    for path, name in ((colour, "rgb"), (raw, "f32")):
        offsets = grid(_HEIGHT, _WIDTH, options)
        assert sorted(k for k in records if k.startswith(f"s/{name}.tif")) == sorted(
            f"s/{name}.tif#patch={y},{x}" for y, x in offsets)
        for y, x in offsets:
            record = records[f"s/{name}.tif#patch={y},{x}"]
            window, _ = _boundless(path, y, x, 64, 48, 0)
            assert (record[schemas.HEIGHT.key], record[schemas.WIDTH.key]) == stored
            if name == "rgb":
                got = imagecodecs.png_decode(record[schemas.IMAGE.key])
                np.testing.assert_array_equal(got, _pillow_lanczos(window, stored))
            else:
                assert record[schemas.FORMAT.key].decode() == schemas.raw_format("float32")
                got = np.frombuffer(record[schemas.IMAGE.key], "<f4").reshape(th, tw, 4)
                np.testing.assert_allclose(got, _pillow_lanczos(window, stored), rtol=0, atol=1e-3)
            ids, _ = _boundless(path.parents[2] / "masks" / "s" / f"{name}.tif", y, x, 64, 48, 255)
            np.testing.assert_array_equal(_png(record[schemas.MASK.key]), _nearest(ids[:, :, 0], stored))
            # The scene's transform moved to the patch's corner, its pixels scaled by 64/th and 48/tw.
            with rasterio.open(path) as src:
                moved = src.window_transform(Window(x, y, 48, 64))
            expected = (moved * Affine.scale(48 / tw, 64 / th)).to_gdal()
            assert tuple(record[schemas.GEOTRANSFORM.key]) == pytest.approx(expected, rel=0, abs=1e-9)
            assert record[schemas.EPSG.key] == 32633
    normalized = {n["path"]: n for n in map(json.loads, (tmp_path / "out" / schemas.NORMALIZED_FILENAME)
                                            .read_text().splitlines())}
    entry = normalized["s/f32.tif#patch=0,0"]
    assert {"resize_" + flag[2:], "mask_resized", "scale_geotransform"} <= set(entry["actions"])
    assert entry["details"]["original"] == [64, 48] and entry["details"]["stored"] == list(stored)
    assert verify.main([str(tmp_path / "out")]) == 0


def test_label_rasters_that_cannot_be_cut_are_rejected_with_their_reason(tmp_path):
    labels = _labels(_HEIGHT, _WIDTH, (0, 1, 2)).astype(np.uint8)
    bands = _colour(labels)
    for name in ("good", "png", "mismatch", "fractions", "garbage", "nodata"):
        _tif(tmp_path / "in" / f"{name}.tif", bands, **_TILES)
    _tif(tmp_path / "masks" / "good.tif", labels[np.newaxis], **_TILES)
    palette = Image.fromarray(labels, "P")
    palette.putpalette([v for i in range(256) for v in (i, 255 - i, (7 * i) % 256)])
    palette.save(tmp_path / "masks" / "png.png")
    _tif(tmp_path / "masks" / "mismatch.tif", labels[np.newaxis, :, :-1], **_TILES)
    _tif(tmp_path / "masks" / "fractions.tif", (labels[np.newaxis] + 0.5).astype(np.float32), **_TILES)
    (tmp_path / "masks" / "garbage.tif").write_bytes(b"II*\x00" + bytes(200))
    _tif(tmp_path / "masks" / "nodata.tif", labels[np.newaxis].astype(np.int16), nodata=-1, **_TILES)
    convert(tmp_path / "in", tmp_path / "out", "--masks_dir", tmp_path / "masks", "--raster_patch", _PATCH,
            "--raster_edge", "pad", "--max_reject_fraction", 1)
    rejects = {r["path"]: r for r in map(json.loads, (tmp_path / "out" / schemas.REJECTS_FILENAME)
                                         .read_text().splitlines())}
    assert {p: r["reason"] for p, r in rejects.items()} == {
        "mismatch.tif": "mask_size_mismatch", "fractions.tif": "mask_not_class_ids",
        "garbage.tif": "mask_unreadable", "nodata.tif": "mask_not_class_ids"}
    assert "229x150" in rejects["mismatch.tif"]["message"] and "230x150" in rejects["mismatch.tif"]["message"]
    assert "nodata -1" in rejects["nodata.tif"]["message"]
    records = _records(tmp_path / "out")
    options = PatchOptions(_PATCH, None, "pad")
    # The masks' headers (16- and 32-bit among them) make the dataset's masks 16-bit, as issue 24 decides
    # it: padding is then 16-bit's ignore id.
    manifest = json.loads((tmp_path / "out" / schemas.MANIFEST_FILENAME).read_text())
    assert manifest["targets"]["mask"]["dtype"] == "uint16"
    for name in ("good", "png"):
        for y, x in grid(_HEIGHT, _WIDTH, options):
            ids = np.full((_PATCH, _PATCH), 65535, np.uint16)  # Padded with the ignore id: no nodata.
            window = labels[y:y + _PATCH, x:x + _PATCH]
            ids[:window.shape[0], :window.shape[1]] = window
            got = _png(records[f"{name}.tif#patch={y},{x}"][schemas.MASK.key])
            np.testing.assert_array_equal(got, ids, err_msg=f"{name} {y},{x}")


def test_patches_with_masks_and_resizing_are_the_same_bytes_in_worker_processes(tmp_path):
    import hashlib

    labels = _labels(300, 260, (0, 1, 2, 3)).astype(np.uint8)
    _tif(tmp_path / "in" / "s" / "scene.tif", _colour(labels), **_TILES)
    _tif(tmp_path / "masks" / "s" / "scene.tif", labels[np.newaxis], **_TILES)
    hashes = {}
    for processes in (0, 2):
        out = tmp_path / f"out{processes}"
        convert(tmp_path / "in", out, "--masks_dir", tmp_path / "masks", "--raster_patch", _PATCH,
                "--raster_edge", "pad", "--max_side", 40, "--num_shards", 2, "--worker_processes", processes)
        hashes[processes] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())
                             if p.suffix in (".tfrecord", ".idx", ".json", ".jsonl")}
    assert hashes[0] == hashes[2]
    assert any(name.endswith(".tfrecord") for name in hashes[0])
    records = _records(tmp_path / "out2")
    assert len(records) == 5 * 5
    record = records["s/scene.tif#patch=256,256"]  # The last patch, mostly padding.
    expected = np.full((_PATCH, _PATCH), 255, np.uint8)
    expected[:44, :4] = labels[256:, 256:]
    np.testing.assert_array_equal(_png(record[schemas.MASK.key]), _nearest(expected, (40, 40)))


def test_a_tiff_label_raster_is_read_window_by_window(tmp_path):
    from imaging.scenes import LabelRaster

    labels = _RNG.integers(0, 40, (1, 1000, 1000), dtype=np.uint8)
    path = _tif(tmp_path / "labels.tif", labels, tiled=True, blockxsize=64, blockysize=64, compress="deflate")
    with LabelRaster(str(path), "labels.tif", "uint8") as raster:
        window = raster.read(100, 200, 64, 64)  # Rows 100-163, columns 200-263: 2 x 2 tiles of 16 x 16.
        np.testing.assert_array_equal(window, labels[0, 100:164, 200:264])
        assert raster.decoded_segments == 4
        edge = raster.read(980, 960, 64, 64)  # Past the corner: the ignore id.
        expected = np.full((64, 64), 255, np.uint8)
        expected[:20, :40] = labels[0, 980:, 960:]
        np.testing.assert_array_equal(edge, expected)
        assert raster.decoded_segments == 5


def test_patch_flags_still_refused_name_why(tmp_path):
    _tif(tmp_path / "in" / "scene.tif", _colour(_labels(_HEIGHT, _WIDTH, (0, 1))), **_TILES)
    for args, words in ((["--dedup"], "--dedup"), (["--annotations", str(tmp_path / "a.json")], "--annotations")):
        with pytest.raises(ValueError, match=f"--raster_patch does not combine with {words}"):
            convert(tmp_path / "in", tmp_path / "out", "--raster_patch", _PATCH, *args)
