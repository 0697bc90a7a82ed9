"""Differential check of llamapy's grammar sampler against llama.cpp's (``libllama.so`` through ctypes).

A diagnostic, not a test. For every grammar (llama.cpp's ``grammars/*.gbnf``, hand-written GBNF that
exercises one feature each, seeded random GBNF, and JSON schemas converted by both sides: llamapy's
``LlamaGrammar.from_json_schema`` and llama.cpp's C++ ``json_schema_to_grammar`` through a small shim
compiled with g++ into ``--work``) it builds llama.cpp's grammar sampler (``llama_sampler_init_grammar``)
and llamapy's ``GrammarSampler`` over the same vocabulary and feeds both the same token ids:

- strings generated from the grammar (a random expansion of its rules), and near misses of them (a
  character deleted, inserted, replaced, swapped, a piece duplicated, the string cut), tokenized by
  llama.cpp (``llama_tokenize``, so both sides see the same ids);
- random walks: at each step a random token that both sides allow (end-of-generation sometimes).

At every step it compares the full sets of allowed tokens over the whole vocabulary (llama.cpp: the
tokens whose logit ``llama_sampler_apply`` leaves finite), end-of-generation included, then accepts the
next token on both sides while both allow it. Each token allowed by one side only is put in a class:

- ``special``: a control/user-defined token llamapy marks (llguidance only matches it as ``<name>`` or
  ``<[id]>``, by design; llama.cpp matches its text);
- ``eog``: an end-of-generation token (the grammar is complete on one side only);
- ``tokenization``: llama.cpp only, while llamapy accepts the token's bytes fed one byte token at a time
  and the grammar forces text there that the token is a piece of (llguidance allows the canonical tokens
  of forced text only, as llamapy's sampler documents);
- ``nul``: the piece holds a NUL byte (llama.cpp refuses every piece that starts with one);
- ``mask_incomplete``: as ``tokenization``, but no text is forced there (llamapy's mask misses the token);
- ``partial_utf8``: the token's piece is not complete UTF-8 (it ends inside or starts with a continuation
  byte), so the answer depends on how each side treats partial characters;
- ``language``: anything else (the two accept different text: a real difference of meaning).

A sequence ends early when one side refuses its next token (``py_rejects``/``lc_rejects``), or when
llamapy raises while computing a mask (``py_error``: llguidance gave up, e.g. too many Earley items).
Groups: ``files`` (llama.cpp's grammars), ``hand`` (one feature each), ``syntax`` (parser corner cases:
does each side accept the grammar), ``random``, ``schema``. For a JSON schema it also checks whole texts
(the given instances, the generated strings, both kinds of walk, and walks that llamapy's mask alone
drives): valid per the ``jsonschema`` package (formats checked)? accepted whole by llama.cpp? by llamapy
(fed byte by byte, so its tokenization does not matter)? "invalid but llamapy accepts" would be a bug.

    python benchmarks/grammar_vs_llamacpp.py [--vocab ../shared/vocab/ggml-vocab-llama-bpe.gguf]
        [--seed 0] [--n-random 30] [--strings 6] [--walks 4] [--only NAME_SUBSTRING]
        [--skip files,hand,syntax,random,schema] [--out /tmp/gramfuzz/results.json] [--work /tmp/gramfuzz]
    python benchmarks/grammar_vs_llamacpp.py --gbnf FILE|TEXT [--text PREFIX ...]   # one grammar, verbose
    python benchmarks/grammar_vs_llamacpp.py --schema FILE|JSON [--text PREFIX ...]

The defaults take about 9 minutes on one core (llama.cpp's full-vocabulary apply is ~20 ms a step).
Exit status 0 whether or not differences were found (it is a report); the JSON has every detail.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import ctypes as C  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.harness import llamacpp_bin  # noqa: E402
from benchmarks.tokenize_vs_llamacpp import LlamaCpp  # noqa: E402

SHARED = ROOT.parent / "shared"
CLASSES = ("special", "eog", "nul", "tokenization", "mask_incomplete", "partial_utf8", "language")


# --- llama.cpp ----------------------------------------------------------------------------------------------


class TokenData(C.Structure):
    _fields_ = [("id", C.c_int32), ("logit", C.c_float), ("p", C.c_float)]


class TokenDataArray(C.Structure):
    _fields_ = [("data", C.POINTER(TokenData)), ("size", C.c_size_t), ("selected", C.c_int64),
                ("sorted", C.c_bool)]  # fmt: skip


SHIM = r"""
#include "json-schema-to-grammar.h"
#include <cstdlib>
#include <cstring>
extern "C" char * shim_schema_to_grammar(const char * schema, char ** err) {
    try {
        common_json j = common_json::parse(std::string(schema));
        std::string g = json_schema_to_grammar(j);
        *err = nullptr;
        return strdup(g.c_str());
    } catch (const std::exception & e) {
        *err = strdup(e.what());
        return nullptr;
    }
}
extern "C" void shim_free(char * p) { free(p); }
"""


class LlamaCppGrammar:
    """llama.cpp's grammar sampler and (through the shim) its JSON-schema converter."""

    def __init__(self, lib_dir: Path, vocab_path: Path, work: Path) -> None:
        self.cpp = LlamaCpp(lib_dir)
        self.cpp.load(vocab_path)
        lib = self.lib = self.cpp.lib
        lib.llama_sampler_init_grammar.restype = C.c_void_p
        lib.llama_sampler_init_grammar.argtypes = [C.c_void_p, C.c_char_p, C.c_char_p]
        lib.llama_sampler_apply.argtypes = [C.c_void_p, C.POINTER(TokenDataArray)]
        lib.llama_sampler_accept.argtypes = [C.c_void_p, C.c_int32]
        lib.llama_sampler_free.argtypes = [C.c_void_p]
        lib.llama_vocab_is_eog.argtypes = [C.c_void_p, C.c_int32]
        lib.llama_vocab_is_eog.restype = C.c_bool
        self.n = lib.llama_vocab_n_tokens(self.cpp.vocab)
        self._arr = (TokenData * self.n)()
        self._view = np.ctypeslib.as_array(self._arr).view(
            np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        )
        self._ids = np.arange(self.n, dtype=np.int32)
        self.eog = np.array([t for t in range(self.n) if lib.llama_vocab_is_eog(self.cpp.vocab, t)], np.int64)
        self.shim = self._build_shim(lib_dir, work)

    def _build_shim(self, lib_dir: Path, work: Path):
        src_root = lib_dir.parent.parent
        so = work / "libjs2g_shim.so"
        try:
            common = lib_dir / "libllama-common.so"
            if not so.exists():
                work.mkdir(parents=True, exist_ok=True)
                (work / "js2g_shim.cpp").write_text(SHIM)
                inc = [f"-I{src_root / d}" for d in ("common", "include", "ggml/include", "vendor")]
                cmd = ["g++", "-O1", "-std=c++17", "-shared", "-fPIC", *inc, str(work / "js2g_shim.cpp"),
                       "-o", str(so), f"-L{lib_dir}", "-lllama-common", f"-Wl,-rpath,{lib_dir}"]  # fmt: skip
                subprocess.run(cmd, check=True, capture_output=True, timeout=300)
            C.CDLL(str(common), mode=C.RTLD_GLOBAL)
            shim = C.CDLL(str(so))
            shim.shim_schema_to_grammar.restype = C.c_void_p
            shim.shim_schema_to_grammar.argtypes = [C.c_char_p, C.POINTER(C.c_char_p)]
            shim.shim_free.argtypes = [C.c_void_p]
            return shim
        except (OSError, subprocess.SubprocessError) as e:
            print(
                f"json_schema_to_grammar shim unavailable ({e}); JSON schemas compare llamapy alone",
                flush=True,
            )
            return None

    def schema_to_gbnf(self, schema: str) -> tuple[str | None, str | None]:
        if self.shim is None:
            return None, "no shim"
        err = C.c_char_p()
        p = self.shim.shim_schema_to_grammar(schema.encode(), C.byref(err))
        if not p:
            msg = err.value.decode("utf-8", "replace") if err.value else "failed"
            return None, msg
        text = C.string_at(p).decode("utf-8")
        self.shim.shim_free(p)
        return text, None

    def new(self, gbnf: str, root: str = "root") -> int | None:
        return (
            self.lib.llama_sampler_init_grammar(self.cpp.vocab, gbnf.encode("utf-8"), root.encode()) or None
        )

    def free(self, smpl: int) -> None:
        self.lib.llama_sampler_free(smpl)

    def mask(self, smpl: int) -> np.ndarray:
        v = self._view
        v["id"] = self._ids
        v["logit"] = 0.0
        v["p"] = 0.0
        tda = TokenDataArray(self._arr, self.n, -1, False)
        self.lib.llama_sampler_apply(smpl, C.byref(tda))
        if tda.size != self.n:
            raise RuntimeError("llama_sampler_apply resized the candidates")
        out = np.zeros(self.n, bool)
        out[v["id"]] = np.isfinite(v["logit"])
        return out

    def allows(self, smpl: int, toks: list[int]) -> bool:
        """Whether llama.cpp's sampler leaves any of ``toks`` finite (a small candidate array: fast)."""
        arr = (TokenData * len(toks))(*[TokenData(int(t), 0.0, 0.0) for t in toks])
        tda = TokenDataArray(arr, len(toks), -1, False)
        self.lib.llama_sampler_apply(smpl, C.byref(tda))
        return any(np.isfinite(arr[i].logit) for i in range(len(toks)))

    def accepts_text(self, gbnf: str, text: str) -> bool:
        """The whole of ``text`` (llama.cpp's tokenization) is allowed token by token, then end-of-generation."""
        s = self.new(gbnf)
        if s is None:
            return False
        try:
            for t in self.tokenize(text):
                if not self.allows(s, [t]):
                    return False
                self.accept(s, t)
            return self.allows(s, self.eog.tolist())
        finally:
            self.free(s)

    def accept(self, smpl: int, tok: int) -> None:
        self.lib.llama_sampler_accept(smpl, int(tok))  # only ever with a token its mask allowed

    def tokenize(self, text: str) -> list[int]:
        return self.cpp.tokenize(text.encode("utf-8", "surrogatepass"), False, False)

    def tokenize_special(self, text: str) -> list[int]:
        return self.cpp.tokenize(text.encode("utf-8"), False, True)

    def piece(self, tok: int) -> bytes:
        return self.cpp.piece(tok, special=True)


