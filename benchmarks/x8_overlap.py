"""Where the Q4_K 8-row decode kernel loses the bandwidth: ``mm_q4_k_x8``'s loop (``q4k_x8_kernels``)
against the same loop with its arithmetic taken out, and against other ways of prefetching the weight,
weights in DRAM (copies in fresh huge-page memory, as ``repack`` allocates them, cycled through
``--total-mb``), GB/s of weight bytes per wall second, best of ``--sweeps`` sweeps, every variant in each
sweep (interleaved).

    python benchmarks/x8_overlap.py [--threads 2] [--shapes 8192x3072,3072x3072] [--total-mb 600]

Variants (``name:distance``, distance in bytes ahead of the block being read):

- ``cur``: the library's loop: the block's 19 lines prefetched (``prefetcht1``) at the block's start;
- ``bare``: the same loop and prefetches, the arithmetic replaced by a sum of one 8-byte word per 64-byte
  line (every line is read: what the memory gives this access pattern);
- ``spread``: a quarter of the block's lines before each of its four chunks;
- ``sparse``: every second line only (leaving the rest to the hardware prefetcher);
- ``l1``: ``cur`` plus a ``prefetcht0`` of the block one block ahead (two-level).

``--in-cache`` uses a 512-row weight (0.9 MB, two copies): the arithmetic's own rate. Every variant's
output is checked equal to ``mm_q4_k_x8``'s (``bare``: not computed). ``results/stop54_x8_overlap.md``
has a run on the Intel VM.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = "cur:2048,bare:2048,spread:2048,sparse:2048,l1:2048,cur:0"
MODES = {"cur": 0, "spread": 1, "sparse": 2, "l1": 3, "bare": 4}


def kernel() -> Any:
    """The compiled variant loop ``mm(R, x, out, dist, mode)`` (``MODES``; ``dist`` 0: two groups)."""
    from llamapy._numba import njit, prange
    from llamapy.ggml.cpu.hsimd import nan_rows
    from llamapy.ggml.cpu.isimd import bnib, izero
    from llamapy.ggml.cpu.kquant_kernels import _q8k
    from llamapy.ggml.cpu.q4k_x8_kernels import (
        QK_K,
        X8_BYTES,
        X8_D,
        X8_DMIN,
        X8_QS,
        X8_SC,
        _x8_block,
        _x8_mins,
        _x8_step,
    )
    from llamapy.ggml.cpu.rowgroups import prefetch_bytes, x8_prefetch_from
    from llamapy.ggml.cpu.simd import prefetch, prefetch_l1, vstore, vzero
    from llamapy.ggml.cpu.x8simd import xadd16, xbcast4, xh8, xmaddubs, xscale, xzero16

    @njit(inline="always")
    def spread_block(w, t, xq, x0, b32, bb, Rf, p, total):  # type: ignore[no-untyped-def]
        """``q4k_x8_kernels._x8_block`` (its loop copied: the library has no hook between the chunks) with
        5 lines from ``p`` prefetched before each of the four chunks: the ``spread`` variant."""
        isum = izero()
        for c in range(4):
            if p + 1280 <= total:
                for k in range(5):
                    prefetch(Rf, p + 320 * c + 64 * k)
            slo = xzero16()
            shi = xzero16()
            for g in range(8):
                q = t + X8_QS + 256 * c + 32 * g
                slo = xadd16(slo, xmaddubs(bnib(w, q, False), xbcast4(xq, x0 + 64 * c + 4 * g)))
                shi = xadd16(shi, xmaddubs(bnib(w, q, True), xbcast4(xq, x0 + 64 * c + 32 + 4 * g)))
            isum = xscale(isum, slo, w, t + X8_SC + 16 * c)
            isum = xscale(isum, shi, w, t + X8_SC + 16 * c + 8)
        return isum, _x8_mins(w, t, b32, bb)

    @njit(parallel=True)
    def mm(R, x, out, dist, mode):  # type: ignore[no-untyped-def]
        G, gb = R.shape
        nb = gb // X8_BYTES
        Rf = R.reshape(-1)
        R64 = R.view(np.uint64)
        total = G * gb
        xq, xd, bs16, bs32, ok = _q8k(x)
        for grp in prange(G):
            w = R[grp]
            pf = x8_prefetch_from(grp, gb, dist)
            xqm, b32m = xq[0], bs32[0]
            acc = vzero()
            s = np.uint64(0)
            for b in range(nb):
                t = b * X8_BYTES
                if mode == 1:
                    isum, msum = spread_block(w, t, xqm, b * QK_K, b32m, b * 8, Rf, pf + t, total)
                else:
                    if mode == 2:
                        if pf + t + X8_BYTES <= total:
                            for c in range(0, X8_BYTES, 128):
                                prefetch(Rf, pf + t + c)
                    else:
                        prefetch_bytes(Rf, pf + t, X8_BYTES, total)
                    if mode == 3 and grp * gb + t + 2 * X8_BYTES <= total:
                        for c in range(0, X8_BYTES, 64):
                            prefetch_l1(Rf, grp * gb + t + X8_BYTES + c)
                    if mode == 4:
                        for i in range(t // 8, (t + X8_BYTES) // 8, 8):  # a word of every line
                            s += R64[grp, i]
                        continue
                    isum, msum = _x8_block(w, t, xqm, b * QK_K, b32m, b * 8)
                acc = _x8_step(acc, xh8(w, t + X8_D), xh8(w, t + X8_DMIN), xd[0, b], isum, msum)
            if mode == 4:
                out[0, grp * 8] = np.float32(s & np.uint64(1))
            else:
                vstore(out[0], grp * 8, acc)
        nan_rows(out, ok)

    return mm


def run(
    shapes: list[tuple[int, int]], variants: list[tuple[str, int]], total_mb: float, sweeps: int
) -> list[str]:
    """One line per shape: each variant's GB/s (best sweep)."""
    from benchmarks.harness import q4k_x8_copies
    from llamapy.ggml.cpu import q4k_x8_kernels as qk

    mm = kernel()
    rng = np.random.default_rng(0)
    lines = []
    for n, k in shapes:
        R, copies, keep = q4k_x8_copies(n, k, total_mb, rng)
        x = rng.standard_normal((1, k)).astype(np.float32)
        ref = np.empty((1, n), np.float32)
        qk.mm_q4_k_x8(R, x, ref, 2048)
        out = np.empty((1, n), np.float32)
        for name, d in variants:
            mm(R, x, out, d, MODES[name])
            if name != "bare" and not np.array_equal(out, ref):
                raise AssertionError(f"{name}:{d} differs from mm_q4_k_x8")
        best = {v: float("inf") for v in variants}
        for _ in range(sweeps):
            for name, d in variants:
                t0 = time.perf_counter()
                for c in copies:
                    mm(c, x, out, d, MODES[name])
                best[(name, d)] = min(best[(name, d)], (time.perf_counter() - t0) / len(copies))
        cells = "  ".join(f"{nm}:{d} {R.nbytes / s / 1e9:.1f}" for (nm, d), s in best.items())
        lines.append(f"Q4_K {n}x{k} ({R.nbytes / 1e6:.1f} MB, {len(copies)} copies), GB/s: {cells}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="8192x3072,3072x3072", help="NxK comma list")
    ap.add_argument("--variants", default=VARIANTS, help=f"name:distance comma list of {sorted(MODES)}")
    ap.add_argument("--total-mb", type=float, default=600.0)
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--in-cache", action="store_true", help="a 512-row weight, two copies (0.9 MB at K=3072)")
    a = ap.parse_args(argv)

    from benchmarks.harness import machine_line
    from llamapy._numba import set_num_threads

    set_num_threads(a.threads)
    shapes = [(int(n), int(k)) for n, k in (s.split("x") for s in a.shapes.split(","))]
    variants = [(v.split(":")[0], int(v.split(":")[1])) for v in a.variants.split(",")]
    bad = [v for v, _ in variants if v not in MODES]
    if bad:
        print(f"error: unknown variant {bad[0]!r} (one of {', '.join(sorted(MODES))})", file=sys.stderr)
        return 1
    if a.in_cache:
        shapes, total = [(512, k) for _, k in shapes[:1]], 0.0
    else:
        total = a.total_mb
    print(f"# {machine_line()}; threads {a.threads}; load average {os.getloadavg()}")
    for line in run(shapes, variants, total, a.sweeps):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
