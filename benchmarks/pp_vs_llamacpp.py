"""Prompt processing, llamapy vs llama.cpp, in CPU time per prompt (a machine shared with other jobs):
pp64 and pp512 per file, the two tools interleaved file by file.

- llama.cpp: ``llama-bench -p N -n 0 -t T --poll 0`` (``--poll 0``: its threads sleep while waiting,
  so their CPU time is work, not spinning), run with ``-r 1`` and with ``-r R``; the children's CPU
  time (rusage) of the second minus the first, divided by ``R - 1``: the mean CPU s of one prompt
  (model load and warm-up cancel).
- llamapy: ``Context.decode`` of N random tokens in a subprocess (``--worker``), one warm-up, then the
  minimum of ``R`` runs of ``time.process_time``, with ``OMP_WAIT_POLICY=PASSIVE`` (the counterpart of
  ``--poll 0``: Numba's OpenMP threads sleep at a barrier instead of spinning; ``--spin`` leaves GNU
  OpenMP's default, whose spinning on a loaded machine measured half of the CPU time: Q8_0 pp64 5.85 s
  spinning, 2.88 s passive).

    python benchmarks/pp_vs_llamacpp.py [--bin DIR] [--threads 2] [--reps 4] [--sizes 64,512] FILE...

Set NUMBA_CPU_NAME / NUMBA_CPU_FEATURES / OPENBLAS_CORETYPE for an AVX2-only comparison (see
benchmarks/results/pp_vs_llamacpp.md). Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_BIN = Path.home() / ".cache/llamapy/llamacpp/0.3.36/build-avx2/bin"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def llamacpp_cpu(bin_dir: Path, path: str, n: int, threads: int, reps: int) -> float:
    """Mean CPU seconds of one ``n``-token prompt in llama-bench."""

    def run(r: int) -> float:
        c = _children_cpu()
        subprocess.run(
            [str(bin_dir / "llama-bench"), "-m", path, "-p", str(n), "-n", "0", "-t", str(threads),
             "--poll", "0", "-r", str(r)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        return _children_cpu() - c

    one = run(1)
    many = run(reps)
    return (many - one) / (reps - 1)


def worker(path: str, threads: int, sizes: list[int], reps: int) -> None:
    import numpy as np

    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    model = Model.load(path)
    ctx = Context(model, ContextParams(n_ctx=1024, n_threads=threads, n_batch=512, n_ubatch=512))
    rng = np.random.default_rng(0)
    for n in sizes:
        toks = rng.integers(0, model.n_vocab, n)
        ctx.decode(Batch.from_tokens(toks, pos0=0))  # warm: compile, scratch
        ctx.memory.seq_rm(0, 0, -1)
        cpu = []
        for _ in range(reps):
            c = time.process_time()
            ctx.decode(Batch.from_tokens(toks, pos0=0))
            cpu.append(time.process_time() - c)
            ctx.memory.seq_rm(0, 0, -1)
        print(f"RESULT {n} {min(cpu):.4f}", flush=True)


def llamapy_cpu(path: str, threads: int, sizes: list[int], reps: int, spin: bool = False) -> dict[int, float]:
    env = dict(os.environ)
    if not spin:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    out = subprocess.run(
        [sys.executable, __file__, "--worker", "--threads", str(threads), "--reps", str(reps),
         "--sizes", ",".join(map(str, sizes)), path],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    res = {}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            _, n, c = line.split()
            res[int(n)] = float(c)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--bin", type=Path, default=DEFAULT_BIN)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--sizes", default="64,512")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--no-llamacpp", action="store_true", help="llamapy only")
    ap.add_argument("--spin", action="store_true", help="llamapy without OMP_WAIT_POLICY=PASSIVE")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    files = [os.path.expanduser(f) for f in args.files]
    if args.worker:
        worker(files[0], args.threads, sizes, args.reps)
        return
    print(f"load {os.getloadavg()[0]:.1f} at start, {time.strftime('%H:%M UTC', time.gmtime())}")
    print("| file | test | llama.cpp CPU s | llamapy CPU s | ratio (llama.cpp / llamapy) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for f in files:
        ours = llamapy_cpu(f, args.threads, sizes, args.reps, args.spin)
        for n in sizes:
            if args.no_llamacpp:
                print(f"| {Path(f).name} | pp{n} | - | {ours[n]:.3f} | - |", flush=True)
                continue
            theirs = llamacpp_cpu(args.bin, f, n, args.threads, args.reps)
            print(
                f"| {Path(f).name} | pp{n} | {theirs:.3f} | {ours[n]:.3f} | {theirs / ours[n]:.2f}x |",
                flush=True,
            )
    print(f"load {os.getloadavg()[0]:.1f} at end, {time.strftime('%H:%M UTC', time.gmtime())}")


if __name__ == "__main__":
    main()
