"""What a command does before it imports Beam (Beam-free; imported by the entry points first).

`import apache_beam` is the first and largest cost of every command (~1 s of
CPU, before anything else runs). A run that touches no remote system imports
it without the clients of remote systems it would never use
(`compat.beam_internals.import_without_remote_clients`).
"""

from __future__ import annotations

__all__ = ["import_beam"]

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
    if any("://" in a for a in argv):
        return False
    for i, a in enumerate(argv):
        if a == "--runner":
            if i + 1 >= len(argv) or argv[i + 1] not in _LOCAL_RUNNERS:
                return False
        elif a.startswith("--runner=") and a.split("=", 1)[1] not in _LOCAL_RUNNERS:
            return False
    return True
