"""``llamapy bench``: llama-bench's tests and output.

pp<N>: one batch of N prompt tokens into an empty cache; tg<N>: N single-token decodes from an empty
cache. With ``-d/--n-depth D`` (comma list, like llama-bench's) the cache is first filled with D prompt
tokens (not timed; filled once per test, then restored from a saved state before each repetition) and
the test reads ``pp512 @ d4096``. Each test runs once as warm-up and then ``-r`` times; tokens/s per
sample, their mean and standard deviation are reported as a Markdown table or JSON records with
llama-bench's field names.
``--profile`` adds where the time of generated tokens goes (cProfile of one tg run, by function), after the
mat-vec kernels' read rate (GB/s) per weight type.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from .._cpuload import cpu_model


def _tokens(model: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    toks = rng.integers(0, model.n_vocab, size=n)
    v = model.vocab
    if v is not None and v.add_bos and v.bos >= 0 and n:
        toks[0] = v.bos
    return toks


def _fill(ctx: Any, toks: np.ndarray, pos0: int = 0) -> None:
    from ..batch import Batch

    for i in range(0, len(toks), ctx.n_batch):
        ctx.decode(Batch.from_tokens(toks[i : i + ctx.n_batch], pos0=pos0 + i))


def run_test(
    ctx: Any, model: Any, n_prompt: int, n_gen: int, reps: int, seed: int = 1, n_depth: int = 0
) -> list[float]:
    """Seconds per repetition (after one warm-up run), after filling the cache to ``n_depth``."""
    from ..batch import Batch

    rng = np.random.default_rng(seed)
    depth_state = None
    if n_depth:
        ctx.memory.clear()
        _fill(ctx, _tokens(model, n_depth, rng))
        depth_state = ctx.state_seq_get_data(0)
    times = []
    for r in range(reps + 1):
        ctx.memory.clear()
        if depth_state is not None:
            ctx.state_seq_set_data(depth_state, 0)
        t0 = time.perf_counter()
        if n_prompt:
            toks = _tokens(model, n_prompt, rng) if not n_depth else rng.integers(0, model.n_vocab, n_prompt)
            _fill(ctx, toks, n_depth)
        if n_gen:
            tok = _tokens(model, 1, rng) if not n_depth else rng.integers(0, model.n_vocab, size=1)
            for i in range(n_gen if r else 1):
                ctx.decode(Batch.from_tokens(tok, pos0=n_depth + n_prompt + i))
                tok = rng.integers(0, model.n_vocab, size=1)
        dt = time.perf_counter() - t0
        if r:
            times.append(dt)
    return times


def bench(
    model_path: str,
    n_prompt: list[int],
    n_gen: list[int],
    reps: int = 5,
    n_threads: int | None = None,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    type_k: str = "f16",
    type_v: str = "f16",
    n_depth: list[int] | None = None,
    n_gpu_layers: int = 0,
    main_gpu: int = 0,
    offload_kqv: bool = True,
    repack: bool = True,
) -> list[dict[str, Any]]:
    from .._numba import set_num_threads
    from ..context import Context, ContextParams
    from ..model import Model

    model = Model.load(model_path)
    threads = set_num_threads(n_threads)
    depths = n_depth or [0]
    tests = [(p, 0, d) for d in depths for p in n_prompt if p > 0]
    tests += [(0, g, d) for d in depths for g in n_gen if g > 0]
    records = []
    for p, g, d in tests:
        n_ctx = max(256, p + g + d)
        ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads,
                                           type_k=type_k, type_v=type_v, n_gpu_layers=n_gpu_layers,
                                           main_gpu=main_gpu, offload_kqv=offload_kqv, repack=repack))  # fmt: skip
        off = ctx.offload
        secs = run_test(ctx, model, p, g, reps, n_depth=d)
        n_tok = p + g
        samples_ts = [n_tok / s for s in secs]
        samples_ns = [int(s * 1e9) for s in secs]
        records.append({
            "build_commit": "llamapy",
            "build_number": 0,
            "cpu_info": cpu_model(),
            "gpu_info": off.device if off is not None else "",
            "backends": "CUDA" if off is not None else "CPU",
            "model_filename": os.path.abspath(model_path),
            "model_type": model.desc,
            "model_size": model.size,
            "model_n_params": model.n_params,
            "n_batch": n_batch,
            "n_ubatch": n_ubatch,
            "n_threads": threads,
            "type_k": type_k,
            "type_v": type_v,
            "n_gpu_layers": n_gpu_layers if off is not None else 0,
            "main_gpu": main_gpu,
            "no_kv_offload": not offload_kqv,
            "repack": repack,
            "flash_attn": True,
            "test_time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "n_prompt": p,
            "n_gen": g,
            "n_depth": d,
            "avg_ns": int(statistics.mean(samples_ns)),
            "stddev_ns": int(statistics.stdev(samples_ns)) if len(samples_ns) > 1 else 0,
            "avg_ts": statistics.mean(samples_ts),
            "stddev_ts": statistics.stdev(samples_ts) if len(samples_ts) > 1 else 0.0,
            "samples_ns": samples_ns,
            "samples_ts": samples_ts,
        })  # fmt: skip
    return records


def markdown(records: list[dict[str, Any]]) -> str:
    head = "| model | size | params | backend | threads | test | t/s |"
    lines = [
        head,
        "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |",
    ]
    for r in records:
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        if r["n_prompt"] and r["n_gen"]:
            test = f"pp{r['n_prompt']}+tg{r['n_gen']}"
        if r.get("n_depth"):
            test += f" @ d{r['n_depth']}"
        size = f"{r['model_size'] / 2**20:.2f} MiB"
        params = f"{r['model_n_params'] / 1e6:.2f} M"
        ts = f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}"
        lines.append(
            f"| {r['model_type']} | {size} | {params} | {r['backends']} | {r['n_threads']} | {test} | {ts} |"
        )
    return "\n".join(lines)


#: at most this many tokens decoded before the profile while the backends' prefetch tuners measure
PROFILE_TUNE_TOKENS = 128


def _until_tuned(ctx: Any, model: Any, limit: int = PROFILE_TUNE_TOKENS) -> int:
    """Decode single tokens (from an empty cache) while a backend's 8-row kernels are still measuring their
    prefetch distance (``ggml/cpu/prefetch_tune.py``: their first decode tokens alternate distances), at
    most ``limit``; how many. So the profile shows the kernels as the rest of a decode runs them."""
    from ..batch import Batch

    tuners = [t for b in ctx.sched.backends if (t := getattr(b, "prefetch", None)) is not None]
    n = 0
    ctx.memory.clear()
    rng = np.random.default_rng(0)
    while n < limit and any(t.tuning for t in tuners):
        ctx.decode(Batch.from_tokens(rng.integers(0, model.n_vocab, size=1), pos0=n))
        n += 1
    return n


def profile_tg(
    model_path: str,
    n_gen: int,
    n_threads: int | None,
    top: int = 25,
    n_depth: int = 0,
    repack: bool = True,
    **ctx_opts: Any,
) -> str:
    """cProfile of ``n_gen`` generated tokens (after ``n_depth`` tokens of context, and once the prefetch
    tuners have decided: ``_until_tuned``), sorted by own time, after a table of the mat-vec kernels' read
    rate per weight type (``kernel_rates``); ``repack`` and ``ctx_opts``
    (other ``ContextParams`` fields: ``n_ubatch``, ``type_k``, ``type_v``, ``n_gpu_layers``, ...) as the
    run's."""
    import cProfile
    import io
    import pstats

    from ..context import Context, ContextParams
    from ..model import Model

    model = Model.load(model_path)
    n_ctx = max(256, n_gen + n_depth, PROFILE_TUNE_TOKENS)
    ctx = Context(model, ContextParams(n_ctx=n_ctx, n_threads=n_threads, repack=repack, **ctx_opts))
    run_test(ctx, model, 0, 2, 1, n_depth=n_depth)  # compile kernels and build the graph first
    tuned = _until_tuned(ctx, model)
    prof = cProfile.Profile()
    prof.enable()
    secs = run_test(ctx, model, 0, n_gen, 1, n_depth=n_depth)
    prof.disable()
    out = io.StringIO()
    at = f" @ d{n_depth}" if n_depth else ""
    after = f", after {tuned} tokens of prefetch tuning" if tuned else ""
    out.write(f"tg{n_gen}{at}: {n_gen / secs[0]:.2f} t/s ({1e3 * secs[0] / n_gen:.2f} ms/token{after})\n")
    stats = pstats.Stats(prof, stream=out)
    out.write(kernel_rates(model_path, stats, n_gen + 1) + "\n")  # run_test's warm-up token too
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def weight_bytes_by_type(model_path: str) -> dict[str, float]:
    """Bytes of weight matrices one generated token reads, by GGML type (the token embedding only when it is
    also the output; MoE expert tensors by ``n_expert_used / n_expert``)."""
    from ..gguf.reader import GGUFReader

    r = GGUFReader(model_path)
    arch = r.get("general.architecture")
    n_exp, n_used = r.get(f"{arch}.expert_count"), r.get(f"{arch}.expert_used_count")
    frac = int(n_used) / int(n_exp) if n_exp and n_used else 1.0
    names = {t.name for t in r.tensors}
    out: dict[str, float] = {}
    for t in r.tensors:
        if len(t.ne) < 2 or (t.name == "token_embd.weight" and "output.weight" in names):
            continue
        out[t.ggml_type.name] = out.get(t.ggml_type.name, 0.0) + t.nbytes * (
            frac if "_exps" in t.name else 1.0
        )
    return out


