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


def q16_roundtrip(x: np.ndarray) -> np.ndarray:
    """x quantized to 16 bits per 32-element block and back (float64), as the one-row kernels of the
    32-element types do (``hsimd.quantize_rows_q16``), written here again in NumPy: d = max|x| / 32767
    of the block, q = rint(x * (32767 / max|x|)) in float32 arithmetic."""
    x = np.asarray(x, np.float32)
    b = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    safe = np.where(amax > 0, amax, np.float32(1))
    q = np.rint(b * (np.float32(32767) / safe))
    d = (safe / np.float32(32767)).astype(np.float32)
    return np.where(amax > 0, q.astype(np.float64) * d, 0.0).reshape(x.shape)


def as_kernel_sees(type_name: str, x: np.ndarray, matvec: bool = False) -> np.ndarray:
    """The activations a CPU mat-vec kernel for weights of ``type_name`` multiplies, as float64: the
    k-quant kernels quantize them first (``VEC_DOT_TYPE``), as llama.cpp does; the one-row kernels
    (``matvec``: ``MATVEC``, one activation row through the graph) of the 32-element types quantize
    them to 16 bits (``Q16_TYPES``)."""
    from llamapy.ggml.cpu.matmul_kernels import Q16_TYPES, VEC_DOT_TYPE
    from llamapy.ggml.quants import dequantize, quantize

    vt = VEC_DOT_TYPE.get(type_name)
    if vt is not None:
        x = dequantize(quantize(np.asarray(x, np.float32), vt), vt)
    elif matvec and type_name in Q16_TYPES:
        x = q16_roundtrip(x)
    return np.asarray(x, np.float64)


def run_with_numba_cache(tmp: Path, code: str, **env: str) -> list[str]:
    """Run ``code`` in a fresh Python with ``tmp`` importable and ``tmp/cache`` as its Numba cache (and no
    LLAMAPY_NUMBA_* settings but ``env``'s); its stdout lines (it must exit 0)."""
    import os
    import subprocess
    import sys

    e = {k: v for k, v in os.environ.items() if not k.startswith("LLAMAPY_NUMBA")}
    e.update(NUMBA_CACHE_DIR=str(tmp / "cache"), PYTHONPATH=os.pathsep.join([str(tmp), *sys.path]), **env)
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")
