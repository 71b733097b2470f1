"""conversion.console.exit_program: a program's end without the interpreter's teardown, nothing lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_PROGRAM = textwrap.dedent("""
    import atexit, logging, sys, threading, time
    from conversion import console

    out = sys.argv[1]
    atexit.register(lambda: open(out + ".atexit", "w").write("ran"))
    handler = logging.FileHandler(out + ".log")
    logging.getLogger("t").addHandler(handler)
    logging.getLogger("t").warning("last words")
    sys.stdout.write("buffered, not flushed")
    if sys.argv[2] == "thread":
        def late():
            time.sleep(0.5)
            open(out + ".thread", "w").write("finished")
        threading.Thread(target=late).start()
    console.exit_program(int(sys.argv[3]))
    open(out + ".after", "w").write("exit_program returned")
""")


@pytest.mark.parametrize("thread", ["none", "thread"])
@pytest.mark.parametrize("code", [0, 3])
def test_exit_program_keeps_the_status_exit_handlers_logs_and_output(tmp_path, thread, code):
    out = str(tmp_path / "run")
    result = subprocess.run([sys.executable, "-c", _PROGRAM, out, thread, str(code)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == code, result.stderr
    assert result.stdout == "buffered, not flushed"
    assert (tmp_path / "run.atexit").read_text() == "ran"
    assert (tmp_path / "run.log").read_text() == "last words\n"
    assert not (tmp_path / "run.after").exists()
    # A running non-daemon thread: the usual exit, which waits for it.
    assert (tmp_path / "run.thread").exists() == (thread == "thread")
