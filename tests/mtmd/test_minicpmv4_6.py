"""MiniCPM-V 4.6 (minicpmv4_6 projector: SigLIP at the slice's size with NaViT position buckets, the window-attention
ViT merger, a 2 x 2 downsampling MLP; llava-uhd slices with <image>/<slice> tokens) vs Hugging Face's
MiniCPMV4_6ForConditionalGeneration, with a Qwen3.5 text model (Gated DeltaNet + gated attention)."""

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
from llamapy.mtmd.minicpmv4_6 import frames
from tests.model import hf_tiny
from tests.mtmd import convert

RNG = np.random.default_rng(29)
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<image>", "</image>", "<unk_img>", "<slice>", "</slice>"]
IMG = 6
TEXT = hf_tiny.FAMILIES["qwen35"]
P, SLICE, SIDE = 4, 48, 8  # patch, slice size (clip.vision.image_size), position table side

_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2",
          "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}  # fmt: skip
_VM = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
       "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "pre_norm": "ds_ln", "linear_1": "ds_ffn_up",
       "linear_2": "ds_ffn_down"}  # fmt: skip


class TinyMiniCPMV46:
    def __init__(self, tmp: Path, seed: int = 0) -> None:
        text = dict(hf_tiny._common(**TEXT.config_kw))
        text.update(vocab_size=convert.N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1,
                    model_type="qwen3_5_text")  # fmt: skip
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                      image_size=SIDE * P, patch_size=P, layer_norm_eps=1e-6)  # fmt: skip
        cfg = transformers.MiniCPMV4_6Config(text_config=text, vision_config=vision, insert_layer_id=1,
                                             image_size=SLICE, image_token_id=IMG)  # fmt: skip
        for c in (cfg, cfg.text_config, cfg.vision_config):
            c._attn_implementation = "eager"
        torch.manual_seed(seed)
        self.hf = transformers.MiniCPMV4_6ForConditionalGeneration(cfg).to(torch.float32)
        hf_tiny._randomize(self.hf.model.language_model, TEXT, seed)
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed + 2)
            self.hf.lm_head.weight.copy_(torch.randn(self.hf.lm_head.weight.shape, generator=g) / 8)
        convert._randomize_vision(self.hf, "model.language_model.", seed)
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
        vt = "model.vision_tower."
        for name, w in self.state.items():
            w = np.asarray(w, dtype=np.float32)
            if name.startswith(vt + "encoder.layers."):
                il, rest = name[len(vt + "encoder.layers.") :].split(".", 1)
                mod, kind = rest.rsplit(".", 1)
                out[f"v.blk.{il}.{_LAYER[mod]}.{kind}"] = w
            elif name.startswith(vt + "vit_merger."):
                mod, kind = name[len(vt + "vit_merger.") :].rsplit(".", 1)
                out[f"v.vit_merger.{_VM[mod]}.{kind}"] = w
            elif name.startswith(vt + "post_layernorm."):
                out["v.post_ln." + name.rsplit(".", 1)[1]] = w
            elif name.startswith("model.merger.mlp.0."):
                mod, kind = name[len("model.merger.mlp.0.") :].rsplit(".", 1)
                out[
                    f"{ {'pre_norm': 'mm.input_norm', 'linear_1': 'mm.up', 'linear_2': 'mm.down'}[mod] }.{kind}"
                ] = w
        e = vt + "embeddings."
        out["v.patch_embd.weight"] = self.state[e + "patch_embedding.weight"]
        out["v.patch_embd.bias"] = self.state[e + "patch_embedding.bias"]
        out["v.position_embd.weight"] = self.state[e + "position_embedding.weight"]
        return out

    def metadata(self) -> dict[str, Any]:
        v = self.cfg.vision_config
        return {
            "general.name": "tiny-minicpmv4_6-mmproj", "general.file_type": 0, "clip.has_vision_encoder": True,
            "clip.projector_type": "minicpmv4_6", "clip.vision.image_size": SLICE, "clip.vision.patch_size": P,
            "clip.vision.embedding_length": v.hidden_size, "clip.vision.feed_forward_length": v.intermediate_size,
            "clip.vision.block_count": v.num_hidden_layers, "clip.vision.attention.head_count": v.num_attention_heads,
            "clip.vision.projection_dim": self.cfg.text_config.hidden_size,
            "clip.vision.attention.layer_norm_epsilon": 1e-6, "clip.vision.image_mean": [0.5] * 3,
            "clip.vision.image_std": [0.5] * 3, "clip.use_gelu": True, "clip.vision.projector.scale_factor": 4,
            "clip.vision.wa_layer_indexes": [1],
        }  # fmt: skip

    def write_mmproj(self, path: Path, md: dict | None = None, tensors: dict | None = None) -> Path:
        md = self.metadata() if md is None else md
        return convert.write_mmproj(path, md, self.mm_tensors() if tensors is None else tensors, GGMLType.F32)

    @staticmethod
    def hf_inputs(pxs: list[np.ndarray]) -> dict[str, torch.Tensor]:
        """NaViT-packed pixels: every frame's patches (row-major) side by side in one [3, p, n*p] strip."""
        strips, sizes = [], []
        for px in pxs:
            ny, nx = px.shape[1] // P, px.shape[2] // P
            strips.append(px.reshape(3, ny, P, nx, P).transpose(0, 2, 1, 3, 4).reshape(3, P, ny * nx * P))
            sizes.append([ny, nx])
        pv = np.concatenate(strips, axis=2)[None]
        return {
            "pixel_values": torch.from_numpy(np.ascontiguousarray(pv)),
            "target_sizes": torch.tensor(sizes),
        }

    def hf_features(self, pxs: list[np.ndarray]) -> np.ndarray:
        with torch.no_grad():
            out = self.hf.model.get_image_features(**self.hf_inputs(pxs))
        return torch.cat(list(out.pooler_output)).numpy()


