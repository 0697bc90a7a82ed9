"""Batches of tokens (or embeddings) for ``Context.decode``, their validation, and their split into
ubatches (llama.cpp's ``llama_batch`` and ``llama_batch_allocr``).

``Batch`` fields: ``token`` (or ``embd``), ``pos``, ``seq_id`` (a list of sequence ids per token) and
``logits`` (output flags). ``pos``, ``seq_id`` and ``logits`` may be left ``None``: positions then
continue each sequence in the KV cache, every token goes to sequence 0, and only the last token
produces an output.

M-RoPE (models whose rope has position sections, llama.cpp's ``n_pos_per_embd() == 4``): ``mpos``
int32[n, 4] gives each token its (t, h, w, e) positions; text tokens are (p, p, p, 0), image patches
(p0, p0 + y, p0 + x, 0). The memory stores ``t`` as the token's position (``pos`` defaults to
``mpos[:, 0]``), and positions may repeat or jump forward as llama.cpp allows for M-RoPE.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

import numpy as np

from ._dataclass import dataclass
from .errors import LlamapyError


class BatchError(LlamapyError):
    """A batch is invalid (empty, token out of range, bad sequence id or position, too large)."""


def _one_sequence(n: int, pos0: int | None, seq_id: int, logits_all: bool) -> dict[str, Any]:
    """Positions (from ``pos0``, or None: continue the cache), sequence ids and output flags (the last
    token, or all with ``logits_all``) of ``n`` tokens of one sequence."""
    pos = None if pos0 is None else np.arange(pos0, pos0 + n, dtype=np.int32)
    out = [logits_all] * n
    if n and not logits_all:
        out[-1] = True
    return dict(pos=pos, seq_id=[[seq_id] for _ in range(n)], logits=out)


@dataclass
class Batch:
    """llama.cpp's ``llama_batch``: tokens or embeddings with their positions, sequences and output flags."""

    token: np.ndarray | None = None  # int32[n]
    embd: np.ndarray | None = None  # float32[n, n_embd]
    pos: np.ndarray | None = None  # int32[n]
    seq_id: list[list[int]] | None = None
    logits: list[bool] | np.ndarray | None = None
    mpos: np.ndarray | None = None  # int32[n, 4]: (t, h, w, e) per token, for M-RoPE models

    @classmethod
    def from_tokens(
        cls,
        tokens: Sequence[int] | np.ndarray,
        pos0: int | None = None,
        seq_id: int = 0,
        logits_all: bool = False,
    ) -> Batch:
        """One sequence of tokens; positions from ``pos0`` (None: continue the sequence in the cache);
        output on the last token (every token with ``logits_all``)."""
        tok = np.asarray(tokens, dtype=np.int64).reshape(-1)
        return cls(token=tok, **_one_sequence(len(tok), pos0, seq_id, logits_all))

    @classmethod
    def from_embd(
        cls,
        embd: np.ndarray,
        pos0: int | None = None,
        seq_id: int = 0,
        logits_all: bool = False,
        mpos: np.ndarray | None = None,
    ) -> Batch:
        """One sequence of embeddings; ``mpos`` int32[n, 4] (M-RoPE models): each row's (t, h, w, e)
        positions, ``t`` being the position in the memory (``pos0`` is then ignored)."""
        e = np.asarray(embd, dtype=np.float32)
        if e.ndim != 2:
            raise BatchError(f"embeddings must be [n_tokens, n_embd], got shape {e.shape}")
        if mpos is not None:
            return cls(embd=e, **_one_sequence(e.shape[0], None, seq_id, logits_all), mpos=mpos)
        return cls(embd=e, **_one_sequence(e.shape[0], pos0, seq_id, logits_all))

    @property
    def n_tokens(self) -> int:
        if self.token is not None:
            return len(self.token)
        return 0 if self.embd is None else len(self.embd)

    def add(self, token: int, pos: int, seq_ids: Sequence[int], logits: bool) -> None:
        """Append one token (like ``common_batch_add``)."""
        if self.embd is not None:
            raise BatchError("cannot add a token to an embeddings batch")
        self.token = np.append(self.token if self.token is not None else np.zeros(0, np.int64), int(token))
        self.pos = np.append(self.pos if self.pos is not None else np.zeros(0, np.int32), int(pos)).astype(
            np.int32
        )
        self.seq_id = (self.seq_id or []) + [list(seq_ids)]
        self.logits = list(self.logits if self.logits is not None else []) + [bool(logits)]
        if self.mpos is not None:  # a text token: (p, p, p, 0)
            self.mpos = np.concatenate([self.mpos, np.array([[pos, pos, pos, 0]], np.int32)])


