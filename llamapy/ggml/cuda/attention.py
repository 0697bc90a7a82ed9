"""flash_attn_ext over the KV cache (F16/F32/Q8_0/Q4_0 K and V read through ``dq``): one thread per
(query row, head) with an online softmax (running max and sum, output rescaled in place), so decode and
prompt share one kernel. Causal masking and sliding windows come in through the mask (0 / -inf), soft-
capping through ``softcap``, attention sinks through ``sinks`` (one extra logit per head)."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .dequant import dq, idx4, off4


@cuda.jit(cache=True)
def flash_attn_k(
    n, D, Dv, KV, g, scale, softcap,
    q, qo, qsh, qst,
    kt, k8, k16, k32, ko, kst,
    vt, v8, v16, v32, vo, vst,
    mt, m8, m16, m32, mo, mst,
    use_sinks, sinks, so,
    o, oo, ost,
    slopes, use_slopes,
):  # fmt: skip
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        _, t, hh, _ = idx4(e * qsh[3], qsh)
        hk = hh // g
        qr = qo + off4(0, t, hh, 0, qst)
        orow = oo + off4(0, t, hh, 0, ost)
        for d in range(Dv):
            o[orow // 4 + d] = 0.0
        mx = -math.inf
        den = 0.0
        if use_sinks:
            mx = np.float64(sinks[so // 4 + hh])
            den = 1.0
        for j in range(KV):
            kr = ko + j * kst[1] + hk * kst[2]
            s = 0.0
            for d in range(D):
                s += np.float64(q[(qr + d * qst[3]) // 4]) * dq(kt, k8, k16, k32, kr, d, kst[3])
            s *= scale
            if softcap != 0.0:
                s = softcap * math.tanh(s / softcap)
            if mt >= 0:
                sl = np.float64(slopes[hh]) if use_slopes else 1.0
                s += sl * dq(mt, m8, m16, m32, mo + t * mst[2], j, mst[3])
            if s == -math.inf:
                continue
            if s > mx:
                c = math.exp(mx - s) if mx != -math.inf else 0.0
                den *= c
                for d in range(Dv):
                    o[orow // 4 + d] = o[orow // 4 + d] * c
                mx = s
            p = math.exp(s - mx)
            den += p
            vr = vo + j * vst[1] + hk * vst[2]
            for d in range(Dv):
                o[orow // 4 + d] = o[orow // 4 + d] + p * dq(vt, v8, v16, v32, vr, d, vst[3])
        inv = 1.0 / den if den != 0.0 else 1.0
        for d in range(Dv):
            o[orow // 4 + d] = o[orow // 4 + d] * inv
