"""Tiny random-weight models of every family without a small real file, checked against Hugging Face
transformers (an independent implementation, test-only) running the same weights.

For each family and each file type (F32, F16, Q8_0), the HF model runs with the weights exactly as
the file stores them (F16-rounded; Q8_0 quantized and dequantized), and llamapy loads the file written
by our ``GGUFWriter`` (tensors converted as llama.cpp's convert_hf_to_gguf.py does). All positions'
logits are compared as ``max |llamapy - hf| / max |hf|``.

Tolerances:
- float files (F32, F16), f32 KV cache: ``FLOAT_TOL`` = 1e-3 (issue 4's bound); only float32
  summation order differs, which measures ~1e-6.
- the Q8_0 file, f32 KV cache: the weights are identical on both sides, so the only legitimate
  difference is the kernel rounding its *activations* to 8 bits per block of 32, as llama.cpp's q8_0
  dot product does. The bound is measured, per family: ``Q8_MARGIN`` (2) times the deviation that
  rounding every linear layer's input to Q8_0 causes in the HF model (5e-3..8e-2 on these tiny
  random models; never below ``FLOAT_TOL``). A wrong block layout or scale misses by O(1).
- the default f16 KV cache adds K/V rounding to half precision (2^-11 relative per element, amplified
  by the peaked attention of these models; measured 1.5e-4..2.2e-3, qwen2's large q/k biases the
  most): ``F16_KV_TOL`` = 5e-3.

``test_mutation_is_detected`` shows the comparison can fail: files with one convention broken (no q/k
row permutation, llama3 rope factors dropped, sliding window off, soft-capping off, two rope bases
merged, one expert used instead of two, fused gate|up swapped...) must miss the oracle by far more than the tolerance.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llamapy.batch import Batch  # noqa: E402
from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.ggml import quants  # noqa: E402
from llamapy.ggml.types import GGMLType  # noqa: E402
from llamapy.gguf import GGUFReader  # noqa: E402
from llamapy.model.model import Model  # noqa: E402
from tests.model import hf_tiny  # noqa: E402
from tests.model.hf_tiny import FAMILIES, TinyModel  # noqa: E402

FLOAT_TOL = 1e-3
Q8_MARGIN = 2.0
F16_KV_TOL = 5e-3
MUTATION_MIN = 2e-2  # a broken convention must miss by at least this (20x FLOAT_TOL)

FTYPES = [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0]
N_PROMPT = 20
# families known not to match HF: {name: the exact discrepancy} (strict xfail); none at present
XFAIL: dict[str, str] = {}


def _params(names: list[str]) -> list[Any]:
    return [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=XFAIL[n])) if n in XFAIL else n
        for n in names
    ]


_torch_threads = pytest.fixture(scope="module", autouse=True)(hf_tiny.one_torch_thread)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TinyModel]:
    return hf_tiny.family_models(tmp_path_factory.mktemp("hf_oracle"))


def _tokens(name: str, n: int = N_PROMPT) -> list[int]:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return [int(t) for t in rng.integers(0, hf_tiny.N_VOCAB, n)]


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.isfinite(got).all()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _context(path: Path, kv: str = "f32", n_ctx: int = 256) -> Context:
    return Context(Model.load(path), ContextParams(n_ctx=n_ctx, type_k=kv, type_v=kv))


def _llamapy_logits(path: Path, tokens: list[int], kv: str = "f32") -> np.ndarray:
    ctx = _context(path, kv)
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    return ctx.get_logits().copy()


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ftype", FTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("name", _params(hf_tiny.causal_lm_families()))
def test_logits_match_hf(tiny: Callable[[str], TinyModel], name: str, ftype: GGMLType) -> None:
    tm = tiny(name)
    tokens = _tokens(name)
    ref = tm.logits(tokens, ftype)
    got = _llamapy_logits(tm.write(ftype), tokens)
    tol = FLOAT_TOL
    if ftype == GGMLType.Q8_0:
        tol = max(FLOAT_TOL, Q8_MARGIN * _rel(tm.logits(tokens, ftype, q8_activations=True), ref))
    err = _rel(got, ref)
    print(f"{name} {ftype.name}: rel {err:.2e} < {tol:.1e} (max |logit| {np.abs(ref).max():.1f})")
    assert err < tol, f"{name} {ftype.name}: max |diff| / max |logit| = {err:.3e} >= {tol}"
    # the same argmax wherever HF's top-2 margin is clear
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 10 * tol * np.abs(ref).max()
    assert (got.argmax(-1)[clear] == ref.argmax(-1)[clear]).all()


@pytest.mark.parametrize("name", _params(hf_tiny.causal_lm_families()))
def test_incremental_decode_matches_one_shot(tiny: Callable[[str], TinyModel], name: str) -> None:
    """Prompt, then one token at a time through the KV cache == one batch == HF."""
    tm = tiny(name)
    tokens = _tokens(name)
    path = tm.write(GGMLType.F32)
    one_shot = _llamapy_logits(path, tokens)
    ctx = _context(path)
    n0 = 12
    ctx.decode(Batch.from_tokens(tokens[:n0], logits_all=True))
    rows = [ctx.get_logits().copy()]
    for t in tokens[n0:]:
        ctx.decode(Batch.from_tokens([t]))
        rows.append(ctx.get_logits().copy())
    steps = np.concatenate(rows)
    assert _rel(steps, one_shot) < 1e-4
    assert _rel(steps, tm.logits(tokens, GGMLType.F32)) < FLOAT_TOL
    # the same prompt in ubatches of 7 (sliding-window caches see their window cross ubatches)
    ctx = Context(Model.load(path), ContextParams(n_ctx=256, n_ubatch=7, type_k="f32", type_v="f32"))
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    assert _rel(ctx.get_logits(), one_shot) < 1e-4


@pytest.mark.parametrize(
    "name", _params(["llama", "qwen3moe", "gemma2", "gemma3", "qwen2moe", "cohere2", "gpt2"])
)
def test_two_sequences_in_one_batch(tiny: Callable[[str], TinyModel], name: str) -> None:
    """Two interleaved sequences of different lengths in one batch attend only to themselves; then a
    step of each continues its own cache (the mask per sequence, with sliding windows for gemma)."""
    tm = tiny(name)
    a, b = _tokens(name, 18), _tokens(name + "/b", 13)
    ctx = Context(
        Model.load(tm.write(GGMLType.F32)), ContextParams(n_ctx=256, n_seq_max=2, type_k="f32", type_v="f32")
    )
    batch = Batch()
    order = sorted([(i, 0) for i in range(len(a) - 1)] + [(i, 1) for i in range(len(b) - 1)])
    for i, seq in order:
        batch.add((a, b)[seq][i], i, [seq], True)
    ctx.decode(batch)
    got = ctx.get_logits()
    ref_a, ref_b = tm.logits(a, GGMLType.F32), tm.logits(b, GGMLType.F32)
    rows_a = [k for k, (_, seq) in enumerate(order) if seq == 0]
    rows_b = [k for k, (_, seq) in enumerate(order) if seq == 1]
    assert _rel(got[rows_a], ref_a[:-1]) < FLOAT_TOL
    assert _rel(got[rows_b], ref_b[:-1]) < FLOAT_TOL
    step = Batch()
    step.add(a[-1], len(a) - 1, [0], True)
    step.add(b[-1], len(b) - 1, [1], True)
    ctx.decode(step)
    last = ctx.get_logits()
    assert _rel(last[0], ref_a[-1]) < FLOAT_TOL
    assert _rel(last[1], ref_b[-1]) < FLOAT_TOL


@pytest.mark.parametrize("name", _params(["llama", "gemma2", "gemma3", "cohere2"]))
def test_seq_rm_suffix_then_new_tokens(tiny: Callable[[str], TinyModel], name: str) -> None:
    """Drop the cache's last tokens and continue differently: the same as a fresh run (HF)."""
    tm = tiny(name)
    tokens, other = _tokens(name), _tokens(name + "/other", 6)
    ctx = _context(tm.write(GGMLType.F32))
    ctx.decode(Batch.from_tokens(tokens))
    keep = 12
    assert ctx.memory.seq_rm(0, keep, -1)
    assert ctx.memory.seq_pos_max(0) == keep - 1
    ctx.decode(Batch.from_tokens(other, logits_all=True))
    ref = tm.logits(tokens[:keep] + other, GGMLType.F32)[keep:]
    assert _rel(ctx.get_logits(), ref) < FLOAT_TOL


