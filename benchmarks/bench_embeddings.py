"""Embeddings per second: 256 texts of ~64 tokens on a BERT-base-sized random model (12 layers, 768
wide, 12 heads, FFN 3072, the bge WordPiece vocabulary), mean pooling, L2-normalized; llamapy's
``Llama.embed`` side by side with llama.cpp's ``llama-embedding`` on the same file and texts.

    python benchmarks/bench_embeddings.py [--texts 256] [--type f16] [--threads N] [--runs 3]

The model and the texts (one per line) are written once into the cache folder. llamapy is timed
in-process after a warm-up (the Numba cache and graphs are warm; load time reported apart); llama.cpp as
a whole ``llama-embedding -f`` process, with its own ``prompt eval time`` reported too. Both batch the
texts into decodes of at most ``--batch`` tokens (several sequences each). The llama.cpp binary comes
from benchmarks/build_llamacpp.sh (~/.cache/llamapy/llamacpp/<version>/build/bin, or ``--llama-cpp
PATH``); without it only llamapy runs. The two outputs are compared (cosine) as a sanity check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import CACHE, llamacpp_tool, machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BERT_BASE = dict(n_layer=12, n_embd=768, n_head=12, n_ff=3072, n_ctx=512)


def make_texts(vocab, n: int, n_tokens: int, seed: int = 0) -> list[str]:
    """``n`` texts of random whole-word vocabulary entries, ``n_tokens`` tokens each with [CLS]/[SEP]."""
    rng = np.random.default_rng(seed)
    words = [t for t in vocab.tokens if t.isalpha() and t.islower() and len(t) > 2]
    texts = []
    for _ in range(n):
        ws = [str(w) for w in rng.choice(words, n_tokens - 2)]
        while len(vocab.tokenize(" ".join(ws), add_special=True)) > n_tokens:
            ws.pop()
        texts.append(" ".join(ws))
    return texts


def find_llama_embedding(given: str | None) -> str | None:
    if given:
        return given if os.access(given, os.X_OK) else None
    tool = llamacpp_tool("llama-embedding")
    return str(tool) if tool else None


def run_llamapy(path: Path, texts: list[str], args: argparse.Namespace) -> tuple[dict, np.ndarray]:
    from llamapy import Llama

    t0 = time.perf_counter()
    llm = Llama(str(path), embedding=True, n_ctx=BERT_BASE["n_ctx"], n_batch=args.batch, n_ubatch=args.batch,
                n_seq_max=64, n_threads=args.threads, verbose=False)  # fmt: skip
    load = time.perf_counter() - t0
    llm.embed(texts[: max(1, len(texts) // 8)])  # warm-up: kernels and graphs
    best, out = float("inf"), None
    for _ in range(args.runs):
        t0 = time.perf_counter()
        out = llm.embed(texts)
        best = min(best, time.perf_counter() - t0)
    return {"load_s": load, "embed_s": best, "emb_per_s": len(texts) / best}, np.array(out)


def run_llamacpp(
    exe: str, path: Path, text_file: Path, n: int, args: argparse.Namespace
) -> tuple[dict, np.ndarray]:
    cmd = [exe, "-m", str(path), "-f", str(text_file), "-c", str(args.batch), "-b", str(args.batch),
           "-ub", str(args.batch), "--pooling", "mean", "--embd-normalize", "2", "--embd-output-format", "array",
           "-ngl", "0", "-t", str(args.threads)]  # fmt: skip
    best: tuple[float, float, str] | None = None
    for _ in range(args.runs + 1):  # the first run warms the page cache
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t0
        m = re.search(r"prompt eval time\s*=\s*([\d.]+) ms", p.stderr + p.stdout)
        ev = float(m.group(1)) / 1e3 if m else float("nan")
        if best is None or wall < best[0]:
            best = (wall, ev, p.stdout)
    assert best is not None
    wall, ev, stdout = best
    arr = np.array(json.loads(stdout[stdout.index("[") : stdout.rindex("]") + 1]))
    return {"process_s": wall, "prompt_eval_s": ev, "emb_per_s": n / ev if ev == ev else n / wall}, arr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per text, [CLS] and [SEP] included")
    ap.add_argument("--type", default="f16", choices=["f32", "f16", "q8_0"], help="weight type of the file")
    ap.add_argument("--batch", type=int, default=2048, help="tokens per decode (both tools)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads (both tools)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs; the best is reported")
    ap.add_argument("--llama-cpp", default=None, help="path of llama-embedding (default: the cached build)")
    args = ap.parse_args()

    from llamapy.vocab import load_vocab
    from tests.test_api_embedding import write_bert
    from tests.util import SHARED

    folder = CACHE / "bench" / "embeddings"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"bert-base-random-{args.type}.gguf"
    if not path.exists():
        write_bert(path.with_suffix(".tmp"), **BERT_BASE, pooling=1, ggml_type=args.type)
        path.with_suffix(".tmp").rename(path)
    text_file = folder / f"texts-{args.texts}x{args.tokens}.txt"
    if not text_file.exists():
        vocab = load_vocab(SHARED / "vocab" / "ggml-vocab-bert-bge.gguf")
        text_file.write_text("\n".join(make_texts(vocab, args.texts, args.tokens)) + "\n")
    texts = text_file.read_text().splitlines()
    mine, vecs = run_llamapy(path, texts, args)
    print(f"llamapy: {len(texts)} texts in {mine['embed_s']:.2f} s -> {mine['emb_per_s']:.1f} embeddings/s "
          f"(load {mine['load_s']:.2f} s; {path.name})")  # fmt: skip
    exe = find_llama_embedding(args.llama_cpp)
    if exe is None:
        print("llama.cpp: llama-embedding not found (run benchmarks/build_llamacpp.sh); skipped")
    else:
        ref, theirs = run_llamacpp(exe, path, text_file, len(texts), args)
        cos = (vecs * theirs).sum(axis=1) if theirs.shape == vecs.shape else np.array([np.nan])
        print(f"llama.cpp: prompt eval {ref['prompt_eval_s']:.2f} s -> {ref['emb_per_s']:.1f} embeddings/s "
              f"(whole process {ref['process_s']:.2f} s); llamapy/llama.cpp speed "
              f"{mine['emb_per_s'] / ref['emb_per_s']:.2f}x; cosine min {np.nanmin(cos):.5f}")  # fmt: skip
    print(f"machine: {machine_line()}; "
          f"load average {os.getloadavg()[0]:.1f}; threads {args.threads}, best of {args.runs}")  # fmt: skip


if __name__ == "__main__":
    main()
