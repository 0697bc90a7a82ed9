"""The ``*_l1`` mat-vec kernels (weight prefetched into L1 instead of L2) give bit-identical outputs, and
``matmul_steps`` runs them for weights of small models only (the size of the buffer a weight views)."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, Scheduler, ops
from llamapy.ggml.cpu import matmul_steps as ms
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.types import TRAITS

ALL_L1_TYPES = [T[name] for name in ms.MATVEC_L1_NAMES]
#: one type per loop template (16-bit, 8-bit k-quant and float activations): each variant is a compile
L1_TYPES = [T.Q4_1, T.Q4_K, T.IQ4_NL]


def random_rows(t: T, n: int, k: int, seed: int) -> np.ndarray:
    """Random quant bytes with sane float16 super-scales (every byte but those is random)."""
    from tests.ggml.test_backend_ops import _F16_FIELDS

    rng = np.random.default_rng(seed)
    tr = TRAITS[t]
    nb = k // tr.block_size
    raw = rng.integers(0, 256, size=(n, nb, tr.type_size), dtype=np.uint8)
    for off in _F16_FIELDS[t]:
        raw[:, :, off : off + 2] = (
            rng.uniform(0.01, 0.1, size=(n, nb)).astype(np.float16).view(np.uint8).reshape(n, nb, 2)
        )
    return raw.reshape(n, nb * tr.type_size)


@pytest.mark.parametrize("t", L1_TYPES, ids=lambda t: t.name)
def test_l1_kernels_are_bit_identical(t):
    from llamapy.ggml.cpu import matmul_kernels as mk

    raw = random_rows(t, 37, 512, int(t))  # 37 rows: prefetches past the end are skipped
    x = np.random.default_rng(1).standard_normal((1, 512)).astype(np.float32)
    a, b = np.zeros((1, 37), np.float32), np.full((1, 37), np.nan, np.float32)
    mk.MATVEC[t.name](raw, x, a, mk.F16_TABLE)
    ms.matvec_l1(t.name)(raw, x, b, mk.F16_TABLE)
    np.testing.assert_array_equal(a, b)


def test_buffer_bytes_is_the_viewed_buffer():
    buf = np.zeros(1 << 20, np.uint8)
    view = buf[4096 : 4096 + 144 * 8].reshape(8, 144)
    assert ms._buffer_bytes(view) == 1 << 20
    assert ms._buffer_bytes(np.frombuffer(memoryview(bytes(5000)), np.uint8)[:100]) == 5000
    assert ms._buffer_bytes(np.zeros((3, 4), np.float32)) == 48


def test_l3_size_is_read_or_defaulted():
    assert ms._l3_bytes() >= 1 << 20


def test_every_type_with_a_one_row_kernel_has_an_l1_variant():
    from llamapy.ggml.cpu import matmul_kernels as mk

    blocks = {
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "IQ4_NL",
        "IQ4_XS",
        "F16",
        "BF16",
    }
    assert set(ms.MATVEC_L1_NAMES) == blocks
    assert all(t.name in mk.MATVEC for t in ALL_L1_TYPES)
    assert ms.matvec_l1("MXFP4") is None  # no variant: the L2 kernel runs


@pytest.mark.parametrize("lo, hi, l1", [(0, None, True), (0, 0, False), (None, None, False)])
def test_the_step_picks_the_variant_by_buffer_size(monkeypatch, lo, hi, l1):
    """A weight whose buffer is within [min, max] runs the ``_l1`` kernel; a larger one (max 0) or a
    smaller one (the default minimum: a test-sized weight) the L2 one."""
    if lo is not None:
        monkeypatch.setattr(ms, "L1_PREFETCH_MIN_BYTES", lo)
    monkeypatch.setattr(ms, "L1_PREFETCH_MAX_BYTES", hi)
    raw = random_rows(T.Q4_K, 9, 256, 3)
    w = ops.weight("w", T.Q4_K, (9, 256), raw)
    x = ops.new_tensor(T.F32, (1, 256))
    be = CPUBackend(1)
    s = Scheduler([be])
    y = ops.mul_mat(w, x)
    s.compute(Graph([y]), {x: np.ones((1, 256), np.float32)})
    names = {getattr(k, "__name__", "") for k in be._needed}
    assert ("mm_q4_k_l1" in names) is l1 and ("mm_q4_k" in names) is not l1
