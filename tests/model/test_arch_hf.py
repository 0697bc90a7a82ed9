"""Families with no small real file: tiny random-weight Hugging Face models, converted to GGUF with our
writer (F32, F16 and Q8_0), must give the logits of transformers (test-only oracle) with the same weights.

Float files: max |ours - hf| <= 1e-3 * max |hf| (F16 files are compared with HF weights rounded to
F16). Q8_0 files: a looser bound and the same top token on most positions.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from llamapy.batch import Batch  # noqa: E402
from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.model import Model  # noqa: E402
from tests.model.tiny import write_gguf  # noqa: E402

V, D, FF, L, NH, NKV, HD = 96, 64, 96, 2, 2, 1, 32
TOKENS = [3, 17, 90, 5, 41, 8, 63, 2, 77, 30, 11, 54, 9, 70]


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's q/k permutation for llama (HF rotate-half -> ggml adjacent pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _common(sd: dict[str, np.ndarray], tied: bool) -> dict[str, np.ndarray]:
    out = {
        "token_embd.weight": sd["model.embed_tokens.weight"],
        "output_norm.weight": sd["model.norm.weight"],
    }
    if not tied and "lm_head.weight" in sd:
        out["output.weight"] = sd["lm_head.weight"]
    return out


_ATTN = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output", "qkv_proj": "attn_qkv",
         "q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}  # fmt: skip
_MLP = {"gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down", "gate_up_proj": "ffn_up"}
_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}  # fmt: skip


def convert(family: str, sd: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
    """HF state dict -> GGUF tensors, as llama.cpp's convert_hf_to_gguf.py does for these families."""
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    out = _common(sd, tied)
    gemma = family.startswith("gemma")
    norms = dict(_NORMS)
    if family in ("gemma2", "gemma3"):
        norms["post_attention_layernorm"] = "post_attention_norm"
    for name, w in sd.items():
        if not name.startswith("model.layers."):
            continue
        parts = name.split(".")
        il, rest = int(parts[2]), parts[3:]
        p = f"blk.{il}."
        if rest[0] == "self_attn":
            t = _ATTN[rest[1]] + "." + rest[-1]
            if family in ("llama", "llama3", "mistral") and rest[1] in ("q_proj", "k_proj"):
                w = _permute(w, cfg.num_attention_heads if rest[1] == "q_proj" else cfg.num_key_value_heads)
            out[p + t] = w
        elif rest[0] == "mlp" and rest[1] == "experts":
            if rest[2] == "gate_up_proj":
                n = w.shape[1] // 2
                out[p + "ffn_gate_exps.weight"], out[p + "ffn_up_exps.weight"] = w[:, :n], w[:, n:]
            else:
                out[p + "ffn_down_exps.weight"] = w
        elif rest[0] == "mlp" and rest[1] == "gate":
            out[p + "ffn_gate_inp.weight"] = w
        elif rest[0] == "mlp":
            out[p + _MLP[rest[1]] + ".weight"] = w
        else:
            out[p + norms[rest[0]] + ".weight"] = w
    if gemma:  # Gemma's RMSNorm multiplies by (1 + w); the converter stores 1 + w
        for k in out:
            if k.endswith("norm.weight"):
                out[k] = out[k] + 1.0
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def _llama3_factors(theta: float, dim: int, rp: dict) -> np.ndarray:
    freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    old, lo, hi, f = (
        rp["original_max_position_embeddings"],
        rp["low_freq_factor"],
        rp["high_freq_factor"],
        rp["factor"],
    )
    out = []
    for fr in freqs:
        wl = 2 * math.pi / fr
        if wl < old / hi:
            out.append(1.0)
        elif wl > old / lo:
            out.append(f)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - s) / f + s))
    return np.array(out, dtype=np.float32)


