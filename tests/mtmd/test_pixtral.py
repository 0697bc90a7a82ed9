"""Mistral Small 3.1 / Ministral 3 vision (pixtral projector: 2-D rope, patch merger, [IMG_BREAK] rows) and
Pixtral 12B (no merger) vs Hugging Face's Mistral3ForConditionalGeneration / LlavaForConditionalGeneration.

The mmproj is written as llama.cpp's ``LlavaVisionModel`` converter writes it: q/k permuted (llama's
rotate-half -> interleaved), ``v.token_embd.img_break`` copied from the text model's embeddings."""

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
from tests.model import hf_tiny
from tests.mtmd import convert

RNG = np.random.default_rng(5)
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "[IMG]", "[IMG_BREAK]", "[IMG_END]", "[INST]", "[/INST]"]
IMG, BRK, END = 4, 5, 6
TEXT = hf_tiny.FAMILIES["mistral"]
MEAN, STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
_LAYER = {"attention.q_proj": "attn_q", "attention.k_proj": "attn_k", "attention.v_proj": "attn_v",
          "attention.o_proj": "attn_out", "attention_norm": "ln1", "ffn_norm": "ln2",
          "feed_forward.gate_proj": "ffn_gate", "feed_forward.up_proj": "ffn_up",
          "feed_forward.down_proj": "ffn_down"}  # fmt: skip


def _config(merge: bool) -> Any:
    text = dict(hf_tiny._common(**TEXT.config_kw))
    text.update(vocab_size=convert.N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1, rms_norm_eps=1e-5)
    vision = dict(
        model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        head_dim=16, patch_size=8, image_size=64, hidden_act="silu" if merge else "gelu_pytorch_tanh",
    )  # fmt: skip
    # Pixtral 12B's "gelu" is written as clip.use_gelu, which llama.cpp computes with ggml_gelu (tanh)
    if merge:  # Mistral Small 3.1: the projector's GELU set to ggml's (tanh) as llama.cpp computes it
        cfg = transformers.Mistral3Config(
            text_config=text, vision_config=vision, image_token_index=IMG, spatial_merge_size=2,
            projector_hidden_act="gelu_pytorch_tanh", multimodal_projector_bias=True, vision_feature_layer=-1,
        )  # fmt: skip
    else:  # Pixtral 12B (LLaVA layout)
        cfg = transformers.LlavaConfig(
            text_config=text, vision_config=vision, image_token_index=IMG, projector_hidden_act="gelu_pytorch_tanh",
            vision_feature_layer=-1, vision_feature_select_strategy="full",
        )  # fmt: skip
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
    return cfg


