"""Every CUDA kernel against the NumPy reference backend (tiny shapes: the simulator is slow)."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.backend import ComputeError
from llamapy.ggml.quants import quantize

RNG = np.random.default_rng(7)
QTYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b**2), 1e-30))


def run(cuda_backend, outs, feeds, pin=None, tol=1e-9):
    """Compute ``outs`` on the CUDA backend (all of it unless ``pin`` lists the nodes to put there) and
    on the reference; compare by normalized mean squared error."""
    outs = outs if isinstance(outs, list) else [outs]
    g = Graph(outs)
    ref = Scheduler([NumpyBackend()])
    ref.compute(g, feeds)
    s = Scheduler([NumpyBackend(), cuda_backend])
    for n in pin if pin is not None else g.nodes:
        s.set_backend(n, cuda_backend)
    s.compute(g, feeds)
    assert any(sp.backend is cuda_backend for sp in s.splits(g))
    for o in outs:
        a, b = s.get(o), ref.get(o)
        assert a.shape == b.shape
        if a.dtype.kind in "iu":
            np.testing.assert_array_equal(a, b)
        else:
            assert nmse(a, b) <= tol, (o, nmse(a, b))
    return s, g


def weight(t: T, n: int, k: int) -> ops.Tensor:
    wf = f32(n, k)
    raw = wf if t == T.F32 else wf.astype(np.float16) if t == T.F16 else quantize(wf, t)
    return ops.weight(f"w_{t.name}", t, (n, k), raw)


@pytest.mark.parametrize("t", [T.F32, T.F16, *QTYPES], ids=lambda t: t.name)
def test_mul_mat_and_get_rows_every_type(cuda_backend, t):
    w = weight(t, 5, 256)
    x = ops.new_tensor(T.F32, (2, 256))
    ids = ops.new_tensor(T.I32, (3,))
    run(
        cuda_backend,
        [ops.mul_mat(w, x), ops.get_rows(w, ids)],
        {x: f32(2, 256), ids: np.array([4, 0, 2], np.int32)},
    )


def test_mul_mat_tiled_gemm_batched_and_f16_activations(cuda_backend):
    from llamapy.ggml.cuda.backend import GEMM_MIN_TOKENS

    w = weight(T.Q4_0, 17, 64)
    x = ops.new_tensor(T.F32, (GEMM_MIN_TOKENS + 3, 64))  # the tiled GEMM: edge tiles on both axes
    a = ops.new_tensor(T.F32, (2, 3, 32))  # batched, a's batch axis broadcast by repeat
    b = ops.new_tensor(T.F32, (4, 5, 32))
    h = ops.new_tensor(T.F16, (2, 32))
    v = ops.new_tensor(T.F32, (32,))
    wf = weight(T.F32, 3, 32)
    outs = [ops.mul_mat(w, x), ops.mul_mat(a, b), ops.mul_mat(wf, h), ops.mul_mat(wf, v)]
    feeds = {x: f32(GEMM_MIN_TOKENS + 3, 64), a: f32(2, 3, 32), b: f32(4, 5, 32), v: f32(32)}
    feeds[h] = f32(2, 32).astype(np.float16)
    run(cuda_backend, outs, feeds, tol=1e-6)


def test_elementwise_glu_norms(cuda_backend):
    x = ops.new_tensor(T.F32, (2, 3, 8))
    y = ops.new_tensor(T.F32, (3, 1))  # broadcast over the last axis and the first
    z = ops.new_tensor(T.F32, (2, 3, 8))
    outs = [ops.add(x, y), ops.sub(x, z), ops.mul(x, y), ops.div(x, ops.scale(z, 0.0, 3.0))]
    outs += [ops.scale(x, 0.5, 0.25), ops.silu(x), ops.gelu(x), ops.gelu_quick(x), ops.tanh(x), ops.relu(x)]
    outs += [ops.softcap(x, 2.0), ops.swiglu(x, z), ops.geglu(x, z), ops.rms_norm(x, 1e-6), ops.norm(x, 1e-5)]
    outs += [ops.rms_norm(ops.permute(x, (1, 0, 2)), 1e-6)]  # a strided view as the source
    run(cuda_backend, outs, {x: f32(2, 3, 8), y: f32(3, 1), z: f32(2, 3, 8)})


def test_soft_max_with_mask(cuda_backend):
    a = ops.new_tensor(T.F32, (2, 3, 5))
    m = ops.new_tensor(T.F32, (3, 5))
    mh = ops.new_tensor(T.F16, (3, 5))
    mask = np.where(np.tri(3, 5, 2, dtype=bool), 0.0, -np.inf).astype(np.float32)
    outs = [ops.soft_max(a, m, scale=0.7), ops.soft_max(a, mh), ops.soft_max(a)]
    run(cuda_backend, outs, {a: f32(2, 3, 5), m: mask, mh: mask.astype(np.float16)})


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_modes_yarn_freq_factors(cuda_backend, mode):
    a = ops.new_tensor(T.F32, (3, 2, 8))
    pos = ops.new_tensor(T.I32, (3,))
    ff = ops.weight("ff", T.F32, (3,), (1.0 + np.arange(3)).astype(np.float32))
    outs = [
        ops.rope(a, pos, 6, mode, freq_base=100.0),
        ops.rope(a, pos, 8, mode, freq_base=500.0, freq_scale=0.5),
    ]
    outs += [ops.rope(a, pos, 6, mode, freq_factors=ff)]
    outs += [ops.rope(a, pos, 8, mode, freq_scale=0.25, ext_factor=1.0, n_ctx_orig=64, attn_factor=0.9)]
    run(cuda_backend, outs, {a: f32(3, 2, 8), pos: np.array([0, 5, 17], np.int32)}, tol=1e-10)


def test_set_rows_cpy_cont_into_f16_cache(cuda_backend):
    cache = ops.buffer("cache", T.F16, (6, 8))
    src = ops.new_tensor(T.F32, (2, 8))
    idx = ops.new_tensor(T.I64, (2,))
    w = ops.set_rows(cache, src, idx)
    x = ops.new_tensor(T.F32, (2, 4, 2))
    c = ops.cont(ops.permute(x, (2, 1, 0)))
    dst = ops.buffer("dst", T.F16, (4, 4))
    cp = ops.cpy(ops.reshape(x, (4, 4)), dst)
    q = weight(T.Q8_0, 2, 32)
    dq = ops.cpy(q, ops.buffer("dq", T.F32, (2, 32)))
    feeds = {src: f32(2, 8), idx: np.array([5, 1], np.int64), x: f32(2, 4, 2)}
    run(cuda_backend, [w, c, cp, dq], feeds, tol=1e-6)


def test_flash_attn_causal_softcap_sinks_gqa(cuda_backend):
    T_, H, Hkv, D, KV = 2, 4, 2, 8, 5
    q = ops.new_tensor(T.F32, (T_, H, D))
    k = ops.new_tensor(T.F16, (KV, Hkv, D))
    v = ops.new_tensor(T.F16, (KV, Hkv, D))
    m = ops.new_tensor(T.F32, (T_, KV))
    sinks = ops.weight("sinks", T.F32, (H,), f32(H))
    mask = np.zeros((T_, KV), np.float32)
    mask[0, 4] = mask[1, 0] = -np.inf  # causal + a window edge
    outs = [ops.flash_attn_ext(q, k, v, m, scale=0.3), ops.flash_attn_ext(q, k, v, m, 0.3, logit_softcap=5.0)]
    outs += [ops.flash_attn_ext(q, k, v, m, 0.3, sinks=sinks), ops.flash_attn_ext(q, k, v, None, 0.3)]
    feeds = {
        q: f32(T_, H, D),
        k: f32(KV, Hkv, D).astype(np.float16),
        v: f32(KV, Hkv, D).astype(np.float16),
        m: mask,
    }
    run(cuda_backend, outs, feeds, tol=1e-10)


def test_mul_mat_id(cuda_backend):
    a = ops.weight("experts", T.Q8_0, (3, 4, 32), quantize(f32(3, 4, 32), T.Q8_0))
    b = ops.new_tensor(T.F32, (2, 1, 32))
    ids = ops.new_tensor(T.I32, (2, 2))
    run(
        cuda_backend, ops.mul_mat_id(a, b, ids), {b: f32(2, 1, 32), ids: np.array([[2, 0], [1, 2]], np.int32)}
    )


def test_bad_row_index_is_a_compute_error(cuda_backend):
    w = weight(T.F32, 4, 8)
    ids = ops.new_tensor(T.I32, (2,))
    g = Graph([ops.get_rows(w, ids)])
    s = Scheduler([NumpyBackend(), cuda_backend])
    s.set_backend(g.nodes[0], cuda_backend)
    with pytest.raises(ComputeError, match="row index 9"):
        s.compute(g, {ids: np.array([1, 9], np.int32)})
    s.compute(g, {ids: np.array([1, 3], np.int32)})  # the error flag was reset


def test_split_graph_copies_across(cuda_backend):
    """CPU -> CUDA -> CPU -> CUDA: activations cross at each split point; weights stay on the device."""
    w = weight(T.Q4_K, 6, 256)
    x = ops.new_tensor(T.F32, (2, 256))
    h = ops.mul_mat(w, x)  # cuda
    h2 = ops.argmax(h)  # cpu only (no CUDA kernel)
    e = ops.get_rows(weight(T.F32, 6, 4), h2)  # cuda
    out = ops.add(e, e)
    s, g = run(cuda_backend, [out, h], {x: f32(2, 256)}, pin=[h, e, out])
    assert [sp.backend.name for sp in s.splits(g)][:3] == ["cuda", "numpy", "cuda"]
    assert not cuda_backend.supports_op(h2)


@pytest.mark.parametrize("t", [T.F16, T.Q4_0, T.Q5_1, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_mat_vec_block_kernel(t):
    """The GPU's decode kernel (a block of threads per output, shared-memory reduction), through the
    full simulator launch (a Python thread per CUDA thread: one tiny shape per type)."""
    from llamapy.ggml.cuda.backend import CUDABackend

    be = CUDABackend()
    be.block_matvec = True
    w = weight(t, 2, 256)
    x = ops.new_tensor(T.F32, (1, 256))
    run(be, ops.mul_mat(w, x), {x: f32(1, 256)})


@pytest.mark.parametrize("t", [T.F16, T.Q8_0, T.Q5_K], ids=lambda t: t.name)
def test_dequant_rows_kernel_for_cublas(cuda_backend, t):
    """The kernel that feeds cuBLAS on a GPU (the GEMM itself needs CuPy and a device)."""
    from llamapy.ggml.cuda import matmul
    from llamapy.ggml.numpy_backend import to_f32

    w = weight(t, 3, 256)
    buf = cuda_backend.leaf_buffer(w)
    a8, a16, a32, _ = cuda_backend.views(buf)
    out = cuda_backend.dev.empty(3 * 256 * 4)
    o32 = cuda_backend.views(out)[2]
    cuda_backend.launch(matmul.dequant_rows_k, 768, int(t), 768, 256, a8, a16, a32, 0, w.strides[0], o32, 0)
    got = np.zeros(768, np.float32)
    cuda_backend.dev.read(out, 0, got)
    np.testing.assert_array_equal(got.reshape(3, 256), to_f32(w.data, t))


@pytest.mark.parametrize("mode", [8, 40])
def test_rope_multi_section(cuda_backend, mode):
    a = ops.new_tensor(T.F32, (3, 2, 16))
    pos4 = ops.new_tensor(T.I32, (12,))
    pos = ops.new_tensor(T.I32, (3,))
    sec = (2, 3, 2, 1)
    outs = [ops.rope(a, pos4, 16, mode, sections=sec), ops.rope(a, pos, 12, mode, sections=sec)]
    feeds = {
        a: f32(3, 2, 16),
        pos4: RNG.integers(0, 40, 12).astype(np.int32),
        pos: np.array([0, 3, 9], np.int32),
    }
    run(cuda_backend, outs, feeds, tol=1e-10)


def test_alibi_and_sinks_in_soft_max_and_flash_attn(cuda_backend):
    H, T_, KV, D = 4, 2, 5, 8
    a = ops.new_tensor(T.F32, (H, T_, KV))
    m = ops.new_tensor(T.F32, (T_, KV))
    sinks = ops.weight("sinks2", T.F32, (H,), f32(H))
    q = ops.new_tensor(T.F32, (T_, H, D))
    k = ops.new_tensor(T.F16, (KV, 2, D))
    mask = -np.abs(np.arange(KV)[None, :] - np.arange(T_)[:, None] - 3).astype(np.float32)  # ALiBi-style
    outs = [ops.soft_max(a, m, 0.5, max_bias=8.0), ops.soft_max(a, m, 0.5, sinks=sinks)]
    outs += [ops.flash_attn_ext(q, k, k, m, 0.3, max_bias=8.0)]
    feeds = {a: f32(H, T_, KV), m: mask, q: f32(T_, H, D), k: f32(KV, 2, D).astype(np.float16)}
    run(cuda_backend, outs, feeds, tol=1e-10)


def test_moe_bias_and_clamped_swiglu(cuda_backend):
    a = ops.new_tensor(T.F32, (2, 2, 8))
    g = ops.new_tensor(T.F32, (2, 2, 8))
    b = ops.new_tensor(T.F32, (3, 8))
    ids = ops.new_tensor(T.I32, (2, 2))
    outs = [ops.add_id(a, b, ids), ops.swiglu_oai(a, g, alpha=1.702, limit=1.5)]
    feeds = {
        a: f32(2, 2, 8, scale=2.0),
        g: f32(2, 2, 8, scale=2.0),
        b: f32(3, 8),
        ids: np.array([[2, 0], [1, 1]], np.int32),
    }
    run(cuda_backend, outs, feeds, tol=1e-10)
