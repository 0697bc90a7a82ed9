"""Element-wise, row and layout kernels: binary/unary ops, GLU, norms, softmax, rope, get_rows,
set_rows, cpy/cont. One thread per output element (or row), grid-stride loops.

Operands are ``(buffer views, byte offset, shape4, byte strides4)``: shapes padded to 4 axes in front,
NumPy order. ``err`` is a small int32 device array: a kernel that meets a bad index writes
``err[0] = 1`` and ``err[1] = the bad value`` and the backend raises after the split.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .dequant import dq, idx4, off4, off4b

# unary op codes
SCALE, SILU, GELU, GELU_QUICK, TANH, RELU, SOFTCAP = range(7)
UNARY = {"scale": SCALE, "silu": SILU, "gelu": GELU, "gelu_quick": GELU_QUICK, "tanh": TANH, "relu": RELU}
UNARY["softcap"] = SOFTCAP
BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3}
GLU = {"swiglu": 0, "geglu": 1, "swiglu_oai": 2}

GELU_COEF_A = 0.044715
SQRT_2_OVER_PI = 0.7978845608028654


@cuda.jit(device=True)
def _gelu(x):
    return 0.5 * x * (1.0 + math.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))


@cuda.jit(device=True)
def _silu(x):
    return x / (1.0 + math.exp(-x))


@cuda.jit(cache=True)
def binary_k(op, n, a, ao, ash, ast, b, bo, bsh, bst, o, oo, osh, ost):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        i0, i1, i2, i3 = idx4(i, osh)
        x = a[(ao + off4b(i0, i1, i2, i3, ash, ast)) // 4]
        y = b[(bo + off4b(i0, i1, i2, i3, bsh, bst)) // 4]
        if op == 0:
            r = x + y
        elif op == 1:
            r = x - y
        elif op == 2:
            r = x * y
        else:
            r = x / y
        o[(oo + off4(i0, i1, i2, i3, ost)) // 4] = r


@cuda.jit(cache=True)
def unary_k(op, p0, p1, n, a, ao, ash, ast, o, oo, osh, ost):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        i0, i1, i2, i3 = idx4(i, osh)
        x = np.float64(a[(ao + off4(i0, i1, i2, i3, ast)) // 4])
        if op == 0:
            r = x * p0 + p1
        elif op == 1:
            r = _silu(x)
        elif op == 2:
            r = _gelu(x)
        elif op == 3:
            r = x / (1.0 + math.exp(-1.702 * x))
        elif op == 4:
            r = math.tanh(x)
        elif op == 5:
            r = x if x > 0 else 0.0
        else:
            r = p0 * math.tanh(x / p0)
        o[(oo + off4(i0, i1, i2, i3, ost)) // 4] = r


@cuda.jit(cache=True)
def glu_k(op, alpha, limit, n, a, ao, ast, b, bo, bst, o, oo, osh, ost):
    """swiglu (0), geglu (1), gpt-oss's clamped swiglu_oai (2: ``alpha``, ``limit``)."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        i0, i1, i2, i3 = idx4(i, osh)
        x = np.float64(a[(ao + off4(i0, i1, i2, i3, ast)) // 4])
        y = np.float64(b[(bo + off4(i0, i1, i2, i3, bst)) // 4])
        if op == 0:
            r = _silu(x) * y
        elif op == 1:
            r = _gelu(x) * y
        else:
            x = min(x, limit)
            y = min(max(y, -limit), limit)
            r = x / (1.0 + math.exp(-alpha * x)) * (y + 1.0)
        o[(oo + off4(i0, i1, i2, i3, ost)) // 4] = r


@cuda.jit(cache=True)
def add_id_k(n, E, a, ao, ash, ast, b, bo, bst, ids, io, ist, o, oo, ost, err):
    """``o[t, u] = a[t, u] + b[ids[t, u]]`` (a per-expert bias)."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        _, t, u, k = idx4(i, ash)
        e = ids[(io + t * ist[2] + u * ist[3]) // 4]
        if e < 0 or e >= E:
            err[0] = 2
            err[1] = e
            continue
        x = a[(ao + off4(0, t, u, k, ast)) // 4] + b[(bo + e * bst[2] + k * bst[3]) // 4]
        o[(oo + off4(0, t, u, k, ost)) // 4] = x


@cuda.jit(cache=True)
def norm_k(rms, eps, nrows, a, ao, ash, ast, o, oo, ost):
    """rms_norm (``rms``) or norm over the last axis; one thread per row."""
    ncol = ash[3]
    for r in range(cuda.grid(1), nrows, cuda.gridsize(1)):
        i0, i1, i2, _ = idx4(r * ncol, ash)
        base = ao + off4(i0, i1, i2, 0, ast)
        mean = 0.0
        if not rms:
            for k in range(ncol):
                mean += a[(base + k * ast[3]) // 4]
            mean /= ncol
        var = 0.0
        for k in range(ncol):
            d = a[(base + k * ast[3]) // 4] - mean
            var += d * d
        inv = 1.0 / math.sqrt(var / ncol + eps)
        ob = oo + off4(i0, i1, i2, 0, ost)
        for k in range(ncol):
            o[(ob + k * ost[3]) // 4] = (a[(base + k * ast[3]) // 4] - mean) * inv


@cuda.jit(cache=True)
def soft_max_k(
    scale, nrows, a, ao, ash, ast, mt, m8, m16, m32, mo, msh, mst, o, oo, ost, slopes, us, sinks, uk
):
    """softmax(scale * a + slope * mask) over the last axis; ``mt`` < 0: no mask (else its type code);
    ``us``: ALiBi slopes per head (axis -3), ``uk``: one sink logit per head joins the normalization."""
    ncol = ash[3]
    for r in range(cuda.grid(1), nrows, cuda.gridsize(1)):
        i0, i1, i2, _ = idx4(r * ncol, ash)
        base = ao + off4(i0, i1, i2, 0, ast)
        mb = mo + off4b(i0, i1, i2, 0, msh, mst)
        slope = np.float64(slopes[i1]) if us else 1.0
        mx = np.float64(sinks[i1]) if uk else -math.inf
        for k in range(ncol):
            x = np.float64(a[(base + k * ast[3]) // 4]) * scale
            if mt >= 0:
                x += slope * dq(mt, m8, m16, m32, mb, k, mst[3])
            mx = max(mx, x)
        s = math.exp(np.float64(sinks[i1]) - mx) if uk else 0.0
        ob = oo + off4(i0, i1, i2, 0, ost)
        for k in range(ncol):
            x = np.float64(a[(base + k * ast[3]) // 4]) * scale
            if mt >= 0:
                x += slope * dq(mt, m8, m16, m32, mb, k, mst[3])
            e = math.exp(x - mx)
            s += e
            o[(ob + k * ost[3]) // 4] = e
        for k in range(ncol):
            o[(ob + k * ost[3]) // 4] = o[(ob + k * ost[3]) // 4] / s


@cuda.jit(cache=True)
def rope_k(
    neox, n_dims, base, fs, ext, low, high, mscale, n, a, ao, ash, ast, pos, po, ff, use_ff, o, oo, ost,
    msec, mmode, pos4,
):  # fmt: skip
    """rope over ``a[T, H, D]`` (ash[0] == 1); pairs (2i, 2i+1), or (i, i + n_dims/2) when ``neox``."""
    half = n_dims // 2
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        _, t, hh, d = idx4(e, ash)
        src = ao + off4(0, t, hh, 0, ast)
        dst = (oo + off4(0, t, hh, d, ost)) // 4
        if d >= n_dims:
            o[dst] = a[(src + d * ast[3]) // 4]
            continue
        i = (d % half) if neox else d // 2
        if neox:
            x0 = np.float64(a[(src + i * ast[3]) // 4])
            x1 = np.float64(a[(src + (i + half) * ast[3]) // 4])
            first = d < half
        else:
            x0 = np.float64(a[(src + 2 * i * ast[3]) // 4])
            x1 = np.float64(a[(src + (2 * i + 1) * ast[3]) // 4])
            first = d % 2 == 0
        p = pos[po // 4 + t]
        if mmode != 0:  # mrope (1) / imrope (2): each dim pair takes its section's position
            sector = i % (msec[0] + msec[1] + msec[2] + msec[3])
            if mmode == 2:
                w = 3
                if sector % 3 == 0 and sector < 3 * msec[0]:
                    w = 0
                elif sector % 3 == 1 and sector < 3 * msec[1]:
                    w = 1
                elif sector % 3 == 2 and sector < 3 * msec[2]:
                    w = 2
            else:
                w = (
                    0
                    if sector < msec[0]
                    else 1
                    if sector < msec[0] + msec[1]
                    else 2
                    if sector < msec[0] + msec[1] + msec[2]
                    else 3
                )
            if pos4:
                p = pos[po // 4 + w * ash[1] + t]
        th_e = np.float64(p) * base ** (-2.0 * i / n_dims)
        if use_ff:
            th_e = th_e / ff[i]
        th = fs * th_e
        if ext != 0.0:
            y = (i - low) / max(0.001, high - low)
            ramp = (1.0 - min(1.0, max(0.0, y))) * ext
            th = th * (1.0 - ramp) + th_e * ramp
        c = math.cos(th) * mscale
        s = math.sin(th) * mscale
        o[dst] = x0 * c - x1 * s if first else x0 * s + x1 * c


@cuda.jit(cache=True)
def get_rows_k(t, n, ncol, a8, a16, a32, ao, ars, ids, io, iw, nrows, o, oo, ors, err):
    """``o[r] = a[ids[r]]`` as F32 (``iw``: 4 or 8-byte ids)."""
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = e // ncol
        k = e % ncol
        row = ids[io // 4 + r] if iw == 4 else ids[io // 4 + 2 * r]  # little-endian low word of I64
        if row < 0 or row >= nrows:
            err[0] = 1
            err[1] = row
            continue
        o[(oo + r * ors) // 4 + k] = dq(t, a8, a16, a32, ao + row * ars, k, 4 if t == 0 else 2)


@cuda.jit(cache=True)
def copy_k(st_, n, s8, s16, s32, so, ssh, sst, dt, d16, d32, do, dsh, dst_, err):
    """Element-wise copy in logical order from any readable type into F32/F16 (cpy, cont, set_rows)."""
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        i0, i1, i2, i3 = idx4(e, ssh)
        v = dq(st_, s8, s16, s32, so + off4(i0, i1, i2, 0, sst), i3, sst[3])
        j0, j1, j2, j3 = idx4(e, dsh)
        off = do + off4(j0, j1, j2, j3, dst_)
        if dt == 0:
            d32[off // 4] = v
        else:
            d16[off // 2] = np.float16(v)


@cuda.jit(cache=True)
def set_rows_k(n, ncol, s32, so, srs, sst, idx, io, iw, nrows, dt, d16, d32, do, drs, dst_, err):
    """``dst[idx[r], k] = src[r, k]`` converted to F32/F16."""
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = e // ncol
        k = e % ncol
        row = idx[io // 4 + r] if iw == 4 else idx[io // 4 + 2 * r]
        if row < 0 or row >= nrows:
            err[0] = 1
            err[1] = row
            continue
        v = s32[(so + r * srs + k * sst) // 4]
        off = do + row * drs + k * dst_
        if dt == 0:
            d32[off // 4] = v
        else:
            d16[off // 2] = np.float16(v)
