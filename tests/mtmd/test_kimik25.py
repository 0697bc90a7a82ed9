"""Kimi-K2.5 vision (kimik25 projector: MoonViT with a bicubically resized position table and 2-D rope, pixel
unshuffle, LayerNorm + MLP) vs Hugging Face's Kimi_K25ForConditionalGeneration, with a DeepSeek-V3 text model
(deepseek2: MLA, MoE), and its image processor (tests/mtmd/hf_image_oracle.py: HF's needs torchvision)."""

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
from llamapy.mtmd.kimik25 import bicubic_matrix, preprocess
from tests.model import hf_tiny
from tests.mtmd import convert
from tests.mtmd.hf_image_oracle import kimi_k25_preprocess

RNG = np.random.default_rng(31)
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|media_begin|>", "<|media_end|>", "<|media_pad|>"]
IMG = 6
TEXT = hf_tiny.FAMILIES["deepseek2"]
P, TH, TW = 4, 6, 6  # patch, position table

_LAYER = {"attn.q_proj": "attn_q", "attn.k_proj": "attn_k", "attn.v_proj": "attn_v", "attn.proj": "attn_out",
          "norm1": "ln1", "norm2": "ln2", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}  # fmt: skip


def _split_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """q/k rows from HF's layout (neox pairs (j, j + d/2) at [w0, h0, w1, h1, ...]) to llama.cpp's split one
    (adjacent pairs, the first half over w, the second over h), as convert_hf_to_gguf.py's KimiK25Model does."""
    d = w.shape[0] // n_head
    q = d // 4
    i = np.arange(q)
    perm = np.empty(d, dtype=np.int64)
    perm[0 : d // 2 : 2], perm[1 : d // 2 : 2] = 2 * i, 2 * i + d // 2
    perm[d // 2 :: 2], perm[d // 2 + 1 :: 2] = 2 * i + 1, 2 * i + 1 + d // 2
    rows = (np.arange(n_head)[:, None] * d + perm[None, :]).reshape(-1)
    return np.ascontiguousarray(w[rows])


class TinyKimiK25:
    def __init__(self, tmp: Path, seed: int = 0) -> None:
        text = dict(hf_tiny._common(**TEXT.config_kw))
        text.update(vocab_size=convert.N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1,
                    model_type="deepseek_v3", tie_word_embeddings=False)  # fmt: skip
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=P,
                      pos_emb_height=TH, pos_emb_width=TW, merge_kernel_size=[2, 2],
                      rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})  # fmt: skip
        cfg = transformers.Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=32,
                                          image_token_id=IMG, tie_word_embeddings=False)  # fmt: skip
        for c in (cfg, cfg.text_config, cfg.vision_config):
            c._attn_implementation = "eager"
        torch.manual_seed(seed)
        self.hf = transformers.Kimi_K25ForConditionalGeneration(cfg).to(torch.float32)
        hf_tiny._randomize(self.hf.model.language_model, TEXT, seed)
        convert._randomize_vision(self.hf, "model.language_model.", seed)
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed + 2)
            self.hf.lm_head.weight.copy_(torch.randn(self.hf.lm_head.weight.shape, generator=g) / 8)
            pe = self.hf.model.vision_tower.patch_embed.pos_emb.position_embeddings
            pe.copy_(torch.randn(pe.shape, generator=g) * 0.5)
        # llama.cpp runs the projector's GELU as ggml's (tanh); HF's is erf: made the same here
        self.hf.model.mm_projector.act = torch.nn.GELU(approximate="tanh")
        self.hf.eval()
        self.cfg = cfg
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
        out: dict[str, np.ndarray] = {}
        vt, nh = "model.vision_tower.", self.cfg.vision_config.num_attention_heads
        for name, w in self.state.items():
            w = np.asarray(w, dtype=np.float32)
            if name.startswith(vt + "layers."):
                il, rest = name[len(vt + "layers.") :].split(".", 1)
                mod, kind = rest.rsplit(".", 1)
                if mod in ("attn.q_proj", "attn.k_proj"):
                    w = _split_rope(w, nh)
                out[f"v.blk.{il}.{_LAYER[mod]}.{kind}"] = w
            elif name.startswith(vt + "final_layernorm."):
                out["v.post_ln." + name.rsplit(".", 1)[1]] = w
            elif name.startswith("model.mm_projector."):
                mod, kind = name[len("model.mm_projector.") :].rsplit(".", 1)
                out[
                    f"{ {'pre_norm': 'mm.input_norm', 'in_proj': 'mm.1', 'out_proj': 'mm.2'}[mod] }.{kind}"
                ] = w
        pe = vt + "patch_embed."
        out["v.patch_embd.weight"] = self.state[pe + "proj.weight"]
        out["v.patch_embd.bias"] = self.state[pe + "proj.bias"]
        out["v.position_embd.weight"] = self.state[pe + "pos_emb.position_embeddings"]
        return out

    def metadata(self) -> dict[str, Any]:
        v = self.cfg.vision_config
        return {
            "general.name": "tiny-kimik25-mmproj", "general.file_type": 0, "clip.has_vision_encoder": True,
            "clip.projector_type": "kimik25", "clip.vision.image_size": TH * P, "clip.vision.patch_size": P,
            "clip.vision.embedding_length": v.hidden_size, "clip.vision.feed_forward_length": v.intermediate_size,
            "clip.vision.block_count": v.num_hidden_layers, "clip.vision.attention.head_count": v.num_attention_heads,
            "clip.vision.projection_dim": self.cfg.text_config.hidden_size,
            "clip.vision.attention.layer_norm_epsilon": 1e-5, "clip.vision.image_mean": [0.5] * 3,
            "clip.vision.image_std": [0.5] * 3, "clip.use_gelu": True, "clip.vision.projector.scale_factor": 2,
            "clip.vision.image_min_pixels": 8 * P * P, "clip.vision.image_max_pixels": 256 * P * P,
        }  # fmt: skip

    def write_mmproj(self, path: Path, md: dict | None = None, tensors: dict | None = None) -> Path:
        md = self.metadata() if md is None else md
        return convert.write_mmproj(path, md, self.mm_tensors() if tensors is None else tensors, GGMLType.F32)

    @staticmethod
    def hf_inputs(px: np.ndarray) -> dict[str, torch.Tensor]:
        ny, nx = px.shape[1] // P, px.shape[2] // P
        pv = px.reshape(3, ny, P, nx, P).transpose(1, 3, 0, 2, 4).reshape(ny * nx, 3, P, P)
        return {"pixel_values": torch.from_numpy(np.ascontiguousarray(pv)),
                "image_grid_thw": torch.tensor([[1, ny, nx]])}  # fmt: skip

    def hf_features(self, px: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = self.hf.model.get_image_features(**self.hf_inputs(px))
        return torch.cat(list(out.pooler_output)).numpy()


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> TinyKimiK25:
    return TinyKimiK25(tmp_path_factory.mktemp("kimik25"))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("hw", [(24, 24), (40, 16), (8, 56)])  # the table's size, then resized up and down
def test_image_embeddings_match_hf(kimi: TinyKimiK25, hw: tuple[int, int]) -> None:
    cm = ClipModel(kimi.mmproj_path)
    assert cm.hparams.projector_type == "kimik25" and cm.n_mmproj_embd == 64
    px = RNG.uniform(-1, 1, (3, *hw)).astype(np.float32)
    got = cm.encode(px)
    assert got.shape == (cm.n_output_tokens(hw[1], hw[0]), 64) == ((hw[0] // 8) * (hw[1] // 8), 64)
    assert _rel(got, kimi.hf_features(px)) < 1e-5


def test_bicubic_matrix_is_torch_interpolate() -> None:
    tab = RNG.normal(size=(5, 7, 3)).astype(np.float32)
    for h, w in ((9, 4), (5, 7), (2, 13)):
        got = (bicubic_matrix(5, 7, h, w) @ tab.reshape(35, 3)).reshape(h, w, 3)
        want = torch.nn.functional.interpolate(
            torch.from_numpy(tab).permute(2, 0, 1)[None], size=(h, w), mode="bicubic", align_corners=False
        )[0].permute(1, 2, 0)
        assert np.abs(got - want.numpy()).max() < 1e-5


@pytest.mark.parametrize("hw", [(45, 70), (13, 7), (1, 3), (301, 97), (97, 301), (2100, 4), (130, 131)])
def test_preprocessing_on_odd_sizes_is_hf(kimi: TinyKimiK25, hw: tuple[int, int]) -> None:
    """Kimi_K25ImageProcessor (tests/mtmd/hf_image_oracle.py; max_patches 256 = the file's image_max_pixels /
    patch area): the same size, padding and pixels; where it downscales, Pillow's bicubic vs torchvision's within
    a few levels of 255 (5 on the 2100 x 4 px strip, 1 elsewhere)."""
    cm = ClipModel(kimi.mmproj_path)
    data = RNG.integers(0, 256, (*hw, 3), dtype=np.uint8)
    got = preprocess(cm, Bitmap(data), True)
    want = kimi_k25_preprocess(data, patch_size=P, max_patches=256)
    assert got.shape == want.shape
    d = np.abs(got - want)
    resized = (hw[0] // P) * (hw[1] // P) > 256
    assert d.max() < (6 / 127.5 if resized else 1e-6) and d.mean() < 2e-3
    if hw == (45, 70):  # llama.cpp's rule gives the same size here (2..64 tokens), other sizes not
        assert got.shape[1:] == (48, 72)
    if hw == (301, 97):  # llama.cpp: 112 x 32 px (56 tokens); HF: 113 x 36 px, padded to 120 x 40
        assert got.shape[1:] == (120, 40) and np.all(got[:, 113:] == -1.0) and np.all(got[:, :, 36:] == -1.0)


def test_logits_with_an_image_match_hf(kimi: TinyKimiK25) -> None:
    model = Model.load(kimi.text_path)
    mt = MtmdContext(kimi.mmproj_path, model)
    bmp = Bitmap(RNG.integers(0, 256, (45, 70, 3), dtype=np.uint8))
    chunks = mt.tokenize("what is <__media__> this", [bmp])
    (img,) = [c for c in chunks if isinstance(c, ImageChunk)]
    h, w = img.pixels.shape[1:]
    assert (h, w) == (
        48,
        72,
    ) and img.n_tokens == 54  # multiples of 8 px near the image's size (2..64 tokens here)
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens
    want = model.vocab.tokenize(f"what is <|media_begin|>{'<|media_pad|>' * img.n_tokens}<|media_end|> this",
                                add_special=True, parse_special=True)  # fmt: skip
    assert ids == want
    ctx = Context(model, n_ctx=256, n_batch=32, n_ubatch=32, type_k="f32", type_v="f32")
    mt.eval_chunks(ctx, chunks, 0)
    with torch.no_grad():
        out = kimi.hf(input_ids=torch.tensor([ids]), **kimi.hf_inputs(img.pixels))
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-4


def test_rope_layout_mutation_and_bad_mmproj(kimi: TinyKimiK25, tmp_path: Path) -> None:
    t = kimi.mm_tensors()
    st = kimi.state["model.vision_tower.layers.0.attn.q_proj.weight"]
    t["v.blk.0.attn_q.weight"] = np.asarray(st, np.float32)  # HF's interleaved layout left unpermuted
    t["v.blk.0.attn_k.weight"] = np.asarray(
        kimi.state["model.vision_tower.layers.0.attn.k_proj.weight"], np.float32
    )
    px = RNG.uniform(-1, 1, (3, 16, 32)).astype(np.float32)
    bad = ClipModel(kimi.write_mmproj(tmp_path / "bad.gguf", tensors=t)).encode(px)
    assert _rel(bad, kimi.hf_features(px)) > 1e-2
    t = kimi.mm_tensors()
    t["v.position_embd.weight"] = t["v.position_embd.weight"].reshape(TH * TW, 32)
    with pytest.raises(MtmdError, match="position_embd"):
        ClipModel(kimi.write_mmproj(tmp_path / "pos2d.gguf", tensors=t))
    with pytest.raises(MtmdError, match="multiple of 8"):
        ClipModel(kimi.mmproj_path).encode(np.zeros((3, 16, 20), np.float32))