@dataclass
class UBatch:
    """A slice of a validated batch computed in one graph; ``idx`` are the batch indices it holds."""

    idx: np.ndarray  # int64[T], indices into the batch
    token: np.ndarray | None  # int32[T]
    embd: np.ndarray | None  # float32[T, n_embd]
    pos: np.ndarray  # int32[T]
    seq_first: np.ndarray  # int32[T] (first sequence of each token)
    seq_bits: np.ndarray  # uint64[T]
    output: np.ndarray  # bool[T]
    mpos: np.ndarray | None = None  # int32[T, 4]: M-RoPE (t, h, w, e) positions, when the batch had them

    @property
    def n_tokens(self) -> int:
        return len(self.idx)

    @property
    def n_outputs(self) -> int:
        return int(self.output.sum())


@dataclass
class AllocatedBatch:
    """A validated batch with every field filled in."""

    token: np.ndarray | None
    embd: np.ndarray | None
    pos: np.ndarray
    seq_id: list[list[int]]
    seq_first: np.ndarray
    seq_bits: np.ndarray
    output: np.ndarray
    out_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # batch index -> output row
    mpos: np.ndarray | None = None  # int32[n, 4]

    @property
    def n_tokens(self) -> int:
        return len(self.pos)

    @property
    def n_outputs(self) -> int:
        return int(self.output.sum())

    def ubatch(self, idx: np.ndarray) -> UBatch:
        idx = np.asarray(idx, dtype=np.int64)
        return UBatch(
            idx=idx,
            token=None if self.token is None else self.token[idx],
            embd=None if self.embd is None else self.embd[idx],
            pos=self.pos[idx],
            seq_first=self.seq_first[idx],
            seq_bits=self.seq_bits[idx],
            output=self.output[idx],
            mpos=None if self.mpos is None else self.mpos[idx],
        )

    # -- splits ---------------------------------------------------------------------------------------
    def split_simple(self, n_ubatch: int) -> list[UBatch]:
        """Consecutive chunks of at most ``n_ubatch`` tokens."""
        n = self.n_tokens
        return [self.ubatch(np.arange(i, min(n, i + n_ubatch))) for i in range(0, n, n_ubatch)]

    def split_seq(self, n_ubatch: int) -> list[UBatch]:
        """Each ubatch holds tokens of one sequence set only (for pooled embeddings), at most n_ubatch."""
        out: list[UBatch] = []
        for bits in dict.fromkeys(self.seq_bits.tolist()):
            sel = np.flatnonzero(self.seq_bits == np.uint64(bits))
            out += [self.ubatch(sel[i : i + n_ubatch]) for i in range(0, len(sel), n_ubatch)]
        return out

    def split_whole_seqs(self, n_ubatch: int) -> list[UBatch]:
        """Ubatches holding whole sequences (by first sequence id), as many per ubatch as fit in
        ``n_ubatch`` tokens (an encoder attends within its ubatch; pooling reads one ubatch). A sequence
        longer than ``n_ubatch`` is a ``BatchError``."""
        groups: list[np.ndarray] = []
        for s in dict.fromkeys(self.seq_first.tolist()):
            sel = np.flatnonzero(self.seq_first == s)
            if len(sel) > n_ubatch:
                raise BatchError(
                    f"sequence {s} has {len(sel)} tokens in the batch, more than n_ubatch = {n_ubatch}: pooled "
                    f"embeddings and encoders need each sequence whole in one ubatch (raise n_ubatch and n_batch)"
                )
            groups.append(sel)
        out: list[UBatch] = []
        cur: list[np.ndarray] = []
        n = 0
        for sel in groups:
            if cur and n + len(sel) > n_ubatch:
                out.append(self.ubatch(np.sort(np.concatenate(cur))))
                cur, n = [], 0
            cur.append(sel)
            n += len(sel)
        if cur:
            out.append(self.ubatch(np.sort(np.concatenate(cur))))
        return out

    def split_equal(self, n_ubatch: int, seq_major: bool = False) -> list[UBatch]:
        """Each ubatch takes the same number of tokens from every sequence set still pending. With
        ``seq_major`` (recurrent memory: llama.cpp's equal split) a ubatch holds sequence sets that share
        no sequence, each set's tokens in position order and together (stream after stream)."""
        groups = [
            np.flatnonzero(self.seq_bits == np.uint64(b)) for b in dict.fromkeys(self.seq_bits.tolist())
        ]
        if seq_major:  # earliest positions first: a prompt shared by sequences before their own tokens
            groups = [g[np.argsort(self.pos[g], kind="stable")] for g in groups]
            groups.sort(key=lambda g: int(self.pos[g[0]]))
        bits = [int(self.seq_bits[g[0]]) for g in groups]
        heads = [0] * len(groups)
        out: list[UBatch] = []
        while True:
            live = [i for i, g in enumerate(groups) if heads[i] < len(g)]
            if not live:
                return out
            if seq_major:  # sets sharing a sequence wait for a later ubatch (their states are one)
                taken, seen = [], 0
                for i in live:
                    if not bits[i] & seen:
                        taken.append(i)
                        seen |= bits[i]
                live = taken
            live = live[: max(1, n_ubatch)]
            per = max(1, min(min(len(groups[i]) - heads[i] for i in live), n_ubatch // len(live)))
            idx = np.concatenate([groups[i][heads[i] : heads[i] + per] for i in live])
            for i in live:
                heads[i] += per
            out.append(self.ubatch(idx if seq_major else np.sort(idx)))


def allocate(
    batch: Batch,
    n_vocab: int,
    n_embd: int,
    n_seq_max: int,
    n_batch: int,
    seq_pos_max: Callable[[int], int],
    output_all: bool = False,
    n_pos_per_embd: int = 1,
) -> AllocatedBatch:
    """Validate ``batch`` and fill what is missing (llama.cpp's ``llama_batch_allocr::init``).
    ``n_pos_per_embd`` 4 (M-RoPE models): ``batch.mpos`` is accepted, and positions of a sequence may
    repeat and jump (a text batch starts after the memory's last position, embeddings at or after it)."""
    if batch.token is not None and batch.embd is not None:
        raise BatchError("a batch holds either tokens or embeddings, not both")
    if batch.embd is None and batch.mpos is None and n_pos_per_embd == 1 and n_batch >= 1:
        one = _allocate_one_token(batch, n_vocab, n_seq_max, seq_pos_max, output_all)
        if one is not None:
            return one
    n = batch.n_tokens
    if n == 0:
        raise BatchError("the batch is empty (n_tokens = 0)")
    if n > n_batch:
        raise BatchError(
            f"the batch has {n} tokens, more than n_batch = {n_batch} (raise n_batch or split the batch)"
        )
    token = embd = None
    if batch.token is not None:
        tok = np.asarray(batch.token)
        if tok.ndim != 1 or tok.dtype.kind not in "iu":
            raise BatchError(f"batch.token must be a 1-D integer array, got {tok.dtype} of shape {tok.shape}")
        bad = np.flatnonzero((tok < 0) | (tok >= n_vocab))
        if len(bad):
            i = int(bad[0])
            raise BatchError(
                f"batch.token[{i}] = {int(tok[i])} is not a valid token id (n_vocab = {n_vocab})"
            )
        token = tok.astype(np.int32)
    else:
        embd = np.asarray(batch.embd, dtype=np.float32)
        if embd.ndim != 2 or embd.shape[1] != n_embd:
            raise BatchError(f"batch.embd must be [n_tokens, {n_embd}], got shape {embd.shape}")
        if not np.isfinite(embd).all():
            raise BatchError("batch.embd holds NaN or infinite values")
    # sequences
    if batch.seq_id is None:
        seq_id = [[0] for _ in range(n)]
    else:
        if len(batch.seq_id) != n:
            raise BatchError(f"batch.seq_id has {len(batch.seq_id)} entries for {n} tokens")
        seq_id = []
        for i, ss in enumerate(batch.seq_id):
            ss = [ss] if isinstance(ss, (int, np.integer)) else list(ss)
            if not ss:
                raise BatchError(f"batch.seq_id[{i}] is empty: every token needs a sequence id")
            for s in ss:
                if not isinstance(s, (int, np.integer)) or not 0 <= s < n_seq_max:
                    raise BatchError(
                        f"batch.seq_id[{i}] holds {s!r}, not in 0..{n_seq_max - 1} (n_seq_max = {n_seq_max})"
                    )
            seq_id.append([int(s) for s in ss])
    seq_first = np.array([ss[0] for ss in seq_id], dtype=np.int32)
    seq_bits = np.array([sum(1 << s for s in set(ss)) for ss in seq_id], dtype=np.uint64)
    used_seqs = sorted({s for ss in seq_id for s in ss})
    mpos = _check_mpos(batch, n, n_pos_per_embd)
    # positions
    if batch.pos is None and mpos is not None:
        pos = mpos[:, 0].copy()
    elif batch.pos is None:
        pos = np.zeros(n, dtype=np.int32)
        nxt = {s: seq_pos_max(s) + 1 for s in used_seqs}
        for i, ss in enumerate(seq_id):
            p = nxt[ss[0]]
            pos[i] = p
            for s in ss:
                nxt[s] = p + 1
    else:
        pos = np.asarray(batch.pos)
        if pos.shape != (n,) or pos.dtype.kind not in "iu":
            raise BatchError(f"batch.pos must be {n} integers, got {pos.dtype} of shape {pos.shape}")
        if (pos < 0).any():
            i = int(np.flatnonzero(pos < 0)[0])
            raise BatchError(f"batch.pos[{i}] = {int(pos[i])} is negative")
        pos = pos.astype(np.int32)
        if mpos is not None and not np.array_equal(pos, mpos[:, 0]):
            i = int(np.flatnonzero(pos != mpos[:, 0])[0])
            raise BatchError(
                f"batch.pos[{i}] = {int(pos[i])} differs from batch.mpos[{i}, 0] = {int(mpos[i, 0])}"
            )
    if n_pos_per_embd > 1:
        _check_mrope_positions(pos, seq_id, used_seqs, seq_pos_max, embd is not None)
    elif batch.pos is not None:
        for s in used_seqs:
            sel = np.array([s in ss for ss in seq_id])
            ps = pos[sel]
            last = seq_pos_max(s)
            if last >= 0 and int(ps.min()) != last + 1:
                raise BatchError(
                    f"sequence {s}: the batch starts at position {int(ps.min())} but the KV cache ends at {last}; "
                    f"positions must continue the sequence (expected {last + 1})"
                )
            # a set, not np.unique: np.unique imports numpy.ma (8 ms of each start-up)
            if len(set(ps.tolist())) != len(ps) or int(ps.max()) - int(ps.min()) + 1 != len(ps):
                raise BatchError(
                    f"sequence {s}: positions in the batch are not consecutive: {ps[:16].tolist()}..."
                )
    # outputs
    if output_all:
        output = np.ones(n, dtype=bool)
    elif batch.logits is None:
        output = np.zeros(n, dtype=bool)
        output[-1] = True
    else:
        output = np.asarray(batch.logits, dtype=bool).reshape(-1)
        if len(output) != n:
            raise BatchError(f"batch.logits has {len(output)} flags for {n} tokens")
    out_rows = np.full(n, -1, dtype=np.int64)
    out_rows[output] = np.arange(int(output.sum()))
    return AllocatedBatch(token, embd, pos, seq_id, seq_first, seq_bits, output, out_rows, mpos)


_ONE_TRUE = np.ones(1, dtype=bool)
_ROW0 = np.zeros(1, dtype=np.int64)
_NO_ROW = np.full(1, -1, dtype=np.int64)


def _allocate_one_token(
    batch: Batch,
    n_vocab: int,
    n_seq_max: int,
    seq_pos_max: Callable[[int], int],
    output_all: bool,
) -> AllocatedBatch | None:
    """``allocate`` of a one-token text batch (a decode step) in plain Python: the same checks, messages
    and result as the general path, a few NumPy calls instead of ~30 (each costs microseconds in a
    token's flow, after the mat-vecs have flushed the caches). None: not such a batch, or one the general
    path should judge (its message then comes from there)."""
    tok = batch.token
    if not isinstance(tok, np.ndarray) or tok.shape != (1,) or tok.dtype.kind not in "iu":
        return None
    t = int(tok[0])
    if not 0 <= t < n_vocab:
        return None
    ss: Any = [0] if batch.seq_id is None else None
    if ss is None:
        sid = batch.seq_id
        if not isinstance(sid, list) or len(sid) != 1:
            return None
        ss = sid[0]
        if isinstance(ss, (int, np.integer)):
            ss = [ss]
        elif isinstance(ss, list) and ss:
            ss = list(ss)
        else:
            return None
        for s in ss:
            if not isinstance(s, (int, np.integer)) or not 0 <= s < n_seq_max:
                return None
        ss = [int(s) for s in ss]
    used = sorted(set(ss))
    if batch.pos is None:
        nxt = {s: seq_pos_max(s) + 1 for s in used}
        p = nxt[ss[0]]
    else:
        pa = batch.pos
        if not isinstance(pa, np.ndarray) or pa.shape != (1,) or pa.dtype.kind not in "iu":
            return None
        p = int(pa[0])
        if p < 0 or p > np.iinfo(np.int32).max:
            return None
        for s in used:
            last = seq_pos_max(s)
            if last >= 0 and p != last + 1:
                return None  # the general path raises its error
    if output_all:
        output = _ONE_TRUE.copy()
    elif batch.logits is None:
        output = _ONE_TRUE.copy()
    else:
        lg = batch.logits
        if isinstance(lg, list) and len(lg) == 1 and isinstance(lg[0], (bool, np.bool_)):
            output = _ONE_TRUE.copy() if lg[0] else ~_ONE_TRUE
        else:
            return None
    return AllocatedBatch(
        np.array([t], dtype=np.int32),
        None,
        np.array([p], dtype=np.int32),
        [ss],
        np.array([ss[0]], dtype=np.int32),
        np.array([sum(1 << s for s in set(ss))], dtype=np.uint64),
        output,
        (_ROW0 if output[0] else _NO_ROW).copy(),
        None,
    )


def _check_mpos(batch: Batch, n: int, n_pos_per_embd: int) -> np.ndarray | None:
    """``batch.mpos`` as int32[n, 4] (None when absent), or a ``BatchError`` saying what is wrong."""
    if batch.mpos is None:
        return None
    if n_pos_per_embd != 4:
        raise BatchError(
            "batch.mpos (M-RoPE positions) was given, but this model's rope takes one position per token"
        )
    m = np.asarray(batch.mpos)
    if m.shape != (n, 4) or m.dtype.kind not in "iu":
        raise BatchError(
            f"batch.mpos must be int32[{n}, 4] (t, h, w, e per token), got {m.dtype} of shape {m.shape}"
        )
    if (m < 0).any():
        i, j = (int(v) for v in np.argwhere(m < 0)[0])
        raise BatchError(f"batch.mpos[{i}, {j}] = {int(m[i, j])} is negative")
    if m.max(initial=0) > np.iinfo(np.int32).max:
        raise BatchError("batch.mpos holds positions beyond int32")
    return m.astype(np.int32)


def _check_mrope_positions(
    pos: np.ndarray,
    seq_id: list[list[int]],
    used_seqs: list[int],
    seq_pos_max: Callable[[int], int],
    is_embd: bool,
) -> None:
    """M-RoPE position rules (llama.cpp's): a sequence's positions may repeat (an image's patches share
    ``t``) and jump, but a text batch starts after the memory's last position, embeddings at or after it."""
    for s in used_seqs:
        ps = pos[np.array([s in ss for ss in seq_id])]
        last = seq_pos_max(s)
        first = int(ps.min())
        if last >= 0 and (first < last if is_embd else first <= last):
            need = "at or after" if is_embd else "after"
            raise BatchError(
                f"sequence {s}: the batch starts at position {first} but the memory ends at {last}; with M-RoPE "
                f"positions must start {need} it"
            )
