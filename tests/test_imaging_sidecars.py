"""GIS sidecars (world files, .prj, GDAL's .aux.xml) read as GDAL reads them: GDAL (rasterio) is the judge.

The sidecars are written by GDAL itself where it writes them (TFW=YES, the
BASELINE profile's PAM file, a PNG's nodata in its PAM file), and what
shardsmith stores is compared with what rasterio reports for the same file.
"""

from __future__ import annotations

import logging
import math
import pathlib
import re
import shutil
import warnings

import numpy as np
import pytest
import tifffile
from helpers import convert, decoded_records, stored_values

import schemas
from imaging import ImageValidator, sidecars
from imaging.georef import Georef
from imaging.raster import RasterOptions

rasterio = pytest.importorskip("rasterio")
from rasterio.crs import CRS  # noqa: E402
from rasterio.transform import Affine  # noqa: E402

_RNG = np.random.default_rng(1111)
_UTM = Affine(10, 0, 500000, 0, -10, 4000000)


def _gdal(path: pathlib.Path):
    """(epsg or None, geotransform, nodata values) as GDAL reports them for `path`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NotGeoreferencedWarning: the identity is what GDAL says.
        with rasterio.open(path) as src:
            epsg = None if src.crs is None else src.crs.to_epsg()
            return epsg, tuple(src.transform.to_gdal()), src.nodatavals


def _gdal_stats(path: pathlib.Path):
    """GDAL's masked statistics per band: (valid count, min, max, mean)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(path) as src:
            out = []
            for b in range(1, src.count + 1):
                band = src.read(b, masked=True)
                out.append((int(band.count()), float(band.min()), float(band.max()), float(band.mean())))
            return out


def _plain_tiff(path: pathlib.Path, array: np.ndarray, **kwargs) -> pathlib.Path:
    """A TIFF with no georeferencing or GDAL tag at all (tifffile's)."""
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    layout = {"planarconfig": "contig"} if array.ndim == 3 else {}
    tifffile.imwrite(path, array, photometric="minisblack", **layout, **kwargs)
    return path


def _validate(path: pathlib.Path, georef: bool = True):
    """What the converter stores for `path`, its sidecars read beside it."""
    validator = ImageValidator(raster=RasterOptions(georef=georef))
    found = sidecars.load(str(path), path.name, georef)
    return validator.validate_all(path.read_bytes(), path.name, found)


def _baseline(path: pathlib.Path, array: np.ndarray, transform=_UTM, crs="EPSG:32633", **options):
    """A TIFF GDAL writes with PROFILE=BASELINE: no GeoTIFF tags; its georeferencing goes to sidecars."""
    height, width, bands = array.shape
    with rasterio.open(path, "w", driver="GTiff", width=width, height=height, count=bands,
                       dtype=array.dtype.name, transform=transform, crs=crs, PROFILE="BASELINE",
                       **options) as dst:
        dst.write(array.transpose(2, 0, 1))
    return path


def test_a_world_file_written_by_gdal_georeferences_a_plain_tiff_as_gdal_reads_it(tmp_path):
    array = _RNG.integers(0, 65536, (20, 30, 2), dtype=np.uint16)
    path = _baseline(tmp_path / "scene.tif", array, transform=Affine(10, 0.5, 500000, -0.25, -10, 4000000),
                     TFW="YES")
    assert (tmp_path / "scene.tfw").exists()  # GDAL wrote the world file, and its SRS into the PAM file.
    epsg, geotransform, _ = _gdal(path)
    (image,) = _validate(path)
    assert image.georef == Georef(epsg, geotransform, 20, 30)
    assert epsg == 32633 and geotransform == (500000, 10, 0.5, 4000000, -0.25, -10)
    assert image.details["sidecars"] == ["scene.tif.aux.xml", "scene.tfw"]
    # Without --raster_georef the world file is not even looked for.
    (plain,) = _validate(path, georef=False)
    assert plain.georef is None and plain.details["sidecars"] == ["scene.tif.aux.xml"]


@pytest.mark.parametrize("wkt", ["WKT1_ESRI", "WKT1_GDAL", "WKT2_2019"])
@pytest.mark.parametrize("code", [32633, 32718, 4326, 3857, 25832, 26915, 2154])
def test_the_epsg_code_of_a_prj_is_the_one_gdal_identifies(code, wkt):
    text = CRS.from_epsg(code).to_wkt(version=wkt)
    want = CRS.from_wkt(text).to_epsg()
    got = sidecars.wkt_epsg(text)
    # ESRI WKT names no authority: its name is looked up in a short table of common CRSs.
    assert got == want or (wkt == "WKT1_ESRI" and got == 0 and code == 2154), (code, wkt, got, want)


