"""What a command does before it imports Beam (Beam-free; imported by the entry points first).

`import apache_beam` is the first and largest cost of every command (~1 s of
CPU, on one core, before anything else runs). A run that touches no remote
system imports it without the clients of remote systems it would never use
(`compat.beam_internals.import_without_remote_clients`). A plain local
conversion reads its arguments without Beam (`early_config`): it lists and
plans its input, and starts its shard writers, before the import, which then
runs on one core while they load their decoders and write on the other.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["import_beam", "early_config"]

# Beam's local runner, by the names `--runner` takes for it.
_LOCAL_RUNNERS = ("DirectRunner", "direct")


def import_beam(argv: list[str]) -> None:
    """Imports Beam for the command of `argv`: without its remote clients where the run is local.

    Local: no argument names a URL (`gs://`, `s3://`, ...: an input, an
    output, a temp or staging location) and the runner, if named, is Beam's
    local one. Anything else imports Beam whole.
    """
    if _is_local(argv):
        from compat import beam_internals

        beam_internals.import_without_remote_clients()
    import apache_beam  # noqa: F401 (whole, if not imported above)


def _is_local(argv: list[str]) -> bool:
    from schemas.manifest import is_url

    if any(is_url(a) for a in argv):
        return False
    for i, a in enumerate(argv):
        if a == "--runner":
            if i + 1 >= len(argv) or argv[i + 1] not in _LOCAL_RUNNERS:
                return False
        elif a.startswith("--runner=") and a.split("=", 1)[1] not in _LOCAL_RUNNERS:
            return False
    return True


class _NotPlain(Exception):
    """An argument the Beam-free parser does not take: the run reads its options with Beam."""


def _refuse(message: str):
    raise _NotPlain(message)


def early_config(argv: list[str]):
    """The `ConversionConfig` of a plain local conversion, read from `argv` without Beam; else None.

    Plain: Beam not imported yet (in a program or a test that imported it,
    nothing is gained), a local run (`_is_local`), every argument one of the
    conversion's flags or --verbose, spelled out (no abbreviation, no Beam
    option, no --help), and a conversion of its own: not --append, --resume or
    --dedup (their shards are known only once the output folder or the
    pipeline has said). For anything else, and for any argument the config
    refuses, None: the run reads its options with Beam, as before, and says
    what is wrong in the same words.
    """
    if "apache_beam" in sys.modules or not _is_local(argv) or "-h" in argv or "--help" in argv:
        return None
    from conversion.flags import add_flags
    from conversion import console
    from conversion.config import ConversionConfig

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_flags(parser)
    parser.add_argument(console.VERBOSE_FLAG, action="store_true")
    parser.error = _refuse  # Not argparse's usage and exit: the run with Beam says it.
    try:
        flags, unknown = parser.parse_known_args(argv)
        if unknown:
            return None
        config = ConversionConfig.from_flags(flags)
    except (_NotPlain, ValueError, OSError):
        return None
    writing = config.writing
    if config.append or writing.resume or writing.dedup:
        return None
    return config