# --- llamapy -------------------------------------------------------------------------------------------------


class Py:
    def __init__(self, vocab_path: Path) -> None:
        from llamapy.grammar.tokenizer import vocab_info
        from llamapy.vocab import load_vocab

        self.vocab = load_vocab(vocab_path)
        self.info = vocab_info(self.vocab)
        self.n = self.info.n_vocab

    def sampler(self, kind: str, src: str):
        from llamapy.grammar import LlamaGrammar

        g = LlamaGrammar.from_json_schema(src) if kind == "schema" else LlamaGrammar.from_string(src)
        return g.sampler(self.vocab)

    def mask(self, s) -> np.ndarray:
        bits = np.unpackbits(s.allowed_mask().view(np.uint8), bitorder="little")[: self.n]
        return bits.astype(bool)

    def accepts_text(self, s, text: str) -> bool:
        """``text`` fed byte by byte to a fresh copy of the sampler's grammar is a complete sentence of it."""
        bt = self.info.byte_tokens
        data = text.encode("utf-8", "surrogatepass")
        if not all(b in bt for b in data):
            return False
        m = s._proto.deep_copy()
        return m.try_consume_tokens([bt[b] for b in data]) == len(data) and m.is_accepting()

    def accepts_bytes(self, s, data: bytes) -> bool:
        """Whether the matcher takes ``data`` fed one byte token at a time (a copy; the sampler is untouched)."""
        bt = self.info.byte_tokens
        if not data or not all(b in bt for b in data):
            return False
        m = s._matcher.deep_copy()
        return m.try_consume_tokens([bt[b] for b in data]) == len(data)


# --- strings from a GBNF grammar -----------------------------------------------------------------------------

PALETTE = list("abcxyz019 -_.,:;\"'\\{}[]()\n\t") + ["é", "ü", "中", "日", "🙂", "Ω", "\u00a0", "ß"]
INF = 10**9


