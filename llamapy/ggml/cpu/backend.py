"""The CPU backend: quantized matmul in Numba, the rest in Numba or vectorized NumPy.

Each node becomes one step closed over its planned arrays (and any scratch it needs), so a reused
graph is a plain walk over steps. Ops without a dedicated path run the NumPy reference. The steps of
mul_mat / mul_mat_id / get_rows are in ``matmul_steps`` and those of flash_attn_ext in
``attention_steps``; both register into this module's compiler table when it is imported.
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
from .layouts import GLU_KIND, UNARY_KIND
from .prefetch_tune import PrefetchTuners

__all__ = ["CPUBackend", "MATVEC_MAX_TOKENS", "matvec_max_rows"]

#: batches up to this many rows use the in-register mat-vec kernels (``matmul_kernels.matvec_kernel``:
#: one row ``MATVEC``; more rows the batch kernels, each weight block decoded once per 4 or 8 rows);
#: larger ones dequantize tiles + BLAS. benchmarks/results/ggml_matvec.txt: at 16 rows the batch kernels
#: take 0.45-0.6x the time of tiles + sgemm on 576x1536 / 1536x576 and ~0.1-0.25x on 49152x576 (Q4_1,
#: Q8_0, Q4_K, Q6_K, one thread); the two meet around 24-32 rows on the small matrices.
MATVEC_MAX_TOKENS = 16
#: types whose kernels stay ahead of tiles + sgemm past ``MATVEC_MAX_TOKENS`` rows: the most rows they
#: take (``matvec_max_rows``). The k-quants multiply 8-bit activations in integers, so dequantizing a
#: tile to floats costs more than it saves up to ~128 rows; the 32-element types multiply floats and
#: meet sgemm near 48. CPU time per call, one thread, 8960x1536 (benchmarks/results/matvec_rows.md):
#: at 64 rows Q4_K 2.0x, Q5_K 1.65x, Q6_K 1.36x, Q2_K/Q3_K ~2x faster than tiles; at 32 rows Q4_0
#: 1.5x, Q8_0 1.75x, IQ4_XS 1.5x; at 512 rows the tiles win (Q4_K 0.97x, Q6_K 0.66x). Q4_K 256: after
#: the spill-free kbatch4 (benchmarks/results/pp_kernels.md) it is 1.31x / 1.18x at 256 rows.
MATVEC_MAX_ROWS = {
    "Q2_K": 128, "Q3_K": 128, "Q4_K": 256, "Q5_K": 128, "Q6_K": 96,
    "Q4_0": 32, "Q4_1": 32, "Q8_0": 32, "IQ4_NL": 32, "IQ4_XS": 32,
}  # fmt: skip


def matvec_max_rows(type_name: str, default: int = MATVEC_MAX_TOKENS) -> int:
    """The most activation rows for which ``mul_mat`` on a weight of this type runs the in-register
    kernels (more rows: dequantized tiles + sgemm). ``default``: the limit of the other types."""
    return max(default, MATVEC_MAX_ROWS.get(type_name, 0))


#: attention over at most this many query rows runs in one Numba kernel, parallel over heads (no BLAS)
ATTN_SMALL_MAX_TOKENS = 4
#: floats in one dequantized weight tile for the large-batch path (each tile is one dequantize and one
#: sgemm launch in the shared thread pool, so big tiles mean few launches)
TILE_FLOATS = 8 << 20

_announced = False


def _announce(kernels: list[Any]) -> None:
    """Say once per process that Numba kernels are being compiled (first run with an empty cache)."""
    global _announced
    if _announced or os.environ.get("LLAMAPY_QUIET"):
        return
    for k in {id(k): k for k in kernels}.values():  # (a graph needs a kernel once per node: ~500 paths)
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

    def __init__(self, n_threads: int | None = None, repack: bool = True) -> None:
        self.n_threads = n_threads
        self.repack = bool(repack)  # the 8-row layouts (``repack``); False: the file's plain rows
        #: the 8-row kernels' prefetch distance per weight type, measured on the first decode tokens
        #: (``prefetch_tune``)
        self.prefetch = PrefetchTuners.from_env()
        self._ref = NumpyBackend()
        self._scratch: dict[str, np.ndarray] = {}
        self._rope_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._needed: list[Any] = []
        self._fused_norms: set[int] = set()
        self._fused_muls: set[int] = set()
        self._fused_adds: dict[int, Tensor] = {}
        self._add_steps: dict[int, Step] = {}
        self._state_writes: dict[int, Tensor] = {}
        self._state_cpys: set[int] = set()
        self._ssm_skip: set[int] = set()
        self._ssm_fused: dict[int, Any] = {}
        self._moe_skip: set[int] = set()
        self._moe_fused: dict[int, Any] = {}
        self._mv_groups: dict[int, Any] = {}  # first node -> its group (``matvec_groups.Group``)
        self._mv_steps: dict[int, Step] = {}  # the later members' steps, built with the first's
        self._mv_absorbed: set[int] = set()  # bias adds a group's steps compute
        self._thread_fns: tuple[Callable[[], int], Callable[[int], None]] | None = None
        self._thread_key: tuple[int | None, int] | None = None  # (n_threads, cap) the last split set
        self._thread_val = 0  # the count that left in force

    def keep_tuning(self, path: str | os.PathLike[str], scope: str, threads: int) -> None:
        """The prefetch tuners' decisions (``prefetch_tune.PrefetchTuners.bind``)."""
        self.prefetch.bind(path, scope, threads)

    def __repr__(self) -> str:
        return f"CPUBackend(n_threads={self.n_threads}{'' if self.repack else ', repack=False'})"

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
        self._fused_adds = {}  # residual add -> the fused norm's mul that computes it (plan_steps)
        self._mv_groups = {}
        self._mv_steps = {}
        self._mv_absorbed = set()
        self._add_steps = {}  # id(mul) -> its fused add + norm step, built when the add compiled
        self._state_writes = ssm_steps.state_writes(graph, nodes)  # recurrent states written in place
        self._state_cpys: set[int] = set()  # their cpy nodes (no step: the op wrote the buffer)
        # recurrent layers' small ops computed by the conv / delta-rule steps (ssm_steps.fusions)
        self._ssm_skip, self._ssm_fused, extra = ssm_steps.fusions(graph, nodes)
        # a softmax-gated MoE layer's router and weighted sum (moe_steps.fusions)
        ssm = self._ssm_skip | set(self._ssm_fused)
        rest = None if nodes is None else [n for n in nodes if id(n) not in ssm]
        self._moe_skip, self._moe_fused, moe_extra = moe_steps.fusions(graph, rest)
        for k, v in moe_extra.items():
            extra.setdefault(k, []).extend(v)
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
        taken = self._ssm_skip | set(self._ssm_fused) | self._moe_skip | set(self._moe_fused)
        self._fused_adds = _residual_adds(graph, self._fused_muls, mine - taken, extra)
        # mat-vecs of shared activations: one call (``matvec_groups``; Q4_0 / Q4_1 only without repacking)
        from . import matvec_groups

        taken |= set(self._fused_adds) | self._fused_muls | self._fused_norms
        self._mv_groups = {id(g.nodes[0]): g for g in matvec_groups.find(graph, nodes, taken)}
        return extra

    def end_graph(self) -> None:
        _announce(self._needed)

    def begin_split(self) -> None:
        """Set this thread's Numba thread count for the split: the full ``set_num_threads`` (its cap
        policy, its process lock: ~20-50 us) only when the count asked, the cap or the count in force
        differs from the last split's, else one read of the count (~1 us)."""
        from ..._numba import _cap, set_num_threads

        key = (self.n_threads, getattr(_cap, "n", 0))
        if self._thread_fns is None:
            from ..._numba import thread_count_fns

            self._thread_fns = thread_count_fns()
        get = self._thread_fns[0]
        if key != self._thread_key or get() != self._thread_val:
            set_num_threads(self.n_threads)
            self._thread_key, self._thread_val = key, get()

    def compile(self, node: Tensor, arrays: ArrayMap) -> Step | None:
        if node.op in VIEW_OPS:
            return None
        if id(node) in self._fused_norms or id(node) in self._state_cpys:
            return None
        if id(node) in self._fused_adds:  # its step is the fused norm's (when the arrays allow it)
            from .plan_steps import add_norm_step

            mul = self._fused_adds[id(node)]
            step = add_norm_step(node, mul, arrays, self.need)
            if step is not None:
                self._add_steps[id(mul)] = step
                return None
        if id(node) in self._ssm_skip or id(node) in self._moe_skip:
            return None
        if id(node) in self._moe_fused:
            return moe_steps.fused_step(self, node, arrays)
        if id(node) in self._ssm_fused:
            return ssm_steps.fused_step(self, node, arrays)
        if id(node) in self._fused_muls:
            fused = self._add_steps.pop(id(node), None)
            if fused is not None:
                return fused
            return _rms_norm(self, node.src[0], arrays, out_node=node, weight=arrays[id(node.src[1])])
        group = self._mv_groups.get(id(node))
        if group is not None:
            from . import matvec_groups

            got = matvec_groups.steps(self, group, arrays)
            if got is not None:
                self._mv_steps.update(got[0])
                self._mv_absorbed |= got[1]
        mv = self._mv_steps.pop(id(node), None)
        if mv is not None:
            return mv
        if id(node) in self._mv_absorbed:  # a bias add that its group's step computed
            return None
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


