"""The recurrent ops (``ssm_conv``, ``gated_delta_net``, ``ssm_scan``, ``sigmoid``, ``softplus``, ``l2_norm``)
and multi-section rope on the CPU backend against the NumPy references (odd sizes, 1 and many tokens,
several sequences); the chunked and the recurrent delta rule agree; a torch oracle for the two
numerically delicate ones (the HF formulas written out)."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.cpu import ssm_steps
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.numpy_backend import mrope_positions
from llamapy.ggml.ssm_reference import delta_rule_chunked, delta_rule_recurrent
from llamapy.ggml.tensor import GraphError

RNG = np.random.default_rng(4321)
CPU = CPUBackend(2)


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b**2), 1e-30))


def run_both(out, feeds):
    g = Graph([out])
    res = []
    for be in (CPU, NumpyBackend()):
        s = Scheduler([be])
        s.compute(g, feeds)
        res.append(s.get(out))
    return res


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def inp(name, arr):
    return ops.new_tensor(T.F32, arr.shape, name)


@pytest.mark.parametrize("op", ["sigmoid", "softplus", "l2_norm"])
@pytest.mark.parametrize("shape", [(1, 7), (5, 33), (2, 3, 64)])
def test_activations(op: str, shape: tuple[int, ...]) -> None:
    x = f32(*shape, scale=8.0)  # softplus's threshold (20) and sigmoid's tails are reached
    a = inp("a", x)
    out = getattr(ops, op)(a)
    got, ref = run_both(out, {a: x})
    assert nmse(got, ref) < 1e-10
    if op == "l2_norm":
        np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-5)
    if op == "softplus":
        np.testing.assert_allclose(ref, np.logaddexp(0, x.astype(np.float64)), rtol=1e-6)


@pytest.mark.parametrize("n_s,n_t,ch,k", [(1, 1, 5, 4), (3, 9, 17, 4), (2, 1, 8, 3)])
def test_ssm_conv(n_s: int, n_t: int, ch: int, k: int) -> None:
    sx, c = f32(n_s, k - 1 + n_t, ch), f32(ch, k)
    a, b = inp("sx", sx), inp("c", c)
    got, ref = run_both(ops.ssm_conv(a, b), {a: sx, b: c})
    assert got.shape == (n_s, n_t, ch)
    assert nmse(got, ref) < 1e-12
    # the definition, by torch's grouped conv1d over the concatenated state
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.conv1d(
        torch.from_numpy(sx).permute(0, 2, 1), torch.from_numpy(c)[:, None, :], groups=ch
    ).permute(0, 2, 1)
    np.testing.assert_allclose(ref, want.numpy(), rtol=1e-4, atol=1e-5)


def _gdn_inputs(n_s: int, n_t: int, hk: int, h: int, d: int):
    q, k = f32(n_s, n_t, hk, d), f32(n_s, n_t, hk, d)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = f32(n_s, n_t, h, d)
    g = -np.abs(f32(n_s, n_t, h, scale=0.5))
    beta = 1.0 / (1.0 + np.exp(-f32(n_s, n_t, h)))
    st = f32(n_s, h, d, d, scale=0.3)
    return [x.astype(np.float32) for x in (q, k, v, g, beta, st)]


@pytest.mark.parametrize(
    "n_s,n_t,hk,h,d", [(1, 1, 2, 2, 8), (2, 1, 1, 3, 5), (3, 7, 2, 4, 16), (2, 70, 1, 2, 8)]
)
@pytest.mark.parametrize("chunk_min", [None, 64], ids=["token-by-token", "chunked-from-64"])
def test_gated_delta_net(
    n_s: int, n_t: int, hk: int, h: int, d: int, chunk_min: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU step (the Numba kernel; the chunked NumPy form where ``CHUNK_MIN_TOKENS`` enables it)."""
    monkeypatch.setattr(ssm_steps, "CHUNK_MIN_TOKENS", chunk_min)
    arrs = _gdn_inputs(n_s, n_t, hk, h, d)
    ts = [inp(n, a) for n, a in zip("qkvgbs", arrs, strict=True)]
    out = ops.gated_delta_net(*ts)
    got, ref = run_both(out, dict(zip(ts, arrs, strict=True)))
    assert got.shape == (n_s * n_t * h * d + n_s * h * d * d,)
    assert nmse(got, ref) < 1e-9, (chunk_min, nmse(got, ref))


