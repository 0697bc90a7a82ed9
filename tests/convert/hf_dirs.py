"""Tiny Hugging Face checkpoint directories for the converter's tests (test-only: torch, transformers).

``make_hf_dir(case, root)`` writes ``config.json``, random weights as safetensors (NumPy's seeded
generator, so the bytes do not depend on torch's RNG; one shard or several with an index, F32 or BF16),
``generation_config.json`` and a tokenizer rebuilt from one of llama.cpp's vocab-only GGUF files in
``../shared/vocab``: ``tokenizer.json`` (GPT-2's byte-level BPE: its pre-tokenizer hash is llama.cpp's
"gpt-2" entry) or ``tokenizer.model`` (the LLaMA SentencePiece model, written as its protobuf).
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.util import shared_path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class Case:
    """One converter test case: a transformers config and how the directory is laid out."""

    name: str
    config_cls: str
    config_kw: dict[str, Any] = field(default_factory=dict)
    tokenizer: str = "bpe"  # "bpe" (tokenizer.json, GPT-2's), "bpe-glm" (+ GLM chat tokens), "spm" (LLaMA's)
    shards: int = 1
    dtype: str = "F32"  # "F32" or "BF16" (safetensors dtype)
    gemma_norms: bool = False  # norms stored as w (used as 1 + w)
    # (regex, replacement) on the state dict's names: the Hub's (legacy) names that transformers renames on
    # load (its conversion_mapping), e.g. Granite MoE's block_sparse_moe.input_linear
    rename: tuple[tuple[str, str], ...] = ()
    hub_config: dict[str, Any] = field(default_factory=dict)  # config.json keys as the Hub's files write them
    # MTP layers saved as the Hub's Qwen3-Next / Qwen3.5 files do (mtp.*; transformers drops them)
    mtp: int = 0
    model_cls: str = "AutoModelForCausalLM"  # the transformers class (AutoModel: encoders)
    mxfp4: bool = False  # gpt-oss's experts as the Hub's MXFP4 blocks and scales (quantization_config mxfp4)
    unfuse_experts: bool = False  # experts one by one (mlp.experts.N.gate_proj...), as the Hub's files


def _cfg(**kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    d.update(kw)
    return d


GRANITE_MOE_LEGACY = (
    (r"block_sparse_moe\.experts\.gate_up_proj$", "block_sparse_moe.input_linear.weight"),
    (r"block_sparse_moe\.experts\.down_proj$", "block_sparse_moe.output_linear.weight"),
    (r"block_sparse_moe\.router\.weight$", "block_sparse_moe.router.layer.weight"),
)

CASES: dict[str, Case] = {
    c.name: c
    for c in [
        Case("llama", "LlamaConfig", _cfg(rope_theta=10000.0), shards=2),
        Case("llama-spm", "LlamaConfig", _cfg(rope_theta=10000.0), tokenizer="spm", dtype="BF16"),
        Case("qwen2", "Qwen2Config", _cfg(tie_word_embeddings=True), tokenizer="spm"),
        Case("qwen3", "Qwen3Config", _cfg(head_dim=32)),
        Case(
            "qwen3moe",
            "Qwen3MoeConfig",
            _cfg(
                head_dim=16,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                norm_topk_prob=True,
            ),
        ),
        Case(
            "gemma",
            "GemmaConfig",
            _cfg(head_dim=16, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
            tokenizer="spm",
            gemma_norms=True,
        ),
        Case(
            "gemma2",
            "Gemma2Config",
            _cfg(
                num_hidden_layers=3,
                head_dim=16,
                query_pre_attn_scalar=16,
                sliding_window=4,
                attn_logit_softcapping=10.0,
                final_logit_softcapping=15.0,
                tie_word_embeddings=True,
            ),
            tokenizer="spm",
            gemma_norms=True,
        ),
        Case(
            "gemma3",
            "Gemma3TextConfig",
            _cfg(
                num_hidden_layers=6,
                head_dim=16,
                query_pre_attn_scalar=16,
                sliding_window=4,
                tie_word_embeddings=True,
            ),
            tokenizer="spm",
            gemma_norms=True,
        ),
        Case("phi3", "Phi3Config", _cfg(sliding_window=None), tokenizer="spm"),
        Case("smollm3", "SmolLM3Config", _cfg(num_hidden_layers=5)),
        Case("olmo2", "Olmo2Config", _cfg()),
        Case(
            "granite",
            "GraniteConfig",
            _cfg(
                embedding_multiplier=3.0,
                attention_multiplier=0.5,
                residual_multiplier=0.6,
                logits_scaling=4.0,
            ),
        ),
        Case("starcoder2", "Starcoder2Config", _cfg(sliding_window=None, norm_epsilon=1e-5)),
        Case(
            "command-r", "CohereConfig", _cfg(logit_scale=0.5, layer_norm_eps=1e-5, tie_word_embeddings=True)
        ),
        Case(
            "gpt2",
            "GPT2Config",
            dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, n_ctx=256, layer_norm_epsilon=1e-5),
        ),
        Case(
            "lfm2",
            "Lfm2Config",
            _cfg(
                num_hidden_layers=4,
                layer_types=["conv", "full_attention", "conv", "conv"],
                block_auto_adjust_ff_dim=False,
                norm_eps=1e-6,
                conv_L_cache=3,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
        ),
        Case("glm4", "Glm4Config", _cfg(head_dim=16), tokenizer="bpe-glm"),
        Case(
            "mistral3",
            "Ministral3Config",
            _cfg(
                head_dim=16,
                rope_parameters={
                    "rope_type": "yarn",
                    "rope_theta": 10000.0,
                    "factor": 16.0,
                    "original_max_position_embeddings": 16,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                    "llama_4_scaling_beta": 0.5,
                },
            ),
        ),
        Case(
            "granitemoe",
            "GraniteMoeConfig",
            _cfg(
                embedding_multiplier=3.0,
                attention_multiplier=0.5,
                residual_multiplier=0.6,
                logits_scaling=4.0,
                num_local_experts=4,
                num_experts_per_tok=2,
                intermediate_size=32,
            ),
            rename=GRANITE_MOE_LEGACY,
        ),
        Case(
            "granitehybrid",
            "GraniteMoeHybridConfig",
            _cfg(
                vocab_size=50264,
                embedding_multiplier=3.0,
                attention_multiplier=0.5,
                residual_multiplier=0.6,
                logits_scaling=4.0,
                num_local_experts=4,
                num_experts_per_tok=2,
                intermediate_size=32,
                shared_intermediate_size=64,
                layer_types=["mamba", "attention"],
                mamba_n_heads=8,
                mamba_d_head=16,
                mamba_n_groups=1,
                mamba_d_state=16,
                mamba_chunk_size=8,
            ),
            rename=GRANITE_MOE_LEGACY,
            hub_config={"layer_types": ["mamba", "attention"]},  # transformers 5 writes linear/full_attention
        ),
        Case(
            "qwen35",
            "Qwen3_5TextConfig",
            _cfg(
                head_dim=16,
                layer_types=["linear_attention", "full_attention"],
                full_attention_interval=2,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
            ),
            gemma_norms=True,
            hub_config={"mtp_num_hidden_layers": 1},
            mtp=1,
        ),
        Case(
            "qwen35moe",
            "Qwen3_5MoeTextConfig",
            _cfg(
                head_dim=16,
                layer_types=["linear_attention", "full_attention"],
                full_attention_interval=2,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=64,
            ),
            gemma_norms=True,
            hub_config={"mtp_num_hidden_layers": 1},
            mtp=1,
        ),
        Case(
            "qwen3next",
            "Qwen3NextConfig",
            _cfg(
                head_dim=16,
                layer_types=["linear_attention", "full_attention"],
                full_attention_interval=2,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=64,
            ),
            gemma_norms=True,
            mtp=1,  # no mtp_num_hidden_layers in Qwen3-Next's config: counted from the tensors
        ),
        Case(
            "deepseek2",
            "DeepseekV2Config",
            _cfg(
                num_key_value_heads=4,
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                n_shared_experts=1,
                first_k_dense_replace=1,
                kv_lora_rank=32,
                q_lora_rank=None,
                qk_nope_head_dim=16,
                qk_rope_head_dim=8,
                v_head_dim=16,
            ),
            unfuse_experts=True,
        ),
        Case(
            "glm4moe",
            "Glm4MoeConfig",
            _cfg(
                head_dim=16,
                attention_bias=True,
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                n_shared_experts=1,
                first_k_dense_replace=1,
                use_qk_norm=True,
                num_nextn_predict_layers=0,
            ),
            tokenizer="bpe-glm45",
            unfuse_experts=True,
        ),
        Case(
            "gpt-oss",
            "GptOssConfig",
            _cfg(
                head_dim=16,
                intermediate_size=64,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=4,
                rope_parameters={
                    "rope_type": "yarn",
                    "factor": 32.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "original_max_position_embeddings": 64,
                    "rope_theta": 150000.0,
                },
            ),
            mxfp4=True,
            hub_config={
                "quantization_config": {
                    "quant_method": "mxfp4",
                    "modules_to_not_convert": [
                        "model.layers.*.self_attn",
                        "model.layers.*.mlp.router",
                        "model.embed_tokens",
                        "lm_head",
                    ],
                }
            },
        ),
        Case(
            "gemma3n",
            "Gemma3nTextConfig",
            _cfg(
                vocab_size=32064,  # the per-layer embeddings (32000 rows) padded to it, as the Hub's
                vocab_size_per_layer_input=32000,
                num_hidden_layers=4,
                head_dim=16,
                hidden_size_per_layer_input=8,
                laurel_rank=8,
                num_kv_shared_layers=2,
                layer_types=["sliding_attention", "full_attention"] * 2,
                activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0],
                sliding_window=4,
                tie_word_embeddings=True,
            ),
            tokenizer="spm",
        ),
        Case(
            "bert",
            "BertConfig",
            dict(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=128,
                type_vocab_size=2,
            ),
            tokenizer="wordpiece",
            model_cls="AutoModel",
        ),
        Case(
            "modernbert",
            "ModernBertConfig",
            dict(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=3,
                num_attention_heads=4,
                global_attn_every_n_layers=3,
                local_attention=8,
                max_position_embeddings=256,
                cls_token_id=50256,
                sep_token_id=50256,
            ),
            model_cls="AutoModel",
        ),
        Case(
            "qwen2moe",
            "Qwen2MoeConfig",
            _cfg(
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=64,
                norm_topk_prob=False,
            ),
        ),
    ]
}


# ---------------------------------------------------------------------------------------------
# tokenizers


def _vocab_gguf(name: str) -> dict[str, Any]:
    from llamapy.gguf.reader import GGUFReader

    with GGUFReader(shared_path("vocab", f"ggml-vocab-{name}.gguf")) as r:
        md = r.metadata
        return {k: (list(v) if k.startswith("tokenizer.ggml.") and not isinstance(v, (str, int)) else v)
                for k, v in md.items()}  # fmt: skip


def write_bpe_tokenizer(d: Path, extra_special: tuple[str, ...] = ()) -> int:
    """GPT-2's tokenizer.json (byte-level BPE), rebuilt from llama.cpp's vocab file, with ``extra_special``
    added tokens after it; returns its size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    md = _vocab_gguf("gpt-2")
    tokens = [str(t) for t in md["tokenizer.ggml.tokens"]]
    merges = [tuple(str(m).split(" ")) for m in md["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|endoftext|>", *extra_special)]
    )
    tok.save(str(d / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 256,
    }
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return len(tokens) + len(extra_special)


def write_wordpiece_tokenizer(d: Path) -> int:
    """BERT's (bge-small's) WordPiece tokenizer.json, rebuilt from llama.cpp's phantom-space vocab file;
    returns its size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    md = _vocab_gguf("bert-bge")
    types = [int(t) for t in md["tokenizer.ggml.token_type"]]
    tokens = []
    for t, ty in zip((str(t) for t in md["tokenizer.ggml.tokens"]), types, strict=True):
        if ty == 3 or (t.startswith("[") and t.endswith("]")):
            tokens.append(t)
        else:
            tokens.append(t[1:] if t.startswith("\u2581") else "##" + t)
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 101), ("[SEP]", 102)],
    )
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")])  # fmt: skip
    tok.save(str(d / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": True,
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "mask_token": "[MASK]",
        "unk_token": "[UNK]",
        "model_max_length": 512,
    }
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    # sentence-transformers' mean pooling (llama.cpp reads modules.json)
    (d / "modules.json").write_text(json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling",
                                                  "type": "sentence_transformers.models.Pooling"}]))  # fmt: skip
    (d / "1_Pooling").mkdir(exist_ok=True)
    (d / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return len(tokens)


def _pb_varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _pb_field(num: int, wire: int, payload: bytes) -> bytes:
    return _pb_varint(num << 3 | wire) + payload


def _pb_bytes(num: int, b: bytes) -> bytes:
    return _pb_field(num, 2, _pb_varint(len(b)) + b)


def write_spm_tokenizer(d: Path) -> int:
    """LLaMA's tokenizer.model (SentencePiece BPE, byte fallback) as protobuf, from llama.cpp's vocab
    file; returns its size."""
    md = _vocab_gguf("llama-spm")
    tokens = [str(t) for t in md["tokenizer.ggml.tokens"]]
    scores = [float(s) for s in md["tokenizer.ggml.scores"]]
    types = [int(t) for t in md["tokenizer.ggml.token_type"]]
    pieces = b"".join(
        _pb_bytes(
            1,
            _pb_bytes(1, t.encode("utf-8"))
            + _pb_field(2, 5, struct.pack("<f", s))
            + _pb_field(3, 0, _pb_varint(ty)),
        )
        for t, s, ty in zip(tokens, scores, types, strict=True)
    )
    trainer = (
        _pb_field(3, 0, _pb_varint(2))  # model_type BPE
        + _pb_field(4, 0, _pb_varint(len(tokens)))  # vocab_size
        + _pb_field(35, 0, _pb_varint(1))  # byte_fallback
        + _pb_field(40, 0, _pb_varint(0))  # unk_id
        + _pb_field(41, 0, _pb_varint(1))  # bos_id
        + _pb_field(42, 0, _pb_varint(2))  # eos_id
        + _pb_field(43, 0, _pb_varint(-1))  # pad_id
    )
    normalizer = _pb_bytes(1, b"identity") + _pb_field(3, 0, _pb_varint(1)) + _pb_field(4, 0, _pb_varint(0))
    (d / "tokenizer.model").write_bytes(pieces + _pb_bytes(2, trainer) + _pb_bytes(3, normalizer))
    cfg = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            "0": {"content": "<unk>", "special": True},
            "1": {"content": "<s>", "special": True},
            "2": {"content": "</s>", "special": True},
        },
    }
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return len(tokens)


# ---------------------------------------------------------------------------------------------
# the checkpoint


def hf_config(case: Case, n_vocab: int) -> Any:
    import transformers

    kw = {"vocab_size": n_vocab, **case.config_kw}  # a larger vocab_size: embeddings padded past it
    if case.tokenizer.startswith("bpe"):
        kw.update(bos_token_id=50256, eos_token_id=50256, pad_token_id=None)
    elif case.tokenizer == "wordpiece":
        kw.update(pad_token_id=0)
    else:
        kw.update(bos_token_id=1, eos_token_id=2, pad_token_id=None)
    return getattr(transformers, case.config_cls)(**kw)


def random_state(case: Case, shapes: dict[str, tuple[int, ...]], tied: bool) -> dict[str, np.ndarray]:
    """Weights of unit-ish scale from NumPy's seeded generator (as tests/model/hf_tiny.py's)."""
    rng = np.random.default_rng(sum(map(ord, case.name)))
    out: dict[str, np.ndarray] = {}
    for name, shape in sorted(shapes.items()):
        if len(shape) == 1:
            noise = rng.standard_normal(shape, dtype=np.float32) * 0.1
            if "norm" in name.lower() and not name.endswith("bias"):
                out[name] = noise if case.gemma_norms else 1.0 + noise
            else:
                out[name] = noise * 2
        elif "embed_tokens" in name:
            out[name] = rng.standard_normal(shape, dtype=np.float32) * (0.25 if tied else 1.0)
        else:
            gain = 2.0 if name.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
            out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(gain / math.sqrt(shape[-1]))
    return out


_EXTRA_SPECIAL = {
    "bpe-glm": ("<|user|>", "<|assistant|>"),
    "bpe-glm45": ("[gMASK]", "<|user|>", "<|assistant|>", "<|observation|>"),
}

_TOKENIZER_FILES = {
    "bpe": ("tokenizer.json", "tokenizer_config.json"),
    "bpe-glm": ("tokenizer.json", "tokenizer_config.json"),
    "bpe-glm45": ("tokenizer.json", "tokenizer_config.json"),
    "spm": ("tokenizer.model", "tokenizer_config.json"),
    "wordpiece": ("tokenizer.json", "tokenizer_config.json", "modules.json", "1_Pooling/config.json"),
}


def _write_tokenizer(kind: str, d: Path, root: Path) -> int:
    """The tokenizer files in ``d``, built once per ``root`` and copied after that."""
    import shutil

    cache = root / f".tokenizer-{kind}"
    if not (cache / "n_vocab").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        if kind == "spm":
            n = write_spm_tokenizer(cache)
        elif kind == "wordpiece":
            n = write_wordpiece_tokenizer(cache)
        else:  # GLM-4 / GLM-4.5 chat tokens added
            n = write_bpe_tokenizer(cache, _EXTRA_SPECIAL.get(kind, ()))
        (cache / "n_vocab").write_text(str(n))
    for f in _TOKENIZER_FILES[kind]:
        (d / f).parent.mkdir(exist_ok=True)
        shutil.copyfile(cache / f, d / f)
    return int((cache / "n_vocab").read_text())


def _unfuse_experts(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers 5's fused ``mlp.experts.gate_up_proj`` / ``down_proj`` as per-expert tensors."""
    out: dict[str, np.ndarray] = {}
    for k, v in state.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            base, n_ff = k.removesuffix("gate_up_proj"), v.shape[1] // 2
            for i in range(v.shape[0]):
                out[f"{base}{i}.gate_proj.weight"] = v[i, :n_ff]
                out[f"{base}{i}.up_proj.weight"] = v[i, n_ff:]
        elif k.endswith("mlp.experts.down_proj"):
            base = k.removesuffix("down_proj")
            out.update({f"{base}{i}.down_proj.weight": v[i] for i in range(v.shape[0])})
        else:
            out[k] = v
    return out


