"""The transforms and DoFns of beam_jobs, each run by Beam's `TestPipeline` and checked with `assert_that`.

Real files (made by `helpers`), the project's own runner (`_runner.make_runner`: Beam's in-process
portable runner on threads), and expectations computed from the input or the plan, never from the
transform under test: records per shard, the reject reason of every bad file, normalisations by
name, counters, duplicate groups, verify's findings on a tampered shard.
"""

from __future__ import annotations

import collections
import hashlib
import os

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_pipeline  # the module: pytest would collect its TestPipeline class
from apache_beam.testing.util import BeamAssertException, assert_that, equal_to

import schemas
from beam_jobs import _runner, _shards, _verify_fns, verify
from beam_jobs.convert import ConvertImages, build_plan, config_from_options
from conversion.config import ConversionConfig
from conversion import shard_plans
from conversion.shard_maker import ShardSpec
from helpers import convert, encode, make_class_tree, pixels, read_records, write

# --- The one place that builds transforms whose constructors may change ------------------------


def _test_pipeline() -> test_pipeline.TestPipeline:
    """A TestPipeline on the runner `convert.run` and `verify.run` use."""
    options = PipelineOptions([])
    return test_pipeline.TestPipeline(runner=_runner.make_runner(options), options=options)


def _config(input_dir, output_dir, *flags) -> ConversionConfig:
    """The conversion's options, from its command-line flags (as `convert.run` builds them)."""
    argv = ["--input_dir", str(input_dir), "--output_dir", str(output_dir), *map(str, flags)]
    return config_from_options(PipelineOptions(argv))


def _shard_plans(plan, config) -> list[str]:
    """The shard plan files `convert.run` writes before its pipeline starts."""
    return shard_plans.write_shard_plans(plan.files, config.output_dir)


def _images_to_tfrecords(plan, config) -> beam.PTransform:
    """`ImagesToTFRecords` as `ConvertImages` builds it from the plan and the config."""
    return _shards.ImagesToTFRecords(ShardSpec(
        config.output_dir, config.validation, config.writing, num_classes=len(plan.class_names),
        total_shards=sum(plan.shard_counts.values()),
    ))


def _verify_shard_fn(dataset_dir, manifest) -> beam.DoFn:
    """`VerifyShardFn` as `VerifyDataset` builds it."""
    return _verify_fns.VerifyShardFn(str(dataset_dir), manifest.features, len(manifest.class_names))


def _verify_dataset(dataset_dir, report_path) -> beam.PTransform:
    """`VerifyDataset` as `verify.run` builds it from the dataset folder."""
    text = (dataset_dir / schemas.MANIFEST_FILENAME).read_text()
    return verify.VerifyDataset(str(dataset_dir), schemas.Manifest.from_json(text), text, str(report_path))


# --- Inputs --------------------------------------------------------------------------------------

# Bad files of the corpus and the reason each must be rejected with.
_BAD = {
    "cat/truncated.jpg": "corrupt",
    "dog/notes.jpg": "not_an_image",
    "dog/empty.png": "empty_file",
}
_TRANSPARENT = "cat/clear.png"
_HIDDEN = "dog/.DS_Store"


