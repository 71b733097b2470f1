"""Scenes to patches to batches: GDAL GeoTIFFs -> the Beam converter -> the reader -> rasterio, and verify.

Three splits in one input folder (split folders), one kind of scene each,
so that each split has one stored size, dtype and band count:

- train: 13-band uint16 (raw records), tiled+deflate with nodata 0, striped+LZW without;
- validation: 4-band float32 (raw), tiled+deflate with NaN nodata, striped+LZW with -9999;
- test: 3-band uint8 (PNG records), tiled+LZW with nodata 0, striped+deflate without.

Each edge policy is one conversion; every batched patch, matched by its
filename, equals rasterio's boundless window read of its scene bit for bit
(NaN-aware), padding holding the nodata value (0 without one). Offsets are
computed here from the issue's formula, not with `imaging.patches`.
Then verify passes, and fails naming the problem on records rewritten with an
off-grid offset or a wrong shape.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import shutil

import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402
from rasterio.windows import Window  # noqa: E402

import readers  # noqa: E402
import schemas  # noqa: E402
from beam_jobs import verify  # noqa: E402
from helpers import convert, write_geotiff  # noqa: E402
from schemas.tfrecord import format_index, frame_record, iter_records  # noqa: E402

# rasterio builds its transforms with `*` (affine 2.4 asks for `@`): its own warning, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")

_RNG = np.random.default_rng(2525)
_PATCH, _STRIDE = (32, 40), (24, 32)  # Height, width: not square, so a swap shows.
_MAX_NODATA = 0.7
_BATCH = 4


def _scene(path: pathlib.Path, array: np.ndarray, nodata=None, **profile) -> pathlib.Path:
    """A GeoTIFF of (bands, height, width) written by GDAL."""
    return write_geotiff(path, array, nodata, crs="EPSG:32633", transform=from_origin(500000.0, 4100000.0, 10.0, 10.0), **profile)


def _write_scenes(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """The input folder; {relative path: file} of each scene."""
    tiled = dict(tiled=True, blockxsize=32, blockysize=32)
    u16 = _RNG.integers(1, 65536, (13, 70, 90), dtype=np.uint16)
    u16[:, :40, :50] = 0  # Nodata in the top-left corner: a patch there is skipped.
    f32_nan = _RNG.normal(300, 80, (4, 61, 83)).astype(np.float32)
    f32_nan[:, 30:, 60:] = np.nan
    f32_9999 = _RNG.normal(-20, 5, (4, 45, 70)).astype(np.float32)
    f32_9999[1, 5:9, 5:9] = -9999  # One band only: not nodata pixels.
    u8 = _RNG.integers(1, 256, (3, 66, 77), dtype=np.uint8)
    u8[:, 50:, :] = 0
    scenes = {
        "train/forest/u16_tiled.tif": (u16, dict(nodata=0, compress="deflate", **tiled)),
        "train/water/u16_striped.tif": (_RNG.integers(0, 65536, (13, 50, 100), dtype=np.uint16),
                                        dict(tiled=False, blockysize=7, compress="lzw")),
        "validation/forest/f32_tiled.tif": (f32_nan, dict(nodata=float("nan"), compress="deflate",
                                                          predictor=3, **tiled)),
        "validation/water/f32_striped.tif": (f32_9999, dict(nodata=-9999.0, tiled=False, blockysize=5,
                                                            compress="lzw")),
        "test/forest/u8_tiled.tif": (u8, dict(nodata=0, compress="lzw", **tiled)),
        "test/water/u8_striped.tif": (_RNG.integers(0, 256, (3, 40, 41), dtype=np.uint8),
                                      dict(tiled=False, blockysize=16, compress="deflate")),
    }
    return {rel: _scene(root / rel, array, **profile) for rel, (array, profile) in scenes.items()}


def _starts(length: int, size: int, stride: int, edge: str) -> list[int]:
    """Patch starts along an axis, by the issue's formula."""
    starts = list(range(0, length - size + 1, stride))
    if edge == "drop":
        return starts
    if edge == "shift":
        if not starts:
            return [0]
        return starts + [length - size] if starts[-1] + size < length else starts
    out = [0]
    while out[-1] + size < length:
        out.append(out[-1] + stride)
    return out


