"""Tests of readers.preprocess: resize policies, augmentation and output dtypes."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from readers import preprocess

import _reader_data as rd


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    written = rd.write_dataset(
        tmp_path_factory.mktemp("pre"),
        splits={"train": 4},
        kinds=("rgb_png", "rgb_png", "rgb_jpeg", "gray16_png"),
        sizes=((12, 20), (21, 9), (15, 15), (10, 17)),
        num_shards=1,
    )
    return written.sources["train"]


def _png(sources):
    return [s for s in sources if s.kind == "rgb_png"]


@pytest.mark.parametrize("policy", ["crop", "pad"])
@pytest.mark.parametrize("target", [(8, 8), (6, 14), (14, 5)])
def test_aspect_ratio_policies_match_keras(sources, policy, target):
    # Lossless sources: the whole-image decode equals the fused window decode.
    for source in _png(sources):
        image = preprocess.load_image(tf.constant(source.data), image_size=target, resize=policy)
        expected = keras.ops.image.resize(
            rd.decoded(source).astype(np.float32),
            target,
            crop_to_aspect_ratio=policy == "crop",
            pad_to_aspect_ratio=policy == "pad",
        )
        assert image.shape == target + (3,) and image.dtype == tf.float32
        np.testing.assert_allclose(image.numpy(), np.asarray(expected), atol=1e-3)


def test_stretch_is_a_plain_resize(sources):
    for source in sources:
        image = preprocess.load_image(tf.constant(source.data), image_size=(7, 11), resize="stretch")
        expected = tf.image.resize(rd.decoded(source), (7, 11))
        np.testing.assert_allclose(image.numpy(), expected.numpy(), atol=1e-4)


@pytest.mark.parametrize("policy", ["stretch", "pad", "crop"])
@pytest.mark.parametrize("interpolation", ["bilinear", "area", "nearest"])
@pytest.mark.parametrize("size", [(16, 12), (5, 4)])  # Enlarging and shrinking.
def test_batch_loading_equals_image_by_image(tmp_path, sources, policy, interpolation, size):
    # One stored size (resized as one batch; JPEGs alone decoded without a
    # loop, here a partial batch of 3 of 4) and mixed sizes (image by image)
    # must all give exactly the pixels of `load_image`.
    same = rd.write_dataset(tmp_path / "mixed", splits={"train": 3},
                            kinds=("rgb_jpeg", "rgb_png", "rgb_jpeg"), sizes=((9, 13),) * 3,
                            num_shards=1).sources["train"]
    jpegs = rd.write_dataset(tmp_path / "jpegs", splits={"train": 3}, kinds=("rgb_jpeg",) * 3,
                             sizes=((9, 13),) * 3, num_shards=1).sources["train"]
    for batch in (same, jpegs, sources):
        encoded = tf.constant([s.data for s in batch])
        heights = tf.constant([s.pixels.shape[0] for s in batch], tf.int64)
        widths = tf.constant([s.pixels.shape[1] for s in batch], tf.int64)
        options = dict(image_size=size, resize=policy, interpolation=interpolation)
        together = preprocess.load_image_batch(encoded, heights, widths, batch_size=4, **options)
        one_by_one = [preprocess.load_image(e, **options) for e in encoded]
        np.testing.assert_array_equal(together.numpy(), np.stack(one_by_one))


def test_batches_known_to_be_jpegs_of_one_size(tmp_path):
    # The manifest's stats say so: the graph holds that path alone, and a
    # batch emptied by damaged records still gives an empty batch.
    jpegs = rd.write_dataset(tmp_path, splits={"train": 3}, kinds=("rgb_jpeg",) * 3,
                             sizes=((9, 13),) * 3, num_shards=1).sources["train"]
    options = dict(image_size=(16, 12), batch_size=4, jpegs_of_size=(9, 13))
    load = tf.function(lambda e: preprocess.load_image_batch(e, e, e, **options))
    encoded = tf.constant([s.data for s in jpegs])
    one_by_one = [preprocess.load_image(e, image_size=(16, 12)) for e in encoded]
    np.testing.assert_array_equal(load(encoded).numpy(), np.stack(one_by_one))
    assert load(tf.constant([], tf.string)).shape == (0, 16, 12, 3)


def test_pad_fills_with_zeros(sources):
    # A tall image padded to a wide aspect ratio gets black side bands.
    tall = next(s for s in _png(sources) if s.pixels.shape[0] > s.pixels.shape[1])
    image = preprocess.load_image(tf.constant(tall.data), image_size=(10, 40), resize="pad").numpy()
    h, w = tall.pixels.shape[:2]
    # The source spans w / (h * 4) of the padded width, centred.
    band = 40 * w / (h * 4)
    left, right = int((40 - band) / 2) - 1, int((40 + band) / 2) + 1
    assert (image[:, :left] == 0).all() and (image[:, right:] == 0).all()
    assert image[:, 19:21].sum() > 0


def test_center_crop_window_fraction():
    full = preprocess.center_crop_window(100, 60, (224, 224)).numpy()
    assert list(full) == [20, 0, 60, 60]  # largest centred square
    eval_crop = preprocess.center_crop_window(100, 60, (224, 224), crop_fraction=0.875).numpy()
    side = int(60 * 0.875)
    assert list(eval_crop) == [(100 - side) // 2, (60 - side) // 2, side, side]


def test_crop_fraction_zooms_into_the_centre(sources):
    source = _png(sources)[0]
    h, w = source.pixels.shape[:2]
    image = preprocess.load_image(
        tf.constant(source.data), image_size=(4, 4), resize="crop", crop_fraction=0.5,
        interpolation="nearest",
    )
    side = max(1, int(min(h, w) * 0.5))
    y, x = (h - side) // 2, (w - side) // 2
    expected = tf.image.resize(rd.decoded(source)[y : y + side, x : x + side], (4, 4), "nearest")
    np.testing.assert_array_equal(image.numpy(), tf.cast(expected, tf.float32).numpy())


def test_random_crop_window_is_seeded_and_within_bounds():
    windows = set()
    for i in range(20):
        seed = tf.constant([i, 7])
        window = preprocess.random_crop_window(50, 80, seed).numpy()
        again = preprocess.random_crop_window(50, 80, seed).numpy()
        np.testing.assert_array_equal(window, again)
        y, x, h, w = window
        assert 0 <= y and 0 <= x and 0 < h and 0 < w and y + h <= 50 and x + w <= 80
        assert h * w >= 0.08 * 50 * 80 * 0.9  # area range, allowing rounding
        windows.add(tuple(window))
    assert len(windows) > 10


@pytest.mark.parametrize("kind", ["rgb_jpeg", "rgb_png", "gray16_png"])
def test_standard_augment_shape_range_and_seed(sources, kind):
    source = next(s for s in sources if s.kind == kind)
    data = tf.constant(source.data)
    outputs = [
        preprocess.load_image(data, image_size=(9, 9), augment=True, seed=tf.constant([s, 0]))
        for s in range(6)
    ]
    for out in outputs:
        assert out.shape == (9, 9, 3) and out.dtype == tf.float32
        assert 0 <= float(tf.reduce_min(out)) and float(tf.reduce_max(out)) <= 255
    again = preprocess.load_image(data, image_size=(9, 9), augment=True, seed=tf.constant([0, 0]))
    np.testing.assert_array_equal(outputs[0].numpy(), again.numpy())
    assert len({out.numpy().tobytes() for out in outputs}) > 1


def test_standard_augment_flips(sources):
    # Each output is a crop of the source or of its mirror image: with a whole
    # image window (tiny area range is impossible to force), compare
    # horizontal gradients instead. Seeds differ, so both flips occur.
    source = _png(sources)[0]
    flips = set()
    for s in range(12):
        seed = tf.constant([s, 1])
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        window = preprocess.random_crop_window(*source.pixels.shape[:2], crop_seed).numpy()
        y, x, h, w = window
        crop = tf.image.resize(rd.decoded(source)[y : y + h, x : x + w], (6, 6)).numpy()
        out = preprocess.load_image(
            tf.constant(source.data), image_size=(6, 6), augment=True, seed=seed
        ).numpy()
        if np.allclose(out, crop, atol=1e-3):
            flips.add(False)
        else:
            np.testing.assert_allclose(out, crop[:, ::-1], atol=1e-3)
            flips.add(True)
    assert flips == {False, True}


def test_augment_needs_a_seed(sources):
    with pytest.raises(ValueError, match="`seed` is required"):
        preprocess.load_image(tf.constant(sources[0].data), image_size=(4, 4), augment=True)


def test_uint16_depth_resizes_at_full_range(sources):
    source = next(s for s in sources if s.kind == "gray16_png")
    image = preprocess.load_image(
        tf.constant(source.data), image_size=source.pixels.shape[:2], depth=tf.uint16,
        channels=1,
    )
    np.testing.assert_array_equal(image.numpy()[..., 0], source.pixels.astype(np.float32))


def test_convert_images_dtypes_scale_and_normalize():
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (2, 3, 4, 3)).astype(np.float32)
    for dtype in ("float32", "bfloat16", "float16"):
        out = preprocess.convert_images(tf.constant(images), dtype)
        assert out.dtype == tf.as_dtype(dtype)
        np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(), images, rtol=1e-2)
    as_uint8 = preprocess.convert_images(tf.constant(images), "uint8")
    np.testing.assert_array_equal(as_uint8.numpy(), np.round(images).astype(np.uint8))
    out = preprocess.convert_images(tf.constant(images + 300), "uint8")
    assert (out.numpy() == 255).all()  # saturates instead of wrapping
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    out = preprocess.convert_images(tf.constant(images), scale=1 / 255, normalize=(mean, std))
    expected = (images / 255 - np.array(mean)) / np.array(std)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


# --- reduced_decode: JPEGs decoded at 1/2, 1/4 or 1/8 scale (opt-in) ------------------------

def _photo_jpeg(name: str) -> tuple[np.ndarray, tf.Tensor]:
    """One of scikit-image's sample photographs, as Pillow writes it as a JPEG."""
    import io

    import skimage.data
    from PIL import Image

    pixels = getattr(skimage.data, name)()
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return pixels, tf.constant(buffer.getvalue())


