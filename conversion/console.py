"""What every shardsmith entry point sets up: its own log lines, and quiet C++ libraries.

Importing this module changes nothing; `entry_point()` does, for the time an
entry point (`shardsmith ...`, `python -m beam_jobs.convert`, ...) runs:

- shardsmith's log lines at INFO on stderr, Beam's and TensorFlow's Python
  loggers at WARNING, without Beam's import-time notice about BigQuery
  clients we never use ("apitools not found ...").
- Libraries' warnings about the files they read kept off the console: the
  loggers of tifffile, imagecodecs, pydicom, Pillow and nibabel, and Python's
  warnings (numpy's RuntimeWarnings on NaN statistics, Pillow's on odd
  files), routed to the "py.warnings" logger. What tifffile says about a
  file while the validator reads it goes into that file's normalized.jsonl
  details or its reject message instead (imaging/formats).
- TensorFlow's and libjpeg's C++ lines hidden: TensorFlow 2.21 logs through
  absl straight to file descriptor 2 ("WARNING: All log messages before
  absl::InitializeLog() ...", "I0000 ... oneDNN custom operations are on",
  "E0000 ... Premature end of JPEG data") and libjpeg `fprintf`s its
  warnings there ("Corrupt JPEG data: 3 extraneous bytes ..."), for files
  that shardsmith then handles and reports itself. `TF_CPP_MIN_LOG_LEVEL` no
  longer reaches these, and changing TF_ENABLE_ONEDNN_OPTS would change which
  kernels run. So file descriptor 2 becomes a pipe for the duration; a thread
  forwards every line to the real stderr except those lines. Everything
  else, Python's tracebacks and a crashing library's last words included,
  passes through, in order.
- Beam's tracebacks of what the command reports itself in one sentence: an
  error of its own (the reject budget exceeded) and Ctrl-C, and the bundles
  that fail as the runner stops after them.

`--verbose`, or SHARDSMITH_VERBOSE=1 in the environment, shows all of it.

`python -m beam_jobs.convert` imports Beam before its `main` runs: those
modules call `configure_logging` first when run as programs.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import select
import signal
import sys
import threading
from collections.abc import Iterator, Sequence

__all__ = ["VERBOSE_ENV", "VERBOSE_FLAG", "VERBOSE_HELP", "entry_point", "configure_logging", "exit_program",
           "is_verbose", "is_native_noise", "is_quiet"]

VERBOSE_ENV = "SHARDSMITH_VERBOSE"
VERBOSE_FLAG = "--verbose"
VERBOSE_HELP = (
    "Also show TensorFlow's and libjpeg's C++ log lines and image libraries' warnings, hidden "
    f"by default (or set {VERBOSE_ENV}=1)."
)

# Loggers of the libraries that read input files, and the one Python's
# warnings are routed to: what they say concerns one file, which shardsmith
# reports itself (rejects.jsonl, normalized.jsonl).
_LIBRARY_LOGGERS = ("tifffile", "imagecodecs", "pydicom", "PIL", "nibabel", "py.warnings")

# Lines written by TensorFlow (absl, and the older tsl format) and libjpeg
# that describe conditions shardsmith reports itself, or nothing at all.
_NOISE = re.compile(
    rb"[\r\n]*(?:"
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    # absl: severity, MMDD hh:mm:ss.micros (TF 2.21: 0000 00:00:epoch.micros), thread, file:line]
    rb"|[IWE]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+\s+[\w./-]+:\d+\]"
    # TensorFlow < 2.17 (tsl): date time: severity path:line]
    rb"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] [\w./-]+:\d+\]"
    # libjpeg(-turbo)'s warnings (jerror.h, JWRN_*).
    rb"|Corrupt JPEG data:|Premature end of JPEG file|Invalid SOS parameters for sequential JPEG"
    rb"|Inconsistent progression sequence for component|Unsupported marker type 0x"
    rb"|Application transferred too (?:many|few) scanlines|Warning: unknown JFIF revision number"
    rb"|Warning: thumbnail image size does not match data length|Unknown Adobe color transform code"
    # libjpeg's errors (jerror.h, JERR_*), printed by decoders that keep its default message
    # output (DICOM codecs) before they raise: the file is rejected as corrupt, with the reason.
    rb"|Bogus (?:marker length|Huffman table definition|DQT index|DHT index|DAC index|DAC value|input colorspace"
    rb"|sampling factors)"
    rb"|(?:Quantization|Huffman) table 0x[0-9a-f]+ was not defined|Didn't expect more than one scan"
    rb"|Improper call to JPEG library in state \d+|Invalid JPEG file structure: |Invalid progressive parameters "
    rb"|Not a JPEG file: starts with 0x|Unsupported JPEG (?:process|data precision)|Empty JPEG image"
    rb"|Invalid component ID \d+ in SOS|Sampling factors too large|JPEG datastream contains no image"
    rb"|Premature end of input file|Corrupt JPEG data"
    rb"|Maximum supported image dimension is \d+ pixels|Input file read error"
    # libtiff's default error and warning handler ('Module: message'), for codecs that keep it:
    # the file is rejected or normalised with the reason.
    # (libtiff's internal _TIFFVSetField too: "Bad value 0 for "ResolutionUnit" tag", issue 39.)
    rb"|(?:_?TIFF\w+|JPEG\w+|ZIPDecode|LZWDecode|PackBitsDecode|Fax3Decode\w*|OJPEG\w+): "
    # Bodies of libtiff's messages seen alone on a line: its handler writes "Module: ", the body
    # and ".\n" apart, and two decoding threads' writes can interleave (issue 39's mutation run).
    rb'|(?:Incorrect count for "|Invalid YCbCr subsampling|Bad value \d+ for "|Improper JPEG sampling factors)'
    # libtiff's read errors as codecs print them without the module's name (issue 39's mutation run).
    rb"|Read error on (?:strip|tile) \d+; got \d+ bytes, expected \d+"
    # The node line under a failed op's logged error (a batch of JPEGs with a damaged one,
    # which shardsmith then validates one by one and reports itself).
    rb"|\s*\[\[\{\{node [^}]*\}\}\]\]"
    # Continuation lines of TensorFlow's CPU-feature notice.
    rb"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler"
    rb")"
)
# A partial line is forwarded when nothing follows it for this long (a
# progress bar redraws its line without ending it).
_PARTIAL_WAIT_S = 0.05
_JOIN_TIMEOUT_S = 5.0


class _QuietLibraries(logging.Filter):
    """On the console's handler: drops image libraries' lines and Beam's BigQuery notice.

    On the handler, not on loggers: a logger's filter sees only what is
    logged on it, not what its children propagate, and the libraries' own
    loggers stay as they are (the validator reads tifffile's, per file).
    """

    def filter(self, record):
        if record.name == "root":
            # Logged on the root logger by Beam as it is imported.
            return not str(record.msg).startswith("apitools not found")
        if record.name.startswith("apache_beam.") and record.levelno >= logging.ERROR:
            if _is_own_failure(record):
                _own_failure_seen.set()
                return False
            # Once a bundle failed with an error the command reports itself, the
            # runner tears its workers down while their other bundles still run:
            # those then fail too (`KeyError: 'bundle_10'`, on a busy machine),
            # consequences of the first failure, not news.
            return not _own_failure_seen.is_set()
        return not any(record.name == name or record.name.startswith(name + ".")
                       for name in _LIBRARY_LOGGERS)


_QUIET_NIBABEL = _QuietLibraries()

# The errors a conversion or verification reports itself, in one sentence at its end
# (`conversion.elements.ConversionError`, a worker process's death, a full output disk).
_OWN_FAILURES = ("ConversionError", "WorkerDied", "OutputFull")
# How a traceback whose first exception was raised in a worker process begins (its cause).
_REMOTE_CAUSE = "conversion.processes._RemoteTraceback: "
# Set when Beam's runner reported one of `_OWN_FAILURES` during the running entry point, or
# Ctrl-C came (`_interrupt_noted`; cleared when it ends): what Beam's workers print and log
# after it is dropped.
_own_failure_seen = threading.Event()


def _is_own_failure(record: logging.LogRecord) -> bool:
    """Whether Beam's runner logs, with its tracebacks, an error the command then reports itself.

    The runner logs a DoFn's exception twice (the DoFn's traceback, then the
    bundle's, ~100 lines) before the pipeline raises it; the entry point
    prints the error's one sentence ("1 of 6 images were rejected, more than
    --max_reject_fraction=0.1; ..."). Other errors keep their tracebacks.
    """
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None and type(exc).__name__ in _OWN_FAILURES:
        return True
    text = record.getMessage()
    return any(f"{name}: " in text for name in _OWN_FAILURES)


def is_native_noise(line: bytes) -> bool:
    """Whether one line of stderr is C++ chatter from TensorFlow, libjpeg or libtiff."""
    return _NOISE.match(line) is not None


# A Rust decoder's panic (pylibjpeg-rle on a damaged RLE stream), which pyo3 raises as an
# exception that shardsmith turns into the file's reject: Rust's panic hook prints a block on
# stderr first, its header, the message, and with RUST_BACKTRACE a backtrace, then a note.
_PANIC_HEADER = re.compile(rb"[\r\n]*thread '[^']*' panicked at ")
_PANIC_BODY = re.compile(rb"(?:stack backtrace:|\s+\d+: |\s+at |note: (?:Some details are omitted|run with `RUST_BACKTRACE))")


class _PanicBlocks:
    """Drops the blocks Rust's panic hook prints, line by line: the blank line before its header,
    the header, its message line, the backtrace and the note."""

    def __init__(self):
        self._state = 0  # 0: outside; 1: the message line comes next; 2: in the backtrace
        self._blank = b""  # A blank line held back: it may open a panic block.

    def lines(self, line: bytes) -> list[bytes]:
        """The lines to write now for `line` (none, it, or a held blank line and it)."""
        if _PANIC_HEADER.match(line):
            self._state, self._blank = 1, b""
            return []
        if self._state == 1:
            self._state = 2
            return []
        if self._state == 2 and _PANIC_BODY.match(line):
            return []
        self._state = 0
        held, self._blank = self._blank, b""
        if line in (b"\n", b"\r\n") and not held:
            self._blank = line
            return []
        return [held, line] if held else [line]

    def flush(self) -> bytes:
        """A blank line still held back (at the end of the stream, or before a partial line)."""
        held, self._blank = self._blank, b""
        return held


def is_verbose(argv: Sequence[str] = ()) -> bool:
    """Whether `argv` has --verbose or the environment has SHARDSMITH_VERBOSE=1 (or true/yes)."""
    from_env = os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes")
    return from_env or VERBOSE_FLAG in argv


_DEPTH_LOCK = threading.Lock()
_depth = 0
# The running entry point's --verbose; None when none runs.
_verbose: bool | None = None


def is_quiet() -> bool:
    """Whether an entry point runs without --verbose (its worker processes hide the same lines)."""
    return _verbose is False


@contextlib.contextmanager
def entry_point(argv: Sequence[str] = ()) -> Iterator[None]:
    """Configures logging and hides C++ chatter while an entry point runs.

    Re-entrant: an entry point called by another (`shardsmith convert` runs
    `beam_jobs.convert.main`) keeps the outer one's setting.

    Args:
      argv: The entry point's arguments; `--verbose` among them shows the
        C++ lines.
    """
    global _depth, _verbose
    with _DEPTH_LOCK:
        outer = _depth > 0
        _depth += 1
    try:
        if outer:
            yield
            return
        verbose = _verbose = is_verbose(argv)
        configure_logging(verbose)
        if verbose:
            yield
        elif os.name != "posix":
            with _own_failures_unprinted(), _interrupt_noted():
                yield
        else:
            with _native_stderr_filtered(), _own_failures_unprinted(), _interrupt_noted():
                yield
    finally:
        with _DEPTH_LOCK:
            _depth -= 1
            if _depth == 0:
                _verbose = None
                _own_failure_seen.clear()


class _WithoutOwnFailures:
    """sys.stderr, less the tracebacks Beam's runner prints of errors the command reports itself.

    Beam's SDK worker `print`s the traceback of a failed bundle to
    sys.stderr (sdk_worker.py, `_execute`), ~60 lines, besides logging it:
    for a `ConversionError` (the reject budget exceeded, ...) the command's
    own one-line error follows. Only a write that is one whole traceback
    ending in such an error is dropped, and after it the tracebacks of Beam's
    other bundles, which fail as the runner stops; everything else passes
    unchanged.
    """

    def __init__(self, inner):
        self._inner = inner
        self._dropped = False

    def write(self, text):
        # One whole traceback; an exception raised in a worker process (`conversion.processes`)
        # comes first as its cause ("conversion.processes._RemoteTraceback: In worker process ...").
        traceback = isinstance(text, str) and (
            text.startswith("Traceback (most recent call last):")
            or (text.startswith(_REMOTE_CAUSE) and "\nTraceback (most recent call last):" in text))
        if traceback and any(f"{name}: " in text for name in _OWN_FAILURES):
            _own_failure_seen.set()
            self._dropped = True  # `print` writes its line end next: dropped too.
            return len(text)
        if traceback and _own_failure_seen.is_set() and "apache_beam" in text:
            # A bundle that failed because the runner stopped after the first
            # failure (see `_QuietLibraries.filter`).
            self._dropped = True  # `print` writes its line end next: dropped too.
            return len(text)
        if self._dropped and text == "\n":
            self._dropped = False
            return 1
        self._dropped = False
        return self._inner.write(text)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@contextlib.contextmanager
def _own_failures_unprinted() -> Iterator[None]:
    """sys.stderr is `_WithoutOwnFailures` for the block (then what it was)."""
    previous = sys.stderr
    sys.stderr = _WithoutOwnFailures(previous)
    try:
        yield
    finally:
        if isinstance(sys.stderr, _WithoutOwnFailures):
            sys.stderr = previous


@contextlib.contextmanager
def _interrupt_noted() -> Iterator[None]:
    """Ctrl-C during the block sets `_own_failure_seen`, then does what it did before (KeyboardInterrupt).

    An interrupted command reports itself in one sentence ("interrupted: 12 of
    40 shards finished ... To go on: ..."). Beam's runner, stopped by the
    KeyboardInterrupt in the main thread, tears its workers down while their
    bundles still run: those fail (`KeyError: 'bundle_6'`) and print and log
    their tracebacks, ~60 lines, 2 runs in 12 on a busy machine when Ctrl-C
    came as the last shards were written. They are consequences of the
    interrupt, not news: dropped as after an own failure.

    Only in the main thread (where Python runs signal handlers) and over a
    handler that raises (Python's default): an ignored or default-action
    SIGINT is left as it is. A process forked in the block (the supervised
    conversion's child) keeps the handler.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):
        yield
        return

    def noted(signum, frame):
        _own_failure_seen.set()
        previous(signum, frame)

    signal.signal(signal.SIGINT, noted)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is noted:
            signal.signal(signal.SIGINT, previous)


def exit_program(code: int | None) -> None:
    """Ends a program (`python -m beam_jobs.convert`, `shardsmith ...`) with exit status `code`.

    Without the interpreter's teardown when nothing else runs: it frees the
    hundreds of thousands of objects Beam and TensorFlow create, one at a
    time, before the process ends, which then frees them all at once. That
    was 0.5 s of every conversion (10 photos: 3.7 s instead of 3.2; 2,000
    photos: 6.0 s instead of 5.4, on 2 cores). Exit handlers still run,
    logging is flushed and closed, and stdout and stderr are flushed; with a
    non-daemon thread still running, the program exits as usual (which waits
    for it). Only for a program's own end: a library function never calls it.

    Args:
      code: The exit status (None: 0), as `sys.exit` takes it.
    """
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive()
           for t in threading.enumerate()):
        sys.exit(code)
    status = 0 if code is None else code
    try:
        # The handlers `sys.exit` would run (logging's shutdown, temporary
        # folders, ...). `_run_exitfuncs` is the atexit module's own entry for
        # that, the one the interpreter calls; there is no public one.
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - a handler or a closed stream: the usual way out
        sys.exit(code)
    os._exit(status)


def configure_logging(verbose: bool | None = None, level: int = logging.INFO) -> None:
    """INFO for shardsmith's lines, WARNING for Beam's and TensorFlow's Python loggers.

    Python's warnings go to the "py.warnings" logger. Called again (by an
    entry point's pipeline, by a worker process) it sets the same again.

    Args:
      verbose: Show image libraries' lines, Python's warnings and Beam's
        import-time BigQuery notice; None: as the running entry point says
        (quiet outside any).
      level: The root logger's level (worker processes: WARNING).
    """
    if verbose is None:
        verbose = bool(_verbose)
    logging.basicConfig(level=level, format="%(message)s", force=True)
    for noisy in ("apache_beam", "absl", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # A warning shown is a record of "py.warnings": the handler's filter
    # decides, and --verbose shows it with its file and line.
    logging.captureWarnings(True)
    if not verbose:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_QuietLibraries())
        # nibabel's header checks ("sizeof_hdr should be 348; set sizeof_hdr to 348") also go to a
        # handler of its own (nibabel.imageglobals), added as it is imported: dropped on its logger.
        logging.getLogger("nibabel.global").addFilter(_QUIET_NIBABEL)


@contextlib.contextmanager
def _native_stderr_filtered() -> Iterator[None]:
    """File descriptor 2 through a filter that drops `is_native_noise` lines."""
    sys.stderr.flush()
    try:
        real = os.dup(2)
    except OSError:  # No stderr at all: nothing to filter.
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    forwarder = threading.Thread(target=_forward, args=(read_end, real),
                                 name="shardsmith-stderr-filter", daemon=True)
    forwarder.start()
    python_stderr = sys.stderr
    if os.isatty(real):
        # Writes still go through the filter, but whoever asks (the progress
        # bar) still learns that stderr is a terminal.
        sys.stderr = _TerminalStderr(python_stderr)
    try:
        yield
    finally:
        if isinstance(sys.stderr, _TerminalStderr):
            sys.stderr = python_stderr
        sys.stderr.flush()
        # The last write end closes (unless a child process still holds
        # one): the forwarder drains the pipe and stops.
        os.dup2(real, 2)
        forwarder.join(_JOIN_TIMEOUT_S)
        os.close(real)


class _TerminalStderr:
    """Python's stderr (now writing into the filter) that still says it is a terminal."""

    def __init__(self, stream):
        self._stream = stream

    def isatty(self) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _forward(read_end: int, real: int) -> None:
    pending = b""
    panics = _PanicBlocks()
    # The start of the line being read was chatter, forwarded (dropped) alone: libtiff's
    # handler writes "Module: " and its message apart, and on a loaded machine the message
    # came after the wait, alone on a line no pattern knows (issue 39's mutation run).
    in_dropped_line = False
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], _PARTIAL_WAIT_S if pending else None)
            if not ready:  # A partial line, and nothing after it for a while.
                _write(real, panics.flush())
                if not in_dropped_line:
                    in_dropped_line = is_native_noise(pending)
                    _write(real, pending)
                pending = b""
                continue
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = re.split(rb"(?<=[\r\n])", pending)
            for line in lines:
                if in_dropped_line:  # The rest of a line of chatter.
                    in_dropped_line = False
                    continue
                for out in panics.lines(line):
                    _write(real, out)
        _write(real, panics.flush())
        _write(real, pending)
    finally:
        os.close(read_end)


def _write(fd: int, line: bytes) -> None:
    if not line or is_native_noise(line):
        return
    view = memoryview(line)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:  # The real stderr went away: nothing left to tell.
        pass
