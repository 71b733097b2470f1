"""End to end: image files on disk -> Beam pipeline -> shards -> records read back."""

from __future__ import annotations

import json
import pathlib
import pickle

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert, encode, make_class_tree, pixels, read_records, write

import schemas
from imaging import ValidationOptions
from beam_jobs import _shards, _write
from beam_jobs import convert as convert_module
from conversion.shard_maker import ShardSpec


def _decode(data: bytes) -> np.ndarray:
    return tf.io.decode_image(data, expand_animations=False).numpy()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """One conversion shared by the tests that only read its output."""
    root = tmp_path_factory.mktemp("conv") / "images"
    files = make_class_tree(root, per_class=10)
    write(root / "dog" / "png_named.jpg", encode(pixels(7), "PNG"))
    files["dog/png_named.jpg"] = "dog"
    write(root / "cat" / "UPPER.JPG", encode(pixels(8), "JPEG"))
    files["cat/UPPER.JPG"] = "cat"
    out = root.parent / "out"
    manifest = convert(root, out, "--split", "train=0.75,validation=0.25", "--min_shards", "3")
    return root, files, out, manifest


def test_round_trip_pixels_labels_filenames(converted):
    root, files, out, manifest = converted
    records = read_records(out)
    assert sorted(r[schemas.FILENAME.key].decode() for r in records) == sorted(files)
    assert manifest.class_names == ("cat", "dog", "fish")
    for rec in records:
        rel = rec[schemas.FILENAME.key].decode()
        source = (root / rel).read_bytes()
        # Valid originals are stored byte for byte ...
        assert rec[schemas.IMAGE.key] == source
        # ... and decode to the same pixels as the source file.
        np.testing.assert_array_equal(_decode(rec[schemas.IMAGE.key]), _decode(source))
        assert manifest.class_names[rec[schemas.LABEL.key]] == files[rel]
        h, w, c = _decode(source).shape
        assert (rec[schemas.HEIGHT.key], rec[schemas.WIDTH.key], rec[schemas.CHANNELS.key]) == (h, w, c)
        expected_format = b"png" if source.startswith(b"\x89PNG") else b"jpeg"
        assert rec[schemas.FORMAT.key] == expected_format


def test_tutorial_reader_reads_shards_unchanged(converted):
    _, files, out, _ = converted
    # What a tutorial does: glob the files, parse three features, decode_image.
    spec = {
        schemas.IMAGE.key: tf.io.FixedLenFeature([], tf.string),
        schemas.LABEL.key: tf.io.FixedLenFeature([], tf.int64),
        schemas.FILENAME.key: tf.io.FixedLenFeature([], tf.string),
    }
    ds = tf.data.TFRecordDataset(sorted(tf.io.gfile.glob(str(out / "*.tfrecord"))))
    ds = ds.map(lambda x: tf.io.parse_single_example(x, spec))
    ds = ds.map(lambda f: (tf.io.decode_image(f[schemas.IMAGE.key], channels=3, expand_animations=False),
                           f[schemas.LABEL.key], f[schemas.FILENAME.key]))
    seen = [(img.shape[-1], name.numpy().decode()) for img, _, name in ds]
    assert sorted(name for _, name in seen) == sorted(files)
    assert {c for c, _ in seen} == {3}


