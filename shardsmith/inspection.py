"""Answers at a glance about a converted dataset: `shardsmith inspect OUT`.

Reads only the metadata (manifest, rejects, the verify report if there is
one), so it is instant whatever the size of the dataset.
"""

from __future__ import annotations

import json
import os
import sys

from apache_beam.io.filesystems import FileSystems

import schemas
from conversion import scene_log
from conversion.targets import CLASS, kind_named
from conversion.files import read_bytes

__all__ = ["inspect_dataset", "format_inspection", "main"]

# A class with this many times the images of the smallest is worth a warning.
_IMBALANCE_WARNING = 10.0


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def inspect_dataset(data_dir: str) -> dict:
    """Collects the facts and warnings about a dataset.

    Returns:
      A dict with 'manifest' (the parsed Manifest), 'verify' (the verify
      report or None) and 'warnings' (sentences).

    Raises:
      ManifestError: If the folder is not a finished dataset.
    """
    local = not schemas.is_url(data_dir)
    problem = schemas.not_a_dataset_folder(data_dir, exists=os.path.exists(data_dir) if local else None,
                                           is_file=local and os.path.isfile(data_dir))
    if problem:
        raise schemas.ManifestError(problem)
    path = FileSystems.join(data_dir, schemas.MANIFEST_FILENAME)
    if not FileSystems.exists(path):
        raise schemas.ManifestError(
            f"{data_dir} has no {schemas.MANIFEST_FILENAME}: it is not a finished shardsmith dataset "
            "(the conversion did not complete, or this is the wrong folder)."
        )
    manifest = schemas.Manifest.from_json(read_bytes(path).decode(), path)
    report_path = FileSystems.join(data_dir, schemas.VERIFY_REPORT_FILENAME)
    report = json.loads(read_bytes(report_path).decode()) if FileSystems.exists(report_path) else None
    warnings = []
    # Images having each class, as the class's row counts them (with several labels per image: those).
    per_split = CLASS.per_split(manifest)
    for split, counts in per_split.items():
        if split == "train":
            continue
        missing = [c for c, n in zip(manifest.class_names, counts) if n == 0]
        if missing:
            warnings.append(f"{len(missing)} class(es) have no {split} images: {', '.join(missing[:10])}")
    for split, per_class in per_split.items():
        counts = [n for n in per_class if n > 0]
        if len(counts) > 1 and max(counts) / min(counts) >= _IMBALANCE_WARNING:
            big = manifest.class_names[per_class.index(max(counts))]
            small = manifest.class_names[per_class.index(min(counts))]
            warnings.append(
                f"heavy imbalance in {split}: {big!r} has {max(counts) / min(counts):.0f}x the images "
                f"of {small!r}"
            )
    if report is None:
        warnings.append("not verified yet: run `shardsmith verify` to re-read every record")
    else:
        if not report["ok"]:
            warnings.append(f"verify found {len(report['problems'])} problems: see {schemas.VERIFY_REPORT_FILENAME}")
        if report["duplicates"]["across_splits"]:
            warnings.append(
                f"{report['duplicates']['across_splits']} images appear in more than one split "
                "(evaluation leaks into training): convert with --dedup"
            )
    failed_items = int((manifest.extra.get("patches") or {}).get("failed_items", 0))
    if failed_items:
        warnings.append(f"{_count(failed_items, 'work item')} of scenes failed, their patches missing: see the "
                        f"{scene_log.FAILED_ACTION} entries of {schemas.NORMALIZED_FILENAME}")
    rejected = manifest.counts["rejected"]
    considered = manifest.counts["written"] + rejected
    if considered and rejected / considered > 0.01:
        warnings.append(f"{rejected / considered:.1%} of the images were rejected: see {schemas.REJECTS_FILENAME}")
    return {"manifest": manifest, "verify": report, "warnings": warnings}




def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def _stored_images(m: schemas.Manifest) -> list[str]:
    """What the splits store, when any holds raw rasters: formats, dtypes, band counts.

    Photos-only datasets print nothing here (their output is unchanged).
    """
    stats = {name: info.images for name, info in m.splits.items() if info.images}
    formats = {f for s in stats.values() for f, _ in s.formats}
    if not any(schemas.parse_raw_format(f) for f in formats):
        return []
    rows = [["split", "stored as", "dtypes", "bands"]]
    for name, s in stats.items():
        dtypes = sorted({schemas.parse_raw_format(f) or "uint8/uint16" for f, _ in s.formats})
        # The band count comes with the per-band statistics (rasters of one band count).
        band_stats = m.splits[name].band_stats
        rows.append([name, ", ".join(f"{f} {n:,}" for f, n in s.formats), ", ".join(dtypes),
                     str(band_stats.num_bands) if band_stats else "-"])
    return _table(rows) + [""]


def _georef_lines(m: schemas.Manifest) -> list[str]:
    """With --raster_georef: the georef features, and each split's records with known values."""
    counts = {name: info.georeferenced for name, info in m.splits.items()}
    if all(c is None for c in counts.values()):
        return []
    keys = ", ".join(spec.key for spec in schemas.GEOREF_FEATURES)
    per = ", ".join(f"{name} {c or 0:,} of {m.splits[name].num_records:,}" for name, c in counts.items())
    return [f"georeferenced ({keys}; EPSG {schemas.UNKNOWN_EPSG} and NaNs where unknown): {per}", ""]


