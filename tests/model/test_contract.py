"""The architecture contract: per-layer choices have one source (the forward graph and the K-shift ask
``Architecture.layer_rope``), ``build`` returns its outputs, intermediates carry llama.cpp's names and
``ContextParams.cb_eval`` reads them, and every registered architecture has an oracle case."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from llamapy.batch import Batch
from llamapy.context import Context, ContextParams
from llamapy.ggml.tensor import Tensor
from llamapy.model import Model
from llamapy.model.arch import _FAMILY_MODULES, REGISTRY
from llamapy.model.arch.llama import Llama
from llamapy.model.blocks import Outputs, Rope
from tests.model.tiny import tiny_llama

TOKS = [5, 17, 3, 42, 8, 21, 33, 1, 60, 7]
N_LAYER = 3


class NoPELlama(Llama):
    """Test-only: no rope on odd layers (as SmolLM3's every 4th layer, Llama 4's every n-th)."""

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        return None if il % 2 else super().layer_rope(il, n_ctx)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("contract") / "tiny.gguf", seed=3, n_layer=N_LAYER)


def _model(path, nope: bool = False) -> Model:
    m = Model.load(path)
    if nope:
        m.impl.__class__ = NoPELlama
    return m


def _ctx(m: Model, **kw) -> Context:
    return Context(m, ContextParams(n_ctx=256, type_k="f32", type_v="f32", **kw))


def _graph(ctx: Context):
    return next(iter(ctx._graphs.values())).graph


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


# ---------------------------------------------------------------------------------------------
# one source for the per-layer rope


def test_nope_layers_in_forward_graph(tiny_path):
    """The graph reads the family's ``layer_rope``: a NoPE layer's K has no rope node."""
    ctx = _ctx(_model(tiny_path, nope=True))
    ctx.decode(Batch.from_tokens(TOKS))
    kcur = {t.name: t for t in _graph(ctx).nodes if t.name.startswith(("Kcur-", "Qcur-"))}
    assert sorted(kcur) == sorted(f"{n}-{il}" for n in ("Qcur", "Kcur") for il in range(N_LAYER))
    for il in range(N_LAYER):
        for n in ("Qcur", "Kcur"):
            assert (kcur[f"{n}-{il}"].op == "rope") == (il % 2 == 0), (n, il, kcur[f"{n}-{il}"])
    # and it changes the logits (the override is not ignored)
    plain = _ctx(_model(tiny_path))
    plain.decode(Batch.from_tokens(TOKS))
    assert _rel(ctx.get_logits_ith(-1), plain.get_logits_ith(-1)) > 1e-3


def _shifted_logits(m: Model, shift_arch: type | None = None) -> np.ndarray:
    """Decode TOKS[:-1], move the cache by +7, decode the last token (the K-shift run with the
    family ``shift_arch`` in place of the model's own when given)."""
    c = _ctx(m)
    c.decode(Batch.from_tokens(TOKS[:-1]))
    c.memory.seq_add(0, 0, -1, 7)
    if shift_arch is not None:
        own, m.impl.__class__ = m.impl.__class__, shift_arch
        c._apply_shift()
        m.impl.__class__ = own
    c.decode(Batch.from_tokens(TOKS[-1:]))
    return c.get_logits_ith(-1).copy()


@pytest.mark.parametrize("nope", [False, True], ids=["rope", "nope"])
def test_k_shift_follows_layer_rope(tiny_path, nope):
    """Moving the cached positions by +7 then decoding equals decoding at positions 7.. from the start:
    the K-shift re-rotates exactly the layers the forward pass rotated (none on the NoPE layers)."""
    m = _model(tiny_path, nope=nope)
    fresh = _ctx(m)
    fresh.decode(Batch.from_tokens(TOKS, pos0=7))
    assert _rel(_shifted_logits(m), fresh.get_logits_ith(-1)) < 1e-4
    if nope:  # a K-shift that rotated the NoPE layers too (the forward pass did not) misses by far
        assert _rel(_shifted_logits(m, shift_arch=Llama), fresh.get_logits_ith(-1)) > 1e-2


# ---------------------------------------------------------------------------------------------
# build() returns its outputs; named intermediates through cb_eval


def test_build_returns_outputs(tiny_path):
    """``build`` returns logits and embeddings explicitly; the context makes them the graph's outputs."""
    m = _model(tiny_path)
    built: list[Outputs] = []
    build = m.impl.build
    m.impl.build = lambda g: built.append(build(g)) or built[-1]
    ctx = _ctx(m, embeddings=True, pooling_type="none")
    ctx.decode(Batch.from_tokens(TOKS, logits_all=True))
    (res,) = built
    assert isinstance(res, Outputs)
    assert res.logits.name == "result_output" and res.embd.name == "result_norm"
    assert _graph(ctx).outputs == [res.logits, res.embd]
    assert res.logits.shape == (len(TOKS), m.n_vocab) and res.embd.shape == (len(TOKS), m.n_embd)
    # without embeddings the graph computes the logits only
    ctx = _ctx(_model(tiny_path))
    ctx.decode(Batch.from_tokens(TOKS))
    assert [t.name for t in _graph(ctx).outputs] == ["result_output"]


def _watch(names: set[str] | None = None):
    """A cb_eval recording what it was asked and the values it was given (all names when None)."""
    asked: list[str] = []
    got: list[tuple[str, np.ndarray]] = []

    def cb(t: Tensor, ask: bool, value: np.ndarray | None) -> bool:
        if ask:
            asked.append(t.name)
            return names is None or t.name in names
        got.append((t.name, value))
        return True

    return cb, asked, got


def test_cb_eval_reads_named_intermediates(tiny_path):
    m = _model(tiny_path)
    hp = m.hparams
    T, D = len(TOKS), hp.n_embd
    nh, nkv, dk, dv = hp.heads(0)
    cb, asked, got = _watch()
    ctx = _ctx(m, cb_eval=cb)
    ctx.decode(Batch.from_tokens(TOKS, logits_all=True))
    vals = dict(got)
    assert len(vals) == len(got), "each named node is given once per ubatch"
    per_layer = {
        "attn_norm": (T, D),
        "Qcur": (T, nh, dk),
        "Kcur": (T, nkv, dk),
        "Vcur": (T, nkv, dv),
        "kqv_out": (T, nh * dv),
        "attn_out": (T, D),
        "ffn_inp": (T, D),
        "ffn_norm": (T, D),
        "ffn_out": (T, D),
        "l_out": (T, D),
    }
    for il in range(N_LAYER):
        for name, shape in per_layer.items():
            assert vals[f"{name}-{il}"].shape == shape, (name, il)
    assert vals["inp_embd"].shape == (T, D)
    assert vals["result_norm"].shape == (T, D)
    np.testing.assert_array_equal(vals["result_output"], ctx.get_logits())
    # values are the computation's: the first norm by hand, and the output as ours
    w = m.impl.w
    x = w["token_embd.weight"].data.reshape(hp.n_vocab, D)[TOKS]
    norm_w = m.impl.blocks[0]["attn_norm.weight"].data
    ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + hp.norm_rms_eps) * norm_w
    np.testing.assert_allclose(vals["attn_norm-0"], ref, rtol=1e-5, atol=1e-5)
    # watching changes no result
    plain = _ctx(m)
    plain.decode(Batch.from_tokens(TOKS, logits_all=True))
    np.testing.assert_array_equal(ctx.get_logits(), plain.get_logits())
    # asked once per graph (reused graphs are not asked again), given values on every ubatch
    n_asked = len(asked)
    got.clear()
    ctx.decode(Batch.from_tokens([9], pos0=T))
    ctx.decode(Batch.from_tokens([4], pos0=T + 1))
    assert ctx.n_graph_reuses >= 1 and len(asked) == 2 * n_asked  # one new shape (one token), then reuse
    assert [n for n, _ in got].count("l_out-0") == 2
    # the last layer keeps only the output rows (llama.cpp's inp_out_ids)
    got.clear()
    ctx.decode(Batch.from_tokens(TOKS[:4], pos0=T + 2))
    vals = dict(got)
    assert vals["l_out-0"].shape == (4, D) and vals[f"l_out-{N_LAYER - 1}"].shape == (1, D)
    np.testing.assert_array_equal(vals["result_output"], ctx.get_logits())


