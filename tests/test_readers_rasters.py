"""Raw-stored rasters (issue 16) read back: every band, every bit, as stored.

The datasets are written record by record with the schema's encoder
(`_reader_data.write_raster_dataset`), as the converter stores rasters.
"""

from __future__ import annotations

import dataclasses
import io
import re

import numpy as np
import pytest
import tensorflow as tf
import tifffile
from helpers import convert, encode, pixels, write

import readers
import schemas
from _reader_data import write_raster_dataset
from readers import stored
from readers.dataset import ReaderConfig, build_dataset
from readers.metadata import load_manifest, load_split
from schemas import FILENAME

_RNG = np.random.default_rng(16)


def _arrays(dtype, bands, n=5, sizes=((8, 6), (5, 9), (7, 7))):
    out = []
    for i in range(n):
        shape = (*sizes[i % len(sizes)], bands)
        if np.dtype(dtype).kind == "f":
            a = _RNG.uniform(-125.0, 295.0, shape).astype(dtype)
            a.flat[0] = np.finfo(dtype).max  # Out of any integer range.
            a.flat[-1] = -0.0 if i else np.finfo(dtype).tiny
        else:
            info = np.iinfo(dtype)
            a = _RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
            a.flat[0], a.flat[-1] = info.min, info.max
        out.append(a)
    return out


def _as_stored(data_dir, color_mode=None, dtype=None):
    """Every (image, label) of the train split, unbatched at its stored size, by file name."""
    ds = readers.image_dataset_from_tfrecords(
        data_dir, "train", batch_size=None, image_size=None, color_mode=color_mode, dtype=dtype,
        shuffle=False, extra_features=(FILENAME.key,))
    return {extras[FILENAME.key].numpy().decode(): (image, int(label))
            for image, label, extras in ds}


@pytest.mark.parametrize("dtype,bands", [
    ("uint16", 13), ("float32", 1), ("int16", 4), ("float64", 3), ("uint16", 2),
    ("uint32", 5), ("int32", 1), ("uint8", 6),
])
def test_values_exactly_as_stored(tmp_path, dtype, bands):
    items = write_raster_dataset(tmp_path / "ds", _arrays(dtype, bands))
    got = _as_stored(tmp_path / "ds")
    assert sorted(got) == sorted(i.filename for i in items)
    for item in items:
        image, label = got[item.filename]
        assert image.dtype.name == dtype
        assert image.shape == item.pixels.shape
        assert label == item.label
        # Byte for byte: -0.0, extremes and every band.
        assert image.numpy().tobytes() == item.pixels.tobytes()


@pytest.mark.parametrize("band_stats", [True, False])  # One decode per batch, or per image.
@pytest.mark.parametrize("dtype,bands", [("uint16", 13), ("float32", 2)])
def test_one_size_split_batched_at_the_stored_size_is_exact(tmp_path, dtype, bands, band_stats):
    items = write_raster_dataset(tmp_path / "ds", _arrays(dtype, bands, n=7, sizes=((6, 5),)),
                                 band_stats=band_stats)
    ds = readers.image_dataset_from_tfrecords(
        tmp_path / "ds", "train", batch_size=3, image_size=None, color_mode=None, dtype=None,
        shuffle=False, extra_features=(FILENAME.key,))
    assert ds.element_spec[0].shape.as_list() == [None, 6, 5, bands]
    by_name = {i.filename: i for i in items}
    seen = []
    for images, labels, extras in ds:
        assert images.dtype.name == dtype
        for image, label, name in zip(images.numpy(), labels.numpy(), extras[FILENAME.key].numpy()):
            item = by_name[name.decode()]
            # Byte for byte: -0.0, extremes and every band.
            assert image.tobytes() == item.pixels.tobytes() and label == item.label
            seen.append(item.filename)
    assert sorted(seen) == sorted(by_name)


def test_split_of_several_sizes_batched_at_the_stored_size_is_refused(tmp_path):
    write_raster_dataset(tmp_path / "ds", _arrays("uint16", 4), band_stats=True)
    with pytest.raises(ValueError, match=r"split 'train' of .* holds images of several sizes, "
                                         r"from 5x6 to 8x9 \(height x width\): pass image_size="):
        readers.image_dataset_from_tfrecords(
            tmp_path / "ds", "train", batch_size=3, image_size=None, color_mode=None, dtype=None)


