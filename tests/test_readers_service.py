"""The tf.data service on loopback: `shardsmith serve-data` and readers reading through it.

One server for the module: `shardsmith serve-data --workers 2` (a dispatcher
and two worker processes on fixed ports) in a subprocess, started here and
stopped by SIGTERM in the last test. The reads run in child processes
(`_reader_service_child.py`) with timeouts, so that a read the service
leaves waiting fails the test instead of hanging it.
"""

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf

from readers import ReaderConfig, image_dataset_from_tfrecords, make_dataset_fn
from readers.service import ServiceOptions
from shardsmith import cli

import _reader_data as rd

REPO = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "_reader_service_child.py"
START_TIMEOUT = 120  # seconds for serve-data to print its address
READ_TIMEOUT = 150  # seconds for a child's reads


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def _children(pid):
    """Process ids whose parent is `pid` (from /proc)."""
    found = []
    for entry in sorted(os.listdir("/proc")):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class _Server:
    def __init__(self, root):
        self.log = open(root / "serve-data.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shardsmith", "serve-data", "--workers", "2",
             "--worker_timeout", "2", "--cross_trainer_cache_mb", "16"],
            stdout=subprocess.PIPE, stderr=self.log, env=_env(), cwd=REPO,
            start_new_session=True,  # its own process group, killed as a whole if need be
        )
        self.lines = []
        deadline = time.monotonic() + START_TIMEOUT
        os.set_blocking(self.proc.stdout.fileno(), False)
        buffer = ""
        while len(self.lines) < 2:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"serve-data did not start: {self.tail()}")
            try:
                buffer += os.read(self.proc.stdout.fileno(), 4096).decode()
            except BlockingIOError:
                pass
            *done, buffer = buffer.split("\n")
            self.lines += done
            time.sleep(0.1)
        self.address = self.lines[0]

    def tail(self):
        self.log.seek(0)
        return self.log.read()[-3000:]

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    # 24 records in 6 shards: each worker of the static mode gets 3 whole files.
    return rd.write_dataset(tmp_path_factory.mktemp("served"), splits={"train": 24}, num_shards=6)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = _Server(tmp_path_factory.mktemp("serve"))
    try:
        yield server
    finally:
        server.kill()
        server.log.close()


@pytest.fixture(scope="module")
def reads(written, server):
    """The child's reads: static, fit under MirroredStrategy, then dynamic with a
    worker killed after the first batch. Returns (result, the workers' pids
    before, the killed pid)."""
    workers = _children(server.proc.pid)
    killed = []

    def kill_a_worker(line):
        if line == "first batch" and not killed:
            os.kill(workers[1], signal.SIGKILL)
            killed.append(workers[1])

    # oneDNN off as in test_readers_distributed: Keras's Dense and empty per-replica batches.
    result = _child(written, server, on_line=kill_a_worker, env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    print("seconds per part:", result["seconds"])  # shown with -s: where the module's time goes
    return result, workers, killed


def _child(written, server, on_line=None, env=None):
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(written.data_dir), server.address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**_env(), **(env or {})}, cwd=REPO, start_new_session=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + READ_TIMEOUT
        for line in proc.stdout:  # Line by line: `on_line` may act mid-read.
            lines.append(line)
            if on_line:
                on_line(line.strip())
            if time.monotonic() > deadline:
                break
        proc.wait(max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"The reads did not end in {READ_TIMEOUT} s; server log: "
                        f"{server.tail()}")
    assert proc.returncode == 0, proc.stderr.read()[-3000:]
    return json.loads(lines[-1])


def test_serve_data_prints_the_address_and_the_worker_list(server):
    host, port = server.address.removeprefix("grpc://").rsplit(":", 1)
    assert server.address.startswith("grpc://") and host == "localhost" and port.isdigit()
    assert server.lines[1].startswith("workers: ")
    workers = server.lines[1].removeprefix("workers: ").split(",")
    assert len(workers) == 2 and all(w.startswith("localhost:") for w in workers)
    assert len(_children(server.proc.pid)) == 2  # two worker processes


