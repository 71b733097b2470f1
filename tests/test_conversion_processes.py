"""Worker processes (conversion/processes.py) and conversions that write their shards in them."""

from __future__ import annotations

import dataclasses
import io
import os
import pathlib
import pickle
import signal

import numpy as np
import pytest
import tifffile
from helpers import convert, encode, make_class_tree, make_dicom, pixels, write

import schemas
from conversion import plan as _plan, processes as _processes, recovery, shard_maker, shard_writer
from beam_jobs import convert as convert_module
from beam_jobs.convert import ConvertOptions, config_from_options
from conversion.shard_maker import shard_file as _shard_file
from imaging import ValidationOptions

# What a child has imported, asked in the child (eval is pickled by reference).
_HEAVY_MODULES = ("sorted({m.split('.')[0] for m in __import__('sys').modules} "
                  "& {'apache_beam', 'tensorflow', 'grpc'})")


@pytest.fixture(scope="module")
def pool():
    workers = _processes.WorkerProcesses(2)
    yield workers
    workers.close()


def test_calls_run_in_other_processes_and_return_their_values(pool):
    pids = {pool.call(os.getpid) for _ in range(6)}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert pool.call(divmod, 17, 5) == (3, 2)


def test_a_remote_error_is_raised_as_itself_with_the_remote_traceback(pool):
    with pytest.raises(ZeroDivisionError) as info:
        pool.call(divmod, 1, 0)
    remote = str(info.value.__cause__)
    assert remote.startswith("In worker process ") and "ZeroDivisionError" in remote
    assert pool.call(divmod, 9, 2) == (4, 1)  # The child answered: still in use.


def test_an_error_that_does_not_pickle_comes_back_as_its_text(pool):
    # A lambda in the child's answer cannot be pickled back.
    with pytest.raises(RuntimeError, match="PicklingError|pickle"):
        pool.call(eval, "lambda: 0")


def test_a_child_that_dies_is_named_and_replaced():
    workers = _processes.WorkerProcesses(1)
    try:
        pid = workers.call(os.getpid)
        with pytest.raises(_processes.WorkerDied, match=rf"pid {pid}\) exited with status 3 while running _exit"):
            workers.call(os._exit, 3)
        fresh = workers.call(os.getpid)
        assert fresh != pid
        with pytest.raises(_processes.WorkerDied, match=rf"pid {fresh}\) was killed by signal 9"):
            workers.call(os.kill, fresh, signal.SIGKILL)
        assert workers.call(divmod, 7, 7) == (1, 0)  # A fresh child took its place.
    finally:
        workers.close()


def test_a_warm_up_error_is_raised_by_the_first_call_only():
    workers = _processes.WorkerProcesses(1, warm=(divmod, (1, 0)))
    try:
        with pytest.raises(ZeroDivisionError):
            workers.call(divmod, 4, 2)
        assert workers.call(divmod, 4, 2) == (2, 0)
    finally:
        workers.close()


def test_a_call_started_early_runs_once_for_the_call_with_equal_arguments(tmp_path):
    runs = tmp_path / "runs"
    append = f"open({str(runs)!r}, 'a').write('x')"  # Each run in the child appends one x.
    workers = _processes.WorkerProcesses(1)
    try:
        workers.start_early(eval, append)
        workers.start_early(divmod, 1, 0)
        assert workers.call(divmod, 9, 2) == (4, 1)  # Other arguments: a call of its own.
        assert workers.call(eval, append) == 1  # The early call's answer ...
        assert runs.read_text() == "x"  # ... from its one run, not run again.
        with pytest.raises(ZeroDivisionError):  # An early call's error goes to the call that claims it.
            workers.call(divmod, 1, 0)
        assert workers.call(eval, append) == 1 and runs.read_text() == "xx"  # Claimed once: this one runs.
    finally:
        workers.close()


def test_the_driver_starts_the_plans_first_shards_whole():
    files = _plan_of(12, 4).files
    planned = sorted(files, key=lambda f: (f.split, f.shard, f.order))  # The plan's order.
    first = shard_maker.first_shards(planned, 2)
    assert [[(f.shard, f.order) for f in shard] for shard in first] == [
        [(0, 0), (0, 4), (0, 8)], [(1, 1), (1, 5), (1, 9)]]
    assert len(shard_maker.first_shards(planned, 9)) == 4


def test_closing_ends_every_child():
    workers = _processes.WorkerProcesses(2)
    procs = [w._proc for w in workers._workers]
    workers.close()
    assert all(p.poll() is not None for p in procs)
    with pytest.raises(RuntimeError, match="closed"):
        workers.call(os.getpid)


@pytest.mark.parametrize("value", [-1, True, 1.5])
def test_the_writing_options_refuse_a_bad_count(value):
    from conversion.options import WritingOptions

    with pytest.raises(ValueError, match=rf"--worker_processes must be 0 .*Received: {value!r}"):
        WritingOptions(worker_processes=value)


