"""EAGLE-3 drafts (``llamapy.generation.eagle3``): greedy tokens/s and acceptance without a draft and with
an EAGLE-3 head drafting 1 and 3 tokens.

    python benchmarks/bench_eagle3.py [-n 64] [-r 2] [-t 2] [--layers 8] [--hidden 256]

No packaged model has an EAGLE-3 head, so two setups (both greedy, output checked identical):

- synthetic: a random llama (``--layers`` x ``--hidden``, vocabulary 256, F32) with its attention and FFN
  outputs zeroed (the next token is a function f of the current one) and a head built to predict it (the
  test's "exact" pair, tests/generation/test_eagle3.py): its first guess each round is right, the later
  ones only on a fixed point of f. The machinery's cost at a known acceptance.
- SmolLM2-135M with a random head (576 wide, 1024 draft tokens, HF's extract layers 2/15/27,
  ``p_min`` 0: it drafts every step, almost nothing is accepted): the cost of drafting on a real model.

llama.cpp side by side (its ``llama-speculative-simple --spec-type draft-eagle3`` on the same SmolLM2 and a
head in its converter's layout): benchmarks/bench_spec_vs_llamacpp.py.
Writes benchmarks/results/speculative_eagle3.md with the machine line.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.harness import machine_line  # noqa: E402


class Vocab:
    n_tokens = 256

    def is_eog(self, t: int) -> bool:
        return False

    def token_to_piece(self, t: int, special: bool = False) -> bytes:
        return b"x"


def exact_pair(tmp: Path, n_layer: int, hidden: int) -> tuple[str, str]:
    """The chain target (outputs zeroed) and the head that predicts it."""
    import torch

    from llamapy.ggml.types import GGMLType
    from tests.generation.eagle3_head import write_head
    from tests.model import hf_tiny

    torch.set_num_threads(1)
    hf_tiny._load_family_modules()
    fam = hf_tiny.FAMILIES["llama"]
    kw = dict(fam.config_kw, num_hidden_layers=n_layer, hidden_size=hidden, intermediate_size=2 * hidden)
    fam = dataclasses.replace(fam, name=f"llama-bench{n_layer}x{hidden}", config_kw=kw)
    tm = hf_tiny.make_tiny(fam, tmp, seed=1)
    tm.write(GGMLType.F32)
    t = dict(tm.tensors[GGMLType.F32])
    for k in t:
        if k.endswith(("attn_output.weight", "ffn_down.weight")):
            t[k] = t[k] * np.float32(0)
    md = hf_tiny.metadata(fam, tm.hf.config, GGMLType.F32)
    target = hf_tiny.write_gguf(tmp / "chain.gguf", "llama", md, t, GGMLType.F32)
    emb, onorm, out = t["token_embd.weight"], t["output_norm.weight"], t["output.weight"]
    x = emb / np.sqrt((emb**2).mean(1, keepdims=True) + 1e-6) * onorm
    f = np.argmax(x @ out.T, axis=1).astype(np.int64)
    eye, z = np.eye(hidden, dtype=np.float32), np.zeros((hidden, hidden), np.float32)
    nh = max(1, hidden // 64)
    exact = {
        "fc.weight": np.concatenate([eye, z, z], 1),
        "blk.0.attn_output.weight": np.zeros((hidden, hidden), np.float32),
        "blk.0.ffn_down.weight": np.zeros((hidden, 2 * hidden), np.float32),
        "output_norm.weight": onorm,
        "output.weight": out,
        "d2t": f,
    }
    layers = (2, n_layer // 2, n_layer - 3)
    head = write_head(tmp / "exact-head.gguf", hidden, layers, 256, tensors=exact, n=hidden, nh=nh,
                      nkv=max(1, nh // 2), ff=2 * hidden)  # fmt: skip
    return str(target), str(head)


def run_tokens(model: Any, head: str | None, n_draft: int, prompt: list[int], n: int, threads: int,
               vocab: Any, p_min: float = 0.0) -> tuple[float, list[int], str]:  # fmt: skip
    from llamapy.context import Context, ContextParams
    from llamapy.generation import GenerationParams, TokenSequence, generate
    from llamapy.generation.eagle3 import Eagle3Draft

    ctx = Context(model, ContextParams(n_ctx=512, n_batch=128, n_threads=threads))
    draft = (
        Eagle3Draft(head, model, n_draft=n_draft, p_min=p_min, n_ctx=512, n_threads=threads) if head else None
    )
    t0 = time.perf_counter()
    steps = generate(TokenSequence(ctx), lambda z: int(np.argmax(z)), vocab, prompt,
                     GenerationParams(max_tokens=n), draft_model=draft)  # fmt: skip
    out = [s.token for s in steps if s.token is not None]
    dt = time.perf_counter() - t0
    note = ""
    if draft is not None:
        rate = draft.n_accepted / max(1, draft.n_drafted)
        note = f" (accepted {draft.n_accepted}/{draft.n_drafted} = {rate:.0%}, {draft.n_calls} rounds)"
    return len(out) / dt, out, note


def section(
    title: str, model: Any, head: str, prompt: list[int], a: argparse.Namespace, vocab: Any
) -> list[str]:
    cells, outs = [], []
    run_tokens(model, None, 0, prompt, 8, a.threads, vocab)  # warm-up: kernels and graphs of these shapes
    run_tokens(model, head, 3, prompt, 8, a.threads, vocab)
    for n_draft in (0, 1, 3):
        best, out, note = 0.0, [], ""
        for _ in range(max(1, a.rounds)):
            tps, out, note = run_tokens(
                model, head if n_draft else None, n_draft, prompt, a.n, a.threads, vocab
            )
            best = max(best, tps)
        cells.append(f"{best:.1f}{note}")
        outs.append(out)
        print(f"{title} n_draft {n_draft}: {cells[-1]}", flush=True)
    same = all(o == outs[0] for o in outs)
    return [f"| {title} | " + " | ".join(cells) + f" | {same} |"]


def main() -> int:
    from llamapy import hub
    from llamapy.model import Model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", "--rounds", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/speculative_eagle3.md"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_eagle3_"))
    lines = [
        '## EAGLE-3 drafts (`Llama(draft_model="head.gguf")`, `serve -md head.gguf`)',
        "",
        f"- machine at the start: {machine_line(load_avg=True)}",
        f"- {a.n} greedy tokens, {a.threads} threads, best of {a.rounds}; tokens/s with no draft and with the head "
        "drafting 1 and 3 tokens a round; `identical`: the three outputs are the same",
        "- synthetic: a random llama "
        f"({a.layers} layers x {a.hidden}, vocabulary 256, F32, outputs zeroed: next token = f(token)) with "
        "the head built to predict it, 64-token prompt; SmolLM2: a random head (p_min 0), 24-token prompt",
        "- llama.cpp side by side: benchmarks/bench_spec_vs_llamacpp.py (speculative_vs_llamacpp.md)",
        "",
        "| setup | no draft t/s | EAGLE-3 n_draft 1 | EAGLE-3 n_draft 3 | identical |",
        "| --- | --- | --- | --- | --- |",
    ]
    target, head = exact_pair(tmp, a.layers, a.hidden)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 256, 64)]
    lines += section(f"synthetic llama {a.layers}x{a.hidden}, exact head", Model.load(target), head, prompt, a,
                     Vocab())  # fmt: skip
    from tests.generation.eagle3_head import write_head

    smol = Model.load(str(hub.resolve_model(a.target)))
    md = smol.metadata
    arch = md["general.architecture"]
    n, n_layer = int(md[f"{arch}.embedding_length"]), int(md[f"{arch}.block_count"])
    rhead = write_head(tmp / "smol-head.gguf", n, (2, n_layer // 2, n_layer - 3), 1024, n=n, nh=9, nkv=3,
                       ff=256, n_vocab=int(smol.n_vocab))  # fmt: skip
    sprompt = list(smol.vocab.tokenize("The three primary colors are red, blue and", add_special=True))
    lines += section(
        f"SmolLM2-135M ({Path(smol.path).name}), random head", smol, str(rhead), sprompt, a, smol.vocab
    )
    lines.append(f"- load at the end: {os.getloadavg()[0]:.2f} (other engineers share the 2 cores)")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