def test_static_sharding_reads_every_record_exactly_once(written, reads):
    result = reads[0]["static"]
    expected = collections.Counter(list(written.by_filename()))
    names = [n for batch in result["batches"] for n in batch]
    assert collections.Counter(names) == expected
    by_name = written.by_filename()
    assert result["labels"] == {n: by_name[n].label for n in names}
    assert result["class_names"] == list(written.class_names)
    assert result["cardinality"] == -2  # unknown: the service's
    # service_compression='snappy' (TensorFlow's own default) reads the same as the default
    # (uncompressed).
    assert result["snappy"]["names"] == sorted(expected)
    assert result["snappy"]["same_pixels"] is True
    # Each worker batches its own 12 records: 3 batches of 4 each.
    assert sorted(len(b) for b in result["batches"]) == [4] * 6
    # Two trainers of one job: each got part, together every record once.
    first, second = result["shared"]
    assert first and second
    assert collections.Counter(first + second) == expected
    # A seed: each worker's stream is the same on every run (files, order,
    # augmentation); only the order the batches arrive in may differ.
    one, two = result["seeded"]
    assert one["batches"] == two["batches"]
    assert collections.Counter(n for b in one["batches"] for n in b) == expected
    assert one["pixels"] == two["pixels"]


def test_dynamic_sharding_survives_a_worker_killed_mid_epoch(written, server, reads):
    result, workers, killed = reads[0]["dynamic"], reads[1], reads[2]
    assert collections.Counter(result["whole"]) == collections.Counter(list(written.by_filename()))
    assert killed
    names = result["names"]
    counts = collections.Counter(names)
    # At most once: no duplicates, nothing from elsewhere; the killed worker's
    # files in flight may be missing.
    assert max(counts.values()) == 1
    assert set(counts) <= set(written.by_filename()) and len(names) >= 2
    # The server started the lost worker again, on its port.
    deadline = time.monotonic() + 30
    while len(_children(server.proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    now = _children(server.proc.pid)
    assert len(now) == 2 and workers[1] not in now and workers[0] in now


def test_trials_of_a_sweep_each_get_every_batch(written, reads):
    # Two trainers, one job name, a trainer id each, read in turns. Each batch
    # comes from one worker's stream (static: worker i reads shards i, i+2,
    # i+4); the trainer interleaves the two workers' streams at its own pace,
    # so per worker both trainers must have got the same batches, in the same
    # order (from the workers' cross-trainer cache), and each every record.
    by_name = written.by_filename()
    streams = []
    for batches in reads[0]["sweep"]["batches"]:
        assert batches and all(len(b) == 2 for b in batches)
        assert set(n for b in batches for n in b) == set(by_name)  # every record, each trial
        per_worker = collections.defaultdict(list)
        for batch in batches:
            (worker,) = {by_name[n].shard % 2 for n in batch}  # one worker's batch
            per_worker[worker].append(batch)
        streams.append(per_worker)
    first, second = streams
    assert sorted(first) == sorted(second) == [0, 1]
    for worker in (0, 1):
        common = min(len(first[worker]), len(second[worker]))
        assert common >= 6  # a whole pass over the worker's 12 records
        assert first[worker][:common] == second[worker][:common]


def test_model_fit_under_mirrored_strategy_trains_from_the_service(written, reads):
    result = reads[0]["fit"]
    assert result["replicas"] == 2
    assert collections.Counter(result["names"]) == collections.Counter(list(written.by_filename()))
    assert result["fit_steps"] == 6  # 24 records, per-replica batches of 2 from each worker
    (loss,) = result["fit_loss"]
    assert loss == loss and 0 < loss < 10  # finite


def test_refused_combinations_name_the_options(written):
    service = "grpc://localhost:5050"  # refused before any connection
    for options, named in [
        ({"shuffle": "global", "seed": 1}, "shuffle='global', service="),
        ({"max_bad_records": 2}, "max_bad_records=2, service="),
        ({"cache": True}, "cache=True, service="),
        ({"deterministic": True}, "deterministic=True, service="),
    ]:
        with pytest.raises(ValueError, match="cannot hold with `service`") as e:
            image_dataset_from_tfrecords(written.data_dir, service=service, **options)
        assert named in str(e.value)
    with pytest.raises(ValueError, match=r"`service_sharding` must be one of \('static', 'dynamic'\)"
                                         r". Received: service_sharding='files'"):
        ReaderConfig(service=service, service_sharding="files")
    with pytest.raises(ValueError, match="apply with a `service` only"):
        ReaderConfig(service_sharding="dynamic")
    with pytest.raises(ValueError, match=r"apply with a `service` only.*"
                                         r"service_compression='snappy'"):
        ReaderConfig(service_compression="snappy")
    with pytest.raises(ValueError, match=r"`service_compression` must be one of \(None, 'snappy'\)"
                                         r". Received: service_compression='AUTO'"):
        ReaderConfig(service=service, service_compression="AUTO")
    with pytest.raises(ValueError, match=r"`service` must be the dispatcher's address"):
        ReaderConfig(service="localhost")
    # The trials of a sweep: a job name and an endless read.
    with pytest.raises(ValueError, match=r"`service_trainer_id` needs repeat=True") as e:
        image_dataset_from_tfrecords(written.data_dir, service=service, service_job_name="sweep",
                                     service_trainer_id="trial-1")
    assert "Received: service_trainer_id='trial-1', repeat=False" in str(e.value)
    with pytest.raises(ValueError, match=r"needs the job's `service_job_name`.*Received: "
                                         r"service_trainer_id='trial-1', service_job_name=None"):
        ReaderConfig(service=service, repeat=True, service_trainer_id="trial-1")
    with pytest.raises(ValueError, match=r"`service_trainer_id` must be a non-empty string or "
                                         r"None. Received: service_trainer_id=''"):
        ReaderConfig(service=service, repeat=True, service_job_name="sweep", service_trainer_id="")
    with pytest.raises(ValueError, match=r"apply with a `service` only.*"
                                         r"service_trainer_id='trial-1'"):
        ReaderConfig(repeat=True, service_job_name="sweep", service_trainer_id="trial-1")
    # Two input pipelines (a multi-worker strategy) without a job name would each read it all.
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0)
    fn = make_dataset_fn(written.data_dir, global_batch_size=4, service=service)
    with pytest.raises(ValueError, match="2 input pipelines needs a `service_job_name`"):
        fn(context)


def test_serve_data_options_name_the_flag(capsys):
    assert cli.main(["serve-data", "--workers", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--workers must be an integer in 0-256. Received: --workers=-1" in err
    assert cli.main(["serve-data", "--dispatcher", "host:5050", "--workers", "2"]) == 2
    assert "--dispatcher='host:5050', --workers=2" in capsys.readouterr().err
    assert cli.main(["serve-data", "--workers", "2", "--worker_port", "70000"]) == 2
    assert ("--worker_port must be a port number in 0-65535 (0: a free one from the system). "
            "Received: --worker_port=70000") in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"`dispatcher` must be an address HOST:PORT"):
        ServiceOptions(dispatcher="nohost")
    assert cli.main(["serve-data", "--workers", "2", "--cross_trainer_cache_mb", "0"]) == 2
    assert ("--cross_trainer_cache_mb must be an integer in 1-1048576 (MiB per worker) or None. "
            "Received: --cross_trainer_cache_mb=0") in capsys.readouterr().err
    assert cli.main(["serve-data", "--cross_trainer_cache_mb", "64"]) == 2  # no worker to size
    assert ("Received: --cross_trainer_cache_mb=64, --workers=0, --dispatcher=None"
            in capsys.readouterr().err)
    assert cli.main(["serve-data", "--help"]) == 0
    out = capsys.readouterr().out
    assert "shardsmith serve-data --port 5050 --workers 2" in out
    assert "RAM per worker per such job" in " ".join(out.split())


def test_serve_data_stops_on_sigterm_with_its_workers(server):
    workers = _children(server.proc.pid)
    assert len(workers) == 2
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0
    deadline = time.monotonic() + 20
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(w) for w in workers)  # no orphans
