"""Differential fuzzing of llamapy's samplers against llama.cpp's sampler C API (``libllama.so``, ctypes).

A diagnostic, not a test. For seeded random cases (1..50000 candidates; logits normal, LLM-shaped, tied,
with -inf, all equal, huge, a few ulps apart; fresh, pre-sorted or shuffled-subset candidate arrays;
edge parameters) it applies the same samplers to the same ``llama_token_data_array`` on both sides
and compares after every step: the size, the surviving ids (as a set; in order when llama.cpp marks the
array sorted), each survivor's logit and p (float32 bits, else max abs/rel difference), the sorted flag,
the selected token (greedy, mirostat; dist with the same seed, reported apart), mirostat's mu (read from
llama.cpp's sampler state) and the sampler names. Modes:

- ``solo``: each sampler alone on one array (top_k, top_p, min_p, typical, temp, temp_ext, xtc,
  top_n_sigma, logit_bias, greedy, dist);
- ``stateful``: penalties and DRY after random token histories (several rounds of accept + apply),
  mirostat 1/2 over several steps (selection, p and mu after each step);
- ``chain``: llamapy's ``build_chain(SamplingParams)`` against the chain llama.cpp's
  ``common_sampler_init`` builds from the same parameters (default order or a shuffled one), a few rounds
  with the chosen token accepted; after each step llamapy's array is resynced to llama.cpp's when they
  differ, so that every step is compared from the same input.

Ties are reported apart: llama.cpp sorts with ``std::sort``/``std::partial_sort`` (unstable), llamapy
breaks ties by position. Each mismatch group is shrunk (fewer candidates) to a small replayable case.

    python benchmarks/samplers_vs_llamacpp.py [--n 300] [--seed 0] [--modes solo,stateful,chain]
        [--only top_p,typical ...] [--lib DIR] [--vocab FILE] [--out /tmp/sampfuzz/results.json]

Exit status 0 whether or not mismatches were found (it is a report); the JSON has every detail.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import ctypes as C  # noqa: E402
import dataclasses  # noqa: E402
import faulthandler  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.harness import llamacpp_bin  # noqa: E402
from benchmarks.tokenize_vs_llamacpp import LlamaCpp  # noqa: E402
from llamapy.sampling import (  # noqa: E402
    DistSampler,
    DRYSampler,
    GreedySampler,
    LogitBiasSampler,
    MinPSampler,
    MirostatSampler,
    MirostatV2Sampler,
    PenaltiesSampler,
    SamplingParams,
    TempExtSampler,
    TempSampler,
    TokenDataArray,
    TopKSampler,
    TopNSigmaSampler,
    TopPSampler,
    TypicalSampler,
    XTCSampler,
    build_chain,
)

SHARED = ROOT.parent / "shared"
F32 = np.float32
TD = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data
DEFAULT_BREAKERS = ["\n", ":", '"', "*"]
# mismatch categories: real differences, float rounding, and ties (llama.cpp's sorts are unstable)
BUG = ("exception", "size", "set", "order", "sorted-wrong", "selected", "logit-big", "p-big", "mu-big")
MINOR = ("logit-ulp", "p-ulp", "mu-ulp", "sorted-flag", "dist-selected", "name")
BENIGN = ("tie", "tie-order", "unsorted-order")


# --- llama.cpp ----------------------------------------------------------------------------------------


class CTokenDataArray(C.Structure):
    # include/llama.h: llama_token_data_array {llama_token_data * data; size_t size; int64_t selected; bool sorted}
    _fields_ = [("data", C.c_void_p), ("size", C.c_size_t), ("selected", C.c_int64), ("sorted", C.c_bool)]


class CLogitBias(C.Structure):
    _fields_ = [("token", C.c_int32), ("bias", C.c_float)]


class Cpp:
    """The sampler half of libllama.so, with a vocab-only model for DRY's sequence breakers."""

    def __init__(self, lib_dir: Path, vocab_path: Path) -> None:
        self.base = LlamaCpp(lib_dir)
        self.base.load(vocab_path)
        self.vocab = self.base.vocab
        lib = self.lib = self.base.lib
        P, f, i32, u32, sz = C.c_void_p, C.c_float, C.c_int32, C.c_uint32, C.c_size_t
        sigs = {
            "greedy": [],
            "dist": [u32],
            "top_k": [i32],
            "top_p": [f, sz],
            "min_p": [f, sz],
            "typical": [f, sz],
            "temp": [f],
            "temp_ext": [f, f, f],
            "xtc": [f, f, sz, u32],
            "top_n_sigma": [f],
            "mirostat": [i32, u32, f, f, i32],
            "mirostat_v2": [u32, f, f],
            "penalties": [i32, i32, f, f, f],
            "dry": [P, f, f, i32, i32, C.POINTER(C.c_char_p), sz],
            "logit_bias": [i32, i32, C.POINTER(CLogitBias)],
        }
        for name, args in sigs.items():
            fn = getattr(lib, f"llama_sampler_init_{name}")
            fn.argtypes, fn.restype = args, P
        lib.llama_sampler_apply.argtypes = [P, C.POINTER(CTokenDataArray)]
        lib.llama_sampler_accept.argtypes = [P, i32]
        lib.llama_sampler_free.argtypes = [P]
        lib.llama_sampler_name.argtypes, lib.llama_sampler_name.restype = [P], C.c_char_p
        if C.sizeof(CTokenDataArray) != 32 or TD.itemsize != 12:
            raise SystemExit("unexpected llama_token_data(_array) layout")

    def make(self, spec: dict) -> int:
        s, lib = spec["s"], self.lib
        if s == "greedy":
            return lib.llama_sampler_init_greedy()
        if s == "dist":
            return lib.llama_sampler_init_dist(spec["seed"])
        if s == "top_k":
            return lib.llama_sampler_init_top_k(spec["k"])
        if s in ("top_p", "min_p", "typical"):
            return getattr(lib, f"llama_sampler_init_{s}")(spec["p"], spec["min_keep"])
        if s == "temp":
            return lib.llama_sampler_init_temp(spec["temp"])
        if s == "temp_ext":
            return lib.llama_sampler_init_temp_ext(spec["temp"], spec["delta"], spec["exponent"])
        if s == "xtc":
            return lib.llama_sampler_init_xtc(spec["prob"], spec["thr"], spec["min_keep"], spec["seed"])
        if s == "top_n_sigma":
            return lib.llama_sampler_init_top_n_sigma(spec["n"])
        if s == "mirostat":
            return lib.llama_sampler_init_mirostat(
                spec["n_vocab"], spec["seed"], spec["tau"], spec["eta"], spec["m"]
            )
        if s == "mirostat_v2":
            return lib.llama_sampler_init_mirostat_v2(spec["seed"], spec["tau"], spec["eta"])
        if s == "penalties":
            return lib.llama_sampler_init_penalties(
                spec["n_vocab"], spec["last_n"], spec["repeat"], spec["freq"], spec["present"]
            )
        if s == "dry":
            brk = [b.encode() for b in spec["breakers"]]
            arr = (C.c_char_p * max(1, len(brk)))(*brk)
            return lib.llama_sampler_init_dry(
                self.vocab, spec["mult"], spec["base"], spec["allowed"], spec["last_n"], arr, len(brk)
            )
        if s == "logit_bias":
            items = spec["bias"]
            arr = (CLogitBias * max(1, len(items)))(*[CLogitBias(t, b) for t, b in items])
            return lib.llama_sampler_init_logit_bias(spec["n_vocab"], len(items), arr)
        raise ValueError(s)

    def name(self, smpl: int) -> str:
        return self.lib.llama_sampler_name(smpl).decode()

    def mu(self, smpl: int, kind: str) -> tuple[float, float]:
        """(tau, mu) from the sampler's state: llama_sampler {iface, ctx}; llama_sampler_mirostat
        {n_vocab, seed, seed_cur, tau, eta, m, mu, rng}, llama_sampler_mirostat_v2 {seed, seed_cur, tau,
        eta, mu, rng}."""
        ctx = C.cast(smpl, C.POINTER(C.c_void_p))[1]
        f = C.cast(ctx, C.POINTER(C.c_float))
        return (f[3], f[6]) if kind == "mirostat" else (f[2], f[4])


