"""Per-node launches of the CUDA backend: ``build_step(backend, node, source descriptors, output
descriptor)`` returns a no-argument closure launching the node's kernel(s) through ``be.launch`` /
``be.launch_cfg`` / ``be.device_call`` (its arguments bound at compile time). A descriptor is
``(device buffer, byte offset, shape4, byte strides4)`` (see ``backend.CUDABackend.compile_split``).

The first run of a split records what these closures launch and later runs replay the record
(``plan.LaunchPlan``), so a closure must launch the same kernels with the same arguments on every run.
Audit (each op below): grids, shapes, strides, offsets, op codes and scalars come from the node's shapes
and params; every input-dependent value (token ids and rows in get_rows, cache slots in set_rows,
positions in rope, masks in soft_max / flash_attn_ext, expert ids in mul_mat_id / add_id) is read by the
kernel from device memory, and bad ones are flagged in ``err`` (checked on the host after the split,
outside the replay). ALiBi slopes are uploaded once at compile time. Nothing is decided on the host
from input values, so a replay (or a CUDA graph of it) computes what the node walk would."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend import ComputeError
from ..tensor import Tensor
from ..types import TRAITS

__all__ = ["build_step", "GEMM_MIN_TOKENS"]


def build_step(be: Any, n: Tensor, srcd: list[tuple], outd: tuple) -> Callable[[], None]:
    from . import attention, kernels, matmul

    op, p = n.op, n.params
    ob, oo, osh, ost = outd
    o8, o16, o32, _ = be.views(ob)
    ne = n.n_elements
    L = be.launch
    err = be._err

    def v(i: int) -> tuple[Any, Any, Any, Any]:
        return be.views(srcd[i][0])

    if op in kernels.BINARY:
        (ab, ao, ash, ast), (bb, bo, bsh, bst) = srcd
        code = kernels.BINARY[op]
        a32, b32 = v(0)[2], v(1)[2]
        return lambda: L(
            kernels.binary_k, ne, code, ne, a32, ao, ash, ast, b32, bo, bsh, bst, o32, oo, osh, ost
        )
    if op in kernels.UNARY:
        _, ao, ash, ast = srcd[0]
        code = kernels.UNARY[op]
        p0 = float(p.get("s", p.get("cap", 0.0)))
        p1 = float(p.get("bias", 0.0))
        a32 = v(0)[2]
        return lambda: L(kernels.unary_k, ne, code, p0, p1, ne, a32, ao, ash, ast, o32, oo, osh, ost)
    if op in kernels.GLU:
        (_, ao, _, ast), (_, bo, _, bst) = srcd
        code = kernels.GLU[op]
        a32, b32 = v(0)[2], v(1)[2]
        al, lim = float(p.get("alpha", 0.0)), float(p.get("limit", 0.0))
        return lambda: L(kernels.glu_k, ne, code, al, lim, ne, a32, ao, ast, b32, bo, bst, o32, oo, osh, ost)
    if op == "add_id":
        (_, ao, ash, ast), (_, bo, _, bst), (_, io, _, ist) = srcd
        a32, b32, ids, E = v(0)[2], v(1)[2], v(2)[3], n.src[1].shape[0]
        return lambda: L(
            kernels.add_id_k, ne, ne, E, a32, ao, ash, ast, b32, bo, bst, ids, io, ist, o32, oo, ost, err
        )
    if op in ("rms_norm", "norm"):
        _, ao, ash, ast = srcd[0]
        rows = ne // ash[3]
        rms, eps, a32 = op == "rms_norm", float(p["eps"]), v(0)[2]
        return lambda: L(kernels.norm_k, rows, rms, eps, rows, a32, ao, ash, ast, o32, oo, ost)
    if op == "soft_max":
        _, ao, ash, ast = srcd[0]
        rows = ne // ash[3]
        sinks = bool(p.get("sinks"))
        if len(srcd) > 1 + sinks:
            _, mo, msh, mst = srcd[1]
            mt = int(n.src[1].type)
            m8, m16, m32, _ = v(1)
        else:
            mo, msh, mst, mt, (m8, m16, m32) = 0, (1, 1, 1, 1), (0, 0, 0, 0), -1, (o8, o16, o32)
        n_head = n.src[0].shape[-3] if n.ndim >= 3 else 1
        slopes, us = _slopes(be, n_head, p.get("max_bias", 0.0), o32)
        if sinks:
            _, sko, _, _ = srcd[-1]
            snk, uk = v(len(srcd) - 1)[2][sko // 4 :], True
        else:
            snk, uk = o32, False
        sc, a32 = float(p["scale"]), v(0)[2]
        return lambda: L(
            kernels.soft_max_k, rows, sc, rows, a32, ao, ash, ast, mt, m8, m16, m32, mo, msh, mst, o32, oo, ost,
            slopes, us, snk, uk,
        )  # fmt: skip
    if op == "rope":
        return _rope(be, n, srcd, outd)
    if op == "get_rows":
        (_, ao, ash, ast), (_, io, _, _) = srcd
        t, ncol, nrows = int(n.src[0].type), n.shape[1], n.src[0].shape[0]
        a8, a16, a32, _ = v(0)
        ids, iw = v(1)[3], TRAITS[n.src[1].type].type_size
        return lambda: L(
            kernels.get_rows_k,
            ne,
            t,
            ne,
            ncol,
            a8,
            a16,
            a32,
            ao,
            ast[2],
            ids,
            io,
            iw,
            nrows,
            o32,
            oo,
            ost[2],
            err,
        )
    if op == "set_rows":
        (_, do, dsh, dst_), (_, so, _, sst), (_, io, _, _) = srcd
        m, ncol, nrows = n.src[1].n_elements, n.shape[1], n.shape[0]
        s32, ids, iw = v(1)[2], v(2)[3], TRAITS[n.src[2].type].type_size
        dt = int(n.type)
        return lambda: L(
            kernels.set_rows_k, m, m, ncol, s32, so, sst[2], sst[3], ids, io, iw, nrows,
            dt, o16, o32, do, dst_[2], dst_[3], err,
        )  # fmt: skip
    if op in ("cpy", "cont"):  # cpy: src[0] into src[1] (the node is src[1] in place)
        _, so, ssh, sst = srcd[0]
        st_t, dt = int(n.src[0].type), int(n.type)
        s8, s16, s32, _ = v(0)
        return lambda: L(
            kernels.copy_k, ne, st_t, ne, s8, s16, s32, so, ssh, sst, dt, o16, o32, oo, osh, ost, err
        )
    if op == "mul_mat":
        return _mul_mat(be, n, srcd, outd)
    if op == "mul_mat_id":
        (_, ao, _, ast), (_, bo, bsh, bst), (_, io, _, ist) = srcd
        t, K, E = int(n.src[0].type), n.src[0].shape[-1], n.src[0].shape[0]
        a8, a16, a32, _ = v(0)
        b32, ids = v(1)[2], v(2)[3]
        return lambda: L(
            matmul.mul_mat_id_k, ne, t, ne, K, E, a8, a16, a32, ao, ast, b32, bo, bsh, bst,
            ids, io, ist, o32, oo, osh, ost, err,
        )  # fmt: skip
    if op == "flash_attn_ext":
        q, k, vv = srcd[:3]
        T, H, D = n.src[0].shape
        KV, Hkv, _ = n.src[1].shape
        Dv = n.src[2].shape[2]
        rest = srcd[3:]
        if len(n.src) > 3:
            _, mo, _, mst = srcd[3]
            mt = int(n.src[3].type)
            m8, m16, m32, _ = v(3)
        else:
            mo, mst, mt, (m8, m16, m32) = 0, (0, 0, 0, 0), -1, (o8, o16, o32)
        if p.get("sinks"):
            _, so, _, _ = rest[-1]
            snk, use_s = v(len(srcd) - 1)[2], True
        else:
            so, snk, use_s = 0, o32, False
        slopes, use_sl = _slopes(be, H, p.get("max_bias", 0.0), o32)
        q32 = v(0)[2]
        k8, k16, k32, _ = v(1)
        v8, v16, v32, _ = v(2)
        kt, vt = int(n.src[1].type), int(n.src[2].type)
        rows, g = T * H, H // Hkv
        sc, cap = float(p["scale"]), float(p["logit_softcap"])
        return lambda: L(
            attention.flash_attn_k, rows, rows, D, Dv, KV, g, sc, cap,
            q32, q[1], q[2], q[3], kt, k8, k16, k32, k[1], k[3], vt, v8, v16, v32, vv[1], vv[3],
            mt, m8, m16, m32, mo, mst, use_s, snk, so, o32, oo, ost, slopes, use_sl,
        )  # fmt: skip
    raise ComputeError(f"CUDA: no kernel for {n!r}")  # pragma: no cover - supports_op said no


def _slopes(be: Any, n_head: int, max_bias: float, dummy: Any) -> tuple[Any, bool]:
    """ALiBi slopes per head on the device (uploaded once per node), or a dummy when there is no bias."""
    if not max_bias or max_bias <= 0:
        return dummy, False
    from ..ops import alibi_slopes

    return be.views(be.dev.upload(np.asarray(alibi_slopes(n_head, max_bias), np.float32)))[2], True


def _rope(be: Any, n: Tensor, srcd: list[tuple], outd: tuple) -> Callable[[], None]:
    from . import kernels

    p = n.params
    _, ao, ash, ast = srcd[0]
    _, po, _, _ = srcd[1]
    _, oo, _, ost = outd
    o32 = be.views(outd[0])[2]
    a32, pos = be.views(srcd[0][0])[2], be.views(srcd[1][0])[3]
    use_ff = len(srcd) > 2
    ff = be.views(srcd[2][0])[2][srcd[2][1] // 4 :] if use_ff else o32
    nd, base, fs, ext = p["n_dims"], p["freq_base"], p["freq_scale"], p["ext_factor"]
    low = high = 0.0
    mscale = p["attn_factor"]
    if ext != 0.0:

        def corr_dim(n_rot: float) -> float:
            return nd * math.log(p["n_ctx_orig"] / (n_rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(0.0, math.floor(corr_dim(p["beta_fast"])))
        high = min(nd - 1.0, math.ceil(corr_dim(p["beta_slow"])))
        mscale *= 1.0 + 0.1 * math.log(1.0 / fs)
    neox, ne = p["mode"] != 0, n.n_elements
    msec = tuple(int(x) for x in p.get("sections") or (0, 0, 0, 0))
    mmode = {8: 1, 40: 2}.get(p["mode"], 0)
    pos4 = bool(p.get("pos4", False))
    return lambda: be.launch(
        kernels.rope_k, ne, neox, nd, base, fs, ext, low, high, mscale, ne, a32, ao, ash, ast,
        pos, po, ff, use_ff, o32, oo, ost, msec, mmode, pos4,
    )  # fmt: skip


def _mul_mat(be: Any, n: Tensor, srcd: list[tuple], outd: tuple) -> Callable[[], None]:
    from . import matmul

    a, b = n.src
    (_, ao, ash, ast), (_, bo, bsh, bst) = srcd
    _, oo, _, ost = outd
    o32 = be.views(outd[0])[2]
    a8, a16, a32, _ = be.views(srcd[0][0])
    b8, b16, b32, _ = be.views(srcd[1][0])
    t, bt, K = int(a.type), int(b.type), a.shape[-1]
    if b.ndim == 1:  # a @ b: one activation row
        bsh, bst = (1, 1, 1, K), (0, 0, 0, bst[3])
    M = a.shape[-2] if a.ndim >= 2 else 1
    N = bsh[2]
    osh = (bsh[0], bsh[1], N, M)
    if n.ndim == 1:
        ost = (0, 0, 0, ost[3])
    ne = n.n_elements
    if N > GEMM_MIN_TOKENS and a.ndim == 2 and bsh[:2] == (1, 1) and bt == 0 and be.dev.cp is not None:
        return _gemm_cublas(be, n, srcd, outd)  # pragma: no cover - needs a GPU with CuPy
    if N > GEMM_MIN_TOKENS and a.ndim == 2 and bsh[:2] == (1, 1) and bt == 0:  # prompt: tiled GEMM
        T = matmul.TILE
        grid = (-(-M // T), -(-N // T))
        k = matmul.gemm_tiled_k
        ars, asd, brs, bsd, ors = ast[2], ast[3], bst[2], bst[3], ost[2]
        return lambda: be.launch_cfg(
            k, grid, (T, T), t, M, N, K, a8, a16, a32, ao, ars, asd, b32, bo, brs, bsd, o32, oo, ors
        )
    args = (t, ne, K, a8, a16, a32, ao, ash, ast, bt, b8, b16, b32, bo, bst, o32, oo, osh, ost)
    if be.block_matvec:  # a block of threads per output (the GPU default; the full simulator runs it)
        kb, blocks = matmul.mat_vec_block_k, min(ne, 65535)
        return lambda: be.launch_cfg(kb, blocks, matmul.WARP, *args)
    return lambda: be.launch(matmul.mat_vec_k, ne, *args)


#: batches with more rows than this take the tiled GEMM kernel (decode stays on the mat-vec kernel)
GEMM_MIN_TOKENS = 8


def _gemm_cublas(be: Any, n: Tensor, srcd: list[tuple], outd: tuple) -> Callable[[], None]:
    """Prompt path with CuPy: the weight dequantized to an F32 scratch (``dequant_rows_k``), then one
    cuBLAS GEMM ``out[N, M] = x[N, K] @ w[M, K].T``. Untested here (no GPU in the session that wrote it)."""
    from . import matmul

    cp = be.dev.cp
    a, b = n.src
    M, K = a.shape
    N = b.shape[-2]
    (_, ao, _, ast), (bbuf, bo, _, bst) = srcd
    obuf, oo, _, ost = outd
    a8, a16, a32, _ = be.views(srcd[0][0])
    t = int(a.type)
    key = ("w32", M * K)
    scratch = be.scratch.get(key)
    if scratch is None:
        scratch = be.scratch[key] = cp.empty(M * K, dtype=np.float32)
    x = cp.ndarray((N, K), np.float32, memptr=bbuf.data + bo, strides=(bst[2], bst[3]))
    out = cp.ndarray((N, M), np.float32, memptr=obuf.data + oo, strides=(ost[2], ost[3]))
    w_t = scratch.reshape(M, K).T

    def step() -> None:
        be.launch(matmul.dequant_rows_k, M * K, t, M * K, K, a8, a16, a32, ao, ast[2], scratch, 0)
        be.device_call(gemm)

    def gemm() -> None:
        cp.matmul(x, w_t, out=out)

    return step
