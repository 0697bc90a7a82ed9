"""The Markdown report of ``benchmarks/exactness.py``."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import exactness_setup as S  # noqa: E402
from benchmarks.exactness_compare import PromptResult  # noqa: E402

# ---------------------------------------------------------------------------------------------
# driver and report


@dataclass
class ModelReport:
    name: str
    file: str
    types: str
    rows: list[tuple[str, PromptResult, int | None]] = field(
        default_factory=list
    )  # (prompt, result, f32-KV div)
    seconds: float = 0.0
    n_exact_forwards: int = 0
    types_set: set[str] = field(default_factory=set)
    verify: tuple[int, float, float] = (0, math.nan, math.nan)  # prompt tokens, max abs, relative
    # variant -> per prompt: (first divergence on exact's prefix, max abs and rms error per decode step)
    diag: dict[str, list[tuple[int | None, np.ndarray, np.ndarray]]] = field(default_factory=dict)


def _div(d: int | None) -> str:
    return "32/32" if d is None else f"{d}"


def _f(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2g}"


def report(reps: list[ModelReport], cmd: str, machine: str, elapsed: float) -> str:
    out = [
        "# Exactness on the decode path: llamapy and llama.cpp vs an exact float64 computation",
        "",
        f"- machine: {machine}",
        f"- command: `{cmd}` ({elapsed:.0f} s)",
        "- exact: the file's weights dequantized by llamapy (bit-identical to gguf-py's `dequantize` for every "
        "type in these files), in transformers' `LlamaForCausalLM` / `Gemma3ForCausalLM` in float64 (rotary "
        "angles in float64 too; eager attention). Checked against llamapy's NumPy backend (float32 weights and "
        "activations, f32 KV) on prompt 2 (or 1), every position: max |Δlogit| "
        + ", ".join(f"{r.verify[1]:.2g} ({r.name}, {r.verify[2]:.1g} of max |logit|)" for r in reps)
        + ". Exact greedy is computed with llamapy as the draft: one exact forward of the whole "
        "sequence checks every step (same arithmetic as a KV-cached decode); where exact's token differs, "
        "llamapy's cache is cut back there (`seq_rm`), fed exact's token, and continues; repeated until exact "
        "confirms all 32 steps.",
        f"- llamapy: `Context` (f16 KV cache, flash attention, {S.N_THREADS} thread(s)): the prompt in one batch "
        "(last row only, as a generation does), then one token per `decode` (the decode path), always on exact's "
        "prefix; its greedy output equals exact's up to the first step where its argmax differs. The prompt-path "
        "error is another decode of the prompt with every position's logits. Also run with an f32 KV cache.",
        f"- llama.cpp: `llama-server` 0.3.36 (`-t {S.N_THREADS}`, f16 KV) `/completion`, prompt as token ids, "
        f"`temperature 0`, `ignore_eos`, `n_probs {S.N_PROBS}`, `cache_prompt false`: its own greedy ids and the "
        f"top-{S.N_PROBS} log-probabilities per step (softmax of its raw logits).",
        f"- {len(S.PROMPTS)} held-out prompts (chat-formatted questions, code, prose, numbers; fixed in "
        f"`benchmarks/exactness.py`), the same token ids for all three, {S.N_GEN} greedy tokens, EOG masked. "
        "Step 0's logits come from the prompt batch (the prompt path), steps 1..31 from single-token decodes.",
        "",
    ]
    for rep in reps:
        rows = [r for _, r, _ in rep.rows]
        n = len(rows)
        py_ok = sum(r.py_div is None for r in rows)
        py32_ok = sum(d is None for _, _, d in rep.rows)
        cpp_ok = sum(r.cpp_div is None for r in rows)
        pm = max(r.prompt_err[0] for r in rows)
        prms = math.sqrt(np.mean([r.prompt_err[1] ** 2 for r in rows]))
        dec = [e for r in rows for e in r.dec_err]
        dec_all = [e for r in rows for e in r.dec_err_all]
        s0 = [r.step0_err for r in rows]
        lp0c, lp0p = max(r.lp0[0] for r in rows), max(r.lp0[1] for r in rows)
        lpd = [r.lp_dec for r in rows if r.n_lp_dec]
        lpdc, lpdp = (max(x[0] for x in lpd), max(x[1] for x in lpd)) if lpd else (math.nan, math.nan)
        lp_better = sum(x[1] < x[0] for x in lpd)
        py_untied = sum(r.py_div_untied is None for r in rows)
        cpp_untied = sum(r.cpp_div is None or r.cpp_tie for r in rows)
        ties = (
            [
                f"| the same up to exact ties (a token whose exact logit equals exact's top one; llama.cpp: its "
                f"first divergence such a tie, its prefix not exact's after it) | {py_untied}/{n} | | "
                f"{cpp_untied}/{n} |"
            ]
            if py_untied != py_ok or cpp_untied != cpp_ok
            else []
        )
        out += [
            f"## {rep.name}: {rep.file} ({rep.types}; {rep.seconds:.0f} s, {rep.n_exact_forwards} exact forwards)",
            "",
            "| | llamapy (f16 KV) | llamapy (f32 KV) | llama.cpp |",
            "| --- | --- | --- | --- |",
            f"| prompts whose 32 greedy tokens equal exact's | **{py_ok}/{n}** | {py32_ok}/{n} | **{cpp_ok}/{n}** |",
            *ties,
            f"| max \\|Δlogp\\| of llama.cpp's top-{S.N_PROBS} tokens, step 0 (prompt path), all prompts | "
            f"{_f(lp0p)} | | {_f(lp0c)} |",
            f"| same, decode steps on exact's prefix ({sum(r.n_lp_dec for r in rows)} steps) | {_f(lpdp)} | | "
            f"{_f(lpdc)} |",
            f"| prompts where that decode error is smaller | {lp_better}/{len(lpd)} | | "
            f"{len(lpd) - lp_better}/{len(lpd)} |",
            f"| max \\|p - p_exact\\| of llama.cpp's top token, those steps | {_f(max(r.top1_dp[1] for r in rows))} "
            f"| | {_f(max(r.top1_dp[0] for r in rows))} |",
            "",
            "llamapy's logit error vs exact, all n_vocab logits (logit units; max \\|exact logit\\| per prompt "
            f"{min(r.logit_scale for r in rows):.0f}-{max(r.logit_scale for r in rows):.0f}):",
            "",
            "| path | steps | max abs | rms |",
            "| --- | --- | --- | --- |",
            f"| prompt, one batch, every position | {sum(r.n_prompt for r in rows)} | {_f(pm)} | {_f(prms)} |",
            f"| step 0 (prompt batch, last row only) | {n} | {_f(max(e[0] for e in s0))} | "
            f"{_f(math.sqrt(np.mean([e[1] ** 2 for e in s0])))} |",
            f"| decode, steps where it agreed | {len(dec)} | {_f(max(e[0] for e in dec))} | "
            f"{_f(math.sqrt(np.mean([e[1] ** 2 for e in dec])))} |",
            f"| decode, every step (exact's prefix) | {len(dec_all)} | {_f(max(e[0] for e in dec_all))} | "
            f"{_f(math.sqrt(np.mean([e[1] ** 2 for e in dec_all])))} |",
            "",
        ]
        if rep.diag:
            out += [
                "Where the decode error comes from: variants on exact's tokens (teacher forcing), decode steps "
                "1..31 of every prompt; a variant 'agrees' on a prompt when its argmax is exact's token at all 32 "
                "steps. The exact-model rows round only the activations of the linear layers (float64 otherwise).",
                "",
                "| variant | prompts agreeing | max abs | rms |",
                "| --- | --- | --- | --- |",
            ]
            for label, per in rep.diag.items():
                mx = max(float(m.max()) for _, m, _ in per)
                rms = math.sqrt(float(np.mean(np.concatenate([r**2 for _, _, r in per]))))
                ok = sum(d is None for d, _, _ in per)
                out.append(f"| {label} | {ok}/{len(per)} | {_f(mx)} | {_f(rms)} |")
            out.append("")
        out += [
            "Per prompt: first step whose greedy token differs from exact's (32/32: none) and exact's margin "
            "(logits) of its own token over the other's there; llamapy's logit error (max abs / rms over the "
            f"vocabulary, worst step); max \\|Δlogp\\| of llama.cpp's top-{S.N_PROBS} (llama.cpp / llamapy).",
            "",
            "| # | prompt | n | llamapy | margin | f32 KV | llama.cpp | margin | prompt path | decode | "
            "Δlogp step 0 | Δlogp decode |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for i, (text, r, d32) in enumerate(rep.rows):
            short = text.replace("\n", "\\n").replace("|", "\\|")
            short = short if len(short) <= 40 else short[:38] + "…"
            de = max(r.dec_err_all, default=(math.nan, math.nan), key=lambda e: e[0])
            out.append(
                f"| {i + 1} | `{short}` | {r.n_prompt} | {_div(r.py_div)} | {_f(r.py_gap)} | {_div(d32)} | "
                f"{_div(r.cpp_div)} | {_f(r.cpp_gap)} | {_f(r.prompt_err[0])} / {_f(r.prompt_err[1])} | "
                f"{_f(de[0])} / {_f(de[1])} | {_f(r.lp0[0])} / {_f(r.lp0[1])} | "
                f"{_f(r.lp_dec[0])} / {_f(r.lp_dec[1])} |"
            )
        out.append("")
    return "\n".join(out) + "\n"
