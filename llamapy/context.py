"""A session over a model: context parameters, the KV cache, ``decode`` (batch -> ubatches -> graph ->
logits), embeddings, per-sequence state and timings (llama.cpp's ``llama_context``).

Graph reuse: a graph is built per shape (tokens, outputs, KV cells read per cache) and kept; the next
ubatch of the same shape only rewrites the graph's inputs. ``n_kv`` is padded to a multiple of 256 so
token-by-token generation reuses one graph for 256 steps.

Graph inputs fill themselves (``llamapy.graph_inputs``): the context makes those of the ubatch (tokens
or embeddings, positions, output rows, an encoder's masks, pooling), the memory its own (KV masks and
cells, recurrent-state rows, the K-shift); a decode gathers their ``set_input(ub)`` values and computes.
"""

from __future__ import annotations

import copy
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._cpuload import ThreadPolicy
from ._dataclass import dataclass
from ._numba import cap_threads, set_num_threads
from .batch import AllocatedBatch, Batch, BatchError, UBatch, allocate
from .errors import LlamapyError
from .ggml.graph import Graph
from .ggml.sched import Scheduler
from .ggml.tensor import Tensor
from .ggml.types import GGMLType
from .graph_inputs import (
    GraphInput,
    InpAttnNoCache,
    InpEmbd,
    InpOutIds,
    InpPooling,
    InpPos,
    out_ids,
    ubatch_seqs,
)
from .memory import ContextFullError, StateError, create_memory, kv_type
from .memory.fit import fit_n_ctx
from .model.blocks import GraphBuilder, Inputs
from .model.hparams import PoolingType
from .model.model import Model
from .rope_params import ContextParamError, rope_hparams

if TYPE_CHECKING:
    from .model.lora import LoraAdapter

__all__ = [
    "BatchError",
    "Context",
    "ContextFullError",
    "ContextParamError",
    "ContextParams",
    "EvalCallback",
    "StateError",
    "rope_hparams",
]

# llama.cpp's cb_eval (ggml_backend_sched_eval_callback) with the value in place of user_data: called
# as cb(node, True, None) once per graph for every named node (return True to watch it), then as
# cb(node, False, value) after each ubatch's compute for each watched node, in graph order (value: a
# copy; return False to skip the remaining nodes of that ubatch). A callback with a true attribute
# ``ask_unnamed`` is asked about unnamed nodes too, and a watched mat-mul keeps its inputs readable
# (``ctx.sched.get(node.src[1])``: llama-imatrix reads the activations going into each weight).
EvalCallback = Callable[[Tensor, bool, "np.ndarray | None"], bool]

_STATE_MAGIC = b"LPYS"


def _keep_tuning(sched: Scheduler, model: Model, threads: int) -> None:
    """Let the backends keep what they measure about their kernels (the CPU's prefetch choices,
    ``ggml/cpu/prefetch_tune.py``) for this model file (its path, size and modification time) in
    ``$LLAMAPY_TUNE_DIR``, else ``<llamapy cache>/tune`` (``Backend.keep_tuning``)."""
    try:
        st = os.stat(model.path)
    except (OSError, TypeError):
        return
    from .hub import cache_dir

    where = os.environ.get("LLAMAPY_TUNE_DIR")
    store = (Path(where) if where else cache_dir() / "tune") / "prefetch.json"
    scope = f"{os.path.realpath(model.path)}|{st.st_size}|{st.st_mtime_ns}"
    for b in sched.backends:
        b.keep_tuning(store, scope, threads)


