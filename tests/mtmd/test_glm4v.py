"""GLM-4.1V vision (projector type glm4v) and its text model (glm4 with M-RoPE): a tiny random-weight
Glm4vForConditionalGeneration converted here as llama.cpp's convert_hf_to_gguf.py does (Glm4Model with
``mrope_section``: q/k rows of each head's rotary part permuted to neox order, ``rope.dimension_sections``;
Glm4VVisionModel: the mmproj); image embeddings, next-token logits with an image, and preprocessing vs HF."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image, ImageDraw
from transformers.models.glm4v import image_processing_pil_glm4v as hf_proc

from llamapy.context import Context
from llamapy.ggml.types import GGMLType
from llamapy.model.model import Model
from llamapy.mtmd import Bitmap, ClipModel, ImageChunk, MtmdContext, MtmdError, TextChunk, glm4v, load_image
from llamapy.mtmd.qwen2vl import preprocess_dynamic
from tests.model import hf_tiny
from tests.model.families import glm4moe as _glm4moe  # noqa: F401  (registers the glm4moe test family)
from tests.mtmd import convert

RNG = np.random.default_rng(7)
P = 8  # patch size
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|begin_of_image|>", "<|end_of_image|>", "<|image|>",
            "<|video|>", "<|begin_of_video|>", "<|end_of_video|>"]  # fmt: skip
BOI, EOI, IMG = 4, 5, 6
MEAN, STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
SECTIONS = [2, 3, 3]  # HF's mrope_section: 8 rotary pairs of a 32-wide head at partial_rotary_factor 0.5


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _build(seed: int = 0, moe: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    text = dict(
        vocab_size=convert.N_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": SECTIONS},
    )  # fmt: skip
    vision = dict(
        depth=2, hidden_size=32, num_heads=2, intermediate_size=48, out_hidden_size=64, patch_size=P,
        image_size=32, spatial_merge_size=2, temporal_patch_size=2, rms_norm_eps=1e-5, hidden_act="silu",
    )  # fmt: skip
    if moe:  # GLM-4.5V: a dense first layer, then top-2 of 4 sigmoid-routed experts + a shared one
        text.update(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                    first_k_dense_replace=1, routed_scaling_factor=2.0, norm_topk_prob=True)  # fmt: skip
    cls = transformers.Glm4vMoeConfig if moe else transformers.Glm4vConfig
    cfg = cls(
        text_config=text, vision_config=vision, image_token_id=IMG, image_start_token_id=BOI,
        image_end_token_id=EOI, video_token_id=7, video_start_token_id=8, video_end_token_id=9,
    )  # fmt: skip
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
    mcls = (
        transformers.Glm4vMoeForConditionalGeneration if moe else transformers.Glm4vForConditionalGeneration
    )
    model = mcls(cfg).to(torch.float32)
    g = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # the expert-selection bias
                buf.copy_(torch.randn(buf.shape, generator=g) * 0.3)
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_((0.0 if "bias" in name else 1.0) + torch.randn(p.shape, generator=g) * 0.1)
            elif "position_embedding" in name or "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(int(np.prod(p.shape[1:]))))
    return model.eval()


def _normal_to_neox(w: np.ndarray, head_dim: int, rot: int) -> np.ndarray:
    """convert_hf_to_gguf.py's Glm4Model.normal_to_neox: each head's rotary rows, evens then odds."""
    r = w.reshape(-1, head_dim, *w.shape[1:])
    rp = np.concatenate([r[:, :rot:2], r[:, 1:rot:2], r[:, rot:]], axis=1)
    return np.ascontiguousarray(rp.reshape(w.shape))


_TEXT = {"input_layernorm": "attn_norm", "post_self_attn_layernorm": "post_attention_norm",
         "post_attention_layernorm": "ffn_norm", "post_mlp_layernorm": "post_ffw_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}  # fmt: skip
_VIS = {"norm1": "ln1", "norm2": "ln2", "attn.qkv": "attn_qkv", "attn.proj": "attn_out", "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}  # fmt: skip
_MM = {"post_conv_layernorm": "v.norm_embd", "embeddings.position_embedding": "v.position_embd",
       "post_layernorm": "v.post_ln", "downsample": "mm.patch_merger", "merger.proj": "mm.model.fc",
       "merger.post_projection_norm": "mm.post_norm", "merger.gate_proj": "mm.gate", "merger.up_proj": "mm.up",
       "merger.down_proj": "mm.down"}  # fmt: skip


class TinyGlm4v:
    def __init__(self, tmp: Path, moe: bool = False) -> None:
        self.moe = moe
        self.hf = _build(moe=moe)
        self.cfg = self.hf.config
        self.sd = {k: v.detach().numpy().astype(np.float32) for k, v in self.hf.state_dict().items()}
        self.tmp = tmp
        self.text_path = self._text()
        self.mmproj_path = self.mmproj()

    def _text(self) -> Path:
        tc = self.cfg.text_config
        if self.moe:  # Glm4MoeModel: the glm4moe test family's conversion (neox already: no permutation)
            fam = hf_tiny.FAMILIES["glm4moe"]
            pre = "model.language_model."
            sd = {"model." + k[len(pre) :]: v for k, v in self.sd.items() if k.startswith(pre)}
            sd["lm_head.weight"] = self.sd["lm_head.weight"]
            md = hf_tiny.metadata(fam, tc, GGMLType.F32)
            md["glm4moe.rope.dimension_sections"] = [*SECTIONS, 0]
            md.update(convert.tiny_vocab(SPECIALS))
            tensors = hf_tiny.convert(fam, tc, sd)
            return hf_tiny.write_gguf(self.tmp / "text-moe.gguf", "glm4moe", md, tensors, GGMLType.F32)
        hd = tc.hidden_size // tc.num_attention_heads
        rot = hd // 2
        out: dict[str, np.ndarray] = {}
        for name, w in self.sd.items():
            if name == "lm_head.weight":
                out["output.weight"] = w
            elif name == "model.language_model.embed_tokens.weight":
                out["token_embd.weight"] = w
            elif name == "model.language_model.norm.weight":
                out["output_norm.weight"] = w
            elif name.startswith("model.language_model.layers."):
                il, rest = name[len("model.language_model.layers.") :].split(".", 1)
                mod, kind = rest.rsplit(".", 1)
                if mod in ("self_attn.q_proj", "self_attn.k_proj"):
                    w = _normal_to_neox(w, hd, rot)
                out[f"blk.{il}.{_TEXT[mod]}.{kind}"] = w
        a = "glm4"
        md = {
            "general.name": "tiny-glm4v-text", "general.file_type": 0, f"{a}.vocab_size": tc.vocab_size,
            f"{a}.context_length": tc.max_position_embeddings, f"{a}.embedding_length": tc.hidden_size,
            f"{a}.block_count": tc.num_hidden_layers, f"{a}.feed_forward_length": tc.intermediate_size,
            f"{a}.attention.head_count": tc.num_attention_heads,
            f"{a}.attention.head_count_kv": tc.num_key_value_heads,
            f"{a}.attention.layer_norm_rms_epsilon": float(tc.rms_norm_eps), f"{a}.rope.freq_base": 10000.0,
            f"{a}.rope.dimension_count": rot, f"{a}.rope.dimension_sections": [*SECTIONS, 0],
        }  # fmt: skip
        md.update(convert.tiny_vocab(SPECIALS))
        return hf_tiny.write_gguf(self.tmp / "text.gguf", a, md, out, GGMLType.F32)

    def mm_tensors(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name, w in self.sd.items():
            if not name.startswith("model.visual."):
                continue
            rest = name[len("model.visual.") :]
            mod, kind = rest.rsplit(".", 1)
            if mod == "patch_embed.proj":
                if kind == "bias":
                    out["v.patch_embd.bias"] = w
                else:  # [E, C, 2, p, p]: the two frames' kernels
                    out["v.patch_embd.weight"] = np.ascontiguousarray(w[:, :, 0])
                    out["v.patch_embd.weight.1"] = np.ascontiguousarray(w[:, :, 1])
            elif mod.startswith("blocks."):
                il, m = mod[len("blocks.") :].split(".", 1)
                out[f"v.blk.{il}.{_VIS[m]}.{kind}"] = w
            else:
                out[f"{_MM[mod]}.{kind}"] = w
        return out

    def mmproj(
        self, tensors: dict | None = None, name: str = "mmproj.gguf", ftype: GGMLType = GGMLType.F32
    ) -> Path:
        v = self.cfg.vision_config
        md = {
            "general.name": "tiny-glm4v-mmproj", "general.file_type": hf_tiny.FILE_TYPES[ftype],
            "clip.has_vision_encoder": True,
            "clip.projector_type": "glm4v", "clip.vision.image_size": v.image_size,
            "clip.vision.patch_size": v.patch_size, "clip.vision.embedding_length": v.hidden_size,
            "clip.vision.feed_forward_length": v.intermediate_size, "clip.vision.block_count": v.depth,
            "clip.vision.attention.head_count": v.num_heads,
            "clip.vision.projection_dim": self.cfg.text_config.hidden_size,
            "clip.vision.attention.layer_norm_epsilon": float(v.rms_norm_eps), "clip.use_silu": True,
            "clip.vision.image_mean": MEAN, "clip.vision.image_std": STD,
        }  # fmt: skip
        return convert.write_mmproj(self.tmp / name, md, tensors or self.mm_tensors(), ftype)

    # -- HF side
    def patchify(self, px: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        flat, gh, gw = hf_proc.Glm4vImageProcessorPil.patchify(None, px, P, 2, 2)
        return torch.from_numpy(np.ascontiguousarray(flat)), torch.tensor([[1, gh, gw]])

    def features(self, px: np.ndarray) -> np.ndarray:
        pv, thw = self.patchify(px)
        with torch.no_grad():
            return np.asarray(self.hf.model.get_image_features(pv, thw).pooler_output[0])

    def logits(self, ids: list[int], px: np.ndarray) -> np.ndarray:
        pv, thw = self.patchify(px)
        t = torch.tensor([ids])
        with torch.no_grad():
            out = self.hf(input_ids=t, pixel_values=pv, image_grid_thw=thw, mm_token_type_ids=(t == IMG).int(),
                          use_cache=False)  # fmt: skip
        return out.logits[0, -1].numpy()


@pytest.fixture(scope="module")
def g4v(tmp_path_factory: pytest.TempPathFactory) -> TinyGlm4v:
    return TinyGlm4v(tmp_path_factory.mktemp("glm4v"))


@pytest.fixture(scope="module")
def g45v(tmp_path_factory: pytest.TempPathFactory) -> TinyGlm4v:
    """Tiny GLM-4.5V (Glm4vMoeForConditionalGeneration): the same vision, a glm4moe text model."""
    return TinyGlm4v(tmp_path_factory.mktemp("glm4v_moe"), moe=True)


def test_mmproj_hparams(g4v: TinyGlm4v) -> None:
    cm = ClipModel(g4v.mmproj_path)
    hp = cm.hparams
    assert (hp.projector_type, hp.patch_size, hp.n_embd, hp.n_layer, hp.n_merge) == ("glm4v", 8, 32, 2, 2)
    assert hp.extra["pos_side"] == 4 and hp.ffn_op == "silu" and cm.projector.mrope
    assert cm.n_mmproj_embd == 64 and cm.n_output_tokens(80, 48) == 15


def test_bicubic_taps_are_torch_grid_sample() -> None:
    table = RNG.normal(size=(5 * 5, 3)).astype(np.float32)
    for gh, gw in ((6, 10), (2, 4), (10, 2)):
        idx, wts = glm4v.bicubic_taps(5, gh, gw)
        got = (table[idx] * wts[..., None]).sum(0)
        rows, cols = glm4v.merge_order(gh, gw, 2)
        grid = torch.tensor(
            np.stack([(cols + 0.5) / gw * 2 - 1, (rows + 0.5) / gh * 2 - 1], -1), dtype=torch.float32
        )
        src = torch.from_numpy(table.reshape(5, 5, 3)).permute(2, 0, 1)[None]
        ref = torch.nn.functional.grid_sample(src, grid[None, :, None], mode="bicubic", align_corners=False,
                                              padding_mode="border")  # fmt: skip
        np.testing.assert_allclose(got, ref[0, :, :, 0].T.numpy(), atol=1e-5)


def test_image_embeddings_match_hf(g4v: TinyGlm4v) -> None:
    cm = ClipModel(g4v.mmproj_path)
    for h, w in ((48, 80), (64, 16)):  # the 4 x 4 position table resampled up, and down along x
        px = RNG.uniform(-1.5, 1.5, (3, h, w)).astype(np.float32)
        got = cm.encode(px)
        assert got.shape == ((h // 16) * (w // 16), 64)
        assert _rel(got, g4v.features(px)) < 1e-4
    f16 = ClipModel(g4v.mmproj(name="mmproj-f16.gguf", ftype=GGMLType.F16))  # as the converter stores it
    assert _rel(f16.encode(px), g4v.features(px)) < 3e-3  # the weights' F16 rounding: ~7e-4


def test_mutations_break_the_match(g4v: TinyGlm4v) -> None:
    """The comparison can fail: the merger's 2 x 2 kernel taken in the wrong (dy, dx) order, or the learned
    positions bilinear instead of bicubic, miss by far more than the tolerance."""
    px = RNG.uniform(-1.5, 1.5, (3, 48, 80)).astype(np.float32)
    ref = g4v.features(px)
    t = g4v.mm_tensors()
    t["mm.patch_merger.weight"] = np.ascontiguousarray(t["mm.patch_merger.weight"].transpose(0, 1, 3, 2))
    assert _rel(ClipModel(g4v.mmproj(t, "swapped.gguf")).encode(px), ref) > 1e-2
    t = g4v.mm_tensors()  # q, k, v apart instead of the fused qkv: the same result
    for il in range(2):
        for n, part in zip("qkv", np.split(t.pop(f"v.blk.{il}.attn_qkv.weight"), 3), strict=True):
            t[f"v.blk.{il}.attn_{n}.weight"] = np.ascontiguousarray(part)
    assert _rel(ClipModel(g4v.mmproj(t, "split.gguf")).encode(px), ref) < 1e-5
    cubic = glm4v._cubic
    try:
        glm4v._cubic = lambda f: np.stack([np.zeros_like(f), 1 - f, f, np.zeros_like(f)])  # bilinear
        assert _rel(ClipModel(g4v.mmproj_path).encode(px), ref) > 1e-2
    finally:
        glm4v._cubic = cubic


def test_logits_with_an_image_match_hf(g4v: TinyGlm4v) -> None:
    model = Model.load(g4v.text_path)
    assert model.hparams.rope_sections == (2, 3, 3, 0)
    mt = MtmdContext(g4v.mmproj_path, model)
    bmp = Bitmap(RNG.integers(0, 256, (50, 90, 3), dtype=np.uint8))
    chunks = mt.tokenize("what is <__media__> this cat", [bmp])
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    assert chunks[0].tokens[-1] == BOI and chunks[2].tokens[0] == EOI
    assert img.mrope and (img.nx, img.ny) == (6, 3) and img.n_pos == 6
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens
    for n_ubatch in (64, 16):  # the image in one ubatch, and split
        ctx = Context(model, n_ctx=128, n_batch=n_ubatch, n_ubatch=n_ubatch, type_k="f32", type_v="f32")
        n_past = mt.eval_chunks(ctx, chunks, 0)
        assert n_past == len(ids) - img.n_tokens + img.n_pos
        assert _rel(ctx.get_logits()[-1], g4v.logits(ids, img.pixels)) < 1e-5  # F32 cache: ~7e-7
    nxt = int(np.argmax(ctx.get_logits()[-1]))
    mt.eval_chunks(ctx, [TextChunk([nxt])], n_past)
    assert _rel(ctx.get_logits()[-1], g4v.logits(ids + [nxt], img.pixels)) < 1e-5


def test_glm45v_moe_logits_match_hf(g45v: TinyGlm4v) -> None:
    model = Model.load(g45v.text_path)
    assert model.hparams.rope_sections == (2, 3, 3, 0)
    mt = MtmdContext(g45v.mmproj_path, model)
    chunks = mt.tokenize(
        "<__media__> what is this", [Bitmap(RNG.integers(0, 256, (70, 45, 3), dtype=np.uint8))]
    )
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    assert (img.nx, img.ny) == (3, 4)
    ids = [t for ch in chunks for t in (ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens)]
    ctx = Context(model, n_ctx=128, n_batch=64, n_ubatch=64, type_k="f32", type_v="f32")
    mt.eval_chunks(ctx, chunks, 0)
    assert _rel(ctx.get_logits()[-1], g45v.logits(ids, img.pixels)) < 1e-5
    assert _rel(ClipModel(g45v.mmproj_path).encode(img.pixels), g45v.features(img.pixels)) < 1e-4


def test_text_rope_sections_matter(g4v: TinyGlm4v) -> None:
    """The text model's M-RoPE sections can fail the comparison: all pairs on the temporal position, or the
    width section given to the height, miss HF's logits by over 100x the F32 agreement (~1e-6)."""
    model = Model.load(g4v.text_path)
    mt = MtmdContext(g4v.mmproj_path, model)
    bmp = Bitmap(np.random.default_rng(0).integers(0, 256, (80, 120, 3), dtype=np.uint8))
    chunks = mt.tokenize("a <__media__> cat", [bmp])
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    ids = [t for ch in chunks for t in (ch.tokens if isinstance(ch, TextChunk) else [IMG] * ch.n_tokens)]
    ref = g4v.logits(ids, img.pixels)
    errs = []
    for secs in ((2, 3, 3, 0), (8, 0, 0, 0), (2, 6, 0, 0)):
        model.hparams.rope_sections = secs
        ctx = Context(model, n_ctx=128, n_batch=64, n_ubatch=64, type_k="f32", type_v="f32")
        mt.eval_chunks(ctx, chunks, 0)
        errs.append(_rel(ctx.get_logits()[-1], ref))
    assert errs[0] < 1e-5 and min(errs[1:]) > 100 * errs[0] and min(errs[1:]) > 1e-4, errs


