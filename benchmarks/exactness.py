"""Exactness on the decode path: llamapy and llama.cpp against an exact (float64) computation of the same
weights (issue 16, "Exactness must not be the price").

The exact model: every tensor of the GGUF file dequantized by llamapy's reader/dequantizer
(``llamapy.ggml.quants.dequantize``; bit-identical to gguf-py's for the types of these files), loaded into
transformers' ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Gemma3ForCausalLM`` built from the file's
hyper-parameters (Llama's q/k rows un-permuted, Gemma's stored ``1 + w`` norms back to ``w``), run in float64
(rotary angles too). Each run first checks it against llamapy's NumPy backend (dequantized float32 weights and
activations, f32 KV cache) on one prompt.

For each model, 24 fixed held-out prompts (chat questions, code, prose, numbers), the SAME token ids fed to
all three, greedy (EOG tokens masked, ``ignore_eos``), 32 tokens:

- exact: greedy, checked with llamapy as the draft: one exact forward of the whole sequence verifies every
  step (the same arithmetic as a KV-cached decode, without 32 sequential float64 calls); at the first step
  where exact's token differs, llamapy's cache is cut back (``seq_rm``), fed exact's token, and goes on;
- llamapy: ``Context.decode`` of the prompt in one batch (last row only, as a generation does), then one
  token per decode (the decode path), always on exact's prefix, so every step's logits compare with exact's;
  its own greedy output equals exact's up to the first step where its argmax differs. The prompt path
  (every position's logits of the prompt in one batch) is measured separately;
- llama.cpp: ``llama-server`` (0.3.36 build, f16 KV as llamapy) ``/completion`` with the prompt as token
  ids, ``temperature 0``, ``n_probs``, ``cache_prompt false``: its free-running greedy ids and the
  top-``N_PROBS`` log-probabilities per step (softmax of its raw logits).

Diagnosis (skip with ``--no-diagnose``): llamapy with an f32 KV cache, the same tokens in one batch (the
prompt path), the k-quant mat-vec kernels bypassed in-process (``kquant_matvec_off``), and the exact model
with its linear layers' inputs rounded as llamapy's decode (Q8_K for k-quant weights) or llama.cpp's
(Q8_0/Q8_1/Q8_K for every quantized weight) mat-vec does.

Run: ``python benchmarks/exactness.py [--models smollm2,gemma3] [--prompts N] [--threads 1]
[--out benchmarks/results/exactness.md]`` (needs torch and transformers, the test-only dependencies, and
``benchmarks/build_llamacpp.sh``'s build). About 8 minutes on 2 busy cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import exactness_setup as S  # noqa: E402
from benchmarks.exactness_client import LlamaServer  # noqa: E402
from benchmarks.exactness_compare import (  # noqa: E402
    PyRun,
    compare,
    first_divergence,
    greedy_vs_exact,
    llamapy_forced,
    llamapy_prompt,
)
from benchmarks.exactness_diagnosis import KQ_FLOAT_LABEL, VEC_DOT, exact_logits_with, kquant_matvec_off  # noqa: E402
from benchmarks.exactness_reference import exact_logits, exact_model  # noqa: E402
from benchmarks.exactness_report import ModelReport, report  # noqa: E402
from benchmarks.harness import machine_line  # noqa: E402


def _types(path: Path) -> str:
    from collections import Counter

    from llamapy.gguf import GGUFReader

    with GGUFReader(path) as r:
        c = Counter(t.ggml_type.name for t in r)
    return ", ".join(f"{k} x{v}" for k, v in c.most_common())


def run_model(name: str, log: Any = print, diagnose: bool = True) -> ModelReport:
    from llamapy.batch import Batch
    from llamapy.context import Context
    from llamapy.model.model import Model
    from llamapy.vocab.vocab import eog_ids

    fname, tmpl = S.MODELS[name]
    path = S.MODELS_DIR / fname
    t0 = time.perf_counter()
    rep = ModelReport(name, fname, _types(path))
    rep.types_set = {x.split(" ")[0] for x in rep.types.split(", ")}
    lm = Model.load(str(path))
    forbid = eog_ids(lm.vocab)
    prompts = [
        lm.vocab.tokenize(tmpl.format(text) if kind == "chat" else text, add_special=True, parse_special=True)
        for kind, text in S.PROMPTS
    ]
    srv = LlamaServer(path)
    try:
        cpp = [srv.greedy(p) for p in prompts]
    finally:
        srv.close()
    log(f"{name}: llama.cpp done ({time.perf_counter() - t0:.0f} s)")
    exact = exact_model(path)
    log(f"{name}: exact model loaded ({time.perf_counter() - t0:.0f} s)")
    vp = prompts[min(1, len(prompts) - 1)]
    ref = exact_logits(exact, vp, slice(None))
    cnp = Context(lm, n_ctx=256, n_threads=S.N_THREADS, backend="numpy", type_k="f32", type_v="f32")
    cnp.decode(Batch.from_tokens(vp, pos0=0, logits_all=True))
    d = np.abs(cnp.get_logits().astype(np.float64) - ref)
    rep.verify = (len(vp), float(d.max()), float(d.max() / np.abs(ref).max()))
    del cnp
    log(
        f"{name}: exact vs llamapy's NumPy backend: max abs {rep.verify[1]:.2g} ({rep.verify[2]:.2g} relative)"
    )
    sims: dict[str, set[str]] = {}
    if diagnose:
        kq = {t for t in rep.types_set if t.endswith("_K")}
        if kq:
            sims[
                "exact + llamapy's decode rounding (activations to Q8_K for " + "/".join(sorted(kq)) + ")"
            ] = kq
        q = {t for t in rep.types_set if t in VEC_DOT}
        sims["exact + llama.cpp's rounding (activations to Q8_0/Q8_1/Q8_K for every quantized weight)"] = q
    ctx_f = None
    if diagnose and any(t.endswith("_K") for t in rep.types_set):
        ctx_f = Context(
            lm, n_ctx=S.N_CTX, n_threads=S.N_THREADS
        )  # its graphs are built with kquant_matvec_off
    ctx = Context(lm, n_ctx=S.N_CTX, n_threads=S.N_THREADS)  # defaults: f16 KV cache, flash attention
    ctx32 = Context(lm, n_ctx=S.N_CTX, n_threads=S.N_THREADS, type_k="f32", type_v="f32")
    for (kind, text), p, c in zip(S.PROMPTS, prompts, cpp, strict=True):
        ex_prompt = exact_logits(exact, p, slice(None))
        py_prompt = llamapy_prompt(ctx, p)
        ex_ids, ex_steps, py_steps, rounds = greedy_vs_exact(exact, ctx, p, forbid)
        rep.n_exact_forwards += rounds
        py32 = llamapy_forced(ctx32, p, ex_ids)
        res = compare(ex_ids, ex_prompt, ex_steps, PyRun(py_prompt, py_steps), c, len(p), forbid)
        rep.rows.append((f"{kind}: {text}", res, first_divergence(py32, ex_ids, forbid)))
        if diagnose:
            seq = p + [int(t) for t in ex_ids[:-1]]
            variants = {"llamapy decode, f16 KV (as above)": py_steps, "llamapy decode, f32 KV": py32}
            ctx.memory.clear()
            ctx.decode(Batch.from_tokens(seq, pos0=0, logits_all=True))
            variants["llamapy, the same tokens in one batch (prompt path), f16 KV"] = ctx.get_logits()[
                len(p) - 1 :
            ]
            if ctx_f is not None:
                with kquant_matvec_off():
                    variants[KQ_FLOAT_LABEL] = llamapy_forced(ctx_f, p, ex_ids)
            for label, hooks in sims.items():
                variants[label] = exact_logits_with(exact, hooks, seq, slice(len(p) - 1, None))
            for label, st in variants.items():
                d = np.abs(st.astype(np.float64) - ex_steps)
                rep.diag.setdefault(label, []).append(
                    (
                        first_divergence(st, ex_ids, forbid),
                        d[1:].max(axis=1),
                        np.sqrt(np.mean(d[1:] ** 2, axis=1)),
                    )
                )
        log(f"  {len(rep.rows):2d} n={len(p):3d} llamapy div {res.py_div} (f32 KV {rep.rows[-1][2]}), "
            f"llama.cpp div {res.cpp_div}")  # fmt: skip
    del exact
    rep.seconds = time.perf_counter() - t0
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3", help="comma-separated: " + ", ".join(S.MODELS))
    ap.add_argument("--out", default=str(S.ROOT / "benchmarks/results/exactness.md"))
    ap.add_argument(
        "--threads", type=int, default=S.N_THREADS, help="threads for exact, llamapy and llama.cpp"
    )
    ap.add_argument(
        "--no-diagnose", action="store_true", help="skip the variants (f32 KV, one batch, simulations)"
    )
    ap.add_argument(
        "--prompts", type=int, default=len(S.PROMPTS), help="only the first N prompts (a quick try)"
    )
    args = ap.parse_args(argv)
    import torch

    S.N_THREADS = args.threads
    torch.set_num_threads(args.threads)
    del S.PROMPTS[args.prompts :]
    if not (S.LLAMACPP_BIN / "llama-server").exists():
        print(
            f"llama-server not found in {S.LLAMACPP_BIN} (benchmarks/build_llamacpp.sh builds it)",
            file=sys.stderr,
        )
        return 2
    t0 = time.perf_counter()
    machine = machine_line(load_avg=True, python=True)
    reps = [run_model(m.strip(), diagnose=not args.no_diagnose) for m in args.models.split(",") if m.strip()]
    cmd = "python benchmarks/exactness.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(reps, cmd.strip(), machine, time.perf_counter() - t0)
    out = Path(args.out)
    if out.exists() and "\n## Findings" in out.read_text():  # hand-written: kept, placed after the header
        old = out.read_text()
        findings = old[old.index("\n## Findings") :].split("\n## ", 2)[1]
        head, rest = text.split("\n## ", 1)
        text = f"{head}\n## {findings.rstrip()}\n\n## {rest}"
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
