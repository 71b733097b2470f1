"""Recovering from a file that stopped its process (conversion/recovery.py): the culprit is named."""

from __future__ import annotations

import signal
import time

from conversion import guard, recovery
from imaging import ValidationOptions
from helpers import holding_process


def test_the_watchdog_marks_an_overdue_slot_and_kills_its_process(tmp_path):
    proc = holding_process(tmp_path)
    try:
        watchdog = guard.Watchdog(str(tmp_path), 0.3)
        watchdog.check()
        assert proc.poll() is None  # Not overdue yet.
        time.sleep(0.5)
        watchdog.check()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        found = recovery.crash_culprits(str(tmp_path), proc.pid, -signal.SIGKILL, ValidationOptions(), 0.3, {})
    finally:
        proc.kill()
    # Two files in the slot: each is tried alone (here: neither exists, so neither hangs).
    assert found == {}
    assert not (tmp_path / str(proc.pid)).exists()  # Forgotten once read.


def test_the_watchdog_kills_a_process_past_file_memory_with_a_file_in_work(tmp_path):
    proc = holding_process(tmp_path)
    try:
        rss = guard.resident_bytes(proc.pid)
        assert rss and rss > 1 << 20
        guard.Watchdog(str(tmp_path), None, memory=rss + (256 << 20)).check()
        assert proc.poll() is None  # Within its bound.
        guard.Watchdog(str(tmp_path), None, memory=rss // 2).check()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        [slot] = guard.busy_slots(str(tmp_path), [proc.pid])
        assert slot.over_memory and not slot.timed_out
        assert [s.rel_path for s in slot.suspects] == ["a/x.jpg", "b/\u00e9t\u00e9.png"]
    finally:
        proc.kill()


def test_a_process_that_died_working_on_no_file_blames_none(tmp_path):
    assert recovery.crash_culprits(str(tmp_path), 12345, -signal.SIGKILL, None, 1, {}) is None


def test_files_that_do_not_crash_alone_get_one_more_try_then_are_blamed_together(tmp_path):
    """A crash no suspect repeats alone (the machine's memory, say): retried once, then all blamed."""
    seen: dict = {}
    answers = []
    for _ in range(2):
        proc = holding_process(tmp_path)
        proc.kill()
        proc.wait()
        answers.append(recovery.crash_culprits(str(tmp_path), proc.pid, -signal.SIGKILL, ValidationOptions(), 5, seen))
    assert answers[0] == {}  # Neither crashes alone (neither exists): tried again as it was.
    assert sorted(answers[1]) == ["a/x.jpg", "b/\u00e9t\u00e9.png"]
    assert {reason for reason, _ in answers[1].values()} == {guard.DECODER_CRASHED}
    assert "twice, with 1 other files in work" in answers[1]["a/x.jpg"][1]
