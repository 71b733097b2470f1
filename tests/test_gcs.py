"""gs:// in and out: a conversion from a bucket into a bucket, on a local GCS emulator.

The emulator (`gcp-storage-emulator`, from PyPI) listens on 127.0.0.1 only.
Beam's GCS file system uses google-cloud-storage, which sends every request
to `STORAGE_EMULATOR_HOST` when that is set. The conversion and the verify
pipeline run as the commands users type (their `main`, one child process for a
test's consecutive commands), in child processes whose environment
points at the emulator and turns off Google's credential discovery (no
metadata-server probe leaves this machine).

TensorFlow's own gs:// support does not read STORAGE_EMULATOR_HOST, so
`readers` (tf.io.gfile / TFRecordDataset) cannot read the bucket here; the
records are checked with `beam_jobs.verify`, which reads through Beam's
FileSystems, and byte for byte against a local conversion of the same images.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage  # With gcp-storage-emulator, in the test extra.

from helpers import convert, encode, make_class_tree, pixels, write

import schemas

_REPO = pathlib.Path(__file__).resolve().parent.parent
_BUCKET = "shardsmith-test"
_ARGS = ("--split", "train=0.6,validation=0.4", "--seed", "3", "--max_reject_fraction", "0.5")
_START_TIMEOUT_S = 60
_RUN_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """The emulator's http://127.0.0.1:PORT; stopped (its process group killed) after."""
    base = tmp_path_factory.mktemp("gcs")
    script = pathlib.Path(sys.executable).with_name("gcp-storage-emulator")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "gcp_storage_emulator"]
    port = _free_port()
    log = open(base / "emulator.log", "wb")
    proc = subprocess.Popen(
        [*command, "--data-dir", str(base / "data"), "start", "--host", "127.0.0.1",
         "--port", str(port), "--quiet"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("gcp-storage-emulator did not start:\n"
                            + (base / "emulator.log").read_text(errors="replace")[-2000:])
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def bucket(emulator):
    client = storage.Client(
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator}
    )
    return client.create_bucket(_BUCKET)


@pytest.fixture(scope="module")
def child_env(emulator, tmp_path_factory) -> dict[str, str]:
    """A child's environment: Beam's GCS client on the emulator, no Google servers.

    Without credentials Beam retries Google's credential lookup for half a
    minute before it connects anonymously; a user credential whose token is
    still valid is taken at once and never refreshed (were it refreshed, the
    request would go to the emulator). The emulator ignores the token.
    """
    credentials = tmp_path_factory.mktemp("auth") / "credentials.json"
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    credentials.write_text(json.dumps({
        "type": "authorized_user", "client_id": "shardsmith-test", "client_secret": "unused",
        "refresh_token": "unused", "token": "emulator-ignores-it",
        "expiry": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"), "token_uri": f"{emulator}/token",
    }))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_"))}
    env.update(
        STORAGE_EMULATOR_HOST=emulator,
        GOOGLE_APPLICATION_CREDENTIALS=str(credentials),
        GOOGLE_CLOUD_PROJECT="shardsmith-test",
        NO_GCE_CHECK="true",  # google-auth: never probe the GCE metadata server,
        GCE_METADATA_HOST="127.0.0.1:9", GCE_METADATA_IP="127.0.0.1:9",  # and if, here.
        CLOUDSDK_CONFIG=str(credentials.parent),  # Not this machine's gcloud settings.
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=str(_REPO),
    )
    return env


# Commands run one after the other in one child, each through its `main` (what `python -m` runs):
# a child imports Beam and TensorFlow, seconds of CPU, once for all of them. Stops at the first
# that fails, with its exit status.
_COMMANDS_CHILD = """
import importlib, json, sys
from conversion import console
for module, argv in json.loads(sys.argv[1]):
    code = importlib.import_module(module).main(argv)
    if code:
        print(f"{module} exited {code}", file=sys.stderr)
        console.exit_program(code)
console.exit_program(0)
"""


def _run(env: dict[str, str], *commands: tuple[str, ...]) -> subprocess.CompletedProcess:
    """Runs `commands` ((module, *args) each) in one child process; all must exit 0."""
    steps = json.dumps([(module, list(args)) for module, *args in commands])
    result = subprocess.run(
        [sys.executable, "-c", _COMMANDS_CHILD, steps], env=env, cwd=str(_REPO),
        capture_output=True, text=True, timeout=_RUN_TIMEOUT_S, stdin=subprocess.DEVNULL,
    )
    names = [module for module, *_ in commands]
    assert result.returncode == 0, f"{names} failed ({result.returncode}):\n{result.stderr[-4000:]}"
    return result


def _objects(bucket, prefix: str) -> dict[str, bytes]:
    return {
        blob.name[len(prefix):]: blob.download_as_bytes()
        for blob in bucket.client.list_blobs(bucket, prefix=prefix)
    }


def test_convert_bucket_to_bucket_and_verify(child_env, bucket, tmp_path):
    images = tmp_path / "images"
    make_class_tree(images, per_class=6)
    write(images / "cat" / "truncated.jpg", encode(pixels(1), "JPEG")[:200])
    write(images / "dog" / ".DS_Store", b"\0" * 16)
    write(images / "fish" / "alpha.png", encode(pixels(2, mode="RGBA"), "PNG"))
    for path in sorted(p for p in images.rglob("*") if p.is_file()):
        bucket.blob(f"images/{path.relative_to(images).as_posix()}").upload_from_filename(str(path))
    # What an earlier, interrupted conversion leaves in the output: a stale
    # shard, and temporary files under a "folder" that is only a name prefix.
    bucket.blob("out/train-00000-of-00099.tfrecord").upload_from_string(b"stale")
    bucket.blob("out/_shardsmith_tmp/done/train-00000-of-00099.tfrecord.json").upload_from_string(b"{}")
    bucket.blob("out/_shardsmith_tmp/train-00000-of-00099.tfrecord.1234").upload_from_string(b"x")

    result = _run(child_env, ("beam_jobs.convert", "--input_dir", f"gs://{_BUCKET}/images",
                              "--output_dir", f"gs://{_BUCKET}/out", "--overwrite", *_ARGS),
                  ("beam_jobs.verify", f"gs://{_BUCKET}/out"))

    # The same bytes as a conversion of the same images on local disk, and
    # nothing else in the output (but verify's report): no stale shard, no temporary objects.
    local_out = tmp_path / "local"
    manifest = convert(images, local_out, *_ARGS)
    local = {str(p.relative_to(local_out)): p.read_bytes() for p in local_out.rglob("*") if p.is_file()}
    remote = _objects(bucket, "out/")
    assert schemas.VERIFY_REPORT_FILENAME not in local
    assert sorted(remote) == sorted([*local, schemas.VERIFY_REPORT_FILENAME])
    assert [name for name in local if remote[name] != local[name]] == []
    assert manifest.counts == {"found": 21, "written": 19, "rejected": 1, "skipped": 1}

    assert "OK: 19 records" in result.stderr + result.stdout
    report = json.loads(bucket.blob(f"out/{schemas.VERIFY_REPORT_FILENAME}").download_as_bytes())
    assert report["ok"] and report["records"] == 19, report["problems"]


_LOCK_CHILD = """
import sys
from conversion.lock import LockError, OutputLock, read_lock
url = sys.argv[1]
with OutputLock(url, command="first"):
    assert read_lock(url)["command"] == "first", read_lock(url)
    try:
        OutputLock(url, command="second").acquire()
    except LockError as e:
        print("refused:", e)
assert read_lock(url) is None
print("released")
"""


def test_output_lock_on_a_bucket(child_env, bucket):
    """conversion.lock on gs://: a second writer is refused while the lock object exists."""
    result = subprocess.run(
        [sys.executable, "-c", _LOCK_CHILD, f"gs://{_BUCKET}/locked"], env=child_env,
        cwd=str(_REPO), capture_output=True, text=True, timeout=_RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "refused:" in result.stdout and "being written by process" in result.stdout
    assert result.stdout.rstrip().endswith("released")
    assert not _objects(bucket, "locked/")


def test_append_bucket_to_bucket(child_env, bucket, tmp_path):
    """convert --append on gs://: old objects untouched (bytes and generation), a new version verified."""
    images = tmp_path / "images"
    make_class_tree(images, classes=("cat", "dog"), per_class=5)

    def upload():
        for path in sorted(p for p in images.rglob("*") if p.is_file()):
            blob = bucket.blob(f"grow_in/{path.relative_to(images).as_posix()}")
            if not blob.exists():
                blob.upload_from_filename(str(path))

    upload()
    argv = ("--input_dir", f"gs://{_BUCKET}/grow_in", "--output_dir", f"gs://{_BUCKET}/grow_out", "--append", *_ARGS)
    _run(child_env, ("beam_jobs.convert", *argv))
    before = {b.name: (b.download_as_bytes(), b.generation) for b in bucket.client.list_blobs(bucket, prefix="grow_out/")
              if schemas.manifest.SHARD_FILENAME_RE.match(b.name.rsplit("/", 1)[-1])}
    assert before
    for i in range(4):
        write(images / "eel" / f"e_{i}.jpg", encode(pixels(60 + i), "JPEG", quality=90))
    upload()
    result = _run(child_env, ("beam_jobs.convert", *argv), ("beam_jobs.verify", f"gs://{_BUCKET}/grow_out"))
    after = {b.name: (b.download_as_bytes(), b.generation) for b in bucket.client.list_blobs(bucket, prefix="grow_out/")}
    assert {n: after[n] for n in before} == before
    manifest = schemas.Manifest.from_json(after["grow_out/manifest.json"][0].decode())
    assert manifest.latest_version == 2 and manifest.class_names == ("cat", "dog", "eel")
    assert manifest.versions[1].inputs["new"] == 4 and manifest.versions[1].inputs["held"] == 10
    assert "grow_out/_shardsmith.lock" not in after and "grow_out/inputs-v00002.jsonl" in after
    assert "OK: 14 records" in result.stdout + result.stderr and "Versions (convert --append): 1 (" in result.stdout


def test_a_rasters_sidecars_are_read_from_a_bucket_as_from_disk(child_env, bucket, tmp_path):
    """A plain TIFF with a world file, a PAM file (nodata, SRS) and an external mask, in a bucket:
    the same records, manifest and normalized.jsonl as from local disk, where they are read."""
    import numpy as np
    import tifffile

    images = tmp_path / "images"
    rng = np.random.default_rng(5)
    for i in range(2):
        array = rng.integers(10, 4000, (12, 10, 2), dtype=np.uint16)
        array[:3] = 7
        write(images / "fields" / f"s{i}.tif", b"")
        tifffile.imwrite(images / "fields" / f"s{i}.tif", array, photometric="minisblack", planarconfig="contig")
        write(images / "fields" / f"s{i}.tfw", f"10\n0\n0\n-10\n{500005 + i}\n3999995\n".encode())
        write(images / "fields" / f"s{i}.tif.aux.xml",
              b'<PAMDataset><SRS>EPSG:32633</SRS><PAMRasterBand band="1"><NoDataValue>7</NoDataValue>'
              b'</PAMRasterBand><PAMRasterBand band="2"><NoDataValue>7</NoDataValue></PAMRasterBand></PAMDataset>')
        tifffile.imwrite(images / "fields" / f"s{i}.tif.msk", np.where(np.arange(10) < 2, 0, 255).astype(np.uint8)
                         [None, :].repeat(12, 0))
    for path in sorted(p for p in images.rglob("*") if p.is_file()):
        bucket.blob(f"geo_in/{path.relative_to(images).as_posix()}").upload_from_filename(str(path))
    args = ("--raster_georef", "--seed", "3")
    _run(child_env, ("beam_jobs.convert", "--input_dir", f"gs://{_BUCKET}/geo_in",
                     "--output_dir", f"gs://{_BUCKET}/geo_out", *args),
         ("beam_jobs.verify", f"gs://{_BUCKET}/geo_out"))
    local_out = tmp_path / "local"
    manifest = convert(images, local_out, *args)
    local = {str(p.relative_to(local_out)): p.read_bytes() for p in local_out.rglob("*") if p.is_file()}
    remote = _objects(bucket, "geo_out/")
    assert [name for name in local if remote[name] != local[name]] == []
    # Read there: 3 rows of nodata and 2 masked columns of each 12x10 raster left out, the world file's origin.
    assert manifest.splits["train"].band_stats.nodata == (2 * (30 + 24 - 6),) * 2
    normalized = local[schemas.NORMALIZED_FILENAME].decode()
    assert '"sidecars": ["s0.tif.aux.xml", "s0.tif.msk", "s0.tfw"]' in normalized


# A conversion in one child, the shard writer's existence checks and folder listings written to a
# file (argv[2]) one line each: the conversion's work runs in a fork of the child (`recovery.supervise`).
_COUNTING_CHILD = """
import json, sys
from conversion import console, shard_writer
from conversion import files
real_exists, real_match = shard_writer.exists, files.match
def note(what):
    with open(sys.argv[2], "a") as f:
        f.write(what + "\\n")
def exists(path):
    note("exists")
    return real_exists(path)
def match(pattern):
    note("match")
    return real_match(pattern)
shard_writer.exists, shard_writer.match = exists, match
from beam_jobs import convert
console.exit_program(convert.main(json.loads(sys.argv[1])))
"""


def test_sidecars_in_a_bucket_cost_one_listing_per_folder_not_a_check_per_name(child_env, bucket, tmp_path):
    """Rasters with and without sidecars in a bucket: their folder listed once per shard, no name
    checked one by one (11 per TIFF with --raster_georef), and the shards those of a local run."""
    import numpy as np
    import tifffile

    images = tmp_path / "images"
    rng = np.random.default_rng(6)
    for folder in ("fields", "forest"):
        for i in range(3):
            path = images / folder / f"t{i}.tif"
            path.parent.mkdir(parents=True, exist_ok=True)
            tifffile.imwrite(path, rng.integers(10, 4000, (8, 6, 2), dtype=np.uint16), photometric="minisblack",
                             planarconfig="contig")
        write(images / folder / "t0.tfw", b"10\n0\n0\n-10\n500005\n3999995\n")
        write(images / folder / "t1.tif.aux.xml", b'<PAMDataset><PAMRasterBand band="1"><NoDataValue>7'
                                                  b'</NoDataValue></PAMRasterBand></PAMDataset>')
    for path in sorted(p for p in images.rglob("*") if p.is_file()):
        bucket.blob(f"few_in/{path.relative_to(images).as_posix()}").upload_from_filename(str(path))
    args = ["--raster_georef", "--seed", "3", "--worker_processes", "0"]
    noted = tmp_path / "calls.txt"
    noted.write_text("")
    result = subprocess.run(
        [sys.executable, "-c", _COUNTING_CHILD, json.dumps(
            ["--input_dir", f"gs://{_BUCKET}/few_in", "--output_dir", f"gs://{_BUCKET}/few_out", *args]),
         str(noted)],
        env=child_env, cwd=str(_REPO), capture_output=True, text=True, timeout=_RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = noted.read_text().split()
    calls = {what: lines.count(what) for what in ("exists", "match")}
    manifest = convert(images, tmp_path / "local", *args)
    shards = sum(len(info.shards) for info in manifest.splits.values())
    assert calls["exists"] == 0 and 2 <= calls["match"] <= 2 * shards, calls
    local = {str(p.relative_to(tmp_path / "local")): p.read_bytes()
             for p in (tmp_path / "local").rglob("*") if p.is_file()}
    remote = _objects(bucket, "few_out/")
    assert [name for name in local if remote[name] != local[name]] == []
    normalized = local[schemas.NORMALIZED_FILENAME].decode()
    assert '"sidecars": ["t0.tfw"]' in normalized and '"sidecars": ["t1.tif.aux.xml"]' in normalized


# A conversion in one child whose annotation reads (`files.read_bytes` of gs:// XML files) are
# noted, each with the reads in flight as it starts, in a file (argv[2]). The first read waits
# (up to 20 s) for a second one to start: reads one after another would each note 1.
_OVERLAP_CHILD = """
import json, sys, threading
from conversion import console, files
real_read, lock, second = files.read_bytes, threading.Lock(), threading.Event()
in_flight = [0]
def read_bytes(path):
    if not (path.startswith("gs://") and path.endswith(".xml")):
        return real_read(path)
    with lock:
        in_flight[0] += 1
        now = in_flight[0]
        with open(sys.argv[2], "a") as f:
            f.write(f"{now}\\n")
    if now > 1:
        second.set()
    else:
        second.wait(20)
    try:
        return real_read(path)
    finally:
        with lock:
            in_flight[0] -= 1
files.read_bytes = read_bytes
from beam_jobs import convert
console.exit_program(convert.main(json.loads(sys.argv[1])))
"""


def test_voc_xml_files_in_a_bucket_are_read_on_threads_into_the_local_runs_shards(child_env, bucket, tmp_path):
    """240 Pascal VOC XML files in a bucket (and one naming no image): read with several requests in
    flight, and the shards, boxes and rejects those of the same files on local disk."""
    images, xmls = tmp_path / "images", tmp_path / "voc"
    for i in range(240):
        write(images / f"p{i:03d}.png", encode(pixels(i, size=(12, 16)), "PNG"))
        box = f"<xmin>{1 + i % 5}</xmin><ymin>2</ymin><xmax>{9 + i % 7}</xmax><ymax>11</ymax>"
        body = "not xml" if i == 7 else (f"<annotation><filename>p{i:03d}.png</filename><size><width>16</width>"
                                         f"<height>12</height></size><object><name>{'cat' if i % 3 else 'dog'}"
                                         f"</name><difficult>0</difficult><bndbox>{box}</bndbox></object></annotation>")
        write(xmls / f"p{i:03d}.xml", body.encode())
    write(xmls / "stray.xml", b"<annotation><filename>stray.png</filename></annotation>")
    for path in sorted(xmls.iterdir()):
        bucket.blob(f"voc/{path.name}").upload_from_filename(str(path))
    args = ["--seed", "3", "--max_reject_fraction", "0.5", "--worker_processes", "0"]
    noted = tmp_path / "reads.txt"
    noted.write_text("")
    result = subprocess.run(
        [sys.executable, "-c", _OVERLAP_CHILD, json.dumps(
            ["--input_dir", str(images), "--output_dir", str(tmp_path / "remote"),
             "--annotations", f"gs://{_BUCKET}/voc", *args]), str(noted)],
        env=child_env, cwd=str(_REPO), capture_output=True, text=True, timeout=_RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-4000:]
    in_flight = [int(n) for n in noted.read_text().split()]
    assert len(in_flight) == 241 and max(in_flight) > 1, in_flight
    local = tmp_path / "local"
    manifest = convert(images, local, "--annotations", xmls, *args)
    remote = schemas.Manifest.from_json((tmp_path / "remote" / schemas.MANIFEST_FILENAME).read_text())
    assert remote.targets["boxes"].pop("source") == f"gs://{_BUCKET}/voc"
    assert remote.targets["boxes"] == {k: v for k, v in manifest.targets["boxes"].items() if k != "source"}
    assert remote.counts == manifest.counts
    assert manifest.counts["rejected"] == 2 and manifest.targets["boxes"]["class_names"] == ["cat", "dog"]
    shards = [name for name in sorted(os.listdir(local)) if name.endswith((".tfrecord", ".idx"))]
    assert shards and [n for n in shards if (tmp_path / "remote" / n).read_bytes() != (local / n).read_bytes()] == []
    rejects = (tmp_path / "remote" / schemas.REJECTS_FILENAME).read_text()
    assert rejects.replace(f"gs://{_BUCKET}/voc", str(xmls)) == (local / schemas.REJECTS_FILENAME).read_text()
    assert "p007.xml in --annotations gs://" in rejects and "is not valid XML" in rejects


_READ_MANY_CHILD = """
import json, sys
from conversion import files
out = files.read_many(sys.argv[1:])
print(json.dumps([o.decode() if isinstance(o, bytes) else f"{type(o).__name__}: {o}" for o in out]))
"""


def test_read_many_of_a_bucket_keeps_an_objects_error_as_its_own(child_env, bucket):
    """An object gone (its client's NotFound, no OSError) is that object's OSError; the others' bytes come."""
    for i in range(3):
        bucket.blob(f"many/{i}.txt").upload_from_string(f"object {i}".encode())
    paths = [f"gs://{_BUCKET}/many/0.txt", f"gs://{_BUCKET}/many/gone.txt", f"gs://{_BUCKET}/many/2.txt"]
    result = subprocess.run([sys.executable, "-c", _READ_MANY_CHILD, *paths], env=child_env, cwd=str(_REPO),
                            capture_output=True, text=True, timeout=_RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-4000:]
    first, gone, last = json.loads(result.stdout.splitlines()[-1])
    assert (first, last) == ("object 0", "object 2")
    assert gone.startswith("OSError: NotFound: 404") and "gone.txt" in gone
