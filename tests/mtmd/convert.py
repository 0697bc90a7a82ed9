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

from llamapy.ggml.types import TRAITS, GGMLType
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
    if arr.ndim < 2 or name in ("v.patch_embd.weight", "v.patch_embd.weight.1", "v.position_embd.weight"):
        return GGMLType.F32
    whole = arr.ndim == 2 and arr.shape[-1] % TRAITS[ftype].block_size == 0
    if ftype not in (GGMLType.F32, GGMLType.F16) and not whole:
        return GGMLType.F16  # conv kernels (ldp) and rows that are not whole blocks, as the converters do
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


# -- ldp / ldpv2 (MobileVLM) --------------------------------------------------------------------------
def ldp_projector(n_in: int, n_out: int, version: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random MobileVLM projector tensors under llama.cpp's GGUF names, squeezed as its converter stores
    them (depthwise kernels ``(C, 3, 3)``, 1x1 convs ``(C_out, C_in)``). No HF class exists: the tests
    check them against a torch reference of llama.cpp's graph."""
    g = np.random.default_rng(seed + 7)
    sq = max(8, (n_out // 4 + 4) // 8 * 8)  # torchvision's _make_divisible(C // 4, 8)

    def mat(o: int, i: int) -> np.ndarray:
        return (g.standard_normal((o, i)) / math.sqrt(i)).astype(np.float32)

    def vec(n: int, base: float = 0.0, s: float = 0.1) -> np.ndarray:
        return (base + g.standard_normal(n) * s).astype(np.float32)

    m0, m1 = (1, 3) if version == 1 else (0, 2)
    out = {
        f"mm.model.mlp.{m0}.weight": mat(n_out, n_in), f"mm.model.mlp.{m0}.bias": vec(n_out),
        f"mm.model.mlp.{m1}.weight": mat(n_out, n_out), f"mm.model.mlp.{m1}.bias": vec(n_out),
    }  # fmt: skip
    if version == 2:
        out["mm.model.peg.0.weight"] = (g.standard_normal((n_out, 3, 3)) / 3).astype(np.float32)
        out["mm.model.peg.0.bias"] = vec(n_out)
        return out
    for b in (1, 2):
        p = f"mm.model.mb_block.{b}.block."
        out[p + "0.0.weight"] = (g.standard_normal((n_out, 3, 3)) / 3).astype(np.float32)
        out[p + "0.1.weight"], out[p + "0.1.bias"] = vec(n_out, 1.0), vec(n_out)
        out[p + "1.fc1.weight"], out[p + "1.fc1.bias"] = mat(sq, n_out), vec(sq)
        out[p + "1.fc2.weight"], out[p + "1.fc2.bias"] = mat(n_out, sq), vec(n_out, 0.0, 1.0)
        out[p + "2.0.weight"] = mat(n_out, n_out)
        out[p + "2.1.weight"], out[p + "2.1.bias"] = vec(n_out, 1.0), vec(n_out)
    return out


@dataclass
class TinyLDP(TinyVLM):
    """A LLaVA (CLIP tower, llama text model) whose projector is MobileVLM's ``ldp`` or ``ldpv2``."""

    version: int = 1

    @property
    def projector_type(self) -> str:
        return "ldp" if self.version == 1 else "ldpv2"

    @property
    def projector(self) -> dict[str, np.ndarray]:
        v, t = self.cfg.vision_config, self.cfg.text_config
        return ldp_projector(v.hidden_size, t.hidden_size, self.version)

    def projector_as_stored(self, ftype: GGMLType) -> dict[str, np.ndarray]:
        """The projector's weights as the mmproj file of ``ftype`` holds them."""
        return {k: _round(k, v, mmproj_type(k, v, ftype)) for k, v in self.projector.items()}

    def mm_tensors(self, ftype: GGMLType) -> dict[str, np.ndarray]:
        out = {k: v for k, v in mmproj_tensors(self.state).items() if not k.startswith("mm.")}
        return out | self.projector

    def mmproj_gguf(self, ftype: GGMLType = GGMLType.F32) -> Path:
        key = ("mmproj", ftype)
        if key not in self.files:
            md = mmproj_metadata(self.cfg, ftype)
            md["clip.projector_type"] = self.projector_type
            md["general.name"] = f"tiny-{self.projector_type}-mmproj"
            path = self.tmpdir / f"tiny-{self.projector_type}-mmproj-{ftype.name.lower()}.gguf"
            self.files[key] = write_mmproj(path, md, self.mm_tensors(ftype), ftype)
        return self.files[key]


def make_ldp(tmpdir: Path, version: int = 1, seed: int = 0, image_size: int = 48, **kw: Any) -> TinyLDP:
    """A tiny MobileVLM-style pair: CLIP 48 px / 8 px patches (a 6x6 grid: 9 image tokens)."""
    hf = build_llava(seed, image_size=image_size, **kw)
    return TinyLDP(hf, hf_tiny.hf_state_dict(hf), Path(tmpdir), version=version)


# -- qwen3vl_merger (Qwen3-VL) ------------------------------------------------------------------------
QWEN3VL_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                    "<|video_pad|>", "<|im_start|>", "<|im_end|>"]  # fmt: skip
Q3_VSTART, Q3_VEND, Q3_IMG, Q3_VIDEO = 4, 5, 6, 7
_Q3_VLAYER = {"norm1": "ln1", "norm2": "ln2", "attn.qkv": "attn_qkv", "attn.proj": "attn_out",
              "mlp.linear_fc1": "ffn_up", "mlp.linear_fc2": "ffn_down"}  # fmt: skip
_Q3_MERGER = {"norm": "norm", "linear_fc1": "fc1", "linear_fc2": "fc2"}


def qwen3vl_config(
    n_layer: int = 3, deepstack: tuple[int, ...] = (0, 1), pos_side: int = 4, n_text_layer: int = 2
) -> Any:
    """Vision: 32 wide, 2 heads of 16, 8 px patches, 2x2 merge, a ``pos_side``^2 position table; text: the
    qwen3vl test family (64 wide, interleaved M-RoPE sections 3/3/2; 2 layers: the last one takes a
    deepstack slice)."""
    fam = hf_tiny.FAMILIES["qwen3vl"]
    text = dict(hf_tiny._common(**fam.config_kw))
    text.update(
        vocab_size=N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1, num_hidden_layers=n_text_layer
    )
    vision = dict(
        depth=n_layer, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=8, spatial_merge_size=2,
        temporal_patch_size=2, out_hidden_size=text["hidden_size"], num_position_embeddings=pos_side**2,
        deepstack_visual_indexes=list(deepstack), hidden_act="gelu_pytorch_tanh",
    )  # fmt: skip
    cfg = transformers.Qwen3VLConfig(
        text_config=text, vision_config=vision, image_token_id=Q3_IMG, video_token_id=Q3_VIDEO,
        vision_start_token_id=Q3_VSTART, vision_end_token_id=Q3_VEND, tie_word_embeddings=False,
    )  # fmt: skip
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
    return cfg


def build_qwen3vl(seed: int = 0, **kw: Any) -> torch.nn.Module:
    """A tiny Qwen3VLForConditionalGeneration; its mergers' GELU set to the tanh approximation that
    llama.cpp's graph (FFN_GELU = ggml_gelu) uses (HF's is nn.GELU(), the erf one)."""
    torch.manual_seed(seed)
    model = transformers.Qwen3VLForConditionalGeneration(qwen3vl_config(**kw)).to(torch.float32)
    hf_tiny._randomize(model.model.language_model, hf_tiny.FAMILIES["qwen3vl"], seed)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 2)
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g) / 8)
    _randomize_vision(model, "model.language_model.", seed)
    vis = model.model.visual
    for mg in [vis.merger, *vis.deepstack_merger_list]:
        mg.act_fn = torch.nn.GELU(approximate="tanh")
    return model.eval()


