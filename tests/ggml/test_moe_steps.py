"""The CPU backend's fused MoE steps (``cpu/moe_steps.py``) on the graph ``GraphBuilder.build_moe_ffn`` makes:
the router (softmax, top-k, gathered and normalized weights) in the ``top_k`` step and the experts' weighted
sum in one ``sum_rows`` step. The same ids and outputs as the op-by-op steps (``FUSE = False``) and the NumPy
backend; a node something else reads (a graph output) keeps its own step; the kernels' ties and NaN."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.cpu import moe_router_kernels as mr
from llamapy.ggml.cpu import moe_steps
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.model.blocks import GraphBuilder

E, K_USED, D, FF = 16, 4, 32, 24


def _graph(n_tok: int, norm_w: bool, expose: str = "", seed: int = 3):
    """One MoE FFN as the model builder makes it (F32 router and experts), its input and feeds."""
    rng = np.random.default_rng(seed)
    hp = SimpleNamespace(n_expert=E, n_expert_used=K_USED, n_expert_groups=0, n_group_used=0)
    fake = SimpleNamespace(hp=hp, cb=GraphBuilder.cb, mm=lambda w, x, b=None: ops.mul_mat(w, x))
    fake._mm_id = GraphBuilder._mm_id
    blk = {
        "ffn_gate_inp.weight": ops.weight("r", T.F32, (E, D), rng.standard_normal((E, D), np.float32)),
        "ffn_up_exps.weight": ops.weight("u", T.F32, (E, FF, D), rng.standard_normal((E, FF, D), np.float32)),
        "ffn_gate_exps.weight": ops.weight(
            "g", T.F32, (E, FF, D), rng.standard_normal((E, FF, D), np.float32)
        ),
        "ffn_down_exps.weight": ops.weight(
            "d", T.F32, (E, D, FF), rng.standard_normal((E, D, FF), np.float32)
        ),
    }
    h = ops.new_tensor(T.F32, (n_tok, D), "h")
    out = GraphBuilder.build_moe_ffn(fake, h, blk, 0, norm_w)
    outs = [out]
    g0 = Graph(outs)
    by_name = {n.name: n for n in g0.nodes}
    if expose:
        outs.append(by_name[expose])
    ids = by_name["ffn_moe_topk-0"]
    return Graph([*outs, ids]), h, rng.standard_normal((n_tok, D), np.float32)


def _run(be, n_tok: int, norm_w: bool, expose: str = ""):
    g, h, x = _graph(n_tok, norm_w, expose)
    s = Scheduler([be])
    s.compute(g, {h: x})
    names = [getattr(st, "__qualname__", "") for st in s._last.steps]
    return [s.get(t).copy() for t in g.outputs], names


@pytest.mark.parametrize("norm_w", [True, False])
@pytest.mark.parametrize("n_tok", [1, 5])
def test_fused_matches_op_by_op_and_numpy(norm_w, n_tok, monkeypatch):
    fused, names = _run(CPUBackend(2), n_tok, norm_w)
    assert sum("fused_step" in nm for nm in names) >= (3 if norm_w else 3), names
    monkeypatch.setattr(moe_steps, "FUSE", False)
    plain, names0 = _run(CPUBackend(2), n_tok, norm_w)
    assert not any("fused_step" in nm for nm in names0)
    assert len(names) < len(names0)
    ref, _ = _run(NumpyBackend(), n_tok, norm_w)
    np.testing.assert_array_equal(fused[1], plain[1])  # the same experts
    np.testing.assert_array_equal(fused[1], ref[1])
    np.testing.assert_allclose(fused[0], plain[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fused[0], ref[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("expose", ["ffn_moe_probs-0", "ffn_moe_weighted-0", "ffn_moe_weights-0"])
def test_a_read_intermediate_keeps_its_step(expose):
    fused, names = _run(CPUBackend(1), 3, True, expose)
    ref, _ = _run(NumpyBackend(), 3, True, expose)
    for a, b in zip(fused, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    if expose == "ffn_moe_weighted-0":  # the router is still fused, the weighted sum is not
        assert sum("fused_step" in nm for nm in names) == 2
    elif expose == "ffn_moe_probs-0":  # the weighted sum only
        assert sum("fused_step" in nm for nm in names) == 1


def test_route_kernel_ties_lower_expert_and_nan_rows():
    logits = np.array([[1.0, 3.0, 3.0, 0.5, 3.0], [np.nan] * 5, [0.0, -np.inf, 2.0, 2.0, 1.0]], np.float32)
    onehot = np.eye(5, dtype=np.float32).reshape(5, 1, 5)
    ids = np.empty((3, 3), np.int32)
    w = np.empty((3, 3), np.float32)
    mr.route_softmax_topk(logits, np.float32(1.0), onehot, 3, True, ids, w)
    assert ids[0].tolist() == [1, 2, 4]
    assert ids[2].tolist() == [2, 3, 4]
    assert sorted(ids[1].tolist()) == sorted(set(ids[1].tolist())) and ids[1].min() >= 0 and ids[1].max() < 5
    np.testing.assert_allclose(w[0], [1 / 3] * 3, rtol=1e-6)
    p = np.exp(logits[2].astype(np.float64) - 2.0)
    p /= p.sum()
    sel = p[[2, 3, 4]]
    np.testing.assert_allclose(w[2], sel / sel.sum(), rtol=1e-6)


def test_weighted_sum_kernel_against_float64():
    rng = np.random.default_rng(1)
    y = rng.standard_normal((3, 8, 40), np.float32)
    w = rng.random((3, 8), np.float32)
    out = np.empty((3, 40), np.float32)
    mr.weighted_sum(y, w, out)
    exact = (y.astype(np.float64) * w[..., None]).sum(axis=1)
    np.testing.assert_allclose(out, exact, rtol=1e-6, atol=1e-6)
