"""Llama 4 vision (llama4 projector: unfold patches, class token last, 2-D rope ViT, pixel shuffle, MLP adapter,
projection; HF's tiles with <|tile_x/y_separator|> and <|image|> + overview) vs Hugging Face's
Llama4ForConditionalGeneration and its image processor (tests/mtmd/hf_image_oracle.py), with a Llama 4 text
model (MoE, chunked attention, NoPE layer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from transformers.models.llama4 import modeling_llama4 as ml4

from llamapy.context import Context
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, MtmdError, TextChunk
from llamapy.mtmd.clip import ClipHParams
from llamapy.mtmd.llama4 import frames
from llamapy.mtmd.llama4 import pieces as llama4_pieces
from tests.model import hf_tiny
from tests.mtmd import convert
from tests.mtmd.hf_image_oracle import llama4_preprocess, llama4_prompt

RNG = np.random.default_rng(17)
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|image_start|>", "<|image_end|>", "<|patch|>", "<|image|>",
            "<|tile_x_separator|>", "<|tile_y_separator|>"]  # fmt: skip
IMG = 6  # <|patch|>: HF's image_token_index
TEXT = hf_tiny.FAMILIES["llama4"]
TILE, P = 32, 4

_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_out", "input_layernorm": "ln1", "post_attention_layernorm": "ln2",
          "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}  # fmt: skip


class TinyLlama4:
    def __init__(self, tmp: Path, seed: int = 0) -> None:
        text = dict(hf_tiny._common(**TEXT.config_kw))
        text.update(vocab_size=convert.N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1)
        vision = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      image_size=TILE, patch_size=P, vision_output_dim=48, projector_input_dim=48,
                      projector_output_dim=48, pixel_shuffle_ratio=0.5, norm_eps=1e-5,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})  # fmt: skip
        cfg = transformers.Llama4Config(vision_config=vision, text_config=text, image_token_index=IMG)
        for c in (cfg, cfg.text_config, cfg.vision_config):
            c._attn_implementation = "eager"
        torch.manual_seed(seed)
        self.hf = transformers.Llama4ForConditionalGeneration(
            cfg
        )  # F32; .to() would drop the complex freqs_ci
        hf_tiny._randomize(self.hf.language_model, TEXT, seed)
        convert._randomize_vision(self.hf, "language_model.", seed)
        # llama.cpp runs the ViT's and the adapter's GELU as ggml's (tanh); HF's are erf: made the same here
        for mod in self.hf.vision_model.modules():
            if isinstance(mod, (ml4.Llama4VisionMLP, ml4.Llama4VisionMLP2)):
                mod.activation_fn = torch.nn.GELU(approximate="tanh")
        self.hf.eval()
        self.cfg = cfg
        self.state = hf_tiny.hf_state_dict(self.hf)
        pre = "language_model."
        sd = {k[len(pre) :]: v for k, v in self.state.items() if k.startswith(pre)}
        md = hf_tiny.metadata(TEXT, cfg.text_config, GGMLType.F32)
        md.update(convert.tiny_vocab(SPECIALS))
        tensors = hf_tiny.convert(TEXT, cfg.text_config, sd)
        self.text_path = hf_tiny.write_gguf(tmp / "text.gguf", TEXT.arch, md, tensors, GGMLType.F32)
        self.mmproj_path = self.write_mmproj(tmp / "mmproj.gguf")

    def mm_tensors(self) -> dict[str, np.ndarray]:
        """As convert_hf_to_gguf.py's Llama4VisionModel names them."""
        out: dict[str, np.ndarray] = {}
        vm = "vision_model."
        for name, w in self.state.items():
            w = np.asarray(w, dtype=np.float32)
            if name.startswith(vm + "model.layers."):
                il, rest = name[len(vm + "model.layers.") :].split(".", 1)
                mod, kind = rest.rsplit(".", 1)
                out[f"v.blk.{il}.{_LAYER[mod]}.{kind}"] = w
            elif name.startswith(vm + "layernorm_"):
                which, kind = name[len(vm + "layernorm_") :].split(".")
                out[f"v.{which}_ln.{kind}"] = w
            elif name.startswith(vm + "vision_adapter.mlp.fc"):
                i = name[len(vm + "vision_adapter.mlp.fc") :].split(".")[0]
                out[f"mm.model.mlp.{i}.weight"] = w
        out["v.patch_embd.weight"] = self.state[vm + "patch_embedding.linear.weight"]
        out["v.class_embd"] = self.state[vm + "class_embedding"]
        out["v.position_embd.weight"] = self.state[vm + "positional_embedding_vlm"]
        out["mm.model.fc.weight"] = self.state["multi_modal_projector.linear_1.weight"]
        return out

    def metadata(self) -> dict[str, Any]:
        v = self.cfg.vision_config
        return {
            "general.name": "tiny-llama4-mmproj", "general.file_type": 0, "clip.has_vision_encoder": True,
            "clip.projector_type": "llama4", "clip.vision.image_size": TILE, "clip.vision.patch_size": P,
            "clip.vision.embedding_length": v.hidden_size, "clip.vision.feed_forward_length": v.intermediate_size,
            "clip.vision.block_count": v.num_hidden_layers, "clip.vision.attention.head_count": v.num_attention_heads,
            "clip.vision.projection_dim": self.cfg.text_config.hidden_size,
            "clip.vision.attention.layer_norm_epsilon": float(v.norm_eps), "clip.vision.image_mean": [0.5] * 3,
            "clip.vision.image_std": [0.5] * 3, "clip.use_gelu": True, "clip.vision.projector.scale_factor": 2,
        }  # fmt: skip

    def write_mmproj(self, path: Path, md: dict | None = None, tensors: dict | None = None) -> Path:
        md = self.metadata() if md is None else md
        return convert.write_mmproj(path, md, self.mm_tensors() if tensors is None else tensors, GGMLType.F32)

    def hf_features(self, pxs: list[np.ndarray]) -> np.ndarray:
        with torch.no_grad():
            v = self.hf.vision_model(torch.from_numpy(np.stack(pxs))).last_hidden_state
            out = self.hf.multi_modal_projector(v.reshape(-1, v.shape[-1]))
        return out.numpy()


