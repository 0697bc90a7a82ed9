"""The scheduler: assigns each node a backend, splits the graph, plans memory, runs the splits.

The first ``compute`` of a ``Graph`` builds its plan: backend assignment, splits, one arena placed by
liveness (``alloc.plan_graph``), NumPy views of every tensor over it, and one precompiled step per node.
Computing the same ``Graph`` object again only copies the new inputs in and walks the steps.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field

import numpy as np

from .._dataclass import dataclass
from .alloc import Plan, array_of, owner_bytes, plan_graph
from .backend import Backend, ComputeError
from .graph import Graph
from .tensor import INPLACE_OPS, GraphError, Tensor

__all__ = ["Scheduler", "Split", "default_backends"]


def default_backends(n_threads: int | None = None) -> list[Backend]:
    """The CPU backend when it is available, else the NumPy reference backend."""
    try:
        from .cpu.backend import CPUBackend
    except ImportError:  # pragma: no cover
        from .numpy_backend import NumpyBackend

        return [NumpyBackend()]
    return [CPUBackend(n_threads)]


@dataclass
class Split:
    """Consecutive graph nodes that one backend runs."""

    backend: Backend
    nodes: list[Tensor] = field(default_factory=list)


@dataclass
class _Compiled:
    """A graph's plan, arena, arrays, splits and steps, kept for the next compute of the same graph."""

    plan: Plan
    arena: np.ndarray
    arrays: dict[int, np.ndarray]
    splits: list[Split]
    steps: list[Callable[[], None]]
    inputs: dict[int, np.ndarray]
    readable: set[int]
    fresh: bool = True


@dataclass
class _SplitInfo:
    """What a device backend's ``compile_split`` needs: the host plan and arena (it mirrors them), the
    node -> backend map, the owners read by other backends or as outputs, and per-graph state."""

    plan: Plan
    arena: np.ndarray
    arrays: dict[int, np.ndarray]
    where: dict[int, Backend]
    read_elsewhere: set[int]
    host_writes: set[int] = field(default_factory=set)  # owners a host backend writes in place
    state: dict = field(default_factory=dict)


def _read_elsewhere(graph: Graph, where: dict[int, Backend]) -> set[int]:
    """Ids of owners read by a host backend's node (or that are graph outputs): a device split that
    produces one copies it back to the host arena."""
    out = {id(t.owner) for t in graph.outputs}
    for n in graph.nodes:
        b = where[id(n)]
        if b.host:
            out.update(id(s.owner) for s in n.src)
            if n.owner is not n:
                out.add(id(n.owner))
    return out


