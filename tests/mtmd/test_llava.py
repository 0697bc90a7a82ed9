"""LLaVA 1.5 style (mlp projector over CLIP, feature layer -2, class token dropped) vs Hugging Face."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

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


# -- ldp / ldpv2 (MobileVLM): no HF class; the oracle is a torch transcription of llama.cpp's graph ----------
@pytest.fixture(scope="module", params=[1, 2], ids=["ldp", "ldpv2"])
def ldp_vlm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> convert.TinyLDP:
    return convert.make_ldp(tmp_path_factory.mktemp(f"ldp{request.param}"), version=request.param)


def _ln2d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """Layer norm over the channels of an NCHW tensor (MobileVLM's LayerNormAct2d without act)."""
    return F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), w, b, eps).permute(0, 3, 1, 2)


def _ldp_reference(vlm: convert.TinyLDP, px: np.ndarray, ftype: GGMLType, eps: float) -> np.ndarray:
    vlm.load(ftype)
    with torch.no_grad():
        hs = vlm.hf.model.vision_tower(torch.from_numpy(px[None]), output_hidden_states=True).hidden_states
    return ldp_project(vlm.projector_as_stored(ftype), hs[-2][0, 1:], vlm.version, eps)  # layer -2, no CLS


def ldp_project(weights: dict[str, np.ndarray], feat: torch.Tensor, version: int, eps: float) -> np.ndarray:
    """MobileVLM's projector over the CLIP features ``feat [P, E]`` (a square grid), in torch."""
    p = {k: torch.from_numpy(v) for k, v in weights.items()}
    with torch.no_grad():
        side = int(round(feat.shape[0] ** 0.5))
        m0, m1 = (1, 3) if version == 1 else (0, 2)
        x = F.gelu(
            F.linear(feat, p[f"mm.model.mlp.{m0}.weight"], p[f"mm.model.mlp.{m0}.bias"]), approximate="tanh"
        )
        x = F.linear(x, p[f"mm.model.mlp.{m1}.weight"], p[f"mm.model.mlp.{m1}.bias"])
        c = x.shape[1]
        x = x.T.reshape(1, c, side, side)
        if version == 2:  # LDPNetV2Projector: token down (2x2 average), then PEG
            x = F.adaptive_avg_pool2d(x, side // 2)
            x = (
                F.conv2d(
                    x, p["mm.model.peg.0.weight"][:, None], p["mm.model.peg.0.bias"], padding=1, groups=c
                )
                + x
            )
        else:  # LDPNetProjector: two MobileNetV3 inverted residuals (stride 1 with residual, stride 2)
            for blk, stride in ((1, 1), (2, 2)):
                q = f"mm.model.mb_block.{blk}.block."
                y = F.conv2d(x, p[q + "0.0.weight"][:, None], stride=stride, padding=1, groups=c)
                y = F.hardswish(_ln2d(y, p[q + "0.1.weight"], p[q + "0.1.bias"], eps))
                s = F.relu(
                    F.conv2d(
                        y.mean((2, 3), keepdim=True),
                        p[q + "1.fc1.weight"][..., None, None],
                        p[q + "1.fc1.bias"],
                    )
                )
                s = F.hardsigmoid(F.conv2d(s, p[q + "1.fc2.weight"][..., None, None], p[q + "1.fc2.bias"]))
                y = F.conv2d(y * s, p[q + "2.0.weight"][..., None, None])
                y = _ln2d(y, p[q + "2.1.weight"], p[q + "2.1.bias"], eps)
                x = x + y if stride == 1 else y
        return x.flatten(2)[0].T.numpy()


@pytest.mark.parametrize("ftype", [GGMLType.F32, GGMLType.F16], ids=["f32", "f16"])
def test_ldp_embeddings_match_torch_reference(ldp_vlm: convert.TinyLDP, ftype: GGMLType) -> None:
    cm = ClipModel(ldp_vlm.mmproj_gguf(ftype))
    assert cm.hparams.projector_type == ldp_vlm.projector_type and cm.n_mmproj_embd == 64
    px = RNG.uniform(-1.5, 1.5, (3, 48, 48)).astype(np.float32)
    got = cm.encode(px)
    ref = _ldp_reference(ldp_vlm, px, ftype, cm.hparams.eps)
    assert got.shape == ref.shape == (cm.n_output_tokens(48, 48), 64) == (9, 64)
    assert _rel(got, ref) < 1e-3


def test_ldp_image_in_a_prompt(ldp_vlm: convert.TinyLDP) -> None:
    """The image's tokens decode as embeddings: logits match the HF text model fed the reference ones."""
    model = Model.load(ldp_vlm.text_gguf())
    mt = MtmdContext(ldp_vlm.mmproj_gguf(), model)
    chunks = mt.tokenize(
        "what is <__media__> this", [Bitmap(RNG.integers(0, 256, (30, 50, 3), dtype=np.uint8))]
    )
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    assert img.n_tokens == 9 and img.pixels.shape == (3, 48, 48)
    ctx = Context(model, n_ctx=256, n_batch=64, n_ubatch=64)
    mt.eval_chunks(ctx, chunks, 0)
    ref = torch.from_numpy(_ldp_reference(ldp_vlm, img.pixels, GGMLType.F32, mt.clip.hparams.eps))
    ldp_vlm.load(GGMLType.F32, GGMLType.F32)
    lm = ldp_vlm.hf.model.language_model
    with torch.no_grad():
        parts = [lm.embed_tokens(torch.tensor(c.tokens)) if isinstance(c, TextChunk) else ref for c in chunks]
        h = lm(inputs_embeds=torch.cat(parts)[None]).last_hidden_state
        logits = ldp_vlm.hf.lm_head(h)[0, -1].numpy()
    assert _rel(ctx.get_logits()[-1], logits) < 1e-3


def test_ldp_q8_0_mmproj(ldp_vlm: convert.TinyLDP) -> None:
    """Matrices Q8_0, depthwise kernels F16 (as llama.cpp's converters store them): close to the F32 file."""
    px = RNG.uniform(-1.5, 1.5, (3, 48, 48)).astype(np.float32)
    q = ClipModel(ldp_vlm.mmproj_gguf(GGMLType.Q8_0))
    assert (
        q.w["mm.model.mlp.2.weight" if ldp_vlm.version == 2 else "mm.model.mlp.3.weight"].type
        == GGMLType.Q8_0
    )
    ref = ClipModel(ldp_vlm.mmproj_gguf(GGMLType.F32)).encode(px)
    assert _rel(q.encode(px), ref) < 0.05
