"""The seed files of the mutation runs (issue 39): every transfer syntax and layout, each one readable.

`bench.mutation_seeds` encodes DICOM slices with imagecodecs; the converter
reads them with pylibjpeg's decoders, and SimpleITK (GDCM) is the
independent reader both are compared with. `bench.mutate` damages NIfTI-2
headers and the codestreams inside encapsulated pixel data, not only
NIfTI-1 headers and DICOM elements.
"""

from __future__ import annotations

import io

import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from pydicom.data import get_testdata_file

from bench import mutate, mutation_seeds, mutations
from imaging import volumes


def _sitk_series(folder) -> np.ndarray:
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(folder)))
    return sitk.GetArrayFromImage(reader.Execute())


@pytest.mark.parametrize("syntax", sorted(mutation_seeds.SERIES_SYNTAXES))
def test_a_seed_series_reads_as_gdcm_reads_it_and_as_encoded_when_lossless(tmp_path, syntax):
    uid_name, lossless = mutation_seeds.SERIES_SYNTAXES[syntax]
    template = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    template.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    base = np.random.default_rng(3).integers(0, 2000, (16, 16), dtype=np.int16)
    if syntax == "jpeg_baseline":  # 8 bits a sample.
        base = (base // 8).astype(np.uint8)
    slices = []
    for k in range(4):
        template.ImagePositionPatient = [-100, -100, 1.25 * k]
        template.SOPInstanceUID = f"1.2.826.0.1.3680043.8.498.{k + 1}"
        slices.append(mutation_seeds.encoded_slice(template, base + k, syntax))
    for k, data in enumerate(slices):
        assert pydicom.dcmread(io.BytesIO(data)).file_meta.TransferSyntaxUID == getattr(pydicom.uid, uid_name)
        (tmp_path / f"i{k}.dcm").write_bytes(data)
    slices_read = [s for k in range(len(slices)) for s in volumes.read_slices(slices[k], f"i{k}.dcm")]
    plan = volumes.plan_stacks(slices_read)
    [volume] = [volumes.read_stack(stack, lambda name: (tmp_path / name).read_bytes()) for stack in plan.stacks]
    gdcm = _sitk_series(tmp_path)  # Rescaled (CT_small's intercept -1024), (depth, rows, columns).
    # Baseline JPEG's inverse DCT differs by 1 between libjpeg-turbo (pylibjpeg) and GDCM's IJG.
    np.testing.assert_allclose(volume.voxels, gdcm, atol=1 if syntax == "jpeg_baseline" else 0)
    if lossless:
        expected = np.stack([base + k for k in range(len(slices))]) - 1024
        np.testing.assert_array_equal(volume.voxels, expected)


def test_the_image_seeds_cover_every_transfer_syntax_and_tiff_layout():
    seeds = mutations.seed_files()
    syntaxes = {pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True).file_meta.TransferSyntaxUID.name
                for _, fmt, data in seeds if fmt == "dicom"}
    for uid in ("ExplicitVRLittleEndian", "ImplicitVRLittleEndian", "ExplicitVRBigEndian",
                "DeflatedExplicitVRLittleEndian", "RLELossless", "JPEGBaseline8Bit", "JPEGExtended12Bit",
                "JPEGLossless", "JPEGLosslessSV1", "JPEGLSLossless", "JPEGLSNearLossless", "JPEG2000Lossless",
                "JPEG2000", "HTJ2KLossless"):
        assert getattr(pydicom.uid, uid).name in syntaxes, uid
    import tifffile

    layouts = set()
    for name, fmt, data in seeds:
        if fmt == "tiff":
            with tifffile.TiffFile(io.BytesIO(data)) as tif:
                page = tif.pages.first
                layouts.add(page.compression.name)
                layouts.add("tiled" if page.is_tiled else "striped")
                layouts.add("bigtiff" if tif.is_bigtiff else tif.byteorder)
                layouts.add("geotiff" if page.is_geotiff else "plain")
    assert {"NONE", "LZW", "ADOBE_DEFLATE", "JPEG", "PACKBITS", "ZSTD", "tiled", "striped", "bigtiff", ">", "<",
            "geotiff", "plain"} <= layouts, layouts


def test_the_mutator_damages_nifti2_headers_and_dicom_codestreams():
    import nibabel

    nifti2 = nibabel.Nifti2Image(np.zeros((2, 3, 4), np.int16), np.eye(4)).to_bytes()
    hows = " ".join(m.how for m in mutate.mutations(nifti2, "nifti", count=300, seed=0))
    for field in ("dim[1]", "vox_offset", "datatype", "bitpix", "scl_slope", "srow_x[0]", "sizeof_hdr"):
        assert f"header.{field}=" in hows, field
    # NIfTI-2's vox_offset is 64-bit at byte 168: 'large' there is a positive offset past the file.
    cases = [m for m in mutate.mutations(nifti2, "nifti", count=300, seed=0) if m.how == "field header.vox_offset=large"]
    assert cases and all(0 < int.from_bytes(m.data[168:176], "little", signed=True) for m in cases)
    template = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    pixels = np.arange(64, dtype=np.int16).reshape(8, 8)
    for syntax, markers in [("jpeg_ls", ("FFF7.height", "FFDA.length")), ("j2k", ("FF51.Xsiz", "FF90.Psot")),
                            ("rle", ("RLE.segments",)), ("jpeg_lossless", ("FFC3.bits",))]:
        data = mutation_seeds.encoded_slice(template, pixels, syntax)
        hows = " ".join(m.how for m in mutate.mutations(data, "dicom", count=400, seed=1))
        assert "pixel item 1.length" in hows, syntax
        for marker in markers:
            assert marker in hows, (syntax, marker)
