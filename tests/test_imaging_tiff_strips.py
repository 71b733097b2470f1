"""The plain-TIFF reader (imaging/_tiff_strips.py) gives what tifffile's path gives, or declines."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import tifffile

from imaging import ImageRejected, _tiff_strips, raster

_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float16", "float32", "float64")


def _tiff(array, **kwargs) -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, array, **kwargs)
    return buf.getvalue()


def _array(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        a = rng.normal(0, 1000, shape).astype(dtype)
        a.flat[::7] = np.nan
        return a
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def _outcome(data: bytes, options: raster.RasterOptions):
    try:
        rasters = raster.read_tiff(data, "x.tif", options)
    except ImageRejected as e:
        return ("rejected", e.reason, e.message)
    if rasters is None:
        return None
    # repr: NaN nodata values are equal as text, never as floats.
    return [(r.array.dtype.str, r.array.shape, r.array.tobytes(), r.page, repr(r.nodata), r.actions,
             repr(r.details))
            for r in rasters]


def _both(data: bytes, options: raster.RasterOptions, monkeypatch):
    fast = _outcome(data, options)
    taken = _tiff_strips.read_plain(data, options.max_pixels) is not None
    with monkeypatch.context() as m:
        m.setattr(_tiff_strips, "read_plain", lambda *_: None)
        slow = _outcome(data, options)
    return fast, slow, taken


def _cases():
    rng = np.random.default_rng(7)
    for dtype, bands, order, compression, rows in itertools.product(
            _DTYPES, (1, 3, 4, 13), ("<", ">"), (None, "zlib", "adobe_deflate", "lzw"), (None, 5)):
        shape = (11, 9) if bands == 1 else (11, 9, bands)
        kwargs = dict(byteorder=order, compression=compression, rowsperstrip=rows,
                      photometric="rgb" if bands == 3 else "minisblack")
        if bands > 1:
            kwargs["planarconfig"] = "contig"  # The last axis holds the bands, not pages.
        if bands == 4:
            kwargs["extrasamples"] = ["unassalpha"]
            kwargs["photometric"] = "rgb"
        yield f"{dtype}-{bands}-{order}-{compression}-{rows}", _array(rng, dtype, shape), kwargs
    a = _array(rng, "uint16", (10, 12, 5))
    yield "planar", np.moveaxis(a, 2, 0), dict(planarconfig="separate", photometric="minisblack")
    yield "tiled", _array(rng, "uint16", (32, 32, 2)), dict(tile=(16, 16), photometric="minisblack",
                                                            planarconfig="contig")
    yield "predictor", a, dict(planarconfig="contig", compression="zlib", predictor=True, photometric="minisblack")
    yield "zstd", a, dict(planarconfig="contig", compression="zstd", photometric="minisblack")
    yield "bigtiff", a, dict(planarconfig="contig", bigtiff=True, photometric="minisblack")
    yield "pages", np.stack([a, a]), dict(photometric="minisblack", planarconfig="contig")
    yield "described", a, dict(planarconfig="contig", description="a Sentinel-2 patch", resolution=(10, 10),
                               software="test", photometric="minisblack")
    for text in ("0", "-9999", "65535", "70000", "nan", "3,5", "12\0", "garbage", "1\0 2"):
        for dtype in ("uint16", "int16", "float32"):
            yield (f"nodata-{text!r}-{dtype}", _array(rng, dtype, (6, 7, 2)),
                   dict(photometric="minisblack", planarconfig="contig",
                        extratags=[(42113, "s", 0, text, True)]))
    yield "geotiff", a, dict(planarconfig="contig", photometric="minisblack", extratags=[
        (33550, "d", 3, (10.0, 10.0, 0.0), True), (33922, "d", 6, (0, 0, 0, 500000.0, 4e6, 0), True),
        (34735, "H", 8, (1, 1, 0, 1, 3072, 0, 1, 32633), True)])
    yield "unknown-tag", a, dict(planarconfig="contig", photometric="minisblack", extratags=[(65000, "H", 1, 3, True)])


@pytest.mark.parametrize("options", [raster.RasterOptions(), raster.RasterOptions(pages="all"),
                                     raster.RasterOptions(bands=(2, 1)),
                                     raster.RasterOptions(max_pixels=400)], ids=str)
def test_every_generated_tiff_reads_as_tifffiles_path_reads_it(options, monkeypatch):
    taken = set()
    for case, array, kwargs in _cases():
        fast, slow, took = _both(_tiff(array, **kwargs), options, monkeypatch)
        assert fast == slow, case
        if took:
            taken.add(case)
    if options.max_pixels == 400:
        # 13 bands of 11x9 are too many samples: tifffile's path rejects them, as before.
        assert "uint16-13-<-None-None" not in taken and "uint16-1-<-None-None" in taken
        return
    # The plain reader did read the plain files, and none of the others.
    assert {"uint16-13-<-None-None", "float32-1->-zlib-5", "int16-3-<-adobe_deflate-None",
            "uint32-4->-None-5", "float16-13->-zlib-None", "int8-1-<-None-5", "described",
            "geotiff", "nodata-'-9999'-int16", "nodata-'3,5'-float32",
            "nodata-'12\\x00'-uint16"} <= taken
    assert not {"planar", "tiled", "predictor", "zstd", "bigtiff", "pages", "unknown-tag",
                "uint8-3-<-None-None", "uint16-3-<-lzw-None", "nodata-'70000'-uint16",
                "nodata-'garbage'-uint16", "nodata-'1\\x00 2'-uint16"} & taken


def test_too_many_samples_are_left_to_tifffiles_path_which_rejects_them():
    data = _tiff(np.zeros((20, 20, 13), np.uint16), photometric="minisblack", planarconfig="contig")
    assert _tiff_strips.read_plain(data, 20 * 20 * 13) is not None
    assert _tiff_strips.read_plain(data, 20 * 20 * 13 - 1) is None
    with pytest.raises(ImageRejected) as info:
        raster.read_tiff(data, "big.tif", raster.RasterOptions(max_pixels=100))
    assert info.value.reason == "too_large"


def test_damaged_plain_files_are_declined_and_rejected_as_before(monkeypatch):
    rng = np.random.default_rng(1)
    data = _tiff(_array(rng, "uint16", (16, 16, 13)), photometric="minisblack", planarconfig="contig",
                 rowsperstrip=4)
    damaged = {
        "truncated": data[: len(data) // 2],
        "no-ifd": data[:8],
        "bad-magic": data[:2] + b"\x00\x00" + data[4:],
        "ifd-past-end": data[:4] + (len(data) + 10).to_bytes(4, "little") + data[8:],
    }
    for what, bad in damaged.items():
        assert _tiff_strips.read_plain(bad, 10**9) is None, what
        for options in (raster.RasterOptions(), raster.RasterOptions(bands=(1,))):
            fast, slow, _ = _both(bad, options, monkeypatch)
            assert fast == slow, what
    # Every byte flipped in turn (header and IFD): the same outcome either way, never a crash.
    for i in range(0, 400):
        bad = bytearray(data)
        bad[i] ^= 0xFF
        fast, slow, _ = _both(bytes(bad), raster.RasterOptions(), monkeypatch)
        assert fast == slow, i
