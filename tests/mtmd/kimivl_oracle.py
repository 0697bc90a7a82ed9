# Test-only oracle: the vision tower and projector of Kimi-VL, transcribed from Moonshot AI's
# ``modeling_kimi_vl.py`` (https://huggingface.co/moonshotai/Kimi-VL-A3B-Instruct, file modeling_kimi_vl.py;
# read here from a public copy of it). transformers 5.24 has no Kimi-VL class.
#
# Copyright 2025 The Moonshot AI Team, DeepSeek-AI, and HuggingFace Inc. team. All rights reserved.
# The parts below (MoonViT and the projector) are the file's own code, under the MIT License:
#
# Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated
# documentation files (the "Software"), to deal in the Software without restriction, including without limitation
# the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and
# to permit persons to whom the Software is furnished to do so, subject to the following conditions:
#
# The above copyright notice and this permission notice shall be included in all copies or substantial portions
# of the Software.
#
# THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO
# THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
# AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF
# CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
# DEALINGS IN THE SOFTWARE.
#
# Changes from the original: the config objects are replaced by arguments (MoonVit, KimiVLMultiModalProjector),
# only the SDPA attention is kept (the one the original selects by default), type hints and formatting.
#
# KimiVLImageProcessor (at the end) is transcribed from the same repository's image_processing_kimi_vl.py, same
# copyright and license; changes: torchvision's functional calls on the PIL image (TF.pad, TF.center_crop,
# TF.to_tensor, TF.normalize) are written out with what torchvision does for a PIL input (ImageOps.expand with
# fill 0, a crop at round((size - crop) / 2), / 255, (x - mean) / std): torchvision is not installable here;
# the BaseImageProcessor / BatchFeature wrapping and patchify are left out; the defaults are the released
# preprocessor_config.json's (the class's own: pad_input False, CLIP's mean and std).
"""Kimi-VL's MoonViT (``MoonVit``), ``KimiVLMultiModalProjector`` and ``KimiVLImageProcessor``, as Moonshot AI's
modeling_kimi_vl.py and image_processing_kimi_vl.py."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image, ImageOps
from transformers.activations import GELUActivation, PytorchGELUTanh

__all__ = ["KimiVLImageProcessor", "KimiVLMultiModalProjector", "MoonVit", "patch_merger"]


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_cu_seqlens: torch.Tensor, k_cu_seqlens: torch.Tensor
) -> torch.Tensor:
    seq_length = q.shape[0]
    attention_mask = torch.zeros([1, seq_length, seq_length], device=q.device, dtype=torch.bool)
    for i in range(1, len(q_cu_seqlens)):
        attention_mask[..., q_cu_seqlens[i - 1] : q_cu_seqlens[i], q_cu_seqlens[i - 1] : q_cu_seqlens[i]] = (
            True
        )
    q = q.transpose(0, 1)
    k = k.transpose(0, 1)
    v = v.transpose(0, 1)
    attn_output = F.scaled_dot_product_attention(q, k, v, attention_mask, dropout_p=0.0)
    attn_output = attn_output.transpose(0, 1)
    return attn_output.reshape(seq_length, -1)


def _apply_rope_input_validation(x: torch.Tensor, freqs_cis: torch.Tensor) -> None:
    assert x.ndim == freqs_cis.ndim + 1, (x.shape, freqs_cis.shape)
    assert x.shape[:-2] == freqs_cis.shape[:-1], (x.shape, freqs_cis.shape)
    assert x.shape[-1] == 2 * freqs_cis.shape[-1], (x.shape, freqs_cis.shape)
    assert freqs_cis.dtype == torch.complex64, freqs_cis.dtype


def apply_rope(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """xq, xk: (..., num_heads, head_dim); freqs_cis: (..., head_dim/2) complex64, per position in the grid."""
    _apply_rope_input_validation(xq, freqs_cis)
    _apply_rope_input_validation(xk, freqs_cis)
    freqs_cis = freqs_cis.unsqueeze(-2)  # ..., 1, head_dim/2
    xq_ = torch.view_as_complex(xq.float().view(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().view(*xq.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(-2)  # ..., num_heads, head_dim
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(-2)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Learnable2DInterpPosEmb(nn.Module):
    def __init__(self, height: int, width: int, dim: int, interpolation_mode: str = "bicubic") -> None:
        super().__init__()
        self.height = height
        self.width = width
        self.interpolation_mode = interpolation_mode
        self.weight = nn.Parameter(torch.empty(height, width, dim))
        nn.init.normal_(self.weight)

    def forward(self, x: torch.Tensor, grid_hws: torch.Tensor) -> torch.Tensor:
        pos_embs = []
        for shape in grid_hws.tolist():
            if shape == self.weight.shape[:-1]:
                pos_embs.append(self.weight.flatten(end_dim=1))
            else:
                pos_embs.append(
                    F.interpolate(
                        self.weight.permute((2, 0, 1)).unsqueeze(0), size=shape, mode=self.interpolation_mode
                    )
                    .squeeze(0)
                    .permute((1, 2, 0))
                    .flatten(end_dim=1)
                )
        return x + torch.cat(pos_embs)


class MoonVisionPatchEmbed(nn.Module):
    def __init__(
        self,
        out_dim: int,
        in_dim: int = 3,
        patch_size: int | tuple[int, int] = (14, 14),
        pos_emb_height: int = 14,
        pos_emb_width: int = 14,
    ) -> None:
        super().__init__()
        assert isinstance(patch_size, (int, Sequence)), f"Invalid patch_size type: {type(patch_size)}"
        if isinstance(patch_size, int):
            patch_size = (patch_size, patch_size)
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_dim, out_dim, kernel_size=patch_size, stride=patch_size)
        self.pos_emb = Learnable2DInterpPosEmb(height=pos_emb_height, width=pos_emb_width, dim=out_dim)

    def forward(self, x: torch.Tensor, grid_hws: torch.Tensor) -> torch.Tensor:
        """x (L, Channels, p, p), grid_hws (N, 2) -> (L, Cout)"""
        x = self.proj(x).view(x.size(0), -1)
        return self.pos_emb(x, grid_hws)


class Rope2DPosEmb(nn.Module):
    """2D rotary position embedding with multi-resolution support (RoFormer, VisionLLaMA)."""

    def __init__(self, dim: int, max_height: int, max_width: int, theta_base: float = 10000) -> None:
        super().__init__()
        self.dim = dim
        assert self.dim % 4 == 0, "dim must be divisible by 4"
        self.max_height = max_height
        self.max_width = max_width
        self.theta_base = theta_base
        self.freqs_cis: torch.Tensor | None = None

    def _precompute_freqs_cis(self, device: torch.device) -> torch.Tensor:
        """Complex tensor of shape (max_height, max_width, dim//2)."""
        n = self.max_height * self.max_width
        flat_pos = torch.arange(0, n).float().to(device)
        x_pos = flat_pos % self.max_width
        y_pos = flat_pos // self.max_width
        dim_range = torch.arange(0, self.dim, 4)[: (self.dim // 4)].float().to(device)  # C/4
        freqs = 1.0 / (self.theta_base ** (dim_range / self.dim))
        x_freqs = torch.outer(x_pos, freqs).float()  # N, C/4
        y_freqs = torch.outer(y_pos, freqs).float()  # N, C/4
        x_cis = torch.polar(torch.ones_like(x_freqs), x_freqs)  # N, C/4
        y_cis = torch.polar(torch.ones_like(y_freqs), y_freqs)  # N, C/4
        freqs_cis = torch.cat([x_cis.unsqueeze(dim=-1), y_cis.unsqueeze(dim=-1)], dim=-1)  # N, C/4, 2
        return freqs_cis.reshape(self.max_height, self.max_width, -1)  # max_height, max_width, C/2

    def get_freqs_cis(self, grid_hws: torch.Tensor) -> torch.Tensor:
        if self.freqs_cis is None:
            self.freqs_cis = self._precompute_freqs_cis(grid_hws.device)
        shapes = grid_hws.tolist()
        assert all(1 <= h <= self.max_height and 1 <= w <= self.max_width for h, w in shapes)
        return torch.cat([self.freqs_cis[:h, :w].reshape(-1, self.dim // 2) for h, w in shapes], dim=0)


class MLP2(nn.Module):
    def __init__(self, dims: list[int], activation: nn.Module, bias: bool = True) -> None:
        super().__init__()
        assert len(dims) == 3
        self.fc0 = nn.Linear(dims[0], dims[1], bias=bias)
        self.fc1 = nn.Linear(dims[1], dims[2], bias=bias)
        self.activation = activation
        for m in [self.fc0, self.fc1]:
            nn.init.trunc_normal_(m.weight, std=math.sqrt(2 / m.in_features))
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(self.activation(self.fc0(x)))


class MoonVitEncoderLayer(nn.Module):
    def __init__(
        self, num_heads: int, hidden_dim: int, mlp_dim: int, *, activation: nn.Module, attn_bias: bool = False
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.hidden_size_per_attention_head = self.hidden_dim // self.num_heads
        self.norm0 = nn.LayerNorm(hidden_dim)
        self.norm1 = nn.LayerNorm(hidden_dim)
        self.mlp = MLP2([hidden_dim, mlp_dim, hidden_dim], activation)
        self.wqkv = nn.Linear(hidden_dim, hidden_dim * 3, bias=attn_bias)
        self.wo = nn.Linear(hidden_dim, hidden_dim, bias=attn_bias)

    def attention_qkvpacked(
        self, x: torch.Tensor, cu_seqlens: torch.Tensor, rope_freqs_cis: torch.Tensor
    ) -> torch.Tensor:
        xqkv = self.wqkv(x)
        qkv_shape = xqkv.size()[:-1] + (3, self.num_heads, self.hidden_size_per_attention_head)
        xqkv = xqkv.view(*qkv_shape)
        xq, xk, xv = torch.unbind(xqkv, dim=-3)
        xq, xk = apply_rope(xq, xk, rope_freqs_cis)
        attn_out = sdpa_attention(xq, xk, xv, q_cu_seqlens=cu_seqlens, k_cu_seqlens=cu_seqlens)
        return self.wo(attn_out)

    def forward(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, rope_freqs_cis: torch.Tensor):
        residual = hidden_states
        hidden_states = self.norm0(hidden_states)
        attn_out = self.attention_qkvpacked(hidden_states, cu_seqlens, rope_freqs_cis=rope_freqs_cis)
        hidden_states = residual + attn_out
        residual = hidden_states
        hidden_states = self.mlp(self.norm1(hidden_states))
        return residual + hidden_states


class MoonVitEncoder(nn.Module):
    def __init__(self, hidden_dim: int, num_layers: int, block_cfg: dict) -> None:
        super().__init__()
        self.rope_2d = Rope2DPosEmb(block_cfg["hidden_dim"] // block_cfg["num_heads"], 512, 512)
        self.blocks = nn.ModuleList([MoonVitEncoderLayer(**block_cfg) for _ in range(num_layers)])
        self.final_layernorm = nn.LayerNorm(hidden_dim)

    def forward(self, hidden_states: torch.Tensor, grid_hws: torch.Tensor) -> torch.Tensor:
        rope_freqs_cis = self.rope_2d.get_freqs_cis(grid_hws=grid_hws)
        lengths = torch.cat(
            (
                torch.zeros(1, device=hidden_states.device, dtype=grid_hws.dtype),
                grid_hws[:, 0] * grid_hws[:, 1],
            )
        )
        cu_seqlens = lengths.cumsum(dim=0, dtype=torch.int32)
        for block in self.blocks:
            hidden_states = block(hidden_states, cu_seqlens, rope_freqs_cis=rope_freqs_cis)
        return self.final_layernorm(hidden_states)


def patch_merger(
    x: torch.Tensor, grid_hws: torch.Tensor, merge_kernel_size: Sequence[int] = (2, 2)
) -> list[torch.Tensor]:
    d_model = x.size(-1)
    outputs = []
    pre_sum = 0
    for x_shape in grid_hws.tolist():
        height, width = x_shape[0], x_shape[1]
        seq = x[pre_sum : pre_sum + height * width]
        kernel_height, kernel_width = merge_kernel_size
        new_height, new_width = height // kernel_height, width // kernel_width
        reshaped_seq = seq.view(new_height, kernel_height, new_width, kernel_width, d_model)
        reshaped_seq = reshaped_seq.permute(0, 2, 1, 3, 4).contiguous()
        outputs.append(reshaped_seq.view(new_height * new_width, kernel_height * kernel_width, -1))
        pre_sum += height * width
    return outputs


class MoonVit(nn.Module):
    """``MoonVitPretrainedModel``: patch embedding, encoder, patch merger."""

    def __init__(
        self,
        hidden_size: int,
        num_hidden_layers: int,
        num_attention_heads: int,
        intermediate_size: int,
        patch_size: int,
        init_pos_emb_height: int,
        init_pos_emb_width: int,
        merge_kernel_size: Sequence[int] = (2, 2),
    ) -> None:
        super().__init__()
        self.merge_kernel_size = merge_kernel_size
        self.patch_size = patch_size
        self.patch_embed = MoonVisionPatchEmbed(
            out_dim=hidden_size,
            patch_size=patch_size,
            pos_emb_height=init_pos_emb_height,
            pos_emb_width=init_pos_emb_width,
        )
        self.encoder = MoonVitEncoder(
            hidden_dim=hidden_size,
            num_layers=num_hidden_layers,
            block_cfg={
                "num_heads": num_attention_heads,
                "hidden_dim": hidden_size,
                "mlp_dim": intermediate_size,
                "activation": PytorchGELUTanh(),
                "attn_bias": True,
            },
        )

    def forward(self, pixel_values: torch.Tensor, grid_hws: torch.Tensor) -> list[torch.Tensor]:
        hidden_states = self.patch_embed(pixel_values, grid_hws)
        hidden_states = self.encoder(hidden_states, grid_hws)
        return patch_merger(hidden_states, grid_hws, merge_kernel_size=self.merge_kernel_size)


class KimiVLMultiModalProjector(nn.Module):
    def __init__(
        self, vision_hidden_size: int, merge_kernel_size: Sequence[int], text_hidden_size: int
    ) -> None:
        super().__init__()
        self.hidden_size = vision_hidden_size * merge_kernel_size[0] * merge_kernel_size[1]
        self.pre_norm = torch.nn.LayerNorm(vision_hidden_size, eps=1e-05)
        self.linear_1 = nn.Linear(self.hidden_size, self.hidden_size, bias=True)
        self.act = GELUActivation()
        self.linear_2 = nn.Linear(self.hidden_size, text_hidden_size, bias=True)

    def forward(self, image_features: list[torch.Tensor]) -> torch.Tensor:
        image_features = torch.cat(image_features, dim=0)
        hidden_states = self.pre_norm(image_features).view(-1, self.hidden_size)
        hidden_states = self.linear_1(hidden_states)
        hidden_states = self.act(hidden_states)
        return self.linear_2(hidden_states)


class KimiVLImageProcessor:
    """The released configuration: patch_size 14, pad_input True, in_token_limit 4096, mean = std = 0.5."""

    def __init__(
        self,
        patch_size: int = 14,
        pad_input: bool = True,
        image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5),
        image_std: tuple[float, float, float] = (0.5, 0.5, 0.5),
        in_token_limit: int = 4096,
        merge_kernel_size: Sequence[int] = (2, 2),
    ) -> None:
        self.in_token_limit = in_token_limit
        self.patch_size = patch_size
        self.pad_input = pad_input
        self.image_mean = image_mean
        self.image_std = image_std
        self.merge_kernel_size = merge_kernel_size

    def rescale(self, image: Image.Image, merge_kernel_size: Sequence[int] = (2, 2)) -> Image.Image:
        w, h = image.size
        patch_size = self.patch_size

        if (w // patch_size) * (h // patch_size) > self.in_token_limit:
            scale = math.sqrt(self.in_token_limit / ((w // patch_size) * (h // patch_size)))
            new_w, new_h = int(w * scale), int(h * scale)
            image = image.resize((new_w, new_h), Image.Resampling.BICUBIC)
        if self.pad_input:
            new_w, new_h = image.size
            pad_size_h = merge_kernel_size[0] * patch_size
            pad_size_w = merge_kernel_size[1] * patch_size

            pad_h = (pad_size_h - new_h % pad_size_h) % pad_size_h
            pad_w = (pad_size_w - new_w % pad_size_w) % pad_size_w

            image = ImageOps.expand(
                image, border=(0, 0, pad_w, pad_h), fill=0
            )  # TF.pad(image, (0, 0, pad_w, pad_h))
        else:
            new_w, new_h = image.size
            new_w = new_w - new_w % patch_size
            new_h = new_h - new_h % patch_size
            top, left = int(round((image.size[1] - new_h) / 2.0)), int(round((image.size[0] - new_w) / 2.0))
            image = image.crop(
                (left, top, left + new_w, top + new_h)
            )  # TF.center_crop(image, (new_h, new_w))

        w, h = image.size
        if w // patch_size >= 512 or h // patch_size >= 512:
            raise ValueError("Exceed pos emb")

        return image

    def to_tensor(self, image: Image.Image) -> np.ndarray:
        return np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / np.float32(255.0)

    def normalize(self, image: np.ndarray) -> np.ndarray:
        mean = np.asarray(self.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(self.image_std, dtype=np.float32)[:, None, None]
        return (image - mean) / std

    def __call__(self, image: Image.Image) -> np.ndarray:
        """``F32[3, H, W]``: ``_preprocess`` up to the patchify."""
        image = self.rescale(image, self.merge_kernel_size)
        return self.normalize(self.to_tensor(image))