@pytest.fixture(scope="module")
def minicpm(tmp_path_factory: pytest.TempPathFactory) -> TinyMiniCPMV46:
    return TinyMiniCPMV46(tmp_path_factory.mktemp("minicpmv4_6"))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("hw", [(48, 48), (32, 80), (96, 16)])
def test_slice_embeddings_match_hf(minicpm: TinyMiniCPMV46, hw: tuple[int, int]) -> None:
    cm = ClipModel(minicpm.mmproj_path)
    assert cm.hparams.projector_type == "minicpmv4_6" and cm.n_mmproj_embd == 64
    px = RNG.uniform(-1, 1, (3, *hw)).astype(np.float32)
    got = cm.encode(px)
    assert got.shape == (cm.n_output_tokens(hw[1], hw[0]), 64) == ((hw[0] // 16) * (hw[1] // 16), 64)
    assert _rel(got, minicpm.hf_features([px])) < 1e-5


def _hf_frames(data: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil

    proc = MiniCPMV4_6ImageProcessorPil(scale_resolution=SLICE, patch_size=P, image_mean=[0.5] * 3,
                                        image_std=[0.5] * 3)  # fmt: skip
    out = proc(images=[data], return_tensors="np")
    pv, sizes = out["pixel_values"][0], out["target_sizes"]
    res, col = [], 0
    for ny, nx in sizes:
        strip = pv[:, :, col : col + ny * nx * P]
        col += ny * nx * P
        res.append(strip.reshape(3, P, ny, nx, P).transpose(0, 2, 1, 3, 4).reshape(3, ny * P, nx * P))
    return res, list(out["grids"][0])


@pytest.mark.parametrize("hw", [(30, 41), (70, 130), (37, 200), (150, 61)])
def test_preprocessing_matches_hf(hw: tuple[int, int]) -> None:
    from llamapy.mtmd.clip import ClipHParams

    hp = ClipHParams("minicpmv4_6", SLICE, P, 32, 64, 3, 2, 64, 1e-6, (0.5,) * 3, (0.5,) * 3, n_merge=4)
    data = RNG.integers(0, 256, (*hw, 3), dtype=np.uint8)
    got, rows, cols = frames(Bitmap(data), hp)
    want, grid = _hf_frames(data)
    assert [rows, cols] == grid and [g.shape for g in got] == [x.shape for x in want]
    assert max(float(np.abs(g - x).max()) for g, x in zip(got, want, strict=True)) < 1e-6


def test_logits_with_a_sliced_image_match_hf(minicpm: TinyMiniCPMV46) -> None:
    model = Model.load(minicpm.text_path)
    mt = MtmdContext(minicpm.mmproj_path, model)
    bmp = Bitmap(RNG.integers(0, 256, (70, 130, 3), dtype=np.uint8))
    chunks = mt.tokenize("what is <__media__> this", [bmp])
    imgs = [c for c in chunks if isinstance(c, ImageChunk)]
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens
    _, (rows, cols) = _hf_frames(bmp.data)
    assert len(imgs) == 1 + rows * cols and rows * cols > 1
    n = [c.n_tokens for c in imgs]
    sl = [
        "".join(f"<slice>{'<unk_img>' * n[1 + r * cols + c]}</slice>" for c in range(cols))
        for r in range(rows)
    ]
    want = (
        f"what is <image>{'<unk_img>' * n[0]}</image>" + "\n".join(sl) + " this"
    )  # HF's processor, no image id
    assert ids == model.vocab.tokenize(want, add_special=True, parse_special=True)
    ctx = Context(model, n_ctx=256, n_batch=32, n_ubatch=32, type_k="f32", type_v="f32")
    mt.eval_chunks(ctx, chunks, 0)
    with torch.no_grad():
        out = minicpm.hf(input_ids=torch.tensor([ids]), **minicpm.hf_inputs([c.pixels for c in imgs]))
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-4


def test_window_mutation_and_bad_mmproj(minicpm: TinyMiniCPMV46, tmp_path: Path) -> None:
    t = minicpm.mm_tensors()
    w = t["v.vit_merger.ds_ffn_up.weight"].reshape(
        256, 2, 2, 32
    )  # the window's (row, col) order: rows <-> cols
    t["v.vit_merger.ds_ffn_up.weight"] = np.ascontiguousarray(w.transpose(0, 2, 1, 3)).reshape(256, 128)
    px = RNG.uniform(-1, 1, (3, 32, 48)).astype(np.float32)
    bad = ClipModel(minicpm.write_mmproj(tmp_path / "bad.gguf", tensors=t)).encode(px)
    assert _rel(bad, minicpm.hf_features([px])) > 1e-2
    md = minicpm.metadata()
    del md["clip.vision.wa_layer_indexes"]
    with pytest.raises(MtmdError, match="wa_layer_indexes"):
        ClipModel(minicpm.write_mmproj(tmp_path / "nowa.gguf", md))
    with pytest.raises(MtmdError, match="multiple of 16"):
        ClipModel(minicpm.mmproj_path).encode(np.zeros((3, 32, 40), np.float32))


def test_4x_mode_embeddings_match_hf(minicpm: TinyMiniCPMV46, tmp_path: Path) -> None:
    """scale_factor 2 (HF's downsample_mode "4x"): no ViT merger, 4x the tokens; the merger's tensors stay unused."""
    md = minicpm.metadata()
    md["clip.vision.projector.scale_factor"] = 2
    cm = ClipModel(minicpm.write_mmproj(tmp_path / "4x.gguf", md))
    px = RNG.uniform(-1, 1, (3, 24, 40)).astype(np.float32)
    got = cm.encode(px)
    with torch.no_grad():
        out = minicpm.hf.model.get_image_features(**minicpm.hf_inputs([px]), downsample_mode="4x")
    want = torch.cat(list(out.pooler_output)).numpy()
    assert got.shape == want.shape == (15, 64) and _rel(got, want) < 1e-5
