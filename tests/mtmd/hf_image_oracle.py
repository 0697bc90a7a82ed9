# Test-only oracle: the image preprocessing of transformers' Llama4ImageProcessor (models/llama4/
# image_processing_llama4.py) and Kimi_K25ImageProcessor (models/kimi_k25/image_processing_kimi_k25.py), as in
# transformers 5.24, with the TorchvisionBackend methods they call (image_processing_backends.py) and
# image_transforms.split_to_tiles.
#
# Copyright 2025 HuggingFace Inc. team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License"); you may not use this file except in compliance
# with the License. You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software distributed under the License is
# distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See
# the License for the specific language governing permissions and limitations under the License.
#
# Changes from the original: both processors import torchvision (transforms.v2.functional), and the only
# torchvision wheels this project can install are CUDA builds that do not load against the CPU torch; the
# torchvision calls are written out with what torchvision 0.28 does for a uint8 CPU tensor (resize_image:
# torch's F.interpolate(antialias=True, align_corners=False) on the uint8 tensor where torchvision resizes uint8
# natively (bicubic; bilinear on AVX2 / AVX512 CPUs), else in float32, clamped and rounded; pad_image: F.pad with
# zeros; normalize_image: sub(mean).div_(std) in the tensor's dtype). One image at a time (no shape grouping),
# the processors' kwargs resolved to their defaults, type hints and formatting. test_hf_image_oracle.py checks
# this file against the real processors when a working torchvision is importable.
"""Llama 4's tiles (``llama4_preprocess``, ``llama4_prompt``) and Kimi-K2.5's NaViT resize
(``kimi_k25_preprocess``) as transformers' image processors compute them."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["get_best_fit", "kimi_k25_preprocess", "llama4_preprocess", "llama4_prompt", "navit_resize"]


# -- torchvision's resize / pad on a uint8 CHW tensor ------------------------------------------------------
def _resize(image: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    if tuple(image.shape[-2:]) == tuple(size):
        return image
    native = mode == "bicubic" or torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    x = image[None] if native else image[None].to(torch.float32)
    x = F.interpolate(x, size=list(size), mode=mode, align_corners=False, antialias=True)
    if not native:
        x = x.clamp_(0, 255).round_().to(torch.uint8)
    return x[0]


def _pad(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``tvF.pad(image, [0, 0, right, bottom], fill=0)``."""
    return F.pad(image, (0, width - image.shape[-1], 0, height - image.shape[-2]), value=0)


def _to_tensor(image: np.ndarray) -> torch.Tensor:
    """uint8[H, W, 3] -> uint8[3, H, W] (the backend's input conversion)."""
    return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).contiguous()


