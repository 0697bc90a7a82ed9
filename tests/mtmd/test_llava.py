"""LLaVA 1.5 style (mlp projector over CLIP, feature layer -2, class token dropped) vs Hugging Face."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llamapy.context import Context
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, TextChunk
from tests.mtmd import convert

RNG = np.random.default_rng(13)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("ftype", [GGMLType.F32, GGMLType.F16])
def test_image_embeddings_match_hf(llava_vlm: convert.TinyVLM, ftype: GGMLType) -> None:
    cm = ClipModel(llava_vlm.mmproj_gguf(ftype))
    assert cm.hparams.projector_type == "mlp" and cm.hparams.ffn_op == "gelu_quick"
    px = RNG.uniform(-1.5, 1.5, (3, 32, 32)).astype(np.float32)
    got = cm.encode(px)
    llava_vlm.load(ftype)
    with torch.no_grad():
        out = llava_vlm.hf.model.get_image_features(pixel_values=torch.from_numpy(px[None]))
    ref = np.asarray(getattr(out, "pooler_output", out)).reshape(-1, 64)
    assert got.shape == (16, 64)
    assert _rel(got, ref) < 1e-3


def test_pad_colour_and_logits_match_hf(llava_vlm: convert.TinyVLM) -> None:
    model = Model.load(llava_vlm.text_gguf())
    mt = MtmdContext(llava_vlm.mmproj_gguf(), model)
    chunks = mt.tokenize("what is <__media__> this", [Bitmap(np.full((10, 40, 3), 200, np.uint8))])
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    mean, std = np.array([0.48145466, 0.4578275, 0.40821073]), np.array([0.26862954, 0.26130258, 0.27577711])
    pad = (np.array([122, 116, 104]) / 255 - mean) / std  # llama.cpp pads LLaVA images with the CLIP mean
    np.testing.assert_allclose(img.pixels[:, 0, 0], pad, atol=1e-6)
    assert img.n_tokens == 16 and chunks[0].tokens[-1] != 4  # no wrapper tokens around LLaVA images
    ctx = Context(model, n_ctx=256, n_batch=64, n_ubatch=64)
    mt.eval_chunks(ctx, chunks, 0)
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [convert.IMG] * ch.n_tokens
    llava_vlm.load(GGMLType.F32, GGMLType.F32)
    with torch.no_grad():
        out = llava_vlm.hf(input_ids=torch.tensor([ids]), pixel_values=torch.from_numpy(img.pixels[None]))
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-3
