"""Where a decode token's CPU time goes besides the mat-vec kernels: the scheduler's step loop, Numba
dispatch, the small ops, and the work outside the graph (batch checks, KV bookkeeping, inputs, logits).
(``decode_steps.py``: wall time per step, the mat-vecs per weight with their read rate.)

    python benchmarks/decode_overhead.py MODEL.gguf [--threads 1] [--tokens 40] [--ab]

``--ab``: instead, two contexts on the model in one process, one built with the general steps
(``cpu/plan_steps.ENABLED = False``) and one with the fast steps, tokens alternating between them: the
paired CPU-time difference per token, and whether their logits are the same bytes.

All figures are CPU time (``time.thread_time`` of the decoding thread, ``time.process_time`` of the
process, which with 2 threads includes the worker's spinning): the machine may be shared. Per-step
figures are the minimum over the tokens of each step's own time (the least disturbed run), summed per
op; "hot" figures repeat one step 200 times (its data in cache: about its Python + dispatch cost when
the op's work is small).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import machine_line  # noqa: E402


def _ms(v: list[float]) -> str:
    return f"{statistics.median(v) * 1e3:.3f} (min {min(v) * 1e3:.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--ab", action="store_true")
    a = ap.parse_args()
    if a.ab:
        return _ab(os.path.expanduser(a.model), a.threads, a.tokens)

    import llamapy.context as C
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.ggml.cpu import backend as CB
    from llamapy.model import Model

    ops: dict[int, str] = {}
    orig_compile = CB.CPUBackend.compile

    def rec(self, node, arrays):  # type: ignore[no-untyped-def]
        s = orig_compile(self, node, arrays)
        if s is not None:
            ops[id(s)] = node.op + ("+rms_norm" if id(node) in self._fused_muls else "")
        return s

    CB.CPUBackend.compile = rec  # type: ignore[method-assign]
    model = Model.load(os.path.expanduser(a.model))
    ctx = Context(model, ContextParams(n_ctx=512, n_threads=a.threads))
    acc: dict[str, list[float]] = collections.defaultdict(list)

    def wrap(obj, name: str, label: str) -> None:  # type: ignore[no-untyped-def]
        f = getattr(obj, name)

        def w(*args, **kw):  # type: ignore[no-untyped-def]
            t = time.thread_time()
            r = f(*args, **kw)
            acc[label].append(time.thread_time() - t)
            return r

        setattr(obj, name, w)

    rng = np.random.default_rng(0)
    ctx.decode(Batch.from_tokens(rng.integers(0, model.n_vocab, 8), pos0=0))
    ctx.decode(Batch.from_tokens([1], pos0=8))
    wrap(C, "allocate", "batch checks (batch.allocate)")
    for name in ("split", "snapshot", "place_ubatch"):
        wrap(ctx.memory, name, f"KV bookkeeping (memory.{name})")
    wrap(ctx, "_graph", "graph lookup (Context._graph)")
    for gi in next(iter(ctx._graphs.values())).inputs:
        wrap(gi, "set_input", f"inputs ({type(gi).__name__}.set_input)")
    wrap(ctx.sched, "compute", "sched.compute")
    pt, tt, samp = [], [], []
    for i in range(a.tokens):
        tok = int(rng.integers(0, model.n_vocab))
        c, t = time.process_time(), time.thread_time()
        ctx.decode(Batch.from_tokens([tok], pos0=9 + i))
        t2 = time.thread_time()
        int(np.argmax(ctx.get_logits_ith(-1)))
        samp.append(time.thread_time() - t2)
        pt.append(time.process_time() - c)
        tt.append(t2 - t)
    print(f"# {machine_line()}; load average {os.getloadavg()}")
    print(f"# {a.model}, {a.threads} thread(s), {a.tokens} tokens after an 8-token prompt, n_ctx 512")
    print(f"process CPU ms/token (incl. argmax): {_ms(pt)}")
    print(f"decoding thread CPU ms/token: {_ms(tt)}")
    comp = acc.pop("sched.compute")
    other = [x - y for x, y in zip(tt, comp, strict=True)]
    print(f"  in sched.compute: {_ms(comp)}")
    print(f"  outside the graph: {_ms(other)}")
    for k, v in acc.items():
        print(f"    {k}: {_ms(v)}")
    print(f"  argmax of the logits (greedy sampling): {_ms(samp)}")
    c = ctx.sched._last
    steps = c.steps
    best = [1e9] * len(steps)
    tc = time.thread_time
    for _ in range(a.tokens):
        for j, s in enumerate(steps):
            t = tc()
            s()
            d = tc() - t
            best[j] = min(best[j], d)
    t0 = tc()
    for _ in range(10000):
        t = tc()
        d = tc() - t
    tov = (tc() - t0) / 20000
    hot: dict[str, float] = {}
    for s in steps:
        k = ops.get(id(s), getattr(s, "__name__", "?"))
        if k in hot or k == "mul_mat":
            continue
        t = tc()
        for _ in range(200):
            s()
        hot[k] = (tc() - t) / 200
    agg: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for j, s in enumerate(steps):
        k = ops.get(id(s), getattr(s, "__name__", "?"))
        agg[k][0] += 1
        agg[k][1] += max(best[j] - tov, 0.0)
    print(f"steps per token: {len(steps)}")
    print("| step | per token | sum of per-step minima, ms/token | us/call | hot us/call |")
    print("| --- | ---: | ---: | ---: | ---: |")
    tot = 0.0
    for k, (n, d) in sorted(agg.items(), key=lambda x: -x[1][1]):
        tot += d
        h = f"{hot[k] * 1e6:.2f}" if k in hot else ""
        print(f"| {k} | {n} | {d * 1e3:.3f} | {d / n * 1e6:.2f} | {h} |")
    print(f"sum of per-step minima: {tot * 1e3:.2f} ms/token (timer cost {tov * 1e6:.2f} us subtracted)")
    t = tc()
    for _ in range(200):
        for _s in steps:
            pass
    print(f"bare loop over the steps: {(tc() - t) / 200 * 1e6:.1f} us/token")
    _dispatch_costs()


def _ab(path: str, threads: int, n: int) -> None:
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.ggml.cpu import plan_steps
    from llamapy.model import Model

    model = Model.load(path)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.n_vocab, 8)
    ctxs = {}
    for name, enabled in (("general", False), ("fast", True)):
        plan_steps.ENABLED = enabled
        c = Context(model, ContextParams(n_ctx=512, n_threads=threads))
        c.decode(Batch.from_tokens(prompt, pos0=0))
        c.decode(Batch.from_tokens([1], pos0=8))
        ctxs[name] = c
    plan_steps.ENABLED = True
    cpu: dict[str, list[float]] = {k: [] for k in ctxs}
    same = True
    for i in range(n):
        tok = int(rng.integers(0, model.n_vocab))
        for name, c in list(ctxs.items())[:: 1 if i % 2 == 0 else -1]:
            t = time.thread_time()
            c.decode(Batch.from_tokens([tok], pos0=9 + i))
            cpu[name].append(time.thread_time() - t)
        same = same and ctxs["general"].get_logits().tobytes() == ctxs["fast"].get_logits().tobytes()
    print(f"# {machine_line()}; load average {os.getloadavg()}")
    print(f"# {path}, {threads} thread(s), {n} tokens each; logits identical every token: {same}")
    for k, v in cpu.items():
        print(f"{k:8s} decoding-thread CPU ms/token: {_ms(v)}")
    d = [x - y for x, y in zip(cpu["general"], cpu["fast"], strict=True)]
    print(
        f"paired difference general - fast: median {statistics.median(d) * 1e3:.3f} ms/token, "
        f"mean {statistics.mean(d) * 1e3:.3f}"
    )


def _dispatch_costs() -> None:
    """One small kernel call (rms_norm * w over 576 floats) through Numba's dispatcher, through its
    compiled entry point (no type dispatch), and wrapped in a step closure; NumPy's add for scale."""
    from llamapy.ggml.cpu import op_kernels as ok

    x = np.random.default_rng(0).random((1, 576), dtype=np.float32)
    w, out = x[0].copy(), np.empty_like(x)
    k = ok.rms_norm_mul_rows
    k(x, 1e-5, w, out)
    entry = k.overloads[k.signatures[0]].entry_point

    def bench(f, *args) -> float:  # type: ignore[no-untyped-def]
        t = time.thread_time()
        for _ in range(20000):
            f(*args)
        return (time.thread_time() - t) / 20000 * 1e6

    print(
        f"one small kernel call, us: dispatcher {bench(k, x, 1e-5, w, out):.2f}, entry point "
        f"{bench(entry, x, 1e-5, w, out):.2f}, step closure around the dispatcher "
        f"{bench(lambda: k(x, 1e-5, w, out)):.2f}; np.add(out=) {bench(np.add, x, x, out):.2f}"
    )


if __name__ == "__main__":
    main()
