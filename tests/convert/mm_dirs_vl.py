"""Tiny checkpoints of the vision-language models with no transformers class, for ``llamapy convert --mmproj``
(test-only: torch): Kimi-VL (Moonshot AI's remote code; the oracle is ``tests/mtmd/kimivl_oracle.py``'s
transcription of it) and MiniCPM-V 2.x (openbmb's remote code; the oracle is ``tests/mtmd/minicpmv_tiny.py``'s
NaViT SigLIP + resampler). Each directory holds what the Hub's files hold: ``config.json`` with the remote
code's keys, ``model.safetensors`` under the remote model's names (the text model's embedding included, which
the converter must drop) and ``preprocessor_config.json``. ``VlDir.features(px)`` is the oracle's image
embeddings of a preprocessed ``F32[3, H, W]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

N_TEXT = 64  # Kimi-VL's text width


@dataclass
class VlDir:
    path: Path
    features: Callable[[np.ndarray], np.ndarray]
    oracle: Any = None  # the oracle object (MiniCPM-V: TinyMiniCPMV, with the legacy converter's tensors)


def _save(d: Path, sd: dict[str, Any], config: dict[str, Any], preproc: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in sd.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    (d / "config.json").write_text(json.dumps(config, indent=2))
    (d / "preprocessor_config.json").write_text(json.dumps(preproc, indent=2))


def make_kimivl_dir(root: Path, seed: int = 0) -> VlDir:
    """moonshotai/Kimi-VL-A3B-Instruct's layout: ``vision_tower.`` (MoonViT), ``multi_modal_projector.``,
    ``language_model.``; a 6 x 6 position table of 4-pixel patches, 3 blocks of width 32, 2 heads."""
    import torch

    from tests.convert.mm_dirs import _fill
    from tests.mtmd.kimivl_oracle import KimiVLMultiModalProjector, MoonVit

    p, s, e = 4, 6, 32
    vit = MoonVit(hidden_size=e, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, patch_size=p,
                  init_pos_emb_height=s, init_pos_emb_width=s)  # fmt: skip
    proj = KimiVLMultiModalProjector(e, (2, 2), N_TEXT)
    m = torch.nn.ModuleDict({"vision_tower": vit, "multi_modal_projector": proj}).float().eval()
    _fill(m, seed)
    d = root / "tiny-kimivl"
    if not (d / "config.json").is_file():
        sd = dict(m.state_dict())
        sd["language_model.model.embed_tokens.weight"] = torch.zeros(300, N_TEXT)
        vision = dict(model_type="moonvit", patch_size=p, init_pos_emb_height=s, init_pos_emb_width=s,
                      num_attention_heads=2, num_hidden_layers=3, hidden_size=e, intermediate_size=64,
                      merge_kernel_size=[2, 2])  # fmt: skip
        text = dict(model_type="deepseek_v3", hidden_size=N_TEXT, vocab_size=300, num_hidden_layers=1)
        cfg = dict(architectures=["KimiVLForConditionalGeneration"], model_type="kimi_vl", vision_config=vision,
                   text_config=text, media_placeholder_token_id=6, pad_token_id=0)  # fmt: skip
        pre = dict(image_mean=[0.5] * 3, image_std=[0.5] * 3, in_token_limit=4096, patch_size=p,
                   merge_kernel_size=[2, 2], pad_input=True)  # fmt: skip
        _save(d, sd, cfg, pre)

    def features(px: np.ndarray) -> np.ndarray:
        ny, nx = px.shape[1] // p, px.shape[2] // p
        pv = px.reshape(3, ny, p, nx, p).transpose(1, 3, 0, 2, 4).reshape(ny * nx, 3, p, p)
        with torch.no_grad():
            return proj(vit(torch.from_numpy(np.ascontiguousarray(pv)), torch.tensor([[ny, nx]]))).numpy()

    return VlDir(d, features)


def make_minicpmv_dir(root: Path, seed: int = 0) -> VlDir:
    """openbmb/MiniCPM-V-2_6's layout: ``vpm.`` (the NaViT SigLIP), ``resampler.`` (query, kv_proj, attn.in_proj_*,
    attn.out_proj, ln_q / ln_kv / ln_post, proj), ``llm.``; config.json's ``version``, ``query_num``,
    ``image_size`` (the slice), ``vision_config``; the processor's ``norm_mean`` / ``norm_std``. The tower and
    resampler are tests/mtmd/minicpmv_tiny's (2 layers of width 32, 16 queries of width 256, 70 x 70 table)."""
    import torch

    from tests.mtmd import minicpmv_tiny as mt

    tiny = mt.TinyMiniCPMV(root, version=3, n_query=16, text=None, seed=seed)
    d = root / "tiny-minicpmv"
    if not (d / "config.json").is_file():
        sd = {f"vpm.{k}": v for k, v in tiny.vit.state_dict().items()}
        sd |= {f"resampler.{k}": v for k, v in tiny.res.state_dict().items()}
        sd["llm.model.embed_tokens.weight"] = torch.zeros(300, mt.D)
        vision = dict(model_type="siglip_vision_model", hidden_size=mt.N_VIT, image_size=mt.SIDE * mt.P,
                      intermediate_size=64, num_attention_heads=2, num_hidden_layers=2, patch_size=mt.P)  # fmt: skip
        cfg = dict(architectures=["MiniCPMV"], model_type="minicpmv", version=2.6, query_num=16,
                   image_size=mt.SLICE, patch_size=mt.P, hidden_size=mt.D, num_hidden_layers=1, vocab_size=300,
                   drop_vision_last_layer=False, vision_config=vision,
                   slice_config={"max_slice_nums": 9, "patch_size": mt.P, "scale_resolution": mt.SLICE})  # fmt: skip
        pre = dict(image_processor_type="MiniCPMVImageProcessor", norm_mean=[0.5] * 3, norm_std=[0.5] * 3,
                   max_slice_nums=9, scale_resolution=mt.SLICE, patch_size=mt.P, image_feature_size=16)  # fmt: skip
        _save(d, sd, cfg, pre)
    return VlDir(d, tiny.features, tiny)


# (case, --outtype) compared with llama.cpp's convert_hf_to_gguf.py --mmproj (where it converts the model)
VL_RUNS: list[tuple[str, str]] = [("kimivl", "f16")]


def make_vl_dir(case: str, root: Path) -> VlDir:
    return {"kimivl": make_kimivl_dir, "minicpmv": make_minicpmv_dir}[case](root)
