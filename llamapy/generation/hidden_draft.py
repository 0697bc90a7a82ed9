"""What the two drafts that read the target's hidden states share: the MTP layer (:mod:`.mtp`) and an
EAGLE-3 head (:mod:`.eagle3`).

Both are a one-layer model run in a :class:`~llamapy.context.Context` of its own over embeddings rows
``[embed(t_p) | h_{p-1}]`` (``h``: the target's normed last hidden state for MTP, the fused features
``g`` for EAGLE-3). :class:`HiddenDraftModel` is that model's face to the context (``impl``,
``hparams``, ``vocab``, the token embedding rows); :class:`HiddenStateDraft` the draft loop: catch the
draft's cache up on the tokens the target confirmed (pairing each ``t_p`` with the target's ``h_{p-1}``,
zeros where that is not known), then draft greedily (the sampled token with the target's last state,
then each guess with the draft's own output state, llama.cpp's chained single head) while the guess's
probability among the top 10 is at least ``p_min``, up to ``n_draft``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import LlamapyError
from ..ggml.quants import dequantize
from .draft_model import confident_top
from .speculative import LlamaDraftModel

Features = dict[int, tuple[int, np.ndarray]]  # target position -> (its token, the state there)


class HiddenDraftModel:
    """A one-layer draft model as :class:`~llamapy.context.Context` needs it. Subclasses set ``target``,
    ``path``, ``loader``, ``hparams``, ``vocab``, ``impl``, ``arch``, ``metadata`` and the token embedding
    (:meth:`_set_embeddings`)."""

    target: Any
    path: str
    loader: Any
    hparams: Any
    vocab: Any
    impl: Any
    arch: str
    metadata: Any
    load_time_s = 0.0
    _embd_type: Any
    _embd_rows: Any

    def _set_embeddings(self, info: Any) -> None:
        """Read token embedding rows from the file tensor ``info`` (one row dequantized at a time)."""
        self._embd_type, self._embd_rows = info.ggml_type, info.array()

    @property
    def n_vocab(self) -> int:
        return self.hparams.n_vocab

    @property
    def n_ctx_train(self) -> int:
        return self.hparams.n_ctx_train

    @property
    def n_embd(self) -> int:
        return self.hparams.n_embd

    def embed(self, tokens: list[int]) -> np.ndarray:
        """F32[len(tokens), n_embd]: the token embedding rows the draft layer reads."""
        out = np.empty((len(tokens), self.hparams.n_embd), dtype=np.float32)
        for i, t in enumerate(tokens):
            out[i] = dequantize(self._embd_rows[t], self._embd_type).reshape(-1)
        return out


class HiddenStateDraft(LlamaDraftModel):
    """The draft loop over a :class:`HiddenDraftModel` (``self.source``). Subclasses give the target's
    states (:meth:`_features`), may map draft ids to target ids (:meth:`_to_target`) and set ``error``,
    the exception class for bad parameters."""

    error: type[LlamapyError] = LlamapyError

    @classmethod
    def check_params(cls, n_draft: int, n_min: int, p_min: float) -> None:
        """Raise ``cls.error`` unless ``1 <= n_draft``, ``0 <= n_min <= n_draft``, ``0 <= p_min <= 1``."""
        if int(n_draft) < 1 or not 0 <= int(n_min) <= int(n_draft):
            raise cls.error(f"need 1 <= n_draft and 0 <= n_min <= n_draft, got {n_draft}, {n_min}")
        if not 0.0 <= float(p_min) <= 1.0 or math.isnan(float(p_min)):
            raise cls.error(f"p_min must be between 0 and 1, got {p_min}")

    def _setup(self, source: HiddenDraftModel, n_draft: int, n_min: int, p_min: float, n_ctx: int,
               n_batch: int, n_threads: int | None) -> None:  # fmt: skip
        from ..context import ContextParams

        self.check_params(n_draft, n_min, p_min)
        self.source = source
        self.n_draft, self.n_min, self.p_min = int(n_draft), int(n_min), float(p_min)
        self.n_embd = source.n_embd
        self._params = ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(n_batch, 512),
                                     n_threads=n_threads, embeddings=True, pooling_type=0)  # fmt: skip
        self.ctx: Any = None
        self.tokens: list[int] = []  # positions the draft's cache holds
        self.n_drafted = 0
        self.n_calls = 0

    def _context(self, n_ctx: int) -> None:
        """A draft context of at least ``n_ctx`` positions (a new, empty one when it must grow)."""
        from ..context import Context

        if self.ctx is None or n_ctx > self.ctx.n_ctx:
            self._params.n_ctx = max(int(n_ctx), int(self._params.n_ctx))
            self._params.swa_full = True  # (a window layer, MiMo's: drafts removed, the window kept)
            self.ctx = Context(self.source, self._params)  # type: ignore[arg-type]
            self.tokens = []

    # -- what subclasses give ----------------------------------------------------------------------
    def _features(self) -> Features | None:
        """The target's states by position (None: not attached to a target, no draft)."""
        raise NotImplementedError

    def _to_target(self, best: int) -> int:
        """The target token id of the draft's token ``best``."""
        return best

    # -- the loop ----------------------------------------------------------------------------------
    def _rows(self, tokens: list[int], hs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([self.source.embed(tokens), np.stack(hs)], axis=1)

    def _decode(self, rows: np.ndarray, pos0: int) -> None:
        """Decode ``rows`` from ``pos0`` (in ``n_batch`` pieces); the last row's outputs are kept."""
        from ..batch import Batch

        for i in range(0, len(rows), self.ctx.n_batch):
            self.ctx.decode(Batch.from_embd(rows[i : i + self.ctx.n_batch], pos0=pos0 + i))

    def _catch_up(self, ids: list[int], feats: Features) -> tuple[list[int], list[np.ndarray]]:
        """The rows that bring the draft's cache to positions ``0..len(ids)-1`` of ``ids``, from the first
        position it does not hold yet (returned undecoded: the caller decodes them together with the
        first draft row). Each pairs ``t_p`` with the target's state at ``p - 1``; zeros where that is
        not known (position 0, as llama.cpp; a prefix the target reused rather than evaluated; a server
        prompt's rows without an output)."""
        n = 0
        for a, b in zip(self.tokens, ids, strict=False):
            if a != b:
                break
            n += 1
        if not self.ctx.memory.seq_rm(0, n, -1):  # (a window no longer held: start over)
            self.ctx.memory.seq_rm(0, -1, -1)
            n = 0
        del self.tokens[n:]
        zeros = np.zeros(self.n_embd, np.float32)
        todo_h: list[np.ndarray] = []
        for p in range(n, len(ids)):
            prev = feats.get(p - 1)
            todo_h.append(prev[1] if prev is not None and p and prev[0] == ids[p - 1] else zeros)
        todo_t = ids[n:]
        self.tokens.extend(todo_t)
        for q in [q for q in feats if q < len(ids) - 1]:  # only the state at P-1 on is read again
            del feats[q]
        return todo_t, todo_h

    def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
        ids = [int(t) for t in np.asarray(input_ids).reshape(-1)]
        self.n_calls += 1
        none = np.zeros(0, dtype=np.intc)
        feats = self._features()
        if feats is None or self.ctx is None:
            return none
        P = len(ids) - 1  # the sampled token's position
        last = feats.get(P - 1)
        n_vocab = int(self.source.target.n_vocab)
        if (
            P < 1
            or last is None
            or last[0] != ids[P - 1]
            or len(ids) + self.n_draft >= self.ctx.n_ctx
            or any(not 0 <= t < n_vocab for t in ids)
        ):
            return none
        todo_t, todo_h = self._catch_up(ids[:P], feats)
        out: list[int] = []
        # the catch-up rows and the first draft row (the sampled token with the target's state at P-1)
        rows = self._rows([*todo_t, ids[P]], [*todo_h, last[1]])
        pos0 = P - len(todo_t)
        while True:
            self._decode(rows, pos0)
            best = confident_top(self.ctx.get_logits()[-1], self.p_min)
            if best is None:
                break
            tok = self._to_target(best)
            out.append(tok)
            if len(out) >= self.n_draft:
                break
            rows = self._rows([tok], [np.array(self.ctx.get_embeddings()[-1], dtype=np.float32)])
            pos0 = P + len(out)
        if not self.ctx.memory.seq_rm(0, P, -1):  # the drafts' entries are not the target's: drop them
            self.ctx.memory.seq_rm(0, -1, -1)
            self.tokens = []
        if len(out) < self.n_min:
            out = []
        self.n_drafted += len(out)
        return np.asarray(out, dtype=np.intc)


__all__ = ["Features", "HiddenDraftModel", "HiddenStateDraft"]
