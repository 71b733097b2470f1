"""JPEG 2000 scenes (Sentinel-2's bands) through the real Beam converter, cut into patches and stacked.

GDAL (rasterio's JP2OpenJPEG driver) writes the scenes: tiled and one-tile,
lossless and lossy, georeferenced by a GMLJP2 box alone (as Sentinel-2's
tiles), a GeoJP2 box alone, or EPSG:4326 (latitude first in GMLJP2). Every
stored patch is compared with rasterio's boundless window read, its EPSG
code and geotransform with rasterio's window transform; a time series of
JPEG 2000 passes (and one GeoTIFF pass of the same grid) is compared with
rasterio's reads of every date.
"""

from __future__ import annotations

import functools
import json
import pathlib
import warnings

import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import Affine, from_origin  # noqa: E402
from rasterio.windows import Window  # noqa: E402

import schemas  # noqa: E402
from beam_jobs import verify  # noqa: E402
from helpers import convert, decoded_records, write_geotiff, write_jp2  # noqa: E402
from imaging.patches import PatchOptions, grid  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")

_RNG = np.random.default_rng(1125)
_PATCH, _STRIDE, _EDGE = 64, 48, "pad"


_jp2 = functools.partial(write_jp2, lossy_quality=30)


_SCENES = {
    # Sentinel-2-like: 15-bit uint16, 2 bands, 64 x 48 tiles, GMLJP2 only.
    "s2/b02_gmljp2.jp2": (lambda p: _jp2(p, _RNG.integers(0, 2 ** 15, (2, 150, 230), dtype=np.uint16), "EPSG:32631",
                                         from_origin(600000.0, 5000040.0, 10.0, 10.0), NBITS=15, GMLJP2="YES",
                                         GeoJP2="NO", blockxsize=64, blockysize=48)),
    # An RGB orthophoto: lossy, one tile, GeoJP2 only.
    "rgb/ortho_geojp2.jp2": (lambda p: _jp2(p, _RNG.integers(0, 256, (3, 130, 170), dtype=np.uint8), "EPSG:32633",
                                            from_origin(399960.0, 5800020.0, 0.5, 0.5), lossless=False,
                                            GMLJP2="NO", GeoJP2="YES")),
    # A DEM in EPSG:4326, GMLJP2 only: latitude first in the box.
    "dem/wgs84_gmljp2.jp2": (lambda p: _jp2(p, _RNG.integers(-400, 4000, (1, 100, 120), dtype=np.int16), "EPSG:4326",
                                            Affine(0.0001, 0.0, 12.25, 0.0, -0.0001, 48.5), GMLJP2="YES",
                                            GeoJP2="NO", blockxsize=32, blockysize=32)),
}


def _expected(path: pathlib.Path, options: PatchOptions):
    """{(y, x): (window, (epsg, geotransform))} of every patch, from rasterio's boundless reads."""
    h, w = options.size
    out = {}
    with rasterio.open(path) as src:
        for y, x in grid(src.height, src.width, options):
            window = Window(x, y, w, h)
            pixels = np.moveaxis(src.read(window=window, boundless=True, fill_value=0), 0, -1)
            out[(y, x)] = (pixels, (src.crs.to_epsg(), src.window_transform(window).to_gdal()))
    return out


@pytest.fixture(scope="module")
def cut(tmp_path_factory):
    root = tmp_path_factory.mktemp("jp2_scenes")
    paths = {rel: make(root / "in" / rel) for rel, make in _SCENES.items()}
    convert(root / "in", root / "out", "--raster_patch", _PATCH, "--raster_stride", _STRIDE, "--raster_edge", _EDGE,
            "--raster_georef", "--num_shards", 2, "--max_reject_fraction", "0")
    return paths, root / "out"


def test_every_patch_is_gdals_window_with_its_georeferencing(cut):
    paths, out = cut
    records = {}
    for record, _, _ in decoded_records(out):
        records[record[schemas.FILENAME.key].decode()] = record
    options = PatchOptions(_PATCH, _STRIDE, _EDGE)
    want = {f"{rel}#patch={y},{x}": expected for rel, path in paths.items()
            for (y, x), expected in _expected(path, options).items()}
    assert sorted(records) == sorted(want)
    for name, (window, (epsg, geotransform)) in want.items():
        record = records[name]
        fmt = record[schemas.FORMAT.key].decode()
        h, w, c = (record[k.key] for k in (schemas.HEIGHT, schemas.WIDTH, schemas.CHANNELS))
        if fmt == "png":
            import imagecodecs

            got = imagecodecs.png_decode(record[schemas.IMAGE.key]).reshape(h, w, c)
        else:
            got = np.frombuffer(record[schemas.IMAGE.key], np.dtype(schemas.parse_raw_format(fmt)).newbyteorder("<"))
            got = got.reshape(h, w, c)
        assert got.dtype == window.dtype, name
        np.testing.assert_array_equal(got, window, err_msg=name)
        assert record[schemas.EPSG.key] == epsg, name
        np.testing.assert_allclose(record[schemas.GEOTRANSFORM.key], geotransform, rtol=0, atol=1e-9, err_msg=name)