@dataclasses.dataclass
class Snap:
    ids: np.ndarray
    logits: np.ndarray
    p: np.ndarray
    sorted: bool
    selected: int = -1
    error: str | None = None

    @property
    def size(self) -> int:
        return len(self.ids)

    def token(self) -> int | None:
        return int(self.ids[self.selected]) if 0 <= self.selected < self.size else None

    def to_json(self, limit: int = 64) -> dict:
        n = min(self.size, limit)
        return {
            "size": self.size,
            "sorted": self.sorted,
            "selected_token": self.token(),
            "ids": self.ids[:n].tolist(),
            "logits": [float(x) for x in self.logits[:n]],
            "p": [float(x) for x in self.p[:n]],
            "error": self.error,
        }


class CArr:
    """A llama_token_data_array over a NumPy buffer (samplers may move ``data``: XTC does)."""

    def __init__(self, snap: Snap) -> None:
        n = snap.size
        self.buf = np.zeros(max(n, 1), dtype=TD)
        self.buf["id"][:n], self.buf["logit"][:n], self.buf["p"][:n] = snap.ids, snap.logits, snap.p
        self.base = self.buf.ctypes.data
        self.s = CTokenDataArray(self.base, n, -1, snap.sorted)

    def snap(self) -> Snap:
        off = (self.s.data - self.base) // TD.itemsize
        a = self.buf[off : off + self.s.size]
        return Snap(
            a["id"].copy(), a["logit"].copy(), a["p"].copy(), bool(self.s.sorted), int(self.s.selected)
        )


def cpp_apply(cpp: Cpp, smpl: int, arr: CArr) -> Snap:
    cpp.lib.llama_sampler_apply(smpl, C.byref(arr.s))
    return arr.snap()


# --- llamapy ------------------------------------------------------------------------------------------


def py_make(spec: dict, pyvocab=None):
    s = spec["s"]
    if s == "greedy":
        return GreedySampler()
    if s == "dist":
        return DistSampler(spec["seed"])
    if s == "top_k":
        return TopKSampler(spec["k"])
    if s == "top_p":
        return TopPSampler(spec["p"], spec["min_keep"])
    if s == "min_p":
        return MinPSampler(spec["p"], spec["min_keep"])
    if s == "typical":
        return TypicalSampler(spec["p"], spec["min_keep"])
    if s == "temp":
        return TempSampler(spec["temp"])
    if s == "temp_ext":
        return TempExtSampler(spec["temp"], spec["delta"], spec["exponent"])
    if s == "xtc":
        return XTCSampler(spec["prob"], spec["thr"], spec["min_keep"], spec["seed"])
    if s == "top_n_sigma":
        return TopNSigmaSampler(spec["n"])
    if s == "mirostat":
        return MirostatSampler(spec["n_vocab"], spec["seed"], spec["tau"], spec["eta"], spec["m"])
    if s == "mirostat_v2":
        return MirostatV2Sampler(spec["seed"], spec["tau"], spec["eta"])
    if s == "penalties":
        return PenaltiesSampler(spec["last_n"], spec["repeat"], spec["freq"], spec["present"])
    if s == "dry":
        return DRYSampler(
            spec["mult"], spec["base"], spec["allowed"], spec["last_n"], spec["breakers"], pyvocab
        )
    if s == "logit_bias":
        return LogitBiasSampler(None, spec["bias"])
    raise ValueError(s)


def py_arr(snap: Snap) -> TokenDataArray:
    n = snap.size
    ident = bool(n and snap.ids[0] == 0 and snap.ids[-1] == n - 1 and np.array_equal(snap.ids, np.arange(n)))
    return TokenDataArray(snap.ids.copy(), snap.logits.copy(), snap.p.copy(), snap.sorted, -1, ident)


def py_apply(smpl, cur: TokenDataArray) -> Snap:
    try:
        smpl.apply(cur)
    except Exception as e:  # reported as a mismatch
        return Snap(
            cur.ids.copy(), cur.logits.copy(), cur.p.copy(), cur.sorted, -1, f"{type(e).__name__}: {e}"
        )
    return Snap(cur.ids.copy(), cur.logits.copy(), cur.p.copy(), bool(cur.sorted), int(cur.selected))