@dataclass
class ContextParams:
    """llama.cpp's ``llama_context_params``: context size, batch sizes, threads, cache types and the rest."""

    n_ctx: int = 0
    n_batch: int = 2048
    n_ubatch: int = 512
    n_seq_max: int = 1
    n_threads: int | None = None
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = True
    embeddings: bool = False
    pooling_type: str | int | None = None
    seed: int = 0xFFFFFFFF
    swa_full: bool = False
    backend: str | None = None  # "cpu" (default when available) or "numpy"
    n_gpu_layers: int = 0  # the last N layers on the CUDA backend (-1: all and the output layer)
    main_gpu: int = 0
    offload_kqv: bool = True  # the KV cache of offloaded layers on the GPU (False: --no-kv-offload)
    repack: bool = True  # weights in the backend's kernel layouts (False: the file's rows; --no-repack)
    cb_eval: EvalCallback | None = None  # reads named intermediates (``attn_norm-3``, ``l_out-3``...)
    extra: dict[str, Any] = field(default_factory=dict)
    # RoPE scaling (llama_context_params; the unset values mean the model's, see ``rope_hparams``)
    rope_scaling_type: int | str | None = None  # none, linear, yarn, longrope (0..3); None or -1: the model's
    rope_freq_base: float = 0.0  # 0: the model's
    rope_freq_scale: float = 0.0  # 1 / the context extension factor; 0: the model's
    yarn_ext_factor: float = -1.0  # negative: 1 for yarn, else 0
    yarn_attn_factor: float = -1.0  # negative: 1; YaRN's own magnitude while extrapolating
    yarn_beta_fast: float = -1.0  # negative: the model's
    yarn_beta_slow: float = -1.0  # negative: the model's
    yarn_orig_ctx: int = 0  # 0: the model's original context (else its training context)


@dataclass
class _GraphEntry:
    """A built graph of one ubatch shape, its output tensors and the inputs it reads."""

    graph: Graph
    logits: Tensor | None
    embd: Tensor | None
    inputs: list[GraphInput]  # those the graph reads; each fills itself from the ubatch
    watched: list[Tensor] = field(default_factory=list)  # named nodes cb_eval asked for
    embd_pooled: Tensor | None = None  # F32[n_seqs, n]: per sequence of the ubatch (pooling)
    used: set[int] = field(default_factory=set)  # ids of the graph's input tensors


