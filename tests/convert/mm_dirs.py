"""Tiny vision-language checkpoint directories for ``llamapy convert --mmproj`` (test-only: torch, transformers).

``make_mm_dir(case, root)`` builds the transformers model of ``MM_CASES[case]`` (the configs of
``tests/mtmd``: 32-wide vision towers, 3 layers: llama.cpp maps ``mm.N`` only for N below the block count), sets every weight from NumPy's seeded generator (so the
bytes do not depend on torch's RNG), saves it with ``save_pretrained`` in the Hub's layout (Gemma 3's
``vision_tower.vision_model.``, which transformers 5 saves without) and writes the processor's config.
``MmDir.features(pixels)`` is transformers' image embeddings of a preprocessed ``F32[3, H, W]``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

N_VOCAB = 300
IMG_BREAK = 5  # Mistral 3's [IMG_BREAK] id in its tokenizer_config.json
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def _text(**kw: Any) -> dict[str, Any]:
    d = dict(vocab_size=N_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=2,
             eos_token_id=1)  # fmt: skip
    d.update(kw)
    return d


def _siglip(**kw: Any) -> dict[str, Any]:
    d = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2, image_size=64,
             patch_size=8, num_channels=3, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh")  # fmt: skip
    d.update(kw)
    return d


def _gemma3() -> Any:
    import transformers

    return transformers.Gemma3Config(
        text_config=_text(head_dim=16, sliding_window=512), vision_config=_siglip(vision_use_head=False),
        mm_tokens_per_image=16, boi_token_index=4, eoi_token_index=5, image_token_index=6, tie_word_embeddings=True,
    )  # fmt: skip


def _idefics3() -> Any:
    import transformers

    return transformers.Idefics3Config(
        text_config=_text(),
        vision_config=_siglip(),
        scale_factor=2,
        image_token_id=6,
        tie_word_embeddings=False,
    )


def _qwen2vl(v25: bool) -> Any:
    import transformers

    text = _text(rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    ids = dict(image_token_id=6, video_token_id=7, vision_start_token_id=8, vision_end_token_id=9)
    if v25:
        vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=8, spatial_merge_size=2,
                      temporal_patch_size=2, window_size=112, out_hidden_size=64, fullatt_block_indexes=[1],
                      hidden_act="silu")  # fmt: skip
        return transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
    vision = dict(depth=3, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2, patch_size=8, spatial_merge_size=2,
                  temporal_patch_size=2, hidden_act="quick_gelu")  # fmt: skip
    return transformers.Qwen2VLConfig(text_config=text, vision_config=vision, **ids)


def _qwen3vl() -> Any:
    import transformers

    text = _text(
        head_dim=16,
        rope_scaling={"rope_type": "default", "mrope_section": [3, 3, 2], "mrope_interleaved": True},
    )
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=8, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16, deepstack_visual_indexes=[0, 1],
                  hidden_act="gelu_pytorch_tanh")  # fmt: skip
    return transformers.Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=6, video_token_id=7,
                                      vision_start_token_id=8, vision_end_token_id=9, tie_word_embeddings=False)  # fmt: skip


def _glm4v() -> Any:
    import transformers

    rope = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [2, 3, 3],
    }
    text = _text(num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, rope_parameters=rope)
    vision = dict(depth=3, hidden_size=32, num_heads=2, intermediate_size=48, out_hidden_size=64, patch_size=8,
                  image_size=32, spatial_merge_size=2, temporal_patch_size=2, rms_norm_eps=1e-5, hidden_act="silu")  # fmt: skip
    return transformers.Glm4vConfig(text_config=text, vision_config=vision, image_token_id=6, image_start_token_id=4,
                                    image_end_token_id=5, video_token_id=7, video_start_token_id=8,
                                    video_end_token_id=9)  # fmt: skip


def _mistral3() -> Any:
    import transformers

    vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                  head_dim=16, patch_size=8, image_size=64, hidden_act="silu")  # fmt: skip
    return transformers.Mistral3Config(
        text_config=_text(head_dim=16, rms_norm_eps=1e-5), vision_config=vision, image_token_index=4,
        spatial_merge_size=2, projector_hidden_act="gelu_pytorch_tanh", multimodal_projector_bias=True,
        vision_feature_layer=-1,
    )  # fmt: skip


def _lfm2vl() -> Any:
    import transformers

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2, patch_size=16,
                  num_patches=256, vision_use_head=False, layer_norm_eps=1e-6)  # fmt: skip
    text = _text(model_type="lfm2", layer_types=["full_attention"], conv_L_cache=3)
    return transformers.Lfm2VlConfig(
        vision_config=vision, text_config=text, image_token_id=6, projector_hidden_size=48,
        projector_hidden_act="gelu_pytorch_tanh", downsample_factor=2,
    )  # fmt: skip


def _qwen2audio() -> Any:
    import transformers

    audio = dict(d_model=32, encoder_layers=3, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=80,
                 max_source_positions=1500)  # fmt: skip
    return transformers.Qwen2AudioConfig(
        audio_config=audio, text_config=_text(model_type="qwen2"), audio_token_index=6
    )


def _voxtral() -> Any:
    import transformers

    audio = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2, num_mel_bins=128,
                 max_source_positions=1500)  # fmt: skip
    return transformers.VoxtralConfig(audio_config=audio, text_config=_text(model_type="llama", head_dim=16),
                                      audio_token_id=6)  # fmt: skip


def _llama4() -> Any:
    import transformers

    from tests.model import hf_tiny

    text = dict(hf_tiny._common(**hf_tiny.FAMILIES["llama4"].config_kw))
    text.update(vocab_size=N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1, num_hidden_layers=1)
    vision = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2, image_size=32,
                  patch_size=4, vision_output_dim=48, projector_input_dim=48, projector_output_dim=48,
                  pixel_shuffle_ratio=0.5, norm_eps=1e-5, hidden_act="gelu",
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})  # fmt: skip
    return transformers.Llama4Config(vision_config=vision, text_config=text, image_token_index=6)


def _llava15() -> Any:
    import transformers

    vision = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=2, image_size=32, patch_size=8, projection_dim=32)  # fmt: skip
    return transformers.LlavaConfig(text_config=_text(), vision_config=vision, image_token_index=6,
                                    projector_hidden_act="gelu", image_seq_length=16)  # fmt: skip


def _internvl() -> Any:  # 4 layers: llama.cpp maps its mlp1.3 (mm.model.mlp.3) only below the block count
    import transformers

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2, image_size=[32, 32],
                  patch_size=[8, 8], attention_bias=True, hidden_act="gelu", layer_norm_eps=1e-6)  # fmt: skip
    return transformers.InternVLConfig(vision_config=vision, text_config=_text(model_type="qwen2"), image_token_id=6,
                                       downsample_ratio=0.5, projector_hidden_act="gelu", tie_word_embeddings=False)  # fmt: skip


def _minicpmv4_6() -> Any:
    import transformers

    from tests.model import hf_tiny

    text = dict(hf_tiny._common(**hf_tiny.FAMILIES["qwen35"].config_kw))
    text.update(vocab_size=N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1, model_type="qwen3_5_text")
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2, image_size=32,
                  patch_size=4, layer_norm_eps=1e-6)  # fmt: skip
    return transformers.MiniCPMV4_6Config(text_config=text, vision_config=vision, insert_layer_id=1, image_size=48,
                                          image_token_id=6)  # fmt: skip


class _UltravoxModel:
    """fixie-ai's UltravoxModel as its checkpoints hold it (no transformers class: remote code): a Whisper
    encoder (``audio_tower.``) and the stacking SwiGLU projector (``multi_modal_projector.``; ``tests/mtmd/
    audio_tiny``'s transcription), the text model apart (``text_model_id``). config.json as llama.cpp's
    ``UltravoxWhisperEncoderModel`` reads it: ``audio_config``, ``text_config``, ``stack_factor``."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import torch
        import transformers
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        from tests.mtmd import audio_tiny

        a = {k: v for k, v in cfg["audio_config"].items() if k != "model_type"}
        wcfg = transformers.WhisperConfig(**a, activation_function="gelu")
        wcfg._attn_implementation = "eager"
        n, d = cfg["text_config"]["hidden_size"], wcfg.d_model
        enc, proj = WhisperEncoder(wcfg), audio_tiny.UltravoxProjector(d, cfg["stack_factor"], 2 * n, n)
        self.module = torch.nn.ModuleDict({"audio_tower": enc, "multi_modal_projector": proj}).float().eval()
        self.cfg = cfg

    def save_pretrained(self, d: Path) -> None:
        from safetensors.torch import save_file

        d.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.module.state_dict().items()}, str(d / "model.safetensors"),
                  metadata={"format": "pt"})  # fmt: skip
        (d / "config.json").write_text(json.dumps(self.cfg, indent=2))


