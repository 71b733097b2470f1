"""conversion.progress: the progress bar counts finished shards from the receipts the shard maker leaves."""

from __future__ import annotations

import io

from helpers import make_class_tree

from conversion import plan as _plan
from conversion.progress import ProgressBar
from conversion.receipts import RECEIPTS_DIRNAME
from conversion.shard_maker import ShardMaker, ShardSpec
from imaging import ValidationOptions


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_counts_finished_shards_from_their_receipts(tmp_path, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    root = tmp_path / "images"
    make_class_tree(root, classes=("a",), per_class=3)
    (root / "a" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    rels = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.*"))
    files = [_plan.PlannedFile("train", 0, i, rel, str(root / rel), (root / rel).stat().st_size, 0, 1)
             for i, rel in enumerate(rels)]
    out = tmp_path / "out"
    bar = ProgressBar(str(out), total=10, receipts_dirname=RECEIPTS_DIRNAME, stream=_Tty())
    assert "0/10 images" in bar.line()
    maker = ShardMaker(ShardSpec(str(out), ValidationOptions(), num_classes=1, total_shards=1))
    outcome = maker.write(maker.shard("train", 0, files))
    assert outcome.result.num_records == 3 and len(outcome.rejects) == 1
    line = bar.line()  # Records and rejects: 4 of 10.
    assert "4/10 images" in line and line.startswith("[" + "#" * 11 + ".")
    assert ProgressBar.wanted(_Tty())
    assert not ProgressBar.wanted(io.StringIO())  # not a terminal: quiet
    monkeypatch.setenv("CI", "true")
    assert not ProgressBar.wanted(_Tty())  # CI logs: quiet


def test_the_bar_draws_and_clears_its_line(tmp_path, monkeypatch):
    stream = _Tty()
    bar = ProgressBar(str(tmp_path), total=3, receipts_dirname=RECEIPTS_DIRNAME, stream=stream, interval=0.01)
    bar.start()
    while "0/3 images" not in stream.getvalue():
        pass
    bar.stop()
    assert stream.getvalue().endswith("\r\033[K")
