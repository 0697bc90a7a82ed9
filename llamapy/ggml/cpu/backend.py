"""The CPU backend: quantized matmul in Numba, the rest in Numba or vectorized NumPy.

Each node becomes one step closed over its planned arrays (and any scratch it needs), so a reused
graph is a plain walk over steps. Ops without a dedicated path run the NumPy reference.
Numba is imported when the first graph is compiled, not when this module is imported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend import ArrayMap, Backend, ComputeError, Step
from ..numpy_backend import REF_OPS, NumpyBackend, from_f32
from ..ops import alibi_slopes
from ..tensor import VIEW_OPS, Tensor
from ..types import TRAITS, GGMLType

__all__ = ["CPUBackend", "MATVEC_MAX_TOKENS"]

#: batches up to this many rows use the in-register mat-vec kernels; larger ones dequantize tiles + BLAS
MATVEC_MAX_TOKENS = 8
#: attention over at most this many query rows runs in one serial Numba kernel (no BLAS, no threads)
ATTN_SMALL_MAX_TOKENS = 4
#: floats in one dequantized weight tile for the large-batch path (big tiles: few switches between
#: Numba's and BLAS's thread pools, which fight over 2 cores when they alternate quickly)
TILE_FLOATS = 8 << 20

_announced = False


def _announce(kernels: list[Any]) -> None:
    """Say once per process that Numba kernels are being compiled (first run with an empty cache)."""
    global _announced
    if _announced or os.environ.get("LLAMAPY_QUIET"):
        return
    for k in kernels:
        try:
            cold = not os.path.exists(k._cache._cache_file._index_path)
        except AttributeError:  # pragma: no cover - numba internals moved
            return
        if cold:
            _announced = True
            print("llamapy: compiling CPU kernels (first run only; they are cached)...", file=sys.stderr)
            return


def _kernels() -> tuple[Any, Any]:
    from . import matmul_kernels, op_kernels

    return matmul_kernels, op_kernels


def _threads(be: CPUBackend) -> int:
    from ..._numba import max_threads

    return be.n_threads if be.n_threads and be.n_threads > 0 else max_threads()


def _as2d(arr: np.ndarray) -> np.ndarray | None:
    """Drop leading size-1 axes without copying (None if that is not possible)."""
    while arr.ndim > 2:
        if arr.shape[0] != 1:
            return None
        arr = arr[0]
    return arr


def _rows(arr: np.ndarray) -> np.ndarray | None:
    """A C-contiguous array as [rows, last] (a view), else None."""
    if not arr.flags.c_contiguous:
        return None
    return arr.reshape(-1, arr.shape[-1]) if arr.ndim != 2 else arr


class CPUBackend(Backend):
    """Numba kernels with ``prange`` over rows; ``n_threads`` threads (None: all cores)."""

    name = "cpu"

    def __init__(self, n_threads: int | None = None) -> None:
        self.n_threads = n_threads
        self._ref = NumpyBackend()
        self._scratch: dict[str, np.ndarray] = {}
        self._rope_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._needed: list[Any] = []
        self._fused_norms: set[int] = set()
        self._fused_muls: set[int] = set()

    def __repr__(self) -> str:
        return f"CPUBackend(n_threads={self.n_threads})"

    # -- backend interface -----------------------------------------------------------------------
    def supports_op(self, node: Tensor) -> bool:
        return node.op in _COMPILERS or node.op in VIEW_OPS or self._ref.supports_op(node)

    def begin_graph(self, graph: Any = None, nodes: list[Tensor] | None = None) -> dict[int, list[Tensor]]:
        """Reset per-graph state and find fusions among ``nodes`` (the nodes this backend will run);
        returns the extra inputs each fused node reads (for the planner's liveness)."""
        self._rope_cache = {}
        self._needed = []
        self._fused_norms: set[int] = set()  # rms_norm nodes computed by their consumer mul
        self._fused_muls: set[int] = set()
        extra: dict[int, list[Tensor]] = {}
        if graph is None or nodes is None:
            return extra
        mine = {id(n) for n in nodes}
        uses: dict[int, int] = {}
        for n in graph.nodes:
            for s in n.src:
                uses[id(s)] = uses.get(id(s), 0) + 1
        for n in nodes:
            if n.op != "mul" or len(n.src) != 2:
                continue
            nrm, w = n.src
            if (
                nrm.op == "rms_norm"
                and id(nrm) in mine
                and uses.get(id(nrm), 0) == 1
                and not graph.is_output(nrm)
                and w.type == GGMLType.F32
                and w.shape == (n.shape[-1],)
                and nrm.src[0].type == GGMLType.F32
            ):
                self._fused_norms.add(id(nrm))
                self._fused_muls.add(id(n))
                extra[id(n)] = [nrm.src[0]]
        return extra

    def end_graph(self) -> None:
        _announce(self._needed)

    def begin_split(self) -> None:
        from ..._numba import set_num_threads

        set_num_threads(self.n_threads)

    def compile(self, node: Tensor, arrays: ArrayMap) -> Step | None:
        if node.op in VIEW_OPS:
            return None
        if id(node) in self._fused_norms:
            return None
        if id(node) in self._fused_muls:
            return _rms_norm(self, node.src[0], arrays, out_node=node, weight=arrays[id(node.src[1])])
        fn = _COMPILERS.get(node.op)
        step = fn(self, node, arrays) if fn is not None else None
        return step if step is not None else self._ref.compile(node, arrays)

    # -- helpers -----------------------------------------------------------------------------------
    def scratch(self, key: str, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A reused buffer shared by the steps of this backend (they run one at a time): a step may
        use it only between its own start and end. Growing it leaves earlier views valid."""
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        buf = self._scratch.get(key)
        if buf is None or buf.nbytes < n:
            buf = np.empty(max(n, 64), dtype=np.uint8)
            self._scratch[key] = buf
        return buf[:n].view(dtype).reshape(shape)

    def need(self, *kernels: Any) -> None:
        self._needed.extend(kernels)


Compiler = Callable[[CPUBackend, Tensor, ArrayMap], "Step | None"]
_COMPILERS: dict[str, Compiler] = {}


def _compiler(*names: str) -> Callable[[Compiler], Compiler]:
    def deco(fn: Compiler) -> Compiler:
        for n in names:
            _COMPILERS[n] = fn
        return fn

    return deco


def _f32_rows(be: CPUBackend, arr: np.ndarray, key: str) -> tuple[np.ndarray, Step | None]:
    """``arr`` as C-contiguous float32 [rows, last]: a view when possible, else a scratch + copy step."""
    if arr.dtype == np.float32:
        r = _rows(arr)
        if r is not None:
            return r, None
    buf = be.scratch(key, (int(np.prod(arr.shape[:-1], dtype=np.int64)), arr.shape[-1]))
    view = buf.reshape(arr.shape)

    def copy() -> None:
        np.copyto(view, arr, casting="unsafe")

    return buf, copy


# -- matmul ---------------------------------------------------------------------------------------
@_compiler("mul_mat")
def _mul_mat(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    a, b = node.src
    A = _as2d(arrays[id(a)])
    if A is None or a.ndim < 2:
        return None  # batched over heads: NumPy reference (broadcast matmul)
    B, out = arrays[id(b)], arrays[id(node)]
    N, K = a.shape[-2], a.shape[-1]
    x, pre = _f32_rows(be, B, "mm_x")
    M = x.shape[0]
    out2 = out.reshape(M, N)
    mk, _ = _kernels()
    name = a.type.name
    from .blas import gemm_nt

    threads = _threads(be)
    if a.type == GGMLType.F32:

        def step_f32() -> None:
            if pre is not None:
                pre()
            gemm_nt(x, A, out2, threads)

        return step_f32
    if name in mk.MATVEC and M <= MATVEC_MAX_TOKENS and A.flags.c_contiguous:
        kern = mk.MATVEC[name]
        be.need(kern)
        f16 = mk.F16_TABLE
        if pre is None:
            return lambda: kern(A, x, out2, f16)

        def step_mv() -> None:
            pre()
            kern(A, x, out2, f16)

        return step_mv
    # large batch (or another type): dequantize a tile of rows into scratch, then BLAS sgemm
    tile = max(16, min(N, TILE_FLOATS // max(K, 1)))
    W = be.scratch("mm_tile", (tile, K))
    convert = _row_converter(be, a.type, A)

    def step_tiles() -> None:
        if pre is not None:
            pre()
        for r0 in range(0, N, tile):
            n = min(tile, N - r0)
            convert(r0, r0 + n, W[:n])
            gemm_nt(x, W[:n], out2[:, r0 : r0 + n], threads)

    return step_tiles


@_compiler("mul_mat_id")
def _mul_mat_id(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    """Experts: group the (token, slot) pairs by expert and run each expert's rows as one mul_mat."""
    a, b, idt = node.src
    A, B, ids, out = arrays[id(a)], arrays[id(b)], arrays[id(idt)], arrays[id(node)]
    E, N, K = a.shape
    mk, _ = _kernels()
    name = a.type.name
    kern = mk.MATVEC.get(name) if A.flags.c_contiguous else None
    if kern is not None:
        be.need(kern)
    f16 = mk.F16_TABLE
    nm = node.name or a.name
    from .blas import gemm_nt

    threads = _threads(be)

    def step() -> None:
        T_, U = ids.shape
        flat = ids.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= E):
            bad = flat[(flat < 0) | (flat >= E)][0]
            raise ComputeError(f"mul_mat_id {nm!r}: expert id {int(bad)} not in 0..{E - 1}")
        order = np.argsort(flat, kind="stable")
        experts, starts = np.unique(flat[order], return_index=True)
        ends = list(starts[1:]) + [flat.size]
        for e, s0, s1 in zip(experts, starts, ends, strict=True):
            sel = order[s0:s1]
            t_idx, u_idx = sel // U, sel % U
            x = np.ascontiguousarray(B[t_idx, u_idx if B.shape[1] > 1 else 0], dtype=np.float32)
            y = np.empty((x.shape[0], N), np.float32)
            if kern is not None and x.shape[0] <= MATVEC_MAX_TOKENS:
                kern(A[e], x, y, f16)
            else:
                gemm_nt(x, np.ascontiguousarray(_expert_f32(a.type, A[e])), y, threads)
            out[t_idx, u_idx] = y

    return step


def _expert_f32(t: GGMLType, raw: np.ndarray) -> np.ndarray:
    from ..numpy_backend import to_f32

    return to_f32(raw, t)


def _row_converter(be: CPUBackend, t: GGMLType, A: np.ndarray) -> Callable[[int, int, np.ndarray], None]:
    """f(r0, r1, dst): rows r0..r1 of the weight ``A`` as float32 into ``dst``."""
    if TRAITS[t].block_size == 1:
        if t == GGMLType.BF16:
            return lambda r0, r1, dst: np.copyto(dst, (A[r0:r1].astype(np.uint32) << 16).view(np.float32))
        return lambda r0, r1, dst: np.copyto(dst, A[r0:r1], casting="unsafe")
    from ..quants import dequantize_rows_into

    return lambda r0, r1, dst: dequantize_rows_into(np.ascontiguousarray(A[r0:r1]), t, dst)


@_compiler("get_rows")
def _get_rows(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    a, idt = node.src
    A, ids, out = arrays[id(a)], arrays[id(idt)], arrays[id(node)]
    n = a.shape[0]
    mk, ok = _kernels()
    check = ok.check_ids
    be.need(check)
    nm = node.name or a.name

    def bad(i: int) -> ComputeError:
        return ComputeError(f"get_rows {nm!r}: row id {int(ids[i])} (at {i}) not in 0..{n - 1}")

    if TRAITS[a.type].quantized:
        from ..quants import dequantize_rows_into

        def step_q() -> None:
            i = check(ids, n)
            if i >= 0:
                raise bad(i)
            dequantize_rows_into(A[ids], a.type, out)

        return step_q
    if TRAITS[a.type].block_size == 1 and a.type != GGMLType.BF16:

        def step_f() -> None:
            i = check(ids, n)
            if i >= 0:
                raise bad(i)
            np.copyto(out, A[ids], casting="unsafe")

        return step_f
    return None


# -- element-wise ---------------------------------------------------------------------------------
_UFUNC = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


@_compiler("add", "sub", "mul", "div")
def _binary(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    a, b = node.src
    pb = (1,) * (a.ndim - b.ndim) + b.shape
    if any(y != 1 and y != x for x, y in zip(a.shape, pb, strict=True)):
        return None  # tiled repeat: reference
    A, B, out = arrays[id(a)], arrays[id(b)], arrays[id(node)]
    uf = _UFUNC[node.op]
    return lambda: uf(A, B, out=out)


@_compiler("scale")
def _scale(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    A, out = arrays[id(node.src[0])], arrays[id(node)]
    s, bias = np.float32(node.params["s"]), np.float32(node.params["bias"])
    if bias == 0:
        return lambda: np.multiply(A, s, out=out)

    def step() -> None:
        np.multiply(A, s, out=out)
        np.add(out, bias, out=out)

    return step


@_compiler("rms_norm")
def _rms_norm(
    be: CPUBackend,
    node: Tensor,
    arrays: ArrayMap,
    out_node: Tensor | None = None,
    weight: np.ndarray | None = None,
) -> Step | None:
    """rms_norm, or (``out_node`` = its consumer ``mul``) the fused ``rms_norm(x) * weight``."""
    x, pre = _f32_rows(be, arrays[id(node.src[0])], "norm_x")
    out = _rows(arrays[id(out_node if out_node is not None else node)])
    _, ok = _kernels()
    eps = float(node.params["eps"])
    if weight is not None:
        kw = ok.rms_norm_mul_rows
        be.need(kw)

        def step_fused() -> None:
            if pre is not None:
                pre()
            kw(x, eps, weight, out)

        return step_fused
    kern = ok.rms_norm_rows
    be.need(kern)

    def step() -> None:
        if pre is not None:
            pre()
        kern(x, eps, out)

    return step


_UNARY_KIND = {"silu": 0, "gelu": 1, "gelu_quick": 2, "tanh": 3, "relu": 4, "softcap": 5}


@_compiler(*_UNARY_KIND)
def _unary(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    x, pre = _f32_rows(be, arrays[id(node.src[0])], "unary_x")
    out = _rows(arrays[id(node)])
    _, ok = _kernels()
    kern = ok.unary_rows
    be.need(kern)
    kind = _UNARY_KIND[node.op]
    p = np.float32(node.params.get("cap", 0.0))

    def step() -> None:
        if pre is not None:
            pre()
        kern(x, kind, p, out)

    return step


@_compiler("swiglu", "geglu")
def _glu(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    A, B = arrays[id(node.src[0])], arrays[id(node.src[1])]
    if (
        A.ndim != 2
        or A.dtype != np.float32
        or B.dtype != np.float32
        or A.strides[1] != 4
        or B.strides[1] != 4
    ):
        a2, pa = _f32_rows(be, A, "glu_a")
        b2, pb = _f32_rows(be, B, "glu_b")
    else:
        a2, pa, b2, pb = A, None, B, None
    out = _rows(arrays[id(node)])
    _, ok = _kernels()
    kern = ok.glu_rows
    be.need(kern)
    kind = 0 if node.op == "swiglu" else 1

    def step() -> None:
        if pa is not None:
            pa()
        if pb is not None:
            pb()
        kern(a2, b2, kind, out)

    return step


# -- rope, softmax, attention ----------------------------------------------------------------------
@_compiler("rope")
def _rope(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    from ..numpy_backend import rope_cache

    A, pos, out = arrays[id(node.src[0])], arrays[id(node.src[1])], arrays[id(node)]
    if A.dtype != np.float32:
        return None
    ff = arrays[id(node.src[2])] if len(node.src) > 2 else None
    p = node.params
    key = (id(node.src[1]), id(node.src[2]) if ff is not None else None, tuple(sorted(p.items())))
    steps: list[Step] = []
    if key not in be._rope_cache:
        T = pos.shape[0]
        cos = np.empty((T, p["n_dims"] // 2), np.float32)
        sin = np.empty_like(cos)
        be._rope_cache[key] = (cos, sin)

        def make_cache() -> None:
            c, s = rope_cache(p, pos, ff)
            np.copyto(cos, c, casting="unsafe")
            np.copyto(sin, s, casting="unsafe")

        steps.append(make_cache)
    cos, sin = be._rope_cache[key]
    _, ok = _kernels()
    kern = ok.rope_rows
    be.need(kern)
    n_dims, neox = p["n_dims"], p["mode"] == 2
    first = steps[0] if steps else None

    def step() -> None:
        if first is not None:
            first()
        kern(A, cos, sin, n_dims, neox, out)

    return step


@_compiler("soft_max")
def _soft_max(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    A, out = arrays[id(node.src[0])], arrays[id(node)]
    mask = arrays[id(node.src[1])] if len(node.src) > 1 else None
    p = node.params
    scale = np.float32(p["scale"])
    if mask is not None and p["max_bias"] > 0:
        n_head = node.shape[-3] if node.ndim >= 3 else 1
        slopes = alibi_slopes(n_head, p["max_bias"])
        slopes = slopes.reshape((n_head, 1, 1)) if node.ndim >= 3 else slopes[0]
        mbuf = np.empty(np.broadcast_shapes(np.shape(slopes), mask.shape), np.float32)
    else:
        slopes = mbuf = None
    red = np.empty(node.shape[:-1] + (1,), np.float32)

    def step() -> None:
        np.multiply(A, scale, out=out)
        if mask is not None:
            if mbuf is not None:
                np.multiply(mask, slopes, out=mbuf)
                np.add(out, mbuf, out=out)
            else:
                np.add(out, mask, out=out)
        np.max(out, axis=-1, keepdims=True, out=red)
        np.subtract(out, red, out=out)
        np.exp(out, out=out)
        np.sum(out, axis=-1, keepdims=True, out=red)
        np.divide(out, red, out=out)

    return step


def _kv_converter(be: CPUBackend, t: Tensor, arr: np.ndarray, key: str) -> tuple[np.ndarray, Step | None]:
    """K or V ``[KV, Hkv, D]`` of any cache type as float32 (view for F32, else scratch + step)."""
    if t.type == GGMLType.F32:
        return arr, None
    KV, H, D = t.shape
    buf = be.scratch(key, (KV * H, D))
    if t.type == GGMLType.F16:
        v3 = buf.reshape(KV, H, D)
        return v3, lambda: np.copyto(v3, arr, casting="unsafe")
    from ..quants import dequantize_rows_into

    rows = arr.reshape(KV * H, arr.shape[-1]) if arr.flags.c_contiguous else None
    kv_type = t.type

    def conv() -> None:
        src = rows if rows is not None else np.ascontiguousarray(arr).reshape(KV * H, -1)
        dequantize_rows_into(src, kv_type, buf)

    return buf.reshape(KV, H, D), conv


@_compiler("flash_attn_ext")
def _flash_attn(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    q, k, v = node.src[:3]
    Q, out = arrays[id(q)], arrays[id(node)]
    mask = arrays[id(node.src[3])] if len(node.src) > 3 else None
    T, H, D = q.shape
    KV, Hkv, _ = k.shape
    Dv = v.shape[2]
    g = H // Hkv
    p = node.params
    scale, cap = np.float32(p["scale"]), np.float32(p["logit_softcap"])
    small = (
        T <= ATTN_SMALL_MAX_TOKENS and Q.dtype == np.float32 and (mask is None or mask.dtype == np.float32)
    )
    if small and k.type == GGMLType.F16 and v.type == GGMLType.F16:
        # decode over an F16 cache: read the half bits in place, only the unmasked keys (no conversion step)
        mk, ok = _kernels()
        kern16 = ok.attn_small_f16
        be.need(kern16)
        K16, V16 = arrays[id(k)].view(np.uint16), arrays[id(v)].view(np.uint16)
        has_mask = mask is not None
        mk16 = mask if has_mask else np.zeros((1, 1), np.float32)
        sl16 = alibi_slopes(H, p["max_bias"])
        return lambda: kern16(Q, K16, V16, mk16, has_mask, scale, cap, sl16, out)
    Kf, kconv = _kv_converter(be, k, arrays[id(k)], "fa_k")
    Vf, vconv = _kv_converter(be, v, arrays[id(v)], "fa_v")
    slopes = alibi_slopes(H, p["max_bias"]).reshape(Hkv, g, 1, 1) if p["max_bias"] > 0 else None
    if small:
        _, ok = _kernels()
        kern = ok.attn_small
        be.need(kern)
        has_mask = mask is not None
        mk_ = mask if has_mask else np.zeros((1, 1), np.float32)
        sl = alibi_slopes(H, p["max_bias"])

        def step_small() -> None:
            if kconv is not None:
                kconv()
            if vconv is not None:
                vconv()
            kern(Q, Kf, Vf, mk_, has_mask, scale, cap, sl, out)

        return step_small
    from . import blas

    if blas.attention_supported(Q, Kf, Vf, out) and (
        mask is None or (mask.dtype == np.float32 and mask.shape == (T, KV))
    ):
        nth = _threads(be)
        scores = be.scratch("fa_scores", (nth, blas.ATTN_CHUNK, KV))
        sl_all = alibi_slopes(H, p["max_bias"])

        def step_blas() -> None:
            if kconv is not None:
                kconv()
            if vconv is not None:
                vconv()
            blas.attention(Q, Kf, Vf, mask, scale, cap, sl_all, scores, out)

        return step_blas
    # scratch shared by all attention nodes (they run one at a time): scores are [Hkv, g*T, KV]
    qh = be.scratch("fa_q", (Hkv, g, T, D))
    S = be.scratch("fa_s", (Hkv, g * T, KV))
    S4 = S.reshape(Hkv, g, T, KV)
    red = be.scratch("fa_red", (Hkv, g * T, 1))
    O = be.scratch("fa_o", (Hkv, g * T, Dv))
    out4 = out.reshape(T, Hkv, g, Dv)
    Q4 = Q.reshape(T, Hkv, g, D) if Q.flags.c_contiguous else None

    def step() -> None:
        if kconv is not None:
            kconv()
        if vconv is not None:
            vconv()
        np.copyto(
            qh, (Q4 if Q4 is not None else Q.reshape(T, Hkv, g, D)).transpose(1, 2, 0, 3), casting="unsafe"
        )
        np.matmul(qh.reshape(Hkv, g * T, D), Kf.transpose(1, 2, 0), out=S)
        if cap:
            np.multiply(S, scale / cap, out=S)
            np.tanh(S, out=S)
            np.multiply(S, cap, out=S)
        else:
            np.multiply(S, scale, out=S)
        if mask is not None:
            if slopes is not None:
                np.add(S4, slopes * mask, out=S4)
            else:
                np.add(S4, mask, out=S4)
        np.max(S, axis=-1, keepdims=True, out=red)
        red[~np.isfinite(red)] = 0.0
        np.subtract(S, red, out=S)
        np.exp(S, out=S)
        np.sum(S, axis=-1, keepdims=True, out=red)
        red[red == 0] = 1.0
        np.divide(S, red, out=S)
        np.matmul(S, Vf.transpose(1, 0, 2), out=O)
        np.copyto(out4, O.reshape(Hkv, g, T, Dv).transpose(2, 0, 1, 3))

    return step


# -- copies ---------------------------------------------------------------------------------------
@_compiler("cont")
def _cont(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    A, out = arrays[id(node.src[0])], arrays[id(node)]
    return lambda: np.copyto(out, A)


@_compiler("cpy")
def _cpy(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    a = node.src[0]
    A, out = arrays[id(a)], arrays[id(node)]
    if a.quantized or node.quantized or a.type == GGMLType.BF16 or node.type == GGMLType.BF16:
        return None
    if A.shape == out.shape:
        return lambda: np.copyto(out, A, casting="unsafe")
    return lambda: np.copyto(out, A.reshape(out.shape), casting="unsafe")


@_compiler("set_rows")
def _set_rows(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    dst, src, idt = node.src
    out, S, idx = arrays[id(node)], arrays[id(src)], arrays[id(idt)]
    n = dst.shape[0]
    _, ok = _kernels()
    check = ok.check_ids
    be.need(check)
    t = node.type
    nm = node.name

    def step() -> None:
        i = check(idx, n)
        if i >= 0:
            raise ComputeError(f"set_rows {nm!r}: row index {int(idx[i])} (at {i}) not in 0..{n - 1}")
        out[idx] = S if TRAITS[t].dtype is not None and t != GGMLType.BF16 else from_f32(S, t)

    return step


assert set(_COMPILERS) <= set(REF_OPS) | {"cpy", "set_rows"}
