"""Damaged files of every format through the real command (issue 39): `bench.mutations_convert`.

Each run writes the seed files of `bench.mutations` (Pillow's JPEGs and PNGs,
tifffile's TIFFs, a GDAL GeoTIFF, pydicom's files in seven transfer syntaxes)
and their damaged copies into one folder, converts it with `shardsmith
convert --file_timeout`, and checks the output alone: exit status 0 or 3,
every input written or rejected with a known reason (once), every record
parsed and decoded by the reader's functions to its stored shape, `shardsmith
verify` passing, no crash or hang, and the process tree's peak memory.

The fast lane runs ~90 files (3 damaged copies of each seed file) and 63
volumes; the slow one (`SHARDSMITH_SLOW=1`) thousands, in worker processes as
a large folder is converted.

NIfTI files and DICOM series go through `--volumes` apart (`write_volume_cases`):
damaged NIfTI-1 files (nibabel's, half gzipped after) and series of pydicom
slices with one or two slices damaged, dropped, duplicated or emptied, checked
per file.
"""

from __future__ import annotations

import os

import pytest

from bench import mutate, mutations, mutations_convert

# Far above a small file's decode on a loaded machine, yet short.
_FILE_TIMEOUT = 20
# The command's process tree: the driver with TensorFlow's decoders and Beam (~0.7 GiB), and its
# worker processes in the slow lane. A file that allocated what its header claims would pass it.
_PEAK_BYTES = 4 << 30
_SLOW = os.environ.get("SHARDSMITH_SLOW") == "1"


def _check(outcome: mutations_convert.ConversionOutcome) -> None:
    report = mutations_convert.report(outcome, 0)
    assert outcome.status in (0, 3), report
    assert not outcome.breaks, report
    assert not outcome.crashes, report
    assert not outcome.hangs, report
    # Decoders' console lines (libjpeg, libtiff, a Rust decoder's panic) are shardsmith's to report.
    assert not outcome.noise, report
    for fmt in mutate.FORMATS:
        assert outcome.cases[fmt] > 0, fmt
        # Both verdicts are reached for every format: the seed files convert, and the damage tells.
        assert outcome.written[fmt] > 0, report
        assert outcome.rejected[fmt]["corrupt"] > 0, report
        assert outcome.written[fmt] + sum(outcome.rejected[fmt].values()) == outcome.cases[fmt], report
    assert outcome.records >= sum(outcome.written.values())
    assert 0 < outcome.peak_rss < _PEAK_BYTES, report


def test_a_folder_of_damaged_files_converts_with_every_file_accounted_for(tmp_path):
    cases = mutations_convert.write_cases(tmp_path / "in", 3, 0)
    assert len(cases) == 4 * len(mutations.seed_files())
    outcome = mutations_convert.convert_cases(tmp_path / "in", tmp_path / "out", cases,
                                              file_timeout=_FILE_TIMEOUT)
    _check(outcome)


@pytest.mark.skipif(not _SLOW, reason="thousands of damaged files: SHARDSMITH_SLOW=1")
def test_thousands_of_damaged_files_convert_in_worker_processes(tmp_path):
    cases = mutations_convert.write_cases(tmp_path / "in", 100, 7)
    outcome = mutations_convert.convert_cases(tmp_path / "in", tmp_path / "out", cases,
                                              file_timeout=_FILE_TIMEOUT)
    _check(outcome)


def _check_volumes(outcome: mutations_convert.ConversionOutcome) -> None:
    report = mutations_convert.report(outcome, 0, mutations_convert.VOLUME_FORMATS)
    assert outcome.status in (0, 3), report
    assert not outcome.breaks, report
    assert not outcome.crashes, report
    assert not outcome.hangs, report
    assert not outcome.noise, report
    for fmt in mutations_convert.VOLUME_FORMATS:
        assert outcome.written[fmt] > 0, report
        assert outcome.rejected[fmt]["corrupt"] > 0, report
    assert outcome.records >= sum(outcome.written.values())
    assert 0 < outcome.peak_rss < _PEAK_BYTES, report


def test_damaged_nifti_files_and_series_convert_with_every_file_accounted_for(tmp_path):
    cases = mutations_convert.write_volume_cases(tmp_path / "in", 20, 0)
    assert len(cases) == 2 * 21 + 21
    outcome = mutations_convert.convert_volume_cases(tmp_path / "in", tmp_path / "out", cases,
                                                     file_timeout=_FILE_TIMEOUT)
    _check_volumes(outcome)


@pytest.mark.skipif(not _SLOW, reason="thousands of damaged volumes: SHARDSMITH_SLOW=1")
def test_thousands_of_damaged_nifti_files_and_series_convert(tmp_path):
    cases = mutations_convert.write_volume_cases(tmp_path / "in", 700, 7)
    outcome = mutations_convert.convert_volume_cases(tmp_path / "in", tmp_path / "out", cases,
                                                     file_timeout=_FILE_TIMEOUT)
    _check_volumes(outcome)
