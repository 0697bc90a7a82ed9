"""Decode with the mat-vecs of shared activations in one kernel call (``cpu/matvec_groups``: Q/K/V and
gate/up, Qwen2's bias adds in the same steps) against one call per weight, interleaved in one process: two
contexts on one model (the weights repacked once, as the groups' blocks, so both read the same bytes),
tokens alternating between them, the order flipped every token. Wall time per token (the effect is the
second thread's launches), the median of the paired differences, and whether the logits are the same bytes.

    python benchmarks/matvec_groups_ab.py FILE.gguf [FILE.gguf ...] [--tokens 300] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import machine_line  # noqa: E402
from llamapy.batch import Batch  # noqa: E402
from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.ggml.cpu import matvec_groups  # noqa: E402
from llamapy.model import Model  # noqa: E402


def one(path: str, threads: int, tokens: int) -> str:
    model = Model.load(path)
    ctxs = {}
    for grouped in (True, False):
        matvec_groups.ENABLED = grouped  # read when a graph's steps are built (the first decode of a shape)
        c = Context(model, ContextParams(n_ctx=max(1024, tokens + 64), n_threads=threads))
        c.decode(Batch.from_tokens([1, 2, 3, 4, 5, 6, 7, 8], pos0=0))
        c.decode(Batch.from_tokens([9], pos0=8))
        ctxs[grouped] = c
    matvec_groups.ENABLED = True
    times: dict[bool, list[float]] = {True: [], False: []}
    same = True
    for i in range(tokens):
        logits = {}
        for grouped in (True, False) if i % 2 else (False, True):
            t0 = time.perf_counter()
            ctxs[grouped].decode(Batch.from_tokens([10 + i % 50], pos0=9 + i))
            times[grouped].append(time.perf_counter() - t0)
            logits[grouped] = ctxs[grouped].get_logits().tobytes()
        same &= logits[True] == logits[False]
    g, s = statistics.median(times[True]), statistics.median(times[False])
    d = statistics.median(a - b for a, b in zip(times[True], times[False], strict=True))
    return (
        f"| {Path(path).name} | {threads} | {s * 1e3:.3f} | {g * 1e3:.3f} | {d * 1e3:+.3f} ({d / s * 100:+.1f} %) "
        f"| {'yes' if same else 'NO'} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    print(f"# {machine_line()}; load average {os.getloadavg()}")
    print(f"# python benchmarks/matvec_groups_ab.py {' '.join(sys.argv[1:])}")
    print(
        "| file | threads | separate ms/token | grouped ms/token | paired difference, median | same logits |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for m in a.models:
        print(one(os.path.expanduser(m), a.threads, a.tokens), flush=True)


if __name__ == "__main__":
    main()
