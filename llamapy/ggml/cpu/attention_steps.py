"""CPU backend steps for ``flash_attn_ext``: decode (a few query rows) in one Numba kernel over the
F16 cache read in place, prompts through ``blas.attention`` (sgemm in the shared thread pool), and a
NumPy path for everything else. Registered into ``backend``'s compiler table on import."""

from __future__ import annotations

import numpy as np

from ..backend import ArrayMap, Step
from ..ops import alibi_slopes
from ..tensor import Tensor
from ..types import GGMLType
from .backend import ATTN_SMALL_MAX_TOKENS, CPUBackend, _compiler, _threads

_NO_MASK = np.zeros((1, 1), np.float32)  # a typed placeholder for kernels when there is no mask


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
    # gpt-oss's per-head sink logits (src 4, after the mask): only the NumPy path below takes them
    sinks = arrays[id(node.src[4])].reshape(Hkv, g, 1, 1) if p.get("sinks") else None
    small = (
        T <= ATTN_SMALL_MAX_TOKENS
        and Q.dtype == np.float32
        and (mask is None or mask.dtype == np.float32)
        and sinks is None
    )
    if small:
        # decode: query heads in parallel (or, with fewer heads than threads, chunks of keys per kv
        # head), only the unmasked keys read; an F16 cache as its half bits in place (no conversion)
        from .attn_decode import (
            attn_group_f16x8,
            attn_heads,
            attn_heads_f16x8,
            attn_split,
            group_chunks,
            n_chunks_for,
            use_group,
            use_split,
        )
        from .plan_steps import attn_group_step

        has_mask = mask is not None
        mk_ = mask if has_mask else _NO_MASK
        sl = alibi_slopes(H, p["max_bias"])
        nth = _threads(be)
        split = use_split(H, nth)
        nch = n_chunks_for(KV, Hkv, nth)
        if k.type == GGMLType.F16 and v.type == GGMLType.F16:
            K16, V16 = arrays[id(k)].view(np.uint16), arrays[id(v)].view(np.uint16)
            vec = D == Dv and D % 8 == 0 and K16.flags.c_contiguous and V16.flags.c_contiguous
            if vec and Q.flags.c_contiguous and use_group(H, Hkv, KV):
                # grouped-query heads together: each cached row read and widened once per group
                be.need(attn_group_f16x8)
                kf, vf = K16.reshape(-1), V16.reshape(-1)
                gch = group_chunks(KV, nth)
                args = (Q, kf, vf, mk_, has_mask, scale, cap, sl, out, Hkv, D)
                short = attn_group_step(attn_group_f16x8, args, KV, Hkv * D, gch, be.need)  # short context
                if short is not None:
                    return short
                return lambda: attn_group_f16x8(Q, kf, vf, mk_, has_mask, scale, cap, sl, out, Hkv, D, gch)
            if not split and vec and Q.flags.c_contiguous:
                be.need(attn_heads_f16x8)
                kf, vf = K16.reshape(-1), V16.reshape(-1)
                return lambda: attn_heads_f16x8(Q, kf, vf, mk_, has_mask, scale, cap, sl, out, Hkv, D)
            K, V, kconv, vconv = K16, V16, None, None
        else:
            K, kconv = _kv_converter(be, k, arrays[id(k)], "fa_k")
            V, vconv = _kv_converter(be, v, arrays[id(v)], "fa_v")
        be.need(attn_split if split else attn_heads)

        def step_small() -> None:
            if kconv is not None:
                kconv()
            if vconv is not None:
                vconv()
            if split:
                attn_split(Q, K, V, mk_, has_mask, scale, cap, sl, out, nch)
            else:
                attn_heads(Q, K, V, mk_, has_mask, scale, cap, sl, out)

        return step_small
    Kf, kconv = _kv_converter(be, k, arrays[id(k)], "fa_k")
    Vf, vconv = _kv_converter(be, v, arrays[id(v)], "fa_v")
    slopes = alibi_slopes(H, p["max_bias"]).reshape(Hkv, g, 1, 1) if p["max_bias"] > 0 else None
    from . import blas

    if (
        blas.attention_supported(Q, Kf, Vf, out)
        and (mask is None or (mask.dtype == np.float32 and mask.shape == (T, KV)))
        and sinks is None
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
    red4 = red.reshape(Hkv, g, T, 1)
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
        if sinks is not None:
            np.maximum(red4, sinks, out=red4)
        red[~np.isfinite(red)] = 0.0
        np.subtract(S, red, out=S)
        np.exp(S, out=S)
        if sinks is not None:  # exp(sink - max) joins the denominator
            np.subtract(sinks, red4, out=red4)
            np.exp(red4, out=red4)
            np.add(red, np.sum(S, axis=-1, keepdims=True), out=red)
        else:
            np.sum(S, axis=-1, keepdims=True, out=red)
        red[red == 0] = 1.0
        np.divide(S, red, out=S)
        np.matmul(S, Vf.transpose(1, 0, 2), out=O)
        np.copyto(out4, O.reshape(Hkv, g, T, Dv).transpose(2, 0, 1, 3))

    return step
