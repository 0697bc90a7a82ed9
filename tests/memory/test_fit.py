"""``n_ctx = 0`` / ``-c 0`` (issue 33 §2.12): the model's training context as llama.cpp and the README say,
lowered only when its KV cache would not fit in memory (llama.cpp's ``--fit``), never below 4096."""

from __future__ import annotations

import re

import pytest

from llamapy.context import Context, ContextParams
from llamapy.errors import LlamapyError
from llamapy.memory.fit import FIT_MARGIN, N_CTX_FIT_MIN, fit_n_ctx, kv_bytes_per_cell
from llamapy.model import Model
from tests.cli.test_run import llamapy_cmd
from tests.model.tiny import tiny_llama


@pytest.fixture(scope="module")
def long_ctx(tmp_path_factory) -> Model:
    """A tiny llama whose training context is 1M tokens (2 layers, one KV head of 32: 256 B a cell in f16)."""
    return Model.load(tiny_llama(tmp_path_factory.mktemp("fit") / "long.gguf", n_ctx=1 << 20))


def test_the_training_context_when_it_fits(long_ctx):
    hp = long_ctx.hparams
    assert kv_bytes_per_cell(hp) == 2 * (64 + 64)
    assert kv_bytes_per_cell(hp, "f32", "f32") == 2 * (128 + 128)
    assert fit_n_ctx(hp, available=None) == 1 << 20  # memory unknown: as llama.cpp without --fit
    assert fit_n_ctx(hp, available=FIT_MARGIN + (256 << 20)) == 1 << 20


def test_lowered_to_fit_but_not_below_the_minimum(long_ctx):
    hp = long_ctx.hparams
    assert fit_n_ctx(hp, available=FIT_MARGIN + (100 << 20)) == (100 << 20) // 256 // 256 * 256
    assert fit_n_ctx(hp, "f32", "f32", available=FIT_MARGIN + (100 << 20)) == (100 << 20) // 512 // 256 * 256
    assert fit_n_ctx(hp, available=FIT_MARGIN) == N_CTX_FIT_MIN
    assert fit_n_ctx(hp, available=0) == N_CTX_FIT_MIN


def test_a_context_of_zero_is_the_models(long_ctx, tmp_path):
    small = Model.load(tiny_llama(tmp_path / "small.gguf", n_ctx=1000))
    assert Context(small, ContextParams(n_ctx=0)).n_ctx == 1024  # 1000, padded to 256 as any n_ctx
    assert Context(long_ctx, ContextParams(n_ctx=0)).n_ctx == fit_n_ctx(long_ctx.hparams)
    zero = Model.load(tiny_llama(tmp_path / "zero.gguf", n_ctx=0))
    with pytest.raises(LlamapyError, match="context_length is 0"):
        Context(zero, ContextParams(n_ctx=0))


def test_cli_c0_is_the_models_training_context(smollm2_path):
    r = llamapy_cmd(
        "run", "-m", str(smollm2_path), "-p", "Hi", "-n", "1", "-c", "0", "--temp", "0", timeout=300
    )
    assert r.returncode == 0, r.stderr
    n_ctx = int(re.search(r"n_ctx = (\d+)", r.stderr).group(1))
    assert n_ctx == Model.load(str(smollm2_path), vocab_only=True).n_ctx_train == 8192