def _expected(path: pathlib.Path, edge: str):
    """({(y, x): window} of the kept patches, {(y, x)} skipped), from rasterio's boundless reads."""
    kept, skipped = {}, set()
    (h, w), (sh, sw) = _PATCH, _STRIDE
    with rasterio.open(path) as src:
        nodata = src.nodata
        fill = 0 if nodata is None else nodata
        for y in _starts(src.height, h, sh, edge):
            for x in _starts(src.width, w, sw, edge):
                window = np.moveaxis(src.read(window=Window(x, y, w, h), boundless=True, fill_value=fill), 0, -1)
                empty = np.isnan(window) if window.dtype.kind == "f" else np.zeros(window.shape, bool)
                if nodata is not None and not math.isnan(nodata):
                    empty |= window == nodata
                outside = ~((np.arange(y, y + h) < src.height)[:, None] & (np.arange(x, x + w) < src.width)[None])
                share = np.count_nonzero(empty.all(axis=2) | outside) / outside.size
                if share > _MAX_NODATA:
                    skipped.add((y, x))
                else:
                    kept[(y, x)] = window
    return kept, skipped


_SPLITS = {"train": (13, np.uint16), "validation": (4, np.float32), "test": (3, np.uint8)}


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes")
    return root, _write_scenes(root)


@pytest.fixture(scope="module")
def conversions(scenes, tmp_path_factory):
    """edge -> (edge, output folder, manifest, expected per scene, scene files), each converted once."""
    root, files = scenes
    done = {}

    def get(edge):
        if edge not in done:
            out = tmp_path_factory.mktemp(f"patches_{edge}") / "out"
            manifest = convert(root, out, "--raster_patch", f"{_PATCH[0]},{_PATCH[1]}", "--raster_stride",
                               f"{_STRIDE[0]},{_STRIDE[1]}", "--raster_edge", edge,
                               "--raster_max_nodata", _MAX_NODATA)
            expected = {rel: _expected(path, edge) for rel, path in files.items()}
            done[edge] = (edge, out, manifest, expected, files)
        return done[edge]

    return get


@pytest.fixture(params=["shift", "pad", "drop"])
def converted(request, conversions):
    return conversions(request.param)


def test_the_manifest_records_one_size_per_split(converted):
    _, _, manifest, expected, _ = converted
    for split, (bands, dtype) in _SPLITS.items():
        images = manifest.splits[split].images
        assert images.min_size == images.max_size == _PATCH, split
        formats = {"raw-float32"} if dtype == np.float32 else {"png" if dtype == np.uint8 else "raw-uint16"}
        assert {f for f, _ in images.formats} == formats
        assert [(c, d) for _, c, d, _ in images.layouts] == [(bands, np.dtype(dtype).name)]
        kept = sum(len(expected[rel][0]) for rel in expected if rel.startswith(split + "/"))
        assert manifest.splits[split].num_records == kept


def test_every_batched_patch_is_the_scenes_window_bit_for_bit(converted):
    edge, out, _, expected, _ = converted
    for split, (bands, dtype) in _SPLITS.items():
        ds = readers.image_dataset_from_tfrecords(
            out, split, image_size=None, batch_size=_BATCH, label_mode="int", color_mode=None, dtype=None,
            shuffle=False, extra_features=(schemas.FILENAME.key,))
        seen = {}
        for images, labels, extras in ds:
            assert tuple(images.shape[1:]) == (*_PATCH, bands) and images.dtype.as_numpy_dtype == dtype
            assert images.shape[0] <= _BATCH
            for image, label, name in zip(images.numpy(), labels.numpy(), extras[schemas.FILENAME.key].numpy()):
                seen[name.decode()] = (image, int(label))
        want = {f"{rel}#patch={y},{x}": (window, ["forest", "water"].index(rel.split("/")[1]))
                for rel, (kept, _) in expected.items() if rel.startswith(split + "/")
                for (y, x), window in kept.items()}
        assert sorted(seen) == sorted(want), (edge, split)
        for name, (window, label) in want.items():
            got, got_label = seen[name]
            np.testing.assert_array_equal(got, window, err_msg=f"{edge} {name}")  # NaN equals NaN
            assert got_label == label


def test_label_mode_none_batches_the_images_alone(converted):
    _, out, manifest, _, _ = converted
    for split, (bands, _) in _SPLITS.items():
        ds = readers.image_dataset_from_tfrecords(out, split, image_size=None, batch_size=_BATCH,
                                                  label_mode=None, color_mode=None, dtype=None, seed=1)
        sizes = [tuple(images.shape) for images in ds]
        assert all(s[1:] == (*_PATCH, bands) for s in sizes)
        assert sum(s[0] for s in sizes) == manifest.splits[split].num_records


