"""Tests of the target label modes of readers (issue 24): mask, boxes, multi_hot, target.

The datasets are written by `_reader_data.write_target_dataset`: Pillow-encoded images of
four coloured regions whose masks carry one id per region and whose boxes frame two of the
regions, so that after any geometric step the test can tell, from the output image itself,
where the mask ids and the boxes must be.
"""

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import readers
from readers import image_dataset_from_tfrecords
from schemas import BBOX_IS_CROWD, FILENAME, LABELS

import _reader_data as rd

NAMES = (FILENAME.key,)
SIZE = (24, 24)
COLOURS = np.asarray(rd.REGION_COLOURS, np.float32)
REPO = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "_reader_targets_strategy_child.py"


def _items(count, *, kinds=("rgb_png", "rgb_jpeg"), sizes=((48, 64), (64, 40)), **kwargs):
    return [rd.region_item(i, *sizes[i % len(sizes)], kind=kinds[(i // len(sizes)) % len(kinds)],
                           **kwargs)
            for i in range(count)]


@pytest.fixture(scope="module")
def seg(tmp_path_factory):
    """Masks and boxes, no image-level class; landscape and portrait, PNG and JPEG."""
    data_dir = tmp_path_factory.mktemp("seg") / "dataset"
    items = rd.write_target_dataset(data_dir, _items(8))
    return data_dir, {item.filename: item for item in items}


@pytest.fixture(scope="module")
def seg16(tmp_path_factory):
    """16-bit masks (ids above 255), PNG images of one size (portrait)."""
    data_dir = tmp_path_factory.mktemp("seg16") / "dataset"
    items = rd.write_target_dataset(
        data_dir, _items(4, kinds=("rgb_png",), sizes=((64, 40),), mask_ids=rd.REGION_IDS_16),
        targets=("mask",))
    return data_dir, {item.filename: item for item in items}


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    """Several labels per image and regression targets, three classes."""
    data_dir = tmp_path_factory.mktemp("multi") / "dataset"
    items = rd.write_target_dataset(
        data_dir, _items(6), targets=("labels", "target"), class_names=("sky", "tree", "road"))
    return data_dir, {item.filename: item for item in items}


def _read(data_dir, **options):
    options = {"image_size": SIZE, "batch_size": 4, "shuffle": False,
               "extra_features": NAMES, **options}
    return image_dataset_from_tfrecords(data_dir, **options)


def _examples(ds):
    """(image, label, filename) per example of a batched dataset read with NAMES."""
    out = []
    for images, labels, extras in ds:
        for i, name in enumerate(extras[FILENAME.key].numpy()):
            label = tf.nest.map_structure(lambda t, i=i: t[i].numpy(), labels)
            out.append((images[i].numpy(), label, name.decode()))
    return out


def _pillow(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


def _classify(image):
    """Index of the nearest region colour of every pixel (4: black, the padding)."""
    palette = np.concatenate([COLOURS, np.zeros((1, 3), np.float32)])
    distance = ((image[:, :, None, :] - palette[None, None]) ** 2).sum(-1)
    return distance.argmin(-1)


def _region_index(mask, ids, ignore):
    lookup = {int(v): i for i, v in enumerate(ids)} | {ignore: 4}
    return np.vectorize(lookup.__getitem__)(mask[..., 0])


def _assert_aligned(image, mask, ids, ignore, *, exact, min_share=1.0):
    """Mask ids sit under their region's colour (padding: ignore id under black)."""
    assert set(np.unique(mask)) <= {*map(int, ids), ignore}
    regions = _region_index(mask, ids, ignore)
    if exact:
        palette = np.concatenate([COLOURS, np.zeros((1, 3), np.float32)])
        np.testing.assert_array_equal(image, palette[regions])
        return
    # Where the mask's 3x3 neighbourhood is one region, away from blended edges.
    padded = np.pad(regions, 1, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3))
    interior = (windows == regions[..., None, None]).all(axis=(-1, -2))
    assert interior.sum() > 0
    share = (_classify(image)[interior] == regions[interior]).mean()
    assert share >= min_share, share


# --- Masks -----------------------------------------------------------------------------------


def test_mask_and_image_come_back_exactly_as_stored(seg, seg16):
    for (data_dir, items), ids in ((seg, rd.REGION_IDS_8), (seg16, rd.REGION_IDS_16)):
        ds = image_dataset_from_tfrecords(
            data_dir, image_size=None, batch_size=None, label_mode="mask", shuffle=False,
            dtype="uint8", extra_features=NAMES,
        )
        seen = []
        for image, mask, extras in ds:
            item = items[extras[FILENAME.key].numpy().decode()]
            assert mask.dtype == tf.int32 and mask.shape == (*item.mask.shape, 1)
            # The mask PNG as Pillow writes and reads it, bit for bit.
            np.testing.assert_array_equal(mask.numpy()[..., 0], _pillow(rd._mask_png(item.mask)))
            assert set(np.unique(mask.numpy())) == set(ids)
            encoded = rd.encode_image(item.pixels, item.kind)
            if item.kind == "rgb_png":
                np.testing.assert_array_equal(image.numpy(), _pillow(encoded))
            else:  # Another JPEG decoder: the same picture within rounding.
                assert np.abs(image.numpy().astype(int) - _pillow(encoded).astype(int)).max() <= 3
            seen.append(item.filename)
        assert sorted(seen) == sorted(items)
    # Batched at the stored size (one size in the split): static shapes, the ids as stored.
    data_dir, items = seg16
    ds = _read(data_dir, label_mode="mask", image_size=None, batch_size=3)
    assert ds.element_spec[1].shape.as_list() == [None, 64, 40, 1]
    for _, masks, extras in ds:
        for mask, name in zip(masks.numpy(), extras[FILENAME.key].numpy()):
            np.testing.assert_array_equal(mask[..., 0], items[name.decode()].mask)


@pytest.mark.parametrize("options", [
    {},
    {"resize": "pad"},
    {"resize": "crop"},
    {"resize": "crop", "crop_fraction": 0.6},
    {"augment": "standard", "seed": 5},
    {"augment": "standard", "seed": 6, "image_size": (20, 30)},
], ids=["stretch", "pad", "crop", "crop_fraction", "augment", "augment_wide"])
def test_mask_ids_stay_under_their_colours(seg, seg16, options):
    for (data_dir, items), ids, ignore in ((seg, rd.REGION_IDS_8, 255),
                                          (seg16, rd.REGION_IDS_16, 65535)):
        for interpolation in ("nearest", "bilinear"):
            examples = _examples(_read(data_dir, label_mode="mask", interpolation=interpolation,
                                       **options))
            assert len(examples) == len(items)
            for image, mask, name in examples:
                assert mask.shape == (*options.get("image_size", SIZE), 1)
                png = items[name].kind == "rgb_png"
                _assert_aligned(image, mask, ids, ignore, exact=png and interpolation == "nearest",
                                min_share=1.0 if png else 0.97)
            if options.get("resize") == "pad":
                # Landscape and portrait images both get padded rows or columns.
                assert all((mask == ignore).any() for _, mask, _ in examples)
            else:
                assert not any((mask == ignore).any() for _, mask, _ in examples)


def test_standard_augmentation_crops_and_flips_image_and_mask_alike(seg):
    data_dir, items = seg
    flipped = set()
    for seed in (1, 2, 3):
        first = _examples(_read(data_dir, label_mode="mask", augment="standard", seed=seed,
                                interpolation="nearest"))
        again = _examples(_read(data_dir, label_mode="mask", augment="standard", seed=seed,
                                interpolation="nearest"))
        # The same seed, the same crops and flips, image and mask alike.
        for (i0, m0, n0), (i1, m1, n1) in zip(first, again):
            assert n0 == n1
            np.testing.assert_array_equal(i0, i1)
            np.testing.assert_array_equal(m0, m1)
        # The images are those of the image-only read with that seed: one crop, one flip.
        alone = _read(data_dir, label_mode=None, augment="standard", seed=seed,
                      interpolation="nearest")
        images_alone = np.concatenate([images.numpy() for images, _ in alone])
        np.testing.assert_array_equal(np.stack([e[0] for e in first]), images_alone)
        for image, mask, name in first:
            if items[name].kind == "rgb_png":
                _assert_aligned(image, mask, rd.REGION_IDS_8, 255, exact=True)
            # The top-left region's id (1) left of the top-right's (2) unless flipped.
            cols = [np.nonzero((mask[..., 0] == v).any(axis=0))[0] for v in (1, 2)]
            if len(cols[0]) and len(cols[1]):
                flipped.add(bool(cols[0].mean() > cols[1].mean()))
    assert flipped == {True, False}


def test_jpeg_windows_decode_fused_and_stay_aligned(seg):
    """The random crop of JPEGs goes through decode_and_crop_jpeg: same window as the mask."""
    data_dir, items = seg
    jpegs = 0
    for seed in range(4):
        for image, mask, name in _examples(_read(data_dir, label_mode="mask", augment="standard",
                                                 seed=seed, image_size=(32, 32))):
            if items[name].kind == "rgb_jpeg":
                jpegs += 1
                _assert_aligned(image, mask, rd.REGION_IDS_8, 255, exact=False, min_share=0.97)
    assert jpegs == 16


def test_a_mask_of_another_size_than_its_image_fails_the_read(tmp_path):
    item = rd.region_item(0, 48, 64)
    narrow = dataclasses.replace(item, mask=item.mask[:, :60])
    data_dir = tmp_path / "dataset"
    rd.write_target_dataset(data_dir, [narrow], targets=("mask",), num_shards=1)
    for options in ({}, {"image_size": None, "batch_size": None}):
        with pytest.raises(tf.errors.InvalidArgumentError):
            list(_read(data_dir, label_mode="mask", **options))


def test_a_split_of_jpegs_only_reads_alike(tmp_path):
    """A split whose manifest lists JPEGs only decodes them without a format check."""
    data_dir = tmp_path / "dataset"
    items = {item.filename: item for item in rd.write_target_dataset(
        data_dir, _items(4, kinds=("rgb_jpeg",)), targets=("mask",))}
    for options in ({"augment": "standard", "seed": 2}, {"resize": "pad"}, {}):
        examples = _examples(_read(data_dir, label_mode="mask", **options))
        assert sorted(name for *_, name in examples) == sorted(items)
        for image, mask, _ in examples:
            _assert_aligned(image, mask, rd.REGION_IDS_8, 255, exact=False, min_share=0.97)
    ds = _read(data_dir, label_mode="mask", image_size=None, batch_size=None)
    for image, mask, extras in ds:
        item = items[extras[FILENAME.key].numpy().decode()]
        np.testing.assert_array_equal(mask.numpy()[..., 0], item.mask)
        reference = _pillow(rd.encode_image(item.pixels, item.kind)).astype(int)
        assert np.abs(image.numpy().astype(int) - reference).max() <= 3


# --- Boxes -----------------------------------------------------------------------------------


def _stored_boxes(item):
    """(ymin, xmin, ymax, xmax) rows of the item's boxes, float32 as stored."""
    return np.asarray([(b[1], b[0], b[3], b[2]) for b in item.boxes], np.float32)


def _expected(rows, classes, keep_area=True):
    rows = np.clip(rows, 0.0, 1.0)
    keep = (rows[:, 2] > rows[:, 0]) & (rows[:, 3] > rows[:, 1]) if keep_area else slice(None)
    return rows[keep], np.asarray(classes)[keep]


def test_boxes_of_a_plain_resize_are_the_stored_fractions(seg):
    data_dir, items = seg
    ds = _read(data_dir, label_mode="boxes")
    assert ds.class_names == ["roof", "lawn", "edge"]
    images, labels, _ = next(iter(ds))
    assert isinstance(labels["boxes"], tf.RaggedTensor)
    assert labels["boxes"].shape.as_list() == [4, None, 4]
    assert labels["classes"].dtype == tf.int32 and labels["boxes"].dtype == tf.float32
    for _, label, name in _examples(ds):
        item = items[name]
        np.testing.assert_array_equal(label["boxes"], _stored_boxes(item))
        np.testing.assert_array_equal(label["classes"], item.box_labels)


def test_boxes_follow_a_centre_crop(seg):
    data_dir, items = seg
    for fraction in (1.0, 0.5):
        examples = _examples(_read(data_dir, label_mode="boxes", resize="crop",
                                   crop_fraction=fraction))
        assert len(examples) == len(items)
        for _, label, name in examples:
            item = items[name]
            height, width = item.mask.shape
            # Keras's crop_to_aspect_ratio for a square output: the centred square,
            # then its centre `fraction`.
            side = int(min(height, width) * fraction)
            top, left = (height - side) // 2, (width - side) // 2
            rows = _stored_boxes(item).astype(np.float64)
            rows[:, [0, 2]] = (rows[:, [0, 2]] * height - top) / side
            rows[:, [1, 3]] = (rows[:, [1, 3]] * width - left) / side
            boxes, classes = _expected(rows, item.box_labels)
            np.testing.assert_allclose(label["boxes"], boxes, atol=1e-6)
            np.testing.assert_array_equal(label["classes"], classes)
            if width > height:  # Landscape: the thin box at the left edge is cut away.
                assert 2 not in label["classes"]


def test_boxes_follow_padding(seg):
    data_dir, items = seg
    for _, label, name in _examples(_read(data_dir, label_mode="boxes", resize="pad",
                                          image_size=(30, 30))):
        item = items[name]
        height, width = item.mask.shape
        side = max(height, width)  # Padded to a square, the image centred.
        top, left = (side - height) // 2, (side - width) // 2
        rows = _stored_boxes(item).astype(np.float64)
        rows[:, [0, 2]] = (rows[:, [0, 2]] * height + top) / side
        rows[:, [1, 3]] = (rows[:, [1, 3]] * width + left) / side
        boxes, classes = _expected(rows, item.box_labels)
        np.testing.assert_allclose(label["boxes"], boxes, atol=1e-6)
        np.testing.assert_array_equal(label["classes"], classes)
        assert len(classes) == 3


def _extent(region):
    """(ymin, xmin, ymax, xmax) fractions of the pixels where `region` is true."""
    rows, cols = np.nonzero(region)
    height, width = region.shape
    return np.asarray([rows.min() / height, cols.min() / width,
                       (rows.max() + 1) / height, (cols.max() + 1) / width])


def test_boxes_frame_their_regions_after_standard_augmentation(seg):
    data_dir, items = seg
    flips, kept, dropped = set(), 0, 0
    for seed in range(6):
        examples = _examples(_read(data_dir, label_mode="boxes", augment="standard", seed=seed,
                                   interpolation="nearest", image_size=(32, 32)))
        for image, label, name in examples:
            if items[name].kind != "rgb_png":
                continue
            colours = _classify(image)
            for cls, region in ((0, 0), (1, 3)):  # roof: top-left (red), lawn: bottom-right
                rows = label["boxes"][label["classes"] == cls]
                pixels = colours == region
                if not len(rows):
                    # Dropped: the crop holds none of the region.
                    assert not pixels.any()
                    dropped += 1
                    continue
                if not pixels.any():  # A sliver thinner than an output pixel.
                    assert min(rows[0, 2] - rows[0, 0], rows[0, 3] - rows[0, 1]) < 1 / 32 + 1e-6
                    continue
                np.testing.assert_allclose(rows[0], _extent(pixels), atol=1 / 32 + 1e-6)
                kept += 1
                if cls == 0:
                    flips.add(bool(rows[0, 1] > 0.0 and rows[0, 3] >= 1.0 - 1e-6))
    assert kept > 20 and flips == {True, False}


def test_pad_boxes_pads_with_minus_one_and_keeps_the_first(seg):
    data_dir, items = seg
    for n in (5, 2):
        ds = _read(data_dir, label_mode="boxes", pad_boxes=n)
        spec = ds.element_spec[1]
        assert spec["boxes"].shape.as_list() == [None, n, 4]
        assert spec["classes"].shape.as_list() == [None, n]
        for _, label, name in _examples(ds):
            stored = _stored_boxes(items[name])
            kept = min(n, len(stored))
            np.testing.assert_array_equal(label["boxes"][:kept], stored[:kept])
            np.testing.assert_array_equal(label["classes"][:kept], items[name].box_labels[:kept])
            np.testing.assert_array_equal(label["boxes"][kept:], -1.0)
            np.testing.assert_array_equal(label["classes"][kept:], -1)


def test_boxes_unbatched_and_ragged_batches(seg):
    data_dir, items = seg
    ds = _read(data_dir, label_mode="boxes", batch_size=None)
    for _, label, extras in ds:
        item = items[extras[FILENAME.key].numpy().decode()]
        assert isinstance(label["boxes"], tf.Tensor) and label["boxes"].shape == (3, 4)
        np.testing.assert_array_equal(label["boxes"], _stored_boxes(item))
    # Ragged batches: one row of boxes per image; list extras ragged as well.
    ds = _read(data_dir, label_mode="boxes", resize="crop", batch_size=3,
               extra_features=(FILENAME.key, BBOX_IS_CROWD.key))
    lengths = []
    for _, label, extras in ds:
        assert isinstance(extras[BBOX_IS_CROWD.key], tf.RaggedTensor)
        assert label["boxes"].row_lengths().numpy().tolist() == (
            label["classes"].row_lengths().numpy().tolist())
        for name, crowd in zip(extras[FILENAME.key].numpy(), extras[BBOX_IS_CROWD.key]):
            assert crowd.numpy().tolist() == list(items[name.decode()].is_crowd)
        lengths += label["boxes"].row_lengths().numpy().tolist()
    landscape = sum(1 for item in items.values() if item.mask.shape[1] > item.mask.shape[0])
    assert sorted(lengths) == [2] * landscape + [3] * (len(items) - landscape)


# --- Multi-hot and regression targets ---------------------------------------------------------


def test_multi_hot_and_target_values(multi):
    data_dir, items = multi
    examples = _examples(_read(data_dir, label_mode="multi_hot"))
    assert len(examples) == len(items)
    for _, hot, name in examples:
        expected = np.zeros(3, np.float32)
        expected[list(items[name].labels)] = 1.0
        assert hot.dtype == np.float32
        np.testing.assert_array_equal(hot, expected)
    for _, target, name in _examples(_read(data_dir, label_mode="target", augment="standard",
                                           seed=0)):
        np.testing.assert_array_equal(target, np.asarray(items[name].target, np.float32))
    ds = _read(data_dir, label_mode="target")
    assert ds.element_spec[1].shape.as_list() == [None, 2]
    # The image-level label still reads (the first class here), and `labels` as an extra.
    ds = _read(data_dir, label_mode="int", extra_features=(FILENAME.key, LABELS.key))
    for _, labels, extras in ds:
        for label, name, classes in zip(labels.numpy(), extras[FILENAME.key].numpy(),
                                        extras[LABELS.key]):
            assert classes.numpy().tolist() == list(items[name.decode()].labels)
            assert label == items[name.decode()].labels[0]


def test_label_modes_the_dataset_lacks_are_refused(seg, multi):
    seg_dir, multi_dir = seg[0], multi[0]
    with pytest.raises(ValueError, match=r"label_mode='int'.*no image-level classes.*"
                                         r"\('mask', 'boxes', None\)"):
        image_dataset_from_tfrecords(seg_dir, label_mode="int")
    with pytest.raises(ValueError, match=r"label_mode='binary'.*\('mask', 'boxes', None\)"):
        image_dataset_from_tfrecords(seg_dir, label_mode="binary")
    with pytest.raises(ValueError, match=r"no 'mask' target.*\['labels', 'target'\].*"
                                         r"'multi_hot', 'target'"):
        image_dataset_from_tfrecords(multi_dir, label_mode="mask")
    with pytest.raises(ValueError, match=r"no 'labels' target"):
        readers.distributed_dataset(tf.distribute.get_strategy(), seg_dir,
                                    global_batch_size=2, label_mode="multi_hot")
    with pytest.raises(ValueError, match=r"`pad_boxes` applies to label_mode='boxes' and 'oriented_boxes' only"):
        image_dataset_from_tfrecords(seg_dir, label_mode="mask", pad_boxes=3)
    with pytest.raises(ValueError, match=r"`pad_boxes` must be a positive integer"):
        image_dataset_from_tfrecords(seg_dir, label_mode="boxes", pad_boxes=0)
    with pytest.raises(ValueError, match=r"callable `augment`.*label_mode='mask'"):
        image_dataset_from_tfrecords(seg_dir, label_mode="mask", augment=lambda x: x)


def test_target_modes_read_damaged_shards_and_global_shuffle(seg, tmp_path):
    """A skipped damaged record (its placeholder decodes as a 1x1 mask) and shuffle='global'."""
    data_dir, items = seg
    ds = _read(data_dir, label_mode="mask", shuffle="global", seed=3, batch_size=3)
    assert sorted(name for *_, name in _examples(ds)) == sorted(items)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for path in data_dir.iterdir():
        (damaged / path.name).write_bytes(path.read_bytes())
    shard = sorted(damaged.glob("train-*.tfrecord"))[0]
    data = bytearray(shard.read_bytes())
    data[40] ^= 0xFF  # Inside the first record's data: its CRC no longer matches.
    shard.write_bytes(bytes(data))
    for mode in ("mask", "boxes"):
        ds = _read(damaged, label_mode=mode, max_bad_records=1)
        examples = _examples(ds)
        assert len(examples) == len(items) - 1
        assert all(name in items for *_, name in examples)


@pytest.mark.parametrize("options", [{"augment": "standard", "seed": 4},
                                     {"resize": "pad", "deterministic": True}])
def test_small_records_decoded_a_batch_per_call_match_the_per_image_stages(seg, multi, options,
                                                                          monkeypatch):
    """Records of small images are decoded a batch per function call: the same elements."""
    from readers import dataset as dataset_module

    def elements(data_dir, **more):
        ds = _read(data_dir, batch_size=3, **options, **more)
        return [tf.nest.map_structure(lambda t: t.numpy(), e) for e in ds]

    reads = [(seg[0], {"label_mode": "mask"}), (seg[0], {"label_mode": "boxes", "pad_boxes": 2}),
             (multi[0], {"label_mode": "multi_hot"}), (multi[0], {"label_mode": "target"})]
    batched = [elements(data_dir, **more) for data_dir, more in reads]
    monkeypatch.setattr(dataset_module, "_BATCHED_DECODE_MAX_RECORD_BYTES", 0)
    for (data_dir, more), expected in zip(reads, batched):
        got = elements(data_dir, **more)
        assert len(got) == len(expected) > 0
        for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(expected)):
            np.testing.assert_array_equal(a, b)


# --- Training: one Keras step per mode, and under MirroredStrategy ---------------------------


def test_keras_trains_a_step_from_each_mode(seg, multi):
    import keras

    def fit(ds, outputs, loss, shape=(*SIZE, 3)):
        inputs = keras.Input(shape)
        x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
        model = keras.Model(inputs, outputs(x))
        model.compile(optimizer="sgd", loss=loss)
        return model.fit(ds.map(readers.without_extras), epochs=1, steps_per_epoch=1,
                         verbose=0).history["loss"][0]

    seg_dir, multi_dir = seg[0], multi[0]
    # Segmentation: ids 0-4, every pixel counted (no padding, nothing to ignore).
    losses = [fit(
        _read(seg_dir, label_mode="mask", augment="standard", seed=0, scale=1 / 255),
        lambda x: keras.layers.Conv2D(5, 1)(x),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )]
    # Box regression on padded boxes.
    boxes = _read(seg_dir, label_mode="boxes", pad_boxes=3, scale=1 / 255).map(
        lambda x, y, extras: (x, y["boxes"], extras))
    losses.append(fit(boxes, lambda x: keras.layers.Reshape((3, 4))(keras.layers.Dense(12)(
        keras.layers.GlobalAveragePooling2D()(x))), "mse"))
    # Multi-label: sigmoid and binary cross-entropy.
    losses.append(fit(_read(multi_dir, label_mode="multi_hot", scale=1 / 255),
                      lambda x: keras.layers.Dense(3, activation="sigmoid")(
                          keras.layers.GlobalAveragePooling2D()(x)),
                      "binary_crossentropy"))
    # Regression.
    losses.append(fit(_read(multi_dir, label_mode="target", scale=1 / 255),
                      lambda x: keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(x)),
                      "mse"))
    assert all(np.isfinite(loss) and loss > 0 for loss in losses), losses