class Generator:
    """Random sentences of a GBNF grammar (parsed by llamapy's parser: only the syntax tree is used)."""

    def __init__(self, src: str, rng: random.Random, resolve) -> None:
        from llamapy.grammar.gbnf import parse_gbnf

        self.g = parse_gbnf(src)
        self.rng = rng
        self.resolve = resolve  # "<text>" -> token id
        self.h = self._heights()

    def _item_h(self, it, h) -> int:
        from llamapy.grammar.gbnf import Cls, Lit, Ref, Rep
        from llamapy.grammar.units import class_ranges

        if isinstance(it, Lit):
            return 0
        if isinstance(it, Cls):
            return 0 if class_ranges(it) else INF
        if isinstance(it, Ref):
            return h[it.name]
        if isinstance(it, Rep):
            return 0 if it.lo == 0 else self._item_h(it.item, h)
        return 0  # token

    def _heights(self) -> dict[str, int]:
        h = dict.fromkeys(self.g.rules, INF)
        changed = True
        while changed:
            changed = False
            for r, body in self.g.rules.items():
                best = min((1 + max([self._item_h(it, h) for it in seq] or [0]) for seq in body), default=INF)
                best = min(best, INF)
                if best < h[r]:
                    h[r] = best
                    changed = True
        return h

    def sentence(self, max_len: int = 120) -> list:
        """A list of units: str (one character) or int (a token id)."""
        self.out: list = []
        self.max_len = max_len
        self._rule(self.g.root, 0)
        return self.out

    def _deep(self, depth: int) -> bool:
        return depth > 12 or len(self.out) > self.max_len

    def _rule(self, name: str, depth: int) -> None:
        body = self.g.rules[name]
        ok = [seq for seq in body if max([self._item_h(it, self.h) for it in seq] or [0]) < INF]
        if self._deep(depth):
            ok = sorted(ok, key=lambda seq: max([self._item_h(it, self.h) for it in seq] or [0]))[:1]
        seq = self.rng.choice(ok)
        for it in seq:
            self._item(it, depth + 1)

    def _item(self, it, depth: int) -> None:
        from llamapy.grammar.gbnf import Cls, Lit, Ref, Rep, Tok
        from llamapy.grammar.units import class_ranges

        rng = self.rng
        if isinstance(it, Lit):
            self.out.extend(chr(cp) for cp in it.cps)
        elif isinstance(it, Cls):
            rs = [(max(a, 1), b) for a, b in class_ranges(it) if b >= 1]
            a, b = rng.choice(rs)
            cp = rng.randint(a, min(b, a + 300)) if rng.random() < 0.8 else rng.randint(a, b)
            self.out.append(chr(cp))
        elif isinstance(it, Tok):
            t = it.value if isinstance(it.value, int) else self.resolve(it.value)
            if it.negated:
                t = rng.choice([x for x in (64, 65, 66, 99, 100, 220, 262, 1174) if x != t])
            self.out.append(int(t))
        elif isinstance(it, Ref):
            self._rule(it.name, depth)
        elif isinstance(it, Rep):
            n = it.lo
            if not self._deep(depth):
                extra = 3 if it.hi is None else it.hi - it.lo
                n += rng.randint(0, min(extra, 3))
            for _ in range(n):
                self._item(it.item, depth + 1)


def mutate(units: list, rng: random.Random, palette: list[str]) -> list:
    u = list(units)
    op = rng.choice(["del", "ins", "rep", "swap", "dup", "cut", "cut"])
    i = rng.randrange(len(u)) if u else 0
    if op == "del" and u:
        del u[i]
    elif op == "ins" or not u:
        u.insert(rng.randint(0, len(u)), rng.choice(palette))
    elif op == "rep":
        u[i] = rng.choice(palette)
    elif op == "swap" and len(u) > 1:
        i = min(i, len(u) - 2)
        u[i], u[i + 1] = u[i + 1], u[i]
    elif op == "dup":
        j = rng.randint(i, min(len(u), i + 4))
        u[j:j] = u[i:j]
    else:
        u = u[: rng.randint(0, len(u))]
    return u


def units_tokens(units: list, lc: LlamaCppGrammar) -> list[int]:
    out: list[int] = []
    text: list[str] = []
    for x in [*units, None]:
        if isinstance(x, str):
            text.append(x)
            continue
        if text:
            out += lc.tokenize("".join(text))
            text = []
        if x is not None:
            out.append(int(x))
    return out


def grammar_palette(src: str) -> list[str]:
    chars = [c for c in src if not c.isspace() and c.isprintable()]
    return PALETTE + chars[:200]


# --- the comparison ------------------------------------------------------------------------------------------


def is_partial_utf8(b: bytes) -> bool:
    if b and 0x80 <= b[0] <= 0xBF:
        return True
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