def test_a_prj_gives_the_crs_where_nothing_else_does(tmp_path):
    array = _RNG.integers(0, 65536, (8, 9, 1), dtype=np.uint16)
    path = _baseline(tmp_path / "scene.tif", array, TFW="YES")
    (tmp_path / "scene.tif.aux.xml").unlink()  # The SRS GDAL wrote there: now only a .prj holds one.
    (tmp_path / "scene.prj").write_text(CRS.from_epsg(32633).to_wkt(version="WKT1_ESRI"))
    epsg, geotransform, _ = _gdal(path)
    # GDAL's GTiff driver does not read a .prj (ArcGIS does): shardsmith takes its CRS where nothing
    # else gives one, and the geotransform GDAL reads from the world file.
    assert epsg is None
    (image,) = _validate(path)
    assert image.georef == Georef(32633, geotransform, 8, 9)
    assert image.details["sidecars"] == ["scene.tfw", "scene.prj"]


_WORLD = {"a": "10\n0\n0\n-10\n500005\n3999995\n", "b": "20\n0\n0\n-20\n600010\n2999990\n",
          "c": "30\n0\n0\n-30\n15\n-15\n"}


@pytest.mark.parametrize("files", [
    {"tfw": "a", "tifw": "b", "wld": "c"},
    {"tifw": "b", "wld": "c"},
    {"wld": "c"},
    {"TFW": "b", "wld": "c"},
    {"tfw": "bad", "tifw": "b"},  # A malformed world file: GDAL passes over it to the next.
    {"wld": "c", "tif.aux.xml": "pam"},  # The PAM file's GeoTransform wins.
])
def test_world_file_names_and_precedence_are_gdals(tmp_path, files):
    path = _plain_tiff(tmp_path / "s.tif", _RNG.integers(0, 65536, (6, 5), dtype=np.uint16))
    for ext, which in files.items():
        text = {"bad": "10\n0\n0\n", "pam": "<PAMDataset><GeoTransform>1, 2, 0, 4, 0, -2</GeoTransform>"
                "<SRS>EPSG:3857</SRS></PAMDataset>"}.get(which) or _WORLD[which]
        (tmp_path / f"s.{ext}").write_text(text)
    epsg, geotransform, _ = _gdal(path)
    (image,) = _validate(path)
    assert image.georef.geotransform == geotransform
    assert image.georef.epsg == (epsg or 0)
    assert bool(image.details.get("sidecar_warnings")) == ("bad" in files.values())


def test_geotiff_tags_win_over_a_world_file_and_a_pam_file_wins_over_both(tmp_path):
    array = _RNG.integers(0, 65536, (10, 12, 1), dtype=np.uint16)
    path = tmp_path / "g.tif"
    with rasterio.open(path, "w", driver="GTiff", width=12, height=10, count=1, dtype="uint16",
                       transform=Affine(1, 0, 100, 0, -1, 200), crs="EPSG:4326") as dst:
        dst.write(array[:, :, 0], 1)
    (tmp_path / "g.tfw").write_text(_WORLD["a"])
    epsg, geotransform, _ = _gdal(path)
    assert (epsg, geotransform) == (4326, (100, 1, 0, 200, 0, -1))  # GDAL: the tags, not the world file.
    (image,) = _validate(path)
    assert (image.georef.epsg, image.georef.geotransform) == (epsg, geotransform)
    # A PAM file GDAL wrote (BASELINE's SRS and GeoTransform) beside it: GDAL takes it over the tags.
    _baseline(tmp_path / "other.tif", array)
    shutil.copy(tmp_path / "other.tif.aux.xml", tmp_path / "g.tif.aux.xml")
    epsg, geotransform, _ = _gdal(path)
    assert (epsg, geotransform) == (32633, tuple(_UTM.to_gdal()))
    (image,) = _validate(path)
    assert (image.georef.epsg, image.georef.geotransform) == (epsg, geotransform)


def _pam_nodata(tmp_path: pathlib.Path, value, bands: int) -> str:
    """The PAM file GDAL writes for a PNG of `bands` bands with nodata `value` (of 2 or more bands
    PNG keeps nodata only there; one band's would go to its tRNS chunk: the second's is dropped)."""
    png = tmp_path / "nodata_source.png"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(png, "w", driver="PNG", width=4, height=4, count=max(bands, 2), dtype="uint16",
                           nodata=value) as dst:
            dst.write(np.zeros((max(bands, 2), 4, 4), np.uint16))
    text = (tmp_path / "nodata_source.png.aux.xml").read_text()
    if bands == 1:
        text = re.sub(r'\s*<PAMRasterBand band="2">.*?</PAMRasterBand>', "", text, flags=re.DOTALL)
    return text


@pytest.mark.parametrize("own_tag", [False, True])
def test_a_pam_nodata_value_is_gdals_nodata_and_leaves_the_band_statistics(tmp_path, own_tag):
    array = _RNG.integers(0, 400, (16, 14, 2), dtype=np.uint16)
    array[:5, :3] = 7
    path = tmp_path / "n.tif"
    if own_tag:  # The TIFF's own GDAL_NODATA (3): GDAL takes the PAM file's over it.
        with rasterio.open(path, "w", driver="GTiff", width=14, height=16, count=2, dtype="uint16",
                           nodata=3) as dst:
            dst.write(array.transpose(2, 0, 1))
    else:
        _plain_tiff(path, array)
    (tmp_path / "n.tif.aux.xml").write_text(_pam_nodata(tmp_path, 7, 2))
    _, _, nodata = _gdal(path)
    assert nodata == (7.0, 7.0)
    (image,) = _validate(path, georef=False)
    assert image.details["nodata"] == 7
    stats = image.band_stats
    for b, (count, low, high, mean) in enumerate(_gdal_stats(path)):
        assert stats.count[b] == count and stats.nodata[b] == 14 * 16 - count
        assert (stats.min[b], stats.max[b]) == (low, high)
        assert stats.mean[b] == pytest.approx(mean, rel=1e-12)


