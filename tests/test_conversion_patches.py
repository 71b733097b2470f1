"""Scenes cut into patches by the converter (--raster_patch): exact, georeferenced, spread, flat in memory.

Scenes are GeoTIFFs written by rasterio (GDAL) here; every stored patch is
compared with rasterio's boundless window read of the scene.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import subprocess
import sys

import imagecodecs
import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402
from rasterio.windows import Window  # noqa: E402

import schemas  # noqa: E402
from beam_jobs import verify  # noqa: E402
from helpers import convert, decoded_records, write_geotiff  # noqa: E402
from imaging.patches import PatchOptions, grid  # noqa: E402

# rasterio builds its transforms with `*` (affine 2.4 asks for `@`): its own warning, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")

_RNG = np.random.default_rng(25)
_TRANSFORM = from_origin(600000.0, 5200000.0, 10.0, 10.0)
_REPO = pathlib.Path(__file__).resolve().parents[1]


def _scene(path: pathlib.Path, array: np.ndarray, nodata=None, **profile) -> pathlib.Path:
    """A GeoTIFF of (bands, height, width) written by GDAL."""
    return write_geotiff(path, array, nodata, crs="EPSG:32633", transform=_TRANSFORM, **profile)


def _u16_4_tiled(path):
    array = _RNG.integers(1, 65536, (4, 150, 230), dtype=np.uint16)
    array[:, :70, :100] = 0  # A corner of nodata: patches there are skipped.
    return _scene(path, array, nodata=0, tiled=True, blockxsize=32, blockysize=32, compress="deflate")


def _u8_13_striped(path):
    array = _RNG.integers(0, 256, (13, 131, 170), dtype=np.uint8)
    return _scene(path, array, tiled=False, blockysize=16, compress="lzw")


def _f32_4_tiled_nan(path):
    array = _RNG.normal(100, 30, (4, 140, 190)).astype(np.float32)
    array[:, 90:, 120:] = np.nan
    return _scene(path, array, nodata=float("nan"), tiled=True, blockxsize=48, blockysize=48,
                  compress="zstd", predictor=3)


_SCENES = {"u16_4_tiled": _u16_4_tiled, "u8_13_striped": _u8_13_striped, "f32_4_tiled_nan": _f32_4_tiled_nan}
_PATCH, _STRIDE, _MAX_NODATA = 64, 48, 0.5


def _records(out) -> dict[str, dict]:
    """Filename to decoded record (schemas' Python decoder) with its pixels and shard."""
    found = {}
    for record, _, shard in decoded_records(out):
        record["pixels"] = _pixels(record)
        record["shard"] = shard
        name = record[schemas.FILENAME.key].decode()
        assert name not in found, name
        found[name] = record
    return found


def _pixels(record) -> np.ndarray:
    """The stored image as (height, width, bands), read by imagecodecs (PNG) or numpy (raw)."""
    data, fmt = record[schemas.IMAGE.key], record[schemas.FORMAT.key].decode()
    h, w, c = (record[k.key] for k in (schemas.HEIGHT, schemas.WIDTH, schemas.CHANNELS))
    if fmt == "png":
        return imagecodecs.png_decode(data).reshape(h, w, c)
    dtype = np.dtype(schemas.parse_raw_format(fmt)).newbyteorder("<")
    return np.frombuffer(data, dtype).reshape(h, w, c)


def _expected(path, options: PatchOptions, max_nodata: float):
    """{(y, x): (window, geotransform)} of kept patches and the skipped offsets, from rasterio."""
    kept, skipped = {}, set()
    h, w = options.size
    with rasterio.open(path) as src:
        nodata = src.nodata
        fill = 0 if nodata is None else nodata
        for y, x in grid(src.height, src.width, options):
            window = Window(x, y, w, h)
            pixels = np.moveaxis(src.read(window=window, boundless=True, fill_value=fill), 0, -1)
            rows, cols = np.arange(y, y + h), np.arange(x, x + w)
            outside = ~((rows < src.height)[:, None] & (cols < src.width)[None, :])
            if nodata is not None and math.isnan(nodata) or pixels.dtype.kind == "f":
                empty = np.isnan(pixels).all(axis=2)
            else:
                empty = np.zeros(outside.shape, bool)
            if nodata is not None and not math.isnan(nodata):
                empty |= (pixels == nodata).all(axis=2)
            share = np.count_nonzero(empty | outside) / empty.size
            if share > max_nodata:
                skipped.add((y, x))
            else:
                kept[(y, x)] = (pixels, src.window_transform(window).to_gdal())
    return kept, skipped


@pytest.fixture(scope="module", params=[(s, e) for s in sorted(_SCENES) for e in ("shift", "pad", "drop")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def cut(request, tmp_path_factory):
    scene_name, edge = request.param
    tmp = tmp_path_factory.mktemp(f"{scene_name}_{edge}")
    path = _SCENES[scene_name](tmp / "in" / "scenes" / "scene.tif")
    convert(tmp / "in", tmp / "out", "--raster_patch", _PATCH, "--raster_stride", _STRIDE, "--raster_edge", edge,
            "--raster_max_nodata", _MAX_NODATA, "--raster_georef", "--num_shards", 2)
    options = PatchOptions(_PATCH, _STRIDE, edge)
    return path, tmp / "out", options


def test_every_patch_is_the_scenes_window_bit_for_bit_with_its_georef(cut):
    path, out, options = cut
    kept, skipped = _expected(path, options, _MAX_NODATA)
    records = _records(out)
    assert kept, "the case must keep patches"
    assert sorted(records) == sorted(f"scenes/scene.tif#patch={y},{x}" for y, x in kept)
    for (y, x), (window, geotransform) in kept.items():
        record = records[f"scenes/scene.tif#patch={y},{x}"]
        got = record["pixels"]
        assert got.dtype == window.dtype and got.shape == window.shape
        np.testing.assert_array_equal(got, window, err_msg=f"patch {y},{x}")  # NaN equals NaN here
        assert record[schemas.EPSG.key] == 32633
        np.testing.assert_allclose(record[schemas.GEOTRANSFORM.key], geotransform, rtol=0, atol=1e-6)


def test_skipped_patches_are_listed_and_counted(cut):
    path, out, options = cut
    kept, skipped = _expected(path, options, _MAX_NODATA)
    listed = []
    for line in (out / schemas.NORMALIZED_FILENAME).read_text().splitlines():
        entry = json.loads(line)
        if "cut_into_patches" in entry["actions"]:
            assert entry["path"].startswith("scenes/scene.tif#patch_rows=")
            listed.extend(tuple(p) for p in entry["details"]["skipped"])
    assert sorted(listed) == sorted(skipped)
    manifest = json.loads((out / schemas.MANIFEST_FILENAME).read_text())
    assert manifest["patches"]["written"] == len(kept)
    assert manifest["patches"]["skipped_nodata"] == len(skipped)
    assert manifest["counts"]["written"] == 1 and manifest["counts"]["found"] == 1


def test_verify_passes_on_a_patch_dataset(cut):
    _, out, _ = cut
    assert verify.main([str(out)]) == 0


def _hashes(out: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())
            if p.suffix in (".tfrecord", ".idx", ".json", ".jsonl")}


def test_a_large_scene_spreads_over_shards_deterministically_with_or_without_processes(tmp_path):
    array = _RNG.integers(0, 65536, (13, 1000, 1000), dtype=np.uint16)
    _scene(tmp_path / "in" / "s" / "big.tif", array, tiled=True, blockxsize=256, blockysize=256,
           compress="deflate")
    runs = {}
    for name, processes in (("a", 0), ("b", 0), ("c", 2)):
        convert(tmp_path / "in", tmp_path / name, "--raster_patch", 256, "--num_shards", 4,
                "--worker_processes", processes)
        runs[name] = _hashes(tmp_path / name)
    assert runs["a"] == runs["b"] == runs["c"]
    records = _records(tmp_path / "a")
    assert len(records) == 16  # 4 x 4 patches under 'shift'
    assert len({r["shard"] for r in records.values()}) >= 2
    r = records["s/big.tif#patch=744,256"]  # The shifted last row: 1000 - 256.
    np.testing.assert_array_equal(r["pixels"], np.moveaxis(array[:, 744:1000, 256:512], 0, -1))


def _peak_rss_kib(input_dir, output_dir) -> int:
    """The max RSS of a child converter, as its parent sees it (RUSAGE_CHILDREN)."""
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, "-m", "beam_jobs.convert", "--input_dir", str(input_dir),
         "--output_dir", str(output_dir), "--raster_patch", "256", "--worker_processes", "0",
         "--worker_threads", "1", "--max_pixels", str(10**9)],
        cwd=_REPO, capture_output=True, text=True, timeout=300, check=True)
    return int(done.stdout.split()[-1])


