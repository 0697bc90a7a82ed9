"""CPU steps of the recurrent ops (kernels in ``ssm_kernels``); they register into the backend's
compiler table when ``backend`` imports this module.

``gated_delta_net`` runs token by token in Numba (parallel over sequences x heads) for decode and
prompts alike. The chunked form (``ssm_reference.delta_rule_chunked`` in float32: matrix products per
chunk, as llama.cpp's chunked graph) is kept behind ``CHUNK_MIN_TOKENS`` but off: on the CPU it does about
twice the FLOPs and runs on one thread, and measured in the graph of a Qwen3.5-0.8B-shaped model (2
threads, pp512, 18 delta-rule layers) it took 1.4 s of the prompt against 0.3 s token by token (pp512
118-149 -> 218-235 t/s; benchmarks/results/qwen35.md).
"""

from __future__ import annotations

import numpy as np

from ..backend import ArrayMap, Step
from ..ssm_reference import delta_rule_chunked
from ..tensor import Tensor
from .backend import CPUBackend, _compiler

#: tokens per sequence from which a ubatch takes the chunked delta rule; None: never (the default)
CHUNK_MIN_TOKENS: int | None = None
CHUNK = 64

_ACT = {"sigmoid": 0, "softplus": 1, "l2_norm": 2}


def _kern():  # type: ignore[no-untyped-def]
    from . import ssm_kernels

    return ssm_kernels


def _c32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


@_compiler(*_ACT)
def _act(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    A, out = arrays[id(node.src[0])], arrays[id(node)]
    if A.ndim == 0 or out.ndim == 0:
        return None
    kern = _kern().act_rows
    be.need(kern)
    kind = _ACT[node.op]
    eps = float(node.params.get("eps", 0.0))
    d = A.shape[-1]
    o2 = out.reshape(-1, d)

    def step() -> None:
        kern(_c32(A).reshape(-1, d), kind, eps, o2)

    return step


@_compiler("ssm_conv")
def _ssm_conv(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    sx, c, out = arrays[id(node.src[0])], arrays[id(node.src[1])], arrays[id(node)]
    kern = _kern().ssm_conv_rows
    be.need(kern)
    return lambda: kern(_c32(sx), _c32(c), out)


@_compiler("gated_delta_net")
def _gated_delta_net(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    q, k, v, g, beta, st = (arrays[id(s)] for s in node.src)
    out = arrays[id(node)]
    n_s, n_t, n_h, d = node.src[2].shape
    ny = n_s * n_t * n_h * d
    y = out[:ny].reshape(n_s, n_t, n_h, d)
    sout = out[ny:].reshape(n_s, n_h, d, d)
    if CHUNK_MIN_TOKENS is not None and n_t >= CHUNK_MIN_TOKENS:

        def step_chunked() -> None:
            yc, m = delta_rule_chunked(q, k, v, g, beta, st, chunk=CHUNK, dtype=np.float32)
            y[...] = yc
            sout[...] = m

        return step_chunked
    kern = _kern().gdn_recurrent
    be.need(kern)

    def step() -> None:
        kern(_c32(q), _c32(k), _c32(v), _c32(g), _c32(beta), _c32(st), y, sout)

    return step


@_compiler("ssm_scan")
def _ssm_scan(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    s0, x, dt, a, b, c = (arrays[id(s)] for s in node.src)
    out = arrays[id(node)]
    n_s, n_h, p, n = node.src[0].shape
    n_t = node.src[1].shape[1]
    ny = n_s * n_t * n_h * p
    y = out[:ny].reshape(n_s, n_t, n_h, p)
    sout = out[ny:].reshape(n_s, n_h, p, n)
    kern = _kern().ssm_scan_rows
    be.need(kern)

    def step() -> None:
        kern(_c32(s0), _c32(x), _c32(dt), _c32(a).reshape(n_h, -1), _c32(b), _c32(c), y, sout)

    return step
