"""Mutation run of every decoder path (issue 39): damaged files from real ones, through the validator.

    .venv/bin/python -m bench.mutations --cases 2000 --seed 0

Seed files are written by independent writers (Pillow: JPEG baseline and
progressive, PNG 8/16-bit; tifffile: TIFF striped and tiled, uncompressed,
deflate, LZW, PackBits, zstd, JPEG, with predictors, multi-page, BigTIFF,
big-endian; GDAL: GeoTIFFs tiled and striped; pydicom's bundled files and
slices encoded by imagecodecs (`bench.mutation_seeds`): every transfer syntax
the converter reads), damaged by `bench.mutate`, and each run through
`imaging.ImageValidator`, the converter's whole decoding of one file. Prints
per format: cases, written, rejected per reason, crashes (an exception other
than a rejection: a bug), hangs (past --case_timeout), and the peak memory of
the process. Exits 1 on a crash or hang.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import io
import logging
import pathlib
import resource
import sys
import threading
import time

import numpy as np

from bench import mutate

__all__ = ["seed_files", "run_cases", "Outcome"]

# pydicom's bundled files, one per transfer syntax the converter decodes that a bundled file has:
# explicit and implicit VR little endian, explicit big endian, deflate, RLE, JPEG baseline (RGB),
# extended (12-bit) and lossless SV1 (RGB), JPEG-LS lossless and near-lossless, JPEG 2000 lossy
# and lossless.
_DICOM_SEEDS = ("CT_small.dcm", "MR_small_RLE.dcm", "SC_rgb_jpeg_gdcm.dcm", "JPEG2000.dcm",
                "MR_small_jpeg_ls_lossless.dcm", "SC_rgb_rle.dcm", "MR_small_bigendian.dcm", "MR_small_implicit.dcm",
                "image_dfl.dcm", "JPGExtended.dcm", "JPEGLSNearLossless_08.dcm", "MR_small_jp2klossless.dcm",
                "SC_rgb_jpeg_dcmtk.dcm")
# Encoded here (`bench.mutation_seeds`): grey JPEG baseline, 16-bit JPEG lossless with selection
# value 1 and with another predictor (Process 14, which no bundled file has), and HTJ2K (nor this).
_ENCODED_DICOM_SEEDS = ("jpeg_baseline", "jpeg_lossless_sv1", "jpeg_lossless", "htj2k")


@functools.cache
def seed_files() -> tuple[tuple[str, str, bytes], ...]:
    """(name, format, bytes) of the real files the mutations start from (made once a process)."""
    from PIL import Image
    import tifffile

    rng = np.random.default_rng(0)
    photo = (rng.integers(0, 255, (48, 64, 3)) // 16 * 16).astype(np.uint8)
    out = []

    def pil(name, fmt, image, **kw):
        buf = io.BytesIO()
        image.save(buf, fmt, **kw)
        out.append((name, fmt.lower(), buf.getvalue()))

    pil("baseline.jpg", "JPEG", Image.fromarray(photo), quality=90)
    pil("progressive.jpg", "JPEG", Image.fromarray(photo), quality=90, progressive=True)
    pil("grey.jpg", "JPEG", Image.fromarray(photo[..., 0]))
    pil("rgb.png", "PNG", Image.fromarray(photo))
    pil("grey16.png", "PNG", Image.fromarray((photo[..., 0].astype(np.uint16) * 257)))
    pil("palette.png", "PNG", Image.fromarray(photo).convert("P"))
    out[-3:] = [(n, "png", d) for n, _, d in out[-3:]]
    out[:3] = [(n, "jpeg", d) for n, _, d in out[:3]]
    bands = rng.integers(0, 4000, (32, 40, 4)).astype(np.uint16)
    for name, kw in [("striped.tif", dict(rowsperstrip=8)), ("tiled.tif", dict(tile=(16, 16))),
                     ("deflate.tif", dict(compression="zlib", rowsperstrip=8)),
                     ("lzw.tif", dict(compression="lzw", tile=(16, 16))),
                     ("planar.tif", dict(planarconfig="separate", rowsperstrip=8))]:
        buf = io.BytesIO()
        tifffile.imwrite(buf, bands, photometric="minisblack", **kw)
        out.append((name, "tiff", buf.getvalue()))
    buf = io.BytesIO()
    with tifffile.TiffWriter(buf) as writer:
        for i in range(3):
            writer.write(bands[..., i], photometric="minisblack")
    out.append(("pages.tif", "tiff", buf.getvalue()))
    buf = io.BytesIO()
    tifffile.imwrite(buf, photo, photometric="rgb", rowsperstrip=16)
    out.append(("rgb.tif", "tiff", buf.getvalue()))
    buf = io.BytesIO()
    tifffile.imwrite(buf, photo, photometric="rgb", compression="jpeg", rowsperstrip=16)
    out.append(("jpeg.tif", "tiff", buf.getvalue()))
    for name, image, kw in [
            ("zstd.tif", bands, dict(compression="zstd", tile=(16, 16))),
            ("packbits.tif", photo, dict(compression="packbits", rowsperstrip=16, photometric="rgb")),
            ("predictor.tif", bands, dict(compression="lzw", predictor=True, rowsperstrip=8)),
            ("jpeg_tiled.tif", photo, dict(compression="jpeg", tile=(16, 16), photometric="rgb")),
            ("float_predictor.tif", bands.astype(np.float32) / 7,
             dict(compression="zlib", predictor=True, rowsperstrip=8, byteorder=">")),
            ("bigtiff.tif", bands, dict(bigtiff=True, compression="zlib", tile=(16, 16)))]:
        buf = io.BytesIO()
        tifffile.imwrite(buf, image, **{"photometric": "minisblack", **kw})
        out.append((name, "tiff", buf.getvalue()))
    out.append(("geo.tif", "tiff", _geotiff(bands[..., :3])))
    out.append(("geo_striped.tif", "tiff", _geotiff(bands[..., :2].astype(np.int16), tiled=False, compress="lzw")))
    import pydicom

    from bench import mutation_seeds

    files = pathlib.Path(pydicom.__file__).parent / "data" / "test_files"
    for name in _DICOM_SEEDS:
        if (files / name).exists():
            out.append((name, "dicom", (files / name).read_bytes()))
    template = pydicom.dcmread(files / "CT_small.dcm")
    slice_ = rng.integers(-1000, 3000, (24, 20)).astype(np.int16)
    for syntax in _ENCODED_DICOM_SEEDS:
        pixels = (slice_ // 16 + 64).astype(np.uint8) if syntax == "jpeg_baseline" else slice_
        out.append((f"{syntax}.dcm", "dicom", mutation_seeds.encoded_slice(template, pixels, syntax)))
    return tuple(out)


def _geotiff(bands: np.ndarray, tiled: bool = True, compress: str = "deflate") -> bytes:
    """A GeoTIFF written by GDAL (rasterio), with nodata: tiled 16x16, or in strips."""
    from rasterio.io import MemoryFile
    from rasterio.transform import Affine

    with MemoryFile() as memfile:
        with memfile.open(driver="GTiff", width=bands.shape[1], height=bands.shape[0], count=bands.shape[2],
                          dtype=bands.dtype, crs="EPSG:32633", transform=Affine(10, 0, 500000, 0, -10, 4600000),
                          nodata=0, compress=compress,
                          **(dict(tiled=True, blockxsize=16, blockysize=16) if tiled else {})) as dst:
            dst.write(np.moveaxis(bands, -1, 0))
        return memfile.read()


@dataclasses.dataclass
class Outcome:
    cases: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    written: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    rejected: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
    crashes: list = dataclasses.field(default_factory=list)
    hangs: list = dataclasses.field(default_factory=list)
    slowest: float = 0.0


def run_cases(cases_per_file: int, seed: int, case_timeout: float = 30.0) -> Outcome:
    """Mutates every seed file `cases_per_file` times and validates each damaged file."""
    from imaging import ImageRejected, ImageValidator

    validator = ImageValidator()
    outcome = Outcome()
    for name, fmt, data in seed_files():
        for k, case in enumerate(mutate.mutations(data, fmt, count=cases_per_file, seed=seed)):
            label = f"{name} #{k} ({case.how})"
            result: dict = {}

            def work(payload=case.data):
                try:
                    result["images"] = list(validator.validate_all(payload, name))
                except ImageRejected as e:
                    result["reason"] = e.reason
                except Exception as e:  # noqa: BLE001 - what the run counts as a crash.
                    result["crash"] = f"{type(e).__name__}: {e}"

            start = time.perf_counter()
            thread = threading.Thread(target=work, daemon=True)
            thread.start()
            thread.join(case_timeout)
            outcome.slowest = max(outcome.slowest, time.perf_counter() - start)
            outcome.cases[fmt] += 1
            if thread.is_alive():
                outcome.hangs.append(label)
            elif "crash" in result:
                outcome.crashes.append(f"{label}: {result['crash']}")
            elif "reason" in result:
                outcome.rejected[fmt][result["reason"]] += 1
            else:
                outcome.written[fmt] += 1
    return outcome


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000, help="cases in all (spread over the seed files)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case_timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    per_file = max(1, args.cases // len(seed_files()))
    start = time.perf_counter()
    outcome = run_cases(per_file, args.seed, args.case_timeout)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"mutations: {sum(outcome.cases.values())} cases, seed {args.seed}, "
          f"{time.perf_counter() - start:.0f} s, slowest case {outcome.slowest:.2f} s, peak RSS {peak:.0f} MiB")
    for fmt in mutate.FORMATS:
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(outcome.rejected[fmt].items()))
        print(f"  {fmt:6s} cases {outcome.cases[fmt]:5d}  written {outcome.written[fmt]:5d}  rejected: {reasons}")
    print(f"  crashes {len(outcome.crashes)}, hangs {len(outcome.hangs)}")
    for line in outcome.crashes + [f"HANG {h}" for h in outcome.hangs]:
        print("   ", line[:300])
    return 1 if outcome.crashes or outcome.hangs else 0


if __name__ == "__main__":
    sys.exit(main())
