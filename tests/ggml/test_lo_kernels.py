"""The mat-vec kernels for Q2_K, Q3_K (``kquant_lo_kernels``: Q8_K activations, integer dots) and IQ4_NL,
IQ4_XS (``iq4_kernels``: float activations, table lookup), one-row and small-batch, against the NumPy
codec: odd row counts, several K, non-finite activations, the generic-IR path (no AVX2), and through
``mul_mat`` / ``mul_mat_id`` on the CPU backend against the NumPy backend. (Random bit patterns, M = 1..17
and batch independence are in ``test_matvec_batch`` / ``test_backend_ops``, which cover these types.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.cpu import matmul_kernels as mk
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.quants import dequantize, quantize
from llamapy.ggml.types import TRAITS
from tests.ggml.generic_target import run_on_generic_target
from tests.util import as_kernel_sees

TYPES = [T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS]


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b**2), 1e-30))


def test_the_new_types_are_registered():
    for t in TYPES:
        assert mk.matvec_kernel(t.name, 1) is mk.MATVEC[t.name]
        assert mk.matvec_kernel(t.name, 2) is mk.MATVEC_BATCH[t.name]
        eight = mk.MATVEC_BATCH8 if t.name.startswith("IQ4") else mk.MATVEC_BATCH  # float types: 8 rows
        assert mk.matvec_kernel(t.name, mk.BATCH8_MIN_ROWS) is eight[t.name]
    assert mk.VEC_DOT_TYPE["Q2_K"] == mk.VEC_DOT_TYPE["Q3_K"] == T.Q8_K
    assert "IQ4_NL" not in mk.VEC_DOT_TYPE  # float activations


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 5, 11])
def test_kernels_match_the_codec_odd_rows_several_k(t, n):
    rng = np.random.default_rng(int(t) * 100 + n)
    bs = TRAITS[t].block_size
    for k in (bs, 3 * bs, 256 * 5):
        raw = quantize(rng.standard_normal((n, k)).astype(np.float32), t)
        x = rng.standard_normal((11, k)).astype(np.float32) * 3
        ref = as_kernel_sees(t.name, x) @ dequantize(raw, t).astype(np.float64).T
        for m in (1, 2, 6, 11):
            out = np.full((m, n), np.nan, np.float32)
            mk.matvec_kernel(t.name, m)(raw, x[:m], out, mk.F16_TABLE)
            assert _nmse(out, ref[:m]) < 1e-10, (k, m)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_activations_give_nan_in_that_row_only(t, bad):
    rng = np.random.default_rng(3)
    raw = quantize(rng.standard_normal((6, 512)).astype(np.float32), t)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[1, 300] = bad
    for m in (2, 3):
        out = np.zeros((m, 6), np.float32)
        mk.matvec_kernel(t.name, m)(raw, x[:m], out, mk.F16_TABLE)
        assert np.isfinite(np.delete(out, 1, axis=0)).all()
        assert not np.isfinite(out[1]).any()
    one = np.zeros((1, 6), np.float32)
    mk.MATVEC[t.name](raw, x[1:2], one, mk.F16_TABLE)
    assert not np.isfinite(one).any()


def test_q3_k_every_scale_and_hmask_bit():
    """Blocks whose 16 scales run over all 64 values and whose hmask bits are all set or all clear:
    the -4 offset and the 6-bit scale unpacking at their extremes."""
    rng = np.random.default_rng(8)
    nb = 4
    raw = rng.integers(0, 256, size=(3, nb, TRAITS[T.Q3_K].type_size), dtype=np.uint8)
    raw[0, :, :32] = 0
    raw[1, :, :32] = 255
    raw[:, :, 108:110] = np.array([0.05], np.float16).view(np.uint8)
    vals = rng.permutation(64).astype(np.uint8).reshape(nb, 16)  # the 64 scale values, 16 per block
    sc = np.zeros((nb, 12), np.uint8)
    for i in range(8):  # ggml-common.h's packing: low 4 bits in bytes 0-7, high 2 bits in bytes 8-11
        sc[:, i] = (vals[:, i] & 15) | ((vals[:, 8 + i] & 15) << 4)
        sc[:, 8 + i % 4] |= ((vals[:, i] >> 4) << (2 * (i // 4))) | (
            (vals[:, 8 + i] >> 4) << (2 * (i // 4) + 4)
        )
    raw[:, :, 96:108] = sc
    raw = raw.reshape(3, -1)
    x = rng.standard_normal((2, nb * 256)).astype(np.float32)
    for m in (1, 2):
        out = np.zeros((m, 3), np.float32)
        mk.matvec_kernel("Q3_K", m)(raw, x[:m], out, mk.F16_TABLE)
        ref = as_kernel_sees("Q3_K", x[:m]) @ dequantize(raw, T.Q3_K).astype(np.float64).T
        assert _nmse(out, ref) < 1e-10


_GENERIC = """
import numpy as np
from llamapy.ggml import GGMLType as T
from llamapy.ggml.cpu import isimd, matmul_kernels as mk
from llamapy.ggml.quants import dequantize, quantize
from tests.util import as_kernel_sees
assert not isimd.HAVE_AVX2
rng = np.random.default_rng(5)
for t in (T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS):
    raw = quantize(rng.standard_normal((9, 768)).astype(np.float32), t)
    x = rng.standard_normal((3, 768)).astype(np.float32)
    ref = as_kernel_sees(t.name, x) @ dequantize(raw, t).T.astype(np.float64)
    for m in (1, 3):
        out = np.zeros((m, 9), np.float32)
        mk.matvec_kernel(t.name, m)(raw, x[:m], out, mk.F16_TABLE)
        err = float(((out - ref[:m]) ** 2).sum() / (ref[:m] ** 2).sum())
        assert err < 1e-10, (t.name, m, err)
