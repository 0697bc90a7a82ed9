"""Tokenizer speed: 30 copies of ../shared/reference/gpl-3.txt (1.05 MB), including loading the vocab.

    python benchmarks/bench_tokenize.py [--copies 30] [--model smollm2|gemma3|PATH ...]

Compare with llama.cpp's ``llama-tokenize -f FILE --ids --log-disable`` on the same machine kind:
0.50 s (SmolLM2, BPE) and 5.4 s (Gemma 3, SPM). Each model runs in a fresh process so that the
time includes imports and loading, as llama-tokenize's does (the Numba cache is warm).
"""

from __future__ import annotations

import sys

# this file is named like the stdlib's ``tokenize``: keep its folder off the import path
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GPL = ROOT.parent / "shared" / "reference" / "gpl-3.txt"
MODELS = {"smollm2": "smollm2-135m-instruct", "gemma3": "gemma3-270m"}
LLAMA_CPP = {"smollm2": 0.50, "gemma3": 5.4}


def _one(path: str, copies: int) -> dict:
    t0 = time.perf_counter()
    from llamapy.vocab import load_vocab

    text = GPL.read_text(encoding="utf-8") * copies
    t1 = time.perf_counter()
    v = load_vocab(path)
    t2 = time.perf_counter()
    ids = v.tokenize(text, add_special=True, parse_special=True)
    t3 = time.perf_counter()
    return {"bytes": len(text.encode()), "tokens": len(ids), "import_s": t1 - t0, "load_s": t2 - t1,
            "tokenize_s": t3 - t2, "total_s": t3 - t0}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copies", type=int, default=30)
    ap.add_argument("--model", action="append", help="smollm2, gemma3 or a GGUF path (default: both)")
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per model; the best is reported")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_one(args.child, args.copies)))
        return
    from llamapy import hub

    for m in args.model or list(MODELS):
        path = str(hub.pull(MODELS[m], quiet=True)) if m in MODELS else m
        cmd = [sys.executable, __file__, "--child", path, "--copies", str(args.copies)]
        subprocess.run(cmd, check=True, capture_output=True)  # warm the Numba cache
        best = None
        for _ in range(args.runs):
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            out = subprocess.run(cmd, check=True, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            if best is None or wall < best[0]:
                best = (wall, cpu, json.loads(out.stdout))
        wall, cpu, r = best
        ref = LLAMA_CPP.get(m)
        print(f"{m}: {r['bytes']} bytes -> {r['tokens']} tokens; process wall {wall:.2f} s, cpu {cpu:.2f} s "
              f"(import {r['import_s']:.2f}, load {r['load_s']:.2f}, tokenize {r['tokenize_s']:.2f})"
              + (f"; llama.cpp {ref:.2f} s -> {wall / ref:.2f}x" if ref else ""))  # fmt: skip
    print(f"machine: {machine_line()}; "
          f"load average {os.getloadavg()[0]:.1f}; best of {args.runs} fresh processes")  # fmt: skip


if __name__ == "__main__":
    main()
