"""Rasters from files on disk through the Beam converter to the reader: every band, every bit."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import tifffile
from helpers import convert, write

import readers
import schemas
from beam_jobs import verify

_RNG = np.random.default_rng(1616)
_CONTIG = dict(photometric="minisblack", planarconfig="contig")


def _tiff(array, **kwargs) -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, array, **kwargs)
    return buf.getvalue()


# One dataset per dtype and band count: {name: (array as read, tifffile keyword arguments)}.
_CASES = {
    "uint16_13_bands": (_RNG.integers(0, 65536, (24, 20, 13), dtype=np.uint16), _CONTIG),
    "uint16_4_bands": (_RNG.integers(0, 65536, (16, 18, 4), dtype=np.uint16), _CONTIG),
    "uint16_rgb": (_RNG.integers(0, 65536, (14, 10, 3), dtype=np.uint16),
                   dict(photometric="rgb", planarconfig="contig")),
    "int16_1_band": (_RNG.integers(-32768, 32768, (20, 12, 1), dtype=np.int16), {}),
    "float32_dem": (_RNG.uniform(-125, 295, (18, 22, 1)).astype(np.float32), {}),
    "float64_3_bands": (_RNG.normal(size=(10, 14, 3)), _CONTIG),
    "uint32_2_bands": (_RNG.integers(0, 2**32, (12, 12, 2), dtype=np.uint32), _CONTIG),
    "int32_1_band": (_RNG.integers(-2**31, 2**31, (9, 11, 1), dtype=np.int32), {}),
}


def _png_stored(manifest) -> bool:
    """8/16-bit with 1, 3 or 4 bands is stored as PNG, anything else raw."""
    return {f for f, _ in manifest.splits["train"].images.formats} == {"png"}


@pytest.fixture(scope="module", params=sorted(_CASES))
def converted(request, tmp_path_factory):
    name = request.param
    base, kwargs = _CASES[name]
    tmp = tmp_path_factory.mktemp(name)
    files = {}
    for c, cls in enumerate(("forest", "water")):
        for i in range(3):
            array = (base + (c * 3 + i)).astype(base.dtype)  # distinct per file
            rel = f"{cls}/patch_{i}.tif"
            data = array[:, :, 0] if array.shape[2] == 1 else array
            write(tmp / "images" / rel, _tiff(data, **kwargs))
            files[rel] = (array, c)
    manifest = convert(tmp / "images", tmp / "out", "--min_shards", "2")
    return name, files, tmp / "out", manifest


def test_every_value_band_and_dtype_comes_back_exactly(converted):
    name, files, out, manifest = converted
    ds = readers.image_dataset_from_tfrecords(
        str(out), "train", batch_size=None, image_size=None, shuffle=False,
        extra_features=(schemas.FILENAME.key,), color_mode=None, dtype=None)
    seen = {}
    for image, label, extras in ds:
        seen[extras[schemas.FILENAME.key].numpy().decode()] = (image.numpy(), int(label))
    assert sorted(seen) == sorted(files), name
    for rel, (array, label) in files.items():
        got, got_label = seen[rel]
        assert got.dtype == array.dtype and got.shape == array.shape, rel
        np.testing.assert_array_equal(got, array, err_msg=rel)
        assert got_label == label


def test_band_statistics_match_numpy_and_normalise_the_batches(converted):
    name, files, out, manifest = converted
    arrays = np.stack([a for a, _ in files.values()]).astype(np.float64)
    stats = manifest.splits["train"].band_stats
    assert stats is not None and stats.num_bands == arrays.shape[-1]
    np.testing.assert_allclose(stats.mean, arrays.mean(axis=(0, 1, 2)), rtol=1e-9)
    np.testing.assert_allclose(stats.std, arrays.std(axis=(0, 1, 2)), rtol=1e-6)
    np.testing.assert_allclose(stats.min, arrays.min(axis=(0, 1, 2)))
    np.testing.assert_allclose(stats.max, arrays.max(axis=(0, 1, 2)))
    h, w = arrays.shape[1:3]
    # PNG-stored rasters too: they decode at their stored depth, values kept, so the
    # statistics of the stored values apply to them as to raw-stored ones.
    ds = readers.image_dataset_from_tfrecords(
        str(out), "train", batch_size=3, image_size=(h, w), normalize="dataset", shuffle=False,
        color_mode=None, dtype="float32")
    got = np.concatenate([b.numpy() for b, _ in ds])
    assert got.shape == arrays.shape
    # Every band now has the split's mean 0 and std 1 (float32 arithmetic).
    np.testing.assert_allclose(got.mean(axis=(0, 1, 2)), 0, atol=1e-3)
    np.testing.assert_allclose(got.std(axis=(0, 1, 2)), 1, rtol=1e-3)


@pytest.mark.parametrize("batch_size, size", [(None, None), (4, "stored"), (4, None)])
def test_float32_gives_the_stored_values_of_png_and_raw_rasters_alike(converted, batch_size, size):
    name, files, out, manifest = converted
    array, _ = next(iter(files.values()))
    h, w = array.shape[:2]
    # Batched either at image_size=(h, w) or at image_size=None (one-size split: the stored size).
    ds = readers.image_dataset_from_tfrecords(
        str(out), "train", batch_size=batch_size, image_size=(h, w) if size == "stored" else None,
        shuffle=False, color_mode=None, dtype="float32", extra_features=(schemas.FILENAME.key,))
    if batch_size is None:
        ds = ds.batch(len(files))
    seen = {}
    for images, _, extras in ds:
        for image, rel in zip(images.numpy(), extras[schemas.FILENAME.key].numpy()):
            seen[rel.decode()] = image
    assert sorted(seen) == sorted(files), name
    for rel, (expected, _) in files.items():
        # A 16-bit PNG band of 5237 is 5237.0, not the photo pipeline's 8-bit 20.0 (wider
        # dtypes: rounded to float32 as numpy rounds them).
        assert seen[rel].dtype == np.float32
        np.testing.assert_array_equal(seen[rel], expected.astype(np.float32), err_msg=rel)
    if _png_stored(manifest):
        assert max(float(a.max()) for a, _ in files.values()) > 255  # 16-bit values, kept


def test_stored_channels_and_dtypes_are_recorded_and_verify_checks_them(converted):
    name, files, out, manifest = converted
    array, _ = next(iter(files.values()))
    fmt = "png" if _png_stored(manifest) else schemas.raw_format(array.dtype)
    # What `color_mode=None, dtype=None` read by: one layout for every record of the split.
    assert manifest.splits["train"].images.layouts == (
        (fmt, array.shape[2], array.dtype.name, len(files)),), name
    # verify recomputes the image stats (layouts included) and the band statistics from the
    # decoded records: an untouched dataset is clean.
    assert verify.main([str(out)]) == 0
    report = json.loads((out / schemas.VERIFY_REPORT_FILENAME).read_text())
    assert report["ok"] and report["problems"] == [] and report["records"] == len(files)


def _geotiff(array, epsg, x0, y0, dx) -> bytes:
    keys = [1, 1, 0, 2, 1024, 0, 1, 1, 3072, 0, 1, epsg]
    return _tiff(array, extratags=[
        (34735, "H", len(keys), keys, True), (33550, "d", 3, (dx, dx, 0.0), True),
        (33922, "d", 6, (0.0, 0.0, 0.0, x0, y0, 0.0), True)], **_CONTIG)


def test_raster_georef_comes_back_exactly_through_beam_and_the_reader(tmp_path):
    import math

    from helpers import read_records
    from shardsmith import inspection

    want = {}  # rel path -> (epsg, geotransform or None)
    for i, (epsg, x0) in enumerate(((32633, 500000.123), (32631, 712345.987654321), (4326, 12.3456789))):
        rel = f"forest/geo_{i}.tif"
        dx = 10.0 if epsg != 4326 else 8.983152841195214e-05
        write(tmp_path / "images" / rel, _geotiff(_RNG.integers(0, 65536, (8, 6, 13), dtype=np.uint16),
                                                  epsg, x0, 5000000.5 + i, dx))
        want[rel] = (epsg, (x0, dx, 0.0, 5000000.5 + i, 0.0, -dx))
    write(tmp_path / "images" / "water/plain.tif", _tiff(_RNG.integers(0, 65536, (8, 6, 13), dtype=np.uint16),
                                                        **_CONTIG))
    want["water/plain.tif"] = (0, None)
    out = tmp_path / "out"
    manifest = convert(tmp_path / "images", out, "--raster_georef")
    ds = readers.image_dataset_from_tfrecords(
        str(out), "train", batch_size=None, image_size=None, shuffle=False, color_mode=None, dtype=None,
        extra_features=(schemas.FILENAME.key, schemas.EPSG.key, schemas.GEOTRANSFORM.key))
    seen = {}
    for _, _, extras in ds:
        gt = extras[schemas.GEOTRANSFORM.key]
        assert gt.dtype.name == "float64" and gt.shape == (6,)
        assert extras[schemas.EPSG.key].dtype.name == "int64"
        seen[extras[schemas.FILENAME.key].numpy().decode()] = (int(extras[schemas.EPSG.key]),
                                                               tuple(gt.numpy().tolist()))
    assert sorted(seen) == sorted(want)
    for rel, (epsg, geotransform) in want.items():
        got_epsg, got_gt = seen[rel]
        assert got_epsg == epsg, rel
        if geotransform is None:
            assert all(math.isnan(v) for v in got_gt), rel
        else:
            assert got_gt == geotransform, rel  # Exact: float64 all the way.
    assert manifest.splits["train"].georeferenced == 3
    assert schemas.ImageExampleSchema.from_json(manifest.features).georef
    assert manifest.options["raster"]["georef"] is True
    # verify reads the georef features with the rest and finds the dataset sound.
    assert verify.main([str(out)]) == 0
    text = inspection.format_inspection(str(out), inspection.inspect_dataset(str(out)))
    assert "georeferenced (epsg, geotransform" in text and "train 3 of 4" in text

    # Without the flag: the same images, no georef features, nothing in the manifest about it.
    plain = convert(tmp_path / "images", tmp_path / "plain")
    assert not schemas.ImageExampleSchema.from_json(plain.features).georef
    assert plain.splits["train"].georeferenced is None and "raster" not in plain.options
    assert "georeferenced" not in (tmp_path / "plain" / schemas.MANIFEST_FILENAME).read_text()
    with_flag = {r[schemas.FILENAME.key]: r[schemas.IMAGE.key] for r in read_records(out)}
    without = {r[schemas.FILENAME.key]: r[schemas.IMAGE.key] for r in read_records(tmp_path / "plain")}
    assert with_flag == without


def test_a_band_of_nodata_everywhere_is_read_and_refused_only_for_normalize_dataset(tmp_path):
    # A band masked out everywhere (NaN: clouds, a failed detector) has no mean or std: only
    # normalising with it can fail; the split is read like any other.
    arrays = {}
    for i, cls in enumerate(("forest", "water")):
        array = _RNG.normal(size=(6, 5, 5)).astype(np.float32)
        array[..., 4] = np.nan
        write(tmp_path / "images" / f"{cls}/masked.tif", _tiff(array, **_CONTIG))
        arrays[f"{cls}/masked.tif"] = array
    manifest = convert(tmp_path / "images", tmp_path / "out")
    assert manifest.splits["train"].band_stats.std[4] is None
    ds = readers.image_dataset_from_tfrecords(
        str(tmp_path / "out"), "train", batch_size=None, image_size=None, shuffle=False,
        extra_features=(schemas.FILENAME.key,), color_mode=None, dtype=None)
    seen = {extras[schemas.FILENAME.key].numpy().decode(): image.numpy() for image, _, extras in ds}
    assert sorted(seen) == sorted(arrays)
    for rel, array in arrays.items():
        np.testing.assert_array_equal(seen[rel], array)  # NaNs equal NaNs here.
    with pytest.raises(schemas.ManifestError, match=r"no valid sample in band\(s\) \[5\].*normalize=\(mean, std\)"):
        readers.image_dataset_from_tfrecords(
            str(tmp_path / "out"), "train", batch_size=None, image_size=None, color_mode=None,
            dtype="float32", normalize="dataset")


def test_preview_shows_png_stored_rasters_through_the_band_mapping(tmp_path):
    from shardsmith import preview

    # 3 bands of 16 bits (e.g. --raster_bands 4,3,2 of Sentinel-2, reflectance 0-10000) are
    # stored as PNG; at 8 bits they would show black, and --rgb_bands must apply to them too.
    arrays = {}
    for cls in ("forest", "water"):
        array = _RNG.integers(0, 10000, (16, 16, 3), dtype=np.uint16)
        write(tmp_path / "images" / f"{cls}/rgb.tif", _tiff(array, **_CONTIG))
        arrays[f"{cls}/rgb.tif"] = array
    manifest = convert(tmp_path / "images", tmp_path / "out")
    assert _png_stored(manifest)
    sheet = preview._build_sheet(tmp_path / "out", "train", per_class=1, image_size=16, seed=0,
                                 max_classes=2, max_records=10, resize="stretch", rgb_bands="3,2,1")
    assert "3-band rasters: bands 3,2,1 as R,G,B (--rgb_bands)" in sheet.header[1]
    assert "dtype='uint16'" in sheet.header[2]
    for row, (_, names) in enumerate(sheet.rows):
        x, y = sheet.layout.tile_origin(row, 0)
        tile = np.asarray(sheet.image)[y:y + 16, x:x + 16]
        want = preview._stretch_to_rgb(arrays[names[0]].astype(np.float32), (3, 2, 1))
        np.testing.assert_array_equal(tile, want)


def test_a_split_of_16_bit_photo_pngs_keeps_the_photo_scale(tmp_path):
    import tensorflow as tf

    photos = {}
    for c, cls in enumerate(("cats", "dogs")):
        for i in range(2):
            array = _RNG.integers(256, 65536, (10, 12, 3), dtype=np.uint16)
            data = tf.io.encode_png(array).numpy()
            write(tmp_path / "images" / cls / f"p{i}.png", data)
            photos[f"{cls}/p{i}.png"] = (array, data)
    manifest = convert(tmp_path / "images", tmp_path / "out")
    assert manifest.splits["train"].band_stats is None  # photos, not rasters
    out = str(tmp_path / "out")

    def read(**kwargs):
        ds = readers.image_dataset_from_tfrecords(
            out, "train", batch_size=None, image_size=None, shuffle=False,
            extra_features=(schemas.FILENAME.key,), color_mode="rgb", **kwargs)
        return {e[schemas.FILENAME.key].numpy().decode(): image.numpy() for image, _, e in ds}

    as_float, as_uint16 = read(dtype="float32"), read(dtype="uint16")
    assert sorted(as_float) == sorted(photos)
    for rel, (array, data) in photos.items():
        # The documented Keras-like scale: the 8-bit decode, 0-255, as floats.
        np.testing.assert_array_equal(
            as_float[rel], tf.io.decode_png(data, dtype=tf.uint8).numpy().astype(np.float32))
        assert as_float[rel].max() <= 255
        np.testing.assert_array_equal(as_uint16[rel], array)
    with pytest.raises(ValueError, match="normalize='dataset' applies the band statistics"):
        read(dtype="float32", normalize="dataset")


def test_png_stored_rasters_of_8_and_16_bits_in_one_split_need_uint16(tmp_path):
    for cls, dtype in (("forest", np.uint8), ("water", np.uint16)):
        for i in range(2):
            array = _RNG.integers(0, np.iinfo(dtype).max, (8, 6, 4), dtype=dtype)
            write(tmp_path / "images" / cls / f"p{i}.tif", _tiff(array, **_CONTIG))
    manifest = convert(tmp_path / "images", tmp_path / "out")
    assert manifest.splits["train"].band_stats is not None and _png_stored(manifest)
    # One decoding depth would multiply the 8-bit values by 257 (or cut the 16-bit ones).
    out = str(tmp_path / "out")
    with pytest.raises(ValueError, match=r"several depths \(.*uint8.*Received: dtype='float32'"):
        readers.image_dataset_from_tfrecords(out, "train", batch_size=None, image_size=None,
                                             color_mode="rgba", dtype="float32")
    # dtype='uint16' reads them as 16-bit photos are read (what `shardsmith preview` does).
    ds = readers.image_dataset_from_tfrecords(out, "train", batch_size=None, image_size=None,
                                              color_mode="rgba", dtype="uint16")
    assert sorted(int(label) for _, label in ds) == [0, 0, 1, 1]
