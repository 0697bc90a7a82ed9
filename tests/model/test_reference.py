"""Real models against llama.cpp's outputs in ../shared/reference: top-1 token wherever llama.cpp's
top-2 margin exceeds 0.1, logit differences, and greedy continuations. All prompts go through one
multi-sequence batch (as the server's continuous batching does), and greedy decoding advances all
sequences together, one token each per decode."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.batch import Batch
from llamapy.context import Context, ContextParams
from llamapy.model import Model
from tests.util import shared_path

# the architectures these llama.cpp reference cases cover (general.architecture -> reference name);
# tests/model/test_contract.py requires every registered architecture to have an oracle case
REFERENCE_ARCHS = {"llama": "smollm2-135m-q4_1", "gemma3": "gemma3-270m-q4_k_m"}


def run_prompts(model: Model, z, n_greedy: int) -> tuple[list[np.ndarray], list[list[int]]]:
    prompts = [z[f"p{i}_ids"].tolist() for i in range(6)]
    ctx = Context(model, ContextParams(n_ctx=512, n_batch=512, n_seq_max=len(prompts)))
    b = Batch()
    for s, ids in enumerate(prompts):
        for p, t in enumerate(ids):
            b.add(t, p, [s], True)
    ctx.decode(b)
    starts = np.cumsum([0] + [len(p) for p in prompts])
    logits = [ctx.get_logits()[starts[s] : starts[s + 1]].copy() for s in range(len(prompts))]
    greedy = [[int(lg[-1].argmax())] for lg in logits]
    for step in range(n_greedy - 1):
        b = Batch()
        for s, ids in enumerate(prompts):
            b.add(greedy[s][-1], len(ids) + step, [s], True)
        ctx.decode(b)
        for s in range(len(prompts)):
            greedy[s].append(int(ctx.get_logits_ith(s).argmax()))
    return logits, greedy


def check(
    name: str,
    model_path,
    n_greedy: int,
    max_diff: float,
    mean_diff: float,
    min_greedy: int,
    top1_margin: float = 0.1,
) -> None:
    z = np.load(shared_path("reference", name, "logits.npz"))
    model = Model.load(model_path)
    logits, greedy = run_prompts(model, z, n_greedy)
    diffs = []
    for i, lg in enumerate(logits):
        top_ids, top_l = z[f"p{i}_top_ids"], z[f"p{i}_top_logits"]
        margin = top_l[:, 0] - top_l[:, 1]
        agree = lg.argmax(-1) == top_ids[:, 0]
        assert np.all(agree | (margin <= top1_margin)), (
            f"prompt {i}: top-1 differs at {np.flatnonzero(~agree)}"
        )
        diffs.append(np.abs(np.take_along_axis(lg, top_ids, axis=1) - top_l).ravel())
        diffs.append(np.abs(lg[-1] - z[f"p{i}_last_logits"]))
    d = np.concatenate(diffs)
    print(f"{name}: max |dlogit| {d.max():.3f}, mean {d.mean():.4f}")
    assert d.max() < max_diff and d.mean() < mean_diff
    # the same prompts one token at a time: the mat-vec kernels (k-quants: with 8-bit activations) instead
    # of the dequantized tiles of a long batch
    diffs = []
    for i in range(6):
        ids = z[f"p{i}_ids"].tolist()
        ctx = Context(model, ContextParams(n_ctx=512))
        rows = []
        for p, t in enumerate(ids):
            ctx.decode(Batch.from_tokens([t], pos0=p))
            rows.append(ctx.get_logits_ith(-1).copy())
        diffs.append(
            np.abs(np.take_along_axis(np.array(rows), z[f"p{i}_top_ids"], axis=1) - z[f"p{i}_top_logits"])
        )
    d = np.concatenate([x.ravel() for x in diffs])
    print(f"{name}, one token at a time: max |dlogit| {d.max():.3f}, mean {d.mean():.4f}")
    assert d.max() < max_diff and d.mean() < mean_diff
    same = [g == z[f"p{i}_greedy"][:n_greedy].tolist() for i, g in enumerate(greedy)]
    print(f"{name}: greedy {n_greedy} tokens equal on {sum(same)}/6 prompts")
    assert sum(same) >= min_greedy
    # where a continuation parts from llama.cpp's, it must be at a near-tie: fed llama.cpp's tokens up
    # to that point, our logits for its choice and ours differ by less than 0.5 (the logit noise from
    # llama.cpp's 8-bit activations has a std of ~0.13 per logit, ~0.2 for a difference of two)
    for i, g in enumerate(greedy):
        ref = z[f"p{i}_greedy"][:n_greedy].tolist()
        k = next((j for j, (a, b) in enumerate(zip(g, ref, strict=False)) if a != b), None)
        if k is None:
            continue
        ctx = Context(model, ContextParams(n_ctx=512))  # the prompt, then one token at a time as above
        ids = z[f"p{i}_ids"].tolist()
        ctx.decode(Batch.from_tokens(ids))
        for j, t in enumerate(ref[:k]):
            ctx.decode(Batch.from_tokens([t], pos0=len(ids) + j))
        lg = ctx.get_logits_ith(-1)
        ours = int(lg.argmax())
        print(f"prompt {i}: parts at token {k}, margin {lg[ours] - lg[ref[k]]:.4f}")
        assert ours == ref[k] or lg[ours] - lg[ref[k]] < 0.5


def test_smollm2_matches_llama_cpp(smollm2_path):
    # measured: max 1.16, mean 0.12 (llama.cpp rounds activations to 8 bits in its matmuls); one token at a
    # time (top-64 logits only) max 1.16, mean 0.17; 4/6 greedy, prompt 0 parts at token 5 (margin 0.22),
    # prompt 4 at token 2 (margin 0.08)
    check("smollm2-135m-q4_1", smollm2_path, 16, max_diff=2.0, mean_diff=0.25, min_greedy=4)


@pytest.mark.slow
def test_gemma3_matches_llama_cpp(gemma3_path):
    # measured: max 1.87, mean 0.19 (one token at a time: max 1.39, mean 0.24); greedy equal on 4/6 prompts
    # for 8 tokens; prompts 1 and 4 part at token 3, where fed one sequence at a time our argmax is
    # llama.cpp's token (margin 0: the six-sequence batch rounds differently). 8 tokens keep the test short.
    # Top-1 is required where llama.cpp's margin exceeds 1.0, not 0.1: on this model the prompt path's logits
    # (activations rounded to Q8_K, as llama.cpp's) carry ~0.5 rms of noise against the exact computation
    # (benchmarks/results/exactness.md), and it is chaotic: a float re-association of ~3e-7 (the Q4_K 8-row
    # kernel q4k_x8 against the plain one, the same integer sums) flips some int8 roundings of the next
    # layer's activations and moves logits by up to 1.3. Measured on prompt 2: both orders are equally close
    # to llama.cpp (mean |dlogit| 0.24 vs 0.26), and prompt 4's top-1 flips at a margin of 0.6.
    # With Q8_0 repacked (q80_x8: its ten Q8_0 tensors' prompt rows multiply 16-bit activations, not floats):
    # max 1.999, mean 0.267, greedy equal on 3/6; against the exact float64 computation on and off are alike
    # (benchmarks/results/exactness_stop41_gemma3{,_q80x8}.md: greedy equal to exact's on 15/24 prompts both,
    # llama.cpp 11/24), so the thresholds below leave room for that chaos, not for a real regression.
    check("gemma3-270m-q4_k_m", gemma3_path, 8, max_diff=2.3, mean_diff=0.32, min_greedy=3, top1_margin=1.0)