def test_phi3_longrope_long_context(tiny: Callable[[str], TinyModel]) -> None:
    """Beyond the original context both sides switch to the long factors (HF by sequence length,
    llamapy by n_ctx, as llama.cpp); the short-context case is in ``test_logits_match_hf``."""
    tm = tiny("phi3-longrope")
    tokens = _tokens("phi3-longrope", hf_tiny.N_CTX + 44)
    ctx = _context(tm.write(GGMLType.F32), n_ctx=2 * hf_tiny.N_CTX)
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    assert _rel(ctx.get_logits(), tm.logits(tokens, GGMLType.F32)) < FLOAT_TOL


@pytest.mark.parametrize(
    "name",
    _params(
        ["llama", "qwen2", "qwen3moe", "gemma2", "gemma3", "phi3", "qwen2moe", "stablelm", "cohere2", "gpt2"]
    ),
)
def test_default_f16_kv_cache(tiny: Callable[[str], TinyModel], name: str) -> None:
    tm = tiny(name)
    tokens = _tokens(name)
    got = _llamapy_logits(tm.write(GGMLType.F16), tokens, kv="f16")
    assert _rel(got, tm.logits(tokens, GGMLType.F16)) < F16_KV_TOL


@pytest.mark.parametrize("ftype", FTYPES, ids=lambda t: t.name)
def test_file_stores_the_effective_weights(tiny: Callable[[str], TinyModel], ftype: GGMLType) -> None:
    """What llamapy reads back is bit-for-bit the converted weights the oracle runs (re-quantizing an
    already quantized tensor is exact), with llama.cpp's types: matrices in the file type, norms,
    biases, the MoE router and rope factors in F32."""
    for name in ("llama3", "qwen3moe", "gemma2", "phi3", "granitemoe", "qwen2moe", "stablelm", "gpt2"):
        tm = tiny(name)
        path = tm.write(ftype)
        expected = tm.tensors[ftype]
        r = GGUFReader(path)
        assert set(r.tensor_index) == set(expected)
        for tname, info in r.tensor_index.items():
            want = hf_tiny.stored_type(tname, expected[tname], ftype)
            assert info.ggml_type == want, (name, tname, info.ggml_type)
            got = quants.dequantize(info.array(), info.ggml_type).reshape(info.shape)
            np.testing.assert_array_equal(got, expected[tname], err_msg=f"{name} {tname}")


