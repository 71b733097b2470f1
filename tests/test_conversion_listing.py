"""conversion.listing: every file under the input root, sorted, and every input that is not one said why."""

from __future__ import annotations

import os

import pytest
from helpers import make_class_tree

from conversion.listing import InputFile, Problem, display_path, is_local, list_input


def test_every_file_is_listed_sorted_by_its_bytes_with_its_size(tmp_path):
    make_class_tree(tmp_path, classes=("b", "a", "B"), per_class=2)
    (tmp_path / "a" / "deep" / "er").mkdir(parents=True)
    (tmp_path / "a" / "deep" / "er" / "x.png").write_bytes(b"12345")
    files, problems = list_input(str(tmp_path))
    walked = sorted((p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()),
                    key=os.fsencode)
    assert [f.rel_path for f in files] == walked and problems == []
    assert InputFile("a/deep/er/x.png", str(tmp_path / "a" / "deep" / "er" / "x.png"), 5) in files
    assert all(f.size == os.path.getsize(f.path) for f in files)


def test_hidden_files_broken_links_and_loops_are_problems_not_silence(tmp_path):
    images = make_class_tree(tmp_path, classes=("a",), per_class=1)
    (tmp_path / "a" / ".DS_Store").write_bytes(b"x")
    (tmp_path / "a" / "Thumbs.db").write_bytes(b"x")
    os.symlink(tmp_path / "gone.jpg", tmp_path / "a" / "dangling.jpg")
    os.symlink(tmp_path / "a", tmp_path / "a" / "again")  # A folder already listed: a cycle.
    os.symlink("self", tmp_path / "a" / "self")  # Points at itself: ELOOP.
    files, problems = list_input(str(tmp_path))
    assert [f.rel_path for f in files] == list(images)
    reasons = {p.rel_path: p.reason for p in problems}
    assert reasons == {"a/.DS_Store": "hidden_file", "a/Thumbs.db": "hidden_file",
                       "a/dangling.jpg": "broken_symlink", "a/again": "symlink_loop",
                       "a/self": "symlink_loop"}
    assert [p.rel_path for p in problems] == sorted(reasons, key=os.fsencode)
    assert Problem("a/dangling.jpg", "broken_symlink", f"link to missing {str(tmp_path / 'gone.jpg')!r}") in problems


def test_a_missing_root_or_a_file_is_one_sentence_naming_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="--input_dir .* does not exist or is not a folder"):
        list_input(str(tmp_path / "nope"))
    (tmp_path / "file.jpg").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="--input_dir"):
        list_input(str(tmp_path / "file.jpg"))


def test_a_name_that_is_not_utf8_is_kept_and_printable(tmp_path):
    name = os.fsdecode(b"caf\xe9.jpg")  # Latin-1 bytes, as an old camera or zip tool writes.
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / name).write_bytes(b"x")
    files, _ = list_input(str(tmp_path))
    assert [os.fsencode(f.rel_path) for f in files] == [b"a/caf\xe9.jpg"]
    assert display_path(files[0].rel_path) == "a/caf\\xe9.jpg"
    assert display_path("a/café.jpg") == "a/café.jpg"


def test_file_urls_are_local_and_listed_alike(tmp_path):
    make_class_tree(tmp_path, classes=("a",), per_class=2)
    assert is_local(str(tmp_path)) and is_local("file://" + str(tmp_path)) and not is_local("gs://bucket/x")
    assert list_input("file://" + str(tmp_path)) == list_input(str(tmp_path))


def test_a_link_to_a_class_folder_never_takes_its_files_away(tmp_path):
    """A link inside one class to another class's folder (`cat/also_dogs -> ../dog`) is walked
    before `dog` in name order; `dog`'s images stay listed, and labelled, as `dog`."""
    make_class_tree(tmp_path, classes=("cat", "dog"), per_class=2)
    os.symlink("../dog", tmp_path / "cat" / "also_dogs")
    os.symlink("..", tmp_path / "dog" / "up")
    files, problems = list_input(str(tmp_path))
    assert sorted({f.rel_path.split("/")[0] for f in files}) == ["cat", "dog"]
    assert not any("also_dogs" in f.rel_path for f in files)
    assert [(p.rel_path, p.reason, p.message) for p in problems] == [
        ("cat/also_dogs", "symlink_loop", "link to a folder already listed, as 'dog'"),
        ("dog/up", "symlink_loop", "link to a folder above it (a cycle)")]


