"""JPEG 2000 scenes read tile by tile, and their GeoJP2/GMLJP2 georeferencing (imaging/jp2.py), against GDAL.

Files are written by GDAL's JP2OpenJPEG driver (rasterio); every window is
compared with rasterio's boundless window read, every georeferencing with
what GDAL reports (its transform and EPSG code) for the same file. GMLJP2
variants GDAL does not write (other CRS names, axis orders, coordinates)
are made by replacing the XML of a GDAL-written file's GMLJP2 box, and read
by GDAL too.
"""

from __future__ import annotations

import functools
import io
import pathlib
import struct
import warnings

import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import Affine, from_origin  # noqa: E402
from rasterio.windows import Window  # noqa: E402

from helpers import write_jp2  # noqa: E402
from imaging import ImageRejected, ImageValidator, RasterOptions  # noqa: E402
from imaging.jp2 import Jp2SceneReader, georef, read_structure  # noqa: E402
from imaging.patches import PatchOptions, SceneReader, open_scene  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")

_RNG = np.random.default_rng(2011)
_UTM = from_origin(399960.0, 5800020.0, 10.0, 10.0)


_gdal_jp2 = functools.partial(write_jp2, crs="EPSG:32633", transform=_UTM, lossy_quality=25)


def _gdal_georef(path: pathlib.Path):
    """(EPSG code or None, geotransform) as GDAL reports them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(path) as src:
            return (None if src.crs is None else src.crs.to_epsg()), src.transform.to_gdal()


_TILED = dict(blockxsize=64, blockysize=48)
# name -> (array, creation options): tiles in both directions, one tile, lossy RGB, signed.
_CASES = {
    "uint16_15bit_2_bands_tiled": (_RNG.integers(0, 2 ** 15, (2, 150, 230), dtype=np.uint16),
                                   dict(NBITS=15, **_TILED)),
    "uint16_one_tile": (_RNG.integers(0, 2 ** 16, (1, 70, 90), dtype=np.uint16), {}),
    "uint8_rgb_lossy_tiled": (_RNG.integers(0, 256, (3, 130, 170), dtype=np.uint8), dict(lossless=False, **_TILED)),
    "int16_tiled": (_RNG.integers(-500, 4000, (1, 100, 140), dtype=np.int16), _TILED),
}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_every_window_is_gdals_boundless_read(tmp_path, name):
    array, options = _CASES[name]
    path = _gdal_jp2(tmp_path / f"{name}.jp2", array, **options)
    bands, height, width = array.shape
    with rasterio.open(path) as src:
        gdal = {}
        for y in (-20, 0, 37, height - 30):
            for x in (-10, 0, 61, width - 25):
                window = Window(x, y, 50, 60)
                gdal[(y, x)] = np.moveaxis(src.read(window=window, boundless=True, fill_value=0), 0, -1)
    with open_scene(path, name) as scene:
        assert isinstance(scene, Jp2SceneReader)
        assert (scene.height, scene.width, scene.bands, scene.dtype) == (height, width, bands, array.dtype)
        assert scene.nodata is None and not scene.has_mask
        for (y, x), want in gdal.items():
            got = scene.read(y, x, 60, 50)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} window {y},{x}")
            outside = scene.padded(y, x, 60, 50)
            assert outside.any() == (y < 0 or x < 0 or y + 60 > height or x + 50 > width)


def test_only_the_tiles_a_window_overlaps_are_decoded_each_once_per_row(tmp_path):
    array = _RNG.integers(0, 2 ** 15, (1, 150, 230), dtype=np.uint16)
    path = _gdal_jp2(tmp_path / "t.jp2", array, NBITS=15, **_TILED)
    with Jp2SceneReader(path, "t.jp2") as scene:
        assert scene.segment_shape == (48, 64)  # GDAL's tiles: 4 rows of 4 (the last ones cut).
        view = scene.read(50, 70, 20, 30, copy=False)  # Inside tile (1, 1): that tile alone.
        assert scene.decoded_segments == 1 and not view.flags.writeable
        np.testing.assert_array_equal(view[:, :, 0], array[0, 50:70, 70:100])
        for x in range(0, 230, 10):  # The row of tiles at rows 48-95, left to right.
            np.testing.assert_array_equal(scene.read(50, x, 20, 10)[:, :, 0], array[0, 50:70, x:x + 10])
        assert scene.decoded_segments == 4  # Each of the row's 4 tiles once.
        scene.read(100, 0, 40, 230)  # Rows 100-139: the third row of tiles, dropping the second.
        assert scene.decoded_segments == 8
        assert scene.decoded_bytes == (3 * 64 + 38) * 48 * 2 * 2
    # A J2K codestream without the JP2 boxes reads alike (GDAL's CODEC=J2K).
    bare = _gdal_jp2(tmp_path / "t.j2k", array, NBITS=15, CODEC="J2K", **_TILED)
    with open_scene(io.BytesIO(bare.read_bytes()), "t.j2k") as scene:
        np.testing.assert_array_equal(scene.read(0, 0, 150, 230)[:, :, 0], array[0])
        assert scene.decoded_segments == 16
    # A GeoTIFF still opens with the TIFF reader.
    from helpers import write_geotiff

    tif = write_geotiff(tmp_path / "t.tif", array)
    with open_scene(tif) as scene:
        assert isinstance(scene, SceneReader) and scene.source_format == "tiff"


@pytest.mark.parametrize("crs, transform", [
    ("EPSG:32633", _UTM),
    ("EPSG:32633", Affine(10.0, 1.5, 399960.0, -2.0, -10.0, 5800020.0)),  # Rotated.
    ("EPSG:4326", Affine(0.0001, 0.0, 12.25, 0.0, -0.0001, 48.5)),  # Latitude first in GMLJP2.
    ("EPSG:3035", from_origin(4321000.0, 3210000.0, 20.0, 20.0)),  # ETRS89-LAEA: northing first in EPSG.
], ids=["utm", "utm_rotated", "wgs84", "laea"])
@pytest.mark.parametrize("boxes", ["gmljp2_only", "geojp2_only", "both"])
def test_georeferencing_is_what_gdal_reports(tmp_path, crs, transform, boxes):
    array = _RNG.integers(0, 256, (1, 40, 60), dtype=np.uint8)
    options = {"gmljp2_only": dict(GMLJP2="YES", GeoJP2="NO"), "geojp2_only": dict(GMLJP2="NO", GeoJP2="YES"),
               "both": dict(GMLJP2="YES", GeoJP2="YES")}[boxes]
    path = _gdal_jp2(tmp_path / "g.jp2", array, crs=crs, transform=transform, **options)
    epsg, geotransform = _gdal_georef(path)
    with Jp2SceneReader(path) as scene:
        found = scene.georef
    assert found.epsg == epsg == int(crs.split(":")[1])
    np.testing.assert_allclose(found.geotransform, geotransform, rtol=0, atol=1e-9)
    assert (found.height, found.width) == (40, 60)
    # The whole-image handler (--raster_georef) reads the same.
    [image] = ImageValidator(raster=RasterOptions(georef=True)).validate_all(path.read_bytes(), "g.jp2")
    assert image.georef.epsg == epsg
    np.testing.assert_allclose(image.georef.geotransform, geotransform, rtol=0, atol=1e-9)


_GML = """<?xml version="1.0" encoding="UTF-8"?>
<gml:FeatureCollection xmlns:gml="http://www.opengis.net/gml">
  {bounded}
  <gml:featureMember><gml:FeatureCollection><gml:featureMember>
    <gml:RectifiedGridCoverage dimension="2" gml:id="RGC0001"><gml:rectifiedGridDomain>
      <gml:RectifiedGrid dimension="2" {grid_srs}>
        <gml:limits><gml:GridEnvelope><gml:low>0 0</gml:low><gml:high>59 39</gml:high></gml:GridEnvelope></gml:limits>
        {axes}
        <gml:origin><gml:Point gml:id="P0001" {point_srs}>{point}</gml:Point></gml:origin>
        <gml:offsetVector>{v1}</gml:offsetVector>
        <gml:offsetVector>{v2}</gml:offsetVector>
      </gml:RectifiedGrid>
    </gml:rectifiedGridDomain></gml:RectifiedGridCoverage>
  </gml:featureMember></gml:FeatureCollection></gml:featureMember>