def _ultravox() -> dict[str, Any]:
    from tests.mtmd import audio_tiny

    audio = dict(model_type="whisper", d_model=audio_tiny.D, encoder_layers=3, encoder_attention_heads=audio_tiny.N_HEAD,
                 encoder_ffn_dim=audio_tiny.FF, num_mel_bins=80, max_source_positions=1500)  # fmt: skip
    return dict(architectures=["UltravoxModel"], model_type="ultravox", audio_config=audio,
                text_config=dict(model_type="llama", hidden_size=audio_tiny.N_TEXT), stack_factor=8,
                projector_act="swiglu", audio_token_index=7)  # fmt: skip


def _kimik25() -> Any:
    import transformers

    from tests.model import hf_tiny

    text = dict(hf_tiny._common(**hf_tiny.FAMILIES["deepseek2"].config_kw))
    text.update(vocab_size=N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1, model_type="deepseek_v3")
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2, patch_size=4,
                  pos_emb_height=6, pos_emb_width=6, merge_kernel_size=[2, 2],
                  rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})  # fmt: skip
    return transformers.Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=32,
                                       image_token_id=6, tie_word_embeddings=False)  # fmt: skip


@dataclass(frozen=True)
class MmCase:
    name: str
    config: Callable[[], Any]
    model_cls: str
    preproc: dict[str, Any]
    hub_rename: tuple[tuple[str, str], ...] = ()  # (prefix, replacement) of the saved names
    tokenizer_config: dict[str, Any] | None = None
    config_patch: dict[str, Any] | None = None  # merged into the saved config.json (the Hub's extra keys)