class Context:
    """Decode batches against a model with a KV cache of ``n_ctx`` cells shared by ``n_seq_max`` sequences."""

    MAX_GRAPHS = 8

    def __init__(self, model: Model, params: ContextParams | None = None, **kwargs: Any) -> None:
        p = params or ContextParams()
        for k, v in kwargs.items():
            if not hasattr(p, k):
                raise LlamapyError(f"unknown context parameter {k!r}")
            setattr(p, k, v)
        if model.impl is None:
            raise LlamapyError(
                f"{model.path}: the model was loaded with vocab_only=True; it cannot make a context"
            )
        self.model = model
        self.params = p
        hp = model.hparams
        # the architecture this context computes with: the model's, or a copy over the hparams of the
        # context's RoPE parameters (--rope-scaling, --rope-scale, --yarn-*: rope_hparams)
        rope_hp = rope_hparams(hp, p)
        self.impl = model.impl
        if rope_hp is not None:
            self.impl = copy.copy(model.impl)
            self.impl.hp = rope_hp
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max"):
            v = getattr(p, name)
            if not isinstance(v, (int, np.integer)) or v < 0 or (v == 0 and name != "n_ctx"):
                raise LlamapyError(f"context parameter {name} = {v!r} must be a positive integer")
        n_ctx = p.n_ctx or fit_n_ctx(hp, p.type_k, p.type_v)  # 0: the model's (memory/fit.py)
        # an encoder (non-causal attention) has no KV cache: each ubatch holds whole sequences and
        # attends over itself (llama.cpp's encode); n_ctx only bounds positions
        self.encoder = not hp.causal_attn
        self.n_ctx = n_ctx if self.encoder else (n_ctx + 255) // 256 * 256
        self.n_batch = min(p.n_batch, self.n_ctx) if hp.causal_attn else p.n_batch
        self.n_ubatch = min(p.n_ubatch, self.n_batch)
        self.n_seq_max = p.n_seq_max
        self.n_threads = set_num_threads(p.n_threads)
        # no -t: each decode runs on the cores other processes leave free (llamapy/_cpuload.py)
        self._thread_policy = ThreadPolicy(self.n_threads) if not p.n_threads or p.n_threads <= 0 else None
        self.embeddings = p.embeddings or self.encoder  # an encoder's output is its embeddings
        self.cb_eval = p.cb_eval
        self.flash_attn = p.flash_attn is not False  # None ("auto") and True: fused attention
        if not self.flash_attn and kv_type(p.type_v) in (GGMLType.Q8_0, GGMLType.Q4_0):
            raise LlamapyError(
                f"a quantized V cache ({p.type_v}) needs flash_attn (V is read transposed without it)"
            )
        pool = p.pooling_type
        if pool is None or (isinstance(pool, (int, np.integer)) and pool < 0):  # unspecified: the model's
            pool = hp.pooling_type if self.embeddings else PoolingType.NONE
        self.pooling_type = PoolingType.parse(pool)
        if self.pooling_type == PoolingType.RANK and not any(
            n in model.impl.w for n in ("cls.weight", "cls.output.weight")
        ):
            raise LlamapyError(
                f"{model.path}: pooling type rank needs a classification head (cls.weight / cls.output.weight), "
                f"which this {hp.arch} model does not have"
            )
        # the rows pooling reads: mean, cls or last (rank: the family's, e.g. qwen3's last token, as llama.cpp)
        self._pool_rows = model.impl.pooled_rows(self.pooling_type)
        dense = [model.impl.w.get(n) for n in ("dense_3.weight", "dense_2.weight")]
        dense = [d for d in dense if d is not None]
        # per-token embeddings: through the dense projections when not pooled (EmbeddingGemma)
        self.n_embd_out = dense[0].shape[0] if dense and self.pooling_type == PoolingType.NONE else hp.n_embd
        self.memory = create_memory(
            hp, self.n_ctx, self.n_ubatch, self.n_seq_max, p.type_k, p.type_v, p.swa_full
        )
        if p.backend:
            from .ggml.backend import create_backend

            self.sched = Scheduler(
                create_backend(p.backend, **({} if p.backend == "numpy" else {"n_threads": self.n_threads}))
            )
        else:
            self.sched = Scheduler(n_threads=self.n_threads)
        _keep_tuning(self.sched, model, self.n_threads)
        self.offload = None  # where n_gpu_layers put things (llamapy.ggml.cuda.offload.Offload), if on a GPU
        self.stage: Any = None  # a pipeline stage's layer cut (llamapy.ray.pipeline_stage.StageCut)
        if p.n_gpu_layers:
            from .ggml.cuda.offload import offload_to_cuda, plan_offload

            off = plan_offload(
                model.impl.w, self.memory.kv_buffers(), hp.n_layer, p.n_gpu_layers, p.offload_kqv
            )
            self.memory.device_sync = offload_to_cuda(self.sched, off, p.main_gpu)
            self.offload = off if self.memory.device_sync is not None else None
        self._graphs: OrderedDict[tuple, _GraphEntry] = OrderedDict()
        self.repack = p.repack
        self._loras: list[tuple[Any, float]] = []  # (LoraAdapter, scale), applied in the graph
        self._logits = np.zeros((0, hp.n_vocab), dtype=np.float32)
        self._embd = np.zeros((0, hp.n_embd), dtype=np.float32)
        self._embd_seq: dict[int, np.ndarray] = {}
        self._out_rows = np.zeros(0, dtype=np.int64)
        self.n_graph_builds = 0
        self.n_graph_reuses = 0
        self.causal_attn = bool(hp.causal_attn)  # llama_set_causal_attn
        self.n_embd_inp = hp.n_embd_inp  # Qwen3-VL: + its deepstack slices
        self._t = {"t_p_eval": 0.0, "n_p_eval": 0, "t_eval": 0.0, "n_eval": 0}

    # -- properties -----------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    @property
    def n_ctx_seq(self) -> int:
        return self.n_ctx // self.n_seq_max if self.n_seq_max > 1 else self.n_ctx

    # -- decode ---------------------------------------------------------------------------------------
    def decode(self, batch: Batch) -> int:
        """Run ``batch`` through the model, storing its K/V in the cache and the requested outputs.

        Raises ``BatchError`` for an invalid batch and ``ContextFullError`` when the cache has no room
        (the cache is then as before the call). Returns 0.
        """
        t0 = time.perf_counter()
        # the busy-machine cap (or, with -t given, none) holds for this decode only, then the calling
        # thread's own cap is back: what runs next in it (sampling, another context) is not capped by it
        prev = self._thread_policy.apply() if self._thread_policy is not None else cap_threads(0)
        try:
            return self._decode(batch, t0)
        finally:
            cap_threads(prev)

    def _decode(self, batch: Batch, t0: float) -> int:
        pooled = self.embeddings and self.pooling_type != PoolingType.NONE
        ab = allocate(
            batch,
            self.n_vocab,
            self.n_embd_inp,  # Qwen3-VL: + deepstack slices
            self.n_seq_max,
            self.n_batch,
            self.memory.seq_pos_max,
            output_all=pooled or self.encoder,
            n_pos_per_embd=self.memory.n_pos_per_embd,
        )
        if self.memory.has_shift:
            self._apply_shift()
        if self.encoder and int(ab.pos.max()) >= self.n_ctx:
            raise BatchError(
                f"position {int(ab.pos.max())} is beyond the context (n_ctx = {self.n_ctx}): the text is longer "
                f"than this encoder's context; truncate it or raise n_ctx (at most {self.model.n_ctx_train})"
            )
        # pooling and encoders need each sequence whole in one ubatch; several sequences share one
        ubatches = (
            ab.split_whole_seqs(self.n_ubatch)
            if pooled or self.encoder
            else self.memory.split(ab, self.n_ubatch)
        )
        n_out = ab.n_outputs
        logits = np.zeros((n_out, 0 if self.encoder else self.n_vocab), dtype=np.float32)
        embd = np.empty((n_out, self.n_embd_out), dtype=np.float32) if self.embeddings else None
        self._embd_seq = {}
        snap = self.memory.snapshot()
        try:
            for ub in ubatches:
                self._decode_ubatch(ab, ub, logits, embd)
        except ContextFullError:
            self.memory.restore(snap)
            raise
        self._logits = logits
        self._out_rows = ab.out_rows
        if embd is not None:
            self._embd = embd
        dt = time.perf_counter() - t0
        if ab.n_tokens > 1:
            self._t["t_p_eval"] += dt
            self._t["n_p_eval"] += ab.n_tokens
        else:
            self._t["t_eval"] += dt
            self._t["n_eval"] += 1
        return 0

    def encode(self, batch: Batch) -> int:
        """Embeddings of a batch: the same path as ``decode`` (llama.cpp's ``encode``). An encoder
        (non-causal attention) keeps no KV cache: every decode starts its sequences at position 0 unless
        ``batch.pos`` says otherwise, each sequence must fit one ubatch, and several sequences share a
        ubatch under a block-diagonal mask; ``get_embeddings()`` holds every token's row,
        ``get_embeddings_seq(s)`` the pooled vector (rank: the head's scores, float32[n_cls_out])."""
        return self.decode(batch)

    def set_causal_attn(self, causal: bool) -> None:
        """Whether attention is causal from the next decode on (llama.cpp's ``llama_set_causal_attn``):
        False lets a batch's tokens see each other both ways (an image's embeddings in some VLMs)."""
        self.causal_attn = bool(causal)

    def _decode_ubatch(
        self, ab: AllocatedBatch, ub: UBatch, logits: np.ndarray, embd: np.ndarray | None
    ) -> None:
        self.memory.place_ubatch(ub)
        out_local = out_ids(ub)
        self.ubatch = ub  # the ubatch being computed: a cb_eval reads its positions and sequences (EAGLE-3)
        n_out = int(ub.output.sum())
        seqs = ubatch_seqs(ub) if self.embeddings and self.pooling_type else []
        ge = self._graph(ub.n_tokens, len(out_local), ub.token is None, len(seqs))
        inputs: dict[Tensor, np.ndarray] = {}
        for gi in ge.inputs:
            inputs.update(gi.set_input(ub))
        # an input may make a tensor the model does not read (jina-bert-v2 has no positions)
        self.sched.compute(ge.graph, {t: v for t, v in inputs.items() if id(t) in ge.used})
        if self.stage is not None:  # the hidden state a pipeline stage passes on
            self.stage.collect(self.sched, ge.graph)
        for t in ge.watched:
            if not self.cb_eval(t, False, self.sched.get(t)):
                break
        if n_out:
            rows = ab.out_rows[ub.idx[out_local]]
            if ge.logits is not None and logits.shape[1]:
                logits[rows] = self.sched.view(ge.logits)
            if embd is not None and ge.embd is not None:
                embd[rows] = self.sched.view(ge.embd)
        if ge.embd_pooled is not None:
            pooled = np.array(self.sched.view(ge.embd_pooled), dtype=np.float32).reshape(len(seqs), -1)
            for i, s in enumerate(seqs):
                self._embd_seq[int(s)] = pooled[i]

    def _graph(self, n_tokens: int, n_out: int, is_embd: bool, n_seqs: int = 0) -> _GraphEntry:
        key = (n_tokens, n_out, is_embd, n_seqs, self.causal_attn, self.memory.graph_key())
        ge = self._graphs.get(key)
        if ge is not None:
            self._graphs.move_to_end(key)
            self.n_graph_reuses += 1
            return ge
        hp = self.model.hparams
        emb = InpEmbd(n_tokens, self.n_embd_inp, is_embd)
        pos = InpPos(n_tokens, self.memory.n_pos_per_embd)
        oid = InpOutIds(n_tokens, n_out)
        inp = Inputs(n_tokens, n_out, pos.pos, emb.tokens, emb.embd, oid.out_ids, n_ctx=self.n_ctx_seq,
                     flash_attn=self.flash_attn, loras=_lora_map(self._loras))  # fmt: skip
        gis: list[GraphInput] = [emb, pos, oid, *self.memory.build_inputs(inp, self.causal_attn)]
        if self.encoder:  # masks over the ubatch itself: full layers, then sliding-window ones
            enc = InpAttnNoCache(n_tokens, self.causal_attn, hp.n_swa if hp.has_swa else 0, hp.swa_type,
                                 hp.f_max_alibi_bias > 0)  # fmt: skip
            inp.kq_mask, inp.kq_mask_swa = enc.kq_mask, enc.kq_mask_swa
            gis.append(enc)
        if n_seqs and self._pool_rows != PoolingType.NONE:
            pool = InpPooling(
                n_tokens, n_seqs, self._pool_rows == PoolingType.MEAN, self._pool_rows == PoolingType.LAST
            )
            inp.pool_mean, inp.pool_rows = pool.mean, pool.rows
            gis.append(pool)
        g = GraphBuilder(self.impl, inp)
        res = self.impl.build(g)
        if self.embeddings:  # pooling and heads: llama.cpp's build_pooling + build_dense_out
            res = g.build_pooling(res, self.pooling_type if n_seqs else PoolingType.NONE)
        embd = res.embd if self.embeddings else None
        outs = [t for t in (res.logits, embd, res.embd_pooled) if t is not None]
        writes = [w for gi in gis for w in gi.writes]  # memory writes no output reads (recurrent states)
        if self.stage is not None:  # a pipeline stage keeps its layer range only
            res, outs, writes = self.stage.cut(res, outs, writes, gis)
        graph = Graph(outs, extra=writes)
        watched: list[Tensor] = []
        cb = self.cb_eval
        if cb is not None:  # watched nodes become outputs: the planner keeps their memory to the end
            every = bool(getattr(cb, "ask_unnamed", False))
            watched = [t for t in graph.nodes if (t.name or every) and cb(t, True, None)]
            if watched:
                mm_in = [s for t in watched if every and t.op in ("mul_mat", "mul_mat_id") for s in t.src[1:]]
                graph = Graph(outs + watched + mm_in, extra=writes)
        used = {id(t) for t in graph.inputs}
        gis = [gi for gi in gis if any(id(t) in used for t in gi.tensors())]  # (Mamba2 reads no position)
        ge = _GraphEntry(graph, res.logits, embd, gis, watched, res.embd_pooled, used)
        self._graphs[key] = ge
        self.n_graph_builds += 1
        while len(self._graphs) > self.MAX_GRAPHS:
            self._graphs.popitem(last=False)
        return ge

    def _apply_shift(self) -> None:
        """Re-rotate cached K of cells whose position moved (seq_add / seq_div): the memory's K-shift
        graph, with each layer's rope as the forward graph has it."""
        impl, n_ctx = self.impl, self.n_ctx_seq
        self.memory.apply_shift(self.sched, lambda il: impl.layer_rope(il, n_ctx))

    # -- LoRA adapters (llama_set_adapter_lora & co.) -------------------------------------------------
    @property
    def lora_adapters(self) -> list[tuple[LoraAdapter, float]]:
        """The active adapters and their scales, in the order they apply."""
        return list(self._loras)

    def set_adapters_lora(self, adapters: list[tuple[LoraAdapter, float]]) -> None:
        """Make exactly ``adapters`` (each with its scale) active; the next graph applies them. The KV
        cache is left as it is: tokens already in it were computed with the adapters of their time."""
        from .model.lora import LoraAdapter

        items = []
        for ad, scale in adapters:
            if not isinstance(ad, LoraAdapter):
                raise LlamapyError(f"not a LoRA adapter: {ad!r}")
            if not isinstance(scale, (int, float)) or not np.isfinite(scale):
                raise LlamapyError(f"LoRA scale must be a finite number, got {scale!r}")
            items.append((ad, float(scale)))
        items = [(ad, s) for ad, s in items if s != 0.0]  # scale 0: as if absent (llama-server's)
        if [(id(a), s) for a, s in items] != [(id(a), s) for a, s in self._loras]:
            self._loras = items
            self._graphs.clear()

    @property
    def repack(self) -> bool:
        """Whether the backends copy weights into their own kernel layouts on first use (the CPU's 8-row
        layouts: faster decode and prompts, at the cost of one copy of each weight, made by the first
        graph that uses it); False: they read the file's rows as they are (llama.cpp's ``--no-repack``).
        Setting it drops the compiled graphs; weights already repacked stay so for the graphs that do."""
        return all(b.repack for b in self.sched.backends)

    @repack.setter
    def repack(self, on: bool) -> None:
        on = bool(on)
        if any(b.repack != on for b in self.sched.backends):
            for b in self.sched.backends:
                b.repack = on
            self._graphs.clear()

    def set_adapter_lora(self, adapter: LoraAdapter, scale: float = 1.0) -> None:
        """Add ``adapter`` (or change its scale)."""
        rest = [(a, s) for a, s in self._loras if a is not adapter]
        self.set_adapters_lora([*rest, (adapter, scale)])

    def rm_adapter_lora(self, adapter: LoraAdapter) -> bool:
        """Remove ``adapter``; False when it was not active."""
        if all(a is not adapter for a, _ in self._loras):
            return False
        self.set_adapters_lora([(a, s) for a, s in self._loras if a is not adapter])
        return True

    def clear_adapter_lora(self) -> None:
        self.set_adapters_lora([])

    # -- outputs --------------------------------------------------------------------------------------
    def get_logits(self) -> np.ndarray:
        """F32[n_outputs, n_vocab] of the last decode (rows in batch order of the output tokens)."""
        if self.encoder:
            raise LlamapyError(
                f"{self.model.arch} is an encoder without logits: read get_embeddings() / get_embeddings_seq()"
            )
        return self._logits

    def _row(self, i: int, n_rows: int, what: str) -> int:
        n_out = n_rows
        if i < 0:
            j = n_out + i
            if j < 0:
                raise LlamapyError(f"get_{what}_ith({i}): only {n_out} outputs in the last batch")
            return j
        if i >= len(self._out_rows):
            raise LlamapyError(f"get_{what}_ith({i}): the last batch had {len(self._out_rows)} tokens")
        j = int(self._out_rows[i])
        if j < 0:
            raise LlamapyError(f"get_{what}_ith({i}): token {i} of the last batch had no output requested")
        return j

    def get_logits_ith(self, i: int) -> np.ndarray:
        """Logits of batch token ``i`` (negative: counted from the last output)."""
        return self.get_logits()[self._row(i, len(self._logits), "logits")]

    def get_embeddings(self) -> np.ndarray:
        if not self.embeddings:
            raise LlamapyError("embeddings are off: create the context with embeddings=True")
        return self._embd

    def get_embeddings_ith(self, i: int) -> np.ndarray:
        return self.get_embeddings()[self._row(i, len(self._embd), "embeddings")]

    def get_embeddings_seq(self, seq_id: int) -> np.ndarray:
        if not self.embeddings:
            raise LlamapyError("embeddings are off: create the context with embeddings=True")
        if seq_id not in self._embd_seq:
            raise LlamapyError(
                f"no pooled embedding for sequence {seq_id} (pooling type {self.pooling_type})"
            )
        return self._embd_seq[seq_id]

    # -- state ----------------------------------------------------------------------------------------
    def _state_header(self) -> bytes:
        hp = self.model.hparams
        return _STATE_MAGIC + struct.pack("<IIII", 1, hp.n_layer, hp.n_embd, hp.n_vocab)

    def state_seq_get_data(self, seq_id: int = -1) -> bytes:
        if self.memory.has_shift:
            self._apply_shift()
        return self._state_header() + self.memory.state_write(seq_id)

    def state_seq_size_max(self, n_tokens: int) -> int:
        """The most bytes ``state_seq_get_data(seq)`` gives for a sequence of ``n_tokens`` tokens."""
        return len(self._state_header()) + self.memory.state_size_max(n_tokens)

    def state_seq_set_data(self, data: bytes, seq_id: int = -1, n_tokens: int | None = None) -> int:
        """Restore ``state_seq_get_data``'s bytes into ``seq_id`` (-1: the saved sequences); returns the bytes
        read. ``n_tokens``: the sequence holds that many tokens, so its cells must be at positions
        ``0..n_tokens-1`` (StateError otherwise, and nothing changes)."""
        h = self._state_header()
        if bytes(data[: len(h)]) != h:
            raise StateError("saved state is from another model or format (header mismatch)")
        return len(h) + self.memory.state_read(memoryview(data)[len(h) :], seq_id, n_tokens)

    def state_seq_save_file(
        self, path: str | os.PathLike, seq_id: int, tokens: list[int] | np.ndarray
    ) -> int:
        tok = np.asarray(tokens, dtype="<i4")
        data = self.state_seq_get_data(seq_id)
        with open(path, "wb") as f:
            f.write(struct.pack("<I", len(tok)) + tok.tobytes() + data)
        return 4 + tok.nbytes + len(data)

    def state_seq_load_file(self, path: str | os.PathLike, seq_id: int) -> list[int]:
        with open(path, "rb") as f:
            raw = f.read()
        if len(raw) < 4:
            raise StateError(f"{path}: state file is truncated")
        (n,) = struct.unpack_from("<I", raw, 0)
        if 4 + 4 * n > len(raw):
            raise StateError(f"{path}: state file is truncated (token count {n})")
        tokens = np.frombuffer(raw, dtype="<i4", count=n, offset=4).tolist()
        self.state_seq_set_data(raw[4 + 4 * n :], seq_id)
        return tokens

    # -- timings --------------------------------------------------------------------------------------
    def timings(self) -> dict[str, float]:
        t = self._t
        return {
            "t_load_ms": self.model.load_time_s * 1e3,
            "t_p_eval_ms": t["t_p_eval"] * 1e3,
            "n_p_eval": t["n_p_eval"],
            "t_eval_ms": t["t_eval"] * 1e3,
            "n_eval": t["n_eval"],
            "prompt_tps": t["n_p_eval"] / t["t_p_eval"] if t["t_p_eval"] else 0.0,
            "gen_tps": t["n_eval"] / t["t_eval"] if t["t_eval"] else 0.0,
        }

    def reset_timings(self) -> None:
        self._t = {"t_p_eval": 0.0, "n_p_eval": 0, "t_eval": 0.0, "n_eval": 0}

    def health(self) -> dict[str, Any]:
        """``{"ok": bool, "error": reason or None}``: a local context can always answer (a Ray pipeline's
        context overrides this with the state of its stages)."""
        return {"ok": True, "error": None}


def _lora_map(adapters: list[tuple[Any, float]]) -> dict[str, Any]:
    """``model.lora.lora_map``, imported only when an adapter is set (most runs have none)."""
    if not adapters:
        return {}
    from .model.lora import lora_map

    return lora_map(adapters)
