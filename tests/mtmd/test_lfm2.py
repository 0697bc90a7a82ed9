"""LFM2-VL (lfm2 projector: SigLIP2 NaFlex at the image's size, resized position table, pixel unshuffle, LN + MLP;
512 px tiles + thumbnail) vs Hugging Face's Lfm2VlForConditionalGeneration, with an LFM2 text model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from llamapy.context import Context
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, MtmdError, TextChunk
from llamapy.mtmd.lfm2 import frames, grid_layout
from tests.model import hf_tiny
from tests.mtmd import convert

RNG = np.random.default_rng(13)
SPECIALS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<|image_start|>",
    "<|image_end|>",
    "<image>",
    "<|img_thumbnail|>",
]
SPECIALS += [f"<|img_row_{r}_col_{c}|>" for r in range(1, 4) for c in range(1, 4)]
IMG = 6
TEXT = hf_tiny.FAMILIES["lfm2"]
P = 16


class TinyLfm2Vl:
    def __init__(self, tmp: Path, seed: int = 0) -> None:
        text = dict(hf_tiny._common(**TEXT.config_kw))
        text.update(
            vocab_size=convert.N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1, model_type="lfm2"
        )
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=P,
                      num_patches=16, vision_use_head=False, layer_norm_eps=1e-6)  # fmt: skip
        cfg = transformers.Lfm2VlConfig(
            vision_config=vision,
            text_config=text,
            image_token_id=IMG,
            projector_hidden_size=48,
            projector_hidden_act="gelu_pytorch_tanh",
            downsample_factor=2,
        )  # fmt: skip  (llama.cpp's projector GELU is ggml's tanh one; the real config says "gelu")
        for c in (cfg, cfg.text_config, cfg.vision_config):
            c._attn_implementation = "eager"
        torch.manual_seed(seed)
        self.hf = transformers.Lfm2VlForConditionalGeneration(cfg).to(torch.float32)
        hf_tiny._randomize(self.hf.model.language_model, TEXT, seed)
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed + 2)
            self.hf.lm_head.weight.copy_(torch.randn(self.hf.lm_head.weight.shape, generator=g) / 8)
        convert._randomize_vision(self.hf, "model.language_model.", seed)
        self.hf.eval()
        self.cfg, self.tmp = cfg, tmp
        self.state = hf_tiny.hf_state_dict(self.hf)
        pre = "model.language_model."
        sd = {"model." + k[len(pre) :]: v for k, v in self.state.items() if k.startswith(pre)}
        sd["lm_head.weight"] = self.state["lm_head.weight"]
        md = hf_tiny.metadata(TEXT, cfg.text_config, GGMLType.F32)
        md.update(convert.tiny_vocab(SPECIALS))
        tensors = hf_tiny.convert(TEXT, cfg.text_config, sd)
        self.text_path = hf_tiny.write_gguf(tmp / "text.gguf", TEXT.arch, md, tensors, GGMLType.F32)
        self.mmproj_path = self.write_mmproj(tmp / "mmproj.gguf")

    def mm_tensors(self) -> dict[str, np.ndarray]:
        out = {k: v for k, v in convert.mmproj_tensors(self.state).items() if k.startswith("v.")}
        w = self.state["model.vision_tower.embeddings.patch_embedding.weight"]
        out["v.patch_embd.weight"] = np.ascontiguousarray(
            w.reshape(w.shape[0], P, P, 3).transpose(0, 3, 1, 2)
        )
        pj = "model.multi_modal_projector."
        for hf, gg in (("layer_norm", "mm.input_norm"), ("linear_1", "mm.1"), ("linear_2", "mm.2")):
            for kind in ("weight", "bias"):
                out[f"{gg}.{kind}"] = np.asarray(self.state[f"{pj}{hf}.{kind}"], dtype=np.float32)
        return out

    def metadata(self) -> dict[str, Any]:
        v = self.cfg.vision_config
        return {
            "general.name": "tiny-lfm2-mmproj", "general.file_type": 0, "clip.has_vision_encoder": True,
            "clip.projector_type": "lfm2", "clip.vision.image_size": 4 * P, "clip.vision.patch_size": P,
            "clip.vision.embedding_length": v.hidden_size, "clip.vision.feed_forward_length": v.intermediate_size,
            "clip.vision.block_count": v.num_hidden_layers, "clip.vision.attention.head_count": v.num_attention_heads,
            "clip.vision.projection_dim": self.cfg.text_config.hidden_size,
            "clip.vision.attention.layer_norm_epsilon": float(v.layer_norm_eps), "clip.vision.image_mean": [0.5] * 3,
            "clip.vision.image_std": [0.5] * 3, "clip.use_gelu": True, "clip.vision.projector.scale_factor": 2,
        }  # fmt: skip

    def write_mmproj(self, path: Path, md: dict | None = None, tensors: dict | None = None) -> Path:
        md = self.metadata() if md is None else md
        return convert.write_mmproj(path, md, self.mm_tensors() if tensors is None else tensors, GGMLType.F32)

    @staticmethod
    def hf_inputs(pxs: list[np.ndarray]) -> dict[str, torch.Tensor]:
        """Siglip2's patchified pixels (each patch (row, col, channel)), padded to the longest, with shapes and mask."""
        n_max = max((p.shape[1] // P) * (p.shape[2] // P) for p in pxs)
        pv = np.zeros((len(pxs), n_max, 3 * P * P), np.float32)
        mask = np.zeros((len(pxs), n_max), np.int64)
        shapes = []
        for i, px in enumerate(pxs):
            nh, nw = px.shape[1] // P, px.shape[2] // P
            pt = px.reshape(3, nh, P, nw, P).transpose(1, 3, 2, 4, 0).reshape(nh * nw, -1)
            pv[i, : nh * nw], mask[i, : nh * nw] = pt, 1
            shapes.append([nh, nw])
        return {"pixel_values": torch.from_numpy(pv), "spatial_shapes": torch.tensor(shapes),
                "pixel_attention_mask": torch.from_numpy(mask)}  # fmt: skip

    def hf_features(self, px: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = self.hf.model.get_image_features(**self.hf_inputs([px]))
        out = getattr(out, "pooler_output", out)
        return torch.cat(list(out)).numpy().reshape(-1, self.cfg.text_config.hidden_size)


@pytest.fixture(scope="module")
def lfm2vl(tmp_path_factory: pytest.TempPathFactory) -> TinyLfm2Vl:
    return TinyLfm2Vl(tmp_path_factory.mktemp("lfm2vl"))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("hw", [(64, 64), (256, 320), (32, 512)])  # the table's own size, up- and down-sized
def test_image_embeddings_match_hf(lfm2vl: TinyLfm2Vl, hw: tuple[int, int]) -> None:
    cm = ClipModel(lfm2vl.mmproj_path)
    assert cm.hparams.projector_type == "lfm2" and cm.n_mmproj_embd == 64
    px = RNG.uniform(-1, 1, (3, *hw)).astype(np.float32)
    got = cm.encode(px)
    assert got.shape == (cm.n_output_tokens(hw[1], hw[0]), 64) == ((hw[0] // 32) * (hw[1] // 32), 64)
    assert _rel(got, lfm2vl.hf_features(px)) < 1e-5


def test_frames_sizes() -> None:
    from llamapy.mtmd.clip import ClipHParams

    hp = ClipHParams("lfm2", 64, P, 32, 64, 2, 2, 64, 1e-6, (0.5,) * 3, (0.5,) * 3, n_merge=2)
    (one,), r, c = frames(Bitmap(RNG.integers(0, 256, (300, 500, 3), dtype=np.uint8)), hp)
    assert (r, c) == (0, 0) and one.shape == (3, 288, 512)  # 64..256 tokens of 32 px, the ratio kept
    (small,), _, _ = frames(Bitmap(RNG.integers(0, 256, (20, 30, 3), dtype=np.uint8)), hp)
    assert small.shape[1] * small.shape[2] >= 64 * 32 * 32  # scaled up to the minimum
    fr, r, c = frames(Bitmap(RNG.integers(0, 256, (500, 1500, 3), dtype=np.uint8)), hp)
    assert (r, c) == (1, 3) and [f.shape for f in fr[:-1]] == [(3, 512, 512)] * 3
    assert (
        grid_layout(1000, 1000) == (2, 2)
        and grid_layout(1000, 500) == (2, 1)
        and grid_layout(500, 1000) == (1, 2)
    )


def test_logits_with_an_image_match_hf(lfm2vl: TinyLfm2Vl) -> None:
    model = Model.load(lfm2vl.text_path)
    mt = MtmdContext(lfm2vl.mmproj_path, model)
    bmp = Bitmap(RNG.integers(0, 256, (100, 150, 3), dtype=np.uint8))
    chunks = mt.tokenize("what is <__media__> this", [bmp])
    (img,) = [c for c in chunks if isinstance(c, ImageChunk)]
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens
    want = model.vocab.tokenize(f"what is <|image_start|>{'<image>' * img.n_tokens}<|image_end|> this",
                                add_special=True, parse_special=True)  # fmt: skip
    assert ids == want
    ctx = Context(model, n_ctx=256, n_batch=32, n_ubatch=32, type_k="f32", type_v="f32")
    mt.eval_chunks(ctx, chunks, 0)
    with torch.no_grad():
        out = lfm2vl.hf(input_ids=torch.tensor([ids]), **lfm2vl.hf_inputs([img.pixels]))
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-4


def test_tiled_image_prompt(lfm2vl: TinyLfm2Vl) -> None:
    mt = MtmdContext(lfm2vl.mmproj_path, Model.load(lfm2vl.text_path))
    bmp = Bitmap(RNG.integers(0, 256, (500, 1500, 3), dtype=np.uint8))
    chunks = mt.tokenize("<__media__>", [bmp])
    imgs = [c for c in chunks if isinstance(c, ImageChunk)]
    assert len(imgs) == 4 and imgs[-1].id == bmp.id and [c.n_tokens for c in imgs[:3]] == [256] * 3
    got_ids = [t for c in chunks for t in (c.tokens if isinstance(c, TextChunk) else [IMG])]
    seq = "".join(f"<|img_row_1_col_{k}|><image>" for k in (1, 2, 3))
    want = f"<|image_start|>{seq}<|img_thumbnail|><image><|image_end|>"
    assert got_ids == mt.vocab.tokenize(want, add_special=True, parse_special=True)
    got = mt.encode(imgs[0])
    assert _rel(got, lfm2vl.hf_features(imgs[0].pixels)) < 1e-5


def test_unshuffle_mutation_and_bad_mmproj(lfm2vl: TinyLfm2Vl, tmp_path: Path) -> None:
    t = lfm2vl.mm_tensors()
    w = t["mm.1.weight"].reshape(
        48, 2, 2, 32
    )  # the unshuffled (row, col, channel) order broken: rows <-> cols
    t["mm.1.weight"] = np.ascontiguousarray(w.transpose(0, 2, 1, 3)).reshape(48, 128)
    px = RNG.uniform(-1, 1, (3, 64, 96)).astype(np.float32)
    assert (
        _rel(
            ClipModel(lfm2vl.write_mmproj(tmp_path / "bad.gguf", tensors=t)).encode(px),
            lfm2vl.hf_features(px),
        )
        > 1e-2
    )
    md = lfm2vl.metadata()
    md["clip.vision.projector.scale_factor"] = 3
    with pytest.raises(MtmdError, match="shape"):
        ClipModel(lfm2vl.write_mmproj(tmp_path / "s3.gguf", md))
    with pytest.raises(MtmdError, match="multiple of 32"):
        ClipModel(lfm2vl.mmproj_path).encode(np.zeros((3, 48, 64), np.float32))
