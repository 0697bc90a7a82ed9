"""The decode attention kernels have one parallel region: their ``prange``. An array expression outside it
(``np.zeros``, ``a[:] = v``) would be a parallel region of its own under ``parallel=True``, one more launch
of the thread pool per layer and token (``benchmarks/parfor_count.py``)."""

from __future__ import annotations

import numpy as np
import pytest


def _parfors(kernel, *args) -> int:
    """Parfors of ``kernel``'s code compiled afresh here (a cached load carries no diagnostics)."""
    from numba import njit

    fresh = njit(**kernel.targetoptions)(kernel.py_func)
    fresh(*args)
    diag = fresh.get_metadata(fresh.signatures[0])["parfor_diagnostics"]
    return len(diag.get_parfors())


@pytest.mark.parametrize("name", ["attn_group_f16x8", "attn_split"])
def test_decode_attention_one_parallel_region(name):
    from llamapy.ggml.cpu import attn_decode

    H, Hkv, D, KV = 4, 2, 16, 32
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    mask = np.zeros((1, KV), np.float32)
    out = np.empty((1, H, D), np.float32)
    sl, scale, cap = np.ones(H, np.float32), np.float32(0.25), np.float32(0.0)
    if name == "attn_group_f16x8":
        k, v = (rng.standard_normal(KV * Hkv * D).astype(np.float16).view(np.uint16) for _ in "kv")
        args = (q, k, v, mask, True, scale, cap, sl, out, Hkv, D, 2)
    else:
        k, v = (rng.standard_normal((KV, Hkv, D)).astype(np.float32) for _ in "kv")
        args = (q, k, v, mask, True, scale, cap, sl, out, 2)
    assert _parfors(getattr(attn_decode, name), *args) == 1
