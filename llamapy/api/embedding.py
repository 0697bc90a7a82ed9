"""Embeddings and reranking of :class:`llamapy.api.Llama` (``embed``, ``create_embedding``, ``rerank``,
``create_rerank``), and the pieces the CLI and the server share with it: ``--embd-normalize``
(:func:`normalize_embedding`, llama.cpp's ``common_embd_normalize``), the query/document prompt of a
reranker (:func:`format_rerank`, llama-server's ``format_prompt_rerank``) and the batching of many
inputs into as few decodes as the context allows (:func:`embed_token_lists`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import LlamapyError
from ..model.hparams import PoolingType

RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"


class EmbeddingError(LlamapyError, ValueError):
    """Embedding or rerank input that cannot be computed (empty, too long, wrong type, wrong model)."""


# ---------------------------------------------------------------------------------- normalization
def normalize_mode(normalize: bool | int) -> int:
    """``normalize=`` as ``--embd-normalize``: True is 2 (L2), False is -1 (none), an int as it is."""
    if isinstance(normalize, (bool, np.bool_)):
        return 2 if normalize else -1
    if not isinstance(normalize, (int, np.integer)) or normalize < -1:
        raise EmbeddingError(
            f"normalize={normalize!r}: use True/False or an --embd-normalize integer "
            "(-1 none, 0 max-abs int16, 1 taxicab, 2 L2, >2 p-norm)"
        )
    return int(normalize)


def normalize_embedding(v: np.ndarray, embd_normalize: int = 2) -> np.ndarray:
    """Each row of ``v`` (or ``v`` itself when 1-D) normalized as llama.cpp's ``common_embd_normalize``:
    -1 none, 0 max-abs scaled to the int16 range (the largest magnitude becomes 32760), 1 taxicab,
    2 euclidean, p > 2 the p-norm. A zero vector stays zero. Sums are taken in float64."""
    embd_normalize = normalize_mode(embd_normalize)
    x = np.asarray(v, dtype=np.float32)
    x2 = np.atleast_2d(x).astype(np.float64)
    if embd_normalize == -1:
        return x.copy()
    a = np.abs(x2)
    if embd_normalize == 0:
        s = a.max(axis=-1) / 32760.0 if a.shape[-1] else np.zeros(len(a))
    elif embd_normalize == 2:
        s = np.sqrt((x2 * x2).sum(axis=-1))
    else:
        s = (a**embd_normalize).sum(axis=-1) ** (1.0 / embd_normalize)
    scale = np.where(s > 0, 1.0 / np.where(s > 0, s, 1.0), 0.0)
    out = (x2 * scale[:, None]).astype(np.float32)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------- inputs
def embedding_inputs(input: Any, name: str = "input") -> tuple[list[str | list[int]], bool]:
    """OpenAI's embeddings ``input``: a text, a list of texts, a list of token ids (one input) or a list of
    token-id lists -> (the inputs, whether it was a single one)."""
    if isinstance(input, (str, bytes)):
        return [input.decode("utf-8") if isinstance(input, bytes) else input], True
    if isinstance(input, np.ndarray):
        input = input.tolist()
    if not isinstance(input, (list, tuple)):
        raise EmbeddingError(
            f"{name} must be a text, a list of texts or a list of token-id lists, not {type(input).__name__}"
        )
    if not input:
        raise EmbeddingError(f"{name} is an empty list: give at least one text or token list")
    if all(_is_token(t) for t in input):
        return [[int(t) for t in input]], True
    out: list[str | list[int]] = []
    for i, x in enumerate(input):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, (list, tuple, np.ndarray)) and all(_is_token(t) for t in x):
            out.append([int(t) for t in x])
        else:
            raise EmbeddingError(
                f"{name}[{i}] must be a text or a list of token ids, not {type(x).__name__} {str(x)[:40]!r}"
            )
    return out, False


def _is_token(t: Any) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))


def max_input_tokens(ctx: Any) -> int:
    """The most tokens one input may have in ``ctx``: a whole input goes in one decode (n_batch) and in the
    context (n_ctx); a pooled or non-causal (encoder) sequence in one ubatch (n_ubatch), an encoder's
    within its training context (absolute positions)."""
    limit = min(int(ctx.n_batch), int(ctx.n_ctx))
    hp = getattr(getattr(ctx, "model", None), "hparams", None)
    encoder = hp is not None and not getattr(hp, "causal_attn", True)
    if encoder or int(getattr(ctx, "pooling_type", 0)) != PoolingType.NONE:
        limit = min(limit, int(getattr(ctx, "n_ubatch", limit)))
    if encoder and getattr(hp, "n_ctx_train", 0):
        limit = min(limit, int(hp.n_ctx_train))
    return limit


def fit_tokens(
    tokens: list[int], limit: int, truncate: bool, where: str, keep_last: bool = False
) -> list[int]:
    """``tokens`` checked against ``limit``: cut to it (``truncate``; ``keep_last`` keeps the closing special
    token, as Hugging Face tokenizers truncate) or an :class:`EmbeddingError`."""
    if not tokens:
        raise EmbeddingError(f"{where} is empty (no tokens to embed)")
    if len(tokens) <= limit:
        return tokens
    if not truncate:
        raise EmbeddingError(
            f"{where} has {len(tokens)} tokens, more than the {limit} one input may have here "
            "(n_batch/n_ctx; pass truncate=True to cut it, or raise n_ctx and n_batch)"
        )
    return tokens[: limit - 1] + tokens[-1:] if keep_last and limit > 1 else tokens[:limit]


def ends_with_special(vocab: Any, tokens: list[int]) -> bool:
    """Whether tokenization added a closing token (EOS or SEP) at the end of ``tokens``."""
    if not tokens:
        return False
    ends = [vocab.eos] if getattr(vocab, "add_eos", False) else []
    ends += [vocab.sep] if getattr(vocab, "add_sep", False) else []
    return tokens[-1] in [t for t in ends if t is not None and t >= 0]


def format_rerank(vocab: Any, metadata: Mapping[str, Any], query: str, document: str) -> list[int]:
    """Tokens of one (query, document) pair for a rank-pooling model, as llama-server's
    ``format_prompt_rerank``: the model's rerank template (``tokenizer.chat_template.rerank``) with
    ``{query}`` and ``{document}`` replaced, tokenized with special tokens parsed and none added; otherwise
    ``[BOS] query [EOS] [SEP] document [EOS]``, each of BOS/EOS/SEP only where the vocabulary adds it
    (EOS falls back to SEP)."""
    tmpl = metadata.get(RERANK_TEMPLATE_KEY) if metadata else None
    if isinstance(tmpl, str) and tmpl:
        prompt = tmpl.replace("{query}", query).replace("{document}", document)
        return list(vocab.tokenize(prompt, add_special=False, parse_special=True))
    q = list(vocab.tokenize(query, add_special=False, parse_special=False))
    d = list(vocab.tokenize(document, add_special=False, parse_special=False))
    eos = vocab.eos if vocab.eos is not None and vocab.eos >= 0 else vocab.sep
    out = [vocab.bos] if vocab.add_bos else []
    out += q
    out += [eos] if vocab.add_eos else []
    out += [vocab.sep] if vocab.add_sep else []
    out += d
    out += [eos] if vocab.add_eos else []
    return [int(t) for t in out if t is not None and t >= 0]


# ---------------------------------------------------------------------------------- evaluation
def pack_inputs(lengths: Sequence[int], n_batch: int, n_seq_max: int) -> list[list[int]]:
    """Consecutive groups of input indices, each decoded at once: at most ``n_batch`` tokens and
    ``n_seq_max`` sequences per group (every length must be at most ``n_batch``)."""
    groups: list[list[int]] = []
    cur: list[int] = []
    n = 0
    for i, length in enumerate(lengths):
        if cur and (n + length > n_batch or len(cur) >= n_seq_max):
            groups.append(cur)
            cur, n = [], 0
        cur.append(i)
        n += length
    if cur:
        groups.append(cur)
    return groups


def embed_token_lists(ctx: Any, token_lists: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Raw embeddings of each token list, several sequences per decode (the memory is cleared before
    each): a pooled vector float32[n_embd] each (for rank pooling the scores, float32[n_cls_out]), or with
    pooling none float32[n_tokens, n_embd] per input. The caller checks the lengths (max_input_tokens)."""
    from ..batch import Batch

    if not getattr(ctx, "embeddings", False):
        raise EmbeddingError("the context computes no embeddings: create it with embeddings=True")
    pooled = int(getattr(ctx, "pooling_type", 0)) != PoolingType.NONE
    lengths = [len(t) for t in token_lists]
    out: list[np.ndarray] = []
    for group in pack_inputs(lengths, int(ctx.n_batch), int(ctx.n_seq_max)):
        tokens = np.concatenate([np.asarray(token_lists[i], dtype=np.int64) for i in group])
        pos = np.concatenate([np.arange(lengths[i], dtype=np.int32) for i in group])
        seq_id = [[s] for s, i in enumerate(group) for _ in range(lengths[i])]
        _clear_memory(ctx)
        ctx.decode(Batch(token=tokens, pos=pos, seq_id=seq_id, logits=[True] * len(tokens)))
        if pooled:
            out += [np.array(ctx.get_embeddings_seq(s), dtype=np.float32) for s in range(len(group))]
        else:
            rows = np.asarray(ctx.get_embeddings(), dtype=np.float32)
            offs = np.cumsum([0] + [lengths[i] for i in group])
            out += [rows[offs[k] : offs[k + 1]].copy() for k in range(len(group))]
    _clear_memory(ctx)
    return out


