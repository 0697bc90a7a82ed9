"""CPU steps of the recurrent ops (kernels in ``ssm_kernels``); they register into the backend's
compiler table when ``backend`` imports this module.

A recurrent state written back with ``cpy`` into a view of the memory's buffer (``RSInputs.write`` when
a ubatch's streams own consecutive slots: a decode step) is not copied: ``state_writes`` (from the
backend's ``begin_graph``) finds those ``cpy`` nodes, and the op's step writes its new state straight into
the buffer (updating it in place when the op read a view of the same rows); the ``cpy`` then has no step.

A Gated DeltaNet layer's small ops are fused (``fusions``, also from ``begin_graph``; ``FUSE``): the conv
input's ``concat``, ``ssm_conv``, its ``silu`` and the conv state's ``cpy`` run as one step; the delta
rule's step makes its own inputs (l2-normed q and k, v, the decay and beta); ``mul(a, silu(z))`` is one
step. The fused steps do the same float operations as the ops one by one (byte-identical results).

``gated_delta_net`` runs token by token in Numba (parallel over sequences x heads) for decode and
prompts alike. The chunked form (``ssm_reference.delta_rule_chunked`` in float32: matrix products per
chunk, as llama.cpp's chunked graph) is kept behind ``CHUNK_MIN_TOKENS`` but off: on the CPU it does about
twice the FLOPs and runs on one thread, and measured in the graph of a Qwen3.5-0.8B-shaped model (2
threads, pp512, 18 delta-rule layers) it took 1.4 s of the prompt against 0.3 s token by token (pp512
118-149 -> 218-235 t/s; benchmarks/results/qwen35.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..._dataclass import dataclass
from ..backend import ArrayMap, Step
from ..graph import Graph
from ..ssm_reference import delta_rule_chunked
from ..tensor import Tensor
from ..types import GGMLType
from .backend import CPUBackend, _compiler

#: tokens per sequence from which a ubatch takes the chunked delta rule; None: never (the default)
CHUNK_MIN_TOKENS: int | None = None
CHUNK = 64

#: False: every op its own step (tests compare the fused steps with these, byte for byte)
FUSE = True

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


@dataclass(frozen=True)
class _GDNPrologue:
    """The ops that make a ``gated_delta_net``'s inputs in Qwen3.5's graph, computed by its step instead:
    ``q = scale(l2_norm(view conv))``, ``k = l2_norm(view conv)``, ``v = cont(view conv)``, ``g =
    softplus(alpha + bias) * a``, ``beta = sigmoid(b)``."""

    conv: Tensor
    eps_q: float
    sq: float
    eps_k: float
    alpha: Tensor
    bias: Tensor
    a: Tensor
    b: Tensor


def _under_reshapes(t: Tensor) -> Tensor:
    while t.op == "reshape":
        t = t.src[0]
    return t


def _match_gdn(n: Tensor, only: Callable[..., bool]) -> tuple[_GDNPrologue, list[Tensor]] | None:
    """(the prologue, the nodes it replaces) when ``n``'s inputs come from Qwen3.5's ops, else None."""
    n_s, n_t, hv, dv = n.src[2].shape
    hk, dk = n.src[0].shape[2:]
    sc, l2k, cv = n.src[0], n.src[1], n.src[2]
    if not (only(sc, "scale") and sc.params.get("bias", 0.0) == 0.0 and only(l2k, "l2_norm")):
        return None
    l2q = sc.src[0]
    if not (only(l2q, "l2_norm") and only(cv, "cont")):
        return None
    views = (l2q.src[0], l2k.src[0], cv.src[0])
    conv = views[0].src[0] if views[0].op == "view" and views[0].src else None
    if conv is None or conv.type != GGMLType.F32 or not conv.is_contiguous() or conv.ndim != 3:
        return None
    ch = conv.shape[-1]
    if conv.shape != (n_s, n_t, ch) or ch != 2 * hk * dk + hv * dv:
        return None
    for vw, off, nh, hd in zip(views, (0, hk * dk, 2 * hk * dk), (hk, hk, hv), (dk, dk, dv), strict=True):
        if (
            vw.op != "view"
            or vw.src[0] is not conv
            or vw.offset - conv.offset != 4 * off
            or vw.shape != (n_s, n_t, nh, hd)
            or vw.strides != (n_t * ch * 4, ch * 4, hd * 4, 4)
        ):
            return None
    mul, sig = _under_reshapes(n.src[3]), _under_reshapes(n.src[4])
    if not (only(mul, "mul") and only(sig, "sigmoid")):
        return None
    sp, a = mul.src
    if not only(sp, "softplus") or not only(sp.src[0], "add"):
        return None
    alpha, bias = sp.src[0].src
    b = sig.src[0]
    T = n_s * n_t
    if (
        any(t.type != GGMLType.F32 for t in (alpha, bias, a, b))
        or alpha.n_elements != T * hv
        or b.n_elements != T * hv
        or bias.shape != (hv,)
        or a.shape != (hv,)
        or alpha.shape[-1] != hv
        or b.shape[-1] != hv
    ):
        return None
    fz = _GDNPrologue(
        conv, float(l2q.params["eps"]), float(sc.params["s"]), float(l2k.params["eps"]), alpha, bias, a, b
    )
    return fz, [sc, l2q, l2k, cv, mul, sp, sp.src[0], sig]


@dataclass(frozen=True)
class _ConvIn:
    """``silu(ssm_conv(concat(state, x)))`` whose conv input's last K-1 rows are ``cpy``-ed back as the
    new conv state: one step reads ``state`` and ``x`` and writes the output and the state (``concat``,
    ``ssm_conv`` and the ``cpy`` have no step)."""

    conv: Tensor
    state: Tensor
    x: Tensor
    write: Tensor


def _match_conv_in(c: Tensor, only: Callable[..., bool], users: dict[int, list[Tensor]]) -> _ConvIn | None:
    sx = c.src[0]
    if not only(sx, "concat", 2) or int(sx.params["axis"]) != 1 or sx.ndim != 3:
        return None
    state, x = sx.src
    n_s, n_t, ch = c.shape
    km = sx.shape[1] - n_t
    if state.shape != (n_s, km, ch) or x.shape != (n_s, n_t, ch) or km != c.src[1].shape[1] - 1 or km < 1:
        return None
    if any(t.type != GGMLType.F32 for t in (state, x)):
        return None
    last = [u for u in users.get(id(sx), []) if u is not c]
    if len(last) != 1 or last[0].op != "view":
        return None
    v = last[0]  # the last K-1 rows of each stream (the step computes them; the view's layout is not read)
    if (
        v.shape != (n_s, km, ch)
        or v.strides != sx.strides
        or v.offset - sx.offset != 4 * n_t * ch
        or len(users.get(id(v), [])) != 1
    ):
        return None
    w = users[id(v)][0]
    if w.op != "cpy" or w.type != GGMLType.F32 or not w.is_contiguous() or w.n_elements != v.n_elements:
        return None
    return _ConvIn(c, state, x, w)


def fusions(graph: Graph | None, nodes: list[Tensor] | None) -> tuple[set[int], dict[int, object], dict]:
    """(ids of nodes with no step, ``id(node) -> fusion`` for the steps that compute them, extra inputs
    per fused node for the planner). ``silu(ssm_conv)``: the silu's step runs the conv (``ssm_conv`` has
    no step; with the conv input's ``concat`` and the conv state's ``cpy`` too where they are Qwen3.5's,
    ``_ConvIn``); ``gated_delta_net`` of Qwen3.5: its step makes q, k, v, g, beta (``_GDNPrologue``);
    ``mul(a, silu(z))``: one step (the gated norm's gate). Only nodes of this backend whose results
    nothing else reads (and no graph output) are taken over."""
    skip: set[int] = set()
    fused: dict[int, object] = {}
    extra: dict[int, list[Tensor]] = {}
    if not FUSE or graph is None or nodes is None:
        return skip, fused, extra
    mine = {id(n) for n in nodes}
    users: dict[int, list[Tensor]] = {}
    for n in graph.nodes:
        for s in n.src:
            users.setdefault(id(s), []).append(n)

    def only(t: Tensor, op: str, n_users: int = 1) -> bool:  # computed here, read once, not an output, F32
        return (
            t.op == op
            and id(t) in mine
            and id(t) not in skip
            and id(t) not in fused
            and len(users.get(id(t), ())) == n_users
            and not graph.is_output(t)
            and t.type == GGMLType.F32
        )

    for n in nodes:
        if n.op == "silu" and only(n.src[0], "ssm_conv") and n.shape == n.src[0].shape and n.is_contiguous():
            c = n.src[0]
            skip.add(id(c))
            ci = _match_conv_in(c, only, users)
            if ci is not None:
                skip.update((id(c.src[0]), id(ci.write)))
                fused[id(n)] = ci
                extra[id(n)] = [ci.state, ci.x, c.src[1]]
            else:
                fused[id(n)] = c
                extra[id(n)] = [c.src[0], c.src[1]]
        elif n.op == "gated_delta_net" and n.src[0].shape[2:] == n.src[1].shape[2:]:
            m = _match_gdn(n, only)
            if m is not None:
                fz, gone = m
                skip.update(id(t) for t in gone)
                fused[id(n)] = fz
                extra[id(n)] = [fz.conv, fz.alpha, fz.bias, fz.a, fz.b]
        elif (
            n.op == "mul"
            and id(n) in mine
            and n.type == GGMLType.F32
            and n.is_contiguous()
            and only(n.src[1], "silu")
            and n.src[1].src[0].op != "ssm_conv"
            and n.src[0].op != "rms_norm"
            and n.src[0].shape == n.src[1].shape == n.shape
            and n.src[0].type == n.src[1].src[0].type == GGMLType.F32
        ):
            skip.add(id(n.src[1]))
            fused[id(n)] = n.src[1]
            extra[id(n)] = [n.src[1].src[0]]
    return skip, fused, extra


def fused_step(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    """The step of a node ``fusions`` named (None: not one of them)."""
    fz = be._ssm_fused.get(id(node))
    if fz is None:
        return None
    if isinstance(fz, _ConvIn):
        return _conv_in_step(be, node, arrays, fz)
    if node.op == "silu":
        return _ssm_conv(be, fz, arrays, out_node=node)  # type: ignore[arg-type]
    if node.op == "mul":
        return _silu_mul_step(be, node, arrays, fz)  # type: ignore[arg-type]
    return _gated_delta_net(be, node, arrays)


def _conv_in_step(be: CPUBackend, node: Tensor, arrays: ArrayMap, fz: _ConvIn) -> Step:
    n_s, n_t, ch = node.shape
    km = fz.state.shape[1]
    state, x, c = arrays[id(fz.state)], arrays[id(fz.x)], arrays[id(fz.conv.src[1])]
    out = arrays[id(node)].reshape(n_s, n_t, ch)
    dst = arrays[id(fz.write)].reshape(n_s, km, ch)
    kern = _kern().conv_state_silu
    be.need(kern)
    ct = _conv_kernel_t(fz.conv.src[1], c)
    return lambda: kern(_c32(state), _c32(x), ct(), out, dst)


def _silu_mul_step(be: CPUBackend, node: Tensor, arrays: ArrayMap, silu: Tensor) -> Step:
    d = node.shape[-1]
    a, z = arrays[id(node.src[0])], arrays[id(silu.src[0])]
    out = arrays[id(node)].reshape(-1, d)
    kern = _kern().silu_mul_rows
    be.need(kern)
    return lambda: kern(_c32(z).reshape(-1, d), _c32(a).reshape(-1, d), out)


def _gdn_prologue(
    be: CPUBackend, node: Tensor, arrays: ArrayMap, fz: _GDNPrologue
) -> tuple[Step, tuple[np.ndarray, ...]]:
    """The prologue's step and the arrays it fills (q, k, v, g, beta, shaped as the op reads them)."""
    n_s, n_t, hv, dv = node.src[2].shape
    hk, dk = node.src[0].shape[2:]
    T = n_s * n_t
    conv = arrays[id(fz.conv)].reshape(T, -1)
    alpha, bias, a, b = (arrays[id(t)] for t in (fz.alpha, fz.bias, fz.a, fz.b))
    q = be.scratch("gdn_q", (T, hk, dk))
    k = be.scratch("gdn_k", (T, hk, dk))
    v = be.scratch("gdn_v", (T, hv, dv))
    g = be.scratch("gdn_g", (T, hv))
    beta = be.scratch("gdn_beta", (T, hv))
    kern = _kern().gdn_prep
    be.need(kern)
    eq, sq, ek = fz.eps_q, np.float32(fz.sq), fz.eps_k

    def prep() -> None:
        kern(conv, hk, dk, hv, eq, sq, ek, _c32(alpha).reshape(T, hv), _c32(bias), _c32(a),
             _c32(b).reshape(T, hv), q, k, v, g, beta)  # fmt: skip

    shaped = (
        q.reshape(n_s, n_t, hk, dk),
        k.reshape(n_s, n_t, hk, dk),
        v.reshape(n_s, n_t, hv, dv),
        g.reshape(n_s, n_t, hv),
        beta.reshape(n_s, n_t, hv),
    )
    return prep, shaped


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
def _ssm_conv(be: CPUBackend, node: Tensor, arrays: ArrayMap, out_node: Tensor | None = None) -> Step | None:
    """``ssm_conv``, or (``out_node``: its one consumer ``silu``, see ``fusions``) ``silu(ssm_conv)``."""
    sx, c = arrays[id(node.src[0])], arrays[id(node.src[1])]
    out = arrays[id(out_node if out_node is not None else node)].reshape(node.shape)
    silu = out_node is not None
    kern = _kern().ssm_conv_rows
    be.need(kern)
    ct = _conv_kernel_t(node.src[1], c)
    return lambda: kern(_c32(sx), ct(), out, silu)


def _conv_kernel_t(t: Tensor, c: np.ndarray) -> Callable[[], np.ndarray]:
    """The conv kernel ``c [C, K]`` transposed to ``[K, C]`` (channels innermost): once for a weight, at
    each call for anything else."""
    if t.op == "weight":
        ct = np.ascontiguousarray(c.T, dtype=np.float32)
        return lambda: ct
    return lambda: np.ascontiguousarray(c.T, dtype=np.float32)


@_compiler("gated_delta_net")
def _gated_delta_net(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    q, k, v, g, beta, st = (arrays[id(s)] for s in node.src)
    out = arrays[id(node)]
    n_s, n_t, n_h, d = node.src[2].shape
    ny = n_s * n_t * n_h * d
    y = out[:ny].reshape(n_s, n_t, n_h, d)
    sout = _state_out(be, node, arrays, out[ny:].reshape(n_s, n_h, d, d))
    fz = be._ssm_fused.get(id(node))
    prep: Step | None = None
    if isinstance(fz, _GDNPrologue):
        prep, (q, k, v, g, beta) = _gdn_prologue(be, node, arrays, fz)
    if CHUNK_MIN_TOKENS is not None and n_t >= CHUNK_MIN_TOKENS:

        def step_chunked() -> None:
            if prep is not None:
                prep()
            yc, m = delta_rule_chunked(q, k, v, g, beta, st, chunk=CHUNK, dtype=np.float32)
            y[...] = yc
            sout[...] = m

        return step_chunked
    kern = _kern().gdn_recurrent
    be.need(kern)
    if prep is not None:

        def step_fused() -> None:
            prep()
            kern(q, k, v, g, beta, _c32(st), y, sout)

        return step_fused

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
