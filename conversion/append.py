"""Appending to a dataset (`convert --append`): what the output already holds, what a run adds.

A dataset that grows keeps, beside its manifest, one inventory per version,
`inputs-v00001.jsonl`, `inputs-v00002.jsonl`, ...: one line per input file the
version converted (its path relative to the input folder, size, modification
time, SHA-256 of its bytes, split). An append lists the input folder and sorts
every file into one of four groups (`sort_listing`):

- new: no version holds its path: converted into the new version's shards;
- held: held, and unchanged (same size and modification time, or same bytes);
- changed: held, but its bytes differ: not rewritten, reported;
- (a held path the listing no longer finds is reported as missing_from_input).

A version whose inventory is missing (a dataset converted without --append,
before it grew) is rebuilt once from its shards' records (their `filename`
feature) and the input files as they are then (`rebuild_inventory`).

An inventory is written before the manifest that names its version, and is
read only for the versions the manifest names (`load_base`): a run killed in
between leaves an inventory that no reader takes into account, and the next
append writes it again. Beam-free.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import schemas
from conversion import files as _files, targets as _targets

__all__ = ["INPUTS_FILE_RE", "REPORT_FILENAME", "HeldFile", "Base", "Listing", "inputs_filename", "load_base", "read_inventory", "earlier_rejects",
           "rebuild_inventory", "sort_listing", "sort_locations", "location_digests", "fill_unknown_locations", "content_hashes", "inventory_text", "check_compatible",
           "check_features", "fill_unknown", "fill_labels", "amended", "duplicates_of_held", "version_files"]

_LOG = logging.getLogger("shardsmith.convert")

_INPUTS_TEMPLATE = "inputs-v{version:05d}.jsonl"
INPUTS_FILE_RE = re.compile(r"^inputs-v(?P<version>\d{5})\.jsonl$")
# What the last append found: its new, changed and missing inputs, by path (rewritten by each).
REPORT_FILENAME = "append_report.json"
# A record's filename is its input's relative path, and for one of several records of
# a file a mark after it (`conversion.shard_writer`: '#frame=', '#page=', '#patch='); a
# volume's, its series folder and, for one of several volumes of it, '#series=' or '#stack='.
_RECORD_MARK = re.compile(r"#(?:frame|page|patch|patch_rows|patch_columns|series|stack)=.*$")
_HASH_THREADS = 8
# Options that decide which records a file gives and how they look: an append
# with another value would make the dataset two datasets (manifest option, flag).
_FIXED_OPTIONS = (
    ("seed", "--seed"),
    ("split", "--split"),
    ("group_by", "--group_by"),
    ("labels", "--labels_csv"),
    ("background", "--background"),
    ("dicom", "--dicom_window, --dicom_bit_depth, --dicom_frames or --dicom_tags"),
    ("resize", "--max_side, --min_side or --jpeg_quality"),
    ("raster", "--raster_bands, --raster_dtype, --raster_range, --raster_pages, --raster_georef or --raster_patch"),
    ("time_series", "--time_series or --bands"),
)


def inputs_filename(version: int) -> str:
    """The inventory file of dataset version `version`."""
    return _INPUTS_TEMPLATE.format(version=version)


class HeldFile(NamedTuple):
    """An input file a version converted, as it was then (a named tuple: a dataset holds 100,000s).

    Attributes:
      rel_path: Its path relative to the input folder.
      size: Its size in bytes (-1: unknown, its file was gone when the inventory was rebuilt).
      mtime_ns: Its modification time in nanoseconds (0: unknown).
      sha256: The SHA-256 of its bytes (None: unknown).
      split: The split its records are in.
      version: The version that converted it.
      label: A series unit's class name (--volumes; None: not recorded, an inventory
        written before labels were, or an image's: its record holds it).
      contents: A series unit's volumes (--volumes --dedup): record filename to the
        SHA-256 of its content (`conversion.volumes.content_digests`); None: not recorded.
    """

    rel_path: str
    size: int
    mtime_ns: int
    sha256: str | None
    split: str
    version: int
    label: str | None = None
    contents: Mapping[str, str] | None = None

    def to_json(self) -> str:
        entry = {"path": self.rel_path, "size": self.size, "mtime_ns": self.mtime_ns, "sha256": self.sha256,
                 "split": self.split}
        # Only where known: an image's line stays as it was.
        if self.label is not None:
            entry["label"] = self.label
        if self.contents is not None:
            entry["contents"] = dict(self.contents)
        return json.dumps(entry, sort_keys=True, ensure_ascii=True)

    @classmethod
    def from_json(cls, line: str, version: int) -> HeldFile:
        return cls.from_dict(json.loads(line), version)

    @classmethod
    def from_dict(cls, d: Mapping, version: int) -> HeldFile:
        return cls(str(d["path"]), int(d["size"]), int(d["mtime_ns"]), d.get("sha256"), str(d["split"]), version,
                   d.get("label"), d.get("contents"))


def read_inventory(text: str, version: int) -> tuple[HeldFile, ...]:
    """The entries of version `version`'s inventory file (`inventory_text`), parsed as one JSON array."""
    lines = [line for line in text.splitlines() if line]
    from_dict = HeldFile.from_dict
    return tuple(from_dict(d, version) for d in json.loads("[" + ",".join(lines) + "]"))


