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
    per = []
    for i in range(n):
        tok = int(rng.integers(0, model.n_vocab))
        c = time.process_time()
        ctx.decode(Batch.from_tokens([tok], pos0=8 + i))
        per.append(time.process_time() - c)
    return statistics.median(per[2:]), {}


def llamacpp_cpu_per_token(model_path: str, threads: int, n: int) -> float:
    bench = llamacpp_bin("avx2") / "llama-bench"  # both tools on AVX2 code (ours: Numba target haswell)
    users = []
    for k in (16, 16 + n):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(
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
        )
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        users.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
    return (users[1] - users[0]) / n


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
    ours, _ = llamapy_cpu_per_token(path, a.threads, a.tokens)
    print(
        f"llamapy   : {ours * 1e3:7.2f} CPU ms/token  ({size / ours / 1e9 / a.threads:5.1f} GB/s per thread)"
    )
    if a.llamacpp:
        theirs = llamacpp_cpu_per_token(path, a.threads, a.tokens)
        print(
            f"llama.cpp : {theirs * 1e3:7.2f} CPU ms/token  ({size / theirs / 1e9 / a.threads:5.1f} GB/s per thread)"
        )
        print(f"ratio (llama.cpp CPU / llamapy CPU): {theirs / ours:.2f}x")
    print(f"# load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
