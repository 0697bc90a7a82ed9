"""Where the in-register mat-vec kernels stop beating dequantized tiles + sgemm, per type: CPU time
(``time.process_time``, robust to other processes on a shared machine) of one ``mul_mat`` with M
activation rows through each path (``backend.matvec_max_rows`` picks the switch point from this).

    python benchmarks/matvec_rows.py THREADS TYPES SHAPES MS
    python benchmarks/matvec_rows.py 1 q4_k,q6_k 1536x1536,8960x1536 32,64,128,512
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
from llamapy.ggml.cpu import matmul_steps  # noqa: E402
from llamapy.ggml.cpu.backend import CPUBackend  # noqa: E402

rng = np.random.default_rng(0)
sched = Scheduler([CPUBackend(int(sys.argv[1]))])
types = sys.argv[2].split(",")
shapes = sys.argv[3].split(",")
Ms = [int(v) for v in sys.argv[4].split(",")]


def cpu_time(g, feed, reps=3):
    sched.compute(g, feed)  # warm (compile)
    best = 1e9
    for _ in range(reps):
        t = time.process_time()
        sched.compute(g, feed)
        best = min(best, time.process_time() - t)
    return best


print(machine_line(), "load", os.getloadavg())
for tn in types:
    t = GGMLType[tn.upper()]
    for sh in shapes:
        n, k = (int(v) for v in sh.split("x"))
        raw = random_weight(t, n, k, rng)
        w = ops.weight("w", t, (n, k), raw)
        row = []
        for m in Ms:
            x = ops.new_tensor(GGMLType.F32, (m, k))
            feed = {x: rng.standard_normal((m, k)).astype(np.float32)}
            res = []
            for mx in (0, 100000):  # 0: tiles for every M > 1 (the per-type table is a max with it)
                matmul_steps.MATVEC_MAX_TOKENS = mx
                matmul_steps.matvec_max_rows = lambda name, d: d
                g = Graph(ops.mul_mat(w, x))
                res.append(cpu_time(g, feed))
            row.append(
                f"M={m}: tiles {res[0] * 1e3:7.1f} ms batch {res[1] * 1e3:7.1f} ms ({res[0] / res[1]:.2f}x)"
            )
        print(tn, sh, " | ".join(row), flush=True)
print("load", os.getloadavg())
