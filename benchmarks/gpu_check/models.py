"""Random-weight GGUF files of real models' shapes for the GPU check, written on the machine itself.

No llama-quantize and no vocabulary files are needed (the GPU machine has neither): each matrix is one
random 64-row tile, quantized once with llamapy's own quantizer and repeated row-block by row-block
(every type used here quantizes rows independently, so the repeated bytes are exactly the quantized
repeated tile), and the vocabulary is ``tokenizer.ggml.model = "none"`` (token ids only). The memory
traffic of a decode is a real file's; the numbers say nothing about text.

Mixes: ``Q8_0`` (every matrix) and ``Q4_K_M`` as llama.cpp's ``llama_tensor_get_type`` makes it for
these architectures: Q4_K everywhere, Q6_K for ``attn_v`` / ``ffn_down`` of the ``use_more_bits`` layers
and for the output (the token embedding when tied), and the fallbacks llama.cpp takes where a row is
not a multiple of 256 (Q4_K -> Q5_0, Q6_K -> Q8_0: SmolLM2's 576-wide rows).

    python -m benchmarks.gpu_check.models DIR smollm2-135m:Q4_K_M qwen2.5-7b:Q8_0 ...
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

FILE_VERSION = "1"

_QWEN2 = dict(arch="qwen2", rope_base=1e6, rms_eps=1e-6, qkv_bias=True)
_LLAMA = dict(arch="llama", rope_base=1e5, rms_eps=1e-5, qkv_bias=False)
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(_LLAMA, n_vocab=49152, n_embd=576, n_layer=30, n_ff=1536, n_head=9, n_head_kv=3,
                         head_dim=64, tied=True),
    "qwen2.5-1.5b": dict(_QWEN2, n_vocab=151936, n_embd=1536, n_layer=28, n_ff=8960, n_head=12, n_head_kv=2,
                         head_dim=128, tied=True),
    "qwen2.5-7b": dict(_QWEN2, n_vocab=152064, n_embd=3584, n_layer=28, n_ff=18944, n_head=28, n_head_kv=4,
                       head_dim=128, tied=False),
    # the smoke run's (simulator) stand-ins: toy sizes, the same layouts; rows of 32 take the fallbacks,
    # ffn_down's rows of 256 Q4_K / Q6_K
    "tiny-smollm2": dict(_LLAMA, n_vocab=64, n_embd=32, n_layer=2, n_ff=256, n_head=2, n_head_kv=1,
                         head_dim=32, tied=True),
    "tiny-qwen": dict(_QWEN2, n_vocab=64, n_embd=32, n_layer=2, n_ff=256, n_head=2, n_head_kv=1,
                      head_dim=32, tied=False),
}  # fmt: skip

FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # llama.cpp, rows not a multiple of 256


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's: the first and last eighth of the layers, and every third one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensors(s: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """(name, NumPy shape) of every tensor of the shape, in file order."""
    e, hd, ff = s["n_embd"], s["head_dim"], s["n_ff"]
    out: list[tuple[str, tuple[int, ...]]] = [
        ("token_embd.weight", (s["n_vocab"], e)),
        ("output_norm.weight", (e,)),
    ]
    if not s["tied"]:
        out.append(("output.weight", (s["n_vocab"], e)))
    for il in range(s["n_layer"]):
        b = f"blk.{il}."
        out.append((b + "attn_norm.weight", (e,)))
        for n, rows in (
            ("attn_q", s["n_head"] * hd),
            ("attn_k", s["n_head_kv"] * hd),
            ("attn_v", s["n_head_kv"] * hd),
        ):
            out.append((b + n + ".weight", (rows, e)))
            if s["qkv_bias"]:
                out.append((b + n + ".bias", (rows,)))
        out += [(b + "attn_output.weight", (e, s["n_head"] * hd)), (b + "ffn_norm.weight", (e,)),
                (b + "ffn_gate.weight", (ff, e)), (b + "ffn_up.weight", (ff, e)), (b + "ffn_down.weight", (e, ff))]  # fmt: skip
    return out


def type_of(name: str, k: int, s: dict[str, Any], mix: str) -> str:
    """The GGML type of matrix ``name`` (rows of ``k``) in ``mix`` (Q8_0 or Q4_K_M)."""
    if mix == "Q8_0":
        return "Q8_0"
    if mix != "Q4_K_M":
        raise ValueError(f"unknown mix {mix!r} (Q4_K_M or Q8_0)")
    n = s["n_layer"]
    il = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if name == "output.weight" or (name == "token_embd.weight" and s["tied"]):
        t = "Q6_K"
    elif name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(il, n):
        t = "Q6_K"
    else:
        t = "Q4_K"
    return FALLBACK.get(t, t) if k % 256 else t


def path_for(d: Path, shape: str, mix: str) -> Path:
    return d / f"{shape}.{mix}.gguf"


def _current(path: Path, shape: str, mix: str) -> bool:
    if not path.exists():
        return False
    try:
        from llamapy.gguf.reader import GGUFReader

        return GGUFReader(path).get("general.name") == f"gpu-check-{shape}-{mix}-v{FILE_VERSION}"
    except Exception:  # truncated or foreign: make it again
        return False


def write(path: Path, shape: str, mix: str, seed: int = 0) -> Path:
    """The random-weight ``mix`` file of ``shape`` at ``path`` (one tensor in memory at a time)."""
    from llamapy.ggml.quants import quantize
    from llamapy.ggml.types import GGMLType
    from llamapy.gguf import GGUFValueType
    from llamapy.gguf.writer import GGUFWriter

    s = SHAPES[shape]
    arch, hd = s["arch"], s["head_dim"]
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    w = GGUFWriter(tmp, arch=arch)
    md: dict[str, Any] = {
        "general.name": f"gpu-check-{shape}-{mix}-v{FILE_VERSION}",
        f"{arch}.vocab_size": s["n_vocab"],
        f"{arch}.context_length": 32768,
        f"{arch}.embedding_length": s["n_embd"],
        f"{arch}.block_count": s["n_layer"],
        f"{arch}.feed_forward_length": s["n_ff"],
        f"{arch}.attention.head_count": s["n_head"],
        f"{arch}.attention.head_count_kv": s["n_head_kv"],
        f"{arch}.attention.key_length": hd,
        f"{arch}.attention.value_length": hd,
        f"{arch}.attention.layer_norm_rms_epsilon": s["rms_eps"],
        f"{arch}.rope.freq_base": s["rope_base"],
        f"{arch}.rope.dimension_count": hd,
        "tokenizer.ggml.model": "none",
        "tokenizer.ggml.vocab_size": s["n_vocab"],
    }
    for k, v in md.items():
        w.add_key_value(k, v, {float: GGUFValueType.FLOAT32, int: GGUFValueType.UINT32}.get(type(v)))
    specs = [
        (name, shp, "F32" if len(shp) == 1 else type_of(name, shp[-1], s, mix)) for name, shp in tensors(s)
    ]
    for name, shp, t in specs:
        w.add_tensor_info(name, shp, t)
    tiles: dict[tuple[int, str], np.ndarray] = {}
    for name, shp, t in specs:
        if t == "F32":
            base = 1.0 if "norm" in name else 0.0
            w.write_tensor_data((base + 0.02 * rng.standard_normal(shp)).astype(np.float32), name)
            continue
        rows, k = shp
        if (k, t) not in tiles:
            x = (rng.standard_normal((64, k)) / np.sqrt(k)).astype(np.float32)
            tiles[(k, t)] = quantize(x, GGMLType[t])
        w.write_tensor_data(np.tile(tiles[(k, t)], (-(-rows // 64), 1))[:rows], name)
    w.write()
    w.close()
    os.replace(tmp, path)
    return path


def ensure(d: Path, shape: str, mix: str, log: Any = None) -> Path:
    """``DIR/<shape>.<mix>.gguf``, written unless a current one is there."""
    out = path_for(d, shape, mix)
    if _current(out, shape, mix):
        return out
    t0 = time.perf_counter()
    write(out, shape, mix)
    if log:
        log(f"wrote {out} ({out.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    d, rc = Path(argv[0]), 0
    for spec in argv[1:]:
        shape, _, mix = spec.partition(":")
        try:
            ensure(d, shape, mix or "Q4_K_M", log=lambda m: print(m, flush=True))
        except Exception as e:  # one failed file does not stop the others
            print(f"error: {spec}: {type(e).__name__}: {e}", flush=True)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
