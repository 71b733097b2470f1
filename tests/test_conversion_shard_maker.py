"""conversion.shard_maker: one object owns a shard's life (receipt, fingerprint, worker processes, crash retry).

Real files, real worker processes, and a real Pillow plugin whose decoder crashes or hangs
(`helpers.faulty_plugin`), loaded by the worker processes as a third-party plugin would be.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time

import pytest
from helpers import add_faulty_files, faulty_plugin, make_class_tree

import schemas
from conversion import guard, plan as _plan, processes as _processes
from conversion.options import WritingOptions
from conversion.shard_maker import ShardMaker, ShardSpec, shard_file
from imaging import ValidationOptions


def _filenames(shard_path) -> list[str]:
    """The filename of each record of a shard, read with TensorFlow's own reader and parser."""
    import tensorflow as tf

    spec = schemas.ImageExampleSchema().parse_spec()
    return [tf.io.parse_single_example(raw, spec)[schemas.FILENAME.key].numpy().decode()
            for raw in tf.data.TFRecordDataset(str(shard_path))]


def _planned(root, split="train", shard=0, num_shards=1, label_of=None) -> list[_plan.PlannedFile]:
    rels = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.*"))
    classes = sorted({rel.split("/")[0] for rel in rels})
    return [_plan.PlannedFile(split, shard, i, rel, str(root / rel), (root / rel).stat().st_size,
                              classes.index(rel.split("/")[0]), num_shards)
            for i, rel in enumerate(rels)]


@pytest.fixture
def photos(tmp_path):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a", "b"), per_class=3)
    return root


def _spec(out, **writing) -> ShardSpec:
    return ShardSpec(str(out), ValidationOptions(), WritingOptions(**writing), num_classes=2, total_shards=1)


def test_a_shard_is_written_in_this_thread_and_its_records_read_back(photos, tmp_path, caplog):
    maker = ShardMaker(_spec(tmp_path / "out"))
    shard = maker.shard("train", 0, reversed(_planned(photos)))  # Any order: the plan's is restored.
    assert shard.name == schemas.shard_filename("train", 0, 1) and [f.order for f in shard.files] == list(range(6))
    with caplog.at_level(logging.INFO, logger="shardsmith.convert"):
        outcome = maker.write(shard)
    assert outcome.result.num_records == 6 and not outcome.rejects
    assert _filenames(tmp_path / "out" / shard.name) == [f.rel_path for f in shard.files]
    assert f"Wrote {shard.name}: 6 images [1 of 1 shards done]" in caplog.text


def test_resume_keeps_a_shard_whose_receipt_and_file_still_match(photos, tmp_path):
    out = tmp_path / "out"
    files = _planned(photos)
    written = ShardMaker(_spec(out)).write(ShardMaker(_spec(out)).shard("train", 0, files))
    assert ShardMaker(_spec(out)).kept(ShardMaker(_spec(out)).shard("train", 0, files)) is None  # No --resume.
    resuming = ShardMaker(_spec(out, resume=True))
    assert resuming.kept(resuming.shard("train", 0, files)) == written
    # Another option the bytes depend on: another fingerprint, no receipt.
    other = ShardMaker(dataclasses.replace(_spec(out, resume=True), validation=ValidationOptions(max_pixels=100)))
    assert other.kept(other.shard("train", 0, files)) is None
    # A shard file changed since: written again.
    (out / written.result.file).write_bytes(b"changed")
    assert resuming.kept(resuming.shard("train", 0, files)) is None


def test_the_fingerprint_follows_the_files_not_the_threads(photos, tmp_path):
    files = _planned(photos)

    def fingerprint(spec, files=files):
        return ShardMaker(spec).shard("train", 0, files).fingerprint

    base = _spec(tmp_path)
    assert fingerprint(base) == fingerprint(_spec(tmp_path, worker_threads=3))
    assert fingerprint(base) != fingerprint(base, files[:-1])
    # A file's mask (its path and dtype) travels in its targets, and so counts.
    masked = [dataclasses.replace(f, targets='{"mask":{"dtype":"uint8","path":"/m/x.png"}}') for f in files]
    assert fingerprint(base) != fingerprint(base, masked)


