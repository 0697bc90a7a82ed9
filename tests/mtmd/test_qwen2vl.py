"""Qwen2.5-VL and Qwen2-VL vision (projector types qwen2.5vl_merger / qwen2vl_merger): mmproj loading, image
embeddings vs HF's vision tower + merger, dynamic-resolution preprocessing vs HF's processor, and next-token
logits of a prompt with one image vs Qwen2_5_VL/Qwen2VLForConditionalGeneration (whose own M-RoPE position
ids check the image positions llamapy gives the text model)."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_proc

from llamapy.context import Context
from llamapy.generation.sequence import TokenSequence
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, MtmdError, TextChunk, load_image, qwen2vl
from llamapy.mtmd.prompt import chunk_tokens, prefill
from llamapy.mtmd.qwen2vl import preprocess_dynamic, smart_resize
from tests.mtmd import convert

RNG = np.random.default_rng(11)
P = 8  # the tiny models' patch size
IMG = convert.Q3_IMG


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def q25(tmp_path_factory: pytest.TempPathFactory) -> convert.TinyQwen2VL:
    """Tiny Qwen2.5-VL: 2 vision layers (the first windowed, n_wa_pattern 2), 8 px patches."""
    return convert.make_qwen2vl(tmp_path_factory.mktemp("qwen25vl"), v25=True)


@pytest.fixture(scope="module")
def q2(tmp_path_factory: pytest.TempPathFactory) -> convert.TinyQwen2VL:
    """Tiny Qwen2-VL: LayerNorm, quick-GELU MLP, no windows."""
    return convert.make_qwen2vl(tmp_path_factory.mktemp("qwen2vl"), seed=1, v25=False)


def _patchify(px: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's pixel_values and image_grid_thw of a preprocessed ``F32[3, H, W]`` (its processor's own patchify)."""
    flat, gh, gw = hf_proc.Qwen2VLImageProcessorPil.patchify(None, px, P, 2, 2)
    return torch.from_numpy(np.ascontiguousarray(flat)), torch.tensor([[1, gh, gw]])


def _hf_features(vlm: convert.TinyQwen2VL, px: np.ndarray) -> np.ndarray:
    pv, thw = _patchify(px)
    with torch.no_grad():
        out = vlm.hf.model.get_image_features(pv, thw)
    return np.asarray(out.pooler_output[0])


def test_mmproj_hparams(q25: convert.TinyQwen2VL, q2: convert.TinyQwen2VL) -> None:
    cm = ClipModel(q25.mmproj_gguf())
    hp = cm.hparams
    assert (hp.projector_type, hp.patch_size, hp.n_embd, hp.n_layer, hp.n_merge) == (
        "qwen2.5vl_merger",
        8,
        32,
        2,
        2,
    )
    assert hp.extra["n_wa_pattern"] == 2 and hp.extra["window_size"] == 112 and hp.ffn_op == "silu"
    assert cm.n_mmproj_embd == 64 and cm.n_output_tokens(176, 128) == 88 and cm.projector.mrope
    hp2 = ClipModel(q2.mmproj_gguf()).hparams
    assert (
        hp2.projector_type == "qwen2vl_merger"
        and hp2.extra["n_wa_pattern"] == 0
        and hp2.ffn_op == "gelu_quick"
    )