def _mxfp4_experts(state: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """gpt-oss's ``experts.gate_up_proj`` (E, n_embd, 2 n_ff) and ``down_proj`` (E, n_ff, n_embd) as the
    Hub stores them: MXFP4 ``_blocks`` (E, rows, cols / 32, 16: two 4-bit codes a byte, low nibble first)
    and ``_scales`` (E, rows, cols / 32: exponents biased by 127), rows the output features. Random codes,
    exponents 2^-8..2^-5 (weights up to 6 x 2^-5)."""
    out: dict[str, np.ndarray] = {}
    for k, v in state.items():
        if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            e, cols, rows = v.shape
            out[f"{k}_blocks"] = rng.integers(0, 256, (e, rows, cols // 32, 16), dtype=np.uint8)
            out[f"{k}_scales"] = rng.integers(119, 123, (e, rows, cols // 32), dtype=np.uint8)
        else:
            out[k] = v
    return out


def _mtp_shapes(shapes: dict[str, tuple[int, ...]], n: int) -> dict[str, tuple[int, ...]]:
    """``mtp.fc`` (2 x hidden -> hidden), its three norms and ``n`` layers shaped as the last attention layer."""
    last = max(int(k.split(".")[2]) for k in shapes if ".self_attn." in k)
    pre = f"model.layers.{last}."
    h = shapes["model.norm.weight"][0]
    out = {"mtp.fc.weight": (h, 2 * h), "mtp.norm.weight": (h,)}
    out |= {f"mtp.pre_fc_norm_{x}.weight": (h,) for x in ("embedding", "hidden")}
    for i in range(n):
        out |= {f"mtp.layers.{i}.{k.removeprefix(pre)}": s for k, s in shapes.items() if k.startswith(pre)}
    return out


def make_hf_dir(case: Case, root: Path) -> Path:
    """The checkpoint directory ``root/case.name`` (written once)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    d = root / case.name
    if (d / "config.json").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    n_vocab = _write_tokenizer(case.tokenizer, d, root)
    cfg = hf_config(case, n_vocab)
    with torch.device("meta"):
        model = getattr(transformers, case.model_cls).from_config(cfg)
    tied = bool(cfg.tie_word_embeddings)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if tied:
        shapes.pop("lm_head.weight", None)
    if case.mtp:
        shapes.update(_mtp_shapes(shapes, case.mtp))
    state = random_state(case, shapes, tied)
    if case.unfuse_experts:
        state = _unfuse_experts(state)
    if case.mxfp4:
        state = _mxfp4_experts(state, np.random.default_rng(4))
    for pat, rep in case.rename:
        state = {re.sub(pat, rep, k): v for k, v in state.items()}
    dt = torch.bfloat16 if case.dtype == "BF16" else torch.float32
    tensors = {
        k: torch.from_numpy(v).to(dt if v.dtype.kind == "f" else torch.uint8).contiguous()
        for k, v in state.items()
    }
    names = sorted(tensors)
    if case.shards == 1:
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    else:
        per = math.ceil(len(names) / case.shards)
        weight_map: dict[str, str] = {}
        for i in range(case.shards):
            fn = f"model-{i + 1:05d}-of-{case.shards:05d}.safetensors"
            part = names[i * per : (i + 1) * per]
            save_file({k: tensors[k] for k in part}, str(d / fn), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, fn))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    cfg.architectures = [model.__class__.__name__]
    cfg.to_json_file(str(d / "config.json"))
    if case.hub_config:
        (d / "config.json").write_text(
            json.dumps({**json.loads((d / "config.json").read_text()), **case.hub_config}, indent=2)
        )
    gen = {
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "do_sample": True,
        "temperature": 0.6,
    }
    (d / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return d


def make_hub_vl_dir(src: Path, root: Path, arch: str, model_type: str) -> Path:
    """``src`` (a Qwen3.5 text checkpoint) as the Hub's ``Qwen3_5(Moe)ForConditionalGeneration`` files lay it
    out: the text model under ``model.language_model.``, a vision tower under ``model.visual.``,
    ``text_config`` in config.json, and the experts one by one."""
    from safetensors.numpy import load_file, save_file

    d = root / f"{src.name}-hub"
    if (d / "config.json").exists():
        return d
    d.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            (d / f.name).write_bytes(f.read_bytes())
    state = _unfuse_experts(load_file(str(src / "model.safetensors")))
    state = {re.sub(r"^model\.", "model.language_model.", k): v for k, v in state.items()}
    rng = np.random.default_rng(5)
    state["model.visual.blocks.0.attn.qkv.weight"] = rng.standard_normal((96, 32), dtype=np.float32)
    state["model.visual.merger.linear_fc1.weight"] = rng.standard_normal((128, 128), dtype=np.float32)
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((src / "config.json").read_text())
    text = {k: v for k, v in text.items() if k not in ("architectures", "transformers_version")}
    cfg = {"architectures": [arch], "model_type": model_type, "text_config": text, "tie_word_embeddings": False,
           "vision_config": {"model_type": f"{model_type}_vision", "depth": 1, "hidden_size": 32, "num_heads": 2,
                             "out_hidden_size": text["hidden_size"]},
           "image_token_id": 5, "video_token_id": 6}  # fmt: skip
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return d


def make_lora_dir(base: Path, root: Path, name: str = "lora", r: int = 4, alpha: float = 8.0) -> Path:
    """A PEFT LoRA adapter of the checkpoint ``base`` (q, k, v, o and down projections of every layer),
    written as PEFT writes it: adapter_config.json and adapter_model.safetensors (F32)."""
    from safetensors.numpy import save_file

    from llamapy.convert.safetensors import SafetensorsFile

    d = root / name
    if (d / "adapter_config.json").exists():
        return d
    d.mkdir(parents=True)
    shapes: dict[str, tuple[int, ...]] = {}
    for f in sorted(base.glob("*.safetensors")):
        sf = SafetensorsFile(f)
        shapes.update({k: v.shape for k, v in sf.tensors.items()})
        sf.close()
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "down_proj")
    rng = np.random.default_rng(7)
    tensors: dict[str, np.ndarray] = {}
    for k, shape in sorted(shapes.items()):
        mod = k.removesuffix(".weight")
        if not mod.endswith(targets):
            continue
        n_out, n_in = shape
        tensors[f"base_model.model.{mod}.lora_A.weight"] = rng.standard_normal(
            (r, n_in), dtype=np.float32
        ) / np.float32(math.sqrt(n_in))
        tensors[f"base_model.model.{mod}.lora_B.weight"] = rng.standard_normal(
            (n_out, r), dtype=np.float32
        ) * np.float32(0.2)
    save_file(tensors, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": r,
        "lora_alpha": alpha,
        "target_modules": list(targets),
        "lora_dropout": 0.0,
        "bias": "none",
    }
    (d / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    return d


def make_nomic_bert_dir(root: Path) -> Path:
    """A tiny nomic-embed-text v1.5 checkpoint (``NomicBertModel``, remote code: no transformers class), its
    config.json and tensor names as the Hub's, with the WordPiece tokenizer of the ``bert`` case."""
    from safetensors.numpy import save_file

    d = root / "nomic-bert"
    if (d / "config.json").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    n_vocab = _write_tokenizer("wordpiece", d, root)
    e, ff, n_layer = 64, 96, 2
    cfg = dict(architectures=["NomicBertModel"], model_type="nomic_bert", activation_function="swiglu",
               causal=False, layer_norm_epsilon=1e-12, max_trained_positions=2048, mlp_fc1_bias=False,
               mlp_fc2_bias=False, n_embd=e, n_head=4, n_inner=ff, n_layer=n_layer, n_positions=8192,
               prenorm=False, qkv_proj_bias=False, rotary_emb_base=1000, rotary_emb_fraction=1.0,
               rotary_emb_interleaved=False, rotary_emb_scale_base=None, rotary_scaling_factor=None,
               type_vocab_size=2, vocab_size=n_vocab, use_rms_norm=False)  # fmt: skip
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (n_vocab, e),
        "embeddings.token_type_embeddings.weight": (2, e),
        "emb_ln.weight": (e,),
        "emb_ln.bias": (e,),
    }
    for il in range(n_layer):
        p = f"encoder.layers.{il}."
        shapes |= {p + "attn.Wqkv.weight": (3 * e, e), p + "attn.out_proj.weight": (e, e),
                   p + "mlp.fc11.weight": (ff, e), p + "mlp.fc12.weight": (ff, e), p + "mlp.fc2.weight": (e, ff),
                   p + "norm1.weight": (e,), p + "norm1.bias": (e,), p + "norm2.weight": (e,),
                   p + "norm2.bias": (e,)}  # fmt: skip
    state = random_state(Case("nomic-bert", "NomicBertConfig"), shapes, False)
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return d
