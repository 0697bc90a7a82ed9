"""One stage of a pipeline-parallel model: a :class:`~llamapy.context.Context` over the model file that
builds the whole graph as usual and keeps only the nodes of its layer range ``[first, end)``.

The cut is at layer boundaries, where the residual stream (``l_out-{il}``, F32 ``[n_tokens, n_embd]``)
is the only tensor crossing: a stage after the first turns ``l_out-{first-1}`` into a graph input that
the previous stage's output fills; a stage before the last makes ``l_out-{end-1}`` its output instead
of the logits. Everything else stays the context's: its memory (the KV cells and recurrent states of
the layers it computes; the other layers' buffers are allocated but never touched, so they take no
resident pages), the ubatch split and cell placement (every stage runs the same allocator over the
same batches, so they agree), the same kernels in the same order: the logits equal a single process's.

Weights are mmapped: a stage reads (and the CPU backend prepares) only the weights its nodes use, so
its resident set holds its share of the file. Nothing here needs Ray; :mod:`llamapy.ray.pipeline`
wraps :class:`PipelineStage` as an actor.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..batch import Batch, UBatch
from ..errors import LlamapyError
from ..ggml.graph import Graph
from ..ggml.tensor import Tensor
from ..graph_inputs import GraphInput
from ..model.blocks import Outputs

__all__ = ["PipelineError", "PipelineStage", "StageCut", "StageFailure", "layer_ranges"]


class PipelineError(LlamapyError):
    """A pipeline cannot be built or has failed (a stage could not load, was lost, or the model cannot
    be cut at a layer boundary)."""

    http_status = 503  # the server answers a request that met a failed pipeline with 503 (unavailable)


class StageFailure(Exception):
    """Raised by a stage's ``decode``: which stage failed and the error it raised (picklable, so the
    driver knows whether the stages still agree)."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error

    def __str__(self) -> str:
        return f"stage {self.index}: {type(self.error).__name__}: {self.error}"


def layer_ranges(n_layer: int, n_stages: int) -> list[tuple[int, int]]:
    """``n_stages`` contiguous layer ranges as equal as they can be (earlier stages take the extra)."""
    if not isinstance(n_stages, int) or n_stages < 1:
        raise PipelineError(f"pipeline stages must be a positive integer, got {n_stages!r}")
    if n_stages > n_layer:
        raise PipelineError(f"cannot split a model of {n_layer} layers over {n_stages} stages")
    q, r = divmod(n_layer, n_stages)
    out, a = [], 0
    for i in range(n_stages):
        b = a + q + (1 if i < r else 0)
        out.append((a, b))
        a = b
    return out


class _HiddenInput(GraphInput):
    """The residual stream coming from the previous stage: one array per ubatch, in order."""

    def __init__(self, t: Tensor, cut: StageCut) -> None:
        self.t, self.cut = t, cut

    def tensors(self) -> list[Tensor]:
        return [self.t]

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        if not self.cut.pending:
            raise PipelineError(f"stage {self.cut.index}: no hidden state from the previous stage")
        h = self.cut.pending.pop(0)
        if h.shape != self.t.shape:
            raise PipelineError(
                f"stage {self.cut.index}: hidden state of shape {h.shape}, the ubatch needs {self.t.shape}"
            )
        return {self.t: h}


