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