def _version_lines(m: schemas.Manifest) -> list[str]:
    """A dataset that grew (--append): one row per version, what it added.

    A dataset of one version prints nothing here (its output is unchanged).
    """
    if not m.versions:
        return []
    splits = sorted({s for v in m.versions for s in v.shards})
    rows = [["version", "written (UTC)", "classes", *(f"+{s}" for s in splits), "shards"]]
    for v in m.versions:
        rows.append([str(v.version), v.time or "-", str(v.num_classes),
                     *(f"{v.num_records.get(s, 0):,}" for s in splits),
                     str(sum(len(f) for f in v.shards.values()))])
    order = ("; classes in order of first appearance" if m.class_order == "first_appearance" else "")
    return [f"versions: {len(m.versions)} (read one with version=N){order}"] + _table(rows) + [""]


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"


def _patch_lines(m: schemas.Manifest, max_scenes: int) -> list[str]:
    """With --raster_patch: the patch grid, the totals, and the first scenes with their counts."""
    section = m.extra.get("patches")
    if not section:
        return []
    grid = (m.options.get("raster") or {}).get("patch") or {}

    def pair(key):
        value = grid.get(key)
        return "x".join(str(v) for v in value) if value else "?"

    scenes = int(section.get("scenes", 0))
    lines = [f"patches: {pair('size')} px (height x width), stride {pair('stride')}, edge "
             f"{grid.get('edge', '?')}, max nodata share {grid.get('max_nodata', '?')}; "
             f"{_count(scenes, 'scene')}: {int(section.get('written', 0)):,} patches written, "
             f"{int(section.get('skipped_nodata', 0)):,} skipped (nodata), "
             f"{_count(int(section.get('failed_items', 0)), 'work item')} failed"]
    listed = list((section.get("listed") or {}).items())[:max_scenes]
    if listed:
        rows = [["scene", "height x width", "written", "skipped", "failed items"]]
        for path, info in listed:
            size = info.get("size")
            rows.append([path, "x".join(map(str, size)) if size else "?", f"{int(info.get('written', 0)):,}",
                         f"{int(info.get('skipped_nodata', 0)):,}", f"{int(info.get('failed_items', 0)):,}"])
        lines += _table(rows)
    if scenes > len(listed):
        lines.append(f"... and {scenes - len(listed):,} more scenes (each work item is in "
                     f"{schemas.NORMALIZED_FILENAME})")
    return lines + [""]


def _target_lines(m: schemas.Manifest, max_classes: int) -> list[str]:
    """The `targets` section of the manifest (issue 24), in the style of the class counts.

    Each kind as its row of `conversion.targets.TARGETS` describes it, in the schema's order.
    """
    targets = m.targets
    splits = list(m.splits)
    lines = []
    for name in [k for k in schemas.TARGET_KINDS if k in targets]:
        kind = kind_named(name)
        if kind is None or kind.describe is None:
            continue
        shown = kind.describe(targets[name], list(m.class_names), splits, max_classes)
        lines += [*shown.head, *(_table(shown.rows) if shown.rows else []), *shown.tail, ""]
    return lines


def format_inspection(data_dir: str, facts: dict, max_classes: int = 30, max_scenes: int = 20) -> str:
    """The facts as a few aligned tables; the first `max_scenes` scenes of a dataset of patches."""
    m: schemas.Manifest = facts["manifest"]
    total_records = sum(s.num_records for s in m.splits.values())
    total_bytes = sum(s.num_bytes for s in m.splits.values())
    lines = [
        f"{data_dir}: shardsmith {m.tool_version}, schema v{m.schema_version}, "
        f"{len(m.class_names)} classes, {total_records:,} records, {_human_bytes(total_bytes)}",
        "",
    ]
    rows = [["split", "shards", "records", "bytes", "min/max per shard"]]
    for name, info in m.splits.items():
        sizes = [s.num_records for s in info.shards] or [0]
        rows.append([name, str(len(info.shards)), f"{info.num_records:,}", _human_bytes(info.num_bytes),
                     f"{min(sizes):,}/{max(sizes):,}"])
    lines += _table(rows) + [""]
    lines += _stored_images(m)
    lines += _georef_lines(m)
    lines += _version_lines(m)
    lines += _patch_lines(m, max_scenes)
    lines += _target_lines(m, max_classes)
    # The image-level class, as its row describes it (images per class and split).
    shown = CLASS.describe(m, max_classes)
    lines += [*shown.head, *(_table(shown.rows) if shown.rows else []), *shown.tail]
    c = m.counts
    lines += ["", f"inputs {c['found']:,} = {c['written']:,} written + {c['rejected']:,} rejected + "
                  f"{c['skipped']:,} skipped"]
    if m.rejects:
        lines.append("rejects: " + ", ".join(f"{r} {n:,}" for r, n in m.rejects.items())
                     + f" (see {schemas.REJECTS_FILENAME})")
    if m.normalized:
        lines.append("normalised: " + ", ".join(f"{a} {n:,}" for a, n in m.normalized.items()))
    report = facts["verify"]
    if report is not None:
        dup = report["duplicates"]
        lines.append(f"verify: {'OK' if report['ok'] else 'MISMATCH'}, {dup['groups']} duplicate groups "
                     f"({dup['across_splits']} across splits)")
    lines.append("")
    if facts["warnings"]:
        lines.append("warnings:")
        lines += [f"  - {w}" for w in facts["warnings"]]
    else:
        lines.append("no warnings")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`shardsmith inspect OUT`: prints the tables; 2 if OUT is not a dataset."""
    from conversion import console

    argv = sys.argv[1:] if argv is None else argv
    argv = [a for a in argv if a != console.VERBOSE_FLAG]  # Read by the CLI's entry point.
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: shardsmith inspect DATASET_DIR [--verbose]", file=sys.stderr)
        return 2
    try:
        facts = inspect_dataset(argv[0].rstrip("/"))
    except schemas.ManifestError as e:
        print(f"shardsmith inspect: error: {e}", file=sys.stderr)
        return 2
    print(format_inspection(argv[0], facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
