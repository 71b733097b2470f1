"""The option groups of the parts of a conversion that need no Beam: sharding, writing, --split.

Frozen values that check themselves, naming the flag they come from;
`conversion.config.ConversionConfig` holds them, built once from the command line.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re

from conversion.plan import SPLIT_ALIASES

__all__ = ["ShardingOptions", "WritingOptions", "parse_split", "parse_memory"]


@dataclasses.dataclass(frozen=True)
class ShardingOptions:
    """How many shards each split gets.

    Attributes:
      num_shards: Shards per split (--num_shards); None chooses by size.
      target_shard_mb: Shard size to aim for, in MiB (--target_shard_mb).
      min_shards: Fewest shards per split, when it has that many images
        (--min_shards), so readers can read in parallel.

    Raises:
      ValueError: Naming the flag, what it allows and what it received.
    """

    num_shards: int | None = None
    target_shard_mb: int = 128
    min_shards: int = 8

    def __post_init__(self):
        if self.num_shards is not None and self.num_shards < 1:
            raise ValueError(f"--num_shards must be at least 1. Received: {self.num_shards}")
        if self.target_shard_mb < 1:
            raise ValueError(f"--target_shard_mb must be at least 1. Received: {self.target_shard_mb}")
        if self.min_shards < 1:
            raise ValueError(f"--min_shards must be at least 1. Received: {self.min_shards}")

    @property
    def target_shard_bytes(self) -> int:
        return self.target_shard_mb << 20

    def to_json(self) -> dict:
        """The manifest's `shard_policy`."""
        if self.num_shards:
            return {"num_shards": self.num_shards}
        return {"target_shard_mb": self.target_shard_mb, "min_shards": self.min_shards}


@dataclasses.dataclass(frozen=True)
class WritingOptions:
    """How the shard writers work.

    Attributes:
      dedup: Keep one copy of identical files, the smallest path (--dedup).
      resume: Keep the shards an interrupted run finished (--resume).
      worker_threads: Threads of each shard writer that read and validate
        files ahead (--worker_threads); None: min(4, cores of the worker) in
        the runner's threads, none in a worker process (which has no other
        Python thread to share the GIL with). Speed only: the output bytes
        do not depend on it.
      worker_processes: Processes that write shards, one shard at a time
        each (--worker_processes); 0 writes them in the runner's own
        threads; None lets the conversion choose (`beam_jobs.convert.run`: every core
        on the local runner for a large enough folder). Speed only.
      file_timeout: Seconds one file may take to read and validate before
        its process is stopped and the file rejected as 'timeout'
        (--file_timeout).
      file_memory: Bytes of resident memory a process may hold while it
        reads a file before it is stopped and the file rejected as
        'too_large' (--file_memory); None: `guard.default_file_memory()`,
        a few GiB or the machine's share (`memory_bound`).
      isolated: With no `worker_processes`, each of the runner's workers
        still writes its shards in child processes of its own, one per
        thread, so that a decoder that crashes or hangs costs its file and
        not the worker (the conversion sets it on a Dask cluster).
      version: The dataset version whose shards this run writes: 1 for a
        conversion, 2, 3, ... for each `--append` (it names the shards,
        `schemas.shard_filename`, so that they never take an older one's name).

    Raises:
      ValueError: Naming the flag, what it allows and what it received.
    """

    dedup: bool = False
    resume: bool = False
    worker_threads: int | None = None
    worker_processes: int | None = None
    file_timeout: float = 600.0
    isolated: bool = False
    version: int = 1
    file_memory: int | None = None

    def __post_init__(self):
        if isinstance(self.file_timeout, bool) or not isinstance(self.file_timeout, (int, float)) \
                or not self.file_timeout > 0:
            raise ValueError(f"--file_timeout must be a number of seconds above 0. Received: {self.file_timeout!r}")
        if self.file_memory is not None and (isinstance(self.file_memory, bool) or not isinstance(
                self.file_memory, int) or self.file_memory < _MIN_FILE_MEMORY):
            raise ValueError(f"--file_memory must be a size of at least 64MiB (e.g. 4GiB, 512MiB). "
                             f"Received: {self.file_memory!r}")
        if self.worker_threads is not None and self.worker_threads < 1:
            raise ValueError(f"--worker_threads must be at least 1. Received: {self.worker_threads}")
        if self.worker_processes is not None and (
                isinstance(self.worker_processes, bool) or not isinstance(self.worker_processes, int)
                or self.worker_processes < 0):
            raise ValueError(
                "--worker_processes must be 0 (the runner's own threads) or more processes. "
                f"Received: {self.worker_processes!r}"
            )


    @property
    def memory_bound(self) -> int:
        """--file_memory in bytes, or its default for this machine."""
        if self.file_memory is not None:
            return self.file_memory
        from conversion import guard

        return guard.default_file_memory()


_MIN_FILE_MEMORY = 64 << 20
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
               "tib": 1 << 40}


def parse_memory(text: str | None) -> int | None:
    """Parses --file_memory ('4GiB', '512MiB', '2G', or bytes) into bytes; None stays None.

    Units are powers of 1024 whether written GB or GiB (as memory is counted).

    Raises:
      ValueError: Naming the flag, what it allows and what it received.
    """
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"--file_memory must be a size such as 4GiB or 512MiB. Received: {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


_LONG_SPLIT_NAMES = sorted(name for name in SPLIT_ALIASES if len(name) >= 5)


def _misspelt_split(name: str) -> str | None:
    """The known split name that `name` is probably a typo of ('valdation'), else None.

    A split of any other name is kept (a user's 'holdout'), so a typo would
    silently become a split that no trainer asks for. Names that only add a
    number to a known one ('test_2') are meant as written.
    """
    if name in SPLIT_ALIASES or name.rstrip("0123456789_") in SPLIT_ALIASES:
        return None
    # Against the long names only: near 'val' or 'test' lie names meant as they are ('eval',
    # 'tests').
    close = difflib.get_close_matches(name, _LONG_SPLIT_NAMES, n=1, cutoff=0.8)
    return close[0] if close else None


def parse_split(text: str) -> dict[str, float]:
    """Parses --split 'train=0.8,validation=0.2' into {split: ratio}.

    Raises:
      ValueError: For a malformed text or ratios that do not add up to 1.
    """
    ratios: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        name = SPLIT_ALIASES.get(name, name)
        try:
            ratio = float(value)
        except ValueError:
            ratio = -1.0
        if not sep or not re.fullmatch(r"[a-z0-9_]+", name) or not 0 <= ratio <= 1 or name in ratios:
            raise ValueError(
                "--split must look like train=0.8,validation=0.1,test=0.1 (names of letters, "
                f"digits and _, each ratio in [0, 1], each name once). Received: {text!r}"
            )
        typo = _misspelt_split(name)
        if typo is not None:
            raise ValueError(
                f"--split: {name!r} looks like a misspelling of {typo!r}, and would make a split of "
                f"its own (known names: {', '.join(sorted(SPLIT_ALIASES))}; other names, such as "
                f"holdout=0.1 or eval=0.1, are kept as written). Received: {text!r}"
            )
        ratios[name] = ratio
    if not math.isclose(sum(ratios.values()), 1.0, abs_tol=1e-6):
        raise ValueError(f"--split ratios must add up to 1. Received: {text!r} (sum {sum(ratios.values()):g})")
    return ratios
