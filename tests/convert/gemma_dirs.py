"""Tiny Gemma 4 / Gemma 3n checkpoint directories for ``llamapy convert`` (test-only: torch, transformers).

- ``write_gemma4_tokenizer(d)``: a Gemma-style ``tokenizer.json`` (BPE with byte fallback, ``\u2581`` for
  spaces, a ``Sequence`` decoder: what gguf-py's ``LlamaHfVocab`` reads) of ``N_VOCAB`` tokens built with
  the ``tokenizers`` package: named special tokens (CONTROL), an unnamed special one (NORMAL in
  llama.cpp's eyes), the tokens Gemma4Model keeps visible (USER_DEFINED), 256 byte tokens, letters and a
  few merged words, and two added tokens past the base vocabulary;
- ``make_gemma4_text_dir(root)``: ``Gemma4ForCausalLM`` with the config of tests/model/families/gemma4.py
  (per-layer embeddings, larger global heads, K as V, proportional rope, KV sharing, double-wide MLP);
- ``make_gemma4v_dir(root)`` / ``make_gemma3n_dir(root)``: the vision-language checkpoints of
  tests/mtmd/test_gemma4v.py / test_gemma3nv.py saved with ``save_pretrained``.

Regenerate the stored llama.cpp expectations (needs llama.cpp's sdist with its gguf-py, torch)::

    python -m tests.convert.gemma_dirs ~/.cache/llamapy/llamacpp/0.3.36 [RUN_ID...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

N_VOCAB = 320
# ids 0-11: named specials, then the ones Gemma4Model renders (USER_DEFINED) and an unnamed special
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|image>", "<image|>", "<|channel>", "<channel|>",
            "<start_of_turn>", "<end_of_turn>", '<|"|>']  # fmt: skip
ADDED = ["<|image|>", "<extra_added>"]  # past the base vocabulary (the first a named special)
WORDS = ["the", "cat", "is", "image", "what", "this"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['content'] }}<end_of_turn>{% endfor %}"
)


def write_gemma4_tokenizer(d: Path) -> int:
    """The tokenizer files in ``d``; returns the vocabulary size (``N_VOCAB``)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    toks = list(SPECIALS) + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
    toks += [chr(c) for c in range(ord("a"), ord("z") + 1)]
    merges: list[tuple[str, str]] = []
    for w in WORDS:
        cur = "\u2581"
        for ch in w:
            merges.append((cur, ch))
            cur += ch
            if cur not in toks:
                toks.append(cur)
    n_base = N_VOCAB - len(ADDED)
    while len(toks) < n_base:
        toks.append(f"<unused{len(toks)}>")
    if len(toks) != n_base:
        raise AssertionError(f"{len(toks)} base tokens, {n_base} wanted")
    tok = Tokenizer(
        models.BPE({t: i for i, t in enumerate(toks)}, merges, unk_token="<unk>", byte_fallback=True)
    )
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    visible = {"<|channel>", "<channel|>", '<|"|>'}
    tok.add_special_tokens([AddedToken(t, special=t not in visible, normalized=False) for t in SPECIALS])
    tok.add_special_tokens([AddedToken(ADDED[0], special=True, normalized=False)])
    tok.add_tokens([AddedToken(ADDED[1], special=False, normalized=False)])
    tok.save(str(d / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
        "boi_token": "<|image>",
        "eoi_token": "<image|>",
        "image_token": "<|image|>",
        "add_bos_token": True,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 256,
    }
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return N_VOCAB


# ---------------------------------------------------------------------------------------------
# Gemma 4 text

_LAYER_TYPES = ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"]
_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}
GEMMA4_TEXT = dict(
    vocab_size=N_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, head_dim=16, global_head_dim=32,
    layer_types=_LAYER_TYPES, num_kv_shared_layers=3, sliding_window=4, rope_parameters=_ROPE,
    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, num_global_key_value_heads=1,
    attention_k_eq_v=True, hidden_size_per_layer_input=32, vocab_size_per_layer_input=N_VOCAB,
    use_double_wide_mlp=True, final_logit_softcapping=15.0, pad_token_id=0, bos_token_id=2, eos_token_id=1,
)  # fmt: skip