def _residual_adds(
    graph: Any, fused_muls: set[int], mine: set[int], extra: dict[int, list[Tensor]]
) -> dict[int, Tensor]:
    """The ``add`` nodes that the fused ``rms_norm`` + ``mul`` right after them computes too
    (``plan_steps.add_norm_step``): add, rms_norm, mul adjacent in the graph's order, all three on this
    backend (``mine``: less the nodes other fusions compute), the add of two float32 tensors of its own
    shape. The mul then reads the add's inputs (added to ``extra`` for the planner's liveness); nothing
    runs between, so the add's result is written before any node reads it. Id of the add -> the mul."""
    from . import plan_steps

    out: dict[int, Tensor] = {}
    if not plan_steps.ENABLED:
        return out
    nodes = graph.nodes
    for i in range(2, len(nodes)):
        m, nrm, ad = nodes[i], nodes[i - 1], nodes[i - 2]
        if id(m) not in fused_muls or id(m) not in mine or m.src[0] is not nrm or nrm.src[0] is not ad:
            continue
        if ad.op != "add" or id(ad) not in mine or len(ad.src) != 2 or ad.type != GGMLType.F32:
            continue
        if any(s.shape != ad.shape or s.type != GGMLType.F32 for s in ad.src):
            continue
        out[id(ad)] = m
        extra.setdefault(id(m), []).extend(ad.src)
    return out


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


