"""Gemma 3 vision: mmproj loading, image embeddings and next-token logits vs Hugging Face."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llamapy.context import Context
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, MtmdError, TextChunk
from tests.mtmd import convert

RNG = np.random.default_rng(3)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _hf_image_features(vlm: convert.TinyVLM, pixels: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = vlm.hf.model.get_image_features(pixel_values=torch.from_numpy(pixels[None]))
    out = getattr(out, "pooler_output", out)
    return np.asarray(out).reshape(-1, vlm.cfg.text_config.hidden_size)


def test_mmproj_hparams(gemma3_vlm: convert.TinyVLM) -> None:
    cm = ClipModel(gemma3_vlm.mmproj_gguf())
    hp = cm.hparams
    assert (hp.projector_type, hp.image_size, hp.patch_size, hp.n_embd, hp.n_layer) == (
        "gemma3",
        64,
        8,
        32,
        2,
    )
    assert hp.n_merge == 2 and hp.ffn_op == "gelu" and hp.image_mean == (0.5, 0.5, 0.5)
    assert cm.n_mmproj_embd == 64 and cm.n_output_tokens(64, 64) == 16


@pytest.mark.parametrize("ftype", [GGMLType.F32, GGMLType.F16])
def test_image_embeddings_match_hf(gemma3_vlm: convert.TinyVLM, ftype: GGMLType) -> None:
    cm = ClipModel(gemma3_vlm.mmproj_gguf(ftype))
    pixels = RNG.uniform(-1, 1, (3, 64, 64)).astype(np.float32)
    got = cm.encode(pixels)
    gemma3_vlm.load(ftype)
    ref = _hf_image_features(gemma3_vlm, pixels)
    assert got.shape == (16, 64)
    assert _rel(got, ref) < 1e-3
    got2 = cm.encode(-pixels)  # the graph is reused with new pixels
    assert _rel(got2, _hf_image_features(gemma3_vlm, -pixels)) < 1e-3


@pytest.fixture(scope="module")
def pair(gemma3_vlm: convert.TinyVLM) -> tuple[Model, MtmdContext]:
    model = Model.load(gemma3_vlm.text_gguf())
    return model, MtmdContext(gemma3_vlm.mmproj_gguf(), model)


def _hf_ids(chunks: list) -> list[int]:
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [convert.IMG] * ch.n_tokens
    return ids


def test_chunks(pair: tuple[Model, MtmdContext]) -> None:
    model, mt = pair
    bmp = Bitmap(RNG.integers(0, 256, (40, 70, 3), dtype=np.uint8))
    chunks = mt.tokenize("what is <__media__> this <__media__>", [bmp, bmp])
    kinds = [type(c).__name__ for c in chunks]
    assert kinds == ["TextChunk", "ImageChunk", "TextChunk", "ImageChunk", "TextChunk"]
    assert chunks[0].tokens[0] == 2 and chunks[0].tokens[-1] == convert.BOI  # BOS once, then the marker
    assert chunks[2].tokens[0] == convert.EOI and chunks[2].tokens[-1] == convert.BOI
    assert chunks[4].tokens == [convert.EOI] and 2 not in chunks[2].tokens
    assert chunks[1].id == chunks[3].id == bmp.id and chunks[1].n_tokens == 16 and chunks[1].non_causal
    with pytest.raises(MtmdError, match="1 image marker.*2 image"):
        mt.tokenize("one <__media__>", [bmp, bmp])


@pytest.mark.parametrize("n_ubatch", [64, 16])
def test_logits_with_an_image_match_hf(
    gemma3_vlm: convert.TinyVLM, pair: tuple[Model, MtmdContext], n_ubatch: int
) -> None:
    model, mt = pair
    bmp = Bitmap(RNG.integers(0, 256, (40, 70, 3), dtype=np.uint8))
    chunks = mt.tokenize("describe <__media__> the cat", [bmp])
    ctx = Context(model, n_ctx=256, n_batch=n_ubatch, n_ubatch=n_ubatch)
    n_past = mt.eval_chunks(ctx, chunks, 0)
    ids = _hf_ids(chunks)
    assert n_past == len(ids)
    got = ctx.get_logits()[-1]
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    gemma3_vlm.load(GGMLType.F32, GGMLType.F32)
    t = torch.tensor([ids])
    with torch.no_grad():  # token_type_ids: bidirectional attention within the image, as llama.cpp
        out = gemma3_vlm.hf(
            input_ids=t,
            pixel_values=torch.from_numpy(img.pixels[None]),
            token_type_ids=(t == convert.IMG).long(),
        )
    ref = out.logits[0, -1].numpy()
    assert _rel(got, ref) < 1e-3
    # one more token decoded after the prompt, as generation does
    nxt = int(np.argmax(got))
    mt.eval_chunks(ctx, [TextChunk([nxt])], n_past)
    t2 = torch.tensor([ids + [nxt]])
    with torch.no_grad():
        out2 = gemma3_vlm.hf(
            input_ids=t2,
            pixel_values=torch.from_numpy(img.pixels[None]),
            token_type_ids=(t2 == convert.IMG).long(),
        )
    assert _rel(ctx.get_logits()[-1], out2.logits[0, -1].numpy()) < 1e-3


def test_sliding_window_shorter_than_the_image(tmp_path) -> None:  # noqa: ANN001
    """Local layers: the window still applies inside the image (HF: AND(window, OR(causal, image)))."""
    vlm = convert.make_gemma3(tmp_path, sliding_window=8)
    model = Model.load(vlm.text_gguf())
    mt = MtmdContext(vlm.mmproj_gguf(), model)
    chunks = mt.tokenize(
        "what is <__media__> this cat", [Bitmap(RNG.integers(0, 256, (40, 70, 3), dtype=np.uint8))]
    )
    ctx = Context(model, n_ctx=256, n_batch=64, n_ubatch=64)
    mt.eval_chunks(ctx, chunks, 0)
    ids = _hf_ids(chunks)
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    vlm.load(GGMLType.F32, GGMLType.F32)
    t = torch.tensor([ids])
    with torch.no_grad():
        out = vlm.hf(
            input_ids=t,
            pixel_values=torch.from_numpy(img.pixels[None]),
            token_type_ids=(t == convert.IMG).long(),
        )
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-3


def test_image_needs_one_ubatch(pair: tuple[Model, MtmdContext]) -> None:
    model, mt = pair
    chunks = mt.tokenize("<__media__>", [Bitmap(np.zeros((8, 8, 3), np.uint8))])
    ctx = Context(model, n_ctx=256, n_batch=8, n_ubatch=8)
    with pytest.raises(MtmdError, match="non-causal.*at least 16"):
        mt.eval_chunks(ctx, chunks, 0)
    assert all(c.causal for c in ctx.memory.caches)


def test_numpy_reference_backend_agrees(gemma3_vlm: convert.TinyVLM) -> None:
    px = RNG.uniform(-1, 1, (3, 64, 64)).astype(np.float32)
    a = ClipModel(gemma3_vlm.mmproj_gguf(GGMLType.F16)).encode(px)
    b = ClipModel(gemma3_vlm.mmproj_gguf(GGMLType.F16), backend="numpy").encode(px)
    assert _rel(a, b) < 1e-5