def test_a_bad_count_is_one_clear_sentence(tmp_path, capsys):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a",), per_class=1)
    code = convert_module.main(["--input_dir", str(root), "--output_dir", str(tmp_path / "o"),
                                "--worker_processes", "-2"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "shardsmith convert: error: --worker_processes must be 0 (the runner's own threads) or more "
        "processes. Received: -2")
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the default needs 2 or more cores; checked below")
def test_the_default_is_one_process_per_core_only_for_large_folders_on_the_local_runner():
    # Stated fact this test depends on: this machine has several cores.
    cores = os.cpu_count()
    local = ConvertOptions([])
    from beam_jobs import _runner

    _runner.make_runner(local)
    big = shard_maker._PROCESSES_MIN_FILES
    small = shard_maker._SMALL_FILE_BYTES - 1

    def decide(asked, files, shards, options):  # As the driver asks, on its runner.
        return shard_maker.worker_processes(asked, files, shards, _runner.in_process_threads(options))

    def listed(n, size=small, name="a/{}.jpg"):
        return [_plan.PlannedFile("train", 0, i, name.format(i), "", size, 0, 1) for i in range(n)]

    assert decide(None, listed(big), 16, local) == min(cores, 16)
    assert decide(None, listed(big), None, local) == cores  # Listed, not planned yet.
    assert decide(None, listed(big), 1, local) == 0
    assert decide(None, listed(big - 1), 16, local) == 0
    # Photos whose decodes release the GIL: threads use every core already ...
    for name in ("a/{}.gif", "a/{}.webp", "a/{}.bmp"):
        assert decide(None, listed(big, size=small + 1, name=name), 16, local) == 0
    # ... but JPEG and PNG photos are checked without TensorFlow, partly in Python: processes ...
    for name in ("a/{}.jpg", "a/{}.JPEG", "a/{}.png"):
        assert decide(None, listed(big, size=small + 1, name=name), 16, local) == min(cores, 16)
    # ... as for rasters and DICOM files of any size.
    for name in ("a/{}.tif", "a/{}.TIFF", "a/{}.dcm"):
        assert decide(None, listed(big, size=10**6, name=name), 16, local) == min(cores, 16)
    half = listed(big // 2, size=10**6) + listed(big - big // 2)
    assert decide(None, half, 16, local) == min(cores, 16)
    # Elsewhere the DoFns already run in processes of their own.
    for argv in (["--direct_running_mode", "multi_processing"], ["--runner", "DataflowRunner"]):
        assert decide(None, listed(big), 16, ConvertOptions(argv)) == 0
    # What is asked for is what runs.
    assert decide(0, listed(big), 16, local) == 0
    assert decide(3, listed(10, size=10**6), 1, ConvertOptions(["--runner", "DataflowRunner"])) == 3


def test_worker_processes_load_tensorflows_decoders_ahead_only_where_most_files_need_them():
    def listed(names, size):
        return [_plan.PlannedFile("train", 0, i, name, "", size, 0, 1) for i, name in enumerate(names)]

    photo, tiny = shard_maker._SMALL_FILE_BYTES, shard_maker._SMALL_FILE_BYTES - 1
    # JPEG and PNG photos are checked without TensorFlow: a worker loads it only for a file that needs it.
    assert not shard_maker.needs_decoders(listed(["a/1.jpg", "a/2.JPEG", "a/3.png", "a/4.gif"], photo))
    # Tiny images decode in TensorFlow's batches for a fifth of the check's CPU; other formats need it.
    assert shard_maker.needs_decoders(listed(["a/1.jpg", "a/2.jpg"], tiny))
    assert shard_maker.needs_decoders(listed(["a/1.gif", "a/2.webp", "a/3.jpg"], photo))
    # Rasters stored raw never need it.
    assert not shard_maker.needs_decoders(listed(["a/1.tif", "a/2.TIFF"], photo))
    # Nor do scenes' work items (--raster_patch), JPEG 2000 ones included: patches are cut without it.
    items = [dataclasses.replace(f, patch_rows=f"{256 * i},{256 * i + 256}")
             for i, f in enumerate(listed(["a/t.jp2"] * 3 + ["a/u.j2k"], photo))]
    assert not shard_maker.needs_decoders(items)


def _plan_of(n_files: int, shards: int) -> _plan.Plan:
    files = tuple(_plan.PlannedFile("train", i % shards, i, f"a/{i}.jpg", f"/x/a/{i}.jpg", 1, 0, shards)
                  for i in range(n_files))
    return _plan.Plan(files=files, class_names=("a",), shard_counts={"train": shards}, problems=(),
                      num_found=n_files, split_source="hash")


def test_the_single_core_default_is_threads(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    files = [_plan.PlannedFile("train", 0, i, f"a/{i}.tif", "", 1, 0, 1) for i in range(5000)]
    assert shard_maker.worker_processes(None, files, 16, runner_threads=16) == 0  # Many threads, one core.


def _tiff(array, **kwargs) -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, array, **kwargs)
    return buf.getvalue()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Photos, a reject, a normalised PNG, DICOM and multi-band rasters in three classes."""
    root = tmp_path_factory.mktemp("processes") / "images"
    make_class_tree(root, per_class=10)
    write(root / "cat" / "truncated.jpg", encode(pixels(1), "JPEG")[:200])
    write(root / "fish" / "alpha.png", encode(pixels(2, mode="RGBA"), "PNG"))
    ramp = (np.arange(12 * 10).reshape(12, 10) * 7 - 300).astype(np.int16)
    write(root / "dog" / "ct.dcm", make_dicom(ramp, Modality="CT", WindowCenter=40, WindowWidth=400))
    rng = np.random.default_rng(5)
    for i in range(4):
        write(root / "fish" / f"s2_{i}.tif", _tiff(rng.integers(0, 10000, (16, 16, 13), dtype=np.uint16),
                                                   planarconfig="contig"))
        write(root / "dog" / f"dem_{i}.tif", _tiff(rng.normal(100, 50, (8, 8)).astype(np.float32)))
    return root


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_worker_processes_write_the_bytes_of_the_runners_threads(mixed, tmp_path):
    flags = ("--split", "train=0.7,validation=0.3", "--num_shards", "3", "--seed", "4",
             "--max_reject_fraction", "0.5")
    threads = convert(mixed, tmp_path / "threads", *flags, "--worker_processes", 0)
    processes = convert(mixed, tmp_path / "processes", *flags, "--worker_processes", 2)
    assert processes.counts == threads.counts and processes.counts["rejected"] == 1
    assert processes.normalized == threads.normalized and "store_tiff_as_raw" in processes.normalized
    mine, theirs = _files(tmp_path / "processes"), _files(tmp_path / "threads")
    assert sorted(mine) == sorted(theirs)
    assert [name for name in mine if mine[name] != theirs[name]] == []


def test_a_child_writes_local_rasters_without_beam_or_tensorflow(mixed, tmp_path):
    out = tmp_path / "out"
    options = ConvertOptions(["--input_dir", str(mixed), "--output_dir", str(out), "--num_shards", "1"])
    plan = convert_module.build_plan(config_from_options(options))
    rasters = [f for f in plan.files if f.rel_path.endswith(".tif")]
    job = shard_writer.ShardJob(str(out), "train", 0, 1, "train-00000-of-00001.tfrecord",
                                 tuple(_shard_file(f) for f in rasters), len(plan.class_names),
                                 ValidationOptions(), threads=0)
    workers = _processes.WorkerProcesses(1, warm=(shard_writer.warm_up, (ValidationOptions(), False)))
    try:
        outcome = workers.call(shard_writer.write_shard, job)
        heavy = workers.call(eval, _HEAVY_MODULES)
    finally:
        workers.close()
    assert outcome.result.num_records == len(rasters) == 8 and not outcome.rejects
    assert heavy == []
    # The records are the in-thread writer's, byte for byte.
    in_thread = tmp_path / "in_thread"
    again = shard_writer.write_shard(pickle.loads(pickle.dumps(
        shard_writer.ShardJob(str(in_thread), *[getattr(job, f) for f in
                               ("split", "index", "num_shards", "name", "files", "num_classes",
                                "validation")], threads=2))))
    assert again.result.sha256 == outcome.result.sha256
    assert (in_thread / job.name).read_bytes() == (out / job.name).read_bytes()
    assert list(schemas.tfrecord.iter_records(io.BytesIO((out / job.name).read_bytes())))


def test_a_shard_whose_worker_dies_fails_with_a_sentence_naming_it(tmp_path):
    from conversion.options import WritingOptions
    from beam_jobs._write import WriteShardFn
    from conversion.shard_maker import ShardSpec

    root = tmp_path / "images"
    make_class_tree(root, classes=("a",), per_class=3)
    files = [_plan.PlannedFile("train", 0, i, rel, str(root / rel), 1, 0, 1)
             for i, rel in enumerate(sorted(p.relative_to(root).as_posix() for p in root.rglob("*.*")))]
    fn = WriteShardFn(ShardSpec(str(tmp_path / "out"), ValidationOptions(), WritingOptions(worker_processes=1),
                                num_classes=1, total_shards=1))
    fn.setup()
    try:
        pid = fn._maker.pool.call(os.getpid)
        os.kill(pid, signal.SIGKILL)  # As the kernel's OOM killer would.
        fn.start_bundle()
        with pytest.raises(_processes.WorkerDied) as info:
            list(fn.process((("train", 0), files)))
            list(fn.finish_bundle())
        message = recovery.failure_message(RuntimeError(f"wrapped\n{type(info.value).__name__}: {info.value}"))
        assert message == str(info.value)
        assert f"(pid {pid}) was killed by signal 9" in message
        assert "Shard: train-00000-of-00001.tfrecord (3 files)" in message
        assert "--worker_processes 0" in message
        # The next shard gets a fresh child.
        fn.start_bundle()
        outputs = [*fn.process((("train", 0), files)), *fn.finish_bundle()]
        assert type(outputs[-1].value).__name__ == "ShardResult"
    finally:
        fn.teardown()