# --- comparison ---------------------------------------------------------------------------------------


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def _num_diff(a: np.ndarray, b: np.ndarray) -> tuple[int, float, float, bool]:
    """(count not bit-equal, max abs diff, max rel diff, any non-finite disagreement)."""
    ne = ~_same_bits(a, b)
    if not ne.any():
        return 0, 0.0, 0.0, False
    a64, b64 = a[ne].astype(np.float64), b[ne].astype(np.float64)
    fin = np.isfinite(a64) & np.isfinite(b64)
    nonfin = bool((~fin).any())
    d = np.abs(a64[fin] - b64[fin])
    rel = d / np.maximum(np.maximum(np.abs(a64[fin]), np.abs(b64[fin])), 1e-30)
    return int(ne.sum()), float(d.max(initial=0.0)), float(rel.max(initial=0.0)), nonfin


def _tie_permutation(a: Snap, b: Snap, inp: Snap | None) -> bool:
    """Same ids, same multisets of logits and p, and every token whose values differ had the same input
    logit: the two sides only gave tied tokens' results to different ones of them."""
    if inp is None or a.size != b.size or set(a.ids.tolist()) != set(b.ids.tolist()):
        return False
    for va, vb in ((a.logits, b.logits), (a.p, b.p)):
        if not np.array_equal(np.sort(va).view(np.uint32), np.sort(vb).view(np.uint32)):
            return False
    oa, ob = np.argsort(a.ids), np.argsort(b.ids)
    bad = ~(_same_bits(a.logits[oa], b.logits[ob]) & _same_bits(a.p[oa], b.p[ob]))
    if not bad.any():
        return False
    ids = a.ids[oa][bad]
    src = dict(zip(inp.ids.tolist(), inp.logits.tolist(), strict=True))
    return len({src.get(int(t)) for t in ids}) <= 1


def compare(a: Snap, b: Snap, kind: str, inp: Snap | None = None) -> dict[str, dict]:
    """Differences of llamapy's result ``b`` from llama.cpp's ``a``: category -> details."""
    out: dict[str, dict] = {}
    if b.error:
        out["exception"] = {"py": b.error}
        return out
    if a.size != b.size:
        out["size"] = {"cpp": a.size, "py": b.size}
    sa, sb = set(a.ids.tolist()), set(b.ids.tolist())
    if a.size == b.size and sa != sb:
        tied = np.array_equal(np.sort(a.logits), np.sort(b.logits)) or np.array_equal(
            np.sort(a.p), np.sort(b.p)
        )
        out["tie" if tied else "set"] = {"only_cpp": sorted(sa - sb)[:8], "only_py": sorted(sb - sa)[:8]}
    if b.sorted and b.size > 1 and (np.diff(b.logits[~np.isnan(b.logits)]) > 0).any():
        # llama.cpp may claim sorted on the same unsorted data (logit_bias keeps the flag): not llamapy's doing
        if not a.sorted:
            out["sorted-wrong"] = {"py_logits_head": [float(x) for x in b.logits[:8]]}
    if a.sorted != b.sorted and a.size > 1 and not (a.size != b.size or "set" in out):
        out["sorted-flag"] = {"cpp": a.sorted, "py": b.sorted}
    if sa == sb and a.size == b.size and a.size > 1 and not np.array_equal(a.ids, b.ids):
        if a.sorted and b.sorted:
            # a tie-only difference: each side's order is also a descending order of the other's values
            pos_b = dict(zip(b.ids.tolist(), range(b.size), strict=True))
            vb = b.logits[[pos_b[t] for t in a.ids.tolist()]]
            tie_only = not (np.diff(vb) > 0).any() or _tie_permutation(a, b, inp)
            out["tie-order" if tie_only else "order"] = {"cpp": a.ids[:8].tolist(), "py": b.ids[:8].tolist()}
        else:
            out["unsorted-order"] = {"cpp": a.ids[:8].tolist(), "py": b.ids[:8].tolist()}
    # per-id values over the common ids
    common, ia, ib = np.intersect1d(a.ids, b.ids, assume_unique=False, return_indices=True)
    if len(common) and _tie_permutation(a, b, inp):
        out["tie"] = {"values_permuted_among_tied_tokens": True}
    elif len(common):
        for name, va, vb, big_rel in (
            ("logit", a.logits[ia], b.logits[ib], 1e-5),
            ("p", a.p[ia], b.p[ib], None),
        ):
            cnt, dabs, drel, nonfin = _num_diff(va, vb)
            if cnt:
                big = nonfin or (drel > big_rel if big_rel is not None else dabs > 1e-5)
                j = int(np.argmax(~_same_bits(va, vb)))
                out[f"{name}-{'big' if big else 'ulp'}"] = {
                    "count": cnt,
                    "max_abs": dabs,
                    "max_rel": drel,
                    "nonfinite": nonfin,
                    "first": {"id": int(common[j]), "cpp": float(va[j]), "py": float(vb[j])},
                }
    if kind in ("greedy", "dist", "mirostat", "mirostat_v2") and a.token() != b.token() and "tie" not in out:
        src = {} if inp is None else dict(zip(inp.ids.tolist(), inp.logits.tolist(), strict=True))
        tied = a.token() is not None and src.get(a.token(), 0) == src.get(b.token(), 1)
        cat = "tie" if tied else "dist-selected" if kind == "dist" else "selected"
        out[cat] = {"cpp": a.token(), "py": b.token(), "selected_tokens_tied": tied}
    return out


SORTING = {"top_k", "top_p", "min_p", "typical", "temp_ext", "xtc", "mirostat", "mirostat_v2"}
# llama_token_data_array_partial_sort: int(6.4 * logit + 64) overflows int32 (UB; INT_MIN on x86, so the
# token lands in the lowest bucket) for logits above this
BUCKET_OVERFLOW = (2**31 - 64) / 6.4


def known_issue(kind: str, spec: dict, inp: Snap) -> str | None:
    """A tag when a difference is explained by a known llama.cpp defect or a documented llamapy choice."""
    lg = inp.logits.astype(np.float64)
    fin = lg[np.isfinite(lg)]
    if kind in SORTING and inp.size > 128 and not inp.sorted and len(fin) and fin.max() >= BUCKET_OVERFLOW:
        return "cpp-bucket-int-overflow"
    if kind == "typical" and inp.size > 1:
        mx = lg.max()
        if not np.isfinite(mx) or (lg - mx < -100).any():  # a p of exactly 0: 0 * logf(0) = NaN entropy
            return "cpp-typical-nan-entropy"
    if kind == "top_n_sigma" and len(fin) and ((fin - fin.mean()) ** 2).sum() > 3.4e38:
        return "cpp-top-n-sigma-f32-overflow"
    if kind in ("dist", "mirostat", "mirostat_v2") and inp.size > 1 and not np.isfinite(lg.max()):
        return "py-refuses-nonfinite"
    if kind == "temp_ext" and spec["delta"] > 0 and F32(spec["delta"]) == 0:
        return "param-delta-f32-zero"
    return None


