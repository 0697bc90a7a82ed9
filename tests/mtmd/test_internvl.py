"""InternVL 3 (internvl projector: InternViT with layer scale, pixel shuffle, MLP; tiles + overview) vs Hugging
Face's InternVLForConditionalGeneration, the mmproj written under llama.cpp's tensor names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from llamapy.context import Context
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, MtmdError, TextChunk
from llamapy.mtmd.internvl import frames, grid_candidates, select_best_resolution
from tests.model import hf_tiny
from tests.mtmd import convert

RNG = np.random.default_rng(9)
SPECIALS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<img>",
    "</img>",
    "<IMG_CONTEXT>",
    "<|im_start|>",
    "<|im_end|>",
]
BEG, END, IMG = 4, 5, 6
TEXT = hf_tiny.FAMILIES["qwen2"]
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
TILE = 32
_LAYER = {"attention.q_proj": "attn_q", "attention.k_proj": "attn_k", "attention.v_proj": "attn_v",
          "attention.projection_layer": "attn_out", "layernorm_before": "ln1", "layernorm_after": "ln2",
          "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}  # fmt: skip


class TinyInternVL:
    def __init__(self, tmp: Path, seed: int = 0) -> None:
        text = dict(hf_tiny._common(**TEXT.config_kw))
        text.update(vocab_size=convert.N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1,
                    tie_word_embeddings=False, model_type="qwen2")  # fmt: skip
        vision = dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=[TILE, TILE],
            patch_size=[8, 8], attention_bias=True, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
        )  # fmt: skip
        # llama.cpp computes the GELUs with ggml_gelu (tanh); the real configs say "gelu" (erf)
        cfg = transformers.InternVLConfig(
            vision_config=vision, text_config=text, image_token_id=IMG, downsample_ratio=0.5,
            projector_hidden_act="gelu_pytorch_tanh", tie_word_embeddings=False,
        )  # fmt: skip
        for c in (cfg, cfg.text_config, cfg.vision_config):
            c._attn_implementation = "eager"
        torch.manual_seed(seed)
        self.hf = transformers.InternVLForConditionalGeneration(cfg).to(torch.float32)
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
        vt, out = "model.vision_tower.", {}
        for name, w in self.state.items():
            w = np.asarray(w, dtype=np.float32)
            if name.startswith(vt + "encoder.layer."):
                il, rest = name[len(vt + "encoder.layer.") :].split(".", 1)
                if rest in ("lambda_1", "lambda_2"):
                    out[f"v.blk.{il}.ls{rest[-1]}.weight"] = w
                    continue
                mod, kind = rest.rsplit(".", 1)
                out[f"v.blk.{il}.{_LAYER[mod]}.{kind}"] = w
            elif name == vt + "embeddings.cls_token":
                out["v.class_embd"] = w.reshape(-1)
            elif name == vt + "embeddings.position_embeddings":
                out["v.position_embd.weight"] = w[0]
            elif name.startswith(vt + "embeddings.patch_embeddings.projection."):
                out["v.patch_embd." + name.rsplit(".", 1)[1]] = w
            elif name.startswith("model.multi_modal_projector."):
                mod, kind = name[len("model.multi_modal_projector.") :].split(".")
                out[f"mm.model.mlp.{ {'layer_norm': 0, 'linear_1': 1, 'linear_2': 3}[mod] }.{kind}"] = w
            elif name.startswith(vt):
                raise KeyError(name)
        return out

    def metadata(self) -> dict[str, Any]:
        v = self.cfg.vision_config
        return {
            "general.name": "tiny-internvl-mmproj", "general.file_type": 0, "clip.has_vision_encoder": True,
            "clip.projector_type": "internvl", "clip.vision.image_size": TILE, "clip.vision.patch_size": 8,
            "clip.vision.embedding_length": v.hidden_size, "clip.vision.feed_forward_length": v.intermediate_size,
            "clip.vision.block_count": v.num_hidden_layers, "clip.vision.attention.head_count": v.num_attention_heads,
            "clip.vision.projection_dim": self.cfg.text_config.hidden_size,
            "clip.vision.attention.layer_norm_epsilon": float(v.layer_norm_eps), "clip.vision.image_mean": MEAN,
            "clip.vision.image_std": STD, "clip.use_gelu": True, "clip.vision.projector.scale_factor": 2,
            "clip.vision.preproc_min_tiles": 1, "clip.vision.preproc_max_tiles": 6,
        }  # fmt: skip

    def write_mmproj(self, path: Path, md: dict | None = None, tensors: dict | None = None) -> Path:
        md = self.metadata() if md is None else md
        return convert.write_mmproj(path, md, self.mm_tensors() if tensors is None else tensors, GGMLType.F32)

    def hf_features(self, px: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = self.hf.model.get_image_features(
                pixel_values=torch.from_numpy(px),
                vision_feature_layer=-1,
                vision_feature_select_strategy="default",
            )
        out = getattr(out, "pooler_output", out)
        return out.numpy().reshape(-1, self.cfg.text_config.hidden_size)


@pytest.fixture(scope="module")
def internvl(tmp_path_factory: pytest.TempPathFactory) -> TinyInternVL:
    return TinyInternVL(tmp_path_factory.mktemp("internvl"))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_tile_embeddings_match_hf(internvl: TinyInternVL) -> None:
    cm = ClipModel(internvl.mmproj_path)
    assert cm.hparams.projector_type == "internvl" and cm.n_mmproj_embd == 64
    px = RNG.uniform(-2, 2, (3, TILE, TILE)).astype(np.float32)
    got = cm.encode(px)
    assert got.shape == (4, 64) == (cm.n_output_tokens(TILE, TILE), 64)
    assert _rel(got, internvl.hf_features(px[None])) < 1e-5


def test_one_tile_image_matches_hf_processor() -> None:
    arr = RNG.integers(0, 256, (20, 29, 3), dtype=np.uint8)
    from llamapy.mtmd.clip import ClipHParams

    hp = ClipHParams("internvl", TILE, 8, 32, 64, 2, 2, 64, 1e-6, tuple(MEAN), tuple(STD), n_merge=2)
    hp.extra.update(min_tiles=1, max_tiles=6)
    (got,) = frames(Bitmap(arr), hp)
    proc = transformers.GotOcr2ImageProcessorPil(
        size={"height": TILE, "width": TILE}, crop_to_patches=False, image_mean=MEAN, image_std=STD
    )
    ref = proc(images=[Image.fromarray(arr)], return_tensors="np")["pixel_values"][0]
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_grid_choice() -> None:
    cands = grid_candidates(448, 1, 12)
    assert len(cands) == 35 and (448, 448) in cands and (12 * 448, 448) in cands
    assert select_best_resolution(1000, 500, cands) == (1344, 896)  # 3 x 2 keeps all 500k pixels, least waste
    assert select_best_resolution(500, 1000, cands) == (896, 1344)
    assert select_best_resolution(5000, 100, cands) == (12 * 448, 448)


def test_tiled_image_logits_match_hf(internvl: TinyInternVL) -> None:
    model = Model.load(internvl.text_path)
    mt = MtmdContext(internvl.mmproj_path, model)
    bmp = Bitmap(RNG.integers(0, 256, (40, 70, 3), dtype=np.uint8))
    chunks = mt.tokenize("what is <__media__> this", [bmp])
    imgs = [c for c in chunks if isinstance(c, ImageChunk)]
    assert (
        len(imgs) == 3 * 2 + 1 and imgs[-1].id == bmp.id and len({c.id for c in imgs}) == 7
    )  # 3x2 + overview
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens
    want = model.vocab.tokenize("what is <img>" + "<IMG_CONTEXT>" * 28 + "</img> this", add_special=True,
                                parse_special=True)  # fmt: skip
    assert ids == want
    ctx = Context(model, n_ctx=256, n_batch=16, n_ubatch=16, type_k="f32", type_v="f32")
    mt.eval_chunks(ctx, chunks, 0)
    with torch.no_grad():
        out = internvl.hf(
            input_ids=torch.tensor([ids]), pixel_values=torch.from_numpy(np.stack([c.pixels for c in imgs]))
        )
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-4


def test_layer_scale_mutation_is_caught(internvl: TinyInternVL, tmp_path: Path) -> None:
    t = internvl.mm_tensors()
    t["v.blk.0.ls1.weight"], t["v.blk.0.ls2.weight"] = t["v.blk.0.ls2.weight"], t["v.blk.0.ls1.weight"]
    px = RNG.uniform(-2, 2, (3, TILE, TILE)).astype(np.float32)
    got = ClipModel(internvl.write_mmproj(tmp_path / "bad.gguf", tensors=t)).encode(px)
    assert _rel(got, internvl.hf_features(px[None])) > 1e-2


def test_bad_mmproj_is_a_typed_error(internvl: TinyInternVL, tmp_path: Path) -> None:
    md = internvl.metadata()
    md["clip.vision.projector.scale_factor"] = 3
    with pytest.raises(MtmdError, match="shuffled"):
        ClipModel(internvl.write_mmproj(tmp_path / "s3.gguf", md))
    md = internvl.metadata()
    md["clip.vision.preproc_max_tiles"] = 0
    with pytest.raises(MtmdError, match="preproc_min/max_tiles"):
        ClipModel(internvl.write_mmproj(tmp_path / "t0.gguf", md))
    t = internvl.mm_tensors()
    del t["v.class_embd"]
    with pytest.raises(MtmdError, match="class_embd"):
        ClipModel(internvl.write_mmproj(tmp_path / "nocls.gguf", tensors=t))
    t = internvl.mm_tensors()
    t["v.blk.0.attn_q_norm.weight"] = np.ones(
        32, np.float32
    )  # the 6B InternViT's q norm: refused, not ignored
    with pytest.raises(MtmdError):
        ClipModel(internvl.write_mmproj(tmp_path / "qn.gguf", tensors=t))