def test_q8_0_weights_vs_float(tiny: Callable[[str], TinyModel]) -> None:
    """The Q8_0 file against HF with the *unrounded* weights: the error is the weights' quantization
    (logged; bounded loosely so a gross mistake shows). MoE routing may flip with quantized weights."""
    for name in ("llama", "qwen2", "gemma3"):
        tm = tiny(name)
        tokens = _tokens(name)
        err = _rel(_llamapy_logits(tm.write(GGMLType.Q8_0), tokens), tm.logits(tokens, GGMLType.F32))
        print(f"{name} Q8_0 vs float weights: rel {err:.2e}")
        assert 1e-4 < err < 0.3


# ---------------------------------------------------------------------------------------------
# mutations: a file with one convention broken must miss the oracle


def _drop(key: str) -> Callable[[dict[str, Any], dict[str, np.ndarray]], None]:
    def f(md: dict[str, Any], t: dict[str, np.ndarray]) -> None:
        if key in md:
            del md[key]
        else:
            del t[key]

    return f


def _set(key: str, value: Any) -> Callable[[dict[str, Any], dict[str, np.ndarray]], None]:
    def f(md: dict[str, Any], t: dict[str, np.ndarray]) -> None:
        md[key] = value

    return f


def _fill(suffixes: tuple[str, ...], value: float) -> Callable[[dict[str, Any], dict[str, np.ndarray]], None]:
    def f(md: dict[str, Any], t: dict[str, np.ndarray]) -> None:
        for k in list(t):
            if k.endswith(suffixes):
                t[k] = np.full_like(t[k], value)

    return f


