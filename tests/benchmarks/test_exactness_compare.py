"""benchmarks/exactness_compare.py: the greedy comparison with exact, and ties in exact's logits (a
random-weight file's repeated output rows give many exactly equal top logits, where either token is exact)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.exactness_client import CppRun  # noqa: E402
from benchmarks.exactness_compare import PromptResult, PyRun, compare, first_untied_divergence  # noqa: E402
from benchmarks.exactness_report import ModelReport, report  # noqa: E402

N, V = 4, 6
FORBID = np.zeros(V, dtype=bool)


def _exact() -> tuple[np.ndarray, np.ndarray]:
    """Exact logits per step with top token 2; at step 1 tokens 2 and 4 tie exactly."""
    ex = np.tile(np.linspace(0.0, 1.0, V), (N, 1))
    ex[:, 2] = 5.0
    ex[1, 4] = 5.0
    return np.full(N, 2), ex


def _steps(picks: list[int]) -> np.ndarray:
    s = np.zeros((N, V), dtype=np.float32)
    s[np.arange(N), picks] = 9.0
    return s


def test_untied_divergence_skips_exact_ties_only():
    ids, ex = _exact()
    assert first_untied_divergence(_steps([2, 4, 2, 2]), ids, ex, FORBID, 1e-9) is None  # a tie at step 1
    assert first_untied_divergence(_steps([2, 4, 3, 2]), ids, ex, FORBID, 1e-9) == 2  # a real one after it
    assert first_untied_divergence(_steps([2, 3, 2, 2]), ids, ex, FORBID, 1e-9) == 1  # 3 is not tied
    ex[1, 4] = 5.0 - 1e-6  # close is not a tie
    assert first_untied_divergence(_steps([2, 4, 2, 2]), ids, ex, FORBID, 1e-9) == 1


def _run(py_picks: list[int], cpp_ids: list[int]) -> PromptResult:
    ids, ex = _exact()
    py = PyRun(prompt_logits=ex[:1].astype(np.float32), steps=_steps(py_picks))
    top = [[(2, -0.1), (4, -2.0)] for _ in range(N)]
    return compare(ids, ex[:1], ex, py, CppRun(ids=cpp_ids, top=top), 1, FORBID)


def test_compare_and_report_count_ties_apart():
    tied = _run([2, 4, 2, 2], [2, 4, 0, 0])  # both take the tied token at step 1
    assert (tied.py_div, tied.py_div_untied, tied.cpp_div, tied.cpp_tie) == (1, None, 1, True)
    real = _run([2, 2, 3, 2], [2, 2, 3, 3])  # both diverge for real at step 2
    assert (real.py_div, real.py_div_untied, real.cpp_div, real.cpp_tie) == (2, 2, 2, False)
    same = _run([2, 2, 2, 2], [2, 2, 2, 2])
    assert (same.py_div, same.py_div_untied, same.cpp_div, same.cpp_tie) == (None, None, None, False)
    rep = ModelReport("m", "m.gguf", "Q4_K", rows=[("a", tied, None), ("b", real, 2), ("c", same, None)])
    md = report([rep], "cmd", "machine", 1.0)
    assert "| prompts whose 32 greedy tokens equal exact's | **1/3** | 2/3 | **1/3** |" in md
    assert "the same up to exact ties" in md and "| 2/3 | | 2/3 |" in md
    rep.rows = [("b", real, 2), ("c", same, None)]  # no ties: no such row
    assert "the same up to exact ties" not in report([rep], "cmd", "machine", 1.0)
