"""``llamapy perplexity``: llama-perplexity's method.

The text is tokenized once (BOS as the model asks), cut into chunks of ``n_ctx`` tokens, and several
chunks go into one batch as separate sequences (``n_seq = n_batch / n_ctx``). Each chunk starts with
BOS when the model adds one; only the second half of each chunk is scored (every token there is
predicted with at least ``n_ctx / 2`` tokens of context). Prints ``Final estimate: PPL = X +/- Y``.

``--kl-divergence-base FILE`` saves the scored log-probabilities; ``--kl-divergence`` then compares
another model (e.g. a quantization) against that file: mean KL divergence and top-token agreement.
"""

from __future__ import annotations

import argparse
import math
import struct
import sys
import time
from dataclasses import field
from typing import Any, BinaryIO

import numpy as np

from .._dataclass import dataclass

_KLD_MAGIC = b"LPYKLD1\0"


@dataclass
class PerplexityResult:
    ppl: float
    ppl_err: float
    n_chunks: int
    n_tokens_scored: int
    chunk_ppl: list[float] = field(default_factory=list)
    seconds: float = 0.0
    kld_mean: float | None = None
    kld_err: float | None = None
    same_top: float | None = None


def _log_softmax_rows(logits: np.ndarray, block: int = 64) -> np.ndarray:
    out = np.empty(logits.shape, dtype=np.float32)
    for i in range(0, len(logits), block):
        x = logits[i : i + block].astype(np.float64)
        x -= x.max(axis=1, keepdims=True)
        x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
        out[i : i + block] = x
    return out


def perplexity(
    model: Any,
    tokens: list[int] | np.ndarray,
    n_ctx: int = 512,
    n_batch: int = 2048,
    n_threads: int | None = None,
    n_chunks: int = -1,
    kld_base_out: BinaryIO | None = None,
    kld_base_in: BinaryIO | None = None,
    progress: Any = None,
    **ctx_kw: Any,
) -> PerplexityResult:
    from ..batch import Batch
    from ..context import Context, ContextParams
    from ..errors import LlamapyError

    tokens = np.asarray(tokens, dtype=np.int64)
    if len(tokens) < 2 * n_ctx:
        raise LlamapyError(
            f"perplexity needs at least 2 * n_ctx = {2 * n_ctx} tokens, the text has {len(tokens)}"
        )
    n_chunk_max = len(tokens) // n_ctx
    n_chunk = n_chunk_max if n_chunks < 0 else min(n_chunks, n_chunk_max)
    n_seq = max(1, n_batch // n_ctx)
    first = n_ctx // 2
    vocab = model.vocab
    add_bos = bool(vocab is not None and vocab.add_bos)
    bos = vocab.bos if vocab is not None else -1
    params = ContextParams(n_ctx=n_ctx * n_seq, n_batch=max(n_batch, n_ctx), n_ubatch=min(512, n_ctx),
                           n_seq_max=n_seq, n_threads=n_threads, **ctx_kw)  # fmt: skip
    ctx = Context(model, params)
    if kld_base_out is not None:
        kld_base_out.write(_KLD_MAGIC + struct.pack("<III", n_ctx, model.n_vocab, len(tokens)))
        kld_base_out.write(tokens.astype("<i4").tobytes())
    if kld_base_in is not None:
        head = kld_base_in.read(len(_KLD_MAGIC) + 12)
        if head[: len(_KLD_MAGIC)] != _KLD_MAGIC:
            raise LlamapyError("--kl-divergence-base: not a llamapy log-probability file")
        b_ctx, b_vocab, b_ntok = struct.unpack("<III", head[len(_KLD_MAGIC) :])
        base_tok = np.frombuffer(kld_base_in.read(4 * b_ntok), dtype="<i4")
        if b_ctx != n_ctx or b_vocab != model.n_vocab or not np.array_equal(base_tok, tokens):
            raise LlamapyError(
                f"--kl-divergence-base was made with n_ctx={b_ctx}, n_vocab={b_vocab}, {b_ntok} tokens; "
                f"this run has n_ctx={n_ctx}, n_vocab={model.n_vocab}, {len(tokens)} tokens"
            )
    nll = nll2 = 0.0
    count = 0
    kld_sum = kld_sum2 = 0.0
    same = 0
    chunk_ppl: list[float] = []
    t0 = time.perf_counter()
    for i in range(0, n_chunk, n_seq):
        n_seq_batch = min(n_seq, n_chunk - i)
        ctx.memory.clear()
        toks, pos, seqs, outs = [], [], [], []
        for s in range(n_seq_batch):
            start = (i + s) * n_ctx
            chunk = tokens[start : start + n_ctx].copy()
            if add_bos:
                chunk[0] = bos
            toks.append(chunk)
            pos.append(np.arange(n_ctx, dtype=np.int32))
            seqs += [[s]] * n_ctx
            outs.append(np.arange(n_ctx) >= first)
        ctx.decode(Batch(np.concatenate(toks), None, np.concatenate(pos), seqs, np.concatenate(outs)))
        logits = ctx.get_logits()
        n_scored = n_ctx - first
        for s in range(n_seq_batch):
            start = (i + s) * n_ctx
            lp = _log_softmax_rows(logits[s * n_scored : s * n_scored + n_scored - 1])
            target = tokens[start + first + 1 : start + n_ctx]
            tlp = lp[np.arange(len(target)), target].astype(np.float64)
            nll += float(-tlp.sum())
            nll2 += float((tlp * tlp).sum())
            count += len(target)
            if kld_base_out is not None:
                kld_base_out.write(lp.astype(np.float16).tobytes())
            if kld_base_in is not None:
                raw = kld_base_in.read(lp.size * 2)
                if len(raw) != lp.size * 2:
                    raise LlamapyError("--kl-divergence-base: the file ends before this run's chunks")
                base = np.frombuffer(raw, dtype=np.float16).reshape(lp.shape).astype(np.float64)
                kl = (np.exp(base) * (base - lp)).sum(axis=1)
                kld_sum += float(kl.sum())
                kld_sum2 += float((kl * kl).sum())
                same += int((base.argmax(1) == lp.argmax(1)).sum())
            chunk_ppl.append(math.exp(nll / count))
            if progress is not None:
                progress(len(chunk_ppl), chunk_ppl[-1])
    mean = nll / count
    var = nll2 / count - mean * mean
    err = math.sqrt(var / (count - 1)) * math.exp(mean) if var > 0 and count > 1 else 0.0
    res = PerplexityResult(math.exp(mean), err, len(chunk_ppl), count, chunk_ppl, time.perf_counter() - t0)
    if kld_base_in is not None:
        m = kld_sum / count
        res.kld_mean = m
        res.kld_err = math.sqrt(max(kld_sum2 / count - m * m, 0.0) / max(count - 1, 1))
        res.same_top = same / count
    return res


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "perplexity", help="perplexity of a model over a text file (llama-perplexity's method)"
    )
    p.add_argument(
        "-m", "--model", default=None, help="GGUF model file (or a known model name, or user/repo[:quant])"
    )
    from .common import add_hf_args

    add_hf_args(p)  # -hf user/repo[:quant], -hff, --hf-token, --offline, --no-mmproj
    p.add_argument("-f", "--file", required=True, help="text file")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="tokens per chunk (default 512)")
    p.add_argument(
        "-b", "--batch-size", type=int, default=2048, help="tokens per batch; chunks per batch = b / c"
    )
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("--chunks", type=int, default=-1, help="score only the first N chunks")
    p.add_argument("-ctk", "--cache-type-k", default="f16", help="K cache type (f16, f32, q8_0, q4_0)")
    p.add_argument("-ctv", "--cache-type-v", default="f16", help="V cache type (f16, f32, q8_0, q4_0)")
    p.add_argument(
        "--kl-divergence-base", metavar="FILE", help="save (or with --kl-divergence, read) log-probs here"
    )
    p.add_argument("--kl-divergence", action="store_true", help="compare against --kl-divergence-base")
    from .common import add_rope_args

    add_rope_args(p)  # --rope-scaling, --rope-scale, --yarn-*, --override-kv (llama.cpp's common flags)
    from .compat import add_compat_args

    add_compat_args(p, "cpu", "device", "log")
    p.set_defaults(func=run)


