"""``TokenDataArray``: the candidates samplers work on (llama.cpp's ``llama_token_data_array``).

Three parallel arrays (``ids`` int32, ``logits`` float32, ``p`` float32), a ``sorted`` flag (descending
logits) and ``selected`` (an index into the arrays, -1 until a sampler picks one). Samplers reorder or
shrink the arrays through ``take``/``truncate`` so that ``is_identity`` (``ids == arange(size)``, the
fresh full vocabulary) stays correct; it lets samplers that touch a few tokens index them directly.
"""

from __future__ import annotations

import numpy as np

from .errors import SamplingError
from .kernels import softmax_f32, sort_desc_indices, top_k_indices

_F32 = np.float32
_ARANGE: dict[int, np.ndarray] = {}


def _arange(n: int) -> np.ndarray:
    """A shared read-only ``arange(n)`` (samplers never write ids in place)."""
    a = _ARANGE.get(n)
    if a is None:
        if len(_ARANGE) > 8:
            _ARANGE.clear()
        a = np.arange(n, dtype=np.int32)
        a.flags.writeable = False
        _ARANGE[n] = a
    return a


class TokenDataArray:
    __slots__ = ("ids", "logits", "p", "sorted", "selected", "is_identity", "_shared")

    def __init__(
        self,
        ids: np.ndarray,
        logits: np.ndarray,
        p: np.ndarray | None = None,
        sorted: bool = False,
        selected: int = -1,
        is_identity: bool = False,
    ) -> None:
        self.ids = np.asarray(ids, dtype=np.int32)
        self.logits = np.asarray(logits, dtype=_F32)
        self.p = np.zeros(len(self.ids), dtype=_F32) if p is None else np.asarray(p, dtype=_F32)
        if not (len(self.ids) == len(self.logits) == len(self.p)):
            raise SamplingError(
                f"token data arrays differ in length: ids {len(self.ids)}, logits {len(self.logits)}, "
                f"p {len(self.p)}"
            )
        self.sorted = sorted
        self.selected = selected
        self.is_identity = is_identity
        self._shared = False  # logits may be the caller's array: copy before writing in place

    @classmethod
    def from_logits(cls, logits: np.ndarray, n_vocab: int | None = None) -> TokenDataArray:
        """Candidates for every token from a row of logits (never written; NaN is refused)."""
        arr = np.asarray(logits)
        if arr.ndim != 1:
            raise SamplingError(f"logits must be one row (1-D), got shape {arr.shape}")
        if n_vocab is not None and arr.shape[0] != n_vocab:
            raise SamplingError(f"logits have {arr.shape[0]} entries but the vocabulary has {n_vocab} tokens")
        if arr.shape[0] == 0:
            raise SamplingError("logits are empty: nothing to sample from")
        lg = np.ascontiguousarray(arr, dtype=_F32)
        if np.isnan(lg).any():
            raise SamplingError(f"logits contain NaN (first at token {int(np.argmax(np.isnan(lg)))})")
        cur = cls(_arange(lg.shape[0]), lg, None, False, -1, True)
        cur._shared = lg is arr or lg.base is not None
        return cur

    def mutable_logits(self) -> np.ndarray:
        """``logits``, copied first if they may still be the caller's array."""
        if self._shared:
            self.logits = self.logits.copy()
            self._shared = False
        return self.logits

    @property
    def probs(self) -> np.ndarray:
        """The probabilities (``p``), as the interface names them."""
        return self.p

    @property
    def size(self) -> int:
        return len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, idx: np.ndarray, sorted: bool) -> None:
        """Keep the candidates at ``idx``, in that order."""
        self.ids = self.ids[idx]
        self.logits = self.logits[idx]
        self.p = self.p[idx]
        self.sorted = sorted
        self.is_identity = False
        self._shared = False

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` candidates."""
        if n < len(self.ids):
            self.ids = self.ids[:n]
            self.logits = self.logits[:n]
            self.p = self.p[:n]

    def drop_front(self, n: int) -> None:
        """Drop the first ``n`` candidates (XTC)."""
        if n > 0:
            self.ids = self.ids[n:]
            self.logits = self.logits[n:]
            self.p = self.p[n:]
            self.is_identity = False

    def positions_of(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions, indices into ``tokens``) of those ``tokens`` that are among the candidates."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if len(tokens) == 0 or len(self.ids) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if self.is_identity:
            which = np.nonzero((tokens >= 0) & (tokens < len(self.ids)))[0]
            return tokens[which], which
        order = np.argsort(tokens, kind="stable")
        st = tokens[order]
        j = np.searchsorted(st, self.ids)
        j[j >= len(st)] = len(st) - 1
        pos = np.nonzero(st[j] == self.ids)[0]
        return pos, order[j[pos]]

    def copy(self) -> TokenDataArray:
        return TokenDataArray(
            self.ids.copy(), self.logits.copy(), self.p.copy(), self.sorted, self.selected, self.is_identity
        )

    # --- helpers shared by samplers (llama.cpp's *_impl functions) ---

    def sort_desc(self) -> None:
        """Sort all candidates by descending logit (ties: lower position first)."""
        if not self.sorted:
            self.take(sort_desc_indices(self.logits), True)

    def top_indices(self, k: int) -> np.ndarray:
        """Positions of the ``k`` largest logits, in descending order (argpartition, then a small sort)."""
        return top_k_indices(np.ascontiguousarray(self.logits), k)

    def partial_sort(self, k: int) -> None:
        """Keep only the ``k`` highest-logit candidates, sorted (``partial_sort_inplace``)."""
        if self.sorted:
            self.truncate(k)
        else:
            self.take(self.top_indices(k), True)

    def softmax(self, do_sort: bool) -> None:
        """``llama_sampler_softmax_impl``: probabilities from logits, sorting first when asked."""
        if len(self.ids) == 0:
            raise SamplingError("softmax over zero candidates: an earlier sampler removed every token")
        if do_sort:
            self.sort_desc()
        lg = np.ascontiguousarray(self.logits)
        max_l = lg[0] if self.sorted else lg.max()
        p = np.empty(len(lg), dtype=_F32)
        softmax_f32(lg, _F32(max_l), p)
        self.p = p

    def apply_temp(self, temp: float) -> None:
        """``llama_sampler_temp_impl``: divide by ``temp``; ``temp <= 0`` keeps only the first maximum."""
        if len(self.ids) == 0:
            return
        t = _F32(temp)
        if t <= 0:
            i = int(np.argmax(self.logits))
            keep = self.logits[i]
            self.logits = np.full_like(self.logits, -np.inf)
            self.logits[i] = keep
            return
        self.logits = (self.logits / t).astype(_F32, copy=False)
