"""The small ops of a softmax-gated MoE layer as two steps (llama.cpp's CUDA backend fuses the same
``topk-moe`` pattern): the router and the experts' weighted sum, as ``model.blocks.build_moe_ffn`` makes them.

- Router: ``top_k(soft_max(logits))`` with the chosen probabilities gathered by ``mul_mat_id`` of the
  one-hot experts and, where the model normalizes them, ``div(w, sum_rows(w))``: the ``top_k`` step
  computes the ids and the weights (``moe_router_kernels.route_softmax_topk``) into a buffer of its own;
  the weights' node (the ``div``, else the gather) copies them into its array when its turn comes (the
  graph's order puts the experts' mat-muls between the two, so that node's memory is not yet its own at
  the ``top_k``). ``soft_max``, the gather and ``sum_rows`` have no step.
- Weighted sum: ``sum_rows(cont(permute(mul(y, w))))`` (``y`` the experts' outputs ``[T, U, N]``, ``w``
  their weights ``[T, U, 1]``) as one step (``weighted_sum``); the ``mul`` and ``cont`` have no step.

In a decode these were eight NumPy calls a layer, ~0.3 ms in flow on the shared 2-core VM (each one's code
and data come back from memory after the experts' kernels stream megabytes; ``benchmarks/results/
moe_router.md``). Only nodes of this backend whose results nothing else reads (no graph output, no
watched node) are taken over. The weights and ids are those of the op-by-op steps (the gather, the
normalization and the weighted sum in the same arithmetic; the softmax here sums its exponentials in
float64, where ``soft_max``'s step works in float32: closer to exact, the last bit may differ).
``LLAMAPY_MOE_FUSE=0`` (or ``FUSE = False``): the op-by-op steps.
"""

from __future__ import annotations

import os
from dataclasses import field
from typing import TYPE_CHECKING

import numpy as np

from ..._dataclass import dataclass
from ..tensor import Tensor
from ..types import GGMLType

if TYPE_CHECKING:
    from ..backend import ArrayMap, Step
    from ..graph import Graph
    from .backend import CPUBackend

__all__ = ["FUSE", "fused_step", "fusions"]

#: fuse the router's and the weighted sum's small ops (``LLAMAPY_MOE_FUSE=0``: no)
FUSE = os.environ.get("LLAMAPY_MOE_FUSE", "1") not in ("0", "false", "no", "off")

F32 = GGMLType.F32


@dataclass(eq=False)
class _Route:
    """A router: ``top_k`` ``ids`` of ``soft_max`` ``probs`` of ``logits``, weights gathered with
    ``onehot``, normalized where ``norm``; ``sink``: the node whose array the weights go to."""

    ids: Tensor
    probs: Tensor
    onehot: Tensor
    sink: Tensor
    norm: bool
    buf: np.ndarray | None = field(default=None, repr=False)


@dataclass(eq=False)
class _WSum:
    """``sum_rows`` of the experts' outputs ``y`` times their weights ``w``."""

    y: Tensor
    w: Tensor


def fusions(graph: Graph | None, nodes: list[Tensor] | None) -> tuple[set[int], dict[int, object], dict]:
    """(ids of nodes with no step, ``id(node) -> fusion`` for the steps that compute them, extra inputs
    per fused node for the planner's liveness)."""
    skip: set[int] = set()
    fused: dict[int, object] = {}
    extra: dict[int, list[Tensor]] = {}
    if not FUSE or graph is None or nodes is None:
        return skip, fused, extra
    f = _Find(graph, nodes, skip, fused)
    for n in nodes:
        if n.op == "top_k" and f.ours(n):
            r = f.route(n)
            if r is not None:
                gone, route = r
                skip.update(id(t) for t in gone)
                fused[id(n)] = fused[id(route.sink)] = route
                extra[id(n)] = [route.probs.src[0], route.onehot]
        elif n.op == "sum_rows" and f.ours(n) and n.ndim == 3 and n.type == F32:
            w = f.wsum(n)
            if w is not None:
                skip.update((id(n.src[0]), id(n.src[0].src[0].src[0])))
                fused[id(n)] = w
                extra[id(n)] = [w.y, w.w]
    return skip, fused, extra


