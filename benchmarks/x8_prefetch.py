"""How far ahead the 8-row kernels should prefetch their weight, on this machine: the one-row
``mm_q4_k_x8`` loop (``q4k_x8_kernels``) with the prefetch distance as an argument, against weights in
DRAM (copies in fresh huge-page memory, as ``repack`` allocates them, cycled through ~400 MB), GB/s of
weight bytes per wall second, best of 3 sweeps, every variant in each sweep (interleaved).

    python benchmarks/x8_prefetch.py [--threads 1] [--distances 0,1536,2048,3072,8192] [--l1]

Distance 0 is two row groups ahead (``rowgroups.x8_prefetch_from`` with ``pfd`` 0, the default),
``none`` no software prefetch, ``D + 2 groups`` both; ``--l1`` adds ``prefetcht0`` variants;
``--total-mb 80`` keeps the copies in a large L3. The library measures its distance per model
(``ggml/cpu/prefetch_tune.py``) unless ``LLAMAPY_X8_PREFETCH`` fixes it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import machine_line, q4k_x8_copies  # noqa: E402

SHAPES = ((8960, 1536), (1536, 8960), (1536, 1536))


def _kernel(l1: bool):  # type: ignore[no-untyped-def]
    from llamapy._numba import njit, prange
    from llamapy.ggml.cpu.hsimd import nan_rows
    from llamapy.ggml.cpu.kquant_kernels import _q8k
    from llamapy.ggml.cpu.q4k_x8_kernels import QK_K, X8_BYTES, X8_D, X8_DMIN, _x8_block, _x8_step
    from llamapy.ggml.cpu.rowgroups import prefetch_bytes, prefetch_bytes_l1
    from llamapy.ggml.cpu.simd import vstore, vzero
    from llamapy.ggml.cpu.x8simd import xh8

    pfb = prefetch_bytes_l1 if l1 else prefetch_bytes

    @njit(parallel=True)
    def mm(R, x, out, dist, both):  # type: ignore[no-untyped-def]
        G, gb = R.shape
        nb = gb // X8_BYTES
        Rf = R.reshape(-1)
        total = G * gb
        xq, xd, bs16, bs32, ok = _q8k(x)
        for grp in prange(G):
            w = R[grp]
            pf = grp * gb + (dist if dist else 2 * gb)
            for m in range(x.shape[0]):
                xqm, b32m = xq[m], bs32[m]
                acc = vzero()
                for b in range(nb):
                    t = b * X8_BYTES
                    if m == 0:
                        pfb(Rf, pf + t, X8_BYTES, total)
                        if both:
                            pfb(Rf, (grp + 2) * gb + t, X8_BYTES, total)
                    isum, msum = _x8_block(w, t, xqm, b * QK_K, b32m, b * 8)
                    acc = _x8_step(acc, xh8(w, t + X8_D), xh8(w, t + X8_DMIN), xd[m, b], isum, msum)
                vstore(out[m], grp * 8, acc)
        nan_rows(out, ok)

    return mm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--distances", default="0,1536,2048,2560,3072,8192")
    ap.add_argument("--l1", action="store_true", help="also prefetcht0 at the same distances but 0")
    ap.add_argument("--total-mb", type=float, default=400.0)
    a = ap.parse_args()

    from llamapy._numba import set_num_threads

    set_num_threads(a.threads)
    print(f"# {machine_line()}; threads {a.threads}")
    print(f"# load average {os.getloadavg()}")
    kern = {False: _kernel(False), True: _kernel(True)}
    dists = [int(d) for d in a.distances.split(",")]
    variants = [("none", False, 1 << 50, False)] + [(f"t1 {d or '2 groups'}", False, d, False) for d in dists]
    variants += [(f"t1 {d} + 2 groups", False, d, True) for d in dists if d]
    if a.l1:
        variants += [(f"t0 {d}", True, d, False) for d in dists if d]
    rng = np.random.default_rng(0)
    for n, k in SHAPES:
        R, copies, keep = q4k_x8_copies(n, k, a.total_mb, rng)
        x = rng.standard_normal((1, k)).astype(np.float32)
        out = np.empty((1, n), np.float32)
        for _, l1, d, both in variants:
            kern[l1](R, x, out, d, both)
        best = {v[0]: float("inf") for v in variants}
        for _ in range(3):
            for name, l1, d, both in variants:
                t0 = time.perf_counter()
                for c in copies:
                    kern[l1](c, x, out, d, both)
                best[name] = min(best[name], (time.perf_counter() - t0) / len(copies))
        cells = "  ".join(f"{nm} {R.nbytes / s / 1e9:.1f}" for nm, s in best.items())
        print(f"Q4_K {n}x{k} ({R.nbytes / 1e6:.1f} MB), GB/s: {cells}", flush=True)
        del copies, keep


if __name__ == "__main__":
    main()
