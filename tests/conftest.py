"""Shared fixtures: the two real models (fetched once into the cache) and ../shared reference data."""

from __future__ import annotations

import sys
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


@pytest.fixture(autouse=True)
def _no_thread_cap() -> None:
    """Each test starts without a thread cap: a ``Context`` without ``n_threads`` caps its thread's kernel
    threads for its decodes (the busy-machine policy, ``llamapy._numba.cap_threads``) and the cap stays with
    the thread, so on a busy machine an earlier test's context changed what a later bare ``Scheduler`` got."""
    numba_mod = sys.modules.get("llamapy._numba")
    if numba_mod is not None:
        numba_mod.cap_threads(0)
