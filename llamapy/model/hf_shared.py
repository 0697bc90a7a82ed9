"""``llamapy convert`` declarations several families share (see ``llamapy/model/hf.py``): LLaMA's
(``LLAMA_HF``: granite, mistral3 and smollm3 derive theirs from it), Gemma's ``gemma_params`` (Gemma 2
extends them) and the Qwen MoE expert sizes (``qwen_moe_params``: qwen2moe, qwen3moe), Granite's scales and fused expert FFNs (granite, granitemoe,
granitehybrid), Qwen3-Next / Qwen3.5's linear attention and MTP layers."""

from __future__ import annotations

from .hf import HFConvert

__all__ = [
    "LLAMA_HF",
    "bert_params",
    "bert_tensor",
    "gemma3_params",
    "gemma3_vocab",
    "gemma_params",
    "granite_moe_tensor",
    "granite_params",
    "qwen_linear_params",
    "qwen_linear_tensor",
    "qwen_moe_params",
    "qwen_mtp_blocks",
    "try_set_pooling_type",
]


def _llama_vocab(ctx, kv) -> None:
    """LlamaModel.set_vocab: add_prefix_space from tokenizer_config.json, SentencePiece else BPE; the
    Granite small models' vocab (49152) adds no BOS."""
    add_prefix_space = ctx.tokenizer_config().get("add_prefix_space")
    if add_prefix_space is not None:
        kv.add_add_space_prefix(add_prefix_space)
    ctx.set_vocab("spm|gpt2")
    if ctx.hparams.get("vocab_size", 32000) == 49152:
        kv.add_add_bos_token(False)


def _llama_rope_freqs(ctx):
    """LlamaModel.generate_extra_tensors: ``rope_freqs.weight`` for llama3 rope scaling."""
    import math

    import numpy as np

    rp = ctx.rope_parameters.get("full_attention", ctx.rope_parameters)
    if not rp or rp.get("rope_type", "").lower() != "llama3":
        return
    base = rp.get("rope_theta", 10000.0)
    dim = ctx.hparams.get("head_dim") or ctx.hparams["hidden_size"] // ctx.hparams["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, lo, hi = rp.get("factor", 8.0), rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs.astype(np.float32):
        wavelen = np.float32(2 * math.pi) / f
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    yield "rope_freqs.weight", np.array(out, dtype=np.float32)


LLAMA_HF = HFConvert(
    "llama",
    ("LLaMAForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"),
    vocab=_llama_vocab,
    permute_qk=True,
    vocab_size_key=True,
    rope_dim_key=True,
    extra_tensors=_llama_rope_freqs,
)


def gemma_params(ctx, kv) -> None:
    """GemmaModel.set_gguf_parameters (Gemma 2 adds its soft-capping and window)."""
    hp = ctx.hparams
    kv.add_context_length(hp["max_position_embeddings"])
    kv.add_embedding_length(hp["hidden_size"])
    kv.add_block_count(ctx.block_count)
    kv.add_feed_forward_length(hp["intermediate_size"])
    kv.add_head_count(hp["num_attention_heads"])
    kv.add_head_count_kv(hp.get("num_key_value_heads", hp["num_attention_heads"]))
    kv.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    kv.add_key_length(hp["head_dim"])
    kv.add_value_length(hp["head_dim"])
    kv.add_file_type(ctx.file_type)


def gemma3_params(ctx, kv) -> None:
    """Gemma3Model.set_gguf_parameters (after the common keys)."""
    hp = ctx.hparams
    kv.add_context_length(hp.get("max_position_embeddings", 131072))
    kv.add_head_count(hp.get("num_attention_heads", 8))
    kv.add_layer_norm_rms_eps(hp.get("rms_norm_eps", 1e-6))
    kv.add_key_length(hp.get("head_dim", 256))
    kv.add_value_length(hp.get("head_dim", 256))
    kv.add_rope_freq_base(
        ctx.rope_parameters.get("full_attention", ctx.rope_parameters).get("rope_theta", 1_000_000.0)
    )
    if final := hp.get("final_logit_softcapping"):
        kv.add_final_logit_softcapping(final)
    if hp.get("sliding_window_pattern") != 1:
        kv.add_sliding_window(hp["sliding_window"])
    kv.add_head_count_kv(hp.get("num_key_value_heads", 4))


def gemma3_vocab(ctx, kv) -> None:
    if (ctx.dir / "tokenizer.model").is_file():
        ctx.set_vocab("spm")
        kv.add_add_space_prefix(False)
    else:
        ctx.set_vocab("gpt2")


