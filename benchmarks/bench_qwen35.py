"""Speed on a Qwen3.5-0.8B-shaped model: ``llamapy bench`` side by side with llama.cpp's ``llama-bench``.

    python -m benchmarks.bench_qwen35 [--rounds 2] [--quick] [--types Q8_0,Q4_K] [--threads 2] [--reps 1]
        [--depths 0,1024,4096] [--sweep-rounds 1] [--profile] [--out F] [--write-only]

1. Writes (our GGUF writer, our quantizer) a random-weight ``qwen35`` file with Qwen3.5-0.8B's text
   hyper-parameters: 24 layers (18 Gated DeltaNet + every 4th gated full attention), n_embd 1024, FFN 3584,
   attention 8 query / 2 KV heads of 256 with rope on 64 dims (interleaved mRoPE sections 11/11/10,
   base 1e7), linear attention 16 key / 16 value heads of 128, conv kernel 4, vocabulary 248320 (tied
   output). Every matrix is of the file's type (like ``llama-quantize --pure``; llama.cpp's rules keep
   ``ssm_conv1d`` and the norms F32); ``ssm_a``, ``ssm_dt.bias`` F32. The tokenizer is llama.cpp's
   ``ggml-vocab-qwen35.gguf`` from ``../shared/vocab`` padded with ``[PAD<i>]`` (unused) tokens to the real
   vocabulary size, as convert_hf_to_gguf.py pads. Files go to ~/.cache/llamapy/bench/ and are reused.
   Random weights: the numbers say nothing about text, only about speed.
2. Runs, interleaved (each round alternates which tool goes first), for each type: pp512 and tg128
   (``-p 512 -n 128``) through ``llama-bench ... -o json`` and ``python -m llamapy bench ... -o json``;
   in the first round also tg64 at depth 0 / 1024 / 4096 (``-p 0 -n 64 -d 0,1024,4096``, on the last
   type) to show that decode stays flat with context (18 of 24 layers are recurrent). Both tools fill the
   depth once per test and restore it before each repetition; the fills (5120 prompt tokens per tool)
   dominate the run time, hence one round of them unless ``--sweep-rounds`` says more.
3. Writes a Markdown report (machine, load, commands, t/s per tool as the mean of the rounds' means with
   the spread across rounds, the ratio llamapy / llama.cpp, and the depth sweep relative to d0), by
   default ``benchmarks/results/qwen35.md``. ``--profile`` appends llamapy's decode profile.

``--quick`` checks the script end to end in a few minutes: one type (Q4_K), pp64 + tg16, tg8 at depth
0 / 256, one round (report to /tmp/qwen35-quick.md unless ``--out`` is given).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llamapy.ggml.quants import quantize
from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType
from llamapy.gguf.reader import GGUFReader
from llamapy.gguf.writer import GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import llamacpp_bin, machine_line  # noqa: E402
from benchmarks.harness import load as _load

ARCH = "qwen35"
ROOT = Path(__file__).resolve().parents[1]
LLAMA_BENCH = llamacpp_bin() / "llama-bench"
BENCH_DIR = Path.home() / ".cache/llamapy/bench"
VOCAB = ROOT.parent / "shared" / "vocab" / "ggml-vocab-qwen35.gguf"
RESULTS = ROOT / "benchmarks" / "results" / "qwen35.md"
FILE_VERSION = "1"  # bump when the written file changes, so that stale cached files are rewritten

# Qwen3.5-0.8B text config (config.json text_config; llama.cpp's Qwen3_5TextModel conversion)
SHAPE: dict[str, Any] = dict(
    n_vocab=248320,
    n_embd=1024,
    n_layer=24,
    n_ff=3584,
    n_head=8,
    n_head_kv=2,
    head_dim=256,
    n_rot=64,  # partial_rotary_factor 0.25
    rope_sections=[11, 11, 10, 0],
    rope_base=10_000_000.0,
    rms_eps=1e-6,
    full_attention_interval=4,
    ssm_d_conv=4,
    ssm_d_state=128,  # linear_key_head_dim = linear_value_head_dim
    ssm_n_group=16,  # linear_num_key_heads
    ssm_dt_rank=16,  # linear_num_value_heads
    n_ctx_train=262144,
)
FILE_TYPES = {GGMLType.Q8_0: 7, GGMLType.Q4_K: 15}  # LLAMA_FTYPE_MOSTLY_Q8_0, _Q4_K_M


def _q(rng: np.random.Generator, shape: tuple[int, ...], t: GGMLType, scale: float) -> np.ndarray:
    """A random weight of type ``t``: a quantized tile of 64 rows repeated (quantizing GBs is slow). The
    full array is materialized, so the memory traffic is that of a real file."""
    k = shape[-1]
    rows = int(np.prod(shape[:-1]))
    tile = quantize((rng.standard_normal((min(rows, 64), k)) * scale).astype(np.float32), t)
    return np.ascontiguousarray(np.tile(tile, (-(-rows // tile.shape[0]), 1))[:rows]).reshape(*shape[:-1], -1)


def _vocab_keys(n_vocab: int) -> dict[str, tuple[Any, GGUFValueType | None]]:
    """``tokenizer.*`` of the shared qwen35 vocabulary, tokens padded to ``n_vocab`` with ``[PAD<i>]``."""
    if not VOCAB.exists():
        raise FileNotFoundError(f"{VOCAB}: the qwen35 vocabulary file is needed (../shared/vocab)")
    r = GGUFReader(VOCAB)
    toks = list(r.get("tokenizer.ggml.tokens"))
    types = [int(x) for x in r.get("tokenizer.ggml.token_type")]
    if len(toks) > n_vocab:
        raise ValueError(f"{VOCAB}: {len(toks)} tokens, more than vocab_size {n_vocab}")
    toks += [f"[PAD{i}]" for i in range(len(toks), n_vocab)]
    types += [5] * (n_vocab - len(types))  # UNUSED, as convert_hf_to_gguf.py's padding
    out: dict[str, tuple[Any, GGUFValueType | None]] = {
        "tokenizer.ggml.tokens": (toks, None),
        "tokenizer.ggml.token_type": (np.asarray(types, dtype=np.int32), None),
    }
    for k in r.fields:
        if k.startswith("tokenizer.") and k not in out:
            v = r.get(k)
            out[k] = (v, GGUFValueType.UINT32 if isinstance(v, (int, np.integer)) else None)
    return out


def write_model(path: Path, t: GGMLType, seed: int = 0, shape: dict[str, Any] | None = None) -> Path:
    """The random-weight Qwen3.5-0.8B-shaped file of type ``t`` (see the module docstring)."""
    s = dict(SHAPE, **(shape or {}))
    rng = np.random.default_rng(seed)
    n_embd, n_ff, hd = s["n_embd"], s["n_ff"], s["head_dim"]
    n_head, n_kv, n_vocab = s["n_head"], s["n_head_kv"], s["n_vocab"]
    dk, hk, hv = s["ssm_d_state"], s["ssm_n_group"], s["ssm_dt_rank"]
    d_inner = dk * hv
    conv_ch = 2 * hk * dk + d_inner
    tmp = path.with_suffix(".tmp")
    w = GGUFWriter(tmp, arch=ARCH)
    md: dict[str, Any] = {
        "general.name": f"bench-qwen35-0.8b-shape-v{FILE_VERSION}",
        "general.file_type": FILE_TYPES[t],
        f"{ARCH}.vocab_size": n_vocab,
        f"{ARCH}.context_length": s["n_ctx_train"],
        f"{ARCH}.embedding_length": n_embd,
        f"{ARCH}.block_count": s["n_layer"],
        f"{ARCH}.feed_forward_length": n_ff,
        f"{ARCH}.attention.head_count": n_head,
        f"{ARCH}.attention.head_count_kv": n_kv,
        f"{ARCH}.attention.key_length": hd,
        f"{ARCH}.attention.value_length": hd,
        f"{ARCH}.attention.layer_norm_rms_epsilon": s["rms_eps"],
        f"{ARCH}.rope.freq_base": s["rope_base"],
        f"{ARCH}.rope.dimension_count": s["n_rot"],
        f"{ARCH}.ssm.conv_kernel": s["ssm_d_conv"],
        f"{ARCH}.ssm.state_size": dk,
        f"{ARCH}.ssm.group_count": hk,
        f"{ARCH}.ssm.time_step_rank": hv,
        f"{ARCH}.ssm.inner_size": d_inner,
        f"{ARCH}.full_attention_interval": s["full_attention_interval"],
    }
    for k, v in md.items():
        if isinstance(v, float):
            w.add_key_value(k, v, GGUFValueType.FLOAT32)
        elif isinstance(v, int):
            w.add_key_value(k, v, GGUFValueType.UINT32)
        else:
            w.add_key_value(k, v)
    w.add_key_value(
        f"{ARCH}.rope.dimension_sections", s["rope_sections"], GGUFValueType.ARRAY, GGUFValueType.INT32
    )
    for k, (v, vt) in _vocab_keys(n_vocab).items():
        w.add_key_value(k, v, vt)

    def f32(name: str, shp: tuple[int, ...], scale: float = 0.02, base: float = 0.0) -> None:
        w.add_tensor(name, (base + rng.standard_normal(shp) * scale).astype(np.float32))

    def mat(name: str, shp: tuple[int, int]) -> None:
        w.add_tensor(name, _q(rng, shp, t, 1.0 / np.sqrt(shp[-1])), ggml_type=t, raw_shape=shp)

    mat("token_embd.weight", (n_vocab, n_embd))  # tied: also the output
    f32("output_norm.weight", (n_embd,), base=1.0)
    every = s["full_attention_interval"]
    for il in range(s["n_layer"]):
        b = f"blk.{il}."
        f32(b + "attn_norm.weight", (n_embd,), base=1.0)
        f32(b + "post_attention_norm.weight", (n_embd,), base=1.0)
        if (il + 1) % every:  # Gated DeltaNet
            mat(b + "attn_qkv.weight", (conv_ch, n_embd))
            mat(b + "attn_gate.weight", (d_inner, n_embd))
            f32(b + "ssm_conv1d.weight", (conv_ch, s["ssm_d_conv"]), scale=0.5)
            f32(b + "ssm_dt.bias", (hv,), scale=0.5)
            w.add_tensor(b + "ssm_a", -np.exp(rng.uniform(-1.0, 2.0, hv)).astype(np.float32))
            mat(b + "ssm_beta.weight", (hv, n_embd))
            mat(b + "ssm_alpha.weight", (hv, n_embd))
            f32(b + "ssm_norm.weight", (dk,), base=1.0)
            mat(b + "ssm_out.weight", (n_embd, d_inner))
        else:  # gated full attention: q and its output gate from one projection
            mat(b + "attn_q.weight", (2 * n_head * hd, n_embd))
            mat(b + "attn_k.weight", (n_kv * hd, n_embd))
            mat(b + "attn_v.weight", (n_kv * hd, n_embd))
            mat(b + "attn_output.weight", (n_embd, n_head * hd))
            f32(b + "attn_q_norm.weight", (hd,), base=1.0)
            f32(b + "attn_k_norm.weight", (hd,), base=1.0)
        mat(b + "ffn_gate.weight", (n_ff, n_embd))
        mat(b + "ffn_up.weight", (n_ff, n_embd))
        mat(b + "ffn_down.weight", (n_embd, n_ff))
    w.write()
    w.close()
    os.replace(tmp, path)
    return path


def model_path(t: GGMLType) -> Path:
    return BENCH_DIR / f"qwen35-0.8b-shape.{t.name}.gguf"


def ensure_model(t: GGMLType) -> Path:
    """The cached file of type ``t``, written if missing or from another version of this script."""
    path = model_path(t)
    if path.exists():
        try:
            if GGUFReader(path).get("general.name") == f"bench-qwen35-0.8b-shape-v{FILE_VERSION}":
                return path
        except Exception:  # a truncated or foreign file: write it again
            pass
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(f"writing {path} ...", file=sys.stderr, flush=True)
    write_model(path, t)
    print(f"  {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return path


# -- running the two tools -----------------------------------------------------------------------


@dataclass
class Plan:
    """One test set: llama-bench's ``-p/-n/-d`` lists (the same flags for both tools)."""

    p: str
    n: str
    d: str = "0"


