"""Graph inputs that fill themselves from the ubatch (llama.cpp's ``llm_graph_input_*`` classes).

Each input kind makes its tensors when a graph is built and, for every ubatch the graph runs, returns
their values (``set_input(ub) -> {tensor: value}``). The context makes the inputs of the ubatch itself
(tokens or embeddings, positions, output rows, an encoder's masks, pooling); the memory makes its own
(the KV caches' masks and cell indices, the recurrent-state rows: ``Memory.build_inputs``). The context
then only gathers the values of all of them and computes the graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .batch import UBatch
from .errors import LlamapyError
from .ggml import ops
from .ggml.tensor import Tensor
from .ggml.types import GGMLType

__all__ = [
    "GraphInput", "InpAttnNoCache", "InpEmbd", "InpOutIds", "InpPooling", "InpPos", "out_ids", "ubatch_mask",
    "ubatch_seqs",
]  # fmt: skip


class GraphInput:
    """One kind of graph input (llama.cpp's ``llm_graph_input_i``)."""

    #: memory writes of the graph that no output reads (recurrent states): kept in the graph as extras
    writes: Sequence[Tensor] = ()

    def tensors(self) -> list[Tensor]:
        """The input tensors this object fills."""
        raise NotImplementedError

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        """The values of ``tensors()`` for ``ub``."""
        raise NotImplementedError


def out_ids(ub: UBatch) -> np.ndarray:
    """The ubatch rows that are outputs (the last row when none is, so that the graph has one)."""
    rows = np.flatnonzero(ub.output)
    return rows if len(rows) else np.array([ub.n_tokens - 1])


def ubatch_seqs(ub: UBatch) -> list[int]:
    """The ubatch's sequences (by first sequence id) in order of appearance: the pooled rows' order."""
    return list(dict.fromkeys(ub.seq_first.tolist()))


class InpEmbd(GraphInput):
    """Token ids ``inp_tokens`` I32[T], or embeddings ``inp_embd`` F32[T, n_embd] (llm_graph_input_embd)."""

    def __init__(self, n_tokens: int, n_embd: int, is_embd: bool) -> None:
        self.tokens = None if is_embd else ops.new_tensor(GGMLType.I32, (n_tokens,), "inp_tokens")
        self.embd = ops.new_tensor(GGMLType.F32, (n_tokens, n_embd), "inp_embd") if is_embd else None

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.tokens, self.embd) if t is not None]

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        if self.tokens is not None:
            return {self.tokens: ub.token.astype(np.int32)}
        return {self.embd: ub.embd}


class InpPos(GraphInput):
    """Positions ``inp_pos`` I32[T], or with M-RoPE (``n_pos_per_embd`` 4) I32[4 T] section-major: the
    ubatch's ``mpos`` (t, h, w, e), or (p, p, p, 0) for text (llm_graph_input_pos)."""

    def __init__(self, n_tokens: int, n_pos_per_embd: int = 1) -> None:
        self.n_pos_per_embd = n_pos_per_embd
        self.pos = ops.new_tensor(GGMLType.I32, (n_tokens * n_pos_per_embd,), "inp_pos")

    def tensors(self) -> list[Tensor]:
        return [self.pos]

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        if self.n_pos_per_embd == 1:
            return {self.pos: ub.pos.astype(np.int32)}
        if ub.mpos is None:
            p = ub.pos.astype(np.int32)
            return {self.pos: np.concatenate([p, p, p, np.zeros_like(p)])}
        return {self.pos: np.ascontiguousarray(ub.mpos.T, dtype=np.int32).reshape(-1)}


class InpOutIds(GraphInput):
    """``inp_out_ids`` I32[n_outputs]: the rows the last layer keeps (None when every row is an output)."""

    def __init__(self, n_tokens: int, n_outputs: int) -> None:
        self.out_ids = (
            ops.new_tensor(GGMLType.I32, (n_outputs,), "inp_out_ids") if n_outputs < n_tokens else None
        )

    def tensors(self) -> list[Tensor]:
        return [] if self.out_ids is None else [self.out_ids]

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        return {} if self.out_ids is None else {self.out_ids: out_ids(ub).astype(np.int32)}


