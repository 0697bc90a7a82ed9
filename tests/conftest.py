"""Shared fixtures: the two real models (fetched once into the cache) and ../shared reference data."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.util import shared_path

# the prefetch tuners' kept decisions (``llamapy.context._keep_tuning``) go to a directory of this test
# run, not the user's cache: a test's decode on a busy machine must not decide for the user's model files
if "LLAMAPY_TUNE_DIR" not in os.environ:
    _tune_dir = tempfile.mkdtemp(prefix="llamapy-test-tune-")
    os.environ["LLAMAPY_TUNE_DIR"] = _tune_dir
    atexit.register(shutil.rmtree, _tune_dir, True)


def _model(name: str) -> Path:
    from llamapy import hub

    return hub.pull(name, quiet=True)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _model("gemma3-270m")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return shared_path()
