"""gpt-oss beyond the shared oracle (``test_hf_oracle`` / ``test_arch_hf`` run its F32/F16/Q8_0 files):

- the file as real gpt-oss GGUFs store it (experts MXFP4, the rest F32) against HF run with the
  MXFP4-rounded experts: prompt (longer than the window; experts past the mat-vec kernel's rows take
  the dequantized-tile path) then one token at a time (the MXFP4 mat-vec kernel);
- two sequences in one batch, ``seq_rm``, the f16 KV cache (the shared tests, on this family);
- the clamp of ``swiglu_oai`` exercised (experts scaled so |gate|, |up| pass the limit 7);
- mutations: a file without the sinks, the window, YaRN, or with one expert must miss HF by far.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llamapy.batch import Batch  # noqa: E402
from llamapy.ggml.types import GGMLType  # noqa: E402
from llamapy.gguf import GGUFReader  # noqa: E402
from tests.model import hf_tiny  # noqa: E402
from tests.model import test_hf_oracle as oracle  # noqa: E402
from tests.model.families import gpt_oss as fam  # noqa: E402
from tests.model.hf_tiny import FAMILIES, TinyModel  # noqa: E402

NAME = "gpt-oss"
MXFP4_TOL = 1e-3  # both sides run the same MXFP4-rounded experts; the kernels multiply float activations


_torch_threads = pytest.fixture(scope="module", autouse=True)(hf_tiny.one_torch_thread)


@pytest.fixture(scope="module")
def tm(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    seed = zlib.crc32(NAME.encode()) % 10_000
    return hf_tiny.make_tiny(FAMILIES[NAME], tmp_path_factory.mktemp("gpt_oss"), seed=seed)


def _hf(tm: TinyModel, state: dict[str, np.ndarray], tokens: list[int]) -> np.ndarray:
    hf_tiny.load_state_dict(tm.hf, state)
    return hf_tiny.hf_logits(tm.hf, tokens)


def test_mxfp4_experts_match_hf_with_the_same_weights(tm: TinyModel) -> None:
    path = fam.write_mxfp4(tm, tm.tmpdir / "tiny-gpt-oss-mxfp4.gguf")
    r = GGUFReader(path)
    types = {n: i.ggml_type for n, i in r.tensor_index.items()}
    assert {n for n, t in types.items() if t == GGMLType.MXFP4} == {
        f"blk.{il}.ffn_{p}_exps.weight" for il in range(3) for p in ("gate", "up", "down")
    }
    tokens = oracle._tokens(NAME)
    ref = _hf(tm, fam.mxfp4_state_dict(tm.state), tokens)
    ctx = oracle._context(path)
    n0 = 12
    ctx.decode(Batch.from_tokens(tokens[:n0], logits_all=True))
    rows = [ctx.get_logits().copy()]
    for t in tokens[n0:]:
        ctx.decode(Batch.from_tokens([t]))
        rows.append(ctx.get_logits().copy())
    err = oracle._rel(np.concatenate(rows), ref)
    print(f"gpt-oss MXFP4 experts: rel {err:.2e} (prompt + {len(tokens) - n0} single steps)")
    assert err < MXFP4_TOL
    # the whole prompt at once: 20 tokens x top-2 of 4 experts, some get more rows than the mat-vec takes
    one_shot = oracle._llamapy_logits(path, tokens)
    assert oracle._rel(one_shot, ref) < MXFP4_TOL
    # against the unrounded weights the error is MXFP4's own (logged, bounded loosely)
    loose = oracle._rel(oracle._llamapy_logits(path, tokens), _hf(tm, tm.state, tokens))
    print(f"gpt-oss MXFP4 experts vs float weights: rel {loose:.2e}")
    assert 1e-4 < loose < 0.5


def test_shared_batch_and_cache_cases(tm: TinyModel) -> None:
    get = lambda name: tm  # noqa: E731  (the shared tests take a family getter)
    oracle.test_two_sequences_in_one_batch(get, NAME)
    oracle.test_seq_rm_suffix_then_new_tokens(get, NAME)
    oracle.test_default_f16_kv_cache(get, NAME)


def test_swiglu_oai_clamp_is_exercised(tm: TinyModel) -> None:
    """Experts x 6: many gate/up values pass +-7; llamapy still matches HF (which clamps them)."""
    state = dict(tm.state)
    for k in state:
        if k.endswith("mlp.experts.gate_up_proj"):
            state[k] = state[k] * np.float32(6.0)
    seen = []
    experts = tm.hf.model.layers[0].mlp.experts
    orig = experts._apply_gate
    experts._apply_gate = lambda gu: (seen.append(float(gu.abs().max())), orig(gu))[1]
    try:
        tokens = oracle._tokens(NAME)
        ref = _hf(tm, state, tokens)
    finally:
        del experts._apply_gate
    assert max(seen) > 2 * 7.0
    conv = hf_tiny.convert(tm.family, tm.hf.config, state)
    md = hf_tiny.metadata(tm.family, tm.hf.config, GGMLType.F32)
    path = hf_tiny.write_gguf(tm.tmpdir / "clamp.gguf", fam.ARCH, md, conv, GGMLType.F32)
    assert oracle._rel(oracle._llamapy_logits(path, tokens), ref) < oracle.FLOAT_TOL


MUTATIONS = {
    "no-sinks": oracle._fill(("attn_sinks.weight",), -1e30),
    "no-sliding-window": oracle._set("gpt-oss.attention.sliding_window", 4096),
    "no-yarn": oracle._set("gpt-oss.rope.scaling.type", "none"),
    "one-expert": oracle._set("gpt-oss.expert_used_count", 1),
    "no-expert-biases": oracle._fill(("_exps.bias",), 0.0),
    "no-router-bias": oracle._fill(("ffn_gate_inp.bias",), 0.0),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mutation_is_detected(tm: TinyModel, mutation: str) -> None:
    cfg = tm.hf.config
    md = hf_tiny.metadata(tm.family, cfg, GGMLType.F32)
    tensors = dict(hf_tiny.convert(tm.family, cfg, tm.state))
    MUTATIONS[mutation](md, tensors)
    path = hf_tiny.write_gguf(tm.tmpdir / f"mut-{mutation}.gguf", fam.ARCH, md, tensors, GGMLType.F32)
    tokens = oracle._tokens(NAME)
    err = oracle._rel(oracle._llamapy_logits(path, tokens), _hf(tm, tm.state, tokens))
    print(f"gpt-oss {mutation}: rel {err:.2e}")
    assert err > oracle.MUTATION_MIN