</gml:FeatureCollection>{tail}"""

_LAT_FIRST = dict(point="<gml:pos>48.5 12.25</gml:pos>", v1="0 0.0001", v2="-0.0001 0")
_LON_FIRST = dict(point="<gml:pos>12.25 48.5</gml:pos>", v1="0.0001 0", v2="0 -0.0001")
_GML_CASES = {
    "urn_4326": dict(point_srs='srsName="urn:ogc:def:crs:EPSG::4326"', **_LAT_FIRST),
    "url_4326": dict(point_srs='srsName="http://www.opengis.net/def/crs/EPSG/0/4326"', **_LAT_FIRST),
    "plain_epsg_4326_as_written": dict(point_srs='srsName="EPSG:4326"', **_LON_FIRST),
    "axis_names_say_longitude_first": dict(point_srs='srsName="urn:ogc:def:crs:EPSG::4326"',
                                           axes="<gml:axisName>Long</gml:axisName><gml:axisName>Lat</gml:axisName>",
                                           **_LON_FIRST),
    "alternate_offset_vector_order": dict(point_srs='srsName="urn:ogc:def:crs:EPSG::4326"',
                                          tail="<!-- GDAL_JP2K_ALT_OFFSETVECTOR_ORDER=TRUE -->",
                                          point="<gml:pos>48.5 12.25</gml:pos>", v1="0.0001 0", v2="0 -0.0001"),
    "srs_on_the_envelope": dict(bounded='<gml:boundedBy><gml:Envelope srsName="urn:ogc:def:crs:EPSG::32631">'
                                        '<gml:lowerCorner>0 0</gml:lowerCorner><gml:upperCorner>1 1</gml:upperCorner>'
                                        '</gml:Envelope></gml:boundedBy>',
                                point="<gml:pos>600005 5000035</gml:pos>", v1="10 0", v2="0 -10"),
    "srs_on_the_grid_and_coordinates": dict(grid_srs='srsName="urn:ogc:def:crs:EPSG::32631"',
                                            point="<gml:coordinates>600005,5000035</gml:coordinates>",
                                            v1="10,0", v2="0,-10"),
    "unknown_crs_name": dict(point_srs='srsName="urn:ogc:def:crs:OGC:1.3:CRS84"', **_LON_FIRST),
}


def _with_gml(data: bytes, xml: str) -> bytes:
    """A JP2 file with its GMLJP2 'asoc' box holding `xml` instead of GDAL's."""
    def box(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I4s", 8 + len(body), kind) + body

    gml = box(b"asoc", box(b"lbl ", b"gml.data") + box(b"asoc", box(b"lbl ", b"gml.root-instance")
                                                          + box(b"xml ", xml.encode())))
    out, pos, replaced = [], 0, False
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        length = length or len(data) - pos
        out.append(gml if kind == b"asoc" else data[pos:pos + length])
        replaced |= kind == b"asoc"
        pos += length
    assert replaced
    return b"".join(out)


@pytest.mark.parametrize("case", sorted(_GML_CASES))
def test_gmljp2_variants_read_as_gdal_reads_them(tmp_path, case):
    fields = dict(bounded="", grid_srs="", axes="<gml:axisName>x</gml:axisName><gml:axisName>y</gml:axisName>",
                  point_srs="", tail="")
    fields.update(_GML_CASES[case])
    array = _RNG.integers(0, 256, (1, 40, 60), dtype=np.uint8)
    written = _gdal_jp2(tmp_path / "w.jp2", array, crs="EPSG:32633", GMLJP2="YES", GeoJP2="NO")
    path = tmp_path / f"{case}.jp2"
    path.write_bytes(_with_gml(written.read_bytes(), _GML.format(**fields)))
    epsg, geotransform = _gdal_georef(path)
    found = georef(read_structure(io.BytesIO(path.read_bytes()), case), case)
    assert found.epsg == (epsg or 0)
    np.testing.assert_allclose(found.geotransform, geotransform, rtol=0, atol=1e-9)


def test_geojp2_comes_first_as_in_gdal(tmp_path):
    array = _RNG.integers(0, 256, (1, 40, 60), dtype=np.uint8)
    written = _gdal_jp2(tmp_path / "w.jp2", array, GMLJP2="YES", GeoJP2="YES")
    other = _GML.format(bounded="", grid_srs="", axes="", point_srs='srsName="urn:ogc:def:crs:EPSG::32631"',
                        tail="", point="<gml:pos>5 5</gml:pos>", v1="10 0", v2="0 -10")
    path = tmp_path / "both.jp2"
    path.write_bytes(_with_gml(written.read_bytes(), other))
    epsg, geotransform = _gdal_georef(path)
    with Jp2SceneReader(path) as scene:
        assert (scene.georef.epsg, scene.georef.geotransform) == (epsg, geotransform) == (32633, _UTM.to_gdal())


def test_a_file_without_georeferencing_has_none(tmp_path):
    array = _RNG.integers(0, 256, (1, 20, 30), dtype=np.uint8)
    path = tmp_path / "plain.jp2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Not georeferenced: GDAL says so.
        with rasterio.open(path, "w", driver="JP2OpenJPEG", height=20, width=30, count=1, dtype="uint8",
                           QUALITY=100, REVERSIBLE="YES") as dst:
            dst.write(array)
    with Jp2SceneReader(path) as scene:
        assert (scene.georef.epsg, scene.georef.geotransform) == (0, None)


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_a_truncated_scene_is_corrupt_from_its_header(tmp_path, cut):
    array = _RNG.integers(0, 2 ** 15, (1, 150, 230), dtype=np.uint16)
    data = _gdal_jp2(tmp_path / "t.jp2", array, **_TILED).read_bytes()
    with pytest.raises(ImageRejected) as e:
        Jp2SceneReader(data[:int(len(data) * cut)], "t.jp2")
    assert e.value.reason == "corrupt" and "t.jp2" in e.value.message and "truncated" in e.value.message


def test_a_tile_that_does_not_decode_is_corrupt(tmp_path):
    array = _RNG.integers(0, 2 ** 15, (1, 150, 230), dtype=np.uint16)
    data = bytearray(_gdal_jp2(tmp_path / "t.jp2", array, **_TILED).read_bytes())
    with Jp2SceneReader(bytes(data)) as scene:
        offset, length = scene.structure.parts[5][0]
    data[offset + 14:offset + length] = b"\xff" * (length - 14)  # Tile 5's packets: markers only.
    with Jp2SceneReader(bytes(data), "t.jp2") as scene:
        np.testing.assert_array_equal(scene.read(0, 0, 48, 64)[:, :, 0], array[0, :48, :64])  # Tile 0 is sound.
        with pytest.raises(ImageRejected) as e:
            scene.read(48, 64, 10, 10)
    assert e.value.reason == "corrupt" and "t.jp2" in e.value.message


# The CRSs a GMLJP2 box gives in EPSG axis order, northing or latitude first, and some easting first.
_NORTHING_FIRST = [3034, 3035, *range(3038, 3052), *range(31466, 31470), 2180, *range(2176, 2180),
                   *range(3006, 3019), *range(3126, 3141), *range(5105, 5131), 3844, *range(28404, 28433), 3333, 3833]
_EASTING_FIRST = [32633, 32701, 25832, 2056, 27700, 3857, 28992, 2154, 3067, 5514, 21781]
_GEOGRAPHIC = [4326, 4258, 4269, 4283, 4167]


def test_the_axis_order_of_every_crs_it_knows_is_gdals(tmp_path):
    array = _RNG.integers(0, 256, (1, 8, 12), dtype=np.uint8)
    wrong, unknown = [], []
    for code in _NORTHING_FIRST + _EASTING_FIRST + _GEOGRAPHIC:
        transform = (from_origin(10.5, 45.25, 0.001, 0.002) if code in _GEOGRAPHIC
                     else from_origin(512345.0, 4123456.0, 10.0, 20.0))
        try:
            path = _gdal_jp2(tmp_path / f"{code}.jp2", array, crs=f"EPSG:{code}", transform=transform,
                             GMLJP2="YES", GeoJP2="NO")
        except rasterio.errors.RasterioError:
            unknown.append(code)  # A code this GDAL does not know.
            continue
        epsg, geotransform = _gdal_georef(path)
        found = georef(read_structure(io.BytesIO(path.read_bytes()), path.name), path.name)
        if found.epsg != epsg or not np.allclose(found.geotransform, geotransform, rtol=0, atol=1e-9):
            wrong.append((code, found.geotransform, geotransform))
    assert not wrong
    assert len(unknown) < 5, unknown


def test_a_one_tile_scene_is_planned_only_within_max_pixels_as_it_is_decoded_whole(tmp_path):
    from imaging.scenes import scene_header

    array = _RNG.integers(0, 2 ** 16, (1, 70, 90), dtype=np.uint16)
    one_tile = _gdal_jp2(tmp_path / "one.jp2", array)
    tiled = _gdal_jp2(tmp_path / "tiled.jp2", array, blockxsize=32, blockysize=32)
    options = RasterOptions(patch=PatchOptions(32), max_pixels=70 * 90 - 1)
    with pytest.raises(ImageRejected) as e:
        scene_header(str(one_tile), "one.jp2", options)
    assert e.value.reason == "too_large" and "JPEG 2000 of 90x70x1 = 6,300 samples decoded whole" in e.value.message
    header = scene_header(str(tiled), "tiled.jp2", options)
    assert (header.height, header.width, header.segment_shape) == (70, 90, (32, 32))
    header = scene_header(str(one_tile), "one.jp2", RasterOptions(patch=PatchOptions(32), max_pixels=70 * 90))
    assert header.segment_shape == (70, 90)


def test_an_empty_first_geojp2_box_gives_way_to_the_second_as_in_gdal(tmp_path):
    import tifffile

    array = _RNG.integers(0, 256, (1, 40, 60), dtype=np.uint8)
    data = _gdal_jp2(tmp_path / "w.jp2", array, GMLJP2="NO", GeoJP2="YES").read_bytes()
    plain = io.BytesIO()
    tifffile.imwrite(plain, np.zeros((1, 1), np.uint8))  # A GeoJP2 box without GeoTIFF tags.
    uuid = bytes.fromhex("b14bf8bd083d4b43a5ae8cd7d5a6ce03")
    empty = struct.pack(">I4s", 8 + 16 + len(plain.getvalue()), b"uuid") + uuid + plain.getvalue()
    at = data.index(b"uuid" + uuid) - 4  # Before GDAL's own box.
    path = tmp_path / "two.jp2"
    path.write_bytes(data[:at] + empty + data[at:])
    epsg, geotransform = _gdal_georef(path)
    with Jp2SceneReader(path) as scene:
        assert (scene.georef.epsg, scene.georef.geotransform) == (epsg, geotransform) == (32633, _UTM.to_gdal())
