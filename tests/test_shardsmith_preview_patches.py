"""`shardsmith preview` of scene patches: bands picked by --rgb_bands, stretched, nodata black.

One conversion, one kind of scene per split (split folders), 32 x 32 patches
shown on 32 x 32 tiles (the reader's resize is then the identity): every tile
of the written PNG (read back with Pillow) equals a stretch computed here with
numpy from rasterio's boundless window read of the scene.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402
from rasterio.windows import Window  # noqa: E402

from helpers import convert, write_geotiff  # noqa: E402
from shardsmith import preview  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")

_RNG = np.random.default_rng(2527)
_PATCH = 32


def _scene(path: pathlib.Path, array: np.ndarray, nodata=None, **profile) -> pathlib.Path:
    """A GeoTIFF of (bands, height, width) written by GDAL."""
    return write_geotiff(path, array, nodata, crs="EPSG:32633", transform=from_origin(300000.0, 5000000.0, 10.0, 10.0), **profile)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("preview_patches")
    u16 = _RNG.integers(100, 12000, (13, 50, 56), dtype=np.uint16)
    u16[:, :10, :12] = 0  # Nodata pixels inside the scene, beside the padding.
    u16[3, 20, 5] = 0  # One band only at nodata: a pixel with data.
    f32 = _RNG.normal(0.2, 0.05, (1, 40, 45)).astype(np.float32)
    f32[0, 30:, :] = np.nan
    u8 = _RNG.integers(1, 256, (3, 40, 40), dtype=np.uint8)
    u8[:, :5, :] = 0
    scenes = {
        "train/sentinel/s2.tif": _scene(root / "in/train/sentinel/s2.tif", u16, nodata=0, tiled=True,
                                        blockxsize=16, blockysize=16, compress="deflate"),
        "validation/dem/dem.tif": _scene(root / "in/validation/dem/dem.tif", f32, nodata=float("nan"),
                                         compress="lzw"),
        "test/ortho/rgb.tif": _scene(root / "in/test/ortho/rgb.tif", u8, nodata=0, compress="lzw"),
    }
    convert(root / "in", root / "out", "--raster_patch", _PATCH, "--raster_edge", "pad")
    return root / "out", scenes


def _window(path, y, x) -> tuple[np.ndarray, float | None]:
    with rasterio.open(path) as src:
        fill = 0 if src.nodata is None else src.nodata
        window = src.read(window=Window(x, y, _PATCH, _PATCH), boundless=True, fill_value=fill)
        return np.moveaxis(window, 0, -1), src.nodata


def _want(window: np.ndarray, nodata, bands, stretch: bool) -> np.ndarray:
    """The tile, computed independently: nodata pixels (every band nodata or NaN) black, the others
    of each band stretched between its 2nd and 98th percentile of the valid pixels (or as stored)."""
    values = window.astype(np.float64)
    empty = np.isnan(values)
    if nodata is not None and not math.isnan(nodata):
        empty |= values == nodata
    valid = ~empty.all(axis=2)
    out = np.zeros(window.shape[:2] + (3,), np.uint8)
    for channel, band in enumerate(bands if len(bands) == 3 else bands * 3):
        v = values[:, :, band - 1]
        ok = valid & np.isfinite(v)
        if not ok.any():
            continue  # A patch of nodata alone: black.
        if stretch:
            low, high = np.percentile(v[ok], [2, 98])
            v = (v - low) / (high - low)
            v = np.clip(v, 0, 1) * 255
        out[:, :, channel] = np.where(ok, np.round(np.clip(v, 0, 255)), 0)
    return out


def _sheet(out, tmp_path, split, *extra):
    png = tmp_path / f"{split}.png"
    assert preview.main([str(out), "--split", split, "--output", str(png), "--image_size", str(_PATCH),
                         "--per_class", "4", "--seed", "0", *extra]) == 0
    return np.asarray(Image.open(png).convert("RGB"))


def _tiles(out, split, rgb_bands):
    """(file name, (x, y) origin) of each tile, from the same sheet built in memory."""
    sheet = preview._build_sheet(out, split, per_class=4, image_size=_PATCH, seed=0, max_classes=20,
                                 max_records=5000, resize="stretch", rgb_bands=rgb_bands)
    # One class per split (the others' rows are empty).
    return sheet, [(name, sheet.layout.tile_origin(row, k)) for row, (_, names) in enumerate(sheet.rows)
                   for k, name in enumerate(names)]


@pytest.mark.parametrize("split, rgb_bands, bands, stretch", [
    ("train", "4,3,2", (4, 3, 2), True),  # 13 bands of uint16, raw records.
    ("train", None, (1, 2, 3), True),  # The default: the first three bands.
    ("validation", None, (1,), True),  # One float32 band as grey, NaN black.
    ("test", "3,2,1", (3, 2, 1), False),  # 8-bit PNG patches: shown as stored.
])
def test_each_tile_is_the_patch_stretched_with_nodata_black(dataset, tmp_path, split, rgb_bands, bands, stretch):
    out, scenes = dataset
    image = _sheet(out, tmp_path, split, *(["--rgb_bands", rgb_bands] if rgb_bands else []))
    sheet, tiles = _tiles(out, split, rgb_bands)
    assert len(tiles) == 4  # Every patch of the scene (2 x 2 under pad) is on the sheet.
    shown = f"bands {','.join(map(str, bands))} as R,G,B" if len(bands) == 3 else f"band {bands[0]} as grey"
    assert shown in sheet.header[1] and ("percentiles" in sheet.header[1]) == stretch
    assert "nodata and NaN black" in sheet.header[2]
    black = 0
    for name, (x, y) in tiles:
        scene, _, offset = name.rpartition("#patch=")
        window, nodata = _window(scenes[scene], *map(int, offset.split(",")))
        want = _want(window, nodata, bands, stretch)
        np.testing.assert_array_equal(image[y:y + _PATCH, x:x + _PATCH], want, err_msg=name)
        black += int((want == 0).all(axis=2).sum())
    assert black > 0  # The padding and the nodata pixels.


def test_bad_rgb_bands_name_the_flag_the_range_and_the_value(dataset, tmp_path, capsys):
    out, _ = dataset
    for bad in ("0,1,2", "14,3,2", "4,3", "red"):
        assert preview.main([str(out), "--output", str(tmp_path / "x.png"), "--rgb_bands", bad]) == 2
        err = capsys.readouterr().err
        assert "--rgb_bands" in err and "1..13 (1-based, as GDAL numbers bands" in err, err
        assert f"Received: rgb_bands='{bad}'" in err, err
    # A single band: 1..1.
    assert preview.main([str(out), "--split", "validation", "--output", str(tmp_path / "x.png"),
                         "--rgb_bands", "2"]) == 2
    assert "1..1 (1-based" in capsys.readouterr().err
