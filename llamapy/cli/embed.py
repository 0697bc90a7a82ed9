"""``llamapy embed``: embeddings of texts, like llama.cpp's ``llama-embedding``.

The prompt (``-p``, or a file with ``-f``, one text per line) is split at ``--embd-separator`` (a
newline); each text is one input. All inputs are batched into as few decodes as ``-b`` and the
sequence limit allow. With ``--pooling rank`` a text ``query<TAB>document`` (``--cls-separator``) is a
pair scored by the model's rank head, printed as ``rerank score N: S``.

Output as llama-embedding's: without ``--embd-output-format`` the first values of each embedding and,
for several texts, their cosine-similarity matrix; ``json`` (OpenAI-shaped), ``json+`` (with the
matrix), ``array`` (a JSON array of arrays) or ``raw`` (one embedding per line, space-separated).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from .common import POOLING_NAMES, _number, add_model_args

FORMATS = ("json", "json+", "array", "raw")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("embed", help="embeddings of texts (like llama-embedding)")
    add_model_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", help="the text(s), separated by --embd-separator")
    src.add_argument("-f", "--file", help="a file of texts, one per line (--embd-separator)")
    p.add_argument("--pooling", choices=POOLING_NAMES, default=None, help="pooling (default: the model's)")
    p.add_argument(
        "--embd-normalize",
        type=_number(int, -1, what="normalization"),
        default=None,
        metavar="N",
        help="-1 none, 0 max-abs (int16), 1 taxicab, 2 euclidean (default; none for rank scores), >2 p-norm",
    )
    p.add_argument("--embd-output-format", choices=FORMATS, default="", metavar="FMT",
                   help="json, json+, array or raw (default: a readable summary)")  # fmt: skip
    p.add_argument("--embd-separator", default="\n", metavar="STR", help="separator of the texts (newline)")
    p.add_argument("--cls-separator", default="\t", metavar="STR", help="query/document separator for rank")
    p.add_argument("-np", "--parallel", type=_number(int, 1, 64, what="sequence count"), default=None,
                   metavar="N", help="sequences per decode (default 64)")  # fmt: skip
    p.add_argument("--no-escape", dest="escape", action="store_false", help="do not process escapes in -p")
    from .compat import add_compat_args

    add_compat_args(p, "cpu", "device", "log")
    p.set_defaults(func=run, seed=-1)


def split_lines(s: str, sep: str) -> list[str]:
    """llama.cpp's split_lines: every part, the last one too (empty parts kept)."""
    return s.split(sep) if sep else [s]


def _prompt(args: argparse.Namespace) -> str:
    from ..errors import LlamapyError
    from .common import read_text
    from .tokenize import process_escapes

    if args.file is not None:
        text = read_text(args.file, "prompt file")
        return text[:-1] if text.endswith("\n") else text  # as llama.cpp's -f
    if args.prompt is None:
        raise LlamapyError("give the text(s) to embed with -p TEXT or -f FILE")
    raw = args.prompt.encode("utf-8", "surrogateescape")
    return (process_escapes(raw) if args.escape else raw).decode("utf-8", "replace")


def _is_causal(path: str) -> bool:
    from ..gguf.reader import GGUFReader

    with GGUFReader(path) as r:
        return bool(r.get(f"{r.get('general.architecture', '')}.attention.causal", True))


def rank_pair_tokens(llm: Any, prompt: str, cls_sep: str) -> list[int]:
    """A ``query<cls_sep>document`` line as llama-embedding tokenizes it for rank pooling."""
    from ..api.embedding import RERANK_TEMPLATE_KEY

    v = llm.vocab
    pairs = split_lines(prompt, cls_sep)
    tmpl = (getattr(llm.model, "metadata", {}) or {}).get(RERANK_TEMPLATE_KEY)
    if isinstance(tmpl, str) and tmpl:
        final = tmpl.replace("{query}", pairs[0]).replace("{document}", pairs[1] if len(pairs) > 1 else "")
    else:
        eos = v.token_text(v.eos) if v.add_eos and v.eos >= 0 else ""
        sep = v.token_text(v.sep) if v.add_sep and v.sep >= 0 else ""
        final = (eos + sep).join(pairs)
    return llm.tokenize(final.encode("utf-8"), add_bos=True, special=True)


def _fmt(x: float, norm: int, human: bool = False) -> str:
    if human:
        return f"{x:6.0f} " if norm == 0 else f"{x:9.6f} "
    return f"{x:1.0f}" if norm == 0 else f"{x:1.7f}"