def test_manifest_counts_match_shards(converted):
    _, files, out, manifest = converted
    records = read_records(out)
    assert manifest.counts == {"found": len(files), "written": len(files), "rejected": 0, "skipped": 0}
    for split, info in manifest.splits.items():
        mine = [r for r in records if r["split"] == split]
        assert info.num_records == len(mine)
        for shard in info.shards:
            in_shard = [r for r in mine if r["shard"] == shard.file]
            assert shard.num_records == len(in_shard)
            assert shard.num_bytes == (out / shard.file).stat().st_size
            counts = [sum(r[schemas.LABEL.key] == i for r in in_shard) for i in range(3)]
            assert list(shard.class_counts) == counts
            # What readers specialise on: the formats, sizes, channels and dtypes of its records
            # (the dtype from the bytes: 16 in a PNG's IHDR bit depth is uint16).
            stored = [(r[schemas.FORMAT.key].decode(), r[schemas.HEIGHT.key], r[schemas.WIDTH.key],
                       r[schemas.CHANNELS.key],
                       "uint16" if r[schemas.FORMAT.key] == b"png" and r[schemas.IMAGE.key][24] == 16
                       else "uint8")
                      for r in in_shard]
            assert shard.images == schemas.ImageStats.of(stored)
            assert shard.images is None or sum(n for _, n in shard.images.formats) == len(in_shard)
    text = (out / schemas.MANIFEST_FILENAME).read_text()
    assert str(out) not in text  # No output path, so runs compare equal.


def test_splits_follow_ratios_and_shards_mix_classes(converted):
    _, files, out, manifest = converted
    assert set(manifest.splits) == {"train", "validation"}
    n_train = manifest.splits["train"].num_records
    assert 0.5 < n_train / len(files) < 0.95
    for info in manifest.splits.values():
        assert len(info.shards) == 3
        sizes = [s.num_records for s in info.shards]
        assert max(sizes) - min(sizes) <= 1  # Range partition: balanced shards.
    # A shard of the larger split holds more than one class.
    assert all(sum(1 for c in s.class_counts if c) >= 2 for s in manifest.splits["train"].shards)


def test_records_within_a_shard_are_not_in_listing_order(converted):
    _, _, out, manifest = converted
    records = read_records(out)
    first = manifest.splits["train"].shards[0].file
    names = [r[schemas.FILENAME.key].decode() for r in records if r["shard"] == first]
    assert names != sorted(names)


def test_same_input_and_seed_give_identical_bytes(tmp_path):
    root = tmp_path / "images"
    make_class_tree(root, per_class=5)
    convert(root, tmp_path / "a", "--split", "train=0.8,test=0.2", "--seed", "3")
    convert(root, tmp_path / "b", "--split", "train=0.8,test=0.2", "--seed", "3")
    convert(root, tmp_path / "c", "--split", "train=0.8,test=0.2", "--seed", "4")
    names_a = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names_a == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names_a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    shards = lambda d: b"".join(p.read_bytes() for p in sorted(d.glob("*.tfrecord")))
    assert shards(tmp_path / "a") != shards(tmp_path / "c")


def test_multi_processing_runner_gives_the_same_bytes(tmp_path):
    root = tmp_path / "images"
    make_class_tree(root, per_class=4)
    convert(root, tmp_path / "local", "--min_shards", "4")
    convert(root, tmp_path / "mp", "--min_shards", "4",
            "--direct_num_workers", "2", "--direct_running_mode", "multi_processing")
    for p in sorted((tmp_path / "local").iterdir()):
        assert p.read_bytes() == (tmp_path / "mp" / p.name).read_bytes(), p.name


def test_split_folders_keep_global_class_index(tmp_path):
    root = tmp_path / "images"
    write(root / "train" / "ant" / "a.jpg", encode(pixels(1), "JPEG"))
    write(root / "train" / "bee" / "b.jpg", encode(pixels(2), "JPEG"))
    write(root / "val" / "bee" / "c.png", encode(pixels(3), "PNG"))
    write(root / "test" / "ant" / "d.jpg", encode(pixels(4), "JPEG"))
    manifest = convert(root, tmp_path / "out")
    assert manifest.class_names == ("ant", "bee")
    assert set(manifest.splits) == {"train", "validation", "test"}
    assert manifest.splits["validation"].class_counts == (0, 1)
    by_name = {r[schemas.FILENAME.key].decode(): r for r in read_records(tmp_path / "out")}
    assert by_name["val/bee/c.png"][schemas.LABEL.key] == 1
    assert by_name["val/bee/c.png"]["split"] == "validation"


