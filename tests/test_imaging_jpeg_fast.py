"""The JPEG check without TensorFlow (imaging/formats/_jpeg_fast.py).

It may only accept: on every JPEG, plain or damaged, a file it accepts must
decode with TensorFlow's `decode_jpeg` (at the converter's 1/8 scale and in
full with 3 channels, as the reader decodes), and the JPEG handler must give
what it gives with TensorFlow's decode alone (the same image, or the same
rejection and message).
"""

from __future__ import annotations

import io
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest
import skimage.data
import tensorflow as tf
from helpers import encode, pixels
from PIL import Image

from bench import mutate
from imaging import ImageRejected, ValidationOptions, formats
from imaging.formats import _jpeg_fast, jpeg
from schemas import tf_runtime


def _tf_decodes(data: bytes) -> bool:
    try:
        tf.io.decode_jpeg(data, ratio=8)
        tf.io.decode_jpeg(data, channels=3)
    except tf.errors.InvalidArgumentError:
        return False
    return True


def _pillow_decodes(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
    except OSError:
        return False
    return True


def _seeds() -> dict[str, bytes]:
    """Plain JPEGs of every kind the check takes: Pillow's writer, photos and small odd sizes."""
    photo = np.asarray(Image.fromarray(skimage.data.astronaut()).resize((61, 45)))
    grey = np.asarray(Image.fromarray(skimage.data.camera()).resize((37, 29)))
    return {
        "baseline 4:2:0": encode(photo, "JPEG", quality=75),
        "baseline 4:4:4": encode(photo, "JPEG", quality=95, subsampling=0),
        "baseline 4:2:2": encode(photo, "JPEG", subsampling=1),
        "optimized": encode(photo, "JPEG", optimize=True),
        "progressive": encode(photo, "JPEG", progressive=True),
        "progressive 4:4:4": encode(photo, "JPEG", progressive=True, subsampling=0),
        "restart intervals": encode(photo, "JPEG", restart_marker_blocks=1),
        "grey": encode(grey, "JPEG"),
        "grey progressive": encode(grey, "JPEG", progressive=True),
        "7x5": encode(pixels(1, size=(5, 7)), "JPEG"),
    }


def _save(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG")
    return buf.getvalue()


def _unusual() -> dict[str, bytes]:
    """JPEGs TensorFlow decodes (most of them) that the check leaves to it."""
    base = encode(pixels(2, size=(20, 30)), "JPEG")
    scan = base.index(b"\xff\xda")
    sos = base[scan:scan + 2 + (base[scan + 2] << 8 | base[scan + 3])]
    return {
        "CMYK": _save(Image.fromarray(pixels(3, size=(20, 30))).convert("CMYK")),
        "data after EOI": base + b"\0\0",
        "no EOI": base[:-2],
        "a comment between the scan and EOI": base[:-2] + b"\xff\xfe\x00\x04ok" + b"\xff\xd9",
        "a second scan header after the scan": base[:-2] + sos + b"\xff\xd9",
        # Once the last scanline is out, Pillow takes running out of data
        # before EOI as the end: it accepts this file, TensorFlow refuses it.
        "a segment running past the end after the scan": base[:-2] + b"\xff\xfe\x00\x40ok\xff\xd9",
    }


def _damage(data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    """Damage `bench.mutate` does not do: truncations closed by an EOI, a 0xFF or marker put in, trailing bytes."""
    n, scan = len(data), data.index(b"\xff\xda")
    cases = []
    for _ in range(3):
        at = rng.randrange(scan + 2, n - 2)
        cases.append((f"truncated at {at}, EOI added", data[:at] + b"\xff\xd9"))
        out = bytearray(data)
        at = rng.randrange(2, n - 1)
        out[at] = 0xFF
        cases.append((f"0xFF at {at}", bytes(out)))
        at = rng.randrange(scan, n - 2)
        out = bytearray(data)
        out[at:at + 2] = bytes((0xFF, rng.choice((0xD0, 0xD3, 0xD8, 0xD9, 0xC4, 0xDA, 0xDD, 0xFE))))
        cases.append((f"marker at {at}", bytes(out)))
    cases.append(("trailing bytes", data + bytes(rng.randrange(256) for _ in range(5))))
    return cases


@pytest.fixture
def context(monkeypatch):
    # The check is asked only while TensorFlow's decode ops are not loaded
    # (they are, in this test process): ask it as a photo conversion does.
    monkeypatch.setattr(tf_runtime, "image_ops_loaded", lambda: False)
    return formats.Context(ValidationOptions(max_pixels=10_000_000))


def _outcome(data: bytes, context) -> object:
    try:
        return jpeg.images(data, "x.jpg", "jpeg", context)
    except ImageRejected as e:
        return ("rejected", e.reason, str(e))


def _as_before(data: bytes, context, monkeypatch) -> object:
    with monkeypatch.context() as m:
        m.setattr(_jpeg_fast, "decodes", lambda data, ratio: False)
        return _outcome(data, context)


def test_plain_jpegs_are_accepted_and_unusual_ones_left_to_tensorflow():
    for name, data in _seeds().items():
        assert _jpeg_fast.decodes(data, 8) and _jpeg_fast.decodes(data, 1), name
        assert _tf_decodes(data), name
    for name, data in _unusual().items():
        assert not _jpeg_fast.decodes(data, 8), name
    # Why the check walks the file to EOI: Pillow alone would accept it.
    past_the_end = _unusual()["a segment running past the end after the scan"]
    assert _pillow_decodes(past_the_end) and not _tf_decodes(past_the_end)


def test_damaged_jpegs_are_never_accepted_where_tensorflow_refuses(context, monkeypatch):
    rng = random.Random(0)
    accepted = refused = left = 0
    for seed_name, seed in _seeds().items():
        cases = [(case.how, case.data) for case in mutate.mutations(seed, "jpeg", count=40, seed=1)]
        cases += _damage(seed, rng)
        for how, data in cases:
            fast = _jpeg_fast.decodes(data, 8)
            decodes = _tf_decodes(data)
            assert decodes or not fast, f"{seed_name}: {how}"
            accepted += fast
            refused += not decodes
            left += decodes and not fast
            assert _outcome(data, context) == _as_before(data, context, monkeypatch), f"{seed_name}: {how}"
    # Every side is exercised: harmless damage accepted, damage TensorFlow
    # refuses, and files TensorFlow decodes that the check leaves to it.
    assert accepted > 50 and refused > 100 and left > 10, (accepted, refused, left)


def test_a_batch_of_plain_jpegs_never_loads_tensorflow(context, monkeypatch):
    built = []
    monkeypatch.setattr(tf_runtime, "jpeg_batch_decoder", lambda *args: built.append(args))
    batch = [jpeg.batchable(data, context) for data in _seeds().values()]
    assert jpeg.decode_together(batch, context)
    # Neither a batch decoder nor Context.ops (a cached property) was asked for.
    assert built == [] and "ops" not in vars(context)
    # A truncated file among them: TensorFlow decodes it, and the batch fails.
    truncated = jpeg.batchable(_seeds()["baseline 4:2:0"][:-300], context)
    assert not jpeg.decode_together([*batch, truncated], context)


def test_a_fresh_process_validates_plain_jpegs_without_loading_tensorflow():
    # What a photo conversion gains: its threads validate every plain JPEG
    # (alone and in batches) without TensorFlow; a damaged one loads it, which rejects it.
    code = (
        "import io, sys\n"
        "from PIL import Image\n"
        "from imaging import ImageValidator, ValidationOptions\n"
        "from schemas import tf_runtime\n"
        "def jpeg(i, **kw):\n"
        "    buf = io.BytesIO()\n"
        "    Image.new('RGB', (40 + i, 30), (i * 20, 90, 200)).save(buf, 'JPEG', **kw)\n"
        "    return buf.getvalue()\n"
        "validator = ImageValidator(ValidationOptions(max_pixels=10_000_000))\n"
        "items = [(jpeg(i, progressive=i % 2 == 1), f'{i}.jpg') for i in range(9)]\n"
        "results = validator.validate_many(items)\n"
        "print(sum(r[0].data == d for r, (d, _) in zip(results, items)), tf_runtime.image_ops_loaded(),\n"
        "      'tensorflow' in sys.modules)\n"
        "print(type(validator.validate_many([(items[0][0][:-10], 'cut.jpg')])[0]).__name__,\n"
        "      tf_runtime.image_ops_loaded())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=pathlib.Path(__file__).resolve().parents[1])
    assert result.stdout.splitlines() == ["9 False False", "ImageRejected True"], result.stderr[-2000:]