def _cmd(tool: str, path: Path, plan: Plan, threads: int, reps: int) -> list[str]:
    flags = ["-m", str(path), "-p", plan.p, "-n", plan.n, "-t", str(threads), "-r", str(reps)]
    if plan.d != "0":
        flags += ["-d", plan.d]
    if tool == "llama.cpp":
        return [str(LLAMA_BENCH), *flags, "-o", "json"]
    return [sys.executable, "-m", "llamapy", "bench", *flags, "-o", "json"]


def _run(cmd: list[str]) -> tuple[list[dict[str, Any]], float]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    out = p.stdout
    start = out.find("[")
    try:
        return json.loads(out[start:]), dt
    except (ValueError, json.JSONDecodeError):
        raise RuntimeError(f"{shlex.join(cmd)}: no JSON records in its output:\n{out[-2000:]}") from None


def _test_name(r: dict[str, Any]) -> str:
    name = (f"pp{r['n_prompt']}" if r["n_prompt"] else "") + (f"tg{r['n_gen']}" if r["n_gen"] else "")
    return name + (f" @ d{r['n_depth']}" if r.get("n_depth") else "")


def run_all(
    types: list[GGMLType],
    plans: list[Plan],
    sweep: Plan | None,
    rounds: int,
    threads: int,
    reps: int,
    sweep_rounds: int = 1,
) -> dict[str, Any]:
    """Interleaved rounds of ``plans`` on every type; ``sweep`` (the depth sweep, on the last type) in the
    first ``sweep_rounds`` rounds (its depth fills dominate the run time). Returns {(type, test, tool):
    [per-round avg t/s]} plus a log of the runs."""
    paths = {t: ensure_model(t) for t in types}
    res: dict[tuple[str, str, str], list[float]] = {}
    meta: dict[str, Any] = {"log": [], "loads": [], "info": {}}
    for rnd in range(rounds):
        tools = ("llama.cpp", "llamapy") if rnd % 2 == 0 else ("llamapy", "llama.cpp")
        meta["loads"].append(_load())
        jobs = [(t, tool, plan) for t in types for tool in tools for plan in plans]
        if sweep is not None and rnd < sweep_rounds:
            jobs += [(types[-1], tool, sweep) for tool in tools]
        for t, tool, plan in jobs:
            recs, dt = _run(_cmd(tool, paths[t], plan, threads, reps))
            what = f"-p {plan.p} -n {plan.n}" + (f" -d {plan.d}" if plan.d != "0" else "")
            meta["log"].append(f"round {rnd + 1} {t.name} {tool} `{what}`: {dt:.0f} s (load {_load()})")
            print(meta["log"][-1], file=sys.stderr, flush=True)
            for r in recs:
                res.setdefault((t.name, _test_name(r), tool), []).append(float(r["avg_ts"]))
                meta["info"].setdefault(tool, r)
                meta["info"].setdefault((tool, t.name), r)
    meta["loads"].append(_load())
    meta["paths"] = paths
    return {"res": res, **meta}