class TinyPixtral:
    def __init__(self, tmp: Path, merge: bool, seed: int = 0) -> None:
        torch.manual_seed(seed)
        cls = (
            transformers.Mistral3ForConditionalGeneration
            if merge
            else transformers.LlavaForConditionalGeneration
        )
        self.hf = cls(_config(merge)).to(torch.float32)
        hf_tiny._randomize(self.hf.model.language_model, TEXT, seed)
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed + 2)
            self.hf.lm_head.weight.copy_(torch.randn(self.hf.lm_head.weight.shape, generator=g) / 8)
        convert._randomize_vision(self.hf, "model.language_model.", seed)
        self.hf.eval()
        self.state = hf_tiny.hf_state_dict(self.hf)
        self.cfg, self.tmp, self.merge = self.hf.config, tmp, merge
        self.text_path = self._text_gguf()
        self.mmproj_path = self.write_mmproj(self.tmp / "mmproj.gguf")

    def _text_gguf(self) -> Path:
        pre = "model.language_model."
        sd = {"model." + k[len(pre) :]: v for k, v in self.state.items() if k.startswith(pre)}
        sd["lm_head.weight"] = self.state["lm_head.weight"]
        tensors = hf_tiny.convert(TEXT, self.cfg.text_config, sd)
        md = hf_tiny.metadata(TEXT, self.cfg.text_config, GGMLType.F32)
        md.update(convert.tiny_vocab(SPECIALS))
        return hf_tiny.write_gguf(self.tmp / "text.gguf", TEXT.arch, md, tensors, GGMLType.F32)

    def mm_tensors(self) -> dict[str, np.ndarray]:
        vt, nh = "model.vision_tower.", self.cfg.vision_config.num_attention_heads
        out: dict[str, np.ndarray] = {}
        for name, w in self.state.items():
            w = np.asarray(w, dtype=np.float32)
            if name.startswith(vt + "transformer.layers."):
                il, rest = name[len(vt + "transformer.layers.") :].split(".", 1)
                mod, kind = rest.rsplit(".", 1)
                if mod in ("attention.q_proj", "attention.k_proj"):
                    w = hf_tiny._permute(w, nh)
                out[f"v.blk.{il}.{_LAYER[mod]}.{kind}"] = w
            elif name == vt + "patch_conv.weight":
                out["v.patch_embd.weight"] = w
            elif name == vt + "ln_pre.weight":
                out["v.pre_ln.weight"] = w
            elif name == "model.multi_modal_projector.norm.weight":
                out["mm.input_norm.weight"] = w
            elif name == "model.multi_modal_projector.patch_merger.merging_layer.weight":
                out["mm.patch_merger.weight"] = w
            elif name.startswith("model.multi_modal_projector.linear_"):
                i, kind = name[len("model.multi_modal_projector.linear_") :].split(".")
                out[f"mm.{i}.{kind}"] = w
            elif name.startswith(vt):
                raise KeyError(name)
        out["v.token_embd.img_break"] = self.state["model.language_model.embed_tokens.weight"][BRK].copy()
        return out

    def metadata(self) -> dict[str, Any]:
        v = self.cfg.vision_config
        md: dict[str, Any] = {
            "general.name": "tiny-pixtral-mmproj", "general.file_type": 0, "clip.has_vision_encoder": True,
            "clip.projector_type": "pixtral", "clip.vision.image_size": v.image_size,
            "clip.vision.patch_size": v.patch_size, "clip.vision.embedding_length": v.hidden_size,
            "clip.vision.feed_forward_length": v.intermediate_size, "clip.vision.block_count": v.num_hidden_layers,
            "clip.vision.attention.head_count": v.num_attention_heads,
            "clip.vision.projection_dim": self.cfg.text_config.hidden_size,
            "clip.vision.attention.layer_norm_epsilon": 1e-5, "clip.vision.image_mean": MEAN,
            "clip.vision.image_std": STD,
        }  # fmt: skip
        md["clip.use_silu" if v.hidden_act == "silu" else "clip.use_gelu"] = True  # "gelu" in the real one
        if self.merge:
            md["clip.vision.spatial_merge_size"] = self.cfg.spatial_merge_size
        return md

    def write_mmproj(self, path: Path, md: dict[str, Any] | None = None, tensors: dict | None = None) -> Path:
        md = self.metadata() if md is None else md
        return convert.write_mmproj(path, md, self.mm_tensors() if tensors is None else tensors, GGMLType.F32)

    def hf_features(self, px: np.ndarray) -> np.ndarray:
        sizes = torch.tensor([[px.shape[1], px.shape[2]]])
        with torch.no_grad():
            out = self.hf.model.get_image_features(
                pixel_values=torch.from_numpy(px[None]), image_sizes=sizes, vision_feature_layer=-1,
                **({} if self.merge else {"vision_feature_select_strategy": "full"}),
            )  # fmt: skip
        out = getattr(out, "pooler_output", out)
        return torch.cat(list(out)).numpy().reshape(-1, self.cfg.text_config.hidden_size)


@pytest.fixture(scope="module")
def mistral3(tmp_path_factory: pytest.TempPathFactory) -> TinyPixtral:
    return TinyPixtral(tmp_path_factory.mktemp("mistral3"), merge=True)


@pytest.fixture(scope="module")
def pixtral12b(tmp_path_factory: pytest.TempPathFactory) -> TinyPixtral:
    return TinyPixtral(tmp_path_factory.mktemp("pixtral12b"), merge=False)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _with_breaks(feats: np.ndarray, nx: int, ny: int, brk: np.ndarray) -> np.ndarray:
    rows = [feats[r * nx : (r + 1) * nx] for r in range(ny)]
    out: list[np.ndarray] = []
    for r, row in enumerate(rows):
        out += [row] + ([brk[None]] if r < ny - 1 else [])
    return np.concatenate(out)