def test_gated_delta_net_torch_oracle() -> None:
    """The reference against transformers' token-by-token formula (torch_recurrent_gated_delta_rule
    without its l2 norm and q scaling, which the graph does), grouped heads repeated interleaved there,
    tiled here: the key heads are tiled before the call."""
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    q, k, v, g, beta, st = _gdn_inputs(2, 5, 2, 2, 8)
    y, m = delta_rule_recurrent(q, k, v, g, beta, st)
    tq, tk, tv, tg, tb, ts = (torch.from_numpy(x.astype(np.float32)) for x in (q, k, v, g, beta, st))
    ty, tm = torch_recurrent_gated_delta_rule(
        tq * (q.shape[-1] ** 0.5), tk, tv, tg, tb, initial_state=ts, output_final_state=True
    )
    np.testing.assert_allclose(y, ty.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m, tm.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n_t,chunk", [(1, 4), (13, 4), (64, 64), (100, 64), (9, 16)])
def test_chunked_delta_rule_equals_recurrent(n_t: int, chunk: int) -> None:
    arrs = _gdn_inputs(2, n_t, 2, 4, 8)
    y0, m0 = delta_rule_recurrent(*arrs)
    y1, m1 = delta_rule_chunked(*arrs, chunk=chunk)
    np.testing.assert_allclose(y1, y0, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(m1, m0, rtol=1e-9, atol=1e-10)
    y2, m2 = delta_rule_chunked(*arrs, chunk=chunk, dtype=np.float32)  # as the CPU step runs it
    assert nmse(y2, y0) < 1e-9 and nmse(m2, m0) < 1e-9


def test_delta_rule_chunks_continue_one_another() -> None:
    """A prompt in two pieces (the state of the first passed to the second) equals one piece."""
    arrs = _gdn_inputs(1, 20, 1, 2, 8)
    y, m = delta_rule_recurrent(*arrs)
    first = [a[:, :11] for a in arrs[:5]]
    ya, ma = delta_rule_chunked(*first, arrs[5], chunk=4)
    yb, mb = delta_rule_chunked(*[a[:, 11:] for a in arrs[:5]], ma.astype(np.float32), chunk=4)
    np.testing.assert_allclose(np.concatenate([ya, yb], axis=1), y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mb, m, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mamba1", [False, True])
@pytest.mark.parametrize("n_s,n_t,h,p,g,n", [(1, 1, 2, 4, 1, 8), (2, 6, 4, 3, 2, 5)])
def test_ssm_scan(n_s: int, n_t: int, h: int, p: int, g: int, n: int, mamba1: bool) -> None:
    if mamba1:  # one channel per head, a decay per state
        p, g = 1, 1
    s0, x = f32(n_s, h, p, n), f32(n_s, n_t, h, p)
    dt = np.log1p(np.exp(f32(n_s, n_t, h))).astype(np.float32)
    a = -np.exp(f32(*((h, n) if mamba1 else (h,)), scale=0.5)).astype(np.float32)
    b, c = f32(n_s, n_t, g, n), f32(n_s, n_t, g, n)
    arrs = [s0, x, dt, a, b, c]
    ts = [inp(f"x{i}", v) for i, v in enumerate(arrs)]
    got, ref = run_both(ops.ssm_scan(*ts), dict(zip(ts, arrs, strict=True)))
    assert nmse(got, ref) < 1e-10
    # one step by hand: head 0 reads group 0
    st = s0[0, 0] * np.exp(dt[0, 0, 0] * a[0]) + dt[0, 0, 0] * np.outer(
        x[0, 0, 0], b[0, 0, 0]
    )  # (a[0]: [N] or a scalar)
    np.testing.assert_allclose(ref[:p], st @ c[0, 0, 0], rtol=1e-5)  # y[0, 0, 0]


def test_bad_shapes_are_graph_errors() -> None:
    a = ops.new_tensor(T.F32, (2, 5, 8), "a")
    with pytest.raises(GraphError, match="ssm_conv"):
        ops.ssm_conv(a, ops.new_tensor(T.F32, (7, 4), "c"))
    q = ops.new_tensor(T.F32, (1, 2, 2, 4), "q")
    v = ops.new_tensor(T.F32, (1, 2, 3, 4), "v")
    gb = ops.new_tensor(T.F32, (1, 2, 3), "g")
    with pytest.raises(GraphError, match="multiple"):
        ops.gated_delta_net(q, q, v, gb, gb, ops.new_tensor(T.F32, (1, 3, 4, 4), "s"))
    with pytest.raises(GraphError, match="sections"):
        ops.rope(a, ops.new_tensor(T.I32, (2,), "p"), 8, mode=2, sections=(1, 1, 1, 1))


@pytest.mark.parametrize("interleaved", [True, False])
def test_multi_section_rope(interleaved: bool) -> None:
    """Per-section positions (pos [4T]) on the CPU vs the reference; with one position for all sections
    (text) the result is plain neox rope over the same dims."""
    n_t, h, d, n_dims = 5, 3, 32, 24
    x = f32(n_t, h, d)
    mode = ops.ROPE_IMROPE if interleaved else ops.ROPE_MROPE
    sections = (4, 4, 3, 1)
    a = inp("a", x)
    p4 = ops.new_tensor(T.I32, (4 * n_t,), "p4")
    pos4 = RNG.integers(0, 50, 4 * n_t).astype(np.int32)
    got, ref = run_both(
        ops.rope(a, p4, n_dims, mode=mode, freq_base=1e4, sections=sections), {a: x, p4: pos4}
    )
    assert nmse(got, ref) < 1e-12
    p1 = ops.new_tensor(T.I32, (n_t,), "p1")
    pos = np.arange(3, 3 + n_t, dtype=np.int32)
    got, _ = run_both(ops.rope(a, p1, n_dims, mode=mode, sections=sections), {a: x, p1: pos})
    plain, _ = run_both(ops.rope(a, p1, n_dims, mode=2), {a: x, p1: pos})
    np.testing.assert_allclose(got, plain, rtol=1e-6, atol=1e-6)
    # which position each dim pair takes (HF's Qwen3.5 layout: t h w t h w ... then t)
    which = mrope_positions((2, 2, 1, 0), True, 12, np.arange(4) * 10, True)
    assert which[0].tolist() == [0, 10, 20, 0, 10, 0]
