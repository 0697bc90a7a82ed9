"""Random-weight GGUF files of real models' shapes, for speed only (the numbers say nothing about text).

Our writer (``llamapy.gguf.writer``, streamed tensor by tensor) writes an F16 file of the shape; llama.cpp's own
``llama-quantize`` turns it into ``Q4_K_M``, ``Q5_K_M``, ``Q8_0``, ``Q4_0`` ... with its real per-tensor mix.
Each matrix is one random 64-row tile repeated and stored in full (the memory traffic is a real file's).
Files live in ``~/.cache/llamapy/bench/shaped/`` and are reused while ``FILE_VERSION`` matches; the F16
intermediate is deleted after quantizing unless ``keep_f16``. Free disk is checked before each write.

    python benchmarks/shaped.py qwen2.5-1.5b Q4_K_M [--keep-f16]     # prints the file's path
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import BENCH_CACHE, ROOT, require_tool  # noqa: E402

DIR = BENCH_CACHE / "shaped"
FILE_VERSION = "1"
VOCAB = ROOT.parent / "shared" / "vocab"

_QWEN2 = dict(arch="qwen2", vocab="qwen2", rope_base=1e6, rms_eps=1e-6, qkv_bias=True, head_dim=128)
_LLAMA3 = dict(arch="llama", vocab="llama-bpe", rope_base=5e5, rms_eps=1e-5, qkv_bias=False, head_dim=128)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(_QWEN2, n_vocab=151936, n_embd=896, n_layer=24, n_ff=4864, n_head=14, n_head_kv=2,
                         head_dim=64, tied=True),
    "qwen2.5-1.5b": dict(_QWEN2, n_vocab=151936, n_embd=1536, n_layer=28, n_ff=8960, n_head=12, n_head_kv=2,
                         tied=True),
    "llama-3.2-3b": dict(_LLAMA3, n_vocab=128256, n_embd=3072, n_layer=28, n_ff=8192, n_head=24, n_head_kv=8,
                         tied=True),
    "qwen2.5-7b": dict(_QWEN2, n_vocab=152064, n_embd=3584, n_layer=28, n_ff=18944, n_head=28, n_head_kv=4,
                       tied=False),
    "llama-3.1-8b": dict(_LLAMA3, n_vocab=128256, n_embd=4096, n_layer=32, n_ff=14336, n_head=32, n_head_kv=8,
                         tied=False),
    # Qwen3-30B-A3B's dims (128 experts of 768, 8 used, 32/4 heads of 128, qk-norm) with 6 of its 48 layers
    "qwen3-30b-a3b-6l": dict(arch="qwen3moe", vocab="qwen2", rope_base=1e6, rms_eps=1e-6, qkv_bias=False,
                             head_dim=128, n_vocab=151936, n_embd=2048, n_layer=6, n_ff=6144, n_head=32,
                             n_head_kv=4, tied=False, qk_norm=True, n_expert=128, n_expert_used=8,
                             n_ff_exp=768),
}  # fmt: skip


def tensors(s: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, NumPy shape, "F16" | "F32") of every tensor of the shape, in file order."""
    e, hd, ff = s["n_embd"], s["head_dim"], s["n_ff"]
    out = [("token_embd.weight", (s["n_vocab"], e), "F16"), ("output_norm.weight", (e,), "F32")]
    if not s["tied"]:
        out.append(("output.weight", (s["n_vocab"], e), "F16"))
    for il in range(s["n_layer"]):
        b = f"blk.{il}."
        out.append((b + "attn_norm.weight", (e,), "F32"))
        for n, rows in (
            ("attn_q", s["n_head"] * hd),
            ("attn_k", s["n_head_kv"] * hd),
            ("attn_v", s["n_head_kv"] * hd),
        ):
            out.append((b + n + ".weight", (rows, e), "F16"))
            if s["qkv_bias"]:
                out.append((b + n + ".bias", (rows,), "F32"))
        if s.get("qk_norm"):
            out += [(b + "attn_q_norm.weight", (hd,), "F32"), (b + "attn_k_norm.weight", (hd,), "F32")]
        out.append((b + "attn_output.weight", (e, s["n_head"] * hd), "F16"))
        out.append((b + "ffn_norm.weight", (e,), "F32"))
        if s.get("n_expert"):
            ne, fe = s["n_expert"], s["n_ff_exp"]
            out += [(b + "ffn_gate_inp.weight", (ne, e), "F32"),
                    (b + "ffn_gate_exps.weight", (ne, fe, e), "F16"),
                    (b + "ffn_up_exps.weight", (ne, fe, e), "F16"),
                    (b + "ffn_down_exps.weight", (ne, e, fe), "F16")]  # fmt: skip
        else:
            out += [(b + "ffn_gate.weight", (ff, e), "F16"), (b + "ffn_up.weight", (ff, e), "F16"),
                    (b + "ffn_down.weight", (e, ff), "F16")]  # fmt: skip
    return out


def f16_bytes(shape: str) -> int:
    return sum(int(np.prod(shp)) * (2 if t == "F16" else 4) for _, shp, t in tensors(SHAPES[shape]))