class Compare:
    def __init__(self, lc: LlamaCppGrammar, py: Py, max_examples: int = 6, max_classify: int = 400) -> None:
        self.lc = lc
        self.py = py
        self.eog = set(lc.eog.tolist())
        self.special = np.array([py.info.tokenizer.is_special_token(t) for t in range(py.n)], bool)
        self.max_examples = max_examples
        self.max_classify = max_classify
        self._pieces: dict[int, bytes] = {}

    def piece(self, t: int) -> bytes:
        p = self._pieces.get(t)
        if p is None:
            p = self._pieces[t] = self.lc.piece(t)
        return p

    def text(self, toks: list[int]) -> str:
        return b"".join(self.piece(t) for t in toks).decode("utf-8", "backslashreplace")

    def classify(self, t: int, lc_side: bool, ps) -> str:
        if t in self.eog:
            return "eog"
        if self.special[t]:
            return "special"
        p = self.piece(t)
        if b"\x00" in p:
            return "nul"
        if lc_side and self.py.accepts_bytes(ps, p):
            forced = ps._matcher.deep_copy().compute_ff_bytes()
            if forced and (p.startswith(forced) or forced.startswith(p)):
                return "tokenization"  # text the grammar forces: llguidance allows its canonical tokens only
            return "mask_incomplete"  # the text is allowed, the token is not, and nothing is forced
        if is_partial_utf8(p):
            return "partial_utf8"
        return "language"

    def step_diff(self, a: np.ndarray, b: np.ndarray, ps) -> dict | None:
        if np.array_equal(a, b):
            return None
        d: dict = {"n_lc": int(a.sum()), "n_py": int(b.sum())}
        for side, only in (("lc_only", np.flatnonzero(a & ~b)), ("py_only", np.flatnonzero(b & ~a))):
            cls: Counter = Counter()
            ex: dict[str, list[str]] = {}
            sample = (
                only
                if len(only) <= self.max_classify
                else np.sort(np.random.default_rng(0).choice(only, self.max_classify, replace=False))
            )
            for t in sample.tolist():
                c = self.classify(t, side == "lc_only", ps)
                cls[c] += 1
                lst = ex.setdefault(c, [])
                if len(lst) < self.max_examples:
                    lst.append(f"{t}:{self.piece(t).decode('utf-8', 'backslashreplace')!r}")
            d[side] = {"n": len(only), "sampled": len(sample), "classes": dict(cls), "examples": ex}
        return d

    def py_error(self, seq: dict, rec: dict, i: int, prefix: list[int], e: Exception) -> None:
        """llamapy's mask failed at step ``i`` after ``prefix``: note it in the sequence and the counts."""
        seq["py_error"] = f"step {i} after {self.text(prefix)[-60:]!r}: {type(e).__name__}: {str(e)[:160]}"
        rec["py_errors"] += 1

    def record_step(self, seq: dict, rec: dict, i: int, prefix: list[int], a, b, ps) -> dict | None:
        """Compare the two masks at step ``i`` (after ``prefix``); a difference goes into the sequence and
        its token classes into the counts. Returns it (None: the same)."""
        d = self.step_diff(a, b, ps)
        rec["steps"] += 1
        if d is not None:
            d["step"] = i
            d["prefix"] = self.text(prefix)[-120:]
            d["prefix_tokens"] = len(prefix)
            seq["diffs"].append(d)
            for side in ("lc_only", "py_only"):
                for c, k in d[side]["classes"].items():
                    rec["classes"][f"{side}:{c}"] += 1 if k else 0
        return d

    def run_sequence(
        self, lc_s: int, ps, toks: list[int], rec: dict, label: str, verbose: bool = False
    ) -> dict:
        """Feed ``toks``; compare at every step and at the end. Returns the sequence record."""
        seq: dict = {"label": label, "text": self.text(toks)[:300], "n_tokens": len(toks), "diffs": []}
        done: list[int] = []
        end = "complete"
        for i in range(len(toks) + 1):
            a = self.lc.mask(lc_s)
            try:
                b = self.py.mask(ps)
            except Exception as e:  # llguidance gave up (e.g. too many Earley items): reported
                self.py_error(seq, rec, i, done, e)
                end = "py_error"
                break
            d = self.record_step(seq, rec, i, done, a, b, ps)
            if verbose:
                self.print_step(i, done, a, b, d)
            if i == len(toks):
                break
            t = toks[i]
            ok_a, ok_b = bool(a[t]), bool(b[t])
            if t in self.eog or not (ok_a and ok_b):
                end = {(True, True): "eog", (False, False): "both_reject", (True, False): "py_rejects",
                       (False, True): "lc_rejects"}[(ok_a, ok_b)]  # fmt: skip
                seq["stop_at"] = i
                seq["stop_token"] = f"{t}:{self.piece(t).decode('utf-8', 'backslashreplace')!r}"
                break
            self.lc.accept(lc_s, t)
            ps.accept(t)
            done.append(t)
        if end == "complete" and "py_error" not in seq:
            eog_a = bool(a[list(self.eog)].any())
            eog_b = bool(b[list(self.eog)].any())
            end = f"complete(eog lc={eog_a} py={eog_b})"
        seq["end"] = end
        if seq["diffs"]:
            rec["steps_with_diff"] += len(seq["diffs"])
        return seq

    def print_step(self, i: int, done: list[int], a, b, d) -> None:
        tail = self.text(done)[-60:]
        if d is None:
            print(f"  step {i:3d} after {tail!r}: same ({int(a.sum())} tokens)")
            return
        print(f"  step {i:3d} after {tail!r}: lc {d['n_lc']} py {d['n_py']}")
        for side in ("lc_only", "py_only"):
            s = d[side]
            if s["n"]:
                print(f"     {side}: {s['n']} {s['classes']}")
                for c, ex in s["examples"].items():
                    print(f"        {c}: {', '.join(ex)}")

    def walk(self, lc_s: int, ps, rng: random.Random, rec: dict, max_steps: int = 40) -> dict:
        toks: list[int] = []
        seq: dict = {"label": "walk", "diffs": []}
        eog = np.array(sorted(self.eog))
        for i in range(max_steps + 1):
            a = self.lc.mask(lc_s)
            try:
                b = self.py.mask(ps)
            except Exception as e:  # reported, as in run_sequence
                self.py_error(seq, rec, i, toks, e)
                break
            self.record_step(seq, rec, i, toks, a, b, ps)
            both = a & b
            both[eog] = False
            cand = np.flatnonzero(both)
            if (a[eog].any() and b[eog].any() and rng.random() < 0.15) or len(cand) == 0 or i == max_steps:
                break
            if rng.random() < 0.6:  # prefer short pieces: they get through structure faster
                short = [t for t in rng.sample(cand.tolist(), min(64, len(cand))) if len(self.piece(t)) <= 2]
                t = rng.choice(short) if short else int(rng.choice(cand.tolist()))
            else:
                t = int(rng.choice(cand.tolist()))
            self.lc.accept(lc_s, t)
            ps.accept(t)
            toks.append(t)
        seq["full_text"] = self.text(toks)
        seq["text"] = seq["full_text"][:300]
        seq["n_tokens"] = len(toks)
        seq["end"] = "walk"
        if seq["diffs"]:
            rec["steps_with_diff"] += len(seq["diffs"])
        return seq


# --- grammars ------------------------------------------------------------------------------------------------

