"""Interoperability with llama.cpp (issue 14) on three families: our tiny files with a real vocabulary,
loaded by llama.cpp's ``llama-completion`` / ``llama-server`` and by ``llamapy run``, greedy generations
compared (``benchmarks/interop_llamacpp.py`` runs every family). Skips where llama.cpp is not built
(CI's image), as it is a yardstick only."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from llamapy.ggml.types import GGMLType
from tests.util import ROOT, SHARED

pytestmark = pytest.mark.slow


def _interop() -> ModuleType:
    spec = importlib.util.spec_from_file_location("interop_llamacpp", ROOT / "benchmarks/interop_llamacpp.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def interop() -> ModuleType:
    mod = _interop()
    if (
        not (mod.LLAMACPP_BIN / "llama-completion").exists()
        or not (mod.LLAMACPP_BIN / "llama-server").exists()
    ):
        pytest.skip(f"llama.cpp is not built at {mod.LLAMACPP_BIN} (benchmarks/build_llamacpp.sh)")
    if not (SHARED / "vocab").is_dir():
        pytest.skip("../shared/vocab is missing")
    return mod


# an SPM vocabulary (llama), a BPE one with its pre-tokenizer (qwen2), learned positions + GPT-2's BPE
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_llamacpp_runs_our_file_as_llamapy_does(interop: ModuleType, family: str, tmp_path: Path) -> None:
    from tests.model import hf_tiny

    path = interop.write_models(family, [GGMLType.F32], tmp_path)[GGMLType.F32]
    row = interop.compare(family, hf_tiny.FAMILIES[family].arch, GGMLType.F32, path)
    assert row.loads == "yes", f"llama.cpp refuses our {family} file: {row.loads}"
    assert row.text_same.startswith("yes"), (row.verdict, row.texts)
    # the two agree on llama.cpp's top log-probabilities at every step (F32 weights, F16 KV cache on both
    # sides: rounding only; a wrong hparam or layout gives O(0.1..1)) ...
    assert row.dlogp is not None and row.dlogp < 1e-2, f"{family}: max |Δ logprob| {row.dlogp}"
    # ... so a divergence can only be a near-tie of the random model
    assert row.verdict in ("identical", "tie (near-equal logits)"), (row.verdict, row.divergence, row.gap)
