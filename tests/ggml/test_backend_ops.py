"""Like llama.cpp's test-backend-ops: every op x type x shape on the CPU backend against the NumPy
reference backend, by normalized mean squared error. Shapes are small and odd (remainder rows,
views, broadcasting, 1 and many tokens); compiled kernels are shared through Numba's cache."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.backend import ComputeError
from llamapy.ggml.cpu.backend import CPUBackend, matvec_max_rows
from llamapy.ggml.cpu.matmul_kernels import Q16_TYPES, VEC_DOT_TYPE
from llamapy.ggml.quants import dequantize, quantize
from tests.util import as_kernel_sees

RNG = np.random.default_rng(1234)
CPU = CPUBackend(2)

MATVEC_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
MATVEC_TYPES += [T.IQ4_NL, T.IQ4_XS]
OTHER_TYPES = [T.F32, T.F16, T.BF16, T.IQ3_S]  # IQ3_S: no mat-vec kernel (dequantized tiles + sgemm)
#: llama.cpp's test-backend-ops bound for mul_mat, for kernels that quantize the activations
MUL_MAT_Q8_NMSE = 5e-4


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b**2), 1e-30))


def run_both(outs, feeds):
    outs = outs if isinstance(outs, list) else [outs]
    g = Graph(outs)
    res = []
    for be in (CPU, NumpyBackend()):
        s = Scheduler([be])
        s.compute(g, feeds)
        res.append([s.get(o) for o in outs])
    return res


def check(outs, feeds, tol=1e-7):
    got, ref = run_both(outs, feeds)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert a.shape == b.shape, i
        if a.dtype.kind in "iu":
            np.testing.assert_array_equal(a, b)
        else:
            assert nmse(a, b) <= tol, (i, nmse(a, b))
    return got, ref


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def make_weight(t: T, n: int, k: int):
    wf = f32(n, k)
    if t == T.F32:
        raw = wf
    elif t == T.F16:
        raw = wf.astype(np.float16)
    elif t == T.BF16:
        raw = (wf.view(np.uint32) >> 16).astype(np.uint16)
    else:
        raw = quantize(wf, t)
    return ops.weight(f"w_{t.name}", t, (n, k), raw), raw


@pytest.mark.parametrize("t", MATVEC_TYPES + OTHER_TYPES, ids=lambda t: t.name)
def test_mul_mat_all_types_few_and_many_tokens(t):
    n, k = 13, 512  # 13 rows: groups of 4 plus a remainder
    w, _ = make_weight(t, n, k)
    outs, feeds = [], {}
    many = matvec_max_rows(t.name) + 9  # past the type's switch point: float tiles
    for m in (1, 3, many):
        x = ops.new_tensor(T.F32, (m, k))
        feeds[x] = f32(m, k)
        outs.append(ops.mul_mat(w, x))
    got, ref = run_both(outs, feeds)
    for m, a, b in zip((1, 3, many), got, ref, strict=True):
        tight = t.name not in VEC_DOT_TYPE or m == many  # many tokens: float tiles
        bound = 1e-9 if tight else MUL_MAT_Q8_NMSE
        if m == 1 and t.name in Q16_TYPES:  # the one-row kernel's 16-bit activations (~5e-10)
            bound = 1e-8
        assert nmse(a, b) <= bound, (m, nmse(a, b))


@pytest.mark.parametrize("t", MATVEC_TYPES, ids=lambda t: t.name)
def test_matvec_kernels_match_gguf_py(t):
    gguf = pytest.importorskip("gguf")
    from llamapy.ggml.cpu import matmul_kernels as mk

    w, raw = make_weight(t, 5, 512)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t)))
    x = f32(2, 512)
    out = np.zeros((2, 5), np.float32)
    mk.MATVEC[t.name](raw, x, out, mk.F16_TABLE)
    assert nmse(out, as_kernel_sees(t.name, x, matvec=True) @ ref.T) < 1e-10


def test_mul_mat_views_and_batches():
    w, _ = make_weight(T.Q8_0, 9, 64)
    x = ops.new_tensor(T.F32, (2, 3, 64))
    xt = ops.new_tensor(T.F32, (64, 5))  # activations through a transposed (non-contiguous) view
    a = ops.new_tensor(T.F32, (2, 7, 32))  # heads: a broadcast over b's
    b = ops.new_tensor(T.F32, (4, 3, 32))
    v1 = ops.new_tensor(T.F32, (64,))
    outs = [ops.mul_mat(w, x), ops.mul_mat(w, ops.transpose(xt)), ops.mul_mat(a, b), ops.mul_mat(w, v1)]
    feeds = {x: f32(2, 3, 64), xt: f32(64, 5), a: f32(2, 7, 32), b: f32(4, 3, 32), v1: f32(64)}
    check(outs, feeds)


@pytest.mark.parametrize(
    "t",
    [T.Q4_K, T.Q8_0, T.Q6_K, T.F16, T.F32, T.Q3_K, T.Q4_0, T.IQ4_NL, T.MXFP4, T.IQ3_S],
    ids=lambda t: t.name,
)
def test_get_rows(t):  # the types with a fast dequantize kernel (one step) and without one (IQ3_S)
    w, _ = make_weight(t, 11, 256)
    ids = ops.new_tensor(T.I32, (4,))
    check(ops.get_rows(w, ids), {ids: np.array([10, 0, 3, 10], np.int32)}, tol=0)


def test_get_rows_bad_id_is_an_error():
    w, _ = make_weight(T.Q8_0, 3, 32)
    ids = ops.new_tensor(T.I32, (1,))
    s = Scheduler([CPU])
    with pytest.raises(ComputeError, match="row id 3"):
        s.compute(Graph(ops.get_rows(w, ids)), {ids: np.array([3], np.int32)})


def test_elementwise_unary_norms():
    a = ops.new_tensor(T.F32, (5, 3, 37))
    b = ops.new_tensor(T.F32, (3, 1))
    c = ops.new_tensor(T.F32, (37,))
    at = ops.transpose(a)  # non-contiguous view
    outs = [a + b, a - c, a * c, ops.div(a, ops.scale(c, 0.5, bias=4.0)), ops.scale(a, -2.0)]
    outs += [f(a) for f in (ops.silu, ops.gelu, ops.gelu_quick, ops.tanh, ops.relu)]
    outs += [ops.softcap(at, 1.5), ops.silu(at), ops.rms_norm(a, 1e-6), ops.rms_norm(at, 1e-5)]
    outs += [ops.norm(a, 1e-5), ops.sum_rows(a), ops.mean(at), ops.argmax(a), ops.top_k(a, 4)]
    outs += [ops.swiglu(a, a * a), ops.geglu(at, at), ops.cont(at), ops.concat(a, a, 1)]
    outs += [ops.pad(a, [1, 0, (2, 3)])]
    check(outs, {a: f32(5, 3, 37), b: f32(3, 1), c: f32(37)}, tol=1e-10)


def test_glu_on_views_of_a_fused_tensor():
    ug = ops.new_tensor(T.F32, (3, 2 * 24))
    up = ops.view(ug, (3, 24), strides=(2 * 24 * 4, 4), offset=0)
    gate = ops.view(ug, (3, 24), strides=(2 * 24 * 4, 4), offset=24 * 4)
    check([ops.swiglu(gate, up), ops.geglu(up, gate)], {ug: f32(3, 48)}, tol=1e-10)


@pytest.mark.parametrize(
    "kw",
    [
        dict(n_dims=16, mode=0),
        dict(n_dims=16, mode=2, freq_base=500.0, freq_scale=0.5),
        dict(n_dims=8, mode=2),  # partial rotary dims
        dict(n_dims=16, mode=0, n_ctx_orig=64, ext_factor=1.0, freq_scale=0.25, attn_factor=1.1),
    ],
)
def test_rope(kw):
    qkv = ops.new_tensor(T.F32, (3, 4 * 16 + 2 * 16))  # rope a view of a fused qkv projection
    q = ops.view(qkv, (3, 4, 16), strides=(qkv.strides[0], 16 * 4, 4))
    k = ops.reshape(ops.cont(ops.view(qkv, (3, 32), strides=(qkv.strides[0], 4), offset=64 * 4)), (3, 2, 16))
    pos = ops.new_tensor(T.I32, (3,))
    ff = ops.weight("ff", T.F32, (kw["n_dims"] // 2,), (1 + RNG.random(kw["n_dims"] // 2)).astype(np.float32))
    outs = [ops.rope(q, pos, **kw), ops.rope(k, pos, **kw), ops.rope(k, pos, freq_factors=ff, **kw)]
    check(outs, {qkv: f32(3, 96), pos: np.array([0, 7, 300], np.int32)}, tol=1e-10)


def test_soft_max():
    a = ops.new_tensor(T.F32, (4, 3, 9))
    m = ops.new_tensor(T.F32, (3, 9))
    mv = np.where(RNG.random((3, 9)) < 0.3, -np.inf, 0).astype(np.float32)
    mv[:, 0] = 0
    outs = [ops.soft_max(a), ops.soft_max(a, m, scale=0.3), ops.soft_max(a, m, scale=0.7, max_bias=8.0)]
    check(outs, {a: f32(4, 3, 9), m: mv}, tol=1e-10)


@pytest.mark.parametrize("kv_type", [T.F16, T.F32, T.Q8_0, T.Q4_0], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tokens", [1, 5])
def test_flash_attn_over_a_kv_cache(kv_type, n_tokens):
    """Write K/V rows into a cache buffer with set_rows, then attend over a view of the first n_kv."""
    H, Hkv, D, n_ctx, n_kv = 4, 2, 32, 16, 7
    kc = ops.buffer("k", kv_type, (n_ctx, Hkv * D))
    vc = ops.buffer("v", kv_type, (n_ctx, Hkv * D))
    kn = ops.new_tensor(T.F32, (n_tokens, Hkv * D))
    vn = ops.new_tensor(T.F32, (n_tokens, Hkv * D))
    idx = ops.new_tensor(T.I32, (n_tokens,))
    kw_, vw_ = ops.set_rows(kc, kn, idx), ops.set_rows(vc, vn, idx)
    k = ops.view(kw_, (n_kv, Hkv, D), strides=(kc.strides[0], kc.strides[0] // Hkv, kc.strides[1]))
    v = ops.view(vw_, (n_kv, Hkv, D), strides=(vc.strides[0], vc.strides[0] // Hkv, vc.strides[1]))
    q = ops.new_tensor(T.F32, (n_tokens, H, D))
    mask = ops.new_tensor(T.F32, (n_tokens, n_kv))
    pos = np.arange(n_kv - n_tokens, n_kv)
    mv = np.where(np.arange(n_kv)[None, :] <= pos[:, None], 0, -np.inf).astype(np.float32)
    outs = [
        ops.flash_attn_ext(q, k, v, mask, 0.2),
        ops.flash_attn_ext(q, k, v, mask, 0.2, logit_softcap=3.0, max_bias=4.0),
    ]
    g = Graph(outs)
    feeds = {q: f32(n_tokens, H, D), idx: pos.astype(np.int32), mask: mv}
    feeds |= {kn: f32(n_tokens, Hkv * D), vn: f32(n_tokens, Hkv * D)}
    res = []
    for be in (CPU, NumpyBackend()):
        kc.data[:] = 0
        vc.data[:] = 0
        s = Scheduler([be])
        s.compute(g, feeds)
        res.append(([s.get(o) for o in outs], kc.data.copy()))
    (got, kcpu), (ref, kref) = res
    np.testing.assert_array_equal(kcpu, kref)  # the cache writes agree byte for byte
    for a, b in zip(got, ref, strict=True):
        assert nmse(a, b) < 1e-10


def test_graph_reuse_gives_identical_results():
    w, _ = make_weight(T.Q4_K, 32, 256)
    x = ops.new_tensor(T.F32, (2, 256))
    h = ops.rms_norm(ops.silu(ops.mul_mat(w, x)), 1e-6)
    g = Graph(h)
    s = Scheduler([CPU])
    xv, xv2 = f32(2, 256), f32(2, 256)
    s.compute(g, {x: xv})
    r1 = s.get(h)
    s.compute(g, {x: xv2})
    r2 = s.get(h)
    s.compute(g, {x: xv})
    np.testing.assert_array_equal(s.get(h), r1)
    assert not np.array_equal(r1, r2)


def test_scheduler_split_across_cpu_and_numpy():
    w1, _ = make_weight(T.Q6_K, 32, 256)
    w2, _ = make_weight(T.Q5_0, 256, 32)
    x = ops.new_tensor(T.F32, (3, 256))
    h = ops.mul_mat(w1, x)
    h2 = ops.silu(h)
    y = ops.rms_norm(ops.mul_mat(w2, h2) + x, 1e-6)
    g = Graph(y)
    xv = f32(3, 256)
    one = Scheduler([CPU])
    one.compute(g, {x: xv})
    npb = NumpyBackend()
    two = Scheduler([CPU, npb])
    two.set_backend(h2, npb)
    two.set_backend(w2, CPU)  # the second weight lives on the CPU backend: its user goes back there
    two.compute(g, {x: xv})
    splits = two.splits(g)
    assert [sp.backend.name for sp in splits] == ["cpu", "numpy", "cpu"]
    assert splits[1].nodes[0] is h2
    assert nmse(two.get(y), one.get(y)) < 1e-10


def test_rms_norm_times_weight_is_fused_and_exact():
    x = ops.new_tensor(T.F32, (3, 40))
    w = ops.weight("norm", T.F32, (40,), f32(40))
    shared = ops.rms_norm(x, 1e-6)  # used twice: not fused
    outs = [ops.mul(ops.rms_norm(x, 1e-5), w), ops.mul(shared, w) + shared]
    got, _ = check(outs, {x: f32(3, 40)}, tol=1e-12)
    s = Scheduler([CPU])
    s.plan(Graph(outs[0]))
    assert CPU._fused_muls and CPU._fused_norms


def test_fused_norm_input_stays_alive_until_the_fused_step():
    """The fused step reads the norm's input later than the graph says: the planner must not hand
    that memory to the mul's output (regression: wrong logits with 2 threads)."""
    a = ops.new_tensor(T.F32, (7, 64))
    w = ops.weight("norm", T.F32, (64,), f32(64))
    h = ops.silu(a)
    for _ in range(3):
        h = ops.mul(ops.rms_norm(ops.scale(h, 1.5), 1e-6), w)
    g = Graph(h)
    s = Scheduler([CPU])
    plan = s.plan(g)
    for n in g.nodes:
        if n.op == "mul":
            x = n.src[0].src[0]
            o1, o2 = plan.offsets[id(x)], plan.offsets[id(n)]
            assert o1 + x.nbytes <= o2 or o2 + n.nbytes <= o1, "fused output overlaps its input"
    check(h, {a: f32(7, 64)}, tol=1e-12)


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_K, T.F32], ids=lambda t: t.name)
@pytest.mark.parametrize("Tn", [5, 300])  # 300 tokens: experts get more rows than the mat-vec kernels take
def test_mul_mat_id_experts(t, Tn):
    E, N, K, U = 4, 6, 256, 2
    a = ops.weight("experts", t, (E, N, K), quantize(f32(E, N, K), t) if t != T.F32 else f32(E, N, K))
    b = ops.new_tensor(T.F32, (Tn, 1, K))
    b2 = ops.new_tensor(T.F32, (Tn, U, K))
    ids = ops.new_tensor(T.I32, (Tn, U))
    iv = RNG.integers(0, E, size=(Tn, U)).astype(np.int32)
    # an expert with at most matvec_max_rows rows runs a mat-vec kernel (k-quants: 8-bit activations)
    counts = np.bincount(iv.reshape(-1))
    few = counts[counts > 0].min() <= matvec_max_rows(t.name)
    check(
        [ops.mul_mat_id(a, b, ids), ops.mul_mat_id(a, b2, ids)],
        {b: f32(Tn, 1, K), b2: f32(Tn, U, K), ids: iv},
        tol=MUL_MAT_Q8_NMSE if t.name in VEC_DOT_TYPE and few else 1e-7,
    )


