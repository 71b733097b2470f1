"""The `shardsmith` command: convert, verify, inspect, preview.

  shardsmith convert --input_dir ./photos --output_dir ./dataset --split train=0.8,validation=0.2
  shardsmith verify ./dataset
  shardsmith inspect ./dataset
  shardsmith preview ./dataset --split train --output preview.png

`python -m beam_jobs.convert` and `python -m beam_jobs.verify` keep working for
Beam users; this command adds nothing but one entry point and help texts.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

__all__ = ["main", "command_help", "print_help_if_asked"]

_EXAMPLES = {
    "convert": """\
        example:
          shardsmith convert --input_dir ./photos --output_dir ./dataset \\
              --split train=0.8,validation=0.1,test=0.1

        Every Beam option works too (--runner DataflowRunner --project ... --setup_file ./setup.py).""",
    "verify": """\
        example:
          shardsmith verify ./dataset
          shardsmith verify gs://bucket/dataset --runner DataflowRunner ... --setup_file ./setup.py""",
    "inspect": """\
        example:
          shardsmith inspect ./dataset""",
    "preview": """\
        example:
          shardsmith preview ./dataset --split train --output train_preview.png""",
}

_SUMMARIES = {
    "convert": "Convert a folder of images into a sharded TFRecord dataset.",
    "verify": "Re-read every shard, record and image against the manifest.",
    "inspect": "Print splits, shards, classes, rejects and warnings of a dataset.",
    "preview": "Write a contact sheet and class-count charts of a dataset as PNG.",
}


def command_help(command: str) -> str:
    """The help text of `shardsmith COMMAND --help`, with its options and an example."""
    parser = argparse.ArgumentParser(
        prog=f"shardsmith {command}",
        description=_SUMMARIES[command],
        epilog=textwrap.dedent(_EXAMPLES[command]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    if command in ("convert", "verify"):
        from beam_jobs import _runner
    if command == "convert":
        from beam_jobs.convert import ConvertOptions

        ConvertOptions._add_argparse_args(parser)  # The options' own help texts.
        _runner.ConsoleOptions._add_argparse_args(parser)
    elif command == "verify":
        from beam_jobs.verify import VerifyOptions

        parser.add_argument("dataset_dir", help="Folder written by the converter.")
        VerifyOptions._add_argparse_args(parser)
        _runner.ConsoleOptions._add_argparse_args(parser)
    elif command == "inspect":
        parser.add_argument("dataset_dir", help="Folder written by the converter.")
    else:
        from readers.preview import add_arguments

        add_arguments(parser)
    return parser.format_help()


def print_help_if_asked(command: str, argv: list[str]) -> bool:
    """Prints `command`'s help and returns True when argv asks for it (-h, --help)."""
    if "-h" in argv or "--help" in argv:
        print(command_help(command))
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    """`shardsmith COMMAND ...`: runs the command, returns its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from shardsmith import console

    # Before the commands' modules import Beam and TensorFlow, which log as they load.
    with console.entry_point(argv):
        return _main(argv)


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in _SUMMARIES:
        lines = ["usage: shardsmith {convert,verify,inspect,preview} ...", ""]
        lines += [f"  {name:<8} {text}" for name, text in _SUMMARIES.items()]
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
    if command == "convert":
        from beam_jobs.convert import main as run
    elif command == "verify":
        from beam_jobs.verify import main as run
    elif command == "inspect":
        from shardsmith.inspection import main as run
    else:
        from readers.preview import main as run
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
