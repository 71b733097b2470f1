"""A conversion's last step, Beam-free: the rejects and normalised lists, TFDS's metadata and
the manifest (last), from every shard result; with --append, the new version's inventory and
the grown manifest. `beam_jobs._finalize.FinalizeFn` is its Beam adapter.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import logging
import os

import schemas
from schemas.tfds_metadata import tfds_files
from conversion.output_folder import remove_dataset_files
from conversion import append as _append, targets as _targets
from conversion.append_run import PENDING_INVENTORY, PENDING_REPORT
from conversion.elements import ConversionError
from conversion.normalized import dicom_summary as _dicom_summary, line as _normalized_entry
from conversion.normalized import patches_summary as _patch_summary
from conversion.files import TMP_DIRNAME, exists, join, read_bytes, remove_tree, write_atomically
from conversion.listing import display_path

__all__ = ["Finalizer"]

_LOG = logging.getLogger("shardsmith.convert")
# The manifest's section of a volume dataset (`conversion.volumes.manifest_section`).
_VOLUMES = "volumes"


class Finalizer:
    """Writes rejects.jsonl, normalized.jsonl, then manifest.json (last): a conversion's
    last step (`finish`), Beam-free; `beam_jobs._finalize.FinalizeFn` runs it.

    Args:
      output_dir: The dataset folder.
      class_names, shard_counts, num_found: From the plan.
      options: The manifest's `options` (`ConversionConfig.manifest_options`).
      max_reject_fraction: Above this fraction of rejects, raise
        `ConversionError` and write no manifest.
      features: The schema's JSON (default: the plain image schema).
      extra: Further manifest sections known before the run (e.g. split groups).
      targets: The planned, dataset-level part of the manifest's targets
        section (`conversion.plan.Plan.targets_section`); the shards' counts
        are added to it. None: no targets beyond one class.
      append: With --append (`conversion.append_run.AppendRun.finalize_args`): the
        version this run writes, the manifest it grows (None: a first
        conversion) and the inputs' counts. The new version's inventory goes
        in first; the grown manifest replaces the old one last, then TFDS's
        metadata (a run killed before leaves the previous version whole).
      finish: The example kind's `finish_output` (manifest, rejects,
        output_dir), called after manifest.json; None: nothing more.
    """

    def __init__(self, *, output_dir, class_names, shard_counts, num_found, options,
                 max_reject_fraction, features=None, extra=None, targets=None, append=None, finish=None):
        self._finish = finish
        self._append = None if append is None else dict(append)
        self._targets = None if targets is None else dict(targets)
        self._output_dir = output_dir
        self._features = dict(features or schemas.IMAGE_SCHEMA.to_json())
        self._extra = dict(extra or {})
        self._class_names = tuple(class_names)
        self._shard_counts = dict(shard_counts)
        self._num_found = num_found
        self._options = options
        self._max_reject_fraction = max_reject_fraction

    def finish(self, shards, rejects, normalized) -> schemas.Manifest:
        """Writes the dataset's lists and metadata from every shard result, reject and
        normalised entry of the run; returns the manifest written."""
        rejects = sorted(rejects, key=lambda r: os.fsencode(r.rel_path))
        normalized = sorted(normalized, key=lambda n: os.fsencode(n[0]))
        if self._append is not None and self._append.get("base") is not None:
            kept = self._kept_if_only_retried(shards, rejects)
            if kept is not None:
                return kept
        self._write_lists(rejects, normalized)
        counts = self._counts(shards, rejects)
        splits = self._splits(shards)
        manifest = self._manifest(splits, counts, rejects, normalized, shards)
        if self._append is not None:
            report = self._report(rejects)
            manifest = self._grown(manifest, len((report or {}).get("retried_rejected_again", ())))
            self._write_inventory(rejects, report)
        keep = {name for info in manifest.splits.values() for s in info.shards
                for name in (s.file, s.index_file)}
        remove_dataset_files(self._output_dir, keep=keep)
        # TFDS's metadata too, so `tfds.builder_from_directory` reads the folder as is.
        tfds = tfds_files(manifest)
        if self._append is None:
            for name, text in tfds.items():
                write_atomically(self._output_dir, name, text.encode())
        write_atomically(self._output_dir, schemas.MANIFEST_FILENAME, manifest.to_json().encode())
        if self._append is not None:
            # After the manifest: a run killed between leaves TFDS's view of the previous
            # version (its shards all there), never one of shards not written yet.
            for name, text in tfds.items():
                write_atomically(self._output_dir, name, text.encode())
        if self._finish is not None:
            self._finish(manifest, rejects, self._output_dir)
        remove_tree(join(self._output_dir, TMP_DIRNAME))
        return manifest

    def _kept_if_only_retried(self, shards, rejects) -> schemas.Manifest | None:
        """The dataset as it was, when this append's only inputs were earlier rejects rejected again.

        Such a run wrote no record and found nothing no version knows: a version would
        add nothing (an empty one per retry, week after week). The dataset stays as it
        was (manifest, rejects.jsonl, inventories, TFDS's metadata), its shards left by
        a killed run removed; append_report.json says what was tried (version null,
        `kept_version` the latest). A new input rejected, or any record written, makes
        a version: rejects.jsonl must name every input not converted. None otherwise.
        """
        if any(s.num_records for s in shards) or not rejects:
            return None
        report = self._report(rejects)
        retried = set((report or {}).get("retried", ()))
        if any(display_path(r.rel_path) not in retried for r in rejects):
            return None
        base = schemas.Manifest.from_json(self._append["base"], schemas.MANIFEST_FILENAME)
        report = {**report, "version": None, "kept_version": base.latest_version}
        text = json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        write_atomically(self._output_dir, _append.REPORT_FILENAME, text.encode("utf-8", "surrogateescape"))
        remove_dataset_files(self._output_dir, keep={name for info in base.splits.values() for s in info.shards
                                                     for name in (s.file, s.index_file)})
        for name, text in tfds_files(base).items():
            write_atomically(self._output_dir, name, text.encode())
        remove_tree(join(self._output_dir, TMP_DIRNAME))
        _LOG.warning("No version added to %s: its only new inputs, %s rejected by version %d, were tried again "
                     "and rejected again (see %s); the dataset is version %d as it was.", self._output_dir,
                     f"{len(rejects):,}", base.latest_version, _append.REPORT_FILENAME, base.latest_version)
        return base

    def _report(self, rejects) -> dict | None:
        """The append's pending report (`append_run.report_text`), with the retried files rejected again."""
        path = join(self._output_dir, TMP_DIRNAME, PENDING_REPORT)
        if not exists(path):
            return None
        report = json.loads(read_bytes(path).decode())
        if "retried" in report:
            shown = {display_path(r.rel_path) for r in rejects}
            report["retried_rejected_again"] = sorted((p for p in report["retried"] if p in shown), key=os.fsencode)
        return report

    def _write_inventory(self, rejects, report: dict | None) -> None:
        """Moves the new version's inventory (its files not rejected) and report into the dataset."""
        tmp = join(self._output_dir, TMP_DIRNAME)
        rejected = {r.rel_path for r in rejects}
        kept = []
        for line in read_bytes(join(tmp, PENDING_INVENTORY)).decode().splitlines(keepends=True):
            entry = json.loads(line)
            if "sources" in entry:  # An example of several files (a series): held unless all were rejected.
                if not set(entry["sources"]) <= rejected:
                    kept.append(_append.HeldFile.from_dict(entry, self._append["version"]).to_json() + "\n")
            elif entry["path"] not in rejected:
                kept.append(line)
        write_atomically(self._output_dir, _append.inputs_filename(self._append["version"]),
                         "".join(kept).encode())
        if report is not None:
            text = json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            write_atomically(self._output_dir, _append.REPORT_FILENAME, text.encode("utf-8", "surrogateescape"))

    def _grown(self, manifest: schemas.Manifest, retried_again: int = 0) -> schemas.Manifest:
        """The dataset's manifest with this run's shards as a new version (None base: `manifest`)."""
        base = self._append.get("base")
        if base is None:
            return manifest
        old = schemas.Manifest.from_json(base, schemas.MANIFEST_FILENAME)
        width = len(manifest.class_names)

        def padded(shard):
            return dataclasses.replace(shard, class_counts=_targets.CLASS.merge(shard.class_counts, width))

        splits = {name: schemas.SplitInfo(name, tuple(map(padded, info.shards)))
                  for name, info in old.splits.items()}
        for name, info in manifest.splits.items():
            held = splits[name].shards if name in splits else ()
            splits[name] = schemas.SplitInfo(name, held + info.shards)
        extra = {**old.extra, **manifest.extra}
        grown = {}
        key = schemas.TARGETS_SECTION
        if key in old.extra and key in manifest.extra:
            # Counts of every version added up; the planned values (classes, dtype) this run's.
            grown[key] = _targets.merge_sections(old.extra[key], manifest.extra[key])
        if _VOLUMES in old.extra and _VOLUMES in manifest.extra:
            # Every version's volumes, per split (`inspect` of the latest; `at_version` of an older).
            from conversion.volumes import merge_sections  # Only for volumes: a photo run never loads it.

            grown[_VOLUMES] = merge_sections(old.extra[_VOLUMES], manifest.extra[_VOLUMES])
        if schemas.TIME_SERIES in old.extra and schemas.TIME_SERIES in manifest.extra:
            # Every version's locations.
            from conversion.time_series import merge_time_series

            grown[schemas.TIME_SERIES] = merge_time_series(old.extra[schemas.TIME_SERIES],
                                                           manifest.extra[schemas.TIME_SERIES])
        extra.update(grown)
        held_versions = old.all_versions
        if grown and not held_versions[-1].sections:
            # What `Manifest.at_version` reads for the versions before this one.
            held_versions = (*held_versions[:-1], dataclasses.replace(
                held_versions[-1], sections={name: old.extra[name] for name in grown}))
        added = {name: info for name, info in manifest.splits.items() if info.shards}
        version = schemas.VersionInfo(
            version=self._append["version"],
            shards={name: tuple(s.file for s in info.shards) for name, info in added.items()},
            num_records={name: info.num_records for name, info in added.items()},
            class_counts={name: tuple(info.class_counts) for name, info in added.items()},
            num_classes=width,
            time=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            options=dict(manifest.options),
            inputs={**(self._append.get("inputs") or {}),
                    **({"retried_rejected_again": retried_again} if retried_again else {})},
            sections=grown,
        )
        if "groups" in old.extra and "groups" in manifest.extra:
            per_split = {}
            for section in (old.extra["groups"], manifest.extra["groups"]):
                for split, ids in section["per_split"].items():
                    per_split.setdefault(split, set()).update(ids["sha256_16"])
            extra["groups"] = {**manifest.extra["groups"], "per_split": {
                split: {"count": len(ids), "sha256_16": sorted(ids)} for split, ids in per_split.items()}}
        grew = width > len(old.class_names) or old.class_order == "first_appearance"
        return dataclasses.replace(
            manifest, splits=splits, extra=extra, versions=(*held_versions, version),
            class_order="first_appearance" if grew else "sorted")

    def _write_lists(self, rejects, normalized) -> None:
        write_atomically(
            self._output_dir, schemas.REJECTS_FILENAME,
            "".join(r.to_json() + "\n" for r in rejects).encode(),
        )
        write_atomically(
            self._output_dir, schemas.NORMALIZED_FILENAME,
            "".join(
                json.dumps(_normalized_entry(p, src, actions, details), sort_keys=True,
                           ensure_ascii=False) + "\n"
                for p, src, actions, details in normalized
            ).encode(),
        )

    def _counts(self, shards, rejects) -> dict:
        """The manifest's counts; raises when inputs went missing or too many were rejected."""
        written = sum(s.num_sources for s in shards)
        kinds = collections.Counter(r.kind for r in rejects)
        counts = {
            "found": self._num_found,
            "written": written,
            "rejected": kinds["rejected"],
            "skipped": kinds["skipped"],
        }
        if written + kinds["rejected"] + kinds["skipped"] != self._num_found:
            # An internal invariant, not a user error: an input went missing.
            raise RuntimeError(f"Inputs do not reconcile, nothing may be lost: {counts}")
        considered = written + kinds["rejected"]
        if considered and kinds["rejected"] / considered > self._max_reject_fraction:
            raise ConversionError(
                f"{kinds['rejected']:,} of {considered:,} images were rejected, more than "
                f"--max_reject_fraction={self._max_reject_fraction:g}; see "
                f"{join(self._output_dir, schemas.REJECTS_FILENAME)}. "
                "No manifest was written."
            )
        return counts

    def _splits(self, shards) -> dict:
        splits = {}
        for split, count in self._shard_counts.items():
            mine = sorted((s for s in shards if s.split == split), key=lambda s: s.index)
            if [s.index for s in mine] != list(range(count)):
                raise RuntimeError(f"Split {split!r}: shards {[s.index for s in mine]} of {count}")
            splits[split] = schemas.SplitInfo(split, tuple(
                schemas.ShardInfo(s.file, s.num_records, s.num_bytes, s.sha256, s.class_counts,
                                  s.index_file, s.index_sha256,
                                  schemas.ImageStats.from_json(s.images),
                                  schemas.BandStats.from_json(s.band_stats), s.georeferenced)
                for s in mine
            ))
        return splits

    def _manifest(self, splits, counts, rejects, normalized, shards=()) -> schemas.Manifest:
        actions = collections.Counter(a for _, _, acts, _ in normalized for a in acts)
        extra = dict(self._extra)
        if self._targets is not None:
            extra[schemas.TARGETS_SECTION] = _targets.targets_section(
                self._targets, shards, sorted(self._shard_counts), len(self._class_names))
        patches = _patch_summary(normalized)
        if patches:
            extra["patches"] = patches
        if _VOLUMES in extra:  # The run's counts per split and its reconciliation.
            from conversion.volumes import counted_section

            extra[_VOLUMES] = counted_section(extra[_VOLUMES], shards, counts)
        dicom = _dicom_summary(normalized)
        if dicom:
            extra["dicom"] = {**extra.get("dicom", {}), "applied": dicom}
        return schemas.Manifest(
            schema_version=schemas.SCHEMA_VERSION,
            tool_version=schemas.__version__,
            features=self._features,
            class_names=self._class_names,
            splits=splits,
            counts=counts,
            rejects=dict(sorted(collections.Counter(r.reason for r in rejects).items())),
            normalized=dict(sorted(actions.items())),
            options=self._options,
            extra=extra,
        )

