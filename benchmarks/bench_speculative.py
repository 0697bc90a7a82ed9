"""Speculative decoding, side by side with llama.cpp: token-generation speed on a repetitive code prompt
without a draft, with prompt lookup (n-gram drafting) and with a draft model, for llamapy
(``Llama(draft_model=...)``) and llama.cpp (``llama-lookup`` and ``llama-speculative`` from the
llama-cpp-python sdist, benchmarks/build_llamacpp.sh; comparison only), interleaved round by round.

    python benchmarks/bench_speculative.py [--target smollm2] [--draft smollm2] [-n 128] [-r 2] [-t 2]

The draft defaults to the target itself (the only pair of packaged models that share a vocabulary):
that measures the machinery (acceptance near 100 %, the cost of drafting), not a real small-for-large
speed-up. Greedy output with and without a draft is checked to be identical. Writes
benchmarks/results/speculative.md with the machine line.

Also llama.cpp's self-speculative ``--spec-type ngram-simple`` / ``ngram-map-k`` (llama.cpp's defaults:
key 12, draft 48) on the same prompt, and MTP (``--spec-type mtp``) on synthetic glm4moe / qwen35
files with one MTP layer (no packaged model has one): ``--mtp-scale 0`` makes the model's next token a
function of the current one and the MTP layer predict it exactly (acceptance ~100 %: the machinery's
cost and best case), ``0.35`` lets the context change some choices (some drafts rejected; qwen35's
recurrent state rolled back). ``--only ngram|mtp`` runs one part (no llama.cpp build needed for mtp).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import machine_line  # noqa: E402

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
        info = {
            "drafted": draft.n_drafted,
            "calls": draft.n_calls,
            "accepted": getattr(draft, "n_accepted", 0),
        }
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


def synthetic_mtp_model(family: str, n_layer: int, hidden: int, scale: float, tmp: Path) -> str:
    """A random-weight ``family`` model (transformers config, converted by llamapy's writer) with one
    MTP layer, its output projections scaled by ``scale`` (tests/generation/test_spec_mtp.py)."""
    import dataclasses

    import torch

    from llamapy.ggml.types import GGMLType
    from tests.generation.test_spec_mtp import _with_mtp
    from tests.model import hf_tiny

    torch.set_num_threads(1)
    hf_tiny._load_family_modules()
    fam = hf_tiny.FAMILIES[family]
    kw = dict(fam.config_kw, num_hidden_layers=n_layer, hidden_size=hidden, intermediate_size=2 * hidden)
    fam = dataclasses.replace(fam, name=f"{family}-bench{n_layer}x{hidden}", config_kw=kw)
    tm = hf_tiny.make_tiny(fam, tmp, seed=1)
    tm.write(GGMLType.F32)
    return str(_with_mtp(tm, tmp, scale))


def mtp_section(a: argparse.Namespace) -> list[str]:
    """Greedy tokens/s without a draft and with MTP drafts (1 and 3 tokens) on synthetic models."""
    import tempfile

    import numpy as np

    from llamapy.context import Context, ContextParams
    from llamapy.generation import GenerationParams, TokenSequence, generate
    from llamapy.generation.mtp import MtpDraft
    from llamapy.model import Model

    class Vocab:
        n_tokens = 256

        def is_eog(self, t: int) -> bool:
            return False

        def token_to_piece(self, t: int, special: bool = False) -> bytes:
            return b"x"

    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 256, 64)]
    tmp = Path(tempfile.mkdtemp(prefix="bench_mtp_"))
    lines = [
        "## MTP drafts (`--spec-type mtp`) on synthetic models",
        "",
        f"- machine at the start: {machine_line(load_avg=True)}",
        f"- glm4moe and qwen35 (hybrid) with {a.mtp_layers} trunk layers, hidden {a.mtp_hidden}, vocabulary "
        f"256, F32, one MTP layer; {a.n} greedy tokens after a 64-token prompt, {a.threads} threads; "
        "scale 0: the MTP layer predicts the model exactly, 0.35: the context changes some choices",
        "",
        "| model | scale | no draft t/s | MTP n_draft 1 | MTP n_draft 3 | identical |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for family in ("glm4moe", "qwen35"):
        for scale in a.mtp_scale:
            model = Model.load(synthetic_mtp_model(family, a.mtp_layers, a.mtp_hidden, scale, tmp))
            cells, outs = [], []
            for n_draft in (0, 3):  # warm-up: kernels and graphs of these shapes compiled before timing
                ctx = Context(model, ContextParams(n_ctx=512, n_batch=128, n_threads=a.threads))
                d = MtpDraft(model, n_draft=n_draft, n_ctx=512, n_threads=a.threads) if n_draft else None
                for _ in generate(TokenSequence(ctx), lambda z: int(np.argmax(z)), Vocab(), prompt,
                                  GenerationParams(max_tokens=8), draft_model=d):  # fmt: skip
                    pass
            for n_draft in (0, 1, 3):
                best, out, note = 0.0, [], ""
                for _ in range(max(1, a.rounds)):
                    ctx = Context(model, ContextParams(n_ctx=512, n_batch=128, n_threads=a.threads))
                    seq = TokenSequence(ctx)
                    draft = (
                        MtpDraft(model, n_draft=n_draft, n_ctx=512, n_threads=a.threads) if n_draft else None
                    )
                    t0 = time.perf_counter()
                    steps = generate(seq, lambda z: int(np.argmax(z)), Vocab(), prompt,
                                     GenerationParams(max_tokens=a.n), draft_model=draft)  # fmt: skip
                    out = [s.token for s in steps if s.token is not None]
                    dt = time.perf_counter() - t0
                    best = max(best, len(out) / dt)
                    if draft is not None:
                        note = f" (accepted {draft.n_accepted}/{draft.n_drafted})"
                cells.append(f"{best:.1f}{note}")
                outs.append(out)
                print(f"mtp {family} scale {scale} n_draft {n_draft}: {cells[-1]}", flush=True)
            same = all(o == outs[0] for o in outs)
            lines.append(f"| {family} | {scale} | " + " | ".join(cells) + f" | {same} |")
    lines.append(f"- load at the end: {os.getloadavg()[0]:.2f} (other engineers share the 2 cores)")
    return lines


def main() -> int:
    from llamapy import LlamaModelDraft, LlamaPromptLookupDecoding, hub
    from llamapy.generation.speculative import make_spec_draft

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default=None, help="draft model (default: the target)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", "--rounds", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/speculative.md"))
    ap.add_argument("--only", choices=("all", "ngram", "mtp"), default="all")
    ap.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp (no build: a busy machine)")
    ap.add_argument("--mtp-layers", type=int, default=8, help="trunk layers of the synthetic MTP models")
    ap.add_argument("--mtp-hidden", type=int, default=256)
    ap.add_argument("--mtp-scale", type=float, nargs="+", default=[0.0, 0.35])
    a = ap.parse_args()
    if a.only == "mtp":
        lines = mtp_section(a)
        Path(a.out.replace(".md", "_mtp.md")).write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 0
    target = str(hub.resolve_model(a.target))
    draft = str(hub.resolve_model(a.draft)) if a.draft else target
    bin_dir = Path("/nonexistent")  # (llamacpp_run then says "not built")
    if not a.no_llamacpp:
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
            ("llamapy, --spec-type ngram-simple (12/48)", lambda: make_spec_draft("ngram-simple")),
            ("llamapy, --spec-type ngram-map-k (12/48)", lambda: make_spec_draft("ngram-map-k")),
        ):
            tps, text, info = llamapy_run(target, make(), a.n, a.threads)
            texts.setdefault(name, text)
            extra = (
                f" (accepted {info['accepted']}/{info['drafted']} in {info['calls']} calls)" if info else ""
            )
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
        f"- machine: {machine_line(load_avg=True)}",
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
    if a.only == "all":
        lines += ["", *mtp_section(a)]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
