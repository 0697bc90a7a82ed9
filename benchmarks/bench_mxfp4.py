"""Decode speed on MXFP4 experts: a gpt-oss-shaped random model, llamapy side by side with llama-bench.

    python -m benchmarks.bench_mxfp4 [--layers 2] [--experts 16] [--threads 2] [--n-gen 32] [--out F]

Writes a random-weight ``gpt-oss`` GGUF with gpt-oss-20b's layer shapes (n_embd 2880, 64 query / 8 KV
heads of 64, experts 2880 wide, top-4 routing, window 128, YaRN) but fewer layers and experts so it
fits (defaults: 2 layers x 16 experts, ~0.5 GB): experts MXFP4 as the real files, attention and the
output Q8_0, norms, biases, sinks and the router F32, no vocabulary (``tokenizer.ggml.model`` none).
Then times tg<n> (single-token decodes from an empty cache, best of ``--reps``) through llamapy and
prints the llama-bench command for the same file (llama.cpp's build under ~/.cache/llamapy; run it
in the same session: machines of one kind differ from run to run). Random weights: the numbers say
nothing about text, only about speed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from llamapy.ggml.quants import quantize
from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType
from llamapy.gguf.writer import GGUFWriter

ARCH = "gpt-oss"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root (benchmarks.harness)
from benchmarks.harness import llamacpp_bin  # noqa: E402

LLAMA_BENCH = llamacpp_bin() / "llama-bench"


def _q(rng: np.random.Generator, shape: tuple[int, ...], t: GGMLType, scale: float) -> np.ndarray:
    """A random weight of type ``t``: a quantized tile of 64 rows repeated (quantizing GBs is slow)."""
    k = shape[-1]
    rows = int(np.prod(shape[:-1]))
    tile = quantize((rng.standard_normal((min(rows, 64), k)) * scale).astype(np.float32), t)
    return np.ascontiguousarray(np.tile(tile, (-(-rows // tile.shape[0]), 1))[:rows]).reshape(*shape[:-1], -1)


def write_model(
    path: Path,
    n_layer: int,
    n_expert: int,
    n_vocab: int = 8192,
    seed: int = 0,
    shape: tuple[int, int, int, int, int] = (2880, 64, 8, 64, 2880),
) -> Path:
    """The random file; ``shape``: n_embd, query heads, KV heads, head size, expert width (gpt-oss's)."""
    rng = np.random.default_rng(seed)
    n_embd, n_head, n_kv, hd, n_ff = shape
    w = GGUFWriter(path, arch=ARCH)
    md: dict[str, object] = {
        "general.name": "bench-gpt-oss-mxfp4",
        "general.file_type": 38,  # MOSTLY_MXFP4_MOE
        f"{ARCH}.vocab_size": n_vocab,
        f"{ARCH}.context_length": 131072,
        f"{ARCH}.embedding_length": n_embd,
        f"{ARCH}.block_count": n_layer,
        f"{ARCH}.feed_forward_length": n_ff,
        f"{ARCH}.attention.head_count": n_head,
        f"{ARCH}.attention.head_count_kv": n_kv,
        f"{ARCH}.attention.key_length": hd,
        f"{ARCH}.attention.value_length": hd,
        f"{ARCH}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{ARCH}.attention.sliding_window": 128,
        f"{ARCH}.rope.freq_base": 150000.0,
        f"{ARCH}.rope.scaling.type": "yarn",
        f"{ARCH}.rope.scaling.factor": 32.0,
        f"{ARCH}.rope.scaling.original_context_length": 4096,
        f"{ARCH}.expert_count": n_expert,
        f"{ARCH}.expert_used_count": 4,
        f"{ARCH}.expert_feed_forward_length": n_ff,
        "tokenizer.ggml.model": "none",
    }
    for k, v in md.items():
        if isinstance(v, float):
            w.add_key_value(k, v, GGUFValueType.FLOAT32)
        elif isinstance(v, int):
            w.add_key_value(k, v, GGUFValueType.UINT32)
        else:
            w.add_key_value(k, v)

    def f32(name: str, shape: tuple[int, ...], scale: float = 0.02, base: float = 0.0) -> None:
        w.add_tensor(name, (base + rng.standard_normal(shape) * scale).astype(np.float32))

    def quant(name: str, shape: tuple[int, ...], t: GGMLType) -> None:
        w.add_tensor(name, _q(rng, shape, t, 1.0 / np.sqrt(shape[-1])), ggml_type=t, raw_shape=shape)

    quant("token_embd.weight", (n_vocab, n_embd), GGMLType.Q8_0)
    f32("output_norm.weight", (n_embd,), base=1.0)
    quant("output.weight", (n_vocab, n_embd), GGMLType.Q8_0)
    for il in range(n_layer):
        b = f"blk.{il}."
        f32(b + "attn_norm.weight", (n_embd,), base=1.0)
        f32(b + "post_attention_norm.weight", (n_embd,), base=1.0)
        for name, n in (("attn_q", n_head * hd), ("attn_k", n_kv * hd), ("attn_v", n_kv * hd)):
            quant(b + name + ".weight", (n, n_embd), GGMLType.Q8_0)
            f32(b + name + ".bias", (n,))
        quant(b + "attn_output.weight", (n_embd, n_head * hd), GGMLType.Q8_0)
        f32(b + "attn_output.bias", (n_embd,))
        f32(b + "attn_sinks.weight", (n_head,), scale=1.0)
        f32(b + "ffn_gate_inp.weight", (n_expert, n_embd), scale=1.0 / np.sqrt(n_embd))
        f32(b + "ffn_gate_inp.bias", (n_expert,))
        for name, shape in (
            ("ffn_gate_exps", (n_expert, n_ff, n_embd)),
            ("ffn_up_exps", (n_expert, n_ff, n_embd)),
            ("ffn_down_exps", (n_expert, n_embd, n_ff)),
        ):
            quant(b + name + ".weight", shape, GGMLType.MXFP4)
            f32(b + name + ".bias", shape[:2])
    w.write()
    w.close()
    return path


def time_tg(path: Path, n_gen: int, threads: int, reps: int) -> float:
    """Best tokens/s of ``n_gen`` single-token decodes from an empty cache (after one warm-up run)."""
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    model = Model.load(path)
    ctx = Context(model, ContextParams(n_ctx=max(256, 2 * n_gen), n_threads=threads))
    rng = np.random.default_rng(1)
    best = 0.0
    for _ in range(reps + 1):
        ctx.memory.clear()
        toks = rng.integers(0, model.n_vocab, size=n_gen)
        t0 = time.perf_counter()
        for i, t in enumerate(toks):
            ctx.decode(Batch.from_tokens([int(t)], pos0=i))
        best = max(best, n_gen / (time.perf_counter() - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench-gpt-oss-mxfp4.gguf"))
    ap.add_argument("--no-run", action="store_true", help="only write the file and print the commands")
    args = ap.parse_args()
    if not args.out.exists():
        write_model(args.out, args.layers, args.experts)
    print(f"file: {args.out} ({args.out.stat().st_size / 1e9:.2f} GB), load average {os.getloadavg()}")
    print(f"llama.cpp: {LLAMA_BENCH} -m {args.out} -p 0 -n {args.n_gen} -t {args.threads} -r {args.reps}")
    if not args.no_run:
        tps = time_tg(args.out, args.n_gen, args.threads, args.reps)
        print(f"llamapy tg{args.n_gen}: {tps:.2f} t/s (threads={args.threads})")


if __name__ == "__main__":
    main()