def inventory_text(held: Iterable[HeldFile], sources: Mapping[str, Sequence[str]] | None = None) -> bytes:
    """The inventory file's bytes: one JSON line per file, sorted by path.

    `sources`: for the pending inventory of an example made of several files (a
    series unit, `conversion.append_run`), its path to those files, as a "sources"
    key that `conversion.finalize` reads (an example whose every file was
    rejected is held by no version) and leaves out of the inventory it writes.
    """
    held = sorted(held, key=lambda h: os.fsencode(h.rel_path))
    if not sources:
        return "".join(h.to_json() + "\n" for h in held).encode()
    lines = []
    for h in held:
        entry = json.loads(h.to_json())
        if h.rel_path in sources:
            entry["sources"] = sorted(sources[h.rel_path], key=os.fsencode)
        lines.append(json.dumps(entry, sort_keys=True, ensure_ascii=True) + "\n")
    return "".join(lines).encode()


@dataclasses.dataclass(frozen=True)
class Base:
    """What an output folder holds before an append.

    Attributes:
      manifest: Its manifest (the latest complete version).
      held: Relative path to its `HeldFile`, of every version.
      version: The number the new version gets (the latest's + 1).
      rebuilt: Versions whose inventory is written again with the new version's:
        version to its files. One missing, rebuilt from its shards; or one
        completed by this append (labels, content digests: `fill_labels`, `amended`).
      rejected: The inputs the latest version rejected or skipped (its
        rejects.jsonl), by path as written there, to their reason: held by no
        version, an append tries them again (`earlier_rejects`).
    """

    manifest: schemas.Manifest
    held: Mapping[str, HeldFile]
    version: int
    rebuilt: Mapping[int, tuple[HeldFile, ...]] = dataclasses.field(default_factory=dict)
    rejected: Mapping[str, str] = dataclasses.field(default_factory=dict)


def load_base(output_dir: str) -> Base | None:
    """The dataset in `output_dir` to append to; None when it holds none (no manifest).

    Raises:
      schemas.ManifestError: For a manifest that does not read.
    """
    path = _files.join(output_dir, schemas.MANIFEST_FILENAME)
    if not _files.exists(path):
        return None
    manifest = schemas.Manifest.from_json(_files.read_bytes(path).decode(), path)
    held: dict[str, HeldFile] = {}
    rebuilt = {}
    for v in manifest.all_versions:
        inventory = _files.join(output_dir, inputs_filename(v.version))
        if _files.exists(inventory):
            entries = read_inventory(_files.read_bytes(inventory).decode(), v.version)
        else:
            entries = rebuild_inventory(output_dir, manifest, v.version)
            rebuilt[v.version] = entries
        for h in entries:
            held[h.rel_path] = h
    return Base(manifest, held, manifest.latest_version + 1, rebuilt, earlier_rejects(output_dir, manifest))