MM_CASES: dict[str, MmCase] = {
    c.name: c
    for c in [
        MmCase("gemma3", _gemma3, "Gemma3ForConditionalGeneration",
               {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "image_seq_length": 16},
               (("vision_tower.", "vision_tower.vision_model."),)),
        MmCase("idefics3", _idefics3, "Idefics3ForConditionalGeneration",
               {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "size": {"longest_edge": 64}}),
        MmCase("qwen2.5vl", lambda: _qwen2vl(True), "Qwen2_5_VLForConditionalGeneration",
               {"image_mean": CLIP_MEAN, "image_std": CLIP_STD}),
        MmCase("qwen2vl", lambda: _qwen2vl(False), "Qwen2VLForConditionalGeneration",
               {"image_mean": CLIP_MEAN, "image_std": CLIP_STD}),
        MmCase("qwen3vl", _qwen3vl, "Qwen3VLForConditionalGeneration", {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}),
        MmCase("glm4v", _glm4v, "Glm4vForConditionalGeneration", {"image_mean": CLIP_MEAN, "image_std": CLIP_STD}),
        MmCase("qwen2audio", _qwen2audio, "Qwen2AudioForConditionalGeneration", {}),
        MmCase("voxtral", _voxtral, "VoxtralForConditionalGeneration", {}),
        MmCase("llama4", _llama4, "Llama4ForConditionalGeneration", {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}),
        MmCase("mistral3", _mistral3, "Mistral3ForConditionalGeneration",
               {"image_mean": CLIP_MEAN, "image_std": CLIP_STD},
               tokenizer_config={"added_tokens_decoder": {"5": {"content": "[IMG_BREAK]", "special": True}}}),
        MmCase("lfm2vl", _lfm2vl, "Lfm2VlForConditionalGeneration", {"image_mean": [0.5] * 3, "image_std": [0.5] * 3},
               (("model.vision_tower.", "model.vision_tower.vision_model."),)),
        MmCase("llava15", _llava15, "LlavaForConditionalGeneration", {"image_mean": CLIP_MEAN, "image_std": CLIP_STD}),
        # (the Hub's Intern-S1 layout: InternVisionModel in vision_config.architectures, llama.cpp's key, and
        # model.vision_tower. names, where transformers 5 saves vision_tower.: llama.cpp's filter drops those)
        MmCase("internvl", _internvl, "InternVLForConditionalGeneration",
               {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]},
               (("vision_tower.", "model.vision_tower."), ("multi_modal_projector.", "model.multi_modal_projector.")),
               config_patch={"vision_config": {"architectures": ["InternVisionModel"]}, "max_dynamic_patch": 6}),
        MmCase("ultravox", _ultravox, "UltravoxModel", {}),
        # the Hub's (moonshotai/Kimi-K2.5) names, architecture and vision keys, which llama.cpp's converter reads
        MmCase("kimik25", _kimik25, "Kimi_K25ForConditionalGeneration",
               {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "in_patch_limit": 256},
               (("model.mm_projector.", "mm_projector."), ("vision_tower.encoder.patch_embed.", "vision_tower.patch_embed.")),
               config_patch={"architectures": ["KimiK25ForConditionalGeneration"],
                             "vision_config": {"init_pos_emb_height": 6, "init_pos_emb_width": 6, "init_pos_emb_time": 4,
                                               "projector_hidden_act": "gelu", "projector_ln_eps": 1e-5}}),
        MmCase("minicpmv4_6", _minicpmv4_6, "MiniCPMV4_6ForConditionalGeneration",
               {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "scale_resolution": 48}),
    ]
}  # fmt: skip


