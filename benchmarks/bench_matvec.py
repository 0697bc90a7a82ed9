"""Quantized mat-vec speed vs the machine's memory read bandwidth (issue 3, section 5).

    python -m benchmarks.bench_matvec [--threads 2] [--types q4_0,q8_0] [--shapes 896x4864,...]
                                      [--tokens 1,2,4,8,16] [--matvec-max 8] [--baseline]
    python -m benchmarks.bench_matvec --decode MODEL.gguf [--tokens 1,2,4,8,16] [--baseline]

For each type and shape (rows x cols of the weight, NumPy order), times ``mul_mat(W, x)`` for one
token through the CPU backend (a reused one-node graph) and reports GB/s of weight bytes read, next
to a NumPy sum over a 500 MB array measured in the same run. Weights are random blocks (a quantized
random tile repeated), so nothing here depends on a model file. K-quant rows are whole 256-element
super-blocks: for them a shape's column count is rounded up (896 -> 1024, 640 -> 768).

With several ``--tokens`` (activation rows M, comma list) each line gives us per call for each M and
the cost relative to M = 1 (a flat small-batch kernel stays near 1x; k single-row calls would be kx).
``--matvec-max`` overrides the switch point from the in-register kernels to dequantized tiles + sgemm
(``MATVEC_MAX_TOKENS``) for this run, to compare the two paths at the same M. ``--baseline`` runs
the kernels as they were before the small-batch ones (the one-row kernels for every M up to 8, which
decode the weight again for each row; tiles + sgemm above), for before/after tables in one run.
``--decode MODEL`` times ``Context.decode`` of one batch of k tokens (after a 64-token prompt; the
batch is removed with ``seq_rm`` and decoded again, so the graph is reused; best of 15).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from llamapy.ggml import GGMLType, Graph, Scheduler, ops
from llamapy.ggml.cpu import matmul_steps
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.quants import quantize
from llamapy.ggml.types import TRAITS, row_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import machine_line  # noqa: E402

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
    ap.add_argument("--tokens", default="1", help="activation rows M, comma list")
    ap.add_argument("--matvec-max", type=int, default=None, help="override MATVEC_MAX_TOKENS")
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per case (the best run counts)")
    ap.add_argument("--baseline", action="store_true", help="the one-row kernels for every M <= 8")
    ap.add_argument("--decode", metavar="MODEL", help="time Context.decode of k tokens on this model")
    args = ap.parse_args()
    if args.baseline:
        from llamapy.ggml.cpu import matmul_kernels as mk

        mk.matvec_kernel = lambda name, m: mk.MATVEC.get(name)
        matmul_steps.MATVEC_MAX_TOKENS = 8
    if args.matvec_max is not None:
        matmul_steps.MATVEC_MAX_TOKENS = args.matvec_max
    tokens = [int(v) for v in args.tokens.split(",")]
    if args.decode:
        return main_decode(args, tokens)
    if len(tokens) > 1:
        return main_tokens(args, tokens)
    rng = np.random.default_rng(0)
    sched = Scheduler([CPUBackend(args.threads)])
    bw = bandwidth()
    print(f"machine: {machine_line()}, threads={args.threads}")
    print(f"load average: {os.getloadavg()}")
    print(f"numpy sum over 500 MB: {bw:.2f} GB/s")
    print(f"{'type':6} {'shape':>12} {'us/call':>10} {'GB/s':>7} {'% of sum':>9} {'GMAC/s':>7}")
    for tn in args.types.split(","):
        t = GGMLType[tn.upper()]
        for sh in args.shapes.split(","):
            n, k = (int(v) for v in sh.split("x"))
            if k % 256 and TRAITS[t].block_size == 256:
                k = -(-k // 256) * 256  # k-quant rows are whole 256-element super-blocks
                sh = f"{n}x{k}"
            raw = random_weight(t, n, k, rng)
            w = ops.weight("w", t, (n, k), raw)
            x = ops.new_tensor(GGMLType.F32, (tokens[0], k))
            g = Graph(ops.mul_mat(w, x))
            dt = time_graph(sched, g, {x: rng.standard_normal((tokens[0], k)).astype(np.float32)})
            gbs = n * row_size(t, k) / dt / 1e9
            print(
                f"{tn:6} {sh:>12} {dt * 1e6:10.0f} {gbs:7.2f} {100 * gbs / bw:8.0f}% "
                f"{tokens[0] * n * k / dt / 1e9:7.1f}",
                flush=True,
            )
            del raw, w, g
    print(f"numpy sum over 500 MB (again): {bandwidth():.2f} GB/s; load average: {os.getloadavg()}")


def main_tokens(args: argparse.Namespace, tokens: list[int]) -> None:
    """us per call for each M in ``tokens``, and each relative to the first."""
    rng = np.random.default_rng(0)
    sched = Scheduler([CPUBackend(args.threads)])
    print(
        f"machine: {machine_line()}, threads={args.threads}, "
        f"matvec up to M={matmul_steps.MATVEC_MAX_TOKENS}{', baseline kernels' if args.baseline else ''}"
    )
    print(f"load average: {os.getloadavg()}")
    print(f"{'type':6} {'shape':>12}  " + " ".join(f"{'M=' + str(m):>14}" for m in tokens) + "   (us, xM=1)")
    for tn in args.types.split(","):
        t = GGMLType[tn.upper()]
        for sh in args.shapes.split(","):
            n, k = (int(v) for v in sh.split("x"))
            if k % 256 and TRAITS[t].block_size == 256:
                k = -(-k // 256) * 256
                sh = f"{n}x{k}"
            raw = random_weight(t, n, k, rng)
            w = ops.weight("w", t, (n, k), raw)
            cells = []
            base = None
            for m in tokens:
                x = ops.new_tensor(GGMLType.F32, (m, k))
                g = Graph(ops.mul_mat(w, x))
                dt = time_graph(sched, g, {x: rng.standard_normal((m, k)).astype(np.float32)}, args.min_time)
                base = dt if base is None else base
                cells.append(f"{dt * 1e6:8.0f} {dt / base:4.1f}x")
                del g
            print(f"{tn:6} {sh:>12}  " + " ".join(f"{c:>14}" for c in cells), flush=True)
            del raw, w
    print(f"load average: {os.getloadavg()}")


def main_decode(args: argparse.Namespace, tokens: list[int]) -> None:
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    model = Model.load(os.path.expanduser(args.decode))
    ctx = Context(model, ContextParams(n_ctx=512, n_threads=args.threads))
    rng = np.random.default_rng(0)
    ctx.decode(Batch.from_tokens(rng.integers(0, model.n_vocab, 64), pos0=0))
    tag = "baseline" if args.baseline else "current"
    print(f"machine: {machine_line()}")
    print(f"{os.path.basename(args.decode)}: decode of k tokens, threads={args.threads}, {tag} kernels")
    print(f"load average: {os.getloadavg()}")
    for k in tokens:
        toks = rng.integers(0, model.n_vocab, k)
        best = 1e9
        for _ in range(15):
            ctx.memory.seq_rm(0, 64, -1)
            t = time.perf_counter()
            ctx.decode(Batch.from_tokens(toks, pos0=64))
            best = min(best, time.perf_counter() - t)
        print(f"k={k:3d} {best * 1e3:8.2f} ms  {best * 1e3 / k:7.2f} ms/token", flush=True)
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
