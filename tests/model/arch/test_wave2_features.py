"""Each wave-2 family's distinctive feature matters: a file with that feature broken (a key changed,
a tensor zeroed) must miss transformers by far more than the oracle's tolerance, while the intact
file matches it (``tests/model/test_hf_oracle.py`` runs the full oracle on every family)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llamapy.batch import Batch  # noqa: E402
from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.ggml.types import GGMLType  # noqa: E402
from llamapy.model.model import Model  # noqa: E402
from tests.model import hf_tiny  # noqa: E402
from tests.model.hf_tiny import FAMILIES, TinyModel  # noqa: E402

FLOAT_TOL = 1e-3
MUTATION_MIN = 2e-2
N_PROMPT = 20

Mutation = Callable[[dict[str, Any], dict[str, np.ndarray]], None]


@pytest.fixture(scope="module", autouse=True)
def _torch_threads() -> Any:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TinyModel]:
    cache: dict[str, TinyModel] = {}
    root = tmp_path_factory.mktemp("wave2")

    def get(name: str) -> TinyModel:
        if name not in cache:
            cache[name] = hf_tiny.make_tiny(FAMILIES[name], root, seed=zlib.crc32(name.encode()) % 10_000)
        return cache[name]

    return get


def _tokens(name: str, n: int = N_PROMPT) -> list[int]:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return [int(t) for t in rng.integers(0, hf_tiny.N_VOCAB, n)]


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape and np.isfinite(got).all()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _logits(path: Any, tokens: list[int], **kw: Any) -> np.ndarray:
    ctx = Context(Model.load(path), ContextParams(n_ctx=256, type_k="f32", type_v="f32", **kw))
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    return ctx.get_logits().copy()


def _set(key: str, value: Any) -> Mutation:
    def f(md: dict[str, Any], t: dict[str, np.ndarray]) -> None:
        md[key] = value

    return f


def _drop(key: str) -> Mutation:
    def f(md: dict[str, Any], t: dict[str, np.ndarray]) -> None:
        md.pop(key, None)
        t.pop(key, None)

    return f


def _fill(suffixes: tuple[str, ...], value: float) -> Mutation:
    def f(md: dict[str, Any], t: dict[str, np.ndarray]) -> None:
        for k in list(t):
            if k.endswith(suffixes):
                t[k] = np.full_like(t[k], value)

    return f


MUTATIONS: dict[str, tuple[str, Mutation]] = {
    "mixtral-one-expert": ("mixtral", _set("llama.expert_used_count", 1)),
    "mistral3-no-temperature-tuning": ("mistral3", _drop("mistral3.attention.temperature_scale")),
    "mistral3-no-yarn": ("mistral3", _drop("mistral3.rope.scaling.type")),
    "glm4-full-rotary": ("glm4", _set("glm4.rope.dimension_count", 16)),
    "glm4-no-post-norm-weights": ("glm4", _fill(("post_attention_norm.weight", "post_ffw_norm.weight"), 1.0)),
    "glm4moe-no-selection-bias": ("glm4moe", _fill(("exp_probs_b.bias",), 0.0)),
    "glm4moe-unscaled-weights": ("glm4moe", _set("glm4moe.expert_weights_scale", 1.0)),
    "glm4moe-softmax-gating": ("glm4moe", _set("glm4moe.expert_gating_func", 1)),
    "glm4moe-no-shared-expert": ("glm4moe", _fill(("ffn_down_shexp.weight",), 0.0)),
    "deepseek2-all-groups": ("deepseek2", _set("deepseek2.expert_group_used_count", 4)),
    "deepseek2-no-selection-bias": ("deepseek2", _fill(("exp_probs_b.bias",), 0.0)),
    "deepseek2-no-yarn-mscale": ("deepseek2", _drop("deepseek2.rope.scaling.yarn_log_multiplier")),
    "deepseek2-no-yarn": ("deepseek2", _drop("deepseek2.rope.scaling.type")),
    "deepseek2-no-q-a-norm": ("deepseek2", _fill(("attn_q_a_norm.weight",), 1.0)),
    "deepseek2-mha-one-expert": ("deepseek2-mha", _set("deepseek2.expert_used_count", 1)),
    "deepseek2-mha-no-kv-a-norm": ("deepseek2-mha", _fill(("attn_kv_a_norm.weight",), 1.0)),
    "exaone4-no-sliding-window": ("exaone4", _set("exaone4.attention.sliding_window", 4096)),
    "exaone4-no-qk-norm-weight": ("exaone4", _fill(("attn_q_norm.weight", "attn_k_norm.weight"), 1.0)),
    "ernie4_5-moe-no-selection-bias": ("ernie4_5-moe", _fill(("exp_probs_b.bias",), 0.0)),
    "ernie4_5-moe-one-expert": ("ernie4_5-moe", _set("ernie4_5-moe.expert_used_count", 1)),
    "ernie4_5-moe-no-shared-expert": ("ernie4_5-moe", _fill(("ffn_down_shexp.weight",), 0.0)),
    "seed_oss-zero-qk-bias": ("seed_oss", _fill(("attn_q.bias", "attn_k.bias"), 0.0)),
    "llama4-no-temperature-tuning": ("llama4", _set("llama4.attention.temperature_scale", 0.0)),
    "llama4-no-shared-expert": ("llama4", _fill(("ffn_down_shexp.weight",), 0.0)),
    "falcon-40b-one-norm": ("falcon-40b", _fill(("attn_norm_2.weight",), 1.0)),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_broken_feature_misses_hf(tiny: Callable[[str], TinyModel], mutation: str) -> None:
    name, mutate = MUTATIONS[mutation]
    tm = tiny(name)
    fam, cfg = FAMILIES[name], tm.hf.config
    tokens = _tokens(name)
    ref = tm.logits(tokens, GGMLType.F32)
    assert _rel(_logits(tm.write(GGMLType.F32), tokens), ref) < FLOAT_TOL
    md = hf_tiny.metadata(fam, cfg, GGMLType.F32)
    tensors = dict(hf_tiny.convert(fam, cfg, tm.state))
    mutate(md, tensors)
    path = hf_tiny.write_gguf(tm.tmpdir / f"mut-{mutation}.gguf", fam.arch, md, tensors, GGMLType.F32)
    err = _rel(_logits(path, tokens), ref)
    print(f"{mutation}: rel {err:.2e}")
    assert err > MUTATION_MIN, f"{mutation}: the broken file still matches HF (rel {err:.2e})"


def test_deepseek2_mla_cache_holds_k_only(tiny: Callable[[str], TinyModel]) -> None:
    """The absorbed path's cache: one row of kv_lora_rank + rope dims per token and layer, no V; the
    older layout caches per-head K and V. Both give HF's logits (test_hf_oracle), and each other's."""
    mla, mha = tiny("deepseek2"), tiny("deepseek2-mha")
    cfg = mla.hf.config
    ctx = Context(Model.load(mla.write(GGMLType.F32)), ContextParams(n_ctx=64, type_k="f32", type_v="f32"))
    assert ctx.model.hparams.v_in_k and ctx.model.hparams.n_layer == cfg.num_hidden_layers  # MTP skipped
    (cache,) = ctx.memory.caches
    for il in range(cfg.num_hidden_layers):
        assert cache.k[il].shape[1] == cfg.kv_lora_rank + cfg.qk_rope_head_dim
        assert cache.v[il].nbytes == 0
    ctx = Context(Model.load(mha.write(GGMLType.F32)), ContextParams(n_ctx=64, type_k="f32", type_v="f32"))
    (cache,) = ctx.memory.caches
    H = cfg.num_attention_heads
    assert cache.k[0].shape[1] == H * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    assert cache.v[0].shape[1] == H * cfg.v_head_dim


@pytest.mark.parametrize(
    "name",
    [
        "deepseek2",
        "deepseek2-mha",
        "glm4",
        "mixtral",
    ],  # (not mistral3: its temperature tuning makes the hidden states depend on absolute positions)
)
def test_k_shift_equals_a_fresh_run(tiny: Callable[[str], TinyModel], name: str) -> None:
    """Moving the cached positions by +5 then decoding equals decoding at positions 5.. from the start
    (the K-shift rotates exactly the rope part of each cached row: MLA's k_pe, GLM's partial rotary)."""
    tm = tiny(name)
    tokens = _tokens(name, 10)
    path = tm.write(GGMLType.F32)
    params = ContextParams(n_ctx=64, type_k="f32", type_v="f32")
    fresh = Context(Model.load(path), params)
    fresh.decode(Batch.from_tokens(tokens, pos0=5))
    ctx = Context(Model.load(path), params)
    ctx.decode(Batch.from_tokens(tokens[:-1]))
    ctx.memory.seq_add(0, 0, -1, 5)
    ctx.decode(Batch.from_tokens(tokens[-1:], pos0=len(tokens) - 1 + 5))
    assert _rel(ctx.get_logits_ith(-1), fresh.get_logits_ith(-1)) < 1e-4


def test_nextn_layers_must_leave_a_trunk(tiny: Callable[[str], TinyModel]) -> None:
    from llamapy.model.hparams import ModelLoadError

    tm = tiny("glm4moe")
    fam, cfg = FAMILIES["glm4moe"], tm.hf.config
    md = hf_tiny.metadata(fam, cfg, GGMLType.F32)
    md["glm4moe.nextn_predict_layers"] = md["glm4moe.block_count"]
    tensors = dict(hf_tiny.convert(fam, cfg, tm.state))
    path = hf_tiny.write_gguf(tm.tmpdir / "bad-nextn.gguf", fam.arch, md, tensors, GGMLType.F32)
    with pytest.raises(ModelLoadError, match="nextn_predict_layers"):
        Model.load(path)


def test_exaone4_global_layers_are_nope(tiny: Callable[[str], TinyModel]) -> None:
    """With a window, EXAONE 4 ropes only its window layers: rope on the global layer too misses HF."""
    from llamapy.model.arch import Architecture
    from llamapy.model.arch.exaone4 import Exaone4

    class RopeEverywhere(Exaone4):
        layer_rope = Architecture.layer_rope

    tm = tiny("exaone4")
    tokens = _tokens("exaone4")
    ctx = Context(Model.load(tm.write(GGMLType.F32)), ContextParams(n_ctx=256, type_k="f32", type_v="f32"))
    ctx.model.impl.__class__ = RopeEverywhere
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    assert _rel(ctx.get_logits(), tm.logits(tokens, GGMLType.F32)) > MUTATION_MIN


@pytest.mark.parametrize("change", ["rope-everywhere", "no-kq-norm"])
def test_llama4_nope_layers_and_kq_norm_are_needed(tiny: Callable[[str], TinyModel], change: str) -> None:
    from llamapy.model.arch import Architecture
    from llamapy.model.arch.llama4 import Llama4

    class Changed(Llama4):
        if change == "rope-everywhere":
            layer_rope = Architecture.layer_rope
        else:
            kq_norm = False

    tm = tiny("llama4")
    tokens = _tokens("llama4")
    ctx = Context(Model.load(tm.write(GGMLType.F32)), ContextParams(n_ctx=256, type_k="f32", type_v="f32"))
    ctx.model.impl.__class__ = Changed
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    assert _rel(ctx.get_logits(), tm.logits(tokens, GGMLType.F32)) > MUTATION_MIN


# (llama4 beyond one chunk is no longer refused: chunked attention is tested against HF in
# tests/model/arch/test_alibi_chunked.py)


@pytest.mark.parametrize("name", ["deepseek2", "deepseek2-mha", "glm4moe", "llama4", "falcon-40b"])
def test_default_f16_kv_cache(tiny: Callable[[str], TinyModel], name: str) -> None:
    """The default f16 cache (MLA: V read as f16 from inside the K rows) within test_hf_oracle's bound."""
    tm = tiny(name)
    tokens = _tokens(name)
    ctx = Context(Model.load(tm.write(GGMLType.F16)), ContextParams(n_ctx=256))
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    assert _rel(ctx.get_logits(), tm.logits(tokens, GGMLType.F16)) < 5e-3


def test_deepseek2_mla_refuses_a_quantized_cache(tiny: Callable[[str], TinyModel]) -> None:
    from llamapy.errors import LlamapyError

    tm = tiny("deepseek2")
    model = Model.load(tm.write(GGMLType.F32))
    with pytest.raises(LlamapyError, match="q8_0"):  # (here the cache refuses the 80-wide rows first)
        ctx = Context(model, ContextParams(n_ctx=64, type_k="q8_0", type_v="f16"))
        ctx.decode(Batch.from_tokens(_tokens("deepseek2", 4)))
    model.hparams.n_embd_head_k = 96  # a 96-wide row fits q8_0's blocks: the graph refuses the cache
    with pytest.raises(LlamapyError, match="K-only cache"):
        ctx = Context(model, ContextParams(n_ctx=64, type_k="q8_0", type_v="f16"))
        ctx.decode(Batch.from_tokens(_tokens("deepseek2", 4)))
