"""Split graphs of the two real models' shapes at several ``-ngl`` values against the CPU.

Under the simulator a 135M model is far too slow, so the simulated cases are tiny models with the real
files' layouts and tensor types, written with our writer: SmolLM2-shaped (llama, tied Q8_0 embedding,
Q4_1 blocks, 3:1 grouped KV heads) and Gemma 3-shaped (Q8_0 tied embedding, Q5_0 / Q8_0 projections,
Q4_K ``attn_output``, Q4_K / Q6_K ``ffn_down`` alternating, q/k norms, a sliding-window layer then a
global one). The real files run on a real GPU only (``LLAMAPY_CUDA_REAL=1``), skipped otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llamapy.batch import Batch
from llamapy.context import Context
from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType
from llamapy.gguf.writer import GGUFWriter
from llamapy.model import Model

Q8_0, Q4_1, Q5_0, Q4_K, Q6_K, F32 = (GGMLType[n] for n in ("Q8_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K", "F32"))


def write_typed(path: Path, arch: str, md: dict[str, Any], tensors: dict[str, np.ndarray], type_of) -> Path:
    """A GGUF file whose tensors get ``type_of(name)`` each (1-D ones F32)."""
    w = GGUFWriter(path, arch=arch)
    w.add_metadata(md, int_type=GGUFValueType.UINT32)
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        w.add_tensor(name, arr, ggml_type=type_of(name) if arr.ndim >= 2 else F32)
    w.write()
    w.close()
    return path


def smollm2_shaped(path: Path) -> Path:
    from tests.model.tiny import llama_config, random_llama_weights

    cfg = llama_config(n_vocab=64, n_embd=32, n_layer=3, n_head=3, n_head_kv=1, head_dim=32, n_ff=64)
    hd = cfg["head_dim"]
    md = {
        "llama.context_length": 256, "llama.embedding_length": 32, "llama.block_count": 3,
        "llama.feed_forward_length": 64, "llama.attention.head_count": 3, "llama.attention.head_count_kv": 1,
        "llama.attention.key_length": hd, "llama.attention.value_length": hd, "llama.rope.freq_base": 100000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": 64, "llama.rope.dimension_count": hd,
    }  # fmt: skip
    w = random_llama_weights(cfg, seed=11, tied=True)  # SmolLM2 ties its output to token_embd
    return write_typed(path, "llama", md, w, lambda n: Q8_0 if n == "token_embd.weight" else Q4_1)


def gemma3_shaped(path: Path) -> Path:
    """Gemma 3's layout at tiny size (attn_output's and ffn_down's rows 256 long, for the k-quants)."""
    d, ff, nh, hd, nv = 32, 256, 2, 128, 256
    md = {
        "gemma3.vocab_size": nv, "gemma3.context_length": 256, "gemma3.embedding_length": d,
        "gemma3.block_count": 2, "gemma3.feed_forward_length": ff, "gemma3.attention.head_count": nh,
        "gemma3.attention.head_count_kv": 1, "gemma3.attention.key_length": hd,
        "gemma3.attention.value_length": hd, "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.rope.freq_base": 1000000.0, "gemma3.rope.dimension_count": hd,
        "gemma3.attention.sliding_window": 2,
        "gemma3.attention.sliding_window_pattern": 2,  # layer 0 sliding (window 2), layer 1 global
    }  # fmt: skip
    rng = np.random.default_rng(2)

    def r(*shape: int, s: float) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    tensors = {"token_embd.weight": r(nv, d, s=0.25), "output_norm.weight": 1.0 + r(d, s=0.1)}
    for il in range(2):
        p = f"blk.{il}."
        tensors |= {
            p + "attn_norm.weight": 1.0 + r(d, s=0.1), p + "attn_q.weight": r(nh * hd, d, s=0.35),
            p + "attn_k.weight": r(hd, d, s=0.35), p + "attn_v.weight": r(hd, d, s=0.18),
            p + "attn_q_norm.weight": 1.0 + r(hd, s=0.1), p + "attn_k_norm.weight": 1.0 + r(hd, s=0.1),
            p + "attn_output.weight": r(d, nh * hd, s=0.06), p + "post_attention_norm.weight": 1.0 + r(d, s=0.1),
            p + "ffn_norm.weight": 1.0 + r(d, s=0.1), p + "ffn_gate.weight": r(ff, d, s=0.18),
            p + "ffn_up.weight": r(ff, d, s=0.18), p + "ffn_down.weight": r(d, ff, s=0.06),
            p + "post_ffw_norm.weight": 1.0 + r(d, s=0.1),
        }  # fmt: skip

    def type_of(name: str) -> GGMLType:  # as gemma-3-270m-q4_k_m.gguf (v and down alternate there too)
        il = int(name.split(".")[1]) if name.startswith("blk.") else 0
        if name.endswith(("attn_q.weight", "attn_k.weight", "ffn_gate.weight", "ffn_up.weight")):
            return Q5_0
        if name.endswith("attn_v.weight"):
            return Q8_0 if il % 2 == 0 else Q5_0
        if name.endswith("attn_output.weight"):
            return Q4_K
        if name.endswith("ffn_down.weight"):
            return Q6_K if il % 2 == 0 else Q4_K
        return Q8_0  # token_embd

    return write_typed(path, "gemma3", md, tensors, type_of)