def earlier_rejects(output_dir: str, manifest: schemas.Manifest) -> dict[str, str]:
    """Path (as rejects.jsonl writes it) to reason of the inputs the dataset's latest version did not convert.

    rejects.jsonl is rewritten by each version: it holds the latest version's
    rejects, among them every earlier reject tried again and rejected again.
    One whose reasons do not add up to the manifest's was written by a run
    that did not finish (its manifest not written): not this dataset's, {}.
    """
    path = _files.join(output_dir, schemas.REJECTS_FILENAME)
    if not _files.exists(path):
        return {}
    found, reasons = {}, collections.Counter()
    # Lines end at "\n" only: a message may hold U+0085 (a damaged DICOM UID's byte) or U+2028,
    # written as they are, which str.splitlines splits at (found by bench.mutations_convert).
    for line in _files.read_bytes(path).decode("utf-8", "surrogateescape").split("\n"):
        if line.strip():
            r = json.loads(line)
            found[r["path"]] = r["reason"]
            reasons[r["reason"]] += 1
    if dict(reasons) != dict(manifest.rejects):
        _LOG.info("%s is not the one of %s's manifest (a run killed before its manifest wrote it): earlier "
                  "rejects tried again are counted as new", path, output_dir)
        return {}
    return found


def version_files(manifest: schemas.Manifest, version: int) -> list[tuple[str, str]]:
    """(split, shard file) of the shards version `version` wrote."""
    v = manifest.all_versions[version - 1]
    return [(split, f) for split, shard_files in sorted(v.shards.items()) for f in shard_files]


def rebuild_inventory(output_dir: str, manifest: schemas.Manifest, version: int,
                      input_dir: str | None = None) -> tuple[HeldFile, ...]:
    """The inventory of a version written without one, from its shards' records.

    Each record's `filename` names its input (a mark after '#' for one of
    several records of a file is dropped). Sizes, times and hashes are those of
    the input files now, filled in by `fill_from_input`; until then unknown.
    """
    paths: dict[str, str] = {}
    for split, path, _ in _records_of(output_dir, manifest, version):
        paths.setdefault(path, split)
    _LOG.info("Version %d of %s has no %s: its %s inputs read from its shards' records (once)", version,
              output_dir, inputs_filename(version), f"{len(paths):,}")
    return tuple(HeldFile(p, -1, 0, None, s, version) for p, s in sorted(paths.items()))


def _records_of(output_dir: str, manifest: schemas.Manifest, version: int):
    """(split, input path, label index or None) of each record version `version` wrote, from its shards.

    The input path is the record's `filename` without its mark (`_RECORD_MARK`).
    """
    from schemas.features import FILENAME, LABEL
    from schemas.tf_runtime import example_pb2
    from schemas.tfrecord import iter_records

    example = example_pb2().Example()
    for split, shard in version_files(manifest, version):
        with _files.open_to_read(_files.join(output_dir, shard)) as f:
            for _, _, data in iter_records(f, shard):
                example.ParseFromString(data)
                feature = example.features.feature
                name = feature[FILENAME.key].bytes_list.value[0].decode("utf-8", "surrogateescape")
                label = feature[LABEL.key].int64_list.value if LABEL.key in feature else ()
                yield split, _RECORD_MARK.sub("", name), (label[0] if label else None)


def fill_labels(base: Base, output_dir: str) -> Base:
    """`base` with the class name of every held entry that lacks one, read once from its version's records.

    For a volume dataset whose inventories were written before they held
    labels (or rebuilt from shards): an append with --labels_csv compares
    them with the CSV. The versions completed are added to `rebuilt`, to be
    written again with the new version's inventory (the next append reads them).
    """
    versions = sorted({h.version for h in base.held.values() if h.label is None})
    if not versions:
        return base
    names = base.manifest.class_names
    found = []
    for version in versions:
        labels = {path: names[label] for _, path, label in _records_of(output_dir, base.manifest, version)
                  if label is not None and 0 <= label < len(names)}
        found += [h._replace(label=labels[h.rel_path]) for h in base.held.values()
                  if h.version == version and h.label is None and h.rel_path in labels]
        _LOG.info("Version %d of %s: the labels of its inputs read from its shards' records (once)", version,
                  output_dir)
    return amended(base, found)


