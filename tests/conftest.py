"""pytest configuration and shared fixtures of the test suite.

Only fixtures and pytest hooks live here; the plain helper functions the tests import are in
`helpers.py` (a conftest is loaded by pytest, not meant to be imported as a library).
"""

from __future__ import annotations

import logging
import os

import pytest

from helpers import make_class_tree

# TensorFlow's C++ start-up lines and Beam's INFO lines bury the output the
# tests check. Set for the whole test session (and inherited by the child
# processes the tests start), not by any package on import.
_TF_LOG_ENV = "TF_CPP_MIN_LOG_LEVEL"
_QUIET_LOGGERS = ("apache_beam",)


def pytest_configure(config):
    """Quiets TensorFlow's C++ log (unless the caller set it) and Beam's loggers for the session.

    Runs before any test module is imported, so before TensorFlow reads the variable.
    """
    os.environ.setdefault(_TF_LOG_ENV, "2")
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


@pytest.fixture
def class_tree(tmp_path):
    """(root, {relative path: class name}) of a small ROOT/<class>/... tree of JPEG and PNG files."""
    root = tmp_path / "images"
    files = make_class_tree(root)
    return root, files
