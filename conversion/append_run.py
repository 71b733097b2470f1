"""The driver's side of `convert --append`: the dataset before, the listing against it, the lock.

`AppendRun` holds what `convert.run` needs between its steps: the output's
dataset (`conversion.append.Base`), the listed files this run converts (the
others held, changed or missing), and the new version's number, shards and
inventory; `conversion.finalize.Finalizer` turns them into the grown manifest, written last.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

import schemas
from conversion import append as _append, listing as _listing
from conversion.files import TMP_DIRNAME, join, write_atomically
from conversion.lock import OutputLock

__all__ = ["AppendRun", "NothingNew", "holding_lock", "PENDING_INVENTORY", "PENDING_REPORT"]

_LOG = logging.getLogger("shardsmith.convert")

# Inside the temporary folder: the new version's inventory and report, written by the
# driver before the pipeline, moved into the dataset by `conversion.finalize` before the manifest.
PENDING_INVENTORY = "inputs-pending.jsonl"
PENDING_REPORT = "append-report-pending.json"

# Output folders whose lock this process (or the command process it was forked
# from) holds: the command takes it before its first attempt, so that an attempt
# that goes on after a crash (`conversion.recovery`) is not refused by its own lock.
_HELD: set[str] = set()


def _key(output_dir: str) -> str:
    return os.path.realpath(output_dir) if _listing.is_local(output_dir) else output_dir.rstrip("/")


@contextlib.contextmanager
def holding_lock(output_dir: str, command: str | None = None):
    """The output folder's lock (`conversion.lock.OutputLock`) for the block, unless already held here.

    Raises:
      conversion.lock.LockError: If another writer holds it, or a dead one left it.
    """
    key = _key(output_dir)
    if key in _HELD:
        yield
        return
    with OutputLock(output_dir, command):
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)


class NothingNew(Exception):
    """The input holds no file the dataset does not hold already: no version to add."""

    def __init__(self, listing: _append.Listing):
        super().__init__("nothing new")
        self.listing = listing


class AppendRun:
    """One append, step by step (`convert.run`).

    Args:
      config: The conversion's `ConversionConfig` (`append` set).
    """

    def __init__(self, config):
        self._config = config
        self.base = _append.load_base(config.output_dir)
        self.listing: _append.Listing | None = None
        self.duplicates: dict[str, str] = {}
        # Listed files an earlier version rejected (rel_path to that reason), converted again now.
        self.retried: dict[str, str] = {}
        # --volumes: the listed files of the held series units (`held_volumes`), and the
        # --labels_csv rows (the units are its rows: `_locations`).
        self._held_files: frozenset[str] = frozenset()
        self._labels_csv = None
        if self.base is not None:
            _append.check_compatible(self.base.manifest, config.manifest_options("hash"), config.class_names)

    @property
    def version(self) -> int:
        """The number of the version this run writes."""
        return 1 if self.base is None else self.base.version

    @property
    def known_classes(self):
        """The dataset's class names (they keep their indices), or None for a first conversion."""
        if self.base is None or self._config.class_names is not None:
            return None
        return self.base.manifest.class_names

    def select(self, files, problems):
        """The listed inputs this run converts: those the dataset does not hold (`planning.build_plan`).

        Raises:
          NothingNew: When there is none.
        """
        locations = self._locations()
        if self.base is None:
            stats = (_append.content_hashes(files) if locations is None else
                     {loc: (size, 0, digest) for loc, (size, digest) in _append.location_digests(files, *locations).items()})
            self.listing = _append.Listing(tuple(files), (), (), (), stats)
            return files, problems
        if locations is not None:
            if self.base.rebuilt:
                # Inventories read from the shards: the locations' passes as they are now.
                self.base = _append.fill_unknown_locations(self.base, _append.location_digests(files, *locations))
            self.listing = _append.sort_locations(files, self.base, *locations)
        else:
            self.base = _append.fill_unknown(self.base, files)
            self.listing = _append.sort_listing(files, self.base)
        if self._config.validation.volumes is not None:
            self._settle_volumes(files, locations[0])
        held = self.base.held
        # A held file that no longer reads as a file (a link now broken) is missing, not a new reject.
        problems = [p for p in problems if p.rel_path not in held]
        new = list(self.listing.new)
        if self._config.writing.dedup and locations is None:
            self.duplicates = _append.duplicates_of_held(new, self.listing.stats, self.base)
            new = [f for f in new if f.rel_path not in self.duplicates]
            problems = sorted([*problems, *(
                _listing.Problem(p, "duplicate", f"same content as {_listing.display_path(kept)}, held by "
                                 f"version {held[kept].version}") for p, kept in self.duplicates.items())],
                key=lambda p: os.fsencode(p.rel_path))
        if not new:
            raise NothingNew(self.listing)
        # Held by no version, an earlier reject is listed again: tried again, counted apart from the new.
        rejected = self.base.rejected
        self.retried = {f.rel_path: rejected[shown] for f in new
                        if (shown := _listing.display_path(f.rel_path)) in rejected}
        _LOG.info("Appending to version %d of %s: %s new files%s; %s held (unchanged), %s changed (not "
                  "rewritten), %s missing from the input", self.base.manifest.latest_version,
                  self._config.output_dir, f"{len(new) - len(self.retried):,}",
                  f" and {len(self.retried):,} earlier rejects tried again" if self.retried else "",
                  f"{len(self.listing.held):,}", f"{len(self.listing.changed):,}", f"{len(self.listing.missing):,}")
        return new, problems

    def _settle_volumes(self, files, location_of) -> None:
        """--volumes, once the listing is sorted: the held series' labels checked against --labels_csv, and
        with --dedup their content digests known (read from the inventories, else from their files, once).

        Raises:
          ValueError: For a --labels_csv row that gives a held series another label or split
            (`conversion.volumes.check_held_rows`), before anything is written.
        """
        from conversion import volumes

        new = {f.rel_path for f in self.listing.new}
        self._held_files = frozenset(f.rel_path for f in files if f.rel_path not in new)
        if self._labels_csv is not None:
            if any(h.label is None for h in self.base.held.values()):
                self.base = _append.fill_labels(self.base, self._config.output_dir)
            volumes.check_held_rows(self._labels_csv, self.base.held, self._config.labels_csv)
        if not self._config.writing.dedup or not new:  # Nothing new: nothing to compare (`NothingNew`).
            return
        # The held, unchanged series whose version recorded no digests (written before they were, or
        # without --dedup): read whole once, their digests written into that version's inventory.
        unknown = {unit for unit in self.listing.held if self.base.held[unit].contents is None}
        if not unknown:
            return
        units: dict[str, list[str]] = {}
        for f in files:
            unit = location_of(f.rel_path) if f.rel_path in self._held_files else None
            if unit in unknown:
                units.setdefault(unit, []).append(f.rel_path)
        _LOG.info("--dedup: reading the %s held series whose version recorded no content digest (once)",
                  f"{len(units):,}")
        digests = volumes.content_digests(units, self._config.input_dir, self._config.validation.volumes)
        filled = []
        for unit in sorted(units, key=os.fsencode):
            mine = {name: d for name, d in digests.items() if volumes.unit_of_volume(name) == unit}
            filled.append(self.base.held[unit]._replace(contents=dict(sorted(mine.items()))))
        self.base = _append.amended(self.base, filled)

    def held_volumes(self):
        """--volumes: what the dataset holds, as `conversion.volumes.plan_volumes` plans against it; None
        for a first conversion."""
        if self.base is None:
            return None
        from conversion.volumes import HeldVolumes

        contents = {}
        for h in sorted(self.base.held.values(), key=lambda h: (h.version, os.fsencode(h.rel_path))):
            for name, digest in sorted((h.contents or {}).items()):
                contents.setdefault(digest, (name, h.version))
        # With --masks_dir the dataset's labels rule (class folders or none) holds for the new volumes.
        return HeldVolumes(self._held_files, contents, tuple(self.base.manifest.class_names))

    def found_duplicates(self, duplicates) -> None:
        """--volumes --dedup: the new files planning rejected as copies of held volumes (rel_path to its filename).

        One an earlier version rejected is counted as tried again, not as a duplicate (`inputs`).
        """
        self.duplicates.update((rel, name) for rel, name in duplicates.items() if rel not in self.retried)

    def _locations(self):
        """With --time_series: (location of a file, whether a file is a pass), as `sort_locations` takes
        them: a location is held or new as a whole. None for examples that are files."""
        if self._config.validation.volumes is not None:
            # A series folder (or NIfTI file) is held or new as a whole: its files, by path and size.
            from conversion import volumes

            if self._config.labels_csv:
                # Its units are the CSV's rows (a folder, or a NIfTI file), and the held ones.
                self._labels_csv = volumes.read_labels_csv(self._config.labels_csv)
                return volumes.csv_unit_locator(self._labels_csv, () if self.base is None else self.base.held)
            return volumes.series_unit, _in_a_series
        if self._config.validation.time_series is None:
            return None
        from imaging import time_series as _ts

        return _ts.location_of, _ts.is_raster_name

    def check_plan(self, plan, features: dict) -> None:
        """Refuses a plan that would change the dataset's records or class indices, before any write."""
        if self.base is None:
            return
        manifest = self.base.manifest
        _append.check_features(manifest, features)
        held = tuple(manifest.class_names)
        if tuple(plan.class_names[:len(held)]) != held:
            raise ValueError(
                f"--append keeps the dataset's class indices {list(held)}, but this run's classes come "
                f"as {list(plan.class_names)} (its annotations or --class_names order them): convert "
                "into another folder, or give --class_names with the dataset's classes first."
            )

    def inputs(self) -> dict[str, int]:
        """The version's `inputs` counts (`schemas.VersionInfo.inputs`); {} for a first conversion."""
        if self.base is None:
            return {}
        lst = self.listing
        return {"listed": len(lst.new) + len(lst.held) + len(lst.changed),
                "new": len(lst.new) - len(self.duplicates) - len(self.retried), "retried": len(self.retried),
                "held": len(lst.held), "changed": len(lst.changed), "missing_from_input": len(lst.missing),
                "duplicates_of_held": len(self.duplicates)}

    def write_pending(self, plan) -> None:
        """Writes the rebuilt inventories of older versions, and the new version's pending inventory and report.

        Called once the output is prepared, before the pipeline. A rebuilt
        inventory describes a version already complete: written in place.
        """
        out = self._config.output_dir
        if self.base is not None:
            for version, entries in sorted(self.base.rebuilt.items()):
                write_atomically(out, _append.inputs_filename(version), _append.inventory_text(entries))
        stats = self.listing.stats
        entries = {}
        # With --volumes an entry is a series unit, made of its volumes' files: `conversion.finalize`
        # leaves out a unit whose every file was rejected (held by no version, tried again).
        sources: dict[str, list[str]] = {}
        volumes = getattr(plan, "volumes", None)
        for f in plan.files:
            key = f.rel_path if volumes is None else _unit_of_volume(f.rel_path)
            if key not in entries:
                size, mtime, sha = stats.get(key, (f.size, 0, None))
                entries[key] = _append.HeldFile(key, size, mtime, sha, f.split, self.version)
            if volumes is not None:
                job = volumes[f.rel_path]
                sources.setdefault(key, []).extend(job.sources)
                # A series' class (an append with --labels_csv compares it with the CSV's row), and with
                # --dedup its volumes' content digests (an append compares new series with them).
                contents = entries[key].contents
                if job.content is not None:
                    contents = {**(contents or {}), job.filename: job.content}
                entries[key] = entries[key]._replace(label=job.label, contents=contents)
        tmp = join(out, TMP_DIRNAME)
        write_atomically(tmp, PENDING_INVENTORY, _append.inventory_text(entries.values(), sources))
        write_atomically(tmp, PENDING_REPORT, report_text(self.version, self.listing, self.duplicates, self.retried))

    def finalize_args(self) -> dict:
        """What `conversion.finalize.Finalizer` needs of the append (`append=`): small values only."""
        return {
            "version": self.version,
            "base": None if self.base is None else self.base.manifest.to_json(),
            "inputs": self.inputs(),
        }