def logits(model: Model, ngl: int, prompt: list[int], feed: list[int] | None, n: int = 0):
    """All rows of the prompt, then decodes one token at a time (the mat-vec and replay path): the
    tokens ``feed``, or ``n`` greedy ones. Returns the context, the rows and the tokens decoded."""
    c = Context(model, n_ctx=64, n_gpu_layers=ngl)
    c.decode(Batch.from_tokens(prompt, logits_all=True))
    rows = [c.get_logits().copy()]
    toks = list(feed) if feed is not None else []
    for i in range(len(toks) if feed is not None else n):
        if feed is None:
            toks.append(int(rows[-1][-1].argmax()))
        c.decode(Batch.from_tokens([toks[i]], pos0=len(prompt) + i))
        rows.append(c.get_logits().copy())
    return c, np.concatenate(rows), toks


def check_split(model: Model, ngls: list[int], prompt: list[int], n_decode: int, rel: float) -> None:
    tied = "output.weight" not in model.impl.w
    _, ref, toks = logits(model, 0, prompt, None, n_decode)
    n_layer = model.hparams.n_layer
    for ngl in ngls:
        c, got, _ = logits(model, ngl, prompt, toks)
        off = c.offload
        assert off is not None and off.n_gpu == (n_layer if ngl < 0 else min(ngl, n_layer))
        assert off.output == (ngl < 0 or ngl > n_layer)
        kinds = {sp.backend.name for g in c._graphs.values() for sp in c.sched.splits(g.graph)}
        # (with every layer and the tied output offloaded, token_embd lives on the GPU: so does get_rows)
        assert kinds == ({"cuda"} if off.output and tied else {"cpu", "cuda"}), (ngl, kinds)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < rel, (ngl, err)
        assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.75, ngl


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cuda_models")


def test_smollm2_shaped_split_matches_cpu(tmp):
    model = Model.load(smollm2_shaped(tmp / "smollm2-shaped.gguf"))
    types = {t.type for t in model.impl.w.values() if t.data is not None and t.ndim == 2}
    assert types == {Q8_0, Q4_1}
    # the CPU's repacked Q4_1 / Q8_0 (q40_x8, q80_x8) multiply 16-bit activations for the prompt rows too
    # (measured 1.85e-4 of the largest logit): the bound allows that rounding
    check_split(model, [1, 2, 3, -1], [1, 5, 9], 1, rel=1e-3)  # 1, half, all layers, + output


def test_gemma3_shaped_split_matches_cpu(tmp):
    model = Model.load(gemma3_shaped(tmp / "gemma3-shaped.gguf"))
    assert model.hparams.swa_layers == [True, False]
    types = {t.type for t in model.impl.w.values() if t.data is not None and t.ndim == 2}
    assert types == {Q8_0, Q5_0, Q4_K, Q6_K}
    # the CPU's k-quant mat-vec rounds activations to 8 bits (llama.cpp's Q8_K); the CUDA kernels
    # read them as F32: the bound allows that rounding
    check_split(model, [1, -1], [1, 5, 9], 1, rel=2e-2)


# -- the real files (a real GPU only) ----------------------------------------------------------------------
def _real_gpu() -> None:
    from llamapy.ggml.cuda.device import cuda_unavailable_reason, simulator

    why = cuda_unavailable_reason()
    if simulator() or why is not None:
        pytest.skip(f"needs a real GPU (LLAMAPY_CUDA_REAL=1 on a CUDA machine): {why or 'simulator'}")


def real_check(path: Path, prompt: list[int]) -> None:
    """-ngl 1 / half / all (+ output) vs the CPU: top-1 where the CPU's margin exceeds 0.1, and the
    logit differences within the bounds the llama.cpp reference tests use (max 2.0, mean 0.3)."""
    model = Model.load(path)
    n_layer = model.hparams.n_layer
    _, ref, toks = logits(model, 0, prompt, None, 4)
    top2 = np.sort(ref, axis=-1)[:, -2:]
    sure = top2[:, 1] - top2[:, 0] > 0.1
    for ngl in (1, n_layer // 2, n_layer, -1):
        c, got, _ = logits(model, ngl, prompt, toks)
        assert c.offload is not None and c.offload.device != "CUDA simulator"
        d = np.abs(got - ref)
        assert d.max() < 2.0 and d.mean() < 0.3, (ngl, d.max(), d.mean())
        assert np.all((got.argmax(-1) == ref.argmax(-1)) | ~sure), ngl


PROMPT_REAL = [1, 504, 3458, 282, 4649, 314, 260, 1789, 1069, 30, 378, 2175, 28, 314, 260, 1155]  # > 8: GEMM


def test_smollm2_real_file_on_a_gpu(request):
    _real_gpu()
    real_check(request.getfixturevalue("smollm2_path"), PROMPT_REAL)


def test_gemma3_real_file_on_a_gpu(request):
    _real_gpu()
    real_check(request.getfixturevalue("gemma3_path"), [2, *PROMPT_REAL[1:]])
