"""Which llama.cpp command-line flags does the matching ``llamapy`` command reject or parse differently?

A diagnostic, not a test: it reads every option of llama.cpp's sources (``common/arg.cpp``, filtered by
each tool's ``LLAMA_EXAMPLE_*`` as ``common_params_parser_init`` does, plus the hand-written parsers of
llama-bench, llama-quantize and llama-gguf-split) and looks each of its spellings up in the argparse parser
of the ``llamapy`` command (``llamapy.cli.build_parser``, no ``--help`` scraping). A spelling is
``ok`` (known, takes a value exactly when llama.cpp's does), ``arity`` (known, but one of them takes a value
and the other does not) or ``missing``. For ``llama-server`` it also lists the ``LLAMA_ARG_*`` environment
variables and whether ``llamapy serve`` reads them (a variable is read when the flag it stands for is
accepted: ``llamapy.cli.env``).

    python benchmarks/cli_vs_llamacpp.py [--src ~/.cache/llamapy/llamacpp/0.3.36] [--tool llama-server ...]
        [--missing] [--out /tmp/cliflags/results.json]

Exit status 0 whether or not flags are missing (it is a report); the JSON has every flag.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

from benchmarks.harness import CACHE, LLAMACPP_VERSION  # noqa: E402

# llama.cpp tool -> (its LLAMA_EXAMPLE_* of arg.cpp, or its own parser's source; the llamapy command(s))
TOOLS: dict[str, tuple[str, list[str]]] = {
    "llama-completion": ("COMPLETION", ["run"]),
    "llama-cli": ("CLI", ["chat"]),
    "llama-server": ("SERVER", ["serve"]),
    "llama-perplexity": ("PERPLEXITY", ["perplexity"]),
    "llama-embedding": ("EMBEDDING", ["embed"]),
    "llama-tokenize": ("TOKENIZE", ["tokenize"]),
    "llama-imatrix": ("IMATRIX", ["imatrix"]),
    "llama-bench": ("tools/llama-bench/llama-bench.cpp", ["bench"]),
    "llama-quantize": ("tools/quantize/quantize.cpp", ["quantize"]),
    "llama-gguf-split": ("tools/gguf-split/gguf-split.cpp", ["gguf split", "gguf merge"]),
}


@dataclass
class Flag:
    names: list[str]  # every spelling, the negated ones (--no-x) included
    value: bool  # takes a value
    env: str | None = None
    neg: list[str] = field(default_factory=list)


# --- llama.cpp ------------------------------------------------------------------------------------------


def _strings(s: str) -> list[str]:
    return re.findall(r'"((?:[^"\\]|\\.)*)"', s)


def _braced(text: str, i: int) -> tuple[str, int]:
    """The text inside the ``{...}`` that opens at ``text[i]``, and the index after its ``}``."""
    assert text[i] == "{"
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j], j + 1
    raise ValueError("unbalanced braces")


def arg_cpp_flags(src: Path, example: str) -> list[Flag]:
    """The options of ``common/arg.cpp`` that ``LLAMA_EXAMPLE_<example>`` takes (COMMON ones inherited,
    ``set_excludes`` honoured)."""
    text = (src / "common/arg.cpp").read_text()
    named = {
        m.group(1): m.group(2)
        for m in re.finditer(r"initializer_list<enum llama_example> (\w+) = \{([^}]*)\}", text)
    }
    text = re.sub(
        r"\.set_(examples|excludes)\((\w+)\)", lambda m: f".set_{m.group(1)}({{{named[m.group(2)]}}})", text
    )
    text = re.sub(r"(?m)^\s*//[^\n]*", "", text)  # (a line comment; "http://" in strings stays)
    starts = [m.end() for m in re.finditer(r"add_opt\(common_arg\(\s*", text)]
    out = []
    for k, i in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else text.index("\n}\n", i)
        block = text[i:end]
        args, j = _braced(block, 0)
        rest = block[j:].lstrip(", \n")
        neg: list[str] = []
        if rest.startswith("{"):
            inner, _ = _braced(rest, 0)
            neg = _strings(inner)
        lam = re.search(r"\[[^\]]*\]\s*\((\s*common_params[^)]*)\)", block)
        params = lam.group(1) if lam else ""
        value = params.count(",") >= 1 and "bool" not in params
        m = re.search(r"\.set_examples\(\{([^}]*)\}\)", block)
        examples = set(re.findall(r"LLAMA_EXAMPLE_(\w+)", m.group(1))) if m else {"COMMON"}
        m = re.search(r"\.set_excludes\(\{([^}]*)\}\)", block)
        excludes = set(re.findall(r"LLAMA_EXAMPLE_(\w+)", m.group(1))) if m else set()
        if ".set_preset_only()" in block or example in excludes:
            continue
        if example not in examples and "COMMON" not in examples:
            continue
        m = re.search(r'\.set_env\("(\w+)"\)', block)
        names = _strings(args)
        out.append(Flag(names + neg, value, m.group(1) if m else None, neg))
    return out


def own_parser_flags(path: Path) -> list[Flag]:
    """The options of a hand-written ``argv`` loop: each ``arg == "-x"`` / ``strcmp(argv[i], "-x")`` branch,
    taking a value when its body reads the next argument."""
    text = path.read_text()
    pat = re.compile(r'(?:if|else if) \(((?:[^()]|\([^()]*\))*?(?:arg == "|strcmp\(argv\[\w+\], ")[^{]*)\{')
    ms = list(pat.finditer(text))
    out = []
    for k, m in enumerate(ms):
        names = [n for n in _strings(m.group(1)) if n.startswith("-")]
        if not names:
            continue
        body = text[m.end() : ms[k + 1].start() if k + 1 < len(ms) else m.end() + 800]
        value = bool(re.search(r"\+\+(i|arg_idx)\b|argv\[\+\+", body))
        if any(n in ("-h", "--help", "--version") for n in names):
            value = False
        out.append(Flag(names, value))
    return out


def llamacpp_flags(src: Path, tool: str) -> list[Flag]:
    where = TOOLS[tool][0]
    return own_parser_flags(src / where) if "/" in where else arg_cpp_flags(src, where)


# --- llamapy --------------------------------------------------------------------------------------------


def llamapy_options(command: str) -> dict[str, bool]:
    """Option string -> takes a value, of ``llamapy COMMAND`` (``"gguf split"``: a sub-subcommand)."""
    from llamapy.cli import build_parser

    words = command.split()
    p = build_parser(words[0])
    for w in words:
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        p = sub.choices[w]
    return {o: a.nargs != 0 for a in p._actions for o in a.option_strings}


def compare(src: Path, tool: str) -> dict:
    opts: dict[str, bool] = {}
    for c in TOOLS[tool][1]:
        opts.update(llamapy_options(c))
    rows = []
    for f in llamacpp_flags(src, tool):
        for n in f.names:
            value = f.value and n not in f.neg
            status = "missing" if n not in opts else ("ok" if opts[n] == value else "arity")
            rows.append({"flag": n, "value": value, "env": f.env, "status": status, "spellings": f.names})
    envs = []
    if tool == "llama-server":
        try:
            from llamapy.cli.env import env_flags
        except ImportError:  # (a llamapy from before llamapy.cli.env)
            read: set[str] = set()
        else:
            read = env_flags(TOOLS[tool][1][0])
        for f in llamacpp_flags(src, tool):
            if f.env:
                envs.append({"env": f.env, "flags": f.names, "read": f.env in read})
    return {"tool": tool, "llamapy": TOOLS[tool][1], "flags": rows, "env": envs}


def _summary(r: dict) -> str:
    by_opt: dict[str, list[dict]] = {}
    for row in r["flags"]:
        by_opt.setdefault(" ".join(row["spellings"]), []).append(row)
    n_opt = len(by_opt)
    n_ok = sum(any(x["status"] == "ok" for x in rows) for rows in by_opt.values())
    n_all = sum(all(x["status"] == "ok" for x in rows) for rows in by_opt.values())
    line = (f"{r['tool']:18s} -> llamapy {', '.join(r['llamapy']):20s} {n_opt:3d} options, "
            f"{n_ok:3d} accepted in some spelling, {n_all:3d} in every spelling")  # fmt: skip
    if r["env"]:
        line += f"; env {sum(e['read'] for e in r['env'])}/{len(r['env'])} read"
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=CACHE / "llamacpp" / LLAMACPP_VERSION)
    ap.add_argument("--tool", action="append", choices=list(TOOLS), help="only these tools (repeatable)")
    ap.add_argument(
        "--missing", action="store_true", help="list each tool's missing and arity-mismatched flags"
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/cliflags/results.json"))
    a = ap.parse_args()
    results = [compare(a.src, t) for t in a.tool or TOOLS]
    for r in results:
        print(_summary(r))
        if a.missing:
            seen = set()
            for row in r["flags"]:
                key = " ".join(row["spellings"])
                bad = [x for x in r["flags"] if " ".join(x["spellings"]) == key and x["status"] != "ok"]
                if bad and key not in seen:
                    seen.add(key)
                    print(f"    {key:50s} {'VALUE' if row['value'] else '     '} "
                          + ", ".join(f"{x['flag']}: {x['status']}" for x in bad))  # fmt: skip
            for e in r["env"]:
                if not e["read"]:
                    print(f"    env {e['env']} ({' '.join(e['flags'])}) not read")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=1))
    print(f"details: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