def test_labels_csv_and_fixed_class_names(tmp_path):
    root = tmp_path / "flat"
    for i in range(4):
        write(root / f"x{i}.jpg", encode(pixels(i), "JPEG"))
    write(root / "unlisted.jpg", encode(pixels(9), "JPEG"))
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("path,label,split\nx0.jpg,b,train\nx1.jpg,a,train\nx2.jpg,b,test\n"
                        "./x3.jpg,a,validation\ngone.jpg,a,train\n")
    manifest = convert(root, tmp_path / "out", "--labels_csv", csv_path, "--class_names", "b,a",
                       "--max_reject_fraction", "0.5")
    assert manifest.class_names == ("b", "a")
    labels = {r[schemas.FILENAME.key].decode(): (r[schemas.LABEL.key], r["split"])
              for r in read_records(tmp_path / "out")}
    assert labels == {"x0.jpg": (0, "train"), "x1.jpg": (1, "train"), "x2.jpg": (0, "test"),
                      "x3.jpg": (1, "validation")}
    rejects = [json.loads(line) for line in (tmp_path / "out" / schemas.REJECTS_FILENAME).open()]
    assert {(r["path"], r["reason"]) for r in rejects} == {
        ("gone.jpg", "missing_file"), ("unlisted.jpg", "no_label")}
    assert manifest.counts == {"found": 6, "written": 4, "rejected": 1, "skipped": 1}