def _resolve_model(name: str) -> str:
    import os

    if os.path.exists(name):
        return name
    try:
        from .. import hub

        cached = hub.cached_path(name)
        if cached:
            return str(cached)
    except Exception:  # not a known model name
        pass
    from ..hub import looks_like_ref, resolve_model

    if looks_like_ref(name):  # user/repo[:quant]: from the Hugging Face cache, or downloaded once
        return str(resolve_model(name))
    return name


def run(args: argparse.Namespace) -> int:
    from ..errors import LlamapyError
    from ..model import Model

    if args.ctx_size < 8:
        raise LlamapyError(f"-c {args.ctx_size}: the context must be at least 8 tokens")
    if args.kl_divergence and not args.kl_divergence_base:
        raise LlamapyError("--kl-divergence needs --kl-divergence-base FILE")
    from .common import hf_model_or, kv_overrides_arg, rope_kwargs

    rope, overrides = rope_kwargs(args), kv_overrides_arg(args)
    model = Model.load(str(hf_model_or(args, _resolve_model)), kv_overrides=overrides)
    if model.vocab is None:
        raise LlamapyError(f"{args.model}: the model has no vocabulary to tokenize the text")
    with open(args.file, encoding="utf-8", errors="replace") as f:
        text = f.read()
    t0 = time.perf_counter()
    tokens = model.vocab.tokenize(text, add_special=True, parse_special=False)
    print(
        f"perplexity: tokenizing the input took {time.perf_counter() - t0:.2f} s, {len(tokens)} tokens",
        file=sys.stderr,
    )
    n_seq = max(1, args.batch_size // args.ctx_size)
    n_chunk = (
        len(tokens) // args.ctx_size if args.chunks < 0 else min(args.chunks, len(tokens) // args.ctx_size)
    )
    print(
        f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={args.ctx_size}, "
        f"batch_size={args.batch_size}, n_seq={n_seq}",
        file=sys.stderr,
    )

    def progress(i: int, ppl: float) -> None:
        print(f"[{i}]{ppl:.4f},", end="", flush=True)

    out = inp = None
    if args.kl_divergence_base:
        if args.kl_divergence:
            inp = open(args.kl_divergence_base, "rb")
        else:
            out = open(args.kl_divergence_base, "wb")
    try:
        res = perplexity(
            model, tokens, args.ctx_size, args.batch_size, args.threads, args.chunks, out, inp, progress,
            type_k=args.cache_type_k, type_v=args.cache_type_v, **rope,
        )  # fmt: skip
    finally:
        for f in (out, inp):
            if f is not None:
                f.close()
    print()
    print(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.ppl_err:.5f}")
    if res.kld_mean is not None:
        print(f"Mean    KLD: {res.kld_mean:10.6f} +/- {res.kld_err:.6f}")
        print(f"Same top p: {100 * res.same_top:6.3f} %")
    print(
        f"perplexity: {res.n_tokens_scored} tokens scored in {res.seconds:.1f} s "
        f"({res.n_chunks * args.ctx_size / max(res.seconds, 1e-9):.1f} tokens/s evaluated)",
        file=sys.stderr,
    )
    return 0
