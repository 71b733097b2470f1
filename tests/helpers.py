"""Helpers of the tests: tiny real image and DICOM files on disk, conversions, records read back.

Plain functions, imported by the test modules (`from helpers import convert, make_class_tree`).
`tests/` has no `__init__.py`, so pytest's default (prepend) import mode puts `tests/` first on
`sys.path` before it imports `conftest.py` and the test modules: this module and `_reader_data.py`
are imported by bare name. The `_reader_*_child.py` scripts run in their own interpreter as
scripts, so their folder is `sys.path[0]` there too. Fixtures and pytest's own configuration live
in `conftest.py`.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
from PIL import Image

__all__ = ["pixels", "encode", "write", "make_class_tree", "read_records", "convert", "make_dicom",
           "tiff_with_bad_tag", "interpreters_at_once", "forked_programs", "faulty_plugin",
           "add_faulty_files", "add_growing_file", "add_slow_files"]


def pixels(seed: int, size=(24, 32), mode="RGB") -> np.ndarray:
    """A smooth random picture (JPEG-friendly), reproducible from the seed."""
    rng = np.random.default_rng(seed)
    h, w = size
    channels = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
    base = rng.integers(0, 256, size=(channels,))
    yy, xx = np.mgrid[0:h, 0:w]
    arr = (base[None, None, :] + 3 * yy[..., None] + 2 * xx[..., None] * rng.integers(1, 4)) % 256
    arr = arr.astype(np.uint8)
    return arr[..., 0] if mode == "L" else arr


def encode(arr: np.ndarray, fmt: str, **kwargs) -> bytes:
    """`arr` encoded by Pillow in `fmt` (e.g. "JPEG", "PNG"); `kwargs` go to `Image.save`."""
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **kwargs)
    return buf.getvalue()


def write(path: pathlib.Path, data: bytes) -> pathlib.Path:
    """Writes `data` to `path`, creating its folders; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def make_class_tree(root: pathlib.Path, classes=("cat", "dog", "fish"), per_class=6, seed=0):
    """ROOT/<class>/... with JPEG and PNG files, some grey, some nested.

    Returns:
      {relative path: class name} of every image written.
    """
    written = {}
    for c, name in enumerate(classes):
        for i in range(per_class):
            s = seed * 1000 + c * 100 + i
            if i % 3 == 2:
                rel = f"{name}/img_{i:02d}.png"
                data = encode(pixels(s), "PNG")
            elif i % 5 == 4:
                rel = f"{name}/nested/grey_{i:02d}.jpg"
                data = encode(pixels(s, mode="L"), "JPEG", quality=90)
            else:
                rel = f"{name}/img_{i:02d}.jpg"
                data = encode(pixels(s), "JPEG", quality=90)
            write(root / rel, data)
            written[rel] = name
    return written