def _unpermute(md: dict[str, Any], t: dict[str, np.ndarray]) -> None:
    # undo convert's q/k row permutation (HF's rotate-half layout fed to ggml's normal rope)
    for k in list(t):
        if k.endswith(("attn_q.weight", "attn_k.weight")):
            n = md["llama.attention.head_count" if "attn_q" in k else "llama.attention.head_count_kv"]
            w = t[k]
            t[k] = w.reshape(n, w.shape[0] // n // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def _norms_minus_one(md: dict[str, Any], t: dict[str, np.ndarray]) -> None:
    for k in list(t):
        if k.endswith("norm.weight"):
            t[k] = t[k] - np.float32(1.0)


def _swap_fused_ffn(md: dict[str, Any], t: dict[str, np.ndarray]) -> None:
    for k in list(t):
        if k.endswith("ffn_up.weight"):
            gate, up = np.split(t[k], 2)
            t[k] = np.concatenate([up, gate])


def _swap_longrope(md: dict[str, Any], t: dict[str, np.ndarray]) -> None:
    t["rope_factors_long.weight"], t["rope_factors_short.weight"] = (
        t["rope_factors_short.weight"],
        t["rope_factors_long.weight"],
    )


MUTATIONS: dict[str, tuple[str, Callable[[dict[str, Any], dict[str, np.ndarray]], None]]] = {
    "llama-no-permute": ("llama", _unpermute),
    "llama3-no-rope-factors": ("llama3", _drop("rope_freqs.weight")),
    "qwen2-zero-qkv-bias": ("qwen2", _fill(("attn_q.bias", "attn_k.bias"), 0.0)),
    "qwen3-no-qk-norm-weight": ("qwen3", _fill(("attn_q_norm.weight", "attn_k_norm.weight"), 1.0)),
    "qwen3moe-one-expert": ("qwen3moe", _set("qwen3moe.expert_used_count", 1)),
    "gemma-norms-without-plus-one": ("gemma", _norms_minus_one),
    "gemma2-no-sliding-window": ("gemma2", _set("gemma2.attention.sliding_window", 4096)),
    "gemma2-no-final-softcap": ("gemma2", _set("gemma2.final_logit_softcapping", 1e6)),
    "gemma2-no-attn-softcap": ("gemma2", _set("gemma2.attn_logit_softcapping", 1e6)),
    "gemma3-one-rope-base": ("gemma3", _set("gemma3.rope.freq_base_swa", 1e6)),
    "gemma3-no-sliding-window": ("gemma3", _set("gemma3.attention.sliding_window", 4096)),
    "phi3-fused-ffn-swapped": ("phi3", _swap_fused_ffn),
    "phi3-longrope-long-factors-at-short-context": ("phi3-longrope", _swap_longrope),
    "gemma3-linear-unscaled": ("gemma3-linear", _set("gemma3.rope.scaling.factor", 1.0)),
    "olmo2-no-post-norm-weights": (
        "olmo2",
        _fill(("post_attention_norm.weight", "post_ffw_norm.weight"), 1.0),
    ),
    "olmo2-no-qk-norm-weight": ("olmo2", _fill(("attn_q_norm.weight", "attn_k_norm.weight"), 1.0)),
    "granite-default-attention-scale": ("granite", _set("granite.attention.scale", 0.0)),
    "granite-no-embedding-scale": ("granite", _set("granite.embedding_scale", 1.0)),
    "granite-no-residual-scale": ("granite", _set("granite.residual_scale", 1.0)),
    "granite-no-logit-scale": ("granite", _set("granite.logit_scale", 1.0)),
    "granitemoe-one-expert": ("granitemoe", _set("granitemoe.expert_used_count", 1)),
    "qwen2moe-one-expert": ("qwen2moe", _set("qwen2moe.expert_used_count", 1)),
    "qwen2moe-no-shared-expert": ("qwen2moe", _fill(("ffn_down_shexp.weight",), 0.0)),
    "qwen2moe-shared-expert-ungated": ("qwen2moe", _fill(("ffn_gate_inp_shexp.weight",), 0.0)),
    "olmoe-one-expert": ("olmoe", _set("olmoe.expert_used_count", 1)),
    "olmoe-no-qk-norm-weight": ("olmoe", _fill(("attn_q_norm.weight", "attn_k_norm.weight"), 1.0)),
    "starcoder2-no-norm-biases": ("starcoder2", _fill(("norm.bias",), 0.0)),
    "starcoder2-no-ffn-biases": ("starcoder2", _fill(("ffn_up.bias", "ffn_down.bias"), 0.0)),
    "stablelm-full-rotary": ("stablelm", _set("stablelm.rope.dimension_count", 16)),
    "stablelm-no-qk-norm-weight": ("stablelm", _fill(("attn_q_norm.weight", "attn_k_norm.weight"), 1.0)),
    "command-r-no-logit-scale": ("command-r", _set("command-r.logit_scale", 1.0)),
    "cohere2-no-sliding-window": ("cohere2", _set("cohere2.attention.sliding_window", 4096)),
    "gpt2-no-position-embeddings": ("gpt2", _fill(("position_embd.weight",), 0.0)),
    "nemotron_h_moe-one-expert": ("nemotron_h_moe", _set("nemotron_h_moe.expert_used_count", 1)),
    "nemotron_h_moe-no-selection-bias": ("nemotron_h_moe", _fill(("exp_probs_b.bias",), 0.0)),
    "nemotron_h_moe-no-routed-scale": ("nemotron_h_moe", _set("nemotron_h_moe.expert_weights_scale", 1.0)),
    "nemotron_h_moe-no-weights-norm": ("nemotron_h_moe", _set("nemotron_h_moe.expert_weights_norm", False)),
    "nemotron_h_moe-no-shared-expert": ("nemotron_h_moe", _fill(("ffn_down_shexp.weight",), 0.0)),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mutation_is_detected(tiny: Callable[[str], TinyModel], mutation: str) -> None:
    name, mutate = MUTATIONS[mutation]
    tm = tiny(name)
    fam = FAMILIES[name]
    cfg = tm.hf.config
    md = hf_tiny.metadata(fam, cfg, GGMLType.F32)
    tensors = dict(hf_tiny.convert(fam, cfg, tm.state))
    mutate(md, tensors)
    path = hf_tiny.write_gguf(tm.tmpdir / f"mut-{mutation}.gguf", fam.arch, md, tensors, GGMLType.F32)
    tokens = _tokens(name)
    err = _rel(_llamapy_logits(path, tokens), tm.logits(tokens, GGMLType.F32))
    print(f"{mutation}: rel {err:.2e}")
    assert err > MUTATION_MIN, f"{mutation}: the broken file still matches HF (rel {err:.2e})"


def test_smollm3_nope_layers_are_needed(tiny: Callable[[str], TinyModel]) -> None:
    """SmolLM3's file carries no NoPE key (llama.cpp fixes every 4th layer): the same file run with
    rope on every layer (plain LLaMA's ``layer_rope``) misses HF by far."""
    from llamapy.model.arch.llama import Llama

    tm = tiny("smollm3")
    tokens = _tokens("smollm3")
    ctx = _context(tm.write(GGMLType.F32))
    ctx.model.impl.__class__ = Llama
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    err = _rel(ctx.get_logits(), tm.logits(tokens, GGMLType.F32))
    print(f"smollm3 with rope on every layer: rel {err:.2e}")
    assert err > MUTATION_MIN


def test_cohere2_global_layers_are_nope(tiny: Callable[[str], TinyModel]) -> None:
    """Cohere 2 ropes only its sliding-window layers: the same file with rope on the global layer too
    (the base ``Architecture.layer_rope``) misses HF by far."""
    from llamapy.model.arch import Architecture
    from llamapy.model.arch.command_r import CommandR

    class RopeEverywhere(CommandR):
        layer_rope = Architecture.layer_rope

    tm = tiny("cohere2")
    tokens = _tokens("cohere2")
    ctx = _context(tm.write(GGMLType.F32))
    ctx.model.impl.__class__ = RopeEverywhere
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    err = _rel(ctx.get_logits(), tm.logits(tokens, GGMLType.F32))
    print(f"cohere2 with rope on the global layers: rel {err:.2e}")
    assert err > MUTATION_MIN