@pytest.fixture(scope="module")
def llama4(tmp_path_factory: pytest.TempPathFactory) -> TinyLlama4:
    return TinyLlama4(tmp_path_factory.mktemp("llama4"))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_tile_embeddings_match_hf(llama4: TinyLlama4) -> None:
    cm = ClipModel(llama4.mmproj_path)
    assert cm.hparams.projector_type == "llama4" and cm.n_mmproj_embd == 64
    px = RNG.uniform(-1, 1, (3, TILE, TILE)).astype(np.float32)
    got = cm.encode(px)
    assert got.shape == (cm.n_output_tokens(TILE, TILE), 64) == (16, 64)
    assert _rel(got, llama4.hf_features([px])) < 1e-5


def _hp() -> ClipHParams:
    return ClipHParams("llama4", TILE, P, 32, 128, 2, 2, 64, 1e-5, (0.5,) * 3, (0.5,) * 3, n_merge=2)


@pytest.mark.parametrize(
    "hw",
    [(20, 31), (40, 90), (33, 200), (50, 60), (32, 64), (7, 300), (500, 13), (1, 1), (100, 100), (37, 129)],
)
def test_preprocessing_on_odd_sizes_is_hf(hw: tuple[int, int]) -> None:
    """Llama4ImageProcessor (tests/mtmd/hf_image_oracle.py, max_patches 16): the same tile grid, frames and prompt;
    pixels equal where nothing is resized, else within Pillow's vs torchvision's resampling (a level of 255,
    through bfloat16: 1.5 bf16 steps at most)."""
    data = RNG.integers(0, 256, (*hw, 3), dtype=np.uint8)
    fr, rows, cols = frames(Bitmap(data), _hp())
    want, ratio = llama4_preprocess(data, tile=TILE)
    assert (rows, cols) == ratio and np.stack(fr).shape == want.shape
    d = np.abs(np.stack(fr) - want)
    assert d.max() <= 0.0118 and d.mean() < 2e-4
    if hw == (32, 64):  # the tiles are the image itself (only the overview is resized)
        assert d[:2].max() == 0.0
    pieces_ = llama4_pieces(Bitmap(data), _hp())
    text = "".join(x if isinstance(x, str) else "<|patch|>" * 16 for x in pieces_)
    assert f"<|image_start|>{text}<|image_end|>" == llama4_prompt(ratio, 16)