def build(family: str):
    """(HF model, gguf arch, cfg dict for write_gguf, extra metadata, extra tensors)."""
    T = transformers
    base = dict(vocab_size=V, hidden_size=D, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=NH,
                num_key_value_heads=NKV, head_dim=HD, max_position_embeddings=256, rms_norm_eps=1e-6,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)  # fmt: skip
    meta: dict = {}
    extra: dict = {}
    arch = family
    theta = 10000.0
    if family in ("llama", "llama3"):
        rp = {"rope_type": "default", "rope_theta": theta}
        if family == "llama3":
            rp = {"rope_type": "llama3", "rope_theta": theta, "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
            extra["rope_freqs.weight"] = _llama3_factors(theta, HD, rp)
        cfg = T.LlamaConfig(**base, rope_parameters=rp)
        model, arch = T.LlamaForCausalLM(cfg), "llama"
    elif family == "mistral":
        cfg = T.MistralConfig(
            **base, sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": theta}
        )
        model, arch = T.MistralForCausalLM(cfg), "llama"
    elif family == "qwen2":
        cfg = T.Qwen2Config(**base, rope_parameters={"rope_type": "default", "rope_theta": theta})
        model = T.Qwen2ForCausalLM(cfg)
    elif family == "qwen3":
        cfg = T.Qwen3Config(**base, rope_parameters={"rope_type": "default", "rope_theta": theta})
        model = T.Qwen3ForCausalLM(cfg)
    elif family == "qwen3moe":
        cfg = T.Qwen3MoeConfig(**base, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                               norm_topk_prob=True, rope_parameters={"rope_type": "default", "rope_theta": theta})  # fmt: skip
        model = T.Qwen3MoeForCausalLM(cfg)
        meta = {
            "qwen3moe.expert_count": 4,
            "qwen3moe.expert_used_count": 2,
            "qwen3moe.expert_feed_forward_length": 32,
        }
    elif family == "gemma":
        cfg = T.GemmaConfig(**base, hidden_activation="gelu_pytorch_tanh",
                            rope_parameters={"rope_type": "default", "rope_theta": theta})  # fmt: skip
        model = T.GemmaForCausalLM(cfg)
    elif family == "gemma2":
        cfg = T.Gemma2Config(**base, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=HD,
                             sliding_window=4, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                             rope_parameters={"rope_type": "default", "rope_theta": theta})  # fmt: skip
        model = T.Gemma2ForCausalLM(cfg)
        meta = {"gemma2.attention.sliding_window": 4, "gemma2.attn_logit_softcapping": 50.0,
                "gemma2.final_logit_softcapping": 30.0}  # fmt: skip
    elif family == "gemma3":
        base["num_hidden_layers"] = 6
        cfg = T.Gemma3TextConfig(**base, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=HD,
                                 sliding_window=4, rope_parameters={
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                     "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})  # fmt: skip
        model = T.Gemma3ForCausalLM(cfg)
        theta = 1000000.0
        meta = {"gemma3.attention.sliding_window": 4}
    elif family == "phi3":
        orig = 512  # above our context: short factors, as HF uses for sequences shorter than this
        short = [1.0 + 0.05 * i for i in range(HD // 2)]
        long = [1.0 + 0.5 * i for i in range(HD // 2)]
        base["max_position_embeddings"] = 4096
        cfg = T.Phi3Config(**base, sliding_window=None, original_max_position_embeddings=orig,
                           rope_parameters={"rope_type": "longrope", "rope_theta": theta, "short_factor": short,
                                            "long_factor": long, "original_max_position_embeddings": orig})  # fmt: skip
        model = T.Phi3ForCausalLM(cfg)
        scale = 4096 / orig
        meta = {"phi3.rope.scaling.attn_factor": math.sqrt(1 + math.log(scale) / math.log(orig)),
                "phi3.rope.scaling.original_context_length": orig, "phi3.context_length": 4096}  # fmt: skip
        extra = {"rope_factors_short.weight": np.array(short, np.float32),
                 "rope_factors_long.weight": np.array(long, np.float32)}  # fmt: skip
    else:  # pragma: no cover
        raise ValueError(family)
    wcfg = dict(n_vocab=V, n_embd=D, n_layer=base["num_hidden_layers"], n_head=NH, n_head_kv=NKV, n_ff=FF,
                n_ctx=256, head_dim=HD, rope_base=theta, eps=1e-6)  # fmt: skip
    return model.eval(), arch, wcfg, meta, extra


FAMILIES = ["llama", "llama3", "mistral", "qwen2", "qwen3", "qwen3moe", "gemma", "gemma2", "gemma3", "phi3"]


def _randomize(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 1.0 if "embed" in name else 0.15
            if name.endswith("norm.weight"):
                p.copy_(
                    (torch.randn(p.shape, generator=g) * 0.1)
                    + (0.0 if "gemma" in type(model).__name__.lower() else 1.0)
                )
            else:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def _hf_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits[0].float().numpy()


def _ours(path, n_ctx: int = 256, flash_attn: bool = True) -> np.ndarray:
    m = Model.load(path)
    ctx = Context(m, ContextParams(n_ctx=n_ctx, type_k="f32", type_v="f32", flash_attn=flash_attn))
    ctx.decode(Batch.from_tokens(TOKENS[:5], logits_all=True))
    first = ctx.get_logits().copy()
    ctx.decode(Batch.from_tokens(TOKENS[5:], logits_all=True))  # second batch continues from the cache
    return np.concatenate([first, ctx.get_logits()])


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_transformers(family, tmp_path):
    torch.manual_seed(0)
    model, arch, wcfg, meta, extra = build(family)
    model.config._attn_implementation = "eager"
    _randomize(model, seed=FAMILIES.index(family))
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    tensors = {**convert(family, sd, model.config), **extra}
    ref = _hf_logits(model)
    scale = np.abs(ref).max()

    f32 = write_gguf(tmp_path / "f32.gguf", arch, wcfg, tensors, "f32", meta)
    got = _ours(f32)
    assert np.abs(got - ref).max() <= 1e-3 * scale, f"{family} F32: max diff {np.abs(got - ref).max()}"
    if family in ("gemma2", "qwen3moe"):  # soft-capping / experts through the unfused attention path too
        assert np.abs(_ours(f32, flash_attn=False) - ref).max() <= 1e-3 * scale

    # F16 file against HF with weights rounded to F16 (2-D weights only, as the file stores them)
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(p.half().float())
    ref16 = _hf_logits(model)
    got16 = _ours(write_gguf(tmp_path / "f16.gguf", arch, wcfg, tensors, "f16", meta))
    assert np.abs(got16 - ref16).max() <= 1e-3 * scale, (
        f"{family} F16: max diff {np.abs(got16 - ref16).max()}"
    )

    gotq = _ours(write_gguf(tmp_path / "q8.gguf", arch, wcfg, tensors, "q8_0", meta))
    assert np.abs(gotq - ref).max() <= 0.1 * scale
    assert (gotq.argmax(-1) == ref.argmax(-1)).mean() >= 0.8