def _clear_memory(ctx: Any) -> None:
    mem = getattr(ctx, "memory", None)
    if mem is not None:
        mem.clear()


def rerank_results(
    scores: Sequence[float], documents: Sequence[str], top_n: int | None, return_documents: bool
) -> list[dict[str, Any]]:
    """Jina/Cohere-style results: ``index`` and ``relevance_score`` (and ``document``), best first."""
    if top_n is not None and (not isinstance(top_n, (int, np.integer)) or top_n < 0):
        raise EmbeddingError(f"top_n = {top_n!r} must be a non-negative integer")
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    res = []
    for i in order[: len(order) if top_n is None else int(top_n)]:
        r: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if return_documents:
            r["document"] = {"text": documents[i]}
        res.append(r)
    return res


class EmbeddingMixin:
    """Embedding and rerank methods; the context is set up by ``Llama`` (``embedding=True``)."""

    def _embedding_ctx(self) -> Any:
        if not self._embedding:
            raise LlamapyError("Llama model must be created with embedding=True to call this method")
        self._need_ctx()
        return self.ctx

    def _input_tokens(self, inputs: list[str | list[int]], truncate: bool) -> list[list[int]]:
        ctx = self.ctx
        limit = max_input_tokens(ctx)
        out = []
        for i, x in enumerate(inputs):
            where = "the input" if len(inputs) == 1 else f"input[{i}]"
            if isinstance(x, str):
                toks = self.tokenize(x.encode("utf-8"), add_bos=True, special=True)
                out.append(fit_tokens(toks, limit, truncate, where, ends_with_special(self.vocab, toks)))
            else:
                bad = [t for t in x if not 0 <= t < self.n_vocab()]
                if bad:
                    raise EmbeddingError(
                        f"{where}: token id {bad[0]} is out of range (n_vocab = {self.n_vocab()})"
                    )
                out.append(fit_tokens(list(x), limit, truncate, where))
        return out

    def embed(
        self,
        input: str | list[str] | list[int] | list[list[int]],
        normalize: bool | int = True,
        truncate: bool = True,
        return_count: bool = False,
    ) -> Any:
        """Embeddings of a text, a list of texts, a list of token ids or a list of token-id lists: a pooled
        vector per input, or with pooling none a vector per token (as llama-cpp-python). ``normalize``:
        True (L2), False, or an ``--embd-normalize`` integer. Inputs longer than the context are cut
        (``truncate``) or raise :class:`EmbeddingError`. Many inputs share decodes (n_batch tokens,
        n_seq_max sequences each) and give the vectors each would give alone."""
        ctx = self._embedding_ctx()
        mode = normalize_mode(normalize)
        inputs, single = embedding_inputs(input)
        token_lists = self._input_tokens(inputs, truncate)
        seq = self._need_ctx()
        seq.clear()
        raw = embed_token_lists(ctx, token_lists)
        seq.clear()
        out = [normalize_embedding(v, mode).tolist() for v in raw]
        result: Any = out[0] if single else out
        n = sum(len(t) for t in token_lists)
        return (result, n) if return_count else result

    def create_embedding(
        self, input: str | list[str] | list[int] | list[list[int]], model: str | None = None
    ) -> dict[str, Any]:
        """OpenAI's embeddings response (L2-normalized vectors) with usage."""
        vecs, n = self.embed(input, return_count=True)
        if embedding_inputs(input)[1]:
            vecs = [vecs]
        data = [dict(object="embedding", embedding=v, index=i) for i, v in enumerate(vecs)]
        return dict(object="list", data=data, model=model or self.model_path,
                    usage=dict(prompt_tokens=n, total_tokens=n))  # fmt: skip

    def _rank_scores(self, query: str, documents: Sequence[str], truncate: bool) -> tuple[list[float], int]:
        ctx = self._embedding_ctx()
        if int(getattr(ctx, "pooling_type", 0)) != PoolingType.RANK:
            raise EmbeddingError(
                f"{self.model_path}: reranking needs a model with a rank head, created with "
                f"Llama(..., embedding=True, pooling_type='rank') (this context pools with type "
                f"{getattr(ctx, 'pooling_type', None)})"
            )
        if not isinstance(query, str):
            raise EmbeddingError(f"query must be a text, not {type(query).__name__}")
        docs, _ = embedding_inputs(
            list(documents) if not isinstance(documents, str) else [documents], "documents"
        )
        limit = max_input_tokens(ctx)
        meta = getattr(self.model, "metadata", {}) or {}
        lists = []
        for i, d in enumerate(docs):
            if not isinstance(d, str):
                raise EmbeddingError(f"documents[{i}] must be a text")
            toks = format_rerank(self.vocab, meta, query, d)
            lists.append(fit_tokens(toks, limit, truncate, f"query + documents[{i}]"))
        seq = self._need_ctx()
        seq.clear()
        raw = embed_token_lists(ctx, lists)
        seq.clear()
        return [float(v.reshape(-1)[0]) for v in raw], sum(len(t) for t in lists)

    def rank(self, query: str, documents: Sequence[str], truncate: bool = True) -> list[float]:
        """Relevance scores of ``documents`` to ``query``, in document order (the ``Llama.rank`` of
        llama-cpp-python's reranking proposal, PR #1820); :meth:`rerank` sorts and labels them."""
        return self._rank_scores(query, documents, truncate)[0]

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_n: int | None = None,
        return_documents: bool = False,
        truncate: bool = True,
    ) -> list[dict[str, Any]]:
        """Relevance of each document to ``query`` on a rank-pooling model (bge-reranker, Qwen3-Reranker):
        ``[{"index", "relevance_score"[, "document": {"text"}]}]`` best first, ``top_n`` of them. The
        score is the rank head's first output, unnormalized, as llama-server's."""
        scores, _ = self._rank_scores(query, documents, truncate)
        return rerank_results(scores, list(documents), top_n, return_documents)

    def create_rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_n: int | None = None,
        return_documents: bool = False,
        model: str | None = None,
    ) -> dict[str, Any]:
        """The Jina/Cohere rerank response: ``results`` best first, with ``usage``."""
        scores, n = self._rank_scores(query, documents, True)
        results = rerank_results(scores, list(documents), top_n, return_documents)
        return dict(object="list", model=model or self.model_path, results=results,
                    usage=dict(prompt_tokens=n, total_tokens=n))  # fmt: skip
