"""Golden bytes: a fixed corpus converts to exactly the recorded shards, indexes and metadata.

Refactors must not move a single output byte. The corpus covers every input kind the converter
handles (JPEG, PNG, grey, 16-bit, CMYK, EXIF-rotated, transparent, animated GIF, BMP, TIFF, WebP,
DICOM single- and multi-frame, rejects and skips), converted twice with different options; a
second corpus of satellite passes written by GDAL (`build_time_series_corpus`: dates in ISO,
Sentinel-2 and Landsat names and in the TIFF tag, band files, a misaligned, a duplicate and an
undated pass, two dtypes) is converted twice with --time_series, whole stacks and patches.

The recorded hashes hold for the library versions recorded beside them (Pillow's and zlib's
encoders write the re-encoded PNGs; pydicom renders DICOM; GDAL writes the passes). The test checks those versions first,
and the inputs' own hashes, so a failure says whether the inputs, the libraries or shardsmith
changed. Re-record (only when an output change is intended, and say so in the commit):

    .venv/bin/python tests/test_golden.py --record
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import sys
import zlib

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from helpers import convert, encode, make_dicom, pixels, write  # noqa: E402

GOLDEN = pathlib.Path(__file__).parent / "golden_hashes.json"

# Each conversion: (name, extra flags).
RUNS = (
    ("default", ("--split", "train=0.7,validation=0.3", "--min_shards", "2",
                 "--max_reject_fraction", "0.5")),
    ("options", ("--split", "train=0.5,test=0.5", "--num_shards", "3", "--seed", "11",
                 "--dedup", "--dicom_frames", "all", "--dicom_bit_depth", "16",
                 "--dicom_tags", "Modality", "--background", "0,128,255",
                 "--max_reject_fraction", "0.5")),
)
# The conversions of the time-series corpus (issue 37): (name, flags).
TIME_SERIES_RUNS = (
    ("time_series", ("--time_series", "--split", "train=0.5,validation=0.5", "--seed", "5",
                     "--max_reject_fraction", "0.9")),
    ("time_series_patches", ("--time_series", "--split", "train=1.0", "--num_shards", "2",
                             "--raster_patch", "6,4", "--raster_edge", "pad",
                             "--max_reject_fraction", "0.9")),
)


def _versions() -> dict[str, str]:
    import PIL
    import pydicom

    return {"numpy": np.__version__, "pillow": PIL.__version__, "pydicom": pydicom.__version__,
            "zlib": zlib.ZLIB_RUNTIME_VERSION}


def _time_series_versions() -> dict[str, str]:
    import rasterio

    return {"numpy": np.__version__, "gdal": rasterio.__gdal_version__, "rasterio": rasterio.__version__}


def _exif_rotated() -> bytes:
    upright = np.zeros((40, 20, 3), np.uint8)
    upright[:10] = (240, 20, 20)
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90).save(buf, "JPEG", exif=exif,
                                                                        quality=95)
    return buf.getvalue()


def _animated_gif() -> bytes:
    frames = [Image.fromarray(pixels(i)).convert("P") for i in (5, 6, 7)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100)
    return buf.getvalue()


def build_corpus(root: pathlib.Path) -> None:
    """Writes the fixed corpus under ROOT/<class>/..."""
    for c, name in enumerate(("alpha", "beta", "gamma")):
        for i in range(7):
            s = 500 + c * 50 + i
            if i % 3 == 0:
                write(root / name / f"p{i}.png", encode(pixels(s, size=(20, 28)), "PNG"))
            elif i % 3 == 1:
                write(root / name / f"j{i}.jpg", encode(pixels(s, size=(30, 22)), "JPEG", quality=85))
            else:
                write(root / name / "deep" / f"g{i}.jpg",
                      encode(pixels(s, mode="L"), "JPEG", quality=80))
    m = root / "alpha"
    write(m / "copy_of_p0.png", (m / "p0.png").read_bytes())  # a duplicate, for --dedup
    write(m / "sixteen.png", encode((np.arange(16 * 24, dtype=np.uint16).reshape(16, 24) * 90), "PNG"))
    cmyk = io.BytesIO()
    Image.fromarray(pixels(31)).convert("CMYK").save(cmyk, "JPEG")
    write(m / "cmyk.jpg", cmyk.getvalue())
    write(m / "rotated.jpg", _exif_rotated())
    transparent = np.dstack([pixels(32), np.tile(np.arange(0, 256, 8, dtype=np.uint8), (24, 1))])
    write(m / "transparent.png", encode(transparent, "PNG"))
    b = root / "beta"
    write(b / "anim.gif", _animated_gif())
    write(b / "odd.bmp", encode(pixels(33), "BMP"))
    write(b / "scan.tif", encode(pixels(34), "TIFF"))
    write(b / "web.webp", encode(pixels(35), "WEBP", lossless=True))
    g = root / "gamma"
    ramp = (np.arange(12 * 10).reshape(12, 10) * 7 - 300).astype(np.int16)
    write(g / "ct.dcm", make_dicom(ramp, Modality="CT", WindowCenter=40, WindowWidth=400))
    write(g / "frames.dcm", make_dicom(np.stack([ramp, ramp[::-1], ramp * 2]), signed=True))
    write(g / "bare_dicom", make_dicom(ramp + 5, file_format=False))
    jpeg = encode(pixels(36), "JPEG")
    write(g / "truncated.jpg", jpeg[: len(jpeg) // 2])
    write(g / "notes.jpg", b"Just some notes, not a photo.\n")
    write(g / "empty.png", b"")
    write(g / ".DS_Store", b"\0\0\0\1Bud1")


def _passes(seed: int, bands: int = 3, height: int = 12, width: int = 8, dtype: str = "uint16") -> np.ndarray:
    values = np.arange(bands * height * width, dtype=np.int64).reshape(bands, height, width)
    return ((values * (seed + 7) * 37) % 30011 + 1).astype(dtype)


def build_time_series_corpus(root: pathlib.Path) -> None:
    """Writes the fixed corpus of passes under ROOT/<class>/<location>/..., every file by GDAL."""
    import rasterio
    from helpers import write_geotiff
    from rasterio.transform import from_origin

    loc = root / "wheat" / "iso"  # One multi-band file per date, ISO dates, written out of order.
    for i, date in enumerate(("2020-06-04", "2020-05-14", "2020-07-01")):
        write_geotiff(loc / f"{date}.tif", _passes(i))
    write_geotiff(loc / "2020-08-02.tif", _passes(3, height=10))  # Misaligned: left out, noted.
    loc = root / "wheat" / "sentinel"  # Sentinel-2 product names: the sensing date is the first.
    for i, (sensed, made) in enumerate((("20200714", "20200714"), ("20200514", "20200901"))):
        write_geotiff(loc / f"S2B_MSIL2A_{sensed}T103629_N0214_R008_T31TFJ_{made}T124004.tif",
                      _passes(10 + i, bands=4, dtype="float32"), crs="EPSG:32631")
    loc = root / "corn" / "landsat"  # One file per band and date.
    for d, date in enumerate(("20200601", "20200517")):
        for b, band in enumerate(("SR_B5", "SR_B4")):
            write_geotiff(loc / f"LC08_L2SP_198030_{date}_20200820_02_T1_{band}.TIF",
                          _passes(20 + 2 * d + b, bands=1))
    loc = root / "corn" / "tagged"  # Dates in the TIFF tag alone; a duplicate date; an undated pass.
    for name, stamp, seed in (("pass_a.tif", "2021:03:09 10:00:00", 30), ("pass_b.tif", "2021:01:30 10:00:00", 31)):
        write_geotiff(loc / name, _passes(seed))
        with rasterio.open(loc / name, "r+") as dst:
            dst.update_tags(TIFFTAG_DATETIME=stamp)
    write_geotiff(loc / "2021-04-01.tif", _passes(32), transform=from_origin(300000.0, 5000000.0, 10.0, 10.0))
    write_geotiff(loc / "2021-04-01_copy.tif", _passes(33))
    write_geotiff(root / "corn" / "undated" / "orbit_12.tif", _passes(34))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _output_hashes(out: pathlib.Path) -> dict[str, str]:
    """sha256 of every output file; the tool's version is blanked where it is recorded."""
    hashes = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".json":
            doc = json.loads(data)
            _blank_versions(doc)
            data = json.dumps(doc, sort_keys=True).encode()
        hashes[path.relative_to(out).as_posix()] = _sha(data)
    return hashes


