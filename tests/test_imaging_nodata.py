"""imaging/nodata.py, and per-band nodata values (GDAL's PAM `<PAMRasterBand band="k">`) through
whole rasters, scene patches, time series, the converter and verify, checked against GDAL's
per-band masks (rasterio's `src.read_masks(k)`)."""

from __future__ import annotations

import json
import math
import pathlib
import warnings

import numpy as np
import pytest
import tifffile
from helpers import convert, decoded_records, stored_values

import schemas
from imaging import nodata, sidecars
from imaging.raster import RasterOptions

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import Affine  # noqa: E402

_RNG = np.random.default_rng(1212)
_UTM = Affine(10, 0, 500000, 0, -10, 4000000)


def test_collapse_gives_one_value_where_the_bands_agree_and_the_tuple_where_not():
    assert nodata.collapse([7, 7.0, 7]) == 7.0 and isinstance(nodata.collapse([7, 7]), float)
    assert math.isnan(nodata.collapse([math.nan, math.nan]))
    assert nodata.collapse([None, None]) is None and nodata.collapse([]) is None
    assert nodata.collapse([7, None]) == (7.0, None) and nodata.collapse([0, 1]) == (0.0, 1.0)


def test_per_band_select_same_and_json():
    assert nodata.per_band(3.0, 2) == (3.0, 3.0) and nodata.per_band((1.0, None), 2) == (1.0, None)
    with pytest.raises(ValueError, match="2 per-band nodata values for 3 bands"):
        nodata.per_band((1.0, 2.0), 3)
    assert nodata.select((1.0, 2.0, 1.0), [2, 0]) == 1.0 and nodata.select((1.0, 2.0), [1, 0]) == (2.0, 1.0)
    assert nodata.select(5.0, [1]) == 5.0
    assert nodata.same((math.nan, 1.0), (math.nan, 1.0)) and not nodata.same((0.0, 1.0), 0.0)
    assert nodata.same((4.0, 4.0), 4.0) and not nodata.same(None, 0.0) and not nodata.same((1.0,), (1.0, 1.0))
    # Scalars as records held them before per-band values; a list per band.
    assert [nodata.to_json(v) for v in (7.0, 2.5, math.nan, -math.inf, None)] == [7, 2.5, "nan", "-inf", None]
    assert nodata.to_json((7.0, None, math.nan)) == [7, None, "nan"]
    back = nodata.from_json(json.loads(json.dumps(nodata.to_json((7.0, None, math.nan)))))
    assert back[:2] == (7.0, None) and math.isnan(back[2])
    assert nodata.text((7.0, None)) == "band 1: 7, band 2: none" and nodata.text(None) == "none"


def _pam(values) -> str:
    """A PAM file giving band k the nodata `values[k - 1]` (None: no `<NoDataValue>`)."""
    bands = "".join(f'<PAMRasterBand band="{k}"><NoDataValue>{v}</NoDataValue></PAMRasterBand>'
                    for k, v in enumerate(values, 1) if v is not None)
    return f"<PAMDataset>{bands}</PAMDataset>"


def _geotiff(path: pathlib.Path, array: np.ndarray, **options) -> pathlib.Path:
    height, width, bands = array.shape
    with rasterio.open(path, "w", driver="GTiff", width=width, height=height, count=bands,
                       dtype=array.dtype.name, transform=_UTM, crs="EPSG:32633", **options) as dst:
        dst.write(array.transpose(2, 0, 1))
    return path


