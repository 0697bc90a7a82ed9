"""Tiny random-weight vision-language models of transformers converted to a text GGUF + an mmproj GGUF
(test-only), the way llama.cpp's ``convert_hf_to_gguf.py`` does (``Gemma3VisionModel`` and
``SmolVLMModel``, its ``MmprojModel`` subclasses): Gemma3ForConditionalGeneration (gemma3 projector) and
Idefics3ForConditionalGeneration (SmolVLM: idefics3 projector, a llama text model).

The text half goes through the one test converter, ``tests/model/hf_tiny.py`` (its gemma3 / llama
families' mapping and metadata) plus a tiny SPM vocabulary holding the image marker tokens; this module
writes the mmproj half: ``clip.*`` keys and ``v.*`` / ``mm.*`` tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType
from llamapy.gguf.writer import GGUFWriter
from tests.model import hf_tiny

N_VOCAB = 300
BOI, EOI, IMG = 4, 5, 6  # <start_of_image>, <end_of_image>, <image_soft_token>
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
            "<start_of_turn>", "<end_of_turn>"]  # fmt: skip
IDEFICS3_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<fake_token_around_image>", "<global-img>", "<image>",
                     "<|im_start|>", "<end_of_utterance>"]  # fmt: skip
IDEFICS3_SPECIALS += [f"<row_{r}_col_{c}>" for r in range(1, 4) for c in range(1, 4)]
GEMMA3_TEXT = hf_tiny.FAMILIES["gemma3"]
LLAMA_TEXT = hf_tiny.FAMILIES["llama"]


def tiny_vocab(specials: list[str] = SPECIALS) -> dict[str, Any]:
    """An SPM vocabulary of N_VOCAB tokens: specials, 256 byte tokens, then letters and a few words."""
    toks = list(specials)
    types = [3, 3, 3, 2] + [3] * (len(specials) - 4)
    toks += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    words = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words += ["\u2581" + w for w in ("a", "the", "is", "cat", "image", "what", "this", "describe")]
    words = words[: N_VOCAB - len(toks)]
    toks += words
    types += [1] * len(words)
    while len(toks) < N_VOCAB:
        toks.append(f"<unused{len(toks)}>")
        types.append(5)
    scores = [0.0] * len(specials) + [0.0] * 256 + [-float(i) for i in range(N_VOCAB - len(specials) - 256)]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.scores": np.asarray(scores, dtype=np.float32),
        "tokenizer.ggml.token_type": np.asarray(types, dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }


def gemma3_config(
    image_size: int = 64, patch_size: int = 8, tokens_per_image: int = 16, sliding_window: int = 512
) -> Any:
    text = dict(hf_tiny._common(**GEMMA3_TEXT.config_kw))
    text.update(
        vocab_size=N_VOCAB, sliding_window=sliding_window, pad_token_id=0, bos_token_id=2, eos_token_id=1
    )
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=image_size, patch_size=patch_size, num_channels=3, layer_norm_eps=1e-6,
        hidden_act="gelu_pytorch_tanh", vision_use_head=False,
    )  # fmt: skip
    cfg = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=tokens_per_image,
        boi_token_index=BOI, eoi_token_index=EOI, image_token_index=IMG, tie_word_embeddings=True,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    return cfg


def idefics3_config(image_size: int = 64, patch_size: int = 8, scale_factor: int = 2) -> Any:
    text = dict(hf_tiny._common(**LLAMA_TEXT.config_kw))
    text.update(vocab_size=N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=image_size, patch_size=patch_size, num_channels=3, layer_norm_eps=1e-6,
        hidden_act="gelu_pytorch_tanh",
    )  # fmt: skip
    cfg = transformers.Idefics3Config(
        text_config=text, vision_config=vision, scale_factor=scale_factor, image_token_id=IMG, tie_word_embeddings=False
    )  # fmt: skip
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
    return cfg


def llava_config(image_size: int = 32, patch_size: int = 8, n_layer: int = 3) -> Any:
    text = dict(hf_tiny._common(**LLAMA_TEXT.config_kw))
    text.update(vocab_size=N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    vision = dict(
        model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=n_layer,
        num_attention_heads=2, image_size=image_size, patch_size=patch_size, projection_dim=32,
    )  # fmt: skip
    # llama.cpp's mlp projector uses ggml_gelu (tanh approximation): the HF side is set to the same
    cfg = transformers.LlavaConfig(
        text_config=text, vision_config=vision, image_token_index=IMG, projector_hidden_act="gelu_pytorch_tanh",
        image_seq_length=(image_size // patch_size) ** 2,
    )  # fmt: skip
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
    return cfg


def build_llava(seed: int = 0, **kw: Any) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(llava_config(**kw)).to(torch.float32)
    hf_tiny._randomize(model.model.language_model, LLAMA_TEXT, seed)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 2)
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g) / 8)
    _randomize_vision(model, "model.language_model.", seed)
    return model.eval()


def _randomize_vision(model: torch.nn.Module, text_prefix: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(text_prefix) or name == "lm_head.weight":
                continue
            if p.ndim == 1:
                base = 0.0 if "soft_emb_norm" in name or "bias" in name else 1.0
                p.copy_(base + torch.randn(p.shape, generator=g) * 0.1)
            elif "position_embedding" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            else:  # conv [E, 3, p, p] and linears: fan-in scaled
                fan_in = int(np.prod(p.shape[1:]))
                gain = 2.0 if name.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * (gain / math.sqrt(fan_in)))


def build_gemma3(seed: int = 0, **kw: Any) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(gemma3_config(**kw)).to(torch.float32)
    hf_tiny._randomize(model.model.language_model, GEMMA3_TEXT, seed)
    _randomize_vision(model, "model.language_model.", seed)
    return model.eval()


def build_idefics3(seed: int = 0, **kw: Any) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = transformers.Idefics3ForConditionalGeneration(idefics3_config(**kw)).to(torch.float32)
    hf_tiny._randomize(model.model.text_model, LLAMA_TEXT, seed)
    with torch.no_grad():
        model.lm_head.weight.copy_(
            torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(seed + 2)) / 8
        )
    _randomize_vision(model, "model.text_model.", seed)
    return model.eval()


# -- mmproj -------------------------------------------------------------------------------------------
_VLAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2",
    "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down",
}  # fmt: skip


def mmproj_tensors(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF-named mmproj tensors (NumPy order) of a Gemma3 / Idefics3ForConditionalGeneration state dict."""
    out: dict[str, np.ndarray] = {}
    vt = (
        "model.vision_tower."
        if any(k.startswith("model.vision_tower.") for k in sd)
        else "model.vision_model."
    )
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name.startswith(vt + "encoder.layers."):
            il, rest = name[len(vt + "encoder.layers.") :].split(".", 1)
            mod, kind = rest.rsplit(".", 1)
            out[f"v.blk.{il}.{_VLAYER[mod]}.{kind}"] = w
        elif name == vt + "embeddings.patch_embedding.weight":
            out["v.patch_embd.weight"] = w
        elif name == vt + "embeddings.patch_embedding.bias":
            out["v.patch_embd.bias"] = w
        elif name == vt + "embeddings.position_embedding.weight":
            out["v.position_embd.weight"] = w
        elif name == vt + "embeddings.class_embedding":
            out["v.class_embd"] = w
        elif name.startswith(vt + "pre_layrnorm."):
            out["v.pre_ln." + name.rsplit(".", 1)[1]] = w
        elif name.startswith(vt + "post_layernorm."):
            if vt + "embeddings.class_embedding" not in sd:  # LLaVA's feature layer -2 never reaches it
                out["v.post_ln." + name.rsplit(".", 1)[1]] = w
        elif name.startswith("model.multi_modal_projector.linear_"):
            i, kind = name[len("model.multi_modal_projector.linear_") :].split(".")
            out[f"mm.{2 * (int(i) - 1)}.{kind}"] = w
        elif name == "model.multi_modal_projector.mm_input_projection_weight":
            out["mm.input_projection.weight"] = w
        elif name == "model.multi_modal_projector.mm_soft_emb_norm.weight":
            out["mm.soft_emb_norm.weight"] = w + np.float32(1.0)  # Gemma3RMSNorm's (1 + w)
        elif name == "model.connector.modality_projection.proj.weight":
            out["mm.model.fc.weight"] = w
        elif name.startswith("model.vision_tower."):
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
    return out


