"""Speculative decoding, side by side with llama.cpp: token-generation speed on a repetitive code prompt
without a draft, with prompt lookup (n-gram drafting) and with a draft model, for llamapy
(``Llama(draft_model=...)``) and llama.cpp (``llama-lookup`` and ``llama-speculative`` from the
llama-cpp-python sdist, benchmarks/build_llamacpp.sh; comparison only), interleaved round by round.

    python benchmarks/bench_speculative.py [--target smollm2] [--draft smollm2] [-n 128] [-r 2] [-t 2]

The draft defaults to the target itself (the only pair of packaged models that share a vocabulary):
that measures the machinery (acceptance near 100 %, the cost of drafting), not a real small-for-large
speed-up. Greedy output with and without a draft is checked to be identical. Writes
benchmarks/results/speculative.md with the machine line.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = (
    "Complete the Python code.\n\n"
    + "".join(
        f"def get_{n}(self):\n    return self._{n}\n\ndef set_{n}(self, value):\n    self._{n} = value\n\n"
        for n in ("name", "age", "email", "phone")
    )
    + "def get_address(self):\n"
)


def machine_line() -> str:
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?"
    )
    flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo") if ln.startswith("flags")), [])
    keep = [f for f in flags if re.fullmatch(r"avx|avx2|fma|f16c|avx_vnni|avx512\w*", f)]
    return f"{os.cpu_count()} cores, {cpu}; flags: {' '.join(keep)}; load {os.getloadavg()[0]:.2f}"


def llamapy_run(target: str, draft: object, n: int, threads: int) -> tuple[float, str, dict]:
    from llamapy import Llama

    llm = Llama(target, n_ctx=1024, n_threads=threads, draft_model=draft, verbose=False)
    llm(PROMPT, max_tokens=4, temperature=0)  # warm the kernels for these shapes
    llm.reset()
    t0 = time.perf_counter()
    r = llm(PROMPT, max_tokens=n, temperature=0)
    dt = time.perf_counter() - t0
    info = {}
    if hasattr(draft, "n_drafted"):
        info = {"drafted": draft.n_drafted, "calls": draft.n_calls}
    n_gen = r["usage"]["completion_tokens"]
    return n_gen / dt, r["choices"][0]["text"], info


def llamacpp_run(bin_dir: Path, tool: str, args: list[str]) -> tuple[float | None, str]:
    exe = bin_dir / tool
    if not exe.exists():
        return None, f"{tool} not built"
    p = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    m = re.search(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds, speed:\s+([\d.]+) t/s", out)
    acc = re.search(r"accept\s*=\s*([\d.]+)%", out)
    if not m:
        return None, f"{tool}: no speed line (rc {p.returncode})"
    return float(m.group(3)), f"accept {acc.group(1)}%" if acc else ""


def main() -> int:
    from llamapy import LlamaModelDraft, LlamaPromptLookupDecoding, hub

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default=None, help="draft model (default: the target)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", "--rounds", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/speculative.md"))
    a = ap.parse_args()
    target = str(hub.resolve_model(a.target))
    draft = str(hub.resolve_model(a.draft)) if a.draft else target
    bin_dir = Path(subprocess.run(["bash", str(ROOT / "benchmarks/build_llamacpp.sh")], capture_output=True,
                                  text=True).stdout.strip().splitlines()[-1])  # fmt: skip
    prompt_file = Path("/tmp/llamapy_spec_prompt.txt")
    prompt_file.write_text(PROMPT)
    common = [
        "-m",
        target,
        "-f",
        str(prompt_file),
        "-n",
        str(a.n),
        "--temp",
        "0",
        "-t",
        str(a.threads),
        "-c",
        "1024",
    ]
    rows: dict[str, list[str]] = {}
    texts: dict[str, str] = {}
    for rnd in range(a.rounds):
        for name, make in (
            ("llamapy, no draft", lambda: None),
            ("llamapy, prompt lookup (n-gram 2, 10 tokens)", lambda: LlamaPromptLookupDecoding(2, 10)),
            (
                "llamapy, draft model",
                lambda: LlamaModelDraft(draft, n_draft=a.draft_max, n_threads=a.threads),
            ),
        ):
            tps, text, info = llamapy_run(target, make(), a.n, a.threads)
            texts.setdefault(name, text)
            extra = f" (drafted {info['drafted']} in {info['calls']} calls)" if info else ""
            rows.setdefault(name, []).append(f"{tps:.1f}{extra}")
            print(f"round {rnd}: {name}: {tps:.1f} t/s{extra}", flush=True)
        for name, tool, extra_args in (
            ("llama.cpp llama-lookup", "llama-lookup", ["--spec-draft-n-max", "10"]),
            (
                "llama.cpp llama-speculative",
                "llama-speculative",
                ["-md", draft, "--spec-draft-n-max", str(a.draft_max), "--spec-draft-p-min", "0.75"],
            ),
        ):
            tps, note = llamacpp_run(bin_dir, tool, common + extra_args)
            rows.setdefault(name, []).append(f"{tps:.1f} {note}".strip() if tps else note)
            print(f"round {rnd}: {name}: {rows[name][-1]}", flush=True)
    same = len({t for k, t in texts.items()}) == 1
    lines = [
        "# Speculative decoding, llamapy and llama.cpp side by side",
        "",
        f"- machine: {machine_line()}",
        f"- command: `python benchmarks/bench_speculative.py --target {a.target} "
        f"{'--draft ' + a.draft if a.draft else ''} -n {a.n} -r {a.rounds} -t {a.threads}`",
        f"- target {Path(target).name}, draft {Path(draft).name}; greedy; tokens/s of generation "
        f"(llama.cpp: its 'decoded N tokens' line), one column per round",
        f"- llamapy's three greedy outputs identical: {same}",
        "",
        "| run | " + " | ".join(f"round {i + 1}" for i in range(a.rounds)) + " |",
        "| --- |" + " --- |" * a.rounds,
    ]
    lines += [f"| {k} | " + " | ".join(v) + " |" for k, v in rows.items()]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