def test_worker_processes_write_the_bytes_of_this_thread(photos, tmp_path):
    files = _planned(photos)
    in_thread = ShardMaker(_spec(tmp_path / "thread")).write(ShardMaker(_spec(tmp_path / "thread")).shard(
        "train", 0, files))
    maker = ShardMaker.shared(_spec(tmp_path / "pool", worker_processes=1), processes=1)
    try:
        assert maker.processes == 1
        future = maker.write_later(maker.shard("train", 0, files))
        assert future.result(timeout=120).result.sha256 == in_thread.result.sha256
    finally:
        maker.release()
    assert maker.pool is None
    assert (tmp_path / "pool" / in_thread.result.file).read_bytes() == \
        (tmp_path / "thread" / in_thread.result.file).read_bytes()


def test_one_maker_per_run_in_a_process_closed_by_its_last_user(tmp_path):
    spec = _spec(tmp_path, file_timeout=7)
    first = ShardMaker.shared(spec, processes=1)
    pool = first.pool
    second = ShardMaker.shared(dataclasses.replace(spec, total_shards=3), processes=1)  # The same run.
    other_run = ShardMaker.shared(_spec(tmp_path, file_timeout=9), processes=1)
    try:
        assert second is first and other_run is not first and other_run.pool is not pool
        # Each run's worker processes stop a stuck file after its own --file_timeout.
        assert pool._watchdog._timeout == 7 and other_run.pool._watchdog._timeout == 9
        first.release()
        assert not pool.closed and pool.call(divmod, 5, 5) == (1, 0)
    finally:
        second.release()
        other_run.release()
    assert pool.closed
    assert ShardMaker.shared(spec) is not first  # Released by all: a new one.
    ShardMaker.shared(spec).release()


def test_the_pool_is_resized_and_the_spec_completed_not_changed(tmp_path):
    maker = ShardMaker.shared(_spec(tmp_path))
    try:
        maker.start_processes(2, decoders=False)
        pool = maker.pool
        maker.start_processes(2)
        assert maker.pool is pool
        maker.start_processes(1)
        assert pool.closed and maker.processes == 1
        maker.start_processes(0)
        assert maker.pool is None
        maker.spec = dataclasses.replace(maker.spec, num_classes=5, targets=["boxes"])
        assert maker.spec.num_classes == 5 and maker.spec.targets == ("boxes",)
        with pytest.raises(ValueError, match="only in what the plan decides"):
            maker.spec = dataclasses.replace(maker.spec, output_dir=str(tmp_path / "elsewhere"))
    finally:
        maker.release()


def test_an_aborted_maker_is_killed_at_once_even_mid_call(tmp_path):
    maker = ShardMaker.shared(_spec(tmp_path), processes=1)
    pool = maker.pool
    procs = [w._proc for w in pool._workers]
    outcome = []

    def sleep_in_child():
        try:
            pool.call(time.sleep, 60)
        except BaseException as e:
            outcome.append(e)

    busy = threading.Thread(target=sleep_in_child)
    busy.start()
    while not pool._idle.empty():  # The call has taken the child.
        time.sleep(0.01)
    start = time.monotonic()
    maker.abort()
    busy.join()
    assert time.monotonic() - start < 5 and all(p.poll() is not None for p in procs)
    assert [type(e) for e in outcome] == [_processes.WorkerDied]
    assert pool.closed and ShardMaker.shared(maker.spec) is not maker
    ShardMaker.shared(maker.spec).release()