def test_float32_negatives_cast_to_float32_output(tmp_path):
    arrays = _arrays("float32", 1)
    write_raster_dataset(tmp_path / "ds", arrays)
    ds = readers.image_dataset_from_tfrecords(
        tmp_path / "ds", "train", batch_size=None, image_size=None, color_mode=None,
        dtype="float32", shuffle=False, label_mode=None)
    values = sorted(float(x.numpy().min()) for x in ds)
    assert values[0] < 0
    assert values == sorted(float(a.min()) for a in arrays)


@pytest.mark.parametrize("dtype", ["uint16", "float64"])
def test_batched_float_pipeline_with_standard_augment(tmp_path, dtype):
    # Within float32's range: float64's extremes would be infinite.
    arrays = [np.clip(a, -1e5, 1e5) for a in _arrays(dtype, 13, n=7)]
    write_raster_dataset(tmp_path / "ds", arrays)
    kwargs = dict(batch_size=3, image_size=(16, 12), color_mode=None, dtype="float32",
                  augment="standard", seed=3)
    first = [x.numpy() for x, _ in readers.image_dataset_from_tfrecords(
        tmp_path / "ds", "train", **kwargs)]
    again = [x.numpy() for x, _ in readers.image_dataset_from_tfrecords(
        tmp_path / "ds", "train", **kwargs)]
    assert [x.shape for x in first] == [(3, 16, 12, 13), (3, 16, 12, 13), (1, 16, 12, 13)]
    assert all(x.dtype == np.float32 for x in first)
    for a, b in zip(first, again):  # Seeded: the same crops and flips.
        np.testing.assert_array_equal(a, b)
    low = min(float(a.min()) for a in arrays)
    high = max(float(a.max()) for a in arrays)
    for x in first:  # A bilinear resize stays within the input's range.
        assert low - 1e-3 <= x.min() and x.max() <= high + 1e-3


def test_stretch_resize_matches_tf_image_resize(tmp_path):
    arrays = _arrays("int16", 4, n=3, sizes=((6, 6),))
    items = write_raster_dataset(tmp_path / "ds", arrays, num_shards=1)
    ds = readers.image_dataset_from_tfrecords(
        tmp_path / "ds", "train", batch_size=3, image_size=(9, 4), color_mode=None,
        shuffle=False, deterministic=True)
    (images, _), = list(ds)
    want = tf.image.resize(np.stack([i.pixels for i in items]).astype(np.float32), (9, 4))
    np.testing.assert_allclose(images.numpy(), want.numpy(), rtol=1e-6)


def test_color_mode_must_match_the_bands(tmp_path):
    write_raster_dataset(tmp_path / "ds", _arrays("uint16", 13))
    with pytest.raises(ValueError, match=r"gives 3 channels, but the rasters .* have 13 bands: "
                                         r"pass color_mode=None"):
        readers.image_dataset_from_tfrecords(tmp_path / "ds", "train", image_size=(8, 8))


def test_mixed_photos_and_rasters(tmp_path):
    rasters = _arrays("float32", 3, n=3)
    photos = [_RNG.integers(0, 256, (6, 5, 3), dtype=np.uint8) for _ in range(2)]
    items = write_raster_dataset(tmp_path / "ds", rasters, photos=photos)
    for kwargs in (dict(color_mode=None), dict(dtype=None)):
        with pytest.raises(ValueError, match=r"holds photos and rasters \(png, raw-float32\), "
                                             r"which share one output only"):
            readers.image_dataset_from_tfrecords(
                tmp_path / "ds", "train", batch_size=None, image_size=None, **kwargs)
    # Given both, they share one: float32 with 3 channels.
    got = {e[FILENAME.key].numpy().decode(): x.numpy()
           for x, _, e in readers.image_dataset_from_tfrecords(
               tmp_path / "ds", "train", batch_size=None, image_size=None, color_mode="rgb",
               dtype="float32", shuffle=False, extra_features=(FILENAME.key,))}
    for item in items:
        np.testing.assert_array_equal(got[item.filename], item.pixels.astype(np.float32))
    ds = readers.image_dataset_from_tfrecords(tmp_path / "ds", "train", batch_size=5,
                                              image_size=(4, 4), color_mode="rgb")
    (images, _), = list(ds)
    assert images.shape == (5, 4, 4, 3)


