"""Grammar-constrained sampling cost: llguidance tokenizer build, grammar compile, and the per-token mask.

    python -m benchmarks.bench_grammar [--model smollm2|gemma3|PATH ...] [--steps 600]

For each vocabulary (SmolLM2, 49,152 tokens; Gemma 3, 262,144 tokens): the time to build llguidance's
tokenizer from the vocabulary, to compile a JSON-schema grammar, and per generated token the time of
``GrammarSampler.apply`` on the full vocabulary (llguidance's mask computation plus the Numba pass that
bans tokens), as p50/p99 over random walks (random logits, greedy pick, restart when the grammar ends).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import machine_line  # noqa: E402

MODELS = {"smollm2": "smollm2-135m-instruct", "gemma3": "gemma3-270m"}

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email", "maxLength": 30},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 30},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "zip"],
        },
        "status": {"enum": ["active", "inactive", "banned"]},
    },
    "required": ["name", "age", "tags", "address", "status"],
}


def _ms(a: list[float]) -> str:
    x = np.array(a) * 1e3
    return f"p50 {np.percentile(x, 50):.3f} ms, p99 {np.percentile(x, 99):.3f} ms"


def bench(label: str, path: str, steps: int) -> None:
    from llamapy.grammar import LlamaGrammar
    from llamapy.grammar.tokenizer import vocab_info
    from llamapy.sampling import TokenDataArray
    from llamapy.vocab import load_vocab

    v = load_vocab(path)
    t0 = time.perf_counter()
    vocab_info(v)
    t_tok = time.perf_counter() - t0
    t0 = time.perf_counter()
    g = LlamaGrammar.from_json_schema(SCHEMA)
    smp = g.sampler(v)
    t_compile = time.perf_counter() - t0
    n = v.n_tokens
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((64, n)) * 3).astype(np.float32)
    smp.apply(TokenDataArray.from_logits(rows[0]))  # compile the Numba pass
    smp.reset()
    total, compute, apply_only = [], [], []
    done = 0
    for i in range(steps):
        cur = TokenDataArray.from_logits(rows[i % len(rows)])
        t0 = time.perf_counter()
        smp.allowed_mask()
        t1 = time.perf_counter()
        smp.apply(cur)
        t2 = time.perf_counter()
        compute.append(t1 - t0)
        apply_only.append(t2 - t1)
        total.append(t2 - t0)
        tok = int(np.argmax(cur.logits))
        if v.is_eog(tok) or smp.is_finished():
            done += 1
            smp.reset()
            continue
        smp.accept(tok)
    print(
        f"{label}: {n} tokens; tokenizer build {t_tok:.3f} s; schema compile {t_compile * 1e3:.1f} ms; "
        f"apply per token {_ms(total)} (llguidance mask {_ms(compute)}; ban pass {_ms(apply_only)}); "
        f"{steps} tokens, {done} complete objects"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", help="smollm2, gemma3 or a GGUF path (default: both)")
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    from llamapy import hub

    for m in args.model or list(MODELS):
        path = str(hub.pull(MODELS[m], quiet=True)) if m in MODELS else m
        bench(m, path, args.steps)
    print(f"machine: {machine_line()}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
