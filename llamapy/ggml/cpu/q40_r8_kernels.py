"""One-row (decode) kernels for Q4_0 and Q4_1 weights as the file stores them, eight rows at a time: the
8-row kernels of ``q40_x8_kernels`` without the repacked copy.

A short ``llamapy run`` does not repack (``cli.run.repack_pays``: copying 90 MB costs more than 16 tokens
save), so its decode ran the plain kernels (``q16_kernels``), which spend a float scale, a broadcast
and a fused multiply-add per row and block and sum each row horizontally at the end: ~17 vector
operations per row and block of 32 weights, compute-bound at ~23 GB/s on two Zen 4 cores where the
8-row kernels read ~37. Here each group of eight consecutive rows is read where it lies: per block, the
16 quant bytes of each row (eight 16-byte loads) are transposed in registers into the four 32-byte
vectors the repacked layout holds (``[chunk c][row r][4 bytes]``: eight ``vpunpck*`` and four 128-bit
inserts), and the rows' eight ``d`` (and ``m``) into one vector; from there each block is
``q40_x8_kernels``' block, operation for operation, with the same activations
(``prepare_activations``).

So a row's result is the repacked kernel's, bit for bit: whether a run repacks does not change what it
computes. Rows past the last whole group of eight (N not a multiple of 8) go through a copy of those
rows padded to eight.

Measured (haswell target, the AMD EPYC VM, GB/s of weights, plain / this / repacked): 512x1536 in L2,
one thread, Q4_1 11.3 / 16.3 / 24.8, Q4_0 11.7 / 15.3 / 23.8; from DRAM, two threads, Q4_1 ~20 / 21.5-23.2,
Q4_0 ~22 / 25.3-26.6. SmolLM2-135M Q4_1 without repacking: 6.0 -> 5.0 ms a decode token.

Call as ``MATVEC``: ``kern(w, x, out, f16)`` (``w`` uint8[N, nb * block bytes], ``f16`` unused); the
``GROUP_KERNELS``: ``kern(ws, x, out, f16)`` for a tuple of weights of one width (``matvec_groups``).
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..._numba import njit, prange
from .hsimd import H16, hmadd, nan_rows
from .isimd import iadd, isra, itof, izero
from .q40_x8_kernels import iadd_splat, pbcast, prepare_activations
from .rowgroups import PREFETCH_ROWS, prefetch_bytes, prefetch_bytes_l1
from .simd import _is_bytes, f32x8, vfma_strict, vmul, vsplat, vstore, vzero
from .x8simd import HAVE_F16C, _half_bits_to_float

_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_V4D = ir.VectorType(_I32, 4)
_V8D = ir.VectorType(_I32, 8)
_V8W = ir.VectorType(_I16, 8)
_V16W = ir.VectorType(_I16, 16)
_V8F = ir.VectorType(ir.FloatType(), 8)


def _row_ptrs(context, builder, sig, args, off, elem):  # type: ignore[no-untyped-def]
    """Pointers (to ``elem``) at byte ``base + r * rb + off`` of the byte array, for the eight rows r."""
    ary = context.make_array(sig.args[0])(context, builder, args[0])
    base = context.cast(builder, args[1], sig.args[1], types.intp)
    rb = context.cast(builder, args[2], sig.args[2], types.intp)
    ity = base.type
    out = []
    for r in range(8):
        i = builder.add(base, builder.add(builder.mul(rb, ir.Constant(ity, r)), ir.Constant(ity, off)))
        out.append(builder.bitcast(builder.gep(ary.data, [i]), elem.as_pointer()))
    return out


def _lanes(lo: list[int], hi: list[int]) -> ir.Constant:
    return ir.Constant(_V8D, lo + hi)


@intrinsic
def t8quants(typingctx, arr, base, rb, qoff):  # type: ignore[no-untyped-def]
    """The 16 quant bytes at ``base + r * rb + qoff`` of the eight rows r of a byte array, as the four
    32-byte chunks of the repacked layout: chunk c holds bytes ``4c .. 4c + 3`` of each row, row after
    row (as 16 int16 words, ``q40_x8_kernels.wfield``'s view)."""
    ok = _is_bytes(arr) and all(isinstance(t, types.Integer) for t in (base, rb))
    if not (ok and isinstance(qoff, types.IntegerLiteral)):
        return None
    k = qoff.literal_value

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        q = [builder.load(p, align=1) for p in _row_ptrs(context, builder, sig, args, k, _V4D)]
        y = [builder.shuffle_vector(q[r], q[r + 4], _lanes([0, 1, 2, 3], [4, 5, 6, 7])) for r in range(4)]
        lo32, hi32 = _lanes([0, 8, 1, 9], [4, 12, 5, 13]), _lanes([2, 10, 3, 11], [6, 14, 7, 15])
        t0, t1 = builder.shuffle_vector(y[0], y[1], lo32), builder.shuffle_vector(y[0], y[1], hi32)
        t2, t3 = builder.shuffle_vector(y[2], y[3], lo32), builder.shuffle_vector(y[2], y[3], hi32)
        lo64, hi64 = _lanes([0, 1, 8, 9], [4, 5, 12, 13]), _lanes([2, 3, 10, 11], [6, 7, 14, 15])
        chunks = [
            builder.shuffle_vector(t0, t2, lo64),
            builder.shuffle_vector(t0, t2, hi64),
            builder.shuffle_vector(t1, t3, lo64),
            builder.shuffle_vector(t1, t3, hi64),
        ]
        vs = [builder.bitcast(c, _V16W) for c in chunks]
        return context.make_tuple(builder, sig.return_type, vs)

    return types.UniTuple(H16, 4)(arr, base, rb, qoff), cg


def _to_floats(builder, h):  # type: ignore[no-untyped-def]
    """<8 x i16> of half-float bits as <8 x float>."""
    if HAVE_F16C:
        return builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), 8)), _V8F)
    return _half_bits_to_float(builder, h)