def test_memory_does_not_grow_with_the_scene(tmp_path):
    small = _RNG.integers(0, 65536, (4, 512, 512), dtype=np.uint16)
    _scene(tmp_path / "small" / "s" / "small.tif", small, tiled=True, blockxsize=256, blockysize=256)
    large = np.broadcast_to(_RNG.integers(0, 65536, (4, 1, 4000), dtype=np.uint16), (4, 4000, 4000))
    _scene(tmp_path / "large" / "s" / "large.tif", np.ascontiguousarray(large), tiled=True, blockxsize=256,
           blockysize=256, compress="deflate")
    control = _peak_rss_kib(tmp_path / "small", tmp_path / "out_small")
    peak = _peak_rss_kib(tmp_path / "large", tmp_path / "out_large")
    decoded_mib = 4000 * 4000 * 4 * 2 / 2**20  # 122 MiB: a whole decode would show
    assert (peak - control) / 1024 < decoded_mib / 2, (peak, control)
    manifest = json.loads((tmp_path / "out_large" / schemas.MANIFEST_FILENAME).read_text())
    assert manifest["patches"]["written"] == 16 * 16


@pytest.mark.parametrize("args, words", [
    (["--raster_stride", "32"], "--raster_stride shapes the patches of --raster_patch"),
    (["--raster_patch", "64", "--raster_stride", "80"], "--raster_stride must be at most"),
    (["--raster_patch", "64", "--raster_edge", "wrap"], "--raster_edge must be one of"),
    (["--raster_patch", "64", "--raster_max_nodata", "1.5"], "--raster_max_nodata must be a share"),
    (["--raster_patch", "64", "--dedup"], "does not combine with --dedup"),
    (["--raster_patch", "64", "--raster_pages", "all"], "--raster_pages all cannot go with it"),
])
def test_bad_or_unsupported_patch_flags_are_refused_naming_the_flag(tmp_path, args, words):
    _u8_13_striped(tmp_path / "in" / "s" / "scene.tif")
    with pytest.raises(ValueError, match=words.replace("/", ".").replace("+", ".")):
        convert(tmp_path / "in", tmp_path / "out", *args)
    assert not (tmp_path / "out" / schemas.MANIFEST_FILENAME).exists()


