"""SmolVLM (idefics3 projector: SigLIP, pixel shuffle, linear) vs Hugging Face's Idefics3."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from llamapy.context import Context
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, TextChunk, preprocess_fixed
from tests.mtmd import convert

RNG = np.random.default_rng(11)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _hf_features(vlm: convert.TinyVLM, pixels: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = vlm.hf.model.get_image_features(pixel_values=torch.from_numpy(pixels[None, None]))
    out = getattr(out, "pooler_output", out)
    return np.asarray(out).reshape(-1, vlm.cfg.text_config.hidden_size)


@pytest.mark.parametrize("ftype", [GGMLType.F32, GGMLType.F16])
def test_image_embeddings_match_hf(idefics3_vlm: convert.TinyVLM, ftype: GGMLType) -> None:
    cm = ClipModel(idefics3_vlm.mmproj_gguf(ftype))
    assert cm.hparams.projector_type == "idefics3" and cm.hparams.n_merge == 2 and cm.n_mmproj_embd == 64
    px = RNG.uniform(-1, 1, (3, 64, 64)).astype(np.float32)
    got = cm.encode(px)
    idefics3_vlm.load(ftype)
    assert got.shape == (16, 64)
    assert _rel(got, _hf_features(idefics3_vlm, px)) < 1e-3


@pytest.mark.parametrize("size", [(37, 91), (80, 80)])
def test_global_image_matches_hf_processor(size: tuple[int, int]) -> None:
    arr = RNG.integers(0, 256, (*size, 3), dtype=np.uint8)
    proc = transformers.Idefics3ImageProcessorPil(
        do_resize=False, do_image_splitting=False, max_image_size={"longest_edge": 64}
    )
    ref = proc(images=[[Image.fromarray(arr)]], return_tensors="np")["pixel_values"][0, 0]
    got = preprocess_fixed(Bitmap(arr), 64, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), pad=False, resample="lanczos")
    np.testing.assert_allclose(got, ref, atol=1e-6)


def test_logits_with_an_image_match_hf(idefics3_vlm: convert.TinyVLM) -> None:
    model = Model.load(idefics3_vlm.text_gguf())
    mt = MtmdContext(idefics3_vlm.mmproj_gguf(), model)
    assert not mt.decode_use_non_causal
    chunks = mt.tokenize(
        "what is <__media__> this", [Bitmap(RNG.integers(0, 256, (50, 30, 3), dtype=np.uint8))]
    )
    assert (
        chunks[0].tokens[-2:] == [4, 5] and chunks[2].tokens[0] == 4
    )  # <fake_token_around_image><global-img>
    ctx = Context(model, n_ctx=256, n_batch=8, n_ubatch=8)  # causal: the image may span ubatches
    mt.eval_chunks(ctx, chunks, 0)
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [convert.IMG] * ch.n_tokens
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    idefics3_vlm.load(GGMLType.F32, GGMLType.F32)
    with torch.no_grad():
        out = idefics3_vlm.hf(
            input_ids=torch.tensor([ids]), pixel_values=torch.from_numpy(img.pixels[None, None])
        )
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-3


def test_scale_factor_is_required(idefics3_vlm: convert.TinyVLM, tmp_path) -> None:  # noqa: ANN001
    from llamapy.mtmd import MtmdError

    md = convert.mmproj_metadata(idefics3_vlm.cfg, GGMLType.F32)
    del md["clip.vision.projector.scale_factor"]
    p = convert.write_mmproj(
        tmp_path / "m.gguf", md, convert.mmproj_tensors(idefics3_vlm.state), GGMLType.F32
    )
    with pytest.raises(MtmdError, match="scale_factor"):
        ClipModel(p)


@pytest.mark.parametrize("size", [(50, 90), (30, 200), (200, 100), (20, 20)])
def test_image_splitting_matches_hf_processor(size: tuple[int, int]) -> None:
    from llamapy.mtmd.image import idefics3_frames

    arr = RNG.integers(0, 256, (*size, 3), dtype=np.uint8)
    proc = transformers.Idefics3ImageProcessorPil(
        size={"longest_edge": 128}, max_image_size={"longest_edge": 64}
    )
    ref = proc(images=[[Image.fromarray(arr)]], return_tensors="np", return_row_col_info=True)
    frames, rows, cols = idefics3_frames(Bitmap(arr), 64, 128, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    assert (rows, cols) == (ref["rows"][0][0], ref["cols"][0][0])
    assert len(frames) == len(ref["pixel_values"][0])
    for got, want in zip(frames, ref["pixel_values"][0], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.fixture(scope="module")
def tiled_mmproj(idefics3_vlm: convert.TinyVLM, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    md = convert.mmproj_metadata(idefics3_vlm.cfg, GGMLType.F32)
    md["clip.vision.preproc_image_size"] = 128  # SmolVLM's processor size.longest_edge: split into tiles
    path = tmp_path_factory.mktemp("tiled") / "mmproj.gguf"
    return convert.write_mmproj(path, md, convert.mmproj_tensors(idefics3_vlm.state), GGMLType.F32)


def test_tiled_image_prompt_and_logits_match_hf(idefics3_vlm: convert.TinyVLM, tiled_mmproj) -> None:  # noqa: ANN001
    model = Model.load(idefics3_vlm.text_gguf())
    mt = MtmdContext(tiled_mmproj, model)
    bmp = Bitmap(RNG.integers(0, 256, (30, 100, 3), dtype=np.uint8))  # 1 row x 2 columns + the global image
    chunks = mt.tokenize("what is <__media__> this", [bmp])
    images = [c for c in chunks if isinstance(c, ImageChunk)]
    assert len(images) == 3 and len({c.id for c in images}) == 3 and images[-1].id == bmp.id
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [convert.IMG] * ch.n_tokens
    # HF Idefics3Processor.replace_image_token's text for rows = 1, cols = 2
    seq = "<image>" * 16
    want = (
        "what is "
        + f"<fake_token_around_image><row_1_col_1>{seq}<fake_token_around_image><row_1_col_2>{seq}\n"
    )
    want += f"\n<fake_token_around_image><global-img>{seq}<fake_token_around_image>" + " this"
    assert ids == model.vocab.tokenize(want, add_special=True, parse_special=True)
    ctx = Context(model, n_ctx=256, n_batch=64, n_ubatch=64)
    mt.eval_chunks(ctx, chunks, 0)
    pv = np.stack([c.pixels for c in images])[None]
    idefics3_vlm.load(GGMLType.F32, GGMLType.F32)
    with torch.no_grad():
        out = idefics3_vlm.hf(input_ids=torch.tensor([ids]), pixel_values=torch.from_numpy(pv))
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-3
