"""The CPU backend's fused steps of a Gated DeltaNet layer (``ssm_steps.fusions``): ``silu(ssm_conv)`` as one
step, and Qwen3.5's delta-rule inputs (l2-normed and scaled q, l2-normed k, v, the decay
``softplus(alpha + bias) * a`` and ``sigmoid(b)``) made by the ``gated_delta_net`` step. The results equal
the op-by-op steps byte for byte (``FUSE = False``) and the NumPy backend to float tolerance; a node whose
result something else reads (a graph output) keeps its own step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.cpu import ssm_steps
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.tensor import Tensor

RNG = np.random.default_rng(5)


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _layer(n_s: int, n_t: int, hk: int, hv: int, d: int, k: int, expose: str, conv_buf: Tensor):
    """Outputs, state writes and feeds of one delta-net layer as ``rs_blocks.build_gated_delta_net`` builds
    it (the conv state read from and written back into ``conv_buf``'s first rows, in place; the recurrent
    state an input); ``expose``: also make that intermediate a graph output."""
    T_ = n_s * n_t
    ch = 2 * hk * d + hv * d
    arrs = {
        "qkv": f32(T_, ch),
        "z": f32(T_, hv * d),
        "conv_w": f32(ch, k, scale=0.5),
        "b": f32(T_, hv),
        "alpha": f32(T_, hv),
        "dt_bias": f32(hv),
        "ssm_a": -np.exp(f32(hv, scale=0.5)).astype(np.float32),
        "norm_w": f32(d),
        "state": f32(n_s, hv, d, d, scale=0.2),
    }
    ts = {n: ops.new_tensor(T.F32, a.shape, n) for n, a in arrs.items() if n != "conv_w"}
    ts["conv_w"] = ops.weight("conv_w", T.F32, arrs["conv_w"].shape, arrs.pop("conv_w"))  # as a model's
    rows = ops.view(conv_buf, (n_s, conv_buf.shape[1]), conv_buf.strides, 0)
    sx = ops.concat(ops.reshape(rows, (n_s, k - 1, ch)), ops.reshape(ts["qkv"], (n_s, n_t, ch)), axis=1)
    write = ops.cpy(ops.view(sx, (n_s, k - 1, ch), sx.strides, offset=4 * n_t * ch), rows)
    raw = ops.ssm_conv(sx, ts["conv_w"])
    conv = ops.silu(raw)
    st = (n_t * ch * 4, ch * 4)
    q = ops.view(conv, (n_s, n_t, hk, d), (*st, d * 4, 4), 0)
    kk = ops.view(conv, (n_s, n_t, hk, d), (*st, d * 4, 4), 4 * hk * d)
    v = ops.cont(ops.view(conv, (n_s, n_t, hv, d), (*st, d * 4, 4), 8 * hk * d))
    q = ops.scale(ops.l2_norm(q, 1e-6), 1.0 / math.sqrt(d))
    l2k = ops.l2_norm(kk, 1e-6)
    beta = ops.sigmoid(ts["b"])
    decay = ops.mul(ops.softplus(ops.add(ts["alpha"], ts["dt_bias"])), ts["ssm_a"])
    out = ops.gated_delta_net(
        q, l2k, v, ops.reshape(decay, (n_s, n_t, hv)), ops.reshape(beta, (n_s, n_t, hv)), ts["state"]
    )
    y = ops.view(out, (T_ * hv, d), None, 0)
    y = ops.mul(ops.mul(ops.rms_norm(y, 1e-6), ts["norm_w"]), ops.silu(ops.reshape(ts["z"], (T_ * hv, d))))
    outs = [y, ops.view(out, (n_s * hv * d * d,), None, 4 * T_ * hv * d)]
    if expose:
        outs.append({"k": l2k, "beta": beta, "raw": raw}[expose])
    return outs, [write], {ts[n]: a for n, a in arrs.items()}


def _run(be, n_s: int, n_t: int, hk: int, hv: int, expose: str) -> tuple[list[np.ndarray], np.ndarray]:
    d, k = 16, 4
    ch = 2 * hk * d + hv * d
    conv_buf = ops.buffer("cache_r", T.F32, (n_s + 1, (k - 1) * ch))
    conv_buf.data[:] = (
        np.random.default_rng(9).standard_normal(conv_buf.shape, np.float32).view(np.uint8).reshape(-1)
    )
    global RNG
    RNG = np.random.default_rng(5)  # the same feeds for every backend
    outs, writes, feeds = _layer(n_s, n_t, hk, hv, d, k, expose, conv_buf)
    s = Scheduler([be])
    s.compute(Graph(outs, extra=writes), feeds)
    return [np.asarray(s.get(o)) for o in outs], conv_buf.data.view(np.float32).reshape(conv_buf.shape).copy()


@pytest.mark.parametrize("expose", ["", "k", "beta", "raw"])
@pytest.mark.parametrize("n_s,n_t,hk,hv", [(1, 1, 2, 4), (2, 3, 2, 2), (1, 5, 1, 2)])
def test_fused_equals_op_by_op(
    monkeypatch: pytest.MonkeyPatch, n_s: int, n_t: int, hk: int, hv: int, expose: str
) -> None:
    fused_be = CPUBackend(2)
    fused, fbuf = _run(fused_be, n_s, n_t, hk, hv, expose)
    # concat + ssm_conv + the conv state's cpy; the 8 ops of the delta rule's prologue; the gate's silu
    want = {"": 3 + 8 + 1, "k": 3 + 1, "beta": 3 + 1, "raw": 8 + 1}[expose]
    assert len(fused_be._ssm_skip) == want
    monkeypatch.setattr(ssm_steps, "FUSE", False)
    plain_be = CPUBackend(2)
    plain, pbuf = _run(plain_be, n_s, n_t, hk, hv, expose)
    assert not plain_be._ssm_skip
    for a, b in zip(fused, plain, strict=True):
        np.testing.assert_array_equal(a, b)  # the same float operations, byte for byte
    np.testing.assert_array_equal(fbuf, pbuf)  # the conv state written back alike
    ref, rbuf = _run(NumpyBackend(), n_s, n_t, hk, hv, expose)
    for a, b in zip(fused, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
    np.testing.assert_array_equal(fbuf, rbuf)
    init = np.random.default_rng(9).standard_normal(fbuf.shape, np.float32)
    assert not np.array_equal(fbuf[:n_s], init[:n_s])  # the state moved
    np.testing.assert_array_equal(fbuf[n_s:], init[n_s:])  # the other slot untouched