def test_distributed_dataset_under_mirrored_strategy(seg, multi):
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(CHILD.parent),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(seg[0]), str(multi[0])],
        capture_output=True, text=True, env=env, timeout=600, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    # Per-replica batches of 2 images with their masks, 8 images over one epoch.
    assert result["mask_shapes"] == [[2, 24, 24, 1]]
    assert result["mask_images"] == 8
    assert result["boxes_shapes"] == [[2, 3, 4]]
    assert result["ragged_boxes"] == 8 * 3 - 4  # Landscape images lose the edge box (crop).
    # model.fit, one epoch of each mode: 8 and 6 records, global batches of 4.
    assert result["fit_steps"] == {"mask": 2, "boxes": 2, "multi_hot": 2, "target": 2}
    assert all(np.isfinite(loss) for loss in result["fit_loss"].values())


def test_the_image_level_class_is_rows_of_the_table_too():
    from readers import options, targets

    assert options.LABEL_MODES == (*(mode.name for mode in targets.MODES), None)
    assert targets.LABEL_MODES[:3] == ("int", "categorical", "binary")
    assert {targets.KIND_OF_MODE[m] for m in ("int", "categorical", "binary")} == {targets.CLASS_KIND}
    assert targets.TARGET_LABEL_MODES == ("mask", "boxes", "oriented_boxes", "multi_hot", "target")
    # Which modes a dataset can be read in: the rows say.
    assert targets.supported_label_modes(("a", "b"), ()) == ("int", "categorical", "binary", None)
    assert targets.supported_label_modes(("a", "b", "c"), ("mask",)) == ("int", "categorical", "mask", None)
    assert targets.supported_label_modes((), ("boxes", "target")) == ("boxes", "target", None)
    # A batch's labels, converted at once (and one example's, elementwise).
    labels = tf.constant([0, 1, 1], tf.int64)
    rows = {m: targets.mode_of(m) for m in ("int", "categorical", "binary")}
    assert rows["int"].from_class(labels, 2).dtype == tf.int32
    np.testing.assert_array_equal(rows["int"].from_class(labels, 2), [0, 1, 1])
    np.testing.assert_array_equal(rows["categorical"].from_class(labels, 3), [[1, 0, 0], [0, 1, 0], [0, 1, 0]])
    np.testing.assert_array_equal(rows["binary"].from_class(labels, 2), [[0.0], [1.0], [1.0]])
    np.testing.assert_array_equal(rows["categorical"].from_class(tf.constant(2, tf.int64), 3), [0, 0, 1])
    # Read per batch: no per-example plan.
    assert all(targets.TargetPlan.of(None, type("R", (), {"label_mode": m})) is None for m in rows)