def _fmt(vals: list[float]) -> str:
    if not vals:
        return "–"
    m = statistics.mean(vals)
    return f"{m:.2f}" + (f" ({min(vals):.2f}–{max(vals):.2f})" if len(vals) > 1 else "")


def _sort_key(test: str) -> tuple[bool, str, int]:
    base, _, d = test.partition(" @ d")
    return (not base.startswith("pp"), base, int(d or 0))


def report(
    run: dict[str, Any],
    types: list[GGMLType],
    plans: list[Plan],
    sweep: Plan | None,
    args: argparse.Namespace,
) -> str:
    res = run["res"]
    lc, lp = run["info"].get("llama.cpp", {}), run["info"].get("llamapy", {})
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    flags = " --quick" if args.quick else ""
    flags += f" --rounds {args.rounds} --types {','.join(t.name for t in types)} --threads {args.threads}"
    lines = [
        "# Qwen3.5-0.8B-shaped model: llamapy vs llama.cpp (CPU)",
        "",
        f"Written by `python -m benchmarks.bench_qwen35{flags}` on {when}."
        + (" **QUICK CHECK of the script: not a measurement.**" if args.quick else ""),
        "",
        f"- machine: {machine_line()}",
        f"- load average (1/5/15 min) before each round and at the end: {' | '.join(run['loads'])}",
        f"- llama.cpp: `{LLAMA_BENCH}` (build {lc.get('build_commit', '?')} / {lc.get('build_number', '?')}, "
        f"{lc.get('backends', '?')}, {lc.get('cpu_info', '?')})",
        f"- llamapy: `python -m llamapy bench` ({lp.get('backends', '?')}), Python {platform.python_version()}, "
        f"NumPy {np.__version__}",
        f"- threads {args.threads}; {args.reps} repetition(s) per test per round, after each tool's warm-up run; "
        f"{args.rounds} round(s), each alternating which tool goes first; a cell is the mean of the rounds' "
        f"means (min–max across rounds). The depth sweep runs in the first {args.sweep_rounds} round(s), on "
        f"{types[-1].name}: both tools fill the context once per depth and restore it before each repetition",
        "- model: random weights with Qwen3.5-0.8B's text hyper-parameters (24 layers: 18 Gated DeltaNet, 6 "
        "gated attention; n_embd 1024, FFN 3584, 8/2 heads of 256, linear attention 16/16 heads of 128, "
        "vocabulary 248320 tied), every matrix of the file's type (`--pure`-style), written by "
        "`benchmarks/bench_qwen35.py` with llamapy's GGUF writer and quantizer",
        "",
        "Commands (F: the file of each type):",
        "",
        "```",
    ]
    for plan in plans + ([sweep] if sweep else []):
        for tool in ("llama.cpp", "llamapy"):
            lines.append(shlex.join(_cmd(tool, Path("F"), plan, args.threads, args.reps)))
    lines += ["```", ""]
    for t in types:
        path = run["paths"][t]
        lines += [
            f"## {t.name} (`{path.name}`, {path.stat().st_size / 2**20:.0f} MiB)",
            "",
        ]
        for tool in ("llama.cpp", "llamapy"):
            r = run["info"].get((tool, t.name))
            if r:
                lines.append(
                    f"- {tool} reads it as: {r['model_type']}, {r['model_size'] / 2**20:.2f} MiB, "
                    f"{r['model_n_params'] / 1e6:.2f} M parameters"
                )
        lines += [
            "",
            "| test | llama.cpp t/s | llamapy t/s | llamapy / llama.cpp |",
            "| --- | ---: | ---: | ---: |",
        ]
        tests = sorted({k[1] for k in res if k[0] == t.name}, key=_sort_key)
        for test in tests:
            a, b = res.get((t.name, test, "llama.cpp"), []), res.get((t.name, test, "llamapy"), [])
            ratio = f"{statistics.mean(b) / statistics.mean(a):.2f}" if a and b else "–"
            lines.append(f"| {test} | {_fmt(a)} | {_fmt(b)} | {ratio} |")
        swept = [s for s in tests if sweep and s.partition(" @ ")[0] == f"tg{sweep.n}"]
        if len(swept) > 1:
            lines += ["", f"Decode vs context depth (tg{sweep.n} t/s at depth d / at d0; flat = 1.00):", ""]
            lines += ["| depth | llama.cpp | llamapy |", "| ---: | ---: | ---: |"]
            for s in swept:
                cells = []
                for tool in ("llama.cpp", "llamapy"):
                    v, v0 = res.get((t.name, s, tool)), res.get((t.name, swept[0], tool))
                    cells.append(f"{statistics.mean(v) / statistics.mean(v0):.2f}" if v and v0 else "–")
                lines.append(f"| {s.partition(' @ d')[2] or '0'} | {cells[0]} | {cells[1]} |")
        lines.append("")
    lines += ["## Runs", "", *[f"- {x}" for x in run["log"]], ""]
    if args.profile_text:
        lines += ["## Where a llamapy decode token goes (cProfile, by own time)", "", "```"]
        lines += [args.profile_text.strip(), "```", ""]
    return "\n".join(lines)


