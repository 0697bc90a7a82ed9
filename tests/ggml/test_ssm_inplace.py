"""Recurrent states updated in place on the CPU backend: a ``gated_delta_net`` / ``ssm_scan`` that reads a
view of a state buffer and whose final state is ``cpy``-ed back into that view (``RSInputs`` when the
ubatch's streams own consecutive slots) writes the buffer directly (the ``cpy`` has no step); the buffer
and the outputs equal the NumPy backend's, which copies. Where something else reads the state (a graph
output), the copy stays."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.tensor import Tensor

RNG = np.random.default_rng(77)


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _l2(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _run(
    build, feeds: dict[Tensor, np.ndarray], buf: Tensor, init: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """(outputs, buffer after, cpy nodes the CPU step took over) per backend: CPU, then NumPy."""
    res = []
    for be in (CPUBackend(2), NumpyBackend()):
        buf.data[:] = init.view(np.uint8).reshape(-1)
        outs, writes = build()
        s = Scheduler([be])
        s.compute(Graph(outs, extra=writes), feeds)
        got = np.concatenate([np.asarray(s.get(o), np.float32).reshape(-1) for o in outs])
        taken = len(getattr(be, "_state_cpys", ()))
        res.append((got, buf.data.view(np.float32).reshape(buf.shape).copy(), taken))
    return res


def _rows(buf: Tensor, n: int, slot0: int) -> Tensor:
    return ops.view(buf, (n, buf.shape[1]), buf.strides, slot0 * buf.strides[0])


@pytest.mark.parametrize("state_is_output", [False, True], ids=["in-place", "state-read-too"])
@pytest.mark.parametrize("n_s,n_t,slot0", [(1, 1, 2), (2, 3, 1)])
def test_gated_delta_net_state_in_place(n_s: int, n_t: int, slot0: int, state_is_output: bool) -> None:
    hk, h, d, n_slots = 2, 4, 8, 4
    buf = ops.buffer("cache_s", T.F32, (n_slots, h * d * d))
    init = f32(n_slots, h * d * d, scale=0.3)
    arrs = [_l2(f32(n_s, n_t, hk, d)) / np.sqrt(d), _l2(f32(n_s, n_t, hk, d)), f32(n_s, n_t, h, d)]
    arrs += [-np.abs(f32(n_s, n_t, h)), 1 / (1 + np.exp(-f32(n_s, n_t, h)))]
    arrs = [a.astype(np.float32) for a in arrs]
    ts = [ops.new_tensor(T.F32, a.shape, n) for n, a in zip("qkvgb", arrs, strict=True)]
    feeds = dict(zip(ts, arrs, strict=True))
    ny = n_s * n_t * h * d

    def build() -> tuple[list[Tensor], list[Tensor]]:
        state = ops.reshape(_rows(buf, n_s, slot0), (n_s, h, d, d))
        out = ops.gated_delta_net(*ts, state)
        y = ops.cont(ops.view(out, (ny,), None, 0))
        sview = ops.view(out, (n_s, h * d * d), None, 4 * ny)
        outs = [y, sview] if state_is_output else [y]
        return outs, [ops.cpy(sview, _rows(buf, n_s, slot0))]

    (got, bcpu, taken), (ref, bref, _) = _run(build, feeds, buf, init)
    assert taken == (0 if state_is_output else 1)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bcpu, bref, rtol=1e-4, atol=1e-5)
    assert not np.allclose(bref[slot0 : slot0 + n_s], init[slot0 : slot0 + n_s])  # the state moved
    others = [i for i in range(n_slots) if not slot0 <= i < slot0 + n_s]
    np.testing.assert_array_equal(bcpu[others], init[others])  # other slots untouched


@pytest.mark.parametrize("n_s,n_t,slot0", [(1, 1, 0), (2, 4, 1)])
def test_ssm_scan_state_in_place(n_s: int, n_t: int, slot0: int) -> None:
    h, p, g, n, n_slots = 4, 3, 2, 5, 3
    buf = ops.buffer("cache_s", T.F32, (n_slots, h * p * n))
    init = f32(n_slots, h * p * n)
    dt = np.log1p(np.exp(f32(n_s, n_t, h))).astype(np.float32)
    arrs = [f32(n_s, n_t, h, p), dt, -np.exp(f32(h, scale=0.5)).astype(np.float32)]
    arrs += [f32(n_s, n_t, g, n), f32(n_s, n_t, g, n)]
    ts = [ops.new_tensor(T.F32, a.shape, f"x{i}") for i, a in enumerate(arrs)]
    feeds = dict(zip(ts, arrs, strict=True))
    ny = n_s * n_t * h * p

    def build() -> tuple[list[Tensor], list[Tensor]]:
        state = ops.reshape(_rows(buf, n_s, slot0), (n_s, h, p, n))
        out = ops.ssm_scan(state, *ts)
        y = ops.cont(ops.view(out, (ny,), None, 0))
        return [y], [ops.cpy(ops.view(out, (n_s, h * p * n), None, 4 * ny), _rows(buf, n_s, slot0))]

    (got, bcpu, taken), (ref, bref, _) = _run(build, feeds, buf, init)
    assert taken == 1
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bcpu, bref, rtol=1e-4, atol=1e-5)
