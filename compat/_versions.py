"""The tested version range of a library, checked when its internals are used."""

from __future__ import annotations

import functools
import importlib.metadata
import re

__all__ = ["UntestedVersion", "check_version", "release"]


class UntestedVersion(RuntimeError):
    """The installed library is outside the range shardsmith's compatibility code was tested on."""


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: '2.21.0rc1' -> (2, 21, 0)."""
    match = re.match(r"\d+(\.\d+)*", version)
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in match.group(0).split("."))


@functools.lru_cache(maxsize=None)
def installed_version(*distributions: str) -> str | None:
    """The version of the first of `distributions` that is installed, or None.

    One import package may come from several distributions (`tensorflow` from
    tensorflow, tensorflow-cpu, ...), so callers name them all. Asking by
    name reads one metadata file; asking which distribution provides a
    package would read every installed distribution's file list (0.5 s).
    """
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_version(package: str, version: str | None, tested: tuple[str, str], what: str) -> None:
    """Raises UntestedVersion unless `tested[0] <= version < tested[1]`.

    Args:
      package: The library's import name, for the message.
      version: Its installed version (None: unknown, also refused).
      tested: The lowest tested release and the first untested one.
      what: What relies on the internals, for the message.
    """
    low, high = tested
    if version is not None and release(low) <= release(version) < release(high):
        return
    raise UntestedVersion(
        f"{what} relies on private internals of {package}, tested with "
        f"{package}>={low},<{high}; installed: {version or 'unknown version'}. "
        f"Install a tested {package} (pip install '{package}>={low},<{high}'), or report "
        "the version at the shardsmith issue tracker."
    )