@intrinsic
def t8halves(typingctx, arr, base, rb, nh):  # type: ignore[no-untyped-def]
    """The first ``nh`` (1 or 2) half floats at ``base + r * rb`` of the eight rows r of a byte array,
    as floats: a tuple of ``nh`` vectors, lane r row r's (``d``; ``d`` and ``m``). Reads 16 bytes a row."""
    ok = _is_bytes(arr) and all(isinstance(t, types.Integer) for t in (base, rb))
    if not (ok and isinstance(nh, types.IntegerLiteral) and nh.literal_value in (1, 2)):
        return None
    n = nh.literal_value

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        # the first 4 bytes of each row's block, transposed as in ``t8quants`` (loads of 16 bytes and
        # shuffles: eight scalar loads and inserts cost about twice the operations)
        q = [builder.load(p, align=1) for p in _row_ptrs(context, builder, sig, args, 0, _V4D)]
        y = [builder.shuffle_vector(q[r], q[r + 4], _lanes([0, 1, 2, 3], [4, 5, 6, 7])) for r in range(4)]
        lo32 = _lanes([0, 8, 1, 9], [4, 12, 5, 13])
        t0, t2 = builder.shuffle_vector(y[0], y[1], lo32), builder.shuffle_vector(y[2], y[3], lo32)
        w = builder.bitcast(builder.shuffle_vector(t0, t2, _lanes([0, 1, 8, 9], [4, 5, 12, 13])), _V16W)
        und = ir.Constant(_V16W, None)
        ds = builder.shuffle_vector(w, und, ir.Constant(_V8D, [0, 2, 4, 6, 8, 10, 12, 14]))
        if n == 1:
            return context.make_tuple(builder, sig.return_type, [_to_floats(builder, ds)])
        ms = builder.shuffle_vector(w, und, ir.Constant(_V8D, [1, 3, 5, 7, 9, 11, 13, 15]))
        return context.make_tuple(
            builder, sig.return_type, [_to_floats(builder, ds), _to_floats(builder, ms)]
        )

    return types.UniTuple(f32x8, n)(arr, base, rb, nh), cg


