"""`shardsmith inspect`, `verify` and `preview` of a volume dataset (`convert --volumes`, issue 36).

    shardsmith inspect out      # splits, records, shapes, spacings, orientations, rejects
    shardsmith verify --output_dir out   # every record re-read and checked
    shardsmith preview out      # out/preview.png: three planes of each volume, its mask drawn over them

The commands call these when the folder holds `volumes.json`, which `convert --volumes` writes after
`manifest.json` (`conversion.volumes.write_manifest`).

A dataset converted with --masks_dir (`volume/mask`, the manifest's `targets.mask`) is shown and
checked with its masks: preview picks each volume's planes through the mask's foreground and colours
its class ids with the image previews' colours (`shardsmith.preview`'s `colour_of` and `MASK_ALPHA`);
inspect lists each class's voxels and volumes; verify checks each mask's dtype and ids, and the
voxels per class against the manifest.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import itertools
import json
import os

import numpy as np

from conversion import verification as _verification
from conversion import volumes as _volumes
from schemas import FILENAME, LABEL, MANIFEST_FILENAME, tfrecord
from schemas.volumes import (VOLUME, VOLUME_AFFINE, VOLUME_MASK, VOLUME_MODALITY, VOLUME_SCHEMA, VOLUME_SPACING,
                             VolumeExampleSchema)

__all__ = ["is_volume_dataset", "inspect_volumes", "verify_volumes", "preview_volumes", "PREVIEW_FILENAME",
           "CT_WINDOW", "PERCENTILES", "DISPLAY_CONVENTION", "VolumePlanes", "volume_planes", "display_axes",
           "render_row"]

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


def _schema(manifest: dict) -> VolumeExampleSchema:
    """The record schema volumes.json names (with `volume/mask` for a dataset converted with --masks_dir)."""
    return VolumeExampleSchema.from_json(manifest.get("features") or VOLUME_SCHEMA.to_json())


def _mask_section(folder: str) -> dict:
    """manifest.json's `targets.mask` of a dataset converted with --masks_dir; {} without masks."""
    return (_shared_manifest(folder).get("targets") or {}).get("mask") or {}


def _ignore_id(dtype: str) -> int:
    """The ignore id of a mask dtype, its largest value (as `readers.targets.masks.MASK_IGNORE_IDS`)."""
    return int(np.iinfo(dtype).max)


def _class_name(i: int, names) -> str:
    """'2 wall' for a named class id, '2' for an unnamed one."""
    return f"{i} {names[i]}" if 0 <= i < len(names) else str(i)


def _mask_lines(section: dict, volumes_per_class: collections.Counter, splits) -> list[str]:
    """inspect's lines of a masked dataset: the pairing, the unmatched mask files, each class's voxels
    per split (the manifest's `pixel_counts`) and the volumes holding it (counted from the records)."""
    names = section.get("class_names") or []
    counts = {s: {int(k): int(v) for k, v in (section.get("pixel_counts") or {}).get(s, {}).items()}
              for s in splits}
    lines = [f"  masks: {section.get('dtype', '?')}, {section.get('num_classes', '?')} classes, paired by "
             f"{section.get('paired_by', 'name')}, {section.get('unmatched_masks', 0)} unmatched mask file(s)"]
    ids = sorted({i for c in counts.values() for i in c} | set(volumes_per_class) | set(range(len(names))))
    for i in ids:
        voxels = ", ".join(f"{s} {counts[s].get(i, 0):,}" for s in splits)
        lines.append(f"    class {_class_name(i, names)}: {voxels} voxels; in {volumes_per_class[i]} volume(s)")
    return lines


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
    volumes_per_class = collections.Counter()  # Mask class id -> volumes holding a voxel of it.
    record_lines = []
    for split, _, payload in _records(folder, manifest):
        r = schema.decode(payload)
        spacing = ", ".join(f"{v:.3g}" for v in r[VOLUME_SPACING.key])
        label = r[LABEL.key]
        mask = ""
        if VOLUME_MASK.key in r:  # --masks_dir: the class ids its label volume holds.
            ids = np.unique(r[VOLUME_MASK.key]).tolist()
            volumes_per_class.update(ids)
            mask = f", mask ids {ids}"
        record_lines.append(f"    {split} {r[FILENAME.key]}: {r[VOLUME.key].dtype.name} {tuple(r[VOLUME.key].shape)}, "
                            f"spacing ({spacing}) mm, {_axcodes(r[VOLUME_AFFINE.key])}, "
                            f"class {manifest['class_names'][label] if label >= 0 else '-'}{mask}")
    if schema.mask:
        lines += _mask_lines(_mask_section(folder), volumes_per_class, sorted(manifest["splits"]))
    lines += record_lines
    reasons = collections.Counter(r["reason"] for r in manifest["rejects"])
    lines.append(f"  rejected files: {sum(reasons.values())}" +
                 (f" ({', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))})" if reasons else ""))
    if "reconciliation" in section:
        f, v = section["reconciliation"]["files"], section["reconciliation"]["volumes"]
        lines.append(f"  inputs {f['inputs']} = {f['in_volumes']} in volumes + {f['rejected']} rejected + "
                     f"{f['skipped']} skipped; volumes {v['planned']} planned = {v['written']} written + "
                     f"{v['rejected_while_decoding']} rejected while decoding")
    return "\n".join(lines)