def qwen_moe_params(ctx, kv) -> None:
    """Qwen2MoeModel.set_gguf_parameters: the expert FFN sizes."""
    if (n := ctx.hparams.get("moe_intermediate_size")) is not None:
        kv.add_expert_feed_forward_length(n)
    if (n := ctx.hparams.get("shared_expert_intermediate_size")) is not None:
        kv.add_expert_shared_feed_forward_length(n)


def granite_params(ctx, kv) -> None:
    """GraniteModel.set_gguf_parameters: the *_multiplier hparams as *_scale keys (GraniteMoeModel adds the
    shared expert's size)."""
    hp = ctx.hparams
    if v := hp.get("attention_multiplier"):
        kv.add_attention_scale(v)
    if v := hp.get("embedding_multiplier"):
        kv.add_embedding_scale(v)
    if v := hp.get("residual_multiplier"):
        kv.add_residual_scale(v)
    if v := hp.get("logits_scaling"):
        kv.add_logit_scale(v)
    if ctx.decl.arch != "granite" and (v := hp.get("shared_intermediate_size")):
        kv.add_expert_shared_feed_forward_length(v)


def granite_moe_tensor(ctx, name, data, bid):
    """GraniteMoeModel.modify_tensors: JetMoE's fused ``input_linear`` (gate rows, then up rows) split into
    the experts' (or, without experts, the shared MLP's dense) gate and up."""
    if name.endswith("block_sparse_moe.input_linear.weight"):
        n_ff = ctx.hparams["intermediate_size"]
        if data.shape[-2] != 2 * n_ff:
            raise ValueError(f"fused expert FFN of {data.shape[-2]} rows, not 2 x intermediate_size {n_ff}")
        return [(f"blk.{bid}.ffn_gate_exps.weight", data[..., :n_ff, :]),
                (f"blk.{bid}.ffn_up_exps.weight", data[..., n_ff:, :])]  # fmt: skip
    has_experts = bool(ctx.hparams.get("num_local_experts"))
    if name.endswith("shared_mlp.input_linear.weight"):
        n_ff = ctx.hparams["shared_intermediate_size"]
        if data.shape[-2] != 2 * n_ff:
            raise ValueError(
                f"fused shared FFN of {data.shape[-2]} rows, not 2 x shared_intermediate_size {n_ff}"
            )
        sfx = "_shexp" if has_experts else ""
        return [
            (f"blk.{bid}.ffn_gate{sfx}.weight", data[:n_ff]),
            (f"blk.{bid}.ffn_up{sfx}.weight", data[n_ff:]),
        ]
    if not has_experts and name.endswith("shared_mlp.output_linear.weight"):
        return [(f"blk.{bid}.ffn_down.weight", data)]
    return [(name, data)]


# ---------------------------------------------------------------------------------------------
# Qwen3-Next and Qwen3.5 (llama.cpp's Qwen3NextModel, _LinearAttentionVReorderBase, _QwenMtpMixin)

_MTP_NAMES = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm",
              "norm": "shared_head.norm"}  # fmt: skip


def qwen_mtp_blocks(ctx, names: list[str]) -> int:
    """The MTP layers (``mtp_num_hidden_layers``, else counted from the ``mtp.layers.N`` tensors)."""
    if n := ctx.hparams.get("mtp_num_hidden_layers", 0):
        return n
    ids = [int(p[2]) for n in names if len(p := n.removeprefix("model.").split(".", 3)) == 4
           and p[0] == "mtp" and p[1] == "layers" and p[2].isdecimal()]  # fmt: skip
    return max(ids) + 1 if ids else 0


def _mtp_name(ctx, name: str) -> str:
    """``mtp.*`` as the layers after the model's (eh_proj, enorm, hnorm, shared_head.norm, the layer)."""
    name = name.removeprefix("model.") if name.startswith("model.mtp.") else name
    if not name.startswith("mtp."):
        return name
    n0 = ctx.hparams["num_hidden_layers"]
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[1] == "layers" and parts[2].isdecimal():
        return f"model.layers.{n0 + int(parts[2])}.{parts[3]}"
    if len(parts) == 3 and parts[1] in _MTP_NAMES:
        return f"model.layers.{n0}.{_MTP_NAMES[parts[1]]}.{parts[2]}"
    return name


