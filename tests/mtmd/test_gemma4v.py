"""Gemma 4 vision (gemma4v projector: ViT at the image's size with x / y position tables, 2-D neox rope, q/k/v
norms, clamped linears, 3 x 3 average pooling, standardization, RMS-normed projection) vs Hugging Face's
Gemma4ForConditionalGeneration, with a Gemma 4 text model (the MoE case: no per-layer embeddings)."""

from __future__ import annotations

import dataclasses
import types
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
from tests.model import hf_tiny
from tests.model.families import gemma4 as fam
from tests.mtmd import convert

RNG = np.random.default_rng(23)
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>",
            "<|audio|>", "<|video|>"]  # fmt: skip
BOI, EOI, IMG = 4, 5, 6
TEXT = hf_tiny.FAMILIES["gemma4-moe"]
P, K = 4, 3

_LAYER = {"self_attn.q_proj.linear": "attn_q", "self_attn.k_proj.linear": "attn_k", "self_attn.v_proj.linear": "attn_v",
          "self_attn.o_proj.linear": "attn_out", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
          "input_layernorm": "ln1", "post_attention_layernorm": "attn_post_norm",
          "pre_feedforward_layernorm": "ln2", "post_feedforward_layernorm": "ffn_post_norm",
          "mlp.gate_proj.linear": "ffn_gate", "mlp.up_proj.linear": "ffn_up", "mlp.down_proj.linear": "ffn_down",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_out", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down"}  # fmt: skip


