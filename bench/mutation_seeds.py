"""DICOM slices in every compressed transfer syntax the converter reads, for the mutation runs (issue 39).

    from bench import mutation_seeds
    data = mutation_seeds.encoded_slice(ds, pixels, "jpeg_ls")   # a DICOM file's bytes

pydicom encodes only RLE Lossless (and deflate) itself, so the other
compressed syntaxes are encoded here with imagecodecs (libjpeg-turbo,
CharLS, OpenJPEG, liblj92: other libraries than the pylibjpeg decoders the
converter reads them with) and stored encapsulated with pydicom, under the
transfer syntax UID the codestream obeys. `tests/test_bench_mutation_seeds.py`
checks that each decodes to the array it was encoded from.
"""

from __future__ import annotations

import copy
import io

import numpy as np

__all__ = ["SERIES_SYNTAXES", "encoded_slice"]

# name -> (pydicom.uid name, lossless). The series of `bench.mutations_convert` cycle
# through them. JPEG baseline and extended hold 8 and 12 bits, so those slices are 8-bit.
SERIES_SYNTAXES = {
    "explicit": ("ExplicitVRLittleEndian", True),
    "rle": ("RLELossless", True),
    "jpeg_ls": ("JPEGLSLossless", True),
    "jpeg_ls_near": ("JPEGLSNearLossless", False),
    "j2k": ("JPEG2000Lossless", True),
    "j2k_lossy": ("JPEG2000", False),
    "jpeg_lossless_sv1": ("JPEGLosslessSV1", True),
    "jpeg_lossless": ("JPEGLossless", True),
    "jpeg_baseline": ("JPEGBaseline8Bit", False),
    "htj2k": ("HTJ2KLossless", True),
}


def _codestream(pixels: np.ndarray, syntax: str) -> bytes:
    """One frame's codestream in `syntax` (a `SERIES_SYNTAXES` name), by imagecodecs."""
    import imagecodecs

    if syntax in ("jpeg_ls", "jpeg_ls_near"):
        # JPEG-LS holds unsigned samples: the DICOM decoder restores the sign from PixelRepresentation.
        return imagecodecs.jpegls_encode(pixels.view(pixels.dtype.str.replace("i", "u")),
                                         level=0 if syntax == "jpeg_ls" else 2)
    if syntax in ("j2k", "j2k_lossy"):
        lossless = syntax == "j2k"
        return imagecodecs.jpeg2k_encode(pixels, level=None if lossless else 40, codecformat="J2K",
                                         reversible=lossless)
    if syntax == "htj2k":
        return imagecodecs.htj2k_encode(pixels)
    if syntax == "jpeg_lossless_sv1":  # libjpeg-turbo's lossless mode, predictor 1 (Selection Value 1).
        return imagecodecs.jpeg8_encode(pixels.view(pixels.dtype.str.replace("i", "u")), lossless=True,
                                        predictor=1, bitspersample=8 * pixels.itemsize)
    if syntax == "jpeg_lossless":  # liblj92: predictor 6, which only Process 14's UID allows.
        return imagecodecs.ljpeg_encode(pixels.view(pixels.dtype.str.replace("i", "u")),
                                        bitspersample=8 * pixels.itemsize)
    if syntax == "jpeg_baseline":
        return imagecodecs.jpeg8_encode(pixels, level=90)
    raise ValueError(f"syntax: one of {sorted(SERIES_SYNTAXES)} with a codestream, got {syntax!r}")


def encoded_slice(template, pixels: np.ndarray, syntax: str) -> bytes:
    """A DICOM file's bytes: `template` (a pydicom Dataset, not changed) holding `pixels` in `syntax`.

    Args:
      template: A single-frame, single-sample dataset whose other elements are kept.
      pixels: (rows, columns) int16/uint16, or uint8 for JPEG baseline.
      syntax: A `SERIES_SYNTAXES` name.
    """
    import pydicom.uid
    from pydicom.encaps import encapsulate

    if syntax not in SERIES_SYNTAXES:
        raise ValueError(f"syntax: one of {sorted(SERIES_SYNTAXES)}, got {syntax!r}")
    ds = copy.deepcopy(template)  # Its file meta too: the transfer syntax changes.
    ds.Rows, ds.Columns = pixels.shape
    bits = 8 * pixels.itemsize
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = bits, bits, bits - 1
    ds.PixelRepresentation = int(pixels.dtype.kind == "i")
    uid = getattr(pydicom.uid, SERIES_SYNTAXES[syntax][0])
    if syntax in ("explicit", "rle"):
        ds.PixelData = np.ascontiguousarray(pixels).tobytes()
        ds["PixelData"].VR = "OB" if bits == 8 else "OW"
        ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
        if syntax == "rle":  # pydicom's own encoder.
            ds.compress(uid)
    else:
        ds.PixelData = encapsulate([_codestream(pixels, syntax)])
        ds["PixelData"].VR = "OB"
        ds["PixelData"].is_undefined_length = True
        ds.file_meta.TransferSyntaxUID = uid
        if not SERIES_SYNTAXES[syntax][1]:
            ds.LossyImageCompression = "01"
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()
