"""Gemma 4 beyond the shared oracle (``tests/model/test_hf_oracle.py`` runs logits, ubatches and
prompt-then-steps on the ``gemma4`` and ``gemma4-moe`` tiny families): each distinctive feature matters
(a file with it broken misses transformers by far), KV-sharing layers own no cache buffers, the K-shift
re-rotates the global layers' proportional rope, two sequences and ``seq_rm`` match HF, and bad
metadata is a typed error."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llamapy.batch import Batch  # noqa: E402
from llamapy.context import Context, ContextParams  # noqa: E402
from llamapy.ggml.types import GGMLType  # noqa: E402
from llamapy.model.hparams import ModelLoadError  # noqa: E402
from llamapy.model.model import Model  # noqa: E402
from tests.model import hf_tiny  # noqa: E402
from tests.model.hf_tiny import FAMILIES, TinyModel  # noqa: E402

FLOAT_TOL = 1e-3
MUTATION_MIN = 2e-2
F32 = GGMLType.F32


@pytest.fixture(scope="module", autouse=True)
def _torch_threads() -> Any:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TinyModel]:
    cache: dict[str, TinyModel] = {}
    root = tmp_path_factory.mktemp("gemma4")

    def get(name: str) -> TinyModel:
        if name not in cache:
            cache[name] = hf_tiny.make_tiny(FAMILIES[name], root, seed=zlib.crc32(name.encode()) % 10_000)
        return cache[name]

    return get


def _tokens(name: str, n: int = 20) -> list[int]:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return [int(t) for t in rng.integers(0, hf_tiny.N_VOCAB, n)]


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape and np.isfinite(got).all()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _ctx(path: Path, **kw: Any) -> Context:
    return Context(Model.load(path), ContextParams(n_ctx=256, type_k="f32", type_v="f32", **kw))


def _write(tm: TinyModel, tag: str, md_fn: Callable | None = None, t_fn: Callable | None = None) -> Path:
    cfg = tm.hf.config
    tensors = hf_tiny.convert(tm.family, cfg, hf_tiny.effective_state_dict(tm.state, F32))
    md = hf_tiny.metadata(tm.family, cfg, F32)
    if md_fn is not None:
        md_fn(md)
    if t_fn is not None:
        t_fn(tensors)
    return hf_tiny.write_gguf(tm.tmpdir / f"{tm.family.name}-{tag}.gguf", tm.family.arch, md, tensors, F32)


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda md: md.__setitem__(f"gemma4.{key}", value)


def _ones(suffix: str) -> Callable[[dict[str, np.ndarray]], None]:
    def f(t: dict[str, np.ndarray]) -> None:
        for k in [k for k in t if k.endswith(suffix)]:
            t[k] = np.ones_like(t[k])

    return f


def _reverse_rows(name: str) -> Callable[[dict[str, np.ndarray]], None]:
    return lambda t: t.__setitem__(name, np.ascontiguousarray(t[name][::-1]))


MUTATIONS = {
    "gemma4": {
        "window-off": (_set("attention.sliding_window", 4096), None),
        "rope-not-proportional": (None, _ones("rope_freqs.weight")),
        "one-rope-base": (_set("rope.freq_base_swa", 1000000.0), None),
        "no-layer-scale": (None, _ones("layer_output_scale.weight")),
        "ple-rows-swapped": (None, _reverse_rows("per_layer_token_embd.weight")),
    },
    "gemma4-moe": {
        "no-expert-scale": (None, _ones("ffn_down_exps.scale")),
        "one-expert": (_set("expert_used_count", 1), None),
        "no-router-scale": (None, _ones("ffn_gate_inp.scale")),
    },
}
CASES = [(fam, m) for fam, ms in MUTATIONS.items() for m in ms]


@pytest.mark.parametrize(("name", "mutation"), CASES, ids=[f"{f}-{m}" for f, m in CASES])
def test_broken_feature_misses_hf(tiny: Callable[[str], TinyModel], name: str, mutation: str) -> None:
    tm = tiny(name)
    tokens = _tokens(name)
    ref = tm.logits(tokens, F32)
    md_fn, t_fn = MUTATIONS[name][mutation]
    ctx = _ctx(_write(tm, mutation, md_fn, t_fn))
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    assert _rel(ctx.get_logits(), ref) > MUTATION_MIN


def test_kv_sharing_layers_own_no_buffers(tiny: Callable[[str], TinyModel]) -> None:
    """Layers 3, 4 (window) reuse layer 1's cache, layer 5 (global) layer 2's: only layers 0-2 have
    buffers, each of its own head size (16 local, 32 global with one KV head)."""
    ctx = _ctx(tiny("gemma4").write(F32))
    hp, mem = ctx.model.hparams, ctx.memory
    assert [hp.kv_layer(il) for il in range(6)] == [0, 1, 2, 1, 1, 2]
    owned = sorted(ls.il for c in mem.caches for ls in c.layers)
    assert owned == [0, 1, 2]
    for c in mem.caches:
        for ls in c.layers:
            assert ls.n_embd_k == ls.n_embd_v == (32 if ls.il == 2 else 2 * 16)
    for il in range(6):
        assert mem.layer_cache[il] is mem.layer_cache[hp.kv_layer(il)]
    assert mem.layer_cache[2] is not mem.layer_cache[1]  # the global and window caches


@pytest.mark.parametrize("name", ["gemma4", "gemma4-moe"])
def test_k_shift_follows_proportional_rope(tiny: Callable[[str], TinyModel], name: str) -> None:
    """Moving the cache by +7 then decoding == decoding at positions 7.. from the start (the global
    layers' shift keeps the unrotated dims, the window layers use their own base and dims)."""
    path = tiny(name).write(F32)
    tokens = _tokens(name, 12)
    fresh = _ctx(path)
    fresh.decode(Batch.from_tokens(tokens, pos0=7))
    ctx = _ctx(path)
    ctx.decode(Batch.from_tokens(tokens[:-1]))
    ctx.memory.seq_add(0, 0, -1, 7)
    ctx.decode(Batch.from_tokens(tokens[-1:], pos0=len(tokens) - 1 + 7))
    assert _rel(ctx.get_logits_ith(-1), fresh.get_logits_ith(-1)) < 1e-4


@pytest.mark.parametrize("name", ["gemma4", "gemma4-moe"])
def test_two_sequences_then_seq_rm(tiny: Callable[[str], TinyModel], name: str) -> None:
    """Two interleaved sequences in one batch attend only to themselves (windows per sequence, shared
    K/V per sequence); then dropping the tail of one and continuing it differently matches HF."""
    tm = tiny(name)
    a, b = _tokens(name, 18), _tokens(name + "/b", 13)
    ctx = _ctx(tm.write(F32), n_seq_max=2)
    batch = Batch()
    order = sorted([(i, 0) for i in range(len(a))] + [(i, 1) for i in range(len(b))])
    for i, seq in order:
        batch.add((a, b)[seq][i], i, [seq], True)
    ctx.decode(batch)
    got = ctx.get_logits()
    for seq, toks in ((0, a), (1, b)):
        rows = [k for k, (_, s) in enumerate(order) if s == seq]
        assert _rel(got[rows], tm.logits(toks, F32)) < FLOAT_TOL
    keep, other = 9, _tokens(name + "/other", 5)
    assert ctx.memory.seq_rm(0, keep, -1)
    step = Batch()
    for i, t in enumerate(other):
        step.add(t, keep + i, [0], True)
    ctx.decode(step)
    assert _rel(ctx.get_logits(), tm.logits(a[:keep] + other, F32)[keep:]) < FLOAT_TOL


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("attention.shared_kv_layers", 6, "shared_kv_layers"),
        ("rope.dimension_count_swa", 15, "dimension_count_swa"),
        ("attention.value_length_swa", 8, "V head size"),
    ],
)
def test_bad_metadata_is_a_typed_error(
    tiny: Callable[[str], TinyModel], key: str, value: Any, match: str
) -> None:
    path = _write(tiny("gemma4"), f"bad-{key}", _set(key, value))
    with pytest.raises(ModelLoadError, match=match):
        Model.load(path)


@pytest.mark.parametrize("name", ["gemma4", "gemma4-moe"])
def test_embeddings_input(tiny: Callable[[str], TinyModel], name: str) -> None:
    """Raw embeddings (images) go in unscaled: the token path's scaled rows give the same logits where
    there are no per-layer embeddings; with them (PLE reads the padding row 0, as llama.cpp) the graph
    still runs and yields finite logits."""
    tm = tiny(name)
    tokens = _tokens(name, 9)
    path = tm.write(F32)
    ctx = _ctx(path)
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    want = ctx.get_logits().copy()
    rows = tm.tensors[F32]["token_embd.weight"][tokens] * np.sqrt(tm.hf.config.hidden_size)
    ctx = _ctx(path)
    ctx.decode(Batch.from_embd(rows, logits_all=True))
    got = ctx.get_logits()
    assert np.isfinite(got).all()
    if name == "gemma4-moe":
        assert _rel(got, want) < 1e-5
