"""Decode on a busy machine: tg32 with and without a CPU hog on one core, llama.cpp and llamapy.

Each tool runs with its default thread count (llama-bench: all cores; llamapy: the cores other work
leaves free, see llamapy/_cpuload.py) and, for comparison, with ``-t`` all cores fixed. The hog is a
Python busy loop started before and stopped after each measurement. Prints a Markdown table (mean ±
standard deviation of ``-r`` repetitions) with the machine line and the load averages.

    python benchmarks/bench_busy.py [-m smollm2-135m-instruct] [--bin ~/.cache/llamapy/llamacpp/0.3.36/build/bin]
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/tokenize.py would shadow the standard library's tokenize module
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import llamacpp_bin, machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def hog() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def llama_cpp(bin_dir: str, model: str, n: int, reps: int, threads: int | None) -> tuple[float, float]:
    cmd = [
        str(Path(bin_dir) / "llama-bench"),
        "-m",
        model,
        "-p",
        "0",
        "-n",
        str(n),
        "-r",
        str(reps),
        "-o",
        "json",
    ]
    if threads:
        cmd += ["-t", str(threads)]
    rec = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900).stdout)[0]
    return rec["avg_ts"], rec["stddev_ts"]


def llamapy(model: str, n: int, reps: int, threads: int | None) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "llamapy", "bench", "-m", model, "-p", "0", "-n", str(n), "-r", str(reps)]
    cmd += ["-o", "json"] + (["-t", str(threads)] if threads else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900, cwd=ROOT).stdout
    rec = json.loads(out)[0]
    return rec["avg_ts"], rec["stddev_ts"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct")
    ap.add_argument("--bin", default=str(llamacpp_bin()))
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from llamapy.hub import resolve_model

    model = str(resolve_model(args.model))
    ncpu = os.cpu_count() or 1
    tools = [("llama.cpp", lambda t: llama_cpp(args.bin, model, args.n, args.r, t))]
    tools.append(("llamapy", lambda t: llamapy(model, args.n, args.r, t)))
    print(f"# tg{args.n} on a busy machine: {Path(model).name}\n")
    print(f"- machine: {machine_line()}; load average at start {os.getloadavg()}\n")
    print("| tool | threads | no hog t/s | one-core hog t/s | kept |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, fn in tools:
        for threads, label in ((None, "default"), (ncpu, f"-t {ncpu}")):
            idle = fn(threads)
            h = hog()
            try:
                time.sleep(0.5)
                busy = fn(threads)
            finally:
                h.kill()
                h.wait()
            print(
                f"| {name} | {label} | {idle[0]:.1f} ± {idle[1]:.1f} | {busy[0]:.1f} ± {busy[1]:.1f} "
                f"| {busy[0] / idle[0]:.2f} |",
                flush=True,
            )
    print(f"\n- load average at the end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