_UNARY_KIND = UNARY_KIND  # the codes op_kernels.unary_rows reads (layouts.py)


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


@_compiler(*GLU_KIND)
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
    kind = GLU_KIND[node.op]
    if pa is None and pb is None:  # a few rows (decode): one serial call, no parallel launch
        from .plan_steps import glu_step

        fast = glu_step(a2, b2, kind, out, be.need)
        if fast is not None:
            return fast
    _, ok = _kernels()
    kern = ok.glu_rows
    be.need(kern)

    def step() -> None:
        if pa is not None:
            pa()
        if pb is not None:
            pb()
        kern(a2, b2, kind, out)

    return step


# -- rope, softmax --------------------------------------------------------------------------------
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
        T = node.shape[0]  # pos is [4 * T] for multi-section rope with per-section positions
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
    n_dims, neox = p["n_dims"], p["mode"] != 0  # mrope / imrope rotate neox pairs
    first = steps[0] if steps else None

    def step() -> None:
        if first is not None:
            first()
        kern(A, cos, sin, n_dims, neox, out)

    return step


@_compiler("soft_max")
def _soft_max(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    A, out = arrays[id(node.src[0])], arrays[id(node)]
    p = node.params
    sinks = arrays[id(node.src[-1])] if p.get("sinks") else None
    mask = arrays[id(node.src[1])] if len(node.src) > 1 + (sinks is not None) else None
    if sinks is not None:  # [H] -> broadcast over [..., H, T, 1]
        sinks = sinks.reshape((-1,) + (1,) * min(2, node.ndim - 1))
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
        if sinks is not None:
            np.maximum(red, sinks, out=red)
        np.subtract(out, red, out=out)
        np.exp(out, out=out)
        if sinks is not None:  # the sink's own exp(s - max) joins the sum
            np.subtract(sinks, red, out=red)
            np.exp(red, out=red)
            np.add(red, np.sum(out, axis=-1, keepdims=True), out=red)
        else:
            np.sum(out, axis=-1, keepdims=True, out=red)
        np.divide(out, red, out=out)

    return step


@_compiler("swiglu_oai")
def _swiglu_oai(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    """gpt-oss's clamped SwiGLU in float32 NumPy: min(a, limit) * sigmoid(alpha * .) * (clamp(b) + 1)."""
    A, B, out = arrays[id(node.src[0])], arrays[id(node.src[1])], arrays[id(node)]
    alpha, limit = np.float32(node.params["alpha"]), np.float32(node.params["limit"])
    tmp = be.scratch("swiglu_oai", node.shape)

    def step() -> None:
        np.minimum(A, limit, out=out)  # x
        np.multiply(out, -alpha, out=tmp)
        np.exp(tmp, out=tmp)
        np.add(tmp, np.float32(1.0), out=tmp)
        np.divide(out, tmp, out=out)  # x * sigmoid(alpha x)
        np.clip(B, -limit, limit, out=tmp)
        np.add(tmp, np.float32(1.0), out=tmp)
        np.multiply(out, tmp, out=out)

    return step


@_compiler("add_id")
def _add_id(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    """Per-expert biases: out[t, u] = a[t, u] + b[ids[t, u]] (ids checked as mul_mat_id does)."""
    A, B, ids, out = (arrays[id(s)] for s in (*node.src, node))
    if B.dtype != np.float32:
        return None
    E, nm = B.shape[0], node.name

    def step() -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= E):
            bad = ids[(ids < 0) | (ids >= E)][0]
            raise ComputeError(f"add_id {nm!r}: expert id {int(bad)} not in 0..{E - 1}")
        np.add(A, B[ids], out=out)

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
    if t in (GGMLType.F16, GGMLType.F32):  # K/V cache rows: one kernel call (check and convert)
        from .plan_steps import set_rows_step

        fast = set_rows_step(out, S, idx, n, nm, be.need)
        if fast is not None:
            return fast

    def step() -> None:
        i = check(idx, n)
        if i >= 0:
            raise ComputeError(f"set_rows {nm!r}: row index {int(idx[i])} (at {i}) not in 0..{n - 1}")
        out[idx] = S if TRAITS[t].dtype is not None and t != GGMLType.BF16 else from_f32(S, t)

    return step


assert set(_COMPILERS) <= set(REF_OPS) | {"cpy", "set_rows"}


# the compilers of the other op families register themselves on import (they use the helpers above)
from . import attention_steps, matmul_steps, moe_steps, ssm_steps  # noqa: E402, F401
