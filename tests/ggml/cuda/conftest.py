"""CUDA backend tests run through Numba's CUDA simulator (no GPU needed) unless a real device is
asked for with LLAMAPY_CUDA_REAL=1 (which also drops a NUMBA_ENABLE_CUDASIM=1 of the environment). numba reads NUMBA_ENABLE_CUDASIM once; the backend re-reads it if
numba was imported first, so setting it here is enough as long as numba.cuda is not imported yet."""

from __future__ import annotations

import importlib.util
import os

import pytest

REAL = os.environ.get("LLAMAPY_CUDA_REAL", "") not in ("", "0")
if REAL:  # a real device even where the environment asks for the simulator
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
else:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def pytest_report_header(config):  # noqa: ARG001
    """Which device the CUDA tests run on (the GPU check's log shows it)."""
    if not REAL:
        return "llamapy CUDA tests: Numba's simulator (LLAMAPY_CUDA_REAL=1 for a real GPU)"
    try:
        from llamapy.ggml.cuda.device import cuda_unavailable_reason

        why = cuda_unavailable_reason()
    except Exception as e:  # pragma: no cover - a broken install
        why = f"{type(e).__name__}: {e}"
    return (
        f"llamapy CUDA tests: real GPU (LLAMAPY_CUDA_REAL=1){'' if why is None else f'; NOT USABLE: {why}'}"
    )


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