def _gdal_masks(name: str):
    """GDAL's per-band masks of `name` (a path, or GTIFF_DIR:N:path): (bands, height, width) booleans, True valid.

    Where a mask (`.msk`, internal) stands for GDAL's mask band, its nodata values are
    left out too, as shardsmith leaves out both (docs/preparing/rasters.md).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(name) as src:
            values = src.read().astype(np.float64)
            masks = np.stack([src.read_masks(k) != 0 for k in range(1, src.count + 1)])
            for k, nodata in enumerate(src.nodatavals):
                if nodata is not None:
                    masks[k] &= values[k] != nodata
            return masks, values


def _assert_gdals_masked_stats(stats, name: str, bands=None):
    """`stats` (a record's band statistics) are GDAL's under its per-band masks (`src.read_masks(k)`)."""
    masks, values = _gdal_masks(name)
    for i, k in enumerate(bands or range(1, len(masks) + 1)):
        valid, band = masks[k - 1], values[k - 1]
        assert (stats.count[i], stats.nodata[i]) == (int(valid.sum()), int((~valid).sum()))
        assert (stats.min[i], stats.max[i]) == (band[valid].min(), band[valid].max())
        assert stats.mean[i] == pytest.approx(band[valid].mean(), rel=1e-12)


@pytest.mark.parametrize("case", ["each band its own", "band 1's and the tag's", "bands 1 and 3, no tag"])
def test_per_band_pam_nodata_values_are_each_bands_own_as_gdal_masks_them(tmp_path, case):
    array = _RNG.integers(0, 12, (9, 8, 3), dtype=np.uint16)
    path = tmp_path / "n.tif"
    if case == "band 1's and the tag's":  # GDAL_NODATA 3 stands for the bands the PAM file leaves.
        with rasterio.open(path, "w", driver="GTiff", width=8, height=9, count=3, dtype="uint16",
                           nodata=3) as dst:
            dst.write(array.transpose(2, 0, 1))
    else:
        _plain_tiff(path, array)
    pam = _pam_nodata(tmp_path, 7, 2)  # GDAL's PAM file, its second band's value then edited.
    value = "7.00000000000000E+00"
    values = {"each band its own": (7, 9, 4), "band 1's and the tag's": (7,), "bands 1 and 3, no tag": (7, None, 4)}
    band_xml = pam[pam.index("  <PAMRasterBand"):pam.index("  </PAMRasterBand>") + len("  </PAMRasterBand>\n")]
    own = "".join(band_xml.replace('band="1"', f'band="{b}"').replace(value, f"{v}")
                  for b, v in enumerate(values[case], 1) if v is not None)
    (tmp_path / "n.tif.aux.xml").write_text(pam[:pam.index("  <PAMRasterBand")] + own + "</PAMDataset>\n")
    gdal = _gdal(path)[2]
    assert gdal == {"each band its own": (7, 9, 4), "band 1's and the tag's": (7, 3, 3),
                    "bands 1 and 3, no tag": (7, None, 4)}[case]
    (image,) = _validate(path, georef=False)
    assert image.details["nodata"] == list(gdal)
    _assert_gdals_masked_stats(image.band_stats, str(path))
    # --raster_bands picks each band's own value with the band.
    validator = ImageValidator(raster=RasterOptions(bands=(3, 1)))
    (picked,) = validator.validate_all(path.read_bytes(), path.name, sidecars.load(str(path), path.name, False))
    assert picked.details["nodata"] == [gdal[2], gdal[0]]
    _assert_gdals_masked_stats(picked.band_stats, str(path), bands=(3, 1))


def _gdal_pages(path: pathlib.Path, pages) -> list[np.ndarray]:
    """A multi-page GeoTIFF written by GDAL (APPEND_SUBDATASET): `pages` of (nodata, transform), 2 bands each."""
    arrays = []
    for i, (nodata, transform) in enumerate(pages):
        array = _RNG.integers(0, 12, (2, 9, 8), dtype=np.uint16)
        options = {"nodata": nodata} if nodata is not None else {}
        if transform is not None:
            options.update(transform=transform, crs="EPSG:32633")
        if i:
            options["APPEND_SUBDATASET"] = "YES"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with rasterio.open(path, "w", driver="GTiff", width=8, height=9, count=2, dtype="uint16",
                               **options) as dst:
                dst.write(array)
        arrays.append(array)
    return arrays


def test_later_pages_take_the_world_file_and_their_own_nodata_not_the_pam_file_or_msk_as_gdal_opens_them(tmp_path):
    path = tmp_path / "p.tif"
    _gdal_pages(path, [(3, None), (None, None), (9, Affine(20, 0, 100, 0, -20, 900))])
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=False):  # GDAL's external mask, of the dataset (page 1).
        with rasterio.open(path, "r+") as dst:
            mask = np.full((9, 8), 255, np.uint8)
            mask[:2] = 0
            dst.write_mask(mask)
    (tmp_path / "p.tfw").write_text(_WORLD["a"])
    # The PAM file: nodata 5 and a geotransform for the dataset, and for page 2 in a <Subdataset>
    # as GDAL writes one (GDAL 3.10 reads it back for no page).
    band = '<PAMRasterBand band="{}"><NoDataValue>{}</NoDataValue></PAMRasterBand>'
    page2 = (f'<Subdataset name="GTIFF_DIR:2:{path}"><PAMDataset><GeoTransform>7,1,0,8,0,-1</GeoTransform>'
             f'{band.format(1, 6)}{band.format(2, 6)}</PAMDataset></Subdataset>')
    (tmp_path / "p.tif.aux.xml").write_text(f"<PAMDataset><GeoTransform>1,2,0,3,0,-2</GeoTransform>"
                                            f"{band.format(1, 5)}{band.format(2, 5)}{page2}</PAMDataset>")
    validator = ImageValidator(raster=RasterOptions(georef=True, pages="all"))
    images = validator.validate_all(path.read_bytes(), path.name, sidecars.load(str(path), path.name))
    assert len(images) == 3
    gdal = []
    for n, image in enumerate(images, 1):
        name = str(path) if n == 1 else f"GTIFF_DIR:{n}:{path}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with rasterio.open(name) as src:
                gdal.append((tuple(src.transform.to_gdal()), src.nodatavals))
        geotransform, nodata = gdal[-1]
        assert image.georef.geotransform == geotransform and image.georef.epsg == (32633 if n == 3 else 0)
        assert image.details.get("nodata") == (None if nodata[0] is None else nodata[0])
        _assert_gdals_masked_stats(image.band_stats, name)
    world = tuple(sidecars.world_geotransform(_WORLD["a"]))
    # What GDAL gives each page: the PAM file and the mask to the first alone, the world file to a
    # later page without georeferencing of its own, and each page its own GDAL_NODATA.
    assert gdal == [((1, 2, 0, 3, 0, -2), (5.0, 5.0)), (world, (None, None)),
                    ((100, 20, 0, 900, 0, -20), (9.0, 9.0))]
    assert images[0].details["masked_pixels"] == 16 and "masked_pixels" not in images[1].details
    assert images[0].details["sidecars"] == ["p.tif.aux.xml", "p.tif.msk", "p.tfw"]
    assert images[1].details["sidecars"] == images[2].details["sidecars"] == ["p.tfw"]


def test_a_later_page_after_an_internal_mask_keeps_its_own_georeferencing(tmp_path):
    path = tmp_path / "m.tif"
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=True):  # Page 1, its mask page, then page 2.
        for i, transform in enumerate((_UTM, Affine(20, 0, 100, 0, -20, 900))):
            with rasterio.open(path, "w", driver="GTiff", width=8, height=9, count=2, dtype="uint16",
                               transform=transform, crs="EPSG:32633", **({"APPEND_SUBDATASET": "YES"} if i else {})
                               ) as dst:
                dst.write(_RNG.integers(0, 12, (2, 9, 8), dtype=np.uint16))
                if not i:
                    dst.write_mask(np.full((9, 8), 255, np.uint8))
    with tifffile.TiffFile(path) as tif:
        assert [bool(p.is_mask) for p in tif.pages] == [False, True, False]
    validator = ImageValidator(raster=RasterOptions(georef=True, pages="all"))
    images = validator.validate_all(path.read_bytes(), path.name)
    with rasterio.open(path) as src:  # GDAL numbers directories, masks included: its pages are 1 and 3.
        pages = src.subdatasets
    assert pages == [f"GTIFF_DIR:1:{path}", f"GTIFF_DIR:3:{path}"] and len(images) == 2
    for image, name in zip(images, pages):
        assert image.georef.geotransform == _gdal(name)[1]
    assert images[1].georef.geotransform == (100, 20, 0, 900, 0, -20)


@pytest.mark.parametrize("name,text,gdal_reads", [
    ("s.tif.aux.xml", "<PAMDataset><PAMRasterBand band='1'><NoDataValue>", False),  # Truncated XML.
    ("s.tif.aux.xml", "<PAMDataset><GeoTransform>1,2,3</GeoTransform></PAMDataset>", False),
    ("s.tif.aux.xml", "<Other/>", False),
    ("s.tfw", "10\n0\n0\n-10\n5\n", False),
    ("s.tfw", "0\n0\n0\n0\n5\n5\n", False),
    ("s.tfw", "", False),
    ("s.prj", "not a WKT", False),
])
def test_a_malformed_sidecar_is_left_out_with_a_warning_and_the_raster_is_still_read(
        tmp_path, caplog, name, text, gdal_reads):
    array = _RNG.integers(0, 65536, (6, 5, 1), dtype=np.uint16)
    path = _plain_tiff(tmp_path / "s.tif", array)
    (tmp_path / name).write_text(text)
    epsg, geotransform, nodata = _gdal(path)
    assert (epsg, geotransform, nodata) == (None, (0, 1, 0, 0, 0, 1), (None,))  # GDAL ignores it too.
    with caplog.at_level(logging.WARNING, logger="imaging.sidecars"):
        (image,) = _validate(path)
        _validate(path)  # Warned once per file, not once per read (a scene's work items).
    assert image.georef == Georef(0, None, 6, 5)
    assert image.band_stats.count == (30,)
    (warning,) = image.details["sidecar_warnings"]
    assert warning.startswith(f"{name}: ")
    assert caplog.text.count(warning) == 1


def test_nodata_written_as_its_exact_double_and_nan_are_read(tmp_path):
    found = sidecars.parse("x.tif", {"x.tif.aux.xml": b'<PAMDataset><PAMRasterBand band="1"><NoDataValue '
                                                       b'le_hex_equiv="0000000000001C40">7.0E+00</NoDataValue>'
                                                       b'</PAMRasterBand></PAMDataset>'})
    assert found.nodata == 7.0
    found = sidecars.parse("x.tif", {"x.tif.aux.xml": b"<PAMDataset><PAMRasterBand band='1'><NoDataValue>nan"
                                                       b"</NoDataValue></PAMRasterBand></PAMDataset>"})
    assert math.isnan(found.nodata)


def test_sidecar_names_are_gdals_in_its_order():
    assert sidecars.sidecar_names("d/scene.tif") == (
        "d/scene.tif.aux.xml", "d/scene.tif.msk", "d/scene.tif.MSK", "d/scene.tfw", "d/scene.TFW", "d/scene.tifw", "d/scene.TIFW", "d/scene.wld",
        "d/scene.WLD", "d/scene.prj", "d/scene.PRJ")
    assert sidecars.sidecar_names("SCENE.TIF")[3:7] == ("SCENE.TFW", "SCENE.tfw", "SCENE.TIFW", "SCENE.tifw")


def test_a_scene_cut_into_patches_takes_its_world_file_and_pam_nodata(tmp_path):
    from imaging import patches, scenes

    array = _RNG.integers(10, 400, (40, 30, 1), dtype=np.uint16)
    array[:20] = 9  # The top half is nodata by the PAM file alone.
    path = _plain_tiff(tmp_path / "scene.tif", array, tile=(16, 16))
    (tmp_path / "scene.tfw").write_text(_WORLD["a"])
    (tmp_path / "scene.tif.aux.xml").write_text(_pam_nodata(tmp_path, 9, 1))
    epsg, geotransform, nodata = _gdal(path)
    options = RasterOptions(georef=True, patch=patches.PatchOptions(size=(20, 15), max_nodata=0.5))
    found = sidecars.load(str(path), "scene.tif")
    cut = scenes.cut_rows(str(path), "scene.tif", 0, 40, options, sidecars=found)
    assert cut.skipped == [(0, 0), (0, 15)]  # Without the PAM file's nodata, nothing would be skipped.
    assert [image.patch for image in cut.images] == [(20, 0), (20, 15)]
    x0, dx, rx, y0, ry, dy = geotransform
    assert cut.images[1].georef == Georef(0, (x0 + 15 * dx, dx, rx, y0 + 20 * dy, ry, dy), 20, 15)
    assert nodata == (9.0,) and cut.images[0].details["nodata"] == 9
    assert epsg is None


def test_time_series_headers_take_world_files_and_pam_nodata(tmp_path):
    from imaging import time_series

    files = []
    for day in ("2020-05-01", "2020-06-01"):
        path = _plain_tiff(tmp_path / f"{day}.tif", _RNG.integers(0, 400, (8, 8, 2), dtype=np.uint16))
        (tmp_path / f"{day}.tfw").write_text(_WORLD["b"])
        (tmp_path / f"{day}.tif.aux.xml").write_text(_pam_nodata(tmp_path, 5, 2))
        files.append((f"loc/{day}.tif", str(path)))
    plan = time_series.plan_location("loc", files, time_series.TimeSeriesOptions())
    _, geotransform, nodata = _gdal(tmp_path / "2020-05-01.tif")
    assert plan.geotransform == geotransform and plan.nodata == nodata[0] == 5.0
    assert len(plan.dates) == 2


def test_sidecars_through_the_converter_the_records_manifest_and_verify(tmp_path):
    from beam_jobs import verify
    from conversion.listing import list_input

    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    array = _RNG.integers(8, 400, (12, 10, 2), dtype=np.uint16)
    array[:4] = 7
    _baseline(root / "a" / "scene.tif", array, TFW="YES")  # World file + PAM SRS, by GDAL.
    pam = (root / "a" / "scene.tif.aux.xml").read_text()
    nodata = _pam_nodata(tmp_path, 7, 2)
    bands = nodata[nodata.index("  <PAMRasterBand"):nodata.index("</PAMDataset>")]
    (root / "a" / "scene.tif.aux.xml").write_text(pam.replace("</PAMDataset>", bands + "</PAMDataset>"))
    epsg, geotransform, nodata_values = _gdal(root / "a" / "scene.tif")
    assert nodata_values == (7.0, 7.0) and epsg == 32633
    _, problems = list_input(str(root))
    notes = {p.rel_path: p.message for p in problems}
    assert notes["a/scene.tfw"].startswith("a world file of a/scene.tif; read with --raster_georef")
    assert "its nodata value and georeferencing win over" in notes["a/scene.tif.aux.xml"]

    out = tmp_path / "out"
    manifest = convert(root, out, "--raster_georef")
    (record,) = [r for r, _, _ in decoded_records(out)]
    assert record[schemas.EPSG.key] == epsg
    assert tuple(record[schemas.GEOTRANSFORM.key]) == geotransform
    stats = manifest.splits["train"].band_stats
    gdal = _gdal_stats(root / "a" / "scene.tif")
    assert list(stats.nodata) == [120 - count for count, *_ in gdal] == [40, 40]
    assert list(stats.min) == [low for _, low, _, _ in gdal]
    assert verify.main([str(out)]) == 0


def _masked_geotiff(path: pathlib.Path, array: np.ndarray, mask: np.ndarray, **options) -> pathlib.Path:
    """A GeoTIFF GDAL writes with an internal mask (GDAL_TIFF_INTERNAL_MASK, a mask page after the image)."""
    height, width, bands = array.shape
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=True):
        with rasterio.open(path, "w", driver="GTiff", width=width, height=height, count=bands,
                           dtype=array.dtype.name, transform=_UTM, crs="EPSG:32633", **options) as dst:
            dst.write(array.transpose(2, 0, 1))
            dst.write_mask(np.where(mask, 0, 255).astype(np.uint8))
    assert not list(path.parent.glob(path.name + ".msk"))  # Inside the file, not beside it.
    return path


@pytest.mark.parametrize("dtype,options", [("uint16", {}), ("float32", {"tiled": True, "blockxsize": 16,
                                                                         "blockysize": 16})])
def test_an_internal_mask_leaves_its_pixels_out_of_the_band_statistics_as_gdal_masks_them(tmp_path, dtype,
                                                                                           options):
    array = _RNG.integers(0, 5000, (24, 20, 3)).astype(dtype)
    mask = np.zeros((24, 20), bool)
    mask[:6] = True  # No data, whatever the pixels hold (5000 and above: outside the valid values' range).
    array[:6] = 9000
    path = _masked_geotiff(tmp_path / "m.tif", array, mask, **options)
    (image,) = _validate(path, georef=False)
    stats = image.band_stats
    for b, (count, low, high, mean) in enumerate(_gdal_stats(path)):
        assert (stats.count[b], stats.nodata[b]) == (count, 120) and count == 360
        assert (stats.min[b], stats.max[b]) == (low, high) and high < 9000
        assert stats.mean[b] == pytest.approx(mean, rel=1e-6)
    assert image.details["masked_pixels"] == 120
    assert np.array_equal(stored_values(image), array)  # The values under the mask are kept.


def test_patches_leave_their_internal_mask_out_of_their_statistics(tmp_path):
    from imaging import patches, scenes

    array = _RNG.integers(0, 5000, (32, 16, 1)).astype(np.uint16)
    mask = np.zeros((32, 16), bool)
    mask[:4] = True
    array[:4] = 60000
    path = _masked_geotiff(tmp_path / "m.tif", array, mask)
    options = RasterOptions(patch=patches.PatchOptions(size=(16, 16), max_nodata=0.5))
    cut = scenes.cut_rows(str(path), "m.tif", 0, 32, options)
    first, second = (image.band_stats for image in cut.images)
    assert (first.count, first.nodata) == ((192,), (64,)) and first.max[0] < 60000
    assert (second.count, second.nodata) == ((256,), (0,)) and "masked_pixels" not in cut.images[1].details
    gdal = _gdal_stats(path)[0]
    total = first.merge(second)
    assert total.count[0] == gdal[0] and (total.min[0], total.max[0]) == gdal[1:3]


def test_a_masked_raster_through_the_converter_keeps_gdals_statistics_and_verifies(tmp_path):
    from beam_jobs import verify

    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    array = _RNG.integers(0, 5000, (16, 12, 2)).astype(np.uint16)
    mask = np.zeros((16, 12), bool)
    mask[:, :3] = True
    array[:, :3] = 65535
    _masked_geotiff(root / "a" / "m.tif", array, mask)
    _plain_tiff(root / "a" / "plain.tif", _RNG.integers(0, 5000, (16, 12, 2)).astype(np.uint16))
    out = tmp_path / "out"
    manifest = convert(root, out)
    stats = manifest.splits["train"].band_stats
    gdal_masked = _gdal_stats(root / "a" / "m.tif")
    assert list(stats.nodata) == [48, 48] and stats.count[0] == gdal_masked[0][0] + 192
    assert max(stats.max) < 65535
    assert verify.main([str(out)]) == 0
    # The recorded statistics are checked against the stored pixels: a count that does not add up fails.
    normalized = out / schemas.NORMALIZED_FILENAME
    normalized.write_text(normalized.read_text().replace('"count": [144, 144]', '"count": [140, 144]'))
    assert verify.main([str(out)]) != 0


def test_a_scene_and_its_sidecars_through_the_converter_as_patches(tmp_path):
    from beam_jobs import verify

    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    array = _RNG.integers(10, 400, (32, 24, 2)).astype(np.uint16)
    array[:16, :12] = 9  # One patch of nodata by the PAM file alone.
    path = _plain_tiff(root / "a" / "scene.tif", array, tile=(16, 16))
    (root / "a" / "scene.tfw").write_text(_WORLD["b"])
    (root / "a" / "scene.tif.aux.xml").write_text(_pam_nodata(tmp_path, 9, 2))
    _, (x0, dx, rx, y0, ry, dy), nodata = _gdal(path)
    assert nodata == (9.0, 9.0)
    out = tmp_path / "out"
    manifest = convert(root, out, "--raster_patch", "16,12", "--raster_max_nodata", "0.5", "--raster_georef")
    got = {r[schemas.FILENAME.key].decode(): tuple(r[schemas.GEOTRANSFORM.key]) for r, _, _ in decoded_records(out)}
    assert got == {f"a/scene.tif#patch={y},{x}": (x0 + x * dx, dx, rx, y0 + y * dy, ry, dy)
                   for y, x in ((0, 12), (16, 0), (16, 12))}  # (0, 0) is skipped for its nodata.
    assert manifest.splits["train"].band_stats.nodata == (0, 0)
    assert verify.main([str(out)]) == 0


def _external_mask_tiff(path: pathlib.Path, array: np.ndarray, mask: np.ndarray, **options) -> pathlib.Path:
    """A GeoTIFF with GDAL's external mask beside it (`scene.tif.msk`, GDAL_TIFF_INTERNAL_MASK=NO)."""
    height, width, bands = array.shape
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=False):
        with rasterio.open(path, "w", driver="GTiff", width=width, height=height, count=bands,
                           dtype=array.dtype.name, transform=_UTM, crs="EPSG:32633", **options) as dst:
            dst.write(array.transpose(2, 0, 1))
            dst.write_mask(np.where(mask, 0, 255).astype(np.uint8))
    assert (path.parent / (path.name + ".msk")).exists()
    return path