def _fill(model: Any, seed: int) -> None:
    """Every parameter from NumPy's generator: vectors around 1 (norm weights) or 0 (biases), position
    embeddings 0.5 sigma, matrices fan-in scaled (q/k twice, so attention is not uniform)."""
    import torch

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            shape = tuple(p.shape)
            x = rng.standard_normal(shape).astype(np.float32)
            if len(shape) == 1:
                base = 0.0 if ("bias" in name or "soft_emb_norm" in name) else 1.0
                x = base + 0.1 * x
            elif "position_embedding" in name or "pos_embed" in name or "embed_tokens" in name:
                x = 0.5 * x
            else:
                gain = 2.0 if name.endswith(("q_proj.weight", "k_proj.weight", "qkv.weight")) else 1.0
                x = x * np.float32(gain / math.sqrt(int(np.prod(shape[1:]))))
                if name.endswith(
                    ("conv1.weight", "conv2.weight")
                ):  # the audio convs as the file stores them (F16)
                    x = x.astype(np.float16).astype(np.float32)
            p.copy_(torch.from_numpy(x))


@dataclass
class MmDir:
    case: MmCase
    path: Path
    hf: Any

    def features(self, px: np.ndarray) -> np.ndarray:
        """transformers' image embeddings ``[n_tokens, n_embd_text]`` of a preprocessed ``F32[3, H, W]``, laid out as
        llama.cpp's projector gives them."""
        import torch

        m, name = getattr(self.hf, "model", self.hf), self.case.name
        n_embd = self.hf.config.text_config.hidden_size if hasattr(self.hf, "config") else 0
        with torch.no_grad():
            if name == "gemma3":
                out = m.get_image_features(pixel_values=torch.from_numpy(px[None]))
            elif name == "idefics3":
                out = m.get_image_features(pixel_values=torch.from_numpy(px[None, None]))
            elif name in ("qwen2vl", "qwen2.5vl", "glm4v"):
                c, h, w = px.shape
                p, t, s = 8, 2, 2  # patch, temporal patch, merge: HF's patchify of one frame repeated
                x = np.repeat(px[None], t, axis=0).reshape(1, t, c, h // p // s, s, p, w // p // s, s, p)
                x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(h // p * (w // p), c * t * p * p)
                out = m.get_image_features(
                    torch.from_numpy(np.ascontiguousarray(x)), torch.tensor([[1, h // p, w // p]])
                )
            elif name == "qwen3vl":
                c, h, w = px.shape
                p, s = 8, 2
                x = np.stack([px, px]).reshape(2, c, h // p // s, s, p, w // p // s, s, p)
                x = x.transpose(2, 5, 3, 6, 1, 0, 4, 7).reshape(h // p * (w // p), c * 2 * p * p)
                r = m.get_image_features(pixel_values=torch.from_numpy(np.ascontiguousarray(x)),
                                         image_grid_thw=torch.tensor([[1, h // p, w // p]]))  # fmt: skip
                parts = [r.pooler_output[0]] + [f[0] for f in r.deepstack_features]  # [main | deepstack...]
                return np.concatenate([t.numpy() for t in parts], axis=1)
            elif name == "ultravox":  # px: a log-mel window [n_mel, 3000]
                h = self.hf["audio_tower"](torch.from_numpy(px[None])).last_hidden_state
                return self.hf["multi_modal_projector"](h)[0].numpy()
            elif name in ("qwen2audio", "voxtral"):  # px: a log-mel window [n_mel, 3000]
                base = getattr(self.hf, "model", self.hf)
                h = base.audio_tower(torch.from_numpy(px[None])).last_hidden_state
                if name == "voxtral":  # 4 frames per token
                    h = h.reshape(-1, self.hf.config.audio_config.intermediate_size)
                return base.multi_modal_projector(h).reshape(-1, n_embd).numpy()
            elif name == "llama4":
                v = self.hf.vision_model(torch.from_numpy(px[None])).last_hidden_state
                out = self.hf.multi_modal_projector(v.reshape(-1, v.shape[-1]))
            elif name == "minicpmv4_6":  # NaViT-packed: the patches row-major in one [3, p, n*p] strip
                p, (ny, nx) = 4, (px.shape[1] // 4, px.shape[2] // 4)
                pv = px.reshape(3, ny, p, nx, p).transpose(0, 2, 1, 3, 4).reshape(1, 3, p, ny * nx * p)
                out = m.get_image_features(pixel_values=torch.from_numpy(np.ascontiguousarray(pv)),
                                           target_sizes=torch.tensor([[ny, nx]]))  # fmt: skip
            elif name == "kimik25":
                p, (ny, nx) = 4, (px.shape[1] // 4, px.shape[2] // 4)
                pv = px.reshape(3, ny, p, nx, p).transpose(1, 3, 0, 2, 4).reshape(ny * nx, 3, p, p)
                out = m.get_image_features(pixel_values=torch.from_numpy(np.ascontiguousarray(pv)),
                                           image_grid_thw=torch.tensor([[1, ny, nx]]))  # fmt: skip
            elif name in ("llava15", "internvl"):
                out = m.get_image_features(pixel_values=torch.from_numpy(px[None]))
            elif name == "mistral3":
                out = m.get_image_features(
                    pixel_values=torch.from_numpy(px[None]), image_sizes=torch.tensor([px.shape[1:]])
                )
            elif name == "lfm2vl":
                p = 16
                nh, nw = px.shape[1] // p, px.shape[2] // p
                pt = px.reshape(3, nh, p, nw, p).transpose(1, 3, 2, 4, 0).reshape(1, nh * nw, -1)
                out = m.get_image_features(pixel_values=torch.from_numpy(np.ascontiguousarray(pt)),
                                           spatial_shapes=torch.tensor([[nh, nw]]),
                                           pixel_attention_mask=torch.ones(1, nh * nw, dtype=torch.long))  # fmt: skip
            else:
                raise KeyError(name)
        out = getattr(out, "pooler_output", out)
        if isinstance(out, (list, tuple)):
            out = torch.cat([o.reshape(-1, n_embd) for o in out])
        feats = np.asarray(out, dtype=np.float32).reshape(-1, n_embd)
        if name == "mistral3":  # llama.cpp's layout: [IMG_BREAK]'s embedding after every row but the last
            nx, ny = px.shape[2] // 16, px.shape[1] // 16
            brk = m.language_model.embed_tokens.weight[IMG_BREAK].detach().numpy()[None]
            rows = [feats[r * nx : (r + 1) * nx] for r in range(ny)]
            feats = np.concatenate(
                [x for r, row in enumerate(rows) for x in ([row, brk] if r < ny - 1 else [row])]
            )
        return feats


def make_mm_dir(case: MmCase, root: Path, seed: int = 0) -> MmDir:
    """The checkpoint directory of ``case`` under ``root`` (made once per root) and the model itself."""
    import torch
    import transformers

    cfg = case.config()
    if case.model_cls == "UltravoxModel":
        model = _UltravoxModel(cfg)
        _fill(model.module, seed)
        return _save(case, root, model, model.module)
    for c in (cfg, cfg.text_config, getattr(cfg, "vision_config", None), getattr(cfg, "audio_config", None)):
        if c is not None:
            c._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, case.model_cls)(cfg)
    if case.name != "llama4":  # (.to() would drop Llama 4's complex rope table; it is F32 already)
        model = model.to(torch.float32)
    model.eval()
    _fill(model, seed)
    if case.name in ("qwen2vl", "qwen2.5vl"):  # llama.cpp's merger GELU is ggml's tanh one (HF's: erf)
        model.model.visual.merger.mlp[1] = torch.nn.GELU(approximate="tanh")
    if case.name == "llama4":  # llama.cpp's ViT and adapter GELU are ggml's (tanh); HF's: erf
        from transformers.models.llama4 import modeling_llama4 as ml4

        for mod in model.vision_model.modules():
            if isinstance(mod, (ml4.Llama4VisionMLP, ml4.Llama4VisionMLP2)):
                mod.activation_fn = torch.nn.GELU(approximate="tanh")
    if case.name in ("llava15", "internvl"):  # llama.cpp's GELUs are ggml's (tanh); the configs say erf
        tanh = torch.nn.GELU(approximate="tanh")
        model.model.multi_modal_projector.act = tanh
        if case.name == "internvl":
            for layer in model.model.vision_tower.encoder.layer:
                layer.mlp.activation_fn = tanh
    if case.name == "kimik25":
        model.model.mm_projector.act = torch.nn.GELU(approximate="tanh")
    if case.name == "qwen3vl":
        for mg in [model.model.visual.merger, *model.model.visual.deepstack_merger_list]:
            mg.act_fn = torch.nn.GELU(approximate="tanh")
    return _save(case, root, model, model)


def _save(case: MmCase, root: Path, saver: Any, model: Any) -> MmDir:
    from safetensors.numpy import load_file, save_file

    d = root / f"tiny-{case.name}"
    if not (d / "config.json").is_file():
        saver.save_pretrained(d)
        st = d / "model.safetensors"
        sd = load_file(str(st))
        for old, new in case.hub_rename:
            sd = {(new + k[len(old) :] if k.startswith(old) else k): v for k, v in sd.items()}
        save_file(sd, str(st), metadata={"format": "pt"})
        (d / "preprocessor_config.json").write_text(json.dumps(case.preproc))
        if case.config_patch is not None:
            cj = json.loads((d / "config.json").read_text())
            for k, v in case.config_patch.items():
                cj[k] = {**cj[k], **v} if isinstance(v, dict) else v
            (d / "config.json").write_text(json.dumps(cj, indent=2))
        if case.tokenizer_config is not None:
            (d / "tokenizer_config.json").write_text(json.dumps(case.tokenizer_config))
    return MmDir(case, d, model)
