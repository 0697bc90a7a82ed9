"""Tiny random-weight audio encoders of transformers (WhisperEncoder, Qwen2AudioEncoder, VoxtralEncoder) with
their projectors, written as an audio mmproj GGUF the way llama.cpp's ``conversion/ultravox.py`` does
(``a.*`` / ``mm.a.*`` tensors, conv kernels F16, conv biases as ``(n, 1)``), plus a tiny llama text model
whose vocabulary holds the audio marker tokens.

Ultravox has no transformers class; its projector (``UltravoxProjector`` of fixie-ai's ``ultravox_model.py``:
stack frames, RMSNorm, linear, SwiGLU on the second half, RMSNorm, linear) is transcribed here in torch over
HF's WhisperEncoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniAudioEncoderConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioEncoder
from transformers.models.qwen2_audio.modeling_qwen2_audio import Qwen2AudioMultiModalProjector
from transformers.models.voxtral.modeling_voxtral import VoxtralMultiModalProjector
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType
from llamapy.gguf.writer import GGUFWriter
from tests.model import hf_tiny
from tests.mtmd import convert
from tests.mtmd.convert import tiny_vocab

D, FF, N_LAYER, N_HEAD, N_TEXT = 32, 64, 2, 2, 64
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|audio_bos|>", "<|audio_eos|>", "[BEGIN_AUDIO]", "<audio>"]
AUDIO_PAD = 7  # the placeholder id the HF side replaces with audio embeddings
STACK = {"ultravox": 8, "voxtral": 4}


class UltravoxProjector(torch.nn.Module):
    def __init__(self, d_in: int, stack: int, hidden: int, d_out: int) -> None:
        super().__init__()
        self.stack = stack
        self.ln_pre = LlamaRMSNorm(d_in * stack, eps=1e-6)
        self.linear_1 = torch.nn.Linear(d_in * stack, hidden, bias=False)
        self.ln_mid = LlamaRMSNorm(hidden // 2, eps=1e-6)
        self.linear_2 = torch.nn.Linear(hidden // 2, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D]
        b, t, d = x.shape
        pad = -t % self.stack
        x = F.pad(x, (0, 0, 0, pad)).reshape(b, (t + pad) // self.stack, d * self.stack)
        x = self.linear_1(self.ln_pre(x))
        a, gate = x.chunk(2, dim=-1)
        return self.linear_2(self.ln_mid(F.silu(gate) * a))


def build(kind: str, n_mel: int = 80, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(encoder, projector) of ``kind`` with random weights of unit-ish scale."""
    torch.manual_seed(seed)
    common = dict(num_mel_bins=n_mel, max_source_positions=1500)
    if kind == "ultravox":
        cfg = transformers.WhisperConfig(
            d_model=D, encoder_layers=N_LAYER, encoder_attention_heads=N_HEAD, encoder_ffn_dim=FF,
            activation_function="gelu", **common,
        )  # fmt: skip
        enc: torch.nn.Module = WhisperEncoder(cfg)
        proj: torch.nn.Module = UltravoxProjector(D, STACK["ultravox"], 2 * N_TEXT, N_TEXT)
    elif kind == "qwen2a":
        acfg = transformers.Qwen2AudioEncoderConfig(
            d_model=D, encoder_layers=N_LAYER, encoder_attention_heads=N_HEAD, encoder_ffn_dim=FF, **common
        )
        enc = transformers.Qwen2AudioEncoder(acfg)
        full = transformers.Qwen2AudioConfig(audio_config=acfg.to_dict(), text_config={"hidden_size": N_TEXT})
        proj = Qwen2AudioMultiModalProjector(full)
    elif kind == "voxtral":
        acfg = transformers.VoxtralEncoderConfig(
            hidden_size=D, intermediate_size=D * STACK["voxtral"], num_hidden_layers=N_LAYER,
            num_attention_heads=N_HEAD, **common,
        )  # fmt: skip
        enc = transformers.VoxtralEncoder(acfg)
        full = transformers.VoxtralConfig(audio_config=acfg.to_dict(), text_config={"hidden_size": N_TEXT})
        proj = VoxtralMultiModalProjector(full)
    elif kind == "qwen2.5o":  # Qwen2.5-Omni's audio tower (its projection inside: ln_post, proj)
        ocfg = Qwen2_5OmniAudioEncoderConfig(
            d_model=D, encoder_layers=N_LAYER, encoder_attention_heads=N_HEAD, encoder_ffn_dim=FF,
            n_window=100, output_dim=N_TEXT, **common,
        )  # fmt: skip
        enc = Qwen2_5OmniAudioEncoder(ocfg)
        proj = torch.nn.Identity()
    else:
        raise ValueError(kind)
    enc.config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for mod in (enc, proj):
            for name, p in mod.named_parameters():
                if p.ndim == 1:
                    base = 1.0 if ("norm" in name or "ln_" in name) and name.endswith("weight") else 0.0
                    p.copy_(base + torch.randn(p.shape, generator=g) * 0.1)
                elif "embed_positions" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
                else:
                    fan_in = int(np.prod(p.shape[1:]))
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            for name, p in mod.named_parameters():  # the conv kernels as the file stores them (F16)
                if name.startswith(("conv1.weight", "conv2.weight")):
                    p.copy_(p.half().float())
    return enc.float().eval(), proj.float().eval()