def _reorder_v_heads(x, axis: int, n_k: int, n_v_per_k: int, head_dim: int):
    """V heads grouped by K head -> tiled (ggml's broadcast order) along ``axis``."""
    import numpy as np

    axis %= x.ndim
    shape = x.shape
    y = x.reshape(*shape[:axis], n_k, n_v_per_k, head_dim, *shape[axis + 1 :])
    return np.ascontiguousarray(np.swapaxes(y, axis, axis + 1)).reshape(shape)


def _qwen35_reorder(hp, name: str, data):
    import numpy as np

    n_k, n_v = hp.get("linear_num_key_heads", 0), hp.get("linear_num_value_heads", 0)
    if not (n_k > 0 and n_v > 0 and n_k != n_v and "linear_attn." in name):
        return data
    dk, dv, r = hp["linear_key_head_dim"], hp["linear_value_head_dim"], n_v // n_k
    if ".in_proj_qkv." in name:
        qk = dk * n_k * 2
        return np.concatenate([data[:qk], _reorder_v_heads(data[qk:], 0, n_k, r, dv)])
    if ".in_proj_z." in name:
        return _reorder_v_heads(data, 0, n_k, r, dv)
    if ".in_proj_b." in name or ".in_proj_a." in name:
        return _reorder_v_heads(data, 0, n_k, r, 1)
    if ".A_log" in name or ".dt_bias" in name or ".dt_proj" in name:
        if data.ndim == 1:
            return _reorder_v_heads(data[:, None], 0, n_k, r, 1)[:, 0]
        return _reorder_v_heads(data, -1, n_k, r, 1)
    if ".conv1d" in name:
        data = data.squeeze()
        qk = dk * n_k * 2
        return np.concatenate([data[:qk], _reorder_v_heads(data[qk:], 0, n_k, r, dv)])
    if ".out_proj." in name:
        return _reorder_v_heads(data, 1, n_k, r, dv)
    return data