HAND = {
    "lit_ascii": 'root ::= "hello world"',
    "lit_unicode": 'root ::= "héllo 中文 🙂 Ωmega"',
    "escapes": r'root ::= "\x41\u00e9\U0001F600\n\t\\\"\r" [\x30-\x39\u4e00-\u4e05]+',
    "alternation": 'root ::= "cat" | "car" | "cart" | "dog"',
    "grouping": 'root ::= ("a" | "b") ("c" | "d" "e") "f"',
    "star": 'root ::= "x" "ab"* "y"',
    "plus": 'root ::= [a-c]+ "d"',
    "optional": 'root ::= "a"? "b"? "ab"',
    "rep_exact": 'root ::= [0-9]{3} "-" [0-9]{4}',
    "rep_range": 'root ::= "a"{2,4} "b"{0,2} [xy]{1,}',
    "rep_min": 'root ::= ("ab" | "c"){2,} "."',
    "class_negated": 'root ::= "\\"" [^"\\\\\\n]* "\\""',
    "class_neg_unicode": 'root ::= [^é中]+ "."',
    "class_ranges": 'root ::= [a-zA-Z_] [a-zA-Z0-9_]* "=" [0-9]+',
    "class_unicode_range": 'root ::= [α-ω]+ " " [\\u3040-\\u309f]+',
    "any_char": 'root ::= "<" . . . ">"',
    "any_star": 'root ::= "[" .* "]"',
    "nested_rules": 'root ::= item ("," ws item)*\nitem ::= key ":" ws val\nkey ::= [a-z]+\nval ::= [0-9]+ | "\\"" [a-z]* "\\""\nws ::= " "?',
    "right_recursion": 'root ::= "(" root ")" | "x"',
    "recursion_list": 'root ::= "[" list? "]"\nlist ::= [0-9] | [0-9] "," list',
    "left_recursion": 'root ::= root "a" | "b"',
    "empty_alt": 'root ::= "a" ( "b" | ) "c"',
    "empty_rule": 'root ::= pre "x"\npre ::= | "p" | "pp"',
    "ambiguous_prefix": 'root ::= ("a" | "ab") "bc"',
    "greedy_trap": 'root ::= [a-z]+ "x" [0-9]',
    "ws_loop": 'root ::= "{" [ \\t\\n]* "}" [ \\n]*',
    "tok_ref": "root ::= <[128006]> [a-z]+ <[128007]> [a-z ]*",
    "tok_ref_neg": 'root ::= "a" !<[64]> !<[65]> "z"',
    "tok_text_ref": 'root ::= <|start_header_id|> "user" <|end_header_id|> [a-z]+',
    "special_text_literal": 'root ::= "<|eot_id|>" | "x"',
    "number": 'root ::= "-"? ([0-9] | [1-9] [0-9]+) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?',
    "dead_alt": 'root ::= "a" | "b" dead\ndead ::= "c" dead',
    "crlf_and_comments": 'root ::= "a" # comment\r\n  | "b"   # another\r\n',
    "multi_quant": 'root ::= ("a"+)? "b"',
    "utf8_partial_neg": "root ::= [^\\u00e9]{1,3}",
    "utf8_partial_pos": "root ::= [\\u00c0-\\u00c5\\u4e00]+",
    # recursive grammars whose free-text parts cannot be single lexemes (ambiguous), as people write them
    "sexpr": 'root ::= expr\nexpr ::= "(" ws (expr ws)* ")" | atom\natom ::= [^() \\n]+\nws ::= [ \\n]*',
    "xmlish": 'root ::= elem\nelem ::= "<" name ">" content "</" name ">"\ncontent ::= (elem | [^<]+)*\nname ::= [a-z]+',
    "list_rec": 'root ::= item+\nitem ::= "- " item | [^\\n]+ "\\n"',
    "heading_rec": 'root ::= (line "\\n")+\nline ::= "#" line | [^\\n]+',
}

SYNTAX = {  # parser corner cases: does each side accept the grammar, and with the same meaning?
    "class_escaped_bracket": r"root ::= [\]a]+",
    "class_escaped_dash": r"root ::= [a\-z]+",
    "class_leading_dash": "root ::= [-a]+",
    "class_trailing_dash": "root ::= [a-]+",
    "class_escapes": r'root ::= [\t\n\r\\"]+ "."',
    "brace_spaces": 'root ::= "a"{ 2 , 3 } "b"',
    "stacked_quant": 'root ::= "a"{1,2}{2} "b"',
    "star_question": 'root ::= "a"*? "b"',
    "newline_in_group": 'root ::= (\n  "a"\n  | "b"\n) "c"',
    "redefined_rule": 'root ::= "a"\nroot ::= "b"',
    "forward_ref": 'root ::= x\nx ::= "a" y\ny ::= "b"',
    "no_final_newline_comment": 'root ::= "a" # comment',
    "empty_class": 'root ::= "a" | []',
    "negated_empty_class": 'root ::= [^] "."',
    "empty_literal": 'root ::= "" "a"',
    "empty_group": 'root ::= () "a"',
    "trailing_bar": 'root ::= "a" |',
    "leading_bar": 'root ::= | "a"',
    "token_out_of_range": "root ::= <[99999999]>",
    "max_code_point": r'root ::= "\U0010FFFF" | "a"',
    "beyond_max_code_point": r'root ::= "\U00110000" | "a"',
    "surrogate_class": r'root ::= [\ud800-\udfff] | "a"',
    "no_spaces": 'root::="a"("b"|"c")',
    "indirect_left_recursion": 'root ::= x\nx ::= y "a" | "b"\ny ::= x',
    "nullable_star": 'root ::= ("a"?)* "b"',
    "rep_zero": 'root ::= "a"{0} "b"',
    "rep_zero_zero": 'root ::= "a"{0,0} "b"',
    "underscore_name": 'root ::= my_rule\nmy_rule ::= "a"',
    "unicode_name": 'root ::= rüle\nrüle ::= "a"',
    "crlf_lines": 'root ::= "a" b\r\nb ::= "c"\r\n',
    "tabs": 'root\t::=\t"a"\t"b"',
    "rep_over_threshold": 'root ::= "a"{2001}',
    "rep_product": 'root ::= ("a"{1000}){3}',
    "rep_missing_min": 'root ::= "ab"{,3}',
    "undefined_rule": "root ::= x",
    "text_token_not_single": "root ::= <hello world>",
    "negated_literal": 'root ::= !"a"',
    "big_hi": 'root ::= "a"{1,3000} "b"',
    "dot_newline": 'root ::= "<" . ">"',
}