def test_llamacpp_rules_are_caught() -> None:
    """llama.cpp's llava-uhd grid (up to 3 x 3 tiles, the image fitted and centred, a small image stretched to one
    tile) and its float32 normalization are not HF's processor's."""
    data = RNG.integers(0, 256, (33, 200, 3), dtype=np.uint8)
    fr, rows, cols = frames(Bitmap(data), _hp())
    assert (rows, cols) == (2, 7) and len(fr) == 15  # llama.cpp: 1 x 3 and the overview
    assert not np.allclose(fr[0][:, 0], -1.0)  # the top row is the image (llama.cpp's is centred padding)
    small = RNG.integers(0, 256, (20, 32, 3), dtype=np.uint8)  # fits one tile at scale 1: not resized
    (one,), rows, cols = frames(Bitmap(small), _hp())
    assert (rows, cols) == (1, 1) and np.all(one[:, 20:] == -1.0)  # padded at the bottom, not stretched
    f32 = (small.astype(np.float32).transpose(2, 0, 1) / 255 - 0.5) / 0.5
    d = np.abs(one[:, :20] - f32)
    assert 1e-3 < d.max() < 0.008  # bfloat16 values, as HF's (llama.cpp: float32)


def test_logits_with_a_tiled_image_match_hf(llama4: TinyLlama4) -> None:
    model = Model.load(llama4.text_path)
    mt = MtmdContext(llama4.mmproj_path, model)
    bmp = Bitmap(RNG.integers(0, 256, (50, 60, 3), dtype=np.uint8))
    chunks = mt.tokenize("what is <__media__> this", [bmp])
    imgs = [c for c in chunks if isinstance(c, ImageChunk)]
    assert len(imgs) == 5 and imgs[-1].id == bmp.id  # 2x2 tiles, then the overview
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens
    p16 = "<|patch|>" * 16
    tiles = f"{p16}<|tile_x_separator|>{p16}<|tile_y_separator|>" * 2
    want = f"what is <|image_start|>{tiles}<|image|>{p16}<|image_end|> this"  # HF Llama4Processor's layout
    assert ids == model.vocab.tokenize(want, add_special=True, parse_special=True)
    got = np.concatenate([mt.encode(c) for c in imgs])
    assert _rel(got, llama4.hf_features([c.pixels for c in imgs])) < 1e-5
    ctx = Context(model, n_ctx=256, n_batch=32, n_ubatch=32, type_k="f32", type_v="f32")
    mt.eval_chunks(ctx, chunks, 0)
    # HF's Llama4ForConditionalGeneration.forward fails on its own text output in this transformers (no
    # image_outputs); its image merge (masked_scatter of the projected features) done here, then its text model
    ids_t = torch.tensor([ids])
    with torch.no_grad():
        emb = llama4.hf.language_model.model.embed_tokens(ids_t)
        feats = torch.from_numpy(llama4.hf_features([c.pixels for c in imgs]))
        emb = emb.masked_scatter((ids_t == IMG).unsqueeze(-1), feats)
        out = llama4.hf.language_model(inputs_embeds=emb)
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-4


def test_shuffle_mutation_and_bad_mmproj(llama4: TinyLlama4, tmp_path: Path) -> None:
    t = llama4.mm_tensors()
    w = t["mm.model.mlp.1.weight"].reshape(
        48, 2, 2, 32
    )  # the shuffled (row, col, channel) order: rows <-> cols
    t["mm.model.mlp.1.weight"] = np.ascontiguousarray(w.transpose(0, 2, 1, 3)).reshape(48, 128)
    px = RNG.uniform(-1, 1, (3, TILE, TILE)).astype(np.float32)
    bad = ClipModel(llama4.write_mmproj(tmp_path / "bad.gguf", tensors=t)).encode(px)
    assert _rel(bad, llama4.hf_features([px])) > 1e-2
    md = llama4.metadata()
    del md["clip.vision.projector.scale_factor"]
    with pytest.raises(MtmdError, match="scale_factor"):
        ClipModel(llama4.write_mmproj(tmp_path / "nosf.gguf", md))
    with pytest.raises(MtmdError, match="32x32"):
        ClipModel(llama4.mmproj_path).encode(np.zeros((3, 64, 32), np.float32))
