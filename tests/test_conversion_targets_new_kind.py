"""The target kinds' seam: a new kind is one module per side and one row (docs/architecture.md).

A toy kind, written here as a kind's module would be (`conversion/targets/<kind>.py`),
joins the table through its public names only (`schemas.TARGET_KINDS`,
`conversion.targets.TARGETS`), for this test alone, and goes through the whole
conversion on Beam's local runner, verify, inspect and TensorFlow's reader,
with no other file of the library touched. Its records are written in the
runner's threads (`--worker_processes 0`): a worker process imports the table
as the repository holds it, where a kind added for good has its row.
"""

from __future__ import annotations

import collections

import pytest
import tensorflow as tf
from helpers import convert, make_class_tree, read_records

import readers
import schemas
from beam_jobs import verify
from conversion import targets
from conversion.targets import Description, PlannedKind, RecordPart, TargetKind
from readers import targets as reader_targets
from readers.targets.mode import TargetMode
from shardsmith import inspection

# The kind's name and its one feature: the file's size in bytes and its stored image's pixel count.
NAME = "toy_area"
AREA = schemas.FeatureSpec("toy_area", "int64_list", "The file's bytes, then its stored image's pixels.")


def _plan(request) -> PlannedKind | None:
    # Every listed example gets a value; a file named 'skip_*' is refused with a reason.
    values = {f.rel_path: f.size for f in request.files if "skip_" not in f.rel_path}
    rejects = {f.rel_path: ("bad_target", "toy: refused by its name") for f in request.files
               if "skip_" in f.rel_path}
    return PlannedKind(values=values, section={"unit": "pixels"}, rejects=rejects)


def _record(value, image, raw_frame, name: str) -> RecordPart:
    return RecordPart({AREA.key: (value, image.height * image.width)})


class _Counts:
    def __init__(self):
        self.pixels = 0

    def add(self, part: RecordPart) -> None:
        self.pixels += part.extra[AREA.key][1]

    def to_json(self):
        return {"pixels": self.pixels} if self.pixels else None


def _section(section, shards, splits, num_classes: int) -> dict:
    pixels = collections.Counter()
    for s in shards:
        if s.targets and NAME in s.targets:
            pixels[s.split] += s.targets[NAME]["pixels"]
    return {**section, "pixels": {split: pixels[split] for split in sorted(splits)}}


def _verify(section, num_classes: int):
    if section.get("unit") != "pixels":
        return None, "the manifest's targets.toy_area.unit is not 'pixels'"

    def check(values, height, width, tf):
        area = values[AREA.key]
        return None if area[1] == height * width else f"{AREA.key} {list(area)} is not {height} x {width}"

    return check, None


def _describe(section, class_names, splits, max_classes: int) -> Description:
    return Description([f"toy areas: {sum(section['pixels'].values())} pixels"], [])


KIND = TargetKind(name=NAME, plan=_plan, record=_record, counter=_Counts, section=_section, verify=_verify,
                  describe=_describe)


# The reading side, as `readers/targets/<kind>.py` would hold it: label_mode='toy_area' gives
# the pixel count of the image as stored (the reader's geometry would scale it; here none).
def _label(features, geometry, settings, image_size):
    return features[AREA.key][1]


MODE = TargetMode(name=NAME, kind=NAME, keys=(AREA.key,), label=_label,
                  label_spec=lambda settings, image_size: tf.TensorSpec([], tf.int64),
                  placeholder=lambda settings: {AREA.key: [0, 0]})


@pytest.fixture
def toy_kind(monkeypatch):
    """The toy kind's rows (its features, its `TargetKind`, its `TargetMode`), for this test only."""
    monkeypatch.setitem(schemas.TARGET_KINDS, NAME, (AREA,))
    monkeypatch.setattr(targets, "TARGETS", (*targets.TARGETS, KIND))
    monkeypatch.setattr(reader_targets, "MODES", (*reader_targets.MODES, MODE))
    return KIND


@pytest.fixture
def tree(tmp_path):
    written = make_class_tree(tmp_path / "in", per_class=5)
    (tmp_path / "in" / "cat" / "skip_me.png").write_bytes((tmp_path / "in" / "cat" / "img_02.png").read_bytes())
    return tmp_path, written


def test_a_new_target_kind_is_one_module_and_one_row(toy_kind, tree, capsys):
    root, written = tree
    out = root / "out"
    manifest = convert(root / "in", out, "--worker_processes", "0", "--split", "train=0.7,validation=0.3")

    # Planned, stored and counted by its row; the image-level class as without it.
    assert manifest.class_names == ("cat", "dog", "fish")
    assert NAME in schemas.ImageExampleSchema.from_json(manifest.features).targets
    records = read_records(out)
    assert len(records) == len(written) == manifest.counts["written"]
    sizes = {rel: (root / "in" / rel).stat().st_size for rel in written}
    pixels = collections.Counter()
    for rec in records:
        name = rec[schemas.FILENAME.key].decode()
        assert list(rec[AREA.key]) == [sizes[name], rec[schemas.HEIGHT.key] * rec[schemas.WIDTH.key]]
        assert rec[schemas.LABEL.key] == manifest.class_names.index(written[name])
        pixels[rec["split"]] += int(rec[AREA.key][1])
    assert manifest.targets[NAME] == {"unit": "pixels", "pixels": dict(pixels)}
    assert manifest.rejects == {"bad_target": 1}

    # verify checks its records with its row, and inspect shows it with its row.
    assert verify.main([str(out)]) == 0
    assert inspection.main([str(out)]) == 0
    assert f"toy areas: {sum(pixels.values())} pixels" in capsys.readouterr().out

    # The public reader reads its feature back, beside the image-level class.
    ds = readers.image_dataset_from_tfrecords(
        str(out), "train", batch_size=None, image_size=None, shuffle=False, label_mode="int",
        extra_features=(schemas.FILENAME.key, AREA.key))
    seen = 0
    for image, label, extras in ds:
        name = extras[schemas.FILENAME.key].numpy().decode()
        assert extras[AREA.key].numpy().tolist() == [sizes[name], image.shape[0] * image.shape[1]]
        assert int(label) == manifest.class_names.index(written[name])
        seen += 1
    assert seen == manifest.splits["train"].num_records > 0

    # ... and its label mode, one row of the reader's table, reads it as the label.
    ds = readers.image_dataset_from_tfrecords(
        str(out), "validation", batch_size=None, image_size=None, shuffle=False, label_mode=NAME,
        extra_features=(schemas.FILENAME.key,))
    areas = [(int(area), image.shape[0] * image.shape[1]) for image, area, _ in ds]
    assert len(areas) == manifest.splits["validation"].num_records > 0
    assert all(area == pixels for area, pixels in areas)


def test_verify_finds_a_record_its_row_refuses(toy_kind, tree, monkeypatch):
    root, _ = tree
    out = root / "out"
    convert(root / "in", out, "--worker_processes", "0")
    assert verify.main([str(out)]) == 0

    def wrong(value, image, raw_frame, name):
        return RecordPart({AREA.key: (value, image.height * image.width + 1)})

    # The same kind, whose writer stored one pixel too many: its check says so.
    monkeypatch.setattr(targets, "TARGETS", (*targets.TARGETS[:-1], KIND.__class__(
        **{**KIND.__dict__, "record": wrong})))
    convert(root / "in", root / "wrong", "--worker_processes", "0")
    assert verify.main([str(root / "wrong")]) != 0
