"""EAGLE-3 speculative decoding: a one-layer head GGUF (``general.architecture = "eagle3"``, written here
with llamapy's GGUF writer as llama.cpp's converter lays it out) drafting from a tiny random-weight
target's hidden states, the target verifying. Checked: greedy output identical with and without the head
(a random head on random dense, MoE and hybrid targets), and a target/head pair built
so that the head must predict what the target will say (its first draft each round accepted: wrong
feature alignment, a missing d2t map or the wrong hidden state fail it); a head for another hidden size
or with extract layers the target lacks is an :class:`Eagle3Error`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.generation import GenerationParams, TokenSequence, generate  # noqa: E402
from llamapy.generation.eagle3 import Eagle3Draft, Eagle3Error, Eagle3Head, is_eagle3_file  # noqa: E402
from llamapy.ggml.types import GGMLType  # noqa: E402
from llamapy.model import Model  # noqa: E402
from tests.generation.eagle3_head import write_head  # noqa: E402
from tests.model import hf_tiny  # noqa: E402

hf_tiny._load_family_modules()
N = 64  # the tiny families' hidden size
OUT_PROJ = ("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")


class Vocab:
    n_tokens = hf_tiny.N_VOCAB

    def is_eog(self, t: int) -> bool:
        return False

    def token_to_piece(self, t: int, special: bool = False) -> bytes:
        return b"x"


def _tiny(root: Path, name: str, seed: int, scale: float | None = None) -> tuple[Path, dict[str, np.ndarray]]:
    """The family ``name`` with 4 layers; with ``scale`` its output projections multiplied by it."""
    fam = hf_tiny.FAMILIES[name]
    fam = dataclasses.replace(fam, name=f"{name}-4l", config_kw={**fam.config_kw, "num_hidden_layers": 4})
    tm = hf_tiny.make_tiny(fam, root, seed=seed)
    tm.write(GGMLType.F32)
    tensors = dict(tm.tensors[GGMLType.F32])
    if scale is None:
        return tm.files[GGMLType.F32], tensors
    for k in tensors:
        if k.endswith(OUT_PROJ):
            tensors[k] = tensors[k] * np.float32(scale)
    md = hf_tiny.metadata(fam, tm.hf.config, GGMLType.F32)
    path = hf_tiny.write_gguf(root / f"{name}-s{scale}.gguf", fam.arch, md, tensors, GGMLType.F32)
    return path, tensors


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("eagle3")
    try:
        dense, _ = _tiny(root, "llama", 3)
        moe, _ = _tiny(root, "qwen2moe", 4)
        hybrid, _ = _tiny(root, "lfm2", 6)  # short convolutions + attention: the state rolls back
        chain, ct = _tiny(root, "llama", 5, scale=0.0)
    finally:
        torch.set_num_threads(n)
    # the chain target says f(t) after t whatever came before (no attention / FFN output): its layer
    # inputs are all embed(t). This head reads g_{P-1} = embed(t_{P-1}) (fc = [I | 0 | 0]), adds nothing
    # to it (attention and FFN outputs zero) and applies the target's head: its draft id is
    # f(t_{P-1}) = t_P, which d2t = f maps to f(t_P): what the target says next.
    emb, onorm, out = ct["token_embd.weight"], ct["output_norm.weight"], ct["output.weight"]
    x = emb / np.sqrt((emb**2).mean(1, keepdims=True) + 1e-6) * onorm
    f = np.argmax(x @ out.T, axis=1).astype(np.int64)
    eye = np.eye(N, dtype=np.float32)
    zeros = np.zeros((N, N), np.float32)
    exact = {
        "fc.weight": np.concatenate([eye, zeros, zeros], 1),
        "blk.0.attn_output.weight": np.zeros((N, 64), np.float32),
        "blk.0.ffn_down.weight": np.zeros((N, 128), np.float32),
        "output_norm.weight": onorm,
        "output.weight": out,
        "d2t": f,
    }
    return {
        "dense": dense,
        "moe": moe,
        "hybrid": hybrid,
        "chain": chain,
        "head": write_head(root / "head.gguf"),
        # (in llama.cpp's converter layout: eagle3.target_layers, blk.0.attn_norm_2; the others in the
        # earlier one: extract_layers, hidden_norm)
        "exact": write_head(
            root / "exact.gguf", n_draft=hf_tiny.N_VOCAB, tensors=exact, llamacpp_layout=True
        ),
        "wide": write_head(root / "wide.gguf", n_tgt=96),
        "deep": write_head(root / "deep.gguf", layers=(1, 2, 4)),
        "f": f,
    }


PROMPT = [int(t) for t in np.random.default_rng(7).integers(0, hf_tiny.N_VOCAB, 24)]


def _run(model: Model, draft: Any, n: int = 32) -> list[int]:
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=16))  # the prompt in two chunks
    seq = TokenSequence(ctx)
    steps = generate(
        seq, lambda z: int(np.argmax(z)), Vocab(), PROMPT, GenerationParams(max_tokens=n), draft_model=draft
    )
    return [s.token for s in steps if s.token is not None]


@pytest.mark.parametrize("name", ["dense", "moe", "hybrid"])
def test_greedy_identical_with_a_random_head(files: dict[str, Any], name: str) -> None:
    model = Model.load(files[name])
    plain = _run(model, None)
    assert is_eagle3_file(files["head"]) and not is_eagle3_file(files[name])
    draft = Eagle3Draft(files["head"], model, n_draft=4, p_min=0.0, n_ctx=256)
    assert _run(model, draft) == plain
    assert draft.n_calls > 0 and draft.n_drafted > 0  # it drafted (random guesses, mostly rejected)


def test_a_head_that_knows_the_target_is_accepted(files: dict[str, Any]) -> None:
    model = Model.load(files["chain"])
    plain = _run(model, None)
    f = files["f"]
    assert all(b == f[a] for a, b in zip(plain, plain[1:], strict=False))  # the chain: t -> f(t)
    draft = Eagle3Draft(files["exact"], model, n_draft=3, p_min=0.0, n_ctx=256)
    assert _run(model, draft) == plain
    # each round's first guess is right (the later ones repeat it: right only on a fixed point of f)
    assert draft.n_accepted >= draft.n_calls - 1 >= 8, (draft.n_accepted, draft.n_calls, draft.n_drafted)
    print(f"eagle3 exact head: {draft.n_accepted}/{draft.n_drafted} drafts accepted in {draft.n_calls} calls")


def test_a_head_for_another_model_is_a_typed_error(files: dict[str, Any]) -> None:
    model = Model.load(files["dense"])
    with pytest.raises(Eagle3Error, match="hidden states of size 96"):
        Eagle3Head(files["wide"], model)
    with pytest.raises(Eagle3Error, match="extract_layers"):
        Eagle3Draft(files["deep"], model)
    with pytest.raises(Eagle3Error, match="not an EAGLE-3 head"):
        Eagle3Head(files["dense"], model)
