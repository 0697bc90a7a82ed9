"""Peak RSS while generating with a model at a given context size (issue 4: Gemma 3 270M at -c 4096).

Usage: python benchmarks/memory.py [MODEL] [-c 4096] [-n 32] [-t 2]
Prints the file size, KV cache bytes, peak RSS after load and after generation (ru_maxrss), so the
peak can be compared with "file size + KV cache + a small constant" (llama.cpp: 608 MB for the
463 MiB Qwen2.5 0.5B file on this machine kind).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_split() -> str:
    """Current RSS as anonymous memory (heap: vocabulary, scratch, compiled code) + file-backed pages
    (the mmapped weights, shared libraries), from /proc/self/status."""
    try:
        d = {}
        for line in open("/proc/self/status"):
            k, v = line.split(":", 1)
            if k in ("RssAnon", "RssFile"):
                d[k] = int(v.split()[0]) // 1024
        return f"anon {d['RssAnon']} + file {d['RssFile']} MiB"
    except (OSError, KeyError, ValueError):
        return "n/a"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="gemma3-270m")
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-p", "--n-prompt", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    from llamapy import hub
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    path = args.model if os.path.exists(args.model) else str(hub.pull(args.model, quiet=True))
    base, base_split = rss_mib(), rss_split()
    t0 = time.perf_counter()
    model = Model.load(path)
    t_load = time.perf_counter() - t0
    after_load, load_split = rss_mib(), rss_split()
    ctx = Context(model, ContextParams(n_ctx=args.ctx_size, n_threads=args.threads))
    kv = ctx.memory.nbytes / 2**20
    toks = list(range(100, 100 + args.n_prompt))
    ctx.decode(Batch.from_tokens(toks))
    tok = int(ctx.get_logits_ith(-1).argmax())
    for _ in range(args.n_gen):
        ctx.decode(Batch.from_tokens([tok]))
        tok = int(ctx.get_logits_ith(-1).argmax())
    peak, peak_split = rss_mib(), rss_split()
    fsize = os.path.getsize(path) / 2**20
    print(f"model {model.desc} ({path}), load {t_load:.2f} s")
    print(
        f"file {fsize:.1f} MiB, KV cache {kv:.1f} MiB at n_ctx={ctx.n_ctx} "
        f"(caches: {', '.join(f'{c.name} {c.n_cells} cells x {len(c.layers)} layers' for c in ctx.memory.caches)})"
    )
    print(
        f"peak RSS: interpreter+imports {base:.0f} MiB, after load {after_load:.0f} MiB, "
        f"after {args.n_prompt}+{args.n_gen} tokens {peak:.0f} MiB"
    )
    print(f"now: after imports {base_split}; after load {load_split}; after generation {peak_split}")
    print(f"peak - file - KV = {peak - fsize - kv:.0f} MiB; timings {ctx.timings()}")


if __name__ == "__main__":
    main()