def profile(t: GGMLType, threads: int, n_gen: int, depth: int) -> str:
    """``llamapy bench --profile`` of a tg run on the ``t`` file (text of its stderr)."""
    cmd = [sys.executable, "-m", "llamapy", "bench", "-m", str(model_path(t)), "-p", "0", "-n", str(n_gen),
           "-t", str(threads), "-r", "1", "--profile"] + (["-d", str(depth)] if depth else [])  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return f"$ python {shlex.join(cmd[1:])}\n" + "\n".join(p.stderr.strip().splitlines()[:40])


NOTES = "\n## Notes"


def _kept_notes(out: Path) -> str:
    """The hand-written ``## Notes`` section (to the end) of the report being replaced, kept as it was."""
    try:
        old = out.read_text()
    except OSError:
        return ""
    i = old.find(NOTES)
    return old[i:] if i >= 0 else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="one type, few tokens: checks the script works")
    ap.add_argument("--types", default=None, help="comma list of Q8_0,Q4_K (default both; --quick: Q4_K)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1, help="repetitions per test per round (default 1)")
    ap.add_argument(
        "--depths", default=None, help="depth sweep (default 0,1024,4096; --quick: 0,256; '': none)"
    )
    ap.add_argument("--sweep-rounds", type=int, default=1, help="rounds that run the depth sweep (default 1)")
    ap.add_argument("--profile", action="store_true", help="append llamapy's decode profile (Q4_K, tg32)")
    ap.add_argument(
        "--out", type=Path, default=None, help=f"report file (default {RESULTS.relative_to(ROOT)})"
    )
    ap.add_argument("--write-only", action="store_true", help="only write the model files")
    args = ap.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 2)
    if args.rounds < 1 or args.reps < 1:
        ap.error("--rounds and --reps must be >= 1")
    names = (args.types or ("Q4_K" if args.quick else "Q8_0,Q4_K")).split(",")
    try:
        types = [GGMLType[n.strip().upper()] for n in names]
    except KeyError as e:
        ap.error(f"--types: unknown type {e}")
    if any(t not in FILE_TYPES for t in types):
        ap.error(f"--types: only {', '.join(t.name for t in FILE_TYPES)}")
    if args.write_only:
        for t in types:
            print(ensure_model(t))
        return 0
    if not LLAMA_BENCH.exists():
        print(f"{LLAMA_BENCH} is missing (benchmarks/build_llamacpp.sh)", file=sys.stderr)
        return 1
    depths = args.depths if args.depths is not None else ("0,256" if args.quick else "0,1024,4096")
    if args.quick:
        plans, sweep = [Plan("64", "16")], Plan("0", "8", depths)
        out = args.out or Path("/tmp/qwen35-quick.md")
    else:
        plans, sweep = [Plan("512", "128")], Plan("0", "64", depths)
        out = args.out or RESULTS
    if not depths.strip():
        sweep = None
    t0 = time.perf_counter()
    run = run_all(types, plans, sweep, args.rounds, args.threads, args.reps, args.sweep_rounds)
    args.profile_text = ""
    if args.profile:
        pt = GGMLType.Q4_K if GGMLType.Q4_K in types else types[0]
        args.profile_text = profile(pt, args.threads, 16 if args.quick else 32, 0)
    text = report(run, types, plans, sweep, args)
    text += f"\nTotal run time {time.perf_counter() - t0:.0f} s.\n"
    text += _kept_notes(out)
    out.write_text(text)
    print(text)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
