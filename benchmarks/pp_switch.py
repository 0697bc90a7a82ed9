"""CPU time of one ``mul_mat`` through each prompt path, per type, shape and row count: the in-register
batch kernels (``backend.MATVEC_MAX_ROWS`` raised past M; Q4_K: the repacked ``q4k_x8`` kernel) against
dequantized tiles + sgemm (the limit set to 0). Unlike ``matvec_rows.py`` it patches the table itself, so
the repacked kernels' own switches are measured too.

    python benchmarks/pp_switch.py THREADS TYPES SHAPES MS
    python benchmarks/pp_switch.py 1 q4_k,q6_k,q8_0 8960x1536,1536x8960 64,256,512

``PP_TILE_FLOATS=N`` sets the tile size (floats) of the tile path; ``PP_PATHS`` the paths measured (of
tiles, batch, table; default tiles,batch; the ratio is the first's time over the last's).
"""

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_matvec import random_weight  # noqa: E402
from benchmarks.harness import machine_line  # noqa: E402
from llamapy.ggml import GGMLType, Graph, Scheduler, ops  # noqa: E402
from llamapy.ggml.cpu import backend, matmul_steps  # noqa: E402
from llamapy.ggml.cpu.backend import CPUBackend  # noqa: E402


def cpu_time(sched: Scheduler, g: Graph, feed: dict, reps: int = 3) -> float:
    sched.compute(g, feed)  # warm (compile)
    best = 1e9
    for _ in range(reps):
        t = time.process_time()
        sched.compute(g, feed)
        best = min(best, time.process_time() - t)
    return best


def main() -> None:
    rng = np.random.default_rng(0)
    sched = Scheduler([CPUBackend(int(sys.argv[1]))])
    types = sys.argv[2].split(",")
    shapes = sys.argv[3].split(",")
    ms = [int(v) for v in sys.argv[4].split(",")]
    print(machine_line(), "load", os.getloadavg())
    matmul_steps.MATVEC_MAX_TOKENS = 0
    if os.environ.get("PP_TILE_FLOATS"):
        matmul_steps.TILE_FLOATS = backend.TILE_FLOATS = int(os.environ["PP_TILE_FLOATS"])
    paths = os.environ.get("PP_PATHS", "tiles,batch").split(",")
    limits = dict(backend.MATVEC_MAX_ROWS)
    for tn in types:
        t = GGMLType[tn.upper()]
        for sh in shapes:
            n, k = (int(v) for v in sh.split("x"))
            w = ops.weight("w", t, (n, k), random_weight(t, n, k, rng))
            row = []
            for m in ms:
                x = ops.new_tensor(GGMLType.F32, (m, k))
                feed = {x: rng.standard_normal((m, k)).astype(np.float32)}
                res = []
                for path in paths:
                    # tiles: every M > 0; batch: one call for any M; table: the limit of backend.MATVEC_MAX_ROWS
                    backend.MATVEC_MAX_ROWS[t.name] = {"tiles": 0, "batch": 1 << 20}.get(
                        path, limits.get(t.name, 0)
                    )
                    res.append(cpu_time(sched, Graph(ops.mul_mat(w, x)), feed))
                gmac = m * n * k / 1e9
                cells = [
                    f"{p} {r * 1e3:.1f} ms ({gmac / r:.0f} GMAC/s)" for p, r in zip(paths, res, strict=True)
                ]
                row.append(f"M={m}: " + " ".join(cells) + f" {res[0] / res[-1]:.2f}x")
            print(tn, sh, " | ".join(row), flush=True)
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