@intrinsic
def vfield(typingctx, v, e):  # type: ignore[no-untyped-def]
    """``q40_x8_kernels.wfield`` of a vector already loaded: field ``e`` (0..3) of each of the 16 words
    left in place (``word & (15 << 4e)``), the top one shifted down."""
    if v != H16 or not (isinstance(e, types.IntegerLiteral) and 0 <= e.literal_value < 4):
        return None
    k = e.literal_value

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        if k == 3:
            return builder.lshr(args[0], ir.Constant(_V16W, [12] * 16))
        return builder.and_(args[0], ir.Constant(_V16W, [15 << (4 * k)] * 16))

    return H16(v, e), cg


@njit(inline="always")
def _q4_sum(ch, xpm, x0):
    """``q40_x8_kernels._q4_sum`` of the transposed chunks ``ch``: the same products in the same order."""
    s0, s1, s2 = izero(), izero(), izero()
    for c in range(4):
        v, xc = ch[c], x0 + 8 * c
        s0 = hmadd(s0, vfield(v, 0), pbcast(xpm, xc))
        s1 = hmadd(s1, vfield(v, 1), pbcast(xpm, xc + 2))
        s2 = hmadd(s2, vfield(v, 2), pbcast(xpm, xc + 4))
        s0 = hmadd(s0, vfield(v, 3), pbcast(xpm, xc + 6))
    return iadd(s0, iadd(isra(s1, 4), isra(s2, 8)))


@njit(inline="always")
def _blk_q4_0(acc, wf, o, rb, xpm, x0, d, xs, cor):
    s = iadd_splat(_q4_sum(t8quants(wf, o, rb, 2), xpm, x0), cor)
    (dw,) = t8halves(wf, o, rb, 1)
    return vfma_strict(acc, vmul(dw, vsplat(d)), itof(s))


@njit(inline="always")
def _blk_q4_1(acc, wf, o, rb, xpm, x0, d, xs, cor):
    dw, mw = t8halves(wf, o, rb, 2)
    acc = vfma_strict(acc, vmul(dw, vsplat(d)), itof(_q4_sum(t8quants(wf, o, rb, 4), xpm, x0)))
    return vfma_strict(acc, mw, vsplat(xs))


@njit(inline="always")
def _group(wf, base, rb, nb, bbytes, m, a, blk, pfb, pf, total):
    """Row ``m``'s sums over the eight rows from byte ``base`` (prefetching ``pf`` on for the first row)."""
    xp, xd, xs, cor = a
    xpm = xp[m]
    acc = vzero()
    for b in range(nb):
        if m == 0:
            pfb(wf, pf + b * 8 * bbytes, 8 * bbytes, total)
        acc = blk(acc, wf, base + b * bbytes, rb, xpm, b * 32, xd[m, b], xs[m, b], cor[m, b])
    return acc


@njit(inline="always")
def _mm_r8(w, x, out, blk, bbytes, pfb):
    N, rb = w.shape
    nb = rb // bbytes
    M = x.shape[0]
    xp, xd, xs, cor, ok = prepare_activations(x, nb)
    a = (xp, xd, xs, cor)
    wf = w.reshape(-1)
    total = N * rb
    G = N >> 3
    for g in prange(G):
        base = g * 8 * rb
        for m in range(M):
            acc = _group(wf, base, rb, nb, bbytes, m, a, blk, pfb, base + PREFETCH_ROWS * rb, total)
            vstore(out[m], g * 8, acc)
    if N & 7:  # the last rows, padded to eight with copies of the last one
        tail = np.empty((8, rb), np.uint8)
        for r in range(8):  # element by element: a slice assignment would be a parallel region of its own
            src = min(G * 8 + r, N - 1)
            for j in range(rb):
                tail[r, j] = w[src, j]
        tf = tail.reshape(-1)
        lanes = np.empty(8, np.float32)
        for m in range(M):
            vstore(lanes, 0, _group(tf, 0, rb, nb, bbytes, m, a, blk, pfb, 0, 0))
            for r in range(N - G * 8):
                out[m, G * 8 + r] = lanes[r]
    nan_rows(out, ok)


@njit(parallel=True, cache=True)
def mm_q4_0_r8(w, x, out, f16):
    """out[m, :] = W @ (the 16-bit quantized x[m]) for the Q4_0 rows ``w`` (uint8[N, nb * 18]) as stored:
    ``q40_x8_kernels.mm_q4_0_x8``'s result, bit for bit."""
    _mm_r8(w, x, out, _blk_q4_0, 18, prefetch_bytes)