# offsets of the float16 super-scales in each block (every other byte is random)
_F16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.IQ4_NL: (0,), T.IQ4_XS: (0,),
}  # fmt: skip


@pytest.mark.parametrize("t", MATVEC_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3])
def test_matvec_kernels_on_random_bits(t, m):
    """Every bit pattern of the quants, scales and mins (random bytes, sane float16 super-scales)
    against the NumPy codec: catches unpacking mistakes that quantized real data may never exercise."""
    from llamapy.ggml.cpu import matmul_kernels as mk
    from llamapy.ggml.types import TRAITS

    rng = np.random.default_rng(int(t) * 10 + m)
    n, k = 7, 512
    tr = TRAITS[t]
    nb = k // tr.block_size
    raw = rng.integers(0, 256, size=(n, nb, tr.type_size), dtype=np.uint8)
    for off in _F16_FIELDS[t]:
        raw[:, :, off : off + 2] = (
            rng.uniform(0.01, 0.1, size=(n, nb)).astype(np.float16).view(np.uint8).reshape(n, nb, 2)
        )
    raw = raw.reshape(n, nb * tr.type_size)
    x = f32(m, k)
    out = np.zeros((m, n), np.float32)
    mk.MATVEC[t.name](raw, x, out, mk.F16_TABLE)
    ref = as_kernel_sees(t.name, x, matvec=True) @ dequantize(raw, t).astype(np.float64).T
    assert nmse(out, ref) < 1e-10


