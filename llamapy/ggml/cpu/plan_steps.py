"""Cheaper steps for the small ops of a decode token (the kernels are in ``plan_kernels``): each is one
serial Numba call where the general step makes several NumPy calls or a parallel launch. The CPU
backend asks these builders first; None means "use the general step". Results are bit-identical to the
general steps (tests/ggml/test_plan_steps.py).

The residual ``add`` before a fused ``rms_norm`` + ``mul`` (backend ``_residual_adds`` finds them) runs
inside that norm's call (``add_norm_step``): two fewer steps a llama-style layer.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..._numba import on_one_thread
from ..backend import ArrayMap, ComputeError, Step
from ..tensor import Tensor

__all__ = [
    "ENABLED",
    "GLU_SERIAL_MAX",
    "add_norm_step",
    "attn_group_step",
    "glu_step",
    "set_rows_step",
]

#: False: the backend builds the general steps (tests compare the two, byte for byte)
ENABLED = True

#: gated units over at most this many elements run serially (one decode row of a 0.5B-7B model's FFN is
#: 1.5k-19k; a parallel launch costs ~2 us on an idle machine and far more on a busy one)
GLU_SERIAL_MAX = 1 << 15


def _row_view(arr: np.ndarray, rows: int, width: int) -> np.ndarray | None:
    """``arr`` as a C-contiguous [rows, width] view, else None."""
    if not arr.flags.c_contiguous or arr.size != rows * width:
        return None
    return arr.reshape(rows, width)


def set_rows_step(
    out: np.ndarray, src: np.ndarray, idx: np.ndarray, n: int, name: str, need: Callable[..., None]
) -> Step | None:
    """``out[idx] = src`` (K/V cache rows) as one kernel call: ``out`` float16 or float32 rows, ``src``
    float32, ``idx`` one id per row. None when the arrays are of another form."""
    if not ENABLED:
        return None
    if idx.ndim != 1 or idx.dtype.kind not in "iu" or out.ndim != 2 or src.dtype != np.float32:
        return None
    if out.strides[1] != out.itemsize or out.dtype not in (np.float16, np.float32):
        return None
    T, D = idx.shape[0], out.shape[1]
    S = _row_view(src, T, D)
    if S is None:
        return None
    from . import plan_kernels as pk

    def bad(i: int) -> ComputeError:
        return ComputeError(f"set_rows {name!r}: row index {int(idx[i])} (at {i}) not in 0..{n - 1}")

    if out.dtype == np.float32:
        same = pk.set_rows_same
        need(same)

        def step_same() -> None:
            i = same(S, idx, out, n)
            if i >= 0:
                raise bad(i)

        return step_same
    kern = pk.set_rows_f16
    need(kern)
    bits, out16 = S.view(np.uint32), out.view(np.uint16)

    def step_f16() -> None:
        i = kern(bits, idx, out16, n)
        if i >= 0:
            raise bad(i)
        if i == -2:  # a NaN: NumPy's conversion (and its NaN payloads) for the whole write
            out[idx] = S

    return step_f16


def add_norm_step(add: Tensor, mul: Tensor, arrays: ArrayMap, need: Callable[..., None]) -> Step | None:
    """The residual ``add`` and the fused ``rms_norm`` + ``mul`` right after it (``mul.src[0]`` is the
    norm of ``add``; backend ``_residual_adds`` checked the graph) as one ``add_rms_norm_mul_rows``
    call; None when the arrays are not C-contiguous float32 rows of one width."""
    a, b = add.src
    nrm, wt = mul.src
    A, B, S, W, O = (arrays[id(t)] for t in (a, b, add, wt, mul))
    d = S.shape[-1] if S.ndim else 0
    rows = S.size // d if d else 0
    views = [_row_view(x, rows, d) if x.dtype == np.float32 else None for x in (A, B, S, O)]
    if not d or any(v is None for v in views) or W.dtype != np.float32 or W.shape != (d,):
        return None
    if not W.flags.c_contiguous:
        return None
    from .plan_kernels import add_rms_norm_mul_rows

    need(add_rms_norm_mul_rows)
    A2, B2, S2, O2 = views
    eps = float(nrm.params["eps"])
    return lambda: add_rms_norm_mul_rows(A2, B2, S2, eps, W, O2)


def glu_step(
    a: np.ndarray, b: np.ndarray, kind: int, out: np.ndarray, need: Callable[..., None]
) -> Step | None:
    """``glu_rows`` serially when the rows are few (a decode token); None otherwise."""
    if not ENABLED or a.size > GLU_SERIAL_MAX:
        return None
    from .plan_kernels import glu_rows_serial

    need(glu_rows_serial)
    return lambda: glu_rows_serial(a, b, kind, out)


def attn_group_step(
    kern: Callable[..., None],
    args: tuple,
    kv: int,
    row: int,
    n_chunks: int,
    need: Callable[..., None],
) -> Step | None:
    """Decode attention by ``attn_decode.attn_group_f16x8`` (``kern``; ``args`` its arguments before the
    chunk count: q, k, v, mask, has_mask, scale, cap, slopes, out, Hkv, D) over only the used part of a
    short cache (``plan_kernels.attn_short_keys``: same bits), all of it otherwise. None: not enabled.

    The short case is one chunk of at most a few hundred keys: it runs on the calling thread alone (the
    kernel's one-iteration ``prange`` then wakes no other thread; the same code, so the same bits). With
    2 threads on a busy 2-core VM a launch that wakes the second thread cost 335 us wall against 57 us on
    one thread for SmolLM2's 20 keys (benchmarks/results/decode_overhead.md)."""
    q, k, v, mask, has_mask, *rest = args
    if not ENABLED or not has_mask or mask.ndim != 2 or mask.shape[1] != kv or not mask.flags.c_contiguous:
        return None
    from .plan_kernels import attn_short_keys

    need(attn_short_keys)
    serial = on_one_thread(kern)
    T = mask.shape[0]

    def step() -> None:
        n = attn_short_keys(mask, has_mask, kv, n_chunks)
        if n >= kv:
            kern(*args, n_chunks)
            return
        m = mask[:, :n] if T == 1 else np.ascontiguousarray(mask[:, :n])
        serial(q, k[: n * row], v[: n * row], m, has_mask, *rest, 1)

    return step
