"""Qwen3-VL: the qwen3vl_merger mmproj (vision tower + merger + deepstack mergers) and the qwen3vl text model
(interleaved M-RoPE, deepstack added after the first layers) vs Hugging Face's Qwen3VLForConditionalGeneration
with the same random weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from llamapy.batch import Batch, BatchError
from llamapy.context import Context, ContextParams
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, MtmdError, TextChunk
from tests.model import hf_tiny
from tests.mtmd import convert

RNG = np.random.default_rng(5)
N_TEXT = 64  # the text model's n_embd
N_DS = 2  # deepstack mergers (after vision layers 0 and 1)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> convert.TinyQwen3VL:
    """3 vision layers (deepstack after 0 and 1), 8 px patches, a 4x4 position table, 2x2 merge."""
    return convert.make_qwen3vl(tmp_path_factory.mktemp("qwen3vl"))


@pytest.fixture(scope="module")
def pair(vlm: convert.TinyQwen3VL) -> tuple[Model, MtmdContext]:
    model = Model.load(vlm.text_gguf())
    return model, MtmdContext(vlm.mmproj_gguf(), model)


def hf_pixels(px: np.ndarray, p: int = 8, mg: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``pixel_values`` (two identical frames, patches in merge order, each (C, T, p, p)) and grid."""
    c, h, w = px.shape
    gh, gw = h // p, w // p
    x = np.stack([px, px]).reshape(2, c, gh // mg, mg, p, gw // mg, mg, p)
    x = x.transpose(2, 5, 3, 6, 1, 0, 4, 7).reshape(gh * gw, c * 2 * p * p)
    return torch.from_numpy(np.ascontiguousarray(x)), torch.tensor([[1, gh, gw]])


def hf_image_features(vlm: convert.TinyQwen3VL, px: np.ndarray) -> np.ndarray:
    """[main | deepstack 0 | deepstack 1], as llama.cpp concatenates them."""
    pv, grid = hf_pixels(px)
    with torch.no_grad():
        out = vlm.hf.model.get_image_features(pixel_values=pv, image_grid_thw=grid)
    parts = [out.pooler_output[0]] + [f[0] for f in out.deepstack_features]
    return np.concatenate([t.numpy() for t in parts], axis=1)


def test_mmproj_hparams(vlm: convert.TinyQwen3VL) -> None:
    cm = ClipModel(vlm.mmproj_gguf())
    hp = cm.hparams
    assert (hp.projector_type, hp.patch_size, hp.n_embd, hp.n_layer, hp.n_merge) == (
        "qwen3vl_merger",
        8,
        32,
        3,
        2,
    )
    assert hp.extra["deepstack"] == [0, 1] and hp.extra["pos_side"] == 4
    assert cm.n_mmproj_embd == N_TEXT * (1 + N_DS) and cm.n_output_tokens(64, 48) == 12
    assert cm.projector.mrope and cm.projector.preprocess is not None


@pytest.mark.parametrize("ftype", [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0], ids=lambda t: t.name)
def test_image_embeddings_match_hf(vlm: convert.TinyQwen3VL, ftype: GGMLType) -> None:
    """Main and deepstack embeddings; a 6x8 patch grid, so the 4x4 position table is interpolated. Q8_0:
    HF runs the same (quantized) weights; the bound leaves room for 8-bit activations in the kernels."""
    tol = 1e-2 if ftype == GGMLType.Q8_0 else 1e-3
    cm = ClipModel(vlm.mmproj_gguf(ftype))
    vlm.load(ftype)
    for shape in ((3, 48, 64), (3, 32, 32)):
        px = RNG.uniform(-1, 1, shape).astype(np.float32)
        got, ref = cm.encode(px), hf_image_features(vlm, px)
        assert got.shape == (shape[1] * shape[2] // 256, N_TEXT * (1 + N_DS))
        for j in range(1 + N_DS):  # each part on its own scale
            s = slice(j * N_TEXT, (j + 1) * N_TEXT)
            assert _rel(got[:, s], ref[:, s]) < tol, (shape, j)


def test_numpy_reference_backend_agrees(vlm: convert.TinyQwen3VL) -> None:
    px = RNG.uniform(-1, 1, (3, 32, 48)).astype(np.float32)
    a = ClipModel(vlm.mmproj_gguf(GGMLType.F16)).encode(px)
    b = ClipModel(vlm.mmproj_gguf(GGMLType.F16), backend="numpy").encode(px)
    assert _rel(a, b) < 1e-5


def _hf_text(
    vlm: convert.TinyQwen3VL, embd: np.ndarray, pos: np.ndarray, mask: np.ndarray | None
) -> np.ndarray:
    """HF's language model + head on ``embd [T, n_embd*(1+k)]`` at ``pos [T, 4]`` (t, h, w, e); the
    deepstack slices are added at the tokens of ``mask`` (None: no deepstack)."""
    lm = vlm.hf.model.language_model
    x = torch.from_numpy(embd[None, :, :N_TEXT].copy())
    p = torch.from_numpy(pos[:, :3].T.astype(np.int64).copy())[:, None, :]
    kw = {}
    if mask is not None:
        ds = [torch.from_numpy(embd[mask, (j + 1) * N_TEXT : (j + 2) * N_TEXT].copy()) for j in range(N_DS)]
        kw = dict(visual_pos_masks=torch.from_numpy(mask[None]), deepstack_visual_embeds=ds)
    with torch.no_grad():
        h = lm(inputs_embeds=x, position_ids=p, use_cache=False, **kw).last_hidden_state
        return vlm.hf.lm_head(h)[0].numpy()


@pytest.mark.parametrize("deepstack", [True, False])
def test_text_model_with_deepstack_embeddings(vlm: convert.TinyQwen3VL, deepstack: bool) -> None:
    """Wide embeddings with M-RoPE positions, decoded in two batches: 3 text-like rows (deepstack slices
    zero: they add nothing), 6 image-like rows at one t with distinct (h, w), 3 more text rows."""
    model = Model.load(vlm.text_gguf())
    assert model.hparams.n_embd_inp == N_TEXT * (1 + N_DS)
    embd = RNG.standard_normal((12, N_TEXT * (1 + N_DS))).astype(np.float32)
    img = np.zeros(12, dtype=bool)
    img[3:9] = True
    if not deepstack:
        embd[:, N_TEXT:] = 0
    embd[~img, N_TEXT:] = 0
    pos = np.zeros((12, 4), dtype=np.int32)
    pos[:3, :3] = np.arange(3)[:, None]
    r, c = np.divmod(np.arange(6), 3)
    pos[3:9, 0], pos[3:9, 1], pos[3:9, 2] = 3, 3 + r, 3 + c
    pos[9:, :3] = np.arange(6, 9)[:, None]
    ctx = Context(model, ContextParams(n_ctx=64, type_k="f32", type_v="f32"))
    ctx.decode(Batch.from_embd(embd[:5], mpos=pos[:5], logits_all=True))
    first = ctx.get_logits().copy()
    ctx.decode(Batch.from_embd(embd[5:], mpos=pos[5:], logits_all=True))
    got = np.concatenate([first, ctx.get_logits()])
    vlm.load(GGMLType.F32, GGMLType.F32)
    ref = _hf_text(vlm, embd, pos, img if deepstack else None)
    assert _rel(got, ref) < 1e-3
    if deepstack:  # the deepstack slices matter
        assert _rel(got, _hf_text(vlm, embd, pos, None)) > 1e-2
    with pytest.raises(BatchError, match=r"\[n_tokens, 192\]"):
        ctx.decode(Batch.from_embd(embd[:2, :N_TEXT], mpos=pos[9:11]))


def _hf_ids(chunks: list) -> list[int]:
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [convert.Q3_IMG] * ch.n_tokens
    return ids


@pytest.mark.parametrize("n_ubatch", [64, 8])
def test_logits_with_an_image_match_hf(
    vlm: convert.TinyQwen3VL, pair: tuple[Model, MtmdContext], n_ubatch: int
) -> None:
    """The whole path: tokenize (markers, dynamic size), encode, M-RoPE image positions, deepstack; HF
    computes its own positions (get_rope_index). n_ubatch 8 splits the 12-token image."""
    model, mt = pair
    bmp = Bitmap(RNG.integers(0, 256, (40, 70, 3), dtype=np.uint8))
    chunks = mt.tokenize("describe <__media__> the cat", [bmp])
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    assert img.pixels.shape == (3, 48, 64) and img.n_tokens == 12 and (img.nx, img.ny) == (4, 3)
    assert chunks[0].tokens[-1] == convert.Q3_VSTART and chunks[2].tokens[0] == convert.Q3_VEND
    ctx = Context(
        model, ContextParams(n_ctx=128, n_batch=n_ubatch, n_ubatch=n_ubatch, type_k="f32", type_v="f32")
    )
    n_past = mt.eval_chunks(ctx, chunks, 0)
    ids = _hf_ids(chunks)
    assert n_past == len(ids) - img.n_tokens + max(img.nx, img.ny)
    got = ctx.get_logits()[-1]
    vlm.load(GGMLType.F32, GGMLType.F32)
    pv, grid = hf_pixels(img.pixels)
    t = torch.tensor([ids])
    kw = dict(pixel_values=pv, image_grid_thw=grid, mm_token_type_ids=(t == convert.Q3_IMG).int())
    with torch.no_grad():
        ref = vlm.hf(input_ids=t, **kw).logits[0, -1].numpy()
    assert _rel(got, ref) < 1e-3
    nxt = int(np.argmax(got))  # one more token, as generation continues
    mt.eval_chunks(ctx, [TextChunk([nxt])], n_past)
    t2 = torch.tensor([ids + [nxt]])
    kw["mm_token_type_ids"] = (t2 == convert.Q3_IMG).int()
    with torch.no_grad():
        ref2 = vlm.hf(input_ids=t2, **kw).logits[0, -1].numpy()
    assert _rel(ctx.get_logits()[-1], ref2) < 1e-3


def test_pixels_match_hf_processor(vlm: convert.TinyQwen3VL, pair: tuple[Model, MtmdContext]) -> None:
    """The projector's preprocessing hook (Qwen2-VL's dynamic size, factor 8 px x 2 here), stretched
    (image_pad=False), gives HF's Qwen2VLImageProcessor pixels for a 203 x 125 image (-> 208 x 128)."""
    from PIL import Image
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_proc

    model, _ = pair
    mt = MtmdContext(vlm.mmproj_gguf(), model, image_pad=False)
    bmp = Bitmap(RNG.integers(0, 256, (125, 203, 3), dtype=np.uint8))
    img = next(c for c in mt.tokenize("<__media__>", [bmp]) if isinstance(c, ImageChunk))
    proc = hf_proc.Qwen2VLImageProcessorPil(
        patch_size=8, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        size={"shortest_edge": 8 * 256, "longest_edge": 4096 * 256},
    )  # fmt: skip
    out = proc(images=[Image.fromarray(bmp.data)], return_tensors="np")
    _, gh, gw = (int(v) for v in out["image_grid_thw"][0])
    assert img.pixels.shape == (3, gh * 8, gw * 8) == (3, 128, 208) and img.n_tokens == gh * gw // 4
    ref = out["pixel_values"].reshape(gh // 2, gw // 2, 2, 2, 3, 2, 8, 8)[:, :, :, :, :, 0]
    ref = ref.transpose(4, 0, 2, 5, 1, 3, 6).reshape(3, gh * 8, gw * 8)
    assert np.abs(img.pixels - ref).max() < 1e-5


# -- bad input ----------------------------------------------------------------------------------------
def test_bad_mmproj(vlm: convert.TinyQwen3VL, tmp_path: Path) -> None:
    md, tensors = convert.qwen3vl_mmproj_metadata(vlm.cfg, GGMLType.F32), vlm.mm_tensors(GGMLType.F32)
    bad = dict(md, **{"clip.vision.is_deepstack_layers": [True, False]})
    with pytest.raises(MtmdError, match="is_deepstack_layers has 2 entries"):
        ClipModel(convert.write_mmproj(tmp_path / "a.gguf", bad, tensors, GGMLType.F32))
    fewer = {k: v for k, v in tensors.items() if k != "v.deepstack.1.fc2.weight"}
    with pytest.raises(MtmdError, match="v.deepstack.1.fc2.weight"):
        ClipModel(convert.write_mmproj(tmp_path / "b.gguf", md, fewer, GGMLType.F32))
    with pytest.raises(MtmdError, match="multiple of patch size x merge = 16"):
        ClipModel(vlm.mmproj_gguf()).encode(np.zeros((3, 24, 32), np.float32))


def test_mmproj_for_another_text_model(vlm: convert.TinyQwen3VL, tmp_path: Path) -> None:
    """A text model without deepstack layers takes 64-wide embeddings; this mmproj makes 192."""
    fam, tcfg = hf_tiny.FAMILIES["qwen3vl"], vlm.cfg.text_config
    md = hf_tiny.metadata(fam, tcfg, GGMLType.F32)
    md.update(convert.tiny_vocab(convert.QWEN3VL_SPECIALS), **{"qwen3vl.n_deepstack_layers": 0})
    tensors = hf_tiny.convert(fam, tcfg, vlm.text_state())
    model = Model.load(hf_tiny.write_gguf(tmp_path / "t.gguf", "qwen3vl", md, tensors, GGMLType.F32))
    assert model.hparams.n_embd_inp == N_TEXT
    with pytest.raises(MtmdError, match="192 values but the text model.*takes 64"):
        MtmdContext(vlm.mmproj_gguf(), model)
