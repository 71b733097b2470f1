"""The conversion's config (conversion/config.py): built from the flags' values, checked once, Beam-free."""

import argparse
import json

import pytest

from conversion.config import ConversionConfig
from conversion.masks import MaskOptions
from conversion.options import ShardingOptions

# Every flag at its default, as Beam's parser gives them (beam_jobs.ConvertOptions).
_FLAGS = dict(
    input_dir="in", output_dir="out", labels_csv=None, annotations=None, class_names=None, split=None,
    seed=0, max_reject_fraction=None, group_by=None, overwrite=False, background="255,255,255",
    num_shards=None, target_shard_mb=128, min_shards=8, dedup=False, resume=False, worker_threads=None,
    worker_processes=None, file_timeout=60.0, max_side=None, min_side=None, jpeg_quality=None,
    max_pixels=ConversionConfig("a", "b").validation.max_pixels, full_decode=False, dicom_window=None,
    dicom_bit_depth=8, dicom_frames="first", dicom_tags=None, dicom_allow_identifying_tags=False,
    raster_pages="first", raster_bands=None, raster_dtype=None, raster_range=None, raster_georef=False,
    raster_patch=None, raster_stride=None, raster_edge=None, raster_max_nodata=None, masks_dir=None,
    mask_suffix=MaskOptions().mask_suffix, time_series=False, bands=None, volumes=False, min_slices=2,
)


def _flags(**given):
    return argparse.Namespace(**{**_FLAGS, **given})


def test_the_flags_become_the_groups():
    config = ConversionConfig.from_flags(_flags(num_shards=3, class_names="b, a", split="train=0.5,test=0.5",
                                                masks_dir="masks"))
    assert config.sharding == ShardingOptions(num_shards=3)
    assert config.class_names == ("b", "a")
    assert config.split_ratios == {"train": 0.5, "test": 0.5}
    assert config.masks.masks_dir == "masks" and config.masks.active


@pytest.mark.parametrize("given, message", [
    (dict(background="1,2"), None),
    (dict(background="red"), "--background must be R,G,B in 0-255. Received: 'red'"),
    (dict(jpeg_quality=80), "--jpeg_quality sets the quality of resized JPEGs"),
    (dict(max_reject_fraction=2.0), "--max_reject_fraction must be in [0, 1]. Received: 2.0"),
    (dict(group_by="dicom:PatientID"), "--group_by keeps each group in one split"),
    (dict(group_by="dicom:NotAKeyword", split="train=1"), "not a DICOM keyword"),
    (dict(group_by="regex:(", split="train=1"), "does not compile"),
    (dict(overwrite=True, resume=True), "give one of them"),
    (dict(class_names="a,a"), "--class_names must be distinct"),
    (dict(raster_stride=4), "--raster_stride shapes the patches of --raster_patch"),
])
def test_a_bad_flag_is_named_with_what_was_received(given, message):
    if message is None:  # Two channels pass the parse, and are refused by the validation group.
        with pytest.raises(ValueError, match="background"):
            ConversionConfig.from_flags(_flags(**given))
        return
    with pytest.raises(ValueError) as caught:
        ConversionConfig.from_flags(_flags(**given))
    assert message in str(caught.value)


def test_the_output_may_not_lie_inside_the_input(tmp_path):
    with pytest.raises(ValueError, match="is inside --input_dir"):
        ConversionConfig(str(tmp_path), str(tmp_path / "out"))
    assert ConversionConfig(str(tmp_path / "in"), str(tmp_path / "out")).output_dir == str(tmp_path / "out")


def test_the_manifest_options_hold_no_paths_and_are_json():
    a = ConversionConfig.from_flags(_flags(input_dir="/a", output_dir="/b", seed=7))
    b = ConversionConfig.from_flags(_flags(input_dir="/c", output_dir="/d", seed=7))
    assert a.manifest_options("hash") == b.manifest_options("hash")
    options = json.loads(json.dumps(a.manifest_options("hash")))
    assert options["seed"] == 7 and options["labels"] == "folders" and "raster" not in options