def test_bad_files_are_rejected_with_reasons_and_counts_reconcile(tmp_path):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a", "b"), per_class=4)
    jpeg = encode(pixels(5, size=(64, 64)), "JPEG")
    write(root / "a" / "empty.jpg", b"")
    write(root / "a" / "text.jpg", b"hello, not an image\n")
    write(root / "a" / "truncated.jpg", jpeg[: len(jpeg) // 2])
    write(root / "b" / ".DS_Store", b"\0\0")
    write(root / "b" / "._img_00.jpg", b"\0\0")
    write(root / "notes.txt", b"a stray file at the top")
    write(root / "b" / "huge.png", encode(pixels(6, size=(300, 300)), "PNG"))
    manifest = convert(root, tmp_path / "out", "--max_pixels", "50000", "--max_reject_fraction", "0.5")
    rejects = {r["path"]: r for r in map(json.loads, (tmp_path / "out" / schemas.REJECTS_FILENAME).open())}
    assert {p: r["reason"] for p, r in rejects.items()} == {
        "a/empty.jpg": "empty_file",
        "a/text.jpg": "not_an_image",
        "a/truncated.jpg": "corrupt",
        "b/.DS_Store": "hidden_file",
        "b/._img_00.jpg": "hidden_file",
        "notes.txt": "no_label",
        "b/huge.png": "too_large",
    }
    assert rejects["b/huge.png"]["kind"] == "rejected" and "90,000" in rejects["b/huge.png"]["message"]
    assert rejects["notes.txt"]["kind"] == "skipped"
    c = manifest.counts
    assert c["found"] == 8 + 7 and c["written"] == 8
    assert c["found"] == c["written"] + c["rejected"] + c["skipped"]
    assert manifest.rejects == {"corrupt": 1, "empty_file": 1, "hidden_file": 2, "no_label": 1,
                                "not_an_image": 1, "too_large": 1}
    assert len(read_records(tmp_path / "out")) == 8
    summary = convert_module.summarize(str(tmp_path / "out"))
    assert "Converted 8 images" in summary and "rejected 4" in summary and "rejects.jsonl" in summary


def test_reject_fraction_limit_fails_loudly_without_manifest(tmp_path, capsys):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a",), per_class=2)
    for i in range(3):
        write(root / "a" / f"bad{i}.jpg", b"junk")
    out = tmp_path / "out"
    code = convert_module.main(["--input_dir", str(root), "--output_dir", str(out)])
    assert code == 1
    err = capsys.readouterr().err
    assert "3 of 5 images were rejected" in err and "--max_reject_fraction=0.1" in err
    assert not (out / schemas.MANIFEST_FILENAME).exists()
    assert len((out / schemas.REJECTS_FILENAME).read_text().splitlines()) == 3


def test_overwrite_required_and_stale_shards_removed(tmp_path):
    root = tmp_path / "images"
    make_class_tree(root, per_class=4)
    out = tmp_path / "out"
    convert(root, out, "--num_shards", "4")
    assert len(list(out.glob("*.tfrecord"))) == 4
    with pytest.raises(FileExistsError, match="--overwrite"):
        convert(root, out, "--num_shards", "2")
    (out / "user_notes.txt").write_text("keep me")
    manifest = convert(root, out, "--num_shards", "2", "--overwrite")
    assert sorted(p.name for p in out.glob("*.tfrecord")) == [s.file for s in manifest.splits["train"].shards]
    assert len(manifest.splits["train"].shards) == 2
    assert (out / "user_notes.txt").read_text() == "keep me"
    assert not (out / "_shardsmith_tmp").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--split", "train=0.8,val=0.3"], "add up to 1"),  # ratios sum to 1.1
        (["--split", "train:1"], "--split must look like"),  # wrong separator
        (["--num_shards", "0"], "--num_shards must be at least 1"),
        (["--max_reject_fraction", "2"], r"--max_reject_fraction must be in \[0, 1\]"),
        (["--class_names", "a,a"], "--class_names must be distinct"),
        (["--background", "red"], "--background must be R,G,B"),
        (["--background", "0,0,300"], r"--background must be R,G,B in 0-255. Received: \(0, 0, 300\)"),
        (["--max_pixels", "0"], "--max_pixels must be at least 1. Received: 0"),
        (["--target_shard_mb", "0"], "--target_shard_mb must be at least 1. Received: 0"),
        (["--min_shards", "0"], "--min_shards must be at least 1. Received: 0"),
        (["--overwrite", "--resume"], "give one of them"),
    ],
)
def test_bad_arguments_get_one_clear_sentence(tmp_path, capsys, args, message):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a",), per_class=1)
    code = convert_module.main(["--input_dir", str(root), "--output_dir", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("shardsmith convert: error: ")
    assert len(err.strip().splitlines()) == 1
    assert pytest.importorskip("re").search(message, err)


def test_missing_or_empty_input_and_output_inside_input(tmp_path, capsys):
    assert convert_module.main(["--input_dir", str(tmp_path / "nope"), "--output_dir", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert convert_module.main(["--input_dir", str(tmp_path / "empty"), "--output_dir", str(tmp_path / "o")]) == 2
    assert "contains no files" in capsys.readouterr().err
    make_class_tree(tmp_path / "in", classes=("a",), per_class=1)
    assert convert_module.main(["--input_dir", str(tmp_path / "in"), "--output_dir", str(tmp_path / "in" / "out")]) == 2
    assert "inside --input_dir" in capsys.readouterr().err


def test_dofns_and_specs_pickle():
    from apache_beam.internal import pickler

    def write_fn():
        return _write.WriteShardFn(ShardSpec("/tmp/x", ValidationOptions(max_pixels=10, background=(0, 0, 0)),
                                             num_classes=2, total_shards=1))

    fn = write_fn()
    for obj in (fn, schemas.IMAGE_SCHEMA, schemas.IMAGE):
        assert pickler.loads(pickler.dumps(obj)) is not None
        pickle.loads(pickle.dumps(obj))
    # A schema with every kind of feature comes back equal and encodes alike.
    schema = schemas.ImageExampleSchema(extra_string_features=("dicom_Modality",), georef=True)
    record = schemas.ImageRecord(image=b"x", label=1, filename="a.tif", format="png", height=2,
                                 width=3, channels=1, extra={"dicom_Modality": "CT",
                                 **schemas.georef_values(32633, (1.0, 2.0, 0.0, 3.0, 0.0, -2.0))})
    before = schema.encode(record)  # Fills the schema's caches of encoded entries.
    for restored in (pickle.loads(pickle.dumps(schema)), pickler.loads(pickler.dumps(schema))):
        assert restored == schema and restored.georef and restored.encode(record) == before
    fn.setup()  # Heavy objects (its shard maker, with its worker processes) are got in setup().
    try:
        assert fn._maker is not None
        restored = pickler.loads(pickler.dumps(write_fn()))
        assert restored._maker is None
    finally:
        fn.teardown()


def test_index_files_give_each_record_offset_and_length(converted):
    import hashlib

    _, _, out, manifest = converted
    for info in manifest.splits.values():
        for shard in info.shards:
            assert shard.index_file == schemas.index_filename(shard.file)
            index_bytes = (out / shard.index_file).read_bytes()
            assert hashlib.sha256(index_bytes).hexdigest() == shard.index_sha256
            assert hashlib.sha256((out / shard.file).read_bytes()).hexdigest() == shard.sha256
            entries = [tuple(map(int, line.split())) for line in index_bytes.decode().splitlines()]
            assert len(entries) == shard.num_records
            data = (out / shard.file).read_bytes()
            assert sum(length for _, length in entries) == len(data)
            records = [bytes(r.numpy()) for r in tf.data.TFRecordDataset(str(out / shard.file))]
            for (offset, length), record in zip(entries, records):
                # 12 bytes of length and its CRC before the data, 4 bytes of CRC after.
                assert data[offset + 12: offset + length - 4] == record


def test_the_job_graph_does_not_grow_with_the_number_of_images(tmp_path):
    """Only one plan path per shard travels in the graph (Dataflow caps requests at 10 MB)."""
    import apache_beam as beam

    from conversion import shard_plans
    from conversion import plan as _plan

    def graph_bytes(n_files):
        out = tmp_path / f"out{n_files}"
        files = [_plan.PlannedFile("train", i % 4, i, f"c/{i:07d}_a_long_file_name.jpg",
                                   f"/data/in/c/{i:07d}_a_long_file_name.jpg", 1000, 0, 4)
                 for i in range(n_files)]
        plan = _plan.Plan(files=tuple(files), problems=(), class_names=("c",),
                          shard_counts={"train": 4}, num_found=n_files, split_source="hash")
        config = convert_module.ConversionConfig(input_dir="/data/in", output_dir=str(out))
        paths = shard_plans.write_shard_plans(plan.files, str(out))
        assert [shard_plans.load_shard_plan(p)[1] for p in paths] == [
            [f for f in files if f.shard == i] for i in range(4)]
        pipeline = beam.Pipeline()
        _ = pipeline | convert_module.ConvertImages(plan, config, paths)
        return len(pipeline.to_runner_api().SerializeToString())

    small, large = graph_bytes(10), graph_bytes(20_000)
    assert large - small < 2_000, (small, large)


def test_options_are_built_once_into_groups_handed_down_whole():
    from conversion.options import ShardingOptions, WritingOptions
    from imaging import DicomOptions

    config = convert_module.config_from_options(convert_module.ConvertOptions([
        "--input_dir", "in", "--output_dir", "out", "--max_pixels", "1000", "--full_decode",
        "--background", "1,2,3", "--dicom_frames", "all", "--num_shards", "3", "--dedup",
        "--worker_threads", "2",
    ]))
    assert config.validation == ValidationOptions(
        max_pixels=1000, background=(1, 2, 3), full_decode=True, dicom=DicomOptions(frames="all"))
    # DICOM files are held to the same --max_pixels.
    assert config.validation.dicom.max_pixels == 1000
    assert config.sharding == ShardingOptions(num_shards=3)
    assert config.writing == WritingOptions(dedup=True, worker_threads=2)
    # The flags' defaults are the groups' defaults: one definition each.
    default = convert_module.config_from_options(convert_module.ConvertOptions(
        ["--input_dir", "in", "--output_dir", "out"]))
    assert default == convert_module.ConversionConfig(input_dir="in", output_dir="out")