def reference(kind: str, enc: torch.nn.Module, proj: torch.nn.Module, mel: np.ndarray) -> np.ndarray:
    """HF's audio embeddings of one window ``mel [n_mel, 3000]``."""
    with torch.no_grad():
        if kind == "qwen2.5o":
            return enc(
                torch.from_numpy(mel), feature_lens=torch.tensor([mel.shape[1]])
            ).last_hidden_state.numpy()
        h = enc(torch.from_numpy(mel[None])).last_hidden_state
        if kind == "voxtral":  # VoxtralModel.get_audio_features: 4 frames per token
            return proj(h.reshape(-1, enc.config.intermediate_size)).numpy()
        return proj(h)[0].numpy()


_LAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_out", "self_attn_layer_norm": "ln1", "final_layer_norm": "ln2",
    "fc1": "ffn_up", "fc2": "ffn_down",
}  # fmt: skip


def mmproj_tensors(kind: str, enc: torch.nn.Module, proj: torch.nn.Module) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, t in enc.state_dict().items():
        w = t.detach().float().numpy()
        if name.startswith("layers."):
            il, rest = name[len("layers.") :].split(".", 1)
            mod, part = rest.rsplit(".", 1)
            out[f"a.blk.{il}.{_LAYER[mod]}.{part}"] = w
        elif name.startswith(("conv1.", "conv2.")):
            conv, part = name.split(".")
            out[f"a.conv1d.{conv[-1]}.{part}"] = w[:, None] if part == "bias" else w
        elif name == "embed_positions.weight":
            out["a.position_embd.weight"] = w
        elif name.startswith(("layer_norm.", "ln_post.")):
            out["a.post_ln." + name.split(".")[1]] = w
        elif name.startswith("proj."):
            out["mm.a.fc." + name.split(".")[1]] = w
    if kind == "qwen2.5o":  # a buffer: the sinusoids llama.cpp's converter writes
        out["a.position_embd.weight"] = enc.positional_embedding.positional_embedding.float().numpy()
    names = {"linear": "mm.a.fc", "linear_1": "mm.a.mlp.1", "linear_2": "mm.a.mlp.2"}
    names |= {"ln_pre": "mm.a.norm_pre", "ln_mid": "mm.a.norm_mid"}
    for name, t in proj.state_dict().items():
        mod, part = name.rsplit(".", 1)
        out[f"{names[mod]}.{part}"] = t.detach().float().numpy()
    return out


def mmproj_metadata(kind: str, n_mel: int) -> dict[str, Any]:
    md: dict[str, Any] = {
        "general.name": f"tiny-{kind}-audio-mmproj",
        "clip.has_vision_encoder": False,
        "clip.has_audio_encoder": True,
        "clip.projector_type": kind,
        "clip.audio.embedding_length": D,
        "clip.audio.feed_forward_length": FF if kind != "voxtral" else D * STACK["voxtral"],
        "clip.audio.block_count": N_LAYER,
        "clip.audio.attention.head_count": N_HEAD,
        "clip.audio.attention.layer_norm_epsilon": 1e-5,
        "clip.audio.projection_dim": N_TEXT,
        "clip.audio.num_mel_bins": n_mel,
    }
    if kind in STACK:
        md["clip.audio.projector.stack_factor"] = STACK[kind]
    return md


def write_gguf(path: Path, md: dict[str, Any], tensors: dict[str, np.ndarray]) -> Path:
    w = GGUFWriter(path, arch="clip")
    for k, val in md.items():
        if isinstance(val, bool):
            w.add_key_value(k, val, GGUFValueType.BOOL)
        elif isinstance(val, float):
            w.add_key_value(k, val, GGUFValueType.FLOAT32)
        elif isinstance(val, int):
            w.add_key_value(k, val, GGUFValueType.UINT32)
        else:
            w.add_key_value(k, val)
    for name, arr in tensors.items():
        t = GGMLType.F16 if name.startswith("a.conv1d.") and name.endswith("weight") else GGMLType.F32
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32), ggml_type=t)
    w.write()
    w.close()
    return Path(path)


@dataclass
class TinyAudio:
    kind: str
    n_mel: int
    enc: torch.nn.Module
    proj: torch.nn.Module
    mmproj: Path

    def reference(self, mel: np.ndarray) -> np.ndarray:
        return reference(self.kind, self.enc, self.proj, mel)


def make(kind: str, tmpdir: Path, n_mel: int = 80, seed: int = 0) -> TinyAudio:
    enc, proj = build(kind, n_mel, seed)
    path = write_gguf(
        Path(tmpdir) / f"tiny-{kind}-mmproj.gguf",
        mmproj_metadata(kind, n_mel),
        mmproj_tensors(kind, enc, proj),
    )
    return TinyAudio(kind, n_mel, enc, proj, path)


def make_text(tmpdir: Path, seed: int = 0) -> tuple[torch.nn.Module, Path]:
    """A tiny llama (hidden 64) whose vocabulary has the audio markers; (HF model, GGUF path)."""
    base = hf_tiny.FAMILIES["llama"]
    fam = replace(base, name="audio-text", config_kw={**base.config_kw, "vocab_size": convert.N_VOCAB})
    hf = hf_tiny.build_hf(fam, seed)
    cfg = hf.config
    sd = hf_tiny.effective_state_dict(hf_tiny.hf_state_dict(hf), GGMLType.F32)
    md = hf_tiny.metadata(fam, cfg, GGMLType.F32)
    md.update(tiny_vocab(SPECIALS))
    path = hf_tiny.write_gguf(
        Path(tmpdir) / "tiny-audio-text.gguf", fam.arch, md, hf_tiny.convert(fam, cfg, sd), GGMLType.F32
    )
    return hf, path