@njit(parallel=True, cache=True)
def mm_q4_1_r8(w, x, out, f16):
    """As ``mm_q4_0_r8`` for Q4_1 (uint8[N, nb * 20])."""
    _mm_r8(w, x, out, _blk_q4_1, 20, prefetch_bytes)


@njit(parallel=True, cache=True)
def mm_q4_0_r8_l1(w, x, out, f16):
    """``mm_q4_0_r8`` prefetching into L1 (``matmul_steps.prefetch_into_l1``: small models)."""
    _mm_r8(w, x, out, _blk_q4_0, 18, prefetch_bytes_l1)


@njit(parallel=True, cache=True)
def mm_q4_1_r8_l1(w, x, out, f16):
    """``mm_q4_1_r8`` prefetching into L1."""
    _mm_r8(w, x, out, _blk_q4_1, 20, prefetch_bytes_l1)


@njit(inline="always")
def _mm_r8_group(ws, x, out, blk, bbytes, pfb):
    """``_mm_r8`` over the weights of the tuple ``ws`` (each uint8[N_j, rb], N_j a multiple of 8, one
    ``rb``) that multiply the same activations, in one parallel loop over all their row groups: weight
    j's rows land in ``out[:, sum(N_<j) : sum(N_<=j)]``, each row's value the one ``_mm_r8`` computes for it
    (the same activations, the same ``_group``)."""
    rb = ws[0].shape[1]
    nb = rb // bbytes
    M = x.shape[0]
    xp, xd, xs, cor, ok = prepare_activations(x, nb)
    a = (xp, xd, xs, cor)
    k = len(ws)
    first = np.empty(k + 1, np.int64)  # weight j's groups are first[j] .. first[j + 1] - 1
    first[0] = 0
    for j in range(k):
        first[j + 1] = first[j] + (ws[j].shape[0] >> 3)
    for g in prange(first[k]):
        j = 0
        while g >= first[j + 1]:
            j += 1
        w = ws[j]
        wf = w.reshape(-1)
        base = (g - first[j]) * 8 * rb
        total = w.shape[0] * rb
        for m in range(M):
            acc = _group(wf, base, rb, nb, bbytes, m, a, blk, pfb, base + PREFETCH_ROWS * rb, total)
            vstore(out[m], g * 8, acc)
    nan_rows(out, ok)


@njit(parallel=True, cache=True)
def mm_q4_0_r8_group(ws, x, out, f16):
    """``mm_q4_0_r8`` of each Q4_0 weight of the tuple ``ws`` in one call (``matvec_groups``: Q, K and
    V, or gate and up, of a run that does not repack), their results side by side in ``out``."""
    _mm_r8_group(ws, x, out, _blk_q4_0, 18, prefetch_bytes)


@njit(parallel=True, cache=True)
def mm_q4_1_r8_group(ws, x, out, f16):
    """As ``mm_q4_0_r8_group`` for Q4_1."""
    _mm_r8_group(ws, x, out, _blk_q4_1, 20, prefetch_bytes)


@njit(parallel=True, cache=True)
def mm_q4_0_r8_group_l1(ws, x, out, f16):
    """``mm_q4_0_r8_group`` prefetching into L1."""
    _mm_r8_group(ws, x, out, _blk_q4_0, 18, prefetch_bytes_l1)


@njit(parallel=True, cache=True)
def mm_q4_1_r8_group_l1(ws, x, out, f16):
    """``mm_q4_1_r8_group`` prefetching into L1."""
    _mm_r8_group(ws, x, out, _blk_q4_1, 20, prefetch_bytes_l1)


#: the grouped kernels by type, and prefetching into L1
GROUP_KERNELS = {
    ("Q4_0", False): mm_q4_0_r8_group,
    ("Q4_1", False): mm_q4_1_r8_group,
    ("Q4_0", True): mm_q4_0_r8_group_l1,
    ("Q4_1", True): mm_q4_1_r8_group_l1,
}