def test_patches_say_they_come_from_jpeg2000_and_verify_passes(cut):
    _, out = cut
    formats = set()
    for line in (out / schemas.NORMALIZED_FILENAME).read_text().splitlines():
        entry = json.loads(line)
        if "#patch=" in entry["path"]:
            formats.add(entry["source_format"])
            assert any(a in entry["actions"] for a in ("store_jpeg2000_as_raw", "reencode_jpeg2000_to_png"))
    assert formats == {"jpeg2000"}
    manifest = json.loads((out / schemas.MANIFEST_FILENAME).read_text())
    assert manifest["counts"]["found"] == manifest["counts"]["written"] == 3
    assert verify.main([str(out)]) == 0


def test_a_time_series_of_jpeg2000_passes_stacks_as_gdal_reads_them(tmp_path):
    root, out = tmp_path / "in", tmp_path / "out"
    transform = from_origin(600000.0, 5000040.0, 10.0, 10.0)
    files = {}
    for d, date in enumerate(("20200514", "20200604", "20200714")):
        for b, band in enumerate(("B02", "B03")):
            array = _RNG.integers(0, 2 ** 15, (1, 37, 45), dtype=np.uint16)
            path = root / "forest" / "field" / f"T31TFJ_{date}T103629_{band}.jp2"
            if (date, band) == ("20200604", "B03"):  # One pass delivered as a GeoTIFF of the same grid.
                path = write_geotiff(path.with_suffix(".tif"), array, crs="EPSG:32631", transform=transform)
            else:
                _jp2(path, array, "EPSG:32631", transform, NBITS=15, GMLJP2="YES", GeoJP2="NO",
                     blockxsize=32, blockysize=32)
            files[(date, band)] = path
    manifest = convert(root, out, "--time_series", "--raster_patch", "16", "--raster_stride", "12",
                       "--raster_edge", "pad", "--bands", "B03,B02")
    assert manifest.counts["written"] == 6 and manifest.counts.get("rejected", 0) == 0
    found = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    schema = schemas.TimeSeriesExampleSchema.from_json(found.features)
    from schemas.tfrecord import iter_records

    records = {}
    for info in found.splits["train"].shards:
        with open(out / info.file, "rb") as f:
            for _, _, payload in iter_records(f):
                record = schema.decode(payload)
                records[record[schemas.FILENAME.key].decode()] = record
    assert sorted(records) == sorted(f"forest/field#patch={y},{x}" for y in (0, 12, 24) for x in (0, 12, 24, 36))
    for name, record in records.items():
        y, x = (int(v) for v in name.split("=")[1].split(","))
        window = Window(x, y, 16, 16)
        stack = []
        for date in ("20200514", "20200604", "20200714"):
            planes = []
            for band in ("B03", "B02"):
                with rasterio.open(files[(date, band)]) as src:
                    planes.append(src.read(1, window=window, boundless=True, fill_value=0))
            stack.append(np.stack(planes, axis=-1))
        np.testing.assert_array_equal(schemas.TimeSeriesExampleSchema.array(record), np.stack(stack), err_msg=name)
        assert record[schemas.EPSG.key] == 32631
        with rasterio.open(files[("20200514", "B02")]) as src:
            assert record[schemas.GEOTRANSFORM.key] == tuple(src.window_transform(window).to_gdal())


def test_a_jpeg2000_scenes_label_raster_is_cut_with_it(tmp_path):
    import io

    from PIL import Image

    ids = _RNG.integers(0, 6, (1, 150, 230), dtype=np.uint8)
    scene = _jp2(tmp_path / "in" / "s2" / "tile.jp2", _RNG.integers(1, 2 ** 15, (2, 150, 230), dtype=np.uint16),
                 "EPSG:32631", from_origin(600000.0, 5000040.0, 10.0, 10.0), NBITS=15, blockxsize=64, blockysize=48)
    mask = write_geotiff(tmp_path / "masks" / "s2" / "tile.tif", ids, crs="EPSG:32631",
                         transform=from_origin(600000.0, 5000040.0, 10.0, 10.0))
    convert(tmp_path / "in", tmp_path / "out", "--masks_dir", tmp_path / "masks", "--raster_patch", _PATCH,
            "--raster_stride", _STRIDE, "--raster_edge", _EDGE)
    records = {r[schemas.FILENAME.key].decode(): r for r, _, _ in decoded_records(tmp_path / "out")}
    options = PatchOptions(_PATCH, _STRIDE, _EDGE)
    assert sorted(records) == sorted(f"s2/tile.jp2#patch={y},{x}" for y, x in grid(150, 230, options))
    with rasterio.open(scene) as src, rasterio.open(mask) as labels:
        for y, x in grid(150, 230, options):
            record = records[f"s2/tile.jp2#patch={y},{x}"]
            window = Window(x, y, _PATCH, _PATCH)
            want = np.moveaxis(src.read(window=window, boundless=True, fill_value=0), 0, -1)
            got = np.frombuffer(record[schemas.IMAGE.key], np.dtype("<u2")).reshape(want.shape)
            np.testing.assert_array_equal(got, want)
            with Image.open(io.BytesIO(record[schemas.MASK.key])) as im:
                np.testing.assert_array_equal(np.asarray(im), labels.read(1, window=window, boundless=True,
                                                                          fill_value=255))


