"""CPU backend steps for weights: ``mul_mat`` (in-register mat-vec kernels for a few rows,
dequantized tiles + sgemm in the shared thread pool for many), ``mul_mat_id`` (experts) and
``get_rows``. Registered into ``backend``'s compiler table on import."""

from __future__ import annotations

import functools
import glob
from collections.abc import Callable, MutableMapping
from typing import Any

import numpy as np

from ..backend import ArrayMap, ComputeError, Step
from ..tensor import Tensor
from ..types import TRAITS, GGMLType
from .backend import (
    MATVEC_MAX_TOKENS,
    TILE_FLOATS,
    CPUBackend,
    _as2d,
    _compiler,
    _f32_rows,
    _kernels,
    _threads,
    matvec_max_rows,
)
from .repack import LAYOUTS as X8_LAYOUTS

# -- weight prefetch: into L1 or L2 -------------------------------------------------------------------
#: the one-row kernels that prefetch the rows ahead into L1 (``prefetcht0``) instead of L2 (``prefetcht1``)
MATVEC_L1_NAMES = {
    "Q4_0": "q40_r8_kernels:mm_q4_0_r8_l1", "Q4_1": "q40_r8_kernels:mm_q4_1_r8_l1",
    "Q5_0": "q16_kernels:mm16_q5_0_l1", "Q5_1": "q16_kernels:mm16_q5_1_l1",
    "Q8_0": "q16_kernels:mm16_q8_0_l1", "Q2_K": "kquant_lo_kernels:mm_q2_k_l1",
    "Q3_K": "kquant_lo_kernels:mm_q3_k_l1", "Q4_K": "kquant_kernels:mm_q4_k_l1",
    "Q5_K": "kquant_kernels:mm_q5_k_l1", "Q6_K": "kquant_kernels:mm_q6_k_l1",
    "IQ4_NL": "iq4_kernels:mm_iq4_nl_l1", "IQ4_XS": "iq4_kernels:mm_iq4_xs_l1",
    "F16": "f16_kernels:mm_f16_l1", "BF16": "f16_kernels:mm_bf16_l1",
}  # fmt: skip
_MATVEC_L1: MutableMapping[str, Any] | None = None

#: a weight whose whole buffer (the mapped model file it is a view of) has from ``L1_PREFETCH_MIN_BYTES`` to
#: ``L1_PREFETCH_MAX_BYTES`` bytes runs the ``*_l1`` kernels (None: ``L1_PREFETCH_L3_TIMES`` times the L3
#: size, 256 MiB on a 32 MiB L3). Into L1 is faster when many lines come from L3, into L2 when they come
#: from DRAM (``simd.PREFETCH_LOCALITY``). Measured (``benchmarks/prefetch_ab.py``,
#: ``benchmarks/matvec_dram.py --l1``; benchmarks/results/prefetch_locality.md): SmolLM2-135M (98 MB) 7-10 %
#: faster with t0 on a quiet machine; from DRAM the k-quant kernels read 12.7 vs 11.0 GB per CPU-second
#: (Q4_K) and 15.8 vs 10.0 (Q6_K) with t1, the 32-element types equal. Below the minimum (test-sized
#: models, a fraction of a millisecond per token) the L2 kernels run: one compiled variant, not two.
L1_PREFETCH_MAX_BYTES: int | None = None
L1_PREFETCH_MIN_BYTES = 16 << 20
L1_PREFETCH_L3_TIMES = 8
_L3_DEFAULT = 32 << 20

#: a float32 weight of at most ``F32_SERIAL_MAX`` elements times at most ``F32_SERIAL_ROWS`` activation rows
#: runs on the calling thread alone (the same sgemm as at one thread): Qwen3-MoE's router (128x2048, 1 MB),
#: 1 row: 0.02 CPU ms on one thread against 0.18 CPU ms / 0.22 ms wall split over two on the busy 2-core VM
F32_SERIAL_MAX = 1 << 19
F32_SERIAL_ROWS = 4


@functools.cache
def _l3_bytes() -> int:
    """The size of the last-level cache (Linux sysfs; 32 MiB where it cannot be read)."""

    best = 0
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(f"{d}/level") as f:
                level = int(f.read())
            with open(f"{d}/size") as f:
                text = f.read().strip().upper()
        except (OSError, ValueError):
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            size = int(text.rstrip("KMG")) * mult
        except ValueError:
            continue
        if level >= 3 and size > best:
            best = size
    return best or _L3_DEFAULT