SCHEMAS = {
    "obj_basic": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["name", "age"],
    },  # fmt: skip
    "enum_const": {
        "type": "object",
        "properties": {"c": {"enum": ["red", "green", 1, None]}, "k": {"const": "fixed"}},
        "required": ["c", "k"],
    },  # fmt: skip
    "array_items": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
    "string_len": {"type": "string", "minLength": 2, "maxLength": 4},
    "string_pattern": {"type": "string", "pattern": "^[a-z]+[0-9]{2}$"},
    "formats": {
        "type": "object",
        "properties": {"d": {"type": "string", "format": "date"}, "u": {"type": "string", "format": "uuid"}},
        "required": ["d", "u"],
    },  # fmt: skip
    "nested_optional": {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}, "c": {"type": "string"}}},
            "z": {"type": "null"},
        },
    },  # fmt: skip
    "anyof": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
    "int_range": {"type": "integer", "minimum": -5, "maximum": 120},
    "int_excl": {"type": "integer", "exclusiveMinimum": 0},
    "number": {"type": "number"},
    "additional": {"type": "object", "additionalProperties": {"type": "integer"}},
    "refs": {
        "$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
        "type": "array",
        "items": {"$ref": "#/$defs/p"},
        "maxItems": 2,
    },  # fmt: skip
    "tuple": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
    "nullable": {"type": ["string", "null"]},
    "any_object": {"type": "object"},
    "empty_schema": {},
    "string_plain": {"type": "string"},
    "bool_array_unique": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    "allof": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]},
        ]
    },
    "ref_sibling": {
        "$defs": {"base": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        "$ref": "#/$defs/base",
        "required": ["a"],
    },
    "anyof_objects": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                "required": ["kind", "x"],
            },
            {
                "type": "object",
                "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
                "required": ["kind", "y"],
            },
        ]
    },
    "pattern_props": {
        "type": "object",
        "patternProperties": {"^x_": {"type": "integer"}},
        "additionalProperties": False,
    },
    "enum_unicode": {"enum": ["é", "中文", 'a"b', "tab\t"]},
    "const_object": {"const": {"a": [1, 2], "b": None}},
    "num_range": {"type": "number", "minimum": 0.5, "maximum": 10},
    "int_big_range": {"type": "integer", "minimum": -1000, "maximum": 1000000},
    "datetime": {"type": "string", "format": "date-time"},
    "required_only": {"type": "object", "required": ["a"]},
    "additional_true": {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": True,
    },
    "nested_array_obj": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["id"],
        },
    },
    "recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "oneof_const": {"oneOf": [{"const": 1}, {"const": 2}]},
    "min_props": {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "minProperties": 1,
        "maxProperties": 2,
    },
    "pattern_unanchored": {"type": "string", "pattern": "ab"},
    "excl_max": {"type": "integer", "exclusiveMaximum": 10, "minimum": 0},
    "str_maxlen0": {"type": "string", "maxLength": 0},
    "ref_root": {
        "$defs": {"n": {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]}},
        "$ref": "#/$defs/n",
    },
}
SCHEMA_INSTANCES = {
    "obj_basic": ['{"name": "a", "age": 3}', '{"name":"x","age":-1,"ok":true}', '{"age": 3, "name": "a"}',
                  '{"name": "a"}', '{"name": "a", "age": 3, "extra": 1}', '{"name": "\\u00e9\\n", "age": 0}'],
    "enum_const": ['{"c": "red", "k": "fixed"}', '{"c": null, "k": "fixed"}', '{"c": 2, "k": "fixed"}'],
    "array_items": ["[1]", "[1.5, -2e3, 0]", "[]", "[1,2,3,4]", "[01]", "[1.0E+2]"],
    "string_len": ['"ab"', '"abcd"', '"a"', '"abcde"', '"\\n\\t"', '"é中"'],
    "string_pattern": ['"abc12"', '"a1"', '"ab123"', '"AB12"'],
    "formats": ['{"d": "2024-02-29", "u": "123e4567-e89b-12d3-a456-426614174000"}',
                '{"d": "2024-13-01", "u": "x"}'],
    "int_range": ["-5", "120", "121", "-6", "0", "007", "99"],
    "int_excl": ["1", "0", "-1", "12345678901234567890"],
    "number": ["0", "-0.5", "1e10", "1E-7", "12345678901234567", "1.", ".5", "-", "01"],
    "additional": ['{"a": 1, "b": 2}', "{}", '{"a": "x"}'],
    "refs": ['[{"x": 1}]', "[]", '[{"x": 1}, {"x": 2}, {"x": 3}]', '[{"y": 1}]'],
    "tuple": ['["a", 1]', '["a"]', '["a", 1, 2]', "[]"],
    "nullable": ['"x"', "null", "1"],
    "any_object": ['{"a": [1, {"b": null}]}', "{}", "[]", '"s"'],
    "empty_schema": ['{"a": 1}', "[1, 2]", '"s"', "1.5", "true", "null"],
    "ref_root": ['{"v": 1}', '{"v": 1, "zz": 2}'],
    "pattern_unanchored": ['"ab"', '"xaby"', '"ba"'],
    "required_only": ['{"a": 1}', '{"b": 1, "a": [1]}', '{"b": 1}', "{}"],
    "allof": ['{"a": 1, "b": "x"}', '{"b": "x", "a": 1}', '{"a": 1}'],
    "ref_sibling": ['{"a": 1}', "{}", '{"a": 1, "z": 2}'],
    "additional_true": ['{"a": 1, "b": [true]}', '{"b": 1}', "{}"],
    "min_props": ['{"a": 1}', "{}", '{"a": 1, "b": 2, "c": 3}'],
    "string_plain": ['"hello"', '"a\\"b"', '"\\ud83d\\ude00"', '"tab\\tx"', '"ctl\x01"', '"é🙂"'],
}  # fmt: skip


def random_gbnf(rng: random.Random) -> str:
    """A small random grammar over a few ASCII and non-ASCII characters, with every GBNF construct."""
    alpha = ["a", "b", "c", "é", "中", "🙂", " "]
    n_rules = rng.randint(1, 3)

    def lit() -> str:
        s = ""
        for _ in range(rng.randint(1, 3)):
            c = rng.choice(alpha + ["\\n", "\\x41", "\\u00e9", '\\"', "\\\\", "\\t"])
            s += c
        return f'"{s}"'

    def cls() -> str:
        parts = rng.sample(["a", "b-c", "é", "\\u4e00-\\u4e2d", "x-z", " ", "\\n", "0-9", "\\x80-\\xff"],
                           rng.randint(1, 3))  # fmt: skip
        return "[" + ("^" if rng.random() < 0.3 else "") + "".join(parts) + "]"

    def expr(depth: int, k: int) -> str:
        r = rng.random()
        if depth > 2 or r < 0.35:
            leaf = rng.random()
            if leaf < 0.45:
                return lit()
            if leaf < 0.75:
                return cls()
            if leaf < 0.82:
                return "."
            if leaf < 0.9 and k + 1 < n_rules:
                return f"r{rng.randint(k + 1, n_rules - 1)}"  # later rules only: no left recursion
            return lit()
        if r < 0.6:
            return "(" + " ".join(expr(depth + 1, k) for _ in range(rng.randint(2, 3))) + ")"
        if r < 0.8:
            alts = [expr(depth + 1, k) for _ in range(rng.randint(2, 3))]
            if rng.random() < 0.2:
                alts.append("")
            return "(" + " | ".join(alts) + ")"
        inner = expr(depth + 1, k)
        q = rng.choice(["*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}"])
        return f"({inner}){q}"

    rules = []
    for k in range(n_rules):
        name = "root" if k == 0 else f"r{k}"
        body = " ".join(expr(0, k) for _ in range(rng.randint(1, 3)))
        if k > 0 and rng.random() < 0.25:  # right recursion with a way out
            body = f"{lit()} {name} | {body}"
        rules.append(f"{name} ::= {body}")
    return "\n".join(rules) + "\n"