# --- random cases -------------------------------------------------------------------------------------

LOGIT_KINDS = ("normal", "llm", "ties", "neginf", "allequal", "huge", "ulps", "mixed", "allneginf")
LOGIT_WEIGHTS = np.array([20, 20, 12, 12, 4, 6, 8, 8, 1], dtype=np.float64)


def gen_n(rng: np.random.Generator) -> int:
    if rng.random() < 0.3:
        return int(rng.choice([1, 2, 3, 4, 5, 8, 128, 129, 256, 257, 1024, 1025, 1100, 4096]))
    return int(np.clip(round(math.exp(rng.uniform(0, math.log(50000)))), 1, 50000))


def gen_logits(rng: np.random.Generator, n: int, kind: str | None = None) -> tuple[np.ndarray, str]:
    kind = kind or str(rng.choice(LOGIT_KINDS, p=LOGIT_WEIGHTS / LOGIT_WEIGHTS.sum()))
    if kind == "normal":
        x = rng.normal(rng.uniform(-5, 5), float(rng.choice([0.1, 0.5, 1, 3, 10])), n)
    elif kind == "llm":  # a peaked, Zipf-like distribution as language models give
        x = -float(rng.uniform(0.5, 3)) * np.log(np.arange(1, n + 1)) + rng.normal(0, 0.3, n) + 10
        x = rng.permutation(x)
    elif kind == "ties":
        levels = int(rng.integers(1, 6))
        x = rng.integers(0, levels, n) * float(rng.choice([0.25, 1, 7])) - 3
    elif kind == "neginf":
        x = rng.normal(0, 2, n)
        x[rng.random(n) < rng.uniform(0.1, 0.95)] = -np.inf
        if np.isinf(x).all():
            x[int(rng.integers(n))] = 0.5
    elif kind == "allequal":
        x = np.full(n, float(rng.choice([0.0, -1.0, 3.5, -1e30, 1e30])))
    elif kind == "huge":
        x = rng.normal(0, 1, n) * 10 ** rng.uniform(6, 36)
    elif kind == "ulps":
        c = F32(rng.normal(0, 10))
        x = c + rng.integers(0, 6, n).astype(np.float32) * np.spacing(c)
    elif kind == "mixed":
        x = rng.normal(0, 3, n)
        k = max(1, n // 50)
        x[rng.integers(0, n, k)] = rng.choice([-np.inf, 40.0, -40.0, 1e30, -1e30], k)
    else:  # allneginf
        x = np.full(n, -np.inf)
    return np.asarray(x, dtype=np.float32), kind


def gen_input(
    rng: np.random.Generator, n: int, logits: np.ndarray, layout: str | None = None
) -> tuple[Snap, str]:
    """A fresh array (ids 0..n-1), a pre-sorted one (stable, sorted=true), or a shuffled subset of a larger
    vocabulary."""
    layout = layout or str(rng.choice(["fresh", "fresh", "fresh", "sorted", "shuffled"]))
    ids = np.arange(n, dtype=np.int32)
    p = np.zeros(n, dtype=np.float32)
    if layout == "sorted":
        o = np.argsort(-logits.astype(np.float64), kind="stable")
        return Snap(ids[o], logits[o], p, True), layout
    if layout == "shuffled":
        ids = rng.choice(max(n * 3, 8), n, replace=False).astype(np.int32)
        return Snap(ids, logits, p, False), layout
    return Snap(ids, logits, p, False), layout


def _pick(rng, vals):
    return vals[int(rng.integers(len(vals)))]


def gen_mk(rng, n: int) -> int:
    return int(_pick(rng, [0, 0, 0, 1, 1, 2, 3, 5, 10, n, n + 1]))


def gen_spec(rng: np.random.Generator, s: str, n: int) -> dict:
    u = float(rng.random())
    if s == "top_k":
        return {
            "s": s,
            "k": int(
                _pick(rng, [-1, 0, 1, 2, 3, 40, 128, 129, 256, n - 1, n, n + 1, int(rng.integers(1, n + 2))])
            ),
        }
    if s == "top_p":
        p = _pick(rng, [0.0, 1e-6, 0.1, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 0.9999999, 1.0, 1.5, -0.1, u])
        return {"s": s, "p": p, "min_keep": gen_mk(rng, n)}
    if s == "min_p":
        p = _pick(rng, [0.0, -0.1, 1e-12, 0.01, 0.05, 0.1, 0.3, 0.5, 0.9, 1.0, 1.5, u])
        return {"s": s, "p": p, "min_keep": gen_mk(rng, n)}
    if s == "typical":
        p = _pick(rng, [0.0, 0.1, 0.2, 0.5, 0.9, 0.95, 0.99, 1.0, 1.2, u])
        return {"s": s, "p": p, "min_keep": gen_mk(rng, n)}
    if s == "temp":
        return {"s": s, "temp": _pick(rng, [-1.0, 0.0, 0.05, 0.1, 0.5, 0.8, 1.0, 1.5, 2.0, 100.0])}
    if s == "temp_ext":
        return {
            "s": s,
            "temp": _pick(rng, [-1.0, 0.0, 0.1, 0.5, 0.8, 1.0, 1.5]),
            "delta": _pick(rng, [0.0, -0.5, 0.1, 0.5, 1.0, 2.0]),
            "exponent": _pick(rng, [0.0, 0.5, 1.0, 2.0]),
        }
    if s == "xtc":
        return {
            "s": s,
            "prob": _pick(rng, [0.0, 0.3, 0.5, 1.0]),
            "thr": _pick(rng, [0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.51]),
            "min_keep": gen_mk(rng, n),
            "seed": int(rng.integers(0, 2**31)),
        }
    if s == "top_n_sigma":
        return {"s": s, "n": _pick(rng, [-1.0, 0.0, 0.1, 0.5, 1.0, 1.5, 2.0, 3.0, 10.0])}
    if s == "logit_bias":
        k = int(rng.integers(0, 6))
        toks = rng.integers(0, max(n, 1), k).tolist()
        if k and rng.random() < 0.3:
            toks.append(toks[0])  # the same token twice
        bias = [(int(t), float(_pick(rng, [-np.inf, -5.0, -0.5, 0.5, 3.0, 100.0]))) for t in toks]
        return {"s": s, "bias": bias, "n_vocab": n}
    if s == "greedy":
        return {"s": s}
    if s == "dist":
        return {"s": s, "seed": int(rng.integers(0, 2**31))}
    if s in ("mirostat", "mirostat_v2"):
        spec = {
            "s": s,
            "seed": int(rng.integers(0, 2**31)),
            "tau": _pick(rng, [0.5, 1.0, 3.0, 5.0, 10.0]),
            "eta": _pick(rng, [0.0, 0.1, 0.5, 1.0]),
        }
        if s == "mirostat":
            spec.update({"n_vocab": n, "m": int(_pick(rng, [1, 2, 5, 100, 100]))})
        return spec
    if s == "penalties":
        return {
            "s": s,
            "n_vocab": n,
            "last_n": int(_pick(rng, [-1, 0, 1, 3, 16, 64])),
            "repeat": _pick(rng, [0.5, 1.0, 1.1, 1.5, 2.0]),
            "freq": _pick(rng, [0.0, 0.5, -0.5, 1.0]),
            "present": _pick(rng, [0.0, 0.5, -1.0, 1.0]),
        }
    if s == "dry":
        extra = [
            _pick(rng, ["\n\n", "###", "ing", "the", ". ", "<|", "a", "ab:"])
            for _ in range(int(rng.integers(0, 3)))
        ]
        return {
            "s": s,
            "mult": _pick(rng, [0.0, 0.8, 0.8, 2.0]),
            "base": _pick(rng, [0.5, 1.0, 1.75, 1.75, 3.0]),
            "allowed": int(_pick(rng, [0, 1, 2, 2, 4])),
            "last_n": int(_pick(rng, [-1, 0, 8, 64, 64, 64])),
            "breakers": _pick(rng, [DEFAULT_BREAKERS, DEFAULT_BREAKERS + extra, extra]),
        }
    raise ValueError(s)


# --- the runner ---------------------------------------------------------------------------------------

SOLO = (
    "top_k",
    "top_p",
    "min_p",
    "typical",
    "temp",
    "temp_ext",
    "xtc",
    "top_n_sigma",
    "logit_bias",
    "greedy",
    "dist",
)
STATEFUL = ("penalties", "dry", "mirostat", "mirostat_v2")


class Runner:
    def __init__(self, cpp: Cpp, pyvocab, shrink_budget: int) -> None:
        self.cpp = cpp
        self.pyvocab = pyvocab
        self.shrink_budget = shrink_budget
        self.cases: dict[str, int] = defaultdict(int)  # sampler -> steps compared
        self.active: dict[str, int] = defaultdict(int)  # steps where llama.cpp changed the candidates
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.examples: dict[tuple[str, str], dict] = {}  # (sampler, category) -> smallest example
        self.by_logits: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.numeric: dict[str, dict[str, float]] = defaultdict(lambda: {"logit_rel": 0.0, "p_abs": 0.0})

    # one step from the same input on both sides (fresh samplers, after accepting ``hist``)
    def replay(self, spec: dict, inp: Snap, hist: list[int], mu: float | None = None) -> tuple[Snap, Snap]:
        cs = self.cpp.make(spec)
        try:
            ps = py_make(spec, self.pyvocab)
            for t in hist:
                self.cpp.lib.llama_sampler_accept(cs, t)
                ps.accept(t)
            if mu is not None:
                ctx = C.cast(cs, C.POINTER(C.c_void_p))[1]
                C.cast(ctx, C.POINTER(C.c_float))[6 if spec["s"] == "mirostat" else 4] = mu
                ps.mu = float(F32(mu))
            a = cpp_apply(self.cpp, cs, CArr(inp))
            b = py_apply(ps, py_arr(inp))
        finally:
            self.cpp.lib.llama_sampler_free(cs)
        return a, b

    def record(
        self, kind: str, diff: dict, spec: dict, inp: Snap, a: Snap, b: Snap, hist: list[int], ctx: dict
    ) -> bool:
        """Count the step's differences; True when a known defect explains them (the caller stops there:
        llama.cpp's output is then garbage that the next steps would inherit)."""
        self.cases[kind] += 1
        if (
            a.size != inp.size
            or a.selected >= 0
            or not np.array_equal(a.logits.view(np.uint32), inp.logits.view(np.uint32))
        ):
            self.active[kind] += 1
        tag = known_issue(kind.split(":")[-1], spec, inp) if diff else None
        if tag:
            diff = {f"known:{tag}": {"categories": sorted(diff), **next(iter(diff.values()))}}
        for cat, d in diff.items():
            self.counts[kind][cat] += 1
            self.by_logits[f"{kind}/{cat}"][str(ctx.get("logits"))] += 1
            if cat in ("logit-ulp", "logit-big"):
                self.numeric[kind]["logit_rel"] = max(self.numeric[kind]["logit_rel"], d["max_rel"])
            if cat in ("p-ulp", "p-big"):
                self.numeric[kind]["p_abs"] = max(self.numeric[kind]["p_abs"], d["max_abs"])
            key = (kind, cat)
            old = self.examples.get(key)
            if old is None or inp.size < old["input"].size:
                self.examples[key] = {
                    "spec": spec,
                    "input": inp,
                    "hist": list(hist),
                    "detail": d,
                    "context": ctx,
                    "cpp": a,
                    "py": b,
                }
        return bool(tag)

    def shrink(self, kind: str, cat: str, ex: dict) -> dict:
        """Drop candidates while replaying the step still shows ``cat`` (delta debugging on positions)."""
        spec, inp, hist = ex["spec"], ex["input"], ex["hist"]
        mu = ex["context"].get("mu_before")
        a, b = self.replay(spec, inp, hist, mu)
        if cat not in compare(a, b, kind, inp):
            return {"reproduced": False}
        budget = self.shrink_budget
        keep = np.arange(inp.size)
        chunk = max(1, len(keep) // 2)

        def sub(idx):
            return Snap(inp.ids[idx], inp.logits[idx], inp.p[idx], inp.sorted)

        while chunk >= 1 and budget > 0:
            i, changed = 0, False
            while i < len(keep) and budget > 0:
                trial = np.concatenate([keep[:i], keep[i + chunk :]])
                if len(trial) == 0:
                    i += chunk
                    continue
                budget -= 1
                ta, tb = self.replay(spec, sub(trial), hist, mu)  # n_vocab etc. stay as they were
                if cat in compare(ta, tb, kind, sub(trial)):
                    keep, changed = trial, True
                else:
                    i += chunk
            if not changed:
                chunk //= 2
        small = sub(keep)
        a, b = self.replay(spec, small, hist, mu)
        return {
            "reproduced": True,
            "input": small.to_json(24),
            "cpp": a.to_json(24),
            "py": b.to_json(24),
            "diff": compare(a, b, kind, small),
        }

    # --- modes ---

    def solo(self, rng: np.random.Generator, kind: str) -> None:
        n = gen_n(rng)
        logits, lk = gen_logits(rng, n)
        inp, layout = gen_input(rng, n, logits)
        spec = gen_spec(rng, kind, n)
        if kind == "logit_bias" and layout == "shuffled":
            spec["bias"] = [(int(inp.ids[t % n]), bb) for t, bb in spec["bias"]]
        if kind == "temp_ext" and rng.random() < 0.1:
            spec["delta"] = 1e-50  # > 0 as a double, 0 as a float
        a, b = self.replay(spec, inp, [])
        self.record(kind, compare(a, b, kind, inp), spec, inp, a, b, [], {"logits": lk, "layout": layout})

    def stateful(self, rng: np.random.Generator, kind: str) -> None:
        n = gen_n(rng) if kind.startswith("mirostat") else int(rng.integers(2, 20000))
        spec = gen_spec(rng, kind, n)
        if kind in ("penalties", "dry"):
            # a small alphabet so that tokens repeat; for DRY some are breaker tokens (llama-bpe: '"' 1,
            # '*' 9, ':' 25, '\n' 198)
            alpha = rng.choice(n, min(n, int(rng.integers(1, 12))), replace=False).tolist()
            alpha += [t for t in (1, 9, 25, 198) if t < n and rng.random() < 0.5]
            cs, ps = self.cpp.make(spec), py_make(spec, self.pyvocab)
            if kind == "dry":  # heads and tails of multi-token breakers (llamapy's table of them)
                multi = [(h, t) for h, tails in ps._breakers.items() for t in tails if t and h < n]
                for j in rng.permutation(len(multi))[:3]:
                    alpha += [multi[j][0]] + [x for x in multi[j][1] if x < n]
            hist: list[int] = []
            try:
                for _ in range(int(rng.integers(1, 5))):
                    for _ in range(int(rng.integers(0, 80))):
                        t = int(_pick(rng, alpha)) if rng.random() < 0.9 else int(rng.integers(n))
                        self.cpp.lib.llama_sampler_accept(cs, t)
                        ps.accept(t)
                        hist.append(t)
                    logits, lk = gen_logits(rng, n)
                    inp, layout = gen_input(rng, n, logits, "fresh" if rng.random() < 0.7 else None)
                    a = cpp_apply(self.cpp, cs, CArr(inp))
                    b = py_apply(ps, py_arr(inp))
                    ctx = {"logits": lk, "layout": layout, "hist_len": len(hist)}
                    self.record(kind, compare(a, b, kind, inp), spec, inp, a, b, hist, ctx)
            finally:
                self.cpp.lib.llama_sampler_free(cs)
            return
        # mirostat: several steps, mu compared after each; llamapy's mu is resynced to llama.cpp's
        cs, ps = self.cpp.make(spec), py_make(spec)
        try:
            tau0, mu0 = self.cpp.mu(cs, kind)
            if tau0 != F32(spec["tau"]) or mu0 != F32(2) * F32(spec["tau"]):
                raise SystemExit(f"mirostat state layout unexpected: tau {tau0}, mu {mu0}")
            temp = _pick(rng, [None, None, 0.5, 1.0, 1.5])
            for step in range(int(rng.integers(1, 9))):
                logits, lk = gen_logits(
                    rng, n, _pick(rng, ["normal", "llm", "llm", "ties", "neginf", "mixed"])
                )
                if temp is not None:
                    logits = (logits / F32(temp)).astype(np.float32)
                inp = Snap(np.arange(n, dtype=np.int32), logits, np.zeros(n, np.float32), False)
                mu_before = self.cpp.mu(cs, kind)[1]
                a = cpp_apply(self.cpp, cs, CArr(inp))
                b = py_apply(ps, py_arr(inp))
                diff = compare(a, b, kind, inp)
                mu_c, mu_p = self.cpp.mu(cs, kind)[1], F32(ps.mu)
                if not b.error and mu_c != mu_p and not (math.isnan(mu_c) and math.isnan(mu_p)):
                    rel = abs(float(mu_c) - float(mu_p)) / max(abs(float(mu_c)), 1e-30)
                    diff["mu-big" if rel > 1e-5 or not math.isfinite(rel) else "mu-ulp"] = {
                        "cpp": float(mu_c),
                        "py": float(mu_p),
                        "max_rel": rel,
                        "max_abs": abs(float(mu_c) - float(mu_p)),
                    }
                ctx = {"logits": lk, "step": step, "mu_before": float(mu_before), "temp": temp}
                self.record(kind, diff, spec, inp, a, b, [], ctx)
                if "selected" in diff or b.error:
                    break
                ps.mu = float(mu_c)
        finally:
            self.cpp.lib.llama_sampler_free(cs)

    def chain(self, rng: np.random.Generator, idx: int) -> None:
        n = int(_pick(rng, [gen_n(rng), int(rng.integers(200, 5000)), int(rng.integers(2, 200))]))
        sp = SamplingParams(seed=int(rng.integers(0, 2**31)))
        r = rng.random
        sp.top_k = int(_pick(rng, [40, 40, 0, 1, 5, 100, n + 1]))
        sp.top_p = _pick(rng, [0.95, 0.95, 1.0, 0.5, 0.9, 0.0])
        sp.min_p = _pick(rng, [0.05, 0.05, 0.0, 0.1, 0.5])
        sp.typ_p = _pick(rng, [1.0, 1.0, 0.9, 0.5])
        sp.temp = _pick(rng, [0.8, 0.8, 0.0, -1.0, 0.3, 1.0, 1.5])
        sp.dynatemp_range = _pick(rng, [0.0, 0.0, 0.5, 1.5])
        sp.dynatemp_exponent = _pick(rng, [1.0, 0.5, 2.0])
        sp.min_keep = int(_pick(rng, [0, 0, 1, 3]))
        sp.top_n_sigma = _pick(rng, [-1.0, -1.0, 1.0, 2.0])
        sp.xtc_probability = _pick(rng, [0.0, 0.0, 0.5, 1.0])
        sp.xtc_threshold = _pick(rng, [0.1, 0.05, 0.3])
        sp.penalty_last_n = int(_pick(rng, [64, 0, 8]))
        sp.penalty_repeat = _pick(rng, [1.0, 1.1, 1.5])
        sp.penalty_freq = _pick(rng, [0.0, 0.0, 0.5])
        sp.penalty_present = _pick(rng, [0.0, 0.0, 0.5])
        sp.dry_multiplier = _pick(rng, [0.0, 0.0, 0.8])
        sp.dry_allowed_length = int(_pick(rng, [2, 1, 3]))
        sp.dry_penalty_last_n = int(_pick(rng, [64, -1, 16]))
        sp.mirostat = int(_pick(rng, [0, 0, 0, 0, 1, 2]))
        if r() < 0.3:
            sp.samplers = list(rng.permutation(sp.samplers))
        if r() < 0.3:
            sp.logit_bias = {int(t): float(_pick(rng, [-np.inf, 2.0, -3.0])) for t in rng.integers(0, n, 3)}
        n_ctx = 256
        dry_last = n_ctx if sp.dry_penalty_last_n == -1 else sp.dry_penalty_last_n
        pen_last = n_ctx if sp.penalty_last_n == -1 else sp.penalty_last_n
        specs: list[dict] = []
        if sp.logit_bias:
            specs.append({"s": "logit_bias", "bias": list(sp.logit_bias.items()), "n_vocab": n})
        if sp.mirostat == 0:
            table = {
                "dry": {
                    "s": "dry",
                    "mult": sp.dry_multiplier,
                    "base": sp.dry_base,
                    "allowed": sp.dry_allowed_length,
                    "last_n": dry_last,
                    "breakers": sp.dry_sequence_breakers,
                },  # fmt: skip
                "top_k": {"s": "top_k", "k": sp.top_k},
                "top_p": {"s": "top_p", "p": sp.top_p, "min_keep": sp.min_keep},
                "top_n_sigma": {"s": "top_n_sigma", "n": sp.top_n_sigma},
                "min_p": {"s": "min_p", "p": sp.min_p, "min_keep": sp.min_keep},
                "xtc": {
                    "s": "xtc",
                    "prob": sp.xtc_probability,
                    "thr": sp.xtc_threshold,
                    "min_keep": sp.min_keep,
                    "seed": sp.seed,
                },  # fmt: skip
                "typ_p": {"s": "typical", "p": sp.typ_p, "min_keep": sp.min_keep},
                "temperature": {
                    "s": "temp_ext",
                    "temp": sp.temp,
                    "delta": sp.dynatemp_range,
                    "exponent": sp.dynatemp_exponent,
                },  # fmt: skip
                "penalties": {
                    "s": "penalties",
                    "n_vocab": n,
                    "last_n": pen_last,
                    "repeat": sp.penalty_repeat,
                    "freq": sp.penalty_freq,
                    "present": sp.penalty_present,
                },  # fmt: skip
            }
            specs += [table[name] for name in sp.samplers]
            specs.append({"s": "dist", "seed": sp.seed})
        else:
            specs.append({"s": "temp", "temp": sp.temp})
            if sp.mirostat == 1:
                specs.append({"s": "mirostat", "n_vocab": n, "seed": sp.seed, "tau": sp.mirostat_tau,
                              "eta": sp.mirostat_eta, "m": 100})  # fmt: skip
            else:
                specs.append(
                    {"s": "mirostat_v2", "seed": sp.seed, "tau": sp.mirostat_tau, "eta": sp.mirostat_eta}
                )
        try:
            chain = build_chain(sp, n_vocab=n, vocab=self.pyvocab, n_ctx=n_ctx)
        except Exception as e:
            self.counts["chain"]["exception"] += 1
            self.examples.setdefault(
                ("chain", "exception"), {"params": dataclasses.asdict(sp), "py": repr(e)}
            )
            return
        cs = [self.cpp.make(s) for s in specs]
        try:
            pys = chain.samplers
            names_c = [self.cpp.name(x) for x in cs]
            names_p = [s.name for s in pys]
            self.cases["chain"] += 1
            if names_c != names_p:  # describe() differs; the steps are still compared pairwise
                self.counts["chain"]["name"] += 1
                ex = {"cpp": names_c, "py": names_p, "params": dataclasses.asdict(sp)}
                self.examples.setdefault(("chain", "name"), ex)
            alpha = rng.choice(n, min(n, 6), replace=False).tolist() + [t for t in (1, 9, 25, 198) if t < n]
            hist: list[int] = []
            for _ in range(int(rng.integers(0, 40))):  # a prompt with repeats
                t = int(_pick(rng, alpha))
                hist.append(t)
                for x in cs:
                    self.cpp.lib.llama_sampler_accept(x, t)
                chain.accept_prompt([t])
            for _ in range(int(rng.integers(1, 4))):
                logits, lk = gen_logits(
                    rng, n, _pick(rng, ["normal", "llm", "llm", "ties", "neginf", "mixed", "huge"])
                )
                inp = Snap(np.arange(n, dtype=np.int32), logits, np.zeros(n, np.float32), False)
                carr = CArr(inp)
                cur = py_arr(inp)
                prev = inp
                for si, (spec, c, p) in enumerate(zip(specs, cs, pys, strict=True)):
                    kind = spec["s"]
                    mu_before = self.cpp.mu(c, kind)[1] if kind.startswith("mirostat") else None
                    a = cpp_apply(self.cpp, c, carr)
                    b = py_apply(p, cur)
                    diff = compare(a, b, kind, prev)
                    ctx = {"chain_step": si, "chain": names_c, "logits": lk, "params": dataclasses.asdict(sp)}
                    if mu_before is not None:
                        ctx["mu_before"] = float(mu_before)
                        p.mu = float(self.cpp.mu(c, kind)[1])
                    known = self.record(f"chain:{kind}", diff, spec, prev, a, b, hist, ctx)
                    if b.error or known:
                        return
                    if diff:  # resync: every step is compared from the same input
                        cur = py_arr(a)
                        cur.selected = a.selected
                    prev = a
                tok = prev.token()
                if tok is None:
                    break
                hist.append(tok)
                for x in cs:
                    self.cpp.lib.llama_sampler_accept(x, tok)
                chain.accept(tok)
        finally:
            for x in cs:
                self.cpp.lib.llama_sampler_free(x)


def save_cases(runner: Runner, folder: Path) -> None:
    """Every example's full step input (``.npz``: ids, logits, p, sorted, hist) and spec, for replays."""
    folder.mkdir(parents=True, exist_ok=True)
    for (kind, cat), ex in runner.examples.items():
        if "spec" not in ex:
            continue
        inp = ex["input"]
        name = f"{kind}_{cat}".replace(":", "-")
        np.savez(folder / f"{name}.npz", ids=inp.ids, logits=inp.logits, p=inp.p, sorted=inp.sorted,
                 hist=np.array(ex["hist"], dtype=np.int64))  # fmt: skip
        meta = {"spec": ex["spec"], "mu_before": ex["context"].get("mu_before")}
        (folder / f"{name}.json").write_text(json.dumps(meta, default=str))


def summarize(runner: Runner, shrink: bool) -> dict:
    rows = {}
    for kind in sorted(set(runner.cases) | set(runner.counts)):
        c = runner.counts.get(kind, {})
        rows[kind] = {
            "steps": runner.cases.get(kind, 0),
            "active": runner.active.get(kind, 0),
            "bug": {k: v for k, v in c.items() if k in BUG},
            "minor": {k: v for k, v in c.items() if k in MINOR},
            "benign": {k: v for k, v in c.items() if k in BENIGN},
            "known": {k[6:]: v for k, v in c.items() if k.startswith("known:")},
            "max_logit_rel": runner.numeric[kind]["logit_rel"] if kind in runner.numeric else 0.0,
            "max_p_abs": runner.numeric[kind]["p_abs"] if kind in runner.numeric else 0.0,
        }
    examples = []
    for (kind, cat), ex in sorted(runner.examples.items()):
        if "spec" not in ex:
            examples.append({"sampler": kind, "category": cat, **{k: v for k, v in ex.items()}})
            continue
        item = {
            "sampler": kind,
            "category": cat,
            "spec": ex["spec"],
            "hist": ex["hist"][-40:],
            "context": {k: v for k, v in ex["context"].items() if k != "params"},
            "params": ex["context"].get("params"),
            "detail": ex["detail"],
            "input": ex["input"].to_json(16),
            "cpp": ex["cpp"].to_json(16),
            "py": ex["py"].to_json(16),
        }
        base = kind.split(":")[-1]
        if shrink and cat in BUG + ("logit-ulp", "p-ulp", "sorted-flag") and base not in ("dist",):
            try:
                item["shrunk"] = runner.shrink(base, cat, ex)
            except Exception as e:
                item["shrunk"] = {"error": f"{type(e).__name__}: {e}"}
        examples.append(item)
    return {"summary": rows, "examples": examples}


def print_report(res: dict) -> None:
    """The per-sampler table, then each real mismatch group with its shrunk case."""
    print(f"{'sampler':20} {'steps':>6} {'active':>6}  bug / minor / benign (tie) / known")
    for kind, r in res["summary"].items():

        def fmt(d):
            return ",".join(f"{k}={v}" for k, v in sorted(d.items())) or "-"

        print(
            f"{kind:20} {r['steps']:6} {r['active']:6}  {fmt(r['bug'])} / {fmt(r['minor'])} / {fmt(r['benign'])} / {fmt(r['known'])}"
            f"  (max logit rel {r['max_logit_rel']:.2g}, max p abs {r['max_p_abs']:.2g})"
        )
    for ex in res["examples"]:
        if ex["category"] not in BUG:
            continue
        sh = ex.get("shrunk", {})
        lk = res["by_logit_kind"].get(f"{ex['sampler']}/{ex['category']}", {})
        print(f"\n== {ex['sampler']} / {ex['category']}: {json.dumps(ex.get('spec'))}  by logits: {lk}")
        if sh.get("reproduced"):
            print(f"   input  {json.dumps(sh['input'])}")
            print(f"   cpp    {json.dumps(sh['cpp'])}")
            print(f"   py     {json.dumps(sh['py'])}")
        else:
            print(f"   (not shrunk: {sh}) detail {json.dumps(ex.get('detail'))[:300]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300, help="cases per sampler (chains: this many chains)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default="solo,stateful,chain")
    ap.add_argument("--only", default="", help="comma-separated sampler names (solo/stateful)")
    ap.add_argument("--lib", type=Path, default=None)
    ap.add_argument("--vocab", type=Path, default=SHARED / "vocab" / "ggml-vocab-llama-bpe.gguf")
    ap.add_argument("--out", type=Path, default=Path("/tmp/sampfuzz/results.json"))
    ap.add_argument("--shrink", type=int, default=300, help="replays per shrink (0: no shrinking)")
    a = ap.parse_args()
    faulthandler.enable()
    np.seterr(all="ignore")  # -inf - -inf and friends are part of the cases
    lib_dir = a.lib or llamacpp_bin("avx2")
    cpp = Cpp(lib_dir, a.vocab)
    from llamapy.vocab import load_vocab

    pyvocab = load_vocab(a.vocab)
    runner = Runner(cpp, pyvocab, a.shrink)
    only = {s for s in a.only.split(",") if s}
    modes = set(a.modes.split(","))
    t0 = time.time()
    for mi, (mode, kinds) in enumerate((("solo", SOLO), ("stateful", STATEFUL))):
        if mode not in modes:
            continue
        for ki, kind in enumerate(kinds):
            if only and kind not in only:
                continue
            rng = np.random.default_rng([a.seed, mi, ki])
            t1 = time.time()
            for _ in range(a.n):
                getattr(runner, mode)(rng, kind)
            print(f"{mode:8} {kind:12} {a.n} cases  {time.time() - t1:.1f}s", flush=True)
    if "chain" in modes:
        rng = np.random.default_rng([a.seed, 9])
        t1 = time.time()
        for i in range(a.n):
            runner.chain(rng, i)
        print(f"chain    {a.n} chains  {time.time() - t1:.1f}s", flush=True)
    save_cases(runner, a.out.parent / "cases")
    res = summarize(runner, a.shrink > 0)
    res["by_logit_kind"] = {k: dict(v) for k, v in sorted(runner.by_logits.items())}
    res["args"] = {k: str(v) for k, v in vars(a).items()}
    res["seconds"] = time.time() - t0
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(
        json.dumps(res, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    )
    print_report(res)
    print(f"\n{a.out} ({res['seconds']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
