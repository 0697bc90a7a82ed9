"""CUDA backend tests run through Numba's CUDA simulator (no GPU needed) unless a real device is
asked for with LLAMAPY_CUDA_REAL=1. numba reads NUMBA_ENABLE_CUDASIM once; the backend re-reads it if
numba was imported first, so setting it here is enough as long as numba.cuda is not imported yet."""

from __future__ import annotations

import importlib.util
import os

import pytest

if not os.environ.get("LLAMAPY_CUDA_REAL"):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def pytest_collection_modifyitems(config, items):  # noqa: ARG001
    if importlib.util.find_spec("numba_cuda") is not None:
        return
    if os.environ.get("CI"):
        return  # in CI the tests run (and fail at import) so that a missing numba-cuda is seen
    skip = pytest.mark.skip(reason="numba-cuda is not installed")
    for it in items:
        if "tests/ggml/cuda" in str(it.fspath).replace(os.sep, "/"):
            it.add_marker(skip)


@pytest.fixture(scope="session")
def cuda_backend():
    from llamapy.ggml.backend import create_backend

    return create_backend("cuda")
