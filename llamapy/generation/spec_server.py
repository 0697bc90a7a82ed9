"""``llamapy serve --spec-type ...``: one self-speculative draft per slot for the server engine, which
verifies each slot's guesses in the shared batch (``Engine._draft`` / ``_verify``) as it does a draft
model's (``-md``).

:class:`SlotDrafts` is the backend's ``make_draft`` for ``ngram-simple`` / ``ngram-map-k`` (each slot
its own history map) and ``mtp``. For MTP it wraps the backend's ``decode`` so that the normed hidden
state of every output row (the last prompt token of a slot, each generated token, each verified
guess) reaches the draft of that row's sequence; prompt tokens without an output are gaps the MTP layer
skips (its attention then sees fewer positions: exact output still, somewhat weaker drafts than
:func:`~.loop.generate`'s, which reads every prompt position). The slots share one MTP model (the
weights); each has its own one-layer KV cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .speculative import SpecTypeError, make_spec_draft


class SlotDrafts:
    """``make()`` gives slot after slot (sequence 0, 1, ...) its draft for ``spec['spec_type']``."""

    def __init__(self, backend: Any, spec: dict[str, Any]) -> None:
        kw = dict(spec)
        self.spec_type = str(kw.pop("spec_type")).strip().lower()
        self.kw = kw
        self.backend = backend
        self.drafts: list[Any] = []
        self._mtp: Any = None
        if self.spec_type in ("mtp", "draft-mtp"):
            from .mtp import MtpModel

            self._mtp = MtpModel(backend.model)  # MtpError now (at start-up) on a model without MTP layers
            self._install_tap()
        else:
            make_spec_draft(self.spec_type, **self._ngram_kw())  # bad names and sizes fail at start-up

    def _ngram_kw(self) -> dict[str, Any]:
        keys = ("n_draft", "size_n", "size_m", "min_hits")
        return {k: v for k, v in self.kw.items() if k in keys and v is not None}

    def make(self) -> Any:
        if self._mtp is not None:
            from .mtp import MtpDraft

            kw = {k: v for k, v in self.kw.items() if k in ("n_draft", "n_min", "p_min", "n_threads")}
            kw["n_draft"] = kw.get("n_draft") or 3
            n_ctx = self.backend.n_ctx // max(1, self.backend.n_seq_max)
            d: Any = MtpDraft(self._mtp, n_ctx=n_ctx, n_batch=min(512, n_ctx), **kw)
        else:
            d = make_spec_draft(self.spec_type, **self._ngram_kw())
        self.drafts.append(d)
        return d

    def _install_tap(self) -> None:
        b = self.backend
        ctx = b.ctx
        if not ctx.embeddings:
            ctx.embeddings = True
            ctx._graphs.clear()
        inner = b.decode

        def decode(
            tokens: Sequence[int], pos: Sequence[int], seq_ids: Sequence[int], outputs: Sequence[bool]
        ) -> np.ndarray:
            out = inner(tokens, pos, seq_ids, outputs)
            h = ctx.get_embeddings()
            r = 0
            for t, p, s, o in zip(tokens, pos, seq_ids, outputs, strict=True):
                if not o:
                    continue
                if 0 <= int(s) < len(self.drafts):
                    self.drafts[int(s)].observe(int(p), [int(t)], h[r : r + 1])
                r += 1
            return out

        b.decode = decode


def check_spec_model(spec_type: str, path: str | Any) -> None:
    """Before a server starts: raise :class:`~.mtp.MtpError` when ``--spec-type mtp`` is asked of a
    model file whose metadata has no MTP layer (reads the header only)."""
    if str(spec_type).strip().lower() not in ("mtp", "draft-mtp"):
        return
    import os

    from ..gguf.reader import GGUFReader
    from .mtp import MTP_ARCHS, MtpError

    p = os.fspath(path)
    if not os.path.isfile(p):
        return  # (the load reports a missing file)
    md = GGUFReader(p).metadata
    arch = md.get("general.architecture")
    if arch not in MTP_ARCHS or not int(md.get(f"{arch}.nextn_predict_layers", 0) or 0):
        raise MtpError(
            f"{p}: --spec-type mtp needs a model with next-token-prediction (MTP) layers "
            f"({', '.join(MTP_ARCHS)} files with nextn_predict_layers > 0); this {arch} model has none"
        )


def server_spec(spec_type: str | None, **kw: Any) -> dict[str, Any] | None:
    """The backend's ``draft`` argument for ``--spec-type`` (None without one)."""
    if not spec_type:
        return None
    from .speculative import SPEC_TYPES

    if str(spec_type).strip().lower() not in SPEC_TYPES:
        raise SpecTypeError(
            f"unknown speculative decoding type {spec_type!r} (one of: {', '.join(SPEC_TYPES)})"
        )
    return {"spec_type": spec_type, **kw}


__all__ = ["SlotDrafts", "check_spec_model", "server_spec"]