def test_cb_eval_selected_nodes_and_no_cost_when_unused(tiny_path):
    m = _model(tiny_path)
    cb, asked, got = _watch({"l_out-1"})
    ctx = _ctx(m, cb_eval=cb)
    ctx.decode(Batch.from_tokens(TOKS))
    assert [n for n, _ in got] == ["l_out-1"]
    assert set(asked) >= {"l_out-0", "l_out-1", "result_norm", "result_output"}
    # a callback that wants nothing, and none at all: the same graph outputs and memory plan
    none_cb, _, none_got = _watch(set())
    sizes = []
    for c in (_ctx(m, cb_eval=none_cb), _ctx(m)):
        c.decode(Batch.from_tokens(TOKS))
        ge = next(iter(c._graphs.values()))
        assert ge.watched == [] and len(ge.graph.outputs) == 1
        sizes.append(c.sched.plan(ge.graph).size)
    assert not none_got and sizes[0] == sizes[1]
    # watching a node keeps its memory alive: the plan grows, results do not change
    assert ctx.sched.plan(_graph(ctx)).size >= sizes[1]


# ---------------------------------------------------------------------------------------------
# every registered architecture has an oracle


def test_every_registered_architecture_has_an_oracle_case():
    """A family registered without a transformers comparison (tests/model/hf_tiny.FAMILIES) or a
    llama.cpp reference case (tests/model/test_reference.REFERENCE_ARCHS) fails here."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.model import hf_tiny
    from tests.model.test_reference import REFERENCE_ARCHS

    for mod in set(_FAMILY_MODULES.values()):
        importlib.import_module(f"llamapy.model.arch.{mod}")
    covered = {f.arch for f in hf_tiny.FAMILIES.values()} | set(REFERENCE_ARCHS)
    missing = sorted(set(REGISTRY) - covered)
    assert not missing, f"registered architectures with no oracle case: {missing}"
    assert set(_FAMILY_MODULES) == set(REGISTRY)
