"""Decode attention: a few query rows over the KV cache (the small-batch path of ``flash_attn_ext``), over
any cache: an F16 one read in place as half bits, the others converted to float32 first. Only unmasked keys
are read; a fully masked row gives zeros.

- ``attn_heads`` gives each thread whole query heads: one pass over the keys for the scores, one over the
  values, with two short scratch rows. It is the kernel whenever there are at least as many query heads
  as threads (2-core VM, one F16 query row, 2 threads: 8.5 vs 19 us at 64 keys, 443 vs 640 us at 4000
  keys for Gemma 3's 4 heads of 256, 1252 vs 1275 us for Qwen3.5's 8 on 2 kv heads, against
  ``attn_split``), although with grouped-query attention it reads each cached row once per query head.
- ``attn_heads_f16x8`` is the same over an F16 cache whose head size is a multiple of 8, on 8-float
  vectors (``simd.vh8``: F16C conversions), prefetching the rows ``PF_KEYS`` keys ahead.
- ``attn_group_f16x8`` takes over from it for grouped-query attention (``use_group``): all query heads of a kv
  group at once, so each cached row is read and widened once per group; keys in flash sub-blocks, split into
  chunks across threads (Qwen2.5-1.5B shape, 1 thread, 16384 keys: 2.7 vs 6.7 ms per layer; see
  ``benchmarks/results/depth_decode.md``).
- ``attn_split`` is for fewer query heads than threads: a task is one kv head and one chunk of keys; it
  converts each unmasked row once for all ``g`` query heads of the group, keeping a running max, sum and
  weighted value sum per head, and the chunks are merged at the end with the usual rescaling.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..._numba import FAST_KEEP_INF, njit, prange
from .op_kernels import _as_f32
from .simd import _ptr, f32x8, prefetch, vfma, vh8, vhsum, vload, vmul, vsplat, vstore, vzero
from .vmath import fexp, ftanh

__all__ = [
    "attn_group_f16x8",
    "attn_heads",
    "attn_heads_f16x8",
    "attn_split",
    "group_chunks",
    "n_chunks_for",
    "use_group",
    "use_split",
]

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)

#: how many keys ahead ``attn_heads_f16x8`` asks for cache rows (a long cache streams from memory)
PF_KEYS = 16

#: keys at least for ``attn_group_f16x8`` (below, ``attn_heads_f16x8``'s single pass per head costs less)
GROUP_MIN_KEYS = 0

#: keys per chunk at least (a chunk's fixed cost is a few vector loops over the group)
MIN_CHUNK = 64


def use_split(n_head: int, n_threads: int) -> bool:
    """Whether decode attention splits by chunks of keys (fewer query heads than threads)."""
    return n_head < n_threads


@njit(inline="always")
def _score(dot, scale, cap, has_mask, slope, m):
    """A raw q.k dot product as the softmax input: scaled, soft-capped (``cap`` 0: none), plus the
    mask entry ``m`` times the head's ALiBi slope."""
    d = dot * scale
    if cap != _F0:
        d = cap * ftanh(d / cap)
    if has_mask:
        d += slope * m
    return d


@njit(inline="always")
def _attn_row(q, k, v, mask, has_mask, scale, cap, slopes, out, t, h, kh, s, acc):
    """One query row ``t`` of head ``h`` (kv head ``kh``) into ``out[t, h]``, with the scratch
    ``s[KV]`` and ``acc[Dv]``. Masked keys are skipped (never read); a fully masked row gives zeros."""
    KV, D, Dv = k.shape[0], q.shape[2], v.shape[2]
    ninf = np.float32(-np.inf)
    mx = ninf
    for j in range(KV):
        if has_mask and mask[t, j] == ninf:
            s[j] = ninf
            continue
        d = _F0
        for i in range(D):
            d += q[t, h, i] * _as_f32(k[j, kh, i])
        d = _score(d, scale, cap, has_mask, slopes[h], mask[t, j] if has_mask else _F0)
        s[j] = d
        mx = max(mx, d)
    if mx == ninf:
        for i in range(Dv):
            out[t, h, i] = _F0
        return
    for i in range(Dv):
        acc[i] = _F0
    ssum = _F0
    for j in range(KV):
        if s[j] == ninf:
            continue
        p = fexp(s[j] - mx)
        ssum += p
        for i in range(Dv):
            acc[i] += p * _as_f32(v[j, kh, i])
    inv = _F1 / ssum
    for i in range(Dv):
        out[t, h, i] = acc[i] * inv