def test_gis_sidecars_of_a_listed_file_are_skipped_naming_it(tmp_path):
    names = ["a/scene.tif", "a/scene.tif.aux.xml", "a/scene.tif.ovr", "a/scene.tif.ovr.aux.xml",
             "a/scene.tif.msk", "a/scene.tif.xml", "a/scene.tfw", "a/scene.prj", "a/SCENE2.TIF",
             "a/SCENE2.TIFW", "a/photo.jpg", "a/photo.jgw", "a/map.png", "a/map.wld",
             # No file of their name: not sidecars of anything, listed as files.
             "a/orphan.tif.ovr", "a/lonely.tfw", "b/scene.tif.aux.xml"]
    for name in names:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    files, problems = list_input(str(tmp_path))
    assert [f.rel_path for f in files] == ["a/SCENE2.TIF", "a/lonely.tfw", "a/map.png", "a/orphan.tif.ovr",
                                           "a/photo.jpg", "a/scene.tif", "b/scene.tif.aux.xml"]
    owners = {p.rel_path: p.message.split(" of ", 1)[1].split(";")[0].split(":")[0] for p in problems}
    assert owners == {"a/scene.tif.aux.xml": "a/scene.tif", "a/scene.tif.ovr": "a/scene.tif",
                      "a/scene.tif.ovr.aux.xml": "a/scene.tif.ovr", "a/scene.tif.msk": "a/scene.tif",
                      "a/scene.tif.xml": "a/scene.tif", "a/scene.tfw": "a/scene.tif",
                      "a/scene.prj": "a/scene.tif", "a/SCENE2.TIFW": "a/SCENE2.TIF",
                      "a/photo.jgw": "a/photo.jpg", "a/map.wld": "a/map.png"}
    assert {p.reason for p in problems} == {"sidecar"}
    assert "overviews" in next(p.message for p in problems if p.rel_path == "a/scene.tif.ovr")
    assert "world file" in next(p.message for p in problems if p.rel_path == "a/scene.tfw")


def test_gdal_sidecars_are_skipped_not_converted_or_rejected(tmp_path):
    # Written by GDAL as QGIS and ArcGIS leave them: external overviews (a TIFF, which was
    # converted as one more image of the class: a half-size copy of the scene), an external
    # mask (also a TIFF) and PAM metadata (rejected as not_an_image: one per scene failed
    # the job at --max_reject_fraction 0.1).
    import json

    import numpy as np
    import rasterio
    from helpers import convert, read_records, write_geotiff
    from rasterio.enums import Resampling

    import schemas

    root, out = tmp_path / "in", tmp_path / "out"
    scene = write_geotiff(root / "fields" / "scene.tif", np.arange(3 * 32 * 40, dtype=np.uint16).reshape(3, 32, 40))
    write_geotiff(root / "fields" / "other.tif", np.ones((3, 32, 40), np.uint16))
    with rasterio.Env(TIFF_USE_OVR=True, GDAL_TIFF_INTERNAL_MASK=False, GDAL_PAM_ENABLED=True):
        with rasterio.open(scene, "r+") as dst:
            dst.build_overviews([2], Resampling.nearest)
            dst.write_mask(np.full((32, 40), 255, np.uint8))
            dst.update_tags(1, STATISTICS_MEAN="12.5")
        with rasterio.open(scene) as src:
            src.stats(indexes=[1])  # GDAL keeps computed statistics in scene.tif.aux.xml.
    sidecars = sorted(p.name for p in scene.parent.iterdir() if p.name.startswith("scene.tif."))
    assert {"scene.tif.ovr", "scene.tif.msk", "scene.tif.aux.xml"} <= set(sidecars), sidecars
    manifest = convert(root, out, "--min_shards", "1", "--num_shards", "1")
    assert sorted(r[schemas.FILENAME.key].decode() for r in read_records(out)) == ["fields/other.tif",
                                                                                   "fields/scene.tif"]
    lines = [json.loads(line) for line in (out / schemas.REJECTS_FILENAME).read_text().splitlines()]
    assert {(d["path"], d["kind"], d["reason"]) for d in lines} == {
        (f"fields/{name}", "skipped", "sidecar") for name in sidecars}
    assert manifest.split("train").num_records == 2
