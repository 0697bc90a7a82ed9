"""The F16 / BF16 mat-vec kernels (``llamapy.ggml.cpu.f16_kernels``): against a float64 product of the same
16-bit weights, through the ``MATVEC`` table and through a graph (where they replace the float-tile path)."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, Scheduler, ops
from llamapy.ggml.cpu import f16_kernels as fk
from llamapy.ggml.cpu import matmul_kernels as mk
from llamapy.ggml.cpu import matmul_steps
from llamapy.ggml.cpu.backend import CPUBackend

RNG = np.random.default_rng(7)


def _weight(t: T, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The stored weight (float16, or uint16 bfloat16 bits) and its exact float64 values."""
    w = RNG.standard_normal((n, k)).astype(np.float32)
    if t == T.F16:
        raw = w.astype(np.float16)
        return raw, raw.astype(np.float64)
    raw = (w.view(np.uint32) >> 16).astype(np.uint16)
    return raw, (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("t", [T.F16, T.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("n,k,m", [(13, 576, 1), (8, 1536, 3), (5, 64, 6), (7, 40, 2)])
def test_kernel_matches_float64(t, n, k, m):
    raw, exact = _weight(t, n, k)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    mk.MATVEC[t.name](raw, x, out, mk.F16_TABLE)  # k=40: not a multiple of 32, NumPy's product
    assert _rel(out, x.astype(np.float64) @ exact.T) < 1e-6


@pytest.mark.parametrize("t", [T.F16, T.BF16], ids=lambda t: t.name)
def test_l1_variants_give_the_same_bytes(t):
    raw, _ = _weight(t, 9, 256)
    x = RNG.standard_normal((2, 256)).astype(np.float32)
    a, b = np.empty((2, 9), np.float32), np.empty((2, 9), np.float32)
    l2, l1 = (fk.mm_f16, fk.mm_f16_l1) if t == T.F16 else (fk.mm_bf16, fk.mm_bf16_l1)
    l2(raw, x, a, mk.F16_TABLE)
    l1(raw, x, b, mk.F16_TABLE)
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("t", [T.F16, T.BF16], ids=lambda t: t.name)
def test_graph_runs_the_kernel_not_float_tiles(t, monkeypatch):
    """A decode-sized mul_mat on a 16-bit weight goes through the kernel: with the tile path's row
    converter broken, it still computes the right product."""

    def broken(*a, **k):  # pragma: no cover - must not be called
        raise AssertionError("float-tile path used for a 16-bit weight")

    monkeypatch.setattr(matmul_steps, "_row_converter", broken)
    raw, exact = _weight(t, 12, 128)
    w = ops.weight("w", t, (12, 128), raw)
    x = ops.new_tensor(T.F32, (1, 128))
    y = ops.mul_mat(w, x)
    xv = RNG.standard_normal((1, 128)).astype(np.float32)
    s = Scheduler([CPUBackend(2)])
    s.compute(Graph([y]), {x: xv})
    assert _rel(s.get(y), xv.astype(np.float64) @ exact.T) < 1e-6
