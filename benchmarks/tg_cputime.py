"""CPU time per generated token (``Context.decode`` of one token after a short prompt, median of N), a
load-robust measure of the decode path on a shared machine, next to llama.cpp's ``llama-bench`` user
time (its tg run at two lengths, the difference divided by the extra tokens: start-up cancels out).

    python benchmarks/tg_cputime.py MODEL.gguf [--threads 1] [--tokens 32] [--llamacpp]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import llamacpp_bin, machine_line  # noqa: E402


def llamapy_cpu_per_token(model_path: str, threads: int, n: int) -> tuple[float, dict[str, float]]:
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    model = Model.load(model_path)
    ctx = Context(model, ContextParams(n_ctx=512, n_threads=threads))
    rng = np.random.default_rng(0)
    ctx.decode(Batch.from_tokens(rng.integers(0, model.n_vocab, 8), pos0=0))
    per, wall = [], []
    for i in range(n):
        tok = int(rng.integers(0, model.n_vocab))
        c, t = time.process_time(), time.perf_counter()
        ctx.decode(Batch.from_tokens([tok], pos0=8 + i))
        per.append(time.process_time() - c)
        wall.append(time.perf_counter() - t)
    return statistics.median(per[2:]), {"wall": statistics.median(wall[2:])}


def llamacpp_cpu_per_token(model_path: str, threads: int, n: int) -> tuple[float, float]:
    """(CPU seconds per token: the rusage difference of a tg16 and a tg(16 + n) run, divided by n; wall
    seconds per token: llama-bench's own figure for the longer run)."""
    import csv
    import io

    bench = llamacpp_bin("avx2") / "llama-bench"  # both tools on AVX2 code (ours: Numba target haswell)
    users, ts = [], 0.0
    for k in (16, 16 + n):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(
            [
                str(bench),
                "-m",
                model_path,
                "-t",
                str(threads),
                "-p",
                "0",
                "-n",
                str(k),
                "-r",
                "1",
                "-o",
                "csv",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        users.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
        rows = list(csv.DictReader(io.StringIO(p.stdout)))
        ts = float(rows[-1]["avg_ts"]) if rows and rows[-1].get("avg_ts") else 0.0
    return (users[1] - users[0]) / n, (1.0 / ts if ts else float("nan"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--llamacpp", action="store_true")
    a = ap.parse_args()
    path = os.path.expanduser(a.model)
    size = os.path.getsize(path)
    print(f"# {machine_line()}; load average {os.getloadavg()}")
    ours, extra = llamapy_cpu_per_token(path, a.threads, a.tokens)
    print(
        f"llamapy   : {ours * 1e3:7.2f} CPU ms/token  ({size / ours / 1e9:5.1f} GB per CPU-second); "
        f"wall {extra['wall'] * 1e3:.2f} ms/token"
    )
    if a.llamacpp:
        theirs, their_wall = llamacpp_cpu_per_token(path, a.threads, a.tokens)
        print(
            f"llama.cpp : {theirs * 1e3:7.2f} CPU ms/token  ({size / theirs / 1e9:5.1f} GB per CPU-second); "
            f"wall {their_wall * 1e3:.2f} ms/token (llama-bench's own)"
        )
        print(
            f"ratio (llama.cpp CPU / llamapy CPU): {theirs / ours:.2f}x; wall: {their_wall / extra['wall']:.2f}x"
        )
    print(f"# load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