def test_non_tiff_inputs_are_converted_whole_beside_scenes(tmp_path):
    from PIL import Image

    _u16_4_tiled(tmp_path / "in" / "s" / "scene.tif")
    photo = _RNG.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    Image.fromarray(photo).save(tmp_path / "in" / "s" / "photo.png")
    manifest = convert(tmp_path / "in", tmp_path / "out", "--raster_patch", 64)
    records = _records(tmp_path / "out")
    np.testing.assert_array_equal(records["s/photo.png"]["pixels"], photo)
    assert sum(name.startswith("s/scene.tif#patch=") for name in records) == len(records) - 1 > 0
    assert manifest.counts["written"] == 2


def test_patches_outside_an_orthophotos_internal_mask_are_skipped(tmp_path):
    # A JPEG orthophoto marks its footprint with GDAL's internal mask, not a nodata value:
    # patches whose share of masked pixels exceeds --raster_max_nodata are skipped, as
    # GDAL's dataset mask says; the others keep every value, masked pixels included.
    h, w = 150, 230
    rows, columns = np.mgrid[0:h, 0:w]
    values = np.stack([(rows + 2 * columns + 40 * b) // 3 % 256 for b in range(3)]).astype(np.uint8)
    path = tmp_path / "in" / "ortho" / "tile.tif"
    path.parent.mkdir(parents=True)
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=True):
        with rasterio.open(path, "w", driver="GTiff", width=w, height=h, count=3, dtype="uint8",
                           crs="EPSG:32633", transform=_TRANSFORM, tiled=True, blockxsize=64, blockysize=64,
                           compress="jpeg", photometric="ycbcr") as dst:
            dst.write(values)
            dst.write_mask(np.where(columns > rows + 40, 0, 255).astype(np.uint8))
    convert(tmp_path / "in", tmp_path / "out", "--raster_patch", _PATCH, "--raster_stride", _STRIDE,
            "--raster_max_nodata", _MAX_NODATA, "--num_shards", 1)
    options = PatchOptions(_PATCH, _STRIDE, "shift")
    expected_kept, expected_skipped = set(), set()
    with rasterio.open(path) as src:
        for y, x in grid(h, w, options):
            window = Window(x, y, _PATCH, _PATCH)
            share = np.count_nonzero(src.dataset_mask(window=window) == 0) / _PATCH ** 2
            (expected_skipped if share > _MAX_NODATA else expected_kept).add((y, x))
    assert expected_skipped and expected_kept
    records = _records(tmp_path / "out")
    kept = {tuple(int(v) for v in name.split("#patch=")[1].split(",")) for name in records}
    assert kept == expected_kept
    log = [json.loads(line) for line in (tmp_path / "out" / schemas.NORMALIZED_FILENAME).read_text().splitlines()]
    skipped = {tuple(o) for entry in log for o in entry.get("details", {}).get("skipped", [])}
    assert skipped == expected_skipped
    with rasterio.open(path) as src:
        for name, record in records.items():
            y, x = (int(v) for v in name.split("#patch=")[1].split(","))
            gdal = np.moveaxis(src.read(window=Window(x, y, _PATCH, _PATCH)), 0, -1)
            np.testing.assert_array_equal(record["pixels"], gdal)
