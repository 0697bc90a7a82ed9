"""Memory of a context: the KV cache, split into a full cache for global-attention layers and a small
sliding-window cache for local layers when the model has them (as llama.cpp's iswa cache).

``Memory`` offers llama.cpp's ``llama_memory_*`` operations: ``seq_rm``, ``seq_cp``, ``seq_keep``,
``seq_add`` (positions shift; K is re-rotated before the next decode), ``seq_div``, ``seq_pos_min``,
``seq_pos_max`` and ``clear``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import LlamapyError
from ..ggml.types import GGMLType
from .kv_cache import N_PAD, ContextFullError, KVCache, LayerShape, StateError, kv_type, pad_to, seq_bits_of

__all__ = ["ContextFullError", "KVCache", "Memory", "StateError", "kv_type", "seq_bits_of"]


class Memory:
    """The KV caches of one context (``caches[0]`` full-attention, ``caches[1]`` sliding-window if any)."""

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
        shapes = [LayerShape(il, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)) for il in range(n_layer)]  # type: ignore[attr-defined]
        causal = bool(getattr(hp, "causal_attn", True))
        swa = [hp.is_swa(il) for il in range(n_layer)] if hp.has_swa else [False] * n_layer  # type: ignore[attr-defined]
        full_layers = [s for s, w in zip(shapes, swa, strict=False) if not w]
        swa_layers = [s for s, w in zip(shapes, swa, strict=False) if w]
        self.caches: list[KVCache] = []
        self.layer_cache: dict[int, KVCache] = {}
        if full_layers:
            c = KVCache(full_layers, n_ctx, tk, tv, n_seq_max, 0, causal, name="KV")
            self.caches.append(c)
        if swa_layers:
            n_swa = hp.n_swa  # type: ignore[attr-defined]
            size = n_ctx if swa_full else min(n_ctx, pad_to(n_swa * n_seq_max + n_ubatch, N_PAD))
            c = KVCache(swa_layers, size, tk, tv, n_seq_max, n_swa, causal, name="SWA KV")
            self.caches.append(c)
        for c in self.caches:
            for ls in c.layers:
                self.layer_cache[ls.il] = c
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)

    @property
    def has_shift(self) -> bool:
        return any(c.has_shift for c in self.caches)

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
                for s in seqs:
                    have = c.pos[c._seq_cells(s, max(0, p0 - c.n_swa + 1), p0)]
                    last = c.seq_pos_max(s)
                    if last < 0:
                        continue
                    need = min(p0, last + 1) - max(0, p0 - c.n_swa + 1)
                    if len(np.unique(have)) < need:
                        return False
        for c in self.caches:
            c.seq_rm(seq_id, p0, p1)
        return True

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

    def place(self, pos: np.ndarray, seq_bits: np.ndarray) -> list[np.ndarray]:
        """Find and take cells for one ubatch in every cache (ContextFullError when one is full)."""
        idxs = [c.find_slot(pos, seq_bits) for c in self.caches]
        for c, idx in zip(self.caches, idxs, strict=False):
            c.apply(idx, pos, seq_bits)
        return idxs

    # -- state ----------------------------------------------------------------------------------------
    def state_write(self, seq_id: int = -1) -> bytes:
        self._check_seq(seq_id)
        if self.has_shift:
            raise StateError("cannot save state while a position shift is pending (decode once first)")
        return b"".join(c.state_write(seq_id) for c in self.caches)

    def state_read(self, data: bytes, seq_id: int = -1) -> int:
        self._check_seq(seq_id)
        snap = self.snapshot()
        off = 0
        try:
            for c in self.caches:
                off = c.state_read(data, seq_id, off)
        except (StateError, ContextFullError):
            self.restore(snap)
            raise
        return off