# -- Llama 4 -----------------------------------------------------------------------------------------------
def get_factors(dividend: int) -> set[int]:
    factors_set = set()
    for i in range(1, int(dividend**0.5) + 1):
        if dividend % i == 0:
            factors_set.add(i)
            factors_set.add(dividend // i)
    return factors_set


def get_max_res_without_distortion(
    image_size: tuple[int, int], target_size: tuple[int, int]
) -> tuple[int, int]:
    original_height, original_width = image_size
    target_height, target_width = target_size
    scale_w = target_width / original_width
    scale_h = target_height / original_height
    if scale_w < scale_h:
        new_width = target_width
        new_height = min(math.floor(original_height * scale_w), target_height)
    else:
        new_height = target_height
        new_width = min(math.floor(original_width * scale_h), target_width)
    return new_height, new_width


def find_supported_resolutions(max_num_chunks: int, patch_size: int) -> list[tuple[int, int]]:
    asp_dict = defaultdict(list)
    for chunk_size in range(max_num_chunks, 0, -1):
        _factors = sorted(get_factors(chunk_size))
        _asp_ratios = [(factor, chunk_size // factor) for factor in _factors]
        for height, width in _asp_ratios:
            ratio_float = height / width
            asp_dict[ratio_float].append((height, width))
    possible_resolutions = []
    for value in asp_dict.values():
        for height, depth in value:
            possible_resolutions.append((height * patch_size, depth * patch_size))
    return possible_resolutions


def get_best_fit(
    image_size: tuple[int, int], possible_resolutions: torch.Tensor, resize_to_max_canvas: bool = False
) -> torch.Tensor:
    original_height, original_width = image_size
    target_heights, target_widths = possible_resolutions[:, 0], possible_resolutions[:, 1]
    scale_w = target_widths / original_width
    scale_h = target_heights / original_height
    scales = torch.where(scale_h > scale_w, scale_w, scale_h)
    upscaling_options = scales[scales >= 1]
    if len(upscaling_options) > 0:
        if resize_to_max_canvas:
            selected_scale = torch.max(upscaling_options)
        else:
            selected_scale = torch.min(upscaling_options)
    else:
        downscaling_options = scales[scales < 1]
        selected_scale = torch.max(downscaling_options)
    chosen_canvas = possible_resolutions[scales == selected_scale]
    if len(chosen_canvas) > 1:
        areas = chosen_canvas[:, 0] * chosen_canvas[:, 1]
        optimal_idx = torch.argmin(areas)
        optimal_canvas = chosen_canvas[optimal_idx]
    else:
        optimal_canvas = chosen_canvas[0]
    return optimal_canvas


def _llama4_rescale_and_normalize(images: torch.Tensor, mean: list[float], std: list[float]) -> torch.Tensor:
    """Llama4ImageProcessor.rescale_and_normalize: in bfloat16, "as in the original implementation"."""
    images = images.to(dtype=torch.bfloat16) * (1 / 255)
    m = torch.as_tensor(mean, dtype=images.dtype).view(-1, 1, 1)
    s = torch.as_tensor(std, dtype=images.dtype).view(-1, 1, 1)
    return images.sub(m).div_(s)


def split_to_tiles(images: torch.Tensor, num_tiles_height: int, num_tiles_width: int) -> torch.Tensor:
    num_channels, height, width = images.size()
    images = images.view(
        num_channels, num_tiles_height, height // num_tiles_height, num_tiles_width, width // num_tiles_width
    )
    image = images.permute(1, 3, 0, 2, 4).contiguous()
    return image.view(
        num_tiles_width * num_tiles_height, num_channels, height // num_tiles_height, width // num_tiles_width
    )


def llama4_preprocess(
    image: np.ndarray,
    tile: int = 336,
    max_patches: int = 16,
    mean: tuple[float, ...] = (0.5,) * 3,
    std: tuple[float, ...] = (0.5,) * 3,
) -> tuple[np.ndarray, tuple[int, int]]:
    """``(pixel_values F32[n, 3, tile, tile], (ratio_h, ratio_w))`` of one uint8[H, W, 3] image (the values are
    bfloat16 numbers): Llama4ImageProcessor._preprocess with resize_to_max_canvas False."""
    img = _to_tensor(image)
    possible_resolutions = torch.tensor(
        find_supported_resolutions(max_num_chunks=max_patches, patch_size=tile)
    )
    image_size = img.shape[-2:]
    target_size = get_best_fit(image_size, possible_resolutions, resize_to_max_canvas=False)
    max_upscaling_size = tile
    new_target_height = min(max(image_size[0], max_upscaling_size), target_size[0])
    new_target_width = min(max(image_size[1], max_upscaling_size), target_size[1])
    new_size = get_max_res_without_distortion(image_size, (new_target_height, new_target_width))
    new_size = (max(int(new_size[0]), 1), max(int(new_size[1]), 1))
    processed = _resize(img, new_size, "bilinear")
    processed = _pad(processed, int(target_size[0]), int(target_size[1]))
    processed = _llama4_rescale_and_normalize(processed, list(mean), list(std))
    ratio_h, ratio_w = int(target_size[0]) // tile, int(target_size[1]) // tile
    processed = split_to_tiles(processed, ratio_h, ratio_w)
    if ratio_h * ratio_w > 1:
        global_tile = _llama4_rescale_and_normalize(
            _resize(img, (tile, tile), "bilinear"), list(mean), list(std)
        )
        processed = torch.cat([processed, global_tile[None]], dim=0)
    return processed.to(torch.float32).numpy(), (ratio_h, ratio_w)


def llama4_prompt(aspect_ratio: tuple[int, int], num_patches_per_chunk: int) -> str:
    """Llama4Processor._prompt_split_image."""
    img_string = "<|image_start|>"
    ratio_h, ratio_w = aspect_ratio
    if ratio_h * ratio_w > 1:
        for _yy in range(ratio_h):
            for xx in range(ratio_w):
                img_string += "<|patch|>" * num_patches_per_chunk
                if xx < ratio_w - 1:
                    img_string += "<|tile_x_separator|>"
            img_string += "<|tile_y_separator|>"
    img_string += "<|image|>"
    img_string += "<|patch|>" * num_patches_per_chunk
    img_string += "<|image_end|>"
    return img_string


# -- Kimi-K2.5 ---------------------------------------------------------------------------------------------
def navit_resize(
    height: int, width: int, patch_size: int, merge_kernel_size: int, max_patches: int, max_size_per_side: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    num_patches_h = max(1.0, height // patch_size)
    num_patches_w = max(1.0, width // patch_size)
    current_patch_count = num_patches_h * num_patches_w
    scale_for_total_patches = math.sqrt(max_patches / current_patch_count)
    scale_for_height_patches = (max_size_per_side * patch_size) / height
    scale_for_width_patches = (max_size_per_side * patch_size) / width
    scale = min(1.0, scale_for_total_patches, scale_for_height_patches, scale_for_width_patches)
    new_height, new_width = max(1, int(height * scale)), max(1, int(width * scale))
    new_height = min(new_height, max_size_per_side * patch_size)
    new_width = min(new_width, max_size_per_side * patch_size)
    factor = merge_kernel_size * patch_size
    pad_height = (factor - new_height % factor) % factor + new_height
    pad_width = (factor - new_width % factor) % factor + new_width
    return (new_height, new_width), (pad_height, pad_width)


def kimi_k25_preprocess(
    image: np.ndarray,
    patch_size: int = 14,
    merge_size: int = 2,
    max_patches: int = 16384,
    max_size_per_side: int = 512,
    mean: tuple[float, ...] = (0.5,) * 3,
    std: tuple[float, ...] = (0.5,) * 3,
) -> np.ndarray:
    """``F32[3, H, W]`` of one uint8[H, W, 3] image (before the patchify): Kimi_K25ImageProcessor._preprocess,
    rescale and normalize fused as the TorchvisionBackend does (``(x - mean / (1/255)) / (std / (1/255))``)."""
    img = _to_tensor(image)
    height, width = img.shape[-2:]
    (rh, rw), (ph, pw) = navit_resize(height, width, patch_size, merge_size, max_patches, max_size_per_side)
    img = _pad(_resize(img, (rh, rw), "bicubic"), ph, pw)
    rescale_factor = 1 / 255
    m = (torch.tensor(mean) * (1.0 / rescale_factor)).view(-1, 1, 1)
    s = (torch.tensor(std) * (1.0 / rescale_factor)).view(-1, 1, 1)
    return img.to(torch.float32).sub(m).div_(s).numpy()