def test_volumes_are_a_kind_of_example_with_their_own_options():
    from conversion.examples import kind_for
    from imaging.volumes import VolumeOptions

    config = ConversionConfig.from_flags(_flags(volumes=True, min_slices=3))
    assert config.validation.volumes == VolumeOptions(min_slices=3)
    assert kind_for(config.validation).name == "volume"
    assert config.manifest_options("series")["volumes"] == {"min_slices": 3}
    # Files outside any volume (scouts, strays) are the data's: no reject fraction stops a volume run ...
    assert config.max_reject_fraction == 1.0
    assert ConversionConfig.from_flags(_flags(volumes=True, max_reject_fraction=0.2)).max_reject_fraction == 0.2
    # ... while an image run keeps its default, and its manifest no volumes entry.
    images = ConversionConfig.from_flags(_flags())
    assert images.max_reject_fraction == 0.1 and images.validation.volumes is None
    assert "volumes" not in images.manifest_options("hash")


@pytest.mark.parametrize("given, message", [
    (dict(min_slices=0), "--min_slices must be >= 1. Received: 0"),
    (dict(time_series=True), "does not combine with --time_series"),
    (dict(annotations="a.json"), "does not combine with --annotations"),
    (dict(raster_patch="256"), "does not combine with --raster_patch"),
])
def test_what_volumes_do_not_take_is_refused_naming_the_flag(given, message):
    with pytest.raises(ValueError) as caught:
        ConversionConfig.from_flags(_flags(volumes=True, **given))
    assert message in str(caught.value)


def test_volumes_take_masks_and_a_mask_suffix():
    config = ConversionConfig.from_flags(_flags(volumes=True, masks_dir="labelsTr", mask_suffix="_0000:"))
    assert config.masks.active and config.masks.suffixes == ("_0000", "")


def test_volumes_append_takes_masks():
    config = ConversionConfig.from_flags(_flags(volumes=True, masks_dir="labelsTr", append=True))
    assert config.masks.active and config.append


def test_volumes_append_takes_a_labels_csv_and_dedup():
    """A volume dataset grows by --labels_csv rows, and --dedup compares new series with held ones."""
    config = ConversionConfig.from_flags(_flags(volumes=True, append=True, labels_csv="labels.csv", dedup=True))
    assert (config.append, config.labels_csv, config.writing.dedup) == (True, "labels.csv", True)


def test_volumes_take_group_by_with_a_split():
    """--volumes --group_by: a patient's series in one split (`conversion.volumes`); it needs --split, as images'."""
    for group_by in ("dicom:PatientID", "regex:^([^/]+)/"):
        config = ConversionConfig.from_flags(_flags(volumes=True, group_by=group_by, split="train=0.8,validation=0.2"))
        assert config.group_by == group_by and config.validation.volumes is not None
        assert config.manifest_options("series")["group_by"] == group_by
    with pytest.raises(ValueError, match="--group_by keeps each group in one split"):
        ConversionConfig.from_flags(_flags(volumes=True, group_by="dicom:PatientID"))


def test_time_series_take_group_by_regex_only():
    """A location's passes are rasters: a tile's id in its path groups it, no DICOM keyword can."""
    config = ConversionConfig.from_flags(_flags(time_series=True, group_by="regex:(T[0-9]{2}[A-Z]{3})_",
                                                split="train=0.5,validation=0.5"))
    assert config.group_by == "regex:(T[0-9]{2}[A-Z]{3})_"
    with pytest.raises(ValueError) as caught:
        ConversionConfig.from_flags(_flags(time_series=True, group_by="dicom:PatientID", split="train=1"))
    assert str(caught.value) == (
        "--time_series groups locations by their paths only: give --group_by regex:PATTERN (e.g. "
        "regex:(T[0-9]{2}[A-Z]{3}) for a Sentinel-2 tile id; every stack and patch of a group in one split). "
        "Received: --time_series with --group_by dicom:PatientID")
