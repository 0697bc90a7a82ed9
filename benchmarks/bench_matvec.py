"""Quantized mat-vec speed vs the machine's memory read bandwidth (issue 3, section 5).

    python -m benchmarks.bench_matvec [--threads 2] [--types q4_0,q8_0] [--shapes 896x4864,...]

For each type and shape (rows x cols of the weight, NumPy order), times ``mul_mat(W, x)`` for one
token through the CPU backend (a reused one-node graph) and reports GB/s of weight bytes read, next
to a NumPy sum over a 500 MB array measured in the same run. Weights are random blocks (a quantized
random tile repeated), so nothing here depends on a model file. K-quant rows are whole 256-element
super-blocks: for them a shape's column count is rounded up (896 -> 1024, 640 -> 768).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from llamapy.ggml import GGMLType, Graph, Scheduler, ops
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.quants import quantize
from llamapy.ggml.types import row_size

TYPES = ["q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q5_k", "q6_k"]
SHAPES = ["4864x896", "896x4864", "262144x640"]


def bandwidth(nbytes: int = 500_000_000, reps: int = 5) -> float:
    a = np.ones(nbytes // 8)
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def random_weight(t: GGMLType, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    tile_rows = min(n, 64)
    tile = quantize(rng.standard_normal((tile_rows, k)).astype(np.float32), t)
    reps = -(-n // tile_rows)
    return np.ascontiguousarray(np.tile(tile, (reps, 1))[:n])


def time_graph(sched: Scheduler, g: Graph, feeds: dict, min_time: float = 0.5) -> float:
    sched.compute(g, feeds)
    best = 1e9
    t_end = time.perf_counter() + min_time
    while True:
        t = time.perf_counter()
        sched.compute(g, {})
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() > t_end:
            return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    sched = Scheduler([CPUBackend(args.threads)])
    bw = bandwidth()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, threads={args.threads}"
    )
    print(f"load average: {os.getloadavg()}")
    print(f"numpy sum over 500 MB: {bw:.2f} GB/s")
    print(f"{'type':6} {'shape':>12} {'us/call':>10} {'GB/s':>7} {'% of sum':>9} {'GMAC/s':>7}")
    for tn in args.types.split(","):
        t = GGMLType[tn.upper()]
        for sh in args.shapes.split(","):
            n, k = (int(v) for v in sh.split("x"))
            if k % 256 and t.name.endswith("_K"):
                k = -(-k // 256) * 256  # k-quant rows are whole 256-element super-blocks
                sh = f"{n}x{k}"
            raw = random_weight(t, n, k, rng)
            w = ops.weight("w", t, (n, k), raw)
            x = ops.new_tensor(GGMLType.F32, (args.tokens, k))
            g = Graph(ops.mul_mat(w, x))
            dt = time_graph(sched, g, {x: rng.standard_normal((args.tokens, k)).astype(np.float32)})
            gbs = n * row_size(t, k) / dt / 1e9
            print(
                f"{tn:6} {sh:>12} {dt * 1e6:10.0f} {gbs:7.2f} {100 * gbs / bw:8.0f}% "
                f"{args.tokens * n * k / dt / 1e9:7.1f}",
                flush=True,
            )
            del raw, w, g
    print(f"numpy sum over 500 MB (again): {bandwidth():.2f} GB/s; load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
