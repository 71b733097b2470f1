"""The `shardsmith` command, `inspect`, and the progress bar."""

from __future__ import annotations

import io
import json
import pathlib
import shutil
import subprocess
import sys

import pytest
from helpers import convert, encode, make_class_tree, pixels, write

import schemas
from beam_jobs import _runner
from shardsmith import cli, inspection as inspect_dataset
from shardsmith.progress import ProgressBar
from beam_jobs._shards import RECEIPTS_DIRNAME
from beam_jobs._tfrecord import TMP_DIRNAME


def test_console_script_is_installed_and_lists_commands():
    exe = pathlib.Path(sys.executable).parent / "shardsmith"
    assert exe.exists(), "setup.py's console script is not installed"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("convert", "verify", "inspect", "preview"):
        assert command in out


@pytest.mark.parametrize("command, example", [
    ("convert", "shardsmith convert --input_dir"),
    ("verify", "shardsmith verify ./dataset"),
    ("inspect", "shardsmith inspect ./dataset"),
    ("preview", "shardsmith preview ./dataset"),
])
def test_every_command_has_help_with_an_example(capsys, command, example):
    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: shardsmith {command}") and example in out


def test_unknown_command_is_an_error(capsys):
    assert cli.main(["convrt"]) == 2
    assert "unknown command 'convrt'" in capsys.readouterr().err


def test_default_runner_never_tries_prism():
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    for argv in ([], ["--runner", "DirectRunner"]):
        options = PipelineOptions(argv)
        assert isinstance(_runner.make_runner(options), FnApiRunner)
        assert options.view_as(DirectOptions).direct_running_mode == "multi_threading"
    options = PipelineOptions(["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"])
    _runner.make_runner(options)
    assert options.view_as(DirectOptions).direct_running_mode == "multi_processing"


@pytest.fixture(scope="module")
def unbalanced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inspect")
    root = tmp / "images"
    make_class_tree(root / "train", classes=("big",), per_class=25)
    write(root / "train" / "tiny" / "only.jpg", encode(pixels(5), "JPEG"))
    make_class_tree(root / "val", classes=("big",), per_class=3)
    out = tmp / "out"
    convert(root, out)
    return out


def test_inspect_prints_tables_and_warnings(unbalanced, capsys):
    assert cli.main(["inspect", str(unbalanced)]) == 0
    out = capsys.readouterr().out
    manifest = schemas.Manifest.from_json((unbalanced / schemas.MANIFEST_FILENAME).read_text())
    assert f"{manifest.splits['train'].num_records}" in out and "big" in out and "tiny" in out
    facts = inspect_dataset.inspect_dataset(str(unbalanced))
    warnings = " | ".join(facts["warnings"])
    assert "1 class(es) have no validation images: tiny" in warnings
    assert "heavy imbalance in train: 'big' has 25x the images of 'tiny'" in warnings
    assert "not verified yet" in warnings


def test_inspect_of_a_folder_without_manifest(tmp_path, capsys):
    assert inspect_dataset.main([str(tmp_path)]) == 2
    assert "not a finished shardsmith dataset" in capsys.readouterr().err


def test_inspect_reports_leaks_found_by_verify(unbalanced, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(unbalanced, out)
    report = {"ok": True, "problems": [], "splits": {}, "records": 0,
              "duplicates": {"groups": 2, "across_splits": 1, "list": []}}
    (out / schemas.VERIFY_REPORT_FILENAME).write_text(json.dumps(report))
    warnings = inspect_dataset.inspect_dataset(str(out))["warnings"]
    assert any("appear in more than one split" in w and "--dedup" in w for w in warnings)


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_counts_finished_shards_from_their_receipts(tmp_path, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    receipts = tmp_path / TMP_DIRNAME / RECEIPTS_DIRNAME
    receipts.mkdir(parents=True)
    bar = ProgressBar(str(tmp_path), total=10, receipts_dirname=RECEIPTS_DIRNAME, stream=_Tty())
    assert "0/10 images" in bar.line()
    (receipts / "a.json").write_text(json.dumps({"result": {"num_records": 3}, "rejects": [["x", "corrupt", ""]]}))
    line = bar.line()
    assert "4/10 images" in line and line.startswith("[" + "#" * 11)
    assert ProgressBar.wanted(_Tty())
    assert not ProgressBar.wanted(io.StringIO())  # not a terminal: quiet
    monkeypatch.setenv("CI", "true")
    assert not ProgressBar.wanted(_Tty())  # CI logs: quiet


@pytest.mark.parametrize("module", ["convert", "verify"])
def test_python_m_modules_show_the_same_help(capsys, module):
    import importlib

    assert importlib.import_module(f"beam_jobs.{module}").main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: shardsmith {module}") and "example:" in out