class Scheduler:
    """Runs graphs over one or more backends (earlier backends are preferred).

    ``compute(graph, {input: array})`` then ``get(tensor)`` for the graph's outputs (and leaves).
    ``set_backend(tensor, backend)`` pins a node, or a weight (its users follow it), to a backend.
    """

    def __init__(
        self, backends: Sequence[Backend] | Backend | None = None, n_threads: int | None = None
    ) -> None:
        if backends is None:
            backends = default_backends(n_threads)
        elif isinstance(backends, Backend):
            backends = [backends]
        self.backends: list[Backend] = list(backends)
        if not self.backends:
            raise GraphError("Scheduler: no backends")
        for b in self.backends:
            if not b.host and not hasattr(b, "compile_split"):
                raise GraphError(f"Scheduler: device backend {b!r} has no compile_split")
        if not self.backends[0].host:
            raise GraphError("Scheduler: the first backend must be a host backend (it holds the arena)")
        self._devices = any(not b.host for b in self.backends)
        self._pinned: dict[int, Backend] = {}
        self._cache: weakref.WeakKeyDictionary[Graph, _Compiled] = weakref.WeakKeyDictionary()
        self._last: _Compiled | None = None

    # -- assignment ---------------------------------------------------------------------------------
    def add_backend(self, backend: Backend) -> None:
        """Add a backend after the others (a device backend joining the CPU: ``n_gpu_layers``)."""
        if not backend.host and not hasattr(backend, "compile_split"):
            raise GraphError(f"Scheduler: device backend {backend!r} has no compile_split")
        self.backends.append(backend)
        self._devices = self._devices or not backend.host
        self._cache = weakref.WeakKeyDictionary()

    def set_backend(self, t: Tensor, backend: Backend) -> None:
        if backend not in self.backends:
            raise GraphError(f"set_backend: {backend!r} is not one of this scheduler's backends")
        self._pinned[id(t)] = backend

    def _assign(self, graph: Graph) -> dict[int, Backend]:
        where: dict[int, Backend] = {}
        if len(self.backends) == 1 and not self._pinned:  # one backend: every node is its (a decode's 800)
            b = self.backends[0]
            for node in graph.nodes:
                if not b.supports_op(node):
                    raise GraphError(f"no backend supports {node!r}")
                where[id(node)] = b
            return where
        for t in graph.leafs:
            if id(t) in self._pinned:
                where[id(t)] = self._pinned[id(t)]
        for node in graph.nodes:
            b = self._pinned.get(id(node))
            if b is None:
                # weights first, then the inputs' backends, then the first backend that can
                cands = [where[id(s.owner)] for s in node.src if s.owner.is_leaf and id(s.owner) in where]
                # a device backend's result pulls its consumers along (llama.cpp's "expand" passes)
                cands += [where[id(s)] for s in node.src if not s.is_leaf and not where[id(s)].host]
                cands += [where[id(s)] for s in node.src if not s.is_leaf and id(s) in where]
                cands += self.backends
                b = next((c for c in cands if c.supports_op(node)), None)
            if b is None or not b.supports_op(node):
                raise GraphError(f"no backend supports {node!r}")
            where[id(node)] = b
        return where

    # -- planning -----------------------------------------------------------------------------------
    def _compile(self, graph: Graph) -> _Compiled:
        where = self._assign(graph)
        splits: list[Split] = []
        for node in graph.nodes:
            b = where[id(node)]
            if not splits or splits[-1].backend is not b:
                splits.append(Split(b))
            splits[-1].nodes.append(node)
        extra: dict[int, list[Tensor]] = {}
        for b in self.backends:
            hook = getattr(b, "begin_graph", None)
            if hook is not None:  # the backend may fuse nodes; it then names the inputs it reads later
                for k, v in (
                    hook(graph, [n for sp in splits if sp.backend is b for n in sp.nodes]) or {}
                ).items():
                    extra.setdefault(k, []).extend(v)
        plan = plan_graph(graph, extra)
        arena = self.backends[0].alloc_buffer(plan.size)
        arrays: dict[int, np.ndarray] = {}
        for t in graph.order:
            mem = owner_bytes(t.owner, arena, plan)
            arrays[id(t)] = array_of(t, mem)
        steps: list[Callable[[], None]] = []
        info = None
        if self._devices:
            info = _SplitInfo(plan, arena, arrays, where, _read_elsewhere(graph, where))
            info.host_writes = {id(n.owner) for n in graph.nodes if where[id(n)].host and n.op in INPLACE_OPS}
        for sp in splits:
            if not sp.backend.host:  # a device backend runs a whole split as one step (copies included)
                steps.append(sp.backend.compile_split(sp.nodes, info))
                continue
            pre = getattr(sp.backend, "begin_split", None)
            if pre is not None:
                steps.append(pre)
            for node in sp.nodes:
                s = sp.backend.compile(node, arrays)
                if s is not None:
                    steps.append(s)
        for b in self.backends:
            hook = getattr(b, "end_graph", None)
            if hook is not None:
                hook()
        readable = {id(t) for t in graph.outputs} | {id(t) for t in graph.leafs}
        inputs = {id(t): arrays[id(t)] for t in graph.inputs}
        return _Compiled(plan, arena, arrays, splits, steps, inputs, readable)

    def plan(self, graph: Graph) -> Plan:
        """The memory plan of ``graph`` (built now if it was not computed yet)."""
        c = self._cache.get(graph)
        if c is None:
            c = self._cache[graph] = self._compile(graph)
        return c.plan

    def splits(self, graph: Graph) -> list[Split]:
        c = self._cache.get(graph)
        if c is None:
            c = self._cache[graph] = self._compile(graph)
        return c.splits

    # -- running ------------------------------------------------------------------------------------
    def compute(self, graph: Graph, inputs: Mapping[Tensor, np.ndarray] | None = None) -> None:
        """Write ``inputs`` into the graph's input tensors and run it (reusing its plan if it ran before)."""
        c = self._cache.get(graph)
        if c is None:
            c = self._cache[graph] = self._compile(graph)
        inputs = inputs or {}
        for t, v in inputs.items():
            dst = c.inputs.get(id(t))
            if dst is None:
                raise ComputeError(f"compute: {t!r} is not an input of this graph")
            v = np.asarray(v)
            if v.shape != dst.shape:
                raise ComputeError(
                    f"compute: input {t.name or t.op!r} has shape {v.shape}, the graph needs {dst.shape}"
                )
            try:
                np.copyto(dst, v, casting="same_kind")
            except TypeError as e:
                raise ComputeError(f"compute: input {t.name or t.op!r}: {e}") from None
        if c.fresh:
            given = {id(x) for x in inputs}
            missing = [t.name or repr(t) for t in graph.inputs if id(t) not in given]
            if missing:
                raise ComputeError(f"compute: first run of this graph needs every input; missing {missing}")
            c.fresh = False
        for s in c.steps:
            s()
        self._last = c

    def get(self, t: Tensor) -> np.ndarray:
        """A copy of an output (or leaf) of the last computed graph holding ``t``: float types as their
        NumPy dtype, block types as ``uint8[..., row_bytes]``."""
        c = self._last
        if c is None or id(t) not in c.arrays:
            c = next((x for x in self._cache.values() if id(t) in x.arrays), None)
        if c is None:
            raise ComputeError(f"get: {t!r} is not part of a computed graph")
        if id(t) not in c.readable:
            raise ComputeError(f"get: {t!r} is not an output of its graph (its memory may be reused)")
        return np.array(c.arrays[id(t)], copy=True)

    def view(self, t: Tensor) -> np.ndarray:
        """Like ``get`` but without the copy: valid until the next compute."""
        c = self._last
        if c is None or id(t) not in c.arrays or id(t) not in c.readable:
            return self.get(t)
        return c.arrays[id(t)]
