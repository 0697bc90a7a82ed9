"""The KV cache: per-layer K and V buffers over ``n_cells`` cells, and the cells' bookkeeping.

A cell holds one token's keys/values for every layer of the cache; it carries a position and a set of
sequence ids (a bit mask, so a cell can be shared by several sequences after ``seq_cp``). The buffers
are ggml ``buffer`` tensors (types F16, F32, Q8_0, Q4_0) that the graphs write with ``set_rows`` and
read through views of the first ``n_kv`` cells.

A sliding-window cache (``n_swa > 0``) treats cells whose position has left every query's window as
free, so a local-attention layer never needs more than ``n_swa * n_seq + n_ubatch`` cells. The window is
the last ``n_swa`` positions, or (``swa_type="chunked"``, Llama 4) the query's chunk of ``n_swa``.

An M-RoPE cache (``pos_2d``) also keeps each cell's (y, x) = (h, w) positions: tokens of one image share
their position ``t``, and among cells at the query's own ``t`` the causal mask lets it see those before it
in raster order (llama.cpp's ``llama_kv_cell_ext::is_2d_gt``).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .._dataclass import dataclass
from ..batch import UBatch
from ..errors import LlamapyError
from ..ggml import ops
from ..ggml.graph import Graph
from ..ggml.tensor import Tensor
from ..ggml.types import GGMLType, row_size
from ..graph_inputs import GraphInput
from ..model.blocks import KVInputs, Rope

MAX_SEQ = 64  # sequence ids are bits of a uint64
MAX_POS = 1 << 31  # positions are llama.cpp's llama_pos (int32)
N_PAD = 256  # n_kv is padded to a multiple of this so graph shapes repeat between decode steps
KV_TYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}


class ContextFullError(LlamapyError):
    """The KV cache has no free cells for a ubatch (the context is full)."""


class StateError(LlamapyError):
    """Saved sequence state does not fit this context (other model, layout or size)."""


class StateReader:
    """A saved state read in order from ``off``: ``take`` the next bytes, or a :class:`StateError` naming
    ``what`` (``"{name} state at byte N: truncated ..."``) where the buffer ends first."""

    def __init__(self, mv: memoryview, off: int, name: str) -> None:
        self.mv, self.off, self.name = mv, off, name

    def take(self, nbytes: int, what: str) -> memoryview:
        if self.off + nbytes > len(self.mv):
            raise StateError(f"{self.name} state at byte {self.off}: truncated {what}")
        b = self.mv[self.off : self.off + nbytes]
        self.off += nbytes
        return b


def kv_type(name: str | GGMLType) -> GGMLType:
    if isinstance(name, GGMLType):
        t = name
    else:
        t = KV_TYPES.get(str(name).lower())
        if t is None:
            raise LlamapyError(f"KV cache type {name!r} is not supported (use one of {', '.join(KV_TYPES)})")
    if t not in KV_TYPES.values():
        raise LlamapyError(f"KV cache type {t.name} is not supported (use one of {', '.join(KV_TYPES)})")
    return t


def pad_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


@dataclass
class LayerShape:
    """A layer's index and the widths of its K and V rows in the cache."""

    il: int
    n_embd_k: int  # n_head_kv * head_dim_k
    n_embd_v: int


