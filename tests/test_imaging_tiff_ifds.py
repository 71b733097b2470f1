"""Damaged TIFF structure found by mutating real files (issue 39): each case the smallest file that showed it.

Files are written by tifffile and then damaged byte by byte; tifffile reads
the undamaged file as the independent reference.
"""

from __future__ import annotations

import io
import struct
import threading

import numpy as np
import pytest
import tifffile

from imaging import ImageRejected, ImageValidator, RasterOptions, raster


def _outcome(data: bytes, options: RasterOptions | None = None, timeout: float = 60.0):
    """The validator's images, or its ImageRejected; fails (instead of hanging the suite) past `timeout`."""
    result = {}

    def work():
        validator = ImageValidator(raster=options or RasterOptions())
        try:
            result["images"] = list(validator.validate_all(data, "m.tif"))
        except ImageRejected as e:
            result["rejected"] = e

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the file held the reader past the timeout"
    return result


def _pages(n: int, bigtiff: bool = False) -> bytes:
    out = io.BytesIO()
    with tifffile.TiffWriter(out, bigtiff=bigtiff) as writer:
        for i in range(n):
            writer.write(np.full((8, 8), 1000 * (i + 1), np.uint16))
    return out.getvalue()


def _set_next_ifd(data: bytes, page: int, target: int, bigtiff: bool = False) -> bytes:
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        offsets = [p.offset for p in tif.pages]
    damaged = bytearray(data)
    count_fmt, entry, next_fmt = ("<Q", 20, "<Q") if bigtiff else ("<H", 12, "<I")
    count = struct.unpack_from(count_fmt, damaged, offsets[page])[0]
    struct.pack_into(next_fmt, damaged, offsets[page] + struct.calcsize(count_fmt) + count * entry, offsets[target])
    return bytes(damaged)


@pytest.mark.parametrize("bigtiff", [False, True])
@pytest.mark.parametrize("pages", ["first", "all"])
def test_a_next_ifd_pointing_back_to_an_earlier_ifd_is_rejected_not_followed(bigtiff, pages):
    # Was: tifffile's page loop went round for ever, growing ~30 MB/s, until --file_timeout.
    data = _set_next_ifd(_pages(3, bigtiff), page=2, target=0, bigtiff=bigtiff)
    result = _outcome(data, RasterOptions(pages=pages))
    assert result["rejected"].reason == "corrupt"
    assert "loop" in str(result["rejected"]) and "IFD 2" in str(result["rejected"])


@pytest.mark.parametrize("where", ["first IFD", "next IFD"])
def test_a_bigtiff_offset_past_what_a_file_can_seek_to_is_corrupt_not_an_internal_error(where):
    """Found by bench.mutations_convert's BigTIFF seed (issue 39): an 8-byte IFD offset above
    2**63 raised OverflowError in the IFD walk (internal_error)."""
    data = bytearray(_pages(2, bigtiff=True))
    if where == "first IFD":
        struct.pack_into("<Q", data, 8, 0xFFFF_FFFF_FFFF_FF00)
    else:
        with tifffile.TiffFile(io.BytesIO(bytes(data))) as tif:
            first = tif.pages.first.offset
        count = struct.unpack_from("<Q", data, first)[0]
        struct.pack_into("<Q", data, first + 8 + count * 20, 0x9000_0000_0000_0000)
    result = _outcome(bytes(data))
    assert "images" in result or result["rejected"].reason == "corrupt", result


def test_an_ifd_pointing_to_itself_is_rejected():
    result = _outcome(_set_next_ifd(_pages(2), page=0, target=0))
    assert result["rejected"].reason == "corrupt"
    assert "IFD 0" in str(result["rejected"])


def test_a_long_chain_without_a_loop_still_reads_every_page():
    data = _pages(40)
    result = _outcome(data, RasterOptions(pages="all"))
    assert len(result["images"]) == 40


def _with_tag(data: bytes, code: int, value: int) -> bytes:
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        tag = tif.pages.first.tags[code]
        fmt, at = ("<H" if tag.dtype == 3 else "<I"), tag.valueoffset
    damaged = bytearray(data)
    struct.pack_into(fmt, damaged, at, value)
    return bytes(damaged)


@pytest.mark.parametrize("shape, photometric", [((8, 8), "minisblack"), ((8, 8, 3), "rgb")])
def test_rows_per_strip_zero_is_read_or_rejected_not_a_crash(shape, photometric):
    # Was: ZeroDivisionError in imaging/_tiff_strips.py (an internal_error, a bug).
    array = np.arange(np.prod(shape), dtype=np.uint16).reshape(shape)
    out = io.BytesIO()
    tifffile.imwrite(out, array, photometric=photometric, rowsperstrip=4)
    data = _with_tag(out.getvalue(), 278, 0)
    [page] = raster.read_tiff(data, "m.tif", RasterOptions()) or [None]
    # tifffile (the independent reader) reads RowsPerStrip 0 as one strip.
    expected = tifffile.imread(io.BytesIO(data))
    np.testing.assert_array_equal(page.array.reshape(expected.shape), expected)


def test_a_sparse_strip_reads_as_zeros_as_gdal_and_tifffile_read_it():
    # GDAL's SPARSE_OK files leave a strip unwritten: offset 0, byte count 0.
    # Was: rejected as 'corrupt' ("ends past the file").
    array = np.arange(1, 129, dtype=np.int8).reshape(2, 8, 8)
    out = io.BytesIO()
    tifffile.imwrite(out, array, planarconfig="separate", rowsperstrip=4, photometric="minisblack")
    data = bytearray(out.getvalue())
    with tifffile.TiffFile(io.BytesIO(bytes(data))) as tif:
        offsets, counts = tif.pages.first.tags[273], tif.pages.first.tags[279]
        count_fmt = "<H" if counts.dtype == 3 else "<I"
        struct.pack_into("<I", data, offsets.valueoffset + 4, 0)  # The second strip of band 1.
        struct.pack_into(count_fmt, data, counts.valueoffset + struct.calcsize(count_fmt), 0)
    expected = tifffile.imread(io.BytesIO(bytes(data)))  # (2, 8, 8), rows 4-7 of band 1 zeros.
    assert (expected[0, 4:] == 0).all() and (expected[0, :4] != 0).all()
    [page] = raster.read_tiff(bytes(data), "m.tif", RasterOptions())
    np.testing.assert_array_equal(page.array.astype(np.int16), np.moveaxis(expected, 0, -1).astype(np.int16))


def test_a_header_claiming_60000_by_60000_is_refused_before_allocating():
    out = io.BytesIO()
    tifffile.imwrite(out, np.ones((8, 8), np.uint16))
    data = _with_tag(_with_tag(out.getvalue(), 256, 60000), 257, 60000)
    result = _outcome(data)
    assert result["rejected"].reason == "too_large"
    assert "60000x60000" in str(result["rejected"])


def test_the_scene_reader_of_patches_rejects_a_loop_too(tmp_path):
    from imaging.patches import SceneReader

    data = _set_next_ifd(_pages(3), page=2, target=1)
    path = tmp_path / "scene.tif"
    path.write_bytes(data)
    for source in (data, path):
        with pytest.raises(ImageRejected) as e:
            SceneReader(source, "scene.tif")
        assert e.value.reason == "corrupt" and "loop" in str(e.value)


def test_reading_the_georeferencing_rejects_a_loop_too():
    from imaging.georef import read_georef

    with pytest.raises(ImageRejected) as e:
        read_georef(_set_next_ifd(_pages(3), page=1, target=0), "g.tif")
    assert e.value.reason == "corrupt" and "IFD 1" in str(e.value)
