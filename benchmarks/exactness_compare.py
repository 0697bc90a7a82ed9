"""llamapy's runs for ``benchmarks/exactness.py`` (the decode path, fed exact's tokens) and their comparison with
the exact model and llama.cpp."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import exactness_setup as S  # noqa: E402
from benchmarks.exactness_client import CppRun  # noqa: E402
from benchmarks.exactness_reference import exact_logits  # noqa: E402

# ---------------------------------------------------------------------------------------------
# llamapy (the decode path, fed exact's tokens)


def _argmax(row: np.ndarray, forbid: np.ndarray) -> int:
    r = np.array(row, dtype=np.float64)
    r[forbid] = -np.inf
    return int(np.argmax(r))


#: exact float64 logits this close (relative to the largest) count as a tie for the greedy token
TIE_TOL = 1e-9


@dataclass
class PyRun:
    prompt_logits: np.ndarray  # float32[n_prompt, n_vocab]: one batch, every position (the prompt path)
    steps: np.ndarray  # float32[N_GEN, n_vocab]: step 0 from the prompt (last row only), then one per decode


def llamapy_prompt(ctx: Any, prompt: list[int]) -> np.ndarray:
    """The prompt path: the prompt in one batch, logits of every position."""
    from llamapy.batch import Batch

    ctx.memory.clear()
    ctx.decode(Batch.from_tokens(prompt, pos0=0, logits_all=True))
    return ctx.get_logits().copy()


def greedy_vs_exact(
    exact: Any, ctx: Any, prompt: list[int], forbid: np.ndarray, n: int = S.N_GEN
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Exact greedy ids, exact's logits of each step (float64[n, n_vocab]) and llamapy's logits of each step
    on exact's prefix (decode path), with llamapy as the draft: llamapy generates greedily, one exact forward
    checks all steps, and at the first step where exact's token differs llamapy's cache is cut back
    (``seq_rm``), fed exact's token, and goes on; repeated until exact confirms every step. Returns also the
    number of exact forwards."""
    from llamapy.batch import Batch

    n_p = len(prompt)
    ctx.memory.clear()
    ctx.decode(Batch.from_tokens(prompt, pos0=0))  # as a generation does: output on the last token only
    steps = [ctx.get_logits()[-1].copy()]  # steps[i]: logits given t[:i]
    t: list[int] = []
    verified, rounds = 0, 0
    while True:
        while len(t) < n:
            if len(steps) == len(t):
                ctx.decode(Batch.from_tokens([t[-1]]))
                steps.append(ctx.get_logits()[-1].copy())
            t.append(_argmax(steps[-1], forbid))
        ex = exact_logits(exact, prompt + t[: n - 1], slice(n_p - 1, None))
        rounds += 1
        a = [_argmax(r, forbid) for r in ex]
        bad = [i for i in range(verified, n) if a[i] != t[i]]
        if not bad:
            return np.array(t), ex, np.stack(steps), rounds
        j = bad[0]
        t, steps, verified = t[:j] + [a[j]], steps[: j + 1], j + 1
        ctx.memory.seq_rm(0, n_p + j, -1)


def llamapy_forced(ctx: Any, prompt: list[int], forced: np.ndarray, n: int = S.N_GEN) -> np.ndarray:
    """llamapy's logits of each step, fed ``forced`` (the decode path)."""
    from llamapy.batch import Batch

    ctx.memory.clear()
    ctx.decode(Batch.from_tokens(prompt, pos0=0))
    steps = [ctx.get_logits()[-1].copy()]
    for i in range(n - 1):
        ctx.decode(Batch.from_tokens([int(forced[i])]))
        steps.append(ctx.get_logits()[-1].copy())
    return np.stack(steps)


# ---------------------------------------------------------------------------------------------
# comparison


def _logsoftmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def greedy_ids(steps: np.ndarray, forbid: np.ndarray) -> np.ndarray:
    """Each step's argmax, the ``forbid`` tokens (EOG) masked."""
    s = steps.astype(np.float64, copy=True)
    s[:, forbid] = -np.inf
    return np.argmax(s, axis=1)


def first_divergence(steps: np.ndarray, ref_ids: np.ndarray, forbid: np.ndarray) -> int | None:
    """The first step whose argmax (EOG masked) is not ``ref_ids``' token; None when all agree."""
    bad = np.nonzero(greedy_ids(steps, forbid) != ref_ids[: len(steps)])[0]
    return int(bad[0]) if len(bad) else None


def first_untied_divergence(
    steps: np.ndarray, ref_ids: np.ndarray, ref_steps: np.ndarray, forbid: np.ndarray, tol: float
) -> int | None:
    """As ``first_divergence``, skipping the steps where the token taken instead of ``ref_ids``' ties with
    it in ``ref_steps`` (reference logits no more than ``tol`` apart: a random-weight file's repeated output
    rows give many exactly equal top logits, where either choice is exact)."""
    got = greedy_ids(steps, forbid)
    for i in np.nonzero(got != ref_ids[: len(steps)])[0]:
        if ref_steps[i, ref_ids[i]] - ref_steps[i, got[i]] > tol:
            return int(i)
    return None


