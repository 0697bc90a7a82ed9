"""Where a decode step's mat-vec time goes, per weight matrix kind: each ``mul_mat`` step of one-token
decodes is timed (``time.process_time``: CPU seconds, robust to other processes on a shared machine;
``time.perf_counter``: wall) and grouped by (type, rows x cols, kernel). Per group: calls per token, MB per
token, CPU ms per token, share of the mat-vec CPU time, GB per CPU-second and GB/s wall; then the
streaming read rate measured the same way (``harness.read_bandwidth``-like loop, CPU and wall).

    python benchmarks/decode_kernels.py MODEL.gguf [--threads 1] [--tokens 16]

At 2 threads CPU time counts the OpenMP threads' spinning too (run with ``OMP_WAIT_POLICY=PASSIVE`` on a
busy machine); 1 thread is the cleanest per-kernel figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import machine_line, read_kernel  # noqa: E402


def read_rate(threads: int, mib: int = 512, reps: int = 5) -> tuple[float, float]:
    """(GB per CPU-second, GB/s wall) of a parallel streaming read with wide accumulators and a
    prefetch (``harness.read_kernel``), best of ``reps``."""
    from llamapy._numba import set_num_threads

    _read = read_kernel(8)
    set_num_threads(threads)
    a = np.ones((mib * 2**20 // 256, 64), dtype=np.float32)
    _read(a[:64])
    cpu, wall = [], []
    for _ in range(reps):
        c, t = time.process_time(), time.perf_counter()
        _read(a)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - t)
    return a.nbytes / min(cpu) / 1e9, a.nbytes / min(wall) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    a = ap.parse_args()

    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.ggml.cpu import backend as cb
    from llamapy.ggml.cpu import matmul_steps  # noqa: F401  (registers mul_mat)
    from llamapy.model import Model

    stats: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0])
    on = [False]
    compile_mm = cb._COMPILERS["mul_mat"]

    def timed_compiler(be: Any, node: Any, arrays: Any) -> Any:
        step = compile_mm(be, node, arrays)
        if step is None:
            return None
        A = arrays[id(node.src[0])]
        a0 = node.src[0]
        kname = "?"
        for c in step.__closure__ or ():
            v = c.cell_contents
            if hasattr(v, "py_func"):
                kname = v.py_func.__name__
        key = (a0.type.name, f"{a0.shape[-2]}x{a0.shape[-1]}", kname)
        nbytes = A.nbytes

        def run() -> None:
            if not on[0]:
                return step()
            c, t = time.process_time(), time.perf_counter()
            step()
            s = stats[key]
            s[0] += 1
            s[1] += time.process_time() - c
            s[2] += time.perf_counter() - t
            s[3] = nbytes

        return run

    cb._COMPILERS["mul_mat"] = timed_compiler
    path = os.path.expanduser(a.model)
    print(f"# {machine_line()}; threads {a.threads}; load average {os.getloadavg()}")
    model = Model.load(path)
    ctx = Context(model, ContextParams(n_ctx=512, n_threads=a.threads))
    rng = np.random.default_rng(0)
    ctx.decode(Batch.from_tokens(rng.integers(0, model.n_vocab, 8), pos0=0))
    ctx.decode(Batch.from_tokens([1], pos0=8))
    ctx.decode(Batch.from_tokens([2], pos0=9))
    on[0] = True
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(a.tokens):
        ctx.decode(Batch.from_tokens([int(rng.integers(0, model.n_vocab))], pos0=10 + i))
    cpu_all, wall_all = time.process_time() - c0, time.perf_counter() - t0
    n = a.tokens
    tot_cpu = sum(s[1] for s in stats.values())
    tot_wall = sum(s[2] for s in stats.values())
    tot_mb = sum(s[3] * s[0] for s in stats.values()) / n / 1e6
    print(
        "| type | rows x cols | kernel | calls/token | MB/token | CPU ms/token | share | GB per CPU-s | GB/s wall |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key, (calls, cpu, wall, nb) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
        mb = nb * calls / n / 1e6
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {calls / n:.0f} | {mb:.1f} | {cpu / n * 1e3:.2f} | "
            f"{cpu / tot_cpu:.0%} | {nb * calls / cpu / 1e9:.1f} | {nb * calls / wall / 1e9:.1f} |"
        )
    print(
        f"| all mat-vec | | | | {tot_mb:.1f} | {tot_cpu / n * 1e3:.2f} | 100% | "
        f"{tot_mb * n / tot_cpu / 1e3:.1f} | {tot_mb * n / tot_wall / 1e3:.1f} |"
    )
    print(
        f"\nwhole decode: {cpu_all / n * 1e3:.2f} CPU ms/token, {wall_all / n * 1e3:.2f} wall ms/token; "
        f"mat-vec steps {tot_cpu / cpu_all:.0%} of the CPU time"
    )
    rc, rw = read_rate(a.threads)
    print(f"streaming read, {a.threads} thread(s): {rc:.1f} GB per CPU-second, {rw:.1f} GB/s wall")
    print(f"# load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
