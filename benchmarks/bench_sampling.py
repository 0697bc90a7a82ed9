"""Sampler-chain speed on a 262,144-token vocabulary (Gemma 3's size), random logits.

Run: ``python benchmarks/bench_sampling.py``. Prints milliseconds per sampled token for common chains.
"""

from __future__ import annotations

import time

import numpy as np

from llamapy.sampling import SamplingParams, build_chain, greedy_chain

N_VOCAB = 262144


def bench(name: str, chain, rows: np.ndarray, accept: bool = True) -> None:
    chain.sample(rows[0])  # compile / warm up
    t = time.perf_counter()
    for r in rows:
        tok = chain.sample(r)
        if accept:
            chain.accept(tok)
    dt = (time.perf_counter() - t) / len(rows) * 1e3
    print(f"{name:50s} {dt:7.3f} ms/token")


def main() -> None:
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((50, N_VOCAB)) * 3).astype(np.float32)
    n = N_VOCAB
    bench("greedy_chain()", greedy_chain(), rows)
    bench("temp=0 (default chain)", build_chain(SamplingParams(temp=0, seed=1), n_vocab=n), rows)
    bench(
        "default chain (top_k 40, top_p .95, min_p .05)", build_chain(SamplingParams(seed=1), n_vocab=n), rows
    )
    bench(
        "default + penalties(1.1, last 64)",
        build_chain(SamplingParams(seed=1, penalty_repeat=1.1), n_vocab=n),
        rows,
    )
    bench("top_k=0 (full vocab top_p/min_p)", build_chain(SamplingParams(seed=1, top_k=0), n_vocab=n), rows)
    bench("mirostat 2", build_chain(SamplingParams(seed=1, mirostat=2), n_vocab=n), rows)
    bench("typical .9 + top_k 0", build_chain(SamplingParams(seed=1, typ_p=0.9, top_k=0), n_vocab=n), rows)


if __name__ == "__main__":
    main()