# -- preprocessing ----------------------------------------------------------------------------------------
def _photo(w: int, h: int, seed: int) -> bytes:
    g = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    arr = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 127 // (w + h)], -1)
    img = Image.fromarray(np.clip(arr + g.normal(0, 12, arr.shape), 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(img)
    for _ in range(5):
        x0, y0 = int(g.integers(0, w)), int(g.integers(0, h))
        d.ellipse([x0, y0, x0 + w // 3, y0 + h // 4], fill=tuple(int(c) for c in g.integers(0, 256, 3)))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.parametrize("size", [(37, 61), (203, 125), (97, 311), (450, 333)])
def test_pixels_match_hf_processor(g4v: TinyGlm4v, size: tuple[int, int]) -> None:
    """Stretched (pad=False), llamapy's pixels are HF's Glm4vImageProcessor's (PIL backend) within float
    rounding, its pixel limits set to llama.cpp's 8..4096 tokens (HF counts both temporal frames)."""
    hp = ClipModel(g4v.mmproj_path).hparams
    bmp = load_image(_photo(*size, seed=size[0]))
    got = preprocess_dynamic(bmp, hp, pad=False)
    area = (2 * P) ** 2
    proc = hf_proc.Glm4vImageProcessorPil(
        patch_size=P, merge_size=2, temporal_patch_size=2, image_mean=MEAN, image_std=STD,
        size={"shortest_edge": 2 * 8 * area, "longest_edge": 2 * 4096 * area},
    )  # fmt: skip
    out = proc(images=[Image.fromarray(bmp.data)], return_tensors="np")
    _, gh, gw = (int(v) for v in out["image_grid_thw"][0])
    assert got.shape == (3, gh * P, gw * P)
    ref = out["pixel_values"].reshape(gh // 2, gw // 2, 2, 2, 3, 2, P, P)[:, :, :, :, :, 0]
    ref = ref.transpose(4, 0, 2, 5, 1, 3, 6).reshape(3, gh * P, gw * P)
    assert np.abs(got - ref).max() < 1e-5


# -- bad input ------------------------------------------------------------------------------------------
def test_bad_mmproj_and_image(g4v: TinyGlm4v) -> None:
    t = g4v.mm_tensors()
    t["v.position_embd.weight"] = t["v.position_embd.weight"][:15]
    with pytest.raises(MtmdError, match="v.position_embd.weight.*side \\* side"):
        ClipModel(g4v.mmproj(t, "badpos.gguf"))
    t = g4v.mm_tensors()
    del t["mm.gate.weight"]
    with pytest.raises(MtmdError, match="mm.gate.weight"):
        ClipModel(g4v.mmproj(t, "nogate.gguf"))
    with pytest.raises(MtmdError, match="not a multiple of patch size x merge = 16"):
        ClipModel(g4v.mmproj_path).encode(np.zeros((3, 24, 32), np.float32))
