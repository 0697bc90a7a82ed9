"""Mat-vecs of shared activations in one kernel call (``cpu/matvec_groups``): a model's decode logits are
the separate calls' bytes for every 8-row layout type, token after token, with the groups in use (Q, K,
V and gate, up); the members' repacked copies are views of one block, made once and shared by the prompt
and decode graphs; weights of another type or activations of another tensor are not grouped."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, Scheduler, ops
from llamapy.ggml.cpu import matvec_groups
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.cpu.repack import layout_of

#: (type, model dims): the k-quants need widths that are multiples of 256
CASES = [
    (T.Q4_0, {}),
    (T.Q4_1, {}),
    (T.Q5_0, {}),
    (T.Q8_0, {}),
    (T.Q4_K, {"n_embd": 256, "n_ff": 256}),
    (T.Q5_K, {"n_embd": 256, "n_ff": 256}),
    (T.Q6_K, {"n_embd": 256, "n_ff": 256}),
]


def _decode(model, threads: int, repack: bool = True) -> tuple[list[bytes], list[str]]:
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams

    c = Context(model, ContextParams(n_ctx=64, n_threads=threads))
    c.repack = repack
    c.decode(Batch.from_tokens([5, 17, 3, 42], pos0=0))
    rows = [c.get_logits().tobytes()]
    for i, t in enumerate([8, 21, 33]):
        c.decode(Batch.from_tokens([t], pos0=4 + i))
        rows.append(c.get_logits().tobytes())
    return rows, [getattr(s, "__qualname__", "") for s in c.sched._last.steps]


def _tiny(path, arch: str, t: T, seed: int, **dims):
    """A llama, or a qwen2 (Q, K and V with biases), of type ``t``."""
    from tests.model.tiny import llama_config, random_llama_weights, write_gguf

    cfg = llama_config(**dims)
    w = random_llama_weights(cfg, seed)
    if arch == "qwen2":
        rng = np.random.default_rng(seed + 1)
        for il in range(cfg["n_layer"]):
            for name in ("attn_q", "attn_k", "attn_v"):
                rows = w[f"blk.{il}.{name}.weight"].shape[0]
                w[f"blk.{il}.{name}.bias"] = (rng.standard_normal(rows) * 0.5).astype(np.float32)
    return write_gguf(path, arch, cfg, w, t)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("t", "dims"), CASES, ids=[c[0].name for c in CASES])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_decode_logits_are_the_separate_calls_bytes(tmp_path, monkeypatch, arch, t, dims, threads):
    from llamapy.model import Model

    path = _tiny(tmp_path / "tiny.gguf", arch, t, 7, **dims)
    logits, names = {}, {}
    for enabled in (False, True):
        monkeypatch.setattr(matvec_groups, "ENABLED", enabled)
        model = Model.load(path)  # a fresh load: its weights repacked anew, grouped or not
        logits[enabled], names[enabled] = _decode(model, threads)
    assert logits[True] == logits[False]
    n_layer = 2
    # each layer: one Q/K/V step and one gate/up step; the later members copy their part
    assert sum(n.endswith("step_group") for n in names[True]) == 2 * n_layer, names[True]
    assert sum(n.endswith("step_group_part") for n in names[True]) == 3 * n_layer, names[True]
    assert not any("step_group" in n for n in names[False])
    adds = [sum("_binary" in n for n in names[e]) for e in (False, True)]
    # qwen2: each layer's three bias adds are the group's steps
    assert adds[0] - adds[1] == (3 * n_layer if arch == "qwen2" else 0), adds


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q8_0])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_without_repacking_q4_0_and_q4_1_groups_read_the_file_rows(tmp_path, monkeypatch, arch, t, threads):
    """A run that does not repack (a short ``llamapy run``): Q4_0 / Q4_1 groups are one call of the
    grouped in-place kernel (``q40_r8_kernels``), with the separate calls' bytes; other types (Q8_0)
    are not grouped."""
    from llamapy.model import Model

    path = _tiny(tmp_path / "tiny.gguf", arch, t, 11)
    logits, names = {}, {}
    for enabled in (False, True):
        monkeypatch.setattr(matvec_groups, "ENABLED", enabled)
        logits[enabled], names[enabled] = _decode(Model.load(path), threads, repack=False)
    assert logits[True] == logits[False]
    n_layer = 2
    grouped = t in (T.Q4_0, T.Q4_1)
    assert sum(n.endswith("step_group") for n in names[True]) == (2 * n_layer if grouped else 0), names[True]
    assert sum(n.endswith("step_group_part") for n in names[True]) == (3 * n_layer if grouped else 0)
    assert not any("step_group" in n for n in names[False])
    assert not any("x8" in n for n in names[True])  # nothing repacked


def test_grouped_in_place_kernel_is_each_weights_kernel_bit_for_bit():
    """``q40_r8_kernels``' grouped kernels: each weight's rows as its own call computes them, for two and
    three weights of different heights, both types, both prefetch kinds; a non-finite activation row
    gives NaN everywhere."""
    from llamapy.ggml.cpu import q40_r8_kernels as K
    from llamapy.ggml.quants import quantize

    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 96)).astype(np.float32)
    for t in (T.Q4_0, T.Q4_1):
        ws = [quantize(rng.standard_normal((n, 96)).astype(np.float32), t) for n in (24, 8, 16)]
        for l1 in (False, True):
            one = getattr(K, f"mm_{t.name.lower()}_r8{'_l1' if l1 else ''}")
            ref = []
            for w in ws:
                o = np.empty((1, w.shape[0]), np.float32)
                one(w, x, o, None)
                ref.append(o)
            for k in (2, 3):
                out = np.empty((1, sum(w.shape[0] for w in ws[:k])), np.float32)
                K.GROUP_KERNELS[(t.name, l1)](tuple(ws[:k]), x, out, None)
                assert out.tobytes() == np.concatenate(ref[:k], axis=1).tobytes(), (t, l1, k)
        bad = x.copy()
        bad[0, 3] = np.inf
        out = np.zeros((1, 32), np.float32)
        K.GROUP_KERNELS[(t.name, False)](tuple(ws[:2]), bad, out, None)
        assert np.isnan(out).all()


def test_members_are_views_of_one_block_shared_by_prompt_and_decode(tmp_path):
    from llamapy.model import Model
    from tests.model.tiny import tiny_llama

    model = Model.load(tiny_llama(tmp_path / "tiny.gguf", seed=2, ggml_type=T.Q8_0))
    _decode(model, 1)  # the prompt graph (4 rows) is compiled first: it makes the blocks
    layout = layout_of(T.Q8_0)
    cached = {a.name: R for a, (_, R) in layout._cache.items() if a.name.startswith("blk.0.")}
    q, k, v = cached["blk.0.attn_q.weight"], cached["blk.0.attn_k.weight"], cached["blk.0.attn_v.weight"]
    assert k.ctypes.data == q.ctypes.data + q.nbytes and v.ctypes.data == k.ctypes.data + k.nbytes
    assert np.shares_memory(q, k) is False  # adjacent, not overlapping
    gate, up = cached["blk.0.ffn_gate.weight"], cached["blk.0.ffn_up.weight"]
    assert up.ctypes.data == gate.ctypes.data + gate.nbytes


def _graph(types: list[T], shared: bool) -> tuple[Graph, list]:
    x = ops.new_tensor(T.F32, (1, 64))
    y = ops.new_tensor(T.F32, (1, 64))
    outs = []
    for i, t in enumerate(types):
        bpr = {T.Q8_0: 34, T.Q4_0: 18}[t] * 2  # bytes a row of 64
        a = ops.weight(f"blk.0.w{i}.weight", t, (16, 64), np.zeros((16, bpr), np.uint8))
        outs.append(ops.mul_mat(a, x if shared or i == 0 else y))
    return Graph(outs), [x, y]


@pytest.mark.parametrize(
    ("types", "shared", "grouped"),
    [
        ([T.Q8_0, T.Q8_0, T.Q8_0], True, 3),
        ([T.Q8_0, T.Q4_0, T.Q8_0], True, 2),  # the Q4_0 one alone
        ([T.Q8_0, T.Q4_0], True, 0),
        ([T.Q8_0, T.Q8_0], False, 0),  # other activations
    ],
)
def test_find_groups_one_type_one_width_one_activation(types, shared, grouped):
    g, _ = _graph(types, shared)
    groups = matvec_groups.find(g, list(g.nodes), set())
    assert sum(len(x.nodes) for x in groups) == grouped
    for grp in groups:
        assert len({n.src[0].type for n in grp.nodes}) == 1 and len({id(n.src[1]) for n in grp.nodes}) == 1
        assert grp.bias == {}


def test_weights_not_from_a_mapped_file_keep_their_own_steps():
    """In-memory weights (not repacked): the graph still computes, each node its own step."""
    g, (x, _) = _graph([T.Q8_0, T.Q8_0], True)
    s = Scheduler([CPUBackend(1)])
    s.compute(g, {x: np.ones((1, 64), np.float32)})
    assert not any("step_group" in getattr(st, "__qualname__", "") for st in s._last.steps)


def test_a_bias_add_is_computed_by_the_group_only_when_it_is_the_members_one_use():
    x = ops.new_tensor(T.F32, (1, 64))
    w = [ops.weight(f"blk.0.w{i}.weight", T.Q8_0, (16, 64), np.zeros((16, 68), np.uint8)) for i in range(2)]
    bias = ops.weight("blk.0.b.bias", T.F32, (16,), np.zeros(16, np.float32))
    m0, m1 = ops.mul_mat(w[0], x), ops.mul_mat(w[1], x)
    g = Graph([ops.add(m0, bias), ops.add(m1, bias), ops.scale(m1, 2.0)])  # m1 is read twice
    (grp,) = matvec_groups.find(g, list(g.nodes), set())
    assert set(grp.bias) == {id(m0)}