class TinyGemma4V:
    def __init__(self, tmp: Path, seed: int = 0) -> None:
        text = dict(hf_tiny._common(**TEXT.config_kw))
        text.update(vocab_size=convert.N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1,
                    use_bidirectional_attention="vision")  # fmt: skip
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=16, patch_size=P, pooling_kernel_size=K,
                      position_embedding_size=64, use_clipped_linears=True, standardize=True, rms_norm_eps=1e-6,
                      rope_parameters={"rope_type": "axial", "rope_theta": 100.0})  # fmt: skip
        cfg = transformers.Gemma4Config(
            text_config=text, vision_config=vision, audio_config=None, boi_token_id=BOI, eoi_token_id=EOI,
            image_token_id=IMG, audio_token_id=9, boa_token_id=7, eoa_token_index=8, video_token_id=10,
        )  # fmt: skip
        for c in (cfg, cfg.text_config, cfg.vision_config):
            c._attn_implementation = "eager"
        torch.manual_seed(seed)
        self.hf = transformers.Gemma4ForConditionalGeneration(cfg).to(torch.float32)
        hf_tiny._randomize(self.hf.model.language_model, TEXT, seed)
        convert._randomize_vision(self.hf, "model.language_model.", seed)
        with torch.no_grad():
            for il, layer in enumerate(self.hf.model.language_model.layers):
                layer.layer_scalar.fill_(0.6 + 0.15 * il)
            vt = self.hf.model.vision_tower
            g = torch.Generator().manual_seed(seed + 3)
            vt.patch_embedder.position_embedding_table.copy_(torch.randn((2, 64, 32), generator=g) * 0.5)
            vt.std_bias.copy_(torch.randn(32, generator=g) * 0.5)
            vt.std_scale.copy_(1.0 + torch.randn(32, generator=g) * 0.2)
            # clamps that bite on some of the linears (the others stay infinite: no clamp)
            blk = vt.encoder.layers[0]
            blk.self_attn.q_proj.input_min.fill_(-1.0)
            blk.self_attn.q_proj.output_max.fill_(0.8)
            blk.mlp.down_proj.input_max.fill_(0.3)
            blk.mlp.down_proj.output_min.fill_(-0.5)
        self.hf.eval()
        self.cfg = cfg
        self.state = hf_tiny.hf_state_dict(self.hf)
        self.buffers = {k: v.detach().numpy().copy() for k, v in self.hf.named_buffers()}
        pre = "model.language_model."
        sd = {"model." + k[len(pre) :]: v for k, v in self.state.items() if k.startswith(pre)}
        sd = {k: v for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")}
        tensors = fam.convert(TEXT, cfg.text_config, sd)
        md = fam.metadata(TEXT, cfg.text_config, GGMLType.F32)
        md.update(convert.tiny_vocab(SPECIALS))
        self.text_path = hf_tiny.write_gguf(tmp / "text.gguf", TEXT.arch, md, tensors, GGMLType.F32)
        self.mmproj_path = self.write_mmproj(tmp / "mmproj.gguf")

    def mm_tensors(self) -> dict[str, np.ndarray]:
        """As convert_hf_to_gguf.py's Gemma4VisionAudioModel names and lays them out."""
        out: dict[str, np.ndarray] = {}
        enc = "model.vision_tower.encoder.layers."
        src = {**self.state, **self.buffers}
        for name, w in src.items():
            w = np.asarray(w, dtype=np.float32)
            if name.startswith(enc):
                il, rest = name[len(enc) :].split(".", 1)
                mod, kind = rest.rsplit(".", 1)
                if kind in ("input_min", "input_max", "output_min", "output_max"):
                    if np.isfinite(w).all():  # the converter writes them all; infinite ones clamp nothing
                        out[f"v.blk.{il}.{_LAYER[mod]}.{kind}"] = w.reshape(1)
                elif kind == "weight":
                    out[f"v.blk.{il}.{_LAYER[mod]}.weight"] = w
        w = self.state["model.vision_tower.patch_embedder.input_proj.weight"]
        out["v.patch_embd.weight"] = np.ascontiguousarray(w.reshape(-1, P, P, 3).transpose(0, 3, 1, 2))
        out["v.position_embd.weight"] = self.state[
            "model.vision_tower.patch_embedder.position_embedding_table"
        ]
        out["v.std_bias"] = self.buffers["model.vision_tower.std_bias"]
        out["v.std_scale"] = self.buffers["model.vision_tower.std_scale"]
        out["mm.input_projection.weight"] = self.state["model.embed_vision.embedding_projection.weight"]
        return out

    def metadata(self) -> dict[str, Any]:
        v = self.cfg.vision_config
        return {
            "general.name": "tiny-gemma4v-mmproj", "general.file_type": 0, "clip.has_vision_encoder": True,
            "clip.projector_type": "gemma4v", "clip.vision.image_size": 224, "clip.vision.patch_size": P,
            "clip.vision.embedding_length": v.hidden_size, "clip.vision.feed_forward_length": v.intermediate_size,
            "clip.vision.block_count": v.num_hidden_layers, "clip.vision.attention.head_count": v.num_attention_heads,
            "clip.vision.projection_dim": self.cfg.text_config.hidden_size,
            "clip.vision.attention.layer_norm_epsilon": 1e-6, "clip.vision.image_mean": [0.0] * 3,
            "clip.vision.image_std": [1.0] * 3, "clip.use_gelu": True,
        }  # fmt: skip

    def write_mmproj(self, path: Path, md: dict | None = None, tensors: dict | None = None) -> Path:
        md = self.metadata() if md is None else md
        t = self.mm_tensors() if tensors is None else tensors
        # convert.write_mmproj stores mm.input_projection in F16 (gemma3's converter does); Gemma 4's keeps F32
        with mock.patch.object(convert, "mmproj_type", lambda name, arr, ftype: GGMLType.F32):
            return convert.write_mmproj(path, md, t, GGMLType.F32)

    @staticmethod
    def hf_inputs(px: np.ndarray) -> dict[str, torch.Tensor]:
        """HF's patchified pixels (each patch (row, col, channel), in 0..1) and (x, y) positions."""
        ny, nx = px.shape[1] // P, px.shape[2] // P
        pv = px.reshape(3, ny, P, nx, P).transpose(1, 3, 2, 4, 0).reshape(1, ny * nx, 3 * P * P)
        rows, cols = np.divmod(np.arange(ny * nx), nx)
        pos = np.stack([cols, rows], axis=-1)[None]
        return {"pixel_values": torch.from_numpy(np.ascontiguousarray(pv)),
                "image_position_ids": torch.from_numpy(pos).long()}  # fmt: skip

    def hf_features(self, px: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = self.hf.model.get_image_features(**self.hf_inputs(px))
        return torch.cat(list(out.pooler_output)).numpy()


@pytest.fixture(scope="module")
def gemma4v(tmp_path_factory: pytest.TempPathFactory) -> TinyGemma4V:
    return TinyGemma4V(tmp_path_factory.mktemp("gemma4v"))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("hw", [(36, 48), (60, 24)])
def test_image_embeddings_match_hf(gemma4v: TinyGemma4V, hw: tuple[int, int]) -> None:
    cm = ClipModel(gemma4v.mmproj_path)
    assert cm.hparams.projector_type == "gemma4v" and cm.n_mmproj_embd == 64
    assert len(cm.hparams.extra["clamp"]) == 2  # the bounds that bite were read
    px = RNG.uniform(0, 1, (3, *hw)).astype(np.float32)
    got = cm.encode(px)
    assert got.shape == (cm.n_output_tokens(hw[1], hw[0]), 64) == ((hw[0] // 12) * (hw[1] // 12), 64)
    assert _rel(got, gemma4v.hf_features(px)) < 1e-5


def test_logits_with_an_image_match_hf(gemma4v: TinyGemma4V) -> None:
    model = Model.load(gemma4v.text_path)
    mt = MtmdContext(gemma4v.mmproj_path, model)
    bmp = Bitmap(RNG.integers(0, 256, (70, 100, 3), dtype=np.uint8))
    chunks = mt.tokenize("what is <__media__> this", [bmp])
    (img,) = [c for c in chunks if isinstance(c, ImageChunk)]
    h, w = img.pixels.shape[1:]
    assert (
        h % 12 == 0 and w % 12 == 0 and 70 <= img.n_tokens <= 1120 and img.n_tokens == (h // 12) * (w // 12)
    )
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens
    want = model.vocab.tokenize(f"what is <|image>{'<|image|>' * img.n_tokens}<image|> this",
                                add_special=True, parse_special=True)  # fmt: skip
    assert ids == want
    assert mt.decode_use_non_causal  # a text model not 1536 / 2560 wide (E2B / E4B): llama.cpp's rule
    # the whole image in one ubatch (non-causal)
    ctx = Context(model, n_ctx=256, n_batch=img.n_tokens, n_ubatch=img.n_tokens, type_k="f32", type_v="f32")
    mt.eval_chunks(ctx, chunks, 0)
    mm = torch.tensor([[int(i == IMG) for i in ids]])  # HF's mm_token_type_ids: 1 on the image's soft tokens
    with torch.no_grad():
        out = gemma4v.hf(input_ids=torch.tensor([ids]), mm_token_type_ids=mm, **gemma4v.hf_inputs(img.pixels))
        causal = gemma4v.hf(input_ids=torch.tensor([ids]), **gemma4v.hf_inputs(img.pixels))
    want = out.logits[0, -1].numpy()
    assert _rel(causal.logits[0, -1].numpy(), want) > 1e-2  # the image's bidirectional attention matters here
    assert _rel(ctx.get_logits()[-1], want) < 1e-4
    # the old behaviour (the image decoded causally) is HF's causal run, not its bidirectional one
    ctx = Context(model, n_ctx=256, n_batch=img.n_tokens, n_ubatch=img.n_tokens, type_k="f32", type_v="f32")
    mt.eval_chunks(ctx, [dataclasses.replace(c, non_causal=False) if c is img else c for c in chunks], 0)
    assert _rel(ctx.get_logits()[-1], want) > 1e-2
    assert _rel(ctx.get_logits()[-1], causal.logits[0, -1].numpy()) < 1e-4
    # Gemma 4's rule (llama_non_causal_type SWA_ONLY, HF's create_masks_for_vision_model): only the
    # sliding-window cache turns non-causal; the full-attention one stays causal. (This tiny model cannot show
    # it in its logits: its one full layer before the KV-shared ones feeds only the image's own later states.)
    inp = types.SimpleNamespace(n_tokens=4, kv={})
    kinds = {c.n_swa > 0: c.build_input(4, 0, False).causal for c in ctx.memory.caches}
    got = {ki.cache.n_swa > 0: ki.causal for ki in ctx.memory.build_inputs(inp, False)}
    assert got == {True: False, False: True} and kinds == {True: False, False: False}
    # an image larger than a ubatch: a clear error (llama.cpp asserts n_ubatch >= n_tokens and aborts)
    ctx = Context(model, n_ctx=256, n_batch=32, n_ubatch=32, type_k="f32", type_v="f32")
    with pytest.raises(MtmdError, match=f"image of {img.n_tokens} tokens needs non-causal attention"):
        mt.eval_chunks(ctx, chunks, 0)


def test_rope_axis_mutation_and_bad_mmproj(gemma4v: TinyGemma4V, tmp_path: Path) -> None:
    t = gemma4v.mm_tensors()
    t["v.position_embd.weight"] = np.ascontiguousarray(
        t["v.position_embd.weight"][::-1]
    )  # x and y tables swapped
    px = RNG.uniform(0, 1, (3, 36, 48)).astype(np.float32)
    bad = ClipModel(gemma4v.write_mmproj(tmp_path / "bad.gguf", tensors=t)).encode(px)
    assert _rel(bad, gemma4v.hf_features(px)) > 1e-2
    t = gemma4v.mm_tensors()
    del t["v.blk.0.attn_q.output_max"]  # a clamp dropped: the outputs differ
    assert _rel(ClipModel(gemma4v.write_mmproj(tmp_path / "noclamp.gguf", tensors=t)).encode(px),
                gemma4v.hf_features(px)) > 1e-4  # fmt: skip
    with pytest.raises(MtmdError, match="multiple of 12"):
        ClipModel(gemma4v.mmproj_path).encode(np.zeros((3, 36, 40), np.float32))
    t = gemma4v.mm_tensors()  # an E2B-wide projection (1536): llama.cpp decodes its images causally
    t["mm.input_projection.weight"] = np.zeros((1536, 32), np.float32)
    assert (
        ClipModel(gemma4v.write_mmproj(tmp_path / "e2b.gguf", tensors=t)).hparams.extra["non_causal"] is False
    )
    assert ClipModel(gemma4v.mmproj_path).hparams.extra["non_causal"] is True
    t = gemma4v.mm_tensors()
    t["v.position_embd.weight"] = t["v.position_embd.weight"][0]
    with pytest.raises(MtmdError, match="position_embd"):
        ClipModel(gemma4v.write_mmproj(tmp_path / "pos2d.gguf", tensors=t))


@pytest.mark.parametrize("hw", [(413, 500), (700, 251)])
def test_preprocessing_matches_hf_for_big_images(gemma4v: TinyGemma4V, hw: tuple[int, int]) -> None:
    """Above 1120 tokens llama.cpp's rule (smart_resize's shrink) and HF's (max_soft_tokens = 1120) pick the same
    size; stretched (no padding) the pixels are HF's. (Below it they differ: HF scales every image to its token
    budget, llama.cpp keeps the image's size within 70..1120 tokens, and pads to keep the aspect ratio.)"""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    from llamapy.mtmd.gemma4v import preprocess

    cm = ClipModel(gemma4v.mmproj_path)
    data = RNG.integers(0, 256, (*hw, 3), dtype=np.uint8)
    got = preprocess(cm, Bitmap(data), False)
    proc = Gemma4ImageProcessorPil(patch_size=P, max_soft_tokens=1120, pooling_kernel_size=K)
    out = proc(images=[data], return_tensors="np")
    pos = out["image_position_ids"][0]
    n = int((pos[:, 0] >= 0).sum())
    ny, nx = int(pos[:n, 1].max()) + 1, int(pos[:n, 0].max()) + 1
    assert got.shape == (3, ny * P, nx * P) and ny * nx // 9 <= 1120
    want = (
        out["pixel_values"][0, :n]
        .reshape(ny, nx, P, P, 3)
        .transpose(4, 0, 2, 1, 3)
        .reshape(3, ny * P, nx * P)
    )
    assert np.abs(got - want).max() < 1e-6
