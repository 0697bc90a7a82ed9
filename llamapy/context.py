"""A session over a model: context parameters, the KV cache, ``decode`` (batch -> ubatches -> graph ->
logits), embeddings, per-sequence state and timings (llama.cpp's ``llama_context``).

Graph reuse: a graph is built per shape (tokens, outputs, KV cells read per cache) and kept; the next
ubatch of the same shape only rewrites the graph's inputs. ``n_kv`` is padded to a multiple of 256 so
token-by-token generation reuses one graph for 256 steps.
"""

from __future__ import annotations

import os
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._numba import set_num_threads
from .batch import AllocatedBatch, Batch, BatchError, UBatch, allocate
from .errors import LlamapyError
from .ggml import ops
from .ggml.graph import Graph
from .ggml.sched import Scheduler
from .ggml.tensor import Tensor
from .ggml.types import GGMLType
from .memory import ContextFullError, Memory, StateError, kv_type
from .model.blocks import GraphBuilder, Inputs, KVInputs
from .model.model import Model

__all__ = ["BatchError", "Context", "ContextFullError", "ContextParams", "EvalCallback", "StateError"]

# llama.cpp's cb_eval (ggml_backend_sched_eval_callback) with the value in place of user_data: called
# as cb(node, True, None) once per graph for every named node (return True to watch it), then as
# cb(node, False, value) after each ubatch's compute for each watched node, in graph order (value: a
# copy; return False to skip the remaining nodes of that ubatch).
EvalCallback = Callable[[Tensor, bool, "np.ndarray | None"], bool]

N_CTX_DEFAULT_CAP = 4096  # n_ctx = 0 means the training context, capped to this
_POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3}
_STATE_MAGIC = b"LPYS"