def _buffer_bytes(arr: np.ndarray) -> int:
    """The bytes of the buffer ``arr`` is a view of (a weight: its mapped model file)."""
    b: Any = arr
    while getattr(b, "base", None) is not None:
        b = b.base
    try:
        return memoryview(b).nbytes
    except TypeError:
        return arr.nbytes


def prefetch_into_l1(A: np.ndarray) -> bool:
    """Whether the one-row kernel of the weight ``A`` should prefetch into L1 (its model is small)."""
    limit = L1_PREFETCH_MAX_BYTES
    if limit is None:
        limit = L1_PREFETCH_L3_TIMES * _l3_bytes()
    return L1_PREFETCH_MIN_BYTES <= _buffer_bytes(A) <= limit


def matvec_l1(name: str):  # type: ignore[no-untyped-def]
    """The one-row kernel of type ``name`` that prefetches into L1 (None: the type has none)."""
    global _MATVEC_L1
    if _MATVEC_L1 is None:
        mk, _ = _kernels()
        _MATVEC_L1 = mk.KernelTable(MATVEC_L1_NAMES)
    return _MATVEC_L1.get(name)


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
        from . import moe_router_kernels as mr

        if M <= F32_SERIAL_ROWS and A.size <= F32_SERIAL_MAX and mr.usable(A, x, out2):
            be.need(mr.mv_f32_small)  # serial mat-vec, any thread count (an MoE router, 128x2048)

            def step_f32_serial() -> None:
                if pre is not None:
                    pre()
                mr.mv_f32_small(A, x, out2)

            return step_f32_serial
        if M <= F32_SERIAL_ROWS and A.size <= F32_SERIAL_MAX and threads > 1:
            # a small float matrix (an MoE router, 128x2048) for a few rows: one sgemm on this thread, as
            # with -t 1 (same bits); a parallel launch costs more than the product on a busy machine
            from ..._numba import on_one_thread

            gemm_serial = on_one_thread(gemm_nt)

            def step_f32_serial() -> None:
                if pre is not None:
                    pre()
                gemm_serial(x, A, out2, 1)

            return step_f32_serial

        def step_f32() -> None:
            if pre is not None:
                pre()
            gemm_nt(x, A, out2, threads)

        return step_f32
    # Q4_K, Q5_K, Q4_0... repacked 8 rows at a time where they can be (repack), unless the backend is told not to
    if be.repack and a.type in X8_LAYOUTS:
        from .repack import mul_mat_step as x8_mul_mat_step

        step_x8 = x8_mul_mat_step(be, a, A, x, out2, pre)
        if step_x8 is not None:
            return step_x8
    if name in mk.MATVEC and M <= matvec_max_rows(name, MATVEC_MAX_TOKENS) and A.flags.c_contiguous:
        kern = mk.matvec_kernel(name, M)
        if M == 1 and prefetch_into_l1(A):
            kern = matvec_l1(name) or kern
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