# The documented tolerance (docs/reading/performance.md): reduced_decode's values against the
# exact path's, mean absolute difference in 0-255 units; the largest measured was 12.9 (a
# 512x512 photo of fine detail stretched to 64x48 at 1/8 scale, where the exact bilinear resize
# without antialiasing aliases most).
_REDUCED_MEAN_TOLERANCE = 16.0


@pytest.mark.parametrize("name", ["astronaut", "coffee", "chelsea", "rocket"])
@pytest.mark.parametrize("size", [(224, 224), (112, 112), (64, 48)])
@pytest.mark.parametrize("options", [dict(resize="stretch"), dict(resize="pad"),
                                     dict(resize="crop", crop_fraction=0.875)],
                         ids=["stretch", "pad", "crop"])
def test_reduced_decode_is_close_to_the_exact_path(name, size, options):
    pixels, encoded = _photo_jpeg(name)
    exact = preprocess.load_image(encoded, image_size=size, **options).numpy()
    fast = preprocess.load_image(encoded, image_size=size, reduced_decode=True, **options).numpy()
    assert fast.shape == exact.shape == (*size, 3)
    height, width = pixels.shape[:2]
    if options["resize"] != "crop" and (height < 2 * size[0] or width < 2 * size[1]):
        # Less than twice the output on a side: decoded whole, the exact values.
        np.testing.assert_array_equal(fast, exact)
        return
    assert np.abs(fast - exact).mean() <= _REDUCED_MEAN_TOLERANCE
    if options["resize"] == "stretch":
        # libjpeg's reduced scale averages the pixels it drops, as an antialiased resize
        # does; bilinear resizing of the whole image skips them: the reduced values are
        # closer to the antialiased resize (an independent reference) than the exact ones.
        reference = tf.image.resize(pixels, size, antialias=True).numpy()
        assert np.abs(fast - reference).mean() <= np.abs(exact - reference).mean() + 0.1