def test_rasters_of_several_dtypes_need_a_dtype(tmp_path):
    write_raster_dataset(tmp_path / "ds", _arrays("uint16", 2, n=2) + _arrays("int16", 2, n=2))
    with pytest.raises(ValueError, match=r"several dtypes \(raw-int16, raw-uint16\).*"
                                         r"Received: dtype=None"):
        _as_stored(tmp_path / "ds")
    ds = readers.image_dataset_from_tfrecords(
        tmp_path / "ds", "train", batch_size=None, image_size=None, color_mode=None,
        dtype="float32", shuffle=False, label_mode=None)
    assert sorted(float(x.numpy().min()) for x in ds)[0] == -32768.0


def test_photo_splits_of_older_manifests_refuse_as_stored_options(tmp_path):
    # Written without layouts (`ImageStats.of` of (format, height, width)), as older converters did.
    write_raster_dataset(tmp_path / "ds", [], photos=[np.zeros((4, 4, 3), np.uint8)] * 2)
    with pytest.raises(ValueError, match=r"`dtype=None` keeps what the images store.*"
                                         r"holds png images"):
        readers.image_dataset_from_tfrecords(tmp_path / "ds", "train", dtype=None)
    with pytest.raises(ValueError, match=r"`color_mode=None`"):
        readers.image_dataset_from_tfrecords(tmp_path / "ds", "train", color_mode=None)


def test_normalize_dataset_uses_the_train_split_stats(tmp_path):
    arrays = _arrays("uint16", 3, n=4)
    write_raster_dataset(tmp_path / "ds", arrays, num_shards=1)
    split_files = load_split(tmp_path / "ds", "train")
    with pytest.raises(Exception, match=r"normalize='dataset' needs the per-band statistics of "
                                        r"the 'train' split"):
        readers.image_dataset_from_tfrecords(
            tmp_path / "ds", "train", batch_size=None, image_size=None, color_mode=None,
            normalize="dataset")
    mean, std = (10.0, 20.0, 30.0), (2.0, 4.0, 8.0)
    # Statistics of another split must not be used: those of train are.
    band_stats = {"train": stored.BandStats(mean, std),
                  "validation": stored.BandStats((0.0,) * 3, (1.0,) * 3)}
    # Compared in order: without a seed the reader may reorder, unless told not to.
    config = ReaderConfig(batch_size=None, image_size=None, color_mode=None, shuffle=False,
                          deterministic=True, label_mode=None, normalize="dataset")
    for split in ("train", "validation"):
        files = dataclasses.replace(split_files, split=split, band_stats=band_stats)
        got = [x.numpy() for x in build_dataset(files, config, batch_size=None)]
        for x, a in zip(got, arrays):
            np.testing.assert_allclose(x, (a.astype(np.float32) - mean) / std, rtol=1e-6)


def test_split_band_stats_reads_the_split_field(tmp_path):
    write_raster_dataset(tmp_path / "ds", _arrays("uint16", 2, n=2))
    manifest = load_manifest(tmp_path / "ds")
    assert stored.split_band_stats(manifest, "train") is None
    split = manifest.splits["train"]
    # Two shards' statistics, as the converter writes them: the split's are their exact merge.
    a = np.array([[0.0, 1.0], [4.0, 5.0]])  # band 0 values, band 1 values (2 samples each shard)
    b = np.array([[2.0, 9.0], [6.0, 3.0]])
    shards = []
    for shard, values in zip(split.shards, (a, b)):
        stats = schemas.BandStats(
            records=shard.num_records, count=(2, 2), min=tuple(values.min(1)), max=tuple(values.max(1)),
            mean=tuple(values.mean(1)), m2=tuple(((values - values.mean(1, keepdims=True)) ** 2).sum(1)),
            nodata=(0, 0))
        shards.append(dataclasses.replace(shard, band_stats=stats))
    manifest = dataclasses.replace(manifest, splits={"train": dataclasses.replace(split, shards=tuple(shards))})
    got = stored.split_band_stats(manifest, "train")
    both = np.concatenate([a, b], axis=1)
    np.testing.assert_allclose(got.mean, both.mean(1))
    np.testing.assert_allclose(got.std, both.std(1))