def _in_a_series(rel_path: str) -> bool:
    """Whether a listed file belongs to a series unit (`conversion.volumes.series_unit`)."""
    from conversion.volumes import series_unit

    return series_unit(rel_path) is not None


def _unit_of_volume(filename: str) -> str:
    from schemas.volumes import unit_of_volume

    return unit_of_volume(filename)


def report_text(version: int, listing: _append.Listing, duplicates, retried=None) -> bytes:
    """`append_report.json`: what an append found, by path.

    `retried`: the listed files an earlier version rejected, tried again (rel_path to
    the earlier reason); `conversion.finalize` adds those rejected again.
    """
    display = _listing.display_path
    retried = retried or {}
    return (json.dumps({
        "version": version,
        "changed": [display(p) for p in listing.changed],
        "missing_from_input": [display(p) for p in listing.missing],
        "duplicates_of_held": {display(p): display(k) for p, k in sorted(duplicates.items())},
        "retried": {display(p): reason for p, reason in sorted(retried.items(), key=lambda i: os.fsencode(i[0]))},
        "new": len(listing.new) - len(duplicates) - len(retried),
        "held": len(listing.held),
    }, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def version_summary(manifest: schemas.Manifest) -> str:
    """One sentence about the latest version of a dataset that grew."""
    v = manifest.all_versions[-1]
    added = sum(v.num_records.values())
    per_split = " / ".join(f"{s} +{n:,}" for s, n in sorted(v.num_records.items()) if n)
    shards = sum(len(f) for f in v.shards.values())
    text = f"Version {v.version}: added {added:,} records in {shards} new shards ({per_split or 'none'})"
    i = v.inputs
    if i:
        text += (f"; of {i.get('listed', 0):,} listed inputs {i.get('held', 0):,} were held already, "
                 f"{i.get('changed', 0):,} changed (not rewritten), {i.get('missing_from_input', 0):,} "
                 f"missing from the input")
        if i.get("duplicates_of_held"):
            text += f", {i['duplicates_of_held']:,} duplicates of held files"
        if i.get("retried"):
            again = i.get("retried_rejected_again", 0)
            text += (f", {i['retried']:,} rejected by an earlier version and tried again ("
                     f"{i['retried'] - again:,} written, {again:,} rejected again)")
        if i.get("changed") or i.get("missing_from_input") or i.get("duplicates_of_held") or i.get("retried"):
            text += f": see {_append.REPORT_FILENAME}"
    new_classes = manifest.class_names[manifest.all_versions[-2].num_classes:] if len(manifest.all_versions) > 1 else ()
    if new_classes:
        text += f"; new classes {list(new_classes)} at indices {manifest.class_names.index(new_classes[0])}+"
    return text + "."


def nothing_new_text(output_dir: str, base: _append.Base, listing: _append.Listing) -> str:
    """The sentence of an append that found nothing to add."""
    text = (f"Nothing to append: every listed input is held by {output_dir} (version "
            f"{base.manifest.latest_version}, {len(listing.held):,} held")
    if listing.changed:
        text += f", {len(listing.changed):,} changed, not rewritten: {', '.join(listing.changed[:3])}"
    if listing.missing:
        text += f", {len(listing.missing):,} missing from the input"
    return text + "); no version added."