#: ``mul_mat_id`` of the k-quants runs ``moe_kernels`` (every active expert in one call); False: the
#: per-expert loop below for every type (A/B benchmarks: ``benchmarks/results/moe_cputime.md``)
MOE_FUSED = True
#: batches of at most this many tokens run the fused kernel (which decodes the weight again per pair, as
#: the one-row kernels, and quantizes every activation row); more (prompts): the per-expert loop, whose
#: batch kernels decode each block once per 4-8 rows. pp64, Qwen3-30B-A3B shape, CPU s: loop 0.67, fused
#: for all 0.75, fused for experts of 1-2 pairs + loop 0.80 (benchmarks/results/moe_cputime.md)
MOE_FUSED_MAX_TOKENS = 4


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
        be.need(kern, *(d[name] for d in (mk.MATVEC_BATCH, mk.MATVEC_BATCH8) if name in d))
    f16 = mk.F16_TABLE
    nm = node.name or a.name
    from .blas import gemm_nt

    threads = _threads(be)
    max_rows = matvec_max_rows(name, MATVEC_MAX_TOKENS)

    def bad_id(e: int) -> ComputeError:
        return ComputeError(f"mul_mat_id {nm!r}: expert id {int(e)} not in 0..{E - 1}")

    def expert(e: int, sel: np.ndarray) -> None:
        """Expert ``e``'s pairs ``sel`` (flat t * U + u): a mat-vec kernel for up to ``max_rows`` of them
        (2+ rows: the batch kernels, each weight block decoded once per 4 or 8 rows), else the expert
        dequantized + sgemm."""
        U = ids.shape[1]
        t_idx, u_idx = sel // U, sel % U
        x = np.ascontiguousarray(B[t_idx, u_idx if B.shape[1] > 1 else 0], dtype=np.float32)
        y = np.empty((x.shape[0], N), np.float32)
        if kern is not None and sel.size <= max_rows:
            mk.matvec_kernel(name, x.shape[0])(A[e], x, y, f16)
        else:
            gemm_nt(x, np.ascontiguousarray(_expert_f32(a.type, A[e])), y, threads)
        out[t_idx, u_idx] = y

    def step() -> None:
        T_, U = ids.shape
        flat = ids.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= E):
            raise bad_id(flat[(flat < 0) | (flat >= E)][0])
        order = np.argsort(flat, kind="stable")
        experts, starts = np.unique(flat[order], return_index=True)
        ends = list(starts[1:]) + [flat.size]
        for e, s0, s1 in zip(experts, starts, ends, strict=True):
            expert(int(e), order[s0:s1])

    if MOE_FUSED and a.type == GGMLType.F32 and out.flags.c_contiguous:
        # float experts (the router's one-hot gather of the chosen experts' probabilities): one batched
        # matmul over the pairs for a few tokens instead of a copy + sgemm launch per expert
        from . import moe_router_kernels as mr

        if B.ndim == 3 and mr.usable_id(A, B, out.reshape(-1, N)):  # small experts: one Numba call
            be.need(mr.mm_id_f32_small)
            out_p = out.reshape(-1, N)

            def step_f32_small() -> None:
                if ids.shape[0] > MOE_FUSED_MAX_TOKENS:
                    return step()
                bad = mr.mm_id_f32_small(A, B, ids, out_p)
                if bad >= 0:
                    raise bad_id(ids.reshape(-1)[bad])

            return step_f32_small
        out3 = out.reshape(-1, N, 1)

        def step_f32() -> None:
            if ids.shape[0] > MOE_FUSED_MAX_TOKENS:
                return step()
            flat = ids.reshape(-1)
            if flat.size and (flat.min() < 0 or flat.max() >= E):
                raise bad_id(flat[(flat < 0) | (flat >= E)][0])
            x = np.broadcast_to(B, ids.shape + (K,)).reshape(-1, K, 1)
            np.matmul(A[flat], x, out=out3)

        return step_f32
    if MOE_FUSED and be.repack and a.type in (GGMLType.Q4_K, GGMLType.Q6_K):  # experts, 8 rows at a time
        from .moe_x8 import mul_mat_id_step

        step_x8 = mul_mat_id_step(be, a, A, B, ids, out, bad_id)
        if step_x8 is not None:
            return step_x8
    if MOE_FUSED and kern is not None and out.flags.c_contiguous:
        from .moe_kernels import MOE

        moe = MOE.get(name)
        if moe is not None:
            be.need(moe)
            out2 = out.reshape(-1, N)
            direct = B.dtype == np.float32 and B.flags.c_contiguous

            def step_fused() -> None:
                if ids.shape[0] > MOE_FUSED_MAX_TOKENS:
                    return step()
                x = B if direct else np.ascontiguousarray(B, dtype=np.float32)
                bad = moe(A, x, ids, out2, f16, max_rows)
                if bad >= 0:
                    raise bad_id(ids.reshape(-1)[bad])
                if ids.size > max_rows:  # experts with more pairs than the mat-vec kernels take: tiles
                    flat = ids.reshape(-1)
                    counts = np.bincount(flat, minlength=E)
                    for e in np.flatnonzero(counts > max_rows):
                        expert(int(e), np.flatnonzero(flat == e))

            return step_fused

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
        from ..quants import dequantize_rows_into, rows_dequantizer

        if ids.ndim == 1 and A.ndim == 2:
            # checked once, when the step is built: a decode token's one row in a few microseconds
            # instead of ~60 us of cold Python validation a call (the mat-vecs before it have flushed
            # the caches; the tied embedding's row is one of them)
            deq = rows_dequantizer(a.type, len(ids), A.shape[1], out)

            def step_rows() -> None:
                i = check(ids, n)
                if i >= 0:
                    raise bad(i)
                deq(A[ids])

            return step_rows

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

        if A.dtype == out.dtype and A.ndim == 2 and out.shape == (len(ids), A.shape[1]):

            def step_same() -> None:  # no temporary (recurrent-state rows: 1 MiB a call on Qwen3.5)
                i = check(ids, n)
                if i >= 0:
                    raise bad(i)
                np.take(A, ids, axis=0, out=out, mode="clip")  # ids checked just above

            return step_same
        return step_f
    return None