def test_shards_started_early_are_taken_by_their_first_write(photos, tmp_path):
    files = _planned(photos)
    maker = ShardMaker.shared(_spec(tmp_path / "out"), processes=1)
    try:
        maker.start_early([files])
        assert len(maker.pool._early) == 1
        outcome = maker.write(maker.shard("train", 0, files))
        assert maker.pool._early == [] and outcome.result.num_records == 6
    finally:
        maker.release()


def test_a_file_that_crashes_or_hangs_its_process_costs_that_file_only(photos, tmp_path, monkeypatch):
    faulty = add_faulty_files(photos, "b")  # Crashes (SIGSEGV), hangs, raises: in the worker processes.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(faulty_plugin(tmp_path)),
                                                      *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = tmp_path / "out"
    maker = ShardMaker.shared(_spec(out, worker_processes=1, file_timeout=3), processes=1)
    try:
        outcome = maker.write(maker.shard("train", 0, _planned(photos)))
    finally:
        maker.release()
    reasons = {r.rel_path: r.reason for r in outcome.rejects}
    assert reasons == {rel: {"SEGV": guard.DECODER_CRASHED, "HANG": guard.TIMEOUT, "RAISE": guard.INTERNAL_ERROR}[kind]
                       for rel, kind in faulty.items()}
    assert outcome.result.num_records == 6
    # The culprits are quarantined: the run that goes on rejects them unread.
    quarantined = guard.Quarantine(guard.quarantine_path(str(out))).load()
    assert sorted(quarantined) == sorted(rel for rel, kind in faulty.items() if kind != "RAISE")


def test_a_copy_carries_its_reject_message_to_the_writer():
    original = _plan.PlannedFile("train", 0, 0, "a/x.jpg", "/in/a/x.jpg", 10, 0, 1)
    copy = dataclasses.replace(original, rel_path="a/y.jpg", path="/in/a/y.jpg", duplicate_of="a/x.jpg")
    assert shard_file(original).duplicate is None
    assert shard_file(copy).duplicate == "same content as a/x.jpg"
    assert shard_file(copy)[:4] == ("a/y.jpg", "/in/a/y.jpg", 10, 0)


def test_a_worker_process_reads_the_shard_plan_and_writes_the_same_bytes_and_receipt(photos, tmp_path):
    from conversion.receipts import Receipts
    from conversion.shard_plans import write_shard_plans

    files = _planned(photos)
    out_plan, out_files = tmp_path / "plan", tmp_path / "files"
    (path,) = write_shard_plans(list(reversed(files)), str(out_plan))  # The worker restores the order.
    bad = files[2].rel_path
    guard.Quarantine(guard.quarantine_path(str(out_plan))).add({bad: ("timeout", "hung"), "b/other.jpg": ("x", "y")})
    guard.Quarantine(guard.quarantine_path(str(out_files))).add({bad: ("timeout", "hung")})
    by_plan = ShardMaker.shared(_spec(out_plan), processes=1)
    by_files = ShardMaker.shared(_spec(out_files), processes=1)
    try:
        by_plan.start_early_plans([path])
        assert len(by_plan.pool._early) == 1
        outcome = by_plan.write_plan(path)
        assert by_plan.pool._early == []  # The early call's outcome was taken.
        shard = by_files.shard("train", 0, files)
        expected = by_files.write(shard)
    finally:
        by_plan.release()
        by_files.release()
    assert outcome == expected and outcome.result.num_records == 5
    assert [(r.rel_path, r.reason) for r in outcome.rejects] == [(bad, "timeout")]
    assert (out_plan / shard.name).read_bytes() == (out_files / shard.name).read_bytes()
    # Its receipt, saved by the worker process, is the one --resume looks for.
    assert Receipts(str(out_plan)).load(shard.name, shard.fingerprint) == expected


def test_write_plan_needs_worker_processes_and_no_resume(photos, tmp_path):
    maker = ShardMaker(_spec(tmp_path / "out"))
    with pytest.raises(RuntimeError, match="worker processes"):
        maker.write_plan(str(tmp_path / "train-00000-of-00001.tfrecord.json"))
