"""The kinds of examples on the reading side (readers/examples.py)."""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from helpers import convert, encode, pixels, write  # noqa: E402

import readers  # noqa: E402
import schemas  # noqa: E402
from readers import examples  # noqa: E402
from readers.metadata import load_split  # noqa: E402


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("readers_examples")
    for i, label in enumerate(["a", "b"]):
        write(root / "in" / label / f"{i}.png", encode(pixels(i), "PNG"))
    convert(root / "in", root / "out")
    return root / "out"


def test_a_converted_dataset_is_of_the_image_kind_read_by_its_reader(dataset):
    features = json.loads((dataset / schemas.MANIFEST_FILENAME).read_text())["features"]
    kind = examples.kind_of(features)
    assert kind is examples.IMAGE
    assert callable(getattr(readers, kind.reader))
    assert kind.schema_from_json(features).to_json() == features


def test_records_no_row_knows_are_of_no_kind_and_the_error_says_why(dataset, tmp_path):
    manifest = json.loads((dataset / schemas.MANIFEST_FILENAME).read_text())
    del manifest["features"][schemas.IMAGE.key]
    assert examples.kind_of(manifest["features"]) is None
    other = tmp_path / "other"
    other.mkdir()
    for f in dataset.iterdir():
        if f.is_file():
            (other / f.name).write_bytes(f.read_bytes())
    (other / schemas.MANIFEST_FILENAME).write_text(json.dumps(manifest))
    with pytest.raises(schemas.ManifestError, match="does not match this reader: the stored schema lacks"):
        load_split(str(other), "train")


def test_a_volume_dataset_is_of_the_volume_kind_and_the_image_reader_names_its_reader(tmp_path):
    """A real `convert --volumes` (one NIfTI file): its manifest.json and volumes.json name the volume kind."""
    import nibabel
    import numpy as np

    from beam_jobs import convert
    from schemas.volumes import VOLUME_SCHEMA, VOLUMES_MANIFEST_FILENAME

    (tmp_path / "in" / "a").mkdir(parents=True)
    nibabel.save(nibabel.Nifti1Image(np.zeros((4, 3, 2), np.int16), np.eye(4)), tmp_path / "in" / "a" / "v.nii")
    out = tmp_path / "out"
    convert.run(["--volumes", "--input_dir", str(tmp_path / "in"), "--output_dir", str(out),
                 "--runner", "DirectRunner", "--worker_processes", "0"])
    features = json.loads((out / VOLUMES_MANIFEST_FILENAME).read_text())["features"]
    assert json.loads((out / "manifest.json").read_text())["features"] == features
    kind = examples.kind_of(features)
    assert kind is examples.VOLUME and examples.KINDS.index(kind) < examples.KINDS.index(examples.IMAGE)
    assert callable(getattr(readers, kind.reader))
    assert kind.schema_from_json(features) == VOLUME_SCHEMA
    with pytest.raises(ValueError, match="not the features of a volume record"):
        kind.schema_from_json({**features, "image": {"dtype": "bytes"}})
    with pytest.raises(schemas.ManifestError, match="holds volume records, which readers.volume_dataset_from_tfrecords"):
        readers.image_dataset_from_tfrecords(str(out), "train")


def test_a_dataset_of_stacks_is_of_the_time_series_kind_and_the_image_reader_names_its_reader(tmp_path):
    from helpers import write_geotiff

    pytest.importorskip("rasterio")
    for date in ("2020-05-01", "2020-06-01"):
        write_geotiff(tmp_path / "in" / "wheat" / "field" / f"{date}.tif", pixels(0)[:, :, :2].transpose(2, 0, 1))
    convert(tmp_path / "in", tmp_path / "out", "--time_series")
    features = json.loads((tmp_path / "out" / schemas.MANIFEST_FILENAME).read_text())["features"]
    kind = examples.kind_of(features)
    assert kind is examples.STACKS and kind is examples.kind_named(schemas.TIME_SERIES)
    assert callable(getattr(readers, kind.reader))
    assert kind.schema_from_json(features).to_json() == features
    with pytest.raises(schemas.ManifestError, match="holds time_series records, which "
                                                    "readers.time_series_dataset_from_tfrecords reads"):
        load_split(str(tmp_path / "out"), "train")
    assert load_split(str(tmp_path / "out"), "train", kind=schemas.TIME_SERIES).num_records == (1,)


def test_a_reader_asks_for_a_kind_the_table_has():
    with pytest.raises(ValueError, match="`kind` must be one of"):
        examples.kind_named("hologram")
