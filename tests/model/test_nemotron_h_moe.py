"""Nemotron-H with experts beyond the shared oracle cases (``tests/model/families/nemotron_h_moe.py`` runs in
``test_hf_oracle`` and ``test_arch_hf``): group-limited routing against transformers' router, and the files
llama.cpp refuses get a one-line error here too."""

from __future__ import annotations

from collections.abc import Iterator
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

NAME = "nemotron_h_moe"
TOKENS = [int(t) for t in np.random.default_rng(33).integers(0, hf_tiny.N_VOCAB, 16)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield hf_tiny.make_tiny(FAMILIES[NAME], tmp_path_factory.mktemp("nemotron_h_moe"), seed=5)
    torch.set_num_threads(n)


def _write(tm: TinyModel, path: Path, **md_over: Any) -> Path:
    fam, cfg = tm.family, tm.hf.config
    md = hf_tiny.metadata(fam, cfg, GGMLType.F32) | {f"{fam.arch}.{k}": v for k, v in md_over.items()}
    return hf_tiny.write_gguf(path, fam.arch, md, hf_tiny.convert(fam, cfg, tm.state), GGMLType.F32)


def _logits(path: Path) -> np.ndarray:
    ctx = Context(Model.load(path), ContextParams(n_ctx=64, type_k="f32", type_v="f32"))
    ctx.decode(Batch.from_tokens(TOKENS, logits_all=True))
    return ctx.get_logits().copy()


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def test_group_limited_routing_matches_hf(tiny: TinyModel) -> None:
    """8 experts in 2 groups, the best group kept (``n_group`` 2, ``topk_group`` 1 in HF; the file's
    ``expert_group_count`` / ``expert_group_used_count``): llamapy matches HF's router, and the result
    differs from ungrouped routing (the mask is not a no-op on these weights)."""
    ungrouped = tiny.logits(TOKENS, GGMLType.F32)
    routers = [m for m in tiny.hf.modules() if type(m).__name__ == "NemotronHTopkRouter"]
    assert routers
    for r in routers:
        r.num_group, r.topk_group = 2, 1
    try:
        ref = tiny.logits(TOKENS, GGMLType.F32)
    finally:
        for r in routers:
            r.num_group, r.topk_group = 1, 1
    assert _rel(ungrouped, ref) > 2e-2
    got = _logits(_write(tiny, tiny.tmpdir / "groups.gguf", expert_group_count=2, expert_group_used_count=1))
    assert _rel(got, ref) < 1e-3


@pytest.mark.parametrize(
    ("md", "message"),
    [
        # convert_hf_to_gguf.py writes n_group but not topk_group: llama.cpp asserts on such a file
        (dict(expert_group_count=2), "expert_group_used_count"),
        (dict(expert_shared_feed_forward_length=0), "expert_shared_feed_forward_length"),
        (dict(moe_latent_size=16), "moe_latent_size"),
    ],
    ids=["groups-without-used-count", "no-shared-expert-width", "latent-size-without-projections"],
)
def test_bad_files_are_refused_in_one_line(tiny: TinyModel, md: dict[str, Any], message: str) -> None:
    path = _write(tiny, tiny.tmpdir / f"bad-{'-'.join(md)}.gguf", **md)
    with pytest.raises(ModelLoadError, match=message) as e:
        Model.load(path)
    assert "\n" not in str(e.value)
