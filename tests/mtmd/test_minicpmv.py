"""MiniCPM-V 2.6 / 4.5 (llama.cpp's ``resampler`` projector: NaViT SigLIP + a perceiver resampler with 2-D sin-cos
keys; llava-uhd slices with <image>/<slice> tokens) vs a PyTorch oracle (transformers' Idefics2VisionTransformer +
the resampler restated on torch.nn.MultiheadAttention, tests/mtmd/minicpmv_tiny.py), a qwen2 text model for 2.6
and qwen3 for 4.5; the slicing vs transformers' MiniCPM-V image processor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy.context import Context
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, MtmdError, TextChunk, minicpmv
from llamapy.mtmd.clip import ClipHParams
from tests.mtmd.minicpmv_tiny import SLICE, P, TinyMiniCPMV

RNG = np.random.default_rng(30)


@pytest.fixture(scope="module")
def v26(tmp_path_factory: pytest.TempPathFactory) -> TinyMiniCPMV:
    return TinyMiniCPMV(tmp_path_factory.mktemp("minicpmv26"), version=3, n_query=16, text="qwen2")


@pytest.fixture(scope="module")
def v45(tmp_path_factory: pytest.TempPathFactory) -> TinyMiniCPMV:
    """Version 6 without clip.minicpmv_query_num: clip.cpp's legacy 64 queries."""
    return TinyMiniCPMV(tmp_path_factory.mktemp("minicpmv45"), version=6, n_query=None, text="qwen3", seed=1)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("hw", [(48, 48), (32, 80), (96, 16), (44, 52)])
def test_embeddings_match_oracle(v26: TinyMiniCPMV, v45: TinyMiniCPMV, hw: tuple[int, int]) -> None:
    px = RNG.uniform(-1, 1, (3, *hw)).astype(np.float32)
    for m, nq in ((v26, 16), (v45, 64)):
        cm = ClipModel(m.mmproj_path)
        assert cm.hparams.projector_type == "resampler" and cm.n_mmproj_embd == 256
        got = cm.encode(px)
        assert got.shape == (cm.n_output_tokens(hw[1], hw[0]), 256) == (nq, 256)
        assert _rel(got, m.features(px)) < 1e-4


