"""Atomic file writes and whole-file reads: local paths directly, URLs through Beam's FileSystems.

Shards are framed by `schemas.tfrecord` and written here, not with
`tf.io.TFRecordWriter`, so that they go through Beam's FileSystems (gs://,
s3://, ... wherever Beam can write) and the shard's checksum is computed
while writing.

Local paths are read and written with `io` and `os`, as Beam's
LocalFileSystem does (same calls, same errors), and without importing Beam:
the shard writers' worker processes (`processes`) import it only for a URL
(~1.3 s of CPU and ~80 MB each).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import fnmatch
import hashlib
import io
import os
import re
import shutil
import uuid
from collections.abc import Sequence

__all__ = ["AtomicWriter", "OutputFull", "output_full_text", "write_shard_index", "write_atomically", "read_bytes", "read_many", "open_to_read", "exists", "is_local", "scheme",
           "join", "remove", "remove_tree", "match", "TMP_DIRNAME"]

# Temporary files live in this folder inside the output until renamed.
TMP_DIRNAME = "_shardsmith_tmp"
# Bytes an AtomicWriter collects before one write to its file. Small records
# (~1.5 KB) written one by one cost a system call every few records, and each
# call gives up the GIL, which the shard writer then waits for behind the
# validating threads; 1 MiB writes make that once per ~600 small records.
_WRITE_CHUNK = 1 << 20
# Beam's `FileSystems.URI_SCHEMA_PATTERN`: a path without a scheme is local.
_SCHEME = re.compile(r"[a-zA-Z][-a-zA-Z0-9+.]*://")


def is_local(path: str) -> bool:
    """Whether `path` has no scheme: read and written here with `io` and `os`, not through Beam."""
    return _SCHEME.match(path.strip()) is None


def scheme(path: str) -> str | None:
    """`FileSystems.get_scheme`: the scheme of a URL ("gs", "file", ...), None for a plain path."""
    found = _SCHEME.match(path.strip())
    return None if found is None else found.group(0)[:-len("://")]


def exists(path: str) -> bool:
    """`FileSystems.exists`, without Beam for a local path (LocalFileSystem's `os.path.exists`)."""
    if is_local(path):
        return os.path.exists(path)
    return _filesystems().exists(path)


def remove(path: str) -> None:
    """`FileSystems.delete` of one file, without Beam for a local path; a missing file is no error."""
    if is_local(path):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        return
    if _filesystems().exists(path):
        _filesystems().delete([path])


def remove_tree(path: str) -> None:
    """Deletes a file, or a folder with everything in it, if it is there (`FileSystems.delete`).

    On object stores (gs://, s3://) a folder is only a prefix of object names:
    no object has its name, so its objects are listed and deleted.
    """
    if is_local(path):
        # LocalFileSystem.delete: a folder's tree, or the file.
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
        return
    filesystems = _filesystems()
    if filesystems.exists(path):
        filesystems.delete([path])
        return
    inside = match(path.rstrip("/") + "/**")
    if inside:
        filesystems.delete(inside)


def match(pattern: str) -> list[str]:
    """The files a pattern matches, sorted (`FileSystems.match`: `*` within a folder, `**` across).

    A local pattern whose wildcards are all in its last part (`folder/*.json`)
    is matched here, one listing of its folder, without Beam; any other
    through Beam's FileSystems, with its meaning of the wildcards.
    """
    folder, name = os.path.split(pattern)
    if not is_local(pattern) or any(c in folder for c in "*?[") or "**" in name:
        return sorted(m.path for m in _filesystems().match([pattern])[0].metadata_list)
    try:
        entries = list(os.scandir(folder or "."))
    except (FileNotFoundError, NotADirectoryError):
        return []
    # Files only, as LocalFileSystem lists them (a folder's name never matches).
    return sorted(os.path.join(folder, e.name) for e in entries
                  if fnmatch.fnmatchcase(e.name, name) and e.is_file())


def join(folder: str, *names: str) -> str:
    """`FileSystems.join`, without Beam for a local folder."""
    if is_local(folder):
        return os.path.join(folder, *names)
    return _filesystems().join(folder, *names)


# A local write that fails with one of these found the output's disk (or the user's quota) full:
# no file's fault, and no retry helps until space is freed.
_DISK_FULL = frozenset(filter(None, (errno.ENOSPC, getattr(errno, "EDQUOT", None))))


class OutputFull(Exception):
    """A write into the output folder failed for want of space (ENOSPC, EDQUOT); says what to do.

    Not an OSError: no handler of a file's read errors may take it for the input's
    fault. Its text names the error, the file and the folder; the conversion reports
    it in one sentence with what to do (`recovery.failure_message`).
    """


def output_full_text(e: BaseException) -> str | None:
    """The text of an `OutputFull`, also where a runner wrapped it (an error raised in a pipeline's
    step reaches the caller as the runner's own, its text holding the original's); else None."""
    if isinstance(e, OutputFull):
        return str(e)
    for line in str(e).splitlines():
        if "OutputFull: " in line:
            return _RUNNING_STEP.sub("", line.split("OutputFull: ", 1)[1].strip())
    return None


# What Beam's runner appends to the text of an error raised in a step.
_RUNNING_STEP = re.compile(r"\s*\[while running '[^']*'\]$")


def _disk_full(e: OSError, output_dir: str, name: str) -> OutputFull:
    return OutputFull(f"{e.strerror} while writing {name} into {output_dir}")


def _filesystems():
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


class AtomicWriter:
    """Writes a file under a unique temporary name and renames it when closed.

    A reader never sees a half-written file under the final name, and a retried
    worker writes its own temporary file, then replaces the final one with the
    same bytes.

    Args:
      output_dir: Folder of the final file.
      name: Final file name.
      in_tmp_dir: Keep the temporary file in the output's temporary folder
        (shards: a crash leaves its debris in one place that a re-run clears);
        otherwise beside the final file under a hidden name (small metadata
        files, also written into folders that have no temporary folder).
    """

    def __init__(self, output_dir: str, name: str, in_tmp_dir: bool = True):
        self._local = is_local(output_dir)
        self._output_dir, self._name, self._file = output_dir, name, None
        self.final_path = join(output_dir, name)
        if in_tmp_dir:
            tmp_path = join(output_dir, TMP_DIRNAME, f"{name}.{uuid.uuid4().hex}")
        else:
            tmp_path = join(output_dir, f".{name}.{uuid.uuid4().hex}.tmp")
        self._tmp_path = tmp_path
        if self._local:
            # LocalFileSystem.create: the folder made if missing, then io.open.
            folder = os.path.dirname(tmp_path)
            with self._space(name):
                if folder:
                    os.makedirs(folder, exist_ok=True)
                self._file = io.open(tmp_path, "wb")
        else:
            from apache_beam.io.filesystem import CompressionTypes

            self._file = _filesystems().create(
                self._tmp_path, compression_type=CompressionTypes.UNCOMPRESSED
            )
        self._sha = hashlib.sha256()
        self._pending: list[bytes] = []  # Written, not yet passed to the file.
        self._pending_bytes = 0
        self.num_bytes = 0

    def write(self, data: bytes) -> None:
        """Appends `data`; it reaches the file in chunks of about 1 MiB, at the latest on commit.

        `data` of a chunk or more (a volume's voxels, as a memoryview) goes
        to the file as it is, after what is pending: never joined, so never
        copied.
        """
        if len(data) >= _WRITE_CHUNK:
            self._flush()
            self.num_bytes += len(data)
            with self._space(self._name):
                self._file.write(data)
            self._sha.update(data)
            return
        self._pending.append(data)
        self._pending_bytes += len(data)
        self.num_bytes += len(data)
        if self._pending_bytes >= _WRITE_CHUNK:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        chunk = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        with self._space(self._name):
            self._file.write(chunk)
        self._sha.update(chunk)

    @property
    def sha256(self) -> str:
        """The SHA-256 of every byte written so far (hex)."""
        self._flush()
        return self._sha.hexdigest()

    def commit(self) -> None:
        """Writes what is pending, closes the temporary file and renames it to the final name."""
        self._flush()
        with self._space(self._name):
            self._file.close()
        if self._local:
            # os.replace: LocalFileSystem's os.rename, which also replaces an
            # existing final file (an earlier attempt's same bytes) on Windows.
            os.replace(self._tmp_path, self.final_path)
            return
        filesystems = _filesystems()
        if filesystems.exists(self.final_path):
            # Some file systems refuse to rename onto an existing file; an
            # earlier attempt of this very shard wrote the same bytes.
            filesystems.delete([self.final_path])
        filesystems.rename([self._tmp_path], [self.final_path])

    def abort(self) -> None:
        self._pending, self._pending_bytes = [], 0
        if self._local:
            # Closing flushes what the file object buffers: on a full disk that fails
            # again, and the temporary file is removed all the same.
            with contextlib.suppress(OSError):
                self._file.close()
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._tmp_path)
            return
        self._file.close()
        _filesystems().delete([self._tmp_path])

    @contextlib.contextmanager
    def _space(self, name: str):
        """A local write that finds the disk full raises `OutputFull`, its temporary file removed."""
        try:
            yield
        except OutputFull:
            raise
        except OSError as e:
            if not self._local or e.errno not in _DISK_FULL:
                raise
            if self._file is not None:
                self.abort()  # What it wrote is of no use, and takes the space needed.
            raise _disk_full(e, self._output_dir, name) from None


