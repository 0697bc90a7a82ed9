"""The graph layer with the NumPy reference backend, checked against plain NumPy written here."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.errors import LlamapyError
from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.backend import ComputeError
from llamapy.ggml.tensor import GraphError

RNG = np.random.default_rng(0)


def run(out, feeds, backend=None):
    s = Scheduler([backend or NumpyBackend()])
    g = Graph(out)
    s.compute(g, feeds)
    return s.get(out) if not isinstance(out, list) else [s.get(o) for o in out]


def inp(shape, dtype=T.F32):
    t = ops.new_tensor(dtype, shape)
    if dtype == T.I32:
        v = RNG.integers(0, 5, size=shape).astype(np.int32)
    else:
        v = RNG.standard_normal(shape).astype(np.float32)
    return t, v


def test_elementwise_and_broadcast():
    a, av = inp((2, 3, 5))
    b, bv = inp((3, 1))
    c, cv = inp((5,))
    out = ops.div(ops.mul(ops.sub(ops.add(a, b), c), c), ops.scale(c, 2.0, bias=3.0))
    ref = ((av + bv) - cv) * cv / (cv * 2 + 3)
    np.testing.assert_allclose(run(out, {a: av, b: bv, c: cv}), ref, rtol=1e-5, atol=1e-6)


def test_tile_broadcast_repeats_b():
    a, av = inp((4, 6))
    b, bv = inp((2, 3))
    np.testing.assert_allclose(run(a + b, {a: av, b: bv}), av + np.tile(bv, (2, 2)), rtol=1e-6)


def test_unary_ops():
    a, av = inp((3, 7))
    x = av.astype(np.float64)
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    cases = {
        ops.silu(a): x / (1 + np.exp(-x)),
        ops.gelu(a): gelu,
        ops.gelu_quick(a): x / (1 + np.exp(-1.702 * x)),
        ops.tanh(a): np.tanh(x),
        ops.relu(a): np.maximum(x, 0),
        ops.softcap(a, 2.0): 2 * np.tanh(x / 2),
        ops.rms_norm(a, 1e-5): x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-5),
        ops.norm(a, 1e-5): (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5),
        ops.sum_rows(a): x.sum(-1, keepdims=True),
        ops.mean(a): x.mean(-1, keepdims=True),
        ops.argmax(a): x.argmax(-1),
        ops.top_k(a, 3): np.argsort(-x, -1)[:, :3],
        ops.pad(a, [1, (2, 1)]): np.pad(x, [(0, 1), (2, 1)]),
    }
    outs = list(cases)
    got = run(outs, {a: av})
    for o, g in zip(outs, got, strict=False):
        np.testing.assert_allclose(g, cases[o], rtol=1e-5, atol=1e-6, err_msg=o.op)


def test_glu_concat():
    a, av = inp((4, 6))
    b, bv = inp((4, 6))
    silu = av / (1 + np.exp(-av))
    got = run([ops.swiglu(a, b), ops.concat(a, b, 0), ops.concat(a, b, -1)], {a: av, b: bv})
    np.testing.assert_allclose(got[0], silu * bv, rtol=1e-5)
    np.testing.assert_array_equal(got[1], np.concatenate([av, bv], 0))
    np.testing.assert_array_equal(got[2], np.concatenate([av, bv], 1))


def test_mul_mat_broadcast_over_heads():
    a, av = inp((2, 5, 8))  # 2 kv heads
    b, bv = inp((4, 3, 8))  # 4 q heads
    ref = np.stack([bv[h] @ av[h // 2].T for h in range(4)])
    np.testing.assert_allclose(run(ops.mul_mat(a, b), {a: av, b: bv}), ref, rtol=1e-5, atol=1e-5)


def test_views_permute_transpose_cont_reshape():
    a, av = inp((4, 6))
    v = ops.view(a, (2, 3), strides=(6 * 4 * 2, 4 * 2), offset=4)  # rows 0,2 ; cols 1,3,5
    p = ops.cont(ops.transpose(a))
    r = ops.reshape(a, (3, 8))
    q = ops.permute(ops.reshape(a, (2, 2, 6)), (1, 0, 2))
    got = run([ops.cont(v), p, ops.cont(r), ops.cont(q)], {a: av})
    np.testing.assert_array_equal(got[0], av[::2, 1::2])
    np.testing.assert_array_equal(got[1], av.T)
    np.testing.assert_array_equal(got[2], av.reshape(3, 8))
    np.testing.assert_array_equal(got[3], av.reshape(2, 2, 6).transpose(1, 0, 2))


def test_get_rows_set_rows_cpy_f16():
    tab = RNG.standard_normal((7, 4)).astype(np.float16)
    w = ops.weight("tab", T.F16, (7, 4), tab)
    ids, _ = inp((3,), T.I32)
    cache = ops.buffer("cache", T.F16, (6, 4))
    src, sv = inp((2, 4))
    idx = ops.new_tensor(T.I32, (2,))
    wr = ops.set_rows(cache, src, idx)
    dst = ops.new_tensor(T.F32, (4, 6))
    cp = ops.cpy(ops.transpose(wr), dst)
    s = Scheduler([NumpyBackend()])
    g = Graph([ops.get_rows(w, ids), cp])
    iv = np.array([6, 0, 6], np.int32)
    s.compute(g, {ids: iv, src: sv, idx: np.array([5, 1], np.int32), dst: np.zeros((4, 6), np.float32)})
    np.testing.assert_array_equal(s.get(g.outputs[0]), tab[iv].astype(np.float32))
    expect = np.zeros((6, 4), np.float16)
    expect[[5, 1]] = sv.astype(np.float16)
    np.testing.assert_array_equal(cache.data.view(np.float16).reshape(6, 4), expect)
    np.testing.assert_array_equal(s.get(cp), expect.T.astype(np.float32))


def test_rope_normal_and_neox_match_direct_formula():
    a, av = inp((3, 2, 8))
    pos = ops.new_tensor(T.I32, (3,))
    pv = np.array([0, 5, 17], np.int32)
    outs = [ops.rope(a, pos, 6, mode=0, freq_base=100.0), ops.rope(a, pos, 6, mode=2, freq_base=100.0)]
    got = run(outs, {a: av, pos: pv})
    for mode, g in zip((0, 2), got, strict=False):
        ref = av.astype(np.float64).copy()
        for t in range(3):
            for i in range(3):
                th = pv[t] * 100.0 ** (-2 * i / 6)
                j0, j1 = (2 * i, 2 * i + 1) if mode == 0 else (i, i + 3)
                x0, x1 = av[t, :, j0], av[t, :, j1]
                ref[t, :, j0] = x0 * np.cos(th) - x1 * np.sin(th)
                ref[t, :, j1] = x0 * np.sin(th) + x1 * np.cos(th)
        np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-5)


def test_soft_max_mask_scale_alibi():
    a, av = inp((4, 3, 5))
    m = ops.new_tensor(T.F32, (3, 5))
    mv = np.triu(np.full((3, 5), -np.inf, np.float32), 3)
    got = run([ops.soft_max(a, m, scale=0.5), ops.soft_max(a, m, scale=0.5, max_bias=8.0)], {a: av, m: mv})
    x = av * 0.5 + mv
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got[0], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    slopes = np.array([2 ** (-8 / 4 * (h + 1)) for h in range(4)])  # 4 heads: m0^(h+1), m0 = 2^-2
    x = av * 0.5 + slopes[:, None, None] * mv
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got[1], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_flash_attn_matches_softmax_attention_f16_kv():
    T_, H, Hkv, D, KV = 3, 4, 2, 8, 6
    q, qv = inp((T_, H, D))
    kv = RNG.standard_normal((KV, Hkv, D)).astype(np.float16)
    vv = RNG.standard_normal((KV, Hkv, D)).astype(np.float16)
    k = ops.weight("k", T.F16, kv.shape, kv)
    v = ops.weight("v", T.F16, vv.shape, vv)
    m = ops.new_tensor(T.F32, (T_, KV))
    mv = np.where(np.arange(KV)[None, :] <= np.arange(T_)[:, None] + 3, 0, -np.inf).astype(np.float32)
    got = run(ops.flash_attn_ext(q, k, v, m, 0.3, logit_softcap=5.0), {q: qv, m: mv})
    for h in range(H):
        s = qv[:, h] @ kv[:, h // 2].astype(np.float32).T * 0.3
        s = 5 * np.tanh(s / 5) + mv
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(got[:, h], p @ vv[:, h // 2].astype(np.float32), rtol=1e-4, atol=1e-5)


def test_mul_mat_id():
    a, av = inp((3, 5, 4))
    b, bv = inp((2, 1, 4))
    ids = ops.new_tensor(T.I32, (2, 2))
    iv = np.array([[2, 0], [1, 1]], np.int32)
    got = run(ops.mul_mat_id(a, b, ids), {a: av, b: bv, ids: iv})
    for t in range(2):
        for u in range(2):
            np.testing.assert_allclose(got[t, u], av[iv[t, u]] @ bv[t, 0], rtol=1e-5)


def test_planner_reuses_memory_and_graph_reuse_is_identical():
    x, xv = inp((2, 64))
    h = x
    for _ in range(20):
        h = ops.silu(ops.scale(h, 0.9)) + x
    g = Graph(h)
    s = Scheduler([NumpyBackend()])
    plan = s.plan(g)
    assert plan.size <= 4 * 2 * 64 * 4 + 4 * 64  # a handful of activation buffers, not 40
    assert plan.naive_size >= 40 * 2 * 64 * 4
    s.compute(g, {x: xv})
    r1 = s.get(h)
    s.compute(g, {x: xv * 2})
    s.compute(g, {x: xv})
    np.testing.assert_array_equal(s.get(h), r1)
    ref = xv.astype(np.float64)
    for _ in range(20):
        y = ref * 0.9
        ref = y / (1 + np.exp(-y)) + xv
    np.testing.assert_allclose(r1, ref, rtol=1e-5)


def test_errors_are_typed_and_say_where():
    a = ops.new_tensor(T.F32, (3, 4), "a")
    with pytest.raises(GraphError, match="K differs"):
        ops.mul_mat(ops.new_tensor(T.F32, (5, 8)), a)
    with pytest.raises(GraphError, match="does not repeat"):
        ops.add(a, ops.new_tensor(T.F32, (3,)))
    with pytest.raises(GraphError, match="beyond"):
        ops.view(a, (4, 4))
    with pytest.raises(GraphError, match="contiguous"):
        ops.reshape(ops.transpose(a), (12,))
    with pytest.raises(GraphError, match="block size"):
        ops.new_tensor(T.Q8_0, (2, 33))
    tab = ops.weight("tab", T.F32, (4, 2), np.zeros((4, 2), np.float32))
    ids = ops.new_tensor(T.I32, (1,))
    g = Graph(ops.get_rows(tab, ids))
    s = Scheduler([NumpyBackend()])
    with pytest.raises(ComputeError, match="row id 9"):
        s.compute(g, {ids: np.array([9])})
    with pytest.raises(ComputeError, match="shape"):
        s.compute(g, {ids: np.array([1, 2])})
    with pytest.raises(LlamapyError, match="missing"):
        Scheduler([NumpyBackend()]).compute(Graph(ops.silu(a)), {})