@pytest.mark.parametrize("which", ["2.5", "2"])
@pytest.mark.parametrize("ftype", [GGMLType.F32, GGMLType.F16])
def test_image_embeddings_match_hf(
    q25: convert.TinyQwen2VL, q2: convert.TinyQwen2VL, which: str, ftype: GGMLType
) -> None:
    vlm = q25 if which == "2.5" else q2
    cm = ClipModel(vlm.mmproj_gguf(ftype))
    vlm.load(ftype)
    # 176 x 128 px: 11 x 8 merged tokens, four windows of 7 x 7 units (2.5); 48 x 32: one window
    for h, w in ((128, 176), (32, 48)):
        px = RNG.uniform(-1.5, 1.5, (3, h, w)).astype(np.float32)
        got = cm.encode(px)
        assert got.shape == ((h // 16) * (w // 16), 64)
        assert _rel(got, _hf_features(vlm, px)) < 1e-3
    got = cm.encode(-px)  # the graph of that size is reused with new pixels
    assert _rel(got, _hf_features(vlm, -px)) < 1e-3


def test_window_attention_and_rope_matter(q25: convert.TinyQwen2VL, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: without the windows, or with the column half of the 2-D rope on the row
    half's frequencies, it misses by far more than the tolerance."""
    q25.load(GGMLType.F32)
    px = RNG.uniform(-1.5, 1.5, (3, 128, 176)).astype(np.float32)
    ref = _hf_features(q25, px)
    cm = ClipModel(q25.mmproj_gguf())
    cm.hparams.extra["n_wa_pattern"] = 0
    assert _rel(cm.encode(px), ref) > 2e-2
    monkeypatch.setattr(qwen2vl, "vision_rope_factors", lambda d, base=0.0: np.ones(d // 2, np.float32))
    assert _rel(ClipModel(q25.mmproj_gguf()).encode(px), ref) > 2e-2


# -- preprocessing --------------------------------------------------------------------------------------
def _hf_smart(h: int, w: int, f: int, lo: int, hi: int) -> tuple[int, int]:
    return hf_proc.smart_resize(h, w, factor=f, min_pixels=lo, max_pixels=hi)


def test_smart_resize_as_hf_but_for_rounding_ties() -> None:
    f, lo, hi = 28, 8 * 28 * 28, 4096 * 28 * 28
    n = 0
    for h in range(15, 3000, 37):
        for w in range(15, 3000, 53):
            if (h / f) % 1 == 0.5 or (w / f) % 1 == 0.5:  # Python rounds half to even, std::round away
                continue
            assert smart_resize(h, w, f, lo, hi) == _hf_smart(h, w, f, lo, hi), (h, w)
            n += 1
    assert n > 3000
    # 70 / 28 = 2.5: llama.cpp rounds it to 3 tokens, HF to 2
    assert smart_resize(70, 280, f, lo, hi) == (84, 280) and _hf_smart(70, 280, f, lo, hi) == (56, 280)


def _photo(w: int, h: int, seed: int) -> bytes:
    """A JPEG 'photo' of odd size: gradients, shapes and noise (smooth and sharp content for the filter)."""
    g = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    arr = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 127 // (w + h)], -1)
    img = Image.fromarray(np.clip(arr + g.normal(0, 12, arr.shape), 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = int(g.integers(0, w)), int(g.integers(0, h))
        d.ellipse([x0, y0, x0 + w // 3, y0 + h // 4], fill=tuple(int(c) for c in g.integers(0, 256, 3)))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.parametrize("size", [(37, 61), (203, 125), (97, 311), (1500, 1190), (20, 30)])
def test_pixels_match_hf_processor(q25: convert.TinyQwen2VL, size: tuple[int, int]) -> None:
    """Stretched (pad=False), llamapy's pixels are HF's Qwen2VLImageProcessor's (its PIL backend), within
    float rounding; the sizes avoid rounding ties, the large one goes through max_pixels, the small one
    through min_pixels."""
    hp = ClipModel(q25.mmproj_gguf()).hparams
    bmp = load_image(_photo(*size, seed=size[0]))
    got = preprocess_dynamic(bmp, hp, pad=False)
    proc = hf_proc.Qwen2VLImageProcessorPil(
        patch_size=P, merge_size=2, temporal_patch_size=2, image_mean=list(hp.image_mean),
        image_std=list(hp.image_std), size={"shortest_edge": 8 * 256, "longest_edge": 4096 * 256},
    )  # fmt: skip
    out = proc(images=[Image.fromarray(bmp.data)], return_tensors="np")
    t, gh, gw = (int(v) for v in out["image_grid_thw"][0])
    assert got.shape == (3, gh * P, gw * P)
    ref = out["pixel_values"].reshape(gh // 2, gw // 2, 2, 2, 3, 2, P, P)[:, :, :, :, :, 0]
    ref = ref.transpose(4, 0, 2, 5, 1, 3, 6).reshape(3, gh * P, gw * P)
    assert np.abs(got - ref).max() < 1e-5
    assert preprocess_dynamic(bmp, hp, pad=True).shape == got.shape


def test_token_limits(q25: convert.TinyQwen2VL) -> None:
    cm = ClipModel(q25.mmproj_gguf())
    bmp = Bitmap(RNG.integers(0, 256, (300, 500, 3), dtype=np.uint8))
    assert qwen2vl.preprocess(cm, bmp, True).shape == (3, 304, 496)  # 31 x 19 = 589 tokens: within 8..4096
    cm.hparams.extra["image_max_tokens"] = 20
    px = qwen2vl.preprocess(cm, bmp, True)
    assert px.shape == (3, 48, 80) and cm.n_output_tokens(80, 48) == 15  # <= 20, the aspect ratio kept
    with pytest.raises(MtmdError, match="too elongated"):
        qwen2vl.preprocess(cm, Bitmap(np.zeros((2, 4000, 3), np.uint8)), True)
    cm.hparams.extra.update(image_min_tokens=1000, image_max_tokens=4096)
    _, h, w = qwen2vl.preprocess(cm, bmp, True).shape
    assert 1000 <= cm.n_output_tokens(w, h) < 1100


def test_padding_as_llama_cpp(q25: convert.TinyQwen2VL) -> None:
    """pad=True (llama.cpp's PAD_CEIL): 100 x 20 px -> 112 x 32 (min_pixels), the image scaled by 1.12 to
    112 x 23 and centred: rows 0..3 and 27..31 black."""
    hp = ClipModel(q25.mmproj_gguf()).hparams
    bmp = Bitmap(np.full((20, 100, 3), 200, np.uint8))
    px = preprocess_dynamic(bmp, hp, pad=True)
    assert px.shape == (3, 32, 112)
    black = ((0.0 - np.asarray(hp.image_mean)) / np.asarray(hp.image_std)).astype(np.float32)
    np.testing.assert_allclose(px[:, :4].reshape(3, -1).T, np.broadcast_to(black, (4 * 112, 3)), atol=1e-6)
    np.testing.assert_allclose(px[:, 27:].reshape(3, -1).T, np.broadcast_to(black, (5 * 112, 3)), atol=1e-6)
    assert np.all(px[:, 4:27] > black[:, None, None] + 1)
    exact = Bitmap(RNG.integers(0, 256, (48, 64, 3), dtype=np.uint8))  # already a multiple: no resize
    np.testing.assert_array_equal(
        preprocess_dynamic(exact, hp, pad=True), preprocess_dynamic(exact, hp, pad=False)
    )


# -- text + image -------------------------------------------------------------------------------------
def _pair(vlm: convert.TinyQwen2VL) -> tuple[Model, MtmdContext]:
    model = Model.load(vlm.text_gguf())
    return model, MtmdContext(vlm.mmproj_gguf(), model)


def _hf_ids(chunks: list) -> list[int]:
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens
    return ids


def _hf_logits(vlm: convert.TinyQwen2VL, ids: list[int], img: ImageChunk) -> np.ndarray:
    pv, thw = _patchify(img.pixels)
    t = torch.tensor([ids])
    with torch.no_grad():
        out = vlm.hf(input_ids=t, pixel_values=pv, image_grid_thw=thw, mm_token_type_ids=(t == IMG).int(),
                     use_cache=False)  # fmt: skip
    return out.logits[0, -1].numpy()


def test_chunks_and_positions(q25: convert.TinyQwen2VL) -> None:
    _, mt = _pair(q25)
    bmp = Bitmap(RNG.integers(0, 256, (130, 180, 3), dtype=np.uint8))
    chunks = mt.tokenize("what is <__media__> this", [bmp])
    assert [type(c).__name__ for c in chunks] == ["TextChunk", "ImageChunk", "TextChunk"]
    img = chunks[1]
    assert chunks[0].tokens[-1] == convert.Q3_VSTART and chunks[2].tokens[0] == convert.Q3_VEND
    assert img.pixels.shape == (3, 128, 176) and (img.nx, img.ny, img.n_tokens) == (11, 8, 88)
    assert img.mrope and img.n_pos == 11 and not img.non_causal
    mpos = img.mpos(5)
    assert (
        mpos[0].tolist() == [5, 5, 5, 0]
        and mpos[12].tolist() == [5, 6, 6, 0]
        and mpos[-1].tolist() == [5, 12, 15, 0]
    )
    view = chunk_tokens(chunks)  # the prompt cache's view: one entry per position
    assert len(view) == chunks[0].n_tokens + 11 + chunks[2].n_tokens


@pytest.mark.parametrize("n_ubatch", [128, 32])
def test_logits_with_an_image_match_hf(q25: convert.TinyQwen2VL, n_ubatch: int) -> None:
    model, mt = _pair(q25)
    bmp = Bitmap(RNG.integers(0, 256, (130, 180, 3), dtype=np.uint8))  # 11 x 8 tokens, 4 windows
    chunks = mt.tokenize("describe <__media__> the cat", [bmp])
    ctx = Context(model, n_ctx=256, n_batch=n_ubatch, n_ubatch=n_ubatch)
    n_past = mt.eval_chunks(ctx, chunks, 0)
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    ids = _hf_ids(chunks)
    assert n_past == len(ids) - img.n_tokens + img.n_pos  # the text after the image continues at max(nx, ny)
    q25.load(GGMLType.F32, GGMLType.F32)
    got = ctx.get_logits()[-1]
    assert _rel(got, _hf_logits(q25, ids, img)) < 1e-3
    nxt = int(np.argmax(got))  # one more token after the prompt, as generation does
    mt.eval_chunks(ctx, [TextChunk([nxt])], n_past)
    assert _rel(ctx.get_logits()[-1], _hf_logits(q25, ids + [nxt], img)) < 1e-3
    if n_ubatch == 128:  # the positions matter: the image at plain sequential positions misses
        flat = [dataclasses.replace(c, mrope=False) if isinstance(c, ImageChunk) else c for c in chunks]
        ctx2 = Context(model, n_ctx=256, n_batch=n_ubatch, n_ubatch=n_ubatch)
        mt.eval_chunks(ctx2, flat, 0)
        assert _rel(ctx2.get_logits()[-1], _hf_logits(q25, ids, img)) > 2e-2


def test_prefill_cache_and_generation_positions(q25: convert.TinyQwen2VL) -> None:
    """The API/server path: prefill's token view counts positions (the image: max(nx, ny)), so the tokens
    generated after it and a later prompt reusing the cached prefix are at HF's positions."""
    model, mt = _pair(q25)
    seq = TokenSequence(Context(model, n_ctx=256, n_batch=128, n_ubatch=128))
    bmp = Bitmap(RNG.integers(0, 256, (60, 100, 3), dtype=np.uint8))  # 6 x 4 tokens
    chunks = mt.tokenize("a <__media__> cat", [bmp])
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    view = prefill(mt, seq, chunks)
    ids = _hf_ids(chunks)
    assert len(view) == len(seq.tokens) == len(ids) - img.n_tokens + img.n_pos
    q25.load(GGMLType.F32, GGMLType.F32)
    nxt = int(np.argmax(seq.logits()))
    assert _rel(seq.eval([nxt]), _hf_logits(q25, ids + [nxt], img)) < 1e-3
    more = mt.tokenize("a <__media__> cat is", [bmp])  # the image and "a" reused from the cache
    prefill(mt, seq, more)
    assert next(c for c in more if isinstance(c, ImageChunk)).embd is None  # not encoded again
    assert _rel(seq.logits(), _hf_logits(q25, _hf_ids(more), img)) < 1e-3


def test_qwen2vl_logits_match_hf(q2: convert.TinyQwen2VL) -> None:
    model, mt = _pair(q2)
    bmp = Bitmap(RNG.integers(0, 256, (70, 45, 3), dtype=np.uint8))  # taller than wide: 3 x 4 tokens
    chunks = mt.tokenize("<__media__> what is this", [bmp])
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    assert (img.nx, img.ny) == (3, 4)
    ctx = Context(model, n_ctx=128, n_batch=64, n_ubatch=64)
    mt.eval_chunks(ctx, chunks, 0)
    q2.load(GGMLType.F32, GGMLType.F32)
    assert _rel(ctx.get_logits()[-1], _hf_logits(q2, _hf_ids(chunks), img)) < 1e-3


# -- bad input ------------------------------------------------------------------------------------------
def _mmproj_variant(
    vlm: convert.TinyQwen2VL, path: Path, md_edit: dict, tensors_edit: dict | None = None
) -> Path:
    md = convert.qwen2vl_mmproj_metadata(vlm.cfg, GGMLType.F32)
    for k, v in md_edit.items():
        if v is None:
            md.pop(k, None)
        else:
            md[k] = v
    tensors = vlm.mm_tensors(GGMLType.F32) | (tensors_edit or {})
    return convert.write_mmproj(path, md, tensors, GGMLType.F32)


def test_mmproj_for_another_model_is_refused(q25: convert.TinyQwen2VL, tmp_path: Path) -> None:
    t = q25.mm_tensors(GGMLType.F32)
    narrow = {"mm.2.weight": t["mm.2.weight"][:48], "mm.2.bias": t["mm.2.bias"][:48]}
    path = _mmproj_variant(q25, tmp_path / "narrow.gguf", {}, narrow)
    model = Model.load(q25.text_gguf())
    with pytest.raises(MtmdError, match="48 values but the text model.*takes 64.*another model"):
        MtmdContext(path, model)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"clip.vision.n_wa_pattern": None}, "needs clip.vision.n_wa_pattern"),
        ({"clip.vision.spatial_merge_size": 3}, "spatial_merge_size = 3"),
        ({"clip.vision.window_size": 100}, "window size 100 px"),
    ],
)
def test_bad_mmproj_keys(q25: convert.TinyQwen2VL, tmp_path: Path, edit: dict, match: str) -> None:
    with pytest.raises(MtmdError, match=match):
        ClipModel(_mmproj_variant(q25, tmp_path / "bad.gguf", edit))


def test_image_size_not_a_multiple_of_the_merge(q25: convert.TinyQwen2VL) -> None:
    with pytest.raises(MtmdError, match="not a multiple of 16 px"):
        ClipModel(q25.mmproj_gguf()).encode(np.zeros((3, 24, 32), np.float32))


def test_numpy_reference_backend_agrees(q25: convert.TinyQwen2VL) -> None:
    px = RNG.uniform(-1, 1, (3, 128, 176)).astype(np.float32)
    a = ClipModel(q25.mmproj_gguf(GGMLType.F16)).encode(px)
    b = ClipModel(q25.mmproj_gguf(GGMLType.F16), backend="numpy").encode(px)
    assert _rel(a, b) < 1e-5
