"""Recurrent-state memory (llama.cpp's ``llama_memory_recurrent``): per sequence and per recurrent layer a
conv state (the last ``d_conv - 1`` inputs of the causal conv) and a recurrent state (the SSM / delta-rule
matrix), both F32, in ggml ``buffer`` tensors of one row per sequence slot (slot ``s`` is sequence ``s``).

A recurrent state summarizes a whole prefix: it cannot forget its last tokens, so ``seq_rm`` of a tail
that leaves part of a sequence is refused (False, nothing changed), as llama.cpp's; removing a whole
sequence, or nothing of it, is fine, and so is a tail that starts right after a checkpoint
(``checkpoint``: a copy of a sequence's rows at its last position, a few kept per sequence; the prompt
cache goes back to the last one at or before a common prefix, ``seq_pos_restorable``). ``seq_cp``
copies the states (and checkpoints); an empty sequence's rows are zero.

A ubatch for this memory is sequence-major with equal lengths (``AllocatedBatch.split_equal(...,
seq_major=True)``): ``n_seqs`` streams of ``n_seq_tokens`` tokens, each stream one set of sequences that
share the stream's state (read from the stream's first sequence, written to all of them). The memory
makes the graph inputs that say which rows to read and write (``RSInputs``, llama.cpp's
``llm_graph_input_rs``), filled from the placed ubatch.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import field

import numpy as np

from .._dataclass import dataclass
from ..batch import UBatch
from ..errors import LlamapyError
from ..ggml import ops
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType
from ..graph_inputs import GraphInput
from .kv_cache import MAX_POS, StateError, StateReader

__all__ = ["RSInputs", "RecurrentCache", "RecurrentLayer"]


@dataclass
class RecurrentLayer:
    il: int
    n_embd_r: int  # conv state floats per sequence ((d_conv - 1) x channels)
    n_embd_s: int  # recurrent state floats per sequence (0: none, e.g. LFM2's short conv)


@dataclass
class RSInputs(GraphInput):
    """A graph's view of the recurrent memory: per-layer state buffers and the rows a ubatch uses
    (``inp_s_copy``, and ``inp_s_wsrc``/``inp_s_wdst`` when a stream's state goes to several sequences)."""

    n_seqs: int
    n_seq_tokens: int
    idx: Tensor  # I64[n_seqs]: the slot each stream reads (and, without w_dst, writes)
    w_src: Tensor | None  # I32[n_pairs]: the stream whose new state goes to w_dst (shared tokens)
    w_dst: Tensor | None  # I64[n_pairs]
    r: dict[int, Tensor]  # layer -> conv state buffer [n_seq_max, n_embd_r]
    s: dict[int, Tensor]  # layer -> recurrent state buffer [n_seq_max, n_embd_s]
    writes: list[Tensor] = field(default_factory=list)
    cache: RecurrentCache | None = None
    # the first of the consecutive slots the streams read and write, one each (None: gather and scatter
    # through ``idx``): the graph then reads and writes views of the buffers, no gather, no scatter
    slot0: int | None = None

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.idx, self.w_src, self.w_dst) if t is not None]

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        """The rows of the placed ubatch (``RecurrentCache.place``)."""
        c = self.cache.current
        vals: dict[Tensor, np.ndarray] = {self.idx: c.src}
        if self.w_dst is not None:
            vals[self.w_src] = c.pairs[:, 0].astype(np.int32)
            vals[self.w_dst] = c.pairs[:, 1].astype(np.int64)
        return vals

    def _rows_view(self, buf: Tensor) -> Tensor:
        return ops.view(buf, (self.n_seqs, buf.shape[1]), buf.strides, self.slot0 * buf.strides[0])

    def read(self, buf: Tensor) -> Tensor:
        """The streams' rows of ``buf``: F32[n_seqs, row] (a view of them when the streams own
        consecutive slots)."""
        if self.slot0 is not None:
            return self._rows_view(buf)
        return ops.get_rows(buf, self.idx)

    def write(self, buf: Tensor, rows: Tensor) -> Tensor:
        """Store ``rows`` (the new states: F32[n_seqs, row], or any shape and strides of ``n_seqs`` rows
        in order) into the streams' slots; the node joins the graph's writes (run after every read of
        this ubatch)."""
        if self.slot0 is not None:
            return self._keep(ops.cpy(rows, ops.reshape(self._rows_view(buf), rows.shape)))
        if rows.ndim != 2 or not rows.is_contiguous():
            rows = ops.reshape(ops.cont(rows), (self.n_seqs, buf.shape[1]))
        if self.w_dst is not None:
            t = ops.set_rows(buf, ops.get_rows(rows, self.w_src), self.w_dst)
        else:
            t = ops.set_rows(buf, rows, self.idx)
        return self._keep(t)

    def _keep(self, t: Tensor) -> Tensor:
        self.writes.append(t)
        return t


