"""Gemma 3n vision (gemma3nv projector: MobileNetV5 tower, MSFA, soft-token embedder) vs Hugging Face's
Gemma3nForConditionalGeneration, whose vision tower is timm's MobileNetV5Encoder (a small arch_def of the real
block kinds, tests/mtmd/timm_oracle.py), with a Gemma 3n text model (AltUp, per-layer embeddings).

The tiny vocabulary puts the image soft token last (299) with the vision vocab offset there and the per-layer
vocabulary below it, as the real model (262145 >= 262144): HF then gives image tokens the padding token's
per-layer embedding, as llama.cpp does."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
import transformers

from llamapy.context import Context
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, MtmdError, TextChunk
from llamapy.mtmd import gemma3nv as g3n
from tests.model import hf_tiny
from tests.model.families import gemma3n as fam
from tests.mtmd import convert, timm_oracle

RNG = np.random.default_rng(31)
TEXT = hf_tiny.FAMILIES["gemma3n"]
N = convert.N_VOCAB
IMG = N - 1  # the image soft token: the vision vocab's offset, above the per-layer vocabulary
SIZE = 512  # stages end at 32 (stage 2) and 16 (stage 3): the MSFA upsamples, then pools 2x2 to 16 x 16
C = 2048  # timm's MobileNetV5Encoder.num_features (fixed)


class TinyGemma3n:
    def __init__(self, tmp: Path, seed: int = 0) -> None:
        timm_oracle.register_tiny_mnv5()
        text = dict(hf_tiny._common(**TEXT.config_kw))
        text.update(
            vocab_size=N, vocab_size_per_layer_input=IMG, pad_token_id=0, bos_token_id=2, eos_token_id=1
        )
        vision = dict(architecture=timm_oracle.TINY, hidden_size=C, vocab_size=1, vocab_offset=IMG)
        audio = dict(vocab_size=1, vocab_offset=N, hidden_size=16, input_feat_size=16, conf_num_attention_heads=2,
                     conf_num_hidden_layers=1, sscp_conv_channel_size=[4, 4])  # fmt: skip
        cfg = transformers.Gemma3nConfig(
            text_config=text, vision_config=vision, audio_config=audio, boi_token_id=convert.BOI,
            eoi_token_id=convert.EOI, image_token_id=IMG, boa_token_id=7, eoa_token_id=8, audio_token_id=N,
        )  # fmt: skip
        for c in (cfg, cfg.text_config):
            c._attn_implementation = "eager"
        torch.manual_seed(seed)
        with contextlib.ExitStack() as st:
            for p in timm_oracle.timm_wrapper_patches():
                st.enter_context(p)
            self.hf = transformers.Gemma3nForConditionalGeneration(cfg).to(torch.float32)
        hf_tiny._randomize(self.hf.model.language_model, TEXT, seed)
        convert._randomize_vision(self.hf, "model.language_model.", seed)
        self.hf.eval()
        self.cfg = cfg
        self.state = hf_tiny.hf_state_dict(self.hf)
        pre = "model.language_model."
        sd = {"model." + k[len(pre) :]: v for k, v in self.state.items() if k.startswith(pre)}
        # the converter zero-pads the per-layer table to the full vocabulary (Gemma3NModel.modify_tensors)
        ple = sd["model.embed_tokens_per_layer.weight"]
        sd["model.embed_tokens_per_layer.weight"] = np.concatenate([ple, np.zeros((N - IMG, ple.shape[1]))])
        tensors = fam.convert(TEXT, cfg.text_config, sd)
        md = fam.metadata(TEXT, cfg.text_config, GGMLType.F32)
        md.update(convert.tiny_vocab())
        self.text_path = hf_tiny.write_gguf(tmp / "text.gguf", TEXT.arch, md, tensors, GGMLType.F32)
        self.mmproj_path = self.write_mmproj(tmp / "mmproj.gguf")

    def mm_tensors(self) -> dict[str, np.ndarray]:
        """As llama.cpp's Gemma3nVisionAudioModel names and shapes them."""
        out: dict[str, np.ndarray] = {}
        tm, ev = "model.vision_tower.timm_model.", "model.embed_vision."
        for name, w in self.state.items():
            w = np.asarray(w, dtype=np.float32)
            if name.startswith(tm + "blocks."):
                out["v.blk." + name[len(tm + "blocks.") :]] = w
            elif name.startswith(tm):
                out["v." + name[len(tm) :]] = w
            elif name.startswith(ev):
                short = {
                    "embedding": "embedding",
                    "hard_embedding_norm": "hard_emb_norm",
                    "embedding_projection": "input_projection",
                    "soft_embedding_norm": "soft_emb_norm",
                }
                mod, kind = name[len(ev) :].rsplit(".", 1)
                out[f"mm.{short[mod]}.{kind}"] = w  # fmt: skip
        for k in [k for k in out if k.endswith("layer_scale.gamma") or k == "v.conv_stem.conv.bias"]:
            out[k] = out[k].reshape(1, -1, 1, 1)  # the converter's unsqueezes
        return out

    def metadata(self) -> dict[str, Any]:
        return {
            "general.name": "tiny-gemma3n-mmproj", "general.file_type": 0, "clip.has_vision_encoder": True,
            "clip.projector_type": "gemma3nv", "clip.vision.image_size": SIZE, "clip.vision.patch_size": SIZE // 256,
            "clip.vision.embedding_length": C, "clip.vision.feed_forward_length": 4 * C,
            "clip.vision.block_count": 128, "clip.vision.attention.head_count": 8,
            "clip.vision.projection_dim": self.cfg.text_config.hidden_size,
            "clip.vision.attention.layer_norm_epsilon": 1e-6, "clip.vision.image_mean": [0.0] * 3,
            "clip.vision.image_std": [1.0] * 3, "clip.use_gelu": True,
        }  # fmt: skip

    def write_mmproj(self, path: Path, md: dict | None = None, tensors: dict | None = None) -> Path:
        md = self.metadata() if md is None else md
        t = self.mm_tensors() if tensors is None else tensors
        with mock.patch.object(convert, "mmproj_type", lambda name, arr, ftype: GGMLType.F32):
            return convert.write_mmproj(path, md, t, GGMLType.F32)

    def hf_features(self, px: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = self.hf.model.get_image_features(torch.from_numpy(px[None].copy()))
        return out.pooler_output[0].numpy()


@pytest.fixture(scope="module")
def gemma3n(tmp_path_factory: pytest.TempPathFactory) -> TinyGemma3n:
    return TinyGemma3n(tmp_path_factory.mktemp("gemma3nv"))


@pytest.fixture(scope="module")
def pixels() -> np.ndarray:
    return RNG.uniform(0, 1, (3, SIZE, SIZE)).astype(np.float32)


@pytest.fixture(scope="module")
def hf_feats(gemma3n: TinyGemma3n, pixels: np.ndarray) -> np.ndarray:
    return gemma3n.hf_features(pixels)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_image_embeddings_match_hf(gemma3n: TinyGemma3n, pixels: np.ndarray, hf_feats: np.ndarray) -> None:
    cm = ClipModel(gemma3n.mmproj_path)
    assert cm.hparams.projector_type == "gemma3nv" and cm.n_mmproj_embd == 64
    kinds = [b.kind for b in cm.hparams.extra["mnv5_blocks"]]
    assert kinds == ["edge"] * 2 + ["uir"] * 2 + ["uir", "uir", "attn", "uir"] + ["uir", "attn", "uir"]
    got = cm.encode(pixels)
    assert got.shape == (cm.n_output_tokens(SIZE, SIZE), 64) == (256, 64)
    assert _rel(got, hf_feats) < 1e-5


def test_logits_with_an_image_match_hf(gemma3n: TinyGemma3n) -> None:
    model = Model.load(gemma3n.text_path)
    mt = MtmdContext(gemma3n.mmproj_path, model, image_pad=False)  # stretched, as HF's processor
    bmp = Bitmap(RNG.integers(0, 256, (301, 419, 3), dtype=np.uint8))
    chunks = mt.tokenize("what is <__media__> this", [bmp])
    (img,) = [c for c in chunks if isinstance(c, ImageChunk)]
    assert img.n_tokens == 256 and img.pixels.shape == (3, SIZE, SIZE) and not img.non_causal
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens
    want = model.vocab.tokenize("what is <start_of_image>", add_special=True, parse_special=True)
    assert ids[: len(want)] == want and ids[len(want) + 256] == convert.EOI
    ctx = Context(model, n_ctx=512, n_batch=64, n_ubatch=64, type_k="f32", type_v="f32")
    mt.eval_chunks(ctx, chunks, 0)
    with torch.no_grad():
        out = gemma3n.hf(
            input_ids=torch.tensor([ids]), pixel_values=torch.from_numpy(img.pixels[None].copy())
        )
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-4


def test_mmproj_with_the_audio_half_as_the_converter_writes_it(gemma3n: TinyGemma3n, tmp_path: Path) -> None:
    """The real file has both halves (clip.vision/audio.projector_type gemma3nv/gemma3na, no clip.projector_type);
    the audio half is skipped as llama.cpp skips it: images work, audio is a typed error."""
    from llamapy.mtmd.audio import AudioBitmap, AudioError

    md = gemma3n.metadata()
    del md["clip.projector_type"]
    md.update({"clip.vision.projector_type": "gemma3nv", "clip.audio.projector_type": "gemma3na",
               "clip.has_audio_encoder": True, "clip.audio.num_mel_bins": 128})  # fmt: skip
    t = gemma3n.mm_tensors()
    t["a.conformer.0.attn_q.weight"] = np.zeros((8, 8), np.float32)
    t["mm.a.input_projection.weight"] = np.zeros((64, 8), np.float32)
    mt = MtmdContext(
        gemma3n.write_mmproj(tmp_path / "both.gguf", md=md, tensors=t), Model.load(gemma3n.text_path)
    )
    assert mt.audio is None and mt.clip is not None and mt.clip.hparams.projector_type == "gemma3nv"
    with pytest.raises(AudioError, match="no audio encoder"):
        mt.tokenize("hear <__media__>", [AudioBitmap(np.zeros(16000, np.float32))])


def test_same_padding_mutation_and_bad_mmproj(
    gemma3n: TinyGemma3n, pixels: np.ndarray, hf_feats: np.ndarray, tmp_path: Path
) -> None:
    # symmetric padding on the stride-2 convs (instead of TF's SAME, the odd pixel after) is caught
    sym = lambda n, k, s: (k // 2, k // 2, (n + s - 1) // s)  # noqa: E731
    with mock.patch.object(g3n, "_pads", sym):
        assert _rel(ClipModel(gemma3n.mmproj_path).encode(pixels), hf_feats) > 1e-2
    t = gemma3n.mm_tensors()
    del t["v.conv_stem.conv.weight"]
    with pytest.raises(MtmdError, match="conv_stem"):
        ClipModel(gemma3n.write_mmproj(tmp_path / "nostem.gguf", tensors=t))
    t = gemma3n.mm_tensors()
    t["v.blk.1.0.pw_exp.conv.weight"] = t["v.blk.1.0.pw_exp.conv.weight"][:, :5]
    with pytest.raises(MtmdError, match="pw_exp"):
        ClipModel(gemma3n.write_mmproj(tmp_path / "badexp.gguf", tensors=t))
    t = gemma3n.mm_tensors()
    t["mm.input_projection.weight"] = t["mm.input_projection.weight"].T.copy()
    with pytest.raises(MtmdError, match="input_projection"):
        ClipModel(gemma3n.write_mmproj(tmp_path / "proj.gguf", tensors=t))


@pytest.mark.parametrize("hw", [(301, 419), (777, 123)])
def test_preprocessing_matches_hf(hw: tuple[int, int]) -> None:
    """HF's processor (SiglipImageProcessor: bilinear, rescale, mean 0 / std 1) stretches to the square; the
    same resize here without llama.cpp's padding gives its pixels."""
    from transformers import SiglipImageProcessor

    from llamapy.mtmd.image import preprocess_fixed

    data = RNG.integers(0, 256, (*hw, 3), dtype=np.uint8)
    got = preprocess_fixed(Bitmap(data), SIZE, (0.0,) * 3, (1.0,) * 3, pad=False, resample="bilinear")
    proc = SiglipImageProcessor(size={"height": SIZE, "width": SIZE}, resample=2, image_mean=[0.0] * 3,
                                image_std=[1.0] * 3)  # fmt: skip
    want = proc(images=[data], return_tensors="np")["pixel_values"][0]
    assert got.shape == want.shape == (3, SIZE, SIZE)
    assert np.abs(got - want).max() < 1e-6


def test_f16_mmproj_as_the_converter_stores_it(
    gemma3n: TinyGemma3n, pixels: np.ndarray, hf_feats: np.ndarray, tmp_path: Path
) -> None:
    """F16 conv kernels (strided tap views of 2-byte rows) and the F16 input projection."""
    path = convert.write_mmproj(tmp_path / "f16.gguf", gemma3n.metadata(), gemma3n.mm_tensors(), GGMLType.F16)
    cm = ClipModel(path)
    assert cm.w["v.blk.2.2.attn.key.down_conv.weight"].type == GGMLType.F16
    assert cm.w["mm.input_projection.weight"].type == GGMLType.F16
    assert _rel(cm.encode(pixels), hf_feats) < 1e-2  # F16 rounding of every kernel (measured 3.7e-3)
