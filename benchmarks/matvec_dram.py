"""One-row mat-vec rates with the weight in DRAM, per shape: each call reads a different copy of the
matrix (the copies together ~400 MB, past any cache), so the figure is what a decode step sees, not
what an L2/L3-resident benchmark sees. Reported per shape: CPU time per call (``time.process_time``,
best of 3 sweeps over the copies: robust to other processes on a shared machine) and the weight bytes
per CPU-second; with ``--wall`` the best-sweep wall time too.

    python benchmarks/matvec_dram.py [--threads 1] [--shapes Q4_K:256x1536,Q4_K:1536x1536,...] [--wall]

The default shapes are a Qwen2.5-1.5B decode step's (attention q/o, k/v, FFN gate/up, down, and the
tied 151936-row Q6_K output), to find which matrices lose the bandwidth.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import machine_line  # noqa: E402

SHAPES = "Q4_K:256x1536,Q4_K:1536x1536,Q4_K:8960x1536,Q6_K:1536x8960,Q6_K:256x1536,Q6_K:151936x1536"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default=SHAPES, help="TYPE:NxK comma list")
    ap.add_argument("--total-mb", type=float, default=400.0, help="bytes of weight copies cycled through")
    ap.add_argument("--wall", action="store_true")
    ap.add_argument(
        "--l1", action="store_true", help="also the *_l1 kernels (prefetch into L1), interleaved per sweep"
    )
    a = ap.parse_args()

    import numba

    from llamapy.ggml import GGMLType
    from llamapy.ggml.cpu import matmul_kernels as mk
    from llamapy.ggml.quants import quantize

    numba.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    print(f"# {machine_line()}; threads {a.threads}; load average {os.getloadavg()}")
    print(
        f"{'shape':22} {'MB':>8} {'CPU us/call':>12} {'GB/CPU-s':>9}"
        + (f" {'wall us':>9} {'GB/s':>6}" if a.wall else "")
    )
    for spec in a.shapes.split(","):
        t, nk = spec.split(":")
        n, k = (int(v) for v in nk.split("x"))
        kerns = {"": mk.MATVEC[t]}
        if a.l1:
            from llamapy.ggml.cpu.matmul_steps import matvec_l1

            kerns = {" t1": mk.MATVEC[t], " t0": matvec_l1(t)}
        tile_rows = min(n, 4096)
        tile = quantize(rng.standard_normal((tile_rows, k)).astype(np.float32), GGMLType[t])
        tile = np.ascontiguousarray(tile).view(np.uint8).reshape(tile_rows, -1)
        nbytes = n * tile.shape[1]
        reps = max(2, int(a.total_mb * 1e6 // nbytes))
        w = np.empty((reps, n, tile.shape[1]), np.uint8)
        for r0 in range(0, n, tile_rows):
            w[:, r0 : r0 + tile_rows] = tile[: min(tile_rows, n - r0)]
        x = rng.standard_normal((1, k)).astype(np.float32)
        out = np.empty((1, n), np.float32)
        for kern in kerns.values():
            kern(w[0], x, out, mk.F16_TABLE)
        cpu: dict[str, list[float]] = {v: [] for v in kerns}
        wall: dict[str, list[float]] = {v: [] for v in kerns}
        for _ in range(3):
            for v, kern in kerns.items():
                c, t0 = time.process_time(), time.perf_counter()
                for r in range(reps):
                    kern(w[r], x, out, mk.F16_TABLE)
                cpu[v].append((time.process_time() - c) / reps)
                wall[v].append((time.perf_counter() - t0) / reps)
        for v in kerns:
            best = min(cpu[v])
            line = f"{spec + v:22} {nbytes / 1e6:8.2f} {best * 1e6:12.1f} {nbytes / best / 1e9:9.1f}"
            if a.wall:
                line += f" {min(wall[v]) * 1e6:9.1f} {nbytes / min(wall[v]) / 1e9:6.1f}"
            print(line, flush=True)
        del w
    print(f"# load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
