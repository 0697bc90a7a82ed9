"""Where a decode token's wall time goes, step by step, and how fast each weight's mat-vec reads in the model.

    python benchmarks/decode_steps.py -m MODEL.gguf [-n 64] [-t 2] [--top 25]

One context (n_ctx 512), its decode graph built and its prefetch tuners decided first (``bench._until_tuned``);
then ``-n`` tokens decoded plainly (ms/token), then ``-n`` more with every step of the graph timed (wall,
``perf_counter`` around each call). The 8-row mat-vec steps (``repack.X8Weight``, their ``weight``
attribute) are grouped by weight name without its block number, type and shape: ms/token, calls/token,
us/call and GB/s of weight bytes; the other steps by their function's name. A weight read at a lower rate
than the large ones of its type loses to the per-call costs (launch, the first lines of each thread's
range, the threads finishing apart); ``decode_overhead.py`` splits the steps besides the mat-vecs into
CPU time per op.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import machine_line  # noqa: E402

_BLOCK = re.compile(r"^blk\.\d+\.")


def step_key(step: Any) -> tuple[str, int]:
    """(the row label of ``step``, its weight's repacked bytes or 0)."""
    w = getattr(step, "weight", None)
    if w is not None:
        return f"{_BLOCK.sub('', w.name or '?')} {w.type} {w.rows}x{w.cols} ({w.kernel})", w.nbytes
    return getattr(step, "__qualname__", type(step).__name__).replace(".<locals>", ""), 0


def measure(
    model_path: str, n_tokens: int, threads: int | None, repack: bool = True
) -> tuple[float, float, list[tuple[str, int, int, float]]]:
    """(plain ms/token, timed ms/token, rows of (label, calls, weight bytes per call, seconds)) over
    ``n_tokens`` decoded tokens each."""
    from llamapy.cli.bench import _until_tuned, run_test
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    model = Model.load(model_path)
    ctx = Context(model, ContextParams(n_ctx=max(512, 2 * n_tokens + 160), n_threads=threads, repack=repack))
    run_test(ctx, model, 0, 2, 1)  # the decode graph and its kernels
    _until_tuned(ctx, model)
    plain = run_test(ctx, model, 0, n_tokens, 1)[0]
    c = ctx.sched._last
    if c is None:
        raise RuntimeError("no decode graph was computed")
    seconds: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.defaultdict(int)
    nbytes: dict[str, int] = {}
    pc = time.perf_counter

    def timed(step: Any) -> Any:
        key, nb = step_key(step)
        nbytes[key] = nb

        def run() -> None:
            t0 = pc()
            step()
            seconds[key] += pc() - t0
            calls[key] += 1

        return run

    steps = c.steps
    c.steps = [timed(s) for s in steps]
    try:
        t = run_test(ctx, model, 0, n_tokens, 1)[0]
    finally:
        c.steps = steps
    rows = [(k, calls[k], nbytes[k], seconds[k]) for k in seconds]
    return plain / n_tokens, t / n_tokens, rows


def table(rows: list[tuple[str, int, int, float]], tokens: int, top: int) -> list[str]:
    """Markdown rows, the costliest first (``tokens``: the timed tokens plus ``run_test``'s warm-up one)."""
    out = [
        "| step | ms/token | calls/token | us/call | GB/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for key, n, nb, s in sorted(rows, key=lambda r: -r[3])[:top]:
        gb = f"{nb * n / s / 1e9:.1f}" if nb and s > 0 else ""
        out.append(
            f"| {key} | {1e3 * s / tokens:.3f} | {n / tokens:.1f} | {1e6 * s / max(n, 1):.2f} | {gb} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-n", "--tokens", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-repack", action="store_true", help="the file's rows as stored (a short `run`)")
    a = ap.parse_args(argv)
    path = Path(a.model).expanduser()
    if not path.is_file():
        print(f"error: {path}: no such file", file=sys.stderr)
        return 1
    if a.tokens < 1:
        print(f"error: -n {a.tokens}: need at least one token", file=sys.stderr)
        return 1
    plain, timed, rows = measure(str(path), a.tokens, a.threads, repack=not a.no_repack)
    total = sum(r[3] for r in rows) / (a.tokens + 1)
    print(f"# {machine_line()}")
    print(f"# {path.name}: {a.tokens} tokens; {1e3 * plain:.3f} ms/token plain, {1e3 * timed:.3f} timed")
    print(f"# steps: {sum(r[1] for r in rows) // (a.tokens + 1)} a token, {1e3 * total:.3f} ms/token in them")
    print("\n".join(table(rows, a.tokens + 1, a.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