def _vocab_keys(name: str, n_vocab: int) -> dict[str, tuple[Any, Any]]:
    from benchmarks.bench_types import _vocab_keys as vk

    return vk(VOCAB / f"ggml-vocab-{name}.gguf", n_vocab)


def write_f16(path: Path, shape: str, seed: int = 0) -> Path:
    """The F16 random-weight file of ``shape`` (streamed: one tensor in memory at a time)."""
    from llamapy.gguf import GGUFValueType
    from llamapy.gguf.writer import GGUFWriter

    s, arch = SHAPES[shape], SHAPES[shape]["arch"]
    rng = np.random.default_rng(seed)
    hd = s["head_dim"]
    tmp = path.with_suffix(".tmp")
    w = GGUFWriter(tmp, arch=arch)
    md: dict[str, Any] = {
        "general.name": f"bench-shaped-{shape}-v{FILE_VERSION}",
        "general.file_type": 1,  # MOSTLY_F16
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
    }
    if s.get("n_expert"):
        md[f"{arch}.expert_count"] = s["n_expert"]
        md[f"{arch}.expert_used_count"] = s["n_expert_used"]
        md[f"{arch}.expert_feed_forward_length"] = s["n_ff_exp"]
    for k, v in md.items():
        w.add_key_value(k, v, {float: GGUFValueType.FLOAT32, int: GGUFValueType.UINT32}.get(type(v)))
    for k, (v, vt) in _vocab_keys(s["vocab"], s["n_vocab"]).items():
        w.add_key_value(k, v, vt)
    specs = tensors(s)
    for name, shp, t in specs:
        w.add_tensor_info(name, shp, t)
    tiles: dict[tuple[int, ...], np.ndarray] = {}
    for name, shp, t in specs:
        if t == "F32":
            base = 1.0 if "norm" in name else 0.0
            w.write_tensor_data((base + 0.02 * rng.standard_normal(shp)).astype(np.float32), name)
            continue
        k, rows = shp[-1], int(np.prod(shp[:-1]))
        if k not in tiles:
            tiles[k] = (rng.standard_normal((64, k)) / np.sqrt(k)).astype(np.float16)
        w.write_tensor_data(np.tile(tiles[k], (-(-rows // 64), 1))[:rows], name)
    w.write()
    w.close()
    os.replace(tmp, path)
    return path


def _current(path: Path, shape: str) -> bool:
    if not path.exists():
        return False
    try:
        from llamapy.gguf.reader import GGUFReader

        return GGUFReader(path).get("general.name") == f"bench-shaped-{shape}-v{FILE_VERSION}"
    except Exception:  # truncated or foreign: make it again
        return False


def free_bytes(d: Path) -> int:
    d.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(d).free


class NoDisk(RuntimeError):
    pass


def ensure(shape: str, ftype: str, keep_f16: bool = False, log: Any = None) -> Path:
    """The cached ``<shape>.<ftype>.gguf`` (``ftype``: F16 or a llama-quantize type name), made if missing.
    Raises ``NoDisk`` (with the sizes) when the free disk is short."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    out = DIR / f"{shape}.{ftype}.gguf"
    if _current(out, shape):
        return out
    f16 = DIR / f"{shape}.F16.gguf"
    need = f16_bytes(shape)
    if not _current(f16, shape):
        margin = need * (1.6 if ftype != "F16" else 1.05)  # the F16 file and the quantized one
        if free_bytes(DIR) < margin:
            raise NoDisk(f"{shape}: needs ~{margin / 1e9:.1f} GB free in {DIR}, "
                         f"{free_bytes(DIR) / 1e9:.1f} GB free: skipped")  # fmt: skip
        t0 = time.perf_counter()
        log(f"writing {f16} ({need / 1e9:.1f} GB) ...")
        write_f16(f16, shape)
        log(f"  in {time.perf_counter() - t0:.0f} s")
    if ftype == "F16":
        return f16
    if free_bytes(DIR) < need * 0.6:
        raise NoDisk(f"{shape} {ftype}: ~{need * 0.6 / 1e9:.1f} GB needed in {DIR}: skipped")
    quant = require_tool("llama-quantize", os.environ.get("LLAMACPP_ARCH") or "avx2")
    t0 = time.perf_counter()
    log(f"quantizing {f16.name} -> {ftype} (llama-quantize) ...")
    tmp = out.with_suffix(".tmp")
    r = subprocess.run([str(quant), str(f16), str(tmp), ftype, str(os.cpu_count() or 2)], capture_output=True,
                       text=True)  # fmt: skip
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama-quantize {ftype} failed: {r.stderr[-800:]}")
    os.replace(tmp, out)
    log(f"  {out.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.0f} s")
    if not keep_f16:
        f16.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("ftype", help="F16, or a llama-quantize type: Q4_K_M, Q5_K_M, Q8_0, Q4_0, ...")
    ap.add_argument("--keep-f16", action="store_true")
    a = ap.parse_args(argv)
    try:
        print(ensure(a.shape, a.ftype.upper(), a.keep_f16))
    except NoDisk as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