MAX_CHECKPOINTS = 4  # per sequence (llama.cpp's server keeps a few context checkpoints per slot)


@dataclass
class _Checkpoint:
    pos_min: int
    pos_max: int
    rows: list[np.ndarray]  # one per buffer (conv states, then recurrent states)


@dataclass
class _Placement:
    n_seqs: int
    n_seq_tokens: int
    src: np.ndarray  # int64[n_seqs]
    pairs: np.ndarray | None  # int64[n_pairs, 2]: (stream, slot) when a stream writes several slots
    slot0: int | None = None  # streams i = slots slot0 + i, each its own (no pairs): read/write in place


class RecurrentCache:
    """Conv and recurrent states of the layers in ``layers`` for ``n_seq_max`` sequences."""

    def __init__(self, layers: Sequence[RecurrentLayer], n_seq_max: int = 1, strict_pos: bool = True) -> None:
        if n_seq_max < 1:
            raise LlamapyError(f"n_seq_max = {n_seq_max} must be at least 1")
        self.layers = list(layers)
        self.n_seq_max = n_seq_max
        # positions of a stream go up by one and continue the state (False, M-RoPE: they only do not
        # decrease, and may start at the state's last position: an image's patches share it)
        self.strict_pos = strict_pos
        self.r: dict[int, Tensor] = {}
        self.s: dict[int, Tensor] = {}
        for ls in self.layers:
            if ls.n_embd_r <= 0:
                raise LlamapyError(f"recurrent layer {ls.il}: conv state size {ls.n_embd_r} must be positive")
            self.r[ls.il] = ops.buffer(f"cache_r_l{ls.il}", GGMLType.F32, (n_seq_max, ls.n_embd_r))
            if ls.n_embd_s > 0:
                self.s[ls.il] = ops.buffer(f"cache_s_l{ls.il}", GGMLType.F32, (n_seq_max, ls.n_embd_s))
        self.pos_min = np.full(n_seq_max, -1, dtype=np.int64)
        self.pos_max = np.full(n_seq_max, -1, dtype=np.int64)
        self.current: _Placement | None = None
        self._undo: dict[int, list[np.ndarray]] | None = None
        # per sequence: snapshots of its rows at known last positions (``checkpoint``), newest last
        self.checkpoints: dict[int, list[_Checkpoint]] = {}
        self.max_checkpoints = MAX_CHECKPOINTS

    # -- rows -----------------------------------------------------------------------------------------
    def _bufs(self) -> list[Tensor]:
        return [*self.r.values(), *self.s.values()]

    @staticmethod
    def _rows(t: Tensor) -> np.ndarray:
        return t.data.view(np.float32).reshape(t.shape)

    def _zero(self, slot: int) -> None:
        for t in self._bufs():
            self._rows(t)[slot] = 0.0
        self.pos_min[slot] = self.pos_max[slot] = -1
        self.checkpoints.pop(slot, None)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._bufs())

    def _seqs(self, seq_id: int) -> range | list[int]:
        return range(self.n_seq_max) if seq_id < 0 else [seq_id]

    # -- llama_memory_* -------------------------------------------------------------------------------
    def clear(self) -> None:
        for t in self._bufs():
            t.data[:] = 0
        self.pos_min[:] = -1
        self.pos_max[:] = -1
        self.checkpoints = {}

    def seq_pos_min(self, seq_id: int) -> int:
        return int(self.pos_min[seq_id])

    def seq_pos_max(self, seq_id: int) -> int:
        return int(self.pos_max[seq_id])

    def _checkpoint_at(self, s: int, last: int) -> _Checkpoint | None:
        return next((c for c in self.checkpoints.get(s, []) if c.pos_max == last), None)

    def can_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Whether ``seq_rm`` can honour the range: it removes all of each sequence or none of it, or a
        tail from just after a checkpoint (the state goes back to the checkpoint's)."""
        lo = 0 if p0 is None or p0 < 0 else p0
        hi = np.iinfo(np.int64).max if p1 is None or p1 < 0 else p1
        for s in self._seqs(seq_id):
            a, b = self.pos_min[s], self.pos_max[s]
            if b < 0 or hi <= a or lo > b:  # empty, or the range misses the sequence
                continue
            if lo <= a and hi > b:  # all of it
                continue
            if hi > b and self._checkpoint_at(s, lo - 1) is not None:  # a tail a checkpoint covers
                continue
            return False  # part of it: the state cannot forget that
        return True

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        if not self.can_rm(seq_id, p0, p1):
            return False
        lo = 0 if p0 is None or p0 < 0 else p0
        hi = np.iinfo(np.int64).max if p1 is None or p1 < 0 else p1
        for s in self._seqs(seq_id):
            if self.pos_max[s] < 0 or hi <= self.pos_min[s] or lo > self.pos_max[s]:
                continue
            if lo <= self.pos_min[s]:
                self._zero(s)
                continue
            c = self._checkpoint_at(s, lo - 1)
            for t, row in zip(self._bufs(), c.rows, strict=True):
                self._rows(t)[s] = row
            self.pos_min[s], self.pos_max[s] = c.pos_min, c.pos_max
            self.checkpoints[s] = [k for k in self.checkpoints[s] if k.pos_max <= c.pos_max]
        return True

    # -- checkpoints (the prompt cache's way back into a recurrent state) ----------------------------
    def checkpoint(self, seq_id: int) -> int:
        """Keep a copy of ``seq_id``'s states at its last position (returned; -1: nothing to keep), so
        that ``seq_rm(seq_id, pos + 1, -1)`` can come back to it; the oldest of ``max_checkpoints`` go."""
        last = int(self.pos_max[seq_id])
        if last < 0:
            return -1
        rows = [self._rows(t)[seq_id].copy() for t in self._bufs()]
        keep = [c for c in self.checkpoints.get(seq_id, []) if c.pos_max != last]
        keep.append(_Checkpoint(int(self.pos_min[seq_id]), last, rows))
        self.checkpoints[seq_id] = sorted(keep, key=lambda c: c.pos_max)[-self.max_checkpoints :]
        return last

    def seq_pos_restorable(self, seq_id: int, p0: int) -> int:
        """The largest ``q <= p0`` for which ``seq_rm(seq_id, q, -1)`` succeeds (0: start over)."""
        a, b = int(self.pos_min[seq_id]), int(self.pos_max[seq_id])
        if b < 0 or p0 > b or p0 <= a:  # empty, nothing to remove, or all of it
            return max(0, p0)
        best = [c.pos_max + 1 for c in self.checkpoints.get(seq_id, []) if c.pos_max + 1 <= p0]
        return max([a, *best])  # from the first position: all of it

    def seq_cp(self, src: int, dst: int) -> None:
        if src == dst:
            return
        for t in self._bufs():
            rows = self._rows(t)
            rows[dst] = rows[src]
        self.pos_min[dst], self.pos_max[dst] = self.pos_min[src], self.pos_max[src]
        self.checkpoints[dst] = list(self.checkpoints.get(src, []))  # (their rows are never written)

    def seq_keep(self, seq_id: int) -> None:
        for s in range(self.n_seq_max):
            if s != seq_id:
                self._zero(s)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Positions of the sequence move by ``delta`` when its last one is in [p0, p1); below 0 the
        sequence is gone (as llama.cpp's)."""
        lo = 0 if p0 is None or p0 < 0 else p0
        hi = np.iinfo(np.int64).max if p1 is None or p1 < 0 else p1
        for s in self._seqs(seq_id):
            if self.pos_max[s] >= 0 and lo <= self.pos_max[s] < hi:
                self.checkpoints.pop(s, None)  # their positions no longer mean the same tokens
                self.pos_max[s] += delta
                self.pos_min[s] = max(0, self.pos_min[s] + delta)
                if self.pos_max[s] < 0:
                    self._zero(s)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        lo = 0 if p0 is None or p0 < 0 else p0
        hi = np.iinfo(np.int64).max if p1 is None or p1 < 0 else p1
        for s in self._seqs(seq_id):
            if self.pos_max[s] >= 0 and lo <= self.pos_max[s] < hi:
                self.checkpoints.pop(s, None)
                self.pos_max[s] //= d
                self.pos_min[s] //= d

    # -- ubatches -------------------------------------------------------------------------------------
    def snapshot(self, guard: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Positions now; with ``guard`` the state rows a later ``place`` overwrites are saved as it goes
        (undo; without, a failure after a computed ubatch could not be undone)."""
        self._undo = {} if guard else None
        return self.pos_min.copy(), self.pos_max.copy()

    def restore(self, snap: tuple[np.ndarray, np.ndarray]) -> None:
        self.pos_min, self.pos_max = snap[0].copy(), snap[1].copy()
        for slot, saved in (self._undo or {}).items():
            for t, row in zip(self._bufs(), saved, strict=True):
                self._rows(t)[slot] = row
        self._undo = None

    def place(self, pos: np.ndarray, seq_bits: np.ndarray, seq_first: np.ndarray) -> _Placement:
        """Check a sequence-major, equal-length ubatch and record it (its rows are read and written by
        the graph the next compute runs)."""
        n = len(pos)
        cut = np.flatnonzero(np.diff(seq_bits.astype(np.uint64)) != 0) + 1
        starts = np.concatenate([[0], cut])
        lens = np.diff(np.concatenate([starts, [n]]))
        if n == 0 or (lens != lens[0]).any():
            raise LlamapyError(
                "recurrent memory: a ubatch must hold equal runs of tokens per sequence set, got "
                f"{lens.tolist()}"
            )
        n_t = int(lens[0])
        src = seq_first[starts].astype(np.int64)
        pairs: list[tuple[int, int]] = []
        moves: list[tuple[int, int, int]] = []  # (slot, first, last), applied once all is checked
        seen = 0
        for i, st in enumerate(starts):
            bits = int(seq_bits[st])
            if bits & seen:
                raise LlamapyError("recurrent memory: two streams of one ubatch share a sequence")
            seen |= bits
            p = pos[st : st + n_t].astype(np.int64)
            if (np.diff(p) != 1).any() if self.strict_pos else (np.diff(p) < 0).any():
                raise LlamapyError(
                    f"recurrent memory: positions of a stream are not in order: {p[:8].tolist()}"
                )
            s0 = int(src[i])
            first = self.pos_min[s0] if self.pos_max[s0] >= 0 else p[0]
            for s in (b for b in range(self.n_seq_max) if bits >> b & 1):
                last = self.pos_max[s]
                if last >= 0 and (p[0] != last + 1 if self.strict_pos else p[0] < last):
                    raise LlamapyError(
                        f"recurrent memory: sequence {s} continues at position {int(p[0])}, its state ends "
                        f"at "
                        f"{int(self.pos_max[s])} (a recurrent state takes tokens in order)"
                    )
                pairs.append((i, s))
                moves.append((s, int(first), int(p[-1])))
        for s, first, last in moves:
            if self._undo is not None and s not in self._undo:
                self._undo[s] = [self._rows(t)[s].copy() for t in self._bufs()]
            self.pos_min[s], self.pos_max[s] = first, last
        many = len(pairs) != len(starts)
        own = not many and bool((src == src[0] + np.arange(len(src))).all())
        self.current = _Placement(
            len(starts), n_t, src, np.array(pairs, np.int64) if many else None, int(src[0]) if own else None
        )
        return self.current

    # -- graph inputs ---------------------------------------------------------------------------------
    def graph_key(self) -> tuple:
        c = self.current
        if c is None:
            return ()
        return (c.n_seqs, c.n_seq_tokens, 0 if c.pairs is None else len(c.pairs), c.slot0)

    def build_inputs(self) -> RSInputs:
        c = self.current
        if c is None:
            raise LlamapyError("recurrent memory: no ubatch placed before the graph was built")
        idx = ops.new_tensor(GGMLType.I64, (c.n_seqs,), "inp_s_copy")
        w_src = w_dst = None
        if c.pairs is not None:
            w_src = ops.new_tensor(GGMLType.I32, (len(c.pairs),), "inp_s_wsrc")
            w_dst = ops.new_tensor(GGMLType.I64, (len(c.pairs),), "inp_s_wdst")
        return RSInputs(
            c.n_seqs, c.n_seq_tokens, idx, w_src, w_dst, self.r, self.s, cache=self, slot0=c.slot0
        )

    # -- state ----------------------------------------------------------------------------------------
    def state_write(self, seq_id: int) -> bytes:
        """Per saved sequence: its id, first and last position, then each layer's conv and state rows."""
        seqs = [s for s in self._seqs(seq_id) if self.pos_max[s] >= 0]
        parts = [struct.pack("<4sII", b"RSST", len(seqs), len(self.layers))]
        for ls in self.layers:
            parts.append(struct.pack("<III", ls.il, ls.n_embd_r, ls.n_embd_s))
        for s in seqs:
            parts.append(struct.pack("<Iqq", s, self.pos_min[s], self.pos_max[s]))
            for t in self._bufs():
                parts.append(self._rows(t)[s].astype("<f4").tobytes())
        return b"".join(parts)

    def state_nbytes(self, n_seqs: int) -> int:
        """The size of what ``state_write`` gives for ``n_seqs`` sequences."""
        return 12 + 12 * len(self.layers) + n_seqs * (20 + sum(4 * t.shape[1] for t in self._bufs()))

    def state_read(
        self, data: bytes | memoryview, seq_id: int, offset: int = 0, n_pos: int | None = None
    ) -> int:
        """Restore what ``state_write`` saved into ``seq_id`` (-1: the saved sequences); returns the new
        offset. ``n_pos``: the sequence holds that many tokens (a server slot file), so its state must end
        at position ``n_pos - 1`` (and be absent when ``n_pos`` is 0)."""
        mv = memoryview(data)
        reader = StateReader(mv, offset, "recurrent")
        take = reader.take

        magic, n_seqs, n_layers = struct.unpack("<4sII", take(12, "header"))
        if magic != b"RSST":
            raise StateError(f"recurrent state at byte {offset}: bad magic {magic!r}")
        if n_layers != len(self.layers):
            raise StateError(
                f"recurrent state: saved {n_layers} recurrent layers, this model has {len(self.layers)}"
            )
        for ls in self.layers:
            got = struct.unpack("<III", take(12, "layer header"))
            if got != (ls.il, ls.n_embd_r, ls.n_embd_s):
                raise StateError(
                    f"recurrent state: layer {got[0]} with state sizes {got[1]}/{got[2]} does not match "
                    f"layer "
                    f"{ls.il} ({ls.n_embd_r}/{ls.n_embd_s})"
                )
        if seq_id >= 0 and n_seqs > 1:
            raise StateError(
                f"recurrent state holds {n_seqs} sequences; one was expected for sequence {seq_id}"
            )
        if n_seqs > self.n_seq_max or len(mv) - offset < self.state_nbytes(n_seqs):
            raise StateError(
                f"recurrent state at byte {offset}: truncated, or more sequences than {self.n_seq_max}"
            )
        if seq_id >= 0 and n_pos is not None and n_seqs != (1 if n_pos else 0):
            raise StateError(f"recurrent state holds {n_seqs} sequences for a sequence of {n_pos} tokens")
        rows: list[tuple[int, int, int, list[np.ndarray]]] = []
        seen: set[int] = set()
        for _ in range(n_seqs):
            s, p0, p1 = struct.unpack("<Iqq", take(20, "sequence header"))
            dst = seq_id if seq_id >= 0 else s
            if not 0 <= dst < self.n_seq_max or dst in seen:
                raise StateError(
                    f"recurrent state: sequence {dst} is out of range 0..{self.n_seq_max - 1} or saved twice"
                )
            seen.add(dst)
            if not 0 <= p0 <= p1 < MAX_POS:
                raise StateError(f"recurrent state: sequence {s} spans positions {p0}..{p1}")
            if seq_id >= 0 and n_pos is not None and p1 != n_pos - 1:
                raise StateError(
                    f"recurrent state: sequence {s} ends at position {p1}, its {n_pos} tokens end at {n_pos - 1}"
                )
            vals = [
                np.frombuffer(take(4 * t.shape[1], f"layer rows of sequence {s}"), "<f4")
                for t in self._bufs()
            ]
            rows.append((dst, p0, p1, vals))
        if seq_id >= 0:
            self._zero(seq_id)
        else:
            self.clear()
        for dst, p0, p1, vals in rows:
            for t, v in zip(self._bufs(), vals, strict=True):
                self._rows(t)[dst] = v
            self.pos_min[dst], self.pos_max[dst] = p0, p1
        return reader.off
