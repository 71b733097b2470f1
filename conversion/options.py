"""The option groups of the parts of a conversion that need no Beam: sharding, writing, --split.

Frozen values that check themselves, naming the flag they come from;
`conversion.config.ConversionConfig` holds them, built once from the command line.
"""

from __future__ import annotations

import dataclasses
import math
import re

from conversion.plan import SPLIT_ALIASES

__all__ = ["ShardingOptions", "WritingOptions", "parse_split"]


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

    def __post_init__(self):
        if isinstance(self.file_timeout, bool) or not isinstance(self.file_timeout, (int, float)) \
                or not self.file_timeout > 0:
            raise ValueError(f"--file_timeout must be a number of seconds above 0. Received: {self.file_timeout!r}")
        if self.worker_threads is not None and self.worker_threads < 1:
            raise ValueError(f"--worker_threads must be at least 1. Received: {self.worker_threads}")
        if self.worker_processes is not None and (
                isinstance(self.worker_processes, bool) or not isinstance(self.worker_processes, int)
                or self.worker_processes < 0):
            raise ValueError(
                "--worker_processes must be 0 (the runner's own threads) or more processes. "
                f"Received: {self.worker_processes!r}"
            )


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
        ratios[name] = ratio
    if not math.isclose(sum(ratios.values()), 1.0, abs_tol=1e-6):
        raise ValueError(f"--split ratios must add up to 1. Received: {text!r} (sum {sum(ratios.values()):g})")
    return ratios