class _MaskCheck:
    """verify's checks of masked records against the manifest's `targets.mask`, as `shardsmith verify`
    makes them (`conversion.verification.check_volume_mask`, `mask_voxel_problems`)."""

    def __init__(self, section: dict):
        self._section = section
        self._voxels = collections.defaultdict(collections.Counter)  # split -> class id -> voxels
        self._holders = collections.defaultdict(lambda: collections.defaultdict(list))  # split -> id -> records

    def check(self, split: str, values: dict) -> str | None:
        """The problem of one decoded record's mask, or None; its voxels are counted either way."""
        problem, voxels = _verification.check_volume_mask(values, self._section)
        for i, n in voxels.items():
            self._voxels[split][i] += n
            self._holders[split][i].append(values[FILENAME.key])
        return problem

    def problems(self, splits) -> list[str]:
        """The splits whose voxels per class differ from the manifest's, naming the records holding the class."""
        return [p for split in sorted(splits) for p in _verification.mask_voxel_problems(
            split, self._voxels[split], self._section, self._holders[split])]


def verify_volumes(folder: str) -> list[str]:
    """Re-reads every record (CRCs, schema, sizes, counts; masks against the manifest); returns the problems."""
    manifest = _volumes.read_manifest(folder)
    schema = _schema(manifest)
    masks = _MaskCheck(_mask_section(folder)) if schema.mask else None
    problems, counts = [], collections.Counter()
    try:
        for split, name, payload in _records(folder, manifest):
            try:
                values = schema.decode(payload)
                counts[split] += 1
            except ValueError as e:
                problems.append(f"{name}: {e}")
                continue
            problem = masks.check(split, values) if masks is not None else None
            if problem:
                problems.append(f"{name}: {values[FILENAME.key]}: {problem}")
    except ValueError as e:  # a damaged frame (CRC, length)
        problems.append(str(e))
    for split, entry in manifest["splits"].items():
        if counts[split] != entry["records"]:
            problems.append(f"split {split}: {counts[split]} records read, volumes.json says {entry['records']}")
    if masks is not None and not problems:  # Counts of records that did not all read would differ anyway.
        problems += masks.problems(manifest["splits"])
    return problems


# --- preview ------------------------------------------------------------------------------------

# CT (modality 'CT') is shown in a soft-tissue window: level 40 HU, width 400 HU (-160 to 240 HU).
CT_WINDOW = (40.0, 400.0)
# Other volumes are shown between these percentiles of their voxels: one bright voxel (a marker,
# a metal clip) no longer greys out the rest as a min/max scaling did.
PERCENTILES = (1.0, 99.0)
# The longest side of a shown plane, in pixels: larger volumes are shown at a coarser scale.
_MAX_SIDE = 256
# Voxels the percentiles are taken over at most (an even stride through the volume).
_PERCENTILE_VOXELS = 1 << 22


