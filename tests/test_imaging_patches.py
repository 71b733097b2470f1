"""Scenes into patches (issue 25): the patch grid, windows read segment by segment, nodata shares.

Offsets are checked against hand-worked cases and, for every small length,
size and stride, against the rules stated in the issue (Hypothesis). Windows
are compared bit for bit with GDAL's own windowed reads through rasterio (the
independent reader: shardsmith reads with tifffile), on GeoTIFFs GDAL writes
in the test: tiled 256 and 512 and striped, pixel and band interleaved,
uncompressed, LZW, DEFLATE and ZSTD with predictors 2 and 3, uint8 to float32
with NaN and -9999 nodata, 4 and 13 bands. Memory: decoding is counted
through a spy on tifffile's own segment decoder and measured with
tracemalloc.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
import tracemalloc
import warnings

import numpy as np
import pytest
import rasterio
import rasterio.shutil
import tifffile
from hypothesis import given
from hypothesis import strategies as st
from rasterio.errors import NotGeoreferencedWarning
from rasterio.transform import Affine
from rasterio.windows import Window

from imaging import ImageRejected
from imaging.georef import read_georef
from imaging.patches import (
    EDGES,
    PatchOptions,
    SceneReader,
    grid,
    nodata_share,
    offsets,
    patch_georef,
    patch_geotransform,
)

# rasterio's own use of Affine's `*` (its windows module), not the test's.
pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")

_CRS = "EPSG:32633"
_TRANSFORM = Affine(10.0, 0.0, 399960.0, 0.0, -10.0, 5800020.0)
# Not multiples of 256 or 512: the last tiles and strips are partial.
_H, _W = 531, 613


# --- options -----------------------------------------------------------------------------------


def test_parse_reads_every_flag():
    options = PatchOptions.parse("256,512", stride="128,256", edge="pad", max_nodata="0.25")
    assert options == PatchOptions((256, 512), (128, 256), "pad", 0.25)
    square = PatchOptions.parse("64")
    assert (square.size, square.stride, square.edge, square.max_nodata) == ((64, 64), (64, 64), "shift", 1.0)
    assert PatchOptions.parse("64", stride="32").stride == (32, 32)
    assert PatchOptions(100).size == (100, 100)


@pytest.mark.parametrize("kwargs, flag, received", [
    (dict(patch="0"), "--raster_patch", "0"),
    (dict(patch="a"), "--raster_patch", "'a'"),
    (dict(patch="1,2,3"), "--raster_patch", "'1,2,3'"),
    (dict(patch="-4,8"), "--raster_patch", "-4"),
    (dict(patch="64", stride="0"), "--raster_stride", "0"),
    (dict(patch="64", stride="x"), "--raster_stride", "'x'"),
    (dict(patch="64", stride="65"), "--raster_stride", "65"),
    (dict(patch="64", edge="wrap"), "--raster_edge", "'wrap'"),
    (dict(patch="64", max_nodata="1.5"), "--raster_max_nodata", "1.5"),
    (dict(patch="64", max_nodata="-0.1"), "--raster_max_nodata", "-0.1"),
    (dict(patch="64", max_nodata="nan"), "--raster_max_nodata", "nan"),
    (dict(patch="64", max_nodata="half"), "--raster_max_nodata", "'half'"),
])
def test_parse_errors_name_the_flag_what_is_allowed_and_what_was_received(kwargs, flag, received):
    with pytest.raises(ValueError) as e:
        PatchOptions.parse(**kwargs)
    message = str(e.value)
    assert flag in message and received in message and "must be" in message, message


def test_options_refuse_wrong_types():
    with pytest.raises(ValueError, match="--raster_patch"):
        PatchOptions(True)
    with pytest.raises(ValueError, match="--raster_patch"):
        PatchOptions((2.5, 3))
    with pytest.raises(ValueError, match="--raster_max_nodata"):
        PatchOptions(8, max_nodata=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        PatchOptions(8).edge = "pad"


def test_options_to_json():
    assert PatchOptions.parse("32,48", "16,24", "drop", "0.5").to_json() == {
        "size": [32, 48], "stride": [16, 24], "edge": "drop", "max_nodata": 0.5}


# --- offsets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("length, size, stride, drop, shift, pad", [
    # Worked by hand from the issue's rules.
    (10, 4, 4, (0, 4), (0, 4, 6), (0, 4, 8)),
    (8, 4, 4, (0, 4), (0, 4), (0, 4)),
    (4, 4, 4, (0,), (0,), (0,)),
    (3, 4, 4, (), (0,), (0,)),
    (1, 4, 2, (), (0,), (0,)),
    (10, 4, 3, (0, 3, 6), (0, 3, 6), (0, 3, 6)),
    (11, 4, 3, (0, 3, 6), (0, 3, 6, 7), (0, 3, 6, 9)),
    (5, 4, 1, (0, 1), (0, 1), (0, 1)),
    # A Sentinel-2 tile: 10980 = 42 * 256 + 228.
    (10980, 256, 256, tuple(range(0, 41 * 256 + 1, 256)), tuple(range(0, 41 * 256 + 1, 256)) + (10724,),
     tuple(range(0, 42 * 256 + 1, 256))),
])
def test_offsets_hand_worked(length, size, stride, drop, shift, pad):
    assert offsets(length, size, stride, "drop") == drop
    assert offsets(length, size, stride, "shift") == shift
    assert offsets(length, size, stride, "pad") == pad


def test_sentinel2_tile_in_256_patches():
    # 10980 = 42 * 256 + 228: 42 whole patches; pad adds a 43rd reaching past the edge.
    assert len(offsets(10980, 256, 256, "drop")) == 42
    assert offsets(10980, 256, 256, "pad")[-1] == 42 * 256
    assert offsets(10980, 256, 256, "shift")[-1] == 10980 - 256


@pytest.mark.parametrize("args", [(0, 4, 4, "shift"), (10, 0, 1, "pad"), (10, 4, 0, "drop"),
                                  (10, 4, 5, "shift"), (10, 4, 4, "wrap"), (10, 4.0, 4, "pad"),
                                  (10, True, 1, "pad")])
def test_offsets_refuse_bad_arguments(args):
    with pytest.raises(ValueError, match="offsets: "):
        offsets(*args)


@given(length=st.integers(1, 300), size=st.integers(1, 64), data=st.data())
def test_offsets_follow_the_rules(length, size, data):
    stride = data.draw(st.integers(1, size))
    got = {edge: offsets(length, size, stride, edge) for edge in EDGES}
    # Brute force from the rules: multiples of the stride, kept while the patch fits (drop).
    multiples = list(range(0, length + size + stride, stride))
    fitting = tuple(s for s in multiples if s + size <= length)
    assert got["drop"] == fitting
    for edge, starts in got.items():
        assert list(starts) == sorted(set(starts)), (edge, starts)
    # pad: multiples up to the first patch that reaches the end.
    reaching = next(i for i, s in enumerate(multiples) if s + size >= length)
    assert got["pad"] == tuple(multiples[:reaching + 1])
    # shift: drop's, and one at length - size when pixels are left uncovered.
    if length < size:
        assert got["shift"] == (0,)
    elif fitting[-1] + size < length:
        assert got["shift"] == fitting + (length - size,)
    else:
        assert got["shift"] == fitting
    for edge in ("shift", "pad"):  # Every pixel in some patch.
        covered = np.zeros(length, bool)
        for s in got[edge]:
            covered[s:s + size] = True
        assert covered.all(), (edge, got[edge])
    if length >= size:  # No patch past the edge under drop and shift.
        for edge in ("drop", "shift"):
            assert all(0 <= s and s + size <= length for s in got[edge]), (edge, got[edge])
    # Starts follow the stride: consecutive multiples (shift's last one aside).
    for edge in EDGES:
        starts = got[edge]
        regular = starts[:-1] if edge == "shift" and len(starts) > 1 and starts[-1] % stride else starts
        assert regular == tuple(range(0, stride * len(regular), stride)), (edge, starts)


def test_grid_is_row_major():
    options = PatchOptions((4, 3), (2, 3), "shift")
    ys, xs = offsets(7, 4, 2, "shift"), offsets(8, 3, 3, "shift")
    assert (ys, xs) == ((0, 2, 3), (0, 3, 5))
    assert grid(7, 8, options) == [(0, 0), (0, 3), (0, 5), (2, 0), (2, 3), (2, 5), (3, 0), (3, 3), (3, 5)]
    assert grid(3, 8, PatchOptions(4, edge="drop")) == []


# --- windows against GDAL ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    dtype: str
    bands: int
    options: tuple
    nodata: float | None = None
    smooth: bool = False  # Ramps instead of noise: JPEG's test images.


_TILED_256 = (("tiled", True), ("blockxsize", 256), ("blockysize", 256))
_TILED_512 = (("tiled", True), ("blockxsize", 512), ("blockysize", 512))
_BAND = (("interleave", "band"),)
_PIXEL = (("interleave", "pixel"),)

_LAYOUTS = {
    "uint8_4b_striped_pixel_none": Layout("uint8", 4, _PIXEL),
    "uint8_4b_tiled256_band_deflate": Layout("uint8", 4, _TILED_256 + _BAND + (("compress", "deflate"),),
                                             nodata=0),
    "uint16_4b_tiled256_pixel_lzw_pred2": Layout(
        "uint16", 4, _TILED_256 + _PIXEL + (("compress", "lzw"), ("predictor", 2)), nodata=0),
    "uint16_13b_tiled512_band_deflate_pred2": Layout(
        "uint16", 13, _TILED_512 + _BAND + (("compress", "deflate"), ("predictor", 2)), nodata=0),
    "uint16_13b_striped_pixel_zstd": Layout("uint16", 13, _PIXEL + (("compress", "zstd"),
                                                                    ("blockysize", 64))),
    "int16_4b_striped_band_zstd_pred2_nodata9999": Layout(
        "int16", 4, _BAND + (("compress", "zstd"), ("predictor", 2)), nodata=-9999),
    "int16_4b_tiled512_pixel_none_nodata9999": Layout("int16", 4, _TILED_512 + _PIXEL, nodata=-9999),
    "float32_4b_tiled256_pixel_deflate_pred3_nan": Layout(
        "float32", 4, _TILED_256 + _PIXEL + (("compress", "deflate"), ("predictor", 3)),
        nodata=float("nan")),
    "float32_13b_striped_band_lzw_pred3_nodata9999": Layout(
        "float32", 13, _BAND + (("compress", "lzw"), ("predictor", 3)), nodata=-9999),
    "float32_4b_tiled512_band_zstd_pred3_nan": Layout(
        "float32", 4, _TILED_512 + _BAND + (("compress", "zstd"), ("predictor", 3)),
        nodata=float("nan")),
    "float32_13b_tiled256_pixel_zstd_pred2": Layout(
        "float32", 13, _TILED_256 + _PIXEL + (("compress", "zstd"), ("predictor", 2)),
        nodata=float("nan")),
    # JPEG: libjpeg in GDAL and in imagecodecs decode alike (lossy, but the same bytes decoded).
    "uint8_4b_tiled256_band_jpeg": Layout("uint8", 4, _TILED_256 + _BAND + (("compress", "jpeg"),),
                                          smooth=True),
    "uint8_3b_striped_pixel_jpeg": Layout("uint8", 3, _PIXEL + (("compress", "jpeg"),), smooth=True),
}


def _values(layout: Layout, rng: np.random.Generator) -> np.ndarray:
    """(bands, height, width): the type's range, with nodata in a corner of every band and in scattered samples."""
    shape = (layout.bands, _H, _W)
    if layout.smooth:
        rows, columns = np.arange(_H)[:, np.newaxis], np.arange(_W)[np.newaxis, :]
        values = np.stack([(rows * (b + 1) + 2 * columns) // 3 % 256 for b in range(layout.bands)])
        values = values.astype(layout.dtype)
    elif layout.dtype.startswith("float"):
        values = rng.normal(0.0, 1000.0, shape).astype(layout.dtype)
        values[rng.random(shape) < 0.01] = np.nan  # NaN samples beside any nodata value.
    else:
        info = np.iinfo(layout.dtype)
        values = rng.integers(info.min, info.max, shape, dtype=layout.dtype, endpoint=True)
    if layout.nodata is not None:
        values[:, :40, :70] = layout.nodata  # A scene border: every band empty.
        values[rng.random(shape) < 0.01] = layout.nodata  # Single samples: the pixel still holds data.
    return values


def _write(path: pathlib.Path, layout: Layout, values: np.ndarray, transform=_TRANSFORM) -> None:
    profile = dict(driver="GTiff", width=values.shape[2], height=values.shape[1], count=values.shape[0],
                   dtype=layout.dtype, crs=_CRS, transform=transform, **dict(layout.options))
    if layout.nodata is not None:
        profile["nodata"] = layout.nodata
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(values)


def _gdal_window(path: pathlib.Path, y: int, x: int, h: int, w: int) -> np.ndarray:
    """GDAL's window (height, width, bands); outside the scene its nodata value, else 0."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        with rasterio.open(path) as src:
            fill = src.nodata if src.nodata is not None else 0
            return src.read(window=Window(x, y, w, h), boundless=True, fill_value=fill).transpose(1, 2, 0)


@pytest.fixture(scope="module", params=sorted(_LAYOUTS))
def scene(request, tmp_path_factory) -> tuple[pathlib.Path, Layout, np.ndarray]:
    layout = _LAYOUTS[request.param]
    path = tmp_path_factory.mktemp("scenes") / f"{request.param}.tif"
    values = _values(layout, np.random.default_rng(sorted(_LAYOUTS).index(request.param)))
    _write(path, layout, values)
    with tifffile.TiffFile(path) as tif:  # The layout is what the test means to test.
        page = tif.pages.first
        tiles = dict(layout.options).get("blockxsize")
        assert page.is_tiled == bool(tiles) and (not tiles or page.tilewidth == tiles)
        assert (int(page.planarconfig) == 2) == (("interleave", "band") in layout.options)
    return path, layout, values


def _same_bits(ours: np.ndarray, gdal: np.ndarray) -> None:
    assert ours.shape == gdal.shape and ours.dtype == gdal.dtype, (ours.shape, gdal.shape, ours.dtype, gdal.dtype)
    if not ours.tobytes() == gdal.tobytes():
        np.testing.assert_array_equal(ours, gdal)  # Says where (NaN == NaN here) ...
        pytest.fail("equal values, different bits (NaN payloads?)")  # ... or that only the bits differ.


_WINDOWS = {
    "interior_across_segments": (240, 250, 64, 96),
    "interior_aligned": (256, 256, 128, 256),
    "one_pixel": (300, 17, 1, 1),
    "bottom_right_edge": (_H - 40, _W - 70, 128, 128),
    "left_of_the_scene": (100, -30, 50, 60),
    "larger_than_the_scene": (0, 0, _H + 50, _W + 20),
    "around_the_scene": (-7, -9, _H + 20, _W + 30),
    "outside_the_scene": (_H + 5, 0, 10, 10),
}


@pytest.mark.parametrize("window", sorted(_WINDOWS))
def test_window_equals_gdal_bit_for_bit(scene, window):
    path, layout, _ = scene
    y, x, h, w = _WINDOWS[window]
    with SceneReader(path) as reader:
        assert (reader.height, reader.width, reader.bands) == (_H, _W, layout.bands)
        ours = reader.read(y, x, h, w)
        padded = reader.padded(y, x, h, w)
    _same_bits(ours, _gdal_window(path, y, x, h, w))
    rows, columns = np.meshgrid(np.arange(y, y + h), np.arange(x, x + w), indexing="ij")
    outside = (rows < 0) | (rows >= _H) | (columns < 0) | (columns >= _W)
    np.testing.assert_array_equal(padded, outside)
    fill = layout.nodata if layout.nodata is not None else 0
    if outside.any():  # Padding holds the nodata value, 0 without one.
        assert np.array_equal(ours[outside], np.full((outside.sum(), layout.bands), fill, ours.dtype),
                              equal_nan=True)


def test_every_patch_of_a_grid_equals_gdal(scene):
    """The windows of a whole grid, one after another as a converter reads them (the row cache in use)."""
    path, layout, values = scene
    options = PatchOptions((200, 160), (150, 160), "pad")
    corners = grid(_H, _W, options)
    assert len(corners) == 4 * 4
    with SceneReader(path, name="scene.tif") as reader:
        for y, x in corners:
            _same_bits(reader.read(y, x, *options.size), _gdal_window(path, y, x, *options.size))


def test_ycbcr_jpeg_reads_as_tifffile_reads_the_whole_page(tmp_path):
    """YCbCr JPEG tiles (GDAL's PHOTOMETRIC=YCBCR): as tifffile decodes them in a whole-page read.

    Not compared with GDAL: libtiff and libjpeg upsample the chroma differently
    at sharp edges (tifffile's whole-page read differs from GDAL's just as much).
    """
    layout = Layout("uint8", 3, _TILED_256 + (("compress", "jpeg"), ("photometric", "ycbcr")), smooth=True)
    path = tmp_path / "ycbcr.tif"
    _write(path, layout, _values(layout, np.random.default_rng(0)))
    whole = tifffile.imread(path)
    with SceneReader(path) as reader:
        for y, x, h, w in [(240, 250, 64, 96), (_H - 40, _W - 70, 40, 70), (0, 0, _H, _W)]:
            _same_bits(reader.read(y, x, h, w), whole[y:y + h, x:x + w])


def test_bytes_and_file_objects_read_the_same(scene):
    path, _, _ = scene
    with SceneReader(path) as from_path:
        expected = from_path.read(100, 200, 70, 90)
    with SceneReader(path.read_bytes()) as from_bytes:
        assert from_bytes.name == "<bytes>"
        _same_bits(from_bytes.read(100, 200, 70, 90), expected)
    with open(path, "rb") as f, SceneReader(f, name="f.tif") as from_file:
        _same_bits(from_file.read(100, 200, 70, 90), expected)


def test_reader_reports_nodata_and_layout(scene):
    path, layout, _ = scene
    with SceneReader(path) as reader, rasterio.open(path) as src:
        assert reader.dtype == np.dtype(layout.dtype)
        if src.nodata is None:
            assert reader.nodata is None and reader.fill == 0
        elif math.isnan(src.nodata):
            assert math.isnan(reader.nodata)
        else:
            assert reader.nodata == src.nodata == reader.fill
        blocks = src.block_shapes[0]
        assert reader.segment_shape == tuple(blocks)


# --- nodata shares -----------------------------------------------------------------------------


def test_nodata_share_by_hand():
    window = np.array([[[0, 0], [0, 5]],
                       [[7, 0], [3, 4]]], np.uint16)  # (2, 2, 2): one pixel of all-nodata.
    assert nodata_share(window, None, 0) == 0.25
    assert nodata_share(window, None, None) == 0.0
    padded = np.array([[False, False], [False, True]])
    assert nodata_share(window, padded, 0) == 0.5
    assert nodata_share(window, padded, None) == 0.25
    assert nodata_share(window[:, :, 0], None, 0) == 0.5  # One band, as (height, width).


def test_nodata_share_nan():
    nan = np.nan
    window = np.array([[[nan, nan], [nan, 1.0]],
                       [[-9999, -9999], [nan, -9999]]], np.float32)
    # NaN counts for any nodata of a float raster; -9999 only when it is the nodata value.
    assert nodata_share(window, None, float("nan")) == 0.25
    assert nodata_share(window, None, None) == 0.25
    assert nodata_share(window, None, -9999.0) == 0.75
    assert nodata_share(np.zeros((3, 3, 2), np.int16), np.ones((3, 3), bool), None) == 1.0


def test_nodata_share_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="padded"):
        nodata_share(np.zeros((2, 2, 1)), np.zeros((3, 2), bool), 0)
    with pytest.raises(ValueError, match="window"):
        nodata_share(np.zeros((0, 2, 1)), None, 0)


@pytest.mark.parametrize("name", ["uint16_4b_tiled256_pixel_lzw_pred2", "int16_4b_striped_band_zstd_pred2_nodata9999"])
def test_nodata_share_matches_gdal_dataset_mask(tmp_path, name):
    """GDAL's dataset mask is 0 where every band holds the nodata value; outside the scene too."""
    layout = _LAYOUTS[name]
    path = tmp_path / "scene.tif"
    _write(path, layout, _values(layout, np.random.default_rng(7)))
    for y, x, h, w in [(0, 0, 64, 96), (20, 50, 64, 64), (_H - 30, _W - 40, 64, 64)]:
        with rasterio.open(path) as src:
            mask = src.dataset_mask(window=Window(x, y, w, h), boundless=True)
        with SceneReader(path) as reader:
            share = nodata_share(reader.read(y, x, h, w), reader.padded(y, x, h, w), reader.nodata)
        assert share == np.count_nonzero(mask == 0) / mask.size
        assert 0 < share < 1


def _masked_scene(path: pathlib.Path, driver: str, **options) -> np.ndarray:
    """A 3-band uint8 scene whose internal mask (GDAL_TIFF_INTERNAL_MASK) hides a diagonal footprint edge."""
    h, w = 150, 230
    rows, columns = np.mgrid[0:h, 0:w]
    values = np.stack([(rows + 2 * columns + 40 * b) // 3 % 256 for b in range(3)]).astype(np.uint8)
    mask = np.where(columns > rows + 40, 0, 255).astype(np.uint8)  # Outside the footprint: no data.
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=True):
        if driver == "COG":  # The COG driver copies a dataset: its mask comes from a GTiff.
            source = path.with_suffix(".src.tif")
            _masked_scene(source, "GTiff", tiled=True, blockxsize=64, blockysize=64)
            rasterio.shutil.copy(source, path, driver="COG", **options)
            return mask
        with rasterio.open(path, "w", driver=driver, width=w, height=h, count=3, dtype="uint8", crs=_CRS,
                           transform=_TRANSFORM, **options) as dst:
            dst.write(values)
            dst.write_mask(mask)
            if options.get("tiled"):
                dst.build_overviews([2, 4])  # Overviews with masks of their own: not this page's.
    return mask


@pytest.mark.parametrize("driver, options", [
    ("GTiff", {"tiled": True, "blockxsize": 64, "blockysize": 64, "compress": "jpeg", "photometric": "ycbcr"}),
    ("GTiff", {"interleave": "band", "compress": "deflate"}),
    ("COG", {"compress": "jpeg", "blocksize": 64}),
], ids=["tiled_jpeg_ycbcr_overviews", "striped_planar_deflate", "cog_jpeg"])
def test_an_internal_mask_counts_as_no_data_like_gdals_dataset_mask(tmp_path, driver, options):
    # JPEG orthophotos and COGs mark their footprint with a mask, not a nodata value (lossy
    # values cannot hold one): --raster_max_nodata must see it as GDAL's dataset mask does.
    path = tmp_path / "ortho.tif"
    _masked_scene(path, driver, **options)
    with SceneReader(path) as reader, rasterio.open(path) as src:
        assert reader.has_mask and (reader.height, reader.width) == (150, 230)
        for y, x, h, w in [(0, 0, 64, 64), (0, 128, 64, 64), (90, 0, 64, 64), (100, 190, 64, 64),
                           (-10, 200, 40, 50)]:
            gdal = src.dataset_mask(window=Window(x, y, w, h), boundless=True) == 0
            masked = reader.masked(y, x, h, w)
            np.testing.assert_array_equal(masked | reader.padded(y, x, h, w), gdal)
            share = nodata_share(reader.read(y, x, h, w), masked | reader.padded(y, x, h, w), reader.nodata)
            assert share == np.count_nonzero(gdal) / gdal.size
    plain = tmp_path / "plain.tif"
    _write(plain, Layout("uint8", 3, ()), np.zeros((3, 20, 30), np.uint8))
    with SceneReader(plain) as reader:
        assert not reader.has_mask and reader.masked(0, 0, 8, 8) is None


# --- georeferencing ----------------------------------------------------------------------------


def test_patch_geotransform_by_hand():
    assert patch_geotransform((100.0, 10.0, 0.0, 500.0, 0.0, -10.0), 3, 5) == (150.0, 10.0, 0.0, 470.0, 0.0, -10.0)
    assert patch_geotransform((0.0, 2.0, 0.5, 0.0, 0.25, -2.0), 4, 8) == (18.0, 2.0, 0.5, -6.0, 0.25, -2.0)
    assert patch_geotransform(None, 3, 5) is None


@pytest.mark.parametrize("transform", [_TRANSFORM, Affine(10.0, 2.0, 399960.0, 3.0, -10.0, 5800020.0)],
                         ids=["north_up", "rotated"])
def test_patch_georef_matches_gdal_window_transform(tmp_path, transform):
    layout = Layout("uint8", 1, ())
    path = tmp_path / "scene.tif"
    _write(path, layout, np.zeros((1, 40, 50), np.uint8), transform)
    with SceneReader(path) as reader:
        scene_georef = reader.georef
    assert scene_georef == read_georef(path.read_bytes(), "scene.tif")[0]
    assert scene_georef.epsg == 32633
    with rasterio.open(path) as src:
        for y, x in itertools.product((0, 7, 39), (0, 11, 49)):
            patch = patch_georef(scene_georef, y, x, 16, 24)
            assert (patch.height, patch.width, patch.epsg) == (16, 24, 32633)
            expected = src.window_transform(Window(x, y, 24, 16)).to_gdal()
            np.testing.assert_allclose(patch.geotransform, expected, rtol=0, atol=1e-6)


# --- reading only what a window needs ----------------------------------------------------------


@pytest.fixture
def decoded(monkeypatch) -> list[tuple[int, tuple]]:
    """(bytes, shape) of every segment tifffile's decoder decodes; whole-page reads fail."""
    calls: list[tuple[int, tuple]] = []
    original = tifffile.TiffPage.__dict__["decode"]  # A cached_property: its function builds the decoder.

    def spy(page):
        inner = original.func(page)

        def decode(*args, **kwargs):
            result = inner(*args, **kwargs)
            if result[0] is not None:
                calls.append((result[0].nbytes, result[0].shape))
            return result

        return decode

    def no_asarray(*args, **kwargs):
        raise AssertionError("a whole page was decoded")

    monkeypatch.setattr(tifffile.TiffPage, "decode", property(spy))
    monkeypatch.setattr(tifffile.TiffPage, "asarray", no_asarray)
    return calls


_BIG_H, _BIG_W, _BIG_BANDS = 4000, 4000, 4


@pytest.fixture(scope="module")
def big_scene(tmp_path_factory) -> pathlib.Path:
    """A 4000 x 4000 x 4 uint16 scene in 256-pixel tiles (128 MB decoded), written band-row by band-row."""
    path = tmp_path_factory.mktemp("big") / "scene.tif"
    profile = dict(driver="GTiff", width=_BIG_W, height=_BIG_H, count=_BIG_BANDS, dtype="uint16",
                   crs=_CRS, transform=_TRANSFORM, tiled=True, blockxsize=256, blockysize=256,
                   compress="deflate", predictor=2)
    with rasterio.open(path, "w", **profile) as dst:
        for top in range(0, _BIG_H, 256):
            rows = min(256, _BIG_H - top)
            values = _big_values(top, rows)
            dst.write(values, window=Window(0, top, _BIG_W, rows))
    return path


def _big_values(top: int, rows: int) -> np.ndarray:
    """(bands, rows, width) of the big scene from row `top`: smooth ramps (they compress and decode fast)."""
    r = np.arange(top, top + rows, dtype=np.int64)[:, np.newaxis]
    c = np.arange(_BIG_W, dtype=np.int64)[np.newaxis, :]
    return np.stack([(3 * r + 5 * c + 1000 * b) % 65536 for b in range(_BIG_BANDS)]).astype(np.uint16)


def test_a_window_decodes_only_the_tiles_it_overlaps(big_scene, decoded):
    tile_bytes = 256 * 256 * _BIG_BANDS * 2
    scene_bytes = _BIG_H * _BIG_W * _BIG_BANDS * 2
    tracemalloc.start()
    try:
        with SceneReader(big_scene) as reader:
            window = reader.read(1000, 1000, 256, 256)  # Across tile edges: 2 x 2 tiles.
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [shape for _, shape in decoded] == [(1, 256, 256, _BIG_BANDS)] * 4
    assert sum(n for n, _ in decoded) == 4 * tile_bytes  # 2 MB of a 128 MB scene.
    assert peak < scene_bytes / 20, f"peak {peak:,} bytes reading one window of a {scene_bytes:,}-byte scene"
    expected = _big_values(1000, 256)[:, :, 1000:1256].transpose(1, 2, 0)
    np.testing.assert_array_equal(window, expected)


def test_windows_along_a_row_decode_each_tile_once_and_memory_stays_one_row_band(big_scene, decoded):
    """Overlapping patches (stride < size) across 3 row bands: each tile decoded once per band it is read in."""
    options = PatchOptions(256, (256, 128), "shift")
    band_bytes = 256 * _BIG_W * _BIG_BANDS * 2  # One row of tiles, decoded: 8 MB.
    corners = [(y, x) for y, x in grid(_BIG_H, _BIG_W, options) if y < 3 * 256]
    tracemalloc.start()
    try:
        with SceneReader(big_scene) as reader:
            for y, x in corners:
                window = reader.read(y, x, 256, 256)
                assert window[0, 0, 0] == (3 * y + 5 * x) % 65536
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tiles_across = -(-_BIG_W // 256)
    assert len(decoded) == 3 * tiles_across  # Not once per window that overlaps them (twice here).
    assert peak < 1.5 * band_bytes, f"peak {peak:,} bytes, one row band is {band_bytes:,}"


def test_strips_decode_only_the_rows_of_the_window(tmp_path, decoded):
    layout = Layout("uint16", 4, (("compress", "lzw"), ("blockysize", 16)))
    path = tmp_path / "striped.tif"
    values = _values(layout, np.random.default_rng(3))
    _write(path, layout, values)
    with SceneReader(path) as reader:
        window = reader.read(40, 100, 20, 30)  # Rows 40-59: strips 2 and 3.
    np.testing.assert_array_equal(window, values[:, 40:60, 100:130].transpose(1, 2, 0))
    assert [shape for _, shape in decoded] == [(1, 16, _W, 4)] * 2


# --- damaged files -----------------------------------------------------------------------------


def test_damaged_segment_is_corrupt(tmp_path):
    layout = Layout("uint16", 1, (("compress", "deflate"), ("blockysize", 16)))
    path = tmp_path / "scene.tif"
    _write(path, layout, _values(layout, np.random.default_rng(5)))
    with tifffile.TiffFile(path) as tif:
        offset = tif.pages.first.dataoffsets[3]
    data = bytearray(path.read_bytes())
    data[offset:offset + 40] = b"\xff" * 40
    with SceneReader(bytes(data), name="damaged.tif") as reader:
        reader.read(0, 0, 16, 16)  # Strip 0: intact.
        with pytest.raises(ImageRejected) as e:
            reader.read(50, 0, 4, 4)  # Strip 3.
    assert e.value.reason == "corrupt" and "damaged.tif" in str(e.value)


def test_truncated_file_is_corrupt(tmp_path):
    layout = Layout("uint16", 1, (("blockysize", 16),))
    path = tmp_path / "scene.tif"
    _write(path, layout, _values(layout, np.random.default_rng(6)))
    data = path.read_bytes()
    with tifffile.TiffFile(path) as tif:
        page = tif.pages.first
        end = page.dataoffsets[-1] + page.databytecounts[-1]
    if end != len(data):
        pytest.fail("GDAL wrote the last strip before the end of the file: the test cuts it elsewhere")
    with SceneReader(data[:-100], name="cut.tif") as reader:
        reader.read(0, 0, 8, 8)
        with pytest.raises(ImageRejected, match="truncated") as e:
            reader.read(_H - 2, 0, 2, 2)
    assert e.value.reason == "corrupt"


def test_not_a_tiff_is_corrupt():
    with pytest.raises(ImageRejected) as e:
        SceneReader(b"not a tiff at all", name="x.tif")
    assert e.value.reason == "corrupt" and "x.tif" in str(e.value)


def test_bad_windows_are_refused(tmp_path):
    layout = Layout("uint8", 1, ())
    path = tmp_path / "scene.tif"
    _write(path, layout, np.zeros((1, 8, 8), np.uint8))
    with SceneReader(path) as reader:
        with pytest.raises(ValueError, match="at least 1x1"):
            reader.read(0, 0, 0, 4)
        with pytest.raises(ValueError, match="integer"):
            reader.read(0.5, 0, 4, 4)
    with pytest.raises(ValueError, match="page"):
        SceneReader(path, page=1)


def test_sparse_tiles_read_as_nodata_like_gdal(tmp_path, decoded):
    """Tiles GDAL never wrote (SPARSE_OK: offset and byte count 0) hold the nodata value, undecoded."""
    path = tmp_path / "sparse.tif"
    profile = dict(driver="GTiff", width=600, height=300, count=2, dtype="int16", crs=_CRS,
                   transform=_TRANSFORM, tiled=True, blockxsize=256, blockysize=256,
                   compress="deflate", nodata=-9999, sparse_ok=True)
    written = np.arange(2 * 256 * 256, dtype=np.int16).reshape(2, 256, 256)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(written, window=Window(256, 0, 256, 256))  # One tile of six.
    with tifffile.TiffFile(path) as tif:
        assert sorted(tif.pages.first.databytecounts).count(0) == 5
    with SceneReader(path) as reader:
        ours = reader.read(100, 200, 200, 400)
    _same_bits(ours, _gdal_window(path, 100, 200, 200, 400))
    assert len(decoded) == 1
