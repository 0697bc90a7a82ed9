"""Every tiny family of ``tests/model/hf_tiny`` (the one HF -> GGUF converter of the tests) against
transformers, beyond the logits of ``test_hf_oracle``:

- the intermediates: each layer's output (``l_out-il``), the input embeddings (``inp_embd`` /
  ``inp_scaled``) and the final norm (``result_norm``), read through ``ContextParams.cb_eval``, equal
  HF's ``hidden_states`` (how a divergence is located: diff the two dumps layer by layer);
- a prompt split over two batches (the second reads the first's K/V from the cache), with the fused
  (flash) and the unfused attention, gives HF's logits.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llamapy.batch import Batch  # noqa: E402
from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.ggml.types import GGMLType  # noqa: E402
from llamapy.model import Model  # noqa: E402
from tests.model import hf_tiny  # noqa: E402
from tests.model.hf_tiny import TinyModel  # noqa: E402

TOL = 1e-3  # max |ours - hf| / max |hf|, as test_hf_oracle's float files
N_TOKENS = 14


_torch_threads = pytest.fixture(scope="module", autouse=True)(hf_tiny.one_torch_thread)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TinyModel]:
    return hf_tiny.family_models(tmp_path_factory.mktemp("arch_hf"), seed_offset=1)


def _tokens(name: str) -> list[int]:
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 1)
    return [int(t) for t in rng.integers(0, hf_tiny.N_VOCAB, N_TOKENS)]


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _context(tm: TinyModel, **kw) -> Context:
    return Context(
        Model.load(tm.write(GGMLType.F32)), ContextParams(n_ctx=256, type_k="f32", type_v="f32", **kw)
    )


@pytest.mark.parametrize("name", hf_tiny.causal_lm_families())
def test_intermediates_match_hf_hidden_states(tiny: Callable[[str], TinyModel], name: str) -> None:
    tm = tiny(name)
    tokens = _tokens(name)
    dump: dict[str, np.ndarray] = {}

    def cb(t, ask: bool, value) -> bool:
        if ask:
            return t.name.startswith(("l_out-", "inp_", "inpL", "result_norm"))
        dump[t.name] = value
        return True

    ctx = _context(tm, cb_eval=cb)
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    tm.hf.load_state_dict(
        {k: torch.from_numpy(v) for k, v in hf_tiny.effective_state_dict(tm.state, GGMLType.F32).items()},
        strict=False,
    )
    with torch.no_grad():
        out = tm.hf(input_ids=torch.tensor([tokens]), output_hidden_states=True, use_cache=False)
    hs = [h[0].float().numpy() for h in out.hidden_states]  # embeddings, layers 0..n-2, final norm
    n_layer = len(hs) - 1
    # the embeddings HF returns: scaled (gemma, granite), plus learned positions (gpt2's inpL)
    emb = dump.get("inpL", dump.get("inp_scaled", dump["inp_embd"]))
    assert _rel(emb, hs[0]) < 1e-6, f"{name}: input embeddings"
    # hs[i + 1] is block i's output; some transformers versions record each block's input instead (5.25's
    # Mamba2: the embeddings twice, then block 0's output, ..., the final norm): then hs[i + 2] is
    shift = 2 if n_layer > 1 and np.array_equal(hs[1], hs[0]) else 1
    for il in range(n_layer - shift):
        err = _rel(dump[f"l_out-{il}"], hs[il + shift])
        assert err < TOL, f"{name}: l_out-{il} differs from HF's hidden state {il + shift} by {err:.2e}"
    assert f"l_out-{n_layer - 1}" in dump
    assert _rel(dump["result_norm"], hs[-1]) < TOL, f"{name}: result_norm"


@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash", "unfused"])
@pytest.mark.parametrize("name", hf_tiny.causal_lm_families())
def test_two_batches_match_hf(tiny: Callable[[str], TinyModel], name: str, flash_attn: bool) -> None:
    tm = tiny(name)
    tokens = _tokens(name)
    ctx = _context(tm, flash_attn=flash_attn)
    ctx.decode(Batch.from_tokens(tokens[:5], logits_all=True))
    first = ctx.get_logits().copy()
    ctx.decode(Batch.from_tokens(tokens[5:], logits_all=True))  # continues from the cache
    got = np.concatenate([first, ctx.get_logits()])
    err = _rel(got, tm.logits(tokens, GGMLType.F32))
    assert err < TOL, f"{name} (flash_attn={flash_attn}): max |diff| / max |logit| = {err:.2e}"
