"""LoRA adapters applied in the graph (``W x + s B (A x)``) against the merged weights, several at once,
hot swap, and adapters that do not fit refused."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.batch import Batch
from llamapy.context import Context, ContextParams
from llamapy.errors import LlamapyError
from llamapy.model import Model
from llamapy.model.lora import LoraAdapter, LoraError
from tests.model.lora_files import merged, random_pairs, write_lora
from tests.model.tiny import llama_config, random_llama_weights, write_gguf

TOKS = [3, 17, 42, 5, 9, 33, 60, 1, 8]
ADAPTED = ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.attn_v.weight", "blk.0.ffn_down.weight",
           "blk.1.ffn_gate.weight", "output.weight"]  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    cfg = llama_config()
    w = random_llama_weights(cfg, seed=5)
    base = write_gguf(d / "base.gguf", "llama", cfg, w)
    p1 = random_pairs(w, ADAPTED, rank=4, seed=1)
    p2 = random_pairs(w, ["blk.0.attn_k.weight", "blk.0.attn_q.weight"], rank=2, seed=2)
    lora1 = write_lora(d / "l1.gguf", "llama", p1, alpha=8.0)  # scale alpha / rank = 2
    lora2 = write_lora(d / "l2.gguf", "llama", p2)  # alpha 0: scale as given
    both = merged(merged(w, p1, 0.5 * 8.0 / 4), p2, 1.5)
    ref1 = write_gguf(d / "m1.gguf", "llama", cfg, merged(w, p1, 8.0 / 4))
    ref12 = write_gguf(d / "m12.gguf", "llama", cfg, both)
    return dict(dir=d, cfg=cfg, w=w, base=base, lora1=lora1, lora2=lora2, ref1=ref1, ref12=ref12)


def _logits(path_or_model, adapters=()) -> np.ndarray:
    m = path_or_model if isinstance(path_or_model, Model) else Model.load(path_or_model)
    ctx = Context(m, ContextParams(n_ctx=256, type_k="f32", type_v="f32"))
    ctx.set_adapters_lora([(LoraAdapter.load(p, m), s) for p, s in adapters])
    ctx.decode(Batch.from_tokens(TOKS, logits_all=True))
    return ctx.get_logits().copy()


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_one_adapter_matches_merged_weights(files):
    got = _logits(files["base"], [(files["lora1"], 1.0)])
    ref = _logits(files["ref1"])
    assert _rel(got, ref) < 1e-5
    assert _rel(got, _logits(files["base"])) > 1e-2  # the adapter moves the logits


def test_two_adapters_with_scales_match_merged(files):
    got = _logits(files["base"], [(files["lora1"], 0.5), (files["lora2"], 1.5)])
    assert _rel(got, _logits(files["ref12"])) < 1e-5


def test_hot_swap_and_clear(files):
    m = Model.load(files["base"])
    ctx = Context(m, ContextParams(n_ctx=256, type_k="f32", type_v="f32"))
    ad = LoraAdapter.load(files["lora1"], m)
    outs = []
    for action in ("none", "set", "clear", "rm"):
        if action == "set":
            ctx.set_adapter_lora(ad, 1.0)
        elif action == "clear":
            ctx.clear_adapter_lora()
        elif action == "rm":
            ctx.set_adapter_lora(ad, 1.0)
            assert ctx.rm_adapter_lora(ad) and not ctx.rm_adapter_lora(ad)
        ctx.memory.clear()
        ctx.decode(Batch.from_tokens(TOKS, logits_all=True))
        outs.append(ctx.get_logits().copy())
    assert _rel(outs[1], _logits(files["ref1"])) < 1e-5
    np.testing.assert_array_equal(outs[0], outs[2])
    np.testing.assert_array_equal(outs[0], outs[3])


def test_quantized_adapter_close(files, tmp_path):
    from llamapy.ggml.types import GGMLType

    pairs = random_pairs(files["w"], ["blk.0.attn_q.weight", "blk.1.ffn_down.weight"], rank=32, seed=7)
    q = write_lora(tmp_path / "q.gguf", "llama", pairs, ggml_type=GGMLType.Q8_0)
    ref = write_gguf(tmp_path / "mq.gguf", "llama", files["cfg"], merged(files["w"], pairs, 1.0))
    assert _rel(_logits(files["base"], [(q, 1.0)]), _logits(ref)) < 2e-2


@pytest.mark.parametrize(
    "case, match",
    [
        ("arch", "architecture 'qwen2'"),
        ("type", "general.type"),
        ("adapter_type", "adapter.type"),
        ("missing_b", "missing its lora_b"),
        ("unknown", "does not exist in the base model"),
        ("shape", "do not fit"),
        ("suffix", "unexpected suffix"),
    ],
)
def test_adapter_that_does_not_fit_is_refused(files, tmp_path, case, match):
    w = files["w"]
    pairs = random_pairs(w, ["blk.0.attn_q.weight"], rank=4)
    meta: dict = {}
    arch = "llama"
    if case == "arch":
        arch = "qwen2"
    elif case == "type":
        meta["general.type"] = "model"
    elif case == "adapter_type":
        meta["adapter.type"] = "ia3"
    elif case == "unknown":
        pairs = {"blk.9.attn_q.weight": pairs["blk.0.attn_q.weight"]}
    elif case == "shape":
        a, b = pairs["blk.0.attn_q.weight"]
        pairs = {"blk.0.attn_k.weight": (a, b)}  # attn_k is (32, 64): B has 64 rows
    path = write_lora(tmp_path / "bad.gguf", arch, pairs, meta=meta)
    if case in ("missing_b", "suffix"):
        from llamapy.gguf.writer import GGUFWriter

        gw = GGUFWriter(tmp_path / "bad.gguf", arch="llama")
        gw.add_key_value("general.type", "adapter")
        gw.add_key_value("adapter.type", "lora")
        a, _ = pairs["blk.0.attn_q.weight"]
        gw.add_tensor("blk.0.attn_q.weight.lora_a" if case == "missing_b" else "blk.0.attn_q.weight.x", a)
        gw.write()
        gw.close()
    m = Model.load(files["base"])
    with pytest.raises(LoraError, match=match):
        LoraAdapter.load(path, m)


def test_bad_scale_and_not_an_adapter(files):
    m = Model.load(files["base"])
    ctx = Context(m, ContextParams(n_ctx=256))
    ad = LoraAdapter.load(files["lora1"], m)
    with pytest.raises(LlamapyError, match="finite"):
        ctx.set_adapter_lora(ad, float("nan"))
    with pytest.raises(LlamapyError, match="not a LoRA adapter"):
        ctx.set_adapters_lora([("x", 1.0)])
    with pytest.raises(LoraError, match="not found"):
        LoraAdapter.load(files["dir"] / "nope.gguf", m)


def test_llama_lora_path(files):
    from llamapy import Llama

    llm = Llama(str(files["base"]), lora_path=str(files["lora1"]), lora_scale=1.0, n_ctx=256, verbose=False)
    ref = Llama(str(files["ref1"]), n_ctx=256, verbose=False)
    assert [s for _, s in llm.ctx.lora_adapters] == [1.0]
    outs = []
    for m in (llm, ref):
        m.ctx.decode(Batch.from_tokens(TOKS, logits_all=True))
        outs.append(m.ctx.get_logits().copy())
    assert _rel(outs[0], outs[1]) < 1e-5
    with pytest.raises(LoraError, match="general.type is None"):  # a model file is not an adapter
        Llama(str(files["base"]), lora_path=str(files["ref1"]), n_ctx=256, verbose=False)
