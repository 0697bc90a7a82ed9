"""Per-node Python overhead of a reused graph, and the planner's activation memory (issue 3, section 5).

    python -m benchmarks.bench_graph [--threads 2] [--nodes 2000]

Builds a chain of small ops on a [1, 64] activation (add, mul, scale, rms_norm, silu, a tiny Q8_0
mat-vec), computes it once (plan + compile), then times reused computes: (time per compute) / nodes
is the overhead a step adds around its kernel. The first line runs a chain of pure NumPy steps
(add/mul/scale), the second one of Numba kernels (rms_norm, silu, mat-vec).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from llamapy.ggml import GGMLType, Graph, Scheduler, ops
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.quants import quantize


def timed(sched: Scheduler, g: Graph, feeds: dict, reps: int = 20) -> float:
    sched.compute(g, feeds)
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter()
        sched.compute(g, {})
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument(
        "--model",
        default="",
        help="also report the plans of a real model's graphs (e.g. smollm2-135m-instruct)",
    )
    args = ap.parse_args()
    if args.model:
        model_plans(args.model, args.threads)
    rng = np.random.default_rng(0)
    sched = Scheduler([CPUBackend(args.threads)])
    print(f"threads={args.threads}, load average: {os.getloadavg()}")
    x = ops.new_tensor(GGMLType.F32, (1, 64), "x")
    c = ops.weight("c", GGMLType.F32, (64,), rng.standard_normal(64).astype(np.float32))
    # pure NumPy steps
    h = x
    for _ in range(args.nodes // 3):
        h = ops.scale(ops.mul(ops.add(h, x), c), 0.25)
    g = Graph(h)
    t = timed(sched, g, {x: rng.standard_normal((1, 64)).astype(np.float32)})
    plan = sched.plan(g)
    print(f"numpy-op chain: {len(g)} nodes, {t * 1e3:.2f} ms/compute, {t / len(g) * 1e6:.2f} us/node; {plan}")
    # Numba kernel steps
    wq = ops.weight(
        "w",
        GGMLType.Q8_0,
        (64, 64),
        quantize(rng.standard_normal((64, 64)).astype(np.float32), GGMLType.Q8_0),
    )
    h = x
    for _ in range(args.nodes // 3):
        h = ops.mul_mat(wq, ops.silu(ops.rms_norm(h, 1e-6)))
    g = Graph(h)
    t = timed(sched, g, {x: rng.standard_normal((1, 64)).astype(np.float32)})
    plan = sched.plan(g)
    print(
        f"numba-kernel chain: {len(g)} nodes, {t * 1e3:.2f} ms/compute, {t / len(g) * 1e6:.2f} us/node; {plan}"
    )
    # views are free (no step)
    h = x
    for _ in range(args.nodes):
        h = ops.reshape(h, (64, 1) if h.shape == (1, 64) else (1, 64))
    g = Graph(ops.scale(h, 1.0))
    t = timed(sched, g, {x: np.zeros((1, 64), np.float32)})
    print(f"view chain + 1 op: {len(g)} nodes, {t * 1e6:.1f} us/compute")


def model_plans(name: str, threads: int) -> None:
    """Planned activation memory of a real model's prompt (3 tokens) and decode (1 token) graphs."""
    from llamapy import hub
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    ctx = Context(Model.load(hub.pull(name, quiet=True)), ContextParams(n_ctx=1024, n_threads=threads))
    seen: list[tuple[Scheduler, Graph]] = []
    orig = Scheduler.compute

    def spy(self: Scheduler, g: Graph, inputs: dict | None = None) -> None:
        seen.append((self, g))
        orig(self, g, inputs)

    Scheduler.compute = spy  # type: ignore[method-assign]
    try:
        ctx.decode(Batch.from_tokens([1, 2, 3]))
        ctx.decode(Batch.from_tokens([4], pos0=3))
    finally:
        Scheduler.compute = orig  # type: ignore[method-assign]
    for (s, g), what in zip(seen, ("prompt (3 tokens)", "decode (1 token)"), strict=False):
        p = s.plan(g)
        print(
            f"{name} {what}: {len(g)} nodes; planned {p.size / 1e6:.2f} MB, {p.naive_size / 1e6:.2f} MB without reuse"
        )


if __name__ == "__main__":
    main()