@njit(parallel=True, cache=True, fastmath=FAST_KEEP_INF, error_model="numpy")
def attn_heads(q, k, v, mask, has_mask, scale, cap, slopes, out):
    """Arguments as ``attn_split`` (without ``n_chunks``): each query head on one thread."""
    T, H, _ = q.shape
    g = H // k.shape[1]
    for h in prange(H):
        s = np.empty(k.shape[0], np.float32)
        acc = np.empty(v.shape[2], np.float32)
        for t in range(T):
            _attn_row(q, k, v, mask, has_mask, scale, cap, slopes, out, t, h, h // g, s, acc)


@njit(parallel=True, cache=True, fastmath=FAST_KEEP_INF, error_model="numpy")
def attn_heads_f16x8(q, k, v, mask, has_mask, scale, cap, slopes, out, Hkv, D):
    """``attn_heads`` over an F16 cache with ``D`` (= Dv) a multiple of 8, on 8-float vectors: ``k`` and
    ``v`` are the cache rows flattened (``uint16[KV * Hkv * D]``, C order), ``q`` ``float32[T, H, D]``
    C-contiguous. Each K and V element is one lane of a ``vh8`` (F16C ``vcvtph2ps``) instead of a
    scalar bit conversion."""
    T, H, _ = q.shape
    KV = k.shape[0] // (Hkv * D)
    g = H // Hkv
    ninf = np.float32(-np.inf)
    row = Hkv * D
    qf = q.reshape(-1)
    for h in prange(H):
        kh = h // g
        s = np.empty(KV, np.float32)
        acc = np.empty(D, np.float32)
        for t in range(T):
            qo = (t * H + h) * D
            mx = ninf
            for j in range(KV):
                if has_mask and mask[t, j] == ninf:
                    s[j] = ninf
                    continue
                ko = j * row + kh * D
                if j + PF_KEYS < KV:
                    for i in range(0, D, 32):  # 64-byte lines of the row PF_KEYS keys ahead
                        prefetch(k, ko + PF_KEYS * row + i)
                a = vzero()
                for i in range(0, D, 8):
                    a = vfma(a, vload(qf, qo + i), vh8(k, ko + i))
                d = _score(vhsum(a), scale, cap, has_mask, slopes[h], mask[t, j] if has_mask else _F0)
                s[j] = d
                mx = max(mx, d)
            if mx == ninf:
                for i in range(D):
                    out[t, h, i] = _F0
                continue
            for i in range(0, D, 8):
                vstore(acc, i, vzero())
            ssum = _F0
            for j in range(KV):
                if s[j] == ninf:
                    continue
                p = fexp(s[j] - mx)
                ssum += p
                vp = vsplat(p)
                vo = j * row + kh * D
                if j + PF_KEYS < KV:
                    for i in range(0, D, 32):
                        prefetch(v, vo + PF_KEYS * row + i)
                for i in range(0, D, 8):
                    vstore(acc, i, vfma(vload(acc, i), vp, vh8(v, vo + i)))
            inv = vsplat(_F1 / ssum)
            for i in range(0, D, 8):
                vstore(acc, i, vmul(vload(acc, i), inv))
            for i in range(D):
                out[t, h, i] = acc[i]


def use_group(n_head: int, n_head_kv: int, n_kv: int) -> bool:
    """Whether an F16 decode goes to ``attn_group_f16x8``: grouped-query attention (at least two query heads
    per kv head) over at least ``GROUP_MIN_KEYS`` keys."""
    return n_head >= 2 * n_head_kv and n_kv >= GROUP_MIN_KEYS


def group_chunks(n_kv: int, n_threads: int) -> int:
    """Chunks of keys for ``attn_group_f16x8`` (each covers all kv heads): one per thread, none under
    ``MIN_CHUNK`` keys."""
    return max(1, min(n_threads, n_kv // MIN_CHUNK))


def n_chunks_for(n_kv: int, n_head_kv: int, n_threads: int) -> int:
    """Chunks of keys per kv head: about two tasks per thread, no chunk under ``MIN_CHUNK`` keys."""
    want = max(1, -(-2 * n_threads // n_head_kv))
    return max(1, min(want, n_kv // MIN_CHUNK))


@njit(inline="always")
def _fill(a, value):
    """``a`` (C-contiguous) with every element ``value``, by a plain loop: in a ``parallel=True`` kernel
    ``np.zeros`` or ``a[:] = value`` is a parallel region of its own, one launch of the threads (~2 us)
    for a few hundred floats (``tests/ggml/test_parfors.py``)."""
    f = a.reshape(-1)
    for i in range(f.shape[0]):
        f[i] = value
    return a


@njit(parallel=True, cache=True, fastmath=FAST_KEEP_INF, error_model="numpy")
def attn_split(q, k, v, mask, has_mask, scale, cap, slopes, out, n_chunks):
    """q[T, H, D] float32, k[KV, Hkv, D] / v[KV, Hkv, Dv] (half bits as uint16, or float32; any strides),
    mask[T, KV] (0 / -inf, times the head's ALiBi slope), out[T, H, Dv]. Masked keys are never read; a
    fully masked row gives zeros. ``n_chunks`` chunks of keys per kv head (``n_chunks_for``)."""
    T, H, D = q.shape
    KV, Hkv = k.shape[0], k.shape[1]
    Dv = v.shape[2]
    g = H // Hkv
    ninf = np.float32(-np.inf)
    csz = (KV + n_chunks - 1) // n_chunks
    n_tasks = Hkv * n_chunks
    pm = np.empty((n_tasks, T, g), np.float32)  # running max of each chunk
    ps = _fill(np.empty((n_tasks, T, g), np.float32), _F0)  # sum of exp(score - max)
    pa = _fill(np.empty((n_tasks, T, g, Dv), np.float32), _F0)  # sum of exp(score - max) * v
    for task in prange(n_tasks):
        kh = task // n_chunks
        j0 = (task % n_chunks) * csz
        j1 = min(KV, j0 + csz)
        n = max(j1 - j0, 0)
        kb = np.empty(D, np.float32)
        vb = np.empty(Dv, np.float32)
        s = np.empty((T, g, max(n, 1)), np.float32)
        for t in range(T):
            for hi in range(g):
                pm[task, t, hi] = ninf
        for jj in range(n):
            j = j0 + jj
            seen = not has_mask
            for t in range(T):
                if has_mask and mask[t, j] == ninf:
                    for hi in range(g):
                        s[t, hi, jj] = ninf
                else:
                    seen = True
            if not seen:
                continue
            for i in range(D):
                kb[i] = _as_f32(k[j, kh, i])
            for t in range(T):
                if has_mask and mask[t, j] == ninf:
                    continue
                for hi in range(g):
                    h = kh * g + hi
                    d = _F0
                    for i in range(D):
                        d += q[t, h, i] * kb[i]
                    d = _score(d, scale, cap, has_mask, slopes[h], mask[t, j] if has_mask else _F0)
                    s[t, hi, jj] = d
                    if d > pm[task, t, hi]:
                        pm[task, t, hi] = d
        for jj in range(n):
            j = j0 + jj
            used = False
            for t in range(T):
                for hi in range(g):
                    if s[t, hi, jj] != ninf:
                        used = True
            if not used:
                continue
            for i in range(Dv):
                vb[i] = _as_f32(v[j, kh, i])
            for t in range(T):
                for hi in range(g):
                    sv = s[t, hi, jj]
                    if sv == ninf:
                        continue
                    p = fexp(sv - pm[task, t, hi])
                    ps[task, t, hi] += p
                    for i in range(Dv):
                        pa[task, t, hi, i] += p * vb[i]
    # the merge is a few vector sums per query head: serial, no second parallel region (a fork and
    # join cost more than it does; at short contexts that doubled the call)
    for h in range(H):
        kh = h // g
        hi = h % g
        for t in range(T):
            m = ninf
            for c in range(n_chunks):
                m = max(m, pm[kh * n_chunks + c, t, hi])
            for i in range(Dv):
                out[t, h, i] = _F0
            if m == ninf:
                continue
            tot = _F0
            for c in range(n_chunks):
                task = kh * n_chunks + c
                mc = pm[task, t, hi]
                if mc == ninf:
                    continue
                w = fexp(mc - m)
                tot += w * ps[task, t, hi]
                for i in range(Dv):
                    out[t, h, i] += w * pa[task, t, hi, i]
            inv = _F1 / tot
            for i in range(Dv):
                out[t, h, i] *= inv


_V4 = ir.VectorType(ir.FloatType(), 4)
_I32 = ir.IntType(32)


@intrinsic
def vstore_hsum4(typingctx, arr, idx, a0, a1, a2, a3):  # type: ignore[no-untyped-def]
    """arr[idx : idx + 4] = the lane sums of a0, a1, a2, a3: a transposed reduction (pairwise adds of
    shuffled halves, ``vhaddps``-like) instead of four separate horizontal sums."""
    ok = isinstance(arr, types.Array) and arr.dtype == types.float32 and isinstance(idx, types.Integer)
    if not (ok and a0 == f32x8 and a1 == f32x8 and a2 == f32x8 and a3 == f32x8):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        ev = ir.Constant(ir.VectorType(_I32, 8), [0, 2, 8, 10, 4, 6, 12, 14])
        od = ir.Constant(ir.VectorType(_I32, 8), [1, 3, 9, 11, 5, 7, 13, 15])

        def hadd(a, b):  # type: ignore[no-untyped-def]
            return builder.fadd(
                builder.shuffle_vector(a, b, ev), builder.shuffle_vector(a, b, od), flags=("fast",)
            )

        t = hadd(hadd(args[2], args[3]), hadd(args[4], args[5]))
        lo = builder.shuffle_vector(t, t, ir.Constant(ir.VectorType(_I32, 4), [0, 1, 2, 3]))
        hi = builder.shuffle_vector(t, t, ir.Constant(ir.VectorType(_I32, 4), [4, 5, 6, 7]))
        ptr = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V4)
        builder.store(builder.fadd(lo, hi, flags=("fast",)), ptr, align=4)
        return context.get_dummy_value()

    return types.void(arr, idx, a0, a1, a2, a3), cg


#: keys per block of ``attn_group_f16x8``: four rows converted at once, four accumulators per query row
KB = 4

#: keys per sub-block of ``attn_group_f16x8``: its scores stay in L1 and its K and V rows of all kv heads in L2
#: (the first kv head's pass prefetches whole rows; the running max is updated per sub-block)
SB = 128


@njit(inline="always")
def _all_used(mask, has_mask, T, j0, n):
    """Whether keys ``j0 .. j0 + n - 1`` are each unmasked for at least one of the ``T`` query rows."""
    if not has_mask:
        return True
    ninf = np.float32(-np.inf)
    for j in range(j0, j0 + n):
        used = False
        for t in range(T):
            if mask[t, j] != ninf:
                used = True
        if not used:
            return False
    return True


@njit(inline="always")
def _used_end(mask, has_mask, T, b0, nb):
    """One past the last key of ``b0 .. b0 + nb - 1`` that some query row sees (``nb`` without a mask; 0
    when every key is masked): the keys after it are masked for every row."""
    if not has_mask:
        return nb
    ninf = np.float32(-np.inf)
    for jj in range(nb - 1, -1, -1):
        for t in range(T):
            if mask[t, b0 + jj] != ninf:
                return jj + 1
    return 0


@njit(inline="always")
def _widen_block(src, kb, j, kh, row, D, KV):
    """Keys ``j .. j + KB`` of kv head ``kh`` from the F16 cache ``src`` (half bits, rows of ``row``) widened
    into ``kb`` (``KB`` rows of ``D``); kv head 0 prefetches the whole rows ``PF_KEYS`` ahead (the other
    heads' parts are read next)."""
    for c in range(KB):
        if kh == 0 and j + c + PF_KEYS < KV:
            for i in range(0, row, 32):
                prefetch(src, (j + c + PF_KEYS) * row + i)
        o = (j + c) * row + kh * D
        for i in range(0, D, 8):
            vstore(kb, c * D + i, vh8(src, o + i))


@njit(parallel=True, cache=True, fastmath=FAST_KEEP_INF, error_model="numpy")
def attn_group_f16x8(q, k, v, mask, has_mask, scale, cap, slopes, out, Hkv, D, n_chunks):
    """Arguments as ``attn_heads_f16x8`` plus ``n_chunks`` (``group_chunks``): a task is one chunk of keys; in
    each sub-block of it, each kv head in turn with all ``g`` query heads of its group (and all ``T`` rows) at
    once, so each cached K/V row is read and widened once per group instead of once per query head
    (grouped-query attention). Keys go in blocks of ``KB`` rows widened into a float scratch (``KB``
    accumulators per query row, one load of ``q`` per block), in sub-blocks of ``SB`` keys with a running
    max (flash attention); chunks are merged as in ``attn_split``. Masked keys are never read; a fully
    masked row gives zeros. Its only parallel region is the loop over the chunks (``_fill``)."""
    T, H, _ = q.shape
    KV = k.shape[0] // (Hkv * D)
    g = H // Hkv
    R = T * g  # query rows of a task: (t, head of the group)
    row = Hkv * D
    ninf = np.float32(-np.inf)
    csz = (KV + n_chunks - 1) // n_chunks
    n_tasks = Hkv * n_chunks
    pm = _fill(np.empty((n_tasks, R), np.float32), ninf)  # running max of each chunk
    ps = _fill(np.empty((n_tasks, R), np.float32), _F0)  # sum of exp(score - max)
    pa = _fill(np.empty((n_tasks, R * D), np.float32), _F0)  # sum of exp(score - max) * v
    qall = np.empty((Hkv, R * D), np.float32)  # each group's query rows, contiguous
    for kh in range(Hkv):
        for t in range(T):
            for hi in range(g):
                for i in range(D):
                    qall[kh, (t * g + hi) * D + i] = q[t, kh * g + hi, i]
    for ci in prange(n_chunks):
        j0 = ci * csz
        j1 = min(KV, j0 + csz)
        s = np.empty(R * SB, np.float32)
        kb = np.empty(KB * D, np.float32)
        for b0 in range(j0, j1, SB):
            nb = min(SB, j1 - b0)
            # keys from ``nu`` on are masked for every row (a short context's padded view): their dots and
            # values are never read and their scores are -inf, as the per-key checks below would find,
            # without those checks (the exp sum still runs over all ``nb``: its order stays the same)
            nu = _used_end(mask, has_mask, T, b0, nb)
            for kh in range(Hkv):  # all kv heads of a sub-block in turn: its cache rows are read in order
                task = kh * n_chunks + ci
                qs = qall[kh]
                acc = pa[task]
                # raw q.k dots; a key no row sees gets 0 (never read) and -inf from its mask below
                jj = 0
                while jj < nu:
                    j = b0 + jj
                    if jj + KB <= nu and _all_used(mask, has_mask, T, j, KB):
                        _widen_block(k, kb, j, kh, row, D, KV)
                        r = 0
                        while (
                            r + 1 < R
                        ):  # two query rows at a time: each widened K vector loaded once for both
                            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
                            c0, c1, c2, c3 = vzero(), vzero(), vzero(), vzero()
                            for i in range(0, D, 8):
                                qv = vload(qs, r * D + i)
                                qw = vload(qs, (r + 1) * D + i)
                                x = vload(kb, i)
                                a0 = vfma(a0, qv, x)
                                c0 = vfma(c0, qw, x)
                                x = vload(kb, D + i)
                                a1 = vfma(a1, qv, x)
                                c1 = vfma(c1, qw, x)
                                x = vload(kb, 2 * D + i)
                                a2 = vfma(a2, qv, x)
                                c2 = vfma(c2, qw, x)
                                x = vload(kb, 3 * D + i)
                                a3 = vfma(a3, qv, x)
                                c3 = vfma(c3, qw, x)
                            vstore_hsum4(s, r * SB + jj, a0, a1, a2, a3)
                            vstore_hsum4(s, (r + 1) * SB + jj, c0, c1, c2, c3)
                            r += 2
                        if r < R:
                            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
                            for i in range(0, D, 8):
                                qv = vload(qs, r * D + i)
                                a0 = vfma(a0, qv, vload(kb, i))
                                a1 = vfma(a1, qv, vload(kb, D + i))
                                a2 = vfma(a2, qv, vload(kb, 2 * D + i))
                                a3 = vfma(a3, qv, vload(kb, 3 * D + i))
                            vstore_hsum4(s, r * SB + jj, a0, a1, a2, a3)
                        jj += KB
                        continue
                    if _all_used(mask, has_mask, T, j, 1):
                        ko = j * row + kh * D
                        for i in range(0, D, 8):
                            vstore(kb, i, vh8(k, ko + i))
                        for r in range(R):
                            a0 = vzero()
                            for i in range(0, D, 8):
                                a0 = vfma(a0, vload(qs, r * D + i), vload(kb, i))
                            s[r * SB + jj] = vhsum(a0)
                    else:
                        for r in range(R):
                            s[r * SB + jj] = _F0
                    jj += 1
                # scores, the running max, exp(score - max) in place, and the accumulators rescaled
                for r in range(R):
                    t = r // g
                    h = kh * g + r % g
                    mx = ninf
                    for jj in range(nu, nb):
                        s[r * SB + jj] = ninf
                    for jj in range(nu):
                        m = mask[t, b0 + jj] if has_mask else _F0
                        d = _score(s[r * SB + jj], scale, cap, has_mask, slopes[h], m)
                        if has_mask and m == ninf:
                            d = ninf
                        s[r * SB + jj] = d
                        mx = max(mx, d)
                    old = pm[task, r]
                    new = max(old, mx)
                    if new == ninf:
                        for jj in range(nb):
                            s[r * SB + jj] = _F0
                        continue
                    if new > old and old != ninf:
                        f = fexp(old - new)
                        ps[task, r] *= f
                        vf = vsplat(f)
                        for i in range(0, D, 8):
                            vstore(acc, r * D + i, vmul(vload(acc, r * D + i), vf))
                    pm[task, r] = new
                    tot = _F0
                    for jj in range(nb):
                        d = s[r * SB + jj]
                        p = _F0 if d == ninf else fexp(d - new)
                        s[r * SB + jj] = p
                        tot += p
                    ps[task, r] += tot
                # weighted values: each V row widened once for the group
                jj = 0
                while jj < nu:
                    j = b0 + jj
                    if jj + KB <= nu and _all_used(mask, has_mask, T, j, KB):
                        _widen_block(v, kb, j, kh, row, D, KV)
                        r = 0
                        while (
                            r + 1 < R
                        ):  # two query rows at a time: each widened V vector loaded once for both
                            p0 = vsplat(s[r * SB + jj])
                            p1 = vsplat(s[r * SB + jj + 1])
                            p2 = vsplat(s[r * SB + jj + 2])
                            p3 = vsplat(s[r * SB + jj + 3])
                            w0 = vsplat(s[(r + 1) * SB + jj])
                            w1 = vsplat(s[(r + 1) * SB + jj + 1])
                            w2 = vsplat(s[(r + 1) * SB + jj + 2])
                            w3 = vsplat(s[(r + 1) * SB + jj + 3])
                            for i in range(0, D, 8):
                                x = vload(kb, i)
                                a = vfma(vload(acc, r * D + i), p0, x)
                                b = vfma(vload(acc, (r + 1) * D + i), w0, x)
                                x = vload(kb, D + i)
                                a = vfma(a, p1, x)
                                b = vfma(b, w1, x)
                                x = vload(kb, 2 * D + i)
                                a = vfma(a, p2, x)
                                b = vfma(b, w2, x)
                                x = vload(kb, 3 * D + i)
                                vstore(acc, r * D + i, vfma(a, p3, x))
                                vstore(acc, (r + 1) * D + i, vfma(b, w3, x))
                            r += 2
                        if r < R:
                            p0 = vsplat(s[r * SB + jj])
                            p1 = vsplat(s[r * SB + jj + 1])
                            p2 = vsplat(s[r * SB + jj + 2])
                            p3 = vsplat(s[r * SB + jj + 3])
                            for i in range(0, D, 8):
                                a = vfma(vload(acc, r * D + i), p0, vload(kb, i))
                                a = vfma(a, p1, vload(kb, D + i))
                                a = vfma(a, p2, vload(kb, 2 * D + i))
                                vstore(acc, r * D + i, vfma(a, p3, vload(kb, 3 * D + i)))
                        jj += KB
                        continue
                    if _all_used(mask, has_mask, T, j, 1):
                        vo = j * row + kh * D
                        for i in range(0, D, 8):
                            vstore(kb, i, vh8(v, vo + i))
                        for r in range(R):
                            p0 = vsplat(s[r * SB + jj])
                            for i in range(0, D, 8):
                                vstore(acc, r * D + i, vfma(vload(acc, r * D + i), p0, vload(kb, i)))
                    jj += 1
    # merge the chunks (serial: a few vector sums per query row)
    for h in range(H):
        kh = h // g
        hi = h % g
        for t in range(T):
            r = t * g + hi
            m = ninf
            for c in range(n_chunks):
                m = max(m, pm[kh * n_chunks + c, r])
            for i in range(D):
                out[t, h, i] = _F0
            if m == ninf:
                continue
            tot = _F0
            for c in range(n_chunks):
                task = kh * n_chunks + c
                mc = pm[task, r]
                if mc == ninf:
                    continue
                w = fexp(mc - m)
                tot += w * ps[task, r]
                for i in range(D):
                    out[t, h, i] += w * pa[task, r * D + i]
            inv = _F1 / tot
            for i in range(D):
                out[t, h, i] *= inv