@dataclass
class PromptResult:
    n_prompt: int
    py_div: int | None  # llamapy's first step whose greedy token is not exact's (None: all 32 equal)
    cpp_div: int | None
    # as py_div, not counting a token that ties exactly with exact's (exact logits within TIE_TOL)
    py_div_untied: int | None = None
    cpp_tie: bool = False  # llama.cpp's first divergence is such a tie (after it, its prefix is not exact's)
    py_gap: float = math.nan  # exact's logit margin of its token over llamapy's at the divergence
    cpp_gap: float = math.nan
    prompt_err: tuple[float, float] = (0.0, 0.0)  # llamapy prompt path, every position: max abs, rms
    step0_err: tuple[float, float] = (0.0, 0.0)  # llamapy step 0 (prompt, last row only)
    dec_err: list[tuple[float, float]] = field(default_factory=list)  # llamapy per decode step (1..) agreed
    dec_err_all: list[tuple[float, float]] = field(default_factory=list)  # every decode step (forced)
    # max |logp - exact logp| over llama.cpp's top N_PROBS tokens, on the steps where llama.cpp's prefix
    # is exact's: (llama.cpp, llamapy) at step 0, and over the decode steps
    lp0: tuple[float, float] = (0.0, 0.0)
    lp_dec: tuple[float, float] = (math.nan, math.nan)
    n_lp_dec: int = 0
    logit_scale: float = 0.0  # max |exact logit| over the steps
    top1_dp: tuple[float, float] = (0.0, 0.0)  # max |p - exact p| of the top token over those steps


def compare(
    ex_ids: np.ndarray,
    ex_prompt: np.ndarray,
    ex_steps: np.ndarray,
    py: PyRun,
    cpp: CppRun,
    n_prompt: int,
    forbid: np.ndarray,
) -> PromptResult:
    n = len(ex_ids)
    py_div = first_divergence(py.steps, ex_ids, forbid)
    cpp_ids = np.array(cpp.ids[:n])
    neq = np.nonzero(cpp_ids != ex_ids[: len(cpp_ids)])[0]
    cpp_div = int(neq[0]) if len(neq) else (None if len(cpp_ids) == n else len(cpp_ids))
    r = PromptResult(n_prompt, py_div, cpp_div)
    r.logit_scale = float(np.abs(ex_steps).max())
    if py_div is not None:
        got = int(greedy_ids(py.steps[py_div : py_div + 1], forbid)[0])
        r.py_gap = float(ex_steps[py_div, ex_ids[py_div]] - ex_steps[py_div, got])
    if cpp_div is not None and cpp_div < len(cpp_ids):
        r.cpp_gap = float(ex_steps[cpp_div, ex_ids[cpp_div]] - ex_steps[cpp_div, cpp_ids[cpp_div]])
    tol = TIE_TOL * max(1.0, r.logit_scale)
    r.py_div_untied = first_untied_divergence(py.steps, ex_ids, ex_steps, forbid, tol)
    r.cpp_tie = bool(r.cpp_gap <= tol)  # False where NaN (no divergence)

    def err(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
        d = np.abs(a.astype(np.float64) - b)
        return float(d.max()), float(np.sqrt(np.mean(d**2)))

    r.prompt_err = err(py.prompt_logits, ex_prompt)
    r.step0_err = err(py.steps[0], ex_steps[0])
    agreed = n if py_div is None else py_div
    r.dec_err = [err(py.steps[i], ex_steps[i]) for i in range(1, agreed)]
    r.dec_err_all = [err(py.steps[i], ex_steps[i]) for i in range(1, n)]
    # log-probabilities of llama.cpp's top tokens, on the steps with exact's prefix (through its divergence)
    last = n - 1 if cpp_div is None else min(cpp_div, len(cpp.top) - 1)
    lp_ex, lp_py = _logsoftmax(ex_steps[: last + 1]), _logsoftmax(py.steps[: last + 1])
    dc, dp, p1c, p1p = [], [], [], []
    for i in range(last + 1):
        ids = np.array([t for t, _ in cpp.top[i]])
        lc = np.array([lp for _, lp in cpp.top[i]])
        dc.append(float(np.max(np.abs(lc - lp_ex[i, ids]))))
        dp.append(float(np.max(np.abs(lp_py[i, ids] - lp_ex[i, ids]))))
        p1c.append(abs(math.exp(lc[0]) - math.exp(lp_ex[i, ids[0]])))
        p1p.append(abs(math.exp(lp_py[i, ids[0]]) - math.exp(lp_ex[i, ids[0]])))
    r.lp0 = (dc[0], dp[0])
    if last >= 1:
        r.lp_dec = (max(dc[1:]), max(dp[1:]))
        r.n_lp_dec = last
    r.top1_dp = (max(p1c), max(p1p))
    return r
