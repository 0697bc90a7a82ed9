"""Context extension as llama.cpp's context parameters (``--rope-scaling``, ``--rope-scale``,
``--rope-freq-base``, ``--yarn-*``: ``ContextParams`` / ``llamapy.context.rope_hparams``) and metadata
overrides at load (``--override-kv``: ``Model.load(kv_overrides=...)``).

The oracle: a tiny random-weight llama / qwen2 written WITHOUT any rope scaling metadata, run with the
context's overrides, matches transformers' model with the same weights and the same ``rope_parameters``
(YaRN x4 over an original context of 32, linear x2, another base) at positions well past the original
context, and differs from the run without overrides by far more than the tolerance. The same tensors
written WITH the scaling in their metadata give the same logits, bit for bit, as the overrides.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from llamapy.batch import Batch  # noqa: E402
from llamapy.context import Context, ContextParamError, ContextParams, rope_hparams  # noqa: E402
from llamapy.ggml.types import GGMLType  # noqa: E402
from llamapy.gguf.overrides import KVOverrideError  # noqa: E402
from llamapy.model.hparams import ModelLoadError  # noqa: E402
from llamapy.model.model import Model  # noqa: E402
from tests.model import hf_tiny  # noqa: E402
from tests.model.hf_tiny import TinyModel  # noqa: E402

FLOAT_TOL = 1e-3  # test_hf_oracle's bound for F32 files with an f32 KV cache
MUTATION_MIN = 2e-2  # the run without the overrides must miss the scaled oracle by at least this
N_PROMPT = 96  # positions up to 95: three times the original context of the YaRN cases
F32 = GGMLType.F32


_torch_threads = pytest.fixture(scope="module", autouse=True)(hf_tiny.one_torch_thread)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TinyModel]:
    return hf_tiny.family_models(tmp_path_factory.mktemp("rope_overrides"))


def _tokens(n: int = N_PROMPT) -> list[int]:
    rng = np.random.default_rng(7)
    return [int(t) for t in rng.integers(0, hf_tiny.N_VOCAB, n)]


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape and np.isfinite(got).all()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _theta(tm: TinyModel) -> float:
    return float((tm.hf.config.rope_parameters or {}).get("rope_theta", 10000.0))


def _hf_scaled(tm: TinyModel, rope_parameters: dict[str, Any], tokens: list[int]) -> np.ndarray:
    """transformers' logits of ``tm``'s weights with ``rope_parameters`` in its config."""
    cfg = copy.deepcopy(tm.hf.config)
    cfg.rope_parameters = dict(rope_parameters)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", dtype=torch.float32
    )
    hf_tiny.load_state_dict(model, hf_tiny.effective_state_dict(tm.state, F32))
    model.eval()
    return hf_tiny.hf_logits(model, tokens)


def _logits(path: Path | Model, tokens: list[int], kv_overrides: Any = None, **rope: Any) -> np.ndarray:
    model = path if isinstance(path, Model) else Model.load(path, kv_overrides=kv_overrides)
    ctx = Context(model, ContextParams(n_ctx=256, type_k="f32", type_v="f32", **rope))
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    return ctx.get_logits().copy()


def _with_metadata(tm: TinyModel, tmp_path: Path, name: str, extra: dict[str, Any]) -> Path:
    """The same tensors as ``tm``'s F32 file, with ``extra`` metadata keys (``{arch}.`` prefixed)."""
    tm.write(F32)
    a = tm.family.arch
    md = hf_tiny.metadata(tm.family, tm.hf.config, F32)
    md.update({f"{a}.{k}": v for k, v in extra.items()})
    return hf_tiny.write_gguf(tmp_path / f"{name}.gguf", a, md, tm.tensors[F32], F32)