@pytest.mark.parametrize("rel, offset, fill", [
    ("train/water/u16_striped.tif", (24, 64), 0),  # 50 x 100, no nodata: 0.
    ("validation/water/f32_striped.tif", (24, 32), -9999.0),  # 45 x 70, nodata -9999.
    ("validation/forest/f32_tiled.tif", (48, 0), float("nan")),  # 61 x 83, nodata NaN.
])
def test_padding_holds_the_nodata_value_or_zero(conversions, rel, offset, fill):
    _, out, _, _, files = conversions("pad")
    split = rel.split("/")[0]
    ds = readers.image_dataset_from_tfrecords(out, split, image_size=None, batch_size=None, label_mode=None,
                                              color_mode=None, dtype=None, shuffle=False,
                                              extra_features=(schemas.FILENAME.key,))
    name = f"{rel}#patch={offset[0]},{offset[1]}"
    images = [image.numpy() for image, extras in ds if extras[schemas.FILENAME.key].numpy().decode() == name]
    assert len(images) == 1, name
    with rasterio.open(files[rel]) as src:
        inside_rows, inside_columns = src.height - offset[0], src.width - offset[1]
    image = images[0]
    outside = ~((np.arange(_PATCH[0]) < inside_rows)[:, None] & (np.arange(_PATCH[1]) < inside_columns)[None])
    assert outside.any() and not outside.all()
    padding = image[outside]
    np.testing.assert_array_equal(padding, np.full(padding.shape, fill, image.dtype))
    assert not np.isnan(image[~outside]).all() if image.dtype.kind == "f" else image[~outside].any()


def test_verify_passes_and_counts_every_scene(converted):
    edge, out, manifest, expected, files = converted
    assert verify.main([str(out)]) == 0
    section = manifest.extra["patches"]
    assert section["scenes"] == len(expected)
    assert section["written"] == sum(len(k) for k, _ in expected.values())
    assert section["skipped_nodata"] == sum(len(s) for _, s in expected.values())
    assert section["skipped_nodata"] > 0, "the case must skip patches"
    for rel, (kept, skipped) in expected.items():
        with rasterio.open(files[rel]) as src:
            size = [src.height, src.width]
        assert section["listed"][rel] == {"size": size, "written": len(kept), "skipped_nodata": len(skipped),
                                          "failed_items": 0}


def test_resized_patches_batch_at_their_one_stored_size_and_verify(scenes, tmp_path):
    root, _ = scenes
    manifest = convert(root, tmp_path / "out", "--raster_patch", f"{_PATCH[0]},{_PATCH[1]}", "--max_side", 20)
    stored = (16, 20)  # 32 x 40 with its longer side at 20.
    for split, (bands, dtype) in _SPLITS.items():
        assert manifest.splits[split].images.min_size == manifest.splits[split].images.max_size == stored
        ds = readers.image_dataset_from_tfrecords(tmp_path / "out", split, image_size=None, batch_size=_BATCH,
                                                  label_mode=None, color_mode=None, dtype=None, seed=0)
        shapes = {tuple(images.shape[1:]) for images in ds}
        assert shapes == {(*stored, bands)}, split
    assert verify.main([str(tmp_path / "out")]) == 0


# --- verify on tampered datasets --------------------------------------------------------------


def _rewrite_one(out: pathlib.Path, split: str, change) -> str:
    """Rewrites one record of `split` with `change(values) -> ImageRecord`, keeping shards, index
    files and the manifest's sizes and hashes consistent; returns the record's new filename."""
    manifest_path = out / schemas.MANIFEST_FILENAME
    doc = json.loads(manifest_path.read_text())
    manifest = schemas.Manifest.from_json(manifest_path.read_text())
    schema = schemas.ImageExampleSchema.from_json(manifest.features)
    shard = manifest.splits[split].shards[0]
    path = out / shard.file
    with open(path, "rb") as f:
        payloads = [data for _, _, data in iter_records(f)]
    values = schema.decode(payloads[0])
    record = change(values)
    payloads[0] = schema.encode(record)
    framed = [frame_record(p) for p in payloads]
    data = b"".join(framed)
    path.write_bytes(data)
    entries, offset = [], 0
    for frame in framed:
        entries.append((offset, len(frame)))
        offset += len(frame)
    index = format_index(entries)
    (out / shard.index_file).write_bytes(index)
    for info in doc["splits"][split]["shards"]:
        if info["file"] == shard.file:
            info.update(num_bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                        index_sha256=hashlib.sha256(index).hexdigest())
    manifest_path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    return record.filename


