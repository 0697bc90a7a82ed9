"""Buffer planning by liveness, and turning planned tensors into NumPy arrays.

Every op result that owns memory gets a byte range in one arena; a range is handed back once the last
node reading it (directly or through a view) has run, and later results reuse it. Graph outputs and
inputs are never reused before the end of a compute. Weights and persistent buffers own their data.
"""

from __future__ import annotations

import bisect
from dataclasses import field

import numpy as np

from .._dataclass import dataclass
from .graph import Graph
from .tensor import GraphError, Tensor
from .types import TRAITS

ALIGN = 64

__all__ = ["Plan", "plan_graph", "array_of", "owner_bytes"]


@dataclass
class Plan:
    """``offsets[id(t)]``: byte offset in the arena of each tensor that owns planned memory."""

    size: int
    offsets: dict[int, int] = field(default_factory=dict)
    naive_size: int = 0  # the sum of all planned tensors (what no reuse would take)

    def __repr__(self) -> str:
        return f"Plan(size={self.size} bytes, without reuse {self.naive_size} bytes)"


class _Allocator:
    def __init__(self) -> None:
        self.free: list[tuple[int, int]] = []  # (offset, size), sorted by offset
        self.top = 0

    def alloc(self, n: int) -> int:
        n = max(ALIGN, -(-n // ALIGN) * ALIGN)
        best = -1
        for i, (_, sz) in enumerate(self.free):
            if sz >= n and (best < 0 or sz < self.free[best][1]):
                best = i
        if best >= 0:
            off, sz = self.free.pop(best)
            if sz > n:
                bisect.insort(self.free, (off + n, sz - n))
            return off
        if self.free and self.free[-1][0] + self.free[-1][1] == self.top:  # grow the last free block
            off, _ = self.free.pop()
            self.top = off + n
            return off
        off = self.top
        self.top += n
        return off

    def release(self, off: int, n: int) -> None:
        n = max(ALIGN, -(-n // ALIGN) * ALIGN)
        bisect.insort(self.free, (off, n))
        merged: list[tuple[int, int]] = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged


def _owns_planned(t: Tensor) -> bool:
    return t.view_src is None and t.data is None


def plan_graph(graph: Graph, extra_uses: dict[int, list[Tensor]] | None = None) -> Plan:
    """Place every planned tensor (op results owning memory, and inputs) in one arena by liveness.

    ``extra_uses[id(node)]`` lists tensors a node reads beyond its sources (a backend fusing two
    nodes reads the first one's inputs when it runs the second): they stay alive until it ran."""
    extra_uses = extra_uses or {}
    order = graph.order
    last: dict[int, int] = {}  # id(owner) -> position of the last node using it (positions only grow)
    end = len(order)
    for i, t in enumerate(order):
        last[id(t.owner)] = i
        for s in t.src:
            last[id(s.owner)] = i
        for s in extra_uses.get(id(t), ()):
            last[id(s.owner)] = i
    for t in graph.outputs:
        last[id(t.owner)] = end
    for t in graph.inputs:
        last[id(t)] = end  # inputs are written before the compute starts; keep them whole
    frees: dict[int, list[Tensor]] = {}
    by_id = {id(t): t for t in order}
    for tid, i in last.items():
        t = by_id.get(tid)
        if t is not None and _owns_planned(t) and i < end:
            frees.setdefault(i, []).append(t)
    a = _Allocator()
    plan = Plan(0)
    for t in graph.inputs:
        plan.offsets[id(t)] = a.alloc(t.nbytes)
        plan.naive_size += t.nbytes
    for i, t in enumerate(order):
        if _owns_planned(t) and t.op != "input":
            plan.offsets[id(t)] = a.alloc(t.nbytes)
            plan.naive_size += t.nbytes
        for f in frees.get(i, ()):
            a.release(plan.offsets[id(f)], f.nbytes)
    plan.size = a.top
    return plan


def owner_bytes(t: Tensor, arena: np.ndarray, plan: Plan) -> np.ndarray:
    """The flat ``uint8`` memory of a tensor that owns memory (leaf data or its arena range)."""
    if t.data is not None:
        d = t.data
        if not d.flags.c_contiguous:
            raise GraphError(f"{t.name or t.op}: data is not contiguous")
        return d.reshape(-1).view(np.uint8)
    off = plan.offsets.get(id(t))
    if off is None:
        raise GraphError(f"{t.name or t.op}: not placed by the planner (is it part of the graph?)")
    return arena[off : off + t.nbytes]


def array_of(t: Tensor, mem: np.ndarray) -> np.ndarray:
    """A NumPy view of tensor ``t`` over its owner's flat bytes ``mem``: typed for plain types, and
    ``uint8[..., row_bytes]`` for block types. Writable when ``mem`` is."""
    tr = TRAITS[t.type]
    if tr.block_size > 1:
        shape = t.shape[:-1] + (t.shape[-1] // tr.block_size * tr.type_size,)
        strides = t.strides[:-1] + (1,)
        dtype = np.dtype(np.uint8)
    else:
        dtype = tr.dtype if tr.dtype is not None else np.dtype("<u2")  # BF16 as raw uint16
        shape, strides = t.shape, t.strides
    return np.ndarray(shape, dtype=dtype, buffer=mem, offset=t.offset, strides=strides)