@pytest.mark.parametrize("which", ["mistral3", "pixtral12b"])
@pytest.mark.parametrize("hw", [(48, 64), (32, 96)])
def test_image_embeddings_match_hf(which: str, hw: tuple[int, int], request: pytest.FixtureRequest) -> None:
    vlm: TinyPixtral = request.getfixturevalue(which)
    cm = ClipModel(vlm.mmproj_path)
    k = 2 if vlm.merge else 1
    assert cm.hparams.projector_type == "pixtral" and cm.hparams.n_merge == k and cm.n_mmproj_embd == 64
    px = RNG.uniform(-1.5, 1.5, (3, *hw)).astype(np.float32)
    nx, ny = hw[1] // (8 * k), hw[0] // (8 * k)
    got = cm.encode(px)
    assert got.shape == (nx * ny + ny - 1, 64) == (cm.n_output_tokens(hw[1], hw[0]), 64)
    brk = vlm.state["model.language_model.embed_tokens.weight"][BRK]
    want = _with_breaks(vlm.hf_features(px), nx, ny, brk)
    assert _rel(got, want) < 1e-5


def test_logits_with_an_image_match_hf(mistral3: TinyPixtral) -> None:
    model = Model.load(mistral3.text_path)
    mt = MtmdContext(mistral3.mmproj_path, model)
    bmp = Bitmap(RNG.integers(0, 256, (37, 75, 3), dtype=np.uint8))
    chunks = mt.tokenize("[INST] what is <__media__> this [/INST]", [bmp])
    img = next(c for c in chunks if isinstance(c, ImageChunk))
    _, h, w = img.pixels.shape
    nx, ny = w // 16, h // 16
    assert (w, h) == (80, 32) and img.n_tokens == nx * ny + ny - 1  # smart_resize: 8..1024 tokens of 16 px
    ids: list[int] = []
    for ch in chunks:
        ids += ch.tokens if isinstance(ch, TextChunk) else ([IMG] * nx + [BRK]) * (ny - 1) + [IMG] * nx
    assert ids[ids.index(IMG) - 1] != BRK and ids[len(ids) - ids[::-1].index(IMG)] == END  # [IMG_END] after
    ctx = Context(model, n_ctx=256, n_batch=8, n_ubatch=8, type_k="f32", type_v="f32")  # image spans ubatches
    mt.eval_chunks(ctx, chunks, 0)
    with torch.no_grad():
        out = mistral3.hf(
            input_ids=torch.tensor([ids]), pixel_values=torch.from_numpy(img.pixels[None]),
            image_sizes=torch.tensor([[h, w]]),
        )  # fmt: skip
    assert _rel(ctx.get_logits()[-1], out.logits[0, -1].numpy()) < 1e-4


def test_preprocessing_size_and_pixels() -> None:
    """llama.cpp's dyn_size preprocessing: 16-px multiples, 8..1024 merged tokens, bicubic; an image already of
    such a size is only normalized, as HF's PixtralImageProcessor (pixels equal)."""
    from llamapy.mtmd.clip import ClipHParams
    from llamapy.mtmd.qwen2vl import preprocess_dynamic

    hp = ClipHParams("pixtral", 64, 8, 32, 64, 2, 2, 64, 1e-5, tuple(MEAN), tuple(STD), n_merge=2)
    arr = RNG.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    got = preprocess_dynamic(Bitmap(arr), hp, True, 8, 1024)
    proc = transformers.PixtralImageProcessor(
        patch_size={"height": 16, "width": 16}, image_mean=MEAN, image_std=STD
    )
    ref = proc(images=[arr], return_tensors="np")["pixel_values"][0]
    np.testing.assert_allclose(got, ref, atol=1e-5)
    tiny = preprocess_dynamic(Bitmap(arr[:5, :7]), hp, True, 8, 1024)
    assert tiny.shape[1] * tiny.shape[2] >= 8 * 256  # scaled up to the minimum (HF keeps it tiny)
    big = preprocess_dynamic(Bitmap(np.zeros((1000, 1500, 3), np.uint8)), hp, True, 8, 1024)
    assert big.shape[1] * big.shape[2] <= 1024 * 256


def test_merger_mutation_is_caught(mistral3: TinyPixtral, tmp_path: Path) -> None:
    """A broken feature (the patch merger's weight transposed into the wrong unfold order) changes the output:
    the oracle is sensitive to it."""
    t = mistral3.mm_tensors()
    w = t["mm.patch_merger.weight"].reshape(32, 32, 4)
    t["mm.patch_merger.weight"] = np.ascontiguousarray(w.transpose(0, 2, 1)).reshape(
        32, 128
    )  # (dy,dx,c) order
    cm = ClipModel(mistral3.write_mmproj(tmp_path / "bad.gguf", tensors=t))
    px = RNG.uniform(-1, 1, (3, 32, 32)).astype(np.float32)
    brk = mistral3.state["model.language_model.embed_tokens.weight"][BRK]
    assert _rel(cm.encode(px), _with_breaks(mistral3.hf_features(px), 2, 2, brk)) > 1e-2