class _Find:
    """The patterns among the nodes of this backend (``mine``), with each node's readers."""

    def __init__(self, graph: Graph, nodes: list[Tensor], skip: set[int], fused: dict[int, object]) -> None:
        self.graph, self.skip, self.fused = graph, skip, fused
        self.mine = {id(n) for n in nodes}
        self.users: dict[int, list[Tensor]] = {}
        for n in graph.nodes:
            for s in n.src:
                self.users.setdefault(id(s), []).append(n)

    def use(self, t: Tensor) -> list[Tensor]:
        return self.users.get(id(t), [])

    def ours(self, t: Tensor) -> bool:
        return id(t) in self.mine and id(t) not in self.skip and id(t) not in self.fused

    def inner(self, t: Tensor, op: str, n_users: int = 1) -> bool:
        """``t`` is an F32 ``op`` node of ours that ``n_users`` nodes read and no one else (no output)."""
        return (
            t.op == op
            and t.type == F32
            and self.ours(t)
            and len(self.use(t)) == n_users
            and not self.graph.is_output(t)
        )

    def only_view(self, t: Tensor, shape: tuple[int, ...]) -> Tensor | None:
        """``t`` if it is a reshape to ``shape`` that one node reads (no output), else None."""
        ok = t.op == "reshape" and t.shape == shape and len(self.use(t)) == 1
        return t if ok and not self.graph.is_output(t) else None

    def route(self, n: Tensor) -> tuple[list[Tensor], _Route] | None:
        """The router around the ``top_k`` ``n``: (the nodes with no step, the fusion), or None."""
        probs = n.src[0]
        if not self.inner(probs, "soft_max", 2) or len(probs.src) != 1 or probs.ndim != 2:
            return None
        logits = probs.src[0]
        if logits.type != F32 or logits.shape != probs.shape or probs.params.get("sinks"):
            return None
        T, E = probs.shape
        k = n.shape[-1]
        rs = next((u for u in self.use(probs) if u is not n), None)
        if rs is None or self.only_view(rs, (T, 1, E)) is None:
            return None
        gather = self.use(rs)[0]
        if (
            gather.op != "mul_mat_id"
            or gather.type != F32
            or not self.ours(gather)
            or gather.shape != (T, k, 1)
        ):
            return None
        onehot = gather.src[0]
        if (
            gather.src[1] is not rs
            or gather.src[2] is not n
            or onehot.type != F32
            or onehot.shape != (E, 1, E)
        ):
            return None
        sr, div = self._norm(gather, T, k)
        if div is not None:
            return [probs, gather, sr], _Route(n, probs, onehot, div, True)
        return [probs], _Route(n, probs, onehot, gather, False)

    def _norm(self, gather: Tensor, T: int, k: int) -> tuple[Tensor | None, Tensor | None]:
        """(``sum_rows``, ``div``) of ``div(w, reshape(sum_rows(reshape(w))))`` on the gathered weights
        ``w``, or (None, None)."""
        gu = self.use(gather)
        if len(gu) != 2 or self.graph.is_output(gather):
            return None, None
        rg = next((u for u in gu if u.op == "reshape"), None)
        div = next((u for u in gu if u.op == "div"), None)
        if rg is None or div is None or self.only_view(rg, (T, k)) is None:
            return None, None
        sr = self.use(rg)[0]
        if not self.inner(sr, "sum_rows"):
            return None, None
        rsr = self.only_view(self.use(sr)[0], (T, 1, 1))
        ok = (
            rsr is not None
            and self.use(rsr)[0] is div
            and div.src[0] is gather
            and div.src[1] is rsr
            and div.type == F32
            and div.shape == (T, k, 1)
            and self.ours(div)
        )
        return (sr, div) if ok else (None, None)

    def wsum(self, n: Tensor) -> _WSum | None:
        """``sum_rows(cont(permute(mul(y, w), (0, 2, 1))))`` at ``n``, or None."""
        c = n.src[0]
        if not self.inner(c, "cont") or c.src[0].op != "permute":
            return None
        p = c.src[0]
        m = p.src[0]
        if len(self.use(p)) != 1 or self.graph.is_output(p) or not self.inner(m, "mul"):
            return None
        if m.ndim != 3 or not m.is_contiguous():
            return None
        T, U, N = m.shape
        if (
            p.shape != (T, N, U)
            or p.strides != (m.strides[0], m.strides[2], m.strides[1])
            or n.shape != (T, N, 1)
        ):
            return None
        a, b = m.src
        if a.shape == (T, U, 1) and b.shape == (T, U, N):
            a, b = b, a
        if a.shape != (T, U, N) or b.shape != (T, U, 1) or a.type != F32 or b.type != F32:
            return None
        return _WSum(a, b)


def fused_step(be: CPUBackend, node: Tensor, arrays: ArrayMap) -> Step | None:
    """The step of a node ``fusions`` named: the router's ``top_k`` (ids and weights), the weights' node
    (their copy), the weighted sum's ``sum_rows``."""
    from . import moe_router_kernels as mr

    fz = be._moe_fused[id(node)]
    if isinstance(fz, _WSum):
        y, w = arrays[id(fz.y)], arrays[id(fz.w)][..., 0]
        out = arrays[id(node)][..., 0]
        kern = mr.weighted_sum
        be.need(kern)
        return lambda: kern(y, w, out)
    assert isinstance(fz, _Route)
    if node is fz.ids:
        logits = arrays[id(fz.probs.src[0])]
        onehot = arrays[id(fz.onehot)]
        ids = arrays[id(node)]
        T, k = ids.shape
        fz.buf = buf = np.empty((T, k), np.float32)
        scale = np.float32(fz.probs.params.get("scale", 1.0))
        norm = fz.norm
        kern = mr.route_softmax_topk
        be.need(kern)
        return lambda: kern(logits, scale, onehot, k, norm, ids, buf)
    buf = fz.buf
    if buf is None:
        raise RuntimeError("moe_steps: the router's weights node compiled before its top_k")
    out = arrays[id(node)].reshape(buf.shape)
    return lambda: np.copyto(out, buf)
