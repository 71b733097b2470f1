"""`--resume` on a finished dataset: the shards damaged since (their bytes differ from the manifest), written again.

A shard damaged after the conversion (a flipped bit on a disk, a copy cut
short, a bucket object replaced) is found as `shardsmith verify` finds it:
its size or sha256, or its index file's, differs from the manifest. Its
planned files (the plan is the same for the same input and options) are
written again by the shard writer into the output's temporary folder; the
new shard replaces the damaged one only if its bytes are the manifest's,
so that nothing else (the manifest, the other shards, rejects.jsonl)
changes. Files that crashed or hung a process in the conversion (listed in
rejects.jsonl) are not read again. The mend runs supervised, as a conversion
does (`recovery.supervise`): a file that crashes, hangs or outgrows its
process now is quarantined, and the mend goes on without it; a shard that
held one of its records is left as it was, and named. Beam-free.
"""

from __future__ import annotations

import hashlib
import json
import logging

import schemas
from conversion import guard
from conversion.files import TMP_DIRNAME, exists, join, open_to_read, read_bytes, remove_tree, write_atomically
from conversion.examples import kind_for, write_shard
from conversion.planning import build_plan
from conversion.shard_maker import shard_file
from conversion.shard_writer import ShardJob, default_threads

__all__ = ["damaged_shards", "mend"]

_LOG = logging.getLogger("shardsmith.convert")
_MEND_DIRNAME = "mend"


def _sha256_and_size(path: str) -> tuple[str, int] | None:
    """The sha256 and size of a file; None if it cannot be read."""
    sha = hashlib.sha256()
    size = 0
    try:
        with open_to_read(path) as f:
            while chunk := f.read(1 << 22):
                sha.update(chunk)
                size += len(chunk)
    except OSError:
        return None
    return sha.hexdigest(), size


def damaged_shards(output_dir: str, manifest: schemas.Manifest) -> dict[str, str]:
    """shard file -> what is wrong, for each shard of `manifest` whose bytes or index differ from it."""
    damaged = {}
    for info in manifest.splits.values():
        for shard in info.shards:
            found = _sha256_and_size(join(output_dir, shard.file))
            if found is None:
                damaged[shard.file] = "missing or unreadable"
            elif found[1] != shard.num_bytes:
                damaged[shard.file] = f"{found[1]} bytes, the manifest says {shard.num_bytes}"
            elif found[0] != shard.sha256:
                damaged[shard.file] = "sha256 differs from the manifest"
            elif shard.index_file:
                index = _sha256_and_size(join(output_dir, shard.index_file))
                if index is None or index[0] != shard.index_sha256:
                    damaged[shard.file] = f"its index file {shard.index_file} is missing or differs"
    return damaged


def mend(config, manifest: schemas.Manifest, damaged: dict[str, str], targets_of) -> list[str]:
    """Writes the `damaged` shards again from their sources; returns the problems (empty: all mended).

    Args:
      config: The conversion's `ConversionConfig` (the same options as the finished run's).
      manifest: The finished dataset's manifest.
      damaged: `damaged_shards`'s answer.
      targets_of: The kinds of target of a plan's records (the conversion's own function).
    """
    # Files that crashed, hung or outgrew a process of this mend (`recovery.supervise`, which runs
    # it again without them): quarantined in the output's temporary folder, read by the planner too.
    fresh = guard.Quarantine(guard.quarantine_path(config.output_dir)).load()
    plan = build_plan(config)
    failed = {**_failed_files(config.output_dir), **fresh}
    # What its kind's shard writers read beside their files (a volume's or a location's plan).
    kind_for(config.validation).prepare_output(plan, config)
    by_name: dict[str, list] = {}
    for f in plan.files:
        by_name.setdefault(schemas.shard_filename(f.split, f.shard, f.num_shards), []).append(f)
    shards = {s.file: s for info in manifest.splits.values() for s in info.shards}
    for name, volume in (plan.volumes or {}).items():
        # A volume is planned under its own name, and rejects.jsonl lists each of its files: one
        # that crashed or hung a worker puts the whole volume out of reach of this process too.
        hit = next((failed[source] for source in volume.sources if source in failed), None)
        if hit is not None:
            failed.setdefault(name, hit)
    folder = join(config.output_dir, TMP_DIRNAME, _MEND_DIRNAME)
    targets = targets_of(plan)
    problems = []
    for name, what in sorted(damaged.items()):
        files = sorted(by_name.get(name, ()))
        if not files:
            problems.append(f"{name} ({what}): the input no longer plans files into it")
            continue
        job = ShardJob(
            output_dir=folder, split=files[0].split, index=files[0].shard, num_shards=files[0].num_shards,
            name=name, files=tuple(shard_file(f) for f in files), num_classes=len(plan.class_names),
            validation=config.validation, threads=config.writing.worker_threads or default_threads(),
            quarantined=tuple((f.rel_path, *failed[f.rel_path]) for f in files if f.rel_path in failed),
            targets=targets)
        write_shard(job)
        shard = shards[name]
        new = join(folder, name)
        if _sha256_and_size(new) != (shard.sha256, shard.num_bytes):
            lost = [f.rel_path for f in files if f.rel_path in fresh]
            if lost:
                problems.append(f"{name} ({what}): left as it was: " + "; ".join(
                    f"{path} failed while it was read again ({fresh[path][0]}: {fresh[path][1]})" for path in lost))
                continue
            problems.append(f"{name} ({what}): written again from its sources, its bytes differ from the "
                            "manifest's (the sources or the options changed); --overwrite converts it all again")
            continue
        write_atomically(config.output_dir, name, read_bytes(new))
        index = join(config.output_dir, shard.index_file) if shard.index_file else None
        if index is not None and (_sha256_and_size(index) or (None,))[0] != shard.index_sha256:
            write_atomically(config.output_dir, shard.index_file, read_bytes(join(folder, shard.index_file)))
        _LOG.warning("Mended %s (%s): written again from its %d planned files, the manifest's bytes.",
                     name, what, len(files))
    # A finished dataset has no temporary folder: none is left.
    remove_tree(join(config.output_dir, TMP_DIRNAME))
    return problems


def _failed_files(output_dir: str) -> dict[str, tuple[str, str]]:
    """rel_path -> (reason, message) of the files shardsmith or a decoder failed on (rejects.jsonl)."""
    path = join(output_dir, schemas.REJECTS_FILENAME)
    if not exists(path):
        return {}
    found = {}
    # Lines end at "\n" only: a message may hold U+0085 or U+2028 (`append.earlier_rejects`).
    for line in read_bytes(path).decode("utf-8", "surrogateescape").split("\n"):
        if line.strip():
            r = json.loads(line)
            if r.get("reason") in guard.FAILURE_REASONS:
                found[r["path"]] = (r["reason"], r.get("message", ""))
    return found

