"""Log-probabilities reported to users: those of the raw logits (as llama.cpp's server reports them),
one implementation for the API, the server and the CLI; and llama-server's ``post_sampling_probs``, the
probabilities after the sampler chain."""

from __future__ import annotations

import numpy as np

from .token_data import TokenDataArray


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """``log(softmax(logits))`` along the last axis, computed in float64, returned as float32."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    return (x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))).astype(np.float32)


def top_logprobs(logprobs: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The ``n`` most likely tokens as (id, logprob), most likely first (ties: lower id first)."""
    if n <= 0:
        return []
    n = min(n, logprobs.size)
    idx = np.argpartition(-logprobs, n - 1)[:n]
    idx = idx[np.lexsort((idx, -logprobs[idx]))]
    return [(int(i), float(logprobs[i])) for i in idx]


def post_sampling_probs(cur: TokenDataArray, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """llama-server's ``post_sampling_probs``: probabilities after the sampler chain, read from its final
    candidates ``cur`` (``SamplerChain.cur``: what truncation left, ``p`` as the last sampler's softmax
    set it). Returns the probability of ``token`` among them (1.0 when it is not there, llama-server's
    default; the chain's own pick always is) and up to ``n`` candidates as (id, prob), most probable
    first (ties: the chain's order), stopping before the first zero probability (as
    ``populate_token_probs`` over ``common_sampler_get_candidates(do_sort=true)``)."""
    ids, p = cur.ids, cur.p
    size = len(ids)
    sel = cur.selected
    if 0 <= sel < size and int(ids[sel]) == token:
        prob = float(p[sel])
    else:
        at = np.flatnonzero(ids == token)
        prob = float(p[at[0]]) if at.size else 1.0
    top = []
    for i, v in top_logprobs(p[:size], n):  # (positions, most probable first, ties in the chain's order)
        if v == 0.0:
            break
        top.append((int(ids[i]), v))
    return prob, top
