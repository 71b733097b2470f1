"""The `shardsmith` command: convert, verify, inspect, preview, serve-data, doctor.

  shardsmith convert --input_dir ./photos --output_dir ./dataset --split train=0.8,validation=0.2
  shardsmith verify ./dataset
  shardsmith inspect ./dataset
  shardsmith preview ./dataset --split train --output preview.png
  shardsmith serve-data --port 5050 --workers 2
  shardsmith doctor ./dataset --model model.keras --batch_size 64

`python -m beam_jobs.convert` and `python -m beam_jobs.verify` keep working for
Beam users; this command adds nothing but one entry point and help texts.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

__all__ = ["main", "run", "command_help", "print_help_if_asked"]

# The examples of convert and verify live with their pipelines, which print
# the same help for `python -m beam_jobs.convert|verify --help`.
_EXAMPLES = {
    "inspect": """\
        example:
          shardsmith inspect ./dataset""",
    "preview": """\
        example:
          shardsmith preview ./dataset --split train --output train_preview.png""",
    "serve-data": """\
        examples:
          shardsmith serve-data --port 5050 --workers 2     # dispatcher + 2 local workers
          shardsmith serve-data --dispatcher host1:5050     # a worker joining it""",
    "doctor": """\
        examples:
          shardsmith doctor ./dataset --model model.keras --batch_size 64
          shardsmith doctor ./dataset --model train:make_model --image_size 160""",
}

_SUMMARIES = {
    "convert": "Convert a folder of images into a sharded TFRecord dataset.",
    "verify": "Re-read every shard, record and image against the manifest.",
    "inspect": "Print splits, shards, classes, rejects and warnings of a dataset.",
    "preview": "Write a contact sheet and class-count charts of a dataset as PNG.",
    "serve-data": "Run the tf.data service (dispatcher, workers) that readers can read through.",
    "doctor": "Measure whether a model's training steps wait for the reader, and why.",
}


def _add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    from conversion import console

    parser.add_argument("dataset_dir", help="Folder written by the converter.")
    parser.add_argument(console.VERBOSE_FLAG, action="store_true", help=console.VERBOSE_HELP)


def _add_preview_arguments(parser: argparse.ArgumentParser) -> None:
    from shardsmith.preview import add_arguments

    add_arguments(parser)


def _add_serve_data_arguments(parser: argparse.ArgumentParser) -> None:
    from shardsmith.serve_data import add_arguments

    add_arguments(parser)


def _add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    from shardsmith.doctor import add_arguments

    add_arguments(parser)


_ADD_ARGUMENTS = {"inspect": _add_inspect_arguments, "preview": _add_preview_arguments,
                  "serve-data": _add_serve_data_arguments,
                  "doctor": _add_doctor_arguments}


def command_help(command: str) -> str:
    """The help text of `shardsmith COMMAND --help`, with its options and an example."""
    if command == "convert":
        from beam_jobs.convert import help_text
    elif command == "verify":
        from beam_jobs.verify import help_text
    else:
        from beam_jobs import args

        def help_text():
            return args.help_text(f"shardsmith {command}", _SUMMARIES[command], _EXAMPLES[command],
                                   _ADD_ARGUMENTS[command])
    return help_text()


def print_help_if_asked(command: str, argv: list[str]) -> bool:
    """Prints `command`'s help and returns True when argv asks for it (-h, --help)."""
    if "-h" in argv or "--help" in argv:
        print(command_help(command))
        return True
    return False


def _check_options(command: str, argv: list[str]) -> str | None:
    """The one-line error for an option `inspect` or `preview` does not take, else None.

    convert and verify check their own arguments (Beam's options included).
    """
    from beam_jobs import args

    parser = argparse.ArgumentParser(add_help=False)
    _ADD_ARGUMENTS[command](parser)
    try:
        args.check_arguments(parser, argv)
    except args.UsageError as e:
        return f"shardsmith {command}: error: {e}"
    return None


def _version() -> str:
    from schemas import __version__

    return f"shardsmith {__version__}"