class KVCache:
    """Cells plus per-layer buffers for the layers in ``layers``."""

    # a window cache takes cells that left their sequence's window only when no cell is free (set for a
    # full-size window cache, ``swa_full``: positions a caller may go back to stay restorable, as llama.cpp's
    # round robin)
    stale_last = False

    def __init__(
        self,
        layers: Sequence[LayerShape],
        n_cells: int,
        type_k: GGMLType,
        type_v: GGMLType,
        n_seq_max: int = 1,
        n_swa: int = 0,
        causal: bool = True,
        name: str = "kv",
        swa_type: str = "standard",
        alibi: bool = False,
        pos_2d: bool = False,
    ) -> None:
        if n_cells <= 0:
            raise LlamapyError(f"{name}: a KV cache needs at least one cell, got {n_cells}")
        if not 1 <= n_seq_max <= MAX_SEQ:
            raise LlamapyError(f"n_seq_max = {n_seq_max} must be in 1..{MAX_SEQ}")
        self.name = name
        self.n_cells = n_cells
        self.n_seq_max = n_seq_max
        if swa_type not in ("standard", "chunked"):
            raise LlamapyError(f"{name}: sliding-window type {swa_type!r} is not standard or chunked")
        self.n_swa = n_swa
        self.swa_type = swa_type  # "chunked" (Llama 4): a token sees only its own chunk of n_swa positions
        self.alibi = (
            alibi  # the mask holds -(query pos - key pos) for ALiBi, scaled per head by the attention
        )
        self.causal = causal
        self.type_k, self.type_v = type_k, type_v
        self.layers = list(layers)
        self.k: dict[int, Tensor] = {}
        self.v: dict[int, Tensor] = {}
        for ls in self.layers:
            for what, t, n in (("k", type_k, ls.n_embd_k), ("v", type_v, ls.n_embd_v)):
                if n % 32 and t in (GGMLType.Q8_0, GGMLType.Q4_0):
                    raise LlamapyError(
                        f"layer {ls.il}: {what} row of {n} values cannot use {t.name} (blocks of 32)"
                    )
                buf = ops.buffer(f"cache_{what}_l{ls.il}", t, (n_cells, n))
                (self.k if what == "k" else self.v)[ls.il] = buf
        self.pos = np.full(n_cells, -1, dtype=np.int64)
        self.seq = np.zeros(n_cells, dtype=np.uint64)
        self.shift = np.zeros(n_cells, dtype=np.int64)
        self.has_shift = False
        # M-RoPE: (y, x) of each cell (text tokens: (pos, pos)), for the 2-D causal order within one t
        self.ext: np.ndarray | None = np.zeros((n_cells, 2), dtype=np.int64) if pos_2d else None
        self.slot = np.zeros(0, dtype=np.int64)  # cells of the placed ubatch (``place``)
        self.cur_n_kv = 1  # cells its graph reads

    # -- bookkeeping ----------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.k.values()) + sum(t.nbytes for t in self.v.values())

    def used(self) -> int:
        return int(np.count_nonzero(self.seq))

    def _bit(self, seq_id: int) -> np.uint64:
        if not 0 <= seq_id < self.n_seq_max:
            raise LlamapyError(
                f"seq_id {seq_id} is out of range 0..{self.n_seq_max - 1} (n_seq_max = {self.n_seq_max})"
            )
        return np.uint64(1 << seq_id)

    def _seq_cells(self, seq_id: int, p0: int, p1: int) -> np.ndarray:
        """Cells of ``seq_id`` (-1: any sequence) with position in [p0, p1) (negative bounds: open)."""
        p0 = 0 if p0 is None or p0 < 0 else p0
        p1 = np.iinfo(np.int64).max if p1 is None or p1 < 0 else p1
        sel = (self.pos >= p0) & (self.pos < p1)
        if seq_id < 0:
            return sel & (self.seq != 0)
        return sel & ((self.seq & self._bit(seq_id)) != 0)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        return self.pos.copy(), self.seq.copy(), self.shift.copy(), self.has_shift

    def restore(self, snap: tuple[np.ndarray, np.ndarray, np.ndarray, bool]) -> None:
        self.pos, self.seq, self.shift, self.has_shift = (
            snap[0].copy(),
            snap[1].copy(),
            snap[2].copy(),
            snap[3],
        )

    def clear(self) -> None:
        self.pos[:] = -1
        self.seq[:] = 0
        self.shift[:] = 0
        self.has_shift = False

    def seq_pos_min(self, seq_id: int) -> int:
        sel = self._seq_cells(seq_id, -1, -1)
        return int(self.pos[sel].min()) if sel.any() else -1

    def seq_pos_max(self, seq_id: int) -> int:
        sel = self._seq_cells(seq_id, -1, -1)
        return int(self.pos[sel].max()) if sel.any() else -1

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        sel = self._seq_cells(seq_id, p0, p1)
        if seq_id < 0:
            self.seq[sel] = 0
        else:
            self.seq[sel] &= ~self._bit(seq_id)
        self.pos[self.seq == 0] = -1
        self.shift[self.seq == 0] = 0
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        if src == dst:
            return
        sel = self._seq_cells(src, p0, p1)
        self.seq[sel] |= self._bit(dst)

    def seq_keep(self, seq_id: int) -> None:
        bit = self._bit(seq_id)
        keep = (self.seq & bit) != 0
        self.seq[keep] = bit
        self.seq[~keep] = 0
        self.pos[~keep] = -1
        self.shift[~keep] = 0

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions of ``seq_id`` in [p0, p1) by ``delta``; cells pushed below 0 are freed."""
        if delta == 0:
            return
        sel = self._seq_cells(seq_id, p0, p1)
        self.pos[sel] += delta
        self.shift[sel] += delta
        gone = sel & (self.pos < 0)
        self.seq[gone] = 0
        self.pos[gone] = -1
        self.shift[gone] = 0
        self.has_shift = bool(np.any(self.shift != 0))

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        if d == 1:
            return
        if d <= 0:
            raise LlamapyError(f"seq_div: divisor {d} must be positive")
        sel = self._seq_cells(seq_id, p0, p1)
        new = self.pos[sel] // d
        self.shift[sel] += new - self.pos[sel]
        self.pos[sel] = new
        self.has_shift = bool(np.any(self.shift != 0))

    # -- placing a ubatch -----------------------------------------------------------------------------
    def find_slot(self, pos: np.ndarray, seq_bits: np.ndarray) -> np.ndarray:
        """Cells for ``len(pos)`` new tokens (lowest free first); raises ContextFullError."""
        n = len(pos)
        free = self.seq == 0
        if self.n_swa > 0:
            # a cell of one sequence whose position left the window of that sequence's next token
            single = (self.seq != 0) & ((self.seq & (self.seq - np.uint64(1))) == 0)
            if single.any():
                for s in range(self.n_seq_max):
                    bit = np.uint64(1 << s)
                    mine = (self.seq & bit) != 0
                    if not mine.any():
                        continue
                    nxt = int(self.pos[mine].max()) + 1
                    free |= single & mine & (self.pos < self.window_start(nxt))
        idx = np.flatnonzero(free)
        if self.stale_last and self.n_swa > 0:
            idx = np.concatenate([np.flatnonzero(self.seq == 0), np.flatnonzero(free & (self.seq != 0))])
        if len(idx) < n:
            raise ContextFullError(
                f"the {self.name} cache is full: {n} tokens need cells, {len(idx)} of {self.n_cells} are free "
                f"(raise n_ctx, or remove tokens with memory.seq_rm)"
            )
        return idx[:n].astype(np.int64)

    def place(
        self,
        pos: np.ndarray,
        seq_bits: np.ndarray,
        ext: np.ndarray | None = None,
        idx: np.ndarray | None = None,
    ) -> np.ndarray:
        """Take cells ``idx`` (None: ``find_slot``'s, ContextFullError when full) for a ubatch; they and the
        cells its graph reads (``n_kv``) are kept for the graph inputs (``build_input``)."""
        self.slot = self.find_slot(pos, seq_bits) if idx is None else idx
        self.apply(self.slot, pos, seq_bits, ext)
        self.cur_n_kv = self.n_kv()
        return self.slot

    def apply(
        self, idx: np.ndarray, pos: np.ndarray, seq_bits: np.ndarray, ext: np.ndarray | None = None
    ) -> None:
        """Take cells ``idx`` for tokens at ``pos``; ``ext`` int[T, 2]: their (y, x) (M-RoPE; None: text)."""
        self.pos[idx] = pos
        self.seq[idx] = seq_bits
        self.shift[idx] = 0
        if self.ext is not None:
            self.ext[idx] = np.stack([pos, pos], axis=1) if ext is None else ext

    def window_start(self, p: int | np.ndarray) -> int | np.ndarray:
        """The first key position a query at ``p`` sees in this cache's window (``"standard"``: the last
        ``n_swa`` positions; ``"chunked"``: the start of ``p``'s chunk, as llama.cpp's
        ``LLAMA_SWA_TYPE_CHUNKED``); 0 without a window."""
        if self.n_swa <= 0:
            return 0 if np.isscalar(p) else np.zeros_like(p)
        if self.swa_type == "chunked":
            return p // self.n_swa * self.n_swa
        return p - self.n_swa + 1

    def n_kv(self) -> int:
        """Cells the attention reads: up to the last used cell, padded to N_PAD (shapes repeat)."""
        used = np.flatnonzero(self.seq)
        last = int(used[-1]) + 1 if len(used) else 1
        return min(self.n_cells, pad_to(last, N_PAD))

    def mask(
        self,
        pos: np.ndarray,
        seq_first: np.ndarray,
        n_kv: int,
        ext: np.ndarray | None = None,
        causal: bool | None = None,
    ) -> np.ndarray:
        """F32[T, n_kv]: 0 where token t may attend to cell j (same sequence, causal, in window), -inf else;
        with ``alibi`` the allowed entries hold ``-|pos_t - pos_j|`` (llama.cpp's KQ mask). An M-RoPE cache
        orders cells at the query's own position by (y, x) (``ext`` int[T, 2] of the queries; None: text).
        ``causal`` None: the cache's own (``self.causal``)."""
        cpos = self.pos[:n_kv][None, :]
        cseq = self.seq[:n_kv][None, :]
        bits = (np.uint64(1) << seq_first.astype(np.uint64))[:, None]
        ok = (cseq & bits) != 0
        p = pos[:, None]
        if self.causal if causal is None else causal:
            ok &= cpos <= p
            if self.ext is not None:  # same t: a cell later in raster order (y, then x) is masked
                q = np.stack([pos, pos], axis=1) if ext is None else np.asarray(ext)
                cy, cx = self.ext[:n_kv, 0][None, :], self.ext[:n_kv, 1][None, :]
                qy, qx = q[:, 0:1], q[:, 1:2]
                ok &= ~((cpos == p) & ((cy > qy) | ((cy == qy) & (cx > qx))))
        if self.n_swa > 0:
            ok &= cpos >= self.window_start(p)
        out = np.full(ok.shape, -np.inf, dtype=np.float32)
        if self.alibi:
            d = np.abs(p - cpos).astype(np.float32)
            out[ok] = -np.broadcast_to(d, ok.shape)[ok]
        else:
            out[ok] = 0.0
        return out

    # -- graphs ---------------------------------------------------------------------------------------
    def build_input(self, n_tokens: int, ci: int, causal: bool | None = None) -> KVCacheInput:
        """The graph inputs of the placed ubatch: ``kq_mask_{ci}`` and ``kv_idx_{ci}`` (causal: None, the
        cache's own; False: ``llama_set_causal_attn(ctx, false)``)."""
        n_kv = self.cur_n_kv
        m = ops.new_tensor(GGMLType.F32, (n_tokens, n_kv), f"kq_mask_{ci}")
        ix = ops.new_tensor(GGMLType.I64, (n_tokens,), f"kv_idx_{ci}")
        return KVCacheInput(n_kv, m, ix, self.k, self.v, self, self.causal if causal is None else causal)

    def build_graph_shift(
        self, layer_rope: Callable[[int], Rope | None], n_head_kv: Sequence[int]
    ) -> tuple[Graph, dict[Tensor, np.ndarray]] | None:
        """The graph (and its inputs) that re-rotates the cached K of cells whose position moved
        (``seq_add`` / ``seq_div``) on the layers ``layer_rope`` rotates (llama.cpp's
        ``build_graph_shift``); None when no layer has a rope."""
        cells = np.flatnonzero(self.shift != 0)
        n = len(cells)
        idx = ops.new_tensor(GGMLType.I64, (n,), "shift_idx")
        delta = ops.new_tensor(GGMLType.I32, (n,), "shift_pos")
        outs = []
        for ls in self.layers:
            rope = layer_rope(ls.il)
            if rope is None:
                continue
            # a shift re-rotates already scaled rows: under YaRN ggml's rope multiplies by
            # 1 + 0.1 ln(1 / freq_scale) again, so undo that (llama.cpp's build_rope_shift)
            yarn = rope.ext_factor != 0.0 and 0.0 < rope.freq_scale < 1.0
            fix = 1.0 / (1.0 + 0.1 * math.log(1.0 / rope.freq_scale)) if yarn else 1.0
            rope = dataclasses.replace(rope, attn_factor=fix)
            kbuf = self.k[ls.il]
            hkv = n_head_kv[ls.il]
            k = ops.reshape(ops.get_rows(kbuf, idx), (n, hkv, ls.n_embd_k // hkv))
            k = rope.apply(k, delta)
            outs.append(ops.set_rows(kbuf, ops.reshape(k, (n, ls.n_embd_k)), idx))
        if not outs:
            return None
        return Graph(outs), {idx: cells.astype(np.int64), delta: self.shift[cells].astype(np.int32)}

    def shift_done(self) -> None:
        self.shift[:] = 0
        self.has_shift = False

    # -- state ----------------------------------------------------------------------------------------
    def _rows(self, t: Tensor) -> np.ndarray:
        return t.data.reshape(self.n_cells, row_size(t.type, t.shape[1]))

    def state_write(self, seq_id: int) -> bytes:
        """Cells of ``seq_id`` (or all when -1): count, positions, then K and V rows per layer."""
        cells = np.flatnonzero(self._seq_cells(seq_id, -1, -1))
        cells = cells[np.argsort(self.pos[cells], kind="stable")]
        parts = [
            struct.pack("<4sIIII", b"KVST", len(cells), len(self.layers), int(self.type_k), int(self.type_v))
        ]
        parts.append(self.pos[cells].astype("<i8").tobytes())
        if self.ext is not None:
            parts.append(self.ext[cells].astype("<i8").tobytes())
        if seq_id < 0:
            parts.append(self.seq[cells].astype("<u8").tobytes())
        for ls in self.layers:
            parts.append(struct.pack("<III", ls.il, ls.n_embd_k, ls.n_embd_v))
            parts.append(self._rows(self.k[ls.il])[cells].tobytes())
            parts.append(self._rows(self.v[ls.il])[cells].tobytes())
        return b"".join(parts)

    def state_nbytes(self, n: int, all_seqs: bool = False) -> int:
        """The size of what ``state_write`` gives for ``n`` cells (``all_seqs``: with their sequence sets)."""
        per_cell = 8 + (16 if self.ext is not None else 0) + (8 if all_seqs else 0)
        rows = sum(
            row_size(self.type_k, ls.n_embd_k) + row_size(self.type_v, ls.n_embd_v) for ls in self.layers
        )
        return struct.calcsize("<4sIIII") + n * per_cell + 12 * len(self.layers) + n * rows

    def _check_saved_cells(
        self, pos: np.ndarray, ext: np.ndarray | None, bits: np.ndarray, n_pos: int | None, at: int
    ) -> None:
        """Refuse saved cells that a decode could not have left: a position outside ``[0, MAX_POS)``,
        two cells of one sequence at one position (M-RoPE: at one (t, y, x); an image's cells share t), a
        sequence set outside ``n_seq_max``; with ``n_pos`` (the text tokens the sequence is said to hold),
        cells that are not those tokens' positions ``0..n_pos-1`` (all of them in a full cache, some of
        them in a sliding window)."""

        def bad(why: str) -> StateError:
            return StateError(f"{self.name} state at byte {at}: {why}")

        n = len(pos)
        if n and (int(pos.min()) < 0 or int(pos.max()) >= MAX_POS):
            raise bad(f"a cell position is outside [0, {MAX_POS})")
        if n and self.n_seq_max < MAX_SEQ and int(bits.max()) >> self.n_seq_max:
            raise bad(f"a cell belongs to a sequence outside 0..{self.n_seq_max - 1}")
        if n and not bits.all():
            raise bad("a cell belongs to no sequence")
        where = pos[:, None] if ext is None else np.concatenate([pos[:, None], ext], axis=1)
        for s in range(self.n_seq_max) if n else ():
            mine = where[(bits & np.uint64(1 << s)) != 0]
            if len(np.unique(mine, axis=0)) != len(mine):
                raise bad(f"two cells of sequence {s} share a position")
        if n_pos is None:
            return
        if n and len(np.unique(pos)) != n:
            raise bad("two cells share a position (the sequence is said to hold only text)")
        if n > n_pos or (n and int(pos.max()) >= n_pos):
            raise bad(f"{n} cells up to position {int(pos.max())} for a sequence of {n_pos} tokens")
        if self.n_swa <= 0 and n != n_pos:
            raise bad(f"{n} cells for a sequence of {n_pos} tokens (every token has a cell)")

    def state_read(
        self, data: bytes | memoryview, seq_id: int, offset: int = 0, n_pos: int | None = None
    ) -> int:
        """Restore what ``state_write`` saved into ``seq_id`` (-1: the saved sequence sets); returns the new
        offset. ``n_pos``: the sequence holds that many tokens (a server slot file), so its cells must be at
        positions ``0..n_pos-1``."""
        mv = memoryview(data)
        hdr = struct.calcsize("<4sIIII")
        if len(mv) - offset < hdr:
            raise StateError(f"{self.name} state at byte {offset}: truncated header")
        magic, n, n_layers, tk, tv = struct.unpack_from("<4sIIII", mv, offset)
        if magic != b"KVST":
            raise StateError(f"{self.name} state at byte {offset}: bad magic {magic!r}")
        if n_layers != len(self.layers) or tk != int(self.type_k) or tv != int(self.type_v):
            raise StateError(
                f"{self.name} state at byte {offset}: saved {n_layers} layers with K/V types {tk}/{tv}, this cache has "
                f"{len(self.layers)} layers with {int(self.type_k)}/{int(self.type_v)}"
            )
        if n > self.n_cells:
            raise StateError(f"{self.name} state at byte {offset}: {n} cells, this cache has {self.n_cells}")
        if len(mv) - offset < self.state_nbytes(n, seq_id < 0):
            raise StateError(f"{self.name} state at byte {offset}: truncated ({n} cells)")
        reader = StateReader(mv, offset + hdr, self.name)
        take = reader.take

        pos = np.frombuffer(take(8 * n, "positions"), dtype="<i8").astype(np.int64)
        ext = None
        if self.ext is not None:
            ext = np.frombuffer(take(16 * n, "2-D positions"), dtype="<i8").astype(np.int64).reshape(n, 2)
        if seq_id < 0:
            bits = np.frombuffer(take(8 * n, "sequence sets"), dtype="<u8").astype(np.uint64)
        else:
            bits = np.full(n, self._bit(seq_id), dtype=np.uint64)
        self._check_saved_cells(pos, ext, bits, n_pos if seq_id >= 0 else None, offset)
        if seq_id >= 0:
            self.seq_rm(seq_id)
        else:
            self.clear()
        cells = self.find_slot(pos, bits) if n else np.zeros(0, np.int64)
        for ls in self.layers:
            il, nk, nv = struct.unpack_from("<III", take(12, "layer header"))
            if (il, nk, nv) != (ls.il, ls.n_embd_k, ls.n_embd_v):
                raise StateError(f"{self.name} state: layer {il} ({nk}/{nv}) does not match layer {ls.il}")
            for buf in (self.k[il], self.v[il]):
                rows = self._rows(buf)
                rb = rows.shape[1]
                rows[cells] = np.frombuffer(take(rb * n, f"layer {il} rows"), dtype=np.uint8).reshape(n, rb)
        self.apply(cells, pos, bits, ext)
        return reader.off


def seq_bits_of(seq_ids: Iterable[Iterable[int]]) -> np.ndarray:
    return np.array([sum(1 << s for s in ss) for ss in seq_ids], dtype=np.uint64)


@dataclass
class KVCacheInput(KVInputs, GraphInput):
    """One KV cache's graph inputs (llama.cpp's ``llm_graph_input_attn_kv``): the attention mask of the
    ubatch over the cache's first ``n_kv`` cells and the cells its K/V go to, filled from the placed
    ubatch (``KVCache.place``)."""

    cache: KVCache | None = None
    causal: bool = True

    def tensors(self) -> list[Tensor]:
        return [self.mask, self.idx]

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        c = self.cache
        ext = None if ub.mpos is None else ub.mpos[:, 1:3]
        return {self.mask: c.mask(ub.pos, ub.seq_first, self.n_kv, ext, self.causal), self.idx: c.slot}
