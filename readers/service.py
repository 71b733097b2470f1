"""The tf.data service: a reader's input pipeline run by other processes and hosts.

A dispatcher hands out the work; worker servers, on this host or others, run
the whole input pipeline (read, parse, decode, augment, batch) and trainers
read the finished batches over gRPC (`image_dataset_from_tfrecords(...,
service="grpc://HOST:PORT")`). `serve` starts a dispatcher, a worker that
joins one, or a dispatcher with local worker processes, and keeps them until
SIGTERM or Ctrl-C (`shardsmith serve-data` is the command). `distribute` is
what the reader applies to its pipeline.

Sharding (`service_sharding`):

- 'static' (`ShardingPolicy.FILE`): worker i of the dispatcher's fixed
  worker list reads shard files i, i+N, ... (TensorFlow's auto-shard rewrite,
  applied on each worker, puts the shard before the file shuffle), so every
  record comes exactly once per epoch. The dispatcher must know the worker
  addresses in advance, hence `--workers N` on fixed ports, or a list of
  `--worker_addresses`.
- 'dynamic' (`ShardingPolicy.DYNAMIC`): the dispatcher hands shard files
  out one at a time to whichever worker asks; workers may join at any time;
  a record is read at most once, and a worker lost mid-epoch loses the files
  it held (never duplicated). Measured with TensorFlow 2.21: a job whose
  worker died waits until a worker answers at that address again, which is
  why the local workers of `--workers N` are restarted on their port.

Sharing a job (`service_job_name`, `service_trainer_id`):

- Without a job name, each reader has a job of its own: the whole split.
- Readers that name one job split its batches, each batch going to one of
  them: the input pipelines of one trainer on several hosts.
- Readers that name one job and each pass their own trainer id (the trials
  of a hyper-parameter sweep) each get every batch: TensorFlow's
  cross-trainer cache. Each worker keeps the batches it made in a sliding
  window of `cross_trainer_cache_mb`; the fastest trainer makes the workers
  read and decode on, the others read the batches from the window. A trainer
  that falls further behind than the window skips ahead to its oldest batch
  (TensorFlow's `CrossTrainerCache`: it does not stall the others), and one
  that joins late starts there too. TensorFlow needs the read to repeat
  forever (`repeat=True`; an epoch has no end to agree on) and refuses a
  second iteration of one dataset object, or a reader of the job without a
  trainer id. Readers that pass the same trainer id split that trainer's
  batches (the input pipelines of one trial). Measured with TensorFlow 2.21:
  both sharding modes work (the workers' own streams are cached; 'static'
  still reads every file once per pass, on one worker).

Importing this module starts nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import tensorflow as tf

from compat import tf_internals

__all__ = ["SHARDING_MODES", "DEFAULT_CROSS_TRAINER_CACHE_MB", "ServiceOptions",
           "RunningService", "start", "serve", "distribute"]

logger = logging.getLogger(__name__)

SHARDING_MODES = ("static", "dynamic")
# A worker's cross-trainer cache per job, in MiB, when `cross_trainer_cache_mb`
# is not given: room for ~95 batches of 64 uint8 photos at 224x224 (24 of
# float32; TensorFlow counts ~1.17x the pixel bytes, measured) of lag between
# the trials of a sweep, where TensorFlow's own default (10 GiB) times the
# workers of one host would exhaust most hosts.
DEFAULT_CROSS_TRAINER_CACHE_MB = 1024
# How long `start` waits for the local workers to register with the dispatcher.
_WORKERS_UP_TIMEOUT_S = 120.0
# How long a stopped worker process gets to end before it is killed.
_STOP_GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _split_address(name: str, value) -> tuple[str, int]:
    """(host, port) of 'HOST:PORT' or 'grpc://HOST:PORT'."""
    text = value[len("grpc://"):] if isinstance(value, str) and value.startswith("grpc://") else value
    host, sep, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536 and " " not in host):
        raise ValueError(
            f"`{name}` must be an address HOST:PORT (or grpc://HOST:PORT), e.g. "
            f"localhost:5050. Received: {name}={value!r}"
        )
    return host, int(port)


def _check_port(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536:
        raise ValueError(
            f"`{name}` must be a port number in 0-65535 (0: a free one from the "
            f"system). Received: {name}={value!r}"
        )


@dataclasses.dataclass(frozen=True)
class ServiceOptions:
    """What `serve` starts; validated on construction.

    Attributes:
      port: The dispatcher's port, or with `dispatcher` the worker's own
        port. 0: a free port from the system.
      dispatcher: HOST:PORT of a running dispatcher: start a worker that
        joins it instead of a dispatcher.
      workers: With no `dispatcher`: also start this many worker processes on
        this host, on fixed ports (`worker_port`, `worker_port`+1, ...), listed
        with the dispatcher so that static sharding works.
      worker_port: The first local worker's port; 0: free ports from the
        system (still fixed before the dispatcher starts).
      worker_addresses: The dispatcher's fixed worker list for static
        sharding when the workers run on other hosts (each started with
        `dispatcher`, `port` and `host` matching its entry). Empty: any
        worker may join, static sharding refused.
      host: The name other hosts reach this one by: in the printed address and
        in the address a worker registers with.
      worker_timeout: Seconds without a heartbeat after which the dispatcher
        drops a worker (a worker sends one every quarter of it).
      cross_trainer_cache_mb: MiB of memory each worker may hold for every
        job that trainers share with trainer ids (`service_trainer_id`): the
        window of batches a trainer may lag behind the fastest before it
        skips ahead; it must hold at least one batch. None:
        `DEFAULT_CROSS_TRAINER_CACHE_MB`. For the workers this starts (local
        ones, or this one with `dispatcher`).
    """

    port: int = 0
    dispatcher: str | None = None
    workers: int = 0
    worker_port: int = 0
    worker_addresses: tuple[str, ...] = ()
    host: str = "localhost"
    worker_timeout: float = 20.0
    cross_trainer_cache_mb: int | None = None

    def __post_init__(self):
        _check_port("port", self.port)
        _check_port("worker_port", self.worker_port)
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not (
                0 <= self.workers <= 256):
            raise ValueError(
                f"`workers` must be an integer in 0-256. Received: workers={self.workers!r}"
            )
        if not isinstance(self.host, str) or not self.host or any(c in self.host for c in ": /"):
            raise ValueError(
                "`host` must be a host name or IP address (no port), e.g. localhost. "
                f"Received: host={self.host!r}"
            )
        if isinstance(self.worker_timeout, bool) or not isinstance(
                self.worker_timeout, (int, float)) or not self.worker_timeout > 0:
            raise ValueError(
                "`worker_timeout` must be a positive number of seconds. "
                f"Received: worker_timeout={self.worker_timeout!r}"
            )
        cache_mb = self.cross_trainer_cache_mb
        if cache_mb is not None and (isinstance(cache_mb, bool) or not isinstance(cache_mb, int)
                                     or not 1 <= cache_mb <= 1 << 20):
            raise ValueError(
                "`cross_trainer_cache_mb` must be an integer in 1-1048576 (MiB per worker) or "
                f"None. Received: cross_trainer_cache_mb={cache_mb!r}"
            )
        if cache_mb is not None and self.dispatcher is None and not self.workers:
            raise ValueError(
                "`cross_trainer_cache_mb` sizes the cache of the workers this starts: local "
                "`workers`, or a worker joining `dispatcher` (workers on other hosts take it "
                "there). Received: "
                f"cross_trainer_cache_mb={cache_mb!r}, workers=0, dispatcher=None"
            )
        if isinstance(self.worker_addresses, str):
            object.__setattr__(self, "worker_addresses", tuple(
                a for a in self.worker_addresses.split(",") if a))
        object.__setattr__(self, "worker_addresses", tuple(self.worker_addresses))
        for address in self.worker_addresses:
            _split_address("worker_addresses", address)
        if self.dispatcher is not None:
            _split_address("dispatcher", self.dispatcher)
            if self.workers or self.worker_addresses or self.worker_port:
                raise ValueError(
                    "`workers`, `worker_port` and `worker_addresses` set up a new dispatcher; "
                    "a worker joining `dispatcher` takes none of them. Received: "
                    f"dispatcher={self.dispatcher!r}, workers={self.workers!r}, "
                    f"worker_port={self.worker_port!r}, worker_addresses={self.worker_addresses!r}"
                )
        if self.workers and self.worker_addresses:
            raise ValueError(
                "`workers` lists its own local workers; `worker_addresses` lists workers on "
                "other hosts: pass one of them. Received: "
                f"workers={self.workers!r}, worker_addresses={self.worker_addresses!r}"
            )
        if self.worker_port and not self.workers:
            raise ValueError(
                "`worker_port` applies to the local workers of `workers`. Received: "
                f"worker_port={self.worker_port!r}, workers={self.workers!r}"
            )
        if self.worker_port and not (
                self.worker_port + self.workers <= 65536
                and not self.worker_port <= self.port < self.worker_port + self.workers):
            raise ValueError(
                f"`worker_port` must leave {self.workers} ports up to 65535, not counting "
                f"the dispatcher's `port`. Received: worker_port={self.worker_port!r}, "
                f"workers={self.workers!r}, port={self.port!r}"
            )

    @property
    def role(self) -> str:
        """'worker' (joins `dispatcher`) or 'dispatcher'."""
        return "worker" if self.dispatcher is not None else "dispatcher"

    @property
    def heartbeat_ms(self) -> int:
        return max(100, int(self.worker_timeout * 1000 / 4))

    @property
    def cross_trainer_cache_bytes(self) -> int:
        mb = self.cross_trainer_cache_mb
        return (DEFAULT_CROSS_TRAINER_CACHE_MB if mb is None else mb) << 20


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _grpc(address: str) -> str:
    return address if address.startswith("grpc://") else f"grpc://{address}"


def _worker_server(options: ServiceOptions):
    service = tf.data.experimental.service
    return tf_internals.data_service_worker(service.WorkerConfig(
        dispatcher_address=options.dispatcher.removeprefix("grpc://"),
        worker_address=f"{options.host}:%port%", port=options.port,
        heartbeat_interval_ms=options.heartbeat_ms,
    ), options.cross_trainer_cache_bytes)


@dataclasses.dataclass
class RunningService:
    """Servers started by `start`; `stop` ends them and the worker processes.

    Attributes:
      address: The address trainers read from, grpc://HOST:PORT (the
        dispatcher's, also for a lone worker).
      worker_addresses: The dispatcher's fixed worker list (static sharding),
        or () when any worker may join.
      worker_pids: Process ids of the local worker processes, in the order of
        `worker_addresses`.
    """

    address: str
    worker_addresses: tuple[str, ...]
    _options: ServiceOptions
    _servers: list = dataclasses.field(default_factory=list)
    _procs: list = dataclasses.field(default_factory=list)
    _ports: list = dataclasses.field(default_factory=list)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    _stopped: bool = False

    @property
    def worker_pids(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(p.pid for p in self._procs)

    def restart_lost_workers(self) -> list[int]:
        """Starts again, on its port, every local worker process that ended; their indices.

        A dynamic job whose worker died waits for a worker at that address
        (see the module docstring).
        """
        restarted = []
        with self._lock:
            if self._stopped:
                return restarted
            for i, proc in enumerate(self._procs):
                if proc.poll() is not None:
                    logger.warning("Worker %s ended (exit status %s): starting it again.",
                                   self.worker_addresses[i], proc.returncode)
                    self._procs[i] = _spawn_worker(self.address, self._ports[i], self._options)
                    restarted.append(i)
        return restarted

    def stop(self) -> None:
        """Stops the worker processes (SIGTERM, then SIGKILL after a grace) and the servers."""
        with self._lock:
            self._stopped = True
            procs, self._procs = self._procs, []
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + _STOP_GRACE_S
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for server in reversed(self._servers):
            tf_internals.stop_data_service_server(server)
        self._servers.clear()


def _spawn_worker(dispatcher: str, port: int, options: ServiceOptions) -> subprocess.Popen:
    """A worker process on `port`, in its own session (a terminal's Ctrl-C reaches
    the parent, which stops it), ended by the kernel if the parent dies."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    # TensorFlow's C++ INFO lines (the worker's whole config) off, unless asked for.
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    args = [dispatcher, str(port), options.host, str(options.heartbeat_ms), str(os.getpid()),
            str(options.cross_trainer_cache_bytes)]
    proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER_PROGRAM, *args],
        env=env, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    logger.info("Worker %s:%d started (pid %d).", options.host, port, proc.pid)
    return proc


