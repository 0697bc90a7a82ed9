"""Memory of a context: the KV cache, split into a full cache for global-attention layers and a small
sliding-window cache for local layers when the model has them (as llama.cpp's iswa cache).

``Memory`` offers llama.cpp's ``llama_memory_*`` operations: ``seq_rm``, ``seq_cp``, ``seq_keep``,
``seq_add`` (positions shift; K is re-rotated before the next decode), ``seq_div``, ``seq_pos_min``,
``seq_pos_max`` and ``clear``.

The memory owns its graph inputs (``build_inputs``: per KV cache the mask and cell indices of the placed
ubatch, filled by ``set_input(ub)``; ``hybrid.HybridMemory`` adds the recurrent-state rows) and the
K-shift graph (``apply_shift``), so that a context never reads cache internals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..batch import AllocatedBatch, UBatch
from ..errors import LlamapyError
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType
from ..graph_inputs import GraphInput, ubatch_mask
from ..model.blocks import Inputs, Rope
from .kv_cache import (
    N_PAD,
    ContextFullError,
    KVCache,
    KVCacheInput,
    LayerShape,
    StateError,
    kv_type,
    pad_to,
    seq_bits_of,
)

__all__ = [
    "ContextFullError", "KVCache", "KVCacheInput", "Memory", "create_memory", "StateError", "kv_type", "seq_bits_of",
    "ubatch_mask",
]  # fmt: skip


def create_memory(hp: Any, *args: Any, **kwargs: Any) -> Memory:
    """``Memory``, or ``HybridMemory`` (KV caches plus recurrent states) when the model has recurrent layers."""
    if any(getattr(hp, "is_recurrent", lambda il: False)(il) for il in range(hp.n_layer)):
        from .hybrid import HybridMemory

        return HybridMemory(hp, *args, **kwargs)
    return Memory(hp, *args, **kwargs)


class Memory:
    """The KV caches of one context (``caches[0]`` full-attention, ``caches[1]`` sliding-window if any)."""

    has_checkpoints = False  # (a recurrent state needs them to go back: hybrid.HybridMemory)

    #: set by ``n_gpu_layers`` when KV buffers live on a GPU (their device copy is the current one):
    #: ``to_host()`` before host code reads buffer data, ``from_host()`` after host code wrote it
    device_sync: Any = None

    def __init__(
        self,
        hp: object,
        n_ctx: int,
        n_ubatch: int,
        n_seq_max: int = 1,
        type_k: str | GGMLType = "f16",
        type_v: str | GGMLType = "f16",
        swa_full: bool = False,
    ) -> None:
        tk, tv = kv_type(type_k), kv_type(type_v)
        for what, t, d in (("K", tk, hp.n_embd_head_k), ("V", tv, hp.n_embd_head_v)):  # type: ignore[attr-defined]
            if t in (GGMLType.Q8_0, GGMLType.Q4_0) and d % 32:
                raise LlamapyError(
                    f"{what} cache type {t.name.lower()} needs a head size that is a multiple of 32, this model has {d}"
                )
        n_layer = hp.n_layer  # type: ignore[attr-defined]
        # KV sharing (Gemma 3n / 4): a layer that reuses an earlier layer's K/V has no buffers of its own
        kv_layer = getattr(hp, "kv_layer", lambda il: il)
        # recurrent layers keep their state in hybrid.HybridMemory (and some no KV: Nemotron-H's MLP layers)
        has_kv = getattr(hp, "has_kv", lambda il: True)
        own = [il for il in range(n_layer) if kv_layer(il) == il and has_kv(il)]
        shapes = [LayerShape(il, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)) for il in own]  # type: ignore[attr-defined]
        causal = bool(getattr(hp, "causal_attn", True))
        alibi = float(getattr(hp, "f_max_alibi_bias", 0.0)) > 0  # the masks hold -|i - j| (MPT, Refact)
        # M-RoPE (rope over position sections): 4 positions per token (llama.cpp's n_pos_per_embd)
        self.n_pos_per_embd = 4 if getattr(hp, "rope_sections", ()) else 1
        p2 = self.n_pos_per_embd == 4
        swa = [hp.is_swa(il) for il in own] if hp.has_swa else [False] * len(own)  # type: ignore[attr-defined]
        full_layers = [s for s, w in zip(shapes, swa, strict=False) if not w]
        swa_layers = [s for s, w in zip(shapes, swa, strict=False) if w]
        if not causal:  # an encoder keeps no KV cache: each ubatch attends over itself (as llama.cpp)
            full_layers, swa_layers = [], []
        self.caches: list[KVCache] = []
        self.layer_cache: dict[int, KVCache] = {}
        if full_layers:
            c = KVCache(full_layers, n_ctx, tk, tv, n_seq_max, 0, causal, name="KV", alibi=alibi, pos_2d=p2)
            self.caches.append(c)
        if swa_layers:
            n_swa = hp.n_swa  # type: ignore[attr-defined]
            size = n_ctx if swa_full else min(n_ctx, pad_to(n_swa * n_seq_max + n_ubatch, N_PAD))
            swa_type = getattr(hp, "swa_type", "standard")
            c = KVCache(swa_layers, size, tk, tv, n_seq_max, n_swa, causal, "SWA KV", swa_type, alibi, p2)
            # a full-size window cache keeps cells that left the window until no cell is free (llama.cpp's
            # round robin): positions a caller goes back to (a draft model's rejected drafts) stay restorable
            c.stale_last = swa_full
            self.caches.append(c)
        for c in self.caches:
            for ls in c.layers:
                self.layer_cache[ls.il] = c
        for il in range(n_layer if causal else 0):  # (an encoder has no cache to share)
            if has_kv(il):
                self.layer_cache.setdefault(il, self.layer_cache[kv_layer(il)])
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.n_head_kv = list(getattr(hp, "n_head_kv", ()))  # per layer, for the K-shift
        # llama_non_causal_type SWA_ONLY (Gemma 4): the full-attention cache stays causal when the context is not
        self.non_causal_swa_only = getattr(hp, "non_causal_type", "all") == "swa_only"

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)

    @property
    def has_shift(self) -> bool:
        return any(c.has_shift for c in self.caches)

    def kv_buffers(self) -> list[Tensor]:
        """Every K and V buffer (where ``n_gpu_layers`` places them)."""
        return [t for c in self.caches for t in (*c.k.values(), *c.v.values())]

    def apply_shift(self, sched: Any, layer_rope: Callable[[int], Rope | None]) -> None:
        """Re-rotate the cached K of cells whose position moved (``seq_add`` / ``seq_div``) with each
        layer's rope (``layer_rope(il)``, None: a layer without one), computed by ``sched``."""
        for c in self.caches:
            if not c.has_shift:
                continue
            shift = c.build_graph_shift(layer_rope, self.n_head_kv)
            if shift is not None:
                sched.compute(*shift)
            c.shift_done()

    def _check_seq(self, seq_id: int, allow_all: bool = True) -> None:
        if not isinstance(seq_id, (int, np.integer)):
            raise LlamapyError(f"seq_id must be an integer, got {type(seq_id).__name__}")
        lo = -1 if allow_all else 0
        if not lo <= seq_id < self.n_seq_max:
            raise LlamapyError(f"seq_id {seq_id} is out of range {lo}..{self.n_seq_max - 1}")

    # -- llama_memory_* -------------------------------------------------------------------------------
    def clear(self, data: bool = False) -> None:
        for c in self.caches:
            c.clear()
            if data:
                for t in (*c.k.values(), *c.v.values()):
                    t.data[:] = 0
        if data and self.device_sync is not None:
            self.device_sync.from_host()

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of ``seq_id`` (-1: every sequence; negative bounds: open).

        Returns False (and changes nothing) when a sliding-window cache no longer holds the window
        before ``p0`` that decoding from ``p0`` would need; the caller must then clear the sequence.
        """
        self._check_seq(seq_id)
        if p0 is not None and p0 > 0:
            for c in self.caches:
                if c.n_swa <= 0:
                    continue
                seqs = range(self.n_seq_max) if seq_id < 0 else [seq_id]
                lo = max(0, int(c.window_start(p0)))  # the window a token at p0 attends over
                for s in seqs:
                    have = c.pos[c._seq_cells(s, lo, p0)]
                    last = c.seq_pos_max(s)
                    if last < 0:
                        continue
                    need = min(p0, last + 1) - lo
                    if len(np.unique(have)) < need:
                        return False
        for c in self.caches:
            c.seq_rm(seq_id, p0, p1)
        return True

    def checkpoint(self, seq_id: int) -> int:
        """Remember the sequence's state at its last position for a later ``seq_rm`` of what follows
        (only recurrent states need it: ``hybrid.HybridMemory``); -1: nothing kept."""
        return -1

    def seq_pos_restorable(self, seq_id: int, p0: int) -> int:
        """The largest ``q <= p0`` that ``seq_rm(seq_id, q, -1)`` accepts (the KV cache: ``p0``)."""
        return max(0, p0)

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        self._check_seq(seq_id_src, False)
        self._check_seq(seq_id_dst, False)
        for c in self.caches:
            c.seq_cp(seq_id_src, seq_id_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self._check_seq(seq_id, False)
        for c in self.caches:
            c.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self._check_seq(seq_id, False)
        for c in self.caches:
            c.seq_add(seq_id, p0, p1, int(delta))

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self._check_seq(seq_id, False)
        for c in self.caches:
            c.seq_div(seq_id, p0, p1, int(d))

    def seq_pos_min(self, seq_id: int) -> int:
        self._check_seq(seq_id, False)
        return max((c.seq_pos_min(seq_id) for c in self.caches), default=-1)

    def seq_pos_max(self, seq_id: int) -> int:
        self._check_seq(seq_id, False)
        return max((c.seq_pos_max(seq_id) for c in self.caches), default=-1)

    # -- ubatches -------------------------------------------------------------------------------------
    def snapshot(self) -> list:
        return [c.snapshot() for c in self.caches]

    def restore(self, snap: Sequence) -> None:
        for c, s in zip(self.caches, snap, strict=False):
            c.restore(s)

    def split(self, ab: AllocatedBatch, n_ubatch: int) -> list[UBatch]:
        """The ubatches of a batch (recurrent memories need sequence-wise splits, as llama.cpp's)."""
        return ab.split_simple(n_ubatch)

    # -- graph inputs (llama.cpp's memory contexts build and fill these) ------------------------------
    def graph_key(self) -> tuple:
        """What of the placed ubatch shapes the graph beyond its tokens (part of the reuse key): the
        cells each KV cache's attention reads."""
        return tuple(c.cur_n_kv for c in self.caches)

    def build_inputs(self, inp: Inputs, causal: bool | None = None) -> list[GraphInput]:
        """The memory's inputs of a new graph for the placed ubatch, set into ``inp`` (``inp.kv``: each
        layer's cache inputs) and returned (each fills itself: ``set_input(ub)``). ``causal`` False:
        attention over the cache is not causal (``Context.set_causal_attn``)."""
        out: list[GraphInput] = []
        for ci, c in enumerate(self.caches):
            cc = None if causal is False and self.non_causal_swa_only and c.n_swa == 0 else causal
            ki = c.build_input(inp.n_tokens, ci, cc)
            out.append(ki)
            for ls in c.layers:
                inp.kv[ls.il] = ki
        return out

    def place(
        self,
        pos: np.ndarray,
        seq_bits: np.ndarray,
        seq_first: np.ndarray | None = None,
        mpos: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """Find and take cells for one ubatch in every cache (ContextFullError when one is full, and
        no cache changed); ``mpos`` int32[T, 4]: M-RoPE positions (the cells keep (h, w) for the 2-D
        causal mask). The placement is what the next graph's inputs read."""
        idxs = [c.find_slot(pos, seq_bits) for c in self.caches]  # every cache has room before any changes
        ext = None if mpos is None else np.asarray(mpos)[:, 1:3].astype(np.int64)
        return [c.place(pos, seq_bits, ext, idx) for c, idx in zip(self.caches, idxs, strict=True)]

    def place_ubatch(self, ub: UBatch) -> None:
        """``place`` the ubatch's tokens."""
        self.place(ub.pos, ub.seq_bits, ub.seq_first, ub.mpos)

    # -- state ----------------------------------------------------------------------------------------
    def state_write(self, seq_id: int = -1) -> bytes:
        self._check_seq(seq_id)
        if self.has_shift:
            raise StateError("cannot save state while a position shift is pending (decode once first)")
        if self.device_sync is not None:
            self.device_sync.to_host()
        return b"".join(c.state_write(seq_id) for c in self.caches)

    def state_size_max(self, n_pos: int) -> int:
        """The most bytes ``state_write(seq)`` gives for a sequence of ``n_pos`` tokens."""
        return sum(c.state_nbytes(min(n_pos, c.n_cells)) for c in self.caches)

    def state_read(self, data: bytes, seq_id: int = -1, n_pos: int | None = None) -> int:
        """Restore ``state_write``'s bytes (into ``seq_id``; -1: the saved sequences); nothing changes when
        they are refused (StateError). ``n_pos``: the sequence holds that many tokens, at positions
        ``0..n_pos-1``, and every cache's cells must say so (a server slot file)."""
        self._check_seq(seq_id)
        snap = self.snapshot()
        off = 0
        if self.device_sync is not None:  # rows the state does not cover keep their device values
            self.device_sync.to_host()
        try:
            for c in self.caches:
                off = c.state_read(data, seq_id, off, n_pos)
        except (StateError, ContextFullError):
            self.restore(snap)
            raise
        finally:
            if self.device_sync is not None:
                self.device_sync.from_host()
        return off
