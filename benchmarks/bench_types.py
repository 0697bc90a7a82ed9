"""Token generation on every quantization type: ``llamapy bench`` side by side with ``llama-bench``.

    python -m benchmarks.bench_types [--shapes smollm2-135m,qwen2.5-0.5b] [--types Q4_0,Q4_K,...]
        [--quick] [--n-gen 64] [--n-prompt 128] [--reps 2] [--rounds 1] [--threads 2]
        [--profile Q2_K,...] [--out F] [--write-only]

1. Writes (our GGUF writer, our quantizer) one random-weight file per (shape, type) into
   ~/.cache/llamapy/bench/types/ (reused while ``FILE_VERSION`` matches). Shapes (``SHAPES``):
   SmolLM2-135M's (llama: 30 layers, 576 hidden, 1536 FFN, 9/3 heads, vocabulary 49152, tied) and
   Qwen2.5-0.5B's (qwen2: 24 layers, 896 hidden, 4864 FFN, 14/2 heads, vocabulary 151936, tied, q/k/v
   bias); ``qwen3-0.6b`` (1024 hidden, 3072 FFN: every row a multiple of 256) only on request.
   Every matrix, the tied token embedding / output included, is of the file's type (like
   ``llama-quantize --pure``), except where llama.cpp cannot store it: a k-quant needs rows that are a
   multiple of 256, and neither 576 nor 896 is, so in those two shapes only ``ffn_down`` (1536 / 4864
   columns) is of the k-quant and every other matrix takes llama.cpp's fallback type
   (``llama_tensor_get_type``: Q2_K, Q3_K -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), as real
   k-quant files of these models have. Norms and biases F32. Vocabulary: the real SmolLM2 file's
   tokenizer (``~/.cache/llamapy/models``) for the llama shape; ``../shared/vocab/ggml-vocab-qwen2.gguf``
   (151936 tokens) for the Qwen shapes; padded with ``[PAD<i>]`` if shorter. Each matrix is one
   quantized 64-row tile repeated (quantizing hundreds of MB is slow; the same data in every layer),
   stored in full so the memory traffic is a real file's. Random weights: the numbers say nothing about text, only about speed.
2. For each file, tools interleaved (the order alternates from file to file and round to round):
   ``llama-bench -m F -p 128 -n 64 -t 2 -r 2 -o json`` and ``python -m llamapy bench`` with the same flags:
   one process per tool per file runs pp128 then tg64, each a warm-up plus ``-r`` repetitions.
3. Writes a Markdown report (default ``benchmarks/results/types.md``, keeping its hand-written
   ``## Notes`` section): machine line (lscpu model, SIMD flags), per shape a table of type, tensor types,
   size, pp and tg t/s of both tools and their ratios, whether llamapy has a decode mat-vec kernel for each
   tensor type (``MATVEC`` of ``llamapy/ggml/cpu/matmul_kernels.py``; the others go through dequantized
   tiles), and the load average before each row. ``--profile T,...`` appends llamapy's decode profile
   (``llamapy bench -p 0 -n 16 --profile``; ``-n 4`` for types without a mat-vec kernel) of those types'
   files in the last shape.

``--quick``: three types (Q4_0, Q4_K, Q2_K), ``-p 32 -n 16 -r 1``, report to /tmp/types-quick.md unless
``--out`` is given. A full run (2 shapes x 12 types, the defaults) is sized to take about 8 minutes on an
idle 2-core machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_qwen35 import _kept_notes, _load, _q, _run
from benchmarks.harness import llamacpp_bin, machine_line
from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType
from llamapy.gguf.reader import GGUFReader
from llamapy.gguf.writer import GGUFWriter

ROOT = Path(__file__).resolve().parents[1]
LLAMA_BENCH = llamacpp_bin() / "llama-bench"
BENCH_DIR = Path.home() / ".cache/llamapy/bench/types"
RESULTS = ROOT / "benchmarks" / "results" / "types.md"
SMOLLM2_FILE = Path.home() / ".cache/llamapy/models/SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN2_VOCAB = ROOT.parent / "shared" / "vocab" / "ggml-vocab-qwen2.gguf"
FILE_VERSION = "1"  # bump when the written files change, so that stale cached files are rewritten

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        arch="llama", vocab=SMOLLM2_FILE, n_vocab=49152, n_embd=576, n_layer=30, n_ff=1536, n_head=9,
        n_head_kv=3, head_dim=64, rope_base=100000.0, rms_eps=1e-5, n_ctx_train=8192, qkv_bias=False,
        qk_norm=False,
    ),
    "qwen2.5-0.5b": dict(
        arch="qwen2", vocab=QWEN2_VOCAB, n_vocab=151936, n_embd=896, n_layer=24, n_ff=4864, n_head=14,
        n_head_kv=2, head_dim=64, rope_base=1000000.0, rms_eps=1e-6, n_ctx_train=32768, qkv_bias=True,
        qk_norm=False,
    ),
    "qwen3-0.6b": dict(
        arch="qwen3", vocab=QWEN2_VOCAB, n_vocab=151936, n_embd=1024, n_layer=28, n_ff=3072, n_head=16,
        n_head_kv=8, head_dim=128, rope_base=1000000.0, rms_eps=1e-6, n_ctx_train=40960, qkv_bias=False,
        qk_norm=True,
    ),
}  # fmt: skip
DEFAULT_SHAPES = ("smollm2-135m", "qwen2.5-0.5b")

T = GGMLType
ALL_TYPES = (
    T.Q4_0,
    T.Q4_1,
    T.Q5_0,
    T.Q5_1,
    T.Q8_0,
    T.Q2_K,
    T.Q3_K,
    T.Q4_K,
    T.Q5_K,
    T.Q6_K,
    T.IQ4_NL,
    T.MXFP4,
)
QUICK_TYPES = (T.Q4_0, T.Q4_K, T.Q2_K)
# llama_ftype of a file whose matrices are all of the type (the _S mixes for the k-quants; MXFP4_MOE)
FILE_TYPES = {
    T.Q4_0: 2, T.Q4_1: 3, T.Q8_0: 7, T.Q5_0: 8, T.Q5_1: 9, T.Q2_K: 10, T.Q3_K: 11, T.Q4_K: 14,
    T.Q5_K: 16, T.Q6_K: 18, T.IQ4_NL: 25, T.MXFP4: 38,
}  # fmt: skip
QK_K = 256
# llama.cpp's llama_tensor_get_type when a k-quant's rows are not a multiple of QK_K
KQUANT_FALLBACK = {T.Q2_K: T.IQ4_NL, T.Q3_K: T.IQ4_NL, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}


def tensor_type(t: GGMLType, n_cols: int) -> GGMLType:
    """The type a matrix of ``n_cols`` columns gets in a file of type ``t`` (llama.cpp's fallback)."""
    if t in KQUANT_FALLBACK and n_cols % QK_K:
        return KQUANT_FALLBACK[t]
    return t


def _vocab_keys(src: Path, n_vocab: int) -> dict[str, tuple[Any, GGUFValueType | None]]:
    """``tokenizer.*`` of ``src``, tokens padded to ``n_vocab`` with ``[PAD<i>]`` (type UNUSED)."""
    if not src.exists():
        raise FileNotFoundError(f"{src}: the vocabulary for this shape is needed")
    r = GGUFReader(src)
    toks = list(r.get("tokenizer.ggml.tokens"))
    types = [int(x) for x in r.get("tokenizer.ggml.token_type")]
    if len(toks) > n_vocab:
        raise ValueError(f"{src}: {len(toks)} tokens, more than vocab_size {n_vocab}")
    toks += [f"[PAD{i}]" for i in range(len(toks), n_vocab)]
    types += [5] * (n_vocab - len(types))
    out: dict[str, tuple[Any, GGUFValueType | None]] = {
        "tokenizer.ggml.tokens": (toks, None),
        "tokenizer.ggml.token_type": (np.asarray(types, dtype=np.int32), None),
    }
    for k in r.fields:
        if k.startswith("tokenizer.") and k not in out:
            v = r.get(k)
            if isinstance(v, (bool, np.bool_)):
                out[k] = (bool(v), GGUFValueType.BOOL)
            elif isinstance(v, (int, np.integer)):
                out[k] = (int(v), GGUFValueType.UINT32)
            else:
                out[k] = (v, None)
    return out


def _matrices(s: dict[str, Any]) -> list[tuple[str, tuple[int, int]]]:
    """(name, (rows, cols)) of every matrix of the shape, in file order."""
    n_embd, n_ff, hd = s["n_embd"], s["n_ff"], s["head_dim"]
    out = [("token_embd.weight", (s["n_vocab"], n_embd))]  # tied: also the output
    for il in range(s["n_layer"]):
        b = f"blk.{il}."
        out += [
            (b + "attn_q.weight", (s["n_head"] * hd, n_embd)),
            (b + "attn_k.weight", (s["n_head_kv"] * hd, n_embd)),
            (b + "attn_v.weight", (s["n_head_kv"] * hd, n_embd)),
            (b + "attn_output.weight", (n_embd, s["n_head"] * hd)),
            (b + "ffn_gate.weight", (n_ff, n_embd)),
            (b + "ffn_up.weight", (n_ff, n_embd)),
            (b + "ffn_down.weight", (n_embd, n_ff)),
        ]
    return out


def mix(shape: str, t: GGMLType) -> str:
    """The tensor types of the (shape, t) file in words, e.g. ``Q4_K: ffn_down; Q5_0: the rest``."""
    by: dict[GGMLType, set[str]] = {}
    for name, (_, k) in _matrices(SHAPES[shape]):
        by.setdefault(tensor_type(t, k), set()).add(
            name.rsplit(".", 2)[-2] if "blk." in name else "token_embd"
        )
    if len(by) == 1:
        return next(iter(by)).name
    main = max(by, key=lambda x: len(by[x]))
    return "; ".join(f"{x.name}: {', '.join(sorted(v))}" for x, v in by.items() if x != main) + (
        f"; {main.name}: the rest"
    )


def write_model(path: Path, shape: str, t: GGMLType, seed: int = 0) -> Path:
    """The random-weight file of ``shape`` and type ``t`` (see the module docstring)."""
    s = SHAPES[shape]
    arch = s["arch"]
    rng = np.random.default_rng(seed)
    n_embd, hd = s["n_embd"], s["head_dim"]
    tmp = path.with_suffix(".tmp")
    w = GGUFWriter(tmp, arch=arch)
    md: dict[str, Any] = {
        "general.name": f"bench-types-{shape}-v{FILE_VERSION}",
        "general.file_type": FILE_TYPES[t],
        f"{arch}.vocab_size": s["n_vocab"],
        f"{arch}.context_length": s["n_ctx_train"],
        f"{arch}.embedding_length": n_embd,
        f"{arch}.block_count": s["n_layer"],
        f"{arch}.feed_forward_length": s["n_ff"],
        f"{arch}.attention.head_count": s["n_head"],
        f"{arch}.attention.head_count_kv": s["n_head_kv"],
        f"{arch}.attention.key_length": hd,
        f"{arch}.attention.value_length": hd,
        f"{arch}.attention.layer_norm_rms_epsilon": s["rms_eps"],
        f"{arch}.rope.freq_base": s["rope_base"],
        f"{arch}.rope.dimension_count": hd,
    }
    for k, v in md.items():
        vt = {float: GGUFValueType.FLOAT32, int: GGUFValueType.UINT32}.get(type(v))
        w.add_key_value(k, v, vt)
    for k, (v, vt) in _vocab_keys(s["vocab"], s["n_vocab"]).items():
        w.add_key_value(k, v, vt)

    def f32(name: str, n: int, scale: float = 0.02, base: float = 0.0) -> None:
        w.add_tensor(name, (base + rng.standard_normal(n) * scale).astype(np.float32))

    tiles: dict[tuple[GGMLType, tuple[int, int]], np.ndarray] = {}  # one tile per (type, shape): fast

    def mat(name: str, shp: tuple[int, int]) -> None:
        tt = tensor_type(t, shp[1])
        if (tt, shp) not in tiles:
            tiles[tt, shp] = _q(rng, shp, tt, 1.0 / np.sqrt(shp[1]))
        w.add_tensor(name, tiles[tt, shp], ggml_type=tt, raw_shape=shp)

    mats = dict(_matrices(s))
    mat("token_embd.weight", mats["token_embd.weight"])
    f32("output_norm.weight", n_embd, base=1.0)
    for il in range(s["n_layer"]):
        b = f"blk.{il}."
        f32(b + "attn_norm.weight", n_embd, base=1.0)
        for name in ("attn_q", "attn_k", "attn_v"):
            mat(b + name + ".weight", mats[b + name + ".weight"])
            if s["qkv_bias"]:
                f32(b + name + ".bias", mats[b + name + ".weight"][0])
        if s["qk_norm"]:
            f32(b + "attn_q_norm.weight", hd, base=1.0)
            f32(b + "attn_k_norm.weight", hd, base=1.0)
        mat(b + "attn_output.weight", mats[b + "attn_output.weight"])
        f32(b + "ffn_norm.weight", n_embd, base=1.0)
        for name in ("ffn_gate", "ffn_up", "ffn_down"):
            mat(b + name + ".weight", mats[b + name + ".weight"])
    w.write()
    w.close()
    os.replace(tmp, path)
    return path


def model_path(shape: str, t: GGMLType) -> Path:
    return BENCH_DIR / f"{shape}.{t.name}.gguf"


def ensure_model(shape: str, t: GGMLType) -> Path:
    """The cached file of (shape, t), written if missing or from another version of this script."""
    path = model_path(shape, t)
    if path.exists():
        try:
            if GGUFReader(path).get("general.name") == f"bench-types-{shape}-v{FILE_VERSION}":
                return path
        except Exception:  # a truncated or foreign file: write it again
            pass
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(f"writing {path} ...", file=sys.stderr, flush=True)
    write_model(path, shape, t)
    print(f"  {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return path


# -- running the two tools -----------------------------------------------------------------------


def _cmd(tool: str, path: Path, n_prompt: int, n_gen: int, threads: int, reps: int) -> list[str]:
    flags = ["-m", str(path), "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads), "-r", str(reps)]
    if tool == "llama.cpp":
        return [str(LLAMA_BENCH), *flags, "-o", "json"]
    return [sys.executable, "-m", "llamapy", "bench", *flags, "-o", "json"]


def run_all(
    shapes: list[str],
    types: list[GGMLType],
    args: argparse.Namespace,
    paths: dict[tuple[str, GGMLType], Path],
) -> dict[tuple[str, str], dict[str, Any]]:
    """{(shape, type): {"load": [...], "log": [...], (tool, test): [avg t/s per round], tool: record}}."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    mv = _matvec_types() or set()
    k = 0
    for rnd in range(args.rounds):
        for shape in shapes:
            for t in types:
                path = paths[shape, t]
                row = out.setdefault((shape, t.name), {"load": [], "log": [], "path": path})
                n_gen, reps = args.n_gen, args.reps
                if args.slow_n_gen and _types_of(shape, t) - mv:  # dequantized tiles: seconds per token
                    n_gen, reps = min(n_gen, args.slow_n_gen), 1
                row["tg_n"] = n_gen
                tools = ("llama.cpp", "llamapy") if k % 2 == 0 else ("llamapy", "llama.cpp")
                k += 1
                row["load"].append(_load())
                for tool in tools:
                    cmd = _cmd(tool, path, args.n_prompt, n_gen, args.threads, reps)
                    try:
                        recs, dt = _run(cmd)
                    except RuntimeError as e:  # one failing file must not lose the others' numbers
                        row["log"].append(f"{tool} FAILED: {str(e).strip().splitlines()[-1][:200]}")
                        print(f"{shape} {t.name} {tool}: {e}", file=sys.stderr, flush=True)
                        continue
                    row["log"].append(f"{tool} {dt:.0f} s (load after {_load()})")
                    print(f"round {rnd + 1} {shape} {t.name} {row['log'][-1]}", file=sys.stderr, flush=True)
                    for r in recs:
                        test = "pp" if r["n_prompt"] else "tg"
                        row.setdefault((tool, test), []).append(float(r["avg_ts"]))
                        row.setdefault(tool, r)
    return out


def _types_of(shape: str, t: GGMLType) -> set[str]:
    """Names of the matrix types in the (shape, t) file."""
    return {tensor_type(t, k).name for _, (_, k) in _matrices(SHAPES[shape])}


def _matvec_types() -> set[str] | None:
    """Tensor types with a llamapy decode mat-vec kernel (None: the table could not be read)."""
    try:
        from llamapy.ggml.cpu.matmul_kernels import MATVEC
    except Exception:
        return None
    return set(MATVEC)


def _fmt(vals: list[float] | None) -> str:
    if not vals:
        return "–"
    m = statistics.mean(vals)
    return f"{m:.1f}" + (f" ({min(vals):.1f}–{max(vals):.1f})" if len(vals) > 1 else "")


def _ratio(a: list[float] | None, b: list[float] | None) -> str:
    return f"{statistics.mean(b) / statistics.mean(a):.2f}" if a and b else "–"


def report(
    res: dict[tuple[str, str], dict[str, Any]],
    shapes: list[str],
    types: list[GGMLType],
    args: argparse.Namespace,
    profiles: str,
) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    first = next((r for r in res.values() if "llama.cpp" in r), {})
    lc = first.get("llama.cpp", {})
    mv = _matvec_types()
    pp, tg = f"pp{args.n_prompt}", f"tg{args.n_gen}"
    lines = [
        "# Every quantization type: llamapy vs llama.cpp (CPU, token generation)",
        "",
        f"Written by `python -m benchmarks.bench_types {shlex.join(args.argv)}` on {when}."
        + (" **QUICK CHECK of the script: not a measurement.**" if args.quick else ""),
        "",
        f"- machine: {machine_line()}",
        f"- llama.cpp: `{LLAMA_BENCH}` (build {lc.get('build_commit', '?')} / {lc.get('build_number', '?')}, "
        f"{lc.get('backends', '?')})",
        f"- per file, one process per tool (order alternating file to file): "
        f"`{shlex.join(_cmd('llama.cpp', Path('F'), args.n_prompt, args.n_gen, args.threads, args.reps))}` "
        f"and `python -m llamapy bench` with the same flags; each test is a warm-up plus {args.reps} "
        f"repetition(s); {args.rounds} round(s), a cell is the mean of the rounds (min–max across rounds)",
        "- files: random weights of the model's shape written by `benchmarks/bench_types.py` (our writer and "
        "quantizer), every matrix of the file's type incl. the tied token embedding / output "
        "(`--pure`-style), except where a k-quant does not fit the rows (576 and 896 are not multiples of "
        "256): those matrices take llama.cpp's fallback type (Q2_K, Q3_K -> IQ4_NL, Q4_K -> Q5_0, "
        "Q5_K -> Q5_1, Q6_K -> Q8_0); column `tensors` says what each file holds",
        "- `mat-vec`: whether llamapy has a decode mat-vec kernel (`MATVEC` in "
        "`llamapy/ggml/cpu/matmul_kernels.py`) for each tensor type of the file; `no` types go through "
        f"dequantized tiles, and their files run tg{args.slow_n_gen} -r 1 (both tools) to keep the run short"
        + ("" if mv is not None else " (**could not import the table**)"),
        "",
    ]
    for shape in shapes:
        s = SHAPES[shape]
        lines += [
            f"## {shape} ({s['arch']}: {s['n_layer']} layers, {s['n_embd']} hidden, {s['n_ff']} FFN, "
            f"{s['n_head']}/{s['n_head_kv']} heads, vocabulary {s['n_vocab']} tied"
            + (", q/k/v bias" if s["qkv_bias"] else "")
            + (", q/k norm" if s["qk_norm"] else "")
            + ")",
            "",
            f"| type | tensors | MiB | mat-vec | llama.cpp {tg} | llamapy {tg} | **{tg} ratio** "
            + (f"| llama.cpp {pp} | llamapy {pp} | {pp} ratio " if args.n_prompt else "")
            + "| load before |",
            "| --- | --- | ---: | --- | ---: | ---: | ---: | "
            + ("---: | ---: | ---: | " if args.n_prompt else "")
            + "--- |",
        ]
        for t in types:
            row = res.get((shape, t.name))
            if row is None:
                continue
            tts = _types_of(shape, t)
            kern = "?" if mv is None else ", ".join(f"{x} {'yes' if x in mv else 'no'}" for x in sorted(tts))
            size = row["path"].stat().st_size / 2**20
            tgn = f" (tg{row['tg_n']}, -r 1)" if row["tg_n"] != args.n_gen else ""
            a, b = row.get(("llama.cpp", "tg")), row.get(("llamapy", "tg"))
            line = f"| {t.name} | {mix(shape, t)} | {size:.0f} | {kern} | {_fmt(a)}{tgn} | {_fmt(b)}{tgn} "
            line += f"| **{_ratio(a, b)}** "
            if args.n_prompt:
                a, b = row.get(("llama.cpp", "pp")), row.get(("llamapy", "pp"))
                line += f"| {_fmt(a)} | {_fmt(b)} | {_ratio(a, b)} "
            lines.append(line + f"| {' / '.join(row['load'])} |")
        lines.append("")
    lines += ["## Runs", ""]
    for (shape, tn), row in res.items():
        lines.append(f"- {shape} {tn}: " + "; ".join(row["log"]))
    lines.append("")
    if profiles:
        lines += ["## Where a llamapy decode token goes (cProfile, by own time)", "", "```", profiles.strip()]
        lines += ["```", ""]
    return "\n".join(lines)


def profile(shape: str, t: GGMLType, threads: int, n_gen: int = 16, top: int = 18) -> str:
    """``llamapy bench -p 0 -n <n_gen> --profile`` of the (shape, t) file: the first ``top`` rows."""
    path = ensure_model(shape, t)
    cmd = [sys.executable, "-m", "llamapy", "bench", "-m", str(path), "-p", "0", "-n", str(n_gen),
           "-t", str(threads), "-r", "1", "--profile"]  # fmt: skip
    import subprocess

    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        return f"$ {shlex.join(cmd[1:])}\nFAILED ({p.returncode}): {p.stderr[-1500:]}"
    keep = [x for x in p.stderr.strip().splitlines() if x.strip()][: top + 6]
    return f"$ python {shlex.join(cmd[1:])}\n" + "\n".join(keep) + "\n"


def _types(s: str, ap: argparse.ArgumentParser) -> list[GGMLType]:
    out = []
    for n in s.split(","):
        try:
            t = GGMLType[n.strip().upper()]
        except KeyError:
            ap.error(f"unknown type {n.strip()!r}")
        if t not in FILE_TYPES:
            ap.error(f"type {t.name}: only {', '.join(x.name for x in ALL_TYPES)}")
        out.append(t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--shapes", default=None, help=f"comma list of {', '.join(SHAPES)} (default: the first two)"
    )
    ap.add_argument("--types", default=None, help="comma list (default all twelve; --quick: Q4_0,Q4_K,Q2_K)")
    ap.add_argument("--quick", action="store_true", help="three types, few tokens: checks the script works")
    ap.add_argument("--n-gen", type=int, default=None, help="tg tokens (default 64; --quick: 16)")
    ap.add_argument("--n-prompt", type=int, default=None, help="pp tokens (default 128; --quick 32; 0: none)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per test (default 2; --quick: 1)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over all files (default 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--slow-n-gen",
        type=int,
        default=4,
        help="tg tokens (with -r 1) for files with a type that has no llamapy mat-vec kernel (default 4; "
        "0: as the others)",
    )
    ap.add_argument("--profile", default="", help="comma list of types whose llamapy decode to profile")
    ap.add_argument(
        "--out", type=Path, default=None, help=f"report file (default {RESULTS.relative_to(ROOT)})"
    )
    ap.add_argument("--write-only", action="store_true", help="only write the model files")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    args.argv = argv
    shapes = [x.strip() for x in (args.shapes or ",".join(DEFAULT_SHAPES)).split(",")]
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape {s!r} (known: {', '.join(SHAPES)})")
    types = _types(args.types, ap) if args.types else list(QUICK_TYPES if args.quick else ALL_TYPES)
    prof_types = _types(args.profile, ap) if args.profile else []
    args.n_gen = args.n_gen if args.n_gen is not None else (16 if args.quick else 64)
    args.n_prompt = args.n_prompt if args.n_prompt is not None else (32 if args.quick else 128)
    args.reps = args.reps if args.reps is not None else (1 if args.quick else 2)
    if args.n_gen < 1 or args.n_prompt < 0 or args.reps < 1 or args.rounds < 1:
        ap.error("--n-gen, --reps and --rounds must be >= 1, --n-prompt >= 0")
    if args.write_only:
        for s in shapes:
            for t in types:
                print(ensure_model(s, t))
        return 0
    if not LLAMA_BENCH.exists():
        print(f"{LLAMA_BENCH} is missing (benchmarks/build_llamacpp.sh)", file=sys.stderr)
        return 1
    out = args.out or (Path("/tmp/types-quick.md") if args.quick else RESULTS)
    paths = {(s, t): ensure_model(s, t) for s in shapes for t in types}
    t0 = time.perf_counter()
    res = run_all(shapes, types, args, paths)
    mv = _matvec_types() or set()
    profiles = "".join(
        profile(shapes[-1], t, args.threads, 4 if _types_of(shapes[-1], t) - mv else 16) + "\n"
        for t in prof_types
    )
    text = report(res, shapes, types, args, profiles)
    text += f"\nTotal run time {time.perf_counter() - t0:.0f} s (not counting writing the files).\n"
    text += _kept_notes(out)
    out.write_text(text)
    print(text)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