def test_preview_of_a_13_band_dataset(tmp_path):
    from shardsmith import preview

    arrays = _arrays("uint16", 13, n=8, sizes=((16, 16),))
    items = write_raster_dataset(tmp_path / "ds", arrays)
    sheet = preview._build_sheet(tmp_path / "ds", "train", per_class=2, image_size=16, seed=0,
                                 max_classes=20, max_records=100, resize="stretch",
                                 rgb_bands="4,3,2")
    assert "13-band rasters: bands 4,3,2 as R,G,B (--rgb_bands), each stretched to its 2-98 % " \
           "percentiles per image." in sheet.header
    font = preview._font(12)
    width = sheet.image.size[0] - 2 * preview._MARGIN
    assert all(font.getlength(line) <= width for line in sheet.header)  # Not cut short.
    by_name = {i.filename: i for i in items}
    filename = sheet.rows[0][1][0]
    tile = np.asarray(sheet.image)[slice(*(lambda o: (o[1], o[1] + 16))(
        sheet.layout.tile_origin(0, 0)))][:, slice(*(lambda o: (o[0], o[0] + 16))(
            sheet.layout.tile_origin(0, 0)))]
    # The stored size is the tile size: the tile is bands 4, 3, 2 of the stored array, stretched.
    want = preview._stretch_to_rgb(by_name[filename].pixels.astype(np.float32), (4, 3, 2))
    np.testing.assert_array_equal(tile, want)
    assert tile.std() > 0
    for bad in ("0,1,2", "4,3", "14,1,1"):
        with pytest.raises(ValueError, match=r"`rgb_bands` must be 1 or 3 band numbers in 1..13"):
            preview._build_sheet(tmp_path / "ds", "train", per_class=1, image_size=16, seed=0,
                                 max_classes=1, max_records=10, resize="stretch", rgb_bands=bad)
    out = tmp_path / "sheet.png"
    assert preview.main([str(tmp_path / "ds"), "--output", str(out), "--rgb_bands", "4,3,2",
                         "--image_size", "16", "--per_class", "2"]) == 0
    assert out.stat().st_size > 0 and (tmp_path / "sheet_counts.png").stat().st_size > 0


def test_stretch_maps_the_2_and_98_percentiles():
    from shardsmith import preview

    band = np.arange(100, dtype=np.float32).reshape(10, 10, 1)
    rgb = preview._stretch_to_rgb(band, (1,))
    low, high = np.percentile(band, (2, 98))
    assert rgb.shape == (10, 10, 3) and (rgb[..., 0] == rgb[..., 2]).all()
    assert rgb[0, 0, 0] == 0 and rgb[-1, -1, 0] == 255
    assert rgb[5, 0, 0] == round((50 - low) / (high - low) * 255)


def test_inspect_lists_formats_and_dtypes(tmp_path):
    from shardsmith import inspection

    write_raster_dataset(tmp_path / "ds", _arrays("uint16", 13, n=3) + _arrays("float32", 1, n=2),
                         photos=[np.zeros((4, 4, 3), np.uint8)])
    facts = inspection.inspect_dataset(str(tmp_path / "ds"))
    text = inspection.format_inspection(str(tmp_path / "ds"), facts)
    row = next(line for line in text.splitlines() if line.startswith("train") and "raw-" in line)
    assert row.split("  ")[0] == "train"
    assert "png 1, raw-float32 2, raw-uint16 3" in row
    assert "float32, uint16, uint8/uint16" in row
    assert "stored as" in text and "dtypes" in text


def test_inspect_of_photos_unchanged(tmp_path):
    from shardsmith import inspection

    write_raster_dataset(tmp_path / "ds", [], photos=[np.zeros((4, 4, 3), np.uint8)] * 2)
    text = inspection.format_inspection(str(tmp_path / "ds"),
                                        inspection.inspect_dataset(str(tmp_path / "ds")))
    assert "stored as" not in text


def _convert_pngs(tmp_path, arrays):
    root = tmp_path / "images"
    for i, array in enumerate(arrays):
        write(root / "a" / f"img_{i}.png", encode(array, "PNG"))
    return convert(root, tmp_path / "out")