def test_an_external_msk_is_the_rasters_mask_as_gdal_takes_it(tmp_path):
    array = _RNG.integers(0, 5000, (20, 18, 2)).astype(np.uint16)
    mask = np.zeros((20, 18), bool)
    mask[-5:] = True
    array[-5:] = 65000
    path = _external_mask_tiff(tmp_path / "e.tif", array, mask)
    (image,) = _validate(path, georef=False)
    stats = image.band_stats
    for b, (count, low, high, mean) in enumerate(_gdal_stats(path)):
        assert (stats.count[b], stats.nodata[b]) == (count, 90) and high < 65000
        assert (stats.min[b], stats.max[b]) == (low, high)
        assert stats.mean[b] == pytest.approx(mean, rel=1e-12)
    assert image.details["sidecars"] == ["e.tif.msk"] and image.details["masked_pixels"] == 90


def test_an_external_msk_of_another_size_or_damaged_is_left_out_with_a_warning(tmp_path, caplog):
    path = _plain_tiff(tmp_path / "e.tif", _RNG.integers(0, 5000, (8, 8)).astype(np.uint16))
    _plain_tiff(tmp_path / "e.tif.msk", np.zeros((4, 4), np.uint8))
    with caplog.at_level(logging.WARNING):
        (image,) = _validate(path, georef=False)
    assert image.band_stats.count == (64,) and "it is 4x4, the raster 8x8" in caplog.text
    (tmp_path / "e.tif.msk").write_bytes(b"II*\0" + b"\xff" * 20)
    (image,) = _validate(path, georef=False)
    assert image.band_stats.count == (64,) and "e.tif's external mask (e.tif.msk) is left out" in caplog.text


