"""Sizing stored images (--max_side/--min_side): imaging/resize.py and its use by the validator."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import encode
from PIL import Image, ImageOps

import imaging
from imaging import resize
from imaging.resize import ResizeOptions, resize_array, target_size


@pytest.fixture(scope="module")
def validator():
    return imaging.ImageValidator(resize=ResizeOptions(max_side=64))


def _photo(h, w, seed=0):
    """A smooth picture with detail (gradients and a few edges), uint8 RGB."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)),
                    ((xx // 16 + yy // 16) % 2) * 200], axis=-1)
    return np.clip(arr + rng.integers(-8, 9, arr.shape), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("h, w, policy, want", [
    (3024, 4032, ResizeOptions(max_side=512), (384, 512)),
    (4032, 3024, ResizeOptions(max_side=512), (512, 384)),
    (300, 700, ResizeOptions(max_side=512), (219, 512)),
    (512, 100, ResizeOptions(max_side=512), (512, 100)),    # Already fits: the same.
    (100, 80, ResizeOptions(max_side=512), (100, 80)),      # Never up.
    (3024, 4032, ResizeOptions(min_side=256), (256, 341)),
    (5000, 10, ResizeOptions(max_side=64), (64, 1)),        # At least one pixel.
    (600, 600, ResizeOptions(min_side=256), (256, 256)),
    (200, 900, ResizeOptions(min_side=256), (200, 900)),    # Shorter side fits: the same.
    (3024, 4032, ResizeOptions(), (3024, 4032)),            # No policy.
])
def test_target_size(h, w, policy, want):
    assert target_size(h, w, policy) == want


def test_target_size_keeps_the_aspect_ratio_within_rounding():
    rng = np.random.default_rng(1)
    for h, w in rng.integers(1, 5000, size=(300, 2)):
        for policy in (ResizeOptions(max_side=224), ResizeOptions(min_side=224)):
            th, tw = target_size(int(h), int(w), policy)
            assert th <= h and tw <= w
            capped = max(th, tw) if policy.max_side else min(th, tw)
            assert capped == min(224, max(h, w) if policy.max_side else min(h, w))
            # The other side is the exact scaled length, rounded (or 1 pixel).
            scale = th / h if capped == th and (th != h or tw == w) else tw / w
            assert abs(th - h * scale) <= 0.5 + 1e-9 or th == 1
            assert abs(tw - w * scale) <= 0.5 + 1e-9 or tw == 1


@pytest.mark.parametrize("kwargs, flag", [
    (dict(max_side=512, min_side=256), "--max_side caps the longer side"),
    (dict(max_side=0), "--max_side must be an integer of at least 1. Received: 0"),
    (dict(min_side=-3), "--min_side must be an integer of at least 1. Received: -3"),
    (dict(max_side=2.5), "--max_side must be an integer"),
    (dict(max_side=64, jpeg_quality=0), "--jpeg_quality must be an integer in 1-100. Received: 0"),
    (dict(max_side=64, jpeg_quality=101), "--jpeg_quality must be an integer in 1-100. Received: 101"),
])
def test_bad_options_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match="^" + re.escape(flag)):
        ResizeOptions(**kwargs)


def test_resize_array_is_lanczos_and_keeps_dtype_and_bands():
    policy = ResizeOptions(max_side=50)
    rgb = _photo(120, 200)
    out = resize_array(rgb, policy)
    assert out.dtype == np.uint8 and out.shape == (30, 50, 3)
    want = np.asarray(Image.fromarray(rgb).resize((50, 30), Image.Resampling.LANCZOS))
    assert np.array_equal(out, want)
    # 16-bit and float, any band count: band by band, same dtype, same picture as the 8-bit path.
    wide = rgb.astype(np.uint16) * 257
    out16 = resize_array(wide, policy)
    assert out16.dtype == np.uint16 and out16.shape == (30, 50, 3)
    # Pillow's 8-bit path rounds and clips between its two passes: a few levels at edges.
    diff = np.abs(out16 / 257 - want)
    assert diff.max() <= 4 and diff.mean() < 0.5
    bands = np.random.default_rng(2).random((120, 200, 13)).astype(np.float32)
    outf = resize_array(bands, policy)
    assert outf.dtype == np.float32 and outf.shape == (30, 50, 13)
    assert abs(float(outf.mean()) - float(bands.mean())) < 0.01
    grey16 = wide[..., 0]
    assert resize_array(grey16, policy).shape == (30, 50)
    assert resize_array(rgb[..., :1], policy).shape == (30, 50, 1)
    # Fits already: the very same array.
    assert resize_array(rgb, ResizeOptions(max_side=200)) is rgb


def test_antialiased_a_fine_pattern_averages_out():
    # Alternating black/white columns: point sampling would keep black or white; area/Lanczos grey.
    stripes = np.zeros((64, 256), np.uint8)
    stripes[:, ::2] = 255
    out = resize_array(stripes, ResizeOptions(max_side=32))
    assert abs(float(out.mean()) - 127.5) < 3 and out.std() < 10


def test_a_big_jpeg_is_scaled_down_upright_and_noted(validator):
    data = encode(_photo(300, 400), "JPEG", quality=92)
    image = validator.validate(data, "big.jpg")
    assert (image.format, image.height, image.width, image.channels) == ("jpeg", 48, 64, 3)
    assert image.actions == ("resize_max_side",)
    assert image.details == {"original": [300, 400], "stored": [48, 64]}
    assert Image.open(io.BytesIO(image.data)).size == (64, 48)


def test_without_the_flag_or_when_it_fits_the_bytes_are_kept(validator):
    data = encode(_photo(300, 400), "JPEG", quality=92)
    assert imaging.ImageValidator().validate(data, "big.jpg").data is data
    small = encode(_photo(48, 64), "JPEG", quality=92)
    image = validator.validate(small, "small.jpg")
    assert image.data is small and image.actions == ()


@pytest.mark.parametrize("orientation", range(2, 9))
def test_exif_orientation_is_applied_before_resizing(validator, orientation):
    arr = _photo(200, 320, seed=orientation)
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(arr, "JPEG", quality=95, exif=exif.tobytes())
    image = validator.validate(data, "rotated.jpg")
    # Pillow's own exif_transpose then resize, as the reference.
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    tw, th = upright.size
    want_h, want_w = target_size(th, tw, ResizeOptions(max_side=64))
    assert (image.height, image.width) == (want_h, want_w)
    assert image.actions == ("exif_transpose", "resize_max_side")
    assert image.details["original"] == [th, tw]
    want = np.asarray(upright.resize((want_w, want_h), Image.Resampling.LANCZOS), dtype=float)
    got = np.asarray(Image.open(io.BytesIO(image.data)), dtype=float)
    assert np.abs(got - want).mean() < 6


def test_min_side_and_pngs_stay_png():
    v = imaging.ImageValidator(resize=ResizeOptions(min_side=32))
    image = v.validate(encode(_photo(90, 120), "PNG"), "a.png")
    assert (image.format, image.height, image.width) == ("png", 32, 43)
    assert image.actions == ("resize_min_side",)
    assert image.data.startswith(b"\x89PNG")


@pytest.mark.parametrize("channels", [1, 3])
def test_16_bit_pngs_keep_16_bits(channels):
    rng = np.random.default_rng(3)
    arr = (rng.random((100, 150, channels)) * 65535).astype(np.uint16)
    data = resize.encode(arr, "png", 95)
    assert data[24] == 16  # The input is a 16-bit PNG.
    v = imaging.ImageValidator(resize=ResizeOptions(max_side=60))
    image = v.validate(data, "deep.png")
    assert (image.height, image.width, image.channels) == (40, 60, channels)
    assert image.data[24] == 16  # IHDR bit depth of what is stored.
    import tensorflow as tf

    stored = tf.io.decode_png(image.data, dtype=tf.uint16).numpy()
    want = resize_array(arr, ResizeOptions(max_side=60))
    assert stored.dtype == np.uint16 and np.array_equal(stored, want)


def test_jpeg_quality_is_used():
    data = encode(_photo(400, 600), "JPEG", quality=95)
    sizes = {q: len(imaging.ImageValidator(resize=ResizeOptions(max_side=200, jpeg_quality=q))
                     .validate(data, "q.jpg").data) for q in (30, 95)}
    assert sizes[30] < sizes[95] * 0.6


def test_jpeg_scale_is_the_smallest_libjpeg_scale_above_the_target():
    assert resize.jpeg_scale(3024, 4032, ResizeOptions(max_side=512)) == 4   # 1008x756
    assert resize.jpeg_scale(3024, 4032, ResizeOptions(max_side=504)) == 8   # 504x378
    assert resize.jpeg_scale(3024, 4032, ResizeOptions(max_side=3000)) == 1
    assert resize.jpeg_scale(10000, 10000, ResizeOptions(max_side=512)) == 8


def test_a_25_megapixel_jpeg_is_never_decoded_in_full(tmp_path):
    # Peak resident memory (Linux's VmHWM, reset through /proc/self/clear_refs) of the validation,
    # in a fresh interpreter that only reads the file, against a
    # full-size decode of the same file in the same process (the control: it needs the full buffer).
    path = tmp_path / "huge.jpg"
    path.write_bytes(encode(_photo(5000, 5000), "JPEG", quality=80))
    script = textwrap.dedent("""
        import io, sys
        from PIL import Image
        import imaging
        from schemas import tf_runtime
        data = open(sys.argv[1], "rb").read()
        v = imaging.ImageValidator(resize=imaging.ResizeOptions(max_side=512))
        # TensorFlow's decode ops loaded first (a plain JPEG's validation no longer loads them).
        v.load_decoders()
        warm = io.BytesIO(); Image.new("RGB", (64, 64)).save(warm, "JPEG"); v.validate(warm.getvalue(), "w.jpg")
        def peak():
            # Linux: writing 5 to clear_refs resets the peak (VmHWM) to the current RSS.
            return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])  # KiB
        def reset():
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return peak()
        before = reset()
        out = v.validate(data, "huge.jpg")
        resized = peak() - before
        assert (out.height, out.width) == (512, 512), (out.height, out.width)
        before = reset()
        full = tf_runtime.image_ops().decode_jpeg(data)
        assert tuple(full.shape) == (5000, 5000, 3)
        control = peak() - before
        print(resized, control)
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True,
                          check=True)
    resized_kib, control_kib = map(int, proc.stdout.split()[-2:])
    full_kib = 5000 * 5000 * 3 // 1024
    assert control_kib > 0.8 * full_kib, (resized_kib, control_kib)  # The control allocates it all.
    assert resized_kib < 0.25 * full_kib, (resized_kib, control_kib)
