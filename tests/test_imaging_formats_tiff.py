"""The TIFF handler (imaging/formats/tiff.py): rasters by imaging/raster.py, the rest by Pillow."""

from __future__ import annotations

import concurrent.futures
import io
import logging

import numpy as np
import pytest
import tifffile
from helpers import stored_values, tiff_with_bad_tag

from imaging import ImageRejected, RasterOptions, ResizeOptions, ValidationOptions, formats
from imaging.formats import tiff

_RNG = np.random.default_rng(7)


def _tiff(array, **kwargs) -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, array, **kwargs)
    return buf.getvalue()




def _context(**raster):
    return formats.Context(ValidationOptions(raster=RasterOptions(**raster)))


def test_a_multi_band_raster_keeps_every_band_and_value():
    bands = _RNG.integers(0, 65536, (16, 12, 6), dtype=np.uint16)
    [image] = tiff.images(_tiff(bands, planarconfig="contig"), "s2.tif", "tiff", _context())
    assert image.source_format == "tiff" and image.actions == ("store_tiff_as_raw",)
    np.testing.assert_array_equal(stored_values(image), bands)
    np.testing.assert_allclose(image.band_stats.mean, bands.reshape(-1, 6).mean(0))


def test_pillows_tiffs_keep_pillows_png_and_no_band_statistics():
    rgb = _RNG.integers(0, 256, (10, 14, 3), dtype=np.uint8)
    [image] = tiff.images(_tiff(rgb, photometric="rgb"), "rgb.tif", "tiff", _context())
    assert image.actions == ("reencode_tiff_to_png",) and image.band_stats is None
    np.testing.assert_array_equal(stored_values(image), rgb)


def test_every_page_when_asked_each_with_its_index():
    pages = _RNG.integers(0, 65536, (3, 8, 9), dtype=np.uint16)
    buf = io.BytesIO()
    with tifffile.TiffWriter(buf) as writer:
        for page in pages:
            writer.write(page)
    data = buf.getvalue()
    found = tiff.images(data, "stack.tif", "tiff", _context(pages="all"))
    assert [image.page for image in found] == [0, 1, 2]
    for image, page in zip(found, pages):
        np.testing.assert_array_equal(stored_values(image)[..., 0], page)
    assert len(tiff.images(data, "stack.tif", "tiff", _context())) == 1


def test_a_raster_is_resized_within_the_size_cap():
    dem = _RNG.uniform(-10, 10, (40, 20)).astype(np.float32)
    context = formats.Context(ValidationOptions(resize=ResizeOptions(max_side=10)))
    [image] = tiff.images(_tiff(dem), "dem.tif", "tiff", context)
    assert (image.height, image.width) == (10, 5)
    assert image.actions == ("store_tiff_as_raw", "resize_max_side")
    assert image.details["original"] == [40, 20]


def test_a_damaged_header_is_corrupt():
    data = _tiff(np.zeros((4, 4), np.uint8))
    with pytest.raises(ImageRejected) as e:
        tiff.images(data[:8] + b"\xff" * 16, "bad.tif", "tiff", _context())
    assert e.value.reason == "corrupt" and "bad.tif" in e.value.message


def test_what_tifffile_logs_about_a_file_it_reads_goes_into_its_details(caplog):
    bands = _RNG.integers(0, 65536, (8, 6, 3), dtype=np.uint16)
    data = tiff_with_bad_tag(bands)
    with caplog.at_level(logging.WARNING, logger="tifffile"):
        [image] = tiff.images(data, "tagged.tif", "tiff", _context())
    # The fact relied on: tifffile reads the pixels and complains on its logger.
    assert any("invalid value offset" in r.getMessage() for r in caplog.records if r.name == "tifffile")
    np.testing.assert_array_equal(stored_values(image), bands)
    [note] = image.details["warnings"]
    assert note.startswith("tifffile: ") and "invalid value offset" in note
    assert image.details["source_bands"] == 3  # raster.py's details are kept.
    [clean] = tiff.images(_tiff(bands, photometric="minisblack"), "clean.tif", "tiff", _context())
    assert "warnings" not in (clean.details or {})


def test_a_rejected_file_says_what_tifffile_logged():
    data = tiff_with_bad_tag(_RNG.integers(0, 65536, (64, 64, 3), dtype=np.uint16))
    with pytest.raises(ImageRejected) as e:
        tiff.images(data[:-4000], "cut.tif", "tiff", _context())
    assert e.value.reason == "corrupt" and "invalid value offset" in e.value.message


def test_notes_stay_with_their_file_across_threads():
    # Files are validated on several threads: each file's notes are its own.
    bands = _RNG.integers(0, 65536, (8, 6, 3), dtype=np.uint16)
    files = [(tiff_with_bad_tag(bands), True), (_tiff(bands, photometric="minisblack"), False)] * 40
    context = _context()

    def read(item):
        data, tagged = item
        [image] = tiff.images(data, "x.tif", "tiff", context)
        return tagged, "warnings" in (image.details or {})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(read, files))
    assert all(tagged == noted for tagged, noted in results)
    assert logging.getLogger("tifffile").filters == []  # Nothing left behind.
