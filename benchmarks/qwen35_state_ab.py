"""Qwen3.5 decode with the recurrent states gathered and scattered (``get_rows`` / ``set_rows``: the path
before in-place states, still taken when a ubatch's streams do not own consecutive slots) against in
place (views of the cache, the op writing its state there), interleaved in one process; CPU time per
token (load-robust on a shared machine).

    python benchmarks/qwen35_state_ab.py FILE.gguf [--rounds 12] [--tokens 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import machine_line  # noqa: E402
from llamapy.batch import Batch  # noqa: E402
from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.memory import recurrent  # noqa: E402
from llamapy.model import Model  # noqa: E402

FORCE_GATHER = [False]
_place = recurrent.RecurrentCache.place


def _place_maybe_gather(self, *a, **k):  # type: ignore[no-untyped-def]
    c = _place(self, *a, **k)
    if FORCE_GATHER[0]:
        c.slot0 = None
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=8, help="decode steps per mode per round")
    a = ap.parse_args()
    recurrent.RecurrentCache.place = _place_maybe_gather
    print(f"# {machine_line()}; load average {os.getloadavg()}")
    m = Model.load(os.path.expanduser(a.model))
    ctx = Context(m, ContextParams(n_ctx=1024, n_threads=1))
    rng = np.random.default_rng(0)
    ctx.decode(Batch.from_tokens(rng.integers(0, m.n_vocab, 8), pos0=0))
    pos = 8
    res: dict[str, list[float]] = {"gather": [], "inplace": []}
    for r in range(a.rounds):
        for mode in ("gather", "inplace") if r % 2 == 0 else ("inplace", "gather"):
            FORCE_GATHER[0] = mode == "gather"
            ctx.decode(Batch.from_tokens([int(rng.integers(0, m.n_vocab))], pos0=pos))  # (graph warm)
            pos += 1
            for _ in range(a.tokens):
                c = time.process_time()
                ctx.decode(Batch.from_tokens([int(rng.integers(0, m.n_vocab))], pos0=pos))
                res[mode].append(time.process_time() - c)
                pos += 1
    for k, v in res.items():
        med, lo = statistics.median(v) * 1e3, min(v) * 1e3
        print(f"{k:8s}: median {med:6.2f}  min {lo:6.2f} CPU ms/token over {len(v)}")
    print(f"# load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
