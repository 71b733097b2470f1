"""DICOM through the whole pipeline: mixed folders, frames, tags, and patients kept in one split."""

from __future__ import annotations

import json
import shutil

import numpy as np
import tensorflow as tf
from helpers import convert, encode, make_dicom, pixels, read_records, write
from pydicom.data import get_testdata_file

import readers
import schemas
from beam_jobs import convert as convert_module
from imaging.dicom import DicomOptions, decode_dicom


def _copy(name, dest):
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(get_testdata_file(name), dest)
    return dest


def test_a_mixed_folder_converts_in_one_run_and_reads_back(tmp_path):
    root = tmp_path / "images"
    _copy("CT_small.dcm", root / "scan" / "ct.dcm")
    _copy("MR_small.dcm", root / "scan" / "mr.dcm")
    _copy("MR_small_RLE.dcm", root / "scan" / "IM0001")  # PACS exports often have no extension
    _copy("rtplan.dcm", root / "scan" / "plan.dcm")  # no pixels
    write(root / "photo" / "a.jpg", encode(pixels(1), "JPEG"))
    write(root / "photo" / "b.png", encode(pixels(2), "PNG"))
    out = tmp_path / "out"
    manifest = convert(root, out, "--dicom_tags", "Modality", "--max_reject_fraction", "0.5")
    rejects = [json.loads(line) for line in (out / schemas.REJECTS_FILENAME).open()]
    assert [(r["path"], r["reason"]) for r in rejects] == [("scan/plan.dcm", "no_pixel_data")]
    assert manifest.counts == {"found": 6, "written": 5, "rejected": 1, "skipped": 0}
    key = schemas.dicom_tag_key("Modality")
    assert key in manifest.features
    by_name = {r[schemas.FILENAME.key].decode(): r for r in read_records(out)}
    assert {n: r[key] for n, r in by_name.items()} == {
        "scan/ct.dcm": b"CT", "scan/mr.dcm": b"MR", "scan/IM0001": b"MR", "photo/a.jpg": b"", "photo/b.png": b""}
    # DICOM records hold exactly the rendering of the DICOM module, as PNG.
    with open(get_testdata_file("CT_small.dcm"), "rb") as f:
        (frame,) = decode_dicom(f.read(), "ct", DicomOptions())
    assert by_name["scan/ct.dcm"][schemas.IMAGE.key] == frame.png
    np.testing.assert_array_equal(  # The RLE twin decodes to the same pixels.
        tf.io.decode_png(by_name["scan/IM0001"][schemas.IMAGE.key]).numpy(),
        tf.io.decode_png(by_name["scan/mr.dcm"][schemas.IMAGE.key]).numpy())
    applied = manifest.extra["dicom"]["applied"]
    assert applied["window_source"] and sum(applied["bit_depth"].values()) == 3
    details = {json.loads(line)["path"]: json.loads(line) for line in (out / schemas.NORMALIZED_FILENAME).open()}
    assert details["scan/ct.dcm"]["details"]["rescale"] is not None
    # And through the reader, as a model sees them.
    ds = readers.image_dataset_from_tfrecords(str(out), batch_size=None, image_size=(32, 32),
                                              dtype="uint8", shuffle=False,
                                              extra_features=(schemas.FILENAME.key,))
    names = sorted(extras[schemas.FILENAME.key].numpy().decode() for _, _, extras in ds)
    assert names == sorted(by_name)


def test_sixteen_bit_and_all_frames(tmp_path):
    root = tmp_path / "images"
    _copy("SC_rgb_rle_2frame.dcm", root / "colour" / "two.dcm")
    write(root / "grey" / "ramp.dcm", make_dicom(np.arange(64).reshape(8, 8) * 10, WindowCenter=300,
                                                 WindowWidth=600))
    out = tmp_path / "out"
    convert(root, out, "--dicom_frames", "all", "--dicom_bit_depth", "16")
    by_name = {r[schemas.FILENAME.key].decode(): r for r in read_records(out)}
    assert sorted(by_name) == ["colour/two.dcm#frame=0", "colour/two.dcm#frame=1", "grey/ramp.dcm"]
    ramp = tf.io.decode_png(by_name["grey/ramp.dcm"][schemas.IMAGE.key], dtype=tf.uint16).numpy()[..., 0]
    assert ramp.dtype == np.uint16 and ramp.max() > 255 and (np.diff(ramp.ravel()) >= 0).all()
    assert by_name["colour/two.dcm#frame=0"][schemas.CHANNELS.key] == 3
    # Two files gave three records: the summary says both, not "2 images ... (train 3)".
    assert convert_module.summarize(str(out)).startswith("Converted 2 images as 3 records into ")


def test_patients_are_kept_in_one_split(tmp_path):
    root = tmp_path / "images"
    rng = np.random.default_rng(0)
    for patient in range(40):
        for study in range(3):
            label = "sick" if patient % 3 == 0 else "well"
            write(root / label / f"p{patient:02d}_s{study}.dcm",
                  make_dicom(rng.integers(0, 1000, (8, 8)), PatientID=f"PAT{patient:03d}",
                             SOPInstanceUID=f"1.2.3.{patient}.{study}"))
    out = tmp_path / "out"
    manifest = convert(root, out, "--split", "train=0.6,validation=0.2,test=0.2",
                       "--group_by", "dicom:PatientID", "--dicom_tags", "PatientID",
                       "--dicom_allow_identifying_tags", "--min_shards", "2")
    patients = {}
    for rec in read_records(out):
        patients.setdefault(rec[schemas.dicom_tag_key("PatientID")], set()).add(rec["split"])
    assert len(patients) == 40 and all(len(splits) == 1 for splits in patients.values())
    per_split = manifest.extra["groups"]["per_split"]
    ids = [set(v["sha256_16"]) for v in per_split.values()]
    assert sum(len(i) for i in ids) == len(set().union(*ids)) == 40  # disjoint, complete
    assert 14 <= per_split["train"]["count"] <= 34  # about 60 % of 40 patients
    assert per_split["validation"]["count"] >= 2 and per_split["test"]["count"] >= 2
    text = (out / schemas.MANIFEST_FILENAME).read_text()
    assert "PAT0" not in text  # group values are stored hashed


def test_identifying_tags_are_refused_unless_asked(tmp_path, capsys):
    root = tmp_path / "images"
    write(root / "a" / "x.dcm", make_dicom(np.zeros((4, 4)), PatientID="P1"))
    argv = ["--input_dir", str(root), "--output_dir", str(tmp_path / "o"), "--dicom_tags", "PatientName"]
    assert convert_module.main(argv) == 2
    err = capsys.readouterr().err
    assert "PatientName" in err and "--dicom_allow_identifying_tags" in err
    assert convert_module.main(["--input_dir", str(root), "--output_dir", str(tmp_path / "o"),
                                "--group_by", "dicom:NotAKeyword", "--split", "train=1"]) == 2
    assert "not a DICOM keyword" in capsys.readouterr().err
