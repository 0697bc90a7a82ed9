"""CPU steps of the recurrent ops (kernels in ``ssm_kernels``); they register into the backend's
compiler table when ``backend`` imports this module.

A recurrent state written back with ``cpy`` into a view of the memory's buffer (``RSInputs.write`` when
a ubatch's streams own consecutive slots: a decode step) is not copied: ``state_writes`` (from the
backend's ``begin_graph``) finds those ``cpy`` nodes, and the op's step writes its new state straight into
the buffer (updating it in place when the op read a view of the same rows); the ``cpy`` then has no step.

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
from ..graph import Graph
from ..ssm_reference import delta_rule_chunked
from ..tensor import Tensor
from ..types import GGMLType
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


_STATE_OPS = ("gated_delta_net", "ssm_scan")


def _state_elems(op: Tensor) -> int:
    st = op.src[0] if op.op == "ssm_scan" else op.src[5]
    return st.n_elements


def state_writes(graph: Graph | None, nodes: list[Tensor] | None) -> dict[int, Tensor]:
    """``id(op) -> cpy``: the ``cpy`` nodes among ``nodes`` that copy the whole final state of a
    ``gated_delta_net`` / ``ssm_scan`` (a contiguous view of its result's tail, read by nothing else)
    into a contiguous F32 destination; the op's step may write its state there instead."""
    found: dict[int, Tensor] = {}
    if graph is None or nodes is None:
        return found
    mine = {id(n) for n in nodes}
    users: dict[int, list[Tensor]] = {}
    for n in graph.nodes:
        for s in n.src:
            users.setdefault(id(s), []).append(n)
    for n in nodes:
        if n.op != "cpy" or n.type != GGMLType.F32 or not n.is_contiguous():
            continue
        v = n.src[0]
        if v.op != "view" or not v.src or v.src[0].op not in _STATE_OPS or not v.is_contiguous():
            continue
        op = v.src[0]
        ny = op.n_elements - _state_elems(op)
        if (
            id(op) not in mine
            or graph.is_output(op)
            or graph.is_output(v)
            or v.n_elements != op.n_elements - ny
            or v.offset - op.offset != 4 * ny
            or [id(u) for u in users.get(id(v), [])] != [id(n)]
        ):
            continue
        # every other reader of the op reads its outputs only (a contiguous view before the state)
        others = [u for u in users.get(id(op), []) if u is not v]
        if all(
            u.op in ("view", "reshape") and u.is_contiguous() and u.offset - op.offset + u.nbytes <= 4 * ny
            for u in others
        ):
            found[id(op)] = n
    return found


def _state_out(be: CPUBackend, node: Tensor, arrays: ArrayMap, sout: np.ndarray) -> np.ndarray:
    """Where the op's step writes its final state: the buffer of a ``state_writes`` cpy (which then has no
    step), else ``sout``."""
    w = be._state_writes.get(id(node))
    if w is None:
        return sout
    dst = arrays[id(w)]
    if dst.dtype == np.float32 and dst.flags.c_contiguous and dst.size == sout.size:
        be._state_cpys.add(id(w))
        return dst.reshape(sout.shape)
    return sout


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


@_compiler("concat")
def _concat(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    """F32 ``concat`` straight into the result (the conv input: a stream's conv state, then its tokens)."""
    A, B, out = arrays[id(node.src[0])], arrays[id(node.src[1])], arrays[id(node)]
    if not (A.dtype == B.dtype == out.dtype == np.float32):
        return None
    ax = int(node.params["axis"])
    return lambda: np.concatenate((A, B), axis=ax, out=out)


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
    sout = _state_out(be, node, arrays, out[ny:].reshape(n_s, n_h, d, d))
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
    sout = _state_out(be, node, arrays, out[ny:].reshape(n_s, n_h, p, n))
    kern = _kern().ssm_scan_rows
    be.need(kern)

    def step() -> None:
        kern(_c32(s0), _c32(x), _c32(dt), _c32(a).reshape(n_h, -1), _c32(b), _c32(c), y, sout)

    return step
