"""The compute graph: nodes reachable from the outputs, in topological order."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .tensor import GraphError, Tensor

__all__ = ["Graph"]


class Graph:
    """Built by expanding from ``outputs``. ``nodes`` are the op nodes in execution order (views
    included, leaves excluded); ``leafs`` are weights, buffers and inputs; ``inputs`` are the leaves
    created with ``new_tensor`` (filled before each compute); ``outputs`` are readable after compute.

    A scheduler that computed a ``Graph`` once keeps its plan: computing the same object again with new
    input values is the reuse path.
    """

    def __init__(self, outputs: Tensor | Sequence[Tensor], extra: Iterable[Tensor] = ()) -> None:
        outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
        if not outs:
            raise GraphError("Graph: no outputs")
        for t in outs:
            if not isinstance(t, Tensor):
                raise GraphError(f"Graph: outputs must be Tensors, got {type(t).__name__}")
        self.outputs: list[Tensor] = outs
        order: list[Tensor] = []
        seen: set[int] = set()
        # iterative post-order DFS (graphs of big models are deep)
        for root in [*outs, *extra]:
            if id(root) in seen:
                continue
            stack: list[tuple[Tensor, int]] = [(root, 0)]
            while stack:
                t, i = stack.pop()
                if i < len(t.src):
                    stack.append((t, i + 1))
                    s = t.src[i]
                    if id(s) not in seen:
                        stack.append((s, 0))
                    continue
                if id(t) not in seen:
                    seen.add(id(t))
                    order.append(t)
        self.order = order
        self.nodes: list[Tensor] = [t for t in order if not t.is_leaf]
        self.leafs: list[Tensor] = [t for t in order if t.is_leaf]
        self.inputs: list[Tensor] = [t for t in self.leafs if t.op == "input"]
        self._output_ids = {id(t) for t in outs}

    def is_output(self, t: Tensor) -> bool:
        return id(t) in self._output_ids

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return f"Graph({len(self.nodes)} nodes, {len(self.leafs)} leafs, {len(self.outputs)} outputs)"