def test_patches_take_an_external_msk_as_their_mask(tmp_path):
    from imaging import patches, scenes

    array = _RNG.integers(0, 5000, (32, 16, 1)).astype(np.uint16)
    mask = np.zeros((32, 16), bool)
    mask[:12] = True
    path = _external_mask_tiff(tmp_path / "m.tif", array, mask, tiled=True, blockxsize=16, blockysize=16)
    options = RasterOptions(patch=patches.PatchOptions(size=(16, 16), max_nodata=0.5))
    cut = scenes.cut_rows(str(path), "m.tif", 0, 32, options, sidecars=sidecars.load(str(path), "m.tif", False))
    assert cut.skipped == [(0, 0)]  # 12 of its 16 rows masked.
    (image,) = cut.images
    assert image.patch == (16, 0) and image.band_stats.count == (256,)
    # With its second row partly masked: the masked pixels leave its statistics.
    mask[16:18] = True
    _external_mask_tiff(path, array, mask, tiled=True, blockxsize=16, blockysize=16)
    cut = scenes.cut_rows(str(path), "m.tif", 0, 32, options, sidecars=sidecars.load(str(path), "m.tif", False))
    assert cut.images[0].band_stats.nodata == (32,)


def _jp2(path: pathlib.Path, array: np.ndarray, boxes: bool, nodata=None, codec: str = "JP2") -> pathlib.Path:
    """A lossless JPEG 2000 GDAL writes (JP2OpenJPEG): with its GeoJP2 and GMLJP2 boxes, or none;
    a nodata value goes to its PAM file (`scene.jp2.aux.xml`), where GDAL keeps it."""
    height, width, bands = array.shape
    options = {} if boxes else {"GeoJP2": "NO", "GMLJP2": "NO"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(path, "w", driver="JP2OpenJPEG", width=width, height=height, count=bands,
                           dtype=array.dtype.name, transform=_UTM if boxes else None,
                           crs="EPSG:32633" if boxes else None, nodata=nodata, QUALITY="100",
                           REVERSIBLE="YES", CODEC=codec, **options) as dst:
            dst.write(array.transpose(2, 0, 1))
    return path


@pytest.mark.parametrize("case", ["boxes and a world file", "a world file alone", "a .j2k's world file",
                                  "a PAM file over the boxes"])
def test_a_whole_jpeg2000_takes_its_sidecars_as_gdals_jp2openjpeg_driver_reads_them(tmp_path, case):
    array = _RNG.integers(10, 4000, (16, 12, 1)).astype(np.uint16)
    if case == "a .j2k's world file":
        path = _jp2(tmp_path / "s.j2k", array, boxes=False, codec="J2K")
        (tmp_path / "s.j2w").write_text(_WORLD["a"])  # Not a .j2k's name: GDAL passes it over.
        (tmp_path / "s.j2kw").write_text(_WORLD["b"])
    else:
        path = _jp2(tmp_path / "s.jp2", array, boxes=case != "a world file alone")
        (tmp_path / "s.j2w").write_text(_WORLD["a"])
        (tmp_path / "s.wld").write_text(_WORLD["c"])
    if case == "a PAM file over the boxes":
        (tmp_path / "s.jp2.aux.xml").write_text("<PAMDataset><SRS>EPSG:3857</SRS>"
                                                "<GeoTransform>100, 2, 0, 200, 0, -2</GeoTransform></PAMDataset>")
    epsg, geotransform, _ = _gdal(path)
    assert geotransform != (0.0, 1.0, 0.0, 0.0, 0.0, 1.0)
    (image,) = _validate(path)
    assert (image.georef.epsg, image.georef.geotransform) == (epsg or 0, geotransform)
    assert image.details["sidecars"]
    np.testing.assert_array_equal(stored_values(image), array)


def test_a_whole_jpeg2000s_pam_nodata_and_external_mask_leave_its_band_statistics(tmp_path):
    array = _RNG.integers(10, 4000, (16, 12, 2)).astype(np.uint16)
    array[:2] = 7
    path = _jp2(tmp_path / "n.jp2", array, boxes=True, nodata=7)
    assert (tmp_path / "n.jp2.aux.xml").exists()  # Where GDAL keeps a JPEG 2000's nodata value.
    (image,) = _validate(path, georef=False)
    for b, (count, low, high, mean) in enumerate(_gdal_stats(path)):
        assert (image.band_stats.count[b], image.band_stats.nodata[b]) == (count, 24)
        assert (image.band_stats.min[b], image.band_stats.max[b]) == (low, high)
    # GDAL's external mask beside it (written for a GeoTIFF, the same file GDAL writes for any raster),
    # without the nodata value (rasterio's masked read then is GDAL's mask alone).
    (tmp_path / "n.jp2.aux.xml").unlink()
    mask = np.zeros((16, 12), bool)
    mask[:, -4:] = True
    _external_mask_tiff(tmp_path / "m.tif", array, mask)
    shutil.copy(tmp_path / "m.tif.msk", tmp_path / "n.jp2.msk")
    (image,) = _validate(path, georef=False)
    stats = image.band_stats
    for b, (count, low, high, mean) in enumerate(_gdal_stats(path)):
        assert (stats.count[b], stats.nodata[b]) == (count, 64) and count == 128
        assert stats.mean[b] == pytest.approx(mean, rel=1e-12)
    assert image.details["masked_pixels"] == 64
    # An 8-bit photo-like JPEG 2000 with a nodata value is a raster: its statistics too.
    photo = _jp2(tmp_path / "p.jp2", np.full((8, 8, 3), 200, np.uint8), boxes=True, nodata=0)
    (image,) = _validate(photo, georef=False)
    assert image.band_stats is not None and image.band_stats.count == (64, 64, 64)


def test_jpeg2000s_and_their_sidecars_through_the_converter_the_records_and_verify(tmp_path):
    from beam_jobs import verify

    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    array = _RNG.integers(10, 4000, (16, 12, 1)).astype(np.uint16)
    array[0] = 9
    georeferenced = _jp2(root / "a" / "w.jp2", array, boxes=False, nodata=9)
    (root / "a" / "w.j2w").write_text(_WORLD["b"])
    _, geotransform, nodata = _gdal(georeferenced)
    assert nodata == (9.0,)
    out = tmp_path / "out"
    manifest = convert(root, out, "--raster_georef")
    (record, _, _), = decoded_records(out)
    assert tuple(record[schemas.GEOTRANSFORM.key]) == geotransform
    assert manifest.splits["train"].band_stats.nodata == (12,)
    assert manifest.counts["skipped"] == 2  # its PAM file and its world file, as sidecars
    assert verify.main([str(out)]) == 0