def _blank_versions(doc) -> None:
    import schemas

    if isinstance(doc, dict):
        for key, value in doc.items():
            if value == schemas.__version__ and "version" in key:
                doc[key] = "<tool version>"
            else:
                _blank_versions(value)
    elif isinstance(doc, list):
        for value in doc:
            _blank_versions(value)


def _input_hashes(root: pathlib.Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): _sha(p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


def measure(tmp: pathlib.Path) -> dict:
    root = tmp / "images"
    build_corpus(root)
    doc = {"versions": _versions(), "inputs": _input_hashes(root), "outputs": {}}
    for name, flags in RUNS:
        out = tmp / f"out_{name}"
        convert(root, out, *flags)
        doc["outputs"][name] = _output_hashes(out)
    passes = tmp / "passes"
    build_time_series_corpus(passes)
    doc["time_series"] = {"versions": _time_series_versions(), "inputs": _input_hashes(passes)}
    for name, flags in TIME_SERIES_RUNS:
        out = tmp / f"out_{name}"
        convert(passes, out, *flags)
        doc["outputs"][name] = _output_hashes(out)
    return doc


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return measure(tmp_path_factory.mktemp("golden"))


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text())


def test_the_libraries_are_those_the_hashes_were_recorded_with(golden):
    assert _versions() == golden["versions"], (
        "The encoders changed version since the golden hashes were recorded; outputs may then "
        "differ legitimately: check, then re-record (see the module docstring).")


