"""Differential fuzzing of llamapy's tokenizer against llama.cpp's (``libllama.so`` through ctypes).

A diagnostic, not a test: for every vocabulary file (default ``../shared/vocab/ggml-vocab-*.gguf``) it
tokenizes a seeded set of random strings (ASCII words, digit and punctuation runs, whitespace runs,
CJK/Korean/Arabic/Hindi/Thai, emoji with ZWJ sequences and flags, combining marks, NFC/NFD Latin,
control characters, the vocabulary's own special-token texts whole and cut, very long words, URLs,
code, and ../shared/reference/strings.json) with both, for add_special x parse_special, and compares
the ids exactly. It also compares the detokenization of llama.cpp's ids by both (remove_special=False,
unparse_special=True, and remove_special=True, unparse_special=False), every token's piece
(llama_token_to_piece, special 0/1, lstrip 0/1), the detokenization of random id sequences, and the
tokenization of invalid UTF-8 of the kinds llama.cpp survives. Each string mismatch is shrunk to a
minimal string (delta debugging over characters) and reported with both id lists and pieces.

    python benchmarks/tokenize_vs_llamacpp.py [--n 2000] [--seed 0] [--vocab qwen2 ...]
        [--lib DIR] [--out /tmp/tokfuzz/results.json] [--max-shrink 12]

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
import json  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
import unicodedata  # noqa: E402

from benchmarks.harness import llamacpp_bin  # noqa: E402

SHARED = ROOT.parent / "shared"
FLAGS = [(a, p) for a in (False, True) for p in (False, True)]


# --- llama.cpp ----------------------------------------------------------------------------------------


class ModelParams(C.Structure):
    # include/llama.h of the build (0.3.36's vendored llama.cpp): struct llama_model_params
    _fields_ = [
        ("devices", C.c_void_p),
        ("tensor_buft_overrides", C.c_void_p),
        ("n_gpu_layers", C.c_int32),
        ("split_mode", C.c_int),
        ("load_mode", C.c_int),
        ("lazy_mode", C.c_int),
        ("main_gpu", C.c_int32),
        ("tensor_split", C.c_void_p),
        ("progress_callback", C.c_void_p),
        ("progress_callback_user_data", C.c_void_p),
        ("kv_overrides", C.c_void_p),
        ("vocab_only", C.c_bool),
        ("check_tensors", C.c_bool),
        ("use_extra_bufts", C.c_bool),
        ("no_host", C.c_bool),
        ("no_alloc", C.c_bool),
        ("load_mtp", C.c_bool),
    ]


_LOG_CB = C.CFUNCTYPE(None, C.c_int, C.c_char_p, C.c_void_p)


class LlamaCpp:
    def __init__(self, lib_dir: Path):
        for name in ("libggml-base.so", "libggml-cpu.so", "libggml.so"):
            if (lib_dir / name).exists():
                C.CDLL(str(lib_dir / name), mode=C.RTLD_GLOBAL)
        lib = self.lib = C.CDLL(str(lib_dir / "libllama.so"))
        self._quiet = _LOG_CB(lambda level, text, data: None)
        lib.llama_log_set(self._quiet, None)
        lib.llama_backend_init()
        lib.llama_model_default_params.restype = ModelParams
        lib.llama_model_load_from_file.restype = C.c_void_p
        lib.llama_model_load_from_file.argtypes = [C.c_char_p, ModelParams]
        lib.llama_model_free.argtypes = [C.c_void_p]
        lib.llama_model_get_vocab.restype = C.c_void_p
        lib.llama_model_get_vocab.argtypes = [C.c_void_p]
        lib.llama_vocab_n_tokens.argtypes = [C.c_void_p]
        lib.llama_vocab_n_tokens.restype = C.c_int32
        lib.llama_tokenize.argtypes = [C.c_void_p, C.c_char_p, C.c_int32, C.POINTER(C.c_int32), C.c_int32,
                                       C.c_bool, C.c_bool]  # fmt: skip
        lib.llama_tokenize.restype = C.c_int32
        lib.llama_token_to_piece.argtypes = [
            C.c_void_p,
            C.c_int32,
            C.c_char_p,
            C.c_int32,
            C.c_int32,
            C.c_bool,
        ]
        lib.llama_token_to_piece.restype = C.c_int32
        lib.llama_detokenize.argtypes = [C.c_void_p, C.POINTER(C.c_int32), C.c_int32, C.c_char_p, C.c_int32,
                                         C.c_bool, C.c_bool]  # fmt: skip
        lib.llama_detokenize.restype = C.c_int32
        p = lib.llama_model_default_params()
        # a wrong layout would show in the defaults (llama_model_default_params in src/llama-model.cpp)
        ok = (p.n_gpu_layers, p.split_mode, p.load_mode, p.lazy_mode, p.vocab_only, p.use_extra_bufts)
        if ok != (-1, 1, -1, 1, False, True):
            raise SystemExit(f"llama_model_params layout does not match this libllama.so (defaults {ok})")
        p.vocab_only = True
        p.n_gpu_layers = 0
        self.params = p
        self.model = None
        self.vocab = None

    def load(self, path: Path) -> None:
        if self.model:
            self.lib.llama_model_free(self.model)
        self.model = self.lib.llama_model_load_from_file(str(path).encode(), self.params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = self.lib.llama_model_get_vocab(self.model)

    def tokenize(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        n = len(data) + 16
        while True:
            buf = (C.c_int32 * n)()
            r = self.lib.llama_tokenize(self.vocab, data, len(data), buf, n, add_special, parse_special)
            if r == -(2**31):
                raise RuntimeError("llama_tokenize: overflow")
            if r >= 0:
                return list(buf[:r])
            n = -r

    def piece(self, tok: int, special: bool = True, lstrip: int = 0) -> bytes:
        buf = C.create_string_buffer(256)
        r = self.lib.llama_token_to_piece(self.vocab, tok, buf, 256, lstrip, special)
        if r < 0:
            buf = C.create_string_buffer(-r)
            r = self.lib.llama_token_to_piece(self.vocab, tok, buf, -r, lstrip, special)
        return buf.raw[:r]

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (C.c_int32 * max(1, len(ids)))(*ids)
        n = 64 + 8 * len(ids)
        while True:
            buf = C.create_string_buffer(n)
            r = self.lib.llama_detokenize(self.vocab, arr, len(ids), buf, n, remove_special, unparse_special)
            if r >= 0:
                return buf.raw[:r]
            n = -r + 1


# --- llamapy ------------------------------------------------------------------------------------------


def py_tokenize(v, text: str, add_special: bool, parse_special: bool) -> list[int] | str:
    try:
        return v.tokenize(text, add_special=add_special, parse_special=parse_special)
    except Exception as e:  # reported as a mismatch
        return f"{type(e).__name__}: {e}"


def py_detok(v, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes | str:
    try:
        return v.detokenize_bytes(ids, remove_special, unparse_special)
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def py_piece(v, tok: int) -> bytes | str:
    try:
        return v.token_to_piece(tok, special=True)
    except Exception as e:
        return f"{type(e).__name__}: {e}"


# --- strings ------------------------------------------------------------------------------------------

WORDS = ("the quick brown fox jumps over lazy dog Hello World hello I'm you're we'll they've it's don't "
         "HTTP JSON camelCase snake_case ALLCAPS Mixed iPhone o'clock re-enter e.g. U.S.A. naïve café "
         "résumé Straße über façade déjà Ωmega παράδειγμα Привет мир").split()  # fmt: skip
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "--", "->", "=>", "!=", "==", "::", "'s", "'S",
                                                      "'ll", "'LL", "'re", "'ve", "'d", "'m", "'t", "…", "—", "–",
                                                      "«»", "“”", "‘’", "¿", "¡", "§", "©", "°", "±", "€", "£", "¥"]  # fmt: skip
WS = [" ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\n\n", "\n\n\n", " \n", "\n ", " \t ", "\r", "\u00a0",
      "\u3000", "\u2009", "\u200b", "\v", "\f", " " * 7]  # fmt: skip
CJK = [
    "中文",
    "汉字",
    "日本語",
    "東京",
    "こんにちは",
    "カタカナ",
    "ｱｲｳ",
    "全角ＡＢＣ１２３",
    "我们",
    "的",
    "人工智能",
]
KOREAN = ["안녕하세요", "한국어", "세계", "ㄱㄴㄷ"]
ARABIC = ["مرحبا", "العربية", "بِسْمِ", "١٢٣٤٥", "سلام"]
HINDI = ["नमस्ते", "हिन्दी", "क्षत्रिय", "१२३"]
THAI = ["สวัสดี", "ภาษาไทย", "๑๒๓"]
OTHER = ["ሰላም", "שלום", "Ελληνικά", "ภ", "ཀ", "ꦲ", "𝓗𝓮𝓵𝓵𝓸", "𝟘𝟙𝟚", "ﬁ", "Ⅻ", "½", "²³", "ǅ", "İ", "ß", "ŉ",
         "\U0001d400", "\U00010000", "\U0010fffd", "\ufeff", "\ufffd", "\u00ad", "\u2028", "\u2029", "\u0085"]  # fmt: skip
EMOJI = [
    "😀",
    "🦙",
    "👍🏽",
    "❤️",
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈",
    "🇺🇸",
    "🇯🇵🇫🇷",
    "🧑🏿‍💻",
    "✨",
    "☃",
    "🙂🙃",
    "1️⃣",
    "#️⃣",
    "🫠",
    "👩‍❤️‍💋‍👨",
]
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0327", "\u20dd", "\u0336", "\u036f", "\u1ab0", "\u0489"]
ACCENTED = ["é", "è", "ü", "ñ", "ç", "Å", "ø", "ő", "ǖ", "ệ", "Ḁ", "ẞ"]
URLS = ["https://example.com/path?q=1&r=two#frag", "http://localhost:8080/", "www.llama.cpp", "user@mail.org",
        "ftp://a.b/c.tar.gz", "C:\\Users\\me\\file.txt", "/usr/local/bin"]  # fmt: skip
CODE = ["def f(x):\n    return x**2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "if __name__ == \"__main__\":\n    main()", "<div class=\"a\">&nbsp;</div>", "SELECT * FROM t WHERE id=1;",
        "x = [1, 2, 3]  # comment", "fn main() -> Result<(), Box<dyn Error>> {}", "    \n\t\t}\n}\n",
        "#include <stdio.h>", "$ echo \"$HOME\" | grep -v '^#'", "a+=1;b-=2;c*=3", "λx.x", "0x1F, 0b1010, 1e-9"]  # fmt: skip


def special_texts(v) -> list[str]:
    """The texts of the vocabulary's special (control / user-defined) tokens and a few normal ones."""
    out = []
    for i in v.special_ids:
        t = v.tokens[i]
        if t:
            out.append(t)
    return out


