"""Gemma 3n beyond the shared oracle (``tests/model/test_hf_oracle.py`` and ``test_arch_hf.py`` run
logits, per-layer AltUp streams, ubatches and prompt-then-steps on the ``gemma3n`` tiny family): each
distinctive part matters (a file with it broken misses transformers by far), KV-sharing layers own no
cache buffers, the K-shift, two sequences and ``seq_rm`` match HF, and bad metadata is a typed error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llamapy.batch import Batch  # noqa: E402
from llamapy.model.hparams import ModelLoadError  # noqa: E402
from llamapy.model.model import Model  # noqa: E402
from tests.model.arch.test_gemma4 import (  # noqa: E402
    F32,
    FLOAT_TOL,
    MUTATION_MIN,
    _ctx,
    _rel,
    _tokens,
    _torch_threads,  # noqa: F401 (fixture)
    _write,
    tiny,  # noqa: F401 (fixture)
)
from tests.model.hf_tiny import TinyModel  # noqa: E402

NAME = "gemma3n"


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda md: md.__setitem__(f"gemma3n.{key}", value)


def _each(suffix: str, fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict[str, np.ndarray]], None]:
    def f(t: dict[str, np.ndarray]) -> None:
        for k in [k for k in t if k.endswith(suffix)]:
            t[k] = np.ascontiguousarray(fn(t[k]))

    return f


def _transpose_predict(w: np.ndarray) -> np.ndarray:  # [A*A, A]: coef[j, i] read as coef[i, j]
    a = w.shape[1]
    return w.reshape(a, a, a).transpose(1, 0, 2).reshape(a * a, a)


MUTATIONS = {
    "window-off": (_set("attention.sliding_window", 4096), None),
    "sparsity-off": (_set("activation_sparsity_scale", [float("-inf")] * 6), None),
    "predict-coef-transposed": (None, _each("altup_predict_coef.weight", _transpose_predict)),
    "no-correct-coef": (None, _each("altup_correct_coef.weight", np.zeros_like)),
    "no-laurel": (None, _each("laurel_r.weight", np.zeros_like)),
    "unembd-streams-swapped": (None, _each("altup_unembd_proj.weight", lambda w: w[::-1])),
    "no-correct-scale": (None, _each("altup_correct_scale.weight", np.ones_like)),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_broken_feature_misses_hf(tiny: Callable[[str], TinyModel], mutation: str) -> None:  # noqa: F811
    tm = tiny(NAME)
    tokens = _tokens(NAME)
    ref = tm.logits(tokens, F32)
    md_fn, t_fn = MUTATIONS[mutation]
    ctx = _ctx(_write(tm, mutation, md_fn, t_fn))
    ctx.decode(Batch.from_tokens(tokens, logits_all=True))
    assert _rel(ctx.get_logits(), ref) > MUTATION_MIN


def test_kv_sharing_layers_own_no_buffers(tiny: Callable[[str], TinyModel]) -> None:  # noqa: F811
    ctx = _ctx(tiny(NAME).write(F32))
    hp, mem = ctx.model.hparams, ctx.memory
    assert [hp.kv_layer(il) for il in range(6)] == [0, 1, 2, 1, 1, 2]
    assert sorted(ls.il for c in mem.caches for ls in c.layers) == [0, 1, 2]
    assert all(mem.layer_cache[il] is mem.layer_cache[hp.kv_layer(il)] for il in range(6))


def test_k_shift(tiny: Callable[[str], TinyModel]) -> None:  # noqa: F811
    path = tiny(NAME).write(F32)
    tokens = _tokens(NAME, 12)
    fresh = _ctx(path)
    fresh.decode(Batch.from_tokens(tokens, pos0=7))
    ctx = _ctx(path)
    ctx.decode(Batch.from_tokens(tokens[:-1]))
    ctx.memory.seq_add(0, 0, -1, 7)
    ctx.decode(Batch.from_tokens(tokens[-1:], pos0=len(tokens) - 1 + 7))
    assert _rel(ctx.get_logits_ith(-1), fresh.get_logits_ith(-1)) < 1e-4


def test_two_sequences_then_seq_rm(tiny: Callable[[str], TinyModel]) -> None:  # noqa: F811
    tm = tiny(NAME)
    a, b = _tokens(NAME, 18), _tokens(NAME + "/b", 13)
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
    keep, other = 9, _tokens(NAME + "/other", 5)
    assert ctx.memory.seq_rm(0, keep, -1)
    step = Batch()
    for i, t in enumerate(other):
        step.add(t, keep + i, [0], True)
    ctx.decode(step)
    assert _rel(ctx.get_logits(), tm.logits(a[:keep] + other, F32)[keep:]) < FLOAT_TOL


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("attention.shared_kv_layers", 7, "shared_kv_layers"),
        ("altup.active_idx", 4, "active_idx"),
        ("activation_sparsity_scale", [1.0, 2.0], "activation_sparsity_scale"),
        ("embedding_length_per_layer_input", 0, "embedding_length_per_layer_input"),
    ],
)
def test_bad_metadata_is_a_typed_error(
    tiny: Callable[[str], TinyModel],  # noqa: F811
    key: str,
    value: Any,
    match: str,
) -> None:
    path = _write(tiny(NAME), f"bad-{key}", _set(key, value))
    with pytest.raises(ModelLoadError, match=match):
        Model.load(path)
