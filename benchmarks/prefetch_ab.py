"""Decode CPU time per token with the weight prefetched into L1 (the ``*_l1`` kernels) against into L2,
interleaved in one process: two contexts on one loaded model, one token each in turn, so both see the
same machine load (``time.process_time``, median per variant).

    python benchmarks/prefetch_ab.py MODEL.gguf [--threads 2] [--tokens 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import machine_line  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.ggml.cpu import matmul_steps as ms
    from llamapy.model import Model

    path = os.path.expanduser(a.model)
    print(f"# {machine_line()}; threads {a.threads}; load average {os.getloadavg()}")
    model = Model.load(path)
    variants = {"L1 (t0)": 1 << 60, "L2 (t1)": 0}
    ctxs, per = {}, {}
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.n_vocab, 8)
    for name, limit in variants.items():
        ms.L1_PREFETCH_MAX_BYTES = limit
        ctxs[name] = Context(model, ContextParams(n_ctx=512, n_threads=a.threads))
        ctxs[name].decode(Batch.from_tokens(prompt, pos0=0))
        per[name] = []
    for i in range(a.tokens):
        tok = int(rng.integers(0, model.n_vocab))
        for name, limit in variants.items():
            ms.L1_PREFETCH_MAX_BYTES = limit
            c = time.process_time()
            ctxs[name].decode(Batch.from_tokens([tok], pos0=8 + i))
            per[name].append(time.process_time() - c)
    size = os.path.getsize(path)
    for name, ts in per.items():
        m = statistics.median(ts[2:])
        print(f"{name}: {m * 1e3:7.2f} CPU ms/token ({size / m / 1e9:5.1f} GB per CPU-second)")
    print(f"# load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