def load_text(arg: str) -> str:
    p = Path(arg)
    return p.read_text(encoding="utf-8") if len(arg) < 4096 and p.is_file() else arg


# --- the run ------------------------------------------------------------------------------------------------


def run_grammar(cmp: Compare, name: str, kind: str, src: str, rng: random.Random, n_strings: int, n_walks: int,
                extra: list[str] = (), lc_src: str | None = None) -> dict:  # fmt: skip
    lc, py = cmp.lc, cmp.py
    lc_src = src if lc_src is None else lc_src
    rec: dict = {"name": name, "kind": kind, "steps": 0, "steps_with_diff": 0, "py_errors": 0, "classes": Counter(),
                 "seqs": []}  # fmt: skip
    rec["grammar"] = src if len(src) < 2000 else src[:2000] + "..."
    if kind == "schema":
        rec["lc_gbnf"] = lc_src if lc_src is None or len(lc_src) < 3000 else lc_src[:3000] + "..."
    t0 = time.time()
    try:
        ps = py.sampler(kind, src)
        py_err = None
    except Exception as e:  # reported
        ps, py_err = None, f"{type(e).__name__}: {e}"[:300]
    lc_s = lc.new(lc_src) if lc_src else None
    rec["build"] = {"lc": lc_s is not None, "py": ps is not None, "py_error": py_err}
    if lc_s is None or ps is None:
        rec["time_s"] = round(time.time() - t0, 2)
        return rec
    seqs: list[tuple[str, list[int]]] = []

    def resolve(text: str) -> int:
        ids = lc.tokenize_special(text)
        return ids[0] if len(ids) == 1 else 0

    try:
        gen = Generator(lc_src, rng, resolve)
        pal = grammar_palette(lc_src)
        for _ in range(n_strings):
            u = gen.sentence()
            seqs.append(("valid", units_tokens(u, lc)))
            seqs.append(("near_miss", units_tokens(mutate(u, rng, pal), lc)))
    except Exception as e:  # the generator is best effort
        rec["generator_error"] = f"{type(e).__name__}: {e}"[:200]
    for s in extra:
        seqs.append(("given", lc.tokenize(s)))
    for label, toks in seqs:
        ps.reset()
        lc.free(lc_s)
        lc_s = lc.new(lc_src)
        rec["seqs"].append(cmp.run_sequence(lc_s, ps, toks, rec, label))
    for _ in range(n_walks):
        ps.reset()
        lc.free(lc_s)
        lc_s = lc.new(lc_src)
        rec["seqs"].append(cmp.walk(lc_s, ps, rng, rec))
    lc.free(lc_s)
    if kind == "schema":
        texts = [("given", x) for x in extra] + [(lb, cmp.text(t)) for lb, t in seqs if lb != "given"]
        texts += [("lc_walk", sq.pop("full_text")) for sq in rec["seqs"] if "full_text" in sq]
        for _ in range(n_walks * 2):
            t, complete = py_walk(cmp, ps, rng)
            if complete:
                texts.append(("py_walk", t))
        rec["texts"] = check_texts(cmp, json.loads(src), lc_src, ps, texts)
    for sq in rec["seqs"]:
        sq.pop("full_text", None)
    rec["time_s"] = round(time.time() - t0, 2)
    return rec


def py_walk(cmp: Compare, ps, rng: random.Random, max_steps: int = 60) -> tuple[str, bool]:
    """A random walk that llamapy's mask alone drives (closing characters preferred after a while)."""
    ps.reset()
    toks: list[int] = []
    eog = np.array(sorted(cmp.eog))
    for i in range(max_steps):
        try:
            b = cmp.py.mask(ps)
        except Exception:
            return cmp.text(toks), False
        if b[eog].any() and (rng.random() < 0.25 or i > 25):
            return cmp.text(toks), True
        b[eog] = False
        cand = np.flatnonzero(b).tolist()
        if not cand:
            return cmp.text(toks), False
        short = [t for t in rng.sample(cand, min(200, len(cand))) if len(cmp.piece(t)) <= 2]
        if i > 25:
            close = [t for t in cand[:4000] if cmp.piece(t) in (b'"', b"}", b"]", b"0", b"1", b"a", b"-")]
            short = close or short
        t = rng.choice(short) if short and rng.random() < 0.8 else rng.choice(cand)
        ps.accept(t)
        toks.append(t)
    return cmp.text(toks), False


def json_valid(schema, text: str) -> tuple[bool, str]:
    """``text`` is one JSON value (strict: no NaN/Infinity) that validates against ``schema`` (formats checked)."""
    import jsonschema

    def bad_constant(c: str):
        raise ValueError(f"not JSON: {c}")

    try:
        inst = json.loads(text, parse_constant=bad_constant)
    except ValueError as e:
        return False, f"not JSON: {str(e)[:60]}"
    cls = jsonschema.validators.validator_for(schema)
    errs = list(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(inst))
    return (not errs), (errs[0].message[:100] if errs else "")


def check_texts(cmp: Compare, schema, lc_src: str, ps, texts: list[tuple[str, str]]) -> list[dict]:
    """Each text: valid per the ``jsonschema`` package? accepted whole by llama.cpp? by llamapy (byte by byte)?"""
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        return []
    out, seen = [], set()
    for src, text in texts:
        if text in seen:
            continue
        seen.add(text)
        ok, why = json_valid(schema, text)
        out.append({"source": src, "text": text[:300], "valid": ok, "why": why,
                    "lc": cmp.lc.accepts_text(lc_src, text), "py": cmp.py.accepts_text(ps, text)})  # fmt: skip
    return out


