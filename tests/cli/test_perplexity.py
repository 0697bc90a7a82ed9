"""``llamapy perplexity``: the CLI on SmolLM2 (one chunk against the value of the full 14-chunk run),
and the KL-divergence files on tiny models."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest

from llamapy.cli import main
from llamapy.cli.perplexity import perplexity
from llamapy.errors import LlamapyError
from llamapy.model import Model
from tests.model.tiny import tiny_llama
from tests.util import shared_path

# `llamapy perplexity -c 512` over the whole gpl-3.txt (benchmarks/perplexity.sh) printed
# "[1]16.2641,[2]17.6857,..." and "Final estimate: PPL = 18.2992 +/- 0.85943" (llama.cpp: 18.3914).
# The first chunk's value does not depend on how many chunks share a batch.
SMOLLM2_CHUNK1 = 16.2641


def test_cli_first_chunk(smollm2_path, capsys):
    text = shared_path("reference", "gpl-3.txt")
    assert main(["perplexity", "-m", str(smollm2_path), "-f", str(text), "-c", "512", "--chunks", "1"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
    assert m, out
    assert float(m.group(1)) == pytest.approx(SMOLLM2_CHUNK1, rel=2e-3)
    assert "[1]" in out


def test_kl_divergence_files(tmp_path):
    a = Model.load(tiny_llama(tmp_path / "a.gguf", seed=3, n_vocab=64))
    b = Model.load(tiny_llama(tmp_path / "b.gguf", seed=3, n_vocab=64, ggml_type="q8_0"))
    toks = np.random.default_rng(0).integers(0, 64, 200)
    buf = io.BytesIO()
    ra = perplexity(a, toks, n_ctx=64, n_batch=128, kld_base_out=buf)
    assert ra.n_chunks == 3 and ra.n_tokens_scored == 3 * 31 and ra.ppl > 1
    same = perplexity(a, toks, n_ctx=64, n_batch=128, kld_base_in=io.BytesIO(buf.getvalue()))
    assert same.ppl == pytest.approx(ra.ppl, rel=1e-6)
    assert same.kld_mean == pytest.approx(0.0, abs=1e-4) and same.same_top == 1.0
    other = perplexity(b, toks, n_ctx=64, n_batch=128, kld_base_in=io.BytesIO(buf.getvalue()))
    assert 0 < other.kld_mean < 0.05
    with pytest.raises(LlamapyError, match="n_ctx=32"):
        perplexity(a, toks, n_ctx=32, kld_base_in=io.BytesIO(buf.getvalue()))
    with pytest.raises(LlamapyError, match="at least 2 \\* n_ctx"):
        perplexity(a, toks[:100], n_ctx=64)