def qwen3vl_mmproj_tensors(cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF-named mmproj tensors as llama.cpp's ``Qwen3VLVisionModel`` converts them."""
    vt, ds = "model.visual.", list(cfg.vision_config.deepstack_visual_indexes)
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        if not name.startswith(vt):
            continue
        w, rest = np.asarray(w, dtype=np.float32), name[len(vt) :]
        mod, kind = rest.rsplit(".", 1)
        if rest == "patch_embed.proj.weight":  # Conv3d [E, C, 2, p, p] -> two Conv2d kernels
            out["v.patch_embd.weight"] = np.ascontiguousarray(w[:, :, 0])
            out["v.patch_embd.weight.1"] = np.ascontiguousarray(w[:, :, 1])
        elif rest == "patch_embed.proj.bias":
            out["v.patch_embd.bias"] = w
        elif rest == "pos_embed.weight":
            out["v.position_embd.weight"] = w
        elif rest.startswith("blocks."):
            il, m = mod[len("blocks.") :].split(".", 1)
            out[f"v.blk.{il}.{_Q3_VLAYER[m]}.{kind}"] = w
        elif rest.startswith("merger."):
            m = mod[len("merger.") :]
            out[{"norm": "v.post_ln", "linear_fc1": "mm.0", "linear_fc2": "mm.2"}[m] + "." + kind] = w
        elif rest.startswith("deepstack_merger_list."):
            j, m = mod[len("deepstack_merger_list.") :].split(".", 1)
            out[f"v.deepstack.{ds[int(j)]}.{_Q3_MERGER[m]}.{kind}"] = w
        else:
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
    return out


def qwen3vl_mmproj_metadata(cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    v = cfg.vision_config
    ds = set(v.deepstack_visual_indexes)
    return {
        "general.name": "tiny-qwen3vl-mmproj",
        "general.file_type": hf_tiny.FILE_TYPES[ftype],
        "clip.has_vision_encoder": True,
        "clip.projector_type": "qwen3vl_merger",
        "clip.vision.image_size": math.isqrt(v.num_position_embeddings) * v.patch_size,
        "clip.vision.patch_size": v.patch_size,
        "clip.vision.embedding_length": v.hidden_size,
        "clip.vision.feed_forward_length": v.intermediate_size,
        "clip.vision.block_count": v.depth,
        "clip.vision.attention.head_count": v.num_heads,
        "clip.vision.projection_dim": cfg.text_config.hidden_size,
        "clip.vision.attention.layer_norm_epsilon": float(cfg.text_config.rms_norm_eps),
        "clip.vision.image_mean": [0.5, 0.5, 0.5],
        "clip.vision.image_std": [0.5, 0.5, 0.5],
        "clip.use_gelu": True,
        "clip.vision.spatial_merge_size": v.spatial_merge_size,
        "clip.vision.is_deepstack_layers": [il in ds for il in range(v.depth)],
    }


@dataclass
class TinyQwen3VL(TinyVLM):
    """A tiny Qwen3-VL: text GGUF (arch qwen3vl) + mmproj (qwen3vl_merger)."""

    @property
    def kind(self) -> str:
        return "qwen3vl"

    def text_state(self) -> dict[str, np.ndarray]:
        pre = "model.language_model."
        out = {"model." + k[len(pre) :]: v for k, v in self.state.items() if k.startswith(pre)}
        out["lm_head.weight"] = self.state["lm_head.weight"]
        return out

    def text_gguf(self, ftype: GGMLType = GGMLType.F32) -> Path:
        key = ("text", ftype)
        if key not in self.files:
            fam, tcfg = hf_tiny.FAMILIES["qwen3vl"], self.cfg.text_config
            tensors = hf_tiny.convert(fam, tcfg, hf_tiny.effective_state_dict(self.text_state(), ftype))
            md = hf_tiny.metadata(fam, tcfg, ftype)
            md["qwen3vl.n_deepstack_layers"] = len(self.cfg.vision_config.deepstack_visual_indexes)
            md.update(tiny_vocab(QWEN3VL_SPECIALS))
            path = self.tmpdir / f"tiny-qwen3vl-text-{ftype.name.lower()}.gguf"
            self.files[key] = hf_tiny.write_gguf(path, fam.arch, md, tensors, ftype)
        return self.files[key]

    def mmproj_gguf(self, ftype: GGMLType = GGMLType.F32) -> Path:
        key = ("mmproj", ftype)
        if key not in self.files:
            path = self.tmpdir / f"tiny-qwen3vl-mmproj-{ftype.name.lower()}.gguf"
            md = qwen3vl_mmproj_metadata(self.cfg, ftype)
            self.files[key] = write_mmproj(path, md, self.mm_tensors(ftype), ftype)
        return self.files[key]

    def mm_tensors(self, ftype: GGMLType) -> dict[str, np.ndarray]:
        return qwen3vl_mmproj_tensors(self.cfg, self.state)

    def effective_state(self, ftype: GGMLType, text_ftype: GGMLType | None = None) -> dict[str, np.ndarray]:
        out = dict(self.state)
        keep = ("model.visual.patch_embed.proj.weight", "model.visual.pos_embed.weight")
        for k, v in self.state.items():
            if k.startswith("model.visual.") and v.ndim >= 2 and k not in keep:
                out[k] = _round(k, v, ftype)
        if text_ftype is not None:
            for k, v in hf_tiny.effective_state_dict(self.text_state(), text_ftype).items():
                out[k if k == "lm_head.weight" else "model.language_model." + k[len("model.") :]] = v
        return out


def make_qwen3vl(tmpdir: Path, seed: int = 0, **kw: Any) -> TinyQwen3VL:
    hf = build_qwen3vl(seed, **kw)
    return TinyQwen3VL(hf, hf_tiny.hf_state_dict(hf), Path(tmpdir))


# -- qwen2vl_merger / qwen2.5vl_merger (Qwen2-VL, Qwen2.5-VL) -----------------------------------------
QWEN2VL_TEXT = hf_tiny.FAMILIES["qwen2vl"]
_Q2_VLAYER = {"norm1": "ln1", "norm2": "ln2", "attn.proj": "attn_out", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}  # fmt: skip


def qwen2vl_config(v25: bool = True, n_layer: int = 2, fullatt: tuple[int, ...] = (1,)) -> Any:
    """Vision: 32 wide, 2 heads of 16, 8 px patches, 2x2 merge (2.5: SwiGLU, RMSNorm, windows of 112 px,
    full attention in the ``fullatt`` layers; 2: LayerNorm, quick GELU); text: the qwen2vl test family
    (64 wide, M-RoPE sections 2/3/3) with the Qwen-VL marker tokens (those of QWEN3VL_SPECIALS)."""
    text = dict(hf_tiny._common(**QWEN2VL_TEXT.config_kw))
    text.update(vocab_size=N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    ids = dict(image_token_id=Q3_IMG, video_token_id=Q3_VIDEO, vision_start_token_id=Q3_VSTART,
               vision_end_token_id=Q3_VEND, tie_word_embeddings=False)  # fmt: skip
    if v25:
        vision = dict(
            depth=n_layer, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=8, spatial_merge_size=2,
            temporal_patch_size=2, window_size=112, out_hidden_size=text["hidden_size"],
            fullatt_block_indexes=list(fullatt), hidden_act="silu",
        )  # fmt: skip
        cfg = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
    else:
        vision = dict(
            depth=n_layer, embed_dim=32, hidden_size=text["hidden_size"], mlp_ratio=2, num_heads=2, patch_size=8,
            spatial_merge_size=2, temporal_patch_size=2, hidden_act="quick_gelu",
        )  # fmt: skip
        cfg = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, **ids)
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
    return cfg


def build_qwen2vl(seed: int = 0, v25: bool = True, **kw: Any) -> torch.nn.Module:
    """A tiny Qwen2_5_VL/Qwen2VLForConditionalGeneration; the merger's GELU set to the tanh approximation
    that llama.cpp's graph uses (ggml_gelu; HF's is nn.GELU(), the erf one)."""
    torch.manual_seed(seed)
    cls = (
        transformers.Qwen2_5_VLForConditionalGeneration
        if v25
        else transformers.Qwen2VLForConditionalGeneration
    )
    model = cls(qwen2vl_config(v25, **kw)).to(torch.float32)
    hf_tiny._randomize(model.model.language_model, QWEN2VL_TEXT, seed)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 2)
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g) / 8)
    _randomize_vision(model, "model.language_model.", seed)
    model.model.visual.merger.mlp[1] = torch.nn.GELU(approximate="tanh")
    return model.eval()