def write_atomically(output_dir: str, name: str, data: bytes) -> None:
    """Writes a small file (metadata) under a temporary name, then renames it."""
    writer = AtomicWriter(output_dir, name, in_tmp_dir=False)
    writer.write(data)
    writer.commit()


def read_bytes(path: str) -> bytes:
    """Reads a whole file, with no decompression whatever its extension."""
    if is_local(path):
        return _read_local(path)
    with open_to_read(path) as f:
        return f.read()


# Threads of `read_many`. A URL's read is a request (tens of milliseconds on
# gs://, two requests: its metadata, then its bytes) that waits on the network,
# so many are kept in flight; google-cloud-storage's HTTP session keeps 10
# connections (requests' default pool), and more threads would open and drop
# connections, each with a warning. A local read is a few system calls: threads
# only help where the disk (or a network file system) makes them wait.
_URL_READ_THREADS = 10
_LOCAL_READ_THREADS = 4
# Local files read by one task of `read_many`: a task per small file would cost
# more than its read (~10 us against ~7 us). Files in the page cache read
# fastest one after another (20,000 small ones: 57 ms; on 4 threads in tasks
# of 512, 62 ms; of 64, 88 ms: the threads take turns at the GIL).
_LOCAL_READ_CHUNK = 512


def read_many(paths: Sequence[str]) -> list[bytes | OSError]:
    """Reads many whole files on a few threads: each file's bytes, or the OSError its read raised.

    Many small files (annotations: a file per image) on cloud storage cost
    a request each; read one after another, 100,000 of them take an hour.
    The results are in the order of `paths` whatever the threads do, so what
    is planned from them does not depend on the pool; a file that cannot be
    read is that file's error, for its caller to report, not the end of the others.

    Args:
      paths: Full paths (local or URLs).

    Returns:
      One entry per path, in order: its bytes (`read_bytes`), or the OSError
      (for a URL, any error of its read, as an OSError of its type and text).
    """
    paths = list(paths)
    if not paths:
        return []
    local = all(map(is_local, paths))
    threads = _LOCAL_READ_THREADS if local else _URL_READ_THREADS
    size = _LOCAL_READ_CHUNK if local else 1
    chunks = [paths[i:i + size] for i in range(0, len(paths), size)]
    if len(chunks) == 1:
        return _read_chunk(chunks[0])
    with concurrent.futures.ThreadPoolExecutor(min(threads, len(chunks)), "shardsmith-files") as pool:
        return [data for chunk in pool.map(_read_chunk, chunks) for data in chunk]


