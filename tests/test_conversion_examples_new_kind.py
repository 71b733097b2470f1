"""The kinds of examples' seam: a new kind is one module per side and one row (docs/architecture.md).

A toy kind of example made of two files, `<name>_L.png` and `<name>_R.png`, stored as
one image (the two side by side), written here as `conversion/examples/<kind>.py`
would be, joins the table through its public name only (`conversion.examples.KINDS`),
for this test alone, and goes through the whole conversion on Beam's local runner,
verify and TensorFlow's reader: its records are images, so the reader's image row
reads them. Written in the runner's threads (`--worker_processes 0`): a worker
process imports the table as the repository holds it.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
from helpers import convert
from PIL import Image

import readers
import schemas
from beam_jobs import verify
from conversion import examples
from conversion.elements import Reject, ShardOutcome, ShardResult
from conversion.examples import ExampleKind, Grouped
from conversion.files import AtomicWriter, write_shard_index
from conversion.listing import Problem
from conversion.targets import CLASS
from schemas.tfrecord import frame_record

_LEFT, _RIGHT = "_L.png", "_R.png"


def _applies(validation) -> bool:
    return True  # Asked first, for this test: every conversion.


def _group(files, problems, config, appending=None) -> Grouped:
    # One example per pair, named by its left file; a file without its other half is refused.
    by_path = {f.rel_path: f for f in files}
    kept, members, refused = [], {}, list(problems)
    for f in files:
        if f.rel_path.endswith(_LEFT) and f.rel_path[:-len(_LEFT)] + _RIGHT in by_path:
            kept.append(f)
            members[f.rel_path] = (f.rel_path, f.rel_path[:-len(_LEFT)] + _RIGHT)
        elif not (f.rel_path.endswith(_RIGHT) and f.rel_path[:-len(_RIGHT)] + _LEFT in by_path):
            refused.append(Problem(f.rel_path, "no_label", "not a pair"))
    return Grouped(kept, refused, members)


def _finish_plan(plan, grouped: Grouped):
    # Every input file counted once: each example's second file too (found = written + rejected + skipped).
    return dataclasses.replace(plan, num_found=plan.num_found + len(grouped.members))


def _write_shard(job) -> ShardOutcome:
    schema = examples.KINDS[-1].record_schema(job.validation, job.targets)
    writer = AtomicWriter(job.output_dir, job.name)
    entries, stored, classes, sources = [], [], CLASS.counter(job.num_classes), 0
    rejects = []
    for f in job.files:
        right = f.path[:-len(_LEFT)] + _RIGHT
        try:
            pair = [np.asarray(Image.open(p).convert("RGB")) for p in (f.path, right)]
            joined = np.concatenate(pair, axis=1)
        except (OSError, ValueError) as e:
            rejects += [Reject(f.rel_path, "undecodable", str(e)), Reject(f.rel_path[:-len(_LEFT)] + _RIGHT,
                                                                         "undecodable", str(e))]
            continue
        buf = io.BytesIO()
        Image.fromarray(joined).save(buf, "PNG")
        data = buf.getvalue()
        h, w, c = joined.shape
        framed = frame_record(schema.encode(schemas.ImageRecord(
            image=data, label=f.label, filename=f.rel_path[:-len(_LEFT)], format="png", height=h, width=w,
            channels=c)))
        entries.append((writer.num_bytes, len(framed)))
        writer.write(framed)
        classes.add(f.label)
        stored.append(("png", h, w, c, schemas.sample_dtype("png", data)))
        sources += 2
    writer.commit()
    index_name, index_sha256 = write_shard_index(job.output_dir, job.name, entries)
    stats = schemas.ImageStats.of(stored)
    result = ShardResult(job.split, job.index, job.num_shards, job.name, len(entries), writer.num_bytes,
                         writer.sha256, classes.to_json(), index_name, index_sha256, sources,
                         images=stats.to_json() if stats else None)
    return ShardOutcome(result, rejects, [])


PAIRS = ExampleKind(name="pairs", applies=_applies, group=_group,
                    record_schema=examples.KINDS[-1].record_schema, write_shard=_write_shard,
                    warm_call=examples.KINDS[-1].warm_call, finish_plan=_finish_plan)


@pytest.fixture
def pairs_kind(monkeypatch):
    monkeypatch.setattr(examples, "KINDS", (PAIRS, *examples.KINDS))
    return PAIRS


def _pixels(seed: int, h: int, w: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_a_new_kind_of_example_is_one_module_and_one_row(pairs_kind, tmp_path):
    sources = {}
    for c, name in enumerate(("left_hand", "right_hand")):
        for i in range(4):
            left, right = _pixels(c * 10 + i, 12, 8 + i), _pixels(c * 10 + i + 100, 12, 5)
            folder = tmp_path / "in" / name
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(left).save(folder / f"p{i}{_LEFT}")
            Image.fromarray(right).save(folder / f"p{i}{_RIGHT}")
            sources[f"{name}/p{i}"] = (np.concatenate([left, right], axis=1), name)
    Image.fromarray(_pixels(7, 4, 4)).save(tmp_path / "in" / "left_hand" / f"alone{_RIGHT}")
    out = tmp_path / "out"
    manifest = convert(tmp_path / "in", out, "--worker_processes", "0")

    c = manifest.counts
    assert (c["found"], c["written"], c["skipped"]) == (17, 16, 1)
    assert c["found"] == c["written"] + c["rejected"] + c["skipped"]
    assert manifest.class_names == ("left_hand", "right_hand")
    assert verify.main([str(out)]) == 0
    ds = readers.image_dataset_from_tfrecords(
        str(out), "train", batch_size=None, image_size=None, dtype="uint8", shuffle=False,
        extra_features=(schemas.FILENAME.key,))
    seen = {}
    for image, label, extras in ds:
        seen[extras[schemas.FILENAME.key].numpy().decode()] = (image.numpy(), int(label))
    assert sorted(seen) == sorted(sources)
    for name, (image, label) in seen.items():
        want, cls = sources[name]
        np.testing.assert_array_equal(image, want)
        assert manifest.class_names[label] == cls
