"""benchmarks/decode_steps.py: every step of a decode token timed, the 8-row mat-vecs by weight with
their read rate; bad arguments are an ``error:``."""

from __future__ import annotations

import pytest

from benchmarks import decode_steps as ds
from tests.model.tiny import tiny_llama


def test_the_mat_vecs_are_rows_by_weight_with_their_rate(tmp_path, capsys):
    path = tiny_llama(tmp_path / "t.gguf", ggml_type="Q4_0")
    plain, timed, rows = ds.measure(str(path), 3, 1)
    assert plain > 0 and timed > 0
    x8 = [r for r in rows if r[2]]
    assert x8 and all("Q4_0" in k and "mm_q4_0_x8" in k and not k.startswith("blk.") for k, *_ in x8)
    assert all(n % 4 == 0 for _, n, _, _ in rows)  # 3 timed tokens + run_test's warm-up one, every step each
    # Q, K and V read the same activations: one grouped step (``matvec_groups``), named by its weights
    assert any(k.startswith("attn_q.weight+attn_k.weight+attn_v.weight Q4_0") for k, *_ in x8)
    assert any(not nb for _, _, nb, _ in rows)  # the other steps, by their function
    assert ds.main(["-m", str(path), "-n", "2", "-t", "1", "--top", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("# t.gguf: 2 tokens;") and out[3].startswith("| step |")
    assert len(out) == 3 + 2 + 3 and out[5].endswith(" |")


@pytest.mark.parametrize(
    ("args", "msg"), [(["-m", "/nonexistent.gguf"], "no such file"), (["-n", "0"], "at least one")]
)
def test_bad_arguments_are_errors(tmp_path, args, msg, capsys):
    if args[0] == "-n":
        args = ["-m", str(tiny_llama(tmp_path / "t.gguf")), *args]
    assert ds.main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and msg in err