print("ok")
"""


def test_generic_ir_on_a_plain_x86_64_target():
    """NUMBA_CPU_NAME=generic: no AVX2 (``vnl`` extracts lanes instead of ``vpermps``)."""
    run_on_generic_target(_GENERIC, timeout=900, cwd=Path(__file__).resolve().parents[2])


def _both(outs, feeds):
    g = Graph(outs)
    res = []
    for be in (CPUBackend(2), NumpyBackend()):
        s = Scheduler([be])
        s.compute(g, feeds)
        res.append([s.get(o) for o in outs])
    return res


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_mul_mat_and_mul_mat_id_pick_the_kernels(t):
    rng = np.random.default_rng(int(t))
    n, k = 13, 512
    raw = quantize(rng.standard_normal((n, k)).astype(np.float32), t)
    w = ops.weight("w", t, (n, k), raw)
    E, U, Tn = 3, 2, 5
    ea = ops.weight("experts", t, (E, n, k), quantize(rng.standard_normal((E, n, k)).astype(np.float32), t))
    xs = {m: ops.new_tensor(T.F32, (m, k)) for m in (1, 3, 9)}
    b = ops.new_tensor(T.F32, (Tn, U, k))
    ids = ops.new_tensor(T.I32, (Tn, U))
    feeds = {x: rng.standard_normal(x.shape).astype(np.float32) for x in xs.values()}
    feeds[b] = rng.standard_normal((Tn, U, k)).astype(np.float32)
    feeds[ids] = rng.integers(0, E, size=(Tn, U)).astype(np.int32)
    outs = [ops.mul_mat(w, x) for x in xs.values()] + [ops.mul_mat_id(ea, b, ids)]
    got, ref = _both(outs, feeds)
    for m, x in xs.items():  # the chosen kernel's own output, bit for bit
        direct = np.zeros((m, n), np.float32)
        mk.matvec_kernel(t.name, m)(raw, feeds[x], direct, mk.F16_TABLE)
        np.testing.assert_array_equal(got[list(xs).index(m)], direct)
    tol = 5e-4 if t.name in mk.VEC_DOT_TYPE else 1e-9  # llama.cpp's bound with 8-bit activations
    for a, r in zip(got, ref, strict=True):
        assert _nmse(a, r) < tol
