"""tests/mtmd/hf_image_oracle.py (transformers' Llama 4 and Kimi-K2.5 image processors, written out without
torchvision) against the real processors, where a working torchvision is importable: not in this project's
environment (the installable torchvision wheels are CUDA builds that do not load against the CPU torch), so these
skip here; they were run once against torchvision 0.28.0's pure-Python transforms (its C extension left out) with
transformers 5.24: equal pixels, tile layouts and prompts on every size below."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.mtmd.hf_image_oracle import kimi_k25_preprocess, llama4_preprocess, llama4_prompt

pytest.importorskip("torchvision.transforms.v2.functional", reason="needs a torchvision that loads")

RNG = np.random.default_rng(5)
SIZES = [
    (20, 31),
    (40, 90),
    (33, 200),
    (50, 60),
    (32, 64),
    (7, 300),
    (500, 13),
    (1, 1),
    (100, 100),
    (37, 129),
]


@pytest.mark.parametrize("hw", SIZES)
def test_llama4_oracle_is_hf(hw: tuple[int, int]) -> None:
    from transformers.models.llama4.image_processing_llama4 import Llama4ImageProcessor
    from transformers.models.llama4.processing_llama4 import Llama4Processor

    data = RNG.integers(0, 256, (*hw, 3), dtype=np.uint8)
    out = Llama4ImageProcessor(size={"height": 32, "width": 32})(torch.from_numpy(data).permute(2, 0, 1))
    want, ratio = llama4_preprocess(data, tile=32)
    assert tuple(out["aspect_ratios"][0].tolist()) == ratio
    assert np.array_equal(out["pixel_values"][0].to(torch.float32).numpy(), want)
    assert Llama4Processor._prompt_split_image(None, ratio, 16) == llama4_prompt(ratio, 16)


@pytest.mark.parametrize("hw", [(45, 70), (13, 7), (1, 3), (301, 97), (97, 301), (2100, 4), (130, 131)])
def test_kimi_k25_oracle_is_hf(hw: tuple[int, int]) -> None:
    from transformers.models.kimi_k25.image_processing_kimi_k25 import Kimi_K25ImageProcessor

    data = RNG.integers(0, 256, (*hw, 3), dtype=np.uint8)
    out = Kimi_K25ImageProcessor(patch_size=4, max_patches=256)(torch.from_numpy(data).permute(2, 0, 1))
    want = kimi_k25_preprocess(data, patch_size=4, max_patches=256)
    _, gh, gw = out["image_grid_thw"][0].tolist()
    assert (gh * 4, gw * 4) == want.shape[1:]
    pv = out["pixel_values"].reshape(gh, gw, 3, 4, 4).permute(2, 0, 3, 1, 4).reshape(3, gh * 4, gw * 4)
    assert np.array_equal(pv.numpy(), want)
