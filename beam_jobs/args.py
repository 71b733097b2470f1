"""Command-line arguments of the pipelines: strict parsing, suggestions, help.

Beam's `PipelineOptions` parses what it knows and drops the rest with a
warning ("Discarding unparseable args"), so a mistyped `--num_shard 2` would
give a job that runs with the default. Here every argument must be an option
of the pipeline or one Beam declares (`--runner`, `--project`,
`--direct_num_workers`, `--dask_client_address`, ...); anything else is a
`UsageError` that suggests the nearest option.
"""

from __future__ import annotations

# Beam is imported by the functions that need it: `print_help_if_asked` and
# `check_arguments` run before a command has decided how to import it.
import argparse
import difflib
import importlib
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions

__all__ = ["UsageError", "pipeline_options", "check_arguments", "help_text", "print_help_if_asked"]

# Beam modules that declare their runner's options when imported; imported
# only when an argument is unknown without them (Dask's costs ~0.6 s).
_RUNNER_OPTION_MODULES = ("apache_beam.runners.dask.dask_runner",)
# Options classes of this project: one pipeline's options are not another's,
# except those of a class that says it serves every pipeline
# (`SHARED_BY_ALL_PIPELINES = True`, e.g. `_runner.ConsoleOptions`).
_OWN_PACKAGE = "beam_jobs."


class UsageError(ValueError):
    """An argument no option takes (the command exits 2)."""


def pipeline_options(argv: list[str], own: type[PipelineOptions]) -> PipelineOptions:
    """`PipelineOptions(argv)` after checking every argument is `own`'s or Beam's.

    Raises:
      UsageError: Naming each unknown argument, with the nearest option.
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    unknown, known = _unknown(argv, own)
    if unknown:
        for module in _RUNNER_OPTION_MODULES:
            try:
                importlib.import_module(module)
            except ImportError:
                continue  # That runner is not installed: its options stay unknown.
        unknown, known = _unknown(argv, own)
    if unknown:
        raise UsageError(_describe(unknown, _option_strings(own), known))
    return PipelineOptions(argv)


def check_arguments(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Checks argv against a plain argparse parser's options, with suggestions, and its values.

    Raises:
      UsageError: Naming each unknown option, with the nearest one; or a
        value of the wrong type, or a missing argument.
    """
    known = sorted(s for action in parser._actions for s in action.option_strings)
    unknown = [a for a in argv if a.startswith("-") and not _is_number(a)
               and a.split("=", 1)[0] not in known]
    if unknown:
        raise UsageError(_describe(unknown, known, known))
    # Values of the wrong type, missing arguments: one sentence, not argparse's usage and exit.
    error = parser.error
    parser.error = _raise_usage_error
    try:
        parser.parse_args(argv)
    finally:
        parser.error = error


def _is_number(text: str) -> bool:
    # argparse takes '-1' for a value, not an option, when no option looks like one.
    try:
        float(text)
    except ValueError:
        return False
    return True


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The example kept as written, and each option's default shown (unless its help says it)."""

    def _get_help_string(self, action):
        text = action.help or ""
        # By identity: a default of 0 is shown, None and False (flags) are not.
        shown = not (action.default is None or action.default is False
                     or action.default in (argparse.SUPPRESS, ""))
        if shown and action.option_strings and "default" not in text.lower():
            text += " (default: %(default)s)"
        return text


def help_text(prog: str, description: str, epilog: str, add_arguments, required=()) -> str:
    """The `--help` text of a command: its options (as `add_arguments` adds them) and an example.

    Args:
      required: Options the command cannot run without (Beam's options are
        all optional to its parser; the pipeline checks them): shown without
        brackets in the usage line and marked "Required." in their help.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=textwrap.dedent(epilog),
        formatter_class=_HelpFormatter,
        add_help=False,
    )
    add_arguments(parser)
    for action in parser._actions:
        if any(name in required for name in action.option_strings):
            action.required = True
            action.help = f"Required. {action.help or ''}".strip()
    return parser.format_help()


def print_help_if_asked(argv: list[str], text) -> bool:
    """Prints `text()` and returns True when argv asks for help (-h, --help)."""
    if "-h" in argv or "--help" in argv:
        print(text())
        return True
    return False


def _unknown(argv: list[str], own: type[PipelineOptions]) -> tuple[list[str], list[str]]:
    """(unknown arguments, option strings Beam and `own` accept) of argv."""
    from apache_beam.options.pipeline_options import PipelineOptions

    found = {}

    def capture(parser):
        # Beam's parser, with the options of every registered PipelineOptions
        # subclass: what Beam itself would parse. A value of the wrong type
        # raises here, before Beam's own parse would print its whole usage
        # (~150 lines of every runner's options) and exit.
        parser.error = _raise_usage_error
        _, found["unknown"] = parser.parse_known_args(argv)
        found["known"] = {s for action in parser._actions for s in action.option_strings}

    # retain_unknown_options: Beam keeps what it does not know instead of
    # logging that it discards it; this check reports them instead.
    PipelineOptions(argv).get_all_options(add_extra_args_fn=capture, retain_unknown_options=True)
    foreign = set()
    for cls in PipelineOptions.__subclasses__():
        if (cls is not own and cls.__module__.startswith(_OWN_PACKAGE)
                and not getattr(cls, "SHARED_BY_ALL_PIPELINES", False)):
            foreign |= _option_strings(cls)
    foreign -= _option_strings(own)
    unknown = list(found["unknown"])
    unknown += [a for a in argv if a.split("=", 1)[0] in foreign]
    return unknown, sorted(found["known"] - foreign)


def _raise_usage_error(message: str):
    """An argparse parser's `error`: a UsageError of one sentence instead of usage and exit.

    argparse says "argument --seed/-s: invalid int value: 'x'"; the option's
    first name is enough.
    """
    if message.startswith("argument "):
        name, _, rest = message[len("argument "):].partition(": ")
        message = f"{name.split('/')[0]}: {rest}"
    raise UsageError(message)


def _option_strings(cls: type[PipelineOptions]) -> set[str]:
    parser = argparse.ArgumentParser(add_help=False)
    cls._add_argparse_args(parser)
    return {s for action in parser._actions for s in action.option_strings}


def _describe(unknown: list[str], preferred, known) -> str:
    """'unknown option --num_shard (did you mean --num_shards?)', one clause per argument."""
    clauses = []
    previous_is_flag = False
    for arg in unknown:
        if not arg.startswith("-"):
            if not previous_is_flag:
                clauses.append(f"unexpected argument {arg!r}")
            previous_is_flag = False  # The value of the unknown flag before it.
            continue
        name = arg.split("=", 1)[0]
        previous_is_flag = "=" not in arg
        match = (difflib.get_close_matches(name, sorted(preferred), n=1, cutoff=0.6)
                 or difflib.get_close_matches(name, known, n=1, cutoff=0.6))
        clauses.append(f"unknown option {name}" + (f" (did you mean {match[0]}?)" if match else ""))
    return "; ".join(dict.fromkeys(clauses)) + ". See --help for the options."

