"""Hybrid memory (llama.cpp's ``llama_memory_hybrid``): the KV caches of the attention layers (``Memory``)
beside the recurrent states of the recurrent layers (``RecurrentCache``), under one set of sequence
operations. A model with no attention layer (Mamba2) has only the recurrent part.

What the pair changes for a context: ubatches are split sequence-wise with equal lengths (the recurrent
layers run ``n_seqs`` streams of ``n_seq_tokens`` tokens), a ``seq_rm`` the states cannot honour is
refused before the KV cache is touched, and saved state carries the recurrent rows after the KV cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..batch import AllocatedBatch, UBatch
from ..graph_inputs import GraphInput
from ..model.blocks import Inputs
from . import Memory, StateError
from .recurrent import RecurrentCache, RecurrentLayer, RSInputs

__all__ = ["HybridMemory"]


class HybridMemory(Memory):
    """``Memory`` (KV caches of the non-recurrent layers) plus ``recurrent`` (the recurrent layers')."""

    has_checkpoints = True  # seq_rm of a tail needs a checkpoint (prompt caches take them)

    def __init__(self, hp: Any, *args: Any, **kwargs: Any) -> None:  # (Memory's arguments)
        super().__init__(hp, *args, **kwargs)
        layers = [
            RecurrentLayer(il, hp.n_embd_r, hp.n_embd_s) for il in range(hp.n_layer) if hp.is_recurrent(il)
        ]
        # M-RoPE positions may repeat (an image's patches) or jump: the states then only need them in order
        self.recurrent = RecurrentCache(layers, self.n_seq_max, strict_pos=self.n_pos_per_embd == 1)

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.recurrent.nbytes

    # -- llama_memory_* -------------------------------------------------------------------------------
    def clear(self, data: bool = False) -> None:
        super().clear(data)
        self.recurrent.clear()

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """As ``Memory.seq_rm``; False (nothing changed) also when the range cuts a sequence that a
        recurrent state summarizes (only whole sequences can be removed from it)."""
        self._check_seq(seq_id)
        if not self.recurrent.can_rm(seq_id, p0, p1):
            return False
        if not super().seq_rm(seq_id, p0, p1):
            return False
        return self.recurrent.seq_rm(seq_id, p0, p1)

    def checkpoint(self, seq_id: int) -> int:
        """Keep the recurrent states of ``seq_id`` at its last position (returned), so that a later
        ``seq_rm(seq_id, pos + 1, -1)`` goes back to them (the KV cells are simply removed)."""
        self._check_seq(seq_id, False)
        return self.recurrent.checkpoint(seq_id)

    def seq_pos_restorable(self, seq_id: int, p0: int) -> int:
        """The largest ``q <= p0`` that ``seq_rm(seq_id, q, -1)`` accepts (keep ``q`` tokens, decode the
        rest)."""
        self._check_seq(seq_id, False)
        return self.recurrent.seq_pos_restorable(seq_id, p0)

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        """Copy the KV cells in [p0, p1) and the whole recurrent state (it has no positions to pick)."""
        super().seq_cp(seq_id_src, seq_id_dst, p0, p1)
        self.recurrent.seq_cp(seq_id_src, seq_id_dst)

    def seq_keep(self, seq_id: int) -> None:
        super().seq_keep(seq_id)
        self.recurrent.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        super().seq_add(seq_id, p0, p1, delta)
        self.recurrent.seq_add(seq_id, p0, p1, int(delta))

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        super().seq_div(seq_id, p0, p1, d)
        self.recurrent.seq_div(seq_id, p0, p1, int(d))

    def seq_pos_min(self, seq_id: int) -> int:
        kv = super().seq_pos_min(seq_id) if self.caches else -1
        rs = self.recurrent.seq_pos_min(seq_id)
        return kv if rs < 0 else (rs if kv < 0 else min(kv, rs))

    def seq_pos_max(self, seq_id: int) -> int:
        kv = super().seq_pos_max(seq_id) if self.caches else -1
        return max(kv, self.recurrent.seq_pos_max(seq_id))

    # -- ubatches -------------------------------------------------------------------------------------
    def split(self, ab: AllocatedBatch, n_ubatch: int) -> list[UBatch]:
        ubs = ab.split_equal(n_ubatch, seq_major=True)
        self._one_ubatch = len(ubs) == 1  # the next snapshot need not save state rows (nothing can fail
        return ubs  # after the only ubatch's placement)

    def snapshot(self) -> list:
        """Positions of every cache; the recurrent rows that the coming ubatches overwrite are saved as
        they are placed, unless the batch is one ubatch (a decode step: no copy)."""
        guard = not getattr(self, "_one_ubatch", False)
        self._one_ubatch = False
        return [*super().snapshot(), self.recurrent.snapshot(guard)]

    def restore(self, snap: Sequence) -> None:
        super().restore(snap[:-1])
        self.recurrent.restore(snap[-1])

    def place(
        self,
        pos: np.ndarray,
        seq_bits: np.ndarray,
        seq_first: np.ndarray | None = None,
        mpos: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        idxs = super().place(pos, seq_bits, seq_first, mpos)
        if seq_first is None:
            raise StateError("hybrid memory: place() needs the ubatch's seq_first")
        self.recurrent.place(pos, seq_bits, seq_first)
        return idxs

    def graph_key(self) -> tuple:
        return super().graph_key() + self.recurrent.graph_key()

    def build_inputs(self, inp: Inputs, causal: bool | None = None) -> list[GraphInput]:
        """The KV caches' inputs and the recurrent-state rows (``inp.rs``: ``RSInputs``)."""
        rs: RSInputs = self.recurrent.build_inputs()
        inp.rs = rs
        return [*super().build_inputs(inp, causal), rs]

    # -- state ----------------------------------------------------------------------------------------
    def state_write(self, seq_id: int = -1) -> bytes:
        return super().state_write(seq_id) + self.recurrent.state_write(seq_id)

    def state_size_max(self, n_pos: int) -> int:
        return super().state_size_max(n_pos) + self.recurrent.state_nbytes(1 if n_pos else 0)

    def state_read(self, data: bytes, seq_id: int = -1, n_pos: int | None = None) -> int:
        snap = self.snapshot()
        try:
            off = super().state_read(data, seq_id, n_pos)
            return self.recurrent.state_read(data, seq_id, off, n_pos)
        except StateError:
            self.restore(snap)
            raise