def test_bad_mmproj_is_a_typed_error(mistral3: TinyPixtral, tmp_path: Path) -> None:
    md = mistral3.metadata()
    md["clip.vision.spatial_merge_size"] = 3
    with pytest.raises(MtmdError, match="patch_merger"):
        ClipModel(mistral3.write_mmproj(tmp_path / "k3.gguf", md))
    t = mistral3.mm_tensors()
    del t["mm.patch_merger.weight"]
    with pytest.raises(MtmdError, match="spatial_merge_size = 2"):
        ClipModel(mistral3.write_mmproj(tmp_path / "nomerger.gguf", tensors=t))
    t = mistral3.mm_tensors()
    del t["v.blk.1.ffn_gate.weight"]
    with pytest.raises(MtmdError, match="ffn_gate"):
        ClipModel(mistral3.write_mmproj(tmp_path / "nogate.gguf", tensors=t))


def test_wrong_text_model_and_odd_images(mistral3: TinyPixtral, idefics3_vlm: convert.TinyVLM) -> None:
    other = Model.load(idefics3_vlm.text_gguf())  # 64 wide too, but no [IMG_END] in its vocabulary
    with pytest.raises(MtmdError, match=r"\[IMG_END\]"):
        MtmdContext(mistral3.mmproj_path, other)
    mt = MtmdContext(mistral3.mmproj_path, Model.load(mistral3.text_path))
    thin = Bitmap(np.zeros((4, 20000, 3), np.uint8))  # too elongated for 8..1024 tokens of 16 px
    with pytest.raises(MtmdError, match="elongated"):
        mt.tokenize("<__media__>", [thin])
    one = mt.tokenize("<__media__>", [Bitmap(np.full((1, 1, 3), 200, np.uint8))])  # scaled up to the minimum
    img = next(c for c in one if isinstance(c, ImageChunk))
    assert img.n_tokens >= 8 and mt.encode(img).shape == (img.n_tokens, 64)


def test_chat_completion_with_an_image_follows_hf_greedy(mistral3: TinyPixtral) -> None:
    """``Llama(mmproj=...)``: an image as an OpenAI content part, 3 greedy tokens = HF's argmax on the same ids."""
    import base64
    import io

    from PIL import Image

    from llamapy.api import Llama
    from llamapy.mtmd import load_image
    from llamapy.mtmd.qwen2vl import preprocess_dynamic

    arr = RNG.integers(0, 256, (40, 70, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    llm = Llama(str(mistral3.text_path), mmproj=str(mistral3.mmproj_path), n_ctx=256, n_batch=64, n_ubatch=64,
                type_k="f32", type_v="f32", verbose=False)  # fmt: skip
    msgs = [{"role": "user", "content": [{"type": "text", "text": "what is"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]  # fmt: skip
    out = llm.create_chat_completion(msgs, temperature=0.0, max_tokens=3)
    assert out["usage"]["completion_tokens"] == 3
    px = preprocess_dynamic(load_image(buf.getvalue()), llm.mtmd.clip.hparams, True, 8, 1024)
    nx, ny = px.shape[2] // 16, px.shape[1] // 16
    toks = list(llm.eval_tokens)
    i = next(k for k, t in enumerate(toks) if t < 0)
    n_img = nx * ny + ny - 1
    assert all(t < 0 for t in toks[i : i + n_img]) and toks[i + n_img] == END
    ids = toks[:i] + ([IMG] * nx + [BRK]) * (ny - 1) + [IMG] * nx + toks[i + n_img :]
    with torch.no_grad():
        ref = mistral3.hf(input_ids=torch.tensor([ids]), pixel_values=torch.from_numpy(px[None]),
                          image_sizes=torch.tensor([list(px.shape[1:])]))  # fmt: skip
    n_prompt = out["usage"]["prompt_tokens"]
    assert toks[n_prompt:] == list(ref.logits[0].argmax(-1).numpy()[n_prompt - 1 : -1])
