"""The table of kinds of examples (conversion/examples/): the image kind, asked by the planner and writers."""

import json
import pathlib
import sys

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from helpers import convert, encode, pixels, write  # noqa: E402

import schemas  # noqa: E402
from beam_jobs.convert import build_plan, config_from_options  # noqa: E402
from conversion import examples, listing  # noqa: E402
from conversion.config import ConversionConfig  # noqa: E402
from conversion.examples import image as image_kind  # noqa: E402
from conversion.options import ShardingOptions  # noqa: E402
from imaging import DicomOptions, ValidationOptions  # noqa: E402


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("examples") / "in"
    for i, label in enumerate(["cat", "cat", "dog"]):
        write(root / label / f"{i}.jpg", encode(pixels(i), "JPEG"))
    return root


def test_the_image_row_is_last_and_takes_every_conversion():
    assert examples.KINDS[-1] is image_kind.KIND
    for validation in (ValidationOptions(), ValidationOptions(dicom=DicomOptions(tags=("Modality",)))):
        assert examples.kind_for(validation).name == "image"


def test_the_image_kind_groups_one_file_per_example(photos):
    files, problems = listing.list_input(str(photos))
    grouped = image_kind.KIND.group(list(files), list(problems), ConversionConfig(str(photos), "out"))
    assert [f.rel_path for f in grouped.files] == ["cat/0.jpg", "cat/1.jpg", "dog/2.jpg"]
    assert grouped.problems == [] and grouped.members is None


def test_the_planner_plans_every_file_of_the_image_kind(photos, tmp_path):
    plan = build_plan(ConversionConfig(str(photos), str(tmp_path / "out"), sharding=ShardingOptions(num_shards=1)))
    assert sorted(f.rel_path for f in plan.files) == ["cat/0.jpg", "cat/1.jpg", "dog/2.jpg"]


def test_the_manifest_holds_the_schema_of_the_kind(photos, tmp_path):
    out = tmp_path / "out"
    convert(photos, out, "--dicom_tags", "Modality")
    stored = json.loads((out / schemas.MANIFEST_FILENAME).read_text())["features"]
    config = config_from_options(PipelineOptions(
        ["--input_dir", str(photos), "--output_dir", str(out), "--dicom_tags", "Modality"]))
    assert stored == examples.record_schema(config.validation).to_json()
    assert schemas.dicom_tag_key("Modality") in stored