def run_without_core_dumps(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, **kwargs)` with core dumps off in the child (tests crash decoders on purpose).

    The limit is lowered in this process while the child runs and inherited,
    not set in a `preexec_fn`: with one, `subprocess` starts the child with
    fork() instead of vfork(), which runs gRPC's fork handlers. In a test
    process where Beam's multi-threaded runner ran earlier (its gRPC server
    stays), gRPC then restarts its epoll poller in the child, `close_fds`
    closes the poller's descriptor before exec, and the child aborts (SIGABRT,
    "Epoll1Poller ... epoll_wait error: Bad file descriptor") before it runs
    the command: 35 of 300 such starts (grpcio 1.85.4; grpc/grpc issue 43055).
    Only the soft limit moves (it can move back), and only meanwhile.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    try:
        return subprocess.run(cmd, **kwargs)
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


def interpreters_at_once() -> int:
    """How many fresh interpreters a test module starts at a time (each imports TensorFlow).

    The machine's cores (at least 2), shared among the pytest-xdist workers of the run: each
    worker runs its own modules at the same time as the others', so on 2 cores a serial run
    starts 2 at a time and each of 2 workers 1, the machine's total unchanged. xdist sets
    `PYTEST_XDIST_WORKER_COUNT` in each worker; a run without it counts as one worker.
    """
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    return max(1, max(2, os.cpu_count() or 1) // workers)


# The interpreter of `forked_programs`: argv[1] is a JSON file of {"prelude": code, "programs":
# {name: {"code": code, "env": {name: value or None}}}, "out": folder}.
_FORK_DRIVER = r'''
import json, os, sys, traceback
spec = json.load(open(sys.argv[1]))
scope = {"__name__": "__main__"}
exec(compile(spec["prelude"], "<prelude>", "exec"), scope)
for name, program in spec["programs"].items():
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            for fd, ext in ((1, "out"), (2, "err")):
                target = os.open(os.path.join(spec["out"], f"{name}.{ext}"),
                                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(target, fd)
                os.close(target)
            for key, value in program["env"].items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            exec(compile(program["code"], f"<{name}>", "exec"), scope)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    with open(os.path.join(spec["out"], f"{name}.status"), "w") as f:
        f.write(str(os.waitstatus_to_exitcode(status)))
sys.stdout.flush(), sys.stderr.flush()
os._exit(0)  # Without the teardown of what the prelude imported (TensorFlow's: ~2 s of CPU).
'''


def forked_programs(prelude: str, programs: dict[str, tuple[str, dict]], *, cwd, env: dict,
                    timeout: float = 600) -> dict[str, tuple[int, str, str]]:
    """Runs each program in a child forked from one interpreter that ran `prelude` first.

    For tests of what a fresh process sees (imports, environment variables read at TensorFlow's
    first op), at the cost of one import of the heavy libraries `prelude` imports, not one per
    program: each child starts from the state `prelude` left (imports done, no op run) with its
    own output. The children run one after the other.

    Args:
      prelude: Code run once, before any fork (e.g. `import tensorflow`, without running an op).
      programs: {name: (code, environment changes)}: each child sets the changes (None deletes a
        variable), then runs `code` in the prelude's globals (its names defined; the child's
        own copy). Names must be usable as file names.
      cwd, env: The interpreter's folder and environment.

    Returns:
      {name: (exit code, stdout, stderr)}; an exception in a program is exit code 1 with its
      traceback on stderr.
    """
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        spec = os.path.join(out, "spec.json")
        with open(spec, "w", encoding="utf-8") as f:
            json.dump({"prelude": prelude, "out": out,
                       "programs": {n: {"code": c, "env": e} for n, (c, e) in programs.items()}}, f)
        proc = subprocess.run([sys.executable, "-c", _FORK_DRIVER, spec], capture_output=True,
                              text=True, cwd=cwd, env=env, timeout=timeout)
        if proc.returncode:
            raise RuntimeError(f"The prelude or the driver failed ({proc.returncode}): "
                               f"{proc.stderr[-3000:]}")
        found = {}
        for name in programs:
            def read(ext):
                with open(os.path.join(out, f"{name}.{ext}"), encoding="utf-8") as f:
                    return f.read()
            found[name] = (int(read("status")), read("out"), read("err"))
        return found


def read_records(out_dir) -> list[dict]:
    """Every record of every shard the manifest lists, parsed with the schema."""
    import tensorflow as tf

    import schemas

    manifest = schemas.Manifest.from_json((pathlib.Path(out_dir) / schemas.MANIFEST_FILENAME).read_text())
    spec = schemas.ImageExampleSchema.from_json(manifest.features).parse_spec()
    records = []
    for split, info in manifest.splits.items():
        for shard in info.shards:
            for raw in tf.data.TFRecordDataset(str(pathlib.Path(out_dir) / shard.file)):
                parsed = tf.io.parse_single_example(raw, spec)
                rec = {k: v.numpy() for k, v in parsed.items()}
                rec["split"] = split
                rec["shard"] = shard.file
                records.append(rec)
    return records


def convert(input_dir, output_dir, *args) -> "schemas.Manifest":
    """Runs the conversion in-process on Beam's local runner; returns the manifest."""
    import schemas
    from beam_jobs import convert as convert_module

    convert_module.run(["--input_dir", str(input_dir), "--output_dir", str(output_dir), *map(str, args)])
    return schemas.Manifest.from_json((pathlib.Path(output_dir) / schemas.MANIFEST_FILENAME).read_text())


def make_dicom(
    stored,
    *,
    photometric="MONOCHROME2",
    signed=True,
    file_format=True,
    **elements,
) -> bytes:
    """A 16-bit greyscale DICOM file (frames, rows, columns) or (rows, columns)."""
    stored = np.asarray(stored)
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage

    ds = Dataset()
    ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = "1.2.826.0.1.3680043.2.1143.1"
    ds.Modality = "OT"
    ds.Rows, ds.Columns = stored.shape[-2:]
    if stored.ndim == 3:
        ds.NumberOfFrames = stored.shape[0]
    ds.SamplesPerPixel = 1
    ds.BitsAllocated = ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 1 if signed else 0
    ds.PhotometricInterpretation = photometric
    ds.PixelData = stored.astype("<i2" if signed else "<u2").tobytes()
    for keyword, value in elements.items():
        setattr(ds, keyword, value)
    buf = io.BytesIO()
    if file_format:
        ds.file_meta = FileMetaDataset()
        ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        ds.save_as(buf, enforce_file_format=True)
    else:
        # A bare dataset, as old archives write: no preamble, no File Meta.
        ds.save_as(buf, implicit_vr=True, little_endian=True)
    return buf.getvalue()


def tiff_with_bad_tag(arr: np.ndarray, tag: int = 270) -> bytes:
    """A little-endian TIFF of `arr` whose `tag` (ImageDescription) points past the file's end.

    tifffile still reads the pixels, and logs on its logger that the tag's
    value offset is invalid.
    """
    import struct

    import tifffile

    buf = io.BytesIO()
    tifffile.imwrite(buf, arr, photometric="minisblack", planarconfig="contig",
                     description="a description longer than four bytes")
    data = bytearray(buf.getvalue())
    ifd = struct.unpack_from("<I", data, 4)[0]
    for i in range(struct.unpack_from("<H", data, ifd)[0]):
        entry = ifd + 2 + 12 * i
        if struct.unpack_from("<H", data, entry)[0] == tag:
            struct.pack_into("<I", data, entry + 8, len(data) + 1000)
            return bytes(data)
    raise ValueError(f"tifffile wrote no tag {tag}")


# A real Pillow plugin for a made-up format whose decoder raises, crashes (SIGSEGV) or loops
# forever, by the file's bytes: loaded in every process of a conversion (the command, its
# forked child, worker processes, Dask workers) by a `sitecustomize` module on PYTHONPATH, as a
# third-party plugin would be.
_FAULTY_PLUGIN = textwrap.dedent('''
    """A Pillow plugin whose decoder raises, crashes or hangs (shardsmith's tests)."""
    import ctypes
    import time

    from PIL import Image, ImageFile


    class _Faulty(ImageFile.ImageFile):
        format = "FAULTY"
        format_description = "made-up format of shardsmith's tests"

        def _open(self):
            kind = self.fp.read(12)[6:].rstrip(b" ")
            if kind == b"RAISE":
                raise RuntimeError("the plugin's own bug")
            if kind == b"SEGV":
                ctypes.string_at(0)  # Reads address 0: SIGSEGV.
            if kind == b"HANG":
                while True:
                    time.sleep(0.5)
            if kind == b"SLOW":  # Slow, not stuck: 3 s, then no image of this format.
                time.sleep(3)
            if kind == b"GROW":  # ~640 MB/s, written (resident), up to 3 GiB; then it hangs.
                chunks = []
                while len(chunks) < 96:
                    chunks.append(b"\\1" * (32 << 20))
                    time.sleep(0.05)
                while True:
                    time.sleep(0.5)
            raise SyntaxError("not a faulty file")


    Image.register_open(_Faulty.format, _Faulty, lambda prefix: prefix[:6] == b"FAULTY")
''')
FAULT_KINDS = ("RAISE", "SEGV", "HANG")
# The plugin's file that grows without end (`add_growing_file`): apart, as --file_memory's alone.
GROW = "GROW"
# The plugin's file that takes 3 s and is then no image (`add_slow_files`).
SLOW = "SLOW"


def faulty_plugin(folder: pathlib.Path) -> pathlib.Path:
    """A folder holding the faulty plugin's `sitecustomize.py`, to put on PYTHONPATH."""
    plugin = pathlib.Path(folder) / "faulty_plugin"
    plugin.mkdir(parents=True, exist_ok=True)
    (plugin / "sitecustomize.py").write_text(_FAULTY_PLUGIN)
    return plugin


def add_growing_file(root: pathlib.Path, folder: str) -> str:
    """A file in `root/folder` on which the faulty plugin grows to 3 GiB; its relative path."""
    rel = f"{folder}/faulty_grow.png"
    write(pathlib.Path(root) / rel, b"FAULTY" + GROW.ljust(6).encode())
    return rel


def add_slow_files(root: pathlib.Path, folder: str, count: int) -> list[str]:
    """`count` files in `root/folder` on which the faulty plugin takes 3 s each; their relative paths."""
    written = []
    for i in range(count):
        rel = f"{folder}/faulty_slow{i}.png"
        write(pathlib.Path(root) / rel, b"FAULTY" + SLOW.ljust(6).encode())
        written.append(rel)
    return written


def add_faulty_files(root: pathlib.Path, folder: str) -> dict[str, str]:
    """One file per fault kind in `root/folder`; returns {relative path: 'RAISE'|'SEGV'|'HANG'}."""
    written = {}
    for kind in FAULT_KINDS:
        rel = f"{folder}/faulty_{kind.lower()}.png"
        write(pathlib.Path(root) / rel, b"FAULTY" + kind.ljust(6).encode())
        written[rel] = kind
    return written


def write_geotiff(path: pathlib.Path, array: np.ndarray, nodata=None, *, crs: str = "EPSG:32633",
                  transform=None, **profile) -> pathlib.Path:
    """A GeoTIFF of `array` (bands, height, width) written by GDAL (rasterio), as real scenes are.

    Args:
      path: The file; its folder is created.
      array: The samples, band first.
      nodata: The nodata value GDAL records, or None.
      crs: The coordinate reference system.
      transform: A rasterio `Affine`; default 10 m pixels from (300000, 5000000).
      **profile: GDAL creation options of rasterio's profile (tiled, blockxsize, compress, ...).
    """
    import rasterio
    from rasterio.transform import from_origin

    bands, height, width = array.shape
    path.parent.mkdir(parents=True, exist_ok=True)
    transform = from_origin(300000.0, 5000000.0, 10.0, 10.0) if transform is None else transform
    with rasterio.open(path, "w", driver="GTiff", height=height, width=width, count=bands,
                       dtype=array.dtype.name, nodata=nodata, crs=crs, transform=transform,
                       **profile) as dst:
        dst.write(array)
    return path


def gdal_read(path: pathlib.Path) -> np.ndarray:
    """GDAL's values (rasterio) of a file's full-resolution image, (height, width, bands): the
    independent reader raster values are compared with."""
    import warnings

    import rasterio

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Not georeferenced, and the like: the values are what counts.
        with rasterio.open(path) as src:
            return src.read().transpose(1, 2, 0)


def stored_values(image) -> np.ndarray:
    """The values a reader gets from a ValidImage, (height, width, channels): its raw bytes as
    `schemas` says, or TensorFlow's decode of its PNG (8- or 16-bit)."""
    import tensorflow as tf

    import schemas

    dtype = schemas.parse_raw_format(image.format)
    if dtype is not None:
        assert len(image.data) == image.height * image.width * image.channels * schemas.raw_itemsize(dtype)
        return np.frombuffer(image.data, np.dtype(dtype).newbyteorder("<")).reshape(
            image.height, image.width, image.channels)
    assert image.format == "png", image.format
    sixteen = image.data[24] == 16  # The IHDR's bit depth.
    return tf.io.decode_png(image.data, dtype=tf.uint16 if sixteen else tf.uint8).numpy()


def decoded_records(out_dir, split: str = "train"):
    """(record, serialized bytes, shard file) of every record of `split`, in shard order.

    Decoded by the schema's Python decoder (no TensorFlow), as the manifest's
    features describe them.
    """
    import schemas
    from schemas.tfrecord import iter_records

    out_dir = pathlib.Path(out_dir)
    manifest = schemas.Manifest.from_json((out_dir / schemas.MANIFEST_FILENAME).read_text())
    schema = schemas.ImageExampleSchema.from_json(manifest.features)
    for info in manifest.splits[split].shards:
        with open(out_dir / info.file, "rb") as f:
            for _, _, payload in iter_records(f):
                yield schema.decode(payload), payload, info.file


HOLDER = textwrap.dedent('''
    import sys, time
    from conversion import guard
    journal = guard.Journal(sys.argv[1])
    with journal.working_on([("done/first.jpg", "/in/done/first.jpg")]):
        pass
    with journal.working_on([("a/x.jpg", "/in/a/x.jpg"), ("b/\\u00e9t\\u00e9.png", "/in/b/\\u00e9t\\u00e9.png")]):
        print("ready", flush=True)
        time.sleep(600)
''')


def holding_process(folder: pathlib.Path) -> subprocess.Popen:
    """A process busy on two files in a journal of `folder` (`conversion.guard.Journal`), once ready."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def records_by_name(out_dir) -> dict[str, dict]:
    """Filename -> record (with its 'split'), every shard of the manifest, decoded by the schema's
    Python decoder (no TensorFlow)."""
    import schemas
    from schemas.tfrecord import iter_records

    out_dir = pathlib.Path(out_dir)
    manifest = schemas.Manifest.from_json((out_dir / schemas.MANIFEST_FILENAME).read_text())
    schema = schemas.ImageExampleSchema.from_json(manifest.features)
    found = {}
    for split, info in manifest.splits.items():
        for shard in info.shards:
            with open(out_dir / shard.file, "rb") as f:
                for _, _, data in iter_records(f):
                    rec = schema.decode(data)
                    rec["split"] = split
                    found[rec[schemas.FILENAME.key].decode()] = rec
    return found


def boxes_in_pixels(rec) -> list[tuple]:
    """A record's boxes as (xmin, ymin, xmax, ymax, label) in pixels of its stored image."""
    import schemas

    w, h = rec[schemas.WIDTH.key], rec[schemas.HEIGHT.key]
    keys = [spec.key for spec in schemas.BOX_FEATURES]
    return [(x0 * w, y0 * h, x1 * w, y1 * h, label) for x0, y0, x1, y1, label, _ in zip(*(rec[k] for k in keys))]


def oriented_jpeg(raw: np.ndarray, orientation: int) -> bytes:
    """A JPEG of the raw frame `raw` with an EXIF orientation, as a phone writes it."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation
    buf = io.BytesIO()
    Image.fromarray(raw).save(buf, "JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


def upright_marker(image_bytes: bytes) -> tuple[int, int, int, int]:
    """(xmin, ymin, xmax, ymax) of the bright marker of an image as a viewer shows it (upright)."""
    from PIL import Image, ImageOps

    arr = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(image_bytes))).convert("L"))
    ys, xs = np.nonzero(arr > 127)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def rows_by_path(path) -> dict[str, dict]:
    """The rows of a JSON-lines file (rejects.jsonl, normalized.jsonl) by their 'path'; {} without the file."""
    path = pathlib.Path(path)
    if not path.exists():
        return {}
    return {d["path"]: d for d in map(json.loads, path.read_text().splitlines())}


def marked_photo(orientation: int) -> bytes:
    """A 48x32 phone photo (as stored) with a bright 12x8 marker, and an EXIF orientation."""
    raw = np.zeros((32, 48, 3), np.uint8)
    raw[6:14, 4:16] = 255
    return oriented_jpeg(raw, orientation)


def globox_images(globox, images: pathlib.Path, sizes: dict, names, seed: int, *, least: int = 1) -> list:
    """Writes an image of each (width, height) of `sizes` (relative path -> size) and gives their
    globox annotations: `least` to 3 random boxes each, labels taken from `names` in turn; an image
    named 'd.png' has none. For tests that write the same boxes in two formats with globox."""
    rng = np.random.default_rng(seed)
    annotations = []
    for name, (w, h) in sizes.items():
        write(images / name, encode(pixels(len(annotations), size=(h, w)), "PNG"))
        boxes = []
        for _ in range(int(rng.integers(least, 4)) if name != "d.png" else 0):
            x0, y0 = rng.uniform(0, w - 6), rng.uniform(0, h - 6)
            x1, y1 = rng.uniform(x0 + 2, w), rng.uniform(y0 + 2, h)
            label = names[(sum(len(a.boxes) for a in annotations) + len(boxes)) % len(names)]
            boxes.append(globox.BoundingBox(label=label, xmin=x0, ymin=y0, xmax=x1, ymax=y1))
        annotations.append(globox.Annotation(name, image_size=(w, h), boxes=boxes))
    return annotations


def write_jp2(path: pathlib.Path, array: np.ndarray, crs: str = "EPSG:32633", transform=None, *, lossless=True,
              lossy_quality: int = 25, **options) -> pathlib.Path:
    """`array` (bands, height, width) as GDAL's JP2OpenJPEG driver writes it (rasterio), with no .aux.xml
    beside it: what GDAL reports must come from the file's own boxes."""
    import rasterio

    bands, height, width = array.shape
    path.parent.mkdir(parents=True, exist_ok=True)
    quality = dict(QUALITY=100, REVERSIBLE="YES") if lossless else dict(QUALITY=lossy_quality)
    with rasterio.open(path, "w", driver="JP2OpenJPEG", height=height, width=width, count=bands,
                       dtype=array.dtype.name, crs=crs, transform=transform, **quality, **options) as dst:
        dst.write(array)
    for sidecar in path.parent.glob(path.name + ".aux.xml"):
        sidecar.unlink()
    return path