def vocab_pieces(v, seed: int, k: int = 3000) -> list[str]:
    """Texts of ``k`` random normal tokens of the vocabulary (valid UTF-8 ones), to hit its merges."""
    rng = random.Random(seed + 1)
    out = []
    n = len(v.tokens)
    for _ in range(k):
        t = rng.randrange(n)
        try:
            b = v.token_to_piece(t, special=False)
            s = b.decode("utf-8")
        except Exception:
            continue
        if s:
            out.append(s)
    return out


def gen_strings(
    n: int, seed: int, specials: list[str], reference: list[str], pieces: list[str] = ()
) -> list[str]:
    rng = random.Random(seed)
    pieces = list(pieces) or ["a"]
    sp = specials or ["<s>"]
    sp_common = [s for s in sp if len(s) < 40][:200] or sp

    def digits() -> str:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20)))

    def punct() -> str:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 6)))

    def word() -> str:
        w = rng.choice(WORDS)
        r = rng.random()
        if r < 0.1:
            return w.upper()
        if r < 0.2:
            return w.capitalize()
        return w

    def accented() -> str:
        w = rng.choice(WORDS + ACCENTED)
        return unicodedata.normalize(rng.choice(["NFC", "NFD", "NFKC", "NFKD"]), w + rng.choice(ACCENTED))

    def special() -> str:
        s = rng.choice(sp_common if rng.random() < 0.8 else sp)
        r = rng.random()
        if r < 0.15 and len(s) > 1:
            return s[: rng.randint(1, len(s) - 1)]  # partial
        if r < 0.25 and len(s) > 1:
            return s[rng.randint(1, len(s) - 1) :]
        if r < 0.32:
            return s.upper() if s.upper() != s else s.lower()
        return s

    def control() -> str:
        return chr(rng.choice(list(range(0, 32)) + [127, 0x80, 0x9F]))

    def combining() -> str:
        base = rng.choice(["a", "e", "o", " ", "", "1", "中", "ا", "😀"])
        return base + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 3)))

    def longword() -> str:
        c = rng.choice(["a", "x", "Z", "é", "中", "1", " ", "\n", "😀", "ab", "-", "=", "ก"])
        return c * rng.randint(100 if len(c) > 1 else 300, 700)

    def rand_unicode() -> str:
        out = []
        for _ in range(rng.randint(1, 4)):
            while True:
                cp = rng.choice(
                    [rng.randint(0x20, 0x7FF), rng.randint(0x800, 0xFFFF), rng.randint(0x10000, 0x2FFFF)]
                )
                if not 0xD800 <= cp <= 0xDFFF:
                    break
            out.append(chr(cp))
        return "".join(out)

    gens = [(word, 30), (digits, 8), (punct, 8), (lambda: rng.choice(WS), 18), (lambda: rng.choice(CJK), 4),
            (lambda: rng.choice(KOREAN), 2), (lambda: rng.choice(ARABIC), 2), (lambda: rng.choice(HINDI), 2),
            (lambda: rng.choice(THAI), 2), (lambda: rng.choice(OTHER), 3), (lambda: rng.choice(EMOJI), 4),
            (combining, 3), (accented, 4), (control, 2), (special, 10), (lambda: rng.choice(URLS), 2),
            (lambda: rng.choice(CODE), 2), (rand_unicode, 3), (lambda: rng.choice(pieces), 20)]  # fmt: skip
    fns = [g for g, _ in gens]
    weights = [w for _, w in gens]

    out = list(reference)
    out += sp_common[:50]
    while len(out) < n:
        r = rng.random()
        if r < 0.02:
            s = longword()
            if rng.random() < 0.5:
                s = word() + " " + s + rng.choice([" ", "", "."])
        else:
            k = rng.choice([1, 2, 3, 4, 6, 8, 12, 20])
            parts = [rng.choices(fns, weights)[0]() for _ in range(k)]
            sep = rng.choice(["", " ", ""])
            s = sep.join(parts)
            if rng.random() < 0.15:
                s = rng.choice(WS) + s
            if rng.random() < 0.15:
                s = s + rng.choice(WS)
        out.append(s)
    return out[:n] if n >= len(reference) else out


