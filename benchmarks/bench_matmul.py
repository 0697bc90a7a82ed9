"""Large-batch (prompt) mul_mat speed vs NumPy's float32 matmul on the same shape (issue 3, section 5).

    python -m benchmarks.bench_matmul [--threads 2] [--tokens 512] [--types q4_0,...] [--shapes 4864x896,...]

``mul_mat(W, x)`` with ``x: float32[tokens, K]`` through the CPU backend (dequantize a tile of W into
a reused scratch buffer, then BLAS sgemm), dequantization included, against ``x @ Wf.T`` with a
float32 copy of W prepared in advance (run with OpenBLAS's own thread pool at ``--threads``; llamapy
runs one-thread sgemm calls inside Numba's pool). Reports GFLOP/s (2*M*N*K / time) and the ratio.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from llamapy.ggml import GGMLType, Graph, Scheduler, ops
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.cpu.blas import set_blas_threads
from llamapy.ggml.quants import dequantize

from .bench_matvec import random_weight

TYPES = ["q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q5_k", "q6_k"]
SHAPES = ["4864x896", "896x4864", "1536x576"]


def best_of(fn, reps: int = 10) -> float:
    fn()
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    sched = Scheduler([CPUBackend(args.threads)])
    print(f"threads={args.threads}, tokens={args.tokens}, load average: {os.getloadavg()}")
    print(
        f"{'type':6} {'shape':>10} {'ms':>8} {'GFLOP/s':>8} {'numpy f32 ms':>13} {'GFLOP/s':>8} {'ratio':>6}"
    )
    for tn in args.types.split(","):
        t = GGMLType[tn.upper()]
        for sh in args.shapes.split(","):
            n, k = (int(v) for v in sh.split("x"))
            if k % 256 and t.name.endswith("_K"):
                print(f"{tn:6} {sh:>10}  (skipped: K={k} is not a multiple of 256)")
                continue
            raw = random_weight(t, n, k, rng)
            wf = np.ascontiguousarray(dequantize(raw, t))
            xv = rng.standard_normal((args.tokens, k)).astype(np.float32)
            w = ops.weight("w", t, (n, k), raw)
            x = ops.new_tensor(GGMLType.F32, (args.tokens, k))
            g = Graph(ops.mul_mat(w, x))
            sched.compute(g, {x: xv})
            dt = best_of(lambda g=g: sched.compute(g, {}))
            out = np.empty((args.tokens, n), np.float32)
            set_blas_threads(args.threads)  # the reference: NumPy's matmul on OpenBLAS's own threads
            dn = best_of(lambda wf=wf, xv=xv, out=out: np.matmul(xv, wf.T, out=out))
            set_blas_threads(1)
            fl = 2.0 * args.tokens * n * k
            print(
                f"{tn:6} {sh:>10} {dt * 1e3:8.2f} {fl / dt / 1e9:8.1f} {dn * 1e3:13.2f} {fl / dn / 1e9:8.1f} {dn / dt:6.2f}"
            )


if __name__ == "__main__":
    main()