def main(argv: list[str] | None = None) -> int:
    """`shardsmith COMMAND ...`: runs the command, returns its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from conversion import console

    # Before the commands' modules import Beam and TensorFlow, which log as they load.
    with console.entry_point(argv):
        return _main(argv)


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "--version":
        print(_version())
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in _SUMMARIES:
        lines = ["usage: shardsmith [--version] {" + ",".join(_SUMMARIES) + "} ...", ""]
        lines += [f"  {name:<10} {text}" for name, text in _SUMMARIES.items()]
        lines += ["", "`shardsmith COMMAND --help` shows the options and an example."]
        if argv and argv[0] not in ("-h", "--help"):
            print(f"shardsmith: unknown command {argv[0]!r}\n", file=sys.stderr)
            print("\n".join(lines), file=sys.stderr)
            return 2
        print("\n".join(lines))
        return 0
    command, rest = argv[0], argv[1:]
    if print_help_if_asked(command, rest):
        return 0
    volume_folder = _volume_dataset(command, rest)
    if volume_folder is not None:
        # A `convert --volumes` dataset (volumes.json): its own inspect and preview (verify checks
        # every kind of dataset itself: sha256, each record parsed, damaged records named).
        from shardsmith import volumes as _volumes

        return _volumes.main(command, volume_folder)
    if command in _ADD_ARGUMENTS:
        error = _check_options(command, rest)
        if error is not None:
            print(error, file=sys.stderr)
            return 2
    if command == "convert":
        # Imports Beam itself, when its run needs it (`beam_jobs._startup`).
        from beam_jobs.convert import main as run
    elif command == "verify":
        from beam_jobs.verify import main as run
    elif command == "inspect":
        from shardsmith.inspection import main as run
    elif command == "serve-data":
        from shardsmith.serve_data import main as run
    elif command == "doctor":
        from shardsmith.doctor import main as run
    else:
        from shardsmith.preview import main as run
    if command != "convert":
        return run(rest)
    try:
        code = run(rest)
    except KeyboardInterrupt:  # Where no supervising process took it (guard.supervise).
        code = _INTERRUPTED
    if code == _INTERRUPTED:
        print(_interrupted_sentence(rest), file=sys.stderr)
    return code


# The exit status of a command ended by Ctrl-C (128 + SIGINT), as a shell reports it.
_INTERRUPTED = 130


def _interrupted_sentence(argv: list[str]) -> str:
    """What an interrupted conversion kept, and the command that goes on from there.

    The finished shards are the shard files in the output folder (each is
    renamed there once written); the planned ones are the shard plans the
    driver wrote into its temporary folder (none yet: interrupted while
    listing or planning).
    """
    import shlex

    from conversion.files import TMP_DIRNAME
    from conversion.shard_plans import PLANS_DIRNAME
    from schemas.manifest import SHARD_FILENAME_RE, is_url

    out = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--output_dir"),
               next((a.split("=", 1)[1] for a in argv if a.startswith("--output_dir=")), None))
    again = ["shardsmith", "convert", *(a for a in argv if a != "--overwrite")]
    if "--resume" not in again:
        again.append("--resume")
    if out is None or is_url(out) or not os.path.isdir(out):
        kept = "nothing was written"
    else:
        done = sum(1 for name in os.listdir(out)
                   if (m := SHARD_FILENAME_RE.match(name)) and m["ext"] == "tfrecord")
        plans = os.path.join(out, TMP_DIRNAME, PLANS_DIRNAME)
        planned = len(os.listdir(plans)) if os.path.isdir(plans) else 0
        kept = (f"{done:,} of {planned:,} shards finished, kept in {out}" if planned
                else f"{done:,} shards finished, kept in {out}")
    return f"shardsmith convert: interrupted: {kept}. To go on: {shlex.join(again)}"


def _volume_dataset(command: str, rest: list[str]) -> str | None:
    """The folder of `inspect` or `preview` when it holds a volume dataset, else None."""
    from shardsmith.volumes import is_volume_dataset

    folder = None
    if command in ("inspect", "preview"):
        positional = [a for a in rest if not a.startswith("-")]
        folder = positional[0] if positional else None
    return folder if folder is not None and is_volume_dataset(folder) else None


def _quiet_threads_after_ctrl_c() -> None:
    """After Ctrl-C, the exceptions of other threads go unsaid: the command's one line says it all.

    A pipeline interrupted while it runs (`verify`, `convert`) is torn down by
    its runner, and the threads of Beam's local workers then fail reading
    streams that closed under them ("Exception in thread
    read_grpc_client_inputs", a gRPC traceback each). The SIGINT handler
    notes the interrupt before it raises KeyboardInterrupt in the main thread,
    so those failures, which come later, are known for what they are. Set by
    the program's entry point only (nothing a library import does).
    """
    interrupted = threading.Event()
    shown = threading.excepthook

    def on_interrupt(signum, frame):
        interrupted.set()
        signal.default_int_handler(signum, frame)

    def thread_failed(args):
        if not interrupted.is_set():
            shown(args)

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_interrupt)
    threading.excepthook = thread_failed


def run() -> None:
    """The `shardsmith` program: `main` on the command line's arguments, then the exit.

    The installed command's entry point; the process ends without the
    interpreter's teardown (`conversion.console.exit_program`).
    """
    from conversion import console

    _quiet_threads_after_ctrl_c()
    try:
        code = main()
        sys.stdout.flush()
    except KeyboardInterrupt:
        # Ctrl-C in a command that reads (verify, inspect, preview, doctor, serve-data): one
        # line and the shell's status, not Python's traceback (`convert` says what it kept).
        command = next((a for a in sys.argv[1:2] if a in _SUMMARIES), None)
        print(f"shardsmith{' ' + command if command else ''}: interrupted.", file=sys.stderr)
        code = _INTERRUPTED
    except BrokenPipeError:
        # Whoever read stdout stopped (`shardsmith inspect DS | head`): nothing is left to
        # say, and nothing more may be written there, not even at exit (Python's docs,
        # "Note on SIGPIPE").
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 1
    console.exit_program(code)


if __name__ == "__main__":
    run()