def _random_state(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Unit-ish weights from NumPy's generator: norms 1 + noise (Gemma 4 / 3n multiply by w itself),
    other vectors small, embeddings N(0, 1/16) (tied), matrices fan-in scaled (q/k twice), the per-layer
    output scales 0.6, 0.75, ..."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith("layer_scalar"):
            il = int(name.split("layers.")[1].split(".")[0])
            out[name] = np.full(shape, 0.6 + 0.15 * il, np.float32)
        elif len(shape) <= 1:
            noise = rng.standard_normal(shape, dtype=np.float32) * 0.1
            out[name] = 1.0 + noise if "norm" in name.lower() or name.endswith("scale") else noise * 2
        elif "embed_tokens" in name:
            out[name] = rng.standard_normal(shape, dtype=np.float32) * 0.25
        else:
            gain = 2.0 if name.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
            out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(gain / np.sqrt(shape[-1]))
    return out


def make_gemma4_text_dir(root: Path) -> Path:
    """``root/gemma4``: a Gemma4ForCausalLM checkpoint (F32 safetensors) with the tiny tokenizer."""
    import torch
    import transformers
    from safetensors.torch import save_file

    d = root / "gemma4"
    if (d / "config.json").is_file():
        return d
    d.mkdir(parents=True, exist_ok=True)
    write_gemma4_tokenizer(d)
    cfg = transformers.Gemma4TextConfig(**GEMMA4_TEXT)
    with torch.device("meta"):
        model = transformers.Gemma4ForCausalLM(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state = _random_state(shapes, 4)
    save_file({k: torch.from_numpy(v) for k, v in state.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    cfg.architectures = ["Gemma4ForCausalLM"]
    cfg.to_json_file(str(d / "config.json"))
    gen = {"bos_token_id": 2, "eos_token_id": [1, 10], "do_sample": True, "top_k": 64, "top_p": 0.95}
    (d / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return d


# ---------------------------------------------------------------------------------------------
# vision-language checkpoints (the models of tests/mtmd/test_gemma4v.py and test_gemma3nv.py)

G4V_PATCH, G4V_POOL = 4, 3


MODELS: dict[str, Any] = {}  # the transformers models of the directories made in this process


def _save_mm(model: Any, d: Path, preproc: dict[str, Any]) -> None:
    from safetensors.numpy import load_file, save_file

    model.save_pretrained(d)
    st = d / "model.safetensors"
    save_file(load_file(str(st)), str(st), metadata={"format": "pt"})  # (the bytes of NumPy's writer)
    (d / "preprocessor_config.json").write_text(json.dumps(preproc))
    write_gemma4_tokenizer(d)


def gemma4v_model(seed: int = 0, audio: bool = False) -> Any:
    """Gemma4ForConditionalGeneration: a 2-layer vision tower (clamped linears, pooling 3, standardized)
    on the MoE text model of tests/model/families/gemma4.py; ``audio``: a 2-layer audio conformer too
    (as E2B / E4B)."""
    import torch
    import transformers

    from tests.model import hf_tiny
    from tests.model.families import gemma4 as _fam  # noqa: F401 - registers the families
    from tests.mtmd import convert as mtc

    fam = hf_tiny.FAMILIES["gemma4-moe"]
    text = dict(hf_tiny._common(**fam.config_kw))
    text.update(vocab_size=N_VOCAB, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=G4V_PATCH, pooling_kernel_size=G4V_POOL,
                  position_embedding_size=64, use_clipped_linears=True, standardize=True, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "axial", "rope_theta": 100.0})  # fmt: skip
    au = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[4, 4],
              output_proj_dims=24, attention_chunk_size=4, attention_context_left=5) if audio else None  # fmt: skip
    cfg = transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=au, boi_token_id=5,
                                    eoi_token_id=6, image_token_id=N_VOCAB - 2, audio_token_id=N_VOCAB - 3)  # fmt: skip
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
    torch.manual_seed(seed)
    hf = transformers.Gemma4ForConditionalGeneration(cfg).to(torch.float32)
    hf_tiny._randomize(hf.model.language_model, fam, seed)
    mtc._randomize_vision(hf, "model.language_model.", seed)
    with torch.no_grad():
        for il, layer in enumerate(hf.model.language_model.layers):
            layer.layer_scalar.fill_(0.6 + 0.15 * il)
        vt = hf.model.vision_tower
        g = torch.Generator().manual_seed(seed + 3)
        vt.patch_embedder.position_embedding_table.copy_(torch.randn((2, 64, 32), generator=g) * 0.5)
        vt.std_bias.copy_(torch.randn(32, generator=g) * 0.5)
        vt.std_scale.copy_(1.0 + torch.randn(32, generator=g) * 0.2)
        blk = vt.encoder.layers[0]  # clamps that bite on some linears (the others stay infinite)
        blk.self_attn.q_proj.input_min.fill_(-1.0)
        blk.self_attn.q_proj.output_max.fill_(0.8)
        blk.mlp.down_proj.input_max.fill_(0.3)
        blk.mlp.down_proj.output_min.fill_(-0.5)
    return hf.eval()


def make_gemma4a_dir(root: Path) -> Path:
    d = root / "gemma4a"
    if not (d / "config.json").is_file():
        _save_mm(gemma4v_model(audio=True), d, {"image_mean": [0.0] * 3, "image_std": [1.0] * 3})
    return d


def make_gemma4v_dir(root: Path) -> Path:
    d = root / "gemma4v"
    if not (d / "config.json").is_file():
        MODELS["gemma4v"] = gemma4v_model()
        pre = {"image_mean": [0.0] * 3, "image_std": [1.0] * 3, "patch_size": G4V_PATCH}
        _save_mm(MODELS["gemma4v"], d, pre)
    return d


G3N_SIZE = 512


def gemma3n_model(seed: int = 0) -> Any:
    """Gemma3nForConditionalGeneration: timm's MobileNetV5 of tests/mtmd/timm_oracle.py (the real block
    kinds, small), a one-layer audio conformer, the Gemma 3n text model of tests/model/families."""
    import contextlib

    import torch
    import transformers

    from tests.model import hf_tiny
    from tests.model.families import gemma3n as _fam  # noqa: F401 - registers the family
    from tests.mtmd import convert as mtc
    from tests.mtmd import timm_oracle

    timm_oracle.register_tiny_mnv5()
    fam = hf_tiny.FAMILIES["gemma3n"]
    n, img = N_VOCAB, N_VOCAB - 1
    text = dict(hf_tiny._common(**fam.config_kw))
    text.update(vocab_size=n, vocab_size_per_layer_input=img, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    vision = dict(architecture=timm_oracle.TINY, hidden_size=2048, vocab_size=1, vocab_offset=img)
    audio = dict(vocab_size=1, vocab_offset=n, hidden_size=16, input_feat_size=16, conf_num_attention_heads=2,
                 conf_num_hidden_layers=1, sscp_conv_channel_size=[4, 4])  # fmt: skip
    cfg = transformers.Gemma3nConfig(text_config=text, vision_config=vision, audio_config=audio, boi_token_id=5,
                                     eoi_token_id=6, image_token_id=img, boa_token_id=7, eoa_token_id=8,
                                     audio_token_id=n)  # fmt: skip
    for c in (cfg, cfg.text_config):
        c._attn_implementation = "eager"
    torch.manual_seed(seed)
    with contextlib.ExitStack() as st:
        for p in timm_oracle.timm_wrapper_patches():
            st.enter_context(p)
        hf = transformers.Gemma3nForConditionalGeneration(cfg).to(torch.float32)
    hf_tiny._randomize(hf.model.language_model, fam, seed)
    mtc._randomize_vision(hf, "model.language_model.", seed)
    return hf.eval()


def make_gemma3n_dir(root: Path) -> Path:
    d = root / "gemma3n-mm"
    if not (d / "config.json").is_file():
        pre = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "image_seq_length": 256,
               "size": {"height": G3N_SIZE, "width": G3N_SIZE}}  # fmt: skip
        MODELS["gemma3n"] = gemma3n_model()
        _save_mm(MODELS["gemma3n"], d, pre)
    return d


# ---------------------------------------------------------------------------------------------
# the stored expectations

# gemma4v: the MoE text model of the vision checkpoint
TEXT_RUNS: list[tuple[str, str]] = [("gemma4", "f16"), ("gemma4", "q8_0"), ("gemma4v", "f16")]
MM_RUNS: list[tuple[str, str]] = [("gemma4v", "f16"), ("gemma4a", "f16"), ("gemma3n", "f16")]

# tensors llama.cpp computes with torch's float32 softplus (Gemma 4's audio per-dim scales), which is not
# correctly rounded: llamapy rounds the exact value, so an element may be 1 ulp apart. Their values are
# stored and compared within 1 ulp (as expect.ULP_TENSORS); the rest byte for byte.
SOFTPLUS_TENSORS = ("per_dim_scale.weight", "per_dim_key_scale.weight")

# llama.cpp 0.3.36's converter stops at Gemma 3n's audio subsample norms ("Can not map tensor
# 'model.audio_tower.subsample_conv_projection.conv_0.norm.weight'"): its gguf-py map names them for Gemma 4
# only. The reference is that converter with the Gemma 3n name added to the same entry (A_ENC_CONV1D_NORM).
_PATCHED = """import runpy, sys
sys.path[:0] = [".", "gguf-py"]
import gguf
from gguf.tensor_mapping import TensorNameMap
m, k = TensorNameMap.block_mappings_cfg, gguf.MODEL_TENSOR.A_ENC_CONV1D_NORM
m[k] = (*m[k], "model.audio_tower.subsample_conv_projection.conv_{bid}.norm")
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[1:]]
runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
"""


def _makers() -> dict[str, Any]:
    return {"gemma4": make_gemma4_text_dir, "gemma4v": make_gemma4v_dir, "gemma4a": make_gemma4a_dir,
            "gemma3n": make_gemma3n_dir}  # fmt: skip


def main(sdist: str, only: list[str]) -> None:
    from tests.convert.expect import EXPECT_DIR, describe

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runs = [(c, t, ()) for c, t in TEXT_RUNS] + [(c, t, ("--mmproj",)) for c, t in MM_RUNS]
        for case, outtype, flags in runs:
            rid = f"{'mmproj-' if flags else ''}{case}-{outtype}"
            if only and rid not in only:
                continue
            d = _makers()[case](root)
            out = root / f"{rid}.gguf"
            script = "convert_hf_to_gguf.py"
            if case == "gemma3n":
                (root / "patched.py").write_text(_PATCHED)
                script = str(root / "patched.py")
            cmd = [
                sys.executable,
                script,
                str(d),
                *flags,
                "--outfile",
                str(out),
                "--outtype",
                outtype,
            ]
            r = subprocess.run(cmd, cwd=sdist, capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"{rid}: {r.stderr[-3000:]}")
            desc = describe(out)
            if any(t[0].endswith(SOFTPLUS_TENSORS) for t in desc["tensors"]):
                from llamapy.gguf.reader import GGUFReader

                with GGUFReader(out) as r:
                    vals = {t.name: np.asarray(t.array(), np.float32).ravel().tolist() for t in r}
                for t in desc["tensors"]:
                    if t[0].endswith(SOFTPLUS_TENSORS):
                        t.append(vals[t[0]])
            (EXPECT_DIR / f"{rid}.json").write_text(json.dumps(desc, indent=1) + "\n")
            print(rid, desc["file_sha256"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
