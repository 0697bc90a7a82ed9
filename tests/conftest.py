"""Shared fixtures: the two real models (fetched once into the cache) and ../shared reference data."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.util import shared_path


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