# --- shrinking ----------------------------------------------------------------------------------------


def ddmin(s: str, bad, budget: int = 1500) -> str:
    """A minimal string (by characters, 1-minimal under the call budget) for which ``bad`` holds."""
    calls = 0
    n = 2
    while len(s) >= 2:
        chunk = max(1, len(s) // n)
        progressed = False
        for i in range(0, len(s), chunk):
            cand = s[:i] + s[i + chunk :]
            calls += 1
            if calls > budget:
                return s
            if cand and bad(cand):
                s = cand
                n = max(n - 1, 2)
                progressed = True
                break
        if not progressed:
            if chunk == 1:
                break
            n = min(len(s), n * 2)
    # then try replacing each remaining character by a plain one (simplifies without losing it)
    for i in range(len(s)):
        for rep in ("a", " "):
            if s[i] == rep:
                continue
            cand = s[:i] + rep + s[i + 1 :]
            calls += 1
            if calls > budget:
                return s
            if bad(cand):
                s = cand
                break
    return s


# --- the run ------------------------------------------------------------------------------------------


def fmt_pieces(ids, piece) -> list:
    if isinstance(ids, str):
        return []
    return [piece(t).decode("utf-8", "backslashreplace") for t in ids]


def _count_case(
    res: dict, counts: dict, key: str, kind: str, minimal: str, want: object, got: object
) -> None:
    """Count a mismatch of ``kind`` under ``key``; the first two of each go into ``res['cases']``."""
    counts[key] = counts.get(key, 0) + 1
    if counts[key] <= 2:
        res["cases"].append({"kind": kind, "flags": key, "min": minimal, "llamacpp": want, "llamapy": got})


def run_vocab(
    cpp: LlamaCpp,
    path: Path,
    n: int,
    seed: int,
    max_shrink: int,
    reference: list[str],
    n_random_ids: int = 2000,
    n_bytes: int = 2000,
    check_pieces: bool = True,
) -> dict:
    from llamapy.vocab import load_vocab

    t0 = time.time()
    v = load_vocab(path)
    cpp.load(path)
    ncpp = cpp.lib.llama_vocab_n_tokens(cpp.vocab)
    res: dict = {"vocab": path.name, "type": v.type.value if hasattr(v.type, "value") else str(v.type),
                 "pre": v.pre, "n_tokens": (len(v.tokens), ncpp), "flags": {}, "detok": {}, "cases": []}  # fmt: skip
    if ncpp != len(v.tokens):
        res["error"] = f"n_tokens differ: llamapy {len(v.tokens)} llama.cpp {ncpp}"
    strings = gen_strings(n, seed, special_texts(v), reference, vocab_pieces(v, seed))
    res["strings"] = len(strings)
    seen_min: set = set()
    shrunk = 0

    for add, parse in FLAGS:
        key = f"add{int(add)}_parse{int(parse)}"
        bad_idx = []
        for i, s in enumerate(strings):
            want = cpp.tokenize(s.encode("utf-8"), add, parse)
            got = py_tokenize(v, s, add, parse)
            if got != want:
                bad_idx.append(i)
                if shrunk < max_shrink:

                    def bad(x: str, add=add, parse=parse) -> bool:
                        return py_tokenize(v, x, add, parse) != cpp.tokenize(x.encode("utf-8"), add, parse)

                    m = ddmin(s, bad)
                    if (m, add, parse) in seen_min:
                        continue
                    seen_min.add((m, add, parse))
                    shrunk += 1
                    w = cpp.tokenize(m.encode("utf-8"), add, parse)
                    g = py_tokenize(v, m, add, parse)
                    res["cases"].append({
                        "kind": "tokenize", "flags": key, "min": repr(m), "orig": repr(s[:300]),
                        "llamacpp": w, "llamapy": g,
                        "llamacpp_pieces": fmt_pieces(w, cpp.piece),
                        "llamapy_pieces": fmt_pieces(g, lambda t: py_piece(v, t) if isinstance(py_piece(v, t), bytes)
                                                     else b"?"),
                    })  # fmt: skip
        res["flags"][key] = len(bad_idx)

    # detokenization of llama.cpp's ids (add_special, parse_special), two ways
    for rs, us in ((False, True), (True, False)):
        key = f"remove{int(rs)}_unparse{int(us)}"
        nbad = 0
        for s in strings:
            ids = cpp.tokenize(s.encode("utf-8"), True, True)
            want = cpp.detokenize(ids, rs, us)
            got = py_detok(v, ids, rs, us)
            if got != want:
                nbad += 1
                if shrunk < max_shrink:

                    def bad(x: str, rs=rs, us=us) -> bool:
                        i2 = cpp.tokenize(x.encode("utf-8"), True, True)
                        return py_detok(v, i2, rs, us) != cpp.detokenize(i2, rs, us)

                    m = ddmin(s, bad, budget=800)
                    if (m, key) in seen_min:
                        continue
                    seen_min.add((m, key))
                    shrunk += 1
                    ids = cpp.tokenize(m.encode("utf-8"), True, True)
                    g = py_detok(v, ids, rs, us)
                    res["cases"].append({
                        "kind": "detokenize", "flags": key, "min": repr(m), "ids": ids,
                        "llamacpp": repr(cpp.detokenize(ids, rs, us)), "llamapy": repr(g),
                        "llamacpp_pieces": fmt_pieces(ids, cpp.piece),
                    })  # fmt: skip
        res["detok"][key] = nbad
    # every token's piece: llama_token_to_piece(special=0/1, lstrip=0/1) vs Vocab.token_to_piece
    res["pieces"] = {}
    for special in (False, True) if check_pieces else ():
        for lstrip in (0, 1):
            key = f"special{int(special)}_lstrip{lstrip}"
            bad = []
            for t in range(min(len(v.tokens), ncpp)):
                want = cpp.piece(t, special, lstrip)
                try:
                    got = v.token_to_piece(t, special=special, lstrip=lstrip)
                except Exception as e:
                    got = f"{type(e).__name__}: {e}"
                if got != want:
                    bad.append((t, repr(want), repr(got)))
            res["pieces"][key] = len(bad)
            for t, w, g in bad[:3]:
                res["cases"].append({"kind": "token_to_piece", "flags": key, "min": f"token {t}",
                                     "llamacpp": w, "llamapy": g})  # fmt: skip

    # detokenization of random id sequences (specials, byte tokens, BOS/EOS at the ends included)
    rng = random.Random(seed + 2)
    specials = list(v.special_ids) or [0]
    ends = [t for t in (v.bos, v.eos) if t is not None and t >= 0]
    nbad = {}
    for _ in range(n_random_ids):
        ids = [
            rng.randrange(ncpp) if rng.random() < 0.8 else rng.choice(specials)
            for _ in range(rng.randint(1, 12))
        ]
        if ends and rng.random() < 0.5:
            ids = [rng.choice(ends)] + ids
        if ends and rng.random() < 0.3:
            ids = ids + [rng.choice(ends)]
        for rs in (False, True):
            for us in (False, True):
                key = f"remove{int(rs)}_unparse{int(us)}"
                want = cpp.detokenize(ids, rs, us)
                got = py_detok(v, ids, rs, us)
                if got != want:
                    _count_case(res, nbad, key, "detokenize_ids", f"ids {ids}", repr(want), repr(got))
    res["detok_random_ids"] = {"n": n_random_ids, **nbad}

    # invalid UTF-8 that llama.cpp survives (lone continuation bytes, cut multi-byte sequences; a 4-byte
    # sequence above U+10FFFF makes llama.cpp abort: 'invalid codepoint')
    bad_bytes = {}
    for _ in range(n_bytes):
        parts = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            if r < 0.25:
                parts.append(bytes([rng.randint(0x80, 0xBF)]) * rng.randint(1, 3))
            elif r < 0.45:
                c = rng.choice(["中", "é", "😀", "ก", "👍🏽"]).encode()
                parts.append(c[: rng.randint(1, len(c) - 1)])
            else:
                parts.append(rng.choice(strings).encode()[:40])
        data = b"".join(parts)
        for add, parse in FLAGS:
            key = f"add{int(add)}_parse{int(parse)}"
            want = cpp.tokenize(data, add, parse)
            got = py_tokenize(v, data, add, parse)
            if got != want:
                _count_case(res, bad_bytes, key, "tokenize_bytes", repr(data), want, got)
    res["bytes"] = {"n": n_bytes, **bad_bytes}
    res["seconds"] = round(time.time() - t0, 1)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=Path, default=llamacpp_bin("avx2"))
    ap.add_argument("--dir", type=Path, default=SHARED / "vocab")
    ap.add_argument("--vocab", nargs="*", help="substrings of the file names to run (default: all)")
    ap.add_argument("--n", type=int, default=2000, help="strings per vocabulary")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-ids", type=int, default=2000, help="random id sequences detokenized per vocabulary")
    ap.add_argument("--no-pieces", action="store_true", help="skip the every-token token_to_piece check")
    ap.add_argument("--n-bytes", type=int, default=2000, help="invalid UTF-8 inputs per vocabulary")
    ap.add_argument("--max-shrink", type=int, default=12, help="mismatches shrunk per vocabulary")
    ap.add_argument("--out", type=Path, default=Path("/tmp/tokfuzz/results.json"))
    a = ap.parse_args()

    ref_path = SHARED / "reference" / "strings.json"
    reference = json.loads(ref_path.read_text()) if ref_path.exists() else []
    cpp = LlamaCpp(a.lib)
    paths = sorted(a.dir.glob("ggml-vocab-*.gguf"))
    if a.vocab:
        paths = [p for p in paths if any(s in p.name for s in a.vocab)]
    results = []
    a.out.parent.mkdir(parents=True, exist_ok=True)
    for p in paths:
        try:
            r = run_vocab(cpp, p, a.n, a.seed, a.max_shrink, reference, a.n_ids, a.n_bytes, not a.no_pieces)
        except Exception as e:
            r = {"vocab": p.name, "error": f"{type(e).__name__}: {e}"}
        results.append(r)
        flags = " ".join(f"{k}={n}" for k, n in r.get("flags", {}).items())
        detok = " ".join(f"{k}={n}" for k, n in r.get("detok", {}).items())
        extra = " | pieces " + " ".join(f"{k}={n}" for k, n in r.get("pieces", {}).items())
        extra += f" | detok random ids {r.get('detok_random_ids')} | invalid utf-8 {r.get('bytes')}"
        print(f"{p.name:36s} n={r.get('strings', 0)} {flags} | detok {detok}{extra} ({r.get('seconds', '?')}s)"
              f"{'  ERROR ' + r['error'] if 'error' in r else ''}", flush=True)  # fmt: skip
        for c in r.get("cases", []):
            print(f"    [{c['kind']} {c['flags']}] {c['min']}", flush=True)
            print(f"        llama.cpp {c['llamacpp']}  {c.get('llamacpp_pieces', '')}", flush=True)
            print(f"        llamapy   {c['llamapy']}  {c.get('llamapy_pieces', '')}", flush=True)
        a.out.write_text(json.dumps(results, ensure_ascii=False, indent=1))
    print(f"details: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
