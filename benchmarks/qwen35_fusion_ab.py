"""Qwen3.5 decode with the recurrent layers' fused CPU steps (``ssm_steps.FUSE``: ``silu(ssm_conv)`` one
step, the delta rule's q/k/v/decay/beta made by its own step) against op by op, interleaved in one process
(two contexts on one model); CPU time per token (load-robust on a shared machine).

    python benchmarks/qwen35_fusion_ab.py FILE.gguf [--rounds 8] [--tokens 8] [--threads 1]
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
from llamapy.batch import Batch  # noqa: E402
from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.ggml.cpu import ssm_steps  # noqa: E402
from llamapy.model import Model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=8, help="decode steps per mode per round")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    print(f"# {machine_line()}; load average {os.getloadavg()}")
    m = Model.load(os.path.expanduser(a.model))
    rng = np.random.default_rng(0)
    ctxs, pos = {}, {}
    for mode in ("op-by-op", "fused"):
        ssm_steps.FUSE = mode == "fused"  # read when a graph's plan is built (the first decode of a shape)
        ctxs[mode] = Context(m, ContextParams(n_ctx=1024, n_threads=a.threads))
        ctxs[mode].decode(Batch.from_tokens(rng.integers(0, m.n_vocab, 8), pos0=0))
        ctxs[mode].decode(Batch.from_tokens([int(rng.integers(0, m.n_vocab))], pos0=8))
        pos[mode] = 9
    res: dict[str, list[float]] = {k: [] for k in ctxs}
    for r in range(a.rounds):
        for mode in ("op-by-op", "fused") if r % 2 == 0 else ("fused", "op-by-op"):
            ssm_steps.FUSE = mode == "fused"
            for _ in range(a.tokens):
                tok = int(rng.integers(0, m.n_vocab))
                c = time.process_time()
                ctxs[mode].decode(Batch.from_tokens([tok], pos0=pos[mode]))
                res[mode].append(time.process_time() - c)
                pos[mode] += 1
    for k, v in res.items():
        med, lo = statistics.median(v) * 1e3, min(v) * 1e3
        print(f"{k:9s}: median {med:6.2f}  min {lo:6.2f} CPU ms/token over {len(v)}")
    print(f"# load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
