"""Per-op CPU time of one prompt decode (``Context.decode`` of N tokens): cProfile with
``time.process_time`` as its clock, so a parallel kernel counts the CPU of all its threads and other
processes on a shared machine do not. Grouped into mat-muls by weight type and path (in-register
batch kernels ``mmb*`` / dequantized tiles + sgemm), attention, and the rest; best of 3 by total.

    python benchmarks/pp_profile.py MODEL.gguf THREADS N [N ...]
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import machine_line  # noqa: E402
from llamapy.batch import Batch  # noqa: E402
from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.model import Model  # noqa: E402


def group(fn: str, name: str) -> str:
    if name.startswith(("mmb8_", "mmb_", "mm_")):
        return f"mat-mul in-register {name.split('_', 1)[1]}"
    if "quants" in fn and ("dequant" in name or fn.endswith("fast.py")):
        return f"tile dequantize {name}"
    if name == "_gemm_nt":
        return "mat-mul sgemm (tiles)"
    if name in ("_attn", "attention") or "attn" in name:
        return "attention"
    return "other"


def profile(ctx: Context, toks: np.ndarray) -> tuple[float, float, dict[str, float]]:
    pr = cProfile.Profile(time.process_time)
    c, w = time.process_time(), time.perf_counter()
    pr.enable()
    ctx.decode(Batch.from_tokens(toks, pos0=0))
    pr.disable()
    cpu, wall = time.process_time() - c, time.perf_counter() - w
    ctx.memory.seq_rm(0, 0, -1)
    st = pstats.Stats(pr)
    groups: dict[str, float] = defaultdict(float)
    other = []
    for (fn, _, name), (_, _, tt, _, _) in st.stats.items():  # type: ignore[attr-defined]
        gname = group(fn, name)
        groups[gname] += tt
        if gname == "other":
            other.append((tt, f"{Path(fn).name}:{name}"))
    for tt, nm in sorted(other, reverse=True)[:6]:
        groups[f"(other) {nm}"] = tt
    return cpu, wall, groups


def main() -> None:
    model = Model.load(os.path.expanduser(sys.argv[1]))
    T = int(sys.argv[2])
    print(machine_line(), f"Numba target {os.environ.get('NUMBA_CPU_NAME', 'host')}")
    print(f"model {Path(sys.argv[1]).name} threads {T} load {os.getloadavg()[0]:.2f}")
    rng = np.random.default_rng(0)
    for n in (int(v) for v in sys.argv[3:]):
        ctx = Context(model, ContextParams(n_ctx=1024, n_threads=T, n_batch=512, n_ubatch=512))
        toks = rng.integers(0, model.n_vocab, n)
        ctx.decode(Batch.from_tokens(toks, pos0=0))  # warm: compile, scratch
        ctx.memory.seq_rm(0, 0, -1)
        best = min((profile(ctx, toks) for _ in range(3)), key=lambda r: r[0])
        cpu, wall, groups = best
        print(f"\npp{n}: cpu {cpu:.3f} s, wall {wall:.3f} s, {n / wall:.1f} t/s wall, ", end="")
        print(f"{n * T / cpu:.1f} t/s cpu-equivalent ({T} threads)")
        print(f"| pp{n} op group | CPU s | share |\n| --- | ---: | ---: |")
        for k, v in sorted(groups.items(), key=lambda kv: (kv[0].startswith("(other)"), -kv[1])):
            if v >= 0.0005:
                print(f"| {k} | {v:.3f} | {100 * v / cpu:.1f}% |")
        del ctx


if __name__ == "__main__":
    main()