def qwen2vl_mmproj_tensors(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF-named mmproj tensors as llama.cpp's ``Qwen2VLVisionModel`` converts them (qkv split, the
    Conv3d split into two Conv2d kernels)."""
    vt = "model.visual."
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        if not name.startswith(vt):
            continue
        w, rest = np.asarray(w, dtype=np.float32), name[len(vt) :]
        mod, kind = rest.rsplit(".", 1)
        if rest == "patch_embed.proj.weight":  # [E, C, 2, p, p]
            out["v.patch_embd.weight"] = np.ascontiguousarray(w[:, :, 0])
            out["v.patch_embd.weight.1"] = np.ascontiguousarray(w[:, :, 1])
        elif rest.startswith("blocks."):
            il, m = mod[len("blocks.") :].split(".", 1)
            if m == "attn.qkv":
                for part, x in zip(("q", "k", "v"), np.split(w, 3, axis=0), strict=True):
                    out[f"v.blk.{il}.attn_{part}.{kind}"] = np.ascontiguousarray(x)
            else:
                out[f"v.blk.{il}.{_Q2_VLAYER[m]}.{kind}"] = w
        elif mod == "merger.ln_q":
            out["v.post_ln." + kind] = w
        elif mod in ("merger.mlp.0", "merger.mlp.2"):
            out[f"mm.{mod[-1]}.{kind}"] = w
        else:
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
    return out


def qwen2vl_mmproj_metadata(cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    v, v25 = cfg.vision_config, cfg.model_type == "qwen2_5_vl"
    md: dict[str, Any] = {
        "general.name": f"tiny-{cfg.model_type}-mmproj",
        "general.file_type": hf_tiny.FILE_TYPES[ftype],
        "clip.has_vision_encoder": True,
        "clip.projector_type": "qwen2.5vl_merger" if v25 else "qwen2vl_merger",
        "clip.vision.image_size": 560,  # Qwen2VLVisionModel's placeholder
        "clip.vision.patch_size": v.patch_size,
        "clip.vision.embedding_length": v.hidden_size if v25 else v.embed_dim,
        # the converter writes Qwen2-VL's hidden_size (the merger's output width) here
        "clip.vision.feed_forward_length": v.intermediate_size if v25 else v.hidden_size,
        "clip.vision.block_count": v.depth,
        "clip.vision.attention.head_count": v.num_heads,
        "clip.vision.projection_dim": cfg.text_config.hidden_size,
        "clip.vision.attention.layer_norm_epsilon": float(cfg.text_config.rms_norm_eps),
        "clip.vision.image_mean": [0.48145466, 0.4578275, 0.40821073],
        "clip.vision.image_std": [0.26862954, 0.26130258, 0.27577711],
    }
    if v25:
        md["clip.use_silu"] = True
        md["clip.vision.n_wa_pattern"] = v.fullatt_block_indexes[0] + 1
    return md


@dataclass
class TinyQwen2VL(TinyVLM):
    """A tiny Qwen2.5-VL or Qwen2-VL: text GGUF (arch qwen2vl) + mmproj (qwen2.5vl_merger / qwen2vl_merger)."""

    @property
    def kind(self) -> str:
        return self.cfg.model_type

    def text_state(self) -> dict[str, np.ndarray]:
        pre = "model.language_model."
        out = {"model." + k[len(pre) :]: v for k, v in self.state.items() if k.startswith(pre)}
        out["lm_head.weight"] = self.state["lm_head.weight"]
        return out

    def text_gguf(self, ftype: GGMLType = GGMLType.F32) -> Path:
        key = ("text", ftype)
        if key not in self.files:
            tcfg = self.cfg.text_config
            tensors = hf_tiny.convert(
                QWEN2VL_TEXT, tcfg, hf_tiny.effective_state_dict(self.text_state(), ftype)
            )
            md = hf_tiny.metadata(QWEN2VL_TEXT, tcfg, ftype)
            md.update(tiny_vocab(QWEN3VL_SPECIALS))
            path = self.tmpdir / f"tiny-{self.kind}-text-{ftype.name.lower()}.gguf"
            self.files[key] = hf_tiny.write_gguf(path, QWEN2VL_TEXT.arch, md, tensors, ftype)
        return self.files[key]

    def mmproj_gguf(self, ftype: GGMLType = GGMLType.F32) -> Path:
        key = ("mmproj", ftype)
        if key not in self.files:
            path = self.tmpdir / f"tiny-{self.kind}-mmproj-{ftype.name.lower()}.gguf"
            md = qwen2vl_mmproj_metadata(self.cfg, ftype)
            self.files[key] = write_mmproj(path, md, self.mm_tensors(ftype), ftype)
        return self.files[key]

    def mm_tensors(self, ftype: GGMLType) -> dict[str, np.ndarray]:
        return qwen2vl_mmproj_tensors(self.state)

    def effective_state(self, ftype: GGMLType, text_ftype: GGMLType | None = None) -> dict[str, np.ndarray]:
        out = dict(self.state)
        for k, v in self.state.items():  # F16 rounds element-wise: the qkv split commutes with it
            if k.startswith("model.visual.") and v.ndim >= 2 and k != "model.visual.patch_embed.proj.weight":
                out[k] = _round(k, v, ftype)
        if text_ftype is not None:
            for k, v in hf_tiny.effective_state_dict(self.text_state(), text_ftype).items():
                out[k if k == "lm_head.weight" else "model.language_model." + k[len("model.") :]] = v
        return out


def make_qwen2vl(tmpdir: Path, seed: int = 0, v25: bool = True, **kw: Any) -> TinyQwen2VL:
    hf = build_qwen2vl(seed, v25, **kw)
    return TinyQwen2VL(hf, hf_tiny.hf_state_dict(hf), Path(tmpdir))
