"""The Makefile: `make help` lists every target, and `make test-fast` runs tests that exist."""

import pathlib
import re
import subprocess

_REPO = pathlib.Path(__file__).resolve().parent.parent
_MAKEFILE = (_REPO / "Makefile").read_text()


def _targets() -> set[str]:
    """Every target a user can name: rules whose name is a word, not a file or a variable."""
    names = set()
    for match in re.finditer(r"^([A-Za-z][\w-]*)\s*:(?!=)", _MAKEFILE, re.M):
        names.add(match.group(1))
    for phony in re.findall(r"^\.PHONY:(.*)$", _MAKEFILE, re.M):
        names.update(phony.split())
    return names


def test_make_help_lists_every_target():
    shown = subprocess.run(["make", "--no-print-directory", "help"], cwd=_REPO, capture_output=True,
                           text=True, check=True).stdout
    listed = set(re.findall(r"\bmake ([A-Za-z][\w-]*)", shown)) | set(re.findall(r"/ ([a-z][\w-]*)\b", shown))
    targets = _targets()
    assert {"help", "test", "test-fast", "clean", "demo"} <= targets
    assert targets - listed == set(), shown


def test_the_fast_lane_names_test_files_that_exist():
    block = re.search(r"^FAST_TESTS := (.*?)\n\n", _MAKEFILE, re.M | re.S).group(1)
    files = block.replace("\\", " ").split()
    assert len(files) >= 5
    missing = [f for f in files if not (_REPO / f).is_file()]
    assert not missing
