"""Speculative decoding, llamapy and llama.cpp 0.3.36 on the same files: acceptance rate and tokens/s (wall
and CPU time) with the same target, draft, prompt and ``n_draft``, greedy, for each ``--spec-type`` both
have. llama.cpp runs its ``llama-speculative-simple`` (benchmarks/build_llamacpp.sh builds it into
``build-avx2``: an AVX2 build, comparison only, llamapy never calls it).

    python benchmarks/bench_spec_vs_llamacpp.py [-n 48] [-t 1] [--only draft,ngram,mtp,eagle3]

Setups (each also without a draft, as the baseline):

- ``draft``: SmolLM2-135M Q8_0 (real weights; quantized from the F16 file by llama-quantize, one file for
  both tools) as the target, SmolLM2-135M-Instruct Q4_1 as the draft
  (``-md``; both are real files with one vocabulary), ``n_draft`` 8, ``p_min`` 0.75.
- ``ngram``: ``--spec-type ngram-simple`` and ``ngram-map-k`` on the same target (key 3, draft 8), a
  getters/setters prompt that repeats itself.
- ``mtp``: a synthetic glm4moe file (random weights, 4 trunk layers, hidden 256, one MTP layer; a
  256-token byte vocabulary so llama.cpp can tokenize) with output projections scaled by 0.35: the MTP
  layer predicts the model's next token unless the context changes it. ``--spec-type draft-mtp``, n_draft 3.
- ``eagle3``: SmolLM2 Q8_0 with a random EAGLE-3 head written as llama.cpp's converter writes one
  (``eagle3.target_layers``, ``blk.0.attn_norm_2``, the target's tokenizer): acceptance near 0, the cost
  of drafting.

CPU time: each tool runs once with ``-n N`` and once with ``-n 1`` (load, prompt); CPU tokens/s is
``(tokens(N) - tokens(1)) / (cpu(N) - cpu(1))`` (the machine is shared: wall time is noisy). llamapy's
side is measured in this process after a warm-up run (Numba kernels compiled). Greedy identity: llamapy
with each draft is checked against llamapy without; llama.cpp's text against llamapy's.
Writes benchmarks/results/speculative_vs_llamacpp.md.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.harness import llamacpp_bin, machine_line  # noqa: E402

PROMPT = (
    "Complete the Python code.\n\n"
    + "".join(
        f"def get_{n}(self):\n    return self._{n}\n\ndef set_{n}(self, value):\n    self._{n} = value\n\n"
        for n in ("name", "age", "email")
    )
    + "def get_phone(self):"
)  # (no newline at the end: llama.cpp's -f drops it, the two tools then see the same tokens)
MTP_PROMPT = "Thequickbrownfoxjumpsoverthelazydog" * 2  # bytes (no spaces: the byte vocabulary's SPM)
# llama-speculative-simple refuses --spec-type none: its no-draft baseline is an n-gram draft whose key
# (1024 tokens) never matches, so every round decodes one token, as without a draft
NO_DRAFT = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1024"]
EOS_BYTE = 255
SMOL_Q8 = (
    Path.home() / ".cache/llamapy/bench/smollm2-135m-q8_0.gguf"
)  # never sampled on either side (llama.cpp --ignore-eos; llamapy masks it)


@dataclass
class Result:
    tps_wall: float | None = None
    tps_cpu: float | None = None
    n_gen: int = 0
    drafted: int = 0
    accepted: int = 0
    text: str = ""
    note: str = ""

    def cells(self) -> list[str]:
        if self.tps_wall is None:
            return [self.note or "-", "", "", ""]
        acc = f"{self.accepted}/{self.drafted} = {self.accepted / self.drafted:.0%}" if self.drafted else "-"
        cpu = f"{self.tps_cpu:.1f}" if self.tps_cpu else "-"
        return [f"{self.tps_wall:.1f}", cpu, acc, str(self.n_gen)]


# -- llama.cpp --------------------------------------------------------------------------------------


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _llamacpp_once(exe: Path, args: list[str], n: int) -> tuple[dict[str, Any], float, str, str]:
    c0 = _child_cpu()
    p = subprocess.run([str(exe), *args, "-n", str(n)], capture_output=True, text=True, errors="replace",
                       timeout=1800)  # fmt: skip
    cpu = _child_cpu() - c0
    log = p.stderr
    out: dict[str, Any] = {"rc": p.returncode}
    m = re.search(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds", log)
    if m:
        out["n"], out["s"] = int(m.group(1)), float(m.group(2))
    for key in ("n_drafted", "n_accept", "n_predict"):
        k = re.search(rf"{key}\s*=\s*(\d+)", log)
        if k:
            out[key] = int(k.group(1))
    return out, cpu, p.stdout, log


def llamacpp(bin_dir: Path, args: list[str], n: int) -> Result:
    exe = bin_dir / "llama-speculative-simple"
    if not exe.exists():
        return Result(note="llama-speculative-simple not built (benchmarks/build_llamacpp.sh)")
    full, cpu_n, text, log = _llamacpp_once(exe, args, n)
    if "n" not in full:
        err = [
            ln for ln in log.splitlines() if re.search(r"error|failed|unknown|exception|what\(\)", ln, re.I)
        ]
        return Result(
            note=f"llama.cpp fails (rc {full['rc']}): {(err or [log.strip()[-200:]])[-1].strip()[:200]}"
        )
    one, cpu_1, _, _ = _llamacpp_once(exe, args, 1)
    n_full, n_one = full.get("n_predict", full["n"]), one.get("n_predict", 1)
    r = Result(tps_wall=full["n"] / max(full["s"], 1e-9), n_gen=n_full, text=text)
    if n_full > n_one and cpu_n > cpu_1:
        r.tps_cpu = (n_full - n_one) / (cpu_n - cpu_1)
    r.drafted, r.accepted = full.get("n_drafted", 0), full.get("n_accept", 0)
    return r


# -- llamapy ----------------------------------------------------------------------------------------


def _llamapy_once(model: Any, make_draft: Any, prompt: list[int], n: int, threads: int, vocab: Any,
                  mask: int | None) -> tuple[list[int], float, float, Any]:  # fmt: skip
    from llamapy.context import Context, ContextParams
    from llamapy.generation import GenerationParams, TokenSequence, generate

    def sample(z: np.ndarray) -> int:
        if mask is not None:
            z = np.array(z, copy=True)
            z[mask] = -np.inf
        return int(np.argmax(z))

    ctx = Context(model, ContextParams(n_ctx=1024, n_batch=512, n_threads=threads))
    draft = make_draft() if make_draft else None
    c0, w0 = time.process_time(), time.perf_counter()
    steps = generate(TokenSequence(ctx), sample, vocab, prompt, GenerationParams(max_tokens=n),
                     draft_model=draft)  # fmt: skip
    out = [s.token for s in steps if s.token is not None]
    return out, time.process_time() - c0, time.perf_counter() - w0, draft


def llamapy(model: Any, make_draft: Any, prompt: list[int], n: int, threads: int, vocab: Any,
            mask: int | None = None) -> tuple[Result, list[int]]:  # fmt: skip
    _llamapy_once(model, make_draft, prompt, n, threads, vocab, mask)  # warm-up: kernels, graphs (all shapes)
    one, cpu_1, wall_1, _ = _llamapy_once(model, make_draft, prompt, 1, threads, vocab, mask)
    out, cpu_n, wall_n, draft = _llamapy_once(model, make_draft, prompt, n, threads, vocab, mask)
    r = Result(n_gen=len(out))
    r.tps_wall = (len(out) - len(one)) / max(wall_n - wall_1, 1e-9)
    r.tps_cpu = (len(out) - len(one)) / max(cpu_n - cpu_1, 1e-9)
    if draft is not None:
        r.drafted, r.accepted = int(draft.n_drafted), int(getattr(draft, "n_accepted", 0))
    return r, out


def primed(draft: Any, prompt: list[int]) -> Any:
    """A draft model that has read the prompt (before the clock starts, as llama.cpp's draft does while
    the prompt is encoded; its first guesses are dropped)."""
    draft(np.asarray(prompt, dtype=np.intc))
    draft.n_drafted = draft.n_calls = 0
    return draft


# -- files ------------------------------------------------------------------------------------------


def byte_vocab_md() -> dict[str, Any]:
    """A 256-token SPM vocabulary of byte tokens ``<0x00>``..``<0xFF>``: text -> its bytes, both tools."""
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [f"<0x{i:02X}>" for i in range(256)],
        "tokenizer.ggml.scores": [0.0] * 256,
        "tokenizer.ggml.token_type": np.full(256, 6, dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": EOS_BYTE,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_space_prefix": False,
    }


def mtp_file(tmp: Path, n_layer: int, hidden: int, scale: float) -> Path:
    """A random glm4moe with one MTP layer (tests/generation/test_spec_mtp.py) and a byte vocabulary."""
    import dataclasses

    import torch

    from llamapy.ggml.types import GGMLType
    from llamapy.model.loader import ModelLoader
    from tests.generation.test_spec_mtp import _with_mtp
    from tests.model import hf_tiny

    torch.set_num_threads(1)
    hf_tiny._load_family_modules()
    fam = hf_tiny.FAMILIES["glm4moe"]
    kw = dict(fam.config_kw, num_hidden_layers=n_layer, hidden_size=hidden, intermediate_size=2 * hidden)
    fam = dataclasses.replace(fam, name=f"glm4moe-bench{n_layer}x{hidden}", config_kw=kw)
    tm = hf_tiny.make_tiny(fam, tmp, seed=1)
    tm.write(GGMLType.F32)
    src = _with_mtp(tm, tmp, scale)
    loader = ModelLoader(str(src))
    md = {k: v for k, v in loader.metadata.items() if k != "general.architecture"}
    md.update(byte_vocab_md())
    tensors = {name: np.asarray(info.array(), dtype=np.float32).reshape(tuple(info.shape))
               for name, info in loader.tensor_index.items()}  # fmt: skip
    return hf_tiny.write_gguf(tmp / "glm4moe-mtp-bytes.gguf", "glm4moe", md, tensors, GGMLType.F32)


def eagle3_head_file(tmp: Path, target: Any) -> Path:
    """A random EAGLE-3 head for ``target`` in llama.cpp's converter layout (its tokenizer copied in)."""
    from tests.generation.eagle3_head import write_head

    md = target.metadata
    arch = md["general.architecture"]
    n, n_layer = int(md[f"{arch}.embedding_length"]), int(md[f"{arch}.block_count"])
    tok = {k: v for k, v in md.items() if k.startswith("tokenizer.")}
    return write_head(tmp / "smol-eagle3.gguf", n, (2, n_layer // 2, n_layer - 3), 1024, n=n, nh=9, nkv=3,
                      ff=256, n_vocab=int(target.n_vocab), llamacpp_layout=True, extra_md=tok)  # fmt: skip


# -- the report -------------------------------------------------------------------------------------


def main() -> int:
    from llamapy import hub
    from llamapy.model import Model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=48)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument(
        "--target", default=str(SMOL_Q8), help="(default: made from the F16 file by llama-quantize)"
    )
    ap.add_argument("--draft", default="smollm2-135m-instruct")
    ap.add_argument("--only", default="draft,ngram,mtp,eagle3")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/speculative_vs_llamacpp.md"))
    a = ap.parse_args()
    only = set(a.only.split(","))
    bin_dir = llamacpp_bin("avx2")
    if a.target == str(SMOL_Q8) and not SMOL_Q8.exists():
        f16 = SMOL_Q8.with_name("smollm2-135m-f16.gguf")  # (benchmarks/tg_cputime.py's SmolLM2-135M F16)
        subprocess.run([str(bin_dir / "llama-quantize"), str(f16), str(SMOL_Q8), "Q8_0"], check=True,
                       capture_output=True)  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="bench_spec_vs_"))
    prompt_file = tmp / "prompt.txt"
    prompt_file.write_text(PROMPT)
    t = str(a.threads)
    base = ["--temp", "0", "--top-k", "1", "-t", t, "-td", t, "-c", "1024", "-b", "512", "--seed", "1"]
    lines = [
        "# Speculative decoding: llamapy and llama.cpp 0.3.36 side by side",
        "",
        f"- machine: {machine_line(load_avg=True)} (llama.cpp: its AVX2 build, build-avx2; llamapy: Numba for "
        "this CPU)",
        f"- command: `python benchmarks/bench_spec_vs_llamacpp.py -n {a.n} -t {a.threads} --only {a.only}`",
        f"- {a.n} greedy tokens, {a.threads} thread(s); llama.cpp: `llama-speculative-simple`; t/s wall: "
        "llama.cpp's `decoded` line, llamapy's generation after the first token; t/s CPU: generated tokens "
        "per CPU second (run with -n N minus run with -n 1: load and prompt out); accepted: accepted/drafted; "
        "llama.cpp's no-draft rows: `--spec-type ngram-simple --spec-ngram-simple-size-n 1024` (never drafts; "
        "the tool refuses `--spec-type none`)",
        "",
        "| setup | tool | t/s wall | t/s CPU | accepted | tokens | same text |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]

    def row(setup: str, tool: str, r: Result, same: str) -> None:
        lines.append(f"| {setup} | {tool} | " + " | ".join(r.cells()) + f" | {same} |")
        print(lines[-1], flush=True)

    def compare(setup: str, model: Any, prompt: list[int], cpp_args: list[str], make: Any, vocab: Any,
                plain: list[int] | None, mask: int | None = None) -> list[int]:  # fmt: skip
        r, out = llamapy(model, make, prompt, a.n, a.threads, vocab, mask)
        if plain is None:
            plain = out
        detok = b"".join(vocab.token_to_piece(int(x)) for x in out)
        row(setup, "llamapy", r, "reference" if out is plain else str(out == plain))
        c = llamacpp(bin_dir, cpp_args, a.n)
        same = ""
        if c.text:
            d = detok.decode("utf-8", "replace").strip()
            same = str(bool(d) and d in c.text)
        row(setup, "llama.cpp", c, same)
        return plain

    if only & {"draft", "ngram", "eagle3"}:
        target = Model.load(a.target)
        vocab = target.vocab
        prompt = list(vocab.tokenize(PROMPT, add_special=True))
        common = ["-m", a.target, "-f", str(prompt_file), *base]
        plain = compare("SmolLM2 Q8_0, no draft", target, prompt, [*common, *NO_DRAFT], None,
                        vocab, None)  # fmt: skip
        if "draft" in only:
            from llamapy.generation.draft_model import LlamaModelDraft

            dpath = str(hub.resolve_model(a.draft))
            dmodel = Model.load(dpath)
            compare("SmolLM2 Q8_0 + draft SmolLM2-Instruct Q4_1 (n_draft 8, p_min 0.75)", target, prompt,
                    [*common, "-md", dpath, "--spec-type", "draft-simple", "--spec-draft-n-max", "8",
                     "--spec-draft-p-min", "0.75"],
                    lambda: primed(LlamaModelDraft(dmodel, n_draft=8, p_min=0.75, n_ctx=1024,
                                                   n_threads=a.threads), prompt),
                    vocab, plain)  # fmt: skip
        if "ngram" in only:
            from llamapy.generation.speculative import make_spec_draft

            for name, key in (("ngram-simple", "simple"), ("ngram-map-k", "map-k")):
                compare(f"SmolLM2 Q8_0, {name} (key 3, draft 8)", target, prompt,
                        [*common, "--spec-type", name, f"--spec-ngram-{key}-size-n", "3",
                         f"--spec-ngram-{key}-size-m", "8"],
                        lambda name=name: make_spec_draft(name, size_n=3, size_m=8), vocab, plain)  # fmt: skip
        if "eagle3" in only:
            from llamapy.generation.eagle3 import Eagle3Draft, Eagle3Head

            hpath = eagle3_head_file(tmp, target)
            head = Eagle3Head(hpath, target)
            compare("SmolLM2 Q8_0 + random EAGLE-3 head (n_draft 3, p_min 0)", target, prompt,
                    [*common, "-md", str(hpath), "--spec-type", "draft-eagle3", "--spec-draft-n-max", "3",
                     "--spec-draft-p-min", "0"],
                    lambda: Eagle3Draft(head, target, n_draft=3, p_min=0.0, n_ctx=1024, n_threads=a.threads),
                    vocab, plain)  # fmt: skip
    if "mtp" in only:
        from llamapy.generation.mtp import MtpDraft, MtpModel

        path = mtp_file(tmp, 4, 256, 0.35)
        model = Model.load(str(path))
        mprompt = list(MTP_PROMPT.encode())
        vocab = model.vocab
        mtp = MtpModel(model)
        pfile = tmp / "mtp_prompt.txt"
        pfile.write_text(MTP_PROMPT)
        mcommon = ["-m", str(path), "-f", str(pfile), "--ignore-eos", *base]
        mplain = compare("glm4moe 4x256 + its MTP layer, no draft", model, mprompt,
                         [*mcommon, *NO_DRAFT], None, vocab, None, EOS_BYTE)  # fmt: skip
        compare("glm4moe 4x256, draft-mtp (n_draft 3)", model, mprompt,
                [*mcommon, "--spec-type", "draft-mtp", "--spec-draft-n-max", "3"],
                lambda: MtpDraft(mtp, n_draft=3, n_ctx=1024, n_threads=a.threads), vocab, mplain,
                EOS_BYTE)  # fmt: skip
    lines.append("")
    lines.append(f"- load average at the end: {os.getloadavg()[0]:.2f} (the 2 cores are shared)")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
