"""`shardsmith inspect`, `verify` and `preview` of a volume dataset (`convert --volumes`, issue 36).

    shardsmith inspect out      # splits, records, shapes, spacings, orientations, rejects
    shardsmith verify --output_dir out   # every record re-read and checked
    shardsmith preview out      # out/preview.png: the middle slice along each axis of each volume

The commands call these when the folder holds `volumes.json`, which `convert --volumes` writes after
`manifest.json` (`conversion.volumes.write_manifest`).
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np

from conversion import volumes as _volumes
from schemas import FILENAME, LABEL, MANIFEST_FILENAME, tfrecord
from schemas.volumes import VOLUME, VOLUME_AFFINE, VOLUME_MASK, VOLUME_SCHEMA, VOLUME_SPACING, VolumeExampleSchema

__all__ = ["is_volume_dataset", "inspect_volumes", "verify_volumes", "preview_volumes", "PREVIEW_FILENAME"]

PREVIEW_FILENAME = "preview.png"


def is_volume_dataset(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, _volumes.VOLUMES_MANIFEST))


def _shared_manifest(folder: str) -> dict:
    """The folder's manifest.json (its shards, its volume section, its versions), as JSON."""
    with open(os.path.join(folder, MANIFEST_FILENAME), "rb") as f:
        return json.load(f)


def _records(folder: str, manifest: dict):
    """(split, shard, record) of every shard manifest.json names: of every version of a dataset that grew."""
    splits = _shared_manifest(folder)["splits"]
    for split in sorted(manifest["splits"]):
        for shard in splits.get(split, {}).get("shards", ()):
            name = shard["file"]
            with open(os.path.join(folder, name), "rb") as f:
                for _, _, payload in tfrecord.iter_records(f, name):
                    yield split, name, payload


def _axcodes(affine) -> str:
    """RAS axis codes of the voxel axes (i, j, k), as nibabel's aff2axcodes."""
    codes = []
    for column in np.asarray(affine)[:3, :3].T:
        axis = int(np.argmax(np.abs(column)))
        codes.append(("LR", "PA", "IS")[axis][int(column[axis] > 0)])
    return "".join(codes)


def inspect_volumes(folder: str) -> str:
    manifest = _volumes.read_manifest(folder)
    # manifest.json's volume section: files per split and the reconciliation (datasets of
    # earlier versions have neither).
    section = _shared_manifest(folder).get("volumes", {})
    files = {split: entry["files"] for split, entry in section.get("splits", {}).items()}
    lines = [f"{folder}: volumes ({len(manifest['class_names'])} classes: {', '.join(manifest['class_names'])})"]
    for split, entry in sorted(manifest["splits"].items()):
        made_of = f" ({files[split]} files)" if split in files else ""
        lines.append(f"  {split}: {entry['records']} volumes{made_of} in {entry['shards']} shard(s)")
    versions = manifest.get("versions", ())
    if versions:  # A dataset that grew (`convert --volumes --append`): what each version added.
        lines.append(f"  versions: {len(versions)} (read one with version=N)")
        for v in versions:
            added = ", ".join(f"{split} +{e['records']}" for split, e in sorted(v["splits"].items())) or "none"
            shards = sum(len(e["shards"]) for e in v["splits"].values())
            lines.append(f"    v{v['version']} ({v['time'] or '-'}): {added} volumes in {shards} shard(s), "
                         f"{v['num_classes']} classes")
    schema = _schema(manifest)
    for split, _, payload in _records(folder, manifest):
        r = schema.decode(payload)
        spacing = ", ".join(f"{v:.3g}" for v in r[VOLUME_SPACING.key])
        label = r[LABEL.key]
        mask = ""
        if VOLUME_MASK.key in r:  # --masks_dir: the class ids its label volume holds.
            mask = f", mask ids {np.unique(r[VOLUME_MASK.key]).tolist()}"
        lines.append(f"    {split} {r[FILENAME.key]}: {r[VOLUME.key].dtype.name} {tuple(r[VOLUME.key].shape)}, "
                     f"spacing ({spacing}) mm, {_axcodes(r[VOLUME_AFFINE.key])}, "
                     f"class {manifest['class_names'][label] if label >= 0 else '-'}{mask}")
    reasons = collections.Counter(r["reason"] for r in manifest["rejects"])
    lines.append(f"  rejected files: {sum(reasons.values())}" +
                 (f" ({', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))})" if reasons else ""))
    if "reconciliation" in section:
        f, v = section["reconciliation"]["files"], section["reconciliation"]["volumes"]
        lines.append(f"  inputs {f['inputs']} = {f['in_volumes']} in volumes + {f['rejected']} rejected + "
                     f"{f['skipped']} skipped; volumes {v['planned']} planned = {v['written']} written + "
                     f"{v['rejected_while_decoding']} rejected while decoding")
    return "\n".join(lines)


def _schema(manifest: dict) -> VolumeExampleSchema:
    """The record schema volumes.json names (with `volume/mask` for a dataset converted with --masks_dir)."""
    return VolumeExampleSchema.from_json(manifest.get("features") or VOLUME_SCHEMA.to_json())


def verify_volumes(folder: str) -> list[str]:
    """Re-reads every record (CRCs, schema, sizes, counts); returns the problems found."""
    manifest = _volumes.read_manifest(folder)
    schema = _schema(manifest)
    problems, counts = [], collections.Counter()
    try:
        for split, name, payload in _records(folder, manifest):
            try:
                schema.decode(payload)
                counts[split] += 1
            except ValueError as e:
                problems.append(f"{name}: {e}")
    except ValueError as e:  # a damaged frame (CRC, length)
        problems.append(str(e))
    for split, entry in manifest["splits"].items():
        if counts[split] != entry["records"]:
            problems.append(f"split {split}: {counts[split]} records read, volumes.json says {entry['records']}")
    return problems


def middle_slices(volume: np.ndarray) -> list[np.ndarray]:
    """The middle slice along each axis (k, j, i), each scaled to uint8 by its own min and max."""
    d, h, w = volume.shape
    out = []
    for plane in (volume[d // 2], volume[:, h // 2, :], volume[:, :, w // 2]):
        plane = plane.astype(np.float64)
        low, high = plane.min(), plane.max()
        scaled = (plane - low) / (high - low) if high > low else np.zeros_like(plane)
        out.append(np.round(scaled * 255).astype(np.uint8))
    return out


def preview_volumes(folder: str, limit: int = 16) -> str:
    """Writes PREVIEW_FILENAME: a row per volume, its three middle slices side by side."""
    from PIL import Image

    manifest = _volumes.read_manifest(folder)
    rows = []
    for _, _, payload in _records(folder, manifest):
        rows.append(middle_slices(VOLUME_SCHEMA.decode(payload)[VOLUME.key]))
        if len(rows) == limit:
            break
    cell = max(p.shape[0] for row in rows for p in row), max(p.shape[1] for row in rows for p in row)
    sheet = np.zeros((cell[0] * len(rows), cell[1] * 3), np.uint8)
    for r, row in enumerate(rows):
        for c, plane in enumerate(row):
            sheet[r * cell[0]:r * cell[0] + plane.shape[0], c * cell[1]:c * cell[1] + plane.shape[1]] = plane
    path = os.path.join(folder, PREVIEW_FILENAME)
    Image.fromarray(sheet).save(path)
    return path


def main(command: str, folder: str) -> int:
    if command == "inspect":
        print(inspect_volumes(folder))
        return 0
    print(preview_volumes(folder))
    return 0
