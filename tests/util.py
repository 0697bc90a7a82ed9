"""Helpers for tests: paths to ../shared (skip outside CI when missing, fail under CI); the activations
the mat-vec kernels see."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
DATA = Path(__file__).resolve().parent / "data"
IN_CI = bool(os.environ.get("CI"))


def shared_path(*parts: str) -> Path:
    """A path under ../shared; skips outside CI when it is missing, fails under CI."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        if IN_CI:
            pytest.fail(f"{p} is missing (CI must have ../shared)")
        pytest.skip(f"{p} is missing")
    return p


def as_kernel_sees(type_name: str, x: np.ndarray) -> np.ndarray:
    """The activations a CPU mat-vec kernel for weights of ``type_name`` multiplies, as float64: the
    k-quant kernels quantize them first (``VEC_DOT_TYPE``), as llama.cpp does."""
    from llamapy.ggml.cpu.matmul_kernels import VEC_DOT_TYPE
    from llamapy.ggml.quants import dequantize, quantize

    vt = VEC_DOT_TYPE.get(type_name)
    if vt is not None:
        x = dequantize(quantize(np.asarray(x, np.float32), vt), vt)
    return np.asarray(x, np.float64)
