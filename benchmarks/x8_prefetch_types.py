"""Which prefetch distance and cache level each weight type's 8-row decode kernel wants, on this machine:
the library's one-row kernels (``mm_<type>_x8``) at each distance (``prefetch_tune``: 0 two row groups
ahead; a byte count into L2, ``prefetcht1``; negative into L1, ``prefetcht0``), weights in DRAM (copies
in fresh huge-page memory, as ``repack`` allocates them, cycled through ``--total-mb``), GB/s of weight
bytes per wall second, best of ``--sweeps`` sweeps, every distance in each sweep (interleaved). Every
distance's output is checked equal to the one at 0 bit for bit. ``D/1``: distance ``D`` with one stream a
thread (the kernels' ``nth`` 0: one row group after the other; ``prefetch_tune.ONE_STREAM``), where ``D``
alone is two streams a thread (``rowgroups.x8_rows``).

    python benchmarks/x8_prefetch_types.py [--types Q4_0,Q5_0,Q8_0,Q4_K,Q5_K,Q6_K] [--threads 2]
        [--shapes 4864x896,2048x2048,3072x8192] [--distances 2048,-2048,0,0/1] [--sweeps 9]

Run it with the target the comparison uses (``NUMBA_CPU_NAME=haswell`` and its features for AVX2).
``results/stop55_prefetch_l1.md`` has a run on the Intel VM.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TYPES = "Q4_0,Q5_0,Q8_0,Q4_K,Q5_K,Q6_K"
#: type -> (module with ``repack``, kernel module, one-row kernel name)
KERNELS = {
    "Q4_0": ("q40_x8", "q40_x8_kernels", "mm_q4_0_x8"),
    "Q4_1": ("q40_x8", "q40_x8_kernels", "mm_q4_1_x8"),
    "Q5_0": ("q50_x8", "q50_x8_kernels", "mm_q5_0_x8"),
    "Q5_1": ("q50_x8", "q50_x8_kernels", "mm_q5_1_x8"),
    "Q8_0": ("q80_x8", "q80_x8_kernels", "mm_q8_0_x8"),
    "Q4_K": ("q4k_x8", "q4k_x8_kernels", "mm_q4_k_x8"),
    "Q5_K": ("q5k_x8", "q5k_x8_kernels", "mm_q5_k_x8"),
    "Q6_K": ("q6k_x8", "q6k_x8_kernels", "mm_q6_k_x8"),
}


def parse_distance(s: str) -> tuple[int, int]:
    """``"D"`` -> (D, 2 streams a thread); ``"D/1"`` -> (D, 1)."""
    d, _, streams = s.strip().partition("/")
    if streams not in ("", "1", "2"):
        raise ValueError(s)
    return int(d), int(streams or 2)


def run(types: list[str], shapes: list[tuple[int, int]], distances: list[str], total_mb: float,
        sweeps: int, threads: int = 2) -> list[str]:  # fmt: skip
    """One line per type and shape: each distance's GB/s (best sweep); ``distances`` as ``parse_distance``."""
    import importlib

    from benchmarks.harness import huge_copies
    from llamapy.ggml import GGMLType
    from llamapy.ggml.quants import quantize
    from llamapy.ggml.types import TRAITS

    rng = np.random.default_rng(0)
    lines = []
    for tn in types:
        rep_mod, kern_mod, kern_name = KERNELS[tn]
        repack = importlib.import_module(f"llamapy.ggml.cpu.{rep_mod}").repack
        kern = getattr(importlib.import_module(f"llamapy.ggml.cpu.{kern_mod}"), kern_name)
        t = GGMLType[tn]
        blk = TRAITS[t].block_size
        for n, k in shapes:
            if k % blk:
                lines.append(f"{tn} {n}x{k}: skipped (K not a multiple of {blk})")
                continue
            A = np.asarray(quantize(rng.standard_normal((n, k)).astype(np.float32), t)).reshape(n, -1)
            R = repack(np.ascontiguousarray(A.view(np.uint8)), t)
            copies, keep = huge_copies(R, total_mb)
            x = rng.standard_normal((1, k)).astype(np.float32)
            ref = np.empty((1, n), np.float32)
            kern(R, x, ref, 0)
            out = np.empty((1, n), np.float32)
            args = {
                s: (d, threads if streams == 2 else 0)
                for s in distances
                for d, streams in [parse_distance(s)]
            }
            for s, (d, nth) in args.items():
                kern(R, x, out, d, nth)
                if not np.array_equal(out.view(np.uint32), ref.view(np.uint32)):
                    raise AssertionError(f"{tn} at distance {s} differs from distance 0")
            best = dict.fromkeys(distances, float("inf"))
            for _ in range(sweeps):
                for s, (d, nth) in args.items():
                    t0 = time.perf_counter()
                    for c in copies:
                        kern(c, x, out, d, nth)
                    best[s] = min(best[s], (time.perf_counter() - t0) / len(copies))
            cells = "  ".join(f"{d}: {R.nbytes / s / 1e9:.1f}" for d, s in best.items())
            lines.append(f"{tn} {n}x{k} ({R.nbytes / 1e6:.1f} MB, {len(copies)} copies), GB/s: {cells}")
            del copies, keep
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default=TYPES, help=f"comma list of {', '.join(KERNELS)}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--shapes",
        default="4864x896,2048x2048,3072x8192",
        help="NxK comma list (a type skips a K its blocks do not divide)",
    )
    ap.add_argument(
        "--distances",
        default="2048,-2048,0,0/1",
        help="bytes ahead; negative: into L1; 0: two groups; D/1: one stream a thread",
    )
    ap.add_argument("--total-mb", type=float, default=400.0)
    ap.add_argument("--sweeps", type=int, default=9)
    a = ap.parse_args(argv)
    types = [t.strip().upper() for t in a.types.split(",") if t.strip()]
    bad = [t for t in types if t not in KERNELS]
    if bad:
        print(f"error: --types: unknown type {bad[0]!r} (one of {', '.join(KERNELS)})", file=sys.stderr)
        return 1
    try:
        shapes = [(int(n), int(k)) for n, k in (s.split("x") for s in a.shapes.split(","))]
        distances = [s.strip() for s in a.distances.split(",")]
        for s in distances:
            parse_distance(s)
    except ValueError:
        print("error: --shapes must be NxK,... and --distances integers (D/1: one stream)", file=sys.stderr)
        return 1
    if any(n % 8 or k % 32 or n <= 0 or k <= 0 for n, k in shapes):
        print("error: --shapes: N must be a multiple of 8 and K of 32", file=sys.stderr)
        return 1

    from benchmarks.harness import machine_line
    from llamapy._numba import set_num_threads

    set_num_threads(a.threads)
    print(f"# {machine_line()}; threads {a.threads}; load average {os.getloadavg()}")
    for line in run(types, shapes, distances, a.total_mb, a.sweeps, a.threads):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