def _make_corpus(root) -> dict[str, str]:
    """Good images of two classes, the bad files of `_BAD`, a transparent PNG and a hidden file.

    Returns:
      {relative path: class name} of the images that must be converted.
    """
    good = make_class_tree(root, classes=("cat", "dog"), per_class=5)
    jpeg = (root / "cat/img_00.jpg").read_bytes()
    write(root / "cat/truncated.jpg", jpeg[: len(jpeg) // 2])
    write(root / "dog/notes.jpg", b"Shopping list, not a photo.\n")
    write(root / "dog/empty.png", b"")
    alpha = np.tile(np.arange(0, 256, 8, dtype=np.uint8), (24, 1))  # transparent on the left
    write(root / _TRANSPARENT, encode(np.dstack([pixels(9), alpha]), "PNG"))
    write(root / _HIDDEN, b"\0\0\0\1Bud1")
    return {**good, _TRANSPARENT: "cat"}


def _planned_records_per_shard(plan, exclude=()) -> dict[str, int]:
    """Shard file name -> files the plan puts in it, less `exclude` (one record per image)."""
    counts = collections.Counter(
        schemas.shard_filename(f.split, f.shard, f.num_shards) for f in plan.files if f.rel_path not in exclude
    )
    return dict(counts)


def _counters(result) -> dict[str, int]:
    """The committed shardsmith counters of a finished pipeline, by name."""
    totals = collections.Counter()
    for counter in result.metrics().query(MetricsFilter().with_namespace("shardsmith"))["counters"]:
        totals[counter.key.metric.name] += counter.committed
    return dict(totals)


def _only(check):
    """A matcher of a PCollection of exactly one element, which `check` asserts on."""

    def match(actual):
        if len(actual) != 1:
            raise BeamAssertException(f"expected one element, got {len(actual)}: {actual!r}")
        check(actual[0])

    return match


# --- Conversion ----------------------------------------------------------------------------------


def test_images_to_tfrecords_tags_shards_rejects_and_normalisations(tmp_path):
    root, out = tmp_path / "images", tmp_path / "out"
    good = _make_corpus(root)
    config = _config(root, out, "--split", "train=0.75,test=0.25", "--num_shards", "2")
    plan = build_plan(config)
    expected_shards = _planned_records_per_shard(plan, exclude=_BAD)
    assert len(expected_shards) == 4 and sum(expected_shards.values()) == len(good)

    p = _test_pipeline()
    written = p | beam.Create(_shard_plans(plan, config)) | _images_to_tfrecords(plan, config)
    assert_that(written.shards | "ShardCounts" >> beam.Map(lambda s: (s.file, s.num_records)),
                equal_to(sorted(expected_shards.items())), label="Shards")
    assert_that(written[_shards.WriteShardFn.REJECTED] | "Reasons" >> beam.Map(lambda r: (r.rel_path, r.reason)),
                equal_to(sorted(_BAD.items())), label="Rejected")
    assert_that(written[_shards.WriteShardFn.NORMALIZED] | "Actions" >> beam.Map(lambda n: (n[0], n[1], n[2])),
                equal_to([(_TRANSPARENT, "png", ("flatten_alpha",))]), label="Normalized")
    result = p.run()

    counters = _counters(result)
    assert counters["records_written"] == len(good)
    assert counters["shards_written"] == len(expected_shards)
    assert {k: v for k, v in counters.items() if k.startswith("rejected_")} == {
        f"rejected_{reason}": 1 for reason in _BAD.values()
    }
    # The shards are on disk and hold what the results say; the hidden file never reached a writer.
    assert {name: _num_records(out / name) for name in expected_shards} == expected_shards
    assert _HIDDEN not in {f.rel_path for f in plan.files}


def _num_records(path) -> int:
    """Records in a TFRecord file, counted by TensorFlow's own reader."""
    import tensorflow as tf

    return sum(1 for _ in tf.data.TFRecordDataset(str(path)))


def test_dedup_rejects_copies_as_duplicates_of_the_smallest_path(tmp_path):
    root, out = tmp_path / "images", tmp_path / "out"
    good = make_class_tree(root, classes=("cat", "dog"), per_class=3)
    original = (root / "cat/img_00.jpg").read_bytes()
    copies = ("cat/zz_copy.jpg", "dog/copy_of_a_cat.jpg")  # both sort after cat/img_00.jpg
    for rel in copies:
        write(root / rel, original)
    config = _config(root, out, "--dedup", "--num_shards", "3", "--max_reject_fraction", "1")
    plan = build_plan(config)

    p = _test_pipeline()
    written = p | beam.Create(_shard_plans(plan, config)) | _images_to_tfrecords(plan, config)
    assert_that(
        written[_shards.WriteShardFn.REJECTED] | beam.Map(lambda r: (r.rel_path, r.reason, r.message)),
        equal_to([(rel, "duplicate", "same content as cat/img_00.jpg") for rel in copies]),
        label="Duplicates",
    )
    assert_that(written.shards | beam.Map(lambda s: s.num_records) | beam.combiners.ToList()
                | beam.Map(sum), equal_to([len(good)]), label="Records")
    p.run()


def test_convert_images_yields_the_manifest_it_writes(tmp_path):
    root, out = tmp_path / "images", tmp_path / "out"
    good = _make_corpus(root)
    config = _config(root, out, "--num_shards", "2", "--max_reject_fraction", "0.5")
    plan = build_plan(config)
    per_class = collections.Counter(good.values())

    def check(manifest):
        on_disk = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
        assert manifest == on_disk
        assert manifest.class_names == ("cat", "dog")
        assert manifest.counts == {"found": len(good) + len(_BAD) + 1, "written": len(good),
                                   "rejected": len(_BAD), "skipped": 1}
        assert manifest.rejects == dict(sorted(collections.Counter([*_BAD.values(), "hidden_file"]).items()))
        assert manifest.normalized == {"flatten_alpha": 1}
        assert manifest.splits["train"].class_counts == (per_class["cat"], per_class["dog"])
        assert [s.num_records for s in manifest.splits["train"].shards] == [
            n for _, n in sorted(_planned_records_per_shard(plan, exclude=_BAD).items())
        ]

    with _test_pipeline() as p:
        assert_that(p | ConvertImages(plan, config, _shard_plans(plan, config)), _only(check))


def test_convert_images_fails_past_the_reject_fraction_and_writes_no_manifest(tmp_path):
    root, out = tmp_path / "images", tmp_path / "out"
    _make_corpus(root)
    config = _config(root, out, "--num_shards", "1")  # 3 of 14 rejected > the default 0.1
    plan = build_plan(config)
    p = _test_pipeline()
    _ = p | ConvertImages(plan, config, _shard_plans(plan, config))
    with pytest.raises(Exception, match="--max_reject_fraction=0.1"):
        p.run()
    assert not (out / schemas.MANIFEST_FILENAME).exists()
    assert (out / schemas.REJECTS_FILENAME).read_text().count("\n") == len(_BAD) + 1


# --- Verification --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(dataset folder, its records as read back) of a small two-split conversion."""
    tmp = tmp_path_factory.mktemp("converted")
    make_class_tree(tmp / "images", classes=("cat", "dog", "fish"), per_class=6)
    out = tmp / "out"
    convert(tmp / "images", out, "--split", "train=0.5,test=0.5", "--num_shards", "2")
    return out, read_records(out)


def test_verify_shard_fn_checks_each_shard_and_tags_each_image_content(converted):
    out, records = converted
    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    shards = [(split, shard) for split, info in manifest.splits.items() for shard in info.shards]
    expected_checks = [
        (s.file, s.num_records, tuple(s.class_counts), ()) for _, s in shards
    ]
    expected_content = [
        (hashlib.sha256(r[schemas.IMAGE.key]).hexdigest(), (r["split"], r[schemas.FILENAME.key].decode()))
        for r in records
    ]
    assert len(expected_checks) == 4 and len(expected_content) == 18

    with _test_pipeline() as p:
        checked = (
            p
            | beam.Create(shards)
            | beam.ParDo(_verify_shard_fn(out, manifest)).with_outputs(
                _verify_fns.VerifyShardFn.CONTENT, main="checks")
        )
        assert_that(checked.checks | beam.Map(lambda c: (c.file, c.num_records, c.class_counts, c.problems)),
                    equal_to(expected_checks), label="Checks")
        assert_that(checked[_verify_fns.VerifyShardFn.CONTENT], equal_to(expected_content), label="Content")


def test_verify_dataset_reports_a_sound_dataset_ok(converted, tmp_path):
    out, records = converted
    per_split = collections.Counter(r["split"] for r in records)

    def check(report):
        assert report["ok"] and report["problems"] == []
        assert report["records"] == len(records)
        assert report["splits"] == {s: {"shards": 2, "records": n} for s, n in per_split.items()}
        assert report["duplicates"]["groups"] == 0

    with _test_pipeline() as p:
        assert_that(p | _verify_dataset(out, tmp_path / "report.json"), _only(check))
    assert (tmp_path / "report.json").exists()


def test_verify_dataset_names_the_tampered_shard(converted, tmp_path):
    out, _ = converted
    manifest = schemas.Manifest.from_json((out / schemas.MANIFEST_FILENAME).read_text())
    copy = tmp_path / "dataset"
    copy.mkdir()
    for entry in sorted(os.listdir(out)):
        if (out / entry).is_file():
            (copy / entry).write_bytes((out / entry).read_bytes())
    victim = manifest.splits["test"].shards[1]
    data = bytearray((copy / victim.file).read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a record's image bytes: its CRC no longer matches
    (copy / victim.file).write_bytes(bytes(data))

    def check(report):
        problems = report["problems"]
        assert not report["ok"]
        # The shard (read on by its index file past the damaged record) and the split's totals.
        assert {p.split(":", 1)[0] for p in problems} == {victim.file, "split test"}
        # The damaged record, where it is, what is wrong and the source file it held.
        assert any(p.startswith(f"{victim.file}: record ") and "bad data CRC; source file lost: " in p
                   for p in problems)
        assert any(p.startswith(f"{victim.file}: 1 damaged record(s) of ") for p in problems)
        assert any(
            p.startswith("split test: ") and p.endswith(f"the manifest says {manifest.splits['test'].num_records}")
            for p in problems)

    with _test_pipeline() as p:
        assert_that(p | _verify_dataset(copy, tmp_path / "report.json"), _only(check))


def test_duplicate_group_lists_contents_seen_more_than_once(tmp_path):
    seen = [
        ("a" * 64, ("train", "cat/1.jpg")),
        ("a" * 64, ("test", "cat/2.jpg")),
        ("a" * 64, ("train", "cat/0.jpg")),
        ("b" * 64, ("train", "dog/1.jpg")),  # once: no group
        ("c" * 64, ("test", "dog/2.jpg")),
        ("c" * 64, ("test", "dog/3.jpg")),
    ]
    with _test_pipeline() as p:
        groups = p | beam.Create(seen) | beam.GroupByKey() | beam.FlatMap(_verify_fns.duplicate_group)
        members = groups | beam.Map(
            lambda g: (g["sha256"][0], [(i["split"], i["filename"]) for i in g["images"]], g["splits"]))
        # Members in (split, filename) order; contents seen once make no group.
        assert_that(members, equal_to([
            ("a", [("test", "cat/2.jpg"), ("train", "cat/0.jpg"), ("train", "cat/1.jpg")], ["test", "train"]),
            ("c", [("test", "dog/2.jpg"), ("test", "dog/3.jpg")], ["test"]),
        ]))


def test_verify_dataset_reports_copies_across_splits(tmp_path):
    root, out = tmp_path / "images", tmp_path / "out"
    make_class_tree(root, classes=("cat", "dog"), per_class=3)
    original = (root / "cat/img_00.jpg").read_bytes()
    for i in range(6):
        write(root / f"cat/copy_{i}.jpg", original)
    convert(root, out, "--split", "train=0.5,test=0.5", "--num_shards", "1")
    by_content = collections.defaultdict(list)
    for r in read_records(out):
        by_content[hashlib.sha256(r[schemas.IMAGE.key]).hexdigest()].append(
            (r["split"], r[schemas.FILENAME.key].decode()))
    expected = {digest: sorted(members) for digest, members in by_content.items() if len(members) > 1}
    assert len(expected) == 1 and {s for s, _ in next(iter(expected.values()))} == {"train", "test"}

    def check(report):
        dup = report["duplicates"]
        assert report["ok"] and dup["groups"] == 1 and dup["across_splits"] == 1
        assert {d["sha256"]: [(i["split"], i["filename"]) for i in d["images"]] for d in dup["list"]} == expected

    with _test_pipeline() as p:
        assert_that(p | _verify_dataset(out, tmp_path / "report.json"), _only(check))
