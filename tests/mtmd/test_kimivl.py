"""Kimi-VL vision (kimivl projector: MoonViT with interleaved 2-D rope, pixel unshuffle 2 x 2, LayerNorm + MLP)
vs Moonshot AI's own modeling code (tests/mtmd/kimivl_oracle.py: transformers 5.24 has no Kimi-VL class), on a
tiny random tower written as llama.cpp's converter writes Kimi-VL (q / k as the checkpoint has them)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from llamapy.context import Context
from llamapy.ggml import ops
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, MtmdError, TextChunk
from llamapy.mtmd import kimik25 as kimik25_mod
from llamapy.mtmd import kimivl as kimivl_mod
from llamapy.mtmd.kimivl import preprocess
from tests.model import hf_tiny
from tests.mtmd import convert
from tests.mtmd.kimivl_oracle import KimiVLImageProcessor, KimiVLMultiModalProjector, MoonVit

RNG = np.random.default_rng(37)
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|media_start|>", "<|media_end|>", "<|media_pad|>"]
IMG = 6
TEXT = hf_tiny.FAMILIES["deepseek2"]  # Kimi-VL's language model is DeepSeek-V3's (MLA, MoE)
P, S, E, NH, K = 4, 6, 32, 2, 2  # patch, position table side, width, heads, merge
N_TEXT = 64
_BLOCK = {"norm0": "ln1", "norm1": "ln2", "wo": "attn_out", "mlp.fc0": "ffn_up", "mlp.fc1": "ffn_down"}


class TinyKimiVL:
    def __init__(self, tmp: Path, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.vit = MoonVit(hidden_size=E, num_hidden_layers=2, num_attention_heads=NH, intermediate_size=64,
                           patch_size=P, init_pos_emb_height=S, init_pos_emb_width=S)  # fmt: skip
        self.proj = KimiVLMultiModalProjector(E, (K, K), N_TEXT)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():  # every weight random, biases and norms included
            for name, p in [*self.vit.named_parameters(), *self.proj.named_parameters()]:
                if p.ndim == 1:
                    p.copy_((0.0 if name.endswith("bias") else 1.0) + torch.randn(p.shape, generator=g) * 0.2)
                elif "pos_emb" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(int(np.prod(p.shape[1:]))))
        self.vit.eval()
        self.proj.eval()
        self.mmproj_path = self.write_mmproj(tmp / "mmproj.gguf")

    def mm_tensors(self) -> dict[str, np.ndarray]:
        """As llama.cpp's converter (conversion/kimivl.py) writes them: wqkv split in three, q / k rows kept in
        the checkpoint's order, the position table flattened to [S*S, E]."""
        sd = {k: v.detach().numpy().astype(np.float32) for k, v in self.vit.state_dict().items()}
        out = {"v.patch_embd.weight": sd["patch_embed.proj.weight"], "v.patch_embd.bias": sd["patch_embed.proj.bias"],
               "v.position_embd.weight": sd["patch_embed.pos_emb.weight"].reshape(S * S, E),
               "v.post_ln.weight": sd["encoder.final_layernorm.weight"],
               "v.post_ln.bias": sd["encoder.final_layernorm.bias"]}  # fmt: skip
        for name, w in sd.items():
            if not name.startswith("encoder.blocks."):
                continue
            il, rest = name[len("encoder.blocks.") :].split(".", 1)
            mod, kind = rest.rsplit(".", 1)
            if mod == "wqkv":
                for n, part in zip(("attn_q", "attn_k", "attn_v"), np.split(w, 3, axis=0), strict=True):
                    out[f"v.blk.{il}.{n}.{kind}"] = np.ascontiguousarray(part)
            else:
                out[f"v.blk.{il}.{_BLOCK[mod]}.{kind}"] = w
        pj = {k: v.detach().numpy().astype(np.float32) for k, v in self.proj.state_dict().items()}
        for src, dst in (("pre_norm", "mm.input_norm"), ("linear_1", "mm.1"), ("linear_2", "mm.2")):
            out[dst + ".weight"], out[dst + ".bias"] = pj[src + ".weight"], pj[src + ".bias"]
        return out

    @staticmethod
    def metadata() -> dict[str, Any]:
        return {
            "general.name": "tiny-kimivl-mmproj", "general.file_type": 0, "clip.has_vision_encoder": True,
            "clip.projector_type": "kimivl", "clip.vision.image_size": S * P, "clip.vision.patch_size": P,
            "clip.vision.embedding_length": E, "clip.vision.feed_forward_length": 64, "clip.vision.block_count": 2,
            "clip.vision.attention.head_count": NH, "clip.vision.projection_dim": N_TEXT,
            "clip.vision.attention.layer_norm_epsilon": 1e-5, "clip.vision.image_mean": [0.5] * 3,
            "clip.vision.image_std": [0.5] * 3, "clip.use_gelu": True, "clip.vision.projector.scale_factor": K,
        }  # fmt: skip

    def write_mmproj(self, path: Path, md: dict | None = None, tensors: dict | None = None) -> Path:
        md = self.metadata() if md is None else md
        return convert.write_mmproj(path, md, self.mm_tensors() if tensors is None else tensors, GGMLType.F32)

    def features(self, px: np.ndarray) -> np.ndarray:
        """The oracle on ``F32[3, H, W]`` (normalized pixels): patches row-major, each ``(channel, y, x)``."""
        ny, nx = px.shape[1] // P, px.shape[2] // P
        pv = px.reshape(3, ny, P, nx, P).transpose(1, 3, 0, 2, 4).reshape(ny * nx, 3, P, P)
        with torch.no_grad():
            return self.proj(
                self.vit(torch.from_numpy(np.ascontiguousarray(pv)), torch.tensor([[ny, nx]]))
            ).numpy()


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> TinyKimiVL:
    return TinyKimiVL(tmp_path_factory.mktemp("kimivl"))


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    kw = dict(hf_tiny._common(**TEXT.config_kw))
    kw.update(vocab_size=convert.N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1, hidden_size=N_TEXT)
    cfg = transformers.DeepseekV3Config(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = TEXT.hf_model(cfg).to(torch.float32)
    hf_tiny._randomize(hf, TEXT, 0)
    hf.eval()
    md = hf_tiny.metadata(TEXT, cfg, GGMLType.F32)
    md.update(convert.tiny_vocab(SPECIALS))
    tensors = hf_tiny.convert(TEXT, cfg, hf_tiny.hf_state_dict(hf))
    path = hf_tiny.write_gguf(tmp_path_factory.mktemp("kimivl-text") / "text.gguf", TEXT.arch, md, tensors,
                              GGMLType.F32)  # fmt: skip
    return hf, path


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("hw", [(24, 24), (40, 16), (8, 56), (32, 48)])  # the table's size, resized up / down
def test_image_embeddings_match_the_official_code(kimi: TinyKimiVL, hw: tuple[int, int]) -> None:
    cm = ClipModel(kimi.mmproj_path)
    assert cm.hparams.projector_type == "kimivl" and cm.n_mmproj_embd == N_TEXT
    px = RNG.uniform(-1, 1, (3, *hw)).astype(np.float32)
    got = cm.encode(px)
    assert got.shape == (cm.n_output_tokens(hw[1], hw[0]), N_TEXT) == ((hw[0] // 8) * (hw[1] // 8), N_TEXT)
    assert _rel(got, kimi.features(px)) < 1e-5


def test_official_tower_is_transformers_kimi_k25_for_one_frame(kimi: TinyKimiVL) -> None:
    """The oracle cross-checked: Kimi-VL's MoonViT is transformers' Kimi_K25VisionModel for one frame (its
    temporal table adds a zero row then), once q / k rows go from the interleaved rope layout to HF's neox one
    (dim ``j`` <- ``2j``, ``j + d/2`` <- ``2j + 1``): the same network."""
    from transformers.models.kimi_k25.modeling_kimi_k25 import Kimi_K25VisionModel

    cfg = transformers.Kimi_K25VisionConfig(hidden_size=E, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=NH, patch_size=P, pos_emb_height=S, pos_emb_width=S,
                                            merge_kernel_size=[K, K],
                                            rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})  # fmt: skip
    cfg._attn_implementation = "eager"
    hf = Kimi_K25VisionModel(cfg).eval()
    sd = kimi.vit.state_dict()
    d = E // NH
    rows = (np.arange(NH)[:, None] * d + np.r_[np.arange(0, d, 2), np.arange(1, d, 2)][None]).reshape(-1)
    new = {"patch_embed.proj.weight": sd["patch_embed.proj.weight"], "patch_embed.proj.bias": sd["patch_embed.proj.bias"],
           "patch_embed.pos_emb.position_embeddings": sd["patch_embed.pos_emb.weight"],
           "final_layernorm.weight": sd["encoder.final_layernorm.weight"],
           "final_layernorm.bias": sd["encoder.final_layernorm.bias"]}  # fmt: skip
    for il in range(2):
        b, n = f"encoder.blocks.{il}.", f"layers.{il}."
        for kind in ("weight", "bias"):
            q, k, v = sd[b + "wqkv." + kind].chunk(3)
            new[n + "attn.q_proj." + kind], new[n + "attn.k_proj." + kind] = q[rows], k[rows]
            new[n + "attn.v_proj." + kind] = v
            for src, dst in (("norm0", "norm1"), ("norm1", "norm2"), ("wo", "attn.proj"), ("mlp.fc0", "mlp.fc1"),
                             ("mlp.fc1", "mlp.fc2")):  # fmt: skip
                new[n + dst + "." + kind] = sd[b + src + "." + kind]
    hf.load_state_dict(new, strict=True)
    px = RNG.uniform(-1, 1, (3, 32, 48)).astype(np.float32)
    ny, nx = 32 // P, 48 // P
    pv = torch.from_numpy(np.ascontiguousarray(px.reshape(3, ny, P, nx, P).transpose(1, 3, 0, 2, 4)))
    pv = pv.reshape(ny * nx, 3, P, P)
    with torch.no_grad():
        got = hf(pv, torch.tensor([[1, ny, nx]])).pooler_output.numpy()
        want = kimi.vit(pv, torch.tensor([[ny, nx]]))[0].numpy()
    assert _rel(got, want) < 1e-5


def test_llamacpp_rope_layout_and_gelu_are_caught(kimi: TinyKimiVL) -> None:
    """llama.cpp's kimivl graph ropes the checkpoint's interleaved q / k as if split (llama.cpp #15600): without
    the reorder the embeddings are off; the official code is what llamapy follows."""
    px = RNG.uniform(-1, 1, (3, 32, 24)).astype(np.float32)
    want = kimi.features(px)
    assert _rel(ClipModel(kimi.mmproj_path).encode(px), want) < 1e-5
    with mock.patch.object(kimik25_mod, "_interleaved_to_split", lambda x: x):
        bad = ClipModel(kimi.mmproj_path).encode(px)  # (a new model: a built graph is kept per image size)
    assert _rel(bad, want) > 1e-2
    # llama.cpp's projector GELU (tanh) for the official erf one: 1.5e-4 off here
    with mock.patch.object(kimivl_mod, "gelu_erf", ops.gelu):
        assert _rel(ClipModel(kimi.mmproj_path).encode(px), want) > 2e-5


def test_logits_with_an_image_match_the_official_code(kimi: TinyKimiVL, text: tuple) -> None:
    """KimiVLForConditionalGeneration's way: the projector's rows in place of the ``<|media_pad|>`` embeddings of
    a DeepSeek-V3 model (here with the image wrapped in llama.cpp's ``<|media_start|>`` ... ``<|media_end|>``)."""
    hf, path = text
    model = Model.load(path)
    mt = MtmdContext(kimi.mmproj_path, model)
    bmp = Bitmap(RNG.integers(0, 256, (45, 70, 3), dtype=np.uint8))
    chunks = mt.tokenize("what is <__media__> this", [bmp])
    (img,) = [c for c in chunks if isinstance(c, ImageChunk)]
    assert img.pixels.shape[1:] == (48, 72) and img.n_tokens == 54
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens
    want = model.vocab.tokenize(f"what is <|media_start|>{'<|media_pad|>' * img.n_tokens}<|media_end|> this",
                                add_special=True, parse_special=True)  # fmt: skip
    assert ids == want
    ctx = Context(model, n_ctx=256, n_batch=32, n_ubatch=32, type_k="f32", type_v="f32")
    mt.eval_chunks(ctx, chunks, 0)
    t = torch.tensor([ids])
    with torch.no_grad():
        emb = hf.get_input_embeddings()(t)
        emb[t == IMG] = torch.from_numpy(kimi.features(img.pixels))
        out = hf(inputs_embeds=emb, use_cache=False)
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-4


@pytest.mark.parametrize("hw", [(45, 70), (13, 7), (301, 297), (1, 3), (8, 8), (1203, 37), (24, 40)])
def test_preprocessing_on_odd_sizes_is_the_official_processor(kimi: TinyKimiVL, hw: tuple[int, int]) -> None:
    """Moonshot's KimiVLImageProcessor (tests/mtmd/kimivl_oracle.py, the released config: pad to multiples of
    patch x merge, rescale above in_token_limit patches): the same pixels on odd sizes, the resize path included
    (301 x 297 px are 5550 patches of 4 px > 4096)."""
    cm = ClipModel(kimi.mmproj_path)
    data = RNG.integers(0, 256, (*hw, 3), dtype=np.uint8)
    got = preprocess(cm, Bitmap(data), True)
    want = KimiVLImageProcessor(patch_size=P, merge_kernel_size=(K, K))(Image.fromarray(data))
    assert got.shape == want.shape and got.shape[1] % (P * K) == 0 and got.shape[2] % (P * K) == 0
    assert np.abs(got - want).max() < 1e-6
    assert cm.n_output_tokens(got.shape[2], got.shape[1]) == got.shape[1] * got.shape[2] // (P * K) ** 2


def test_token_limit_from_the_file(kimi: TinyKimiVL, tmp_path: Path) -> None:
    """``clip.vision.image_max_pixels`` (in_token_limit x patch area) sets the processor's limit."""
    md = kimi.metadata()
    md["clip.vision.image_max_pixels"] = 100 * P * P
    cm = ClipModel(kimi.write_mmproj(tmp_path / "limit.gguf", md))
    data = RNG.integers(0, 256, (45, 70, 3), dtype=np.uint8)  # 11 x 17 = 187 patches > 100: rescaled
    got = preprocess(cm, Bitmap(data), True)
    want = KimiVLImageProcessor(patch_size=P, merge_kernel_size=(K, K), in_token_limit=100)(
        Image.fromarray(data)
    )
    assert got.shape == want.shape == (3, 32, 56) and np.abs(got - want).max() < 1e-6


def test_llamacpp_size_rule_is_caught(kimi: TinyKimiVL) -> None:
    """llama.cpp's rule (resize to 8..1024 tokens, centred on black) is not the official processor's."""
    from llamapy.mtmd.qwen2vl import preprocess_dynamic

    cm = ClipModel(kimi.mmproj_path)
    data = RNG.integers(0, 256, (45, 70, 3), dtype=np.uint8)
    want = KimiVLImageProcessor(patch_size=P, merge_kernel_size=(K, K))(Image.fromarray(data))
    bad = preprocess_dynamic(Bitmap(data), cm.hparams, True, 8, 1024)
    assert bad.shape != want.shape or np.abs(bad - want).max() > 0.1


def test_too_elongated_image_is_a_clear_error(kimi: TinyKimiVL) -> None:
    """The official processor raises "Exceed pos emb" at 512 patches a side (MoonViT's rope table)."""
    cm = ClipModel(kimi.mmproj_path)
    data = np.zeros((2100, 4, 3), dtype=np.uint8)  # 525 x 1 patches: under the patch limit, over 511 a side
    with pytest.raises(ValueError, match="Exceed pos emb"):
        KimiVLImageProcessor(patch_size=P, merge_kernel_size=(K, K))(Image.fromarray(data))
    with pytest.raises(MtmdError, match="too elongated"):
        preprocess(cm, Bitmap(data), True)


def test_malformed_mmproj_is_a_clear_error(kimi: TinyKimiVL, tmp_path: Path) -> None:
    t = kimi.mm_tensors()
    t["v.position_embd.weight"] = t["v.position_embd.weight"].reshape(S, S, E)  # Kimi-K2.5's layout
    with pytest.raises(MtmdError, match=r"position_embd.*expected \(side \* side, 32\)"):
        ClipModel(kimi.write_mmproj(tmp_path / "pos3d.gguf", tensors=t))
    t = kimi.mm_tensors()
    t["v.position_embd.weight"] = t["v.position_embd.weight"][:35]  # not a square
    with pytest.raises(MtmdError, match="position_embd"):
        ClipModel(kimi.write_mmproj(tmp_path / "pos35.gguf", tensors=t))
    t = kimi.mm_tensors()
    t["mm.1.weight"] = t["mm.1.weight"][:, :E]  # not the merged width
    with pytest.raises(MtmdError, match="mm.1.weight"):
        ClipModel(kimi.write_mmproj(tmp_path / "mm1.gguf", tensors=t))
    t = kimi.mm_tensors()
    del t["v.blk.1.attn_k.weight"]
    with pytest.raises(MtmdError, match="attn_k"):
        ClipModel(kimi.write_mmproj(tmp_path / "nok.gguf", tensors=t))
    with pytest.raises(MtmdError, match="multiple of 8"):
        ClipModel(kimi.mmproj_path).encode(np.zeros((3, 16, 20), np.float32))
