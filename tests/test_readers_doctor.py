"""readers.doctor: where each training step waits, on the CPU.

Two real cases: a tiny model fed large noisy PNGs read at a tiny size (decoding
dominates: input-bound, decode named), and a model made heavy on purpose fed
tiny JPEGs (not input-bound). Assertions are on the verdict, the stage named
and the relations of the measured rates, never on absolute times.
"""

import os
import subprocess
import sys

import keras
import pytest

from readers import Diagnosis, DoctorOptions, diagnose
from readers.doctor import INPUT_BOUND_SHARE, load_model

import _reader_data as rd

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SIZE = (16, 16)

_MODELS = '''
import keras


def tiny():
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.GlobalAveragePooling2D()(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def heavy():
    # Full-size convolutions of 16x16 inputs: tens of ms per step of 8, against
    # well under a millisecond of reading for 8 tiny JPEGs.
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(128, 3, padding="same", activation="relu")(inputs)
    for _ in range(1):
        x = keras.layers.Conv2D(128, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A module of model functions, importable as 'doctor_models:NAME'."""
    folder = tmp_path_factory.mktemp("models")
    (folder / "doctor_models.py").write_text(_MODELS)
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def large_pngs(tmp_path_factory):
    """Noisy 384x384 PNGs: each takes milliseconds to decode, read at 16x16."""
    return rd.write_dataset(tmp_path_factory.mktemp("large"), splits={"train": 16},
                            num_shards=2, kinds=("rgb_png",), sizes=((384, 384),))


@pytest.fixture(scope="module")
def tiny_jpegs(tmp_path_factory):
    return rd.write_dataset(tmp_path_factory.mktemp("tiny"), splits={"train": 64},
                            num_shards=2, kinds=("rgb_jpeg",), sizes=(_SIZE,))


def _options(**kw):
    return DoctorOptions(**{"batch_size": 8, "image_size": _SIZE, "steps": 8, "warmup": 3,
                            **kw})


def test_slow_decode_is_input_bound_and_names_decode(models, large_pngs):
    report = diagnose(large_pngs.data_dir, "train", "doctor_models:tiny",
                      _options(batch_size=4, steps=6, warmup=2))
    assert isinstance(report, Diagnosis)
    assert report.input_bound
    assert report.bound_stage == "decode"
    assert report.wait_share >= INPUT_BOUND_SHARE
    # The model alone outruns the reader; records alone outrun the decoded reader.
    assert report.warm_steps_per_s < report.ceiling_steps_per_s
    stages = dict(report.stage_images_per_s)
    assert set(stages) == {"read", "decode"}
    assert stages["read"] > 2 * stages["decode"]
    costs = report.stage_ms_per_image()
    assert costs["decode"] > costs["read"]
    assert report.wait_share == pytest.approx(
        1 - report.warm_steps_per_s / report.ceiling_steps_per_s)
    # The steps did wait for their batches (measured within the warm run).
    assert report.blocked_share >= INPUT_BOUND_SHARE / 2
    assert "Input-bound" in report.text and "ecoding bounds it" in report.text
    assert "shardsmith serve-data" in report.text and "--max_side" in report.text
    # The cold page cache: measured on a real disk, else the reason is given.
    if report.cold_steps_per_s is None:
        assert report.cold_note and report.cold_note in report.text
    else:
        assert report.cold_wait_share is not None and "cold one" in report.text


def test_heavy_model_light_input_is_not_input_bound(models, tiny_jpegs):
    report = diagnose(tiny_jpegs.data_dir, "train", "doctor_models:heavy",
                      _options(cold=False, augment="standard"))
    assert not report.input_bound
    # The model rarely waits for a batch: the reader is ahead.
    assert report.blocked_share < INPUT_BOUND_SHARE / 2
    # The reader alone is many times faster than the model needs.
    assert report.reader_images_per_s > 3 * report.ceiling_steps_per_s * report.batch_size
    assert [name for name, _ in report.stage_images_per_s] == ["read", "decode", "augment"]
    assert report.cold_steps_per_s is None and report.cold_note == "not asked for"
    assert report.text.startswith("Not input-bound") and "The model is the limit" in report.text


def test_model_forms_and_refusals(models, tmp_path):
    from doctor_models import tiny

    path = tmp_path / "tiny.keras"
    tiny().save(path)
    loaded = load_model(str(path))
    assert loaded.input_shape == (None, 16, 16, 3) and loaded.optimizer is not None
    assert load_model("doctor_models:tiny").optimizer is not None
    uncompiled = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="must be compiled"):
        load_model(uncompiled)
    with pytest.raises(ValueError, match="no function 'nope'"):
        load_model("doctor_models:nope")
    with pytest.raises(ValueError, match="no such file"):
        load_model(str(tmp_path / "missing.keras"))
    with pytest.raises(ValueError, match="steps"):
        DoctorOptions(steps=0)
    with pytest.raises(ValueError, match="image_size"):
        DoctorOptions(image_size=(16,))


def test_image_size_must_match_the_model(models, tiny_jpegs):
    with pytest.raises(ValueError, match=r"image_size.*\(16, 16\).*\(32, 32\)"):
        diagnose(tiny_jpegs.data_dir, "train", "doctor_models:tiny",
                 _options(image_size=(32, 32)))


def test_command_end_to_end(models, tiny_jpegs):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_REPO, str(models)]))
    proc = subprocess.run(
        [sys.executable, "-m", "shardsmith", "doctor", str(tiny_jpegs.data_dir),
         "--model", "doctor_models:tiny", "--image_size", "16", "--batch_size", "4",
         "--steps", "3", "--warmup", "1"],
        capture_output=True, text=True, env=env, cwd=str(models), timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    paragraph, figures = proc.stdout.split("\n\n", 1)
    assert paragraph.startswith(("Input-bound", "Not input-bound"))
    for row in ("model alone, batches on the device", "decoded batches from memory",
                "reader, warm page cache", "reader, cold page cache", "stage read",
                "stage decode"):
        assert row in figures


def test_command_refuses_naming_the_argument(models, tiny_jpegs, capsys):
    from shardsmith import doctor

    assert doctor.main([str(tiny_jpegs.data_dir), "--model", "doctor_models:nope"]) == 2
    assert "no function 'nope'" in capsys.readouterr().err
    assert doctor.main([str(tiny_jpegs.data_dir), "--model", "doctor_models:tiny",
                        "--steps", "0"]) == 2
    assert "`steps` must be an integer >= 1" in capsys.readouterr().err


def test_command_help_and_a_misspelled_option(tiny_jpegs, capsys):
    from shardsmith import cli

    assert cli.main(["doctor", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: shardsmith doctor") and "shardsmith doctor ./dataset" in out
    assert "MODULE:FUNCTION" in out
    assert cli.main(["--help"]) == 0
    assert "doctor" in capsys.readouterr().out
    assert cli.main(["doctor", str(tiny_jpegs.data_dir), "--model", "m:f", "--step", "3"]) == 2
    assert "(did you mean --steps?)" in capsys.readouterr().err