def kernel_rates(model_path: str, stats: Any, n_tokens: int) -> str:
    """Per weight type: bytes read per token, the time of the CPU mat-vec kernels named for the type
    (``mm*_<type>`` in ``llamapy/ggml/cpu``) and the GB/s that makes."""
    import re

    by_type = weight_bytes_by_type(model_path)
    rows = ["type        MB/token   kernels (calls)                          ms/token    GB/s"]
    for tname, nbytes in sorted(by_type.items(), key=lambda kv: -kv[1]):
        tn = tname.lower()
        secs, used = 0.0, []
        for (fname, _, func), (_, ncalls, tottime, *_rest) in stats.stats.items():
            cpu_dir = "ggml/cpu" in fname.replace(os.sep, "/")
            if cpu_dir and func.startswith("mm") and re.search(rf"_{tn}(?![0-9a-z])", func):
                secs += tottime
                used.append(f"{func} ({ncalls})")
        rate = f"{nbytes * n_tokens / secs / 1e9:7.2f}" if secs else "      -"
        ms = f"{1e3 * secs / n_tokens:8.3f}" if secs else "       -"
        rows.append(
            f"{tname:10} {nbytes / 1e6:9.2f}   {', '.join(used) or '(none named for it)':40} {ms}  {rate}"
        )
    return "\n".join(rows) + "\n"