class StageCut:
    """The context hook (``Context.stage``): ``cut`` keeps a built graph's layers ``[first, end)``,
    ``collect`` reads the hidden state this stage passes on after each ubatch."""

    def __init__(self, index: int, first: int, end: int, n_layer: int) -> None:
        self.index, self.first, self.end, self.n_layer = index, first, end, n_layer
        self.last = end == n_layer
        self.out_name = f"l_out-{end - 1}"
        self.pending: list[np.ndarray] = []  # hidden states in, one per ubatch
        self.out: list[np.ndarray] = []  # hidden states out, one per ubatch
        self.weight_bytes: dict[str, int] = {}  # the weights the stage's graphs read

    def _named(self, graph: Graph, name: str) -> Tensor:
        t = next((x for x in graph.order if x.name == name), None)
        if t is None:
            raise PipelineError(
                f"stage {self.index}: the graph has no node {name!r}: this architecture cannot be cut "
                f"at that layer boundary"
            )
        return t

    def cut(
        self, res: Outputs, outs: list[Tensor], writes: list[Tensor], gis: list[GraphInput]
    ) -> tuple[Outputs, list[Tensor], list[Tensor]]:
        full = Graph(outs, extra=writes)
        hidden_out = None
        if not self.last:
            hidden_out = self._named(full, self.out_name)
            res, outs = Outputs(None), [hidden_out]
        if self.first > 0:
            h = self._named(full, f"l_out-{self.first - 1}")
            if h.view_src is not None or h.type.name != "F32":
                raise PipelineError(f"stage {self.index}: {h.name} is not a plain F32 tensor; cannot cut")
            h.op, h.src, h.params = "input", [], {}  # now a graph input the previous stage fills
            gis.append(_HiddenInput(h, self))
        # the writes no output reads (recurrent states): keep those of this stage's layers only, i.e.
        # those that depend neither on the token input (earlier layers) nor on the state passed on
        # (later layers)
        upstream: set[int] = set()
        for t in Graph(outs, extra=writes).order:
            if (
                t is hidden_out
                or (t.op == "input" and t.name in ("inp_tokens", "inp_embd") and self.first > 0)
                or any(id(s) in upstream for s in t.src)
            ):
                upstream.add(id(t))
        writes = [w for w in writes if id(w) not in upstream]
        g = Graph(outs, extra=writes)
        if self.first > 0 and any(t.name in ("inp_tokens", "inp_embd") for t in g.inputs):
            raise PipelineError(
                f"stage {self.index}: layers {self.first}-{self.end - 1} read the token input directly "
                "(more than the residual stream crosses the cut): this architecture cannot be pipelined"
            )
        for t in g.leafs:
            if t.op == "weight":
                self.weight_bytes[t.name] = int(t.nbytes)
        return res, outs, writes

    def collect(self, sched: Any, graph: Graph) -> None:
        if self.last:
            return
        t = next(o for o in graph.outputs if o.name == self.out_name)
        self.out.append(np.array(sched.view(t), dtype=np.float32, copy=True))


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # pragma: no cover (not Linux)
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _file_rss_bytes(path: str) -> int:
    """Resident bytes of the mappings of ``path`` in this process (the model file's pages it touched)."""
    real, total, inside = os.path.realpath(path), 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                if not line[0].isupper() or line.split(":")[0].isdigit() or "-" in line.split()[0]:
                    parts = line.split()
                    inside = len(parts) >= 6 and parts[-1] == real
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover (not Linux)
        return -1
    return total


class PipelineStage:
    """The body of a stage actor: loads the model (mmapped) and a context cut to ``[first, end)``."""

    def __init__(self, index: int, path: str, first: int, end: int, ctx_params: dict[str, Any]) -> None:
        from ..context import Context, ContextParams
        from ..model import Model

        self.index = index
        self.path = path
        self.rss_start = _rss_bytes()
        try:
            self.model = Model.load(path)
            n_layer = self.model.hparams.n_layer
            if not 0 <= first < end <= n_layer:
                raise PipelineError(f"layers {first}..{end} are not a range of this {n_layer}-layer model")
            self.cut = StageCut(index, first, end, n_layer)
            self.ctx = Context(self.model, ContextParams(**ctx_params))
        except Exception as e:  # carried to the driver as the error of ``ready``
            self.error: BaseException | None = e
            return
        self.error = None
        self.ctx.stage = self.cut

    def ready(self) -> dict[str, Any]:
        if self.error is not None:
            raise StageFailure(self.index, self.error)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "pid": os.getpid(),
            "node": os.uname().nodename,
            "layers": [self.cut.first, self.cut.end],
            "rss_bytes": _rss_bytes(),
            "rss_start_bytes": self.rss_start,
            "file_rss_bytes": _file_rss_bytes(self.path),
            "weight_bytes": sum(self.cut.weight_bytes.values()),
            "n_weights": len(self.cut.weight_bytes),
        }

    def decode(self, batch: Batch, hidden: list[np.ndarray] | None) -> Any:
        """Run ``batch`` through this stage's layers; the hidden states it passes on (one per ubatch),
        or on the last stage (logits, out_rows)."""
        try:
            self.cut.pending = list(hidden or [])
            self.cut.out = []
            self.ctx.decode(batch)
        except StageFailure:
            raise
        except Exception as e:
            raise StageFailure(self.index, e) from None
        if self.cut.last:
            return self.ctx._logits, self.ctx._out_rows
        return self.cut.out

    def memory_methods(self) -> list[str]:
        mem = self.ctx.memory
        return [n for n in dir(type(mem)) if not n.startswith("_") and callable(getattr(type(mem), n))]

    def memory_call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        try:
            return getattr(self.ctx.memory, name)(*args, **kwargs)
        except Exception as e:
            raise StageFailure(self.index, e) from None

    def simple_split(self) -> bool:
        """Whether the memory splits a batch into consecutive ubatches (no recurrent state): then a
        batch cut into micro-batches of ``n_ubatch`` tokens makes the very same ubatches."""
        from ..memory import Memory

        return type(self.ctx.memory).split is Memory.split

    def memory_attr(self, name: str) -> Any:
        return getattr(self.ctx.memory, name)

    def attrs(self, names: list[str]) -> dict[str, Any]:
        return {n: getattr(self.ctx, n) for n in names}

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """A context method (state, timings, causal attention)."""
        try:
            return getattr(self.ctx, name)(*args, **kwargs)
        except Exception as e:
            raise StageFailure(self.index, e) from None
