"""The small-batch mat-vec kernels (``matmul_kernels.MATVEC_BATCH``: each weight block decoded once per
four rows; ``MATVEC_BATCH8``: once per eight, for the 32-element types) against the NumPy codec, against
the one-row kernels, and through ``mul_mat``. Odd row counts (groups of four plus a remainder), odd block
counts, M = 1..17 (groups of four, of two, a repeated last row)."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.cpu import matmul_kernels as mk
from llamapy.ggml.cpu.backend import CPUBackend, matvec_max_rows
from llamapy.ggml.quants import dequantize, quantize
from llamapy.ggml.types import TRAITS
from tests.util import as_kernel_sees

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4]
TYPES += [T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS]
FAMILIES = {"b4": mk.MATVEC_BATCH, "b8": mk.MATVEC_BATCH8}
#: (type, kernel family) for every batch kernel
KERNELS = [(t, f) for f in FAMILIES for t in TYPES if t.name in FAMILIES[f]]


def _id(tf) -> str:
    return f"{tf[0].name}-{tf[1]}"


N_ROWS = 13  # three groups of four weight rows plus one


def _k(t: T) -> int:
    return 512 if TRAITS[t].block_size == 256 else 32 * 9  # 9 blocks: an odd count


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b**2), 1e-30))


@pytest.fixture(scope="module", params=KERNELS, ids=_id)
def case(request):
    t, fam = request.param
    rng = np.random.default_rng(int(t))
    k = _k(t)
    raw = quantize(rng.standard_normal((N_ROWS, k)).astype(np.float32), t)
    x = rng.standard_normal((17, k)).astype(np.float32)
    ref = as_kernel_sees(t.name, x) @ dequantize(raw, t).astype(np.float64).T
    one = np.zeros((17, N_ROWS), np.float32)
    for m in range(17):
        mk.MATVEC[t.name](raw, x[m : m + 1], one[m : m + 1], mk.F16_TABLE)
    one_ref = as_kernel_sees(t.name, x, matvec=True) @ dequantize(raw, t).astype(np.float64).T
    assert _nmse(one, one_ref) < 1e-10
    return t, FAMILIES[fam][t.name], raw, x, ref, one


def test_every_type_with_a_matvec_kernel_has_a_batch_kernel():
    # F16 / BF16: the one-row kernel takes every row of a group of four weight rows while they are in L1
    one_row_only = {"F16", "BF16"}
    assert set(mk.MATVEC_BATCH) == set(mk.MATVEC) - one_row_only
    assert set(mk.MATVEC_BATCH8) == {n for n in mk.MATVEC if not n.endswith("_K")} - one_row_only
    assert mk.matvec_kernel("F16", 3) is mk.MATVEC["F16"]
    assert mk.matvec_kernel("Q4_0", 1) is mk.MATVEC["Q4_0"]
    assert mk.matvec_kernel("Q4_0", 2) is mk.MATVEC_BATCH["Q4_0"]
    assert mk.matvec_kernel("Q4_0", mk.BATCH8_MIN_ROWS) is mk.MATVEC_BATCH8["Q4_0"]
    assert mk.matvec_kernel("Q4_K", 16) is mk.MATVEC_BATCH["Q4_K"]
    assert mk.matvec_kernel("IQ2_XS", 3) is None


@pytest.mark.parametrize("m", list(range(1, 18)))
def test_batch_kernel_matches_codec_and_one_row_kernel(case, m):
    t, kern, raw, x, ref, one = case
    out = np.full((m, N_ROWS), np.nan, np.float32)
    kern(raw, x[:m], out, mk.F16_TABLE)
    assert _nmse(out, ref[:m]) < 1e-10
    # the one-row kernel: the same up to float rounding order (same 8-bit activations for the k-quants),
    # or up to its 16-bit activations (the 32-element types)
    tol = 1e-4 if t.name in mk.Q16_TYPES else 1e-5
    np.testing.assert_allclose(out, one[:m], rtol=tol, atol=tol * np.abs(one[:m]).max())


def test_a_rows_result_does_not_depend_on_the_batch(case):
    """Row 5 alone (a pair of itself), in groups of two, four and eight, as a repeated last row."""
    t, kern, raw, x, _, _ = case
    got = []
    for rows in (
        [5, 5],
        [4, 5],
        [5, 0, 1, 2],
        [0, 1, 2, 3, 4, 5],
        [2, 3, 4, 5, 6, 7, 8, 9, 10],
        [0] * 9 + [5],
    ):
        out = np.zeros((len(rows), N_ROWS), np.float32)
        kern(raw, np.ascontiguousarray(x[rows]), out, mk.F16_TABLE)
        got.append(out[rows.index(5)])
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])


# offsets of the float16 super-scales in each block (every other byte random), as in test_backend_ops
_F16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.MXFP4: (),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.IQ4_NL: (0,), T.IQ4_XS: (0,),
}  # fmt: skip


@pytest.mark.parametrize("tf", KERNELS, ids=_id)
def test_batch_kernels_on_random_bits(tf):
    """Every bit pattern of quants, scales and mins: catches unpacking mistakes real data may miss."""
    t, fam = tf
    kern = FAMILIES[fam][t.name]
    rng = np.random.default_rng(int(t) + 99)
    n, k, m = 7, _k(t), 6
    tr = TRAITS[t]
    nb = k // tr.block_size
    raw = rng.integers(0, 256, size=(n, nb, tr.type_size), dtype=np.uint8)
    for off in _F16_FIELDS[t]:
        raw[:, :, off : off + 2] = (
            rng.uniform(0.01, 0.1, size=(n, nb)).astype(np.float16).view(np.uint8).reshape(n, nb, 2)
        )
    if t == T.MXFP4:  # E8M0 scales near 1
        raw[:, :, 0] = rng.integers(120, 136, size=(n, nb))
    raw = raw.reshape(n, nb * tr.type_size)
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    kern(raw, x, out, mk.F16_TABLE)
    ref = as_kernel_sees(t.name, x) @ dequantize(raw, t).astype(np.float64).T
    assert _nmse(out, ref) < 1e-10


@pytest.mark.parametrize("t", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_kquant_batch_nonfinite_row_gives_nan_only_there(t):
    rng = np.random.default_rng(3)
    raw = quantize(rng.standard_normal((6, 512)).astype(np.float32), t)
    x = rng.standard_normal((5, 512)).astype(np.float32)
    x[3, 300] = np.nan
    out = np.zeros((5, 6), np.float32)
    mk.MATVEC_BATCH[t.name](raw, x, out, mk.F16_TABLE)
    assert np.isnan(out[3]).all()
    assert np.isfinite(np.delete(out, 3, axis=0)).all()


@pytest.mark.parametrize("t", [T.Q4_1, T.Q6_K], ids=lambda t: t.name)
def test_mul_mat_uses_the_batch_kernel_up_to_the_switch_point(t):
    """Through the graph at M = 2, 5 and the type's switch point (``matvec_max_rows``): the chosen
    kernel's own output."""
    rng = np.random.default_rng(11)
    k = _k(t)
    raw = quantize(rng.standard_normal((N_ROWS, k)).astype(np.float32), t)
    w = ops.weight("w", t, (N_ROWS, k), raw)
    for m in (2, mk.BATCH8_MIN_ROWS, matvec_max_rows(t.name)):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        x = ops.new_tensor(T.F32, (m, k))
        y = ops.mul_mat(w, x)
        res = []
        for be in (CPUBackend(2), NumpyBackend()):
            s = Scheduler([be])
            s.compute(Graph(y), {x: xv})
            res.append(s.get(y))
        direct = np.zeros((m, N_ROWS), np.float32)
        mk.matvec_kernel(t.name, m)(raw, xv, direct, mk.F16_TABLE)
        np.testing.assert_array_equal(res[0], direct)
        assert _nmse(res[0], res[1]) < 5e-4  # llama.cpp's bound (k-quants quantize the activations)