def qwen_linear_tensor(ctx, name, data, bid):
    """Qwen3NextModel.modify_tensors (Qwen3.5 reorders the V heads first): A = -exp(A_log), dt_bias as
    dt_proj.bias, the conv kernel squeezed, every norm but the gated one stored as 1 + w, Qwen3-Next's
    fused in_proj_qkvz split into qkv and the gate."""
    import numpy as np

    name = _mtp_name(ctx, name)
    hp = ctx.hparams
    if ctx.decl.arch != "qwen3next":
        data = _qwen35_reorder(hp, name, data)
    if name.endswith(".A_log"):
        data = (-np.exp(data.astype(np.float64))).astype(np.float32)  # torch's float32 exp: rounded exactly
    elif name.endswith(".dt_bias"):
        name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
    elif "conv1d" in name:
        data = data.squeeze()
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        data = data + np.float32(1)
    if "in_proj_qkvz.weight" in name:
        dk, dv = hp["linear_key_head_dim"], hp["linear_value_head_dim"]
        n_v, n_k, n_embd = hp["linear_num_value_heads"], hp["linear_num_key_heads"], hp["hidden_size"]
        sizes = [dk, dk, n_v // n_k * dv, n_v // n_k * dv]
        x = data.T.reshape(n_embd, n_k, sum(sizes))
        q, k, v, z = np.split(x, np.cumsum(sizes)[:3], axis=-1)
        qkv = np.concatenate([t.reshape(n_embd, -1) for t in (q, k, v)], axis=-1).T
        bid = int(name.split(".")[2])
        return [(f"blk.{bid}.attn_qkv.weight", np.ascontiguousarray(qkv)),
                (f"blk.{bid}.attn_gate.weight", np.ascontiguousarray(z.reshape(n_embd, -1).T))]  # fmt: skip
    parts = name.split(".")
    if len(parts) == 5 and parts[3] in ("eh_proj", "enorm", "hnorm", "shared_head"):
        # the NextN names gguf-py's older tensor maps lack
        return [(f"blk.{parts[2]}.nextn.{parts[3]}.{parts[4]}", data)]
    if name.endswith(".shared_head.norm.weight"):
        return [(f"blk.{parts[2]}.nextn.shared_head_norm.weight", data)]
    return [(name, data)]


def qwen_linear_params(ctx, kv) -> None:
    """Qwen3NextModel.set_gguf_parameters (after Qwen2MoeModel's and the MTP count); Qwen3.5 always
    writes rope sections."""
    qwen_moe_params(ctx, kv)
    hp = ctx.hparams
    n_layer = hp["num_hidden_layers"]
    if (n_mtp := ctx.block_count - n_layer) > 0:
        kv.add_nextn_predict_layers(n_mtp)
    kv.add_ssm_conv_kernel(hp["linear_conv_kernel_dim"])
    kv.add_ssm_state_size(hp["linear_key_head_dim"])
    kv.add_ssm_group_count(hp["linear_num_key_heads"])
    kv.add_ssm_time_step_rank(hp["linear_num_value_heads"])
    kv.add_ssm_inner_size(hp["linear_value_head_dim"] * hp["linear_num_value_heads"])
    if (layer_types := hp.get("layer_types")) is not None:
        if len(layer_types) != n_layer:
            raise ValueError(f"layer_types has {len(layer_types)} entries, not num_hidden_layers {n_layer}")
        recurrent = [t == "linear_attention" for t in layer_types] + [False] * (ctx.block_count - n_layer)
        kv.add_array(f"{kv.arch}.attention.recurrent_layers", recurrent)  # (add_recurrent_layers)
    kv.add_full_attention_interval(hp.get("full_attention_interval", 4))
    rope_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    kv.add_rope_dimension_count(int(rope_dim * ctx.rope_parameters.get("partial_rotary_factor", 0.25)))
    if ctx.decl.arch != "qwen3next" and "mrope_section" not in ctx.rope_parameters:
        kv.add_rope_dimension_sections([11, 11, 10, 0])


# ---------------------------------------------------------------------------------------------
# BERT-like encoders (llama.cpp's BertModel and its subclasses)


def try_set_pooling_type(ctx, kv) -> None:
    """TextModel._try_set_pooling_type: sentence-transformers' pooling (modules.json), the classifier's."""
    import json

    import gguf

    modes = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS, "lasttoken": gguf.PoolingType.LAST}
    path = None
    if (ctx.dir / "modules.json").is_file():
        mods = json.loads((ctx.dir / "modules.json").read_text(encoding="utf-8"))
        path = next((m["path"] for m in mods if m["type"].endswith("Pooling")), None)
    if path is not None:
        pooling = json.loads((ctx.dir / path / "config.json").read_text(encoding="utf-8"))
        if pooling.get("pooling_mode_mean_tokens"):
            kv.add_pooling_type(gguf.PoolingType.MEAN)
        elif pooling.get("pooling_mode_cls_token"):
            kv.add_pooling_type(gguf.PoolingType.CLS)
        elif pooling.get("pooling_mode_lasttoken"):
            kv.add_pooling_type(gguf.PoolingType.LAST)
        elif pooling.get("pooling_mode") in modes:
            kv.add_pooling_type(modes[pooling["pooling_mode"]])
        else:
            raise ValueError("only MEAN, CLS and LAST pooling are supported")
    if (cp := ctx.hparams.get("classifier_pooling")) is not None:
        if cp not in ("cls", "mean"):
            raise ValueError(f"unsupported classifier_pooling {cp!r}")
        # (GGUFWriter.add_classifier_pooling_type, missing from older gguf-py)
        kv.add_uint32(f"{kv.arch}.classifier.pooling_type", int(modes[cp]))


def cls_out_labels(hp: dict) -> list | None:
    """BertModel's classifier labels (None for AutoConfig's two dummy ones)."""
    labels = {int(k): v for k, v in (hp.get("id2label") or {}).items()}
    if not labels or (len(labels) == 2 and labels.get(0) == "LABEL_0"):
        return None
    return [v for _k, v in sorted(labels.items())]


def bert_params(ctx, kv) -> None:
    """BertModel.set_gguf_parameters, after TextModel's."""
    kv.add_causal_attention(False)
    try_set_pooling_type(ctx, kv)
    if labels := cls_out_labels(ctx.hparams):
        kv.add_classifier_output_labels(labels)


_BERT_SKIP = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


def bert_tensor(ctx, name, data, bid):
    """BertModel.filter_tensors / modify_tensors: ``bert.`` prefix, gamma/beta, no pooler or MLM heads."""
    name = name.removeprefix("bert.")
    if name.endswith(".gamma"):
        name = name[:-6] + ".weight"
    if name.endswith(".beta"):
        name = name[:-5] + ".bias"
    if name in _BERT_SKIP or name.startswith(("cls.predictions", "cls.seq_relationship")):
        return []
    if cls_out_labels(ctx.hparams) and name in ("classifier.weight", "classifier.bias"):
        name = name.replace("classifier.", "classifier.out_proj.")
    return [(name, data)]