class InpAttnNoCache(GraphInput):
    """An encoder's F32[T, T] masks over the ubatch itself (llm_graph_input_attn_no_cache):
    ``kq_mask_enc`` for full layers, ``kq_mask_enc_swa`` for sliding-window ones (``n_swa > 0``)."""

    def __init__(
        self, n_tokens: int, causal: bool, n_swa: int = 0, swa_type: str = "standard", alibi: bool = False
    ) -> None:
        self.causal, self.n_swa, self.swa_type, self.alibi = causal, n_swa, swa_type, alibi
        self.kq_mask = ops.new_tensor(GGMLType.F32, (n_tokens, n_tokens), "kq_mask_enc")
        self.kq_mask_swa = (
            ops.new_tensor(GGMLType.F32, (n_tokens, n_tokens), "kq_mask_enc_swa") if n_swa > 0 else None
        )

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.kq_mask, self.kq_mask_swa) if t is not None]

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        m = ubatch_mask
        vals = {self.kq_mask: m(ub.pos, ub.seq_first, self.causal, 0, self.swa_type, self.alibi)}
        if self.kq_mask_swa is not None:
            vals[self.kq_mask_swa] = m(
                ub.pos, ub.seq_first, self.causal, self.n_swa, self.swa_type, self.alibi
            )
        return vals


class InpPooling(GraphInput):
    """Pooling over the ubatch's sequences: ``inp_mean`` F32[S, T] (1/n over each sequence's tokens) or
    ``inp_cls`` I32[S] (the row of each sequence's first or, with ``last``, last token by position)."""

    def __init__(self, n_tokens: int, n_seqs: int, mean: bool, last: bool = False) -> None:
        self.last = last
        self.mean = ops.new_tensor(GGMLType.F32, (n_seqs, n_tokens), "inp_mean") if mean else None
        self.rows = None if mean else ops.new_tensor(GGMLType.I32, (n_seqs,), "inp_cls")

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.mean, self.rows) if t is not None]

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        seqs = ubatch_seqs(ub)
        if self.mean is not None:
            return {self.mean: pool_mean_weights(ub.seq_first, seqs)}
        return {self.rows: pool_rows(ub.pos, ub.seq_first, seqs, self.last)}


def pool_mean_weights(seq_first: np.ndarray, seqs: list[int]) -> np.ndarray:
    """F32[S, T]: 1/n for the n tokens of sequence ``seqs[s]``, 0 elsewhere (llama.cpp's inp_mean)."""
    m = (np.asarray(seqs)[:, None] == np.asarray(seq_first)[None, :]).astype(np.float32)
    return m / np.maximum(m.sum(axis=1, keepdims=True), 1.0)


def pool_rows(pos: np.ndarray, seq_first: np.ndarray, seqs: list[int], last: bool) -> np.ndarray:
    """I32[S]: the ubatch row of each sequence's first (cls) or last token by position (inp_cls)."""
    out = np.zeros(len(seqs), dtype=np.int32)
    for i, s in enumerate(seqs):
        rows = np.flatnonzero(seq_first == s)
        p = pos[rows]
        out[i] = rows[int(np.argmax(p)) if last else int(np.argmin(p))]
    return out


def ubatch_mask(
    pos: np.ndarray,
    seq_first: np.ndarray,
    causal: bool = False,
    n_swa: int = 0,
    swa_type: str = "standard",
    alibi: bool = False,
) -> np.ndarray:
    """F32[T, T] attention mask of a ubatch over itself, for models without a KV cache (llama.cpp's
    ``llm_graph_input_attn_no_cache``): token i attends to token j of its own sequence (block-diagonal
    over the ubatch's sequences), not to a later one when ``causal``, within the window when ``n_swa``
    (``"standard"``: i - j < n_swa; ``"symmetric"``: |i - j| <= n_swa // 2); the value is 0, or
    -|pos_i - pos_j| with ``alibi`` (scaled per head by the attention), -inf where masked."""
    p = np.asarray(pos, dtype=np.int64)
    s = np.asarray(seq_first)
    ok = s[:, None] == s[None, :]
    d = p[:, None] - p[None, :]  # query minus key
    if causal:
        ok &= d >= 0
    if n_swa > 0:
        if swa_type == "symmetric":
            ok &= np.abs(d) <= n_swa // 2
        elif swa_type == "standard":
            ok &= d < n_swa
        else:
            raise LlamapyError(f"sliding-window type {swa_type!r} is not standard or symmetric")
    out = np.full(ok.shape, -np.inf, dtype=np.float32)
    out[ok] = -np.abs(d[ok]).astype(np.float32) if alibi else 0.0
    return out