def amended(base: Base, entries: Iterable[HeldFile]) -> Base:
    """`base` with `entries` replacing held ones, their versions' inventories to be written again (`rebuilt`)."""
    held, rebuilt = dict(base.held), dict(base.rebuilt)
    versions = set()
    for h in entries:
        held[h.rel_path] = h
        versions.add(h.version)
    for version in versions:
        rebuilt[version] = tuple(sorted((h for h in held.values() if h.version == version),
                                        key=lambda h: os.fsencode(h.rel_path)))
    return dataclasses.replace(base, held=held, rebuilt=rebuilt)


@dataclasses.dataclass(frozen=True)
class Listing:
    """The listed input files sorted against what the dataset holds (`sort_listing`).

    Attributes:
      new: The listed files no version holds (`listing.InputFile`s), in listing order.
      held: Relative paths held and unchanged.
      changed: Relative paths held whose bytes differ now (not rewritten).
      missing: Relative paths held that the listing no longer finds.
      stats: Relative path to (size, mtime_ns, sha256 or None) of the new
        files, and of the held files it looked at again.
    """

    new: tuple
    held: tuple[str, ...]
    changed: tuple[str, ...]
    missing: tuple[str, ...]
    stats: Mapping[str, tuple[int, int, str | None]]


def _mtime_ns(path: str) -> int:
    """A local file's modification time in nanoseconds; 0 for a URL or a file gone."""
    if not _files.is_local(path):
        return 0
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _listed_mtime_ns(f) -> int:
    """A listed file's modification time: the listing's (no second stat of every held file), else `_mtime_ns`."""
    return getattr(f, "mtime_ns", 0) or _mtime_ns(f.path)


