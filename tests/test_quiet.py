"""The commands print shardsmith's lines, not TensorFlow's or libjpeg's C++ chatter.

The C++ lines are written straight to file descriptor 2; conversion.console
filters it while an entry point runs. The tests run the real commands in new
processes, with `--verbose` as the control that shows the lines do occur.
"""

import concurrent.futures
import contextlib
import io
import os
import pathlib
import re
import subprocess
import sys

import pytest
from PIL import Image

from helpers import interpreters_at_once, make_class_tree, write

from conversion import console

_REPO = pathlib.Path(__file__).resolve().parent.parent
_NOISE = re.compile(
    r"absl::InitializeLog|^[IWE]\d{4} \d\d:\d\d:|oneDNN custom operations|Premature end of JPEG"
    r"|Corrupt JPEG data", re.M)


def _run(*args: str, verbose_env: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in (console.VERBOSE_ENV, "TF_CPP_MIN_LOG_LEVEL", "PYTEST_CURRENT_TEST")}
    if verbose_env:
        env[console.VERBOSE_ENV] = "1"
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=_REPO,
                          env=env, timeout=300)


def _jpeg(seed: int) -> bytes:
    image = Image.effect_noise((48, 40), 40 + seed).convert("RGB")
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def noisy_folder(tmp_path_factory) -> pathlib.Path:
    """Good JPEGs, a truncated one (TensorFlow logs 'Premature end') and one with
    bytes before its end marker (libjpeg prints 'Corrupt JPEG data')."""
    root = tmp_path_factory.mktemp("noisy")
    for label in ("cat", "dog"):
        (root / label).mkdir()
        for i in range(4):
            (root / label / f"{i}.jpg").write_bytes(_jpeg(i + (10 if label == "dog" else 0)))
    good = _jpeg(99)
    (root / "cat" / "truncated.jpg").write_bytes(good[: len(good) * 2 // 3])
    (root / "dog" / "extraneous.jpg").write_bytes(good[:-2] + b"\x55" * 40 + good[-2:])
    return root


def _convert(folder, out, *extra, verbose_env=False):
    return _run("-m", "shardsmith", "convert", "--input_dir", str(folder), "--output_dir",
                str(out), "--max_reject_fraction", "0.5", "--overwrite", *extra,
                verbose_env=verbose_env)


@pytest.fixture(scope="module")
def runs(noisy_folder, tmp_path_factory):
    """(`run`, folder): `run(name)` is the CompletedProcess of one command of this file.

    The commands start together, a few at a time: each is a new process that
    imports TensorFlow (seconds). 'verify' reads the dataset of 'quiet' (the
    default convert) once it is written, and 'preview' reads it after 'verify'.
    """
    out = tmp_path_factory.mktemp("runs")
    with concurrent.futures.ThreadPoolExecutor(max_workers=interpreters_at_once()) as pool:
        futures = {
            "loud": pool.submit(_convert, noisy_folder, out / "loud", "--verbose"),
            "quiet": pool.submit(_convert, noisy_folder, out / "quiet"),
            "env": pool.submit(_convert, noisy_folder, out / "env", verbose_env=True),
        }

        def after(name, *args):
            # `name` was submitted before, so it is running or done: waiting cannot deadlock.
            futures[name].result()
            return _run(*args)

        futures["verify"] = pool.submit(after, "quiet", "-m", "shardsmith", "verify",
                                        str(out / "quiet"))
        futures["preview"] = pool.submit(after, "verify", "-m", "shardsmith", "preview",
                                         str(out / "quiet"), "--output", str(out / "p.png"))
        # Run as a program, Beam is imported before `main`: its notice must not show either.
        futures["verify_program"] = pool.submit(after, "quiet", "-m", "beam_jobs.verify",
                                                str(out / "quiet"))
        yield (lambda name: futures[name].result()), out


def test_convert_is_quiet_and_verbose_shows_the_lines(runs):
    run, _ = runs
    loud = run("loud")
    assert loud.returncode == 0, loud.stderr
    # The fact the test relies on: this TensorFlow and libjpeg do print them.
    assert _NOISE.search(loud.stderr), loud.stderr
    quiet = run("quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert _NOISE.search(quiet.stderr) is None, quiet.stderr
    assert "Converted 9 images" in quiet.stderr and "rejected 1 (corrupt 1)" in quiet.stderr
    assert "apitools" not in quiet.stderr
    # Nothing but shardsmith's own lines: the plan, one per shard, the summary.
    strangers = [line for line in quiet.stderr.splitlines()
                 if line.strip() and not line.startswith(("Found ", "Wrote ", "Converted "))]
    assert strangers == [], quiet.stderr


def test_the_environment_variable_asks_for_the_lines_too(runs):
    loud = runs[0]("env")
    assert loud.returncode == 0 and _NOISE.search(loud.stderr), loud.stderr


def test_verify_puts_the_verdict_on_stdout_and_preview_is_quiet(runs):
    run, out = runs
    assert run("quiet").returncode == 0
    verified = run("verify")
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("OK: 9 records")
    assert _NOISE.search(verified.stderr) is None, verified.stderr
    preview = run("preview")
    assert preview.returncode == 0, preview.stderr
    assert preview.stdout.split() == [str(out / "p.png"), str(out / "p_counts.png")]
    assert _NOISE.search(preview.stderr) is None, preview.stderr


def test_the_filter_drops_only_the_chatter():
    # Written to file descriptor 2 as C++ does; the real line and a
    # progress-style partial line pass, in order, before the entry point returns.
    code = (
        "import os, sys\n"
        "from conversion import console\n"
        "with console.entry_point([]):\n"
        "    os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are"
        " written to STDERR\\n')\n"
        "    os.write(2, b'I0000 00:00:1796130937.671886   31678 cpu_feature_guard.cc:227] This"
        " TensorFlow binary is optimized\\n')\n"
        "    os.write(2, b'a real line\\nCorrupt JPEG data: 35 extraneous bytes before marker"
        " 0xd9\\n')\n"
        "    print('from python', file=sys.stderr)\n"
        "    os.write(2, b'\\rprogress 50%')\n"
        "os.write(2, b'|after')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=_REPO,
                          timeout=120)  # Bytes: text mode would turn the \r into \n.
    assert proc.returncode == 0
    assert proc.stderr == b"a real line\nfrom python\n\rprogress 50%|after"


def test_chatter_written_in_two_parts_is_dropped_whole():
    """Found by bench.mutations_convert (issue 39), on a loaded machine: libtiff's handler writes
    "TIFFScanlineSize64: " and "Invalid YCbCr subsampling." apart; the second part came after the
    filter's wait for the rest of a partial line, and reached the console alone."""
    code = (
        "import os, time\n"
        "from conversion import console\n"
        "with console.entry_point([]):\n"
        "    os.write(2, b'TIFFScanlineSize64: ')\n"
        "    time.sleep(0.5)\n"  # Longer than the filter waits for the rest of a partial line.
        "    os.write(2, b'Invalid YC')\n"
        "    time.sleep(0.5)\n"
        "    os.write(2, b'bCr subsampling.\\na real line\\n')\n"
        "    os.write(2, b'\\rprogress 50%')\n"
        "    time.sleep(0.5)\n"
        "    os.write(2, b' done\\n')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=_REPO, timeout=120)
    assert proc.returncode == 0
    assert proc.stderr == b"a real line\n\rprogress 50% done\n"


@pytest.mark.parametrize("line, noise", [
    (b"E0000 00:00:1796130939.307951   31861 jpeg_mem.cc:331] Premature end of JPEG data.\n", True),
    (b"W0000 00:00:1796130939.310633   31861 local_rendezvous.cc:412] Local rendezvous\n", True),
    (b"2024-05-01 10:00:00.123456: I tensorflow/core/util/port.cc:113] oneDNN custom\n", True),
    (b"Premature end of JPEG file\n", True),
    (b"Converted 7 images into 8 shards (train 7)\n", False),
    (b"Traceback (most recent call last):\n", False),
    (b"F0000 00:00:1796130939.307951   31861 x.cc:1] Check failed\n", False),  # Fatal: kept.
    # libjpeg's errors and libtiff's handler, as DICOM codecs and libtiff print them (issue 39).
    (b"Bogus marker length\n", True),
    (b"Quantization table 0x00 was not defined\n", True),
    (b"Improper call to JPEG library in state 203\n", True),
    (b"TIFFFillStrip: Read error on strip 2; got 795 bytes, expected 1813.\n", True),
    (b"JPEGLib: Not a JPEG file: starts with 0xff 0xd9.\n", True),
    # Found by bench.mutations_convert's 2,000 images (issue 39): libjpeg's and libtiff's.
    (b"Maximum supported image dimension is 65500 pixels\n", True),
    (b"Input file read error\n", True),
    (b"Read error on strip 0; got 81 bytes, expected 1820.\n", True),
    (b'_TIFFVSetField: tempfile.tif: Bad value 0 for "ResolutionUnit" tag.\n', True),
    (b"JPEGPreDecode: Improper JPEG sampling factors.\n", True),
    (b"Bogus sampling factors\n", True),  # libjpeg's JERR_BAD_SAMPLING, by a DICOM codec (issue 39).
    (b'Incorrect count for "PlanarConfiguration".\n', True),  # A body whose "Module: " came apart.
    (b"Invalid YCbCr subsampling.\n", True),
    (b"Bogus: a file name of a user's\n", False),
])
def test_what_counts_as_chatter(line, noise):
    assert console.is_native_noise(line) is noise


def test_on_a_terminal_the_progress_bar_still_draws():
    # stderr becomes a pipe into the filter; code asking whether stderr is a
    # terminal (the progress bar) must still hear yes when it is one.
    import pty

    code = ("import os, sys\n"
            "from conversion import console\n"
            "from conversion.progress import ProgressBar\n"
            "print(ProgressBar.wanted(), end=' ')\n"  # The control: a terminal, before.
            "with console.entry_point([]):\n"
            "    print(ProgressBar.wanted(), end=' ')\n"
            "print(type(sys.stderr).__name__)\n")
    terminal, child_side = pty.openpty()
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("CI", console.VERBOSE_ENV)}
        proc = subprocess.run([sys.executable, "-c", code], stderr=child_side,
                              stdout=subprocess.PIPE, text=True, env=env, cwd=_REPO, timeout=120)
    finally:
        os.close(child_side)
        os.close(terminal)
    assert proc.stdout == "True True TextIOWrapper\n"


# What the libraries that read rasters say about them: tifffile's logger, numpy's
# RuntimeWarnings (an infinite band's statistics), Beam's import-time notice.
_LIBRARY_NOISE = re.compile(r"TiffTag|invalid value offset|RuntimeWarning|apitools not found")


@pytest.fixture(scope="module")
def raster_runs(tmp_path_factory):
    """(`run`, out): the commands of a folder of TIFFs that tifffile and numpy complain about."""
    import numpy as np
    from helpers import tiff_with_bad_tag

    root = tmp_path_factory.mktemp("rasters")
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (root / label).mkdir()
        for i in range(3):
            bands = rng.integers(0, 65535, (16, 16, 4), dtype=np.uint16)
            (root / label / f"{i}.tif").write_bytes(tiff_with_bad_tag(bands))
    infinite = np.full((8, 8, 2), np.nan, np.float32)
    infinite[..., 1] = np.inf
    import tifffile

    tifffile.imwrite(root / "b" / "infinite.tif", infinite, photometric="minisblack",
                     planarconfig="contig")
    out = tmp_path_factory.mktemp("raster_runs")

    def beam(name, *extra):
        return _run("-m", "beam_jobs.convert", "--input_dir", str(root), "--output_dir",
                    str(out / name), "--overwrite", *extra)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        futures = {
            "beam": pool.submit(beam, "beam"),
            "beam_loud": pool.submit(beam, "beam_loud", "--verbose"),
            "shardsmith": pool.submit(_convert, root, out / "shardsmith"),
        }
        yield (lambda name: futures[name].result()), out


def test_library_warnings_stay_off_the_console_of_both_commands(raster_runs):
    run, _ = raster_runs
    loud = run("beam_loud")
    assert loud.returncode == 0, loud.stderr
    # The facts relied on: these files make tifffile, numpy and Beam say so.
    for text in ("invalid value offset", "RuntimeWarning", "apitools not found"):
        assert text in loud.stderr, loud.stderr
    for name in ("beam", "shardsmith"):
        quiet = run(name)
        assert quiet.returncode == 0, quiet.stderr
        assert "Converted 7 images" in quiet.stderr
        assert _LIBRARY_NOISE.search(quiet.stderr) is None, quiet.stderr
        assert _NOISE.search(quiet.stderr) is None, quiet.stderr


def test_verify_run_as_a_program_is_quiet_too(runs):
    run, _ = runs
    verified = run("verify_program")
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("OK: 9 records")
    assert _LIBRARY_NOISE.search(verified.stderr) is None, verified.stderr
    assert _NOISE.search(verified.stderr) is None, verified.stderr


def test_what_tifffile_said_is_in_the_files_details(raster_runs):
    import json

    run, out = raster_runs
    assert run("beam").returncode == 0
    lines = [json.loads(line) for line in (out / "beam" / "normalized.jsonl").read_text().splitlines()]
    noted = {line["path"]: line["details"].get("warnings") for line in lines}
    assert len(noted) == 7
    for path, notes in noted.items():
        if path.endswith("infinite.tif"):
            assert notes is None  # tifffile had nothing to say about it.
        else:
            assert notes and "invalid value offset" in notes[0], (path, notes)


@contextlib.contextmanager
def _cpu_burners(count: int = 3):
    """`count` processes that spin on the CPU for the block: a busy machine, on purpose.

    Beam's runner failed other bundles as it stopped after the first failure,
    and printed their tracebacks (`KeyError: 'bundle_10'`), 1 run in 8 on a
    busy machine and never on a quiet one: the test makes the machine busy.
    """
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


# The busy machine for one of the two commands: they run the same pipeline, whose runner's race
# the burners bring out, and the burners' spinning slows the rest of the suite as much as this test.
@pytest.mark.parametrize(("command", "busy"), [(["-m", "beam_jobs.convert"], False),
                                               (["-m", "shardsmith", "convert"], True)])
def test_a_failed_reject_budget_is_one_sentence_not_beams_tracebacks(tmp_path, command, busy):
    root = tmp_path / "images"
    make_class_tree(root, classes=("a", "b"), per_class=3)
    write(root / "b" / "broken.jpg", b"\xff\xd8\xff not a jpeg")
    with _cpu_burners() if busy else contextlib.nullcontext():
        proc = _run(*command, "--input_dir", str(root), "--output_dir", str(tmp_path / "out"))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "error: 1 of 7 images were rejected, more than --max_reject_fraction=0.1" in proc.stderr
    # --verbose shows what Beam printed.
    verbose = _run(*command, "--input_dir", str(root), "--output_dir", str(tmp_path / "out2"), "--verbose")
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr


def test_a_rust_decoders_panic_block_is_dropped_and_what_follows_is_kept():
    """pylibjpeg-rle panics on damaged RLE streams; pyo3 turns the panic into the file's reject."""
    panics = console._PanicBlocks()
    lines = [b"\n", b"thread '<unnamed>' panicked at src/lib.rs:520:20:\n",
             b"index out of bounds: the len is 8192 but the index is 8192\n", b"stack backtrace:\n",
             b"   0: __rustc::rust_begin_unwind\n", b"             at ./nptl/pthread_create.c:442:8\n",
             b"note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n",
             b"Converted 282 images into 24 shards\n", b"   0: a user's own indented line\n"]
    kept = [out for line in lines for out in panics.lines(line)] + [panics.flush()]
    assert kept == [b"Converted 282 images into 24 shards\n", b"   0: a user's own indented line\n", b""]
    # A blank line that opens no panic block is written, before what follows it.
    assert [out for line in (b"\n", b"\n", b"text\n") for out in panics.lines(line)] == [b"\n", b"\n", b"text\n"]


# A program that does, inside an entry point, what Beam's SDK worker does for a bundle that fails
# (sdk_worker.py, `_execute`: prints its traceback on sys.stderr, then logs it at ERROR), once
# before a real Ctrl-C (SIGINT to itself) and once after it, while the runner stops.
_INTERRUPTED_PROGRAM = """
import logging, os, signal, sys, time
from conversion import console

def bundle_fails(name):
    text = ('Traceback (most recent call last):\\n  File "/x/apache_beam/runners/worker/sdk_worker.py", '
            f'line 596, in release\\nKeyError: {name!r}\\n')
    print(text, file=sys.stderr)
    logging.getLogger("apache_beam.runners.worker.sdk_worker").error(
        "Error processing instruction %s. Original traceback is\\n%s\\n", name, text)

with console.entry_point(sys.argv[1:]):
    bundle_fails("bundle_before")
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    except KeyboardInterrupt:
        bundle_fails("bundle_after")
        print("interrupted: one sentence", file=sys.stderr)
print("handler back:", signal.getsignal(signal.SIGINT) is signal.default_int_handler, file=sys.stderr)
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_after_ctrl_c_beams_failing_bundles_are_not_printed(verbose):
    """Ctrl-C as a conversion's last shards were written: Beam's runner, stopping, failed bundles
    still running and printed their tracebacks (`KeyError: 'bundle_6'`; 2 runs in 12 on a busy
    machine) before the command's own "interrupted: ..." sentence (issue 48's CI run)."""
    proc = _run("-c", _INTERRUPTED_PROGRAM, *(["--verbose"] if verbose else []))
    assert proc.returncode == 0, proc.stderr
    # A bundle failing before any interrupt is news: printed and logged, as before.
    assert proc.stderr.count("KeyError: 'bundle_before'") == 2, proc.stderr
    assert "interrupted: one sentence" in proc.stderr
    # After it, its consequences are dropped (shown with --verbose).
    assert proc.stderr.count("KeyError: 'bundle_after'") == (2 if verbose else 0), proc.stderr
    # The handler is Python's own again once the entry point ends.
    assert "handler back: True" in proc.stderr, proc.stderr