def _int_list(s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a comma-separated list of integers") from None
    if any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"{s!r}: values must be >= 0")
    return vals


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="prompt and generation speed, like llama-bench")
    p.add_argument(
        "-m", "--model", default=None, help="GGUF model file (or a known model name, or user/repo[:quant])"
    )
    from .common import add_hf_args

    add_hf_args(p)  # -hf user/repo[:quant], -hff, --hf-token, --offline, --no-mmproj
    p.add_argument(
        "-p", "--n-prompt", type=_int_list, default=[512], help="prompt tokens (comma list; default 512)"
    )
    p.add_argument(
        "-n", "--n-gen", type=_int_list, default=[128], help="generated tokens (comma list; default 128)"
    )
    p.add_argument(
        "-d",
        "--n-depth",
        type=_int_list,
        default=[0],
        help="context depth before each test (comma list; default 0)",
    )
    p.add_argument("-r", "--repetitions", type=int, default=5, help="repetitions per test (default 5)")
    p.add_argument(
        "-t",
        "--threads",
        type=int,
        default=None,
        help="threads (default: the cores other processes leave free, at each decode)",
    )
    p.add_argument("-b", "--batch-size", type=int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=int, default=512)
    p.add_argument("-ctk", "--cache-type-k", default="f16")
    p.add_argument("-ctv", "--cache-type-v", default="f16")
    p.add_argument(
        "-ngl", "--n-gpu-layers", type=int, default=0, help="layers on the CUDA backend (-1 / 99: all)"
    )
    p.add_argument("-mg", "--main-gpu", type=int, default=0, help="the GPU to use (default 0)")
    p.add_argument(
        "-nkvo", "--no-kv-offload", type=int, choices=(0, 1), default=0, help="1: the KV cache on the CPU"
    )
    p.add_argument(
        "--repack",
        type=int,
        choices=(0, 1),
        default=1,
        help="0: the file's rows, not the 8-row copies (default 1)",
    )
    p.add_argument("-o", "--output", choices=("md", "json", "jsonl"), default="md")
    p.add_argument("--profile", action="store_true", help="also profile a tg run (time by function)")
    p.add_argument("--profile-top", type=int, default=25, help="rows of the --profile table (default 25)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import LlamapyError
    from .perplexity import _resolve_model

    if args.repetitions < 1:
        raise LlamapyError(f"-r {args.repetitions}: at least one repetition is needed")
    from .common import hf_model_or

    path = str(hf_model_or(args, _resolve_model))
    recs = bench(path, args.n_prompt, args.n_gen, args.repetitions, args.threads, args.batch_size,
                 args.ubatch_size, args.cache_type_k, args.cache_type_v, args.n_depth, args.n_gpu_layers,
                 args.main_gpu, not args.no_kv_offload, bool(args.repack))  # fmt: skip
    if args.output == "json":
        print(json.dumps(recs, indent=2))
    elif args.output == "jsonl":
        for r in recs:
            print(json.dumps(r))
    else:
        print(markdown(recs))
    if args.profile:
        n = max(args.n_gen or [0]) or 32  # prompt tests only (-n 0): profile 32 generated tokens
        prof = profile_tg(path, n, args.threads, args.profile_top, max(args.n_depth or [0]), bool(args.repack),
                          n_batch=args.batch_size, n_ubatch=args.ubatch_size, type_k=args.cache_type_k,
                          type_v=args.cache_type_v, n_gpu_layers=args.n_gpu_layers, main_gpu=args.main_gpu,
                          offload_kqv=not args.no_kv_offload)  # fmt: skip
        print(prof, file=sys.stderr)
    if any(not math.isfinite(r["avg_ts"]) for r in recs):
        return 1
    return 0
