"""A tiny random-weight MiniCPM-V (resampler projector) and its PyTorch oracle.

transformers has no MiniCPM-V 2.x / 4.0 / 4.5 class (its ``minicpmv4_6`` / ``minicpmv4_7`` / ``minicpm_ocr`` models
use the newer downsampling merger, no resampler), so the oracle is assembled here from independent pieces: the
vision tower is transformers' ``Idefics2VisionTransformer`` (the NaViT SigLIP MiniCPM-V ships as
``modeling_navit_siglip.py``), and ``OracleResampler`` restates the model's ``resampler.py`` semantics with
``torch.nn.MultiheadAttention``: keys ``ln_kv(kv_proj(x)) + pos``, values ``ln_kv(kv_proj(x))``, queries
``ln_q(query)``, heads of 128, ``ln_post``, ``@ proj``; ``pos`` is MAE's 2-D sin-cos table (the grid's
w coordinate encoded in the first half) cut to the frame's patch grid. The text model is a tiny transformers
causal LM whose input embeddings get the image features at the image tokens (the model's
``get_vllm_embedding``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers.models.idefics2.modeling_idefics2 import Idefics2VisionTransformer

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.mtmd import convert

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<image>", "</image>", "<slice>", "</slice>", "<unk_img>"]
# patch, position table side (70: llama.cpp hard-codes it), clip.vision.image_size (the slice size)
P, SIDE, SLICE = 4, 70, 48
N_VIT, D = 32, 256  # ViT width; resampler / text width (2 heads of 128)

_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2",
          "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}  # fmt: skip


def _sincos_1d(d: int, pos: np.ndarray) -> np.ndarray:
    omega = np.arange(d // 2, dtype=np.float64) / (d / 2.0)
    out = np.einsum("m,d->md", pos.reshape(-1).astype(np.float64), 1.0 / 10000**omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def mae_sincos(d: int, h: int, w: int) -> np.ndarray:
    """MAE's get_2d_sincos_pos_embed: F32[h*w, d], the meshgrid's first (w) coordinate in the first half."""
    gw, gh = np.meshgrid(np.arange(w, dtype=np.float64), np.arange(h, dtype=np.float64))
    return np.concatenate([_sincos_1d(d // 2, gw), _sincos_1d(d // 2, gh)], axis=1).astype(np.float32)


class OracleResampler(torch.nn.Module):
    def __init__(self, n_query: int, d: int, kv_dim: int) -> None:
        super().__init__()
        self.query = torch.nn.Parameter(torch.zeros(n_query, d))
        self.kv_proj = torch.nn.Linear(kv_dim, d, bias=False)
        self.attn = torch.nn.MultiheadAttention(d, d // 128)
        self.ln_q, self.ln_kv, self.ln_post = (torch.nn.LayerNorm(d, eps=1e-6) for _ in range(3))
        self.proj = torch.nn.Parameter(torch.zeros(d, d))

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        pos = torch.from_numpy(mae_sincos(self.proj.shape[0], h, w))
        kv = self.ln_kv(self.kv_proj(x))[:, None]
        out = self.attn(self.ln_q(self.query)[:, None], kv + pos[:, None], kv, need_weights=False)[0]
        return self.ln_post(out[:, 0]) @ self.proj


class TinyMiniCPMV:
    """ViT + resampler (+ a text model, with ``text``) and the GGUF files llama.cpp's converter would write."""

    def __init__(self, tmp: Path, version: int = 3, n_query: int | None = 16, text: str | None = "qwen2",
                 seed: int = 0) -> None:  # fmt: skip
        self.version, self.n_query = version, n_query
        torch.manual_seed(seed)
        vcfg = transformers.Idefics2VisionConfig(hidden_size=N_VIT, intermediate_size=64, num_hidden_layers=2,
                                                 num_attention_heads=2, image_size=SIDE * P, patch_size=P,
                                                 layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh")  # fmt: skip
        vcfg._attn_implementation = "eager"
        self.vit = Idefics2VisionTransformer(vcfg).eval()
        convert._randomize_vision(self.vit, "-", seed)
        self.res = OracleResampler(n_query or 64, D, N_VIT).eval()
        g = torch.Generator().manual_seed(seed + 5)
        with torch.no_grad():
            for name, p in self.res.named_parameters():
                if p.ndim == 1:
                    p.copy_(("weight" in name) + torch.randn(p.shape, generator=g) * 0.1)
                elif name == "query":
                    p.copy_(torch.randn(p.shape, generator=g))
                else:
                    gain = 2.0 if name == "attn.in_proj_weight" else 1.0
                    p.copy_(torch.randn(p.shape, generator=g) * gain / math.sqrt(p.shape[-1]))
        self.mmproj_path = self.write_mmproj(tmp / f"mmproj-v{version}.gguf")
        self.text_path: Path | None = None
        if text is not None:
            self._text(tmp, hf_tiny.FAMILIES[text], seed)

    def _text(self, tmp: Path, fam: hf_tiny.Family, seed: int) -> None:
        kw = hf_tiny._common(**fam.config_kw)
        kw.update(hidden_size=D, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=convert.N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1)  # fmt: skip
        if "head_dim" in kw:
            kw["head_dim"] = 64
        cfg = getattr(transformers, fam.config_cls)(**kw)
        cfg._attn_implementation = "eager"
        torch.manual_seed(seed)
        self.lm = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        hf_tiny._randomize(self.lm, fam, seed)
        self.lm.eval()
        md = hf_tiny.metadata(fam, cfg, GGMLType.F32)
        md.update(convert.tiny_vocab(SPECIALS))
        tensors = hf_tiny.convert(fam, cfg, hf_tiny.hf_state_dict(self.lm))
        self.text_path = hf_tiny.write_gguf(
            tmp / f"text-v{self.version}.gguf", fam.arch, md, tensors, GGMLType.F32
        )

    # -- the GGUF side ----------------------------------------------------------------------------------
    def mm_tensors(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name, w in self.vit.state_dict().items():
            w = w.detach().numpy().astype(np.float32)
            if name.startswith("encoder.layers."):
                il, rest = name[len("encoder.layers.") :].split(".", 1)
                mod, kind = rest.rsplit(".", 1)
                out[f"v.blk.{il}.{_LAYER[mod]}.{kind}"] = w
            elif name.startswith("post_layernorm."):
                out["v.post_ln." + name.rsplit(".", 1)[1]] = w
        e = "embeddings."
        sd = {k: v.detach().numpy().astype(np.float32) for k, v in self.vit.state_dict().items()}
        out["v.patch_embd.weight"] = sd[e + "patch_embedding.weight"]
        out["v.patch_embd.bias"] = sd[e + "patch_embedding.bias"]
        out["v.position_embd.weight"] = sd[e + "position_embedding.weight"]
        r = {k: v.detach().numpy().astype(np.float32) for k, v in self.res.state_dict().items()}
        out["resampler.query"] = r["query"]
        out["resampler.kv.weight"] = r["kv_proj.weight"]
        ws, bs = np.split(r["attn.in_proj_weight"], 3), np.split(r["attn.in_proj_bias"], 3)
        for k, n in enumerate("qkv"):
            out[f"resampler.attn.{n}.weight"], out[f"resampler.attn.{n}.bias"] = ws[k], bs[k]
        out["resampler.attn.out.weight"] = r["attn.out_proj.weight"]
        out["resampler.attn.out.bias"] = r["attn.out_proj.bias"]
        for n in ("q", "kv", "post"):
            out[f"resampler.ln_{n}.weight"] = r[f"ln_{n}.weight"]
            out[f"resampler.ln_{n}.bias"] = r[f"ln_{n}.bias"]
        out["resampler.proj.weight"] = np.ascontiguousarray(r["proj"].T)  # the converter's transpose
        out["resampler.pos_embed_k"] = mae_sincos(D, 70, 70)  # written by the converter, unused
        return out

    def metadata(self) -> dict[str, Any]:
        md = {
            "general.name": "tiny-minicpmv-mmproj", "general.file_type": 0, "clip.has_vision_encoder": True,
            "clip.has_minicpmv_projector": True, "clip.projector_type": "resampler",
            "clip.minicpmv_version": np.int32(self.version),  # INT32, as the converter writes it
            "clip.vision.image_size": SLICE, "clip.vision.patch_size": P,
            "clip.vision.embedding_length": N_VIT, "clip.vision.feed_forward_length": 64,
            "clip.vision.block_count": 2, "clip.vision.attention.head_count": 2, "clip.vision.projection_dim": 0,
            "clip.vision.attention.layer_norm_epsilon": 1e-6, "clip.vision.image_mean": [0.5] * 3,
            "clip.vision.image_std": [0.5] * 3, "clip.use_gelu": True,
        }  # fmt: skip
        if self.n_query is not None:
            md["clip.minicpmv_query_num"] = self.n_query
        return md

    def write_mmproj(self, path: Path, md: dict | None = None, tensors: dict | None = None) -> Path:
        md = self.metadata() if md is None else md
        return convert.write_mmproj(path, md, self.mm_tensors() if tensors is None else tensors, GGMLType.F32)

    # -- the oracle -------------------------------------------------------------------------------------
    def features(self, px: np.ndarray) -> np.ndarray:
        """F32[n_query, D] of one preprocessed frame F32[3, H, W]."""
        h, w = px.shape[1] // P, px.shape[2] // P
        with torch.no_grad():
            x = self.vit(pixel_values=torch.from_numpy(px)[None], patch_attention_mask=torch.ones(1, h, w,
                         dtype=torch.bool)).last_hidden_state[0]  # fmt: skip
            return self.res(x, h, w).numpy()

    def logits(self, ids: list[int], image_pos: list[int], feats: np.ndarray) -> np.ndarray:
        """Last-token logits with the image features at ``image_pos`` (get_vllm_embedding)."""
        with torch.no_grad():
            emb = self.lm.get_input_embeddings()(torch.tensor([ids]))
            emb[0, image_pos] = torch.from_numpy(feats)
            return self.lm(inputs_embeds=emb).logits[0, -1].numpy()