def test_attn_temp_scale():
    """Attention temperature per token (Llama 4: offset 1; Mistral 3: offset 0), the formula of
    transformers' get_llama_4_attn_scale; steps at multiples of floor_scale."""
    from llamapy.ggml.tensor import GraphError

    pos = ops.new_tensor(T.I32, (9,))
    p = np.array([0, 1, 3, 4, 7, 8, 15, 16, 100], np.int32)
    outs = [ops.attn_temp_scale(pos, 0.1, 4, 0.0), ops.attn_temp_scale(pos, 0.5, 8, 1.0)]
    got, ref = check(outs, {pos: p}, tol=0)
    for g, s, f, off in ((got[0], 0.1, 4, 0), (got[1], 0.5, 8, 1)):
        want = 1 + s * np.log(1 + np.floor((p + off) / f))
        np.testing.assert_allclose(g.reshape(-1), want, rtol=1e-6)
    assert got[0].shape == (9, 1, 1) and got[0][0, 0, 0] == 1.0 and got[0][3, 0, 0] > 1.0
    with pytest.raises(GraphError):
        ops.attn_temp_scale(ops.new_tensor(T.F32, (9,)), 0.1, 4)


# -- gpt-oss ops: swiglu_oai, add_id, attention sinks ---------------------------------------------
def test_swiglu_oai_clamps_gate_and_up():
    """gate clamped above at limit, up to [-limit, limit]: values beyond +-limit on both inputs."""
    a, b = ops.new_tensor(T.F32, (5, 24)), ops.new_tensor(T.F32, (5, 24))
    av, bv = f32(5, 24, scale=6.0), f32(5, 24, scale=6.0)
    assert (av > 7).any() and (np.abs(bv) > 7).any()
    got, _ = check(
        [ops.swiglu_oai(a, b), ops.swiglu_oai(a, b, alpha=1.0, limit=2.0)], {a: av, b: bv}, tol=1e-12
    )
    for g, al, lim in ((got[0], 1.702, 7.0), (got[1], 1.0, 2.0)):
        x, y = np.minimum(av.astype(np.float64), lim), np.clip(bv.astype(np.float64), -lim, lim)
        np.testing.assert_allclose(g, x / (1 + np.exp(-al * x)) * (y + 1), rtol=1e-5, atol=1e-6)