def _sha256(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with _files.open_to_read(path) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None  # The shard writer reads it again and says why.
    return h.hexdigest()


def content_hashes(files: Sequence) -> dict[str, tuple[int, int, str | None]]:
    """Relative path to (size, mtime_ns, SHA-256) of listed files, read on a few threads (I/O bound)."""

    def some(chunk):
        return [(f.rel_path, (f.size, _listed_mtime_ns(f), _sha256(f.path))) for f in chunk]

    # A few dozen files a task: one future per tiny file costs as much as its hash.
    files = list(files)
    size = max(1, min(64, len(files) // (4 * _HASH_THREADS)))
    with concurrent.futures.ThreadPoolExecutor(_HASH_THREADS) as pool:
        return dict(pair for pairs in pool.map(some, [files[i:i + size] for i in range(0, len(files), size)])
                    for pair in pairs)


def sort_listing(files: Sequence, base: Base) -> Listing:
    """Sorts listed files into new, held, changed, and the held ones missing from the listing.

    A held file is unchanged when its size and modification time are those
    recorded (as rsync and make decide), or, when only its time differs, when
    its bytes hash the same. A held file whose recorded size is unknown (an
    inventory rebuilt from shards) is taken as unchanged, and recorded as it
    is now.
    """
    held_map = base.held
    new, held, look = [], [], []
    listed = set()
    for f in files:
        listed.add(f.rel_path)
        h = held_map.get(f.rel_path)
        if h is None:
            new.append(f)
        elif h.size >= 0 and f.size != h.size:
            look.append(f)
        elif h.size < 0 or _listed_mtime_ns(f) in (h.mtime_ns, 0):
            held.append(f.rel_path)
        else:
            look.append(f)
    stats = content_hashes([*new, *look])
    changed = []
    for f in look:
        h = held_map[f.rel_path]
        if f.size == h.size and h.sha256 is not None and stats[f.rel_path][2] == h.sha256:
            held.append(f.rel_path)
        else:
            changed.append(f.rel_path)
    missing = sorted((p for p in held_map if p not in listed), key=os.fsencode)
    return Listing(tuple(new), tuple(sorted(held, key=os.fsencode)), tuple(sorted(changed, key=os.fsencode)),
                   tuple(missing), stats)


def sort_locations(files: Sequence, base: Base, location_of, is_member) -> Listing:
    """`sort_listing` for --time_series, whose examples are locations (folders of dated passes).

    A location's record stacks all its passes, so a location is held, new or
    changed as a whole: held when its passes (names and sizes) are those the
    inventory recorded, changed when a pass came, went or changed size (its
    record is not rewritten: convert the grown folder with --overwrite to add
    the pass), new when no version holds it. A location's inventory entry
    holds its passes' total size and, as its "sha256", the SHA-256 of their
    sorted names and sizes (`location_digests`).

    Args:
      files: The listed files (`listing.InputFile`s).
      base: The dataset.
      location_of: Relative path of a file -> its location.
      is_member: Whether a listed file is one of a location's passes (a
        raster); the others are new files (each run rejects them again).
    """
    digests = location_digests(files, location_of, is_member)
    held_map = base.held
    new, held, changed = [], [], []
    for f in files:
        loc = location_of(f.rel_path) if is_member(f.rel_path) else None
        if loc is None or loc not in held_map:
            new.append(f)
    for loc, (size, digest) in digests.items():
        h = held_map.get(loc)
        if h is None:
            continue
        if h.sha256 is None or (h.size == size and h.sha256 == digest):
            held.append(loc)
        else:
            changed.append(loc)
    missing = sorted((p for p in held_map if p not in digests), key=os.fsencode)
    stats = {loc: (size, 0, digest) for loc, (size, digest) in digests.items() if loc not in held_map}
    return Listing(tuple(new), tuple(sorted(held, key=os.fsencode)), tuple(sorted(changed, key=os.fsencode)),
                   tuple(missing), stats)


def location_digests(files: Sequence, location_of, is_member) -> dict[str, tuple[int, str]]:
    """Location -> (total size, SHA-256 of its passes' sorted relative paths and sizes)."""
    members: dict[str, list] = {}
    for f in files:
        if is_member(f.rel_path):
            members.setdefault(location_of(f.rel_path), []).append((os.fsencode(f.rel_path), f.size))
    out = {}
    for loc, passes in members.items():
        h = hashlib.sha256()
        for name, size in sorted(passes):
            h.update(name + b"\0" + str(size).encode() + b"\n")
        out[loc] = (sum(size for _, size in passes), h.hexdigest())
    return out


def fill_unknown_locations(base: Base, digests: Mapping[str, tuple[int, str]]) -> Base:
    """`fill_unknown` for --time_series: rebuilt inventories' locations as their passes are now."""
    rebuilt, held = {}, dict(base.held)
    for version, entries in base.rebuilt.items():
        filled = []
        for h in entries:
            if h.rel_path in digests:
                size, digest = digests[h.rel_path]
                h = h._replace(size=size, mtime_ns=0, sha256=digest)
            filled.append(h)
            held[h.rel_path] = h
        rebuilt[version] = tuple(filled)
    return dataclasses.replace(base, held=held, rebuilt=rebuilt)


def fill_unknown(base: Base, files: Sequence) -> Base:
    """`base` with the sizes, times and hashes of its rebuilt inventories' files, from the listing now."""
    if not base.rebuilt:
        return base
    by_path = {f.rel_path: f for f in files}
    wanted = [by_path[h.rel_path] for entries in base.rebuilt.values() for h in entries if h.rel_path in by_path]
    stats = content_hashes(wanted)
    rebuilt = {}
    held = dict(base.held)
    for version, entries in base.rebuilt.items():
        filled = []
        for h in entries:
            if h.rel_path in stats:
                size, mtime, sha = stats[h.rel_path]
                h = h._replace(size=size, mtime_ns=mtime, sha256=sha)
            filled.append(h)
            held[h.rel_path] = h
        rebuilt[version] = tuple(filled)
    return dataclasses.replace(base, held=held, rebuilt=rebuilt)


def duplicates_of_held(new: Sequence, stats: Mapping, base: Base) -> dict[str, str]:
    """With --dedup: relative path of each new file byte-identical to a held one, to that held path."""
    by_hash = {}
    for h in sorted(base.held.values(), key=lambda h: os.fsencode(h.rel_path)):
        if h.sha256 is not None:
            by_hash.setdefault(h.sha256, h.rel_path)
    out = {}
    for f in new:
        sha = stats.get(f.rel_path, (0, 0, None))[2]
        if sha is not None and sha in by_hash:
            out[f.rel_path] = by_hash[sha]
    return out


def check_compatible(manifest: schemas.Manifest, options: Mapping, class_names: Sequence[str] | None) -> None:
    """Refuses an append whose options would make the dataset inconsistent, before anything is written.

    Args:
      manifest: The dataset's manifest.
      options: This run's manifest options (`ConversionConfig.manifest_options`).
      class_names: --class_names, or None.

    Raises:
      ValueError: Naming the option, the dataset's value and this run's.
    """
    held = dict(manifest.all_versions[-1].options) or dict(manifest.options)
    for key, flag in _FIXED_OPTIONS:
        if key == "split":
            mine = (options.get("split") or {}).get("ratios")
            theirs = (held.get("split") or {}).get("ratios")
        else:
            mine, theirs = options.get(key), held.get(key)
        if _canonical(mine) != _canonical(theirs):
            raise ValueError(
                f"--append adds to a dataset converted with {key}={json.dumps(theirs)}, and this run "
                f"asks for {key}={json.dumps(mine)} ({flag}): the new records would not be like the "
                f"held ones. Give the dataset's {flag} (as in its manifest.json's options), or convert "
                "into another folder."
            )
    if class_names is not None and tuple(class_names[:len(manifest.class_names)]) != tuple(manifest.class_names):
        raise ValueError(
            f"--class_names must begin with the dataset's classes {list(manifest.class_names)} with --append "
            f"(their indices never change; new ones come after). Received: --class_names {','.join(class_names)}"
        )


def check_features(manifest: schemas.Manifest, features: Mapping) -> None:
    """Refuses an append whose records would have another schema (record format, targets, label mode).

    Raises:
      ValueError: Naming the record features that differ.
    """
    if _canonical(dict(features)) == _canonical(dict(manifest.features)):
        return
    held = _feature_keys(manifest.features)
    mine = _feature_keys(features)
    added, gone = sorted(mine - held), sorted(held - mine)
    detail = (f"this run's records would add {added}" if added else "") + \
        ("; " if added and gone else "") + (f"lose {gone}" if gone else "")
    kinds = sorted(kind for kind, specs in schemas.TARGET_KINDS.items()
                   if {spec.key for spec in specs} & {*added, *gone})
    if kinds:
        flags = sorted({_flag(kind) for kind in kinds})
        raise ValueError(
            f"--append adds to a dataset whose records have another target kind than this run's "
            f"({detail}: {', '.join(f'{k} ({_flag(k)})' for k in kinds)}): the target "
            f"kinds and label mode of an append must be the dataset's. Give {' and '.join(flags)} as "
            "the dataset was converted (its manifest.json's targets), or convert into another folder."
        )
    raise ValueError(
        "--append adds to a dataset whose records have another format than this run's "
        f"({detail or 'the same keys, other types or encodings'}): the record format, label mode "
        "(--labels_csv, --annotations, several labels) and targets (--masks_dir, numbers) of an "
        "append must be the dataset's. Convert into another folder for another format."
    )


def _flag(kind: str) -> str:
    """The option that asks for a kind of target (its row's `flag`), for `check_features`."""
    row = _targets.kind_named(kind)
    return (row.flag if row is not None else None) or kind


def _feature_keys(features: Mapping) -> set[str]:
    """The record keys of a schema's JSON (`schemas.ImageExampleSchema.to_json`: key to its spec)."""
    return {str(k) for k, v in features.items() if isinstance(v, Mapping)}


def _canonical(value):
    return json.dumps(value, sort_keys=True)