def _gdal(path: pathlib.Path, window=None):
    """(nodatavals, values (bands, h, w) float64, per-band valid masks) of `path` as GDAL reads them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(path) as src:
            win = None if window is None else rasterio.windows.Window(*window)
            return (src.nodatavals, src.read(window=win).astype(np.float64),
                    np.stack([src.read_masks(k, window=win) != 0 for k in range(1, src.count + 1)]))


def _assert_masked_stats(stats, values, valid):
    for b in range(len(values)):
        ok = valid[b]
        assert (stats.count[b], stats.nodata[b]) == (int(ok.sum()), int((~ok).sum()))
        if ok.any():
            assert (stats.min[b], stats.max[b]) == (values[b][ok].min(), values[b][ok].max())
            assert stats.mean[b] == pytest.approx(values[b][ok].mean(), rel=1e-12)


def test_patches_take_each_bands_own_nodata_for_their_statistics_share_and_padding(tmp_path):
    from imaging import patches, scenes

    array = _RNG.integers(10, 400, (40, 30, 2), dtype=np.uint16)
    array[:20, :, 0] = 1  # Band 1's nodata over the top half; band 2's only over its left columns:
    array[:20, :15, 1] = 2  # only there is a pixel empty (every band holds its own).
    path = _geotiff(tmp_path / "scene.tif", array, tiled=True, blockxsize=16, blockysize=16)
    (tmp_path / "scene.tif.aux.xml").write_text(_pam([1, 2]))
    assert _gdal(path)[0] == (1.0, 2.0)
    options = RasterOptions(patch=patches.PatchOptions(size=(20, 16), max_nodata=0.5, edge="pad"))
    found = sidecars.load(str(path), "scene.tif", georef=False)
    cut = scenes.cut_rows(str(path), "scene.tif", 0, 40, options, sidecars=found)
    assert cut.skipped == [(0, 0)]  # (0, 16): band 2 holds data; a single nodata would skip it too.
    by_offset = {image.patch: image for image in cut.images}
    assert sorted(by_offset) == [(0, 16), (20, 0), (20, 16)]
    for (y, x), image in by_offset.items():
        assert image.details["nodata"] == [1, 2]
        width = min(16, 30 - x)
        _, values, valid = _gdal(path, (x, y, width, 20))
        # The padding past the scene's edge holds each band's own nodata, and is left out as nodata.
        stored = stored_values(image)
        assert (stored[:, width:, 0] == 1).all() and (stored[:, width:, 1] == 2).all()
        pad = 20 * (16 - width)
        stats = image.band_stats
        assert [stats.nodata[b] - pad for b in range(2)] == [int((~valid[b]).sum()) for b in range(2)]
        assert [stats.count[b] for b in range(2)] == [int(valid[b].sum()) for b in range(2)]


def _plain_tiff(path: pathlib.Path, array: np.ndarray) -> pathlib.Path:
    tifffile.imwrite(path, array, photometric="minisblack", planarconfig="contig")
    return path


def test_time_series_stacks_keep_each_bands_nodata_from_pam_files_and_band_files(tmp_path):
    from imaging import time_series as ts

    loc = tmp_path / "tile"
    loc.mkdir()
    files = []
    for day in ("2020-05-01", "2020-06-01"):
        array = _RNG.integers(0, 6, (8, 8, 3), dtype=np.uint16)
        path = _plain_tiff(loc / f"{day}.tif", array)
        (loc / f"{day}.tif.aux.xml").write_text(_pam([1, 2, None]))
        files.append((f"tile/{day}.tif", str(path)))
    gdal = [_gdal(pathlib.Path(p)) for _, p in files]
    assert gdal[0][0] == (1.0, 2.0, None)
    plan = ts.plan_location("tile", files, ts.TimeSeriesOptions())
    assert len(plan.dates) == 2 and plan.nodata == (1.0, 2.0, None)
    assert ts.LocationPlan.from_json(json.loads(json.dumps(plan.to_json()))).nodata == plan.nodata
    stats = ts.stack_band_stats(ts.read_stack(plan), plan.nodata)
    values = np.concatenate([g[1] for g in gdal], axis=1)
    valid = np.concatenate([g[2] for g in gdal], axis=1)
    _assert_masked_stats(stats, values, valid)
    # --bands 3,1: each band's own value goes with it.
    picked = ts.plan_location("tile", files, ts.TimeSeriesOptions(bands=("3", "1")))
    assert picked.nodata == (None, 1.0)
    # Another date whose PAM file gives band 2 another value is misaligned, said per band.
    (loc / "2020-06-01.tif.aux.xml").write_text(_pam([1, 3, None]))
    plan = ts.plan_location("tile", files, ts.TimeSeriesOptions())
    assert len(plan.dates) == 1
    (message,) = {o.message for o in plan.outcomes}
    assert "nodata band 1: 1, band 2: 3, band 3: none (the stack's: band 1: 1, band 2: 2, band 3: none)" in message

    # Band files with nodata values of their own (Landsat's QA_PIXEL fills with 1): each band's is kept.
    loc = tmp_path / "landsat"
    loc.mkdir()
    paths = [_geotiff(loc / f"LC08_L2SP_198030_{date}_{layer}.TIF", _RNG.integers(0, 3, (8, 8, 1), dtype=np.uint16),
                      nodata=value)
             for date in ("20200514", "20200530") for layer, value in (("SR_B4", 0), ("QA_PIXEL", 1))]
    band_files = [(f"landsat/{p.name}", str(p)) for p in paths]
    plan = ts.plan_location("landsat", band_files, ts.TimeSeriesOptions(bands=("SR_B4", "QA_PIXEL")))
    assert len(plan.dates) == 2 and plan.nodata == (0.0, 1.0)
    stats = ts.stack_band_stats(ts.read_stack(plan), plan.nodata)
    gdal = [_gdal(p) for p in paths]  # Date by date: SR_B4, QA_PIXEL.
    for b in range(2):
        valid = np.concatenate([gdal[2 * d + b][2][0] for d in range(2)])
        assert (stats.count[b], stats.nodata[b]) == (int(valid.sum()), int((~valid).sum()))


def test_per_band_nodata_through_the_converter_the_records_normalized_jsonl_and_verify(tmp_path):
    from beam_jobs import verify

    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    array = _RNG.integers(0, 9, (12, 10, 3), dtype=np.uint16)
    path = _geotiff(root / "a" / "scene.tif", array, nodata=4)
    (root / "a" / "scene.tif.aux.xml").write_text(_pam([1, 2]))  # Band 3 keeps the tag's 4.
    gdal_nodata, values, valid = _gdal(path)
    assert gdal_nodata == (1.0, 2.0, 4.0)
    out = tmp_path / "out"
    manifest = convert(root, out)
    _assert_masked_stats(manifest.splits["train"].band_stats, values, valid)
    (entry,) = [json.loads(line) for line in (out / schemas.NORMALIZED_FILENAME).read_text().splitlines()
                if line.strip()]
    assert entry["details"]["nodata"] == [1, 2, 4]
    assert len(list(decoded_records(out))) == 1
    assert verify.main([str(out)]) == 0
    # The preview shows black the pixels where every band holds its own nodata value.
    from shardsmith import preview

    assert preview._nodata_values(out, [entry["path"]]) == {entry["path"]: (1.0, 2.0, 4.0)}
    image = np.array([[[1, 2, 4], [1, 2, 5], [1, 1, 4]]], np.uint16)
    rgb = preview._stretch_to_rgb(image, (1, 2, 3), (1.0, 2.0, 4.0), stretch=False)
    assert rgb[0, 0].tolist() == [0, 0, 0] and rgb[0, 1].tolist() == [1, 2, 5] and rgb[0, 2].tolist() == [1, 1, 4]


def test_a_jpeg2000s_per_band_pam_nodata_whole_and_cut_into_padded_patches(tmp_path):
    from imaging import ImageValidator, patches, scenes

    array = _RNG.integers(0, 12, (20, 14, 3), dtype=np.uint16)
    path = tmp_path / "n.jp2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(path, "w", driver="JP2OpenJPEG", width=14, height=20, count=3, dtype="uint16",
                           transform=_UTM, crs="EPSG:32633", QUALITY="100", REVERSIBLE="YES") as dst:
            dst.write(array.transpose(2, 0, 1))
    (tmp_path / "n.jp2.aux.xml").write_text(_pam([7, None, 9]))
    gdal_nodata, values, valid = _gdal(path)
    assert gdal_nodata == (7.0, None, 9.0)
    found = sidecars.load(str(path), "n.jp2", georef=False)
    (image,) = ImageValidator(raster=RasterOptions()).validate_all(path.read_bytes(), "n.jp2", found)
    assert image.details["nodata"] == [7, None, 9]
    _assert_masked_stats(image.band_stats, values, valid)
    options = RasterOptions(patch=patches.PatchOptions(size=(20, 8), edge="pad"))
    cut = scenes.cut_rows(str(path), "n.jp2", 0, 20, options, sidecars=found)
    assert [i.patch for i in cut.images] == [(0, 0), (0, 8)]
    stored = stored_values(cut.images[1])
    assert stored[:, 6:].reshape(-1, 3).tolist() == [[7, 0, 9]] * 40  # Each band padded with its own.
    _, values, valid = _gdal(path, (8, 0, 6, 20))
    stats = cut.images[1].band_stats
    # The padding is nodata in bands 1 and 3; band 2 has none, so its zeros count as values (as a
    # scene without nodata pads with 0).
    assert [stats.count[b] for b in range(3)] == [int(valid[b].sum()) + 40 * (b == 1) for b in range(3)]
    assert [stats.nodata[b] for b in range(3)] == [int((~valid[b]).sum()) + 40 * (b != 1) for b in range(3)]