def _read_chunk(paths: Sequence[str]) -> list[bytes | OSError]:
    out = []
    for path in paths:
        try:
            out.append(read_bytes(path))
        except OSError as e:  # Kept as that file's result: its caller names the file and the reason.
            out.append(e)
        except Exception as e:  # noqa: BLE001 - this file alone: its caller reports it
            # Object stores' clients raise their own errors (google-cloud-storage's NotFound for an
            # object gone since the listing), no OSError; a local read raises only OSErrors.
            if is_local(path):
                raise
            out.append(OSError(f"{type(e).__name__}: {e}"))
    return out


# A local file up to this size is read with one `os.read` (and one more that
# finds its end); a larger one by `FileIO.readall` (one buffer of its size).
_READ_AT_ONCE = 256 * 1024
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def _read_local(path: str) -> bytes:
    """`io.open(path, "rb").read()` in 4 system calls instead of 9 (6.5 against 13 us a small file).

    A buffered file object costs an fstat, an isatty ioctl and lseeks per
    open, as long as reading a 1.4 KB JPEG. Same bytes and the same errors,
    naming the path (a folder's error comes from the read here, from the open there).
    """
    fd = os.open(path, _READ_FLAGS)
    try:
        try:
            data = os.read(fd, _READ_AT_ONCE)
            if len(data) < _READ_AT_ONCE:
                if not os.read(fd, _READ_AT_ONCE):  # Its end: the usual case.
                    return data
            # A large file (or one still growing): read it whole into one buffer.
            os.lseek(fd, 0, os.SEEK_SET)
            with io.FileIO(fd, "rb", closefd=False) as f:
                return f.readall()
        except OSError as e:
            if e.filename is None:
                raise type(e)(e.errno, e.strerror, path) from None
            raise
    finally:
        os.close(fd)


def open_to_read(path: str):
    """A binary file object for reading `path`, with no decompression whatever its extension."""
    if is_local(path):
        # What Beam's LocalFileSystem does for it (`io.open`, same errors),
        # without looking its file system up among every FileSystem
        # subclass, ~20 us a file: as long as reading a small image.
        return io.open(path, "rb")
    from apache_beam.io.filesystem import CompressionTypes

    return _filesystems().open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def write_shard_index(output_dir: str, shard_name: str, entries) -> tuple[str, str]:
    """Writes a shard's index file (its records' (offset, length)) atomically, beside the shard.

    Called once the shard itself is committed, by every kind of shard writer.

    Returns:
      The index file's name and the SHA-256 of its bytes.
    """
    # Imported here: the file API stays free of the record format for its other callers.
    import schemas
    from schemas.tfrecord import format_index

    name = schemas.index_filename(shard_name)
    writer = AtomicWriter(output_dir, name)
    writer.write(format_index(entries))
    writer.commit()
    return name, writer.sha256