def summarize(rec: dict) -> str:
    b = rec["build"]
    if not (b["lc"] and b["py"]):
        return (
            f"{rec['kind']:6s} {rec['name']:24s} build lc={b['lc']} py={b['py']} {b.get('py_error') or ''}"[
                :200
            ]
        )
    ends = Counter(s["end"].split("(")[0] for s in rec["seqs"])
    bad_ends = sum(v for k, v in ends.items() if k in ("py_rejects", "lc_rejects"))
    cls = ", ".join(f"{k}={v}" for k, v in sorted(rec["classes"].items()))
    line = (f"{rec['kind']:6s} {rec['name']:24s} steps {rec['steps']:4d}  diff-steps {rec['steps_with_diff']:3d}  "
            f"one-side-rejects {bad_ends:2d}  py-errors {rec['py_errors']}  {cls}")  # fmt: skip
    if "texts" in rec:
        tx = rec["texts"]
        k = Counter(f"{'valid' if t['valid'] else 'invalid'}:lc={int(t['lc'])},py={int(t['py'])}" for t in tx)
        line += "\n         texts " + ", ".join(f"{a}={b}" for a, b in sorted(k.items()))
    return line


def single(cmp: Compare, kind: str, src: str, texts: list[str]) -> None:
    lc, py = cmp.lc, cmp.py
    lc_src = src
    if kind == "schema":
        lc_src, err = lc.schema_to_gbnf(json.dumps(json.loads(src)))
        print("llama.cpp GBNF:\n" + (lc_src or f"(error: {err})"))
        if lc_src is None:
            return
    try:
        ps = py.sampler(kind, src)
    except Exception as e:  # reported
        print(f"llamapy refused the grammar: {type(e).__name__}: {str(e)[:300]}")
        lc_s = lc.new(lc_src)
        print(f"llama.cpp {'accepted' if lc_s else 'refused'} it")
        if lc_s:
            lc.free(lc_s)
        return
    for text in texts or [""]:
        lc_s = lc.new(lc_src)
        if lc_s is None:
            print("llama.cpp refused the grammar")
            return
        ps.reset()
        toks = lc.tokenize_special(text)
        print(f"text {text!r}: tokens {[cmp.piece(t).decode('utf-8', 'backslashreplace') for t in toks]}")
        rec = {"steps": 0, "steps_with_diff": 0, "py_errors": 0, "classes": Counter()}
        seq = cmp.run_sequence(lc_s, ps, toks, rec, "given", verbose=True)
        print(f"  end: {seq['end']} {seq.get('stop_token', '')} {seq.get('py_error', '')}")
        lc.free(lc_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=Path, default=SHARED / "vocab" / "ggml-vocab-llama-bpe.gguf")
    ap.add_argument(
        "--lib", type=Path, default=None, help="llama.cpp bin dir (default: the avx2 cache build)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-random", type=int, default=30, help="random GBNF grammars")
    ap.add_argument("--strings", type=int, default=6, help="generated strings (and as many near misses) each")
    ap.add_argument("--walks", type=int, default=4, help="random token walks each")
    ap.add_argument("--only", default=None, help="run only the grammars whose name contains this")
    ap.add_argument(
        "--skip", default="", help="comma-separated groups to skip: files,hand,syntax,random,schema"
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/gramfuzz/results.json"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/gramfuzz"))
    ap.add_argument("--gbnf", default=None, help="one GBNF grammar (file or text): print every step")
    ap.add_argument("--schema", default=None, help="one JSON schema (file or text): print every step")
    ap.add_argument("--text", action="append", default=[],
                    help="with --gbnf/--schema: a string to feed (special tokens parsed)")  # fmt: skip
    args = ap.parse_args()

    lib = args.lib or llamacpp_bin("avx2")
    lc = LlamaCppGrammar(lib, args.vocab, args.work)
    py = Py(args.vocab)
    if lc.n != py.n:
        raise SystemExit(f"vocabulary sizes differ: llama.cpp {lc.n}, llamapy {py.n}")
    cmp = Compare(lc, py)
    py_eog = set(py.info.eog.tolist())
    if py_eog != cmp.eog:
        print(f"EOG sets differ: llama.cpp {sorted(cmp.eog)} llamapy {sorted(py_eog)}")
    if args.gbnf or args.schema:
        kind, src = ("gbnf", load_text(args.gbnf)) if args.gbnf else ("schema", load_text(args.schema))
        single(cmp, kind, src, args.text)
        return 0

    rng = random.Random(args.seed)
    jobs: list[tuple[str, str, str, str | None, list[str]]] = []  # (name, kind, src, lc_src, extra)
    skip = set(args.skip.split(","))
    if "files" not in skip:
        for f in sorted((lib.parent.parent / "grammars").glob("*.gbnf")):
            jobs.append((f"file:{f.stem}", "gbnf", f.read_text(encoding="utf-8"), None, []))
    if "hand" not in skip:
        jobs += [(f"hand:{k}", "gbnf", v, None, []) for k, v in HAND.items()]
    if "syntax" not in skip:
        jobs += [(f"syntax:{k}", "gbnf", v, None, []) for k, v in SYNTAX.items()]
    if "random" not in skip:
        jobs += [(f"random:{i}", "gbnf", random_gbnf(rng), None, []) for i in range(args.n_random)]
    if "schema" not in skip:
        for k, s in SCHEMAS.items():
            text = json.dumps(s)
            lc_src, err = lc.schema_to_gbnf(text)
            if err:
                print(f"schema:{k}: llama.cpp's json_schema_to_grammar failed: {err.strip()}")
            jobs.append((f"schema:{k}", "schema", text, lc_src or "", SCHEMA_INSTANCES.get(k, [])))
    if args.only:
        jobs = [j for j in jobs if args.only in j[0]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    t0 = time.time()
    for name, kind, src, lc_src, extra in jobs:
        (args.work / "current_grammar.txt").write_text(f"{name}\n{src}\n")  # for a crash inside libllama
        rec = run_grammar(cmp, name, kind, src, rng, args.strings, args.walks, extra, lc_src)
        print(summarize(rec), flush=True)
        rec["classes"] = dict(rec["classes"])
        results.append(rec)
        args.out.write_text(json.dumps({"vocab": args.vocab.name, "results": results}, indent=1))
    print(f"{len(results)} grammars, {sum(r['steps'] for r in results)} steps, {time.time() - t0:.0f}s; "
          f"details in {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