def start(options: ServiceOptions) -> RunningService:
    """Starts the servers `options` describe and returns once they serve.

    With local `workers`, returns once every one has registered with the
    dispatcher.

    Raises:
      RuntimeError: If a local worker process ends or does not register in
        time.
    """
    service = tf.data.experimental.service
    if options.role == "worker":
        worker = _worker_server(options)
        return RunningService(address=_grpc(options.dispatcher), worker_addresses=(),
                              _options=options, _servers=[worker])
    ports = []
    if options.workers:
        ports = (list(range(options.worker_port, options.worker_port + options.workers))
                 if options.worker_port else _free_ports(options.workers))
    addresses = tuple(f"{options.host}:{p}" for p in ports) or options.worker_addresses
    timeout_ms = int(options.worker_timeout * 1000)
    dispatcher = service.DispatchServer(service.DispatcherConfig(
        port=options.port, worker_addresses=list(addresses) or None,
        worker_timeout_ms=timeout_ms,
        # Also how often lost workers are looked for (TensorFlow's default: 10 minutes).
        job_gc_check_interval_ms=max(100, timeout_ms // 2),
    ))
    port = int(dispatcher.target.rsplit(":", 1)[1])
    running = RunningService(address=f"grpc://{options.host}:{port}",
                             worker_addresses=addresses, _options=options,
                             _servers=[dispatcher], _ports=ports)
    try:
        for p in ports:
            running._procs.append(_spawn_worker(running.address, p, options))
        deadline = time.monotonic() + _WORKERS_UP_TIMEOUT_S
        while ports and tf_internals.data_service_worker_count(dispatcher) < len(ports):
            ended = [a for a, p in zip(addresses, running._procs) if p.poll() is not None]
            if ended or time.monotonic() > deadline:
                raise RuntimeError(
                    f"Local workers {ended or list(addresses)} "
                    + ("ended before they registered." if ended else
                       f"did not register within {_WORKERS_UP_TIMEOUT_S:.0f} s.")
                )
            time.sleep(0.1)
    except BaseException:
        running.stop()
        raise
    return running


def serve(options: ServiceOptions, announce: Callable[[str], None] = logger.info) -> int:
    """Runs the servers of `options` until SIGTERM or SIGINT (Ctrl-C), then stops them.

    Once everything serves, `announce`s the address trainers read from
    (grpc://HOST:PORT) as a line of its own, then, if the dispatcher has a
    fixed worker list, 'workers: HOST:PORT,...'. Local worker processes that
    end are started again on their port. Must run in the main thread (signal
    handlers).

    Returns:
      0 once stopped.
    """
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        running = start(options)
        try:
            announce(running.address)
            if running.worker_addresses:
                announce("workers: " + ",".join(running.worker_addresses))
            if options.role == "worker":
                logger.info("Worker serving %s.", running.address)
            while not stop.wait(0.5):
                running.restart_lost_workers()
        finally:
            running.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    logger.info("Stopped.")
    return 0


# A local worker process of `start`: argv DISPATCHER PORT HOST HEARTBEAT_MS PARENT_PID
# CACHE_BYTES.
# TensorFlow and `compat` only (not the `readers` package: a worker runs
# graphs, no shardsmith Python), so it starts sooner. It asks the kernel for
# SIGTERM when its parent dies (Linux), so that no worker outlives its parent.
_WORKER_PROGRAM = """
import os, signal, sys, threading
dispatcher, port, host, heartbeat_ms, parent, cache_bytes = sys.argv[1:7]
stop = threading.Event()
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None).prctl(%d, signal.SIGTERM)
if os.getppid() != int(parent):
    sys.exit(0)
import tensorflow as tf
from compat import tf_internals
service = tf.data.experimental.service
worker = tf_internals.data_service_worker(service.WorkerConfig(
    dispatcher_address=dispatcher.removeprefix("grpc://"), worker_address=host + ":%%port%%",
    port=int(port), heartbeat_interval_ms=int(heartbeat_ms)), int(cache_bytes))
while not stop.wait(0.5):
    pass
tf_internals.stop_data_service_server(worker)
""" % _PR_SET_PDEATHSIG


def distribute(ds: tf.data.Dataset, service: str, sharding: str,
               job_name: str | None, trainer_id: str | None = None,
               compression: str | None = None) -> tf.data.Dataset:
    """`ds` run by the tf.data service at `service`, read back here.

    Args:
      ds: The finished input pipeline (its options included); with a
        `trainer_id`, repeated forever.
      service: grpc://HOST:PORT of the dispatcher.
      sharding: 'static' (`ShardingPolicy.FILE`) or 'dynamic' (`DYNAMIC`).
      job_name: Trainers reading one job by name share its elements; None: a
        job of this dataset alone.
      trainer_id: With `job_name`: this trainer gets every element of the
        job, from the workers' cross-trainer cache (see the module
        docstring); readers with the same id split theirs.
      compression: None, or 'snappy': compressed by the workers,
        uncompressed here. None by default, where TensorFlow's default
        ("AUTO") is snappy: decoded photo batches compress 1.01-1.02x, so
        snappy cost every worker ~8% of its images/s and the trainer ~30%
        more CPU, for no fewer bytes (`bench.service`, 224x224 uint8).
    """
    service_api = tf.data.experimental.service
    policy = service_api.ShardingPolicy
    mode = policy.FILE if sharding == "static" else policy.DYNAMIC
    cache = service_api.CrossTrainerCache(trainer_id) if trainer_id is not None else None
    return ds.apply(service_api.distribute(
        processing_mode=mode, service=_grpc(service), job_name=job_name,
        cross_trainer_cache=cache,
        compression="SNAPPY" if compression == "snappy" else None,
    ))