@dataclass
class ContextParams:
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
    cb_eval: EvalCallback | None = None  # reads named intermediates (``attn_norm-3``, ``l_out-3``...)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _GraphEntry:
    graph: Graph
    logits: Tensor
    embd: Tensor | None
    tokens: Tensor | None
    embd_in: Tensor | None
    pos: Tensor
    out_ids: Tensor | None
    masks: list[Tensor]
    idxs: list[Tensor]
    watched: list[Tensor] = field(default_factory=list)  # named nodes cb_eval asked for


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
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max"):
            v = getattr(p, name)
            if not isinstance(v, (int, np.integer)) or v < 0 or (v == 0 and name != "n_ctx"):
                raise LlamapyError(f"context parameter {name} = {v!r} must be a positive integer")
        n_ctx = p.n_ctx or min(hp.n_ctx_train, N_CTX_DEFAULT_CAP)
        self.n_ctx = (n_ctx + 255) // 256 * 256
        self.n_batch = min(p.n_batch, self.n_ctx) if hp.causal_attn else p.n_batch
        self.n_ubatch = min(p.n_ubatch, self.n_batch)
        self.n_seq_max = p.n_seq_max
        self.n_threads = set_num_threads(p.n_threads)
        self.embeddings = p.embeddings
        self.cb_eval = p.cb_eval
        self.flash_attn = p.flash_attn is not False  # None ("auto") and True: fused attention
        if not self.flash_attn and kv_type(p.type_v) in (GGMLType.Q8_0, GGMLType.Q4_0):
            raise LlamapyError(
                f"a quantized V cache ({p.type_v}) needs flash_attn (V is read transposed without it)"
            )
        pool = p.pooling_type
        if pool is None or (isinstance(pool, (int, np.integer)) and pool < 0):  # unspecified: the model's
            pool = hp.pooling_type if p.embeddings else 0
        if isinstance(pool, str):
            if pool not in _POOLING:
                raise LlamapyError(f"pooling type {pool!r} is not one of {', '.join(_POOLING)}")
            pool = _POOLING[pool]
        self.pooling_type = int(pool)
        self.memory = Memory(hp, self.n_ctx, self.n_ubatch, self.n_seq_max, p.type_k, p.type_v, p.swa_full)
        if p.backend:
            from .ggml.backend import create_backend

            self.sched = Scheduler(
                create_backend(p.backend, **({} if p.backend == "numpy" else {"n_threads": self.n_threads}))
            )
        else:
            self.sched = Scheduler(n_threads=self.n_threads)
        self._graphs: OrderedDict[tuple, _GraphEntry] = OrderedDict()
        self._logits = np.zeros((0, hp.n_vocab), dtype=np.float32)
        self._embd = np.zeros((0, hp.n_embd), dtype=np.float32)
        self._embd_seq: dict[int, np.ndarray] = {}
        self._out_rows = np.zeros(0, dtype=np.int64)
        self.n_graph_builds = 0
        self.n_graph_reuses = 0
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
        ab = allocate(
            batch,
            self.n_vocab,
            self.model.n_embd,
            self.n_seq_max,
            self.n_batch,
            self.memory.seq_pos_max,
            output_all=self.embeddings and self.pooling_type != 0,
        )
        if self.memory.has_shift:
            self._apply_shift()
        ubatches = (
            ab.split_seq(self.n_ubatch)
            if self.embeddings and self.pooling_type != 0
            else ab.split_simple(self.n_ubatch)
        )
        n_out = ab.n_outputs
        logits = np.empty((n_out, self.n_vocab), dtype=np.float32)
        embd = np.empty((n_out, self.model.n_embd), dtype=np.float32) if self.embeddings else None
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
            self._pool(ab)
        dt = time.perf_counter() - t0
        if ab.n_tokens > 1:
            self._t["t_p_eval"] += dt
            self._t["n_p_eval"] += ab.n_tokens
        else:
            self._t["t_eval"] += dt
            self._t["n_eval"] += 1
        return 0

    def encode(self, batch: Batch) -> int:
        """Embeddings of a batch (the same path as decode for decoder models)."""
        return self.decode(batch)

    def _decode_ubatch(
        self, ab: AllocatedBatch, ub: UBatch, logits: np.ndarray, embd: np.ndarray | None
    ) -> None:
        idxs = self.memory.place(ub.pos, ub.seq_bits)
        n_kvs = [c.n_kv() for c in self.memory.caches]
        out_local = np.flatnonzero(ub.output)
        n_out = len(out_local)
        if n_out == 0:
            out_local = np.array([ub.n_tokens - 1])
        ge = self._graph(ub.n_tokens, len(out_local), ub.token is None, n_kvs)
        inputs: dict[Tensor, np.ndarray] = {ge.pos: ub.pos.astype(np.int32)}
        if ge.tokens is not None:
            inputs[ge.tokens] = ub.token.astype(np.int32)
        if ge.embd_in is not None:
            inputs[ge.embd_in] = ub.embd
        if ge.out_ids is not None:
            inputs[ge.out_ids] = out_local.astype(np.int32)
        for c, n_kv, m, it, idx in zip(self.memory.caches, n_kvs, ge.masks, ge.idxs, idxs, strict=False):
            inputs[m] = c.mask(ub.pos, ub.seq_first, n_kv)
            inputs[it] = idx
        self.sched.compute(ge.graph, inputs)
        for t in ge.watched:
            if not self.cb_eval(t, False, self.sched.get(t)):
                break
        if n_out:
            rows = ab.out_rows[ub.idx[out_local]]
            logits[rows] = self.sched.view(ge.logits)
            if embd is not None and ge.embd is not None:
                embd[rows] = self.sched.view(ge.embd)

    def _graph(self, n_tokens: int, n_out: int, is_embd: bool, n_kvs: list[int]) -> _GraphEntry:
        key = (n_tokens, n_out, is_embd, tuple(n_kvs))
        ge = self._graphs.get(key)
        if ge is not None:
            self._graphs.move_to_end(key)
            self.n_graph_reuses += 1
            return ge
        hp = self.model.hparams
        tokens = None if is_embd else ops.new_tensor(GGMLType.I32, (n_tokens,), "inp_tokens")
        embd_in = ops.new_tensor(GGMLType.F32, (n_tokens, hp.n_embd), "inp_embd") if is_embd else None
        pos = ops.new_tensor(GGMLType.I32, (n_tokens,), "inp_pos")
        out_ids = ops.new_tensor(GGMLType.I32, (n_out,), "inp_out_ids") if n_out < n_tokens else None
        masks, idxs = [], []
        kv: dict[int, KVInputs] = {}
        for ci, (c, n_kv) in enumerate(zip(self.memory.caches, n_kvs, strict=False)):
            m = ops.new_tensor(GGMLType.F32, (n_tokens, n_kv), f"kq_mask_{ci}")
            ix = ops.new_tensor(GGMLType.I64, (n_tokens,), f"kv_idx_{ci}")
            masks.append(m)
            idxs.append(ix)
            ki = KVInputs(n_kv, m, ix, c.k, c.v)
            for ls in c.layers:
                kv[ls.il] = ki
        inp = Inputs(n_tokens, n_out, pos, tokens, embd_in, out_ids, kv, n_ctx=self.n_ctx_seq,
                     flash_attn=self.flash_attn)  # fmt: skip
        res = self.model.impl.build(GraphBuilder(self.model.impl, inp))
        embd = res.embd if self.embeddings else None
        outs = [res.logits] if embd is None else [res.logits, embd]
        graph = Graph(outs)
        watched: list[Tensor] = []
        cb = self.cb_eval
        if cb is not None:  # watched nodes become outputs: the planner keeps their memory to the end
            watched = [t for t in graph.nodes if t.name and cb(t, True, None)]
            if watched:
                graph = Graph(outs + watched)
        ge = _GraphEntry(graph, res.logits, embd, tokens, embd_in, pos, out_ids, masks, idxs, watched)
        self._graphs[key] = ge
        self.n_graph_builds += 1
        while len(self._graphs) > self.MAX_GRAPHS:
            self._graphs.popitem(last=False)
        return ge

    def _apply_shift(self) -> None:
        """Re-rotate cached K of cells whose position moved (seq_add / seq_div)."""
        impl = self.model.impl
        for c in self.memory.caches:
            if not c.has_shift:
                continue
            cells = np.flatnonzero(c.shift != 0)
            n = len(cells)
            idx = ops.new_tensor(GGMLType.I64, (n,), "shift_idx")
            delta = ops.new_tensor(GGMLType.I32, (n,), "shift_pos")
            outs = []
            for ls in c.layers:
                rope = impl.layer_rope(ls.il, self.n_ctx_seq)
                if rope is None:
                    continue
                rope.attn_factor = 1.0
                kbuf = c.k[ls.il]
                hkv = self.model.hparams.n_head_kv[ls.il]
                k = ops.reshape(ops.get_rows(kbuf, idx), (n, hkv, ls.n_embd_k // hkv))
                k = rope.apply(k, delta)
                outs.append(ops.set_rows(kbuf, ops.reshape(k, (n, ls.n_embd_k)), idx))
            if outs:
                self.sched.compute(
                    Graph(outs), {idx: cells.astype(np.int64), delta: c.shift[cells].astype(np.int32)}
                )
            c.shift[:] = 0
            c.has_shift = False

    def _pool(self, ab: AllocatedBatch) -> None:
        self._embd_seq = {}
        if self.pooling_type == 0:
            return
        for s in sorted(set(ab.seq_first.tolist())):
            rows = ab.out_rows[np.flatnonzero(ab.seq_first == s)]
            e = self._embd[rows]
            if self.pooling_type == 1:
                v = e.mean(axis=0)
            elif self.pooling_type == 2:
                v = e[0]
            else:
                v = e[-1]
            self._embd_seq[s] = v.astype(np.float32)

    # -- outputs --------------------------------------------------------------------------------------
    def get_logits(self) -> np.ndarray:
        """F32[n_outputs, n_vocab] of the last decode (rows in batch order of the output tokens)."""
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
        return self._logits[self._row(i, len(self._logits), "logits")]

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

    def state_seq_set_data(self, data: bytes, seq_id: int = -1) -> int:
        h = self._state_header()
        if bytes(data[: len(h)]) != h:
            raise StateError("saved state is from another model or format (header mismatch)")
        return len(h) + self.memory.state_read(memoryview(data)[len(h) :], seq_id)

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