def cos_sim(a: np.ndarray, b: np.ndarray) -> float:
    """llama.cpp's common_embd_similarity_cos (two zero vectors are similar)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    s1, s2 = float(a64 @ a64), float(b64 @ b64)
    if s1 == 0.0 or s2 == 0.0:
        return 1.0 if s1 == s2 == 0.0 else 0.0
    return float(a64 @ b64) / (np.sqrt(s1) * np.sqrt(s2))


def run(args: argparse.Namespace) -> int:
    from ..api.embedding import (
        embed_token_lists,
        ends_with_special,
        fit_tokens,
        max_input_tokens,
        normalize_embedding,
    )
    from ..model.hparams import PoolingType
    from .common import resolve_model_args

    text = _prompt(args)
    path = str(resolve_model_args(args))
    args.model = path
    args.batch_size = max(args.batch_size, args.ctx_size)  # as llama-embedding: use the whole context
    if not _is_causal(path):
        args.ubatch_size = args.batch_size  # a non-causal model takes a whole sequence per ubatch
    llm = _load(args)
    ctx = llm.ctx
    pooling = int(ctx.pooling_type)
    prompts = split_lines(text, args.embd_separator)
    limit = max_input_tokens(ctx)
    lists = []
    for i, pr in enumerate(prompts):
        if pooling == PoolingType.RANK and args.cls_separator and args.cls_separator in pr:
            toks = rank_pair_tokens(llm, pr, args.cls_separator)
        else:
            toks = llm.tokenize(pr.encode("utf-8"), add_bos=True, special=True)
        where = f"input line {i + 1}"
        lists.append(fit_tokens(toks, limit, False, where, ends_with_special(llm.vocab, toks)))
    norm = args.embd_normalize
    if norm is None:
        norm = -1 if pooling == PoolingType.RANK else 2
    raw = embed_token_lists(ctx, lists)
    embs = [np.atleast_2d(normalize_embedding(v, norm)) for v in raw]
    rows = np.concatenate(embs) if pooling == PoolingType.NONE else np.stack([e[0] for e in embs])
    out = sys.stdout
    if not args.embd_output_format:
        _print_summary(out, rows, prompts, pooling, norm)
    elif args.embd_output_format == "raw":
        for r in rows:
            out.write(" ".join(_fmt(float(x), norm) for x in r) + "\n")
    else:
        _print_json(out, rows, args.embd_output_format, norm, n_prompts=len(prompts))
    out.flush()
    return 0


def _load(args: argparse.Namespace) -> Any:
    """The model (``args.model`` is a path by now) as an embedding ``Llama`` (a one-line summary on stderr)."""
    import time
    from pathlib import Path

    from ..api import Llama
    from .common import llama_kwargs, log

    t0 = time.perf_counter()
    kw = llama_kwargs(args) | dict(verbose=False, embedding=True, pooling_type=args.pooling)
    kw["n_seq_max"] = args.parallel or 64
    llm = Llama(args.model, **kw)
    m = llm.model
    log(
        f"llamapy: loaded {Path(args.model).name} ({m.desc}) in {time.perf_counter() - t0:.2f} s, "
        f"n_ctx = {llm.n_ctx()}, pooling type {llm.ctx.pooling_type}"
    )
    return llm


def _print_summary(out: Any, rows: np.ndarray, prompts: list[str], pooling: int, norm: int) -> None:
    from ..model.hparams import PoolingType

    out.write("\n")
    n = rows.shape[1] if rows.ndim == 2 else 0
    if pooling == PoolingType.NONE:
        for j, r in enumerate(rows):
            head = "".join(_fmt(float(x), norm, True) for x in r[: min(3, n)])
            tail = "".join(_fmt(float(x), norm, True) for x in r[max(0, n - 3) :])
            out.write(f"embedding {j}: {head} ... {tail}\n")
        return
    if pooling == PoolingType.RANK:
        for j, r in enumerate(rows):
            if n == 1:
                out.write(f"rerank score {j}: {r[0]:8.3f}\n")
            else:
                for i in range(n):
                    out.write(f"rerank score {j}: {r[i]:8.3f} [{i}]\n")
        return
    for j, r in enumerate(rows):
        k = min(16, n) if len(prompts) > 1 else n
        out.write(f"embedding {j}: " + "".join(_fmt(float(x), norm, True) for x in r[:k]) + "\n")
    if len(prompts) > 1:
        out.write("\ncosine similarity matrix:\n\n")
        out.write("".join(f"{p[:6]:>6.6s} " for p in prompts) + "\n")
        for i in range(len(prompts)):
            out.write("".join(f"{cos_sim(rows[i], rows[j]):6.2f} " for j in range(len(prompts))))
            out.write(prompts[i][:10] + "\n")


def _print_json(out: Any, rows: np.ndarray, fmt: str, norm: int, n_prompts: int) -> None:
    def vec(r: np.ndarray) -> str:
        return "[" + ",".join(_fmt(float(x), norm) for x in r) + "]"

    if fmt == "array":
        out.write("[" + ",".join(vec(r) for r in rows) + "]\n")
        return
    items = [
        f'    {{\n      "object": "embedding",\n      "index": {j},\n      "embedding": {vec(r)}\n    }}'
        for j, r in enumerate(rows)
    ]
    out.write('{\n  "object": "list",\n  "data": [\n' + ",\n".join(items) + "\n  ]")
    if fmt == "json+" and n_prompts > 1:
        sims = [
            "    [" + ", ".join(f"{cos_sim(rows[i], rows[j]):6.2f}" for j in range(len(rows))) + " ]"
            for i in range(len(rows))
        ]
        out.write(',\n  "cosineSimilarity": [\n' + ",\n".join(sims) + "\n  ]")
    out.write("\n}\n")