@pytest.mark.parametrize("ratio", [2, 4, 8])
def test_reduced_jpeg_equals_pillows_draft_decode(ratio):
    # Pillow's draft mode asks libjpeg for the same reduced scale: an independent reader.
    import io

    from PIL import Image

    from readers import decode

    _, encoded = _photo_jpeg("astronaut")
    image = Image.open(io.BytesIO(encoded.numpy()))
    image.draft("RGB", (512 // ratio, 512 // ratio))
    expected = np.asarray(image.convert("RGB"))
    assert expected.shape == (512 // ratio, 512 // ratio, 3)
    got = decode.decode_reduced_jpeg(encoded, ratio).numpy()
    assert got.shape == expected.shape
    assert np.abs(got.astype(int) - expected).max() <= 2


def test_reduced_window_covers_the_stored_window():
    from readers import decode

    _, encoded = _photo_jpeg("coffee")  # 400 x 600
    window = tf.constant([33, 47, 201, 301])
    for ratio in decode.JPEG_RATIOS:
        part = decode.decode_reduced_jpeg(encoded, ratio, window).numpy()
        whole = decode.decode_reduced_jpeg(encoded, ratio).numpy()
        y0, x0 = 33 // ratio, 47 // ratio
        y1, x1 = -(-(33 + 201) // ratio), -(-(47 + 301) // ratio)
        assert part.shape == (y1 - y0, x1 - x0, 3)
        if ratio == 1:  # the exact fused decode
            exact = decode.decode_cropped_image(encoded, window).numpy()
            np.testing.assert_array_equal(part, exact)
        else:
            assert np.abs(part.astype(int) - whole[y0:y1, x0:x1]).mean() < 1.0


def test_reduced_decode_leaves_pngs_and_small_jpegs_exact(sources):
    for source in sources:
        for options in (dict(resize="stretch"), dict(resize="crop")):
            exact = preprocess.load_image(tf.constant(source.data), image_size=(7, 11), **options)
            fast = preprocess.load_image(tf.constant(source.data), image_size=(7, 11),
                                         reduced_decode=True, **options)
            np.testing.assert_array_equal(fast.numpy(), exact.numpy())


def test_reduced_batch_loading_equals_image_by_image(tmp_path):
    # Small JPEGs of one size (the by-batch path) at a quarter of their size: one reduced
    # scale for the whole batch, the same values as image by image.
    jpegs = rd.write_dataset(tmp_path, splits={"train": 3}, kinds=("rgb_jpeg",) * 3,
                             sizes=((40, 52),) * 3, num_shards=1).sources["train"]
    encoded = tf.constant([s.data for s in jpegs])
    options = dict(image_size=(10, 12), reduced_decode=True)
    load = tf.function(lambda e: preprocess.load_image_batch(
        e, e, e, batch_size=4, jpegs_of_size=(40, 52), **options))
    one_by_one = [preprocess.load_image(e, **options) for e in encoded]
    np.testing.assert_array_equal(load(encoded).numpy(), np.stack(one_by_one))
    exact = [preprocess.load_image(e, image_size=(10, 12)) for e in encoded]
    assert not np.array_equal(np.stack(one_by_one), np.stack(exact))
