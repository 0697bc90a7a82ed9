"""Paired A/B of one decode switch: two contexts on one model in one process, one built with a module
attribute set to False (off) and one with it True (on), one-token decodes alternating between them (the
order swapped every token); per token the CPU time of the process (``time.process_time``: at 2 threads
it includes the worker's spinning) and the wall time, then the medians of the paired differences.

    python benchmarks/moe_decode_ab.py MODEL.gguf llamapy.ggml.cpu.moe_router_kernels:ENABLED \\
        [--threads 1] [--tokens 40]

The switch must be read when a step is compiled (the first decode of a context), as the ``ENABLED`` flags
of ``moe_router_kernels`` and ``plan_steps`` are.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import machine_line  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("switch", help="module:ATTRIBUTE, a bool read when steps are compiled")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=40)
    a = ap.parse_args()
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    mod_name, attr = a.switch.split(":")
    mod = importlib.import_module(mod_name)
    model = Model.load(os.path.expanduser(a.model))
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.n_vocab, 8)
    ctxs = {}
    for name, val in (("off", False), ("on", True)):
        setattr(mod, attr, val)
        c = Context(model, ContextParams(n_ctx=512, n_threads=a.threads))
        c.decode(Batch.from_tokens(prompt, pos0=0))
        c.decode(Batch.from_tokens([1], pos0=8))
        ctxs[name] = c
    cpu: dict[str, list[float]] = {k: [] for k in ctxs}
    wall: dict[str, list[float]] = {k: [] for k in ctxs}
    for i in range(a.tokens):
        tok = int(rng.integers(0, model.n_vocab))
        for name, c in list(ctxs.items())[:: 1 if i % 2 == 0 else -1]:
            t, w = time.process_time(), time.perf_counter()
            c.decode(Batch.from_tokens([tok], pos0=9 + i))
            cpu[name].append(time.process_time() - t)
            wall[name].append(time.perf_counter() - w)
    top = [int(np.argmax(c.get_logits())) for c in ctxs.values()]
    print(f"# {machine_line()}; load average {os.getloadavg()}")
    print(
        f"# {a.model}, {a.switch}, {a.threads} thread(s), {a.tokens} tokens each; same argmax: {top[0] == top[1]}"
    )
    for k in ctxs:
        print(
            f"{k:4s} CPU ms/token median {statistics.median(cpu[k]) * 1e3:.2f} (min {min(cpu[k]) * 1e3:.2f}); "
            f"wall median {statistics.median(wall[k]) * 1e3:.2f} (min {min(wall[k]) * 1e3:.2f})"
        )
    for kind, d in (("CPU", cpu), ("wall", wall)):
        diff = [x - y for x, y in zip(d["off"], d["on"], strict=True)]
        print(f"paired {kind} difference off - on: median {statistics.median(diff) * 1e3:.3f} ms/token")


if __name__ == "__main__":
    main()