def _record(values, **changes) -> schemas.ImageRecord:
    fields = {spec.key: values[spec.key] for spec in (schemas.IMAGE, schemas.LABEL, schemas.FILENAME,
                                                      schemas.FORMAT, schemas.HEIGHT, schemas.WIDTH,
                                                      schemas.CHANNELS)}
    args = dict(image=fields[schemas.IMAGE.key], label=fields[schemas.LABEL.key],
                filename=fields[schemas.FILENAME.key].decode(), format=fields[schemas.FORMAT.key].decode(),
                height=fields[schemas.HEIGHT.key], width=fields[schemas.WIDTH.key],
                channels=fields[schemas.CHANNELS.key])
    args.update(changes)
    return schemas.ImageRecord(**args)


@pytest.fixture
def copy_of_shift(conversions, tmp_path):
    shutil.copytree(conversions("shift")[1], tmp_path / "out")
    return tmp_path / "out"


def _problems(out: pathlib.Path) -> list[str]:
    return verify.run([str(out)])["problems"]


def test_verify_fails_on_an_offset_off_the_grid(copy_of_shift):
    out = copy_of_shift

    def off_grid(values):
        scene, _, offset = values[schemas.FILENAME.key].decode().rpartition("#patch=")
        y, x = map(int, offset.split(","))
        return _record(values, filename=f"{scene}#patch={y + 1},{x}")

    name = _rewrite_one(out, "train", off_grid)
    scene, _, offset = name.rpartition("#patch=")
    problems = _problems(out)
    assert any(p.startswith(f"{scene}: patch offsets {offset} are not on the grid of its") for p in problems), problems
    assert verify.main([str(out)]) == 1


def test_verify_fails_on_a_patch_of_another_shape(copy_of_shift):
    out = copy_of_shift

    def cropped(values):
        # A raw uint16 patch one row short, stored consistently (it decodes to what it says).
        h, w, c = values[schemas.HEIGHT.key], values[schemas.WIDTH.key], values[schemas.CHANNELS.key]
        pixels = np.frombuffer(values[schemas.IMAGE.key], "<u2").reshape(h, w, c)[1:]
        return _record(values, image=pixels.tobytes(), height=h - 1)

    name = _rewrite_one(out, "train", cropped)
    problems = _problems(out)
    want = (f"{name}: a patch of {_PATCH[0] - 1}x{_PATCH[1]} pixels, but the manifest's patch size "
            f"(options.raster.patch.size, --raster_patch) is {_PATCH[0]}x{_PATCH[1]}")
    assert any(want in p for p in problems), problems


def _edit_cut_entries(out: pathlib.Path, edit) -> str:
    """Applies `edit(details) -> bool` to the cut_into_patches entries of normalized.jsonl until one
    returns True; returns that entry's scene."""
    path = out / schemas.NORMALIZED_FILENAME
    lines = path.read_text().splitlines()
    for k, line in enumerate(lines):
        entry = json.loads(line)
        if "cut_into_patches" in entry["actions"] and edit(entry["details"]):
            lines[k] = json.dumps(entry, sort_keys=True)
            path.write_text("\n".join(lines) + "\n")
            return entry["path"].partition("#patch_rows=")[0]
    raise AssertionError("no entry edited")


def test_verify_fails_when_written_and_skipped_do_not_add_up(copy_of_shift):
    out = copy_of_shift

    def forget_a_skipped_patch(details):
        if not details["skipped"]:
            return False
        details["skipped"] = details["skipped"][1:]
        return True

    scene = _edit_cut_entries(out, forget_a_skipped_patch)
    problems = _problems(out)
    assert any(p.startswith(f"{scene}: ") and "patches written +" in p and "skipped for nodata, but the grid" in p
               for p in problems), problems


def test_verify_says_when_a_scenes_size_is_not_recorded(copy_of_shift):
    out = copy_of_shift
    scene = _edit_cut_entries(out, lambda details: details.pop("scene_size", None) is not None)
    problems = _problems(out)
    assert f"{scene}: normalized.jsonl does not record the scene's size (scene_size of its cut_into_patches " \
           "entries): its patch offsets cannot be checked" in problems, problems
