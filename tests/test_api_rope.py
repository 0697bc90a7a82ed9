"""``Llama(...)``'s context-extension arguments (llama-cpp-python's ``rope_scaling_type``,
``rope_freq_base``, ``rope_freq_scale``, ``yarn_*``) and ``kv_overrides``, on SmolLM2 (a file without rope
scaling metadata). The numerical oracle (transformers with the same ``rope_parameters``) is
``tests/model/test_rope_overrides.py``; here: the arguments reach the context and the loader, llama.cpp's
greedy text with the same flags, and bad values are typed errors before anything is loaded."""

from __future__ import annotations

import pytest

from llamapy import Llama
from llamapy.api.common import UnsupportedError
from llamapy.context import ContextParamError
from llamapy.gguf.overrides import KVOverrideError

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
# llama.cpp 0.3.36's llama-completion -m SmolLM2-135M-Instruct.Q4_1.gguf -p PROMPT -n 16 --temp 0 -c 256
# --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32 (and without the three flags)
LLAMACPP_YARN = ", there was a fox with a coat of fur that was brown, and a"
LLAMACPP_PLAIN = ", there was a fox named Max who was a lazy dog.\n\nMax"


def greedy(llm: Llama, n: int = 16) -> str:
    return llm.create_completion(PROMPT, max_tokens=n, temperature=0.0)["choices"][0]["text"]


def test_yarn_arguments_reach_the_context(smollm2_path):
    # 2: llama-cpp-python's LLAMA_ROPE_SCALING_TYPE_YARN
    llm = Llama(
        str(smollm2_path),
        n_ctx=256,
        verbose=False,
        rope_scaling_type=2,
        rope_freq_scale=0.25,
        yarn_orig_ctx=32,
    )
    hp = llm.ctx.impl.hp
    got = (hp.rope_scaling_type, hp.rope_freq_scale, hp.n_ctx_orig_yarn, hp.yarn_ext_factor)
    assert got == ("yarn", 0.25, 32, 1.0)
    model_hp = llm.model.hparams  # the model's stay
    assert model_hp.rope_freq_scale == 1.0 and model_hp.n_ctx_orig_yarn == 8192
    assert greedy(llm) == LLAMACPP_YARN
    plain = Llama(str(smollm2_path), n_ctx=256, verbose=False, rope_scaling_type=-1, rope_freq_base=0.0)
    assert plain.ctx.impl is plain.model.impl  # llama-cpp-python's defaults: the model's own
    assert greedy(plain) == LLAMACPP_PLAIN


def test_a_draft_model_file_takes_the_context_rope(smollm2_path):
    """As llama.cpp's ``-md`` draft (``common_base_params_to_speculative`` copies the main parameters): the
    draft's context computes with the same RoPE scaling as the target's, and the server's slots' drafts too."""
    kw = dict(rope_scaling_type="yarn", rope_freq_scale=0.25, yarn_orig_ctx=32)
    llm = Llama(str(smollm2_path), n_ctx=256, verbose=False, draft_model=str(smollm2_path), **kw)
    hp = llm.draft_model.ctx.impl.hp
    assert (hp.rope_scaling_type, hp.rope_freq_scale, hp.n_ctx_orig_yarn) == ("yarn", 0.25, 32)
    plain = Llama(str(smollm2_path), n_ctx=256, verbose=False, draft_model=str(smollm2_path))
    assert plain.draft_model.ctx.impl.hp.rope_freq_scale == 1.0

    from llamapy.server.backend import ContextBackend

    b = ContextBackend(str(smollm2_path), n_ctx=512, n_seq_max=2, rope=kw, draft={"model": str(smollm2_path)})
    hp = b.make_draft().ctx.impl.hp
    assert (hp.rope_scaling_type, hp.rope_freq_scale, hp.n_ctx_orig_yarn) == ("yarn", 0.25, 32)


def test_kv_overrides_as_llama_cpp_python(smollm2_path):
    llm = Llama(str(smollm2_path), vocab_only=True, verbose=False)
    assert llm.tokenize(b"hi")[0] != llm.token_bos()  # SmolLM2 adds no BOS
    llm = Llama(str(smollm2_path), vocab_only=True, verbose=False,
                kv_overrides={"tokenizer.ggml.add_bos_token": True, "general.name": "renamed"})  # fmt: skip
    assert llm.tokenize(b"hi")[0] == llm.token_bos()
    assert llm.metadata["general.name"] == "renamed"
    llm = Llama(str(smollm2_path), n_ctx=256, verbose=False,
                kv_overrides={"llama.context_length": 32, "llama.rope.scaling.type": "yarn",
                              "llama.rope.scaling.factor": 4.0})  # fmt: skip
    assert (llm.ctx.impl.hp.n_ctx_orig_yarn, llm.ctx.impl.hp.rope_freq_scale) == (32, 0.25)
    assert greedy(llm) == LLAMACPP_YARN  # the scaling as metadata: llama.cpp's text with the flags


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        (dict(rope_scaling_type="ntk"), ContextParamError, "rope_scaling_type"),
        (dict(rope_scaling_type=4), ContextParamError, "rope_scaling_type"),
        (dict(rope_freq_scale=-0.25), ContextParamError, "rope_freq_scale"),
        (dict(rope_freq_base=float("nan")), ContextParamError, "rope_freq_base"),
        (dict(yarn_beta_fast="fast"), ContextParamError, "yarn_beta_fast"),
        (dict(yarn_orig_ctx=-32), ContextParamError, "yarn_orig_ctx"),
        (dict(kv_overrides={"llama.x": [1]}), KVOverrideError, "bool, int, float or str"),
        (dict(kv_overrides={"llama.x": 1}, pipeline_stages=2), UnsupportedError, "kv_overrides"),
    ],
)
def test_bad_arguments_fail_before_loading(tmp_path, kw, error, match):
    with pytest.raises(error, match=match) as e:
        Llama(str(tmp_path / "missing.gguf"), verbose=False, **kw)  # (a load would fail: file not found)
    assert isinstance(e.value, ValueError) or error is UnsupportedError


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"llama.rope.freq_base": 100000}, "'llama.rope.freq_base' is a float, not int"),
        ({"tokenizer.ggml.add_bos_token": "true"}, "is a bool, not str"),
        ({"tokenizer.ggml.tokens": "x"}, "is an array"),
    ],
)
def test_kv_override_of_the_wrong_type(smollm2_path, overrides, match):
    with pytest.raises(KVOverrideError, match=match):
        Llama(str(smollm2_path), vocab_only=True, verbose=False, kv_overrides=overrides)