def _intensity_window(volume: np.ndarray, modality: str) -> tuple[float, float]:
    """The (low, high) values shown black and white."""
    if modality == "CT":
        level, width = CT_WINDOW
        return level - width / 2, level + width / 2
    # `flat` steps through a view (a volume in display order) without copying it whole.
    flat = np.asarray(volume.flat[::max(1, volume.size // _PERCENTILE_VOXELS)], np.float64)
    flat = flat[np.isfinite(flat)]
    if not flat.size:
        return 0.0, 0.0
    low, high = np.percentile(flat, PERCENTILES)
    return float(low), float(high)


def _foreground_slices(mask: np.ndarray, ignore: int) -> tuple[int, int, int] | None:
    """(k, j, i): along each axis the slice holding the most foreground voxels (class id > 0, not the
    ignore id), the first of equals; None for a mask without foreground."""
    foreground = (mask != 0) & (mask != ignore)
    if not foreground.any():
        return None
    return tuple(int(np.argmax(foreground.sum(axis=tuple(a for a in range(3) if a != axis)))) for axis in range(3))


def _sample_positions(spacing: float, out: int, step: float) -> np.ndarray:
    """Source coordinates (in voxels, voxel v's centre at v) of the centres of `out` display pixels of
    `step` mm along an axis of `spacing` mm."""
    return (np.arange(out) + 0.5) * (step / spacing) - 0.5  # A ratio of 1 samples the voxels exactly.


def _nearest(plane: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    r = np.clip(np.floor(rows + 0.5).astype(np.int64), 0, plane.shape[0] - 1)
    c = np.clip(np.floor(cols + 0.5).astype(np.int64), 0, plane.shape[1] - 1)
    return plane[r[:, None], c[None, :]]


def _linear(plane: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Bilinear samples of a float plane at (rows x cols), clamped at its edges."""
    def weights(pos, n):
        pos = np.clip(pos, 0, n - 1)
        lo = np.floor(pos).astype(np.int64)
        return lo, np.minimum(lo + 1, n - 1), pos - lo
    r0, r1, fr = weights(rows, plane.shape[0])
    c0, c1, fc = weights(cols, plane.shape[1])
    top = plane[r0][:, c0] * (1 - fc) + plane[r0][:, c1] * fc
    bottom = plane[r1][:, c0] * (1 - fc) + plane[r1][:, c1] * fc
    return top * (1 - fr[:, None]) + bottom * fr[:, None]


# The display convention the planes are shown in (radiological): axial seen from the feet (the patient's
# right on the image's left, anterior up), coronal from the front (right on the left, superior up),
# sagittal from the patient's left (anterior on the left, superior up). As array axes of the shown
# volume: 0 runs superior to inferior, 1 anterior to posterior, 2 right to left; RAS components
# z, y, x, each decreasing. This is the preview sheet's note of it, two lines.
DISPLAY_CONVENTION = ("Planes in the radiological convention: axial seen from the feet (the patient's right on the "
                      "image's left, anterior up);",
                      "coronal from the front (right on the left, superior up); sagittal from the patient's left "
                      "(anterior on the left, superior up).")


def display_axes(affine) -> tuple[tuple[int, int, int], tuple[bool, bool, bool]]:
    """(axes, flips): how a stored volume [k, j, i] becomes its display array (`DISPLAY_CONVENTION`).

    Display axis t (0: superior to inferior, 1: anterior to posterior, 2: right to left) is the
    stored array axis `axes[t]` (0: k, 1: j, 2: i), reversed when `flips[t]`: of the six ways to
    pair them, the one whose voxel directions (the affine's columns) lie closest to the display
    axes, as nibabel's `io_orientation` picks; an oblique volume is shown in its closest order,
    not resampled. An affine without three finite independent columns keeps the stored order.
    """
    columns = np.asarray(affine, np.float64)[:3, :3]
    if not np.isfinite(columns).all() or abs(np.linalg.det(columns)) < 1e-12:
        return (0, 1, 2), (False, False, False)
    # Direction of stored array axis a (k, j, i: the affine's columns 2, 1, 0), unit length.
    directions = [columns[:, 2 - a] / np.linalg.norm(columns[:, 2 - a]) for a in range(3)]
    # Display axis t is RAS component 2 - t (z, y, x), decreasing.
    best = max(itertools.permutations(range(3)),
               key=lambda axes: sum(abs(directions[a][2 - t]) for t, a in enumerate(axes)))
    return best, tuple(bool(directions[a][2 - t] > 0) for t, a in enumerate(best))


def _displayed(values: np.ndarray, axes, flips) -> np.ndarray:
    """A stored [k, j, i] array as its display array: axes permuted, then reversed where flipped (a view)."""
    shown = np.transpose(values, axes)
    return shown[tuple(slice(None, None, -1) if flip else slice(None) for flip in flips)]


@dataclasses.dataclass(frozen=True)
class VolumePlanes:
    """A volume's three shown planes, at the display scale.

    Attributes:
      slices: (k, j, i): the stored voxel the three shown planes cross at.
      through_foreground: Whether they were chosen through the mask's foreground (else middle slices).
      grey: Axial, coronal and sagittal uint8 planes, resampled so one pixel is `step` mm along both
        sides (linear); with the volume's affine, in `DISPLAY_CONVENTION` (axial: rows anterior to
        posterior, columns the patient's right to left; coronal: rows superior to inferior,
        columns right to left; sagittal: rows superior to inferior, columns anterior to
        posterior), else in stored voxel order (axial [h, w], coronal [d, w], sagittal [d, h]).
      ids: The mask's class ids on the same pixels (nearest), or None without a mask.
      window: (low, high): the values shown black and white.
      step: Millimetres per displayed pixel.
    """

    slices: tuple[int, int, int]
    through_foreground: bool
    grey: tuple[np.ndarray, np.ndarray, np.ndarray]
    ids: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    window: tuple[float, float]
    step: float


def volume_planes(volume: np.ndarray, spacing, modality: str = "", mask: np.ndarray | None = None,
                  max_side: int = _MAX_SIDE, affine=None) -> VolumePlanes:
    """The axial, coronal and sagittal planes a preview shows of a volume (depth, height, width).

    With its `affine` (voxel (i, j, k) to RAS, as records store it), the volume and its mask are
    first put in `DISPLAY_CONVENTION` (`display_axes`: axes permuted and reversed, never
    resampled), so a volume stored LPS, RAS or sagittally shows the same planes; without, the
    stored voxel order is shown. With a mask, each plane is the slice holding the most foreground
    voxels along its axis (middle slices when the mask has none); without, the middle slices.
    Every plane is resampled to square pixels of `step` mm (the smallest voxel spacing, coarser
    when the longest side would pass `max_side`), so 5 mm CT slices are not squashed: linearly
    for the voxels, by nearest neighbour for the class ids. CT (modality 'CT') is shown in
    `CT_WINDOW`, other volumes between their `PERCENTILES`.
    """
    if isinstance(max_side, bool) or not isinstance(max_side, int) or max_side < 1:
        raise ValueError(f"max_side must be a positive int (pixels). Received: {max_side!r}")
    axes, flips = ((0, 1, 2), (False, False, False)) if affine is None else display_axes(affine)
    stored_shape = volume.shape
    volume = _displayed(volume, axes, flips)
    mask = None if mask is None else _displayed(mask, axes, flips)
    spacing = tuple(float(spacing[a]) for a in axes)
    d, h, w = volume.shape
    sz, sy, sx = spacing
    chosen = None if mask is None else _foreground_slices(mask, _ignore_id(mask.dtype.name))
    k, j, i = chosen or (d // 2, h // 2, w // 2)
    step = max(min(sz, sy, sx), max(d * sz, h * sy, w * sx) / max_side)
    low, high = _intensity_window(volume, modality)
    cuts = ((volume[k], mask[k] if mask is not None else None, (h, sy), (w, sx)),
            (volume[:, j, :], mask[:, j, :] if mask is not None else None, (d, sz), (w, sx)),
            (volume[:, :, i], mask[:, :, i] if mask is not None else None, (d, sz), (h, sy)))
    grey, ids = [], []
    for plane, labels, (nr, sr), (nc, sc) in cuts:
        rows = _sample_positions(sr, max(1, round(nr * sr / step)), step)
        cols = _sample_positions(sc, max(1, round(nc * sc / step)), step)
        values = _linear(plane.astype(np.float64), rows, cols)
        scaled = np.clip((values - low) / (high - low), 0, 1) if high > low else np.zeros_like(values)
        grey.append(np.round(np.nan_to_num(scaled) * 255).astype(np.uint8))
        if labels is not None:
            ids.append(_nearest(labels, rows, cols))
    # The stored voxel the planes cross at (display index t is stored axis axes[t], maybe reversed).
    stored = [0, 0, 0]
    for t, (a, flip) in enumerate(zip(axes, flips)):
        stored[a] = stored_shape[a] - 1 - (k, j, i)[t] if flip else (k, j, i)[t]
    return VolumePlanes(tuple(stored), chosen is not None, tuple(grey), tuple(ids) if mask is not None else None,
                        (low, high), step)


def _preview():
    """`shardsmith.preview`: its mask colours and legend (imported on use: the colours come with the readers)."""
    from shardsmith import preview

    return preview


def render_row(planes: VolumePlanes, gap: int = 6) -> np.ndarray:
    """The RGB row of a volume [h, w, 3]: its three planes left to right, `gap` white pixels apart, each
    mask class id > 0 coloured over them as image previews colour masks (the ignore id left clear)."""
    preview = _preview()
    height = max(g.shape[0] for g in planes.grey)
    width = sum(g.shape[1] for g in planes.grey) + gap * 2
    row = np.full((height, width, 3), 255, np.uint8)
    x = 0
    for c, grey in enumerate(planes.grey):
        pixels = np.repeat(grey[..., None], 3, axis=2)
        if planes.ids is not None:
            pixels = _paint(pixels, planes.ids[c], preview)
        row[:grey.shape[0], x:x + grey.shape[1]] = pixels
        x += grey.shape[1] + gap
    return row


def _paint(pixels: np.ndarray, ids: np.ndarray, preview) -> np.ndarray:
    """`pixels` with each foreground id's colour blended in at `MASK_ALPHA`."""
    ignore = _ignore_id(ids.dtype.name)
    out = pixels.astype(np.float64)
    alpha = preview.MASK_ALPHA
    for i in np.unique(ids).tolist():
        if i in (0, ignore):  # Background (most of a volume) and the ignore id: the anatomy shows.
            continue
        where = ids == i
        out[where] = out[where] * (1 - alpha) + np.asarray(preview.colour_of(i), np.float64) * alpha
    return np.round(out).astype(np.uint8)


def _how_shown(planes: VolumePlanes, modality: str) -> str:
    k, j, i = planes.slices
    where = ("through the mask" if planes.through_foreground
             else "middle, empty mask" if planes.ids is not None else "middle")
    if modality == "CT":
        level, width = CT_WINDOW
        window = f"CT W {width:g} L {level:g}"
    else:
        window = f"p{PERCENTILES[0]:g}-p{PERCENTILES[1]:g} {planes.window[0]:.4g}..{planes.window[1]:.4g}"
    return f"voxel k={k} j={j} i={i} ({where}); {window}; {planes.step:.3g} mm/px"


def preview_volumes(folder: str, limit: int = 16) -> str:
    """Writes PREVIEW_FILENAME: a row per volume (the first `limit`), its axial, coronal and sagittal
    planes side by side in `DISPLAY_CONVENTION` (`volume_planes` with each record's affine,
    `render_row`), captioned; a masked dataset's class colours are named in a legend under the sheet
    (`shardsmith.preview.rows_sheet`)."""
    from conversion.files import write_atomically

    preview = _preview()
    manifest = _volumes.read_manifest(folder)
    schema = _schema(manifest)
    section = _mask_section(folder) if schema.mask else {}
    names = section.get("class_names") or []
    rows, shown_ids = [], set()
    for _, _, payload in _records(folder, manifest):
        values = schema.decode(payload)
        mask = values.get(VOLUME_MASK.key)
        planes = volume_planes(values[VOLUME.key], values[VOLUME_SPACING.key], values[VOLUME_MODALITY.key], mask,
                               affine=values[VOLUME_AFFINE.key])
        if planes.ids is not None:
            ignore = _ignore_id(mask.dtype.name)
            shown_ids.update(i for ids in planes.ids for i in np.unique(ids).tolist() if i not in (0, ignore))
        caption = f"{values[FILENAME.key]}: {_how_shown(planes, values[VOLUME_MODALITY.key])}"
        rows.append((caption, render_row(planes)))
        if len(rows) == limit:
            break
    notes = [*DISPLAY_CONVENTION,
             f"Square pixels at the voxel spacing. CT: window W {CT_WINDOW[1]:g} L {CT_WINDOW[0]:g} HU; other "
             f"volumes: their {PERCENTILES[0]:g}-{PERCENTILES[1]:g} % percentiles."]
    entries = []
    if schema.mask:
        dtype = section.get("dtype") or "uint8"
        entries = [(None, "mask classes:")] + [(preview.colour_of(i), _class_name(i, names))
                                               for i in sorted(shown_ids)]
        entries.append((None, f"(0 background, {_ignore_id(dtype)} ignore: not coloured)"))
    buf = io.BytesIO()
    preview.rows_sheet(rows, notes, entries).save(buf, format="PNG", optimize=False)
    write_atomically(folder, PREVIEW_FILENAME, buf.getvalue())
    return os.path.join(folder, PREVIEW_FILENAME)


def main(command: str, folder: str) -> int:
    if command == "inspect":
        print(inspect_volumes(folder))
        return 0
    print(preview_volumes(folder))
    return 0