def test_the_corpus_is_the_recorded_one(measured, golden):
    assert measured["inputs"] == golden["inputs"]


def test_the_passes_are_the_recorded_ones_written_by_the_recorded_gdal(measured, golden):
    assert measured["time_series"]["versions"] == golden["time_series"]["versions"], (
        "GDAL or rasterio changed version since the golden hashes were recorded: the passes' "
        "bytes may differ legitimately: check, then re-record (see the module docstring).")
    assert measured["time_series"]["inputs"] == golden["time_series"]["inputs"]


@pytest.mark.parametrize("run", [name for name, _ in RUNS + TIME_SERIES_RUNS])
def test_every_output_byte_is_as_recorded(measured, golden, run):
    got, want = measured["outputs"][run], golden["outputs"][run]
    assert sorted(got) == sorted(want), "different output files"
    changed = sorted(name for name in want if got[name] != want[name])
    assert not changed, f"output bytes changed in {run}: {changed}"


def test_worker_processes_write_the_recorded_bytes(tmp_path, golden):
    # The same conversion with its shards written by 2 worker processes
    # (the default for large folders) instead of the runner's threads.
    root = tmp_path / "images"
    build_corpus(root)
    name, flags = RUNS[1]
    out = tmp_path / "out"
    convert(root, out, *flags, "--worker_processes", "2")
    got, want = _output_hashes(out), golden["outputs"][name]
    assert sorted(got) == sorted(want)
    assert sorted(n for n in want if got[n] != want[n]) == []


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--record"]:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        GOLDEN.write_text(json.dumps(measure(pathlib.Path(tmp)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