def test_photo_splits_read_as_stored_from_the_recorded_layouts(tmp_path):
    rgb16 = [_RNG.integers(0, 65536, (6 + i, 5, 3), dtype=np.uint16) for i in range(3)]
    root = tmp_path / "images"
    for i, array in enumerate(rgb16):
        buf = io.BytesIO()
        tifffile.imwrite(buf, array, photometric="rgb")  # Stored as 16-bit RGB PNG.
        write(root / "a" / f"img_{i}.tif", buf.getvalue())
    manifest = convert(root, tmp_path / "out")
    assert manifest.splits["train"].images.layouts == (("png", 3, "uint16", 3),)
    got = {name: image for name, (image, _) in _as_stored(tmp_path / "out").items()}
    for i, array in enumerate(rgb16):
        image = got[f"a/img_{i}.tif"]
        assert image.dtype == tf.uint16 and image.shape == array.shape
        np.testing.assert_array_equal(image.numpy(), array)


def test_photo_splits_of_several_channels_or_dtypes_are_refused_saying_what_to_pass(tmp_path):
    grey8 = _RNG.integers(0, 256, (5, 4), dtype=np.uint8)
    rgb8 = _RNG.integers(0, 256, (5, 4, 3), dtype=np.uint8)
    grey16 = _RNG.integers(0, 65536, (5, 4), dtype=np.uint16)
    _convert_pngs(tmp_path, [grey8, rgb8, grey16])
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=re.escape(
            "`color_mode=None` keeps the stored channels, but split 'train' of "
            f"{str(out)!r} holds 1 png of 1 channel uint16, 1 png of 1 channel uint8, "
            "1 png of 3 channels uint8: no one color mode keeps them. Pass color_mode= one of "
            "('grayscale', 'rgb', 'rgba') to decode every image to that many channels. "
            "Received: color_mode=None")):
        readers.image_dataset_from_tfrecords(out, "train", color_mode=None)
    with pytest.raises(ValueError, match=r"`dtype=None` keeps the stored dtype, .* no one dtype "
                                         r"keeps them\. Pass dtype='uint16' .*Received: dtype=None"):
        readers.image_dataset_from_tfrecords(out, "train", color_mode="grayscale", dtype=None)
    # What the message says to pass works: every image at 16 bits, 8-bit ones times 257.
    got = {name: image for name, (image, _) in
           _as_stored(out, color_mode="grayscale", dtype="uint16").items()}
    np.testing.assert_array_equal(got["a/img_0.png"][:, :, 0], grey8.astype(np.uint16) * 257)
    np.testing.assert_array_equal(got["a/img_2.png"][:, :, 0], grey16)


def test_jpeg_splits_keep_their_defaults_and_read_as_stored_as_uint8(tmp_path):
    root = tmp_path / "images"
    photos = [encode(pixels(i, size=(20 + i, 16)), "JPEG") for i in range(3)]
    for i, data in enumerate(photos):
        write(root / "a" / f"p_{i}.jpg", data)
    manifest = convert(root, tmp_path / "out")
    assert manifest.splits["train"].images.layouts == (("jpeg", 3, "uint8", 3),)
    # The defaults are unchanged: rgb, float32, 224x224.
    images, _ = next(iter(readers.image_dataset_from_tfrecords(tmp_path / "out", "train")))
    assert images.dtype == tf.float32 and images.shape == (3, 224, 224, 3)
    got = {name: image for name, (image, _) in _as_stored(tmp_path / "out").items()}
    for i, data in enumerate(photos):
        image = got[f"a/p_{i}.jpg"]
        assert image.dtype == tf.uint8
        np.testing.assert_array_equal(image.numpy(), tf.io.decode_jpeg(data).numpy())


# --- Rasters of one shape: a batch decodes in one op (`RasterPlan.decode_batch`) ---------


def _one_shape_arrays(dtype, bands, n=11, size=(6, 5)):
    return _arrays(dtype, bands, n=n, sizes=(size,))


