"""Correctness phases of the GPU check, on the shaped random-weight files (``models.py``).

``agree``: each file at ``-ngl`` half / all layers / all + output against ``-ngl 0`` (the CPU): a
16-token prompt (the GEMM path: more than ``GEMM_MIN_TOKENS``), then 4 greedy decodes fed to every run (the mat-vec path). The bounds
are tests/ggml/cuda/test_cuda_models.py's ``real_check``: logit differences max < 2.0 and mean < 0.3,
and the same top-1 token wherever the CPU's top-2 margin exceeds 0.1.

``graph``: one file decoded three ways with the same tokens: the node walk on every run
(``LLAMAPY_CUDA_REPLAY=0``), the recorded launches replayed one by one (``LLAMAPY_CUDA_GRAPHS=0``), and
the replay captured into CUDA graphs; all three must give bit-identical logits. The walk runs twice, so a
kernel that is not deterministic on its own is told apart from a replay bug.

``warm``: a CPU-only prompt and decode on each file, to compile the CPU kernels ahead (a background job
while pytest runs).

Each writes a Markdown section (``--md``) and exits 1 when a check failed. ``--deadline`` (a Unix time)
stops starting new files once passed (the section says what was left out).

    python -m benchmarks.gpu_check.agree agree --md out.md FILE...
    python -m benchmarks.gpu_check.agree graph --md out.md FILE
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

PROMPT = [1, 504, 3458, 282, 4649, 314, 260, 1789, 1069, 30, 378, 2175, 28, 314, 260, 155]
MAX_DIFF, MEAN_DIFF, MARGIN = 2.0, 0.3, 0.1


def _ctx(model: Any, ngl: int, n_ctx: int = 256) -> Any:
    from llamapy.context import Context

    return Context(model, n_ctx=n_ctx, n_gpu_layers=ngl)


def decode_rows(model: Any, ngl: int, prompt: list[int], feed: list[int] | None, n: int) -> tuple:
    """The prompt's logits rows, then one row per decoded token (``feed``, or ``n`` greedy ones).
    Returns (context, rows, tokens)."""
    from llamapy.batch import Batch

    c = _ctx(model, ngl)
    c.decode(Batch.from_tokens(prompt, logits_all=True))
    rows = [c.get_logits().copy()]
    toks = list(feed) if feed is not None else []
    for i in range(len(toks) if feed is not None else n):
        if feed is None:
            toks.append(int(rows[-1][-1].argmax()))
        c.decode(Batch.from_tokens([toks[i]], pos0=len(prompt) + i))
        rows.append(c.get_logits().copy())
    return c, np.concatenate(rows), toks


N_PROMPT = len(PROMPT)  # --prompt: the smoke run's is 6 (the simulator's tiled GEMM is far too slow)


def _prompt(model: Any) -> list[int]:
    return [t % model.n_vocab for t in PROMPT[:N_PROMPT]]


def agree_file(
    path: Path, sim: bool, n_decode: int = 4, ngls: list[str] | None = None
) -> tuple[bool, list[str]]:
    from llamapy.model import Model

    model = Model.load(path)
    n_layer = model.hparams.n_layer
    prompt = _prompt(model)
    t0 = time.perf_counter()
    _, ref, toks = decode_rows(model, 0, prompt, None, n_decode)
    t_cpu = time.perf_counter() - t0
    top2 = np.sort(ref, axis=-1)[:, -2:]
    sure = top2[:, 1] - top2[:, 0] > MARGIN
    lines, ok = [], True
    named = {"half": max(1, n_layer // 2), "all": n_layer, "all+out": -1}
    for ngl in dict.fromkeys(named[n] if n in named else int(n) for n in ngls or ["half", "all", "all+out"]):
        t0 = time.perf_counter()
        c, got, _ = decode_rows(model, ngl, prompt, toks, 0)
        dt = time.perf_counter() - t0
        off = c.offload
        dev = off.device if off is not None else "none"
        d = np.abs(got.astype(np.float64) - ref)
        top1 = (got.argmax(-1) == ref.argmax(-1)) | ~sure
        good = bool(off is not None and (sim or dev != "CUDA simulator"))
        good = good and bool(
            np.isfinite(got).all() and d.max() < MAX_DIFF and d.mean() < MEAN_DIFF and top1.all()
        )
        ok &= good
        lines.append(
            f"| {path.name} | {ngl if ngl >= 0 else 'all+out'} | {dev} | {d.max():.4f} | {d.mean():.5f} | "
            f"{d.max() / max(np.abs(ref).max(), 1e-30):.2e} | {int(top1.sum())}/{len(top1)} | "
            f"{t_cpu:.1f} / {dt:.1f} | {'ok' if good else '**FAIL**'} |"
        )
    return ok, lines


def run_agree(
    files: list[Path],
    deadline: float,
    sim: bool,
    n_decode: int = 4,
    ngls: list[str] | None = None,
    md: Path | None = None,
) -> tuple[bool, list[str]]:
    """Every file in turn; the section so far is in ``md`` after each (the run may be cut short)."""
    out = [
        "| file | -ngl | device | max abs diff | mean abs diff | max / max|ref| | top-1 same | s (CPU / split) | |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    ok = True
    for i, f in enumerate(files):
        if time.time() > deadline:
            out.append(f"\nout of time: not checked: {', '.join(p.name for p in files[i:])}")
            break
        try:
            good, lines = agree_file(f, sim, n_decode, ngls)
        except Exception as e:
            traceback.print_exc()
            good, lines = False, [f"| {f.name} | | | | | | | | **ERROR** {type(e).__name__}: {e} |"]
        ok &= good
        out += lines
        print("\n".join(lines), flush=True)
        if md is not None:
            md.write_text("\n".join(out) + "\n")
    return ok, out


def run_graph(path: Path, n_decode: int = 12) -> tuple[bool, list[str]]:
    from llamapy.model import Model

    model = Model.load(path)
    prompt = _prompt(model)
    _, _, toks = decode_rows(model, 0, prompt, None, n_decode)  # the tokens every run is fed
    runs: dict[str, tuple[np.ndarray, dict]] = {}
    for name, replay, graphs in (
        ("walk", "0", "0"),
        ("walk again", "0", "0"),
        ("replay", "1", "0"),
        ("CUDA graph", "1", "1"),
    ):
        os.environ["LLAMAPY_CUDA_REPLAY"], os.environ["LLAMAPY_CUDA_GRAPHS"] = replay, graphs
        t0 = time.perf_counter()
        c, rows, _ = decode_rows(model, -1, prompt, toks, 0)
        dt = time.perf_counter() - t0
        be = next(b for b in c.sched.backends if b.name == "cuda")
        runs[name] = (rows, {**dict(be.stats), "seconds": round(dt, 2), "can_capture": be.dev.can_capture()})
    os.environ.pop("LLAMAPY_CUDA_REPLAY")
    os.environ.pop("LLAMAPY_CUDA_GRAPHS")
    walk = runs["walk"][0]
    out = [
        f"{path.name}: {len(prompt)}-token prompt + {n_decode} decodes, every layer and the output on the device",
        "",
        "| run | bit-identical to the walk | max abs diff | records | replays | captures | graph launches "
        "| capture failures | s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    same = {}
    for name, (rows, st) in runs.items():
        same[name] = bool(np.array_equal(rows, walk))
        out.append(
            f"| {name} | {'yes' if same[name] else '**NO**'} | {np.abs(rows - walk).max():.3g} | "
            f"{st.get('records', 0)} | {st.get('replays', 0)} | {st.get('captures', 0)} | "
            f"{st.get('graph_launches', 0)} | {st.get('capture_failures', 0)} | {st['seconds']} |"
        )
    g = runs["CUDA graph"][1]
    ok = same["replay"] and same["CUDA graph"]
    if not g["can_capture"]:
        out.append(
            "\nno CUDA graph capture on this device (the simulator, or no CuPy): the last run replayed"
        )
    elif g.get("graph_launches", 0) == 0 or g.get("capture_failures", 0):
        ok = False
        out.append("\n**the CUDA graph run launched no graph** (see the capture failures and graph.log)")
    if not same["walk again"]:
        out.append(
            "\n**the node walk itself is not deterministic** (two walks differ): a kernel, not the replay"
        )
    return ok, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("agree", "graph", "warm"))
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--md", type=Path, required=True, help="write the Markdown section here")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="Unix time: start no new file after")
    ap.add_argument(
        "--ngl", default="half,all,all+out", help="agree: -ngl values (numbers, half, all, all+out)"
    )
    ap.add_argument("--decode", type=int, default=None, help="decoded tokens (agree: 4, graph: 12)")
    ap.add_argument("--prompt", type=int, default=len(PROMPT), help=f"prompt tokens (at most {len(PROMPT)})")
    a = ap.parse_args(argv)
    global N_PROMPT
    N_PROMPT = max(1, min(a.prompt, len(PROMPT)))
    from llamapy.ggml.cuda.device import simulator

    sim = simulator()
    try:
        if a.what == "warm":  # compile the CPU kernels the reference runs use (a background job)
            from llamapy.model import Model

            lines, ok = [], True
            for f in a.files:
                t0 = time.perf_counter()
                model = Model.load(f)
                decode_rows(model, 0, _prompt(model), None, 1)
                lines.append(f"CPU warm-up on {f.name}: {time.perf_counter() - t0:.1f} s")
        elif a.what == "agree":
            ok, lines = run_agree(a.files, a.deadline, sim, a.decode or 4, a.ngl.split(","), a.md)
        else:
            ok, lines = run_graph(a.files[0], a.decode or 12)
    except Exception as e:
        traceback.print_exc()
        ok, lines = False, [f"**ERROR** {type(e).__name__}: {e}"]
    print("\n".join(lines), flush=True)
    a.md.write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