def mmproj_type(name: str, arr: np.ndarray, ftype: GGMLType) -> GGMLType:
    """As convert_hf_to_gguf.py stores them: vectors and the embeddings F32, the projection F16."""
    if name == "mm.input_projection.weight":
        return GGMLType.F16
    if arr.ndim < 2 or name in ("v.patch_embd.weight", "v.position_embd.weight"):
        return GGMLType.F32
    return ftype


def mmproj_metadata(cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    v = cfg.vision_config
    kind = {"idefics3": "idefics3", "llava": "mlp"}.get(cfg.model_type, "gemma3")
    md: dict[str, Any] = {
        "general.name": f"tiny-{kind}-mmproj",
        "general.file_type": hf_tiny.FILE_TYPES[ftype],
        "clip.has_vision_encoder": True,
        "clip.projector_type": kind,
        "clip.vision.image_size": v.image_size,
        "clip.vision.patch_size": v.patch_size,
        "clip.vision.embedding_length": v.hidden_size,
        "clip.vision.feed_forward_length": v.intermediate_size,
        "clip.vision.block_count": v.num_hidden_layers,
        "clip.vision.attention.head_count": v.num_attention_heads,
        "clip.vision.projection_dim": cfg.text_config.hidden_size,
        "clip.vision.attention.layer_norm_epsilon": float(v.layer_norm_eps),
        "clip.vision.image_mean": [0.5, 0.5, 0.5],
        "clip.vision.image_std": [0.5, 0.5, 0.5],
        "clip.use_gelu": True,
    }
    if kind == "mlp":  # CLIP: quick GELU (no use_gelu), its own mean and std
        del md["clip.use_gelu"]
        md["clip.vision.image_mean"] = [0.48145466, 0.4578275, 0.40821073]
        md["clip.vision.image_std"] = [0.26862954, 0.26130258, 0.27577711]
        return md
    if kind == "idefics3":  # SmolVLMModel: the pixel shuffle factor, and the processor's longest edge
        md["clip.vision.projector.scale_factor"] = cfg.scale_factor
        return md
    scale = (v.image_size // v.patch_size) // int(math.isqrt(cfg.mm_tokens_per_image))
    if scale != 4:
        md["clip.vision.projector.scale_factor"] = scale
    return md


def write_mmproj(path: Path, md: dict[str, Any], tensors: dict[str, np.ndarray], ftype: GGMLType) -> Path:
    w = GGUFWriter(path, arch="clip")
    for k, val in md.items():
        if isinstance(val, bool):
            w.add_key_value(k, val, GGUFValueType.BOOL)
        elif isinstance(val, float):
            w.add_key_value(k, val, GGUFValueType.FLOAT32)
        elif isinstance(val, int):
            w.add_key_value(k, val, GGUFValueType.UINT32)
        elif isinstance(val, list) and all(isinstance(x, float) for x in val):
            w.add_key_value(k, val, GGUFValueType.ARRAY, GGUFValueType.FLOAT32)
        else:
            w.add_key_value(k, val)
    for name, arr in tensors.items():
        w.add_tensor(
            name, np.ascontiguousarray(arr, dtype=np.float32), ggml_type=mmproj_type(name, arr, ftype)
        )
    w.write()
    w.close()
    return Path(path)


def _round(name: str, arr: np.ndarray, t: GGMLType) -> np.ndarray:
    return hf_tiny.roundtrip(arr, t)


# -- the pair -----------------------------------------------------------------------------------------
@dataclass
class TinyVLM:
    hf: torch.nn.Module
    state: dict[str, np.ndarray]
    tmpdir: Path
    files: dict[tuple[str, GGMLType], Path] = field(default_factory=dict)

    @property
    def cfg(self) -> Any:
        return self.hf.config

    @property
    def kind(self) -> str:
        return {"idefics3": "idefics3", "llava": "llava"}.get(self.cfg.model_type, "gemma3")

    @property
    def _text_prefix(self) -> str:
        return "model.text_model." if self.kind == "idefics3" else "model.language_model."

    def text_state(self) -> dict[str, np.ndarray]:
        """The language model's weights under hf_tiny's causal-LM names (``model.layers.0...``)."""
        pre = self._text_prefix
        out = {"model." + k[len(pre) :]: v for k, v in self.state.items() if k.startswith(pre)}
        if self.kind in ("idefics3", "llava"):
            out["lm_head.weight"] = self.state["lm_head.weight"]
        return out

    def text_gguf(self, ftype: GGMLType = GGMLType.F32) -> Path:
        key = ("text", ftype)
        if key not in self.files:
            tcfg = self.cfg.text_config
            base = GEMMA3_TEXT if self.kind == "gemma3" else LLAMA_TEXT
            fam = replace(base, name=f"{self.kind}-vlm-text")
            tensors = hf_tiny.convert(fam, tcfg, hf_tiny.effective_state_dict(self.text_state(), ftype))
            md = hf_tiny.metadata(fam, tcfg, ftype)
            md.update(tiny_vocab(SPECIALS if self.kind == "gemma3" else IDEFICS3_SPECIALS))
            path = self.tmpdir / f"tiny-{self.kind}-vlm-text-{ftype.name.lower()}.gguf"
            self.files[key] = hf_tiny.write_gguf(path, fam.arch, md, tensors, ftype)
        return self.files[key]

    def mmproj_gguf(self, ftype: GGMLType = GGMLType.F32) -> Path:
        key = ("mmproj", ftype)
        if key not in self.files:
            path = self.tmpdir / f"tiny-{self.kind}-mmproj-{ftype.name.lower()}.gguf"
            self.files[key] = write_mmproj(
                path, mmproj_metadata(self.cfg, ftype), self.mm_tensors(ftype), ftype
            )
        return self.files[key]

    def mm_tensors(self, ftype: GGMLType) -> dict[str, np.ndarray]:
        return mmproj_tensors(self.state)

    def effective_state(self, ftype: GGMLType, text_ftype: GGMLType | None = None) -> dict[str, np.ndarray]:
        """The HF weights as the two files store them (mmproj of ``ftype``, text of ``text_ftype``)."""
        out = dict(self.state)
        vt = "model.vision_model." if self.kind == "idefics3" else "model.vision_tower."
        inv = {
            "model.multi_modal_projector.mm_input_projection_weight": "mm.input_projection.weight",
            vt + "embeddings.patch_embedding.weight": "v.patch_embd.weight",
            vt + "embeddings.position_embedding.weight": "v.position_embd.weight",
        }
        for k, v in self.state.items():
            if k.startswith((vt, "model.multi_modal_projector.", "model.connector.")):
                gname = inv.get(k, "x.weight" if v.ndim >= 2 else "x.bias")
                out[k] = _round(k, v, mmproj_type(gname, v, ftype))
        if text_ftype is not None:
            pre = self._text_prefix
            eff = hf_tiny.effective_state_dict(self.text_state(), text_ftype)
            for k, v in eff.items():
                out[k if k == "lm_head.weight" else pre + k[len("model.") :]] = v
        return out

    def load(self, ftype: GGMLType, text_ftype: GGMLType | None = None) -> None:
        hf_tiny.load_state_dict(self.hf, self.effective_state(ftype, text_ftype))


def make_gemma3(tmpdir: Path, seed: int = 0, **kw: Any) -> TinyVLM:
    hf = build_gemma3(seed, **kw)
    return TinyVLM(hf, hf_tiny.hf_state_dict(hf), Path(tmpdir))


def make_idefics3(tmpdir: Path, seed: int = 0, **kw: Any) -> TinyVLM:
    hf = build_idefics3(seed, **kw)
    return TinyVLM(hf, hf_tiny.hf_state_dict(hf), Path(tmpdir))


def make_llava(tmpdir: Path, seed: int = 0, **kw: Any) -> TinyVLM:
    hf = build_llava(seed, **kw)
    return TinyVLM(hf, hf_tiny.hf_state_dict(hf), Path(tmpdir))
