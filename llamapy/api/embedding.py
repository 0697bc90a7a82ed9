"""Embeddings of :class:`llamapy.api.Llama` (``embed``, ``create_embedding``): pooled per text, or
per token when the model has no pooling."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import LlamapyError
from ..generation import TokenSequence


class EmbeddingMixin:
    """Embedding methods; the context is set up by ``Llama`` (``embedding=True``)."""

    def embed(
        self,
        input: str | list[str],
        normalize: bool = False,
        truncate: bool = True,
        return_count: bool = False,
    ) -> Any:
        """Embeddings of one text or a list: a pooled vector per text, or with no pooling a vector per token."""
        if not self._embedding:
            raise LlamapyError("Llama model must be created with embedding=True to call this method")
        seq = self._need_ctx()
        texts = [input] if isinstance(input, str) else list(input)
        out, total = [], 0
        for text in texts:
            tokens = self.tokenize(text.encode("utf-8"), add_bos=True, special=True)
            if truncate:
                tokens = tokens[: min(self.ctx.n_batch, self.n_ctx())]
            total += len(tokens)
            seq.clear()
            self._embed_eval(seq, tokens)
            pooled = self._pooled()
            vecs = self.ctx.get_embeddings_seq(0) if pooled else self.ctx.get_embeddings()[: len(tokens)]
            vecs = np.array(vecs, dtype=np.float32)
            if normalize:
                norm = np.linalg.norm(vecs, axis=-1, keepdims=True)
                vecs = vecs / np.where(norm > 0, norm, 1.0)
            out.append(vecs.tolist())
            seq.clear()
        result: Any = out[0] if isinstance(input, str) else out
        return (result, total) if return_count else result

    def _pooled(self) -> bool:
        pt = getattr(self.ctx, "pooling_type", None)
        return pt not in (None, 0, "none") and str(pt).lower() not in ("none", "poolingtype.none")

    def _embed_eval(self, seq: TokenSequence, tokens: list[int]) -> None:
        from ..batch import Batch

        if len(tokens) > self.ctx.n_batch:
            raise ValueError(f"input of {len(tokens)} tokens is longer than n_batch {self.ctx.n_batch} (truncate=True cuts it)")  # fmt: skip
        self.ctx.decode(Batch.from_tokens(tokens, pos0=0, seq_id=0, logits_all=True))
        seq.tokens = list(tokens)

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        vecs, n = self.embed(input, return_count=True)
        if isinstance(input, str):
            vecs = [vecs]
        data = [dict(object="embedding", embedding=v, index=i) for i, v in enumerate(vecs)]
        return dict(object="list", data=data, model=model or self.model_path,
                    usage=dict(prompt_tokens=n, total_tokens=n))  # fmt: skip