def _hf_frames(data: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    """transformers' MiniCPM-V slicing (the official llava-uhd rules); its "4x" mode rounds sides to 2 x its
    patch size, so patch P // 2 rounds them to multiples of P as MiniCPM-V 2.x / 4.x do."""
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil

    q = P // 2
    proc = MiniCPMV4_6ImageProcessorPil(scale_resolution=SLICE, patch_size=q, downsample_mode="4x",
                                        image_mean=[0.5] * 3, image_std=[0.5] * 3)  # fmt: skip
    out = proc(images=[data], return_tensors="np")
    pv, sizes = out["pixel_values"][0], out["target_sizes"]
    res, col = [], 0
    for ny, nx in sizes:
        strip = pv[:, :, col : col + ny * nx * q]
        col += ny * nx * q
        res.append(strip.reshape(3, q, ny, nx, q).transpose(0, 2, 1, 3, 4).reshape(3, ny * q, nx * q))
    return res, list(out["grids"][0])


# small (upscaled overview), wider than a slice but under its area (not sliced), 2..9 slices, odd sides
@pytest.mark.parametrize("hw", [(30, 41), (20, 100), (70, 130), (37, 200), (150, 61), (161, 163)])
def test_preprocessing_matches_hf(hw: tuple[int, int]) -> None:
    hp = ClipHParams("resampler", SLICE, P, 32, 64, 2, 2, 0, 1e-6, (0.5,) * 3, (0.5,) * 3, n_merge=1)
    data = RNG.integers(0, 256, (*hw, 3), dtype=np.uint8)
    got, rows, cols = minicpmv.frames(Bitmap(data), hp)
    want, grid = _hf_frames(data)
    assert [rows, cols] == grid and [g.shape for g in got] == [x.shape for x in want]
    assert max(float(np.abs(g - x).max()) for g, x in zip(got, want, strict=True)) < 1e-6


def _run(
    m: TinyMiniCPMV, mt: MtmdContext, model: Model, bmp: Bitmap, n_ubatch: int
) -> tuple[list, list[int]]:
    chunks = mt.tokenize("what is <__media__> this", [bmp])
    ctx = Context(model, n_ctx=512, n_batch=n_ubatch, n_ubatch=n_ubatch, type_k="f32", type_v="f32")
    mt.eval_chunks(ctx, chunks, 0)
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [3] * ch.n_tokens
    return [ctx.get_logits()[-1], chunks], ids


def _oracle_logits(m: TinyMiniCPMV, chunks: list, ids: list[int]) -> np.ndarray:
    feats, pos, at = [], [], 0
    for ch in chunks:
        if isinstance(ch, ImageChunk):
            feats.append(m.features(ch.pixels))
            pos += range(at, at + ch.n_tokens)
        at += ch.n_tokens if isinstance(ch, ImageChunk) else len(ch.tokens)
    return m.logits(ids, pos, np.concatenate(feats))


def test_v26_logits_with_a_sliced_image_match_oracle(v26: TinyMiniCPMV) -> None:
    assert v26.text_path is not None
    model = Model.load(v26.text_path)
    mt = MtmdContext(v26.mmproj_path, model)
    bmp = Bitmap(RNG.integers(0, 256, (70, 130, 3), dtype=np.uint8))
    (one, chunks), ids = _run(v26, mt, model, bmp, 256)
    _, (rows, cols) = _hf_frames(bmp.data)
    assert rows * cols > 1 and sum(isinstance(c, ImageChunk) for c in chunks) == 1 + rows * cols
    sl = ["<slice>" + "<unk>" * 16 + "</slice>"] * cols
    want = "what is <image>" + "<unk>" * 16 + "</image>" + "\n".join(["".join(sl)] * rows) + " this"
    assert ids == model.vocab.tokenize(want, add_special=True, parse_special=True)  # the 2.6 placeholders
    ref = _oracle_logits(v26, chunks, ids)
    (split, _), _ = _run(v26, mt, model, bmp, 8)  # every frame's 16 tokens over two ubatches
    assert _rel(one, ref) < 1e-4 and _rel(split, ref) < 1e-4


def test_v45_logits_match_oracle(v45: TinyMiniCPMV) -> None:
    assert v45.text_path is not None
    model = Model.load(v45.text_path)
    mt = MtmdContext(v45.mmproj_path, model)
    bmp = Bitmap(
        RNG.integers(0, 256, (33, 45, 3), dtype=np.uint8)
    )  # under a slice's area: the overview alone
    (one, chunks), ids = _run(v45, mt, model, bmp, 128)
    assert [c.n_tokens for c in chunks if isinstance(c, ImageChunk)] == [64]
    ref = _oracle_logits(v45, chunks, ids)
    (split, _), _ = _run(v45, mt, model, bmp, 24)
    assert _rel(one, ref) < 1e-4 and _rel(split, ref) < 1e-4


def test_v25_slice_tokens(v26: TinyMiniCPMV, tmp_path: Path) -> None:
    """Version 2 (MiniCPM-Llama3-V 2.5): the slices inside one <slice> ... </slice>, each as <image> ... </image>."""
    assert v26.text_path is not None
    md = v26.metadata()
    md["clip.minicpmv_version"] = 2
    model = Model.load(v26.text_path)
    mt = MtmdContext(v26.write_mmproj(tmp_path / "v25.gguf", md), model)
    chunks = mt.tokenize("a<__media__>b", [Bitmap(RNG.integers(0, 256, (40, 130, 3), dtype=np.uint8))])
    text = "".join(
        model.vocab.detokenize(c.tokens, unparse_special=True)
        if isinstance(c, TextChunk)
        else f"[{c.n_tokens}]"
        for c in chunks
    )
    want = "<image>[16]</image><slice>" + "<image>[16]</image>" * 3 + "</slice>"  # 1 row of 3 slices
    assert text == f"<bos> a{want} b"


def test_position_mutation_and_bad_mmproj(
    v26: TinyMiniCPMV, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    px = RNG.uniform(-1, 1, (3, 32, 48)).astype(np.float32)
    want = v26.features(px)
    monkeypatch.setattr(minicpmv, "sincos_2d", lambda d, h, w: np.zeros((h * w, d), np.float32))
    assert _rel(ClipModel(v26.mmproj_path).encode(px), want) > 1e-2  # keys without their positions
    monkeypatch.undo()
    assert _rel(ClipModel(v26.mmproj_path).encode(px), want) < 1e-4
    t = v26.mm_tensors()
    del t["resampler.ln_post.weight"]
    with pytest.raises(MtmdError, match="resampler.ln_post.weight"):
        ClipModel(v26.write_mmproj(tmp_path / "noln.gguf", tensors=t))
    md = v26.metadata()
    md["clip.minicpmv_version"] = 7
    with pytest.raises(MtmdError, match="minicpmv_version 7 is not a known"):
        ClipModel(v26.write_mmproj(tmp_path / "v7.gguf", md))
    md = v26.metadata()
    md["clip.minicpmv_query_num"] = 64  # the file's query set has 16
    with pytest.raises(MtmdError, match="resampler.query"):
        ClipModel(v26.write_mmproj(tmp_path / "nq.gguf", md))
    t = v26.mm_tensors()
    t["resampler.query"] = t["resampler.query"][:, :96]
    with pytest.raises(MtmdError, match="multiple of its head size 128"):
        ClipModel(v26.write_mmproj(tmp_path / "d96.gguf", tensors=t))


def test_legacy_swapped_ffn_names(v26: TinyMiniCPMV, tmp_path: Path) -> None:
    """llama.cpp's legacy converter writes fc1 as ffn_down and fc2 as ffn_up; clip.cpp swaps them back."""
    t = v26.mm_tensors()
    for il in range(2):
        b = f"v.blk.{il}.ffn_"
        for k in ("weight", "bias"):
            t[f"{b}up.{k}"], t[f"{b}down.{k}"] = t[f"{b}down.{k}"], t[f"{b}up.{k}"]
    px = RNG.uniform(-1, 1, (3, 40, 24)).astype(np.float32)
    assert (
        _rel(ClipModel(v26.write_mmproj(tmp_path / "legacy.gguf", tensors=t)).encode(px), v26.features(px))
        < 1e-4
    )
    t["v.blk.1.ffn_up.weight"] = t["v.blk.1.ffn_up.weight"][:, :-1]
    with pytest.raises(MtmdError, match="v.blk.1.ffn_"):
        ClipModel(v26.write_mmproj(tmp_path / "legacy_bad.gguf", tensors=t))


def test_f16_and_q8_0_mmproj(v26: TinyMiniCPMV, tmp_path: Path) -> None:
    """Real files store the matrices F16 (the query too, in a quantized file: it is dequantized first)."""
    from llamapy.ggml.types import GGMLType
    from tests.mtmd import convert

    px = RNG.uniform(-1, 1, (3, 40, 52)).astype(np.float32)
    want = v26.features(px)
    for ft, tol in ((GGMLType.F16, 5e-3), (GGMLType.Q8_0, 5e-2)):
        path = convert.write_mmproj(tmp_path / f"{ft.name}.gguf", v26.metadata(), v26.mm_tensors(), ft)
        cm = ClipModel(path)
        assert cm.w["resampler.query"].type == ft and _rel(cm.encode(px), want) < tol
