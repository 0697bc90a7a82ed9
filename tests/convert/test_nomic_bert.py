"""``llamapy convert`` of a tiny nomic-embed-text v1.5 checkpoint (``NomicBertModel``: remote code, so no
transformers class; ``hf_dirs.make_nomic_bert_dir``):

- the file equals llama.cpp's ``convert_hf_to_gguf.py`` output (``tests/data/convert/nomic-bert-f16.json``)
  but for the hyper-parameters that llama.cpp reads from transformers 5's generic config: ``AutoConfig`` now
  loads the unknown ``nomic_bert`` type with its defaults (12 layers, 768 wide, 12 heads, head_dim 64)
  ahead of config.json's ``n_layer`` / ``n_embd`` / ``n_inner`` / ``n_head``; llamapy reads config.json;
- llamapy's per-token embeddings of the converted file = a NumPy forward of the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamapy.convert import convert
from tests.convert.expect import EXPECT_DIR, describe, differences
from tests.convert.hf_dirs import make_nomic_bert_dir

TOKENS = [101, 464, 2068, 7586, 21831, 18045, 625, 262, 102]


@pytest.fixture(scope="module")
def nomic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_nomic_bert_dir(tmp_path_factory.mktemp("nomic"))


def test_same_file_as_llama_cpp(nomic_dir: Path, tmp_path: Path) -> None:
    want = json.loads((EXPECT_DIR / "nomic-bert-f16.json").read_text())
    cfg = json.loads((nomic_dir / "config.json").read_text())
    md = want["metadata"]
    for key in ("nomic-bert.attention.key_length", "nomic-bert.attention.value_length"):
        assert md.pop(key)[2] == 64  # transformers' default head_dim
    for key, hp, default in (("block_count", "n_layer", 12), ("embedding_length", "n_embd", 768),
                             ("feed_forward_length", "n_inner", 3072), ("attention.head_count", "n_head", 12)):  # fmt: skip
        assert md[f"nomic-bert.{key}"][2] == default
        md[f"nomic-bert.{key}"][2] = cfg[hp]
    out = tmp_path / "nomic.gguf"
    convert(nomic_dir, out, "f16")
    got = describe(out)
    got["file_sha256"] = want["file_sha256"]  # (two keys fewer: the bytes cannot equal)
    diff = differences(got, want)
    assert not diff, "\n".join(diff)


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def _reference(d: Path, tokens: list[int]) -> np.ndarray:
    """nomic-bert's forward (post-norm, neox rope on q/k, bidirectional attention, SwiGLU fc11 * silu(fc12))."""
    from safetensors.numpy import load_file

    w = {k: v.astype(np.float64) for k, v in load_file(str(d / "model.safetensors")).items()}
    cfg = json.loads((d / "config.json").read_text())
    e, nh, eps, base = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"], cfg["rotary_emb_base"]
    hd, t = e // nh, len(tokens)
    x = w["embeddings.word_embeddings.weight"][tokens] + w["embeddings.token_type_embeddings.weight"][0]
    x = _ln(x, w["emb_ln.weight"], w["emb_ln.bias"], eps)
    inv = base ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(t)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(z: np.ndarray) -> np.ndarray:  # [T, H, hd], rotate-half
        rot = np.concatenate([-z[..., hd // 2 :], z[..., : hd // 2]], -1)
        return z * cos[:, None] + rot * sin[:, None]

    for il in range(cfg["n_layer"]):
        p = f"encoder.layers.{il}."
        q, k, v = np.split(x @ w[p + "attn.Wqkv.weight"].T, 3, axis=-1)
        q, k, v = (z.reshape(t, nh, hd) for z in (q, k, v))
        q, k = rope(q), rope(k)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(t, e) @ w[p + "attn.out_proj.weight"].T
        x = _ln(x + o, w[p + "norm1.weight"], w[p + "norm1.bias"], eps)
        up, gate = x @ w[p + "mlp.fc11.weight"].T, x @ w[p + "mlp.fc12.weight"].T
        f = (up * gate / (1 + np.exp(-gate))) @ w[p + "mlp.fc2.weight"].T
        x = _ln(x + f, w[p + "norm2.weight"], w[p + "norm2.bias"], eps)
    return x


def test_embeddings_match_reference(nomic_dir: Path, tmp_path: Path) -> None:
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    out = tmp_path / "nomic-f32.gguf"
    convert(nomic_dir, out, "f32")
    ctx = Context(Model.load(out), ContextParams(n_ctx=64, embeddings=True, pooling_type="none"))
    ctx.decode(Batch.from_tokens(TOKENS, logits_all=True))
    got = np.asarray(ctx.get_embeddings(), dtype=np.float32).reshape(len(TOKENS), -1)
    ref = _reference(nomic_dir, TOKENS)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err < 1e-3, f"max |diff| / max |hidden| = {err:.2e}"


def test_moe_and_bad_layout_are_errors(nomic_dir: Path, tmp_path: Path) -> None:
    from llamapy.convert import ConvertError

    cfg = json.loads((nomic_dir / "config.json").read_text())
    for change, msg in (({"moe_every_n_layers": 2}, "nomic-bert-moe"), ({"prenorm": True}, "prenorm"),
                        ({"n_positions": 4096}, "n_positions")):  # fmt: skip
        (nomic_dir / "config.json").write_text(json.dumps({**cfg, **change}))
        try:
            with pytest.raises(ConvertError, match=msg):
                convert(nomic_dir, tmp_path / "x.gguf", "f16")
        finally:
            (nomic_dir / "config.json").write_text(json.dumps(cfg, indent=2))
        assert not (tmp_path / "x.gguf").exists()
