"""Pipeline parallel on Ray: one model's layers split over stage actors (llama.cpp's RPC backend, on Ray).

    import ray
    from llamapy import Llama

    ray.init()  # or an existing cluster: RAY_ADDRESS / ray start --head
    llm = Llama("model.gguf", pipeline_stages=2)  # layers 0..n/2-1 on one actor, the rest on another

:class:`PipelineContext` stands in for a :class:`~llamapy.context.Context` on the driver: ``decode``
sends the batch down the stages as a chain of actor calls (each stage's hidden states go to the next
one through Ray's object store, never back through the driver) and reads the last stage's logits;
memory operations (``seq_rm``, ``seq_cp``, checkpoints...) go to every stage, each holding the KV cells
and recurrent states of its own layers. The stages are placed by a placement group: ``PACK`` (one node,
tests) or ``STRICT_SPREAD`` (one stage per node). A stage that cannot load its file, or that is lost,
makes the call fail with :class:`~llamapy.ray.pipeline_stage.PipelineError`; the pipeline is then
``broken`` (its KV caches no longer agree) and every later call fails at once with the same reason.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..batch import Batch
from ..errors import LlamapyError
from .pipeline_stage import PipelineError, PipelineStage, StageFailure, layer_ranges

__all__ = [
    "MemoryProxy",
    "PipelineContext",
    "PipelineError",
    "RemoteBackend",
    "layer_ranges",
    "pipeline_context",
]

_STATE_MAGIC = b"LPYP"
STRATEGIES = ("PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD")


class MemoryProxy:
    """``ctx.memory`` of a pipeline: a method call goes to every stage (the result is the first
    stage's); an attribute (``has_shift``, ``n_pos_per_embd``...) is read from the first stage."""

    def __init__(self, pipe: PipelineContext, methods: Sequence[str]) -> None:
        self._pipe = pipe
        self._methods = set(methods)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        pipe = self._pipe
        if name in self._methods:

            def call(*args: Any, **kwargs: Any) -> Any:
                return pipe._all(lambda s: s.memory_call.remote(name, args, kwargs))[0]

            return call
        return pipe._get(pipe.stages[0].memory_attr.remote(name))


class PipelineContext:
    """The driver's side of a pipeline: the parts of :class:`~llamapy.context.Context` that generation,
    ``Llama`` and the server use (``decode``, logits, ``memory``, sequence state, timings)."""

    def __init__(
        self,
        model: Any,
        n_stages: int,
        ctx_params: dict[str, Any],
        *,
        paths: Sequence[str] | None = None,
        strategy: str = "PACK",
        stage_cpus: float = 1.0,
        ready_timeout_s: float = 120.0,
        call_timeout_s: float = 600.0,
        micro_batches: bool = True,
    ) -> None:
        from . import require_ray

        require_ray()
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = str(strategy).upper()
        if strategy not in STRATEGIES:
            raise PipelineError(f"placement strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
        if ctx_params.get("embeddings"):
            raise PipelineError("a pipeline gives logits only: embeddings are not supported")
        if ctx_params.get("n_gpu_layers"):
            raise PipelineError("pipeline stages run on the CPU: n_gpu_layers is not supported with them")
        hp = model.hparams
        self.model = model
        self.ranges = layer_ranges(hp.n_layer, int(n_stages))
        paths = list(paths) if paths else [str(model.path)] * len(self.ranges)
        if len(paths) != len(self.ranges):
            raise PipelineError(f"{len(paths)} stage paths given for {len(self.ranges)} stages")
        self.call_timeout_s = float(call_timeout_s)
        self.broken: str | None = None
        self.stages: list[Any] = []
        if not ray.is_initialized():
            ray.init(log_to_driver=False)
        self._pg = placement_group([{"CPU": float(stage_cpus)}] * len(self.ranges), strategy=strategy)
        self._remove_pg = remove_placement_group
        try:
            ray.get(self._pg.ready(), timeout=ready_timeout_s)
        except Exception as e:
            self.close()
            raise PipelineError(
                f"cannot place {len(self.ranges)} stages of {stage_cpus} CPU with {strategy} "
                f"(the cluster has {ray.cluster_resources().get('CPU', 0)} CPUs on "
                f"{len(ray.nodes())} node(s)): {type(e).__name__}"
            ) from None
        actor = ray.remote(max_restarts=0, max_task_retries=0)(PipelineStage)
        for i, ((a, b), path) in enumerate(zip(self.ranges, paths, strict=True)):
            opts = PlacementGroupSchedulingStrategy(placement_group=self._pg, placement_group_bundle_index=i)
            self.stages.append(
                actor.options(num_cpus=float(stage_cpus), scheduling_strategy=opts).remote(
                    i, str(path), a, b, dict(ctx_params)
                )
            )
        t0 = time.monotonic()
        try:
            self.info = self._get(
                [s.ready.remote() for s in self.stages], ready_timeout_s, passthrough="none"
            )
            self.load_s = time.monotonic() - t0
            self._methods = self._get(self.stages[0].memory_methods.remote())
            a = self._get(self.stages[0].attrs.remote(["n_ctx", "n_batch", "n_ubatch", "n_seq_max"]))
            # micro-batches need the memory's split to be consecutive ubatches (no recurrent state)
            simple = bool(self._get(self.stages[0].simple_split.remote()))
        except BaseException:
            self.close()
            raise
        self.memory = MemoryProxy(self, self._methods)
        self.params = ctx_params
        self.n_ctx, self.n_batch, self.n_ubatch, self.n_seq_max = (int(a[k]) for k in a)
        self.micro_batches = micro_batches and simple
        self.embeddings = False
        self.encoder = False
        self.n_embd_inp = hp.n_embd_inp
        self._logits = np.zeros((0, hp.n_vocab), dtype=np.float32)
        self._out_rows = np.zeros(0, dtype=np.int64)
        self._graphs: dict = {}  # (cleared by callers that rebuild graphs; the stages keep their own)
        self._t = {"t_p_eval": 0.0, "n_p_eval": 0, "t_eval": 0.0, "n_eval": 0}

    # -- calls ----------------------------------------------------------------------------------------
    def _stage_of(self, e: BaseException) -> str:
        s = str(e)
        for i, st in enumerate(self.stages):
            if st._actor_id.hex() in s:
                a, b = self.ranges[i]
                return f"stage {i} (layers {a}-{b - 1})"
        return "a stage"

    def _fail(self, e: BaseException) -> PipelineError:
        import ray.exceptions as rex

        if isinstance(e, rex.GetTimeoutError):
            msg = f"a pipeline stage did not answer within {self.call_timeout_s:.0f} s"
        elif isinstance(e, (rex.RayActorError, rex.ActorUnavailableError)):
            msg = f"{self._stage_of(e)} was lost: {type(e).__name__}"
        else:
            msg = f"{type(e).__name__}: {e}"
        self.broken = msg
        return PipelineError(f"the pipeline failed: {msg}")

    def _check(self) -> None:
        if self.broken is not None:
            raise PipelineError(f"the pipeline is down ({self.broken}); start it again")

    def _get(self, ref: Any, timeout: float | None = None, passthrough: str = "first") -> Any:
        """``ray.get``: a stage's error becomes a :class:`PipelineError` and the pipeline is down, unless
        it leaves every stage as it was and is raised as itself: ``passthrough`` "first", a first
        stage's ``LlamapyError`` (``decode``: a bad batch, a full cache); "all", any stage's (a memory
        or state call each stage answers alike); "none", never (a stage that cannot start)."""
        import ray
        import ray.exceptions as rex

        self._check()
        try:
            return ray.get(ref, timeout=timeout or self.call_timeout_s)
        except rex.RayTaskError as e:
            cause = e.cause
            if isinstance(cause, StageFailure):
                err = cause.error
                a, b = self.ranges[cause.index]
                # the first stage's own errors (a bad batch, a full cache) leave every stage as it was
                ours = passthrough == "all" or (passthrough == "first" and cause.index == 0)
                if ours and isinstance(err, LlamapyError) and not isinstance(err, PipelineError):
                    raise err from None
                self.broken = f"stage {cause.index} (layers {a}-{b - 1}): {type(err).__name__}: {err}"
                raise PipelineError(f"the pipeline failed at {self.broken}") from None
            raise self._fail(cause if cause is not None else e) from None
        except (rex.RayError, TimeoutError) as e:
            raise self._fail(e) from None

    def _all(self, fn: Any, timeout: float | None = None) -> list[Any]:
        self._check()
        return self._get([fn(s) for s in self.stages], timeout, passthrough="all")

    # -- decode ---------------------------------------------------------------------------------------
    def decode(self, batch: Batch) -> int:
        """Run ``batch`` down the stages; the last one's logits become this context's. A batch of more
        than ``n_ubatch`` tokens goes as micro-batches of one ubatch each when the memory splits batches
        into consecutive ubatches (every model without a recurrent state): stage k works on micro-batch
        i while stage k-1 works on i+1, and the ubatches are the ones one process would make."""
        self._check()
        t0 = time.perf_counter()
        n = batch.n_tokens
        mbs = self._micro_batches(batch) if self.micro_batches and self.n_ubatch < n <= self.n_batch else None
        if mbs is None:
            self._logits, self._out_rows = self._get(self._chain(batch))
        else:
            self._decode_micro(batch, mbs)
        dt = time.perf_counter() - t0
        key = "p_eval" if n > 1 else "eval"
        self._t["t_" + key] += dt
        self._t["n_" + key] += n if n > 1 else 1
        return 0

    def _chain(self, batch: Batch) -> Any:
        ref = None
        for s in self.stages:  # a chain of calls: each stage's output goes straight to the next
            ref = s.decode.remote(batch, ref)
        return ref

    def _micro_batches(self, batch: Batch) -> list[Batch] | None:
        """``batch`` cut into consecutive pieces of ``n_ubatch`` tokens (None: leave it whole, so the
        stages report what is wrong with it)."""
        n, nu = batch.n_tokens, self.n_ubatch
        if batch.logits is None:
            flags = np.zeros(n, dtype=bool)
            flags[-1] = True
        else:
            flags = np.asarray(batch.logits, dtype=bool).reshape(-1)
        seq_id = batch.seq_id
        if len(flags) != n or (seq_id is not None and len(seq_id) != n):
            return None
        for f in ("token", "embd", "pos", "mpos"):
            v = getattr(batch, f)
            if v is not None and len(v) != n:
                return None
        out = []
        for i in range(0, n, nu):
            j = min(n, i + nu)
            part = {f: (None if getattr(batch, f) is None else np.asarray(getattr(batch, f))[i:j])
                    for f in ("token", "embd", "pos", "mpos")}  # fmt: skip
            out.append(Batch(**part, seq_id=None if seq_id is None else list(seq_id[i:j]), logits=flags[i:j]))
        return out

    def _decode_micro(self, batch: Batch, mbs: list[Batch]) -> None:
        seqs = sorted({int(s) for ss in (batch.seq_id or [[0]]) for s in ([ss] if np.isscalar(ss) else ss)})
        if any(not 0 <= s < self.n_seq_max for s in seqs):
            self._logits, self._out_rows = self._get(self._chain(batch))  # the stage's BatchError
            return
        first = self.stages[0]
        before = self._get([first.memory_call.remote("seq_pos_max", (s,), {}) for s in seqs])
        finals = [self._chain(mb) for mb in mbs]  # each stage takes them in order: a pipeline
        try:
            outs = self._get(finals)
        except LlamapyError:
            if self.broken is None:  # a bad piece or a full cache: take back what the others placed
                for s, p in zip(seqs, before, strict=True):
                    self.memory.seq_rm(s, int(p) + 1, -1)
            raise
        logits, rows, n_out = [], [], 0
        for lg, r in outs:
            logits.append(lg)
            rows.append(np.where(r >= 0, r + n_out, -1))
            n_out += len(lg)
        self._logits, self._out_rows = np.concatenate(logits), np.concatenate(rows)

    encode = decode

    def get_logits(self) -> np.ndarray:
        return self._logits

    def get_logits_ith(self, i: int) -> np.ndarray:
        n = len(self._logits)
        if i < 0:
            if n + i < 0:
                raise LlamapyError(f"get_logits_ith({i}): only {n} outputs in the last batch")
            return self._logits[n + i]
        if i >= len(self._out_rows) or self._out_rows[i] < 0:
            raise LlamapyError(f"get_logits_ith({i}): token {i} of the last batch had no output requested")
        return self._logits[int(self._out_rows[i])]

    def get_embeddings(self) -> np.ndarray:
        raise LlamapyError("a pipeline gives logits only: embeddings are off")

    get_embeddings_ith = get_embeddings_seq = get_embeddings

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    @property
    def n_ctx_seq(self) -> int:
        return self.n_ctx // self.n_seq_max if self.n_seq_max > 1 else self.n_ctx

    def set_causal_attn(self, causal: bool) -> None:
        self._all(lambda s: s.call.remote("set_causal_attn", bool(causal)))

    def set_adapters_lora(self, adapters: list) -> None:
        if adapters:
            raise LlamapyError("LoRA adapters are not supported on a pipeline")

    # -- state: each stage's part, concatenated ---------------------------------------------------------
    def state_seq_get_data(self, seq_id: int = -1) -> bytes:
        parts = self._all(lambda s: s.call.remote("state_seq_get_data", seq_id))
        head = _STATE_MAGIC + struct.pack(f"<I{len(parts)}Q", len(parts), *(len(p) for p in parts))
        return head + b"".join(parts)

    def state_seq_size_max(self, n_tokens: int) -> int:
        sizes = self._all(lambda s: s.call.remote("state_seq_size_max", n_tokens))
        return 8 + 8 * len(sizes) + sum(sizes)

    def state_seq_set_data(self, data: bytes, seq_id: int = -1, n_tokens: int | None = None) -> int:
        from ..memory import StateError

        data = bytes(data)
        n = len(self.stages)
        if data[:4] != _STATE_MAGIC or len(data) < 8 + 8 * n or struct.unpack_from("<I", data, 4)[0] != n:
            raise StateError(f"saved state is not from a pipeline of {n} stages")
        sizes = struct.unpack_from(f"<{n}Q", data, 8)
        off, parts = 8 + 8 * n, []
        for sz in sizes:
            parts.append(data[off : off + sz])
            off += sz
        if off != len(data):
            raise StateError("saved pipeline state is truncated")
        self._all(
            lambda s: s.call.remote("state_seq_set_data", parts[self.stages.index(s)], seq_id, n_tokens)
        )
        return off

    # -- timings, stats, shutdown -----------------------------------------------------------------------
    def timings(self) -> dict[str, float]:
        t = self._t
        return {
            "t_load_ms": self.load_s * 1e3,
            "t_p_eval_ms": t["t_p_eval"] * 1e3,
            "n_p_eval": t["n_p_eval"],
            "t_eval_ms": t["t_eval"] * 1e3,
            "n_eval": t["n_eval"],
            "prompt_tps": t["n_p_eval"] / t["t_p_eval"] if t["t_p_eval"] else 0.0,
            "gen_tps": t["n_eval"] / t["t_eval"] if t["t_eval"] else 0.0,
        }

    def reset_timings(self) -> None:
        self._t = {"t_p_eval": 0.0, "n_p_eval": 0, "t_eval": 0.0, "n_eval": 0}

    def stage_stats(self) -> list[dict[str, Any]]:
        """Per stage: its layers, pid and node, resident bytes, and the bytes of the weights it read."""
        return self._all(lambda s: s.stats.remote())

    def health(self) -> dict[str, Any]:
        """``{"ok": bool, "stages": n, "error": reason or None}`` without raising."""
        return {"ok": self.broken is None, "stages": len(self.stages), "error": self.broken}

    def __del__(self) -> None:
        try:
            import ray

            if self.stages and ray.is_initialized():
                self.close()
        except Exception:  # interpreter shutdown
            pass

    def close(self) -> None:
        """Stop the stage actors and free their placement group."""
        import ray

        for s in self.stages:
            try:
                ray.kill(s)
            except Exception:  # already gone
                pass
        self.stages = []
        if getattr(self, "_pg", None) is not None:
            try:
                self._remove_pg(self._pg)
            except Exception:
                pass
            self._pg = None
        if self.broken is None:
            self.broken = "closed"


def RemoteBackend(*args: Any, **kwargs: Any) -> PipelineContext:  # noqa: N802 (the issue's name)
    """The issue's ``llamapy.ray.RemoteBackend``: a :class:`PipelineContext` (the stages are whole
    contexts cut at layer boundaries rather than a ggml backend; see docs/ray.md)."""
    return PipelineContext(*args, **kwargs)


def pipeline_context(model: Any, n_stages: int, ctx_params: dict[str, Any], **kwargs: Any) -> PipelineContext:
    """A :class:`PipelineContext` of ``n_stages`` over ``model`` with the context parameters of
    :class:`~llamapy.context.ContextParams` (``n_ctx``, ``n_batch``, ``n_threads``...)."""
    return PipelineContext(model, n_stages, ctx_params, **kwargs)