def test_add_id_adds_each_slots_expert_bias():
    from llamapy.ggml.tensor import GraphError

    Tn, U, E, N = 5, 2, 4, 12
    a, b, ids = (
        ops.new_tensor(T.F32, (Tn, U, N)),
        ops.new_tensor(T.F32, (E, N)),
        ops.new_tensor(T.I32, (Tn, U)),
    )
    av, bv = f32(Tn, U, N), f32(E, N)
    iv = RNG.integers(0, E, size=(Tn, U)).astype(np.int32)
    got, _ = check(ops.add_id(a, b, ids), {a: av, b: bv, ids: iv}, tol=0)
    np.testing.assert_array_equal(got[0], av + bv[iv])
    with pytest.raises(ComputeError, match="expert id 9"):
        run_both(ops.add_id(a, b, ids), {a: av, b: bv, ids: np.full((Tn, U), 9, np.int32)})
    with pytest.raises(GraphError):
        ops.add_id(a, ops.new_tensor(T.F32, (E, N + 1)), ids)


def _sink_reference(s: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """softmax over [scores | sink] per head (s: [H, T, KV]), the sink's column dropped (HF's gpt-oss)."""
    full = np.concatenate([s, np.broadcast_to(sinks[:, None, None], s.shape[:2] + (1,))], axis=-1)
    full = np.exp(full - full.max(axis=-1, keepdims=True))
    return (full / full.sum(axis=-1, keepdims=True))[..., :-1]


def test_soft_max_with_sinks():
    H, Tn, KV = 4, 3, 9
    a, m, sk = (
        ops.new_tensor(T.F32, (H, Tn, KV)),
        ops.new_tensor(T.F32, (Tn, KV)),
        ops.new_tensor(T.F32, (H,)),
    )
    av = f32(H, Tn, KV)
    mv = np.where(RNG.random((Tn, KV)) < 0.3, -np.inf, 0).astype(np.float32)
    mv[:, 0] = 0
    sv = np.array([-1.0, 0.0, 2.0, 30.0], np.float32)  # the last one takes almost all the mass
    got, _ = check(
        [ops.soft_max(a, m, scale=0.5, sinks=sk), ops.soft_max(a, sinks=sk)], {a: av, m: mv, sk: sv}, 1e-10
    )
    np.testing.assert_allclose(got[0], _sink_reference(av * 0.5 + mv, sv), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[1], _sink_reference(av.astype(np.float64), sv), rtol=1e-5, atol=1e-7)
    assert got[0][3].sum() < 1e-6 and abs(got[0][0].sum(-1) - 1).max() > 1e-3  # rows no longer sum to 1


@pytest.mark.parametrize("n_tokens", [1, 6])
def test_flash_attn_with_sinks(n_tokens):
    """Fused attention with sinks equals the unfused softmax-with-sinks (and the HF formula)."""
    from llamapy.ggml.tensor import GraphError

    H, Hkv, D, KV = 4, 2, 16, 8
    q, k, v = (
        ops.new_tensor(T.F32, (n_tokens, H, D)),
        ops.new_tensor(T.F32, (KV, Hkv, D)),
        ops.new_tensor(T.F32, (KV, Hkv, D)),
    )
    mask, sk = ops.new_tensor(T.F32, (n_tokens, KV)), ops.new_tensor(T.F32, (H,))
    pos = np.arange(KV - n_tokens, KV)
    mv = np.where(np.arange(KV)[None, :] <= pos[:, None], 0, -np.inf).astype(np.float32)
    qv, kv_, vv = f32(n_tokens, H, D), f32(KV, Hkv, D), f32(KV, Hkv, D)
    sv = f32(H, scale=2.0)
    got, _ = check(
        ops.flash_attn_ext(q, k, v, mask, 0.25, sinks=sk), {q: qv, k: kv_, v: vv, mask: mv, sk: sv}, 1e-10
    )
    kh = np.repeat(kv_, H // Hkv, axis=1).transpose(1, 0, 2)  # [H, KV, D]
    vh = np.repeat(vv, H // Hkv, axis=1).transpose(1, 0, 2)
    s = np.einsum("thd,hkd->htk", qv.astype(np.float64), kh) * 0.25 + mv
    want = np.einsum("htk,hkd->thd", _sink_reference(s, sv.astype(np.float64)), vh)
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-6)
    with pytest.raises(GraphError, match="sinks"):
        ops.flash_attn_ext(q, k, v, None, 0.25, sinks=sk)
    with pytest.raises(GraphError, match="sinks"):
        ops.flash_attn_ext(q, k, v, mask, 0.25, sinks=ops.new_tensor(T.F32, (H + 1,)))


def test_moe_group_mask():
    """Group-limited routing: groups ranked by the sum of their top two; the others are -inf."""
    a = np.array(
        [[0.9, 0.1, 0.5, 0.5, 0.2, 0.3, 0.0, 0.05], [0.0, 0.1, 0.2, 0.3, 0.9, 0.8, 0.7, 0.0]], np.float32
    )
    x = ops.new_tensor(T.F32, a.shape)
    outs = [ops.moe_group_mask(x, 4, 2), ops.moe_group_mask(x, 2, 1), ops.moe_group_mask(x, 4, 4)]
    got, ref = run_both(outs, {x: a})
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_array_equal(g, r)
    inf = -np.inf

    def f32(*v: float) -> np.ndarray:
        return np.array(v, np.float32)

    # row 0: group sums 1.0, 1.0, 0.5, 0.05 -> groups 0 and 1; row 1: 0.1, 0.5, 1.7, 0.7 -> 2 and 3
    np.testing.assert_array_equal(got[0][0], f32(0.9, 0.1, 0.5, 0.5, inf, inf, inf, inf))
    np.testing.assert_array_equal(got[0][1], f32(inf, inf, inf, inf, 0.9, 0.8, 0.7, 0.0))
    np.testing.assert_array_equal(got[1][0], f32(0.9, 0.1, 0.5, 0.5, inf, inf, inf, inf))
    np.testing.assert_array_equal(got[1][1], f32(inf, inf, inf, inf, 0.9, 0.8, 0.7, 0.0))
    np.testing.assert_array_equal(got[2], a)  # every group kept


@pytest.mark.parametrize("kv_type", [T.F16, T.F32], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tokens", [1, 5])
def test_alibi_over_a_kv_cache(kv_type, n_tokens):
    """ALiBi over cached K/V (MPT, Refact): the mask holds -(query pos - key pos) (-inf where masked)
    and each head scales it by its slope; fused (flash_attn_ext) and unfused (soft_max) attention, CPU
    and NumPy, against a float64 reference of the formula itself."""
    H, D, n_ctx, n_kv, max_bias, scale = 6, 32, 16, 9, 8.0, 0.25  # 6 heads: both slope series
    kc, vc = ops.buffer("ka", kv_type, (n_ctx, H * D)), ops.buffer("va", kv_type, (n_ctx, H * D))
    kn, vn = ops.new_tensor(T.F32, (n_tokens, H * D)), ops.new_tensor(T.F32, (n_tokens, H * D))
    idx = ops.new_tensor(T.I32, (n_tokens,))
    kw_, vw_ = ops.set_rows(kc, kn, idx), ops.set_rows(vc, vn, idx)
    k = ops.view(kw_, (n_kv, H, D), strides=(kc.strides[0], kc.strides[0] // H, kc.strides[1]))
    v = ops.view(vw_, (n_kv, H, D), strides=(vc.strides[0], vc.strides[0] // H, vc.strides[1]))
    q = ops.new_tensor(T.F32, (n_tokens, H, D))
    mask = ops.new_tensor(T.F32, (n_tokens, n_kv))
    pos = np.arange(n_kv - n_tokens - 1, n_kv - 1)  # the last cell stays unused (masked)
    d = (pos[:, None] - np.arange(n_kv)[None, :]).astype(np.float32)
    mv = np.where(d >= 0, -d, -np.inf).astype(np.float32)
    qh = ops.cont(ops.permute(q, (1, 0, 2)))
    kh = ops.cont(ops.permute(k, (1, 0, 2)))
    kq = ops.soft_max(ops.mul_mat(kh, qh), mask, scale=scale, max_bias=max_bias)
    unfused = ops.cont(ops.permute(ops.mul_mat(ops.cont(ops.permute(v, (1, 2, 0))), kq), (1, 0, 2)))
    outs = [ops.flash_attn_ext(q, k, v, mask, scale, max_bias=max_bias), unfused]
    qv, knv, vnv = f32(n_tokens, H, D), f32(n_tokens, H * D), f32(n_tokens, H * D)
    feeds = {q: qv, idx: pos.astype(np.int32), mask: mv, kn: knv, vn: vnv}
    g = Graph(outs)
    res = []
    for be in (CPU, NumpyBackend()):
        kc.data[:] = 0
        vc.data[:] = 0
        s = Scheduler([be])
        s.compute(g, feeds)
        res.append([s.get(o) for o in outs])
        kall = kc.data.view(np.float16 if kv_type == T.F16 else np.float32).astype(np.float64)
        vall = vc.data.view(np.float16 if kv_type == T.F16 else np.float32).astype(np.float64)
    kall = kall.reshape(n_ctx, H, D)[:n_kv]
    vall = vall.reshape(n_ctx, H, D)[:n_kv]
    slopes = ops.alibi_slopes(H, max_bias).astype(np.float64)
    ref = np.zeros((n_tokens, H, D))
    for h in range(H):
        sc = qv[:, h].astype(np.float64) @ kall[:, h].T * scale + slopes[h] * mv
        e = np.exp(sc - sc.max(-1, keepdims=True))
        ref[:, h] = (e / e.sum(-1, keepdims=True)) @ vall[:, h]
    for got in res:
        for a in got:
            assert nmse(a, ref) < 1e-10
    assert slopes[4] > slopes[0] > slopes[3]  # 6 heads: 2^-2, 2^-4, 2^-6, 2^-8, then 2^-1, 2^-3


@pytest.mark.parametrize("t", MATVEC_TYPES, ids=lambda t: t.name)
def test_mul_mat_small_batches(t):
    """2..``matvec_max_rows`` rows: the batch kernels (each block decoded once per 4 or 8 rows)."""
    n, k = 13, 512
    w, _ = make_weight(t, n, k)
    ms = sorted({2, 4, 5, 8, matvec_max_rows(t.name)})
    outs, feeds = [], {}
    for m in ms:
        x = ops.new_tensor(T.F32, (m, k))
        feeds[x] = f32(m, k)
        outs.append(ops.mul_mat(w, x))
    got, ref = run_both(outs, feeds)
    for m, a, b in zip(ms, got, ref, strict=True):
        assert nmse(a, b) <= (MUL_MAT_Q8_NMSE if t.name in VEC_DOT_TYPE else 1e-9), (m, nmse(a, b))


@pytest.mark.parametrize("H,Hkv", [(8, 2), (4, 1), (3, 3)])
@pytest.mark.parametrize("n_tokens", [1, 3])
def test_flash_attn_decode_long_f16_cache_in_chunks(H, Hkv, n_tokens):
    """Decode over a long F16 cache: split into chunks of keys per kv head (flash decoding), with a
    sliding-window mask that leaves whole chunks masked, a query row that sees nothing, soft-capping and
    ALiBi; the merged chunks must equal the reference."""
    from llamapy.ggml.cpu.attn_decode import MIN_CHUNK, n_chunks_for

    D, n_kv = 40, 5 * MIN_CHUNK + 17
    assert n_chunks_for(n_kv, Hkv, 2) > 1
    k = ops.new_tensor(T.F16, (n_kv, Hkv, D))
    v = ops.new_tensor(T.F16, (n_kv, Hkv, D))
    q = ops.new_tensor(T.F32, (n_tokens, H, D))
    mask = ops.new_tensor(T.F32, (n_tokens, n_kv))
    pos = np.arange(n_kv - n_tokens, n_kv)
    j = np.arange(n_kv)[None, :]
    mv = np.where((j <= pos[:, None]) & (j > pos[:, None] - 2 * MIN_CHUNK), 0, -np.inf).astype(np.float32)
    if n_tokens > 1:
        mv[1] = -np.inf  # a row that sees no key: zeros
    outs = [
        ops.flash_attn_ext(q, k, v, mask, 0.2),
        ops.flash_attn_ext(q, k, v, mask, 0.2, logit_softcap=3.0, max_bias=4.0),
    ]
    feeds = {q: f32(n_tokens, H, D), mask: mv}
    feeds |= {k: f32(n_kv, Hkv, D).astype(np.float16), v: f32(n_kv, Hkv, D).astype(np.float16)}
    check(outs, feeds, tol=1e-10)


@pytest.mark.parametrize(
    "kernel,half",
    [("attn_heads", True), ("attn_heads", False), ("attn_split", True), ("attn_split", False)]
    + [("attn_heads_f16x8", True)],  # F16 caches only
    ids=lambda v: ("f16" if v else "f32") if isinstance(v, bool) else v,
)
@pytest.mark.parametrize("H,Hkv,n_tokens", [(8, 2, 1), (4, 1, 3), (3, 3, 2), (2, 1, 1)])
def test_decode_attention_kernels_against_float64(kernel, half, H, Hkv, n_tokens):
    """Both decode-attention kernels (the backend picks one by heads and threads): F16 half bits or
    float32 K/V, a sliding-window mask, a query row that sees nothing (zeros), soft-capping, ALiBi."""
    from llamapy.ggml.cpu import attn_decode as ad

    rng = np.random.default_rng(H * 10 + Hkv + n_tokens)
    D, n_kv = 24, 3 * ad.MIN_CHUNK + 5
    q = rng.standard_normal((n_tokens, H, D)).astype(np.float32)
    k = rng.standard_normal((n_kv, Hkv, D)).astype(np.float16)
    v = rng.standard_normal((n_kv, Hkv, D)).astype(np.float16)
    pos = np.arange(n_kv - n_tokens, n_kv)
    j = np.arange(n_kv)[None, :]
    mask = np.where((j <= pos[:, None]) & (j > pos[:, None] - 100), 0, -np.inf).astype(np.float32)
    if n_tokens > 1:
        mask[1] = -np.inf
    slopes = np.linspace(0.25, 1.0, H).astype(np.float32)
    scale, cap = np.float32(0.3), np.float32(2.5)
    out = np.full((n_tokens, H, D), np.nan, np.float32)
    kk, vv = (k.view(np.uint16), v.view(np.uint16)) if half else (k.astype(np.float32), v.astype(np.float32))
    if kernel == "attn_split":
        ad.attn_split(q, kk, vv, mask, True, scale, cap, slopes, out, ad.n_chunks_for(n_kv, Hkv, 2))
    elif kernel == "attn_heads_f16x8":
        ad.attn_heads_f16x8(q, kk.reshape(-1), vv.reshape(-1), mask, True, scale, cap, slopes, out, Hkv, D)
    else:
        ad.attn_heads(q, kk, vv, mask, True, scale, cap, slopes, out)
    g = H // Hkv
    for t in range(n_tokens):
        for h in range(H):
            sc = (k[:, h // g].astype(np.float64) @ q[t, h].astype(np.float64)) * scale
            sc = cap * np.tanh(sc / cap) + slopes[h] * mask[t]
            if np.isneginf(sc).all():
                assert (out[t, h] == 0).all()
                continue
            e = np.exp(sc - sc.max())
            ref = (e / e.sum()) @ v[:, h // g].astype(np.float64)
            assert np.abs(out[t, h] - ref).max() < 1e-5, (t, h)
    assert ad.use_split(H, 2 * H) and not ad.use_split(H, H)