def _by_name(data_dir, **options):
    """{filename: image} over every batch, and the batch sizes in order."""
    ds = readers.image_dataset_from_tfrecords(
        data_dir, "train", batch_size=4, color_mode=None, shuffle=False,
        extra_features=(FILENAME.key,), **options)
    images, sizes = {}, []
    for batch, _, extras in ds:
        sizes.append(int(batch.shape[0]))
        for name, image in zip(extras[FILENAME.key].numpy(), batch.numpy()):
            images[name.decode()] = image
    return images, sizes


def _plan(data_dir, **options):
    config = ReaderConfig(batch_size=4, color_mode=None, shuffle=False, **options)
    return stored.plan(load_split(data_dir, "train"), config.image)


@pytest.mark.parametrize("dtype,bands", [
    ("uint16", 13), ("uint16", 1), ("int16", 13), ("float32", 1), ("uint32", 13), ("uint8", 1),
])
@pytest.mark.parametrize("options", [
    dict(image_size=(6, 5), dtype=None),
    dict(image_size=(6, 5), dtype="float32"),
    dict(image_size=(4, 7), dtype="float32", interpolation="bicubic"),
    dict(image_size=(3, 3), dtype=None, resize="crop", crop_fraction=0.8),
    dict(image_size=(6, 5), dtype="float32", scale=0.5),
], ids=["stored-size", "float32", "resized", "crop", "scaled"])
def test_one_shape_batches_equal_the_per_image_path(tmp_path, dtype, bands, options):
    arrays = _one_shape_arrays(dtype, bands)
    if dtype == "uint32" and options["dtype"] is None:
        options = dict(options, dtype="float32")  # uint32 is no reader output dtype.
    batched, general = tmp_path / "batched", tmp_path / "general"
    write_raster_dataset(batched, arrays, band_stats=True)
    write_raster_dataset(general, arrays)  # No band stats: one band count unknown.
    assert _plan(batched, **options).one_shape == (6, 5, bands)
    assert _plan(batched, **options).decodes_by_batch(ReaderConfig(
        batch_size=4, color_mode=None, **options).image)
    assert _plan(general, **options).one_shape is None
    got, sizes = _by_name(batched, **options)
    want, want_sizes = _by_name(general, **options)
    # One partial batch (without a seed, batches may come in any order).
    assert sorted(sizes) == sorted(want_sizes) == [3, 4, 4]
    assert sorted(got) == sorted(want) and len(got) == len(arrays)
    for name, image in want.items():
        assert got[name].dtype == image.dtype
        np.testing.assert_array_equal(got[name], image, err_msg=name)


@pytest.mark.parametrize("dtype,bands", [("uint16", 13), ("int16", 1), ("float32", 13),
                                         ("uint32", 1)])
def test_one_shape_batches_at_the_stored_size_are_the_stored_values(tmp_path, dtype, bands):
    arrays = _one_shape_arrays(dtype, bands, n=7)
    items = write_raster_dataset(tmp_path / "ds", arrays, band_stats=True)
    got, sizes = _by_name(tmp_path / "ds", image_size=(6, 5), dtype="float32")
    assert sorted(sizes) == [3, 4]
    for item in items:
        np.testing.assert_array_equal(got[item.filename], item.pixels.astype(np.float32))
    if dtype in ("uint16", "int16"):
        stored_dtype, _ = _by_name(tmp_path / "ds", image_size=(6, 5), dtype=None)
        for item in items:
            assert stored_dtype[item.filename].dtype == np.dtype(dtype)
            np.testing.assert_array_equal(stored_dtype[item.filename], item.pixels)


def test_standard_augment_and_mixed_sizes_keep_the_per_image_path(tmp_path):
    write_raster_dataset(tmp_path / "one", _one_shape_arrays("uint16", 3), band_stats=True)
    write_raster_dataset(tmp_path / "mixed", _arrays("uint16", 3), band_stats=True)
    augmented = dict(image_size=(4, 4), dtype="float32", augment="standard", seed=1)
    assert not _plan(tmp_path / "one", **augmented).decodes_by_batch(
        ReaderConfig(batch_size=4, color_mode=None, **augmented).image)
    assert _plan(tmp_path / "mixed", image_size=(4, 4), dtype="float32").one_shape is None
    images, sizes = _by_name(tmp_path / "one", **augmented)
    assert sorted(sizes) == [3, 4, 4] and all(i.shape == (4, 4, 3) for i in images.values())
