"""One ``mul_mat_id`` of a Qwen3-30B-A3B layer (8 of 128 experts, 768x2048 Q4_K), the fused experts kernel
(``cpu.moe_kernels``) against the per-expert loop it replaced (argsort/unique + one mat-vec kernel call per
expert), and the fused kernel on the experts repacked 8 rows at a time (``cpu.moe_x8_kernels``): CPU and
wall ms per call, interleaved. Results: ``benchmarks/results/moe_cputime.md``, ``moe_x8.md``.

    python benchmarks/bench_moe.py [THREADS]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamapy.ggml import GGMLType  # noqa: E402
from llamapy.ggml.cpu.matmul_kernels import F16_TABLE, MATVEC  # noqa: E402
from llamapy.ggml.cpu.moe_kernels import MOE  # noqa: E402
from llamapy.ggml.cpu.moe_x8_kernels import moe_q4_k_x8  # noqa: E402
from llamapy.ggml.cpu.q4k_x8 import repack  # noqa: E402
from llamapy.ggml.quants import quantize  # noqa: E402

E, N, K, USED = 128, 768, 2048, 8


def main() -> None:
    numba.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    rng = np.random.default_rng(0)
    tile = quantize(rng.standard_normal((64, K)).astype(np.float32), GGMLType.Q4_K)
    w = np.tile(tile, (E * N // 64, 1)).reshape(E, N, -1).copy()
    x = rng.standard_normal((1, 1, K)).astype(np.float32)
    out = np.empty((USED, N), np.float32)
    mv, moe = MATVEC["Q4_K"], MOE["Q4_K"]
    R = repack(w)

    def loop(ids: np.ndarray) -> None:
        flat = ids.reshape(-1)
        order = np.argsort(flat, kind="stable")
        experts, _ = np.unique(flat[order], return_index=True)
        for e in experts:
            y = np.empty((1, N), np.float32)
            mv(w[e], np.ascontiguousarray(x[0]), y, F16_TABLE)

    def fused(ids: np.ndarray) -> None:
        moe(w, x, ids, out, F16_TABLE, 128)

    def fused_x8(ids: np.ndarray) -> None:
        moe_q4_k_x8(R, x, ids, out, 128, numba.get_num_threads(), 0)

    idss = [rng.choice(E, USED, replace=False).astype(np.int32).reshape(1, USED) for _ in range(200)]
    for f in (loop, fused, fused_x8):
        f(idss[0])
    for _ in range(3):
        for f in (loop, fused, fused_x8):
            c, wt = time.process_time(), time.perf_counter()
            for ids in idss:
                f(ids)
            cpu, wall = (time.process_time() - c) / len(idss), (time.perf_counter() - wt) / len(idss)
            print(f"{f.__name__:8s}: {1000 * cpu:.3f} CPU ms, {1000 * wall:.3f} wall ms per mul_mat_id")


if __name__ == "__main__":
    main()