# family, HF rope_parameters (rope_theta added), the context's overrides, the same scaling as metadata
CASES = {
    "llama-yarn4": (
        "llama",
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        dict(rope_scaling_type="yarn", rope_freq_scale=0.25, yarn_orig_ctx=32),
        {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32},
    ),
    "qwen2-yarn4": (
        "qwen2",
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        dict(rope_scaling_type="yarn", rope_freq_scale=0.25, yarn_orig_ctx=32),
        {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32},
    ),
    # no --rope-scaling: a file that names no scaling type scales linearly (llama.cpp's default)
    "llama-linear2": (
        "llama",
        {"rope_type": "linear", "factor": 2.0},
        dict(rope_freq_scale=0.5),
        {"rope.scaling.type": "linear", "rope.scaling.factor": 2.0},
    ),
    "llama-base": (
        "llama",
        {"rope_type": "default", "rope_theta": 50000.0},
        dict(rope_freq_base=50000.0),
        {"rope.freq_base": 50000.0},
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", list(CASES))
def test_overrides_match_transformers_scaled_model(tiny: Callable[[str], TinyModel], case: str) -> None:
    family, rp, rope, _ = CASES[case]
    tm = tiny(family)
    tokens = _tokens()
    ref = _hf_scaled(tm, {"rope_theta": _theta(tm), **rp}, tokens)
    path = tm.write(F32)
    got = _logits(path, tokens, **rope)
    err = _rel(got, ref)
    assert err < FLOAT_TOL, f"{case}: max |diff| / max |logit| = {err:.3e}"
    plain = _logits(path, tokens)  # the same file without the overrides: it must miss the scaled oracle
    miss = _rel(plain, ref)
    print(f"{case}: rel {err:.2e} < {FLOAT_TOL:.0e}; without the overrides {miss:.2e}")
    assert miss > MUTATION_MIN, f"{case}: the run without overrides is within {miss:.2e} of the scaled model"
    # and the scaled oracle differs from the unscaled one past the original context (positions 32..95)
    unscaled = hf_tiny.hf_logits(tm.hf, tokens)
    assert _rel(plain[40:], unscaled[40:]) < FLOAT_TOL


@pytest.mark.parametrize("case", list(CASES))
def test_overrides_equal_the_same_scaling_in_metadata(
    tiny: Callable[[str], TinyModel], case: str, tmp_path: Path
) -> None:
    """The file with the scaling in its metadata and the plain file with the overrides: the same bytes
    of logits (and the same through kv_overrides, which add the keys the plain file lacks)."""
    family, _, rope, meta = CASES[case]
    tm = tiny(family)
    tokens = _tokens()
    by_meta = _logits(_with_metadata(tm, tmp_path, case, meta), tokens)
    by_ctx = _logits(tm.write(F32), tokens, **rope)
    assert np.array_equal(by_meta, by_ctx)
    arch = tm.family.arch
    by_kv = _logits(tm.write(F32), tokens, kv_overrides={f"{arch}.{k}": v for k, v in meta.items()})
    assert np.array_equal(by_meta, by_kv)


def test_yarn_orig_ctx_defaults_to_the_training_context(tiny: Callable[[str], TinyModel]) -> None:
    """Without --yarn-orig-ctx YaRN's original context is the model's (here the training context, which
    a kv override of ``context_length`` sets: the two runs are the same computation)."""
    tm = tiny("llama")
    tokens = _tokens(48)
    path = tm.write(F32)
    by_orig = _logits(path, tokens, rope_scaling_type="yarn", rope_freq_scale=0.25, yarn_orig_ctx=32)
    by_train = _logits(
        path,
        tokens,
        kv_overrides={"llama.context_length": 32},
        rope_scaling_type="yarn",
        rope_freq_scale=0.25,
    )
    assert np.array_equal(by_orig, by_train)
    by_default = _logits(path, tokens, rope_scaling_type="yarn", rope_freq_scale=0.25)  # orig = 256
    assert _rel(by_default, by_orig) > MUTATION_MIN


def test_k_shift_uses_the_context_rope(tiny: Callable[[str], TinyModel]) -> None:
    """A context shift re-rotates the cached K with the context's rope (linear x2 here: a rotation by the
    shift's scaled angle): shifting a sequence's cells and evaluating after them equals evaluating at the
    shifted positions from scratch, and differs from the model's own rope."""
    tm = tiny("llama")
    model = Model.load(tm.write(F32))
    tokens = _tokens(21)

    def shifted(**rope: Any) -> np.ndarray:
        ctx = Context(model, ContextParams(n_ctx=256, type_k="f32", type_v="f32", **rope))
        ctx.decode(Batch(token=tokens[:20], pos=list(range(20)), seq_id=[[0]] * 20, logits=[False] * 20))
        ctx.memory.seq_add(0, 0, 20, 30)
        ctx.decode(Batch(token=[tokens[20]], pos=[50], seq_id=[[0]], logits=[True]))
        return ctx.get_logits()[-1:].copy()

    ref = Context(model, ContextParams(n_ctx=256, type_k="f32", type_v="f32", rope_freq_scale=0.5))
    ref.decode(Batch(token=tokens, pos=list(range(30, 51)), seq_id=[[0]] * 21, logits=[False] * 20 + [True]))
    assert _rel(shifted(rope_freq_scale=0.5), ref.get_logits()[-1:]) < 1e-4
    assert _rel(shifted(), ref.get_logits()[-1:]) > MUTATION_MIN


# ---------------------------------------------------------------------------------------------
# llama.cpp's cparams, field by field (no compute)


def _hp(tmp_path: Path, **meta: Any) -> Any:
    from tests.model.tiny import llama_config, random_llama_weights, write_gguf

    cfg = llama_config(n_layer=1, n_ctx=512)
    path = write_gguf(tmp_path / "m.gguf", "llama", cfg, random_llama_weights(cfg), extra_meta=meta)
    return Model.load(path).hparams


def test_rope_hparams_follow_llama_cpp_cparams(tmp_path: Path) -> None:
    plain = _hp(tmp_path)
    assert plain.rope_scaling_type == "linear"  # a file naming no type: llama.cpp's default
    assert rope_hparams(plain, ContextParams()) is None  # nothing set: the model's as they are
    assert rope_hparams(plain, ContextParams(rope_scaling_type=-1)) is None  # llama-cpp-python's unspecified
    hp = rope_hparams(plain, ContextParams(rope_freq_scale=0.25))  # linear: no extrapolation
    got = (hp.rope_freq_scale, hp.yarn_ext_factor, hp.rope_attn_factor, hp.n_ctx_orig_yarn)
    assert got == (0.25, 0.0, 1.0, 512)
    assert plain.rope_freq_scale == 1.0  # (a copy: the model's hparams stay)
    hp = rope_hparams(plain, ContextParams(rope_scaling_type=2, rope_freq_scale=0.25))  # 2: yarn
    assert (hp.rope_scaling_type, hp.yarn_ext_factor, hp.rope_attn_factor) == ("yarn", 1.0, 1.0)
    assert (hp.yarn_beta_fast, hp.yarn_beta_slow) == (32.0, 1.0)
    hp = rope_hparams(plain, ContextParams(rope_scaling_type="none", rope_freq_scale=0.25))
    assert (hp.rope_freq_scale, hp.yarn_ext_factor) == (1.0, 0.0)  # none: never scaled
    # --yarn-attn-factor is used where nothing extrapolates, and replaced by YaRN's magnitude where it does
    hp = rope_hparams(plain, ContextParams(rope_freq_scale=0.5, yarn_attn_factor=0.8))
    assert hp.rope_attn_factor == pytest.approx(0.8)
    hp = rope_hparams(
        plain, ContextParams(rope_scaling_type="yarn", rope_freq_scale=0.5, yarn_attn_factor=0.8)
    )
    assert hp.rope_attn_factor == 1.0
    hp = rope_hparams(plain, ContextParams(rope_scaling_type="yarn", yarn_ext_factor=0.5, yarn_beta_fast=16.0,
                                           yarn_beta_slow=2.0, yarn_orig_ctx=64, rope_freq_base=5e4))  # fmt: skip
    got = (hp.yarn_ext_factor, hp.yarn_beta_fast, hp.yarn_beta_slow, hp.n_ctx_orig_yarn)
    assert got == (0.5, 16.0, 2.0, 64)
    assert hp.rope_freq_base == 5e4
    assert hp.rope_freq_base_swa == plain.rope_freq_base_swa  # (sliding-window layers keep theirs)
    # YaRN compressing a context (freq scale > 1): llama.cpp's 1 / (1 + 0.1 ln(1/scale)) cancels nothing
    hp = rope_hparams(plain, ContextParams(rope_scaling_type="yarn", rope_freq_scale=2.0))
    assert hp.rope_attn_factor == pytest.approx(1.0 / (1.0 + 0.1 * np.log(0.5)))


def test_rope_hparams_from_a_yarn_file(tmp_path: Path) -> None:
    yarn = _hp(tmp_path, **{"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
                            "llama.rope.scaling.original_context_length": 64, "llama.rope.scaling.attn_factor": 0.9,
                            "llama.rope.scaling.yarn_beta_fast": 24.0})  # fmt: skip
    hp = rope_hparams(yarn, ContextParams(rope_scaling_type="yarn"))  # the file's, recomputed: the same
    for k in ("rope_freq_scale", "n_ctx_orig_yarn", "yarn_ext_factor", "rope_attn_factor", "yarn_beta_fast"):
        assert getattr(hp, k) == getattr(yarn, k), k
    assert hp.rope_attn_factor == pytest.approx(0.9)  # (x the file's attn_factor)
    hp = rope_hparams(yarn, ContextParams(rope_scaling_type="linear"))  # linear: the file's scale, no ramp
    assert (hp.rope_freq_scale, hp.yarn_ext_factor) == (0.25, 0.0)
    hp = rope_hparams(yarn, ContextParams(rope_scaling_type="none"))
    assert (hp.rope_freq_scale, hp.yarn_ext_factor) == (1.0, 0.0)
    hp = rope_hparams(yarn, ContextParams(rope_freq_scale=0.125))  # x8 over the file's original context
    assert (hp.rope_freq_scale, hp.n_ctx_orig_yarn, hp.yarn_ext_factor) == (0.125, 64, 1.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rope_scaling_type", "ntk"),
        ("rope_scaling_type", 7),
        ("rope_scaling_type", True),
        ("rope_freq_scale", -0.5),
        ("rope_freq_base", float("nan")),
        ("rope_freq_base", "1e4"),
        ("yarn_ext_factor", float("inf")),
        ("yarn_orig_ctx", -1),
        ("yarn_orig_ctx", 32.5),
    ],
)
def test_bad_rope_params_are_typed_errors(tiny: Callable[[str], TinyModel], field: str, value: Any) -> None:
    model = Model.load(tiny("llama").write(F32))
    with pytest.raises(ContextParamError, match=field) as e:
        Context(model, ContextParams(n_ctx=256, **{field: value}))
    assert isinstance(e.value, ValueError)


# ---------------------------------------------------------------------------------------------
# kv overrides at load


def test_kv_overrides_replace_and_add_metadata(tiny: Callable[[str], TinyModel]) -> None:
    path = tiny("llama").write(F32)
    m = Model.load(path, kv_overrides=["llama.context_length=int:64,general.name=str:renamed",
                                       "llama.rope.freq_base=float:0.1"])  # fmt: skip
    assert m.hparams.n_ctx_train == 64 and m.hparams.n_ctx_orig_yarn == 64
    assert m.metadata["general.name"] == "renamed"
    assert m.hparams.rope_freq_base == float(np.float32(0.1))  # read as float32, as llama.cpp's float
    m = Model.load(path, kv_overrides={"llama.attention.causal": False, "llama.rope.scaling.type": "yarn"})
    assert m.hparams.causal_attn is False and m.hparams.rope_scaling_type == "yarn"  # (added keys)
    assert m.metadata["llama.attention.causal"] is False
    # the last override of a key wins
    m = Model.load(path, kv_overrides=["llama.context_length=int:64", "llama.context_length=int:96"])
    assert m.n_ctx_train == 96


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"llama.rope.freq_base": 5}, "is a float, not int"),
        ({"llama.context_length": 64.0}, "is an int, not float"),
        ({"general.name": True}, "is a str, not bool"),
        (["llama.block_count=str:two"], "is an int, not str"),
        ({"llama.x": [1, 2]}, "must be a bool, int, float or str"),
        ({"llama.x": None}, "must be a bool, int, float or str"),
        ({"llama.x": float("nan")}, "not a finite float"),
        (["llama.x=int:1.5"], "not a finite int"),
        (["llama.x=float:abc"], "not a finite float"),
        (["llama.x=bool:yes"], "true or false"),
        (["llama.x=char:y"], "expected KEY=TYPE:VALUE"),
        (["llama.x"], "expected KEY=TYPE:VALUE"),
        (["=int:1"], "the key is empty"),
        (["llama.x=str:" + "y" * 128], "at most 127 bytes"),
    ],
)
def test_bad_kv_overrides_are_typed_errors(
    tiny: Callable[[str], TinyModel], overrides: Any, match: str
) -> None:
    with pytest.raises(KVOverrideError, match=match) as e:
        Model.load(tiny("llama").write(F32), kv_overrides=overrides)
    assert isinstance(e.value, ValueError)


def test_kv_override_into_a_bad_hparam_is_a_load_error(tiny: Callable[[str], TinyModel]) -> None:
    with pytest.raises(ModelLoadError, match="rope.freq_base"):
        Model.load(tiny("llama").write(F32), kv_overrides={"llama.rope.freq_base": 0.0})