def test_the_nodata_value_gdal_keeps_beside_a_jpeg2000_skips_and_pads_its_patches(tmp_path):
    # GDAL writes a JPEG 2000's nodata value into its PAM file (scene.jp2.aux.xml), not the file.
    array = _RNG.integers(1, 2 ** 15, (2, 150, 230), dtype=np.uint16)
    array[:, :90, :120] = 7  # A corner of nodata: patches there are skipped.
    path = tmp_path / "in" / "s2" / "tile.jp2"
    path.parent.mkdir(parents=True)
    with rasterio.open(path, "w", driver="JP2OpenJPEG", height=150, width=230, count=2, dtype="uint16",
                       crs="EPSG:32631", transform=from_origin(600000.0, 5000040.0, 10.0, 10.0), nodata=7,
                       QUALITY=100, REVERSIBLE="YES", blockxsize=64, blockysize=48) as dst:
        dst.write(array)
    assert (tmp_path / "in" / "s2" / "tile.jp2.aux.xml").exists()
    convert(tmp_path / "in", tmp_path / "out", "--raster_patch", _PATCH, "--raster_stride", _STRIDE,
            "--raster_edge", _EDGE, "--raster_max_nodata", 0.5)
    records = {r[schemas.FILENAME.key].decode(): r for r, _, _ in decoded_records(tmp_path / "out")}
    kept = {}
    with rasterio.open(path) as src:
        assert src.nodata == 7
        for y, x in grid(150, 230, PatchOptions(_PATCH, _STRIDE, _EDGE)):
            window = np.moveaxis(src.read(window=Window(x, y, _PATCH, _PATCH), boundless=True, fill_value=7), 0, -1)
            if np.count_nonzero((window == 7).all(axis=2)) / (_PATCH * _PATCH) <= 0.5:
                kept[f"s2/tile.jp2#patch={y},{x}"] = window
    assert kept and len(kept) < len(grid(150, 230, PatchOptions(_PATCH, _STRIDE, _EDGE)))
    assert sorted(records) == sorted(kept)
    for name, window in kept.items():
        got = np.frombuffer(records[name][schemas.IMAGE.key], np.dtype("<u2")).reshape(window.shape)
        np.testing.assert_array_equal(got, window, err_msg=name)  # Padding holds 7.


def test_a_jpeg2000_without_georeferencing_boxes_takes_its_world_file_as_gdal(tmp_path):
    array = _RNG.integers(1, 2 ** 15, (1, 100, 120), dtype=np.uint16)
    path = tmp_path / "in" / "s2" / "plain.jp2"
    path.parent.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Not georeferenced: GDAL says so.
        with rasterio.open(path, "w", driver="JP2OpenJPEG", height=100, width=120, count=1, dtype="uint16",
                           QUALITY=100, REVERSIBLE="YES", GMLJP2="NO", GeoJP2="NO") as dst:
            dst.write(array)
    # GDAL's world file name for .jp2: first and last letters + 'w'. Six numbers: pixel sizes,
    # rotation terms, then the centre of the top-left pixel.
    (path.parent / "plain.j2w").write_text("10.0\n0.0\n0.0\n-10.0\n600005.0\n5000035.0\n")
    convert(tmp_path / "in", tmp_path / "out", "--raster_patch", _PATCH, "--raster_georef")
    records = {r[schemas.FILENAME.key].decode(): r for r, _, _ in decoded_records(tmp_path / "out")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(path) as src:
            assert src.transform.to_gdal() == (600000.0, 10.0, 0.0, 5000040.0, 0.0, -10.0)
            for y, x in grid(100, 120, PatchOptions(_PATCH)):
                record = records[f"s2/plain.jp2#patch={y},{x}"]
                want = src.window_transform(Window(x, y, _PATCH, _PATCH)).to_gdal()
                assert record[schemas.GEOTRANSFORM.key] == want
